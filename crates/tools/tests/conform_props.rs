//! Property tests of what `oxrdma conform` reads from a server (`tools::conform::msg`): no
//! input panics, and the headers the `rpcrdma` encoders build read back as built.

use bytes::Bytes;
use proptest::prelude::*;
use rpcrdma::header::{Body, Chunks, Segment};
use tools::conform::msg::{self, Fixed, nfs3};

proptest! {
    #[test]
    fn no_input_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let bytes = Bytes::from(b.clone());
        let f = msg::fixed(&b);
        prop_assert_eq!(f.is_some(), b.len() >= 16);
        if msg::error_body(&b).is_some() {
            prop_assert_eq!(f.map(|f| f.proc_), Some(4));
        }
        let _ = msg::describe(&b);
        let _ = msg::decode_v1(&bytes);
        let _ = msg::decode_v2(&bytes);
        let _ = msg::rpc_reply(&bytes, 1);
        if let Ok(r) = nfs3::read_res(&b) {
            prop_assert!(r.inline_after_len <= b.len());
        }
        let _ = nfs3::lookup_res(&b);
    }

    #[test]
    fn built_headers_read_back(xid: u32, credits: u32, handle: u32, length: u32, offset: u64,
                               payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let chunks = Chunks {
            writes: vec![vec![Segment { handle, length, offset }]],
            ..Chunks::default()
        };
        let m = msg::v1(xid, credits, Body::Msg(chunks.clone()), &payload);
        prop_assert_eq!(msg::fixed(&m), Some(Fixed { xid, vers: 1, credits, proc_: 0 }));
        let (h, p) = msg::decode_v1(&m).unwrap();
        prop_assert_eq!(h.body, Body::Msg(chunks));
        prop_assert_eq!(&p[..], &payload[..]);
        prop_assert_eq!(msg::error_body(&m), None);
    }

    #[test]
    fn read_results_read_back(count in 0u32..5000, eof: bool, attrs: bool) {
        let mut b = vec![0u8; 4];
        b.extend_from_slice(&u32::from(attrs).to_be_bytes());
        if attrs {
            b.extend_from_slice(&[0; nfs3::FATTR3_LEN]);
        }
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&u32::from(eof).to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        let r = nfs3::read_res(&b).unwrap();
        prop_assert_eq!((r.status, r.count, r.eof, r.data_len, r.inline_after_len), (0, count, eof, count, 0));
    }
}
