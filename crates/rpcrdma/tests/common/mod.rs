//! Test support: a toy echo program with DDP-eligible items, its Upper-Layer Binding, and a
//! deterministic harness that connects a Requester and a Responder engine through in-memory
//! "RDMA" (a `MemRegistrar` standing in for the client's registered memory).
#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{Call, CallHeader, Dispatcher, OpaqueAuth, Outcome, Program, ReplyExpectation};
use rpcrdma::engine::{Config, MemRegistrar, Params};
use rpcrdma::requester::{self, OutCall, Requester};
use rpcrdma::responder::{self, Incoming, Responder};
use rpcrdma::ulb::{Bindings, UlbError, UpperLayerBinding};
use xdr::{DdpPolicy, Decoder, Encoded, Encoder};

pub const PROG: u32 = 0x2000_0099;
pub const VERS: u32 = 1;
/// ECHO: args `uint32 tag; opaque data<> (DDP-eligible); opaque extra<>`;
/// results `opaque data<> (DDP-eligible); uint32 tag; opaque extra<>`.
pub const ECHO: u32 = 1;
/// PAIR: args `opaque a<> (DDP); opaque b<> (DDP)`; results `opaque a<> (DDP); opaque b<> (DDP)`.
pub const PAIR: u32 = 2;
/// HOLD: no arguments; waits for a permit from [`HOLD_GATE`], then returns nothing.
pub const HOLD: u32 = 3;

/// Releases HOLD calls (tests add permits).
pub static HOLD_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
/// HOLD_Q: as HOLD, with a gate of its own ([`HOLD_Q_GATE`]) for the one test that counts
/// its held calls: under `cargo test` the tests of this binary share one process, and the
/// permits another test leaves on [`HOLD_GATE`] would let them through.
pub const HOLD_Q: u32 = 4;
/// Releases HOLD_Q calls.
pub static HOLD_Q_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

/// The echo program.
#[derive(Debug)]
pub struct EchoProgram;

fn echo_results(call: &Call) -> Option<Encoded> {
    let mut d = Decoder::from_bytes(&call.args);
    let mut e = call.reply_encoder();
    match call.header.proc_ {
        ECHO => {
            let tag = d.u32().ok()?;
            let data = d.opaque_bytes(u32::MAX).ok()?;
            let extra = d.opaque_bytes(u32::MAX).ok()?;
            d.finish().ok()?;
            e.put_ddp_opaque(data);
            e.put_u32(tag);
            e.put_opaque_bytes(extra);
        }
        PAIR => {
            let a = d.opaque_bytes(u32::MAX).ok()?;
            let b = d.opaque_bytes(u32::MAX).ok()?;
            d.finish().ok()?;
            e.put_ddp_opaque(a);
            e.put_ddp_opaque(b);
        }
        _ => return None,
    }
    Some(e.finish())
}

impl Program for EchoProgram {
    fn program(&self) -> u32 {
        PROG
    }
    fn versions(&self) -> (u32, u32) {
        (VERS, VERS)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            match call.header.proc_ {
                0 => Outcome::Success(Encoded::default()),
                HOLD | HOLD_Q => {
                    let gate = if call.header.proc_ == HOLD {
                        &HOLD_GATE
                    } else {
                        &HOLD_Q_GATE
                    };
                    if let Ok(p) = gate.acquire().await {
                        p.forget();
                    }
                    Outcome::Success(Encoded::default())
                }
                ECHO | PAIR => match echo_results(&call) {
                    Some(r) => Outcome::Success(r),
                    None => Outcome::GarbageArgs,
                },
                _ => Outcome::ProcUnavail,
            }
        })
    }
}

/// The echo program's Upper-Layer Binding.
#[derive(Debug)]
pub struct EchoUlb;

fn opaque_at(args: &[u8], at: usize) -> Result<Range<usize>, UlbError> {
    let w = args
        .get(at..at + 4)
        .ok_or_else(|| UlbError::Garbage("short".into()))?;
    let n = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize;
    let r = at + 4..at + 4 + n;
    if r.end > args.len() {
        return Err(UlbError::Garbage("short".into()));
    }
    Ok(r)
}

