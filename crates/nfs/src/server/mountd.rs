//! The MOUNT v3 program (RFC 1813 Appendix I) over the export.

use std::net::SocketAddr;
use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{Call, Outcome, Program};

use super::NfsServer;
use crate::mount::{self, DirPath, ExportNode, Fhandle3, List, MountOk, MountRes, Mountstat3};
use crate::mountd::{self, MountSource};

impl NfsServer {
    fn export_names(&self) -> Vec<String> {
        vec![
            self.opts.name.clone(),
            self.export.root_path().to_string_lossy().into_owned(),
        ]
    }

    /// MNT (RFC 1813 Appendix I): the root handle of a matching export.
    pub fn mnt(&self, path: &[u8], host: &str) -> MountRes {
        let Ok(p) = std::str::from_utf8(path) else {
            return MountRes::Err(Mountstat3::NoEnt);
        };
        let trimmed = if p.len() > 1 {
            p.trim_end_matches('/')
        } else {
            p
        };
        if !self
            .export_names()
            .iter()
            .any(|n| n.trim_end_matches('/') == trimmed || (n == "/" && trimmed == "/"))
        {
            return MountRes::Err(Mountstat3::NoEnt);
        }
        match self.export.root_handle() {
            Ok(fh) => {
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                let entry = (host.to_string(), trimmed.to_string());
                if !m.contains(&entry) {
                    m.push(entry);
                }
                MountRes::Ok(MountOk {
                    fhandle: Fhandle3(fh.0),
                    auth_flavors: vec![oncrpc::auth::AUTH_SYS, oncrpc::auth::AUTH_NONE],
                })
            }
            Err(_) => MountRes::Err(Mountstat3::ServerFault),
        }
    }
}

/// MOUNT (100005) version 3 as an RPC program (RFC 8267 §5.1: offered over TCP).
#[derive(Debug, Clone)]
pub struct MountProgram(pub Arc<NfsServer>);

impl Program for MountProgram {
    fn program(&self) -> u32 {
        mount::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        // Linux mount.nfs asks MOUNT v3; v1 shares NULL/DUMP/UMNT/UMNTALL/EXPORT encodings
        // but not MNT's result, so only v3 is offered.
        (mount::VERSION, mount::VERSION)
    }
    fn name(&self) -> &'static str {
        "mountd"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(mountd::call(self.0.clone(), call))
    }
}

impl MountSource for NfsServer {
    fn mnt(&self, path: &[u8], _peer: Option<SocketAddr>, host: &str) -> MountRes {
        NfsServer::mnt(self, path, host)
    }
    fn mounts(&self) -> MutexGuard<'_, Vec<(String, String)>> {
        self.mounts.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn export_list(&self) -> List<ExportNode> {
        List(vec![ExportNode {
            dir: DirPath(Bytes::from(self.opts.name.clone())),
            groups: List(Vec::new()),
        }])
    }
}
