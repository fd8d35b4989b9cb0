//! The open-file cache (issue 23): correct across REMOVE, RENAME (over a target too), writes
//! and removals by another process, a file moved out of the export, and bounded. Driven
//! in-process through the blocking path (`call_sync`) and over TCP, where READ and small
//! UNSTABLE WRITEs run on the calling task. And the directory-descriptor cache beside it
//! (`nfs::dircache`): correct across directories renamed, replaced and removed by another
//! process or by the server.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::dircache::DirCacheConfig;
use nfs::filecache::FileCacheConfig;
use nfs::nfs3::*;
use nfs::server::{ExportOptions, NfsServer, call_sync};
use nfs::vfs::{Cred, Export};
use xdr::XdrEncode;

fn server_with(dir: &std::path::Path, cfg: FileCacheConfig) -> Arc<NfsServer> {
    let export = Export::open(dir).unwrap().with_file_cache(cfg);
    NfsServer::from_export(
        export,
        ExportOptions {
            read_only: false,
            name: "/export".into(),
        },
        None,
    )
}

fn server(dir: &std::path::Path) -> Arc<NfsServer> {
    server_with(dir, FileCacheConfig::default())
}

fn call<A: XdrEncode, R: for<'a> xdr::XdrDecode<'a>>(s: &NfsServer, p: u32, a: &A) -> R {
    let out = call_sync(s, &Cred::root(), p, &xdr::to_bytes(a)).unwrap();
    nfs::decode_exact(&out).unwrap()
}

fn dirop(dir: &Fh3, n: &str) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: Filename3(Bytes::copy_from_slice(n.as_bytes())),
    }
}

fn create(s: &NfsServer, dir: &Fh3, n: &str) -> Fh3 {
    let r: NewObjRes = call(
        s,
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(dir, n),
            how: CreateHow3::Unchecked(Sattr3 {
                mode: Some(0o644),
                ..Sattr3::default()
            }),
        },
    );
    r.ok().unwrap().obj.unwrap()
}

/// A server (default caches) of a fresh directory holding the directories `rel`, and the
/// root's handle.
fn served_with_dirs(rel: &str) -> (tempfile::TempDir, Arc<NfsServer>, Fh3) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join(rel)).unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    (tmp, s, root)
}

/// The status of an UNCHECKED CREATE of `n` in `dir`.
fn create_status(s: &NfsServer, dir: &Fh3, n: &str) -> Nfsstat3 {
    let r: NewObjRes = call(
        s,
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(dir, n),
            how: CreateHow3::Unchecked(Sattr3::default()),
        },
    );
    r.status()
}

fn write(s: &NfsServer, fh: &Fh3, off: u64, data: &[u8]) -> WriteRes {
    call(
        s,
        proc_::WRITE,
        &WriteArgs {
            file: fh.clone(),
            offset: off,
            count: data.len() as u32,
            stable: StableHow::Unstable,
            data: Data(Bytes::copy_from_slice(data)),
        },
    )
}

fn read(s: &NfsServer, fh: &Fh3, off: u64, count: u32) -> ReadRes {
    call(
        s,
        proc_::READ,
        &ReadArgs {
            file: fh.clone(),
            offset: off,
            count,
        },
    )
}

fn read_bytes(s: &NfsServer, fh: &Fh3) -> Vec<u8> {
    read(s, fh, 0, 4096).ok().unwrap().data.0.to_vec()
}

fn getattr(s: &NfsServer, fh: &Fh3) -> GetattrRes {
    call(s, proc_::GETATTR, &GetattrArgs { object: fh.clone() })
}

fn remove(s: &NfsServer, dir: &Fh3, n: &str) -> RemoveRes {
    call(
        s,
        proc_::REMOVE,
        &RemoveArgs {
            object: dirop(dir, n),
        },
    )
}

fn rename(s: &NfsServer, dir: &Fh3, from: &str, to: &str) -> RenameRes {
    call(
        s,
        proc_::RENAME,
        &RenameArgs {
            from: dirop(dir, from),
            to: dirop(dir, to),
        },
    )
}

fn lookup(s: &NfsServer, dir: &Fh3, n: &str) -> LookupRes {
    call(
        s,
        proc_::LOOKUP,
        &LookupArgs {
            what: dirop(dir, n),
        },
    )
}

fn ino(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().ino()
}

