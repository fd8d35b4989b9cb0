//! Deterministic sans-IO tests of the RDS engine with a simulated TCP transport.
//!
//! The simulated transport is a byte stream per direction. Bytes written are "in the network"
//! until the simulator delivers them (in random chunks); the sender learns the delivered
//! position through `on_transport_acked`, with a random lag. A reset loses every byte not yet
//! delivered, as a TCP RST does; bytes delivered but not yet acknowledged to the sender come
//! back as retransmissions, which the receiver must drop.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use rand::{Rng, SeedableRng, rngs::StdRng};
use rds::engine::{AcceptOutcome, Action, PathState, Token};
use rds::{Engine, EngineConfig, SendError, TransportKind};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

struct Dir {
    wire: VecDeque<Bytes>,
    delivered: u64,
}

struct Link {
    /// (node index, token) of both ends.
    ends: [(usize, Token); 2],
    /// dirs[0]: ends[0] → ends[1]; dirs[1]: the reverse.
    dirs: [Dir; 2],
}

struct Sim {
    nodes: Vec<Engine>,
    ips: Vec<Ipv4Addr>,
    links: Vec<Link>,
    rng: StdRng,
    now: Instant,
    /// Datagrams read by the application of each node: (dport, payload, src).
    inbox: Vec<Vec<(u16, Bytes, SocketAddrV4)>>,
    /// Whether the application of each node reads its ports.
    reading: Vec<bool>,
    send_ready: Vec<u64>,
    lost_bytes: u64,
}

impl Sim {
    fn new(seed: u64, cfgs: Vec<EngineConfig>) -> Sim {
        let ips = cfgs.iter().map(|c| c.local).collect();
        let n = cfgs.len();
        Sim {
            nodes: cfgs.into_iter().map(Engine::new).collect(),
            ips,
            links: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            now: Instant::now(),
            inbox: vec![Vec::new(); n],
            reading: vec![true; n],
            send_ready: vec![0; n],
            lost_bytes: 0,
        }
    }

    fn node_of(&self, ip: Ipv4Addr) -> usize {
        self.ips.iter().position(|i| *i == ip).unwrap()
    }

    fn find_link(&self, node: usize, tok: Token) -> Option<(usize, usize)> {
        self.links.iter().enumerate().find_map(|(li, l)| {
            l.ends
                .iter()
                .position(|e| *e == (node, tok))
                .map(|side| (li, side))
        })
    }

    /// Drops link `li` (both ends told), losing undelivered bytes.
    fn reset_link(&mut self, li: usize) {
        let l = self.links.remove(li);
        for d in &l.dirs {
            self.lost_bytes += d.wire.iter().map(|b| b.len() as u64).sum::<u64>();
        }
        for (n, t) in l.ends {
            self.nodes[n].transport_down(self.now, t);
        }
    }

    fn process_actions(&mut self) {
        for n in 0..self.nodes.len() {
            let mut guard = 0;
            while let Some(a) = self.nodes[n].poll_action() {
                guard += 1;
                assert!(guard < 1_000_000, "action storm");
                match a {
                    Action::Connect(path) => {
                        let r = self.node_of(path.peer);
                        let local_ip = self.ips[n];
                        match self.nodes[r].accept(self.now, local_ip) {
                            AcceptOutcome::Reject | AcceptOutcome::Refuse => {
                                // Connection reset by the peer.
                                self.nodes[n].connect_failed(self.now, path);
                            }
                            AcceptOutcome::Accept(rt) => {
                                match self.nodes[n].connected(self.now, path) {
                                    Some(lt) => self.links.push(Link {
                                        ends: [(n, lt), (r, rt)],
                                        dirs: [
                                            Dir {
                                                wire: VecDeque::new(),
                                                delivered: 0,
                                            },
                                            Dir {
                                                wire: VecDeque::new(),
                                                delivered: 0,
                                            },
                                        ],
                                    }),
                                    None => self.nodes[r].transport_down(self.now, rt),
                                }
                            }
                        }
                    }
                    Action::Close(t) => {
                        if let Some((li, side)) = self.find_link(n, t) {
                            let l = self.links.remove(li);
                            let (on, ot) = l.ends[1 - side];
                            self.nodes[on].transport_down(self.now, ot);
                        }
                    }
                    Action::Readable(port) if self.reading[n] => {
                        while let Some(d) = self.nodes[n].recv(port) {
                            self.inbox[n].push((port, d.payload, d.src));
                        }
                    }
                    Action::SendReady => self.send_ready[n] += 1,
                    Action::Transmit(_) => {}
                    _ => {}
                }
            }
        }
    }

