//! Shared helpers of the actors integration tests: test tools, a harness
//! around `Overseer` with the in-memory store, and event waiting.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use overseer_actors::model::{
    AgentConfig, CallState, Decision, EventKind, Notification, SessionId, SessionStatus,
    StopReason, Submission, ToolCallId, TranscriptEntry,
};
use overseer_actors::provider::Provider;
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::{CheckpointStore, MemStore};
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use tokio::sync::broadcast;

// ---- test tools -------------------------------------------------------------

/// Echoes its arguments; requires approval; counts executions.
pub struct Echo {
    spec: ToolSpec,
    runs: Arc<AtomicU32>,
    seen: Arc<std::sync::Mutex<Vec<Value>>>,
}

#[async_trait::async_trait]
impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(arguments.clone());
        Ok(json!({"echo": arguments}))
    }
}

/// Never finishes (until killed or timed out).
pub struct Stuck(ToolSpec);

#[async_trait::async_trait]
impl Tool for Stuck {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        futures::future::pending::<()>().await;
        Ok(Value::Null)
    }
}

/// Returns a result larger than the 10 MiB cap.
pub struct Huge(ToolSpec);

#[async_trait::async_trait]
impl Tool for Huge {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        Ok(Value::String("x".repeat(11 * 1024 * 1024)))
    }
}

/// Panics.
pub struct Boom(ToolSpec);

#[async_trait::async_trait]
impl Tool for Boom {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        panic!("boom went the tool");
    }
}

pub fn object_schema() -> Value {
    json!({"type": "object"})
}

pub struct Harness {
    pub ov: Overseer,
    pub store: MemStore,
    pub echo_runs: Arc<AtomicU32>,
    pub echo_seen: Arc<std::sync::Mutex<Vec<Value>>>,
}

pub fn tools(runs: Arc<AtomicU32>, seen: Arc<std::sync::Mutex<Vec<Value>>>) -> ToolRegistry {
    let echo_schema = json!({
        "type": "object",
        "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": false
    });
    ToolRegistry::new(vec![
        Arc::new(Echo {
            spec: ToolSpec::new("echo", "echoes", echo_schema).with_approval(true),
            runs,
            seen,
        }),
        Arc::new(Stuck(
            ToolSpec::new("stuck", "never ends", object_schema()).with_timeout(5),
        )),
        Arc::new(Stuck(
            ToolSpec::new("stuck_idem", "never ends, safe to retry", object_schema())
                .idempotent(true),
        )),
        Arc::new(Huge(ToolSpec::new("huge", "too big", object_schema()))),
        Arc::new(Boom(ToolSpec::new("boom", "panics", object_schema()))),
        Arc::new(Echo {
            spec: ToolSpec::new("free_echo", "echoes without approval", object_schema()),
            runs: Arc::new(AtomicU32::new(0)),
            seen: Arc::new(std::sync::Mutex::new(Vec::new())),
        }),
    ])
    .unwrap()
}

pub fn agent(tools: &[&str]) -> AgentConfig {
    let mut a = AgentConfig::new("a", tools);
    a.max_steps = 5;
    a
}

pub async fn harness_with(agent: AgentConfig, provider: Arc<dyn Provider>) -> Harness {
    harness_cfg(agent, provider, RuntimeConfig::default()).await
}

pub async fn harness_cfg(
    agent: AgentConfig,
    provider: Arc<dyn Provider>,
    config: RuntimeConfig,
) -> Harness {
    let store = MemStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ov = Overseer::start(
        vec![agent],
        Arc::new(store.clone()),
        provider,
        tools(runs.clone(), seen.clone()),
        config,
    )
    .await
    .unwrap();
    Harness {
        ov,
        store,
        echo_runs: runs,
        echo_seen: seen,
    }
}

pub fn scripted(steps: Value) -> Arc<dyn Provider> {
    let scenario =
        Scenario::from_json(&json!({"name": "test", "agents": {"a": steps}}).to_string()).unwrap();
    Arc::new(ScriptedProvider::new(scenario))
}

pub async fn harness(agent: AgentConfig, steps: Value) -> Harness {
    harness_with(agent, scripted(steps)).await
}

