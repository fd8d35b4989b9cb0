//! File attributes (`fattr4`, RFC 8881 §5): which the server supports, how a file's are
//! encoded for GETATTR, READDIR and VERIFY, and how the settable ones are read from SETATTR,
//! CREATE and OPEN.
//!
//! Supported: every REQUIRED attribute (RFC 8881 §5.6) and the RECOMMENDED ones a Linux client
//! asks for (§5.7): ACL support (none), case and link properties, file ids, space and file
//! counts, limits, mode, owners, times, raw device numbers. Owners are numeric strings ("1000"),
//! as Linux servers send them for AUTH_SYS when ID mapping is off, and numeric strings are what
//! SETATTR accepts (anything else is NFS4ERR_BADOWNER).

use bytes::Bytes;
use rustix::fs::{StatVfs, Statx};
use xdr::{Decoder, Encoder};

use super::consts::{FH4_PERSISTENT, attr, ftype};
use super::status::{Nfsstat4, Res4};
use super::types::{Bitmap4, Fattr4, Nfstime4};

/// Largest file size the server advertises (`maxfilesize`): what a 64-bit `off_t` holds.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Longest name (`maxname`).
pub const MAX_NAME: u32 = 255;
/// Most hard links (`maxlink`).
pub const MAX_LINK: u32 = 65000;

/// The attributes this server can report.
pub fn supported() -> Bitmap4 {
    Bitmap4::from_bits(&[
        attr::SUPPORTED_ATTRS,
        attr::TYPE,
        attr::FH_EXPIRE_TYPE,
        attr::CHANGE,
        attr::SIZE,
        attr::LINK_SUPPORT,
        attr::SYMLINK_SUPPORT,
        attr::NAMED_ATTR,
        attr::FSID,
        attr::UNIQUE_HANDLES,
        attr::LEASE_TIME,
        attr::RDATTR_ERROR,
        attr::ACLSUPPORT,
        attr::CANSETTIME,
        attr::CASE_INSENSITIVE,
        attr::CASE_PRESERVING,
        attr::CHOWN_RESTRICTED,
        attr::FILEHANDLE,
        attr::FILEID,
        attr::FILES_AVAIL,
        attr::FILES_FREE,
        attr::FILES_TOTAL,
        attr::HOMOGENEOUS,
        attr::MAXFILESIZE,
        attr::MAXLINK,
        attr::MAXNAME,
        attr::MAXREAD,
        attr::MAXWRITE,
        attr::MODE,
        attr::NO_TRUNC,
        attr::NUMLINKS,
        attr::OWNER,
        attr::OWNER_GROUP,
        attr::RAWDEV,
        attr::SPACE_AVAIL,
        attr::SPACE_FREE,
        attr::SPACE_TOTAL,
        attr::SPACE_USED,
        attr::TIME_ACCESS,
        attr::TIME_ACCESS_SET,
        attr::TIME_DELTA,
        attr::TIME_METADATA,
        attr::TIME_MODIFY,
        attr::TIME_MODIFY_SET,
        attr::MOUNTED_ON_FILEID,
        attr::SUPPATTR_EXCLCREAT,
    ])
}

/// The attributes SETATTR (and the `createattrs` of CREATE and OPEN) can set.
pub fn settable() -> Bitmap4 {
    Bitmap4::from_bits(&[
        attr::SIZE,
        attr::MODE,
        attr::OWNER,
        attr::OWNER_GROUP,
        attr::TIME_ACCESS_SET,
        attr::TIME_MODIFY_SET,
    ])
}

/// `suppattr_exclcreat` (RFC 8881 §5.8.1.14): what EXCLUSIVE4_1 may set with the verifier.
/// The verifier lives in the times, so the times are not among them.
pub fn exclcreat() -> Bitmap4 {
    Bitmap4::from_bits(&[attr::SIZE, attr::MODE, attr::OWNER, attr::OWNER_GROUP])
}

