//! Webhooks: per-tenant endpoints that are told, over HTTP, when an
//! approval is asked for or decided and when a session ends, signed as the
//! Standard Webhooks specification says, delivered at least once.
//!
//! What it owns:
//!
//! - the model: [`Endpoint`] (a URL, the events it wants, its signing secret,
//!   whether it is disabled and why), [`Seed`] (what a checkpoint says about
//!   one event that goes out), [`Delivery`] (one message to one endpoint: its
//!   `webhook-id`, the body once built, attempts, status, last error);
//! - [`WebhookStore`], the port through which endpoints and deliveries are
//!   kept (the sled store implements it in `crate::store`, PostgreSQL in
//!   `crate::store::postgres`): this module never names a store;
//! - [`Subscriptions`] (`outbox`): the cheap, shared view of which tenants
//!   have endpoints that the store's write path consults to derive which
//!   deliveries a checkpoint's events owe ([`seeds_of`], each under a
//!   `webhook-id` derived from its session and event, [`webhook_id`]);
//! - the delivery task (`dispatch`): it sends fresh deliveries as the store
//!   hands them over (a delivery enters the log at its first outcome, and
//!   the retry schedule only if that attempt failed), builds each
//!   body once (`payload`: the approval card of `GET /v1/approvals` and
//!   links to the inbox), signs (`signing`) and sends it, and retries with
//!   exponential backoff and jitter under the same `webhook-id` until it is
//!   delivered or, after `max_age_secs` (24 h), given up, which disables the
//!   endpoint with the reason recorded;
//! - which URLs may be endpoints (`target`): the SSRF rules, checked at
//!   registration and again, on the addresses a name resolves to, at every
//!   connection.
//!
//! Guarantees: what an event's deliveries need to be found again is
//! committed with the checkpoint that records the event (PostgreSQL: the
//! delivery rows; sled: a row per group of checkpoints naming the events,
//! which are the rest), so a webhook is lost neither by a crash (kill -9) nor by a
//! failover; a delivery is only sent once the store says its event is
//! committed; it may be sent more than once (at least once), always with the
//! same `webhook-id`. Deliveries run on their own task with bounded
//! concurrency and never on a session's path: a session's checkpoint adds
//! at most a row to its write.
//!
//! It deliberately owns no HTTP routes (`crate::http::webhooks`), no SQL and
//! no sled trees, and gives no ordering guarantee between deliveries.

mod dispatch;
pub mod metrics;
mod outbox;
mod payload;
mod signing;
mod target;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use overseer_actors::model::{
    DecisionRecord, SessionId, SessionStatus, StopReason, ToolCallRecord,
};
use overseer_actors::store::StoreError;
use overseer_actors::Overseer;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

pub use dispatch::{Clock, ManualClock, SystemClock};
pub use outbox::{describes, named, seeds, seeds_of, webhook_id, Subscriptions};
pub use signing::{sign, Secret};
pub use target::{TargetError, TargetRules};

/// The events an endpoint can subscribe to (their wire names are the
/// payload's `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventType {
    /// A tool call waits for a person's decision.
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    /// A decision on a call a person was asked about (or a standing rule
    /// answered) was recorded: approved, edited or denied, by whom.
    #[serde(rename = "approval.decided")]
    ApprovalDecided,
    /// A root session ended: `completed` or `cancelled`.
    #[serde(rename = "session.finished")]
    SessionFinished,
    /// A root session `failed`.
    #[serde(rename = "session.failed")]
    SessionFailed,
}

impl EventType {
    /// Every event, in wire order.
    pub const ALL: [EventType; 4] = [
        EventType::ApprovalRequested,
        EventType::ApprovalDecided,
        EventType::SessionFinished,
        EventType::SessionFailed,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApprovalRequested => "approval.requested",
            Self::ApprovalDecided => "approval.decided",
            Self::SessionFinished => "session.finished",
            Self::SessionFailed => "session.failed",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an endpoint stopped receiving deliveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disabled {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Why, in one sentence.
    pub reason: String,
}

/// A registered endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Its id.
    pub id: Uuid,
    /// The tenant it belongs to: it hears of that tenant's sessions only.
    pub tenant: String,
    /// Where deliveries are POSTed.
    pub url: String,
    /// The events it receives.
    pub events: Vec<EventType>,
    /// A note of the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The signing secret, `whsec_` + base64 of its key.
    pub secret: String,
    /// Who registered it (the token's subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// When, ms since the epoch.
    pub created_at_ms: i64,
    /// Set once deliveries to it were given up (or it answered 410 Gone):
    /// nothing more is sent to it, and new events are not queued for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<Disabled>,
    /// The secret it had before its last rotation, still signing (beside
    /// the new one) until the grace period ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_secret: Option<PreviousSecret>,
}

/// A rotated-out secret and how long it still signs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    /// The old secret, `whsec_…`.
    pub secret: String,
    /// Until when (ms since the epoch) deliveries carry its signature too.
    pub until_ms: i64,
}

