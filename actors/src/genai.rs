//! GenAI spans and metrics of a session, in the OpenTelemetry GenAI semantic
//! conventions (the development-status conventions as of semconv 1.37:
//! `invoke_agent {agent}`, `chat {model}`, `execute_tool {tool}` and the
//! `gen_ai.*` attributes; issue 30).
//!
//! This module owns *which* spans a session opens and closes, their fields
//! and their parents, as plain `tracing` spans of target [`TARGET`] at INFO,
//! and the `gen_ai.client.*` histograms (through the `metrics` facade, so
//! they are on `/metrics`). It deliberately owns no exporter, no sampling and
//! no OpenTelemetry type: the `overseer` crate installs a [`TraceBridge`]
//! that turns `traceparent` strings into span parents and links. Without a
//! bridge (telemetry off) a session holds no span state at all
//! ([`SessionSpans`] stays empty) and each hook returns after one load.
//!
//! Spans follow the session's checkpointed state rather than its inputs:
//! after each transition the open turn, approvals and tool calls are compared
//! with the header, so a turn resumed from a checkpoint (restart, hibernation,
//! failover) opens its spans again, in the trace recorded in
//! [`SessionHeader::trace`], linked to the interrupted turn span.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use metrics::histogram;
use tracing::field::Empty;
use tracing::Span;

use crate::model::{
    CallState, Decision, SessionHeader, SessionStatus, ToolCallId, TraceLink, TranscriptEntry,
};
use crate::provider::{ProviderError, ProviderEvent, ProviderRequest, RequestPurpose};

/// The `tracing` target of every GenAI span and event: the telemetry layer
/// exports this target only.
pub const TARGET: &str = "genai";

/// `gen_ai.client.token.usage`: tokens per provider request, by
/// `gen_ai.token.type` (input, output).
pub const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
/// `gen_ai.client.operation.duration`: seconds per provider request.
pub const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";

/// What the telemetry of the `overseer` crate provides: W3C trace contexts
/// in and out of spans, and whether message contents are recorded.
pub trait TraceBridge: Send + Sync + 'static {
    /// Makes `traceparent` the parent of `span` (before it is first used).
    fn set_parent(&self, span: &Span, traceparent: &str);
    /// Links `span` to the span of `traceparent`.
    fn add_link(&self, span: &Span, traceparent: &str);
    /// The `traceparent` of `span`, if it is exported at all.
    fn traceparent(&self, span: &Span) -> Option<String>;
    /// Whether prompts, answers, tool arguments and results are recorded
    /// (`capture_content`; off by default, as the conventions advise).
    fn capture_content(&self) -> bool;
}

static BRIDGE: OnceLock<Box<dyn TraceBridge>> = OnceLock::new();

/// Installs the process's bridge; false if one is installed already.
pub fn install(bridge: Box<dyn TraceBridge>) -> bool {
    BRIDGE.set(bridge).is_ok()
}

fn bridge() -> Option<&'static dyn TraceBridge> {
    BRIDGE.get().map(|b| b.as_ref())
}

/// The spans a session has open. Empty (one null pointer) while telemetry
/// is off.
#[derive(Default)]
pub struct SessionSpans(Option<Box<Open>>);

#[derive(Default)]
struct Open {
    /// The turn's `invoke_agent` span.
    turn: Option<Span>,
    /// `execute_tool` spans of running calls, and whether the call is a
    /// delegation (whose outcome is recorded here: no tool-call actor runs
    /// it).
    calls: HashMap<ToolCallId, (Span, bool)>,
    /// Approval waits, with when they started (ms since the epoch).
    approvals: HashMap<ToolCallId, (Span, i64)>,
    /// The caller's `traceparent` for the next turn this session starts.
    next_parent: Option<String>,
}

fn in_turn(status: SessionStatus) -> bool {
    matches!(
        status,
        SessionStatus::Running | SessionStatus::AwaitingApproval
    )
}

impl SessionSpans {
    fn open(&mut self) -> Option<(&mut Open, &'static dyn TraceBridge)> {
        let bridge = bridge()?;
        Some((self.0.get_or_insert_with(Box::default), bridge))
    }

    /// The turn span, to parent spans opened elsewhere (a disabled span when
    /// there is none).
    pub fn turn(&self) -> Span {
        self.0
            .as_ref()
            .and_then(|o| o.turn.clone())
            .unwrap_or_else(Span::none)
    }

