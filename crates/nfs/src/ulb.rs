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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;

use rpcrdma::ulb::{ChunkLimits, UlbError, UpperLayerBinding};
use xdr::{Decoder, XdrDecode, XdrError};

use crate::nfs3::{self, Nfsstat3, POST_OP_ATTR_MAX, POST_OP_FH_MAX, WCC_DATA_MAX};

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

// ---------------------------------------------------------------------------------------------
// NFS versions 2 and 3 (RFC 8267 §4)
// ---------------------------------------------------------------------------------------------

/// NFSv2 procedure numbers with a DDP-eligible argument or result (RFC 1094 §2.2).
pub mod nfs2_proc {
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 8;
    pub const SYMLINK: u32 = 13;
}

fn opaque_item(dec: &mut Decoder<'_>, max: u32) -> xdr::Result<Range<usize>> {
    let len = dec.length(max)? as usize;
    let start = dec.position();
    dec.opaque_fixed(len)?;
    Ok(start..start + len)
}

/// RFC 8267 §4: the DDP-eligible argument of an NFSv2 call (WRITE data, SYMLINK path).
/// Only the part of the arguments up to the item is checked.
pub fn nfs2_call_item(proc_: u32, args: &[u8]) -> xdr::Result<Option<Range<usize>>> {
    let mut dec = Decoder::new(args);
    match proc_ {
        nfs2_proc::WRITE => {
            // fhandle[32], beginoffset, offset, totalcount, nfsdata<8192>
            dec.skip(32 + 12)?;
            Ok(Some(opaque_item(&mut dec, 8192)?))
        }
        nfs2_proc::SYMLINK => {
            // from: diropargs (fhandle[32], filename<255>), to: path<1024>, attributes
            dec.skip(32)?;
            dec.opaque(255)?;
            let r = opaque_item(&mut dec, 1024)?;
            dec.skip(32)?;
            Ok(Some(r))
        }
        _ => Ok(None),
    }
}

/// NFSv2 (RFC 1094 §2.3) sizes: a file handle, `fattr` (17 words) and the data/path limits.
mod nfs2_size {
    pub const FHSIZE: usize = 32;
    pub const FATTR: usize = 17 * 4;
    pub const MAXDATA: usize = 8192;
    pub const MAXPATHLEN: usize = 1024;
}

/// Offset, in an NFSv2 result stream, of the contents of the DDP-eligible item (READ data,
/// READLINK path; RFC 8267 §4), or `None` when the result has none (an error status, another
/// procedure). Works on reduced streams: only the length word is read.
pub fn nfs2_reply_item_offset(proc_: u32, results: &[u8]) -> xdr::Result<Option<usize>> {
    if proc_ != nfs2_proc::READ && proc_ != nfs2_proc::READLINK {
        return Ok(None);
    }
    let mut dec = Decoder::new(results);
    // RFC 1094 §2.3.1: stat NFS_OK is 0.
    if dec.u32()? != 0 {
        return Ok(None);
    }
    if proc_ == nfs2_proc::READ {
        // readres: attributes, then data<NFS_MAXDATA>.
        dec.skip(nfs2_size::FATTR)?;
    }
    dec.u32()?;
    Ok(Some(dec.position()))
}

/// RFC 8267 §4.1 / §3: the largest NFSv2 reply (RPC header plus results, all inline) a call
/// can produce, for every procedure of RFC 1094 §2.2 (READ and READDIR bounded by their count).
pub fn nfs2_max_reply(proc_: u32, args: &[u8]) -> Option<usize> {
    use nfs2_size::*;
    // The count word of READ (fhandle, offset, count, totalcount) and READDIR (fhandle,
    // cookie, count) sits right after the handle and one word.
    let count_at_36 = || -> Option<usize> {
        let w = args.get(FHSIZE + 4..FHSIZE + 8)?;
        Some(u32::from_be_bytes(w.try_into().ok()?) as usize)
    };
    let attrstat = 4 + FATTR;
    let diropres = 4 + FHSIZE + FATTR;
    let results = match proc_ {
        // NULL, ROOT, WRITECACHE: void.
        0 | 3 | 7 => 0,
        // GETATTR, SETATTR, WRITE: attrstat.
        1 | 2 | nfs2_proc::WRITE => attrstat,
        // LOOKUP, CREATE, MKDIR: diropres.
        4 | 9 | 14 => diropres,
        nfs2_proc::READLINK => 4 + xdr::opaque_len(MAXPATHLEN),
        nfs2_proc::READ => 4 + FATTR + xdr::opaque_len(count_at_36()?.min(MAXDATA)),
        // REMOVE, RENAME, LINK, SYMLINK, RMDIR: stat.
        10 | 11 | 12 | nfs2_proc::SYMLINK | 15 => 4,
        // READDIR: count bounds the entries; plus the status, the end of the list and eof.
        16 => 4 + count_at_36()? + 4 + 4,
        // STATFS: tsize, bsize, blocks, bfree, bavail.
        17 => 4 + 5 * 4,
        _ => return None,
    };
    Some(RPC_REPLY_HEADER_MAX + results)
}

