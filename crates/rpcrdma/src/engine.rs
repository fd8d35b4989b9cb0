//! Pieces shared by the sans-IO [`crate::requester`] and [`crate::responder`] engines:
//! configuration, the memory-registration interface, and Payload-stream reassembly.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use bytes::{Bytes, BytesMut};

use crate::header::Segment;
use crate::privdata::{self, Negotiated, PrivateData};

/// Settings of one RPC-over-RDMA endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Forward credits: requested by a Requester, granted by a Responder (RFC 8166 §3.3.1).
    /// Linux grants 64.
    pub credits: u32,
    /// Backward-direction credits (RFC 8167 §4.1; Linux uses 2 on the server, 16 slots on
    /// the client).
    pub back_credits: u32,
    /// Our receive buffer size (inline receive threshold), advertised with RFC 8797.
    pub inline_recv: u32,
    /// The largest message we are willing to Send; lowered to the peer's receive size.
    pub inline_send: u32,
    /// We accept Send With Invalidate (RFC 8797 flag bit 0).
    pub accept_remote_invalidate: bool,
    /// DDP-eligible items shorter than this stay inline.
    pub ddp_min: usize,
    /// Read chunks (other than Position-Zero) a Requester uses per call. Linux: 1.
    pub max_read_chunks: usize,
    /// Write chunks a Requester provides per call. Linux: 1.
    pub max_write_chunks: usize,
    /// Reply chunk size when the Upper-Layer Binding cannot bound the reply.
    pub default_reply_chunk: usize,
    /// Largest reassembled call a Responder accepts (sum of inline and Read chunk bytes).
    pub max_call_size: usize,
    /// The highest RPC-over-RDMA version a Responder serves (it serves 1 up to this; cel-05
    /// §8.3 answers each client in the version of its calls). Version 1 only: exactly the
    /// behaviour of a version 1 server, ERR_VERS [1, 1] to a version 2 probe.
    pub max_version: crate::version::Version,
    /// What a Requester offers: version 1 only, version 2 only, or a version 2 probe that
    /// falls back to version 1 (cel-05 §8). Default: [`crate::version::default_policy`]
    /// (version 1 unless the process set another).
    pub version_policy: crate::version::VersionPolicy,
    /// Responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02), version 2
    /// only; off by default ([`crate::rrc::RrcConfig`]).
    pub rrc: crate::rrc::RrcConfig,
}

/// The receive buffers' size by default: 8 KiB, so that a 4 KiB NFS READ or WRITE (with its RPC
/// and NFS headers, about 4.3 KiB) goes whole in one Send, with no chunk to register and no
/// RDMA Read or Write round trip. RFC 8166 §3.3.3 asks for at least 1024 and version 2 (cel-05
/// §3.3) for 4096; Linux's 4096 keeps a 4 KiB I/O in chunks. A peer's own size still bounds
/// what it is sent (RFC 8797 private data, RBSIZ): with Linux's 4096 nothing changes.
pub const DEFAULT_INLINE_RECV: u32 = 8192;
/// The largest message this endpoint is willing to Send by default; what it sends is the lower
/// of this and the peer's announced receive size.
pub const DEFAULT_INLINE_SEND: u32 = 65536;

impl Default for Config {
    fn default() -> Self {
        Config {
            credits: 64,
            back_credits: 2,
            inline_recv: DEFAULT_INLINE_RECV,
            inline_send: DEFAULT_INLINE_SEND,
            accept_remote_invalidate: true,
            ddp_min: 1024,
            max_read_chunks: 1,
            max_write_chunks: 1,
            default_reply_chunk: 1 << 20,
            max_call_size: 4 << 20,
            max_version: crate::version::Version::V2,
            version_policy: crate::version::default_policy(),
            rrc: crate::rrc::RrcConfig::default(),
        }
    }
}

impl Config {
    /// The size of the receive buffers this endpoint posts: `inline_recv`, at least 1024
    /// (RFC 8166 §3.3.3), and at least 4096 when it may speak version 2 in its role
    /// (`requester`: its version policy; otherwise: `max_version`), since cel-05 §3.3 says
    /// receivers "MUST support an inline threshold of 4096 bytes". The default `inline_recv`
    /// ([`DEFAULT_INLINE_RECV`], 8192) is above both floors.
    pub fn recv_buffer_size(&self, requester: bool) -> u32 {
        let v2 = if requester {
            self.version_policy != crate::version::VersionPolicy::V1
        } else {
            self.max_version == crate::version::Version::V2
        };
        let floor = if v2 {
            crate::props::DEFAULT_RBSIZ
        } else {
            privdata::DEFAULT_INLINE
        };
        self.inline_recv.max(floor)
    }

