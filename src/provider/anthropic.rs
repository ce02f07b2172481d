//! The `anthropic` provider: the Messages API, streamed, with tool use.
//!
//! This module owns the Messages wire format: how a transcript becomes
//! `system` plus alternating messages of content blocks (`text`, `tool_use`,
//! and the `tool_result` blocks of one step gathered into one user message),
//! and how the event stream (`message_start`, `content_block_start/delta/
//! stop`, `message_delta`, `message_stop`, `ping`, `error`) becomes provider
//! events. Structured output is a forced tool ([`ANSWER_TOOL`]): its input
//! comes back as the answer's text, never as a tool call. Its wire types stay on this side of the boundary. It deliberately
//! does not retry: that is [`super::retry`]'s job.

use std::collections::BTreeMap;

use eventsource_stream::Event;
use overseer_actors::model::{CallState, TranscriptEntry, Usage};
use overseer_actors::provider::{
    FinishReason, Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sse::{self, ended_without_finish, Decoder};
use super::{
    excerpt, key_header, result_text, stream_error, Endpoint, ProviderConfigError, ProviderKind,
    DEFAULT_ANTHROPIC_MAX_TOKENS,
};

/// The API version this adapter speaks (its event and block shapes).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A provider speaking Anthropic's Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    endpoint: Endpoint,
    client: reqwest::Client,
}

impl AnthropicProvider {
    /// A provider for `endpoint` (`base_url` is the part before `/v1/messages`).
    pub fn new(endpoint: Endpoint) -> Result<Self, ProviderConfigError> {
        let client = endpoint.client(ProviderKind::Anthropic)?;
        Ok(Self { endpoint, client })
    }

    /// The JSON body sent for `request` (public so its shape can be shown
    /// and checked without a server).
    pub fn request_body(&self, request: &ProviderRequest) -> Value {
        let answer = AnswerTool::for_request(request);
        serde_json::to_value(wire_request(&self.endpoint, request, answer.as_ref()))
            .unwrap_or(Value::Null)
    }
}

#[async_trait::async_trait]
impl Provider for AnthropicProvider {
    fn context_window(&self, _model: &str) -> Option<u64> {
        // One provider serves one route: the window is its model's.
        self.endpoint.effective_context_window()
    }

    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let answer = AnswerTool::for_request(&request);
        let body = wire_request(&self.endpoint, &request, answer.as_ref());
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        key_header(
            &mut headers,
            HeaderName::from_static("x-api-key"),
            &self.endpoint.keys,
            str::to_owned,
        )?;
        let response = self
            .endpoint
            .post(&self.client, "/v1/messages", headers, &body)
            .await?;
        Ok(sse::decode(
            response,
            self.endpoint.idle_timeout,
            EventDecoder {
                answer,
                ..EventDecoder::default()
            },
        ))
    }
}

// ---- request ----------------------------------------------------------------

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    /// Forces the answer tool (structured output).
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice<'a>>,
    stream: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToolChoice<'a> {
    /// Some tool must be used: a real one, or the answer tool.
    Any,
    /// This tool must be used.
    Tool { name: &'a str },
}

/// Structured output over the Messages API, which has no native mode of its
/// own: a synthetic tool whose input schema is the output schema, which the
/// model is made to call; its input is the answer. A schema that is not an
/// object (the API wants an object) is wrapped as `{"value": schema}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AnswerTool {
    /// The tool's name: [`ANSWER_TOOL`], suffixed if a real tool has it.
    pub(crate) name: String,
    /// The schema sent as its `input_schema`.
    input_schema: Value,
    /// Whether the answer is the input's `value`.
    wrapped: bool,
}

/// The name of the answer tool, unless a real tool already has it.
pub const ANSWER_TOOL: &str = "final_answer";

const ANSWER_DESCRIPTION: &str = "Give your final answer. Its input is the answer itself, \
     which must match this schema. Use it once you are done, instead of replying in text.";

