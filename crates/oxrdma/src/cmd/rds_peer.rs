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
//! The jobs and the payload format (the interop lab's `guest/rds-peer.py`) are in
//! `tools::rds::peer`; this module parses the arguments and prints.
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

use clap::{Args, Subcommand};
use rds::{RdsStack, StackConfig};
use tools::rds::peer::{self as job, SendPacing};

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
            Some(tokio::spawn(job::echo_forever(sock)))
        }
        None => None,
    };
    let hold = a.hold_until.clone();
    let hold_timeout = secs(a.hold_timeout, "--hold-timeout")?;
    let r = async {
        connect(&stack, &a).await?;
        match a.mode {
            PeerMode::Echo { port, count } => {
                let sock = stack.bind(port)?;
                say(&format!("echo bound {}:{port}", stack.local()));
                let done = job::echo(&sock, count, wait_for_signal()).await?;
                say(&format!("OK echo {done} datagrams"));
            }
            PeerMode::Ping {
                port,
                to,
                count,
                size,
                timeout,
            } => {
                let timeout = secs(timeout, "--timeout")?;
                let p = job::ping(&stack, a.remote, (port, to), (count, size), timeout).await?;
                say(&format!(
                    "OK ping {} count={} {:.0} msg/s avg rtt {:.0} us",
                    p.size, p.count, p.msg_per_s, p.avg_rtt_us
                ));
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
                let pacing = SendPacing {
                    interval: secs(interval, "--interval")?,
                    timeout: secs(timeout, "--timeout")?,
                    linger: secs(linger, "--linger")?,
                };
                let s = job::send(&stack, a.remote, (port, to), (count, size), pacing).await?;
                say(&format!(
                    "OK send {} count={} {:.0} msg/s {:.2} MB/s congested_waits={} \
                     sndbuf_waits={}",
                    s.size, s.count, s.msg_per_s, s.mb_per_s, s.congested_waits, s.sndbuf_waits
                ));
            }
            PeerMode::Recv {
                port,
                count,
                size,
                delay,
                timeout,
                rcvbuf,
            } => {
                let delay = secs(delay, "--delay")?;
                let timeout = secs(timeout, "--timeout")?;
                let sock = stack.bind(port)?;
                if let Some(b) = rcvbuf {
                    sock.set_rcvbuf(b);
                }
                say(&format!(
                    "recv bound {}:{port}, reading after {:.1} s",
                    stack.local(),
                    delay.as_secs_f64()
                ));
                let r = job::recv(&sock, (count, size), delay, timeout).await?;
                say(&format!(
                    "OK recv {} count={} in order, {:.0} msg/s {:.2} MB/s",
                    r.size, r.count, r.msg_per_s, r.mb_per_s
                ));
            }
        }
        Ok::<(), BoxError>(())
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
    job::drain(&stack, a.remote, Duration::from_secs(10)).await;
    stack.shutdown();
    if let Err(e) = &r {
        say(&format!("FAIL {e}"));
    }
    r
}

/// Pings the remote node's port 0 until it answers (`CONNECTED …`).
async fn connect(stack: &RdsStack, a: &PeerArgs) -> Result<(), BoxError> {
    let limit = secs(a.connect_timeout, "--connect-timeout")?;
    let c = job::connect(stack, a.remote, a.connect, limit).await?;
    say(&format!(
        "CONNECTED {} -> {} via {} (first pong after {:.1} s, rtt {} us)",
        a.local,
        a.remote,
        a.connect,
        c.after.as_secs_f64(),
        c.rtt.as_micros()
    ));
    Ok(())
}
