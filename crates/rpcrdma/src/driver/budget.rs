//! The server's memory budget at the verbs driver: a reply's Sends and RDMA Writes are held in
//! the connection's budget until the transport drops them ([`hold_in_budget`]), and so are the
//! responder-provided Read chunks until they are invalidated ([`BudgetedRegistrar`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::responder;

/// The registrar of responder-provided Read chunks: each chunk's bytes are reserved in the
/// connection's memory budget from its registration to its invalidation (a chunk that does not
/// fit is refused: the Responder answers RDMA2_ERR_SYSTEM).
pub(super) struct BudgetedRegistrar {
    pub(super) inner: super::link::VerbsRegistrar,
    pub(super) budget: Arc<oncrpc::ConnBudget>,
    pub(super) held: HashMap<crate::engine::RegionId, oncrpc::Reservation>,
}

impl crate::engine::Registrar for BudgetedRegistrar {
    fn register_source(
        &mut self,
        data: Bytes,
    ) -> Result<crate::engine::Region, crate::engine::RegError> {
        let r = self
            .budget
            .try_reserve(data.len())
            .map_err(|e| crate::engine::RegError::Register(e.to_string()))?;
        let region = self.inner.register_source(data)?;
        self.held.insert(region.id, r);
        Ok(region)
    }
    fn register_sink(
        &mut self,
        len: usize,
    ) -> Result<crate::engine::Region, crate::engine::RegError> {
        self.inner.register_sink(len)
    }
    fn sink_contents(
        &mut self,
        id: crate::engine::RegionId,
        len: usize,
    ) -> Result<Bytes, crate::engine::RegError> {
        self.inner.sink_contents(id, len)
    }
    fn invalidate(
        &mut self,
        id: crate::engine::RegionId,
        remote: bool,
    ) -> Result<(), crate::engine::RegError> {
        self.held.remove(&id);
        self.inner.invalidate(id, remote)
    }
}

/// Reserve the bytes of a reply's Sends and RDMA Writes in `budget` and tie the reservation to
/// those buffers, so it is given back when the transport has sent (and dropped) the last one.
///
/// `pre` is what the call reserved before its reply was built: shrunk to the reply when it
/// covers it, so that the reply never waits for memory while it is held outside the budget.
pub(super) async fn hold_in_budget(
    actions: Vec<responder::Action>,
    budget: &Arc<oncrpc::ConnBudget>,
    wait: Duration,
    pre: Option<oncrpc::Reservation>,
) -> Result<Vec<responder::Action>, oncrpc::BudgetError> {
    use responder::Action;
    let total: usize = actions
        .iter()
        .map(|a| match a {
            Action::Write { data, .. } | Action::Send { data, .. } => data.len(),
            // Nothing to hold for it; it is performed with the rest (see `perform`).
            Action::Close => 0,
        })
        .sum();
    if total == 0 {
        return Ok(actions);
    }
    let held = match pre {
        Some(mut r) if r.bytes() >= total => {
            r.shrink(total);
            r
        }
        other => {
            drop(other);
            budget.reserve(total, wait).await?
        }
    };
    // The reservation goes with the last of the buffers: owned by the one buffer of a reply
    // that is a single Send (the common case: no shared count to allocate), shared otherwise.
    enum Owner {
        One(#[allow(dead_code)] oncrpc::Reservation),
        Shared(#[allow(dead_code)] Arc<oncrpc::Reservation>),
    }
    struct Held {
        data: Bytes,
        _reservation: Owner,
    }
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.data
        }
    }
    let buffers = actions
        .iter()
        .filter(|a| matches!(a, Action::Write { .. } | Action::Send { .. }))
        .count();
    let mut one = Some(held);
    let mut shared = None;
    if buffers > 1 {
        shared = one.take().map(Arc::new);
    }
    let mut hold = |data: Bytes| {
        let owner = match one.take() {
            Some(r) => Owner::One(r),
            None => match &shared {
                Some(s) => Owner::Shared(Arc::clone(s)),
                // Unreachable: `one` serves a single buffer, `shared` several.
                None => return data,
            },
        };
        Bytes::from_owner(Held {
            data,
            _reservation: owner,
        })
    };
    Ok(actions
        .into_iter()
        .map(|a| match a {
            Action::Write { segment, data } => Action::Write {
                segment,
                data: hold(data),
            },
            Action::Send { data, invalidate } => Action::Send {
                data: hold(data),
                invalidate,
            },
            Action::Close => Action::Close,
        })
        .collect())
}
