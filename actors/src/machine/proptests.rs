//! Property tests of [`Session::apply`] over random input sequences, the way
//! raft-rs tests its core: generated sequences of realistic inputs (messages,
//! provider streams with tool calls, decisions valid and not, tool results,
//! timeouts, children, cancels, interrupts, restarts…) driven through the
//! pure machine, with every transition checked against the properties the
//! rest of the system relies on:
//!
//! - **purity**: the same state, input and context give the same new state
//!   and effects, compared whole (every field, through `Debug`), and a
//!   transition reads no clock (everything it stamps is `ctx.now_ms`);
//! - **a refused input changes nothing**, for every kind of input: an `Err`
//!   leaves the whole state as it was, and so does an input the machine
//!   ignores (stale, unknown or out of phase);
//! - **an ended session stays as it is**, and no call is left open
//!   outside a turn;
//! - **every effect's intent is in the state it is checkpointed with** (a
//!   dispatch names a running call at its attempt, a timer a waiting call at
//!   its deadline);
//! - **checkpoint deltas**: each checkpoint carries only what is new
//!   (entries, events, queue rows after the previous checkpoint, none
//!   repeated, none missing), and the union of the deltas is the session:
//!   read back, it is the state in memory;
//! - **replay**: the accepted inputs, applied again to the initial state
//!   with the same contexts, rebuild the same state.
//!
//! The generator picks call ids, attempts and deadlines from the state the
//! input meets, mostly "the likely next thing" for the session's phase, so
//! sequences get deep into the turn loop; a coverage check at the end of the
//! run asserts that they did (every input kind refused or ignored at least
//! once, dispatches, delegations, decisions, compactions and queued
//! messages seen). The runner is seeded: a run is reproducible, and a
//! failure is shrunk to a short sequence and printed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::*;
use crate::delegation::DelegateTask;
use crate::model::{AgentConfig, Budget, QueuedMessage};
use crate::tool::{Tool, ToolContext, ToolError, ToolSpec};

/// Cases per property run: enough to reach every phase many times, few
/// enough for the suite (about a second in a debug build).
const CASES: u32 = 192;
/// Longest generated sequence.
const MAX_STEPS: usize = 64;
const NOW: i64 = 1_700_000_000_000;
const TIMEOUT_SECS: u64 = 90;
const INPUT_TIMEOUT_SECS: u64 = 60;
const SUBAGENT: &str = "helper";

struct Noop(ToolSpec);

#[async_trait::async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, _args: Value) -> Result<Value, ToolError> {
        Ok(Value::Null)
    }
}

/// `ask` needs approval (and asks again after an interruption), `free`
/// needs none (and is run again after one), `delegate_task` starts a child.
fn registry() -> ToolRegistry {
    let ask = ToolSpec::new(
        "ask",
        "needs approval",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    )
    .with_approval(true);
    let free = ToolSpec::new("free", "no approval", json!({"type": "object"})).idempotent(true);
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(Noop(ask)),
        Arc::new(Noop(free)),
        Arc::new(DelegateTask::default()),
    ];
    ToolRegistry::new(tools).unwrap_or_else(|e| panic!("registry: {e}"))
}

/// The agent a case runs (varied, so every policy gets its sequences).
#[derive(Debug, Clone)]
struct Setup {
    approval: ApprovalPolicy,
    parallel: bool,
    max_steps: u32,
    tool_budget: Option<u64>,
    output_schema: bool,
    /// The route's context window, small enough to compact when set.
    window: Option<u64>,
    metadata: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            4 => Just(ApprovalPolicy::PerTool),
            1 => Just(ApprovalPolicy::Always),
            1 => Just(ApprovalPolicy::Auto),
        ],
        any::<bool>(),
        2u32..8,
        prop_oneof![3 => Just(None), 1 => (1u64..6).prop_map(Some)],
        prop::bool::weighted(0.2),
        prop_oneof![3 => Just(None), 1 => (300u64..900).prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(
            |(approval, parallel, max_steps, tool_budget, output_schema, window, metadata)| Setup {
                approval,
                parallel,
                max_steps,
                tool_budget,
                output_schema,
                window,
                metadata,
            },
        )
}

fn new_session(setup: &Setup) -> Session {
    let mut agent = AgentConfig::new("lead", &["ask", "free"]);
    agent.approval = setup.approval;
    agent.parallel_tool_calls = setup.parallel;
    agent.max_steps = setup.max_steps;
    agent.approval_timeout_secs = TIMEOUT_SECS;
    agent.input_timeout_secs = Some(INPUT_TIMEOUT_SECS);
    agent.subagents = vec![SUBAGENT.into()];
    agent.max_children = 2;
    agent.budget = Budget {
        max_tool_calls: setup.tool_budget,
        ..Budget::default()
    };
    if setup.output_schema {
        agent.output_schema = Some(json!({
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]
        }));
    }
    let id = SessionId(uuid::Uuid::from_u128(0x5e55_1011));
    let header = SessionHeader::new(id, "t".into(), "lead".into(), agent.effective(), NOW);
    let s = Session::new(header);
    if setup.metadata {
        s.with_metadata(json!({"case": "proptest"}))
    } else {
        s
    }
}

