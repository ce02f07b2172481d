//! Shared pieces of the harness: result rows, statistics, the store under
//! test, the bench agents/scenario/tool, and the probe that tells a workload
//! when a session reached the point it waits for.
//!
//! The probe wraps the checkpoint store instead of subscribing to the
//! runtime's event hub because a hub subscription allocates a 1024-slot
//! broadcast ring per session (~210 KiB, measured): subscribing to 100,000
//! sessions would measure the harness, not overseer. A checkpoint is the
//! moment an event becomes durable, and the hub publishes it right after, so
//! the probe sees the same milestones a subscriber would, a few µs earlier.
//! The low-concurrency round trip still uses the real `subscribe()` API.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use overseer::actors::model::{
    AgentConfig, CallState, Decision, Event, EventKind, SessionHeader, SessionId, SessionStatus,
    Submission, ToolCallId,
};
use overseer::actors::scripted::{Scenario, ScriptedProvider};
use overseer::actors::store::{
    Checkpoint, CheckpointStore, Resumable, SessionSummary, StoreError, StoredSession,
};
use overseer::actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use overseer::actors::{CreateSession, Overseer, RuntimeConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Semaphore};

/// The harness's error type: anything, across tasks.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Agent of workloads 1 and 4: proposes `write_record`, then answers.
pub const APPROVE_AGENT: &str = "bench";
/// Agent of workload 2: answers and waits for input.
pub const IDLE_AGENT: &str = "idle";
/// The approval-requiring bench tool.
pub const TOOL: &str = "write_record";
/// How long one session may take to reach a milestone before the run is
/// declared stuck (generous: a wait starts when its task starts, so it never
/// includes queueing behind the concurrency bound).
pub const STUCK_AFTER: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------
// Rows and statistics

/// Durability mode under test (mirrors `overseer::store::Durability`, so the
/// command line and the JSON do not depend on its spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Flush before a checkpoint is acknowledged.
    Fsync,
    /// Leave flushing to the OS.
    Os,
}

impl Mode {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fsync => "fsync",
            Mode::Os => "os",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fsync" => Some(Mode::Fsync),
            "os" => Some(Mode::Os),
            _ => None,
        }
    }
}

/// One line of the result table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Workload name.
    pub workload: String,
    /// `fsync`, `os` or `-` when it does not apply.
    pub durability: String,
    /// Sessions (or history length for the checkpoint workload).
    pub n: u64,
    /// What was measured.
    pub metric: String,
    /// The figure; `None` when not measurable (printed `n/a`).
    pub value: Option<f64>,
    /// Unit of `value`.
    pub unit: String,
    /// The design target for this figure, if it has one (issue 8).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
}

/// Builds rows that share workload, durability and N.
pub struct Rows {
    workload: &'static str,
    durability: String,
    n: u64,
    /// Rows so far.
    pub rows: Vec<Row>,
}

