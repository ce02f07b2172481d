//! Restart policy as a pure decision: given the policy, the restarts
//! seen so far and the time, restart after a backoff or give up. A failure
//! the store caused while it was down ([`store_down`]) is not counted: the
//! session is retried at the longest backoff until the store serves again,
//! so a full disk never fails sessions for good.
//!
//! Owns only the arithmetic and the per-session bookkeeping every supervisor
//! keeps ([`Restarts`], shared by the orchestrator for roots and by each
//! session actor for its children). Reloading the checkpoint and respawning
//! is the supervisor's job ([`crate::orchestrator`], [`crate::session`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::model::SessionId;
use crate::store::StoreError;

use serde::{Deserialize, Serialize};

/// Whether an actor failed because the store could not serve (it is down
/// for now and recovers on its own, see [`StoreError::Unavailable`]): not
/// the session's fault, so not counted against its restarts.
pub(crate) fn store_down(err: &ractor::ActorProcessingErr) -> bool {
    err.downcast_ref::<StoreError>()
        .is_some_and(StoreError::is_unavailable)
}

/// [`store_down`] for a reload or respawn that failed.
pub(crate) fn store_down_error(e: &crate::SessionError) -> bool {
    matches!(e, crate::SessionError::Store(s) if s.is_unavailable())
}

/// The least delay between two attempts to restart a session while the
/// store is down.
pub(crate) const STORE_DOWN_RETRY: Duration = Duration::from_secs(1);

/// The restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// Most restarts within the window.
    pub max_restarts: u32,
    /// Window length in seconds.
    pub restart_window_secs: u64,
    /// First backoff.
    pub backoff_base_ms: u64,
    /// Backoff ceiling.
    pub backoff_max_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 3,
            restart_window_secs: 60,
            backoff_base_ms: 100,
            backoff_max_ms: 5_000,
        }
    }
}

/// What to do about a failed actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Respawn after this delay.
    Restart(Duration),
    /// The limit is exceeded: mark the session failed.
    GiveUp,
}

/// Restarts recorded for one session (monotonic milliseconds).
#[derive(Debug, Clone, Default)]
pub struct RestartHistory {
    at_ms: Vec<u64>,
}

impl RestartHistory {
    /// Decides about a new failure at `now_ms` and, for a restart, records it.
    pub fn decide(&mut self, policy: &RestartPolicy, now_ms: u64) -> Decision {
        let window = policy.restart_window_secs.saturating_mul(1000);
        self.at_ms.retain(|&t| now_ms.saturating_sub(t) < window);
        let n = self.at_ms.len() as u32;
        if n >= policy.max_restarts {
            return Decision::GiveUp;
        }
        self.at_ms.push(now_ms);
        let backoff = policy
            .backoff_base_ms
            .saturating_mul(1u64 << n.min(20))
            .min(policy.backoff_max_ms);
        Decision::Restart(Duration::from_millis(backoff))
    }
}

/// The restart histories one supervisor keeps, one per supervised session
/// that failed recently. An entry is dropped when the session gives up,
/// stops normally or finishes, so the map holds only sessions in a crash
/// loop.
#[derive(Debug)]
pub struct Restarts {
    histories: HashMap<SessionId, RestartHistory>,
    epoch: tokio::time::Instant,
}

impl Default for Restarts {
    fn default() -> Self {
        Self {
            histories: HashMap::new(),
            epoch: tokio::time::Instant::now(),
        }
    }
}

impl Restarts {
    /// Decides about a failure of `id` now. A [`Decision::GiveUp`] forgets
    /// the session's history (it will not be restarted again).
    pub fn on_failure(&mut self, policy: &RestartPolicy, id: SessionId) -> Decision {
        self.prune(policy);
        let now = self.now();
        let decision = self.histories.entry(id).or_default().decide(policy, now);
        if decision == Decision::GiveUp {
            self.histories.remove(&id);
        }
        decision
    }

    /// Forgets the histories whose restarts have all left the window: those
    /// sessions are no longer in a crash loop.
    pub fn prune(&mut self, policy: &RestartPolicy) {
        let now = self.now();
        let window = policy.restart_window_secs.saturating_mul(1000);
        self.histories
            .retain(|_, h| h.at_ms.iter().any(|&t| now.saturating_sub(t) < window));
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Forgets a session that stopped normally or finished.
    pub fn forget(&mut self, id: &SessionId) {
        self.histories.remove(id);
    }

    /// Sessions with a history.
    pub fn len(&self) -> usize {
        self.histories.len()
    }

    /// Whether no session has a history.
    pub fn is_empty(&self) -> bool {
        self.histories.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_exponentially_then_gives_up() {
        let p = RestartPolicy::default();
        let mut h = RestartHistory::default();
        assert_eq!(
            h.decide(&p, 0),
            Decision::Restart(Duration::from_millis(100))
        );
        assert_eq!(
            h.decide(&p, 10),
            Decision::Restart(Duration::from_millis(200))
        );
        assert_eq!(
            h.decide(&p, 20),
            Decision::Restart(Duration::from_millis(400))
        );
        assert_eq!(h.decide(&p, 30), Decision::GiveUp);
    }

    #[test]
    fn old_restarts_leave_the_window() {
        let p = RestartPolicy::default();
        let mut h = RestartHistory::default();
        for t in 0..3 {
            assert!(matches!(h.decide(&p, t), Decision::Restart(_)));
        }
        assert_eq!(
            h.decide(&p, 61_000),
            Decision::Restart(Duration::from_millis(100))
        );
    }

    #[test]
    fn giving_up_forgets_the_history() {
        let p = RestartPolicy::default();
        let mut r = Restarts::default();
        let id = SessionId::generate();
        for _ in 0..3 {
            assert!(matches!(r.on_failure(&p, id), Decision::Restart(_)));
        }
        assert_eq!(r.len(), 1);
        assert_eq!(r.on_failure(&p, id), Decision::GiveUp);
        assert!(r.is_empty());
    }

    #[test]
    fn backoff_is_capped() {
        let p = RestartPolicy {
            max_restarts: 100,
            ..RestartPolicy::default()
        };
        let mut h = RestartHistory::default();
        let mut last = Duration::ZERO;
        for t in 0..20 {
            if let Decision::Restart(d) = h.decide(&p, t) {
                last = d;
            }
        }
        assert_eq!(last, Duration::from_millis(5_000));
    }
}