/// Tight queue bounds, so that refusals of a full queue happen.
fn limits() -> Limits {
    Limits {
        max_queued_messages: 3,
        max_queued_bytes: 96,
        ..Limits::default()
    }
}

/// One step of a sequence before it meets a state: `pick` chooses among
/// the calls the session has then.
#[derive(Debug, Clone)]
enum Act {
    /// The likely next thing in the session's phase.
    Natural(u8),
    Message {
        text: u8,
        id: Option<u8>,
    },
    Delta(u8),
    Call {
        tool: u8,
        valid: bool,
    },
    Usage(u8),
    Finish(u8),
    End(Option<u8>),
    Decide {
        pick: u8,
        how: u8,
    },
    ToolDone {
        pick: u8,
        ok: bool,
        stale: bool,
    },
    Timeout {
        pick: u8,
        stale: bool,
    },
    ChildDone {
        pick: u8,
        ok: bool,
        stale: bool,
    },
    ChildWaiting {
        pick: u8,
        waiting: bool,
    },
    Cancel,
    Interrupt,
    SetModel(u8),
    SetToolRule {
        tool: u8,
        allow: bool,
    },
    Expire {
        exact: bool,
    },
    Done,
    Resume(u8),
    Fail,
}

fn act() -> impl Strategy<Value = Act> {
    let b = any::<bool>;
    prop_oneof![
        100 => any::<u8>().prop_map(Act::Natural),
        8 => (any::<u8>(), prop::option::weighted(0.4, 0u8..4)).prop_map(|(text, id)| Act::Message { text, id }),
        6 => any::<u8>().prop_map(Act::Delta),
        6 => (0u8..5, prop::bool::weighted(0.8)).prop_map(|(tool, valid)| Act::Call { tool, valid }),
        2 => any::<u8>().prop_map(Act::Usage),
        2 => any::<u8>().prop_map(Act::Finish),
        4 => prop::option::weighted(0.3, any::<u8>()).prop_map(Act::End),
        8 => (any::<u8>(), any::<u8>()).prop_map(|(pick, how)| Act::Decide { pick, how }),
        6 => (any::<u8>(), b(), prop::bool::weighted(0.3)).prop_map(|(pick, ok, stale)| Act::ToolDone { pick, ok, stale }),
        4 => (any::<u8>(), prop::bool::weighted(0.4)).prop_map(|(pick, stale)| Act::Timeout { pick, stale }),
        4 => (any::<u8>(), b(), prop::bool::weighted(0.3)).prop_map(|(pick, ok, stale)| Act::ChildDone { pick, ok, stale }),
        2 => (any::<u8>(), b()).prop_map(|(pick, waiting)| Act::ChildWaiting { pick, waiting }),
        1 => Just(Act::Cancel),
        4 => Just(Act::Interrupt),
        2 => any::<u8>().prop_map(Act::SetModel),
        2 => (0u8..3, b()).prop_map(|(tool, allow)| Act::SetToolRule { tool, allow }),
        2 => b().prop_map(|exact| Act::Expire { exact }),
        1 => Just(Act::Done),
        2 => any::<u8>().prop_map(Act::Resume),
        1 => Just(Act::Fail),
    ]
}

/// A step: what to do, how much time passes before it, the entropy of its
/// transition, and whether the actor checkpoints after it (it always does;
/// an owner writing without an actor may apply several inputs first).
#[derive(Debug, Clone)]
struct Step {
    act: Act,
    dt_ms: u32,
    seed: u64,
    checkpoint: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        act(),
        prop_oneof![6 => 0u32..2_000, 1 => 0u32..200_000],
        any::<u64>(),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(act, dt_ms, seed, checkpoint)| Step {
            act,
            dt_ms,
            seed,
            checkpoint,
        })
}

fn case() -> impl Strategy<Value = (Setup, Vec<Step>)> {
    (setup(), prop::collection::vec(step(), 4..MAX_STEPS))
}

/// The input kinds, by name (coverage and messages).
fn kind(input: &Input) -> &'static str {
    match input {
        Input::Message { .. } => "message",
        Input::Provider(_) => "provider",
        Input::StreamEnded(_) => "stream_ended",
        Input::Decide(_) => "decide",
        Input::ToolFinished { .. } => "tool_finished",
        Input::ApprovalTimedOut { .. } => "approval_timed_out",
        Input::ChildFinished { .. } => "child_finished",
        Input::ChildWaiting { .. } => "child_waiting",
        Input::Cancel => "cancel",
        Input::Interrupt => "interrupt",
        Input::SetModel { .. } => "set_model",
        Input::SetToolRule { .. } => "set_tool_rule",
        Input::ExpireInput { .. } => "expire_input",
        Input::Done => "done",
        Input::Resume { .. } => "resume",
        Input::Fail { .. } => "fail",
        Input::ActivateSkill { .. } => "activate_skill",
    }
}

