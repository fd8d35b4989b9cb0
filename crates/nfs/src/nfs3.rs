//! NFS version 3 protocol types (RFC 1813 §2 and §3): every argument and result structure of
//! the 22 procedures, with checked decoding, exact encoding and `encoded_len`.
//!
//! DDP-eligibility (RFC 8267 §4) is built into the types: [`Data`] (WRITE arguments, READ
//! results) and [`NfsPath`] (SYMLINK arguments, READLINK results) encode with
//! [`xdr::Encoder::put_ddp_opaque`]; every other item encodes inline.

use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::xdr_util::{Void, xdr_enum, xdr_opaque, xdr_struct};

/// NFS program number (RFC 1813 §2).
pub const PROGRAM: u32 = 100003;
/// NFS version 3.
pub const VERSION: u32 = 3;
/// NFS3_FHSIZE: the largest file handle (RFC 1813 §2.4).
pub const FHSIZE: u32 = 64;
/// NFS3_COOKIEVERFSIZE, NFS3_CREATEVERFSIZE, NFS3_WRITEVERFSIZE (RFC 1813 §2.4).
pub const VERFSIZE: usize = 8;
/// Decoder bound for file names (`filename3` is an unbounded string; anything longer than this
/// cannot be a valid name on any server we talk to, and is GARBAGE_ARGS).
pub const MAX_NAME_WIRE: u32 = 4096;
/// Decoder bound for paths (`nfspath3`).
pub const MAX_PATH_WIRE: u32 = 4096;
/// Decoder bound for READ/WRITE data.
pub const MAX_DATA_WIRE: u32 = 64 << 20;
/// Decoder bound on the number of directory entries in one READDIR/READDIRPLUS reply.
pub const MAX_DIR_ENTRIES: usize = 1 << 16;

/// Procedure numbers (RFC 1813 §3).
pub mod proc_ {
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;
    /// Number of procedures.
    pub const COUNT: u32 = 22;

    /// Each procedure's name, by number (RFC 1813 §3.3): for logs, counters and decoders.
    pub const NAMES: [&str; COUNT as usize] = [
        "NULL",
        "GETATTR",
        "SETATTR",
        "LOOKUP",
        "ACCESS",
        "READLINK",
        "READ",
        "WRITE",
        "CREATE",
        "MKDIR",
        "SYMLINK",
        "MKNOD",
        "REMOVE",
        "RMDIR",
        "RENAME",
        "LINK",
        "READDIR",
        "READDIRPLUS",
        "FSSTAT",
        "FSINFO",
        "PATHCONF",
        "COMMIT",
    ];
}

/// Whether NFSv3 procedure `proc_` changes the file system (RFC 1813 §3.3): SETATTR, WRITE,
/// CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and LINK. A read-only export refuses
/// these with NFS3ERR_ROFS; the duplicate request cache replays them.
pub fn modifies(proc_: u32) -> bool {
    matches!(
        proc_,
        proc_::SETATTR
            | proc_::WRITE
            | proc_::CREATE
            | proc_::MKDIR
            | proc_::SYMLINK
            | proc_::MKNOD
            | proc_::REMOVE
            | proc_::RMDIR
            | proc_::RENAME
            | proc_::LINK
    )
}

/// ACCESS bits (RFC 1813 §3.3.4).
pub mod access {
    pub const READ: u32 = 0x0001;
    pub const LOOKUP: u32 = 0x0002;
    pub const MODIFY: u32 = 0x0004;
    pub const EXTEND: u32 = 0x0008;
    pub const DELETE: u32 = 0x0010;
    pub const EXECUTE: u32 = 0x0020;
    pub const ALL: u32 = 0x003f;
}

/// FSINFO properties (RFC 1813 §3.3.19).
pub mod fsf {
    pub const LINK: u32 = 0x0001;
    pub const SYMLINK: u32 = 0x0002;
    pub const HOMOGENEOUS: u32 = 0x0008;
    pub const CANSETTIME: u32 = 0x0010;
}

