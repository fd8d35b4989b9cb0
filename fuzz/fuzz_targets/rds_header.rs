//! Fuzz the RDS header, extension-list, message and congestion-map decoders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds::wire::{CongMap, EXT_SPACE, ExtList, Header, Message};

fuzz_target!(|data: &[u8]| {
    if let Ok(mut h) = Header::decode(data) {
        // Whatever decodes re-encodes, and decodes to the same header. (Padding and extension
        // bytes after the list's end are not kept, so the checksum is recomputed or dropped.)
        h.csum = 0;
        if let Ok(b) = h.encode() {
            assert_eq!(Header::decode(&b).ok().as_ref(), Some(&h));
        }
        if let Ok(b) = h.encode_with_checksum() {
            let mut d = Header::decode(&b).expect("own checksum verifies");
            d.csum = 0;
            assert_eq!(d, h);
        }
    }
    let _ = Message::decode(data);
    let _ = CongMap::decode(data);
    if data.len() >= EXT_SPACE {
        let mut a = [0u8; EXT_SPACE];
        a.copy_from_slice(&data[..EXT_SPACE]);
        let l = ExtList::decode(&a);
        assert!(l.encoded_len() <= EXT_SPACE);
    }
});
