//! The per-owner circuit breaker of forwarding (cluster mode).
//!
//! A node that forwards to an owner which stops answering (stopped, hung,
//! partitioned, or dead but still within its lease) must not spend every
//! request's deadline finding that out again: once one forward to a node
//! got no answer, the breaker for that node opens and further forwards to it
//! are answered at once (503 `owner_unreachable` with `Retry-After`) for a
//! cool-down; then one request is let through as a probe, and its answer
//! closes the breaker (the owner answers again) or opens it for another
//! cool-down. Meanwhile the owner either comes back or its lease runs out
//! and another node takes its sessions (then nothing is forwarded to it).
//!
//! Owns that state per node id and nothing else: what counts as "no
//! answer" is the router's (a transport error or the forward deadline, never
//! an answer of any status), and the clock is injected so the transitions
//! are tested on their own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// How long an entry of a node that never answered again is kept (a dead
/// node's id never comes back; this bounds the map).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The breakers of every owner this node forwards to.
#[derive(Debug)]
pub(super) struct Breakers {
    cooldown: Duration,
    /// Nodes whose breaker is open or half-open; absent means closed.
    nodes: Mutex<HashMap<Uuid, Open>>,
}

#[derive(Debug, Clone, Copy)]
struct Open {
    /// Until when forwards fail fast.
    until: Instant,
    /// A probe is in flight (half-open).
    probing: bool,
}

/// Leave to forward once: report its outcome with [`Ticket::answered`] or
/// [`Ticket::unanswered`]. Dropped without either (the caller gave up, the
/// request was not sent), a probe is released for the next request.
#[must_use]
pub(super) struct Ticket<'a> {
    breakers: &'a Breakers,
    node: Uuid,
    probe: bool,
    done: bool,
}

impl Breakers {
    /// Breakers that stay open for `cooldown` (at least 1 s) after a
    /// forward got no answer.
    pub(super) fn new(cooldown: Duration) -> Self {
        Self {
            cooldown: cooldown.max(Duration::from_secs(1)),
            nodes: Mutex::new(HashMap::new()),
        }
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Open>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leave to forward to `node` now, or how long until it is worth
    /// trying again (the breaker is open, or its probe is in flight).
    pub(super) fn admit(&self, node: Uuid, now: Instant) -> Result<Ticket<'_>, Duration> {
        let mut nodes = self.nodes();
        let probe = match nodes.get_mut(&node) {
            None => false,
            Some(open) if now < open.until => return Err(open.until - now),
            Some(open) if open.probing => return Err(self.cooldown),
            Some(open) => {
                open.probing = true;
                true
            }
        };
        Ok(Ticket {
            breakers: self,
            node,
            probe,
            done: false,
        })
    }

    /// Whether forwards to `node` fail fast now (for tests and metrics).
    #[cfg(test)]
    fn is_open(&self, node: Uuid, now: Instant) -> bool {
        self.nodes().get(&node).is_some_and(|o| now < o.until)
    }
}

impl Ticket<'_> {
    /// The owner answered (any status): its breaker closes.
    pub(super) fn answered(mut self) {
        self.done = true;
        self.breakers.nodes().remove(&self.node);
    }

    /// The owner did not answer: its breaker opens for a cool-down from
    /// `now`. Returns how long that is.
    pub(super) fn unanswered(mut self, now: Instant) -> Duration {
        self.done = true;
        let cooldown = self.breakers.cooldown;
        let mut nodes = self.breakers.nodes();
        nodes.retain(|_, o| now.saturating_duration_since(o.until) < FORGET_AFTER);
        nodes.insert(
            self.node,
            Open {
                until: now + cooldown,
                probing: false,
            },
        );
        cooldown
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.probe && !self.done {
            if let Some(open) = self.breakers.nodes().get_mut(&self.node) {
                open.probing = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(2);

    #[test]
    fn one_unanswered_forward_opens_the_breaker_of_that_node_only() {
        let b = Breakers::new(COOLDOWN);
        let (hung, other) = (Uuid::new_v4(), Uuid::new_v4());
        let t0 = Instant::now();
        let ticket = b.admit(hung, t0).unwrap();
        assert_eq!(ticket.unanswered(t0), COOLDOWN);
        assert!(b.is_open(hung, t0));
        let wait = b.admit(hung, t0 + Duration::from_millis(500)).err();
        assert_eq!(wait, Some(Duration::from_millis(1_500)), "fails fast");
        b.admit(other, t0).unwrap().answered();
        assert!(!b.is_open(other, t0));
    }

    #[test]
    fn after_the_cooldown_one_probe_goes_through_and_its_answer_decides() {
        let b = Breakers::new(COOLDOWN);
        let node = Uuid::new_v4();
        let t0 = Instant::now();
        let _ = b.admit(node, t0).unwrap().unanswered(t0);
        let later = t0 + COOLDOWN;
        let probe = b.admit(node, later).unwrap();
        // Only one probe at a time.
        assert_eq!(b.admit(node, later).err(), Some(COOLDOWN));
        // Still no answer: open for another cool-down.
        let _ = probe.unanswered(later);
        assert!(b.admit(node, later + Duration::from_secs(1)).is_err());
        // An answer closes it: every forward goes through again.
        let again = later + COOLDOWN;
        b.admit(node, again).unwrap().answered();
        assert!(b.admit(node, again).is_ok());
        assert!(b.admit(node, again).is_ok());
    }

    #[test]
    fn a_probe_given_up_lets_the_next_request_probe() {
        let b = Breakers::new(COOLDOWN);
        let node = Uuid::new_v4();
        let t0 = Instant::now();
        let _ = b.admit(node, t0).unwrap().unanswered(t0);
        let later = t0 + COOLDOWN;
        drop(b.admit(node, later).unwrap());
        assert!(b.admit(node, later).is_ok());
    }

    #[test]
    fn a_closed_breaker_keeps_no_entry_and_old_entries_are_forgotten() {
        let b = Breakers::new(COOLDOWN);
        let t0 = Instant::now();
        let dead = Uuid::new_v4();
        let _ = b.admit(dead, t0).unwrap().unanswered(t0);
        let much_later = t0 + COOLDOWN + FORGET_AFTER;
        let other = Uuid::new_v4();
        let _ = b.admit(other, much_later).unwrap().unanswered(much_later);
        assert_eq!(b.nodes().len(), 1, "the long-dead node is forgotten");
        b.admit(other, much_later + COOLDOWN).unwrap().answered();
        assert!(b.nodes().is_empty());
    }
}
