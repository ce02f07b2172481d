//! The soak (issue 32): churn at the shipped default limits for N minutes.
//! [`CLIENTS`] clients over a real loopback socket each loop create →
//! approve → complete: `POST /v1/sessions` (the bench agent proposes
//! `write_record`), `GET …/approvals`, `POST …/approvals`, and the turn
//! ends with the session awaiting input, where it stays live until it
//! hibernates (its idle time shortens under pressure, see
//! `overseer_actors::IdlePressure`). Nobody ends the sessions: what a
//! long-running server accumulates is the point.
//!
//! The runtime takes `overseer::config::Config::builtin()`'s tunables, so
//! the limits are exactly those a fresh `overseer serve` runs with
//! (`max_live_sessions` 100,000, `idle_hibernate_secs` 300, the pressure
//! share and floor, the HTTP edge's in-flight cap).
//!
//! Printed once a minute (and kept as rows, N = the minute): cycles in the
//! minute, answers that were not 2xx by status and code, the process's
//! resident memory (server and clients; the clients hold nothing per
//! session), live session actors, hibernations, and the store's size on
//! disk. At the end: totals, and whether every approved tool ran exactly
//! once. A client that gets an error records it and carries on with a new
//! session after a short pause.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use overseer::auth::AuthConfig;
use serde::Deserialize;
use serde_json::json;

use crate::common::{rss_bytes, Bench, Mode, Probe, Reached, Res, Row, Rows, Want, APPROVE_AGENT};

/// Workload name in the table.
pub const NAME: &str = "soak";

/// Concurrent HTTP clients (the figure).
pub const CLIENTS: usize = 64;

/// Distinct tool keys the clients cycle through: the tool's run counter
/// then holds a fixed number of entries, so the harness's own memory does
/// not grow with the cycles.
const KEYS: u64 = 1_000;

#[derive(Deserialize)]
struct Created {
    id: overseer::actors::model::SessionId,
}

#[derive(Deserialize)]
struct Pending {
    pending: Vec<PendingCall>,
}

#[derive(Deserialize)]
struct PendingCall {
    call_id: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
}

/// What the clients count, shared with the reporter.
#[derive(Default)]
struct Tally {
    cycles: AtomicU64,
    /// "status code" → answers.
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn error(&self, what: String) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        *errors.entry(what).or_insert(0) += 1;
    }

    fn errors(&self) -> BTreeMap<String, u64> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One request's failure, as the tally files it.
enum Failure {
    /// An answer that was not 2xx: "503 overloaded".
    Status(String),
    /// No answer, or the session did not reach its milestone.
    Other(String),
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Other(e.to_string())
    }
}

/// Sends `req`, returning the answer if it is 2xx, else its status and code.
async fn send(req: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
    let resp = req
        .send()
        .await
        .map_err(|e| Failure::Other(format!("transport: {e}")))?;
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status().as_u16();
    let code = resp
        .json::<ErrorBody>()
        .await
        .map(|b| b.error.code)
        .unwrap_or_else(|_| "-".into());
    Err(Failure::Status(format!("{status} {code}")))
}

/// One create → approve → complete.
async fn cycle(
    client: &reqwest::Client,
    sessions_url: &reqwest::Url,
    probe: &Probe,
    key: u64,
) -> Result<(), Failure> {
    let created: Created = send(
        client
            .post(sessions_url.clone())
            .json(&json!({"agent": APPROVE_AGENT, "prompt": format!("task {key}")})),
    )
    .await?
    .json()
    .await?;
    let id = created.id;
    match probe.wait(id, Want::Parked).await? {
        Reached::Parked(_) => {}
        other => return Err(Failure::Other(format!("did not park: {other:?}"))),
    }
    let approvals = sessions_url.join(&format!("sessions/{id}/approvals"))?;
    let pending: Pending = send(client.get(approvals.clone())).await?.json().await?;
    let mut decisions = serde_json::Map::new();
    for p in pending.pending {
        decisions.insert(p.call_id, json!({"decision": "approve"}));
    }
    // Registered before the decision, so a fast turn end is not missed.
    let ended = probe.expect(id, Want::TurnEnded);
    send(
        client
            .post(approvals)
            .json(&json!({ "decisions": decisions })),
    )
    .await?;
    match crate::common::wait_for(id, ended).await? {
        Reached::TurnEnded(_) => Ok(()),
        other => Err(Failure::Other(format!("did not complete: {other:?}"))),
    }
}