    /// The RFC 8797 private data this endpoint sends.
    pub fn private_data(&self) -> PrivateData {
        PrivateData {
            remote_invalidate: self.accept_remote_invalidate,
            send_size: self.inline_send,
            recv_size: self.inline_recv,
        }
    }

    /// Thresholds once the peer's private data (if any) is known.
    pub fn negotiate(&self, peer: Option<PrivateData>) -> Negotiated {
        Negotiated::new(self.inline_send, self.inline_recv, peer)
    }
}

/// Connection parameters as the engines use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Largest message we may Send (the peer's inline receive threshold).
    pub inline_send: usize,
    /// Our receive buffers' size.
    pub inline_recv: usize,
    /// Largest message the peer may send us inline (our receive size capped by its send
    /// size): the Requester's bound for an inline reply (RFC 8166 §3.3.2, RFC 8797).
    pub reply_inline: usize,
    /// The peer accepts Send With Invalidate.
    pub peer_remote_invalidate: bool,
}

impl From<Negotiated> for Params {
    fn from(n: Negotiated) -> Self {
        Params {
            inline_send: n.send_inline as usize,
            inline_recv: n.recv_inline as usize,
            reply_inline: n.peer_send_inline as usize,
            peer_remote_invalidate: n.peer_remote_invalidate,
        }
    }
}

impl Default for Params {
    /// RFC 8166 §3.3.3: without a discovery mechanism, senders assume 1024 bytes.
    fn default() -> Self {
        Params {
            inline_send: privdata::DEFAULT_INLINE as usize,
            inline_recv: privdata::DEFAULT_INLINE as usize,
            reply_inline: privdata::DEFAULT_INLINE as usize,
            peer_remote_invalidate: false,
        }
    }
}

/// Identifies one registration made through a [`Registrar`].
pub type RegionId = u64;

/// Registered memory, as the peer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub id: RegionId,
    /// The segments that describe it, in order (one unless the provider splits it).
    pub segments: Vec<Segment>,
}

/// A memory registration failed or could not be undone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegError {
    #[error("memory registration failed: {0}")]
    Register(String),
    #[error("memory invalidation failed: {0}")]
    Invalidate(String),
    #[error("unknown region {0}")]
    Unknown(RegionId),
}

/// Memory registration, done by the verbs layer (which also picks the handles, so they are
/// unpredictable: RFC 8166 §8.1.2). The engines call it synchronously; a verbs driver posts
/// FastReg / LocalInv work requests on the same queue pair ahead of the Send.
pub trait Registrar {
    /// Register `data` for RDMA Read by the peer (a Read chunk source).
    fn register_source(&mut self, data: Bytes) -> Result<Region, RegError>;
    /// Register `len` bytes for RDMA Write by the peer (a Write or Reply chunk).
    fn register_sink(&mut self, len: usize) -> Result<Region, RegError>;
    /// The first `len` bytes the peer wrote into a sink region.
    fn sink_contents(&mut self, id: RegionId, len: usize) -> Result<Bytes, RegError>;
    /// `prefix`, the first `len` bytes the peer wrote into a sink region, their XDR round-up
    /// zeros, then `suffix`, as one buffer built around the written bytes where they lie, when
    /// the region was registered with room on both sides; `Ok(None)` when it was not (the
    /// caller then copies). This is how a reply's one Write chunk (an NFS READ's data) rejoins
    /// its inline results without moving the data.
    fn sink_framed(
        &mut self,
        id: RegionId,
        len: usize,
        prefix: &[u8],
        suffix: &[u8],
    ) -> Result<Option<Bytes>, RegError> {
        let _ = (id, len, prefix, suffix);
        Ok(None)
    }
    /// Invalidate (fence) and release a region. `remote` is true when the peer already
    /// invalidated it with Send With Invalidate; only the local release remains.
    fn invalidate(&mut self, id: RegionId, remote: bool) -> Result<(), RegError>;
}

