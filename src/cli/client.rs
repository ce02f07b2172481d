//! `overseer sessions list|show|approve|cancel|interrupt|model`: a client of
//! a running server, over its HTTP API.
//!
//! Owns turning commands into requests and answers into lines on stdout. It
//! deliberately holds no session logic: every rule (scopes, tenants,
//! validation of decisions) is the server's, and its error messages are
//! printed as they come, with control characters escaped like every other
//! stored text (`super::terminal`).

use serde_json::{json, Map, Value};

use super::{terminal, CliError};

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
    },
    /// Show one session as JSON.
    Show {
        /// Session id.
        id: String,
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
}

/// Runs one client command.
pub fn sessions(args: SessionsArgs) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(run(args))
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    async fn call(
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

/// Prints one line of output (see [`terminal::print_line`]).
fn print(line: &str) -> Result<(), CliError> {
    terminal::print_line(line).map_err(CliError::Stdout)
}

async fn run(args: SessionsArgs) -> Result<(), CliError> {
    let client = Client {
        http: reqwest::Client::new(),
        base: args.url.clone(),
        token: std::env::var("OVERSEER_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    match args.command {
        SessionsCommand::List { status, agent } => {
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
                    // Each cell escaped on its own: a tab or newline in a
                    // title must not shift the columns or forge a row.
                    let cell = |key: &str, missing: &'static str| {
                        terminal::inline(s[key].as_str().unwrap_or(missing)).into_owned()
                    };
                    print(&format!(
                        "{}\t{}\t{}\t{}",
                        cell("id", "?"),
                        cell("status", "?"),
                        cell("agent", "?"),
                        cell("title", "")
                    ))?;
                }
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
        }
        SessionsCommand::Show { id } => {
            let s = client
                .call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
                .await?;
            print(&terminal::json(&s))?;
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
                print(&format!("{verb} {}", terminal::inline(&c)))?;
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
