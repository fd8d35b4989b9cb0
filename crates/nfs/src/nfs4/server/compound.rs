//! The COMPOUND loop (RFC 8881 §16.2.3, §2.10.6): minor versions, SEQUENCE first and the
//! session's limits, operations evaluated in order until one fails, the current and saved
//! filehandles, the current stateid, and the slot's reply cache.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use xdr::Decoder;

use super::super::args::{OpArgs, SequenceArgs};
use super::super::compound::CompoundReply;
use super::super::consts::op;
use super::super::res::OpRes;
use super::super::state::{SeqOutcome, SlotRef};
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{ChannelAttrs4, Stateid4, Tag4};
use super::fh::CurFh;
use super::{Nfs4Server, Request};
use crate::gate::Exported;

/// The COMPOUND header did not decode: the RPC layer answers GARBAGE_ARGS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("COMPOUND4args header does not decode")]
pub struct Garbage;

/// Bytes of an RPC reply around the COMPOUND results (record mark, XID, message type, reply
/// status, verifier, accept status): counted against `ca_maxresponsesize`, which bounds the
/// whole reply (RFC 8881 §18.36.3).
const RPC_REPLY_OVERHEAD: usize = 32;

/// Everything one COMPOUND carries from operation to operation.
pub(super) struct Ctx<'r> {
    pub(super) req: &'r Request<'r>,
    /// The COMPOUND's minor version.
    pub(super) minor: u32,
    pub(super) now: Instant,
    /// The exports at the start of the call (a reload does not change a running call).
    pub(super) exports: Arc<Vec<Arc<Exported>>>,
    /// The client of the session SEQUENCE named.
    pub(super) clientid: Option<u64>,
    pub(super) cur: Option<CurFh>,
    pub(super) saved: Option<CurFh>,
    /// RFC 8881 §16.2.3.1.2: the stateid the last stateid-returning operation produced.
    pub(super) cur_sid: Option<Stateid4>,
    pub(super) saved_sid: Option<Stateid4>,
    /// Bytes the reply may still grow by before it exceeds `ca_maxresponsesize`.
    pub(super) room: usize,
}

impl Ctx<'_> {
    /// The stateid an operation names, with the special "current stateid" (seqid 1, other
    /// all zeros) replaced by the current stateid (RFC 8881 §16.2.3.1.2); none set is
    /// NFS4ERR_BAD_STATEID.
    pub(super) fn stateid(&self, sid: &Stateid4) -> Res4<Stateid4> {
        if *sid == Stateid4::CURRENT {
            self.cur_sid.ok_or(Nfsstat4::BAD_STATEID)
        } else {
            Ok(*sid)
        }
    }

    /// The client of the session, for operations that need one (they all follow SEQUENCE).
    pub(super) fn client(&self) -> Res4<u64> {
        self.clientid.ok_or(Nfsstat4::OP_NOT_IN_SESSION)
    }

    /// Set a new current filehandle: the current stateid no longer applies to it.
    pub(super) fn set_fh(&mut self, fh: CurFh) {
        self.cur = Some(fh);
        self.cur_sid = None;
    }
}

/// Operations a COMPOUND may start with instead of SEQUENCE, as its only operation
/// (RFC 8881 §2.10.6.2... §18.35.3, §18.36.3, §18.37.3, §18.34.3, §18.50.3).
fn sessionless(opnum: u32) -> bool {
    matches!(
        opnum,
        op::EXCHANGE_ID
            | op::CREATE_SESSION
            | op::DESTROY_SESSION
            | op::BIND_CONN_TO_SESSION
            | op::DESTROY_CLIENTID
    )
}

