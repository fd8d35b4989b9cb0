//! NFSACL version 3 (program 100227), the side protocol Linux and Solaris NFSv3 clients use to
//! read and write POSIX ACLs: the GETACL and SETACL types, with a checked decoder.
//!
//! There is no RFC for NFSACL; the layout follows what Linux puts on the wire (facts gathered
//! from Linux's nfsacl code): an ACL is its entry count followed by a counted array of
//! `{ type, id, perm }` entries, at most 1024 of them (`NFS_ACL_MAX_ENTRIES`). Over
//! RPC-over-RDMA nothing in NFSACL is DDP-eligible (RFC 8267 §5.2); see
//! [`crate::ulb::NfsAclBinding`] for the binding and its short Reply chunk retry.

use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::nfs3::{Fh3, PostOpAttr, Res};

/// The NFSACL program number.
pub const PROGRAM: u32 = 100227;
/// The version whose layout this module implements.
pub const VERSION: u32 = 3;

/// NFSACL version 3 procedures.
pub mod proc_ {
    pub const NULL: u32 = 0;
    pub const GETACL: u32 = 1;
    pub const SETACL: u32 = 2;
}

/// GETACL/SETACL mask bits: which ACLs (and counts) are asked for or carried.
pub mod mask {
    pub const ACL: u32 = 0x1;
    pub const ACLCNT: u32 = 0x2;
    pub const DFACL: u32 = 0x4;
    pub const DFACLCNT: u32 = 0x8;
}

/// Flag set in the type of a default ACL's entries.
pub const ACL_DEFAULT: u32 = 0x1000;
/// Most entries in one ACL on the wire (Linux `NFS_ACL_MAX_ENTRIES`).
pub const MAX_ENTRIES: u32 = 1024;

/// One ACL entry: POSIX tag (`ACL_USER_OBJ` 0x01, `ACL_USER` 0x02, `ACL_GROUP_OBJ` 0x04,
/// `ACL_GROUP` 0x08, `ACL_MASK` 0x10, `ACL_OTHER` 0x20, with [`ACL_DEFAULT`] for default
/// entries), the user or group id, and the rwx permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u32,
    pub id: u32,
    pub perm: u32,
}

/// One ACL as it travels: the count the sender states and the entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Acl {
    pub count: u32,
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// An ACL whose count is its number of entries.
    pub fn new(entries: Vec<AclEntry>) -> Self {
        Acl {
            count: entries.len() as u32,
            entries,
        }
    }

    /// Encoded size of an ACL of `n` entries.
    pub const fn wire_len(n: usize) -> usize {
        8 + 12 * n
    }
}

impl XdrEncode for Acl {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.count);
        enc.put_u32(self.entries.len() as u32);
        for e in &self.entries {
            enc.put_u32(e.tag);
            enc.put_u32(e.id);
            enc.put_u32(e.perm);
        }
    }
    fn encoded_len(&self) -> usize {
        Acl::wire_len(self.entries.len())
    }
}

impl<'a> XdrDecode<'a> for Acl {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        let count = dec.u32()?;
        let n = dec.length(MAX_ENTRIES)?;
        let mut entries = Vec::with_capacity(n as usize);
        for _ in 0..n {
            entries.push(AclEntry {
                tag: dec.u32()?,
                id: dec.u32()?,
                perm: dec.u32()?,
            });
        }
        Ok(Acl { count, entries })
    }
}

/// GETACL3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetAclArgs {
    pub fh: Fh3,
    pub mask: u32,
}

impl XdrEncode for GetAclArgs {
    fn encode(&self, enc: &mut Encoder) {
        self.fh.encode(enc);
        enc.put_u32(self.mask);
    }
    fn encoded_len(&self) -> usize {
        self.fh.encoded_len() + 4
    }
}

impl<'a> XdrDecode<'a> for GetAclArgs {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        Ok(GetAclArgs {
            fh: Fh3::decode(dec)?,
            mask: dec.u32()?,
        })
    }
}

/// GETACL3resok: the attributes, the mask answered, the access and the default ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetAclOk {
    pub attributes: PostOpAttr,
    pub mask: u32,
    pub access: Acl,
    pub default: Acl,
}

impl XdrEncode for GetAclOk {
    fn encode(&self, enc: &mut Encoder) {
        self.attributes.encode(enc);
        enc.put_u32(self.mask);
        self.access.encode(enc);
        self.default.encode(enc);
    }
    fn encoded_len(&self) -> usize {
        self.attributes.encoded_len() + 4 + self.access.encoded_len() + self.default.encoded_len()
    }
}

impl<'a> XdrDecode<'a> for GetAclOk {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        Ok(GetAclOk {
            attributes: PostOpAttr::decode(dec)?,
            mask: dec.u32()?,
            access: Acl::decode(dec)?,
            default: Acl::decode(dec)?,
        })
    }
}

/// GETACL3res: the ACLs, or a status with the attributes.
pub type GetAclRes = Res<GetAclOk, PostOpAttr>;

/// The largest GETACL3res (results only, no RPC header) with at most `entries` entries in each
/// of the two ACLs: status, post_op_attr (present: 4 + 84), mask, two ACLs.
pub const fn getacl_results_max(entries: usize) -> usize {
    4 + 4 + 84 + 4 + 2 * Acl::wire_len(entries)
}
