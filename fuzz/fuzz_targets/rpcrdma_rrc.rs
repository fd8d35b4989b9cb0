//! Responder-provided Read chunks (`rpcrdma::rrc`): the Responder's notification path and the
//! Requester's pull path, driven by a script taken from the input.
//!
//! Responder: a version 2 connection whose client announced the capability (a hand-made
//! RDMA2_CONNPROP and one call), then operations picked by the input: calls answered with
//! replies of input-chosen sizes (some become Read chunks, some wait for room), notifications
//! for waiting XIDs (with the right, a wrong or no invalidated handle) and for any XID with any
//! optinfo, pull deadlines, the end of the connection. After every step the table holds at most
//! its bounds, and exactly its chunks are registered; every Send decodes; after the end of the
//! connection nothing is registered.
//!
//! Requester: a version 2 connection in read-chunk mode (capability agreed), calls outstanding,
//! then: RDMA2_NOMSG replies with input-made Read lists for known and unknown XIDs, pull
//! completions (the right length with a valid or a garbage reply, another length, a failure,
//! stale ids), raw messages, cancels, reconnects. Each such reply yields exactly one Pull or one
//! notification; each live pull's completion exactly one notification; no call completes twice.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use oncrpc::{AcceptStat, ReplyExpectation};
use rpcrdma::engine::{Config, MemRegistrar, Params};
use rpcrdma::header::{Chunks, ReadChunk, Segment};
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, Header2, Optional};
use rpcrdma::props::{ConnProp, PropSet, PropSubset, PropVal};
use rpcrdma::requester::{self, OutCall, Requester};
use rpcrdma::responder::{self, Incoming, Responder};
use rpcrdma::rrc::{OPTTYPE_PULL_DONE, PROPID_RRC, ReplyMode, RrcConfig};
use rpcrdma::ulb::{Bindings, UlbError, UpperLayerBinding};
use rpcrdma::version::{Version, VersionPolicy};
use xdr::{Encoded, Encoder};

const PROG: u32 = 7;

struct Toy;

impl UpperLayerBinding for Toy {
    fn program(&self) -> u32 {
        PROG
    }
    fn call_ddp_items(&self, _v: u32, _p: u32, _a: &[u8]) -> Result<Vec<Range<usize>>, UlbError> {
        Ok(Vec::new())
    }
    fn max_reply_size(&self, _v: u32, _p: u32, _a: &[u8]) -> Option<usize> {
        Some(256)
    }
}

/// Input bytes, read front to back; zeros once used up.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> Bytes {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Bytes::copy_from_slice(a)
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

type Ulbs = Arc<Bindings>;

/// Built once: the engines only read it.
fn ulbs() -> Ulbs {
    static ULBS: std::sync::OnceLock<Ulbs> = std::sync::OnceLock::new();
    ULBS.get_or_init(|| {
        let mut m: Bindings = Bindings::default();
        m.insert(PROG, Arc::new(Toy));
        Arc::new(m)
    })
    .clone()
}

fn params() -> Params {
    Params {
        inline_send: 4096,
        inline_recv: 4096,
        reply_inline: 4096,
        peer_remote_invalidate: true,
    }
}

fn connprop_with_rrc(xid: u32) -> Bytes {
    let c = ConnProp {
        start: PropSet(vec![
            PropVal::rbsiz(4096),
            PropVal {
                which: PROPID_RRC,
                data: Bytes::from_static(&[0, 0, 0, 1]),
            },
        ]),
        nochg: PropSubset::default(),
    };
    Header2::new(xid, 4, Body2::ConnProp(c)).to_bytes()
}

fn rpc_call(xid: u32) -> Encoded {
    let mut e = Encoder::new();
    oncrpc::CallHeader {
        xid,
        prog: PROG,
        vers: 1,
        proc_: 1,
        cred: oncrpc::OpaqueAuth::none(),
        verf: oncrpc::OpaqueAuth::none(),
    }
    .encode(&mut e);
    e.finish()
}

