//! The benchmark harness of §14 (issue 8): how fast, how big, and how it grows.
//!
//! ```text
//! cargo bench --bench overseer -- [--sessions N] [--durability fsync|os] [--full]
//!                                 [--out FILE.json] [--workload NAME]... [--cache-mb MB]
//!                                 [--compression none|zstd] [--webhook] [--minutes N]
//!                                 [--telemetry off|live|dead]
//! ```
//!
//! Workloads, all on the scripted provider and real sled directories in temp
//! dirs: approve-and-execute (1), idle sessions (2), checkpoint cost vs
//! history length (3), recovery after a kill (4), each of 1 and 2 at growing
//! N (5), over HTTP (6), and resident memory before and after many finished
//! sessions (7, `finished`: 100,000, a million with `--full`; not in the
//! quick default, select it with `--workload finished`), and the soak (8,
//! `soak`: 64 HTTP clients doing create → approve → complete for
//! `--minutes` at the default limits, a row per minute; on request only). The quick default
//! finishes in under two minutes on two cores; `--full` adds N = 100,000
//! (and a million idle sessions, guarded by free memory). It prints one table
//! and writes the same rows as JSON to `--out`.
//!
//! Every case runs in a fresh child process (this binary re-invoked with the
//! hidden `--case` flag): memory freed by one case cannot be reused by the
//! next and hide its cost, sled's one-open-database-per-directory rule never
//! bites, and the recovery case can really kill a process. Figures are
//! measured, never asserted; a failed correctness check (a tool that did not
//! run exactly once, a session not recovered) is printed and fails the run.

#[path = "overseer/approve.rs"]
mod approve;
#[path = "overseer/checkpoint.rs"]
mod checkpoint;
#[path = "overseer/cluster.rs"]
mod cluster;
#[path = "overseer/common.rs"]
mod common;
#[path = "overseer/finished.rs"]
mod finished;
#[path = "overseer/http.rs"]
mod http;
#[path = "overseer/idle.rs"]
mod idle;
#[path = "overseer/recovery.rs"]
mod recovery;
#[path = "overseer/soak.rs"]
mod soak;
#[path = "overseer/telemetry.rs"]
mod telemetry;
#[path = "overseer/webhook.rs"]
mod webhook;
// The throwaway PostgreSQL server of the tests, for the cluster workloads.
#[allow(dead_code)]
#[path = "../tests/common/pg.rs"]
mod pg;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use common::{Mode, Res, Row};

const USAGE: &str = "\
usage: cargo bench --bench overseer -- [options]

  --sessions N          run the session workloads at N only (default 1000 and 10000;
                        recovery 10000; --full adds 100000)
  --durability MODE     fsync or os (default: both for approve, checkpoint, recovery;
                        fsync for idle)
  --full                the long run: N up to 100000, recovery at 100000, a million
                        idle sessions, 2000 checkpoint rounds
  --out FILE            also write the rows as JSON to FILE
  --workload NAME       only this workload (repeatable): approve, round-trip, idle, http,
                        checkpoint, recovery, scaling (= approve + idle), finished (RSS
                        before/after 100000 finished sessions, 1000000 with --full;
                        not part of the default set); webhooks (approve with and without
                        one endpoint); cluster mode (not in the default
                        run; needs Debian's postgresql): pg-approve, pg-http, failover,
                        cluster (= all three); soak (64 HTTP clients create -> approve ->
                        complete at the default limits for --minutes, a row per minute;
                        not part of the default set)
  --cache-mb MB         sled's page cache of every store opened (default: the store's
                        default, [store] cache_mb)
  --compression C       how every store opened compresses its log: none (default) or
                        zstd ([store] compression)
  --concurrency C       sessions in flight at once (default 1000)
  --rounds R            checkpoints measured per history length (default 500)
  --dir DIR             where the temp sled directories go (default: the temp dir)
  --telemetry MODE      trace export in every case: off (default), live (to a local OTLP
                        receiver) or dead (to a closed port: exports fail, spans dropped)
  --webhook             approve-and-execute with one webhook endpoint of the bench tenant
                        registered on a local receiver (every event): adds the delivery
                        latency (event to receiver, p50/p99); the `webhooks` workload runs
                        approve with and without it, to compare throughput
  --minutes N           how long the soak runs (default 10)";