impl Rows {
    /// Rows for one case.
    pub fn new(workload: &'static str, mode: Option<Mode>, n: usize) -> Self {
        Self {
            workload,
            durability: mode.map_or("-", Mode::as_str).to_owned(),
            n: n as u64,
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn add(&mut self, metric: &str, value: Option<f64>, unit: &str, target: &str) {
        self.rows.push(Row {
            workload: self.workload.to_owned(),
            durability: self.durability.clone(),
            n: self.n,
            metric: metric.to_owned(),
            value,
            unit: unit.to_owned(),
            target: target.to_owned(),
        });
    }

    /// Adds a row with a different N (the checkpoint workload's history length).
    pub fn add_n(&mut self, n: u64, metric: &str, value: Option<f64>, unit: &str, target: &str) {
        self.add(metric, value, unit, target);
        if let Some(last) = self.rows.last_mut() {
            last.n = n;
        }
    }

    /// p50 and p99 (and max) of `samples`, in milliseconds.
    pub fn latency(&mut self, prefix: &str, samples: &mut [Duration], p50: &str, p99: &str) {
        samples.sort_unstable();
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        self.add(
            &format!("{prefix} p50"),
            ms(percentile(samples, 50.0)),
            "ms",
            p50,
        );
        self.add(
            &format!("{prefix} p99"),
            ms(percentile(samples, 99.0)),
            "ms",
            p99,
        );
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Per-second rate of `n` things done in `d`.
pub fn rate(n: usize, d: Duration) -> Option<f64> {
    let s = d.as_secs_f64();
    (s > 0.0).then(|| n as f64 / s)
}

/// Lets background work (sled's flusher, finished tasks, hibernation)
/// quiesce for `ms`, then has the allocator return the pages freed
/// meanwhile, so that the RSS read next counts what is live rather than
/// what a burst of finished work left to age out (jemalloc's background
/// thread would return those within its 10 s decay anyway).
pub async fn settle(ms: u64) {
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    if !overseer::alloc::release_freed_memory() {
        eprintln!("  jemalloc did not release freed pages: RSS includes them");
    }
}

/// Resident set size of this process, in bytes.
pub fn rss_bytes() -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS in /proc/self/status")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .ok_or("malformed VmRSS line")?
        .parse()?;
    Ok(kb * 1024)
}

/// CPU time this process (all threads) has used, in seconds. Divided by wall
/// time it says how many cores a phase kept busy: near the core count means
/// CPU-bound, near 1 means something runs one thing at a time.
pub fn cpu_seconds() -> Res<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = stat.rsplit_once(')').ok_or("malformed /proc/self/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line (1-based), so indexes
    // 11 and 12 after the name; in clock ticks, 100 per second on Linux.
    let ticks = |i: usize| -> Res<f64> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/self/stat")?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Cores kept busy: CPU seconds used over wall seconds elapsed.
pub fn busy(cpu: f64, wall: Duration) -> Option<f64> {
    let w = wall.as_secs_f64();
    (w > 0.0).then(|| cpu / w)
}

/// Memory the machine has available, and its total, in bytes.
pub fn memory() -> Res<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo")?;
    let field = |name: &str| -> Res<u64> {
        let line = info
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("no {name} in /proc/meminfo"))?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .ok_or("malformed /proc/meminfo")?
            .parse()?;
        Ok(kb * 1024)
    };
    Ok((field("MemAvailable:")?, field("MemTotal:")?))
}

// ---------------------------------------------------------------------------
// The store under test

/// The sled store of `overseer`, opened in a directory, plus the figures the
/// harness reads from it.
pub struct Backend {
    /// The store as the runtime sees it.
    pub store: Arc<dyn CheckpointStore>,
    sled: overseer::store::SledStore,
}

/// One workload's setup: a temp sled directory, its store behind a probe,
/// the tool's execution counter and a started runtime.
pub struct Bench {
    /// Removed on drop.
    pub dir: tempfile::TempDir,
    /// The store.
    pub backend: Backend,
    /// Milestones seen in checkpoints.
    pub probe: Arc<Probe>,
    /// Tool executions per key.
    pub runs: Arc<Runs>,
    /// The runtime.
    pub ov: Overseer,
}

impl Bench {
    /// Sets up a workload named `name` (the temp dir's prefix) under `base`.
    pub async fn start(name: &str, mode: Mode, base: &Path, config: RuntimeConfig) -> Res<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("overseer-bench-{name}-"))
            .tempdir_in(base)?;
        let backend = Backend::open(dir.path(), mode)?;
        let probe = Arc::new(Probe::new(backend.store.clone()));
        let runs = Arc::new(Runs::default());
        let ov = start_with(probe.clone(), runs.clone(), config).await?;
        Ok(Self {
            dir,
            backend,
            probe,
            runs,
            ov,
        })
    }
}

