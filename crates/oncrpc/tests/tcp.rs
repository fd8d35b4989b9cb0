//! The TCP server and client over 127.0.0.1: every error reply, fragmentation, pipelining,
//! in-flight bounds, timeouts, reconnection with the same XID, the retry cap and shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use oncrpc::auth::AUTH_SYS;
use oncrpc::message::{MessageHeader, RejectedReply, ReplyHeader};
use oncrpc::record::{RecordDecoder, frame, write_record};
use oncrpc::service::BoxFuture;
use oncrpc::{
    AcceptStat, AuthStat, Call, CallHeader, CallRequest, ClientConfig, Dispatcher, OpaqueAuth,
    Outcome, Program, ReplyExpectation, RpcClient, RpcError, RpcTransport, ServerConfig, TcpClient,
    TcpServer, TransportKind, null_program,
};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use xdr::{Decoder, Encoder};

const PROG: u32 = 0x2000_0099;
const NULL_PROG: u32 = 0x2000_009a;

const ECHO: u32 = 1;
const TOO_WEAK: u32 = 2;
const SYSTEM_ERR: u32 = 3;
const CONTEXT: u32 = 4;
const NO_REPLY: u32 = 5;
const GATED: u32 = 6;

/// A test program, versions 1 and 2.
/// GATED calls add a permit to `entered` and wait for one from `release` (semaphores count
/// every event, where `Notify` would coalesce them).
struct TestProg {
    running: AtomicUsize,
    max_running: AtomicUsize,
    entered: Semaphore,
    release: Semaphore,
}

impl Default for TestProg {
    fn default() -> Self {
        TestProg {
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        }
    }
}

impl TestProg {
    async fn wait_entered(&self) {
        self.entered.acquire().await.unwrap().forget();
    }
    fn release_one(&self) {
        self.release.add_permits(1);
    }
}

impl TestProg {
    async fn run(&self, call: Call) -> Outcome {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        let out = match call.header.proc_ {
            0 => Outcome::Success(call.reply_encoder().finish()),
            ECHO => {
                let mut dec = call.args_decoder();
                match dec.u32() {
                    Ok(v) => {
                        // Finish out of order: some calls yield before answering.
                        for _ in 0..(v % 4) {
                            tokio::task::yield_now().await;
                        }
                        let mut enc = call.reply_encoder();
                        enc.put_u32(v);
                        Outcome::Success(enc.finish())
                    }
                    Err(_) => Outcome::GarbageArgs,
                }
            }
            TOO_WEAK => Outcome::AuthError(AuthStat::TooWeak),
            SYSTEM_ERR => Outcome::SystemErr,
            CONTEXT => {
                let ctx = &call.context;
                let mut enc = call.reply_encoder();
                enc.put_bool(ctx.transport == TransportKind::Tcp);
                enc.put_u32(u32::from(ctx.local.map_or(0, |a| a.port())));
                enc.put_bool(ctx.peer.is_some_and(|a| a.ip().is_loopback()));
                Outcome::Success(enc.finish())
            }
            NO_REPLY => Outcome::NoReply,
            GATED => {
                self.entered.add_permits(1);
                self.release.acquire().await.unwrap().forget();
                Outcome::Success(call.reply_encoder().finish())
            }
            _ => Outcome::ProcUnavail,
        };
        self.running.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

struct ProgHandle(Arc<TestProg>);

impl Program for ProgHandle {
    fn program(&self) -> u32 {
        PROG
    }
    fn versions(&self) -> (u32, u32) {
        (1, 2)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.0.run(call))
    }
}

async fn start(config: ServerConfig) -> (TcpServer, Arc<TestProg>) {
    let prog = Arc::new(TestProg::default());
    let dispatcher = Dispatcher::new()
        .with(Arc::new(ProgHandle(prog.clone())))
        .with(null_program(NULL_PROG, 1, 1));
    let server = TcpServer::bind("127.0.0.1:0", Arc::new(dispatcher), config)
        .await
        .unwrap();
    (server, prog)
}

async fn client(server: &TcpServer) -> Arc<TcpClient> {
    Arc::new(TcpClient::connect(server.local_addr()).await.unwrap())
}

fn rpc(c: &Arc<TcpClient>, prog: u32, vers: u32) -> RpcClient {
    RpcClient::new(c.clone(), prog, vers)
}

#[tokio::test]
async fn null_and_echo_succeed() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(&server).await;
    rpc(&c, NULL_PROG, 1).null().await.unwrap();
    let r = rpc(&c, PROG, 2)
        .call(ECHO, |e| e.put_u32(77), ReplyExpectation::default())
        .await
        .unwrap();
    assert_eq!(Decoder::from_bytes(&r).u32().unwrap(), 77);
    assert!(c.describe().starts_with("tcp://127.0.0.1:"));
    // Each answered call's round-trip time, under its own procedure.
    let rtt = c
        .rtt()
        .expect("the TCP client measures round-trip times")
        .snapshot();
    assert_eq!(rtt.count(), 2);
    assert_eq!(rtt.count_of((NULL_PROG, 1, 0)), 1);
    assert_eq!(rtt.count_of((PROG, 2, ECHO)), 1);
    assert!(rtt.quantile_us_of((PROG, 2, ECHO), 0.5).unwrap() >= 1.0);
    server.shutdown().await;
}

