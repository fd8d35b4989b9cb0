//! A clean shutdown loses no reply (issue 22, "in-flight calls finish"): with many NFSv3 calls
//! in flight over RPC-over-RDMA (soft-iWARP on loopback: WRITEs whose data is pulled from Read
//! chunks, READs answered through Write chunks, READDIRPLUS through Reply chunks, GETATTRs
//! inline) and over TCP, `Served::shutdown_within` begins at a different point in each round.
//!
//! The invariant, per transport: every call the server executed (counted by its NFS
//! statistics) got its complete and correct reply at the client (READ data bit-exact, WRITE
//! counts, READDIRPLUS listings as before the load):
//! `replies received == calls executed`. The calls that got no reply are those the report says
//! were dropped, plus those the server never read (still on the wire when the connection
//! closed, or sent after it closed), which no counter of the server can see:
//! `replies received + dropped <= calls sent`, and `dropped <= calls that failed` (the TCP
//! client sends each call once: no retransmission on a new connection).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client};
use nfs::nfs3::{Fh3, ReaddirplusArgs, StableHow};
use nfs::serve::{ServeConfig, start};
use nfs::stats::ServerStats;
use nfs::ulb::NfsBinding;
use oncrpc::{ClientConfig, RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};

const BLOCK: usize = 64 << 10;
const BLOCKS: u64 = 64;
const DIR_ENTRIES: usize = 200;
/// Calls each client keeps in flight.
const RDMA_DEPTH: usize = 32;
const TCP_DEPTH: usize = 16;
const ROUNDS: usize = 20;
/// Rounds stop starting once this much time has gone (at least `MIN_ROUNDS` run).
const TIME_BOUND: Duration = Duration::from_secs(120);
const MIN_ROUNDS: usize = 3;

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|o| (o.wrapping_mul(7) ^ (o >> 12)) as u8)
        .collect()
}

fn nfs3_calls(stats: &ServerStats, transport: &str) -> u64 {
    stats
        .procedures()
        .iter()
        .filter(|p| p.transport == transport && p.program == "nfs3")
        .map(|p| p.calls)
        .sum()
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    sent: AtomicU64,
    replies: AtomicU64,
    failed: AtomicU64,
}

struct Target {
    data: Fh3,
    out: Fh3,
    dir: Fh3,
    dir_len: usize,
}

/// One call of kind `i % 6` and the check of its reply: `Ok(())` for a complete, correct
/// reply, `Err(None)` for no reply (the call failed), `Err(Some(why))` for a wrong one.
async fn one_call(c: &Nfs3Client, t: &Target, i: u64) -> Result<(), Option<String>> {
    let block = i % BLOCKS;
    let off = block * BLOCK as u64;
    match i % 6 {
        0 | 4 => {
            let data = Bytes::from(pattern(off ^ 0x5a5a, BLOCK));
            let r = c
                .write(&t.out, off, data, StableHow::Unstable)
                .await
                .map_err(|_| None)?;
            let ok = r.into_result().map_err(|e| Some(format!("WRITE: {e}")))?;
            if ok.count as usize != BLOCK {
                return Err(Some(format!("WRITE count {}", ok.count)));
            }
        }
        1 | 3 => {
            let r = c.read(&t.data, off, BLOCK as u32).await.map_err(|_| None)?;
            let ok = r.into_result().map_err(|e| Some(format!("READ: {e}")))?;
            if ok.count as usize != BLOCK || ok.data.0[..] != pattern(off, BLOCK)[..] {
                return Err(Some(format!(
                    "READ at {off}: {} bytes, not the file's",
                    ok.data.0.len()
                )));
            }
        }
        2 => {
            let r = c.getattr(&t.data).await.map_err(|_| None)?;
            let ok = r.into_result().map_err(|e| Some(format!("GETATTR: {e}")))?;
            if ok.obj_attributes.size != BLOCKS * BLOCK as u64 {
                return Err(Some(format!("GETATTR size {}", ok.obj_attributes.size)));
            }
        }
        _ => {
            let r = c
                .readdirplus(ReaddirplusArgs {
                    dir: t.dir.clone(),
                    cookie: 0,
                    cookieverf: Default::default(),
                    dircount: 64 << 10,
                    maxcount: 64 << 10,
                })
                .await
                .map_err(|_| None)?;
            let ok = r
                .into_result()
                .map_err(|e| Some(format!("READDIRPLUS: {e}")))?;
            if ok.entries.0.len() != t.dir_len {
                return Err(Some(format!(
                    "READDIRPLUS: {} entries, {} before",
                    ok.entries.0.len(),
                    t.dir_len
                )));
            }
        }
    }
    Ok(())
}

