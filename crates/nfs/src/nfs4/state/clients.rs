//! Client records and sessions: EXCHANGE_ID (RFC 8881 §18.35), CREATE_SESSION (§18.36),
//! DESTROY_SESSION (§18.37), BIND_CONN_TO_SESSION (§18.34), DESTROY_CLIENTID (§18.50) and
//! RECLAIM_COMPLETE (§18.51).

use std::collections::HashSet;
use std::time::Instant;

use super::super::args::CreateSessionArgs;
use super::super::consts::{cdfc, exchgid, session_flags};
use super::super::res::{CreateSessionOk, ExchangeIdOk};
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{
    CallbackSecParms4, ChannelAttrs4, ClientOwner4, ServerOwner4, SessionId4, Verifier4,
};
use super::slots::Session;
use super::{ConnId, State};

/// Who is calling, for the principal checks of EXCHANGE_ID (RFC 8881 §18.35.5). Under
/// AUTH_SYS the principal is the uid; AUTH_NONE callers are all one principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Principal {
    None,
    Sys(u32),
}

/// A client record.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) clientid: u64,
    pub(super) ownerid: Vec<u8>,
    pub(super) verifier: Verifier4,
    pub(super) principal: Principal,
    pub(super) confirmed: bool,
    pub(super) renewed: Instant,
    /// The CREATE_SESSION sequence slot (RFC 8881 §18.36.4): the last sequence id used, and
    /// the reply it got (replayed for a retransmission).
    pub(super) cs_seq: u32,
    pub(super) cs_reply: Option<Res4<CreateSessionOk>>,
    pub(super) reclaim_complete: bool,
    /// Callback program and credential (CREATE_SESSION, BACKCHANNEL_CTL).
    pub(super) cb_program: u32,
    pub(super) cb_sec: Option<CallbackSecParms4>,
    /// NFSv4.0 records (RFC 7530 §16.33): the SETCLIENTID_CONFIRM verifier this record was
    /// (or is to be) confirmed with, and a callback update pending on a confirmed record.
    pub(super) confirm40: Option<Verifier4>,
    pub(super) update40: Option<Verifier4>,
}

/// The confirmed and unconfirmed records of one client owner.
#[derive(Debug, Default)]
pub(super) struct OwnerRecords {
    pub(super) confirmed: Option<u64>,
    pub(super) unconfirmed: Option<u64>,
}

/// What EXCHANGE_ID needs besides its arguments.
#[derive(Debug, Clone)]
pub struct ServerIdentity {
    pub owner: ServerOwner4,
    pub scope: Vec<u8>,
    pub impl_domain: Vec<u8>,
    pub impl_name: Vec<u8>,
}

impl State {
    pub(super) fn has_state(&self, clientid: u64) -> bool {
        self.sessions.values().any(|s| s.clientid == clientid)
            || self.states.values().any(|e| e.clientid == clientid)
    }

    pub(super) fn new_client(
        &mut self,
        owner: &ClientOwner4,
        principal: Principal,
        now: Instant,
    ) -> Res4<u64> {
        if self.clients.len() >= self.cfg.max_clients {
            // Expired records go first; a full table after that is the server's limit.
            self.poll(now);
            if self.clients.len() >= self.cfg.max_clients {
                return Err(Nfsstat4::DELAY);
            }
        }
        let clientid = (u64::from(self.boot) << 32) | (self.fresh_id() & 0xffff_ffff);
        self.clients.insert(
            clientid,
            Client {
                clientid,
                ownerid: owner.ownerid.as_bytes().to_vec(),
                verifier: owner.verifier,
                principal,
                confirmed: false,
                renewed: now,
                cs_seq: 0,
                cs_reply: None,
                reclaim_complete: false,
                cb_program: 0,
                cb_sec: None,
                confirm40: None,
                update40: None,
            },
        );
        Ok(clientid)
    }