xdr_enum! {
    /// `nfsstat3` (RFC 1813 §2.6).
    pub enum Nfsstat3 {
        Ok = 0, Perm = 1, NoEnt = 2, Io = 5, Nxio = 6, Acces = 13, Exist = 17, Xdev = 18,
        NoDev = 19, NotDir = 20, IsDir = 21, Inval = 22, FBig = 27, NoSpc = 28, Rofs = 30,
        MLink = 31, NameTooLong = 63, NotEmpty = 66, DQuot = 69, Stale = 70, Remote = 71,
        BadHandle = 10001, NotSync = 10002, BadCookie = 10003, NotSupp = 10004,
        TooSmall = 10005, ServerFault = 10006, BadType = 10007, Jukebox = 10008,
    }
}

impl std::fmt::Display for Nfsstat3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NFS3ERR_{:?} ({})", self, self.code())
    }
}

xdr_enum! {
    /// `ftype3` (RFC 1813 §2.6).
    pub enum Ftype3 { Reg = 1, Dir = 2, Blk = 3, Chr = 4, Lnk = 5, Sock = 6, Fifo = 7 }
}

xdr_enum! {
    /// `stable_how` (RFC 1813 §3.3.7).
    pub enum StableHow { Unstable = 0, DataSync = 1, FileSync = 2 }
}

xdr_opaque! {
    /// `nfs_fh3` (RFC 1813 §2.5): at most 64 bytes.
    pub struct Fh3, max = FHSIZE
}
xdr_opaque! {
    /// `filename3`.
    pub struct Filename3, max = MAX_NAME_WIRE
}
xdr_opaque! {
    /// `nfspath3`, used only by SYMLINK arguments and READLINK results, both DDP-eligible
    /// (RFC 8267 §4).
    pub struct NfsPath, max = MAX_PATH_WIRE, ddp
}
xdr_opaque! {
    /// READ result / WRITE argument data: DDP-eligible (RFC 8267 §4).
    pub struct Data, max = MAX_DATA_WIRE, ddp
}

/// An 8-byte verifier (`cookieverf3`, `createverf3`, `writeverf3`).
pub type Verf = [u8; VERFSIZE];

xdr_struct! {
    /// `specdata3`.
    #[derive(Copy, Default)]
    pub struct Specdata3 { pub specdata1: u32, pub specdata2: u32 }
}
xdr_struct! {
    /// `nfstime3`.
    #[derive(Copy, Default)]
    pub struct Nfstime3 { pub seconds: u32, pub nseconds: u32 }
}
xdr_struct! {
    /// `fattr3` (RFC 1813 §2.6).
    pub struct Fattr3 {
        pub ftype: Ftype3,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub size: u64,
        pub used: u64,
        pub rdev: Specdata3,
        pub fsid: u64,
        pub fileid: u64,
        pub atime: Nfstime3,
        pub mtime: Nfstime3,
        pub ctime: Nfstime3,
    }
}
/// `post_op_attr`.
pub type PostOpAttr = Option<Fattr3>;
/// `post_op_fh3`.
pub type PostOpFh3 = Option<Fh3>;

xdr_struct! {
    /// `wcc_attr`.
    pub struct WccAttr { pub size: u64, pub mtime: Nfstime3, pub ctime: Nfstime3 }
}
/// `pre_op_attr`.
pub type PreOpAttr = Option<WccAttr>;

xdr_struct! {
    /// `wcc_data` (RFC 1813 §2.6).
    pub struct WccData { pub before: PreOpAttr, pub after: PostOpAttr }
}

impl WccData {
    /// No weak cache consistency data.
    pub const NONE: WccData = WccData {
        before: None,
        after: None,
    };
}

/// `set_atime` / `set_mtime` (`time_how`, RFC 1813 §2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime {
    #[default]
    DontChange,
    ServerTime,
    ClientTime(Nfstime3),
}

impl XdrEncode for SetTime {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            SetTime::DontChange => enc.put_u32(0),
            SetTime::ServerTime => enc.put_u32(1),
            SetTime::ClientTime(t) => {
                enc.put_u32(2);
                t.encode(enc);
            }
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            SetTime::ClientTime(_) => 12,
            _ => 4,
        }
    }
}

impl<'a> XdrDecode<'a> for SetTime {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match dec.u32()? {
            0 => Ok(SetTime::DontChange),
            1 => Ok(SetTime::ServerTime),
            2 => Ok(SetTime::ClientTime(Nfstime3::decode(dec)?)),
            v => Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "time_how",
                value: i64::from(v),
            }),
        }
    }
}

