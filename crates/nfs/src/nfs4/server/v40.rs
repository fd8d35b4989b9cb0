//! NFSv4.0 (RFC 7530) on the shared executor: the COMPOUND loop of minor version 0 (no
//! SEQUENCE, no sessions), the operations only 4.0 has, and the seqid ordering of open- and
//! lock-owners with their one-reply cache (RFC 7530 §9.1.7).
//!
//! Every other operation runs through the 4.1 executor ([`Nfs4Server::execute`]) with the
//! client it belongs to, found from its arguments: the clientid of an open- or lock-owner, or
//! the client of a stateid (there is no session to name it). Naming a client renews its lease
//! (RFC 7530 §9.5).
//!
//! Callbacks: 4.0 calls back over a connection the server opens to the address SETCLIENTID
//! names (RFC 7530 §10.2). This server opens none: it grants no delegations (OPEN answers
//! OPEN_DELEGATE_NONE), so it never needs the callback path, and RENEW never answers
//! NFS4ERR_CB_PATH_DOWN, which RFC 7530 §16.28.4 reserves for a client that holds delegations
//! (the client would otherwise redo SETCLIENTID on every RENEW).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use xdr::Decoder;

use super::super::args::{CreateHow, Locker, OpArgs, OpenClaim};
use super::super::compound::CompoundReply;
use super::super::consts::{attr, op, open_result, share};
use super::super::res::OpRes;
use super::super::state::StateKind;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Bitmap4, Fattr4, Stateid4};
use super::super::v40::{Args40, Res40};
use super::compound::Ctx;
use super::fh::CurFh;
use super::session::principal;
use super::{Nfs4Server, Request};

/// Most owner records kept per client (open- and lock-owners): the same bound as its
/// stateids.
fn max_owners(s: &Nfs4Server) -> usize {
    s.cfg.state.max_stateids_per_client
}

/// An open- or lock-owner: the client, which kind, the opaque owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct OwnerKey {
    clientid: u64,
    lock: bool,
    owner: Vec<u8>,
}

/// The last seqid an owner used and the reply it got (RFC 7530 §9.1.7: "the server ... caches
/// the last response for each state-owner").
#[derive(Debug)]
struct OwnerSeq {
    seqid: u32,
    /// The result, and for OPEN the filehandle it made current (a replayed OPEN leaves the
    /// same current filehandle for the GETFH after it).
    last: Option<(OpRes, Option<CurFh>)>,
    /// Open-owners: whether OPEN_CONFIRM has been done (RFC 7530 §16.18.4).
    confirmed: bool,
    /// The stateid (`other`) the owner's last operation closed: a retransmitted CLOSE names a
    /// stateid that no longer exists and still gets its cached reply.
    closed: Option<[u8; 12]>,
}

/// The owner records of 4.0 clients.
#[derive(Debug, Default)]
pub(super) struct Owners40 {
    map: HashMap<OwnerKey, OwnerSeq>,
}

/// Errors after which the owner's seqid does not advance (RFC 7530 §9.1.7): the request
/// never reached the owner's state.
fn keeps_seqid(s: Nfsstat4) -> bool {
    matches!(
        s,
        Nfsstat4::STALE_CLIENTID
            | Nfsstat4::STALE_STATEID
            | Nfsstat4::BAD_STATEID
            | Nfsstat4::BAD_SEQID
            | Nfsstat4::BADXDR
            | Nfsstat4::RESOURCE
            | Nfsstat4::NOFILEHANDLE
            | Nfsstat4::MOVED
    )
}

/// What the seqid of a request means for its owner.
enum SeqCheck {
    /// The next seqid (or a new owner): execute.
    Next { new_owner: bool },
    /// The last seqid again: answer the cached reply.
    Replay(OpRes, Option<CurFh>),
}

