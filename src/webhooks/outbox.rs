//! What goes out, decided at the checkpoint: which events of a checkpoint
//! go out as webhooks ([`seeds_of`], a pure function of the session's
//! header and events, each under a `webhook-id` derived from the session
//! and the event's number, [`webhook_id`]), and the view of which tenants
//! have endpoints ([`Subscriptions`]) that a store's write path consults.
//!
//! The view is what the sled store (one process writes it) decides by: it
//! is updated before a registration is answered, so every event
//! checkpointed after that answer is owed to the endpoint. PostgreSQL,
//! shared by many nodes, does not trust any node's view: its checkpoint
//! statement joins the seeds with the endpoints table itself.
//!
//! A seed is a reference, not a copy: the event's kind, session, sequence
//! number, time and call id. The event and the call are durable in the
//! checkpoint already, so the body is built from the session's stored state
//! at delivery time (`payload`).
//!
//! The view also says whether such checkpoints are being written right now
//! ([`Subscriptions::busy`]): the delivery task paces itself by it, so
//! deliveries do not take the machine from the turns that cause them.
//!
//! It deliberately does no I/O: the store writes and hands over what it
//! returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use overseer_actors::model::{Event, EventKind, SessionHeader, SessionId, SessionStatus};
use overseer_actors::store::Checkpoint;
use tokio::sync::Notify;
use uuid::Uuid;

use super::{Endpoint, EventType, Seed};

/// One endpoint as the write path needs it.
#[derive(Debug, Clone, Copy)]
struct Sub {
    endpoint: Uuid,
    /// Bits of [`EventType::bit`].
    events: u8,
}

/// The tenants that have endpoints, with the events each endpoint wants,
/// and the wake-up of the delivery task.
#[derive(Debug, Default)]
pub struct Subscriptions {
    // A std lock: held for a map lookup or update, never across an await.
    by_tenant: RwLock<HashMap<String, Vec<Sub>>>,
    /// Whether any tenant has an endpoint: most servers have none, and
    /// their checkpoints then skip even the lookup.
    any: AtomicBool,
    /// Signalled when deliveries were committed (or one may have become due).
    wake: Notify,
    /// When deliveries were last committed: ms since [`epoch`], plus one
    /// (0: never).
    last_write: AtomicU64,
}

/// The origin of [`Subscriptions::busy`]'s monotonic clock.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Subscriptions {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces `endpoint` (a disabled one wants nothing).
    pub fn put(&self, endpoint: &Endpoint) {
        let events = EventType::ALL
            .into_iter()
            .filter(|e| endpoint.wants(*e))
            .fold(0u8, |bits, e| bits | e.bit());
        let Ok(mut map) = self.by_tenant.write() else {
            return;
        };
        let subs = map.entry(endpoint.tenant.clone()).or_default();
        subs.retain(|s| s.endpoint != endpoint.id);
        if events != 0 {
            subs.push(Sub {
                endpoint: endpoint.id,
                events,
            });
        }
        if subs.is_empty() {
            map.remove(&endpoint.tenant);
        }
        self.any.store(!map.is_empty(), Ordering::Release);
    }

    /// Removes an endpoint.
    pub fn remove(&self, id: Uuid, tenant: &str) {
        let Ok(mut map) = self.by_tenant.write() else {
            return;
        };
        if let Some(subs) = map.get_mut(tenant) {
            subs.retain(|s| s.endpoint != id);
            if subs.is_empty() {
                map.remove(tenant);
            }
        }
        self.any.store(!map.is_empty(), Ordering::Release);
    }

    /// The deliveries `cp` owes: one per event that goes out and endpoint
    /// of the session's tenant that wants it. Costs one atomic load for a
    /// server without endpoints, a map lookup for a tenant without any.
    /// The seeds are not named yet (their `id` is empty): this runs on a
    /// session's path, and whoever hands them out names them ([`named`]).
    pub fn rows(&self, cp: &Checkpoint) -> Vec<(Uuid, Seed)> {
        if !self.any.load(Ordering::Acquire)
            || !cp
                .events
                .iter()
                .any(|e| event_type(e, &cp.header).is_some())
        {
            return Vec::new();
        }
        // Held for the loop below only: no I/O, no await.
        let Ok(map) = self.by_tenant.read() else {
            return Vec::new();
        };
        let Some(subs) = map.get(&cp.header.tenant) else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for event in cp.events.iter() {
            let Some(seed) = unnamed(event, &cp.header) else {
                continue;
            };
            let bit = seed.event.bit();
            let mut wanting = subs.iter().filter(|sub| sub.events & bit != 0).peekable();
            while let Some(sub) = wanting.next() {
                if wanting.peek().is_some() {
                    rows.push((sub.endpoint, seed.clone()));
                } else {
                    rows.push((sub.endpoint, seed));
                    break;
                }
            }
        }
        rows
    }

    /// Tells the delivery task that deliveries were committed (or that it
    /// should look again).
    pub fn written(&self) {
        self.last_write
            .store(since_epoch_ms().saturating_add(1), Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether a checkpoint owed deliveries within the last `quiet`: the
    /// sessions whose events go out are busy, and deliveries should keep out
    /// of their way.
    pub fn busy(&self, quiet: Duration) -> bool {
        match self.last_write.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let quiet = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
                since_epoch_ms().saturating_add(1).saturating_sub(at) < quiet
            }
        }
    }

    /// Resolves at the next [`Subscriptions::written`] (or at once, if one
    /// came since the last wait).
    pub(super) async fn wait(&self) {
        self.wake.notified().await;
    }
}

