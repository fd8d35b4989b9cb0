//! NFSv4.1/4.2 end to end over TCP on 127.0.0.1, against the in-process server that also
//! serves NFSv3 on the same port: the Linux mount sequence, data integrity, share
//! reservations and byte-range locks between two clients, the reply cache, the COMPOUND rules
//! (minor versions, OP_ILLEGAL, NOTSUPP, TOO_MANY_OPS, SEQUENCE placement), READDIR of a large
//! directory, SETATTR/VERIFY/NVERIFY, the namespace operations and SEEK/ALLOCATE/DEALLOCATE.

mod nfs4_util;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use bytes::Bytes;
use nfs::client::Nfs3Client;
use nfs::nfs3::{Fh3, Nfsstat3};
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateHow, CreateType, Locker, OpArgs, OpenArgs, OpenClaim};
use nfs::nfs4::client_codec::encode_compound;
use nfs::nfs4::compound::CompoundReply;
use nfs::nfs4::consts::{attr, content, lock_type, op, share, stable};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::types::{Fattr4, Linktext4, StateOwner4, Stateid4};
use nfs4_util::*;
use oncrpc::{AcceptStat, RpcError};

fn open_args(owner_name: &[u8], file: &str, access: u32, deny: u32, create: bool) -> OpArgs {
    OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: access,
        share_deny: deny,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(owner_name),
        },
        create: create.then(|| CreateHow::Unchecked(mode_attr(0o644))),
        claim: OpenClaim::Null(name(file)),
    }))
}

fn write(sid: Stateid4, offset: u64, data: Bytes) -> OpArgs {
    OpArgs::Write {
        stateid: sid,
        offset,
        stable: stable::FILE_SYNC4,
        data,
    }
}

fn read(sid: Stateid4, offset: u64, count: u32) -> OpArgs {
    OpArgs::Read {
        stateid: sid,
        offset,
        count,
    }
}

/// OPEN `file` in the root for read and write (created if missing); its stateid and handle.
async fn open_rw(c: &mut Client, owner_name: &[u8], file: &str, deny: u32) -> (Stateid4, Fattr4) {
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            open_args(owner_name, file, share::ACCESS_BOTH, deny, true),
            OpArgs::Getfh,
        ])
        .await;
    let fh = fh_of(&r[2]);
    (
        stateid_of(&r[1]),
        Fattr4 {
            mask: Default::default(),
            vals: Bytes::copy_from_slice(fh.as_bytes()),
        },
    )
}

fn fh4(f: &Fattr4) -> nfs::nfs4::types::Fh4 {
    nfs::nfs4::types::Fh4::from_slice(&f.vals)
}

