#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use overseer_actors::model::{
    CallState, DecisionRecord, ProposedCall, SessionStatus, ToolCallId, ToolCallRecord, ToolRule,
};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn no_blobs(_: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(None)
}

fn call(id: &str, result: Option<Value>, decision: Option<DecisionRecord>) -> ToolCallRecord {
    let mut call: ToolCallRecord = serde_json::from_value(json!({
        "id": id, "name": "echo", "arguments": {"text": "hi"}, "state": "completed",
        "requires_approval": decision.is_some(), "proposed_at_ms": 5,
        "child": SessionId::generate(),
    }))
    .unwrap();
    call.result = result;
    call.decision = decision;
    call
}

fn decision(by: &str) -> DecisionRecord {
    serde_json::from_value(
        json!({"decision": {"decision": "approve"}, "by": by, "at_ms": 9, "metadata": {"k": 1}}),
    )
    .unwrap()
}

/// A typical approval turn's last checkpoint: the tool result, the
/// assistant's answer, and the events that repeat them.
fn typical(id: SessionId) -> (Vec<(u64, Arc<TranscriptEntry>)>, Vec<Event>) {
    let result = json!({"echo": {"text": "hi"}});
    let entries = vec![
        (
            2,
            Arc::new(TranscriptEntry::ToolResult {
                call: call("c1", Some(result.clone()), Some(decision("alice"))),
            }),
        ),
        (
            3,
            Arc::new(TranscriptEntry::Assistant {
                text: "Done: the tool said hi.".into(),
                tool_calls: vec![],
                at_ms: 20,
                finish_reason: None,
            }),
        ),
    ];
    let kinds = vec![
        EventKind::DecisionRecorded {
            call_id: ToolCallId("c1".into()),
            record: decision("alice"),
        },
        EventKind::ToolCallStarted {
            call_id: ToolCallId("c1".into()),
            attempt: 1,
        },
        EventKind::ToolCallFinished {
            call_id: ToolCallId("c1".into()),
            state: CallState::Completed,
            result,
        },
        EventKind::AssistantMessage {
            step: 2,
            text: "Done: the tool said hi.".into(),
        },
        EventKind::StatusChanged {
            status: SessionStatus::Completed,
        },
    ];
    let events = kinds
        .into_iter()
        .zip(7..)
        .map(|(kind, seq)| Event {
            session_id: id,
            seq,
            at_ms: 1_700_000_000_000 + seq as i64,
            kind,
        })
        .collect();
    (entries, events)
}

#[test]
fn a_typical_checkpoint_round_trips_and_stores_repeated_fields_once() {
    let id = SessionId::generate();
    let (entries, events) = typical(id);
    let encoded = encode(&id, &entries, &events).unwrap();
    assert!(encoded.blobs.is_empty());
    let record = decode(&id, &encoded.bytes).unwrap();
    assert_eq!((record.first_seq(), record.last_seq()), (Some(7), Some(11)));
    // Decision, result and text are referenced, not repeated.
    let refs = record
        .events
        .iter()
        .filter(|e| !matches!(e.kind, StoredKind::Whole(_)))
        .count();
    assert_eq!(refs, 3);
    let expanded = record.expand(&id, no_blobs).unwrap();
    assert_eq!(expanded.entries, entries);
    assert_eq!(expanded.events, events);
    // Against the JSON rows of layout 3 (an entry each, one events row):
    // 462 bytes against 872 when this was written.
    let json: usize = entries
        .iter()
        .map(|(_, e)| serde_json::to_vec(e).unwrap().len())
        .sum::<usize>()
        + serde_json::to_vec(
            &events
                .iter()
                .map(|e| (e.at_ms, &e.kind))
                .collect::<Vec<_>>(),
        )
        .unwrap()
        .len();
    assert!(
        encoded.bytes.len() * 5 < json * 3,
        "record {} bytes, JSON rows {json}",
        encoded.bytes.len()
    );
}