/// Sessions in flight at once by default: enough for concurrent checkpoints
/// to share flushes, few enough that a latency is not mostly harness queueing.
const DEFAULT_CONCURRENCY: usize = 1000;
/// Sessions of the concurrency-1 round-trip case.
const SERIAL_SESSIONS: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Approve,
    RoundTrip,
    Idle,
    Checkpoint,
    Recovery,
    Http,
    PgApprove,
    PgHttp,
    Failover,
    Finished,
    Soak,
    Webhooks,
}

impl Workload {
    fn parse(s: &str) -> Option<Vec<Self>> {
        Some(match s {
            "approve" | "approve-and-execute" | "1" => vec![Self::Approve],
            "round-trip" | "rtt" | "approval-round-trip" => vec![Self::RoundTrip],
            "idle" | "idle-sessions" | "2" => vec![Self::Idle],
            "checkpoint" | "checkpoint-vs-history" | "3" => vec![Self::Checkpoint],
            "recovery" | "4" => vec![Self::Recovery],
            "http" | "over-http" | "6" => vec![Self::Http],
            "scaling" | "5" => vec![Self::Approve, Self::Idle],
            "pg-approve" => vec![Self::PgApprove],
            "pg-http" => vec![Self::PgHttp],
            "failover" => vec![Self::Failover],
            "cluster" => vec![Self::PgApprove, Self::PgHttp, Self::Failover],
            "finished" | "finished-sessions" | "memory" | "7" => vec![Self::Finished],
            "soak" | "8" => vec![Self::Soak],
            "webhooks" | "webhook" => vec![Self::Webhooks],
            "all" => vec![
                Self::Approve,
                Self::RoundTrip,
                Self::Idle,
                Self::Checkpoint,
                Self::Recovery,
                Self::Http,
            ],
            _ => return None,
        })
    }
}