/// Which webhook `event` of the session `header` describes is, if any.
fn event_type(event: &Event, header: &SessionHeader) -> Option<EventType> {
    match &event.kind {
        EventKind::ApprovalRequested { .. } => Some(EventType::ApprovalRequested),
        EventKind::DecisionRecorded { .. } => Some(EventType::ApprovalDecided),
        // A child's end is its parent's business (its result comes back as
        // a tool result); people hear of the roots they started.
        EventKind::StatusChanged { status } if header.parent.is_none() => match status {
            SessionStatus::Completed | SessionStatus::Cancelled => Some(EventType::SessionFinished),
            SessionStatus::Failed => Some(EventType::SessionFailed),
            _ => None,
        },
        _ => None,
    }
}

/// The `webhook-id` of the event `seq` of session `session`, which
/// happened at `at_ms`: `msg_` and a UUIDv7 whose time is the event's and
/// whose other bits are a SHA-256 of the session and the number. Derived,
/// not drawn, so that whoever finds the event again (a restart reading the
/// session back, another node) sends it under the same id and a receiver
/// drops the duplicate (a committed event's number is never reused); and
/// ordered by time like the ids before it, so a delivery log keyed by it
/// still lists the newest first.
pub fn webhook_id(session: &SessionId, seq: u64, at_ms: i64) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"overseer webhook-id\0");
    hash.update(session.as_bytes());
    hash.update(seq.to_be_bytes());
    let digest = hash.finalize();
    let mut rest = [0u8; 10];
    rest.copy_from_slice(&digest[..10]);
    let millis = u64::try_from(at_ms).unwrap_or(0);
    let id = uuid::Builder::from_unix_timestamp_millis(millis, &rest).into_uuid();
    format!("msg_{}", id.simple())
}

/// The events of `cp` that go out as webhooks, whoever listens (see
/// [`seeds_of`]).
pub fn seeds(cp: &Checkpoint) -> Vec<Seed> {
    seeds_of(&cp.header, &cp.events)
}

/// The events among `events` of the session `header` describes that go out
/// as webhooks, whoever listens: each with its `webhook-id`
/// ([`webhook_id`]) and a reference to the event (its session, sequence
/// number, time, call id or new status), not its content: the body is
/// built from the stored session when it is sent.
pub fn seeds_of(header: &SessionHeader, events: &[Event]) -> Vec<Seed> {
    events
        .iter()
        .filter_map(|event| unnamed(event, header))
        .map(named)
        .collect()
}

/// `seed` with its `webhook-id` ([`webhook_id`]), if it has none yet.
pub fn named(mut seed: Seed) -> Seed {
    if seed.id.is_empty() {
        seed.id = webhook_id(&seed.session_id, seed.seq, seed.at_ms);
    }
    seed
}

/// The seed of `event` if it goes out, not yet named.
fn unnamed(event: &Event, header: &SessionHeader) -> Option<Seed> {
    let kind = event_type(event, header)?;
    let mut seed = Seed {
        id: String::new(),
        event: kind,
        tenant: header.tenant.clone(),
        session_id: header.id,
        root_session_id: header.root_id,
        seq: event.seq,
        at_ms: event.at_ms,
        call: None,
        call_id: None,
        decision: None,
        status: None,
        stop_reason: None,
        detail: None,
    };
    match &event.kind {
        EventKind::ApprovalRequested { call_id, .. }
        | EventKind::DecisionRecorded { call_id, .. } => {
            seed.call_id = Some(call_id.0.clone());
        }
        EventKind::StatusChanged { status } => {
            seed.status = Some(*status);
            seed.stop_reason = header.last_stop_reason;
        }
        _ => {}
    }
    Some(seed)
}

