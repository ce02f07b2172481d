//! Workload 1, approve-and-execute: N sessions each get "task k", the model
//! proposes `write_record {"key": k}`, the session parks awaiting approval,
//! the harness approves, the tool runs, the model answers `done k`.
//!
//! Measured: how fast N sessions park and finish when driven concurrently,
//! the approval round trip under that load and (separately) at concurrency 1,
//! bytes on disk per finished session, disk flushes per session (how well
//! concurrent checkpoints share a flush), and that every tool ran exactly once.

use std::path::Path;
use std::time::{Duration, Instant};

use overseer::actors::model::{EventKind, Notification, SessionStatus};

use overseer::actors::RuntimeConfig;

use crate::common::{
    approve_all, busy, cpu_seconds, finish, live_bytes, park, rate, Bench, Mode, Res, Row, Rows,
};

/// Workload name in the table.
pub const NAME: &str = "approve-and-execute";
/// Workload name of the concurrency-1 round trip.
pub const SERIAL: &str = "approval-round-trip";
/// Workload name of workload 1 with one webhook endpoint registered.
pub const HOOKED: &str = "approve-and-execute+webhook";

/// Runs workload 1 at `n` sessions, `limit` in flight at a time; with
/// `webhook`, one endpoint of the bench tenant receives every event on a
/// local receiver (`--webhook`).
pub async fn run(
    mode: Mode,
    n: usize,
    limit: usize,
    base: &Path,
    failures: &mut Vec<String>,
    webhook: bool,
) -> Res<Vec<Row>> {
    let (bench, hook) = if webhook {
        let (bench, webhooks) =
            Bench::start_with_webhooks("approve", mode, base, RuntimeConfig::default()).await?;
        let hook = crate::webhook::Hook::start(webhooks, &bench.ov, "bench").await?;
        (bench, Some(hook))
    } else {
        (
            Bench::start("approve", mode, base, RuntimeConfig::default()).await?,
            None,
        )
    };
    let Bench {
        dir,
        backend,
        probe,
        runs,
        ov,
    } = bench;
    let size0 = backend.size_on_disk()?;
    let mut rows = Rows::new(if webhook { HOOKED } else { NAME }, Some(mode), n);

    let f0 = backend.flushes();
    let c0 = probe.checkpoints();
    let cpu0 = cpu_seconds()?;
    let t = Instant::now();
    let parked = park(&ov, &probe, 1..=n, limit).await?;
    let park_time = t.elapsed();
    let f1 = backend.flushes();
    let c1 = probe.checkpoints();
    let cpu1 = cpu_seconds()?;
    eprintln!("  parked {n} in {park_time:.2?}");

    let t = Instant::now();
    let mut rtt = finish(&ov, &probe, parked, limit).await?;
    let finish_time = t.elapsed();
    let f2 = backend.flushes();
    let c2 = probe.checkpoints();
    let cpu2 = cpu_seconds()?;
    eprintln!("  finished {n} in {finish_time:.2?}");

    // Three webhooks a session: approval.requested, approval.decided and
    // session.finished (the bench sessions complete at the end of the turn).
    if let Some(hook) = hook {
        let t = Instant::now();
        let (got, mut latencies) = hook.wait(3 * n, crate::common::STUCK_AFTER).await;
        eprintln!(
            "  {got} webhooks delivered ({:.2?} after the last turn ended)",
            t.elapsed()
        );
        rows.add(
            "webhooks delivered",
            Some(got as f64),
            "deliveries",
            &format!("= {}", 3 * n),
        );
        rows.latency(
            "webhook delivery (event to receiver)",
            &mut latencies,
            "",
            "",
        );
        if got < 3 * n {
            failures.push(format!(
                "{HOOKED} {} N={n}: {got} of {} webhooks delivered",
                mode.as_str(),
                3 * n
            ));
        }
        hook.stop().await;
    }

    // Sizes are read after a flush so `os` mode counts what it buffered too.
    backend.store.flush().await?;
    let size1 = backend.size_on_disk()?;
    let (bad, total) = runs.check(n);
    ov.shutdown().await?;
    // The store must be closed (every handle dropped) before sled opens it again.
    drop((ov, probe, backend));
    let live = match live_bytes(dir.path()) {
        Ok(b) => Some(b as f64 / n as f64),
        Err(e) => {
            eprintln!("  could not reopen the store to count live bytes: {e}");
            None
        }
    };

    // Issue 16's targets (fsync, N = 10,000).
    let (park_target, finish_target) = if mode == Mode::Fsync && n >= 10_000 {
        (">= 16000", ">= 12000")
    } else {
        ("", "")
    };
    rows.add("park rate", rate(n, park_time), "sessions/s", park_target);
    rows.add(
        "finish rate",
        rate(n, finish_time),
        "approvals/s",
        finish_target,
    );
    rows.latency(&format!("round trip ({limit} in flight)"), &mut rtt, "", "");
    rows.add(
        "disk per finished session",
        Some(size1.saturating_sub(size0) as f64 / n as f64),
        "bytes",
        "<= 4096",
    );
    rows.add("live keys+values per session", live, "bytes", "");
    rows.add(
        "cores busy (park)",
        busy(cpu1 - cpu0, park_time),
        "cores",
        "",
    );
    rows.add(
        "cores busy (finish)",
        busy(cpu2 - cpu1, finish_time),
        "cores",
        "",
    );
    let per = |a: u64, b: u64| Some(b.saturating_sub(a) as f64 / n as f64);
    rows.add(
        "checkpoints per session (park)",
        per(c0, c1),
        "checkpoints",
        "",
    );
    rows.add(
        "checkpoints per session (finish)",
        per(c1, c2),
        "checkpoints",
        "",
    );
    if mode == Mode::Fsync {
        rows.add(
            "flushes per session (park)",
            Some(f1.saturating_sub(f0) as f64 / n as f64),
            "flushes",
            "",
        );
        rows.add(
            "flushes per session (finish)",
            Some(f2.saturating_sub(f1) as f64 / n as f64),
            "flushes",
            "",
        );
    }
    let ok = n - bad.len().min(n);
    rows.add(
        "tools run exactly once",
        Some(ok as f64),
        "sessions",
        &format!("= {n}"),
    );
    if !bad.is_empty() || total != n as u64 {
        failures.push(format!(
            "{NAME} {} N={n}: {} of {n} tools did not run exactly once ({total} runs in all); first: {}",
            mode.as_str(),
            bad.len(),
            bad.first().map_or("-", String::as_str)
        ));
    }
    Ok(rows.rows)
}