/// The write-only attributes: requested in GETATTR they are an error (RFC 8881 §5.5).
fn write_only(n: u32) -> bool {
    n == attr::TIME_ACCESS_SET || n == attr::TIME_MODIFY_SET
}

/// Whether encoding `mask` needs the file system's statistics.
pub fn needs_statvfs(mask: &Bitmap4) -> bool {
    [
        attr::FILES_AVAIL,
        attr::FILES_FREE,
        attr::FILES_TOTAL,
        attr::SPACE_AVAIL,
        attr::SPACE_FREE,
        attr::SPACE_TOTAL,
    ]
    .iter()
    .any(|&b| mask.get(b))
}

/// Everything the encoder needs to know about one object.
pub struct AttrSource<'a> {
    pub st: &'a Statx,
    /// The object's file handle (for `filehandle`).
    pub fh: &'a [u8],
    /// The export's fsid (`fsid.major`; minor is 0).
    pub fsid: u64,
    /// The file system's statistics, when the mask needs them.
    pub vfs: Option<&'a StatVfs>,
    /// Lease time in seconds.
    pub lease_time: u32,
    pub max_read: u64,
    pub max_write: u64,
    /// The `mounted_on_fileid` to report (the export root's is its own fileid).
    pub mounted_on_fileid: u64,
}

impl std::fmt::Debug for AttrSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttrSource")
            .field("ino", &self.st.stx_ino)
            .field("fsid", &self.fsid)
            .field("vfs", &self.vfs.is_some())
            .finish_non_exhaustive()
    }
}

/// The NFSv4 type of a stat's mode.
pub fn nfs_type(st: &Statx) -> u32 {
    match u32::from(st.stx_mode) & 0o170000 {
        0o040000 => ftype::NF4DIR,
        0o120000 => ftype::NF4LNK,
        0o060000 => ftype::NF4BLK,
        0o020000 => ftype::NF4CHR,
        0o010000 => ftype::NF4FIFO,
        0o140000 => ftype::NF4SOCK,
        _ => ftype::NF4REG,
    }
}

/// The `change` attribute: the inode's ctime in nanoseconds, which moves on every data and
/// metadata change (what Linux nfsd reports without i_version).
pub fn change(st: &Statx) -> u64 {
    (st.stx_ctime.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::from(st.stx_ctime.tv_nsec))
}

fn time(e: &mut Encoder, t: &rustix::fs::StatxTimestamp) {
    e.put_i64(t.tv_sec);
    e.put_u32(t.tv_nsec);
}