    /// EXCHANGE_ID (RFC 8881 §18.35.5), SP4_NONE.
    pub fn exchange_id(
        &mut self,
        owner: &ClientOwner4,
        flags: u32,
        principal: Principal,
        id: &ServerIdentity,
        now: Instant,
    ) -> Res4<ExchangeIdOk> {
        // §18.35.3: flags outside what a client may send are NFS4ERR_INVAL.
        if flags & !exchgid::CLIENT_MASK != 0 {
            return Err(Nfsstat4::INVAL);
        }
        let key = owner.ownerid.as_bytes().to_vec();
        let rec = self.owners.get(&key);
        let confirmed = rec.and_then(|r| r.confirmed);
        let unconfirmed = rec.and_then(|r| r.unconfirmed);
        let clientid = if flags & exchgid::UPD_CONFIRMED_REC_A != 0 {
            // Cases for an update (§18.35.5, "update"): only a confirmed record can be
            // updated, by its principal, with its verifier.
            let Some(cid) = confirmed else {
                return Err(Nfsstat4::NOENT);
            };
            let c = &self.clients[&cid];
            if c.verifier != owner.verifier {
                return Err(Nfsstat4::NOT_SAME);
            }
            if c.principal != principal {
                return Err(Nfsstat4::PERM);
            }
            cid
        } else if let Some(cid) = confirmed {
            let c = &self.clients[&cid];
            if c.principal != principal && self.has_state(cid) {
                // Case 3, client collision: another principal holds this owner's state.
                return Err(Nfsstat4::CLID_INUSE);
            }
            if c.verifier == owner.verifier && c.principal == principal {
                // Case 2: a retransmission or a lease renewal of the confirmed record.
                cid
            } else if c.principal != principal {
                // Case 3 without state (a client collision on a record that holds nothing):
                // the old record is replaced at once, so its client ID is stale from now on
                // (as Linux nfsd does; pynfs EID5e).
                if let Some(old) = unconfirmed {
                    self.clients.remove(&old);
                }
                self.purge_client(cid);
                let cid = self.new_client(owner, principal, now)?;
                self.owners.entry(key).or_default().unconfirmed = Some(cid);
                cid
            } else {
                // Case 5 (the client restarted) or case 3 without state: a new unconfirmed
                // record; the old one goes when CREATE_SESSION confirms the new.
                if let Some(old) = unconfirmed {
                    self.clients.remove(&old);
                }
                let cid = self.new_client(owner, principal, now)?;
                self.owners.entry(key).or_default().unconfirmed = Some(cid);
                cid
            }
        } else {
            // Cases 1 and 4: no confirmed record; an unconfirmed one is always replaced by a
            // record with a new client ID, whatever its verifier and principal (§18.35.5 case
            // 4, "the server ... replaces it"; pynfs EID5d).
            if let Some(old) = unconfirmed {
                self.clients.remove(&old);
            }
            let cid = self.new_client(owner, principal, now)?;
            self.owners.entry(key).or_default().unconfirmed = Some(cid);
            cid
        };
        let c = self
            .clients
            .get_mut(&clientid)
            .ok_or(Nfsstat4::SERVERFAULT)?;
        c.renewed = now;
        let mut rflags = exchgid::USE_NON_PNFS;
        if c.confirmed {
            rflags |= exchgid::CONFIRMED_R;
        }
        Ok(ExchangeIdOk {
            clientid,
            sequenceid: c.cs_seq.wrapping_add(1),
            flags: rflags,
            server_owner: id.owner.clone(),
            server_scope: id.scope.clone().into(),
            impl_domain: id.impl_domain.clone().into(),
            impl_name: id.impl_name.clone().into(),
        })
    }

    /// Negotiate one channel's attributes: never more than the client asked, never more than
    /// our bounds (RFC 8881 §18.36.3).
    fn negotiate(&self, asked: &ChannelAttrs4, fore: bool) -> Res4<ChannelAttrs4> {
        let c = &self.cfg;
        // A channel that cannot carry a minimal COMPOUND (a SEQUENCE and one more operation)
        // is refused.
        const MIN_MSG: u32 = 256;
        if asked.maxrequestsize < MIN_MSG || asked.maxresponsesize < MIN_MSG {
            return Err(Nfsstat4::TOOSMALL);
        }
        if asked.maxrequests == 0 || asked.maxoperations == 0 {
            return Err(Nfsstat4::INVAL);
        }
        Ok(if fore {
            ChannelAttrs4 {
                headerpadsize: 0,
                maxrequestsize: asked.maxrequestsize.min(c.max_request),
                maxresponsesize: asked.maxresponsesize.min(c.max_response),
                maxresponsesize_cached: asked.maxresponsesize_cached.min(c.max_response_cached),
                maxoperations: asked.maxoperations.min(c.max_ops),
                maxrequests: asked.maxrequests.min(c.max_slots),
                // Linux rejects more than one element; we ask no RDMA IRD of our own.
                rdma_ird: None,
            }
        } else {
            // The back channel: the client's values, within a small bound of our own (we send
            // few callbacks, one at a time).
            ChannelAttrs4 {
                headerpadsize: 0,
                maxrequestsize: asked.maxrequestsize.min(c.max_request),
                maxresponsesize: asked.maxresponsesize.min(c.max_response),
                maxresponsesize_cached: 0,
                maxoperations: asked.maxoperations.min(c.max_ops),
                maxrequests: asked.maxrequests.min(4),
                rdma_ird: None,
            }
        })
    }

