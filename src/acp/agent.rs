//! The ACP methods of the agent: `initialize`, `session/new`,
//! `session/load`, `session/prompt` and `session/cancel`, each mapped onto
//! [`Sessions`] (the in-process runtime, or a server over HTTP). A request that cannot be served is answered with a
//! JSON-RPC error naming what was wrong, and the connection goes on; every
//! method not listed here is the crate's `method not found`.
//!
//! Handlers run on the connection's dispatch loop, so none of them waits for
//! a turn: a prompt registers with its session's [`Link`] and waits in a
//! task of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, Implementation, InitializeRequest,
    InitializeResponse, LoadSessionRequest, LoadSessionResponse, McpCapabilities, McpServer,
    NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest, PromptResponse,
    SessionNotification, StopReason as AcpStopReason,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, Client, ConnectTo, Error};
use serde_json::json;

use overseer_actors::model::{SessionId, SessionOverrides, SessionStatus};
use overseer_actors::CreateSession;

use super::commands::Command;
use super::follow::{Link, TurnOutcome};
use super::fs;
use super::mcp::{self, SessionServers};
use super::sessions::{Sessions, SessionsError};
use super::{updates, AcpError};
use crate::service::CLI_TENANT;

/// What every handler shares.
struct State {
    sessions: Sessions,
    /// The agent new sessions run.
    agent: String,
    /// The client's name (from `initialize`), for the audit trail.
    client: Mutex<String>,
    /// Sessions this connection has open.
    links: Mutex<HashMap<SessionId, Arc<Link>>>,
    /// The connection the editor's file tools speak on.
    conn: fs::ClientSlot,
    /// Which of those tools the client advertised: (read, write).
    fs_caps: Mutex<(bool, bool)>,
    /// The client's MCP servers of each session, connected while the
    /// connection lasts.
    servers: Mutex<HashMap<SessionId, SessionServers>>,
}

impl State {
    fn by(&self) -> String {
        format!(
            "acp:{}",
            self.client.lock().unwrap_or_else(|p| p.into_inner())
        )
    }

    fn link(&self, id: SessionId) -> Option<Arc<Link>> {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    fn keep_servers(&self, id: SessionId, servers: Option<SessionServers>) {
        if let Some(servers) = servers {
            self.servers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, servers);
        }
    }

    fn open(&self, id: SessionId, link: Link) {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::new(link));
    }
}

