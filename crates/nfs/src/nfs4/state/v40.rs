//! NFSv4.0 client records and the state operations only minor version 0 has: SETCLIENTID
//! (RFC 7530 §16.33), SETCLIENTID_CONFIRM (§16.34), RENEW and the implicit lease renewal of
//! every operation naming a clientid or stateid (§9.5, §16.28), OPEN_CONFIRM (§16.18) and
//! RELEASE_LOCKOWNER (§16.37).
//!
//! A 4.0 client is a record of the same client table 4.1 uses (leases, opens, locks and
//! expiry are shared); it is made by SETCLIENTID instead of EXCHANGE_ID and has no sessions.
//! The seqid ordering of open- and lock-owners and their reply cache live with the executor
//! (they cache encoded replies), see `server::v40`.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use super::super::status::{Nfsstat4, Res4};
use super::super::types::{ClientOwner4, Opaque1024, Stateid4, Verifier4};
use super::clients::Principal;
use super::{FileKey, State, StateKind};

/// Clients and stateids that went with an expired lease (RFC 7530 §13.1: such a
/// stateid or clientid is NFS4ERR_EXPIRED, not unknown), the most recent ones, bounded.
#[derive(Debug, Default)]
pub(super) struct Expired {
    clients: VecDeque<u64>,
    states: VecDeque<[u8; 12]>,
    state_set: HashSet<[u8; 12]>,
}

impl Expired {
    fn remember(
        &mut self,
        clientid: Option<u64>,
        others: Vec<[u8; 12]>,
        max_clients: usize,
        max_states: usize,
    ) {
        self.clients.extend(clientid);
        while self.clients.len() > max_clients {
            self.clients.pop_front();
        }
        for o in others {
            if self.state_set.insert(o) {
                self.states.push_back(o);
            }
        }
        while self.states.len() > max_states {
            if let Some(o) = self.states.pop_front() {
                self.state_set.remove(&o);
            }
        }
    }
}

impl State {
    /// Purge a client whose lease expired, remembering its stateids (and, when `lease` is
    /// set, the clientid: it expired rather than being replaced) as expired.
    pub(super) fn expire_client(&mut self, clientid: u64, lease: bool) {
        let others: Vec<[u8; 12]> = self
            .states
            .iter()
            .filter(|(_, e)| e.clientid == clientid)
            .map(|(o, _)| *o)
            .collect();
        let (mc, ms) = (self.cfg.max_clients, self.cfg.max_stateids_per_client);
        self.expired
            .remember(lease.then_some(clientid), others, mc, ms);
        self.purge_client(clientid);
    }

    /// The error for a stateid of this instance that no entry has: NFS4ERR_EXPIRED when it
    /// went with an expired lease, else NFS4ERR_BAD_STATEID.
    pub(super) fn unknown_stateid(&self, sid: &Stateid4) -> Nfsstat4 {
        if self.expired.state_set.contains(&sid.other) {
            Nfsstat4::EXPIRED
        } else {
            Nfsstat4::BAD_STATEID
        }
    }

