//! The port mapper and MOUNT programs through the dispatcher: registrations (PMAP v2 and
//! RPCBIND v3/v4 SET/UNSET/GETADDR/DUMP), unsupported procedures, mount bookkeeping, and a
//! read-only export.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::mount::{self, DirPath, MountRes};
use nfs::nfs3::{self, Nfsstat3};
use nfs::portmap::{self, Mapping, PortmapProgram, Portmapper, Rpcb, RpcbString};
use nfs::server::{ExportOptions, NfsServer};
use oncrpc::{AcceptStat, CallContext, CallHeader, Dispatcher, OpaqueAuth, ReplyHeader};
use xdr::{Decoder, XdrDecode};

async fn call(
    d: &Dispatcher,
    prog: u32,
    vers: u32,
    proc_: u32,
    args: Bytes,
    peer: Option<SocketAddr>,
) -> (AcceptStat, Bytes) {
    let header = CallHeader {
        xid: 1,
        prog,
        vers,
        proc_,
        cred: OpaqueAuth::none(),
        verf: OpaqueAuth::none(),
    };
    let ctx = Arc::new(CallContext {
        peer,
        local: Some("10.1.2.3:111".parse().unwrap()),
        transport: oncrpc::TransportKind::Local,
        back: None,
    });
    let reply = d
        .dispatch_call(header, args, ctx, xdr::DdpPolicy::Inline)
        .await
        .unwrap();
    let msg = reply.message.to_bytes();
    let mut dec = Decoder::from_bytes(&msg);
    let h = oncrpc::MessageHeader::decode(&mut dec).unwrap();
    let oncrpc::MessageHeader::Reply(ReplyHeader::Accepted { stat, .. }) = h else {
        panic!("not accepted: {h:?}")
    };
    (stat, dec.take_rest())
}

fn rpcb(prog: u32, vers: u32, netid: &str, addr: &str) -> Bytes {
    xdr::to_bytes(&Rpcb {
        prog,
        vers,
        netid: RpcbString(Bytes::copy_from_slice(netid.as_bytes())),
        addr: RpcbString(Bytes::copy_from_slice(addr.as_bytes())),
        owner: RpcbString(Bytes::from_static(b"me")),
    })
}

fn dec<T: for<'a> XdrDecode<'a>>(b: &Bytes) -> T {
    nfs::decode_exact(b).unwrap()
}