xdr_struct! {
    /// `sattr3` (RFC 1813 §2.6). Each `Option` is the `set_*` union switched by a bool.
    #[derive(Default)]
    pub struct Sattr3 {
        pub mode: Option<u32>,
        pub uid: Option<u32>,
        pub gid: Option<u32>,
        pub size: Option<u64>,
        pub atime: SetTime,
        pub mtime: SetTime,
    }
}

xdr_struct! {
    /// `diropargs3`.
    pub struct DirOpArgs3 { pub dir: Fh3, pub name: Filename3 }
}

/// A result union switched on `nfsstat3`: `NFS3_OK` carries `T`, every other status `F`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Res<T, F> {
    Ok(T),
    Err(Nfsstat3, F),
}

impl<T, F> Res<T, F> {
    /// The status.
    pub fn status(&self) -> Nfsstat3 {
        match self {
            Res::Ok(_) => Nfsstat3::Ok,
            Res::Err(s, _) => *s,
        }
    }
    /// The success body, if any.
    pub fn ok(self) -> Option<T> {
        match self {
            Res::Ok(t) => Some(t),
            Res::Err(..) => None,
        }
    }
}

impl<T: XdrEncode, F: XdrEncode> XdrEncode for Res<T, F> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            Res::Ok(t) => {
                enc.put_u32(0);
                t.encode(enc);
            }
            Res::Err(s, f) => {
                s.encode(enc);
                f.encode(enc);
            }
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            Res::Ok(t) => t.encoded_len(),
            Res::Err(_, f) => f.encoded_len(),
        }
    }
}

impl<'a, T: XdrDecode<'a>, F: XdrDecode<'a>> XdrDecode<'a> for Res<T, F> {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match Nfsstat3::decode(dec)? {
            Nfsstat3::Ok => Ok(Res::Ok(T::decode(dec)?)),
            s => Ok(Res::Err(s, F::decode(dec)?)),
        }
    }
}

// ---- 1 GETATTR ----
xdr_struct! { pub struct GetattrArgs { pub object: Fh3 } }
xdr_struct! { pub struct GetattrOk { pub obj_attributes: Fattr3 } }
pub type GetattrRes = Res<GetattrOk, Void>;

// ---- 2 SETATTR ----
xdr_struct! {
    /// `guard` is `sattrguard3`: a ctime the object must still have.
    pub struct SetattrArgs { pub object: Fh3, pub new_attributes: Sattr3, pub guard: Option<Nfstime3> }
}
xdr_struct! { pub struct WccOnly { pub wcc: WccData } }
pub type SetattrRes = Res<WccOnly, WccOnly>;

// ---- 3 LOOKUP ----
xdr_struct! { pub struct LookupArgs { pub what: DirOpArgs3 } }
xdr_struct! {
    pub struct LookupOk { pub object: Fh3, pub obj_attributes: PostOpAttr, pub dir_attributes: PostOpAttr }
}
xdr_struct! { pub struct AttrOnly { pub attributes: PostOpAttr } }
pub type LookupRes = Res<LookupOk, AttrOnly>;

// ---- 4 ACCESS ----
xdr_struct! { pub struct AccessArgs { pub object: Fh3, pub access: u32 } }
xdr_struct! { pub struct AccessOk { pub obj_attributes: PostOpAttr, pub access: u32 } }
pub type AccessRes = Res<AccessOk, AttrOnly>;

// ---- 5 READLINK ----
xdr_struct! { pub struct ReadlinkArgs { pub symlink: Fh3 } }
xdr_struct! {
    /// `data` is DDP-eligible (RFC 8267 §4).
    pub struct ReadlinkOk { pub symlink_attributes: PostOpAttr, pub data: NfsPath }
}
pub type ReadlinkRes = Res<ReadlinkOk, AttrOnly>;

// ---- 6 READ ----
xdr_struct! { pub struct ReadArgs { pub file: Fh3, pub offset: u64, pub count: u32 } }
xdr_struct! {
    /// `data` is DDP-eligible (RFC 8267 §4).
    pub struct ReadOk { pub file_attributes: PostOpAttr, pub count: u32, pub eof: bool, pub data: Data }
}
pub type ReadRes = Res<ReadOk, AttrOnly>;

