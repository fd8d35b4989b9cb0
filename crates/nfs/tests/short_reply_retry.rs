//! Short Reply chunk retry (RFC 8267 §3.1, §5.2) end to end over soft-iWARP on loopback: an
//! NFSACL GETACL whose ACL is longer than the client provisioned for is answered with
//! RDMA_ERR_CHUNK, and the client asks again as a new transaction (a new XID) with a Reply
//! chunk sized for the largest ACL the protocol carries; it does so once, not indefinitely.
//!
//! The server side is a small NFSACL program over the real RPC-over-RDMA responder: the
//! `oxrdma nfs serve` server does not serve NFSACL.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use nfs::client::{ClientError, NfsAclClient};
use nfs::nfs3::{Fh3, Res};
use nfs::nfsacl::{self, Acl, AclEntry, GetAclOk};
use nfs::ulb::NfsAclBinding;
use oncrpc::service::{BoxFuture, Call, Outcome, Program};
use oncrpc::{CallRequest, Dispatcher, RpcError, RpcTransport};
use rpcrdma::ulb::UpperLayerBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use xdr::XdrEncode;

/// An NFSACL v3 program whose GETACL returns an access ACL of `entries` named users.
struct AclProgram {
    entries: AtomicUsize,
    getacl_xids: Mutex<Vec<u32>>,
}

fn acl(n: usize) -> Acl {
    Acl::new(
        (0..n as u32)
            .map(|i| AclEntry {
                tag: 0x02,
                id: 1000 + i,
                perm: i % 8,
            })
            .collect(),
    )
}

impl Program for AclProgram {
    fn program(&self) -> u32 {
        nfsacl::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (3, 3)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            match call.header.proc_ {
                nfsacl::proc_::NULL => Outcome::Success(call.reply_encoder().finish()),
                nfsacl::proc_::GETACL => {
                    self.getacl_xids.lock().unwrap().push(call.header.xid);
                    let res: nfsacl::GetAclRes = Res::Ok(GetAclOk {
                        attributes: None,
                        mask: nfsacl::mask::ACL | nfsacl::mask::ACLCNT,
                        access: acl(self.entries.load(Ordering::Relaxed)),
                        default: Acl::default(),
                    });
                    let mut e = call.reply_encoder();
                    res.encode(&mut e);
                    Outcome::Success(e.finish())
                }
                _ => Outcome::ProcUnavail,
            }
        })
    }
}

async fn setup(
    entries: usize,
    binding: NfsAclBinding,
) -> (Arc<AclProgram>, RdmaServer, Arc<RdmaClient>, NfsAclClient) {
    let prog = Arc::new(AclProgram {
        entries: AtomicUsize::new(entries),
        getacl_xids: Mutex::new(Vec::new()),
    });
    let mut d = Dispatcher::new();
    d.register(prog.clone());
    let ulbs: Vec<Arc<dyn UpperLayerBinding>> = vec![Arc::new(NfsAclBinding::default())];
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // 4 KiB receive buffers on both sides (Linux's inline threshold; the default is 8 KiB):
    // the ACL sizes below are chosen against it.
    let linux_sized = || {
        let mut t = TransportConfig::default();
        t.rpc.inline_recv = 4096;
        t
    };
    let srv = RdmaServer::bind(addr, d, ulbs, linux_sized())
        .await
        .unwrap();
    let ulbs: Vec<Arc<dyn UpperLayerBinding>> = vec![Arc::new(binding)];
    let rc = Arc::new(
        RdmaClient::connect_with(srv.local_addr(), linux_sized(), ulbs, None)
            .await
            .unwrap(),
    );
    let c = NfsAclClient::new(rc.clone()).with_binding(binding);
    (prog, srv, rc, c)
}

fn fh() -> Fh3 {
    Fh3(Bytes::from_static(&[7u8; 32]))
}

