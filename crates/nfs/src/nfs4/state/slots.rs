//! Sessions, their slot tables and the reply cache: SEQUENCE (RFC 8881 §2.10.6, §18.46).

use std::collections::HashSet;
use std::time::Instant;

use super::super::args::SequenceArgs;
use super::super::compound::CompoundReply;
use super::super::res::SequenceOk;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{ChannelAttrs4, SessionId4};
use super::{ConnId, State};

/// One slot of a session's fore channel (RFC 8881 §2.10.6.1).
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// The sequence id of the last request this slot accepted (0: none yet).
    seqid: u32,
    /// That request is still executing.
    in_progress: bool,
    /// Its reply, when the client asked for it to be cached (`sa_cachethis`).
    cached: Option<CompoundReply>,
}

/// A session.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: SessionId4,
    pub(super) clientid: u64,
    pub(super) fore: ChannelAttrs4,
    pub(super) back: ChannelAttrs4,
    pub(super) conns: HashSet<ConnId>,
    pub(super) back_conn: Option<ConnId>,
    slots: Vec<Slot>,
    /// Sequence id for the next callback (CB_SEQUENCE) on the back channel's one slot.
    pub(super) cb_seq: u32,
}

impl Session {
    pub(super) fn new(
        id: SessionId4,
        clientid: u64,
        fore: ChannelAttrs4,
        back: ChannelAttrs4,
        conns: HashSet<ConnId>,
        back_conn: Option<ConnId>,
    ) -> Self {
        let n = fore.maxrequests.max(1) as usize;
        Session {
            id,
            clientid,
            fore,
            back,
            conns,
            back_conn,
            slots: (0..n).map(|_| Slot::default()).collect(),
            cb_seq: 0,
        }
    }
}

/// Which slot a request holds while it executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    pub session: SessionId4,
    pub slot: u32,
    pub cachethis: bool,
}

/// What SEQUENCE decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqOutcome {
    /// A new request: execute the rest of the COMPOUND, then call [`State::slot_done`].
    New {
        ok: SequenceOk,
        slot: SlotRef,
        clientid: u64,
        fore: ChannelAttrs4,
    },
    /// A retransmission of a completed request whose reply was cached: send it again.
    Replay(CompoundReply),
}

impl State {
    /// SEQUENCE (RFC 8881 §18.46.3 and §2.10.6.1): slot and sequence checks, the reply cache,
    /// lease renewal, and connection binding (SP4_NONE binds any connection that uses the
    /// session, §2.10.5.1).
    pub fn sequence(&mut self, a: &SequenceArgs, conn: ConnId, now: Instant) -> Res4<SeqOutcome> {
        let s = self
            .sessions
            .get_mut(&a.session)
            .ok_or(Nfsstat4::BADSESSION)?;
        let nslots = s.slots.len() as u32;
        if a.slotid >= nslots {
            return Err(Nfsstat4::BADSLOT);
        }
        if a.highest_slotid >= nslots {
            return Err(Nfsstat4::BAD_HIGH_SLOT);
        }
        let slot = &mut s.slots[a.slotid as usize];
        if a.sequenceid == slot.seqid && slot.seqid != 0 {
            // A retransmission (§2.10.6.1.2).
            if slot.in_progress {
                return Err(Nfsstat4::DELAY);
            }
            return match &slot.cached {
                Some(reply) => Ok(SeqOutcome::Replay(reply.clone())),
                None => Err(Nfsstat4::RETRY_UNCACHED_REP),
            };
        }
        if a.sequenceid != slot.seqid.wrapping_add(1) {
            return Err(Nfsstat4::SEQ_MISORDERED);
        }
        slot.seqid = a.sequenceid;
        slot.in_progress = true;
        slot.cached = None;
        s.conns.insert(conn);
        let clientid = s.clientid;
        let fore = s.fore.clone();
        let mut ok = SequenceOk {
            session: a.session,
            sequenceid: a.sequenceid,
            slotid: a.slotid,
            highest_slotid: nslots - 1,
            target_highest_slotid: nslots - 1,
            status_flags: 0,
        };
        ok.status_flags = self.cb_status_flags(clientid, &a.session);
        if let Some(c) = self.clients.get_mut(&clientid) {
            c.renewed = now;
        }
        Ok(SeqOutcome::New {
            ok,
            slot: SlotRef {
                session: a.session,
                slot: a.slotid,
                cachethis: a.cachethis,
            },
            clientid,
            fore,
        })
    }

    /// Whether a client gave a callback program (and so expects a back channel).
    pub(super) fn wants_callbacks(&self, clientid: u64) -> bool {
        self.clients
            .get(&clientid)
            .is_some_and(|c| c.cb_program != 0)
    }

    /// The request holding `slot` finished with `reply`: keep it in the reply cache when the
    /// client asked (`sa_cachethis`), and free the slot.
    pub fn slot_done(&mut self, slot: SlotRef, reply: &CompoundReply) {
        if let Some(s) = self.sessions.get_mut(&slot.session)
            && let Some(sl) = s.slots.get_mut(slot.slot as usize)
        {
            sl.in_progress = false;
            sl.cached = slot.cachethis.then(|| reply.clone());
        }
    }

    /// The largest reply the slot's cache can hold (`ca_maxresponsesize_cached`).
    pub fn cache_limit(&self, session: &SessionId4) -> u32 {
        self.sessions
            .get(session)
            .map_or(0, |s| s.fore.maxresponsesize_cached)
    }

    /// The next CB_SEQUENCE sequence id for a session's back channel (slot 0).
    pub fn next_cb_seq(&mut self, session: &SessionId4) -> Option<(u64, u32)> {
        let s = self.sessions.get_mut(session)?;
        s.cb_seq = s.cb_seq.wrapping_add(1);
        Some((s.clientid, s.cb_seq))
    }

    /// The sessions of a client.
    pub fn sessions_of(&self, clientid: u64) -> Vec<SessionId4> {
        self.sessions
            .values()
            .filter(|s| s.clientid == clientid)
            .map(|s| s.id)
            .collect()
    }

    /// The fore channel's attributes of a session (the COMPOUND limits checked before
    /// SEQUENCE takes its slot).
    pub fn fore_attrs(&self, id: &SessionId4) -> Option<ChannelAttrs4> {
        self.sessions.get(id).map(|s| s.fore.clone())
    }

    /// The clientid of a session.
    pub fn session_client(&self, id: &SessionId4) -> Option<u64> {
        self.sessions.get(id).map(|s| s.clientid)
    }
}
