//! Callbacks as the state core decides them (RFC 8881 §20): which are due, what they say,
//! and what their outcome means. The driver sends what [`State::take_callbacks`] returns and
//! reports each outcome to [`State::callback_done`]; nothing here waits or looks at a clock.
//!
//! - A CB_NULL probe of the back channel after CREATE_SESSION, BIND_CONN_TO_SESSION and
//!   BACKCHANNEL_CTL; its outcome, or the absence of any back channel, is the client's
//!   callback path state, reported in SEQUENCE's `sr_status_flags` as SEQ4_STATUS_CB_PATH_DOWN
//!   (as Linux nfsd reports its NFSD4_CB_DOWN state).
//! - CB_NOTIFY_LOCK (§20.11) to a lock owner whose blocking LOCK was denied, once the lock
//!   it waited for could be granted.
//!
//! Every CB_COMPOUND starts with CB_SEQUENCE on the back channel's slot 0 (§20.9, §2.10.6.3):
//! one CB_COMPOUND per session at a time; the bounds below cap what is queued and in flight.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::super::args::Locker;
use super::super::callback::wire::{
    CB_COMPOUND, CB_NULL, CbCompoundArgs, CbCompoundRes, CbOpArgs, CbOpRes, CbSequenceArgs,
};
use super::super::consts::seq4_status;
use super::super::types::{CallbackSecParms4, Fh4, Opaque1024, SessionId4, StateOwner4, Tag4};
use super::locks::{LockType, range};
use super::{ConnId, FileKey, State};

/// Bounds and times of the callbacks.
#[derive(Debug, Clone)]
pub struct CallbackConfig {
    /// How long a callback may wait for its reply.
    pub timeout: Duration,
    /// Callbacks in flight at once, over all clients.
    pub max_in_flight: usize,
    /// Callbacks waiting to be sent, over all clients; beyond it the oldest is dropped.
    pub max_queued: usize,
    /// Blocked lock owners remembered for CB_NOTIFY_LOCK, over all clients; beyond it the
    /// oldest is forgotten. A waiter is also forgotten after one lease period.
    pub max_lock_waiters: usize,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        CallbackConfig {
            timeout: Duration::from_secs(10),
            max_in_flight: 64,
            max_queued: 1024,
            max_lock_waiters: 1024,
        }
    }
}

/// What a callback says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbWhat {
    /// CB_NULL: a probe of the back channel.
    Null,
    /// CB_NOTIFY_LOCK for a lock owner's file.
    NotifyLock { fh: Fh4, owner: StateOwner4 },
}

/// A callback to send now: the driver makes the RPC call on connection `conn` and reports
/// the outcome with `id` by `deadline`.
#[derive(Debug, Clone)]
pub struct CbSend {
    pub id: u64,
    pub conn: ConnId,
    pub session: SessionId4,
    /// The client's callback program (CREATE_SESSION's or BACKCHANNEL_CTL's `cb_program`).
    pub program: u32,
    /// The credential the client asked for (`None`: AUTH_NONE).
    pub sec: Option<CallbackSecParms4>,
    /// CB_NULL or CB_COMPOUND.
    pub proc_: u32,
    /// The arguments (empty for CB_NULL).
    pub args: Bytes,
    pub what: CbWhat,
    pub deadline: Instant,
}

/// How a callback ended.
#[derive(Debug, Clone)]
pub enum CbOutcome {
    /// The RPC reply's results (accepted, SUCCESS).
    Replied(Bytes),
    /// No usable reply: timed out, refused, connection gone.
    Failed,
}

/// The client's callback path (Linux nfsd's `cl_cb_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CbPath {
    /// Being probed: nothing reported.
    Unknown,
    Up,
    /// No back channel, or the last probe or callback failed: SEQ4_STATUS_CB_PATH_DOWN.
    Down,
}

#[derive(Debug)]
struct Job {
    session: SessionId4,
    what: CbWhat,
}

