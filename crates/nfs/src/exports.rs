//! Exports as exports(5) describes them: which directories are served, to which clients, with
//! which options.
//!
//! The file format is Linux's: one export per line, the path first, then client specifications
//! each with an optional parenthesised option list (`/srv/data 10.0.0.0/8(rw) *(ro)`); `#`
//! starts a comment, a trailing `\` continues a line, and a path with spaces can be quoted. An
//! option list right after the path (`/srv -ro host1 host2`) gives defaults for every client of
//! the line, as `exportfs` reads it.
//!
//! Clients are an IP address, an IPv4 or IPv6 network in CIDR form (or with a dotted mask), a
//! host name (resolved when the file is read), or `*` for everybody. When several
//! specifications of one export match a client, the most specific kind wins (a single host,
//! then a network, then `*`), and within a kind the first listed, as exports(5) orders them.
//! Host-name wildcards (`*.example.com`) and netgroups need reverse name lookups this server
//! does not make: they are refused with a message rather than silently matching nothing.
//!
//! Options: `ro`/`rw`, `root_squash` (the default)/`no_root_squash`/`all_squash`,
//! `anonuid=N`/`anongid=N`, `sec=sys`, `fsid=N` (or `fsid=root`/`fsid=0` for the NFSv4
//! pseudo-root), `secure` (the default)/`insecure`. Options that only tune Linux's own server
//! (`sync`, `async`, `no_subtree_check`, `subtree_check`, `wdelay`, `no_wdelay`, `hide`,
//! `nohide`, `crossmnt`, `no_acl`) are accepted and have no effect; any other option is an
//! error naming its line.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

/// How a caller's identity is mapped (exports(5) "User ID Mapping").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Squash {
    /// `root_squash`: uid 0 and gid 0 become the anonymous ids (the default).
    Root,
    /// `no_root_squash`: identities are taken as sent.
    None,
    /// `all_squash`: every caller is the anonymous user.
    All,
}

/// The options of one client specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// `ro`: every modifying procedure gets NFS3ERR_ROFS.
    pub read_only: bool,
    pub squash: Squash,
    /// `anonuid` (default 65534).
    pub anon_uid: u32,
    /// `anongid` (default 65534).
    pub anon_gid: u32,
    /// `secure`: calls must come from a source port below 1024 (the default).
    pub secure: bool,
    /// `fsid=N`: the file-system id clients see instead of the one derived from the device.
    pub fsid: Option<u64>,
}

impl Default for ClientOptions {
    /// exports(5)'s defaults: `ro,root_squash,secure,anonuid=65534,anongid=65534`.
    fn default() -> Self {
        ClientOptions {
            read_only: true,
            squash: Squash::Root,
            anon_uid: 65534,
            anon_gid: 65534,
            secure: true,
            fsid: None,
        }
    }
}

impl ClientOptions {
    /// Map a caller's uid, gid and groups as these options say.
    pub fn map_identity(&self, uid: u32, gid: u32, gids: &[u32]) -> (u32, u32, Vec<u32>) {
        match self.squash {
            Squash::None => (uid, gid, gids.to_vec()),
            Squash::All => (self.anon_uid, self.anon_gid, Vec::new()),
            Squash::Root => (
                if uid == 0 { self.anon_uid } else { uid },
                if gid == 0 { self.anon_gid } else { gid },
                gids.iter()
                    .map(|&g| if g == 0 { self.anon_gid } else { g })
                    .collect(),
            ),
        }
    }

    /// The option list as exports(5) writes it (for EXPORT listings and logs).
    pub fn describe(&self) -> String {
        let mut v = vec![
            if self.read_only { "ro" } else { "rw" }.to_string(),
            match self.squash {
                Squash::Root => "root_squash",
                Squash::None => "no_root_squash",
                Squash::All => "all_squash",
            }
            .to_string(),
            if self.secure { "secure" } else { "insecure" }.to_string(),
        ];
        if self.anon_uid != 65534 {
            v.push(format!("anonuid={}", self.anon_uid));
        }
        if self.anon_gid != 65534 {
            v.push(format!("anongid={}", self.anon_gid));
        }
        if let Some(f) = self.fsid {
            v.push(format!("fsid={f}"));
        }
        v.join(",")
    }
}