async fn getacl(c: &NfsAclClient) -> Result<GetAclOk, ClientError> {
    c.getacl(fh(), nfsacl::mask::ACL | nfsacl::mask::ACLCNT)
        .await?
        .into_result()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getacl_without_a_reply_chunk_is_retried_with_one() {
    // Provisioned for 32 entries per ACL (~1.3 KB: no Reply chunk, inline), the reply has
    // 400 (~5 KB, more than the 4096-byte inline threshold): RDMA_ERR_CHUNK, then one retry.
    let (prog, _srv, rc, c) = setup(400, NfsAclBinding::default()).await;
    let ok = getacl(&c).await.expect("GETACL after the retry");
    assert_eq!(ok.access, acl(400));
    assert_eq!(rc.short_reply_retries(), 1);
    let xids = prog.getacl_xids.lock().unwrap().clone();
    // The program ran twice (the Responder found the first reply too long for the call's reply
    // resources after building it), and the retry was a new transaction: a new XID.
    assert_eq!(xids.len(), 2, "{xids:?}");
    assert_ne!(xids[0], xids[1]);
    assert_eq!(rc.stats().rdma_errors, 1);
    assert_eq!(rc.stats().long_reply, 1, "the retry offered a Reply chunk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getacl_with_a_short_reply_chunk_is_retried_with_a_larger_one_and_a_new_xid() {
    // Provisioned for 300 entries: a Reply chunk of ~7.7 KB, too short for 800 entries
    // (~19 KB). The retry's chunk holds the protocol's 1024 per ACL.
    let binding = NfsAclBinding {
        initial_entries: 300,
    };
    let (prog, _srv, rc, c) = setup(800, binding).await;
    let before = rc.stats();
    let ok = getacl(&c).await.expect("GETACL after the retry");
    assert_eq!(ok.access, acl(800));
    assert_eq!(ok.default, Acl::default());
    assert_eq!(rc.short_reply_retries(), 1);
    let after = rc.stats();
    assert_eq!(after.rdma_errors - before.rdma_errors, 1);
    assert_eq!(
        after.long_reply - before.long_reply,
        2,
        "both tries offered a Reply chunk"
    );
    assert_eq!(after.nomsg_replies - before.nomsg_replies, 1);
    // An ACL that fits goes through without a retry.
    prog.entries.store(250, Ordering::Relaxed);
    assert_eq!(getacl(&c).await.unwrap().access, acl(250));
    assert_eq!(rc.short_reply_retries(), 1);
    let xids = prog.getacl_xids.lock().unwrap().clone();
    assert_eq!(xids.len(), 3, "{xids:?}");
    assert_ne!(xids[0], xids[1], "the retry is a new transaction");
    assert_eq!(rc.live_registrations(), 0, "every chunk was fenced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_is_bounded() {
    // A server that answers with more than the protocol's 1024 entries can never fit: one
    // retry, then the error; the connection still works.
    let (prog, _srv, rc, c) = setup(3000, NfsAclBinding::default()).await;
    let e = getacl(&c)
        .await
        .expect_err("no reply chunk is large enough");
    assert!(
        matches!(e, ClientError::Rpc(RpcError::RdmaErrChunk)),
        "{e:?}"
    );
    assert_eq!(rc.short_reply_retries(), 1);
    assert_eq!(rc.stats().rdma_errors, 2);
    // Two transactions, two XIDs, and no third.
    let xids = prog.getacl_xids.lock().unwrap().clone();
    assert_eq!(xids.len(), 2, "{xids:?}");
    assert_ne!(xids[0], xids[1]);
    let null = rc
        .call(CallRequest::null(nfsacl::PROGRAM, nfsacl::VERSION))
        .await;
    assert!(null.is_ok(), "{null:?}");
    prog.entries.store(10, Ordering::Relaxed);
    assert_eq!(getacl(&c).await.unwrap().access, acl(10));
    assert_eq!(rc.live_registrations(), 0);
}

#[test]
fn nfsacl_binding_policy() {
    let b = NfsAclBinding::default();
    // RFC 8267 §5.2: nothing DDP-eligible; GETACL retries once, to the protocol maximum.
    assert!(!b.has_ddp_items());
    assert_eq!(
        b.call_ddp_items(3, nfsacl::proc_::GETACL, &[]).unwrap(),
        vec![]
    );
    let first = b.max_reply_size(3, nfsacl::proc_::GETACL, &[]).unwrap();
    assert_eq!(first, NfsAclBinding::getacl_max_reply(32));
    let max = NfsAclBinding::getacl_max_reply(1024);
    assert_eq!(
        b.short_reply_retry(3, nfsacl::proc_::GETACL, &[], 1, first),
        Some(max)
    );
    assert_eq!(
        b.short_reply_retry(3, nfsacl::proc_::GETACL, &[], 2, max),
        None
    );
    assert_eq!(
        b.short_reply_retry(3, nfsacl::proc_::GETACL, &[], 1, max),
        None
    );
    // SETACL and NULL are bounded exactly: no retry.
    assert_eq!(
        b.short_reply_retry(3, nfsacl::proc_::SETACL, &[], 1, 100),
        None
    );
    assert!(!b.covers_version(2));
    // The largest GETACL result: status, attributes, mask, two ACLs of 1024 entries.
    assert_eq!(
        nfsacl::getacl_results_max(1024),
        4 + 88 + 4 + 2 * (8 + 12 * 1024)
    );
}

#[test]
fn acl_xdr_round_trips_and_is_bounded() {
    let ok = GetAclOk {
        attributes: None,
        mask: 0xf,
        access: acl(5),
        default: Acl::new(vec![AclEntry {
            tag: 0x01 | nfsacl::ACL_DEFAULT,
            id: 0,
            perm: 7,
        }]),
    };
    let res: nfsacl::GetAclRes = Res::Ok(ok.clone());
    let b = xdr::to_bytes(&res);
    assert_eq!(b.len(), res.encoded_len());
    let back: nfsacl::GetAclRes = xdr::from_slice(&b).unwrap();
    assert_eq!(back, res);
    // More than 1024 entries in one ACL is refused, as Linux does.
    let big = xdr::to_bytes(&acl(1025));
    assert!(xdr::from_slice::<Acl>(&big).is_err());
    // Truncations never panic.
    for n in 0..b.len() {
        let _ = xdr::from_slice::<nfsacl::GetAclRes>(&b[..n]);
    }
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Random bytes never panic the NFSACL decoders, and whatever decodes re-encodes to
        /// exactly the bytes it consumed.
        #[test]
        fn nfsacl_decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut d = xdr::Decoder::new(&data);
            if let Ok(v) = <nfsacl::GetAclRes as xdr::XdrDecode>::decode(&mut d) {
                let n = d.position();
                prop_assert_eq!(&xdr::to_bytes(&v)[..], &data[..n]);
            }
            let _ = xdr::from_slice::<nfsacl::GetAclArgs>(&data);
            let _ = xdr::from_slice::<Acl>(&data);
        }

        /// Any ACL of up to 1024 entries round-trips.
        #[test]
        fn acls_round_trip(raw in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..1025), count in any::<u32>()) {
            let a = Acl { count, entries: raw.iter().map(|&(tag, id, perm)| AclEntry { tag, id, perm }).collect() };
            let b = xdr::to_bytes(&a);
            prop_assert_eq!(b.len(), a.encoded_len());
            prop_assert_eq!(xdr::from_slice::<Acl>(&b).unwrap(), a);
        }
    }
}
