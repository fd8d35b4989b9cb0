//! Operation arguments (`nfs_argop4`, RFC 8881 §16.2.1 and §18; RFC 7862 §15 for SEEK,
//! ALLOCATE and DEALLOCATE): one checked decoder per operation the server implements.
//!
//! The COMPOUND executor reads an operation number, decodes that operation's arguments and runs
//! it before it reads the next one: an error stops the COMPOUND (RFC 8881 §2.10.6.4... §15.2),
//! so the arguments after a failing operation are never decoded. Operations the minor version
//! defines but this server does not implement come back as [`OpArgs::Unsupported`] without their
//! arguments being read (their result is NFS4ERR_NOTSUPP and the COMPOUND stops there), numbers
//! the minor version does not define as [`OpArgs::Illegal`] (NFS4ERR_OP_ILLEGAL, RFC 8881
//! §15.2, §18.51).

use bytes::Bytes;
use xdr::{Decoder, XdrDecode};

use super::consts::{claim, createmode, ftype, op};
use super::types::{
    Bitmap4, CallbackSecParms4, ChannelAttrs4, ClientOwner4, Component4, Fattr4, Fh4, Linktext4,
    MAX_SMALL_ARRAY, NfsImplId4, SessionId4, StateOwner4, StateProtectA, Stateid4, Verifier4,
};

/// Largest WRITE payload the decoder accepts: above any `ca_maxrequestsize` we grant.
pub const MAX_WRITE_WIRE: u32 = 16 << 20;

/// `createtype4` (RFC 8881 §18.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateType {
    Link(Linktext4),
    Blk(u32, u32),
    Chr(u32, u32),
    Sock,
    Fifo,
    Dir,
    /// NF4REG, NF4ATTRDIR, NF4NAMEDATTR or an unknown type: CREATE answers NFS4ERR_BADTYPE.
    Other(u32),
}

/// `createhow4` (RFC 8881 §18.16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow {
    Unchecked(Fattr4),
    Guarded(Fattr4),
    Exclusive(Verifier4),
    Exclusive41(Verifier4, Fattr4),
}

/// `open_claim4` (RFC 8881 §18.16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenClaim {
    Null(Component4),
    Previous(u32),
    DelegateCur { stateid: Stateid4, file: Component4 },
    DelegatePrev(Component4),
    Fh,
    DelegCurFh(Stateid4),
    DelegPrevFh,
}

/// OPEN arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenArgs {
    pub seqid: u32,
    pub share_access: u32,
    pub share_deny: u32,
    pub owner: StateOwner4,
    /// `None` for OPEN4_NOCREATE.
    pub create: Option<CreateHow>,
    pub claim: OpenClaim,
}

/// `locker4` (RFC 8881 §18.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locker {
    New {
        open_seqid: u32,
        open_stateid: Stateid4,
        lock_seqid: u32,
        owner: StateOwner4,
    },
    Existing {
        lock_stateid: Stateid4,
        lock_seqid: u32,
    },
}

/// One operation's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpArgs {
    Access(u32),
    Close {
        seqid: u32,
        stateid: Stateid4,
    },
    Commit {
        offset: u64,
        count: u32,
    },
    Create {
        objtype: CreateType,
        name: Component4,
        attrs: Fattr4,
    },
    Delegpurge(u64),
    Delegreturn(Stateid4),
    Getattr(Bitmap4),
    Getfh,
    Link(Component4),
    Lock {
        locktype: u32,
        reclaim: bool,
        offset: u64,
        length: u64,
        locker: Locker,
    },
    Lockt {
        locktype: u32,
        offset: u64,
        length: u64,
        owner: StateOwner4,
    },
    Locku {
        locktype: u32,
        seqid: u32,
        stateid: Stateid4,
        offset: u64,
        length: u64,
    },
    Lookup(Component4),
    Lookupp,
    Nverify(Fattr4),
    Open(Box<OpenArgs>),
    Openattr(bool),
    OpenDowngrade {
        stateid: Stateid4,
        seqid: u32,
        share_access: u32,
        share_deny: u32,
    },
    Putfh(Fh4),
    Putpubfh,
    Putrootfh,
    Read {
        stateid: Stateid4,
        offset: u64,
        count: u32,
    },
    Readdir {
        cookie: u64,
        verf: Verifier4,
        dircount: u32,
        maxcount: u32,
        attrs: Bitmap4,
    },
    Readlink,
    Remove(Component4),
    Rename {
        old: Component4,
        new: Component4,
    },
    Restorefh,
    Savefh,
    Secinfo(Component4),
    Setattr {
        stateid: Stateid4,
        attrs: Fattr4,
    },
    Verify(Fattr4),
    Write {
        stateid: Stateid4,
        offset: u64,
        stable: u32,
        data: Bytes,
    },
    BackchannelCtl {
        cb_program: u32,
        sec: Vec<CallbackSecParms4>,
    },
    BindConnToSession {
        session: SessionId4,
        dir: u32,
        rdma_mode: bool,
    },
    ExchangeId {
        owner: ClientOwner4,
        flags: u32,
        protect: StateProtectA,
        impl_id: Option<NfsImplId4>,
    },
    CreateSession(Box<CreateSessionArgs>),
    DestroySession(SessionId4),
    FreeStateid(Stateid4),
    SecinfoNoName(u32),
    Sequence(SequenceArgs),
    TestStateid(Vec<Stateid4>),
    DestroyClientid(u64),
    ReclaimComplete(bool),
    Allocate {
        stateid: Stateid4,
        offset: u64,
        length: u64,
    },
    Deallocate {
        stateid: Stateid4,
        offset: u64,
        length: u64,
    },
    Seek {
        stateid: Stateid4,
        offset: u64,
        what: u32,
    },
    /// An operation only NFSv4.0 has (decoded for minor version 0 alone).
    V40(super::v40::Args40),
    /// Defined by the minor version, not implemented here: NFS4ERR_NOTSUPP.
    Unsupported(u32),
    /// Not an operation of the minor version: NFS4ERR_OP_ILLEGAL.
    Illegal(u32),
}

