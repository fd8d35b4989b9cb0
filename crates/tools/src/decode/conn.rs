//! One TCP connection's decoder: it tells an iWARP stream (an MPA Request first) from an
//! RDS-over-TCP one (port 16385), runs the per-direction decoders, and decodes what iWARP Sends
//! carry: RPC-over-RDMA (with the RPC message inline, or fetched from the Read chunk or Reply
//! chunk data the capture holds) or RDS fragments.

use std::collections::HashMap;

use verbs::wire::ddp::{BufferModel, Opcode, ReadRequest, Terminate};
use verbs::wire::mpa::{FrameKind, MpaFrame};

use super::iwarp::{self, IwEvent, RdmapMsg};
use super::model::{
    Body, Message, MpaInfo, Private, RdmapInfo, ReadReq, RpcRdmaInfo, Seg, TermInfo, Upper,
};
use super::nfs::{CallKey, decode_rpc};
use super::tcp::{Event, Side};
use super::{rds, rpcrdma, term};

/// The upper protocol over iWARP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpperKind {
    Unknown,
    Rpcrdma,
    Rds,
}

// One per connection: the size of the iWARP state does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Kind {
    /// Not decided yet (no payload seen).
    Undecided,
    Iwarp {
        halves: [iwarp::Half; 2],
        frames: [Option<MpaFrame>; 2],
        upper: UpperKind,
    },
    RdsTcp {
        bufs: [Vec<u8>; 2],
        lost: [bool; 2],
        skipped: [u64; 2],
        /// Bytes the message at the head needs in all: nothing is tried before they are there.
        want: [usize; 2],
    },
    /// Neither: its bytes are counted, not decoded.
    Other,
}

/// A connection being decoded.
#[derive(Debug)]
pub struct ConnDecoder {
    pub stream: u32,
    addrs: [String; 2],
    ports: [u16; 2],
    saw_syn: bool,
    kind: Kind,
    /// Calls seen, by the side that sent them and XID.
    calls: HashMap<(Side, u32), CallKey>,
    /// RDMA Read Requests: the requester's sink STag to the source STag it reads.
    read_sinks: HashMap<u32, u32>,
    /// Data that moved to (RDMA Write) or from (RDMA Read) a chunk handle.
    chunk_data: HashMap<u32, Vec<u8>>,
    /// Long Calls waiting for their Position-Zero Read chunk data: message index, sender,
    /// segments.
    long_calls: Vec<(usize, Side, Vec<Seg>)>,
    /// Replies whose call was not seen (yet): sender, XID, message index, the RPC message.
    /// A capture whose directions were recorded out of causal order can hold a reply before
    /// its call; the reply is named once the call shows up.
    pending_replies: Vec<(Side, u32, usize, Vec<u8>)>,
    /// Replies named late, to be put into their messages: message index and RPC.
    resolved: Vec<(usize, super::model::RpcInfo)>,
    /// Bytes of a stream of another protocol.
    pub other_bytes: u64,
}

/// Replies kept waiting for their call, per connection.
const MAX_PENDING_REPLIES: usize = 256;
/// Entries of each per-connection table (calls, Read sinks, chunk data, Long Calls): past it
/// the table is emptied, so that memory stays bounded however long the capture.
const MAX_TABLE: usize = 65536;
/// Chunk handles whose data is kept (each at most 64 KiB).
const MAX_CHUNK_DATA: usize = 1024;

const RDS_TCP_PORT: u16 = ::rds::wire::RDS_TCP_PORT;
/// The port NFS over RDMA listens on (RFC 5666 / RFC 8267): a stream joined mid-way on it is
/// taken as iWARP.
const NFS_RDMA_PORT: u16 = 20049;

impl ConnDecoder {
    pub fn new(
        stream: u32,
        client: std::net::SocketAddr,
        server: std::net::SocketAddr,
        saw_syn: bool,
    ) -> Self {
        ConnDecoder {
            stream,
            addrs: [client.to_string(), server.to_string()],
            ports: [client.port(), server.port()],
            saw_syn,
            kind: Kind::Undecided,
            calls: HashMap::new(),
            read_sinks: HashMap::new(),
            chunk_data: HashMap::new(),
            long_calls: Vec::new(),
            pending_replies: Vec::new(),
            resolved: Vec::new(),
            other_bytes: 0,
        }
    }