/// Keep `depth` calls in flight until one fails or `stop` is set.
async fn load(
    c: Nfs3Client,
    t: Arc<Target>,
    depth: usize,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    total: Arc<AtomicU64>,
) -> Vec<String> {
    let c = Arc::new(c);
    let mut tasks = Vec::new();
    for w in 0..depth {
        let (c, t, seen, stop, total) = (
            c.clone(),
            t.clone(),
            seen.clone(),
            stop.clone(),
            total.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = w as u64;
            let mut wrong = Vec::new();
            while !stop.load(Ordering::Acquire) {
                seen.sent.fetch_add(1, Ordering::Relaxed);
                match one_call(&c, &t, i).await {
                    Ok(()) => {
                        seen.replies.fetch_add(1, Ordering::Relaxed);
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(None) => {
                        seen.failed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(Some(why)) => {
                        wrong.push(why);
                        break;
                    }
                }
                i += depth as u64;
            }
            wrong
        }));
    }
    let mut wrong = Vec::new();
    for t in tasks {
        wrong.extend(t.await.unwrap());
    }
    wrong
}

/// Files of one round: a data file of `BLOCKS` blocks, a file to write, a directory.
fn populate(export: &std::path::Path) {
    std::fs::write(export.join("data"), pattern(0, (BLOCKS as usize) * BLOCK)).unwrap();
    std::fs::write(export.join("out"), b"").unwrap();
    let dir = export.join("dir");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..DIR_ENTRIES {
        std::fs::write(
            dir.join(format!("entry-with-a-rather-long-name-{i:05}")),
            b"",
        )
        .unwrap();
    }
}

async fn target(c: &Nfs3Client, root: &Fh3) -> Target {
    let look = |name: &'static str| async move {
        c.lookup(root, name.as_bytes())
            .await
            .unwrap()
            .into_result()
            .unwrap()
            .object
    };
    let (data, out, dir) = (look("data").await, look("out").await, look("dir").await);
    let listing = c
        .readdirplus(ReaddirplusArgs {
            dir: dir.clone(),
            cookie: 0,
            cookieverf: Default::default(),
            dircount: 64 << 10,
            maxcount: 64 << 10,
        })
        .await
        .unwrap()
        .into_result()
        .unwrap();
    Target {
        data,
        out,
        dir,
        dir_len: listing.entries.0.len(),
    }
}

/// What a round met: calls in progress when the shutdown began (over RDMA, over TCP), and
/// the RDMA client's calls with Read chunks, replies through Write chunks and through a Reply
/// chunk.
#[derive(Default)]
struct Met {
    rdma_in_progress: u64,
    tcp_in_progress: u64,
    read_chunk_calls: u64,
    write_chunk_replies: u64,
    reply_chunk_replies: u64,
}