#[test]
fn reads_and_writes_reuse_one_open_file() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    assert_eq!(write(&s, &fh, 0, b"hello").status(), Nfsstat3::Ok);
    let before = s.export().file_cache_stats();
    for _ in 0..5 {
        assert_eq!(&read_bytes(&s, &fh)[..5], b"hello");
        assert_eq!(write(&s, &fh, 5, b" world").status(), Nfsstat3::Ok);
        assert_eq!(getattr(&s, &fh).ok().unwrap().obj_attributes.size, 11);
    }
    let after = s.export().file_cache_stats();
    assert_eq!(s.export().file_cache_len(), 1);
    // Fifteen calls, each served by the one entry.
    assert_eq!(after.hits - before.hits, 15);
    assert_eq!(std::fs::read(tmp.path().join("a")).unwrap(), b"hello world");
}

#[test]
fn remove_closes_the_file_and_its_handle_goes_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"data");
    let i = ino(&tmp.path().join("a"));
    assert_eq!(s.export().file_cache_len(), 1);
    assert_eq!(remove(&s, &root, "a").status(), Nfsstat3::Ok);
    assert_eq!(s.export().file_cache_len(), 0, "inode {i} still held open");
    assert_eq!(read(&s, &fh, 0, 10).status(), Nfsstat3::Stale);
    assert_eq!(write(&s, &fh, 0, b"x").status(), Nfsstat3::Stale);
    assert_eq!(getattr(&s, &fh).status(), Nfsstat3::Stale);
}

#[test]
fn remove_of_one_of_two_links_closes_the_file_and_the_other_link_still_serves_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"data");
    std::fs::hard_link(tmp.path().join("a"), tmp.path().join("b")).unwrap();
    assert_eq!(s.export().file_cache_len(), 1);
    assert_eq!(remove(&s, &root, "a").status(), Nfsstat3::Ok);
    // The name went, the inode stays (under "b"): the descriptor is closed all the same.
    assert_eq!(s.export().file_cache_len(), 0);
    let b = lookup(&s, &root, "b").ok().unwrap().object;
    assert_eq!(&read_bytes(&s, &b)[..4], b"data");
    assert_eq!(write(&s, &b, 4, b"!").status(), Nfsstat3::Ok);
    assert_eq!(std::fs::read(tmp.path().join("b")).unwrap(), b"data!");
}

#[test]
fn a_file_removed_by_another_process_goes_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"data");
    assert_eq!(s.export().file_cache_len(), 1);
    std::fs::remove_file(tmp.path().join("a")).unwrap();
    // The descriptor still reads the unlinked inode; the cache must not serve it.
    assert_eq!(read(&s, &fh, 0, 10).status(), Nfsstat3::Stale);
    assert_eq!(getattr(&s, &fh).status(), Nfsstat3::Stale);
    assert_eq!(s.export().file_cache_len(), 0);
}

#[test]
fn writes_by_another_process_are_seen_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"one");
    assert_eq!(read_bytes(&s, &fh), b"one");
    std::fs::write(tmp.path().join("a"), b"two, longer").unwrap();
    let r = read(&s, &fh, 0, 4096).ok().unwrap();
    assert_eq!(&r.data.0[..], b"two, longer");
    assert!(r.eof);
    assert_eq!(r.file_attributes.unwrap().size, 11);
    assert_eq!(getattr(&s, &fh).ok().unwrap().obj_attributes.size, 11);
    // A truncation and a mode change from outside, too.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(tmp.path().join("a"))
        .unwrap();
    f.set_len(2).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path().join("a"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let a = getattr(&s, &fh).ok().unwrap().obj_attributes;
    assert_eq!((a.size, a.mode), (2, 0o600));
    assert_eq!(read_bytes(&s, &fh), b"tw");
    assert!(s.export().file_cache_stats().hits > 0);
}

#[test]
fn rename_keeps_the_handle_and_rename_over_a_target_drops_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let a = create(&s, &root, "a");
    let b = create(&s, &root, "b");
    write(&s, &a, 0, b"A");
    write(&s, &b, 0, b"B");
    assert_eq!(s.export().file_cache_len(), 2);
    assert_eq!(rename(&s, &root, "a", "a2").status(), Nfsstat3::Ok);
    assert_eq!(read_bytes(&s, &a), b"A");
    // "a2" replaces "b": b's only name is gone, so is its open file, and its handle is stale.
    assert_eq!(rename(&s, &root, "a2", "b").status(), Nfsstat3::Ok);
    assert_eq!(s.export().file_cache_len(), 1);
    assert_eq!(read(&s, &b, 0, 10).status(), Nfsstat3::Stale);
    assert_eq!(read_bytes(&s, &a), b"A");
    assert_eq!(write(&s, &a, 1, b"!").status(), Nfsstat3::Ok);
    assert_eq!(std::fs::read(tmp.path().join("b")).unwrap(), b"A!");
}

