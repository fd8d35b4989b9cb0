//! The NFSv3 (RFC 1813) and MOUNT v3 programs over an [`Export`].
//!
//! Each call's arguments are decoded on the async side (GARBAGE_ARGS when they do not decode
//! exactly), then the file-system work runs on tokio's blocking pool. Results are encoded with
//! [`oncrpc::Call::reply_encoder`], so the transport's reduction policy applies to the
//! DDP-eligible READ and READLINK results (RFC 8267 §4).
//!
//! This module keeps the server and its export; `procs` holds the NFSv3 procedures, `program`
//! the NFS program (argument decoding, credentials, dispatch), `mountd` the MOUNT program.

use std::path::Path;
use std::sync::{Arc, Mutex};

use oncrpc::Program;
use rustix::fs::Statx;
use xdr::{Encoder, XdrEncode};

use crate::drc::{DrcConfig, DrcStats, SharedCache};
use crate::fsops::{FsOps, RemoveKind};
use crate::nfs3::*;
use crate::vfs::{Cred, Export, NfsResult, Node, Opened, is_dir};

mod mountd;
mod procs;
mod program;

pub use mountd::MountProgram;
pub use program::{Args, ArgsError, NfsProgram, call_sync, cred_of};

/// Largest READ and WRITE the server advertises (FSINFO rtmax/wtmax).
pub const MAX_IO: u32 = crate::fsops::MAX_IO;
/// Largest READ done on the calling task when its data is in the page cache. A larger one
/// goes to a blocking thread: over RPC-over-RDMA a call that finishes at once runs on the
/// connection's receive task, and copying 1 MiB there held back the calls behind it (READ
/// 1 MiB at depth 4 fell to 0.37x of the blocking-thread path in the A/B of
/// docs/performance.md, while READs of 4 KiB and 64 KiB gained at every depth).
pub const INLINE_READ_MAX: u32 = 64 * 1024;
/// Largest READ done on the calling task, from the page cache, when the transport says the
/// call is alone on its connection ([`oncrpc::CallHints::alone`]): nothing waits behind it,
/// so the hop to a blocking thread and back is pure latency. A 1 GiB sequential read by
/// libnfs (one 1 MiB READ at a time) over TCP went from 2,560 to 2,892 MB/s with every READ
/// of up to 1 MiB on the calling task (docs/performance.md).
pub const INLINE_READ_ALONE_MAX: u32 = MAX_IO;
/// Largest UNSTABLE WRITE done on the calling task when the file is open in the open-file
/// cache: a copy into the page cache of at most this much (Linux has no `RWF_NOWAIT` for
/// buffered writes on ext4, so a larger one could hold a runtime worker for long).
pub const INLINE_WRITE_MAX: usize = 64 * 1024;
/// Preferred READDIR size (FSINFO dtpref).
pub const DTPREF: u32 = 64 * 1024;

/// Server-wide settings of one export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Refuse every modifying procedure with NFS3ERR_ROFS.
    pub read_only: bool,
    /// The path clients mount (MNT); the export's canonical path is accepted too.
    pub name: String,
}

/// The shared state of the NFS and MOUNT programs.
#[derive(Debug)]
pub struct NfsServer {
    export: Export,
    opts: ExportOptions,
    write_verf: Verf,
    mounts: Mutex<Vec<(String, String)>>,
    read_bufs: Arc<oncrpc::BufPool>,
    drc: Option<Arc<SharedCache>>,
}

/// Idle pooled READ buffers kept (more are freed): enough for a client's readahead window.
const POOLED_READ_KEEP: usize = 32;

impl NfsServer {
    /// Serve the directory `root`, with a duplicate request cache of the default size
    /// ([`DrcConfig::default`]). The write verifier is new for every server instance
    /// (RFC 1813 §3.3.7: it changes when the server restarts, so clients re-send UNSTABLE data).
    pub fn new(root: &Path, opts: ExportOptions) -> std::io::Result<Arc<Self>> {
        Self::with_drc(root, opts, Some(DrcConfig::default()))
    }

    /// [`NfsServer::new`] with these duplicate request cache bounds, or none (`None`: every
    /// retransmission executes again).
    pub fn with_drc(
        root: &Path,
        opts: ExportOptions,
        drc: Option<DrcConfig>,
    ) -> std::io::Result<Arc<Self>> {
        Ok(Self::from_export(Export::open(root)?, opts, drc))
    }