// ---- 7 WRITE ----
xdr_struct! {
    /// `data` is DDP-eligible (RFC 8267 §4).
    pub struct WriteArgs { pub file: Fh3, pub offset: u64, pub count: u32, pub stable: StableHow, pub data: Data }
}
xdr_struct! {
    pub struct WriteOk { pub file_wcc: WccData, pub count: u32, pub committed: StableHow, pub verf: Verf }
}
pub type WriteRes = Res<WriteOk, WccOnly>;

// ---- 8 CREATE ----
/// `createhow3` (RFC 1813 §3.3.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow3 {
    Unchecked(Sattr3),
    Guarded(Sattr3),
    Exclusive(Verf),
}

impl XdrEncode for CreateHow3 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            CreateHow3::Unchecked(s) => {
                enc.put_u32(0);
                s.encode(enc);
            }
            CreateHow3::Guarded(s) => {
                enc.put_u32(1);
                s.encode(enc);
            }
            CreateHow3::Exclusive(v) => {
                enc.put_u32(2);
                v.encode(enc);
            }
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CreateHow3::Unchecked(s) | CreateHow3::Guarded(s) => s.encoded_len(),
            CreateHow3::Exclusive(_) => 8,
        }
    }
}

impl<'a> XdrDecode<'a> for CreateHow3 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match dec.u32()? {
            0 => Ok(CreateHow3::Unchecked(Sattr3::decode(dec)?)),
            1 => Ok(CreateHow3::Guarded(Sattr3::decode(dec)?)),
            2 => Ok(CreateHow3::Exclusive(Verf::decode(dec)?)),
            v => Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "createmode3",
                value: i64::from(v),
            }),
        }
    }
}

xdr_struct! { pub struct CreateArgs { pub where_: DirOpArgs3, pub how: CreateHow3 } }
xdr_struct! {
    /// The success body shared by CREATE, MKDIR, SYMLINK and MKNOD.
    pub struct NewObjOk { pub obj: PostOpFh3, pub obj_attributes: PostOpAttr, pub dir_wcc: WccData }
}
pub type NewObjRes = Res<NewObjOk, WccOnly>;

// ---- 9 MKDIR ----
xdr_struct! { pub struct MkdirArgs { pub where_: DirOpArgs3, pub attributes: Sattr3 } }

// ---- 10 SYMLINK ----
xdr_struct! {
    /// `symlink_data` is DDP-eligible (RFC 8267 §4).
    pub struct SymlinkArgs { pub where_: DirOpArgs3, pub symlink_attributes: Sattr3, pub symlink_data: NfsPath }
}

// ---- 11 MKNOD ----
/// `mknoddata3` (RFC 1813 §3.3.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MknodData3 {
    Chr(Sattr3, Specdata3),
    Blk(Sattr3, Specdata3),
    Sock(Sattr3),
    Fifo(Sattr3),
    /// REG, DIR or LNK: void arm.
    Other(Ftype3),
}

impl XdrEncode for MknodData3 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            MknodData3::Chr(s, d) | MknodData3::Blk(s, d) => {
                enc.put_u32(if matches!(self, MknodData3::Chr(..)) {
                    4
                } else {
                    3
                });
                s.encode(enc);
                d.encode(enc);
            }
            MknodData3::Sock(s) | MknodData3::Fifo(s) => {
                enc.put_u32(if matches!(self, MknodData3::Sock(..)) {
                    6
                } else {
                    7
                });
                s.encode(enc);
            }
            MknodData3::Other(t) => t.encode(enc),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            MknodData3::Chr(s, _) | MknodData3::Blk(s, _) => s.encoded_len() + 8,
            MknodData3::Sock(s) | MknodData3::Fifo(s) => s.encoded_len(),
            MknodData3::Other(_) => 0,
        }
    }
}

impl<'a> XdrDecode<'a> for MknodData3 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        Ok(match Ftype3::decode(dec)? {
            Ftype3::Chr => MknodData3::Chr(Sattr3::decode(dec)?, Specdata3::decode(dec)?),
            Ftype3::Blk => MknodData3::Blk(Sattr3::decode(dec)?, Specdata3::decode(dec)?),
            Ftype3::Sock => MknodData3::Sock(Sattr3::decode(dec)?),
            Ftype3::Fifo => MknodData3::Fifo(Sattr3::decode(dec)?),
            t => MknodData3::Other(t),
        })
    }
}

