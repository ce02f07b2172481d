//! Workload 3, checkpoint cost vs history length: the latency of one
//! `CheckpointStore::checkpoint` (header + 1 new transcript entry + 1 event),
//! straight against the store, for sessions whose transcripts already hold
//! 10, 1,000 and 10,000 entries. §9 promises the cost does not grow with
//! the history; the table's N column is the history length here.
//!
//! The header and the entries are real ones, taken from a session that ran
//! the approve-and-execute turn, so sizes are what production writes. The
//! three sessions are measured round-robin on one store, so each checkpoint
//! sees the same database and only the history length differs.
//!
//! Under `fsync` it also measures the disk's own floor beside the store: a
//! 4 KiB write and an `fdatasync` of a plain file in the same directory, so
//! that the table shows how much of a checkpoint is the device and how much
//! is the store's path to it (threads, sled).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use overseer::actors::model::{now_ms, Event, EventKind, SessionId, SessionStatus};
use overseer::actors::store::Checkpoint;

use crate::common::{finish, park, start, Backend, Mode, Probe, Res, Row, Rows, Runs};

/// Workload name in the table.
pub const NAME: &str = "checkpoint-vs-history";

/// History lengths measured.
pub const LENGTHS: [u64; 3] = [10, 1_000, 10_000];

/// Entries per checkpoint while building the history (not measured).
const PREFILL_BATCH: usize = 500;

/// Measures `rounds` checkpoints per history length (after a warm-up).
pub async fn run(mode: Mode, rounds: usize, base: &Path) -> Res<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-checkpoint-")
        .tempdir_in(base)?;
    let backend = Backend::open(dir.path(), mode)?;
    let store = backend.store.clone();

    // One real session for realistic header and entry shapes.
    let probe = Arc::new(Probe::new(store.clone()));
    let ov = start(probe.clone(), Arc::new(Runs::default())).await?;
    let parked = park(&ov, &probe, 1..=1, 1).await?;
    let id = parked.first().map(|p| p.id).ok_or("no template session")?;
    finish(&ov, &probe, parked, 1).await?;
    ov.shutdown().await?;
    let template = store.load(id).await?.ok_or("template session vanished")?;
    if template.transcript.is_empty() {
        return Err("template session has an empty transcript".into());
    }

    let mut sessions = Vec::new();
    for &len in &LENGTHS {
        let mut header = template.header.clone();
        header.id = SessionId::generate();
        header.root_id = header.id;
        header.status = SessionStatus::Running;
        header.transcript_len = 0;
        header.last_event_seq = 0;
        let mut s = Synthetic {
            header,
            pool: template.transcript.clone(),
        };
        while s.header.transcript_len < len {
            let k = (len - s.header.transcript_len).min(PREFILL_BATCH as u64) as usize;
            store.checkpoint(s.next(k)).await?;
        }
        sessions.push(s);
    }
    store.flush().await?;

    let warm_up = 20;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); LENGTHS.len()];
    for round in 0..warm_up + rounds {
        for (s, out) in sessions.iter_mut().zip(samples.iter_mut()) {
            let cp = s.next(1);
            let t = Instant::now();
            store.checkpoint(cp).await?;
            if round >= warm_up {
                out.push(t.elapsed());
            }
        }
    }

    let mut rows = Rows::new(NAME, Some(mode), 0);
    let mut p50s = Vec::new();
    for (&len, mut s) in LENGTHS.iter().zip(samples) {
        s.sort_unstable();
        let p50 = crate::common::percentile(&s, 50.0);
        let p99 = crate::common::percentile(&s, 99.0);
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        rows.add_n(len, "checkpoint p50", ms(p50), "ms", "");
        rows.add_n(len, "checkpoint p99", ms(p99), "ms", "");
        p50s.push(p50);
    }
    if let (Some(Some(short)), Some(Some(long))) = (p50s.first(), p50s.last()) {
        let ratio = long.as_secs_f64() / short.as_secs_f64().max(1e-9);
        rows.add_n(
            LENGTHS[LENGTHS.len() - 1],
            "p50 vs 10 entries",
            Some(ratio),
            "x",
            "<= 1.5",
        );
    }
    if mode == Mode::Fsync {
        let path = dir.path().join("device-probe");
        let mut device = tokio::task::spawn_blocking(move || device_floor(&path, rounds)).await??;
        rows.latency("device: 4 KiB write + fdatasync", &mut device, "", "");
    }
    Ok(rows.rows)
}

/// The disk's floor under one checkpoint: `rounds` times, a 4 KiB write at
/// the next offset of a preallocated file and an `fdatasync` (what a flush
/// asks of the device, without the store's threads or sled around it).
fn device_floor(path: &Path, rounds: usize) -> Res<Vec<Duration>> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4096;
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    // Preallocated and synced first, so each round measures a data write and
    // its flush, not the file growing.
    let warm_up = 20;
    file.set_len(((warm_up + rounds) * BLOCK) as u64)?;
    file.sync_all()?;
    let block: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warm_up + rounds {
        let t = Instant::now();
        file.write_all_at(&block, (round * BLOCK) as u64)?;
        file.sync_data()?;
        if round >= warm_up {
            samples.push(t.elapsed());
        }
    }
    std::fs::remove_file(path)?;
    Ok(samples)
}

/// A session written directly to the store, growing by recycled real entries.
struct Synthetic {
    header: overseer::actors::model::SessionHeader,
    pool: Vec<Arc<overseer::actors::model::TranscriptEntry>>,
}

impl Synthetic {
    /// The next checkpoint: `k` new entries and one event.
    fn next(&mut self, k: usize) -> Checkpoint {
        let start = self.header.transcript_len;
        let entries = (0..k as u64)
            .map(|i| {
                let idx = start + i;
                let pick = (idx as usize) % self.pool.len();
                (idx, self.pool[pick].clone())
            })
            .collect();
        self.header.transcript_len = start + k as u64;
        self.header.last_event_seq += 1;
        let now = now_ms();
        self.header.updated_at_ms = now;
        let event = Event {
            session_id: self.header.id,
            seq: self.header.last_event_seq,
            at_ms: now,
            kind: EventKind::StatusChanged {
                status: SessionStatus::Running,
            },
        };
        Checkpoint {
            header: self.header.clone(),
            entries,
            events: Arc::new(vec![event]),
            metadata: None,
            queued: Vec::new(),
            dequeued: 0..0,
        }
    }
}
