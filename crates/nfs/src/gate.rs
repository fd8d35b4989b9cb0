//! Several exports behind one NFS and one MOUNT program, with exports(5) access control on
//! every call.
//!
//! Each export is served by its own [`NfsServer`] (its own file-system id, so its file handles
//! name it). The [`ExportTable`]'s NFS program finds the export a call is for from the file
//! system id in the call's first file handle (every NFSv3 procedure but NULL starts with one),
//! then checks the caller against that export's client list — on every call, not only at MNT,
//! since file handles outlive mounts and can be passed around — and applies the options of the
//! client specification that matched: `secure` (source port below 1024), `ro` (NFS3ERR_ROFS
//! for modifying procedures) and identity squashing (the AUTH_SYS credential is rewritten
//! before the export's server sees it). A refused caller gets NFS3ERR_ACCES, and the first
//! refusal of each client and export is logged with the reason.
//!
//! The MOUNT program accepts any directory at or below an export, as Linux's mountd does (the
//! path below the export is walked one component at a time, never following symbolic links,
//! so a mount cannot leave its export; a path in no export, or with `..`, gets MNT3ERR_ACCES
//! as from mountd), and EXPORT lists the exports' real paths with their
//! client lists.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Credential, Outcome, Program};
use xdr::{Decoder, Encoder, XdrDecode};

use crate::drc::DrcConfig;
use crate::exports::{ClientOptions, ClientRule, ClientSpec, ExportEntry, Exports, Squash};
use crate::mount::{
    self, DirPath, ExportNode, Fhandle3, List, MountOk, MountRes, Mountstat3, Name,
};
use crate::mountd::{self, MountSource};
use crate::nfs3::{self, Nfsstat3, proc_};
use crate::server::{ExportOptions, NfsServer};
use crate::verifier::Verifier;
use crate::vfs::{Export, HandleData};

/// One export and the server behind it.
pub struct Exported {
    pub entry: ExportEntry,
    pub server: Arc<NfsServer>,
    program: Arc<dyn Program>,
}

impl std::fmt::Debug for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exported")
            .field("entry", &self.entry)
            .finish_non_exhaustive()
    }
}

/// Refusals logged at warning level, per (client, export); later ones go to debug.
const REFUSALS_LOGGED: usize = 1024;

/// The exports a server serves, and who may use them.
#[derive(Debug)]
pub struct ExportTable {
    /// Replaced whole by [`ExportTable::reload`]; calls take a snapshot.
    exports: RwLock<Arc<Vec<Arc<Exported>>>>,
    drc: Option<DrcConfig>,
    /// The write verifier of every export's server ([`crate::verifier`]).
    verf: Verifier,
    /// Extra names MNT accepts for the only export of the single-directory shorthand ("/",
    /// which the interop lab and older setups mount, and `--export NAME`).
    aliases: Vec<String>,
    mounts: Mutex<Vec<(String, String)>>,
    logged: Mutex<HashSet<(IpAddr, PathBuf)>>,
}

impl ExportTable {
    /// Open every export of `exports` (blocking: directories are opened and stat'ed), with a
    /// new write verifier.
    pub fn open(exports: &Exports, drc: Option<DrcConfig>) -> std::io::Result<Self> {
        Self::open_with_verifier(exports, drc, crate::verifier::fresh())
    }

    /// [`ExportTable::open`] with this write verifier (one kept across a clean restart).
    pub fn open_with_verifier(
        exports: &Exports,
        drc: Option<DrcConfig>,
        verf: Verifier,
    ) -> std::io::Result<Self> {
        let list = Self::build(exports, drc, verf, &[])?;
        Ok(ExportTable {
            exports: RwLock::new(Arc::new(list)),
            drc,
            verf,
            aliases: Vec::new(),
            mounts: Mutex::new(Vec::new()),
            logged: Mutex::new(HashSet::new()),
        })
    }

