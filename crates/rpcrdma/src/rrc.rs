//! Responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02) on top of
//! version 2, in the reading of `shared/facts/rpcrdma-v2-rrc-nfsv4.md` item 8:
//!
//! - the capability is an experimental transport property ([`PROPID_RRC`], cel-05 §6.4.2),
//!   announced in RDMA2_CONNPROP by each side that supports it; the draft's §6: "responder-
//!   provided Read chunks MUST be used only when both peers support them";
//! - the pull-completion notification ("RDMA_DONE", draft §4.1.3) is an RDMA2_OPTIONAL message
//!   of the experimental opttype [`OPTTYPE_PULL_DONE`], CALL direction, whose `rdma_xid` is the
//!   reply's XID and whose `rdma_optinfo` is one word: how the pull went ([`PullStatus`]).
//!
//! Credits (draft §5.2.3 leaves this open): the notification carries no credit, like the
//! property messages (gap 4 of cel-05); a Responder that announced the capability keeps one
//! receive per chunk its table may hold ([`RrcConfig::max_chunks`]) beyond its credits, so the
//! notifications of every waiting chunk find a receive.
//!
//! This module has the wire pieces (a checked decoder that never panics) and the Responder's
//! table of chunks waiting for their notification ([`PullTable`]), bounded in count and bytes,
//! with a pull deadline per chunk. The engines use them in `responder/rrc.rs` and
//! `requester/pull.rs`.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::engine::{Region, RegionId, XidMap};
use crate::header_v2::{Body2, Direction, Header2, Optional};
use crate::props::PropId;

/// The capability property (experimental range, cel-05 §6.4.2: 0xFFFFFF00-0xFFFFFFFF). Its
/// `rdma_data` is one `uint32`: 1 when the sender supports responder-provided Read chunks in
/// both roles it plays, 0 (or empty data, the default) when it does not. Other values are read
/// as "not this property" and ignored, as an unknown property is (§6.3.1).
pub const PROPID_RRC: PropId = 0xFFFF_FF01;

/// The opttype of the pull-completion notification (an RDMA2_OPTIONAL message). cel-05 has no
/// experimental opttype range; this reading takes the property range's first value after 0.
pub const OPTTYPE_PULL_DONE: u32 = 0xFFFF_FF01;

/// How a Requester's pull went, carried in the notification (information only: the Responder
/// invalidates the chunk whatever it says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullStatus {
    /// The RDMA Reads completed and the reply was delivered.
    Pulled = 0,
    /// An RDMA Read failed, or the chunk was refused (too large, malformed).
    Failed = 1,
    /// The reply's XID names no call the Requester waits for (draft §4.1.3).
    UnknownXid = 2,
    /// The Requester does not support responder-provided Read chunks (draft §4.1.3).
    Unsupported = 3,
}

impl PullStatus {
    fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(PullStatus::Pulled),
            1 => Some(PullStatus::Failed),
            2 => Some(PullStatus::UnknownXid),
            3 => Some(PullStatus::Unsupported),
            _ => None,
        }
    }
}

/// Why an `rdma_optinfo` is not a pull-completion notification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PullDoneError {
    #[error("pull-completion notification of {0} bytes (4 expected)")]
    Length(usize),
    #[error("pull-completion status {0} is not defined")]
    Status(u32),
}

/// A pull-completion notification: the reply's XID and how the pull went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullDone {
    pub xid: u32,
    pub status: PullStatus,
}

impl PullDone {
    /// The `rdma_optinfo` of a notification: exactly one word holding a defined status.
    pub fn decode_info(xid: u32, optinfo: &[u8]) -> Result<Self, PullDoneError> {
        let w: [u8; 4] = optinfo
            .try_into()
            .map_err(|_| PullDoneError::Length(optinfo.len()))?;
        let v = u32::from_be_bytes(w);
        let status = PullStatus::from_u32(v).ok_or(PullDoneError::Status(v))?;
        Ok(PullDone { xid, status })
    }

    /// The notification in an RDMA2_OPTIONAL, if `o` is one (`None` for other opttypes).
    pub fn from_optional(xid: u32, o: &Optional) -> Option<Result<Self, PullDoneError>> {
        (o.opttype == OPTTYPE_PULL_DONE).then(|| Self::decode_info(xid, &o.optinfo))
    }

    /// The whole message: an RDMA2_OPTIONAL in the CALL direction (cel-05 §7.2.2: an OPTIONAL
    /// without a payload is CALL from a requester). `credits` is the requester's request.
    pub fn to_header(&self, credits: u32) -> Header2 {
        let mut info = BytesMut::with_capacity(4);
        info.extend_from_slice(&(self.status as u32).to_be_bytes());
        Header2::new(
            self.xid,
            credits,
            Body2::Optional(Optional {
                direction: Direction::Call,
                opttype: OPTTYPE_PULL_DONE,
                optinfo: info.freeze(),
            }),
        )
    }