impl Nfs4Server {
    fn owners40(&self) -> std::sync::MutexGuard<'_, Owners40> {
        self.owners40.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Execute one minor-version-0 COMPOUND (RFC 7530 §15.2): operations in order
    /// until one fails; no SEQUENCE (its number is not a 4.0 operation: NFS4ERR_OP_ILLEGAL).
    pub(super) fn compound40(
        &self,
        d: &mut Decoder<'_>,
        tag: Bytes,
        nops: u32,
        req: &Request<'_>,
    ) -> CompoundReply {
        let mut ctx = Ctx {
            req,
            now: Instant::now(),
            exports: self.table.snapshot(),
            clientid: None,
            cur: None,
            saved: None,
            cur_sid: None,
            saved_sid: None,
            room: usize::MAX,
            minor: 0,
        };
        // 4.0 negotiates no limit on operations: the same bound a 4.1 session's
        // ca_maxoperations gets; past it the COMPOUND is NFS4ERR_RESOURCE before any operation
        // runs (RFC 7530 §13.1: NFS4ERR_RESOURCE, "the server may exhaust available resources").
        if nops > self.cfg.state.max_ops {
            return CompoundReply {
                status: Nfsstat4::RESOURCE,
                tag,
                results: Vec::new(),
            };
        }
        let mut results: Vec<OpRes> = Vec::new();
        for _ in 0..nops {
            let Ok(opnum) = d.u32() else {
                results.push(OpRes::Status(op::ILLEGAL, Nfsstat4::BADXDR));
                break;
            };
            let res = match OpArgs::decode(opnum, 0, d) {
                Ok(a) => self.op40(&mut ctx, a),
                Err(_) => {
                    // RFC 7530 §15.2, §13.1: arguments that do not decode are
                    // NFS4ERR_BADXDR, and the COMPOUND stops there.
                    let n = if op::name(opnum) == "UNKNOWN" {
                        op::ILLEGAL
                    } else {
                        opnum
                    };
                    OpRes::error(n, Nfsstat4::BADXDR)
                }
            };
            let failed = !res.status().is_ok();
            results.push(res);
            if failed {
                break;
            }
        }
        CompoundReply {
            status: results.last().map_or(Nfsstat4::OK, OpRes::status),
            tag,
            results,
        }
    }

    /// One 4.0 operation.
    fn op40(&self, ctx: &mut Ctx<'_>, args: OpArgs) -> OpRes {
        let opnum = args.opnum();
        ctx.clientid = None;
        match self.op40_inner(ctx, args) {
            Ok(r) => r,
            Err(s) => OpRes::error(opnum, s),
        }
    }