    /// The served list for `exports`; an export whose path is in `keep` keeps its server (its
    /// file handles, handle index and duplicate request cache).
    fn build(
        exports: &Exports,
        drc: Option<DrcConfig>,
        verf: Verifier,
        keep: &[Arc<Exported>],
    ) -> std::io::Result<Vec<Arc<Exported>>> {
        let mut out: Vec<Arc<Exported>> = Vec::new();
        for entry in &exports.entries {
            let fsid = entry.clients.iter().find_map(|r| r.options.fsid);
            let reuse = keep.iter().find(|x| {
                x.entry.path == entry.path && fsid.is_none_or(|f| f == x.server.export().fsid())
            });
            let (server, program) = match reuse {
                Some(x) => (x.server.clone(), x.program.clone()),
                None => {
                    let export = Export::open_with_fsid(&entry.path, fsid).map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("export {}: {e}", entry.path.display()),
                        )
                    })?;
                    let server = NfsServer::with_verifier(
                        export,
                        ExportOptions {
                            read_only: false,
                            name: entry.path.to_string_lossy().into_owned(),
                        },
                        drc,
                        verf,
                    );
                    let program = server.nfs_program();
                    (server, program)
                }
            };
            if let Some(other) = out
                .iter()
                .find(|x| x.server.export().fsid() == server.export().fsid())
            {
                return Err(std::io::Error::other(format!(
                    "exports {} and {} have the same fsid; give one of them fsid=N",
                    other.entry.path.display(),
                    entry.path.display()
                )));
            }
            out.push(Arc::new(Exported {
                entry: entry.clone(),
                server,
                program,
            }));
        }
        if out.is_empty() {
            return Err(std::io::Error::other("no exports"));
        }
        Ok(out)
    }

    /// Serve `exports` from now on (SIGHUP): connections stay up, calls already running finish
    /// with the table they started with, exports still listed keep their file handles, and a
    /// client no longer listed is refused from its next call. On error the table is unchanged.
    pub fn reload(&self, exports: &Exports) -> std::io::Result<()> {
        let current = self.snapshot();
        let list = Self::build(exports, self.drc, self.verf, &current)?;
        *self.exports.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(list);
        self.logged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        Ok(())
    }

    pub(crate) fn snapshot(&self) -> Arc<Vec<Arc<Exported>>> {
        self.exports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The single-directory shorthand (`oxrdma nfs serve DIR`): `DIR` exported to everybody
    /// who can reach the listeners, read-write (or `ro`), without squashing and from any port,
    /// as this server always did; MNT also accepts `/` and `name`. Use an exports file to
    /// restrict clients.
    pub fn single(
        dir: &Path,
        name: Option<String>,
        read_only: bool,
        drc: Option<DrcConfig>,
    ) -> std::io::Result<Self> {
        Self::single_with_verifier(dir, name, read_only, drc, crate::verifier::fresh())
    }

    /// [`ExportTable::single`] with this write verifier (one kept across a clean restart).
    pub fn single_with_verifier(
        dir: &Path,
        name: Option<String>,
        read_only: bool,
        drc: Option<DrcConfig>,
        verf: Verifier,
    ) -> std::io::Result<Self> {
        let path = dir.canonicalize()?;
        let exports = Exports {
            entries: vec![ExportEntry {
                path,
                clients: vec![ClientRule {
                    spec: ClientSpec::Anyone,
                    options: ClientOptions {
                        read_only,
                        squash: Squash::None,
                        secure: false,
                        ..ClientOptions::default()
                    },
                }],
            }],
        };
        let mut t = Self::open_with_verifier(&exports, drc, verf)?;
        t.aliases = std::iter::once("/".to_string()).chain(name).collect();
        Ok(t)
    }

    /// The write verifier of every export (NFSv3 and NFSv4).
    pub fn write_verifier(&self) -> Verifier {
        self.verf
    }

    /// The exports served now.
    pub fn exports(&self) -> Arc<Vec<Arc<Exported>>> {
        self.snapshot()
    }

    /// The NFS (100003 v3) program over every export.
    pub fn nfs_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(GatedNfs(self.clone()))
    }

    /// The MOUNT (100005 v3) program over every export.
    pub fn mount_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(GatedMount(self.clone()))
    }

    fn by_fsid(xs: &[Arc<Exported>], fsid: u64) -> Option<&Arc<Exported>> {
        xs.iter().find(|x| x.server.export().fsid() == fsid)
    }

    /// The rule that admits `peer` to `x`, or `None` (NFS3ERR_ACCES) with the reason logged.
    pub(crate) fn admit<'x>(&self, x: &'x Exported, peer: SocketAddr) -> Option<&'x ClientRule> {
        match x.entry.admit(peer) {
            Ok(rule) => Some(rule),
            Err(why) => {
                let first = {
                    let mut g = self.logged.lock().unwrap_or_else(|e| e.into_inner());
                    g.len() < REFUSALS_LOGGED && g.insert((peer.ip(), x.entry.path.clone()))
                };
                if first {
                    tracing::warn!(client = %peer, export = %x.entry.path.display(), reason = %why, "client refused");
                } else {
                    tracing::debug!(client = %peer, export = %x.entry.path.display(), reason = %why, "client refused");
                }
                None
            }
        }
    }

    /// The export a mount path belongs to, and the path below it.
    fn find_mount(&self, xs: &[Arc<Exported>], dir: &str) -> Option<(Arc<Exported>, PathBuf)> {
        let trimmed = match dir.trim_end_matches('/') {
            "" => "/",
            t => t,
        };
        if xs.len() == 1
            && self
                .aliases
                .iter()
                .any(|a| a.trim_end_matches('/') == trimmed.trim_end_matches('/'))
        {
            return Some((xs[0].clone(), PathBuf::new()));
        }
        let dir = Path::new(trimmed);
        xs.iter()
            .filter_map(|x| dir.strip_prefix(&x.entry.path).ok().map(|rest| (x, rest)))
            .max_by_key(|(x, _)| x.entry.path.components().count())
            .map(|(x, rest)| (x.clone(), rest.to_path_buf()))
    }

    /// MNT (RFC 1813 Appendix I).
    fn mnt(&self, path: &[u8], peer: Option<SocketAddr>) -> MountRes {
        let Ok(p) = std::str::from_utf8(path) else {
            return MountRes::Err(Mountstat3::NoEnt);
        };
        let xs = self.snapshot();
        // A path in no export, or one that climbs out of its export with "..", is refused as
        // Linux's mountd and nfs-ganesha refuse it: MNT3ERR_ACCES ("not exported").
        let Some((x, rest)) = self
            .find_mount(&xs, p)
            .filter(|(_, rest)| !rest.components().any(|c| c == Component::ParentDir))
        else {
            tracing::info!(client = ?peer, path = p, "MNT refused: not exported");
            return MountRes::Err(Mountstat3::Acces);
        };
        if let Some(peer) = peer
            && self.admit(&x, peer).is_none()
        {
            return MountRes::Err(Mountstat3::Acces);
        }
        match x.server.export().dir_handle(&rest) {
            Ok(fh) => {
                let host = peer.map_or_else(|| "local".to_string(), |p| p.ip().to_string());
                let mut m = self.mounts.lock().unwrap_or_else(|e| e.into_inner());
                let entry = (host, p.to_string());
                if !m.contains(&entry) && m.len() < 4096 {
                    m.push(entry);
                }
                MountRes::Ok(MountOk {
                    fhandle: Fhandle3(fh.0),
                    auth_flavors: vec![oncrpc::auth::AUTH_SYS, oncrpc::auth::AUTH_NONE],
                })
            }
            Err(Nfsstat3::NotDir) => MountRes::Err(Mountstat3::NotDir),
            Err(Nfsstat3::Acces) => MountRes::Err(Mountstat3::Acces),
            Err(_) => MountRes::Err(Mountstat3::NoEnt),
        }
    }

    fn export_list(&self) -> List<ExportNode> {
        List(
            self.snapshot()
                .iter()
                .map(|x| ExportNode {
                    dir: DirPath(Bytes::from(x.entry.path.to_string_lossy().into_owned())),
                    groups: List(
                        x.entry
                            .clients
                            .iter()
                            .map(|r| Name(Bytes::from(r.spec.to_string())))
                            .collect(),
                    ),
                })
                .collect(),
        )
    }
}