    /// Serve an export already opened (see [`crate::gate::ExportTable`]), with a new write
    /// verifier.
    pub fn from_export(export: Export, opts: ExportOptions, drc: Option<DrcConfig>) -> Arc<Self> {
        Self::with_verifier(export, opts, drc, crate::verifier::fresh())
    }

    /// Serve an export already opened with this write verifier (one kept across a clean
    /// restart, [`crate::verifier`]).
    pub fn with_verifier(
        export: Export,
        opts: ExportOptions,
        drc: Option<DrcConfig>,
        write_verf: Verf,
    ) -> Arc<Self> {
        Arc::new(NfsServer {
            export,
            opts,
            write_verf,
            mounts: Mutex::new(Vec::new()),
            read_bufs: oncrpc::BufPool::new(POOLED_READ_KEEP),
            drc: drc.map(SharedCache::new),
        })
    }

    /// Counters of the duplicate request cache (`None` without one).
    pub fn drc_stats(&self) -> Option<DrcStats> {
        self.drc.as_ref().map(|c| c.stats())
    }

    /// The export.
    pub fn export(&self) -> &Export {
        &self.export
    }

    /// The write verifier of this server instance.
    pub fn write_verifier(&self) -> Verf {
        self.write_verf
    }

    /// The NFS program (100003, version 3).
    pub fn nfs_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(NfsProgram(self.clone()))
    }

    /// The MOUNT program (100005, version 3).
    pub fn mount_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(MountProgram(self.clone()))
    }

    fn post(&self, rel: &Path) -> PostOpAttr {
        self.export
            .stat_rel(rel)
            .ok()
            .map(|st| self.export.fattr(&st))
    }

    fn wcc(&self, before: &Statx, rel: &Path) -> WccData {
        WccData {
            before: Some(Export::wcc_attr(before)),
            after: self.post(rel),
        }
    }

    /// [`Self::wcc`] of a file open in the open-file cache: after-attributes from its
    /// descriptor, with no path walk.
    fn wcc_open(&self, o: &Opened) -> WccData {
        WccData {
            before: Some(Export::wcc_attr(&o.st)),
            after: self
                .export
                .stat_open(&o.file)
                .ok()
                .map(|st| self.export.fattr(&st)),
        }
    }

    /// The shared file operations over this export ([`crate::fsops`]).
    pub fn fs(&self) -> FsOps<'_> {
        FsOps::new(&self.export, self.opts.read_only)
    }

    fn dir(&self, fh: &Fh3) -> NfsResult<Node> {
        let n = self.export.resolve(fh)?;
        if !is_dir(&n.st) {
            return Err(Nfsstat3::NotDir);
        }
        Ok(n)
    }

    /// Execute one NFSv3 procedure whose arguments have been decoded; encode its results.
    pub fn execute(&self, cred: &Cred, args: Args, enc: &mut Encoder) {
        match args {
            Args::Null => {}
            Args::Getattr(a) => self.getattr(a).encode(enc),
            Args::Setattr(a) => self.setattr(cred, a).encode(enc),
            Args::Lookup(a) => self.lookup(cred, a).encode(enc),
            Args::Access(a) => self.access(cred, a).encode(enc),
            Args::Readlink(a) => self.readlink(a).encode(enc),
            Args::Read(a) => self.read(cred, a).encode(enc),
            Args::Write(a) => self.write(cred, a).encode(enc),
            Args::Create(a) => self.create(cred, a).encode(enc),
            Args::Mkdir(a) => self.mkdir(cred, a).encode(enc),
            Args::Symlink(a) => self.symlink(cred, a).encode(enc),
            Args::Mknod(a) => self.mknod(cred, a).encode(enc),
            Args::Remove(a) => self.remove(cred, a, RemoveKind::NonDir).encode(enc),
            Args::Rmdir(a) => self.remove(cred, a, RemoveKind::Dir).encode(enc),
            Args::Rename(a) => self.rename(cred, a).encode(enc),
            Args::Link(a) => self.link(cred, a).encode(enc),
            Args::Readdir(a) => self.readdir(cred, a).encode(enc),
            Args::Readdirplus(a) => self.readdirplus(cred, a).encode(enc),
            Args::Fsstat(a) => self.fsstat(a).encode(enc),
            Args::Fsinfo(a) => self.fsinfo(a).encode(enc),
            Args::Pathconf(a) => self.pathconf(a).encode(enc),
            Args::Commit(a) => self.commit(a).encode(enc),
        }
    }
}