    /// A fresh SETCLIENTID_CONFIRM verifier: the boot word and a counter, never repeated by
    /// this instance.
    fn fresh_confirm(&mut self) -> Verifier4 {
        let n = self.fresh_id() as u32;
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&self.boot.to_be_bytes());
        v[4..].copy_from_slice(&n.to_be_bytes());
        v
    }

    /// SETCLIENTID (RFC 7530 §16.33.5): returns the clientid and the verifier
    /// SETCLIENTID_CONFIRM must present.
    ///
    /// - A confirmed record of another principal that still holds state: NFS4ERR_CLID_INUSE.
    /// - A confirmed record with the same verifier: a callback update; the clientid stays and
    ///   the update waits for its confirmation.
    /// - Otherwise (no record, or a confirmed one with another verifier: the client rebooted)
    ///   a new unconfirmed record with a new clientid replaces any unconfirmed one; the
    ///   confirmed record and its state stay until the new one is confirmed.
    pub fn setclientid(
        &mut self,
        id: &Opaque1024,
        verifier: Verifier4,
        principal: Principal,
        now: Instant,
    ) -> Res4<(u64, Verifier4)> {
        let key = id.as_bytes().to_vec();
        let rec = self.owners.get(&key);
        let confirmed = rec.and_then(|r| r.confirmed);
        let unconfirmed = rec.and_then(|r| r.unconfirmed);
        if let Some(cid) = confirmed {
            let c = &self.clients[&cid];
            if c.principal != principal && self.has_state(cid) {
                return Err(Nfsstat4::CLID_INUSE);
            }
        }
        if let Some(u) = unconfirmed.filter(|u| Some(*u) != confirmed) {
            self.purge_client(u);
        }
        if let Some(cid) = confirmed
            && self.clients[&cid].verifier == verifier
        {
            let v = self.fresh_confirm();
            let c = self.clients.get_mut(&cid).ok_or(Nfsstat4::SERVERFAULT)?;
            c.update40 = Some(v);
            c.principal = principal;
            return Ok((cid, v));
        }
        let cid = self.new_client(
            &ClientOwner4 {
                verifier,
                ownerid: id.clone(),
            },
            principal,
            now,
        )?;
        let v = self.fresh_confirm();
        if let Some(c) = self.clients.get_mut(&cid) {
            c.confirm40 = Some(v);
        }
        self.owners.entry(key).or_default().unconfirmed = Some(cid);
        Ok((cid, v))
    }

    /// SETCLIENTID_CONFIRM (RFC 7530 §16.34.4): confirms the record SETCLIENTID made (or the
    /// callback update of a confirmed one). A confirmed record presented again with its own
    /// verifier is a retransmission (OK); any other verifier, or an unknown clientid, is
    /// NFS4ERR_STALE_CLIENTID; another principal NFS4ERR_CLID_INUSE. Confirming a new record
    /// for a client string drops the older confirmed record and its state (the client
    /// rebooted, §16.34.4, §9.1.2).
    pub fn setclientid_confirm(
        &mut self,
        clientid: u64,
        verifier: Verifier4,
        principal: Principal,
        now: Instant,
    ) -> Res4<()> {
        let c = self
            .clients
            .get_mut(&clientid)
            .ok_or(Nfsstat4::STALE_CLIENTID)?;
        if c.principal != principal {
            return Err(Nfsstat4::CLID_INUSE);
        }
        if c.confirmed {
            if c.update40 == Some(verifier) {
                c.confirm40 = c.update40.take();
            } else if c.confirm40 != Some(verifier) {
                return Err(Nfsstat4::STALE_CLIENTID);
            }
            c.renewed = now;
            return Ok(());
        }
        if c.confirm40 != Some(verifier) {
            return Err(Nfsstat4::STALE_CLIENTID);
        }
        c.confirmed = true;
        c.renewed = now;
        let key = c.ownerid.clone();
        let old = self.owners.get(&key).and_then(|r| r.confirmed);
        if let Some(old) = old.filter(|o| *o != clientid) {
            // Its opens and locks are gone; using them is NFS4ERR_EXPIRED (RFC 7530 §16.34.4).
            self.expire_client(old, false);
        }
        let rec = self.owners.entry(key).or_default();
        rec.confirmed = Some(clientid);
        if rec.unconfirmed == Some(clientid) {
            rec.unconfirmed = None;
        }
        Ok(())
    }

    /// Renew the lease of a confirmed 4.0 client (RENEW, and every operation that names the
    /// clientid or one of its stateids, RFC 7530 §9.5). An unknown or unconfirmed clientid is
    /// NFS4ERR_STALE_CLIENTID (§16.28.4). 4.0 has no RECLAIM_COMPLETE: once the
    /// grace period is over the client counts as done reclaiming.
    pub fn renew40(&mut self, clientid: u64, now: Instant) -> Res4<()> {
        let grace = self.in_grace(now);
        if !self.clients.contains_key(&clientid) && self.expired.clients.contains(&clientid) {
            return Err(Nfsstat4::EXPIRED);
        }
        let c = self
            .clients
            .get_mut(&clientid)
            .filter(|c| c.confirmed)
            .ok_or(Nfsstat4::STALE_CLIENTID)?;
        c.renewed = now;
        if !grace {
            c.reclaim_complete = true;
        }
        Ok(())
    }

    /// The client a stateid belongs to: another instance's stateid is NFS4ERR_STALE_STATEID,
    /// a special or unknown one NFS4ERR_BAD_STATEID (RFC 7530 §9.1.4).
    pub fn stateid_client(&self, sid: &Stateid4) -> Res4<u64> {
        if sid.is_special() {
            return Err(Nfsstat4::BAD_STATEID);
        }
        if sid.other[..4] != self.boot.to_be_bytes() {
            return Err(Nfsstat4::STALE_STATEID);
        }
        self.states
            .get(&sid.other)
            .map(|e| e.clientid)
            .ok_or_else(|| self.unknown_stateid(sid))
    }

    /// The client, owner and kind of a stateid (for the seqid checks of its owner).
    pub fn stateid_owner(&self, sid: &Stateid4) -> Option<(u64, Vec<u8>, StateKind)> {
        self.states
            .get(&sid.other)
            .map(|e| (e.clientid, e.owner.clone(), e.kind))
    }

    /// Whether a clientid names a live record (owner records of gone clients are dropped).
    pub fn client_exists(&self, clientid: u64) -> bool {
        self.clients.contains_key(&clientid)
    }

    /// OPEN_CONFIRM's state part (RFC 7530 §16.18.4): the open stateid of `file`, current,
    /// gets its seqid advanced.
    pub fn open_confirm(&mut self, clientid: u64, sid: &Stateid4, file: FileKey) -> Res4<Stateid4> {
        let e = self.lookup(clientid, sid)?;
        if e.kind != StateKind::Open || e.file != file {
            return Err(Nfsstat4::BAD_STATEID);
        }
        let e = self
            .states
            .get_mut(&sid.other)
            .ok_or(Nfsstat4::BAD_STATEID)?;
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: sid.other,
        })
    }

    /// RELEASE_LOCKOWNER (RFC 7530 §16.37.4): the lock stateids of the owner go, unless one
    /// still holds a lock (NFS4ERR_LOCKS_HELD). An owner with no stateids is fine.
    pub fn release_lockowner(&mut self, clientid: u64, owner: &[u8]) -> Res4<()> {
        let mine: Vec<[u8; 12]> = self
            .states
            .iter()
            .filter(|(_, e)| {
                e.kind == StateKind::Lock && e.clientid == clientid && e.owner == owner
            })
            .map(|(o, _)| *o)
            .collect();
        if mine.iter().any(|o| self.locks.holds(o)) {
            return Err(Nfsstat4::LOCKS_HELD);
        }
        for o in mine {
            self.states.remove(&o);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs4::state::StateConfig;
    use std::time::Duration;

    fn state(now: Instant) -> State {
        let cfg = StateConfig {
            grace: Duration::ZERO,
            ..StateConfig::default()
        };
        State::new(cfg, 7, now)
    }

    fn id(s: &str) -> Opaque1024 {
        Opaque1024::from_slice(s.as_bytes())
    }

    #[test]
    fn setclientid_then_confirm_then_renew() {
        let now = Instant::now();
        let mut st = state(now);
        let p = Principal::Sys(0);
        let (cid, v) = st.setclientid(&id("a"), [1; 8], p, now).unwrap();
        // Unconfirmed: RENEW is refused.
        assert_eq!(st.renew40(cid, now), Err(Nfsstat4::STALE_CLIENTID));
        // A wrong verifier is refused; the right one confirms; repeating it is a retransmission.
        assert_eq!(
            st.setclientid_confirm(cid, [9; 8], p, now),
            Err(Nfsstat4::STALE_CLIENTID)
        );
        assert_eq!(st.setclientid_confirm(cid, v, p, now), Ok(()));
        assert_eq!(st.setclientid_confirm(cid, v, p, now), Ok(()));
        assert_eq!(st.renew40(cid, now), Ok(()));
        // Another principal may not confirm it.
        assert_eq!(
            st.setclientid_confirm(cid, v, Principal::Sys(5), now),
            Err(Nfsstat4::CLID_INUSE)
        );
    }

    #[test]
    fn callback_update_keeps_clientid_and_reboot_replaces_it() {
        let now = Instant::now();
        let mut st = state(now);
        let p = Principal::Sys(0);
        let (cid, v) = st.setclientid(&id("a"), [1; 8], p, now).unwrap();
        st.setclientid_confirm(cid, v, p, now).unwrap();
        // Same verifier: callback update, same clientid, new confirm verifier.
        let (cid2, v2) = st.setclientid(&id("a"), [1; 8], p, now).unwrap();
        assert_eq!(cid2, cid);
        assert_ne!(v2, v);
        assert_eq!(st.setclientid_confirm(cid, v2, p, now), Ok(()));
        // New verifier: the client rebooted; a new clientid; the old one lives until the new
        // one is confirmed.
        let (cid3, v3) = st.setclientid(&id("a"), [2; 8], p, now).unwrap();
        assert_ne!(cid3, cid);
        assert_eq!(st.renew40(cid, now), Ok(()));
        st.setclientid_confirm(cid3, v3, p, now).unwrap();
        assert_eq!(st.renew40(cid, now), Err(Nfsstat4::STALE_CLIENTID));
        assert_eq!(st.renew40(cid3, now), Ok(()));
        assert_eq!(st.counts().clients, 1);
    }

    #[test]
    fn clid_inuse_for_another_principal_with_state() {
        let now = Instant::now();
        let mut st = state(now);
        let p = Principal::Sys(0);
        let (cid, v) = st.setclientid(&id("a"), [1; 8], p, now).unwrap();
        st.setclientid_confirm(cid, v, p, now).unwrap();
        let f = FileKey { fsid: 1, ino: 2 };
        st.open(cid, b"o", f, 1, 0).unwrap();
        assert_eq!(
            st.setclientid(&id("a"), [1; 8], Principal::Sys(7), now),
            Err(Nfsstat4::CLID_INUSE)
        );
    }

    #[test]
    fn open_confirm_and_release_lockowner() {
        let now = Instant::now();
        let mut st = state(now);
        let p = Principal::Sys(0);
        let (cid, v) = st.setclientid(&id("a"), [1; 8], p, now).unwrap();
        st.setclientid_confirm(cid, v, p, now).unwrap();
        let f = FileKey { fsid: 1, ino: 2 };
        let o = st.open(cid, b"o", f, 3, 0).unwrap().stateid;
        assert_eq!(st.stateid_client(&o), Ok(cid));
        let c = st.open_confirm(cid, &o, f).unwrap();
        assert_eq!(c.seqid, o.seqid + 1);
        // The old seqid is now OLD_STATEID.
        assert_eq!(st.open_confirm(cid, &o, f), Err(Nfsstat4::OLD_STATEID));
        assert_eq!(st.release_lockowner(cid, b"nobody"), Ok(()));
        let mut other = o;
        other.other[..4].copy_from_slice(&8u32.to_be_bytes());
        assert_eq!(st.stateid_client(&other), Err(Nfsstat4::STALE_STATEID));
    }
}
