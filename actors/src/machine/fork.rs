//! Forking: a new root session whose transcript is another's up to a
//! point of its history, the source left untouched.
//!
//! A point is the source's latest checkpoint, an event sequence number, or
//! a transcript index. Where the point falls inside a step, the fork
//! reopens that step: a call the source had finished by then keeps its
//! recorded result; every other call of the step (pending, approved but not
//! run, running, or run only later by the source) is asked again in the
//! fork, marked `outcome_unknown` when it was running at the point. Nothing
//! the fork inherits is ever run without a person's decision. A running
//! delegation is asked again without its child: forking a session forks the
//! root only, and finished children's results stay as entries.
//!
//! This module is pure: it builds the fork's [`Session`] from what the
//! store read. It deliberately neither reads nor writes (the caller,
//! `Overseer::fork`, does), and knows no tenant: whether the caller may
//! read the source is the edge's to decide.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use super::Session;
use crate::error::SessionError;
use crate::model::{
    CallState, Event, EventKind, ForkOrigin, SessionHeader, SessionId, SessionStatus, StopReason,
    ToolCallId, ToolCallRecord, TranscriptEntry,
};
use crate::store::StoredSession;

/// Where to fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForkAt {
    /// The source's latest checkpoint.
    #[default]
    Latest,
    /// Just after the source's event with this sequence number.
    Seq(u64),
    /// With the source's first `n` transcript entries.
    Index(u64),
}

/// What the caller decides about a fork besides its point.
#[derive(Debug, Clone)]
pub(crate) struct ForkSpec {
    /// The fork's id.
    pub id: SessionId,
    /// Who forked it.
    pub created_by: Option<String>,
    /// Now, ms since the epoch.
    pub now_ms: i64,
    /// The point.
    pub at: ForkAt,
}

/// A point of a session's history a fork can start from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkPoint {
    /// The event marking it (`{"at": seq}` forks there).
    pub seq: u64,
    /// The transcript entries before it (`{"at": {"index": n}}`); for a
    /// result of a step still open in the source, the transcript's length.
    pub index: u64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// What happened there.
    #[serde(flatten)]
    pub kind: ForkPointKind,
}

/// What a fork point is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ForkPointKind {
    /// A turn ended.
    TurnEnded {
        /// Its number.
        turn: u32,
        /// Why.
        stop_reason: StopReason,
    },
    /// A tool call got its result.
    ToolResult {
        /// The call.
        call_id: ToolCallId,
        /// Its tool.
        name: String,
        /// How it ended.
        state: CallState,
    },
}

/// The text every output-schema repair request starts with
/// (`output::repair_request`): such a user entry continues a turn, it does
/// not start one.
const REPAIR_PREFIX: &str = "Your last answer does not match the required JSON Schema:";

/// Indexes of the user entries that started turns, in turn order.
fn turn_starts(transcript: &[Arc<TranscriptEntry>]) -> Vec<usize> {
    transcript
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.as_ref() {
            TranscriptEntry::User { text, .. } if !text.starts_with(REPAIR_PREFIX) => Some(i),
            _ => None,
        })
        .collect()
}

/// Every point of `stored`'s history a fork can start from, in order: each
/// ended turn and each tool result, with their event sequence numbers.
pub(crate) fn fork_points(stored: &StoredSession, events: &[Event]) -> Vec<ForkPoint> {
    let transcript = &stored.transcript;
    let starts = turn_starts(transcript);
    let results: HashMap<&ToolCallId, usize> = transcript
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.as_ref() {
            TranscriptEntry::ToolResult { call } => Some((&call.id, i)),
            _ => None,
        })
        .collect();
    let names: HashMap<&ToolCallId, &str> = transcript
        .iter()
        .filter_map(|e| match e.as_ref() {
            TranscriptEntry::Assistant { tool_calls, .. } => Some(tool_calls),
            _ => None,
        })
        .flatten()
        .map(|c| (&c.id, c.name.as_str()))
        .collect();
    let mut out = Vec::new();
    for e in events {
        let kind = match &e.kind {
            EventKind::TurnEnded {
                turn, stop_reason, ..
            } => {
                let index = starts
                    .get(*turn as usize)
                    .copied()
                    .unwrap_or(transcript.len());
                Some((
                    index,
                    ForkPointKind::TurnEnded {
                        turn: *turn,
                        stop_reason: *stop_reason,
                    },
                ))
            }
            EventKind::ToolCallFinished { call_id, state, .. }
                if *state != CallState::Cancelled =>
            {
                names.get(call_id).map(|name| {
                    let index = results.get(call_id).map_or(transcript.len(), |i| i + 1);
                    (
                        index,
                        ForkPointKind::ToolResult {
                            call_id: call_id.clone(),
                            name: (*name).to_owned(),
                            state: *state,
                        },
                    )
                })
            }
            _ => None,
        };
        if let Some((index, kind)) = kind {
            out.push(ForkPoint {
                seq: e.seq,
                index: index as u64,
                at_ms: e.at_ms,
                kind,
            });
        }
    }
    out
}