    /// CREATE_SESSION (RFC 8881 §18.36.4): the sequence check with replay, confirmation of an
    /// unconfirmed record (the owner's older confirmed record and its state go), and a new
    /// session bound to `conn` (both directions when the client asked for the back channel).
    pub fn create_session(
        &mut self,
        a: &CreateSessionArgs,
        principal: Principal,
        conn: ConnId,
        backchannel_possible: bool,
        now: Instant,
    ) -> Res4<CreateSessionOk> {
        let c = self
            .clients
            .get(&a.clientid)
            .ok_or(Nfsstat4::STALE_CLIENTID)?;
        if c.cs_reply.is_some() && a.sequence == c.cs_seq {
            // A retransmission: the cached reply (§18.36.4, "replay").
            return c.cs_reply.clone().unwrap_or(Err(Nfsstat4::SERVERFAULT));
        }
        if a.sequence != c.cs_seq.wrapping_add(1) {
            return Err(Nfsstat4::SEQ_MISORDERED);
        }
        if c.principal != principal {
            return Err(Nfsstat4::CLID_INUSE);
        }
        // Arguments the server refuses outright (unknown flags, §18.36.3; channels it cannot
        // serve, NFS4ERR_TOOSMALL / NFS4ERR_INVAL) neither consume the sequence id nor replace
        // the cached reply: the client retries with the same csa_sequence and better
        // arguments (as Linux nfsd does; pynfs CSESS15, CSESS29).
        if a.flags & !session_flags::MASK != 0 {
            return Err(Nfsstat4::INVAL);
        }
        self.negotiate(&a.fore, true)?;
        self.negotiate(&a.back, false)?;
        let result = self.create_session_new(a, conn, backchannel_possible, now);
        if let Some(c) = self.clients.get_mut(&a.clientid) {
            c.cs_seq = a.sequence;
            c.cs_reply = Some(result.clone());
        }
        result
    }

    fn create_session_new(
        &mut self,
        a: &CreateSessionArgs,
        conn: ConnId,
        backchannel_possible: bool,
        now: Instant,
    ) -> Res4<CreateSessionOk> {
        let fore = self.negotiate(&a.fore, true)?;
        let back = self.negotiate(&a.back, false)?;
        if a.sec.iter().all(|s| matches!(s, CallbackSecParms4::Gss)) && !a.sec.is_empty() {
            // Only AUTH_NONE and AUTH_SYS callbacks can be made (§18.36.3).
            return Err(Nfsstat4::ENCR_ALG_UNSUPP);
        }
        let nsessions = self
            .sessions
            .values()
            .filter(|s| s.clientid == a.clientid)
            .count();
        if nsessions >= self.cfg.max_sessions_per_client {
            return Err(Nfsstat4::RESOURCE);
        }
        // Confirm: the owner's previous confirmed record (a restarted client) and its state
        // go (§18.35.5 case 5).
        let ownerid = self.clients[&a.clientid].ownerid.clone();
        let was_confirmed = self.clients[&a.clientid].confirmed;
        if !was_confirmed {
            let old = self.owners.get(&ownerid).and_then(|r| r.confirmed);
            if let Some(old) = old.filter(|&o| o != a.clientid) {
                self.purge_client(old);
            }
            let rec = self.owners.entry(ownerid).or_default();
            rec.confirmed = Some(a.clientid);
            if rec.unconfirmed == Some(a.clientid) {
                rec.unconfirmed = None;
            }
        }
        let mut flags = 0;
        let back_chan = a.flags & session_flags::CONN_BACK_CHAN != 0 && backchannel_possible;
        if back_chan {
            flags |= session_flags::CONN_BACK_CHAN;
        }
        let mut id: SessionId4 = [0; 16];
        id[..8].copy_from_slice(&a.clientid.to_be_bytes());
        id[8..12].copy_from_slice(&self.boot.to_be_bytes());
        id[12..].copy_from_slice(&(self.fresh_id() as u32).to_be_bytes());
        let mut conns = HashSet::new();
        conns.insert(conn);
        self.sessions.insert(
            id,
            Session::new(
                id,
                a.clientid,
                fore.clone(),
                back.clone(),
                conns,
                back_chan.then_some(conn),
            ),
        );
        let c = self
            .clients
            .get_mut(&a.clientid)
            .ok_or(Nfsstat4::SERVERFAULT)?;
        c.confirmed = true;
        c.renewed = now;
        c.cb_program = a.cb_program;
        c.cb_sec = a
            .sec
            .iter()
            .find(|s| !matches!(s, CallbackSecParms4::Gss))
            .cloned();
        Ok(CreateSessionOk {
            session: id,
            sequence: a.sequence,
            flags,
            fore,
            back,
        })
    }

