//! Cluster mode (§15, issue 13) on this machine: workload 1 on the
//! PostgreSQL store, and failover after `kill -9`. Each case starts its own
//! throwaway PostgreSQL server (Debian's binaries, as in the tests; `fsync`
//! on in `fsync` mode, so commits really are flushed) on a free port.
//!
//! - `pg-approve`: workload 1 in-process on one node (the runtime's own API,
//!   as workload 1 on sled), joined to a cluster of one: sessions parked
//!   and approvals finished per second, PostgreSQL round trips and
//!   transactions per session, CPU per session (this process, and the whole
//!   machine, PostgreSQL included). Measured after a round of warm-up on
//!   the same server (see `warm_up`).
//! - `pg-http`: workload 1 over HTTP against one and against three
//!   `overseer serve` processes (sessions created round-robin, approvals
//!   sent to random nodes: two in three are forwarded to the owner), 64
//!   clients following each session's event stream.
//! - `failover`: four nodes, N sessions parked on one, `kill -9` of it:
//!   time until the three survivors hold every lease, and until every
//!   session has a live actor on them again; and how the sessions were
//!   spread over the survivors (claims per survivor, the largest against a
//!   fair third).
//!
//! Figures are measured, never asserted; a tool that did not run exactly
//! once (or a session that did not finish) fails the run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use overseer::actors::RuntimeConfig;
use overseer::cluster::{Cluster, ClusterOptions};
use overseer::store::postgres::{PgOptions, PgStore};
use serde_json::{json, Value};

use crate::common::{
    busy, cpu_seconds, finish, park, rate, start_with, Mode, Probe, Res, Row, Rows, Runs,
};
use crate::pg::PgServer;

/// Concurrent HTTP clients.
const CLIENTS: usize = 64;

fn durability(mode: Mode) -> overseer::store::Durability {
    match mode {
        Mode::Fsync => overseer::store::Durability::Fsync,
        Mode::Os => overseer::store::Durability::Os,
    }
}

/// CPU seconds the whole machine has spent (all processes), from /proc/stat.
fn machine_cpu_seconds() -> Res<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().ok_or("empty /proc/stat")?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system (idle iowait excluded) irq softirq steal
    let busy = f.first().copied().unwrap_or(0.0)
        + f.get(1).copied().unwrap_or(0.0)
        + f.get(2).copied().unwrap_or(0.0)
        + f.get(5).copied().unwrap_or(0.0)
        + f.get(6).copied().unwrap_or(0.0)
        + f.get(7).copied().unwrap_or(0.0);
    Ok(busy / 100.0)
}

/// The machine's CPU per approval while finishing, and the cores busy in
/// each phase, from the machine's CPU seconds at the start, between the
/// phases and at the end.
fn phase_rows(rows: &mut Rows, n: usize, m: [f64; 3], park: Duration, finish: Duration) {
    rows.add(
        "machine CPU per approval (finish phase alone)",
        Some((m[2] - m[1]) * 1e3 / n as f64),
        "ms",
        "",
    );
    rows.add("cores busy (park)", busy(m[1] - m[0], park), "cores", "");
    rows.add(
        "cores busy (finish)",
        busy(m[2] - m[1], finish),
        "cores",
        "",
    );
}

async fn pg_commits(url: &str) -> Res<i64> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    // Counters are published by each backend at most once a second; force
    // a fresh snapshot so the figure is current.
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let v: i64 = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?
        .get(0);
    drop(client);
    let _ = task.await;
    Ok(v)
}

/// One in-process node over PostgreSQL database `url`, joined to a cluster
/// of one.
struct OneNode {
    store: PgStore,
    probe: Arc<Probe>,
    runs: Arc<Runs>,
    ov: overseer::actors::Overseer,
    cluster: Cluster,
}

