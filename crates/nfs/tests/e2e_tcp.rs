//! End to end over TCP on 127.0.0.1: port mapper and rpcbind lookups, MOUNT, NFSv3 data
//! integrity at awkward sizes, namespace operations, permission and escape failures, and file
//! handles that survive a server restart.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::client::{ClientError, MountClient, Nfs3Client, PortmapClient};
use nfs::nfs3::{self, CreateHow3, Fh3, Nfsstat3, Sattr3};
use nfs::serve::{ServeConfig, Served, start};
use oncrpc::{RpcTransport, TcpClient};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start_on(dir: &std::path::Path) -> Served {
    start(ServeConfig {
        export: dir.to_path_buf(),
        export_name: Some("/export".into()),
        read_only: false,
        tcp: Some(local()),
        mount: Some(local()),
        portmap: Some(local()),
        rdma: None,
        rdma_config: None,
        budget: None,
        tcp_send_timeout: None,
        exports: None,
        drc: Some(nfs::drc::DrcConfig::default()),
        nfs4: Some(nfs::nfs4::server::Nfs4Config::default()),
        rpcbind: None,
        verifier_file: None,
        control: None,
        metrics: None,
    })
    .await
    .unwrap()
}

async fn connect(addr: SocketAddr) -> Arc<dyn RpcTransport> {
    Arc::new(TcpClient::connect(addr).await.unwrap())
}

