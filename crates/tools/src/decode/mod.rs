//! `oxrdma decode`: a capture decoder for what the protocol crates put on the wire.
//!
//! What it does: reads a classic pcap or pcapng file ([`capture`], on `pcap-file` and
//! `etherparse`: Ethernet, Linux cooked v1/v2, BSD loopback, raw IP; IPv4 and IPv6),
//! reassembles every TCP connection per direction ([`tcp`]: by sequence number, retransmissions
//! dropped, out-of-order segments held in a bounded queue, gaps reported), and decodes each
//! stream ([`conn`]):
//! - iWARP ([`iwarp`]): the MPA Request/Reply with its private data (RFC 8797 RPC-over-RDMA
//!   parameters, RDS connection data), FPDUs with their CRC checked when negotiated, DDP
//!   segments reassembled into RDMAP messages (every opcode; Read Requests and Terminates
//!   decoded, [`term`]); after a gap it resynchronises conservatively and says so;
//! - on iWARP Sends, RPC-over-RDMA versions 1 and 2 ([`rpcrdma`]: every message type, chunk
//!   lists, errors, properties) and the RPC message under it ([`nfs`]: call/reply, NFSv3
//!   procedures and NFSv4 COMPOUND operations with their file handle hash, offset and count),
//!   inline or from the Read chunk / Reply chunk data the capture holds (Long Call, Long
//!   Reply); or RDS fragments;
//! - RDS over TCP on port 16385 ([`rds`]): headers, extension headers, congestion maps, pings,
//!   pongs and multipath probes.
//!
//! Every decoder it calls is a checked decoder of the crate that owns the format (`verbs`,
//! `rpcrdma`, `oncrpc`, `nfs`, `rds`); nothing here panics on any input. [`timeline`] builds the
//! per-XID view (`--rpc`) and [`text`] the one-line and detailed renderings.
//!
//! What it does not do: MPA markers (a stream that negotiated them is reported and left),
//! RPC-over-RDMA on InfiniBand/RoCE (no BTH decoding), ONC RPC over plain TCP, RPCSEC_GSS
//! bodies, NFSv4.0 callbacks' operations, or the payload bytes of RDMA Reads and Writes beyond
//! what a Long Call or Long Reply needs (the first 64 KiB per tagged message).

pub mod capture;
pub mod conn;
pub mod iwarp;
pub mod model;
pub mod nfs;
pub mod rds;
pub mod rpcrdma;
pub mod tcp;
pub mod term;
pub mod text;
pub mod timeline;

use std::path::Path;

use serde::Serialize;

pub use model::{Body, Message};

/// Why a capture could not be decoded at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The file could not be read.
    #[error("reading the capture: {0}")]
    Io(#[from] std::io::Error),
    /// The file is not a pcap or pcapng file.
    #[error("{0}")]
    Container(String),
}

/// One TCP connection of the capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamSummary {
    pub stream: u32,
    pub client: String,
    pub server: String,
    /// "iwarp", "rds_tcp" or "other".
    pub protocol: &'static str,
    /// Bytes dropped as retransmissions, client then server.
    pub retransmitted: [u64; 2],
    /// Bytes of a stream that was not decoded.
    pub undecoded_bytes: u64,
}

/// A decoded capture.
#[derive(Debug, Clone, Serialize)]
pub struct Decoded {
    pub frames: capture::FrameStats,
    pub streams: Vec<StreamSummary>,
    pub messages: Vec<Message>,
}