    /// A message arrived with the caller's `traceparent`: the turn it
    /// starts (or the next one) is its child.
    pub fn traced(&mut self, traceparent: String) {
        if let Some((open, _)) = self.open() {
            open.next_parent = Some(traceparent);
        }
    }

    /// Brings the open spans in line with `header` after a transition (before
    /// its checkpoint, so the turn's trace context is stored with it).
    pub fn follow(&mut self, header: &mut SessionHeader, now_ms: i64) {
        if bridge().is_none() {
            return;
        }
        let Some((open, bridge)) = self.open() else {
            return;
        };
        let turning = in_turn(header.status);
        if turning && open.turn.is_none() {
            let link = header.trace.get_or_insert_with(TraceLink::default);
            if let Some(parent) = open.next_parent.take() {
                link.parent = Some(parent);
            }
            let span = tracing::info_span!(
                target: TARGET,
                parent: None,
                "invoke_agent",
                otel.name = %format_args!("invoke_agent {}", header.agent),
                otel.kind = "internal",
                gen_ai.operation.name = "invoke_agent",
                gen_ai.agent.name = %header.agent,
                gen_ai.conversation.id = %header.id,
                overseer.turn = header.turn,
                overseer.root_session_id = %header.root_id,
                overseer.resumed = link.turn.is_some(),
                overseer.status = Empty,
                gen_ai.usage.input_tokens = Empty,
                gen_ai.usage.output_tokens = Empty,
            );
            // A resumed turn stays in its trace: under the caller's span if
            // it had one, else under the interrupted turn span (which no
            // longer exists anywhere), and linked to that span.
            if let Some(parent) = link.parent.as_ref().or(link.turn.as_ref()) {
                bridge.set_parent(&span, parent);
            }
            if let Some(interrupted) = &link.turn {
                bridge.add_link(&span, interrupted);
            }
            link.turn = bridge.traceparent(&span);
            open.turn = Some(span);
        }
        // Approval waits: opened when a call waits, closed with its decision.
        if let Some(turn) = &open.turn {
            for call in &header.open_calls {
                if call.state == CallState::AwaitingApproval
                    && !open.approvals.contains_key(&call.id)
                {
                    let span = tracing::info_span!(
                        target: TARGET,
                        parent: turn,
                        "approval",
                        otel.name = %format_args!("approval {}", call.name),
                        gen_ai.tool.name = %call.name,
                        gen_ai.tool.call.id = %call.id,
                        overseer.approval.decision = Empty,
                        overseer.approval.decided_by = Empty,
                        overseer.approval.reason = Empty,
                        overseer.approval.wait_ms = Empty,
                    );
                    open.approvals.insert(call.id.clone(), (span, now_ms));
                }
            }
        }
        open.approvals.retain(|id, (span, since)| {
            let call = header.open_calls.iter().find(|c| &c.id == id);
            if call.is_some_and(|c| c.state == CallState::AwaitingApproval) {
                return true;
            }
            let decision = call.and_then(|c| c.decision.as_ref());
            let (what, reason) = match decision.map(|d| &d.decision) {
                Some(Decision::Approve { override_args, .. }) if override_args.is_some() => {
                    ("approved_with_changes", None)
                }
                Some(Decision::Approve { .. }) => ("approved", None),
                Some(Decision::Deny { message }) => ("denied", message.as_deref()),
                None => ("abandoned", None),
            };
            span.record("overseer.approval.decision", what);
            if let Some(by) = decision.and_then(|d| d.by.as_deref()) {
                span.record("overseer.approval.decided_by", by);
            }
            if let Some(reason) = reason {
                span.record("overseer.approval.reason", reason);
            }
            let at = decision.map_or(now_ms, |d| d.at_ms);
            span.record(
                "overseer.approval.wait_ms",
                at.saturating_sub(*since).max(0),
            );
            false
        });
        // Tool spans end with their call (the tool-call actor holds its own
        // handle while the tool runs).
        open.calls.retain(|id, (span, delegation)| {
            let call = header.open_calls.iter().find(|c| &c.id == id);
            let outcome = match call {
                Some(c) if !c.state.is_terminal() => return true,
                Some(c) => match c.state {
                    CallState::Completed => "completed",
                    CallState::Denied => "denied",
                    CallState::Cancelled => "cancelled",
                    _ => "failed",
                },
                // The step moved on: its calls joined the transcript.
                None if header.status == SessionStatus::Cancelled => "cancelled",
                None => "completed",
            };
            // A tool-call actor records its own outcome (`tool_finished`).
            if *delegation || call.is_some_and(|c| c.state != CallState::Completed) {
                span.record("overseer.tool.outcome", outcome);
                if outcome == "failed" {
                    span.record("otel.status_code", "ERROR");
                }
            }
            false
        });
        if !turning {
            if let Some(span) = open.turn.take() {
                tracing::info!(
                    target: TARGET,
                    parent: &span,
                    session_id = %header.id,
                    status = header.status.as_str(),
                    "turn ended"
                );
                span.record("overseer.status", header.status.as_str());
                span.record("gen_ai.usage.input_tokens", header.usage.input_tokens);
                span.record("gen_ai.usage.output_tokens", header.usage.output_tokens);
                if header.status == SessionStatus::Failed {
                    span.record("otel.status_code", "ERROR");
                }
                open.approvals.clear();
                open.calls.clear();
                if let Some(link) = &mut header.trace {
                    link.turn = None;
                    // A root's next turn is a trace of its own unless its
                    // caller says otherwise; a child's stays under its
                    // parent's `delegate_task` span.
                    if header.parent.is_none() {
                        link.parent = None;
                    }
                    if link.parent.is_none() {
                        header.trace = None;
                    }
                }
            }
        }
    }

