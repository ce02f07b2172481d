//! The `openai` provider: any OpenAI-compatible chat-completions
//! endpoint (OpenAI, vLLM, Ollama, llama.cpp's server, LiteLLM), streamed.
//!
//! This module owns the chat-completions wire format: how a transcript
//! becomes `messages` (assistant `tool_calls`, `tool` results by
//! `tool_call_id`), and how the streamed chunks (text deltas, tool-call
//! fragments keyed by `index`, `finish_reason`, the trailing usage chunk,
//! `[DONE]`) become provider events. A request with an output schema asks
//! for native structured output (`response_format` of type `json_schema`);
//! the answer then streams as ordinary text. Its wire types stay on this side of the
//! boundary. It deliberately does not retry: that is [`super::retry`]'s job.

use std::collections::BTreeMap;

use eventsource_stream::Event;
use overseer_actors::model::{TranscriptEntry, Usage};
use overseer_actors::provider::{
    FinishReason, Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use reqwest::header::{HeaderMap, AUTHORIZATION};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sse::{self, ended_without_finish, Decoder};
use super::{
    excerpt, key_header, result_text, stream_error, Endpoint, ProviderConfigError, ProviderKind,
};

/// A provider speaking the OpenAI chat-completions API.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    endpoint: Endpoint,
    client: reqwest::Client,
}

impl OpenAiProvider {
    /// A provider for `endpoint` (`base_url` is the part before
    /// `/chat/completions`).
    pub fn new(endpoint: Endpoint) -> Result<Self, ProviderConfigError> {
        let client = endpoint.client(ProviderKind::Openai)?;
        Ok(Self { endpoint, client })
    }

    /// The JSON body sent for `request` (public so its shape can be shown
    /// and checked without a server).
    pub fn request_body(&self, request: &ProviderRequest) -> Value {
        serde_json::to_value(wire_request(&self.endpoint, request)).unwrap_or(Value::Null)
    }
}

#[async_trait::async_trait]
impl Provider for OpenAiProvider {
    fn context_window(&self, _model: &str) -> Option<u64> {
        // One provider serves one route: the window is its model's.
        self.endpoint.effective_context_window()
    }

    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let body = wire_request(&self.endpoint, &request);
        let mut headers = HeaderMap::new();
        key_header(&mut headers, AUTHORIZATION, &self.endpoint.keys, |key| {
            format!("Bearer {key}")
        })?;
        let response = self
            .endpoint
            .post(&self.client, "/chat/completions", headers, &body)
            .await?;
        Ok(sse::decode(
            response,
            self.endpoint.idle_timeout,
            ChunkDecoder::default(),
        ))
    }
}

// ---- request ----------------------------------------------------------------

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    /// The same cap, under the name OpenAI's own API takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    /// Native structured output (the session's `output_schema`).
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
#[derive(Serialize)]
struct ResponseFormat<'a> {
    r#type: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'static str,
    schema: &'a Value,
    strict: bool,
}

/// The name the answer's schema is given in `response_format`.
pub const RESPONSE_FORMAT_NAME: &str = "answer";

