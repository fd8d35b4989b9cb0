//! The client half of the back channel: an RPC program that answers CB_NULL and CB_COMPOUND
//! (RFC 8881 §20) with CB_SEQUENCE (§20.9) and CB_NOTIFY_LOCK (§20.11), and reports each
//! callback it saw to its owner. For the NFSv4.1 client and the tests.

use std::sync::Arc;

use oncrpc::service::BoxFuture;
use oncrpc::{Call, Outcome, Program};
use tokio::sync::mpsc;

use super::super::status::Nfsstat4;
use super::super::types::{Fh4, SessionId4, StateOwner4};
use super::wire::{
    CB_COMPOUND, CB_NULL, CB_VERSION, CbCompoundArgs, CbCompoundRes, CbOpArgs, CbOpRes,
    CbSequenceOk, cb_op,
};

/// Callbacks kept for the owner at most; more are answered and not reported.
pub const MAX_EVENTS: usize = 256;

/// A callback the client answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbEvent {
    Null,
    /// CB_SEQUENCE on `session` with this sequence id, then CB_NOTIFY_LOCK.
    NotifyLock {
        session: SessionId4,
        sequenceid: u32,
        fh: Fh4,
        owner: StateOwner4,
    },
}

/// The callback program of one client.
pub struct CallbackProgram {
    program: u32,
    events: mpsc::Sender<CbEvent>,
}

impl std::fmt::Debug for CallbackProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackProgram")
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

impl CallbackProgram {
    /// Answer callbacks to program number `program`; the callbacks come out of the receiver.
    pub fn new(program: u32) -> (Arc<Self>, mpsc::Receiver<CbEvent>) {
        let (events, rx) = mpsc::channel(MAX_EVENTS);
        (Arc::new(CallbackProgram { program, events }), rx)
    }

    /// Execute one CB_COMPOUND (RFC 8881 §20.2.3): operations in order until one fails.
    /// CB_SEQUENCE is answered as the server sent it (this client keeps no back channel reply
    /// cache: the server it talks to never asks for `cachethis`); the other operations RFC
    /// 8881 defines are NFS4ERR_NOTSUPP, unknown ones NFS4ERR_OP_ILLEGAL.
    pub fn answer(&self, a: &CbCompoundArgs) -> CbCompoundRes {
        let mut results = Vec::new();
        let mut seq: Option<(SessionId4, u32)> = None;
        for (i, op) in a.ops.iter().enumerate() {
            let r = match op {
                CbOpArgs::Sequence(s) if i == 0 => {
                    seq = Some((s.session, s.sequenceid));
                    CbOpRes::Sequence(Ok(CbSequenceOk {
                        session: s.session,
                        sequenceid: s.sequenceid,
                        slotid: s.slotid,
                        highest_slotid: s.highest_slotid,
                        target_highest_slotid: s.highest_slotid,
                    }))
                }
                // §20.9.3: CB_SEQUENCE anywhere but first is NFS4ERR_SEQUENCE_POS.
                CbOpArgs::Sequence(_) => CbOpRes::Sequence(Err(Nfsstat4::SEQUENCE_POS)),
                _ if seq.is_none() => CbOpRes::Other(op.opnum(), Nfsstat4::OP_NOT_IN_SESSION),
                CbOpArgs::NotifyLock { fh, owner } => {
                    if let Some((session, sequenceid)) = seq {
                        let _ = self.events.try_send(CbEvent::NotifyLock {
                            session,
                            sequenceid,
                            fh: fh.clone(),
                            owner: owner.clone(),
                        });
                    }
                    CbOpRes::NotifyLock(Nfsstat4::OK)
                }
                CbOpArgs::Other(n) if (3..=15).contains(n) => CbOpRes::Other(*n, Nfsstat4::NOTSUPP),
                CbOpArgs::Other(_) => CbOpRes::Other(cb_op::CB_ILLEGAL, Nfsstat4::OP_ILLEGAL),
            };
            let failed = !r.status().is_ok();
            results.push(r);
            if failed {
                break;
            }
        }
        CbCompoundRes {
            status: results.last().map_or(Nfsstat4::OK, CbOpRes::status),
            tag: a.tag.clone(),
            results,
        }
    }
}

impl Program for CallbackProgram {
    fn program(&self) -> u32 {
        self.program
    }
    fn versions(&self) -> (u32, u32) {
        (CB_VERSION, CB_VERSION)
    }
    fn name(&self) -> &'static str {
        "nfs4_cb"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            match call.header.proc_ {
                CB_NULL => {
                    let _ = self.events.try_send(CbEvent::Null);
                    Outcome::Success(call.reply_encoder().finish())
                }
                CB_COMPOUND => {
                    let Ok(a) = CbCompoundArgs::decode(&call.args) else {
                        return Outcome::GarbageArgs;
                    };
                    let res = self.answer(&a);
                    let mut e = call.reply_encoder();
                    res.encode(&mut e);
                    Outcome::Success(e.finish())
                }
                _ => Outcome::ProcUnavail,
            }
        })
    }
}
