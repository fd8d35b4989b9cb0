//! Connection drops: the NFS program wrapped with a server-side drop armed for the next call,
//! and the client and server handles that cut a connection.

use std::sync::{Arc, Mutex, OnceLock};

use oncrpc::service::BoxFuture;
use oncrpc::{Call, Outcome, Program, TcpClient};
use rpcrdma::{RdmaClient, RdmaServer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Point {
    Before,
    After,
}

pub(super) enum Cutter {
    Tcp(Arc<oncrpc::TcpServer>),
    Rdma(Arc<RdmaServer>),
}

impl Cutter {
    async fn cut(&self) {
        match self {
            Cutter::Tcp(s) => s.disconnect_all(),
            Cutter::Rdma(s) => {
                for c in s.connections() {
                    c.disconnect().await;
                }
            }
        }
    }
}

/// The NFS program with a server-side drop armed for the next call.
pub(super) struct Fault {
    pub(super) inner: Arc<dyn Program>,
    pub(super) armed: Mutex<Option<Point>>,
    pub(super) cutter: OnceLock<Cutter>,
}

impl Program for Fault {
    fn program(&self) -> u32 {
        self.inner.program()
    }
    fn versions(&self) -> (u32, u32) {
        self.inner.versions()
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            let point = self
                .armed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let cut = || async {
                if let Some(c) = self.cutter.get() {
                    c.cut().await;
                }
            };
            match point {
                None => self.inner.call(call).await,
                Some(Point::Before) => {
                    cut().await;
                    Outcome::NoReply
                }
                Some(Point::After) => {
                    // Executed (and, if cacheable, its reply in the cache), then the
                    // connection goes and the reply with it: answering nothing makes sure
                    // the reply cannot slip out before the cut takes effect.
                    let _executed = self.inner.call(call).await;
                    cut().await;
                    Outcome::NoReply
                }
            }
        })
    }
}

pub(super) enum Client {
    Tcp(Arc<TcpClient>),
    Rdma(Arc<RdmaClient>),
}

impl Client {
    pub(super) async fn disconnect(&self) {
        match self {
            Client::Tcp(c) => c.disconnect(),
            Client::Rdma(c) => c.disconnect().await,
        }
    }
}