/// Encode procedure `p`'s failure result with `status`: the status, then the procedure's
/// `resfail` arm with every attribute absent (RFC 1813 §3.3: post_op_attr and pre_op_attr are
/// optional, so "no attributes" is always a valid failure body).
fn encode_failure(p: u32, status: Nfsstat3, enc: &mut Encoder) {
    enc.put_u32(status as u32);
    let absent = match p {
        proc_::GETATTR => 0,
        proc_::LOOKUP
        | proc_::ACCESS
        | proc_::READLINK
        | proc_::READ
        | proc_::READDIR
        | proc_::READDIRPLUS
        | proc_::FSSTAT
        | proc_::FSINFO
        | proc_::PATHCONF => 1,
        proc_::SETATTR
        | proc_::WRITE
        | proc_::CREATE
        | proc_::MKDIR
        | proc_::SYMLINK
        | proc_::MKNOD
        | proc_::REMOVE
        | proc_::RMDIR
        | proc_::COMMIT => 2,
        proc_::LINK => 3,
        proc_::RENAME => 4,
        _ => 0,
    };
    for _ in 0..absent {
        enc.put_u32(0);
    }
}

/// The file-system id in the first file handle of a call's arguments.
fn first_fsid(args: &Bytes) -> Option<u64> {
    let mut d = Decoder::from_bytes(args);
    let fh = nfs3::Fh3::decode(&mut d).ok()?;
    HandleData::from_fh(&fh).ok().map(|h| h.fsid)
}

