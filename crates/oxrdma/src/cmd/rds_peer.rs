//! `oxrdma rds peer`: one RDS/TCP node that talks to one remote node through an explicit TCP
//! address, for interop with a kernel `rds_tcp` peer behind NAT or a port forward (a QEMU guest
//! reached through `127.0.0.1:HOSTPORT`, which sees us as `10.0.2.2`).
//!
//! Every mode first proves the connection: it pings the remote node's port 0 until a pong
//! comes back (`CONNECTED …`). Then it runs one job and prints `OK …` or `FAIL …`:
//! - `echo`: send every datagram back to its sender;
//! - `ping`: send numbered datagrams, wait for each echo and check it;
//! - `send`: blocking sends that respect the remote node's congestion map;
//! - `recv`: receive numbered datagrams and check they arrive complete and in order.
//!
//! The payload of datagram SEQ (0-based) of SIZE ≥ 8 bytes is SEQ as 8 big-endian bytes, then
//! byte i = (SEQ + i) & 0xff, the format of the interop lab's `guest/rds-peer.py`.
//!
//! `--echo PORT` also echoes on PORT for as long as the node runs, and `--hold-until PATH`
//! keeps the node up after the mode until PATH exists, so one process can serve a remote
//! node's pings while it runs its own job.
//!
//! One process is one RDS node. Linux keeps one TCP connection per peer address and path
//! (`rds_tcp_accept_one` shuts down a second one while the first is up), so two of these
//! processes that the remote node sees under the same address must not run at once: the later
//! one is refused until the earlier one exits. Starting a new process is a node restart.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Subcommand};
use rds::{RdsSocket, RdsStack, StackConfig};

use super::{CmdResult, wait_for_signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Args)]
pub struct PeerArgs {
    /// TCP address that reaches the remote node's RDS/TCP port (e.g. a port forwarded into a
    /// QEMU guest's 16385).
    #[arg(long, value_name = "IP:PORT")]
    connect: SocketAddrV4,
    /// Our RDS address as the remote node sees it (10.0.2.2 for a QEMU user-network guest). It
    /// must be lower than --remote: like Linux, the lower address connects.
    #[arg(long)]
    local: Ipv4Addr,
    /// The remote node's RDS address.
    #[arg(long)]
    remote: Ipv4Addr,
    /// Local IP our sockets bind to (default: the source address the kernel routes from
    /// towards the --connect IP).
    #[arg(long)]
    bind: Option<Ipv4Addr>,
    /// TCP port we listen on (0: any free port; we dial, so nobody needs it).
    #[arg(long, default_value_t = 0)]
    listen_port: u16,
    /// Seconds to wait for the first pong from the remote node.
    #[arg(long, default_value_t = 60.0)]
    connect_timeout: f64,
    /// Also echo every datagram that arrives on this RDS port, for as long as the node runs.
    /// The remote node sees one connection per address, so a second process cannot serve it.
    #[arg(long, value_name = "PORT")]
    echo: Option<u16>,
    /// After the mode has finished (and printed OK), keep the node up until this file exists.
    #[arg(long, value_name = "PATH")]
    hold_until: Option<std::path::PathBuf>,
    /// Seconds --hold-until waits at most.
    #[arg(long, default_value_t = 300.0)]
    hold_timeout: f64,
    #[command(subcommand)]
    mode: PeerMode,
}

#[derive(Debug, Subcommand)]
pub enum PeerMode {
    /// Send every datagram on --port back to its sender (until --count, or Ctrl-C/SIGTERM).
    Echo {
        /// RDS port to bind.
        #[arg(long)]
        port: u16,
        /// Stop after this many datagrams (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Send --count numbered datagrams to --to, wait for each echo and check it.
    Ping {
        /// RDS port to bind.
        #[arg(long)]
        port: u16,
        /// The remote node's echo port.
        #[arg(long)]
        to: u16,
        #[arg(long, default_value_t = 10)]
        count: u64,
        /// Datagram size, bytes (≤ 1 MiB).
        #[arg(long, default_value_t = 256)]
        size: usize,
        /// Seconds to wait for each echo.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
    /// Send --count numbered datagrams to --to with blocking sends (waiting while the remote
    /// port is congested), then keep the node up until TCP has delivered them.
    Send {
        /// RDS port to bind.
        #[arg(long)]
        port: u16,
        /// The remote node's receiving port.
        #[arg(long)]
        to: u16,
        #[arg(long, default_value_t = 100)]
        count: u64,
        /// Datagram size, bytes (≤ 1 MiB).
        #[arg(long, default_value_t = 8192)]
        size: usize,
        /// Seconds each send may wait for congestion to clear.
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
        /// Seconds to pause after each send returns (0: as fast as the send buffer and the
        /// remote congestion map allow). A remote node announces congestion in a map update
        /// that trails the data by a round trip and a work-queue run, so a paced sender sees it
        /// where a burst can be done before it arrives.
        #[arg(long, default_value_t = 0.0)]
        interval: f64,
        /// Seconds to stay up after the last send. A blocking RDS send returns once the message
        /// is queued, and a closing node drops what is still queued.
        #[arg(long, default_value_t = 5.0)]
        linger: f64,
    },
    /// Receive --count numbered datagrams of --size on --port and check their order.
    Recv {
        /// RDS port to bind.
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 100)]
        count: u64,
        #[arg(long, default_value_t = 8192)]
        size: usize,
        /// Seconds to wait before reading (lets the sender run into congestion).
        #[arg(long, default_value_t = 0.0)]
        delay: f64,
        /// Seconds to wait for each datagram.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// Receive buffer of the port, bytes (the port is congested while more is queued).
        #[arg(long)]
        rcvbuf: Option<usize>,
    },
}

