//! What the decoder reports: one [`Message`] per protocol message found on a stream, as plain
//! serialisable data (the CLI prints it as one line, in detail, or as JSON).

use serde::Serialize;

use super::tcp::Side;

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// Frame (1-based) that carried the message's last byte.
    pub frame: u64,
    /// Seconds since the epoch.
    pub time: f64,
    /// TCP stream number (from 0, in order of first appearance).
    pub stream: u32,
    /// Who sent it.
    pub side: Side,
    pub src: String,
    pub dst: String,
    #[serde(flatten)]
    pub body: Body,
}

/// The message, by layer.
// Records built once per message and printed: their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "layer", rename_all = "snake_case")]
pub enum Body {
    /// An MPA Request or Reply frame (RFC 5044 §7.1, RFC 6581).
    Mpa(MpaInfo),
    /// An RDMAP message: every DDP segment of it, reassembled (RFC 5040, RFC 5041).
    Rdmap(RdmapInfo),
    /// An RDS message on an RDS-over-TCP stream (port 16385).
    RdsTcp(RdsInfo),
    /// Bytes the capture does not hold.
    Gap { missing: u64 },
    /// After a gap or an undecodable stretch the decoder skipped `skipped` bytes and found
    /// message boundaries again.
    Resync { skipped: u64, how: String },
    /// What could not be decoded, and why; the stream's decoding stops or resyncs after it.
    Error { what: String },
}

/// An MPA connection setup frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MpaInfo {
    /// "request" or "reply".
    pub kind: &'static str,
    pub revision: u8,
    pub markers: bool,
    pub crc: bool,
    pub reject: bool,
    /// RFC 6581 enhanced connection setup.
    pub ird: Option<u16>,
    pub ord: Option<u16>,
    pub peer_to_peer: Option<bool>,
    pub private_data_len: usize,
    /// What the private data is, decoded.
    pub private: Option<Private>,
}

/// Private data of an MPA frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Private {
    /// RFC 8797 RPC-over-RDMA connection parameters.
    Rpcrdma {
        send_size: u32,
        recv_size: u32,
        remote_invalidate: bool,
    },
    /// RDS over RDMA connection data.
    Rds {
        saddr: String,
        daddr: String,
        major: u8,
        minor: u8,
        minor_mask: u16,
        credit: u32,
        ack_seq: u64,
    },
    /// Anything else, as hex (first 64 bytes).
    Other { hex: String },
}

/// An RDMAP message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdmapInfo {
    /// RFC 5040 §4.3 name: "Write", "ReadRequest", "ReadResponse", "Send", "SendInvalidate",
    /// "SendSE", "SendSEInvalidate", "Terminate".
    pub opcode: &'static str,
    /// DDP segments the message came in.
    pub segments: u32,
    /// Payload bytes.
    pub len: u64,
    /// Tagged: the sink STag and the first tagged offset.
    pub stag: Option<u32>,
    pub to: Option<u64>,
    /// Untagged: queue number and message sequence number.
    pub qn: Option<u32>,
    pub msn: Option<u32>,
    /// Send with Invalidate: the STag invalidated.
    pub inv_stag: Option<u32>,
    /// True when an FPDU's CRC did not match.
    pub crc_error: bool,
    pub read: Option<ReadReq>,
    pub terminate: Option<TermInfo>,
    /// The RPC-over-RDMA or RDS message a Send carried.
    pub upper: Option<Upper>,
}

/// An RDMA Read Request (RFC 5040 §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReadReq {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

/// A Terminate message (RFC 5040 §4.8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TermInfo {
    pub layer: &'static str,
    pub etype: u8,
    pub code: u8,
    /// What layer, type and code mean.
    pub meaning: String,
    pub ddp_seg_len: Option<u16>,
    pub has_ddp_hdr: bool,
    pub has_rdma_hdr: bool,
}

/// What a Send carried.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "proto", rename_all = "snake_case")]
pub enum Upper {
    Rpcrdma(RpcRdmaInfo),
    Rds(RdsInfo),
}

/// One RDMA segment of a chunk (RFC 8166 §3.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Seg {
    pub handle: u32,
    pub length: u32,
    pub offset: u64,
}

