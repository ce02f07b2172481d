//! Approvals as `session/request_permission`: each call that waits for a
//! decision is put to the client as a request of its own, with allow-once,
//! allow-always, reject-once and reject-always. Requests for different calls
//! are independent: one the client leaves unanswered holds up no other. The
//! choice becomes a decision submitted at the root session, audited as from
//! the ACP client (`acp:<client name>`; in remote mode as the server's token
//! subject, which the server takes from the token); an always-choice first
//! becomes the owning session's standing rule for that tool
//! (`set_tool_rule`), so it holds for later calls, and after a restart, and
//! settles the calls of that tool still being asked.
//!
//! While a request is open its call is watched (`watch.rs`): decided
//! elsewhere (another editor, the HTTP API or CLI, the inbox, a standing
//! rule, the approval timeout) or ended with its turn (`session/cancel`, an
//! interrupt, a failure), the request is withdrawn with `$/cancel_request`
//! and whatever the client answers later is dropped. A request the client
//! answers `cancelled` (it cancelled the prompt) decides nothing: the
//! interrupt that follows settles the call.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::{Id, JoinSet};

use overseer_actors::model::{Decision, PromptClosed, SessionId, Submission, ToolCallId, ToolRule};

use super::sessions::Sessions;
use super::updates;
use super::watch::CallWatch;

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
    /// The owner's event that asked (or the state the call was read from,
    /// waiting); `None`: look at the owner's state first.
    after: Option<u64>,
}

