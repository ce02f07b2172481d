//! Process-level crash test (issue 3): the real `overseer` binary, built with
//! the `fault-injection` feature, aborted at random fault points and resumed
//! with `overseer run --resume`, over and over, on one data directory.
//!
//! Every process runs `--approve auto` with `OVERSEER_FAULT` set to a
//! pseudo-random `point:nth:abort` (or nothing), at a point of the actors or
//! inside the sled store's write path (`STORE_POINTS`: before a group's
//! batch is applied, after it, before its flush, after the flush before the
//! confirmation). Several sessions are in
//! flight at once, so a process that follows one session also recovers the
//! others (`recover()` activates every mid-turn session) and an abort in one
//! interrupts the others at arbitrary points, not only at fault points. After
//! every process, with no overseer process running, the test opens the store
//! and the ledger of the `ledger_append` test tool and checks:
//!
//! - every decision the CLI acknowledged (its `decision acknowledged:` line,
//!   printed only after `submit` returned) is in the stored session;
//! - no non-idempotent call ran more often than it was approved, and one that
//!   ran twice carries the `outcome_unknown` mark (see [`check_ledger`]);
//! - every side effect was preceded by its checkpointed intent;
//! - every session is in a state from which it can progress.
//!
//! Once enough aborts have happened, the remaining sessions are resumed with
//! no fault and must all complete with the full transcript. The seed is
//! printed at the start and in every failure; `CRASH_SEED=N` replays a run
//! (up to the timing of concurrent sessions).
//!
//! It deliberately does not test panics (actor restarts in-process): those
//! are `actors/tests/recovery.rs`'s, where they can be observed directly.

#![cfg(feature = "fault-injection")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use overseer::store::{Durability, SledStore};
use overseer_actors::model::{
    CallState, Decision, Event, EventKind, SessionHeader, SessionId, SessionStatus, StopReason,
    ToolCallRecord, TranscriptEntry,
};
use overseer_actors::store::CheckpointStore;

/// Aborted processes the test needs before it lets the sessions finish.
const MIN_ABORTS: usize = 50;
/// Unfinished sessions kept in flight at once.
const IN_FLIGHT: usize = 3;
/// A bound on the whole loop, so a run that cannot make progress fails
/// instead of spinning.
const MAX_PROCESSES: usize = 400;
/// Longest one process may take; only turns a hang into a failure.
const PROCESS_PATIENCE: Duration = Duration::from_secs(30);
/// The abort line of `overseer_actors::fault::abort`.
const ABORT_LINE: &str = "injected fault: aborting the process at";
/// SIGABRT.
const SIGABRT: i32 = 6;

/// The fault points, each with the largest `nth` drawn for it: about the
/// number of hits one whole session makes, so a fresh run usually aborts and
/// a resumed one (with fewer hits left) sometimes finishes.
const POINTS: &[(&str, u64)] = &[
    ("after_checkpoint", 16),
    ("before_tool_dispatch", 5),
    ("during_tool", 5),
    ("mid_stream", 45),
    ("after_decision_ack", 3),
];

/// Fault points inside the sled store's write path (layout 5: one batch per
/// group, one record per checkpoint in it), aborted at only (a panic there is not a session's): after a
/// group's batch is built and before it is applied
/// (`store_before_headers`), after it is applied and before it is flushed
/// (`store_after_apply`), right before the flush (`store_flush`), and after
/// the flush and before the checkpoints are confirmed to their sessions
/// (`store_before_confirm`). With `fsync` durability nothing of such a group
/// was acknowledged, and whatever of it sled had written out must be whole
/// or absent after the restart; a group flushed and not yet confirmed is
/// whole, and its sessions go on from it. The largest `nth`: about one
/// group per checkpoint.
const STORE_POINTS: &[(&str, u64)] = &[
    ("store_before_headers", 16),
    ("store_after_apply", 16),
    ("store_flush", 16),
    ("store_before_confirm", 16),
];

/// The scripted agent: three ledger entries across three steps, the clock
/// read twice (an idempotent tool that needs no approval), then an answer.
const SCENARIO: &str = r#"{
  "name": "crash",
  "agents": {"crash": [
    {"text": "Recording the first entry and reading the clock.",
     "tool_calls": [{"name": "ledger_append", "arguments": {"entry": "first"}},
                    {"name": "current_time", "arguments": {}}]},
    {"text": "Recording the second entry.",
     "tool_calls": [{"name": "ledger_append", "arguments": {"entry": "second"}}]},
    {"text": "Reading the clock again, then the third entry.",
     "tool_calls": [{"name": "current_time", "arguments": {}},
                    {"name": "ledger_append", "arguments": {"entry": "third"}}]},
    {"text": "All three entries are recorded."}
  ]}
}"#;