impl Harness {
    /// Creates a session with `prompt`, subscribed before it starts.
    pub async fn start(&self, prompt: &str) -> (SessionId, broadcast::Receiver<Notification>) {
        let id = SessionId::generate();
        let rx = self.ov.subscribe(id);
        self.ov
            .create_session(CreateSession {
                agent: "a".into(),
                tenant: "t".into(),
                prompt: Some(prompt.into()),
                id: Some(id),
                ..CreateSession::default()
            })
            .await
            .unwrap();
        (id, rx)
    }

    pub async fn pending(&self, id: SessionId) -> Vec<ToolCallId> {
        let s = self.ov.state(id).await.unwrap();
        s.header
            .open_calls
            .iter()
            .filter(|c| c.state == CallState::AwaitingApproval)
            .map(|c| c.id.clone())
            .collect()
    }

    pub async fn approve(&self, id: SessionId, call: &ToolCallId) {
        self.ov
            .submit(id, Submission::one(call.clone(), Decision::approve()))
            .await
            .unwrap();
    }

    pub async fn transcript(&self, id: SessionId) -> Vec<TranscriptEntry> {
        transcript_of(&self.ov, id).await
    }
}

/// The transcript of `id` as `ov` sees it.
pub async fn transcript_of(ov: &Overseer, id: SessionId) -> Vec<TranscriptEntry> {
    let s = ov.state(id).await.unwrap();
    s.transcript.iter().map(|e| (**e).clone()).collect()
}

/// Approves the one call pending at `id` (its own or a descendant's) and
/// waits for the turn to end.
pub async fn approve_the_pending_call(ov: &Overseer, id: SessionId) -> StopReason {
    let pending = ov.pending_approvals(id).await.unwrap();
    assert_eq!(pending.len(), 1);
    let mut rx = ov.subscribe(id);
    ov.submit(
        id,
        Submission::one(pending[0].call.id.clone(), Decision::approve()),
    )
    .await
    .unwrap();
    turn_end(&mut rx).await
}

/// The longest any one wait of a test may take, in wall-clock time. It only
/// turns a hang into a failure naming what never happened; nothing is timed
/// against it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Runs `fut`, failing the test if it has not finished within [`PATIENCE`]
/// of wall-clock time. The deadline is kept by a thread, not by tokio, so
/// paused tokio time neither trips it nor is held back by it; one thread
/// ([`wall_clock`]) keeps the deadlines of every wait of the process, and a
/// wait that ends takes its deadline with it.
pub async fn bounded<T>(what: impl std::fmt::Display, fut: impl Future<Output = T>) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // A closed channel (the watchdog thread gone) must not fail the wait.
    let expired = async {
        let registered = wall_clock()
            .send((std::time::Instant::now() + PATIENCE, tx))
            .is_ok();
        if !registered || rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        v = fut => v,
        () = expired => panic!("gave up after {PATIENCE:?} (wall clock) waiting for {what}"),
    }
}

/// A deadline of [`bounded`]: when it passes, the sender is told (unless its
/// wait has ended and dropped the receiver).
type Deadline = (std::time::Instant, tokio::sync::oneshot::Sender<()>);

/// The one thread keeping the deadlines of [`bounded`]: it sleeps until the
/// earliest one, fires the passed ones and forgets those whose wait ended.
fn wall_clock() -> &'static std::sync::mpsc::Sender<Deadline> {
    static CLOCK: std::sync::OnceLock<std::sync::mpsc::Sender<Deadline>> =
        std::sync::OnceLock::new();
    CLOCK.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Deadline>();
        std::thread::spawn(move || {
            let mut deadlines: Vec<Deadline> = Vec::new();
            loop {
                let now = std::time::Instant::now();
                let mut kept = Vec::with_capacity(deadlines.len());
                for (at, tx) in deadlines.drain(..) {
                    if tx.is_closed() {
                        continue;
                    }
                    if at <= now {
                        let _ = tx.send(());
                    } else {
                        kept.push((at, tx));
                    }
                }
                deadlines = kept;
                // Wake at the earliest deadline, and at least every second
                // to forget the waits that ended.
                let wait = deadlines
                    .iter()
                    .map(|(at, _)| at.saturating_duration_since(now))
                    .min()
                    .unwrap_or(Duration::from_secs(1))
                    .min(Duration::from_secs(1));
                match rx.recv_timeout(wait) {
                    Ok(deadline) => deadlines.push(deadline),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        tx
    })
}

/// Polls `check` (every `every` of tokio time, paused or not) until it gives
/// a value, within [`PATIENCE`] of wall-clock time.
pub async fn poll<T, F, Fut>(what: &str, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    bounded(what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(every).await;
        }
    })
    .await
}