/// CREATE_SESSION arguments (RFC 8881 §18.36).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSessionArgs {
    pub clientid: u64,
    pub sequence: u32,
    pub flags: u32,
    pub fore: ChannelAttrs4,
    pub back: ChannelAttrs4,
    pub cb_program: u32,
    pub sec: Vec<CallbackSecParms4>,
}

/// SEQUENCE arguments (RFC 8881 §18.46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceArgs {
    pub session: SessionId4,
    pub sequenceid: u32,
    pub slotid: u32,
    pub highest_slotid: u32,
    pub cachethis: bool,
}

impl<'a> XdrDecode<'a> for SequenceArgs {
    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {
        Ok(SequenceArgs {
            session: d.get()?,
            sequenceid: d.u32()?,
            slotid: d.u32()?,
            highest_slotid: d.u32()?,
            cachethis: d.bool()?,
        })
    }
}

impl OpArgs {
    /// The operation number these arguments belong to.
    pub fn opnum(&self) -> u32 {
        match self {
            OpArgs::Access(_) => op::ACCESS,
            OpArgs::Close { .. } => op::CLOSE,
            OpArgs::Commit { .. } => op::COMMIT,
            OpArgs::Create { .. } => op::CREATE,
            OpArgs::Delegpurge(_) => op::DELEGPURGE,
            OpArgs::Delegreturn(_) => op::DELEGRETURN,
            OpArgs::Getattr(_) => op::GETATTR,
            OpArgs::Getfh => op::GETFH,
            OpArgs::Link(_) => op::LINK,
            OpArgs::Lock { .. } => op::LOCK,
            OpArgs::Lockt { .. } => op::LOCKT,
            OpArgs::Locku { .. } => op::LOCKU,
            OpArgs::Lookup(_) => op::LOOKUP,
            OpArgs::Lookupp => op::LOOKUPP,
            OpArgs::Nverify(_) => op::NVERIFY,
            OpArgs::Open(_) => op::OPEN,
            OpArgs::Openattr(_) => op::OPENATTR,
            OpArgs::OpenDowngrade { .. } => op::OPEN_DOWNGRADE,
            OpArgs::Putfh(_) => op::PUTFH,
            OpArgs::Putpubfh => op::PUTPUBFH,
            OpArgs::Putrootfh => op::PUTROOTFH,
            OpArgs::Read { .. } => op::READ,
            OpArgs::Readdir { .. } => op::READDIR,
            OpArgs::Readlink => op::READLINK,
            OpArgs::Remove(_) => op::REMOVE,
            OpArgs::Rename { .. } => op::RENAME,
            OpArgs::Restorefh => op::RESTOREFH,
            OpArgs::Savefh => op::SAVEFH,
            OpArgs::Secinfo(_) => op::SECINFO,
            OpArgs::Setattr { .. } => op::SETATTR,
            OpArgs::Verify(_) => op::VERIFY,
            OpArgs::Write { .. } => op::WRITE,
            OpArgs::BackchannelCtl { .. } => op::BACKCHANNEL_CTL,
            OpArgs::BindConnToSession { .. } => op::BIND_CONN_TO_SESSION,
            OpArgs::ExchangeId { .. } => op::EXCHANGE_ID,
            OpArgs::CreateSession(_) => op::CREATE_SESSION,
            OpArgs::DestroySession(_) => op::DESTROY_SESSION,
            OpArgs::FreeStateid(_) => op::FREE_STATEID,
            OpArgs::SecinfoNoName(_) => op::SECINFO_NO_NAME,
            OpArgs::Sequence(_) => op::SEQUENCE,
            OpArgs::TestStateid(_) => op::TEST_STATEID,
            OpArgs::DestroyClientid(_) => op::DESTROY_CLIENTID,
            OpArgs::ReclaimComplete(_) => op::RECLAIM_COMPLETE,
            OpArgs::Allocate { .. } => op::ALLOCATE,
            OpArgs::Deallocate { .. } => op::DEALLOCATE,
            OpArgs::Seek { .. } => op::SEEK,
            OpArgs::V40(a) => a.opnum(),
            OpArgs::Unsupported(n) => *n,
            OpArgs::Illegal(_) => op::ILLEGAL,
        }
    }