#[test]
fn a_large_result_goes_to_a_blob_and_comes_back_for_the_entry_and_its_event() {
    let id = SessionId::generate();
    let result = json!({"body": "x".repeat(BLOB_THRESHOLD + 1)});
    let entries = vec![(
        0,
        Arc::new(TranscriptEntry::ToolResult {
            call: call("c1", Some(result.clone()), None),
        }),
    )];
    let events = vec![Event {
        session_id: id,
        seq: 1,
        at_ms: 3,
        kind: EventKind::ToolCallFinished {
            call_id: ToolCallId("c1".into()),
            state: CallState::Completed,
            result: result.clone(),
        },
    }];
    let encoded = encode(&id, &entries, &events).unwrap();
    assert_eq!(encoded.blobs.len(), 1);
    assert!(encoded.bytes.len() < 1024, "{}", encoded.bytes.len());
    let (hash, json) = &encoded.blobs[0];
    assert_eq!(*hash, hex::encode(Sha256::digest(json)));
    let blobs: HashMap<String, Vec<u8>> = encoded.blobs.iter().cloned().collect();
    let record = decode(&id, &encoded.bytes).unwrap();
    assert_eq!(record.blobs().collect::<Vec<_>>(), vec![hash.as_str()]);
    let expanded = record.expand(&id, |h| Ok(blobs.get(h).cloned())).unwrap();
    assert_eq!(expanded.entries, entries);
    assert_eq!(expanded.events, events);

    let missing = decode(&id, &encoded.bytes)
        .unwrap()
        .expand(&id, no_blobs)
        .unwrap_err();
    assert!(
        matches!(&missing, StoreError::Corrupt { session, detail }
            if *session == id.to_string() && detail.contains("missing blob")),
        "{missing:?}"
    );
}

#[test]
fn a_damaged_or_newer_record_is_an_error_naming_the_session() {
    let id = SessionId::generate();
    let (entries, events) = typical(id);
    let mut bytes = encode(&id, &entries, &events).unwrap().bytes;
    let cut = decode(&id, &bytes[..bytes.len() / 2]).unwrap_err();
    assert!(
        matches!(&cut, StoreError::Corrupt { session, .. } if *session == id.to_string()),
        "{cut:?}"
    );
    // The version is the first field: `0x8?` map header, `a1 'v'`, then it.
    assert_eq!(&bytes[1..3], b"\xa1v");
    bytes[3] = RECORD_VERSION + 1;
    let newer = decode(&id, &bytes).unwrap_err();
    assert!(
        matches!(&newer, StoreError::Corrupt { detail, .. } if detail.contains("newer")),
        "{newer:?}"
    );
}

#[test]
fn a_tool_that_returned_null_keeps_its_null_in_the_event() {
    let id = SessionId::generate();
    let entries = vec![(
        0,
        Arc::new(TranscriptEntry::ToolResult {
            call: call("c1", Some(Value::Null), None),
        }),
    )];
    let events = vec![Event {
        session_id: id,
        seq: 1,
        at_ms: 3,
        kind: EventKind::ToolCallFinished {
            call_id: ToolCallId("c1".into()),
            state: CallState::Completed,
            result: Value::Null,
        },
    }];
    let encoded = encode(&id, &entries, &events).unwrap();
    let expanded = decode(&id, &encoded.bytes)
        .unwrap()
        .expand(&id, no_blobs)
        .unwrap();
    assert_eq!(expanded.events, events);
    // The entry reads back as layout 3's JSON reads it: no result.
    let TranscriptEntry::ToolResult { call } = &*expanded.entries[0].1 else {
        panic!("{:?}", expanded.entries);
    };
    assert_eq!(call.result, None);
}

#[test]
fn an_event_of_another_session_is_refused() {
    let id = SessionId::generate();
    let (entries, mut events) = typical(id);
    events[1].session_id = SessionId::generate();
    assert!(encode(&id, &entries, &events).is_err());
}

// ---- the property: decode ∘ encode is the identity on events ----

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        "\\PC{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value that is not `null` (an `Option<Value>` field stores `null` as
/// absent, in JSON as in MessagePack).
fn some_value() -> impl Strategy<Value = Value> {
    value().prop_map(|v| if v.is_null() { json!(0) } else { v })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c]{0,2}", "\\PC{0,10}"]
}

fn call_id() -> impl Strategy<Value = ToolCallId> {
    "c[0-2]".prop_map(ToolCallId)
}

fn decision_record() -> impl Strategy<Value = DecisionRecord> {
    (
        prop::option::of("[a-b]"),
        any::<i64>(),
        prop::option::of(some_value()),
        any::<bool>(),
    )
        .prop_map(|(by, at_ms, metadata, deny)| {
            serde_json::from_value(json!({
                "decision": if deny { json!({"decision": "deny", "message": "no"}) } else { json!({"decision": "approve"}) },
                "by": by, "at_ms": at_ms, "metadata": metadata,
            }))
            .unwrap()
        })
}

