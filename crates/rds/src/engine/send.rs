//! The send path: queueing datagrams on a path, framing them for the transport, and releasing
//! them when the peer confirms delivery.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

use bytes::Bytes;

use super::{Action, Engine, InFlight, Kind, OutMsg, Path, PathId, Token, TransportKind, release};
use crate::error::SendError;
use crate::wire::{self, CongMap, Extension, Header, MAX_MSG_LEN, MAX_PATHS, flags};

/// Linux's `jhash_1word()` (Bob Jenkins' lookup3 final mix), used by `RDS_MPATH_HASH` on the
/// bound port in host order with a per-socket random seed (net/rds/rds.h, bind.c).
pub fn jhash_1word(a: u32, initval: u32) -> u32 {
    let iv = initval.wrapping_add(0xdead_beef).wrapping_add(1 << 2);
    let mut a = a.wrapping_add(iv);
    let mut b = iv;
    let mut c = iv;
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

impl Engine {
    /// Queues a datagram from bound port `sport` to `dest`. `dest.port() == 0` sends a ping.
    ///
    /// Would-block errors ([`SendError::Congested`], [`SendError::HandshakePending`]) mean
    /// "retry after [`Action::SendReady`]".
    pub fn send(
        &mut self,
        now: Instant,
        sport: u16,
        dest: SocketAddrV4,
        payload: Bytes,
    ) -> Result<(), SendError> {
        self.send_with_ext(now, sport, dest, payload, Vec::new())
    }

    /// [`Engine::send`] with header extensions (RDMA / RDMA_DEST for RDS over RDMA operations).
    pub fn send_with_ext(
        &mut self,
        now: Instant,
        sport: u16,
        dest: SocketAddrV4,
        payload: Bytes,
        ext: Vec<Extension>,
    ) -> Result<(), SendError> {
        if payload.len() > MAX_MSG_LEN {
            return Err(SendError::TooLong(payload.len()));
        }
        let seed = self
            .ports
            .get(&sport)
            .ok_or(SendError::NotBound(sport))?
            .hash_seed;
        let peer = *dest.ip();
        if !self.ensure_conn(now, peer) {
            return Err(SendError::TooManyPeers(self.cfg.max_peers));
        }
        let max_paths = self.cfg.max_paths;
        let conn = self.conns.get_mut(&peer).ok_or(SendError::Shutdown)?;
        // Spec 3.1 "Congestion control": do not send to a port the peer marked congested.
        if dest.port() != 0 && conn.peer_cong.get(dest.port()) {
            return Err(SendError::Congested);
        }
        // MPRDS: path = RDS_MPATH_HASH(bound port) & (npaths - 1). Until the probe is answered,
        // Linux waits when the 8-path hash is nonzero (send.c rds_send_mprds_hash).
        let h = jhash_1word(u32::from(sport), seed);
        let idx = match conn.npaths {
            Some(n) => (h & (u32::from(n) - 1)) as usize,
            None if max_paths > 1 && h & (u32::from(MAX_PATHS) - 1) != 0 => {
                return Err(SendError::HandshakePending);
            }
            None => 0,
        };
        // Linux send.c rds_send_queue_rm: a message is queued only while the socket has less
        // than its send buffer queued and unconfirmed (so the last one may go over); otherwise
        // EAGAIN, or a blocking send waits until confirmations free space.
        if let Some(p) = self.ports.get_mut(&sport) {
            if p.snd_bytes >= p.sndbuf {
                return Err(SendError::SendBufferFull);
            }
            p.snd_bytes += payload.len();
        }
        let mut header = Header {
            sport,
            dport: dest.port(),
            len: payload.len() as u32,
            ..Header::default()
        };
        header.ext.items = ext;
        self.enqueue(
            now,
            peer,
            idx,
            OutMsg {
                kind: Kind::Seq,
                header,
                payload,
                seq: None,
            },
        );
        Ok(())
    }

    /// Sends a ping (zero-length to port 0) from `sport`; the pong arrives on `sport` from port 0.
    pub fn ping(&mut self, now: Instant, sport: u16, peer: Ipv4Addr) -> Result<(), SendError> {
        self.send(now, sport, SocketAddrV4::new(peer, 0), Bytes::new())
    }

    /// Whether sending from `sport` to `dest` would currently block (congestion or handshake).
    pub fn would_block(&self, sport: u16, dest: SocketAddrV4) -> Option<SendError> {
        if self
            .ports
            .get(&sport)
            .is_some_and(|p| p.snd_bytes >= p.sndbuf)
        {
            return Some(SendError::SendBufferFull);
        }
        let conn = self.conns.get(dest.ip())?;
        if dest.port() != 0 && conn.peer_cong.get(dest.port()) {
            return Some(SendError::Congested);
        }
        None.or_else(|| {
            let seed = self.ports.get(&sport)?.hash_seed;
            (conn.npaths.is_none()
                && self.cfg.max_paths > 1
                && jhash_1word(u32::from(sport), seed) & 7 != 0)
                .then_some(SendError::HandshakePending)
        })
    }

    pub(super) fn enqueue(&mut self, now: Instant, peer: Ipv4Addr, idx: usize, msg: OutMsg) {
        let Some(conn) = self.conns.get_mut(&peer) else {
            return;
        };
        let path = &mut conn.paths[idx];
        path.sendq.push_back(msg);
        match path.token() {
            Some(t) => self.actions.push_back(Action::Transmit(t)),
            None => self.want_connect(
                now,
                PathId {
                    peer,
                    index: idx as u8,
                },
            ),
        }
    }

    /// TCP: the peer acknowledged `acked` bytes of this transport's stream (from its start).
    /// Messages whose last byte is covered are released.
    pub fn on_transport_acked(&mut self, token: Token, acked: u64) {
        if self.cfg.transport != TransportKind::Tcp {
            // Acked transports release on h_ack only.
            return;
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return;
        };
        let Some(path) = self
            .conns
            .get_mut(&id.peer)
            .and_then(|c| c.paths.get_mut(usize::from(id.index)))
        else {
            return;
        };
        let Some(t) = path.transport.as_mut().filter(|t| t.token == token) else {
            return;
        };
        t.acked = t.acked.max(acked.min(t.written));
        let a = t.acked;
        let mut freed = false;
        while path.inflight.front().is_some_and(|f| f.end <= a) {
            if let Some(f) = path.inflight.pop_front() {
                freed |= release(&mut self.ports, &f.msg);
            }
        }
        if freed {
            self.actions.push_back(Action::SendReady);
        }
    }

    /// Next bytes to write on `token` (`None`: nothing to send). The driver must write them in
    /// order; the engine counts them as written.
    pub fn poll_transmit(&mut self, token: Token) -> Option<Bytes> {
        let id = *self.bound.get(&token)?;
        let kind = self.cfg.transport;
        let ack_every = self.cfg.ack_every;
        let local_cong = &self.local_cong;
        let conn = self.conns.get_mut(&id.peer)?;
        let path = conn.paths.get_mut(usize::from(id.index))?;
        let t = path.transport.as_mut().filter(|t| t.token == token)?;
        if t.cur.is_none() {
            let mut m = match path.sendq.pop_front() {
                Some(m) => m,
                // Spec 3.1: an ack-only message only when no other message can carry the ack;
                // built when needed, so at most one is ever queued.
                None if kind == TransportKind::Acked && path.ack_pending => {
                    path.ack_only_sent += 1;
                    OutMsg {
                        kind: Kind::AckOnly,
                        header: wire::ack_only(path.last_rx_seq),
                        payload: Bytes::new(),
                        seq: None,
                    }
                }
                None => return None,
            };
            match m.kind {
                Kind::CongMap => {
                    m.header = CongMap::header();
                    // Tell an accepting oxrdma peer which path this transport is.
                    m.header.ext.items.push(Extension::SportIdx(id.index));
                    m.payload = local_cong.encode();
                }
                Kind::AckOnly => {}
                Kind::Seq => {
                    let seq = *m.seq.get_or_insert_with(|| {
                        let s = path.next_tx_seq;
                        path.next_tx_seq += 1;
                        s
                    });
                    m.header.seq = seq;
                    m.header.len = m.payload.len() as u32;
                    if kind == TransportKind::Acked {
                        path.sent_since_ack_req += 1;
                        // Ask for an ack every `ack_every` messages and when the queue drains, so
                        // that everything sent is eventually confirmed.
                        if path.sent_since_ack_req >= ack_every || path.sendq.is_empty() {
                            m.header.flags |= flags::ACK_REQUIRED;
                        }
                        if m.header.flags & flags::ACK_REQUIRED != 0 {
                            path.sent_since_ack_req = 0;
                        }
                    }
                }
            }
            if kind == TransportKind::Acked {
                // Spec 3.1: piggyback the latest received sequence number.
                m.header.ack = path.last_rx_seq;
                path.ack_pending = false;
            }
            let h = match m.header.encode() {
                Ok(h) => Bytes::copy_from_slice(&h),
                Err(_) => return None,
            };
            t.written += h.len() as u64;
            if m.payload.is_empty() {
                let end = t.written;
                finish(path, m, end, kind);
            } else {
                t.cur = Some((m, true));
            }
            return Some(h);
        }
        let (m, _) = t.cur.take()?;
        let p = m.payload.clone();
        t.written += p.len() as u64;
        let end = t.written;
        finish(path, m, end, kind);
        Some(p)
    }
}

fn finish(path: &mut Path, m: OutMsg, end: u64, kind: TransportKind) {
    match m.kind {
        Kind::Seq => path.inflight.push_back(InFlight { msg: m, end }),
        Kind::CongMap | Kind::AckOnly => {
            // Not retransmitted: a fresh map is sent on every new path; acks are regenerated.
            // They still occupy stream positions, which needs no tracking.
            let _ = kind;
        }
    }
}