/// Runs the soak for `minutes`.
pub async fn run(
    mode: Mode,
    minutes: u64,
    base: &Path,
    failures: &mut Vec<String>,
) -> Res<Vec<Row>> {
    let config = overseer::config::Config::builtin()?;
    let runtime = config.runtime_config();
    eprintln!(
        "  soak: {CLIENTS} clients for {minutes} min; max_live_sessions {}, idle_hibernate {:?}, pressure from {} % to a floor of {:?}",
        runtime.limits.max_live_sessions,
        runtime.idle_hibernate,
        runtime.idle_pressure.share_pct,
        runtime.idle_pressure.floor
    );
    let Bench {
        dir: _dir,
        backend,
        probe,
        runs,
        ov,
    } = Bench::start("soak", mode, base, runtime).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let options = config.http.options();
    let server = tokio::spawn(overseer::http::serve_with(
        ov.clone(),
        listener,
        AuthConfig::None,
        options,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let sessions_url = reqwest::Url::parse(&format!("{url}/v1/sessions"))?;

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..CLIENTS as u64 {
        let (client, sessions_url, probe, tally, stop) = (
            client.clone(),
            sessions_url.clone(),
            probe.clone(),
            tally.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = (c * 7919 + i) % KEYS + 1;
                i += 1;
                match cycle(&client, &sessions_url, &probe, key).await {
                    Ok(()) => {
                        tally.cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(f) => {
                        tally.error(match f {
                            Failure::Status(s) => s,
                            Failure::Other(s) => {
                                // The first words say what it was; the rest
                                // (ids) would make every entry unique.
                                s.split(':').next().unwrap_or("error").trim().to_owned()
                            }
                        });
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }));
    }

    let mut rows = Rows::new(NAME, Some(mode), CLIENTS);
    let started = Instant::now();
    let hibernations = || ov.metrics().hibernations.load(Ordering::Relaxed);
    let (mut last_cycles, mut last_errors, mut last_hib) = (0u64, BTreeMap::new(), 0u64);
    let mut rss_by_minute = Vec::new();
    eprintln!(
        "  {:>6} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}  errors",
        "minute", "cycles", "per s", "RSS MiB", "live", "hibern.", "disk MiB"
    );
    for minute in 1..=minutes {
        let at = started + Duration::from_secs(60 * minute);
        tokio::time::sleep_until(at.into()).await;
        let cycles = tally.cycles.load(Ordering::Relaxed);
        let errors = tally.errors();
        let rss = rss_bytes()?;
        let live = ov.live_sessions();
        let hib = hibernations();
        let disk = backend.size_on_disk()?;
        let mut new_errors: BTreeMap<String, u64> = BTreeMap::new();
        for (what, n) in &errors {
            let before = last_errors.get(what).copied().unwrap_or(0);
            if *n > before {
                new_errors.insert(what.clone(), n - before);
            }
        }
        let in_minute = cycles - last_cycles;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        eprintln!(
            "  {minute:>6} {in_minute:>8} {:>8.0} {:>9.1} {live:>8} {:>9} {:>9.1}  {}",
            in_minute as f64 / 60.0,
            mib(rss),
            hib - last_hib,
            mib(disk),
            if new_errors.is_empty() {
                "none".to_owned()
            } else {
                format!("{new_errors:?}")
            }
        );
        let mut add = |metric: &str, value: f64, unit: &str| {
            rows.add(metric, Some(value), unit, "");
            if let Some(row) = rows.rows.last_mut() {
                row.n = minute;
            }
        };
        add("cycles in the minute", in_minute as f64, "cycles");
        add(
            "errors in the minute",
            new_errors.values().sum::<u64>() as f64,
            "answers",
        );
        for (what, n) in &new_errors {
            add(&format!("errors: {what}"), *n as f64, "answers");
        }
        add("RSS", mib(rss), "MiB");
        add("live session actors", live as f64, "actors");
        add(
            "hibernations in the minute",
            (hib - last_hib) as f64,
            "sessions",
        );
        add("store on disk", mib(disk), "MiB");
        add(
            "harness: milestones held",
            probe.pending() as f64,
            "entries",
        );
        rss_by_minute.push(rss);
        (last_cycles, last_errors, last_hib) = (cycles, errors, hib);
    }

    // Let every cycle under way finish, so the tool count is exact.
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    let cycles = tally.cycles.load(Ordering::Relaxed);
    let errors = tally.errors();
    let (_, ran) = runs.check(0);
    let _ = stop_tx.send(());
    let _ = server.await;
    ov.shutdown().await?;

    let mut totals = Rows::new(NAME, Some(mode), CLIENTS);
    totals.add("clients", Some(CLIENTS as f64), "connections", "");
    totals.add("minutes", Some(minutes as f64), "min", "");
    totals.add("cycles", Some(cycles as f64), "cycles", "");
    totals.add(
        "cycle rate",
        Some(cycles as f64 / started.elapsed().as_secs_f64()),
        "cycles/s",
        "",
    );
    let overloaded: u64 = errors
        .iter()
        .filter(|(k, _)| k.contains("overloaded"))
        .map(|(_, n)| n)
        .sum();
    totals.add(
        "errors",
        Some(errors.values().sum::<u64>() as f64),
        "answers",
        "= 0",
    );
    totals.add("503 overloaded", Some(overloaded as f64), "answers", "= 0");
    if let (Some(first), Some(last)) = (rss_by_minute.first(), rss_by_minute.last()) {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        totals.add("RSS at minute 1", Some(mib(*first)), "MiB", "");
        totals.add(
            &format!("RSS at minute {minutes}"),
            Some(mib(*last)),
            "MiB",
            "",
        );
    }
    totals.add(
        "approved tools run",
        Some(ran as f64),
        "runs",
        &format!("= {cycles} (one per cycle)"),
    );
    if ran != cycles {
        failures.push(format!(
            "{NAME}: {cycles} cycles completed but the tool ran {ran} times"
        ));
    }
    if overloaded > 0 {
        failures.push(format!("{NAME}: {overloaded} answers were 503 overloaded"));
    }
    rows.rows.extend(totals.rows);
    Ok(rows.rows)
}
