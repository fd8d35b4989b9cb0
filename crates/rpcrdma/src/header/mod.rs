//! The RPC-over-RDMA Version One transport header (RFC 8166 §4.1.2, §4.2, §4.3).
//!
//! Two layers, as everywhere in oxrdma: [`Header::decode`] is a checked decoder that never
//! panics and reports every failure as a [`HeaderError`] that says how the receiver must answer
//! ([`HeaderError::response`]); [`Header::encode`] writes exactly [`Header::encoded_len`] bytes.

use bytes::{Bytes, BytesMut};
use xdr::PutWords;
use xdr::{Decoder, XdrError};

/// The only RPC-over-RDMA version this crate speaks (RFC 8166 §4.2.2).
//= specs/rfc8166.txt#section-4.2.2
//# For RPC-over-RDMA version 1, this field MUST contain the value one (1).
pub const RPCRDMA_VERSION: u32 = 1;

/// Length of the fixed part of every header: xid, vers, credits, proc (RFC 8166 §4.2).
pub const FIXED_LEN: usize = 16;

/// Smallest RDMA_MSG / RDMA_NOMSG header: the fixed part plus three empty chunk lists.
pub const MIN_MSG_LEN: usize = FIXED_LEN + 12;

/// `rdma_proc` values (RFC 8166 §4.1.2).
pub const RDMA_MSG: u32 = 0;
/// RDMA_NOMSG.
pub const RDMA_NOMSG: u32 = 1;
/// RDMA_MSGP (no longer supported, RFC 8166 §4.6.1).
pub const RDMA_MSGP: u32 = 2;
/// RDMA_DONE (no longer supported, RFC 8166 §4.6.2).
pub const RDMA_DONE: u32 = 3;
/// RDMA_ERROR.
pub const RDMA_ERROR: u32 = 4;

/// `rdma_err` RDMA_ERR_VERS.
pub const ERR_VERS: u32 = 1;
/// `rdma_err` RDMA_ERR_CHUNK.
pub const ERR_CHUNK: u32 = 2;

/// An RDMA segment: handle, length, offset (RFC 8166 §3.4.3). On the wire: `HLOO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
//= specs/rfc8166.txt#section-2.3.2
//# The RPC-over-RDMA version 1 protocol assumes that each region of registered memory MUST be
//# identified with a steering tag of no more than 32 bits and memory addresses of up to 64 bits in
//# length.
pub struct Segment {
    /// The steering tag (R_key / STag) of the registered memory.
    pub handle: u32,
    /// Length in bytes.
    pub length: u32,
    /// Offset (often the virtual address) within the registered region.
    pub offset: u64,
}

/// A Read segment: a segment with its XDR Position (RFC 8166 §3.4.5). On the wire: `PHLOO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadSegment {
    /// Byte offset in the Payload stream where this chunk's data belongs.
    pub position: u32,
    pub target: Segment,
}

/// A Read chunk: the consecutive Read segments sharing one Position (RFC 8166 §3.4.5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadChunk {
    pub position: u32,
    pub segments: Vec<Segment>,
}

impl ReadChunk {
    /// Sum of the segment lengths.
    pub fn len(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.length)).sum()
    }

    /// True when the chunk carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A Write chunk (or the Reply chunk): a counted array of segments (RFC 8166 §3.4.6).
pub type WriteChunk = Vec<Segment>;

/// Sum of the lengths of a Write chunk's segments.
pub fn chunk_len(chunk: &[Segment]) -> u64 {
    chunk.iter().map(|s| u64::from(s.length)).sum()
}

/// The three chunk lists of RDMA_MSG and RDMA_NOMSG (RFC 8166 §4.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunks {
    /// The Read list, as a flat list of Read segments in wire order.
    pub reads: Vec<ReadSegment>,
    /// The Write list.
    pub writes: Vec<WriteChunk>,
    /// The Reply chunk.
    pub reply: Option<WriteChunk>,
}