/// One round.
async fn round(n: usize) -> Met {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    populate(&export);
    let mut cfg = ServeConfig::new(&export);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    let s = start(cfg).await.unwrap();
    let stats = s.stats().clone();

    // Each call is sent once: the client must not resend a call on a new connection (as it
    // does by default once the server closes the old one), or a call the draining server
    // dropped could be dropped again and counted twice.
    let tcp: Arc<dyn RpcTransport> = Arc::new(
        TcpClient::connect_with(
            s.nfs_addr.unwrap(),
            ClientConfig::default().with_max_retransmits(0),
        )
        .await
        .unwrap(),
    );
    let root = MountClient::new(tcp.clone()).mnt("/").await.unwrap();
    let tcp_client = Nfs3Client::new(tcp).with_auth_sys(0, 0, vec![]);
    let rdma = Arc::new(
        RdmaClient::connect_with(
            s.rdma_addr.unwrap(),
            TransportConfig {
                reconnect_attempts: 0,
                call_timeout: Duration::from_secs(30),
                ..TransportConfig::default()
            },
            vec![Arc::new(NfsBinding::new())],
            None,
        )
        .await
        .unwrap(),
    );
    let rdma_client = Nfs3Client::new(rdma.clone()).with_auth_sys(0, 0, vec![]);
    let t = Arc::new(target(&tcp_client, &root).await);
    // The listing over RPC-over-RDMA is the one over TCP (and comes back in a Reply chunk).
    let rt = target(&rdma_client, &root).await;
    assert_eq!(rt.dir_len, t.dir_len);
    assert!(t.dir_len >= DIR_ENTRIES, "{} entries", t.dir_len);
    let before = (nfs3_calls(&stats, "rdma"), nfs3_calls(&stats, "tcp"));

    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let (rs, ts) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let rl = tokio::spawn(load(
        rdma_client,
        t.clone(),
        RDMA_DEPTH,
        rs.clone(),
        stop.clone(),
        total.clone(),
    ));
    let tl = tokio::spawn(load(
        tcp_client,
        t.clone(),
        TCP_DEPTH,
        ts.clone(),
        stop.clone(),
        total.clone(),
    ));
    // A different point of the load in every round.
    let at = 8 + (n as u64 * 37) % 160;
    let waiting = Instant::now();
    while total.load(Ordering::Relaxed) < at {
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "round {n}: only {} replies in 60 s",
            total.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let report = s.shutdown_within(Duration::from_secs(30)).await;
    stop.store(true, Ordering::Release);
    let wrong_rdma = tokio::time::timeout(Duration::from_secs(60), rl)
        .await
        .expect("the RDMA client's calls end once its connection is closed")
        .unwrap();
    let wrong_tcp = tokio::time::timeout(Duration::from_secs(60), tl)
        .await
        .expect("the TCP client's calls end once its connection is closed")
        .unwrap();
    assert!(
        wrong_rdma.is_empty(),
        "round {n}: wrong replies over RDMA: {wrong_rdma:?}"
    );
    assert!(
        wrong_tcp.is_empty(),
        "round {n}: wrong replies over TCP: {wrong_tcp:?}"
    );

    let per = |name: &str| {
        report
            .transports
            .iter()
            .find(|x| x.transport == name)
            .cloned()
            .unwrap_or_else(|| panic!("round {n}: no {name} in {report:?}"))
    };
    let (r, tc) = (per("rdma"), per("tcp"));
    let executed = (
        nfs3_calls(&stats, "rdma") - before.0,
        nfs3_calls(&stats, "tcp") - before.1,
    );
    let g = |s: &Seen| {
        (
            s.sent.load(Ordering::Relaxed),
            s.replies.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
        )
    };
    let (rsent, rrep, rfail) = g(&rs);
    let (tsent, trep, tfail) = g(&ts);
    println!(
        "round {n:2} (shutdown after {at:3} replies): rdma sent {rsent} replies {rrep} executed {} \
         dropped {} failed {rfail}, in progress {} answered {}; tcp sent {tsent} replies {trep} \
         executed {} dropped {} failed {tfail}, in progress {} answered {}",
        executed.0,
        r.dropped,
        r.at_start,
        r.answered,
        executed.1,
        tc.dropped,
        tc.at_start,
        tc.answered
    );
    assert!(report.drained, "round {n}: {report:?}");
    assert_eq!(
        rrep, executed.0,
        "round {n}: RDMA: every call executed must have its reply ({report:?})"
    );
    assert_eq!(
        trep, executed.1,
        "round {n}: TCP: every call executed must have its reply ({report:?})"
    );
    assert!(
        rrep + r.dropped <= rsent && r.dropped <= rfail,
        "round {n}: {r:?}"
    );
    assert!(
        trep + tc.dropped <= tsent && tc.dropped <= tfail,
        "round {n}: {tc:?}"
    );
    assert_eq!(r.answered, r.at_start, "round {n}: {r:?}");
    let cs = rdma.stats();
    rdma.disconnect().await;
    Met {
        rdma_in_progress: r.at_start,
        tcp_in_progress: tc.at_start,
        read_chunk_calls: cs.chunked,
        write_chunk_replies: cs.write_chunk_replies,
        reply_chunk_replies: cs.nomsg_replies,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_answers_every_call_it_executed_over_rdma_and_tcp() {
    let begun = Instant::now();
    let mut met = Met::default();
    let mut rounds = 0;
    while rounds < ROUNDS && (rounds < MIN_ROUNDS || begun.elapsed() < TIME_BOUND) {
        let m = round(rounds).await;
        met.rdma_in_progress += m.rdma_in_progress;
        met.tcp_in_progress += m.tcp_in_progress;
        met.read_chunk_calls += m.read_chunk_calls;
        met.write_chunk_replies += m.write_chunk_replies;
        met.reply_chunk_replies += m.reply_chunk_replies;
        rounds += 1;
    }
    println!(
        "{rounds} rounds in {:.1} s; calls in progress when the shutdown began: {} over RDMA, {} \
         over TCP; RDMA calls with Read chunks {}, replies through Write chunks {}, through a \
         Reply chunk {}",
        begun.elapsed().as_secs_f64(),
        met.rdma_in_progress,
        met.tcp_in_progress,
        met.read_chunk_calls,
        met.write_chunk_replies,
        met.reply_chunk_replies
    );
    // The shutdowns met calls under way (what the rounds are for), and every kind of chunk
    // was used.
    assert!(
        met.rdma_in_progress > 0,
        "no round began its shutdown with an RDMA call in progress"
    );
    assert!(met.read_chunk_calls > 0 && met.write_chunk_replies > 0 && met.reply_chunk_replies > 0);
}