fn u32_attr(r: &OpRes) -> u32 {
    let OpRes::Getattr(f) = r else {
        panic!("not GETATTR: {r:?}")
    };
    u32::from_be_bytes(f.vals[..4].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_mount_sequence_and_file_io() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();

    // NULL, then the mount sequence of the facts file.
    rpc(addr, 4).await.null().await.unwrap();
    let mut c = Client::new(addr, "linux-client", 16).await;
    c.ok(vec![OpArgs::ReclaimComplete(false)]).await;
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Getattr(mask(&[attr::LEASE_TIME])),
        ])
        .await;
    assert_eq!(u32_attr(&r[1]), 90);
    let r = c
        .ok(vec![OpArgs::Putrootfh, OpArgs::SecinfoNoName(0)])
        .await;
    assert_eq!(r[1], OpRes::Secinfo(op::SECINFO_NO_NAME, vec![1, 0]));
    // SECINFO_NO_NAME consumed the filehandle (RFC 8881 §2.6.3.1.1.8).
    c.fails(
        vec![OpArgs::Putrootfh, OpArgs::SecinfoNoName(0), OpArgs::Getfh],
        Nfsstat4::NOFILEHANDLE,
    )
    .await;
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Getfh,
            OpArgs::Getattr(mask(&[attr::TYPE])),
        ])
        .await;
    let root = fh_of(&r[1]);
    // The same handle NFSv3 hands out for the export root.
    let v3_root = served.server().export().root_handle().unwrap();
    assert_eq!(root.as_bytes(), v3_root.as_bytes());
    assert_eq!(u32_attr(&r[2]), 2, "NF4DIR");
    let r = c
        .ok(vec![
            OpArgs::Putfh(root.clone()),
            OpArgs::Lookup(name("sub")),
            OpArgs::Getfh,
            OpArgs::Getattr(mask(&[attr::TYPE])),
        ])
        .await;
    assert_eq!(u32_attr(&r[3]), 2);
    c.fails(
        vec![OpArgs::Putfh(root.clone()), OpArgs::Lookup(name("missing"))],
        Nfsstat4::NOENT,
    )
    .await;
    c.fails(vec![OpArgs::Putfh(root), OpArgs::Lookupp], Nfsstat4::NOENT)
        .await;

    // OPEN / WRITE / READ / CLOSE, bit-exact, at awkward sizes.
    let data = pattern(300_001, 7);
    let (sid, fh) = open_rw(&mut c, b"owner1", "file", share::DENY_NONE).await;
    let mut off = 0usize;
    for chunk in data.chunks(65_537) {
        let r = c
            .ok(vec![
                OpArgs::Putfh(fh4(&fh)),
                write(sid, off as u64, Bytes::copy_from_slice(chunk)),
            ])
            .await;
        let OpRes::Write {
            count,
            committed,
            verf,
        } = &r[1]
        else {
            panic!("{r:?}")
        };
        assert_eq!(*count as usize, chunk.len());
        assert_eq!(*committed, stable::FILE_SYNC4);
        assert_eq!(*verf, served.nfs4().unwrap().write_verifier());
        off += chunk.len();
    }
    assert_eq!(std::fs::read(tmp.path().join("file")).unwrap(), data);
    let mut got = Vec::new();
    loop {
        let r = c
            .ok(vec![
                OpArgs::Putfh(fh4(&fh)),
                read(sid, got.len() as u64, 100_000),
            ])
            .await;
        let OpRes::Read { eof, data } = &r[1] else {
            panic!("{r:?}")
        };
        got.extend_from_slice(data);
        if *eof {
            break;
        }
        assert!(got.len() < 1_000_000, "bounded");
    }
    assert_eq!(Bytes::from(got), data);
    let r = c
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            OpArgs::Commit {
                offset: 0,
                count: 0,
            },
            OpArgs::Close {
                seqid: 0,
                stateid: sid,
            },
        ])
        .await;
    assert_eq!(r[1], OpRes::Commit(served.nfs4().unwrap().write_verifier()));
    // The stateid is gone with the open.
    c.fails(
        vec![OpArgs::Putfh(fh4(&fh)), read(sid, 0, 10)],
        Nfsstat4::BAD_STATEID,
    )
    .await;
    // The anonymous stateid still reads (no share reservation denies it).
    let r = c
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            read(Stateid4::ANONYMOUS, 0, 10),
        ])
        .await;
    assert_eq!(
        r[1],
        OpRes::Read {
            eof: false,
            data: data.slice(..10)
        }
    );

    // NFSv3 on the same port, at the same time, sees the same file.
    let v3 = Nfs3Client::new(std::sync::Arc::new(
        oncrpc::TcpClient::connect(addr).await.unwrap(),
    ))
    .with_auth_sys(me().0, me().1, vec![]);
    let fh3 = Fh3(Bytes::copy_from_slice(fh4(&fh).as_bytes()));
    let r = v3.read(&fh3, 0, 16).await.unwrap().into_result().unwrap();
    assert_eq!(r.data.0, data.slice(..16));
    let bad = Fh3(Bytes::from_static(&[1; 32]));
    assert!(matches!(
        v3.getattr(&bad).await.unwrap().into_result(),
        Err(nfs::client::ClientError::Status(Nfsstat3::BadHandle))
    ));
    // Versions outside 3..4 get PROG_MISMATCH with that range.
    match rpc(addr, 5).await.null().await {
        Err(RpcError::Accepted(AcceptStat::ProgMismatch { low: 3, high: 4 })) => {}
        other => panic!("{other:?}"),
    }
    served.shutdown().await;
}

