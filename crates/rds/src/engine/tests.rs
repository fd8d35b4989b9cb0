use super::*;
use crate::wire::{self, Message};

fn engine(ip: [u8; 4]) -> Engine {
    let mut c = EngineConfig::tcp(Ipv4Addr::from(ip));
    c.seed = Some(5);
    Engine::new(c)
}

#[test]
fn reconnect_backoff_is_random_doubling_and_capped() {
    let mut e = engine([10, 0, 0, 1]);
    e.bind(1000).unwrap();
    let now = Instant::now();
    let peer = Ipv4Addr::new(10, 0, 0, 2);
    let _ = e.ping(now, 1000, peer);
    let id = PathId { peer, index: 0 };
    // First try immediately.
    assert_eq!(e.poll_action(), Some(Action::Connect(id)));
    let mut cap = Duration::from_millis(2);
    let mut t = now;
    for _ in 0..20 {
        e.connect_failed(t, id);
        let at = e.poll_timeout().expect("retry scheduled");
        let d = at - t;
        assert!(d < cap, "delay {d:?} not below {cap:?}");
        assert!(d < Duration::from_secs(1));
        // Nothing happens before the time; the connect is issued at it.
        e.handle_timeout(at - Duration::from_nanos(1).min(d));
        assert!(d.is_zero() || e.poll_action().is_none());
        e.handle_timeout(at);
        assert_eq!(e.poll_action(), Some(Action::Connect(id)));
        t = at;
        cap = (cap * 2).min(Duration::from_secs(1));
    }
    // A successful connect resets the back-off: the next failure retries quickly again.
    assert!(e.connected(t, id).is_some());
}

#[test]
fn larger_address_drops_own_connect_and_smaller_resets_inbound() {
    let now = Instant::now();
    let mut hi = engine([10, 0, 0, 9]);
    let lo_ip = Ipv4Addr::new(10, 0, 0, 1);
    hi.bind(7).unwrap();
    let _ = hi.ping(now, 7, lo_ip);
    let id = PathId {
        peer: lo_ip,
        index: 0,
    };
    assert_eq!(hi.poll_action(), Some(Action::Connect(id)));
    assert_eq!(
        hi.connected(now, id),
        None,
        "the larger side drops its own connect"
    );
    let mut lo = engine([10, 0, 0, 1]);
    assert_eq!(
        lo.accept(now, Ipv4Addr::new(10, 0, 0, 9)),
        AcceptOutcome::Reject
    );
    assert_eq!(
        lo.poll_action(),
        Some(Action::Connect(PathId {
            peer: Ipv4Addr::new(10, 0, 0, 9),
            index: 0
        }))
    );
}

#[test]
fn sport_zero_ping_is_ignored_and_ping_is_answered() {
    let now = Instant::now();
    let mut e = engine([10, 0, 0, 2]);
    let AcceptOutcome::Accept(tok) = e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) else {
        panic!("accept");
    };
    let mut stream = Vec::new();
    stream.extend_from_slice(&CongMap::header().encode().unwrap());
    stream.extend_from_slice(&CongMap::new().encode());
    stream.extend_from_slice(&wire::ping(1, 0).encode().unwrap());
    stream.extend_from_slice(&wire::ping(2, 4000).encode().unwrap());
    e.on_recv(now, tok, &stream).unwrap();
    let mut out = Vec::new();
    while let Some(b) = e.poll_transmit(tok) {
        out.extend_from_slice(&b);
    }
    // Our stream: cong map (48 + 8192), probe, then exactly one pong (to port 4000).
    let mut off = 0;
    let mut pongs = Vec::new();
    while off < out.len() {
        let (m, n) = Message::decode(&out[off..]).unwrap();
        off += n;
        if m.header.sport == 0 && m.header.dport != 0 && !m.header.is_cong_map() {
            pongs.push(m.header.dport);
        }
    }
    assert_eq!(pongs, vec![4000]);
}