/// The payload of datagram `seq` (the format of the interop lab's `guest/rds-peer.py`).
pub fn payload(seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size)
        .map(|i| (seq.wrapping_add(i as u64) & 0xff) as u8)
        .collect();
    if size >= 8 {
        v[..8].copy_from_slice(&seq.to_be_bytes());
    }
    v
}

/// Checks a datagram against [`payload`]: its sequence number, or what is wrong with it.
pub fn check(data: &[u8], size: usize) -> Result<Option<u64>, String> {
    if data.len() != size {
        return Err(format!("length {} != {size}", data.len()));
    }
    if size < 8 {
        return Ok(None);
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[..8]);
    let seq = u64::from_be_bytes(b);
    if data == payload(seq, size).as_slice() {
        Ok(Some(seq))
    } else {
        Err(format!("payload mismatch (seq {seq})"))
    }
}

fn secs(s: f64, what: &str) -> Result<Duration, BoxError> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("{what} must be a non-negative number of seconds").into())
    }
}

/// The source address the kernel picks for `dest` (no packet is sent).
fn route_source(dest: Ipv4Addr) -> Result<Ipv4Addr, BoxError> {
    let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.connect((dest, 9))?;
    match s.local_addr()? {
        std::net::SocketAddr::V4(a) => Ok(*a.ip()),
        std::net::SocketAddr::V6(_) => Err(format!("no IPv4 route to {dest}").into()),
    }
}

fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Run `rds peer`: exit status 0 on OK, an error (status 1) on FAIL.
pub async fn run(a: PeerArgs) -> CmdResult {
    if a.local >= a.remote {
        return Err(format!(
            "--local {} must be lower than --remote {}: the lower address connects (Linux drops \
             connections the higher address opens)",
            a.local, a.remote
        )
        .into());
    }
    let bind = match a.bind {
        Some(b) => b,
        None => route_source(*a.connect.ip())?,
    };
    let mut cfg = StackConfig::new(a.local);
    cfg.bind_ip = Some(bind);
    cfg.tcp_port = a.listen_port;
    cfg.peer_addrs.insert(a.remote, a.connect);
    let stack = RdsStack::start(cfg)
        .await
        .map_err(|e| format!("cannot start RDS on {bind}: {e}"))?;
    let side_echo = match a.echo {
        Some(port) => {
            let sock = stack.bind(port)?;
            say(&format!("echo bound {}:{port}", stack.local()));
            Some(tokio::spawn(async move {
                while let Ok((data, src)) = sock.recv_from().await {
                    if sock.send_to(src, data).await.is_err() {
                        break;
                    }
                }
            }))
        }
        None => None,
    };
    let hold = a.hold_until.clone();
    let hold_timeout = secs(a.hold_timeout, "--hold-timeout")?;
    let r = async {
        connect(&stack, &a).await?;
        match a.mode {
            PeerMode::Echo { port, count } => echo(&stack, port, count).await,
            PeerMode::Ping {
                port,
                to,
                count,
                size,
                timeout,
            } => {
                ping(
                    &stack,
                    a.remote,
                    port,
                    to,
                    count,
                    size,
                    secs(timeout, "--timeout")?,
                )
                .await
            }
            PeerMode::Send {
                port,
                to,
                count,
                size,
                timeout,
                interval,
                linger,
            } => {
                send(
                    &stack,
                    a.remote,
                    (port, to),
                    (count, size),
                    secs(interval, "--interval")?,
                    secs(timeout, "--timeout")?,
                    secs(linger, "--linger")?,
                )
                .await
            }
            PeerMode::Recv {
                port,
                count,
                size,
                delay,
                timeout,
                rcvbuf,
            } => {
                recv(
                    &stack,
                    port,
                    (count, size),
                    secs(delay, "--delay")?,
                    secs(timeout, "--timeout")?,
                    rcvbuf,
                )
                .await
            }
        }
    }
    .await;
    if let (Ok(()), Some(path)) = (&r, hold) {
        let t0 = Instant::now();
        while !path.exists() && t0.elapsed() < hold_timeout {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if path.exists() {
            say(&format!("held until {}", path.display()));
        } else {
            say(&format!(
                "held {:.0} s; {} never appeared",
                hold_timeout.as_secs_f64(),
                path.display()
            ));
        }
    }
    if let Some(t) = side_echo {
        t.abort();
    }
    // A send returns once the message is queued, and shutting the node down drops what is
    // still queued (as closing a Linux RDS socket does): let the last echo reach the remote
    // node first (bounded).
    let t0 = Instant::now();
    while !stack.idle_to(a.remote) && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stack.shutdown();
    if let Err(e) = &r {
        say(&format!("FAIL {e}"));
    }
    r
}

/// Pings the remote node's port 0 until it answers: the connection is up and the remote node
/// has taken it (it may refuse a connection while it still tears down an earlier one).
async fn connect(stack: &RdsStack, a: &PeerArgs) -> Result<(), BoxError> {
    let t0 = Instant::now();
    let limit = secs(a.connect_timeout, "--connect-timeout")?;
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        let each = left.min(Duration::from_secs(5));
        if each.is_zero() {
            return Err(format!(
                "no pong from {} via {} within {:.0} s",
                a.remote,
                a.connect,
                limit.as_secs_f64()
            )
            .into());
        }
        let r = rds::tools::ping(stack, a.remote, 1, Duration::ZERO, each).await?;
        if let Some(rtt) = r.rtts.first().copied().flatten() {
            say(&format!(
                "CONNECTED {} -> {} via {} (first pong after {:.1} s, rtt {} us)",
                a.local,
                a.remote,
                a.connect,
                t0.elapsed().as_secs_f64(),
                rtt.as_micros()
            ));
            return Ok(());
        }
    }
}

async fn echo(stack: &RdsStack, port: u16, count: u64) -> Result<(), BoxError> {
    let sock = stack.bind(port)?;
    say(&format!("echo bound {}:{port}", stack.local()));
    let mut done = 0u64;
    let run = async {
        while count == 0 || done < count {
            let (data, src) = sock.recv_from().await?;
            sock.send_to(src, data).await?;
            done += 1;
        }
        Ok::<_, BoxError>(())
    };
    tokio::select! {
        r = run => r?,
        _ = wait_for_signal() => {}
    }
    say(&format!("OK echo {done} datagrams"));
    Ok(())
}

async fn ping(
    stack: &RdsStack,
    remote: Ipv4Addr,
    port: u16,
    to: u16,
    count: u64,
    size: usize,
    timeout: Duration,
) -> Result<(), BoxError> {
    if size > rds::wire::MAX_MSG_LEN {
        return Err(format!("--size is at most {} bytes", rds::wire::MAX_MSG_LEN).into());
    }
    let sock = stack.bind(port)?;
    let dest = SocketAddrV4::new(remote, to);
    let t0 = Instant::now();
    let mut rtt_sum = Duration::ZERO;
    for seq in 0..count {
        let t = Instant::now();
        send_within(&sock, dest, Bytes::from(payload(seq, size)), timeout).await?;
        let echo = wait_from(&sock, dest, timeout.saturating_sub(t.elapsed()))
            .await?
            .ok_or_else(|| format!("ping {size}: no echo for #{seq} within {timeout:?}"))?;
        match check(&echo, size) {
            Ok(Some(s)) if s != seq => {
                return Err(format!("ping {size}: echo #{seq} carries seq {s}").into());
            }
            Ok(_) => {}
            Err(why) => return Err(format!("ping {size}: echo #{seq}: {why}").into()),
        }
        rtt_sum += t.elapsed();
    }
    let dt = t0.elapsed().as_secs_f64().max(1e-6);
    say(&format!(
        "OK ping {size} count={count} {:.0} msg/s avg rtt {:.0} us",
        count as f64 / dt,
        rtt_sum.as_secs_f64() * 1e6 / count.max(1) as f64
    ));
    Ok(())
}