impl OneNode {
    async fn start(url: &str, mode: Mode) -> Res<Self> {
        let store = PgStore::open(
            url,
            PgOptions {
                durability: durability(mode),
                ..PgOptions::default()
            },
        )
        .await?;
        let probe = Arc::new(Probe::new(Arc::new(store.clone())));
        let runs = Arc::new(Runs::default());
        let ov = start_with(probe.clone(), runs.clone(), RuntimeConfig::default()).await?;
        let cluster = Cluster::join(
            store.clone(),
            ov.clone(),
            ClusterOptions::new("http://127.0.0.1:1"),
        )
        .await?;
        Ok(Self {
            store,
            probe,
            runs,
            ov,
            cluster,
        })
    }
}

/// Brings a throwaway server to where a server in service is before the
/// measured round: the same workload once in a database of its own, then
/// that database dropped and a checkpoint. Without it, the measured round
/// paid what only a new server pays: every commit that crossed into a new
/// write-ahead log segment wrote the whole segment (16 MiB) full of zeros
/// first (`XLogFileInit`), and each shared buffer was touched for the first
/// time (a page fault), together about a sixth of PostgreSQL's CPU in the
/// finish phase (`perf`, PROFILE.md). A server in service recycles the
/// segments its checkpoints free, as this one does after the checkpoint.
async fn warm_up(server: &PgServer, mode: Mode, n: usize, limit: usize) -> Res<()> {
    let url = server.database().await.map_err(|e| e.to_string())?;
    let node = OneNode::start(&url, mode).await?;
    let parked = park(&node.ov, &node.probe, 1..=n, limit).await?;
    finish(&node.ov, &node.probe, parked, limit).await?;
    node.cluster.stop_tasks();
    node.ov.shutdown().await?;
    drop(node);
    let name = url
        .rsplit('/')
        .next()
        .ok_or("a database URL without a name")?;
    let admin = server.url("postgres");
    // The store's pool may still be closing its connections.
    PgServer::execute(&admin, &format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .map_err(|e| e.to_string())?;
    PgServer::execute(&admin, "CHECKPOINT")
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Workload 1 on one in-process node over PostgreSQL.
pub async fn approve(
    mode: Mode,
    n: usize,
    limit: usize,
    _base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let server = PgServer::start_with(mode == Mode::Fsync).map_err(|e| e.to_string())?;
    warm_up(&server, mode, n, limit).await?;
    let url = server.database().await.map_err(|e| e.to_string())?;
    let OneNode {
        store,
        probe,
        runs,
        ov,
        cluster,
    } = OneNode::start(&url, mode).await?;
    let mut rows = Rows::new("pg-approve (1 node, in-process)", Some(mode), n);

    // Counters after the join (its heartbeat, migrations and scans).
    let (r0, c0, x0) = (
        store.round_trips(),
        store.commits(),
        pg_commits(&url).await?,
    );
    let (cpu0, m0) = (cpu_seconds()?, machine_cpu_seconds()?);
    let t = Instant::now();
    let parked = park(&ov, &probe, 1..=n, limit).await?;
    let park_time = t.elapsed();
    let (r1, c1, x1) = (
        store.round_trips(),
        store.commits(),
        pg_commits(&url).await?,
    );
    let (cpu1, m1) = (cpu_seconds()?, machine_cpu_seconds()?);
    eprintln!("  parked {n} in {park_time:.2?}");
    let t = Instant::now();
    let mut rtt = finish(&ov, &probe, parked, limit).await?;
    let finish_time = t.elapsed();
    let (r2, c2, x2) = (
        store.round_trips(),
        store.commits(),
        pg_commits(&url).await?,
    );
    let (cpu2, m2) = (cpu_seconds()?, machine_cpu_seconds()?);
    eprintln!("  finished {n} in {finish_time:.2?}");
    let (bad, _) = runs.check(n);
    cluster.stop_tasks();
    ov.shutdown().await?;

    let per = |a: u64, b: u64| Some(b.saturating_sub(a) as f64 / n as f64);
    let per_i = |a: i64, b: i64| Some((b - a) as f64 / n as f64);
    rows.add("park rate", rate(n, park_time), "sessions/s", "");
    rows.add(
        "finish rate",
        rate(n, finish_time),
        "approvals/s",
        ">= 10000",
    );
    rows.latency(&format!("round trip ({limit} in flight)"), &mut rtt, "", "");
    rows.add(
        "round trips per session (park)",
        per(r0, r1),
        "round trips",
        "",
    );
    rows.add(
        "round trips per session (finish)",
        per(r1, r2),
        "round trips",
        "",
    );
    rows.add(
        "checkpoint transactions per session (park)",
        per(c0, c1),
        "transactions",
        "",
    );
    rows.add(
        "checkpoint transactions per session (finish)",
        per(c1, c2),
        "transactions",
        "",
    );
    rows.add(
        "all transactions per session (park + finish, pg_stat_database)",
        per_i(x0, x2),
        "transactions",
        "",
    );
    let _ = x1;
    rows.add(
        "overseer CPU per session",
        Some((cpu2 - cpu0) * 1e3 / n as f64),
        "ms",
        "",
    );
    rows.add(
        "machine CPU per session (PostgreSQL included)",
        Some((m2 - m0) * 1e3 / n as f64),
        "ms",
        "<= 0.35",
    );
    rows.add(
        "overseer CPU per approval (finish phase alone)",
        Some((cpu2 - cpu1) * 1e3 / n as f64),
        "ms",
        "",
    );
    phase_rows(&mut rows, n, [m0, m1, m2], park_time, finish_time);
    rows.add(
        "tools run exactly once",
        Some((n - bad.len().min(n)) as f64),
        "sessions",
        &format!("= {n}"),
    );
    if !bad.is_empty() {
        failures.push(format!(
            "pg-approve {} N={n}: {} tools did not run exactly once; first: {}",
            mode.as_str(),
            bad.len(),
            bad[0]
        ));
    }
    Ok(rows.rows)
}

// ---------------------------------------------------------------------------
// Nodes as processes

const SCENARIO: &str = r#"{
  "name": "bench-cluster",
  "agents": {"bench": [
    {"tool_calls": [{"name": "current_time", "arguments": {}}]},
    {"text": "done {{user_number}}"}
  ]}
}"#;

struct Node {
    child: Child,
    url: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the nodes' config (auth off on loopback; `current_time` under
/// `approval = "always"`, so every session parks on one call).
fn config(dir: &Path, mode: Mode) -> Res<std::path::PathBuf> {
    let scenario = dir.join("scenario.json");
    std::fs::write(&scenario, SCENARIO)?;
    let config = dir.join("overseer.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nkind = \"postgres\"\ndurability = \"{}\"\n\n\
             [http]\nauth = \"none\"\nmax_in_flight_requests = 1024\nmax_connections = 2048\n\n\
             [provider]\nkind = \"scripted\"\nscenario = {:?}\n\n\
             [[agents]]\nname = \"bench\"\ntools = [\"current_time\"]\napproval = \"always\"\n",
            mode.as_str(),
            scenario.display().to_string()
        ),
    )?;
    Ok(config)
}

fn start_node(config: &Path, url: &str) -> Res<Node> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_overseer"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("OVERSEER_DATABASE_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.strip_prefix("listening on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(format!("http://{addr}"));
                }
            } else if line.contains("ERROR") || line.starts_with("error") {
                eprintln!("  node: {line}");
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "a node did not start listening")?;
    Ok(Node { child, url })
}