fn state() -> impl Strategy<Value = CallState> {
    prop_oneof![
        Just(CallState::Completed),
        Just(CallState::Failed),
        Just(CallState::Denied)
    ]
}

fn entry() -> impl Strategy<Value = TranscriptEntry> {
    let proposed = (call_id(), "[a-b]", value()).prop_map(|(id, name, arguments)| ProposedCall {
        id,
        name,
        arguments,
    });
    prop_oneof![
        (text(), any::<i64>()).prop_map(|(text, at_ms)| TranscriptEntry::User { text, at_ms }),
        (text(), prop::collection::vec(proposed, 0..3), any::<i64>()).prop_map(
            |(text, tool_calls, at_ms)| TranscriptEntry::Assistant {
                text,
                tool_calls,
                at_ms,
                finish_reason: None,
            }
        ),
        (
            call_id(),
            state(),
            // `null` too: a tool may return it.
            prop::option::of(value()),
            prop::option::of(decision_record()),
            any::<bool>()
        )
            .prop_map(|(id, state, result, decision, child)| {
                let mut c = call(&id.0, result, decision);
                c.state = state;
                if !child {
                    c.child = None;
                }
                TranscriptEntry::ToolResult { call: c }
            }),
        (text(), 0u64..5, any::<i64>()).prop_map(|(summary, through, at_ms)| {
            TranscriptEntry::Compaction {
                summary,
                through,
                assistant_entries: 1,
                at_ms,
            }
        }),
        ("[a-b]", "[a-b]", any::<i64>())
            .prop_map(|(from, to, at_ms)| TranscriptEntry::ModelChanged { from, to, at_ms }),
        (text(), any::<i64>()).prop_map(|(message, at_ms)| TranscriptEntry::Error {
            message,
            kind: None,
            estimated_tokens: None,
            context_window: None,
            at_ms,
        }),
        ("[a-b]", prop::option::of("[a-b]"), any::<i64>()).prop_map(|(name, by, at_ms)| {
            TranscriptEntry::SkillActivated {
                name,
                body: "b".into(),
                by,
                call_id: None,
                at_ms,
            }
        }),
        (
            "[a-b]",
            any::<bool>(),
            prop::option::of("[a-b]"),
            any::<i64>()
        )
            .prop_map(|(tool, allow, by, at_ms)| TranscriptEntry::ToolRuleSet {
                tool,
                rule: if allow {
                    ToolRule::Allow
                } else {
                    ToolRule::Reject
                },
                by,
                at_ms,
            }),
    ]
}

/// An event made from an entry of the checkpoint (repeating its fields, so
/// the encoder refers to it), or from one perturbed so it must be stored
/// whole, or unrelated to any entry.
#[derive(Debug, Clone)]
struct Plan {
    pick: usize,
    sub: usize,
    perturb: bool,
    other: EventKind,
    flag: bool,
    step: u32,
}

fn plan() -> impl Strategy<Value = Plan> {
    let other = prop_oneof![
        (1u32..4).prop_map(|turn| EventKind::TurnStarted { turn }),
        Just(EventKind::StatusChanged {
            status: SessionStatus::AwaitingApproval
        }),
        (call_id(), 1u32..3)
            .prop_map(|(call_id, attempt)| EventKind::ToolCallStarted { call_id, attempt }),
        (call_id(), state(), value()).prop_map(|(call_id, state, result)| {
            EventKind::ToolCallFinished {
                call_id,
                state,
                result,
            }
        }),
        (call_id(), decision_record())
            .prop_map(|(call_id, record)| EventKind::DecisionRecorded { call_id, record }),
        text().prop_map(|message| EventKind::Error { message }),
    ];
    (
        any::<usize>(),
        any::<usize>(),
        any::<bool>(),
        other,
        any::<bool>(),
        1u32..4,
    )
        .prop_map(|(pick, sub, perturb, other, flag, step)| Plan {
            pick,
            sub,
            perturb,
            other,
            flag,
            step,
        })
}

