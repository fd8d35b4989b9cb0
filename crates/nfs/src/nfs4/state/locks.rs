//! Byte-range locks (RFC 8881 §9, §18.10-§18.12): POSIX-style ranges per lock owner, with
//! upgrades, downgrades, splitting on unlock, and conflicts between lock owners.

use std::collections::HashMap;
use std::time::Instant;

use super::super::args::Locker;
use super::super::consts::{lock_type, share};
use super::super::res::LockDenied;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Opaque1024, StateOwner4, Stateid4};
use super::{FileKey, State, StateEntry, StateKind};

/// Read (shared) or write (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockType {
    Read,
    Write,
}

impl LockType {
    /// From `nfs_lock_type4` (the blocking variants lock the same way: clients poll).
    pub fn from_wire(t: u32) -> Res4<Self> {
        match t {
            lock_type::READ_LT | lock_type::READW_LT => Ok(LockType::Read),
            lock_type::WRITE_LT | lock_type::WRITEW_LT => Ok(LockType::Write),
            _ => Err(Nfsstat4::INVAL),
        }
    }

    fn wire(self) -> u32 {
        match self {
            LockType::Read => lock_type::READ_LT,
            LockType::Write => lock_type::WRITE_LT,
        }
    }
}

/// One held range, `start..=end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRange {
    /// The lock stateid's `other`.
    pub other: [u8; 12],
    pub clientid: u64,
    pub owner: Vec<u8>,
    pub ltype: LockType,
    pub start: u64,
    pub end: u64,
}

impl LockRange {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn denied(&self) -> LockDenied {
        LockDenied {
            offset: self.start,
            length: if self.end == u64::MAX {
                u64::MAX
            } else {
                self.end - self.start + 1
            },
            locktype: self.ltype.wire(),
            owner: StateOwner4 {
                clientid: self.clientid,
                owner: Opaque1024::from_slice(&self.owner),
            },
        }
    }
}

/// Every file's locks.
#[derive(Debug, Default)]
pub(super) struct LockTable {
    files: HashMap<FileKey, Vec<LockRange>>,
}

impl LockTable {
    pub(super) fn len(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }

    pub(super) fn holds(&self, other: &[u8; 12]) -> bool {
        self.files.values().flatten().any(|r| &r.other == other)
    }

    fn count_client(&self, clientid: u64) -> usize {
        self.files
            .values()
            .flatten()
            .filter(|r| r.clientid == clientid)
            .count()
    }

    /// The files on which `clientid` holds locks.
    pub(super) fn files_of(&self, clientid: u64) -> Vec<FileKey> {
        self.files
            .iter()
            .filter(|(_, v)| v.iter().any(|r| r.clientid == clientid))
            .map(|(f, _)| *f)
            .collect()
    }

    pub(super) fn remove_client(&mut self, clientid: u64) {
        for v in self.files.values_mut() {
            v.retain(|r| r.clientid != clientid);
        }
        self.files.retain(|_, v| !v.is_empty());
    }

    pub(super) fn conflict(
        &self,
        file: FileKey,
        clientid: u64,
        owner: &[u8],
        ltype: LockType,
        start: u64,
        end: u64,
    ) -> Option<&LockRange> {
        self.files.get(&file)?.iter().find(|r| {
            r.overlaps(start, end)
                && !(r.clientid == clientid && r.owner == owner)
                && (ltype == LockType::Write || r.ltype == LockType::Write)
        })
    }

    /// Whether READ (`write` false) or WRITE of `offset..offset+len` conflicts with a lock of
    /// another owner than `owner`.
    pub(super) fn io_conflict(
        &self,
        file: FileKey,
        owner: Option<&(u64, Vec<u8>)>,
        offset: u64,
        len: u64,
        write: bool,
    ) -> bool {
        if len == 0 {
            return false;
        }
        let end = offset.saturating_add(len - 1);
        self.files.get(&file).is_some_and(|v| {
            v.iter().any(|r| {
                r.overlaps(offset, end)
                    && owner.is_none_or(|(c, o)| !(r.clientid == *c && &r.owner == o))
                    && (write || r.ltype == LockType::Write)
            })
        })
    }