/// What the fork starts from, before it is made a session.
struct Cut {
    /// The entries the fork's transcript starts with.
    keep: Vec<Arc<TranscriptEntry>>,
    /// Where the source's transcript was cut (entries past it are not the
    /// fork's: a model change among them did not happen in the fork).
    cut: usize,
    /// The open step's calls, if the point is inside a step.
    open: Vec<ToolCallRecord>,
    status: SessionStatus,
    turn: u32,
    step: u32,
    last_stop: Option<StopReason>,
    output: Option<serde_json::Value>,
    seq: u64,
    /// Whether the source's compaction in flight is the fork's too.
    compacting: bool,
}

impl Session {
    /// The fork of `stored` at `spec.at` (see the module docs). `events` are
    /// the source's events up to at least the point (unused for
    /// [`ForkAt::Latest`]). An index or sequence number past the source's
    /// end is its latest checkpoint.
    pub(crate) fn fork_of(
        stored: &StoredSession,
        events: &[Event],
        spec: ForkSpec,
    ) -> Result<Session, SessionError> {
        let h = &stored.header;
        let len = stored.transcript.len() as u64;
        let cut = match spec.at {
            ForkAt::Seq(s) if s < h.last_event_seq => cut_at_seq(stored, events, s, &spec),
            ForkAt::Index(i) if i < len => {
                let mut cut = cut_at_index(stored, i as usize, &spec);
                // The latest fork point at or before the cut names it.
                cut.seq = fork_points(stored, events)
                    .iter()
                    .filter(|p| p.index <= i)
                    .map(|p| p.seq)
                    .max()
                    .unwrap_or(0);
                cut
            }
            _ => cut_latest(stored, &spec),
        };
        Ok(build(stored, cut, spec))
    }
}

/// A call of the source asked again in the fork.
fn reask(
    record: &ToolCallRecord,
    running: bool,
    spec: &ForkSpec,
    timeout_secs: u64,
) -> ToolCallRecord {
    let mut r = ToolCallRecord::proposed(
        record.id.clone(),
        record.name.clone(),
        record.arguments.clone(),
        record.proposed_at_ms,
    );
    r.state = CallState::AwaitingApproval;
    r.requires_approval = true;
    r.outcome_unknown = running;
    r.approval_deadline_ms = Some(
        spec.now_ms
            .saturating_add((timeout_secs as i64).saturating_mul(1000)),
    );
    // A run the fork's person approves is an effect of its own, not a
    // repeat of the source's (which a tool would answer from its record).
    r.idempotency_key = Some(format!("{}:{}", spec.id, record.id));
    r
}

fn cut_latest(stored: &StoredSession, spec: &ForkSpec) -> Cut {
    let h = &stored.header;
    let timeout = h.config.approval_timeout_secs;
    let open: Vec<ToolCallRecord> = h
        .open_calls
        .iter()
        .map(|c| {
            if c.state.is_terminal() {
                c.clone()
            } else {
                reask(c, c.state == CallState::Running, spec, timeout)
            }
        })
        .collect();
    let asks = open.iter().any(|c| c.state == CallState::AwaitingApproval);
    let status = match h.status {
        _ if asks => SessionStatus::AwaitingApproval,
        SessionStatus::Running | SessionStatus::AwaitingApproval => SessionStatus::Running,
        SessionStatus::Pending => SessionStatus::Pending,
        _ if stored.transcript.is_empty() => SessionStatus::Pending,
        _ => SessionStatus::AwaitingInput,
    };
    Cut {
        keep: stored.transcript.clone(),
        cut: stored.transcript.len(),
        open,
        status,
        turn: h.turn,
        step: h.step,
        last_stop: h.last_stop_reason,
        output: h.output.clone(),
        seq: h.last_event_seq,
        compacting: status == SessionStatus::Running,
    }
}

