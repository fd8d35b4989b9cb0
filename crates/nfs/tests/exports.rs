//! Exports with access control (issue 22): several exports from an exports(5) file, each
//! option's effect, clients outside the list refused at MNT and at every NFS call (also with a
//! handle obtained from an allowed address), mounts below an export that cannot leave it, and
//! EXPORT listing the real paths. Clients come from distinct 127.0.0.0/8 source addresses.

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use nfs::client::{ClientError, MountClient, Nfs3Client};
use nfs::exports::Exports;
use nfs::mount::Mountstat3;
use nfs::nfs3::{CreateHow3, Fh3, Nfsstat3, Sattr3, StableHow};
use nfs::serve::{ServeConfig, Served, start};
use oncrpc::{ClientConfig, RpcTransport, TcpClient};

async fn start_with(exports: &str) -> Served {
    let e = Exports::parse(exports, "test-exports", &|_: &str| None).unwrap();
    let mut cfg = ServeConfig::new("/nonexistent-unused");
    cfg.exports = Some(e);
    cfg.tcp = Some("127.0.0.1:0".parse().unwrap());
    cfg.portmap = None;
    start(cfg).await.unwrap()
}

/// A TCP transport to `server` from source address `from` (port 0: any unprivileged one).
async fn from(src: &str, server: SocketAddr) -> Arc<dyn RpcTransport> {
    let cfg = ClientConfig::default().with_local_addr(src.parse().unwrap());
    Arc::new(TcpClient::connect_with(server, cfg).await.unwrap())
}

fn status<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Nfsstat3 {
    match r {
        Err(ClientError::Status(s)) => s,
        other => panic!("expected an NFS error status, got {other:?}"),
    }
}

fn mount_status(r: Result<Fh3, ClientError>) -> Mountstat3 {
    match r {
        Err(ClientError::Mount(s)) => s,
        other => panic!("expected a MOUNT error, got {other:?}"),
    }
}

async fn create(c: &Nfs3Client, dir: &Fh3, name: &str) -> Result<Fh3, ClientError> {
    c.create(
        dir,
        name.as_bytes(),
        CreateHow3::Unchecked(Sattr3 {
            mode: Some(0o644),
            ..Sattr3::default()
        }),
    )
    .await
    .unwrap()
    .into_result()
    .map(|r| r.obj.unwrap())
}

