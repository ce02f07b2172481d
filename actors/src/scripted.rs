//! The `scripted` provider: plays a scenario, one step per request.
//!
//! It is the embedded default, so overseer runs with no network and no key,
//! for the demo, the tests and the benchmarks. It lives in this crate because
//! it touches neither network nor disk: the caller parses the scenario file
//! (see `overseer::scenario`) and hands it over.
//!
//! A request's step is chosen by counting the assistant entries already in the
//! session's transcript, so the player is stateless: a re-issued request after
//! a crash plays the same step again, and thousands of sessions can share one
//! scenario. When an agent's steps run out, the request fails loudly with
//! [`ProviderError::ScenarioExhausted`] instead of repeating or inventing text.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{TranscriptEntry, Usage};
use crate::provider::{
    FinishReason, Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
    RequestPurpose,
};

/// A scenario: for each agent, its steps in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Optional name, used in error messages.
    #[serde(default)]
    pub name: Option<String>,
    /// Optional human description.
    #[serde(default)]
    pub description: Option<String>,
    /// Agent name → steps.
    pub agents: BTreeMap<String, Vec<ScriptedStep>>,
    /// The context window the "model" advertises, in tokens (sessions then
    /// compact before a request would outgrow it).
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The context the "model" really has: a request estimated at more
    /// tokens (4 characters each) fails with a context overflow, whatever is
    /// advertised. For tests of overflow recovery.
    #[serde(default)]
    pub context_limit: Option<u64>,
}

/// One scripted step: what the model "says" in one inference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedStep {
    /// Text to stream (split into word deltas). Templates: `{{user}}`,
    /// `{{user_number}}`, `{{tool_result}}`.
    #[serde(default)]
    pub text: String,
    /// Tool calls to propose, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Usage to report; defaults to zero tokens.
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
    /// Make this step fail instead, with this message (a provider
    /// `bad_response` error), after streaming `text` if any.
    #[serde(default)]
    pub error: Option<String>,
    /// The finish reason to report (default: `stop`, or `tool_calls` when
    /// the step calls tools); `length` plays an answer cut at the limit.
    #[serde(default)]
    pub finish: Option<FinishReason>,
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// Tool name.
    pub name: String,
    /// Arguments; string values are templated, and a value that is exactly
    /// `"{{user_number}}"` becomes a JSON number.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

/// Token usage of a scripted step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Why a scenario is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// Not valid scenario JSON.
    #[error("invalid scenario: {0}")]
    Parse(String),
    /// An agent has no steps.
    #[error("scenario agent '{0}' has no steps")]
    Empty(String),
}

impl Scenario {
    /// Parses and checks a scenario document.
    pub fn from_json(text: &str) -> Result<Self, ScenarioError> {
        let scenario: Scenario =
            serde_json::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        if let Some((name, _)) = scenario.agents.iter().find(|(_, s)| s.is_empty()) {
            return Err(ScenarioError::Empty(name.clone()));
        }
        Ok(scenario)
    }
}

/// The provider that plays a [`Scenario`].
#[derive(Debug, Clone)]
pub struct ScriptedProvider {
    scenario: Scenario,
}

impl ScriptedProvider {
    /// A provider playing `scenario`.
    pub fn new(scenario: Scenario) -> Self {
        Self { scenario }
    }

