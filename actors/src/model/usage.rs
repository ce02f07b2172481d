//! Token and request accounting for one session (and, rolled up, a subtree).

use serde::{Deserialize, Serialize};

/// What a session has spent. Accumulates across turns; never decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Provider inference requests issued: every attempt, retried,
    /// interrupted and broken ones included.
    pub provider_requests: u64,
    /// Prompt tokens reported by the provider; for a request cut off before
    /// it reported them (interrupted, broken) after it had streamed output,
    /// the request's estimate.
    pub input_tokens: u64,
    /// Completion tokens reported by the provider; for a request cut off
    /// before it reported them, an estimate of what it streamed.
    pub output_tokens: u64,
    /// Tool calls that were dispatched to a tool.
    pub tool_calls: u64,
}

impl Usage {
    /// Adds `other` into `self`, saturating rather than wrapping: a corrupt
    /// provider figure must not turn a budget check upside down.
    pub fn add(&mut self, other: &Usage) {
        self.provider_requests = self
            .provider_requests
            .saturating_add(other.provider_requests);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
    }

    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}