/// A sender that ignores the congestion map: its messages are accepted past the receive
/// buffer (spec 3.1), up to the hard limit, then dropped and counted; the queue never
/// holds more than the limit plus nothing, and drains normally.
#[test]
fn a_sender_that_ignores_congestion_is_dropped_past_the_hard_limit() {
    let now = Instant::now();
    let mut c = EngineConfig::tcp(Ipv4Addr::new(10, 0, 0, 2));
    c.seed = Some(5);
    c.rcvbuf_hard_factor = 2;
    c.rcvbuf_hard_slack = 0;
    let mut e = Engine::new(c);
    e.bind(4000).unwrap();
    e.set_rcvbuf(4000, 10_000);
    let AcceptOutcome::Accept(tok) = e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) else {
        panic!("accept");
    };
    let mut stream = Vec::new();
    stream.extend_from_slice(&CongMap::header().encode().unwrap());
    stream.extend_from_slice(&CongMap::new().encode());
    e.on_recv(now, tok, &stream).unwrap();
    // 100 messages of 1000 bytes, sent at once whatever the map says.
    let mut stream = Vec::new();
    for seq in 1..=100u64 {
        let m = Message {
            header: Header {
                seq,
                sport: 1234,
                dport: 4000,
                ..Header::default()
            },
            payload: Bytes::from(vec![seq as u8; 1000]),
        };
        stream.extend_from_slice(&m.encode().unwrap());
    }
    e.on_recv(now, tok, &stream).unwrap();
    let port = |e: &Engine| e.info().ports.into_iter().find(|p| p.port == 4000).unwrap();
    let p = port(&e);
    // Congested past 10,000 bytes, accepted up to 2 × 10,000, the other 80 dropped.
    assert!(p.congested);
    assert_eq!(p.queued, 20_000);
    assert_eq!(p.dropped, 80);
    // Our map went out with the port marked.
    assert!(e.local_cong.get(4000));
    // What was accepted is delivered in order; then the port takes messages again.
    for seq in 1..=20u8 {
        let d = e.recv(4000).expect("queued");
        assert_eq!(d.payload[0], seq);
    }
    assert!(e.recv(4000).is_none());
    let p = port(&e);
    assert!(!p.congested && p.queued == 0);
    let m = Message {
        header: Header {
            seq: 101,
            sport: 1234,
            dport: 4000,
            ..Header::default()
        },
        payload: Bytes::from_static(b"after"),
    };
    e.on_recv(now, tok, &m.encode().unwrap()).unwrap();
    assert_eq!(&e.recv(4000).expect("accepted again").payload[..], b"after");
    assert_eq!(port(&e).dropped, 80);
}

proptest::proptest! {
    /// Whole messages handed over as owned buffers (RDS over RDMA's reassembler) and the same
    /// bytes read from a stream in arbitrary pieces deliver the same datagrams.
    #[test]
    fn owned_messages_deliver_what_stream_bytes_do(
        lens in proptest::collection::vec(0usize..6000, 1..6),
        cut in 1usize..200,
    ) {
        let now = Instant::now();
        let peer = Ipv4Addr::new(10, 0, 0, 1);
        let mut msgs = Vec::new();
        for (i, len) in lens.iter().enumerate() {
            let h = wire::Header {
                seq: i as u64 + 1,
                len: *len as u32,
                sport: 3000,
                dport: 4000,
                ..wire::Header::default()
            };
            let mut m = h.encode().unwrap().to_vec();
            m.extend(std::iter::repeat_n(i as u8, *len));
            msgs.push(m);
        }
        let mut got = Vec::new();
        for owned in [false, true] {
            let mut e = engine([10, 0, 0, 2]);
            e.bind(4000).unwrap();
            let AcceptOutcome::Accept(tok) = e.accept(now, peer) else {
                panic!("accept refused");
            };
            if owned {
                for m in &msgs {
                    e.on_recv_bytes(now, tok, Bytes::copy_from_slice(m)).unwrap();
                }
            } else {
                let stream: Vec<u8> = msgs.concat();
                for c in stream.chunks(cut) {
                    e.on_recv(now, tok, c).unwrap();
                }
            }
            let mut d = Vec::new();
            while let Some(x) = e.recv(4000) {
                d.push((x.src, x.payload));
            }
            got.push(d);
        }
        proptest::prop_assert_eq!(got[0].len(), lens.len());
        proptest::prop_assert_eq!(&got[0], &got[1]);
    }
}

fn bounded(ip: [u8; 4], max_peers: usize, max_unbound: usize) -> Engine {
    let mut c = EngineConfig::tcp(Ipv4Addr::from(ip));
    c.seed = Some(5);
    c.max_peers = max_peers;
    c.max_unbound = max_unbound;
    Engine::new(c)
}

fn peers(e: &Engine) -> Vec<Ipv4Addr> {
    e.info().conns.iter().map(|c| c.peer).collect()
}