#[derive(Debug)]
struct InFlight {
    session: SessionId4,
    clientid: u64,
    compound: bool,
}

#[derive(Debug)]
struct LockWaiter {
    clientid: u64,
    owner: Vec<u8>,
    file: FileKey,
    fh: Fh4,
    ltype: LockType,
    start: u64,
    end: u64,
    since: Instant,
}

/// The callback tables of [`State`].
#[derive(Debug, Default)]
pub(super) struct Callbacks {
    next_id: u64,
    queue: VecDeque<Job>,
    in_flight: HashMap<u64, InFlight>,
    /// Sessions whose back channel slot is taken by a CB_COMPOUND.
    busy: HashMap<SessionId4, u64>,
    paths: HashMap<u64, CbPath>,
    /// Minor version of each session's client (CB_COMPOUND carries it, §20.2.3).
    minor: HashMap<SessionId4, u32>,
    waiters: Vec<LockWaiter>,
    /// Counters: callbacks sent, answered, failed, dropped unsent.
    pub(super) sent: u64,
    pub(super) answered: u64,
    pub(super) failed: u64,
    pub(super) dropped: u64,
}

/// Counters of the callbacks, for tests and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallbackCounts {
    pub sent: u64,
    pub answered: u64,
    pub failed: u64,
    pub dropped: u64,
    pub queued: usize,
    pub in_flight: usize,
    pub lock_waiters: usize,
}

impl State {
    fn cb_queue(&mut self, session: SessionId4, what: CbWhat) {
        let max = self.cfg.callbacks.max_queued.max(1);
        let cb = &mut self.cb;
        while cb.queue.len() >= max {
            cb.queue.pop_front();
            cb.dropped += 1;
        }
        cb.queue.push_back(Job { session, what });
    }

    /// A session was created or a connection bound to it, or the client changed its callback
    /// program: probe the back channel with CB_NULL (as Linux nfsd does after CREATE_SESSION
    /// and BIND_CONN_TO_SESSION). `minor` is the minor version the client speaks.
    pub fn cb_probe(&mut self, session: &SessionId4, minor: Option<u32>) {
        let Some(clientid) = self.session_client(session) else {
            return;
        };
        if let Some(m) = minor {
            self.cb.minor.insert(*session, m);
        }
        self.cb.paths.entry(clientid).or_insert(CbPath::Unknown);
        self.cb_queue(*session, CbWhat::Null);
    }

    /// The client's callback path as the last probe or callback left it.
    pub fn cb_path(&self, clientid: u64) -> CbPath {
        self.cb
            .paths
            .get(&clientid)
            .copied()
            .unwrap_or(CbPath::Unknown)
    }

    /// The callback bits of SEQUENCE's `sr_status_flags` for a session (RFC 8881 §18.46.3):
    /// CB_PATH_DOWN when the client has no working back channel, CB_PATH_DOWN_SESSION when
    /// this session has none and the client gave a callback program.
    pub(super) fn cb_status_flags(&self, clientid: u64, session: &SessionId4) -> u32 {
        let mut f = 0;
        if self.cb_path(clientid) == CbPath::Down {
            f |= seq4_status::CB_PATH_DOWN;
        }
        if let Some(s) = self.sessions.get(session)
            && s.back_conn.is_none()
            && s.back.maxrequests > 0
            && self.wants_callbacks(clientid)
        {
            f |= seq4_status::CB_PATH_DOWN_SESSION;
        }
        f
    }