    /// The steps of one request as events (the pure part, used by `stream`).
    pub fn events_for(
        &self,
        request: &ProviderRequest,
    ) -> Result<Vec<Result<ProviderEvent, ProviderError>>, ProviderError> {
        let name = self.scenario.name.as_deref().unwrap_or("scenario");
        if let Some(limit) = self.scenario.context_limit {
            let tokens = request_chars(request) / 4;
            if tokens > limit {
                return Err(ProviderError::ContextOverflow {
                    message: format!(
                        "this request has about {tokens} tokens, over the model's {limit}"
                    ),
                    tokens: Some(tokens),
                    limit: Some(limit),
                });
            }
        }
        if request.purpose == RequestPurpose::Compaction {
            return Ok(summary_events(request));
        }
        let steps = self.scenario.agents.get(&request.agent).ok_or_else(|| {
            ProviderError::ScenarioExhausted(format!(
                "{name} has no steps for agent '{}'",
                request.agent
            ))
        })?;
        // The step is the number of answers so far, those a summary stands
        // for included.
        let index: u64 = request
            .transcript
            .iter()
            .map(|e| match e.as_ref() {
                TranscriptEntry::Assistant { .. } => 1,
                TranscriptEntry::Compaction {
                    assistant_entries, ..
                } => *assistant_entries,
                _ => 0,
            })
            .sum();
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        let step = steps.get(index).ok_or_else(|| {
            ProviderError::ScenarioExhausted(format!(
                "{name} has {} step(s) for agent '{}' and this is request {} of the session",
                steps.len(),
                request.agent,
                index.saturating_add(1)
            ))
        })?;
        let vars = Vars::from_transcript(request);
        let mut events = Vec::new();
        let text = vars.render(&step.text);
        for word in split_keep_whitespace(&text) {
            events.push(Ok(ProviderEvent::TextDelta(word.to_owned())));
        }
        if let Some(message) = &step.error {
            events.push(Err(ProviderError::BadResponse(message.clone())));
            return Ok(events);
        }
        for call in &step.tool_calls {
            events.push(Ok(ProviderEvent::ToolCall {
                name: call.name.clone(),
                arguments: vars.render_value(&call.arguments),
            }));
        }
        let usage = step.usage.unwrap_or_default();
        events.push(Ok(ProviderEvent::Usage(Usage {
            provider_requests: 0,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            tool_calls: 0,
        })));
        events.push(Ok(ProviderEvent::Done(step.finish.unwrap_or(
            if step.tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            },
        ))));
        Ok(events)
    }
}

/// Characters of what a request sends: instructions and every entry (tool
/// declarations are left out, so the limit is about the conversation).
fn request_chars(request: &ProviderRequest) -> u64 {
    let entries: usize = request
        .transcript
        .iter()
        .map(|e| crate::provider::entry_chars(e))
        .sum();
    (request.instructions.len() + entries) as u64
}

