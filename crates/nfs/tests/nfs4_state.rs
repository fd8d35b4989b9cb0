//! NFSv4.1 state over TCP on 127.0.0.1: share reservations and byte-range locks between two
//! clients, the current stateid, TEST_STATEID/FREE_STATEID, the OPEN create modes, truncation
//! refused under a deny, lease expiry and the grace period.

use std::os::unix::fs::MetadataExt;

use crate::nfs4_util::*;
use bytes::Bytes;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateHow, OpArgs, OpenArgs, OpenClaim};
use nfs::nfs4::consts::{attr, lock_type, op, share};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::types::{Fattr4, StateOwner4, Stateid4};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_reservations_and_locks_between_two_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();
    let mut a = Client::new(addr, "client-a", 16).await;
    let mut b = Client::new(addr, "client-b", 16).await;

    // A opens denying writes: B cannot open for write, may open for read.
    let (sid_a, fh) = open_rw(&mut a, b"oa", "shared", share::DENY_WRITE).await;
    b.fails(
        vec![
            OpArgs::Putrootfh,
            open_args(
                b"ob",
                "shared",
                share::ACCESS_WRITE,
                share::DENY_NONE,
                false,
            ),
        ],
        Nfsstat4::SHARE_DENIED,
    )
    .await;
    b.ok(vec![
        OpArgs::Putrootfh,
        open_args(b"ob", "shared", share::ACCESS_READ, share::DENY_NONE, false),
    ])
    .await;
    // Writes through the anonymous stateid are denied too (RFC 8881 §9.7).
    b.fails(
        vec![
            OpArgs::Putfh(fh4(&fh)),
            write(Stateid4::ANONYMOUS, 0, Bytes::from_static(b"x")),
        ],
        Nfsstat4::LOCKED,
    )
    .await;
    // A downgrades to deny nothing; B can then add write access.
    let r = a
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            OpArgs::OpenDowngrade {
                stateid: sid_a,
                seqid: 0,
                share_access: share::ACCESS_BOTH,
                share_deny: share::DENY_NONE,
            },
        ])
        .await;
    let sid_a = stateid_of(&r[1]);
    let r = b
        .ok(vec![
            OpArgs::Putrootfh,
            open_args(b"ob", "shared", share::ACCESS_BOTH, share::DENY_NONE, false),
        ])
        .await;
    let sid_b = stateid_of(&r[1]);

    // Byte-range locks: A holds 0..100 for write; B's overlapping LOCK and LOCKT are denied
    // with A's range; B's WRITE there is LOCKED; after A's LOCKU, B gets the lock.
    let r = a
        .ok(vec![OpArgs::Putfh(fh4(&fh)), lock(sid_a, b"la", 0, 100)])
        .await;
    let lsid_a = stateid_of(&r[1]);
    let r = b
        .fails(
            vec![OpArgs::Putfh(fh4(&fh)), lock(sid_b, b"lb", 50, 100)],
            Nfsstat4::DENIED,
        )
        .await;
    let OpRes::Denied(n, d) = &r[2] else {
        panic!("{r:?}")
    };
    assert_eq!(
        (*n, d.offset, d.length, d.locktype),
        (op::LOCK, 0, 100, lock_type::WRITE_LT)
    );
    assert_eq!(d.owner.owner.as_bytes(), b"la");
    let lockt = OpArgs::Lockt {
        locktype: lock_type::READ_LT,
        offset: 99,
        length: 1,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(b"lb"),
        },
    };
    b.fails(
        vec![OpArgs::Putfh(fh4(&fh)), lockt.clone()],
        Nfsstat4::DENIED,
    )
    .await;
    b.fails(
        vec![
            OpArgs::Putfh(fh4(&fh)),
            write(sid_b, 10, Bytes::from_static(b"x")),
        ],
        Nfsstat4::LOCKED,
    )
    .await;
    let r = a
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            OpArgs::Locku {
                locktype: lock_type::WRITE_LT,
                seqid: 0,
                stateid: lsid_a,
                offset: 0,
                length: 100,
            },
        ])
        .await;
    let lsid_a = stateid_of(&r[1]);
    b.ok(vec![OpArgs::Putfh(fh4(&fh)), lockt]).await;
    // The current stateid (RFC 8881 §16.2.3.1.2) carries LOCK's result into LOCKU.
    let r = b
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            lock(sid_b, b"lb", 50, 100),
            OpArgs::Locku {
                locktype: lock_type::WRITE_LT,
                seqid: 0,
                stateid: Stateid4::CURRENT,
                offset: 50,
                length: 100,
            },
        ])
        .await;
    assert!(matches!(r[2], OpRes::Locku(_)), "{r:?}");
    // TEST_STATEID and FREE_STATEID: A's lock stateid is valid (a foreign one is stale) and,
    // holding nothing, freed; an open stateid is not.
    let r = a
        .ok(vec![OpArgs::TestStateid(vec![
            lsid_a,
            Stateid4 {
                seqid: 0,
                other: [9; 12],
            },
        ])])
        .await;
    assert_eq!(
        r[0],
        OpRes::TestStateid(vec![Nfsstat4::OK, Nfsstat4::STALE_STATEID])
    );
    a.ok(vec![OpArgs::FreeStateid(lsid_a)]).await;
    a.fails(vec![OpArgs::FreeStateid(sid_a)], Nfsstat4::LOCKS_HELD)
        .await;
    assert_eq!(served.nfs4().unwrap().state().counts().locks, 0);
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_modes_truncation_under_deny_and_lease_expiry() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("dir")).unwrap();
    std::os::unix::fs::symlink("dir", tmp.path().join("link")).unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();
    let mut a = Client::new(addr, "open-a", 16).await;
    let mut b = Client::new(addr, "open-b", 16).await;

    // EXCLUSIVE4_1: a retransmission (same verifier) opens the same file, another verifier
    // finds it EXIST; attrset names the verifier's times and the attributes set.
    let excl = |v: u8| CreateHow::Exclusive41([v; 8], mode_attr(0o640));
    let r = a
        .ok(vec![OpArgs::Putrootfh, open_how(b"oa", "x", 0, excl(1))])
        .await;
    let OpRes::Open(o) = &r[1] else {
        panic!("{r:?}")
    };
    assert_eq!(
        o.attrset,
        mask(&[attr::MODE, attr::TIME_ACCESS_SET, attr::TIME_MODIFY_SET])
    );
    assert_eq!(
        std::fs::metadata(tmp.path().join("x")).unwrap().mode() & 0o7777,
        0o640
    );
    a.ok(vec![OpArgs::Putrootfh, open_how(b"oa", "x", 0, excl(1))])
        .await;
    a.fails(
        vec![OpArgs::Putrootfh, open_how(b"oa", "x", 0, excl(2))],
        Nfsstat4::EXIST,
    )
    .await;
    // EXCLUSIVE4 is served like EXCLUSIVE4_1 without attributes; GUARDED4 on a file that
    // exists is EXIST.
    a.ok(vec![
        OpArgs::Putrootfh,
        open_how(b"oa", "y", 0, CreateHow::Exclusive([5; 8])),
    ])
    .await;
    a.fails(
        vec![
            OpArgs::Putrootfh,
            open_how(b"oa", "y", 0, CreateHow::Guarded(Fattr4::default())),
        ],
        Nfsstat4::EXIST,
    )
    .await;
    // A directory and a symbolic link are not opened.
    a.fails(
        vec![
            OpArgs::Putrootfh,
            open_args(b"oa", "dir", share::ACCESS_READ, 0, false),
        ],
        Nfsstat4::ISDIR,
    )
    .await;
    a.fails(
        vec![
            OpArgs::Putrootfh,
            open_args(b"oa", "link", share::ACCESS_READ, 0, false),
        ],
        Nfsstat4::SYMLINK,
    )
    .await;

    // A holds "t" denying writes: B's OPEN that would truncate it is refused before the file
    // changes.
    std::fs::write(tmp.path().join("t"), b"keep me").unwrap();
    a.ok(vec![
        OpArgs::Putrootfh,
        open_args(b"oa", "t", share::ACCESS_READ, share::DENY_WRITE, false),
    ])
    .await;
    b.fails(
        vec![
            OpArgs::Putrootfh,
            open_how(b"ob", "t", 0, CreateHow::Unchecked(size_attr(0))),
        ],
        Nfsstat4::SHARE_DENIED,
    )
    .await;
    assert_eq!(std::fs::read(tmp.path().join("t")).unwrap(), b"keep me");
    // CLAIM_FH opens the current filehandle.
    let r = b
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("t")),
            OpArgs::Open(Box::new(OpenArgs {
                seqid: 0,
                share_access: share::ACCESS_READ,
                share_deny: 0,
                owner: StateOwner4 {
                    clientid: 0,
                    owner: owner(b"ob"),
                },
                create: None,
                claim: OpenClaim::Fh,
            })),
            read(Stateid4::CURRENT, 0, 4),
        ])
        .await;
    assert_eq!(
        r[3],
        OpRes::Read {
            eof: false,
            data: Bytes::from_static(b"keep")
        }
    );

    // Leases: once A's lease has run out (the expiry is driven with a time 100 s ahead, no
    // waiting), its session and opens are gone.
    let v4 = served.nfs4().unwrap();
    let before = v4.state().counts();
    assert_eq!((before.clients, before.sessions), (2, 2));
    v4.expire(std::time::Instant::now() + std::time::Duration::from_secs(100));
    assert_eq!(v4.state().counts(), Default::default());
    a.fails(vec![OpArgs::Putrootfh], Nfsstat4::BADSESSION).await;
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_period_accepts_only_reclaims() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"data").unwrap();
    let mut cfg = nfs::serve::ServeConfig::new(tmp.path());
    cfg.tcp = Some(local());
    cfg.portmap = None;
    // The default: a grace period of one lease after the start (RFC 8881 §8.4.2).
    let served = nfs::serve::start(cfg).await.unwrap();
    let mut c = Client::before_reclaim_complete(served.nfs_addr.unwrap(), "grace", 16).await;
    c.fails(
        vec![
            OpArgs::Putrootfh,
            open_args(b"o", "f", share::ACCESS_READ, 0, false),
        ],
        Nfsstat4::GRACE,
    )
    .await;
    let reclaim = OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: share::ACCESS_READ,
        share_deny: 0,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(b"o"),
        },
        create: None,
        claim: OpenClaim::Previous(0),
    }));
    c.ok(vec![
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("f")),
        reclaim.clone(),
    ])
    .await;
    c.ok(vec![OpArgs::ReclaimComplete(false)]).await;
    c.fails(
        vec![OpArgs::Putrootfh, OpArgs::Lookup(name("f")), reclaim],
        Nfsstat4::NO_GRACE,
    )
    .await;
    served.shutdown().await;
}

