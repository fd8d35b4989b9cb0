//! The Upper-Layer Binding (ULB) contract (RFC 8166 §6).
//!
//! An RPC program that runs over RPC-over-RDMA declares, through this trait, which XDR items of
//! its calls and replies are DDP-eligible and how large a reply can be. The transport never
//! reduces anything else (RFC 8166 §3.4.2: "All other XDR data items MUST NOT be reduced").
//!
//! How the pieces meet:
//! - Requester, call side: the program's argument encoder calls
//!   [`xdr::Encoder::put_ddp_opaque`] for eligible items only; the transport picks the policy.
//! - Requester, reply side: the caller fills [`oncrpc::ReplyExpectation`] (maximum reply size and
//!   the maximum size of each DDP-eligible reply item) so the transport can provision Write
//!   chunks and a Reply chunk before sending (RFC 8166 §6.2, §4.3.3).
//! - Responder, call side: [`UpperLayerBinding::call_ddp_items`] locates the eligible items in
//!   the received arguments so the transport can check every Read chunk's Position against them
//!   (a chunk elsewhere is a DDP-eligibility violation: GARBAGE_ARGS, RFC 8166 §4.5.2).
//! - Responder, reply side: the program's result encoder calls `put_ddp_opaque` for eligible
//!   items, and the transport's [`xdr::DdpPolicy`] decides whether they land in Write chunks.
//!
//! RFC 8166 §6: "Each RPC Program and Version tuple that utilizes RPC-over-RDMA version 1
//! needs to have a ULB specification." The Requester therefore refuses calls of
//! programs (and versions, [`UpperLayerBinding::covers_version`]) it holds no binding for.
//! Programs whose binding makes nothing DDP-eligible use [`InlineBinding`].

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::{Range, RangeInclusive};
use std::sync::Arc;

/// Chunk-complexity limits a Responder accepts (RFC 8267 §6.4.2 defaults for NFS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimits {
    /// Read chunks with a non-zero Position, per call.
    pub max_read_chunks: usize,
    /// Position-Zero Read chunks per call (0 or 1).
    pub max_position_zero_chunks: usize,
    /// Write chunks per call.
    pub max_write_chunks: usize,
    /// Segments per chunk (Read, Write or Reply chunk).
    pub max_segments: usize,
}

impl Default for ChunkLimits {
    /// RFC 8267 §6.4.2: one Position-Zero Read chunk plus one other Read chunk, one Write chunk,
    /// and 16 segments per chunk.
    fn default() -> Self {
        ChunkLimits {
            max_read_chunks: 1,
            max_position_zero_chunks: 1,
            max_write_chunks: 1,
            max_segments: 16,
        }
    }
}

/// Why a ULB could not classify a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UlbError {
    /// The arguments do not decode for this procedure (the transport answers GARBAGE_ARGS).
    #[error("arguments do not decode: {0}")]
    Garbage(String),
    /// The version or procedure is not covered by the binding (no item is eligible).
    #[error("program version {vers} procedure {proc_} is not covered by this binding")]
    Unknown { vers: u32, proc_: u32 },
}

/// An endpoint's Upper-Layer Bindings by RPC program number. Both engines look a call's program
/// up several times per call, so the map hashes with one multiplication instead of SipHash
/// (about 100 instructions a lookup; callgrind, stop 38). The endpoint builds the map once and
/// a peer cannot add to it: there is nothing for a chosen program number to flood.
pub type Bindings =
    HashMap<u32, Arc<dyn UpperLayerBinding>, BuildHasherDefault<verbs::mem::IdHasher>>;

