//! The tee through which a connection's driver records what it reads and writes.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use tokio::net::tcp::OwnedWriteHalf;

use super::{Capture, Dir, Ticket};

/// A tee on one connection's byte stream: where a capture is on, what passes through is
/// recorded in it (a recording error is ignored: the capture is a diagnostic, never a reason
/// to fail the connection). Clones share the capture; stream order is the order of the calls,
/// which the driver makes in stream order for each direction. A write is recorded under the
/// same lock as it is made, so what is read in answer to it always comes after it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tee(Option<Arc<Mutex<Capture>>>);

impl Tee {
    /// A tee into `capture`, or a plain pass-through.
    pub(crate) fn new(capture: Option<Capture>) -> Self {
        Tee(capture.map(|c| Arc::new(Mutex::new(c))))
    }

    /// True if bytes are being recorded.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Keep the place of `len` bytes that went `dir` just now, to be recorded by
    /// [`Tee::fill`] ([`Capture::reserve`]); `None` without a capture. A reader that takes
    /// FPDUs out of what it read before recording it keeps the copy into the capture out of
    /// the time between the bytes' arrival and their completion, and what is written in
    /// answer still comes after them in the file.
    pub(crate) fn reserve(&self, dir: Dir, len: usize) -> Option<Ticket> {
        let mut c = self.0.as_ref()?.lock();
        // Stamped under the lock, as writes are: the file's times never go back.
        let at = SystemTime::now();
        Some(c.reserve(dir, len, at))
    }

    /// Record the bytes of a reservation.
    pub(crate) fn fill(&self, ticket: Ticket, data: &[u8]) {
        if let Some(c) = &self.0 {
            c.lock().fill(ticket, data);
        }
    }

    /// Record the first `n` bytes of `slices`, which went `dir` at `at`, into a capture
    /// already locked.
    fn record_slices_locked(
        c: &mut Capture,
        dir: Dir,
        slices: &[IoSlice<'_>],
        mut n: usize,
        at: SystemTime,
    ) {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(slices.len());
        for s in slices {
            if n == 0 {
                break;
            }
            let take = s.len().min(n);
            parts.push(&s[..take]);
            n -= take;
        }
        if !parts.is_empty() {
            let _ = c.record_parts_at(dir, &parts, at);
        }
    }

    /// Run a (non-blocking) write and record what it wrote, holding the capture for both, so
    /// that a reply the reading half receives to these bytes is recorded after them: the
    /// capture's cross-direction order is then causal, as on the wire. The bytes are stamped
    /// with the time the write began, when they were handed to TCP: on loopback the write
    /// returns only after the peer's stack has taken them in, and a packet capture (tcpdump)
    /// stamps them inside the call, not after it.
    fn write_through(
        &self,
        slices: &[IoSlice<'_>],
        write: impl FnOnce() -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let Some(c) = &self.0 else { return write() };
        let mut c = c.lock();
        let at = SystemTime::now();
        let r = write();
        if let Poll::Ready(Ok(n)) = r {
            Self::record_slices_locked(&mut c, Dir::Out, slices, n, at);
        }
        r
    }

    /// End the capture (FINs) and flush it.
    pub(crate) fn close(&self) {
        if let Some(c) = &self.0 {
            let _ = c.lock().close();
        }
    }
}

/// The write half of a byte stream with a [`Tee`] on it: writes are recorded as [`Dir::Out`].
/// (The soft-iWARP reader records what it reads itself, through [`Tee::reserve`] and
/// [`Tee::fill`].)
#[derive(Debug)]
pub(crate) struct Teed<S> {
    inner: S,
    tee: Tee,
}

impl<S> Teed<S> {
    pub(crate) fn new(inner: S, tee: Tee) -> Self {
        Teed { inner, tee }
    }

    /// The stream under the tee (for what does not move bytes: readiness, socket options).
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl Teed<OwnedWriteHalf> {
    /// `TcpStream::try_write_vectored` through the tee.
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.tee.write_through(slices, || {
            Poll::Ready(self.inner.as_ref().try_write_vectored(slices))
        }) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Teed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let (inner, tee) = (&mut this.inner, &this.tee);
        tee.write_through(&[IoSlice::new(buf)], || Pin::new(inner).poll_write(cx, buf))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let (inner, tee) = (&mut this.inner, &this.tee);
        tee.write_through(bufs, || Pin::new(inner).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
