//! Opens, I/O and locks: OPEN (RFC 8881 §18.16), CLOSE (§18.2), OPEN_DOWNGRADE (§18.18),
//! READ (§18.22), WRITE (§18.32), COMMIT (§18.3), LOCK (§18.10), LOCKT (§18.11), LOCKU
//! (§18.12), and NFSv4.2's SEEK, ALLOCATE and DEALLOCATE (RFC 7862 §15.11, §15.1, §15.4).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::super::args::{CreateHow, Locker, OpArgs, OpenArgs, OpenClaim};
use super::super::attrs::{self, SetAttrs};
use super::super::consts::{attr, content, deleg, lock_type, op, open_result, share, stable};
use super::super::res::{OpRes, OpenOk};
use super::super::state::LockError;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Bitmap4, ChangeInfo4};
use super::Nfs4Server;
use super::compound::Ctx;
use super::fh::{Cur, Obj, check_component};
use super::files::{cinfo, sattr3};
use crate::fsops::v4_status;
use crate::nfs3::{CreateHow3, StableHow};
use crate::vfs::{is_dir, is_lnk, is_reg};

/// `OPEN4_SHARE_ACCESS_WANT_NO_DELEG` and `..._WANT_CANCEL` (RFC 8881 §18.16.3): the
/// delegation wishes that mean "none".
const WANT_NO_DELEG: u32 = 0x0400;
const WANT_CANCEL: u32 = 0x0500;

/// An object for a stateful operation: a regular file (ISDIR for a directory, SYMLINK for a
/// symbolic link, INVAL for other types).
fn regular(o: Obj) -> Res4<Obj> {
    if is_dir(&o.node.st) {
        return Err(Nfsstat4::ISDIR);
    }
    if is_lnk(&o.node.st) {
        return Err(Nfsstat4::SYMLINK);
    }
    if !is_reg(&o.node.st) {
        return Err(Nfsstat4::INVAL);
    }
    Ok(o)
}

impl Nfs4Server {
    /// The current filehandle as a regular file.
    fn cur_file(&self, ctx: &Ctx<'_>) -> Res4<Obj> {
        regular(self.current_obj(ctx, Nfsstat4::ISDIR)?)
    }