impl Bench {
    /// [`Bench::start`] with webhooks installed on the store before the
    /// runtime starts (`--webhook`); the endpoint is registered later.
    pub async fn start_with_webhooks(
        name: &str,
        mode: Mode,
        base: &Path,
        config: RuntimeConfig,
    ) -> Res<(Self, Arc<overseer::webhooks::Webhooks>)> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("overseer-bench-{name}-"))
            .tempdir_in(base)?;
        let backend = Backend::open(dir.path(), mode)?;
        let (webhooks, _) = crate::webhook::Hook::install(backend.sled()).await?;
        let probe = Arc::new(Probe::new(backend.store.clone()));
        let runs = Arc::new(Runs::default());
        let ov = start_with(probe.clone(), runs.clone(), config).await?;
        Ok((
            Self {
                dir,
                backend,
                probe,
                runs,
                ov,
            },
            webhooks,
        ))
    }
}

/// sled's page cache of the stores this process opens, MiB (`--cache-mb`;
/// default: the store's own default). Process-wide because every case runs
/// in a process of its own.
static CACHE_MB: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Sets the page cache of every store this process opens from now on.
pub fn set_cache_mb(mb: u64) {
    let _ = CACHE_MB.set(mb);
}

/// The page cache stores are opened with, MiB.
pub fn cache_mb() -> u64 {
    CACHE_MB
        .get()
        .copied()
        .unwrap_or(overseer::store::DEFAULT_CACHE_MB)
}

/// How the stores this process creates compress their log (`--compression`).
static COMPRESSION: std::sync::OnceLock<overseer::store::Compression> = std::sync::OnceLock::new();

/// Sets the compression of every store this process creates from now on.
pub fn set_compression(c: overseer::store::Compression) {
    let _ = COMPRESSION.set(c);
}

/// The compression stores are created with.
pub fn compression() -> overseer::store::Compression {
    COMPRESSION.get().copied().unwrap_or_default()
}

impl Backend {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path, mode: Mode) -> Res<Self> {
        let durability = match mode {
            Mode::Fsync => overseer::store::Durability::Fsync,
            Mode::Os => overseer::store::Durability::Os,
        };
        let options = overseer::store::StoreOptions {
            durability,
            cache_mb: cache_mb(),
            compression: compression(),
            ..overseer::store::StoreOptions::default()
        };
        let sled = overseer::store::SledStore::open_with(dir, &options)?;
        Ok(Self {
            store: Arc::new(sled.clone()),
            sled,
        })
    }

    /// The sled store itself.
    pub fn sled(&self) -> &overseer::store::SledStore {
        &self.sled
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Res<u64> {
        Ok(self.sled.size_on_disk()?)
    }

    /// Disk flushes issued so far (one per group commit).
    pub fn flushes(&self) -> u64 {
        self.sled.flush_count()
    }
}

/// Bytes of live keys and values in a closed store directory: what the
/// sessions hold, as opposed to what sled's log occupies on disk.
pub fn live_bytes(dir: &Path) -> Res<u64> {
    let db = sled::Config::new()
        .path(dir)
        .use_compression(compression() == overseer::store::Compression::Zstd)
        .open()?;
    let mut total = 0u64;
    for name in db.tree_names() {
        let tree = db.open_tree(&name)?;
        // Layout 4 keeps every kind of row in the tree `data`, the kind in
        // the key's first byte: counted per kind.
        let by_kind = name.as_ref() == b"data";
        let mut counts: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for item in tree.iter() {
            let (k, v) = item?;
            let label = match k.first() {
                Some(&kind) if by_kind => format!("data:{}", char::from(kind)),
                _ => String::from_utf8_lossy(&name).into_owned(),
            };
            let (rows, bytes) = counts.entry(label).or_default();
            *bytes += (k.len() + v.len()) as u64;
            *rows += 1;
        }
        for (label, (rows, bytes)) in counts {
            eprintln!("  live: {label:<12} {rows:>8} rows {bytes:>12} bytes");
            total += bytes;
        }
    }
    Ok(total)
}

// ---------------------------------------------------------------------------
// Agents, scenario and the bench tool

/// Counts executions of `write_record` per key, to verify exactly-once.
#[derive(Default)]
pub struct Runs {
    by_key: DashMap<i64, u32>,
}