    fn op40_inner(&self, ctx: &mut Ctx<'_>, args: OpArgs) -> Res4<OpRes> {
        match args {
            OpArgs::V40(Args40::OpenConfirm { stateid, seqid }) => {
                let (cid, key) = self.stateid_owner_key(ctx, &stateid, false)?;
                // RFC 7530 §16.18.4: an owner already confirmed has no open to confirm (a
                // retransmission, same seqid, still gets its cached reply).
                if self
                    .owners40()
                    .map
                    .get(&key)
                    .is_some_and(|r| r.confirmed && r.seqid != seqid)
                {
                    return Err(Nfsstat4::BAD_STATEID);
                }
                self.with_seqid(ctx, key, seqid, false, |s, ctx| {
                    let r = s
                        .current_key(ctx, Nfsstat4::BAD_STATEID)
                        .and_then(|f| s.state().open_confirm(cid, &stateid, f));
                    match r {
                        Ok(r) => {
                            ctx.cur_sid = Some(r);
                            OpRes::V40(Res40::OpenConfirm(r))
                        }
                        Err(e) => OpRes::Status(op::OPEN_CONFIRM, e),
                    }
                })
            }
            OpArgs::V40(a) => self.op40_only(ctx, a),
            OpArgs::Open(o) => {
                // The claims and the create mode 4.1 added are not in 4.0's XDR.
                if matches!(
                    o.claim,
                    OpenClaim::Fh | OpenClaim::DelegCurFh(_) | OpenClaim::DelegPrevFh
                ) || matches!(o.create, Some(CreateHow::Exclusive41(..)))
                {
                    return Err(Nfsstat4::BADXDR);
                }
                let cid = o.owner.clientid;
                self.renew(ctx, cid)?;
                let key = OwnerKey {
                    clientid: cid,
                    lock: false,
                    owner: o.owner.owner.as_bytes().to_vec(),
                };
                let seqid = o.seqid;
                // The share arguments are checked first (NFS4ERR_INVAL); with them valid and no
                // attributes to set, NFS4ERR_INVAL can only mean "not a regular file".
                let plain = o.create.is_none()
                    && o.share_access & share::ACCESS_BOTH != 0
                    && o.share_deny & !share::DENY_BOTH == 0;
                self.with_seqid(ctx, key, seqid, true, |s, ctx| {
                    match s.execute(ctx, OpArgs::Open(o)) {
                        OpRes::Open(mut ok) => {
                            // 4.0 has no OPEN_DELEGATE_NONE_EXT.
                            ok.no_deleg_why = None;
                            OpRes::Open(ok)
                        }
                        // RFC 7530 §16.16.4: an OPEN of anything but a regular file or a
                        // directory is NFS4ERR_SYMLINK in 4.0 (4.1 made it NFS4ERR_WRONG_TYPE
                        // for the other types).
                        OpRes::Status(n, Nfsstat4::INVAL) if plain => {
                            OpRes::Status(n, Nfsstat4::SYMLINK)
                        }
                        r => r,
                    }
                })
            }
            OpArgs::Close { seqid, stateid } => {
                self.by_open_owner(ctx, stateid, seqid, OpArgs::Close { seqid, stateid })
            }
            a @ OpArgs::OpenDowngrade { .. } => {
                let OpArgs::OpenDowngrade { stateid, seqid, .. } = a else {
                    return Err(Nfsstat4::SERVERFAULT);
                };
                self.by_open_owner(ctx, stateid, seqid, a)
            }
            OpArgs::Lock {
                locktype,
                reclaim,
                offset,
                length,
                locker,
            } => {
                let a = OpArgs::Lock {
                    locktype,
                    reclaim,
                    offset,
                    length,
                    locker: locker.clone(),
                };
                match locker {
                    Locker::New {
                        open_seqid,
                        open_stateid,
                        lock_seqid,
                        owner,
                    } => {
                        let (cid, okey) = self.stateid_owner_key(ctx, &open_stateid, false)?;
                        if owner.clientid != cid {
                            return Err(Nfsstat4::BAD_STATEID);
                        }
                        let lkey = OwnerKey {
                            clientid: cid,
                            lock: true,
                            owner: owner.owner.as_bytes().to_vec(),
                        };
                        let r = self
                            .with_seqid(ctx, okey, open_seqid, false, |s, ctx| s.execute(ctx, a))?;
                        // The lock-owner's sequence starts at the seqid it came with
                        // (RFC 7530 §16.10.4, §9.1.7).
                        if !keeps_seqid(r.status()) {
                            self.record(lkey, lock_seqid, &r, None, true);
                        }
                        Ok(r)
                    }
                    Locker::Existing {
                        lock_stateid,
                        lock_seqid,
                    } => {
                        let (_, key) = self.stateid_owner_key(ctx, &lock_stateid, true)?;
                        self.with_seqid(ctx, key, lock_seqid, false, |s, ctx| s.execute(ctx, a))
                    }
                }
            }
            a @ OpArgs::Locku { .. } => {
                let OpArgs::Locku { stateid, seqid, .. } = a else {
                    return Err(Nfsstat4::SERVERFAULT);
                };
                let (_, key) = self.stateid_owner_key(ctx, &stateid, true)?;
                self.with_seqid(ctx, key, seqid, false, |s, ctx| s.execute(ctx, a))
            }
            OpArgs::Lockt { ref owner, .. } => {
                self.renew(ctx, owner.clientid)?;
                Ok(self.execute(ctx, args))
            }
            OpArgs::Read { stateid, .. }
            | OpArgs::Write { stateid, .. }
            | OpArgs::Setattr { stateid, .. }
            | OpArgs::Delegreturn(stateid) => {
                // The special stateids (anonymous, READ bypass) name no client.
                if !stateid.is_special() {
                    let cid = self.state().stateid_client(&stateid)?;
                    self.renew(ctx, cid)?;
                }
                Ok(self.execute(ctx, args))
            }
            OpArgs::Getattr(mut mask) => {
                only_v40_attrs(&mut mask);
                let mut r = self.execute(ctx, OpArgs::Getattr(mask));
                if let OpRes::Getattr(f) = &mut r {
                    v40_supported_attrs(f);
                }
                Ok(r)
            }
            OpArgs::Readdir {
                cookie,
                verf,
                dircount,
                maxcount,
                mut attrs,
            } => {
                only_v40_attrs(&mut attrs);
                let mut r = self.execute(
                    ctx,
                    OpArgs::Readdir {
                        cookie,
                        verf,
                        dircount,
                        maxcount,
                        attrs,
                    },
                );
                if let OpRes::Readdir { entries, .. } = &mut r {
                    for e in entries {
                        v40_supported_attrs(&mut e.attrs);
                    }
                }
                Ok(r)
            }
            OpArgs::Verify(mut f) => {
                v41_supported_attrs(&mut f);
                Ok(self.execute(ctx, OpArgs::Verify(f)))
            }
            OpArgs::Nverify(mut f) => {
                v41_supported_attrs(&mut f);
                Ok(self.execute(ctx, OpArgs::Nverify(f)))
            }
            a => Ok(self.execute(ctx, a)),
        }
    }