impl AnswerTool {
    fn for_request(request: &ProviderRequest) -> Option<Self> {
        let schema = request.output_schema.as_ref()?;
        let taken = |name: &str| request.tools.iter().any(|t| t.name() == name);
        let mut name = ANSWER_TOOL.to_owned();
        let mut n = 2;
        while taken(&name) {
            name = format!("{ANSWER_TOOL}_{n}");
            n += 1;
        }
        let is_object = schema.get("type").and_then(Value::as_str) == Some("object");
        let (input_schema, wrapped) = if is_object {
            (schema.clone(), false)
        } else {
            (
                serde_json::json!({
                    "type": "object",
                    "properties": { "value": schema },
                    "required": ["value"],
                }),
                true,
            )
        };
        Some(Self {
            name,
            input_schema,
            wrapped,
        })
    }
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    /// A text made here (an activated skill's instructions).
    #[serde(rename = "text")]
    OwnedText {
        text: String,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

fn wire_request<'a>(
    endpoint: &'a Endpoint,
    request: &'a ProviderRequest,
    answer: Option<&'a AnswerTool>,
) -> MessagesRequest<'a> {
    let mut messages: Vec<WireMessage<'a>> = Vec::with_capacity(request.transcript.len());
    for entry in &request.transcript {
        let (role, blocks) = match entry.as_ref() {
            TranscriptEntry::User { text, .. } => ("user", text_block(text)),
            TranscriptEntry::Assistant {
                text, tool_calls, ..
            } => {
                let mut blocks = text_block(text);
                blocks.extend(tool_calls.iter().map(|c| Block::ToolUse {
                    id: c.id.as_str(),
                    name: &c.name,
                    input: tool_input(&c.arguments),
                }));
                ("assistant", blocks)
            }
            TranscriptEntry::ToolResult { call } => (
                "user",
                vec![Block::ToolResult {
                    tool_use_id: call.id.as_str(),
                    content: result_text(call.result.as_ref()),
                    is_error: call.state == CallState::Failed,
                }],
            ),
            // A summary of the compacted older transcript reads as context
            // the user gives.
            TranscriptEntry::Compaction { summary, .. } => ("user", text_block(summary)),
            // An activated skill's instructions read as context the user
            // gives.
            TranscriptEntry::SkillActivated { name, body, .. } => (
                "user",
                vec![Block::OwnedText {
                    text: overseer_actors::skills::activation_text(name, body),
                }],
            ),
            // Notes for people: the model is simply served by the new route,
            // and never told of failures it did not say.
            TranscriptEntry::ModelChanged { .. }
            | TranscriptEntry::ToolRuleSet { .. }
            | TranscriptEntry::Error { .. } => continue,
        };
        // The API rejects empty messages and wants roles to alternate: the
        // results of one step become one user message, and a user message
        // queued right after them joins it (results first, as required).
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => messages.push(WireMessage {
                role,
                content: blocks,
            }),
        }
    }
    MessagesRequest {
        model: &endpoint.model,
        max_tokens: endpoint.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
        system: (!request.instructions.is_empty()).then_some(request.instructions.as_str()),
        messages,
        tools: request
            .tools
            .iter()
            .map(|t| WireTool {
                name: t.name(),
                description: t.description(),
                input_schema: t.parameters(),
            })
            .chain(answer.map(|a| WireTool {
                name: &a.name,
                description: ANSWER_DESCRIPTION,
                input_schema: &a.input_schema,
            }))
            .collect(),
        tool_choice: answer.map(|a| {
            if request.tools.is_empty() {
                ToolChoice::Tool { name: &a.name }
            } else {
                // The model may still use its tools before it answers.
                ToolChoice::Any
            }
        }),
        stream: true,
    }
}

/// A text block, or none for empty text (which the API refuses).
fn text_block(text: &str) -> Vec<Block<'_>> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![Block::Text { text }]
    }
}

