//! Timers: reconnect back-off, the drain limit of a replaced transport, and the time an
//! accepted transport may take to send its first header.

use std::time::Instant;

use super::{Action, Engine, PathId, PathState, Token};

impl Engine {
    /// Earliest time [`Engine::handle_timeout`] must be called.
    ///
    /// Drivers ask after every batch of actions, so this is not a walk over every peer's paths
    /// (up to `max_peers` × 8): it returns a bound kept as deadlines are set, which is never
    /// later than the earliest one. A deadline that goes away (a connect succeeded, a drain
    /// ended) can leave the bound early; the call to `handle_timeout` it causes finds nothing
    /// due and computes the bound afresh.
    pub fn poll_timeout(&self) -> Option<Instant> {
        debug_assert!(
            match (self.next_timer, self.scan_timers()) {
                (_, None) => true,
                (Some(bound), Some(first)) => bound <= first,
                (None, Some(_)) => false,
            },
            "a deadline was set without Engine::arm"
        );
        self.next_timer
    }

    /// Lowers the bound [`Engine::poll_timeout`] returns to `at`. Every place that sets a
    /// deadline calls it.
    pub(super) fn arm(&mut self, at: Instant) {
        self.next_timer = Some(self.next_timer.map_or(at, |t| t.min(at)));
    }

    /// The earliest deadline, by looking at all of them.
    fn scan_timers(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| c.paths.iter())
            .flat_map(|p| p.reconnect_at.into_iter().chain(p.draining.map(|d| d.1)))
            .chain(self.pending.values().map(|u| u.deadline))
            .min()
    }

    /// Runs due reconnects, ends drains past their limit and closes accepted transports that
    /// sent no header in time.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired: Vec<Token> = self
            .pending
            .iter()
            .filter(|(_, u)| u.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        // Table order depends on the hash key; close in token order.
        expired.sort_unstable();
        for t in expired {
            self.pending.remove(&t);
            self.limits.unbound_expired += 1;
            self.actions.push_back(Action::Close(t));
        }
        let mut drained = Vec::new();
        for c in self.conns.values() {
            for p in &c.paths {
                if let Some((old, t)) = p.draining
                    && t <= now
                {
                    drained.push((
                        PathId {
                            peer: c.peer,
                            index: p.index,
                        },
                        old,
                    ));
                }
            }
        }
        for (id, old) in drained {
            self.actions.push_back(Action::Close(old));
            self.finish_drain(now, id);
        }
        let mut due = Vec::new();
        for c in self.conns.values_mut() {
            for p in &mut c.paths {
                if p.reconnect_at.is_some_and(|t| t <= now) {
                    p.reconnect_at = None;
                    if p.state == PathState::Down {
                        p.state = PathState::Connecting;
                        due.push(PathId {
                            peer: c.peer,
                            index: p.index,
                        });
                    }
                }
            }
        }
        self.actions.extend(due.into_iter().map(Action::Connect));
        self.next_timer = self.scan_timers();
    }
}