    /// Decode the arguments of operation `opnum` of minor version `minor`.
    pub fn decode(opnum: u32, minor: u32, d: &mut Decoder<'_>) -> xdr::Result<OpArgs> {
        if !(op::ACCESS..=op::last_for_minor(minor)).contains(&opnum) {
            return Ok(OpArgs::Illegal(opnum));
        }
        // The operations 4.1 removed exist in 4.0 only; in 4.1 and 4.2 they fall through to
        // Unsupported (RFC 8881 §17: MNI; §15.2: NFS4ERR_NOTSUPP).
        if minor == 0
            && let Some(a) = super::v40::Args40::decode(opnum, d)?
        {
            return Ok(OpArgs::V40(a));
        }
        Ok(match opnum {
            op::ACCESS => OpArgs::Access(d.u32()?),
            op::CLOSE => OpArgs::Close {
                seqid: d.u32()?,
                stateid: d.get()?,
            },
            op::COMMIT => OpArgs::Commit {
                offset: d.u64()?,
                count: d.u32()?,
            },
            op::CREATE => OpArgs::Create {
                objtype: create_type(d)?,
                name: d.get()?,
                attrs: d.get()?,
            },
            op::DELEGPURGE => OpArgs::Delegpurge(d.u64()?),
            op::DELEGRETURN => OpArgs::Delegreturn(d.get()?),
            op::GETATTR => OpArgs::Getattr(d.get()?),
            op::GETFH => OpArgs::Getfh,
            op::LINK => OpArgs::Link(d.get()?),
            op::LOCK => OpArgs::Lock {
                locktype: d.u32()?,
                reclaim: d.bool()?,
                offset: d.u64()?,
                length: d.u64()?,
                locker: if d.bool()? {
                    Locker::New {
                        open_seqid: d.u32()?,
                        open_stateid: d.get()?,
                        lock_seqid: d.u32()?,
                        owner: d.get()?,
                    }
                } else {
                    Locker::Existing {
                        lock_stateid: d.get()?,
                        lock_seqid: d.u32()?,
                    }
                },
            },
            op::LOCKT => OpArgs::Lockt {
                locktype: d.u32()?,
                offset: d.u64()?,
                length: d.u64()?,
                owner: d.get()?,
            },
            op::LOCKU => OpArgs::Locku {
                locktype: d.u32()?,
                seqid: d.u32()?,
                stateid: d.get()?,
                offset: d.u64()?,
                length: d.u64()?,
            },
            op::LOOKUP => OpArgs::Lookup(d.get()?),
            op::LOOKUPP => OpArgs::Lookupp,
            op::NVERIFY => OpArgs::Nverify(d.get()?),
            op::OPEN => OpArgs::Open(Box::new(open_args(d)?)),
            op::OPENATTR => OpArgs::Openattr(d.bool()?),
            op::OPEN_DOWNGRADE => OpArgs::OpenDowngrade {
                stateid: d.get()?,
                seqid: d.u32()?,
                share_access: d.u32()?,
                share_deny: d.u32()?,
            },
            op::PUTFH => OpArgs::Putfh(d.get()?),
            op::PUTPUBFH => OpArgs::Putpubfh,
            op::PUTROOTFH => OpArgs::Putrootfh,
            op::READ => OpArgs::Read {
                stateid: d.get()?,
                offset: d.u64()?,
                count: d.u32()?,
            },
            op::READDIR => OpArgs::Readdir {
                cookie: d.u64()?,
                verf: d.get()?,
                dircount: d.u32()?,
                maxcount: d.u32()?,
                attrs: d.get()?,
            },
            op::READLINK => OpArgs::Readlink,
            op::REMOVE => OpArgs::Remove(d.get()?),
            op::RENAME => OpArgs::Rename {
                old: d.get()?,
                new: d.get()?,
            },
            op::RESTOREFH => OpArgs::Restorefh,
            op::SAVEFH => OpArgs::Savefh,
            op::SECINFO => OpArgs::Secinfo(d.get()?),
            op::SETATTR => OpArgs::Setattr {
                stateid: d.get()?,
                attrs: d.get()?,
            },
            op::VERIFY => OpArgs::Verify(d.get()?),
            op::WRITE => OpArgs::Write {
                stateid: d.get()?,
                offset: d.u64()?,
                stable: d.u32()?,
                data: d.opaque_bytes(MAX_WRITE_WIRE)?,
            },
            op::BACKCHANNEL_CTL => OpArgs::BackchannelCtl {
                cb_program: d.u32()?,
                sec: d.array(MAX_SMALL_ARRAY, |d| d.get())?,
            },
            op::BIND_CONN_TO_SESSION => OpArgs::BindConnToSession {
                session: d.get()?,
                dir: d.u32()?,
                rdma_mode: d.bool()?,
            },
            op::EXCHANGE_ID => OpArgs::ExchangeId {
                owner: d.get()?,
                flags: d.u32()?,
                protect: d.get()?,
                impl_id: d.array(1, |d| d.get())?.pop(),
            },
            op::CREATE_SESSION => OpArgs::CreateSession(Box::new(CreateSessionArgs {
                clientid: d.u64()?,
                sequence: d.u32()?,
                flags: d.u32()?,
                fore: d.get()?,
                back: d.get()?,
                cb_program: d.u32()?,
                sec: d.array(MAX_SMALL_ARRAY, |d| d.get())?,
            })),
            op::DESTROY_SESSION => OpArgs::DestroySession(d.get()?),
            op::FREE_STATEID => OpArgs::FreeStateid(d.get()?),
            op::SECINFO_NO_NAME => OpArgs::SecinfoNoName(d.u32()?),
            op::SEQUENCE => OpArgs::Sequence(d.get()?),
            op::TEST_STATEID => OpArgs::TestStateid(d.array(MAX_SMALL_ARRAY, |d| d.get())?),
            op::DESTROY_CLIENTID => OpArgs::DestroyClientid(d.u64()?),
            op::RECLAIM_COMPLETE => OpArgs::ReclaimComplete(d.bool()?),
            op::ALLOCATE => OpArgs::Allocate {
                stateid: d.get()?,
                offset: d.u64()?,
                length: d.u64()?,
            },
            op::DEALLOCATE => OpArgs::Deallocate {
                stateid: d.get()?,
                offset: d.u64()?,
                length: d.u64()?,
            },
            op::SEEK => OpArgs::Seek {
                stateid: d.get()?,
                offset: d.u64()?,
                what: d.u32()?,
            },
            n => OpArgs::Unsupported(n),
        })
    }
}

