//! The NFS Upper-Layer Binding for RPC-over-RDMA (RFC 8267).
//!
//! Pure functions over XDR bytes, plus [`NfsBinding`], the [`UpperLayerBinding`] the RPC-over-RDMA
//! transport consults for program 100003.
//!
//! - NFS versions 2 and 3 (RFC 8267 §4): WRITE data and the SYMLINK path in calls, READ data and
//!   the READLINK path in replies are DDP-eligible; nothing else.
//! - NFS version 4.x (RFC 8267 §6.1): WRITE4args data and the NF4LNK linkdata of CREATE in calls,
//!   READ4resok data and READLINK4resok link in replies. [`scan_compound`] walks every operation
//!   of a COMPOUND (operations 3 to 75 of RFC 7530, RFC 5661, RFC 7862 and RFC 8276) to find them.
//! - Write-chunk pairing in COMPOUNDs (RFC 8267 §6.4.1): [`pair_write_chunks`].
//! - Chunk-list complexity (RFC 8267 §6.4.2): [`NfsBinding::chunk_limits`] returns the defaults
//!   (one Position-Zero Read chunk plus one other Read chunk, one Write chunk, sixteen segments per
//!   chunk). A transport that receives a more complex call answers as [`ComplexityViolation`]
//!   says: RDMA_ERROR with ERR_CHUNK when the transport header parser detects it, or an RPC reply
//!   with MSG_ACCEPTED / GARBAGE_ARGS when it is found while the call's XDR stream is reassembled.
//! - Reply size estimation (RFC 8267 §3, §4.1, §6.2): [`nfs3_max_reply`] for every NFSv3
//!   procedure; NFSv4.1+ replies are bounded by the session's `ca_maxresponsesize`
//!   ([`NfsBinding::set_session_limit`], [`create_session_fore_attrs`]).
//! - Short Reply chunk retry (RFC 8267 §3.1, §5.2, §6.2.1): [`short_reply_retry`].
//! - MOUNT, NLM and NSM go over TCP only (RFC 8267 §5.1: [`tcp_only`]); NFSACL has no
//!   DDP-eligible item (§5.2). NFS/RDMA uses port 20049 ([`NFS_RDMA_PORT`], §9).
//!
//! Files: `v2v3` (NFS versions 2 and 3), `compound` (the NFSv4 COMPOUND scanner and Write-chunk
//! pairing); this module keeps the constants, the short Reply chunk retry and the bindings.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;

use rpcrdma::ulb::{ChunkLimits, UlbError, UpperLayerBinding};
use xdr::{Decoder, XdrError};

use crate::nfs3::{self, POST_OP_ATTR_MAX};

mod compound;
mod v2v3;
pub(crate) mod v4_reply;

pub use compound::{
    ChunkUse, CompoundScan, compound_reply_item_offsets, create_session_fore_attrs, op4,
    pair_write_chunks, scan_compound,
};
pub use v2v3::{
    nfs2_call_item, nfs2_max_reply, nfs2_proc, nfs2_reply_expectation, nfs2_reply_item_offset,
    nfs3_call_item, nfs3_max_reply, nfs3_reply_expectation, nfs3_reply_item_offset,
};

/// The IANA port for NFS over RPC-over-RDMA (RFC 8267 §9, "nfsrdma").
//= specs/rfc8267.txt#section-4.2
//# A Legacy NFS server supporting RPC-over-RDMA version 1 on such a
//# network and registering itself with the RPC portmapper MAY choose an
//# arbitrary port or MAY use the alternative well-known port number for
//# its RPC-over-RDMA service (see Section 9).
pub const NFS_RDMA_PORT: u16 = 20049;
/// NFSACL program number (RFC 8267 §5.2).
pub const NFSACL_PROGRAM: u32 = 100227;
/// NLM program number.
pub const NLM_PROGRAM: u32 = 100021;
/// NSM program number.
pub const NSM_PROGRAM: u32 = 100024;
/// NFSv4 COMPOUND procedure number.
pub const NFS4_COMPOUND: u32 = 1;
/// Largest RPC reply header with every item inline: xid, mtype, reply_stat, a verifier of
/// up to 400 bytes (RFC 5531 §8.2), accept_stat.
pub const RPC_REPLY_HEADER_MAX: usize = 4 + 4 + 4 + 4 + 4 + 400 + 4;
/// NFS3 MAXPATHLEN the client assumes for READLINK results.
pub const NFS3_MAXPATHLEN: usize = 4096;