#[derive(Debug, Default)]
struct Args {
    sessions: Option<usize>,
    durability: Option<Mode>,
    full: bool,
    out: Option<PathBuf>,
    workloads: Vec<Workload>,
    concurrency: Option<usize>,
    rounds: Option<usize>,
    dir: Option<PathBuf>,
    cache_mb: Option<u64>,
    compression: Option<overseer::store::Compression>,
    minutes: Option<u64>,
    /// Register a webhook endpoint on a local receiver in approve.
    webhook: bool,
    /// `--telemetry`: off, live or dead.
    telemetry: Option<String>,
    /// Hidden: run one case in this process and print its rows.
    case: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            // cargo bench passes it to every bench target; nothing to do.
            "--bench" => {}
            "--full" => args.full = true,
            "--webhook" => args.webhook = true,
            "--telemetry" => args.telemetry = Some(value("--telemetry")?),
            "--sessions" => {
                let v = value("--sessions")?;
                let n: usize = v.parse().map_err(|_| format!("bad --sessions: {v}"))?;
                if n == 0 {
                    return Err("--sessions must be at least 1".into());
                }
                args.sessions = Some(n);
            }
            "--durability" => {
                let v = value("--durability")?;
                args.durability =
                    Some(Mode::parse(&v).ok_or(format!("--durability is fsync or os, not {v}"))?);
            }
            "--out" => args.out = Some(PathBuf::from(value("--out")?)),
            "--workload" => {
                let v = value("--workload")?;
                for name in v.split(',') {
                    let w = Workload::parse(name.trim())
                        .ok_or(format!("unknown workload {name}\n\n{USAGE}"))?;
                    args.workloads.extend(w);
                }
            }
            "--concurrency" => {
                let v = value("--concurrency")?;
                args.concurrency = Some(v.parse().map_err(|_| format!("bad --concurrency: {v}"))?);
            }
            "--rounds" => {
                let v = value("--rounds")?;
                args.rounds = Some(v.parse().map_err(|_| format!("bad --rounds: {v}"))?);
            }
            "--dir" => args.dir = Some(PathBuf::from(value("--dir")?)),
            "--cache-mb" => {
                let v = value("--cache-mb")?;
                let mb: u64 = v.parse().map_err(|_| format!("bad --cache-mb: {v}"))?;
                if !(1..=overseer::store::MAX_CACHE_MB).contains(&mb) {
                    return Err(format!(
                        "--cache-mb must be between 1 and {}",
                        overseer::store::MAX_CACHE_MB
                    ));
                }
                args.cache_mb = Some(mb);
            }
            "--compression" => {
                let v = value("--compression")?;
                args.compression = Some(match v.as_str() {
                    "none" => overseer::store::Compression::None,
                    "zstd" => overseer::store::Compression::Zstd,
                    _ => return Err(format!("--compression is none or zstd, not {v}")),
                });
            }
            "--minutes" => {
                let v = value("--minutes")?;
                let m: u64 = v.parse().map_err(|_| format!("bad --minutes: {v}"))?;
                if m == 0 {
                    return Err("--minutes must be at least 1".into());
                }
                args.minutes = Some(m);
            }
            "--case" => args.case = Some(value("--case")?),
            other => return Err(format!("unknown argument {other}\n\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    // reqwest is built without a default TLS provider (see Cargo.toml): every
    // case that makes an HTTP client needs one installed, as `main.rs` does.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    if std::env::args().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.case.clone() {
        Some(case) => run_case(&case, &args),
        None => run_all(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Parent: plan the cases, run each in a child, print and save the table

/// One case: a workload at one durability and one N, run in its own process.
struct Case {
    name: &'static str,
    mode: Mode,
    n: usize,
}

fn plan(args: &Args) -> Vec<Case> {
    let all = Workload::parse("all").unwrap_or_default();
    let workloads = if args.workloads.is_empty() {
        all
    } else {
        args.workloads.clone()
    };
    let sizes: Vec<usize> = match (args.sessions, args.full) {
        (Some(n), _) => vec![n],
        (None, false) => vec![1_000, 10_000],
        (None, true) => vec![1_000, 10_000, 100_000],
    };
    let modes = match args.durability {
        Some(m) => vec![m],
        None => vec![Mode::Fsync, Mode::Os],
    };
    // Memory is not a durability question: idle runs in the default mode.
    let idle_mode = args.durability.unwrap_or(Mode::Fsync);
    let recovery_n = args
        .sessions
        .unwrap_or(if args.full { 100_000 } else { 10_000 });
    let serial_n = args
        .sessions
        .unwrap_or(SERIAL_SESSIONS)
        .min(SERIAL_SESSIONS);

    let mut cases = Vec::new();
    let mut add = |w: Workload, name, mode, n| {
        if workloads.contains(&w) {
            cases.push(Case { name, mode, n });
        }
    };
    for &m in &modes {
        add(Workload::Checkpoint, "checkpoint", m, 0);
    }
    for &m in &modes {
        add(Workload::RoundTrip, "round-trip", m, serial_n);
    }
    for &n in &sizes {
        for &m in &modes {
            add(Workload::Approve, "approve", m, n);
        }
    }
    // Throughput with one webhook endpoint against none, back to back.
    for &n in &sizes {
        for &m in &modes {
            add(Workload::Webhooks, "approve", m, n);
            add(Workload::Webhooks, "approve-webhook", m, n);
        }
    }
    for &n in &sizes {
        add(Workload::Idle, "idle", idle_mode, n);
        add(Workload::Idle, "actor-floor", idle_mode, n);
        add(Workload::Idle, "hibernate", idle_mode, n);
    }
    if args.full && args.sessions.is_none() {
        add(Workload::Idle, "idle", idle_mode, 1_000_000);
        add(Workload::Idle, "hibernate", idle_mode, 1_000_000);
    }
    for &m in &modes {
        add(Workload::Recovery, "recovery", m, recovery_n);
    }
    // Over HTTP: fsync (the issue's target), at the smaller default size.
    let http_n = args
        .sessions
        .unwrap_or(if args.full { 10_000 } else { 2_000 });
    add(
        Workload::Http,
        "http",
        args.durability.unwrap_or(Mode::Fsync),
        http_n,
    );
    // Cluster mode: fsync (as deployed), on request only.
    let cluster_mode = args.durability.unwrap_or(Mode::Fsync);
    for &n in &sizes {
        add(Workload::PgApprove, "pg-approve", cluster_mode, n);
    }
    add(Workload::PgHttp, "pg-http-1", cluster_mode, http_n);
    add(Workload::PgHttp, "pg-http-3", cluster_mode, http_n);
    add(
        Workload::Failover,
        "failover",
        cluster_mode,
        args.sessions.unwrap_or(1_000),
    );
    // Memory, not durability: the default mode. Only when asked for.
    if args.workloads.contains(&Workload::Finished) {
        let n = args
            .sessions
            .unwrap_or(if args.full { 1_000_000 } else { 100_000 });
        let mode = args.durability.unwrap_or(Mode::Fsync);
        add(Workload::Finished, "finished", mode, n);
        add(Workload::Finished, "finished-store", mode, n);
    }
    // Churn at the default limits: fsync (as shipped), on request only.
    add(
        Workload::Soak,
        "soak",
        args.durability.unwrap_or(Mode::Fsync),
        soak::CLIENTS,
    );
    cases
}

fn run_all(args: &Args) -> Res<ExitCode> {
    let started = Instant::now();
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    if cfg!(debug_assertions) {
        eprintln!("warning: unoptimized build; use `cargo bench` for figures worth quoting");
    }
    let load = load_average();
    if load > cores() as f64 / 2.0 {
        eprintln!(
            "warning: load average {load:.1} on {} cores: other work competes for the CPU",
            cores()
        );
    }
    let fs = filesystem_of(&base);
    if fs == "tmpfs" {
        eprintln!(
            "warning: {} is on tmpfs: fsync costs nothing there; pass --dir",
            base.display()
        );
    }
    let exe = std::env::current_exe()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for case in plan(args) {
        let label = format!("{} {} N={}", case.name, case.mode.as_str(), case.n);
        eprintln!("[{:>6.1}s] {label}", started.elapsed().as_secs_f64());
        let mut cmd = Command::new(&exe);
        cmd.args(["--case", case.name, "--durability", case.mode.as_str()])
            .args(["--sessions", &case.n.max(1).to_string()])
            .args([
                "--concurrency",
                &args.concurrency.unwrap_or(DEFAULT_CONCURRENCY).to_string(),
            ])
            .arg("--dir")
            .arg(&base)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(r) = args.rounds {
            cmd.args(["--rounds", &r.to_string()]);
        }
        if let Some(mb) = args.cache_mb {
            cmd.args(["--cache-mb", &mb.to_string()]);
        }
        if args.compression == Some(overseer::store::Compression::Zstd) {
            cmd.args(["--compression", "zstd"]);
        }
        if args.full {
            cmd.arg("--full");
        }
        if let Some(m) = args.minutes {
            cmd.args(["--minutes", &m.to_string()]);
        }
        if args.webhook {
            cmd.arg("--webhook");
        }
        if let Some(t) = &args.telemetry {
            cmd.args(["--telemetry", t]);
        }
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout from a case process")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(json) = line.strip_prefix("ROW ") {
                rows.push(serde_json::from_str(json)?);
            } else if let Some(msg) = line.strip_prefix("FAIL ") {
                eprintln!("FAILURE: {msg}");
                failures.push(msg.to_owned());
            } else {
                eprintln!("{line}");
            }
        }
        let status = child.wait()?;
        if !status.success() {
            let msg = format!("{label}: the case process failed ({status})");
            eprintln!("FAILURE: {msg}");
            failures.push(msg);
        }
    }
    let elapsed = started.elapsed();
    print_table(&rows);
    for f in &failures {
        println!("FAILURE: {f}");
    }
    println!(
        "{} rows in {:.1} s on {}",
        rows.len(),
        elapsed.as_secs_f64(),
        machine_line(&fs)
    );
    if let Some(out) = &args.out {
        let doc = serde_json::json!({
            "command": std::env::args().skip(1).filter(|a| a != "--bench").collect::<Vec<_>>(),
            "machine": machine(&fs),
            "elapsed_secs": elapsed.as_secs_f64(),
            "rows": rows,
            "failures": failures,
        });
        let mut f = std::fs::File::create(out)?;
        f.write_all(serde_json::to_string_pretty(&doc)?.as_bytes())?;
        f.write_all(b"\n")?;
        eprintln!("wrote {}", out.display());
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn format_value(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) if v == 0.0 || v.abs() >= 0.001 => format!("{v:.3}"),
        Some(v) => format!("{v:.1e}"),
    }
}

fn print_table(rows: &[Row]) {
    let header = [
        "workload",
        "durability",
        "N",
        "metric",
        "value",
        "unit",
        "target",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.workload.clone(),
                r.durability.clone(),
                r.n.to_string(),
                r.metric.clone(),
                format_value(r.value),
                r.unit.clone(),
                r.target.clone(),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c.iter()) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: [&str; 7]| {
        // Numbers right-aligned, text left-aligned.
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(width).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            if i == 2 || i == 4 {
                s.push_str(&format!("{cell:>w$}"));
            } else {
                s.push_str(&format!("{cell:<w$}"));
            }
        }
        s.trim_end().to_owned()
    };
    println!();
    println!("{}", line(header));
    println!(
        "{}",
        width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for c in &cells {
        println!("{}", line(c.each_ref().map(String::as_str)));
    }
    println!("(N is the transcript length for checkpoint-vs-history)");
}

// ---------------------------------------------------------------------------
// Child: run one case and print its rows

fn run_case(case: &str, args: &Args) -> Res<ExitCode> {
    let mode = args.durability.unwrap_or(Mode::Fsync);
    let n = args.sessions.unwrap_or(1_000);
    let limit = args.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let rounds = args.rounds.unwrap_or(if args.full { 2_000 } else { 500 });
    if let Some(mb) = args.cache_mb {
        common::set_cache_mb(mb);
    }
    if let Some(c) = args.compression {
        common::set_compression(c);
    }
    let traces = telemetry::start(args.telemetry.as_deref().unwrap_or("off"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut failures = Vec::new();
    let outcome = rt.block_on(async {
        match case {
            "approve" => approve::run(mode, n, limit, &base, &mut failures, args.webhook).await,
            "approve-webhook" => approve::run(mode, n, limit, &base, &mut failures, true).await,
            "round-trip" => approve::serial(mode, n, limit, &base, &mut failures).await,
            "idle" => idle::run(mode, n, limit, &base).await,
            "hibernate" => idle::hibernated(mode, n, limit, &base).await,
            "actor-floor" => idle::actor_floor(mode, n).await,
            "checkpoint" => checkpoint::run(mode, rounds, &base).await,
            "recovery" => recovery::run(mode, n, limit, &base, &mut failures).await,
            "http" => http::run(mode, n, &base, &mut failures).await,
            "pg-approve" => cluster::approve(mode, n, limit, &base, &mut failures).await,
            "pg-http-1" => cluster::http(mode, n, 1, &base, &mut failures).await,
            "pg-http-3" => cluster::http(mode, n, 3, &base, &mut failures).await,
            "failover" => cluster::failover(mode, n, &base, &mut failures).await,
            "finished" => finished::run(mode, n, limit, &base, &mut failures).await,
            "finished-store" => finished::store_only(mode, n, limit, &base).await,
            "soak" => soak::run(mode, args.minutes.unwrap_or(10), &base, &mut failures).await,
            "park-for-recovery" => recovery::park_and_wait(mode, n, limit, &base)
                .await
                .map(|()| Vec::new()),
            other => Err(format!("unknown case {other}").into()),
        }
    });
    // Exit straight away, success or not: sled and the runtime may still hold
    // threads, and the rows (or the error) are all the parent needs.
    let rows = match outcome {
        Ok(mut rows) => {
            if let Some(t) = &args.telemetry {
                for row in &mut rows {
                    row.workload = format!("{}+otel-{t}", row.workload);
                }
                if let Some(traces) = traces {
                    traces.shutdown();
                }
                eprintln!(
                    "  otel: {} export requests received",
                    telemetry::RECEIVED.load(std::sync::atomic::Ordering::Relaxed)
                );
            }
            rows
        }
        Err(e) => {
            eprintln!("error in case {case}: {e}");
            std::process::exit(1)
        }
    };
    let mut out = std::io::stdout().lock();
    for row in &rows {
        writeln!(out, "ROW {}", serde_json::to_string(row)?)?;
    }
    for f in &failures {
        writeln!(out, "FAIL {f}")?;
    }
    out.flush()?;
    drop(out);
    std::process::exit(0)
}

// ---------------------------------------------------------------------------
// Machine description for the README

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn cpu_model() -> String {
    read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "unknown CPU".to_owned(), |s| s.trim().to_owned())
}

fn mem_total_gib() -> f64 {
    read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / (1024.0 * 1024.0))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The filesystem type of the mount holding `dir` (longest mount-point prefix).
fn filesystem_of(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    read("/proc/mounts")
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let _dev = f.next()?;
            let mount = f.next()?;
            let fstype = f.next()?;
            dir.starts_with(mount)
                .then(|| (mount.len(), fstype.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "unknown".to_owned(), |(_, t)| t)
}

fn machine(fs: &str) -> serde_json::Value {
    serde_json::json!({
        "cores": cores(),
        "memory_gib": (mem_total_gib() * 10.0).round() / 10.0,
        "cpu": cpu_model(),
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "filesystem": fs,
        "optimized": !cfg!(debug_assertions),
        "load_average_at_end": load_average(),
    })
}

fn machine_line(fs: &str) -> String {
    format!(
        "{} cores ({}), {:.1} GiB RAM, {fs}, load average {:.1}",
        cores(),
        cpu_model(),
        mem_total_gib(),
        load_average()
    )
}

/// One-minute load average: a busy machine makes every figure worse.
fn load_average() -> f64 {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0)
}
