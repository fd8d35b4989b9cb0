//! Drive the RPC-over-RDMA version 2 header decoder (cel-05 §7.2, with the transport properties
//! of §6) with arbitrary bytes. It must return a header or a typed error whose response is the
//! one the draft prescribes (never panic); a header that decodes must re-encode to exactly the
//! bytes consumed; an OPTIONAL's optinfo goes through the property-message reading of gap 1,
//! and every property set through the typed interpretation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcrdma::header_v2::{Body2, ErrorResponse2, Header2, peek_version};
use rpcrdma::props::PropLimits;

fuzz_target!(|data: &[u8]| {
    match Header2::decode(data) {
        Ok((h, n)) => {
            assert!(n <= data.len());
            assert_eq!(h.encoded_len(), n);
            // The decoder, like Linux's, does not insist on zero XDR padding (RFC 4506 §3), and
            // the encoder writes zeros: so the re-encoding decodes to the same header, and is
            // the input itself whenever the input's padding was zero.
            let again = h.to_bytes();
            assert_eq!(again.len(), n);
            assert_eq!(Header2::decode(&again).map(|(h2, _)| h2), Ok(h.clone()));
            if again[..] != data[..n] {
                let differ = again.iter().zip(&data[..n]).filter(|(a, b)| a != b).count();
                assert!(differ > 0 && again.iter().zip(&data[..n]).all(|(a, b)| a == b || *a == 0));
            }
            if let Body2::Optional(o) = &h.body {
                let _ = o.property_message(&PropLimits::default());
            }
            if let Some(l) = h.body.chunk_lists() {
                let _ = l.invalidate();
                let _ = l.chunks.read_chunks();
            }
        }
        Err(e) => match e.response() {
            // Only a message of another version gets ERR_VERS, and it echoes that version.
            ErrorResponse2::ErrVers { xid, vers } => {
                assert_eq!(peek_version(data), Some((xid, vers)));
                assert_ne!(vers, 2);
            }
            ErrorResponse2::Error { xid, .. } => {
                assert_eq!(peek_version(data).map(|p| p.0), Some(xid));
            }
            ErrorResponse2::Discard => {}
        },
    }
});
