//! Which RPC-over-RDMA version a connection speaks, and how the two ends agree on it
//! (draft-cel-nfsv4-rpcrdma-version-two-05 §8), as sans-IO state the engines own.
//!
//! - [`RequesterVersion`]: the probe. With [`VersionPolicy::Auto`] a requester sends one call
//!   of at most 1 KB in version 2 and nothing else until the first reply (§8: "a client MUST
//!   assume the ability to exchange only a single RPC-over-RDMA message at a time until it
//!   receives a valid non-error RPC-over-RDMA message"); a version 2 reply settles it, and
//!   RDMA2_ERR_VERS makes it fall back to version 1 on the same connection (§8.2) and
//!   remember the server in a [`VersionMemory`].
//! - [`ResponderVersion`]: the server side. It accepts the versions it was configured with,
//!   locks a connection to the version of its first valid call, and answers every client in
//!   the version the client used (§8.3).
//! - [`V2Properties`]: the transport properties of a version 2 connection (§6): what we
//!   announce in RDMA2_CONNPROP, what the peer announced, and the inline thresholds they
//!   give.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use crate::header_v2::RPCRDMA_VERSION_2;
use crate::props::{
    BackwardSupport, ConnProp, DEFAULT_RBSIZ, PropError, PropSet, PropSubset, PropVal, Property,
    ReqProp, ResProp,
};

/// A protocol version this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// RFC 8166.
    V1 = 1,
    /// draft-cel-nfsv4-rpcrdma-version-two-05.
    V2 = 2,
}

impl Version {
    /// The `rdma_vers` value.
    pub fn number(self) -> u32 {
        self as u32
    }

    /// The version with this `rdma_vers` value.
    pub fn from_number(v: u32) -> Option<Self> {
        match v {
            1 => Some(Version::V1),
            RPCRDMA_VERSION_2 => Some(Version::V2),
            _ => None,
        }
    }
}

/// What a requester offers (`--rpcrdma-version 1|2|auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VersionPolicy {
    /// Version 1 only: exactly the behaviour of a version 1 client.
    V1,
    /// Version 2 only: a server that answers RDMA2_ERR_VERS fails the connection's calls.
    V2,
    /// Probe with version 2 and fall back to version 1 (the default).
    #[default]
    Auto,
}

impl std::str::FromStr for VersionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1" => Ok(VersionPolicy::V1),
            "2" => Ok(VersionPolicy::V2),
            "auto" => Ok(VersionPolicy::Auto),
            other => Err(format!(
                "RPC-over-RDMA version {other:?}: expected 1, 2 or auto"
            )),
        }
    }
}

static DEFAULT_POLICY: std::sync::OnceLock<VersionPolicy> = std::sync::OnceLock::new();

/// Set the version policy [`crate::engine::Config::default`] gives Requesters in this process
/// (the CLI's `--rpcrdma-version`); the first call wins, later ones return `Err` with theirs.
pub fn set_default_policy(p: VersionPolicy) -> Result<(), VersionPolicy> {
    DEFAULT_POLICY.set(p)
}

/// The process's default version policy: version 1 unless [`set_default_policy`] said
/// otherwise.
pub fn default_policy() -> VersionPolicy {
    DEFAULT_POLICY.get().copied().unwrap_or(VersionPolicy::V1)
}

/// §8: the probe "can be no larger than the version 1 default inline threshold of 1024
/// bytes".
pub const PROBE_MAX: usize = 1024;

/// Servers known to speak version 1 only, by address, so that a reconnect does not probe
/// again (§8.2: "a client can avoid a possible version negotiation loop when re-establishing
/// another connection by assuming that particular server does not support RPC-over-RDMA
/// version 2"). Bounded: the oldest entry goes first.
#[derive(Debug, Clone)]
pub struct VersionMemory {
    v1_only: HashMap<IpAddr, u16>,
    order: VecDeque<(IpAddr, u16)>,
    cap: usize,
}

impl Default for VersionMemory {
    fn default() -> Self {
        VersionMemory::new(1024)
    }
}

