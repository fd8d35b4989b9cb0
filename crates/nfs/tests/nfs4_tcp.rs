//! NFSv4.1 end to end over TCP on 127.0.0.1, against the in-process server that also serves
//! NFSv3 on the same port: the Linux mount sequence, data integrity, NFSv3 alongside, the
//! COMPOUND rules (minor versions, OP_ILLEGAL, NOTSUPP, BADXDR, TOO_MANY_OPS, SEQUENCE
//! placement), the reply cache, and replies kept within the session's limits.

use crate::nfs4_util::*;
use bytes::Bytes;
use nfs::client::Nfs3Client;
use nfs::nfs3::{Fh3, Nfsstat3};
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::OpArgs;
use nfs::nfs4::client_codec::encode_compound;
use nfs::nfs4::compound::CompoundReply;
use nfs::nfs4::consts::{attr, op, share, stable};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::types::Stateid4;
use oncrpc::{AcceptStat, RpcError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_mount_sequence_and_file_io() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();

    // NULL, then the mount sequence of the facts file.
    rpc(addr, 4).await.null().await.unwrap();
    let mut c = Client::before_reclaim_complete(addr, "linux-client", 16).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compound_rules_and_the_reply_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let addr = served.nfs_addr.unwrap();
    let raw = rpc(addr, 4).await;

    // Minor version 3: MINOR_VERS_MISMATCH, no results, the tag echoed (0 is NFSv4.0, see
    // tests/nfs40.rs).
    for minor in [3, 7] {
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