#[tokio::test]
async fn accept_errors_map_to_rpc_errors() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(&server).await;

    let e = rpc(&c, 0x3fff_fff0, 1).null().await.unwrap_err();
    assert!(
        matches!(e, RpcError::Accepted(AcceptStat::ProgUnavail)),
        "{e:?}"
    );

    let e = rpc(&c, PROG, 7).null().await.unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::Accepted(AcceptStat::ProgMismatch { low: 1, high: 2 })
        ),
        "{e:?}"
    );

    let e = rpc(&c, PROG, 1)
        .call(99, |_| {}, ReplyExpectation::default())
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Accepted(AcceptStat::ProcUnavail)),
        "{e:?}"
    );

    // ECHO without its argument.
    let e = rpc(&c, PROG, 1)
        .call(ECHO, |_| {}, ReplyExpectation::default())
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Accepted(AcceptStat::GarbageArgs)),
        "{e:?}"
    );

    let e = rpc(&c, PROG, 1)
        .call(SYSTEM_ERR, |_| {}, ReplyExpectation::default())
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Accepted(AcceptStat::SystemErr)),
        "{e:?}"
    );

    // NULL works on the connection after all of these.
    rpc(&c, PROG, 1).null().await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn auth_errors_are_rejections() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(&server).await;

    let e = rpc(&c, PROG, 1)
        .call(TOO_WEAK, |_| {}, ReplyExpectation::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::Rejected(RejectedReply::AuthError(AuthStat::TooWeak))
        ),
        "{e:?}"
    );

    // An AUTH_SYS credential whose body is not authsys_parms: AUTH_BADCRED.
    let bad = OpaqueAuth {
        flavor: AUTH_SYS,
        body: Bytes::from_static(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]),
    };
    let e = rpc(&c, PROG, 1).with_cred(bad).null().await.unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::Rejected(RejectedReply::AuthError(AuthStat::BadCred))
        ),
        "{e:?}"
    );

    // A well-formed AUTH_SYS credential is accepted.
    let good = OpaqueAuth::sys(&oncrpc::AuthSys {
        stamp: 1,
        machinename: Bytes::from_static(b"client"),
        uid: 1000,
        gid: 1000,
        gids: vec![1000, 27],
    });
    rpc(&c, PROG, 1).with_cred(good).null().await.unwrap();
    server.shutdown().await;
}