/// Encode the attributes of `mask` that are supported, in bit order. Unsupported bits are
/// dropped from the returned mask (RFC 8881 §18.7.3: the reply's bitmap says what was
/// returned). A write-only attribute in the mask is NFS4ERR_INVAL.
pub fn encode(mask: &Bitmap4, src: &AttrSource<'_>) -> Res4<Fattr4> {
    let mut out_mask = mask.intersect(&supported());
    if mask.iter().any(write_only) {
        return Err(Nfsstat4::INVAL);
    }
    // rdattr_error is returned only by READDIR, and only for entries whose attributes could
    // not be read; for a readable object it is NFS4_OK (RFC 8881 §5.8.1.12).
    let vfs_needed = needs_statvfs(&out_mask);
    if vfs_needed && src.vfs.is_none() {
        for b in [
            attr::FILES_AVAIL,
            attr::FILES_FREE,
            attr::FILES_TOTAL,
            attr::SPACE_AVAIL,
            attr::SPACE_FREE,
            attr::SPACE_TOTAL,
        ] {
            out_mask.clear(b);
        }
    }
    out_mask.trim();
    let st = src.st;
    let mut e = Encoder::new();
    for bit in out_mask.iter() {
        match bit {
            attr::SUPPORTED_ATTRS => {
                let s = supported();
                xdr::XdrEncode::encode(&s, &mut e);
            }
            attr::TYPE => e.put_u32(nfs_type(st)),
            attr::FH_EXPIRE_TYPE => e.put_u32(FH4_PERSISTENT),
            attr::CHANGE => e.put_u64(change(st)),
            attr::SIZE => e.put_u64(st.stx_size),
            attr::LINK_SUPPORT | attr::SYMLINK_SUPPORT => e.put_bool(true),
            attr::NAMED_ATTR => e.put_bool(false),
            attr::FSID => {
                e.put_u64(src.fsid);
                e.put_u64(0);
            }
            attr::UNIQUE_HANDLES => e.put_bool(true),
            attr::LEASE_TIME => e.put_u32(src.lease_time),
            attr::RDATTR_ERROR => e.put_u32(Nfsstat4::OK.0),
            attr::ACLSUPPORT => e.put_u32(0),
            attr::CANSETTIME => e.put_bool(true),
            attr::CASE_INSENSITIVE => e.put_bool(false),
            attr::CASE_PRESERVING => e.put_bool(true),
            attr::CHOWN_RESTRICTED => e.put_bool(true),
            attr::FILEHANDLE => e.put_opaque(src.fh),
            attr::FILEID => e.put_u64(st.stx_ino),
            attr::FILES_AVAIL => e.put_u64(src.vfs.map_or(0, |v| v.f_favail)),
            attr::FILES_FREE => e.put_u64(src.vfs.map_or(0, |v| v.f_ffree)),
            attr::FILES_TOTAL => e.put_u64(src.vfs.map_or(0, |v| v.f_files)),
            attr::HOMOGENEOUS => e.put_bool(true),
            attr::MAXFILESIZE => e.put_u64(MAX_FILE_SIZE),
            attr::MAXLINK => e.put_u32(MAX_LINK),
            attr::MAXNAME => e.put_u32(MAX_NAME),
            attr::MAXREAD => e.put_u64(src.max_read),
            attr::MAXWRITE => e.put_u64(src.max_write),
            attr::MODE => e.put_u32(u32::from(st.stx_mode) & 0o7777),
            attr::NO_TRUNC => e.put_bool(true),
            attr::NUMLINKS => e.put_u32(st.stx_nlink),
            attr::OWNER => e.put_opaque(st.stx_uid.to_string().as_bytes()),
            attr::OWNER_GROUP => e.put_opaque(st.stx_gid.to_string().as_bytes()),
            attr::RAWDEV => {
                e.put_u32(st.stx_rdev_major);
                e.put_u32(st.stx_rdev_minor);
            }
            attr::SPACE_AVAIL => {
                e.put_u64(src.vfs.map_or(0, |v| v.f_bavail.saturating_mul(v.f_frsize)))
            }
            attr::SPACE_FREE => {
                e.put_u64(src.vfs.map_or(0, |v| v.f_bfree.saturating_mul(v.f_frsize)))
            }
            attr::SPACE_TOTAL => {
                e.put_u64(src.vfs.map_or(0, |v| v.f_blocks.saturating_mul(v.f_frsize)))
            }
            attr::SPACE_USED => e.put_u64(st.stx_blocks.saturating_mul(512)),
            attr::TIME_ACCESS => time(&mut e, &st.stx_atime),
            attr::TIME_DELTA => {
                e.put_i64(0);
                e.put_u32(1);
            }
            attr::TIME_METADATA => time(&mut e, &st.stx_ctime),
            attr::TIME_MODIFY => time(&mut e, &st.stx_mtime),
            attr::MOUNTED_ON_FILEID => e.put_u64(src.mounted_on_fileid),
            attr::SUPPATTR_EXCLCREAT => xdr::XdrEncode::encode(&exclcreat(), &mut e),
            // `out_mask` holds only supported bits, each handled above.
            _ => {}
        }
    }
    Ok(Fattr4 {
        mask: out_mask,
        vals: e.into_bytes(),
    })
}

/// How SETATTR sets a time (`settime4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Server,
    Client(Nfstime4),
}

