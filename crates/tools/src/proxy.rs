//! A fault-injecting TCP relay for hostile-client tests: a client connects to the proxy on
//! 127.0.0.1, the proxy connects to the real server and copies bytes both ways until told to
//! misbehave.
//!
//! It works on byte streams, so it serves soft-iWARP (RPC-over-RDMA over
//! `verbs::Device::soft_iwarp()`, whose MPA/DDP/RDMAP frames travel in one TCP connection) and
//! ONC RPC over TCP alike, with no change to the clients: a well-behaved client becomes a
//! hostile one when its proxied connection stops relaying. Each direction of each connection
//! has a [`Mode`]:
//! - [`Mode::Relay`]: bytes are copied as they come.
//! - [`Mode::Stall`]: bytes are read and thrown away: the sender sees them leave, the
//!   receiver never sees them (a peer that never answers). Counted in
//!   [`DirStats::discarded`]. The stream cannot be resumed afterwards.
//! - [`Mode::StallOnReply`]: relay until the other direction carries a byte, then stall (a
//!   client that sends its call and then never answers the server's RDMA Read Requests: the
//!   server's first bytes after arming are the Read Request, and the client's Read Response
//!   is what gets thrown away).
//! - [`Mode::StallAfter`]: relay this many more bytes, then stall (half a message gets
//!   through, the rest never does).
//! - [`Mode::StopReading`]: the proxy stops reading from the sender, so TCP flow control
//!   pushes back on it once the socket buffers are full (a client that never reads its
//!   replies, seen from the server). Switching back to [`Mode::Relay`] resumes.
//!
//! [`ProxyConn::drop_connection`] closes both sides at once.
//!
//! What it does not do: parse what it relays, delay or reorder bytes, or listen anywhere but
//! where it is told (tests use loopback only).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

/// One direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server (calls; RDMA Read Responses of a client).
    ClientToServer,
    /// From the server to the client (replies; RDMA Read Requests and Writes of a server).
    ServerToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }
}

/// What one direction does with the bytes it gets (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Relay,
    Stall,
    StallOnReply,
    StallAfter(u64),
    StopReading,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct DirStats {
    /// Bytes copied to the receiver.
    pub relayed: AtomicU64,
    /// Bytes read and thrown away while stalled.
    pub discarded: AtomicU64,
}

struct ConnCtl {
    index: usize,
    client: SocketAddr,
    modes: [watch::Sender<Mode>; 2],
    stats: [DirStats; 2],
    cut: Notify,
    /// Set when both pumps have ended (either side closed, or the connection was dropped).
    ended: watch::Sender<bool>,
}

/// A handle on one proxied connection.
#[derive(Clone)]
pub struct ProxyConn {
    ctl: Arc<ConnCtl>,
}

impl std::fmt::Debug for ProxyConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConn")
            .field("index", &self.ctl.index)
            .field("client", &self.ctl.client)
            .field(
                "modes",
                &[
                    self.mode(Direction::ClientToServer),
                    self.mode(Direction::ServerToClient),
                ],
            )
            .finish()
    }
}

impl ProxyConn {
    /// Accept order, from 0.
    pub fn index(&self) -> usize {
        self.ctl.index
    }

    /// The client's address (as the proxy sees it).
    pub fn client(&self) -> SocketAddr {
        self.ctl.client
    }

    /// Set what `dir` does from now on.
    pub fn set(&self, dir: Direction, mode: Mode) {
        self.ctl.modes[dir.index()].send_replace(mode);
    }

    /// What `dir` does now.
    pub fn mode(&self, dir: Direction) -> Mode {
        *self.ctl.modes[dir.index()].borrow()
    }

    /// Stop relaying `dir`: read and discard ([`Mode::Stall`]).
    pub fn stall(&self, dir: Direction) {
        self.set(dir, Mode::Stall);
    }

    /// Stop reading from the side that sends `dir` ([`Mode::StopReading`]).
    pub fn stop_reading(&self, dir: Direction) {
        self.set(dir, Mode::StopReading);
    }

    /// Close both sides now.
    pub fn drop_connection(&self) {
        self.ctl.cut.notify_waiters();
        // A pump that is not waiting yet sees the permit on its next wait.
        self.ctl.cut.notify_one();
    }

    /// The counters of `dir`.
    pub fn stats(&self, dir: Direction) -> &DirStats {
        &self.ctl.stats[dir.index()]
    }

    /// True once both directions have stopped (a side closed or the connection was dropped).
    pub fn ended(&self) -> bool {
        *self.ctl.ended.borrow()
    }

