//! Workload 7, finished sessions (issue 12): resident memory while sessions
//! come and go. N sessions run workload 1's life (task, approval, tool,
//! answer, completed) in batches of at most 10,000 (all parked, then all
//! approved, `limit` requests in flight), so that no more sessions are live
//! at once whatever N; RSS is read before the first batch and after each
//! tenth of N. Nothing is live at the end, so whatever RSS gained and kept
//! is what finished sessions leave behind.
//!
//! What to look at: the RSS after half the sessions and after all of them.
//! A process that releases what a finished session held stays flat between
//! the two (allocators keep freed pages, so the first batches may still raise
//! it up to a plateau: sled's page cache filling to `[store] cache_mb`, the
//! runtime's high-water marks). The growth per session over the second half
//! is the leak, if any.
//!
//! The harness's own per-session memory is kept out: the tool's execution
//! counter is checked and emptied after each batch (keys repeat across
//! batches), and the probe holds a session only until its milestone is
//! claimed (its leftover count is reported).
//!
//! A second case writes the same checkpoints straight to the store, with no
//! runtime: the store's own share of the figure.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use overseer::actors::model::{
    AgentConfig, CallState, Event, EventKind, ProposedCall, SessionHeader, SessionId,
    SessionStatus, StopReason, ToolCallId, ToolCallRecord, TranscriptEntry, Usage, SCHEMA_VERSION,
};
use overseer::actors::store::{Checkpoint, CheckpointStore};
use overseer::actors::RuntimeConfig;
use serde_json::json;

use crate::common::{
    bounded, cache_mb, finish, memory, park, rate, rss_bytes, settle, Backend, Bench, Mode, Res,
    Row, Rows,
};

/// Workload name in the table.
pub const NAME: &str = "finished-sessions";
/// The store-only case's name.
pub const STORE_NAME: &str = "finished-sessions, store only";

/// Sessions finished before the baseline, so that one-time allocations
/// (thread stacks, pools, tables sized at first use) are not charged to N.
const WARM_UP: usize = 2_000;

/// RSS is read after each tenth of N.
const SAMPLES: usize = 10;

/// Sessions run at once at most (all parked, then all approved), whatever
/// N: the live high-water mark is the same for every N, so a larger N shows
/// only what finished sessions leave behind.
const BATCH: usize = 10_000;

/// How many sessions to run before each RSS sample: `n` in batches of at
/// most [`BATCH`], a sample after each tenth.
fn plan(n: usize) -> Vec<Vec<usize>> {
    let mut done = 0;
    (1..=SAMPLES)
        .map(|i| {
            let target = n * i / SAMPLES;
            let mut batches = Vec::new();
            while done < target {
                let keys = BATCH.min(target - done);
                batches.push(keys);
                done += keys;
            }
            batches
        })
        .filter(|b| !b.is_empty())
        .collect()
}

/// Runs workload 7 at `n` sessions.
pub async fn run(
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
    } = Bench::start("finished", mode, base, RuntimeConfig::default()).await?;
    let round = |keys: usize| {
        let (ov, probe, runs) = (ov.clone(), probe.clone(), runs.clone());
        async move {
            let parked = park(&ov, &probe, 1..=keys, limit).await?;
            finish(&ov, &probe, parked, limit).await?;
            let (bad, _) = runs.check(keys);
            runs.reset();
            Res::Ok(bad)
        }
    };

    failures.extend(round(WARM_UP.min(n)).await?);
    settle(500).await;
    let before = rss_bytes()?;
    let mut done = 0;
    let mut after = Vec::with_capacity(SAMPLES);
    let t = Instant::now();
    for batches in plan(n) {
        for keys in batches {
            let bad = round(keys).await?;
            if let Some(first) = bad.first() {
                failures.push(format!(
                    "{NAME}: {} tool call(s) not run exactly once, e.g. {first}",
                    bad.len()
                ));
            }
            done += keys;
        }
        settle(500).await;
        let rss = rss_bytes()?;
        eprintln!(
            "  {done} finished: RSS {} MiB, live actors {}",
            rss >> 20,
            ov.live_sessions()
        );
        after.push((done, rss));
        if out_of_memory(done, n)? {
            break;
        }
    }
    let elapsed = t.elapsed();
    let live = ov.live_sessions();
    let probe_left = probe.pending();
    ov.shutdown().await?;

    report(NAME, mode, n, elapsed, before, &after, |rows| {
        rows.add("live actors at the end", Some(live as f64), "actors", "= 0");
        rows.add(
            "probe entries left (harness)",
            Some(probe_left as f64),
            "entries",
            "",
        );
    })
}

/// The store-only case: `n` sessions' checkpoints (four each, as workload
/// 1 writes them: created with the task, awaiting approval, the tool's
/// result, completed), `limit` sessions at a time, straight to the store.
pub async fn store_only(mode: Mode, n: usize, limit: usize, base: &Path) -> Res<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-finished-store-")
        .tempdir_in(base)?;
    let backend = Backend::open(dir.path(), mode)?;
    let store = backend.store.clone();
    let round = |from: usize, keys: usize| {
        let store = store.clone();
        async move {
            bounded(from..from + keys, limit, |k| {
                let store = store.clone();
                async move { one_session(&*store, k).await }
            })
            .await?;
            Res::Ok(())
        }
    };
    round(0, WARM_UP.min(n)).await?;
    settle(500).await;
    let before = rss_bytes()?;
    let (mut done, mut after) = (0, Vec::with_capacity(SAMPLES));
    let t = Instant::now();
    for batches in plan(n) {
        for keys in batches {
            round(WARM_UP + done, keys).await?;
            done += keys;
        }
        settle(500).await;
        let rss = rss_bytes()?;
        eprintln!("  {done} written: RSS {} MiB", rss >> 20);
        after.push((done, rss));
        if out_of_memory(done, n)? {
            break;
        }
    }
    let elapsed = t.elapsed();
    let size = backend.size_on_disk()?;
    report(STORE_NAME, mode, n, elapsed, before, &after, |rows| {
        rows.add(
            "disk at the end",
            Some(size as f64 / (1024.0 * 1024.0)),
            "MiB",
            "",
        );
    })
}