impl VersionMemory {
    /// A memory of at most `cap` servers.
    pub fn new(cap: usize) -> Self {
        VersionMemory {
            v1_only: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Remember that the server at `ip:port` speaks version 1 only.
    pub fn remember_v1_only(&mut self, ip: IpAddr, port: u16) {
        if self.v1_only.insert(ip, port) == Some(port) {
            return;
        }
        self.order.push_back((ip, port));
        while self.order.len() > self.cap {
            if let Some((old, p)) = self.order.pop_front()
                && self.v1_only.get(&old) == Some(&p)
            {
                self.v1_only.remove(&old);
            }
        }
    }

    /// True when the server at `ip:port` was found to speak version 1 only.
    pub fn is_v1_only(&self, ip: IpAddr, port: u16) -> bool {
        self.v1_only.get(&ip) == Some(&port)
    }

    /// Servers remembered.
    pub fn len(&self) -> usize {
        self.v1_only.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.v1_only.is_empty()
    }
}

/// A [`VersionMemory`] shared by Requesters ([`crate::requester::Requester::remember_versions_in`]).
pub type SharedVersionMemory = std::sync::Arc<parking_lot::Mutex<VersionMemory>>;

/// The memory of version-1-only servers for every client of this process (cel-05 §8.2;
/// bounded, oldest first out).
pub fn process_memory() -> SharedVersionMemory {
    static MEMORY: std::sync::OnceLock<SharedVersionMemory> = std::sync::OnceLock::new();
    MEMORY.get_or_init(Default::default).clone()
}

/// Why a connection uses the version it uses (for the log line the issue asks for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Configured to speak only this version.
    Configured,
    /// The server answered the version 2 probe in version 2.
    ServerAnsweredV2,
    /// The server answered the probe with RDMA2_ERR_VERS and this range.
    ErrVers { low: u32, high: u32 },
    /// The server was remembered as version 1 only from an earlier connection.
    Remembered,
    /// The server's first call used this version (responder side).
    FirstCall,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Configured => write!(f, "configured"),
            Reason::ServerAnsweredV2 => write!(f, "the server answered the probe in version 2"),
            Reason::ErrVers { low, high } => {
                write!(f, "the server refused version 2 (supports {low}..={high})")
            }
            Reason::Remembered => write!(f, "the server refused version 2 before"),
            Reason::FirstCall => write!(f, "the client's first call"),
        }
    }
}

/// What a requester does with an RDMA2_ERR_VERS answer to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrVersOutcome {
    /// Resend the call (same XID) in this version on the same connection.
    Retry(Version),
    /// No version in common: fail the call and the connection.
    Fail,
}

/// The requester's side of §8.
#[derive(Debug, Clone)]
pub struct RequesterVersion {
    policy: VersionPolicy,
    current: Version,
    settled: Option<Reason>,
}

impl RequesterVersion {
    /// Start a connection. `remembered_v1_only`: the server refused version 2 before.
    pub fn new(policy: VersionPolicy, remembered_v1_only: bool) -> Self {
        match policy {
            VersionPolicy::V1 => RequesterVersion {
                policy,
                current: Version::V1,
                settled: Some(Reason::Configured),
            },
            VersionPolicy::Auto if remembered_v1_only => RequesterVersion {
                policy,
                current: Version::V1,
                settled: Some(Reason::Remembered),
            },
            VersionPolicy::V2 | VersionPolicy::Auto => RequesterVersion {
                policy,
                current: Version::V2,
                settled: None,
            },
        }
    }

    /// The version to send the next message in.
    pub fn current(&self) -> Version {
        self.current
    }

    /// `Some(reason)` once the version is settled; `None` while a probe is outstanding.
    pub fn settled(&self) -> Option<Reason> {
        self.settled
    }

    /// While probing, at most one message may be outstanding and it must fit in
    /// [`PROBE_MAX`] bytes (§8). `None` when there is no such limit.
    pub fn probe_limit(&self) -> Option<usize> {
        self.settled.is_none().then_some(PROBE_MAX)
    }

    /// A valid non-error reply arrived in version `vers`.
    pub fn on_reply(&mut self, vers: Version) {
        if self.settled.is_none() && vers == Version::V2 {
            self.settled = Some(Reason::ServerAnsweredV2);
        }
        if self.settled.is_none() {
            // A version 1 answer to a version 2 call is not what §8.3 lets a server do; follow
            // the server.
            self.current = vers;
            self.settled = Some(Reason::ErrVers {
                low: vers.number(),
                high: vers.number(),
            });
        }
    }