    /// One step: actions, transmit, deliver some bytes, maybe report acks, advance time.
    fn step(&mut self) {
        self.now += Duration::from_micros(100);
        for n in 0..self.nodes.len() {
            self.nodes[n].handle_timeout(self.now);
        }
        self.process_actions();
        // Pull bytes from the engines.
        for l in &mut self.links {
            for side in 0..2 {
                let (n, t) = l.ends[side];
                let mut budget = 256;
                while budget > 0 {
                    let Some(b) = self.nodes[n].poll_transmit(t) else {
                        break;
                    };
                    l.dirs[side].wire.push_back(b);
                    budget -= 1;
                }
            }
        }
        // Deliver a random amount, in random chunk sizes.
        let mut errs = Vec::new();
        for li in 0..self.links.len() {
            for side in 0..2 {
                let (rn, rt) = self.links[li].ends[1 - side];
                let mut quota: usize = self.rng.random_range(0..4_000);
                while quota > 0 {
                    let d = &mut self.links[li].dirs[side];
                    let Some(front) = d.wire.front_mut() else {
                        break;
                    };
                    let take = front.len().min(quota).min(self.rng.random_range(1..3000));
                    let chunk = front.split_to(take);
                    if front.is_empty() {
                        d.wire.pop_front();
                    }
                    d.delivered += take as u64;
                    quota -= take;
                    if self.nodes[rn].on_recv(self.now, rt, &chunk).is_err() {
                        errs.push(li);
                        break;
                    }
                }
                // The sender hears about it later (random lag).
                if self.rng.random_bool(0.3) {
                    let (sn, st) = self.links[li].ends[side];
                    let acked = self.links[li].dirs[side].delivered;
                    self.nodes[sn].on_transport_acked(st, acked);
                }
            }
        }
        assert!(errs.is_empty(), "protocol error on a link");
        self.process_actions();
    }
}

/// Payload: sport, dport, counter; padded to a random length.
fn payload(sport: u16, dport: u16, n: u64, pad: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(12 + pad);
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.resize(12 + pad, 0xab);
    b.freeze()
}

#[derive(Default)]
struct Checker {
    expect: HashMap<(Ipv4Addr, u16, u16), u64>,
    ok: u64,
    lost: u64,
    dup: u64,
}

impl Checker {
    fn check(&mut self, inbox: &mut Vec<(u16, Bytes, SocketAddrV4)>) {
        for (dport, mut p, src) in inbox.drain(..) {
            let s = p.get_u16();
            let d = p.get_u16();
            let n = p.get_u64();
            assert_eq!((s, d), (src.port(), dport));
            let e = self.expect.entry((*src.ip(), s, d)).or_insert(0);
            match n.cmp(e) {
                std::cmp::Ordering::Equal => {
                    self.ok += 1;
                    *e += 1;
                }
                std::cmp::Ordering::Greater => {
                    self.lost += n - *e;
                    *e = n + 1;
                }
                std::cmp::Ordering::Less => self.dup += 1,
            }
        }
    }
}

fn cfg(ip: Ipv4Addr, seed: u64, paths: u16) -> EngineConfig {
    let mut c = EngineConfig::tcp(ip);
    c.seed = Some(seed);
    c.max_paths = paths;
    c
}

