//! Fuzz the RDS/RDMA receive side: the 32-byte connection private data decoder and the
//! fragment reassembler fed a sequence of Sends (each input chunk is one Send).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds::rdma::{ConnData, Reassembler};
use rds::wire::{HEADER_LEN, Header};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = ConnData::decode(data) {
        // Whatever decodes re-encodes and decodes to the same value (reserved bytes are zeroed).
        assert_eq!(ConnData::decode(&d.encode()), Ok(d));
        let _ = d.negotiate();
    }
    // Split into Sends: a length byte (× 17, so up to 4335 bytes) before each.
    let mut r = Reassembler::default();
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let len = (usize::from(n) * 17).min(tail.len());
        let (send, more) = tail.split_at(len);
        rest = more;
        match r.on_send(send) {
            Ok(out) => {
                if let Some(m) = out.message {
                    // A completed message is a header and exactly h_len payload bytes.
                    let h = Header::decode(&m).expect("reassembled header decodes");
                    assert_eq!(m.len(), HEADER_LEN + h.len as usize);
                }
            }
            // The driver drops the connection: start over.
            Err(_) => r = Reassembler::default(),
        }
    }
});