/// The first bytes a connecting peer sends: its congestion map.
fn cong_map_stream() -> Vec<u8> {
    let mut s = CongMap::header().encode().unwrap().to_vec();
    s.extend_from_slice(&CongMap::new().encode());
    s
}

/// Peer entries are bounded. At the bound, an entry that never carried a message is forgotten
/// for a newcomer, but not while a transport from it waits for its first header; otherwise the
/// newcomer is refused.
#[test]
fn peers_are_bounded_and_only_unused_entries_are_forgotten() {
    let now = Instant::now();
    let mut e = bounded([10, 0, 0, 9], 2, 8);
    let a = Ipv4Addr::new(10, 0, 0, 1);
    let b = Ipv4Addr::new(10, 0, 0, 2);
    let c = Ipv4Addr::new(10, 0, 0, 3);
    let AcceptOutcome::Accept(ta) = e.accept(now, a) else {
        panic!("accept a");
    };
    let AcceptOutcome::Accept(tb) = e.accept(now, b) else {
        panic!("accept b");
    };
    // Both entries have a transport waiting for its header: nothing to forget.
    assert_eq!(e.accept(now, c), AcceptOutcome::Refuse);
    assert_eq!(e.info().limits.peers_refused, 1);
    // A connects for real (its congestion map binds the transport to path 0); B goes away
    // before sending anything.
    e.on_recv(now, ta, &cong_map_stream()).unwrap();
    e.transport_down(now, tb);
    assert!(matches!(e.accept(now, c), AcceptOutcome::Accept(_)));
    let l = e.info().limits;
    assert_eq!((l.peers_refused, l.peers_forgotten), (1, 1));
    assert_eq!(peers(&e), vec![a, c]);
    // A carried messages, so even once its transport is gone it is kept: B is refused now,
    // and a send to a new destination fails with the bound in its error.
    e.transport_down(now, ta);
    assert_eq!(e.accept(now, b), AcceptOutcome::Refuse);
    e.bind(7).unwrap();
    let d = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 4), 7);
    assert_eq!(
        e.send(now, 7, d, Bytes::from_static(b"x")),
        Err(crate::SendError::TooManyPeers(2))
    );
    assert_eq!(peers(&e), vec![a, c]);
    assert_eq!(e.info().limits.peers_refused, 3);
    // An already known peer is always served.
    assert!(matches!(e.accept(now, a), AcceptOutcome::Accept(_)));
}

/// Accepted transports that send no header are bounded in number and closed after
/// `bind_timeout`; the entries they opened can then be forgotten.
#[test]
fn unbound_transports_are_bounded_and_time_out() {
    let now = Instant::now();
    let mut e = bounded([10, 0, 0, 9], 4, 2);
    let t1 = match e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) {
        AcceptOutcome::Accept(t) => t,
        o => panic!("{o:?}"),
    };
    let later = now + Duration::from_secs(1);
    let t2 = match e.accept(later, Ipv4Addr::new(10, 0, 0, 1)) {
        AcceptOutcome::Accept(t) => t,
        o => panic!("{o:?}"),
    };
    assert_eq!(
        e.accept(later, Ipv4Addr::new(10, 0, 0, 2)),
        AcceptOutcome::Refuse
    );
    assert_eq!(e.info().limits.unbound_refused, 1);
    assert_eq!(e.info().unbound, 2);
    // Half a header does not bind.
    e.on_recv(now, t1, &cong_map_stream()[..20]).unwrap();
    let bt = EngineConfig::tcp(Ipv4Addr::UNSPECIFIED).bind_timeout;
    assert_eq!(e.poll_timeout(), Some(now + bt));
    e.handle_timeout(now + bt - Duration::from_nanos(1));
    assert_eq!(e.poll_action(), None);
    e.handle_timeout(now + bt);
    assert_eq!(e.poll_action(), Some(Action::Close(t1)));
    assert_eq!(e.poll_action(), None);
    assert_eq!(e.poll_timeout(), Some(later + bt));
    e.handle_timeout(later + bt);
    assert_eq!(e.poll_action(), Some(Action::Close(t2)));
    let i = e.info();
    assert_eq!((i.unbound, i.limits.unbound_expired), (0, 2));
    // The rest of the header after its transport was closed is ignored.
    e.on_recv(later + bt, t1, &cong_map_stream()[20..]).unwrap();
    assert_eq!(e.poll_action(), None);
    assert_eq!(e.poll_timeout(), None);
}