#[test]
fn a_file_replaced_by_another_process_goes_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"old");
    // What an editor's save does: a new file renamed over the old name.
    std::fs::write(tmp.path().join("a.tmp"), b"new").unwrap();
    std::fs::rename(tmp.path().join("a.tmp"), tmp.path().join("a")).unwrap();
    assert_eq!(read(&s, &fh, 0, 10).status(), Nfsstat3::Stale);
    assert_eq!(write(&s, &fh, 0, b"x").status(), Nfsstat3::Stale);
    assert_eq!(std::fs::read(tmp.path().join("a")).unwrap(), b"new");
}

#[test]
fn a_file_renamed_by_another_process_is_still_served() {
    let tmp = tempfile::tempdir().unwrap();
    // Every use walks the path again (recheck 0), so the walk must find the new name.
    let s = server_with(
        tmp.path(),
        FileCacheConfig {
            recheck: Duration::ZERO,
            ..FileCacheConfig::default()
        },
    );
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"data");
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    std::fs::rename(tmp.path().join("a"), tmp.path().join("sub/b")).unwrap();
    assert_eq!(read_bytes(&s, &fh), b"data");
    assert_eq!(write(&s, &fh, 4, b"!").status(), Nfsstat3::Ok);
    assert_eq!(std::fs::read(tmp.path().join("sub/b")).unwrap(), b"data!");
}

#[test]
fn a_file_moved_out_of_the_export_is_not_served_after_the_recheck() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let s = server_with(
        tmp.path(),
        FileCacheConfig {
            recheck: Duration::ZERO,
            ..FileCacheConfig::default()
        },
    );
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    write(&s, &fh, 0, b"secret");
    // Same file system, so the rename keeps the inode (skip otherwise).
    if std::fs::rename(tmp.path().join("a"), outside.path().join("a")).is_err() {
        eprintln!("skipped: the two temporary directories are on different file systems");
        return;
    }
    assert_eq!(read(&s, &fh, 0, 10).status(), Nfsstat3::Stale);
    assert_eq!(getattr(&s, &fh).status(), Nfsstat3::Stale);
}

#[test]
fn a_directory_moved_out_of_the_export_is_not_served_after_the_recheck() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let export = Export::open(tmp.path())
        .unwrap()
        .with_dir_cache(DirCacheConfig {
            recheck: Duration::ZERO,
            ..DirCacheConfig::default()
        });
    let s = NfsServer::from_export(
        export,
        ExportOptions {
            read_only: false,
            name: "/export".into(),
        },
        None,
    );
    let root = s.export().root_handle().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let d = lookup(&s, &root, "d").ok().unwrap().object;
    let x = create(&s, &d, "x");
    assert_eq!(getattr(&s, &x).status(), Nfsstat3::Ok);
    if std::fs::rename(tmp.path().join("d"), outside.path().join("d")).is_err() {
        eprintln!("skipped: the two temporary directories are on different file systems");
        return;
    }
    // The file is found through its directory's path, which no longer leads to it.
    assert_eq!(getattr(&s, &x).status(), Nfsstat3::Stale);
    assert_ne!(lookup(&s, &d, "x").status(), Nfsstat3::Ok);
    assert_ne!(create_status(&s, &d, "y"), Nfsstat3::Ok);
    assert!(!outside.path().join("d/y").exists());
}

