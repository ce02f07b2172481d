//! The relay of events between nodes: one `LISTEN` connection per node,
//! made before the node serves.
//!
//! Every group of checkpoints announces, once committed, the sessions that
//! got new events and their first and last sequence (`overseer_events`).
//! For a session someone on this node listens to, and whose actor is not
//! here (the owner's actor publishes its own events), the relay reads those
//! events from the store and publishes them to the local hub, where event
//! streams take them exactly as they take local ones (they skip what they
//! already sent by sequence number and fill any hole from the store). After
//! the connection is lost and made again, every listened-to session is
//! caught up from the store. It holds no state beyond its connection.
//!
//! The tenant-wide views (`/v1/events`) take every session's events from
//! the hub's all-sessions channel: while something listens there, the
//! announced events of sessions whose actors run elsewhere are read and
//! published to it too, so a tenant's stream on any node carries the whole
//! cluster's sessions. Announcements lost with the connection cannot be
//! replayed for sessions nobody names, so after a reconnection those views
//! are told to start over from their snapshot (`EventHub::missed_all`).

use std::time::Duration;

use futures::StreamExt;
use overseer_actors::model::{Notification, SessionId};
use overseer_actors::Overseer;
use tokio_postgres::AsyncMessage;

use crate::backoff::Backoff;
use crate::store::postgres::{PgStore, EVENTS_CHANNEL};

/// The wait before the relay connects again: from 100 ms, doubling, at
/// most 2 s.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// The `application_name` of a node's relay connection.
pub(super) const RELAY_APPLICATION: &str = "overseer-relay";

/// A connection that listens for announcements, and what it heard.
pub(super) struct Listening {
    client: tokio_postgres::Client,
    heard: tokio::sync::mpsc::UnboundedReceiver<String>,
    driver: tokio::task::JoinHandle<()>,
}

/// Connects and listens. A node does this once before it serves (so no
/// stream it serves can miss an announcement made before it listened),
/// then [`run`] takes over.
pub(super) async fn connect(store: &PgStore) -> Result<Listening, tokio_postgres::Error> {
    let mut config = store.connection_config();
    config.application_name(RELAY_APPLICATION);
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, heard) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "event relay connection ended");
                    return;
                }
            }
        }
    });
    if let Err(e) = client
        .batch_execute(&format!("LISTEN {EVENTS_CHANNEL}"))
        .await
    {
        driver.abort();
        return Err(e);
    }
    Ok(Listening {
        client,
        heard,
        driver,
    })
}

/// The relay loop: relays what `first` hears until its connection ends,
/// then reconnects, listens and relays again.
pub(super) async fn run(store: PgStore, overseer: Overseer, first: Listening) {
    // Consecutive failed connections: the wait before the next one grows
    // with them (the crate's one backoff policy, with jitter, so the nodes
    // of a cluster do not all come back to a restarted database at once).
    let mut failures = 0u32;
    let mut next = Some(first);
    let mut again = false;
    loop {
        let listening = match next.take() {
            Some(l) => Ok(l),
            None => connect(&store).await,
        };
        match listening {
            Ok(l) => {
                relay(&overseer, l, again).await;
                failures = 0;
            }
            Err(e) => {
                tracing::warn!(error = %e, "event relay connection lost; reconnecting");
                failures = failures.saturating_add(1);
            }
        }
        again = true;
        tokio::time::sleep(RECONNECT.delay(failures)).await;
    }
}

/// Relays what one connection hears, until it ends. `again`: a connection
/// made after another one ended (announcements may have been missed).
async fn relay(overseer: &Overseer, listening: Listening, again: bool) {
    let Listening {
        client,
        mut heard,
        driver,
    } = listening;
    // Whatever was announced while this node was not listening: each
    // listened-to session from the store; the tenant-wide views cannot know
    // which sessions to read, so they start over from their snapshot.
    let hub = overseer.hub();
    for id in hub.watched() {
        catch_up(overseer, id, None).await;
    }
    if again {
        hub.missed_all();
    }
    while let Some(payload) = heard.recv().await {
        for item in payload.split(',') {
            let mut parts = item.split(' ');
            let (Some(id), Some(first), Some(last)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(id), Ok(first), Ok(last)) = (
                id.parse::<SessionId>(),
                first.parse::<u64>(),
                last.parse::<u64>(),
            ) else {
                continue;
            };
            if hub.is_watched(id) {
                catch_up(overseer, id, Some(first)).await;
            } else {
                announce(overseer, id, first, last).await;
            }
        }
    }
    driver.abort();
    drop(client);
}

/// Gives the tenant-wide views (the hub's all-sessions channel) the events
/// `first..=last` of a session nobody here listens to on its own, if
/// anything listens to all sessions and its actor is not here (then it
/// published them itself).
async fn announce(overseer: &Overseer, id: SessionId, first: u64, last: u64) {
    if !overseer.hub().all_watched() || overseer.is_live(id) || last < first {
        return;
    }
    let count = usize::try_from(last - first + 1).unwrap_or(usize::MAX);
    match overseer
        .store()
        .events_after(id, first.saturating_sub(1), count)
        .await
    {
        Ok(events) => {
            for e in events {
                // With no channel of its own, only the all-sessions one hears it.
                overseer.hub().publish(id, Notification::Event(e));
            }
        }
        Err(e) => tracing::debug!(session_id = %id, error = %e, "cannot relay events"),
    }
}

/// Publishes to local listeners the stored events of `id` they have not had
/// (from `first`, or after the last one published here).
async fn catch_up(overseer: &Overseer, id: SessionId, first: Option<u64>) {
    if !overseer.hub().is_watched(id) || overseer.is_live(id) {
        return;
    }
    let published = overseer.hub().last_published(id);
    // From what this node last published (the streams fill any hole from
    // the store), or, for a channel that has had nothing yet, from the
    // announced events.
    let after = match (published, first) {
        (Some(p), _) => p,
        (None, Some(f)) => f.saturating_sub(1),
        // Nothing published here yet: the stream replayed the store itself.
        (None, None) => return,
    };
    match overseer.store().events_after(id, after, usize::MAX).await {
        Ok(events) => {
            for e in events {
                overseer.hub().publish(id, Notification::Event(e));
            }
        }
        Err(e) => tracing::debug!(session_id = %id, error = %e, "cannot relay events"),
    }
}