/// The reply expectation a Requester attaches to an NFSv2 call: the maximum reply size and one
/// Write chunk for READ data (its count, at most NFS_MAXDATA) or the READLINK path.
pub fn nfs2_reply_expectation(proc_: u32, args: &[u8]) -> oncrpc::ReplyExpectation {
    let ddp_items = match proc_ {
        nfs2_proc::READ => args
            .get(nfs2_size::FHSIZE + 4..nfs2_size::FHSIZE + 8)
            .and_then(|w| w.try_into().ok())
            .map(|w| vec![(u32::from_be_bytes(w) as usize).min(nfs2_size::MAXDATA)])
            .unwrap_or_default(),
        nfs2_proc::READLINK => vec![nfs2_size::MAXPATHLEN],
        _ => Vec::new(),
    };
    oncrpc::ReplyExpectation {
        max_len: nfs2_max_reply(proc_, args),
        ddp_items,
    }
}

/// RFC 8267 §4: the DDP-eligible argument of an NFSv3 call, checked against the whole
/// argument structure.
pub fn nfs3_call_item(proc_: u32, args: &[u8]) -> xdr::Result<Option<Range<usize>>> {
    nfs3::args_ddp_item(proc_, &bytes::Bytes::copy_from_slice(args))
}

/// Offset, in an NFSv3 result stream (after the RPC reply header), of the contents of the
/// DDP-eligible item (READ data, READLINK path), or `None` when the result has none (an error
/// status, or another procedure). Works on reduced streams: only the length word is read.
pub fn nfs3_reply_item_offset(proc_: u32, results: &[u8]) -> xdr::Result<Option<usize>> {
    if proc_ != nfs3::proc_::READ && proc_ != nfs3::proc_::READLINK {
        return Ok(None);
    }
    let mut dec = Decoder::new(results);
    if Nfsstat3::decode(&mut dec)? != Nfsstat3::Ok {
        return Ok(None);
    }
    let _attr: nfs3::PostOpAttr = XdrDecode::decode(&mut dec)?;
    if proc_ == nfs3::proc_::READ {
        dec.u32()?;
        dec.bool()?;
    }
    dec.u32()?;
    Ok(Some(dec.position()))
}