/// A registrar shared between an engine and whoever watches it (a test reading the counters
/// of a [`MemRegistrar`], a peer reading its memory).
impl<R: Registrar + ?Sized> Registrar for std::sync::Arc<parking_lot::Mutex<R>> {
    fn register_source(&mut self, data: Bytes) -> Result<Region, RegError> {
        self.lock().register_source(data)
    }
    fn register_sink(&mut self, len: usize) -> Result<Region, RegError> {
        self.lock().register_sink(len)
    }
    fn sink_contents(&mut self, id: RegionId, len: usize) -> Result<Bytes, RegError> {
        self.lock().sink_contents(id, len)
    }
    fn sink_framed(
        &mut self,
        id: RegionId,
        len: usize,
        prefix: &[u8],
        suffix: &[u8],
    ) -> Result<Option<Bytes>, RegError> {
        self.lock().sink_framed(id, len, prefix, suffix)
    }
    fn invalidate(&mut self, id: RegionId, remote: bool) -> Result<(), RegError> {
        self.lock().invalidate(id, remote)
    }
}

/// Round `n` up to a multiple of four.
pub(crate) fn padded(n: usize) -> usize {
    xdr::padded(n)
}

/// Why a Payload stream and its chunks do not fit together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mismatch;

/// Put chunk data back into a Payload stream. `chunks` holds (Position, data) in increasing
/// Position order; each Position is the offset in the reassembled stream where the chunk's
/// contents begin. Each chunk is followed by XDR round-up zeros: a reduced item's padding is not in
/// the Payload stream (RFC 8166 §3.4.4.4) and need not be in its Read chunk (§3.4.5.2), and the
/// items after it begin on four-byte alignment.
///
/// Without chunks the Payload stream is the message: it is handed on as it is, no copy.
pub(crate) fn reassemble(inline: &Bytes, chunks: &[(usize, Bytes)]) -> Result<Bytes, Mismatch> {
    if chunks.is_empty() {
        return Ok(inline.clone());
    }
    let extra: usize = chunks.iter().map(|(_, d)| padded(d.len())).sum();
    let mut out = BytesMut::with_capacity(inline.len() + extra);
    let mut at = 0usize;
    for (pos, data) in chunks {
        if *pos < out.len() {
            return Err(Mismatch);
        }
        let take = pos - out.len();
        let end = at.checked_add(take).ok_or(Mismatch)?;
        out.extend_from_slice(inline.get(at..end).ok_or(Mismatch)?);
        at = end;
        out.extend_from_slice(data);
        out.resize(out.len() + xdr::pad_len(data.len()), 0);
    }
    out.extend_from_slice(inline.get(at..).ok_or(Mismatch)?);
    Ok(out.freeze())
}

/// Positions of reduced items in the unreduced stream: the reduced Position plus the padded
/// lengths of the items before it.
//= specs/rfc8166.txt#section-3.4.5
//# The Position value MUST be computed from the beginning of the unreduced Payload stream, which
//# begins at Position zero.
pub(crate) fn unreduced_positions(items: &[xdr::ReducedItem]) -> Vec<usize> {
    let mut shift = 0;
    items
        .iter()
        .map(|r| {
            let p = r.position + shift;
            shift += r.padded_len();
            p
        })
        .collect()
}

/// One RDMA Write: the target segment (with the length to write) and the bytes.
pub(crate) type SegmentWrite = (Segment, Bytes);

/// Split `data` over `segments` in array order (RFC 8166 §3.4.6: "filling the chunk contiguously
/// and in segment array order"). Returns the (segment, bytes) writes and the segments with updated lengths; unused
/// segments get length zero. `None` when the data does not fit.
//= specs/rfc8166.txt#section-3.4.6
//# The Responder MUST copy the segment count and all segments from the Requester-provided Write
//# chunk into the RPC Reply message's Transport header.
pub(crate) fn fill_segments(
    segments: &[Segment],
    data: &Bytes,
) -> Option<(Vec<SegmentWrite>, Vec<Segment>)> {
    let mut writes = Vec::new();
    let mut updated = Vec::with_capacity(segments.len());
    let mut at = 0usize;
    for s in segments {
        let n = (s.length as usize).min(data.len() - at);
        if n > 0 {
            let mut w = *s;
            w.length = n as u32;
            writes.push((w, data.slice(at..at + n)));
        }
        updated.push(Segment {
            length: n as u32,
            ..*s
        });
        at += n;
    }
    (at == data.len()).then_some((writes, updated))
}

