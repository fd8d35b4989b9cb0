//! Drive the RPC-over-RDMA Responder engine with one received message. The input is split
//! into the received bytes and the data that RDMA Reads return. Every path must end in a
//! typed outcome (never a panic), and every Send the engine makes must carry a header that
//! decodes in the version it names (or is an ERR_VERS echoing the peer's version). The
//! Responder speaks versions 1 and 2, so version 2 messages reach its version 2 path.
#![no_main]

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oncrpc::AcceptStat;
use rpcrdma::engine::{Config, Params};
use rpcrdma::header::Header;
use rpcrdma::header_v2::{Header2, peek_version};
use rpcrdma::responder::{Action, Incoming, Responder};
use rpcrdma::ulb::{Bindings, UlbError, UpperLayerBinding};
use xdr::{DdpPolicy, Encoder};

/// Program 7: the first argument is an opaque, DDP-eligible.
struct Toy;

impl UpperLayerBinding for Toy {
    fn program(&self) -> u32 {
        7
    }
    fn call_ddp_items(&self, _v: u32, _p: u32, args: &[u8]) -> Result<Vec<Range<usize>>, UlbError> {
        let w = args
            .get(0..4)
            .ok_or_else(|| UlbError::Garbage("short".into()))?;
        let n = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize;
        let item = 4..4usize.saturating_add(n);
        Ok(vec![item])
    }
    fn max_reply_size(&self, _v: u32, _p: u32, _a: &[u8]) -> Option<usize> {
        None
    }
}

fn check(actions: &[Action]) {
    for a in actions {
        if let Action::Send { data, .. } = a {
            // Every Send is a header of the version it says it is; an ERR_VERS answer copies
            // the peer's version (which may be neither), so then only its body is checked.
            match peek_version(data) {
                Some((_, 1)) => {
                    if let Err(e) = Header::decode(data) {
                        panic!("responder sent an undecodable version 1 header: {e}");
                    }
                }
                Some((_, 2)) => {
                    if let Err(e) = Header2::decode(data) {
                        panic!("responder sent an undecodable version 2 header: {e}");
                    }
                }
                _ => assert_eq!(
                    data.get(12..20),
                    Some(&[0, 0, 0, 4, 0, 0, 0, 1][..]),
                    "only an ERR_VERS may carry another version"
                ),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = (usize::from(split) * 4).min(rest.len());
    let (msg, mut reads) = rest.split_at(rest.len() - cut);
    let mut ulbs: Bindings = Bindings::default();
    ulbs.insert(7, Arc::new(Toy));
    let params = Params {
        inline_send: 1024,
        inline_recv: 1024,
        reply_inline: 1024,
        peer_remote_invalidate: split & 1 == 1,
    };
    let cfg = Config {
        max_call_size: 1 << 16,
        ..Config::default()
    };
    let mut r = Responder::new(cfg, params, Arc::new(ulbs), HashSet::new());
    let mut inc = r.on_receive(Bytes::copy_from_slice(msg));
    for _ in 0..2 {
        match inc {
            Incoming::NeedReads(p) if split & 2 == 2 && p.frame().is_some() => {
                // The driver's framed pull: the rest of the call around the chunk's bytes (of
                // whatever length the input gives, so mismatches are exercised too).
                let Some((_, pre, post)) = p.frame() else {
                    return;
                };
                let n = (p.reads[0].len() as usize).min(reads.len());
                let mut v = pre.to_vec();
                v.extend_from_slice(&reads[..n]);
                v.resize(v.len() + (4 - n % 4) % 4, 0);
                v.extend_from_slice(post);
                reads = &reads[n..];
                inc = r.complete_reads_framed(p, Bytes::from(v), n);
            }
            Incoming::NeedReads(p) => {
                let mut got = Vec::new();
                for c in &p.reads {
                    let n = (c.len() as usize).min(reads.len());
                    got.push(Bytes::copy_from_slice(&reads[..n]));
                    reads = &reads[n..];
                }
                inc = r.complete_reads(p, got);
            }
            Incoming::Call(call) => {
                // Answer with results whose size comes from the input, reduced as allowed.
                let mut e = Encoder::new().with_policy(call.policy);
                let n = usize::from(split) * 37;
                e.put_ddp_opaque(Bytes::from(vec![0xa5; n]));
                e.put_u32(1);
                let reply = oncrpc::service::accepted(
                    call.token.xid,
                    AcceptStat::Success,
                    Some(e.finish()),
                );
                let a = r.reply(call.token, Some(reply));
                check(&a);
                return;
            }
            Incoming::Respond(a) => {
                check(&a);
                return;
            }
            _ => return,
        }
    }
    let _ = DdpPolicy::Inline;
});
