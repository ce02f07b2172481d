//! A cluster of `overseer serve` processes over one PostgreSQL database for
//! the black-box tests of cluster mode: the real binary (built with the
//! `fault-injection` feature, for the non-idempotent `ledger_append` tool
//! whose ledger file counts, from outside, how often each call really ran),
//! a throwaway database (`super::pg`), HTTP over loopback.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::served::Served;
use super::{send, PATIENCE, SECRET};

/// The scripted agents: `clerk` records one ledger entry (approval needed)
/// and answers; `lead` delegates that to a `clerk` child.
pub const SCENARIO: &str = r#"{
  "name": "cluster",
  "agents": {
    "clerk": [
      {"text": "Recording {{user_number}}.",
       "tool_calls": [{"name": "ledger_append", "arguments": {"entry": "n{{user_number}}"}}]},
      {"text": "Recorded: {{tool_result}}"}
    ],
    "lead": [
      {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "clerk", "goal": "record {{user_number}}"}}]},
      {"text": "lead: {{tool_result}}"}
    ]
  }
}"#;

/// Everything the nodes of one test share.
pub struct World {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub ledger: PathBuf,
    pub database: String,
    pub client: reqwest::Client,
    settings: Settings,
}

/// Tunables of a test cluster.
#[derive(Clone)]
pub struct Settings {
    pub heartbeat_secs: u64,
    pub lease_secs: u64,
    pub approval_timeout_secs: u64,
    pub store: &'static str,
    /// `[http] max_in_flight_requests` (local work's budget).
    pub max_in_flight_requests: usize,
    /// `[cluster] max_in_flight_forwards`.
    pub max_in_flight_forwards: usize,
    /// `[cluster] dead_node_retention_secs`.
    pub dead_node_retention_secs: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            heartbeat_secs: 1,
            lease_secs: 4,
            approval_timeout_secs: 3_600,
            store: "postgres",
            max_in_flight_requests: 128,
            max_in_flight_forwards: 128,
            dead_node_retention_secs: 3_600,
        }
    }
}

/// How one node differs from the others of its world.
#[derive(Default)]
pub struct NodeOptions {
    /// `[cluster] advertise_url` (default: its own listener).
    pub advertise_url: Option<String>,
    /// `OVERSEER_FAULT` (`point:nth:action`).
    pub fault: Option<String>,
}

impl World {
    pub fn new(database: String, settings: &Settings) -> anyhow::Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir()?;
        let scenario = dir.path().join("scenario.json");
        std::fs::write(&scenario, SCENARIO)?;
        let config = dir.path().join("overseer.toml");
        let ledger = dir.path().join("ledger");
        let world = Self {
            dir,
            config,
            ledger,
            database,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            settings: settings.clone(),
        };
        std::fs::write(&world.config, world.config_text(None))?;
        Ok(world)
    }

    /// The configuration file's text, advertising `advertise_url` if given.
    fn config_text(&self, advertise_url: Option<&str>) -> String {
        let settings = &self.settings;
        let scenario = self.dir.path().join("scenario.json");
        let data = self.dir.path().join("data");
        let advertise = advertise_url
            .map(|u| format!("advertise_url = {u:?}\n"))
            .unwrap_or_default();
        format!(
            "[store]\nkind = \"{store}\"\ndata_dir = {data:?}\ndurability = \"fsync\"\npool_size = 8\n\n\
             [http]\nmax_in_flight_requests = {in_flight}\n\n\
             [cluster]\nheartbeat_secs = {hb}\nlease_secs = {lease}\n\
             max_in_flight_forwards = {forwards}\ndead_node_retention_secs = {retention}\n{advertise}\n\
             [provider]\nkind = \"scripted\"\nscenario = {scenario:?}\n\n\
             [[agents]]\nname = \"clerk\"\ntools = [\"ledger_append\"]\napproval = \"per_tool\"\n\
             approval_timeout_secs = {timeout}\n\n\
             [[agents]]\nname = \"lead\"\ntools = [\"ledger_append\"]\nsubagents = [\"clerk\"]\n\
             approval_timeout_secs = {timeout}\n",
            store = settings.store,
            data = data.display().to_string(),
            in_flight = settings.max_in_flight_requests,
            hb = settings.heartbeat_secs,
            lease = settings.lease_secs,
            forwards = settings.max_in_flight_forwards,
            retention = settings.dead_node_retention_secs,
            scenario = scenario.display().to_string(),
            timeout = settings.approval_timeout_secs,
        )
    }

    /// Starts one node and waits until it listens.
    pub fn node(&self) -> anyhow::Result<Node> {
        Node::start(self, &NodeOptions::default())
    }

    /// Starts one node that differs from the others, and waits until it
    /// listens.
    pub fn node_with(&self, options: &NodeOptions) -> anyhow::Result<Node> {
        Node::start(self, options)
    }

    /// The `overseer serve` command of a node (its configuration written
    /// for it when it differs from the others').
    fn serve_command(&self, options: &NodeOptions) -> anyhow::Result<Command> {
        let config = match &options.advertise_url {
            None => self.config.clone(),
            Some(url) => {
                let path = self
                    .dir
                    .path()
                    .join(format!("overseer-{}.toml", uuid::Uuid::new_v4()));
                std::fs::write(&path, self.config_text(Some(url)))?;
                path
            }
        };
        let mut cmd = super::served::command();
        cmd.arg("--config")
            .arg(&config)
            .env("OVERSEER_JWT_SECRET", SECRET)
            .env("OVERSEER_DATABASE_URL", &self.database)
            .env("OVERSEER_TEST_LEDGER", &self.ledger)
            .env("RUST_LOG", "warn,overseer::cluster=info");
        if let Some(fault) = &options.fault {
            cmd.env("OVERSEER_FAULT", fault);
        }
        Ok(cmd)
    }

    /// Runs a node expected to refuse to start: its exit status and stderr,
    /// or an error if it is still running after `PATIENCE` (then killed).
    pub fn refused_node(
        &self,
        options: &NodeOptions,
    ) -> anyhow::Result<(std::process::ExitStatus, String)> {
        let mut child = self
            .serve_command(options)?
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stderr = child.stderr.take().context("stderr")?;
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let deadline = std::time::Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the node did not stop within {PATIENCE:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = reader.join().unwrap_or_default();
        Ok((status, text))
    }

    /// Ledger lines: entry → how many times it was appended.
    pub fn ledger(&self) -> BTreeMap<String, usize> {
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let entry = line.split(' ').nth(1).unwrap_or("").to_owned();
            *out.entry(entry).or_insert(0) += 1;
        }
        out
    }

    pub fn token(&self) -> String {
        super::token("acme", "alice", super::ALL)
    }
}

