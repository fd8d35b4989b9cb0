//! RDS 3.1 (Reliable Datagram Sockets) for oxrdma.
//!
//! What it does:
//! - [`wire`]: the 48-byte RDS header (Linux's layout, not the spec's lost 40-byte table), the
//!   extension list, the RFC 1071 header checksum, congestion maps and the control messages.
//!   Checked decoders that never panic.
//! - [`engine`]: a sans-IO connection engine: per-peer connections made of up to 8 paths
//!   (multipath RDS), per-path sequence numbers, retransmission after transport resets with
//!   receiver-side duplicate suppression, congestion maps, ping/pong, the multipath probe with
//!   generation numbers, the smaller-address-connects rule and randomised reconnect back-off.
//! - [`tcp`]: a tokio driver for RDS over TCP (port 16385 by default) that tracks delivery
//!   honestly by reading how many bytes TCP still holds unacknowledged (SIOCOUTQ).
//! - [`socket`]: [`RdsStack`] (one per local IPv4 address: listener, connections, ports) and
//!   [`RdsSocket`] with `send_to` / `recv_from`, plus [`BlockingRdsSocket`].
//! - `rds info` is [`RdsStack::info`]; the tools behind `oxrdma rds ping` and `rds stress` are
//!   in the `tools` crate.
//!
//! - [`rdma`]: RDS over RDMA on the `verbs` crate (`Transport::Rdma`; soft-iWARP by default):
//!   the 32-byte connection private data with version negotiation, credit flow control,
//!   4096-byte fragmentation, header checksums, and the engine's `Acked` mode (`h_ack`,
//!   ACK_REQUIRED every 8 messages). One path per peer (as RDS/IB). RDMA Write operations:
//!   [`RdsStack::rdma_buffer`] + [`RdsSocket::send_rdma_dest`] advertise a buffer (cookie =
//!   rkey | offset << 32), [`RdsSocket::send_rdma_write`] writes it at the address the
//!   application carried (Linux's `remote_vec.addr`: 0 on zero-based registrations, the
//!   virtual address on rdma-core devices) plus the cookie's offset, and sends the completing
//!   message with the RDMA extension; the receiver invalidates the rkey (use once).
//!   [`RdsSocket::send_rdma_read`] reads from such a buffer, and its message follows the Read
//!   (fenced, as RDS_RDMA_FENCE).
//!
//! What it does not do (yet): RDMA_BYTES, the RDMA args flags (FENCE,
//! NOTIFY_ME, …), applying the peer's initial `dp_ack_seq`, IPv6, and TCP-AO.
//!
//! Behaviour worth knowing:
//! - Delivery over TCP is confirmed by TCP's acknowledgement of a message's last byte, as in
//!   the kernel. If the peer *process* dies with bytes still unread in its socket, those
//!   messages are gone; the peer comes back with a new generation number, and RDS semantics
//!   treat that as a new incarnation (spec "RDS Generation Number"). Without SIOCOUTQ (non-Linux)
//!   nothing is confirmed early and messages are only released by a clean connection end.
//! - Every connect on path 0 (by either side) sends a probe carrying NPATHS and GEN_NUM, so a
//!   restarted peer is noticed on the first reconnect. The probe takes a new sequence number and
//!   is therefore queued after retransmissions, never ahead of them.
//! - Our congestion maps carry a SPORT_IDX extension naming the path, so an accepting oxrdma
//!   node binds each TCP connection to the right path even after reconnects. Linux 6.1 ignores
//!   extensions on congestion maps, and as acceptor binds connections to paths in accept order
//!   (`rds_tcp_accept_one_path`); against such a peer a reconnect of one path among several can
//!   land on a different path index, which kernel-to-kernel 6.1 shares.
//! - When a peer reconnects a path before we saw its old connection end, the old connection is
//!   read to its end (at most 5 s) before bytes of the new one are processed.
//! - What peers can make the engine hold is bounded (`EngineConfig`): entries for at most
//!   `max_peers` peer addresses (1,024 by default; an entry that never carried a message is
//!   forgotten for a newcomer, one that did is kept and the newcomer refused), at most
//!   `max_unbound` accepted connections waiting for their first header, each for at most
//!   `bind_timeout` (10 s), and each port's receive queue (`rcvbuf_hard_factor`). Linux has
//!   none of these bounds.

pub mod engine;
pub mod error;
pub mod rdma;
pub mod socket;
pub mod tcp;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;

pub use engine::{Engine, EngineConfig, EngineInfo, TransportKind};
pub use error::{RdsError, SendError, WireError};
pub use rdma::RdmaConfig;
pub use socket::{BlockingRdsSocket, RdsSocket, SendWaits};
pub use tcp::{RdsStack, StackConfig, Transport};