/// The record of call `id` as the source holds it now.
fn record_of<'a>(stored: &'a StoredSession, id: &ToolCallId) -> Option<&'a ToolCallRecord> {
    stored
        .transcript
        .iter()
        .find_map(|e| match e.as_ref() {
            TranscriptEntry::ToolResult { call } if &call.id == id => Some(call),
            _ => None,
        })
        .or_else(|| stored.header.open_calls.iter().find(|c| &c.id == id))
}

/// Whether an entry is a note beside the conversation (nothing the model
/// or a user said).
fn is_note(e: &TranscriptEntry) -> bool {
    matches!(
        e,
        TranscriptEntry::ModelChanged { .. }
            | TranscriptEntry::ToolRuleSet { .. }
            | TranscriptEntry::SkillActivated { .. }
            | TranscriptEntry::Error { .. }
            | TranscriptEntry::Compaction { .. }
    )
}

/// The step of assistant entry `a` reopened: `done` are the calls it keeps
/// with their results, every other call is asked again (`running`: those
/// running at the point). The entries kept are those before `a`, `a`
/// itself, and the activations of skills by the kept calls.
#[allow(clippy::too_many_arguments)]
fn reopen_step(
    stored: &StoredSession,
    a: usize,
    step_end: usize,
    done: &HashSet<&ToolCallId>,
    running: &HashSet<&ToolCallId>,
    spec: &ForkSpec,
) -> (Vec<Arc<TranscriptEntry>>, Vec<ToolCallRecord>) {
    let t = &stored.transcript;
    let timeout = stored.header.config.approval_timeout_secs;
    let calls = match t[a].as_ref() {
        TranscriptEntry::Assistant { tool_calls, .. } => tool_calls.clone(),
        _ => Vec::new(),
    };
    let open = calls
        .iter()
        .filter_map(|c| {
            let record = record_of(stored, &c.id)?;
            Some(if done.contains(&c.id) && record.state.is_terminal() {
                record.clone()
            } else {
                reask(record, running.contains(&c.id), spec, timeout)
            })
        })
        .collect();
    let mut keep: Vec<Arc<TranscriptEntry>> = t[..=a].to_vec();
    keep.extend(
        t[a + 1..step_end.min(t.len())]
            .iter()
            .filter(|e| {
                matches!(e.as_ref(), TranscriptEntry::SkillActivated { call_id: Some(id), .. } if done.contains(id))
            })
            .cloned(),
    );
    (keep, open)
}

