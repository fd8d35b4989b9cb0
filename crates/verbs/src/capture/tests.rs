//! Tests of the capture writer: pooled buffers, reservations.

use super::*;

/// The TCP payloads of a classic pcap written by [`Capture`], in file order, with their
/// direction (by source port).
fn payloads(pcap: &[u8], local_port: u16) -> Vec<(Dir, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let pkt = &pcap[at + 16..at + 16 + len];
        let sport = u16::from_be_bytes([pkt[34], pkt[35]]);
        let dir = if sport == local_port {
            Dir::Out
        } else {
            Dir::In
        };
        if pkt.len() > 54 {
            out.push((dir, pkt[54..].to_vec()));
        }
        at += 16 + len;
    }
    out
}

/// A capture in a directory of its own under the system's temporary directory, between
/// 127.0.0.1:`local` and 127.0.0.1:`local + 1`.
fn capture(name: &str, local: u16, initiator: bool) -> (Capture, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("oxrdma-capture-{name}-{}", std::process::id()));
    let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let c = Capture::create(&dir, at(local), at(local + 1), initiator).unwrap();
    (c, dir)
}

#[test]
fn pooled_buffers_keep_every_byte_and_stay_bounded() {
    const LOCAL: u16 = 4001;
    let (mut c, dir) = capture("pool", LOCAL, true);
    let data = |n: usize, seed: u8| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    };
    let mut want: Vec<(Dir, Vec<u8>)> = Vec::new();
    // Small, pooled and over-a-segment records in both directions, many times over, so
    // that buffers go round between the writer and the recording side.
    for round in 0..200u32 {
        let seed = round as u8;
        for (dir, n) in [
            (Dir::Out, 200),
            (Dir::In, POOLED_MIN),
            (Dir::In, 66_000),
            (Dir::Out, MAX_SEGMENT),
            (Dir::In, POOLED_MIN - 1),
        ] {
            let d = data(n, seed);
            c.record(dir, &d).unwrap();
            for chunk in d.chunks(MAX_SEGMENT) {
                want.push((dir, chunk.to_vec()));
            }
        }
        // Parts packed into segments: 70,000 bytes in three pieces.
        let (a, b, d) = (
            data(30_000, seed),
            data(100, !seed),
            data(39_900, seed ^ 0x55),
        );
        c.record_parts(Dir::Out, &[&a, &b, &d]).unwrap();
        let all: Vec<u8> = [a, b, d].concat();
        for chunk in all.chunks(MAX_SEGMENT) {
            want.push((Dir::Out, chunk.to_vec()));
        }
        assert!(c.spare.len() <= POOL_BUFFERS, "{} spare", c.spare.len());
        assert!(c.shared.pending.lock().free.len() <= POOL_BUFFERS);
        if round % 50 == 0 {
            // Let the writer run and give buffers back.
            std::thread::sleep(WRITER_PERIOD * 3);
        }
    }
    let path = c.path().to_path_buf();
    c.close().unwrap();
    let got = payloads(&std::fs::read(&path).unwrap(), LOCAL);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.0 == w.0 && g.1 == w.1, "segment {i} differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reservation_keeps_its_place_and_holds_the_writer_back() {
    const LOCAL: u16 = 4005;
    let (mut c, dir) = capture("resv", LOCAL, true);
    let path = c.path().to_path_buf();
    let before = b"written before".to_vec();
    let reserved = vec![0xabu8; 70_000];
    let answer = b"the answer, recorded before the bytes it answers".to_vec();
    c.record(Dir::Out, &before).unwrap();
    let t = c.reserve(Dir::In, reserved.len(), SystemTime::now());
    c.record(Dir::Out, &answer).unwrap();
    // The writer takes what came before the reservation, and nothing after it.
    let queued = |c: &Capture| {
        let p = c.shared.pending.lock();
        let first_reserved = matches!(p.recs.first().map(|r| &r.body), Some(Body::Reserved(_)));
        (p.recs.len(), first_reserved)
    };
    let waited = std::time::Instant::now();
    while queued(&c).0 != 2 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            queued(&c)
        );
        std::thread::sleep(WRITER_PERIOD);
    }
    std::thread::sleep(WRITER_PERIOD * 5);
    assert_eq!(queued(&c), (2, true));
    c.fill(t, &reserved);
    c.close().unwrap();
    let got = payloads(&std::fs::read(&path).unwrap(), LOCAL);
    let want = vec![
        (Dir::Out, before),
        (Dir::In, reserved[..MAX_SEGMENT].to_vec()),
        (Dir::In, reserved[MAX_SEGMENT..].to_vec()),
        (Dir::Out, answer),
    ];
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reservation_never_filled_is_dropped_at_close() {
    const LOCAL: u16 = 4007;
    let (mut c, dir) = capture("drop", LOCAL, true);
    let path = c.path().to_path_buf();
    let _lost = c.reserve(Dir::In, 100, SystemTime::now());
    c.record(Dir::Out, b"after").unwrap();
    c.close().unwrap();
    let got = payloads(&std::fs::read(&path).unwrap(), LOCAL);
    assert_eq!(got, vec![(Dir::Out, b"after".to_vec())]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_writer_gives_large_buffers_back() {
    const LOCAL: u16 = 4003;
    let (mut c, dir) = capture("back", LOCAL, false);
    let d = vec![7u8; 20_000];
    // The writer is held back while the four records are made. Otherwise, on a loaded machine,
    // it could write the first before the second is queued: the second's queueing takes that
    // buffer back, the third reuses it, and only three distinct buffers ever exist.
    let hold = c.reserve(Dir::Out, 1, SystemTime::now());
    for _ in 0..4 {
        c.record(Dir::In, &d).unwrap();
    }
    assert!(
        c.spare.is_empty(),
        "nothing came back while the writer was held"
    );
    c.fill(hold, b"x");
    // The writer drains within a few periods and returns the four buffers.
    let waited = std::time::Instant::now();
    while c.shared.pending.lock().free.len() < 4 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "no buffer came back"
        );
        std::thread::sleep(WRITER_PERIOD);
    }
    // What is queued next takes them up: a reservation here, which also holds the writer
    // back, so that no buffer comes back while the rest is checked.
    let t = c.reserve(Dir::In, d.len(), SystemTime::now());
    assert_eq!((c.spare.len(), c.shared.pending.lock().free.len()), (4, 0));
    // A large record uses one of them instead of allocating.
    c.record(Dir::In, &d).unwrap();
    assert_eq!(c.spare.len(), 3);
    c.fill(t, &d);
    c.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