    /// RDMA2_ERR_VERS arrived, naming the range the server supports (§8.2: "the client
    /// selects a protocol version in the range of server-supported versions").
    pub fn on_err_vers(&mut self, low: u32, high: u32) -> ErrVersOutcome {
        let ours: &[Version] = match self.policy {
            VersionPolicy::V1 => &[Version::V1],
            VersionPolicy::V2 => &[Version::V2],
            VersionPolicy::Auto => &[Version::V2, Version::V1],
        };
        match ours
            .iter()
            .copied()
            .find(|v| (low..=high).contains(&v.number()) && *v != self.current)
        {
            Some(v) => {
                self.current = v;
                self.settled = Some(Reason::ErrVers { low, high });
                ErrVersOutcome::Retry(v)
            }
            None => ErrVersOutcome::Fail,
        }
    }

    /// True when the server should be remembered as version 1 only.
    pub fn learned_v1_only(&self) -> bool {
        matches!(self.settled, Some(Reason::ErrVers { high, .. }) if high < RPCRDMA_VERSION_2)
    }
}

/// What a responder does with a call of some version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallVersion {
    /// Serve it in this version (the connection is now locked to it).
    Serve(Version),
    /// Answer RDMA_ERR_VERS with this inclusive range.
    ErrVers { low: u32, high: u32 },
}

/// The responder's side of §8.
#[derive(Debug, Clone)]
pub struct ResponderVersion {
    low: Version,
    high: Version,
    locked: Option<Version>,
}

impl Default for ResponderVersion {
    /// Versions 1 and 2, as servers accept by default.
    fn default() -> Self {
        ResponderVersion::new(Version::V1, Version::V2)
    }
}

impl ResponderVersion {
    /// Accept versions `low..=high`.
    pub fn new(low: Version, high: Version) -> Self {
        ResponderVersion {
            low: low.min(high),
            high: low.max(high),
            locked: None,
        }
    }

    /// The version the connection is locked to, once a valid call arrived.
    pub fn locked(&self) -> Option<Version> {
        self.locked
    }

    /// Check a message's `rdma_vers` before decoding the rest (RFC 8166 §4.5.1 and cel-05
    /// §7.2.4: a version the receiver does not support gets ERR_VERS). Once locked, the
    /// connection keeps its version, and a message in another version is told the one
    /// version it may use.
    pub fn check(&self, vers: u32) -> CallVersion {
        let range = match self.locked {
            Some(v) => (v, v),
            None => (self.low, self.high),
        };
        match Version::from_number(vers) {
            Some(v) if (range.0..=range.1).contains(&v) => CallVersion::Serve(v),
            _ => CallVersion::ErrVers {
                low: range.0.number(),
                high: range.1.number(),
            },
        }
    }

    /// A call of version `v` decoded and will be served: lock the connection to `v` (§8.3:
    /// replies go in "the same RPC-over-RDMA protocol version that the client uses"). Returns
    /// true the first time, so the caller can log the choice.
    pub fn lock(&mut self, v: Version) -> bool {
        if self.locked.is_some() {
            return false;
        }
        self.locked = Some(v);
        true
    }
}

/// The transport properties of a version 2 connection (§6), and the inline thresholds they
/// give.
#[derive(Debug, Clone)]
pub struct V2Properties {
    /// Our receive buffer size, announced as RBSIZ.
    pub local_rbsiz: u32,
    /// Our support for backward-direction requests, announced as BRS.
    pub local_brs: BackwardSupport,
    /// The peer's RBSIZ: the largest message we may send it. §3.3: "In the absence of such a
    /// mechanism, senders MUST assume a receiver's inline threshold is 4096 bytes."
    pub peer_rbsiz: u32,
    /// The peer's BRS (§6.2.2: INLINE when not announced).
    pub peer_brs: BackwardSupport,
    /// Whether the peer's CONNPROP arrived.
    pub peer_announced: bool,
    /// We announce responder-provided Read chunks ([`crate::rrc::PROPID_RRC`]).
    pub local_rrc: bool,
    /// The peer announced them (value 1 of [`crate::rrc::PROPID_RRC`]).
    pub peer_rrc: bool,
}