/// The settable attributes read from a `fattr4`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttrs {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl SetAttrs {
    /// The bitmap of what these attributes set (`attrsset`).
    pub fn mask(&self) -> Bitmap4 {
        let mut b = Bitmap4::default();
        for (present, bit) in [
            (self.size.is_some(), attr::SIZE),
            (self.mode.is_some(), attr::MODE),
            (self.uid.is_some(), attr::OWNER),
            (self.gid.is_some(), attr::OWNER_GROUP),
            (self.atime.is_some(), attr::TIME_ACCESS_SET),
            (self.mtime.is_some(), attr::TIME_MODIFY_SET),
        ] {
            if present {
                b.set(bit);
            }
        }
        b
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == SetAttrs::default()
    }
}

/// A numeric owner string, as AUTH_SYS servers exchange them ("1000"); an empty one is no name
/// at all, NFS4ERR_INVAL (pynfs's SATT16/SATT17 expect it), any other that does not parse
/// NFS4ERR_BADOWNER.
fn numeric_id(s: &[u8]) -> Res4<u32> {
    if s.is_empty() {
        return Err(Nfsstat4::INVAL);
    }
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or(Nfsstat4::BADOWNER)
}

fn settime(d: &mut Decoder<'_>) -> Res4<SetTime> {
    match d.u32().map_err(|_| Nfsstat4::BADXDR)? {
        0 => Ok(SetTime::Server),
        1 => {
            let seconds = d.i64().map_err(|_| Nfsstat4::BADXDR)?;
            let nseconds = d.u32().map_err(|_| Nfsstat4::BADXDR)?;
            if nseconds >= 1_000_000_000 {
                return Err(Nfsstat4::INVAL);
            }
            Ok(SetTime::Client(Nfstime4 { seconds, nseconds }))
        }
        _ => Err(Nfsstat4::BADXDR),
    }
}

/// Read the settable attributes of `f` (SETATTR, CREATE, OPEN). An attribute the server does
/// not support is NFS4ERR_ATTRNOTSUPP, a supported one that cannot be set NFS4ERR_INVAL
/// (RFC 8881 §18.30.3), values that do not parse NFS4ERR_BADXDR, a bad owner
/// NFS4ERR_BADOWNER.
pub fn decode_set(f: &Fattr4) -> Res4<SetAttrs> {
    let sup = supported();
    let set = settable();
    if let Some(b) = f.mask.iter().find(|&b| !sup.get(b)) {
        let _ = b;
        return Err(Nfsstat4::ATTRNOTSUPP);
    }
    if f.mask.iter().any(|b| !set.get(b)) {
        return Err(Nfsstat4::INVAL);
    }
    let mut d = Decoder::new(&f.vals);
    let bad = |_| Nfsstat4::BADXDR;
    let mut out = SetAttrs::default();
    for bit in f.mask.iter() {
        match bit {
            attr::SIZE => out.size = Some(d.u64().map_err(bad)?),
            attr::MODE => {
                let m = d.u32().map_err(bad)?;
                if m & !0o7777 != 0 {
                    return Err(Nfsstat4::INVAL);
                }
                out.mode = Some(m);
            }
            attr::OWNER => out.uid = Some(numeric_id(d.opaque(1024).map_err(bad)?)?),
            attr::OWNER_GROUP => out.gid = Some(numeric_id(d.opaque(1024).map_err(bad)?)?),
            attr::TIME_ACCESS_SET => out.atime = Some(settime(&mut d)?),
            attr::TIME_MODIFY_SET => out.mtime = Some(settime(&mut d)?),
            _ => return Err(Nfsstat4::INVAL),
        }
    }
    if !d.is_empty() {
        return Err(Nfsstat4::BADXDR);
    }
    Ok(out)
}

