//! How overseer's records read in ACP: stop reasons, tool calls and their
//! states, usage, and a stored transcript replayed as `session/update`s.
//! Pure conversions; sending them is the caller's.
//!
//! Every text an editor shows (message chunks, tool-call titles, the
//! arguments and results in a call's content) goes through the rendering
//! rule of [`crate::render`]: hidden and direction-changing characters
//! appear as `⟨U+202E⟩`, and a call's content ends with the rule's
//! warnings. `raw_input` and `raw_output` stay raw: they are data.

use agent_client_protocol::v1::schema::{
    self as acp, ContentBlock, ContentChunk, SessionUpdate, TextContent, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use serde_json::Value;

use crate::render::{self, Lines};
use overseer_actors::model::{CallState, StopReason, ToolCallRecord, TranscriptEntry, Usage};

/// The ACP stop reason of a turn that ended with `reason`; `None` for a turn
/// that failed (answered as a JSON-RPC error with the session's message).
pub(crate) fn stop_reason(reason: StopReason) -> Option<acp::StopReason> {
    match reason {
        StopReason::EndTurn => Some(acp::StopReason::EndTurn),
        StopReason::MaxTokens => Some(acp::StopReason::MaxTokens),
        // Both cap the model requests one prompt may make.
        StopReason::MaxSteps | StopReason::BudgetExceeded => Some(acp::StopReason::MaxTurnRequests),
        StopReason::Interrupted | StopReason::Cancelled => Some(acp::StopReason::Cancelled),
        StopReason::Refusal => Some(acp::StopReason::Refusal),
        // The session's error message says why (for an overflow: the sizes).
        StopReason::Error | StopReason::ContextOverflow => None,
    }
}

/// Tokens spent between two cumulative usages (the turn's own).
pub(crate) fn turn_usage(before: &Usage, after: &Usage) -> acp::Usage {
    let input = after.input_tokens.saturating_sub(before.input_tokens);
    let output = after.output_tokens.saturating_sub(before.output_tokens);
    acp::Usage::new(input + output, input, output)
}

/// What kind of tool a name is, for the editor's icon.
pub(crate) fn kind(name: &str) -> ToolKind {
    match name {
        "http_request" => ToolKind::Fetch,
        super::fs::READ_TEXT_FILE => ToolKind::Read,
        super::fs::WRITE_TEXT_FILE => ToolKind::Edit,
        "delegate_task" => ToolKind::Think,
        _ => ToolKind::Other,
    }
}

/// A text content block, shown through the rendering rule.
pub(crate) fn text(text: impl Into<String>) -> ContentBlock {
    let text: String = text.into();
    let shown = match render::display(&text, Lines::Many) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(escaped) => escaped,
    };
    ContentBlock::Text(TextContent::new(shown))
}

/// A tool call's title (one line, through the rule).
pub(crate) fn title(title: &str) -> String {
    render::display(title, Lines::One).into_owned()
}

/// What a call will receive, for its content: its arguments as pretty JSON
/// through the rule, then the rule's warnings about its name and arguments.
pub(crate) fn call_content(name: &str, arguments: &Value) -> Vec<ToolCallContent> {
    let mut shown = render::display_json(arguments);
    for w in render::call_warnings(name, arguments) {
        shown.push_str("\nwarning: ");
        shown.push_str(&w.line());
    }
    vec![ToolCallContent::from(text(shown))]
}

/// A chunk of the agent's message.
pub(crate) fn agent_chunk(t: impl Into<String>) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk::new(text(t)))
}

/// A newly proposed call.
pub(crate) fn proposed(id: &str, name: &str, title: String, arguments: &Value) -> SessionUpdate {
    SessionUpdate::ToolCall(
        ToolCall::new(id.to_owned(), self::title(&title))
            .kind(kind(name))
            .status(ToolCallStatus::Pending)
            .content(call_content(name, arguments))
            .raw_input(arguments.clone()),
    )
}

/// A call that started running.
pub(crate) fn started(id: &str) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
        id.to_owned(),
        ToolCallUpdateFields::new().status(ToolCallStatus::InProgress),
    ))
}

/// A call that reached `state` with `result`.
pub(crate) fn finished(id: &str, state: CallState, result: &Value) -> SessionUpdate {
    let status = match state {
        CallState::Completed => ToolCallStatus::Completed,
        _ => ToolCallStatus::Failed,
    };
    let shown = match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
        id.to_owned(),
        ToolCallUpdateFields::new()
            .status(status)
            .content(vec![ToolCallContent::from(text(shown))])
            .raw_output(result.clone()),
    ))
}

