//! The client half of the codec: operation arguments encoded (`nfs_argop4`) and results
//! decoded (`nfs_resop4`), the mirror of [`super::args`] and [`super::res`], so that a
//! client (and the tests) can speak COMPOUND with the same types the server decodes.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use super::args::{CreateHow, CreateType, Locker, OpArgs, OpenClaim};
use super::compound::{CompoundHeader, CompoundReply};
use super::consts::{claim, createmode, deleg, ftype, op};
use super::res::{CreateSessionOk, Entry4, ExchangeIdOk, LockDenied, OpRes, OpenOk, SequenceOk};
use super::status::Nfsstat4;
use super::types::{
    Bitmap4, ChangeInfo4, ChannelAttrs4, Component4, Fattr4, Fh4, Linktext4, MAX_SMALL_ARRAY,
    ServerOwner4, StateOwner4, Stateid4, Tag4,
};

/// Most entries a decoded READDIR result may hold.
const MAX_DIR_ENTRIES: usize = 1 << 16;

impl OpArgs {
    /// Append this operation (its number, then its arguments) to a COMPOUND.
    /// [`OpArgs::Unsupported`] and [`OpArgs::Illegal`] write their number alone.
    pub fn encode(&self, e: &mut Encoder) {
        e.put_u32(match self {
            OpArgs::Illegal(n) => *n,
            a => a.opnum(),
        });
        match self {
            OpArgs::Access(a) => e.put_u32(*a),
            OpArgs::Close { seqid, stateid } => {
                e.put_u32(*seqid);
                stateid.encode(e);
            }
            OpArgs::Commit { offset, count } => {
                e.put_u64(*offset);
                e.put_u32(*count);
            }
            OpArgs::Create {
                objtype,
                name,
                attrs,
            } => {
                match objtype {
                    CreateType::Link(l) => {
                        e.put_u32(ftype::NF4LNK);
                        l.encode(e);
                    }
                    CreateType::Blk(a, b) | CreateType::Chr(a, b) => {
                        e.put_u32(if matches!(objtype, CreateType::Blk(..)) {
                            ftype::NF4BLK
                        } else {
                            ftype::NF4CHR
                        });
                        e.put_u32(*a);
                        e.put_u32(*b);
                    }
                    CreateType::Sock => e.put_u32(ftype::NF4SOCK),
                    CreateType::Fifo => e.put_u32(ftype::NF4FIFO),
                    CreateType::Dir => e.put_u32(ftype::NF4DIR),
                    CreateType::Other(t) => e.put_u32(*t),
                }
                name.encode(e);
                attrs.encode(e);
            }
            OpArgs::Delegpurge(c) | OpArgs::DestroyClientid(c) => e.put_u64(*c),
            OpArgs::Delegreturn(s) | OpArgs::FreeStateid(s) => s.encode(e),
            OpArgs::Getattr(b) => b.encode(e),
            OpArgs::Getfh
            | OpArgs::Lookupp
            | OpArgs::Putpubfh
            | OpArgs::Putrootfh
            | OpArgs::Readlink
            | OpArgs::Restorefh
            | OpArgs::Savefh
            | OpArgs::Unsupported(_)
            | OpArgs::Illegal(_) => {}
            OpArgs::Link(c) | OpArgs::Lookup(c) | OpArgs::Remove(c) | OpArgs::Secinfo(c) => {
                c.encode(e)
            }
            OpArgs::Lock {
                locktype,
                reclaim,
                offset,
                length,
                locker,
            } => {
                e.put_u32(*locktype);
                e.put_bool(*reclaim);
                e.put_u64(*offset);
                e.put_u64(*length);
                match locker {
                    Locker::New {
                        open_seqid,
                        open_stateid,
                        lock_seqid,
                        owner,
                    } => {
                        e.put_bool(true);
                        e.put_u32(*open_seqid);
                        open_stateid.encode(e);
                        e.put_u32(*lock_seqid);
                        owner.encode(e);
                    }
                    Locker::Existing {
                        lock_stateid,
                        lock_seqid,
                    } => {
                        e.put_bool(false);
                        lock_stateid.encode(e);
                        e.put_u32(*lock_seqid);
                    }
                }
            }
            OpArgs::Lockt {
                locktype,
                offset,
                length,
                owner,
            } => {
                e.put_u32(*locktype);
                e.put_u64(*offset);
                e.put_u64(*length);
                owner.encode(e);
            }
            OpArgs::Locku {
                locktype,
                seqid,
                stateid,
                offset,
                length,
            } => {
                e.put_u32(*locktype);
                e.put_u32(*seqid);
                stateid.encode(e);
                e.put_u64(*offset);
                e.put_u64(*length);
            }
            OpArgs::Nverify(f) | OpArgs::Verify(f) => f.encode(e),
            OpArgs::Open(o) => {
                e.put_u32(o.seqid);
                e.put_u32(o.share_access);
                e.put_u32(o.share_deny);
                o.owner.encode(e);
                match &o.create {
                    None => e.put_u32(0),
                    Some(how) => {
                        e.put_u32(1);
                        match how {
                            CreateHow::Unchecked(f) => {
                                e.put_u32(createmode::UNCHECKED4);
                                f.encode(e);
                            }
                            CreateHow::Guarded(f) => {
                                e.put_u32(createmode::GUARDED4);
                                f.encode(e);
                            }
                            CreateHow::Exclusive(v) => {
                                e.put_u32(createmode::EXCLUSIVE4);
                                e.put_opaque_fixed(v);
                            }
                            CreateHow::Exclusive41(v, f) => {
                                e.put_u32(createmode::EXCLUSIVE4_1);
                                e.put_opaque_fixed(v);
                                f.encode(e);
                            }
                        }
                    }
                }
                match &o.claim {
                    OpenClaim::Null(c) => {
                        e.put_u32(claim::NULL);
                        c.encode(e);
                    }
                    OpenClaim::Previous(t) => {
                        e.put_u32(claim::PREVIOUS);
                        e.put_u32(*t);
                    }
                    OpenClaim::DelegateCur { stateid, file } => {
                        e.put_u32(claim::DELEGATE_CUR);
                        stateid.encode(e);
                        file.encode(e);
                    }
                    OpenClaim::DelegatePrev(c) => {
                        e.put_u32(claim::DELEGATE_PREV);
                        c.encode(e);
                    }
                    OpenClaim::Fh => e.put_u32(claim::FH),
                    OpenClaim::DelegCurFh(s) => {
                        e.put_u32(claim::DELEG_CUR_FH);
                        s.encode(e);
                    }
                    OpenClaim::DelegPrevFh => e.put_u32(claim::DELEG_PREV_FH),
                }
            }
            OpArgs::Openattr(b) | OpArgs::ReclaimComplete(b) => e.put_bool(*b),
            OpArgs::OpenDowngrade {
                stateid,
                seqid,
                share_access,
                share_deny,
            } => {
                stateid.encode(e);
                e.put_u32(*seqid);
                e.put_u32(*share_access);
                e.put_u32(*share_deny);
            }
            OpArgs::Putfh(fh) => fh.encode(e),
            OpArgs::Read {
                stateid,
                offset,
                count,
            } => {
                stateid.encode(e);
                e.put_u64(*offset);
                e.put_u32(*count);
            }
            OpArgs::Readdir {
                cookie,
                verf,
                dircount,
                maxcount,
                attrs,
            } => {
                e.put_u64(*cookie);
                e.put_opaque_fixed(verf);
                e.put_u32(*dircount);
                e.put_u32(*maxcount);
                attrs.encode(e);
            }
            OpArgs::Rename { old, new } => {
                old.encode(e);
                new.encode(e);
            }
            OpArgs::Setattr { stateid, attrs } => {
                stateid.encode(e);
                attrs.encode(e);
            }
            OpArgs::Write {
                stateid,
                offset,
                stable,
                data,
            } => {
                stateid.encode(e);
                e.put_u64(*offset);
                e.put_u32(*stable);
                e.put_opaque(data);
            }
            OpArgs::BackchannelCtl { cb_program, sec } => {
                e.put_u32(*cb_program);
                e.put_array(sec, |e, s| s.encode(e));
            }
            OpArgs::BindConnToSession {
                session,
                dir,
                rdma_mode,
            } => {
                e.put_opaque_fixed(session);
                e.put_u32(*dir);
                e.put_bool(*rdma_mode);
            }
            OpArgs::ExchangeId {
                owner,
                flags,
                protect,
                impl_id,
            } => {
                owner.encode(e);
                e.put_u32(*flags);
                protect.encode(e);
                e.put_array(impl_id.as_slice(), |e, i| i.encode(e));
            }
            OpArgs::CreateSession(c) => {
                e.put_u64(c.clientid);
                e.put_u32(c.sequence);
                e.put_u32(c.flags);
                c.fore.encode(e);
                c.back.encode(e);
                e.put_u32(c.cb_program);
                e.put_array(&c.sec, |e, s| s.encode(e));
            }
            OpArgs::DestroySession(s) => e.put_opaque_fixed(s),
            OpArgs::SecinfoNoName(s) => e.put_u32(*s),
            OpArgs::Sequence(s) => {
                e.put_opaque_fixed(&s.session);
                e.put_u32(s.sequenceid);
                e.put_u32(s.slotid);
                e.put_u32(s.highest_slotid);
                e.put_bool(s.cachethis);
            }
            OpArgs::TestStateid(v) => e.put_array(v, |e, s| s.encode(e)),
            OpArgs::Allocate {
                stateid,
                offset,
                length,
            }
            | OpArgs::Deallocate {
                stateid,
                offset,
                length,
            } => {
                stateid.encode(e);
                e.put_u64(*offset);
                e.put_u64(*length);
            }
            OpArgs::Seek {
                stateid,
                offset,
                what,
            } => {
                stateid.encode(e);
                e.put_u64(*offset);
                e.put_u32(*what);
            }
            OpArgs::V40(a) => a.encode(e),
        }
    }
}