/// Kinds that can be refused with an error.
const REFUSABLE: [&str; 8] = [
    "message",
    "decide",
    "cancel",
    "interrupt",
    "set_model",
    "set_tool_rule",
    "done",
    "fail",
];
/// Kinds the machine ignores when they do not apply (stale, out of phase).
const IGNORABLE: [&str; 8] = [
    "provider",
    "stream_ended",
    "tool_finished",
    "approval_timed_out",
    "child_finished",
    "child_waiting",
    "expire_input",
    "resume",
];

/// An input the generator made to be ignored: it must change nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Anything,
    Ignored,
}

fn nth<T>(items: &[T], pick: u8) -> Option<&T> {
    (!items.is_empty()).then(|| &items[usize::from(pick) % items.len()])
}

fn calls_in(s: &Session, state: CallState) -> Vec<ToolCallRecord> {
    s.header
        .open_calls
        .iter()
        .filter(|c| c.state == state)
        .cloned()
        .collect()
}

fn tool_call(tool: u8, valid: bool) -> Input {
    let (name, arguments) = match (tool % 5, valid) {
        (0, true) => ("ask", json!({"n": 1})),
        (0, false) => ("ask", json!({"n": "one"})),
        (1, _) => ("free", json!({"path": "/tmp"})),
        (2, true) => (
            DELEGATE_TASK,
            json!({"agent": SUBAGENT, "goal": "look it up"}),
        ),
        (2, false) => (DELEGATE_TASK, json!({"agent": "stranger", "goal": "g"})),
        (3, _) => ("missing", json!({})),
        _ => ("ask", json!({"n": 2})),
    };
    Input::Provider(ProviderEvent::ToolCall {
        name: name.into(),
        arguments,
    })
}

fn message(text: String, id: Option<u8>) -> Input {
    Input::Message {
        text,
        message_id: id.map(|i| format!("m{i}")),
    }
}

/// An approval that replaces some arguments, in the wire shape (so the
/// test does not depend on the variant's fields).
fn approve_with(args: Value) -> Decision {
    serde_json::from_value(json!({"decision": "approve", "override_args": args}))
        .unwrap_or_else(|e| panic!("an approval with overrides: {e}"))
}

fn child_result(ok: bool) -> Result<Value, Value> {
    if ok {
        Ok(json!({"final_text": "found it", "stop_reason": "end_turn"}))
    } else {
        Err(json!({"error": "subagent 'helper' failed: stopped with error"}))
    }
}

