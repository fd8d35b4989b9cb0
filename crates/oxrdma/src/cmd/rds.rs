//! `oxrdma rds …`: rds-tools style commands on the `rds` crate.
//!
//! - `rds ping ADDR` — rds-ping: zero-length pings to port 0, one RTT line per pong, a summary.
//! - `rds stress` — rds-stress: request/ack load with rds-stress's columns; `--self` runs both
//!   ends in this process (127.0.0.1 ↔ 127.0.0.2); `--baseline` adds a raw-TCP row.
//! - `rds listen ADDR` — a long-running node that echoes (or just counts) datagrams; prints
//!   `rds info` on SIGUSR1 and every `--info-every SECS`.
//! - `rds peer` — one node talking to one remote node through an explicit TCP address, for
//!   interop with a kernel rds_tcp behind a port forward (see `rds_peer.rs`).
//! - `rds info` — RDS state is per process, so this runs a short in-process exchange (a few
//!   datagrams 127.0.0.1 → 127.0.0.2 and back) and prints both nodes' connections, paths,
//!   sequence numbers and congestion. For a live node use `rds listen --info-every`.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use rds::engine::EngineInfo;
use rds::{RdsStack, StackConfig};
use tools::rds::{PingReport, StressParams, StressResult};

use super::{CmdResult, wait_for_signal};

/// The RDS/TCP port (IANA 16385).
const RDS_TCP_PORT: u16 = 16385;
/// First RDS port of the stress responders (task i uses base + i).
const STRESS_PORT: u16 = 4000;
/// RDS port `rds listen` binds by default.
const LISTEN_PORT: u16 = 4000;

#[derive(Debug, Subcommand)]
pub enum RdsCommand {
    /// Ping an RDS node (rds-ping): zero-length messages to its port 0.
    Ping(PingArgs),
    /// Request/ack load test (rds-stress columns).
    Stress(StressArgs),
    /// Run a node that echoes datagrams until Ctrl-C (for interop with the kernel's RDS).
    Listen(ListenArgs),
    /// Connections, paths, sequence numbers and congestion after a short in-process exchange.
    Info(InfoArgs),
    /// One RDS/TCP node talking to one remote node through an explicit TCP address (interop
    /// with a kernel rds_tcp behind a port forward): echo, ping, send or receive.
    Peer(super::rds_peer::PeerArgs),
}

/// The transport RDS runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// RDS over TCP (port 16385).
    Tcp,
    /// RDS over RDMA (soft-iWARP; RDS/IB CM port 18634).
    Rdma,
}

impl TransportArg {
    fn name(self) -> &'static str {
        match self {
            TransportArg::Tcp => "tcp",
            TransportArg::Rdma => "rdma",
        }
    }
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Transport.
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp)]
    transport: TransportArg,
    /// Transport port RDS listens on and dials (default 16385 for tcp, 18634 for rdma).
    #[arg(long, value_name = "PORT")]
    tport: Option<u16>,
    /// Peers to keep connection state for; past it, new peers are refused.
    #[arg(long, value_name = "N", default_value_t = rds::engine::DEFAULT_MAX_PEERS)]
    max_peers: usize,
}

impl CommonArgs {
    /// The transport port in use.
    fn port(&self) -> u16 {
        self.tport.unwrap_or(match self.transport {
            TransportArg::Tcp => RDS_TCP_PORT,
            TransportArg::Rdma => rds::rdma::RDS_IB_PORT,
        })
    }
}

