//! The rdma-core provider (cargo feature `rdma-core`): the same verbs API over a real RDMA
//! device — a NIC, or the kernel's `siw` / `rxe` — through libibverbs and librdmacm.
//!
//! The bindings are `rdma-mummy-sys`, the sys layer under the `sideway` crate. It links a small
//! static shim that `dlopen`s the system's libibverbs / librdmacm at run time, so a binary built
//! with the feature still starts (and reports "no RDMA device") on a machine without them.
//! `sideway`'s safe layer is not used: its rdma_cm wrapper carries no private data in either
//! direction and cannot reject, both of which RPC-over-RDMA (RFC 8797) and RDS need.
//!
//! How the API maps onto rdma-core:
//! * [`Device`](crate::Device) is one of librdmacm's device contexts (`rdma_get_devices`), so
//!   PDs, CQs and QPs live on the very context rdma_cm ids resolve to.
//! * A [`CompletionQueue`](crate::CompletionQueue) is an `ibv_cq` with a completion channel.
//!   One thread per CQ sleeps in poll(2) on the channel, drains the CQ and hands completions
//!   to the same software queue the soft providers fill, so the async `next()` works unchanged.
//! * A [`QueuePair`](crate::QueuePair) is created on the rdma_cm id when it connects or
//!   accepts (`rdma_create_qp`, so librdmacm drives the QP state machine for iWARP and IB
//!   alike). Receives posted before that are kept and posted to the new QP before
//!   `rdma_connect` / `rdma_accept`.
//! * Every send WR is posted signaled with an internal slot number as its `wr_id`; the slot
//!   records the consumer's `wr_id`, opcode and whether it asked for a completion. That gives
//!   the API's semantics (unsignaled WRs complete only on error; flushed WRs carry their
//!   opcode, which `ibv_wc` does not), frees send-queue slots on time, and keeps the memory of
//!   `Payload::Inline` sends alive until the device is done with it. WRs beyond the send
//!   queue's depth wait in software and are posted as completions free slots.
//! * Owned payloads (`Payload::Inline`) go into the WQE when the device takes that much inline
//!   data, else are copied into one of the QP's registered 16 KiB bounce slots, else (bigger,
//!   or all slots busy) registered for the one WR: a registration per message costs a system
//!   call and page pinning each way.
//! * Memory regions keep their bytes in the same heap buffer as the soft providers and
//!   register it with `ibv_reg_mr`: tagged offsets are virtual addresses
//!   ([`MemoryRegion::addr`](crate::MemoryRegion::addr) is the buffer's address). Invalidating a
//!   region deregisters it; re-registering registers it again (a new STag).
//!
//! What it does not do: no pcap captures (the kernel owns the wire), CRC and peer-to-peer mode
//! are the kernel driver's settings (siw's module parameters), and connection events beyond
//! established / disconnected / device removal are reported as errors.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rdma_mummy_sys as sys;
use tokio::io::unix::AsyncFd;

use crate::QpState;
use crate::VerbsError;
use crate::cq::{Completion, CqInner, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use crate::mem::Access;

mod cm;
mod cq;
mod device;
mod dispatch;
mod qp;

use cm::*;
use cq::*;
use device::*;
pub use device::{RdmaCoreConfig, RdmaCoreDevice, rdma_core_devices};
pub(crate) use dispatch::open;
use qp::*;

pub(super) fn os_err(what: &str) -> VerbsError {
    VerbsError::Io(format!("{what}: {}", io::Error::last_os_error()))
}

/// Make a file descriptor of ours non-blocking.
pub(super) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on an fd the caller owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

pub(super) fn ret_err(what: &str, ret: i32) -> VerbsError {
    // Verbs calls return an errno (some providers negate it), or -1 with errno set.
    if ret == -1 {
        os_err(what)
    } else {
        VerbsError::Io(format!(
            "{what}: {}",
            io::Error::from_raw_os_error(ret.saturating_abs())
        ))
    }
}