    pub(super) fn io_op(&self, ctx: &mut Ctx<'_>, a: OpArgs) -> Res4<OpRes> {
        match a {
            OpArgs::Open(o) => self.open(ctx, *o),
            OpArgs::Close { stateid, .. } => {
                let c = ctx.client()?;
                let sid = ctx.stateid(&stateid)?;
                let key = self.current_key(ctx, Nfsstat4::BAD_STATEID)?;
                let r = self.state().close(c, &sid, key)?;
                ctx.cur_sid = Some(r);
                Ok(OpRes::Close(r))
            }
            OpArgs::OpenDowngrade {
                stateid,
                share_access,
                share_deny,
                ..
            } => {
                let c = ctx.client()?;
                let sid = ctx.stateid(&stateid)?;
                let o = self.current_obj(ctx, Nfsstat4::BAD_STATEID)?;
                let r = self.state().open_downgrade(
                    c,
                    &sid,
                    o.key(),
                    share_access & share::ACCESS_BOTH,
                    share_deny,
                )?;
                ctx.cur_sid = Some(r);
                Ok(OpRes::OpenDowngrade(r))
            }
            OpArgs::Read {
                stateid,
                offset,
                count,
            } => {
                let o = self.cur_file(ctx)?;
                let sid = ctx.stateid(&stateid)?;
                // The reply must fit ca_maxresponsesize: a READ may return less than asked
                // (RFC 8881 §18.22.3), never an oversized reply.
                let room = ctx.room.saturating_sub(8 + 4 + 4 + 4) as u64;
                let count = u64::from(count.min(self.cfg.max_io)).min(room) as u32;
                {
                    let st = self.state();
                    st.check_io(ctx.clientid, &sid, o.key(), false)?;
                    if count > 0 {
                        st.check_io_locks(
                            ctx.clientid,
                            &sid,
                            o.key(),
                            offset,
                            u64::from(count),
                            false,
                        )?;
                    }
                }
                let r = o
                    .fs()
                    .read(&o.cred, &o.node, offset, count, &self.read_bufs)
                    .map_err(v4_status)?;
                Ok(OpRes::Read {
                    eof: r.eof,
                    data: r.data,
                })
            }
            OpArgs::Write {
                stateid,
                offset,
                stable: how,
                data,
            } => {
                let o = self.cur_file(ctx)?;
                let sid = ctx.stateid(&stateid)?;
                let how = match how {
                    stable::UNSTABLE4 => StableHow::Unstable,
                    stable::DATA_SYNC4 => StableHow::DataSync,
                    stable::FILE_SYNC4 => StableHow::FileSync,
                    _ => return Err(Nfsstat4::INVAL),
                };
                if offset.checked_add(data.len() as u64).is_none() {
                    return Err(Nfsstat4::FBIG);
                }
                {
                    let st = self.state();
                    st.check_io(ctx.clientid, &sid, o.key(), true)?;
                    if !data.is_empty() {
                        st.check_io_locks(
                            ctx.clientid,
                            &sid,
                            o.key(),
                            offset,
                            data.len() as u64,
                            true,
                        )?;
                    }
                }
                let count = o
                    .fs()
                    .write(&o.cred, &o.node, offset, &data, how)
                    .map_err(v4_status)?;
                Ok(OpRes::Write {
                    count,
                    committed: how as u32,
                    verf: self.write_verf,
                })
            }
            OpArgs::Commit { .. } => {
                let o = self.current_obj(ctx, Nfsstat4::ISDIR)?;
                o.fs().commit(&o.node).map_err(v4_status)?;
                Ok(OpRes::Commit(self.write_verf))
            }
            OpArgs::Lock {
                locktype,
                reclaim,
                offset,
                length,
                locker,
            } => {
                let c = ctx.client()?;
                let o = self.cur_file(ctx)?;
                let locker = match locker {
                    Locker::New {
                        open_seqid,
                        open_stateid,
                        lock_seqid,
                        owner,
                    } => Locker::New {
                        open_seqid,
                        open_stateid: ctx.stateid(&open_stateid)?,
                        lock_seqid,
                        owner,
                    },
                    Locker::Existing {
                        lock_stateid,
                        lock_seqid,
                    } => Locker::Existing {
                        lock_stateid: ctx.stateid(&lock_stateid)?,
                        lock_seqid,
                    },
                };
                let mut st = self.state();
                let r = st.lock(
                    c,
                    locktype,
                    reclaim,
                    offset,
                    length,
                    &locker,
                    o.key(),
                    ctx.now,
                );
                match r {
                    Ok(sid) => {
                        ctx.cur_sid = Some(sid);
                        Ok(OpRes::Lock(sid))
                    }
                    Err(LockError::Denied(d)) => {
                        // A blocking lock (READW_LT, WRITEW_LT) the client may wait for: it
                        // hears by CB_NOTIFY_LOCK when it could be granted (RFC 8881
                        // §20.11.4; OPEN said OPEN4_RESULT_MAY_NOTIFY_LOCK).
                        if matches!(locktype, lock_type::READW_LT | lock_type::WRITEW_LT)
                            && let Some(cur) = ctx.cur.as_ref()
                        {
                            st.lock_waits(
                                c,
                                &locker,
                                o.key(),
                                Self::fh4(cur),
                                locktype,
                                offset,
                                length,
                                ctx.now,
                            );
                        }
                        Ok(OpRes::Denied(op::LOCK, d))
                    }
                    Err(LockError::Status(s)) => Err(s),
                }
            }
            OpArgs::Lockt {
                locktype,
                offset,
                length,
                owner,
            } => {
                let c = ctx.client()?;
                let o = self.cur_file(ctx)?;
                match self
                    .state()
                    .lockt(c, locktype, offset, length, &owner, o.key(), ctx.now)
                {
                    Ok(()) => Ok(OpRes::Status(op::LOCKT, Nfsstat4::OK)),
                    Err(LockError::Denied(d)) => Ok(OpRes::Denied(op::LOCKT, d)),
                    Err(LockError::Status(s)) => Err(s),
                }
            }
            OpArgs::Locku {
                locktype,
                stateid,
                offset,
                length,
                ..
            } => {
                let c = ctx.client()?;
                let o = self.cur_file(ctx)?;
                let sid = ctx.stateid(&stateid)?;
                let mut st = self.state();
                let r = st.locku(c, locktype, &sid, offset, length, o.key())?;
                // Owners that waited for this range may lock it now (CB_NOTIFY_LOCK).
                st.locks_released(o.key());
                drop(st);
                ctx.cur_sid = Some(r);
                Ok(OpRes::Locku(r))
            }
            OpArgs::Seek {
                stateid,
                offset,
                what,
            } => {
                let o = self.cur_file(ctx)?;
                let sid = ctx.stateid(&stateid)?;
                let data = match what {
                    content::DATA => true,
                    content::HOLE => false,
                    _ => return Err(Nfsstat4::UNION_NOTSUPP),
                };
                self.state().check_io(ctx.clientid, &sid, o.key(), false)?;
                let pos = o
                    .fs()
                    .seek(&o.cred, &o.node, offset, data)
                    .map_err(v4_status)?;
                let size =
                    o.x.server
                        .export()
                        .stat_rel(&o.node.rel)
                        .map_or(o.node.st.stx_size, |s| s.stx_size);
                Ok(OpRes::Seek {
                    eof: pos >= size,
                    offset: pos,
                })
            }
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
                let punch = matches!(a, OpArgs::Deallocate { .. });
                let o = self.cur_file(ctx)?;
                let sid = ctx.stateid(&stateid)?;
                if length == 0 || offset.checked_add(length).is_none() {
                    return Err(Nfsstat4::INVAL);
                }
                self.state().check_io(ctx.clientid, &sid, o.key(), true)?;
                o.fs()
                    .allocate(&o.cred, &o.node, offset, length, punch)
                    .map_err(v4_status)?;
                Ok(OpRes::Status(a_opnum(punch), Nfsstat4::OK))
            }
            _ => Err(Nfsstat4::SERVERFAULT),
        }
    }

    /// OPEN (RFC 8881 §18.16): CLAIM_NULL (with or without create), CLAIM_FH and
    /// CLAIM_PREVIOUS; the delegation claims name delegations this server never grants.
    fn open(&self, ctx: &mut Ctx<'_>, a: OpenArgs) -> Res4<OpRes> {
        let c = ctx.client()?;
        let access = a.share_access & share::ACCESS_BOTH;
        let want = a.share_access & share::WANT_DELEG_MASK;
        if access == 0 || a.share_deny & !share::DENY_BOTH != 0 {
            return Err(Nfsstat4::INVAL);
        }
        let read = access & share::ACCESS_READ != 0;
        let write = access & share::ACCESS_WRITE != 0;
        let mut attrset = Bitmap4::default();
        let mut ci = ChangeInfo4 {
            atomic: false,
            before: 0,
            after: 0,
        };
        let file = match &a.claim {
            OpenClaim::Null(name) => {
                self.state().check_grace(c, false, ctx.now)?;
                let dir = match self.current_dir(ctx)? {
                    Cur::Real(o) => *o,
                    Cur::Pseudo(_) if a.create.is_some() => return Err(Nfsstat4::ROFS),
                    Cur::Pseudo(_) => return Err(Nfsstat4::ISDIR),
                };
                let n = check_component(name)?;
                let file = match &a.create {
                    None => {
                        let node = dir
                            .fs()
                            .lookup(&dir.cred, &dir.node, n)
                            .map_err(v4_status)?;
                        let f = regular(dir.sibling(node))?;
                        f.fs()
                            .may_open(&f.cred, &f.node, read, write)
                            .map_err(v4_status)?;
                        f
                    }
                    Some(how) => {
                        let (how3, extra, set) = create_how(how)?;
                        // A share conflict is found before the file changes (UNCHECKED4 with
                        // a size truncates an existing file).
                        if let Ok(existing) = dir.fs().child(&dir.node, n) {
                            let key = dir.sibling(existing).key();
                            self.state().check_share(
                                c,
                                a.owner.owner.as_bytes(),
                                key,
                                access,
                                a.share_deny,
                            )?;
                        }
                        let made = dir
                            .fs()
                            .create_file(&dir.cred, &dir.node, n, &how3)
                            .map_err(v4_status)?;
                        let node = crate::vfs::Node {
                            rel: dir.node.rel.join(OsStr::from_bytes(n)),
                            st: made.st,
                        };
                        let f = regular(dir.sibling(node))?;
                        if made.created {
                            if let Some(s) = extra.filter(|s| !s.is_empty()) {
                                f.fs()
                                    .setattr(&f.cred, &f.node, &sattr3(&s)?, None)
                                    .map_err(v4_status)?;
                            }
                            attrset = set;
                        } else {
                            f.fs()
                                .may_open(&f.cred, &f.node, read, write)
                                .map_err(v4_status)?;
                        }
                        f
                    }
                };
                let after = dir
                    .x
                    .server
                    .export()
                    .stat_rel(&dir.node.rel)
                    .unwrap_or(dir.node.st);
                ci = cinfo(&dir.node.st, &after);
                file
            }
            OpenClaim::Fh => {
                self.state().check_grace(c, false, ctx.now)?;
                let f = self.cur_file(ctx)?;
                f.fs()
                    .may_open(&f.cred, &f.node, read, write)
                    .map_err(v4_status)?;
                f
            }
            OpenClaim::Previous(dtype) => {
                // RFC 8881 §18.16.3, §9.11: a reclaim of an open held before the restart.
                self.state().check_grace(c, true, ctx.now)?;
                if *dtype != deleg::NONE {
                    return Err(Nfsstat4::RECLAIM_BAD);
                }
                self.cur_file(ctx)?
            }
            OpenClaim::DelegateCur { .. } | OpenClaim::DelegCurFh(_) => {
                return Err(Nfsstat4::BAD_STATEID);
            }
            OpenClaim::DelegatePrev(_) | OpenClaim::DelegPrevFh => {
                return Err(Nfsstat4::RECLAIM_BAD);
            }
        };
        let r = self.state().open(
            c,
            a.owner.owner.as_bytes(),
            file.key(),
            access,
            a.share_deny,
        )?;
        let no_deleg_why = match want {
            0 => None,
            WANT_NO_DELEG | WANT_CANCEL => Some(deleg::WND4_NOT_WANTED),
            _ => Some(deleg::WND4_RESOURCE),
        };
        ctx.set_fh(file.cur());
        ctx.cur_sid = Some(r.stateid);
        attrset.trim();
        Ok(OpRes::Open(Box::new(OpenOk {
            stateid: r.stateid,
            cinfo: ci,
            // RFC 8881 §18.16.3: MAY_NOTIFY_LOCK: blocked lock waiters get CB_NOTIFY_LOCK.
            // NFSv4.0 has neither the flag (RFC 7530 §16.16.5) nor a callback to keep it.
            rflags: if ctx.minor == 0 {
                open_result::LOCKTYPE_POSIX
            } else {
                open_result::LOCKTYPE_POSIX | open_result::MAY_NOTIFY_LOCK
            },
            attrset,
            no_deleg_why,
        })))
    }
}