/// An accepted, successful RPC reply of exactly `len` bytes (at least 24).
fn rpc_reply(xid: u32, len: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(len.max(24));
    for w in [xid, 1, 0, 0, 0, 0] {
        b.put_u32(w);
    }
    b.resize(len.max(24), 0x5a);
    b.freeze()
}

fn check_sends(actions: &[responder::Action]) {
    for a in actions {
        if let responder::Action::Send { data, .. } = a {
            // Raw input may be a version 1 message (answered in version 1) or of another
            // version (ERR_VERS echoes it); everything else is version 2.
            match rpcrdma::header_v2::peek_version(data) {
                Some((_, 1)) => {
                    rpcrdma::header::Header::decode(data).expect("undecodable version 1 header");
                }
                Some((_, 2)) => {
                    Header2::decode(data).expect("the Responder sent an undecodable header");
                }
                _ => assert_eq!(data.get(12..16), Some(&[0, 0, 0, 4][..]), "only ERR_VERS"),
            }
        }
    }
}

fn responder_side(s: &mut Script<'_>) {
    let sreg = Arc::new(parking_lot::Mutex::new(MemRegistrar::new(7)));
    let max_chunks = 1 + usize::from(s.u8() & 3);
    let max_bytes = 4096 + usize::from(s.u8()) * 32;
    let cfg = Config {
        max_version: Version::V2,
        credits: 4,
        rrc: RrcConfig {
            enabled: true,
            max_chunks,
            max_bytes,
            pull_timeout: Duration::from_secs(1),
            ..RrcConfig::default()
        },
        ..Config::default()
    };
    let mut r = Responder::new(cfg, params(), ulbs(), HashSet::new());
    r.set_registrar(Box::new(sreg.clone()));
    let _ = r.on_receive(connprop_with_rrc(1));
    let t0 = Instant::now();
    // xid -> its chunk's handle, as the NOMSG replies named them.
    let mut handles: HashMap<u32, u32> = HashMap::new();
    for _ in 0..16 {
        if s.done() {
            break;
        }
        match s.u8() % 6 {
            0 => {
                let xid = u32::from(s.u8());
                // 0 to 8 KiB: around the 4096-byte inline threshold and the table's byte bound.
                let size = usize::from(s.u8()) * 32;
                let call = rpc_call(xid).to_bytes();
                let mut m = BytesMut::new();
                Header2::new(
                    xid,
                    4,
                    Body2::Msg(ChunkLists::new(Direction::Call, Chunks::default())),
                )
                .encode(&mut m);
                m.extend_from_slice(&call);
                if let Incoming::Call(c) = r.on_receive(m.freeze()) {
                    let mut e = Encoder::new();
                    e.put_opaque(&vec![0xa5; size]);
                    let reply =
                        oncrpc::service::accepted(xid, AcceptStat::Success, Some(e.finish()));
                    let a = r.reply_at(c.token, Some(reply), t0);
                    check_sends(&a);
                    for act in &a {
                        if let responder::Action::Send { data, .. } = act
                            && let Ok((h, _)) = Header2::decode(data)
                            && let Body2::NoMsg(l) = &h.body
                            && let Some(rc) = l.chunks.read_chunks().first()
                        {
                            handles.insert(h.xid, rc.segments[0].handle);
                        }
                    }
                }
            }
            op @ (1 | 2) => {
                let (xid, inv, optinfo) = if op == 1 && !handles.is_empty() {
                    let keys: Vec<u32> = handles.keys().copied().collect();
                    let xid = keys[usize::from(s.u8()) % keys.len()];
                    let inv = match s.u8() % 3 {
                        0 => None,
                        1 => handles.get(&xid).copied(),
                        _ => Some(s.u32()),
                    };
                    (
                        xid,
                        inv,
                        Bytes::copy_from_slice(&u32::from(s.u8() % 5).to_be_bytes()),
                    )
                } else {
                    let n = usize::from(s.u8() % 9);
                    (s.u32(), None, s.bytes(n))
                };
                let o = Optional {
                    direction: if s.u8() & 1 == 0 {
                        Direction::Call
                    } else {
                        Direction::Reply
                    },
                    opttype: OPTTYPE_PULL_DONE,
                    optinfo,
                };
                match r.on_receive_with(Header2::new(xid, 4, Body2::Optional(o)).to_bytes(), inv) {
                    Incoming::Respond(a) => check_sends(&a),
                    Incoming::Nothing => {}
                    other => panic!("a notification produced {other:?}"),
                }
            }
            3 => {
                let t = r.handle_timeout(t0 + Duration::from_millis(u64::from(s.u16())));
                check_sends(&t.actions);
            }
            4 => {
                // Raw bytes as a message.
                let n = usize::from(s.u8());
                let m = s.bytes(n);
                if let Incoming::Respond(a) = r.on_receive(m) {
                    check_sends(&a);
                }
            }
            _ => {
                r.connection_closed();
                assert_eq!(
                    sreg.lock().live(),
                    0,
                    "chunks left registered after the end"
                );
                return;
            }
        }
        let (n, bytes) = r.rrc_waiting();
        assert!(
            n <= max_chunks && bytes <= max_bytes,
            "table over its bounds"
        );
        assert!(r.rrc_parked() <= 4, "more parked replies than credits");
        assert_eq!(
            sreg.lock().live(),
            n,
            "registered memory is exactly the table's"
        );
    }
    r.connection_closed();
    assert_eq!(sreg.lock().live(), 0);
}