/// Whether `seed` was derived from `event` (the event committed at its
/// sequence number): a row written with a checkpoint that a crash cut short
/// before its commit record names an event that never happened, and a later
/// checkpoint may commit another event under the same number.
pub fn describes(seed: &Seed, event: &Event) -> bool {
    let call_id = match &event.kind {
        EventKind::ApprovalRequested { call_id, .. }
        | EventKind::DecisionRecorded { call_id, .. } => Some(call_id.as_str()),
        _ => None,
    };
    let status = match &event.kind {
        EventKind::StatusChanged { status } => Some(*status),
        _ => None,
    };
    event.session_id == seed.session_id
        && event.seq == seed.seq
        && event.at_ms == seed.at_ms
        && call_id == seed.call_id.as_deref()
        && status == seed.status
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use overseer_actors::model::{
        AgentConfig, SessionHeader, SessionId, ToolCallId, ToolCallRecord,
    };
    use serde_json::json;

    use super::*;

    fn checkpoint(tenant: &str, events: Vec<EventKind>) -> Checkpoint {
        let id = SessionId::generate();
        let mut header = SessionHeader::new(
            id,
            tenant.into(),
            "a".into(),
            AgentConfig::new("a", &[]).effective(),
            1,
        );
        let mut call =
            ToolCallRecord::proposed(ToolCallId("call_1".into()), "t".into(), json!({}), 1);
        call.state = overseer_actors::model::CallState::AwaitingApproval;
        header.open_calls.push(call);
        let events: Vec<Event> = events
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                session_id: id,
                seq: i as u64 + 1,
                at_ms: 10 + i as i64,
                kind,
            })
            .collect();
        header.last_event_seq = events.len() as u64;
        Checkpoint {
            header,
            entries: Vec::new(),
            events: Arc::new(events),
            metadata: None,
            queued: Vec::new(),
            dequeued: 0..0,
        }
    }

    fn endpoint(tenant: &str, events: &[EventType]) -> Endpoint {
        Endpoint {
            id: Uuid::now_v7(),
            tenant: tenant.into(),
            url: "http://x".into(),
            events: events.to_vec(),
            description: None,
            secret: String::new(),
            created_by: None,
            created_at_ms: 0,
            disabled: None,
            previous_secret: None,
        }
    }

    #[test]
    fn rows_go_to_the_tenants_endpoints_that_want_the_event() {
        let subs = Subscriptions::new();
        let requested = EventKind::ApprovalRequested {
            call_id: ToolCallId("call_1".into()),
            name: "t".into(),
            arguments: json!({}),
            outcome_unknown: false,
        };
        let cp = checkpoint(
            "acme",
            vec![
                EventKind::TurnStarted { turn: 1 },
                requested.clone(),
                EventKind::StatusChanged {
                    status: SessionStatus::Completed,
                },
            ],
        );
        assert!(subs.rows(&cp).is_empty(), "no endpoint anywhere");
        let all = endpoint("acme", &EventType::ALL);
        let approvals = endpoint("acme", &[EventType::ApprovalRequested]);
        let other = endpoint("globex", &EventType::ALL);
        for e in [&all, &approvals, &other] {
            subs.put(e);
        }
        let rows: Vec<(Uuid, Seed)> = subs
            .rows(&cp)
            .into_iter()
            .map(|(e, seed)| {
                assert!(seed.id.is_empty(), "named only when handed out");
                (e, named(seed))
            })
            .collect();
        let mut got: Vec<(Uuid, EventType)> = rows.iter().map(|(e, s)| (*e, s.event)).collect();
        got.sort();
        let mut want = vec![
            (all.id, EventType::ApprovalRequested),
            (all.id, EventType::SessionFinished),
            (approvals.id, EventType::ApprovalRequested),
        ];
        want.sort();
        assert_eq!(got, want);
        // One webhook-id per event, shared by its endpoints.
        let requested_ids: Vec<&str> = rows
            .iter()
            .filter(|(_, s)| s.event == EventType::ApprovalRequested)
            .map(|(_, s)| s.id.as_str())
            .collect();
        assert_eq!(requested_ids[0], requested_ids[1]);
        // Derived from the session and the event: found again, it is the
        // same; another event or session has another.
        assert_eq!(requested_ids[0], webhook_id(&cp.header.id, 2, 11));
        assert_eq!(seeds(&cp)[0].id, requested_ids[0]);
        assert_ne!(webhook_id(&cp.header.id, 3, 11), requested_ids[0]);
        assert_ne!(webhook_id(&SessionId::generate(), 2, 11), requested_ids[0]);
        let hex = requested_ids[0].strip_prefix("msg_").unwrap();
        let uuid = Uuid::parse_str(hex).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        // Ordered by the event's time, as the delivery log lists them.
        assert!(webhook_id(&SessionId::generate(), 9, 12) > webhook_id(&cp.header.id, 2, 11));
        let seed = &rows[0].1;
        // A reference to the event, not a copy of the call.
        assert_eq!(seed.call_id.as_deref(), Some("call_1"));
        assert!(seed.call.is_none() && seed.decision.is_none() && seed.detail.is_none());
        assert!(serde_json::to_vec(seed).unwrap().len() < 300, "{seed:?}");
        assert!(describes(seed, &cp.events[1]));
        assert!(!describes(seed, &cp.events[2]));

        let mut disabled = all.clone();
        disabled.disabled = Some(super::super::Disabled {
            at_ms: 1,
            reason: "gone".into(),
        });
        subs.put(&disabled);
        subs.remove(approvals.id, "acme");
        assert!(subs.rows(&cp).is_empty());
    }
}