/// `COMPOUND4args` with these operations.
pub fn encode_compound(tag: &[u8], minorversion: u32, ops: &[OpArgs]) -> Bytes {
    let mut e = Encoder::new();
    CompoundHeader {
        tag: Tag4::from_slice(tag),
        minorversion,
        nops: ops.len() as u32,
    }
    .encode(&mut e);
    for o in ops {
        o.encode(&mut e);
    }
    e.into_bytes()
}

fn cinfo(d: &mut Decoder<'_>) -> xdr::Result<ChangeInfo4> {
    d.get()
}

fn stateid(d: &mut Decoder<'_>) -> xdr::Result<Stateid4> {
    d.get()
}

fn fixed8(d: &mut Decoder<'_>) -> xdr::Result<[u8; 8]> {
    let mut v = [0u8; 8];
    v.copy_from_slice(d.opaque_fixed(8)?);
    Ok(v)
}

fn fixed16(d: &mut Decoder<'_>) -> xdr::Result<[u8; 16]> {
    let mut v = [0u8; 16];
    v.copy_from_slice(d.opaque_fixed(16)?);
    Ok(v)
}

impl OpRes {
    /// Decode one `nfs_resop4`.
    pub fn decode(d: &mut Decoder<'_>) -> xdr::Result<OpRes> {
        let opnum = d.u32()?;
        let status = Nfsstat4(d.u32()?);
        if status == Nfsstat4::DENIED && (opnum == op::LOCK || opnum == op::LOCKT) {
            return Ok(OpRes::Denied(
                opnum,
                LockDenied {
                    offset: d.u64()?,
                    length: d.u64()?,
                    locktype: d.u32()?,
                    owner: StateOwner4::decode(d)?,
                },
            ));
        }
        if opnum == op::SETATTR {
            return Ok(OpRes::Setattr(status, Bitmap4::decode(d)?));
        }
        if let Some(r) = super::v40::Res40::decode(opnum, status, d)? {
            return Ok(OpRes::V40(r));
        }
        if !status.is_ok() {
            return Ok(OpRes::Status(opnum, status));
        }
        Ok(match opnum {
            op::ACCESS => OpRes::Access {
                supported: d.u32()?,
                access: d.u32()?,
            },
            op::CLOSE => OpRes::Close(stateid(d)?),
            op::COMMIT => OpRes::Commit(fixed8(d)?),
            op::CREATE => OpRes::Create {
                cinfo: cinfo(d)?,
                attrset: Bitmap4::decode(d)?,
            },
            op::GETATTR => OpRes::Getattr(Fattr4::decode(d)?),
            op::GETFH => OpRes::Getfh(Fh4::decode(d)?),
            op::LINK => OpRes::Link(cinfo(d)?),
            op::LOCK => OpRes::Lock(stateid(d)?),
            op::LOCKU => OpRes::Locku(stateid(d)?),
            op::OPEN => {
                let stateid = stateid(d)?;
                let cinfo = cinfo(d)?;
                let rflags = d.u32()?;
                let attrset = Bitmap4::decode(d)?;
                let no_deleg_why = match d.u32()? {
                    deleg::NONE => None,
                    deleg::NONE_EXT => {
                        let why = d.u32()?;
                        if why == deleg::WND4_CONTENTION || why == deleg::WND4_RESOURCE {
                            d.bool()?;
                        }
                        Some(why)
                    }
                    v => {
                        return Err(xdr::XdrError::InvalidDiscriminant {
                            type_name: "open_delegation_type4 (delegations are not decoded)",
                            value: i64::from(v),
                        });
                    }
                };
                OpRes::Open(Box::new(OpenOk {
                    stateid,
                    cinfo,
                    rflags,
                    attrset,
                    no_deleg_why,
                }))
            }
            op::OPEN_DOWNGRADE => OpRes::OpenDowngrade(stateid(d)?),
            op::READ => OpRes::Read {
                eof: d.bool()?,
                data: d.opaque_bytes(u32::MAX)?,
            },
            op::READDIR => {
                let verf = fixed8(d)?;
                let mut entries = Vec::new();
                while d.bool()? {
                    if entries.len() >= MAX_DIR_ENTRIES {
                        return Err(xdr::XdrError::TooLong {
                            offset: d.position(),
                            len: entries.len() as u32,
                            max: MAX_DIR_ENTRIES as u32,
                        });
                    }
                    entries.push(Entry4 {
                        cookie: d.u64()?,
                        name: Component4::decode(d)?,
                        attrs: Fattr4::decode(d)?,
                    });
                }
                OpRes::Readdir {
                    verf,
                    entries,
                    eof: d.bool()?,
                }
            }
            op::READLINK => OpRes::Readlink(Linktext4::decode(d)?),
            op::REMOVE => OpRes::Remove(cinfo(d)?),
            op::RENAME => OpRes::Rename {
                source: cinfo(d)?,
                target: cinfo(d)?,
            },
            op::SECINFO | op::SECINFO_NO_NAME => {
                let flavors = d.array(MAX_SMALL_ARRAY, |d| {
                    let f = d.u32()?;
                    if f == super::consts::RPCSEC_GSS {
                        // rpcsec_gss_info: oid, qop, service.
                        d.opaque(1024)?;
                        d.u32()?;
                        d.u32()?;
                    }
                    Ok(f)
                })?;
                OpRes::Secinfo(opnum, flavors)
            }
            op::WRITE => OpRes::Write {
                count: d.u32()?,
                committed: d.u32()?,
                verf: fixed8(d)?,
            },
            op::BIND_CONN_TO_SESSION => OpRes::BindConnToSession {
                session: fixed16(d)?,
                dir: d.u32()?,
                rdma_mode: d.bool()?,
            },
            op::EXCHANGE_ID => {
                let clientid = d.u64()?;
                let sequenceid = d.u32()?;
                let flags = d.u32()?;
                if d.u32()? != 0 {
                    return Err(xdr::XdrError::InvalidDiscriminant {
                        type_name: "state_protect_how4 (only SP4_NONE is decoded)",
                        value: 1,
                    });
                }
                let server_owner = ServerOwner4::decode(d)?;
                let server_scope = d.opaque_bytes(1024)?;
                let ids = d.array(1, |d| {
                    let dom = d.opaque_bytes(1024)?;
                    let name = d.opaque_bytes(1024)?;
                    d.i64()?;
                    d.u32()?;
                    Ok((dom, name))
                })?;
                let (impl_domain, impl_name) = ids.into_iter().next().unwrap_or_default();
                OpRes::ExchangeId(Box::new(ExchangeIdOk {
                    clientid,
                    sequenceid,
                    flags,
                    server_owner,
                    server_scope,
                    impl_domain,
                    impl_name,
                }))
            }
            op::CREATE_SESSION => OpRes::CreateSession(Box::new(CreateSessionOk {
                session: fixed16(d)?,
                sequence: d.u32()?,
                flags: d.u32()?,
                fore: ChannelAttrs4::decode(d)?,
                back: ChannelAttrs4::decode(d)?,
            })),
            op::SEQUENCE => OpRes::Sequence(SequenceOk {
                session: fixed16(d)?,
                sequenceid: d.u32()?,
                slotid: d.u32()?,
                highest_slotid: d.u32()?,
                target_highest_slotid: d.u32()?,
                status_flags: d.u32()?,
            }),
            op::TEST_STATEID => {
                OpRes::TestStateid(d.array(MAX_SMALL_ARRAY, |d| Ok(Nfsstat4(d.u32()?)))?)
            }
            op::SEEK => OpRes::Seek {
                eof: d.bool()?,
                offset: d.u64()?,
            },
            n => OpRes::Status(n, status),
        })
    }
}

impl CompoundReply {
    /// Decode `COMPOUND4res`; the whole buffer must be consumed.
    pub fn decode(b: &Bytes) -> xdr::Result<CompoundReply> {
        let mut d = Decoder::from_bytes(b);
        let status = Nfsstat4(d.u32()?);
        let tag = d.opaque_bytes(super::types::MAX_TAG)?;
        let results = d.array(super::compound::MAX_OPS_WIRE, OpRes::decode)?;
        d.finish()?;
        Ok(CompoundReply {
            status,
            tag,
            results,
        })
    }
}