#[derive(Debug, Args)]
pub struct PingArgs {
    /// Node to ping.
    addr: Ipv4Addr,
    /// Number of pings.
    #[arg(short = 'c', long, default_value_t = 4)]
    count: u32,
    /// Seconds between pings.
    #[arg(short = 'i', long, default_value_t = 1.0)]
    interval: f64,
    /// Local node address (default: the source address the kernel would route from).
    #[arg(short = 'I', long)]
    local: Option<Ipv4Addr>,
    /// Seconds to wait for each pong.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct StressArgs {
    /// Run the responders only (on --local), until Ctrl-C.
    #[arg(long, conflicts_with_all = ["connect", "in_process"])]
    server: bool,
    /// Run the client against the responders of this node.
    #[arg(long, value_name = "ADDR", conflicts_with = "in_process")]
    connect: Option<Ipv4Addr>,
    /// Run both ends in this process: client 127.0.0.1, responders 127.0.0.2.
    #[arg(long = "self")]
    in_process: bool,
    /// Local node address (server: default 0.0.0.0 is not allowed, give one; client: routed).
    #[arg(short = 'r', long)]
    local: Option<Ipv4Addr>,
    /// First RDS port of the responders (task i uses PORT + i).
    #[arg(short = 'p', long, default_value_t = STRESS_PORT)]
    port: u16,
    /// Request size, bytes.
    #[arg(short = 'q', long, default_value_t = 1024)]
    req: usize,
    /// Ack (response) size, bytes.
    #[arg(short = 'a', long, default_value_t = 256)]
    ack: usize,
    /// Requests in flight per task.
    #[arg(short = 'd', long, default_value_t = 1)]
    depth: usize,
    /// Tasks (sockets), each on its own responder port.
    #[arg(short = 't', long, default_value_t = 1)]
    tasks: usize,
    /// Run time, seconds.
    #[arg(short = 'T', long, default_value_t = 5.0)]
    time: f64,
    /// Also measure a raw-TCP request/response with the same sizes, depth and tasks.
    #[arg(long)]
    baseline: bool,
    /// RDMA bytes per request (rds-stress -D): each request advertises a fresh buffer and the
    /// responder RDMA-writes this many bytes into it before acking; reported as mbi (and mbo
    /// with --self). Needs --transport rdma.
    #[arg(short = 'D', long = "rdma-size", default_value_t = 0)]
    rdma_size: usize,
    /// After the run, print per request what each node's RDS paths and RDMA driver did
    /// (messages, ack-only messages, Sends, credit updates, driver runs).
    #[arg(long)]
    counters: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct ListenArgs {
    /// Local node address.
    addr: Ipv4Addr,
    /// RDS port to bind.
    #[arg(short = 'p', long, default_value_t = LISTEN_PORT)]
    port: u16,
    /// Only count and print datagrams, do not echo them back.
    #[arg(long)]
    no_echo: bool,
    /// Print `rds info` every SECS seconds (SIGUSR1 prints it at any time).
    #[arg(long, value_name = "SECS")]
    info_every: Option<f64>,
    /// Print one line per datagram received.
    #[arg(long)]
    print: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Local node address of the first node (the second is the next address up).
    #[arg(long, default_value_t = Ipv4Addr::new(127, 0, 0, 1))]
    local: Ipv4Addr,
    /// Datagrams exchanged each way before the snapshot.
    #[arg(short = 'n', long, default_value_t = 16)]
    count: u32,
    #[command(flatten)]
    common: CommonArgs,
}

/// Run an `rds` command.
pub async fn run(cmd: RdsCommand) -> CmdResult {
    match cmd {
        RdsCommand::Ping(a) => ping(a).await,
        RdsCommand::Stress(a) => stress(a).await,
        RdsCommand::Listen(a) => listen(a).await,
        RdsCommand::Info(a) => info(a).await,
        RdsCommand::Peer(a) => super::rds_peer::run(a).await,
    }
}

/// The source address the kernel picks for `dest` (no packet is sent); a different loopback
/// address when `dest` is the one it would pick.
fn routed_local(dest: Ipv4Addr) -> Result<Ipv4Addr, Box<dyn std::error::Error + Send + Sync>> {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.connect((dest, 9))?;
    let std::net::SocketAddr::V4(a) = s.local_addr()? else {
        return Err("no IPv4 route".into());
    };
    let ip = *a.ip();
    if ip == dest {
        let o = dest.octets();
        if o[0] == 127 {
            return Ok(Ipv4Addr::new(127, o[1], o[2], o[3].wrapping_add(1).max(1)));
        }
        return Err(format!("{dest} is a local address: give --local another one").into());
    }
    Ok(ip)
}

async fn start_stack(
    local: Ipv4Addr,
    c: &CommonArgs,
) -> Result<RdsStack, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = StackConfig::new(local);
    cfg.max_peers = c.max_peers;
    match c.transport {
        TransportArg::Tcp => cfg.tcp_port = c.tport.unwrap_or(RDS_TCP_PORT),
        TransportArg::Rdma => {
            cfg.transport = rds::Transport::Rdma(rds::RdmaConfig {
                port: c.tport.unwrap_or(rds::rdma::RDS_IB_PORT),
                ..rds::RdmaConfig::default()
            });
        }
    }
    let port = c.port();
    RdsStack::start(cfg)
        .await
        .map_err(|e| format!("cannot start RDS on {local}:{port}: {e}").into())
}

