//! Calls whose future is dropped before their reply (the caller's own timeout, a `select!`
//! that took another branch): RFC 8166 §4.4.1 says the memory of canceled
//! RPCs is fenced too, since "A Responder cannot know that the Requester is no longer waiting
//! for a reply, and it might proceed to read or even update memory that the Requester might
//! have released for other use." Both tests run the client driver over the in-memory loopback
//! provider.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use oncrpc::service::BoxFuture;
use oncrpc::{Call, CallRequest, Dispatcher, Outcome, Program, ReplyExpectation, RpcTransport};
use rpcrdma::engine::Config;
use rpcrdma::header::{Body, Chunks, Header, Segment};
use rpcrdma::ulb::{UlbError, UpperLayerBinding};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use tokio::sync::{Notify, Semaphore};
use verbs::{
    Access, CmEvent, ConnParams, Device, LoopbackFabric, Payload, RecvWr, SendOp, SendWr, WcStatus,
};
use xdr::{Encoded, Encoder};

/// A test program (user-defined range, RFC 5531 §7.3) whose procedure SLOW waits for a permit.
const SLOW_PROG: u32 = 0x2000_00a1;
const SLOW: u32 = 1;

struct Gate {
    /// Signalled each time SLOW starts.
    entered: Notify,
    /// One permit lets one SLOW call return.
    release: Semaphore,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Gate {
            entered: Notify::new(),
            release: Semaphore::new(0),
        })
    }
}

struct SlowProgram(Arc<Gate>);

impl Program for SlowProgram {
    fn program(&self) -> u32 {
        SLOW_PROG
    }
    fn versions(&self) -> (u32, u32) {
        (1, 1)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            match call.header.proc_ {
                0 => Outcome::Success(Encoded::default()),
                SLOW => {
                    self.0.entered.notify_one();
                    if let Ok(p) = self.0.release.acquire().await {
                        p.forget();
                    }
                    Outcome::Success(Encoded::default())
                }
                _ => Outcome::ProcUnavail,
            }
        })
    }
}

/// The test program's binding: no argument is DDP-eligible; its callers may offer Write
/// chunks for results.
struct SlowUlb;

impl UpperLayerBinding for SlowUlb {
    fn program(&self) -> u32 {
        SLOW_PROG
    }
    fn call_ddp_items(
        &self,
        vers: u32,
        proc_: u32,
        _args: &[u8],
    ) -> Result<Vec<Range<usize>>, UlbError> {
        match (vers, proc_) {
            (1, 0 | SLOW) => Ok(Vec::new()),
            _ => Err(UlbError::Unknown { vers, proc_ }),
        }
    }
    fn max_reply_size(&self, _vers: u32, _proc_: u32, _args: &[u8]) -> Option<usize> {
        None
    }
}

fn bindings() -> Vec<Arc<dyn UpperLayerBinding>> {
    vec![Arc::new(SlowUlb)]
}

/// SLOW with room for an 8 KiB DDP-eligible result (a Write chunk) and a 64 KiB reply: what
/// stays in the Payload stream may exceed the inline threshold, so a Reply chunk as well.
fn slow_call() -> CallRequest {
    CallRequest::new(SLOW_PROG, 1, SLOW, |_| {}).with_reply(ReplyExpectation {
        max_len: Some(64 * 1024),
        ddp_items: vec![8192],
    })
}

