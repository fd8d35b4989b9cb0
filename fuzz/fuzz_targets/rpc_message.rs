//! Drive the ONC RPC header decoder and the credential decoders (AUTH_SYS, RPCSEC_GSS) with
//! arbitrary bytes: every call must return Ok or a typed error, never panic. A header that
//! decodes must re-encode to a header that decodes the same, and to exactly the bytes it came
//! from when its XDR padding was zero.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oncrpc::auth::{AuthSys, GssCred};
use oncrpc::{Credential, MessageHeader};
use xdr::{Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    if let Ok((header, body)) = MessageHeader::decode_message(&buf) {
        let header_len = buf.len() - body.len();
        let mut enc = Encoder::new();
        match &header {
            MessageHeader::Call(h) => {
                h.encode(&mut enc);
                // The credential body of a decoded call goes through the flavor parsers.
                let _ = Credential::parse(&h.cred);
                let _ = Credential::parse(&h.verf);
            }
            MessageHeader::Reply(h) => h.encode(&mut enc),
        }
        let again = enc.into_bytes();
        // Re-encoding always decodes to the same header.
        let (decoded, rest) =
            MessageHeader::decode_message(&again).expect("re-encoded header decodes");
        assert_eq!(decoded, header);
        assert!(rest.is_empty());
        // The default decoder accepts non-zero XDR padding (RFC 4506 §3 says it is zero; peers
        // rarely check). When the padding was zero, the bytes come back exactly.
        let mut strict = Decoder::from_bytes(&buf).strict_padding(true);
        if MessageHeader::decode(&mut strict).is_ok() {
            assert_eq!(strict.position(), header_len);
            assert_eq!(&again[..], &buf[..header_len], "header re-encodes exactly");
        }
    }
    // The same bytes as a bare credential body.
    let _ = AuthSys::decode_body(&buf);
    let _ = GssCred::decode_body(&buf);
});