fn a_opnum(punch: bool) -> u32 {
    if punch { op::DEALLOCATE } else { op::ALLOCATE }
}

/// `createhow4` as the shared CREATE modes, the attributes to set after an exclusive create,
/// and the `attrset` to report. EXCLUSIVE4 is served like EXCLUSIVE4_1 without attributes
/// (NFS4ERR_INVAL is not an answer a 4.1 server may give, RFC 8881 §18.16.3); the verifier
/// lives in the access and modify times, which `attrset` reports so the client sets them
/// afterwards; those times cannot come with EXCLUSIVE4_1 (`suppattr_exclcreat`).
fn create_how(how: &CreateHow) -> Res4<(CreateHow3, Option<SetAttrs>, Bitmap4)> {
    let verf_times = Bitmap4::from_bits(&[attr::TIME_ACCESS_SET, attr::TIME_MODIFY_SET]);
    Ok(match how {
        CreateHow::Unchecked(f) => {
            let s = attrs::decode_set(f)?;
            (CreateHow3::Unchecked(sattr3(&s)?), None, s.mask())
        }
        CreateHow::Guarded(f) => {
            let s = attrs::decode_set(f)?;
            (CreateHow3::Guarded(sattr3(&s)?), None, s.mask())
        }
        CreateHow::Exclusive(v) => (CreateHow3::Exclusive(*v), None, verf_times),
        CreateHow::Exclusive41(v, f) => {
            let s = attrs::decode_set(f)?;
            if s.atime.is_some() || s.mtime.is_some() {
                return Err(Nfsstat4::INVAL);
            }
            let mut set = s.mask();
            for b in verf_times.iter() {
                set.set(b);
            }
            (CreateHow3::Exclusive(*v), Some(s), set)
        }
    })
}