/// Acceptance: 10^5 messages across 100 forced connection resets arrive with none lost, none
/// duplicated, in order per port pair (both directions, 8 paths, random sizes).
#[test]
fn exactly_once_across_100_resets() {
    const TOTAL: u64 = 100_000;
    const RESETS: u64 = 100;
    let mut sim = Sim::new(7, vec![cfg(A, 1, 8), cfg(B, 2, 8)]);
    let ports_a: Vec<u16> = (1000..1006).collect();
    let ports_b: Vec<u16> = (2000..2006).collect();
    for p in &ports_a {
        sim.nodes[0].bind(*p).unwrap();
    }
    for p in &ports_b {
        sim.nodes[1].bind(*p).unwrap();
    }
    let mut counters: HashMap<(usize, u16, u16), u64> = HashMap::new();
    let mut sent = 0u64;
    let mut resets = 0u64;
    let mut checker = Checker::default();
    let mut steps = 0u64;
    let mut would_block = 0u64;
    while (sent < TOTAL || checker.ok < TOTAL) && steps < 2_000_000 {
        steps += 1;
        // Send a burst.
        for _ in 0..sim.rng.random_range(0..40) {
            if sent >= TOTAL {
                break;
            }
            let from = sim.rng.random_range(0..2usize);
            let (sp, dp, dst) = if from == 0 {
                (
                    ports_a[sim.rng.random_range(0..6)],
                    ports_b[sim.rng.random_range(0..6)],
                    B,
                )
            } else {
                (
                    ports_b[sim.rng.random_range(0..6)],
                    ports_a[sim.rng.random_range(0..6)],
                    A,
                )
            };
            let c = counters.entry((from, sp, dp)).or_insert(0);
            let pad = sim.rng.random_range(0..600);
            let now = sim.now;
            match sim.nodes[from].send(
                now,
                sp,
                SocketAddrV4::new(dst, dp),
                payload(sp, dp, *c, pad),
            ) {
                Ok(()) => {
                    *c += 1;
                    sent += 1;
                }
                Err(e) if e.is_would_block() => would_block += 1,
                Err(e) => panic!("send: {e}"),
            }
        }
        sim.step();
        for n in 0..2 {
            checker.check(&mut sim.inbox[n]);
        }
        // Reset a random link every ~TOTAL/RESETS messages.
        if resets < RESETS && sent >= (resets + 1) * (TOTAL / (RESETS + 1)) && !sim.links.is_empty()
        {
            let li = sim.rng.random_range(0..sim.links.len());
            sim.reset_link(li);
            resets += 1;
        }
    }
    let info = sim.nodes[0].info();
    let retrans: u64 = info
        .conns
        .iter()
        .flat_map(|c| &c.paths)
        .map(|p| p.retransmitted)
        .sum();
    let info_b = sim.nodes[1].info();
    let dups: u64 = info_b
        .conns
        .iter()
        .flat_map(|c| &c.paths)
        .map(|p| p.dup_dropped)
        .sum::<u64>()
        + info
            .conns
            .iter()
            .flat_map(|c| &c.paths)
            .map(|p| p.dup_dropped)
            .sum::<u64>();
    eprintln!(
        "steps {steps} sent {sent} delivered {} lost {} dup {} resets {resets} \
         retransmitted(A) {retrans} dup_dropped {dups} lost_bytes {} would_block {would_block} npaths {:?}",
        checker.ok, checker.lost, checker.dup, sim.lost_bytes, info.conns[0].npaths
    );
    assert_eq!(resets, RESETS);
    assert_eq!(sent, TOTAL);
    assert_eq!(checker.lost, 0);
    assert_eq!(checker.dup, 0);
    assert_eq!(checker.ok, TOTAL);
    assert_eq!(info.conns[0].npaths, Some(8));
    // The faults really exercised both recovery mechanisms.
    assert!(retrans > 0 && dups > 0 && sim.lost_bytes > 0);
}