impl Nfs4Server {
    /// Execute one COMPOUND (RFC 8881 §16.2). Blocking: file-system work runs on the calling
    /// thread.
    pub fn compound(&self, req: &Request<'_>) -> Result<CompoundReply, Garbage> {
        let mut d = Decoder::from_bytes(req.args);
        let tag: Tag4 = d.get().map_err(|_| Garbage)?;
        let minor = d.u32().map_err(|_| Garbage)?;
        let nops = d.u32().map_err(|_| Garbage)?;
        let tag = Bytes::copy_from_slice(tag.as_bytes());
        let reply = |status, results| CompoundReply {
            status,
            tag: tag.clone(),
            results,
        };
        if minor == 0 {
            return Ok(self.compound40(&mut d, tag, nops, req));
        }
        // RFC 8881 §16.2.3: an unsupported minor version gets NFS4ERR_MINOR_VERS_MISMATCH and
        // no results; the tag is still echoed.
        if !(1..=2).contains(&minor) {
            return Ok(reply(Nfsstat4::MINOR_VERS_MISMATCH, Vec::new()));
        }
        let mut ctx = Ctx {
            req,
            minor,
            now: Instant::now(),
            exports: self.table.snapshot(),
            clientid: None,
            cur: None,
            saved: None,
            cur_sid: None,
            saved_sid: None,
            room: usize::MAX,
        };
        let mut results: Vec<OpRes> = Vec::new();
        let mut slot: Option<(SlotRef, ChannelAttrs4)> = None;
        let base = RPC_REPLY_OVERHEAD + 4 + xdr::opaque_len(tag.len()) + 4;
        let mut size = base;
        for i in 0..nops {
            let Ok(opnum) = d.u32() else {
                results.push(OpRes::Status(op::ILLEGAL, Nfsstat4::BADXDR));
                break;
            };
            let args = match OpArgs::decode(opnum, minor, &mut d) {
                Ok(a) => a,
                Err(_) => {
                    // RFC 8881 §15.1.1.1: arguments that do not decode are NFS4ERR_BADXDR, and
                    // the COMPOUND stops there.
                    let n = if op::name(opnum) == "UNKNOWN" {
                        op::ILLEGAL
                    } else {
                        opnum
                    };
                    results.push(OpRes::error(n, Nfsstat4::BADXDR));
                    break;
                }
            };
            let res = if i == 0 {
                match &args {
                    OpArgs::Sequence(sa) => match self.sequence(&mut ctx, sa, nops, req) {
                        Ok(SeqStart::New(ok, s, fore)) => {
                            ctx.room = (fore.maxresponsesize as usize).saturating_sub(base);
                            slot = Some((s, fore));
                            ok
                        }
                        Ok(SeqStart::Replay(cached)) => return Ok(cached),
                        Err(s) => OpRes::Status(op::SEQUENCE, s),
                    },
                    OpArgs::Illegal(_) => OpRes::Status(op::ILLEGAL, Nfsstat4::OP_ILLEGAL),
                    a if sessionless(a.opnum()) => {
                        if nops != 1 {
                            OpRes::error(a.opnum(), Nfsstat4::NOT_ONLY_OP)
                        } else {
                            self.execute(&mut ctx, args)
                        }
                    }
                    a => OpRes::error(a.opnum(), Nfsstat4::OP_NOT_IN_SESSION),
                }
            } else if matches!(args, OpArgs::Sequence(_)) {
                OpRes::Status(op::SEQUENCE, Nfsstat4::SEQUENCE_POS)
            } else {
                self.execute(&mut ctx, args)
            };
            let mut res = res;
            if let Some((s, fore)) = &slot {
                let len = res.encoded_len();
                if size + len > fore.maxresponsesize as usize {
                    // RFC 8881 §15.1.10.3... §2.10.6.4: the reply would exceed
                    // ca_maxresponsesize.
                    res = OpRes::error(res.opnum(), Nfsstat4::REP_TOO_BIG);
                } else if s.cachethis
                    && size + len > (fore.maxresponsesize_cached as usize).max(base)
                {
                    // RFC 8881 §2.10.6.4: a reply the client wants cached must fit the
                    // slot's cache.
                    res = OpRes::error(res.opnum(), Nfsstat4::REP_TOO_BIG_TO_CACHE);
                }
                size += res.encoded_len();
                ctx.room = (fore.maxresponsesize as usize).saturating_sub(size);
            }
            let failed = !res.status().is_ok();
            results.push(res);
            if failed {
                break;
            }
        }
        let status = results.last().map_or(Nfsstat4::OK, OpRes::status);
        let out = reply(status, results);
        if let Some((s, _)) = slot {
            // Every path that took the slot frees it (RFC 8881 §2.10.6.1: the slot is
            // available again once the reply is formed).
            self.state().slot_done(s, &out);
        }
        Ok(out)
    }