impl Endpoint {
    /// Whether it wants `event` and takes deliveries.
    pub fn wants(&self, event: EventType) -> bool {
        self.disabled.is_none() && self.events.contains(&event)
    }

    /// The secrets a delivery at `now_ms` is signed with: the current one,
    /// and the previous one during its grace period (Standard Webhooks:
    /// space-separated signatures, a receiver accepts any that verifies).
    pub fn signing_secrets(&self, now_ms: i64) -> Vec<&str> {
        let mut out = vec![self.secret.as_str()];
        if let Some(p) = &self.previous_secret {
            if now_ms < p.until_ms {
                out.push(p.secret.as_str());
            }
        }
        out
    }
}

/// What a checkpoint says about one event that goes out as a webhook: a
/// reference to the event (the event and its call are durable in that
/// checkpoint already), from which the body is built when it is first
/// sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seed {
    /// The `webhook-id`: the same for every endpoint and every attempt.
    pub id: String,
    /// What happened.
    pub event: EventType,
    /// The session's tenant.
    pub tenant: String,
    /// The session whose event it is (the owner of the call, for approvals).
    pub session_id: SessionId,
    /// The root of its tree.
    pub root_session_id: SessionId,
    /// The event's sequence number in that session.
    pub seq: u64,
    /// When it happened, ms since the epoch.
    pub at_ms: i64,
    /// The call as a checkpoint recorded it: only in rows written before
    /// rows became references (read, never written now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ToolCallRecord>,
    /// The call's id (approval events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The decision: only in rows written before rows became references
    /// (now read from the stored event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
    /// The session's new status (`session.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SessionStatus>,
    /// Why the last turn stopped (`session.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// The error of a failed session, or why the runtime completed it: only
    /// in rows written before rows became references (now read from the
    /// stored header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A seed of an `approval.requested` at `seq` of `session` (tenant
/// `acme`), for tests.
#[cfg(test)]
pub(crate) fn test_seed(session: SessionId, seq: u64) -> Seed {
    Seed {
        id: webhook_id(&session, seq, 1),
        event: EventType::ApprovalRequested,
        tenant: "acme".into(),
        session_id: session,
        root_session_id: session,
        seq,
        at_ms: 1,
        call: None,
        call_id: None,
        decision: None,
        status: None,
        stop_reason: None,
        detail: None,
    }
}

/// Where a delivery stands. A delivery not attempted yet is not in the log
/// on a store that sends it before recording it (sled): it appears with
/// its first attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Not delivered yet; tried again at `next_attempt_at_ms`.
    Pending,
    /// A 2xx answer was received.
    Delivered,
    /// Given up (too old, too many attempts, the endpoint disabled or gone).
    Failed,
}

impl DeliveryStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Failed]
            .into_iter()
            .find(|d| d.as_str() == s)
    }
}

/// One message to one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The endpoint.
    pub endpoint: Uuid,
    /// What it is about, including its `webhook-id` (`seed.id`).
    pub seed: Seed,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When it was queued, ms since the epoch.
    pub created_at_ms: i64,
    /// When the next attempt is due (pending only).
    pub next_attempt_at_ms: i64,
    /// When the last attempt was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at_ms: Option<i64>,
    /// The HTTP status of the last answer, if one came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status_code: Option<u16>,
    /// Why the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it was delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at_ms: Option<i64>,
    /// The body, built at the first attempt and sent unchanged by every
    /// later one; dropped once delivered (the log keeps what happened, not
    /// what was sent), kept while pending and when given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl Delivery {
    /// A new pending delivery of `seed` to `endpoint`, due at `now_ms`.
    pub fn new(endpoint: Uuid, seed: Seed, now_ms: i64) -> Self {
        Self {
            endpoint,
            seed,
            status: DeliveryStatus::Pending,
            attempts: 0,
            created_at_ms: now_ms,
            next_attempt_at_ms: now_ms,
            last_attempt_at_ms: None,
            last_status_code: None,
            last_error: None,
            delivered_at_ms: None,
            body: None,
        }
    }

    /// Its key: (endpoint, `webhook-id`).
    pub fn key(&self) -> DeliveryKey {
        (self.endpoint, self.seed.id.clone())
    }

    /// Drops what its log entry no longer needs, so the log stays small:
    /// once the body is built, the seed's call, decision and detail (the
    /// body holds them); once delivered, the body too.
    pub fn compact(&mut self) {
        if self.body.is_some() || self.status != DeliveryStatus::Pending {
            self.seed.call = None;
            self.seed.decision = None;
            self.seed.detail = None;
        }
        if self.status == DeliveryStatus::Delivered {
            self.body = None;
        }
    }
}

