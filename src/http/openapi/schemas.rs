//! Schema-only types: the shapes of bodies the handlers build as JSON
//! values (pages, views, the error), described for the OpenAPI document.
//! Nothing constructs them; the contract tests hold the handlers' real
//! bodies to them, so a field added to a handler's `json!` without its
//! description here fails a test.

#![allow(dead_code)]

use overseer_actors::model::{
    AgentConfig, QueuedMessage, SessionHeader, SessionId, SessionStatus, TranscriptEntry,
};
use overseer_actors::{HistoryPoint, TreeNode};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::render::Warning;

/// Every refusal: `{"error": {"code", "message", "details"?}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What was refused and why.
#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code (e.g. `not_found`, `invalid_body`,
    /// `session_busy`, `store_unavailable`).
    pub code: String,
    /// A sentence for a person, naming what was wrong.
    pub message: String,
    /// Structured extras (the ids a submission got wrong, `retry_after_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// A session: its header's fields, its metadata and queued messages, and
/// its transcript.
#[derive(Serialize, ToSchema)]
pub struct Session {
    #[serde(flatten)]
    pub header: SessionHeader,
    /// The metadata given at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Messages waiting for the running turn to end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inbox: Vec<QueuedMessage>,
    /// Everything said and done, in order.
    pub transcript: Vec<TranscriptEntry>,
}

/// A page of `GET /v1/sessions`.
#[derive(Serialize, ToSchema)]
pub struct SessionPage {
    /// Session headers, ascending by id.
    pub sessions: Vec<SessionHeader>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<SessionId>,
}

/// The answer to a message: it is checkpointed.
#[derive(Serialize, ToSchema)]
pub struct MessageAccepted {
    pub session_id: SessionId,
    /// The `message_id` sent, if any.
    pub message_id: Option<String>,
}

/// The calls decidable at a session.
#[derive(Serialize, ToSchema)]
pub struct PendingApprovals {
    pub session_id: SessionId,
    pub status: SessionStatus,
    pub pending: Vec<PendingCall>,
}

/// One call waiting for a decision.
#[derive(Serialize, ToSchema)]
pub struct PendingCall {
    pub call_id: String,
    /// The session that owns the call.
    pub session_id: SessionId,
    /// Sessions from the asked one down to the owner.
    pub session_path: Vec<SessionId>,
    /// The tool.
    pub name: String,
    pub arguments: Value,
    /// It ran when the process stopped; approving runs it again.
    pub outcome_unknown: bool,
    pub proposed_at_ms: i64,
    pub approval_deadline_ms: Option<i64>,
    /// The rendering rule's warnings about `name` and `arguments`.
    pub warnings: Vec<Warning>,
}

/// `GET /v1/agents`.
#[derive(Serialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<Agent>,
}

/// An agent's configuration with its tools' declarations and its skills.
#[derive(Serialize, ToSchema)]
pub struct Agent {
    #[serde(flatten)]
    pub config: AgentConfig,
    pub tool_specs: Vec<ToolSpec>,
    pub skill_specs: Vec<SkillSpec>,
}

/// A tool in an agent's scope (`available: false` and the name alone when
/// it is not configured).
#[derive(Serialize, ToSchema)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_approval: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<bool>,
}

/// A skill an agent's sessions may activate.
#[derive(Serialize, ToSchema)]
pub struct SkillSpec {
    pub name: String,
    pub description: String,
    /// Only a person may activate it.
    pub requires_trust: bool,
}

/// `GET /v1/sessions/{id}/history`: the points a fork can start from.
#[derive(Serialize, ToSchema)]
pub struct History {
    pub session_id: SessionId,
    pub points: Vec<HistoryPoint>,
}

/// `GET /v1/tasks`.
#[derive(Serialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<overseer_actors::tasks::TaskDef>,
}

/// `GET /v1/me`: who the token is and what it may do.
#[derive(Serialize, ToSchema)]
pub struct Me {
    pub sub: String,
    pub tenant: String,
    pub scopes: Vec<String>,
    pub may: May,
}

/// What the caller's scopes allow.
#[derive(Serialize, ToSchema)]
pub struct May {
    pub read: bool,
    pub write: bool,
    pub decide: bool,
    pub admin: bool,
}

/// `/healthz` and `/readyz`.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok` (alive) or `ready`.
    pub status: String,
}

/// A session tree (`GET /v1/sessions/{id}/tree`).
pub type Tree = TreeNode;

/// The events a webhook endpoint can receive.
#[derive(Serialize, ToSchema)]
pub enum WebhookEvent {
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    #[serde(rename = "approval.decided")]
    ApprovalDecided,
    #[serde(rename = "session.finished")]
    SessionFinished,
    #[serde(rename = "session.failed")]
    SessionFailed,
}

/// A webhook endpoint (without its secret).
#[derive(Serialize, ToSchema)]
pub struct Webhook {
    pub id: uuid::Uuid,
    pub url: String,
    pub events: Vec<WebhookEvent>,
    pub description: Option<String>,
    pub created_by: Option<String>,
    pub created_at_ms: i64,
    /// Deliveries are made (not given up).
    pub enabled: bool,
    /// Why deliveries were given up, if they were.
    pub disabled: Option<WebhookDisabled>,
    /// Until when the secret before the last rotation still signs.
    pub previous_secret_until_ms: Option<i64>,
}

/// Why an endpoint stopped receiving deliveries.
#[derive(Serialize, ToSchema)]
pub struct WebhookDisabled {
    pub at_ms: i64,
    pub reason: String,
}

/// A webhook endpoint with its signing secret (`whsec_…`), shown on create
/// and rotate only.
#[derive(Serialize, ToSchema)]
pub struct WebhookWithSecret {
    #[serde(flatten)]
    pub webhook: Webhook,
    pub secret: String,
}

/// `GET /v1/webhooks`.
#[derive(Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// Where a delivery stands.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
}

/// One delivery of an event to an endpoint.
#[derive(Serialize, ToSchema)]
pub struct Delivery {
    /// The message id (`msg_…`, the `webhook-id` header).
    pub webhook_id: String,
    pub event: WebhookEvent,
    pub session_id: SessionId,
    pub event_seq: u64,
    pub status: DeliveryStatus,
    pub attempts: u32,
    pub created_at_ms: i64,
    /// Set while pending.
    pub next_attempt_at_ms: Option<i64>,
    pub last_attempt_at_ms: Option<i64>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    pub delivered_at_ms: Option<i64>,
}

/// A page of an endpoint's delivery log.
#[derive(Serialize, ToSchema)]
pub struct DeliveryPage {
    pub deliveries: Vec<Delivery>,
    pub next_cursor: Option<String>,
}