/// The input `act` stands for in the state `s` is in.
fn resolve(s: &Session, act: &Act, now_ms: i64) -> (Input, Expect) {
    let streaming = s.is_streaming();
    let running = calls_in(s, CallState::Running);
    let waiting = calls_in(s, CallState::AwaitingApproval);
    let any = Expect::Anything;
    match act {
        Act::Natural(k) => {
            let k = *k;
            match s.header.status {
                SessionStatus::AwaitingInput if k % 20 == 0 => {
                    let idle_since_ms = s.header.updated_at_ms;
                    (Input::ExpireInput { idle_since_ms }, any)
                }
                SessionStatus::Pending | SessionStatus::AwaitingInput => {
                    (message(format!("question {k}"), None), any)
                }
                // A stream mostly proposes a call or two, then ends; a
                // compaction's stream writes its summary.
                _ if streaming => {
                    let said = s.partial.calls.len() + usize::from(!s.partial.text.is_empty());
                    let compacting = s.header.context.compacting_through.is_some();
                    match (k % 10, said) {
                        (0..=4, 1..) | (0..=1, 0) => (Input::StreamEnded(Ok(())), any),
                        (2 | 3, 0) if compacting => (
                            Input::Provider(ProviderEvent::TextDelta("a summary".into())),
                            any,
                        ),
                        (2 | 3 | 5, _) => (
                            Input::Provider(ProviderEvent::TextDelta(
                                if s.header.config.output_schema.is_some() && k % 2 == 0 {
                                    r#"{"ok": true}"#.into()
                                } else {
                                    format!("words {k} ")
                                },
                            )),
                            any,
                        ),
                        (6 | 7, _) => (tool_call(0, true), any),
                        (8, _) => (tool_call(1, true), any),
                        (9, _) if k % 3 == 0 => (
                            Input::Provider(ProviderEvent::Done(FinishReason::Stop)),
                            any,
                        ),
                        _ => (tool_call(2, true), any),
                    }
                }
                SessionStatus::Running | SessionStatus::AwaitingApproval => {
                    if let (Some(c), true) = (nth(&waiting, k), k % 3 != 0 || running.is_empty()) {
                        let decision = if k % 4 == 0 {
                            Decision::deny("no")
                        } else {
                            Decision::approve()
                        };
                        return (Input::Decide(Submission::one(c.id.clone(), decision)), any);
                    }
                    match nth(&running, k) {
                        Some(c) if c.name == DELEGATE_TASK => {
                            if k % 3 == 0 && !c.child_waiting {
                                let input = Input::ChildWaiting {
                                    call_id: c.id.clone(),
                                    waiting: true,
                                };
                                return (input, any);
                            }
                            let input = Input::ChildFinished {
                                call_id: c.id.clone(),
                                attempt: c.attempt,
                                result: child_result(k % 5 != 0),
                                usage: Usage {
                                    input_tokens: 7,
                                    output_tokens: 3,
                                    provider_requests: 1,
                                    ..Usage::default()
                                },
                            };
                            (input, any)
                        }
                        Some(c) => {
                            let result = if k % 5 == 0 {
                                Err(json!({"error": "tool failed"}))
                            } else {
                                Ok(json!({"value": k}))
                            };
                            let input = Input::ToolFinished {
                                call_id: c.id.clone(),
                                attempt: c.attempt,
                                result,
                            };
                            (input, any)
                        }
                        None => (Input::Interrupt, any),
                    }
                }
                // Ended: anything is refused.
                _ => (message(format!("late {k}"), None), any),
            }
        }
        Act::Message { text, id } => {
            let text = match text % 8 {
                0 => "   ".to_owned(),
                1 => "x".repeat(120),
                2 => "the same text".to_owned(),
                _ => format!("message {text}"),
            };
            (message(text, *id), any)
        }
        Act::Delta(k) => {
            let input = Input::Provider(ProviderEvent::TextDelta(format!("delta {k} ")));
            (input, if streaming { any } else { Expect::Ignored })
        }
        Act::Call { tool, valid } => (
            tool_call(*tool, *valid),
            if streaming { any } else { Expect::Ignored },
        ),
        Act::Usage(k) => {
            let usage = Usage {
                input_tokens: 200 + u64::from(*k) * 10,
                output_tokens: u64::from(*k),
                provider_requests: u64::from(k % 2),
                ..Usage::default()
            };
            let input = Input::Provider(ProviderEvent::Usage(usage));
            (input, if streaming { any } else { Expect::Ignored })
        }
        Act::Finish(k) => {
            let reason = match k % 5 {
                0 => FinishReason::Stop,
                1 => FinishReason::ToolCalls,
                2 => FinishReason::Length,
                3 => FinishReason::Refusal,
                _ => FinishReason::Other,
            };
            let input = Input::Provider(ProviderEvent::Done(reason));
            (input, if streaming { any } else { Expect::Ignored })
        }
        Act::End(error) => {
            let result = match error.map(|e| e % 4) {
                None => Ok(()),
                Some(0) => Err(ProviderError::Transport("the stream broke".into())),
                Some(1) => Err(ProviderError::Auth("HTTP 401".into())),
                Some(2) => Err(ProviderError::ContextOverflow {
                    message: "too long".into(),
                    tokens: Some(9_000),
                    limit: Some(500),
                }),
                Some(_) => Err(ProviderError::overflow("Context size has been exceeded.")),
            };
            (
                Input::StreamEnded(result),
                if streaming { any } else { Expect::Ignored },
            )
        }
        Act::Decide { pick, how } => {
            let target = nth(&waiting, *pick).map(|c| c.id.clone());
            let some_call = s
                .all_calls()
                .into_iter()
                .find(|c| c.state != CallState::AwaitingApproval)
                .map(|c| c.id.clone());
            let id = |t: &Option<ToolCallId>| {
                t.clone()
                    .unwrap_or_else(|| ToolCallId(format!("call_unknown_{pick}")))
            };
            let sub = match how % 9 {
                0 => Submission::default(),
                1 => Submission::one(ToolCallId("call_never_made".into()), Decision::approve()),
                2 => match some_call {
                    Some(done) => Submission::one(done, Decision::approve()),
                    None => Submission::one(id(&target), Decision::approve()),
                },
                3 => {
                    let mut sub = Submission::one(id(&target), Decision::approve());
                    sub.metadata
                        .insert(ToolCallId("call_elsewhere".into()), json!({"why": "stray"}));
                    sub
                }
                4 => Submission::one(id(&target), approve_with(json!({"n": "not a number"}))),
                5 => Submission::one(id(&target), approve_with(json!({"n": 41}))),
                6 => {
                    let mut sub = Submission::one(id(&target), Decision::deny("not now"));
                    sub.metadata.insert(id(&target), json!({"ticket": pick}));
                    sub.approved_by = Some("reviewer".into());
                    sub
                }
                7 => {
                    // Every waiting call at once.
                    let mut sub = Submission::default();
                    for c in &waiting {
                        sub.decisions.insert(c.id.clone(), Decision::approve());
                    }
                    sub
                }
                _ => Submission::one(id(&target), Decision::approve()),
            };
            (Input::Decide(sub), any)
        }
        Act::ToolDone { pick, ok, stale } => {
            let plain: Vec<_> = running
                .iter()
                .filter(|c| c.name != DELEGATE_TASK)
                .cloned()
                .collect();
            let result = if *ok {
                Ok(json!({"value": pick}))
            } else {
                Err(json!({"error": "tool failed"}))
            };
            match nth(&plain, *pick) {
                Some(c) if !stale => (
                    Input::ToolFinished {
                        call_id: c.id.clone(),
                        attempt: c.attempt,
                        result,
                    },
                    any,
                ),
                // An older attempt, or a call that is not running.
                Some(c) => (
                    Input::ToolFinished {
                        call_id: c.id.clone(),
                        attempt: c.attempt.wrapping_sub(1),
                        result,
                    },
                    Expect::Ignored,
                ),
                None => (
                    Input::ToolFinished {
                        call_id: ToolCallId(format!("call_gone_{pick}")),
                        attempt: 1,
                        result,
                    },
                    Expect::Ignored,
                ),
            }
        }
        Act::Timeout { pick, stale } => match nth(&waiting, *pick) {
            Some(c) => {
                let deadline = c.approval_deadline_ms.unwrap_or(now_ms);
                if *stale {
                    let input = Input::ApprovalTimedOut {
                        call_id: c.id.clone(),
                        deadline_ms: deadline - 1,
                    };
                    (input, Expect::Ignored)
                } else {
                    let input = Input::ApprovalTimedOut {
                        call_id: c.id.clone(),
                        deadline_ms: deadline,
                    };
                    (input, any)
                }
            }
            None => (
                Input::ApprovalTimedOut {
                    call_id: ToolCallId(format!("call_gone_{pick}")),
                    deadline_ms: now_ms,
                },
                Expect::Ignored,
            ),
        },
        Act::ChildDone { pick, ok, stale } => {
            let children: Vec<_> = running
                .iter()
                .filter(|c| c.name == DELEGATE_TASK)
                .cloned()
                .collect();
            let usage = Usage {
                input_tokens: 5,
                provider_requests: 1,
                ..Usage::default()
            };
            match nth(&children, *pick) {
                Some(c) => (
                    Input::ChildFinished {
                        call_id: c.id.clone(),
                        attempt: if *stale { c.attempt + 1 } else { c.attempt },
                        result: child_result(*ok),
                        usage,
                    },
                    if *stale { Expect::Ignored } else { any },
                ),
                None => (
                    Input::ChildFinished {
                        call_id: ToolCallId(format!("call_gone_{pick}")),
                        attempt: 1,
                        result: child_result(*ok),
                        usage,
                    },
                    Expect::Ignored,
                ),
            }
        }
        Act::ChildWaiting { pick, waiting } => {
            let children: Vec<_> = running
                .iter()
                .filter(|c| c.name == DELEGATE_TASK)
                .cloned()
                .collect();
            match nth(&children, *pick) {
                Some(c) => {
                    let input = Input::ChildWaiting {
                        call_id: c.id.clone(),
                        waiting: *waiting,
                    };
                    let same = c.child_waiting == *waiting;
                    (input, if same { Expect::Ignored } else { any })
                }
                None => (
                    Input::ChildWaiting {
                        call_id: ToolCallId(format!("call_gone_{pick}")),
                        waiting: *waiting,
                    },
                    Expect::Ignored,
                ),
            }
        }
        Act::Cancel => (Input::Cancel, any),
        Act::Interrupt => (Input::Interrupt, any),
        Act::SetModel(k) => {
            let model = match k % 4 {
                0 => " ".to_owned(),
                1 => s.header.config.model.clone(),
                _ => format!("model-{}", k % 3),
            };
            let route = (k % 2 == 0).then(|| json!({"endpoint": format!("http://127.0.0.1:{k}")}));
            (Input::SetModel { model, route }, any)
        }
        Act::SetToolRule { tool, allow } => {
            let tool = ["ask", "free", "not_a_tool"][usize::from(*tool % 3)];
            let rule = if *allow {
                ToolRule::Allow
            } else {
                ToolRule::Reject
            };
            let input = Input::SetToolRule {
                tool: tool.into(),
                rule,
                by: Some("tester".into()),
            };
            (input, any)
        }
        Act::Expire { exact } => {
            let idle_since_ms = if *exact {
                s.header.updated_at_ms
            } else {
                s.header.updated_at_ms - 1
            };
            let input = Input::ExpireInput { idle_since_ms };
            (input, if *exact { any } else { Expect::Ignored })
        }
        Act::Done => (Input::Done, any),
        Act::Resume(k) => {
            // What this process knows of the running calls: each not
            // started, started, or finished, by `k`.
            let journal = running
                .iter()
                .filter(|c| c.name != DELEGATE_TASK)
                .enumerate()
                .filter_map(|(i, c)| {
                    let known = match (usize::from(*k) + i) % 4 {
                        0 => Dispatched::NotStarted,
                        1 => Dispatched::Started,
                        2 => Dispatched::Finished(Ok(json!("done before the restart"))),
                        _ => return None,
                    };
                    Some((c.id.clone(), c.attempt, known))
                })
                .collect();
            let settled = !matches!(
                s.header.status,
                SessionStatus::Running | SessionStatus::AwaitingApproval
            );
            (
                Input::Resume { journal },
                if settled { Expect::Ignored } else { any },
            )
        }
        Act::Fail => (
            Input::Fail {
                reason: "restart limit exceeded".into(),
            },
            any,
        ),
    }
}

