//! Fuzz the perf control exchange decoders (tools::perf::control: the MPA private data of
//! `oxrdma perf --connect` / `--listen`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tools::perf::{Hello, Offer};

fuzz_target!(|data: &[u8]| {
    // Whatever decodes re-encodes to the same bytes (the reserved fields are zero on the wire
    // only when they were zero: compare through a second decode).
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        assert_eq!(h.encode().len(), Hello::encoded_len());
    }
    if let Ok(o) = Offer::decode(data) {
        assert_eq!(Offer::decode(&o.encode()), Ok(o));
        assert_eq!(o.encode().len(), Offer::encoded_len());
    }
});
