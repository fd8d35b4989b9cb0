//! RPC-over-RDMA version 2 (cel-05) through the drivers, over soft-iWARP on 127.0.0.1 (and the
//! in-memory loopback provider for the message forms): every message form, fallback against a
//! version-1-only server, a version 1 client against the version 2 server, remote
//! invalidation used and declined, the property exchange and the inline threshold it raises,
//! errors produced and handled, the backward direction, and a bare verbs peer that sends the
//! server hand-made version 2 messages (properties with unknown and malformed lists, unknown
//! procedures and OPTIONAL types, rdma_inv_handle) and checks each answer.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::{Bytes, BytesMut};
use oncrpc::{CallRequest, OpaqueAuth, ReplyExpectation, RpcError, RpcTransport};
use rpcrdma::engine::Config;
use rpcrdma::header::{Chunks, Segment};
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2, Optional};
use rpcrdma::props::{ConnProp, PROPID_RBSIZ, PropSet, PropSubset, PropVal, ReqProp};
use rpcrdma::ulb::{ChunkLimits, UlbError, UpperLayerBinding};
use rpcrdma::version::{Version, VersionPolicy};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use verbs::{Access, ConnParams, Device, LoopbackFabric, RecvWr, SendWr, WcStatus};
use xdr::DdpPolicy;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn echo_req(tag: u32, data: Bytes, extra: Bytes, ddp: bool) -> CallRequest {
    let reply = ReplyExpectation {
        max_len: Some(64 + data.len() + extra.len()),
        ddp_items: if ddp { vec![data.len()] } else { vec![] },
    };
    CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(data.clone());
        e.put_opaque_bytes(extra.clone());
    })
    .with_reply(reply)
    .with_timeout(Duration::from_secs(20))
}

