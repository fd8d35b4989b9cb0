//! NFSv4.0 (RFC 7530) COMPOUNDs against a scratch export: the 4.0-only operations' decoders
//! (SETCLIENTID, SETCLIENTID_CONFIRM, RENEW, OPEN_CONFIRM, RELEASE_LOCKOWNER), the seqid
//! ordering of owners and every shared operation as minor version 0 runs it. Never panics;
//! every COMPOUND is either refused as garbage or gets a reply whose `encoded_len` is what it
//! encodes to; and each 4.0-only decoder, fed the same bytes alone, either fails or consumes
//! what it decoded and re-encodes to exactly those bytes.
//!
//! Input: byte 0 holds flags (bit 0: prepend PUTROOTFH; bit 1: AUTH_SYS uid 1000 instead of
//! the process's own uid), byte 1 the number of operations that follow; the rest is the
//! operation stream (opnum, arguments, ...). The world has one confirmed 4.0 client; every
//! eight bytes `CLIENTID` in the stream become its clientid, so seeds reach OPEN and the
//! owner-ordered operations.
#![no_main]

#[path = "scratch.rs"]
mod scratch;

use std::sync::{Arc, Mutex, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::OpArgs;
use nfs::nfs4::res::OpRes;
use nfs::nfs4::server::{Nfs4Config, Nfs4Server, Request};
use nfs::nfs4::types::Opaque1024;
use nfs::nfs4::v40::{Args40, CbClient4, NfsClientId4, Res40};
use oncrpc::{AuthSys, Credential};

struct World {
    server: Arc<Nfs4Server>,
    clientid: u64,
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

fn ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or((0, 0), |m| (m.uid(), m.gid()))
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        scratch::limit_file_size();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/file"), b"0123456789").expect("write");
        let table = nfs::gate::ExportTable::single(dir.path(), None, false, None).expect("table");
        let server = Nfs4Server::new(
            Arc::new(table),
            Nfs4Config::default().with_grace(std::time::Duration::ZERO),
        );
        let (uid, gid) = ids();
        let cred = Credential::Sys(AuthSys {
            uid,
            gid,
            ..AuthSys::default()
        });
        let r = call(
            &server,
            &cred,
            nfs::nfs4::client_codec::encode_compound(
                b"",
                0,
                &[OpArgs::V40(Args40::SetClientId {
                    client: NfsClientId4 {
                        verifier: [1; 8],
                        id: Opaque1024::from_slice(b"fuzz40"),
                    },
                    callback: CbClient4 {
                        program: 0x4000_0000,
                        netid: Bytes::from_static(b"tcp"),
                        addr: Bytes::from_static(b"127.0.0.1.0.1"),
                    },
                    callback_ident: 1,
                })],
            ),
        )
        .expect("setclientid");
        let Some(OpRes::V40(Res40::SetClientId { clientid, confirm })) = r.results.first().cloned()
        else {
            panic!("SETCLIENTID failed: {r:?}");
        };
        let r = call(
            &server,
            &cred,
            nfs::nfs4::client_codec::encode_compound(
                b"",
                0,
                &[OpArgs::V40(Args40::SetClientIdConfirm {
                    clientid,
                    verifier: confirm,
                })],
            ),
        )
        .expect("setclientid_confirm");
        assert_eq!(r.status, Nfsstat4::OK, "SETCLIENTID_CONFIRM failed: {r:?}");
        World {
            server,
            clientid,
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
    // The 4.0-only decoders alone: decode, re-encode, compare.
    if let [opnum, body @ ..] = rest {
        let opnum = u32::from(*opnum % 48);
        // Strict padding for the byte-for-byte round trip: the server's decoder accepts
        // non-zero XDR pad bytes (as Linux does), and the encoder writes zeros (RFC 4506 §3),
        // so a lenient decode of a non-zero pad does not come back the same (found by this
        // target: an nfs_client_id4 id of 2 bytes padded with 00 04; the input is in the
        // corpus as `regress-nonzero-pad`).
        let mut d = xdr::Decoder::new(body).strict_padding(true);
        if let Ok(Some(a)) = Args40::decode(opnum, &mut d) {
            let used = body.len() - d.remaining();
            let mut e = xdr::Encoder::new();
            a.encode(&mut e);
            assert_eq!(&e.into_bytes()[..], &body[..used]);
        }
    }
    let mut rest = rest.to_vec();
    let mut i = 0;
    while i + 8 <= rest.len() {
        if &rest[i..i + 8] == b"CLIENTID" {
            rest[i..i + 8].copy_from_slice(&w.clientid.to_be_bytes());
            i += 8;
        } else {
            i += 1;
        }
    }
    let mut prefix = Vec::new();
    if flags & 1 != 0 {
        prefix.push(OpArgs::Putrootfh);
    }
    let mut args = BytesMut::new();
    args.put_u32(0); // empty tag
    args.put_u32(0); // minor version 0
    args.put_u32(prefix.len() as u32 + u32::from(*nops));
    let mut e = xdr::Encoder::new();
    for p in &prefix {
        p.encode(&mut e);
    }
    args.put_slice(&e.into_bytes());
    args.put_slice(&rest);
    let (uid, gid) = if flags & 2 != 0 { (1000, 1000) } else { ids() };
    let cred = Credential::Sys(AuthSys {
        uid,
        gid,
        ..AuthSys::default()
    });
    if let Some(reply) = call(&w.server, &cred, args.freeze()) {
        let mut enc = xdr::Encoder::new();
        reply.encode(&mut enc);
        assert_eq!(enc.into_bytes().len(), reply.encoded_len());
    }
    // Keep the client's lease alive and the scratch export small (see scratch.rs).
    let mut runs = w.runs.lock().unwrap_or_else(|p| p.into_inner());
    *runs += 1;
    if runs.is_multiple_of(2_000) {
        scratch::wipe(w.dir.path());
        let (uid, gid) = ids();
        let cred = Credential::Sys(AuthSys {
            uid,
            gid,
            ..AuthSys::default()
        });
        let _ = call(
            &w.server,
            &cred,
            nfs::nfs4::client_codec::encode_compound(
                b"",
                0,
                &[OpArgs::V40(Args40::Renew(w.clientid))],
            ),
        );
    }
});