    /// A blocking LOCK (READW_LT, WRITEW_LT) by `locker` on `file` was denied: remember the
    /// lock owner, so that CB_NOTIFY_LOCK tells the client when the lock could be granted
    /// (§20.11.4).
    #[allow(clippy::too_many_arguments)]
    pub fn lock_waits(
        &mut self,
        clientid: u64,
        locker: &Locker,
        file: FileKey,
        fh: Fh4,
        locktype: u32,
        offset: u64,
        length: u64,
        now: Instant,
    ) {
        let owner = match locker {
            Locker::New { owner, .. } => owner.owner.as_bytes().to_vec(),
            Locker::Existing { lock_stateid, .. } => match self.states.get(&lock_stateid.other) {
                Some(e) if e.clientid == clientid => e.owner.clone(),
                _ => return,
            },
        };
        let (Ok(lt), Ok((start, end))) = (LockType::from_wire(locktype), range(offset, length))
        else {
            return;
        };
        self.lock_blocked(clientid, &owner, file, fh, lt, start, end, now);
    }

    #[allow(clippy::too_many_arguments)]
    fn lock_blocked(
        &mut self,
        clientid: u64,
        owner: &[u8],
        file: FileKey,
        fh: Fh4,
        ltype: LockType,
        start: u64,
        end: u64,
        now: Instant,
    ) {
        let lease = self.cfg.lease;
        let max = self.cfg.callbacks.max_lock_waiters.max(1);
        let w = &mut self.cb.waiters;
        w.retain(|x| {
            now.saturating_duration_since(x.since) < lease
                && !(x.clientid == clientid && x.owner == owner && x.file == file)
        });
        while w.len() >= max {
            w.remove(0);
        }
        w.push(LockWaiter {
            clientid,
            owner: owner.to_vec(),
            file,
            fh,
            ltype,
            start,
            end,
            since: now,
        });
    }

    /// Locks on `file` were released: every waiter whose lock could now be granted gets a
    /// CB_NOTIFY_LOCK on a session of its client that has a back channel (and is forgotten).
    pub fn locks_released(&mut self, file: FileKey) {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.cb.waiters.len() {
            let w = &self.cb.waiters[i];
            let free = w.file == file
                && self
                    .locks
                    .conflict(file, w.clientid, &w.owner, w.ltype, w.start, w.end)
                    .is_none();
            if free {
                ready.push(self.cb.waiters.remove(i));
            } else {
                i += 1;
            }
        }
        for w in ready {
            let session = self
                .sessions
                .values()
                .filter(|s| s.clientid == w.clientid)
                .min_by_key(|s| s.back_conn.is_none())
                .map(|s| s.id);
            if let Some(session) = session {
                let owner = StateOwner4 {
                    clientid: w.clientid,
                    owner: Opaque1024::from_slice(&w.owner),
                };
                self.cb_queue(session, CbWhat::NotifyLock { fh: w.fh, owner });
            }
        }
    }

    /// A client's state is going (lease expiry, DESTROY_CLIENTID, a restarted client): its
    /// callbacks and waiters go too.
    pub(super) fn cb_forget_client(&mut self, clientid: u64) {
        let cb = &mut self.cb;
        cb.paths.remove(&clientid);
        cb.waiters.retain(|w| w.clientid != clientid);
    }