    /// SEQUENCE as the first operation: the session's limits are checked before the slot is
    /// taken (as Linux nfsd does), so a refused request does not consume a sequence id.
    fn sequence(
        &self,
        ctx: &mut Ctx<'_>,
        sa: &SequenceArgs,
        nops: u32,
        req: &Request<'_>,
    ) -> Res4<SeqStart> {
        let mut st = self.state();
        let fore = st.fore_attrs(&sa.session).ok_or(Nfsstat4::BADSESSION)?;
        // RFC 8881 §2.10.6.4: more operations than ca_maxoperations is NFS4ERR_TOO_MANY_OPS,
        // a request larger than ca_maxrequestsize NFS4ERR_REQ_TOO_BIG.
        if nops > fore.maxoperations {
            return Err(Nfsstat4::TOO_MANY_OPS);
        }
        if req.args.len() > fore.maxrequestsize as usize {
            return Err(Nfsstat4::REQ_TOO_BIG);
        }
        match st.sequence(sa, req.conn, ctx.now)? {
            SeqOutcome::Replay(r) => Ok(SeqStart::Replay(r)),
            SeqOutcome::New {
                ok,
                slot,
                clientid,
                fore,
            } => {
                ctx.clientid = Some(clientid);
                Ok(SeqStart::New(OpRes::Sequence(ok), slot, fore))
            }
        }
    }

    /// Execute one operation other than a first SEQUENCE.
    pub(super) fn execute(&self, ctx: &mut Ctx<'_>, args: OpArgs) -> OpRes {
        let opnum = args.opnum();
        let r = match args {
            OpArgs::Illegal(_) => Err(Nfsstat4::OP_ILLEGAL),
            OpArgs::Unsupported(_) => Err(Nfsstat4::NOTSUPP),
            // Delegations are never granted (RFC 8881 §18.6, §18.5: nothing to return or
            // purge), OPENATTR has no named attributes behind it.
            OpArgs::Delegreturn(_) => Err(Nfsstat4::BAD_STATEID),
            OpArgs::Delegpurge(_) | OpArgs::Openattr(_) => Err(Nfsstat4::NOTSUPP),
            OpArgs::Sequence(_) => Err(Nfsstat4::SEQUENCE_POS),
            a @ (OpArgs::ExchangeId { .. }
            | OpArgs::CreateSession(_)
            | OpArgs::DestroySession(_)
            | OpArgs::BindConnToSession { .. }
            | OpArgs::DestroyClientid(_)
            | OpArgs::ReclaimComplete(_)
            | OpArgs::BackchannelCtl { .. }
            | OpArgs::TestStateid(_)
            | OpArgs::FreeStateid(_)) => self.session_op(ctx, a),
            a @ (OpArgs::Putfh(_)
            | OpArgs::Putrootfh
            | OpArgs::Putpubfh
            | OpArgs::Getfh
            | OpArgs::Savefh
            | OpArgs::Restorefh
            | OpArgs::Lookup(_)
            | OpArgs::Lookupp
            | OpArgs::Secinfo(_)
            | OpArgs::SecinfoNoName(_)) => self.fh_op(ctx, a),
            a @ (OpArgs::Open(_)
            | OpArgs::Close { .. }
            | OpArgs::OpenDowngrade { .. }
            | OpArgs::Read { .. }
            | OpArgs::Write { .. }
            | OpArgs::Commit { .. }
            | OpArgs::Lock { .. }
            | OpArgs::Lockt { .. }
            | OpArgs::Locku { .. }
            | OpArgs::Seek { .. }
            | OpArgs::Allocate { .. }
            | OpArgs::Deallocate { .. }) => self.io_op(ctx, a),
            a => self.file_op(ctx, a),
        };
        match r {
            Ok(res) => res,
            Err(s) if opnum == op::ILLEGAL || matches!(s, Nfsstat4::OP_ILLEGAL) => {
                OpRes::Status(op::ILLEGAL, s)
            }
            Err(s) => OpRes::error(opnum, s),
        }
    }
}

/// What a first SEQUENCE led to.
enum SeqStart {
    New(OpRes, SlotRef, ChannelAttrs4),
    Replay(CompoundReply),
}
