//! Workload 2, idle sessions: resident memory per session for N sessions
//! parked awaiting input (their one turn answered, actor still live).
//!
//! Runs in a process of its own (see `main`), so memory freed by an earlier
//! workload cannot be reused here and hide the cost. The figure includes
//! everything a session costs the process: its actor, its approval-free
//! state, and sled's page cache for the pages it wrote.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use overseer::actors::model::SessionStatus;

use overseer::actors::RuntimeConfig;

use crate::common::{
    bounded, create_request, memory, rate, rss_bytes, Bench, Mode, Probe, Reached, Res, Row, Rows,
    Want, IDLE_AGENT,
};

/// Workload name in the table.
pub const NAME: &str = "idle-sessions";

/// Sessions created before the baseline, so one-time allocations (thread
/// stacks, caches, lazily built tables) are not charged to the N sessions.
const WARM_UP: usize = 64;

/// Sessions created between two looks at free memory.
const CHUNK: usize = 10_000;

/// Runs workload 2 at `n` sessions.
pub async fn run(mode: Mode, n: usize, limit: usize, base: &Path) -> Res<Vec<Row>> {
    let Bench {
        dir: _dir,
        backend: _backend,
        probe,
        ov,
        ..
    } = Bench::start("idle", mode, base, RuntimeConfig::default()).await?;

    idle_sessions(&ov, &probe, 0, WARM_UP, limit).await?;
    settle().await;
    let before = rss_bytes()?;
    let t = Instant::now();
    // In chunks, so a run bigger than the machine stops before the OOM killer
    // takes it (and its neighbours) down: a quarter of the memory stays free.
    // The figure is then per session reached.
    let mut reached = 0;
    while reached < n {
        let chunk = CHUNK.min(n - reached);
        idle_sessions(&ov, &probe, WARM_UP + reached, chunk, limit).await?;
        reached += chunk;
        let (available, total) = memory()?;
        if reached < n && available < total / 4 {
            eprintln!(
                "  stopping at {reached} sessions: {} MiB of memory left",
                available >> 20
            );
            break;
        }
    }
    let elapsed = t.elapsed();
    settle().await;
    let after = rss_bytes()?;
    eprintln!(
        "  {reached} idle sessions in {elapsed:.2?}; RSS {} -> {} MiB",
        before >> 20,
        after >> 20
    );
    ov.shutdown().await?;

    let mut rows = Rows::new(NAME, Some(mode), n);
    rows.add(
        "sessions idle",
        Some(reached as f64),
        "sessions",
        &format!("= {n}"),
    );
    rows.add(
        "create-to-idle rate",
        rate(reached, elapsed),
        "sessions/s",
        "",
    );
    rows.add(
        "RSS per live idle session",
        Some(after.saturating_sub(before) as f64 / reached.max(1) as f64),
        "bytes",
        "<= 16384",
    );
    let hibernated = hibernated_rss(mode, n, limit, base).await?;
    rows.add(
        "RSS per hibernated session",
        Some(hibernated),
        "bytes",
        "<= a few hundred",
    );
    Ok(rows.rows)
}

/// RSS per session once `n` idle sessions have hibernated (actor stopped,
/// state only on disk). The allocator may keep freed pages, so this is an
/// upper bound on what a hibernated session costs.
async fn hibernated_rss(mode: Mode, n: usize, limit: usize, base: &Path) -> Res<f64> {
    let config = RuntimeConfig {
        idle_hibernate: Some(Duration::from_millis(500)),
        ..RuntimeConfig::default()
    };
    let Bench {
        dir: _dir,
        backend: _backend,
        probe,
        ov,
        ..
    } = Bench::start("hibernate", mode, base, config).await?;
    idle_sessions(&ov, &probe, 0, WARM_UP, limit).await?;
    wait_hibernated(&ov, WARM_UP).await?;
    settle().await;
    let before = rss_bytes()?;
    idle_sessions(&ov, &probe, WARM_UP, n, limit).await?;
    wait_hibernated(&ov, WARM_UP + n).await?;
    settle().await;
    let after = rss_bytes()?;
    eprintln!(
        "  {n} hibernated sessions; RSS {} -> {} MiB, live actors {}",
        before >> 20,
        after >> 20,
        ov.runtime().live.len()
    );
    ov.shutdown().await?;
    Ok(after.saturating_sub(before) as f64 / n.max(1) as f64)
}

/// Waits (bounded) until `n` sessions have hibernated.
async fn wait_hibernated(ov: &overseer::actors::Overseer, n: usize) -> Res<()> {
    use std::sync::atomic::Ordering;
    for _ in 0..600 {
        let done = ov.runtime().metrics.hibernations.load(Ordering::Relaxed) as usize;
        if done >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("only some of {n} sessions hibernated within a minute").into())
}

/// Creates sessions `from+1 ..= from+n` and waits until each awaits input.
async fn idle_sessions(
    ov: &overseer::actors::Overseer,
    probe: &Arc<Probe>,
    from: usize,
    n: usize,
    limit: usize,
) -> Res<()> {
    bounded(from + 1..=from + n, limit, |i| {
        let ov = ov.clone();
        let probe = probe.clone();
        async move {
            let id = ov
                .create_session(create_request(IDLE_AGENT, i, false))
                .await?;
            match probe.wait(id, Want::TurnEnded).await? {
                Reached::TurnEnded(SessionStatus::AwaitingInput) => Ok(()),
                other => Err(format!("session {id} did not go idle: {other:?}").into()),
            }
        }
    })
    .await?;
    Ok(())
}

/// Lets background work (sled's flusher, finished tasks) quiesce before
/// reading RSS.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}
