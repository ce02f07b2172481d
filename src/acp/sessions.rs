//! Where the ACP agent's sessions live: in this process ([`Overseer`], the
//! runtime `overseer acp` opens on its own store) or in a running
//! `overseer serve` (or cluster) reached over its HTTP API and event stream
//! (`overseer acp --server URL`). The agent, its followers and its approver
//! speak to [`Sessions`] only, so both modes share every line of ACP logic.
//!
//! This module owns the mapping of each call onto the two back ends, and the
//! remote event feed (`GET /v1/sessions/{id}/events`, resumed with
//! `Last-Event-ID`). It deliberately holds no session logic of its own: the
//! remote server checks and decides exactly what it would for any HTTP
//! client (its token's tenant and scopes; decisions and rules are audited as
//! the token's subject, not as the ACP client).

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::Error;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use overseer_actors::model::{
    Event, Notification, SessionHeader, SessionId, Submission, ToolCallId, ToolRule,
    TranscriptEntry,
};
use overseer_actors::store::StoredSession;
use overseer_actors::{CreateSession, Overseer, SessionError};

use crate::cli::client::{Client, ClientError};
use crate::service::descendants;

/// Live notifications buffered per remote feed before the reader waits.
const FEED_BUFFER: usize = 1024;
/// Pause before a remote event stream that ended is opened again.
const RECONNECT: Duration = Duration::from_secs(1);
/// Longest [`Feed::connected`] waits for the server's stream to open.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// The sessions the agent serves.
#[derive(Clone)]
pub(crate) enum Sessions {
    /// In this process.
    Local(Overseer),
    /// In a server, over HTTP.
    Remote(Client),
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    /// The local session API.
    #[error(transparent)]
    Local(#[from] SessionError),
    /// The server (or reaching it).
    #[error(transparent)]
    Remote(#[from] ClientError),
    /// The server answered something that is not what its API promises.
    #[error("unexpected answer from the server: {0}")]
    Answer(String),
}

impl From<SessionsError> for Error {
    fn from(e: SessionsError) -> Self {
        let invalid = |m: String| Error::invalid_params().data(json!(m));
        match e {
            SessionsError::Local(SessionError::NotFound(id)) => invalid(format!("no session {id}")),
            SessionsError::Local(SessionError::Invalid(m)) => invalid(m),
            // The server's refusals of the request itself: its message says why.
            SessionsError::Remote(ClientError::Server {
                status: 400 | 404 | 409 | 422,
                message,
            }) => invalid(message),
            other => Error::internal_error().data(json!(other.to_string())),
        }
    }
}

/// A call waiting for a decision somewhere in a session's tree.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The session that owns the call.
    pub session: SessionId,
    /// Sessions from the queried one down to the owner.
    pub path: Vec<SessionId>,
    pub call: ToolCallId,
    pub name: String,
    pub arguments: Value,
}

impl descendants::TreeCall for Pending {
    fn session(&self) -> SessionId {
        self.session
    }
    fn call(&self) -> &ToolCallId {
        &self.call
    }
}

impl descendants::Notifications for Feed {
    fn next(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Notification, broadcast::error::RecvError>> + Send
    {
        self.recv()
    }
}

impl Sessions {
    /// The in-process runtime, if that is where sessions live.
    pub(crate) fn local(&self) -> Option<&Overseer> {
        match self {
            Self::Local(o) => Some(o),
            Self::Remote(_) => None,
        }
    }

    /// Creates the session `req` describes (locally with `req.id`; a server
    /// chooses its own id) and returns its id with a feed of its events
    /// that misses none of them.
    pub(crate) async fn create_session(
        &self,
        req: CreateSession,
    ) -> Result<(SessionId, Feed), SessionsError> {
        match self {
            Self::Local(o) => {
                let id = req.id.unwrap_or_else(SessionId::generate);
                // Subscribed before the session exists: no event is missed.
                let feed = self.subscribe(id);
                o.create_session(CreateSession {
                    id: Some(id),
                    ..req
                })
                .await?;
                Ok((id, feed))
            }
            Self::Remote(c) => {
                let mut body = json!({ "agent": req.agent, "metadata": req.metadata });
                if let Some(tools) = req.overrides.tools {
                    body["tools"] = json!(tools);
                }
                let created = c.call(Method::POST, "/v1/sessions", Some(body)).await?;
                let id = created["id"]
                    .as_str()
                    .and_then(|s| s.parse::<SessionId>().ok())
                    .ok_or_else(|| SessionsError::Answer(format!("no session id in {created}")))?;
                // The feed replays from the first event.
                Ok((id, self.subscribe(id)))
            }
        }
    }