/// Serves one client on `transport` until it closes the connection.
pub(crate) async fn serve(
    sessions: Sessions,
    agent: String,
    conn: fs::ClientSlot,
    transport: impl ConnectTo<Agent> + 'static,
) -> Result<(), AcpError> {
    let state = Arc::new(State {
        sessions,
        agent,
        client: Mutex::new("client".to_owned()),
        links: Mutex::new(HashMap::new()),
        conn,
        fs_caps: Mutex::new((false, false)),
        servers: Mutex::new(HashMap::new()),
    });
    let (s1, s2, s3, s4, s5) = (
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
    );
    let served = Agent
        .v1()
        .name("overseer")
        .on_receive_request(
            async move |req: InitializeRequest, responder, cx| {
                // One connection per process: the first one stays.
                let _ = s1.conn.set(cx);
                responder.respond(initialize(&s1, req))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: NewSessionRequest, responder, cx| {
                responder.respond_with_result(new_session(&s2, req, cx).await)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: LoadSessionRequest, responder, cx| {
                // The history is replayed before the answer; the follower
                // starts after it, so nothing live overtakes the replay.
                match load_session(&s3, req, &cx).await {
                    Ok((id, link)) => {
                        let answered = responder.respond(LoadSessionResponse::new());
                        s3.open(id, link());
                        answered
                    }
                    Err(e) => responder.respond_with_error(e),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: PromptRequest, responder, cx| {
                let state = s4.clone();
                let prompted = prepare_prompt(&state, req);
                match prompted {
                    Ok((id, link, text)) => cx.spawn(async move {
                        responder.respond_with_result(prompt(&state, id, &link, text).await)
                    }),
                    Err(e) => responder.respond_with_error(e),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |note: CancelNotification, cx| {
                let state = s5.clone();
                // Not on the dispatch loop: the interrupt waits for the actor.
                cx.spawn(async move {
                    cancel(&state, &note.session_id.0).await;
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    // Followers stop with the connection, and so do the client's servers.
    state
        .links
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    let servers = std::mem::take(&mut *state.servers.lock().unwrap_or_else(|p| p.into_inner()));
    drop(servers);
    served.map_err(|e| AcpError::Connection(format!("{e:?}")))
}

fn initialize(state: &State, req: InitializeRequest) -> InitializeResponse {
    let caps = &req.client_capabilities.fs;
    // A server cannot reach this editor's files, nor connect its MCP
    // servers: in remote mode neither is offered.
    let local = state.sessions.local().is_some();
    *state.fs_caps.lock().unwrap_or_else(|p| p.into_inner()) =
        (caps.read_text_file, caps.write_text_file);
    if let Some(info) = &req.client_info {
        *state.client.lock().unwrap_or_else(|p| p.into_inner()) = info.name.clone();
    }
    // v1 is the one version spoken: a client asking for a later one gets
    // v1 (and may disconnect), one asking for an earlier one too.
    let version = ProtocolVersion::V1;
    tracing::info!(client = %state.by(), asked = %req.protocol_version, "initialize");
    InitializeResponse::new(version)
        .agent_capabilities(
            AgentCapabilities::new()
                .load_session(true)
                .prompt_capabilities(PromptCapabilities::new())
                .mcp_capabilities(McpCapabilities::new().http(local)),
        )
        .agent_info(
            Implementation::new("overseer", env!("CARGO_PKG_VERSION")).title("overseer".to_owned()),
        )
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid_params().data(json!(message.into()))
}

fn session_error(e: SessionsError) -> Error {
    e.into()
}

/// In remote mode the client's MCP servers would have to run in the server:
/// refused rather than silently dropped.
fn check_remote_mcp(state: &State, servers: &[McpServer]) -> Result<(), Error> {
    if state.sessions.local().is_none() && !servers.is_empty() {
        return Err(invalid(format!(
            "mcpServers: overseer acp --server cannot connect the editor's MCP servers ({}): sessions run in the server, which cannot reach them; pass an empty list, or configure the servers on the server",
            servers.iter().map(mcp_name).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

fn mcp_name(s: &McpServer) -> String {
    match s {
        McpServer::Http(h) => h.name.clone(),
        McpServer::Sse(h) => h.name.clone(),
        McpServer::Stdio(h) => h.name.clone(),
        _ => "?".to_owned(),
    }
}

fn parse_id(raw: &str) -> Result<SessionId, Error> {
    raw.parse::<SessionId>()
        .map_err(|_| invalid(format!("sessionId: '{raw}' is not an overseer session id")))
}

fn check_cwd(cwd: &std::path::Path) -> Result<(), Error> {
    if cwd.is_absolute() {
        Ok(())
    } else {
        Err(invalid(format!(
            "cwd: must be an absolute path, got '{}'",
            cwd.display()
        )))
    }
}

async fn new_session(
    state: &State,
    req: NewSessionRequest,
    cx: ConnectionTo<Client>,
) -> Result<NewSessionResponse, Error> {
    check_cwd(&req.cwd)?;
    check_remote_mcp(state, &req.mcp_servers)?;
    let configs = mcp::configs(&req.mcp_servers)?;
    let overrides = SessionOverrides {
        tools: narrowed_tools(state),
        ..SessionOverrides::default()
    };
    let id = SessionId::generate();
    // Dropped (their tools taken away) if the session is not created.
    let servers = match state.sessions.local() {
        Some(overseer) => mcp::connect(overseer, id, &configs).await?,
        None => None,
    };
    let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
    let (id, rx) = state
        .sessions
        .create_session(CreateSession {
            agent: state.agent.clone(),
            tenant: CLI_TENANT.into(),
            created_by: Some(state.by()),
            metadata: json!({ "acp": {
                "cwd": req.cwd.display().to_string(),
                "client": state.by(),
                mcp::METADATA_KEY: names,
            } }),
            id: Some(id),
            overrides,
            session_tools: servers
                .as_ref()
                .map(|s| s.tools.clone())
                .unwrap_or_default(),
            ..CreateSession::default()
        })
        .await
        .map_err(session_error)?;
    tracing::info!(session = %id, "session/new");
    state.keep_servers(id, servers);
    offer_commands(state, &cx, id, &state.agent).await;
    // Streaming before the client can prompt: no delta of the turn is lost.
    let rx = rx.connected().await;
    let link = Link::start(state.sessions.clone(), cx, id, rx, 0, &[], state.by());
    state.open(id, link);
    Ok(NewSessionResponse::new(id.to_string()))
}

/// The agent's tools without the editor file tools the client did not
/// advertise; `None` when nothing is taken away.
fn narrowed_tools(state: &State) -> Option<Vec<String>> {
    let (read, write) = *state.fs_caps.lock().unwrap_or_else(|p| p.into_inner());
    let agent = state
        .sessions
        .local()?
        .agents()
        .find(|a| a.name == state.agent)?;
    let kept: Vec<String> = agent
        .tools
        .iter()
        .filter(|t| match t.as_str() {
            fs::READ_TEXT_FILE => read,
            fs::WRITE_TEXT_FILE => write,
            _ => true,
        })
        .cloned()
        .collect();
    (kept.len() != agent.tools.len()).then_some(kept)
}

/// Replays a stored session and returns how to start following it.
async fn load_session(
    state: &State,
    req: LoadSessionRequest,
    cx: &ConnectionTo<Client>,
) -> Result<(SessionId, impl FnOnce() -> Link), Error> {
    check_cwd(&req.cwd)?;
    let id = parse_id(&req.session_id.0)?;
    if state.link(id).is_some() {
        return Err(invalid(format!(
            "session {id} is already open on this connection"
        )));
    }
    check_remote_mcp(state, &req.mcp_servers)?;
    let rx = state.sessions.subscribe(id);
    let stored = state.sessions.state(id).await.map_err(session_error)?;
    // Sessions of other tenants (a shared store) are not this agent's (a
    // server answers only its token's tenant's).
    let local = state.sessions.local();
    if (local.is_some() && stored.header.tenant != CLI_TENANT) || stored.header.parent.is_some() {
        return Err(invalid(format!("no session {id}")));
    }
    if stored.header.status.is_terminal() {
        return Err(invalid(format!(
            "session {id} is {}: it takes no more prompts",
            stored.header.status
        )));
    }
    // The servers it was created with that the client passed again.
    let recorded = mcp::recorded(&stored.metadata);
    let (configs, ignored): (Vec<_>, Vec<_>) = mcp::configs(&req.mcp_servers)?
        .into_iter()
        .partition(|c| recorded.contains(&c.name));
    for c in &ignored {
        tracing::warn!(session = %id, mcp_server = %c.name, "not one of the session's MCP servers (its scope was fixed when it was created): not connected");
    }
    for name in recorded
        .iter()
        .filter(|n| !configs.iter().any(|c| &c.name == *n))
    {
        tracing::warn!(session = %id, mcp_server = %name, "the client did not pass this MCP server of the session again: its tools are unavailable");
    }
    let servers = match local {
        Some(overseer) => mcp::connect(overseer, id, &configs).await?,
        None => None,
    };
    let rx = rx.after(stored.header.last_event_seq).connected().await;
    for update in updates::replay(&stored.transcript) {
        cx.send_notification(SessionNotification::new(id.to_string(), update))?;
    }
    offer_commands(state, cx, id, &stored.header.agent).await;
    tracing::info!(session = %id, status = %stored.header.status, "session/load");
    state.keep_servers(id, servers);
    let sessions = state.sessions.clone();
    let cx = cx.clone();
    let by = state.by();
    Ok((id, move || {
        Link::start(
            sessions,
            cx,
            id,
            rx,
            stored.header.last_event_seq,
            &stored.header.open_calls,
            by,
        )
    }))
}

fn prepare_prompt(
    state: &State,
    req: PromptRequest,
) -> Result<(SessionId, Arc<Link>, String), Error> {
    let id = parse_id(&req.session_id.0)?;
    let link = state.link(id).ok_or_else(|| {
        invalid(format!(
            "session {id} is not open on this connection: call session/new or session/load first"
        ))
    })?;
    let mut text = String::new();
    for block in req.prompt {
        let part = match block {
            ContentBlock::Text(t) => t.text,
            ContentBlock::ResourceLink(l) => format!("[{}]({})", l.name, l.uri),
            _ => return Err(invalid(
                "prompt: only text and resource links are supported (see the prompt capabilities)",
            )),
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&part);
    }
    if text.trim().is_empty() {
        return Err(invalid("prompt: no text"));
    }
    Ok((id, link, text))
}

/// Tells the editor the slash commands of a session of `agent` (its tasks
/// and skills), if it has any. Best effort: a session without them works.
async fn offer_commands(state: &State, cx: &ConnectionTo<Client>, id: SessionId, agent: &str) {
    match state.sessions.offer(agent).await {
        Ok(offer) if !offer.tasks.is_empty() || !offer.skills.is_empty() => {
            let note = SessionNotification::new(id.to_string(), offer.update());
            if let Err(e) = cx.send_notification(note) {
                tracing::warn!(session = %id, "available_commands_update not sent: {e:?}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(session = %id, "no slash commands: {e}"),
    }
}

/// Whether activating a skill failed only because it is already active.
fn already_active(e: &SessionsError) -> bool {
    matches!(
        e,
        SessionsError::Local(overseer_actors::SessionError::Conflict(_))
            | SessionsError::Remote(crate::cli::client::ClientError::Server { status: 409, .. })
    )
}

/// One prompt: the session's next message, answered when its turn ends.
/// A slash command (see `commands`) activates a skill and answers at once,
/// or turns a task into the turn's message.
async fn prompt(
    state: &State,
    id: SessionId,
    link: &Link,
    text: String,
) -> Result<PromptResponse, Error> {
    let before = state.sessions.state(id).await.map_err(session_error)?;
    let h = &before.header;
    if h.status.is_terminal() {
        return Err(invalid(format!("session {id} is {}", h.status)));
    }
    let mut text = text;
    if text.trim_start().starts_with('/') {
        let offer = state
            .sessions
            .offer(&h.agent)
            .await
            .map_err(session_error)?;
        match offer.parse(&text).map_err(invalid)? {
            None => {}
            Some(Command::Skill(name)) => {
                state
                    .sessions
                    .activate_skill(id, &name, Some(state.by()))
                    .await
                    .map_err(session_error)?;
                return Ok(PromptResponse::new(AcpStopReason::EndTurn));
            }
            Some(Command::Task { message, skills }) => {
                for name in skills {
                    match state
                        .sessions
                        .activate_skill(id, &name, Some(state.by()))
                        .await
                    {
                        Err(e) if !already_active(&e) => return Err(session_error(e)),
                        _ => {}
                    }
                }
                text = message;
            }
        }
    }
    // Behind a running turn (after session/load), the message is queued:
    // it is the turn after the running one and those already queued.
    let busy = matches!(
        h.status,
        SessionStatus::Running | SessionStatus::AwaitingApproval
    );
    let turn = h.turn + 1 + u32::from(busy) + u32::try_from(h.queue.len()).unwrap_or(u32::MAX);
    let done = link
        .wait_for(turn)
        .map_err(|_| invalid(format!("session {id} already has a prompt running")))?;
    if let Err(e) = state.sessions.send_message(id, text).await {
        link.stop_waiting();
        return Err(session_error(e));
    }
    let outcome = done
        .await
        .map_err(|_| Error::internal_error().data(json!("the session's follower stopped")))?;
    match outcome {
        TurnOutcome::Ended {
            reason,
            usage,
            error,
        } => match updates::stop_reason(reason) {
            Some(stop) => {
                Ok(PromptResponse::new(stop).usage(updates::turn_usage(&h.usage, &usage)))
            }
            None => Err(Error::internal_error().data(json!(
                error.unwrap_or_else(|| format!("the turn ended with {reason}"))
            ))),
        },
        TurnOutcome::SessionEnded(status, error) => Err(Error::internal_error().data(json!(
            error.unwrap_or_else(|| format!("session {id} is {status}"))
        ))),
    }
}

/// `session/cancel`: stops the running turn and keeps the session (the
/// prompt answers `cancelled`). Unknown sessions are ignored, as the
/// notification has no answer.
async fn cancel(state: &State, raw: &str) {
    let Ok(id) = raw.parse::<SessionId>() else {
        tracing::warn!(session = raw, "session/cancel for an unknown session");
        return;
    };
    if state.link(id).is_none() {
        tracing::warn!(session = %id, "session/cancel for a session not open here");
        return;
    }
    if let Err(e) = state.sessions.interrupt(id).await {
        tracing::warn!(session = %id, "cannot interrupt the turn: {e}");
    }
}