/// RFC 8267 §5.1: these programs are conveyed over TCP, never RPC-over-RDMA.
//= specs/rfc8267.txt#section-5.1
//# To enable interoperation of
//# these protocols when NFS/RDMA is in use, a Legacy NFS server MUST
//# provide support for these protocols via TCP.
pub fn tcp_only(prog: u32) -> bool {
    matches!(prog, crate::mount::PROGRAM | NLM_PROGRAM | NSM_PROGRAM)
}

/// How a Responder reports a call whose chunk lists exceed [`ChunkLimits`] (RFC 8267 §6.4.2).
//= specs/rfc8267.txt#section-6.4.2
//# An NFS version 4 server SHOULD return one of the following responses
//# to a client that has sent an RPC transaction via RPC-over-RDMA
//# version 1, which cannot be processed due to chunk list complexity
//# limits on the server:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComplexityViolation {
    /// Found while parsing the transport header: RDMA_ERROR / ERR_CHUNK.
    ErrChunk,
    /// Found while reassembling the call's XDR stream: MSG_ACCEPTED / GARBAGE_ARGS.
    GarbageArgs,
}

impl ComplexityViolation {
    /// Which answer applies to a problem found at this stage.
    pub fn for_stage(in_transport_header: bool) -> Self {
        if in_transport_header {
            ComplexityViolation::ErrChunk
        } else {
            ComplexityViolation::GarbageArgs
        }
    }
}

/// The byte range of an XDR opaque (length, then data and padding) of at most `max` bytes.
fn opaque_item(dec: &mut Decoder<'_>, max: u32) -> xdr::Result<Range<usize>> {
    let len = dec.length(max)? as usize;
    let start = dec.position();
    dec.opaque_fixed(len)?;
    Ok(start..start + len)
}

// ---------------------------------------------------------------------------------------------
// Short Reply chunk retry (RFC 8267 §3.1)
// ---------------------------------------------------------------------------------------------

/// Retries with a larger Reply chunk after a transport error (new XID each time).
pub const SHORT_REPLY_MAX_RETRIES: u32 = 2;
/// Largest Reply chunk a retry grows to.
pub const SHORT_REPLY_MAX_CHUNK: usize = 1 << 20;

/// Whether a call may be retried with a larger Reply chunk when the server reports
/// ERR_CHUNK or another transport error (RFC 8267 §3.1). Only: NFSACL GETACL (§5.2) and an
/// NFSv4.0 COMPOUND containing GETATTR (§6.2.1). NFSv2/3 have none (§4.1); NFSv4.1+ is bounded
/// by the session (§6.2.2).
pub fn short_reply_retry(prog: u32, vers: u32, proc_: u32, args: &[u8]) -> bool {
    match (prog, vers, proc_) {
        (NFSACL_PROGRAM, _, 1) => true,
        (nfs3::PROGRAM, 4, NFS4_COMPOUND) => scan_compound(args)
            .map(|s| s.minorversion == 0 && s.ops.contains(&op4::GETATTR))
            .unwrap_or(false),
        _ => false,
    }
}

/// The Reply chunk size for retry number `attempt` (1-based) after a short Reply chunk of
/// `previous` bytes, or `None` when the retry budget is spent: doubling, up to
/// [`SHORT_REPLY_MAX_CHUNK`], at most [`SHORT_REPLY_MAX_RETRIES`] times.
pub fn short_reply_next_size(attempt: u32, previous: usize) -> Option<usize> {
    if attempt == 0 || attempt > SHORT_REPLY_MAX_RETRIES || previous >= SHORT_REPLY_MAX_CHUNK {
        return None;
    }
    Some(
        previous
            .saturating_mul(2)
            .clamp(4096, SHORT_REPLY_MAX_CHUNK),
    )
}