    /// Wait up to `limit` for the connection to end; `true` if it did.
    pub async fn wait_ended(&self, limit: Duration) -> bool {
        let mut rx = self.ctl.ended.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|e| *e))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

struct Shared {
    upstream: SocketAddr,
    conns: Mutex<Vec<ProxyConn>>,
    accepted: watch::Sender<usize>,
    /// Modes a new connection starts with.
    initial: Mutex<[Mode; 2]>,
}

/// A running proxy; dropping it stops accepting (connections already relayed go on until a
/// side closes or [`ProxyConn::drop_connection`]).
pub struct FaultProxy {
    local: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local", &self.local)
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Listen on `listen` (use port 0) and relay every connection to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            conns: Mutex::new(Vec::new()),
            accepted: watch::channel(0).0,
            initial: Mutex::new([Mode::Relay; 2]),
        });
        let sh = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, peer)) = listener.accept().await else {
                    // EMFILE and the like: back off rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let sh = sh.clone();
                tokio::spawn(async move {
                    if let Err(e) = relay(client, peer, &sh).await {
                        tracing::debug!(%peer, error = %e, "proxy: upstream connect failed");
                    }
                });
            }
        });
        Ok(FaultProxy {
            local,
            shared,
            task,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The modes connections accepted from now on start with.
    pub fn set_initial(&self, client_to_server: Mode, server_to_client: Mode) {
        *self.shared.initial.lock() = [client_to_server, server_to_client];
    }

    /// Connections accepted so far, in accept order.
    pub fn connections(&self) -> Vec<ProxyConn> {
        self.shared.conns.lock().clone()
    }

    /// The `index`-th connection accepted, waiting up to `limit` for it.
    pub async fn connection(&self, index: usize, limit: Duration) -> Option<ProxyConn> {
        let mut rx = self.shared.accepted.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n > index))
            .await
            .ok()?
            .ok()?;
        self.shared.conns.lock().get(index).cloned()
    }
}

async fn relay(client: TcpStream, peer: SocketAddr, sh: &Shared) -> io::Result<()> {
    let server = TcpStream::connect(sh.upstream).await?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Registered before the pumps start, with the initial modes: a test that waits for the
    // connection sees it before any byte of it moved.
    let ctl = {
        let initial = *sh.initial.lock();
        let mut conns = sh.conns.lock();
        let ctl = Arc::new(ConnCtl {
            index: conns.len(),
            client: peer,
            modes: [watch::channel(initial[0]).0, watch::channel(initial[1]).0],
            stats: Default::default(),
            cut: Notify::new(),
            ended: watch::channel(false).0,
        });
        conns.push(ProxyConn { ctl: ctl.clone() });
        sh.accepted.send_replace(conns.len());
        ctl
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, ctl.clone(), Direction::ClientToServer);
    let down = pump(sr, cw, ctl.clone(), Direction::ServerToClient);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = ctl.cut.notified() => {}
    }
    // Both halves of both sockets are dropped here: the connection is closed on both sides.
    ctl.ended.send_replace(true);
    Ok(())
}