/// The next datagram from `from`, skipping any other (late echoes of an earlier node).
async fn wait_from(
    sock: &RdsSocket,
    from: SocketAddrV4,
    timeout: Duration,
) -> Result<Option<Bytes>, BoxError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match sock.recv_timeout(left).await? {
            Some((data, src)) if src == from => return Ok(Some(data)),
            Some(_) => continue,
            None => return Ok(None),
        }
    }
}

async fn send_within(
    sock: &RdsSocket,
    dest: SocketAddrV4,
    data: Bytes,
    timeout: Duration,
) -> Result<(), BoxError> {
    tokio::time::timeout(timeout, sock.send_to(dest, data))
        .await
        .map_err(|_| format!("send to {dest} blocked for {timeout:?}"))??;
    Ok(())
}

async fn send(
    stack: &RdsStack,
    remote: Ipv4Addr,
    (port, to): (u16, u16),
    (count, size): (u64, usize),
    interval: Duration,
    timeout: Duration,
    linger: Duration,
) -> Result<(), BoxError> {
    if size > rds::wire::MAX_MSG_LEN {
        return Err(format!("--size is at most {} bytes", rds::wire::MAX_MSG_LEN).into());
    }
    let sock = stack.bind(port)?;
    let dest = SocketAddrV4::new(remote, to);
    let t0 = Instant::now();
    // How many datagrams the remote node's congestion map held back (a non-blocking Linux
    // send gets ENOBUFS for them), and how many waited for our own send buffer.
    let (mut congested, mut buffer_full) = (0u64, 0u64);
    for seq in 0..count {
        if seq > 0 && !interval.is_zero() {
            // A pause after each send, not a schedule from the start: a send that congestion
            // held back is not followed by a burst that catches up.
            tokio::time::sleep(interval).await;
        }
        let data = Bytes::from(payload(seq, size));
        let w = tokio::time::timeout(timeout, sock.send_to_counted(dest, data))
            .await
            .map_err(|_| format!("send to {dest} blocked for {timeout:?}"))??;
        congested += u64::from(w.congested > 0);
        buffer_full += u64::from(w.buffer_full > 0);
    }
    let dt = t0.elapsed().as_secs_f64().max(1e-6);
    // Keep the node up until TCP has taken everything off our hands, then a while longer.
    let deadline = Instant::now() + timeout;
    while !stack.idle_to(remote) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle = stack.idle_to(remote);
    tokio::time::sleep(linger).await;
    if !idle {
        return Err(
            format!("send {size}: TCP had not delivered everything after {timeout:?}").into(),
        );
    }
    say(&format!(
        "OK send {size} count={count} {:.0} msg/s {:.2} MB/s congested_waits={congested} \
         sndbuf_waits={buffer_full}",
        count as f64 / dt,
        (count as f64 * size as f64) / dt / 1e6
    ));
    Ok(())
}

async fn recv(
    stack: &RdsStack,
    port: u16,
    (count, size): (u64, usize),
    delay: Duration,
    timeout: Duration,
    rcvbuf: Option<usize>,
) -> Result<(), BoxError> {
    let sock = stack.bind(port)?;
    if let Some(b) = rcvbuf {
        sock.set_rcvbuf(b);
    }
    say(&format!(
        "recv bound {}:{port}, reading after {:.1} s",
        stack.local(),
        delay.as_secs_f64()
    ));
    tokio::time::sleep(delay).await;
    let mut t0 = None;
    for i in 0..count {
        let Some((data, _)) = sock.recv_timeout(timeout).await? else {
            return Err(format!("recv: got {i} of {count} datagrams").into());
        };
        t0.get_or_insert_with(Instant::now);
        match check(&data, size) {
            Ok(Some(s)) if s != i => {
                return Err(format!("recv #{i}: seq {s} out of order").into());
            }
            Ok(_) => {}
            Err(why) => return Err(format!("recv #{i}: {why}").into()),
        }
    }
    let dt = t0.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-6);
    say(&format!(
        "OK recv {size} count={count} in order, {:.0} msg/s {:.2} MB/s",
        count as f64 / dt,
        (count as f64 * size as f64) / dt / 1e6
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_the_lab_format() {
        // guest/rds-peer.py: struct.pack("!Q", seq) + bytes((seq + i) & 0xff for i in 8..size)
        let p = payload(0x0102, 12);
        assert_eq!(p, [0, 0, 0, 0, 0, 0, 1, 2, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(payload(3, 4), [3, 4, 5, 6]);
        assert_eq!(check(&p, 12), Ok(Some(0x0102)));
        assert_eq!(check(&p, 11), Err("length 12 != 11".to_string()));
        let mut bad = p.clone();
        bad[11] ^= 1;
        assert!(check(&bad, 12).is_err());
        assert_eq!(check(&payload(9, 3), 3), Ok(None));
    }
}