// ---------------------------------------------------------------------------------------------
// The binding
// ---------------------------------------------------------------------------------------------

/// The NFSACL program's Upper-Layer Binding (program 100227, version 3). RFC 8267 §5.2:
/// nothing in NFSACL is DDP-eligible, so calls and replies travel inline or whole in a
/// Position-Zero Read chunk / the Reply chunk; the size of a GETACL reply cannot be known in
/// advance, so a client estimates it from its own limit and uses short Reply chunk retry
/// (RFC 8267 §3.1) when the server answers RDMA_ERR_CHUNK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NfsAclBinding {
    /// ACL entries (per ACL) a first GETACL reply is provisioned for.
    pub initial_entries: usize,
}

impl Default for NfsAclBinding {
    /// Room for 32 entries per ACL at first (an ACL of a few named users and groups), the
    /// protocol's 1024 on the one retry.
    fn default() -> Self {
        NfsAclBinding {
            initial_entries: 32,
        }
    }
}

impl NfsAclBinding {
    /// The largest GETACL reply (RPC header plus results) with `entries` per ACL.
    pub fn getacl_max_reply(entries: usize) -> usize {
        RPC_REPLY_HEADER_MAX + crate::nfsacl::getacl_results_max(entries)
    }
}

impl UpperLayerBinding for NfsAclBinding {
    fn program(&self) -> u32 {
        NFSACL_PROGRAM
    }

    fn covers_version(&self, vers: u32) -> bool {
        vers == crate::nfsacl::VERSION
    }

    fn has_ddp_items(&self) -> bool {
        // RFC 8267 §5.2: no NFSACL data item is DDP-eligible.
        false
    }

    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        _args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError> {
        if vers != crate::nfsacl::VERSION || proc_ > crate::nfsacl::proc_::SETACL {
            return Err(UlbError::Unknown { vers, proc_ });
        }
        Ok(Vec::new())
    }

    fn max_reply_size(&self, vers: u32, proc_: u32, _args: &[u8]) -> Option<usize> {
        use crate::nfsacl::proc_ as p;
        if vers != crate::nfsacl::VERSION {
            return None;
        }
        match proc_ {
            p::NULL => Some(RPC_REPLY_HEADER_MAX),
            // RFC 8267 §5.2: "Legacy client implementations should choose a maximum size for
            // ACLs based on their own internal limits."
            p::GETACL => Some(Self::getacl_max_reply(self.initial_entries)),
            // SETACL3res: status and post_op_attr.
            p::SETACL => Some(RPC_REPLY_HEADER_MAX + 4 + POST_OP_ATTR_MAX),
            _ => None,
        }
    }

    fn short_reply_retry(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
        attempt: u32,
        previous: usize,
    ) -> Option<usize> {
        // RFC 8267 §5.2: GETACL may use short Reply chunk retry; once, straight to what the
        // protocol can carry at most (NFS_ACL_MAX_ENTRIES in each ACL), so it is bounded.
        if !short_reply_retry(NFSACL_PROGRAM, vers, proc_, args) || attempt != 1 {
            return None;
        }
        let max = Self::getacl_max_reply(crate::nfsacl::MAX_ENTRIES as usize);
        (max > previous).then_some(max)
    }
}

/// The NFS program's Upper-Layer Binding (program 100003, versions 2, 3 and 4).
#[derive(Debug, Default)]
pub struct NfsBinding {
    sessions: Mutex<HashMap<[u8; 16], u32>>,
}

impl NfsBinding {
    /// A binding with no known sessions.
    pub fn new() -> Self {
        Self::default()
    }

    /// RFC 8267 §6.2.2: remember a session's fore-channel `ca_maxresponsesize` (from the
    /// CREATE_SESSION reply) so NFSv4.1+ COMPOUNDs on it get a reply-size bound.
    pub fn set_session_limit(&self, sessionid: [u8; 16], ca_maxresponsesize: u32) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sessionid, ca_maxresponsesize);
    }

    /// Forget a session (DESTROY_SESSION).
    pub fn forget_session(&self, sessionid: &[u8; 16]) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(sessionid);
    }

    fn session_limit(&self, sessionid: &[u8; 16]) -> Option<u32> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sessionid)
            .copied()
    }
}

