//! What one TCP connection holds in its server's [`MemoryBudget`](crate::MemoryBudget): the
//! receive buffer and each call's record and reply, reserved before they are allocated, with
//! the reader's waits for memory ended by the peer going away.

use std::sync::Arc;

use tokio::net::tcp::OwnedReadHalf;

use super::READ_CHUNK;
use crate::budget::{ConnBudget, Reservation};
use crate::record::RecordDecoder;

/// Resolves when the peer has closed its end of the connection (or the socket failed) with no
/// byte of it left to read; never while bytes are waiting (the end, if any, lies behind them).
/// The reader waits on this while it waits for memory, so a peer that goes away then gives its
/// memory back at once, not when other connections free theirs.
pub(super) async fn peer_gone(rd: &mut OwnedReadHalf) {
    let mut b = [0u8; 1];
    match rd.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// What a connection holds in its server's [`MemoryBudget`].
pub(super) struct ConnMemory {
    pub(super) share: Arc<ConnBudget>,
    /// The receive buffer: [`READ_CHUNK`], plus the record being received once its length is
    /// known.
    pub(super) recv: Reservation,
}

impl ConnMemory {
    /// Wait until the receive buffer's reservation covers the record being received.
    pub(super) async fn cover_receive(&mut self, decoder: &RecordDecoder) -> Result<(), String> {
        let want = READ_CHUNK.saturating_add(decoder.pending_len());
        if want <= self.recv.bytes() {
            return Ok(());
        }
        let more = self
            .share
            .reserve_queued(want - self.recv.bytes())
            .await
            .map_err(|e| {
                format!(
                    "no memory for a record of {} bytes: {e}",
                    decoder.pending_len()
                )
            })?;
        self.recv.merge(more);
        Ok(())
    }

    /// The reservation a call takes with it: its record's bytes (moved from the receive
    /// buffer's) and its reply's `estimate`, waiting for memory when there is none.
    pub(super) async fn for_call(
        &mut self,
        record_len: usize,
        estimate: usize,
    ) -> Result<Reservation, String> {
        let mut held = self.recv.split(record_len);
        // Never ask for more than the connection could ever hold beside what it holds now
        // (the wait would have no end); a reply that proves larger reserves the rest.
        let room = self
            .share
            .limit()
            .saturating_sub(self.recv.bytes().saturating_add(held.bytes()));
        let reply = self
            .share
            .reserve_queued(estimate.min(room))
            .await
            .map_err(|e| format!("no memory for a call's reply: {e}"))?;
        held.merge(reply);
        Ok(held)
    }
}
