//! `GET /v1/events`: every session's events of the caller's tenant as one
//! Server-Sent Event stream, resumable, so the approval inbox never polls.
//!
//! This module owns the tenant feeds: a background task subscribes to the
//! hub's all-sessions channel, looks up each event's tenant (a session never
//! changes tenant, so the answer is cached), and appends a *summary* of the
//! event to that tenant's feed: a bounded in-memory replay buffer with its own
//! sequence. Summaries carry ids, names, states and statuses, never texts,
//! results or arguments (those are on the per-session stream), except that an
//! `approval_requested` carries the whole inbox card ([`ApprovalItem`], with
//! its arguments and its bounded context: the model's text and the user
//! message of the turn), so a new approval shows up without another request.
//!
//! Resumption. Every event's id is `<stream>-<seq>`: the stream names one
//! feed of one process (a random node id and a feed generation), `seq`
//! counts that feed's events. A client that reconnects with `Last-Event-ID`
//! (or `?after=`) of the same stream, not older than what the buffer still
//! holds, gets every later event exactly once, in order. Any other client
//! (a first connection, a restarted server, a position the buffer no longer
//! holds, a feed that fell behind the node's events) first gets one
//! `event: reset` whose id is the current position: it must (re)load the
//! snapshot, `GET /v1/approvals`, and apply the events that follow. The
//! snapshot is read after the reset was sent and every event is published
//! after its checkpoint, so snapshot plus later events is complete; an event
//! that arrives after the snapshot already reflected it is harmless to apply
//! again (removing a card twice, or adding one already listed by its id).
//!
//! A feed exists while someone listens to it and for [`FEED_KEEP`] after its
//! last listener left, so a client that blinks resumes instead of
//! reloading. It deliberately keeps nothing durable: a restart is a reset.
//!
//! Cluster mode: the hub is per node, and the relay (`crate::cluster`) adds
//! to its all-sessions channel the events other nodes checkpointed, so this
//! stream carries the tenant's sessions wherever they run; when the relay
//! lost announcements (its connection broke) the feeds get a `reset`
//! (`events_missed`).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use overseer_actors::model::{Event, EventKind, SessionHeader, SessionId};
use overseer_actors::{Overseer, WeakOverseer};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;

use super::extract::{ApiQuery, Authorized, Read};
use super::inbox::{lineage, pending_calls, ApprovalItem};
use super::{ApiError, AppState};

/// Most events a tenant's feed keeps for resumption.
pub const FEED_EVENTS: usize = 4096;
/// Most bytes of event data a tenant's feed keeps.
pub const FEED_BYTES: usize = 4 * 1024 * 1024;
/// How long a feed nobody listens to is kept for a client to come back.
pub const FEED_KEEP: Duration = Duration::from_secs(300);
/// A live buffer per client: one that falls further behind is disconnected
/// and resumes from the feed.
const CLIENT_BUFFER: usize = 1024;
/// Largest inbox card sent inside an `approval_requested` event; a larger
/// one (huge arguments) is left out, and the client reloads the snapshot.
const MAX_CARD_BYTES: usize = 256 * 1024;
/// Sessions whose tenant is remembered; past it the cache starts over.
const TENANT_CACHE: usize = 65_536;
/// How often feeds nobody listens to are looked at.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// Comment lines keep idle connections (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Keys of a stored event kept in its summary.
const SUMMARY_KEYS: [&str; 16] = [
    "session_id",
    "seq",
    "at_ms",
    "type",
    "agent",
    "queued",
    "turn",
    "step",
    "call_id",
    "name",
    "outcome_unknown",
    "attempt",
    "state",
    "status",
    "stop_reason",
    "usage",
];

/// One event of a feed, ready to send.
struct Item {
    seq: u64,
    event: String,
    data: String,
}

struct Buffer {
    items: VecDeque<Arc<Item>>,
    bytes: usize,
    /// Sequence of the last event appended (0: none yet).
    last: u64,
    /// Highest sequence no longer in the buffer (0: nothing dropped).
    floor: u64,
    /// When the last listener left, while nobody listens.
    idle_since: Option<Instant>,
}

/// One tenant's feed.
struct Feed {
    /// `<node>-<generation>`: the prefix of this feed's event ids.
    stream: String,
    buf: Mutex<Buffer>,
    tx: broadcast::Sender<Arc<Item>>,
}

impl Feed {
    fn new(stream: String) -> Self {
        Self {
            stream,
            buf: Mutex::new(Buffer {
                items: VecDeque::new(),
                bytes: 0,
                last: 0,
                floor: 0,
                idle_since: None,
            }),
            tx: broadcast::channel(CLIENT_BUFFER).0,
        }
    }