/// Encode a CALL message with an arbitrary RPC version (the client only sends version 2).
fn raw_call(xid: u32, rpcvers: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Encoder {
    let mut enc = Encoder::new();
    enc.put_u32(xid);
    enc.put_u32(0); // CALL
    enc.put_u32(rpcvers);
    enc.put_u32(prog);
    enc.put_u32(vers);
    enc.put_u32(proc_);
    OpaqueAuth::none().encode(&mut enc);
    OpaqueAuth::none().encode(&mut enc);
    enc.put_raw(args);
    enc
}

async fn read_reply(s: &mut TcpStream) -> (ReplyHeader, Bytes) {
    let mut dec = RecordDecoder::default();
    let mut buf = BytesMut::new();
    loop {
        if let Some(rec) = dec.decode(&mut buf).unwrap() {
            match MessageHeader::decode_message(&rec).unwrap() {
                (MessageHeader::Reply(h), body) => return (h, body),
                (MessageHeader::Call(_), _) => panic!("server sent a CALL"),
            }
        }
        assert_ne!(s.read_buf(&mut buf).await.unwrap(), 0, "server closed");
    }
}

#[tokio::test]
async fn rpc_version_mismatch_is_rejected() {
    let (server, _) = start(ServerConfig::default()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let msg = raw_call(0xabcd, 3, PROG, 1, 0, &[]).finish();
    write_record(&mut s, &msg).await.unwrap();
    let (h, _) = read_reply(&mut s).await;
    assert_eq!(
        h,
        ReplyHeader::Denied {
            xid: 0xabcd,
            reason: RejectedReply::RpcMismatch { low: 2, high: 2 },
        }
    );
    server.shutdown().await;
}

#[tokio::test]
async fn multi_fragment_call_is_reassembled() {
    let (server, _) = start(ServerConfig::default()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let msg = raw_call(42, 2, PROG, 1, ECHO, &0x0102_0304u32.to_be_bytes()).finish();
    // Fragments of at most 7 bytes: the 44-byte call goes out in 7 fragments.
    let mut parts: std::collections::VecDeque<Bytes> = frame(&msg, 7).into();
    assert_eq!(msg.len().div_ceil(7), 7);
    assert!(
        parts.len() >= 14,
        "a header and at least one slice per fragment"
    );
    oncrpc::record::write_all_parts(&mut s, &mut parts)
        .await
        .unwrap();
    let (h, body) = read_reply(&mut s).await;
    assert!(matches!(
        h,
        ReplyHeader::Accepted {
            xid: 42,
            stat: AcceptStat::Success,
            ..
        }
    ));
    assert_eq!(&body[..], &0x0102_0304u32.to_be_bytes());
    server.shutdown().await;
}

#[tokio::test]
async fn oversized_record_closes_the_connection() {
    let (server, _) = start(ServerConfig::default().with_max_record(1024)).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let msg = raw_call(1, 2, PROG, 1, ECHO, &[0u8; 2048]).finish();
    write_record(&mut s, &msg).await.unwrap();
    let mut buf = Vec::new();
    // The server closes without replying.
    let n = s.read_to_end(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn call_context_reports_tcp_and_addresses() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(&server).await;
    let r = rpc(&c, PROG, 1)
        .call(CONTEXT, |_| {}, ReplyExpectation::default())
        .await
        .unwrap();
    let mut d = Decoder::from_bytes(&r);
    assert!(d.bool().unwrap(), "transport is Tcp");
    assert_eq!(d.u32().unwrap(), u32::from(server.local_addr().port()));
    assert!(d.bool().unwrap(), "peer is loopback");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_calls_pipelined_at_depth_64() {
    let (server, prog) = start(ServerConfig::default()).await;
    let c = client(&server).await;
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..64 {
        let c = c.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut done = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 1000 {
                    return done;
                }
                let v = u32::try_from(i).unwrap();
                let r = rpc(&c, PROG, 1)
                    .call(ECHO, move |e| e.put_u32(v), ReplyExpectation::default())
                    .await
                    .unwrap();
                assert_eq!(Decoder::from_bytes(&r).u32().unwrap(), v);
                done += 1;
            }
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap();
    }
    assert_eq!(total, 1000);
    assert_eq!(c.in_flight(), 0);
    // Calls really overlapped on the server.
    assert!(prog.max_running.load(Ordering::SeqCst) > 1);
    server.shutdown().await;
}

#[tokio::test]
async fn in_flight_calls_per_connection_are_bounded() {
    let (server, prog) = start(ServerConfig::default().with_max_in_flight(4)).await;
    let c = client(&server).await;
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                rpc(&c, PROG, 1)
                    .call(GATED, |_| {}, ReplyExpectation::default())
                    .await
            })
        })
        .collect();
    // Let calls in four at a time.
    for _ in 0..16 {
        prog.wait_entered().await;
        assert!(prog.running.load(Ordering::SeqCst) <= 4);
        prog.release_one();
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert!(prog.max_running.load(Ordering::SeqCst) <= 4);
    server.shutdown().await;
}

#[tokio::test]
async fn call_times_out_and_is_forgotten() {
    let (server, _) = start(ServerConfig::default()).await;
    let c = client(&server).await;
    let req = CallRequest::new(PROG, 1, NO_REPLY, |_| {}).with_timeout(Duration::from_millis(200));
    let e = c.call(req).await.unwrap_err();
    assert!(matches!(e, RpcError::Timeout), "{e:?}");
    assert_eq!(c.in_flight(), 0);
    // The connection is still usable.
    rpc(&c, PROG, 1).null().await.unwrap();
    server.shutdown().await;
}

/// Read one call record from `s`; returns its header.
async fn read_call<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<CallHeader> {
    let mut dec = RecordDecoder::default();
    let mut buf = BytesMut::new();
    loop {
        if let Some(rec) = dec.decode(&mut buf).unwrap() {
            match MessageHeader::decode_message(&rec).unwrap() {
                (MessageHeader::Call(h), _) => return Some(h),
                (MessageHeader::Reply(_), _) => panic!("client sent a REPLY"),
            }
        }
        if s.read_buf(&mut buf).await.ok()? == 0 {
            return None;
        }
    }
}

fn success(xid: u32) -> xdr::Encoded {
    oncrpc::service::accepted(xid, AcceptStat::Success, None).message
}

#[tokio::test]
async fn reconnect_retransmits_with_the_same_xid() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        // First connection: read the call, then drop the connection without answering.
        let (mut s1, _) = listener.accept().await.unwrap();
        let first = read_call(&mut s1).await.unwrap();
        drop(s1);
        // Second connection: the retransmission arrives; answer it.
        let (mut s2, _) = listener.accept().await.unwrap();
        let second = read_call(&mut s2).await.unwrap();
        write_record(&mut s2, &success(second.xid)).await.unwrap();
        // Keep the connection open until the client is done.
        let mut rest = Vec::new();
        let _ = s2.read_to_end(&mut rest).await;
        (first, second)
    });
    let c = Arc::new(TcpClient::connect(addr).await.unwrap());
    rpc(&c, PROG, 1).null().await.unwrap();
    drop(c);
    let (first, second) = server.await.unwrap();
    assert_eq!(first.xid, second.xid, "retransmission keeps the XID");
    assert_eq!(first, second, "retransmission is the same call");
}