/// RFC 8267 §4.1 / §3: the largest NFSv3 reply (RPC header plus results, all inline) a call can
/// produce, from its arguments (READ count, READDIR count, READDIRPLUS maxcount).
pub fn nfs3_max_reply(proc_: u32, args: &[u8]) -> Option<usize> {
    use nfs3::proc_ as p;
    const FH: usize = 4 + nfs3::FHSIZE as usize;
    let attr_only = 4 + POST_OP_ATTR_MAX;
    let results = match proc_ {
        p::NULL => 0,
        p::GETATTR => 4 + nfs3::FATTR3_LEN,
        p::SETATTR | p::REMOVE | p::RMDIR => 4 + WCC_DATA_MAX,
        p::LOOKUP => 4 + FH + 2 * POST_OP_ATTR_MAX,
        p::ACCESS => 4 + POST_OP_ATTR_MAX + 4,
        p::READLINK => 4 + POST_OP_ATTR_MAX + xdr::opaque_len(NFS3_MAXPATHLEN),
        p::READ => {
            let a: nfs3::ReadArgs = xdr::from_slice(args).ok()?;
            4 + POST_OP_ATTR_MAX + 4 + 4 + xdr::opaque_len(a.count as usize)
        }
        p::WRITE => 4 + WCC_DATA_MAX + 4 + 4 + 8,
        p::CREATE | p::MKDIR | p::SYMLINK | p::MKNOD => {
            4 + POST_OP_FH_MAX + POST_OP_ATTR_MAX + WCC_DATA_MAX
        }
        p::RENAME => 4 + 2 * WCC_DATA_MAX,
        p::LINK => 4 + POST_OP_ATTR_MAX + WCC_DATA_MAX,
        // RFC 1813 §3.3.16: count is the maximum size of READDIR3resok.
        p::READDIR => {
            let a: nfs3::ReaddirArgs = xdr::from_slice(args).ok()?;
            4 + (a.count as usize).max(attr_only)
        }
        // RFC 1813 §3.3.17: maxcount bounds READDIRPLUS3resok.
        p::READDIRPLUS => {
            let a: nfs3::ReaddirplusArgs = xdr::from_slice(args).ok()?;
            4 + (a.maxcount as usize).max(attr_only)
        }
        p::FSSTAT => 4 + POST_OP_ATTR_MAX + 6 * 8 + 4,
        p::FSINFO => 4 + POST_OP_ATTR_MAX + 7 * 4 + 8 + 8 + 4,
        p::PATHCONF => 4 + POST_OP_ATTR_MAX + 6 * 4,
        p::COMMIT => 4 + WCC_DATA_MAX + 8,
        _ => return None,
    };
    Some(RPC_REPLY_HEADER_MAX + results)
}

/// The reply expectation a Requester attaches to an NFSv3 call (RFC 8166 §6 / RFC 8267 §4):
/// the maximum reply size and one Write chunk for READ data or the READLINK path.
pub fn nfs3_reply_expectation(proc_: u32, args: &[u8]) -> oncrpc::ReplyExpectation {
    let ddp_items = match proc_ {
        nfs3::proc_::READ => xdr::from_slice::<nfs3::ReadArgs>(args)
            .map(|a| vec![a.count as usize])
            .unwrap_or_default(),
        nfs3::proc_::READLINK => vec![NFS3_MAXPATHLEN],
        _ => Vec::new(),
    };
    oncrpc::ReplyExpectation {
        max_len: nfs3_max_reply(proc_, args),
        ddp_items,
    }
}

// ---------------------------------------------------------------------------------------------
// NFS version 4 (RFC 8267 §6)
// ---------------------------------------------------------------------------------------------

/// NFSv4 operation numbers with DDP-eligible items, and a few the scanner needs by name.
pub mod op4 {
    pub const ACCESS: u32 = 3;
    pub const CREATE: u32 = 6;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LOOKUP: u32 = 15;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READLINK: u32 = 27;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const WRITE: u32 = 38;
    pub const CREATE_SESSION: u32 = 43;
    pub const SEQUENCE: u32 = 53;
    pub const ILLEGAL: u32 = 10044;
    /// NF4LNK in `nfs_ftype4`.
    pub const NF4LNK: u32 = 5;
}

const NFS4_FHSIZE: u32 = 128;
const NFS4_OPAQUE_LIMIT: u32 = 1024;
/// Decoder bound for unbounded NFSv4 opaques and strings while scanning.
const MAX4: u32 = 1 << 26;
/// Decoder bound for NFSv4 arrays while scanning.
const MAX_ARRAY4: u32 = 1 << 16;

/// One NFSv4 COMPOUND as the scanner saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompoundScan {
    pub minorversion: u32,
    /// Operation numbers in order (an unknown operation ends the list, as it ends execution).
    pub ops: Vec<u32>,
    /// Byte ranges of the DDP-eligible argument items (WRITE data, CREATE NF4LNK linkdata).
    pub ddp_items: Vec<Range<usize>>,
    /// Indices into `ops` of the "READ operations" of RFC 8267 §6.4.1 (READ, READLINK).
    pub read_like: Vec<usize>,
    /// The session of a leading SEQUENCE (NFSv4.1+).
    pub sessionid: Option<[u8; 16]>,
    /// The fore-channel ca_maxresponsesize of a CREATE_SESSION in this COMPOUND.
    pub create_session_max_response: Option<u32>,
    /// True when an operation number was not recognised (the scan stopped there).
    pub stopped_at_unknown: bool,
}

struct W<'a, 'b>(&'b mut Decoder<'a>);