/// An in-memory [`Registrar`] for tests and fuzzing: handles come from a counter mixed with a
/// per-instance key so they are not trivially guessable, and it checks that every region is
/// invalidated exactly once.
#[derive(Debug, Default)]
pub struct MemRegistrar {
    next: u64,
    key: u32,
    regions: std::collections::HashMap<RegionId, (u32, BytesMut, bool)>,
    /// Registrations made so far.
    pub registered: u64,
    /// Invalidations (local and remote) so far.
    pub invalidated: u64,
    /// Invalidations that arrived by Send With Invalidate.
    pub remote_invalidated: u64,
}

impl MemRegistrar {
    /// A registrar whose handles are derived from `key`.
    pub fn new(key: u32) -> Self {
        MemRegistrar {
            key,
            ..Default::default()
        }
    }

    fn handle_of(&self, id: u64) -> u32 {
        (id as u32).wrapping_mul(0x9e37_79b9) ^ self.key
    }

    fn find(&mut self, handle: u32) -> Option<&mut (u32, BytesMut, bool)> {
        self.regions.values_mut().find(|r| r.0 == handle)
    }

    /// Peer side: RDMA Read `seg` (fails on an unknown handle or out-of-range access,
    /// like a Remote Access error).
    pub fn rdma_read(&mut self, seg: &Segment) -> Option<Bytes> {
        let r = self.find(seg.handle)?;
        if r.2 {
            return None;
        }
        let off = usize::try_from(seg.offset).ok()?;
        let end = off.checked_add(seg.length as usize)?;
        r.1.get(off..end).map(Bytes::copy_from_slice)
    }

    /// Peer side: RDMA Write `data` at `seg`.
    pub fn rdma_write(&mut self, seg: &Segment, data: &[u8]) -> bool {
        let Some(r) = self.find(seg.handle) else {
            return false;
        };
        if !r.2 {
            return false;
        }
        let Ok(off) = usize::try_from(seg.offset) else {
            return false;
        };
        match r.1.get_mut(off..off + data.len()) {
            Some(dst) if data.len() <= seg.length as usize => {
                dst.copy_from_slice(data);
                true
            }
            _ => false,
        }
    }

    /// Regions still registered.
    pub fn live(&self) -> usize {
        self.regions.len()
    }

    /// The region holding `handle`, if it is still registered.
    pub fn region_of(&self, handle: u32) -> Option<RegionId> {
        self.regions
            .iter()
            .find(|(_, r)| r.0 == handle)
            .map(|(id, _)| *id)
    }

    fn add(&mut self, mem: BytesMut, sink: bool) -> Region {
        self.next += 1;
        let id = self.next;
        let handle = self.handle_of(id);
        let len = mem.len() as u32;
        self.regions.insert(id, (handle, mem, sink));
        self.registered += 1;
        Region {
            id,
            segments: vec![Segment {
                handle,
                length: len,
                offset: 0,
            }],
        }
    }
}

impl Registrar for MemRegistrar {
    fn register_source(&mut self, data: Bytes) -> Result<Region, RegError> {
        Ok(self.add(BytesMut::from(&data[..]), false))
    }

    fn register_sink(&mut self, len: usize) -> Result<Region, RegError> {
        Ok(self.add(BytesMut::zeroed(len), true))
    }

    fn sink_contents(&mut self, id: RegionId, len: usize) -> Result<Bytes, RegError> {
        let r = self.regions.get(&id).ok_or(RegError::Unknown(id))?;
        r.1.get(..len)
            .map(Bytes::copy_from_slice)
            .ok_or(RegError::Unknown(id))
    }

    fn invalidate(&mut self, id: RegionId, remote: bool) -> Result<(), RegError> {
        self.regions.remove(&id).ok_or(RegError::Unknown(id))?;
        self.invalidated += 1;
        if remote {
            self.remote_invalidated += 1;
        }
        Ok(())
    }
}

/// A map keyed by this endpoint's own XIDs (calls it sent): one multiplication per lookup
/// instead of SipHash. Keys come from a counter here, not from the peer, so there is no
/// collision flooding to defend against; lookups of a peer's XID that is not there stay cheap.
pub(crate) type XidMap<V> = IdMap<u32, V>;