impl Runs {
    /// Forgets every run (a workload that reuses keys checks each round).
    pub fn reset(&self) {
        self.by_key.clear();
        self.by_key.shrink_to_fit();
    }

    /// Keys in `1..=n` that did not run exactly once, and the total number of runs.
    pub fn check(&self, n: usize) -> (Vec<String>, u64) {
        let total = self.by_key.iter().map(|e| u64::from(*e.value())).sum();
        let mut bad = Vec::new();
        for key in 1..=n as i64 {
            let runs = self.by_key.get(&key).map_or(0, |r| *r);
            if runs != 1 {
                bad.push(format!("key {key} ran {runs} time(s)"));
            }
        }
        (bad, total)
    }
}

/// A side-effecting tool that needs approval and counts its executions.
pub struct WriteRecord {
    spec: ToolSpec,
    runs: Arc<Runs>,
}

impl WriteRecord {
    /// The tool, counting into `runs`.
    pub fn new(runs: Arc<Runs>) -> Self {
        let schema = json!({
            "type": "object",
            "properties": {"key": {"type": "integer"}},
            "required": ["key"],
            "additionalProperties": false
        });
        Self {
            spec: ToolSpec::new(TOOL, "Writes one record (bench).", schema).with_approval(true),
            runs,
        }
    }
}

#[async_trait::async_trait]
impl Tool for WriteRecord {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let key = arguments
            .get("key")
            .and_then(Value::as_i64)
            .ok_or_else(|| ToolError::new("key must be an integer"))?;
        *self.runs.by_key.entry(key).or_insert(0) += 1;
        Ok(json!({"written": key}))
    }
}

/// The scenario both agents play. "task 42" makes `write_record {"key": 42}`.
pub fn scenario() -> Res<Scenario> {
    let doc = json!({
        "name": "bench",
        "agents": {
            APPROVE_AGENT: [
                {"tool_calls": [{"name": TOOL, "arguments": {"key": "{{user_number}}"}}]},
                {"text": "done {{user_number}}"}
            ],
            IDLE_AGENT: [
                {"text": "ok {{user_number}}"}
            ]
        }
    });
    Ok(Scenario::from_json(&doc.to_string())?)
}

/// Starts a runtime with the bench agents on `store`.
pub async fn start(store: Arc<dyn CheckpointStore>, runs: Arc<Runs>) -> Res<Overseer> {
    start_with(store, runs, RuntimeConfig::default()).await
}

/// [`start`] with runtime tunables (e.g. a short hibernation delay).
pub async fn start_with(
    store: Arc<dyn CheckpointStore>,
    runs: Arc<Runs>,
    config: RuntimeConfig,
) -> Res<Overseer> {
    let agents = vec![
        AgentConfig::new(APPROVE_AGENT, &[TOOL]),
        AgentConfig::new(IDLE_AGENT, &[]),
    ];
    let provider = Arc::new(ScriptedProvider::new(scenario()?));
    let tools = ToolRegistry::new(vec![Arc::new(WriteRecord::new(runs))])?;
    Ok(Overseer::start(agents, store, provider, tools, config).await?)
}

/// The request that starts session `i` of a workload.
pub fn create_request(agent: &str, i: usize, auto_complete: bool) -> CreateSession {
    CreateSession {
        agent: agent.to_owned(),
        tenant: "bench".to_owned(),
        prompt: Some(format!("task {i}")),
        auto_complete,
        ..CreateSession::default()
    }
}

/// A submission approving every listed call.
pub fn approve_all(calls: &[ToolCallId]) -> Submission {
    let mut sub = Submission::default();
    for c in calls {
        sub.decisions.insert(c.clone(), Decision::approve());
    }
    sub
}

// ---------------------------------------------------------------------------
// The probe

/// What a workload waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The session is awaiting approval.
    Parked,
    /// A turn ended.
    TurnEnded,
}

/// What a session reached, as seen in a durable checkpoint.
#[derive(Debug)]
pub enum Reached {
    /// Awaiting approval of these calls.
    Parked(Vec<ToolCallId>),
    /// A turn ended; the session now has this status.
    TurnEnded(SessionStatus),
    /// Failed or cancelled: the wait is over, unsuccessfully.
    Failed(String),
}