    /// SETCLIENTID, SETCLIENTID_CONFIRM, RENEW, RELEASE_LOCKOWNER.
    fn op40_only(&self, ctx: &mut Ctx<'_>, a: Args40) -> Res4<OpRes> {
        let who = principal(ctx.req.cred);
        let now = ctx.now;
        match a {
            Args40::SetClientId { client, .. } => {
                match self
                    .state()
                    .setclientid(&client.id, client.verifier, who, now)
                {
                    Ok((clientid, confirm)) => {
                        Ok(OpRes::V40(Res40::SetClientId { clientid, confirm }))
                    }
                    Err(Nfsstat4::CLID_INUSE) => Ok(OpRes::V40(Res40::ClidInUse)),
                    Err(e) => Err(e),
                }
            }
            Args40::SetClientIdConfirm { clientid, verifier } => {
                self.state()
                    .setclientid_confirm(clientid, verifier, who, now)?;
                Ok(OpRes::Status(op::SETCLIENTID_CONFIRM, Nfsstat4::OK))
            }
            Args40::Renew(cid) => {
                self.renew(ctx, cid)?;
                Ok(OpRes::Status(op::RENEW, Nfsstat4::OK))
            }
            Args40::ReleaseLockowner(owner) => {
                let cid = owner.clientid;
                self.renew(ctx, cid)?;
                self.state()
                    .release_lockowner(cid, owner.owner.as_bytes())?;
                self.owners40().map.remove(&OwnerKey {
                    clientid: cid,
                    lock: true,
                    owner: owner.owner.as_bytes().to_vec(),
                });
                Ok(OpRes::Status(op::RELEASE_LOCKOWNER, Nfsstat4::OK))
            }
            Args40::OpenConfirm { .. } => Err(Nfsstat4::SERVERFAULT),
        }
    }

    /// Renew a client's lease and make it the client of the operation.
    fn renew(&self, ctx: &mut Ctx<'_>, clientid: u64) -> Res4<()> {
        self.state().renew40(clientid, ctx.now)?;
        ctx.clientid = Some(clientid);
        Ok(())
    }