fn event_from(plan: &Plan, entries: &[(u64, Arc<TranscriptEntry>)]) -> EventKind {
    let Some((_, entry)) = (!entries.is_empty()).then(|| &entries[plan.pick % entries.len()])
    else {
        return plan.other.clone();
    };
    let tweak = |s: &str| {
        if plan.perturb {
            format!("{s}~")
        } else {
            s.to_owned()
        }
    };
    match &**entry {
        TranscriptEntry::User { text, .. } => EventKind::MessageAccepted {
            text: tweak(text),
            queued: plan.flag,
        },
        TranscriptEntry::Assistant {
            text, tool_calls, ..
        } => match tool_calls.get(plan.sub % (tool_calls.len() + 1)) {
            None => EventKind::AssistantMessage {
                step: plan.step,
                text: tweak(text),
            },
            Some(c) if plan.step == 1 => EventKind::ApprovalRequested {
                call_id: c.id.clone(),
                name: tweak(&c.name),
                arguments: c.arguments.clone(),
                outcome_unknown: plan.flag,
            },
            Some(c) => EventKind::ToolCallProposed {
                call_id: c.id.clone(),
                name: c.name.clone(),
                arguments: if plan.perturb {
                    json!([c.arguments])
                } else {
                    c.arguments.clone()
                },
            },
        },
        TranscriptEntry::ToolResult { call } => match (&call.decision, plan.flag) {
            (Some(record), true) => EventKind::DecisionRecorded {
                call_id: ToolCallId(tweak(&call.id.0)),
                record: record.clone(),
            },
            _ => EventKind::ToolCallFinished {
                call_id: call.id.clone(),
                state: call.state,
                // A result of `null` (or none) is an event the record must
                // keep whole: the entry stores it as absent.
                result: call.result.clone().unwrap_or(Value::Null),
            },
        },
        TranscriptEntry::Compaction {
            summary, through, ..
        } => EventKind::Compacted {
            through: *through,
            summary: tweak(summary),
        },
        TranscriptEntry::ModelChanged { from, to, .. } => EventKind::ModelChanged {
            from: from.clone(),
            to: tweak(to),
        },
        TranscriptEntry::Error { message, .. } => EventKind::Error {
            message: tweak(message),
        },
        TranscriptEntry::SkillActivated { name, by, .. } => EventKind::SkillActivated {
            name: tweak(name),
            by: by.clone(),
        },
        TranscriptEntry::ToolRuleSet { tool, rule, by, .. } => EventKind::ToolRuleSet {
            tool: tweak(tool),
            rule: *rule,
            by: by.clone(),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Decoding a record and re-expanding its events gives exactly the
    /// events the checkpoint carried, and its entries as the JSON layout
    /// reads them back; with references where events repeat entries.
    #[test]
    fn decode_and_expand_give_back_exactly_what_was_encoded(
        first_entry in 0u64..1_000,
        entries in prop::collection::vec(entry(), 0..6),
        entry_gap in prop::option::of(0usize..6),
        first_seq in 1u64..1_000_000,
        plans in prop::collection::vec((plan(), any::<bool>(), -5_000i64..5_000, any::<bool>()), 0..12),
        at_ms in any::<i64>(),
    ) {
        let id = SessionId::generate();
        let entries: Vec<(u64, Arc<TranscriptEntry>)> = entries
            .into_iter()
            .enumerate()
            .map(|(n, e)| {
                let gap = u64::from(entry_gap.is_some_and(|g| n >= g)) * 7;
                (first_entry + n as u64 + gap, Arc::new(e))
            })
            .collect();
        let (mut seq, mut at) = (first_seq, at_ms);
        let mut events = Vec::new();
        for (plan, related, dt, seq_gap) in &plans {
            let kind = if *related { event_from(plan, &entries) } else { plan.other.clone() };
            events.push(Event { session_id: id, seq, at_ms: at, kind });
            seq += 1 + u64::from(*seq_gap) * 3;
            at = at.wrapping_add(*dt);
        }

        let encoded = encode(&id, &entries, &events).unwrap();
        prop_assert!(encoded.blobs.is_empty());
        let record = decode(&id, &encoded.bytes).unwrap();
        prop_assert_eq!(record.first_seq(), events.first().map(|e| e.seq));
        prop_assert_eq!(record.last_seq(), events.last().map(|e| e.seq));
        let expanded = record.expand(&id, no_blobs).unwrap();
        prop_assert_eq!(&expanded.events, &events);
        let as_json: Vec<(u64, Arc<TranscriptEntry>)> = entries
            .iter()
            .map(|(i, e)| (*i, Arc::new(serde_json::from_slice(&serde_json::to_vec(&**e).unwrap()).unwrap())))
            .collect();
        prop_assert_eq!(&expanded.entries, &as_json);
    }
}
