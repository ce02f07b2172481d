//! Skills in a session: which calls of `activate_skill` and
//! `read_skill_resource` are answered without running, how an activation
//! enters the transcript, and where requests carry the activated bodies.
//!
//! An activation is a `skill_activated` transcript entry holding the body,
//! whoever activated it (the model through `activate_skill`, or a person).
//! The session's active skills are exactly those entries, so they are kept
//! across restarts (entries are checkpointed) and copied by a fork. Requests
//! carry each body as a message of its own, after the step it was activated
//! in (never between a call and its result), and keep it whole through
//! compaction: a summary never stands for a skill's instructions.
//!
//! This module deliberately knows no skill catalog: the body comes with the
//! input (a person's activation) or in the tool's result (the model's), and
//! whether a skill needs a person's trust is `activate_skill`'s to say.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Ctx, Session};
use crate::error::SessionError;
use crate::model::{EventKind, ToolCallId, ToolCallRecord, TranscriptEntry};
use crate::skills::{ACTIVATED, ACTIVATE_SKILL, ALREADY_ACTIVE, READ_SKILL_RESOURCE};

impl Session {
    #[cfg(test)]
    /// The names of the skills active in this session, in activation order.
    pub(crate) fn active_skills(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for e in &self.transcript {
            if let TranscriptEntry::SkillActivated { name, .. } = e.as_ref() {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        names
    }

    fn skill_is_active(&self, name: &str) -> bool {
        self.transcript.iter().any(
            |e| matches!(e.as_ref(), TranscriptEntry::SkillActivated { name: n, .. } if n == name),
        )
    }

    fn skill_unavailable(&self, name: &str) -> Option<Value> {
        let skills = &self.header.config.skills;
        if skills.iter().any(|s| s == name) {
            return None;
        }
        let available = if skills.is_empty() {
            "none".to_owned()
        } else {
            skills.join(", ")
        };
        Some(json!({"error": format!(
            "skill '{name}' is not available in this session (available: {available})"
        )}))
    }

    /// The answer to a skill call that needs no run: a skill this session
    /// may not use, a resource of a skill not active yet, or a skill already
    /// active. `None`: the call goes on (policy, then its tool).
    pub(super) fn settle_skill_call(&self, call: &ToolCallRecord) -> Option<Result<Value, Value>> {
        if call.name != ACTIVATE_SKILL && call.name != READ_SKILL_RESOURCE {
            return None;
        }
        let name = call
            .arguments
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(error) = self.skill_unavailable(name) {
            return Some(Err(error));
        }
        let active = self.skill_is_active(name);
        match call.name.as_str() {
            ACTIVATE_SKILL if active => Some(Ok(json!({
                "skill": name,
                "status": ALREADY_ACTIVE,
                "note": "its instructions are already in this conversation"
            }))),
            READ_SKILL_RESOURCE if !active => Some(Err(json!({"error": format!(
                "skill '{name}' is not active: activate it with {ACTIVATE_SKILL} first, then read the files its instructions point at"
            )}))),
            _ => None,
        }
    }

    /// The result of an `activate_skill` call that ran: an activation's
    /// body leaves the result and joins the transcript as its own entry (a
    /// second activation of the same skill in one step is "already
    /// active").
    pub(super) fn skill_activated_by_call(
        &mut self,
        call_id: &ToolCallId,
        result: Result<Value, Value>,
        ctx: Ctx<'_>,
    ) -> Result<Value, Value> {
        let Ok(value) = result else {
            return result;
        };
        let (Some(name), Some(status), Some(body)) = (
            value.get("skill").and_then(Value::as_str),
            value.get("status").and_then(Value::as_str),
            value.get("instructions").and_then(Value::as_str),
        ) else {
            return Ok(value);
        };
        if status != ACTIVATED {
            return Ok(value);
        }
        let name = name.to_owned();
        if self.skill_is_active(&name) {
            return Ok(json!({"skill": name, "status": ALREADY_ACTIVE}));
        }
        self.push_entry(TranscriptEntry::SkillActivated {
            name: name.clone(),
            body: body.to_owned(),
            by: None,
            call_id: Some(call_id.clone()),
            at_ms: ctx.now_ms,
        });
        self.emit(
            EventKind::SkillActivated {
                name: name.clone(),
                by: None,
            },
            ctx.now_ms,
        );
        Ok(json!({
            "skill": name,
            "status": ACTIVATED,
            "note": "its instructions follow in the conversation"
        }))
    }

    /// A person activates a skill this session may use (any time before
    /// the session ends; trust is a person's to give).
    pub(super) fn on_activate_skill(
        &mut self,
        name: String,
        body: String,
        by: Option<String>,
        ctx: Ctx<'_>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        if let Some(error) = self.skill_unavailable(&name) {
            let message = error
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("not available")
                .to_owned();
            return Err(SessionError::Invalid(format!("name: {message}")));
        }
        if self.skill_is_active(&name) {
            return Err(SessionError::Conflict(format!(
                "skill '{name}' is already active in session {}",
                self.header.id
            )));
        }
        self.push_entry(TranscriptEntry::SkillActivated {
            name: name.clone(),
            body,
            by: by.clone(),
            call_id: None,
            at_ms: ctx.now_ms,
        });
        self.emit(EventKind::SkillActivated { name, by }, ctx.now_ms);
        Ok(())
    }
}

/// Where requests carry activated skills: an activation recorded while a
/// step's calls ran (by the step's own `activate_skill`, or by a person
/// meanwhile) follows that step's results, since a model's call and its
/// result must stay together.
pub(super) fn after_their_steps(view: Vec<Arc<TranscriptEntry>>) -> Vec<Arc<TranscriptEntry>> {
    if !view
        .iter()
        .any(|e| matches!(e.as_ref(), TranscriptEntry::SkillActivated { .. }))
    {
        return view;
    }
    let mut out = Vec::with_capacity(view.len());
    let mut waiting: Vec<ToolCallId> = Vec::new();
    let mut held: Vec<Arc<TranscriptEntry>> = Vec::new();
    for entry in view {
        match entry.as_ref() {
            TranscriptEntry::SkillActivated { .. } if !waiting.is_empty() => held.push(entry),
            TranscriptEntry::ToolResult { call } => {
                waiting.retain(|id| id != &call.id);
                out.push(entry);
                if waiting.is_empty() {
                    out.append(&mut held);
                }
            }
            TranscriptEntry::Assistant { tool_calls, .. } => {
                out.append(&mut held);
                waiting = tool_calls.iter().map(|c| c.id.clone()).collect();
                out.push(entry);
            }
            _ => out.push(entry),
        }
    }
    out.append(&mut held);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AgentConfig, SessionHeader, SessionId, SCHEMA_VERSION};
    use crate::store::StoredSession;