impl UpperLayerBinding for NfsBinding {
    fn program(&self) -> u32 {
        nfs3::PROGRAM
    }

    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError> {
        let garbage = |e: XdrError| UlbError::Garbage(e.to_string());
        match vers {
            2 => Ok(nfs2_call_item(proc_, args)
                .map_err(garbage)?
                .into_iter()
                .collect()),
            3 => Ok(nfs3_call_item(proc_, args)
                .map_err(garbage)?
                .into_iter()
                .collect()),
            4 if proc_ == 0 => Ok(Vec::new()),
            4 if proc_ == NFS4_COMPOUND => Ok(scan_compound(args).map_err(garbage)?.ddp_items),
            _ => Err(UlbError::Unknown { vers, proc_ }),
        }
    }

    fn max_reply_size(&self, vers: u32, proc_: u32, args: &[u8]) -> Option<usize> {
        match (vers, proc_) {
            (2, _) => nfs2_max_reply(proc_, args),
            (3, _) => nfs3_max_reply(proc_, args),
            (4, 0) => Some(RPC_REPLY_HEADER_MAX),
            (4, NFS4_COMPOUND) => {
                // A COMPOUND of operations with bounded replies gets its own bound, so that a
                // GETATTR's reply is expected inline instead of in a Reply chunk sized for the
                // session's largest reply (v4_reply).
                if let Some(b) = v4_reply::compound_reply_bound(args) {
                    return Some(RPC_REPLY_HEADER_MAX + b);
                }
                // RFC 8267 §6.2.1: v4.0 has no bound; §6.2.2: v4.1+ uses the session's.
                let scan = scan_compound(args).ok()?;
                let limit = self.session_limit(&scan.sessionid?)?;
                Some(RPC_REPLY_HEADER_MAX + limit as usize)
            }
            _ => None,
        }
    }

    fn chunk_limits(&self) -> ChunkLimits {
        // RFC 8267 §6.4.2 defaults, which bound what our requester builds and what our
        // responder accepts.
        //= specs/rfc8267.txt#section-6.4.2
        //# In the absence of explicit knowledge of the server's limits, NFS
        //# version 4 clients SHOULD follow the prescriptions listed below when
        //# constructing RPC-over-RDMA version 1 messages.
        //= specs/rfc8267.txt#section-6.4.2
        //# NFS version 4 servers
        //# MUST accept and process such requests.
        ChunkLimits::default()
    }

    fn short_reply_retry(
        &self,
        vers: u32,
        proc_: u32,
        args: &[u8],
        attempt: u32,
        previous: usize,
    ) -> Option<usize> {
        // RFC 8267 §3.1 / §6.2.1: only an NFSv4.0 COMPOUND with a GETATTR.
        if !short_reply_retry(nfs3::PROGRAM, vers, proc_, args) {
            return None;
        }
        short_reply_next_size(attempt, previous)
    }

    fn reply_ddp_positions(
        &self,
        vers: u32,
        proc_: u32,
        results: &[u8],
        written: &[usize],
    ) -> Result<Vec<usize>, UlbError> {
        let garbage = |e: XdrError| UlbError::Garbage(e.to_string());
        let offsets: Vec<Option<usize>> = match (vers, proc_) {
            (2, _) => vec![nfs2_reply_item_offset(proc_, results).map_err(garbage)?],
            (3, _) => vec![nfs3_reply_item_offset(proc_, results).map_err(garbage)?],
            (4, NFS4_COMPOUND) => compound_reply_item_offsets(results)?,
            _ => return Err(UlbError::Unknown { vers, proc_ }),
        };
        // RFC 8267 §6.4.1: Write chunk i belongs to the i-th READ operation.
        let mut out = Vec::new();
        for (i, w) in written.iter().enumerate() {
            if *w == 0 {
                continue;
            }
            match offsets.get(i).copied().flatten() {
                Some(off) => out.push(off),
                None => {
                    return Err(UlbError::Garbage(format!(
                        "Write chunk {i} was filled but READ operation {i} has no DDP-eligible result"
                    )));
                }
            }
        }
        Ok(out)
    }
}