/// Who a client specification matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientSpec {
    /// `*`.
    Anyone,
    /// One address.
    Host(IpAddr),
    /// A host name and the addresses it resolved to when the file was read.
    Named { name: String, addrs: Vec<IpAddr> },
    /// A network: address and prefix length.
    Network { addr: IpAddr, prefix: u8 },
}

impl ClientSpec {
    /// Precedence of exports(5): a single host before a network before `*`.
    fn rank(&self) -> u8 {
        match self {
            ClientSpec::Host(_) | ClientSpec::Named { .. } => 0,
            ClientSpec::Network { .. } => 1,
            ClientSpec::Anyone => 2,
        }
    }

    /// True when `ip` is one of this specification's clients.
    pub fn matches(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match self {
            ClientSpec::Anyone => true,
            ClientSpec::Host(a) => canonical(*a) == ip,
            ClientSpec::Named { addrs, .. } => addrs.iter().any(|a| canonical(*a) == ip),
            ClientSpec::Network { addr, prefix } => in_network(ip, canonical(*addr), *prefix),
        }
    }
}

impl std::fmt::Display for ClientSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientSpec::Anyone => write!(f, "*"),
            ClientSpec::Host(a) => write!(f, "{a}"),
            ClientSpec::Named { name, .. } => write!(f, "{name}"),
            ClientSpec::Network { addr, prefix } => write!(f, "{addr}/{prefix}"),
        }
    }
}

/// IPv4 clients seen through an IPv6 socket as `::ffff:a.b.c.d` are IPv4 clients.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// One client specification with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRule {
    pub spec: ClientSpec,
    pub options: ClientOptions,
}

/// One exported directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportEntry {
    /// The path as written (what clients mount and EXPORT lists).
    pub path: PathBuf,
    pub clients: Vec<ClientRule>,
}

impl ExportEntry {
    /// The rule that applies to a client at `ip`, if any (exports(5) precedence).
    pub fn rule_for(&self, ip: IpAddr) -> Option<&ClientRule> {
        self.clients
            .iter()
            .filter(|r| r.spec.matches(ip))
            .min_by_key(|r| r.spec.rank())
    }

    /// Whether a call from `peer` may use this export: a rule matches, and with `secure` the
    /// source port is below 1024. `Err` says why not, for the log line.
    pub fn admit(&self, peer: SocketAddr) -> Result<&ClientRule, Refusal> {
        let rule = self.rule_for(peer.ip()).ok_or(Refusal::NotListed)?;
        if rule.options.secure && peer.port() >= 1024 {
            return Err(Refusal::InsecurePort(peer.port()));
        }
        Ok(rule)
    }
}

/// Why a client was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No client specification of the export matches the client's address.
    #[error("not in the export's client list")]
    NotListed,
    /// The export is `secure` and the call came from this unprivileged port.
    #[error("source port {0} is not below 1024 and the export is `secure`")]
    InsecurePort(u16),
}

/// A mistake in an exports file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {what}")]
pub struct ExportsError {
    pub file: String,
    pub line: usize,
    pub what: String,
}

/// Every export of a file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exports {
    pub entries: Vec<ExportEntry>,
}

