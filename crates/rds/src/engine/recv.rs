//! The receive path: reassembling messages from the byte stream, binding accepted transports to
//! paths, acks, pings and probes, and delivery to bound ports.

use std::net::SocketAddrV4;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::{
    Action, Engine, Kind, OutMsg, PathId, PathState, Token, TransportKind, Unbound, release,
};
use crate::error::WireError;
use crate::wire::{
    self, CongMap, ExtList, Extension, HEADER_LEN, Header, HeaderView, MAX_PATHS, PROBE_PORT, flags,
};

#[derive(Debug, Default)]
pub(super) struct RxAssembler {
    hdr: BytesMut,
    header: Option<Header>,
    payload: BytesMut,
}

impl RxAssembler {
    /// Feeds bytes; calls `f` for each complete message. Returns a protocol error on a bad header.
    fn feed(&mut self, mut data: &[u8], mut f: impl FnMut(Header, Bytes)) -> Result<(), WireError> {
        while !data.is_empty() {
            match &self.header {
                None => {
                    let take = (HEADER_LEN - self.hdr.len()).min(data.len());
                    self.hdr.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.hdr.len() == HEADER_LEN {
                        let h = Header::decode(&self.hdr)?;
                        self.hdr.clear();
                        if h.len == 0 {
                            f(h, Bytes::new());
                        } else {
                            self.payload.reserve((h.len as usize).min(64 * 1024));
                            self.header = Some(h);
                        }
                    }
                }
                Some(h) => {
                    let need = h.len as usize - self.payload.len();
                    let take = need.min(data.len());
                    self.payload.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.payload.len() == h.len as usize {
                        let h = self.header.take().unwrap_or_default();
                        f(h, self.payload.split().freeze());
                    }
                }
            }
        }
        Ok(())
    }

    /// [`RxAssembler::feed`] for bytes in a buffer: a whole message arriving on its own (as
    /// RDS over RDMA's reassembler hands them over) keeps its payload without a copy.
    fn feed_bytes(
        &mut self,
        data: Bytes,
        mut f: impl FnMut(Header, Bytes),
    ) -> Result<(), WireError> {
        if self.header.is_none() && self.hdr.is_empty() && data.len() >= HEADER_LEN {
            let h = Header::decode(&data[..HEADER_LEN])?;
            if data.len() == HEADER_LEN + h.len as usize {
                f(h, data.slice(HEADER_LEN..));
                return Ok(());
            }
        }
        self.feed(&data, f)
    }
}

/// Received bytes, borrowed (a socket read) or owned (a reassembled message).
enum Input<'a> {
    Slice(&'a [u8]),
    Owned(Bytes),
}

impl Input<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Input::Slice(s) => s,
            Input::Owned(b) => b,
        }
    }
}

impl Engine {
    /// Bytes arrived on `token`. On `Err` the driver must close the transport (and call
    /// [`Engine::transport_down`]).
    pub fn on_recv(&mut self, now: Instant, token: Token, data: &[u8]) -> Result<(), WireError> {
        self.on_input(now, token, Input::Slice(data))
    }

    /// [`Engine::on_recv`] for bytes in a buffer (RDS over RDMA hands over whole messages):
    /// a message that arrives whole is delivered without copying its payload.
    pub fn on_recv_bytes(
        &mut self,
        now: Instant,
        token: Token,
        data: Bytes,
    ) -> Result<(), WireError> {
        self.on_input(now, token, Input::Owned(data))
    }

