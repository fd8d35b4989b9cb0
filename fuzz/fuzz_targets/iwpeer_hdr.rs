//! Fuzz the iwpeer control header decoder (tools::iwpeer::hdr) and the responder's sans-IO
//! verdicts on whatever decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tools::iwpeer::verdict::{Offered, judge_data, judge_fill, judge_wrote};
use tools::iwpeer::{HDR_LEN, Hdr};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = Hdr::decode(data) else { return };
    // Whatever decodes re-encodes to the bytes it came from and decodes to the same header.
    let b = h.encode();
    assert_eq!(&b[..], &data[..HDR_LEN]);
    assert_eq!(Hdr::decode(&b), Ok(h));
    // The verdicts never panic, whatever the peer put in the header and the payload.
    let byte_len = data.len() as u32;
    let offered = Some(Offered {
        rkey: h.rkey,
        still_valid: h.flags & 1 != 0,
    });
    let _ = judge_data(&h, byte_len, data, Some(h.arg), offered);
    let _ = judge_data(&h, byte_len, data, None, None);
    let _ = judge_wrote(&h, byte_len, data);
    let _ = judge_fill(&h, byte_len);
});