impl Chunks {
    /// True when all three lists are empty.
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty() && self.reply.is_none()
    }

    /// The Read list grouped into Read chunks: consecutive segments with the same Position
    /// belong to one chunk (RFC 8166 §3.4.5, §4.3.1).
    pub fn read_chunks(&self) -> Vec<ReadChunk> {
        let mut out: Vec<ReadChunk> = Vec::new();
        for rs in &self.reads {
            match out.last_mut() {
                Some(c) if c.position == rs.position => c.segments.push(rs.target),
                _ => out.push(ReadChunk {
                    position: rs.position,
                    segments: vec![rs.target],
                }),
            }
        }
        out
    }

    /// Flatten Read chunks into a Read list.
    pub fn set_read_chunks(&mut self, chunks: &[ReadChunk]) {
        self.reads = chunks
            .iter()
            .flat_map(|c| {
                c.segments.iter().map(|s| ReadSegment {
                    position: c.position,
                    target: *s,
                })
            })
            .collect();
    }

    pub(crate) fn encoded_len(&self) -> usize {
        let reads = self.reads.len() * 24 + 4;
        let writes: usize = self.writes.iter().map(|c| 8 + 16 * c.len()).sum::<usize>() + 4;
        let reply = 4 + self.reply.as_ref().map_or(0, |c| 4 + 16 * c.len());
        reads + writes + reply
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) {
        for rs in &self.reads {
            out.put_u32(1);
            out.put_u32(rs.position);
            put_segment(out, &rs.target);
        }
        out.put_u32(0);
        for c in &self.writes {
            out.put_u32(1);
            put_chunk(out, c);
        }
        out.put_u32(0);
        match &self.reply {
            Some(c) => {
                out.put_u32(1);
                put_chunk(out, c);
            }
            None => out.put_u32(0),
        }
    }
}

fn put_segment(out: &mut BytesMut, s: &Segment) {
    out.put_u32(s.handle);
    out.put_u32(s.length);
    out.put_u64(s.offset);
}

fn put_chunk(out: &mut BytesMut, c: &[Segment]) {
    // A chunk never has more than u32::MAX segments: limits are far below that.
    out.put_u32(u32::try_from(c.len()).unwrap_or(u32::MAX));
    for s in c {
        put_segment(out, s);
    }
}

/// The body of an RDMA_ERROR message (RFC 8166 §4.1.2 `rpc_rdma_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorBody {
    /// RDMA_ERR_VERS with the inclusive range of supported versions (RFC 8166 §4.5.1).
    Vers { low: u32, high: u32 },
    /// RDMA_ERR_CHUNK (RFC 8166 §4.5.2).
    Chunk,
}

/// `rpcrdma1_body`: what follows the fixed fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// RDMA_MSG: chunk lists, then the Payload stream inline.
    Msg(Chunks),
    /// RDMA_NOMSG: chunk lists only; the Payload stream travels in a Position-Zero Read chunk
    /// or the Reply chunk.
    NoMsg(Chunks),
    /// RDMA_MSGP, recognised so that a receiver can answer it with RDMA_ERR_CHUNK
    /// (RFC 8166 §4.6.1). Senders MUST NOT send it; the encoder exists for tests.
    MsgP {
        align: u32,
        thresh: u32,
        chunks: Chunks,
    },
    /// RDMA_DONE, recognised so that a receiver can answer it (RFC 8166 §4.6.2).
    Done,
    /// RDMA_ERROR.
    Error(ErrorBody),
}

impl Body {
    /// The `rdma_proc` value.
    pub fn proc_(&self) -> u32 {
        match self {
            Body::Msg(_) => RDMA_MSG,
            Body::NoMsg(_) => RDMA_NOMSG,
            Body::MsgP { .. } => RDMA_MSGP,
            Body::Done => RDMA_DONE,
            Body::Error(_) => RDMA_ERROR,
        }
    }

    /// The chunk lists, for RDMA_MSG and RDMA_NOMSG.
    pub fn chunks(&self) -> Option<&Chunks> {
        match self {
            Body::Msg(c) | Body::NoMsg(c) => Some(c),
            _ => None,
        }
    }
}

/// A whole transport header (`rpcrdma1_header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Same value as the RPC message's XID (RFC 8166 §4.2.1).
    pub xid: u32,
    /// Always [`RPCRDMA_VERSION`] for headers this crate builds.
    pub vers: u32,
    /// Requested (calls) or granted (replies) credits (RFC 8166 §4.2.3).
    pub credits: u32,
    pub body: Body,
}

/// Bounds on the chunk lists a decoder accepts. A header is at most one receive buffer long,
/// which already bounds these; the limits keep allocation proportional to what we accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Read segments in the Read list.
    pub max_read_segments: usize,
    /// Chunks in the Write list.
    pub max_write_chunks: usize,
    /// Segments in one Write chunk or in the Reply chunk.
    pub max_segments: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_read_segments: 64,
            max_write_chunks: 16,
            max_segments: 64,
        }
    }
}