fn create_type(d: &mut Decoder<'_>) -> xdr::Result<CreateType> {
    Ok(match d.u32()? {
        ftype::NF4LNK => CreateType::Link(d.get()?),
        ftype::NF4BLK => CreateType::Blk(d.u32()?, d.u32()?),
        ftype::NF4CHR => CreateType::Chr(d.u32()?, d.u32()?),
        ftype::NF4SOCK => CreateType::Sock,
        ftype::NF4FIFO => CreateType::Fifo,
        ftype::NF4DIR => CreateType::Dir,
        other => CreateType::Other(other),
    })
}

fn open_args(d: &mut Decoder<'_>) -> xdr::Result<OpenArgs> {
    let seqid = d.u32()?;
    let share_access = d.u32()?;
    let share_deny = d.u32()?;
    let owner = d.get()?;
    let create = match d.u32()? {
        0 => None,
        1 => Some(match d.u32()? {
            createmode::UNCHECKED4 => CreateHow::Unchecked(d.get()?),
            createmode::GUARDED4 => CreateHow::Guarded(d.get()?),
            createmode::EXCLUSIVE4 => CreateHow::Exclusive(d.get()?),
            createmode::EXCLUSIVE4_1 => CreateHow::Exclusive41(d.get()?, d.get()?),
            v => {
                return Err(xdr::XdrError::InvalidDiscriminant {
                    type_name: "createmode4",
                    value: i64::from(v),
                });
            }
        }),
        v => {
            return Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "opentype4",
                value: i64::from(v),
            });
        }
    };
    let claim = match d.u32()? {
        claim::NULL => OpenClaim::Null(d.get()?),
        claim::PREVIOUS => OpenClaim::Previous(d.u32()?),
        claim::DELEGATE_CUR => OpenClaim::DelegateCur {
            stateid: d.get()?,
            file: d.get()?,
        },
        claim::DELEGATE_PREV => OpenClaim::DelegatePrev(d.get()?),
        claim::FH => OpenClaim::Fh,
        claim::DELEG_CUR_FH => OpenClaim::DelegCurFh(d.get()?),
        claim::DELEG_PREV_FH => OpenClaim::DelegPrevFh,
        v => {
            return Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "open_claim_type4",
                value: i64::from(v),
            });
        }
    };
    Ok(OpenArgs {
        seqid,
        share_access,
        share_deny,
        owner,
        create,
        claim,
    })
}