    /// DESTROY_SESSION (RFC 8881 §18.37).
    pub fn destroy_session(&mut self, id: &SessionId4) -> Res4<()> {
        self.sessions
            .remove(id)
            .map(|_| ())
            .ok_or(Nfsstat4::BADSESSION)
    }

    /// BIND_CONN_TO_SESSION (RFC 8881 §18.34.3): FORE_OR_BOTH and BACK_OR_BOTH bind both
    /// directions (Linux requires BOTH back for FORE_OR_BOTH).
    pub fn bind_conn(
        &mut self,
        id: &SessionId4,
        dir: u32,
        conn: ConnId,
        now: Instant,
    ) -> Res4<u32> {
        let s = self.sessions.get_mut(id).ok_or(Nfsstat4::BADSESSION)?;
        let both = match dir {
            cdfc::FORE => false,
            cdfc::BACK | cdfc::FORE_OR_BOTH | cdfc::BACK_OR_BOTH => true,
            _ => return Err(Nfsstat4::INVAL),
        };
        s.conns.insert(conn);
        if both {
            s.back_conn = Some(conn);
        }
        let cid = s.clientid;
        if let Some(c) = self.clients.get_mut(&cid) {
            c.renewed = now;
        }
        Ok(match dir {
            cdfc::FORE => cdfc::FORE,
            cdfc::BACK => cdfc::BACK,
            _ => cdfc::SERVER_BOTH,
        })
    }

    /// DESTROY_CLIENTID (RFC 8881 §18.50): only a client without sessions.
    pub fn destroy_clientid(&mut self, clientid: u64) -> Res4<()> {
        if !self.clients.contains_key(&clientid) {
            return Err(Nfsstat4::STALE_CLIENTID);
        }
        if self.sessions.values().any(|s| s.clientid == clientid) {
            return Err(Nfsstat4::CLIENTID_BUSY);
        }
        self.purge_client(clientid);
        Ok(())
    }

    /// RECLAIM_COMPLETE (RFC 8881 §18.51): once per client (`rca_one_fs` false).
    pub fn reclaim_complete(&mut self, clientid: u64, one_fs: bool) -> Res4<()> {
        let c = self
            .clients
            .get_mut(&clientid)
            .ok_or(Nfsstat4::STALE_CLIENTID)?;
        if one_fs {
            // Per-file-system reclaim completion: nothing migrates here, so it is accepted.
            return Ok(());
        }
        if c.reclaim_complete {
            return Err(Nfsstat4::COMPLETE_ALREADY);
        }
        c.reclaim_complete = true;
        Ok(())
    }

    /// Whether a client has said RECLAIM_COMPLETE (reclaims after it are NFS4ERR_NO_GRACE).
    pub fn reclaimed(&self, clientid: u64) -> bool {
        self.clients
            .get(&clientid)
            .is_some_and(|c| c.reclaim_complete)
    }

    /// BACKCHANNEL_CTL (RFC 8881 §18.33): a new callback program and credential.
    pub fn backchannel_ctl(
        &mut self,
        clientid: u64,
        program: u32,
        sec: &[CallbackSecParms4],
    ) -> Res4<()> {
        let c = self
            .clients
            .get_mut(&clientid)
            .ok_or(Nfsstat4::STALE_CLIENTID)?;
        let usable = sec
            .iter()
            .find(|s| !matches!(s, CallbackSecParms4::Gss))
            .cloned();
        if usable.is_none() && !sec.is_empty() {
            return Err(Nfsstat4::ENCR_ALG_UNSUPP);
        }
        c.cb_program = program;
        c.cb_sec = usable;
        Ok(())
    }

    /// The callback program and credential of a client, and the connection of the back
    /// channel of its session `id`, if it has one.
    pub fn callback_route(
        &self,
        id: &SessionId4,
    ) -> Option<(u32, Option<CallbackSecParms4>, ConnId)> {
        let s = self.sessions.get(id)?;
        let c = self.clients.get(&s.clientid)?;
        Some((c.cb_program, c.cb_sec.clone(), s.back_conn?))
    }

    /// A connection went away: it leaves every session it was bound to; a back channel on it
    /// is gone until the client binds another.
    pub fn conn_closed(&mut self, conn: ConnId) {
        for s in self.sessions.values_mut() {
            s.conns.remove(&conn);
            if s.back_conn == Some(conn) {
                s.back_conn = None;
            }
        }
    }
}