    /// Remove `owner`'s coverage of `start..=end` on `file`, splitting ranges that stick out.
    fn carve(&mut self, file: FileKey, other: &[u8; 12], start: u64, end: u64) {
        let Some(v) = self.files.get_mut(&file) else {
            return;
        };
        let mut out = Vec::with_capacity(v.len() + 1);
        for r in v.drain(..) {
            if &r.other != other || !r.overlaps(start, end) {
                out.push(r);
                continue;
            }
            if r.start < start {
                out.push(LockRange {
                    end: start - 1,
                    ..r.clone()
                });
            }
            if r.end > end {
                out.push(LockRange {
                    start: end + 1,
                    ..r
                });
            }
        }
        *v = out;
    }

    /// Set `range` for its owner: replace what the owner held under it (an upgrade or a
    /// downgrade), then merge touching ranges of the same owner and type.
    fn set(&mut self, file: FileKey, range: LockRange) {
        self.carve(file, &range.other, range.start, range.end);
        let v = self.files.entry(file).or_default();
        v.push(range);
        v.sort_by_key(|r| (r.other, r.start));
        let mut merged: Vec<LockRange> = Vec::with_capacity(v.len());
        for r in v.drain(..) {
            if let Some(last) = merged.last_mut()
                && last.other == r.other
                && last.ltype == r.ltype
                && last.end.checked_add(1).is_some_and(|n| n >= r.start)
            {
                last.end = last.end.max(r.end);
                continue;
            }
            merged.push(r);
        }
        *v = merged;
    }

    fn unset(&mut self, file: FileKey, other: &[u8; 12], start: u64, end: u64) {
        self.carve(file, other, start, end);
        if self.files.get(&file).is_some_and(Vec::is_empty) {
            self.files.remove(&file);
        }
    }
}

/// LOCK or LOCKT refused: a status, or NFS4ERR_DENIED with the conflicting lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    Status(Nfsstat4),
    Denied(LockDenied),
}

impl From<Nfsstat4> for LockError {
    fn from(s: Nfsstat4) -> Self {
        LockError::Status(s)
    }
}

/// `offset`/`length` to an inclusive range (RFC 8881 §18.10.4: length 0 is NFS4ERR_INVAL, and
/// so is a range past 2^64 unless length is all ones).
pub(super) fn range(offset: u64, length: u64) -> Res4<(u64, u64)> {
    if length == 0 {
        return Err(Nfsstat4::INVAL);
    }
    if length == u64::MAX {
        return Ok((offset, u64::MAX));
    }
    let end = offset.checked_add(length - 1).ok_or(Nfsstat4::INVAL)?;
    Ok((offset, end))
}