fn lock(sid: Stateid4, who: &[u8], offset: u64, length: u64) -> OpArgs {
    OpArgs::Lock {
        locktype: lock_type::WRITE_LT,
        reclaim: false,
        offset,
        length,
        locker: Locker::New {
            open_seqid: 0,
            open_stateid: sid,
            lock_seqid: 0,
            owner: StateOwner4 {
                clientid: 0,
                owner: owner(who),
            },
        },
    }
}

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
async fn compound_rules_and_the_reply_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();
    let raw = rpc(addr, 4).await;

    // Minor versions 0 and 3: MINOR_VERS_MISMATCH, no results, the tag echoed.
    for minor in [0, 3] {
        let b = compound(&raw, b"my-tag", minor, &[OpArgs::Putrootfh]).await;
        let r = CompoundReply::decode(&b).unwrap();
        assert_eq!(r.status, Nfsstat4::MINOR_VERS_MISMATCH);
        assert!(r.results.is_empty());
        assert_eq!(&r.tag[..], b"my-tag");
    }
    // Without SEQUENCE: OP_NOT_IN_SESSION, or NOT_ONLY_OP for a session-less operation with
    // company; an undefined operation is OP_ILLEGAL wherever it is.
    let r = compound_reply(&raw, 1, &[OpArgs::Putrootfh, OpArgs::Getfh]).await;
    assert_eq!(
        r.results,
        vec![OpRes::Status(op::PUTROOTFH, Nfsstat4::OP_NOT_IN_SESSION)]
    );
    let r = compound_reply(&raw, 1, &[OpArgs::DestroyClientid(1), OpArgs::Putrootfh]).await;
    assert_eq!(r.status, Nfsstat4::NOT_ONLY_OP);
    let r = compound_reply(&raw, 1, &[OpArgs::Illegal(9999)]).await;
    assert_eq!(
        r.results,
        vec![OpRes::Status(ILLEGAL_OP, Nfsstat4::OP_ILLEGAL)]
    );
    // Arguments that do not decode: BADXDR, the COMPOUND stops.
    let mut args = encode_compound(b"", 1, &[]).to_vec();
    args[11] = 1; // one operation...
    args.extend_from_slice(&op::LOOKUP.to_be_bytes()); // ...whose name is missing
    let b = raw
        .call(1, move |e| e.put_raw(&args), Default::default())
        .await
        .unwrap();
    let r = CompoundReply::decode(&b).unwrap();
    assert_eq!(r.results, vec![OpRes::Status(op::LOOKUP, Nfsstat4::BADXDR)]);

    let mut c = Client::new(addr, "rules", 8).await;
    // Operations 4.1 defines but this server does not implement: NOTSUPP; undefined: ILLEGAL.
    let r = c
        .fails(
            vec![OpArgs::Putrootfh, OpArgs::Unsupported(op::LAYOUTGET)],
            Nfsstat4::NOTSUPP,
        )
        .await;
    assert_eq!(r[2].opnum(), op::LAYOUTGET);
    let r = c
        .fails(vec![OpArgs::Illegal(op::SEEK)], Nfsstat4::OP_ILLEGAL)
        .await;
    assert_eq!(r[1].opnum(), op::ILLEGAL, "SEEK is not a 4.1 operation");
    // SEQUENCE anywhere but first: SEQUENCE_POS.
    let s = c.sequence(99, false);
    c.fails(vec![OpArgs::Putrootfh, s], Nfsstat4::SEQUENCE_POS)
        .await;
    // More operations than the session's ca_maxoperations (8): TOO_MANY_OPS from SEQUENCE,
    // and the slot's sequence id is not consumed.
    let r = c.call(vec![OpArgs::Putrootfh; 8]).await;
    assert_eq!(r.results.len(), 1);
    assert_eq!(r.status, Nfsstat4::TOO_MANY_OPS);
    c.seq -= 1;
    c.ok(vec![OpArgs::Putrootfh; 7]).await;

    // The reply cache: a retransmission (same slot and sequence id) with sa_cachethis gets the
    // first reply byte for byte, even after the state changed in between.
    std::fs::write(tmp.path().join("f"), b"12345").unwrap();
    c.seq += 1;
    let ops = vec![
        c.sequence(c.seq, true),
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("f")),
        OpArgs::Getattr(mask(&[attr::SIZE])),
    ];
    let first = compound(&c.rpc, b"replay", 1, &ops).await;
    std::fs::write(tmp.path().join("f"), b"1234567890").unwrap();
    let again = compound(&c.rpc, b"replay", 1, &ops).await;
    assert_eq!(first, again);
    // Without sa_cachethis, a retransmission is RETRY_UNCACHED_REP.
    c.seq += 1;
    let ops = vec![c.sequence(c.seq, false), OpArgs::Putrootfh];
    compound(&c.rpc, b"", 1, &ops).await;
    let r = CompoundReply::decode(&compound(&c.rpc, b"", 1, &ops).await).unwrap();
    assert_eq!(r.status, Nfsstat4::RETRY_UNCACHED_REP);
    // A sequence id that skips ahead: SEQ_MISORDERED; an unknown slot BADSLOT.
    let r = compound_reply(&c.rpc, 1, &[c.sequence(c.seq + 5, false)]).await;
    assert_eq!(r.status, Nfsstat4::SEQ_MISORDERED);
    let mut bad = c.sequence(c.seq + 1, false);
    if let OpArgs::Sequence(s) = &mut bad {
        s.slotid = 1000;
    }
    let r = compound_reply(&c.rpc, 1, &[bad]).await;
    assert_eq!(r.status, Nfsstat4::BADSLOT);
    // DESTROY_SESSION, then the session is unknown.
    let session = c.session;
    let r = compound_reply(&c.rpc, 1, &[OpArgs::DestroySession(session)]).await;
    assert_eq!(r.status, Nfsstat4::OK);
    let r = c.call(vec![OpArgs::Putrootfh]).await;
    assert_eq!(r.status, Nfsstat4::BADSESSION);
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_of_a_thousand_entries_in_several_calls() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("big")).unwrap();
    for i in 0..1000 {
        std::fs::write(tmp.path().join(format!("big/entry-{i:04}")), b"").unwrap();
    }
    let served = serve(tmp.path()).await;
    let mut c = Client::new(served.nfs_addr.unwrap(), "readdir", 16).await;
    let want = mask(&[attr::TYPE, attr::FILEID, attr::RDATTR_ERROR]);
    let mut cookie = 0;
    let mut verf = [0; 8];
    let mut names = HashSet::new();
    let mut calls = 0;
    loop {
        calls += 1;
        assert!(calls <= 1000, "bounded");
        let r = c
            .ok(vec![
                OpArgs::Putrootfh,
                OpArgs::Lookup(name("big")),
                OpArgs::Readdir {
                    cookie,
                    verf,
                    dircount: 2048,
                    maxcount: 8192,
                    attrs: want.clone(),
                },
            ])
            .await;
        let OpRes::Readdir {
            verf: v,
            entries,
            eof,
        } = &r[2]
        else {
            panic!("{r:?}")
        };
        verf = *v;
        for e in entries {
            assert!(e.cookie > cookie, "cookies grow");
            cookie = e.cookie;
            assert_eq!(e.attrs.mask, want, "rdattr_error, type and fileid");
            assert!(names.insert(e.name.as_bytes().to_vec()));
        }
        if *eof {
            break;
        }
    }
    assert_eq!(names.len(), 1000);
    assert!(calls > 2, "several calls: {calls}");
    // A maxcount too small for one entry: TOOSMALL; a reserved cookie: BAD_COOKIE; a wrong
    // verifier: NOT_SAME.
    let rd = |cookie, verf, maxcount| OpArgs::Readdir {
        cookie,
        verf,
        dircount: 0,
        maxcount,
        attrs: mask(&[attr::FILEID]),
    };
    c.fails(
        vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("big")),
            rd(0, [0; 8], 20),
        ],
        Nfsstat4::TOOSMALL,
    )
    .await;
    c.fails(
        vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("big")),
            rd(1, verf, 4096),
        ],
        Nfsstat4::BAD_COOKIE,
    )
    .await;
    c.fails(
        vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("big")),
            rd(5, [3; 8], 4096),
        ],
        Nfsstat4::NOT_SAME,
    )
    .await;
    served.shutdown().await;
}