xdr_struct! { pub struct MknodArgs { pub where_: DirOpArgs3, pub what: MknodData3 } }

// ---- 12 REMOVE, 13 RMDIR ----
xdr_struct! { pub struct RemoveArgs { pub object: DirOpArgs3 } }
pub type RemoveRes = Res<WccOnly, WccOnly>;

// ---- 14 RENAME ----
xdr_struct! { pub struct RenameArgs { pub from: DirOpArgs3, pub to: DirOpArgs3 } }
xdr_struct! { pub struct RenameWcc { pub fromdir_wcc: WccData, pub todir_wcc: WccData } }
pub type RenameRes = Res<RenameWcc, RenameWcc>;

// ---- 15 LINK ----
xdr_struct! { pub struct LinkArgs { pub file: Fh3, pub link: DirOpArgs3 } }
xdr_struct! { pub struct LinkWcc { pub file_attributes: PostOpAttr, pub linkdir_wcc: WccData } }
pub type LinkRes = Res<LinkWcc, LinkWcc>;

// ---- 16 READDIR ----
xdr_struct! {
    pub struct ReaddirArgs { pub dir: Fh3, pub cookie: u64, pub cookieverf: Verf, pub count: u32 }
}
xdr_struct! { pub struct Entry3 { pub fileid: u64, pub name: Filename3, pub cookie: u64 } }

/// A linked list (`entry *nextentry`) of directory entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntryList<T>(pub Vec<T>);

impl<T: XdrEncode> XdrEncode for EntryList<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_list(&self.0, |e, v| v.encode(e));
    }
    fn encoded_len(&self) -> usize {
        4 + self.0.iter().map(|e| 4 + e.encoded_len()).sum::<usize>()
    }
}

impl<'a, T: XdrDecode<'a>> XdrDecode<'a> for EntryList<T> {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        dec.list(MAX_DIR_ENTRIES, T::decode).map(EntryList)
    }
}

xdr_struct! {
    pub struct ReaddirOk { pub dir_attributes: PostOpAttr, pub cookieverf: Verf, pub entries: EntryList<Entry3>, pub eof: bool }
}
pub type ReaddirRes = Res<ReaddirOk, AttrOnly>;

// ---- 17 READDIRPLUS ----
xdr_struct! {
    pub struct ReaddirplusArgs { pub dir: Fh3, pub cookie: u64, pub cookieverf: Verf, pub dircount: u32, pub maxcount: u32 }
}
xdr_struct! {
    pub struct Entryplus3 { pub fileid: u64, pub name: Filename3, pub cookie: u64, pub name_attributes: PostOpAttr, pub name_handle: PostOpFh3 }
}
xdr_struct! {
    pub struct ReaddirplusOk { pub dir_attributes: PostOpAttr, pub cookieverf: Verf, pub entries: EntryList<Entryplus3>, pub eof: bool }
}
pub type ReaddirplusRes = Res<ReaddirplusOk, AttrOnly>;

// ---- 18 FSSTAT ----
xdr_struct! { pub struct FsArgs { pub fsroot: Fh3 } }
xdr_struct! {
    pub struct FsstatOk {
        pub obj_attributes: PostOpAttr,
        pub tbytes: u64, pub fbytes: u64, pub abytes: u64,
        pub tfiles: u64, pub ffiles: u64, pub afiles: u64,
        pub invarsec: u32,
    }
}
pub type FsstatRes = Res<FsstatOk, AttrOnly>;

// ---- 19 FSINFO ----
xdr_struct! {
    pub struct FsinfoOk {
        pub obj_attributes: PostOpAttr,
        pub rtmax: u32, pub rtpref: u32, pub rtmult: u32,
        pub wtmax: u32, pub wtpref: u32, pub wtmult: u32,
        pub dtpref: u32,
        pub maxfilesize: u64,
        pub time_delta: Nfstime3,
        pub properties: u32,
    }
}
pub type FsinfoRes = Res<FsinfoOk, AttrOnly>;

