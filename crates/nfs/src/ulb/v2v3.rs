//! NFS versions 2 and 3 (RFC 8267 §4): the DDP-eligible items of calls and replies, and the
//! largest reply each procedure can produce.

use std::ops::Range;

use xdr::{Decoder, XdrDecode};

use super::{NFS3_MAXPATHLEN, RPC_REPLY_HEADER_MAX, opaque_item};
use crate::nfs3::{self, Nfsstat3, POST_OP_ATTR_MAX, POST_OP_FH_MAX, WCC_DATA_MAX};

/// NFSv2 procedure numbers with a DDP-eligible argument or result (RFC 1094 §2.2).
pub mod nfs2_proc {
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 8;
    pub const SYMLINK: u32 = 13;
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
    nfs3::args_ddp_item(proc_, args)
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