/// The updates that tell a transcript again, in order (`session/load`).
/// Calls still open appear as proposed; their later events follow live.
pub(crate) fn replay(transcript: &[std::sync::Arc<TranscriptEntry>]) -> Vec<SessionUpdate> {
    let mut out = Vec::new();
    for entry in transcript {
        match &**entry {
            TranscriptEntry::User { text: t, .. } => {
                out.push(SessionUpdate::UserMessageChunk(ContentChunk::new(text(
                    t.clone(),
                ))));
            }
            TranscriptEntry::Assistant {
                text: t,
                tool_calls,
                ..
            } => {
                if !t.is_empty() {
                    out.push(agent_chunk(t.clone()));
                }
                for call in tool_calls {
                    out.push(proposed(
                        call.id.as_str(),
                        &call.name,
                        call.name.clone(),
                        &call.arguments,
                    ));
                }
            }
            TranscriptEntry::ToolResult { call } => out.extend(result_of(call)),
            _ => {}
        }
    }
    out
}

fn result_of(call: &ToolCallRecord) -> Option<SessionUpdate> {
    let result = call.result.as_ref()?;
    Some(finished(call.id.as_str(), call.state, result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_actors::model::{ProposedCall, ToolCallId};
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn every_turn_outcome_has_its_acp_stop_reason() {
        let rows = [
            (StopReason::EndTurn, Some(acp::StopReason::EndTurn)),
            (StopReason::MaxTokens, Some(acp::StopReason::MaxTokens)),
            (StopReason::MaxSteps, Some(acp::StopReason::MaxTurnRequests)),
            (
                StopReason::BudgetExceeded,
                Some(acp::StopReason::MaxTurnRequests),
            ),
            (StopReason::Interrupted, Some(acp::StopReason::Cancelled)),
            (StopReason::Cancelled, Some(acp::StopReason::Cancelled)),
            (StopReason::Refusal, Some(acp::StopReason::Refusal)),
            (StopReason::Error, None),
        ];
        for (ours, theirs) in rows {
            assert_eq!(stop_reason(ours), theirs, "{ours}");
        }
    }

    #[test]
    fn a_turns_usage_is_what_it_added() {
        let before = Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        };
        let after = Usage {
            input_tokens: 58,
            output_tokens: 17,
            ..Usage::default()
        };
        assert_eq!(turn_usage(&before, &after), acp::Usage::new(60, 48, 12));
    }

    #[test]
    fn what_an_editor_shows_goes_through_the_rendering_rule() {
        let args = json!({"attachment": "invoice_\u{202e}fdp.exe", "vendor": "p\u{430}ypal"});
        let call =
            serde_json::to_value(proposed("call_1", "t", "t\u{200b}x".into(), &args)).unwrap();
        assert_eq!(call["title"], "t⟨U+200B⟩x");
        assert_eq!(call["rawInput"], args, "raw input stays raw");
        let shown = call["content"][0]["content"]["text"].as_str().unwrap();
        assert!(
            shown.contains("\"attachment\": \"invoice_⟨U+202E⟩fdp.exe\""),
            "{shown}"
        );
        assert!(
            shown.ends_with(
                "\nwarning: /arguments/attachment: contains hidden or direction-changing characters: U+202E\
                 \nwarning: /arguments/vendor: mixes scripts within a word: p\u{430}ypal"
            ),
            "{shown}"
        );
        let chunk = serde_json::to_value(agent_chunk("a\u{2066}b\nc")).unwrap();
        assert_eq!(chunk["content"]["text"], "a⟨U+2066⟩b\nc");
        let done = serde_json::to_value(finished(
            "call_1",
            CallState::Completed,
            &json!("r\u{feff}"),
        ))
        .unwrap();
        assert_eq!(done["content"][0]["content"]["text"], "r⟨U+FEFF⟩");
        assert_eq!(done["rawOutput"], "r\u{feff}");
    }

    #[test]
    fn a_transcript_replays_as_messages_calls_and_results() {
        let id = ToolCallId("call_1".into());
        let mut record = ToolCallRecord::proposed(id.clone(), "current_time".into(), json!({}), 1);
        record.finish(CallState::Completed, json!({"now": "noon"}), 2);
        let transcript = vec![
            Arc::new(TranscriptEntry::User {
                text: "hi".into(),
                at_ms: 0,
            }),
            Arc::new(TranscriptEntry::Assistant {
                text: "Looking.".into(),
                tool_calls: vec![ProposedCall {
                    id: id.clone(),
                    name: "current_time".into(),
                    arguments: json!({}),
                }],
                at_ms: 1,
                finish_reason: None,
            }),
            Arc::new(TranscriptEntry::ToolResult { call: record }),
        ];
        let got = replay(&transcript);
        assert!(matches!(&got[0], SessionUpdate::UserMessageChunk(_)));
        assert_eq!(got[1], agent_chunk("Looking."));
        assert!(matches!(&got[2], SessionUpdate::ToolCall(t)
            if t.tool_call_id.0.as_ref() == "call_1" && t.kind == ToolKind::Other));
        assert!(matches!(&got[3], SessionUpdate::ToolCallUpdate(u)
            if u.fields.status == Some(ToolCallStatus::Completed)
                && u.fields.raw_output == Some(json!({"now": "noon"}))));
        assert_eq!(got.len(), 4);
    }
}