fn size_attr(size: u64) -> Fattr4 {
    let mut e = xdr::Encoder::new();
    e.put_u64(size);
    Fattr4 {
        mask: mask(&[attr::SIZE]),
        vals: e.into_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_verify_and_the_namespace() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"hello world").unwrap();
    let served = serve(tmp.path()).await;
    let mut c = Client::new(served.nfs_addr.unwrap(), "names", 16).await;
    let at_f = || vec![OpArgs::Putrootfh, OpArgs::Lookup(name("f"))];

    // SETATTR mode and size (the anonymous stateid: no open needed), then VERIFY/NVERIFY.
    let mut ops = at_f();
    ops.push(OpArgs::Setattr {
        stateid: Stateid4::ANONYMOUS,
        attrs: mode_attr(0o600),
    });
    let r = c.ok(ops).await;
    assert_eq!(r[2], OpRes::Setattr(Nfsstat4::OK, mask(&[attr::MODE])));
    let mut ops = at_f();
    ops.push(OpArgs::Setattr {
        stateid: Stateid4::ANONYMOUS,
        attrs: size_attr(5),
    });
    c.ok(ops).await;
    let meta = std::fs::metadata(tmp.path().join("f")).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.len()), (0o600, 5));
    let mut ops = at_f();
    ops.extend([
        OpArgs::Verify(mode_attr(0o600)),
        OpArgs::Verify(size_attr(5)),
    ]);
    c.ok(ops).await;
    let mut ops = at_f();
    ops.push(OpArgs::Verify(mode_attr(0o644)));
    c.fails(ops, Nfsstat4::NOT_SAME).await;
    let mut ops = at_f();
    ops.push(OpArgs::Nverify(mode_attr(0o600)));
    c.fails(ops, Nfsstat4::SAME).await;
    let mut ops = at_f();
    ops.push(OpArgs::Nverify(mode_attr(0o644)));
    c.ok(ops).await;
    // A mode with bits outside 07777 is INVAL; an unsupported attribute ATTRNOTSUPP.
    let mut ops = at_f();
    ops.push(OpArgs::Setattr {
        stateid: Stateid4::ANONYMOUS,
        attrs: mode_attr(0o170000),
    });
    c.fails(ops, Nfsstat4::INVAL).await;

    // CREATE a directory and a symbolic link; READLINK; LINK; RENAME; REMOVE.
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Create {
                objtype: CreateType::Dir,
                name: name("d"),
                attrs: mode_attr(0o750),
            },
            OpArgs::Getattr(mask(&[attr::TYPE])),
        ])
        .await;
    assert!(matches!(&r[1], OpRes::Create { attrset, .. } if *attrset == mask(&[attr::MODE])));
    assert_eq!(u32_attr(&r[2]), 2);
    assert_eq!(
        std::fs::metadata(tmp.path().join("d")).unwrap().mode() & 0o7777,
        0o750
    );
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Create {
                objtype: CreateType::Link(Linktext4::from_slice(b"../f")),
                name: name("l"),
                attrs: Fattr4::default(),
            },
            OpArgs::Readlink,
        ])
        .await;
    assert_eq!(r[2], OpRes::Readlink(Linktext4::from_slice(b"../f")));
    // Regular files come from OPEN, not CREATE; a name that exists is EXIST.
    c.fails(
        vec![
            OpArgs::Putrootfh,
            OpArgs::Create {
                objtype: CreateType::Other(1),
                name: name("r"),
                attrs: Fattr4::default(),
            },
        ],
        Nfsstat4::BADTYPE,
    )
    .await;
    c.fails(
        vec![
            OpArgs::Putrootfh,
            OpArgs::Create {
                objtype: CreateType::Dir,
                name: name("d"),
                attrs: Fattr4::default(),
            },
        ],
        Nfsstat4::EXIST,
    )
    .await;
    // LINK: SAVEFH the file, the directory current.
    c.ok(vec![
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("f")),
        OpArgs::Savefh,
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("d")),
        OpArgs::Link(name("f2")),
    ])
    .await;
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().nlink(), 2);
    // RENAME: the saved filehandle is the source directory.
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("d")),
            OpArgs::Savefh,
            OpArgs::Putrootfh,
            OpArgs::Rename {
                old: name("f2"),
                new: name("moved"),
            },
        ])
        .await;
    assert!(matches!(r[4], OpRes::Rename { .. }));
    assert_eq!(std::fs::read(tmp.path().join("moved")).unwrap(), b"hello");
    // REMOVE of a file and of a non-empty directory.
    c.ok(vec![OpArgs::Putrootfh, OpArgs::Remove(name("moved"))])
        .await;
    assert!(!tmp.path().join("moved").exists());
    std::fs::write(tmp.path().join("d/x"), b"").unwrap();
    c.fails(
        vec![OpArgs::Putrootfh, OpArgs::Remove(name("d"))],
        Nfsstat4::NOTEMPTY,
    )
    .await;
    // Names: `..` is BADNAME, empty INVAL; RESTOREFH without SAVEFH is RESTOREFH.
    c.fails(
        vec![OpArgs::Putrootfh, OpArgs::Lookup(name(".."))],
        Nfsstat4::BADNAME,
    )
    .await;
    c.fails(
        vec![OpArgs::Putrootfh, OpArgs::Lookup(name(""))],
        Nfsstat4::INVAL,
    )
    .await;
    c.fails(vec![OpArgs::Restorefh], Nfsstat4::RESTOREFH).await;
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_allocate_deallocate_in_minor_version_2() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let mut c = Client::new(served.nfs_addr.unwrap(), "v42", 16).await;
    c.minor = 2;
    let (sid, fh) = open_rw(&mut c, b"o", "sparse", share::DENY_NONE).await;
    let block = pattern(8192, 3);
    c.ok(vec![
        OpArgs::Putfh(fh4(&fh)),
        write(sid, 0, block.clone()),
        write(sid, 1 << 20, block.clone()),
    ])
    .await;
    let seek = |offset, what| OpArgs::Seek {
        stateid: sid,
        offset,
        what,
    };
    let r = c
        .ok(vec![
            OpArgs::Putfh(fh4(&fh)),
            seek(0, content::DATA),
            seek(0, content::HOLE),
        ])
        .await;
    assert_eq!(
        r[1],
        OpRes::Seek {
            eof: false,
            offset: 0
        }
    );
    let OpRes::Seek { offset: hole, .. } = r[2] else {
        panic!("{r:?}")
    };
    // The first hole is after the first block (or at the end, where holes are not tracked).
    let size = (1 << 20) + 8192;
    assert!((8192..=size).contains(&hole), "{hole}");
    // Past the end: NXIO (as Linux nfsd answers lseek's ENXIO).
    c.fails(
        vec![OpArgs::Putfh(fh4(&fh)), seek(size + 10, content::DATA)],
        Nfsstat4::NXIO,
    )
    .await;
    // ALLOCATE keeps the data; DEALLOCATE punches zeros and keeps the size.
    c.ok(vec![
        OpArgs::Putfh(fh4(&fh)),
        OpArgs::Allocate {
            stateid: sid,
            offset: 0,
            length: 1 << 16,
        },
        OpArgs::Deallocate {
            stateid: sid,
            offset: 0,
            length: 4096,
        },
    ])
    .await;
    let r = c
        .ok(vec![OpArgs::Putfh(fh4(&fh)), read(sid, 0, 8192)])
        .await;
    let OpRes::Read { data, .. } = &r[1] else {
        panic!("{r:?}")
    };
    assert!(data[..4096].iter().all(|&b| b == 0));
    assert_eq!(&data[4096..], &block[4096..]);
    assert_eq!(
        std::fs::metadata(tmp.path().join("sparse")).unwrap().len(),
        size
    );
    // In minor version 1 these are not operations at all.
    c.minor = 1;
    c.fails(
        vec![OpArgs::Putfh(fh4(&fh)), OpArgs::Illegal(op::ALLOCATE)],
        Nfsstat4::OP_ILLEGAL,
    )
    .await;
    served.shutdown().await;
}