    /// The callbacks to send now, in order, within the bounds: a CB_COMPOUND waits while its
    /// session's back channel slot is taken; a callback for a session that no longer exists is
    /// dropped; one for a session without a back channel fails at once (the client's path is
    /// down).
    pub fn take_callbacks(&mut self, now: Instant) -> Vec<CbSend> {
        let mut out = Vec::new();
        let mut keep = VecDeque::new();
        let max = self.cfg.callbacks.max_in_flight.max(1);
        while let Some(job) = self.cb.queue.pop_front() {
            if self.cb.in_flight.len() >= max {
                keep.push_back(job);
                continue;
            }
            let Some(s) = self.sessions.get(&job.session) else {
                self.cb.dropped += 1;
                continue;
            };
            let clientid = s.clientid;
            let Some((program, sec, conn)) = self.callback_route(&job.session) else {
                // No back channel on this session: the client's callback path is down
                // unless another of its sessions has one that works.
                self.cb.dropped += 1;
                let other = self
                    .sessions
                    .values()
                    .any(|o| o.clientid == clientid && o.back_conn.is_some());
                if !other || job.what != CbWhat::Null {
                    self.cb.paths.insert(clientid, CbPath::Down);
                }
                continue;
            };
            let compound = job.what != CbWhat::Null;
            if compound && self.cb.busy.contains_key(&job.session) {
                keep.push_back(job);
                continue;
            }
            let (proc_, args) = match &job.what {
                CbWhat::Null => (CB_NULL, Bytes::new()),
                CbWhat::NotifyLock { fh, owner } => {
                    let Some((_, seq)) = self.next_cb_seq(&job.session) else {
                        continue;
                    };
                    let args = CbCompoundArgs {
                        tag: Tag4::from_slice(b""),
                        minorversion: self.cb.minor.get(&job.session).copied().unwrap_or(1),
                        callback_ident: 0,
                        ops: vec![
                            CbOpArgs::Sequence(CbSequenceArgs {
                                session: job.session,
                                sequenceid: seq,
                                slotid: 0,
                                highest_slotid: 0,
                                cachethis: false,
                                referring: Vec::new(),
                            }),
                            CbOpArgs::NotifyLock {
                                fh: fh.clone(),
                                owner: owner.clone(),
                            },
                        ],
                    };
                    (CB_COMPOUND, args.to_bytes())
                }
            };
            let cb = &mut self.cb;
            cb.next_id += 1;
            let id = cb.next_id;
            if compound {
                cb.busy.insert(job.session, id);
            }
            cb.in_flight.insert(
                id,
                InFlight {
                    session: job.session,
                    clientid,
                    compound,
                },
            );
            cb.sent += 1;
            out.push(CbSend {
                id,
                conn,
                session: job.session,
                program,
                sec,
                proc_,
                args,
                what: job.what,
                deadline: now + self.cfg.callbacks.timeout,
            });
        }
        self.cb.queue = keep;
        out
    }

    /// A callback ended. A reply to CB_NULL, or a CB_COMPOUND whose CB_SEQUENCE succeeded,
    /// means the path is up; anything else that it is down. A CB_COMPOUND that got no reply
    /// gives its sequence id back: the client may never have seen it (§2.10.6.1: the next
    /// call reuses the slot's sequence id only after a reply).
    pub fn callback_done(&mut self, id: u64, outcome: &CbOutcome) {
        let Some(f) = self.cb.in_flight.remove(&id) else {
            return;
        };
        if f.compound && self.cb.busy.get(&f.session) == Some(&id) {
            self.cb.busy.remove(&f.session);
        }
        let up = match outcome {
            CbOutcome::Replied(results) if f.compound => match CbCompoundRes::decode(results) {
                Ok(r) => matches!(r.results.first(), Some(CbOpRes::Sequence(Ok(_)))),
                Err(_) => false,
            },
            CbOutcome::Replied(_) => true,
            CbOutcome::Failed => {
                if f.compound
                    && let Some(s) = self.sessions.get_mut(&f.session)
                {
                    s.cb_seq = s.cb_seq.wrapping_sub(1);
                }
                false
            }
        };
        if up {
            self.cb.answered += 1;
        } else {
            self.cb.failed += 1;
        }
        if self.clients.contains_key(&f.clientid) {
            self.cb
                .paths
                .insert(f.clientid, if up { CbPath::Up } else { CbPath::Down });
        }
    }

    /// Whether callbacks are queued (the driver calls [`State::take_callbacks`] again when a
    /// callback ends).
    pub fn callbacks_queued(&self) -> bool {
        !self.cb.queue.is_empty()
    }

    /// The callback counters.
    pub fn callback_counts(&self) -> CallbackCounts {
        CallbackCounts {
            sent: self.cb.sent,
            answered: self.cb.answered,
            failed: self.cb.failed,
            dropped: self.cb.dropped,
            queued: self.cb.queue.len(),
            in_flight: self.cb.in_flight.len(),
            lock_waiters: self.cb.waiters.len(),
        }
    }
}
