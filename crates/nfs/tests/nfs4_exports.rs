//! NFSv4 over several exports: the pseudo file system from PUTROOTFH down to each export the
//! client may use (others are invisible), crossing into an export and back with LOOKUPP,
//! `ro` as NFS4ERR_ROFS, a refused client's handle as NFS4ERR_ACCESS, and the pseudo
//! directories read-only.

use crate::nfs4_util::*;
use nfs::exports::Exports;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateHow, OpArgs, OpenArgs, OpenClaim};
use nfs::nfs4::consts::{attr, share};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::server::Nfs4Config;
use nfs::nfs4::types::{Fh4, StateOwner4};
use nfs::serve::{ServeConfig, start};

fn create(file: &str) -> OpArgs {
    OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: share::ACCESS_BOTH,
        share_deny: share::DENY_NONE,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(b"o"),
        },
        create: Some(CreateHow::Guarded(mode_attr(0o644))),
        claim: OpenClaim::Null(name(file)),
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pseudo_root_leads_to_the_exports_the_client_may_use() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    for d in ["a", "b", "c"] {
        std::fs::create_dir(base.join(d)).unwrap();
    }
    let text = format!(
        "{0}/a 127.0.0.1(rw,insecure,no_root_squash)\n\
         {0}/b 127.0.0.1(ro,insecure,no_root_squash)\n\
         {0}/c 127.0.0.2(rw,insecure)\n",
        base.display()
    );
    let e = Exports::parse(&text, "test-exports", &|_: &str| None).unwrap();
    let mut cfg = ServeConfig::new("/nonexistent-unused");
    cfg.exports = Some(e);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.nfs4 = Some(Nfs4Config::default().with_grace(std::time::Duration::ZERO));
    let served = start(cfg).await.unwrap();
    let mut c = Client::new(served.nfs_addr.unwrap(), "pseudo", 64).await;

    // Walk from the pseudo root to the directory holding the exports.
    let mut walk = vec![OpArgs::Putrootfh];
    for comp in base.components().skip(1) {
        walk.push(OpArgs::Lookup(name(&comp.as_os_str().to_string_lossy())));
    }
    let mut ops = walk.clone();
    ops.push(OpArgs::Readdir {
        cookie: 0,
        verf: [0; 8],
        dircount: 0,
        maxcount: 4096,
        attrs: mask(&[attr::TYPE]),
    });
    let r = c.ok(ops).await;
    let OpRes::Readdir { entries, eof, .. } = r.last().unwrap() else {
        panic!("{r:?}")
    };
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_bytes()).collect();
    assert_eq!(names, vec![&b"a"[..], b"b"], "c is not this client's");
    assert!(eof);
    let mut ops = walk.clone();
    ops.push(OpArgs::Lookup(name("c")));
    c.fails(ops, Nfsstat4::NOENT).await;

    // Into export a: its root handle is the NFSv3 one; a file can be created there; LOOKUPP
    // leads back to the pseudo directory.
    let xs = served.exports();
    let handle =
        |i: usize| Fh4::from_slice(xs[i].server.export().root_handle().unwrap().as_bytes());
    let mut ops = walk.clone();
    ops.extend([OpArgs::Lookup(name("a")), OpArgs::Getfh, create("new")]);
    let r = c.ok(ops).await;
    assert_eq!(fh_of(&r[r.len() - 2]), handle(0));
    assert!(base.join("a/new").exists());
    let mut ops = walk.clone();
    ops.extend([
        OpArgs::Lookup(name("a")),
        OpArgs::Lookupp,
        OpArgs::Lookup(name("b")),
        OpArgs::Getfh,
    ]);
    let r = c.ok(ops).await;
    assert_eq!(fh_of(r.last().unwrap()), handle(1));
    // Export b is read-only for this client; the pseudo directories are read-only too.
    c.fails(vec![OpArgs::Putfh(handle(1)), create("x")], Nfsstat4::ROFS)
        .await;
    let mut ops = walk.clone();
    ops.push(create("x"));
    c.fails(ops, Nfsstat4::ROFS).await;
    // Export c's handle (obtained elsewhere) is refused to this client.
    c.fails(
        vec![
            OpArgs::Putfh(handle(2)),
            OpArgs::Getattr(mask(&[attr::TYPE])),
        ],
        Nfsstat4::ACCESS,
    )
    .await;
    // A handle of no export is stale, garbage is a bad handle.
    c.fails(
        vec![OpArgs::Putfh(Fh4::from_slice(&[
            1, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0,
        ]))],
        Nfsstat4::STALE,
    )
    .await;
    c.fails(
        vec![OpArgs::Putfh(Fh4::from_slice(b"junk"))],
        Nfsstat4::BADHANDLE,
    )
    .await;
    served.shutdown().await;
}