    /// What the stream was decoded as.
    pub fn protocol(&self) -> &'static str {
        match self.kind {
            Kind::Iwarp { .. } => "iwarp",
            Kind::RdsTcp { .. } => "rds_tcp",
            Kind::Other | Kind::Undecided => "other",
        }
    }

    fn msg(&self, side: Side, frame: u64, time: f64, body: Body) -> Message {
        let (s, d) = match side {
            Side::Client => (0, 1),
            Side::Server => (1, 0),
        };
        Message {
            frame,
            time,
            stream: self.stream,
            side,
            src: self.addrs[s].clone(),
            dst: self.addrs[d].clone(),
            body,
        }
    }

    fn decide(&mut self, first: &[u8]) {
        let mpa = !first.is_empty()
            && (first.starts_with(&verbs::wire::mpa::REQ_KEY[..first.len().min(16)])
                || first.starts_with(&verbs::wire::mpa::REP_KEY[..first.len().min(16)]));
        self.kind = if self.ports.contains(&RDS_TCP_PORT) && !mpa {
            Kind::RdsTcp {
                bufs: Default::default(),
                lost: [!self.saw_syn; 2],
                skipped: [0; 2],
                want: [0; 2],
            }
        } else if mpa || self.ports.contains(&NFS_RDMA_PORT) {
            let from_start = mpa && self.saw_syn;
            Kind::Iwarp {
                halves: [iwarp::Half::new(from_start), iwarp::Half::new(from_start)],
                frames: [None, None],
                upper: UpperKind::Unknown,
            }
        } else {
            Kind::Other
        };
    }

    /// Events of one direction, in order; decoded messages are appended to `out`.
    pub fn feed(&mut self, side: Side, events: Vec<Event>, out: &mut Vec<Message>) {
        for ev in events {
            match ev {
                Event::Data { frame, time, data } => {
                    if matches!(self.kind, Kind::Undecided) {
                        self.decide(&data);
                    }
                    self.data(side, frame, time, &data, out);
                }
                Event::Gap {
                    frame,
                    time,
                    missing,
                } => {
                    if matches!(self.kind, Kind::Other) {
                        continue;
                    }
                    out.push(self.msg(side, frame, time, Body::Gap { missing }));
                    match &mut self.kind {
                        Kind::Iwarp { halves, .. } => halves[side.index()].gap(),
                        Kind::RdsTcp {
                            bufs, lost, want, ..
                        } => {
                            bufs[side.index()].clear();
                            lost[side.index()] = true;
                            want[side.index()] = 0;
                        }
                        // Before any data: whichever protocol it is, it starts mid-stream.
                        Kind::Undecided => self.saw_syn = false,
                        Kind::Other => {}
                    }
                }
            }
        }
    }

    fn data(&mut self, side: Side, frame: u64, time: f64, data: &[u8], out: &mut Vec<Message>) {
        match &mut self.kind {
            Kind::Iwarp { halves, .. } => {
                let mut evs = Vec::new();
                halves[side.index()].push(data, &mut evs);
                for e in evs {
                    self.iw_event(side, frame, time, e, out);
                }
            }
            Kind::RdsTcp { .. } => self.rds_tcp(side, frame, time, data, out),
            Kind::Other | Kind::Undecided => self.other_bytes += data.len() as u64,
        }
    }

    fn rds_tcp(&mut self, side: Side, frame: u64, time: f64, data: &[u8], out: &mut Vec<Message>) {
        let Kind::RdsTcp {
            bufs,
            lost,
            skipped,
            want,
        } = &mut self.kind
        else {
            return;
        };
        let i = side.index();
        bufs[i].extend_from_slice(data);
        if !lost[i] && bufs[i].len() < want[i] {
            return;
        }
        let mut pos = 0;
        let mut found = Vec::new();
        loop {
            let rest = &bufs[i][pos..];
            if lost[i] {
                // Positions that are not a header are skipped for good; the scan waits at
                // the first one that needs more bytes to tell.
                let mut verdict = None;
                for p in 0..rest.len() {
                    match rds::plausible_at(&rest[p..]) {
                        Some(false) => continue,
                        Some(true) => verdict = Some((p, true)),
                        None => verdict = Some((p, false)),
                    }
                    break;
                }
                let (p, found_it) = verdict.unwrap_or((rest.len(), false));
                pos += p;
                skipped[i] += p as u64;
                if !found_it {
                    break;
                }
                found.push(Body::Resync {
                    skipped: skipped[i],
                    how: "two consecutive valid RDS headers".into(),
                });
                skipped[i] = 0;
                lost[i] = false;
                continue;
            }
            match rds::next_message(rest) {
                rds::Next::Message { info, total } => {
                    pos += total;
                    found.push(Body::RdsTcp(info));
                }
                rds::Next::Partial(total) => {
                    want[i] = total;
                    break;
                }
                rds::Next::Bad(why) => {
                    found.push(Body::Error {
                        what: format!("RDS header: {why}"),
                    });
                    lost[i] = true;
                }
            }
        }
        bufs[i].drain(..pos);
        for b in found {
            out.push(self.msg(side, frame, time, b));
        }
    }

    fn iw_event(&mut self, side: Side, frame: u64, time: f64, e: IwEvent, out: &mut Vec<Message>) {
        let body = match e {
            IwEvent::Mpa(f) => self.mpa(side, f),
            IwEvent::Msg(m) => {
                let body = self.rdmap(side, &m, out.len());
                if m.opcode == Opcode::ReadResponse {
                    self.finish_long_calls(out);
                }
                body
            }
            IwEvent::Resync { skipped, how } => Body::Resync {
                skipped,
                how: how.into(),
            },
            IwEvent::Error(what) => Body::Error { what },
        };
        out.push(self.msg(side, frame, time, body));
        for (index, rpc) in std::mem::take(&mut self.resolved) {
            set_rpc(out, index, rpc, None);
        }
    }

    fn mpa(&mut self, side: Side, f: MpaFrame) -> Body {
        let private = private(&f.private_data);
        let Kind::Iwarp {
            halves,
            frames,
            upper,
        } = &mut self.kind
        else {
            return Body::Error {
                what: "MPA frame outside an iWARP stream".into(),
            };
        };
        match &private {
            Some(Private::Rpcrdma { .. }) => *upper = UpperKind::Rpcrdma,
            Some(Private::Rds { .. }) => *upper = UpperKind::Rds,
            _ => {}
        }
        let info = MpaInfo {
            kind: match f.kind {
                FrameKind::Request => "request",
                FrameKind::Reply => "reply",
            },
            revision: f.revision,
            markers: f.markers,
            crc: f.crc,
            reject: f.reject,
            ird: f.enhanced.map(|e| e.ird),
            ord: f.enhanced.map(|e| e.ord),
            peer_to_peer: f.enhanced.map(|e| e.peer_to_peer),
            private_data_len: f.private_data.len() + f.enhanced.map_or(0, |_| 4),
            private,
        };
        frames[side.index()] = Some(f);
        if let [Some(a), Some(b)] = frames {
            // RFC 5044 §7.1: CRCs are used when either side asks for them.
            let crc = a.crc || b.crc;
            halves[0].crc = Some(crc);
            halves[1].crc = Some(crc);
            if a.reject || b.reject {
                halves[0].stop();
                halves[1].stop();
            }
        }
        Body::Mpa(info)
    }

    fn rdmap(&mut self, side: Side, m: &RdmapMsg, index: usize) -> Body {
        let mut info = RdmapInfo {
            opcode: opcode_name(m.opcode),
            segments: m.segments,
            len: m.len,
            stag: None,
            to: None,
            qn: None,
            msn: None,
            inv_stag: None,
            crc_error: m.crc_error,
            read: None,
            terminate: None,
            upper: None,
        };
        match m.model {
            BufferModel::Tagged { stag, to } => {
                info.stag = Some(stag);
                info.to = Some(to);
                let handle = match m.opcode {
                    Opcode::ReadResponse => self.read_sinks.get(&stag).copied(),
                    _ => Some(stag),
                };
                if let Some(h) = handle {
                    if self.chunk_data.len() >= MAX_CHUNK_DATA && !self.chunk_data.contains_key(&h)
                    {
                        self.chunk_data.clear();
                    }
                    let e = self.chunk_data.entry(h).or_default();
                    let room = iwarp::KEEP_TAGGED.saturating_sub(e.len());
                    e.extend_from_slice(&m.data[..room.min(m.data.len())]);
                }
            }
            BufferModel::Untagged {
                inv_stag, qn, msn, ..
            } => {
                info.qn = Some(qn);
                info.msn = Some(msn);
                if matches!(m.opcode, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                    info.inv_stag = Some(inv_stag);
                }
            }
        }
        match m.opcode {
            Opcode::ReadRequest => match ReadRequest::decode(&m.data) {
                Ok(r) => {
                    if self.read_sinks.len() >= MAX_TABLE {
                        self.read_sinks.clear();
                    }
                    self.read_sinks.insert(r.sink_stag, r.src_stag);
                    // A new read of this handle replaces what an earlier one brought.
                    self.chunk_data.remove(&r.src_stag);
                    info.read = Some(ReadReq {
                        sink_stag: r.sink_stag,
                        sink_to: r.sink_to,
                        size: r.size,
                        src_stag: r.src_stag,
                        src_to: r.src_to,
                    });
                }
                Err(e) => {
                    return Body::Error {
                        what: format!("RDMA Read Request: {e}"),
                    };
                }
            },
            Opcode::Terminate => match Terminate::decode(&m.data) {
                Ok(t) => info.terminate = Some(term_info(&t)),
                Err(e) => {
                    return Body::Error {
                        what: format!("Terminate: {e}"),
                    };
                }
            },
            op if op.is_send() => info.upper = self.send_payload(side, &m.data, index),
            _ => {}
        }
        Body::Rdmap(info)
    }

    fn send_payload(&mut self, side: Side, data: &[u8], index: usize) -> Option<Upper> {
        let upper = match &self.kind {
            Kind::Iwarp { upper, .. } => *upper,
            _ => UpperKind::Unknown,
        };
        let as_rds = || Some(Upper::Rds(rds::decode_fragment(data)));
        match upper {
            UpperKind::Rds => as_rds(),
            UpperKind::Rpcrdma => Some(Upper::Rpcrdma(self.rpcrdma(side, data, index))),
            UpperKind::Unknown => {
                let r = rpcrdma::decode_header(data);
                if r.malformed.is_none() {
                    Some(Upper::Rpcrdma(self.rpcrdma(side, data, index)))
                } else if ::rds::wire::Header::decode(data).is_ok() {
                    as_rds()
                } else {
                    None
                }
            }
        }
    }

    fn call_key(&self, side: Side, xid: u32) -> Option<CallKey> {
        let other = match side {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        };
        self.calls.get(&(other, xid)).copied()
    }

    fn decode_rpc_from(&mut self, side: Side, msg: &[u8], index: usize) -> super::model::RpcInfo {
        let rpc = decode_rpc(msg, |xid| self.call_key(side, xid));
        if rpc.kind == "call"
            && let (Some(prog), Some(vers), Some(proc_)) = (rpc.prog, rpc.vers, rpc.proc_num)
        {
            if self.calls.len() >= MAX_TABLE {
                self.calls.clear();
            }
            self.calls
                .insert((side, rpc.xid), CallKey { prog, vers, proc_ });
            // Replies to this call that came first.
            let (xid, mut i) = (rpc.xid, 0);
            while i < self.pending_replies.len() {
                let (s, x, _, _) = &self.pending_replies[i];
                if *s != side && *x == xid {
                    let (s, _, idx, bytes) = self.pending_replies.swap_remove(i);
                    let named = decode_rpc(&bytes, |x| self.call_key(s, x));
                    self.resolved.push((idx, named));
                } else {
                    i += 1;
                }
            }
        } else if rpc.kind == "reply" && rpc.prog.is_none() && rpc.malformed.is_none() {
            if self.pending_replies.len() >= MAX_PENDING_REPLIES {
                self.pending_replies.remove(0);
            }
            self.pending_replies
                .push((side, rpc.xid, index, msg.to_vec()));
        }
        rpc
    }

    fn rpcrdma(&mut self, side: Side, data: &[u8], index: usize) -> RpcRdmaInfo {
        let mut h = rpcrdma::decode_header(data);
        if rpcrdma::has_inline_payload(&h) {
            let inline = data.get(h.hdr_len..).unwrap_or(&[]);
            let payload = rpcrdma::rebuild_payload(inline, &h.reads);
            h.rpc = Some(self.decode_rpc_from(side, &payload, index));
            h.rpc_from = Some("inline");
        } else if h.malformed.is_none() && matches!(h.proc_name, "RDMA_NOMSG" | "RDMA2_NOMSG") {
            if let Some(rc) = h.reads.iter().find(|r| r.position == 0) {
                // Long Call: the message comes by RDMA Read, later in the capture.
                if self.long_calls.len() >= MAX_PENDING_REPLIES {
                    self.long_calls.remove(0);
                }
                self.long_calls.push((index, side, rc.segments.clone()));
            } else if let Some(reply) = &h.reply_chunk {
                // Long Reply: the responder wrote the message into the Reply chunk first.
                if let Some(msg) = self.gather(reply) {
                    h.rpc = Some(self.decode_rpc_from(side, &msg, index));
                    h.rpc_from = Some("reply chunk");
                }
            }
        }
        h
    }

    /// The bytes the capture holds for a chunk's segments, if it holds any for each.
    fn gather(&self, segs: &[Seg]) -> Option<Vec<u8>> {
        let mut msg = Vec::new();
        for s in segs {
            let d = self.chunk_data.get(&s.handle)?;
            msg.extend_from_slice(&d[..d.len().min(s.length as usize)]);
        }
        Some(msg)
    }

    /// Decode Long Calls whose Read chunk data has all arrived.
    fn finish_long_calls(&mut self, out: &mut [Message]) {
        let mut i = 0;
        while i < self.long_calls.len() {
            let (index, side, segs) = self.long_calls[i].clone();
            let have: u64 = segs
                .iter()
                .map(|s| {
                    self.chunk_data
                        .get(&s.handle)
                        .map_or(0, |d| d.len().min(s.length as usize) as u64)
                })
                .sum();
            let want: u64 = segs
                .iter()
                .map(|s| u64::from(s.length).min(iwarp::KEEP_TAGGED as u64))
                .sum();
            if have < want {
                i += 1;
                continue;
            }
            self.long_calls.swap_remove(i);
            let Some(msg) = self.gather(&segs) else {
                continue;
            };
            let rpc = self.decode_rpc_from(side, &msg, index);
            set_rpc(out, index, rpc, Some("read chunk"));
        }
        for (index, rpc) in std::mem::take(&mut self.resolved) {
            set_rpc(out, index, rpc, None);
        }
    }
}

