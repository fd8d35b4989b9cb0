//! NFSv4.1/4.2 file operations over TCP on 127.0.0.1: READDIR of a large directory in several
//! calls, SETATTR/VERIFY/NVERIFY, CREATE/READLINK/LINK/RENAME/REMOVE and the name rules, and
//! NFSv4.2's SEEK, ALLOCATE and DEALLOCATE.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use crate::nfs4_util::*;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateType, OpArgs};
use nfs::nfs4::consts::{attr, content, op, share};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::types::{Fattr4, Linktext4, Stateid4};

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

/// SETATTR of a mode on a symbolic link succeeds and changes nothing (a link has no mode of
/// its own; Linux nfsd ignores the mode there), so a client's recursive chmod, or pynfs's
/// clean-up of its test tree, goes through links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_mode_on_a_symlink_is_accepted_and_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("t"), b"x").unwrap();
    std::fs::set_permissions(
        tmp.path().join("t"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink("t", tmp.path().join("ln")).unwrap();
    let served = serve(tmp.path()).await;
    let mut c = Client::new(served.nfs_addr.unwrap(), "lnmode", 16).await;
    c.ok(vec![
        OpArgs::Putrootfh,
        OpArgs::Lookup(name("ln")),
        OpArgs::Setattr {
            stateid: Stateid4::ANONYMOUS,
            attrs: mode_attr(0o755),
        },
    ])
    .await;
    assert_eq!(
        std::fs::metadata(tmp.path().join("t")).unwrap().mode() & 0o7777,
        0o600
    );
    served.shutdown().await;
}
