//! Drive the TCP record-marking decoder (RFC 5531 §11) with arbitrary bytes split into arbitrary
//! read sizes. The first byte picks the maximum record size and the chunking; records that come
//! out never exceed the maximum, and after an error the decoder stays failed.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use oncrpc::record::{RecordDecoder, RecordError};

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let max = [0usize, 1, 4, 16, 64, 256, 4096, usize::MAX][usize::from(knobs & 7)];
    let mut dec = RecordDecoder::new(max);
    let mut src = BytesMut::new();
    let mut at = 0;
    let mut step = usize::from(knobs >> 3) + 1;
    let mut failed = false;
    while at < rest.len() {
        let end = (at + step).min(rest.len());
        src.extend_from_slice(&rest[at..end]);
        at = end;
        // Vary the chunk size from the data itself.
        step = usize::from(rest[at - 1] % 37) + 1;
        loop {
            match dec.decode(&mut src) {
                Ok(Some(record)) => {
                    assert!(!failed);
                    assert!(record.len() <= max);
                }
                Ok(None) => break,
                Err(RecordError::Poisoned) => {
                    assert!(failed, "poisoned only after an error");
                    break;
                }
                Err(_) => {
                    assert!(!failed);
                    failed = true;
                    assert_eq!(dec.decode(&mut src), Err(RecordError::Poisoned));
                    break;
                }
            }
        }
        if failed {
            return;
        }
    }
});