// ---- 20 PATHCONF ----
xdr_struct! {
    pub struct PathconfOk {
        pub obj_attributes: PostOpAttr,
        pub linkmax: u32, pub name_max: u32,
        pub no_trunc: bool, pub chown_restricted: bool, pub case_insensitive: bool, pub case_preserving: bool,
    }
}
pub type PathconfRes = Res<PathconfOk, AttrOnly>;

// ---- 21 COMMIT ----
xdr_struct! { pub struct CommitArgs { pub file: Fh3, pub offset: u64, pub count: u32 } }
xdr_struct! { pub struct CommitOk { pub file_wcc: WccData, pub verf: Verf } }
pub type CommitRes = Res<CommitOk, WccOnly>;

/// Encoded size of `fattr3`.
pub const FATTR3_LEN: usize = 84;
/// Encoded size of a present `post_op_attr`.
pub const POST_OP_ATTR_MAX: usize = 4 + FATTR3_LEN;
/// Encoded size of a full `wcc_data`.
pub const WCC_DATA_MAX: usize = 4 + 24 + POST_OP_ATTR_MAX;
/// Encoded size of the largest `post_op_fh3`.
pub const POST_OP_FH_MAX: usize = 4 + 4 + FHSIZE as usize;

/// Skip over a procedure's arguments, returning the byte range of the contents of its
/// DDP-eligible item, if it has one (RFC 8267 §4: WRITE data, SYMLINK path). Decodes the
/// whole argument structure, so malformed arguments are reported.
pub fn args_ddp_item(proc_: u32, args: &[u8]) -> xdr::Result<Option<std::ops::Range<usize>>> {
    let mut dec = Decoder::new(args);
    let range = match proc_ {
        proc_::WRITE => {
            Fh3::decode(&mut dec)?;
            dec.u64()?;
            dec.u32()?;
            StableHow::decode(&mut dec)?;
            let len = dec.length(MAX_DATA_WIRE)? as usize;
            let start = dec.position();
            dec.opaque_fixed(len)?;
            Some(start..start + len)
        }
        proc_::SYMLINK => {
            DirOpArgs3::decode(&mut dec)?;
            Sattr3::decode(&mut dec)?;
            let len = dec.length(MAX_PATH_WIRE)? as usize;
            let start = dec.position();
            dec.opaque_fixed(len)?;
            Some(start..start + len)
        }
        _ => {
            skip_args(proc_, &mut dec)?;
            None
        }
    };
    dec.finish()?;
    Ok(range)
}

fn skip_args(proc_: u32, dec: &mut Decoder<'_>) -> xdr::Result<()> {
    match proc_ {
        proc_::NULL => {}
        proc_::GETATTR => {
            GetattrArgs::decode(dec)?;
        }
        proc_::SETATTR => {
            SetattrArgs::decode(dec)?;
        }
        proc_::LOOKUP => {
            LookupArgs::decode(dec)?;
        }
        proc_::ACCESS => {
            AccessArgs::decode(dec)?;
        }
        proc_::READLINK => {
            ReadlinkArgs::decode(dec)?;
        }
        proc_::READ => {
            ReadArgs::decode(dec)?;
        }
        proc_::WRITE => {
            WriteArgs::decode(dec)?;
        }
        proc_::CREATE => {
            CreateArgs::decode(dec)?;
        }
        proc_::MKDIR => {
            MkdirArgs::decode(dec)?;
        }
        proc_::SYMLINK => {
            SymlinkArgs::decode(dec)?;
        }
        proc_::MKNOD => {
            MknodArgs::decode(dec)?;
        }
        proc_::REMOVE | proc_::RMDIR => {
            RemoveArgs::decode(dec)?;
        }
        proc_::RENAME => {
            RenameArgs::decode(dec)?;
        }
        proc_::LINK => {
            LinkArgs::decode(dec)?;
        }
        proc_::READDIR => {
            ReaddirArgs::decode(dec)?;
        }
        proc_::READDIRPLUS => {
            ReaddirplusArgs::decode(dec)?;
        }
        proc_::FSSTAT | proc_::FSINFO | proc_::PATHCONF => {
            FsArgs::decode(dec)?;
        }
        proc_::COMMIT => {
            CommitArgs::decode(dec)?;
        }
        v => {
            return Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "nfs3 procedure",
                value: i64::from(v),
            });
        }
    }
    Ok(())
}