impl UpperLayerBinding for EchoUlb {
    fn program(&self) -> u32 {
        PROG
    }
    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError> {
        match proc_ {
            ECHO => Ok(vec![opaque_at(args, 4)?]),
            PAIR => {
                let a = opaque_at(args, 0)?;
                let b = opaque_at(args, xdr::padded(a.end))?;
                Ok(vec![a, b])
            }
            0 | HOLD | HOLD_Q => Ok(vec![]),
            _ => Err(UlbError::Unknown { vers, proc_ }),
        }
    }
    fn chunk_limits(&self) -> rpcrdma::ulb::ChunkLimits {
        rpcrdma::ulb::ChunkLimits {
            max_write_chunks: 2,
            ..Default::default()
        }
    }
    fn covers_version(&self, vers: u32) -> bool {
        vers == VERS
    }
    fn max_reply_size(&self, _vers: u32, _proc_: u32, args: &[u8]) -> Option<usize> {
        Some(64 + args.len())
    }
    fn reply_ddp_positions(
        &self,
        vers: u32,
        proc_: u32,
        results: &[u8],
        written: &[usize],
    ) -> Result<Vec<usize>, UlbError> {
        let items = match proc_ {
            ECHO => 1,
            PAIR => 2,
            _ => return Err(UlbError::Unknown { vers, proc_ }),
        };
        // Walk the result items; an item whose length equals the next non-zero written
        // count was reduced (its contents are absent from `results`).
        let mut pending = written.iter().copied().filter(|n| *n > 0).peekable();
        let mut out = Vec::new();
        let mut at = 0;
        for _ in 0..items {
            let w = results
                .get(at..at + 4)
                .ok_or_else(|| UlbError::Garbage("short".into()))?;
            let n = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize;
            at += 4;
            if pending.peek() == Some(&n) {
                pending.next();
                out.push(at);
            } else {
                at += xdr::padded(n);
            }
            if proc_ == ECHO {
                break;
            }
        }
        Ok(out)
    }
}

pub fn ulbs() -> Arc<Bindings> {
    let mut m: Bindings = Bindings::default();
    m.insert(PROG, Arc::new(EchoUlb));
    Arc::new(m)
}

pub fn dispatcher() -> Dispatcher {
    Dispatcher::new().with(Arc::new(EchoProgram))
}

/// Build an ECHO call message with the given reduction policy for the arguments.
pub fn echo_message(
    xid: u32,
    cred: OpaqueAuth,
    policy: DdpPolicy,
    tag: u32,
    data: &Bytes,
    extra: &Bytes,
) -> Encoded {
    let h = CallHeader {
        xid,
        prog: PROG,
        vers: VERS,
        proc_: ECHO,
        cred,
        verf: OpaqueAuth::none(),
    };
    let mut e = Encoder::new().with_policy(policy);
    h.encode(&mut e);
    e.put_u32(tag);
    e.put_ddp_opaque(data.clone());
    e.put_opaque_bytes(extra.clone());
    e.finish()
}

pub fn pair_message(xid: u32, policy: DdpPolicy, a: &Bytes, b: &Bytes) -> Encoded {
    let h = CallHeader {
        xid,
        prog: PROG,
        vers: VERS,
        proc_: PAIR,
        cred: OpaqueAuth::none(),
        verf: OpaqueAuth::none(),
    };
    let mut e = Encoder::new().with_policy(policy);
    h.encode(&mut e);
    e.put_ddp_opaque(a.clone());
    e.put_ddp_opaque(b.clone());
    e.finish()
}

/// Expected ECHO results (unreduced).
pub fn echo_results_bytes(tag: u32, data: &[u8], extra: &[u8]) -> Bytes {
    let mut e = Encoder::new();
    e.put_opaque(data);
    e.put_u32(tag);
    e.put_opaque(extra);
    e.into_bytes()
}

pub fn out_call(xid: u32, proc_: u32, message: Encoded, reply: ReplyExpectation) -> OutCall {
    OutCall {
        xid,
        prog: PROG,
        vers: VERS,
        proc_,
        message,
        reply,
        no_reduction: false,
        deadline: None,
    }
}

pub fn reduce(n: usize) -> DdpPolicy {
    DdpPolicy::Reduce {
        min_len: 1024,
        max_items: n,
    }
}

