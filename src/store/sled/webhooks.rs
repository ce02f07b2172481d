//! The webhook deliveries and their log in the sled store: the
//! [`WebhookStore`] of a single node.
//!
//! Trees (beside the session trees of the parent module):
//!
//! | tree                 | key                                   | value |
//! |----------------------|---------------------------------------|-------|
//! | `webhooks`           | endpoint id (16 bytes)                | endpoint JSON |
//! | (`data`, kind `W`)   | BE u64 group number                   | (session id ‖ BE u64 first ‖ last event) per checkpoint that owes |
//! | (`data`, kind `O`)   | session id ‖ BE u64 event seq ‖ endpoint id | seed JSON (earlier binaries only) |
//! | `webhook_deliveries` | endpoint id ‖ `webhook-id` (16 bytes) | delivery JSON |
//! | `webhook_due`        | BE u64 due ms ‖ endpoint id ‖ `webhook-id` | empty |
//! | `webhook_sessions`   | session id ‖ endpoint id ‖ `webhook-id` | empty |
//!
//! `webhook_sessions` indexes the log by session, so purging a session
//! deletes its deliveries ([`purge_deliveries`], called by the purge).
//! Log entries are kept small: once its body is built a delivery drops the
//! call its seed carried, and once delivered its body
//! (`Delivery::compact`); at most [`LOG_KEEP`] finished ones per endpoint.
//!
//! **A checkpoint writes no delivery.** Its events are committed with it,
//! and what goes out is derived from them (`crate::webhooks::seeds_of`,
//! each under a `webhook-id` derived from the session and the event, so
//! that deriving it again gives the same id). A *group* of checkpoints
//! (one batch of the writer, `group_commit`) whose events owe deliveries
//! writes one row (kind `W`, keyed by the group's number) naming, per such
//! checkpoint, its session and the first and last numbers of those events:
//! under load one row for a hundred checkpoints, not a row per event. Once
//! the group is applied, the writer hands its deliveries to the delivery
//! task in memory ([`Feed`]), which sends none before a flush covers it.
//!
//! **The group's row is what survives a crash.** It stays until every
//! delivery it owes is settled (delivered, given up, or in the log to be
//! retried), then the delivery task removes it. A start (and a feed that
//! had to refuse deliveries, or lost track of some) scans the rows: the
//! events each names give its deliveries again, and those the log holds
//! already are settled. So a crash between a checkpoint and its deliveries
//! sends them after the restart, under the same `webhook-id`.
//!
//! **A delivery is sent before anything records it.** Until its first
//! attempt's outcome is saved, its event (and its group's row) is its only record
//! (a crash before that sends it again). Saving the outcomes of a round of
//! fresh attempts is one batch per tree: a log entry and its session index
//! entry each (and a due entry if it is to be retried). So a delivery that
//! succeeds at once costs its log entry, not a life in the schedule; only
//! one whose first attempt failed enters the due index.
//!
//! Rows of the outbox (kind `O`), which earlier binaries wrote with every
//! checkpoint, are still delivered as they were: taken, checked against the
//! event they name (`outbox::describes`), sent, and removed once their
//! outcome is logged.
//!
//! Retries live in the delivery log and its due index, written by the
//! delivery task directly (not through the checkpoint writer: they are not
//! session state), in an order that a crash leaves harmless: a new due
//! entry before the delivery it schedules, the old one after, so a due
//! entry may be stale (skipped and removed when met) but a pending delivery
//! never lacks one. Endpoints are flushed before a registration is
//! answered. A write failure closes the store's gate, as a failed
//! checkpoint would.

mod feed;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use overseer_actors::model::SessionId;
use overseer_actors::store::{CheckpointStore, StoreError};
use sled::{IVec, Tree};
use uuid::Uuid;

use super::codec::{self, corrupt};
use super::layout;
use super::trees::{Generation, Trees, View};
use super::SledStore;
use crate::webhooks::{
    describes, seeds_of, Claim, Delivery, DeliveryKey, DeliveryStatus, Endpoint, Outcome, Seed,
    Subscriptions, WebhookStore, LOG_KEEP,
};
pub(super) use feed::Feed;

/// Finished deliveries between two prunings of an endpoint's log.
const PRUNE_EVERY: u64 = 256;

/// The webhook trees of one opening of the database.
struct HookTrees {
    endpoints: Tree,
    outbox: View,
    deliveries: Tree,
    due: Tree,
    sessions: Tree,
}

impl HookTrees {
    fn open(trees: &Trees) -> Result<Self, sled::Error> {
        let db = &trees.db;
        Ok(Self {
            endpoints: db.open_tree("webhooks")?,
            outbox: trees.outbox.clone(),
            deliveries: db.open_tree("webhook_deliveries")?,
            due: db.open_tree("webhook_due")?,
            sessions: db.open_tree("webhook_sessions")?,
        })
    }
}

/// `session ‖ delivery key`: a delivery's entry in the session index.
fn session_key(session: &SessionId, dkey: &[u8; 32]) -> [u8; 48] {
    let mut key = [0u8; 48];
    key[..16].copy_from_slice(session.as_bytes());
    key[16..].copy_from_slice(dkey);
    key
}

/// Deletes the deliveries of session `id` (its purge). Their due entries go
/// stale and are dropped when met. Called by the purge before it removes
/// its marker, so a purge cut short does this again.
pub(super) fn purge_deliveries(trees: &Trees, id: &SessionId) -> Result<(), sled::Error> {
    let trees = HookTrees::open(trees)?;
    for key in trees.sessions.scan_prefix(id.as_bytes()).keys() {
        let key = key?;
        if let Some(dkey) = key.get(16..48) {
            trees.deliveries.remove(dkey)?;
        }
        trees.sessions.remove(key)?;
    }
    Ok(())
}

/// `session ‖ seq ‖ endpoint`: an outbox row's key.
pub(super) fn outbox_key(session: &SessionId, seq: u64, endpoint: &Uuid) -> [u8; 40] {
    let mut key = [0u8; 40];
    key[..24].copy_from_slice(&layout::seq_key(session, seq));
    key[24..].copy_from_slice(endpoint.as_bytes());
    key
}

/// The 16 bytes of a `webhook-id` (`msg_` + a UUID's hex).
fn msg_bytes(id: &str) -> Option<[u8; 16]> {
    let hex = id.strip_prefix("msg_")?;
    Uuid::parse_str(hex).ok().map(|u| *u.as_bytes())
}