/// What a store holds once it has written the checkpoints it was given,
/// each checked to carry only what is new.
#[derive(Default)]
struct Stored {
    header: Option<SessionHeader>,
    transcript: Vec<Arc<TranscriptEntry>>,
    events: Vec<Event>,
    queue: BTreeMap<u64, QueuedMessage>,
    metadata: Option<Value>,
}

impl Stored {
    fn write(&mut self, cp: &Checkpoint) -> Result<(), TestCaseError> {
        for (i, entry) in &cp.entries {
            prop_assert_eq!(
                *i,
                self.transcript.len() as u64,
                "a checkpoint's entry repeats or skips one (index {})",
                i
            );
            self.transcript.push(Arc::clone(entry));
        }
        for event in cp.events.iter() {
            let next = self.events.last().map_or(1, |e| e.seq + 1);
            prop_assert_eq!(event.seq, next, "a checkpoint's event repeats or skips one");
            self.events.push(event.clone());
        }
        for (seq, message) in &cp.queued {
            prop_assert!(
                !self.queue.contains_key(seq),
                "queue row {} written twice",
                seq
            );
            self.queue.insert(*seq, message.clone());
        }
        for seq in cp.dequeued.clone() {
            prop_assert!(
                self.queue.remove(&seq).is_some(),
                "dequeued row {} was never written",
                seq
            );
        }
        if let Some(metadata) = &cp.metadata {
            prop_assert!(self.metadata.is_none(), "metadata written twice");
            self.metadata = Some(metadata.clone());
        }
        prop_assert_eq!(cp.header.transcript_len, self.transcript.len() as u64);
        prop_assert_eq!(
            cp.header.last_event_seq,
            self.events.last().map_or(0, |e| e.seq)
        );
        self.header = Some(cp.header.clone());
        Ok(())
    }
}

