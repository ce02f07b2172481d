//! Live event fan-out: one broadcast channel per session that has
//! subscribers, and one channel of every session's durable events (for a
//! tenant-wide view, which the edge filters by tenant; in cluster mode the
//! relay adds other nodes' events to it, and says when it missed some).
//!
//! Owns delivery to in-process subscribers only. It deliberately stores
//! nothing: the durable event log is in the store, and a subscriber that lags
//! or arrives late replays from there by sequence number. It knows no
//! tenants: events carry a session id, and who may see which session is the
//! edge's business.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{broadcast, watch};

use crate::model::{Event, Notification, SessionId, SessionIdHasher};

/// Capacity of each subscriber's buffer. A subscriber that falls further behind
/// gets `Lagged` and must resume from the store: a slow reader never blocks a
/// session.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// Capacity of each all-sessions subscriber's buffer. It carries every
/// durable event of the node, so it is larger; a subscriber that lags gets
/// `Lagged` and must start over from a snapshot.
pub const ALL_SESSIONS_BUFFER: usize = 8192;

/// Per-session broadcast channels, created on first subscription.
#[derive(Clone)]
pub struct EventHub {
    channels: Arc<DashMap<SessionId, Channel, SessionIdHasher>>,
    /// Channel count at which `subscribe` next sweeps channels nobody reads
    /// (a session that never publishes again would otherwise keep its
    /// buffer forever). Doubles with the live count: amortised O(1).
    sweep_at: Arc<AtomicUsize>,
    /// Every session's durable events (never text deltas), for
    /// [`EventHub::subscribe_all`]. Sending costs a clone per event only
    /// while someone listens.
    all: broadcast::Sender<Event>,
    /// Counts the times the all-sessions channel missed events it cannot
    /// give again ([`EventHub::missed_all`]).
    all_missed: Arc<watch::Sender<u64>>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self {
            channels: Arc::default(),
            sweep_at: Arc::new(AtomicUsize::new(MIN_SWEEP)),
            all: broadcast::channel(ALL_SESSIONS_BUFFER).0,
            all_missed: Arc::new(watch::channel(0).0),
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

    /// Subscribes to the durable events of every session, in the order they
    /// are published (per session: sequence order). Text deltas are not
    /// sent here: a stream of every session's tokens would be the busiest
    /// channel of the node, and nobody watches all sessions type at once.
    pub fn subscribe_all(&self) -> broadcast::Receiver<Event> {
        self.all.subscribe()
    }

    /// Whether anyone subscribes to every session's events (cluster mode
    /// relays other nodes' events to the all-sessions channel only then).
    pub fn all_watched(&self) -> bool {
        self.all.receiver_count() > 0
    }

    /// Tells all-sessions subscribers that events were missed and will not
    /// come (cluster mode: the relay lost its connection to the database
    /// and with it the announcements made meanwhile); they start over from
    /// a snapshot.
    pub fn missed_all(&self) {
        self.all_missed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever [`EventHub::missed_all`] is called.
    pub fn all_missed(&self) -> watch::Receiver<u64> {
        self.all_missed.subscribe()
    }

    /// Number of sessions with a channel (for metrics and tests).
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Publishes to a session's subscribers, if any; drops the channel once
    /// nobody listens so idle sessions cost nothing here.
    pub fn publish(&self, id: SessionId, n: Notification) {
        if let Notification::Event(e) = &n {
            if self.all.receiver_count() > 0 {
                let _ = self.all.send(e.clone());
            }
        }
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
    /// mode relays events another node checkpointed only to those).
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

    fn event(id: SessionId, seq: u64) -> Notification {
        Notification::Event(Event {
            session_id: id,
            seq,
            at_ms: 0,
            kind: crate::model::EventKind::TurnStarted { turn: 1 },
        })
    }

    #[test]
    fn all_sessions_subscribers_get_every_durable_event_and_no_deltas() {
        let hub = EventHub::new();
        let (a, b) = (SessionId::generate(), SessionId::generate());
        // Published before anyone listens: not buffered for later subscribers.
        hub.publish(a, event(a, 1));
        let mut all = hub.subscribe_all();
        // No per-session subscriber exists: the all-sessions one still hears.
        hub.publish(a, event(a, 2));
        hub.publish(
            b,
            Notification::TextDelta {
                session_id: b,
                text: "tok".into(),
            },
        );
        hub.publish(b, event(b, 1));
        let got: Vec<(SessionId, u64)> = std::iter::from_fn(|| all.try_recv().ok())
            .map(|e| (e.session_id, e.seq))
            .collect();
        assert_eq!(got, vec![(a, 2), (b, 1)]);
        assert_eq!(hub.channels(), 0, "no per-session channel was created");
    }
}