    /// The `execute_tool` span of a call about to run, for its tool-call
    /// actor to run the tool in (a disabled span when telemetry is off).
    pub fn tool(
        &mut self,
        call_id: &ToolCallId,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Span {
        let Some((open, bridge)) = self.open() else {
            return Span::none();
        };
        let Some(turn) = &open.turn else {
            return Span::none();
        };
        let span = tracing::info_span!(
            target: TARGET,
            parent: turn,
            "execute_tool",
            otel.name = %format_args!("execute_tool {name}"),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %name,
            gen_ai.tool.call.id = %call_id,
            gen_ai.tool.type = "function",
            gen_ai.tool.call.arguments = Empty,
            gen_ai.tool.call.result = Empty,
            overseer.tool.outcome = Empty,
            otel.status_code = Empty,
        );
        if bridge.capture_content() {
            span.record("gen_ai.tool.call.arguments", arguments.to_string());
        }
        open.calls.insert(call_id.clone(), (span.clone(), false));
        span
    }

    /// Opens the `execute_tool delegate_task` span of a delegation (if not
    /// open) and returns the `traceparent` the child's turns run under.
    pub fn delegation(&mut self, call_id: &ToolCallId, child_agent: &str) -> Option<String> {
        let (open, bridge) = self.open()?;
        if !open.calls.contains_key(call_id) {
            let turn = open.turn.as_ref()?;
            let span = tracing::info_span!(
                target: TARGET,
                parent: turn,
                "execute_tool",
                otel.name = %format_args!("execute_tool {}", crate::delegation::DELEGATE_TASK),
                gen_ai.operation.name = "execute_tool",
                gen_ai.tool.name = crate::delegation::DELEGATE_TASK,
                gen_ai.tool.call.id = %call_id,
                gen_ai.tool.type = "function",
                overseer.child_agent = %child_agent,
                overseer.tool.outcome = Empty,
                otel.status_code = Empty,
            );
            open.calls.insert(call_id.clone(), (span, true));
        }
        bridge.traceparent(&open.calls.get(call_id)?.0)
    }

    /// The `chat` span (and meter) of a provider request about to stream.
    /// A compaction's request runs under a `compaction` span of its own.
    pub fn chat(&self, request: &ProviderRequest, route: Option<&serde_json::Value>) -> Chat {
        let field = |key: &str| route.and_then(|r| r.get(key)).and_then(|v| v.as_str());
        let provider = field("provider").unwrap_or("unknown").to_owned();
        let model = field("model").unwrap_or(&request.model).to_owned();
        let mut chat = Chat {
            span: Span::none(),
            compaction: None,
            provider,
            model,
            started: Instant::now(),
            input: 0,
            output: 0,
            text: None,
        };
        let turn = self.0.as_ref().and_then(|o| o.turn.as_ref());
        let (Some(turn), Some(bridge)) = (turn, bridge()) else {
            return chat;
        };
        let compaction = request.purpose == RequestPurpose::Compaction;
        if compaction {
            chat.compaction = Some(tracing::info_span!(
                target: TARGET,
                parent: turn,
                "compaction",
                overseer.entries = request.transcript.len(),
            ));
        }
        let parent = chat.compaction.as_ref().unwrap_or(turn);
        let span = tracing::info_span!(
            target: TARGET,
            parent: parent,
            "chat",
            otel.name = %format_args!("chat {}", chat.model),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %chat.provider,
            gen_ai.request.model = %chat.model,
            gen_ai.response.model = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.response.finish_reasons = Empty,
            gen_ai.input.messages = Empty,
            gen_ai.output.messages = Empty,
            overseer.purpose = if compaction { "compaction" } else { "step" },
            error.type = Empty,
            otel.status_code = Empty,
        );
        if bridge.capture_content() {
            span.record("gen_ai.input.messages", input_messages(request));
            chat.text = Some(String::new());
        }
        chat.span = span;
        chat
    }
}

fn input_messages(request: &ProviderRequest) -> String {
    let messages: Vec<serde_json::Value> = std::iter::once(serde_json::json!({
        "role": "system",
        "parts": [{"type": "text", "content": request.instructions}],
    }))
    .chain(request.transcript.iter().map(|e| match e.as_ref() {
        TranscriptEntry::User { text, .. } => serde_json::json!({
            "role": "user", "parts": [{"type": "text", "content": text}],
        }),
        other => serde_json::json!({
            "role": "assistant", "parts": [{"type": "json", "content": other}],
        }),
    }))
    .collect();
    serde_json::Value::from(messages).to_string()
}

/// One provider request: its `chat` span and the GenAI histograms.
pub struct Chat {
    span: Span,
    compaction: Option<Span>,
    provider: String,
    model: String,
    started: Instant,
    input: u64,
    output: u64,
    text: Option<String>,
}

impl Chat {
    /// The span the request runs in (providers send its `traceparent`).
    pub fn span(&self) -> Span {
        self.span.clone()
    }

