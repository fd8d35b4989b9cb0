//! Port mapper version 2 and rpcbind versions 3 and 4 (RFC 1833): protocol types and a small
//! in-memory registry served as an [`oncrpc::Program`].
//!
//! Served: PMAP v2 NULL/SET/UNSET/GETPORT/DUMP; RPCBIND v3/v4 NULL/SET/UNSET/GETADDR/DUMP/
//! GETTIME, and v4 GETVERSADDR. CALLIT/BCAST/INDIRECT, UADDR2TADDR/TADDR2UADDR, GETADDRLIST
//! and GETSTAT answer PROC_UNAVAIL. Universal addresses follow RFC 1833 §2.1 ("h1.h2.h3.h4.p1.p2",
//! IPv6 "x:x::x.p1.p2").

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{Call, Outcome, Program};
use xdr::XdrEncode;

pub use crate::xdr_util::{List, MAX_LIST};
use crate::xdr_util::{args_or_garbage, xdr_opaque, xdr_struct};

/// Port mapper / rpcbind program number.
pub const PROGRAM: u32 = 100000;
/// The well-known port (RFC 1833 §3.1).
pub const PORT: u16 = 111;
/// IPPROTO_TCP.
pub const IPPROTO_TCP: u32 = 6;
/// IPPROTO_UDP.
pub const IPPROTO_UDP: u32 = 17;
/// Decoder bound on netid / address / owner strings.
pub const MAX_STR: u32 = 1024;

/// PMAP v2 procedure numbers (RFC 1833 §3.2).
pub mod pmap_proc {
    pub const NULL: u32 = 0;
    pub const SET: u32 = 1;
    pub const UNSET: u32 = 2;
    pub const GETPORT: u32 = 3;
    pub const DUMP: u32 = 4;
    pub const CALLIT: u32 = 5;
}

/// RPCBIND v3/v4 procedure numbers (RFC 1833 §2.2).
pub mod rpcb_proc {
    pub const NULL: u32 = 0;
    pub const SET: u32 = 1;
    pub const UNSET: u32 = 2;
    pub const GETADDR: u32 = 3;
    pub const DUMP: u32 = 4;
    pub const CALLIT: u32 = 5;
    pub const GETTIME: u32 = 6;
    pub const UADDR2TADDR: u32 = 7;
    pub const TADDR2UADDR: u32 = 8;
    pub const GETVERSADDR: u32 = 9;
    pub const INDIRECT: u32 = 10;
    pub const GETADDRLIST: u32 = 11;
    pub const GETSTAT: u32 = 12;
}

xdr_struct! {
    /// `mapping` (PMAP v2).
    pub struct Mapping { pub prog: u32, pub vers: u32, pub prot: u32, pub port: u32 }
}

xdr_opaque! {
    /// An rpcbind string (`r_netid`, `r_addr`, `r_owner`).
    pub struct RpcbString, max = MAX_STR
}

xdr_struct! {
    /// `rpcb` (RPCBIND v3/v4).
    pub struct Rpcb { pub prog: u32, pub vers: u32, pub netid: RpcbString, pub addr: RpcbString, pub owner: RpcbString }
}

/// Format a socket address as an RPC universal address (RFC 1833 §2.1 / RFC 5665 §5.2.3).
pub fn uaddr(addr: SocketAddr) -> String {
    let p = addr.port();
    format!("{}.{}.{}", addr.ip(), p >> 8, p & 0xff)
}

/// Parse a universal address ("h1.h2.h3.h4.p1.p2" or "ipv6.p1.p2").
pub fn parse_uaddr(s: &str) -> Option<SocketAddr> {
    let (rest, lo) = s.rsplit_once('.')?;
    let (host, hi) = rest.rsplit_once('.')?;
    let hi: u16 = hi.parse().ok().filter(|v| *v < 256)?;
    let lo: u16 = lo.parse().ok().filter(|v| *v < 256)?;
    let ip: IpAddr = host.parse().ok()?;
    Some(SocketAddr::new(ip, (hi << 8) | lo))
}

/// The netid for a transport protocol and address family (RFC 5665 §5.1.3).
pub fn netid(prot: u32, ipv6: bool) -> Option<&'static str> {
    match (prot, ipv6) {
        (IPPROTO_TCP, false) => Some("tcp"),
        (IPPROTO_TCP, true) => Some("tcp6"),
        (IPPROTO_UDP, false) => Some("udp"),
        (IPPROTO_UDP, true) => Some("udp6"),
        _ => None,
    }
}

