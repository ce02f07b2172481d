//! Live event fan-out: one broadcast channel per session that has subscribers.
//!
//! Owns delivery to in-process subscribers only. It deliberately stores
//! nothing: the durable event log is in the store, and a subscriber that lags
//! or arrives late replays from there by sequence number.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::broadcast;

use crate::model::{Notification, SessionId};

/// Capacity of each subscriber's buffer. A subscriber that falls further behind
/// gets `Lagged` and must resume from the store: a slow reader never blocks a
/// session.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// Per-session broadcast channels, created on first subscription.
#[derive(Clone)]
pub struct EventHub {
    channels: Arc<DashMap<SessionId, Channel>>,
    /// Channel count at which `subscribe` next sweeps channels nobody reads
    /// (a session that never publishes again would otherwise keep its
    /// buffer forever). Doubles with the live count: amortised O(1).
    sweep_at: Arc<AtomicUsize>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self {
            channels: Arc::default(),
            sweep_at: Arc::new(AtomicUsize::new(MIN_SWEEP)),
        }
    }
}

const MIN_SWEEP: usize = 64;

/// Nothing published on this channel yet.
const NONE_PUBLISHED: u64 = u64::MAX;

struct Channel {
    tx: broadcast::Sender<Notification>,
    /// Sequence of the last durable event published here, so a session
    /// restarted after dying between a checkpoint and its publication can
    /// publish what its subscribers missed.
    last_seq: AtomicU64,
}

impl EventHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscribes to a session's live notifications.
    pub fn subscribe(&self, id: SessionId) -> broadcast::Receiver<Notification> {
        if self.channels.len() >= self.sweep_at.load(Ordering::Relaxed) {
            self.channels.retain(|_, c| c.tx.receiver_count() > 0);
            let next = (self.channels.len() * 2).max(MIN_SWEEP);
            self.sweep_at.store(next, Ordering::Relaxed);
        }
        self.channels
            .entry(id)
            .or_insert_with(|| Channel {
                tx: broadcast::channel(SUBSCRIBER_BUFFER).0,
                last_seq: AtomicU64::new(NONE_PUBLISHED),
            })
            .tx
            .subscribe()
    }

    /// Number of sessions with a channel (for metrics and tests).
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Publishes to a session's subscribers, if any; drops the channel once
    /// nobody listens so idle sessions cost nothing here.
    pub fn publish(&self, id: SessionId, n: Notification) {
        let gone = match self.channels.get(&id) {
            Some(c) => {
                if let Notification::Event(e) = &n {
                    let _ = c
                        .last_seq
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                            (old == NONE_PUBLISHED || e.seq > old).then_some(e.seq)
                        });
                }
                c.tx.send(n).is_err()
            }
            None => return,
        };
        if gone {
            self.channels
                .remove_if(&id, |_, c| c.tx.receiver_count() == 0);
        }
    }

    /// Whether anyone in this process listens to a session now (cluster
    /// mode relays events another node checkpointed only to those, §15).
    pub fn is_watched(&self, id: SessionId) -> bool {
        self.channels
            .get(&id)
            .is_some_and(|c| c.tx.receiver_count() > 0)
    }

    /// The sessions someone in this process listens to now.
    pub fn watched(&self) -> Vec<SessionId> {
        self.channels
            .iter()
            .filter(|c| c.tx.receiver_count() > 0)
            .map(|c| *c.key())
            .collect()
    }

    /// The last event sequence published to a session's current
    /// subscribers, if it has any and something was published to them.
    pub fn last_published(&self, id: SessionId) -> Option<u64> {
        let c = self.channels.get(&id)?;
        match c.last_seq.load(Ordering::Relaxed) {
            NONE_PUBLISHED => None,
            seq => Some(seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_nobody_reads_are_swept_on_later_subscriptions() {
        let hub = EventHub::new();
        for _ in 0..MIN_SWEEP {
            drop(hub.subscribe(SessionId::generate()));
        }
        assert_eq!(hub.channels(), MIN_SWEEP);
        let kept = hub.subscribe(SessionId::generate());
        assert_eq!(hub.channels(), 1, "stale channels swept, the live one kept");
        drop(kept);
    }
}
