//! The NFSv3 server driven in-process (no transport): every procedure's behaviour and status
//! codes, confinement, permissions, and handle survival across a server restart.

use std::sync::Arc;

use bytes::Bytes;
use nfs::nfs3::*;
use nfs::server::{ExportOptions, NfsServer, call_sync};
use nfs::vfs::Cred;
use xdr::XdrEncode;

fn server(dir: &std::path::Path) -> Arc<NfsServer> {
    NfsServer::new(
        dir,
        ExportOptions {
            read_only: false,
            name: "/export".into(),
        },
    )
    .unwrap()
}

fn call<A: XdrEncode, R: for<'a> xdr::XdrDecode<'a>>(
    s: &NfsServer,
    cred: &Cred,
    p: u32,
    a: &A,
) -> R {
    let out = call_sync(s, cred, p, &xdr::to_bytes(a)).unwrap();
    nfs::decode_exact(&out).unwrap()
}

fn name(s: &str) -> Filename3 {
    Filename3(Bytes::copy_from_slice(s.as_bytes()))
}

fn dirop(dir: &Fh3, n: &str) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

fn lookup(s: &NfsServer, c: &Cred, dir: &Fh3, n: &str) -> LookupRes {
    call(
        s,
        c,
        proc_::LOOKUP,
        &LookupArgs {
            what: dirop(dir, n),
        },
    )
}

fn create(s: &NfsServer, c: &Cred, dir: &Fh3, n: &str, mode: u32) -> NewObjRes {
    call(
        s,
        c,
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(dir, n),
            how: CreateHow3::Guarded(Sattr3 {
                mode: Some(mode),
                ..Sattr3::default()
            }),
        },
    )
}

fn mkdir(s: &NfsServer, c: &Cred, dir: &Fh3, n: &str, mode: u32) -> NewObjRes {
    call(
        s,
        c,
        proc_::MKDIR,
        &MkdirArgs {
            where_: dirop(dir, n),
            attributes: Sattr3 {
                mode: Some(mode),
                ..Sattr3::default()
            },
        },
    )
}

fn write(s: &NfsServer, c: &Cred, fh: &Fh3, off: u64, data: &[u8], stable: StableHow) -> WriteRes {
    call(
        s,
        c,
        proc_::WRITE,
        &WriteArgs {
            file: fh.clone(),
            offset: off,
            count: data.len() as u32,
            stable,
            data: Data(Bytes::copy_from_slice(data)),
        },
    )
}

fn read(s: &NfsServer, c: &Cred, fh: &Fh3, off: u64, count: u32) -> ReadRes {
    call(
        s,
        c,
        proc_::READ,
        &ReadArgs {
            file: fh.clone(),
            offset: off,
            count,
        },
    )
}

fn root() -> Cred {
    Cred::root()
}

fn user(uid: u32) -> Cred {
    Cred {
        uid,
        gid: uid,
        gids: vec![],
    }
}

