//! Tests of the state core, driven with an explicit clock.

use std::time::{Duration, Instant};

use super::super::args::{CreateSessionArgs, Locker, SequenceArgs};
use super::super::compound::CompoundReply;
use super::super::consts::{exchgid, lock_type, share};
use super::super::status::Nfsstat4;
use super::super::types::{
    ChannelAttrs4, ClientOwner4, Opaque1024, ServerOwner4, SessionId4, StateOwner4, Stateid4,
};
use super::*;

fn cfg() -> StateConfig {
    StateConfig {
        lease: Duration::from_secs(10),
        grace: Duration::from_secs(0),
        max_clients: 4,
        max_stateids_per_client: 8,
        max_locks_per_client: 8,
        ..StateConfig::default()
    }
}

fn ident() -> ServerIdentity {
    ServerIdentity {
        owner: ServerOwner4 {
            minor_id: 0,
            major_id: Opaque1024::from_slice(b"srv"),
        },
        scope: b"srv".to_vec(),
        impl_domain: b"oxrdma".to_vec(),
        impl_name: b"test".to_vec(),
    }
}

fn owner(name: &[u8], verf: u8) -> ClientOwner4 {
    ClientOwner4 {
        verifier: [verf; 8],
        ownerid: Opaque1024::from_slice(name),
    }
}

fn chan() -> ChannelAttrs4 {
    ChannelAttrs4 {
        headerpadsize: 0,
        maxrequestsize: 1 << 20,
        maxresponsesize: 1 << 20,
        maxresponsesize_cached: 4096,
        maxoperations: 16,
        maxrequests: 4,
        rdma_ird: None,
    }
}

fn cs(clientid: u64, sequence: u32) -> CreateSessionArgs {
    CreateSessionArgs {
        clientid,
        sequence,
        flags: 0,
        fore: chan(),
        back: chan(),
        cb_program: 0,
        sec: vec![],
    }
}

/// A confirmed client with one session.
/// A client as Linux sets one up: EXCHANGE_ID, CREATE_SESSION, then RECLAIM_COMPLETE (with
/// nothing to reclaim), after which it may take new opens and locks.
fn client(st: &mut State, name: &[u8], now: Instant) -> (u64, SessionId4) {
    let (c, s) = client_before_recc(st, name, now);
    st.reclaim_complete(c, false).unwrap();
    (c, s)
}