    /// The encoded message.
    pub fn to_bytes(&self, credits: u32) -> Bytes {
        self.to_header(credits).to_bytes()
    }
}

/// Which way a Requester that announced the capability asks for large replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum ReplyMode {
    /// Write chunks for DDP-eligible results and a Reply chunk when the reply may exceed the
    /// inline threshold (RFC 8166; today's behaviour).
    #[default]
    WriteChunk,
    /// Neither Write chunks nor a Reply chunk once the server announced the capability: a
    /// reply larger than the inline threshold comes back as a responder-provided Read chunk
    /// (draft §5.3.1, "Responder-provided Read chunk"). Against a server that did not
    /// announce the capability the Requester keeps to Write and Reply chunks.
    ReadChunk,
    /// Neither Write chunks nor a Reply chunk on any settled version 2 connection, announced
    /// or not (draft §5.3.1, "Send-only"): a server without the capability answers a reply
    /// larger than the inline threshold with REPLY_RESOURCE (draft §6).
    SendOnly,
}

impl ReplyMode {
    /// `write-chunk`, `read-chunk` or `send-only`.
    pub fn name(self) -> &'static str {
        match self {
            ReplyMode::WriteChunk => "write-chunk",
            ReplyMode::ReadChunk => "read-chunk",
            ReplyMode::SendOnly => "send-only",
        }
    }
}

impl std::fmt::Display for ReplyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ReplyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write-chunk" => Ok(ReplyMode::WriteChunk),
            "read-chunk" => Ok(ReplyMode::ReadChunk),
            "send-only" => Ok(ReplyMode::SendOnly),
            other => Err(format!(
                "reply mode {other:?}: expected write-chunk, read-chunk or send-only"
            )),
        }
    }
}

/// Settings of responder-provided Read chunks, for both roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RrcConfig {
    /// Announce the capability (version 2 only) and honour it. Off by default: a peer that
    /// did not announce it, and every version 1 peer, sees exactly the behaviour without it.
    pub enabled: bool,
    /// Requester: how it asks for large replies once both sides announced the capability.
    pub reply_mode: ReplyMode,
    /// Responder: chunks waiting for their notification, at most (default 64, the default
    /// credit grant: one per call in progress). A reply that finds the table full waits for
    /// a slot (backpressure); it holds its call's credit meanwhile.
    pub max_chunks: usize,
    /// Responder: bytes of waiting chunks, at most (default 64 MiB). A single reply larger than
    /// this is answered REPLY_RESOURCE.
    pub max_bytes: usize,
    /// Responder: how long a chunk waits for its notification before its memory is invalidated
    /// anyway (draft §4.1.3: "a responder can choose to invalidate its Read chunks after
    /// waiting for a short period"). Default 30 s.
    pub pull_timeout: Duration,
    /// Requester: the largest reply it pulls (default 64 MiB); a larger chunk is not pulled,
    /// the call fails and the notification goes at once.
    pub max_reply: usize,
    /// Requester: segments of one chunk it accepts (default 64).
    pub max_segments: usize,
    /// Requester: RDMA Reads it keeps outstanding at once (its ORD; default 16). The driver
    /// posts a chunk's segments in windows of this many.
    pub ord: usize,
}

impl Default for RrcConfig {
    fn default() -> Self {
        RrcConfig {
            enabled: false,
            reply_mode: ReplyMode::WriteChunk,
            max_chunks: 64,
            max_bytes: 64 << 20,
            pull_timeout: Duration::from_secs(30),
            max_reply: 64 << 20,
            max_segments: 64,
            ord: 16,
        }
    }
}

/// One chunk waiting for its notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub region: Region,
    pub len: usize,
    pub deadline: Instant,
}

/// What [`PullTable::insert`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// There is room: the chunk may be registered and sent.
    Room,
    /// Not now: wait for a slot (backpressure).
    Full,
    /// Never: the chunk alone exceeds the byte bound.
    TooLarge,
}

/// The Responder's chunks waiting for their pull-completion notification, by XID (draft
/// §5.4.3), bounded in count and bytes.
#[derive(Debug, Default)]
pub struct PullTable {
    waiting: XidMap<Waiting>,
    bytes: usize,
    max_chunks: usize,
    max_bytes: usize,
}

impl PullTable {
    /// A table of at most `max_chunks` chunks and `max_bytes` bytes.
    pub fn new(max_chunks: usize, max_bytes: usize) -> Self {
        PullTable {
            waiting: XidMap::default(),
            bytes: 0,
            max_chunks,
            max_bytes,
        }
    }

