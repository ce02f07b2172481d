//! Workload 6, over HTTP: workload 1 driven through the API by concurrent
//! clients on a real loopback socket (auth off on loopback, as a sidecar
//! would run it). Each client creates a session with `POST /v1/sessions`,
//! lists its pending approval with `GET …/approvals` and approves it with
//! `POST …/approvals`.
//!
//! Measured: sessions created and parked per second, approvals finished per
//! second, and the end-to-end round trip from sending the decision to the
//! checkpoint that ends the turn (the moment its `turn_ended` event is
//! published to event streams).

use std::path::Path;
use std::time::{Duration, Instant};

use overseer::auth::AuthConfig;
use serde_json::{json, Value};

use overseer::actors::RuntimeConfig;

use crate::common::{bounded, rate, Bench, Mode, Reached, Res, Row, Rows, Want, APPROVE_AGENT};

/// Workload name in the table.
pub const NAME: &str = "over-http";

/// Concurrent HTTP clients (the figure).
pub const CLIENTS: usize = 64;

/// Runs workload 6 at `n` sessions with [`CLIENTS`] clients.
pub async fn run(mode: Mode, n: usize, base: &Path, failures: &mut Vec<String>) -> Res<Vec<Row>> {
    let Bench {
        dir: _dir,
        backend: _backend,
        probe,
        runs,
        ov,
    } = Bench::start("http", mode, base, RuntimeConfig::default()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(overseer::http::serve(
        ov.clone(),
        listener,
        AuthConfig::None,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;

    // Create and park.
    let t = Instant::now();
    let ids: Vec<(String, overseer::actors::model::SessionId)> = bounded(1..=n, CLIENTS, |key| {
        let client = client.clone();
        let url = url.clone();
        let probe = probe.clone();
        async move {
            let created: Value = client
                .post(format!("{url}/v1/sessions"))
                .json(&json!({"agent": APPROVE_AGENT, "prompt": format!("task {key}"), "auto_complete": true}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let id_text = created["id"].as_str().ok_or("no id in the create answer")?.to_owned();
            let id: overseer::actors::model::SessionId = id_text.parse()?;
            match probe.wait(id, Want::Parked).await? {
                Reached::Parked(_) => Ok((id_text, id)),
                other => Err(format!("session {id} did not park: {other:?}").into()),
            }
        }
    })
    .await?;
    let park_time = t.elapsed();

    // Approve through the API, measuring each round trip.
    let t = Instant::now();
    let mut rtts: Vec<Duration> = bounded(ids, CLIENTS, |(id_text, id)| {
        let client = client.clone();
        let url = url.clone();
        let probe = probe.clone();
        async move {
            let pending: Value = client
                .get(format!("{url}/v1/sessions/{id_text}/approvals"))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let mut decisions = serde_json::Map::new();
            for p in pending["pending"].as_array().into_iter().flatten() {
                if let Some(call) = p["call_id"].as_str() {
                    decisions.insert(call.to_owned(), json!({"decision": "approve"}));
                }
            }
            let sent = Instant::now();
            client
                .post(format!("{url}/v1/sessions/{id_text}/approvals"))
                .json(&json!({ "decisions": decisions }))
                .send()
                .await?
                .error_for_status()?;
            match probe.wait(id, Want::TurnEnded).await? {
                Reached::TurnEnded(_) => Ok(sent.elapsed()),
                other => Err(format!("session {id} did not finish: {other:?}").into()),
            }
        }
    })
    .await?;
    let finish_time = t.elapsed();
    let (bad, _) = runs.check(n);
    let _ = stop_tx.send(());
    let _ = server.await;
    ov.shutdown().await?;

    let mut rows = Rows::new(NAME, Some(mode), n);
    rows.add("clients", Some(CLIENTS as f64), "connections", "");
    rows.add("create + park rate", rate(n, park_time), "sessions/s", "");
    rows.add(
        "approve + finish rate",
        rate(n, finish_time),
        "approvals/s",
        "",
    );
    let p99 = if mode == Mode::Fsync { "<= 10" } else { "" };
    rows.latency("round trip over HTTP", &mut rtts, "", p99);
    rows.add(
        "tools run exactly once",
        Some((n - bad.len().min(n)) as f64),
        "sessions",
        &format!("= {n}"),
    );
    if !bad.is_empty() {
        failures.push(format!(
            "{NAME} {} N={n}: {} tools did not run exactly once; first: {}",
            mode.as_str(),
            bad.len(),
            bad[0]
        ));
    }
    Ok(rows.rows)
}
