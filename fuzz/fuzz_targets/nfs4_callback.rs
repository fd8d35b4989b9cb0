//! The NFSv4.1 callback wire formats (RFC 8881 §20): `CB_COMPOUND4args` as a client decodes
//! what a server sends, `CB_COMPOUND4res` as the server decodes the client's answer. Never
//! panics; whatever decodes re-encodes to bytes that decode to the same value; decoded
//! arguments are answered by the client's callback program, and its answer decodes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfs::nfs4::callback::program::CallbackProgram;
use nfs::nfs4::callback::wire::{CbCompoundArgs, CbCompoundRes};

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    if let Ok(a) = CbCompoundArgs::decode(&buf) {
        let again = CbCompoundArgs::decode(&a.to_bytes()).expect("re-encoded arguments decode");
        assert_eq!(again, a);
        let (prog, _events) = CallbackProgram::new(0x4000_0000);
        let res = prog.answer(&a);
        let back = CbCompoundRes::decode(&res.to_bytes()).expect("an answer decodes");
        assert_eq!(back.status, res.status);
    }
    if let Ok(r) = CbCompoundRes::decode(&buf) {
        let again = CbCompoundRes::decode(&r.to_bytes()).expect("re-encoded results decode");
        assert_eq!(again, r);
    }
});