const ENTRIES: [&str; 3] = ["first", "second", "third"];
const FINAL_TEXT: &str = "All three entries are recorded.";

/// xorshift64*: small, seeded, good enough to pick fault points.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The test's world: a temp dir with the config, the scenario, the data dir
/// and the ledger, and what happened so far (for failure reports).
struct World {
    tmp: tempfile::TempDir,
    config: PathBuf,
    scenario: PathBuf,
    data: PathBuf,
    ledger: PathBuf,
    seed: u64,
    log: Vec<String>,
    /// Call id → how many approvals of it the CLI acknowledged (a call is
    /// approved again after an outcome-unknown re-ask).
    acked: BTreeMap<String, usize>,
    rt: tokio::runtime::Runtime,
}

/// One finished process.
struct Outcome {
    status: ExitStatus,
    stderr: String,
    elapsed: Duration,
}

impl Outcome {
    fn aborted(&self) -> bool {
        self.status.signal() == Some(SIGABRT)
    }
}

impl World {
    fn new(seed: u64) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let scenario = root.join("crash.json");
        std::fs::write(&scenario, SCENARIO).expect("write scenario");
        let data = root.join("data");
        let config = root.join("overseer.toml");
        // `per_tool`, not `auto`: under `auto` an interrupted non-idempotent
        // call fails instead of being asked about again (§9), and the re-ask
        // path is the one worth crashing through.
        std::fs::write(
            &config,
            format!(
                "[store]\ndata_dir = {data:?}\ndurability = \"fsync\"\n\n\
                 [provider]\nkind = \"scripted\"\nscenario = {scenario:?}\n\n\
                 [[agents]]\nname = \"crash\"\ntools = [\"ledger_append\", \"current_time\"]\n\
                 approval = \"per_tool\"\nmax_steps = 10\n",
                data = data.display().to_string(),
                scenario = scenario.display().to_string(),
            ),
        )
        .expect("write config");
        let ledger = root.join("ledger");
        Self {
            config,
            scenario,
            data,
            ledger,
            seed,
            log: Vec::new(),
            acked: BTreeMap::new(),
            rt: tokio::runtime::Runtime::new().expect("tokio runtime"),
            tmp,
        }
    }

    /// Everything needed to understand (and replay) a failure.
    fn report(&self, what: &str) -> String {
        let mut out = format!("{what}\n\n");
        if self.seed != 0 {
            let _ = writeln!(
                out,
                "crash test seed {} (rerun with CRASH_SEED={})",
                self.seed, self.seed
            );
        }
        out.push_str("processes so far:\n");
        for line in &self.log {
            let _ = writeln!(out, "  {line}");
        }
        out
    }

    fn fail(&self, what: impl AsRef<str>) -> ! {
        panic!("{}", self.report(what.as_ref()))
    }

    /// Runs `overseer run --approve <approve>` with `args` and an optional
    /// fault spec.
    fn overseer(&self, approve: &str, args: &[&str], fault: Option<&str>) -> Outcome {
        self.spawn(approve, args, fault, true)
    }

    /// [`World::overseer`], optionally with stderr closed under the process
    /// (its reader gone, as after `overseer run … 2>&1 | head`); its output
    /// is then lost.
    fn spawn(&self, approve: &str, args: &[&str], fault: Option<&str>, read: bool) -> Outcome {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
        cmd.arg("run")
            .args([
                "--config",
                &self.config.display().to_string(),
                "--scenario",
                &self.scenario.display().to_string(),
                "--data",
                &self.data.display().to_string(),
                "--approve",
                approve,
            ])
            .args(args)
            .current_dir(self.tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OVERSEER_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("OVERSEER_TEST_LEDGER", &self.ledger);
        if let Some(spec) = fault {
            cmd.env("OVERSEER_FAULT", spec);
        }
        let started = Instant::now();
        let mut child = cmd.spawn().expect("start overseer");
        let pipe = child.stderr.take().expect("stderr pipe");
        // Dropping the read end closes the pipe: every later write of the
        // process fails with EPIPE (Rust binaries ignore SIGPIPE).
        let pipe = read.then_some(pipe);
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        });
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for overseer") {
                break status;
            }
            if started.elapsed() > PROCESS_PATIENCE {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = reader.join().unwrap_or_default();
                self.fail(format!(
                    "overseer run {args:?} (fault {fault:?}) hung for {PROCESS_PATIENCE:?}; stderr:\n{stderr}"
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let stderr = reader.join().unwrap_or_default();
        if stderr.contains("unknown tool 'ledger_append'") {
            // The shared target directory's binary was rebuilt without the
            // feature (a plain `cargo build` meanwhile): not a runtime bug.
            self.fail(format!(
                "the overseer binary lacks the fault-injection feature; rebuild with \
                 `cargo test --all-features`. stderr:\n{stderr}"
            ));
        }
        Outcome {
            status,
            stderr,
            elapsed: started.elapsed(),
        }
    }

    /// Reads every session with its events. Only while no overseer runs:
    /// sled allows one process per directory.
    fn snapshot(&self) -> Vec<Stored> {
        if !self.data.exists() {
            return Vec::new();
        }
        let store = SledStore::open(&self.data, Durability::Os)
            .unwrap_or_else(|e| self.fail(format!("cannot open the store after a run: {e}")));
        let result = self.rt.block_on(async {
            let headers = store.list_tenant("local", None, 100_000).await?;
            let mut out = Vec::new();
            for h in headers {
                let Some(s) = store.load(h.id).await? else {
                    continue;
                };
                let events = store.events_after(h.id, 0, usize::MAX).await?;
                out.push(Stored {
                    header: s.header,
                    transcript: s.transcript.iter().map(|e| (**e).clone()).collect(),
                    events,
                });
            }
            Ok::<_, overseer_actors::store::StoreError>(out)
        });
        // Dropping the store joins its threads and releases the directory
        // before the next process opens it.
        drop(store);
        result.unwrap_or_else(|e| self.fail(format!("cannot read the store: {e}")))
    }

    /// The ledger: idempotency key → entries written under it, in order.
    fn ledger(&self) -> BTreeMap<String, Vec<String>> {
        let text = match std::fs::read_to_string(&self.ledger) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => self.fail(format!("cannot read the ledger: {e}")),
        };
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in text.lines() {
            let Some((key, entry)) = line.split_once(' ') else {
                self.fail(format!("malformed ledger line {line:?}"));
            };
            out.entry(key.to_owned())
                .or_default()
                .push(entry.to_owned());
        }
        out
    }
}