/// Checkpoints `s` as its actor does, into `stored`; the events handed back
/// for publishing are the ones written.
fn checkpoint(s: &mut Session, stored: &mut Stored) -> Result<(), TestCaseError> {
    let cp = s.checkpoint();
    if !s.is_dirty() {
        prop_assert!(
            cp.entries.is_empty() && cp.events.is_empty() && cp.queued.is_empty(),
            "a session with nothing new made a checkpoint with something in it"
        );
        return Ok(());
    }
    stored.write(&cp)?;
    let written: Vec<Event> = cp.events.as_ref().clone();
    drop(cp);
    let published = s.mark_persisted();
    prop_assert_eq!(published, written);
    Ok(())
}

/// What a run saw, over all its cases.
#[derive(Default)]
struct Coverage {
    refused: BTreeSet<&'static str>,
    ignored: BTreeSet<&'static str>,
    accepted: BTreeSet<&'static str>,
    effects: BTreeSet<&'static str>,
    events: BTreeSet<String>,
    statuses: BTreeSet<String>,
    steps: usize,
    /// Cases whose session ran a tool or a child.
    deep: usize,
}

fn effect_name(e: &Effect) -> &'static str {
    match e {
        Effect::StartStream(r) if r.purpose == RequestPurpose::Compaction => "compaction",
        Effect::StartStream(_) => "stream",
        Effect::StopStream => "stop_stream",
        Effect::Dispatch { attempt: 1, .. } => "dispatch",
        Effect::Dispatch { .. } => "dispatch_again",
        Effect::KillTools => "kill_tools",
        Effect::Delegate { .. } => "delegate",
        Effect::RunTask { .. } => "run_task",
        Effect::CancelChild(_) => "cancel_child",
        Effect::ArmApprovalTimer { .. } => "timer",
        Effect::Delta(_) => "delta",
    }
}