fn delivery_key(endpoint: &Uuid, id: &str) -> Option<[u8; 32]> {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(endpoint.as_bytes());
    key[16..].copy_from_slice(&msg_bytes(id)?);
    Some(key)
}

fn due_key(at_ms: i64, endpoint: &Uuid, id: &str) -> Option<[u8; 40]> {
    let mut key = [0u8; 40];
    key[..8].copy_from_slice(&u64::try_from(at_ms.max(0)).unwrap_or(0).to_be_bytes());
    key[8..24].copy_from_slice(endpoint.as_bytes());
    key[24..].copy_from_slice(&msg_bytes(id)?);
    Some(key)
}

/// (due ms, delivery key) of a due entry.
fn parse_due(key: &[u8]) -> Option<(i64, [u8; 32])> {
    let at: [u8; 8] = key.get(..8)?.try_into().ok()?;
    let rest: [u8; 32] = key.get(8..40)?.try_into().ok()?;
    Some((i64::try_from(u64::from_be_bytes(at)).ok()?, rest))
}

fn uuid_at(key: &[u8], from: usize) -> Option<Uuid> {
    let raw: [u8; 16] = key.get(from..from + 16)?.try_into().ok()?;
    Some(Uuid::from_bytes(raw))
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| corrupt("webhooks", format!("unreadable {what}: {e}")))
}

fn encode<T: serde::Serialize>(what: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| corrupt("webhooks", format!("cannot encode {what}: {e}")))
}

/// Counts finished deliveries, to prune each endpoint's log now and then.
static FINISHED: AtomicU64 = AtomicU64::new(0);

/// A failure of a webhook operation: a read (the store is fine) or a write
/// (sled refuses writes from now on: the gate must close).
enum OpError {
    Read(StoreError),
    Write(String),
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        Self::Read(e)
    }
}

fn read_err(what: &'static str) -> impl Fn(sled::Error) -> OpError {
    move |e| OpError::Read(StoreError::io(format!("webhooks: {what}"), e))
}

fn write_err(what: &'static str) -> impl Fn(sled::Error) -> OpError {
    move |e| OpError::Write(format!("webhooks: {what}: {e}"))
}

impl SledStore {
    /// From now on, checkpoints hand the deliveries `subscriptions` derives
    /// from their events to the delivery task, and tell it when. Call
    /// once, before any session checkpoints (later calls are ignored).
    pub fn set_webhooks(&self, subscriptions: Arc<Subscriptions>) {
        let _ = self.inner.webhooks.set(subscriptions);
    }