/// VERIFY / NVERIFY (RFC 8881 §18.31, §18.15): whether the client's attribute values equal
/// the server's, compared in their encoded form as nfsd does. Unsupported attributes are
/// NFS4ERR_ATTRNOTSUPP; `rdattr_error` and the write-only times NFS4ERR_INVAL.
pub fn same(f: &Fattr4, src: &AttrSource<'_>) -> Res4<bool> {
    let sup = supported();
    if f.mask.iter().any(|b| !sup.get(b)) {
        return Err(Nfsstat4::ATTRNOTSUPP);
    }
    if f.mask.get(attr::RDATTR_ERROR) || f.mask.iter().any(write_only) {
        return Err(Nfsstat4::INVAL);
    }
    let ours = encode(&f.mask, src)?;
    let mut theirs = f.mask.clone();
    theirs.trim();
    if ours.mask != theirs {
        // Statistics that could not be read cannot be compared.
        return Err(Nfsstat4::SERVERFAULT);
    }
    Ok(ours.vals == Bytes::copy_from_slice(&f.vals))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(build: impl FnOnce(&mut Encoder)) -> Bytes {
        let mut e = Encoder::new();
        build(&mut e);
        e.into_bytes()
    }

    #[test]
    fn settable_attributes_decode() {
        let f = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::SIZE, attr::MODE, attr::OWNER, attr::TIME_MODIFY_SET]),
            vals: vals(|e| {
                e.put_u64(10);
                e.put_u32(0o644);
                e.put_opaque(b"1000");
                e.put_u32(1);
                e.put_i64(5);
                e.put_u32(6);
            }),
        };
        let s = decode_set(&f).unwrap();
        assert_eq!(s.size, Some(10));
        assert_eq!(s.mode, Some(0o644));
        assert_eq!(s.uid, Some(1000));
        assert_eq!(
            s.mtime,
            Some(SetTime::Client(Nfstime4 {
                seconds: 5,
                nseconds: 6
            }))
        );
        assert_eq!(s.mask(), f.mask);
    }

    #[test]
    fn errors_follow_rfc8881() {
        let ro = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::TYPE]),
            vals: vals(|e| e.put_u32(1)),
        };
        assert_eq!(decode_set(&ro), Err(Nfsstat4::INVAL));
        let unsup = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::ACL]),
            vals: Bytes::new(),
        };
        assert_eq!(decode_set(&unsup), Err(Nfsstat4::ATTRNOTSUPP));
        let short = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::SIZE]),
            vals: vals(|e| e.put_u32(1)),
        };
        assert_eq!(decode_set(&short), Err(Nfsstat4::BADXDR));
        let trailing = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::MODE]),
            vals: vals(|e| {
                e.put_u32(0o600);
                e.put_u32(0);
            }),
        };
        assert_eq!(decode_set(&trailing), Err(Nfsstat4::BADXDR));
        let owner = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::OWNER]),
            vals: vals(|e| e.put_opaque(b"alice@example")),
        };
        assert_eq!(decode_set(&owner), Err(Nfsstat4::BADOWNER));
    }

    #[test]
    fn encode_and_verify_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        let fd =
            rustix::fs::open(&p, rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty()).unwrap();
        let st = rustix::fs::statx(
            &fd,
            "",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::ALL,
        )
        .unwrap();
        let src = AttrSource {
            st: &st,
            fh: b"fh",
            fsid: 7,
            vfs: None,
            lease_time: 90,
            max_read: 1 << 20,
            max_write: 1 << 20,
            mounted_on_fileid: 1,
        };
        let mask = Bitmap4::from_bits(&[attr::TYPE, attr::SIZE, attr::SPACE_FREE, attr::ACL]);
        let f = encode(&mask, &src).unwrap();
        // ACL is unsupported and the statistics were not given: both dropped.
        assert_eq!(f.mask, Bitmap4::from_bits(&[attr::TYPE, attr::SIZE]));
        assert_eq!(&f.vals[..], &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5][..]);
        let good = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::SIZE]),
            vals: vals(|e| e.put_u64(5)),
        };
        assert_eq!(same(&good, &src), Ok(true));
        let bad = Fattr4 {
            mask: Bitmap4::from_bits(&[attr::SIZE]),
            vals: vals(|e| e.put_u64(6)),
        };
        assert_eq!(same(&bad, &src), Ok(false));
        let wo = Bitmap4::from_bits(&[attr::TIME_MODIFY_SET]);
        assert_eq!(encode(&wo, &src).unwrap_err(), Nfsstat4::INVAL);
    }
}