impl Ask {
    pub(crate) fn of(
        session: SessionId,
        call: ToolCallId,
        name: &str,
        arguments: &Value,
        path: Option<String>,
        after: Option<u64>,
    ) -> Self {
        Self {
            session,
            call,
            name: name.to_owned(),
            arguments: arguments.clone(),
            path,
            after,
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

/// How one request ended.
enum Answer {
    /// The client chose this option.
    Chose(String),
    /// The client answered `cancelled`.
    Cancelled,
    /// The call stopped waiting before the client answered (the request was
    /// withdrawn, or never sent).
    Closed(PromptClosed),
    /// The request failed (the client answered an error, the connection
    /// closed).
    Failed(String),
}

/// Asks the client about each call of `root`'s tree, each in a request of
/// its own, and submits the answers. `by` names the client in the audit
/// trail. Holds one task per open request, each ended by its answer or its
/// withdrawal; dropping this future aborts them (and the SDK withdraws what
/// they left open).
pub(crate) async fn approve(
    sessions: Sessions,
    cx: ConnectionTo<Client>,
    root: SessionId,
    mut asks: mpsc::UnboundedReceiver<Ask>,
    by: String,
) {
    // The calls being asked, and the task asking each.
    let mut open: HashMap<ToolCallId, (Ask, Id)> = HashMap::new();
    let mut requests: JoinSet<(ToolCallId, Answer)> = JoinSet::new();
    // Rules chosen on this connection: calls asked after the choice but
    // before the session applied it are settled by it without asking again.
    let mut rules: HashMap<(SessionId, String), ToolRule> = HashMap::new();
    loop {
        tokio::select! {
            ask = asks.recv() => {
                let Some(ask) = ask else { return };
                if open.contains_key(&ask.call) {
                    continue;
                }
                if let Some(&rule) = rules.get(&(ask.session, ask.name.clone())) {
                    submit(&sessions, root, &ask, rule_decision(rule, &by), &by).await;
                    continue;
                }
                let task = requests.spawn(put(sessions.clone(), cx.clone(), root, ask.clone()));
                open.insert(ask.call.clone(), (ask, task.id()));
            }
            Some(done) = requests.join_next() => {
                let (call, answer) = match done {
                    Ok(done) => done,
                    Err(e) => {
                        tracing::warn!("a permission request's task stopped: {e}");
                        open.retain(|_, (_, task)| *task != e.id());
                        continue;
                    }
                };
                let Some((ask, _)) = open.remove(&call) else { continue };
                match answer {
                    Answer::Chose(choice) => {
                        answered(&sessions, root, &ask, &choice, &by, &mut rules, &open).await;
                    }
                    Answer::Cancelled => {}
                    Answer::Closed(why) => {
                        tracing::info!(call = %call, "permission request closed: {why}");
                    }
                    Answer::Failed(e) => {
                        tracing::warn!(call = %call, "permission request failed: {e}");
                    }
                }
            }
        }
    }
}

/// Puts one call to the client, unless it already does not wait, and
/// withdraws the request once the call stops waiting.
async fn put(
    sessions: Sessions,
    cx: ConnectionTo<Client>,
    root: SessionId,
    ask: Ask,
) -> (ToolCallId, Answer) {
    let mut watch = match CallWatch::start(&sessions, ask.session, &ask.call, ask.after).await {
        Ok(watch) => watch,
        Err(closed) => return (ask.call, Answer::Closed(closed)),
    };
    let fields = ToolCallUpdateFields::new()
        .title(updates::title(&ask.title()))
        .kind(updates::kind(&ask.name))
        .status(ToolCallStatus::Pending)
        .content(updates::call_content(&ask.name, &ask.arguments))
        .raw_input(ask.arguments.clone());
    let request = cx.send_request(RequestPermissionRequest::new(
        root.to_string(),
        ToolCallUpdate::new(ask.call.as_str().to_owned(), fields),
        options(),
    ));
    let withdraw = request.cancellation_handle();
    let answer = tokio::select! {
        response = request.block_task() => match response {
            Ok(response) => match response.outcome {
                RequestPermissionOutcome::Selected(s) => Answer::Chose(s.option_id.0.to_string()),
                _ => Answer::Cancelled,
            },
            Err(e) => Answer::Failed(format!("{e:?}")),
        },
        closed = watch.closed() => {
            // The protocol's withdrawal; the client still answers (its
            // answer, or -32800), and that answer is dropped with the
            // request's future.
            if let Err(e) = withdraw.cancel() {
                tracing::debug!(call = %ask.call, "cannot withdraw the permission request: {e:?}");
            }
            Answer::Closed(closed)
        }
    };
    (ask.call, answer)
}

/// Acts on the client's choice for `ask`: an always-choice becomes the
/// owner's rule and settles the other open requests of that tool; then the
/// decision is submitted.
async fn answered(
    sessions: &Sessions,
    root: SessionId,
    ask: &Ask,
    choice: &str,
    by: &str,
    rules: &mut HashMap<(SessionId, String), ToolRule>,
    open: &HashMap<ToolCallId, (Ask, Id)>,
) {
    let rule = match choice {
        ALLOW_ALWAYS => Some(ToolRule::Allow),
        REJECT_ALWAYS => Some(ToolRule::Reject),
        _ => None,
    };
    let decision = match choice {
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
    let Some(rule) = rule else {
        submit(sessions, root, ask, decision, by).await;
        return;
    };
    rules.insert((ask.session, ask.name.clone()), rule);
    if let Err(e) = sessions
        .set_tool_rule(ask.session, &ask.name, rule, Some(by.to_owned()))
        .await
    {
        tracing::warn!(tool = %ask.name, "cannot record the rule: {e}");
    }
    submit(sessions, root, ask, decision, by).await;
    // Their requests are withdrawn when the decisions are recorded.
    for (other, _) in open.values() {
        if other.session == ask.session && other.name == ask.name {
            submit(sessions, root, other, rule_decision(rule, by), by).await;
        }
    }
}

/// The decision a rule chosen in the editor gives.
fn rule_decision(rule: ToolRule, by: &str) -> Decision {
    match rule {
        ToolRule::Allow => Decision::approve(),
        ToolRule::Reject => Decision::deny(format!("rejected in the editor ({by})")),
    }
}

async fn submit(sessions: &Sessions, root: SessionId, ask: &Ask, decision: Decision, by: &str) {
    let mut submission = Submission::one(ask.call.clone(), decision);
    submission.approved_by = Some(by.to_owned());
    if let Err(e) = sessions.submit(root, submission).await {
        // Decided elsewhere (cancel, timeout): the events tell the rest.
        tracing::info!(call = %ask.call.as_str(), "decision not submitted: {e}");
    }
}