fn run_until(sim: &mut Sim, max_steps: u32, mut f: impl FnMut(&mut Sim) -> bool) -> bool {
    for _ in 0..max_steps {
        if f(sim) {
            return true;
        }
        sim.step();
    }
    f(sim)
}

fn all_paths_up(e: &Engine, peer: Ipv4Addr, n: usize) -> bool {
    e.info()
        .conns
        .iter()
        .any(|c| c.peer == peer && c.paths.iter().filter(|p| p.state == PathState::Up).count() == n)
}

/// Acceptance: MPRDS probe agrees on path counts with peers supporting 1 and 8 paths.
#[test]
fn mprds_probe_agrees_on_paths() {
    for (pa, pb, want) in [(8, 8, 8), (8, 1, 1), (1, 8, 1), (8, 4, 4)] {
        let mut sim = Sim::new(3, vec![cfg(A, 11, pa), cfg(B, 12, pb)]);
        sim.nodes[0].bind(1000).unwrap();
        sim.nodes[1].bind(2000).unwrap();
        let now = sim.now;
        // The first send may wait for the probe (HandshakePending) like Linux; the engine
        // connects path 0 either way.
        let _ = sim.nodes[0].ping(now, 1000, B);
        let done = run_until(&mut sim, 200, |s| {
            let a = s.nodes[0].info();
            let b = s.nodes[1].info();
            a.conns.first().and_then(|c| c.npaths) == Some(want)
                && b.conns.first().and_then(|c| c.npaths) == Some(want)
                && all_paths_up(&s.nodes[0], B, want as usize)
                && all_paths_up(&s.nodes[1], A, want as usize)
        });
        assert!(
            done,
            "paths {pa}/{pb}: {:?} / {:?}",
            sim.nodes[0].info(),
            sim.nodes[1].info()
        );
        // No path beyond the agreed count was opened.
        let a = sim.nodes[0].info();
        assert!(
            a.conns[0]
                .paths
                .iter()
                .all(|p| p.index < want as u8 || p.connects == 0)
        );
        // Generation numbers were exchanged.
        assert_eq!(a.conns[0].peer_gen, sim.nodes[1].gen_num());
        assert_eq!(
            sim.nodes[1].info().conns[0].peer_gen,
            sim.nodes[0].gen_num()
        );
    }
}