/// Writes the four checkpoints of one finished session.
async fn one_session(store: &dyn CheckpointStore, k: usize) -> Res<()> {
    let id = SessionId::generate();
    let mut header: SessionHeader = serde_json::from_value(json!({
        "schema_version": SCHEMA_VERSION,
        "id": id,
        "tenant": "bench",
        "agent": crate::common::APPROVE_AGENT,
        "root_id": id,
        "status": "running",
        "created_at_ms": 1,
        "updated_at_ms": 1,
        "config": AgentConfig::new(crate::common::APPROVE_AGENT, &[crate::common::TOOL]).effective(),
        "usage": Usage::default(),
        "turn": 1,
        "step": 0,
        "transcript_len": 0,
        "last_event_seq": 0,
    }))?;
    let mut seq = 0;
    let mut event = |header: &mut SessionHeader, kind: EventKind| {
        seq += 1;
        header.last_event_seq = seq;
        Event {
            session_id: id,
            seq,
            at_ms: 2,
            kind,
        }
    };
    let call_id = ToolCallId::generate();
    let mut call = ToolCallRecord::proposed(
        call_id.clone(),
        crate::common::TOOL.into(),
        json!({"key": k}),
        3,
    );
    let entries = [
        TranscriptEntry::User {
            text: format!("task {k}"),
            at_ms: 1,
        },
        TranscriptEntry::Assistant {
            text: String::new(),
            tool_calls: vec![ProposedCall {
                id: call_id,
                name: crate::common::TOOL.into(),
                arguments: json!({"key": k}),
            }],
            at_ms: 2,
            finish_reason: None,
        },
        {
            call.finish(CallState::Completed, json!({"written": k}), 4);
            TranscriptEntry::ToolResult { call }
        },
        TranscriptEntry::Assistant {
            text: format!("done {k}"),
            tool_calls: Vec::new(),
            at_ms: 5,
            finish_reason: None,
        },
    ];
    let statuses = [
        SessionStatus::Running,
        SessionStatus::AwaitingApproval,
        SessionStatus::Running,
        SessionStatus::Completed,
    ];
    for (i, (entry, status)) in entries.into_iter().zip(statuses).enumerate() {
        header.status = status;
        header.transcript_len = i as u64 + 1;
        let mut events = vec![event(&mut header, EventKind::StatusChanged { status })];
        if i == 0 {
            events.insert(0, event(&mut header, EventKind::TurnStarted { turn: 1 }));
        }
        if status == SessionStatus::Completed {
            events.push(event(
                &mut header,
                EventKind::TurnEnded {
                    turn: 1,
                    stop_reason: StopReason::EndTurn,
                    usage: Usage::default(),
                    output: None,
                },
            ));
        }
        store
            .checkpoint(Checkpoint {
                header: header.clone(),
                entries: vec![(i as u64, Arc::new(entry))],
                events: Arc::new(events),
                metadata: None,
                queued: Vec::new(),
                dequeued: 0..0,
            })
            .await?;
    }
    Ok(())
}

/// Whether to stop before the OOM killer takes this process (and its
/// neighbours) down: a quarter of the machine's memory stays free. The rows
/// then say how many sessions were reached.
fn out_of_memory(done: usize, n: usize) -> Res<bool> {
    let (available, total) = memory()?;
    let stop = done < n && available < total / 4;
    if stop {
        eprintln!(
            "  stopping at {done} sessions: {} MiB of memory left",
            available >> 20
        );
    }
    Ok(stop)
}

/// The rows both cases share.
fn report(
    name: &'static str,
    mode: Mode,
    n: usize,
    elapsed: Duration,
    before: u64,
    after: &[(usize, u64)],
    extra: impl FnOnce(&mut Rows),
) -> Res<Vec<Row>> {
    let mib = |b: u64| Some(b as f64 / (1024.0 * 1024.0));
    let (half_n, half) = after[(after.len() - 1) / 2];
    let (reached, last) = after[after.len() - 1];
    let mut rows = Rows::new(name, Some(mode), n);
    rows.add(
        "sessions reached",
        Some(reached as f64),
        "sessions",
        &format!("= {n}"),
    );
    rows.add("sled cache_mb", Some(cache_mb() as f64), "MiB", "");
    rows.add("rate", rate(reached, elapsed), "sessions/s", "");
    rows.add("RSS before", mib(before), "MiB", "");
    rows.add(&format!("RSS after {half_n}"), mib(half), "MiB", "");
    rows.add(&format!("RSS after {reached}"), mib(last), "MiB", "");
    rows.add(
        "RSS growth per session (all)",
        Some(last.saturating_sub(before) as f64 / reached.max(1) as f64),
        "bytes",
        "",
    );
    rows.add(
        "RSS growth per session (2nd half)",
        Some((last as f64 - half as f64) / reached.saturating_sub(half_n).max(1) as f64),
        "bytes",
        "~0 (flat)",
    );
    extra(&mut rows);
    Ok(rows.rows)
}