    /// The session's state: its header, transcript and metadata.
    pub(crate) async fn state(&self, id: SessionId) -> Result<StoredSession, SessionsError> {
        match self {
            Self::Local(o) => Ok(o.state(id).await?),
            Self::Remote(c) => {
                let mut v = c
                    .call(Method::GET, &format!("/v1/sessions/{id}"), None)
                    .await?;
                let transcript: Vec<TranscriptEntry> =
                    serde_json::from_value(v["transcript"].take())
                        .map_err(|e| SessionsError::Answer(format!("transcript: {e}")))?;
                let metadata = v["metadata"].take();
                let header: SessionHeader = serde_json::from_value(v)
                    .map_err(|e| SessionsError::Answer(format!("session: {e}")))?;
                Ok(StoredSession {
                    header,
                    transcript: transcript.into_iter().map(Arc::new).collect(),
                    metadata,
                    inbox: Vec::new(),
                    needs_rewrite: false,
                })
            }
        }
    }

    /// The session's next user message.
    pub(crate) async fn send_message(
        &self,
        id: SessionId,
        text: String,
    ) -> Result<(), SessionsError> {
        match self {
            Self::Local(o) => Ok(o.send_message(id, text).await?),
            Self::Remote(c) => {
                let path = format!("/v1/sessions/{id}/messages");
                c.call(Method::POST, &path, Some(json!({ "text": text })))
                    .await?;
                Ok(())
            }
        }
    }

    /// Stops the running turn and keeps the session.
    pub(crate) async fn interrupt(&self, id: SessionId) -> Result<(), SessionsError> {
        match self {
            Self::Local(o) => Ok(o.interrupt(id).await?),
            Self::Remote(c) => {
                let path = format!("/v1/sessions/{id}/interrupt");
                c.call(Method::POST, &path, None).await?;
                Ok(())
            }
        }
    }

    /// Decisions on calls of `root`'s tree. A server takes the decider from
    /// its token, so `submission.approved_by` is not sent to it.
    pub(crate) async fn submit(
        &self,
        root: SessionId,
        submission: Submission,
    ) -> Result<(), SessionsError> {
        match self {
            Self::Local(o) => Ok(o.submit(root, submission).await?),
            Self::Remote(c) => {
                let decisions: Map<String, Value> = submission
                    .decisions
                    .iter()
                    .map(|(call, d)| (call.as_str().to_owned(), json!(d)))
                    .collect();
                let path = format!("/v1/sessions/{root}/approvals");
                c.call(Method::POST, &path, Some(json!({ "decisions": decisions })))
                    .await?;
                Ok(())
            }
        }
    }

    /// The session's standing rule for `tool` (`by` is the server's token
    /// subject in remote mode).
    pub(crate) async fn set_tool_rule(
        &self,
        id: SessionId,
        tool: &str,
        rule: ToolRule,
        by: Option<String>,
    ) -> Result<(), SessionsError> {
        match self {
            Self::Local(o) => Ok(o.set_tool_rule(id, tool, rule, by).await?),
            Self::Remote(c) => {
                let path = format!("/v1/sessions/{id}/rules");
                c.call(
                    Method::POST,
                    &path,
                    Some(json!({ "tool": tool, "rule": rule })),
                )
                .await?;
                Ok(())
            }
        }
    }