fn client_before_recc(st: &mut State, name: &[u8], now: Instant) -> (u64, SessionId4) {
    let x = st
        .exchange_id(&owner(name, 1), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    let s = st
        .create_session(
            &cs(x.clientid, x.sequenceid),
            Principal::Sys(0),
            1,
            false,
            now,
        )
        .unwrap();
    (x.clientid, s.session)
}

fn seq(session: SessionId4, slot: u32, sequenceid: u32) -> SequenceArgs {
    SequenceArgs {
        session,
        sequenceid,
        slotid: slot,
        highest_slotid: slot,
        cachethis: true,
    }
}

const F: FileKey = FileKey { fsid: 1, ino: 42 };

#[test]
fn exchange_id_cases_of_rfc8881_18_35_5() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let a = st
        .exchange_id(&owner(b"c", 1), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    assert_eq!(
        a.flags & exchgid::CONFIRMED_R,
        0,
        "case 1: a new, unconfirmed record"
    );
    assert_eq!(a.flags & exchgid::MASK_PNFS, exchgid::USE_NON_PNFS);
    // Case 4: an unconfirmed record is replaced by one with a new client ID, even with the
    // same verifier and principal; the old ID is stale.
    let again = st
        .exchange_id(&owner(b"c", 1), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    assert_ne!(again.clientid, a.clientid);
    assert_eq!(
        st.create_session(
            &cs(a.clientid, a.sequenceid),
            Principal::Sys(0),
            1,
            false,
            now
        )
        .unwrap_err(),
        Nfsstat4::STALE_CLIENTID
    );
    let a = again;
    st.create_session(
        &cs(a.clientid, a.sequenceid),
        Principal::Sys(0),
        1,
        false,
        now,
    )
    .unwrap();
    // Case 2: confirmed, same verifier: the same clientid, flagged confirmed.
    let b = st
        .exchange_id(&owner(b"c", 1), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    assert_eq!(b.clientid, a.clientid);
    assert_ne!(b.flags & exchgid::CONFIRMED_R, 0);
    // Case 3: another principal while the record holds state (a session).
    assert_eq!(
        st.exchange_id(&owner(b"c", 1), 0, Principal::Sys(5), &ident(), now)
            .unwrap_err(),
        Nfsstat4::CLID_INUSE
    );
    // Case 5: the client restarted (new verifier): a new record; confirming it purges the old.
    let c = st
        .exchange_id(&owner(b"c", 2), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    assert_ne!(c.clientid, a.clientid);
    st.create_session(
        &cs(c.clientid, c.sequenceid),
        Principal::Sys(0),
        2,
        false,
        now,
    )
    .unwrap();
    assert_eq!(st.counts().clients, 1);
    assert_eq!(
        st.counts().sessions,
        1,
        "the old client's session went with it"
    );
    // Updates: only of a confirmed record, with its verifier.
    assert_eq!(
        st.exchange_id(
            &owner(b"zz", 1),
            exchgid::UPD_CONFIRMED_REC_A,
            Principal::Sys(0),
            &ident(),
            now
        )
        .unwrap_err(),
        Nfsstat4::NOENT
    );
    assert_eq!(
        st.exchange_id(
            &owner(b"c", 9),
            exchgid::UPD_CONFIRMED_REC_A,
            Principal::Sys(0),
            &ident(),
            now
        )
        .unwrap_err(),
        Nfsstat4::NOT_SAME
    );
    assert_eq!(
        st.exchange_id(&owner(b"c", 2), 0x8, Principal::Sys(0), &ident(), now)
            .unwrap_err(),
        Nfsstat4::INVAL,
        "flags a client may not send"
    );
}

#[test]
fn create_session_replays_and_rejects_misordered() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let x = st
        .exchange_id(&owner(b"c", 1), 0, Principal::Sys(0), &ident(), now)
        .unwrap();
    let first = st
        .create_session(
            &cs(x.clientid, x.sequenceid),
            Principal::Sys(0),
            1,
            false,
            now,
        )
        .unwrap();
    let replay = st
        .create_session(
            &cs(x.clientid, x.sequenceid),
            Principal::Sys(0),
            1,
            false,
            now,
        )
        .unwrap();
    assert_eq!(
        first, replay,
        "a retransmission gets the cached reply, no second session"
    );
    assert_eq!(st.counts().sessions, 1);
    assert_eq!(
        st.create_session(
            &cs(x.clientid, x.sequenceid + 5),
            Principal::Sys(0),
            1,
            false,
            now
        )
        .unwrap_err(),
        Nfsstat4::SEQ_MISORDERED
    );
    assert_eq!(
        st.create_session(&cs(999, 1), Principal::Sys(0), 1, false, now)
            .unwrap_err(),
        Nfsstat4::STALE_CLIENTID
    );
    let mut small = cs(x.clientid, x.sequenceid + 1);
    small.fore.maxrequestsize = 16;
    assert_eq!(
        st.create_session(&small, Principal::Sys(0), 1, false, now)
            .unwrap_err(),
        Nfsstat4::TOOSMALL
    );
    // Unknown flags are NFS4ERR_INVAL.
    let mut flagged = cs(x.clientid, x.sequenceid + 1);
    flagged.flags = 0xf;
    assert_eq!(
        st.create_session(&flagged, Principal::Sys(0), 1, false, now)
            .unwrap_err(),
        Nfsstat4::INVAL
    );
    // Neither refusal used the sequence id: the same one now succeeds.
    let ok = st
        .create_session(
            &cs(x.clientid, x.sequenceid + 1),
            Principal::Sys(0),
            1,
            false,
            now,
        )
        .unwrap();
    assert!(ok.fore.maxrequests <= 4 && ok.fore.rdma_ird.is_none());
}

#[test]
fn sequence_slots_follow_rfc8881_2_10_6_1() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let (_, sid) = client(&mut st, b"c", now);
    let SeqOutcome::New { slot, .. } = st.sequence(&seq(sid, 0, 1), 1, now).unwrap() else {
        panic!("first request is new");
    };
    // While it executes, a retransmission waits.
    assert_eq!(
        st.sequence(&seq(sid, 0, 1), 1, now).unwrap_err(),
        Nfsstat4::DELAY
    );
    let reply = CompoundReply {
        status: Nfsstat4::OK,
        tag: bytes::Bytes::from_static(b"t"),
        results: vec![],
    };
    st.slot_done(slot, &reply);
    assert_eq!(
        st.sequence(&seq(sid, 0, 1), 1, now).unwrap(),
        SeqOutcome::Replay(reply)
    );
    assert_eq!(
        st.sequence(&seq(sid, 0, 3), 1, now).unwrap_err(),
        Nfsstat4::SEQ_MISORDERED
    );
    assert_eq!(
        st.sequence(&seq(sid, 9, 1), 1, now).unwrap_err(),
        Nfsstat4::BADSLOT
    );
    assert_eq!(
        st.sequence(&seq([9; 16], 0, 1), 1, now).unwrap_err(),
        Nfsstat4::BADSESSION
    );
    // Not cached: a retransmission gets RETRY_UNCACHED_REP.
    let mut a = seq(sid, 1, 1);
    a.cachethis = false;
    let SeqOutcome::New { slot, .. } = st.sequence(&a, 1, now).unwrap() else {
        panic!()
    };
    st.slot_done(
        slot,
        &CompoundReply {
            status: Nfsstat4::OK,
            tag: bytes::Bytes::new(),
            results: vec![],
        },
    );
    assert_eq!(
        st.sequence(&a, 1, now).unwrap_err(),
        Nfsstat4::RETRY_UNCACHED_REP
    );
}

fn so(name: &[u8]) -> Vec<u8> {
    name.to_vec()
}

#[test]
fn share_reservations_conflict_between_owners_only() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let (c1, _) = client(&mut st, b"a", now);
    let (c2, _) = client(&mut st, b"b", now);
    let o1 = st
        .open(c1, &so(b"o1"), F, share::ACCESS_READ, share::DENY_WRITE)
        .unwrap();
    assert_eq!(
        st.open(c2, &so(b"o2"), F, share::ACCESS_WRITE, 0)
            .unwrap_err(),
        Nfsstat4::SHARE_DENIED
    );
    assert_eq!(
        st.open(c2, &so(b"o2"), F, share::ACCESS_READ, share::DENY_READ)
            .unwrap_err(),
        Nfsstat4::SHARE_DENIED
    );
    let o2 = st.open(c2, &so(b"o2"), F, share::ACCESS_READ, 0).unwrap();
    // The same owner widens its own open: same other, next seqid.
    let again = st
        .open(c1, &so(b"o1"), F, share::ACCESS_BOTH, share::DENY_WRITE)
        .unwrap();
    assert_eq!(again.stateid.other, o1.stateid.other);
    assert_eq!(again.stateid.seqid, 2);
    assert_eq!(
        st.check_io(Some(c1), &o1.stateid, F, false).unwrap_err(),
        Nfsstat4::OLD_STATEID
    );
    assert!(st.check_io(Some(c1), &again.stateid, F, true).is_ok());
    assert_eq!(
        st.check_io(Some(c2), &o2.stateid, F, true).unwrap_err(),
        Nfsstat4::OPENMODE
    );
    assert_eq!(
        st.check_io(None, &Stateid4::ANONYMOUS, F, true)
            .unwrap_err(),
        Nfsstat4::LOCKED,
        "deny write holds for anonymous I/O"
    );
    assert!(st.check_io(None, &Stateid4::BYPASS, F, false).is_ok());
    assert_eq!(
        st.check_io(Some(c2), &again.stateid, F, false).unwrap_err(),
        Nfsstat4::BAD_STATEID,
        "another client's stateid"
    );
    let down = st
        .open_downgrade(c1, &again.stateid, F, share::ACCESS_READ, 0)
        .unwrap();
    assert_eq!(down.seqid, 3);
    assert_eq!(
        st.open_downgrade(c1, &down, F, share::ACCESS_BOTH, 0)
            .unwrap_err(),
        Nfsstat4::INVAL
    );
    st.close(c1, &down, F).unwrap();
    assert_eq!(st.opens_on(F), 1);
    let mut stale = down;
    stale.other[0] ^= 0xff;
    assert_eq!(
        st.check_io(Some(c1), &stale, F, false).unwrap_err(),
        Nfsstat4::STALE_STATEID
    );
}

fn lo(c: u64, name: &[u8]) -> StateOwner4 {
    StateOwner4 {
        clientid: c,
        owner: Opaque1024::from_slice(name),
    }
}

#[test]
fn byte_range_locks_conflict_upgrade_split_and_release() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let (c1, _) = client(&mut st, b"a", now);
    let (c2, _) = client(&mut st, b"b", now);
    let op1 = st
        .open(c1, &so(b"o1"), F, share::ACCESS_BOTH, 0)
        .unwrap()
        .stateid;
    let op2 = st
        .open(c2, &so(b"o2"), F, share::ACCESS_BOTH, 0)
        .unwrap()
        .stateid;
    let new = |open: Stateid4, c: u64, n: &[u8]| Locker::New {
        open_seqid: 0,
        open_stateid: open,
        lock_seqid: 0,
        owner: lo(c, n),
    };
    let l1 = st
        .lock(
            c1,
            lock_type::WRITE_LT,
            false,
            0,
            100,
            &new(op1, c1, b"L1"),
            F,
            now,
        )
        .unwrap();
    // Another owner: denied, told who holds what.
    let denied = st
        .lock(
            c2,
            lock_type::READ_LT,
            false,
            50,
            10,
            &new(op2, c2, b"L2"),
            F,
            now,
        )
        .unwrap_err();
    let LockError::Denied(d) = denied else {
        panic!("{denied:?}")
    };
    assert_eq!(
        (d.offset, d.length, d.locktype),
        (0, 100, lock_type::WRITE_LT)
    );
    assert_eq!(
        st.counts().lock_stateids,
        1,
        "the refused LOCK left no stateid behind"
    );
    assert!(matches!(
        st.lockt(c2, lock_type::WRITE_LT, 99, 1, &lo(c2, b"L2"), F, now),
        Err(LockError::Denied(_))
    ));
    assert!(
        st.lockt(c2, lock_type::WRITE_LT, 100, 1, &lo(c2, b"L2"), F, now)
            .is_ok()
    );
    // Downgrade the middle to read: three ranges of the same owner.
    let ex = Locker::Existing {
        lock_stateid: l1,
        lock_seqid: 0,
    };
    let l1b = st
        .lock(c1, lock_type::READ_LT, false, 40, 20, &ex, F, now)
        .unwrap();
    assert_eq!(l1b.seqid, l1.seqid + 1);
    let ranges: Vec<_> = st
        .locks_on(F)
        .iter()
        .map(|r| (r.start, r.end, r.ltype))
        .collect();
    assert_eq!(
        ranges,
        vec![
            (0, 39, LockType::Write),
            (40, 59, LockType::Read),
            (60, 99, LockType::Write)
        ]
    );
    // Now another owner may read-lock the middle.
    let l2 = st
        .lock(
            c2,
            lock_type::READ_LT,
            false,
            45,
            5,
            &new(op2, c2, b"L2"),
            F,
            now,
        )
        .unwrap();
    // I/O checks against locks: c2 cannot write into c1's write range.
    assert_eq!(
        st.check_io_locks(Some(c2), &l2, F, 0, 10, true)
            .unwrap_err(),
        Nfsstat4::LOCKED
    );
    assert!(st.check_io_locks(Some(c2), &l2, F, 45, 5, false).is_ok());
    // CLOSE with locks held fails; LOCKU splits; then CLOSE works.
    assert_eq!(st.close(c1, &op1, F).unwrap_err(), Nfsstat4::LOCKS_HELD);
    let u = st
        .locku(c1, lock_type::WRITE_LT, &l1b, 0, u64::MAX, F)
        .unwrap();
    assert!(st.locks_on(F).iter().all(|r| r.clientid == c2));
    assert_eq!(st.free_stateid(c1, &u), Ok(()));
    st.close(c1, &op1, F).unwrap();
    // Ranges: zero length and overflow are INVAL.
    assert_eq!(
        st.locku(c2, lock_type::READ_LT, &l2, 0, 0, F).unwrap_err(),
        Nfsstat4::INVAL
    );
    assert_eq!(
        st.locku(c2, lock_type::READ_LT, &l2, u64::MAX, 2, F)
            .unwrap_err(),
        Nfsstat4::INVAL
    );
    // Lease expiry releases c2's locks.
    let later = now + Duration::from_secs(11);
    let expired = st.poll(later);
    assert_eq!(expired.len(), 2);
    assert!(st.locks_on(F).is_empty());
    assert_eq!(st.counts(), StateCounts::default());
}