impl Exports {
    /// Read and parse an exports file; host names are resolved now.
    pub fn load(path: &Path) -> Result<Self, ExportsError> {
        let text = std::fs::read_to_string(path).map_err(|e| ExportsError {
            file: path.display().to_string(),
            line: 0,
            what: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string(), &resolve_host)
    }

    /// Parse exports(5) text. `resolve` turns a host name into addresses.
    pub fn parse(
        text: &str,
        file: &str,
        resolve: &dyn Fn(&str) -> Option<Vec<IpAddr>>,
    ) -> Result<Self, ExportsError> {
        let mut entries: Vec<ExportEntry> = Vec::new();
        for (line_no, line) in logical_lines(text) {
            let err = |what: String| ExportsError {
                file: file.to_string(),
                line: line_no,
                what,
            };
            let words = split_words(&line).map_err(err)?;
            let Some((path, rest)) = words.split_first() else {
                continue;
            };
            if !path.starts_with('/') {
                return Err(err(format!("export path {path:?} is not absolute")));
            }
            let mut defaults = ClientOptions::default();
            let mut clients = Vec::new();
            for w in rest {
                if let Some(opts) = w.strip_prefix('-') {
                    apply_options(&mut defaults, opts).map_err(err)?;
                    continue;
                }
                let (who, opts) = match w.find('(') {
                    Some(i) => {
                        let Some(inner) = w[i + 1..].strip_suffix(')') else {
                            return Err(err(format!("unclosed option list in {w:?}")));
                        };
                        (&w[..i], Some(inner))
                    }
                    None => (w.as_str(), None),
                };
                let mut options = defaults.clone();
                if let Some(o) = opts {
                    apply_options(&mut options, o).map_err(err)?;
                }
                // `/path (rw)` with a space: options for everybody (exports(5) warns it is
                // easy to write by mistake, and means `*`).
                let spec = if who.is_empty() {
                    ClientSpec::Anyone
                } else {
                    parse_client(who, resolve).map_err(err)?
                };
                clients.push(ClientRule { spec, options });
            }
            if clients.is_empty() {
                // exports(5): with no client list the directory is exported to everybody
                // (with the defaults), which exportfs warns about; do the same.
                clients.push(ClientRule {
                    spec: ClientSpec::Anyone,
                    options: defaults,
                });
            }
            let path = match path.trim_end_matches('/') {
                "" => PathBuf::from("/"),
                p => PathBuf::from(p),
            };
            if entries.iter().any(|e| e.path == path) {
                return Err(err(format!("{} is exported twice", path.display())));
            }
            entries.push(ExportEntry { path, clients });
        }
        Ok(Exports { entries })
    }

    /// The export serving `dir` (an absolute path a client asked to mount): the one whose path
    /// is the longest prefix of it, and the part of `dir` below that export.
    pub fn find(&self, dir: &str) -> Option<(&ExportEntry, PathBuf)> {
        let dir = Path::new(dir);
        self.entries
            .iter()
            .filter_map(|e| dir.strip_prefix(&e.path).ok().map(|rest| (e, rest)))
            .max_by_key(|(e, _)| e.path.components().count())
            .map(|(e, rest)| (e, rest.to_path_buf()))
    }
}

fn resolve_host(name: &str) -> Option<Vec<IpAddr>> {
    let addrs: Vec<IpAddr> = (name, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    (!addrs.is_empty()).then_some(addrs)
}

/// Lines with comments removed and `\` continuations joined, numbered from 1 by where they
/// start.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        if cur.is_empty() {
            start = i + 1;
        }
        let line = match raw.find('#') {
            Some(j) => &raw[..j],
            None => raw,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                if !cur.trim().is_empty() {
                    out.push((start, std::mem::take(&mut cur)));
                } else {
                    cur.clear();
                }
            }
        }
    }
    if !cur.trim().is_empty() {
        out.push((start, cur));
    }
    out
}

/// Words separated by blanks; a double-quoted word may hold blanks.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut w = String::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some(ch) => w.push(ch),
                    None => return Err("unterminated quote".into()),
                }
            }
        } else {
            while let Some(&ch) = chars.peek() {
                if ch.is_whitespace() {
                    break;
                }
                w.push(ch);
                chars.next();
            }
        }
        out.push(w);
    }
    Ok(out)
}

fn apply_options(o: &mut ClientOptions, list: &str) -> Result<(), String> {
    for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let number = |v: Option<&str>| -> Result<u32, String> {
            v.and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{key} needs a number: {opt:?}"))
        };
        match key {
            "ro" => o.read_only = true,
            "rw" => o.read_only = false,
            "root_squash" => o.squash = Squash::Root,
            "no_root_squash" => o.squash = Squash::None,
            "all_squash" => o.squash = Squash::All,
            "no_all_squash" => {
                if o.squash == Squash::All {
                    o.squash = Squash::Root;
                }
            }
            "anonuid" => o.anon_uid = number(value)?,
            "anongid" => o.anon_gid = number(value)?,
            "secure" => o.secure = true,
            "insecure" => o.secure = false,
            "sec" => {
                for flavor in value.unwrap_or("").split(':') {
                    if flavor != "sys" {
                        return Err(format!(
                            "sec={flavor}: only sec=sys (AUTH_SYS) is served; RPCSEC_GSS is not implemented"
                        ));
                    }
                }
            }
            "fsid" => {
                o.fsid = Some(match value {
                    Some("root") => 0,
                    Some(v) => v
                        .parse()
                        .map_err(|_| format!("fsid={v}: only numeric fsids are supported"))?,
                    None => return Err("fsid needs a value".into()),
                });
            }
            "sync" | "async" | "no_subtree_check" | "subtree_check" | "wdelay" | "no_wdelay"
            | "hide" | "nohide" | "crossmnt" | "no_acl" => {}
            other => return Err(format!("unknown export option {other:?}")),
        }
    }
    Ok(())
}

