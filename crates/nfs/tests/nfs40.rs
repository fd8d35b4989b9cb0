//! NFSv4.0 (RFC 7530) over TCP on loopback: SETCLIENTID and its confirmation, OPEN with
//! OPEN_CONFIRM, the seqid ordering and reply cache of open- and lock-owners, RENEW,
//! RELEASE_LOCKOWNER, and the operations of one minor version refused in the other.

use crate::nfs4_util::*;
use bytes::Bytes;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{Locker, OpArgs};
use nfs::nfs4::compound::CompoundReply;
use nfs::nfs4::consts::{access, attr, lock_type, op, open_result, share};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::types::{Bitmap4, StateOwner4, Stateid4};
use nfs::nfs4::v40::{Args40, CbClient4, NfsClientId4, Res40};
use oncrpc::RpcClient;

/// A 4.0 client: its RPC client, clientid and the next seqid of its one open-owner.
struct C40 {
    rpc: RpcClient,
    clientid: u64,
}

async fn call(rpc: &RpcClient, ops: &[OpArgs]) -> CompoundReply {
    compound_reply(rpc, 0, ops).await
}

fn setclientid(id: &str, verifier: [u8; 8]) -> OpArgs {
    OpArgs::V40(Args40::SetClientId {
        client: NfsClientId4 {
            verifier,
            id: owner(id.as_bytes()),
        },
        callback: CbClient4 {
            program: 0x4000_0000,
            netid: Bytes::from_static(b"tcp"),
            addr: Bytes::from_static(b"127.0.0.1.3.200"),
        },
        callback_ident: 1,
    })
}

impl C40 {
    async fn new(addr: std::net::SocketAddr, id: &str) -> C40 {
        let rpc = rpc(addr, 4).await;
        let r = call(&rpc, &[setclientid(id, [3; 8])]).await;
        let OpRes::V40(Res40::SetClientId { clientid, confirm }) = r.results[0] else {
            panic!("SETCLIENTID: {r:?}");
        };
        let r = call(
            &rpc,
            &[OpArgs::V40(Args40::SetClientIdConfirm {
                clientid,
                verifier: confirm,
            })],
        )
        .await;
        assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
        C40 { rpc, clientid }
    }

    fn open(&self, owner_name: &[u8], seqid: u32, file: &str, create: bool) -> OpArgs {
        let OpArgs::Open(mut o) = open_args(owner_name, file, share::ACCESS_BOTH, 0, create) else {
            unreachable!()
        };
        o.seqid = seqid;
        o.owner.clientid = self.clientid;
        OpArgs::Open(o)
    }

    async fn call(&self, ops: &[OpArgs]) -> CompoundReply {
        call(&self.rpc, ops).await
    }
}