#[test]
fn a_directory_replaced_by_another_process_is_not_taken_for_the_new_one() {
    let (tmp, s, root) = served_with_dirs("d");
    let old = lookup(&s, &root, "d").ok().unwrap().object;
    // The server opens "d" (and keeps its descriptor) for these.
    create(&s, &old, "a");
    assert_eq!(lookup(&s, &old, "a").status(), Nfsstat3::Ok);
    let before = s.export().dir_cache_stats();
    assert!(before.entries >= 1 && before.hits >= 1, "{before:?}");
    // Another process moves "d" away and makes a new directory under its name.
    std::fs::rename(tmp.path().join("d"), tmp.path().join("e")).unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("d/only-new"), b"x").unwrap();
    let new = lookup(&s, &root, "d").ok().unwrap().object;
    assert_ne!(new, old);
    // The new directory's handle finds its own entries, not the old directory's.
    assert_eq!(lookup(&s, &new, "only-new").status(), Nfsstat3::Ok);
    assert_eq!(lookup(&s, &new, "a").status(), Nfsstat3::NoEnt);
    create(&s, &new, "b");
    assert!(tmp.path().join("d/b").exists());
    assert!(!tmp.path().join("e/b").exists());
    // The old handle names the moved directory (found again by the index rebuild), never the
    // new one under its old name.
    match lookup(&s, &old, "a") {
        Res::Ok(_) => {
            create(&s, &old, "c");
            assert!(tmp.path().join("e/c").exists());
            assert!(!tmp.path().join("d/c").exists());
        }
        Res::Err(st, _) => assert_eq!(st, Nfsstat3::Stale),
    }
    // Removed by another process: its handle gets no new entries anywhere.
    std::fs::remove_file(tmp.path().join("d/only-new")).unwrap();
    std::fs::remove_file(tmp.path().join("d/b")).unwrap();
    std::fs::remove_dir(tmp.path().join("d")).unwrap();
    assert_ne!(create_status(&s, &new, "z"), Nfsstat3::Ok);
    assert!(!tmp.path().join("d").exists());
}

#[test]
fn a_directory_renamed_or_removed_by_the_server_is_looked_up_afresh() {
    let (tmp, s, root) = served_with_dirs("d/sub");
    let d = lookup(&s, &root, "d").ok().unwrap().object;
    let sub = lookup(&s, &d, "sub").ok().unwrap().object;
    create(&s, &sub, "f");
    assert_eq!(rename(&s, &root, "d", "e").status(), Nfsstat3::Ok);
    // The same handles, now below "e": creates land there, and a new "d" is a new directory.
    create(&s, &sub, "g");
    assert!(tmp.path().join("e/sub/g").exists());
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let d2 = lookup(&s, &root, "d").ok().unwrap().object;
    assert_eq!(lookup(&s, &d2, "sub").status(), Nfsstat3::NoEnt);
    // RMDIR by the server, then a directory of the same name made again.
    for n in ["f", "g"] {
        assert_eq!(remove(&s, &sub, n).status(), Nfsstat3::Ok);
    }
    let r: RemoveRes = call(
        &s,
        proc_::RMDIR,
        &RemoveArgs {
            object: dirop(&lookup(&s, &root, "e").ok().unwrap().object, "sub"),
        },
    );
    assert_eq!(r.status(), Nfsstat3::Ok);
    std::fs::create_dir(tmp.path().join("e/sub")).unwrap();
    assert_ne!(create_status(&s, &sub, "h"), Nfsstat3::Ok);
    assert!(!tmp.path().join("e/sub/h").exists());
}

#[test]
fn the_cache_stays_within_its_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server_with(
        tmp.path(),
        FileCacheConfig {
            capacity: 4,
            ..FileCacheConfig::default()
        },
    );
    let root = s.export().root_handle().unwrap();
    let mut handles = Vec::new();
    for i in 0..40 {
        let fh = create(&s, &root, &format!("f{i}"));
        assert_eq!(
            write(&s, &fh, 0, format!("{i}").as_bytes()).status(),
            Nfsstat3::Ok
        );
        assert!(s.export().file_cache_len() <= 4);
        handles.push(fh);
    }
    assert_eq!(s.export().file_cache_len(), 4);
    assert_eq!(s.export().file_cache_stats().evictions, 36);
    // Evicted files are opened again on use, with their own data.
    for (i, fh) in handles.iter().enumerate() {
        assert_eq!(read_bytes(&s, fh), format!("{i}").as_bytes());
        assert!(s.export().file_cache_len() <= 4);
    }
}

#[test]
fn zero_capacity_still_serves_every_call() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server_with(
        tmp.path(),
        FileCacheConfig {
            capacity: 0,
            ..FileCacheConfig::default()
        },
    );
    let root = s.export().root_handle().unwrap();
    let fh = create(&s, &root, "a");
    assert_eq!(write(&s, &fh, 0, b"abc").status(), Nfsstat3::Ok);
    assert_eq!(read_bytes(&s, &fh), b"abc");
    assert_eq!(s.export().file_cache_len(), 0);
}