/// One registration in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub prog: u32,
    pub vers: u32,
    /// "tcp", "tcp6", "rdma", "rdma6", ...
    pub netid: String,
    pub addr: SocketAddr,
    pub owner: String,
}

impl Registration {
    /// Whether `other` maps the same (prog, vers, netid).
    fn same_mapping(&self, other: &Registration) -> bool {
        self.prog == other.prog && self.vers == other.vers && self.netid == other.netid
    }
}

/// The port mapper / rpcbind service: a registry of (program, version, netid) → address.
#[derive(Debug, Default)]
pub struct Portmapper {
    regs: Mutex<Vec<Registration>>,
}

impl Portmapper {
    /// An empty registry. The service registers itself when served through [`Portmapper::register_self`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Add or replace a registration (same prog, vers, netid): the server's own programs, as
    /// it starts them.
    pub fn set(&self, reg: Registration) -> bool {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        regs.retain(|r| !r.same_mapping(&reg));
        regs.push(reg);
        true
    }

    /// Add a registration unless one of the same (prog, vers, netid) exists: what a SET from
    /// the wire does. RFC 1833 §2.2.1 (RPCBPROC_SET) and §3.2 (PMAPPROC_SET): "the procedure
    /// refuses to establish a mapping if one already exists"; a program that moved UNSETs
    /// first.
    pub fn add(&self, reg: Registration) -> bool {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        if regs.iter().any(|r| r.same_mapping(&reg)) {
            return false;
        }
        regs.push(reg);
        true
    }

    /// Remove registrations of (prog, vers), restricted to `netid` when given.
    pub fn unset(&self, prog: u32, vers: u32, netid: Option<&str>) -> bool {
        let mut regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        let before = regs.len();
        regs.retain(|r| !(r.prog == prog && r.vers == vers && netid.is_none_or(|n| r.netid == n)));
        regs.len() != before
    }

    /// Register the port mapper itself (versions 2, 3 and 4) at `addr`.
    pub fn register_self(&self, addr: SocketAddr) {
        let tcp = netid(IPPROTO_TCP, addr.is_ipv6()).unwrap_or("tcp");
        for vers in 2..=4 {
            self.set(Registration {
                prog: PROGRAM,
                vers,
                netid: tcp.to_string(),
                addr,
                owner: "superuser".into(),
            });
        }
    }

    /// Every registration.
    pub fn list(&self) -> Vec<Registration> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// GETADDR lookup: exact version first; `any_version` (GETADDR semantics in RFC 1833 §2.2.1
    /// let v3 return any version's address) falls back to another version of the program.
    pub fn lookup(
        &self,
        prog: u32,
        vers: u32,
        netid: &str,
        any_version: bool,
    ) -> Option<SocketAddr> {
        let regs = self.regs.lock().unwrap_or_else(|p| p.into_inner());
        let matches = |r: &&Registration| r.prog == prog && (netid.is_empty() || r.netid == netid);
        regs.iter()
            .filter(matches)
            .find(|r| r.vers == vers)
            .or_else(|| {
                if any_version {
                    regs.iter().find(matches)
                } else {
                    None
                }
            })
            .map(|r| r.addr)
    }

    fn pmap_getport(&self, m: &Mapping) -> u32 {
        let Some(tcp4) = netid(m.prot, false) else {
            return 0;
        };
        self.lookup(m.prog, m.vers, tcp4, false)
            .or_else(|| netid(m.prot, true).and_then(|n| self.lookup(m.prog, m.vers, n, false)))
            .map_or(0, |a| u32::from(a.port()))
    }

    fn pmap_dump(&self) -> List<Mapping> {
        List(
            self.list()
                .into_iter()
                .filter_map(|r| {
                    let prot = match r.netid.as_str() {
                        "tcp" | "tcp6" => IPPROTO_TCP,
                        "udp" | "udp6" => IPPROTO_UDP,
                        _ => return None,
                    };
                    Some(Mapping {
                        prog: r.prog,
                        vers: r.vers,
                        prot,
                        port: u32::from(r.addr.port()),
                    })
                })
                .collect(),
        )
    }

    fn rpcb_dump(&self) -> List<Rpcb> {
        List(
            self.list()
                .into_iter()
                .map(|r| Rpcb {
                    prog: r.prog,
                    vers: r.vers,
                    netid: RpcbString(Bytes::from(r.netid)),
                    addr: RpcbString(Bytes::from(uaddr(r.addr))),
                    owner: RpcbString(Bytes::from(r.owner)),
                })
                .collect(),
        )
    }