impl V2Properties {
    /// Our side: receive buffers of `rbsiz` bytes and backward support `brs`. §3.3: receivers
    /// "MUST support an inline threshold of 4096 bytes", so smaller sizes are raised to it.
    pub fn new(rbsiz: u32, brs: BackwardSupport) -> Self {
        V2Properties {
            local_rbsiz: rbsiz.max(DEFAULT_RBSIZ),
            local_brs: brs,
            peer_rbsiz: DEFAULT_RBSIZ,
            peer_brs: BackwardSupport::Inline,
            peer_announced: false,
            local_rrc: false,
            peer_rrc: false,
        }
    }

    /// Announce responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02 §6:
    /// used "only when both peers support them").
    pub fn with_rrc(mut self, on: bool) -> Self {
        self.local_rrc = on;
        self
    }

    /// Both sides announced responder-provided Read chunks.
    pub fn rrc_agreed(&self) -> bool {
        self.local_rrc && self.peer_rrc
    }

    /// The RDMA2_CONNPROP we send once the version is settled (gap 4). Neither value changes
    /// during the connection, so both are in `rdma_nochg`. Its encoding is 52 bytes with the
    /// header, well inside the 1 KB a peer can receive before it knows our properties
    /// (§6.3.1).
    /// With responder-provided Read chunks announced, a third property follows (64 bytes
    /// with the header); without, the message is exactly what it was before them.
    pub fn connprop(&self) -> ConnProp {
        let mut start = vec![
            PropVal::rbsiz(self.local_rbsiz),
            PropVal::brs(self.local_brs),
        ];
        if self.local_rrc {
            start.push(PropVal {
                which: crate::rrc::PROPID_RRC,
                data: bytes::Bytes::from_static(&[0, 0, 0, 1]),
            });
        }
        let n = start.len();
        ConnProp {
            start: PropSet(start),
            nochg: PropSubset::from_positions(0..n),
        }
    }

    /// Apply the peer's RDMA2_CONNPROP or RDMA2_UPDPROP values. Unknown properties are
    /// ignored (§6.3.1: "these properties are simply ignored without any error response").
    /// A known property with a bad value is the caller's RDMA2_ERR_BAD_XDR.
    pub fn apply_peer(&mut self, set: &PropSet) -> Result<(), PropError> {
        for p in set.interpret()? {
            match p {
                Property::ReceiveBufferSize(n) => self.peer_rbsiz = n.max(DEFAULT_RBSIZ),
                Property::BackwardRequestSupport(b) => self.peer_brs = b,
                // The experimental capability (crate::rrc): 1 supported, 0 or empty not;
                // another value is not this property and is ignored like an unknown one.
                Property::Unknown { which, data } if which == crate::rrc::PROPID_RRC => {
                    match &data[..] {
                        [] | [0, 0, 0, 0, ..] => self.peer_rrc = false,
                        [0, 0, 0, 1, ..] => self.peer_rrc = true,
                        _ => {}
                    }
                }
                Property::Unknown { .. } => {}
            }
        }
        self.peer_announced = true;
        Ok(())
    }

    /// Answer the peer's RDMA2_REQPROP. Our values are fixed for the life of the connection
    /// (receive buffers are posted at their size, and we said so in `rdma_nochg`), so every
    /// requested change is rejected (§6.2: "peers MAY reject a request to change a property
    /// for any reason"), except a request for the value already in effect, which is done.
    pub fn answer_reqprop(&self, req: &ReqProp) -> ResProp {
        let mut done = PropSubset::default();
        let mut rejected = PropSubset::default();
        for (n, p) in req.want.0.iter().enumerate() {
            let same = match p.interpret() {
                Ok(Property::ReceiveBufferSize(v)) => v == self.local_rbsiz,
                Ok(Property::BackwardRequestSupport(b)) => b == self.local_brs,
                _ => false,
            };
            if same {
                done.insert(n);
            } else {
                rejected.insert(n);
            }
        }
        ResProp {
            done,
            rejected,
            other: PropSet::default(),
        }
    }

