//! Fuzz the RDS engine's receive path with arbitrary stream bytes on an accepted transport.
#![no_main]

use std::net::Ipv4Addr;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use rds::engine::{AcceptOutcome, Engine, EngineConfig};

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut cfg = EngineConfig::tcp(Ipv4Addr::new(10, 0, 0, 2));
    cfg.seed = Some(1);
    cfg.default_rcvbuf = 4096;
    let mut e = Engine::new(cfg);
    let _ = e.bind(4000);
    let _ = e.bind(1);
    let AcceptOutcome::Accept(tok) = e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) else {
        return;
    };
    // The first byte picks the chunking, so split headers are exercised too.
    let (step, rest) = match data.split_first() {
        Some((s, r)) => (usize::from(*s).max(1), r),
        None => return,
    };
    // Chunks alternate between the borrowed path (a socket read) and the owned one (RDS over
    // RDMA's reassembled messages, whose payload is kept without a copy).
    for (i, chunk) in rest.chunks(step).enumerate() {
        let r = if i % 2 == 0 {
            e.on_recv(now, tok, chunk)
        } else {
            e.on_recv_bytes(now, tok, bytes::Bytes::copy_from_slice(chunk))
        };
        if r.is_err() {
            e.transport_down(now, tok);
            break;
        }
        while let Some(b) = e.poll_transmit(tok) {
            std::hint::black_box(b);
        }
    }
    while e.recv(4000).is_some() {}
    while e.poll_action().is_some() {}
    std::hint::black_box(e.info());
});
