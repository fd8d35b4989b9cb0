//! The RDS tools (ping, stress, raw-TCP baseline) over real loopback TCP: 127.0.0.1 (the smaller
//! address, which connects) and 127.0.0.2.

use std::net::SocketAddrV4;
use std::time::Duration;

use rds::RdsStack;
use rds::testing::B;

/// Two stacks sharing one free TCP port number on two loopback addresses.
async fn pair(paths: u16) -> (RdsStack, RdsStack) {
    rds::testing::loopback_pair(paths)
        .await
        .expect("no free port pair")
}

/// The ping and stress library functions produce sane figures over loopback (no timing
/// assertions: only that traffic flowed both ways).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_stress_tools() {
    let (a, b) = pair(8).await;
    let r = tools::rds::ping(&a, B, 3, Duration::from_millis(1), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((r.sent, r.received), (3, 3), "{r:?}");
    let _srv = tools::rds::stress_server(&b, 9000, 2, 256).unwrap();
    let p = tools::rds::StressParams {
        req_size: 1024,
        ack_size: 256,
        depth: 4,
        tasks: 2,
        duration: Duration::from_millis(300),
        rdma_size: 0,
    };
    let s = tools::rds::stress_client(&a, SocketAddrV4::new(B, 9000), p)
        .await
        .unwrap();
    eprintln!("rds stress: {s:?}");
    assert!(s.acks > 0 && s.acks == s.requests, "{s:?}");
    let (_h, addr) = tools::rds::tcp_baseline_server("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let t = tools::rds::tcp_baseline_client(addr, p).await.unwrap();
    eprintln!("tcp baseline: {t:?}");
    assert!(t.acks > 0 && t.acks == t.requests, "{t:?}");
    a.shutdown();
    b.shutdown();
}
