//! The NFS program (100003) answering versions 3 and 4 on the same ports: version 3 goes to
//! the NFSv3 program it wraps (the export gate), version 4 to the COMPOUND executor
//! (RFC 8881 §16: NULL and COMPOUND; other procedures PROC_UNAVAIL). A version outside 3..4
//! gets PROG_MISMATCH with that range from the dispatcher.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Credential, Outcome, Program};

use super::super::consts::proc4;
use super::{Nfs4Server, Request};
use crate::nfs3;

/// NFS version 4 (RFC 8881 §16.1).
pub const VERSION4: u32 = 4;

/// NFS versions 3 and 4 as one RPC program.
pub struct NfsV3V4 {
    v3: Arc<dyn Program>,
    v4: Arc<Nfs4Server>,
}

impl std::fmt::Debug for NfsV3V4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsV3V4").finish_non_exhaustive()
    }
}

impl NfsV3V4 {
    /// Serve `v3` (an NFS version 3 program) and `v4` together.
    pub fn program(v3: Arc<dyn Program>, v4: Arc<Nfs4Server>) -> Arc<dyn Program> {
        Arc::new(NfsV3V4 { v3, v4 })
    }
}

/// The connection a call came on, as the state tables number them: the peer's address and
/// port name one TCP connection (in-process calls share 0).
fn conn_id(call: &Call) -> u64 {
    match call.context.peer {
        None => 0,
        Some(p) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            p.hash(&mut h);
            h.finish() | 1
        }
    }
}

/// Whether a COMPOUND is answered on the calling task instead of a blocking thread: when every
/// operation in it is one that NFSv3 also answers there (attribute reads, ACCESS, LOOKUP: a
/// `statx` or two of objects found through their handles) or the session and filehandle
/// plumbing around them (SEQUENCE, PUTFH, GETFH, SAVEFH, ...). A hop to a blocking thread and
/// back costs two thread wake-ups, which made a one-at-a-time NFSv4.1 GETATTR (SEQUENCE,
/// PUTFH, GETATTR) cost about three times NFSv3's. Anything that reads a directory, changes the
/// namespace or moves data, and may wait for the disk, still goes to a blocking thread.
fn runs_inline(args: &[u8]) -> bool {
    use crate::nfs4::consts::op;
    let Ok(scan) = crate::ulb::scan_compound(args) else {
        return false;
    };
    !scan.stopped_at_unknown
        && !scan.ops.is_empty()
        && scan.ops.iter().all(|o| {
            matches!(
                *o,
                op::SEQUENCE
                    | op::PUTFH
                    | op::PUTROOTFH
                    | op::PUTPUBFH
                    | op::GETFH
                    | op::SAVEFH
                    | op::RESTOREFH
                    | op::GETATTR
                    | op::ACCESS
                    | op::LOOKUP
                    | op::LOOKUPP
                    | op::RENEW
            )
        })
}

impl Program for NfsV3V4 {
    fn program(&self) -> u32 {
        nfs3::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (nfs3::VERSION, VERSION4)
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        if call.header.vers != VERSION4 {
            return self.v3.call(call);
        }
        let server = self.v4.clone();
        Box::pin(async move {
            match call.header.proc_ {
                proc4::NULL => {
                    if !call.args.is_empty() {
                        return Outcome::GarbageArgs;
                    }
                    Outcome::Success(call.reply_encoder().finish())
                }
                proc4::COMPOUND => {
                    // AUTH_SYS and AUTH_NONE only (RFC 8881 §2.2.1.1: RPCSEC_GSS is not
                    // offered; SECINFO names these two).
                    if !matches!(call.credential, Credential::Sys(_) | Credential::None) {
                        return Outcome::AuthError(AuthStat::TooWeak);
                    }
                    let conn = conn_id(&call);
                    self.v4.note_connection(
                        conn,
                        call.context.back.as_ref(),
                        call.context.transport,
                    );
                    let mut enc = call.reply_encoder();
                    let inline = runs_inline(&call.args);
                    let run = move || {
                        let req = Request {
                            args: &call.args,
                            cred: &call.credential,
                            peer: call.context.peer,
                            conn,
                        };
                        server.compound(&req)
                    };
                    let r = if inline {
                        Ok(run())
                    } else {
                        tokio::task::spawn_blocking(run).await
                    };
                    // Callbacks this COMPOUND made due (a back channel probe, a lock waiter
                    // to notify) go now.
                    self.v4.run_callbacks();
                    match r {
                        Ok(Ok(reply)) => {
                            reply.encode(&mut enc);
                            Outcome::Success(enc.finish())
                        }
                        Ok(Err(_)) => Outcome::GarbageArgs,
                        Err(_) => Outcome::SystemErr,
                    }
                }
                _ => Outcome::ProcUnavail,
            }
        })
    }
}
