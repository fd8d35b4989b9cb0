//! `oxrdma conform rdma://HOST:PORT`: a black-box conformance suite for RPC-over-RDMA
//! servers (issue 19). Its own requester ([`link`]) sends what each case needs, well formed
//! or not, and checks what comes back against the MUSTs of RFC 8166 (version 1), RFC 8797
//! (connection private data), draft-cel-nfsv4-rpcrdma-version-two-05 (version 2) and, when the
//! server answers NFS, RFC 8267.
//!
//! - [`link`]: one queue pair on `verbs` (soft-iWARP, or rdma-core in builds with that
//!   feature, whichever [`verbs::Device`] the caller gives), raw Sends, receive buffers of the
//!   size we advertise, memory for chunks.
//! - [`msg`]: RPC calls, transport headers of any version, NFSv3 LOOKUP/READ.
//! - [`v1`], [`v2`], [`nfs`]: the cases, each with its citation.
//! - [`report`]: the table and JUnit XML.
//!
//! Every case waits at most [`ConformConfig::wait`] for each reply and four times that in
//! all; every case that sends something malformed does so on a connection of its own, made
//! for it and closed after it, so a server that drops the connection loses nothing else.

pub mod link;
pub mod msg;
pub mod nfs;
pub mod report;
pub mod v1;
pub mod v2;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use verbs::Device;

pub use link::{Link, LinkOpts, Received};
pub use report::{junit_xml, table};

/// Errors that stop the suite (a case's own failure is an [`Outcome::Fail`], not this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformError {
    /// A verbs call failed.
    #[error("verbs: {0}")]
    Verbs(#[from] verbs::VerbsError),
    /// A bounded wait ran out.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// A transport-level failure outside a case's expectations.
    #[error("{0}")]
    Transport(String),
    /// A bad target or option.
    #[error("{0}")]
    Config(String),
}

/// Silence on a new connection before [`Link::nudge`].
const NUDGE_AFTER: Duration = Duration::from_secs(1);

/// What the suite is run against, and how.
#[derive(Debug, Clone)]
pub struct ConformConfig {
    /// The server's RPC-over-RDMA address.
    pub target: SocketAddr,
    /// The RPC program whose NULL procedure the transport cases call (NFS by default).
    pub prog: u32,
    /// Its version.
    pub vers: u32,
    /// How long to wait for each reply.
    pub wait: Duration,
    /// Credits each call asks for.
    pub credits: u32,
    /// The NFS binding cases: where MOUNT listens (TCP) and what to mount; `None` makes
    /// them not applicable.
    pub nfs: Option<NfsTarget>,
    /// Only the cases whose id contains one of these (all when empty).
    pub only: Vec<String>,
}

impl ConformConfig {
    /// Defaults against `target`: NFSv3's NULL, 5 s per reply, 32 credits asked.
    pub fn new(target: SocketAddr) -> Self {
        ConformConfig {
            target,
            prog: 100_003,
            vers: 3,
            wait: Duration::from_secs(5),
            credits: 32,
            nfs: None,
            only: Vec::new(),
        }
    }
}

/// Parse `rdma://HOST:PORT` (or a bare `HOST:PORT`).
pub fn parse_target(s: &str) -> Result<SocketAddr, ConformError> {
    let rest = s.strip_prefix("rdma://").unwrap_or(s);
    let rest = rest.trim_end_matches('/');
    use std::net::ToSocketAddrs;
    rest.to_socket_addrs()
        .map_err(|e| ConformError::Config(format!("{s}: {e}")))?
        .next()
        .ok_or_else(|| ConformError::Config(format!("{s}: no address")))
}

/// Where the NFS binding cases find a file handle.
#[derive(Debug, Clone)]
pub struct NfsTarget {
    /// MOUNT v3 over TCP.
    pub mount: SocketAddr,
    /// The export path to MNT.
    pub export: String,
    /// A regular file in the export's root the READ cases read (at least 8 KiB helps; shorter
    /// files make the cases that need more not applicable). Only read, never written.
    pub file: Option<String>,
}