/// Copy one direction until its sender closes, honouring the direction's mode.
async fn pump(mut src: OwnedReadHalf, mut dst: OwnedWriteHalf, ctl: Arc<ConnCtl>, dir: Direction) {
    let me = dir.index();
    let other = 1 - me;
    let mut modes = ctl.modes[me].subscribe();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let mode = *modes.borrow_and_update();
        if mode == Mode::StopReading {
            if modes.changed().await.is_err() {
                return;
            }
            continue;
        }
        let n = tokio::select! {
            r = src.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            // A new mode applies to the next read (StopReading must stop reading at once).
            _ = modes.changed() => continue,
        };
        // Bytes in this direction: a peer armed to stall on a reply stalls now, before they
        // reach the receiver (so its answer to them is already thrown away).
        ctl.modes[other].send_if_modified(|m| {
            if *m == Mode::StallOnReply {
                *m = Mode::Stall;
                true
            } else {
                false
            }
        });
        // The mode may have changed while the read waited.
        let now = *modes.borrow_and_update();
        let pass = match now {
            Mode::Stall => 0,
            Mode::StallAfter(k) => n.min(usize::try_from(k).unwrap_or(usize::MAX)),
            _ => n,
        };
        if let Mode::StallAfter(k) = now {
            let left = k.saturating_sub(pass as u64);
            ctl.modes[me].send_replace(if left == 0 {
                Mode::Stall
            } else {
                Mode::StallAfter(left)
            });
            modes.mark_unchanged();
        }
        ctl.stats[me]
            .discarded
            .fetch_add((n - pass) as u64, Ordering::Relaxed);
        if pass == 0 {
            continue;
        }
        if dst.write_all(&buf[..pass]).await.is_err() {
            break;
        }
        ctl.stats[me]
            .relayed
            .fetch_add(pass as u64, Ordering::Relaxed);
    }
    let _ = dst.shutdown().await;
    // One side has gone: a direction that stopped reading reads again, to notice it (its
    // bytes then go to a socket that is closing, or are the last of a closed one).
    ctl.modes[other].send_if_modified(|m| {
        if *m == Mode::StopReading {
            *m = Mode::Relay;
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(20);

    /// An upstream that echoes what it reads.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        a
    }

    async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        tokio::time::timeout(LIMIT, s.read_exact(&mut v))
            .await
            .expect("bytes within the limit")
            .unwrap();
        v
    }

    #[tokio::test]
    async fn relays_then_stalls_then_drops() {
        let p = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo_server().await)
            .await
            .unwrap();
        let mut c = TcpStream::connect(p.local_addr()).await.unwrap();
        let pc = p.connection(0, LIMIT).await.expect("accepted");
        c.write_all(b"hello").await.unwrap();
        assert_eq!(read_n(&mut c, 5).await, b"hello");
        // Stalled towards the server: what the client sends is thrown away.
        pc.stall(Direction::ClientToServer);
        c.write_all(b"lost").await.unwrap();
        let stats = pc.stats(Direction::ClientToServer);
        for _ in 0..2000 {
            if stats.discarded.load(Ordering::Relaxed) == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(stats.discarded.load(Ordering::Relaxed), 4);
        assert_eq!(
            pc.stats(Direction::ServerToClient)
                .relayed
                .load(Ordering::Relaxed),
            5
        );
        pc.drop_connection();
        assert!(pc.wait_ended(LIMIT).await);
        let mut rest = Vec::new();
        let n = tokio::time::timeout(LIMIT, c.read_to_end(&mut rest))
            .await
            .unwrap();
        assert!(
            matches!(n, Ok(0) | Err(_)),
            "the client sees the connection close"
        );
    }

    #[tokio::test]
    async fn stall_on_reply_throws_away_the_answer_to_the_first_reply() {
        let p = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo_server().await)
            .await
            .unwrap();
        p.set_initial(Mode::StallOnReply, Mode::Relay);
        let mut c = TcpStream::connect(p.local_addr()).await.unwrap();
        let pc = p.connection(0, LIMIT).await.expect("accepted");
        // The call gets through; the echo is the "reply"; what follows it is stalled.
        c.write_all(b"call").await.unwrap();
        assert_eq!(read_n(&mut c, 4).await, b"call");
        assert_eq!(pc.mode(Direction::ClientToServer), Mode::Stall);
        c.write_all(b"answer").await.unwrap();
        let stats = pc.stats(Direction::ClientToServer);
        for _ in 0..2000 {
            if stats.discarded.load(Ordering::Relaxed) == 6 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(stats.discarded.load(Ordering::Relaxed), 6);
        assert_eq!(stats.relayed.load(Ordering::Relaxed), 4);
    }

    #[tokio::test]
    async fn stop_reading_pushes_back_and_relay_resumes() {
        let p = FaultProxy::start("127.0.0.1:0".parse().unwrap(), echo_server().await)
            .await
            .unwrap();
        let mut c = TcpStream::connect(p.local_addr()).await.unwrap();
        let pc = p.connection(0, LIMIT).await.expect("accepted");
        pc.stop_reading(Direction::ClientToServer);
        // Nothing is read from the client: writes stop once the socket buffers are full
        // (bounded: at most 64 MiB offered).
        let chunk = vec![1u8; 64 << 10];
        let mut written = 0usize;
        while written < 64 << 20 {
            match tokio::time::timeout(Duration::from_millis(500), c.write_all(&chunk)).await {
                Ok(r) => {
                    r.unwrap();
                    written += chunk.len();
                }
                Err(_) => break,
            }
        }
        assert!(written < 64 << 20, "the client was pushed back");
        assert_eq!(
            pc.stats(Direction::ClientToServer)
                .relayed
                .load(Ordering::Relaxed),
            0
        );
        pc.set(Direction::ClientToServer, Mode::Relay);
        // Everything written comes back once the proxy reads again (a partial write that
        // timed out may have sent part of a chunk: read what was sent for certain).
        let back = read_n(&mut c, written).await;
        assert!(back.iter().all(|&b| b == 1));
    }
}
