//! The relay of events between nodes: one `LISTEN` connection per node.
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

use std::time::Duration;

use futures::StreamExt;
use overseer_actors::model::{Notification, SessionId};
use overseer_actors::Overseer;
use tokio_postgres::AsyncMessage;

use crate::store::postgres::{PgStore, EVENTS_CHANNEL};

/// The relay loop: (re)connects, listens, relays.
pub(super) async fn run(store: PgStore, overseer: Overseer) {
    let mut pause = Duration::from_millis(100);
    loop {
        match listen(&store, &overseer).await {
            Ok(()) => pause = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(error = %e, "event relay connection lost; reconnecting");
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
        tokio::time::sleep(pause).await;
    }
}

async fn listen(store: &PgStore, overseer: &Overseer) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = store
        .connection_config()
        .connect(tokio_postgres::NoTls)
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
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
    client
        .batch_execute(&format!("LISTEN {EVENTS_CHANNEL}"))
        .await?;
    // Whatever was announced while this node was not listening.
    for id in overseer.runtime().hub.watched() {
        catch_up(overseer, id, None).await;
    }
    while let Some(payload) = rx.recv().await {
        for item in payload.split(',') {
            let mut parts = item.split(' ');
            let (Some(id), Some(first)) = (parts.next(), parts.next()) else {
                continue;
            };
            let (Ok(id), Ok(first)) = (id.parse::<SessionId>(), first.parse::<u64>()) else {
                continue;
            };
            catch_up(overseer, id, Some(first)).await;
        }
    }
    driver.abort();
    drop(client);
    Ok(())
}

/// Publishes to local listeners the stored events of `id` they have not had
/// (from `first`, or after the last one published here).
async fn catch_up(overseer: &Overseer, id: SessionId, first: Option<u64>) {
    let runtime = overseer.runtime();
    if !runtime.hub.is_watched(id) || runtime.live.contains_key(&id) {
        return;
    }
    let published = runtime.hub.last_published(id);
    // From what this node last published (the streams fill any hole from
    // the store), or, for a channel that has had nothing yet, from the
    // announced events.
    let after = match (published, first) {
        (Some(p), _) => p,
        (None, Some(f)) => f.saturating_sub(1),
        // Nothing published here yet: the stream replayed the store itself.
        (None, None) => return,
    };
    match runtime.store.events_after(id, after, usize::MAX).await {
        Ok(events) => {
            for e in events {
                runtime.hub.publish(id, Notification::Event(e));
            }
        }
        Err(e) => tracing::debug!(session_id = %id, error = %e, "cannot relay events"),
    }
}