    fn push(&self, event: &str, data: String) {
        let Ok(mut buf) = self.buf.lock() else {
            return;
        };
        buf.last += 1;
        let item = Arc::new(Item {
            seq: buf.last,
            event: event.to_owned(),
            data,
        });
        buf.bytes += item.data.len();
        buf.items.push_back(item.clone());
        while buf.items.len() > FEED_EVENTS || (buf.bytes > FEED_BYTES && buf.items.len() > 1) {
            if let Some(old) = buf.items.pop_front() {
                buf.bytes -= old.data.len();
                buf.floor = old.seq;
            }
        }
        // Sent under the lock, so that subscribers (who subscribe under it)
        // see sequence order and neither miss nor repeat an event.
        let _ = self.tx.send(item);
    }

    /// Pushes a `reset`: every listener must reload its snapshot.
    fn push_reset(&self, reason: &str) {
        self.push("reset", reset_data(reason));
    }
}

fn reset_data(reason: &str) -> String {
    json!({"type": "reset", "reason": reason, "snapshot": "/v1/approvals"}).to_string()
}

/// The tenant feeds of one server, and the task that fills them.
pub(crate) struct TenantFeeds {
    /// Random per process, so ids of a previous process never resume.
    node: String,
    generation: AtomicU64,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    started: AtomicBool,
}

impl Default for TenantFeeds {
    fn default() -> Self {
        Self {
            node: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            generation: AtomicU64::new(0),
            feeds: Mutex::new(HashMap::new()),
            started: AtomicBool::new(false),
        }
    }
}

/// What a new listener gets: where to start, and the live rest.
struct Subscription {
    stream: String,
    /// Set when the client must reload: the current position.
    reset: Option<(u64, &'static str)>,
    replay: Vec<Arc<Item>>,
    /// The position the replay ends at.
    last: u64,
    rx: broadcast::Receiver<Arc<Item>>,
}

impl TenantFeeds {
    /// Starts the task filling the feeds, once.
    fn start(self: &Arc<Self>, runtime: &Overseer, shutdown: watch::Receiver<bool>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        // Subscribed here, before the first listener is answered, so no
        // event published after that answer can be missed.
        let events = runtime.hub().subscribe_all();
        let missed = runtime.hub().all_missed();
        let feeds = self.clone();
        let runtime = runtime.downgrade();
        tokio::spawn(async move { feeds.run(events, missed, runtime, shutdown).await });
    }

    fn feed(&self, tenant: &str) -> Option<Arc<Feed>> {
        self.feeds.lock().ok()?.get(tenant).cloned()
    }

    fn is_empty(&self) -> bool {
        self.feeds.lock().map(|f| f.is_empty()).unwrap_or(true)
    }

    fn subscribe(&self, tenant: &str, after: Option<(&str, u64)>) -> Option<Subscription> {
        let feed = {
            let mut feeds = self.feeds.lock().ok()?;
            feeds
                .entry(tenant.to_owned())
                .or_insert_with(|| {
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    Arc::new(Feed::new(format!("{}-{generation}", self.node)))
                })
                .clone()
        };
        let mut buf = feed.buf.lock().ok()?;
        buf.idle_since = None;
        let rx = feed.tx.subscribe();
        let current = buf.last;
        let (reset, replay, last) = match after {
            None => (Some((current, "new_client")), Vec::new(), current),
            Some((stream, _)) if stream != feed.stream => {
                (Some((current, "unknown_stream")), Vec::new(), current)
            }
            Some((_, seq)) if seq < buf.floor || seq > current => {
                (Some((current, "position_unavailable")), Vec::new(), current)
            }
            Some((_, seq)) => (
                None,
                buf.items.iter().filter(|i| i.seq > seq).cloned().collect(),
                seq,
            ),
        };
        Some(Subscription {
            stream: feed.stream.clone(),
            reset,
            replay,
            last,
            rx,
        })
    }

    /// Drops feeds nobody has listened to for [`FEED_KEEP`].
    fn sweep(&self) {
        let Ok(mut feeds) = self.feeds.lock() else {
            return;
        };
        let now = Instant::now();
        feeds.retain(|_, feed| {
            let Ok(mut buf) = feed.buf.lock() else {
                return false;
            };
            if feed.tx.receiver_count() > 0 {
                buf.idle_since = None;
                return true;
            }
            let since = *buf.idle_since.get_or_insert(now);
            now.duration_since(since) < FEED_KEEP
        });
    }

    fn reset_all(&self, reason: &str) {
        let feeds: Vec<Arc<Feed>> = match self.feeds.lock() {
            Ok(f) => f.values().cloned().collect(),
            Err(_) => return,
        };
        for feed in feeds {
            feed.push_reset(reason);
        }
    }