/// A case's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Pass,
    Fail,
    NotApplicable,
}

impl Outcome {
    /// How the table prints it.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::NotApplicable => "n/a",
        }
    }
}

/// One case as run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseResult {
    pub id: &'static str,
    /// The requirement's source: `RFC 8166 §4.5.1`, `cel-05 §8.2`, ...
    pub cite: &'static str,
    pub title: &'static str,
    pub outcome: Outcome,
    /// What was seen.
    pub detail: String,
    pub seconds: f64,
}

/// What a case function returns.
pub type Verdict = (Outcome, String);

/// Shorthands for case functions.
pub fn pass(s: impl Into<String>) -> Verdict {
    (Outcome::Pass, s.into())
}
pub fn fail(s: impl Into<String>) -> Verdict {
    (Outcome::Fail, s.into())
}
pub fn na(s: impl Into<String>) -> Verdict {
    (Outcome::NotApplicable, s.into())
}

/// A case's static description.
#[derive(Debug, Clone, Copy)]
pub struct CaseInfo {
    pub id: &'static str,
    pub cite: &'static str,
    pub title: &'static str,
}

/// What the suite learned before and while running, shared by the cases.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// The credits the server granted in its first reply.
    pub grant: Option<u32>,
    /// The server's RFC 8797 private data (decoded), if it sent any.
    pub peer_private: Option<rpcrdma::privdata::PrivateData>,
    /// Raw length of the private data the server sent.
    pub peer_private_len: usize,
    /// The versions the server named in its answer to the version 2 probe (`None`: not
    /// probed or no answer).
    pub v2_range: Option<(u32, u32)>,
    /// The server answered a version 2 call in version 2.
    pub v2: bool,
    /// NFS: the export's root handle and the file (handle, size) when found.
    pub nfs_root: Option<Vec<u8>>,
    pub nfs_file: Option<(Vec<u8>, u64)>,
    /// Why the NFS cases cannot run, when they cannot.
    pub nfs_missing: Option<String>,
}

/// The context every case runs in.
pub struct Ctx {
    pub dev: Device,
    pub cfg: ConformConfig,
    pub facts: Facts,
    xid: AtomicU32,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("cfg", &self.cfg)
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// A fresh XID.
    pub fn xid(&self) -> u32 {
        self.xid.fetch_add(1, Ordering::Relaxed)
    }

    /// A new connection with the default options.
    pub async fn connect(&self) -> Result<Link, String> {
        self.connect_with(&LinkOpts::default()).await
    }

    /// A new connection.
    pub async fn connect_with(&self, o: &LinkOpts) -> Result<Link, String> {
        Link::connect(&self.dev, self.cfg.target, o)
            .await
            .map_err(|e| format!("connect: {e}"))
    }

    /// Send one message and wait for the next one back.
    pub async fn exchange(&self, link: &mut Link, m: Bytes) -> Result<Bytes, String> {
        link.send(m, self.cfg.wait)
            .await
            .map_err(|e| format!("send: {e}"))?;
        self.next(link).await
    }

