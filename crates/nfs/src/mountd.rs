//! The MOUNT v3 program (RFC 1813 Appendix I) over any source of exports: one server's export
//! ([`crate::server::MountProgram`]) or an [`crate::gate::ExportTable`]. The sources differ in
//! how MNT finds a directory and what EXPORT lists; the procedures are the same.

use std::net::SocketAddr;
use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use oncrpc::{AuthStat, Call, Credential, Outcome};
use xdr::XdrEncode;

use crate::mount::{self, DirPath, ExportNode, List, MountBody, MountRes, Name};
use crate::xdr_util::{Void, args_or_garbage};

/// Where the MOUNT program finds its exports and keeps its mount list.
pub(crate) trait MountSource: Send + Sync + 'static {
    /// MNT of `path` for the caller at `peer` (`host`: its address as text, or "local").
    fn mnt(&self, path: &[u8], peer: Option<SocketAddr>, host: &str) -> MountRes;
    /// The mount list, (host, directory) pairs: DUMP reports it, UMNT and UMNTALL edit it.
    fn mounts(&self) -> MutexGuard<'_, Vec<(String, String)>>;
    /// EXPORT's answer.
    fn export_list(&self) -> List<ExportNode>;
}

/// Runs one MOUNT call against `src`.
pub(crate) async fn call<S: MountSource>(src: Arc<S>, call: Call) -> Outcome {
    let peer = call.context.peer;
    let host = peer.map_or_else(|| "local".to_string(), |p| p.ip().to_string());
    let mut dec = call.args_decoder();
    let mut enc = call.reply_encoder();
    match call.header.proc_ {
        mount::proc_::NULL => {
            let _ = args_or_garbage!(dec, Void);
        }
        mount::proc_::MNT => {
            let p = args_or_garbage!(dec, DirPath);
            // MNT hands out a file handle: AUTH_SYS or AUTH_NONE only.
            if !matches!(call.credential, Credential::Sys(_) | Credential::None) {
                return Outcome::AuthError(AuthStat::TooWeak);
            }
            let s = src.clone();
            let res = tokio::task::spawn_blocking(move || s.mnt(p.as_bytes(), peer, &host)).await;
            match res {
                Ok(r) => r.encode(&mut enc),
                Err(_) => return Outcome::SystemErr,
            }
        }
        mount::proc_::DUMP => {
            let _ = args_or_garbage!(dec, Void);
            let m = src.mounts().clone();
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
            let p = args_or_garbage!(dec, DirPath);
            let p = String::from_utf8_lossy(p.as_bytes()).into_owned();
            src.mounts().retain(|(h, d)| {
                !(h == &host && d.trim_end_matches('/') == p.trim_end_matches('/'))
            });
        }
        mount::proc_::UMNTALL => {
            let _ = args_or_garbage!(dec, Void);
            src.mounts().retain(|(h, _)| h != &host);
        }
        mount::proc_::EXPORT => {
            let _ = args_or_garbage!(dec, Void);
            src.export_list().encode(&mut enc);
        }
        _ => return Outcome::ProcUnavail,
    }
    Outcome::Success(enc.finish())
}