/// One `overseer serve` process.
pub struct Node {
    served: Served,
    pub url: String,
}

impl Node {
    fn start(world: &World, options: &NodeOptions) -> anyhow::Result<Self> {
        let served = Served::start(world.serve_command(options)?)?;
        let url = served.url.clone();
        Ok(Self { served, url })
    }

    pub fn pid(&self) -> u32 {
        self.served.child.id()
    }

    fn signal(&self, sig: &str) {
        self.served.signal(sig);
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        self.signal("-KILL");
        let _ = self.served.child.wait();
    }

    pub fn sigstop(&self) {
        self.signal("-STOP");
    }

    pub fn sigcont(&self) {
        self.signal("-CONT");
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.signal("-TERM");
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.served.child.try_wait()? {
                return Ok(status);
            }
            if std::time::Instant::now() > deadline {
                bail!("the node did not stop within {PATIENCE:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.served.log()
    }

    /// A metric's value summed over its label sets, from `/metrics`.
    pub async fn metric(&self, world: &World, name: &str) -> anyhow::Result<f64> {
        self.metric_where(world, name, "").await
    }

    /// A metric's value summed over the label sets that contain `label`
    /// (e.g. `outcome="ok"`), from `/metrics`.
    pub async fn metric_where(
        &self,
        world: &World,
        name: &str,
        label: &str,
    ) -> anyhow::Result<f64> {
        let admin = super::token("acme", "ops", &["admin"]);
        let answer = super::answer(
            world
                .client
                .get(format!("{}/metrics", self.url))
                .bearer_auth(admin),
        )
        .await?;
        anyhow::ensure!(
            answer.status == 200,
            "/metrics answered {}: {}",
            answer.status,
            answer.text
        );
        let text = answer.text;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter(|l| l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A stopped process must be continued to die of SIGKILL promptly
        // (`Served` kills it next).
        self.signal("-CONT");
    }
}

/// Creates a `clerk` session recording `n` on `node`; returns its id.
pub async fn create(world: &World, node: &Node, n: usize) -> anyhow::Result<String> {
    let (status, v) = send(
        world
            .client
            .post(format!("{}/v1/sessions", node.url))
            .bearer_auth(world.token())
            .json(&json!({"agent": "clerk", "prompt": format!("record {n}")})),
    )
    .await?;
    if status != 201 {
        bail!("create answered {status}: {v}");
    }
    v["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no id in {v}"))
}

/// `GET` on `node`, retrying 503 answers until `PATIENCE`.
pub async fn get(world: &World, node: &Node, path: &str) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, v) = send(
            world
                .client
                .get(format!("{}{path}", node.url))
                .bearer_auth(world.token()),
        )
        .await?;
        match status {
            200 => return Ok(v),
            503 if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            _ => bail!("GET {path} answered {status}: {v}"),
        }
    }
}

/// Waits until session `id` has a pending approval (asking `node`); returns
/// the call ids.
pub async fn pending(world: &World, node: &Node, id: &str) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let v = get(world, node, &format!("/v1/sessions/{id}/approvals")).await?;
        let calls: Vec<String> = v["pending"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["call_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if !calls.is_empty() {
            return Ok(calls);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("session {id} never had a pending approval: {v}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Approves `calls` of `id` on `node`, retrying while the answer is a 503
/// (the owner unreachable, the session moving, the database away); returns
/// the status of the answer that was not a 503. An attempt answered 503, or
/// cut off, may still have committed (the database went away between the
/// decision's commit and its reply): a retry that then finds the calls
/// already decided is that decision's answer, and counts as a 200. A 409
/// without an earlier ambiguous attempt is returned as it is.
pub async fn approve(
    world: &World,
    node: &Node,
    id: &str,
    calls: &[String],
) -> anyhow::Result<(u16, Value)> {
    let decisions: serde_json::Map<String, Value> = calls
        .iter()
        .map(|c| (c.clone(), json!({"decision": "approve"})))
        .collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut ambiguous = false;
    loop {
        let sent = send(
            world
                .client
                .post(format!("{}/v1/sessions/{id}/approvals", node.url))
                .bearer_auth(world.token())
                .json(&json!({ "decisions": decisions })),
        )
        .await;
        match sent {
            Ok((503, _)) | Err(_) if tokio::time::Instant::now() < deadline => {
                ambiguous = true;
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok((409, v)) if ambiguous && v["error"]["code"] == "already_decided" => {
                return Ok((200, v))
            }
            other => return other,
        }
    }
}

/// Waits until session `id` (asked on `node`) has `status`; returns it.
pub async fn wait_status(
    world: &World,
    node: &Node,
    id: &str,
    status: &str,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let v = get(world, node, &format!("/v1/sessions/{id}")).await?;
        if v["status"] == status {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("session {id} never reached {status}: {v}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
