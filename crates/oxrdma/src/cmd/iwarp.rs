//! `oxrdma iwarp …`: soft-iWARP tools.
//!
//! - `iwarp peer server ADDR [PORT]` / `iwarp peer client ADDR [PORT]` — a peer that speaks the
//!   **iwpeer protocol** of `interop/README.md` (the same protocol as `interop/guest/iwpeer.c`,
//!   which runs over kernel siw + rdma-core), so that oxrdma's soft-iWARP provider can be checked
//!   against kernel siw in both directions. The protocol (codec, verdicts, driver) is
//!   `tools::iwpeer`; this module parses the arguments and prints what the run reports.
//!
//! Output, like iwpeer: `LISTENING …` (server), `CONNECTED …`, one `OK <op> <size> iters=<n>
//! by=<role>` or `FAIL …` line per op and driver, then `PASS` or `FAIL`. Exit status 0 on PASS,
//! 1 when an op failed, 2 on a setup/connection error or timeout.
//!
//! What it does not do: more than one connection per run (the server exits after one, like
//! iwpeer), or any op the iwpeer protocol does not name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use tools::iwpeer::{self, ClientConfig, Event, PeerConfig, PeerError, ServerConfig, hdr::nak};
use verbs::ConnParams;

use super::CmdResult;

/// Exit status for setup/connection errors and timeouts (iwpeer's).
const EXIT_SETUP: i32 = 2;

/// The iwpeer ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// DATA as a plain Send.
    Send,
    /// DATA as a Send with Invalidate of a fresh peer STag.
    Sendinv,
    /// RDMA Write to the peer's buffer, then WROTE.
    Write,
    /// FILL, then RDMA Read of the peer's buffer.
    Read,
}

impl From<Op> for iwpeer::Op {
    fn from(op: Op) -> Self {
        match op {
            Op::Send => iwpeer::Op::Send,
            Op::Sendinv => iwpeer::Op::Sendinv,
            Op::Write => iwpeer::Op::Write,
            Op::Read => iwpeer::Op::Read,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum IwarpCommand {
    /// A peer speaking the iwpeer protocol (interop/README.md), for interop with kernel siw.
    #[command(subcommand)]
    Peer(PeerCommand),
}

#[derive(Debug, Subcommand)]
pub enum PeerCommand {
    /// Listen on ADDR (HOST:PORT, or HOST PORT), serve one connection, and exit.
    Server(ServerArgs),
    /// Connect to an iwpeer server and run the ops.
    Client(ClientArgs),
}

/// Who drives the ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Drive {
    /// The client drives, the server responds.
    Client,
    /// The server drives, the client responds.
    Server,
    /// The client drives first, then the server.
    Both,
}

/// An RTR kind for peer-to-peer mode (RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rtr {
    /// Zero-length RDMA Write.
    Write,
    /// Zero-length RDMA Read Request.
    Read,
    /// Zero-length Send.
    Send,
}

#[derive(Debug, Args)]
pub struct MpaArgs {
    /// Ask for MPA CRC-32C (used if either side asks).
    #[arg(long)]
    crc: bool,
    /// Peer-to-peer mode: exchange an RTR after the MPA Reply (RFC 6581).
    #[arg(long)]
    p2p: bool,
    /// RTR kinds to offer (implies --p2p), e.g. `write`, `read`, `write,read`.
    #[arg(long, value_enum, value_delimiter = ',')]
    rtr: Vec<Rtr>,
    /// MPA revision to use as initiator.
    #[arg(long = "mpa-rev", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    mpa_rev: u8,
    /// Give up after this many seconds (printing `FAIL timeout`).
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Write a pcap of the connection into DIR (also: OXRDMA_PCAP_DIR).
    #[arg(long, value_name = "DIR")]
    pcap: Option<PathBuf>,
    /// Only the result lines (no `#` info lines).
    #[arg(short, long)]
    quiet: bool,
    /// Client: milliseconds without a HELLO answer before nudging the server with a
    /// zero-length RDMA Write (see `tools::iwpeer::peer`).
    #[arg(long, default_value_t = 1000, hide = true)]
    nudge_ms: u64,
}

impl MpaArgs {
    fn peer(&self) -> PeerConfig {
        PeerConfig {
            params: self.params(),
            timeout: Duration::from_secs(self.timeout),
            nudge: Duration::from_millis(self.nudge_ms),
        }
    }

