//! The provider port: a request in, a stream of events out.
//!
//! This module owns the provider-neutral request and event types and the
//! [`Provider`] trait. It deliberately knows no wire format: the OpenAI and
//! Anthropic adapters live in the `overseer` crate (`src/provider/`), and a
//! provider's own wire types stay on that side of this boundary. The
//! [`crate::scripted`] provider is here because it touches neither network nor
//! disk (its scenario is handed to it already parsed).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{SessionId, TranscriptEntry, Usage};

/// A tool as the model is told about it. The registry builds one per tool
/// and every request that offers the tool shares it ([`Arc`]), so building a
/// request costs nothing in proportion to the tools' schemas; for the same
/// reason its size in characters is counted once, here, not per estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    name: String,
    description: String,
    parameters: Value,
    /// What [`ProviderRequest::approx_chars`] counts for this tool.
    chars: usize,
}

impl ToolDefinition {
    /// A definition of tool `name`, with what it does and the JSON Schema of
    /// its arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        let (name, description) = (name.into(), description.into());
        let chars = name.len() + description.len() + parameters.to_string().len();
        Self {
            name,
            description,
            parameters,
            chars,
        }
    }

    /// Tool name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it does.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// JSON Schema of its arguments.
    pub fn parameters(&self) -> &Value {
        &self.parameters
    }
}

/// One inference request, built from a session snapshot.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    /// Session making the request (for logs and for the scripted provider).
    pub session_id: SessionId,
    /// Agent name (the scripted provider picks its script by it).
    pub agent: String,
    /// Model route.
    pub model: String,
    /// System instructions.
    pub instructions: String,
    /// The transcript so far. Entries are shared, not copied, so building a
    /// request does not cost in proportion to the history.
    pub transcript: Vec<Arc<TranscriptEntry>>,
    /// Tools in scope (shared with the registry, see [`ToolDefinition`]).
    pub tools: Vec<Arc<ToolDefinition>>,
    /// JSON Schema the answer must match: providers with a native mode use
    /// it (OpenAI `response_format`, Anthropic a forced tool whose input is
    /// the answer, streamed back as text).
    pub output_schema: Option<Value>,
    /// What the request is for.
    pub purpose: RequestPurpose,
}

impl ProviderRequest {
    /// Characters the request sends (instructions, tool declarations,
    /// every entry's text and arguments): the basis of token estimates.
    pub fn approx_chars(&self) -> u64 {
        let tools: usize = self.tools.iter().map(|t| t.chars).sum();
        let entries: usize = self.transcript.iter().map(|e| entry_chars(e)).sum();
        (self.instructions.len() + tools + entries) as u64
    }
}

/// Characters one transcript entry sends to a model.
pub fn entry_chars(entry: &TranscriptEntry) -> usize {
    match entry {
        TranscriptEntry::User { text, .. } => text.len(),
        TranscriptEntry::Assistant {
            text, tool_calls, ..
        } => {
            text.len()
                + tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.to_string().len())
                    .sum::<usize>()
        }
        TranscriptEntry::ToolResult { call } => {
            call.result.as_ref().map_or(0, |r| r.to_string().len())
        }
        TranscriptEntry::Compaction { summary, .. } => summary.len(),
        TranscriptEntry::SkillActivated { name, body, .. } => {
            crate::model::activation_text(name, body).len()
        }
        TranscriptEntry::ModelChanged { .. }
        | TranscriptEntry::ToolRuleSet { .. }
        | TranscriptEntry::Error { .. } => 0,
    }
}

/// What a request is for: a step of the turn, or a summary of the older
/// transcript (context compaction), which offers no tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestPurpose {
    /// A step of the turn loop.
    #[default]
    Step,
    /// Summarise the transcript it carries.
    Compaction,
}

pub use crate::model::FinishReason;

/// One event of a provider stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEvent {
    /// A fragment of assistant text.
    TextDelta(String),
    /// A complete tool call with parsed arguments.
    ToolCall {
        /// Tool name.
        name: String,
        /// Arguments (JSON).
        arguments: Value,
    },
    /// Token usage of this request (may arrive more than once; amounts add).
    /// Its `provider_requests` counts requests made *besides* this stream's
    /// own (a retrying provider reports its failed attempts this way, with
    /// whatever tokens they reported), so a provider's own report of a
    /// request has 0 there.
    Usage(Usage),
    /// The stream finished normally.
    Done(FinishReason),
}

/// Provider failures. Which of them are retried is the runtime's policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Credentials refused.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Too many requests.
    #[error("rate limited: {message}")]
    RateLimited {
        /// Server-requested wait.
        retry_after: Option<Duration>,
        /// Detail.
        message: String,
    },
    /// The connection failed or broke.
    #[error("transport error: {0}")]
    Transport(String),
    /// The server answered with an error status.
    #[error("server error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Server-requested wait (`retry-after` on a 503, a 529…).
        retry_after: Option<Duration>,
        /// Body excerpt.
        message: String,
    },
    /// The response could not be understood.
    #[error("bad response: {0}")]
    BadResponse(String),
    /// The request does not fit the model's context.
    #[error("context overflow: {message}")]
    ContextOverflow {
        /// What the provider said.
        message: String,
        /// Tokens of the request, when the provider said.
        tokens: Option<u64>,
        /// Tokens the model's context allows, when the provider said.
        limit: Option<u64>,
    },
    /// A scripted scenario has no step left for this request.
    #[error("scenario exhausted: {0}")]
    ScenarioExhausted(String),
    /// The request names a model route nothing serves.
    #[error("{0}")]
    UnknownRoute(String),
}

impl ProviderError {
    /// Whether the error is worth retrying before any output.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. } | Self::Transport(_) | Self::Server { .. }
        )
    }

    /// How long the server asked to wait before a retry, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Server { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// A context overflow with only the provider's words.
    pub fn overflow(message: impl Into<String>) -> Self {
        Self::ContextOverflow {
            message: message.into(),
            tokens: None,
            limit: None,
        }
    }

    /// A short, stable name of the kind of failure (`transport`,
    /// `context_overflow`, …), for metrics and the session's error entries.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Auth(_) => "auth",
            Self::RateLimited { .. } => "rate_limited",
            Self::Transport(_) => "transport",
            Self::Server { .. } => "server",
            Self::BadResponse(_) => "bad_response",
            Self::ContextOverflow { .. } => "context_overflow",
            Self::ScenarioExhausted(_) => "scenario_exhausted",
            Self::UnknownRoute(_) => "unknown_route",
        }
    }
}

/// The stream a provider returns.
pub type ProviderStream = BoxStream<'static, Result<ProviderEvent, ProviderError>>;

/// An LLM provider. Implementations must be cheap to share (`Arc<dyn Provider>`).
///
/// The returned stream is driven by a task outside the session's mailbox, so it
/// may take as long as the model takes; dropping it must cancel the request.
#[async_trait::async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Starts one inference.
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError>;

    /// The context window, in tokens, of a model route, if known: sessions
    /// compact their transcript before a request would outgrow it.
    fn context_window(&self, _model: &str) -> Option<u64> {
        None
    }

    /// What serves model route `model`, as a session records it in its
    /// configuration (`EffectiveConfig::route`): the edge's description of
    /// the route (provider, endpoint, model id; never a secret), or `None`
    /// when this provider does not describe its routes.
    fn describe_route(&self, _model: &str) -> Option<Value> {
        None
    }
}
