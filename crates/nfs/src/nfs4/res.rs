//! Operation results (`nfs_resop4`, RFC 8881 §16.2.2 and §18; RFC 7862 §15): what the COMPOUND
//! executor encodes. Every result starts with the operation number and an `nfsstat4`; the body
//! follows only where the result union has one for that status.
//!
//! DDP-eligible items (RFC 8267 §6.1: READ data and READLINK text) go through
//! `Encoder::put_ddp_opaque`, so that over RPC-over-RDMA they leave through the Write chunks the
//! client provided, paired in COMPOUND order (RFC 8267 §6.4.1).

use bytes::Bytes;
use xdr::{Encoder, XdrEncode};

use super::consts::op;
use super::status::Nfsstat4;
use super::types::{
    Bitmap4, ChangeInfo4, ChannelAttrs4, Component4, Fattr4, Fh4, Linktext4, ServerOwner4,
    SessionId4, StateOwner4, Stateid4, Verifier4,
};

/// `LOCK4denied` (RFC 8881 §18.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockDenied {
    pub offset: u64,
    pub length: u64,
    pub locktype: u32,
    pub owner: StateOwner4,
}

/// One READDIR entry (`entry4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry4 {
    pub cookie: u64,
    pub name: Component4,
    pub attrs: Fattr4,
}

impl Entry4 {
    /// Bytes this entry adds to a READDIR reply: the "value follows" word and the entry.
    pub fn encoded_len(&self) -> usize {
        4 + 8 + self.name.encoded_len() + self.attrs.encoded_len()
    }
}

/// OPEN4resok (RFC 8881 §18.16). Delegations are never granted: OPEN_DELEGATE_NONE, or
/// OPEN_DELEGATE_NONE_EXT with a reason when the client asked for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOk {
    pub stateid: Stateid4,
    pub cinfo: ChangeInfo4,
    pub rflags: u32,
    pub attrset: Bitmap4,
    /// `Some(why)` sends OPEN_DELEGATE_NONE_EXT with `why_no_delegation4`.
    pub no_deleg_why: Option<u32>,
}

/// EXCHANGE_ID4resok (RFC 8881 §18.35), with SP4_NONE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeIdOk {
    pub clientid: u64,
    pub sequenceid: u32,
    pub flags: u32,
    pub server_owner: ServerOwner4,
    pub server_scope: Bytes,
    pub impl_domain: Bytes,
    pub impl_name: Bytes,
}

/// CREATE_SESSION4resok (RFC 8881 §18.36).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSessionOk {
    pub session: SessionId4,
    pub sequence: u32,
    pub flags: u32,
    pub fore: ChannelAttrs4,
    pub back: ChannelAttrs4,
}

/// SEQUENCE4resok (RFC 8881 §18.46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceOk {
    pub session: SessionId4,
    pub sequenceid: u32,
    pub slotid: u32,
    pub highest_slotid: u32,
    pub target_highest_slotid: u32,
    pub status_flags: u32,
}

/// One operation's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpRes {
    /// An operation whose result is its status alone (every error, and the successes that
    /// carry nothing: PUTFH, LOOKUP, SAVEFH, CLOSE of nothing...).
    Status(u32, Nfsstat4),
    Access {
        supported: u32,
        access: u32,
    },
    Close(Stateid4),
    Commit(Verifier4),
    Create {
        cinfo: ChangeInfo4,
        attrset: Bitmap4,
    },
    Getattr(Fattr4),
    Getfh(Fh4),
    Link(ChangeInfo4),
    Lock(Stateid4),
    /// NFS4ERR_DENIED for LOCK or LOCKT, with the conflicting lock.
    Denied(u32, LockDenied),
    Locku(Stateid4),
    Open(Box<OpenOk>),
    OpenDowngrade(Stateid4),
    Read {
        eof: bool,
        data: Bytes,
    },
    Readdir {
        verf: Verifier4,
        entries: Vec<Entry4>,
        eof: bool,
    },
    Readlink(Linktext4),
    Remove(ChangeInfo4),
    Rename {
        source: ChangeInfo4,
        target: ChangeInfo4,
    },
    /// SECINFO or SECINFO_NO_NAME: the flavors, in preference order (AUTH_SYS, AUTH_NONE).
    Secinfo(u32, Vec<u32>),
    /// SETATTR always carries the bitmap of what it set, even on error.
    Setattr(Nfsstat4, Bitmap4),
    Write {
        count: u32,
        committed: u32,
        verf: Verifier4,
    },
    BindConnToSession {
        session: SessionId4,
        dir: u32,
        rdma_mode: bool,
    },
    ExchangeId(Box<ExchangeIdOk>),
    CreateSession(Box<CreateSessionOk>),
    Sequence(SequenceOk),
    TestStateid(Vec<Nfsstat4>),
    Seek {
        eof: bool,
        offset: u64,
    },
    /// A result of an operation only NFSv4.0 has, with a body.
    V40(super::v40::Res40),
}

