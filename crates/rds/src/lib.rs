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
//! - [`tools`]: library functions behind `oxrdma rds ping`, `rds stress` (and a raw-TCP
//!   baseline); `rds info` is [`RdsStack::info`].
//!
//! What it does not do (yet): RDS over RDMA (the engine has an `Acked` transport mode with
//! `h_ack` / `ACK_REQUIRED` / ack-only bookkeeping for it, but no verbs driver), RDMA
//! operations and their extension headers beyond encoding/decoding, IB credits and
//! fragmentation, IPv6, and TCP-AO.

pub mod engine;
pub mod error;
pub mod socket;
pub mod tcp;
pub mod tools;
pub mod wire;

pub use engine::{Engine, EngineConfig, EngineInfo, TransportKind};
pub use error::{RdsError, SendError, WireError};
pub use socket::{BlockingRdsSocket, RdsSocket};
pub use tcp::{RdsStack, StackConfig};