/// Put an RPC decoded late into the RPC-over-RDMA message at `index`.
fn set_rpc(
    out: &mut [Message],
    index: usize,
    rpc: super::model::RpcInfo,
    from: Option<&'static str>,
) {
    if let Some(Message {
        body:
            Body::Rdmap(RdmapInfo {
                upper: Some(Upper::Rpcrdma(h)),
                ..
            }),
        ..
    }) = out.get_mut(index)
    {
        h.rpc = Some(rpc);
        if from.is_some() {
            h.rpc_from = from;
        }
    }
}

fn opcode_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Write => "Write",
        Opcode::ReadRequest => "ReadRequest",
        Opcode::ReadResponse => "ReadResponse",
        Opcode::Send => "Send",
        Opcode::SendInvalidate => "SendInvalidate",
        Opcode::SendSe => "SendSE",
        Opcode::SendSeInvalidate => "SendSEInvalidate",
        Opcode::Terminate => "Terminate",
    }
}

fn term_info(t: &Terminate) -> TermInfo {
    let (layer, meaning) = term::describe(t.layer, t.etype, t.code);
    TermInfo {
        layer,
        etype: t.etype,
        code: t.code,
        meaning,
        ddp_seg_len: t.ddp_seg_len,
        has_ddp_hdr: t.ddp_hdr.is_some(),
        has_rdma_hdr: t.rdma_hdr.is_some(),
    }
}

/// What an MPA frame's private data is.
fn private(pd: &[u8]) -> Option<Private> {
    if pd.is_empty() {
        return None;
    }
    if let Some(p) = ::rpcrdma::privdata::PrivateData::decode(pd) {
        return Some(Private::Rpcrdma {
            send_size: p.send_size,
            recv_size: p.recv_size,
            remote_invalidate: p.remote_invalidate,
        });
    }
    if pd.len() >= ::rds::wire::rdma::CONN_DATA_LEN
        && let Ok(c) = ::rds::wire::rdma::ConnData::decode(pd)
        && c.major == 3
    {
        return Some(Private::Rds {
            saddr: c.saddr.to_string(),
            daddr: c.daddr.to_string(),
            major: c.major,
            minor: c.minor,
            minor_mask: c.minor_mask,
            credit: c.credit,
            ack_seq: c.ack_seq,
        });
    }
    let hex: String = pd.iter().take(64).map(|b| format!("{b:02x}")).collect();
    Some(Private::Other { hex })
}