/// Waits until a durable event matches; returns it.
pub async fn until(
    rx: &mut broadcast::Receiver<Notification>,
    pred: impl Fn(&EventKind) -> bool,
) -> EventKind {
    bounded("an event that never came", async {
        loop {
            match rx.recv().await {
                Ok(Notification::Event(e)) if pred(&e.kind) => return e.kind,
                Ok(_) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
}

pub async fn until_status(rx: &mut broadcast::Receiver<Notification>, status: SessionStatus) {
    until(
        rx,
        |k| matches!(k, EventKind::StatusChanged { status: s } if *s == status),
    )
    .await;
}

pub async fn turn_end(rx: &mut broadcast::Receiver<Notification>) -> StopReason {
    match until(rx, |k| matches!(k, EventKind::TurnEnded { .. })).await {
        EventKind::TurnEnded { stop_reason, .. } => stop_reason,
        _ => unreachable!(),
    }
}

pub fn final_text(t: &[TranscriptEntry]) -> String {
    t.iter()
        .rev()
        .find_map(|e| match e {
            TranscriptEntry::Assistant { text, .. } => Some(text.clone()),
            _ => None,
        })
        .unwrap()
}

pub fn tool_results(t: &[TranscriptEntry]) -> Vec<(String, CallState, Value)> {
    t.iter()
        .filter_map(|e| match e {
            TranscriptEntry::ToolResult { call } => {
                Some((call.name.clone(), call.state, call.result.clone().unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// Every call of the session, wherever it is, is terminal.
pub async fn assert_all_terminal(h: &Harness, id: SessionId) {
    let s = h.ov.state(id).await.unwrap();
    for c in &s.header.open_calls {
        assert!(
            c.state.is_terminal(),
            "open call {} left in {:?}",
            c.id,
            c.state
        );
    }
    for e in &s.transcript {
        if let TranscriptEntry::ToolResult { call } = e.as_ref() {
            assert!(
                call.state.is_terminal(),
                "call {} left in {:?}",
                call.id,
                call.state
            );
        }
    }
    // The store agrees with memory.
    let stored = h.store.load(id).await.unwrap().unwrap();
    assert_eq!(stored.header.status, s.header.status);
    assert!(stored
        .header
        .open_calls
        .iter()
        .all(|c| c.state.is_terminal()));
}

pub fn echo_then_answer() -> Value {
    json!([
        {"text": "Let me echo.", "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
        {"text": "Result: {{tool_result}}"}
    ])
}

/// A runtime with several agents and one scenario for all of them
/// (`steps` maps agent name to its steps).
pub async fn harness_agents(
    agents: Vec<AgentConfig>,
    steps: Value,
    config: RuntimeConfig,
) -> Harness {
    let scenario =
        Scenario::from_json(&json!({"name": "test", "agents": steps}).to_string()).unwrap();
    let store = MemStore::new();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ov = Overseer::start(
        agents,
        Arc::new(store.clone()),
        Arc::new(ScriptedProvider::new(scenario)),
        tools(runs.clone(), seen.clone()),
        config,
    )
    .await
    .unwrap();
    Harness {
        ov,
        store,
        echo_runs: runs,
        echo_seen: seen,
    }
}

impl Harness {
    /// Creates a session of `agent` with `prompt`, subscribed before it starts.
    pub async fn start_agent(
        &self,
        agent: &str,
        prompt: &str,
    ) -> (SessionId, broadcast::Receiver<Notification>) {
        let id = SessionId::generate();
        (id, self.start_agent_as(id, agent, prompt).await)
    }

    /// [`Harness::start_agent`] with the session id chosen by the caller.
    pub async fn start_agent_as(
        &self,
        id: SessionId,
        agent: &str,
        prompt: &str,
    ) -> broadcast::Receiver<Notification> {
        let rx = self.ov.subscribe(id);
        self.ov
            .create_session(CreateSession {
                agent: agent.into(),
                tenant: "t".into(),
                prompt: Some(prompt.into()),
                id: Some(id),
                ..CreateSession::default()
            })
            .await
            .unwrap();
        rx
    }
}
