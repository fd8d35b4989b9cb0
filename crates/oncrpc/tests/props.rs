//! Property tests: record marking round trips under any fragmentation and any read chunking;
//! no decoder panics on arbitrary bytes; every RPC header round-trips.

use bytes::{Bytes, BytesMut};
use oncrpc::auth::{AuthSys, GssCred};
use oncrpc::message::{MessageHeader, RejectedReply, ReplyHeader};
use oncrpc::record::{RecordDecoder, RecordError, frame};
use oncrpc::{AcceptStat, AuthStat, CallHeader, Credential, OpaqueAuth};
use proptest::prelude::*;
use xdr::{Decoder, Encoder};

fn feed(dec: &mut RecordDecoder, wire: &[u8], chunks: &[usize]) -> Result<Vec<Bytes>, RecordError> {
    let mut src = BytesMut::new();
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < wire.len() {
        let n = chunks
            .get(i % chunks.len().max(1))
            .copied()
            .unwrap_or(1)
            .max(1);
        let end = (at + n).min(wire.len());
        src.extend_from_slice(&wire[at..end]);
        at = end;
        i += 1;
        while let Some(r) = dec.decode(&mut src)? {
            out.push(r);
        }
    }
    Ok(out)
}

fn encoded_from(parts: &[Vec<u8>]) -> xdr::Encoded {
    let mut enc = Encoder::new().with_ref_threshold(8);
    for p in parts {
        enc.put_raw_bytes(Bytes::copy_from_slice(p));
    }
    enc.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn record_marking_round_trips(
        msgs in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..5), 1..6),
        max_fragment in 1usize..64,
        chunks in prop::collection::vec(1usize..50, 1..8),
    ) {
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for parts in &msgs {
            let enc = encoded_from(parts);
            expected.push(enc.to_bytes());
            for p in frame(&enc, max_fragment) {
                wire.extend_from_slice(&p);
            }
        }
        let mut dec = RecordDecoder::new(1 << 16);
        let got = feed(&mut dec, &wire, &chunks).unwrap();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn record_decoder_never_panics(
        wire in prop::collection::vec(any::<u8>(), 0..512),
        max in 0usize..300,
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut dec = RecordDecoder::new(max);
        if let Ok(records) = feed(&mut dec, &wire, &chunks) {
            for r in records {
                prop_assert!(r.len() <= max);
            }
        }
    }

    #[test]
    fn header_and_auth_decoders_never_panic(buf in prop::collection::vec(any::<u8>(), 0..256)) {
        let b = Bytes::from(buf);
        let _ = MessageHeader::decode_message(&b);
        let _ = AuthSys::decode_body(&b);
        let _ = GssCred::decode_body(&b);
        for flavor in [0, 1, 2, 6, 9] {
            let _ = Credential::parse(&OpaqueAuth { flavor, body: b.clone() });
        }
        let mut d = Decoder::from_bytes(&b);
        let _ = OpaqueAuth::decode(&mut d);
    }

    /// The shortcut RPC-over-RDMA takes for every call (no AUTH_SYS body decoded) says what
    /// parsing the credential would: any flavor, any body, well-formed RPCSEC_GSS ones of
    /// each service included.
    #[test]
    fn forbidding_reduction_without_parsing_agrees_with_parsing(
        buf in prop::collection::vec(any::<u8>(), 0..64),
        gss_proc in 0u32..5,
        service in 0u32..5,
        seq in any::<u32>(),
        handle in prop::collection::vec(any::<u8>(), 0..12),
    ) {
        let mut e = Encoder::new();
        for v in [1, gss_proc, seq, service] {
            e.put_u32(v);
        }
        e.put_opaque(&handle);
        let gss = e.finish().to_bytes();
        for body in [Bytes::from(buf), gss] {
            for flavor in [0, 1, 2, 6, 9] {
                let cred = OpaqueAuth { flavor, body: body.clone() };
                let parsed = Credential::parse(&cred).is_ok_and(|c| c.forbids_reduction());
                prop_assert_eq!(Credential::forbids_reduction_of(&cred), parsed);
            }
        }
    }

    #[test]
    fn reply_headers_round_trip(
        xid in any::<u32>(),
        kind in 0u32..9,
        low in any::<u32>(),
        high in any::<u32>(),
        auth in 0u32..40,
        verf_body in prop::collection::vec(any::<u8>(), 0..400),
        verf_flavor in any::<u32>(),
        results in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let verf = OpaqueAuth { flavor: verf_flavor, body: Bytes::from(verf_body) };
        let h = match kind {
            0 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::Success },
            1 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::ProgUnavail },
            2 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::ProgMismatch { low, high } },
            3 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::ProcUnavail },
            4 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::GarbageArgs },
            5 => ReplyHeader::Accepted { xid, verf, stat: AcceptStat::SystemErr },
            6 => ReplyHeader::Denied { xid, reason: RejectedReply::RpcMismatch { low, high } },
            // Every named auth_stat (0..=14) and unnamed values above them.
            _ => ReplyHeader::Denied {
                xid,
                reason: RejectedReply::AuthError(AuthStat::from_code(auth)),
            },
        };
        let mut enc = Encoder::new();
        h.encode(&mut enc);
        prop_assert_eq!(enc.position(), h.encoded_len());
        enc.put_raw(&results);
        let wire = enc.into_bytes();
        let (got, body) = MessageHeader::decode_message(&wire).unwrap();
        prop_assert_eq!(got, MessageHeader::Reply(h));
        prop_assert_eq!(&body[..], &results[..]);
    }

    #[test]
    fn call_headers_round_trip(
        xid in any::<u32>(),
        prog in any::<u32>(),
        vers in any::<u32>(),
        proc_ in any::<u32>(),
        cred_flavor in any::<u32>(),
        cred_body in prop::collection::vec(any::<u8>(), 0..400),
        verf_body in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let h = CallHeader {
            xid, prog, vers, proc_,
            cred: OpaqueAuth { flavor: cred_flavor, body: Bytes::from(cred_body) },
            verf: OpaqueAuth { flavor: 0, body: Bytes::from(verf_body) },
        };
        let mut enc = Encoder::new();
        h.encode(&mut enc);
        prop_assert_eq!(enc.position(), h.encoded_len());
        let wire = enc.into_bytes();
        let (got, body) = MessageHeader::decode_message(&wire).unwrap();
        prop_assert_eq!(got, MessageHeader::Call(h));
        prop_assert!(body.is_empty());
    }

    #[test]
    fn auth_sys_round_trips(
        stamp in any::<u32>(),
        name in prop::collection::vec(any::<u8>(), 0..=255),
        uid in any::<u32>(),
        gid in any::<u32>(),
        gids in prop::collection::vec(any::<u32>(), 0..=16),
    ) {
        let p = AuthSys { stamp, machinename: Bytes::from(name), uid, gid, gids };
        let cred = OpaqueAuth::sys(&p);
        prop_assert_eq!(cred.body.len(), p.encoded_len());
        prop_assert_eq!(Credential::parse(&cred).unwrap(), Credential::Sys(p));
    }
}

#[test]
fn every_auth_stat_code_round_trips() {
    for code in 0..=20u32 {
        assert_eq!(AuthStat::from_code(code).code(), code);
    }
    assert_eq!(AuthStat::from_code(13), AuthStat::RpcsecGssCredProblem);
    assert_eq!(AuthStat::from_code(15), AuthStat::Other(15));
}