/// An open keeps its file for the opener: after another name is renamed over it (which
/// unlinks it), PUTFH of its handle and CLOSE still succeed (pynfs RNM21), and the state is
/// gone after the CLOSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_after_rename_unlinked_the_open_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("other"), b"x").unwrap();
    let served = serve(tmp.path()).await;
    let mut c = Client::new(served.nfs_addr.unwrap(), "rnm21", 16).await;
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            open_args(b"o", "target", share::ACCESS_BOTH, 0, true),
            OpArgs::Getfh,
        ])
        .await;
    let sid = stateid_of(&r[1]);
    let fh = fh_of(&r[2]);
    c.ok(vec![
        OpArgs::Putrootfh,
        OpArgs::Savefh,
        OpArgs::Rename {
            old: name("other"),
            new: name("target"),
        },
    ])
    .await;
    assert_eq!(std::fs::read(tmp.path().join("target")).unwrap(), b"x");
    c.ok(vec![
        OpArgs::Putfh(fh.clone()),
        OpArgs::Close {
            seqid: 0,
            stateid: sid,
        },
    ])
    .await;
    // The stateid went with the CLOSE.
    c.fails(
        vec![
            OpArgs::Putfh(fh),
            OpArgs::Close {
                seqid: 0,
                stateid: sid,
            },
        ],
        Nfsstat4::BAD_STATEID,
    )
    .await;
    served.shutdown().await;
}