fn secs(s: f64, what: &str) -> Result<Duration, Box<dyn std::error::Error + Send + Sync>> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("{what} must be a non-negative number of seconds").into())
    }
}

async fn ping(a: PingArgs) -> CmdResult {
    let local = match a.local {
        Some(l) => l,
        None => routed_local(a.addr)?,
    };
    let stack = start_stack(local, &a.common).await?;
    let interval = secs(a.interval, "-i")?;
    let timeout = secs(a.timeout, "--timeout")?;
    println!("RDS PING {} from {local}: {} pings", a.addr, a.count);
    std::io::stdout().flush()?;
    // One ping at a time so that the lines appear as the pongs come.
    let mut rtts = Vec::new();
    for i in 0..a.count {
        if i > 0 {
            tokio::time::sleep(interval).await;
        }
        let r = tools::rds::ping(&stack, a.addr, 1, Duration::ZERO, timeout).await?;
        let rtt = r.rtts.first().copied().flatten();
        match rtt {
            Some(d) => println!("{:>4}: {} usec", i + 1, d.as_micros()),
            None => println!("{:>4}: timed out", i + 1),
        }
        std::io::stdout().flush()?;
        rtts.push(rtt);
    }
    let report = PingReport {
        dest: a.addr,
        sent: a.count,
        received: rtts.iter().flatten().count() as u32,
        rtts,
    };
    println!("--- {} rds ping statistics ---", a.addr);
    print!(
        "{} pings sent, {} received, {:.0}% loss",
        a.count,
        report.received,
        report.loss_percent()
    );
    match report.rtt_min_avg_max_us() {
        None => println!(),
        Some((min, avg, max)) => println!(", rtt min/avg/max = {min:.0}/{avg:.0}/{max:.0} usec"),
    }
    stack.shutdown();
    if report.received == 0 && a.count > 0 {
        return Err(format!("no pong from {}", a.addr).into());
    }
    Ok(())
}

fn header() {
    println!(
        "{:>6} {:>4} {:>10} {:>10} {:>12} {:>9} {:>9} {:>9}",
        "", "tsks", "tx/s", "rx/s", "tx+rx K/s", "mbi K/s", "mbo K/s", "rtt us"
    );
}

fn row(name: &str, r: &StressResult) {
    println!(
        "{name:>6} {:>4} {:>10.0} {:>10.0} {:>12.0} {:>9.0} {:>9.0} {:>9.1}",
        r.tasks,
        r.tx_per_s,
        r.rx_per_s,
        r.tx_rx_kib_per_s,
        r.mbi_kib_per_s,
        r.mbo_kib_per_s,
        r.rtt_us
    );
}

