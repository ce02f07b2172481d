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
    bounded, create_request, memory, rate, rss_bytes, settle, Bench, Mode, Probe, Reached, Res,
    Row, Rows, Want, IDLE_AGENT,
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
    settle(300).await;
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
    settle(300).await;
    let fresh = rss_bytes()?;
    // Once idle for the rest delay, each session lets go of its transcript
    // and metadata: the figure for a session that waits.
    let rest_after = RuntimeConfig::default().rest_after;
    settle((rest_after + Duration::from_secs(1)).as_millis() as u64).await;
    let after = rss_bytes()?;
    eprintln!(
        "  {reached} idle sessions in {elapsed:.2?}; RSS {} -> {} MiB, {} MiB after the rest delay",
        before >> 20,
        fresh >> 20,
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
        "RSS per live idle session, within the rest delay",
        Some(fresh.saturating_sub(before) as f64 / reached.max(1) as f64),
        "bytes",
        "",
    );
    rows.add(
        "RSS per live idle session",
        Some(after.saturating_sub(before) as f64 / reached.max(1) as f64),
        "bytes",
        "<= 12288",
    );
    Ok(rows.rows)
}

/// Workload 2, hibernated: RSS per hibernated session, in a process of its
/// own (after the live case in the same process, the allocator's retained
/// pages would make the baseline meaningless).
pub async fn hibernated(mode: Mode, n: usize, limit: usize, base: &Path) -> Res<Vec<Row>> {
    let mut rows = Rows::new(NAME, Some(mode), n);
    let h = hibernated_rss(mode, n, limit, base).await?;
    rows.add(
        "RSS per hibernated session (marginal, 2nd half)",
        Some(h.marginal),
        "bytes",
        "<= 1024",
    );
    rows.add(
        "RSS per hibernated session (all, upper bound)",
        Some(h.overall),
        "bytes",
        "",
    );
    rows.add(
        &format!("RSS with {n} hibernated"),
        Some(h.end_rss as f64 / (1u64 << 20) as f64),
        "MiB",
        if n >= 1_000_000 { "<= 2048" } else { "" },
    );
    rows.add(
        "create-to-hibernated rate, first tenth",
        h.first_rate,
        "sessions/s",
        "",
    );
    rows.add(
        "create-to-hibernated rate, last tenth",
        h.last_rate,
        "sessions/s",
        "= first tenth",
    );
    Ok(rows.rows)
}

/// Workload 2's floor: RSS per bare ractor actor with an empty state, in
/// a process of its own. What any live session costs at least, whatever it
/// holds: its mailbox's channels (ractor boxes every message, so their
/// slots do not depend on the message type), its task and message loop,
/// its cell.
pub async fn actor_floor(mode: Mode, n: usize) -> Res<Vec<Row>> {
    /// Holds nothing and handles nothing.
    struct Bare;

    impl ractor::Actor for Bare {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            (): (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            Ok(())
        }
    }

    let mut actors = Vec::with_capacity(n + WARM_UP);
    for _ in 0..WARM_UP {
        actors.push(ractor::Actor::spawn(None, Bare, ()).await?);
    }
    settle(300).await;
    let before = rss_bytes()?;
    for _ in 0..n {
        actors.push(ractor::Actor::spawn(None, Bare, ()).await?);
    }
    settle(300).await;
    let after = rss_bytes()?;
    eprintln!(
        "  {n} bare actors; RSS {} -> {} MiB",
        before >> 20,
        after >> 20
    );
    for (actor, handle) in actors {
        actor.stop(None);
        handle.await?;
    }
    let mut rows = Rows::new(NAME, Some(mode), n);
    rows.add(
        "RSS per bare ractor actor (the floor of a live session)",
        Some(after.saturating_sub(before) as f64 / n.max(1) as f64),
        "bytes",
        "",
    );
    Ok(rows.rows)
}

/// What hibernated sessions cost, from [`hibernated_rss`].
struct Hibernated {
    /// RSS growth over the second half of the sessions, per session: what
    /// one more hibernated session costs once the allocator has reused
    /// what the first half's actors freed. Not an upper bound.
    marginal: f64,
    /// RSS growth over all of them, per session (an upper bound: it also
    /// counts pages the allocator kept from the actors before they stopped).
    overall: f64,
    /// RSS at the end.
    end_rss: u64,
    /// Sessions per second created and hibernated, in the first tenth and in
    /// the last: creating the last costs what the first did if they match.
    first_rate: Option<f64>,
    last_rate: Option<f64>,
}

/// Creates `n` sessions in ten chunks, each left to hibernate (actor
/// stopped, state only on disk) before the next, and reads RSS after each
/// chunk.
async fn hibernated_rss(mode: Mode, n: usize, limit: usize, base: &Path) -> Res<Hibernated> {
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
    settle(300).await;
    let before = rss_bytes()?;
    let chunk = n.div_ceil(10).max(1);
    let mut reached = 0;
    let mut middle = None;
    let mut rates = Vec::new();
    while reached < n {
        let size = chunk.min(n - reached);
        let t = Instant::now();
        idle_sessions(&ov, &probe, WARM_UP + reached, size, limit).await?;
        wait_hibernated(&ov, WARM_UP + reached + size).await?;
        rates.push(rate(size, t.elapsed()));
        reached += size;
        if middle.is_none() && reached * 2 >= n {
            settle(300).await;
            middle = Some((reached, rss_bytes()?));
        }
    }
    settle(300).await;
    let after = rss_bytes()?;
    eprintln!(
        "  {n} hibernated sessions; RSS {} -> {} MiB, live actors {}",
        before >> 20,
        after >> 20,
        ov.live_sessions()
    );
    ov.shutdown().await?;
    let (half, at_half) = middle.unwrap_or((0, before));
    Ok(Hibernated {
        // Signed: once sled's cache is full and the allocator reuses what
        // stopped actors freed, RSS may even fall a little.
        marginal: (after as f64 - at_half as f64) / (n - half).max(1) as f64,
        overall: after.saturating_sub(before) as f64 / n.max(1) as f64,
        end_rss: after,
        first_rate: rates.first().copied().flatten(),
        last_rate: rates.last().copied().flatten(),
    })
}

/// Waits (bounded) until `n` sessions have hibernated.
async fn wait_hibernated(ov: &overseer::actors::Overseer, n: usize) -> Res<()> {
    use std::sync::atomic::Ordering;
    for _ in 0..600 {
        let done = ov.metrics().hibernations.load(Ordering::Relaxed) as usize;
        if done >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(
        format!("only some of {n} sessions hibernated within a minute of the last one going idle")
            .into(),
    )
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
