//! `[provider]`: which LLM serves the agents (the `[[models]]` routes are
//! `crate::provider::RouteConfig`). It deliberately builds no provider.

use std::path::PathBuf;

use crate::provider::{ProviderKind as RouteKind, RouteConfig};
use serde::Deserialize;

/// `[provider]`: which LLM serves the agents.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Provider kind.
    #[serde(default)]
    pub kind: ProviderKind,
    /// Scenario file of the scripted provider.
    #[serde(default = "default_scenario")]
    pub scenario: PathBuf,
    /// `openai` / `anthropic`: endpoint root (see `RouteConfig::base_url`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// `openai` / `anthropic`: the model id sent to the provider.
    #[serde(default)]
    pub model: Option<String>,
    /// `openai` / `anthropic`: env var holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds to wait for a response to start.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Seconds a stream may stay silent before it is cut.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Most output tokens per request (see `RouteConfig::max_tokens`).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The longest `retry-after` honoured (see
    /// `RouteConfig::max_retry_after_secs`). Default: 60.
    #[serde(default)]
    pub max_retry_after_secs: Option<u64>,
    /// The model's context window, in tokens (see `RouteConfig::context_window`).
    #[serde(default)]
    pub context_window: Option<u64>,
}

impl Default for ProviderSection {
    fn default() -> Self {
        Self {
            kind: ProviderKind::default(),
            scenario: default_scenario(),
            base_url: None,
            model: None,
            api_key_env: None,
            timeout_secs: None,
            idle_timeout_secs: None,
            max_tokens: None,
            max_retry_after_secs: None,
            context_window: None,
        }
    }
}

impl ProviderSection {
    /// The default route every agent without a `[[models]]` route uses.
    pub fn route(&self) -> RouteConfig {
        let kind = match self.kind {
            ProviderKind::Scripted => RouteKind::Scripted,
            ProviderKind::Openai => RouteKind::Openai,
            ProviderKind::Anthropic => RouteKind::Anthropic,
        };
        let mut route = RouteConfig::new(kind, self.model.clone().unwrap_or_default());
        route.base_url.clone_from(&self.base_url);
        route.api_key_env.clone_from(&self.api_key_env);
        if let Some(t) = self.timeout_secs {
            route.timeout_secs = t;
        }
        if let Some(t) = self.idle_timeout_secs {
            route.idle_timeout_secs = t;
        }
        route.max_tokens = self.max_tokens;
        if let Some(secs) = self.max_retry_after_secs {
            route.max_retry_after_secs = secs;
        }
        route.context_window = self.context_window;
        if kind == RouteKind::Scripted {
            route.scenario = Some(self.scenario.clone());
        }
        route
    }
}

/// Provider kinds this binary can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Plays a scenario file; no network, no key.
    #[default]
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

pub(super) fn default_scenario() -> PathBuf {
    PathBuf::from(crate::scenario::DEFAULT_SCENARIO_PATH)
}
pub(super) fn default_model() -> String {
    "scripted".into()
}