impl W<'_, '_> {
    fn u32(&mut self) -> xdr::Result<u32> {
        self.0.u32()
    }
    fn n(&mut self, words: usize) -> xdr::Result<()> {
        self.0.skip(words * 4)
    }
    fn opaque(&mut self, max: u32) -> xdr::Result<()> {
        self.0.opaque(max).map(drop)
    }
    fn bool(&mut self) -> xdr::Result<bool> {
        self.0.bool()
    }
    fn stateid(&mut self) -> xdr::Result<()> {
        self.n(4)
    }
    fn bitmap(&mut self) -> xdr::Result<()> {
        let n = self.0.length(MAX_ARRAY4)? as usize;
        self.n(n)
    }
    fn fattr(&mut self) -> xdr::Result<()> {
        self.bitmap()?;
        self.opaque(MAX4)
    }
    fn owner(&mut self) -> xdr::Result<()> {
        self.n(2)?;
        self.opaque(NFS4_OPAQUE_LIMIT)
    }
    fn netaddr(&mut self) -> xdr::Result<()> {
        self.opaque(MAX4)?;
        self.opaque(MAX4)
    }
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> xdr::Result<()>) -> xdr::Result<()> {
        let n = self.0.length(MAX_ARRAY4)?;
        for _ in 0..n {
            item(self)?;
        }
        Ok(())
    }
    fn sec_parms(&mut self) -> xdr::Result<()> {
        self.array(|w| match w.u32()? {
            0 => Ok(()),
            1 => {
                // authsys_parms
                w.n(1)?;
                w.opaque(255)?;
                w.n(2)?;
                let n = w.0.length(16)? as usize;
                w.n(n)
            }
            6 => {
                w.n(1)?;
                w.opaque(MAX4)?;
                w.opaque(MAX4)
            }
            v => Err(bad("callback_sec_parms4", v)),
        })
    }
    fn channel_attrs(&mut self) -> xdr::Result<u32> {
        self.n(2)?;
        let maxresp = self.u32()?;
        self.n(3)?;
        let n = self.0.length(1)? as usize;
        self.n(n)?;
        Ok(maxresp)
    }
    fn netloc(&mut self) -> xdr::Result<()> {
        match self.u32()? {
            1 | 2 => self.opaque(MAX4),
            3 => self.netaddr(),
            v => Err(bad("netloc_type4", v)),
        }
    }
    fn layoutupdate(&mut self) -> xdr::Result<()> {
        self.n(1)?;
        self.opaque(MAX4)
    }
}

fn bad(type_name: &'static str, v: u32) -> XdrError {
    XdrError::InvalidDiscriminant {
        type_name,
        value: i64::from(v),
    }
}

/// What skipping one operation's arguments found.
enum OpFound {
    Nothing,
    Item(Range<usize>),
    Session([u8; 16]),
    CreateSession(u32),
}