impl OpRes {
    /// The operation number this result answers.
    pub fn opnum(&self) -> u32 {
        match self {
            OpRes::Status(n, _) | OpRes::Denied(n, _) | OpRes::Secinfo(n, _) => *n,
            OpRes::Access { .. } => op::ACCESS,
            OpRes::Close(_) => op::CLOSE,
            OpRes::Commit(_) => op::COMMIT,
            OpRes::Create { .. } => op::CREATE,
            OpRes::Getattr(_) => op::GETATTR,
            OpRes::Getfh(_) => op::GETFH,
            OpRes::Link(_) => op::LINK,
            OpRes::Lock(_) => op::LOCK,
            OpRes::Locku(_) => op::LOCKU,
            OpRes::Open(_) => op::OPEN,
            OpRes::OpenDowngrade(_) => op::OPEN_DOWNGRADE,
            OpRes::Read { .. } => op::READ,
            OpRes::Readdir { .. } => op::READDIR,
            OpRes::Readlink(_) => op::READLINK,
            OpRes::Remove(_) => op::REMOVE,
            OpRes::Rename { .. } => op::RENAME,
            OpRes::Setattr(..) => op::SETATTR,
            OpRes::Write { .. } => op::WRITE,
            OpRes::BindConnToSession { .. } => op::BIND_CONN_TO_SESSION,
            OpRes::ExchangeId(_) => op::EXCHANGE_ID,
            OpRes::CreateSession(_) => op::CREATE_SESSION,
            OpRes::Sequence(_) => op::SEQUENCE,
            OpRes::TestStateid(_) => op::TEST_STATEID,
            OpRes::Seek { .. } => op::SEEK,
            OpRes::V40(r) => r.opnum(),
        }
    }

    /// The status this result carries.
    pub fn status(&self) -> Nfsstat4 {
        match self {
            OpRes::Status(_, s) | OpRes::Setattr(s, _) => *s,
            OpRes::Denied(..) => Nfsstat4::DENIED,
            OpRes::V40(r) => r.status(),
            _ => Nfsstat4::OK,
        }
    }

    /// An error result for operation `opnum` (SETATTR keeps its empty bitmap).
    pub fn error(opnum: u32, status: Nfsstat4) -> OpRes {
        if opnum == op::SETATTR {
            OpRes::Setattr(status, Bitmap4::default())
        } else {
            OpRes::Status(opnum, status)
        }
    }

