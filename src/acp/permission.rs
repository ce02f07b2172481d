//! Approvals as `session/request_permission`: each call that waits for a
//! decision is put to the client, one at a time, with allow-once,
//! allow-always, reject-once and reject-always. The choice becomes a
//! decision submitted at the root session, audited as from the ACP client
//! (`acp:<client name>`; in remote mode as the server's token subject, which
//! the server takes from the token); an always-choice first becomes the
//! owning session's standing rule for that tool (`set_tool_rule`), so it
//! holds for later calls, and after a restart.
//!
//! A cancelled request (the client cancelled the prompt) decides nothing:
//! the interrupt that follows settles the call.

use std::collections::{HashMap, HashSet};

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use serde_json::Value;
use tokio::sync::mpsc;

use overseer_actors::model::{Decision, SessionId, Submission, ToolCallId, ToolRule};

use super::sessions::Sessions;
use super::updates;

/// Option ids, as the client returns them.
const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";
const REJECT_ALWAYS: &str = "reject_always";

/// A call waiting for a decision.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    /// The session that owns the call (the root's, or a subagent's).
    session: SessionId,
    call: ToolCallId,
    name: String,
    arguments: Value,
    /// For a subagent's call: the sessions from the root down to it.
    path: Option<String>,
}

impl Ask {
    pub(crate) fn of(
        session: SessionId,
        call: ToolCallId,
        name: &str,
        arguments: &Value,
        path: Option<String>,
    ) -> Self {
        Self {
            session,
            call,
            name: name.to_owned(),
            arguments: arguments.clone(),
            path,
        }
    }

    fn title(&self) -> String {
        match &self.path {
            Some(path) => format!("{} (subagent session {path})", self.name),
            None => self.name.clone(),
        }
    }
}

/// The four choices of every request.
fn options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new(
            ALLOW_ALWAYS,
            "Always allow",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        PermissionOption::new(
            REJECT_ALWAYS,
            "Always reject",
            PermissionOptionKind::RejectAlways,
        ),
    ]
}

/// Asks the client about each call of `root`'s tree in turn, and submits
/// the answers. `by` names the client in the audit trail.
pub(crate) async fn approve(
    sessions: Sessions,
    cx: ConnectionTo<Client>,
    root: SessionId,
    mut asks: mpsc::UnboundedReceiver<Ask>,
    by: String,
) {
    let mut asked = HashSet::new();
    // Rules chosen on this connection: calls queued behind the choice are
    // settled by it without asking again (the session applies it to later
    // ones itself).
    let mut rules: HashMap<(SessionId, String), ToolRule> = HashMap::new();
    while let Some(ask) = asks.recv().await {
        if !asked.insert(ask.call.clone()) {
            continue;
        }
        let choice = match rules.get(&(ask.session, ask.name.clone())) {
            Some(ToolRule::Allow) => ALLOW_ONCE.to_owned(),
            Some(ToolRule::Reject) => REJECT_ONCE.to_owned(),
            None => {
                let fields = ToolCallUpdateFields::new()
                    .title(updates::title(&ask.title()))
                    .kind(updates::kind(&ask.name))
                    .status(ToolCallStatus::Pending)
                    .content(updates::call_content(&ask.name, &ask.arguments))
                    .raw_input(ask.arguments.clone());
                let request = RequestPermissionRequest::new(
                    root.to_string(),
                    ToolCallUpdate::new(ask.call.as_str().to_owned(), fields),
                    options(),
                );
                match cx.send_request(request).block_task().await {
                    Ok(response) => match response.outcome {
                        RequestPermissionOutcome::Selected(s) => s.option_id.0.to_string(),
                        // The prompt was cancelled: its interrupt settles the call.
                        _ => continue,
                    },
                    Err(e) => {
                        tracing::warn!(call = %ask.call.as_str(), "permission request failed: {e:?}");
                        continue;
                    }
                }
            }
        };
        let rule = match choice.as_str() {
            ALLOW_ALWAYS => Some(ToolRule::Allow),
            REJECT_ALWAYS => Some(ToolRule::Reject),
            _ => None,
        };
        if let Some(rule) = rule {
            rules.insert((ask.session, ask.name.clone()), rule);
            if let Err(e) = sessions
                .set_tool_rule(ask.session, &ask.name, rule, Some(by.clone()))
                .await
            {
                tracing::warn!(tool = %ask.name, "cannot record the rule: {e}");
            }
        }
        let decision = match choice.as_str() {
            ALLOW_ONCE | ALLOW_ALWAYS => Decision::approve(),
            REJECT_ONCE | REJECT_ALWAYS => Decision::deny(format!("rejected in the editor ({by})")),
            other => {
                tracing::warn!(
                    option = other,
                    "the client chose an option it was not offered"
                );
                Decision::deny(format!("unknown choice '{other}' from the editor ({by})"))
            }
        };
        let mut submission = Submission::one(ask.call.clone(), decision);
        submission.approved_by = Some(by.clone());
        if let Err(e) = sessions.submit(root, submission).await {
            // Decided elsewhere (cancel, timeout): the events tell the rest.
            tracing::info!(call = %ask.call.as_str(), "decision not submitted: {e}");
        }
    }
}
