//! The NFS program: argument decoding, credentials, and the [`Program`] that runs each call on
//! tokio's blocking pool (or inline when it is cheap).

use std::sync::Arc;

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Credential, Outcome, Program};
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use super::{INLINE_READ_ALONE_MAX, INLINE_READ_MAX, NfsServer};
use crate::drc::{Admit, Key, is_cached_proc};
use crate::nfs3::*;
use crate::vfs::Cred;

/// Decoded NFSv3 arguments of one procedure.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Args {
    Null,
    Getattr(GetattrArgs),
    Setattr(SetattrArgs),
    Lookup(LookupArgs),
    Access(AccessArgs),
    Readlink(ReadlinkArgs),
    Read(ReadArgs),
    Write(WriteArgs),
    Create(CreateArgs),
    Mkdir(MkdirArgs),
    Symlink(SymlinkArgs),
    Mknod(MknodArgs),
    Remove(RemoveArgs),
    Rmdir(RemoveArgs),
    Rename(RenameArgs),
    Link(LinkArgs),
    Readdir(ReaddirArgs),
    Readdirplus(ReaddirplusArgs),
    Fsstat(FsArgs),
    Fsinfo(FsArgs),
    Pathconf(FsArgs),
    Commit(CommitArgs),
}

/// Why arguments could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// No such procedure (PROC_UNAVAIL).
    #[error("no such NFSv3 procedure {0}")]
    NoProc(u32),
    /// The arguments do not decode exactly (GARBAGE_ARGS).
    #[error("NFSv3 arguments do not decode: {0}")]
    Garbage(#[from] xdr::XdrError),
}

impl Args {
    /// Decode the arguments of procedure `proc_`; the whole buffer must be consumed.
    pub fn decode(proc_: u32, args: &Bytes) -> Result<Self, ArgsError> {
        let mut d = Decoder::from_bytes(args);
        let dec = &mut d;
        let a = match proc_ {
            proc_::NULL => Args::Null,
            proc_::GETATTR => Args::Getattr(XdrDecode::decode(dec)?),
            proc_::SETATTR => Args::Setattr(XdrDecode::decode(dec)?),
            proc_::LOOKUP => Args::Lookup(XdrDecode::decode(dec)?),
            proc_::ACCESS => Args::Access(XdrDecode::decode(dec)?),
            proc_::READLINK => Args::Readlink(XdrDecode::decode(dec)?),
            proc_::READ => Args::Read(XdrDecode::decode(dec)?),
            proc_::WRITE => Args::Write(XdrDecode::decode(dec)?),
            proc_::CREATE => Args::Create(XdrDecode::decode(dec)?),
            proc_::MKDIR => Args::Mkdir(XdrDecode::decode(dec)?),
            proc_::SYMLINK => Args::Symlink(XdrDecode::decode(dec)?),
            proc_::MKNOD => Args::Mknod(XdrDecode::decode(dec)?),
            proc_::REMOVE => Args::Remove(XdrDecode::decode(dec)?),
            proc_::RMDIR => Args::Rmdir(XdrDecode::decode(dec)?),
            proc_::RENAME => Args::Rename(XdrDecode::decode(dec)?),
            proc_::LINK => Args::Link(XdrDecode::decode(dec)?),
            proc_::READDIR => Args::Readdir(XdrDecode::decode(dec)?),
            proc_::READDIRPLUS => Args::Readdirplus(XdrDecode::decode(dec)?),
            proc_::FSSTAT => Args::Fsstat(XdrDecode::decode(dec)?),
            proc_::FSINFO => Args::Fsinfo(XdrDecode::decode(dec)?),
            proc_::PATHCONF => Args::Pathconf(XdrDecode::decode(dec)?),
            proc_::COMMIT => Args::Commit(XdrDecode::decode(dec)?),
            p => return Err(ArgsError::NoProc(p)),
        };
        d.finish()?;
        Ok(a)
    }
}

/// The caller's identity: AUTH_SYS as sent, AUTH_NONE as nobody; other flavors are refused.
pub fn cred_of(c: &Credential) -> Result<Cred, AuthStat> {
    match c {
        Credential::Sys(s) => Ok(Cred {
            uid: s.uid,
            gid: s.gid,
            gids: s.gids.clone(),
        }),
        Credential::None => Ok(Cred::nobody()),
        _ => Err(AuthStat::TooWeak),
    }
}

