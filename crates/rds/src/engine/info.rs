//! Snapshots of the engine's state for `rds info`.

use std::net::Ipv4Addr;

use super::{Engine, LimitCounts, PathState};

/// Snapshot of one path for `rds info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Path index.
    pub index: u8,
    /// State.
    pub state: PathState,
    /// Next sequence number to send.
    pub next_tx_seq: u64,
    /// Next sequence number expected.
    pub next_rx_seq: u64,
    /// Messages waiting to be sent.
    pub send_queue: usize,
    /// Messages sent and not yet confirmed delivered.
    pub unacked: usize,
    /// Transport connections made on this path.
    pub connects: u64,
    /// Transport resets seen.
    pub resets: u64,
    /// Messages retransmitted after resets.
    pub retransmitted: u64,
    /// Retransmitted duplicates dropped on receive.
    pub dup_dropped: u64,
    /// Messages delivered to local ports.
    pub delivered: u64,
    /// Ack-only messages sent (Acked transports).
    pub ack_only_sent: u64,
}

/// Snapshot of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Peer address.
    pub peer: Ipv4Addr,
    /// Whether we are the side that connects (the smaller address).
    pub initiator: bool,
    /// Agreed path count (`None` until the probe is answered).
    pub npaths: Option<u16>,
    /// Peer's generation number (0 = unknown).
    pub peer_gen: u32,
    /// Generation resets seen.
    pub gen_resets: u64,
    /// Ports the peer marked congested.
    pub peer_congested: Vec<u16>,
    /// Paths in use (index < npaths, or with traffic).
    pub paths: Vec<PathInfo>,
}

/// Snapshot of one bound port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// RDS port.
    pub port: u16,
    /// Receive buffer, bytes.
    pub rcvbuf: usize,
    /// Bytes queued for the application.
    pub queued: usize,
    /// Whether the port is marked congested.
    pub congested: bool,
    /// Messages dropped because the receive queue was past its hard limit
    /// ([`EngineConfig::rcvbuf_hard_factor`]): a sender that ignores the congestion map.
    pub dropped: u64,
    /// Send buffer, bytes.
    pub sndbuf: usize,
    /// Payload bytes of this port's messages queued or not yet confirmed.
    pub snd_bytes: usize,
}

/// Snapshot of the engine for `oxrdma rds info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Local address.
    pub local: Ipv4Addr,
    /// Our generation number.
    pub gen_num: u32,
    /// Connections.
    pub conns: Vec<ConnInfo>,
    /// Bound ports.
    pub ports: Vec<PortInfo>,
    /// The bound on peers ([`super::EngineConfig::max_peers`]).
    pub max_peers: usize,
    /// Accepted transports waiting for their first header.
    pub unbound: usize,
    /// What the bounds turned away.
    pub limits: LimitCounts,
}

impl Engine {
    /// Snapshot for `rds info`.
    pub fn info(&self) -> EngineInfo {
        let mut conns: Vec<ConnInfo> = self
            .conns
            .values()
            .map(|c| ConnInfo {
                peer: c.peer,
                initiator: self.is_initiator(c.peer),
                npaths: c.npaths,
                peer_gen: c.peer_gen,
                gen_resets: c.gen_resets,
                peer_congested: c.peer_cong.congested_ports().collect(),
                paths: c
                    .paths
                    .iter()
                    .filter(|p| {
                        u16::from(p.index) < c.npaths.unwrap_or(1)
                            || p.state != PathState::Down
                            || p.connects > 0
                    })
                    .map(|p| PathInfo {
                        index: p.index,
                        state: p.state,
                        next_tx_seq: p.next_tx_seq,
                        next_rx_seq: p.next_rx_seq,
                        send_queue: p.sendq.len(),
                        unacked: p.inflight.len()
                            + usize::from(p.transport.as_ref().is_some_and(|t| t.cur.is_some())),
                        connects: p.connects,
                        resets: p.resets,
                        retransmitted: p.retransmitted,
                        dup_dropped: p.dup_dropped,
                        delivered: p.delivered,
                        ack_only_sent: p.ack_only_sent,
                    })
                    .collect(),
            })
            .collect();
        conns.sort_by_key(|c| c.peer);
        let mut ports: Vec<PortInfo> = self
            .ports
            .iter()
            .map(|(k, p)| PortInfo {
                port: *k,
                rcvbuf: p.rcvbuf,
                queued: p.queued,
                congested: p.congested,
                dropped: p.dropped,
                sndbuf: p.sndbuf,
                snd_bytes: p.snd_bytes,
            })
            .collect();
        ports.sort_by_key(|p| p.port);
        EngineInfo {
            local: self.cfg.local,
            gen_num: self.gen_num,
            conns,
            ports,
            max_peers: self.cfg.max_peers,
            unbound: self.pending.len(),
            limits: self.limits,
        }
    }
}