    /// Whether a chunk of `len` bytes fits now, later, or never. An XID that already has a
    /// chunk waiting (a retransmitted call answered again) waits for the first to go.
    pub fn admit(&self, xid: u32, len: usize) -> Admit {
        if len > self.max_bytes || self.max_chunks == 0 {
            return Admit::TooLarge;
        }
        if self.waiting.contains_key(&xid)
            || self.waiting.len() >= self.max_chunks
            || self.bytes.saturating_add(len) > self.max_bytes
        {
            return Admit::Full;
        }
        Admit::Room
    }

    /// Record a chunk [`PullTable::admit`] found room for. Returns it back when there is no
    /// room after all.
    pub fn insert(&mut self, xid: u32, w: Waiting) -> Result<(), Waiting> {
        if self.admit(xid, w.len) != Admit::Room {
            return Err(w);
        }
        self.bytes += w.len;
        self.waiting.insert(xid, w);
        Ok(())
    }

    /// The chunk of `xid`, taken out (its notification came).
    pub fn remove(&mut self, xid: u32) -> Option<Waiting> {
        let w = self.waiting.remove(&xid)?;
        self.bytes -= w.len;
        Some(w)
    }

    /// The chunks whose deadline is at or before `now`, taken out, in XID order.
    pub fn expire(&mut self, now: Instant) -> Vec<(u32, Waiting)> {
        let mut due: Vec<u32> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(x, _)| *x)
            .collect();
        due.sort_unstable();
        due.into_iter()
            .filter_map(|x| self.remove(x).map(|w| (x, w)))
            .collect()
    }

    /// Every chunk, taken out (the connection is gone).
    pub fn drain(&mut self) -> Vec<(u32, Waiting)> {
        self.bytes = 0;
        let mut all: Vec<(u32, Waiting)> = self.waiting.drain().collect();
        all.sort_unstable_by_key(|(x, _)| *x);
        all
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.values().map(|w| w.deadline).min()
    }

    /// Chunks waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// No chunk waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Bytes of the chunks waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The region of the chunk of `xid`, if one waits.
    pub fn region_of(&self, xid: u32) -> Option<RegionId> {
        self.waiting.get(&xid).map(|w| w.region.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::Segment;

    fn w(id: u64, len: usize, at: Instant) -> Waiting {
        Waiting {
            region: Region {
                id,
                segments: vec![Segment {
                    handle: id as u32,
                    length: len as u32,
                    offset: 0,
                }],
            },
            len,
            deadline: at,
        }
    }

    #[test]
    fn notifications_round_trip_and_reject_what_is_not_one() {
        for s in [
            PullStatus::Pulled,
            PullStatus::Failed,
            PullStatus::UnknownXid,
            PullStatus::Unsupported,
        ] {
            let n = PullDone { xid: 77, status: s };
            let b = n.to_bytes(8);
            let (h, used) = Header2::decode(&b).unwrap();
            assert_eq!(used, b.len());
            let Body2::Optional(o) = &h.body else {
                panic!("not OPTIONAL")
            };
            assert_eq!(o.direction, Direction::Call);
            assert_eq!(PullDone::from_optional(h.xid, o), Some(Ok(n)));
        }
        assert_eq!(
            PullDone::decode_info(1, &[0, 0, 0]),
            Err(PullDoneError::Length(3))
        );
        assert_eq!(
            PullDone::decode_info(1, &[0, 0, 0, 9]),
            Err(PullDoneError::Status(9))
        );
        assert_eq!(
            PullDone::decode_info(1, &[0, 0, 0, 0, 0]),
            Err(PullDoneError::Length(5))
        );
    }

    #[test]
    fn the_table_is_bounded_in_count_and_bytes() {
        let t0 = Instant::now();
        let mut t = PullTable::new(2, 100);
        assert_eq!(t.admit(1, 101), Admit::TooLarge);
        assert!(t.insert(1, w(1, 60, t0)).is_ok());
        assert_eq!(t.admit(1, 10), Admit::Full, "same XID waits");
        assert_eq!(t.admit(2, 41), Admit::Full, "bytes");
        assert!(t.insert(2, w(2, 40, t0 + Duration::from_secs(1))).is_ok());
        assert_eq!(t.admit(3, 0), Admit::Full, "count");
        assert!(t.insert(3, w(3, 0, t0)).is_err());
        assert_eq!((t.len(), t.bytes()), (2, 100));
        assert_eq!(t.next_deadline(), Some(t0));
        let due = t.expire(t0);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0, 1);
        assert_eq!((t.len(), t.bytes()), (1, 40));
        assert!(t.remove(9).is_none());
        assert_eq!(t.remove(2).map(|w| w.len), Some(40));
        assert!(t.is_empty());
        assert_eq!(t.bytes(), 0);
    }
}