/// A claimed delivery with its endpoint as the store had it at the claim
/// (`None`: deleted), so an attempt reads nothing more before sending.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The delivery.
    pub delivery: Delivery,
    /// Its endpoint.
    pub endpoint: Option<Endpoint>,
    /// Handed over by [`WebhookStore::intake`]: nothing but its event (and
    /// what the store keeps to find it again) records it until its first
    /// outcome is saved.
    pub fresh: bool,
}

/// An attempt's outcome to record: the delivery's new state and the
/// `next_attempt_at_ms` it was claimed with.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The delivery as it now stands (already [`Delivery::compact`]ed).
    pub delivery: Delivery,
    /// When it was due at its claim.
    pub was_due_at: i64,
    /// Its claim was fresh ([`Claim::fresh`]): saving it writes the
    /// delivery into the log (and, still pending, into the retry schedule),
    /// and settles it where the store tracks what its events owe.
    pub fresh: bool,
}

/// A delivery's identity: the endpoint and the `webhook-id`.
pub type DeliveryKey = (Uuid, String);

/// Most deliveries of an endpoint's log kept once they are over (delivered
/// or failed); older ones are pruned as new ones finish. With bodies
/// dropped once delivered ([`Delivery::compact`]) an entry is a few hundred
/// bytes, so a log is at most a few hundred KB.
pub const LOG_KEEP: usize = 1000;

/// The port through which endpoints and deliveries are kept. Every method
/// is the store's; the rules (who may see what, when to retry) are here.
#[async_trait::async_trait]
pub trait WebhookStore: Send + Sync + 'static {
    /// Writes an endpoint (a new one, or one being disabled), durably.
    async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<(), StoreError>;

    /// Reads one endpoint.
    async fn endpoint(&self, id: Uuid) -> Result<Option<Endpoint>, StoreError>;

    /// Every endpoint of `tenant`, or of every tenant.
    async fn endpoints(&self, tenant: Option<&str>) -> Result<Vec<Endpoint>, StoreError>;

    /// Deletes an endpoint with its deliveries, durably; `false` if none.
    async fn delete_endpoint(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Up to `limit` fresh deliveries, none of `busy`, each with its
    /// endpoint: deliveries owed by events the store has committed durably,
    /// due at `now_ms` ([`Claim::fresh`]). Nothing is written for them
    /// here: until its outcome is saved the store finds a delivery again
    /// from its event, so a crash before that sends it again (the same
    /// `webhook-id`). Deliveries whose endpoint no longer wants them, or
    /// that the log holds already, are dropped. A store that writes
    /// deliveries directly in the checkpoint keeps the default.
    async fn intake(
        &self,
        now_ms: i64,
        limit: usize,
        busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError> {
        let _ = (now_ms, limit, busy);
        Ok(Vec::new())
    }

    /// Up to `limit` pending deliveries due at `now_ms`, none of `busy`,
    /// each now this node's until `lease_until_ms` (another node of a
    /// cluster does not take it before; a store only one process writes may
    /// ignore the lease), each with its endpoint.
    async fn claim_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
        busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError>;

    /// The earliest time after `after_ms` at which a pending delivery
    /// becomes claimable (due, and any claim on it run out), if any.
    async fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError>;

    /// Records the new state of deliveries (after attempts, or given up),
    /// in as few writes as the store can: a fresh one that was delivered
    /// costs a log entry (and, once its group is settled, the removal of
    /// the group's row), nothing more.
    async fn save_deliveries(&self, outcomes: &[Outcome]) -> Result<(), StoreError>;

    /// How many deliveries are pending (all endpoints), for the metrics.
    async fn pending_count(&self) -> Result<u64, StoreError>;

    /// An endpoint's deliveries, newest first, after the `webhook-id`
    /// `before` (exclusive), at most `limit`.
    async fn deliveries(
        &self,
        endpoint: Uuid,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError>;
}

/// How deliveries are made (`[webhooks]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookOptions {
    /// The inbox's public address (`https://overseer.example.com`): payloads
    /// link to it. Empty: no links.
    pub public_url: String,
    /// Which addresses endpoints may have.
    pub targets: TargetRules,
    /// How long one attempt may take (connect, send, answer).
    pub request_timeout: Duration,
    /// Delay before the first retry; it doubles (with jitter) after each
    /// failed attempt up to `retry_max`.
    pub retry_initial: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// A delivery still failing this long after its event is given up and
    /// its endpoint disabled.
    pub max_age: Duration,
    /// A delivery that failed this many attempts is given up likewise.
    pub max_attempts: u32,
    /// Attempts in flight at once, all endpoints together.
    pub concurrency: usize,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            public_url: String::new(),
            targets: TargetRules::default(),
            request_timeout: Duration::from_secs(15),
            retry_initial: Duration::from_secs(5),
            retry_max: Duration::from_secs(3600),
            max_age: Duration::from_secs(24 * 3600),
            max_attempts: 100,
            concurrency: 16,
        }
    }
}