#[tokio::test]
async fn retransmissions_are_capped() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    // Every connection is dropped as soon as a call arrives.
    let server = tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            if read_call(&mut s).await.is_none() {
                return;
            }
        }
    });
    let config = ClientConfig::default().with_max_retransmits(2);
    let c = Arc::new(TcpClient::connect_with(addr, config).await.unwrap());
    let e = rpc(&c, PROG, 1).null().await.unwrap_err();
    assert!(matches!(e, RpcError::Transport(_)), "{e:?}");
    // One transmission plus two retransmissions; the client may have opened one more
    // connection before giving up on the call.
    let n = connections.load(Ordering::SeqCst);
    assert!((3..=4).contains(&n), "{n} connections");
    server.abort();
}

#[tokio::test]
async fn shutdown_finishes_calls_in_progress() {
    let (server, prog) = start(ServerConfig::default()).await;
    let addr = server.local_addr();
    let c = client(&server).await;
    let c2 = c.clone();
    let call = tokio::spawn(async move {
        rpc(&c2, PROG, 1)
            .call(GATED, |_| {}, ReplyExpectation::default())
            .await
    });
    prog.wait_entered().await;
    let shutdown = tokio::spawn(server.shutdown());
    prog.release_one();
    call.await.unwrap().unwrap();
    shutdown.await.unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
}

#[tokio::test]
async fn client_over_a_callers_stream_pipelines_and_fails_once_closed() {
    // Over a TCP stream the caller connected: the same server, pipelined calls.
    let (server, _) = start(ServerConfig::default()).await;
    let s = TcpStream::connect(server.local_addr()).await.unwrap();
    let c = Arc::new(TcpClient::over_stream(
        s,
        "test-stream",
        ClientConfig::default(),
    ));
    assert_eq!(c.describe(), "test-stream");
    assert_eq!(c.peer_addr(), None);
    let calls = (0..32u32).map(|v| {
        let r = rpc(&c, PROG, 1);
        async move {
            let b = r
                .call(ECHO, move |e| e.put_u32(v), ReplyExpectation::default())
                .await
                .unwrap();
            assert_eq!(Decoder::from_bytes(&b).u32().unwrap(), v);
        }
    });
    futures::future::join_all(calls).await;
    server.shutdown().await;
    // No reconnection over a caller's stream: the calls after the close fail.
    for _ in 0..2 {
        let e = rpc(&c, NULL_PROG, 1).null().await.unwrap_err();
        assert!(
            matches!(e, RpcError::Transport(_) | RpcError::Closed),
            "{e:?}"
        );
    }
}

#[tokio::test]
async fn client_over_a_unix_socket() {
    let (mine, mut theirs) = tokio::net::UnixStream::pair().unwrap();
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(h) = read_call(&mut theirs).await {
            write_record(&mut theirs, &success(h.xid)).await.unwrap();
            seen.push(h);
            if seen.len() == 3 {
                break;
            }
        }
        seen
    });
    let c = Arc::new(TcpClient::over_stream(
        mine,
        "unix:test",
        ClientConfig::default(),
    ));
    for _ in 0..3 {
        rpc(&c, PROG, 4).null().await.unwrap();
    }
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|h| h.prog == PROG && h.vers == 4 && h.proc_ == 0)
    );
    // The other end is gone: the next call fails instead of hanging.
    let e = rpc(&c, PROG, 4).null().await.unwrap_err();
    assert!(
        matches!(e, RpcError::Transport(_) | RpcError::Closed),
        "{e:?}"
    );
}