/// Whether OpenAI's strict mode accepts `schema`: an object at the root,
/// and every object in it closed (`additionalProperties: false`) with all
/// its properties required. Strict mode refuses any other schema with a
/// 400, so one that does not qualify is sent with `strict: false` (the model
/// is still steered by it, and the answer is validated here either way).
pub fn strict_compatible(schema: &Value) -> bool {
    fn closed(schema: &Value) -> bool {
        let Some(map) = schema.as_object() else {
            // `true` / `false` schemas.
            return schema.is_boolean();
        };
        let is_object = map.get("type").and_then(Value::as_str) == Some("object")
            || map.contains_key("properties");
        if is_object {
            let properties = map.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if map.get("additionalProperties") != Some(&Value::Bool(false)) {
                return false;
            }
            if properties.is_some_and(|p| p.keys().any(|k| !required.contains(&k.as_str()))) {
                return false;
            }
        }
        let nested = ["properties", "$defs", "definitions"]
            .iter()
            .filter_map(|k| map.get(*k).and_then(Value::as_object))
            .flat_map(|m| m.values())
            .chain(
                ["anyOf", "allOf", "oneOf", "prefixItems"]
                    .iter()
                    .filter_map(|k| map.get(*k).and_then(Value::as_array))
                    .flatten(),
            )
            .chain(map.get("items"));
        nested.into_iter().all(closed)
    }
    schema.get("type").and_then(Value::as_str) == Some("object") && closed(schema)
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum Message<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    /// A user message made here (an activated skill's instructions).
    #[serde(rename = "user")]
    UserOwned {
        content: String,
    },
    Assistant {
        // `null` when the step only called tools, as the API itself answers.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    // The API carries arguments as a JSON document inside a string.
    arguments: String,
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn wire_request<'a>(endpoint: &'a Endpoint, request: &'a ProviderRequest) -> ChatRequest<'a> {
    let mut messages = Vec::with_capacity(request.transcript.len() + 1);
    if !request.instructions.is_empty() {
        messages.push(Message::System {
            content: &request.instructions,
        });
    }
    for entry in &request.transcript {
        messages.push(match entry.as_ref() {
            TranscriptEntry::User { text, .. } => Message::User { content: text },
            // A summary of the compacted older transcript reads as context
            // the user gives.
            TranscriptEntry::Compaction { summary, .. } => Message::User { content: summary },
            // An activated skill's instructions read as context the user
            // gives.
            TranscriptEntry::SkillActivated { name, body, .. } => Message::UserOwned {
                content: overseer_actors::skills::activation_text(name, body),
            },
            // Notes for people: the model is simply served by the new route,
            // and never told of failures it did not say.
            TranscriptEntry::ModelChanged { .. }
            | TranscriptEntry::ToolRuleSet { .. }
            | TranscriptEntry::Error { .. } => continue,
            TranscriptEntry::Assistant {
                text, tool_calls, ..
            } => Message::Assistant {
                content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
                tool_calls: tool_calls
                    .iter()
                    .map(|c| WireCall {
                        id: c.id.as_str(),
                        r#type: "function",
                        function: WireFunction {
                            name: &c.name,
                            arguments: c.arguments.to_string(),
                        },
                    })
                    .collect(),
            },
            TranscriptEntry::ToolResult { call } => Message::Tool {
                tool_call_id: call.id.as_str(),
                content: result_text(call.result.as_ref()),
            },
        });
    }
    ChatRequest {
        model: &endpoint.model,
        messages,
        tools: request
            .tools
            .iter()
            .map(|t| WireTool {
                r#type: "function",
                function: WireToolFunction {
                    name: t.name(),
                    description: t.description(),
                    parameters: t.parameters(),
                },
            })
            .collect(),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        max_tokens: endpoint
            .max_tokens
            .filter(|_| !endpoint.max_completion_tokens),
        max_completion_tokens: endpoint
            .max_tokens
            .filter(|_| endpoint.max_completion_tokens),
        response_format: request.output_schema.as_ref().map(|schema| ResponseFormat {
            r#type: "json_schema",
            json_schema: JsonSchemaFormat {
                name: RESPONSE_FORMAT_NAME,
                schema,
                strict: strict_compatible(schema),
            },
        }),
    }
}

// ---- response stream --------------------------------------------------------

/// One `chat.completion.chunk`. Every field is optional because compatible
/// servers differ in what they omit; only what we use is read.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// Some servers report a failure inside the stream.
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<CallDelta>>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A fragment of the JSON string (a few servers send the object itself).
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// A tool call being assembled from its fragments.
#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Reads the chunk stream. Tool calls are emitted, complete, when the
/// choice finishes; usage and `Done` wait for `[DONE]` (or the end of the
/// body) because the usage chunk comes after the finishing one.
#[derive(Default)]
struct ChunkDecoder {
    calls: BTreeMap<usize, PartialCall>,
    finish: Option<FinishReason>,
    called_tools: bool,
    usage: Option<Usage>,
}

impl Decoder for ChunkDecoder {
    fn event(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return self.end();
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ProviderError::BadResponse(format!("malformed stream chunk ({e}): {}", excerpt(data)))
        })?;
        if let Some(error) = chunk.error {
            return Err(chunk_error(&error));
        }
        if let Some(u) = chunk.usage {
            // Servers that repeat usage send running totals: keep the last.
            self.usage = Some(Usage {
                provider_requests: 0,
                input_tokens: u.prompt_tokens,
                output_tokens: u.completion_tokens,
                tool_calls: 0,
            });
        }
        let mut out = Vec::new();
        // We ask for one choice; a server that sends more gets the first read.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    out.push(ProviderEvent::TextDelta(text));
                }
                for fragment in delta.tool_calls.unwrap_or_default() {
                    self.absorb(fragment);
                }
            }
            if let Some(reason) = choice.finish_reason {
                let finish = finish_reason(&reason);
                self.finish = Some(finish);
                if finish == FinishReason::Length {
                    // Cut at the limit: a call may have lost the end of its
                    // arguments, and none is run anyway.
                    self.calls.clear();
                }
                out.extend(self.flush_calls()?);
            }
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        let Some(mut finish) = self.finish else {
            return Err(ended_without_finish());
        };
        let mut out = self.flush_calls()?;
        // Some compatible servers say `stop` even when they called tools.
        if self.called_tools && finish == FinishReason::Stop {
            finish = FinishReason::ToolCalls;
        }
        if let Some(usage) = self.usage.take() {
            out.push(ProviderEvent::Usage(usage));
        }
        out.push(ProviderEvent::Done(finish));
        Ok(out)
    }

    fn finished(&self) -> bool {
        self.finish.is_some()
    }
}