    /// Largest message we may Send to the peer.
    pub fn send_limit(&self) -> u32 {
        self.peer_rbsiz
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn auto_probes_then_settles_on_a_version_2_reply() {
        let mut r = RequesterVersion::new(VersionPolicy::Auto, false);
        assert_eq!(r.current(), Version::V2);
        assert_eq!(r.probe_limit(), Some(1024));
        r.on_reply(Version::V2);
        assert_eq!(r.settled(), Some(Reason::ServerAnsweredV2));
        assert_eq!(r.probe_limit(), None);
        assert!(!r.learned_v1_only());
    }

    #[test]
    fn auto_falls_back_to_version_1_and_remembers() {
        let mut r = RequesterVersion::new(VersionPolicy::Auto, false);
        // Linux's answer to a version 2 probe: [1, 1].
        assert_eq!(r.on_err_vers(1, 1), ErrVersOutcome::Retry(Version::V1));
        assert_eq!(r.current(), Version::V1);
        assert!(r.learned_v1_only());
        let mut mem = VersionMemory::new(2);
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        mem.remember_v1_only(ip, 20049);
        assert!(mem.is_v1_only(ip, 20049));
        assert!(!mem.is_v1_only(ip, 20050));
        let again = RequesterVersion::new(VersionPolicy::Auto, mem.is_v1_only(ip, 20049));
        assert_eq!(
            (again.current(), again.settled()),
            (Version::V1, Some(Reason::Remembered))
        );
        // Bounded: the oldest goes.
        mem.remember_v1_only(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 1);
        mem.remember_v1_only(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), 1);
        assert_eq!(mem.len(), 2);
        assert!(!mem.is_v1_only(ip, 20049));
    }

    #[test]
    fn fixed_policies_fail_without_a_common_version() {
        let mut r = RequesterVersion::new(VersionPolicy::V2, false);
        assert_eq!(r.on_err_vers(1, 1), ErrVersOutcome::Fail);
        let mut r = RequesterVersion::new(VersionPolicy::V1, false);
        assert_eq!(r.probe_limit(), None);
        assert_eq!(r.on_err_vers(2, 2), ErrVersOutcome::Fail);
    }

    #[test]
    fn responder_locks_at_the_first_call_and_answers_in_that_version() {
        let mut s = ResponderVersion::default();
        assert_eq!(
            s.check(3),
            CallVersion::ErrVers { low: 1, high: 2 },
            "unknown versions get the configured range"
        );
        assert_eq!(s.check(1), CallVersion::Serve(Version::V1));
        assert!(s.lock(Version::V1));
        assert!(!s.lock(Version::V2));
        assert_eq!(s.check(2), CallVersion::ErrVers { low: 1, high: 1 });
        let v1_only = ResponderVersion::new(Version::V1, Version::V1);
        assert_eq!(v1_only.check(2), CallVersion::ErrVers { low: 1, high: 1 });
    }

    #[test]
    fn properties_set_the_send_limit_and_answer_requests() {
        let mut ours = V2Properties::new(65536, BackwardSupport::Inline);
        assert_eq!(ours.send_limit(), 4096, "§3.3 default until the peer says");
        let peer = V2Properties::new(1024, BackwardSupport::General);
        assert_eq!(peer.local_rbsiz, 4096, "never below the §3.3 minimum");
        ours.apply_peer(&peer.connprop().start).unwrap();
        assert_eq!(ours.send_limit(), 4096);
        assert_eq!(ours.peer_brs, BackwardSupport::General);
        let big = V2Properties::new(262144, BackwardSupport::Inline);
        ours.apply_peer(&big.connprop().start).unwrap();
        assert_eq!(ours.send_limit(), 262144);
        let res = ours.answer_reqprop(&ReqProp {
            want: PropSet(vec![
                PropVal::rbsiz(65536),
                PropVal::rbsiz(8192),
                PropVal::brs(BackwardSupport::General),
            ]),
        });
        assert_eq!(res.done.positions().collect::<Vec<_>>(), vec![0]);
        assert_eq!(res.rejected.positions().collect::<Vec<_>>(), vec![1, 2]);
    }
}
