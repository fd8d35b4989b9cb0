//! Timers: reconnect back-off and the drain limit of a replaced transport.

use std::time::Instant;

use super::{Action, Engine, PathId, PathState};

impl Engine {
    /// Earliest time [`Engine::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| c.paths.iter())
            .flat_map(|p| p.reconnect_at.into_iter().chain(p.draining.map(|d| d.1)))
            .min()
    }

    /// Runs due reconnects.
    pub fn handle_timeout(&mut self, now: Instant) {
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
    }
}