/// Decode a capture held in memory. Never panics; a file that is not a capture is an error,
/// anything wrong inside it is reported in the messages.
pub fn decode(file: &[u8]) -> Result<Decoded, DecodeError> {
    let (segments, frames) = capture::segments(file)?;
    let mut reasm = tcp::Reassembler::default();
    let mut decoders: Vec<conn::ConnDecoder> = Vec::new();
    let mut messages = Vec::new();
    for seg in &segments {
        let (idx, side, events) = reasm.push(seg);
        if idx == decoders.len() {
            let c = &reasm.connections()[idx];
            decoders.push(conn::ConnDecoder::new(c.id, c.client, c.server, c.saw_syn));
        }
        if let Some(d) = decoders.get_mut(idx) {
            d.feed(side, events, &mut messages);
        }
    }
    for (idx, side, events) in reasm.finish() {
        if let Some(d) = decoders.get_mut(idx) {
            d.feed(side, events, &mut messages);
        }
    }
    // Bytes held behind a hole come out late: put every message back in capture order (the
    // frame that completed it; stable, so a frame's messages keep their order).
    messages.sort_by_key(|m| m.frame);
    let streams = reasm
        .connections()
        .iter()
        .zip(&decoders)
        .map(|(c, d)| StreamSummary {
            stream: c.id,
            client: c.client.to_string(),
            server: c.server.to_string(),
            protocol: d.protocol(),
            retransmitted: c.retransmitted(),
            undecoded_bytes: d.other_bytes,
        })
        .collect();
    Ok(Decoded {
        frames,
        streams,
        messages,
    })
}

/// Decode one connection's two byte streams without a capture around them (for tests and the
/// fuzz target): `client` and `server` are what each side sent, fed in pieces of at most
/// `piece` bytes, alternating sides; `server_port` picks the protocol as a capture's port would
/// (16385: RDS over TCP; anything else: iWARP when the client starts with an MPA Request).
pub fn decode_stream(client: &[u8], server: &[u8], server_port: u16, piece: usize) -> Vec<Message> {
    let c: std::net::SocketAddr = ([127, 0, 0, 1], 40000).into();
    let s: std::net::SocketAddr = ([127, 0, 0, 1], server_port).into();
    let mut d = conn::ConnDecoder::new(0, c, s, true);
    let mut out = Vec::new();
    let piece = piece.max(1);
    let (mut a, mut b) = (client.chunks(piece), server.chunks(piece));
    let mut frame = 0u64;
    loop {
        let mut fed = false;
        for (side, chunk) in [(tcp::Side::Client, a.next()), (tcp::Side::Server, b.next())] {
            if let Some(data) = chunk {
                frame += 1;
                let ev = tcp::Event::Data {
                    frame,
                    time: 0.0,
                    data: data.to_vec(),
                };
                d.feed(side, vec![ev], &mut out);
                fed = true;
            }
        }
        if !fed {
            return out;
        }
    }
}

/// Decode the capture file at `path`.
pub fn decode_path(path: &Path) -> Result<Decoded, DecodeError> {
    decode(&std::fs::read(path)?)
}

/// Which messages to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub stream: Option<u32>,
    pub xid: Option<u32>,
    /// A procedure or operation name ("READ", "NFSv3 WRITE", "COMPOUND", "SEQUENCE"),
    /// case-insensitive.
    pub proc_: Option<String>,
}

impl Filter {
    /// True when `m` passes every filter set.
    pub fn matches(&self, m: &Message) -> bool {
        if self.stream.is_some_and(|s| s != m.stream) {
            return false;
        }
        let r = text::rpcrdma_of(m);
        if let Some(x) = self.xid
            && r.is_none_or(|r| r.xid != x && r.rpc.as_ref().is_none_or(|c| c.xid != x))
        {
            return false;
        }
        if let Some(name) = &self.proc_ {
            let Some(rpc) = r.and_then(|r| r.rpc.as_ref()) else {
                return false;
            };
            return proc_matches(rpc, name);
        }
        true
    }
}

/// True when the RPC's procedure, or one of its COMPOUND operations, is `name`.
pub fn proc_matches(rpc: &model::RpcInfo, name: &str) -> bool {
    let Some(p) = &rpc.proc_name else {
        return false;
    };
    let last = p.rsplit(' ').next().unwrap_or(p);
    p.eq_ignore_ascii_case(name)
        || last.eq_ignore_ascii_case(name)
        || rpc
            .nfs
            .as_ref()
            .is_some_and(|n| n.ops.iter().any(|o| o.op.eq_ignore_ascii_case(name)))
}
