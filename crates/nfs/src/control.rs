//! The local control socket `oxrdma nfs status` reads.
//!
//! An AF_LOCAL stream socket, readable and writable by its owner only (mode 0600: the report
//! names clients and paths). The server reads nothing from a caller: each connection gets the
//! current [`crate::status::Status`] report and is closed, so a caller controls no size and
//! no state. A stale socket file left by a server that is gone is replaced; one a live server
//! answers on is not.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::status::StatusSource;

/// Where the control socket is unless told otherwise.
pub const DEFAULT_PATH: &str = "/run/oxrdma-nfs.sock";

/// The largest report a client reads.
const MAX_REPORT: u64 = 4 << 20;

/// How long a client waits for the report.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the control socket could not be served or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("{path}: another server answers on this control socket")]
    InUse { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: no report within {READ_TIMEOUT:?}")]
    Timeout { path: PathBuf },
}

/// A control socket being served; removed when dropped.
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ControlSocket {
    /// Serve reports of `source` at `path`.
    pub async fn bind(path: &Path, source: Arc<StatusSource>) -> Result<Self, ControlError> {
        let err = |source| ControlError::Io {
            path: path.to_path_buf(),
            source,
        };
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ControlError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(err)?;
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let report = source.status().render();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT, async {
                        let _ = s.write_all(report.as_bytes()).await;
                        let _ = s.shutdown().await;
                    })
                    .await;
                });
            }
        });
        Ok(ControlSocket {
            path: path.to_path_buf(),
            task,
        })
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The report of the server whose control socket is at `path`.
pub async fn query(path: &Path) -> Result<String, ControlError> {
    let err = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let read = async {
        let s = UnixStream::connect(path).await.map_err(err)?;
        let mut out = Vec::new();
        s.take(MAX_REPORT)
            .read_to_end(&mut out)
            .await
            .map_err(err)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| ControlError::Timeout {
            path: path.to_path_buf(),
        })?
}
