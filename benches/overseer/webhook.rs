//! `--webhook`: one webhook endpoint of the bench tenant, for every event,
//! registered on a receiver in this process (a loopback HTTP server that
//! answers 200 at once), with the delivery task running as under `overseer
//! serve`. The receiver notes when each delivery arrived against when its
//! event happened (the payload's `timestamp`): the delivery latency, which
//! covers the checkpoint, the outbox intake and the attempt.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use overseer::actors::Overseer;
use overseer::store::SledStore;
use overseer::webhooks::{
    NewEndpoint, Subscriptions, SystemClock, TargetRules, WebhookOptions, Webhooks,
};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::common::Res;

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    latencies: Vec<Duration>,
}

/// A registered endpoint and its receiver.
pub struct Hook {
    seen: Arc<Mutex<Seen>>,
    count: watch::Sender<usize>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    server: tokio::task::JoinHandle<()>,
    webhooks: Arc<Webhooks>,
}

struct Rx {
    seen: Arc<Mutex<Seen>>,
    count: watch::Sender<usize>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn receive(State(rx): State<Arc<Rx>>, body: Bytes) -> StatusCode {
    let at = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["timestamp"].as_str().map(str::to_owned))
        .and_then(|t| OffsetDateTime::parse(&t, &Rfc3339).ok())
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
    if let Some(at) = at {
        let ms = now_ms().saturating_sub(at).max(0) as u64;
        if let Ok(mut seen) = rx.seen.lock() {
            seen.latencies.push(Duration::from_millis(ms));
        }
    }
    rx.count.send_modify(|n| *n += 1);
    StatusCode::OK
}

impl Hook {
    /// Installs the outbox view on `store`: call before the runtime starts.
    pub async fn install(store: &SledStore) -> Res<(Arc<Webhooks>, Arc<Subscriptions>)> {
        let view = Arc::new(Subscriptions::new());
        store.set_webhooks(view.clone());
        let options = WebhookOptions {
            targets: TargetRules {
                allow_loopback: true,
                allow_private: false,
            },
            ..WebhookOptions::default()
        };
        let webhooks = Webhooks::open(
            Arc::new(store.clone()),
            view.clone(),
            options,
            Arc::new(SystemClock),
        )
        .await?;
        Ok((webhooks, view))
    }

    /// Starts the receiver, registers it for the bench tenant and starts
    /// the delivery task on `ov`'s runtime.
    pub async fn start(webhooks: Arc<Webhooks>, ov: &Overseer, tenant: &str) -> Res<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let count = watch::channel(0usize).0;
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(Arc::new(Rx {
                seen: seen.clone(),
                count: count.clone(),
            }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        webhooks
            .register(
                tenant,
                NewEndpoint {
                    url,
                    ..NewEndpoint::default()
                },
            )
            .await?;
        let (stop, stopped) = watch::channel(false);
        let task = Some(webhooks.start(ov, stopped));
        Ok(Self {
            seen,
            count,
            stop,
            task,
            server,
            webhooks,
        })
    }

    /// Waits until `n` deliveries arrived (at most `patience`); returns how
    /// many did and their latencies.
    pub async fn wait(&self, n: usize, patience: Duration) -> (usize, Vec<Duration>) {
        let mut rx = self.count.subscribe();
        let _ = tokio::time::timeout(patience, rx.wait_for(|c| *c >= n)).await;
        let got = *self.count.borrow();
        let latencies = self
            .seen
            .lock()
            .map(|s| s.latencies.clone())
            .unwrap_or_default();
        (got, latencies)
    }

    /// Stops the delivery task and the receiver.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.server.abort();
        drop(self.webhooks);
    }
}
