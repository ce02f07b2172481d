//! One ACP session's link to its overseer session: a follower task that turns
//! the session's events into `session/update` notifications, hands calls
//! waiting for a decision to the approver (`permission.rs`), and completes the
//! prompt waiting for its turn's end.
//!
//! The follower runs for as long as the client has the session open, not per
//! prompt: a turn resumed after `session/load` streams (and asks) with no
//! prompt waiting. It deliberately decides nothing itself.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{SessionNotification, SessionUpdate};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;

use overseer_actors::model::{
    CallState, Event, EventKind, Notification, SessionId, SessionStatus, StopReason, ToolCallId,
    ToolCallRecord, Usage,
};

use super::permission::{self, Ask};
use super::sessions::{Feed, Pending, Sessions};
use super::updates;
use crate::service::descendants;

/// How often the follower reads the session's stored events besides the
/// live stream: an actor restarted after a checkpoint never publishes that
/// checkpoint's events, and the store has them. (In remote mode this reads
/// nothing: the server's stream fills its own gaps.)
const STORE_POLL: Duration = Duration::from_secs(1);

/// How a turn ended, for the prompt waiting for it.
#[derive(Debug)]
pub(crate) enum TurnOutcome {
    /// The turn ended with this reason and cumulative usage.
    Ended {
        /// Why.
        reason: StopReason,
        /// Usage after the turn (cumulative).
        usage: Usage,
        /// The last error the session reported, if any.
        error: Option<String>,
    },
    /// The session ended (failed, cancelled, completed) outside a turn's end.
    SessionEnded(SessionStatus, Option<String>),
}

/// The prompt waiting for the end of turn `turn` (or a later one).
struct Waiter {
    turn: u32,
    tx: oneshot::Sender<TurnOutcome>,
}

/// The live side of one ACP session.
pub(crate) struct Link {
    waiter: Arc<Mutex<Option<Waiter>>>,
    follower: JoinHandle<()>,
    approver: JoinHandle<()>,
    children: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.follower.abort();
        self.approver.abort();
        self.children.abort();
    }
}

/// A prompt already waits for this session's turn.
#[derive(Debug)]
pub(crate) struct Busy;

impl Link {
    /// Starts following `id` from its event `after_seq` on `rx` (subscribed
    /// before `after_seq` was read, so nothing falls in between). `open`:
    /// its calls already waiting for a decision, asked first.
    pub(crate) fn start(
        sessions: Sessions,
        cx: ConnectionTo<Client>,
        id: SessionId,
        rx: Feed,
        after_seq: u64,
        open: &[ToolCallRecord],
        by: String,
    ) -> Self {
        let (ask_tx, ask_rx) = mpsc::unbounded_channel();
        for call in open
            .iter()
            .filter(|c| c.state == overseer_actors::model::CallState::AwaitingApproval)
        {
            let _ = ask_tx.send(Ask::of(
                id,
                call.id.clone(),
                &call.name,
                call.run_arguments(),
                None,
                Some(after_seq),
            ));
        }
        let waiter = Arc::new(Mutex::new(None));
        let follower = Follower {
            sessions: sessions.clone(),
            cx: cx.clone(),
            id,
            ask: ask_tx.clone(),
            waiter: waiter.clone(),
            last_seq: after_seq,
            open: open.iter().map(|c| c.id.clone()).collect(),
            printed: String::new(),
            resync: false,
            last_error: None,
        };
        let children = tokio::spawn(watch_children(
            sessions.clone(),
            id,
            sessions.subscribe(id).after(after_seq),
            ask_tx,
        ));
        Self {
            waiter,
            follower: tokio::spawn(follower.run(rx.after(after_seq))),
            approver: tokio::spawn(permission::approve(sessions, cx, id, ask_rx, by)),
            children,
        }
    }

