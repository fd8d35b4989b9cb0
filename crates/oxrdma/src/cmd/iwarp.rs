//! `oxrdma iwarp …`: soft-iWARP tools.
//!
//! - `iwarp peer server ADDR [PORT]` / `iwarp peer client ADDR [PORT]` — a peer that speaks the
//!   **iwpeer protocol** of `interop/README.md` (the same protocol as `interop/guest/iwpeer.c`,
//!   which runs over kernel siw + rdma-core), so that oxrdma's soft-iWARP provider can be checked
//!   against kernel siw in both directions. One RC connection; every message is a Send whose
//!   first 32 bytes are a big-endian control header ([`Hdr`]); the client says in its HELLO which
//!   ops (send, sendinv, write, read) run, with which size, how many times and who drives them.
//!
//! Output, like iwpeer: `LISTENING …` (server), `CONNECTED …`, one `OK <op> <size> iters=<n>
//! by=<role>` or `FAIL …` line per op and driver, then `PASS` or `FAIL`. Exit status 0 on PASS,
//! 1 when an op failed, 2 on a setup/connection error or timeout.
//!
//! What it does not do: more than one connection per run (the server exits after one, like
//! iwpeer), or any op the iwpeer protocol does not name.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use verbs::{
    Access, CmEvent, Completion, ConnParams, Connection, Device, MemoryRegion, QueuePair, RecvWr,
    SendOp, SendWr, SoftIwarpConfig, WcStatus,
};

use super::CmdResult;

/// Magic of every control header: "IWP1".
const MAGIC: u32 = 0x4957_5031;
/// Length of the control header that opens every Send.
const HDR_LEN: usize = 32;
/// Receives each side keeps posted (iWARP has no RNR: a Send without one kills the QP).
const NRECV: u64 = 8;
/// Largest `--size` accepted (iwpeer's limit).
const MAX_SIZE: u32 = 1 << 30;
/// Exit status for setup/connection errors and timeouts (iwpeer's).
const EXIT_SETUP: i32 = 2;

/// The iwpeer ops, numbered as on the wire (`op` field and HELLO mask bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// DATA as a plain Send.
    Send = 1,
    /// DATA as a Send with Invalidate of a fresh peer STag.
    Sendinv = 2,
    /// RDMA Write to the peer's buffer, then WROTE.
    Write = 3,
    /// FILL, then RDMA Read of the peer's buffer.
    Read = 4,
}

impl Op {
    const ALL: [Op; 4] = [Op::Send, Op::Sendinv, Op::Write, Op::Read];

    fn code(self) -> u8 {
        self as u8
    }

    fn name(code: u8) -> &'static str {
        match code {
            1 => "send",
            2 => "sendinv",
            3 => "write",
            4 => "read",
            _ => "?",
        }
    }
}

/// Control message types (`type` field).
mod msg {
    pub const HELLO: u16 = 1;
    pub const DATA: u16 = 2;
    pub const ACK: u16 = 3;
    pub const INVKEY_REQ: u16 = 4;
    pub const INVKEY: u16 = 5;
    pub const WROTE: u16 = 6;
    pub const FILL: u16 = 7;
    pub const FILLED: u16 = 8;
    pub const DONE: u16 = 9;
    pub const NAK: u16 = 10;
}

/// NAK codes (`arg` of a NAK).
mod nak {
    pub const BAD_LENGTH: u32 = 1;
    pub const MISMATCH: u32 = 2;
    pub const SEND_WITH_INV: u32 = 3;
    pub const WRONG_STAG: u32 = 5;
    pub const UNKNOWN_TYPE: u32 = 9;

    pub fn name(c: u32) -> &'static str {
        match c {
            BAD_LENGTH => "bad length",
            MISMATCH => "data mismatch",
            SEND_WITH_INV => "plain send arrived with invalidate",
            WRONG_STAG => "wrong STag invalidated",
            UNKNOWN_TYPE => "unknown message type",
            _ => "?",
        }
    }
}

/// HELLO `flags`: who drives.
const DRIVE_CLIENT: u8 = 1;
const DRIVE_SERVER: u8 = 2;