/// Deterministic, non-repeating-at-4-KiB test data.
fn pattern(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

async fn new_file(c: &Nfs3Client, dir: &Fh3, name: &str) -> Fh3 {
    c.create(
        dir,
        name.as_bytes(),
        CreateHow3::Guarded(Sattr3 {
            mode: Some(0o644),
            ..Sattr3::default()
        }),
    )
    .await
    .unwrap()
    .into_result()
    .unwrap()
    .obj
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_over_tcp_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let served = start_on(tmp.path()).await;
    let nfs_addr = served.nfs_addr.unwrap();

    // Port mapper v2 and rpcbind v3/v4 find NFS and MOUNT.
    let pm = PortmapClient::new(connect(served.portmap_addr.unwrap()).await);
    assert_eq!(pm.getport(nfs3::PROGRAM, 3).await.unwrap(), nfs_addr.port());
    assert_eq!(
        pm.getport(nfs::mount::PROGRAM, 3).await.unwrap(),
        served.mount_addr.unwrap().port()
    );
    assert_eq!(pm.getport(999_999, 1).await.unwrap(), 0);
    for v in [3, 4] {
        let ua = pm.getaddr(v, nfs3::PROGRAM, 3, "tcp").await.unwrap();
        assert_eq!(nfs::portmap::parse_uaddr(&ua), Some(nfs_addr));
    }
    assert_eq!(pm.getaddr(4, 999_999, 1, "tcp").await.unwrap(), "");
    assert!(pm.dump().await.unwrap().0.len() >= 5);

    // MOUNT on its own port.
    let mc = MountClient::new(connect(served.mount_addr.unwrap()).await);
    mc.null().await.unwrap();
    let root = mc.mnt("/export").await.unwrap();
    // Not exported: MNT3ERR_ACCES, as from Linux's mountd.
    assert!(matches!(
        mc.mnt("/elsewhere").await,
        Err(ClientError::Mount(nfs::mount::Mountstat3::Acces))
    ));
    assert_eq!(mc.export().await.unwrap().0.len(), 1);
    assert_eq!(mc.dump().await.unwrap().0.len(), 1);

    let rpc = connect(nfs_addr).await;
    let me = rustix::process::geteuid().as_raw();
    let c = Nfs3Client::new(rpc.clone()).with_auth_sys(me, me, vec![]);
    c.null().await.unwrap();
    let info = c.fsinfo(&root).await.unwrap().into_result().unwrap();
    assert_eq!(info.wtmax, 1 << 20);
    c.fsstat(&root).await.unwrap().into_result().unwrap();
    c.pathconf(&root).await.unwrap().into_result().unwrap();

    // Data integrity at the sizes that trip up chunking and padding.
    let sizes = [0usize, 1, 4095, 4096, (1 << 20) + 3, 8 << 20];
    let mut handles = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let fh = new_file(&c, &root, &format!("f{n}")).await;
        let data = pattern(n, i as u32);
        c.write_all(&fh, &data, 1 << 20).await.unwrap();
        let back = c.read_all(&fh, 1 << 20).await.unwrap();
        assert_eq!(back.len(), n);
        assert!(back == data, "size {n}: data differs");
        let attr = c.getattr(&fh).await.unwrap().into_result().unwrap();
        assert_eq!(attr.obj_attributes.size, n as u64);
        assert_eq!(
            std::fs::read(tmp.path().join(format!("f{n}"))).unwrap(),
            data
        );
        handles.push((fh, data));
    }
    // A READ of odd size and offset.
    let (fh, data) = &handles[4];
    let r = c
        .read(fh, 12345, 7777)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_eq!(&r.data.0[..], &data[12345..12345 + 7777]);

    // Namespace: mkdir, rename, symlink/readlink, link, remove, rmdir.
    let d = c
        .mkdir(&root, b"dir", 0o755)
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let f = new_file(&c, &d, "a").await;
    c.rename(&d, b"a", &root, b"b")
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let b = c.lookup(&root, b"b").await.unwrap().into_result().unwrap();
    assert_eq!(b.object, f);
    let l = c
        .symlink(&d, b"ln", b"../b")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let rl = c.readlink(&l).await.unwrap().into_result().unwrap();
    assert_eq!(&rl.data.0[..], b"../b");
    c.link(&f, &d, b"hard")
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let names: Vec<_> = c
        .readdirplus_all(&d)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name.0.to_vec()).unwrap())
        .collect();
    assert_eq!(names, [".", "..", "hard", "ln"]);
    assert_eq!(
        c.rmdir(&root, b"dir").await.unwrap().status(),
        Nfsstat3::NotEmpty
    );
    for n in [&b"hard"[..], b"ln"] {
        c.remove(&d, n).await.unwrap().into_result().unwrap();
    }
    c.rmdir(&root, b"dir").await.unwrap().into_result().unwrap();
    assert_eq!(c.getattr(&d).await.unwrap().status(), Nfsstat3::Stale);

    // Escapes and permissions.
    let up = c.lookup(&root, b"..").await.unwrap().into_result().unwrap();
    assert_eq!(up.object, root);
    assert_eq!(
        c.lookup(&root, b"../etc").await.unwrap().status(),
        Nfsstat3::Acces
    );
    std::os::unix::fs::symlink("/", tmp.path().join("out")).unwrap();
    let out = c
        .lookup(&root, b"out")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .object;
    assert_eq!(
        c.lookup(&out, b"etc").await.unwrap().status(),
        Nfsstat3::NotDir
    );
    let sa = c
        .setattr(nfs3::SetattrArgs {
            object: root.clone(),
            new_attributes: Sattr3 {
                mode: Some(0o755),
                ..Sattr3::default()
            },
            guard: None,
        })
        .await
        .unwrap();
    assert_eq!(sa.status(), Nfsstat3::Ok);
    let stranger = Nfs3Client::new(rpc.clone()).with_auth_sys(me.wrapping_add(4242), 4242, vec![]);
    let r = stranger
        .create(&root, b"nope", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap();
    assert_eq!(r.status(), Nfsstat3::Acces);
    assert_eq!(
        stranger.remove(&root, b"b").await.unwrap().status(),
        Nfsstat3::Acces
    );
    let anon = Nfs3Client::new(rpc.clone());
    assert_eq!(
        anon.mkdir(&root, b"x", 0o777).await.unwrap().status(),
        Nfsstat3::Acces
    );

    // Restart: the handles stay valid, the write verifier changes.
    let verf = served.server().write_verifier();
    served.shutdown().await;
    let served = start_on(tmp.path()).await;
    assert_ne!(served.server().write_verifier(), verf);
    let c = Nfs3Client::new(connect(served.nfs_addr.unwrap()).await).with_auth_sys(me, me, vec![]);
    let (fh, data) = &handles[3];
    assert_eq!(&c.read_all(fh, 65536).await.unwrap()[..], &data[..]);
    let got = c.lookup(&root, b"b").await.unwrap().into_result().unwrap();
    assert_eq!(got.object, f);
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selftest_passes_against_our_server_with_default_export_name() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(tmp.path());
    cfg.tcp = Some(local());
    cfg.portmap = None;
    let served = start(cfg).await.unwrap();
    let rpc = connect(served.nfs_addr.unwrap()).await;
    // MOUNT answers on the NFS port; the default export name is "/".
    let root = MountClient::new(rpc.clone()).mnt("/").await.unwrap();
    let c = Nfs3Client::new(rpc).with_auth_sys(0, 0, vec![]);
    let mut lines = Vec::new();
    nfs::client::selftest(&c, &root, 3, |l| lines.push(l.to_string()))
        .await
        .unwrap();
    assert!(lines.iter().any(|l| l == "OK read-cmp-3145728"));
    assert!(lines.last().is_some_and(|l| l == "OK gone"));
    // Everything it created is gone.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    served.shutdown().await;
}