fn null_call() -> CallRequest {
    CallRequest::null(SLOW_PROG, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_call_fences_its_chunks_and_its_late_reply_is_discarded() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let gate = Gate::new();
    let server_cfg = TransportConfig {
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(
        "10.0.1.1:20049".parse().unwrap(),
        Dispatcher::new().with(Arc::new(SlowProgram(gate.clone()))),
        bindings(),
        server_cfg,
    )
    .await
    .unwrap();
    // One credit: a call queued behind a cancelled one is sent only once the cancelled
    // call's late reply has been received (RFC 8166 §3.3.1), which orders the checks below.
    let client_cfg = TransportConfig {
        rpc: Config {
            credits: 1,
            ..Config::default()
        },
        device: Some(dev),
        ..TransportConfig::default()
    };
    let cl = RdmaClient::connect_with(srv.local_addr(), client_cfg, bindings(), None)
        .await
        .unwrap();

    // 1. Dropped by a `select!` while the program holds it.
    let mut call = cl.call(slow_call());
    tokio::select! {
        r = &mut call => panic!("the call ended while the program holds it: {r:?}"),
        () = gate.entered.notified() => {}
    }
    let s = cl.stats();
    assert_eq!((s.write_chunk_calls, s.long_reply), (1, 1), "{s:?}");
    assert_eq!(
        cl.live_registrations(),
        2,
        "a Write chunk and a Reply chunk"
    );
    drop(call);
    assert_eq!(
        cl.live_registrations(),
        0,
        "the chunks were invalidated when the future was dropped"
    );
    assert_eq!(cl.stats().cancelled, 1);
    // The program answers after all; the reply is discarded. The NULL call waits for the
    // credit that reply returns, so once it is done the late reply has been handled.
    gate.release.add_permits(1);
    cl.call(null_call()).await.unwrap();
    let s = cl.stats();
    assert_eq!((s.late_replies, s.cancelled), (1, 1), "{s:?}");

    // 2. Dropped by the caller's own timeout (the program cannot answer: no permit).
    let r = tokio::time::timeout(Duration::from_millis(20), cl.call(slow_call())).await;
    assert!(r.is_err(), "the call cannot complete: {r:?}");
    assert_eq!(cl.live_registrations(), 0);
    assert_eq!(cl.stats().cancelled, 2);
    gate.release.add_permits(1);
    cl.call(null_call()).await.unwrap();
    let s = cl.stats();
    assert_eq!((s.late_replies, s.cancelled), (2, 2), "{s:?}");

    // 3. Timed out by the Requester's own deadline (the call's timeout), which the driver's
    // timer hands it: the call fails with Timeout after its chunks were fenced.
    let mut timed = slow_call();
    timed.timeout = Some(Duration::from_millis(50));
    let r = tokio::time::timeout(Duration::from_secs(10), cl.call(timed))
        .await
        .expect("the Requester's deadline ends the call");
    assert!(matches!(r, Err(oncrpc::RpcError::Timeout)), "{r:?}");
    assert_eq!(cl.live_registrations(), 0);
    assert_eq!(cl.stats().cancelled, 3);
    gate.release.add_permits(1);
    cl.call(null_call()).await.unwrap();
    let s = cl.stats();
    assert_eq!((s.late_replies, s.cancelled), (3, 3), "{s:?}");

    // The connection was never lost and nothing stays registered.
    assert_eq!(cl.reconnects(), 0);
    assert_eq!(cl.live_registrations(), 0);
}

/// An RPC reply (accepted, SUCCESS, no results) for `xid`.
fn rpc_reply(xid: u32) -> Bytes {
    let mut e = Encoder::new();
    for w in [xid, 1, 0, 0, 0, 0] {
        e.put_u32(w);
    }
    e.into_bytes()
}

/// A bare verbs peer plays the responder, so the test can aim an RDMA Write at the Write
/// chunk of a call whose future was dropped. The client's verbs must refuse it (Terminate:
/// invalid STag), and the late reply never reaches the requester.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responder_cannot_write_into_the_chunk_of_a_dropped_call() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(), dev.create_cq());
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let bufs: Vec<_> = (0..2)
        .map(|_| pd.register_len(4096, Access::LOCAL_WRITE).unwrap())
        .collect();
    for (i, b) in bufs.iter().enumerate() {
        qp.post_recv(RecvWr::new(i as u64, b.sge(0, 4096))).unwrap();
    }
    let mut listener = dev.listen("10.0.1.2:20049".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr();
    let params = ConnParams {
        private_data: Bytes::copy_from_slice(&Config::default().private_data().encode()),
        ..ConnParams::default()
    };
    let qp2 = qp.clone();
    let accepted = tokio::spawn(async move {
        let req = listener.accept().await.unwrap();
        req.accept(&qp2, params).await.unwrap()
    });
    let client_cfg = TransportConfig {
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let cl = Arc::new(
        RdmaClient::connect_with(addr, client_cfg, bindings(), None)
            .await
            .unwrap(),
    );
    let conn = accepted.await.unwrap();

    // The call arrives at the responder; then the caller drops it.
    let mut call = cl.call(slow_call());
    let wc = tokio::select! {
        r = &mut call => panic!("the call ended without a reply: {r:?}"),
        wc = rcq.next() => wc,
    };
    assert_eq!(wc.status, WcStatus::Success);
    let msg = bufs[wc.wr_id as usize]
        .read(0, wc.byte_len as usize)
        .unwrap();
    let (h, _) = Header::decode(&msg).unwrap();
    let Body::Msg(chunks) = h.body else {
        panic!("expected RDMA_MSG: {:?}", h.body)
    };
    let target: Segment = chunks.writes[0][0];
    assert!(chunks.reply.is_some());
    drop(call);
    // Another call queued behind it: the first credit comes back only with a reply.
    let cl2 = cl.clone();
    let next = tokio::spawn(async move { cl2.call(null_call()).await });

    // The responder goes on as if the caller still waited: the result into the Write chunk,
    // then the reply (RDMA_MSG, the Write chunk's length set to what was written).
    let data = Bytes::from(vec![0x5a; target.length as usize]);
    let mut write = SendWr::new(
        100,
        SendOp::RdmaWrite {
            remote_addr: target.offset,
            rkey: target.handle,
        },
        Vec::new(),
    );
    write.payload = Payload::Inline(data);
    qp.post_send(write).unwrap();
    let reply = Header::new(
        h.xid,
        1,
        Body::Msg(Chunks {
            writes: vec![vec![target]],
            ..Chunks::default()
        }),
    );
    let mut out = BytesMut::new();
    reply.encode(&mut out);
    out.extend_from_slice(&rpc_reply(h.xid));
    qp.post_send(SendWr::send_bytes(101, out.freeze())).unwrap();

    // Had the STag still been valid, the reply would have been taken as the call's and the
    // queued NULL call sent here. Fenced: the client's QP refuses the Write with a Terminate,
    // both queue pairs go to the error state and this receive is flushed.
    let wc = rcq.next().await;
    assert_eq!(
        wc.status,
        WcStatus::WrFlushError,
        "the RDMA Write into the dropped call's Write chunk was accepted: {wc:?}"
    );
    let t = loop {
        match conn.next_event().await {
            Some(CmEvent::TerminateReceived(t)) => break t,
            Some(_) => continue,
            None => panic!("no Terminate"),
        }
    };
    // Terminate from the DDP layer: tagged buffer error, invalid STag.
    assert_eq!((t.layer, t.etype, t.code), (1, 1, 0), "{t:?}");
    let s = cl.stats();
    assert_eq!((s.cancelled, s.late_replies), (1, 0), "{s:?}");
    next.abort();
}