#[test]
fn grace_period_admits_only_reclaims() {
    let now = Instant::now();
    let mut c = cfg();
    c.grace = Duration::from_secs(5);
    let mut st = State::new(c, 7, now);
    let (c1, _) = client_before_recc(&mut st, b"a", now);
    assert_eq!(st.check_grace(c1, false, now), Err(Nfsstat4::GRACE));
    assert_eq!(st.check_grace(c1, true, now), Ok(()));
    st.reclaim_complete(c1, false).unwrap();
    assert_eq!(
        st.reclaim_complete(c1, false),
        Err(Nfsstat4::COMPLETE_ALREADY)
    );
    assert_eq!(st.check_grace(c1, true, now), Err(Nfsstat4::NO_GRACE));
    let after = now + Duration::from_secs(6);
    assert_eq!(st.check_grace(c1, false, after), Ok(()));
    assert_eq!(st.check_grace(c1, true, after), Err(Nfsstat4::NO_GRACE));
}

#[test]
fn new_locks_wait_for_reclaim_complete_even_after_grace() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let later = now + Duration::from_secs(3600);
    st.end_grace(later);
    let (c1, _) = client_before_recc(&mut st, b"a", later);
    assert!(!st.in_grace(later));
    assert_eq!(st.check_grace(c1, false, later), Err(Nfsstat4::GRACE));
    st.reclaim_complete(c1, false).unwrap();
    assert_eq!(st.check_grace(c1, false, later), Ok(()));
}

