//! Property tests: the engines never panic on arbitrary input, answer with well-formed headers,
//! and fence memory before completing a call.

use std::collections::HashSet;

use crate::common::*;
use bytes::{Bytes, BytesMut};
use oncrpc::OpaqueAuth;
use proptest::prelude::*;
use rpcrdma::engine::{Config, MemRegistrar, Params};
use rpcrdma::header::{Body, Chunks, Header, HeaderError, ReadSegment, Segment};
use rpcrdma::requester::{Action, Requester};
use rpcrdma::responder::{Incoming, Responder};
use xdr::DdpPolicy;

fn check_sends(actions: &[rpcrdma::responder::Action]) -> Result<(), TestCaseError> {
    for a in actions {
        if let rpcrdma::responder::Action::Send { data, .. } = a {
            let ok = matches!(
                Header::decode(data),
                Ok(_) | Err(HeaderError::Version { .. })
            );
            prop_assert!(ok);
        }
    }
    Ok(())
}

fn drive(r: &mut Responder, msg: Bytes, reads: &[u8]) -> Result<(), TestCaseError> {
    let mut inc = r.on_receive(msg);
    let mut reads = reads;
    for _ in 0..2 {
        match inc {
            Incoming::NeedReads(p) => {
                let mut got = Vec::new();
                for c in &p.reads {
                    let n = (c.len() as usize).min(reads.len());
                    got.push(Bytes::copy_from_slice(&reads[..n]));
                    reads = &reads[n..];
                }
                inc = r.complete_reads(p, got);
            }
            Incoming::Respond(a) => return check_sends(&a),
            Incoming::Call(c) => {
                let reply =
                    oncrpc::service::accepted(c.token.xid, oncrpc::AcceptStat::Success, None);
                let a = r.reply(c.token, Some(reply));
                return check_sends(&a);
            }
            _ => return Ok(()),
        }
    }
    Ok(())
}

fn responder() -> Responder {
    Responder::new(Config::default(), Params::default(), ulbs(), HashSet::new())
}

proptest! {
    #[test]
    fn responder_survives_random_bytes(msg in prop::collection::vec(any::<u8>(), 0..512), reads in prop::collection::vec(any::<u8>(), 0..256)) {
        drive(&mut responder(), Bytes::from(msg), &reads)?;
    }

    #[test]
    fn responder_survives_mutated_calls(
        data in 0usize..3000,
        pos in 0u32..512,
        len in 0u32..4096,
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        reads in prop::collection::vec(any::<u8>(), 0..4096),
    ) {
        // A plausible chunked call, then damage it.
        let m = echo_message(5, OpaqueAuth::none(), DdpPolicy::Inline, 1, &Bytes::from(vec![1u8; data]), &Bytes::new());
        let mut c = Chunks::default();
        c.reads.push(ReadSegment { position: pos, target: Segment { handle: 9, length: len, offset: 0 } });
        let mut b = BytesMut::new();
        Header::new(5, 1, Body::Msg(c)).encode(&mut b);
        b.extend_from_slice(&m.to_bytes());
        let mut v = b.to_vec();
        for (i, x) in flips {
            let n = v.len();
            v[i % n] ^= x;
        }
        drive(&mut responder(), Bytes::from(v), &reads)?;
    }

    #[test]
    fn requester_survives_random_replies_and_fences_first(
        body in prop::collection::vec(any::<u8>(), 0..256),
        credits in any::<u32>(),
        proc_ in 0u32..6,
    ) {
        let mut reg = MemRegistrar::new(1);
        let mut q = Requester::new(Config::default(), ulbs());
        let _ = q.on_connect(Params::default(), &mut reg);
        let m = echo_message(77, OpaqueAuth::none(), reduce(1), 1, &Bytes::from(vec![3u8; 2000]), &Bytes::new());
        let reply = oncrpc::ReplyExpectation { max_len: Some(5000), ddp_items: vec![2000] };
        let a = q.submit(out_call(77, ECHO, m, reply), &mut reg);
        prop_assert_eq!(a.len(), 1);
        prop_assert!(reg.live() >= 2);
        let mut msg = BytesMut::new();
        for w in [77u32, 1, credits, proc_] {
            msg.extend_from_slice(&w.to_be_bytes());
        }
        msg.extend_from_slice(&body);
        let out = q.on_receive(msg.freeze(), None, &mut reg);
        for a in &out {
            if let Action::Complete { .. } = a {
                // RFC 8166 §4.4.1: fenced before completion.
                prop_assert_eq!(reg.live(), 0);
            }
        }
        prop_assert!(q.limit() >= 1);
    }
}