fn v2_client() -> Config {
    Config {
        version_policy: VersionPolicy::V2,
        ..cfg_4k()
    }
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn server(
    device: Device,
    addr: SocketAddr,
    cfg: Config,
    ulb: Arc<dyn UpperLayerBinding>,
) -> RdmaServer {
    let scfg = TransportConfig {
        rpc: cfg,
        device: Some(device),
        ..TransportConfig::default()
    };
    RdmaServer::bind(addr, dispatcher(), vec![ulb], scfg)
        .await
        .unwrap()
}

async fn client(device: Device, srv: &RdmaServer, cfg: Config) -> RdmaClient {
    let ccfg = TransportConfig {
        rpc: cfg,
        device: Some(device),
        ..TransportConfig::default()
    };
    RdmaClient::connect_with(srv.local_addr(), ccfg, vec![Arc::new(EchoUlb)], None)
        .await
        .unwrap()
}

async fn echo(cl: &RdmaClient, tag: u32, d: usize, x: usize, ddp: bool) -> Result<(), RpcError> {
    let data = pattern(d, tag as u8);
    let extra = pattern(x, 3);
    let got = cl
        .call(echo_req(tag, data.clone(), extra.clone(), ddp))
        .await?;
    assert_eq!(got, echo_results_bytes(tag, &data, &extra), "tag {tag}");
    Ok(())
}

/// Short, Chunked (odd lengths), Long Call, Long Reply, both at once.
async fn check_forms(cl: &RdmaClient) {
    let cases = [
        (10usize, 10usize, false),
        (4097, 3, true),
        (4099, 1, true),
        (8192, 0, true),
        (10, 6001, false),
        (9001, 5003, true),
        (100, 5, true),
    ];
    for (i, (d, x, ddp)) in cases.into_iter().enumerate() {
        echo(cl, i as u32, d, x, ddp)
            .await
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
    }
    let s = cl.stats();
    assert!(
        s.short >= 1 && s.chunked >= 3 && s.long_call >= 2 && s.long_reply >= 2,
        "{s:?}"
    );
    assert_eq!(cl.live_registrations(), 0, "every registration fenced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_every_message_form_in_version_2() {
    let dev = Device::soft_iwarp();
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(EchoUlb)).await;
    let cl = client(dev, &srv, v2_client()).await;
    check_forms(&cl).await;
    assert_eq!(cl.rpcrdma_version(), Version::V2);
    assert!(cl.stats().properties_received >= 1, "the server's CONNPROP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_every_message_form_in_version_2() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let addr = "10.0.2.1:20049".parse().unwrap();
    let srv = server(dev.clone(), addr, cfg_4k(), Arc::new(EchoUlb)).await;
    let cl = client(dev, &srv, v2_client()).await;
    check_forms(&cl).await;
    assert_eq!(cl.rpcrdma_version(), Version::V2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_fallback_against_a_version_1_only_server() {
    let dev = Device::soft_iwarp();
    let v1_only = Config {
        max_version: Version::V1,
        ..cfg_4k()
    };
    let srv = server(dev.clone(), local(), v1_only, Arc::new(EchoUlb)).await;
    let auto = Config {
        version_policy: VersionPolicy::Auto,
        ..cfg_4k()
    };
    let cl = client(dev.clone(), &srv, auto.clone()).await;
    check_forms(&cl).await;
    assert_eq!(cl.rpcrdma_version(), Version::V1);
    assert_eq!(cl.stats().version_fallbacks, 1, "probed once, fell back");
    assert_eq!(cl.stats().properties_received, 0);
    // A second client of the process remembers the server and does not probe.
    let again = client(dev.clone(), &srv, auto).await;
    echo(&again, 1, 10, 10, false).await.unwrap();
    assert_eq!(again.rpcrdma_version(), Version::V1);
    assert_eq!(again.stats().version_fallbacks, 0);
    // Version 2 only: no common version, the call fails.
    let v2 = client(dev, &srv, v2_client()).await;
    assert!(echo(&v2, 1, 10, 10, false).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_version_1_client_against_the_version_2_server() {
    let dev = Device::soft_iwarp();
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(EchoUlb)).await;
    let v1 = Config {
        version_policy: VersionPolicy::V1,
        ..cfg_4k()
    };
    let cl = client(dev.clone(), &srv, v1).await;
    check_forms(&cl).await;
    assert_eq!(cl.rpcrdma_version(), Version::V1);
    let s = cl.stats();
    assert_eq!((s.version_fallbacks, s.properties_received), (0, 0));
    // Both kinds of client on one server at once.
    let v2 = client(dev, &srv, v2_client()).await;
    echo(&v2, 2, 9000, 0, true).await.unwrap();
    echo(&cl, 3, 9000, 0, true).await.unwrap();
    assert_eq!(v2.rpcrdma_version(), Version::V2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_remote_invalidation_used_and_declined() {
    let dev = Device::soft_iwarp();
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(EchoUlb)).await;
    // Used: the Write chunk's handle is offered and the reply invalidates it.
    let cl = client(dev.clone(), &srv, v2_client()).await;
    for i in 0..4 {
        echo(&cl, i, 9000, 0, true).await.unwrap();
    }
    assert_eq!(cl.stats().remote_invalidated, 4);
    assert_eq!(cl.live_registrations(), 0);
    // Declined: the client offers no handle; every region is released locally.
    let no = Config {
        accept_remote_invalidate: false,
        ..v2_client()
    };
    let cl = client(dev, &srv, no).await;
    for i in 0..4 {
        echo(&cl, i, 9000, 0, true).await.unwrap();
    }
    assert_eq!(cl.stats().remote_invalidated, 0);
    assert_eq!(cl.live_registrations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_rbsiz_raises_the_inline_threshold() {
    let dev = Device::soft_iwarp();
    let big = Config {
        inline_recv: 16384,
        ..cfg_4k()
    };
    let srv = server(dev.clone(), local(), big, Arc::new(EchoUlb)).await;
    let cl = client(dev, &srv, v2_client()).await;
    echo(&cl, 1, 10, 0, false).await.unwrap();
    let chunked = cl.stats().chunked;
    // 8 KiB of DDP-eligible argument: inline whole under the server's RBSIZ of 16 KiB.
    echo(&cl, 2, 8192, 0, true).await.unwrap();
    let s = cl.stats();
    assert_eq!((s.inline_unreduced, s.chunked), (1, chunked), "{s:?}");
    echo(&cl, 3, 20000, 0, true).await.unwrap();
    assert_eq!(
        cl.stats().chunked,
        chunked + 1,
        "beyond RBSIZ: a Read chunk"
    );
}

/// The echo binding with other chunk limits on the server.
#[derive(Debug)]
struct Limited(ChunkLimits);

impl UpperLayerBinding for Limited {
    fn program(&self) -> u32 {
        PROG
    }
    fn call_ddp_items(&self, v: u32, p: u32, args: &[u8]) -> Result<Vec<Range<usize>>, UlbError> {
        EchoUlb.call_ddp_items(v, p, args)
    }
    fn max_reply_size(&self, v: u32, p: u32, args: &[u8]) -> Option<usize> {
        EchoUlb.max_reply_size(v, p, args)
    }
    fn chunk_limits(&self) -> ChunkLimits {
        self.0
    }
    fn reply_ddp_positions(
        &self,
        v: u32,
        p: u32,
        results: &[u8],
        written: &[usize],
    ) -> Result<Vec<usize>, UlbError> {
        EchoUlb.reply_ddp_positions(v, p, results, written)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_errors_produced_and_handled() {
    let dev = Device::soft_iwarp();
    // READ_CHUNKS: the call is resent with a Position-Zero Read chunk and succeeds.
    let no_reads = Limited(ChunkLimits {
        max_read_chunks: 0,
        ..ChunkLimits::default()
    });
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(no_reads)).await;
    let cl = client(dev.clone(), &srv, v2_client()).await;
    echo(&cl, 1, 9000, 0, false).await.unwrap();
    let s = cl.stats();
    assert_eq!((s.rdma_errors, s.reshaped, s.long_call), (1, 1, 1), "{s:?}");
    // No Write chunks taken: REPLY_RESOURCE, handed to the binding (no retry for ECHO).
    let no_writes = Limited(ChunkLimits {
        max_write_chunks: 0,
        ..ChunkLimits::default()
    });
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(no_writes)).await;
    let cl = client(dev.clone(), &srv, v2_client()).await;
    let r = echo(&cl, 2, 9000, 0, true).await;
    assert!(matches!(r, Err(RpcError::RdmaErrChunk)), "{r:?}");
    // The connection goes on.
    echo(&cl, 3, 100, 0, false).await.unwrap();
    // SEGMENTS ends the call.
    let no_segs = Limited(ChunkLimits {
        max_segments: 0,
        ..ChunkLimits::default()
    });
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(no_segs)).await;
    let cl = client(dev, &srv, v2_client()).await;
    let r = echo(&cl, 4, 9000, 0, true).await;
    assert!(
        matches!(&r, Err(RpcError::Transport(m)) if m.contains("Segments")),
        "{r:?}"
    );
    echo(&cl, 5, 100, 0, false).await.unwrap();
    assert_eq!(cl.live_registrations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_backward_direction_in_version_2() {
    let dev = Device::soft_iwarp();
    let cfg = |c: Config| TransportConfig {
        rpc: Config {
            back_credits: 2,
            ..c
        },
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(
        local(),
        dispatcher(),
        vec![Arc::new(EchoUlb)],
        cfg(cfg_4k()),
    )
    .await
    .unwrap();
    let back =
        oncrpc::Dispatcher::new().with(Arc::new(oncrpc::null::NullProgram::new(0x4000_0000, 1, 1)));
    let cl = Arc::new(
        RdmaClient::connect_with(
            srv.local_addr(),
            cfg(v2_client()),
            vec![Arc::new(EchoUlb)],
            Some(back),
        )
        .await
        .unwrap(),
    );
    echo(&cl, 1, 10, 0, false).await.unwrap();
    assert_eq!(cl.rpcrdma_version(), Version::V2);
    let sc = srv.connections()[0].clone();
    sc.enable_backchannel();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..10u32 {
        let cl = cl.clone();
        set.spawn(async move { echo(&cl, 100 + i, 5000, 0, true).await.unwrap() });
        let sc = sc.clone();
        set.spawn(async move {
            let r = sc
                .back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(20))
                .await;
            assert_eq!(r.unwrap(), Bytes::new());
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    while let Some(r) = tokio::time::timeout_at(deadline, set.join_next())
        .await
        .expect("no deadlock")
    {
        r.unwrap();
    }
    assert_eq!(cl.stats().back_calls, 10);
    assert_eq!(cl.rpcrdma_version(), Version::V2);
}

/// A bare verbs peer connected to an [`RdmaServer`] over soft-iWARP.
struct RawPeer {
    qp: verbs::QueuePair,
    rcq: verbs::CompletionQueue,
    pd: verbs::ProtectionDomain,
    bufs: Vec<verbs::MemoryRegion>,
    _conn: verbs::Connection,
}

impl RawPeer {
    async fn connect(dev: &Device, addr: SocketAddr) -> RawPeer {
        let pd = dev.alloc_pd();
        let (scq, rcq) = (dev.create_cq(), dev.create_cq());
        let qp = dev.create_qp(&pd, &scq, &rcq);
        let bufs: Vec<_> = (0..8)
            .map(|_| pd.register_len(65536, Access::LOCAL_WRITE).unwrap())
            .collect();
        for (i, b) in bufs.iter().enumerate() {
            qp.post_recv(RecvWr::new(i as u64, b.sge(0, 65536)))
                .unwrap();
        }
        let params = ConnParams {
            private_data: Bytes::copy_from_slice(&cfg_4k().private_data().encode()),
            ..ConnParams::default()
        };
        let conn = dev.connect(&qp, addr, params).await.unwrap();
        RawPeer {
            qp,
            rcq,
            pd,
            bufs,
            _conn: conn,
        }
    }

    fn send(&self, data: Bytes) {
        self.qp.post_send(SendWr::send_bytes(1, data)).unwrap();
    }

    /// The next message from the server, and the handle it invalidated, if any.
    async fn recv(&self) -> (Bytes, Option<u32>) {
        let wc = tokio::time::timeout(Duration::from_secs(10), self.rcq.next())
            .await
            .expect("an answer");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let i = wc.wr_id as usize;
        let msg = self.bufs[i].read(0, wc.byte_len as usize).unwrap();
        self.qp
            .post_recv(RecvWr::new(i as u64, self.bufs[i].sge(0, 65536)))
            .unwrap();
        (msg, wc.invalidated_rkey)
    }

    async fn recv_header(&self) -> (Header2, Option<u32>) {
        let (m, inv) = self.recv().await;
        (Header2::decode(&m).expect("a version 2 message").0, inv)
    }
}

fn with_payload(h: Header2, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    h.encode(&mut b);
    b.extend_from_slice(payload);
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_hand_made_version_2_messages_get_the_prescribed_answers() {
    let dev = Device::soft_iwarp();
    let srv = server(dev.clone(), local(), cfg_4k(), Arc::new(EchoUlb)).await;
    let peer = RawPeer::connect(&dev, srv.local_addr()).await;
    // A version 2 ECHO call with a Write chunk for the result, offering its handle for
    // remote invalidation.
    let sink = peer
        .pd
        .register_len(2000, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let seg = Segment {
        handle: sink.rkey(),
        length: 2000,
        offset: sink.addr(),
    };
    // Inline in the call (the server's receives are 4 KiB); the result goes to the chunk.
    let data = pattern(2000, 5);
    let call = echo_message(
        1,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        1,
        &data,
        &Bytes::new(),
    );
    let lists = ChunkLists {
        direction: Direction::Call,
        inv_handle: seg.handle,
        chunks: Chunks {
            writes: vec![vec![seg]],
            ..Chunks::default()
        },
    };
    peer.send(with_payload(
        Header2::new(1, 8, Body2::Msg(lists)),
        &call.to_bytes(),
    ));
    // First the server's CONNPROP (RBSIZ, BRS), then the reply, with Send With Invalidate
    // naming the offered handle.
    let (h, inv) = peer.recv_header().await;
    assert!(matches!(h.body, Body2::ConnProp(_)), "{h:?}");
    assert_eq!(inv, None);
    let (h, inv) = peer.recv_header().await;
    let Body2::Msg(l) = h.body else {
        panic!("{h:?}")
    };
    assert_eq!((h.xid, l.direction), (1, Direction::Reply));
    assert_eq!(
        inv,
        Some(seg.handle),
        "Send With Invalidate of rdma_inv_handle"
    );
    assert_eq!(sink.read(0, 2000).unwrap(), data);
    // Our CONNPROP with an unknown (experimental) property beside RBSIZ: taken silently.
    let c = ConnProp {
        start: PropSet(vec![
            PropVal {
                which: 0xFFFF_FF01,
                data: Bytes::from_static(b"any opaque value"),
            },
            PropVal::rbsiz(65536),
        ]),
        nochg: PropSubset::from_positions([1]),
    };
    peer.send(Header2::new(2, 8, Body2::ConnProp(c)).to_bytes());
    // A malformed list (RBSIZ of two bytes, cel-05 §6.1.1): RDMA2_ERR_BAD_XDR.
    let bad = ConnProp {
        start: PropSet(vec![PropVal {
            which: PROPID_RBSIZ,
            data: Bytes::from_static(&[0, 1]),
        }]),
        nochg: PropSubset::default(),
    };
    peer.send(Header2::new(3, 8, Body2::ConnProp(bad)).to_bytes());
    let (h, _) = peer.recv_header().await;
    assert_eq!((h.xid, h.body), (3, Body2::Error(ErrorBody2::BadXdr)));
    // REQPROP: RESPROP under the same XID.
    let req = ReqProp {
        want: PropSet(vec![PropVal::rbsiz(4096), PropVal::rbsiz(1 << 20)]),
    };
    peer.send(Header2::new(4, 8, Body2::ReqProp(req)).to_bytes());
    let (h, _) = peer.recv_header().await;
    let Body2::ResProp(r) = h.body else {
        panic!("{h:?}")
    };
    assert_eq!(h.xid, 4);
    assert_eq!(r.done.positions().collect::<Vec<_>>(), vec![0]);
    assert_eq!(r.rejected.positions().collect::<Vec<_>>(), vec![1]);
    // An OPTIONAL of an unknown type: INVAL_OPTION.
    let o = Optional {
        direction: Direction::Call,
        opttype: 0x1234,
        optinfo: Bytes::from_static(b"????"),
    };
    peer.send(Header2::new(5, 8, Body2::Optional(o)).to_bytes());
    let (h, _) = peer.recv_header().await;
    assert_eq!((h.xid, h.body), (5, Body2::Error(ErrorBody2::InvalOption)));
    // An unknown procedure: INVAL_PROC.
    let mut raw = Header2::new(6, 8, Body2::ConnProp(ConnProp::default()))
        .to_bytes()
        .to_vec();
    raw[12..16].copy_from_slice(&12u32.to_be_bytes());
    peer.send(raw.into());
    let (h, _) = peer.recv_header().await;
    assert_eq!((h.xid, h.body), (6, Body2::Error(ErrorBody2::InvalProc)));
    // A version 1 message on this version 2 connection: ERR_VERS naming version 2 only
    // (cel-05 §8.3: the connection is locked to its first call's version). An empty version 1
    // RDMA_MSG header, 28 bytes: anything shorter is dropped unanswered (RFC 8166 §4.5).
    let v1: Vec<u8> = [8u32, 1, 8, 0, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .collect();
    peer.send(v1.into());
    let (m, _) = peer.recv().await;
    let words: Vec<u32> = m
        .chunks(4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    assert_eq!(words, vec![8, 1, words[2], 4, 1, 2, 2], "ERR_VERS [2, 2]");
    // The server took our RBSIZ of 64 KiB from the CONNPROP with the unknown property.
    let _ = &srv;
}