/// `dir` served over TCP on 127.0.0.1 as `/export`, mounted, and an NFSv3 client calling it
/// as the current user.
async fn serve_over_tcp(
    dir: &std::path::Path,
) -> (nfs::serve::Served, Fh3, nfs::client::Nfs3Client) {
    use nfs::client::{MountClient, Nfs3Client};
    use nfs::serve::{ServeConfig, start};
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some("127.0.0.1:0".parse().unwrap());
    cfg.mount = Some("127.0.0.1:0".parse().unwrap());
    cfg.portmap = None;
    cfg.export_name = Some("/export".into());
    let served = start(cfg).await.unwrap();
    let mc = MountClient::new(Arc::new(
        oncrpc::TcpClient::connect(served.mount_addr.unwrap())
            .await
            .unwrap(),
    ));
    let root = mc.mnt("/export").await.unwrap();
    let me = rustix::process::geteuid().as_raw();
    let c = Nfs3Client::new(Arc::new(
        oncrpc::TcpClient::connect(served.nfs_addr.unwrap())
            .await
            .unwrap(),
    ))
    .with_auth_sys(me, me, vec![]);
    (served, root, c)
}

/// Over TCP, where READ and small UNSTABLE WRITEs run on the calling task through the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tcp_the_inline_path_sees_outside_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let (served, root, c) = serve_over_tcp(tmp.path()).await;
    let fh = c
        .create(
            &root,
            b"a",
            CreateHow3::Unchecked(Sattr3 {
                mode: Some(0o644),
                ..Sattr3::default()
            }),
        )
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let w = c
        .write(&fh, 0, Bytes::from_static(b"first"), StableHow::Unstable)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_eq!(w.count, 5);
    let r = c.read(&fh, 0, 100).await.unwrap().into_result().unwrap();
    assert_eq!(&r.data.0[..], b"first");
    std::fs::write(tmp.path().join("a"), b"second!").unwrap();
    let r = c.read(&fh, 0, 100).await.unwrap().into_result().unwrap();
    assert_eq!((&r.data.0[..], r.eof), (&b"second!"[..], true));
    std::fs::remove_file(tmp.path().join("a")).unwrap();
    assert_eq!(c.read(&fh, 0, 100).await.unwrap().status(), Nfsstat3::Stale);
    assert_eq!(
        c.write(&fh, 0, Bytes::from_static(b"x"), StableHow::Unstable)
            .await
            .unwrap()
            .status(),
        Nfsstat3::Stale
    );
    served.shutdown().await;
}

/// A file system that refuses RWF_NOWAIT (tmpfs: EOPNOTSUPP): READs that would run on the
/// calling task fall back to the blocking path, one at a time and in parallel, small and up
/// to 1 MiB (a call alone on its connection may read that much inline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_a_file_system_without_nowait_reads_succeed() {
    let shm = std::path::Path::new("/dev/shm");
    let Ok(tmp) = tempfile::tempdir_in(shm) else {
        println!("SKIP: no writable /dev/shm");
        return;
    };
    let probe = tmp.path().join("probe");
    std::fs::write(&probe, b"x").unwrap();
    let f = std::fs::File::open(&probe).unwrap();
    let mut b = [0u8; 1];
    let nowait = rustix::io::preadv2(
        &f,
        &mut [std::io::IoSliceMut::new(&mut b)],
        0,
        rustix::io::ReadWriteFlags::NOWAIT,
    );
    if nowait != Err(rustix::io::Errno::OPNOTSUPP) {
        println!("SKIP: /dev/shm takes RWF_NOWAIT reads here ({nowait:?})");
        return;
    }
    let data: Vec<u8> = (0..(1u32 << 20) + 4096).map(|i| (i % 251) as u8).collect();
    std::fs::write(tmp.path().join("big"), &data).unwrap();
    let (served, root, c) = serve_over_tcp(tmp.path()).await;
    let c = Arc::new(c);
    let fh = c
        .lookup(&root, b"big")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .object;
    // One at a time (each call alone on the connection), then 8 at once.
    for (off, n) in [
        (0u64, 4096u32),
        (4096, 65536),
        (0, 1 << 20),
        (1 << 20, 1 << 20),
    ] {
        let r = c.read(&fh, off, n).await.unwrap().into_result().unwrap();
        let end = (off as usize + n as usize).min(data.len());
        assert_eq!(&r.data.0[..], &data[off as usize..end], "READ {off}+{n}");
    }
    let mut tasks = Vec::new();
    for k in 0..8u64 {
        let (c, fh) = (c.clone(), fh.clone());
        tasks.push(tokio::spawn(async move {
            c.read(&fh, k * 131_072, 131_072)
                .await
                .unwrap()
                .into_result()
                .unwrap()
        }));
    }
    for (k, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        let off = k * 131_072;
        assert_eq!(
            &r.data.0[..],
            &data[off..off + 131_072],
            "parallel READ {k}"
        );
    }
    served.shutdown().await;
}