    /// What sessions of `agent` may use: the stored tasks it runs, and its
    /// skills, for the editor's slash commands.
    pub(crate) async fn offer(&self, agent: &str) -> Result<super::commands::Offer, SessionsError> {
        match self {
            Self::Local(o) => {
                let tasks = o
                    .tasks()
                    .filter(|t| t.agent == agent)
                    .map(|t| t.as_ref().clone())
                    .collect();
                let skills = o
                    .agents()
                    .find(|a| a.name == agent)
                    .map(|a| {
                        a.skills
                            .iter()
                            .filter_map(|n| o.skills().get(n))
                            .map(|s| (s.name.clone(), s.description.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(super::commands::Offer { tasks, skills })
            }
            Self::Remote(c) => {
                let listed = c.call(Method::GET, "/v1/tasks", None).await?;
                let tasks = listed["tasks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| {
                        serde_json::from_value::<overseer_actors::tasks::TaskDef>(t.clone()).ok()
                    })
                    .filter(|t| t.agent == agent)
                    .collect();
                let agents = c.call(Method::GET, "/v1/agents", None).await?;
                let skills = agents["agents"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["name"] == agent)
                    .and_then(|a| a["skill_specs"].as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|s| {
                        Some((
                            s["name"].as_str()?.to_owned(),
                            s["description"].as_str()?.to_owned(),
                        ))
                    })
                    .collect();
                Ok(super::commands::Offer { tasks, skills })
            }
        }
    }

    /// A person activates skill `name` in session `id`.
    pub(crate) async fn activate_skill(
        &self,
        id: SessionId,
        name: &str,
        by: Option<String>,
    ) -> Result<(), SessionsError> {
        match self {
            Self::Local(o) => Ok(o.activate_skill(id, name, by).await?),
            Self::Remote(c) => {
                let path = format!("/v1/sessions/{id}/skills");
                c.call(Method::POST, &path, Some(json!({ "name": name })))
                    .await?;
                Ok(())
            }
        }
    }

    /// Every call decidable at `root` (its own and its descendants').
    pub(crate) async fn pending_approvals(
        &self,
        root: SessionId,
    ) -> Result<Vec<Pending>, SessionsError> {
        match self {
            Self::Local(o) => Ok(o
                .pending_approvals(root)
                .await?
                .into_iter()
                .map(|p| Pending {
                    session: p.session_id,
                    path: p.path,
                    arguments: p.call.run_arguments().clone(),
                    name: p.call.name,
                    call: p.call.id,
                })
                .collect()),
            Self::Remote(c) => {
                let mut v = c
                    .call(Method::GET, &format!("/v1/sessions/{root}/approvals"), None)
                    .await?;
                let rows: Vec<RemotePending> = serde_json::from_value(v["pending"].take())
                    .map_err(|e| SessionsError::Answer(format!("pending approvals: {e}")))?;
                Ok(rows
                    .into_iter()
                    .map(|p| Pending {
                        session: p.session_id,
                        path: p.session_path,
                        call: p.call_id,
                        name: p.name,
                        arguments: p.arguments,
                    })
                    .collect())
            }
        }
    }

    /// Stored events after `seq`. Remote: none, since the remote feed resumes
    /// by `Last-Event-ID` and so never leaves a gap to fill.
    pub(crate) async fn events_after(
        &self,
        id: SessionId,
        seq: u64,
    ) -> Result<Vec<Event>, SessionsError> {
        match self {
            Self::Local(o) => Ok(o.events_after(id, seq, usize::MAX).await?),
            Self::Remote(_) => Ok(Vec::new()),
        }
    }

    /// A feed of the session's notifications. Locally it subscribes now
    /// (call it before reading the state it continues from); remotely it
    /// connects on the first [`Feed::recv`], after the event given to
    /// [`Feed::after`].
    pub(crate) fn subscribe(&self, id: SessionId) -> Feed {
        match self {
            Self::Local(o) => Feed::Local(o.subscribe(id)),
            Self::Remote(c) => Feed::Remote(RemoteFeed {
                client: c.clone(),
                id,
                after: 0,
                live: None,
            }),
        }
    }
}

/// A pending call as `GET /v1/sessions/{id}/approvals` lists it.
#[derive(serde::Deserialize)]
struct RemotePending {
    session_id: SessionId,
    #[serde(default)]
    session_path: Vec<SessionId>,
    call_id: ToolCallId,
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// One session's notifications, live: checkpointed events and text deltas.
pub(crate) enum Feed {
    /// The in-process broadcast.
    Local(broadcast::Receiver<Notification>),
    /// The server's event stream.
    Remote(RemoteFeed),
}

/// The server's event stream of one session, reopened after the last event
/// received whenever it ends.
pub(crate) struct RemoteFeed {
    client: Client,
    id: SessionId,
    after: u64,
    /// What the reader sends: `None` when it (re)connected.
    live: Option<(mpsc::Receiver<Option<Notification>>, JoinHandle<()>)>,
}

impl RemoteFeed {
    /// The reader's channel, starting the reader on first use.
    fn live(&mut self) -> &mut mpsc::Receiver<Option<Notification>> {
        let (rx, _) = self.live.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel(FEED_BUFFER);
            let reader = tokio::spawn(read_remote(self.client.clone(), self.id, self.after, tx));
            (rx, reader)
        });
        rx
    }
}

impl Drop for RemoteFeed {
    fn drop(&mut self) {
        if let Some((_, reader)) = &self.live {
            reader.abort();
        }
    }
}

impl Feed {
    /// Starts the feed after event `seq` (a remote feed; the local one
    /// starts where it was subscribed).
    pub(crate) fn after(mut self, seq: u64) -> Self {
        if let Self::Remote(r) = &mut self {
            r.after = seq;
        }
        self
    }

    /// Opens a remote feed now and waits (boundedly) until the server
    /// streams it: from then on the server has subscribed, so no live text
    /// delta of a turn started afterwards is missed. A feed that cannot
    /// open says so on its first [`Feed::recv`].
    pub(crate) async fn connected(mut self) -> Self {
        if let Self::Remote(r) = &mut self {
            // The reader's first item is its connected marker, so nothing
            // else is consumed here.
            let _ = tokio::time::timeout(CONNECT_WAIT, r.live().recv()).await;
        }
        self
    }

    /// The next notification, with the errors of a broadcast receiver:
    /// `Lagged` when some may have been lost (read the store; resend the
    /// step's text from its stored message), `Closed` at the end. A remote
    /// feed is `Lagged` each time its stream (re)connects: text deltas are
    /// live only, so those of the gap are gone.
    pub(crate) async fn recv(&mut self) -> Result<Notification, broadcast::error::RecvError> {
        match self {
            Self::Local(rx) => rx.recv().await,
            Self::Remote(r) => match r.live().recv().await {
                Some(Some(note)) => Ok(note),
                Some(None) => Err(broadcast::error::RecvError::Lagged(0)),
                None => Err(broadcast::error::RecvError::Closed),
            },
        }
    }
}

/// Reads the server's event stream of `id` from event `last` on, into
/// `tx`, reopening it (from the last event read) whenever it ends, until the
/// feed is dropped or the server says the session is not there for this
/// token.
async fn read_remote(
    client: Client,
    id: SessionId,
    mut last: u64,
    tx: mpsc::Sender<Option<Notification>>,
) {
    let path = format!("/v1/sessions/{id}/events");
    loop {
        match client.stream(&path, last).await {
            Ok(resp) => {
                if tx.send(None).await.is_err() {
                    return;
                }
                let mut events = resp.bytes_stream().eventsource();
                while let Some(item) = events.next().await {
                    let ev = match item {
                        Ok(ev) => ev,
                        Err(e) => {
                            tracing::debug!(session = %id, "event stream broke: {e}");
                            break;
                        }
                    };
                    let note = if ev.event == "text_delta" {
                        match serde_json::from_str::<Value>(&ev.data) {
                            Ok(v) => Notification::TextDelta {
                                session_id: id,
                                text: v["text"].as_str().unwrap_or_default().to_owned(),
                            },
                            Err(e) => {
                                tracing::warn!(session = %id, "unreadable text delta: {e}");
                                continue;
                            }
                        }
                    } else {
                        match serde_json::from_str::<Event>(&ev.data) {
                            Ok(e) => {
                                last = e.seq;
                                Notification::Event(e)
                            }
                            Err(e) => {
                                tracing::warn!(session = %id, event = %ev.event, "unreadable event: {e}");
                                continue;
                            }
                        }
                    };
                    if tx.send(Some(note)).await.is_err() {
                        return;
                    }
                }
            }
            Err(
                e @ ClientError::Server {
                    status: 401 | 403 | 404,
                    ..
                },
            ) => {
                tracing::warn!(session = %id, "cannot follow the session: {e}");
                return;
            }
            Err(e) => tracing::warn!(session = %id, "cannot follow the session (retrying): {e}"),
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(RECONNECT).await;
    }
}
