//! Bound ports: their receive queues, send buffers and the local congestion map.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use bytes::Bytes;
use rand::Rng;

use super::{Action, Datagram, Engine, Kind, OutMsg, PathState, Port};
use crate::wire::CongMap;

impl Engine {
    /// Binds an RDS port. Port 0 (ping responder) cannot be bound.
    pub fn bind(&mut self, port: u16) -> Result<(), crate::error::RdsError> {
        if port == 0 || self.ports.contains_key(&port) {
            return Err(crate::error::RdsError::AddrInUse(port));
        }
        let hash_seed = self.rng.random();
        self.ports.insert(
            port,
            Port {
                rcvbuf: self.cfg.default_rcvbuf,
                sndbuf: self.cfg.default_sndbuf,
                snd_bytes: 0,
                queue: VecDeque::new(),
                queued: 0,
                congested: false,
                dropped: 0,
                hash_seed,
            },
        );
        Ok(())
    }

    /// Binds the first free port at or above 1024 (0 means "any" in the socket API).
    pub fn bind_any(&mut self) -> Option<u16> {
        let start: u16 = self.rng.random_range(1024..=u16::MAX);
        let p = (start..=u16::MAX)
            .chain(1024..start)
            .find(|p| !self.ports.contains_key(p))?;
        self.bind(p).ok()?;
        Some(p)
    }

    /// Unbinds a port; queued datagrams are dropped and its congestion cleared.
    pub fn unbind(&mut self, port: u16) {
        if let Some(p) = self.ports.remove(&port)
            && p.congested
        {
            self.set_local_cong(port, false);
        }
    }

    /// Sets a port's receive buffer size (SO_RCVBUF).
    pub fn set_rcvbuf(&mut self, port: u16, bytes: usize) {
        if let Some(p) = self.ports.get_mut(&port) {
            p.rcvbuf = bytes.max(1);
        }
        self.update_port_cong(port);
    }

    /// Sets a port's send buffer (Linux: half of SO_SNDBUF).
    pub fn set_sndbuf(&mut self, port: u16, bytes: usize) {
        if let Some(p) = self.ports.get_mut(&port) {
            let was_full = p.snd_bytes >= p.sndbuf;
            p.sndbuf = bytes.max(1);
            if was_full && p.snd_bytes < p.sndbuf {
                self.actions.push_back(Action::SendReady);
            }
        }
    }

    /// Takes the next datagram queued for `port`.
    pub fn recv(&mut self, port: u16) -> Option<Datagram> {
        let p = self.ports.get_mut(&port)?;
        let (payload, src, ext) = p.queue.pop_front()?;
        p.queued -= payload.len();
        self.update_port_cong(port);
        Some(Datagram { payload, src, ext })
    }

    pub(super) fn update_port_cong(&mut self, port: u16) {
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        // facts "Congestion map": congested when queued bytes exceed the receive buffer,
        // uncongested below half of it.
        let change = if !p.congested && p.queued > p.rcvbuf {
            Some(true)
        } else if p.congested && p.queued < p.rcvbuf / 2 {
            Some(false)
        } else {
            None
        };
        if let Some(c) = change {
            p.congested = c;
            self.set_local_cong(port, c);
        }
    }

    fn set_local_cong(&mut self, port: u16, c: bool) {
        self.local_cong.set(port, c);
        // Spec 3.1 "Congestion control": send the update to every connected node.
        let peers: Vec<Ipv4Addr> = self.conns.keys().copied().collect();
        for peer in peers {
            self.queue_cong_map(peer);
        }
    }

    fn queue_cong_map(&mut self, peer: Ipv4Addr) {
        let Some(conn) = self.conns.get_mut(&peer) else {
            return;
        };
        // On path 0 (or the first path that is up). One queued map suffices: it is encoded from
        // the current map when it is transmitted.
        let idx = conn
            .paths
            .iter()
            .position(|p| p.state == PathState::Up)
            .unwrap_or(0);
        let path = &mut conn.paths[idx];
        if !path.sendq.iter().any(|m| matches!(m.kind, Kind::CongMap)) {
            path.sendq.push_back(OutMsg {
                kind: Kind::CongMap,
                header: CongMap::header(),
                payload: Bytes::new(),
                seq: None,
            });
        }
        if let Some(t) = path.token() {
            self.actions.push_back(Action::Transmit(t));
        }
    }

    /// The local congestion map.
    pub fn local_cong(&self) -> &CongMap {
        &self.local_cong
    }

    /// Whether some bound port's send buffer is full (its senders wait for confirmations).
    pub fn send_buffer_full(&self) -> bool {
        self.ports.values().any(|p| p.snd_bytes >= p.sndbuf)
    }
}