/// One Requester's actions: notifications, pulls (id, length), completions.
#[derive(Default)]
struct Seen {
    notifies: usize,
    pulls: Vec<(u64, usize, u32)>,
}

fn absorb(a: Vec<requester::Action>, seen: &mut Seen, done: &mut HashSet<u32>) {
    for x in a {
        match x {
            requester::Action::Notify { data, .. } => {
                Header2::decode(&data).expect("undecodable notification");
                seen.notifies += 1;
            }
            requester::Action::Pull {
                xid,
                pull,
                len,
                segments,
            } => {
                assert_eq!(
                    segments.iter().map(|s| s.length as usize).sum::<usize>(),
                    len
                );
                seen.pulls.push((pull, len, xid));
            }
            requester::Action::Complete { xid, .. } => {
                assert!(done.insert(xid), "call {xid} completed twice");
            }
            _ => {}
        }
    }
}

fn requester_side(s: &mut Script<'_>) {
    let mut reg = MemRegistrar::new(3);
    let cfg = Config {
        version_policy: VersionPolicy::V2,
        credits: 8,
        rrc: RrcConfig {
            enabled: true,
            reply_mode: ReplyMode::ReadChunk,
            max_reply: 1 << 13,
            max_segments: 4,
            ..RrcConfig::default()
        },
        ..Config::default()
    };
    let mut q = Requester::new(cfg, ulbs());
    let mut done = HashSet::new();
    let mut seen = Seen::default();
    let submit = |q: &mut Requester, reg: &mut MemRegistrar, xid: u32| {
        q.submit(
            OutCall {
                xid,
                prog: PROG,
                vers: 1,
                proc_: 1,
                message: rpc_call(xid),
                reply: ReplyExpectation {
                    max_len: Some(256),
                    ddp_items: vec![],
                },
                no_reduction: false,
                deadline: None,
            },
            reg,
        )
    };
    let _ = q.on_connect(params(), &mut reg);
    let _ = submit(&mut q, &mut reg, 1);
    let _ = q.on_receive(connprop_with_rrc(1), None, &mut reg);
    let mut m = BytesMut::new();
    Header2::new(
        1,
        8,
        Body2::Msg(ChunkLists::new(Direction::Reply, Chunks::default())),
    )
    .encode(&mut m);
    m.extend_from_slice(&rpc_reply(1, 24));
    absorb(
        q.on_receive(m.freeze(), None, &mut reg),
        &mut seen,
        &mut done,
    );
    assert!(q.rrc_agreed(), "the capability was not agreed");
    let mut next_xid = 100u32;
    let mut live_pulls: HashSet<u64> = HashSet::new();
    while next_xid < 103 {
        absorb(submit(&mut q, &mut reg, next_xid), &mut seen, &mut done);
        next_xid += 1;
    }
    for _ in 0..16 {
        if s.done() {
            break;
        }
        match s.u8() % 6 {
            0 | 1 => {
                // A Read-chunk reply, for an outstanding XID or any.
                let xid = if s.u8() & 1 == 0 {
                    100 + u32::from(s.u8() % 4)
                } else {
                    s.u32()
                };
                let nseg = usize::from(s.u8() % 6);
                let segs: Vec<Segment> = (0..nseg)
                    .map(|_| Segment {
                        handle: s.u32() & 0xff,
                        length: u32::from(s.u16() % 4096),
                        offset: u64::from(s.u16()),
                    })
                    .collect();
                let mut chunks = Chunks::default();
                let position = if s.u8() & 7 == 0 { 4 } else { 0 };
                let mut rcs = vec![ReadChunk {
                    position,
                    segments: segs,
                }];
                if s.u8() & 7 == 0 {
                    rcs.push(ReadChunk {
                        position: 8,
                        segments: vec![],
                    });
                }
                chunks.set_read_chunks(&rcs);
                if chunks.reads.is_empty() {
                    // No segment at all: not a Read-chunk reply; give it one.
                    chunks.set_read_chunks(&[ReadChunk {
                        position: 0,
                        segments: vec![Segment {
                            handle: 1,
                            length: 64,
                            offset: 0,
                        }],
                    }]);
                }
                let mut l = ChunkLists::new(Direction::Reply, chunks);
                l.inv_handle = if s.u8() & 1 == 0 { 0 } else { s.u32() & 0xff };
                let before = (seen.notifies, seen.pulls.len());
                absorb(
                    q.on_receive(
                        Header2::new(xid, 8, Body2::NoMsg(l)).to_bytes(),
                        None,
                        &mut reg,
                    ),
                    &mut seen,
                    &mut done,
                );
                let (n, p) = (seen.notifies - before.0, seen.pulls.len() - before.1);
                assert_eq!(
                    n + p,
                    1,
                    "a Read-chunk reply must be pulled or notified, once"
                );
                if p == 1 {
                    live_pulls.insert(seen.pulls[seen.pulls.len() - 1].0);
                }
            }
            2 => {
                // A pull ends: the right length with a valid or a garbage reply, another
                // length, or a failure; sometimes an id that was never given.
                let pick = usize::from(s.u8());
                let (id, len, xid) = match seen.pulls.get(pick % seen.pulls.len().max(1)) {
                    Some(p) if pick < 200 => *p,
                    _ => (u64::from(s.u32()), 64, 0),
                };
                let data = match s.u8() % 4 {
                    0 => Ok(rpc_reply(xid, len)),
                    1 => Ok(s.bytes(len)),
                    2 => Ok(Bytes::from(vec![0; usize::from(s.u8())])),
                    _ => Err("remote access error".to_string()),
                };
                let before = seen.notifies;
                absorb(q.pull_done(id, data, &mut reg), &mut seen, &mut done);
                let live = live_pulls.remove(&id);
                assert_eq!(
                    seen.notifies - before,
                    usize::from(live),
                    "one notification per live pull"
                );
            }
            3 => {
                let n = usize::from(s.u8());
                let m = s.bytes(n);
                absorb(q.on_receive(m, None, &mut reg), &mut seen, &mut done);
            }
            4 => {
                let xid = 100 + u32::from(s.u8() % 4);
                absorb(
                    q.cancel(xid, oncrpc::RpcError::Timeout, &mut reg),
                    &mut seen,
                    &mut done,
                );
            }
            _ => {
                // Reconnect: pulls under way are forgotten (their responder invalidates).
                absorb(q.on_disconnect(&mut reg), &mut seen, &mut done);
                live_pulls.clear();
                absorb(q.on_connect(params(), &mut reg), &mut seen, &mut done);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let mut s = Script(rest);
    if which & 1 == 0 {
        responder_side(&mut s);
    } else {
        requester_side(&mut s);
    }
});