/// One session as stored.
struct Stored {
    header: SessionHeader,
    transcript: Vec<TranscriptEntry>,
    events: Vec<Event>,
}

impl Stored {
    /// Every call record: the closed steps' (in the transcript), then the
    /// open step's.
    fn calls(&self) -> Vec<&ToolCallRecord> {
        let mut calls: Vec<&ToolCallRecord> = self
            .transcript
            .iter()
            .filter_map(|e| match e {
                TranscriptEntry::ToolResult { call } => Some(call),
                _ => None,
            })
            .collect();
        calls.extend(self.header.open_calls.iter());
        calls
    }

    /// Approvals recorded for a call, in the event log (the audit trail).
    fn approvals(&self, call: &str) -> usize {
        self.events
            .iter()
            .filter(|e| match &e.kind {
                EventKind::DecisionRecorded { call_id, record } => {
                    call_id.as_str() == call && matches!(record.decision, Decision::Approve { .. })
                }
                _ => false,
            })
            .count()
    }
}

/// Checks every invariant that must hold between processes.
fn check(world: &World, sessions: &[Stored]) {
    for s in sessions {
        check_progressable(world, s);
    }
    check_acknowledged(world, sessions);
    check_ledger(world, sessions);
}

/// The session can go on: terminal only by completing normally (nothing in
/// this test cancels or fails), waiting for someone with something to wait
/// for, or running (the next `--resume` re-issues what was in flight).
fn check_progressable(world: &World, s: &Stored) {
    let h = &s.header;
    let id = h.id;
    let waiting = h
        .open_calls
        .iter()
        .filter(|c| c.state == CallState::AwaitingApproval)
        .count();
    if let Some(c) = h.open_calls.iter().find(|c| c.state == CallState::Proposed) {
        world.fail(format!(
            "session {id}: call {} stored in state proposed",
            c.id
        ));
    }
    let ok = match h.status {
        SessionStatus::Completed => {
            h.last_stop_reason == Some(StopReason::EndTurn) && h.open_calls.is_empty()
        }
        SessionStatus::AwaitingApproval => waiting > 0,
        SessionStatus::Running => waiting == 0,
        SessionStatus::AwaitingInput => h.open_calls.is_empty(),
        SessionStatus::Pending | SessionStatus::Failed | SessionStatus::Cancelled => false,
    };
    if !ok {
        world.fail(format!(
            "session {id} is stuck: status {} (last stop {:?}, error {:?}) with open calls {:?}",
            h.status,
            h.last_stop_reason,
            h.error,
            h.open_calls
                .iter()
                .map(|c| format!("{} {} {:?}", c.id, c.name, c.state))
                .collect::<Vec<_>>()
        ));
    }
}

