//! RDS over real loopback TCP: 127.0.0.1 (the smaller address, which connects) and 127.0.0.2.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use rds::testing::{A, B};
use rds::{RdsStack, StackConfig};

/// Two stacks sharing one free TCP port number on two loopback addresses.
async fn pair(paths: u16) -> (RdsStack, RdsStack) {
    rds::testing::loopback_pair(paths)
        .await
        .expect("no free port pair")
}

fn payload(sport: u16, n: u64, pad: usize) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.resize(10 + pad, 0x5a);
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_recv_ping_and_info() {
    let (a, b) = pair(8).await;
    let sa = a.bind(4000).unwrap();
    let sb = b.bind(4001).unwrap();
    let t = tokio::time::timeout(Duration::from_secs(10), async {
        sa.send_to(SocketAddrV4::new(B, 4001), Bytes::from_static(b"hello"))
            .await
            .unwrap();
        let (p, src) = sb.recv_from().await.unwrap();
        assert_eq!(&p[..], b"hello");
        assert_eq!(src, SocketAddrV4::new(A, 4000));
        // Zero-length datagram, the other way (B is the larger address: A must dial).
        sb.send_to(src, Bytes::new()).await.unwrap();
        let (p, src) = sa.recv_from().await.unwrap();
        assert!(p.is_empty());
        assert_eq!(src, SocketAddrV4::new(B, 4001));
        // Ping: the pong comes from port 0 with no data.
        sa.send_to(SocketAddrV4::new(B, 0), Bytes::new())
            .await
            .unwrap();
        let (p, src) = sa.recv_from().await.unwrap();
        assert!(p.is_empty());
        assert_eq!(src, SocketAddrV4::new(B, 0));
        // 1 MiB datagram.
        let big = Bytes::from(vec![7u8; 1 << 20]);
        sa.send_to(SocketAddrV4::new(B, 4001), big.clone())
            .await
            .unwrap();
        let (p, _) = sb.recv_from().await.unwrap();
        assert_eq!(p, big);
        assert!(
            sa.send_to(
                SocketAddrV4::new(B, 4001),
                Bytes::from(vec![0u8; (1 << 20) + 1])
            )
            .await
            .is_err()
        );
    })
    .await;
    assert!(t.is_ok(), "timed out: {:?} / {:?}", a.info(), b.info());
    let ia = a.info();
    assert_eq!(ia.conns.len(), 1);
    assert!(ia.conns[0].initiator);
    assert_eq!(ia.conns[0].npaths, Some(8));
    assert_eq!(ia.conns[0].peer_gen, b.info().gen_num);
    a.shutdown();
    b.shutdown();
}