    fn handle(&self, call: &Call) -> Outcome {
        let vers = call.header.vers;
        let proc_ = call.header.proc_;
        let mut dec = call.args_decoder();
        let mut enc = call.reply_encoder();
        // Only local or loopback peers may change registrations (rpcbind's rule).
        let privileged = call.context.peer.is_none_or(|p| p.ip().is_loopback());
        if vers == 2 {
            match proc_ {
                pmap_proc::NULL => {}
                pmap_proc::SET => {
                    let m = args_or_garbage!(dec, Mapping);
                    let ok = privileged
                        && u16::try_from(m.port).is_ok()
                        && netid(m.prot, false).is_some()
                        && self.add(Registration {
                            prog: m.prog,
                            vers: m.vers,
                            netid: netid(m.prot, false).unwrap_or("tcp").into(),
                            addr: SocketAddr::new(
                                IpAddr::from([0, 0, 0, 0]),
                                u16::try_from(m.port).unwrap_or(0),
                            ),
                            owner: "unknown".into(),
                        });
                    enc.put_bool(ok);
                }
                pmap_proc::UNSET => {
                    let m = args_or_garbage!(dec, Mapping);
                    let ok = privileged && self.unset(m.prog, m.vers, None);
                    enc.put_bool(ok);
                }
                pmap_proc::GETPORT => {
                    let m = args_or_garbage!(dec, Mapping);
                    enc.put_u32(self.pmap_getport(&m));
                }
                pmap_proc::DUMP => {
                    let _ = args_or_garbage!(dec, crate::xdr_util::Void);
                    self.pmap_dump().encode(&mut enc);
                }
                _ => return Outcome::ProcUnavail,
            }
        } else {
            match proc_ {
                rpcb_proc::NULL => {}
                rpcb_proc::SET => {
                    let r = args_or_garbage!(dec, Rpcb);
                    let addr = std::str::from_utf8(&r.addr.0).ok().and_then(parse_uaddr);
                    let netid = String::from_utf8_lossy(&r.netid.0).into_owned();
                    let ok = match addr {
                        Some(addr) if privileged => self.add(Registration {
                            prog: r.prog,
                            vers: r.vers,
                            netid,
                            addr,
                            owner: String::from_utf8_lossy(&r.owner.0).into_owned(),
                        }),
                        _ => false,
                    };
                    enc.put_bool(ok);
                }
                rpcb_proc::UNSET => {
                    let r = args_or_garbage!(dec, Rpcb);
                    let netid = String::from_utf8_lossy(&r.netid.0).into_owned();
                    let n = (!netid.is_empty()).then_some(netid.as_str());
                    enc.put_bool(privileged && self.unset(r.prog, r.vers, n));
                }
                rpcb_proc::GETADDR | rpcb_proc::GETVERSADDR
                    if proc_ == rpcb_proc::GETADDR || vers == 4 =>
                {
                    let r = args_or_garbage!(dec, Rpcb);
                    let netid = String::from_utf8_lossy(&r.netid.0).into_owned();
                    // RFC 1833 §2.2.1: GETVERSADDR wants exactly that version; GETADDR may
                    // return another version's address if the requested one is absent.
                    let any = proc_ == rpcb_proc::GETADDR;
                    let mut addr = self.lookup(r.prog, r.vers, &netid, any);
                    if let Some(a) = addr.as_mut()
                        && a.ip().is_unspecified()
                        && let Some(local) = call.context.local
                    {
                        a.set_ip(local.ip());
                    }
                    let s = addr.map(uaddr).unwrap_or_default();
                    enc.put_string(s.as_bytes());
                }
                rpcb_proc::DUMP => {
                    let _ = args_or_garbage!(dec, crate::xdr_util::Void);
                    self.rpcb_dump().encode(&mut enc);
                }
                rpcb_proc::GETTIME => {
                    let _ = args_or_garbage!(dec, crate::xdr_util::Void);
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    enc.put_u32(u32::try_from(now).unwrap_or(u32::MAX));
                }
                _ => return Outcome::ProcUnavail,
            }
        }
        Outcome::Success(enc.finish())
    }
}

/// The port mapper served as an RPC program (versions 2 to 4).
#[derive(Debug, Clone)]
pub struct PortmapProgram(pub Arc<Portmapper>);

impl Program for PortmapProgram {
    fn program(&self) -> u32 {
        PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (2, 4)
    }
    fn name(&self) -> &'static str {
        "portmapper"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let out = self.0.handle(&call);
        Box::pin(async move { out })
    }
}