/// Every decision the CLI acknowledged is in the store: one
/// `decision_recorded` event per acknowledgement, and the decision on the call
/// record unless an outcome-unknown re-ask cleared it for a new one since.
fn check_acknowledged(world: &World, sessions: &[Stored]) {
    for (call_id, &acks) in &world.acked {
        let found = sessions.iter().find_map(|s| {
            s.calls()
                .into_iter()
                .find(|c| c.id.as_str() == call_id)
                .map(|c| (s, c))
        });
        let Some((s, call)) = found else {
            world.fail(format!(
                "acknowledged decision for {call_id}: no such call in the store"
            ));
        };
        let recorded = s.approvals(call_id);
        if recorded < acks {
            world.fail(format!(
                "{acks} acknowledged approval(s) of {call_id} (session {}), {recorded} in its event log",
                s.header.id
            ));
        }
        let on_record = matches!(
            call.decision.as_ref().map(|d| &d.decision),
            Some(Decision::Approve { .. })
        );
        if !on_record && !call.outcome_unknown {
            world.fail(format!(
                "acknowledged approval of {call_id} (session {}) is missing from its record: {call:?}",
                s.header.id
            ));
        }
    }
}

/// The ledger against the store.
///
/// The rule for double executions: `ledger_append` is not idempotent, so its
/// `on_interrupt` is `ask` (§9). A call whose process died while it ran (or
/// between its intent and its outcome) has an unknown outcome: it returns to
/// `awaiting_approval` marked `outcome_unknown`, and `--approve auto` approves
/// the re-run, which may append a second line under the same key. That is the
/// only legitimate duplicate. So: a key never appears more often than its
/// call was approved (each execution needs one approval), and more than once
/// only on a call marked `outcome_unknown`. Also, a line exists only for a
/// call whose intent (attempt) was checkpointed first, with the arguments the
/// call was approved with.
fn check_ledger(world: &World, sessions: &[Stored]) {
    for (key, entries) in world.ledger() {
        let found = sessions.iter().find_map(|s| {
            s.calls()
                .into_iter()
                .find(|c| c.idempotency_key.as_deref() == Some(key.as_str()))
                .map(|c| (s, c))
        });
        let Some((s, call)) = found else {
            world.fail(format!(
                "ledger key {key} ({entries:?}) belongs to no checkpointed call: \
                 a side effect ran before its intent was durable"
            ));
        };
        let id = s.header.id;
        let expected = call.run_arguments()["entry"].as_str().unwrap_or_default();
        if call.name != "ledger_append" || entries.iter().any(|e| e != expected) {
            world.fail(format!(
                "ledger key {key} has {entries:?}, but its call (session {id}) is {} {}",
                call.name,
                call.run_arguments()
            ));
        }
        let runs = entries.len();
        if runs as u64 > u64::from(call.attempt) {
            world.fail(format!(
                "ledger key {key} ran {runs} time(s) but its call (session {id}) records {} dispatch(es)",
                call.attempt
            ));
        }
        let approvals = s.approvals(call.id.as_str());
        if runs > approvals {
            world.fail(format!(
                "ledger key {key} ran {runs} time(s) on {approvals} approval(s) (session {id}): \
                 a non-idempotent tool ran again without a human saying so"
            ));
        }
        if runs > 1 && !call.outcome_unknown {
            world.fail(format!(
                "ledger key {key} ran {runs} times (session {id}) but the call was never marked outcome_unknown"
            ));
        }
    }
}