    /// Append this result (`nfs_resop4`) to a COMPOUND reply.
    pub fn encode(&self, e: &mut Encoder) {
        e.put_u32(self.opnum());
        self.status().encode(e);
        match self {
            OpRes::Status(..) => {}
            OpRes::Access { supported, access } => {
                e.put_u32(*supported);
                e.put_u32(*access);
            }
            OpRes::Close(s) | OpRes::Lock(s) | OpRes::Locku(s) | OpRes::OpenDowngrade(s) => {
                s.encode(e)
            }
            OpRes::Commit(v) => v.encode(e),
            OpRes::Create { cinfo, attrset } => {
                cinfo.encode(e);
                attrset.encode(e);
            }
            OpRes::Getattr(f) => f.encode(e),
            OpRes::Getfh(fh) => fh.encode(e),
            OpRes::Link(c) | OpRes::Remove(c) => c.encode(e),
            OpRes::Denied(_, d) => {
                e.put_u64(d.offset);
                e.put_u64(d.length);
                e.put_u32(d.locktype);
                d.owner.encode(e);
            }
            OpRes::Open(o) => {
                o.stateid.encode(e);
                o.cinfo.encode(e);
                e.put_u32(o.rflags);
                o.attrset.encode(e);
                match o.no_deleg_why {
                    None => e.put_u32(super::consts::deleg::NONE),
                    Some(why) => {
                        e.put_u32(super::consts::deleg::NONE_EXT);
                        e.put_u32(why);
                        // CONTENTION and RESOURCE carry a bool ("will push/signal"): never.
                        if why == super::consts::deleg::WND4_CONTENTION
                            || why == super::consts::deleg::WND4_RESOURCE
                        {
                            e.put_bool(false);
                        }
                    }
                }
            }
            OpRes::Read { eof, data } => {
                e.put_bool(*eof);
                // RFC 8267 §6.1: the data of a READ result is DDP-eligible.
                let _ = e.put_ddp_opaque(data.clone());
            }
            OpRes::Readdir { verf, entries, eof } => {
                verf.encode(e);
                for ent in entries {
                    e.put_u32(1);
                    e.put_u64(ent.cookie);
                    ent.name.encode(e);
                    ent.attrs.encode(e);
                }
                e.put_u32(0);
                e.put_bool(*eof);
            }
            OpRes::Readlink(l) => {
                // RFC 8267 §6.1: the linktext4 of a READLINK result is DDP-eligible.
                let _ = e.put_ddp_opaque(l.0.clone());
            }
            OpRes::Rename { source, target } => {
                source.encode(e);
                target.encode(e);
            }
            OpRes::Secinfo(_, flavors) => {
                // AUTH_SYS and AUTH_NONE carry no flavor_info (RFC 8881 §18.29).
                e.put_array(flavors, |e, f| e.put_u32(*f));
            }
            OpRes::Setattr(_, bits) => bits.encode(e),
            OpRes::Write {
                count,
                committed,
                verf,
            } => {
                e.put_u32(*count);
                e.put_u32(*committed);
                verf.encode(e);
            }
            OpRes::BindConnToSession {
                session,
                dir,
                rdma_mode,
            } => {
                session.encode(e);
                e.put_u32(*dir);
                e.put_bool(*rdma_mode);
            }
            OpRes::ExchangeId(x) => {
                e.put_u64(x.clientid);
                e.put_u32(x.sequenceid);
                e.put_u32(x.flags);
                e.put_u32(0); // SP4_NONE
                x.server_owner.encode(e);
                e.put_opaque(&x.server_scope);
                // eir_server_impl_id<1>: one entry.
                e.put_u32(1);
                e.put_opaque(&x.impl_domain);
                e.put_opaque(&x.impl_name);
                e.put_i64(0);
                e.put_u32(0);
            }
            OpRes::CreateSession(c) => {
                c.session.encode(e);
                e.put_u32(c.sequence);
                e.put_u32(c.flags);
                c.fore.encode(e);
                c.back.encode(e);
            }
            OpRes::Sequence(s) => {
                s.session.encode(e);
                e.put_u32(s.sequenceid);
                e.put_u32(s.slotid);
                e.put_u32(s.highest_slotid);
                e.put_u32(s.target_highest_slotid);
                e.put_u32(s.status_flags);
            }
            OpRes::TestStateid(codes) => e.put_array(codes, |e, c| c.encode(e)),
            OpRes::Seek { eof, offset } => {
                e.put_bool(*eof);
                e.put_u64(*offset);
            }
            OpRes::V40(r) => r.encode(e),
        }
    }

    /// Bytes [`OpRes::encode`] appends when nothing is reduced.
    pub fn encoded_len(&self) -> usize {
        let body = match self {
            OpRes::Status(..) => 0,
            OpRes::Access { .. } => 8,
            OpRes::Close(_) | OpRes::Lock(_) | OpRes::Locku(_) | OpRes::OpenDowngrade(_) => 16,
            OpRes::Commit(_) => 8,
            OpRes::Create { cinfo, attrset } => cinfo.encoded_len() + attrset.encoded_len(),
            OpRes::Getattr(f) => f.encoded_len(),
            OpRes::Getfh(fh) => fh.encoded_len(),
            OpRes::Link(c) | OpRes::Remove(c) => c.encoded_len(),
            OpRes::Denied(_, d) => 8 + 8 + 4 + d.owner.encoded_len(),
            OpRes::Open(o) => {
                let deleg = match o.no_deleg_why {
                    None => 4,
                    Some(w) => {
                        8 + if w == super::consts::deleg::WND4_CONTENTION
                            || w == super::consts::deleg::WND4_RESOURCE
                        {
                            4
                        } else {
                            0
                        }
                    }
                };
                16 + o.cinfo.encoded_len() + 4 + o.attrset.encoded_len() + deleg
            }
            OpRes::Read { data, .. } => 4 + xdr::opaque_len(data.len()),
            OpRes::Readdir { entries, .. } => {
                8 + entries.iter().map(Entry4::encoded_len).sum::<usize>() + 4 + 4
            }
            OpRes::Readlink(l) => l.encoded_len(),
            OpRes::Rename { source, target } => source.encoded_len() + target.encoded_len(),
            OpRes::Secinfo(_, f) => 4 + 4 * f.len(),
            OpRes::Setattr(_, b) => b.encoded_len(),
            OpRes::Write { .. } => 16,
            OpRes::BindConnToSession { .. } => 16 + 8,
            OpRes::ExchangeId(x) => {
                8 + 4
                    + 4
                    + 4
                    + x.server_owner.encoded_len()
                    + xdr::opaque_len(x.server_scope.len())
                    + 4
                    + xdr::opaque_len(x.impl_domain.len())
                    + xdr::opaque_len(x.impl_name.len())
                    + 12
            }
            OpRes::CreateSession(c) => 16 + 8 + c.fore.encoded_len() + c.back.encoded_len(),
            OpRes::Sequence(_) => 16 + 20,
            OpRes::TestStateid(c) => 4 + 4 * c.len(),
            OpRes::Seek { .. } => 12,
            OpRes::V40(r) => r.encoded_len(),
        };
        8 + body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: &OpRes) -> Bytes {
        let mut e = Encoder::new();
        r.encode(&mut e);
        e.into_bytes()
    }

