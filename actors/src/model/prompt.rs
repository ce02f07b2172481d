//! When a question put to a person about one call (an inbox card, an
//! editor's permission request, a terminal prompt) is over without that
//! person's answer: the call was decided elsewhere (another surface, the
//! approval timeout, a standing rule), it ended undecided (its turn was
//! interrupted or cancelled), or its turn or session ended (a failure ends
//! the calls without an event each). Every surface that asks closes its
//! question on exactly these events of the call's own session.
//!
//! This owns the rule only; following a session's events is each surface's
//! own business (in-process, or over the HTTP event stream).

use std::fmt;

use serde_json::Value;

use super::{
    CallState, Decision, DecisionRecord, EventKind, SessionStatus, StopReason, ToolCallId,
    ToolCallRecord,
};

/// Why a call no longer waits for the person who was asked.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptClosed {
    /// Decided: by whom, how, and why.
    Decided(Box<DecisionRecord>),
    /// Ended without a decision (interrupt, cancel): its state and why.
    Ended {
        /// The call's terminal state.
        state: CallState,
        /// The reason its result gives.
        why: String,
    },
    /// The session's turn ended, and the call's wait with it.
    TurnEnded(StopReason),
    /// The session ended.
    SessionEnded(SessionStatus),
    /// The call is no longer among the session's open calls (its step
    /// closed before anyone looked).
    Gone,
}

impl PromptClosed {
    /// Whether `event`, an event of the session that owns `call`, closes a
    /// question about `call`.
    pub fn by_event(event: &EventKind, call: &ToolCallId) -> Option<Self> {
        match event {
            EventKind::DecisionRecorded { call_id, record } if call_id == call => {
                Some(Self::Decided(Box::new(record.clone())))
            }
            EventKind::ToolCallFinished {
                call_id,
                state,
                result,
            } if call_id == call => Some(Self::Ended {
                state: *state,
                why: reason(result),
            }),
            EventKind::TurnEnded { stop_reason, .. } => Some(Self::TurnEnded(*stop_reason)),
            EventKind::StatusChanged { status } if status.is_terminal() => {
                Some(Self::SessionEnded(*status))
            }
            _ => None,
        }
    }

    /// Whether the call, as its session's header records it (`None`: not
    /// among the open calls), still waits for a decision; if not, why.
    pub fn by_record(call: Option<&ToolCallRecord>) -> Option<Self> {
        let call = match call {
            None => return Some(Self::Gone),
            Some(c) if c.state == CallState::AwaitingApproval => return None,
            Some(c) => c,
        };
        Some(match (&call.decision, &call.result) {
            (Some(record), _) => Self::Decided(Box::new(record.clone())),
            (None, result) => Self::Ended {
                state: call.state,
                why: result.as_ref().map(reason).unwrap_or_default(),
            },
        })
    }
}

/// The reason a call's result gives: its `error`, or its text.
fn reason(result: &Value) -> String {
    match result {
        Value::String(s) => s.clone(),
        v => v
            .get("error")
            .and_then(Value::as_str)
            .map_or_else(|| v.to_string(), str::to_owned),
    }
}