/// The larger address never keeps its own outbound connection; data it sends first still flows
/// (it nudges, the smaller address connects).
#[test]
fn larger_address_sends_first() {
    let mut sim = Sim::new(5, vec![cfg(A, 21, 8), cfg(B, 22, 8)]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    let dest = SocketAddrV4::new(A, 1000);
    let mut sent = false;
    let ok = run_until(&mut sim, 2000, |s| {
        if !sent {
            let now = s.now;
            match s.nodes[1].send(now, 2000, dest, Bytes::from_static(b"hi")) {
                Ok(()) => sent = true,
                Err(SendError::HandshakePending) => {}
                Err(e) => panic!("{e}"),
            }
        }
        s.inbox[0]
            .iter()
            .any(|(p, d, src)| *p == 1000 && &d[..] == b"hi" && src.port() == 2000)
    });
    assert!(ok);
    // Every link was opened by A (the smaller address): B's connection ends are all accepts.
    let b = sim.nodes[1].info();
    assert!(!b.conns[0].initiator);
    assert!(sim.nodes[0].info().conns[0].initiator);
}

/// Acceptance: a peer restart (new generation number) resets sequence numbers, the receive
/// expectation and the retransmit queue.
#[test]
fn peer_restart_resets_state() {
    let mut sim = Sim::new(9, vec![cfg(A, 31, 1), cfg(B, 32, 1)]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    let dest = SocketAddrV4::new(B, 2000);
    for i in 0..50 {
        let now = sim.now;
        sim.nodes[0]
            .send(now, 1000, dest, payload(1000, 2000, i, 10))
            .unwrap();
    }
    assert!(run_until(&mut sim, 500, |s| {
        s.inbox[1].len() == 50 && s.nodes[0].idle_to(B) && s.nodes[0].info().conns[0].peer_gen != 0
    }));
    let before = sim.nodes[0].info();
    let old_gen = before.conns[0].peer_gen;
    assert!(before.conns[0].paths[0].next_tx_seq > 50);
    // Queue more data, then "restart" B before any of it is delivered: its links die and a new
    // instance (new generation) takes its place.
    for i in 50..60 {
        let now = sim.now;
        sim.nodes[0]
            .send(now, 1000, dest, payload(1000, 2000, i, 10))
            .unwrap();
    }
    // Transmit but do not deliver: drain engine output into the wire, then kill.
    for l in &mut sim.links {
        let (n, t) = l.ends[0];
        while let Some(b) = sim.nodes[n].poll_transmit(t) {
            l.dirs[0].wire.push_back(b);
        }
    }
    assert!(sim.nodes[0].info().conns[0].paths[0].unacked >= 10);
    while !sim.links.is_empty() {
        sim.reset_link(0);
    }
    sim.nodes[1] = Engine::new(cfg(B, 33, 1));
    sim.nodes[1].bind(2000).unwrap();
    sim.inbox[1].clear();
    let new_gen = sim.nodes[1].gen_num();
    assert_ne!(old_gen, new_gen);
    // A reconnects (it is the smaller address); the probe/pong reveals the new generation.
    assert!(run_until(&mut sim, 500, |s| {
        s.nodes[0].info().conns[0].peer_gen == new_gen && s.nodes[0].idle_to(B)
    }));
    let after = sim.nodes[0].info();
    assert_eq!(after.conns[0].gen_resets, 1);
    let p0 = &after.conns[0].paths[0];
    // tx sequence restarted from 1: only the messages sent since (at most the pong) used it.
    assert!(p0.next_tx_seq < 5, "next_tx_seq {}", p0.next_tx_seq);
    assert_eq!(p0.unacked, 0);
    assert_eq!(p0.send_queue, 0);
    // New traffic flows and B sees sequence numbers from the restarted space.
    let now = sim.now;
    sim.nodes[0]
        .send(now, 1000, dest, payload(1000, 2000, 0, 1))
        .unwrap();
    assert!(run_until(&mut sim, 200, |s| s.inbox[1]
        .iter()
        .any(|(_, p, _)| p.len() == 13)));
    let b = sim.nodes[1].info();
    assert!(b.conns[0].paths[0].next_rx_seq < 8);
}

/// Acceptance: congestion maps stop and restart senders; messages for a congested port are still
/// accepted.
#[test]
fn congestion_stops_and_restarts_senders() {
    let mut sim = Sim::new(13, vec![cfg(A, 41, 8), cfg(B, 42, 8)]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    sim.nodes[1].bind(2001).unwrap();
    sim.nodes[1].set_rcvbuf(2000, 8 * 1024);
    sim.reading[1] = false;
    let dest = SocketAddrV4::new(B, 2000);
    let mut sent = 0u64;
    let mut blocked = false;
    let ok = run_until(&mut sim, 5000, |s| {
        let now = s.now;
        match s.nodes[0].send(now, 1000, dest, payload(1000, 2000, sent, 1000)) {
            Ok(()) => sent += 1,
            Err(SendError::Congested) => blocked = true,
            Err(SendError::HandshakePending) => {}
            Err(e) => panic!("{e}"),
        }
        blocked
    });
    assert!(ok, "sender never stopped");
    // B's port is congested, holds more than its buffer (in-flight messages were accepted), and
    // A sees the bit from B's map.
    assert!(run_until(&mut sim, 200, |s| s.nodes[0].idle_to(B)));
    let b = sim.nodes[1].info();
    let p = b.ports.iter().find(|p| p.port == 2000).unwrap();
    assert!(p.congested && p.queued > p.rcvbuf, "{p:?}");
    assert_eq!(sim.nodes[0].info().conns[0].peer_congested, vec![2000]);
    assert!(matches!(
        sim.nodes[0].send(sim.now, 1000, dest, Bytes::new()),
        Err(SendError::Congested)
    ));
    // Other ports of B are not affected.
    assert!(
        sim.nodes[0]
            .would_block(1000, SocketAddrV4::new(B, 2001))
            .is_none()
    );
    // B's application drains the port: uncongested below half, a new map clears A's bit.
    let ready_before = sim.send_ready[0];
    sim.reading[1] = true;
    let mut got = 0u64;
    while let Some(d) = sim.nodes[1].recv(2000) {
        sim.inbox[1].push((2000, d.payload, d.src));
        got += 1;
    }
    assert_eq!(got, sent, "every accepted message is delivered");
    assert!(run_until(&mut sim, 200, |s| s.nodes[0].info().conns[0]
        .peer_congested
        .is_empty()));
    assert!(sim.send_ready[0] > ready_before);
    let now = sim.now;
    sim.nodes[0]
        .send(now, 1000, dest, payload(1000, 2000, sent, 1))
        .unwrap();
    let mut ch = Checker::default();
    assert!(run_until(&mut sim, 200, |s| {
        ch.check(&mut s.inbox[1]);
        ch.ok == sent + 1
    }));
    assert_eq!((ch.lost, ch.dup), (0, 0));
}

/// The send buffer (Linux rds_send_queue_rm): a port queues a new message only while less than
/// its send buffer is queued and unconfirmed, so the last one may go over by one message; a full
/// port gets SendBufferFull, and confirmations (TCP acks here) free it with SendReady. A
/// generation reset frees what the old peer never confirmed.
#[test]
fn send_buffer_bounds_what_a_port_queues() {
    const TOTAL: u64 = 2_000;
    const SNDBUF: usize = 16 * 1024;
    const PAD: usize = 4000;
    let mut sim = Sim::new(19, vec![cfg(A, 71, 1), cfg(B, 72, 1)]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[0].bind(1001).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    sim.nodes[0].set_sndbuf(1000, SNDBUF);
    let dest = SocketAddrV4::new(B, 2000);
    let (mut sent, mut full, mut max_queued) = (0u64, 0u64, 0usize);
    let mut ch = Checker::default();
    let ready_before = sim.send_ready[0];
    let ok = run_until(&mut sim, 200_000, |s| {
        let now = s.now;
        while sent < TOTAL {
            match s.nodes[0].send(now, 1000, dest, payload(1000, 2000, sent, PAD)) {
                Ok(()) => sent += 1,
                Err(SendError::SendBufferFull) => {
                    assert!(s.nodes[0].send_buffer_full());
                    full += 1;
                    break;
                }
                Err(SendError::HandshakePending) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let info = s.nodes[0].info();
        let p = info.ports.iter().find(|p| p.port == 1000).unwrap();
        max_queued = max_queued.max(p.snd_bytes);
        ch.check(&mut s.inbox[1]);
        ch.ok == TOTAL
    });
    assert!(ok, "delivered {} of {TOTAL}", ch.ok);
    assert_eq!((ch.lost, ch.dup), (0, 0));
    assert!(full > 0, "the sender never found its buffer full");
    assert!(
        sim.send_ready[0] > ready_before,
        "no SendReady after confirmations"
    );
    // Below the buffer before the last message, which may go over by one message.
    assert!(
        (SNDBUF..SNDBUF + PAD + 12).contains(&max_queued),
        "queued at most {max_queued} bytes with a {SNDBUF}-byte send buffer"
    );
    // Everything confirmed: the port's count is back to zero, and the other port never counted.
    assert!(run_until(&mut sim, 1000, |s| s.nodes[0].idle_to(B)));
    assert!(!sim.nodes[0].send_buffer_full());
    let info = sim.nodes[0].info();
    for p in info
        .ports
        .iter()
        .filter(|p| p.port == 1000 || p.port == 1001)
    {
        assert_eq!(p.snd_bytes, 0, "{p:?}");
    }
    assert_eq!(
        info.ports.iter().find(|p| p.port == 1001).unwrap().sndbuf,
        rds::engine::DEFAULT_SNDBUF
    );
}

/// Ping/pong on port 0: the pong comes from port 0 with no payload; sport-0 pings are ignored.
#[test]
fn ping_pong() {
    let mut sim = Sim::new(17, vec![cfg(A, 51, 1), cfg(B, 52, 1)]);
    sim.nodes[0].bind(1000).unwrap();
    let now = sim.now;
    sim.nodes[0].ping(now, 1000, B).unwrap();
    assert!(run_until(&mut sim, 200, |s| {
        s.inbox[0]
            .iter()
            .any(|(p, d, src)| *p == 1000 && d.is_empty() && *src == SocketAddrV4::new(B, 0))
    }));
}

/// The `Acked` transport mode (for RDS over RDMA): messages are released by `h_ack` only, the
/// receiver answers ACK_REQUIRED with a piggybacked ack or an ack-only message, and delivery is
/// still exactly-once across resets.
#[test]
fn acked_transport_exactly_once_and_ack_only() {
    const TOTAL: u64 = 10_000;
    let mut ca = cfg(A, 61, 1);
    ca.transport = TransportKind::Acked;
    let mut cb = cfg(B, 62, 1);
    cb.transport = TransportKind::Acked;
    let mut sim = Sim::new(19, vec![ca, cb]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    let dest = SocketAddrV4::new(B, 2000);
    let mut sent = 0u64;
    let mut resets = 0u64;
    let mut ch = Checker::default();
    let mut steps = 0;
    while (sent < TOTAL || ch.ok < TOTAL || !sim.nodes[0].idle_to(B)) && steps < 200_000 {
        steps += 1;
        for _ in 0..sim.rng.random_range(0..20) {
            if sent < TOTAL {
                let now = sim.now;
                let pad = sim.rng.random_range(0..100);
                if sim.nodes[0]
                    .send(now, 1000, dest, payload(1000, 2000, sent, pad))
                    .is_ok()
                {
                    sent += 1;
                }
            }
        }
        sim.step();
        ch.check(&mut sim.inbox[1]);
        if resets < 20 && sent >= (resets + 1) * TOTAL / 21 && !sim.links.is_empty() {
            sim.reset_link(0);
            resets += 1;
        }
    }
    let a = sim.nodes[0].info();
    let b = sim.nodes[1].info();
    eprintln!(
        "acked: steps {steps} ok {} lost {} dup {} {:?} / {:?}",
        ch.ok, ch.lost, ch.dup, a.conns[0].paths[0], b.conns[0].paths[0]
    );
    assert_eq!((ch.ok, ch.lost, ch.dup), (TOTAL, 0, 0));
    assert_eq!(resets, 20);
    // Everything was released through h_ack; B only sends ack-only messages (it has no data),
    // and far fewer than one per message.
    assert!(sim.nodes[0].idle_to(B));
    let acks = b.conns[0].paths[0].ack_only_sent;
    assert!(acks > 0 && acks < TOTAL / 2, "ack-only messages: {acks}");
}

/// RDS over RDMA (facts/rds-linux.md: "ACK_REQUIRED every 8 packets"): the sender sets it on every
/// 8th data message and on the last one it has queued, so the receiver acks in batches.
#[test]
fn acked_transport_asks_for_an_ack_every_8_messages() {
    let mut ca = cfg(A, 81, 1);
    ca.transport = TransportKind::Acked;
    let mut cb = cfg(B, 82, 1);
    cb.transport = TransportKind::Acked;
    let mut sim = Sim::new(29, vec![ca, cb]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    // Bring the path up and let everything settle.
    let now = sim.now;
    sim.nodes[0].ping(now, 1000, B).unwrap();
    assert!(run_until(&mut sim, 500, |s| {
        s.inbox[0]
            .iter()
            .any(|(p, d, _)| *p == 1000 && d.is_empty())
            && s.nodes[0].idle_to(B)
    }));
    // Queue 61 messages at once, then read what node A writes on its transport.
    let dest = SocketAddrV4::new(B, 2000);
    for n in 0..61 {
        let now = sim.now;
        sim.nodes[0]
            .send(now, 1000, dest, payload(1000, 2000, n, 20))
            .unwrap();
    }
    let (_, tok) = sim.links[0]
        .ends
        .into_iter()
        .find(|(n, _)| *n == 0)
        .expect("node A has a transport");
    let mut wire = BytesMut::new();
    while let Some(b) = sim.nodes[0].poll_transmit(tok) {
        wire.extend_from_slice(&b);
    }
    let mut flagged = Vec::new();
    let mut data = 0u64;
    let mut off = 0;
    while off < wire.len() {
        let h = rds::wire::Header::decode(&wire[off..]).expect("a header");
        off += rds::wire::HEADER_LEN + h.len as usize;
        if h.dport == 2000 {
            data += 1;
            if h.flags & rds::wire::flags::ACK_REQUIRED != 0 {
                flagged.push(data);
            }
        }
    }
    assert_eq!(data, 61);
    assert_eq!(flagged, vec![8, 16, 24, 32, 40, 48, 56, 61]);
}

/// The peer reconnects a path before the accepting side has read the end of the old
/// connection: bytes TCP already acknowledged to the sender (so it will never resend them) still
/// sit unread in the old socket. The acceptor must read the old connection to its end before
/// taking data from the new one: nothing lost, nothing duplicated, order kept.
#[test]
fn replaced_transport_is_drained_first() {
    let mut sim = Sim::new(23, vec![cfg(A, 71, 1), cfg(B, 72, 1)]);
    sim.nodes[0].bind(1000).unwrap();
    sim.nodes[1].bind(2000).unwrap();
    let dest = SocketAddrV4::new(B, 2000);
    let now = sim.now;
    sim.nodes[0]
        .send(now, 1000, dest, payload(1000, 2000, 0, 5))
        .unwrap();
    let mut ch = Checker::default();
    assert!(run_until(&mut sim, 200, |s| {
        ch.check(&mut s.inbox[1]);
        ch.ok == 1 && s.nodes[0].idle_to(B)
    }));
    // 100 messages written by A on the old connection, "acknowledged by TCP" but not yet read by
    // B's application-level reader.
    for i in 1..=100 {
        let now = sim.now;
        sim.nodes[0]
            .send(now, 1000, dest, payload(1000, 2000, i, 20))
            .unwrap();
    }
    let mut old = sim.links.remove(0);
    let (an, at) = old.ends[0];
    let (bn, bt) = old.ends[1];
    let mut total = old.dirs[0].delivered;
    while let Some(b) = sim.nodes[an].poll_transmit(at) {
        total += b.len() as u64;
        old.dirs[0].wire.push_back(b);
    }
    sim.nodes[an].on_transport_acked(at, total);
    assert!(sim.nodes[0].idle_to(B), "A released everything");
    // A sees its connection end and reconnects at once; B has not noticed yet.
    sim.nodes[an].transport_down(sim.now, at);
    for i in 101..=110 {
        let now = sim.now;
        sim.nodes[0]
            .send(now, 1000, dest, payload(1000, 2000, i, 20))
            .unwrap();
    }
    for _ in 0..20 {
        sim.step();
    }
    assert_eq!(sim.links.len(), 1, "new connection up");
    ch.check(&mut sim.inbox[1]);
    assert_eq!(ch.ok, 1, "new data held while the old connection drains");
    // Now B reads the rest of the old connection, then its end.
    for b in old.dirs[0].wire.drain(..) {
        sim.nodes[bn].on_recv(sim.now, bt, &b).unwrap();
    }
    sim.nodes[bn].transport_down(sim.now, bt);
    assert!(run_until(&mut sim, 200, |s| {
        ch.check(&mut s.inbox[1]);
        ch.ok == 111
    }));
    assert_eq!((ch.lost, ch.dup), (0, 0));
}