/// Reads one session's event stream until an event of type `until`;
/// returns the id of that event and its data.
async fn until(client: &reqwest::Client, url: &str, after: u64, until: &str) -> Res<(u64, Value)> {
    let resp = client
        .get(url)
        .header("Last-Event-ID", after.to_string())
        .send()
        .await?
        .error_for_status()?;
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .map_err(|_| format!("no {until} event within 120 s on {url}"))?
            .ok_or_else(|| format!("stream ended before {until} on {url}"))??;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (0u64, "", String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().unwrap_or(0);
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v;
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if event == until {
                return Ok((id, serde_json::from_str(&data)?));
            }
        }
    }
}

/// Workload 1 over HTTP against `nodes` processes.
pub async fn http(
    mode: Mode,
    n: usize,
    nodes: usize,
    base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let server = PgServer::start_with(mode == Mode::Fsync).map_err(|e| e.to_string())?;
    let db = server.database().await.map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-cluster-")
        .tempdir_in(base)?;
    let config = config(dir.path(), mode)?;
    let running: Vec<Node> = (0..nodes)
        .map(|_| start_node(&config, &db))
        .collect::<Res<_>>()?;
    let urls: Vec<String> = running.iter().map(|n| n.url.clone()).collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS * 2)
        .build()?;
    let m0 = machine_cpu_seconds()?;
    let x0 = pg_commits(&db).await?;

    // Create round-robin; follow each on its owner until it parks.
    let t = Instant::now();
    let parked: Vec<(String, u64, String)> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let url = urls[i % urls.len()].clone();
            async move {
                let created: Value = client
                    .post(format!("{url}/v1/sessions"))
                    .json(&json!({"agent": "bench", "prompt": format!("task {i}"), "auto_complete": true}))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let id = created["id"].as_str().ok_or("no id")?.to_owned();
                let (seq, data) =
                    until(&client, &format!("{url}/v1/sessions/{id}/events"), 0, "approval_requested")
                        .await?;
                let call = data["call_id"].as_str().ok_or("no call_id")?.to_owned();
                Res::Ok((id, seq, call))
            }
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<_>>()?;
    let park_time = t.elapsed();
    let m1 = machine_cpu_seconds()?;
    eprintln!("  {nodes} node(s): parked {n} in {park_time:.2?}");

    // Approve at a random node; follow on the owner until the turn ends.
    let forwarded = AtomicUsize::new(0);
    let t = Instant::now();
    let mut rtts: Vec<Duration> = futures::stream::iter(parked.into_iter().enumerate())
        .map(|(i, (id, seq, call))| {
            let client = client.clone();
            let owner = urls[i % urls.len()].clone();
            let to = urls[(i * 7 + i / 3) % urls.len()].clone();
            if owner != to {
                forwarded.fetch_add(1, Ordering::Relaxed);
            }
            async move {
                let events = format!("{owner}/v1/sessions/{id}/events");
                let follow = tokio::spawn({
                    let client = client.clone();
                    async move { until(&client, &events, seq, "turn_ended").await }
                });
                let sent = Instant::now();
                client
                    .post(format!("{to}/v1/sessions/{id}/approvals"))
                    .json(&json!({"decisions": {call: {"decision": "approve"}}}))
                    .send()
                    .await?
                    .error_for_status()?;
                follow.await??;
                Res::Ok(sent.elapsed())
            }
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<_>>()?;
    let finish_time = t.elapsed();
    let m2 = machine_cpu_seconds()?;
    let x1 = pg_commits(&db).await?;
    eprintln!("  {nodes} node(s): finished {n} in {finish_time:.2?}");
    drop(running);

    let name = if nodes == 1 {
        "pg-http (1 node)"
    } else {
        "pg-http (3 nodes)"
    };
    let mut rows = Rows::new(name, Some(mode), n);
    rows.add("create + park rate", rate(n, park_time), "sessions/s", "");
    rows.add(
        "approve + finish rate",
        rate(n, finish_time),
        "approvals/s",
        "",
    );
    rows.add(
        "approvals sent to a node that forwarded them",
        Some(forwarded.load(Ordering::Relaxed) as f64 / n as f64 * 100.0),
        "%",
        "",
    );
    rows.latency("round trip over HTTP", &mut rtts, "", "");
    rows.add(
        "all transactions per session (pg_stat_database)",
        Some((x1 - x0) as f64 / n as f64),
        "transactions",
        "",
    );
    rows.add(
        "machine CPU per session (nodes, PostgreSQL, clients)",
        Some((m2 - m0) * 1e3 / n as f64),
        "ms",
        "",
    );
    phase_rows(&mut rows, n, [m0, m1, m2], park_time, finish_time);
    let _ = failures;
    Ok(rows.rows)
}

/// Failover of `n` parked sessions after `kill -9` of their node.
pub async fn failover(
    mode: Mode,
    n: usize,
    base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let server = PgServer::start_with(mode == Mode::Fsync).map_err(|e| e.to_string())?;
    let db = server.database().await.map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-failover-")
        .tempdir_in(base)?;
    let config = config(dir.path(), mode)?;
    let mut doomed = start_node(&config, &db)?;
    let survivors = [
        start_node(&config, &db)?,
        start_node(&config, &db)?,
        start_node(&config, &db)?,
    ];
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;
    let url = doomed.url.clone();
    let ids: Vec<String> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let url = url.clone();
            async move {
                let created: Value = client
                    .post(format!("{url}/v1/sessions"))
                    .json(&json!({"agent": "bench", "prompt": format!("task {i}"), "auto_complete": true}))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let id = created["id"].as_str().ok_or("no id")?.to_owned();
                until(&client, &format!("{url}/v1/sessions/{id}/events"), 0, "approval_requested").await?;
                Res::Ok(id)
            }
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Res<_>>()?;
    eprintln!("  parked {n} on one node; kill -9");
    let (pg, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls).await?;
    let _conn = tokio::spawn(conn);
    let doomed_id: uuid::Uuid = pg
        .query_one("SELECT id FROM nodes WHERE url = $1", &[&doomed.url])
        .await?
        .get(0);
    let killed = Instant::now();
    let _ = doomed.child.kill();
    let _ = doomed.child.wait();
    let uuids: Vec<uuid::Uuid> = ids.iter().filter_map(|i| i.parse().ok()).collect();
    let leases = loop {
        let left: i64 = pg
            .query_one(
                "SELECT count(*) FROM unnest($1::uuid[]) AS s(id)
                 LEFT JOIN leases l ON l.root_id = s.id
                 WHERE l.node_id IS NULL OR l.node_id = $2",
                &[&uuids, &doomed_id],
            )
            .await?
            .get(0);
        if left == 0 {
            break killed.elapsed();
        }
        if killed.elapsed() > Duration::from_secs(120) {
            return Err(format!("{left} sessions not taken over after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Every session has a live actor again on a survivor.
    let live = loop {
        let mut total = 0.0;
        for s in &survivors {
            let text = client
                .get(format!("{}/metrics", s.url))
                .send()
                .await?
                .text()
                .await?;
            total += text
                .lines()
                .filter(|l| l.starts_with("overseer_live_sessions"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        if total >= n as f64 {
            break killed.elapsed();
        }
        if killed.elapsed() > Duration::from_secs(120) {
            return Err(format!("only {total} of {n} sessions live after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("  taken over in {leases:.2?}, all live in {live:.2?}");
    let mut claims = Vec::new();
    for s in &survivors {
        let count: i64 = pg
            .query_one(
                "SELECT count(*) FROM unnest($1::uuid[]) AS s(id)
                 JOIN leases l ON l.root_id = s.id
                 JOIN nodes n ON n.id = l.node_id WHERE n.url = $2",
                &[&uuids, &s.url],
            )
            .await?
            .get(0);
        claims.push(count as f64);
    }
    eprintln!("  claims per survivor: {claims:?}");
    let fair = n as f64 / survivors.len() as f64;
    let most = claims.iter().copied().fold(0.0, f64::max);
    let least = claims.iter().copied().fold(f64::MAX, f64::min);
    let mut rows = Rows::new("failover after kill -9 (4 nodes)", Some(mode), n);
    rows.add(
        "claims by the survivor that took most",
        Some(most),
        "sessions",
        "",
    );
    rows.add(
        "claims by the survivor that took least",
        Some(least),
        "sessions",
        "",
    );
    rows.add(
        "largest share / fair share (n / 3)",
        Some(most / fair),
        "x",
        "<= 2",
    );
    rows.add(
        "every lease taken over",
        Some(leases.as_secs_f64()),
        "s",
        "",
    );
    rows.add(
        "every session live again on the survivors",
        Some(live.as_secs_f64()),
        "s",
        "<= lease_secs + 5 = 15",
    );
    let _ = failures;
    Ok(rows.rows)
}