/// The name of an event's kind (its serde tag).
fn event_name(e: &Event) -> String {
    serde_json::to_value(&e.kind)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Every call the effects act on is recorded, in the state the checkpoint
/// writes, as what the effect does: the intent is durable first.
fn intents_recorded(s: &Session, fx: &[Effect]) -> Result<(), TestCaseError> {
    let call = |id: &ToolCallId| s.header.open_calls.iter().find(|c| &c.id == id);
    for e in fx {
        match e {
            Effect::Dispatch {
                call_id,
                attempt,
                idempotency_key,
                ..
            } => {
                let c = call(call_id);
                prop_assert!(
                    c.is_some_and(|c| c.state == CallState::Running
                        && c.attempt == *attempt
                        && c.idempotency_key.as_deref() == Some(idempotency_key.as_str())),
                    "dispatch of {} #{} not recorded as running",
                    call_id.0,
                    attempt
                );
            }
            Effect::Delegate {
                call_id,
                attempt,
                child,
                ..
            } => {
                let c = call(call_id);
                prop_assert!(
                    c.is_some_and(|c| c.state == CallState::Running
                        && c.attempt == *attempt
                        && c.child == Some(*child)),
                    "delegation of {} not recorded with its child",
                    call_id.0
                );
            }
            Effect::ArmApprovalTimer {
                call_id,
                deadline_ms,
                ..
            } => {
                let c = call(call_id);
                prop_assert!(
                    c.is_some_and(|c| c.state == CallState::AwaitingApproval
                        && c.approval_deadline_ms.is_none_or(|d| d == *deadline_ms)),
                    "a timer for {} that does not wait at that deadline",
                    call_id.0
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// No call is left open outside a turn, and none in the transcript is
/// unfinished.
fn no_call_left_open(s: &Session) -> Result<(), TestCaseError> {
    let in_turn = matches!(
        s.header.status,
        SessionStatus::Running | SessionStatus::AwaitingApproval
    );
    prop_assert!(
        in_turn || s.header.open_calls.is_empty(),
        "{:?} with open calls {:?}",
        s.header.status,
        s.header
            .open_calls
            .iter()
            .map(|c| c.state)
            .collect::<Vec<_>>()
    );
    for e in &s.transcript {
        if let TranscriptEntry::ToolResult { call } = e.as_ref() {
            prop_assert!(
                call.state.is_terminal(),
                "{:?} in the transcript",
                call.state
            );
        }
    }
    Ok(())
}

/// One accepted input as recorded for replay.
struct Applied {
    input: Input,
    now_ms: i64,
    seed: u64,
    checkpointed: bool,
}

fn ctx_at<'a>(tools: &'a ToolRegistry, window: Option<u64>, now_ms: i64, seed: u64) -> Ctx<'a> {
    Ctx {
        tools,
        now_ms,
        seed,
        limits: limits(),
        context_window: window,
        compaction_threshold_pct: DEFAULT_COMPACTION_THRESHOLD_PCT,
    }
}

/// Drives one generated case through every check.
fn run_case(
    tools: &ToolRegistry,
    setup: &Setup,
    steps: &[Step],
    cov: &Mutex<Coverage>,
) -> Result<(), TestCaseError> {
    let mut s = new_session(setup);
    let mut stored = Stored::default();
    // The create: its first checkpoint is written before anything runs.
    checkpoint(&mut s, &mut stored)?;
    let initial = s.clone();
    let mut applied = Vec::new();
    let mut now_ms = NOW;
    let mut seen = Coverage::default();
    let mut after_end = 0;
    for step in steps {
        // An ended session refuses or ignores everything: a few inputs
        // show it, more would only repeat it.
        if s.header.status.is_terminal() {
            after_end += 1;
            if after_end > 6 {
                break;
            }
        }
        now_ms += i64::from(step.dt_ms);
        let (input, expect) = resolve(&s, &step.act, now_ms);
        let name = kind(&input);
        let ctx = ctx_at(tools, setup.window, now_ms, step.seed);
        let before = format!("{s:?}");
        let was_ended = s.header.status.is_terminal();
        let seq_before = s.header.last_event_seq;

        // Purity: a twin in the same state, given the same input and
        // context, ends in the same state with the same effects.
        let mut twin = s.clone();
        let result = s.apply(input.clone(), ctx);
        let twin_result = twin.apply(input.clone(), ctx);
        prop_assert_eq!(
            format!("{result:?}"),
            format!("{twin_result:?}"),
            "{}: the same state and input gave other effects",
            name
        );
        let after = format!("{s:?}");
        prop_assert_eq!(
            &after,
            &format!("{twin:?}"),
            "{}: the same state and input gave another state",
            name
        );
        // No clock: whatever the transition stamps is the context's now.
        for e in s.pending_events().iter().filter(|e| e.seq > seq_before) {
            prop_assert_eq!(
                e.at_ms,
                now_ms,
                "{}: an event stamped off the context",
                name
            );
        }
        prop_assert!(s.header.updated_at_ms <= now_ms);

        match result {
            Err(e) => {
                prop_assert_eq!(&after, &before, "{}: refused ({}) but changed", name, e);
                seen.refused.insert(name);
            }
            Ok(fx) => {
                if expect == Expect::Ignored {
                    prop_assert!(fx.is_empty(), "{}: ignored but gave {:?}", name, fx);
                    prop_assert_eq!(&after, &before, "{}: ignored but changed the session", name);
                    seen.ignored.insert(name);
                }
                if was_ended {
                    prop_assert_eq!(&after, &before, "{}: an ended session changed", name);
                }
                if after != before {
                    seen.accepted.insert(name);
                }
                intents_recorded(&s, &fx)?;
                seen.effects.extend(fx.iter().map(effect_name));
                let checkpointed = step.checkpoint || s.header.status.is_terminal();
                if checkpointed {
                    checkpoint(&mut s, &mut stored)?;
                }
                applied.push(Applied {
                    input,
                    now_ms,
                    seed: step.seed,
                    checkpointed,
                });
            }
        }
        no_call_left_open(&s)?;
        seen.statuses.insert(format!("{:?}", s.header.status));
        seen.steps += 1;
    }
    checkpoint(&mut s, &mut stored)?;
    seen.events.extend(stored.events.iter().map(event_name));
    if seen.effects.contains("dispatch") || seen.effects.contains("delegate") {
        seen.deep = 1;
    }

    // The union of the deltas is the session: every entry, event and
    // queue row, the header and the metadata.
    prop_assert_eq!(stored.header.as_ref(), Some(&s.header));
    prop_assert_eq!(&stored.transcript, &s.transcript);
    prop_assert_eq!(
        stored.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=s.header.last_event_seq).collect::<Vec<_>>()
    );
    let q = s.header.queue;
    prop_assert_eq!(
        stored.queue.keys().copied().collect::<Vec<_>>(),
        (q.head..q.next).collect::<Vec<_>>()
    );
    prop_assert!(stored.queue.values().eq(s.inbox.iter()));
    prop_assert_eq!(
        stored.metadata.clone().unwrap_or(Value::Null),
        s.metadata.clone()
    );
    // Read back, it is the session in memory, with nothing to write.
    let read = Session::from_stored(StoredSession {
        header: s.header.clone(),
        transcript: stored.transcript.clone(),
        metadata: stored.metadata.clone().unwrap_or(Value::Null),
        inbox: stored.queue.values().cloned().collect(),
        needs_rewrite: false,
    });
    prop_assert_eq!(
        format!("{:?}", read.to_stored()),
        format!("{:?}", s.to_stored())
    );
    // A session read back has nothing to write: its next checkpoint
    // carries only what happens after.
    let cp = read.checkpoint();
    prop_assert!(!read.is_dirty());
    prop_assert!(
        cp.entries.is_empty()
            && cp.events.is_empty()
            && cp.queued.is_empty()
            && cp.dequeued.is_empty()
            && cp.metadata.is_none(),
        "a session read back would write again: {:?}",
        cp
    );

    // Replay: the accepted inputs, applied again to the initial state with
    // their contexts (and checkpoints), rebuild the same state.
    let mut again = initial;
    for a in applied {
        let ctx = ctx_at(tools, setup.window, a.now_ms, a.seed);
        let replayed = again.apply(a.input, ctx);
        prop_assert!(replayed.is_ok(), "replay refused an accepted input");
        if a.checkpointed {
            again.mark_persisted();
        }
    }
    again.mark_persisted();
    prop_assert_eq!(
        format!("{again:?}"),
        format!("{s:?}"),
        "replay built another state"
    );

    let mut all = cov.lock().unwrap_or_else(|e| e.into_inner());
    all.refused.extend(seen.refused);
    all.ignored.extend(seen.ignored);
    all.accepted.extend(seen.accepted);
    all.effects.extend(seen.effects);
    all.events.extend(seen.events);
    all.statuses.extend(seen.statuses);
    all.steps += seen.steps;
    all.deep += seen.deep;
    Ok(())
}

#[test]
fn the_machine_holds_its_properties_over_random_input_sequences() {
    let tools = registry();
    let coverage = Mutex::new(Coverage::default());
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let outcome = runner.run(&case(), |(setup, steps)| {
        run_case(&tools, &setup, &steps, &coverage)
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }

    // The sequences got deep: every kind of input was refused or ignored
    // somewhere and accepted somewhere, and the turn loop went everywhere.
    let cov = coverage.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "{} cases, {} steps, {} ran a tool or a child",
        CASES, cov.steps, cov.deep
    );
    assert!(
        cov.deep * 3 >= CASES as usize * 2,
        "only {} of {CASES} cases got as far as running a call",
        cov.deep
    );
    for k in REFUSABLE {
        assert!(cov.refused.contains(k), "no {k} was ever refused");
    }
    for k in IGNORABLE {
        assert!(cov.ignored.contains(k), "no {k} was ever ignored");
    }
    for k in REFUSABLE.iter().chain(IGNORABLE.iter()) {
        assert!(cov.accepted.contains(k), "no {k} was ever accepted");
    }
    for e in [
        "stream",
        "compaction",
        "stop_stream",
        "dispatch",
        "dispatch_again",
        "kill_tools",
        "delegate",
        "cancel_child",
        "timer",
        "delta",
    ] {
        assert!(cov.effects.contains(e), "no {e} effect in any sequence");
    }
    for e in [
        "tool_call_proposed",
        "approval_requested",
        "decision_recorded",
        "tool_call_started",
        "tool_call_finished",
        "message_accepted",
        "turn_ended",
        "compacted",
        "error",
        "tool_rule_set",
        "model_changed",
    ] {
        assert!(
            cov.events.contains(e),
            "no {e} event in any sequence: {:?}",
            cov.events
        );
    }
    assert_eq!(
        cov.statuses.len(),
        7,
        "statuses reached: {:?}",
        cov.statuses
    );
}