#[test]
fn client_collision_on_a_record_without_state_replaces_it_at_once() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let (c1, sid) = client(&mut st, b"c", now);
    st.destroy_session(&sid).unwrap();
    // Case 3 of §18.35.5 with no state: another principal and verifier take the owner.
    let x = st
        .exchange_id(&owner(b"c", 2), 0, Principal::Sys(5), &ident(), now)
        .unwrap();
    assert_ne!(x.clientid, c1);
    assert_eq!(
        st.create_session(&cs(c1, 2), Principal::Sys(0), 1, false, now)
            .unwrap_err(),
        Nfsstat4::STALE_CLIENTID
    );
    assert_eq!(st.counts().clients, 1);
}

#[test]
fn tables_are_bounded() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    for i in 0..4u8 {
        st.exchange_id(&owner(&[i], 1), 0, Principal::Sys(0), &ident(), now)
            .unwrap();
    }
    assert_eq!(
        st.exchange_id(&owner(b"x", 1), 0, Principal::Sys(0), &ident(), now)
            .unwrap_err(),
        Nfsstat4::DELAY,
        "a full client table"
    );
    let mut st = State::new(cfg(), 7, now);
    let (c1, _) = client(&mut st, b"a", now);
    for i in 0..8u64 {
        st.open(
            c1,
            &so(b"o"),
            FileKey { fsid: 1, ino: i },
            share::ACCESS_READ,
            0,
        )
        .unwrap();
    }
    assert_eq!(
        st.open(
            c1,
            &so(b"o"),
            FileKey { fsid: 1, ino: 99 },
            share::ACCESS_READ,
            0
        )
        .unwrap_err(),
        Nfsstat4::RESOURCE
    );
    let tests = st.test_stateids(
        c1,
        &[
            Stateid4::ANONYMOUS,
            Stateid4 {
                seqid: 1,
                other: [7; 12],
            },
        ],
    );
    assert_eq!(tests, vec![Nfsstat4::BAD_STATEID, Nfsstat4::STALE_STATEID]);
}

#[test]
fn destroy_clientid_needs_no_sessions() {
    let now = Instant::now();
    let mut st = State::new(cfg(), 7, now);
    let (c1, s1) = client(&mut st, b"a", now);
    assert_eq!(st.destroy_clientid(c1), Err(Nfsstat4::CLIENTID_BUSY));
    st.destroy_session(&s1).unwrap();
    assert_eq!(st.destroy_session(&s1), Err(Nfsstat4::BADSESSION));
    st.destroy_clientid(c1).unwrap();
    assert_eq!(st.destroy_clientid(c1), Err(Nfsstat4::STALE_CLIENTID));
}