impl Reached {
    fn satisfies(&self, want: Want) -> bool {
        matches!(
            (self, want),
            (Reached::Failed(_), _)
                | (Reached::Parked(_), Want::Parked)
                | (Reached::TurnEnded(_), Want::TurnEnded)
        )
    }

    fn of(cp: &Checkpoint) -> Option<Self> {
        let h = &cp.header;
        if matches!(h.status, SessionStatus::Failed | SessionStatus::Cancelled) {
            let why = h
                .error
                .clone()
                .unwrap_or_else(|| h.status.as_str().to_owned());
            return Some(Reached::Failed(format!("session {}: {why}", h.id)));
        }
        if cp
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::TurnEnded { .. }))
        {
            return Some(Reached::TurnEnded(h.status));
        }
        if h.status == SessionStatus::AwaitingApproval {
            let calls = h
                .open_calls
                .iter()
                .filter(|c| c.state == CallState::AwaitingApproval)
                .map(|c| c.id.clone())
                .collect();
            return Some(Reached::Parked(calls));
        }
        None
    }
}

enum Slot {
    Waiting(Want, oneshot::Sender<Reached>),
    Reached(Reached),
}

/// A [`CheckpointStore`] that passes everything through and wakes whoever
/// waits for a session's milestone once the checkpoint recording it is durable.
pub struct Probe {
    inner: Arc<dyn CheckpointStore>,
    // A milestone reached before anyone waited for it (a session can park
    // before `create_session` has returned its id) is kept until claimed.
    slots: DashMap<SessionId, Slot>,
    checkpoints: AtomicU64,
}

impl Probe {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn CheckpointStore>) -> Self {
        Self {
            inner,
            slots: DashMap::new(),
            checkpoints: AtomicU64::new(0),
        }
    }

    /// Registers interest in `want` for `id`; resolves at once if already reached.
    pub fn expect(&self, id: SessionId, want: Want) -> oneshot::Receiver<Reached> {
        let (tx, rx) = oneshot::channel();
        match self.slots.entry(id) {
            Entry::Occupied(mut e) => {
                if matches!(e.get(), Slot::Reached(r) if r.satisfies(want)) {
                    if let Slot::Reached(r) = e.remove() {
                        let _ = tx.send(r);
                    }
                } else {
                    // A stale milestone (or an abandoned wait) is replaced.
                    e.insert(Slot::Waiting(want, tx));
                }
            }
            Entry::Vacant(v) => {
                v.insert(Slot::Waiting(want, tx));
            }
        }
        rx
    }

    /// Waits for `want` on `id`, bounded by [`STUCK_AFTER`].
    pub async fn wait(&self, id: SessionId, want: Want) -> Res<Reached> {
        let rx = self.expect(id, want);
        wait_for(id, rx).await
    }

    /// Milestones seen or awaited but not claimed yet (what the probe
    /// itself holds in memory).
    pub fn pending(&self) -> usize {
        self.slots.len()
    }

    /// Checkpoints written through the probe so far.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    fn observe(&self, id: SessionId, reached: Reached) {
        match self.slots.entry(id) {
            Entry::Occupied(mut e) => match e.get() {
                Slot::Waiting(want, _) if reached.satisfies(*want) => {
                    if let Slot::Waiting(_, tx) = e.remove() {
                        let _ = tx.send(reached);
                    }
                }
                Slot::Waiting(..) => {}
                Slot::Reached(_) => {
                    e.insert(Slot::Reached(reached));
                }
            },
            Entry::Vacant(v) => {
                v.insert(Slot::Reached(reached));
            }
        }
    }
}