/// A Requester and a Responder wired back to back.
pub struct Harness {
    pub req: Requester,
    pub resp: Responder,
    pub creg: MemRegistrar,
    pub disp: Dispatcher,
    pub rt: tokio::runtime::Runtime,
    pub to_server: VecDeque<Bytes>,
    pub to_client: VecDeque<(Bytes, Option<u32>)>,
    pub done: HashMap<u32, Result<Bytes, oncrpc::RpcError>>,
    pub back_calls: Vec<(u32, Bytes)>,
    pub back_replies: Vec<(u32, Bytes)>,
    /// Sends the Responder made (raw), for byte-level assertions.
    pub server_sends: Vec<Bytes>,
    /// Handles the Responder invalidated with Send With Invalidate, in order.
    pub invalidated: Vec<u32>,
    pub params: Params,
    /// When set, the Responder holds this many calls before replying (to observe credits).
    pub batch: usize,
    /// Pull a lone mid-call Read chunk as the verbs driver does: into a buffer that already
    /// holds the rest of the call (`PendingCall::frame`, `Responder::complete_reads_framed`).
    pub framed: bool,
    /// Calls completed that way.
    pub framed_calls: usize,
    /// The Responder's registrar (responder-provided Read chunks), shared so a test reads its
    /// counters and the Requester's pulls read its memory.
    pub sreg: Arc<parking_lot::Mutex<MemRegistrar>>,
    /// Pulls are queued here instead of performed at once (`perform_pull` does them).
    pub hold_pulls: bool,
    pub pulls: VecDeque<(u64, Vec<rpcrdma::header::Segment>, usize)>,
    /// Pull-completion notifications are lost on the way (a requester that never notifies).
    pub drop_notifications: bool,
    /// Notifications sent, with the handle they invalidated by Send With Invalidate.
    pub notifications: Vec<(Bytes, Option<u32>)>,
    /// Server-bound messages that came by Send With Invalidate, with the handle.
    pub server_inv: Vec<(Bytes, u32)>,
}

impl Harness {
    pub fn new(client: Config, server: Config) -> Self {
        let params = server.negotiate(Some(client.private_data())).into();
        let cparams: Params = client.negotiate(Some(server.private_data())).into();
        let mut h = Harness {
            req: Requester::new(client, ulbs()),
            resp: Responder::new(server, params, ulbs(), HashSet::new()),
            creg: MemRegistrar::new(0x5eed_1234),
            disp: dispatcher(),
            rt: tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            done: HashMap::new(),
            back_calls: Vec::new(),
            back_replies: Vec::new(),
            server_sends: Vec::new(),
            invalidated: Vec::new(),
            params,
            batch: 1,
            framed: false,
            framed_calls: 0,
            sreg: Arc::new(parking_lot::Mutex::new(MemRegistrar::new(0x0dd_ba11))),
            hold_pulls: false,
            pulls: VecDeque::new(),
            drop_notifications: false,
            notifications: Vec::new(),
            server_inv: Vec::new(),
        };
        h.resp.set_registrar(Box::new(h.sreg.clone()));
        let a = h.req.on_connect(cparams, &mut h.creg);
        h.client_actions(a);
        h
    }

    pub fn client_actions(&mut self, actions: Vec<requester::Action>) {
        for a in actions {
            match a {
                requester::Action::Send { data, .. } => self.to_server.push_back(data),
                requester::Action::Complete { xid, result } => {
                    self.done.insert(xid, result);
                }
                requester::Action::BackCall { xid, message } => {
                    self.back_calls.push((xid, message))
                }
                requester::Action::Close => panic!("client closed the connection"),
                requester::Action::Pull {
                    pull,
                    segments,
                    len,
                    ..
                } => {
                    self.pulls.push_back((pull, segments, len));
                    if !self.hold_pulls {
                        self.perform_pull();
                    }
                }
                requester::Action::Notify { data, invalidate } => {
                    self.notifications.push((data.clone(), invalidate));
                    if !self.drop_notifications {
                        if let Some(h) = invalidate {
                            self.server_inv.push((data.clone(), h));
                        }
                        self.to_server.push_back(data);
                    }
                }
            }
        }
    }

    /// Perform the oldest queued pull: RDMA Read its segments from the Responder's memory
    /// (a dead handle fails, like a Remote Access error) and hand the bytes to the Requester.
    pub fn perform_pull(&mut self) {
        let Some((pull, segs, _len)) = self.pulls.pop_front() else {
            return;
        };
        let mut v = Vec::new();
        let mut ok = true;
        for s in &segs {
            match self.sreg.lock().rdma_read(s) {
                Some(d) => v.extend_from_slice(&d),
                None => ok = false,
            }
        }
        let r = if ok {
            Ok(Bytes::from(v))
        } else {
            Err("remote access error".to_string())
        };
        let a = self.req.pull_done(pull, r, &mut self.creg);
        self.client_actions(a);
    }