/// Skip the arguments of operation `op` (RFC 7530 §16, RFC 5661 §18, RFC 7862 §15,
/// RFC 8276 §8.4). `Ok(None)` for an operation number this scanner does not know.
fn skip_op_args(op: u32, d: &mut Decoder<'_>) -> xdr::Result<Option<OpFound>> {
    let mut w = W(d);
    let mut found = OpFound::Nothing;
    match op {
        // void arguments
        10 | 16 | 23 | 24 | 27 | 31 | 32 | op4::ILLEGAL => {}
        3 | 52 => w.n(1)?, // ACCESS, SECINFO_NO_NAME
        4 => {
            // CLOSE
            w.n(1)?;
            w.stateid()?;
        }
        5 => w.n(3)?, // COMMIT
        op4::CREATE => {
            match w.u32()? {
                op4::NF4LNK => {
                    // RFC 8267 §6.1: NF4LNK linkdata is DDP-eligible.
                    found = OpFound::Item(opaque_item(w.0, MAX4)?);
                }
                3 | 4 => w.n(2)?,
                _ => {}
            }
            w.opaque(MAX4)?;
            w.fattr()?;
        }
        7 | 30 | 57 => w.n(2)?, // DELEGPURGE, RENEW, DESTROY_CLIENTID
        8 | 45 | 66 | 67 => w.stateid()?, // DELEGRETURN, FREE_STATEID, OFFLOAD_*
        9 => w.bitmap()?,       // GETATTR
        11 | 15 | 28 | 33 | 72 | 75 => w.opaque(MAX4)?, // component4 arguments
        12 => {
            // LOCK
            w.n(1)?;
            w.bool()?;
            w.n(4)?;
            if w.bool()? {
                w.n(1)?;
                w.stateid()?;
                w.n(1)?;
                w.owner()?;
            } else {
                w.stateid()?;
                w.n(1)?;
            }
        }
        13 => {
            // LOCKT
            w.n(5)?;
            w.owner()?;
        }
        14 => {
            // LOCKU
            w.n(2)?;
            w.stateid()?;
            w.n(4)?;
        }
        17 | 37 => w.fattr()?, // NVERIFY, VERIFY
        18 => {
            // OPEN
            w.n(3)?;
            w.owner()?;
            if w.u32()? == 1 {
                match w.u32()? {
                    0 | 1 => w.fattr()?,
                    2 => w.n(2)?,
                    3 => {
                        w.n(2)?;
                        w.fattr()?;
                    }
                    v => return Err(bad("createmode4", v)),
                }
            }
            match w.u32()? {
                0 | 3 => w.opaque(MAX4)?,
                1 => w.n(1)?,
                2 => {
                    w.stateid()?;
                    w.opaque(MAX4)?;
                }
                4 | 6 => {}
                5 => w.stateid()?,
                v => return Err(bad("open_claim_type4", v)),
            }
        }
        19 | 58 => {
            w.bool()?;
        }
        20 => {
            w.stateid()?;
            w.n(1)?;
        }
        21 => {
            w.stateid()?;
            w.n(3)?;
        }
        op4::PUTFH => w.opaque(NFS4_FHSIZE)?,
        op4::READ | 68 => {
            // READ, READ_PLUS
            w.stateid()?;
            w.n(3)?;
        }
        26 => {
            // READDIR
            w.n(6)?;
            w.bitmap()?;
        }
        29 => {
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        34 => {
            w.stateid()?;
            w.fattr()?;
        }
        35 => {
            // SETCLIENTID
            w.n(2)?;
            w.opaque(NFS4_OPAQUE_LIMIT)?;
            w.n(1)?;
            w.netaddr()?;
            w.n(1)?;
        }
        36 => w.n(4)?,
        op4::WRITE => {
            w.stateid()?;
            w.n(3)?;
            // RFC 8267 §6.1: WRITE4args data is DDP-eligible.
            found = OpFound::Item(opaque_item(w.0, MAX4)?);
        }
        39 => w.owner()?,
        40 => {
            w.n(1)?;
            w.sec_parms()?;
        }
        41 => {
            w.n(5)?;
            w.bool()?;
        }
        42 => {
            // EXCHANGE_ID
            w.n(2)?;
            w.opaque(NFS4_OPAQUE_LIMIT)?;
            w.n(1)?;
            match w.u32()? {
                0 => {}
                1 => {
                    w.bitmap()?;
                    w.bitmap()?;
                }
                2 => {
                    w.bitmap()?;
                    w.bitmap()?;
                    w.array(|w| w.opaque(MAX4))?;
                    w.array(|w| w.opaque(MAX4))?;
                    w.n(2)?;
                }
                v => return Err(bad("state_protect_how4", v)),
            }
            let n = w.0.length(1)?;
            for _ in 0..n {
                w.opaque(MAX4)?;
                w.opaque(MAX4)?;
                w.n(3)?;
            }
        }
        op4::CREATE_SESSION => {
            w.n(4)?;
            let fore = w.channel_attrs()?;
            w.channel_attrs()?;
            w.n(1)?;
            w.sec_parms()?;
            found = OpFound::CreateSession(fore);
        }
        44 => w.n(4)?,
        46 => {
            w.bool()?;
            w.bitmap()?;
            w.n(6)?;
            w.bitmap()?;
            w.bitmap()?;
        }
        47 => {
            w.n(6)?;
            w.bitmap()?;
        }
        48 => w.n(6)?,
        49 => {
            // LAYOUTCOMMIT
            w.n(4)?;
            w.bool()?;
            w.stateid()?;
            if w.bool()? {
                w.n(2)?;
            }
            if w.bool()? {
                w.n(3)?;
            }
            w.layoutupdate()?;
        }
        50 => {
            w.bool()?;
            w.n(8)?;
            w.stateid()?;
            w.n(1)?;
        }
        51 => {
            w.bool()?;
            w.n(2)?;
            match w.u32()? {
                1 => {
                    w.n(4)?;
                    w.stateid()?;
                    w.opaque(MAX4)?;
                }
                2 | 3 => {}
                v => return Err(bad("layoutreturn_type4", v)),
            }
        }
        op4::SEQUENCE => {
            let sid = w.0.opaque_fixed(16)?;
            let mut s = [0u8; 16];
            s.copy_from_slice(sid);
            w.n(3)?;
            w.bool()?;
            found = OpFound::Session(s);
        }
        54 => {
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        55 => w.array(|w| w.stateid())?,
        56 => {
            w.n(1)?;
            match w.u32()? {
                4 | 6 => {}
                1 => w.n(1)?,
                v => return Err(bad("deleg_claim4", v)),
            }
        }
        59 | 62 => {
            w.stateid()?;
            w.n(4)?;
        }
        60 => {
            // COPY
            w.stateid()?;
            w.stateid()?;
            w.n(6)?;
            w.bool()?;
            w.bool()?;
            w.array(|w| w.netloc())?;
        }
        61 => {
            w.stateid()?;
            w.netloc()?;
        }
        63 => {
            w.stateid()?;
            w.n(4)?;
            w.bitmap()?;
        }
        64 => {
            w.n(4)?;
            w.stateid()?;
            w.array(|w| w.n(6))?;
        }
        65 => {
            // LAYOUTSTATS
            w.n(4)?;
            w.stateid()?;
            w.n(8)?;
            w.n(4)?;
            w.layoutupdate()?;
        }
        69 => {
            w.stateid()?;
            w.n(3)?;
        }
        70 => {
            // WRITE_SAME
            w.stateid()?;
            w.n(1)?;
            w.n(2 + 2 + 2 + 2 + 1 + 2)?;
            w.opaque(MAX4)?;
        }
        71 => {
            w.stateid()?;
            w.stateid()?;
            w.n(6)?;
        }
        73 => {
            w.n(1)?;
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        74 => w.n(3)?,
        _ => return Ok(None),
    }
    Ok(Some(found))
}

/// Walk an NFSv4 COMPOUND's arguments (`COMPOUND4args`), skipping every operation, and report
/// its operations and DDP-eligible items (RFC 8267 §6.1).
pub fn scan_compound(args: &[u8]) -> xdr::Result<CompoundScan> {
    let mut dec = Decoder::new(args);
    let mut scan = CompoundScan::default();
    dec.opaque(MAX4)?; // tag
    scan.minorversion = dec.u32()?;
    let n = dec.length(MAX_ARRAY4)?;
    for i in 0..n {
        let op = dec.u32()?;
        match skip_op_args(op, &mut dec)? {
            None => {
                scan.stopped_at_unknown = true;
                return Ok(scan);
            }
            Some(found) => {
                scan.ops.push(op);
                if op == op4::READ || op == op4::READLINK {
                    scan.read_like.push(scan.ops.len() - 1);
                }
                match found {
                    OpFound::Item(r) => scan.ddp_items.push(r),
                    OpFound::Session(s) if i == 0 => scan.sessionid = Some(s),
                    OpFound::CreateSession(m) => scan.create_session_max_response = Some(m),
                    _ => {}
                }
            }
        }
    }
    dec.finish()?;
    Ok(scan)
}

/// The fore-channel `ca_maxresponsesize` of a COMPOUND containing CREATE_SESSION
/// (RFC 8267 §6.2.2), if any.
pub fn create_session_fore_attrs(args: &[u8]) -> Option<u32> {
    scan_compound(args).ok()?.create_session_max_response
}

/// How one READ operation of a COMPOUND returns its data (RFC 8267 §6.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkUse {
    /// Return the DDP-eligible item through Write chunk `chunk`.
    Fill { chunk: usize },
    /// Return the results inline: no matching chunk, or the client provided an empty one.
    Inline,
    /// The result arm has no DDP-eligible item but the client provided a non-empty chunk:
    /// return Write chunk `chunk` empty.
    ReturnEmpty { chunk: usize },
}

//= specs/rfc8267.txt#section-6.4.1
//# o  The first chunk in the Write list MUST be used by the first READ
//# operation in an NFS version 4 COMPOUND procedure.
//= specs/rfc8267.txt#section-6.4.1
//# o  If an NFS version 4 client has provided a matching non-empty Write
//# chunk, then the corresponding READ operation MUST return its
//# DDP-eligible data item using that chunk.
//= specs/rfc8267.txt#section-6.4.1
//# o  If an NFS version 4 client has provided an empty matching Write
//# chunk, then the corresponding READ operation MUST return all of
//# its result data items inline.
//= specs/rfc8267.txt#section-6.4.1
//# o  If a READ operation returns a union arm that does not contain a
//# DDP-eligible result, and the NFS version 4 client has provided a
//# matching non-empty Write chunk, an NFS version 4 server MUST
//# return an empty Write chunk in that Write list position.
//= specs/rfc8267.txt#section-6.4.1
//# o  If there are more READ operations than Write chunks, then
//# remaining NFS READ operations in an NFS version 4 COMPOUND that
//# have no matching Write chunk MUST return their results inline.
/// RFC 8267 §6.4.1 pairing: `results_have_item[i]` says whether the i-th READ operation's
/// result carries a DDP-eligible item (READ4resok / READLINK4resok), `chunk_lens[j]` is the
/// size of the client's j-th Write chunk (0 = an empty chunk). The first chunk goes with the
/// first READ operation, and so on; READ operations beyond the Write list return inline.
pub fn pair_write_chunks(results_have_item: &[bool], chunk_lens: &[usize]) -> Vec<ChunkUse> {
    results_have_item
        .iter()
        .enumerate()
        .map(|(i, &has)| match chunk_lens.get(i) {
            None | Some(0) => ChunkUse::Inline,
            Some(_) if has => ChunkUse::Fill { chunk: i },
            Some(_) => ChunkUse::ReturnEmpty { chunk: i },
        })
        .collect()
}

/// Skip one operation's result in `COMPOUND4res` and return the offset of the DDP-eligible
/// item's contents for READ/READLINK. Covers the operations that typically accompany READ and
/// READLINK; `Ok(None)` for a result this walker does not know. A failed operation is the
/// last one (RFC 7530 §15.2), so its result body is not needed.
fn skip_op_result(op: u32, d: &mut Decoder<'_>) -> xdr::Result<Option<Option<usize>>> {
    let status = d.u32()?;
    let mut w = W(d);
    if status != 0 {
        return Ok(Some(None));
    }
    let mut item = None;
    match op {
        op4::PUTFH
        | op4::PUTPUBFH
        | op4::PUTROOTFH
        | op4::LOOKUP
        | 16
        | op4::RESTOREFH
        | op4::SAVEFH
        | 28
        | 39
        | 45
        | 30
        | 36 => {
            if op == 28 {
                w.n(5)?; // change_info4
            }
        }
        op4::ACCESS => w.n(2)?,
        op4::GETATTR => w.fattr()?,
        op4::GETFH => w.opaque(NFS4_FHSIZE)?,
        op4::READ => {
            w.bool()?;
            w.0.u32()?;
            item = Some(w.0.position());
        }
        op4::READLINK => {
            w.0.u32()?;
            item = Some(w.0.position());
        }
        op4::SEQUENCE => w.n(4 + 5)?,
        _ => return Ok(None),
    }
    Ok(Some(item))
}

/// Requester side: for each READ operation (READ, READLINK) of a reduced `COMPOUND4res`, in
/// order, the offset where its DDP-eligible item's contents belong, or `None` when its result
/// has no such item (an error status).
pub fn compound_reply_item_offsets(results: &[u8]) -> Result<Vec<Option<usize>>, UlbError> {
    let mut dec = Decoder::new(results);
    let garbage = |e: XdrError| UlbError::Garbage(e.to_string());
    dec.u32().map_err(garbage)?;
    dec.opaque(MAX4).map_err(garbage)?;
    let n = dec.length(MAX_ARRAY4).map_err(garbage)?;
    let mut out = Vec::new();
    for _ in 0..n {
        let op = dec.u32().map_err(garbage)?;
        match skip_op_result(op, &mut dec).map_err(garbage)? {
            Some(item) if op == op4::READ || op == op4::READLINK => out.push(item),
            Some(_) => {}
            // Results after an operation this walker cannot skip: only already located
            // items are known. The COMPOUND stops at the first failure anyway.
            None => break,
        }
    }
    Ok(out)
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
