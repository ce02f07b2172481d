//! Live event fan-out: one broadcast channel per session that has subscribers.
//!
//! Owns delivery to in-process subscribers only. It deliberately stores
//! nothing: the durable event log is in the store, and a subscriber that lags
//! or arrives late replays from there by sequence number.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::broadcast;

use crate::model::{Notification, SessionId};

/// Capacity of each subscriber's buffer. A subscriber that falls further behind
/// gets `Lagged` and must resume from the store: a slow reader never blocks a
/// session.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// Per-session broadcast channels, created on first subscription.
#[derive(Clone, Default)]
pub struct EventHub {
    channels: Arc<DashMap<SessionId, broadcast::Sender<Notification>>>,
}

impl EventHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscribes to a session's live notifications.
    pub fn subscribe(&self, id: SessionId) -> broadcast::Receiver<Notification> {
        self.channels
            .entry(id)
            .or_insert_with(|| broadcast::channel(SUBSCRIBER_BUFFER).0)
            .subscribe()
    }

    /// Publishes to a session's subscribers, if any; drops the channel once
    /// nobody listens so idle sessions cost nothing here.
    pub fn publish(&self, id: SessionId, n: Notification) {
        let gone = match self.channels.get(&id) {
            Some(tx) => tx.send(n).is_err(),
            None => return,
        };
        if gone {
            self.channels
                .remove_if(&id, |_, tx| tx.receiver_count() == 0);
        }
    }
}