    fn params(&self) -> ConnParams {
        let mut p = ConnParams {
            // iwpeer: IRD = ORD = 1.
            ird: 1,
            ord: 1,
            crc: self.crc,
            peer_to_peer: self.p2p || !self.rtr.is_empty(),
            mpa_revision: self.mpa_rev,
            capture_dir: self.pcap.clone(),
            ..ConnParams::default()
        };
        if !self.rtr.is_empty() {
            p.rtr_kinds = [
                self.rtr.contains(&Rtr::Write),
                self.rtr.contains(&Rtr::Read),
                self.rtr.contains(&Rtr::Send),
            ];
        }
        p
    }
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to listen on: HOST:PORT, or HOST with PORT as the next argument.
    addr: String,
    /// Port, when ADDR is a bare host.
    port: Option<u16>,
    /// Target buffer size (largest op size accepted).
    #[arg(long, default_value_t = 1 << 20)]
    size: u32,
    #[command(flatten)]
    mpa: MpaArgs,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Server address: HOST:PORT, or HOST with PORT as the next argument.
    addr: String,
    /// Port, when ADDR is a bare host.
    port: Option<u16>,
    /// Ops to run, in this order: send, sendinv, write, read.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "send,sendinv,write,read"
    )]
    ops: Vec<Op>,
    /// Payload size of every op, bytes.
    #[arg(long, default_value_t = 4096)]
    size: u32,
    /// Iterations of every op.
    #[arg(long, default_value_t = 1)]
    iters: u32,
    /// Who drives the ops.
    #[arg(long, value_enum, default_value_t = Drive::Both)]
    drive: Drive,
    #[command(flatten)]
    mpa: MpaArgs,
}

/// Run an `iwarp` command.
pub async fn run(cmd: IwarpCommand) -> CmdResult {
    match cmd {
        IwarpCommand::Peer(PeerCommand::Server(a)) => {
            let addr = resolve(&a.addr, a.port).await?;
            let cfg = ServerConfig {
                size: a.size,
                peer: a.mpa.peer(),
            };
            let mut out = printer("server", a.mpa.quiet);
            finish(iwpeer::server(addr, &cfg, &mut out).await)
        }
        IwarpCommand::Peer(PeerCommand::Client(a)) => {
            let addr = resolve(&a.addr, a.port).await?;
            let cfg = ClientConfig {
                ops: a.ops.iter().map(|&o| o.into()).collect(),
                size: a.size,
                iters: a.iters,
                drive: match a.drive {
                    Drive::Client => iwpeer::Drive::Client,
                    Drive::Server => iwpeer::Drive::Server,
                    Drive::Both => iwpeer::Drive::Both,
                },
                peer: a.mpa.peer(),
            };
            let mut out = printer("client", a.mpa.quiet);
            finish(iwpeer::client(addr, &cfg, &mut out).await)
        }
    }
}

async fn resolve(
    host: &str,
    port: Option<u16>,
) -> Result<SocketAddr, Box<dyn std::error::Error + Send + Sync>> {
    let first = match port {
        Some(p) => tokio::net::lookup_host((host, p)).await?.next(),
        None => tokio::net::lookup_host(host).await?.next(),
    };
    first.ok_or_else(|| format!("{host}: no address").into())
}

/// Print a run's events as iwpeer does: `LISTENING …`, `CONNECTED …`, `OK`/`FAIL` per op and
/// driver, `# role: …` detail unless `quiet`.
fn printer(role: &'static str, quiet: bool) -> impl FnMut(Event) + Send {
    move |ev| match ev {
        Event::Listening(a) => println!("LISTENING {a}"),
        Event::Connected {
            local,
            peer,
            crc,
            ird,
            ord,
        } => println!(
            "CONNECTED {local} -> {peer} device oxrdma-siw crc {} ird {ird} ord {ord}",
            if crc { "on" } else { "off" }
        ),
        Event::Info(s) if !quiet => println!("# {role}: {s}"),
        Event::Diagnostic(s) => println!("# {role}: {s}"),
        Event::OpPassed { op, size, iters } => println!("OK {op} {size} iters={iters} by={role}"),
        Event::OpFailed { op, size, why } => println!("FAIL {op} {size} by={role}: {why}"),
        Event::PeerFailed {
            op,
            len,
            code,
            value,
            iter,
        } => println!(
            "FAIL {op} {len} by=peer: NAK code {code} ({}) offset/value {value} iter {iter}",
            nak::name(code)
        ),
        _ => {}
    }
}

/// Print the verdict; exit 2 for setup errors like iwpeer.
fn finish(r: Result<u32, PeerError>) -> CmdResult {
    match r {
        Ok(0) => {
            println!("PASS");
            Ok(())
        }
        Ok(n) => {
            println!("FAIL");
            Err(format!("{n} op(s) failed").into())
        }
        Err(why) => {
            println!("FAIL setup: {why}");
            println!("FAIL");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(EXIT_SETUP);
        }
    }
}
