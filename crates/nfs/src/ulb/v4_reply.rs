//! An upper bound on the size of an NFSv4 COMPOUND's reply, from its arguments, for the
//! COMPOUNDs whose every operation has a bounded reply: the session and filehandle plumbing,
//! ACCESS, LOOKUP, GETATTR of fixed-size attributes, WRITE and COMMIT (what a client sends
//! most).
//!
//! RFC 8267 §6.2.2 offers the session's `ca_maxresponsesize` as the bound "in cases where it is
//! not possible to precisely estimate a reply size upper bound"; used for every COMPOUND, it
//! made a requester register a Reply chunk of that size for each one, a GETATTR included (a
//! memory registration and an invalidation per call that an inline reply never uses). Where
//! this module finds no bound (an operation not listed, an attribute of unbounded size such
//! as an ACL or `fs_locations`), the session's limit applies as before.

use xdr::Decoder;

use crate::nfs4::args::OpArgs;
use crate::nfs4::consts::attr;
use crate::nfs4::types::Bitmap4;

/// Longest owner or group name a bound assumes (`utf8str_mixed` has no limit; Linux's client
/// assumes 128 bytes, IDMAP_NAMESZ). Generous: with both names this long a GETATTR of every
/// bounded attribute still fits a 4 KiB inline threshold.
pub const OWNER_NAME_MAX: usize = 1024;

/// `nfs_fh4` (RFC 8881 §3.2).
const NFS4_FHSIZE: usize = 128;

/// Words of a bitmap in a reply a bound assumes, at most (servers return as many as they
/// support: 3 words cover every attribute of RFC 7862).
const BITMAP_WORDS_MAX: usize = 8;

/// Operations in a COMPOUND a bound is computed for, at most (more: none).
const OPS_MAX: u32 = 32;

/// The largest XDR size of attribute `a`'s value, or `None` when it has no bound (or is not
/// one a GETATTR returns).
fn attr_max(a: u32) -> Option<usize> {
    let bitmap = 4 + 4 * BITMAP_WORDS_MAX;
    let time = 12; // nfstime4
    Some(match a {
        attr::SUPPORTED_ATTRS | attr::SUPPATTR_EXCLCREAT => bitmap,
        attr::TYPE
        | attr::FH_EXPIRE_TYPE
        | attr::LINK_SUPPORT
        | attr::SYMLINK_SUPPORT
        | attr::NAMED_ATTR
        | attr::UNIQUE_HANDLES
        | attr::LEASE_TIME
        | attr::RDATTR_ERROR
        | attr::ACLSUPPORT
        | attr::ARCHIVE
        | attr::CANSETTIME
        | attr::CASE_INSENSITIVE
        | attr::CASE_PRESERVING
        | attr::CHOWN_RESTRICTED
        | attr::HIDDEN
        | attr::HOMOGENEOUS
        | attr::MAXLINK
        | attr::MAXNAME
        | attr::MODE
        | attr::NO_TRUNC
        | attr::NUMLINKS
        | attr::SYSTEM
        | attr::LAYOUT_BLKSIZE
        | attr::CHANGE_ATTR_TYPE => 4,
        attr::CHANGE
        | attr::SIZE
        | attr::FILEID
        | attr::FILES_AVAIL
        | attr::FILES_FREE
        | attr::FILES_TOTAL
        | attr::MAXFILESIZE
        | attr::MAXREAD
        | attr::MAXWRITE
        | attr::QUOTA_AVAIL_HARD
        | attr::QUOTA_AVAIL_SOFT
        | attr::QUOTA_USED
        | attr::RAWDEV
        | attr::SPACE_AVAIL
        | attr::SPACE_FREE
        | attr::SPACE_TOTAL
        | attr::SPACE_USED
        | attr::MOUNTED_ON_FILEID => 8,
        attr::FSID => 16,
        attr::FILEHANDLE => 4 + NFS4_FHSIZE,
        attr::OWNER | attr::OWNER_GROUP => 4 + OWNER_NAME_MAX,
        attr::TIME_ACCESS
        | attr::TIME_BACKUP
        | attr::TIME_CREATE
        | attr::TIME_DELTA
        | attr::TIME_METADATA
        | attr::TIME_MODIFY => time,
        _ => return None,
    })
}