async fn stress(a: StressArgs) -> CmdResult {
    if a.req > rds::wire::MAX_MSG_LEN || a.ack > rds::wire::MAX_MSG_LEN {
        return Err(format!("-q and -a are at most {} bytes", rds::wire::MAX_MSG_LEN).into());
    }
    if a.tasks == 0 || a.tasks > 1024 {
        return Err("-t must be 1..=1024".into());
    }
    if a.rdma_size > 0 && matches!(a.common.transport, TransportArg::Tcp) {
        return Err("-D needs --transport rdma: RDS over TCP has no RDMA operations".into());
    }
    if a.rdma_size > 0 && a.req < 8 {
        return Err("-D needs -q of at least 8: a request carries its buffer's address".into());
    }
    if a.rdma_size > rds::wire::MAX_MSG_LEN {
        return Err(format!("-D is at most {} bytes", rds::wire::MAX_MSG_LEN).into());
    }
    let p = StressParams {
        req_size: a.req,
        ack_size: a.ack,
        depth: a.depth.max(1),
        tasks: a.tasks,
        duration: secs(a.time, "-T")?,
        rdma_size: a.rdma_size,
    };
    let name = match a.common.transport {
        TransportArg::Tcp => "rds",
        TransportArg::Rdma => "rds-rd",
    };
    if a.server {
        let local = a.local.ok_or("--server needs --local ADDR (-r)")?;
        let stack = start_stack(local, &a.common).await?;
        let _srv = tools::rds::stress_server_rdma(&stack, a.port, a.tasks, a.ack, a.rdma_size)?;
        let mut tcp = None;
        if a.baseline {
            let (h, addr) = tools::rds::tcp_baseline_server((local, a.port).into()).await?;
            tcp = Some(h);
            println!("raw-TCP baseline responder on {addr}");
        }
        println!(
            "stress responders on rds://{local}:{}..{} ({} port {})",
            a.port,
            a.port.wrapping_add(a.tasks as u16 - 1),
            name,
            a.common.port()
        );
        std::io::stdout().flush()?;
        wait_for_signal().await;
        if let Some(h) = tcp {
            h.abort();
        }
        stack.shutdown();
        return Ok(());
    }
    let (client, server_ip, _server_stack, _srv) = if a.in_process {
        let (ca, cb) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        // A free port unless one was given: the two nodes share it (different addresses).
        let mut common = CommonArgs {
            transport: a.common.transport,
            tport: a.common.tport,
            max_peers: a.common.max_peers,
        };
        if common.tport.is_none() {
            common.tport = Some(std::net::TcpListener::bind((ca, 0))?.local_addr()?.port());
        }
        let sb = start_stack(cb, &common).await?;
        let srv = tools::rds::stress_server_rdma(&sb, a.port, a.tasks, a.ack, a.rdma_size)?;
        let sa = start_stack(a.local.unwrap_or(ca), &common).await?;
        (sa, cb, Some(sb), Some(srv))
    } else {
        let server = a.connect.ok_or("give --connect ADDR, --server or --self")?;
        let local = match a.local {
            Some(l) => l,
            None => routed_local(server)?,
        };
        (start_stack(local, &a.common).await?, server, None, None)
    };
    println!(
        "rds-stress: {} -> {} req {} ack {} depth {} tasks {} time {:.1}s",
        client.local(),
        server_ip,
        p.req_size,
        p.ack_size,
        p.depth,
        p.tasks,
        p.duration.as_secs_f64()
    );
    header();
    std::io::stdout().flush()?;
    let mut r = tools::rds::stress_client(&client, SocketAddrV4::new(server_ip, a.port), p).await?;
    if let Some(srv) = &_srv {
        // Both ends run in this process: the responders' RDMA Writes are its RDMA out.
        r.set_rdma_out(srv.rdma_out_bytes());
    }
    row(name, &r);
    if a.counters {
        counters("client", &client, r.requests);
        if let Some(s) = &_server_stack {
            counters("server", s, r.requests);
        }
    }
    std::io::stdout().flush()?;
    if a.baseline {
        let (h, addr) = if a.in_process {
            let (h, addr) = tools::rds::tcp_baseline_server((server_ip, 0).into()).await?;
            (Some(h), addr)
        } else {
            (None, (server_ip, a.port).into())
        };
        let t = tools::rds::tcp_baseline_client(addr, p).await?;
        row("tcp", &t);
        if let Some(h) = h {
            h.abort();
        }
    }
    client.shutdown();
    if let Some(s) = _server_stack {
        s.shutdown();
    }
    if r.acks == 0 {
        return Err("no acks received".into());
    }
    Ok(())
}

/// Per-request counts of one node after a stress run (`--counters`).
fn counters(who: &str, stack: &RdsStack, requests: u64) {
    let n = requests.max(1) as f64;
    let (mut delivered, mut ack_only) = (0u64, 0u64);
    for c in &stack.info().conns {
        for p in &c.paths {
            delivered += p.delivered;
            ack_only += p.ack_only_sent;
        }
    }
    let c = stack.rdma_counters();
    println!(
        "{who}: per request: delivered {:.3} ack-only {:.3} sends {:.3} credit-updates {:.3} \
         post-calls {:.3} recvs {:.3} credit-stalls {:.3} task-wakeups {:.3} direct-passes {:.3}",
        delivered as f64 / n,
        ack_only as f64 / n,
        c.sends as f64 / n,
        c.credit_updates as f64 / n,
        c.post_calls as f64 / n,
        c.recvs as f64 / n,
        c.credit_stalls as f64 / n,
        c.runs as f64 / n,
        c.direct_passes as f64 / n,
    );
}