/// The end state of a completed session: the whole script played once, each
/// ledger call completed and in the ledger.
fn check_complete(world: &World, s: &Stored, ledger: &BTreeMap<String, Vec<String>>) {
    let id = s.header.id;
    let calls = s.calls();
    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    let expected_names = [
        "ledger_append",
        "current_time",
        "ledger_append",
        "current_time",
        "ledger_append",
    ];
    if names != expected_names {
        world.fail(format!("session {id} ran calls {names:?}"));
    }
    let mut entries = Vec::new();
    for call in &calls {
        if call.state != CallState::Completed {
            world.fail(format!(
                "session {id}: call {} {} ended {:?}: {:?}",
                call.id, call.name, call.state, call.result
            ));
        }
        if call.name == "ledger_append" {
            let key = call.idempotency_key.as_deref().unwrap_or_default();
            match ledger.get(key) {
                Some(lines) => entries.push(lines[0].clone()),
                None => world.fail(format!(
                    "session {id}: call {} completed but its key {key} is not in the ledger",
                    call.id
                )),
            }
        }
    }
    if entries != ENTRIES {
        world.fail(format!("session {id} wrote {entries:?}"));
    }
    let last = s.transcript.iter().rev().find_map(|e| match e {
        TranscriptEntry::Assistant { text, .. } => Some(text.as_str()),
        _ => None,
    });
    if last != Some(FINAL_TEXT) {
        world.fail(format!("session {id} ended with {last:?}"));
    }
    // The transcript holds each step once: a re-issued model call after a
    // crash never duplicates an assistant entry.
    let assistants = s
        .transcript
        .iter()
        .filter(|e| matches!(e, TranscriptEntry::Assistant { .. }))
        .count();
    if assistants != 4 {
        world.fail(format!("session {id} has {assistants} assistant entries"));
    }
}