/// How a receiver answers a header it could not accept (RFC 8166 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorResponse {
    /// Reply with RDMA_ERROR / RDMA_ERR_VERS carrying `xid` and the supported range
    /// (RFC 8166 §4.5.1).
    ErrVers { xid: u32, vers: u32 },
    /// Reply with RDMA_ERROR / RDMA_ERR_CHUNK carrying `xid` (RFC 8166 §4.5.2).
    ErrChunk { xid: u32 },
    /// Send nothing: the message is too short to carry an XID, or it is a malformed
    /// RDMA_ERROR (RFC 8166 §4.5: "A receiver MUST silently discard an RDMA_ERROR procedure that it
    /// cannot decode").
    Discard,
}

/// Why a header did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer than eight bytes: there is no XID and version to answer with.
    #[error("transport header too short ({0} bytes)")]
    TooShort(usize),
    /// `rdma_vers` is not 1.
    #[error("unsupported RPC-over-RDMA version {vers} (xid {xid:#010x})")]
    Version { xid: u32, vers: u32 },
    /// `rdma_proc` is not a Version One procedure.
    #[error("unknown rdma_proc {proc_} (xid {xid:#010x})")]
    BadProc { xid: u32, proc_: u32 },
    /// The header ended in the middle of a field.
    #[error("transport header truncated (xid {xid:#010x})")]
    Truncated { xid: u32 },
    /// An optional-data discriminant was neither 0 nor 1.
    #[error("invalid optional-data flag {value} (xid {xid:#010x})")]
    BadFlag { xid: u32, value: u32 },
    /// A chunk list is longer than the receiver accepts.
    #[error("chunk list exceeds limit {limit} (xid {xid:#010x})")]
    TooManySegments { xid: u32, limit: usize },
    /// RDMA_NOMSG without any chunk (RFC 8166 §4.5.2 names it as an XDR error).
    #[error("RDMA_NOMSG without chunks (xid {xid:#010x})")]
    NoMsgWithoutChunks { xid: u32 },
    /// An RDMA_ERROR whose body cannot be decoded.
    #[error("malformed RDMA_ERROR (xid {xid:#010x})")]
    MalformedError { xid: u32 },
}

impl HeaderError {
    /// What the receiver sends back (RFC 8166 §4.5).
    pub fn response(&self) -> ErrorResponse {
        match *self {
            //= specs/rfc8166.txt#section-4.5
            //# A receiver MUST silently discard an RDMA_ERROR procedure that it cannot decode.
            HeaderError::TooShort(_) | HeaderError::MalformedError { .. } => ErrorResponse::Discard,
            // RFC 8166 §4.5.1: a version the receiver does not support gets RDMA_ERR_VERS.
            //= specs/rfc8166.txt#section-4.5.1
            //# When a Responder detects an RPC-over-RDMA header version that it does not support
            //# (currently this document defines only version 1), it MUST reply with an RDMA_ERROR
            //# procedure and set the rdma_err value to ERR_VERS, also providing the low and high
            //# inclusive version numbers it does, in fact, support.
            HeaderError::Version { xid, vers } => ErrorResponse::ErrVers { xid, vers },
            // RFC 8166 §4.5.2: a recognised version with an XDR parsing error gets
            // RDMA_ERR_CHUNK.
            HeaderError::BadProc { xid, .. }
            | HeaderError::Truncated { xid }
            | HeaderError::BadFlag { xid, .. }
            | HeaderError::TooManySegments { xid, .. }
            //= specs/rfc8166.txt#section-4.5.2
            //# If the rdma_vers field contains a recognized value, but an XDR parsing error occurs,
            //# the Responder MUST reply with an RDMA_ERROR procedure and set the rdma_err value to
            //# ERR_CHUNK.
            | HeaderError::NoMsgWithoutChunks { xid } => ErrorResponse::ErrChunk { xid },
        }
    }
}

/// Why the three chunk lists did not decode. The lists have the same layout in versions 1 and
/// 2; each version maps this to its own error (and so to its own response).
#[derive(Debug)]
pub(crate) enum ChunkListError {
    /// Truncated, or an optional-data flag that is neither 0 nor 1.
    Xdr(XdrError),
    /// The Read list has more segments than the limit.
    ReadList(usize),
    /// The Write list has more chunks than the limit.
    WriteList(usize),
    /// A Write chunk or the Reply chunk has more segments than the limit.
    Chunk(usize),
}

/// One `HLOO` segment.
pub(crate) fn decode_segment(d: &mut Decoder<'_>) -> Result<Segment, XdrError> {
    Ok(Segment {
        handle: d.u32()?,
        length: d.u32()?,
        offset: d.u64()?,
    })
}