/// Acceptance: exactly-once over real loopback TCP, with connections killed from outside
/// (shutdown of the sending side of every socket between the nodes), bounded: 10^5 messages,
/// 100 kills, 120 s (it took 0.7 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_with_killed_connections() {
    const TOTAL: u64 = 100_000;
    const KILLS: u64 = 100;
    const SOCKS: u16 = 4;
    let (a, b) = pair(8).await;
    let senders: Vec<_> = (0..SOCKS).map(|i| a.bind(5000 + i).unwrap()).collect();
    let receivers: Vec<_> = (0..SOCKS).map(|i| b.bind(6000 + i).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(120);

    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let received2 = std::sync::Arc::clone(&received);
    let recv_task = tokio::spawn(async move {
        let mut expect: HashMap<(u16, u16), u64> = HashMap::new();
        let (mut ok, mut lost, mut dup) = (0u64, 0u64, 0u64);
        let mut rx: Vec<_> = receivers.into_iter().map(Some).collect();
        let (tx_ch, mut rx_ch) = tokio::sync::mpsc::channel(1024);
        let mut hs = Vec::new();
        for (i, r) in rx.iter_mut().enumerate() {
            let r = r.take().unwrap();
            let tx = tx_ch.clone();
            hs.push(tokio::spawn(async move {
                while let Ok((p, src)) = r.recv_from().await {
                    if tx.send((6000 + i as u16, p, src)).await.is_err() {
                        break;
                    }
                }
            }));
        }
        while ok < TOTAL {
            let Ok(Some((dport, mut p, src))) =
                tokio::time::timeout(Duration::from_secs(10), rx_ch.recv()).await
            else {
                break;
            };
            let s = p.get_u16();
            let n = p.get_u64();
            assert_eq!(s, src.port());
            let e = expect.entry((s, dport)).or_insert(0);
            if n == *e {
                ok += 1;
                *e += 1;
                received2.store(ok, std::sync::atomic::Ordering::Relaxed);
            } else if n > *e {
                lost += n - *e;
                *e = n + 1;
            } else {
                dup += 1;
            }
        }
        for h in hs {
            h.abort();
        }
        (ok, lost, dup)
    });

    let mut counters = vec![[0u64; SOCKS as usize]; SOCKS as usize];
    let mut kills = 0u64;
    let mut kill_hits = 0usize;
    let mut sent = 0u64;
    let mut i = 0u64;
    while sent < TOTAL && Instant::now() < deadline {
        let s = (i % u64::from(SOCKS)) as usize;
        let d = ((i / 3) % u64::from(SOCKS)) as usize;
        i += 1;
        let pad = (i * 37 % 700) as usize;
        let dest = SocketAddrV4::new(B, 6000 + d as u16);
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            senders[s].send_to(dest, payload(5000 + s as u16, counters[s][d], pad)),
        )
        .await;
        match r {
            Ok(Ok(())) => {
                counters[s][d] += 1;
                sent += 1;
            }
            Ok(Err(e)) => panic!("send: {e}"),
            Err(_) => break,
        }
        if kills < KILLS && sent == (kills + 1) * TOTAL / (KILLS + 1) {
            // Let the receiver catch up with most of the traffic, so that each kill cuts a
            // live stream, then kill from alternating sides. Waits are bounded by the deadline.
            while received.load(std::sync::atomic::Ordering::Relaxed) + 200 < sent
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut hit = 0;
            while hit == 0 && Instant::now() < deadline {
                hit = if kills.is_multiple_of(2) {
                    a.kill_transports(B)
                } else {
                    b.kill_transports(A)
                };
                if hit == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            kill_hits += hit;
            kills += 1;
        }
        if sent.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    let (ok, lost, dup) = tokio::time::timeout(Duration::from_secs(30), recv_task)
        .await
        .expect("receiver timed out")
        .expect("receiver panicked");
    let ia = a.info();
    let retrans: u64 = ia
        .conns
        .iter()
        .flat_map(|c| &c.paths)
        .map(|p| p.retransmitted)
        .sum();
    let resets: u64 = ia
        .conns
        .iter()
        .flat_map(|c| &c.paths)
        .map(|p| p.resets)
        .sum();
    let dropped: u64 = b
        .info()
        .conns
        .iter()
        .flat_map(|c| &c.paths)
        .map(|p| p.dup_dropped)
        .sum();
    eprintln!(
        "sent {sent} delivered {ok} lost {lost} dup {dup} kills {kills} (sockets hit {kill_hits}) \
         resets(A) {resets} retransmitted(A) {retrans} dup_dropped(B) {dropped}"
    );
    assert_eq!(sent, TOTAL);
    assert_eq!(kills, KILLS);
    assert_eq!((ok, lost, dup), (TOTAL, 0, 0));
    assert!(resets >= KILLS, "the kills really reset connections");
    a.shutdown();
    b.shutdown();
}

/// The blocking wrapper works from plain threads.
#[test]
fn blocking_socket() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Find a port usable on both addresses.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    drop(rt);
    let mut ca = StackConfig::new(Ipv4Addr::new(127, 0, 0, 3));
    ca.tcp_port = port;
    let mut cb = StackConfig::new(Ipv4Addr::new(127, 0, 0, 4));
    cb.tcp_port = port;
    let x = rds::BlockingRdsSocket::bind_with(ca, 7000).unwrap();
    let y = rds::BlockingRdsSocket::bind_with(cb, 7001).unwrap();
    x.send_to(y.local_addr(), Bytes::from_static(b"blocking"))
        .unwrap();
    let got = y.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(got, Some((Bytes::from_static(b"blocking"), x.local_addr())));
}

