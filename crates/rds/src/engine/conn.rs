//! Connection state: which side dials, attaching and detaching transports to paths, draining a
//! replaced transport, and the MPRDS / generation-number handshake.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::Rng;

use super::recv::RxAssembler;
use super::{
    AcceptOutcome, Action, Conn, DRAIN_LIMIT, Engine, Kind, OutMsg, Path, PathId, PathState, Token,
    Transport, Unbound, release,
};
use crate::wire::{self, CongMap, ExtList, flags};

impl Engine {
    pub(super) fn is_initiator(&self, peer: Ipv4Addr) -> bool {
        // facts "RDS over TCP": the numerically smaller address connects.
        self.cfg.local < peer
    }

    /// Makes sure there is an entry for `peer`, and asks for its path 0. Returns false when
    /// there is none and [`EngineConfig::max_peers`](super::EngineConfig::max_peers) leaves no
    /// room for one.
    pub(super) fn ensure_conn(&mut self, now: Instant, peer: Ipv4Addr) -> bool {
        if self.conns.contains_key(&peer) {
            return true;
        }
        if !self.room_for_peer() {
            return false;
        }
        self.conns.insert(peer, Conn::new(peer));
        // Path 0 is needed at once; the larger side also dials so that the smaller notices
        // (its connect is dropped when it completes).
        self.want_connect(now, PathId { peer, index: 0 });
        true
    }

    /// Room for one more peer entry: below the bound, or by forgetting an entry that never
    /// carried a message ([`Conn::forgettable`]) and has no accepted transport waiting for its
    /// first header. Counts what it does. At most `max_peers` entries are looked at, and only
    /// when the table is full.
    fn room_for_peer(&mut self) -> bool {
        if self.conns.len() < self.cfg.max_peers {
            return true;
        }
        let waiting = |peer: &Ipv4Addr| self.pending.values().any(|u| u.peer == *peer);
        let victim = self
            .conns
            .iter()
            .find(|(peer, c)| c.forgettable() && !waiting(peer))
            .map(|(peer, _)| *peer);
        match victim {
            Some(peer) => {
                self.conns.remove(&peer);
                self.limits.peers_forgotten += 1;
                true
            }
            None => {
                self.limits.peers_refused += 1;
                false
            }
        }
    }