impl State {
    /// LOCK (RFC 8881 §18.10).
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &mut self,
        clientid: u64,
        ltype: u32,
        reclaim: bool,
        offset: u64,
        length: u64,
        locker: &Locker,
        file: FileKey,
        now: Instant,
    ) -> Result<Stateid4, LockError> {
        let lt = LockType::from_wire(ltype)?;
        let (start, end) = range(offset, length)?;
        self.check_grace(clientid, reclaim, now)?;
        let (lock_other, owner) = match locker {
            Locker::New {
                open_stateid,
                owner,
                ..
            } => {
                let open = self.lookup(clientid, open_stateid)?;
                if open.kind != StateKind::Open || open.file != file {
                    return Err(Nfsstat4::BAD_STATEID.into());
                }
                if lt == LockType::Write && open.access & share::ACCESS_WRITE == 0 {
                    return Err(Nfsstat4::OPENMODE.into());
                }
                let owner_bytes = owner.owner.as_bytes().to_vec();
                let existing = self.states.iter().find(|(_, e)| {
                    e.kind == StateKind::Lock
                        && e.clientid == clientid
                        && e.file == file
                        && e.owner == owner_bytes
                });
                match existing {
                    Some((o, _)) => (*o, owner_bytes),
                    None => {
                        if self.stateids_of(clientid) >= self.cfg.max_stateids_per_client {
                            return Err(Nfsstat4::RESOURCE.into());
                        }
                        let other = self.fresh_other();
                        self.states.insert(
                            other,
                            StateEntry {
                                kind: StateKind::Lock,
                                clientid,
                                file,
                                seqid: 0,
                                owner: owner_bytes.clone(),
                                access: 0,
                                deny: 0,
                                open_other: Some(open_stateid.other),
                            },
                        );
                        (other, owner_bytes)
                    }
                }
            }
            Locker::Existing { lock_stateid, .. } => {
                let e = self.lookup(clientid, lock_stateid)?;
                if e.kind != StateKind::Lock || e.file != file {
                    return Err(Nfsstat4::BAD_STATEID.into());
                }
                if lt == LockType::Write {
                    let open = e.open_other.and_then(|o| self.states.get(&o));
                    if open.is_none_or(|o| o.access & share::ACCESS_WRITE == 0) {
                        return Err(Nfsstat4::OPENMODE.into());
                    }
                }
                (lock_stateid.other, e.owner.clone())
            }
        };
        if let Some(c) = self.locks.conflict(file, clientid, &owner, lt, start, end) {
            let denied = c.denied();
            self.drop_unused_lock_stateid(&lock_other);
            return Err(LockError::Denied(denied));
        }
        if self.locks.count_client(clientid) >= self.cfg.max_locks_per_client {
            self.drop_unused_lock_stateid(&lock_other);
            return Err(Nfsstat4::RESOURCE.into());
        }
        self.locks.set(
            file,
            LockRange {
                other: lock_other,
                clientid,
                owner,
                ltype: lt,
                start,
                end,
            },
        );
        let e = self
            .states
            .get_mut(&lock_other)
            .ok_or(LockError::Status(Nfsstat4::SERVERFAULT))?;
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: lock_other,
        })
    }

    /// A lock stateid created for a LOCK that then failed is not kept (seqid still 0).
    fn drop_unused_lock_stateid(&mut self, other: &[u8; 12]) {
        if self.states.get(other).is_some_and(|e| e.seqid == 0) {
            self.states.remove(other);
        }
    }

    /// The grace-period rules of LOCK and OPEN (RFC 8881 §8.4.2, §18.10.4, §18.16.4): during
    /// grace only reclaims; after it, or after the client's RECLAIM_COMPLETE, no reclaims.
    /// And before its RECLAIM_COMPLETE a client gets no new locks at all, grace or not
    /// (§18.51.3: "If non-reclaim locking operations are done before the RECLAIM_COMPLETE,
    /// an NFS4ERR_GRACE error will be returned"; pynfs RECC3).
    pub fn check_grace(&self, clientid: u64, reclaim: bool, now: Instant) -> Res4<()> {
        let grace = self.in_grace(now);
        match (reclaim, grace) {
            (false, true) => Err(Nfsstat4::GRACE),
            (false, false) if !self.reclaimed(clientid) => Err(Nfsstat4::GRACE),
            (true, false) => Err(Nfsstat4::NO_GRACE),
            (true, true) if self.reclaimed(clientid) => Err(Nfsstat4::NO_GRACE),
            _ => Ok(()),
        }
    }

    /// LOCKT (RFC 8881 §18.11): whether the lock could be granted, granting nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn lockt(
        &self,
        clientid: u64,
        ltype: u32,
        offset: u64,
        length: u64,
        owner: &StateOwner4,
        file: FileKey,
        now: Instant,
    ) -> Result<(), LockError> {
        let lt = LockType::from_wire(ltype)?;
        let (start, end) = range(offset, length)?;
        if self.in_grace(now) {
            return Err(Nfsstat4::GRACE.into());
        }
        if !self.clients.contains_key(&clientid) {
            return Err(Nfsstat4::STALE_CLIENTID.into());
        }
        match self
            .locks
            .conflict(file, clientid, owner.owner.as_bytes(), lt, start, end)
        {
            Some(c) => Err(LockError::Denied(c.denied())),
            None => Ok(()),
        }
    }

    /// LOCKU (RFC 8881 §18.12): release a range (splitting what is held around it).
    #[allow(clippy::too_many_arguments)]
    pub fn locku(
        &mut self,
        clientid: u64,
        ltype: u32,
        sid: &Stateid4,
        offset: u64,
        length: u64,
        file: FileKey,
    ) -> Res4<Stateid4> {
        LockType::from_wire(ltype)?;
        let (start, end) = range(offset, length)?;
        let e = self.lookup(clientid, sid)?;
        if e.kind != StateKind::Lock || e.file != file {
            return Err(Nfsstat4::BAD_STATEID);
        }
        self.locks.unset(file, &sid.other, start, end);
        let e = self
            .states
            .get_mut(&sid.other)
            .ok_or(Nfsstat4::SERVERFAULT)?;
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: sid.other,
        })
    }

    /// The locks held on `file` (tests and status).
    pub fn locks_on(&self, file: FileKey) -> Vec<LockRange> {
        self.locks.files.get(&file).cloned().unwrap_or_default()
    }
}