fn open_ok(r: &CompoundReply) -> (Stateid4, u32) {
    for x in &r.results {
        if let OpRes::Open(o) = x {
            return (o.stateid, o.rflags);
        }
    }
    panic!("no OPEN result: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_confirm_write_read_close_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let addr = s.nfs_addr.unwrap();
    let c = C40::new(addr, "client-a").await;

    // A new open-owner's first OPEN asks for OPEN_CONFIRM (RFC 7530 §16.18.4).
    let open = c.open(b"oo", 7, "f", true);
    let r = c
        .call(&[OpArgs::Putrootfh, open.clone(), OpArgs::Getfh])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let (sid, rflags) = open_ok(&r);
    assert_ne!(rflags & open_result::CONFIRM, 0);
    // OPEN_DELEGATE_NONE, never the 4.1 _NONE_EXT form.
    let OpRes::Open(o) = &r.results[1] else {
        unreachable!()
    };
    assert_eq!(o.no_deleg_why, None);
    let fh = fh_of(&r.results[2]);

    // The same OPEN again before any OPEN_CONFIRM: the unconfirmed owner starts over (as
    // Linux nfsd does; libnfs resends seqid 0 after a failed first OPEN): the same open, its
    // stateid advanced, still to be confirmed.
    let r2 = c
        .call(&[OpArgs::Putrootfh, open.clone(), OpArgs::Getfh])
        .await;
    let (sid, rflags) = {
        let (s2, f2) = open_ok(&r2);
        assert_eq!(s2.other, sid.other);
        assert_eq!(s2.seqid, sid.seqid + 1);
        (s2, f2)
    };
    assert_ne!(rflags & open_result::CONFIRM, 0);
    assert_eq!(fh_of(&r2.results[2]), fh);

    // A seqid out of order is NFS4ERR_BAD_SEQID.
    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            OpArgs::V40(Args40::OpenConfirm {
                stateid: sid,
                seqid: 10,
            }),
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::BAD_SEQID, "{r:?}");

    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            OpArgs::V40(Args40::OpenConfirm {
                stateid: sid,
                seqid: 8,
            }),
        ])
        .await;
    let OpRes::V40(Res40::OpenConfirm(sid2)) = r.results[1] else {
        panic!("OPEN_CONFIRM: {r:?}");
    };
    assert_eq!(sid2.other, sid.other);
    assert_eq!(sid2.seqid, sid.seqid + 1);

    let data = pattern(5000, 1);
    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            write(sid2, 0, data.clone()),
            OpArgs::Read {
                stateid: sid2,
                offset: 0,
                count: 10_000,
            },
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let OpRes::Read { data: got, eof } = &r.results[2] else {
        panic!("{r:?}");
    };
    assert!(*eof);
    assert_eq!(got, &data);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);

    // A confirmed owner's next OPEN (seqid 9) needs no confirmation, and the same seqid again
    // is a retransmission: the cached reply, same stateid, and the filehandle it made current.
    let reopen = c.open(b"oo", 9, "f", false);
    let r = c
        .call(&[OpArgs::Putrootfh, reopen.clone(), OpArgs::Getfh])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let (sid3, rflags) = open_ok(&r);
    assert_eq!(rflags & open_result::CONFIRM, 0);
    assert_eq!(sid3.other, sid2.other);
    let r = c.call(&[OpArgs::Putrootfh, reopen, OpArgs::Getfh]).await;
    assert_eq!(open_ok(&r).0, sid3, "replayed OPEN: {r:?}");
    assert_eq!(fh_of(&r.results[2]), fh);

    // CLOSE with the next seqid (10), then the same CLOSE again is answered from the cache.
    let close = OpArgs::Close {
        seqid: 10,
        stateid: sid3,
    };
    let r = c.call(&[OpArgs::Putfh(fh.clone()), close.clone()]).await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = c.call(&[OpArgs::Putfh(fh.clone()), close]).await;
    assert_eq!(r.status, Nfsstat4::OK, "replayed CLOSE: {r:?}");
    // The stateid is gone.
    let r = c
        .call(&[
            OpArgs::Putfh(fh),
            OpArgs::Read {
                stateid: sid3,
                offset: 0,
                count: 1,
            },
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::BAD_STATEID, "{r:?}");
    s.shutdown().await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_seqids_and_release_lockowner() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let c = C40::new(s.nfs_addr.unwrap(), "client-l").await;
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            c.open(b"oo", 1, "f", true),
            OpArgs::Getfh,
        ])
        .await;
    let (sid, _) = open_ok(&r);
    let fh = fh_of(&r.results[2]);
    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            OpArgs::V40(Args40::OpenConfirm {
                stateid: sid,
                seqid: 2,
            }),
        ])
        .await;
    let OpRes::V40(Res40::OpenConfirm(sid)) = r.results[1] else {
        panic!("{r:?}");
    };
    let lock_owner = StateOwner4 {
        clientid: c.clientid,
        owner: owner(b"lo"),
    };
    let lock = |locker| OpArgs::Lock {
        locktype: lock_type::WRITE_LT,
        reclaim: false,
        offset: 0,
        length: 100,
        locker,
    };
    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            lock(Locker::New {
                open_seqid: 3,
                open_stateid: sid,
                lock_seqid: 0,
                owner: lock_owner.clone(),
            }),
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let lsid = stateid_of(&r.results[1]);
    // The lock-owner holds a lock: RELEASE_LOCKOWNER refuses.
    let release = OpArgs::V40(Args40::ReleaseLockowner(lock_owner.clone()));
    let r = c.call(std::slice::from_ref(&release)).await;
    assert_eq!(r.status, Nfsstat4::LOCKS_HELD, "{r:?}");
    // LOCKU with a lock-owner seqid out of order, then in order (1), then replayed.
    let locku = |seqid| OpArgs::Locku {
        locktype: lock_type::WRITE_LT,
        seqid,
        stateid: lsid,
        offset: 0,
        length: 100,
    };
    let r = c.call(&[OpArgs::Putfh(fh.clone()), locku(5)]).await;
    assert_eq!(r.status, Nfsstat4::BAD_SEQID, "{r:?}");
    let r = c.call(&[OpArgs::Putfh(fh.clone()), locku(1)]).await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let first = stateid_of(&r.results[1]);
    let r = c.call(&[OpArgs::Putfh(fh.clone()), locku(1)]).await;
    assert_eq!(stateid_of(&r.results[1]), first, "replayed LOCKU: {r:?}");
    // No lock held now: the lock-owner can be released, and its stateid is gone.
    let r = c.call(&[release]).await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = c.call(&[OpArgs::Putfh(fh), locku(2)]).await;
    assert_eq!(r.status, Nfsstat4::BAD_STATEID, "{r:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientid_rules_renew_and_minor_version_ops() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let addr = s.nfs_addr.unwrap();
    let r4 = rpc(addr, 4).await;
    // An unconfirmed clientid is stale for RENEW and OPEN.
    let r = call(&r4, &[setclientid("client-r", [1; 8])]).await;
    let OpRes::V40(Res40::SetClientId { clientid, confirm }) = r.results[0] else {
        panic!("{r:?}");
    };
    let r = call(&r4, &[OpArgs::V40(Args40::Renew(clientid))]).await;
    assert_eq!(r.status, Nfsstat4::STALE_CLIENTID, "{r:?}");
    // A wrong confirm verifier is stale too; the right one confirms.
    let mut wrong = confirm;
    wrong[7] ^= 1;
    let r = call(
        &r4,
        &[OpArgs::V40(Args40::SetClientIdConfirm {
            clientid,
            verifier: wrong,
        })],
    )
    .await;
    assert_eq!(r.status, Nfsstat4::STALE_CLIENTID, "{r:?}");
    let r = call(
        &r4,
        &[OpArgs::V40(Args40::SetClientIdConfirm {
            clientid,
            verifier: confirm,
        })],
    )
    .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = call(&r4, &[OpArgs::V40(Args40::Renew(clientid))]).await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = call(&r4, &[OpArgs::V40(Args40::Renew(clientid ^ 0xffff))]).await;
    assert_eq!(r.status, Nfsstat4::STALE_CLIENTID, "{r:?}");

    // 4.0 negotiates no operation limit: past the server's bound (64, a 4.1 session's
    // ca_maxoperations) the COMPOUND is NFS4ERR_RESOURCE with no results; at it, it runs.
    let r = call(&r4, &vec![OpArgs::Putrootfh; 65]).await;
    assert_eq!(r.status, Nfsstat4::RESOURCE, "{r:?}");
    assert!(r.results.is_empty());
    let r = call(&r4, &vec![OpArgs::Putrootfh; 64]).await;
    assert_eq!((r.status, r.results.len()), (Nfsstat4::OK, 64));

    // 4.1's operations do not exist in 4.0: NFS4ERR_OP_ILLEGAL (RFC 7530 §16.38),
    // and SEQUENCE is one of them.
    for opnum in [op::SEQUENCE, op::EXCHANGE_ID, op::RECLAIM_COMPLETE] {
        let r = call(&r4, &[OpArgs::Illegal(opnum)]).await;
        assert_eq!(r.status, Nfsstat4::OP_ILLEGAL, "op {opnum}: {r:?}");
        assert_eq!(r.results[0].opnum(), op::ILLEGAL);
    }
    // And 4.0's are NFS4ERR_NOTSUPP in 4.1 (RFC 8881 §15.2), without a session (they are
    // decoded before SEQUENCE is looked for) or after one.
    let mut c41 = Client::new(addr, "client-41", 8).await;
    for a in [
        setclientid("x", [1; 8]),
        OpArgs::V40(Args40::Renew(1)),
        OpArgs::V40(Args40::SetClientIdConfirm {
            clientid: 1,
            verifier: [0; 8],
        }),
        OpArgs::V40(Args40::ReleaseLockowner(StateOwner4 {
            clientid: 1,
            owner: owner(b"o"),
        })),
        OpArgs::V40(Args40::OpenConfirm {
            stateid: Stateid4::ANONYMOUS,
            seqid: 1,
        }),
    ] {
        let n = a.opnum();
        let r = c41.call(vec![a]).await;
        assert_eq!(r.status, Nfsstat4::NOTSUPP, "op {n}: {r:?}");
        assert_eq!(r.results[1].opnum(), n);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_replaces_the_clientid_and_drops_its_opens() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let addr = s.nfs_addr.unwrap();
    let c = C40::new(addr, "client-b").await;
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            c.open(b"oo", 1, "f", true),
            OpArgs::Getfh,
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let (sid, _) = open_ok(&r);
    let fh = fh_of(&r.results[2]);
    let read = [
        OpArgs::Putfh(fh),
        OpArgs::Read {
            stateid: sid,
            offset: 0,
            count: 1,
        },
    ];
    // The same client string with a new verifier: a rebooted client. Its old record and open
    // stay until the new record is confirmed.
    let r = c.call(&[setclientid("client-b", [9; 8])]).await;
    let OpRes::V40(Res40::SetClientId { clientid, confirm }) = r.results[0] else {
        panic!("{r:?}");
    };
    assert_ne!(clientid, c.clientid);
    let r = c.call(&read).await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = c
        .call(&[OpArgs::V40(Args40::SetClientIdConfirm {
            clientid,
            verifier: confirm,
        })])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    // The old client's opens went with it: NFS4ERR_EXPIRED (pynfs CID1); its clientid was
    // replaced, so RENEW of it is stale.
    let r = c.call(&read).await;
    assert_eq!(r.status, Nfsstat4::EXPIRED, "{r:?}");
    let r = c.call(&[OpArgs::V40(Args40::Renew(c.clientid))]).await;
    assert_eq!(r.status, Nfsstat4::STALE_CLIENTID, "{r:?}");
    s.shutdown().await;
}

/// A server with a one-second lease.
async fn serve_short_lease(dir: &std::path::Path) -> nfs::serve::Served {
    let mut cfg = nfs::serve::ServeConfig::new(dir);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    let mut n4 = nfs::nfs4::server::Nfs4Config::default().with_grace(std::time::Duration::ZERO);
    n4.state.lease = std::time::Duration::from_secs(1);
    cfg.nfs4 = Some(n4);
    nfs::serve::start(cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_expired_not_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_short_lease(dir.path()).await;
    let c = C40::new(s.nfs_addr.unwrap(), "client-e").await;
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            c.open(b"oo", 1, "f", true),
            OpArgs::Getfh,
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let (sid, _) = open_ok(&r);
    let fh = fh_of(&r.results[2]);
    // Let the lease lapse (the server's expiry task runs at the lease deadline).
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let r = c.call(&[OpArgs::V40(Args40::Renew(c.clientid))]).await;
    assert_eq!(r.status, Nfsstat4::EXPIRED, "{r:?}");
    let r = c
        .call(&[
            OpArgs::Putfh(fh),
            OpArgs::Close {
                seqid: 2,
                stateid: sid,
            },
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::EXPIRED, "{r:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v40_attributes_non_regular_opens_and_a_second_confirm() {
    let dir = tempfile::tempdir().unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    let s = serve(dir.path()).await;
    let addr = s.nfs_addr.unwrap();
    let c = C40::new(addr, "client-x").await;
    // supported_attrs in 4.0 stops at 4.0's attributes (no suppattr_exclcreat, 75), and an
    // attribute nobody defines (1000) is ignored, not an error.
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            OpArgs::Getattr(mask(&[
                attr::SUPPORTED_ATTRS,
                attr::SUPPATTR_EXCLCREAT,
                1000,
            ])),
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let OpRes::Getattr(f) = &r.results[1] else {
        panic!("{r:?}");
    };
    assert_eq!(f.mask, mask(&[attr::SUPPORTED_ATTRS]));
    let sup: Bitmap4 = xdr::Decoder::from_bytes(&f.vals).get().unwrap();
    assert!(sup.get(attr::MOUNTED_ON_FILEID) && !sup.get(attr::SUPPATTR_EXCLCREAT));
    // VERIFY of that 4.0 view is the same (pynfs VF1), NVERIFY of it NFS4ERR_SAME.
    let r = c
        .call(&[OpArgs::Putrootfh, OpArgs::Verify(f.clone())])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
    let r = c
        .call(&[OpArgs::Putrootfh, OpArgs::Nverify(f.clone())])
        .await;
    assert_eq!(r.status, Nfsstat4::SAME, "{r:?}");
    // ACCESS: LOOKUP is not "supported" for a non-directory, EXECUTE not for a directory.
    let r = c
        .call(&[OpArgs::Putrootfh, OpArgs::Access(access::ALL)])
        .await;
    let OpRes::Access { supported, .. } = r.results[1] else {
        panic!("{r:?}");
    };
    assert_eq!(supported, access::ALL & !access::EXECUTE);

    // ... while 4.1 lists it.
    let mut c41 = Client::new(addr, "client-x41", 8).await;
    let r = c41
        .ok(vec![
            OpArgs::Putrootfh,
            OpArgs::Getattr(mask(&[attr::SUPPORTED_ATTRS])),
        ])
        .await;
    let OpRes::Getattr(f) = &r[1] else {
        panic!("{r:?}");
    };
    let sup: Bitmap4 = xdr::Decoder::from_bytes(&f.vals).get().unwrap();
    assert!(sup.get(attr::SUPPATTR_EXCLCREAT));

    // READDIR with a maxcount below an empty reply's 16 bytes: NFS4ERR_TOOSMALL.
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            OpArgs::Readdir {
                cookie: 0,
                verf: [0; 8],
                dircount: 0,
                maxcount: 15,
                attrs: Bitmap4::default(),
            },
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::TOOSMALL, "{r:?}");

    // OPEN of a socket: NFS4ERR_SYMLINK in 4.0 (RFC 7530 §16.16.4). The owner's first OPEN
    // failed, so the same seqid again is a new start, not a replay (libnfs does this).
    let r = c
        .call(&[OpArgs::Putrootfh, c.open(b"o1", 1, "sock", false)])
        .await;
    assert_eq!(r.status, Nfsstat4::SYMLINK, "{r:?}");
    let r = c
        .call(&[OpArgs::Putrootfh, c.open(b"o1", 1, "f", true)])
        .await;
    assert_eq!(r.status, Nfsstat4::OK, "{r:?}");

    // A second OPEN_CONFIRM of a confirmed owner: NFS4ERR_BAD_STATEID.
    let r = c
        .call(&[
            OpArgs::Putrootfh,
            c.open(b"o2", 1, "f", true),
            OpArgs::Getfh,
        ])
        .await;
    let (sid, _) = open_ok(&r);
    let fh = fh_of(&r.results[2]);
    let r = c
        .call(&[OpArgs::Putfh(fh.clone()), OpArgs::Access(access::ALL)])
        .await;
    let OpRes::Access { supported, .. } = r.results[1] else {
        panic!("{r:?}");
    };
    assert_eq!(supported, access::ALL & !(access::LOOKUP | access::DELETE));
    // LINK with a regular file as the current filehandle: NFS4ERR_NOTDIR (pynfs LINK4r).
    let r = c
        .call(&[
            OpArgs::Putfh(fh.clone()),
            OpArgs::Savefh,
            OpArgs::Link(name("l")),
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::NOTDIR, "{r:?}");
    let confirm = |stateid, seqid| {
        [
            OpArgs::Putfh(fh.clone()),
            OpArgs::V40(Args40::OpenConfirm { stateid, seqid }),
        ]
    };
    let r = c.call(&confirm(sid, 2)).await;
    let OpRes::V40(Res40::OpenConfirm(sid2)) = r.results[1] else {
        panic!("{r:?}");
    };
    let r = c.call(&confirm(sid2, 3)).await;
    assert_eq!(r.status, Nfsstat4::BAD_STATEID, "{r:?}");

    // An empty owner string is NFS4ERR_INVAL.
    let mut e = xdr::Encoder::new();
    e.put_opaque(b"");
    let r = c
        .call(&[
            OpArgs::Putfh(fh),
            OpArgs::Setattr {
                stateid: Stateid4::ANONYMOUS,
                attrs: nfs::nfs4::types::Fattr4 {
                    mask: mask(&[attr::OWNER]),
                    vals: e.into_bytes(),
                },
            },
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::INVAL, "{r:?}");
    s.shutdown().await;
}