/// The scripted "model"'s summary of a compaction request: deterministic,
/// naming what it covers, so tests can recognise it downstream.
fn summary_events(request: &ProviderRequest) -> Vec<Result<ProviderEvent, ProviderError>> {
    let users: Vec<&str> = request
        .transcript
        .iter()
        .filter_map(|e| match e.as_ref() {
            TranscriptEntry::User { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let text = format!(
        "The user asked {} thing(s), the first: {:?}.",
        users.len(),
        users
            .first()
            .map(|t| t.chars().take(40).collect::<String>())
            .unwrap_or_default()
    );
    vec![
        Ok(ProviderEvent::TextDelta(text)),
        Ok(ProviderEvent::Done(FinishReason::Stop)),
    ]
}

#[async_trait::async_trait]
impl Provider for ScriptedProvider {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let events = self.events_for(&request)?;
        Ok(futures::stream::iter(events).boxed())
    }

    fn context_window(&self, _model: &str) -> Option<u64> {
        self.scenario.context_window
    }
}

/// Template variables taken from the transcript.
struct Vars {
    user: String,
    user_number: Option<i64>,
    tool_result: String,
}

impl Vars {
    fn from_transcript(request: &ProviderRequest) -> Self {
        let mut user = String::new();
        let mut tool_result = String::new();
        for entry in &request.transcript {
            match entry.as_ref() {
                TranscriptEntry::User { text, .. } => user.clone_from(text),
                TranscriptEntry::ToolResult { call } => {
                    tool_result = match &call.result {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => String::new(),
                    };
                }
                TranscriptEntry::Assistant { .. }
                | TranscriptEntry::Compaction { .. }
                | TranscriptEntry::ModelChanged { .. }
                | TranscriptEntry::ToolRuleSet { .. }
                | TranscriptEntry::SkillActivated { .. }
                | TranscriptEntry::Error { .. } => {}
            }
        }
        let user_number = first_integer(&user);
        Self {
            user,
            user_number,
            tool_result,
        }
    }

    fn render(&self, s: &str) -> String {
        if !s.contains("{{") {
            return s.to_owned();
        }
        let number = self.user_number.map(|n| n.to_string()).unwrap_or_default();
        s.replace("{{user}}", &self.user)
            .replace("{{user_number}}", &number)
            .replace("{{tool_result}}", &self.tool_result)
    }

    fn render_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) if s == "{{user_number}}" => match self.user_number {
                Some(n) => Value::from(n),
                None => Value::Null,
            },
            Value::String(s) => Value::String(self.render(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.render_value(x)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.render_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

fn first_integer(s: &str) -> Option<i64> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let digits: String = s[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Splits into words, each carrying its trailing whitespace, so the deltas
/// concatenate back to the exact text.
fn split_keep_whitespace(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_space = false;
    for (i, c) in s.char_indices() {
        if c.is_whitespace() {
            in_space = true;
        } else if in_space {
            out.push(&s[start..i]);
            start = i;
            in_space = false;
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SessionId;
    use serde_json::json;
    use std::sync::Arc;

    fn request(agent: &str, transcript: Vec<TranscriptEntry>) -> ProviderRequest {
        ProviderRequest {
            session_id: SessionId::generate(),
            agent: agent.into(),
            model: "scripted".into(),
            instructions: String::new(),
            transcript: transcript.into_iter().map(Arc::new).collect(),
            tools: vec![],
            output_schema: None,
            purpose: RequestPurpose::Step,
        }
    }

    #[test]
    fn deltas_concatenate_to_the_text() {
        let parts = split_keep_whitespace("Hello,  big world \n");
        assert_eq!(parts.concat(), "Hello,  big world \n");
        assert_eq!(parts.len(), 3);
    }

    #[test]
    fn plays_steps_by_transcript_position_and_fails_when_exhausted() {
        let scenario = Scenario::from_json(
            &json!({"agents": {"a": [
                {"tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}]},
                {"text": "done {{user_number}}"}
            ]}})
            .to_string(),
        )
        .unwrap();
        let p = ScriptedProvider::new(scenario);
        let user = TranscriptEntry::User {
            text: "task 42".into(),
            at_ms: 0,
        };
        let evs = p.events_for(&request("a", vec![user.clone()])).unwrap();
        assert!(evs.iter().any(|e| matches!(e, Ok(ProviderEvent::ToolCall { arguments, .. }) if arguments == &json!({"key": 42}))));
        let assistant = TranscriptEntry::Assistant {
            text: String::new(),
            tool_calls: vec![],
            at_ms: 0,
            finish_reason: None,
        };
        let evs = p
            .events_for(&request("a", vec![user.clone(), assistant.clone()]))
            .unwrap();
        let text: String = evs
            .iter()
            .filter_map(|e| match e {
                Ok(ProviderEvent::TextDelta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "done 42");
        let err = p
            .events_for(&request("a", vec![user, assistant.clone(), assistant]))
            .unwrap_err();
        assert!(matches!(err, ProviderError::ScenarioExhausted(m) if m.contains("2 step(s)")));
    }

    #[test]
    fn rejects_unknown_fields_and_empty_agents() {
        assert!(Scenario::from_json(r#"{"agents": {"a": [{"txt": "x"}]}}"#).is_err());
        assert_eq!(
            Scenario::from_json(r#"{"agents": {"a": []}}"#),
            Err(ScenarioError::Empty("a".into()))
        );
    }
}
