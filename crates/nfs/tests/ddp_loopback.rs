//! The client and the server over an in-memory transport that applies RPC-over-RDMA reduction
//! in both directions, the way an RDMA transport would: the client's DDP-eligible argument
//! items (WRITE data, SYMLINK path) and the server's DDP-eligible results (READ data,
//! READLINK path) are lifted out of the Payload stream, and nothing else is. The transport
//! checks every reduced item against the binding's own locators before putting it back.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use nfs::client::Nfs3Client;
use nfs::nfs3::{self, CreateHow3, Sattr3, StableHow};
use nfs::server::{ExportOptions, NfsServer};
use nfs::ulb::NfsBinding;
use oncrpc::service::BoxFuture;
use oncrpc::{
    CallContext, CallHeader, CallRequest, Dispatcher, ReplyExpectation, RpcError, RpcTransport,
};
use rpcrdma::ulb::UpperLayerBinding;
use xdr::{DdpPolicy, Encoder};

const REDUCE: DdpPolicy = DdpPolicy::Reduce {
    min_len: 0,
    max_items: 4,
};

#[derive(Debug, Default, Clone)]
struct Seen {
    /// (procedure, reduced call items, reply expectation, reduced reply items)
    calls: Vec<(u32, usize, ReplyExpectation, usize)>,
}

struct Loopback {
    dispatcher: Dispatcher,
    binding: NfsBinding,
    seen: Mutex<Seen>,
}

impl RpcTransport for Loopback {
    fn call(&self, req: CallRequest) -> BoxFuture<'_, Result<Bytes, RpcError>> {
        Box::pin(async move {
            let mut enc = Encoder::new().with_policy(REDUCE);
            (req.args)(&mut enc);
            let args = enc.finish();
            let whole = args.unreduced();
            // The Responder checks each Read chunk lands on a DDP-eligible item.
            let eligible = self
                .binding
                .call_ddp_items(req.vers, req.proc_, &whole)
                .map_err(|e| RpcError::BadReply(e.to_string()))?;
            for item in &args.reduced {
                assert!(
                    eligible
                        .iter()
                        .any(|r| r.start == item.position && r.len() == item.data.len())
                );
            }
            let header = CallHeader {
                xid: 7,
                prog: req.prog,
                vers: req.vers,
                proc_: req.proc_,
                cred: req.cred.clone(),
                verf: req.verf.clone(),
            };
            let reply = self
                .dispatcher
                .dispatch_call(header, whole, CallContext::local(), REDUCE)
                .await
                .ok_or(RpcError::Closed)?;
            let msg = reply.message;
            // 24 bytes: xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS.
            let results_reduced = msg.to_bytes().slice(24..);
            let written: Vec<usize> = msg.reduced.iter().map(|r| r.data.len()).collect();
            let positions = self
                .binding
                .reply_ddp_positions(req.vers, req.proc_, &results_reduced, &written)
                .map_err(|e| RpcError::BadReply(e.to_string()))?;
            for (p, r) in positions.iter().zip(&msg.reduced) {
                assert_eq!(p + 24, r.position);
            }
            if let Some(max) = req.reply.max_len {
                assert!(msg.len() + written.iter().map(|w| xdr::padded(*w)).sum::<usize>() <= max);
            }
            self.seen.lock().unwrap().calls.push((
                req.proc_,
                args.reduced.len(),
                req.reply.clone(),
                msg.reduced.len(),
            ));
            Ok(msg.unreduced().slice(24..))
        })
    }

    fn describe(&self) -> String {
        "loopback+ddp".into()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_server_reduce_exactly_the_eligible_items() {
    let tmp = tempfile::tempdir().unwrap();
    let server = NfsServer::new(
        tmp.path(),
        ExportOptions {
            read_only: false,
            name: "/".into(),
        },
    )
    .unwrap();
    let root = server.export().root_handle().unwrap();
    let lb = Arc::new(Loopback {
        dispatcher: Dispatcher::new().with(server.nfs_program()),
        binding: NfsBinding::new(),
        seen: Mutex::new(Seen::default()),
    });
    let c = Nfs3Client::new(lb.clone()).with_auth_sys(0, 0, vec![]);
    let fh = c
        .create(&root, b"f", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let data = Bytes::from((0..100_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
    c.write(&fh, 0, data.clone(), StableHow::FileSync)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let r = c
        .read(&fh, 0, 200_000)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_eq!(r.data.0, data);
    let ln = c
        .symlink(&root, b"ln", b"f")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let rl = c.readlink(&ln).await.unwrap().into_result().unwrap();
    assert_eq!(&rl.data.0[..], b"f");
    c.getattr(&fh).await.unwrap().into_result().unwrap();
    c.readdirplus_all(&root).await.unwrap();

    let seen = lb.seen.lock().unwrap().clone();
    for (p, call_items, expect, reply_items) in seen.calls {
        let (want_call, want_reply) = match p {
            nfs3::proc_::WRITE | nfs3::proc_::SYMLINK => (1, 0),
            nfs3::proc_::READ | nfs3::proc_::READLINK => (0, 1),
            _ => (0, 0),
        };
        assert_eq!(
            (call_items, reply_items),
            (want_call, want_reply),
            "procedure {p}"
        );
        assert!(expect.max_len.is_some(), "procedure {p} has a reply bound");
        match p {
            nfs3::proc_::READ => assert_eq!(expect.ddp_items, vec![200_000]),
            nfs3::proc_::READLINK => assert_eq!(expect.ddp_items, vec![nfs::ulb::NFS3_MAXPATHLEN]),
            _ => assert!(expect.ddp_items.is_empty()),
        }
    }
}