/// A counted array of segments (a Write chunk or the Reply chunk), at most `limit` long.
fn decode_write_chunk(d: &mut Decoder<'_>, limit: usize) -> Result<WriteChunk, ChunkListError> {
    let n = d.u32().map_err(ChunkListError::Xdr)? as usize;
    if n > limit {
        return Err(ChunkListError::Chunk(limit));
    }
    // `array_fixed` never allocates more than the remaining bytes can hold.
    d.array_fixed(n, decode_segment)
        .map_err(ChunkListError::Xdr)
}

/// The Read list, the Write list and the Reply chunk, each bounded by `lim`.
pub(crate) fn decode_chunk_lists(
    d: &mut Decoder<'_>,
    lim: &DecodeLimits,
) -> Result<Chunks, ChunkListError> {
    let present = |d: &mut Decoder<'_>| {
        d.optional(|_| Ok(()))
            .map(|o| o.is_some())
            .map_err(ChunkListError::Xdr)
    };
    let mut reads = Vec::new();
    while present(d)? {
        if reads.len() >= lim.max_read_segments {
            return Err(ChunkListError::ReadList(lim.max_read_segments));
        }
        let position = d.u32().map_err(ChunkListError::Xdr)?;
        let target = decode_segment(d).map_err(ChunkListError::Xdr)?;
        reads.push(ReadSegment { position, target });
    }
    let mut writes = Vec::new();
    while present(d)? {
        if writes.len() >= lim.max_write_chunks {
            return Err(ChunkListError::WriteList(lim.max_write_chunks));
        }
        writes.push(decode_write_chunk(d, lim.max_segments)?);
    }
    let reply = if present(d)? {
        Some(decode_write_chunk(d, lim.max_segments)?)
    } else {
        None
    };
    Ok(Chunks {
        reads,
        writes,
        reply,
    })
}

impl HeaderError {
    /// The version 1 error for an XDR failure: a bad optional-data flag keeps its value, every
    /// other failure (the decoder reads only words, hypers and flags) is a truncation.
    fn from_xdr(xid: u32, e: XdrError) -> Self {
        match e {
            XdrError::InvalidOptional { value, .. } => HeaderError::BadFlag { xid, value },
            _ => HeaderError::Truncated { xid },
        }
    }

    fn from_chunks(xid: u32, e: ChunkListError) -> Self {
        match e {
            ChunkListError::Xdr(e) => HeaderError::from_xdr(xid, e),
            ChunkListError::ReadList(limit)
            | ChunkListError::WriteList(limit)
            | ChunkListError::Chunk(limit) => HeaderError::TooManySegments { xid, limit },
        }
    }
}

impl Header {
    /// An RDMA_MSG header carrying `chunks`, or RDMA_NOMSG when `nomsg` (a version 2 message
    /// taken into version 1's shape).
    pub(crate) fn msg_or_nomsg(xid: u32, credits: u32, chunks: Chunks, nomsg: bool) -> Header {
        let body = if nomsg {
            Body::NoMsg(chunks)
        } else {
            Body::Msg(chunks)
        };
        Header::new(xid, credits, body)
    }

    /// A header with the given XID, version 1, credits and body.
    pub fn new(xid: u32, credits: u32, body: Body) -> Self {
        Header {
            xid,
            vers: RPCRDMA_VERSION,
            credits,
            body,
        }
    }

    /// Decode a header from the start of `buf` with the default limits. Returns the header
    /// and its length; for RDMA_MSG the Payload stream is `buf[len..]`.
    pub fn decode(buf: &[u8]) -> Result<(Header, usize), HeaderError> {
        Self::decode_with(buf, &DecodeLimits::default())
    }