#[test]
fn create_write_read_commit_and_attributes() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let c = root();
    let f = create(&s, &c, &r, "a.txt", 0o640).ok().unwrap();
    let fh = f.obj.unwrap();
    assert_eq!(f.obj_attributes.unwrap().mode, 0o640);
    // GUARDED on an existing name fails with EXIST.
    assert_eq!(create(&s, &c, &r, "a.txt", 0o640).status(), Nfsstat3::Exist);
    let w = write(&s, &c, &fh, 0, b"hello world", StableHow::Unstable)
        .ok()
        .unwrap();
    assert_eq!(w.count, 11);
    assert_eq!(w.committed, StableHow::Unstable);
    assert_eq!(w.verf, s.write_verifier());
    assert_eq!(w.file_wcc.after.unwrap().size, 11);
    let rd = read(&s, &c, &fh, 6, 100).ok().unwrap();
    assert_eq!(&rd.data.0[..], b"world");
    assert!(rd.eof);
    let rd = read(&s, &c, &fh, 0, 5).ok().unwrap();
    assert_eq!(&rd.data.0[..], b"hello");
    assert!(!rd.eof);
    let cm: CommitRes = call(
        &s,
        &c,
        proc_::COMMIT,
        &CommitArgs {
            file: fh.clone(),
            offset: 0,
            count: 0,
        },
    );
    assert_eq!(cm.ok().unwrap().verf, s.write_verifier());
    let w = write(&s, &c, &fh, 11, b"!", StableHow::FileSync)
        .ok()
        .unwrap();
    assert_eq!(w.committed, StableHow::FileSync);
    assert_eq!(
        std::fs::read(tmp.path().join("a.txt")).unwrap(),
        b"hello world!"
    );
    // GETATTR and SETATTR (truncate, chmod).
    let g: GetattrRes = call(&s, &c, proc_::GETATTR, &GetattrArgs { object: fh.clone() });
    let g = g.ok().unwrap().obj_attributes;
    assert_eq!((g.ftype, g.size), (Ftype3::Reg, 12));
    let sa: SetattrRes = call(
        &s,
        &c,
        proc_::SETATTR,
        &SetattrArgs {
            object: fh.clone(),
            new_attributes: Sattr3 {
                size: Some(5),
                mode: Some(0o600),
                ..Sattr3::default()
            },
            guard: Some(g.ctime),
        },
    );
    let after = sa.ok().unwrap().wcc.after.unwrap();
    assert_eq!((after.size, after.mode), (5, 0o600));
    // A stale guard gives NOT_SYNC.
    let sa: SetattrRes = call(
        &s,
        &c,
        proc_::SETATTR,
        &SetattrArgs {
            object: fh.clone(),
            new_attributes: Sattr3::default(),
            guard: Some(Nfstime3 {
                seconds: 1,
                nseconds: 0,
            }),
        },
    );
    assert_eq!(sa.status(), Nfsstat3::NotSync);
    // READ on a directory is ISDIR.
    assert_eq!(read(&s, &c, &r, 0, 10).status(), Nfsstat3::IsDir);
}