fn seed() -> u64 {
    match std::env::var("CRASH_SEED") {
        Ok(s) => s.trim().parse().expect("CRASH_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

#[test]
fn aborted_processes_resume_without_losing_or_repeating_anything() {
    let seed = seed();
    println!("crash test seed {seed} (rerun with CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let mut world = World::new(seed);
    let began = Instant::now();

    let mut known: BTreeSet<SessionId> = BTreeSet::new();
    let mut unfinished: Vec<SessionId> = Vec::new();
    let mut aborts_at: BTreeMap<&str, usize> = BTreeMap::new();
    let mut aborts = 0;
    let mut processes = 0;
    let mut resumes = 0;
    let mut aborted_resumes = 0;

    loop {
        let all_points = POINTS.len() + STORE_POINTS.len();
        let faulting = aborts < MIN_ABORTS || aborts_at.len() < all_points;
        if !faulting && unfinished.is_empty() {
            break;
        }
        if processes >= MAX_PROCESSES {
            world.fail(format!(
                "no end after {processes} processes ({aborts} aborts, {} unfinished)",
                unfinished.len()
            ));
        }
        processes += 1;
        // A new session now and then while faults are still planned; else
        // resume one left unfinished.
        let start_new = faulting
            && (unfinished.is_empty() || (unfinished.len() < IN_FLIGHT && rng.below(3) == 0));
        let target = if start_new {
            None
        } else {
            Some(unfinished[rng.below(unfinished.len() as u64) as usize])
        };
        let fault = if faulting && rng.below(10) < 8 {
            let drawn = rng.below(all_points as u64) as usize;
            let (point, max) = POINTS
                .get(drawn)
                .or_else(|| STORE_POINTS.get(drawn - POINTS.len()))
                .copied()
                .unwrap();
            let nth = 1 + rng.below(max);
            Some((point, format!("{point}:{nth}:abort")))
        } else {
            None
        };
        let spec = fault.as_ref().map(|(_, s)| s.as_str());
        let id_arg = target.map(|id| id.to_string());
        let args: Vec<&str> = match &id_arg {
            Some(id) => vec!["--resume", id],
            None => vec!["--agent", "crash", "Record three entries."],
        };
        let outcome = world.overseer("auto", &args, spec);
        let what = match &id_arg {
            Some(id) => format!("--resume {id}"),
            None => "new session".to_owned(),
        };
        let verdict = if outcome.aborted() {
            "aborted".to_owned()
        } else {
            format!("{}", outcome.status)
        };
        world.log.push(format!(
            "#{processes} {what}, fault {}: {verdict} in {:?}",
            spec.unwrap_or("none"),
            outcome.elapsed
        ));

        // A binary built without the feature would ignore the plan silently
        // (e.g. one rebuilt by a plain `cargo build` in the shared target
        // directory): say so rather than fail obscurely later.
        if let Some(spec) = spec {
            if !outcome
                .stderr
                .contains(&format!("fault injection armed: {spec}"))
            {
                world.fail(format!(
                    "the overseer binary did not arm {spec}: was it built without the \
                     fault-injection feature? stderr:\n{}",
                    outcome.stderr
                ));
            }
        }

        // Acknowledged decisions, whatever happened next.
        for line in outcome.stderr.lines() {
            if let Some(rest) = line.strip_prefix("decision acknowledged: ") {
                let mut parts = rest.split_whitespace();
                if let (Some(call), Some("approve")) = (parts.next(), parts.next()) {
                    *world.acked.entry(call.to_owned()).or_default() += 1;
                } else {
                    world.fail(format!("unexpected acknowledgement line {line:?}"));
                }
            }
        }

        if outcome.aborted() {
            let Some((point, _)) = &fault else {
                world.fail(format!(
                    "aborted without a planned fault; stderr:\n{}",
                    outcome.stderr
                ));
            };
            if !outcome.stderr.contains(ABORT_LINE) {
                world.fail(format!(
                    "died by SIGABRT but not at a fault point; stderr:\n{}",
                    outcome.stderr
                ));
            }
            aborts += 1;
            *aborts_at.entry(point).or_default() += 1;
            if target.is_some() {
                aborted_resumes += 1;
            }
        } else if !outcome.status.success() {
            world.fail(format!(
                "{what} exited with {} (fault {spec:?}); stderr:\n{}",
                outcome.status, outcome.stderr
            ));
        } else if target.is_some() {
            resumes += 1;
        }
        if target.is_some() && !outcome.stderr.contains("resuming: ") {
            world.fail(format!(
                "a resumed run did not say where the session stood; stderr:\n{}",
                outcome.stderr
            ));
        }

        // The store after the process: new sessions (an abort may come before
        // the CLI printed the id), invariants, which sessions are done.
        let sessions = world.snapshot();
        for s in &sessions {
            if known.insert(s.header.id) {
                unfinished.push(s.header.id);
            }
        }
        check(&world, &sessions);
        unfinished.retain(|id| {
            sessions
                .iter()
                .any(|s| s.header.id == *id && s.header.status != SessionStatus::Completed)
        });
        if !outcome.aborted() {
            // A run that was not aborted finished its session.
            let id = target.or_else(|| {
                outcome
                    .stderr
                    .lines()
                    .find_map(|l| l.strip_prefix("session: "))
                    .and_then(|s| s.trim().parse().ok())
            });
            match id {
                Some(id) if !unfinished.contains(&id) => {}
                _ => world.fail(format!(
                    "a run exited 0 without completing its session {id:?}; stderr:\n{}",
                    outcome.stderr
                )),
            }
        }
    }

    // The end: every session completed with the whole script played once.
    let sessions = world.snapshot();
    let ledger = world.ledger();
    check(&world, &sessions);
    for s in &sessions {
        check_complete(&world, s, &ledger);
    }
    let reasked: usize = sessions
        .iter()
        .flat_map(|s| s.calls())
        .filter(|c| c.outcome_unknown)
        .count();
    let doubles = ledger.values().filter(|v| v.len() > 1).count();
    println!(
        "{processes} processes, {aborts} aborts {aborts_at:?} ({aborted_resumes} of resumed runs), \
         {resumes} clean resumes, \
         {} sessions, {} acknowledged approvals, {reasked} outcome-unknown re-asks, \
         {doubles} re-run ledger keys, {:?}",
        sessions.len(),
        world.acked.values().sum::<usize>(),
        began.elapsed()
    );
    assert!(aborts >= MIN_ABORTS, "{}", world.report("too few aborts"));
    assert_eq!(sessions.len(), known.len());
}

/// One crash, step by step: the process dies as the first ledger call is
/// about to run; the resumed run is asked about it again (its outcome is
/// unknown to the runtime) and, told to deny, fails it without running it.
#[test]
fn an_interrupted_call_is_asked_again_and_denying_it_fails_it_unrun() {
    let world = World::new(0);
    let first = world.overseer(
        "auto",
        &["--agent", "crash", "Record three entries."],
        Some("during_tool:1:abort"),
    );
    assert!(first.aborted(), "{}", first.stderr);
    assert!(
        first
            .stderr
            .contains("fault injection armed: during_tool:1:abort"),
        "{}",
        first.stderr
    );
    let sessions = world.snapshot();
    assert_eq!(sessions.len(), 1);
    let id = sessions[0].header.id.to_string();
    let call = sessions[0].header.open_calls[0].clone();
    assert_eq!(
        (call.name.as_str(), call.state),
        ("ledger_append", CallState::Running)
    );

    let resumed = world.overseer("deny", &["--resume", &id], None);
    assert!(resumed.status.success(), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains(
            "resuming: running (turn 1, step 1): 1 tool call(s) were running, 1 wait to run"
        ),
        "{}",
        resumed.stderr
    );
    assert!(
        resumed.stderr.contains(&format!(
            "approval requested: ledger_append {{\"entry\":\"first\"}} ({}) [outcome unknown",
            call.id
        )),
        "{}",
        resumed.stderr
    );
    assert!(
        resumed
            .stderr
            .contains(&format!("decision acknowledged: {} deny", call.id)),
        "{}",
        resumed.stderr
    );
    // Nothing ran: every ledger call was denied or failed unrun.
    assert!(world.ledger().is_empty());
    let sessions = world.snapshot();
    check(&world, &sessions);
    let s = &sessions[0];
    assert_eq!(s.header.status, SessionStatus::Completed);
    let stored = s.calls().into_iter().find(|c| c.id == call.id).unwrap();
    assert_eq!(stored.state, CallState::Failed);
    assert!(stored.outcome_unknown);
    assert!(stored.result.as_ref().unwrap()["error"]
        .as_str()
        .unwrap()
        .starts_with("interrupted: the process stopped while this tool was running"));
}

/// The other action of a fault: a panic fails only the session actor, which
/// its supervisor restarts from the last checkpoint inside the same process.
/// The run that follows the session must notice nothing but the restart:
/// it finishes with the whole script played, each approval given once, and
/// the ledger clean (a panic at `after_checkpoint` also drops that
/// checkpoint's events from the live stream, which the run reads back from
/// the store).
#[test]
fn a_panicking_session_actor_restarts_in_process_and_the_run_finishes() {
    let world = World::new(0);
    for (point, _) in POINTS {
        let spec = format!("{point}:1:panic");
        let run = world.overseer(
            "auto",
            &["--agent", "crash", "Record three entries."],
            Some(&spec),
        );
        assert!(
            run.status.success(),
            "{spec}: {}\nstderr:\n{}",
            run.status,
            run.stderr
        );
        assert!(
            run.stderr.contains("injected fault at"),
            "{spec} never fired:\n{}",
            run.stderr
        );
    }
    let sessions = world.snapshot();
    assert_eq!(sessions.len(), POINTS.len());
    check(&world, &sessions);
    let ledger = world.ledger();
    for s in &sessions {
        check_complete(&world, s, &ledger);
    }
}

/// A malformed plan is refused at start-up, in one line, before anything runs.
#[test]
fn a_malformed_fault_plan_is_a_one_line_error() {
    let world = World::new(0);
    let run = world.overseer(
        "auto",
        &["--agent", "crash", "Record three entries."],
        Some("during_tool:first:abort"),
    );
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert_eq!(
        run.stderr.trim(),
        "error: fault injection: OVERSEER_FAULT: nth 'first' is not a number"
    );
    assert!(!world.data.exists(), "the store was created");
}

/// Logging must not be what kills a run: with stderr closed, every log line
/// fails to write, and a warning logged by a supervisor (here: the restart
/// after an injected panic) once made the logger panic inside that actor, the
/// orchestrator included, and the run hang. It must finish as usual.
#[test]
fn a_closed_stderr_does_not_stop_a_run_that_logs() {
    let world = World::new(0);
    let run = world.spawn(
        "auto",
        &["--agent", "crash", "Record three entries."],
        Some("after_checkpoint:1:panic"),
        false,
    );
    assert!(run.status.success(), "{}", run.status);
    let sessions = world.snapshot();
    assert_eq!(sessions.len(), 1);
    check(&world, &sessions);
    check_complete(&world, &sessions[0], &world.ledger());
}