/// The approval round trip at concurrency 1: `n` sessions parked, then
/// approved one after the other, each observed through `subscribe()`.
pub async fn serial(
    mode: Mode,
    n: usize,
    limit: usize,
    base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let Bench {
        dir: _dir,
        backend: _backend,
        probe,
        runs,
        ov,
    } = Bench::start("rtt", mode, base, RuntimeConfig::default()).await?;
    let parked = park(&ov, &probe, 1..=n, limit).await?;

    let mut acks = Vec::with_capacity(n);
    let mut rtts = Vec::with_capacity(n);
    for p in &parked {
        let mut rx = ov.subscribe(p.id);
        let t = Instant::now();
        ov.submit(p.id, approve_all(&p.calls)).await?;
        acks.push(t.elapsed());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let n = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .map_err(|_| format!("session {}: no turn end within 30 s", p.id))??;
            match n {
                Notification::Event(e) if matches!(e.kind, EventKind::TurnEnded { .. }) => break,
                Notification::Event(e)
                    if matches!(
                        e.kind,
                        EventKind::StatusChanged {
                            status: SessionStatus::Failed | SessionStatus::Cancelled
                        }
                    ) =>
                {
                    return Err(format!("session {} failed: {:?}", p.id, e.kind).into())
                }
                _ => {}
            }
        }
        rtts.push(t.elapsed());
    }
    let (bad, _) = runs.check(n);
    ov.shutdown().await?;

    let mut rows = Rows::new(SERIAL, Some(mode), n);
    rows.latency("submit acknowledged", &mut acks, "", "");
    let (p50, p99) = if mode == Mode::Fsync {
        ("<= 0.6", "<= 1.5")
    } else {
        ("", "")
    };
    rows.latency("round trip (1 in flight)", &mut rtts, p50, p99);
    if !bad.is_empty() {
        failures.push(format!(
            "{SERIAL} {} N={n}: {} tools did not run exactly once; first: {}",
            mode.as_str(),
            bad.len(),
            bad.first().map_or("-", String::as_str)
        ));
    }
    Ok(rows.rows)
}