fn open_how(owner_name: &[u8], file: &str, deny: u32, how: CreateHow) -> OpArgs {
    OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: share::ACCESS_BOTH,
        share_deny: deny,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(owner_name),
        },
        create: Some(how),
        claim: OpenClaim::Null(name(file)),
    }))
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
    let mut c = Client::new(served.nfs_addr.unwrap(), "grace", 16).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_stay_within_the_session_limits() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), pattern(10_000, 1)).unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();
    // A session whose replies are at most 1 KiB, cached at most 512 bytes.
    let mut c = Client::new(addr, "small", 16).await;
    let rpc = c.rpc.clone();
    let r = compound_reply(
        &rpc,
        1,
        &[OpArgs::ExchangeId {
            owner: nfs::nfs4::types::ClientOwner4 {
                verifier: [7; 8],
                ownerid: owner(b"small"),
            },
            flags: 0,
            protect: nfs::nfs4::types::StateProtectA::None,
            impl_id: None,
        }],
    )
    .await;
    let OpRes::ExchangeId(x) = &r.results[0] else {
        panic!("{r:?}")
    };
    let mut small = fore(16);
    small.maxresponsesize = 1024;
    small.maxresponsesize_cached = 512;
    let r = compound_reply(
        &rpc,
        1,
        &[OpArgs::CreateSession(Box::new(
            nfs::nfs4::args::CreateSessionArgs {
                clientid: x.clientid,
                sequence: x.sequenceid,
                flags: 0,
                fore: small,
                back: fore(4),
                cb_program: 0,
                sec: vec![],
            },
        ))],
    )
    .await;
    let OpRes::CreateSession(cs) = &r.results[0] else {
        panic!("{r:?}")
    };
    c.session = cs.session;
    c.seq = 0;
    // A READ larger than the reply may be is shortened, not refused (RFC 8881 §18.22.3).
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Lookup(name("f")),
            read(Stateid4::ANONYMOUS, 0, 8000),
        ])
        .await;
    let OpRes::Read { eof, data } = &r[2] else {
        panic!("{r:?}")
    };
    assert!(!eof);
    assert!(!data.is_empty() && data.len() < 1024, "{}", data.len());
    assert_eq!(data, &pattern(10_000, 1).slice(..data.len()));
    // A reply the client asks to cache must fit the slot's cache: REP_TOO_BIG_TO_CACHE.
    c.seq += 1;
    let ops = vec![
        c.sequence(c.seq, true),
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("f")),
        read(Stateid4::ANONYMOUS, 0, 8000),
    ];
    let r = compound_reply(&c.rpc, 1, &ops).await;
    assert_eq!(r.status, Nfsstat4::REP_TOO_BIG_TO_CACHE, "{r:?}");
    // A READDIR bounded by the reply size returns what fits, in several calls.
    for i in 0..40 {
        std::fs::write(
            tmp.path().join(format!("entry-with-a-long-name-{i:03}")),
            b"",
        )
        .unwrap();
    }
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Readdir {
                cookie: 0,
                verf: [0; 8],
                dircount: 0,
                maxcount: 1 << 20,
                attrs: mask(&[attr::FILEID]),
            },
        ])
        .await;
    let OpRes::Readdir { entries, eof, .. } = &r[1] else {
        panic!("{r:?}")
    };
    assert!(!eof && !entries.is_empty() && entries.len() < 40);
    served.shutdown().await;
}