    async fn run(
        self: Arc<Self>,
        mut events: broadcast::Receiver<Event>,
        mut missed: watch::Receiver<u64>,
        runtime: WeakOverseer,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tenants: HashMap<SessionId, (Arc<str>, u64)> = HashMap::new();
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            let received = tokio::select! {
                _ = shutdown.changed() => return,
                _ = sweep.tick() => {
                    self.sweep();
                    continue;
                }
                changed = missed.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tracing::info!("events of other nodes were missed; tenant streams reload their snapshot");
                    self.reset_all("events_missed");
                    continue;
                }
                r = events.recv() => r,
            };
            match received {
                Ok(event) => {
                    // The runtime is held only while an event is handled,
                    // so this task never keeps a stopped server's store open.
                    let Some(runtime) = runtime.upgrade() else {
                        return;
                    };
                    self.handle(&runtime, &mut tenants, event).await;
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "tenant event feeds fell behind the node's events; listeners reload their snapshot"
                    );
                    self.reset_all("feed_lagged");
                }
                Err(RecvError::Closed) => return,
            }
        }
    }

    async fn handle(
        &self,
        runtime: &Overseer,
        tenants: &mut HashMap<SessionId, (Arc<str>, u64)>,
        event: Event,
    ) {
        if self.is_empty() {
            return;
        }
        let id = event.session_id;
        let mut header: Option<SessionHeader> = None;
        let tenant = match tenants.get_mut(&id) {
            Some((tenant, last)) => {
                // A restarted actor may publish again what its predecessor
                // had published.
                if event.seq <= *last {
                    return;
                }
                *last = event.seq;
                tenant.clone()
            }
            None => {
                let Ok(Some(h)) = runtime.store().load_header(id).await else {
                    return;
                };
                let tenant: Arc<str> = h.tenant.as_str().into();
                if tenants.len() >= TENANT_CACHE {
                    tenants.clear();
                }
                tenants.insert(id, (tenant.clone(), event.seq));
                header = Some(h);
                tenant
            }
        };
        let Some(feed) = self.feed(&tenant) else {
            return;
        };
        let mut data = summary(&event);
        if let EventKind::ApprovalRequested { call_id, .. } = &event.kind {
            let card = card(runtime, header, id, call_id.as_str()).await;
            let card = card.and_then(|c| serde_json::to_value(c).ok());
            let size = card.as_ref().map_or(0, |c| c.to_string().len());
            if size > MAX_CARD_BYTES {
                data.insert("approval".into(), Value::Null);
                data.insert("approval_omitted".into(), Value::Bool(true));
            } else {
                data.insert("approval".into(), card.unwrap_or(Value::Null));
            }
        }
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("event")
            .to_owned();
        feed.push(&kind, Value::Object(data).to_string());
    }
}

/// The inbox card of a call that was just asked about, or `None` if it is no
/// longer pending (decided meanwhile: its decision event follows).
async fn card(
    runtime: &Overseer,
    header: Option<SessionHeader>,
    id: SessionId,
    call_id: &str,
) -> Option<ApprovalItem> {
    // The header read for the tenant may predate nothing: the event was
    // published after its checkpoint. Read afresh otherwise.
    let owner = match header {
        Some(h) => h,
        None => runtime.store().load_header(id).await.ok()??,
    };
    let call = pending_calls(&owner).find(|c| c.id.as_str() == call_id)?;
    let chain = lineage(runtime, &mut HashMap::new(), &owner).await.ok()?;
    let mut item = ApprovalItem::new(runtime, &owner, call, &chain);
    // Without its context the card still says what to decide.
    let _ = item.load_context(runtime).await;
    Some(item)
}

/// An event without its texts, results and arguments.
fn summary(event: &Event) -> Map<String, Value> {
    let Ok(Value::Object(full)) = serde_json::to_value(event) else {
        return Map::new();
    };
    let mut out: Map<String, Value> = full
        .iter()
        .filter(|(k, _)| SUMMARY_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(record) = full.get("record") {
        out.insert("decision".into(), record["decision"]["decision"].clone());
        out.insert("by".into(), record["by"].clone());
    }
    out
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(default)]
    after: Option<String>,
}

/// Parses `<stream>-<seq>`.
fn parse_position(raw: &str) -> Result<(&str, u64), ApiError> {
    raw.trim()
        .rsplit_once('-')
        .and_then(|(stream, seq)| Some((stream, seq.parse::<u64>().ok()?)))
        .filter(|(stream, _)| !stream.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_last_event_id",
                "Last-Event-ID: expected the id of an event of this stream (<stream>-<seq>)",
            )
        })
}