/// `tool_use.input` must be an object; a model that proposed anything else
/// (and was refused by schema validation) is replayed with it wrapped.
fn tool_input(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        other => serde_json::json!({ "arguments": other }),
    }
}

// ---- response stream --------------------------------------------------------

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: StartBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDeltaBody,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    /// Event types added after this adapter was written are skipped, as the
    /// API's versioning policy asks of clients.
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    /// Its `id` is not read: the runtime assigns its own call ids (they are
    /// what the next request sends back as `tool_use_id`).
    ToolUse {
        name: String,
        #[serde(default)]
        input: Value,
    },
    /// Thinking, server tools and later block types: not part of the answer.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct MessageDeltaBody {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Usage as the stream reports it: `message_start` has the input side,
/// `message_delta` cumulative totals (always the output, lately the input
/// too). Each field present replaces the previous figure.
#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    fn merge(&mut self, other: WireUsage) {
        self.input_tokens = other.input_tokens.or(self.input_tokens);
        self.cache_creation_input_tokens = other
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens = other
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.output_tokens = other.output_tokens.or(self.output_tokens);
    }

    fn to_usage(&self) -> Usage {
        // Cached prompt tokens are prompt tokens too: the budget counts them.
        let input = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ]
        .iter()
        .flatten()
        .fold(0u64, |a, b| a.saturating_add(*b));
        Usage {
            provider_requests: 0,
            input_tokens: input,
            output_tokens: self.output_tokens.unwrap_or(0),
            tool_calls: 0,
        }
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    r#type: String,
    #[serde(default)]
    message: String,
}

/// A `tool_use` block being streamed.
struct ToolBlock {
    name: String,
    /// The `input` of `content_block_start` (normally `{}`), used when no
    /// `input_json_delta` follows.
    initial: Value,
    json: String,
    /// A call of the answer tool: its input is the answer text.
    answer: bool,
}

/// Reads the event stream. Text deltas go out as they arrive; a tool call
/// goes out when its block stops; usage and `Done` at `message_stop`. The
/// answer tool's input is the answer: streamed out as text as it arrives
/// (or, wrapped, once its block is complete), never as a tool call.
#[derive(Default)]
struct EventDecoder {
    tools: BTreeMap<usize, ToolBlock>,
    usage: WireUsage,
    /// Usage already handed on: the input side, from `message_start`, so a
    /// stream cut before its end still has its prompt counted as reported.
    reported: Usage,
    stop_reason: Option<String>,
    /// The answer tool of a request with an output schema.
    answer: Option<AnswerTool>,
    /// Whether the model called a tool other than the answer tool.
    called_tools: bool,
    /// A finished tool block whose input did not parse, held until the
    /// stop reason says whether the output was cut short.
    unparsed: Option<ProviderError>,
}