    /// The next received message, or why none came. On a connection that has received
    /// nothing yet, one second of silence gets a nudge ([`Link::nudge`]) before the rest of
    /// the wait.
    pub async fn next(&self, link: &mut Link) -> Result<Bytes, String> {
        let first = NUDGE_AFTER.min(self.cfg.wait);
        let mut r = if link.received() == 0 {
            link.recv(first).await
        } else {
            link.recv(self.cfg.wait).await
        };
        if link.received() == 0 && matches!(r, Ok(Received::Timeout)) {
            tracing::info!("conform: no answer within {first:?} on a new connection: nudging");
            if let Err(e) = link.nudge() {
                return Err(format!("nudge: {e}"));
            }
            r = link.recv(self.cfg.wait.saturating_sub(first)).await;
        }
        match r {
            Ok(Received::Msg(b)) => Ok(b),
            Ok(Received::Timeout) => Err(format!("no reply within {:?}", self.cfg.wait)),
            Ok(Received::Failed(s)) => Err(format!(
                "the receive completed with {s:?} (connection broken, or a message longer than \
                 our {}-byte receive buffer)",
                link.recv_size()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// An RPC NULL call of the configured program as its Payload stream.
    pub fn null_call(&self, xid: u32) -> Vec<u8> {
        msg::rpc_call(xid, self.cfg.prog, self.cfg.vers, 0, false, &[])
    }
}

/// Every case, in the order they run.
pub fn cases() -> Vec<CaseInfo> {
    let mut v = v1::CASES.to_vec();
    v.extend_from_slice(v2::CASES);
    v.extend_from_slice(nfs::CASES);
    v
}

async fn run_one(ctx: &mut Ctx, c: &CaseInfo) -> Verdict {
    if let Some(v) = v1::run(ctx, c.id).await {
        return v;
    }
    if let Some(v) = v2::run(ctx, c.id).await {
        return v;
    }
    if let Some(v) = nfs::run(ctx, c.id).await {
        return v;
    }
    fail(format!("no such case {}", c.id))
}

/// What the suite learns before the cases: that the server answers at all (one NULL call
/// in a Short message), its credit grant and private data, and for NFS the file handles.
async fn discover(ctx: &mut Ctx) -> Result<(), ConformError> {
    let mut link = ctx.connect().await.map_err(ConformError::Transport)?;
    ctx.facts.peer_private = link.peer_private;
    ctx.facts.peer_private_len = link.peer_private_raw.len();
    let xid = ctx.xid();
    let call = msg::v1(
        xid,
        ctx.cfg.credits,
        rpcrdma::header::Body::Msg(Default::default()),
        &ctx.null_call(xid),
    );
    let r = ctx
        .exchange(&mut link, call)
        .await
        .map_err(|e| ConformError::Transport(format!("the first NULL call: {e}")))?;
    ctx.facts.grant = msg::fixed(&r).map(|f| f.credits);
    if ctx.cfg.nfs.is_some() {
        nfs::discover(ctx, &mut link).await;
    } else {
        ctx.facts.nfs_missing = Some("no NFS target given (--mount)".into());
    }
    link.close().await;
    Ok(())
}

/// Run the suite. `Err` only when the server cannot be reached or never answers.
pub async fn run(dev: Device, cfg: ConformConfig) -> Result<Vec<CaseResult>, ConformError> {
    let mut ctx = Ctx {
        dev,
        cfg,
        facts: Facts::default(),
        xid: AtomicU32::new(rand::random::<u32>() | 1),
    };
    discover(&mut ctx).await?;
    let mut out = Vec::new();
    for c in cases() {
        if !ctx.cfg.only.is_empty() && !ctx.cfg.only.iter().any(|o| c.id.contains(o.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        let bound = ctx.cfg.wait * 4;
        let (outcome, detail) = match tokio::time::timeout(bound, run_one(&mut ctx, &c)).await {
            Ok(v) => v,
            Err(_) => fail(format!("the case did not finish within {bound:?}")),
        };
        tracing::info!(case = c.id, ?outcome, %detail, "conform");
        out.push(CaseResult {
            id: c.id,
            cite: c.cite,
            title: c.title,
            outcome,
            detail,
            seconds: t0.elapsed().as_secs_f64(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_the_scheme() {
        assert_eq!(
            parse_target("rdma://127.0.0.1:20049").unwrap(),
            "127.0.0.1:20049".parse().unwrap()
        );
        assert_eq!(
            parse_target("127.0.0.1:1/").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert!(parse_target("rdma://nohost").is_err());
    }

    #[test]
    fn case_ids_are_unique_and_cited() {
        let c = cases();
        let mut ids: Vec<_> = c.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), c.len());
        assert!(c.iter().all(|c| c.cite.contains('§')));
    }
}