fn print_info(i: &EngineInfo) {
    println!("node {} gen {:#010x}", i.local, i.gen_num);
    println!(
        "  {:<15} {:>4} {:>4} {:<10} {:>8} {:>8} {:>6} {:>7} {:>8} {:>6} {:>6}",
        "peer",
        "role",
        "path",
        "state",
        "tx_seq",
        "rx_seq",
        "sendq",
        "unacked",
        "connects",
        "npaths",
        "cong"
    );
    for c in &i.conns {
        let cong = if c.peer_congested.is_empty() {
            "-".to_string()
        } else {
            format!("{:?}", c.peer_congested)
        };
        for p in &c.paths {
            println!(
                "  {:<15} {:>4} {:>4} {:<10} {:>8} {:>8} {:>6} {:>7} {:>8} {:>6} {:>6}",
                c.peer.to_string(),
                if c.initiator { "conn" } else { "acc" },
                p.index,
                format!("{:?}", p.state),
                p.next_tx_seq,
                p.next_rx_seq,
                p.send_queue,
                p.unacked,
                p.connects,
                c.npaths.map_or("-".to_string(), |n| n.to_string()),
                cong
            );
        }
    }
    println!(
        "  {:<6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>10}",
        "port", "rcvbuf", "queued", "congested", "dropped", "sndbuf", "snd_bytes"
    );
    for p in &i.ports {
        println!(
            "  {:<6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>10}",
            p.port, p.rcvbuf, p.queued, p.congested, p.dropped, p.sndbuf, p.snd_bytes
        );
    }
    let l = &i.limits;
    println!(
        "  peers {}/{} (refused {}, forgotten {}), unbound {} (refused {}, expired {})",
        i.conns.len(),
        i.max_peers,
        l.peers_refused,
        l.peers_forgotten,
        i.unbound,
        l.unbound_refused,
        l.unbound_expired
    );
}

async fn listen(a: ListenArgs) -> CmdResult {
    let stack = start_stack(a.addr, &a.common).await?;
    let sock = stack.bind(a.port)?;
    println!(
        "listening rds://{}:{} ({} port {}){}",
        a.addr,
        a.port,
        a.common.transport.name(),
        a.common.port(),
        if a.no_echo { "" } else { ", echoing" }
    );
    std::io::stdout().flush()?;
    let every = match a.info_every {
        Some(s) => Some(secs(s, "--info-every")?.max(Duration::from_millis(100))),
        None => None,
    };
    #[cfg(unix)]
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    let mut tick = every.map(tokio::time::interval);
    let stop = wait_for_signal();
    tokio::pin!(stop);
    let mut count = 0u64;
    loop {
        let info_tick = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(unix)]
        let usr = usr1.recv();
        #[cfg(not(unix))]
        let usr = std::future::pending::<Option<()>>();
        tokio::select! {
            _ = &mut stop => break,
            _ = info_tick => print_info(&stack.info()),
            _ = usr => print_info(&stack.info()),
            r = sock.recv_from() => {
                let (payload, src) = r?;
                count += 1;
                if a.print {
                    println!("{count}: {} bytes from {src}", payload.len());
                }
                if !a.no_echo && let Err(e) = sock.send_to(src, payload).await {
                    tracing::warn!(%e, %src, "echo failed");
                }
            }
        }
        std::io::stdout().flush()?;
    }
    println!("{count} datagrams received");
    stack.shutdown();
    Ok(())
}

async fn info(a: InfoArgs) -> CmdResult {
    let o = a.local.octets();
    let peer = Ipv4Addr::new(o[0], o[1], o[2], o[3].wrapping_add(1));
    let mut common = CommonArgs {
        transport: a.common.transport,
        tport: a.common.tport,
        max_peers: a.common.max_peers,
    };
    if common.tport.is_none() {
        common.tport = Some(
            std::net::TcpListener::bind((a.local, 0))?
                .local_addr()?
                .port(),
        );
    }
    let sa = start_stack(a.local, &common).await?;
    let sb = start_stack(peer, &common).await?;
    let (da, db) = tools::rds::info::exchange(&sa, &sb, a.count).await?;
    println!(
        "after {} datagrams each way between rds://{da} and rds://{db}:",
        a.count
    );
    print_info(&sa.info());
    print_info(&sb.info());
    sa.shutdown();
    sb.shutdown();
    Ok(())
}