fn state_name(state: CallState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One phrase saying who closed it and how, e.g. "approved by alice",
/// "denied by system: No approval decision received".
impl fmt::Display for PromptClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decided(record) => {
                let by = record.by.as_deref().unwrap_or("someone");
                match &record.decision {
                    Decision::Approve { .. } if record.args_diff.is_some() => {
                        write!(f, "approved by {by} with edited arguments")
                    }
                    Decision::Approve { .. } => write!(f, "approved by {by}"),
                    Decision::Deny { message } => write!(
                        f,
                        "denied by {by}: {}",
                        message.as_deref().unwrap_or("no reason given")
                    ),
                }
            }
            Self::Ended { state, why } if why.is_empty() => {
                write!(f, "ended undecided ({})", state_name(*state))
            }
            Self::Ended { state, why } => {
                write!(f, "ended undecided ({}): {why}", state_name(*state))
            }
            Self::TurnEnded(reason) => write!(f, "its turn ended ({reason})"),
            Self::SessionEnded(status) => write!(f, "its session is {status}"),
            Self::Gone => f.write_str("no longer waits for a decision"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(decision: Decision, by: &str) -> DecisionRecord {
        DecisionRecord {
            decision,
            by: Some(by.into()),
            at_ms: 0,
            metadata: None,
            args_diff: None,
        }
    }

    #[test]
    fn events_of_the_call_or_its_turn_close_it_and_say_how() {
        let call = ToolCallId::from("call_a");
        let other = ToolCallId::from("call_b");
        let decided = EventKind::DecisionRecorded {
            call_id: call.clone(),
            record: record(Decision::deny("No approval decision received"), "system"),
        };
        assert_eq!(
            PromptClosed::by_event(&decided, &call)
                .map(|c| c.to_string())
                .as_deref(),
            Some("denied by system: No approval decision received")
        );
        assert_eq!(PromptClosed::by_event(&decided, &other), None);
        let approved = EventKind::DecisionRecorded {
            call_id: call.clone(),
            record: record(Decision::approve(), "rule:allow"),
        };
        assert_eq!(
            PromptClosed::by_event(&approved, &call).map(|c| c.to_string()),
            Some("approved by rule:allow".to_owned())
        );
        let interrupted = EventKind::ToolCallFinished {
            call_id: call.clone(),
            state: CallState::Cancelled,
            result: json!({"error": "interrupted: the turn was stopped"}),
        };
        assert_eq!(
            PromptClosed::by_event(&interrupted, &call).map(|c| c.to_string()),
            Some("ended undecided (cancelled): interrupted: the turn was stopped".to_owned())
        );
        assert_eq!(PromptClosed::by_event(&interrupted, &other), None);
        // A failed session ends its calls without an event each: its turn's
        // end and its status close every question.
        let ended = EventKind::TurnEnded {
            turn: 1,
            stop_reason: StopReason::Error,
            usage: Default::default(),
            output: None,
        };
        assert_eq!(
            PromptClosed::by_event(&ended, &other),
            Some(PromptClosed::TurnEnded(StopReason::Error))
        );
        let failed = EventKind::StatusChanged {
            status: SessionStatus::Failed,
        };
        assert_eq!(
            PromptClosed::by_event(&failed, &other),
            Some(PromptClosed::SessionEnded(SessionStatus::Failed))
        );
        // Neither the call's other events nor a session still going close it.
        for open in [
            EventKind::ApprovalRequested {
                call_id: call.clone(),
                name: "t".into(),
                arguments: json!({}),
                outcome_unknown: false,
            },
            EventKind::StatusChanged {
                status: SessionStatus::AwaitingApproval,
            },
            EventKind::DecisionRecorded {
                call_id: other.clone(),
                record: record(Decision::approve(), "alice"),
            },
        ] {
            assert_eq!(PromptClosed::by_event(&open, &call), None, "{open:?}");
        }
    }

    #[test]
    fn a_record_still_awaiting_approval_is_open_and_any_other_is_closed() {
        let mut call = ToolCallRecord::proposed("call_a".into(), "t".into(), json!({}), 0);
        call.state = CallState::AwaitingApproval;
        assert_eq!(PromptClosed::by_record(Some(&call)), None);
        assert_eq!(PromptClosed::by_record(None), Some(PromptClosed::Gone));
        call.state = CallState::Approved;
        call.decision = Some(record(Decision::approve(), "alice"));
        assert_eq!(
            PromptClosed::by_record(Some(&call)).map(|c| c.to_string()),
            Some("approved by alice".to_owned())
        );
        call.decision = None;
        call.state = CallState::Cancelled;
        call.result = Some(json!({"error": "cancelled: the session was cancelled"}));
        assert_eq!(
            PromptClosed::by_record(Some(&call)).map(|c| c.to_string()),
            Some("ended undecided (cancelled): cancelled: the session was cancelled".to_owned())
        );
    }
}