    /// Registers the prompt waiting for turn `turn`; refused while another
    /// prompt of the session waits.
    pub(crate) fn wait_for(&self, turn: u32) -> Result<oneshot::Receiver<TurnOutcome>, Busy> {
        let mut slot = self.waiter.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|w| !w.tx.is_closed()) {
            return Err(Busy);
        }
        let (tx, rx) = oneshot::channel();
        *slot = Some(Waiter { turn, tx });
        Ok(rx)
    }

    /// Forgets the waiting prompt (its message was refused).
    pub(crate) fn stop_waiting(&self) {
        self.waiter.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

struct Follower {
    sessions: Sessions,
    cx: ConnectionTo<Client>,
    id: SessionId,
    ask: mpsc::UnboundedSender<Ask>,
    waiter: Arc<Mutex<Option<Waiter>>>,
    last_seq: u64,
    /// Calls announced and not yet finished: a turn that stops (interrupt,
    /// cancel) ends them without an event each, and the editor must not
    /// show them pending forever.
    open: HashSet<ToolCallId>,
    /// Text of the current step already sent.
    printed: String,
    /// Deltas may have been lost (lagged): send the rest of the step's text
    /// from its stored message.
    resync: bool,
    last_error: Option<String>,
}

impl Follower {
    async fn run(mut self, mut rx: Feed) {
        let mut poll = tokio::time::interval(STORE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.reset();
        loop {
            tokio::select! {
                n = rx.recv() => match n {
                    Ok(Notification::TextDelta { text, .. }) => {
                        self.printed.push_str(&text);
                        self.send(updates::agent_chunk(text));
                    }
                    Ok(Notification::Event(event)) => {
                        if event.seq > self.last_seq + 1 {
                            self.catch_up().await;
                        }
                        self.event(event);
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.resync = true;
                        self.catch_up().await;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = poll.tick() => self.catch_up().await,
            }
        }
    }

    async fn catch_up(&mut self) {
        match self.sessions.events_after(self.id, self.last_seq).await {
            Ok(events) => events.into_iter().for_each(|e| self.event(e)),
            Err(e) => tracing::warn!(session = %self.id, "cannot read stored events: {e}"),
        }
    }

    fn send(&self, update: SessionUpdate) {
        let note = SessionNotification::new(self.id.to_string(), update);
        if let Err(e) = self.cx.send_notification(note) {
            tracing::debug!(session = %self.id, "cannot send an update: {e:?}");
        }
    }

    fn event(&mut self, event: Event) {
        // Events read from the store may repeat live ones.
        if event.seq <= self.last_seq {
            return;
        }
        self.last_seq = event.seq;
        match event.kind {
            EventKind::AssistantMessage { text, .. } => {
                if self.resync {
                    let rest = text.strip_prefix(self.printed.as_str()).unwrap_or(&text);
                    if !rest.is_empty() {
                        self.send(updates::agent_chunk(rest));
                    }
                    self.resync = false;
                }
                self.printed.clear();
            }
            EventKind::ToolCallProposed {
                call_id,
                name,
                arguments,
            } => {
                self.send(updates::proposed(
                    call_id.as_str(),
                    &name,
                    name.clone(),
                    &arguments,
                ));
                self.open.insert(call_id);
            }
            EventKind::ApprovalRequested {
                call_id,
                name,
                arguments,
                ..
            } => {
                let _ = self.ask.send(Ask::of(
                    self.id,
                    call_id,
                    &name,
                    &arguments,
                    None,
                    Some(self.last_seq),
                ));
            }
            EventKind::ToolCallStarted { call_id, .. } => {
                self.send(updates::started(call_id.as_str()))
            }
            EventKind::ToolCallFinished {
                call_id,
                state,
                result,
            } => {
                self.open.remove(&call_id);
                self.send(updates::finished(call_id.as_str(), state, &result));
            }
            EventKind::Error { message } => self.last_error = Some(message),
            // A skill's instructions joined the conversation: the
            // editor is told, in the agent's words.
            EventKind::SkillActivated { name, .. } => {
                self.send(updates::agent_chunk(format!("[skill {name} is active]\n")))
            }
            EventKind::TurnEnded {
                turn,
                stop_reason,
                usage,
                ..
            } => {
                self.end_open_calls(stop_reason.as_str());
                let error = self.last_error.take();
                self.complete(turn, || TurnOutcome::Ended {
                    reason: stop_reason,
                    usage,
                    error,
                });
            }
            EventKind::StatusChanged { status } if status.is_terminal() => {
                self.end_open_calls(status.as_str());
                let error = self.last_error.take();
                self.complete(u32::MAX, || TurnOutcome::SessionEnded(status, error));
            }
            _ => {}
        }
    }

    /// Ends, for the editor, the calls the turn left without a result.
    fn end_open_calls(&mut self, why: &str) {
        let result = serde_json::json!({ "error": format!("the turn ended: {why}") });
        for id in std::mem::take(&mut self.open) {
            self.send(updates::finished(
                id.as_str(),
                CallState::Cancelled,
                &result,
            ));
        }
    }

    /// Answers the waiting prompt if it waits for `turn` or an earlier one.
    fn complete(&self, turn: u32, outcome: impl FnOnce() -> TurnOutcome) {
        let mut slot = self.waiter.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|w| w.turn <= turn) {
            if let Some(w) = slot.take() {
                let _ = w.tx.send(outcome());
            }
        }
    }
}

/// Hands the approver every pending approval of a descendant of `root`
/// (its own calls are announced by its events), each once while it is
/// pending.
async fn watch_children(
    sessions: Sessions,
    root: SessionId,
    rx: Feed,
    ask: mpsc::UnboundedSender<Ask>,
) {
    let list = move || {
        let sessions = sessions.clone();
        async move { sessions.pending_approvals(root).await }
    };
    descendants::watch(root, rx, list, |p: Pending| {
        let path = p
            .path
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" > ");
        let _ = ask.send(Ask::of(
            p.session,
            p.call,
            &p.name,
            &p.arguments,
            Some(path),
            None,
        ));
    })
    .await;
}