    /// Runs `f` over the webhook trees of the current opening, on the
    /// blocking pool; a write failure closes the gate.
    async fn hooks<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&HookTrees, &Generation) -> Result<T, OpError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let generation = inner.shared.gate.get()?;
            let trees = HookTrees::open(&generation.trees)
                .map_err(|e| StoreError::io("webhooks: opening their trees", e))?;
            match f(&trees, &generation) {
                Ok(v) => Ok(v),
                Err(OpError::Read(e)) => Err(e),
                Err(OpError::Write(cause)) => {
                    inner.shared.gate.close(&generation, &cause);
                    Err(inner.shared.gate.unwritable())
                }
            }
        })
        .await
        .map_err(|e| StoreError::io("webhooks: store task", e))?
    }

    /// Up to `limit` fresh deliveries from outbox rows an earlier binary
    /// wrote (see the module docs).
    async fn intake_outbox(
        &self,
        now_ms: i64,
        limit: usize,
        busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError> {
        let idle = busy.is_empty();
        let busy = busy.clone();
        let rows: Vec<(IVec, Option<Seed>)> = self
            .hooks(move |t, _| {
                let mut rows = Vec::new();
                for item in t.outbox.iter() {
                    if rows.len() >= limit {
                        break;
                    }
                    let (key, value) = item.map_err(read_err("reading the outbox"))?;
                    let seed = serde_json::from_slice::<Seed>(&value).ok();
                    // Waiting for its attempt or in flight already.
                    if let (Some(endpoint), Some(seed)) = (uuid_at(&key, 24), &seed) {
                        if busy.contains(&(endpoint, seed.id.clone())) {
                            continue;
                        }
                    }
                    rows.push((key, seed));
                }
                Ok(rows)
            })
            .await?;
        if rows.is_empty() {
            if idle {
                self.inner.feed.outbox_empty();
            }
            return Ok(Vec::new());
        }
        // Every row seen was written by a checkpoint group the writer had
        // begun; the flush is queued behind that group, so once it returns
        // the group is applied whole (its headers too) and durable.
        self.flush().await?;
        self.hooks(move |t, generation| {
            let mut out = Vec::new();
            let mut dropped = Vec::new();
            // A batch names few endpoints: each is read once.
            let mut endpoints: HashMap<Uuid, Option<Endpoint>> = HashMap::new();
            for (key, seed) in rows {
                let keep = match (uuid_at(&key, 24), seed) {
                    (Some(endpoint_id), Some(seed)) => {
                        let endpoint = match endpoints.get(&endpoint_id) {
                            Some(e) => e.clone(),
                            None => {
                                let e = endpoint_of(t, &endpoint_id)?;
                                endpoints.insert(endpoint_id, e.clone());
                                e
                            }
                        };
                        match (endpoint, delivery_key(&endpoint_id, &seed.id)) {
                            (Some(e), Some(dkey)) if e.tenant == seed.tenant && e.wants(seed.event) => {
                                if t
                                    .deliveries
                                    .contains_key(dkey)
                                    .map_err(read_err("reading a delivery"))?
                                {
                                    // Its outcome was logged before a crash
                                    // cut the row's removal short: it is
                                    // done, or retried from the log.
                                    None
                                } else if committed(generation, &seed)? {
                                    Some((e, seed))
                                } else {
                                    // A checkpoint cut short, or a session
                                    // purged before its rows were taken.
                                    crate::webhooks::metrics::dropped("not_committed");
                                    None
                                }
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                match keep {
                    Some((endpoint, seed)) => out.push(Claim {
                        delivery: Delivery::new(endpoint.id, seed, now_ms),
                        endpoint: Some(endpoint),
                        fresh: true,
                    }),
                    None => {
                        tracing::debug!(row = ?key, "webhooks: dropping an outbox row (no committed event backs it, its endpoint no longer wants it, or it is logged already)");
                        dropped.push(key);
                    }
                }
            }
            if !dropped.is_empty() {
                t.outbox
                    .remove_all(dropped)
                    .map_err(write_err("dropping outbox rows"))?;
            }
            Ok(out)
        })
        .await
    }

    /// Up to `room` fresh deliveries that checkpoints owe: from the feed,
    /// then from a scan of the group rows if one is due. `idle`: nothing is in
    /// flight, so whatever the feed counts as taken was lost.
    async fn intake_feed(
        &self,
        now_ms: i64,
        room: usize,
        idle: bool,
    ) -> Result<Vec<Claim>, StoreError> {
        let feed = self.inner.feed.clone();
        if idle {
            feed.forget_lost();
        }
        let mut rows = feed.take(room);
        if rows.len() < room {
            if let Some(from) = feed.rescan_due() {
                let want = room - rows.len();
                let feed = feed.clone();
                let found = self
                    .hooks(move |t, generation| rescan(t, &generation.trees, &feed, from, want))
                    .await?;
                rows.extend(found);
            }
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        // A confirmed checkpoint is on disk under `fsync`, not yet under
        // `os`: nothing goes out before its event is durable.
        self.flush().await?;
        self.hooks(move |t, generation| {
            let mut out = Vec::with_capacity(rows.len());
            let mut dropped: Vec<feed::Owed> = Vec::new();
            let mut endpoints: HashMap<Uuid, Option<Endpoint>> = HashMap::new();
            for (endpoint_id, seed) in rows {
                let endpoint = match endpoints.get(&endpoint_id) {
                    Some(e) => e.clone(),
                    None => {
                        let e = endpoint_of(t, &endpoint_id)?;
                        endpoints.insert(endpoint_id, e.clone());
                        e
                    }
                };
                // Logged already: its outcome was saved before a crash or
                // a lost track (it is done, or retried from the log).
                let logged = match delivery_key(&endpoint_id, &seed.id) {
                    Some(dkey) => t
                        .deliveries
                        .contains_key(dkey)
                        .map_err(read_err("reading a delivery"))?,
                    None => true,
                };
                match endpoint {
                    Some(e) if e.tenant == seed.tenant && e.wants(seed.event) && !logged => {
                        out.push(Claim {
                            delivery: Delivery::new(e.id, seed, now_ms),
                            endpoint: Some(e),
                            fresh: true,
                        });
                    }
                    // Its endpoint is gone or no longer wants it.
                    _ => dropped.push(feed::owed(endpoint_id, &seed)),
                }
            }
            if !dropped.is_empty() {
                drop_groups(&generation.trees, &feed.settle(&dropped))?;
            }
            Ok(out)
        })
        .await
    }
}

/// Adds to a group's row (`owed`) what the checkpoint `p` owes, if
/// anything: its session and the first and last numbers of the events
/// that go out (16 + 8 + 8 bytes).
pub(super) fn owed_entry(owed: &mut Vec<u8>, p: &super::layout::Prepared) {
    let seqs = p.hooks.iter().map(|(_, seed)| seed.seq);
    let (Some(first), Some(last)) = (seqs.clone().min(), seqs.max()) else {
        return;
    };
    owed.extend_from_slice(p.id.as_bytes());
    owed.extend_from_slice(&first.to_be_bytes());
    owed.extend_from_slice(&last.to_be_bytes());
}

/// The entries of a group's row: (session, first, last event number).
fn owed_entries(value: &[u8]) -> impl Iterator<Item = (SessionId, u64, u64)> + '_ {
    value.chunks_exact(32).filter_map(|entry| {
        let id = layout::id_from(entry.get(..16)?)?;
        let first = u64::from_be_bytes(entry.get(16..24)?.try_into().ok()?);
        let last = u64::from_be_bytes(entry.get(24..32)?.try_into().ok()?);
        Some((id, first, last))
    })
}

/// Removes the rows of groups settled whole.
fn drop_groups(trees: &Trees, groups: &[u64]) -> Result<(), OpError> {
    for group in groups {
        trees
            .hooked
            .remove(group.to_be_bytes())
            .map_err(write_err("removing a settled group's webhook row"))?;
    }
    Ok(())
}

/// One step of a scan of the group rows, from the key `from`: for each
/// group, the deliveries its checkpoints' events owe and the log does not
/// hold, adopted by the feed, until about `want` are found. A group owing
/// nothing any more loses its row. Tells the feed where the next step
/// starts.
fn rescan(
    t: &HookTrees,
    trees: &Trees,
    feed: &Feed,
    from: Vec<u8>,
    want: usize,
) -> Result<Vec<(Uuid, Seed)>, OpError> {
    let mut by_tenant: HashMap<String, Vec<Endpoint>> = HashMap::new();
    for item in t.endpoints.iter() {
        let (_, bytes) = item.map_err(read_err("listing endpoints"))?;
        let endpoint: Endpoint = decode("endpoint", &bytes)?;
        by_tenant
            .entry(endpoint.tenant.clone())
            .or_default()
            .push(endpoint);
    }
    let mut out = Vec::new();
    let mut next = None;
    for item in trees.hooked.range(from..) {
        let (key, value) = item.map_err(read_err("reading the webhook groups"))?;
        if out.len() >= want {
            next = Some(key.to_vec());
            break;
        }
        let Some(group) = <[u8; 8]>::try_from(key.as_ref())
            .ok()
            .map(u64::from_be_bytes)
        else {
            trees
                .hooked
                .remove(&key)
                .map_err(write_err("dropping a malformed webhook group row"))?;
            continue;
        };
        let mut owed = Vec::new();
        for (id, first, last) in owed_entries(&value) {
            // Purged since: it owes nothing.
            let Some(header) = trees.header(&id)? else {
                continue;
            };
            let mut events = Vec::new();
            let last = last.min(header.last_event_seq);
            if first <= last {
                trees.committed_events(&id, first, last, |event| {
                    events.push(event);
                    true
                })?;
            }
            let endpoints = by_tenant.get(&header.tenant).map_or(&[][..], Vec::as_slice);
            for seed in seeds_of(&header, &events) {
                for endpoint in endpoints.iter().filter(|e| e.wants(seed.event)) {
                    let logged = match delivery_key(&endpoint.id, &seed.id) {
                        Some(dkey) => t
                            .deliveries
                            .contains_key(dkey)
                            .map_err(read_err("reading a delivery"))?,
                        None => true,
                    };
                    if !logged {
                        owed.push((endpoint.id, seed.clone()));
                    }
                }
            }
        }
        let (adopted, settled) = feed.adopt(group, owed);
        if settled {
            drop_groups(trees, &[group])?;
        }
        out.extend(adopted);
    }
    feed.rescanned(next);
    Ok(out)
}

fn endpoint_of(trees: &HookTrees, id: &Uuid) -> Result<Option<Endpoint>, OpError> {
    match trees
        .endpoints
        .get(id.as_bytes())
        .map_err(read_err("reading an endpoint"))?
    {
        Some(bytes) => Ok(Some(decode("endpoint", &bytes)?)),
        None => Ok(None),
    }
}

/// Whether the row `seed` names an event the session's header commits, as
/// the row describes it.
fn committed(generation: &Generation, seed: &Seed) -> Result<bool, OpError> {
    let trees = &generation.trees;
    let Some(bytes) = trees
        .sessions
        .get(seed.session_id.as_bytes())
        .map_err(read_err("reading a session header"))?
    else {
        return Ok(false);
    };
    let peek = codec::peek(&seed.session_id, &bytes)?;
    if peek.last_event_seq.is_none_or(|last| last < seed.seq) {
        return Ok(false);
    }
    let mut found = None;
    trees.committed_events(&seed.session_id, seed.seq, seed.seq, |event| {
        found = Some(event);
        false
    })?;
    Ok(found.is_some_and(|event| describes(seed, &event)))
}

#[async_trait::async_trait]
impl WebhookStore for SledStore {
    async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<(), StoreError> {
        let value = encode("endpoint", endpoint)?;
        let id = endpoint.id;
        self.hooks(move |t, _| {
            t.endpoints
                .insert(id.as_bytes(), value)
                .map_err(write_err("writing an endpoint"))?;
            Ok(())
        })
        .await?;
        self.flush().await
    }

    async fn endpoint(&self, id: Uuid) -> Result<Option<Endpoint>, StoreError> {
        self.hooks(move |t, _| endpoint_of(t, &id)).await
    }

    async fn endpoints(&self, tenant: Option<&str>) -> Result<Vec<Endpoint>, StoreError> {
        let tenant = tenant.map(str::to_owned);
        self.hooks(move |t, _| {
            let mut out = Vec::new();
            for item in t.endpoints.iter() {
                let (_, bytes) = item.map_err(read_err("listing endpoints"))?;
                let endpoint: Endpoint = decode("endpoint", &bytes)?;
                if tenant.as_deref().is_none_or(|want| endpoint.tenant == want) {
                    out.push(endpoint);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn delete_endpoint(&self, id: Uuid) -> Result<bool, StoreError> {
        let existed = self
            .hooks(move |t, _| {
                let existed = t
                    .endpoints
                    .remove(id.as_bytes())
                    .map_err(write_err("deleting an endpoint"))?
                    .is_some();
                // Its due entries go stale and are dropped when met.
                for item in t.deliveries.scan_prefix(id.as_bytes()) {
                    let (key, bytes) = item.map_err(read_err("listing deliveries"))?;
                    if let (Ok(d), Ok(dkey)) = (
                        serde_json::from_slice::<Delivery>(&bytes),
                        <[u8; 32]>::try_from(key.as_ref()),
                    ) {
                        t.sessions
                            .remove(session_key(&d.seed.session_id, &dkey))
                            .map_err(write_err("deleting a delivery"))?;
                    }
                    t.deliveries
                        .remove(key)
                        .map_err(write_err("deleting a delivery"))?;
                }
                Ok(existed)
            })
            .await?;
        self.flush().await?;
        Ok(existed)
    }

    async fn intake(
        &self,
        now_ms: i64,
        limit: usize,
        busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut claims = if self.inner.feed.outbox_left() {
            self.intake_outbox(now_ms, limit, busy).await?
        } else {
            Vec::new()
        };
        if claims.len() < limit {
            let room = limit - claims.len();
            claims.extend(self.intake_feed(now_ms, room, busy.is_empty()).await?);
        }
        Ok(claims)
    }

    async fn claim_due(
        &self,
        now_ms: i64,
        _lease_until_ms: i64,
        limit: usize,
        busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError> {
        let busy = busy.clone();
        self.hooks(move |t, _| {
            let end = u64::try_from(now_ms.max(0)).unwrap_or(0).saturating_add(1);
            let mut out = Vec::new();
            let mut endpoints: HashMap<Uuid, Option<Endpoint>> = HashMap::new();
            for item in t.due.range(..end.to_be_bytes().to_vec()) {
                if out.len() >= limit {
                    break;
                }
                let (key, _) = item.map_err(read_err("reading the due index"))?;
                let Some((at, dkey)) = parse_due(&key) else {
                    t.due
                        .remove(&key)
                        .map_err(write_err("dropping a due entry"))?;
                    continue;
                };
                let delivery = match t
                    .deliveries
                    .get(dkey)
                    .map_err(read_err("reading a delivery"))?
                {
                    Some(bytes) => Some(decode::<Delivery>("delivery", &bytes)?),
                    None => None,
                };
                match delivery {
                    Some(d)
                        if d.status == DeliveryStatus::Pending && d.next_attempt_at_ms == at =>
                    {
                        if !busy.contains(&d.key()) {
                            let endpoint = match endpoints.get(&d.endpoint) {
                                Some(e) => e.clone(),
                                None => {
                                    let e = endpoint_of(t, &d.endpoint)?;
                                    endpoints.insert(d.endpoint, e.clone());
                                    e
                                }
                            };
                            out.push(Claim {
                                delivery: d,
                                endpoint,
                                fresh: false,
                            });
                        }
                    }
                    // Stale: the delivery moved on (or is gone).
                    _ => {
                        t.due
                            .remove(&key)
                            .map_err(write_err("dropping a due entry"))?;
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError> {
        self.hooks(move |t, _| {
            let from = u64::try_from(after_ms.max(0))
                .unwrap_or(0)
                .saturating_add(1);
            match t
                .due
                .range(from.to_be_bytes().to_vec()..)
                .next()
                .transpose()
                .map_err(read_err("reading the due index"))?
            {
                Some((key, _)) => Ok(parse_due(&key).map(|(at, _)| at)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn save_deliveries(&self, outcomes: &[Outcome]) -> Result<(), StoreError> {
        let outcomes = outcomes.to_vec();
        let feed = self.inner.feed.clone();
        self.hooks(move |t, generation| {
            // Fresh deliveries the feed gave (the others came from outbox
            // rows an earlier binary wrote).
            let mut from_feed: Vec<feed::Owed> = Vec::new();
            let mut finished: HashMap<Uuid, u64> = HashMap::new();
            let mut fresh = FreshWrites::default();
            let mut endpoints: HashMap<Uuid, bool> = HashMap::new();
            for Outcome {
                delivery,
                was_due_at,
                fresh: is_fresh,
            } in &outcomes
            {
                if *is_fresh {
                    let exists = match endpoints.get(&delivery.endpoint) {
                        Some(exists) => *exists,
                        None => {
                            let exists = t
                                .endpoints
                                .contains_key(delivery.endpoint.as_bytes())
                                .map_err(read_err("reading an endpoint"))?;
                            endpoints.insert(delivery.endpoint, exists);
                            exists
                        }
                    };
                    let owed = feed::owed(delivery.endpoint, &delivery.seed);
                    let fed = feed.is_open(&owed);
                    fresh.add(delivery, exists, !fed)?;
                    if fed {
                        from_feed.push(owed);
                    }
                } else {
                    save_one(t, delivery, *was_due_at)?;
                }
                if delivery.status != DeliveryStatus::Pending {
                    *finished.entry(delivery.endpoint).or_default() += 1;
                }
            }
            fresh.apply(t)?;
            // Only once their outcomes are written may their groups go.
            drop_groups(&generation.trees, &feed.settle(&from_feed))?;
            for (endpoint, n) in finished {
                let before = FINISHED.fetch_add(n, Ordering::Relaxed);
                if before / PRUNE_EVERY != (before + n) / PRUNE_EVERY {
                    prune(t, &endpoint)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn pending_count(&self) -> Result<u64, StoreError> {
        // A delivery not yet attempted waits in the feed (or, left by an
        // earlier binary, is an outbox row); one being retried has an entry
        // in the due index (and, briefly, stale ones a claim drops): close
        // enough for a gauge, and scans of keys only.
        let queued = self.inner.feed.queued() as u64;
        self.hooks(move |t, _| Ok((t.outbox.len() + t.due.len()) as u64 + queued))
            .await
    }

    async fn deliveries(
        &self,
        endpoint: Uuid,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        let before = match before {
            Some(id) => Some(delivery_key(&endpoint, id).ok_or_else(|| {
                StoreError::Io(format!("'{id}' is not a webhook-id of this log"))
            })?),
            None => None,
        };
        self.hooks(move |t, _| {
            let start = endpoint.as_bytes().to_vec();
            let mut end = start.clone();
            end.extend_from_slice(&[0xff; 16]);
            let upper = match before {
                Some(key) => std::ops::Bound::Excluded(key.to_vec()),
                None => std::ops::Bound::Included(end),
            };
            let mut out = Vec::new();
            for item in t
                .deliveries
                .range::<Vec<u8>, _>((std::ops::Bound::Included(start), upper))
                .rev()
                .take(limit)
            {
                let (_, bytes) = item.map_err(read_err("reading deliveries"))?;
                out.push(decode("delivery", &bytes)?);
            }
            Ok(out)
        })
        .await
    }
}

/// Records one delivery's new state: its new due entry before it, the old
/// one after (a crash leaves a stale due entry, never a pending delivery
/// without one).
fn save_one(t: &HookTrees, delivery: &Delivery, was_due: i64) -> Result<(), OpError> {
    let (Some(dkey), Some(old_due)) = (
        delivery_key(&delivery.endpoint, &delivery.seed.id),
        due_key(was_due, &delivery.endpoint, &delivery.seed.id),
    ) else {
        return Err(OpError::Read(corrupt(
            "webhooks",
            format!("malformed webhook-id {}", delivery.seed.id),
        )));
    };
    let pending = delivery.status == DeliveryStatus::Pending;
    let new_due = due_key(
        delivery.next_attempt_at_ms,
        &delivery.endpoint,
        &delivery.seed.id,
    );
    if pending {
        if let Some(due) = new_due {
            t.due
                .insert(due, &[][..])
                .map_err(write_err("scheduling a delivery"))?;
        }
    }
    // Gone meanwhile (its endpoint deleted, its session purged): nothing to
    // record.
    if t.deliveries
        .contains_key(dkey)
        .map_err(read_err("reading a delivery"))?
    {
        t.deliveries
            .insert(dkey, encode("delivery", delivery)?)
            .map_err(write_err("writing a delivery"))?;
    }
    if !pending || new_due != Some(old_due) {
        t.due
            .remove(old_due)
            .map_err(write_err("dropping a due entry"))?;
    }
    Ok(())
}

/// The writes that record fresh deliveries' outcomes ([`Claim::fresh`]),
/// one batch per tree, applied in an order a crash leaves harmless: the
/// schedule and the session index before the log entries they point to,
/// then the outbox rows taken, then (by the caller) the settled groups'
/// rows. A crash before the last leaves a row behind a delivery that is logged
/// already, which the next intake drops (it is done, or retried from the
/// log); never a delivery without a record.
#[derive(Default)]
struct FreshWrites {
    due: sled::Batch,
    index: sled::Batch,
    log: sled::Batch,
    /// Outbox keys (without the kind's prefix) to remove.
    taken: Vec<Vec<u8>>,
    any: bool,
}

impl FreshWrites {
    /// One fresh outcome; nothing but the removal of its outbox row (if
    /// `from_outbox`) if its endpoint is gone (deleted while it was in
    /// flight).
    fn add(
        &mut self,
        delivery: &Delivery,
        endpoint_exists: bool,
        from_outbox: bool,
    ) -> Result<(), OpError> {
        let Some(dkey) = delivery_key(&delivery.endpoint, &delivery.seed.id) else {
            return Err(OpError::Read(corrupt(
                "webhooks",
                format!("malformed webhook-id {}", delivery.seed.id),
            )));
        };
        self.any = true;
        if from_outbox {
            self.taken.push(
                outbox_key(
                    &delivery.seed.session_id,
                    delivery.seed.seq,
                    &delivery.endpoint,
                )[..]
                    .to_vec(),
            );
        }
        if !endpoint_exists {
            return Ok(());
        }
        if delivery.status == DeliveryStatus::Pending {
            if let Some(due) = due_key(
                delivery.next_attempt_at_ms,
                &delivery.endpoint,
                &delivery.seed.id,
            ) {
                self.due.insert(&due[..], &[][..]);
            }
        }
        self.index
            .insert(&session_key(&delivery.seed.session_id, &dkey)[..], &[][..]);
        self.log.insert(&dkey[..], encode("delivery", delivery)?);
        Ok(())
    }

    fn apply(self, t: &HookTrees) -> Result<(), OpError> {
        if !self.any {
            return Ok(());
        }
        t.due
            .apply_batch(self.due)
            .map_err(write_err("scheduling deliveries"))?;
        t.sessions
            .apply_batch(self.index)
            .map_err(write_err("indexing deliveries"))?;
        t.deliveries
            .apply_batch(self.log)
            .map_err(write_err("writing deliveries"))?;
        t.outbox
            .remove_all(self.taken)
            .map_err(write_err("taking outbox rows"))?;
        Ok(())
    }
}

/// Keeps an endpoint's log to its [`LOG_KEEP`] newest deliveries, plus the
/// older ones still pending (however many). Keys are counted first and
/// only the entries past the newest are decoded; both passes go forward
/// (sled walks a tree backwards at many times the cost).
fn prune(t: &HookTrees, endpoint: &Uuid) -> Result<(), OpError> {
    let mut total = 0usize;
    for key in t.deliveries.scan_prefix(endpoint.as_bytes()).keys() {
        key.map_err(read_err("reading deliveries"))?;
        total += 1;
    }
    let excess = total.saturating_sub(LOG_KEEP);
    if excess == 0 {
        return Ok(());
    }
    let (mut log, mut index) = (sled::Batch::default(), sled::Batch::default());
    for item in t.deliveries.scan_prefix(endpoint.as_bytes()).take(excess) {
        let (key, bytes) = item.map_err(read_err("reading deliveries"))?;
        let Ok(d) = serde_json::from_slice::<Delivery>(&bytes) else {
            continue;
        };
        if d.status == DeliveryStatus::Pending {
            continue;
        }
        if let Ok(dkey) = <[u8; 32]>::try_from(key.as_ref()) {
            index.remove(&session_key(&d.seed.session_id, &dkey)[..]);
        }
        log.remove(key);
    }
    // The entries before their index entries: an index entry without its
    // entry is harmless (a purge skips it), the reverse would outlive a
    // purge.
    t.deliveries
        .apply_batch(log)
        .map_err(write_err("pruning the delivery log"))?;
    t.sessions
        .apply_batch(index)
        .map_err(write_err("pruning the delivery log"))?;
    Ok(())
}

#[cfg(test)]
mod tests {

    use overseer_actors::model::{
        AgentConfig, CallState, Decision, DecisionRecord, Event, EventKind, SessionHeader,
        SessionStatus, ToolCallId, ToolCallRecord,
    };
    use serde_json::json;

    use super::*;
    use crate::store::sled::trees::DATA_TREE;
    use crate::store::Durability;
    use crate::webhooks::EventType;
    use overseer_actors::store::Checkpoint;

    struct Session {
        header: SessionHeader,
    }

    impl Session {
        fn new() -> Self {
            let id = SessionId::generate();
            let mut header = SessionHeader::new(
                id,
                "acme".into(),
                "a".into(),
                AgentConfig::new("a", &["t"]).effective(),
                1,
            );
            let mut call =
                ToolCallRecord::proposed(ToolCallId("call_1".into()), "t".into(), json!({}), 1);
            call.state = CallState::AwaitingApproval;
            call.requires_approval = true;
            header.open_calls.push(call);
            header.status = SessionStatus::AwaitingApproval;
            Self { header }
        }

        fn checkpoint(&mut self, kinds: Vec<EventKind>, at_ms: i64) -> Checkpoint {
            let mut events = Vec::new();
            for kind in kinds {
                self.header.last_event_seq += 1;
                events.push(Event {
                    session_id: self.header.id,
                    seq: self.header.last_event_seq,
                    at_ms,
                    kind,
                });
            }
            Checkpoint {
                header: self.header.clone(),
                entries: Vec::new(),
                events: Arc::new(events),
                metadata: None,
                queued: Vec::new(),
                dequeued: 0..0,
            }
        }
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            id: Uuid::now_v7(),
            tenant: "acme".into(),
            url: "http://127.0.0.1:9/".into(),
            events: EventType::ALL.to_vec(),
            description: None,
            secret: "whsec_AAAA".into(),
            created_by: None,
            created_at_ms: 0,
            disabled: None,
            previous_secret: None,
        }
    }

    /// A store in `dir` whose write path knows one endpoint of `acme`
    /// that wants every event.
    async fn hooked(
        dir: &std::path::Path,
        durability: Durability,
    ) -> (SledStore, Arc<Subscriptions>, Endpoint) {
        let store = SledStore::open(dir, durability).unwrap();
        let view = Arc::new(Subscriptions::new());
        store.set_webhooks(view.clone());
        let hook = endpoint();
        store.put_endpoint(&hook).await.unwrap();
        view.put(&hook);
        (store, view, hook)
    }

    fn requested() -> EventKind {
        EventKind::ApprovalRequested {
            call_id: ToolCallId("call_1".into()),
            name: "t".into(),
            arguments: json!({}),
            outcome_unknown: false,
        }
    }

    /// Writes the outbox rows an earlier binary wrote with `cp`.
    fn legacy_rows(view: &Subscriptions, outbox: &View, cp: &Checkpoint) {
        for (endpoint, seed) in view.rows(cp) {
            let seed = crate::webhooks::named(seed);
            let key = outbox_key(&seed.session_id, seed.seq, &endpoint);
            outbox
                .insert(key, serde_json::to_vec(&seed).unwrap())
                .unwrap();
        }
    }

    /// The (session, first, last) entries of every webhook group row.
    fn groups(store: &SledStore) -> Vec<Vec<(SessionId, u64, u64)>> {
        let rows = store.current().trees.hooked.clone();
        rows.iter()
            .map(|item| owed_entries(&item.unwrap().1).collect())
            .collect()
    }

    /// The invariant "an outbox row whose event no header covers is never
    /// delivered": a row of a checkpoint a crash cut short before its header
    /// (which layout 3 could leave, and its migration copies as is) is
    /// written on its own here; the session's next
    /// checkpoint commits another event under the same number; the row is
    /// dropped at intake, never turned into a delivery, while a committed
    /// event's row is.
    #[tokio::test]
    async fn an_outbox_row_no_header_commits_is_never_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        let view = Arc::new(Subscriptions::new());
        store.set_webhooks(view.clone());
        let hook = endpoint();
        store.put_endpoint(&hook).await.unwrap();

        // An earlier binary's outbox row, beside a session it committed
        // (written with no endpoint known to this process's feed).
        let mut session = Session::new();
        let committed = session.checkpoint(vec![requested()], 10);
        store.checkpoint(committed.clone()).await.unwrap();
        view.put(&hook);

        // Cut short before its header: an approval.decided at seq 2.
        let decided = EventKind::DecisionRecorded {
            call_id: ToolCallId("call_1".into()),
            record: DecisionRecord {
                decision: Decision::approve(),
                by: Some("alice".into()),
                at_ms: 20,
                metadata: None,
                args_diff: None,
            },
        };
        let mut lost = Session {
            header: session.header.clone(),
        };
        let outbox = store.current().trees.outbox.clone();
        legacy_rows(&view, &outbox, &committed);
        legacy_rows(&view, &outbox, &lost.checkpoint(vec![decided], 20));
        let rows = |store: &SledStore| store.current().trees.outbox.len();
        assert_eq!(rows(&store), 2, "the committed row and the orphan");

        // Seq 2 is committed as something else (no webhook).
        store
            .checkpoint(session.checkpoint(vec![EventKind::TurnStarted { turn: 2 }], 30))
            .await
            .unwrap();

        let fresh = store.intake(100, 10, &HashSet::new()).await.unwrap();
        assert_eq!(fresh.len(), 1, "{fresh:?}");
        assert_eq!(
            rows(&store),
            1,
            "the orphan dropped, the committed row kept"
        );
        assert!(fresh[0].fresh);
        assert_eq!(fresh[0].delivery.seed.event, EventType::ApprovalRequested);
        assert_eq!(fresh[0].delivery.seed.seq, 1);
        assert_eq!(fresh[0].endpoint.as_ref().map(|e| e.id), Some(hook.id));
        let mut d = fresh[0].delivery.clone();
        d.status = DeliveryStatus::Delivered;
        d.attempts = 1;
        store
            .save_deliveries(&[Outcome {
                delivery: d,
                was_due_at: 100,
                fresh: true,
            }])
            .await
            .unwrap();
        assert_eq!(rows(&store), 0);
        let log = store.deliveries(hook.id, None, 10).await.unwrap();
        assert_eq!(log.len(), 1, "the orphan never became a delivery");
    }

    /// The invariant "a group of checkpoints writes at most one row for
    /// its webhooks, and a delivery is never lost": a checkpoint whose
    /// events go out writes its group's row and no outbox row; taking the
    /// deliveries writes nothing; a store dropped before their outcomes
    /// were saved (a crash after the send) gives the same `webhook-id`s
    /// again when reopened, found from the rows; a row goes once all it
    /// owes is settled, and a row put back (a crash before it went) gives
    /// nothing again, the log holding its deliveries, and goes.
    #[tokio::test]
    async fn a_group_writes_one_row_and_a_crash_before_the_outcome_sends_again() {
        let dir = tempfile::tempdir().unwrap();
        let hook = endpoint();
        let mut session = Session::new();
        let id = session.header.id;
        let decided = || EventKind::DecisionRecorded {
            call_id: ToolCallId("call_1".into()),
            record: DecisionRecord {
                decision: Decision::approve(),
                by: Some("alice".into()),
                at_ms: 20,
                metadata: None,
                args_diff: None,
            },
        };
        let (first, rows) = {
            let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
            let view = Arc::new(Subscriptions::new());
            store.set_webhooks(view.clone());
            store.put_endpoint(&hook).await.unwrap();
            view.put(&hook);
            store
                .checkpoint(session.checkpoint(vec![requested()], 10))
                .await
                .unwrap();
            let db = store.current().trees.db.clone();
            let data = db.open_tree(DATA_TREE).unwrap();
            let before = data.len();
            store
                .checkpoint(session.checkpoint(
                    vec![decided(), EventKind::TurnStarted { turn: 2 }, requested()],
                    20,
                ))
                .await
                .unwrap();
            assert_eq!(
                data.len(),
                before + 3,
                "its record, its decision's row and its group's row: nothing per event"
            );
            store
                .checkpoint(session.checkpoint(vec![EventKind::TurnStarted { turn: 3 }], 30))
                .await
                .unwrap();
            assert_eq!(store.current().trees.outbox.len(), 0, "no outbox row");
            assert_eq!(groups(&store), vec![vec![(id, 1, 1)], vec![(id, 2, 4)]]);
            let claims = store.intake(100, 10, &HashSet::new()).await.unwrap();
            assert_eq!(claims.len(), 3, "{claims:?}");
            let busy: HashSet<DeliveryKey> = claims.iter().map(|c| c.delivery.key()).collect();
            assert!(
                store.intake(100, 10, &busy).await.unwrap().is_empty(),
                "a taken delivery is not taken twice"
            );
            for tree in ["webhook_deliveries", "webhook_due", "webhook_sessions"] {
                assert_eq!(db.open_tree(tree).unwrap().len(), 0, "{tree}");
            }
            let mut ids: Vec<String> = claims.iter().map(|c| c.delivery.seed.id.clone()).collect();
            ids.sort();
            let rows: Vec<(IVec, IVec)> = store
                .current()
                .trees
                .hooked
                .iter()
                .map(Result::unwrap)
                .collect();
            (ids, rows)
            // Dropped here without their outcomes: the crash.
        };
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        let again = store.intake(200, 10, &HashSet::new()).await.unwrap();
        let mut ids: Vec<String> = again.iter().map(|c| c.delivery.seed.id.clone()).collect();
        ids.sort();
        assert_eq!(ids, first, "the same webhook-ids, found from the rows");
        let outcome = |c: &Claim| {
            let mut d = c.delivery.clone();
            d.status = DeliveryStatus::Delivered;
            d.attempts = 1;
            d.compact();
            Outcome {
                delivery: d,
                was_due_at: 200,
                fresh: true,
            }
        };
        // The second group owes two: one settled leaves its row.
        let by_seq = |seq: u64| again.iter().find(|c| c.delivery.seed.seq == seq).unwrap();
        store
            .save_deliveries(&[outcome(by_seq(1)), outcome(by_seq(2))])
            .await
            .unwrap();
        assert_eq!(groups(&store), vec![vec![(id, 2, 4)]]);
        store.save_deliveries(&[outcome(by_seq(4))]).await.unwrap();
        assert!(groups(&store).is_empty(), "settled whole: gone");
        let db = store.current().trees.db.clone();
        assert_eq!(db.open_tree("webhook_due").unwrap().len(), 0);
        assert_eq!(db.open_tree("webhook_sessions").unwrap().len(), 3);
        let log = store.deliveries(hook.id, None, 10).await.unwrap();
        assert_eq!(log.len(), 3);
        assert!(log.iter().all(|d| d.status == DeliveryStatus::Delivered));

        // A crash before the rows went: the scan finds them logged.
        let hooked = store.current().trees.hooked.clone();
        for (key, value) in rows {
            hooked.insert(key, value).unwrap();
        }
        db.flush().unwrap();
        drop((db, hooked, store));
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        assert!(store
            .intake(300, 10, &HashSet::new())
            .await
            .unwrap()
            .is_empty());
        assert!(groups(&store).is_empty(), "removed by the scan");
    }

    /// A delivery whose first attempt failed is settled (the log retries
    /// it), and so is one whose endpoint was deleted while it waited: their
    /// groups' rows go.
    #[tokio::test]
    async fn a_group_row_goes_once_what_it_owes_is_settled_or_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (store, view, hook) = hooked(dir.path(), Durability::Os).await;
        let mut session = Session::new();
        store
            .checkpoint(session.checkpoint(vec![requested()], 10))
            .await
            .unwrap();
        let claims = store.intake(100, 10, &HashSet::new()).await.unwrap();
        assert_eq!(claims.len(), 1);
        let mut d = claims[0].delivery.clone();
        d.attempts = 1;
        d.next_attempt_at_ms = 5_000;
        assert_eq!(groups(&store).len(), 1);
        store
            .save_deliveries(&[Outcome {
                delivery: d,
                was_due_at: 100,
                fresh: true,
            }])
            .await
            .unwrap();
        assert!(groups(&store).is_empty(), "in the log to be retried");
        assert_eq!(store.next_due(0).await.unwrap(), Some(5_000));

        let mut other = Session::new();
        store
            .checkpoint(other.checkpoint(vec![requested()], 10))
            .await
            .unwrap();
        assert_eq!(groups(&store).len(), 1);
        store.delete_endpoint(hook.id).await.unwrap();
        view.remove(hook.id, "acme");
        assert!(store
            .intake(100, 10, &HashSet::new())
            .await
            .unwrap()
            .is_empty());
        assert!(groups(&store).is_empty(), "dropped with its endpoint");
    }

    /// A delivery's due entry is written before the delivery it schedules
    /// and the old one removed after: one attempt's outcome moves it, a
    /// finished one leaves the index.
    #[tokio::test]
    async fn a_saved_attempt_reschedules_and_a_finished_one_leaves_the_due_index() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _view, hook) = hooked(dir.path(), Durability::Os).await;
        let mut session = Session::new();
        store
            .checkpoint(session.checkpoint(vec![requested()], 10))
            .await
            .unwrap();
        let mut d = store
            .intake(100, 10, &HashSet::new())
            .await
            .unwrap()
            .remove(0)
            .delivery;
        assert!(
            store
                .claim_due(100, 0, 10, &HashSet::new())
                .await
                .unwrap()
                .is_empty(),
            "a fresh delivery is not in the schedule"
        );
        // Its first attempt failed: into the log and the schedule, out of
        // the outbox.
        d.attempts = 1;
        d.next_attempt_at_ms = 5_000;
        store
            .save_deliveries(&[Outcome {
                delivery: d.clone(),
                was_due_at: 100,
                fresh: true,
            }])
            .await
            .unwrap();
        assert!(store
            .intake(100, 10, &HashSet::new())
            .await
            .unwrap()
            .is_empty());
        let busy: HashSet<DeliveryKey> = [d.key()].into();
        assert!(store
            .claim_due(5_000, 0, 10, &busy)
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .claim_due(4_999, 0, 10, &HashSet::new())
            .await
            .unwrap()
            .is_empty());
        assert_eq!(store.next_due(100).await.unwrap(), Some(5_000));
        let again = store
            .claim_due(5_000, 0, 10, &HashSet::new())
            .await
            .unwrap();
        assert_eq!(again.len(), 1);
        d.status = DeliveryStatus::Delivered;
        store
            .save_deliveries(&[Outcome {
                delivery: d.clone(),
                was_due_at: 5_000,
                fresh: false,
            }])
            .await
            .unwrap();
        assert!(store
            .claim_due(i64::MAX / 2, 0, 10, &HashSet::new())
            .await
            .unwrap()
            .is_empty());
        assert_eq!(store.next_due(0).await.unwrap(), None);
        assert_eq!(
            store.deliveries(hook.id, None, 10).await.unwrap()[0].status,
            DeliveryStatus::Delivered
        );
    }

    /// A log entry is small: once delivered it keeps no body and no call
    /// (what was sent is not needed to say what happened); and purging a
    /// session deletes its deliveries.
    #[tokio::test]
    async fn a_delivered_entry_is_small_and_a_purge_deletes_its_session_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _view, hook) = hooked(dir.path(), Durability::Os).await;
        let mut session = Session::new();
        let mut other = Session::new();
        store
            .checkpoint(session.checkpoint(vec![requested()], 10))
            .await
            .unwrap();
        store
            .checkpoint(other.checkpoint(vec![requested()], 10))
            .await
            .unwrap();
        let claims = store.intake(100, 10, &HashSet::new()).await.unwrap();
        assert_eq!(claims.len(), 2);
        let outcomes: Vec<Outcome> = claims
            .into_iter()
            .map(|c| {
                let mut d = c.delivery;
                assert!(
                    d.seed.call.is_none() && d.seed.call_id.is_some(),
                    "the seed is a reference to the event, not a copy of the call"
                );
                d.body = Some("x".repeat(10_000));
                d.status = DeliveryStatus::Delivered;
                d.attempts = 1;
                d.compact();
                Outcome {
                    delivery: d,
                    was_due_at: 100,
                    fresh: true,
                }
            })
            .collect();
        store.save_deliveries(&outcomes).await.unwrap();
        let db = store.current().trees.db.clone();
        let raw = db.open_tree("webhook_deliveries").unwrap();
        assert_eq!(raw.len(), 2);
        for item in raw.iter() {
            let (_, bytes) = item.unwrap();
            assert!(bytes.len() < 600, "{} bytes", bytes.len());
            let d: Delivery = serde_json::from_slice(&bytes).unwrap();
            assert!(d.body.is_none() && d.seed.call.is_none(), "{d:?}");
        }

        session.header.status = SessionStatus::Completed;
        session.header.open_calls.clear();
        store
            .checkpoint(session.checkpoint(vec![EventKind::TurnStarted { turn: 2 }], 20))
            .await
            .unwrap();
        store.purge(session.header.id).await.unwrap();
        let left = store.deliveries(hook.id, None, 10).await.unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].seed.session_id, other.header.id);
        let index = db.open_tree("webhook_sessions").unwrap();
        assert_eq!(index.len(), 1);
    }
}