/// One program's Upper-Layer Binding.
pub trait UpperLayerBinding: Send + Sync + 'static {
    /// The RPC program number this binding covers.
    fn program(&self) -> u32;

    /// Byte ranges, relative to the start of `args`, of the **contents** (after the length word,
    /// without padding) of every DDP-eligible item in a call's arguments. `args` is the complete
    /// argument stream with every chunk's data already in place.
    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError>;

    /// The largest possible reply (RPC reply header plus results, every item inline) to this
    /// call, or `None` when it cannot be bounded (RFC 8166 §6.2 "Maximum Reply Size").
    fn max_reply_size(&self, vers: u32, proc_: u32, args: &[u8]) -> Option<usize>;

    /// Chunk-complexity limits for calls of this program.
    fn chunk_limits(&self) -> ChunkLimits {
        ChunkLimits::default()
    }

    /// Whether this binding covers version `vers` of the program (RFC 8166 §6: a binding is
    /// for an RPC Program and Version tuple). A Requester refuses calls of versions it does
    /// not cover. The default covers every version.
    fn covers_version(&self, vers: u32) -> bool {
        let _ = vers;
        true
    }

    /// Whether any item of the program is DDP-eligible. When not, a Requester reduces nothing
    /// and offers no Write chunks for its calls; long messages still travel in a Position-Zero
    /// Read chunk or the Reply chunk (RFC 8166 §6.1). The default says some item is.
    fn has_ddp_items(&self) -> bool {
        true
    }

    /// Requester side (added after the first version of this trait; the default keeps older
    /// implementations compiling): where the result items that the Responder moved into Write
    /// chunks belong. `results` is the reduced result stream (after the RPC reply header) and
    /// `written[i]` the number of bytes the Responder wrote into Write chunk `i` (zero for an
    /// unused chunk). Returns, for every non-zero entry of `written` in order, the offset in
    /// `results` where that item's contents go (just after its length word). The default says
    /// the binding cannot locate them, and such a reply fails with a transport error.
    fn reply_ddp_positions(
        &self,
        vers: u32,
        proc_: u32,
        results: &[u8],
        written: &[usize],
    ) -> Result<Vec<usize>, UlbError> {
        let _ = (results, written);
        Err(UlbError::Unknown { vers, proc_ })
    }

    /// Requester side: whether a call whose reply did not fit the reply resources offered
    /// (RDMA_ERR_CHUNK) may be sent again as a new transaction (a new XID) announcing a larger
    /// reply, and how large: `Some(size)` for retry number `attempt` (1-based) after a reply
    /// bound of `previous` bytes, `None` for no (more) retries. RFC 8267 §3.1 ("short Reply
    /// chunk retry") allows it only for the operations a binding names, since the reply size
    /// of most can be estimated exactly, and never indefinitely; the default is no. `args` is
    /// the call's argument stream (every item inline).
    fn short_reply_retry(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
        attempt: u32,
        previous: usize,
    ) -> Option<usize> {
        let _ = (vers, proc_, args, attempt, previous);
        None
    }
}

/// A binding under which no item of the program is DDP-eligible (RFC 8267 §5.2 says so of
/// NFSACL; a test program only ever called with NULL is another case). Calls and replies
/// travel inline, or whole in a Position-Zero Read chunk or the Reply chunk when they are long
/// (RFC 8166 §6.1: such items "MAY, however, be moved as part of a Position Zero Read chunk or
/// a Reply chunk"). A Responder holding it answers a Read chunk anywhere else with
/// GARBAGE_ARGS. It cannot bound replies: callers give the bound in
/// [`oncrpc::ReplyExpectation::max_len`].
#[derive(Debug, Clone, PartialEq, Eq)]
//= specs/rfc8166.txt#section-6.1
//# Such data items MAY, however, be moved as part of a Position Zero Read chunk or a Reply chunk.
pub struct InlineBinding {
    program: u32,
    versions: RangeInclusive<u32>,
}

impl InlineBinding {
    /// A binding for `versions` of `program`.
    pub fn new(program: u32, versions: RangeInclusive<u32>) -> Self {
        InlineBinding { program, versions }
    }
}

impl UpperLayerBinding for InlineBinding {
    fn program(&self) -> u32 {
        self.program
    }

    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        _args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError> {
        if self.versions.contains(&vers) {
            Ok(Vec::new())
        } else {
            Err(UlbError::Unknown { vers, proc_ })
        }
    }

    fn max_reply_size(&self, _vers: u32, _proc_: u32, _args: &[u8]) -> Option<usize> {
        None
    }

    fn covers_version(&self, vers: u32) -> bool {
        self.versions.contains(&vers)
    }

    fn has_ddp_items(&self) -> bool {
        false
    }
}