    /// Decode with explicit limits. Never panics.
    pub fn decode_with(buf: &[u8], lim: &DecodeLimits) -> Result<(Header, usize), HeaderError> {
        // RFC 8166 §4.5 discards anything shorter than 28 bytes unparsed; this decoder
        // discards only what has no XID and version (under 8 bytes) and answers the rest
        // with an error (see docs/traceability.md).
        if buf.len() < 8 {
            return Err(HeaderError::TooShort(buf.len()));
        }
        let mut d = Decoder::new(buf);
        let xid = d.u32().map_err(|e| HeaderError::from_xdr(0, e))?;
        let xdr = |e| HeaderError::from_xdr(xid, e);
        let vers = d.u32().map_err(xdr)?;
        // RFC 8166 §4.5.1: only the version is checked before anything else is interpreted
        // (the error body layout is the one part that no version may change).
        if vers != RPCRDMA_VERSION {
            return Err(HeaderError::Version { xid, vers });
        }
        let credits = d.u32().map_err(xdr)?;
        let proc_ = d.u32().map_err(xdr)?;
        let chunks = |d: &mut Decoder<'_>| {
            decode_chunk_lists(d, lim).map_err(|e| HeaderError::from_chunks(xid, e))
        };
        let body = match proc_ {
            RDMA_MSG => Body::Msg(chunks(&mut d)?),
            RDMA_NOMSG => {
                let c = chunks(&mut d)?;
                if c.is_empty() {
                    //= specs/rfc8166.txt#section-4.2.4
                    //# Though any of these MAY be marked as not present, one MUST be present and
                    //# MUST hold the Payload stream for this RPC-over-RDMA message.
                    return Err(HeaderError::NoMsgWithoutChunks { xid });
                }
                Body::NoMsg(c)
            }
            RDMA_MSGP => {
                let align = d.u32().map_err(xdr)?;
                let thresh = d.u32().map_err(xdr)?;
                let chunks = chunks(&mut d)?;
                Body::MsgP {
                    align,
                    thresh,
                    chunks,
                }
            }
            RDMA_DONE => Body::Done,
            RDMA_ERROR => {
                let e = match d.u32() {
                    Ok(ERR_VERS) => match (d.u32(), d.u32()) {
                        (Ok(low), Ok(high)) => ErrorBody::Vers { low, high },
                        _ => return Err(HeaderError::MalformedError { xid }),
                    },
                    Ok(ERR_CHUNK) => ErrorBody::Chunk,
                    _ => return Err(HeaderError::MalformedError { xid }),
                };
                Body::Error(e)
            }
            _ => return Err(HeaderError::BadProc { xid, proc_ }),
        };
        Ok((
            Header {
                xid,
                vers,
                credits,
                body,
            },
            d.position(),
        ))
    }

    /// Exact number of bytes [`Header::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN
            + match &self.body {
                Body::Msg(c) | Body::NoMsg(c) => c.encoded_len(),
                Body::MsgP { chunks, .. } => 8 + chunks.encoded_len(),
                Body::Done => 0,
                Body::Error(ErrorBody::Vers { .. }) => 12,
                Body::Error(ErrorBody::Chunk) => 4,
            }
    }

    /// Append the header to `out`.
    //= specs/rfc8166.txt#section-4
    //# All RPC-over-RDMA header content is contained in the Transport stream; thus, it MUST be XDR
    //# encoded.
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(self.encoded_len());
        out.put_u32(self.xid);
        out.put_u32(self.vers);
        out.put_u32(self.credits);
        out.put_u32(self.body.proc_());
        match &self.body {
            Body::Msg(c) | Body::NoMsg(c) => c.encode(out),
            Body::MsgP {
                align,
                thresh,
                chunks,
            } => {
                out.put_u32(*align);
                out.put_u32(*thresh);
                chunks.encode(out);
            }
            Body::Done => {}
            Body::Error(ErrorBody::Vers { low, high }) => {
                out.put_u32(ERR_VERS);
                out.put_u32(*low);
                out.put_u32(*high);
            }
            Body::Error(ErrorBody::Chunk) => out.put_u32(ERR_CHUNK),
        }
    }

    /// The header as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b);
        b.freeze()
    }

    /// The RDMA_ERROR a receiver sends for `resp`, or `None` for [`ErrorResponse::Discard`].
    /// `credits` is the receiver's current grant (never zero, RFC 8166 §3.3.1).
    //= specs/rfc8166.txt#section-4.5
    //# o The rdma_xid field MUST contain the same XID that was in the rdma_xid field in the failing
    //# request;
    //= specs/rfc8166.txt#section-4.5
    //# o The rdma_vers field MUST contain the same version that was in the rdma_vers field in the
    //# failing request;
    //= specs/rfc8166.txt#section-4.5
    //# o The rdma_proc field MUST contain the value RDMA_ERROR; and
    pub fn error_reply(resp: ErrorResponse, credits: u32) -> Option<Header> {
        match resp {
            // RFC 8166 §4.5: rdma_xid and rdma_vers copy the failing message's values.
            ErrorResponse::ErrVers { xid, vers } => Some(Header {
                xid,
                vers,
                credits: credits.max(1),
                body: Body::Error(ErrorBody::Vers {
                    low: RPCRDMA_VERSION,
                    high: RPCRDMA_VERSION,
                }),
            }),
            ErrorResponse::ErrChunk { xid } => Some(Header::new(
                xid,
                credits.max(1),
                Body::Error(ErrorBody::Chunk),
            )),
            ErrorResponse::Discard => None,
        }
    }
}

#[cfg(test)]
mod tests;