    /// The owner of a stateid as a seqid key (an open-owner, or a lock-owner when `lock`),
    /// with its client's lease renewed.
    fn stateid_owner_key(
        &self,
        ctx: &mut Ctx<'_>,
        sid: &Stateid4,
        lock: bool,
    ) -> Res4<(u64, OwnerKey)> {
        let found = {
            let st = self.state();
            st.stateid_client(sid)
                .and_then(|_| st.stateid_owner(sid).ok_or(Nfsstat4::BAD_STATEID))
        };
        let (cid, owner, kind) = match found {
            Ok(f) => f,
            Err(Nfsstat4::BAD_STATEID) if !lock => {
                // A CLOSE retransmitted after its stateid went: its owner's cached reply.
                let t = self.owners40();
                let k = t
                    .map
                    .iter()
                    .find(|(k, r)| !k.lock && r.closed == Some(sid.other))
                    .map(|(k, _)| k.clone())
                    .ok_or(Nfsstat4::BAD_STATEID)?;
                (k.clientid, k.owner, StateKind::Open)
            }
            Err(e) => return Err(e),
        };
        if (kind == StateKind::Lock) != lock {
            return Err(Nfsstat4::BAD_STATEID);
        }
        self.renew(ctx, cid)?;
        Ok((
            cid,
            OwnerKey {
                clientid: cid,
                lock,
                owner,
            },
        ))
    }

    /// CLOSE and OPEN_DOWNGRADE: ordered by the open-owner of their stateid.
    fn by_open_owner(
        &self,
        ctx: &mut Ctx<'_>,
        stateid: Stateid4,
        seqid: u32,
        a: OpArgs,
    ) -> Res4<OpRes> {
        let (_, key) = self.stateid_owner_key(ctx, &stateid, false)?;
        let close = matches!(a, OpArgs::Close { .. });
        let r = self.with_seqid(ctx, key.clone(), seqid, false, |s, ctx| s.execute(ctx, a))?;
        if close
            && r.status().is_ok()
            && let Some(rec) = self.owners40().map.get_mut(&key)
        {
            rec.closed = Some(stateid.other);
        }
        Ok(r)
    }