/// Which way READs that must not wait go, learnt when the file system refuses RWF_NOWAIT:
/// a memory file system (tmpfs) is read plainly on the calling task; one that may wait for a
/// device or a server (procfs here stands for those) never on the calling task.
#[test]
fn a_refused_nowait_read_is_learnt_per_file_system_kind() {
    use nfs::filecache::{NowaitReads, OpenFile};
    let open =
        |p: &std::path::Path| OpenFile::new(1, (0, 0), std::fs::File::open(p).unwrap(), false);
    // tmpfs's statfs magic (linux/magic.h), asked here independently of the code under test.
    let shm_is_tmpfs = rustix::fs::statfs("/dev/shm").is_ok_and(|s| {
        #[allow(clippy::unnecessary_cast)]
        let t = s.f_type as i64;
        t == 0x0102_1994
    });
    match tempfile::tempdir_in("/dev/shm") {
        Ok(_) if !shm_is_tmpfs => println!("SKIP (tmpfs part): /dev/shm is not a tmpfs here"),
        Ok(tmp) => {
            let p = tmp.path().join("f");
            std::fs::write(&p, b"x").unwrap();
            let f = open(&p);
            assert_eq!(f.nowait_reads(), NowaitReads::Try);
            assert_eq!(f.nowait_refused(), NowaitReads::Plain);
            assert_eq!(f.nowait_reads(), NowaitReads::Plain);
        }
        Err(e) => println!("SKIP (tmpfs part): no writable /dev/shm: {e}"),
    }
    let f = open(std::path::Path::new("/proc/self/status"));
    assert!(!f.in_memory());
    assert_eq!(f.nowait_refused(), NowaitReads::Never);
    assert_eq!(f.nowait_reads(), NowaitReads::Never);
}

/// WRITEs of up to 1 MiB to a file in memory finish on the calling task when the call is alone
/// on its connection, FILE_SYNC ones included; their data is all there, read back both through
/// the server and from the file itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_stable_writes_to_a_file_in_memory_land_whole() {
    use nfs::nfs3::StableHow;
    let Ok(tmp) = tempfile::tempdir_in("/dev/shm") else {
        println!("SKIP: no writable /dev/shm");
        return;
    };
    let probe = nfs::filecache::OpenFile::new(
        1,
        (0, 0),
        std::fs::File::create(tmp.path().join("probe")).unwrap(),
        true,
    );
    if !probe.in_memory() {
        println!("SKIP: /dev/shm is not tmpfs here");
        return;
    }
    std::fs::write(tmp.path().join("w"), b"").unwrap();
    let (served, root, c) = serve_over_tcp(tmp.path()).await;
    let fh = c
        .lookup(&root, b"w")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .object;
    let data: Bytes = (0..(2u32 << 20))
        .map(|i| (i % 253) as u8)
        .collect::<Vec<_>>()
        .into();
    let plan = [
        (0usize, 1usize << 20, StableHow::FileSync),
        (1 << 20, 700_000, StableHow::Unstable),
        (1_748_576, (2 << 20) - 1_748_576, StableHow::DataSync),
    ];
    for (off, n, how) in plan {
        let r = c
            .write(&fh, off as u64, data.slice(off..off + n), how)
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(r.count as usize, n, "WRITE {off}+{n}");
    }
    assert_eq!(std::fs::read(tmp.path().join("w")).unwrap(), &data[..]);
    let r = c
        .read(&fh, 0, 1 << 20)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_eq!(&r.data.0[..], &data[..1 << 20]);
    // COMMIT of the file in memory (answered on the calling task): the WRITEs' verifier, and
    // the file's size after it.
    let w = c
        .write(&fh, 0, data.slice(..10), StableHow::Unstable)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let k = c.commit(&fh).await.unwrap().into_result().unwrap();
    assert_eq!(k.verf, w.verf);
    let after = k.file_wcc.after.expect("post-op attributes");
    assert_eq!(after.size, 2 << 20);
    served.shutdown().await;
}
