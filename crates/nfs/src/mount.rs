//! MOUNT version 3 protocol types (RFC 1813 Appendix I).
//!
//! RFC 8267 §5.1: MOUNT is served over TCP only; nothing in it is DDP-eligible.

use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::nfs3::FHSIZE;
pub use crate::xdr_util::{List, MAX_LIST};
use crate::xdr_util::{xdr_enum, xdr_opaque, xdr_struct};

/// MOUNT program number.
pub const PROGRAM: u32 = 100005;
/// MOUNT version 3.
pub const VERSION: u32 = 3;
/// MNTPATHLEN.
pub const MNTPATHLEN: u32 = 1024;
/// MNTNAMLEN.
pub const MNTNAMLEN: u32 = 255;

/// Procedure numbers (RFC 1813 Appendix I).
pub mod proc_ {
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;

    /// Each procedure's name, by number (RFC 1813 Appendix I).
    pub const NAMES: [&str; 6] = ["NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];
}

xdr_enum! {
    /// `mountstat3`.
    pub enum Mountstat3 {
        Ok = 0, Perm = 1, NoEnt = 2, Io = 5, Acces = 13, NotDir = 20, Inval = 22,
        NameTooLong = 63, NotSupp = 10004, ServerFault = 10006,
    }
}

xdr_opaque! {
    /// `dirpath` (string, at most MNTPATHLEN bytes).
    pub struct DirPath, max = MNTPATHLEN
}
xdr_opaque! {
    /// `name` (string, at most MNTNAMLEN bytes).
    pub struct Name, max = MNTNAMLEN
}
xdr_opaque! {
    /// `fhandle3` (at most FHSIZE3 = 64 bytes).
    pub struct Fhandle3, max = FHSIZE
}

/// Decoder bound on `auth_flavors<>`.
pub const MAX_FLAVORS: u32 = 64;

/// `mountres3_ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOk {
    pub fhandle: Fhandle3,
    pub auth_flavors: Vec<u32>,
}

impl XdrEncode for MountOk {
    fn encode(&self, enc: &mut Encoder) {
        self.fhandle.encode(enc);
        enc.put_array(&self.auth_flavors, |e, f| e.put_u32(*f));
    }
    fn encoded_len(&self) -> usize {
        self.fhandle.encoded_len() + 4 + 4 * self.auth_flavors.len()
    }
}

impl<'a> XdrDecode<'a> for MountOk {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        Ok(MountOk {
            fhandle: Fhandle3::decode(dec)?,
            auth_flavors: dec.array(MAX_FLAVORS, |d| d.u32())?,
        })
    }
}

/// `mountres3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRes {
    Ok(MountOk),
    Err(Mountstat3),
}

impl XdrEncode for MountRes {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            MountRes::Ok(ok) => {
                enc.put_u32(0);
                ok.encode(enc);
            }
            MountRes::Err(s) => s.encode(enc),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            MountRes::Ok(ok) => ok.encoded_len(),
            MountRes::Err(_) => 0,
        }
    }
}

impl<'a> XdrDecode<'a> for MountRes {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match Mountstat3::decode(dec)? {
            Mountstat3::Ok => Ok(MountRes::Ok(MountOk::decode(dec)?)),
            s => Ok(MountRes::Err(s)),
        }
    }
}

xdr_struct! {
    /// One `mountbody` of the DUMP list.
    pub struct MountBody { pub hostname: Name, pub directory: DirPath }
}

xdr_struct! {
    /// One `exportnode`: a directory and the groups allowed to mount it.
    pub struct ExportNode { pub dir: DirPath, pub groups: List<Name> }
}

/// DUMP result.
pub type MountList = List<MountBody>;
/// EXPORT result.
pub type Exports = List<ExportNode>;