/// The 32-byte control header (all fields big-endian on the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hdr {
    /// Message type ([`msg`]).
    pub typ: u16,
    /// Op code (0 for control).
    pub op: u8,
    /// HELLO: who drives (bit0 client, bit1 server).
    pub flags: u8,
    /// Iteration (HELLO: iteration count).
    pub iter: u32,
    /// Length (HELLO: buffer size; NAK: offset or value).
    pub len: u32,
    /// Buffer address (HELLO, INVKEY).
    pub addr: u64,
    /// STag (HELLO, INVKEY, DATA of sendinv).
    pub rkey: u32,
    /// HELLO: op mask; NAK: code.
    pub arg: u32,
}

/// Why a received message is not an iwpeer control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HdrError {
    /// Fewer than 32 bytes.
    #[error("message of {0} bytes is shorter than the 32-byte header")]
    Short(usize),
    /// The magic is not "IWP1".
    #[error("bad magic {0:#010x}")]
    Magic(u32),
}

impl Hdr {
    /// Encoded length.
    pub const fn encoded_len() -> usize {
        HDR_LEN
    }

    /// Encode into the wire form.
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.typ.to_be_bytes());
        b[6] = self.op;
        b[7] = self.flags;
        b[8..12].copy_from_slice(&self.iter.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_be_bytes());
        b[28..32].copy_from_slice(&self.arg.to_be_bytes());
        b
    }

    /// Decode the header at the start of `b` (checked; never panics).
    pub fn decode(b: &[u8]) -> Result<Hdr, HdrError> {
        let Some(h) = b.get(..HDR_LEN) else {
            return Err(HdrError::Short(b.len()));
        };
        let u32_at = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(HdrError::Magic(magic));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[16..24]);
        Ok(Hdr {
            typ: u16::from_be_bytes([h[4], h[5]]),
            op: h[6],
            flags: h[7],
            iter: u32_at(8),
            len: u32_at(12),
            addr: u64::from_be_bytes(a),
            rkey: u32_at(24),
            arg: u32_at(28),
        })
    }

    fn ctrl(typ: u16, op: u8, iter: u32, len: u32, arg: u32) -> Hdr {
        Hdr {
            typ,
            op,
            iter,
            len,
            arg,
            ..Hdr::default()
        }
    }
}

/// Byte `i` of the payload of op `op` in iteration `iter`: `(i*131 + (i>>8) + iter*17 + op*59
/// + 1) & 0xff`, computed in 64 bits and truncated.
pub fn pattern(op: u8, iter: u32, i: u64) -> u8 {
    i.wrapping_mul(131)
        .wrapping_add(i >> 8)
        .wrapping_add(u64::from(iter).wrapping_mul(17))
        .wrapping_add(u64::from(op) * 59)
        .wrapping_add(1) as u8
}

fn fill(b: &mut [u8], op: u8, iter: u32) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = pattern(op, iter, i as u64);
    }
}

/// First offset where `b` differs from the pattern.
fn check(b: &[u8], op: u8, iter: u32) -> Option<usize> {
    b.iter()
        .enumerate()
        .find(|(i, x)| **x != pattern(op, iter, *i as u64))
        .map(|(i, _)| i)
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
    /// zero-length RDMA Write (see [`Peer::hello_answer`]).
    #[arg(long, default_value_t = 1000, hide = true)]
    nudge_ms: u64,
}