/// Why a webhook request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WebhookError {
    /// The URL may not be an endpoint (SSRF rules, shape).
    #[error("url: {0}")]
    Target(#[from] TargetError),
    /// A request field is wrong.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// No such endpoint (or another tenant's).
    #[error("no webhook endpoint {0}")]
    NotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a caller registers.
#[derive(Debug, Clone, Default)]
pub struct NewEndpoint {
    /// Where to POST.
    pub url: String,
    /// The events wanted (empty: every event).
    pub events: Vec<EventType>,
    /// A note.
    pub description: Option<String>,
    /// Who registers it.
    pub created_by: Option<String>,
}

/// Longest endpoint URL accepted.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest description accepted.
pub const MAX_DESCRIPTION_BYTES: usize = 512;
/// Most endpoints one tenant may have.
pub const MAX_ENDPOINTS_PER_TENANT: usize = 32;
/// Longest grace period of a rotated-out secret.
pub const MAX_ROTATION_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Grace period of a rotated-out secret when the caller names none.
pub const DEFAULT_ROTATION_GRACE: Duration = Duration::from_secs(24 * 3600);

/// The webhooks of one node: registration and the delivery task.
pub struct Webhooks {
    options: WebhookOptions,
    store: Arc<dyn WebhookStore>,
    subscriptions: Arc<Subscriptions>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Webhooks {
    /// Webhooks over `store`, whose write path derives deliveries through
    /// `subscriptions` (the view is filled here from the stored endpoints,
    /// so install it on the store before any session checkpoints, and open
    /// this before the runtime recovers sessions).
    pub async fn open(
        store: Arc<dyn WebhookStore>,
        subscriptions: Arc<Subscriptions>,
        options: WebhookOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, StoreError> {
        for endpoint in store.endpoints(None).await? {
            subscriptions.put(&endpoint);
        }
        Ok(Arc::new(Self {
            options,
            store,
            subscriptions,
            clock,
        }))
    }

    /// The options in force.
    pub fn options(&self) -> &WebhookOptions {
        &self.options
    }

    /// Registers an endpoint for `tenant`. The answer carries the signing
    /// secret: the only time it is shown.
    pub async fn register(&self, tenant: &str, new: NewEndpoint) -> Result<Endpoint, WebhookError> {
        if new.url.len() > MAX_URL_BYTES {
            return Err(WebhookError::Invalid {
                field: "url",
                message: format!("longer than {MAX_URL_BYTES} bytes"),
            });
        }
        if let Some(d) = &new.description {
            if d.len() > MAX_DESCRIPTION_BYTES {
                return Err(WebhookError::Invalid {
                    field: "description",
                    message: format!("longer than {MAX_DESCRIPTION_BYTES} bytes"),
                });
            }
        }
        let url = self.options.targets.check_registration(&new.url).await?;
        let mut events = if new.events.is_empty() {
            EventType::ALL.to_vec()
        } else {
            new.events
        };
        events.sort();
        events.dedup();
        let existing = self.store.endpoints(Some(tenant)).await?;
        if existing.len() >= MAX_ENDPOINTS_PER_TENANT {
            return Err(WebhookError::Invalid {
                field: "url",
                message: format!(
                    "the tenant already has {MAX_ENDPOINTS_PER_TENANT} endpoints, the most it may have; delete one first"
                ),
            });
        }
        let secret = Secret::generate().map_err(|e| StoreError::Io(e.to_string()))?;
        let endpoint = Endpoint {
            id: Uuid::now_v7(),
            tenant: tenant.to_owned(),
            url,
            events,
            description: new.description,
            secret: secret.to_string(),
            created_by: new.created_by,
            created_at_ms: self.clock.now_ms(),
            disabled: None,
            previous_secret: None,
        };
        self.store.put_endpoint(&endpoint).await?;
        self.subscriptions.put(&endpoint);
        Ok(endpoint)
    }

    /// `tenant`'s endpoints.
    pub async fn list(&self, tenant: &str) -> Result<Vec<Endpoint>, WebhookError> {
        Ok(self.store.endpoints(Some(tenant)).await?)
    }

    /// One endpoint of `tenant` (another tenant's is not found; an id
    /// that is not a UUID is invalid).
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Endpoint, WebhookError> {
        let not_found = || WebhookError::NotFound(id.to_owned());
        let uuid = Uuid::parse_str(id).map_err(|e| WebhookError::Invalid {
            field: "id",
            message: format!("'{id}' is not a valid webhook endpoint id (a UUID): {e}"),
        })?;
        match self.store.endpoint(uuid).await? {
            Some(e) if e.tenant == tenant => Ok(e),
            _ => Err(not_found()),
        }
    }

    /// Deletes one endpoint of `tenant` and its deliveries.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<(), WebhookError> {
        let endpoint = self.get(tenant, id).await?;
        // Out of the view first: no new checkpoint owes it a delivery.
        self.subscriptions.remove(endpoint.id, &endpoint.tenant);
        self.store.delete_endpoint(endpoint.id).await?;
        Ok(())
    }

    /// Takes a disabled endpoint of `tenant` back into service: events from
    /// now on are queued for it again (deliveries given up while it was
    /// disabled stay failed in its log). Enabling an enabled one changes
    /// nothing.
    pub async fn enable(&self, tenant: &str, id: &str) -> Result<Endpoint, WebhookError> {
        let mut endpoint = self.get(tenant, id).await?;
        if endpoint.disabled.take().is_some() {
            self.store.put_endpoint(&endpoint).await?;
            self.subscriptions.put(&endpoint);
            tracing::info!(endpoint = %endpoint.id, tenant, "webhooks: endpoint enabled again");
        }
        Ok(endpoint)
    }

    /// Gives an endpoint of `tenant` a new signing secret; the old one keeps
    /// signing beside it for `grace` (at most [`MAX_ROTATION_GRACE`]), so
    /// receivers can switch without refusing a delivery. The answer carries
    /// the new secret: the only time it is shown.
    pub async fn rotate(
        &self,
        tenant: &str,
        id: &str,
        grace: Duration,
    ) -> Result<Endpoint, WebhookError> {
        if grace > MAX_ROTATION_GRACE {
            return Err(WebhookError::Invalid {
                field: "grace_secs",
                message: format!("at most {} s", MAX_ROTATION_GRACE.as_secs()),
            });
        }
        let mut endpoint = self.get(tenant, id).await?;
        let secret = Secret::generate().map_err(|e| StoreError::Io(e.to_string()))?;
        let now = self.clock.now_ms();
        let old = std::mem::replace(&mut endpoint.secret, secret.to_string());
        endpoint.previous_secret = (!grace.is_zero()).then(|| PreviousSecret {
            secret: old,
            until_ms: now.saturating_add(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)),
        });
        self.store.put_endpoint(&endpoint).await?;
        Ok(endpoint)
    }

    /// The delivery log of one endpoint of `tenant`, newest first.
    pub async fn deliveries(
        &self,
        tenant: &str,
        id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, WebhookError> {
        let endpoint = self.get(tenant, id).await?;
        Ok(self.store.deliveries(endpoint.id, before, limit).await?)
    }

    /// Starts the delivery task on this node. It runs until `shutdown`
    /// turns true (or the runtime is gone), and never holds the runtime
    /// between two deliveries.
    pub fn start(
        self: &Arc<Self>,
        runtime: &Overseer,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        dispatch::start(self.clone(), runtime.downgrade(), shutdown)
    }
}