/// A map keyed by this endpoint's own counters (XIDs it sent, ids of calls it tracks) or by
/// keys it alone inserts; see [`XidMap`].
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<verbs::mem::IdHasher>>;

/// The set form of [`IdMap`].
pub(crate) type IdSet<K> = std::collections::HashSet<K, BuildHasherDefault<verbs::mem::IdHasher>>;

/// A set of the peer's XIDs (the calls a Responder is executing). The peer chooses these, so
/// the hash takes a key drawn once per process and a peer cannot aim its XIDs at one bucket
/// without knowing it; the set is also bounded by the credits granted
/// ([`crate::responder::Responder`] refuses a call beyond them), so even a full collision
/// costs a lookup no more than a walk of that many entries. One multiplication instead of
/// SipHash's hundred-odd instructions, twice per call.
pub(crate) type PeerXidSet = std::collections::HashSet<u32, verbs::mem::KeyedIds>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_xid_sets_hold_what_they_are_given_and_spread_it() {
        use std::hash::BuildHasher;
        // One key per process: two sets hash an XID alike.
        let (a, b) = (
            verbs::mem::KeyedIds::default(),
            verbs::mem::KeyedIds::default(),
        );
        assert_eq!(a.hash_one(7u32), b.hash_one(7u32));
        // A credit's worth of consecutive XIDs (as Linux numbers its calls) and a spread of
        // others: every one found, removed, and gone.
        let xids: Vec<u32> = (1000..1064).chain((0..64).map(|i| i << 26)).collect();
        let mut set = PeerXidSet::default();
        for &x in &xids {
            assert!(set.insert(x));
        }
        assert_eq!(set.len(), xids.len());
        // The table indexes with the low bits: 64 consecutive XIDs spread over 64 buckets, and
        // so do XIDs that differ only in their top bits (a random function fills about 40; a
        // hash that ignored the top bits would fill one).
        for group in xids.chunks(64) {
            let buckets: std::collections::HashSet<u64> =
                group.iter().map(|&x| a.hash_one(x) & 63).collect();
            assert!(buckets.len() >= 24, "{} buckets of 64", buckets.len());
        }
        for &x in &xids {
            assert!(set.remove(&x));
            assert!(!set.contains(&x));
        }
        assert!(set.is_empty());
    }

    #[test]
    fn reassembly_rounds_up() {
        let out = reassemble(
            &Bytes::from_static(b"abcdWXYZ"),
            &[(4, Bytes::from_static(b"123"))],
        )
        .unwrap();
        assert_eq!(&out[..], b"abcd123\0WXYZ");
        assert!(reassemble(&Bytes::from_static(b"ab"), &[(8, Bytes::from_static(b"1"))]).is_err());
        let two = reassemble(
            &Bytes::from_static(b"aaaabbbb"),
            &[
                (4, Bytes::from_static(b"1")),
                (12, Bytes::from_static(b"22222")),
            ],
        )
        .unwrap();
        assert_eq!(&two[..], b"aaaa1\0\0\0bbbb22222\0\0\0");
        // No chunk: the stream itself, not a copy of it.
        let stream = Bytes::from_static(b"abcd");
        let same = reassemble(&stream, &[]).unwrap();
        assert_eq!(same.as_ptr(), stream.as_ptr());
    }

    //= specs/rfc8166.txt#section-3.4.6
    //= type=test
    //# The Responder MUST copy the segment count and all segments from the Requester-provided Write
    //# chunk into the RPC Reply message's Transport header.
    #[test]
    fn segments_fill_in_order() {
        let segs = [
            Segment {
                handle: 1,
                length: 3,
                offset: 0,
            },
            Segment {
                handle: 2,
                length: 8,
                offset: 0,
            },
            Segment {
                handle: 3,
                length: 8,
                offset: 0,
            },
        ];
        let (w, u) = fill_segments(&segs, &Bytes::from_static(b"hello")).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(&w[1].1[..], b"lo");
        assert_eq!(
            u.iter().map(|s| s.length).collect::<Vec<_>>(),
            vec![3, 2, 0]
        );
        assert!(fill_segments(&segs[..1], &Bytes::from_static(b"hello")).is_none());
    }
}
