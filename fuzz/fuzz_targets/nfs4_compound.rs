//! Execute arbitrary NFSv4 COMPOUNDs against a scratch export: the header and operations are
//! decoded by the executor as the NFS program would hand them over, and every operation that
//! decodes runs against real files and the state tables. Never panics; every COMPOUND either
//! is refused as garbage (its header does not decode) or gets a reply whose `encoded_len` is
//! what it encodes to.
//!
//! Input: byte 0 holds flags (bit 0: prepend a valid SEQUENCE on the world's session, so the
//! fuzzer reaches the file operations; bit 1: then PUTROOTFH; bit 2: minor version 2 instead of
//! 1; bit 3: AUTH_SYS uid 1000 instead of the server's own uid), byte 1 the number of operations
//! that follow; the rest is the operation stream (opnum, arguments, ...).
#![no_main]

#[path = "scratch.rs"]
mod scratch;

use std::sync::{Arc, Mutex, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateSessionArgs, OpArgs, SequenceArgs};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::server::{Nfs4Config, Nfs4Server, Request};
use nfs::nfs4::types::{ChannelAttrs4, ClientOwner4, Opaque1024, StateProtectA};
use oncrpc::{AuthSys, Credential};

struct World {
    server: Arc<Nfs4Server>,
    session: [u8; 16],
    seq: Mutex<u32>,
    dir: tempfile::TempDir,
    runs: Mutex<u64>,
}

fn call(
    server: &Nfs4Server,
    cred: &Credential,
    args: Bytes,
) -> Option<nfs::nfs4::compound::CompoundReply> {
    server
        .compound(&Request {
            args: &args,
            cred,
            peer: None,
            conn: 1,
        })
        .ok()
}

fn compound(ops: &[OpArgs]) -> Bytes {
    nfs::nfs4::client_codec::encode_compound(b"", 1, ops)
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        scratch::limit_file_size();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/file"), b"0123456789").expect("write");
        std::os::unix::fs::symlink("../sub", dir.path().join("ln")).expect("symlink");
        let table = nfs::gate::ExportTable::single(dir.path(), None, false, None).expect("table");
        let server = Nfs4Server::new(
            Arc::new(table),
            Nfs4Config::default().with_grace(std::time::Duration::ZERO),
        );
        let cred = Credential::None;
        let r = call(
            &server,
            &cred,
            compound(&[OpArgs::ExchangeId {
                owner: ClientOwner4 {
                    verifier: [1; 8],
                    ownerid: Opaque1024::from_slice(b"fuzz"),
                },
                flags: 0,
                protect: StateProtectA::None,
                impl_id: None,
            }]),
        )
        .expect("exchange_id");
        let Some(OpRes::ExchangeId(x)) = r.results.first() else {
            panic!("EXCHANGE_ID failed: {r:?}");
        };
        let attrs = ChannelAttrs4 {
            headerpadsize: 0,
            maxrequestsize: 1 << 20,
            maxresponsesize: 1 << 20,
            maxresponsesize_cached: 8192,
            maxoperations: 64,
            maxrequests: 1,
            rdma_ird: None,
        };
        let r = call(
            &server,
            &cred,
            compound(&[OpArgs::CreateSession(Box::new(CreateSessionArgs {
                clientid: x.clientid,
                sequence: x.sequenceid,
                flags: 0,
                fore: attrs.clone(),
                back: attrs,
                cb_program: 0,
                sec: vec![],
            }))]),
        )
        .expect("create_session");
        let Some(OpRes::CreateSession(cs)) = r.results.first() else {
            panic!("CREATE_SESSION failed: {r:?}");
        };
        // RECLAIM_COMPLETE, as a real client sends before its first OPEN: without it every
        // new open or lock is NFS4ERR_GRACE (RFC 8881 §18.51.3) and the fuzzer would not
        // reach them.
        let r = call(
            &server,
            &cred,
            compound(&[
                OpArgs::Sequence(SequenceArgs {
                    session: cs.session,
                    sequenceid: 1,
                    slotid: 0,
                    highest_slotid: 0,
                    cachethis: false,
                }),
                OpArgs::ReclaimComplete(false),
            ]),
        )
        .expect("reclaim_complete");
        assert_eq!(r.status, Nfsstat4::OK, "RECLAIM_COMPLETE failed: {r:?}");
        World {
            server,
            session: cs.session,
            seq: Mutex::new(1),
            dir,
            runs: Mutex::new(0),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let [flags, nops, rest @ ..] = data else {
        return;
    };
    let mut prefix = Vec::new();
    if flags & 1 != 0 {
        let mut seq = w.seq.lock().unwrap_or_else(|p| p.into_inner());
        *seq = seq.wrapping_add(1);
        prefix.push(OpArgs::Sequence(SequenceArgs {
            session: w.session,
            sequenceid: *seq,
            slotid: 0,
            highest_slotid: 0,
            cachethis: flags & 0x10 != 0,
        }));
        if flags & 2 != 0 {
            prefix.push(OpArgs::Putrootfh);
        }
    }
    let minor = if flags & 4 != 0 { 2 } else { 1 };
    let mut args = BytesMut::new();
    args.put_u32(0); // empty tag
    args.put_u32(minor);
    args.put_u32(prefix.len() as u32 + u32::from(*nops));
    let mut e = xdr::Encoder::new();
    for p in &prefix {
        p.encode(&mut e);
    }
    args.put_slice(&e.into_bytes());
    args.put_slice(rest);
    let cred = if flags & 8 != 0 {
        Credential::Sys(AuthSys {
            uid: 1000,
            gid: 1000,
            ..AuthSys::default()
        })
    } else {
        let (uid, gid) = (rustix_ids().0, rustix_ids().1);
        Credential::Sys(AuthSys {
            uid,
            gid,
            ..AuthSys::default()
        })
    };
    if let Some(reply) = call(&w.server, &cred, args.freeze()) {
        let mut enc = xdr::Encoder::new();
        reply.encode(&mut enc);
        assert_eq!(enc.into_bytes().len(), reply.encoded_len());
        // A SEQUENCE that failed left the slot's sequence id where it was.
        if flags & 1 != 0 && !matches!(reply.results.first(), Some(OpRes::Sequence(_))) {
            let mut seq = w.seq.lock().unwrap_or_else(|p| p.into_inner());
            *seq = seq.wrapping_sub(1);
        }
    }
    // Keep the scratch export small (see scratch.rs).
    let mut runs = w.runs.lock().unwrap_or_else(|p| p.into_inner());
    *runs += 1;
    if runs.is_multiple_of(2_000) {
        scratch::wipe(w.dir.path());
    }
});

/// The fuzzing process's own uid and gid (the scratch export's owner).
fn rustix_ids() -> (u32, u32) {
    let meta = std::fs::metadata("/proc/self").ok();
    use std::os::unix::fs::MetadataExt;
    meta.map_or((0, 0), |m| (m.uid(), m.gid()))
}