impl Decoder for EventDecoder {
    fn event(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let parsed: StreamEvent = serde_json::from_str(data).map_err(|e| {
            ProviderError::BadResponse(format!(
                "malformed '{}' event ({e}): {}",
                event.event,
                excerpt(data)
            ))
        })?;
        let mut out = Vec::new();
        match parsed {
            StreamEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage.merge(usage);
                    let input = self.usage.to_usage().input_tokens;
                    if input > 0 {
                        self.reported.input_tokens = input;
                        out.push(ProviderEvent::Usage(Usage {
                            input_tokens: input,
                            ..Usage::default()
                        }));
                    }
                }
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                StartBlock::Text { text } => {
                    if !text.is_empty() {
                        out.push(ProviderEvent::TextDelta(text));
                    }
                }
                StartBlock::ToolUse { name, input } => {
                    let answer = self.answer.as_ref().is_some_and(|a| a.name == name);
                    self.tools.insert(
                        index,
                        ToolBlock {
                            name,
                            initial: input,
                            json: String::new(),
                            answer,
                        },
                    );
                }
                StartBlock::Other => {}
            },
            StreamEvent::ContentBlockDelta { index, delta } => match delta {
                BlockDelta::TextDelta { text } => {
                    if !text.is_empty() {
                        out.push(ProviderEvent::TextDelta(text));
                    }
                }
                BlockDelta::InputJsonDelta { partial_json } => {
                    let block = self.tools.get_mut(&index).ok_or_else(|| {
                        ProviderError::BadResponse(format!(
                            "input_json_delta for content block {index}, which is not a tool_use block"
                        ))
                    })?;
                    block.json.push_str(&partial_json);
                    let streams = block.answer && !self.answer.as_ref().is_some_and(|a| a.wrapped);
                    if streams && !partial_json.is_empty() {
                        out.push(ProviderEvent::TextDelta(partial_json));
                    }
                }
                BlockDelta::Other => {}
            },
            StreamEvent::ContentBlockStop { index } => {
                if let Some(block) = self.tools.remove(&index) {
                    match self.block_done(block) {
                        Ok(events) => out.extend(events),
                        // Input that does not parse is an error, unless the
                        // stop reason, still to come, says the output was
                        // cut at the limit.
                        Err(e) if self.unparsed.is_none() => self.unparsed = Some(e),
                        Err(_) => {}
                    }
                }
            }
            StreamEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                if let Some(usage) = usage {
                    self.usage.merge(usage);
                }
            }
            StreamEvent::MessageStop => return self.finish(),
            StreamEvent::Error { error } => {
                return Err(stream_error(&error.r#type, &error.message));
            }
            StreamEvent::Ping | StreamEvent::Unknown => {}
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        // A body cut after the stop reason lost nothing but `message_stop`.
        if self.stop_reason.is_some() {
            self.finish()
        } else if let Some(e) = self.unparsed.take() {
            Err(e)
        } else {
            Err(ended_without_finish())
        }
    }

    fn finished(&self) -> bool {
        self.stop_reason.is_some()
    }
}

impl EventDecoder {
    fn finish(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        let mut out = Vec::new();
        let truncated = matches!(
            self.stop_reason.as_deref(),
            Some("max_tokens" | "model_context_window_exceeded")
        );
        // Blocks never stopped are complete as far as the message goes,
        // unless the output was cut at the limit: then a tool's input may
        // have lost its end, and no call is run anyway.
        for block in std::mem::take(&mut self.tools).into_values() {
            if !truncated {
                out.extend(self.block_done(block)?);
            }
        }
        if let Some(e) = self.unparsed.take() {
            if !truncated {
                return Err(e);
            }
        }
        // What was not handed on yet (usage events add up).
        let total = self.usage.to_usage();
        out.push(ProviderEvent::Usage(Usage {
            input_tokens: total
                .input_tokens
                .saturating_sub(self.reported.input_tokens),
            output_tokens: total
                .output_tokens
                .saturating_sub(self.reported.output_tokens),
            ..Usage::default()
        }));
        out.push(ProviderEvent::Done(match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") => FinishReason::Stop,
            // Only the answer tool was used: the model has answered.
            Some("tool_use") if !self.called_tools && self.answer.is_some() => FinishReason::Stop,
            Some("tool_use") => FinishReason::ToolCalls,
            Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
            Some("refusal") => FinishReason::Refusal,
            _ => FinishReason::Other,
        }));
        Ok(out)
    }

    /// What a finished `tool_use` block yields: a tool call, or, for the
    /// answer tool, whatever of the answer text has not gone out yet.
    fn block_done(&mut self, block: ToolBlock) -> Result<Vec<ProviderEvent>, ProviderError> {
        if !block.answer {
            self.called_tools = true;
            return Ok(vec![tool_call(block)?]);
        }
        let wrapped = self.answer.as_ref().is_some_and(|a| a.wrapped);
        let streamed = !block.json.trim().is_empty();
        let text = match (wrapped, streamed) {
            // Streamed as it came.
            (false, true) => return Ok(Vec::new()),
            (false, false) => block.initial.to_string(),
            (true, _) => {
                let input: Value = if streamed {
                    serde_json::from_str(block.json.trim()).map_err(|e| {
                        ProviderError::BadResponse(format!(
                            "the answer is not valid JSON ({e}): {}",
                            excerpt(block.json.trim())
                        ))
                    })?
                } else {
                    block.initial
                };
                // A model that answered without the wrapper is taken at its
                // word; the schema check downstream judges it.
                match input {
                    Value::Object(mut map) if map.contains_key("value") => {
                        map.remove("value").unwrap_or(Value::Null).to_string()
                    }
                    other => other.to_string(),
                }
            }
        };
        Ok(vec![ProviderEvent::TextDelta(text)])
    }
}