    pub fn server_actions(&mut self, actions: Vec<responder::Action>) {
        for a in actions {
            match a {
                responder::Action::Write { segment, data } => {
                    assert!(self.creg.rdma_write(&segment, &data), "RDMA Write failed");
                }
                responder::Action::Send { data, invalidate } => {
                    if let Some(h) = invalidate {
                        // Send With Invalidate: the client's region dies on arrival.
                        assert!(self.creg.region_of(h).is_some());
                        self.invalidated.push(h);
                    }
                    self.server_sends.push(data.clone());
                    self.to_client.push_back((data, invalidate));
                }
                responder::Action::Close => panic!("server closed the connection"),
            }
        }
    }

    /// What the server's RDMA Reads of `p`'s Read chunks bring back from the client's
    /// memory: one buffer per chunk, in order.
    pub fn pull_reads(&mut self, p: &responder::PendingCall) -> Vec<Bytes> {
        p.reads
            .iter()
            .map(|c| {
                let mut v = Vec::new();
                for s in &c.segments {
                    v.extend_from_slice(&self.creg.rdma_read(s).expect("RDMA Read"));
                }
                Bytes::from(v)
            })
            .collect()
    }

    /// Deliver one server-bound message; returns the ready call, if any.
    pub fn server_receive(&mut self, m: Bytes) -> Option<responder::ReadyCall> {
        let inv = self
            .server_inv
            .iter()
            .position(|(b, _)| *b == m)
            .map(|i| self.server_inv.remove(i).1);
        let mut inc = self.resp.on_receive_with(m, inv);
        loop {
            match inc {
                Incoming::Nothing => return None,
                Incoming::Respond(a) => {
                    self.server_actions(a);
                    return None;
                }
                Incoming::NeedReads(p) if self.framed && p.frame().is_some() => {
                    let Some((_, pre, post)) = p.frame() else {
                        unreachable!()
                    };
                    let mut v = pre.to_vec();
                    let mut n = 0;
                    for s in &p.reads[0].segments {
                        let d = self.creg.rdma_read(s).expect("RDMA Read");
                        n += d.len();
                        v.extend_from_slice(&d);
                    }
                    v.resize(v.len() + xdr::pad_len(n), 0);
                    v.extend_from_slice(post);
                    self.framed_calls += 1;
                    inc = self.resp.complete_reads_framed(p, Bytes::from(v), n);
                }
                Incoming::NeedReads(p) => {
                    let data = self.pull_reads(&p);
                    inc = self.resp.complete_reads(p, data);
                }
                Incoming::Call(c) => return Some(c),
                Incoming::BackReply { xid, message } => {
                    self.back_replies.push((xid, message));
                    let a = self.resp.poll_back();
                    self.server_actions(a);
                    return None;
                }
            }
        }
    }

    pub fn serve(&mut self, c: responder::ReadyCall) {
        let reply = self.rt.block_on(self.disp.dispatch(
            c.message,
            oncrpc::CallContext::local(),
            c.policy,
        ));
        let a = self.resp.reply(c.token, reply);
        self.server_actions(a);
    }

    /// Run until nothing moves.
    pub fn run(&mut self) {
        for _ in 0..1_000_000 {
            if !self.to_server.is_empty() {
                let mut ready = Vec::new();
                while let Some(m) = self.to_server.pop_front() {
                    if let Some(c) = self.server_receive(m) {
                        ready.push(c);
                    }
                    if ready.len() >= self.batch {
                        break;
                    }
                }
                for c in ready {
                    self.serve(c);
                }
                continue;
            }
            if let Some((m, inv)) = self.to_client.pop_front() {
                let a = self.req.on_receive(m, inv, &mut self.creg);
                self.client_actions(a);
                continue;
            }
            return;
        }
        panic!("harness did not settle");
    }
}

/// The default settings with 4 KiB receive buffers (Linux's inline threshold), which these
/// tests' message forms are sized against: calls and replies of a few KiB take chunks. The
/// default is 8 KiB (`rpcrdma::engine::DEFAULT_INLINE_RECV`), where they would go whole.
#[allow(dead_code)]
pub fn cfg_4k() -> Config {
    Config {
        inline_recv: 4096,
        ..Config::default()
    }
}