/// Congestion over real sockets: a receiver that does not read stops the sender (would-block,
/// or a waiting `send_to`); reading restarts it, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn congestion_blocks_and_releases_sender() {
    let (a, b) = pair(1).await;
    let sa = a.bind(4100).unwrap();
    let sb = b.bind(4101).unwrap();
    sb.set_rcvbuf(16 * 1024);
    let dest = SocketAddrV4::new(B, 4101);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0u64;
    // Send 1 KiB messages until the peer's congestion map stops us.
    let blocked = loop {
        assert!(Instant::now() < deadline, "never congested: {:?}", b.info());
        match sa.try_send_to(dest, payload(4100, sent, 1014)) {
            Ok(()) => sent += 1,
            Err(rds::SendError::Congested) => break true,
            Err(e) if e.is_would_block() => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => panic!("{e}"),
        }
        if sent.is_multiple_of(16) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    assert!(blocked);
    let port = b.info().ports.into_iter().find(|p| p.port == 4101).unwrap();
    assert!(port.congested && port.queued > port.rcvbuf, "{port:?}");
    // A blocking send waits while congested, and completes once the receiver drains.
    let sa = std::sync::Arc::new(sa);
    let sa2 = std::sync::Arc::clone(&sa);
    let waiter = tokio::spawn(async move { sa2.send_to(dest, payload(4100, sent, 10)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "send_to must wait while the port is congested"
    );
    let mut got = 0u64;
    while got < sent + 1 {
        let r = tokio::time::timeout(Duration::from_secs(10), sb.recv_from()).await;
        let (mut p, _) = r.expect("receive").unwrap();
        p.advance(2);
        assert_eq!(p.get_u64(), got, "in order, nothing lost");
        got += 1;
    }
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("sender released")
        .unwrap()
        .unwrap();
    a.shutdown();
    b.shutdown();
}

/// Connections that send no RDS header: past `max_unbound` they are reset at once, and the
/// ones accepted are closed when `bind_timeout` runs out, by the driver's timer task even when
/// nothing else happens on the stack (an accept makes no action to wake it otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_bounded_and_closed() {
    use tokio::io::AsyncReadExt;
    let server = Ipv4Addr::new(127, 0, 0, 9);
    let bind_timeout = Duration::from_secs(1);
    let mut stack = None;
    for _ in 0..20 {
        let port = std::net::TcpListener::bind((server, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        let mut c = StackConfig::new(server);
        c.tcp_port = port;
        c.max_unbound = 2;
        c.bind_timeout = bind_timeout;
        if let Ok(s) = RdsStack::start(c).await {
            stack = Some((s, port));
            break;
        }
    }
    let (s, port) = stack.expect("no free port");
    // From smaller addresses, so that the stack accepts rather than resets and dials back.
    let dial = |from: u8| async move {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, from), 0).into())
            .unwrap();
        sock.connect(SocketAddrV4::new(server, port).into()).await
    };
    let started = Instant::now();
    let mut c1 = dial(1).await.unwrap();
    let mut c2 = dial(2).await.unwrap();
    // Both are held: nothing arrives on them while the stack waits for a header.
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(100), c1.read(&mut buf))
            .await
            .is_err(),
        "the first connection was answered or closed before its time"
    );
    // The reset can come before the connect's own completion is seen.
    if let Ok(mut c3) = dial(3).await {
        let refused = tokio::time::timeout(Duration::from_secs(10), c3.read(&mut buf))
            .await
            .expect("the third connection was not refused");
        assert!(
            matches!(refused, Ok(0) | Err(_)),
            "the third connection read {refused:?}"
        );
    }
    for c in [&mut c1, &mut c2] {
        let end = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("a silent connection outlived its bind timeout by 10 s");
        assert!(matches!(end, Ok(0) | Err(_)), "read {end:?}");
    }
    assert!(
        started.elapsed() >= bind_timeout - Duration::from_millis(50),
        "closed after {:?}, before the bind timeout",
        started.elapsed()
    );
    let i = s.info();
    assert_eq!(i.unbound, 0);
    assert_eq!((i.limits.unbound_refused, i.limits.unbound_expired), (1, 2));
    s.shutdown();
}