#[test]
fn namespace_operations() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let c = root();
    let d = mkdir(&s, &c, &r, "d", 0o755).ok().unwrap().obj.unwrap();
    assert_eq!(mkdir(&s, &c, &r, "d", 0o755).status(), Nfsstat3::Exist);
    let f = create(&s, &c, &d, "f", 0o644).ok().unwrap().obj.unwrap();
    // LOOKUP "." and ".." in d; ".." at the root stays at the root.
    assert_eq!(lookup(&s, &c, &d, ".").ok().unwrap().object, d);
    assert_eq!(lookup(&s, &c, &d, "..").ok().unwrap().object, r);
    assert_eq!(lookup(&s, &c, &r, "..").ok().unwrap().object, r);
    assert_eq!(lookup(&s, &c, &r, "nope").status(), Nfsstat3::NoEnt);
    assert_eq!(lookup(&s, &c, &f, "x").status(), Nfsstat3::NotDir);
    // Symlink / readlink: the path is content only, never followed by the server.
    let sl: NewObjRes = call(
        &s,
        &c,
        proc_::SYMLINK,
        &SymlinkArgs {
            where_: dirop(&r, "ln"),
            symlink_attributes: Sattr3::default(),
            symlink_data: NfsPath(Bytes::from_static(b"/etc/passwd")),
        },
    );
    let ln = sl.ok().unwrap().obj.unwrap();
    let rl: ReadlinkRes = call(
        &s,
        &c,
        proc_::READLINK,
        &ReadlinkArgs {
            symlink: ln.clone(),
        },
    );
    assert_eq!(&rl.ok().unwrap().data.0[..], b"/etc/passwd");
    assert_eq!(read(&s, &c, &ln, 0, 10).status(), Nfsstat3::Inval);
    assert_eq!(lookup(&s, &c, &ln, "x").status(), Nfsstat3::NotDir);
    // Rename, link, remove, rmdir.
    let rn: RenameRes = call(
        &s,
        &c,
        proc_::RENAME,
        &RenameArgs {
            from: dirop(&d, "f"),
            to: dirop(&r, "g"),
        },
    );
    assert_eq!(rn.status(), Nfsstat3::Ok);
    assert_eq!(lookup(&s, &c, &r, "g").ok().unwrap().object, f);
    let lk: LinkRes = call(
        &s,
        &c,
        proc_::LINK,
        &LinkArgs {
            file: f.clone(),
            link: dirop(&d, "h"),
        },
    );
    assert_eq!(lk.ok().unwrap().file_attributes.unwrap().nlink, 2);
    let rm: RemoveRes = call(
        &s,
        &c,
        proc_::RMDIR,
        &RemoveArgs {
            object: dirop(&r, "d"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::NotEmpty);
    let rm: RemoveRes = call(
        &s,
        &c,
        proc_::REMOVE,
        &RemoveArgs {
            object: dirop(&r, "d"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::IsDir);
    let rm: RemoveRes = call(
        &s,
        &c,
        proc_::RMDIR,
        &RemoveArgs {
            object: dirop(&r, "g"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::NotDir);
    let rm: RemoveRes = call(
        &s,
        &c,
        proc_::REMOVE,
        &RemoveArgs {
            object: dirop(&d, "h"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::Ok);
    let rm: RemoveRes = call(
        &s,
        &c,
        proc_::RMDIR,
        &RemoveArgs {
            object: dirop(&r, "d"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::Ok);
    assert_eq!(read(&s, &c, &d, 0, 1).status(), Nfsstat3::Stale);
    // Names with '/' or NUL, over-long names.
    assert_eq!(create(&s, &c, &r, "a/b", 0o644).status(), Nfsstat3::Acces);
    assert_eq!(create(&s, &c, &r, "a\0b", 0o644).status(), Nfsstat3::Acces);
    assert_eq!(
        create(&s, &c, &r, &"x".repeat(256), 0o644).status(),
        Nfsstat3::NameTooLong
    );
    assert_eq!(lookup(&s, &c, &r, "../..").status(), Nfsstat3::Acces);
    // MKNOD: FIFO works, REG is BADTYPE.
    let mk: NewObjRes = call(
        &s,
        &c,
        proc_::MKNOD,
        &MknodArgs {
            where_: dirop(&r, "fifo"),
            what: MknodData3::Fifo(Sattr3::default()),
        },
    );
    assert_eq!(mk.ok().unwrap().obj_attributes.unwrap().ftype, Ftype3::Fifo);
    let mk: NewObjRes = call(
        &s,
        &c,
        proc_::MKNOD,
        &MknodArgs {
            where_: dirop(&r, "reg"),
            what: MknodData3::Other(Ftype3::Reg),
        },
    );
    assert_eq!(mk.status(), Nfsstat3::BadType);
}

#[test]
fn symlinks_never_lead_out_of_the_export() {
    let outer = tempfile::tempdir().unwrap();
    let exp = outer.path().join("exp");
    std::fs::create_dir(&exp).unwrap();
    std::fs::write(outer.path().join("secret"), b"secret").unwrap();
    std::os::unix::fs::symlink("..", exp.join("up")).unwrap();
    std::os::unix::fs::symlink("../secret", exp.join("s")).unwrap();
    let s = server(&exp);
    let r = s.export().root_handle().unwrap();
    let c = root();
    let up = lookup(&s, &c, &r, "up").ok().unwrap();
    assert_eq!(up.obj_attributes.unwrap().ftype, Ftype3::Lnk);
    // The symlink is not a directory to the server, and cannot be read through.
    assert_eq!(
        lookup(&s, &c, &up.object, "secret").status(),
        Nfsstat3::NotDir
    );
    let sf = lookup(&s, &c, &r, "s").ok().unwrap().object;
    assert_eq!(read(&s, &c, &sf, 0, 100).status(), Nfsstat3::Inval);
    assert_eq!(
        write(&s, &c, &sf, 0, b"x", StableHow::Unstable).status(),
        Nfsstat3::Inval
    );
    assert_eq!(
        create(&s, &c, &up.object, "x", 0o644).status(),
        Nfsstat3::NotDir
    );
    assert_eq!(
        std::fs::read(outer.path().join("secret")).unwrap(),
        b"secret"
    );
    // Forged handles: wrong length is BADHANDLE, another fsid or inode is STALE.
    let bad = Fh3(Bytes::from_static(b"short"));
    let g: GetattrRes = call(&s, &c, proc_::GETATTR, &GetattrArgs { object: bad });
    assert_eq!(g.status(), Nfsstat3::BadHandle);
    let mut forged = r.0.to_vec();
    forged[12..20].copy_from_slice(&u64::MAX.to_be_bytes());
    let g: GetattrRes = call(
        &s,
        &c,
        proc_::GETATTR,
        &GetattrArgs {
            object: Fh3(forged.into()),
        },
    );
    assert_eq!(g.status(), Nfsstat3::Stale);
    let mut forged = r.0.to_vec();
    forged[4] ^= 1;
    let g: GetattrRes = call(
        &s,
        &c,
        proc_::GETATTR,
        &GetattrArgs {
            object: Fh3(forged.into()),
        },
    );
    assert_eq!(g.status(), Nfsstat3::Stale);
}

#[test]
fn auth_sys_permissions() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: needs root to act as other users");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let c = root();
    let sa: SetattrRes = call(
        &s,
        &c,
        proc_::SETATTR,
        &SetattrArgs {
            object: r.clone(),
            new_attributes: Sattr3 {
                mode: Some(0o755),
                ..Sattr3::default()
            },
            guard: None,
        },
    );
    assert_eq!(sa.status(), Nfsstat3::Ok);
    let alice = user(1000);
    let bob = user(1001);
    // Non-root cannot create in a 0755 root-owned directory.
    assert_eq!(create(&s, &alice, &r, "x", 0o644).status(), Nfsstat3::Acces);
    let home = mkdir(&s, &c, &r, "home", 0o777).ok().unwrap().obj.unwrap();
    let f = create(&s, &alice, &home, "af", 0o600).ok().unwrap();
    let fa = f.obj_attributes.unwrap();
    assert_eq!((fa.uid, fa.gid), (1000, 1000));
    let fh = f.obj.unwrap();
    assert_eq!(
        write(&s, &alice, &fh, 0, b"mine", StableHow::FileSync).status(),
        Nfsstat3::Ok
    );
    assert_eq!(read(&s, &bob, &fh, 0, 4).status(), Nfsstat3::Acces);
    assert_eq!(
        write(&s, &bob, &fh, 0, b"x", StableHow::Unstable).status(),
        Nfsstat3::Acces
    );
    // UNCHECKED CREATE of alice's existing file by bob keeps alice as the owner, and a
    // non-root caller cannot create a file owned by someone else.
    let again: NewObjRes = call(
        &s,
        &bob,
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(&home, "af"),
            how: CreateHow3::Unchecked(Sattr3::default()),
        },
    );
    assert_eq!(again.ok().unwrap().obj_attributes.unwrap().uid, 1000);
    let given: NewObjRes = call(
        &s,
        &bob,
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(&home, "bf"),
            how: CreateHow3::Guarded(Sattr3 {
                uid: Some(0),
                gid: Some(0),
                ..Sattr3::default()
            }),
        },
    );
    let ga = given.ok().unwrap().obj_attributes.unwrap();
    assert_eq!((ga.uid, ga.gid), (1001, 1001));
    // AUTH_NONE is nobody.
    assert_eq!(
        read(&s, &Cred::nobody(), &fh, 0, 4).status(),
        Nfsstat3::Acces
    );
    // Bob may not chmod or chown alice's file.
    let sa: SetattrRes = call(
        &s,
        &bob,
        proc_::SETATTR,
        &SetattrArgs {
            object: fh.clone(),
            new_attributes: Sattr3 {
                mode: Some(0o666),
                ..Sattr3::default()
            },
            guard: None,
        },
    );
    assert_eq!(sa.status(), Nfsstat3::Perm);
    // ACCESS reports exactly the bits each caller has.
    let ac: AccessRes = call(
        &s,
        &alice,
        proc_::ACCESS,
        &AccessArgs {
            object: fh.clone(),
            access: access::ALL,
        },
    );
    assert_eq!(
        ac.ok().unwrap().access,
        access::READ | access::MODIFY | access::EXTEND
    );
    let ac: AccessRes = call(
        &s,
        &bob,
        proc_::ACCESS,
        &AccessArgs {
            object: fh.clone(),
            access: access::ALL,
        },
    );
    assert_eq!(ac.ok().unwrap().access, 0);
    let ac: AccessRes = call(
        &s,
        &bob,
        proc_::ACCESS,
        &AccessArgs {
            object: home.clone(),
            access: access::ALL,
        },
    );
    assert_eq!(
        ac.ok().unwrap().access,
        access::READ | access::LOOKUP | access::MODIFY | access::EXTEND | access::DELETE
    );
    // Sticky directory: bob cannot remove alice's file.
    let sa: SetattrRes = call(
        &s,
        &c,
        proc_::SETATTR,
        &SetattrArgs {
            object: home.clone(),
            new_attributes: Sattr3 {
                mode: Some(0o1777),
                ..Sattr3::default()
            },
            guard: None,
        },
    );
    assert_eq!(sa.status(), Nfsstat3::Ok);
    let rm: RemoveRes = call(
        &s,
        &bob,
        proc_::REMOVE,
        &RemoveArgs {
            object: dirop(&home, "af"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::Acces);
    let rm: RemoveRes = call(
        &s,
        &alice,
        proc_::REMOVE,
        &RemoveArgs {
            object: dirop(&home, "af"),
        },
    );
    assert_eq!(rm.status(), Nfsstat3::Ok);
    // A directory bob cannot search.
    let priv_ = mkdir(&s, &alice, &home, "priv", 0o700)
        .ok()
        .unwrap()
        .obj
        .unwrap();
    create(&s, &alice, &priv_, "in", 0o644).ok().unwrap();
    assert_eq!(lookup(&s, &bob, &priv_, "in").status(), Nfsstat3::Acces);
    let rd: ReaddirRes = call(
        &s,
        &bob,
        proc_::READDIR,
        &ReaddirArgs {
            dir: priv_,
            cookie: 0,
            cookieverf: [0; 8],
            count: 4096,
        },
    );
    assert_eq!(rd.status(), Nfsstat3::Acces);
}

#[test]
fn readdir_and_readdirplus_paginate() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..200 {
        std::fs::write(tmp.path().join(format!("file{i:03}")), b"x").unwrap();
    }
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let c = root();
    let mut names = Vec::new();
    let mut cookie = 0;
    let mut calls = 0;
    loop {
        let rd: ReaddirRes = call(
            &s,
            &c,
            proc_::READDIR,
            &ReaddirArgs {
                dir: r.clone(),
                cookie,
                cookieverf: [0; 8],
                count: 1024,
            },
        );
        let ok = rd.ok().unwrap();
        assert!(ok.encoded_len() + 4 <= 1024);
        calls += 1;
        for e in &ok.entries.0 {
            names.push(String::from_utf8(e.name.0.to_vec()).unwrap());
            cookie = e.cookie;
        }
        if ok.eof {
            break;
        }
    }
    assert!(calls > 3);
    assert_eq!(names.len(), 202);
    assert_eq!(&names[..2], &[".", ".."]);
    let mut plus = Vec::new();
    cookie = 0;
    loop {
        let rd: ReaddirplusRes = call(
            &s,
            &c,
            proc_::READDIRPLUS,
            &ReaddirplusArgs {
                dir: r.clone(),
                cookie,
                cookieverf: [0; 8],
                dircount: 512,
                maxcount: 8192,
            },
        );
        let ok = rd.ok().unwrap();
        assert!(ok.encoded_len() + 4 <= 8192);
        for e in ok.entries.0 {
            let fh = e.name_handle.clone().unwrap();
            let a = e.name_attributes.clone().unwrap();
            assert_eq!(a.fileid, e.fileid);
            cookie = e.cookie;
            plus.push((e.name, fh));
        }
        if ok.eof {
            break;
        }
    }
    assert_eq!(plus.len(), 202);
    let (_, fh) = &plus[150];
    assert_eq!(&read(&s, &c, fh, 0, 10).ok().unwrap().data.0[..], b"x");
    let rd: ReaddirRes = call(
        &s,
        &c,
        proc_::READDIR,
        &ReaddirArgs {
            dir: r.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            count: 10,
        },
    );
    assert_eq!(rd.status(), Nfsstat3::TooSmall);
    let rd: ReaddirRes = call(
        &s,
        &c,
        proc_::READDIR,
        &ReaddirArgs {
            dir: r,
            cookie: 100_000,
            cookieverf: [0; 8],
            count: 4096,
        },
    );
    assert_eq!(rd.status(), Nfsstat3::BadCookie);
}

#[test]
fn handles_survive_restart_and_detect_reuse() {
    let tmp = tempfile::tempdir().unwrap();
    let (fh, dfh, verf) = {
        let s = server(tmp.path());
        let r = s.export().root_handle().unwrap();
        let c = root();
        let d = mkdir(&s, &c, &r, "a", 0o755).ok().unwrap().obj.unwrap();
        let d2 = mkdir(&s, &c, &d, "b", 0o755).ok().unwrap().obj.unwrap();
        let f = create(&s, &c, &d2, "deep.txt", 0o644)
            .ok()
            .unwrap()
            .obj
            .unwrap();
        write(&s, &c, &f, 0, b"persist", StableHow::FileSync)
            .ok()
            .unwrap();
        (f, d2, s.write_verifier())
    };
    // A new server instance: empty index, new write verifier, same handles.
    let s = server(tmp.path());
    assert_ne!(s.write_verifier(), verf);
    let c = root();
    assert_eq!(
        &read(&s, &c, &fh, 0, 100).ok().unwrap().data.0[..],
        b"persist"
    );
    assert_eq!(lookup(&s, &c, &dfh, "deep.txt").ok().unwrap().object, fh);
    // Rename the parent behind the server's back: the handle still resolves.
    std::fs::rename(tmp.path().join("a"), tmp.path().join("z")).unwrap();
    assert_eq!(
        &read(&s, &c, &fh, 0, 100).ok().unwrap().data.0[..],
        b"persist"
    );
    // Remove it: STALE.
    std::fs::remove_file(tmp.path().join("z/b/deep.txt")).unwrap();
    assert_eq!(read(&s, &c, &fh, 0, 100).status(), Nfsstat3::Stale);
}

#[test]
fn fs_procedures_and_exclusive_create() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let c = root();
    let fi: FsinfoRes = call(&s, &c, proc_::FSINFO, &FsArgs { fsroot: r.clone() });
    let fi = fi.ok().unwrap();
    assert_eq!(fi.rtmax, 1 << 20);
    let fs: FsstatRes = call(&s, &c, proc_::FSSTAT, &FsArgs { fsroot: r.clone() });
    assert!(fs.ok().unwrap().tbytes > 0);
    let pc: PathconfRes = call(&s, &c, proc_::PATHCONF, &FsArgs { fsroot: r.clone() });
    assert_eq!(pc.ok().unwrap().name_max, 255);
    let ex = CreateArgs {
        where_: dirop(&r, "ex"),
        how: CreateHow3::Exclusive(*b"ABCDEFGH"),
    };
    let a: NewObjRes = call(&s, &c, proc_::CREATE, &ex);
    let a = a.ok().unwrap().obj.unwrap();
    // A retransmission with the same verifier succeeds with the same object.
    let b: NewObjRes = call(&s, &c, proc_::CREATE, &ex);
    assert_eq!(b.ok().unwrap().obj.unwrap(), a);
    let other = CreateArgs {
        where_: dirop(&r, "ex"),
        how: CreateHow3::Exclusive(*b"XXXXXXXX"),
    };
    let b: NewObjRes = call(&s, &c, proc_::CREATE, &other);
    assert_eq!(b.status(), Nfsstat3::Exist);
    // Garbage arguments are refused by the decoder.
    assert!(call_sync(&s, &c, proc_::GETATTR, &Bytes::from_static(&[0, 0, 0, 65])).is_err());
    assert!(call_sync(&s, &c, 22, &Bytes::new()).is_err());
}

/// A new object gets its owner and mode whether or not they differ from what the server's own
/// create gave it (the server sets only what differs): a root caller giving a set-id file
/// away (the chown clears the set-id bits, the mode is set after it), a user's file in a
/// directory below the root, and UNCHECKED on an existing file, which keeps its data.
#[test]
fn new_objects_get_the_requested_owner_and_mode() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        println!("SKIP: needs root (the server gives objects away with chown)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = server(tmp.path());
    let r = s.export().root_handle().unwrap();
    let meta = |p: &str| std::fs::symlink_metadata(tmp.path().join(p)).unwrap();
    // Root gives a set-id file away, in the export's root.
    let given: NewObjRes = call(
        &s,
        &root(),
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(&r, "given"),
            how: CreateHow3::Guarded(Sattr3 {
                mode: Some(0o6755),
                uid: Some(1234),
                gid: Some(1234),
                ..Sattr3::default()
            }),
        },
    );
    let a = given.ok().unwrap().obj_attributes.unwrap();
    assert_eq!((a.mode, a.uid, a.gid), (0o6755, 1234, 1234));
    let m = meta("given");
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o6755, 1234, 1234));
    // Root's own file with the mode the create gave it: owner and mode as asked.
    let own = create(&s, &root(), &r, "own", 0o600).ok().unwrap();
    let a = own.obj_attributes.unwrap();
    assert_eq!((a.mode, a.uid, a.gid), (0o600, 0, 0));
    // A user's file below the root.
    let d = mkdir(&s, &root(), &r, "d", 0o777)
        .ok()
        .unwrap()
        .obj
        .unwrap();
    let f = create(&s, &user(1000), &d, "f", 0o640).ok().unwrap();
    let a = f.obj_attributes.unwrap();
    assert_eq!((a.mode, a.uid, a.gid), (0o640, 1000, 1000));
    let m = meta("d/f");
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o640, 1000, 1000));
    // UNCHECKED on an existing file: the file and its data stay.
    std::fs::write(tmp.path().join("d/f"), b"kept").unwrap();
    let again: NewObjRes = call(
        &s,
        &user(1000),
        proc_::CREATE,
        &CreateArgs {
            where_: dirop(&d, "f"),
            how: CreateHow3::Unchecked(Sattr3 {
                mode: Some(0o600),
                ..Sattr3::default()
            }),
        },
    );
    let a = again.ok().unwrap().obj_attributes.unwrap();
    assert_eq!((a.size, a.uid), (4, 1000));
    assert_eq!(std::fs::read(tmp.path().join("d/f")).unwrap(), b"kept");
}