fn cut_at_index(stored: &StoredSession, i: usize, spec: &ForkSpec) -> Cut {
    let t = &stored.transcript;
    let starts = turn_starts(t);
    let turn = starts.iter().filter(|&&s| s < i).count() as u32;
    let turn_begin = starts.iter().rev().find(|&&s| s < i).copied();
    let assistants_before = |end: usize| {
        t[turn_begin.unwrap_or(0)..end]
            .iter()
            .filter(|e| matches!(e.as_ref(), TranscriptEntry::Assistant { .. }))
            .count() as u32
    };
    let last_assistant = t[..i]
        .iter()
        .rposition(|e| matches!(e.as_ref(), TranscriptEntry::Assistant { .. }));
    if let Some(a) = last_assistant {
        if let TranscriptEntry::Assistant { tool_calls, .. } = t[a].as_ref() {
            let present: HashSet<&ToolCallId> = t[a + 1..i]
                .iter()
                .filter_map(|e| match e.as_ref() {
                    TranscriptEntry::ToolResult { call } => Some(&call.id),
                    _ => None,
                })
                .collect();
            if !tool_calls.is_empty() && present.len() < tool_calls.len() {
                let (keep, open) = reopen_step(stored, a, i, &present, &HashSet::new(), spec);
                let asks = open.iter().any(|c| c.state == CallState::AwaitingApproval);
                return Cut {
                    keep,
                    cut: a + 1,
                    open,
                    status: if asks {
                        SessionStatus::AwaitingApproval
                    } else {
                        SessionStatus::Running
                    },
                    turn,
                    step: assistants_before(a + 1),
                    last_stop: None,
                    output: None,
                    seq: 0,
                    compacting: false,
                };
            }
        }
    }
    // A clean cut between steps or turns. It is a turn's end when only
    // notes lie between it and the next turn's start (or the end of a
    // source whose last turn ended).
    let next = starts.iter().find(|&&s| s >= i).copied();
    let source_turn_over = !matches!(
        stored.header.status,
        SessionStatus::Running | SessionStatus::AwaitingApproval
    );
    let ended = match next {
        Some(n) => t[i..n].iter().all(|e| is_note(e)),
        None => source_turn_over && t[i..].iter().all(|e| is_note(e)),
    };
    let status = if turn == 0 {
        SessionStatus::Pending
    } else if ended {
        SessionStatus::AwaitingInput
    } else {
        SessionStatus::Running
    };
    let step = match status {
        SessionStatus::Running => assistants_before(i) + 1,
        _ => 0,
    };
    Cut {
        keep: t[..i].to_vec(),
        cut: i,
        open: Vec::new(),
        status,
        turn,
        step,
        last_stop: None,
        output: None,
        seq: 0,
        compacting: false,
    }
}

fn cut_at_seq(stored: &StoredSession, events: &[Event], s: u64, spec: &ForkSpec) -> Cut {
    let t = &stored.transcript;
    let starts = turn_starts(t);
    let mut turns_started = 0u32;
    let mut turn_started_at = 0u64;
    let mut ended: Option<(u32, StopReason, Option<serde_json::Value>)> = None;
    let mut turns_ended = 0u32;
    let mut steps = 0u32;
    let mut finished: HashSet<&ToolCallId> = HashSet::new();
    let mut started: HashSet<&ToolCallId> = HashSet::new();
    for e in events.iter().take_while(|e| e.seq <= s) {
        match &e.kind {
            EventKind::TurnStarted { .. } => {
                turns_started += 1;
                turn_started_at = e.seq;
                steps = 0;
            }
            EventKind::TurnEnded {
                turn,
                stop_reason,
                output,
                ..
            } => {
                turns_ended += 1;
                ended = Some((*turn, *stop_reason, output.clone()));
            }
            EventKind::AssistantMessage { .. } if e.seq > turn_started_at => steps += 1,
            EventKind::ToolCallStarted { call_id, .. } => {
                started.insert(call_id);
            }
            EventKind::ToolCallFinished { call_id, .. } => {
                finished.insert(call_id);
            }
            _ => {}
        }
    }
    let clean = |cut: usize, status: SessionStatus, step: u32| Cut {
        keep: t[..cut.min(t.len())].to_vec(),
        cut: cut.min(t.len()),
        open: Vec::new(),
        status,
        turn: turns_started,
        step,
        last_stop: None,
        output: None,
        seq: s,
        compacting: false,
    };
    if turns_started == 0 {
        let cut = starts.first().copied().unwrap_or(t.len());
        return clean(cut, SessionStatus::Pending, 0);
    }
    if turns_ended >= turns_started {
        let cut = starts
            .get(turns_started as usize)
            .copied()
            .unwrap_or(t.len());
        let mut c = clean(cut, SessionStatus::AwaitingInput, 0);
        if let Some((_, stop, output)) = ended {
            c.last_stop = Some(stop);
            c.output = output;
        }
        return c;
    }
    // A turn was running at the point.
    let Some(&begin) = starts.get(turns_started as usize - 1) else {
        return cut_latest(stored, spec);
    };
    let end = starts
        .get(turns_started as usize)
        .copied()
        .unwrap_or(t.len());
    let assistants: Vec<usize> = (begin + 1..end)
        .filter(|&i| matches!(t[i].as_ref(), TranscriptEntry::Assistant { .. }))
        .collect();
    let Some(&a) = steps
        .checked_sub(1)
        .and_then(|k| assistants.get(k as usize))
    else {
        // The first step was asked for: the fork asks again.
        let cut = assistants.first().copied().unwrap_or(end);
        return clean(cut, SessionStatus::Running, 1);
    };
    let has_calls = matches!(t[a].as_ref(), TranscriptEntry::Assistant { tool_calls, .. } if !tool_calls.is_empty());
    if !has_calls {
        return clean(a + 1, SessionStatus::Running, steps + 1);
    }
    let step_end = (a + 1..end)
        .find(|&i| {
            matches!(
                t[i].as_ref(),
                TranscriptEntry::Assistant { .. } | TranscriptEntry::User { .. }
            )
        })
        .unwrap_or(end);
    let running: HashSet<&ToolCallId> = started.difference(&finished).copied().collect();
    let (keep, open) = reopen_step(stored, a, step_end, &finished, &running, spec);
    let asks = open.iter().any(|c| c.state == CallState::AwaitingApproval);
    Cut {
        keep,
        cut: a + 1,
        open,
        status: if asks {
            SessionStatus::AwaitingApproval
        } else {
            SessionStatus::Running
        },
        turn: turns_started,
        step: steps,
        last_stop: None,
        output: None,
        seq: s,
        compacting: false,
    }
}