impl MpaArgs {
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
            finish(server(addr, &a).await)
        }
        IwarpCommand::Peer(PeerCommand::Client(a)) => {
            let addr = resolve(&a.addr, a.port).await?;
            finish(client(addr, &a).await)
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

/// A setup/connection error or timeout (exit status 2).
#[derive(Debug)]
struct Fatal(String);

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn fatal(s: impl Into<String>) -> Fatal {
    Fatal(s.into())
}

/// Print the verdict; exit 2 for setup errors like iwpeer.
fn finish(r: Result<u32, Fatal>) -> CmdResult {
    match r {
        Ok(0) => {
            println!("PASS");
            Ok(())
        }
        Ok(n) => {
            println!("FAIL");
            Err(format!("{n} op(s) failed").into())
        }
        Err(Fatal(why)) => {
            println!("FAIL setup: {why}");
            println!("FAIL");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(EXIT_SETUP);
        }
    }
}

fn check_size(size: u32) -> Result<(), Fatal> {
    if size > MAX_SIZE {
        return Err(fatal("size too large"));
    }
    Ok(())
}

fn device(mpa: &MpaArgs) -> Device {
    Device::open(verbs::Provider::SoftIwarp(SoftIwarpConfig {
        capture_dir: mpa.pcap.clone(),
        ..SoftIwarpConfig::default()
    }))
}

async fn server(addr: SocketAddr, a: &ServerArgs) -> Result<u32, Fatal> {
    check_size(a.size)?;
    let dev = device(&a.mpa);
    let mut l = dev
        .listen(addr)
        .await
        .map_err(|e| fatal(format!("listen {addr}: {e}")))?;
    println!("LISTENING {}", l.local_addr());
    let limit = Duration::from_secs(a.mpa.timeout);
    let req = tokio::time::timeout(limit, l.accept())
        .await
        .map_err(|_| fatal("timeout"))?
        .map_err(|e| fatal(format!("accept: {e}")))?;
    drop(l);
    let p = Peer::new(&dev, a.size, "server", a.mpa.quiet)?;
    p.info(format_args!(
        "connect request from {}: MPA rev {} crc {} p2p {} ird {:?} ord {:?} private_data_len {}",
        req.peer_addr(),
        req.mpa_revision(),
        req.crc(),
        req.peer_to_peer(),
        req.ird(),
        req.ord(),
        req.private_data().len()
    ));
    let conn = req
        .accept(&p.qp, a.mpa.params())
        .await
        .map_err(|e| fatal(format!("accept: {e}")))?;
    run_connected(p, conn, limit, None, 0).await
}

async fn client(addr: SocketAddr, a: &ClientArgs) -> Result<u32, Fatal> {
    check_size(a.size)?;
    let dev = device(&a.mpa);
    let p = Peer::new(&dev, a.size, "client", a.mpa.quiet)?;
    let limit = Duration::from_secs(a.mpa.timeout);
    let conn = tokio::time::timeout(limit, dev.connect(&p.qp, addr, a.mpa.params()))
        .await
        .map_err(|_| fatal("timeout"))?
        .map_err(|e| fatal(format!("connect {addr}: {e}")))?;
    let mut mask = 0u32;
    for op in &a.ops {
        mask |= 1 << op.code();
    }
    let drive = match a.drive {
        Drive::Client => DRIVE_CLIENT,
        Drive::Server => DRIVE_SERVER,
        Drive::Both => DRIVE_CLIENT | DRIVE_SERVER,
    };
    let hello = Some((mask, a.size, a.iters, drive));
    run_connected(p, conn, limit, hello, a.mpa.nudge_ms).await
}

/// Everything after the connection is up, under the overall time limit. On a setup error the
/// connection events seen so far (Terminates) are printed too.
async fn run_connected(
    mut p: Peer,
    conn: Connection,
    limit: Duration,
    hello: Option<(u32, u32, u32, u8)>,
    nudge_ms: u64,
) -> Result<u32, Fatal> {
    println!(
        "CONNECTED {} -> {} device oxrdma-siw crc {} ird {} ord {}",
        conn.local_addr(),
        conn.peer_addr(),
        if conn.crc() { "on" } else { "off" },
        conn.ird(),
        conn.ord()
    );
    let r = match tokio::time::timeout(limit, p.session(hello, nudge_ms)).await {
        Ok(r) => r,
        Err(_) => Err(fatal("timeout")),
    };
    if r.is_err() {
        // What the connection saw: Terminates name the layer/type/code of a wire error.
        while let Ok(Some(ev)) =
            tokio::time::timeout(Duration::from_millis(200), conn.next_event()).await
        {
            println!("# {}: event {ev:?}", p.role);
            if ev == CmEvent::Disconnected {
                break;
            }
        }
        // Closing the connection also flushes its capture.
        conn.disconnect().await;
        return r;
    }
    if hello.is_some() {
        conn.disconnect().await;
    } else {
        // The server waits for the client's disconnect.
        let wait = async {
            while let Some(ev) = conn.next_event().await {
                p.info(format_args!("event {ev:?}"));
                if ev == CmEvent::Disconnected {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
        conn.disconnect().await;
    }
    r
}

/// One side of the iwpeer protocol.
struct Peer {
    role: &'static str,
    quiet: bool,
    qp: QueuePair,
    bufsz: u32,
    /// Target of the peer's Writes and Reads.
    rbuf: MemoryRegion,
    /// Source of our Writes, sink of our Reads.
    lbuf: MemoryRegion,
    /// Header + payload of our DATA Sends.
    sbuf: MemoryRegion,
    /// One region per posted receive (wr_id = slot).
    recv: Vec<MemoryRegion>,
    /// The peer's target buffer.
    raddr: u64,
    rrkey: u32,
    rlen: u32,
    /// The STag offered for the peer's Send with Invalidate.
    invmr: Option<MemoryRegion>,
    failures: u32,
    warned_inv: bool,
    next_wr: u64,
}

fn reg(pd: &verbs::ProtectionDomain, n: usize, acc: Access) -> Result<MemoryRegion, Fatal> {
    pd.register_len(n, acc)
        .map_err(|e| fatal(format!("register {n} bytes: {e}")))
}

impl Peer {
    fn new(dev: &Device, bufsz: u32, role: &'static str, quiet: bool) -> Result<Peer, Fatal> {
        let pd = dev.alloc_pd();
        let (scq, rcq) = (dev.create_cq(), dev.create_cq());
        let qp = dev.create_qp(&pd, &scq, &rcq);
        let n = bufsz as usize;
        let target = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let rbuf = reg(&pd, n, target)?;
        // iWARP: the sink of an RDMA Read is named by STag in the Read Request, so it needs
        // remote write access (RFC 5040 §4.4).
        let lbuf = reg(&pd, n, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let sbuf = reg(&pd, HDR_LEN + n, Access::LOCAL_WRITE)?;
        let mut recv = Vec::new();
        for slot in 0..NRECV {
            let mr = reg(&pd, HDR_LEN + n, Access::LOCAL_WRITE)?;
            qp.post_recv(RecvWr {
                wr_id: slot,
                sgl: vec![mr.sge(0, (HDR_LEN + n) as u32)],
            })
            .map_err(|e| fatal(format!("post_recv: {e}")))?;
            recv.push(mr);
        }
        Ok(Peer {
            role,
            quiet,
            qp,
            bufsz,
            rbuf,
            lbuf,
            sbuf,
            recv,
            raddr: 0,
            rrkey: 0,
            rlen: 0,
            invmr: None,
            failures: 0,
            warned_inv: false,
            next_wr: 1,
        })
    }

    fn info(&self, a: fmt::Arguments<'_>) {
        if !self.quiet {
            println!("# {}: {a}", self.role);
        }
    }

    fn repost(&self, slot: u64) -> Result<(), Fatal> {
        let mr = self
            .recv
            .get(slot as usize)
            .ok_or_else(|| fatal(format!("receive completion for unknown slot {slot}")))?;
        self.qp
            .post_recv(RecvWr {
                wr_id: slot,
                sgl: vec![mr.sge(0, mr.len() as u32)],
            })
            .map_err(|e| fatal(format!("post_recv: {e}")))
    }

    /// Post one signaled WR and wait for its completion (iwpeer waits for each).
    async fn post(&mut self, op: SendOp, payload: PayloadSrc, what: &str) -> Result<(), Fatal> {
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let wr = match payload {
            PayloadSrc::Bytes(b) => SendWr {
                opcode: op,
                ..SendWr::send_bytes(wr_id, b)
            },
            PayloadSrc::Sbuf(n) => SendWr::new(wr_id, op, vec![self.sbuf.sge(0, n)]),
            PayloadSrc::Lbuf(n) => SendWr::new(wr_id, op, vec![self.lbuf.sge(0, n)]),
            PayloadSrc::Nothing => SendWr::new(wr_id, op, Vec::new()),
        };
        self.qp
            .post_send(wr)
            .map_err(|e| fatal(format!("post_send({what}): {e}")))?;
        let wc = self.qp.send_cq().next().await;
        if wc.status != WcStatus::Success || wc.wr_id != wr_id {
            return Err(fatal(format!(
                "{what} completion: {:?} (wr_id {} of {wr_id})",
                wc.status, wc.wr_id
            )));
        }
        Ok(())
    }

    async fn ctrl(&mut self, h: Hdr) -> Result<(), Fatal> {
        let b = Bytes::copy_from_slice(&h.encode());
        self.post(SendOp::Send, PayloadSrc::Bytes(b), "send").await
    }

    /// Wait for one message; the caller reposts the slot.
    async fn recv_msg(&mut self) -> Result<(Hdr, Completion), Fatal> {
        let wc = self.qp.recv_cq().next().await;
        if wc.status != WcStatus::Success {
            return Err(fatal(format!("receive completion: {:?}", wc.status)));
        }
        let mr = self
            .recv
            .get(wc.wr_id as usize)
            .ok_or_else(|| fatal(format!("receive completion for unknown slot {}", wc.wr_id)))?;
        let n = (wc.byte_len as usize).min(mr.len());
        let h = mr.with_bytes(|b| Hdr::decode(&b[..n])).map_err(|e| {
            fatal(format!(
                "received {} bytes without an IWP1 header: {e}",
                wc.byte_len
            ))
        })?;
        Ok((h, wc))
    }

    /// Receive one message and repost its slot.
    async fn recv_ctrl(&mut self) -> Result<Hdr, Fatal> {
        let (h, wc) = self.recv_msg().await?;
        self.repost(wc.wr_id)?;
        Ok(h)
    }

    async fn session(
        &mut self,
        hello: Option<(u32, u32, u32, u8)>,
        nudge_ms: u64,
    ) -> Result<u32, Fatal> {
        let mine = Hdr {
            typ: msg::HELLO,
            addr: self.rbuf.addr(),
            rkey: self.rbuf.rkey(),
            len: self.bufsz,
            ..Hdr::default()
        };
        let (ops, size, iters, drive, h) = match hello {
            Some((ops, size, iters, drive)) => {
                self.ctrl(Hdr {
                    flags: drive,
                    iter: iters,
                    arg: ops,
                    ..mine
                })
                .await?;
                let h = self.hello_answer(Duration::from_millis(nudge_ms)).await?;
                if h.typ == msg::NAK {
                    return Err(fatal(format!(
                        "server refused HELLO (code {}: its buffer is {} bytes)",
                        h.arg, h.len
                    )));
                }
                if h.typ != msg::HELLO {
                    return Err(fatal(format!("expected HELLO, got type {}", h.typ)));
                }
                (ops, size, iters, drive, h)
            }
            None => {
                let h = self.recv_ctrl().await?;
                if h.typ != msg::HELLO {
                    return Err(fatal(format!("expected HELLO, got type {}", h.typ)));
                }
                if h.len > self.bufsz {
                    self.ctrl(Hdr::ctrl(msg::NAK, 0, 0, self.bufsz, nak::BAD_LENGTH))
                        .await?;
                    return Err(fatal(format!(
                        "client size {} exceeds server buffer {} (--size)",
                        h.len, self.bufsz
                    )));
                }
                self.ctrl(Hdr { arg: h.arg, ..mine }).await?;
                (h.arg, h.len, h.iter, h.flags, h)
            }
        };
        self.raddr = h.addr;
        self.rrkey = h.rkey;
        self.rlen = h.len;
        self.info(format_args!(
            "peer buffer addr {:#x} rkey {:#x} len {}; ops mask {:#x} size {size} iters {iters} drive {drive}",
            self.raddr, self.rrkey, self.rlen, ops
        ));
        let client = hello.is_some();
        if drive & DRIVE_CLIENT != 0 {
            if client {
                self.drive(ops, size, iters).await?;
            } else {
                self.respond().await?;
            }
        }
        if drive & DRIVE_SERVER != 0 {
            if client {
                self.respond().await?;
            } else {
                self.drive(ops, size, iters).await?;
            }
        }
        Ok(self.failures)
    }

    /// Wait for the server's answer to our HELLO, nudging it if it is late.
    ///
    /// Linux 6.1 siw (`siw_accept`, siw_cm.c) sends the MPA Reply while the socket still has
    /// the connection manager's data-ready upcall, which ignores data in RDMA mode, and only
    /// then switches to `siw_qp_llp_data_ready` without reading what is already queued. An
    /// FPDU that arrives in that window waits until the next segment arrives; our HELLO is
    /// the only thing we send, so the connection would hang. A zero-length RDMA Write is the
    /// harmless next segment: neither siw (`siw_proc_write`) nor oxrdma checks its STag
    /// (RFC 6581 uses the same message as its Write RTR).
    async fn hello_answer(&mut self, nudge_after: Duration) -> Result<Hdr, Fatal> {
        // A zero interval nudges at once (tests use it to check that nudges are harmless).
        for n in 1..=3 {
            if !nudge_after.is_zero()
                && let Ok(r) = tokio::time::timeout(nudge_after, self.recv_ctrl()).await
            {
                return r;
            }
            self.info(format_args!(
                "no HELLO answer after {} ms: nudging the server with a zero-length RDMA Write ({n})",
                nudge_after.as_millis()
            ));
            let op = SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 1,
            };
            self.post(op, PayloadSrc::Nothing, "zero-length rdma write")
                .await?;
        }
        self.recv_ctrl().await
    }

    /// Expect ACK(op, iter); otherwise say why.
    async fn expect_ack(&mut self, op: u8, iter: u32) -> Result<Result<(), String>, Fatal> {
        let h = self.recv_ctrl().await?;
        Ok(if h.typ == msg::ACK && h.op == op && h.iter == iter {
            Ok(())
        } else if h.typ == msg::NAK {
            Err(format!("peer NAK code={} offset={}", h.arg, h.len))
        } else {
            Err(format!(
                "unexpected message type {} op {} iter {}",
                h.typ, h.op, h.iter
            ))
        })
    }

    /// Fill the send buffer with a header and `size` pattern bytes.
    fn stage_data(&self, h: Hdr, size: u32) {
        self.sbuf.with_bytes(|b| {
            b[..Hdr::encoded_len()].copy_from_slice(&h.encode());
            fill(&mut b[HDR_LEN..HDR_LEN + size as usize], h.op, h.iter);
        });
    }

    /// The driver: run every op of `mask` against the peer, then DONE.
    async fn drive(&mut self, mask: u32, size: u32, iters: u32) -> Result<(), Fatal> {
        if size > self.bufsz {
            return Err(fatal(format!(
                "size {size} exceeds local buffer {}",
                self.bufsz
            )));
        }
        for op in Op::ALL {
            let op = op.code();
            if mask & (1 << op) == 0 {
                continue;
            }
            let mut why = None;
            for it in 0..iters {
                let r = self.drive_one(op, size, it).await?;
                if let Err(w) = r {
                    why = Some(w);
                    break;
                }
            }
            match why {
                None => println!("OK {} {size} iters={iters} by={}", Op::name(op), self.role),
                Some(w) => {
                    println!("FAIL {} {size} by={}: {w}", Op::name(op), self.role);
                    self.failures += 1;
                }
            }
        }
        self.ctrl(Hdr::ctrl(msg::DONE, 0, 0, 0, 0)).await?;
        if let Err(w) = self.expect_ack(0, 0).await? {
            return Err(fatal(format!("DONE not acknowledged: {w}")));
        }
        Ok(())
    }

    async fn drive_one(&mut self, op: u8, size: u32, it: u32) -> Result<Result<(), String>, Fatal> {
        let data = Hdr {
            typ: msg::DATA,
            op,
            iter: it,
            len: size,
            ..Hdr::default()
        };
        match op {
            1 => {
                // The send buffer is reused only after the ACK: a soft-iWARP Send completes
                // when it is handed to the transport, not when it left.
                self.stage_data(data, size);
                self.post(
                    SendOp::Send,
                    PayloadSrc::Sbuf(HDR_LEN as u32 + size),
                    "send",
                )
                .await?;
                self.expect_ack(op, it).await
            }
            2 => {
                self.ctrl(Hdr::ctrl(msg::INVKEY_REQ, op, it, 0, 0)).await?;
                let h = self.recv_ctrl().await?;
                if h.typ != msg::INVKEY {
                    return Ok(Err(format!("expected INVKEY, got type {}", h.typ)));
                }
                self.stage_data(
                    Hdr {
                        rkey: h.rkey,
                        ..data
                    },
                    size,
                );
                self.post(
                    SendOp::SendWithInvalidate(h.rkey),
                    PayloadSrc::Sbuf(HDR_LEN as u32 + size),
                    "send-with-invalidate",
                )
                .await?;
                self.expect_ack(op, it).await
            }
            3 => {
                if size > self.rlen {
                    return Ok(Err(format!("peer buffer {} < size", self.rlen)));
                }
                self.lbuf
                    .with_bytes(|b| fill(&mut b[..size as usize], op, it));
                let wr = SendOp::RdmaWrite {
                    remote_addr: self.raddr,
                    rkey: self.rrkey,
                };
                self.post(wr, PayloadSrc::Lbuf(size), "rdma write").await?;
                self.ctrl(Hdr::ctrl(msg::WROTE, op, it, size, 0)).await?;
                self.expect_ack(op, it).await
            }
            _ => {
                if size > self.rlen {
                    return Ok(Err(format!("peer buffer {} < size", self.rlen)));
                }
                self.ctrl(Hdr::ctrl(msg::FILL, op, it, size, 0)).await?;
                let h = self.recv_ctrl().await?;
                if h.typ != msg::FILLED || h.iter != it {
                    return Ok(Err(format!("expected FILLED, got type {}", h.typ)));
                }
                self.lbuf.with_bytes(|b| b[..size as usize].fill(0));
                let wr = SendOp::RdmaRead {
                    remote_addr: self.raddr,
                    rkey: self.rrkey,
                };
                self.post(wr, PayloadSrc::Lbuf(size), "rdma read").await?;
                Ok(
                    match self.lbuf.with_bytes(|b| check(&b[..size as usize], op, it)) {
                        None => Ok(()),
                        Some(bad) => Err(format!("read data mismatch at offset {bad} iter {it}")),
                    },
                )
            }
        }
    }

    /// The responder: serve the peer's ops until DONE.
    async fn respond(&mut self) -> Result<(), Fatal> {
        loop {
            let (h, wc) = self.recv_msg().await?;
            let slot = wc.wr_id;
            let mut verdict: Option<(u32, u32)> = None;
            let mut reply = msg::ACK;
            match h.typ {
                msg::DATA => {
                    let inv = wc.invalidated_rkey;
                    let mr = &self.recv[slot as usize];
                    if wc.byte_len as usize != HDR_LEN + h.len as usize {
                        verdict = Some((nak::BAD_LENGTH, wc.byte_len));
                    } else if let Some(bad) = mr
                        .with_bytes(|b| check(&b[HDR_LEN..HDR_LEN + h.len as usize], h.op, h.iter))
                    {
                        verdict = Some((nak::MISMATCH, bad as u32));
                    } else if h.op == Op::Send.code() && inv.is_some() {
                        verdict = Some((nak::SEND_WITH_INV, inv.unwrap_or(0)));
                    } else if h.op == Op::Sendinv.code() {
                        let want = self.invmr.as_ref().map(|m| m.rkey());
                        match inv {
                            // RFC 5040 §5.3: the named STag is invalidated before the
                            // completion is reported; the completion carries it.
                            Some(k) if Some(k) != want => verdict = Some((nak::WRONG_STAG, k)),
                            Some(_) => {
                                if self.invmr.as_ref().is_some_and(|m| m.is_valid()) {
                                    verdict = Some((nak::WRONG_STAG, 0));
                                }
                            }
                            None => {
                                if !self.warned_inv {
                                    self.info(format_args!(
                                        "Send with Invalidate arrived without an invalidated STag"
                                    ));
                                    self.warned_inv = true;
                                }
                                verdict = Some((nak::WRONG_STAG, 0));
                            }
                        }
                    }
                    if h.op == Op::Sendinv.code() {
                        self.invmr = None;
                    }
                }
                msg::INVKEY_REQ => {
                    let pd = self.qp.pd().clone();
                    let mr = reg(
                        &pd,
                        64,
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
                    )?;
                    let (rkey, addr) = (mr.rkey(), mr.addr());
                    self.invmr = Some(mr);
                    self.repost(slot)?;
                    self.ctrl(Hdr {
                        typ: msg::INVKEY,
                        op: h.op,
                        iter: h.iter,
                        rkey,
                        len: 64,
                        addr,
                        ..Hdr::default()
                    })
                    .await?;
                    continue;
                }
                msg::WROTE => {
                    if h.len > self.bufsz {
                        verdict = Some((nak::BAD_LENGTH, h.len));
                    } else if let Some(bad) = self
                        .rbuf
                        .with_bytes(|b| check(&b[..h.len as usize], h.op, h.iter))
                    {
                        verdict = Some((nak::MISMATCH, bad as u32));
                    }
                    self.rbuf.with_bytes(|b| b.fill(0));
                }
                msg::FILL => {
                    if h.len > self.bufsz {
                        verdict = Some((nak::BAD_LENGTH, h.len));
                    } else {
                        self.rbuf
                            .with_bytes(|b| fill(&mut b[..h.len as usize], h.op, h.iter));
                    }
                    reply = msg::FILLED;
                }
                msg::DONE => {
                    self.repost(slot)?;
                    self.ctrl(Hdr::ctrl(msg::ACK, 0, 0, 0, 0)).await?;
                    return Ok(());
                }
                other => verdict = Some((nak::UNKNOWN_TYPE, u32::from(other))),
            }
            self.repost(slot)?;
            match verdict {
                Some((code, off)) => {
                    // The responder's verdict on the peer's op fails the run too.
                    println!(
                        "FAIL {} {} by=peer: NAK code {code} ({}) offset/value {off} iter {}",
                        Op::name(h.op),
                        h.len,
                        nak::name(code),
                        h.iter
                    );
                    self.failures += 1;
                    self.ctrl(Hdr::ctrl(msg::NAK, h.op, h.iter, off, code))
                        .await?;
                }
                None => self.ctrl(Hdr::ctrl(reply, h.op, h.iter, 0, 0)).await?,
            }
        }
    }
}

/// Where the bytes of a posted WR come from.
enum PayloadSrc {
    Bytes(Bytes),
    Sbuf(u32),
    Lbuf(u32),
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_big_endian() {
        let h = Hdr {
            typ: msg::INVKEY,
            op: 2,
            flags: 3,
            iter: 0x0102_0304,
            len: 0x0506_0708,
            addr: 0x090a_0b0c_0d0e_0f10,
            rkey: 0x1112_1314,
            arg: 0x1516_1718,
        };
        let b = h.encode();
        assert_eq!(&b[..8], &[0x49, 0x57, 0x50, 0x31, 0, 5, 2, 3]);
        assert_eq!(&b[16..24], &[9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(Hdr::decode(&b), Ok(h));
        assert_eq!(Hdr::encoded_len(), b.len());
    }

    #[test]
    fn header_decoder_rejects_short_and_foreign() {
        assert_eq!(Hdr::decode(&[0; 31]), Err(HdrError::Short(31)));
        assert_eq!(Hdr::decode(&[0; 32]), Err(HdrError::Magic(0)));
        for n in 0..64 {
            let _ = Hdr::decode(&vec![0x49; n]);
        }
    }

    #[test]
    fn pattern_matches_iwpeer() {
        // iwpeer.c: (uint8_t)(i * 131u + (i >> 8) + iter * 17u + op * 59u + 1u)
        assert_eq!(pattern(1, 0, 0), 60);
        assert_eq!(pattern(1, 0, 1), 191);
        assert_eq!(
            pattern(3, 2, 256),
            ((256u64 * 131 + 1 + 34 + 177 + 1) & 0xff) as u8
        );
        let mut b = vec![0u8; 4093];
        fill(&mut b, 4, 7);
        assert_eq!(check(&b, 4, 7), None);
        b[4000] ^= 1;
        assert_eq!(check(&b, 4, 7), Some(4000));
    }
}