    fn on_input(&mut self, now: Instant, token: Token, data: Input<'_>) -> Result<(), WireError> {
        if let Some(Unbound { peer, buf, .. }) = self.pending.get_mut(&token) {
            buf.extend_from_slice(data.as_slice());
            // Wait for a whole header before binding the transport to a path.
            let Ok(view) = HeaderView::new_checked(&buf[..]) else {
                return Ok(());
            };
            let peer = *peer;
            let h = Header::from_view(&view)?;
            // Bind the accepted transport to a path: the SPORT_IDX extension when present,
            // otherwise the first path without a transport (Linux 6.1 rds_tcp_accept_one_path).
            let idx = h
                .ext
                .items
                .iter()
                .find_map(|e| match e {
                    Extension::SportIdx(i) if u16::from(*i) < MAX_PATHS => Some(*i),
                    _ => None,
                })
                .or_else(|| {
                    self.conns
                        .get(&peer)?
                        .paths
                        .iter()
                        .position(|p| p.state != PathState::Up)
                        .map(|i| i as u8)
                });
            let buf = self
                .pending
                .remove(&token)
                .map(|u| u.buf)
                .unwrap_or_default();
            let Some(idx) = idx else {
                self.actions.push_back(Action::Close(token));
                return Ok(());
            };
            let id = PathId { peer, index: idx };
            self.attach(now, id, token);
            return self.on_recv(now, token, &buf);
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return Ok(());
        };
        let mut msgs = Vec::new();
        {
            let Some(path) = self.path_mut(id) else {
                return Ok(());
            };
            let draining = path.draining.map(|d| d.0);
            if draining != Some(token) {
                if path.token() != Some(token) {
                    return Ok(());
                }
                if draining.is_some() {
                    path.held.extend_from_slice(data.as_slice());
                    return Ok(());
                }
            }
            match data {
                Input::Slice(d) => path.rx.feed(d, |h, p| msgs.push((h, p)))?,
                Input::Owned(b) => path.rx.feed_bytes(b, |h, p| msgs.push((h, p)))?,
            }
        }
        for (h, p) in msgs {
            self.on_message(now, id, token, h, p)?;
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        now: Instant,
        id: PathId,
        token: Token,
        h: Header,
        payload: Bytes,
    ) -> Result<(), WireError> {
        let kind = self.cfg.transport;
        let local = self.cfg.local;
        let max_paths = self.cfg.max_paths;
        let gen_num = self.gen_num;
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return Ok(());
        };
        let pidx = usize::from(id.index);
        if kind == TransportKind::Acked && h.ack != 0 {
            // Release everything the peer confirmed.
            let path = &mut conn.paths[pidx];
            let mut freed = false;
            while path
                .inflight
                .front()
                .is_some_and(|f| f.msg.seq.is_none_or(|s| s <= h.ack))
            {
                if let Some(f) = path.inflight.pop_front() {
                    freed |= release(&mut self.ports, &f.msg);
                }
            }
            if freed {
                self.actions.push_back(Action::SendReady);
            }
        }
        if h.is_cong_map() {
            // facts "Congestion map": seq 0, ports 0, 8192 bytes.
            conn.peer_cong = CongMap::decode(&payload)?;
            self.actions.push_back(Action::SendReady);
            return Ok(());
        }
        if h.is_ack_only() && h.seq == 0 {
            return Ok(());
        }
        {
            let path = &mut conn.paths[pidx];
            // facts: drop only if seq < next expected AND RETRANSMITTED is set.
            if h.seq < path.next_rx_seq && h.flags & flags::RETRANSMITTED != 0 {
                path.dup_dropped += 1;
                return Ok(());
            }
            path.next_rx_seq = h.seq + 1;
            if kind == TransportKind::Acked {
                path.last_rx_seq = h.seq;
                if h.flags & flags::ACK_REQUIRED != 0 {
                    path.ack_pending = true;
                    self.actions.push_back(Action::Transmit(token));
                }
            }
        }
        if h.dport == 0 {
            // Ping. Linux ignores pings from sport 0.
            if h.sport == 0 {
                return Ok(());
            }
            let probe = h.sport == PROBE_PORT;
            let ext = if probe {
                self.handshake(now, id, &h.ext);
                ExtList {
                    items: vec![Extension::Npaths(max_paths), Extension::GenNum(gen_num)],
                }
            } else {
                ExtList::new()
            };
            let pong = OutMsg {
                kind: Kind::Seq,
                header: wire::pong(0, h.sport, ext),
                payload: Bytes::new(),
                seq: None,
            };
            // The pong goes back on the path the ping came on.
            self.enqueue(now, id.peer, pidx, pong);
            return Ok(());
        }
        if h.sport == 0 && h.dport == PROBE_PORT {
            // Pong to our probe.
            self.handshake(now, id, &h.ext);
            return Ok(());
        }
        let src = SocketAddrV4::new(id.peer, h.sport);
        let Some(port) = self.ports.get_mut(&h.dport) else {
            // No socket bound: dropped, as Linux does.
            return Ok(());
        };
        // Spec 3.1: messages for a congested port must still be accepted — up to the hard
        // limit (see `EngineConfig::rcvbuf_hard_factor`); an empty queue takes any message.
        let hard = port
            .rcvbuf
            .saturating_mul(self.cfg.rcvbuf_hard_factor)
            .saturating_add(self.cfg.rcvbuf_hard_slack);
        if port.queued > 0 && port.queued.saturating_add(payload.len()) > hard {
            port.dropped += 1;
            if port.dropped.is_power_of_two() {
                tracing::warn!(port = h.dport, from = %src, queued = port.queued, hard,
                    dropped = port.dropped,
                    "RDS receive queue past its hard limit: message dropped (sender ignores congestion)");
            }
            return Ok(());
        }
        port.queued += payload.len();
        // RDMA / RDMA_DEST extensions go up with the datagram (RDS over RDMA operations).
        let ext = h
            .ext
            .items
            .iter()
            .filter(|e| matches!(e, Extension::Rdma { .. } | Extension::RdmaDest { .. }))
            .cloned()
            .collect();
        port.queue.push_back((payload, src, ext));
        if let Some(c) = self.conns.get_mut(&id.peer) {
            c.paths[pidx].delivered += 1;
        }
        self.actions.push_back(Action::Readable(h.dport));
        self.update_port_cong(h.dport);
        let _ = local;
        Ok(())
    }
}