/// A Read chunk: its position and segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadChunkInfo {
    pub position: u32,
    pub segments: Vec<Seg>,
}

/// An RPC-over-RDMA transport header (RFC 8166 §4, or cel-05 §7 for version 2).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcRdmaInfo {
    pub vers: u32,
    pub xid: u32,
    pub credits: u32,
    /// "RDMA_MSG", "RDMA_NOMSG", "RDMA_MSGP", "RDMA_DONE", "RDMA_ERROR", or the version 2
    /// names ("RDMA2_MSG", ..., "RDMA2_UPDPROP").
    pub proc_name: &'static str,
    /// Version 2: "call" or "reply".
    pub direction: Option<&'static str>,
    /// Version 2: the handle the responder may invalidate.
    pub inv_handle: Option<u32>,
    pub reads: Vec<ReadChunkInfo>,
    pub writes: Vec<Vec<Seg>>,
    pub reply_chunk: Option<Vec<Seg>>,
    /// RDMA_ERROR / RDMA2_ERROR: the error and its body.
    pub error: Option<String>,
    /// Version 2 OPTIONAL: its type and length.
    pub opttype: Option<u32>,
    /// Version 2 property messages: "id=value" per property, and the subsets.
    pub properties: Vec<String>,
    /// Header length; for RDMA_MSG the inline Payload stream follows.
    pub hdr_len: usize,
    /// Why the header did not decode (the fields above are what came before).
    pub malformed: Option<String>,
    /// The RPC message: inline, or from the Read chunk / Reply chunk data in the capture.
    pub rpc: Option<RpcInfo>,
    /// Where `rpc` came from: "inline", "read chunk" or "reply chunk".
    pub rpc_from: Option<&'static str>,
}

/// An ONC RPC message header and, for NFS, its procedure and key arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcInfo {
    pub xid: u32,
    /// "call" or "reply".
    pub kind: &'static str,
    pub prog: Option<u32>,
    pub vers: Option<u32>,
    pub proc_num: Option<u32>,
    /// The procedure's name ("NFSv3 READ", "NFSv4 COMPOUND", "NULL", "prog 100005 v3 proc 1").
    pub proc_name: Option<String>,
    /// Reply: "accepted success", "accepted proc_unavail", "denied auth_error", ...
    pub reply_stat: Option<String>,
    /// NFS detail (arguments of calls, status of replies).
    pub nfs: Option<NfsInfo>,
    /// Why the message did not decode further.
    pub malformed: Option<String>,
}

/// NFS procedure detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct NfsInfo {
    /// File handle hash (CRC-32C of the handle bytes, as hex).
    pub fh: Option<String>,
    pub offset: Option<u64>,
    pub count: Option<u32>,
    /// A name argument (LOOKUP, CREATE, ...).
    pub name: Option<String>,
    /// NFSv4 COMPOUND: the operations, with their own key arguments.
    pub ops: Vec<NfsOp>,
    /// Reply status (nfsstat3 / nfsstat4 number).
    pub status: Option<u32>,
}

/// One NFSv4 operation of a COMPOUND.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NfsOp {
    pub op: String,
    pub fh: Option<String>,
    pub offset: Option<u64>,
    pub count: Option<u32>,
    pub name: Option<String>,
    /// Replies: the operation's status.
    pub status: Option<u32>,
}

/// An RDS message (header per RDS 3.1 / Linux `struct rds_header`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdsInfo {
    pub seq: u64,
    pub ack: u64,
    pub len: u32,
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
    pub credit: u8,
    pub csum: u16,
    /// "data", "ack", "ping", "pong", "probe", "cong_map".
    pub kind: &'static str,
    /// Extension headers, as "NAME(values)".
    pub extensions: Vec<String>,
    /// Congestion map: the ports marked congested (at most 64 listed).
    pub congested_ports: Option<Vec<u16>>,
    /// Over iWARP: this Send was one fragment of a longer message.
    pub fragment_len: Option<u32>,
    /// Why the header or payload did not decode.
    pub malformed: Option<String>,
}