    #[test]
    fn encoded_len_matches_encode_for_every_shape() {
        let sid = Stateid4 {
            seqid: 3,
            other: [7; 12],
        };
        let ci = ChangeInfo4 {
            atomic: true,
            before: 1,
            after: 2,
        };
        let owner = StateOwner4 {
            clientid: 9,
            owner: super::super::types::Opaque1024::from_slice(b"own"),
        };
        let all = vec![
            OpRes::Status(op::PUTFH, Nfsstat4::OK),
            OpRes::Access {
                supported: 0x3f,
                access: 0x1,
            },
            OpRes::Close(sid),
            OpRes::Commit([1; 8]),
            OpRes::Create {
                cinfo: ci.clone(),
                attrset: Bitmap4::from_bits(&[33]),
            },
            OpRes::Getattr(Fattr4 {
                mask: Bitmap4::from_bits(&[4]),
                vals: Bytes::from_static(&[0; 8]),
            }),
            OpRes::Getfh(Fh4::from_slice(b"handle")),
            OpRes::Link(ci.clone()),
            OpRes::Lock(sid),
            OpRes::Denied(
                op::LOCKT,
                LockDenied {
                    offset: 0,
                    length: 10,
                    locktype: 2,
                    owner,
                },
            ),
            OpRes::Open(Box::new(OpenOk {
                stateid: sid,
                cinfo: ci.clone(),
                rflags: 4,
                attrset: Bitmap4::default(),
                no_deleg_why: Some(super::super::consts::deleg::WND4_CONTENTION),
            })),
            OpRes::Read {
                eof: true,
                data: Bytes::from_static(b"hello"),
            },
            OpRes::Readdir {
                verf: [0; 8],
                entries: vec![Entry4 {
                    cookie: 3,
                    name: Component4::from_slice(b"a"),
                    attrs: Fattr4::default(),
                }],
                eof: true,
            },
            OpRes::Readlink(Linktext4::from_slice(b"/x")),
            OpRes::Rename {
                source: ci.clone(),
                target: ci,
            },
            OpRes::Secinfo(op::SECINFO_NO_NAME, vec![1, 0]),
            OpRes::Setattr(Nfsstat4::INVAL, Bitmap4::default()),
            OpRes::Write {
                count: 5,
                committed: 2,
                verf: [2; 8],
            },
            OpRes::BindConnToSession {
                session: [1; 16],
                dir: 3,
                rdma_mode: false,
            },
            OpRes::TestStateid(vec![Nfsstat4::OK, Nfsstat4::BAD_STATEID]),
            OpRes::Seek {
                eof: false,
                offset: 4096,
            },
        ];
        for r in &all {
            assert_eq!(enc(r).len(), r.encoded_len(), "{r:?}");
        }
    }

    #[test]
    fn error_results_are_op_and_status_except_setattr() {
        let b = enc(&OpRes::error(op::READ, Nfsstat4::NOFILEHANDLE));
        assert_eq!(&b[..], &[0, 0, 0, 25, 0, 0, 0x27, 0x24][..]);
        let s = enc(&OpRes::error(op::SETATTR, Nfsstat4::NOFILEHANDLE));
        assert_eq!(s.len(), 12, "SETATTR4res carries attrsset even on error");
    }
}
