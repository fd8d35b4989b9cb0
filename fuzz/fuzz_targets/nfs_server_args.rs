//! Feed arbitrary bytes as the arguments of every NFSv3, MOUNT v3 and port mapper procedure,
//! through the real `Dispatcher` and programs, over a scratch export. Never panics; every call
//! gets a reply.
//!
//! Input: byte 0 picks the program and procedure, byte 1 the credential and whether the
//! arguments start with a valid file handle (the root's or a file's, so the fuzzer reaches the
//! procedures' bodies and not only handle checks); the rest is the argument stream.
#![no_main]

#[path = "scratch.rs"]
mod scratch;

use std::sync::{Arc, Mutex, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use oncrpc::{AuthSys, CallContext, CallHeader, Dispatcher, OpaqueAuth};

struct World {
    rt: tokio::runtime::Runtime,
    dispatcher: Dispatcher,
    handles: Vec<Bytes>,
    _dir: tempfile::TempDir,
    runs: Mutex<u64>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        scratch::limit_file_size();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/file"), b"0123456789").expect("write");
        std::os::unix::fs::symlink("../sub", dir.path().join("ln")).expect("symlink");
        let server = nfs::server::NfsServer::new(
            dir.path(),
            nfs::server::ExportOptions {
                read_only: false,
                name: "/export".into(),
            },
        )
        .expect("server");
        let root = server.export().root_handle().expect("root");
        let sub = server
            .export()
            .stat_rel(std::path::Path::new("sub/file"))
            .map(|st| server.export().handle_of(&st))
            .expect("file");
        server.export().remember(
            server
                .export()
                .stat_rel(std::path::Path::new("sub/file"))
                .expect("st")
                .stx_ino,
            std::path::Path::new("sub/file"),
        );
        let pm = nfs::portmap::Portmapper::new();
        let dispatcher = Dispatcher::new()
            .with(server.nfs_program())
            .with(server.mount_program())
            .with(Arc::new(nfs::portmap::PortmapProgram(pm)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        World {
            rt,
            dispatcher,
            handles: vec![root.0, sub.0],
            _dir: dir,
            runs: Mutex::new(0),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Some((&flags, rest)) = rest.split_first() else {
        return;
    };
    let (prog, vers, proc_) = match sel % 3 {
        0 => (100003, 3, u32::from(sel / 3) % 23),
        1 => (100005, 3, u32::from(sel / 3) % 7),
        _ => (100000, 2 + u32::from(sel / 3) % 3, u32::from(sel / 9) % 14),
    };
    let mut args = BytesMut::new();
    if flags & 0x6 != 0 {
        let fh = &w.handles[usize::from(flags >> 1 & 1)];
        args.put_u32(fh.len() as u32);
        args.put_slice(fh);
    }
    args.put_slice(rest);
    let cred = match flags >> 4 & 3 {
        0 => OpaqueAuth::none(),
        1 => OpaqueAuth::sys(&AuthSys::default()),
        _ => OpaqueAuth::sys(&AuthSys {
            uid: 1000 + u32::from(flags >> 6),
            gid: 1000,
            ..AuthSys::default()
        }),
    };
    let header = CallHeader {
        xid: 1,
        prog,
        vers,
        proc_,
        cred,
        verf: OpaqueAuth::none(),
    };
    let reply = w.rt.block_on(w.dispatcher.dispatch_call(
        header,
        args.freeze(),
        CallContext::local(),
        xdr::DdpPolicy::Inline,
    ));
    assert!(reply.is_some(), "every call is answered");
    // Keep the scratch export small (see scratch.rs).
    let mut runs = w.runs.lock().unwrap_or_else(|p| p.into_inner());
    *runs += 1;
    if runs.is_multiple_of(2_000) {
        scratch::wipe(w._dir.path());
    }
});
