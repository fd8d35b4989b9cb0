//! The MOUNT v3 program (RFC 1813 Appendix I) over the export.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Outcome, Program};
use xdr::{XdrDecode, XdrEncode};

use super::{NfsServer, cred_of};
use crate::mount::{
    self, DirPath, ExportNode, Fhandle3, List, MountBody, MountOk, MountRes, Mountstat3, Name,
};
use crate::xdr_util::Void;

impl NfsServer {
    pub(super) fn export_names(&self) -> Vec<String> {
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
        let server = self.0.clone();
        Box::pin(async move {
            let host = call
                .context
                .peer
                .map_or_else(|| "local".to_string(), |p: SocketAddr| p.ip().to_string());
            let mut dec = call.args_decoder();
            let mut enc = call.reply_encoder();
            macro_rules! args {
                ($t:ty) => {{
                    let Ok(v) = <$t>::decode(&mut dec) else {
                        return Outcome::GarbageArgs;
                    };
                    if dec.finish().is_err() {
                        return Outcome::GarbageArgs;
                    }
                    v
                }};
            }
            match call.header.proc_ {
                mount::proc_::NULL => {
                    let _ = args!(Void);
                }
                mount::proc_::MNT => {
                    let p = args!(DirPath);
                    if cred_of(&call.credential).is_err() {
                        return Outcome::AuthError(AuthStat::TooWeak);
                    }
                    let s = server.clone();
                    let res = tokio::task::spawn_blocking(move || s.mnt(p.as_bytes(), &host)).await;
                    match res {
                        Ok(r) => r.encode(&mut enc),
                        Err(_) => return Outcome::SystemErr,
                    }
                }
                mount::proc_::DUMP => {
                    let _ = args!(Void);
                    let m = server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    List(
                        m.into_iter()
                            .map(|(h, d)| MountBody {
                                hostname: Name(Bytes::from(h)),
                                directory: DirPath(Bytes::from(d)),
                            })
                            .collect(),
                    )
                    .encode(&mut enc);
                }
                mount::proc_::UMNT => {
                    let p = args!(DirPath);
                    let p = String::from_utf8_lossy(p.as_bytes()).into_owned();
                    server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(h, d)| {
                            !(h == &host && d.trim_end_matches('/') == p.trim_end_matches('/'))
                        });
                }
                mount::proc_::UMNTALL => {
                    let _ = args!(Void);
                    server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(h, _)| h != &host);
                }
                mount::proc_::EXPORT => {
                    let _ = args!(Void);
                    List(vec![ExportNode {
                        dir: DirPath(Bytes::from(server.opts.name.clone())),
                        groups: List(Vec::new()),
                    }])
                    .encode(&mut enc);
                }
                _ => return Outcome::ProcUnavail,
            }
            Outcome::Success(enc.finish())
        })
    }
}
