//! `overseer sessions list|show|approve|cancel|interrupt|model|fork|history`: a client of
//! a running server, over its HTTP API. Its [`Client`] is also what
//! `overseer acp --server` speaks to a server through.
//!
//! Owns turning commands into requests and answers into lines on stdout.
//! `list` and `show` also read a store directory directly with `--data DIR`
//! (no server; the same lines and JSON, from the store as a server would
//! read it). It deliberately holds no session logic: every rule (scopes, tenants,
//! validation of decisions) is the server's, and its error messages are
//! printed as they come, through the rendering rule like every other stored
//! text (`super::terminal`). The rule's warnings (hidden or
//! direction-changing characters, words that mix scripts) go to stderr for
//! `list` and `show`, whose stdout programs read, and beside the call for
//! `approve`.

use std::path::{Path, PathBuf};

use overseer_actors::model::{SessionId, SessionStatus};
use overseer_actors::store::StoreError;
use serde_json::{json, Map, Value};

use super::{status, terminal, CliError};
use crate::render::Warnings;
use crate::store::{Inspector, OpenError};

/// `overseer sessions` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {
    /// Server base URL.
    #[arg(long, env = "OVERSEER_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// What to do.
    #[command(subcommand)]
    pub command: SessionsCommand,
}

/// The client commands. The token is read from `OVERSEER_TOKEN`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SessionsCommand {
    /// List your sessions (one line each: id, status, agent, title).
    List {
        /// Only sessions with this status.
        #[arg(long)]
        status: Option<String>,
        /// Only sessions of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Read this store directory instead of asking a server (every
        /// tenant's sessions; the directory must not be held by a running
        /// server).
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// With --data: only this tenant's sessions.
        #[arg(long, requires = "data")]
        tenant: Option<String>,
    },
    /// Show one session as JSON.
    Show {
        /// Session id.
        id: String,
        /// Read this store directory instead of asking a server (the
        /// directory must not be held by a running server).
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
    },
    /// Decide pending approvals (all of them unless --call is given).
    Approve {
        /// Session id (a root: its children's propagated calls are included).
        id: String,
        /// Only these call ids.
        #[arg(long = "call")]
        calls: Vec<String>,
        /// Deny instead, with this reason.
        #[arg(long)]
        deny: Option<String>,
    },
    /// Cancel a session and its subtree.
    Cancel {
        /// Session id.
        id: String,
    },
    /// Stop a session's running turn and keep the session: it waits for the
    /// next message (the turn ends with `interrupted`).
    Interrupt {
        /// Session id.
        id: String,
    },
    /// Fork a session into a new one of yours: its transcript up to a
    /// point (its latest checkpoint by default), the source untouched.
    /// Prints the new session's id.
    Fork {
        /// The session to fork.
        id: String,
        /// Fork just after this event (a sequence number `sessions history`
        /// lists).
        #[arg(long, value_name = "SEQ", conflicts_with = "index")]
        at: Option<u64>,
        /// Fork with this many of the transcript's entries.
        #[arg(long, value_name = "N")]
        index: Option<u64>,
    },
    /// List the points a session can be forked at: each turn's end and each
    /// tool result, with its event sequence number.
    History {
        /// Session id.
        id: String,
    },
    /// Serve a session's next turns with another configured model route
    /// (between turns only).
    Model {
        /// Session id.
        id: String,
        /// The model route.
        route: String,
    },
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach {url}: {source}")]
    Transport {
        /// URL.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The server answered with an error.
    #[error("server answered {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// The server's error message (or body).
        message: String,
    },
    /// Nothing to decide.
    #[error("session {0} has no pending approvals")]
    NothingPending(String),
    /// `--data` names a directory another process (a server) holds.
    #[error("the store in {} is in use by another process, e.g. a running overseer serve: ask that server instead (the same command without --data), or stop it first", .0.display())]
    StoreHeld(PathBuf),
    /// `--data` names a directory that could not be read.
    #[error(transparent)]
    Store(#[from] OpenError),
    /// A stored session could not be read.
    #[error("reading the store in {}: {source}", dir.display())]
    Read {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// `--data`: no such session in the directory.
    #[error("session {id} not found in {}", dir.display())]
    NotStored {
        /// The id.
        id: SessionId,
        /// The directory.
        dir: PathBuf,
    },
    /// A command-line value that is not what it should be.
    #[error("{0}")]
    Invalid(String),
}

/// Runs one client command.
pub fn sessions(args: SessionsArgs) -> Result<(), CliError> {
    match &args.command {
        SessionsCommand::List {
            status,
            agent,
            data: Some(dir),
            tenant,
        } => return offline_list(dir, status.as_deref(), agent.as_deref(), tenant.as_deref()),
        SessionsCommand::Show {
            id,
            data: Some(dir),
        } => return offline_show(dir, id),
        _ => {}
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(run(args))
}

/// A client of a server's HTTP API: plain JSON calls with the bearer token
/// (also what `overseer acp --server` speaks through).
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `base`, with `OVERSEER_TOKEN` if set.
    pub(crate) fn from_env(base: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            token: std::env::var("OVERSEER_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        }
    }

    /// The server's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `GET path` as a stream (Server-Sent Events), resuming after the
    /// event `last_event_id`; an error status is an error.
    pub(crate) async fn stream(
        &self,
        path: &str,
        last_event_id: u64,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self
            .http
            .get(&url)
            .header("accept", "text/event-stream")
            .header("last-event-id", last_event_id.to_string());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        Err(ClientError::Server { status, message })
    }

    /// `POST path` without a body, answered by a stream (`overseer store
    /// backup`); an error status is an error carrying the server's message.
    pub(crate) async fn post_stream(&self, path: &str) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self.http.post(&url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        Err(ClientError::Server { status, message })
    }

    /// One JSON call; an error status is an error carrying the server's
    /// message.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|source| ClientError::Transport {
            url: url.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if status >= 400 {
            let message = value["error"]["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or(text);
            return Err(ClientError::Server { status, message });
        }
        Ok(value)
    }
}

/// One line of `list`: id, status, agent, title, tab-separated. Each cell
/// escaped on its own: a tab or newline in a title must not shift the
/// columns or forge a row.
fn list_row(s: &Value) -> String {
    let cell = |key: &str, missing: &'static str| {
        terminal::inline(s[key].as_str().unwrap_or(missing)).into_owned()
    };
    format!(
        "{}\t{}\t{}\t{}",
        cell("id", "?"),
        cell("status", "?"),
        cell("agent", "?"),
        cell("title", "")
    )
}

/// Prints the rule's warnings about a session's title on stderr, after its
/// row of `list`.
fn list_warnings(s: &Value) {
    let Some(title) = s["title"].as_str() else {
        return;
    };
    let mut w = Warnings::new();
    w.text("/title", title);
    for warning in w.finish() {
        status(format_args!(
            "warning: session {}: {}",
            s["id"].as_str().unwrap_or("?"),
            warning.line()
        ));
    }
}

/// Prints `value` (a session, for `show`) as JSON on stdout and the rule's
/// warnings about every text in it on stderr, each at its JSON Pointer.
fn show_json(value: &Value) -> Result<(), CliError> {
    print(&terminal::json(value))?;
    let mut w = Warnings::new();
    w.json("", value);
    for warning in w.finish() {
        status(format_args!("warning: {}", warning.line()));
    }
    Ok(())
}

/// Opens `dir` for reading, saying in one line when a server holds it.
fn inspector(dir: &Path) -> Result<Inspector, ClientError> {
    Inspector::open(dir).map_err(|e| match e {
        OpenError::Locked { dir } => ClientError::StoreHeld(dir),
        other => ClientError::Store(other),
    })
}

/// `sessions list --data DIR`: the rows `list` prints, from the store, in
/// id order (as the server pages them), every tenant unless `tenant`.
fn offline_list(
    dir: &Path,
    status: Option<&str>,
    agent: Option<&str>,
    tenant: Option<&str>,
) -> Result<(), CliError> {
    let status: Option<SessionStatus> = status
        .map(|s| {
            serde_json::from_value(json!(s)).map_err(|_| {
                ClientError::Invalid(format!(
                    "--status: '{s}' is not a session status (pending, running, awaiting_approval, awaiting_input, completed, failed, cancelled)"
                ))
            })
        })
        .transpose()?;
    let store = inspector(dir)?;
    let read = |source| ClientError::Read {
        dir: dir.to_owned(),
        source,
    };
    let mut after = None;
    loop {
        let page = store.scan(after, 500).map_err(read)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for header in page {
            let keep = status.is_none_or(|s| s == header.status)
                && agent.is_none_or(|a| a == header.agent)
                && tenant.is_none_or(|t| t == header.tenant);
            if keep {
                let row = serde_json::to_value(&header).unwrap_or(Value::Null);
                print(&list_row(&row))?;
                list_warnings(&row);
            }
        }
    }
    Ok(())
}

/// `sessions show ID --data DIR`: the JSON `show` prints, from the store.
fn offline_show(dir: &Path, id: &str) -> Result<(), CliError> {
    let id: SessionId = id
        .parse()
        .map_err(|_| ClientError::Invalid(format!("'{id}' is not a session id")))?;
    let store = inspector(dir)?;
    let stored = store
        .load(id)
        .map_err(|source| ClientError::Read {
            dir: dir.to_owned(),
            source,
        })?
        .ok_or_else(|| ClientError::NotStored {
            id,
            dir: dir.to_owned(),
        })?;
    show_json(&crate::http::session_json(&stored))
}

/// `approved CALL: TOOL`, then what the tool receives as pretty JSON and the
/// rule's warnings about it, indented, all through the rendering rule.
fn print_decided(verb: &str, call_id: &str, call: &Value) -> Result<(), CliError> {
    let name = call["name"].as_str().unwrap_or("?");
    print(&format!(
        "{verb} {}: {}",
        terminal::inline(call_id),
        terminal::inline(name)
    ))?;
    for line in terminal::shown_json(&call["arguments"]) {
        print(&format!("  {}", terminal::inline(&line)))?;
    }
    let warnings = crate::render::call_warnings(name, &call["arguments"]);
    for line in terminal::warning_lines(&warnings) {
        print(&format!("  {}", terminal::inline(&line)))?;
    }
    Ok(())
}

/// Prints one line of output (see [`terminal::print_line`]).
fn print(line: &str) -> Result<(), CliError> {
    terminal::print_line(line).map_err(CliError::Stdout)
}

async fn run(args: SessionsArgs) -> Result<(), CliError> {
    let client = Client::from_env(&args.url);
    match args.command {
        SessionsCommand::List { status, agent, .. } => {
            let mut cursor: Option<String> = None;
            loop {
                let mut query = vec![];
                if let Some(s) = &status {
                    query.push(format!("status={s}"));
                }
                if let Some(a) = &agent {
                    query.push(format!("agent={a}"));
                }
                if let Some(c) = &cursor {
                    query.push(format!("cursor={c}"));
                }
                let path = if query.is_empty() {
                    "/v1/sessions".to_owned()
                } else {
                    format!("/v1/sessions?{}", query.join("&"))
                };
                let page = client.call(reqwest::Method::GET, &path, None).await?;
                for s in page["sessions"].as_array().into_iter().flatten() {
                    print(&list_row(s))?;
                    list_warnings(s);
                }
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
        }
        SessionsCommand::Fork { id, at, index } => {
            let body = match (at, index) {
                (Some(seq), _) => json!({"at": {"seq": seq}}),
                (None, Some(i)) => json!({"at": {"index": i}}),
                (None, None) => json!({}),
            };
            let s = client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/{id}/fork"),
                    Some(body),
                )
                .await?;
            let fork = s["id"].as_str().unwrap_or_default();
            let from = &s["forked_from"];
            print(fork)?;
            status(format_args!(
                "forked {} at event {} ({} transcript entries)",
                from["session"].as_str().unwrap_or_default(),
                from["at"],
                from["index"]
            ));
        }
        SessionsCommand::History { id } => {
            let h = client
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/sessions/{id}/history"),
                    None,
                )
                .await?;
            for p in h["points"].as_array().into_iter().flatten() {
                let what = match p["kind"].as_str() {
                    Some("turn_ended") => {
                        format!(
                            "turn {} ended ({})",
                            p["turn"],
                            p["stop_reason"].as_str().unwrap_or("?")
                        )
                    }
                    _ => format!(
                        "{} {} {}",
                        p["name"].as_str().unwrap_or("?"),
                        p["call_id"].as_str().unwrap_or("?"),
                        p["state"].as_str().unwrap_or("?")
                    ),
                };
                print(&format!(
                    "{}\t{}\t{}",
                    p["seq"],
                    p["index"],
                    terminal::inline(&what)
                ))?;
            }
        }
        SessionsCommand::Show { id, .. } => {
            let s = client
                .call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
                .await?;
            show_json(&s)?;
        }
        SessionsCommand::Approve { id, calls, deny } => {
            let pending = client
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/sessions/{id}/approvals"),
                    None,
                )
                .await?;
            let mut chosen: Vec<String> = pending["pending"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["call"]["id"].as_str().or(p["call_id"].as_str()))
                .map(str::to_owned)
                .collect();
            if !calls.is_empty() {
                // Named calls are sent as given: the server says which are unknown.
                chosen = calls;
            }
            if chosen.is_empty() {
                return Err(ClientError::NothingPending(id).into());
            }
            let decision = match &deny {
                Some(message) => json!({"decision": "deny", "message": message}),
                None => json!({"decision": "approve"}),
            };
            let decisions: Map<String, Value> = chosen
                .iter()
                .map(|c| (c.clone(), decision.clone()))
                .collect();
            client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/{id}/approvals"),
                    Some(json!({"decisions": decisions})),
                )
                .await?;
            let verb = if deny.is_some() { "denied" } else { "approved" };
            for c in chosen {
                let call = pending["pending"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["call_id"].as_str() == Some(c.as_str()));
                match call {
                    Some(call) => print_decided(verb, &c, call)?,
                    None => print(&format!("{verb} {}", terminal::inline(&c)))?,
                }
            }
        }
        SessionsCommand::Cancel { id } => {
            client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/{id}/cancel"),
                    None,
                )
                .await?;
            print(&format!("cancelled {}", terminal::inline(&id)))?;
        }
        SessionsCommand::Interrupt { id } => {
            let header = client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/{id}/interrupt"),
                    None,
                )
                .await?;
            print(&format!(
                "interrupted {}: {}",
                terminal::inline(&id),
                terminal::inline(header["status"].as_str().unwrap_or("?"))
            ))?;
        }
        SessionsCommand::Model { id, route } => {
            client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sessions/{id}/model"),
                    Some(json!({ "model": route })),
                )
                .await?;
            print(&format!(
                "{} now uses model route {}",
                terminal::inline(&id),
                terminal::inline(&route)
            ))?;
        }
    }
    Ok(())
}