/// Awaits a probe receiver, bounded by [`STUCK_AFTER`].
pub async fn wait_for(id: SessionId, rx: oneshot::Receiver<Reached>) -> Res<Reached> {
    match tokio::time::timeout(STUCK_AFTER, rx).await {
        Ok(Ok(Reached::Failed(why))) => Err(why.into()),
        Ok(Ok(r)) => Ok(r),
        Ok(Err(_)) => Err(format!("session {id}: wait abandoned").into()),
        Err(_) => Err(format!("session {id}: stuck for {STUCK_AFTER:?}").into()),
    }
}

#[async_trait::async_trait]
impl CheckpointStore for Probe {
    fn reads_are_local(&self) -> bool {
        self.inner.reads_are_local()
    }

    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        // Decided before the write (it only looks at the header and the event
        // kinds), announced after it: a milestone counts once it is durable.
        let id = checkpoint.header.id;
        let reached = Reached::of(&checkpoint);
        self.inner.checkpoint(checkpoint).await?;
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        if let Some(reached) = reached {
            self.observe(id, reached);
        }
        Ok(())
    }

    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        self.inner.load(id).await
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.inner.load_header(id).await
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_after(id, after, limit).await
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_by_status(statuses, after, limit).await
    }

    async fn list_resumable(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<Resumable>, StoreError> {
        self.inner.list_resumable(after, limit).await
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_tenant(tenant, after, limit).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }

    async fn claim(&self, root: SessionId) -> Result<bool, StoreError> {
        self.inner.claim(root).await
    }
}

// ---------------------------------------------------------------------------
// Driving many sessions

/// Runs `f` on every item as its own task, at most `limit` at a time (so a
/// session's latency measures overseer, not a queue in the harness), and
/// returns the results in item order.
pub async fn bounded<I, T, F, Fut>(items: I, limit: usize, f: F) -> Res<Vec<T>>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: Future<Output = Res<T>> + Send + 'static,
    T: Send + 'static,
{
    let sem = Arc::new(Semaphore::new(limit.max(1)));
    let mut handles = Vec::new();
    for item in items {
        let permit = sem.clone().acquire_owned().await?;
        let fut = f(item);
        handles.push(tokio::spawn(async move {
            let out = fut.await;
            drop(permit);
            out
        }));
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await??);
    }
    Ok(out)
}

/// A session parked awaiting approval.
#[derive(Debug, Clone)]
pub struct Parked {
    /// Its task number (the tool's key).
    pub key: usize,
    /// Session.
    pub id: SessionId,
    /// Calls awaiting approval.
    pub calls: Vec<ToolCallId>,
}

/// Creates sessions `keys` ("task k" each) concurrently and waits until each
/// is awaiting approval.
pub async fn park(
    ov: &Overseer,
    probe: &Arc<Probe>,
    keys: std::ops::RangeInclusive<usize>,
    limit: usize,
) -> Res<Vec<Parked>> {
    bounded(keys, limit, |key| {
        let ov = ov.clone();
        let probe = probe.clone();
        async move {
            let id = ov
                .create_session(create_request(APPROVE_AGENT, key, true))
                .await?;
            match probe.wait(id, Want::Parked).await? {
                Reached::Parked(calls) if !calls.is_empty() => Ok(Parked { key, id, calls }),
                other => Err(format!("session {id} (task {key}) did not park: {other:?}").into()),
            }
        }
    })
    .await
}

/// Approves every parked session concurrently and waits until each turn
/// ended; returns each round trip (decision submitted → turn ended durably).
pub async fn finish(
    ov: &Overseer,
    probe: &Arc<Probe>,
    parked: Vec<Parked>,
    limit: usize,
) -> Res<Vec<Duration>> {
    bounded(parked, limit, |p| {
        let ov = ov.clone();
        let probe = probe.clone();
        async move {
            // Registered before submitting, so the end of a fast turn is not missed.
            let rx = probe.expect(p.id, Want::TurnEnded);
            let t = std::time::Instant::now();
            ov.submit(p.id, approve_all(&p.calls)).await?;
            match wait_for(p.id, rx).await? {
                Reached::TurnEnded(SessionStatus::Completed) => Ok(t.elapsed()),
                other => Err(format!("session {} ended as {other:?}", p.id).into()),
            }
        }
    })
    .await
}