fn build(stored: &StoredSession, cut: Cut, spec: ForkSpec) -> Session {
    let src = &stored.header;
    let mut config = src.config.clone();
    // A model change past the point did not happen in the fork.
    let later_change = stored.transcript[cut.cut..]
        .iter()
        .find_map(|e| match e.as_ref() {
            TranscriptEntry::ModelChanged { from, .. } => Some(from.clone()),
            _ => None,
        });
    if let Some(model) = later_change {
        let c = config.make_mut();
        c.model = model;
        c.route = None;
    }
    let mut header = SessionHeader::new(
        spec.id,
        src.tenant.clone(),
        src.agent.clone(),
        config,
        spec.now_ms,
    );
    header.created_by = spec.created_by.clone();
    header.title.clone_from(&src.title);
    header.auto_complete = src.auto_complete;
    header.task.clone_from(&src.task);
    header.forked_from = Some(ForkOrigin {
        session: src.id,
        at: cut.seq,
        index: cut.keep.len() as u64,
    });
    header.turn = cut.turn;
    header.step = cut.step;
    header.last_stop_reason = cut.last_stop;
    header.output = cut.output;
    header.context.tokens_per_kchar = src.context.tokens_per_kchar;
    header.context.summary_at = cut
        .keep
        .iter()
        .rposition(|e| matches!(e.as_ref(), TranscriptEntry::Compaction { .. }))
        .map(|i| i as u64);
    if cut.compacting {
        header.context.compacting_through = src.context.compacting_through;
        header.context.output_repaired = src.context.output_repaired;
    }
    for e in &cut.keep {
        if let TranscriptEntry::ToolRuleSet { tool, rule, .. } = e.as_ref() {
            header.tool_rules.insert(tool.clone(), *rule);
        }
    }
    let mut session = Session::new(header).with_metadata(stored.metadata.clone());
    session.transcript = cut.keep;
    session.header.transcript_len = session.transcript.len() as u64;
    for call in &cut.open {
        if call.state == CallState::AwaitingApproval {
            session.emit(
                EventKind::ApprovalRequested {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    outcome_unknown: call.outcome_unknown,
                },
                spec.now_ms,
            );
        }
    }
    session.header.open_calls = cut.open;
    if cut.status != SessionStatus::Pending {
        session.header.status = cut.status;
        session.emit(EventKind::StatusChanged { status: cut.status }, spec.now_ms);
    }
    session
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repair_request_is_not_a_turn_start() {
        let text = super::super::output::repair_request("/n: wrong");
        assert!(
            text.starts_with(REPAIR_PREFIX),
            "the repair request's wording changed: forks must still tell it from a turn's start"
        );
    }
}