impl ChunkDecoder {
    fn absorb(&mut self, fragment: CallDelta) {
        let last = self.calls.keys().next_back().copied();
        // Fragments are keyed by `index`; a server that omits it starts a new
        // call with each new id and continues the last call otherwise.
        let index = fragment.index.unwrap_or_else(|| match &fragment.id {
            Some(id) if !self.calls.values().any(|c| c.id.as_ref() == Some(id)) => {
                last.map_or(0, |i| i + 1)
            }
            _ => last.unwrap_or(0),
        });
        let call = self.calls.entry(index).or_default();
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            call.id = Some(id);
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                // The name comes whole in one fragment; a server that repeats
                // it in every fragment must not double it.
                if call.name != name {
                    call.name.push_str(&name);
                }
            }
            match function.arguments {
                Some(Value::String(part)) => call.arguments.push_str(&part),
                Some(Value::Null) | None => {}
                Some(whole) => call.arguments = whole.to_string(),
            }
        }
    }

    fn flush_calls(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        let calls = std::mem::take(&mut self.calls);
        let mut out = Vec::with_capacity(calls.len());
        for (index, call) in calls {
            if call.name.is_empty() {
                return Err(ProviderError::BadResponse(format!(
                    "tool call #{index} has no function name"
                )));
            }
            let text = call.arguments.trim();
            let arguments = if text.is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_json::from_str(text).map_err(|e| {
                    ProviderError::BadResponse(format!(
                        "tool call '{}' has arguments that are not valid JSON ({e}): {}",
                        call.name,
                        excerpt(text)
                    ))
                })?
            };
            self.called_tools = true;
            out.push(ProviderEvent::ToolCall {
                name: call.name,
                arguments,
            });
        }
        Ok(out)
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::Refusal,
        _ => FinishReason::Other,
    }
}

/// An `{"error": …}` chunk: `{"message", "type", "code"}` or a bare string.
fn chunk_error(error: &Value) -> ProviderError {
    if let Some(message) = error.as_str() {
        return stream_error("", message);
    }
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the server reported an error in the stream");
    let kind = ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k))
        .find_map(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .unwrap_or_default();
    stream_error(&kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed(decoder: &mut ChunkDecoder, data: Value) -> Vec<ProviderEvent> {
        decoder
            .event(&Event {
                data: data.to_string(),
                ..Event::default()
            })
            .unwrap()
    }

    #[test]
    fn fragments_without_index_are_assembled_by_id() {
        let mut d = ChunkDecoder::default();
        feed(
            &mut d,
            json!({"choices": [{"delta": {"tool_calls": [{"id": "a", "function": {"name": "x", "arguments": "{\"k\""}}]}}]}),
        );
        feed(
            &mut d,
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ": 1}"}}]}}]}),
        );
        feed(
            &mut d,
            json!({"choices": [{"delta": {"tool_calls": [{"id": "b", "function": {"name": "y", "arguments": {"z": 2}}}]}}]}),
        );
        let out = feed(
            &mut d,
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        );
        assert_eq!(
            out,
            vec![
                ProviderEvent::ToolCall {
                    name: "x".into(),
                    arguments: json!({"k": 1})
                },
                ProviderEvent::ToolCall {
                    name: "y".into(),
                    arguments: json!({"z": 2})
                },
            ]
        );
        // `stop` with tool calls is reported as a tool-call finish.
        assert_eq!(
            d.end().unwrap(),
            vec![ProviderEvent::Done(FinishReason::ToolCalls)]
        );
    }

    #[test]
    fn an_error_chunk_is_a_provider_error() {
        let mut d = ChunkDecoder::default();
        let err = d
            .event(&Event {
                data: json!({"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}})
                    .to_string(),
                ..Event::default()
            })
            .unwrap_err();
        assert!(matches!(err, ProviderError::RateLimited { .. }), "{err:?}");
    }

    #[test]
    fn done_without_a_finish_is_an_error() {
        let mut d = ChunkDecoder::default();
        feed(&mut d, json!({"choices": [{"delta": {"content": "hi"}}]}));
        let err = d
            .event(&Event {
                data: "[DONE]".into(),
                ..Event::default()
            })
            .unwrap_err();
        assert_eq!(err, ended_without_finish());
    }
}