    /// Version 4 only adds: a version 3 snapshot (no skills, tasks, task or
    /// forked_from, no skill entries) reads as it is, with nothing active,
    /// and its next checkpoint says version 4.
    #[test]
    fn a_version_3_snapshot_is_read_and_written_as_4() {
        let header = SessionHeader::new(
            SessionId(uuid::Uuid::from_u128(3)),
            "t".into(),
            "a".into(),
            AgentConfig::new("a", &[]).effective(),
            1,
        );
        let mut v3 = serde_json::to_value(&header).unwrap();
        v3["schema_version"] = json!(3);
        for key in ["task", "forked_from"] {
            assert!(v3.get(key).is_none(), "{key} is written only when set");
        }
        for key in ["skills", "tasks"] {
            assert!(
                v3["config"].get(key).is_none(),
                "{key} is written only when set"
            );
        }
        let read: SessionHeader = serde_json::from_value(v3).unwrap();
        assert_eq!(read.schema_version, 3);
        assert!(read.task.is_none() && read.forked_from.is_none());
        assert!(read.config.skills.is_empty() && read.config.tasks.is_empty());
        let entries: Vec<TranscriptEntry> = serde_json::from_value(json!([
            {"role": "user", "text": "hi", "at_ms": 1},
            {"role": "assistant", "text": "hello", "at_ms": 2}
        ]))
        .unwrap();
        let entries: Vec<Arc<TranscriptEntry>> = entries.into_iter().map(Arc::new).collect();
        let session = Session::from_stored(StoredSession {
            header: read,
            transcript: entries,
            metadata: Value::Null,
            inbox: Vec::new(),
            needs_rewrite: false,
        });
        assert!(session.active_skills().is_empty());
        assert_eq!(session.checkpoint().header.schema_version, SCHEMA_VERSION);
        assert_eq!(SCHEMA_VERSION, 4);
    }
}