/// Rewrite an AUTH_SYS credential as the export's squash options say. AUTH_NONE callers are
/// already the anonymous user.
pub(crate) fn squash(cred: Credential, o: &ClientOptions) -> Credential {
    match cred {
        Credential::Sys(mut s) => {
            let (uid, gid, gids) = o.map_identity(s.uid, s.gid, &s.gids);
            s.uid = uid;
            s.gid = gid;
            s.gids = gids;
            Credential::Sys(s)
        }
        other => other,
    }
}

#[derive(Debug)]
struct GatedNfs(Arc<ExportTable>);

impl Program for GatedNfs {
    fn program(&self) -> u32 {
        nfs3::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (nfs3::VERSION, nfs3::VERSION)
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, mut call: Call) -> BoxFuture<'_, Outcome> {
        let t = &self.0;
        let p = call.header.proc_;
        let xs = t.snapshot();
        // An unknown or foreign file system id goes to the first export, whose server answers
        // it with NFS3ERR_STALE or NFS3ERR_BADHANDLE as it always did.
        let x = match p {
            proc_::NULL => &xs[0],
            _ => first_fsid(&call.args)
                .and_then(|f| ExportTable::by_fsid(&xs, f))
                .unwrap_or(&xs[0]),
        };
        if p != proc_::NULL
            && let Some(peer) = call.context.peer
        {
            let refuse = |status| {
                let mut enc = call.reply_encoder();
                encode_failure(p, status, &mut enc);
                Outcome::Success(enc.finish())
            };
            let Some(rule) = t.admit(x, peer) else {
                return Box::pin(std::future::ready(refuse(Nfsstat3::Acces)));
            };
            if rule.options.read_only && nfs3::modifies(p) {
                return Box::pin(std::future::ready(refuse(Nfsstat3::Rofs)));
            }
            if !matches!(call.credential, Credential::Sys(_) | Credential::None) {
                // exports(5) sec=sys is the only flavor served.
                return Box::pin(std::future::ready(Outcome::AuthError(AuthStat::TooWeak)));
            }
            call.credential = squash(call.credential, &rule.options);
        }
        let program = x.program.clone();
        Box::pin(async move { program.call(call).await })
    }
}

impl MountSource for ExportTable {
    fn mnt(&self, path: &[u8], peer: Option<SocketAddr>, _host: &str) -> MountRes {
        ExportTable::mnt(self, path, peer)
    }
    fn mounts(&self) -> MutexGuard<'_, Vec<(String, String)>> {
        self.mounts.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn export_list(&self) -> List<ExportNode> {
        ExportTable::export_list(self)
    }
}

#[derive(Debug)]
struct GatedMount(Arc<ExportTable>);

impl Program for GatedMount {
    fn program(&self) -> u32 {
        mount::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (mount::VERSION, mount::VERSION)
    }
    fn name(&self) -> &'static str {
        "mountd"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(mountd::call(self.0.clone(), call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_bodies_have_the_shape_of_each_result() {
        // status + resfail with every attribute absent: 4 bytes per word.
        let words = |p| {
            let mut e = Encoder::new();
            encode_failure(p, Nfsstat3::Acces, &mut e);
            e.into_bytes().len() / 4
        };
        assert_eq!(words(proc_::GETATTR), 1);
        assert_eq!(words(proc_::LOOKUP), 2);
        assert_eq!(words(proc_::WRITE), 3);
        assert_eq!(words(proc_::LINK), 4);
        assert_eq!(words(proc_::RENAME), 5);
        // Each decodes as the procedure's result type with the status.
        let mut e = Encoder::new();
        encode_failure(proc_::RENAME, Nfsstat3::Rofs, &mut e);
        let b = e.into_bytes();
        let r = nfs3::RenameRes::decode(&mut Decoder::new(&b)).unwrap();
        assert!(matches!(r, nfs3::Res::Err(Nfsstat3::Rofs, _)));
    }
}