fn parse_client(
    who: &str,
    resolve: &dyn Fn(&str) -> Option<Vec<IpAddr>>,
) -> Result<ClientSpec, String> {
    if who == "*" {
        return Ok(ClientSpec::Anyone);
    }
    if let Some((addr, bits)) = who.split_once('/') {
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{who:?}: not an address/prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match bits.parse::<u8>() {
            Ok(p) if p <= max => p,
            Ok(_) => return Err(format!("{who:?}: prefix longer than {max}")),
            Err(_) => {
                // A dotted mask, 255.255.255.0.
                let m: std::net::Ipv4Addr = bits
                    .parse()
                    .map_err(|_| format!("{who:?}: not an address/prefix"))?;
                let m = u32::from(m);
                if m.leading_ones() + m.trailing_zeros() != 32 || !addr.is_ipv4() {
                    return Err(format!("{who:?}: not a contiguous netmask"));
                }
                u8::try_from(m.leading_ones()).unwrap_or(32)
            }
        };
        return Ok(ClientSpec::Network { addr, prefix });
    }
    if let Ok(a) = who.parse::<IpAddr>() {
        return Ok(ClientSpec::Host(a));
    }
    if who.starts_with('@') {
        return Err(format!("{who:?}: netgroups are not supported"));
    }
    if who.contains(['*', '?', '[']) {
        return Err(format!(
            "{who:?}: host-name wildcards need reverse name lookups, which this server does not make; use an address, a network or *"
        ));
    }
    match resolve(who) {
        Some(addrs) => Ok(ClientSpec::Named {
            name: who.to_string(),
            addrs,
        }),
        None => Err(format!("{who:?}: host name does not resolve")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn no_dns(_: &str) -> Option<Vec<IpAddr>> {
        None
    }

    fn parse(text: &str) -> Result<Exports, ExportsError> {
        let dns = |n: &str| (n == "client.lab").then(|| vec!["192.0.2.7".parse().unwrap()]);
        Exports::parse(text, "exports", &dns)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_exports_5_format_parses() {
        let e = parse(
            "# comment\n\
             /srv/data  10.0.0.0/8(rw,no_root_squash,insecure) *(ro) \\\n\
             \x20   client.lab(rw,all_squash,anonuid=1000,anongid=100)\n\
             \n\
             \"/srv/with space\" -rw,insecure 192.0.2.0/255.255.255.0 ::1(ro,fsid=7)\n\
             /pub\n",
        )
        .unwrap();
        assert_eq!(e.entries.len(), 3);
        let d = &e.entries[0];
        assert_eq!(d.path, PathBuf::from("/srv/data"));
        assert_eq!(d.clients.len(), 3);
        assert_eq!(
            d.clients[0].spec,
            ClientSpec::Network {
                addr: ip("10.0.0.0"),
                prefix: 8
            }
        );
        assert!(!d.clients[0].options.read_only);
        assert_eq!(d.clients[0].options.squash, Squash::None);
        assert!(!d.clients[0].options.secure);
        assert!(d.clients[1].options.read_only);
        assert_eq!(d.clients[2].options.squash, Squash::All);
        assert_eq!(
            (d.clients[2].options.anon_uid, d.clients[2].options.anon_gid),
            (1000, 100)
        );
        let s = &e.entries[1];
        assert_eq!(s.path, PathBuf::from("/srv/with space"));
        // `-rw,insecure` are the line's defaults; `::1(ro,...)` overrides one of them.
        assert!(!s.clients[0].options.read_only && !s.clients[0].options.secure);
        assert_eq!(
            s.clients[0].spec,
            ClientSpec::Network {
                addr: ip("192.0.2.0"),
                prefix: 24
            }
        );
        assert!(s.clients[1].options.read_only && !s.clients[1].options.secure);
        assert_eq!(s.clients[1].options.fsid, Some(7));
        // No client list: everybody, with the defaults (ro, root_squash, secure).
        assert_eq!(e.entries[2].clients[0].spec, ClientSpec::Anyone);
        assert_eq!(e.entries[2].clients[0].options, ClientOptions::default());
    }

    #[test]
    fn the_most_specific_client_specification_wins() {
        let e = parse("/x *(ro) 10.1.0.0/16(rw) 10.1.2.3(rw,no_root_squash)").unwrap();
        let x = &e.entries[0];
        let rule = |s| x.rule_for(ip(s)).map(|r| r.options.clone());
        assert_eq!(rule("10.1.2.3").unwrap().squash, Squash::None);
        assert!(!rule("10.1.9.9").unwrap().read_only);
        assert!(rule("192.0.2.1").unwrap().read_only);
        // An IPv4 client through an IPv6 socket.
        assert_eq!(
            x.rule_for(IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped()))
                .unwrap()
                .options
                .squash,
            Squash::None
        );
        let only = parse("/y 127.0.0.0/8(rw,insecure)").unwrap();
        assert!(only.entries[0].rule_for(ip("192.0.2.1")).is_none());
        assert!(only.entries[0].rule_for(ip("127.9.9.9")).is_some());
    }

    #[test]
    fn secure_exports_refuse_unprivileged_ports() {
        let e = parse("/x 127.0.0.1(rw) 127.0.0.2(rw,insecure)").unwrap();
        let x = &e.entries[0];
        assert!(x.admit("127.0.0.1:700".parse().unwrap()).is_ok());
        assert_eq!(
            x.admit("127.0.0.1:40000".parse().unwrap()).unwrap_err(),
            Refusal::InsecurePort(40000)
        );
        assert!(x.admit("127.0.0.2:40000".parse().unwrap()).is_ok());
        assert_eq!(
            x.admit("127.0.0.3:700".parse().unwrap()).unwrap_err(),
            Refusal::NotListed
        );
    }

    #[test]
    fn squashing_maps_identities() {
        let mut o = ClientOptions::default();
        assert_eq!(
            o.map_identity(0, 0, &[0, 5]),
            (65534, 65534, vec![65534, 5])
        );
        assert_eq!(o.map_identity(1000, 100, &[5]), (1000, 100, vec![5]));
        o.squash = Squash::All;
        o.anon_uid = 7;
        assert_eq!(o.map_identity(1000, 100, &[5]), (7, 65534, vec![]));
        o.squash = Squash::None;
        assert_eq!(o.map_identity(0, 0, &[]), (0, 0, vec![]));
    }

    #[test]
    fn mistakes_name_their_line() {
        let bad = [
            ("/x\n/y *(rw,bogus)\n", 2, "unknown export option"),
            ("relative *(rw)", 1, "not absolute"),
            ("/x *(rw", 1, "unclosed"),
            ("/x 10.0.0.0/33", 1, "prefix longer"),
            ("/x 10.0.0.0/255.0.255.0", 1, "contiguous"),
            ("/x *.example.com(rw)", 1, "wildcards"),
            ("/x @group(rw)", 1, "netgroups"),
            ("/x nowhere.invalid(rw)", 1, "does not resolve"),
            ("/x *(sec=krb5)", 1, "only sec=sys"),
            ("/x *(anonuid=me)", 1, "needs a number"),
            ("/x *\n/x 10.0.0.1", 2, "exported twice"),
        ];
        for (text, line, what) in bad {
            let e = Exports::parse(text, "f", &no_dns).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.what.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn mount_paths_find_the_longest_export() {
        let e = parse("/srv *(rw)\n/srv/data *(ro)\n/ *(ro)").unwrap();
        let (x, rest) = e.find("/srv/data/a/b").unwrap();
        assert_eq!(
            (x.path.as_path(), rest.as_path()),
            (Path::new("/srv/data"), Path::new("a/b"))
        );
        let (x, rest) = e.find("/srv/other").unwrap();
        assert_eq!(
            (x.path.as_path(), rest.as_path()),
            (Path::new("/srv"), Path::new("other"))
        );
        let (x, _) = e.find("/elsewhere").unwrap();
        assert_eq!(x.path, PathBuf::from("/"));
        let only = parse("/srv/data *(rw)").unwrap();
        assert!(
            only.find("/srv/database").is_none(),
            "components, not string prefixes"
        );
    }
}