    /// Check `seqid` against the owner's last one (RFC 7530 §9.1.7): the next one executes
    /// `f` and caches its reply; the last one again answers the cached reply; any other is
    /// NFS4ERR_BAD_SEQID. A new owner (`new_ok`, OPEN only) takes whatever seqid it starts
    /// with; an open-owner that never confirmed its first OPEN starts over (§16.18.4).
    fn with_seqid<F>(
        &self,
        ctx: &mut Ctx<'_>,
        key: OwnerKey,
        seqid: u32,
        new_ok: bool,
        f: F,
    ) -> Res4<OpRes>
    where
        F: FnOnce(&Self, &mut Ctx<'_>) -> OpRes,
    {
        let (check, was_confirmed) = {
            let t = self.owners40();
            let rec = t.map.get(&key);
            let was = rec.is_none_or(|r| r.confirmed);
            let c = match rec {
                // An OPEN of an open-owner that never confirmed starts it over, without a
                // replay check (as Linux nfsd does): clients such as libnfs send the same
                // seqid again after a failed first OPEN.
                Some(r) if new_ok && !r.confirmed => SeqCheck::Next { new_owner: true },
                Some(r) if r.seqid == seqid => match &r.last {
                    Some((res, fh)) => SeqCheck::Replay(res.clone(), fh.clone()),
                    None => return Err(Nfsstat4::BAD_SEQID),
                },
                Some(r) if seqid == r.seqid.wrapping_add(1) => SeqCheck::Next { new_owner: false },
                Some(_) => return Err(Nfsstat4::BAD_SEQID),
                None => SeqCheck::Next { new_owner: new_ok },
            };
            (c, was)
        };
        match check {
            SeqCheck::Replay(res, fh) => {
                if let Some(fh) = fh {
                    ctx.set_fh(fh);
                }
                if let OpRes::Open(o) = &res {
                    ctx.cur_sid = Some(o.stateid);
                }
                Ok(res)
            }
            SeqCheck::Next { new_owner } => {
                let mut r = f(self, ctx);
                let confirmed = match &mut r {
                    OpRes::Open(o) => {
                        if new_owner {
                            // RFC 7530 §16.18.4: the first OPEN of a new open-owner is
                            // confirmed by OPEN_CONFIRM before the owner's state counts.
                            o.rflags |= open_result::CONFIRM;
                        }
                        !new_owner
                    }
                    OpRes::V40(Res40::OpenConfirm(_)) => true,
                    // A new owner whose first OPEN failed is still unconfirmed: its next OPEN
                    // starts it over.
                    _ if new_owner => false,
                    _ => was_confirmed,
                };
                if !keeps_seqid(r.status()) {
                    let fh = match &r {
                        OpRes::Open(_) => ctx.cur.clone(),
                        _ => None,
                    };
                    self.record(key, seqid, &r, fh, confirmed);
                }
                Ok(r)
            }
        }
    }

    /// Remember an owner's seqid and reply (bounded per client: past the bound the oldest
    /// records of gone clients are dropped first, then the record is not kept, which only
    /// costs a retransmission its replay).
    fn record(&self, key: OwnerKey, seqid: u32, r: &OpRes, fh: Option<CurFh>, confirmed: bool) {
        let mut t = self.owners40();
        if !t.map.contains_key(&key) {
            let mine = t.map.keys().filter(|k| k.clientid == key.clientid).count();
            if mine >= max_owners(self) {
                return;
            }
            if t.map.len() % 256 == 255 {
                let st = self.state();
                t.map.retain(|k, _| st.client_exists(k.clientid));
            }
        }
        t.map.insert(
            key,
            OwnerSeq {
                seqid,
                last: Some((r.clone(), fh)),
                confirmed,
                closed: None,
            },
        );
    }
}

/// Attributes minor version 0 does not define (RFC 7530 §5 ends at `mounted_on_fileid`, 55):
/// a 4.0 client asking for one has asked for an unknown attribute, which is not returned.
fn only_v40_attrs(mask: &mut Bitmap4) {
    mask.clear(attr::SUPPATTR_EXCLCREAT);
    mask.trim();
}

/// The `supported_attrs` value of a 4.0 reply without the 4.1 attributes. It is attribute 0,
/// so when present its bitmap opens the values.
fn v40_supported_attrs(f: &mut Fattr4) {
    rewrite_supported(f, only_v40_attrs);
}

/// A 4.0 client's `supported_attrs` in VERIFY or NVERIFY, as the shared comparison sees the
/// server's own: with the 4.1 attribute the 4.0 view leaves out.
fn v41_supported_attrs(f: &mut Fattr4) {
    rewrite_supported(f, |m| m.set(attr::SUPPATTR_EXCLCREAT));
}

/// Rewrite the `supported_attrs` bitmap at the start of `f`'s values with `change`.
fn rewrite_supported(f: &mut Fattr4, change: impl FnOnce(&mut Bitmap4)) {
    if !f.mask.get(attr::SUPPORTED_ATTRS) {
        return;
    }
    let mut d = xdr::Decoder::from_bytes(&f.vals);
    let Ok(mut sup) = <Bitmap4 as xdr::XdrDecode>::decode(&mut d) else {
        return;
    };
    let rest = f.vals.slice(f.vals.len() - d.remaining()..);
    change(&mut sup);
    let mut e = xdr::Encoder::new();
    xdr::XdrEncode::encode(&sup, &mut e);
    let mut vals = e.into_bytes().to_vec();
    vals.extend_from_slice(&rest);
    f.vals = Bytes::from(vals);
}