#[tokio::test]
async fn portmapper_registrations() {
    let pm = Portmapper::new();
    let d = Dispatcher::new().with(Arc::new(PortmapProgram(pm.clone())));
    let lo = Some("127.0.0.1:999".parse().unwrap());
    // RPCBIND v4 SET from loopback, then GETADDR (v3 and v4) and PMAP GETPORT.
    let (s, r) = call(
        &d,
        100000,
        4,
        portmap::rpcb_proc::SET,
        rpcb(400_000, 1, "tcp", "127.0.0.1.8.1"),
        lo,
    )
    .await;
    assert_eq!((s, dec::<bool>(&r)), (AcceptStat::Success, true));
    for v in [3, 4] {
        let (_, r) = call(
            &d,
            100000,
            v,
            portmap::rpcb_proc::GETADDR,
            rpcb(400_000, 1, "tcp", ""),
            lo,
        )
        .await;
        assert_eq!(
            dec::<RpcbString>(&r).0,
            Bytes::from_static(b"127.0.0.1.8.1")
        );
    }
    // GETADDR may answer with another version; GETVERSADDR may not.
    let (_, r) = call(
        &d,
        100000,
        4,
        portmap::rpcb_proc::GETADDR,
        rpcb(400_000, 9, "tcp", ""),
        lo,
    )
    .await;
    assert_eq!(
        dec::<RpcbString>(&r).0,
        Bytes::from_static(b"127.0.0.1.8.1")
    );
    let (_, r) = call(
        &d,
        100000,
        4,
        portmap::rpcb_proc::GETVERSADDR,
        rpcb(400_000, 9, "tcp", ""),
        lo,
    )
    .await;
    assert!(dec::<RpcbString>(&r).0.is_empty());
    let m = |prog, vers, port| {
        xdr::to_bytes(&Mapping {
            prog,
            vers,
            prot: portmap::IPPROTO_TCP,
            port,
        })
    };
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::GETPORT,
        m(400_000, 1, 0),
        lo,
    )
    .await;
    assert_eq!(dec::<u32>(&r), 2049);
    // PMAP SET registers on the wildcard address; GETADDR reports the local address instead.
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::SET,
        m(400_001, 2, 5555),
        lo,
    )
    .await;
    assert!(dec::<bool>(&r));
    // RFC 1833 §3.2 / §2.2.1: a second SET of the same (program, version, protocol) is
    // refused, over either version, and the first mapping stays.
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::SET,
        m(400_001, 2, 6666),
        lo,
    )
    .await;
    assert!(!dec::<bool>(&r), "PMAP SET over an existing mapping");
    let (_, r) = call(
        &d,
        100000,
        4,
        portmap::rpcb_proc::SET,
        rpcb(400_001, 2, "tcp", "127.0.0.1.26.10"),
        lo,
    )
    .await;
    assert!(!dec::<bool>(&r), "RPCBIND SET over an existing mapping");
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::GETPORT,
        m(400_001, 2, 0),
        lo,
    )
    .await;
    assert_eq!(dec::<u32>(&r), 5555);
    let (_, r) = call(
        &d,
        100000,
        3,
        portmap::rpcb_proc::GETADDR,
        rpcb(400_001, 2, "tcp", ""),
        lo,
    )
    .await;
    assert_eq!(
        dec::<RpcbString>(&r).0,
        Bytes::from_static(b"10.1.2.3.21.179")
    );
    // Remote peers cannot change registrations.
    let remote = Some("192.0.2.1:999".parse().unwrap());
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::UNSET,
        m(400_001, 2, 0),
        remote,
    )
    .await;
    assert!(!dec::<bool>(&r));
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::UNSET,
        m(400_001, 2, 0),
        lo,
    )
    .await;
    assert!(dec::<bool>(&r));
    let (_, r) = call(
        &d,
        100000,
        2,
        portmap::pmap_proc::GETPORT,
        m(400_001, 2, 0),
        lo,
    )
    .await;
    assert_eq!(dec::<u32>(&r), 0);
    // DUMP in both dialects.
    let (_, r) = call(&d, 100000, 2, portmap::pmap_proc::DUMP, Bytes::new(), lo).await;
    assert_eq!(dec::<portmap::List<Mapping>>(&r).0.len(), 1);
    let (_, r) = call(&d, 100000, 4, portmap::rpcb_proc::DUMP, Bytes::new(), lo).await;
    assert_eq!(dec::<portmap::List<Rpcb>>(&r).0.len(), 1);
    // CALLIT and friends are not offered; garbage is GARBAGE_ARGS; v5 is PROG_MISMATCH.
    assert_eq!(
        call(&d, 100000, 2, portmap::pmap_proc::CALLIT, Bytes::new(), lo)
            .await
            .0,
        AcceptStat::ProcUnavail
    );
    assert_eq!(
        call(&d, 100000, 4, portmap::rpcb_proc::GETSTAT, Bytes::new(), lo)
            .await
            .0,
        AcceptStat::ProcUnavail
    );
    assert_eq!(
        call(
            &d,
            100000,
            2,
            portmap::pmap_proc::GETPORT,
            Bytes::from_static(&[0; 3]),
            lo
        )
        .await
        .0,
        AcceptStat::GarbageArgs
    );
    assert!(matches!(
        call(&d, 100000, 5, 0, Bytes::new(), lo).await.0,
        AcceptStat::ProgMismatch { low: 2, high: 4 }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_bookkeeping_and_read_only_export() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"data").unwrap();
    let s = NfsServer::new(
        tmp.path(),
        ExportOptions {
            read_only: true,
            name: "/ro".into(),
        },
    )
    .unwrap();
    let d = Dispatcher::new()
        .with(s.mount_program())
        .with(s.nfs_program());
    let peer = Some("127.0.0.1:700".parse().unwrap());
    let path = |p: &str| xdr::to_bytes(&DirPath(Bytes::copy_from_slice(p.as_bytes())));
    let (_, r) = call(&d, mount::PROGRAM, 3, mount::proc_::MNT, path("/ro/"), peer).await;
    let MountRes::Ok(ok) = dec::<MountRes>(&r) else {
        panic!("MNT failed")
    };
    let canonical = tmp.path().canonicalize().unwrap();
    let (_, r) = call(
        &d,
        mount::PROGRAM,
        3,
        mount::proc_::MNT,
        path(canonical.to_str().unwrap()),
        peer,
    )
    .await;
    assert!(matches!(dec::<MountRes>(&r), MountRes::Ok(_)));
    let (_, r) = call(
        &d,
        mount::PROGRAM,
        3,
        mount::proc_::DUMP,
        Bytes::new(),
        peer,
    )
    .await;
    assert_eq!(dec::<mount::MountList>(&r).0.len(), 2);
    call(&d, mount::PROGRAM, 3, mount::proc_::UMNT, path("/ro"), peer).await;
    let (_, r) = call(
        &d,
        mount::PROGRAM,
        3,
        mount::proc_::DUMP,
        Bytes::new(),
        peer,
    )
    .await;
    assert_eq!(dec::<mount::MountList>(&r).0.len(), 1);
    call(
        &d,
        mount::PROGRAM,
        3,
        mount::proc_::UMNTALL,
        Bytes::new(),
        peer,
    )
    .await;
    let (_, r) = call(
        &d,
        mount::PROGRAM,
        3,
        mount::proc_::DUMP,
        Bytes::new(),
        peer,
    )
    .await;
    assert!(dec::<mount::MountList>(&r).0.is_empty());
    assert!(matches!(
        call(&d, mount::PROGRAM, 1, 0, Bytes::new(), peer).await.0,
        AcceptStat::ProgMismatch { .. }
    ));
    assert_eq!(
        call(&d, mount::PROGRAM, 3, 9, Bytes::new(), peer).await.0,
        AcceptStat::ProcUnavail
    );

    // The read-only export refuses changes with ROFS and reads fine.
    let root = nfs3::Fh3(ok.fhandle.0);
    let lk = nfs3::LookupArgs {
        what: nfs3::DirOpArgs3 {
            dir: root.clone(),
            name: nfs3::Filename3(Bytes::from_static(b"f")),
        },
    };
    let (_, r) = call(
        &d,
        nfs3::PROGRAM,
        3,
        nfs3::proc_::LOOKUP,
        xdr::to_bytes(&lk),
        peer,
    )
    .await;
    let f = dec::<nfs3::LookupRes>(&r).ok().unwrap().object;
    let w = nfs3::WriteArgs {
        file: f.clone(),
        offset: 0,
        count: 1,
        stable: nfs3::StableHow::FileSync,
        data: nfs3::Data(Bytes::from_static(b"x")),
    };
    let (_, r) = call(
        &d,
        nfs3::PROGRAM,
        3,
        nfs3::proc_::WRITE,
        xdr::to_bytes(&w),
        peer,
    )
    .await;
    assert_eq!(dec::<nfs3::WriteRes>(&r).status(), Nfsstat3::Rofs);
    let rm = nfs3::RemoveArgs {
        object: lk.what.clone(),
    };
    let (_, r) = call(
        &d,
        nfs3::PROGRAM,
        3,
        nfs3::proc_::REMOVE,
        xdr::to_bytes(&rm),
        peer,
    )
    .await;
    assert_eq!(dec::<nfs3::RemoveRes>(&r).status(), Nfsstat3::Rofs);
    let rd = nfs3::ReadArgs {
        file: f,
        offset: 0,
        count: 10,
    };
    let (_, r) = call(
        &d,
        nfs3::PROGRAM,
        3,
        nfs3::proc_::READ,
        xdr::to_bytes(&rd),
        peer,
    )
    .await;
    assert_eq!(&dec::<nfs3::ReadRes>(&r).ok().unwrap().data.0[..], b"data");
    // Unknown NFS procedures are PROC_UNAVAIL, short arguments GARBAGE_ARGS.
    assert_eq!(
        call(&d, nfs3::PROGRAM, 3, 22, Bytes::new(), peer).await.0,
        AcceptStat::ProcUnavail
    );
    assert_eq!(
        call(
            &d,
            nfs3::PROGRAM,
            3,
            nfs3::proc_::GETATTR,
            Bytes::from_static(&[0, 0, 0]),
            peer
        )
        .await
        .0,
        AcceptStat::GarbageArgs
    );
}