/// The largest `GETATTR4res` (with its `resop` and status) for `mask`.
fn getattr_max(mask: &Bitmap4) -> Option<usize> {
    if mask.0.len() > BITMAP_WORDS_MAX {
        return None;
    }
    let mut values = 0;
    for a in mask.iter() {
        values += attr_max(a)?;
    }
    // resop, status, the returned bitmap, the attrlist4 length.
    Some(4 + 4 + 4 + 4 * BITMAP_WORDS_MAX + 4 + values)
}

/// The largest WRITE result: `resop`, status, count, committed, writeverf.
pub const WRITE_REPLY_MAX: usize = 8 + 4 + 4 + 8;

/// The largest result of operation `op` (its `resop`, status and result), or `None` when it
/// has no bound here.
pub fn op_reply_max(op: &OpArgs) -> Option<usize> {
    Some(match op {
        // sessionid, sequenceid, slotid, highest and target highest slotid, status flags.
        OpArgs::Sequence(_) => 4 + 4 + 16 + 4 * 5,
        OpArgs::Putfh(_)
        | OpArgs::Putrootfh
        | OpArgs::Putpubfh
        | OpArgs::Savefh
        | OpArgs::Restorefh
        | OpArgs::Lookup(_)
        | OpArgs::Lookupp => 8,
        OpArgs::Getfh => 8 + 4 + NFS4_FHSIZE,
        // supported, access.
        OpArgs::Access(_) => 8 + 4 + 4,
        OpArgs::Getattr(mask) => getattr_max(mask)?,
        OpArgs::Write { .. } => WRITE_REPLY_MAX,
        // writeverf.
        OpArgs::Commit { .. } => 8 + 8,
        _ => return None,
    })
}

/// An upper bound on the XDR size of the `COMPOUND4res` for a COMPOUND of `ops` with a tag of
/// `tag_len` bytes, or `None` when an operation's reply has none.
pub fn ops_reply_bound<'a>(
    tag_len: usize,
    ops: impl IntoIterator<Item = &'a OpArgs>,
) -> Option<usize> {
    // status, the tag echoed, the results' count.
    let mut size = 4 + 4 + xdr::padded(tag_len) + 4;
    for op in ops {
        size += op_reply_max(op)?;
    }
    Some(size)
}

/// [`ops_reply_bound`] for the `COMPOUND4args` in `args`.
pub fn compound_reply_bound(args: &[u8]) -> Option<usize> {
    let mut d = Decoder::new(args);
    let tag = d.opaque(1024).ok()?;
    let minor = d.u32().ok()?;
    let n = d.length(OPS_MAX).ok()?;
    let mut ops = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let op = d.u32().ok()?;
        ops.push(OpArgs::decode(op, minor, &mut d).ok()?);
    }
    d.finish().ok()?;
    ops_reply_bound(tag.len(), &ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs4::client_codec::encode_compound;

    fn compound(ops: &[OpArgs]) -> bytes::Bytes {
        encode_compound(b"tag", 1, ops)
    }

    #[test]
    fn a_getattr_of_fixed_attributes_is_bounded_and_small() {
        let bits = Bitmap4::from_bits(&[attr::TYPE, attr::CHANGE, attr::SIZE, attr::MODE]);
        let args = compound(&[OpArgs::Putrootfh, OpArgs::Getattr(bits)]);
        let b = compound_reply_bound(&args).unwrap();
        // status, tag, count; PUTROOTFH; GETATTR with its bitmap and 4+8+8+4 bytes of values.
        assert_eq!(b, 4 + 4 + 4 + 4 + 8 + (4 + 4 + 4 + 32 + 4 + 24));
        assert!(b < 1024);
    }

    #[test]
    fn an_acl_or_an_unknown_operation_has_no_bound() {
        let acl = compound(&[
            OpArgs::Putrootfh,
            OpArgs::Getattr(Bitmap4::from_bits(&[attr::ACL])),
        ]);
        assert_eq!(compound_reply_bound(&acl), None);
        let read = compound(&[
            OpArgs::Putrootfh,
            OpArgs::Readdir {
                cookie: 0,
                verf: Default::default(),
                dircount: 4096,
                maxcount: 4096,
                attrs: Bitmap4::from_bits(&[attr::TYPE]),
            },
        ]);
        assert_eq!(compound_reply_bound(&read), None);
    }

    #[test]
    fn any_bytes_give_a_bound_or_none_without_panicking() {
        use proptest::prelude::*;
        proptest!(|(b in proptest::collection::vec(any::<u8>(), 0..256))| {
            let _ = compound_reply_bound(&b);
        });
    }
}