fn tool_call(block: ToolBlock) -> Result<ProviderEvent, ProviderError> {
    let text = block.json.trim();
    let arguments = if text.is_empty() {
        match block.initial {
            Value::Object(map) => Value::Object(map),
            _ => Value::Object(serde_json::Map::new()),
        }
    } else {
        serde_json::from_str(text).map_err(|e| {
            ProviderError::BadResponse(format!(
                "tool call '{}' has input that is not valid JSON ({e}): {}",
                block.name,
                excerpt(text)
            ))
        })?
    };
    Ok(ProviderEvent::ToolCall {
        name: block.name,
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed(d: &mut EventDecoder, data: Value) -> Result<Vec<ProviderEvent>, ProviderError> {
        d.event(&Event {
            event: data["type"].as_str().unwrap_or("message").into(),
            data: data.to_string(),
            ..Event::default()
        })
    }

    #[test]
    fn a_tool_block_without_deltas_has_empty_input() {
        let mut d = EventDecoder::default();
        feed(
            &mut d,
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}}),
        )
        .unwrap();
        let out = feed(&mut d, json!({"type": "content_block_stop", "index": 0})).unwrap();
        assert_eq!(
            out,
            vec![ProviderEvent::ToolCall {
                name: "now".into(),
                arguments: json!({})
            }]
        );
    }

    #[test]
    fn unknown_events_and_blocks_are_skipped() {
        let mut d = EventDecoder::default();
        let out = feed(
            &mut d,
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        )
        .unwrap();
        assert!(out.is_empty());
        let out = feed(
            &mut d,
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        )
        .unwrap();
        assert!(out.is_empty());
        assert!(feed(&mut d, json!({"type": "brand_new_event", "x": 1}))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn error_events_map_to_error_kinds() {
        let mut d = EventDecoder::default();
        let err = feed(
            &mut d,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )
        .unwrap_err();
        assert!(
            matches!(err, ProviderError::Server { status: 529, .. }),
            "{err:?}"
        );
        let err = feed(
            &mut d,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
        )
        .unwrap_err();
        assert!(
            matches!(err, ProviderError::ContextOverflow { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn cached_prompt_tokens_count_as_input() {
        let mut d = EventDecoder::default();
        let start = feed(
            &mut d,
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1}}}),
        )
        .unwrap();
        // The prompt's side is handed on at once, the rest at the end.
        assert_eq!(
            start,
            vec![ProviderEvent::Usage(Usage {
                input_tokens: 100,
                ..Usage::default()
            })]
        );
        feed(
            &mut d,
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
        )
        .unwrap();
        let out = feed(&mut d, json!({"type": "message_stop"})).unwrap();
        assert_eq!(
            out,
            vec![
                ProviderEvent::Usage(Usage {
                    provider_requests: 0,
                    input_tokens: 0,
                    output_tokens: 7,
                    tool_calls: 0
                }),
                ProviderEvent::Done(FinishReason::Stop)
            ]
        );
    }
}