    /// Asks for a connect on `id` if it is down and none is scheduled.
    pub(super) fn want_connect(&mut self, now: Instant, id: PathId) {
        let initiator = self.is_initiator(id.peer);
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return;
        };
        // Only path 0 is dialled by the larger side (as a nudge).
        if !initiator && id.index != 0 {
            return;
        }
        let path = &mut conn.paths[usize::from(id.index)];
        if path.state != PathState::Down || path.reconnect_at.is_some() {
            return;
        }
        if path.backoff.is_zero() {
            // First try immediately.
            path.state = PathState::Connecting;
            self.actions.push_back(Action::Connect(id));
        } else {
            let at = now + self.rng.random_range(Duration::ZERO..path.backoff);
            path.reconnect_at = Some(at);
            self.arm(at);
        }
    }

    /// The driver's connect for `id` failed.
    pub fn connect_failed(&mut self, now: Instant, id: PathId) {
        self.backoff_step(id);
        if let Some(p) = self.path_mut(id)
            && p.state == PathState::Connecting
        {
            p.state = PathState::Down;
        }
        self.want_connect(now, id);
    }

    fn backoff_step(&mut self, id: PathId) {
        let max = self.cfg.backoff_max;
        if let Some(p) = self.path_mut(id) {
            // facts "Reconnect": random delay in [0, current), current doubling up to 1 s.
            p.backoff = if p.backoff.is_zero() {
                Duration::from_millis(2).min(max)
            } else {
                (p.backoff * 2).min(max)
            };
        }
    }

    pub(super) fn path_mut(&mut self, id: PathId) -> Option<&mut Path> {
        self.conns
            .get_mut(&id.peer)?
            .paths
            .get_mut(usize::from(id.index))
    }

    fn new_token(&mut self) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Our outbound connect for `id` completed. Returns the token to use, or `None` when the
    /// connection must be closed (we are the larger address: facts "RDS over TCP").
    pub fn connected(&mut self, now: Instant, id: PathId) -> Option<Token> {
        if !self.is_initiator(id.peer) {
            if let Some(p) = self.path_mut(id)
                && p.state == PathState::Connecting
            {
                p.state = PathState::Down;
            }
            // Keep nudging with back-off until the smaller side connects to us.
            self.backoff_step(id);
            let pending = self
                .conns
                .get(&id.peer)
                .and_then(|c| c.paths.get(usize::from(id.index)))
                .is_some_and(|p| p.state == PathState::Down && p.has_tx());
            if pending {
                self.want_connect(now, id);
            }
            return None;
        }
        let t = self.new_token();
        self.attach(now, id, t);
        Some(t)
    }

    /// A transport connection arrived from `peer`.
    pub fn accept(&mut self, now: Instant, peer: Ipv4Addr) -> AcceptOutcome {
        if self.is_initiator(peer) {
            // We are the smaller address: reset it and connect ourselves (when the bound on
            // peers leaves room for it).
            if self.ensure_conn(now, peer) {
                self.want_connect(now, PathId { peer, index: 0 });
            }
            return AcceptOutcome::Reject;
        }
        if self.pending.len() >= self.cfg.max_unbound {
            self.limits.unbound_refused += 1;
            return AcceptOutcome::Refuse;
        }
        if !self.conns.contains_key(&peer) {
            if !self.room_for_peer() {
                return AcceptOutcome::Refuse;
            }
            self.conns.insert(peer, Conn::new(peer));
        }
        let t = self.new_token();
        self.pending.insert(
            t,
            Unbound {
                peer,
                buf: BytesMut::new(),
                deadline: now + self.cfg.bind_timeout,
            },
        );
        self.arm(now + self.cfg.bind_timeout);
        AcceptOutcome::Accept(t)
    }

    pub(super) fn attach(&mut self, now: Instant, id: PathId, token: Token) {
        // The peer reconnected before we saw its old connection end. Bytes it sent on the old
        // one may still sit unread in our socket, and the peer counts them as delivered (TCP
        // acknowledged them), so the old transport is read to its end first ("draining") and
        // the new one's bytes are held until then. Its unconfirmed sends are resent on the new.
        let mut replacing = false;
        if let Some(old) = self.path_mut(id).and_then(|p| p.token()) {
            if let Some((d, _)) = self.path_mut(id).and_then(|p| p.draining.take()) {
                self.bound.remove(&d);
                self.actions.push_back(Action::Close(d));
            }
            let rx = self
                .path_mut(id)
                .map(|p| std::mem::take(&mut p.rx))
                .unwrap_or_default();
            self.detach(now, id, old, false);
            self.bound.insert(old, id);
            if let Some(p) = self.path_mut(id) {
                p.rx = rx;
                p.draining = Some((old, now + DRAIN_LIMIT));
            }
            self.arm(now + DRAIN_LIMIT);
            replacing = true;
        }
        let max_paths = self.cfg.max_paths;
        let gen_num = self.gen_num;
        let Some(path) = self.path_mut(id) else {
            return;
        };
        path.state = PathState::Up;
        path.reconnect_at = None;
        path.backoff = Duration::ZERO;
        path.connects += 1;
        if !replacing {
            path.rx = RxAssembler::default();
        }
        path.transport = Some(Transport {
            token,
            written: 0,
            acked: 0,
            cur: None,
        });
        // Path 0 sends a probe (spec "MPRDS": before the first data packet), which also
        // carries our generation number.
        // It takes a new sequence number, so it goes after the retransmissions (which carry
        // older numbers): ahead of them it would make the receiver drop them as duplicates.
        if id.index == 0 {
            let at = path
                .sendq
                .iter()
                .position(|m| m.seq.is_none())
                .unwrap_or(path.sendq.len());
            path.sendq.insert(
                at,
                OutMsg {
                    kind: Kind::Seq,
                    header: wire::probe(0, max_paths, gen_num),
                    payload: Bytes::new(),
                    seq: None,
                },
            );
        }
        // facts "Congestion map": the map is the first message on every new path.
        path.sendq.retain(|m| !matches!(m.kind, Kind::CongMap));
        path.sendq.push_front(OutMsg {
            kind: Kind::CongMap,
            header: CongMap::header(),
            payload: Bytes::new(),
            seq: None,
        });
        self.bound.insert(token, id);
        self.actions.push_back(Action::Transmit(token));
    }

    fn detach(&mut self, now: Instant, id: PathId, token: Token, reconnect: bool) {
        self.bound.remove(&token);
        let Some(path) = self.path_mut(id) else {
            return;
        };
        if path.token() != Some(token) {
            return;
        }
        let Some(t) = path.transport.take() else {
            return;
        };
        path.state = PathState::Down;
        path.resets += 1;
        path.rx = RxAssembler::default();
        // Spec "Connection re-establishment" / facts: unconfirmed messages go out again ahead of
        // new ones, with their old sequence numbers and ACK_REQUIRED|RETRANSMITTED.
        let mut again: Vec<OutMsg> = path.inflight.drain(..).map(|f| f.msg).collect();
        if let Some((m, _)) = t.cur {
            again.push(m);
        }
        for m in again.into_iter().rev() {
            if let Kind::Seq = m.kind {
                let mut m = m;
                m.header.flags |= flags::ACK_REQUIRED | flags::RETRANSMITTED;
                path.retransmitted += 1;
                path.sendq.push_front(m);
            }
        }
        path.ack_pending = false;
        if reconnect {
            self.want_connect(now, id);
        }
    }

    /// The transport under `token` closed or failed. Unconfirmed messages will be resent.
    pub fn transport_down(&mut self, now: Instant, token: Token) {
        if self.pending.remove(&token).is_some() {
            return;
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return;
        };
        if self
            .path_mut(id)
            .is_some_and(|p| p.draining.is_some_and(|d| d.0 == token))
        {
            self.finish_drain(now, id);
            return;
        }
        let initiator = self.is_initiator(id.peer);
        self.detach(now, id, token, initiator);
        if !initiator {
            // The larger side nudges path 0 if it still has something to send.
            let has = self
                .conns
                .get(&id.peer)
                .is_some_and(|c| c.paths.iter().any(|p| p.has_tx()));
            if has && id.index == 0 {
                self.want_connect(now, id);
            }
        }
    }

    /// The replaced transport of `id` has ended: switch reception to the new one.
    pub(super) fn finish_drain(&mut self, now: Instant, id: PathId) {
        let Some(p) = self.path_mut(id) else {
            return;
        };
        let Some((old, _)) = p.draining.take() else {
            return;
        };
        p.rx = RxAssembler::default();
        let held = p.held.split();
        let cur = p.token();
        self.bound.remove(&old);
        if let Some(cur) = cur
            && !held.is_empty()
            && self.on_recv(now, cur, &held).is_err()
        {
            self.actions.push_back(Action::Close(cur));
            self.transport_down(now, cur);
        }
    }

    /// Processes NPATHS / GEN_NUM from a probe or its pong (Linux recv.c rds_recv_hs_exthdrs).
    pub(super) fn handshake(&mut self, now: Instant, id: PathId, ext: &ExtList) {
        let max_paths = self.cfg.max_paths;
        let initiator = self.is_initiator(id.peer);
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return;
        };
        // npaths = min(ours, peer's), or 1 if the peer sent none.
        let n = ext.npaths().map_or(1, |n| n.clamp(1, max_paths));
        // Round down to a power of two so that `hash & (n - 1)` stays in range.
        let n = 1u16 << (15 - n.leading_zeros());
        let first = conn.npaths.is_none();
        conn.npaths = Some(n);
        if let Some(g) = ext.gen_num()
            && g != 0
        {
            if conn.peer_gen != 0 && conn.peer_gen != g {
                // Spec "RDS Generation Number": the peer restarted; reset every path.
                conn.gen_resets += 1;
                for p in &mut conn.paths {
                    p.next_tx_seq = 1;
                    p.next_rx_seq = 0;
                    // What the old peer never confirmed is dropped, as Linux does
                    // (rds_conn_path_reset drops the retransmit queue).
                    for f in p.inflight.drain(..) {
                        release(&mut self.ports, &f.msg);
                    }
                    let ports = &mut self.ports;
                    p.sendq.retain(|m| {
                        let keep = m.seq.is_none();
                        if !keep {
                            release(ports, m);
                        }
                        keep
                    });
                }
                self.actions.push_back(Action::SendReady);
                // The probe/pong being processed was accepted already.
                conn.paths[usize::from(id.index)].next_rx_seq = 0;
            }
            conn.peer_gen = g;
        }
        if first || initiator {
            self.actions.push_back(Action::SendReady);
        }
        if initiator {
            // The smaller address connects paths 1..n-1 (Linux rds_start_mprds).
            for i in 1..n {
                self.want_connect(
                    now,
                    PathId {
                        peer: id.peer,
                        index: i as u8,
                    },
                );
            }
        }
    }
}
