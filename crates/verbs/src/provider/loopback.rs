//! The loopback provider: the soft-iWARP stack over in-process byte pipes. A
//! [`LoopbackFabric`] is the network: listeners register addresses on it, connects find them.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use parking_lot::Mutex;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use crate::VerbsError;
use crate::conn::Listener;
use crate::device::Device;
use crate::provider::soft::Transport;
use crate::provider::soft::cm::incoming;

/// FPDU size used by the in-memory loopback provider (the MSS of Linux loopback, rounded to 8).
pub const LOOPBACK_FPDU: usize = 65480;

/// find them. No sockets; everything runs over in-process byte pipes.
#[derive(Clone, Default)]
pub struct LoopbackFabric {
    inner: Arc<FabricInner>,
}

#[derive(Default)]
struct FabricInner {
    listeners: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<(DuplexStream, SocketAddr)>>>,
    next_port: AtomicU16,
}

impl fmt::Debug for LoopbackFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackFabric").finish_non_exhaustive()
    }
}

impl LoopbackFabric {
    /// A new, empty fabric.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LoopbackFabric {
    fn ephemeral(&self) -> u16 {
        let p = self.inner.next_port.fetch_add(1, Ordering::Relaxed);
        40000 + (p % 20000)
    }
}

/// Listen on `addr` of `fabric` (port 0 picks a free port).
pub(crate) fn listen(
    dev: Device,
    fabric: &LoopbackFabric,
    addr: SocketAddr,
) -> Result<Listener, VerbsError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut local = addr;
    if local.port() == 0 {
        local.set_port(fabric.ephemeral());
    }
    let (ltx, mut lrx) = mpsc::unbounded_channel();
    {
        let mut m = fabric.inner.listeners.lock();
        if m.contains_key(&local) {
            return Err(VerbsError::Io(
                io::Error::from(io::ErrorKind::AddrInUse).to_string(),
            ));
        }
        m.insert(local, ltx);
    }
    let task = tokio::spawn(async move {
        while let Some((s, peer)) = lrx.recv().await {
            let dev = dev.clone();
            let tx = tx.clone();
            tokio::spawn(async move { incoming(dev, Transport::Mem(s), local, peer, tx).await });
        }
    });
    Ok(Listener::new(rx, local, task, Some(fabric.clone())))
}

/// Free a listener's address.
pub(crate) fn unlisten(fabric: &LoopbackFabric, addr: &SocketAddr) {
    fabric.inner.listeners.lock().remove(addr);
}

/// Connect to the listener on `addr`: the stream and our address.
pub(crate) fn connect(
    fabric: &LoopbackFabric,
    addr: SocketAddr,
) -> Result<(Transport, SocketAddr), VerbsError> {
    let l = fabric.inner.listeners.lock().get(&addr).cloned();
    let Some(l) = l else {
        return Err(VerbsError::Io(
            io::Error::from(io::ErrorKind::ConnectionRefused).to_string(),
        ));
    };
    let local = SocketAddr::new(addr.ip(), fabric.ephemeral());
    let (a, b) = tokio::io::duplex(1 << 20);
    l.send((b, local))
        .map_err(|_| VerbsError::Io("listener closed".into()))?;
    Ok((Transport::Mem(a), local))
}
