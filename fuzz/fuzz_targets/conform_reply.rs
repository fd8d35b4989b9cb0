//! Fuzz what `oxrdma conform` reads from the server under test (tools::conform::msg): the fixed
//! words and error bodies of any version, the version 1/2 reply decoders, the RPC reply, and
//! the NFSv3 LOOKUP/READ results. None may panic, whatever the server sends.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tools::conform::msg::{self, nfs3};

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let f = msg::fixed(data);
    let e = msg::error_body(data);
    // An error body is read only from a message whose fixed words say RDMA_ERROR.
    if e.is_some() {
        assert_eq!(f.map(|f| f.proc_), Some(4));
    }
    let _ = msg::describe(data);
    if let Ok((_, payload)) = msg::decode_v1(&b)
        && let Ok((_, res)) = msg::rpc_reply(&payload, f.map_or(0, |f| f.xid))
    {
        let _ = nfs3::read_res(&res);
        let _ = nfs3::lookup_res(&res);
    }
    let _ = msg::decode_v2(&b);
    if let Ok(r) = nfs3::read_res(data) {
        assert!(r.inline_after_len <= data.len());
    }
    let _ = nfs3::lookup_res(data);
});
