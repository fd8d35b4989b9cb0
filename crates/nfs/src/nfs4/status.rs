//! `nfsstat4` (RFC 8881 §15.1, RFC 7862 §11): every status code, as a newtype so that a code
//! this server never produces still round-trips through the decoder and the client.

use std::fmt;

/// An NFSv4 status code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nfsstat4(pub u32);

macro_rules! statuses {
    ($( $name:ident = $v:expr ),* $(,)?) => {
        impl Nfsstat4 {
            $( pub const $name: Nfsstat4 = Nfsstat4($v); )*

            /// The name RFC 8881 gives the code (`NFS4ERR_` prefix dropped), or `None`.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $( $v => Some(stringify!($name)), )* _ => None }
            }
        }
    };
}

statuses! {
    OK = 0, PERM = 1, NOENT = 2, IO = 5, NXIO = 6, ACCESS = 13, EXIST = 17, XDEV = 18,
    NOTDIR = 20, ISDIR = 21, INVAL = 22, FBIG = 27, NOSPC = 28, ROFS = 30, MLINK = 31,
    NAMETOOLONG = 63, NOTEMPTY = 66, DQUOT = 69, STALE = 70, BADHANDLE = 10001,
    BAD_COOKIE = 10003, NOTSUPP = 10004, TOOSMALL = 10005, SERVERFAULT = 10006,
    BADTYPE = 10007, DELAY = 10008, SAME = 10009, DENIED = 10010, EXPIRED = 10011,
    LOCKED = 10012, GRACE = 10013, FHEXPIRED = 10014, SHARE_DENIED = 10015, WRONGSEC = 10016,
    CLID_INUSE = 10017, RESOURCE = 10018, MOVED = 10019, NOFILEHANDLE = 10020,
    MINOR_VERS_MISMATCH = 10021, STALE_CLIENTID = 10022, STALE_STATEID = 10023,
    OLD_STATEID = 10024, BAD_STATEID = 10025, BAD_SEQID = 10026, NOT_SAME = 10027,
    LOCK_RANGE = 10028, SYMLINK = 10029, RESTOREFH = 10030, LEASE_MOVED = 10031,
    ATTRNOTSUPP = 10032, NO_GRACE = 10033, RECLAIM_BAD = 10034, RECLAIM_CONFLICT = 10035,
    BADXDR = 10036, LOCKS_HELD = 10037, OPENMODE = 10038, BADOWNER = 10039, BADCHAR = 10040,
    BADNAME = 10041, BAD_RANGE = 10042, LOCK_NOTSUPP = 10043, OP_ILLEGAL = 10044,
    DEADLOCK = 10045, FILE_OPEN = 10046, ADMIN_REVOKED = 10047, CB_PATH_DOWN = 10048,
    BADIOMODE = 10049, BADLAYOUT = 10050, BAD_SESSION_DIGEST = 10051, BADSESSION = 10052,
    BADSLOT = 10053, COMPLETE_ALREADY = 10054, CONN_NOT_BOUND_TO_SESSION = 10055,
    DELEG_ALREADY_WANTED = 10056, BACK_CHAN_BUSY = 10057, LAYOUTTRYLATER = 10058,
    LAYOUTUNAVAILABLE = 10059, NOMATCHING_LAYOUT = 10060, RECALLCONFLICT = 10061,
    UNKNOWN_LAYOUTTYPE = 10062, SEQ_MISORDERED = 10063, SEQUENCE_POS = 10064,
    REQ_TOO_BIG = 10065, REP_TOO_BIG = 10066, REP_TOO_BIG_TO_CACHE = 10067,
    RETRY_UNCACHED_REP = 10068, UNSAFE_COMPOUND = 10069, TOO_MANY_OPS = 10070,
    OP_NOT_IN_SESSION = 10071, HASH_ALG_UNSUPP = 10072, CLIENTID_BUSY = 10074,
    PNFS_IO_HOLE = 10075, SEQ_FALSE_RETRY = 10076, BAD_HIGH_SLOT = 10077,
    DEADSESSION = 10078, ENCR_ALG_UNSUPP = 10079, PNFS_NO_LAYOUT = 10080,
    NOT_ONLY_OP = 10081, WRONG_CRED = 10082, WRONG_TYPE = 10083, DIRDELEG_UNAVAIL = 10084,
    REJECT_DELEG = 10085, RETURNCONFLICT = 10086, DELEG_REVOKED = 10087,
    PARTNER_NOTSUPP = 10088, PARTNER_NO_AUTH = 10089, UNION_NOTSUPP = 10090,
    OFFLOAD_DENIED = 10091, WRONG_LFS = 10092, BADLABEL = 10093, OFFLOAD_NO_REQS = 10094,
    NOXATTR = 10095, XATTR2BIG = 10096,
}

impl Nfsstat4 {
    /// Whether this is NFS4_OK.
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }

    /// The status for a local system error (errno), as Linux nfsd maps them
    /// (fs/nfsd/nfsproc.c `nfserrno`).
    pub fn from_errno(e: rustix::io::Errno) -> Self {
        use rustix::io::Errno;
        match e {
            Errno::PERM => Self::PERM,
            Errno::NOENT => Self::NOENT,
            Errno::IO => Self::IO,
            Errno::NXIO | Errno::NODEV => Self::NXIO,
            Errno::ACCESS => Self::ACCESS,
            Errno::EXIST => Self::EXIST,
            Errno::XDEV => Self::XDEV,
            Errno::NOTDIR => Self::NOTDIR,
            Errno::ISDIR => Self::ISDIR,
            Errno::INVAL => Self::INVAL,
            Errno::FBIG => Self::FBIG,
            Errno::NOSPC => Self::NOSPC,
            Errno::ROFS => Self::ROFS,
            Errno::MLINK => Self::MLINK,
            Errno::NAMETOOLONG => Self::NAMETOOLONG,
            Errno::NOTEMPTY => Self::NOTEMPTY,
            Errno::DQUOT => Self::DQUOT,
            Errno::STALE => Self::STALE,
            Errno::LOOP => Self::SYMLINK,
            Errno::AGAIN => Self::DELAY,
            Errno::OPNOTSUPP | Errno::NOSYS => Self::NOTSUPP,
            _ => Self::IO,
        }
    }

    /// The status for a `std::io::Error`.
    pub fn from_io(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Self::from_errno(rustix::io::Errno::from_raw_os_error(n)),
            None => Self::IO,
        }
    }
}

impl fmt::Debug for Nfsstat4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some("OK") => f.write_str("NFS4_OK"),
            Some(n) => write!(f, "NFS4ERR_{n}"),
            None => write!(f, "NFS4ERR({})", self.0),
        }
    }
}

impl fmt::Display for Nfsstat4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl xdr::XdrEncode for Nfsstat4 {
    fn encode(&self, enc: &mut xdr::Encoder) {
        enc.put_u32(self.0);
    }
    fn encoded_len(&self) -> usize {
        4
    }
}

impl<'a> xdr::XdrDecode<'a> for Nfsstat4 {
    fn decode(dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
        Ok(Nfsstat4(dec.u32()?))
    }
}

/// Result of one operation's execution.
pub type Res4<T> = Result<T, Nfsstat4>;