/// Procedures answered on the calling task instead of a blocking thread: attribute reads, a
/// `statx` or two of an object found through its handle, LOOKUP (a `statx` of a name in a
/// directory), READLINK, and the namespace changes, each one or two system calls on a name in
/// a directory (create, mkdir, symlink, unlink, rmdir, rename, link) or on an inode's
/// attributes (a SETATTR that does not change the size). READ and WRITE are tried on the
/// calling task too, see `NfsProgram::call`. Handing a call to a blocking thread and back costs
/// two thread wake-ups, which dominated one-at-a-time calls on the project's VM (GETATTR ~9k
/// ops/s on either transport; issue 23's small-file workload: create and remove ×1.09-1.10 in
/// 8 alternating rounds, docs/performance.md). What reads whole directories (READDIR,
/// READDIRPLUS, FSSTAT), may wait for the disk (COMMIT of a file not in memory, a size change,
/// a READ past the page cache, a stable WRITE) or is rare (MKNOD) still goes to a blocking
/// thread.
fn runs_inline(a: &Args) -> bool {
    match a {
        Args::Getattr(_)
        | Args::Access(_)
        | Args::Lookup(_)
        | Args::Fsinfo(_)
        | Args::Pathconf(_) => true,
        Args::Create(_)
        | Args::Mkdir(_)
        | Args::Symlink(_)
        | Args::Remove(_)
        | Args::Rmdir(_)
        | Args::Rename(_)
        | Args::Link(_)
        | Args::Readlink(_) => true,
        Args::Setattr(s) => s.new_attributes.size.is_none(),
        _ => false,
    }
}

/// NFS (100003) version 3 as an RPC program.
#[derive(Debug, Clone)]
pub struct NfsProgram(pub Arc<NfsServer>);

impl Program for NfsProgram {
    fn program(&self) -> u32 {
        PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (VERSION, VERSION)
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let server = self.0.clone();
        Box::pin(async move {
            let cred = match cred_of(&call.credential) {
                Ok(c) => c,
                Err(stat) => return Outcome::AuthError(stat),
            };
            let args = match Args::decode(call.header.proc_, &call.args) {
                Ok(a) => a,
                Err(ArgsError::NoProc(_)) => return Outcome::ProcUnavail,
                Err(_) => return Outcome::GarbageArgs,
            };
            if matches!(args, Args::Null) {
                return Outcome::Success(call.reply_encoder().finish());
            }
            // The duplicate request cache (crate::drc): calls from the network of the
            // procedures it covers.
            let ticket = match (&server.drc, call.context.peer) {
                (Some(cache), Some(peer)) if is_cached_proc(call.header.proc_) => {
                    let h = &call.header;
                    let key = Key::new(peer.ip(), h.xid, h.prog, h.vers, h.proc_, &call.args);
                    match cache.admit(key).await {
                        Admit::Run(t) => t,
                        Admit::Drop => return Outcome::NoReply,
                        Admit::Replay(results) => {
                            let mut enc = call.reply_encoder();
                            enc.put_raw_bytes(results);
                            return Outcome::Success(enc.finish());
                        }
                    }
                }
                _ => None,
            };
            let alone = call.hints.alone;
            let mut enc = call.reply_encoder();
            // READ from the page cache and small UNSTABLE WRITEs into it, through the open-file
            // cache, finish on the calling task, as `runs_inline`'s procedures do, and so do
            // a lone call's WRITE to a file in memory (tmpfs), and a COMMIT of one; what would
            // wait for the disk goes to a blocking thread.
            let finished_here = |enc: &mut Encoder| match &args {
                Args::Read(a)
                    if a.count <= INLINE_READ_MAX
                        || (alone && a.count <= INLINE_READ_ALONE_MAX) =>
                {
                    server.read_nowait(&cred, a).map(|r| r.encode(enc))
                }
                Args::Write(a) => server.write_inline(&cred, a, alone).map(|r| r.encode(enc)),
                Args::Commit(a) => server.commit_inline(a).map(|r| r.encode(enc)),
                _ => None,
            };
            let e = if runs_inline(&args) {
                server.execute(&cred, args, &mut enc);
                enc.finish()
            } else if finished_here(&mut enc).is_some() {
                enc.finish()
            } else {
                let s = server.clone();
                let r = tokio::task::spawn_blocking(move || {
                    s.execute(&cred, args, &mut enc);
                    enc.finish()
                })
                .await;
                match r {
                    Ok(e) => e,
                    // Dropping the ticket forgets the call: a retransmission runs it.
                    Err(_) => return Outcome::SystemErr,
                }
            };
            if let Some(t) = ticket {
                // Kept with every item inline: a replay may go over another transport, whose
                // policy its own encoder applies (none of the cached procedures has a
                // DDP-eligible result, RFC 8267 §4.1).
                t.complete(e.unreduced());
            }
            Outcome::Success(e)
        })
    }
}

/// Used by tests and the fuzz target: run one NFSv3 procedure synchronously (no runtime).
pub fn call_sync(
    server: &NfsServer,
    cred: &Cred,
    proc_: u32,
    args: &Bytes,
) -> Result<Bytes, ArgsError> {
    let a = Args::decode(proc_, args)?;
    let mut enc = Encoder::new();
    server.execute(cred, a, &mut enc);
    Ok(enc.into_bytes())
}
