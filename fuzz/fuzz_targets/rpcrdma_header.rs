//! Drive the RPC-over-RDMA transport header decoder with arbitrary bytes. It must return a
//! header or a typed error (never panic); whatever decodes must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma::header::Header;

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok((h, n)) => {
            assert!(n <= data.len());
            assert_eq!(h.encoded_len(), n);
            assert_eq!(&h.to_bytes()[..], &data[..n]);
        }
        Err(e) => {
            let _ = e.response();
        }
    }
});