fn tree(root: &Path) -> (String, String) {
    let a = root.join("a");
    let b = root.join("b");
    std::fs::create_dir_all(a.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // World-writable, so squashed callers can create files.
    for d in [&a, &b, &a.join("sub")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::write(a.join("file"), b"hello").unwrap();
    std::os::unix::fs::symlink("../b", a.join("escape")).unwrap();
    (
        a.canonicalize().unwrap().display().to_string(),
        b.canonicalize().unwrap().display().to_string(),
    )
}

fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_list_mount_below_an_export_and_cannot_escape() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = tree(tmp.path());
    let s = start_with(&format!(
        "{a} 127.0.0.1(rw,insecure) 10.0.0.0/8(ro)\n{b} 127.0.0.1(rw,insecure)\n"
    ))
    .await;
    let addr = s.nfs_addr.unwrap();
    let m = MountClient::new(from("127.0.0.1:0", addr).await);
    // EXPORT lists the real paths and their client lists.
    let list = m.export().await.unwrap();
    let got: Vec<(String, Vec<String>)> = list
        .0
        .iter()
        .map(|e| {
            (
                String::from_utf8_lossy(e.dir.as_bytes()).into_owned(),
                e.groups
                    .0
                    .iter()
                    .map(|g| String::from_utf8_lossy(g.as_bytes()).into_owned())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                a.clone(),
                vec!["127.0.0.1".to_string(), "10.0.0.0/8".to_string()]
            ),
            (b.clone(), vec!["127.0.0.1".to_string()]),
        ]
    );
    // A directory below an export mounts, and its handle works.
    let sub = m.mnt(&format!("{a}/sub/deeper/")).await.unwrap();
    let c = Nfs3Client::new(from("127.0.0.1:0", addr).await);
    assert!(c.getattr(&sub).await.unwrap().into_result().is_ok());
    // No escape: `..`, a symlink out of the export, a file, a path outside every export.
    for (path, want) in [
        (format!("{a}/../b"), None),
        (format!("{a}/escape"), None),
        (format!("{a}/file"), Some(Mountstat3::NotDir)),
        (format!("{a}/missing"), Some(Mountstat3::NoEnt)),
        // Not exported, as Linux's mountd and nfs-ganesha answer it.
        (
            "/definitely/not/exported".to_string(),
            Some(Mountstat3::Acces),
        ),
        (format!("{a}x"), Some(Mountstat3::Acces)),
        (format!("{a}/sub/../.."), Some(Mountstat3::Acces)),
    ] {
        let st = mount_status(m.mnt(&path).await);
        if let Some(w) = want {
            assert_eq!(st, w, "{path}");
        }
    }
    // The two exports have different file-system ids, so handles name their export.
    let ha = m.mnt(&a).await.unwrap();
    let hb = m.mnt(&b).await.unwrap();
    let fa = c.getattr(&ha).await.unwrap().into_result().unwrap();
    let fb = c.getattr(&hb).await.unwrap().into_result().unwrap();
    assert_ne!(fa.obj_attributes.fsid, fb.obj_attributes.fsid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outside_the_list_are_refused_at_mnt_and_at_every_call() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _) = tree(tmp.path());
    let s = start_with(&format!("{a} 127.0.0.1(rw,insecure)\n")).await;
    let addr = s.nfs_addr.unwrap();
    let root = MountClient::new(from("127.0.0.1:0", addr).await)
        .mnt(&a)
        .await
        .unwrap();
    let outsider = from("127.0.0.2:0", addr).await;
    assert_eq!(
        mount_status(MountClient::new(outsider.clone()).mnt(&a).await),
        Mountstat3::Acces
    );
    // A handle obtained from an allowed address does not help.
    let c = Nfs3Client::new(outsider);
    assert_eq!(
        status(c.getattr(&root).await.unwrap().into_result()),
        Nfsstat3::Acces
    );
    assert_eq!(
        status(c.lookup(&root, b"file").await.unwrap().into_result()),
        Nfsstat3::Acces
    );
    assert_eq!(status(create(&c, &root, "x").await), Nfsstat3::Acces);
    assert_eq!(
        status(c.remove(&root, b"file").await.unwrap().into_result()),
        Nfsstat3::Acces
    );
    assert!(Path::new(&a).join("file").exists());
    assert!(!Path::new(&a).join("x").exists());
    // Every procedure but NULL, called with that handle first and its arguments cut short:
    // the gate answers NFS3ERR_ACCES before anything else reads them (an admitted caller
    // would get GARBAGE_ARGS instead).
    let t = c.transport().clone();
    for p in 1..=21u32 {
        let fh = root.clone();
        let req = oncrpc::CallRequest::new(nfs::nfs3::PROGRAM, 3, p, move |e| {
            xdr::XdrEncode::encode(&fh, e)
        });
        let res = t.call(req).await.unwrap();
        assert_eq!(
            &res[..4],
            &(Nfsstat3::Acces as u32).to_be_bytes(),
            "procedure {p}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_and_squash_options_take_effect() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = tree(tmp.path());
    let s = start_with(&format!(
        "{a} 127.0.0.1(rw,insecure) 127.0.0.3(rw,insecure,all_squash,anonuid=4242,anongid=4343) 127.0.0.4(ro,insecure)\n\
         {b} 127.0.0.1(rw,insecure,no_root_squash)\n"
    ))
    .await;
    let addr = s.nfs_addr.unwrap();
    let m = MountClient::new(from("127.0.0.1:0", addr).await);
    let (ha, hb) = (m.mnt(&a).await.unwrap(), m.mnt(&b).await.unwrap());

    // root_squash (the default): uid 0 becomes 65534.
    let root_client = Nfs3Client::new(from("127.0.0.1:0", addr).await).with_auth_sys(0, 0, vec![]);
    create(&root_client, &ha, "by-root").await.unwrap();
    // all_squash: everybody is anonuid/anongid.
    let user3 = Nfs3Client::new(from("127.0.0.3:0", addr).await).with_auth_sys(1000, 100, vec![]);
    create(&user3, &ha, "by-user3").await.unwrap();
    // no_root_squash: root stays root.
    create(&root_client, &hb, "by-root").await.unwrap();
    if running_as_root() {
        let meta = |p: String| std::fs::metadata(p).unwrap();
        let m1 = meta(format!("{a}/by-root"));
        assert_eq!((m1.uid(), m1.gid()), (65534, 65534), "root squashed");
        let m2 = meta(format!("{a}/by-user3"));
        assert_eq!((m2.uid(), m2.gid()), (4242, 4343), "all_squash");
        let m3 = meta(format!("{b}/by-root"));
        assert_eq!((m3.uid(), m3.gid()), (0, 0), "no_root_squash");
    } else {
        eprintln!(
            "SKIP ownership checks: the server must run as root to create files as other users"
        );
    }

    // ro: modifying procedures get NFS3ERR_ROFS, reads work.
    let ro = Nfs3Client::new(from("127.0.0.4:0", addr).await).with_auth_sys(1000, 100, vec![]);
    let file = ro
        .lookup(&ha, b"file")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .object;
    assert_eq!(ro.read_all(&file, 4096).await.unwrap(), b"hello");
    assert_eq!(status(create(&ro, &ha, "nope").await), Nfsstat3::Rofs);
    assert_eq!(
        status(
            ro.write(&file, 0, Bytes::from_static(b"X"), StableHow::FileSync)
                .await
                .unwrap()
                .into_result()
        ),
        Nfsstat3::Rofs
    );
    assert_eq!(
        status(ro.remove(&ha, b"file").await.unwrap().into_result()),
        Nfsstat3::Rofs
    );
    assert_eq!(std::fs::read(format!("{a}/file")).unwrap(), b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_exports_want_a_privileged_source_port() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _) = tree(tmp.path());
    let s = start_with(&format!("{a} 127.0.0.5(rw)\n")).await;
    let addr = s.nfs_addr.unwrap();
    assert_eq!(
        mount_status(
            MountClient::new(from("127.0.0.5:0", addr).await)
                .mnt(&a)
                .await
        ),
        Mountstat3::Acces
    );
    if !running_as_root() {
        eprintln!("SKIP the privileged-port half: binding a port below 1024 needs root");
        return;
    }
    // A port below 1024, as Linux's mount.nfs uses (resvport).
    let mut bound = None;
    for port in (600..1000).rev() {
        let cfg =
            ClientConfig::default().with_local_addr(format!("127.0.0.5:{port}").parse().unwrap());
        if let Ok(t) = TcpClient::connect_with(addr, cfg).await {
            bound = Some(t);
            break;
        }
    }
    let t: Arc<dyn RpcTransport> = Arc::new(bound.expect("a free port below 1024"));
    let h = MountClient::new(t.clone()).mnt(&a).await.unwrap();
    assert!(
        Nfs3Client::new(t)
            .getattr(&h)
            .await
            .unwrap()
            .into_result()
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_exports_keeps_connections_and_handles() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = tree(tmp.path());
    let parse = |text: String| Exports::parse(&text, "reload", &|_: &str| None).unwrap();
    let s = start_with(&format!("{a} 127.0.0.1(rw,insecure)\n")).await;
    let addr = s.nfs_addr.unwrap();
    let t = from("127.0.0.1:0", addr).await;
    let h = MountClient::new(t.clone()).mnt(&a).await.unwrap();
    let c = Nfs3Client::new(t.clone());
    assert!(c.getattr(&h).await.unwrap().into_result().is_ok());
    // The client is no longer listed: its next call on the same connection is refused.
    s.reload(&parse(format!(
        "{a} 127.0.0.9(rw,insecure)\n{b} 127.0.0.1(rw,insecure)\n"
    )))
    .unwrap();
    assert_eq!(
        status(c.getattr(&h).await.unwrap().into_result()),
        Nfsstat3::Acces
    );
    assert_eq!(s.exports().len(), 2);
    // Listed again: the handle from before still works, on the same connection.
    s.reload(&parse(format!("{a} 127.0.0.1(rw,insecure)\n")))
        .unwrap();
    assert!(c.getattr(&h).await.unwrap().into_result().is_ok());
    // A file naming a directory that does not exist changes nothing.
    assert!(
        s.reload(&parse(format!("{a}/missing 127.0.0.1(rw)\n")))
            .is_err()
    );
    assert_eq!(s.exports().len(), 1);
    assert!(c.getattr(&h).await.unwrap().into_result().is_ok());
}