    /// The stream produced `event`.
    pub fn event(&mut self, event: &ProviderEvent) {
        match event {
            ProviderEvent::Usage(usage) => {
                self.input = self.input.saturating_add(usage.input_tokens);
                self.output = self.output.saturating_add(usage.output_tokens);
            }
            ProviderEvent::TextDelta(delta) => {
                if let Some(text) = &mut self.text {
                    text.push_str(delta);
                }
            }
            ProviderEvent::ToolCall { name, arguments } => {
                if let Some(text) = &mut self.text {
                    text.push_str(&format!("\n[tool call {name} {arguments}]"));
                }
            }
            ProviderEvent::Done(reason) => {
                let reason = serde_json::to_value(reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("{reason:?}"));
                self.span
                    .record("gen_ai.response.finish_reasons", format!("[\"{reason}\"]"));
            }
        }
    }

    /// The request ended with `result`.
    pub fn finish(self, result: &Result<(), ProviderError>) {
        let labels = [
            ("gen_ai.operation.name", "chat".to_owned()),
            ("gen_ai.provider.name", self.provider.clone()),
            ("gen_ai.request.model", self.model.clone()),
        ];
        histogram!(OPERATION_DURATION, &labels).record(self.started.elapsed());
        for (kind, n) in [("input", self.input), ("output", self.output)] {
            let mut labels = labels.to_vec();
            labels.push(("gen_ai.token.type", kind.to_owned()));
            histogram!(TOKEN_USAGE, &labels).record(n as f64);
        }
        if self.span.is_none() {
            return;
        }
        self.span
            .record("gen_ai.response.model", self.model.as_str());
        self.span.record("gen_ai.usage.input_tokens", self.input);
        self.span.record("gen_ai.usage.output_tokens", self.output);
        if let Some(text) = &self.text {
            let messages = serde_json::json!([{
                "role": "assistant", "parts": [{"type": "text", "content": text}],
            }]);
            self.span
                .record("gen_ai.output.messages", messages.to_string());
        }
        if let Err(e) = result {
            self.span.record("error.type", e.kind());
            self.span.record("otel.status_code", "ERROR");
        }
        drop(self.compaction);
    }
}

/// Records a tool's result on its `execute_tool` span (the result itself
/// only with `capture_content`).
pub fn tool_finished(span: &Span, result: &Result<serde_json::Value, serde_json::Value>) {
    if span.is_none() {
        return;
    }
    if bridge().is_some_and(|b| b.capture_content()) {
        let value = match result {
            Ok(v) | Err(v) => v,
        };
        span.record("gen_ai.tool.call.result", value.to_string());
    }
    span.record(
        "overseer.tool.outcome",
        if result.is_ok() {
            "completed"
        } else {
            "failed"
        },
    );
    if result.is_err() {
        span.record("otel.status_code", "ERROR");
    }
}
