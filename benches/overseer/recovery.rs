//! Workload 4, recovery: N sessions parked at approval in a sled directory,
//! the process killed (SIGKILL, no shutdown), then a fresh process opens the
//! same directory: how long until `recover()` returns (ready), and how long
//! until every session is approved and finished.
//!
//! The parking process is this bench binary re-invoked with a hidden flag
//! (`--case park-for-recovery`): a real second process, because a kill must
//! not give the runtime any chance to clean up, and sled allows one open
//! database per directory per process anyway.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use overseer::actors::model::{SessionId, ToolCallId};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::common::{
    busy, cpu_seconds, finish, park, rate, rss_bytes, start, Backend, Mode, Parked, Probe, Res,
    Row, Rows, Runs,
};

/// Workload name in the table.
pub const NAME: &str = "recovery";

/// Last line the parking process prints once every session is parked and durable.
const READY_LINE: &str = "PARKED";

/// Phase 1 (the process that gets killed): parks sessions `1..=n` in `dir`,
/// prints `P <session> <call>…` per session and [`READY_LINE`], then idles
/// until killed (or until its stdin closes, should the parent die first).
pub async fn park_and_wait(mode: Mode, n: usize, limit: usize, dir: &Path) -> Res<()> {
    let backend = Backend::open(dir, mode)?;
    let probe = Arc::new(Probe::new(backend.store.clone()));
    let ov = start(probe.clone(), Arc::new(Runs::default())).await?;
    let parked = park(&ov, &probe, 1..=n, limit).await?;
    // In `os` mode a kill may lose the last unflushed writes, by design; this
    // workload measures recovery time, not that window, so it flushes first.
    backend.store.flush().await?;
    let mut out = String::with_capacity(parked.len() * 96);
    for p in &parked {
        out.push_str(&format!("P {} {}", p.key, p.id));
        for c in &p.calls {
            out.push(' ');
            out.push_str(c.as_str());
        }
        out.push('\n');
    }
    out.push_str(READY_LINE);
    out.push('\n');
    let mut stdout = tokio::io::stdout();
    stdout.write_all(out.as_bytes()).await?;
    stdout.flush().await?;
    let mut sink = Vec::new();
    tokio::io::stdin().read_to_end(&mut sink).await?;
    // Reached only if the parent went away without killing us: still no
    // graceful shutdown, so the state on disk is the same as after a kill.
    std::process::exit(0);
}

/// Phase 2 (this process): spawns phase 1, kills it once parked, recovers.
pub async fn run(
    mode: Mode,
    n: usize,
    limit: usize,
    base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-recovery-")
        .tempdir_in(base)?;
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe);
    if crate::common::compression() == overseer::store::Compression::Zstd {
        child.args(["--compression", "zstd"]);
    }
    let mut child = child
        .args(["--case", "park-for-recovery", "--durability", mode.as_str()])
        .args([
            "--sessions",
            &n.to_string(),
            "--concurrency",
            &limit.to_string(),
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or("no stdout from the parking process")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut parked = Vec::with_capacity(n);
    let t = Instant::now();
    loop {
        let Some(line) = lines.next_line().await? else {
            let status = child.wait().await?;
            return Err(format!("the parking process ended early ({status})").into());
        };
        if line == READY_LINE {
            break;
        }
        parked.push(parse_parked(&line)?);
    }
    eprintln!(
        "  parked {n} in a child process in {:.2?}; killing it",
        t.elapsed()
    );
    child.start_kill()?;
    child.wait().await?;
    if parked.len() != n {
        return Err(format!(
            "the parking process reported {} of {n} sessions",
            parked.len()
        )
        .into());
    }

    let cpu0 = cpu_seconds()?;
    let t0 = Instant::now();
    let backend = Backend::open(dir.path(), mode)?;
    let opened = t0.elapsed();
    let probe = Arc::new(Probe::new(backend.store.clone()));
    let runs = Arc::new(Runs::default());
    let ov = start(probe.clone(), runs.clone()).await?;
    let recovered = ov.recover().await?;
    let ready = t0.elapsed();
    let cpu1 = cpu_seconds()?;
    // What a recovered (parked) session costs before anyone decides it:
    // the store's cache of what recovery read, the timers and the actors.
    let rss_ready = rss_bytes()?;
    eprintln!("  recovered {recovered} in {ready:.2?}");
    let t1 = Instant::now();
    finish(&ov, &probe, parked, limit).await?;
    let finished = t1.elapsed();
    let cpu2 = cpu_seconds()?;
    let total = t0.elapsed();
    eprintln!("  finished {n} in {finished:.2?}");
    let (bad, runs_total) = runs.check(n);
    ov.shutdown().await?;

    let mut rows = Rows::new(NAME, Some(mode), n);
    let secs = |d: std::time::Duration| Some(d.as_secs_f64());
    rows.add(
        "sessions recovered",
        Some(recovered as f64),
        "sessions",
        &format!("= {n}"),
    );
    let (ready_target, total_target) = if n >= 100_000 {
        ("<= 0.5", "<= 5")
    } else {
        ("", "")
    };
    rows.add("open + recover (ready)", secs(ready), "s", ready_target);
    rows.add("of which opening the store", secs(opened), "s", "");
    rows.add(
        "RSS once ready",
        Some(rss_ready as f64 / (1024.0 * 1024.0)),
        "MiB",
        "",
    );
    rows.add(
        "cores busy (recover)",
        busy(cpu1 - cpu0, ready),
        "cores",
        "",
    );
    rows.add("approve + finish all", secs(finished), "s", "");
    rows.add(
        "cores busy (finish)",
        busy(cpu2 - cpu1, finished),
        "cores",
        "",
    );
    rows.add("finish rate", rate(n, finished), "approvals/s", "");
    rows.add("ready + finished", secs(total), "s", total_target);
    rows.add(
        "tools run exactly once",
        Some((n - bad.len().min(n)) as f64),
        "sessions",
        &format!("= {n}"),
    );
    if recovered != n {
        failures.push(format!(
            "{NAME} {} N={n}: recovered {recovered} sessions",
            mode.as_str()
        ));
    }
    if !bad.is_empty() || runs_total != n as u64 {
        failures.push(format!(
            "{NAME} {} N={n}: {} of {n} tools did not run exactly once ({runs_total} runs); first: {}",
            mode.as_str(),
            bad.len(),
            bad.first().map_or("-", String::as_str)
        ));
    }
    Ok(rows.rows)
}

fn parse_parked(line: &str) -> Res<Parked> {
    let mut parts = line.split_whitespace();
    if parts.next() != Some("P") {
        return Err(format!("unexpected line from the parking process: {line}").into());
    }
    let key = parts.next().ok_or("missing key")?.parse()?;
    let id: SessionId = parts.next().ok_or("missing session id")?.parse()?;
    let calls: Vec<ToolCallId> = parts.map(ToolCallId::from).collect();
    if calls.is_empty() {
        return Err(format!("session {id} has no pending call").into());
    }
    Ok(Parked { key, id, calls })
}
