//! Opens: share reservations and open stateids (RFC 8881 §9.7, §18.16, §18.2, §18.18), the
//! stateid checks of READ, WRITE and SETATTR (§8.2.4, §9.1.2), TEST_STATEID and FREE_STATEID
//! (§18.48, §18.38).

use super::super::consts::share;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::Stateid4;
use super::{FileKey, State, StateEntry, StateKind};

/// What OPEN got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenResult {
    pub stateid: Stateid4,
}

impl State {
    /// Whether a new share (`access`, `deny`) of `owner` conflicts with the opens other owners
    /// hold on `file` (RFC 8881 §9.7: access against deny, both ways).
    fn share_conflict(
        &self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> bool {
        self.states.values().any(|e| {
            e.kind == StateKind::Open
                && e.file == file
                && !(e.clientid == clientid && e.owner == owner)
                && (e.deny & access != 0 || e.access & deny != 0)
        })
    }

    /// Whether an OPEN of `file` with this share would be refused (NFS4ERR_SHARE_DENIED),
    /// checked before OPEN changes the file (UNCHECKED4 with a size truncates it).
    pub fn check_share(
        &self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> Res4<()> {
        if self.share_conflict(clientid, owner, file, access & share::ACCESS_BOTH, deny) {
            Err(Nfsstat4::SHARE_DENIED)
        } else {
            Ok(())
        }
    }

    /// OPEN's state part: a new open stateid for (`owner`, `file`), or the existing one with
    /// its access and deny widened and its seqid bumped (RFC 8881 §9.11, §18.16.3).
    pub fn open(
        &mut self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> Res4<OpenResult> {
        let access = access & share::ACCESS_BOTH;
        if access == 0 || deny & !share::DENY_BOTH != 0 {
            return Err(Nfsstat4::INVAL);
        }
        if !self.clients.contains_key(&clientid) {
            return Err(Nfsstat4::STALE_CLIENTID);
        }
        if self.share_conflict(clientid, owner, file, access, deny) {
            return Err(Nfsstat4::SHARE_DENIED);
        }
        let existing = self
            .states
            .iter_mut()
            .find(|(_, e)| {
                e.kind == StateKind::Open
                    && e.clientid == clientid
                    && e.file == file
                    && e.owner == owner
            })
            .map(|(o, e)| (*o, e));
        if let Some((other, e)) = existing {
            e.access |= access;
            e.deny |= deny;
            e.seqid = e.seqid.wrapping_add(1).max(1);
            return Ok(OpenResult {
                stateid: Stateid4 {
                    seqid: e.seqid,
                    other,
                },
            });
        }
        if self.stateids_of(clientid) >= self.cfg.max_stateids_per_client {
            return Err(Nfsstat4::RESOURCE);
        }
        let other = self.fresh_other();
        let e = StateEntry {
            kind: StateKind::Open,
            clientid,
            file,
            seqid: 1,
            owner: owner.to_vec(),
            access,
            deny,
            open_other: None,
        };
        let sid = State::stateid_of(other, &e);
        self.states.insert(other, e);
        Ok(OpenResult { stateid: sid })
    }

    /// CLOSE (RFC 8881 §18.2): refused while the owner's lock stateids on the file hold locks
    /// (NFS4ERR_LOCKS_HELD); otherwise the open and its lock stateids go.
    pub fn close(&mut self, clientid: u64, sid: &Stateid4, file: FileKey) -> Res4<Stateid4> {
        let e = self.lookup(clientid, sid)?;
        if e.kind != StateKind::Open {
            return Err(Nfsstat4::BAD_STATEID);
        }
        if e.file != file {
            return Err(Nfsstat4::BAD_STATEID);
        }
        let lock_others: Vec<[u8; 12]> = self
            .states
            .iter()
            .filter(|(_, l)| l.open_other == Some(sid.other))
            .map(|(o, _)| *o)
            .collect();
        if lock_others.iter().any(|o| self.locks.holds(o)) {
            return Err(Nfsstat4::LOCKS_HELD);
        }
        for o in lock_others {
            self.states.remove(&o);
        }
        let e = self
            .states
            .remove(&sid.other)
            .ok_or(Nfsstat4::BAD_STATEID)?;
        // §18.2.3: the returned stateid is meaningless; RFC 8881 suggests the invalid one.
        let _ = e;
        Ok(Stateid4 {
            seqid: u32::MAX,
            other: [0; 12],
        })
    }

    /// OPEN_DOWNGRADE (RFC 8881 §18.18): the new access and deny must be subsets of what the
    /// open holds.
    pub fn open_downgrade(
        &mut self,
        clientid: u64,
        sid: &Stateid4,
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> Res4<Stateid4> {
        let e = self.lookup(clientid, sid)?;
        if e.kind != StateKind::Open || e.file != file {
            return Err(Nfsstat4::BAD_STATEID);
        }
        let access = access & share::ACCESS_BOTH;
        if access == 0 || access & !e.access != 0 || deny & !e.deny != 0 {
            return Err(Nfsstat4::INVAL);
        }
        let e = self
            .states
            .get_mut(&sid.other)
            .ok_or(Nfsstat4::BAD_STATEID)?;
        e.access = access;
        e.deny = deny;
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: sid.other,
        })
    }

    /// The stateid check of READ (`write` false), WRITE and SETATTR of size (`write` true)
    /// (RFC 8881 §8.2.3, §9.1.2): special stateids are checked against the deny modes of other
    /// opens; an open or lock stateid must belong to the file and carry the access.
    pub fn check_io(
        &self,
        clientid: Option<u64>,
        sid: &Stateid4,
        file: FileKey,
        write: bool,
    ) -> Res4<()> {
        let need = if write {
            share::ACCESS_WRITE
        } else {
            share::ACCESS_READ
        };
        if *sid == Stateid4::ANONYMOUS || *sid == Stateid4::BYPASS {
            // Anonymous I/O respects share reservations (the READ bypass stateid too, for
            // writes; READs with it bypass deny modes, §8.2.3).
            if *sid == Stateid4::BYPASS && !write {
                return Ok(());
            }
            let denied = self
                .states
                .values()
                .any(|e| e.kind == StateKind::Open && e.file == file && e.deny & need != 0);
            return if denied {
                Err(Nfsstat4::LOCKED)
            } else {
                Ok(())
            };
        }
        let clientid = clientid.ok_or(Nfsstat4::BAD_STATEID)?;
        let e = self.lookup(clientid, sid)?;
        if e.file != file {
            return Err(Nfsstat4::BAD_STATEID);
        }
        let open = match e.kind {
            StateKind::Open => e,
            StateKind::Lock => e
                .open_other
                .and_then(|o| self.states.get(&o))
                .ok_or(Nfsstat4::BAD_STATEID)?,
        };
        if open.access & need == 0 {
            return Err(Nfsstat4::OPENMODE);
        }
        Ok(())
    }

    /// The byte-range check of READ and WRITE against other owners' locks (mandatory for
    /// NFSv4 I/O with a stateid, RFC 8881 §9.1.5: nfsd enforces it too).
    pub fn check_io_locks(
        &self,
        clientid: Option<u64>,
        sid: &Stateid4,
        file: FileKey,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Res4<()> {
        let owner = clientid.and_then(|c| {
            self.lookup(c, sid)
                .ok()
                .filter(|e| e.kind == StateKind::Lock)
                .map(|e| (e.clientid, e.owner.clone()))
        });
        if self
            .locks
            .io_conflict(file, owner.as_ref(), offset, len, write)
        {
            return Err(Nfsstat4::LOCKED);
        }
        Ok(())
    }

    /// TEST_STATEID (RFC 8881 §18.48): one status per stateid.
    pub fn test_stateids(&self, clientid: u64, sids: &[Stateid4]) -> Vec<Nfsstat4> {
        sids.iter()
            .map(|s| {
                if s.is_special() {
                    Nfsstat4::BAD_STATEID
                } else {
                    self.lookup(clientid, s)
                        .map_or_else(|e| e, |_| Nfsstat4::OK)
                }
            })
            .collect()
    }

    /// FREE_STATEID (RFC 8881 §18.38): only a lock stateid that holds no locks can be freed;
    /// an open stateid still holds its open (NFS4ERR_LOCKS_HELD).
    pub fn free_stateid(&mut self, clientid: u64, sid: &Stateid4) -> Res4<()> {
        let e = self.lookup(clientid, sid)?;
        if e.kind == StateKind::Open || self.locks.holds(&sid.other) {
            return Err(Nfsstat4::LOCKS_HELD);
        }
        self.states.remove(&sid.other);
        Ok(())
    }

    /// The opens on `file` (for REMOVE of an open file and for tests).
    pub fn opens_on(&self, file: FileKey) -> usize {
        self.states
            .values()
            .filter(|e| e.kind == StateKind::Open && e.file == file)
            .count()
    }
}