fn sse(stream: &str, item: &Item) -> SseEvent {
    SseEvent::default()
        .id(format!("{stream}-{}", item.seq))
        .event(&item.event)
        .data(&item.data)
}

/// `GET /v1/events[?after=ID]` with optional `Last-Event-ID`.
#[utoipa::path(
    get, path = "/v1/events", tag = "tenant",
    params(EventsQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (`<stream>-<seq>`)")),
    responses(
        (status = 200, description = "Server-Sent Events of the tenant: `approval.requested`, `approval.decided`, session endings, and `reset` when the replay was lost", content_type = "text/event-stream", body = String),
        (status = 400, description = "Invalid `after` or `Last-Event-ID`", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn stream(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let raw = match headers.get("last-event-id") {
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::bad_request(
                "invalid_last_event_id",
                "Last-Event-ID: expected the id of an event of this stream (<stream>-<seq>)",
            )
        })?),
        None => q.after.as_deref(),
    };
    let after = raw.map(parse_position).transpose()?;
    let feeds = state.tenant_feeds();
    feeds.start(state.overseer(), state.shutdown_signal());
    let sub = feeds.subscribe(&principal.tenant, after).ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the event feed is unavailable",
        )
    })?;
    let mut shutdown = state.shutdown_signal();
    let events = async_stream::stream! {
        let Subscription { stream, reset, replay, mut last, mut rx } = sub;
        if let Some((position, reason)) = reset {
            yield Ok(SseEvent::default()
                .id(format!("{stream}-{position}"))
                .event("reset")
                .data(reset_data(reason)));
        }
        for item in replay {
            last = item.seq;
            yield Ok(sse(&stream, &item));
        }
        if *shutdown.borrow_and_update() {
            return;
        }
        loop {
            let received = tokio::select! {
                _ = shutdown.changed() => return,
                r = rx.recv() => r,
            };
            match received {
                Ok(item) => {
                    if item.seq <= last {
                        continue;
                    }
                    last = item.seq;
                    yield Ok(sse(&stream, &item));
                }
                // Fell behind: reconnecting with the last id resumes from
                // the feed's buffer.
                Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
            }
        }
    };
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_resumes_only_within_its_stream_and_buffer() {
        let feeds = TenantFeeds::default();
        let first = feeds.subscribe("acme", None).unwrap();
        assert_eq!(first.reset, Some((0, "new_client")));
        let feed = feeds.feed("acme").unwrap();
        for n in 0..(FEED_EVENTS + 10) {
            feed.push("status_changed", format!("{{\"n\":{n}}}"));
        }
        let stream = first.stream.clone();
        // Within the buffer: exactly the later events, no reset.
        let last = (FEED_EVENTS + 10) as u64;
        let sub = feeds.subscribe("acme", Some((&stream, last - 3))).unwrap();
        assert_eq!(sub.reset, None);
        let seqs: Vec<u64> = sub.replay.iter().map(|i| i.seq).collect();
        assert_eq!(seqs, vec![last - 2, last - 1, last]);
        // Older than the buffer, from the future, or from another stream: reset.
        for (s, seq, reason) in [
            (stream.as_str(), 5, "position_unavailable"),
            (stream.as_str(), last + 1, "position_unavailable"),
            ("0000-1", 1, "unknown_stream"),
        ] {
            let sub = feeds.subscribe("acme", Some((s, seq))).unwrap();
            assert_eq!(sub.reset, Some((last, reason)), "{s}-{seq}");
            assert!(sub.replay.is_empty());
        }
        // Another tenant's feed is another stream.
        let other = feeds.subscribe("globex", None).unwrap();
        assert_ne!(other.stream, stream);
        let sub = feeds.subscribe("globex", Some((&stream, 1))).unwrap();
        assert_eq!(sub.reset.map(|r| r.1), Some("unknown_stream"));
    }

    #[test]
    fn a_feed_is_bounded_in_bytes_too() {
        let feed = Feed::new("n-1".into());
        let big = "x".repeat(FEED_BYTES / 4);
        for _ in 0..10 {
            feed.push("e", big.clone());
        }
        let buf = feed.buf.lock().unwrap();
        assert!(buf.bytes <= FEED_BYTES, "{}", buf.bytes);
        assert_eq!(buf.items.len(), 4);
        assert_eq!(buf.floor, 6);
    }

    #[test]
    fn positions_parse_strictly() {
        assert_eq!(parse_position("ab12-3-17").unwrap(), ("ab12-3", 17));
        for bad in ["", "17", "-17", "ab-x", "ab-"] {
            assert!(parse_position(bad).is_err(), "{bad}");
        }
    }
}
