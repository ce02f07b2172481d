//! The delivery task: one per node, beside the actor tree, never on a
//! session's path.
//!
//! It loops: take a batch of the fresh deliveries committed events owe
//! ([`WebhookStore::intake`]: nothing is written for them until their first
//! outcome, so a delivery that succeeds at once costs the store a log
//! entry, saved with the others of its round),
//! claim the retries that are due (in a cluster, with a lease so that two
//! nodes do not send the same one at once, and a dead node's claim runs
//! out), fill the free slots of `concurrency` with the retries first and
//! the fresh ones after, and send each on a task of its own. Deliveries
//! waiting for a slot or in flight are not taken again. An attempt builds the body if
//! it has none yet (`payload`; stored with the attempt's outcome, so every
//! retry sends the same bytes), signs it (Standard Webhooks headers, the
//! `webhook-id` of its seed) and POSTs it. A 2xx is delivered. Anything else
//! is retried with exponential backoff and jitter (`crate::backoff`;
//! `Retry-After` is honoured), the last attempt at `max_age` after the
//! event; past that, or past `max_attempts`, or on `410 Gone`, the delivery
//! fails and its endpoint is disabled with the reason recorded.
//!
//! When not paced, it sleeps until the earliest of: a checkpoint owed
//! deliveries (the store says so through [`Subscriptions::written`]), an
//! attempt finished, the next delivery is due, or [`SWEEP`] passed (rows
//! another node wrote, a claim that ran out). Time comes from a [`Clock`], so tests can move it
//! by hours ([`ManualClock`]) instead of waiting.
//!
//! It yields to sessions. It runs on a thread of its own with a runtime of
//! its own, at the lowest CPU priority (nice 19; its store calls' blocking
//! threads inherit it), so the scheduler gives the cores to turns first.
//! And while checkpoints owe deliveries (their sessions are busy:
//! [`Subscriptions::busy`]), it paces itself ([`PACE`]): a few are
//! taken in (a store flush) at most once a second, attempts start at most
//! `batch` per `tick`, a trickle that keeps the oldest moving, and the
//! gauges (which scan the store) wait; once the burst is over, the backlog
//! drains at full concurrency in batches of [`INTAKE_BATCH`]. A burst's
//! deliveries are therefore late by up to the burst's length plus the
//! drain, never lost (they wait in the store).
//!
//! Memory is bounded: `concurrency` attempts in flight and their bodies;
//! everything else waits in the store.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use overseer_actors::store::StoreError;
use overseer_actors::WeakOverseer;
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use tokio::sync::{watch, OnceCell};
use tokio::task::JoinSet;

use super::payload::Unbuildable;
use super::signing::{sign, Secret};
use super::{
    metrics, payload, Claim, Delivery, DeliveryKey, DeliveryStatus, Disabled, Endpoint, Outcome,
    WebhookOptions, Webhooks,
};
use crate::backoff::Backoff;
use crate::tools::http_tool::transport_message;

/// The longest the task sleeps without looking at the store.
pub const SWEEP: Duration = Duration::from_secs(2);

/// How deliveries keep out of the way of busy sessions.
struct Pace {
    /// Sessions whose events go out count as busy until their checkpoints
    /// have owed no delivery for this long.
    quiet: Duration,
    /// While busy, attempts start at most once per `tick`…
    tick: Duration,
    /// …at most `batch` at a time (so `batch / tick` a second: a trickle
    /// that keeps the oldest moving, not the backlog).
    batch: usize,
    /// While busy, rows are taken in (which flushes the store) at most this
    /// often…
    intake_every: Duration,
    /// …at most this many at a time.
    intake_batch: usize,
}

const PACE: Pace = Pace {
    quiet: Duration::from_millis(300),
    tick: Duration::from_millis(250),
    batch: 8,
    intake_every: Duration::from_secs(1),
    intake_batch: 32,
};
/// Outbox rows taken in at once when sessions are not busy: enough that
/// the flush each intake costs is shared by many deliveries, few enough
/// that the claims waiting in memory stay small.
const INTAKE_BATCH: usize = 1024;
/// How long it waits after the store failed before trying again.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// Wall-clock time for the delivery schedule.
pub trait Clock: Send + Sync + 'static {
    /// Now, ms since the epoch.
    fn now_ms(&self) -> i64;
    /// Resolves once [`Clock::now_ms`] has reached `at_ms`.
    fn sleep_until(&self, at_ms: i64) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_ms()
    }

    fn sleep_until(&self, at_ms: i64) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let wait = u64::try_from(at_ms.saturating_sub(system_ms())).unwrap_or(0);
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

fn system_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A clock that moves only when told (tests: a day of retries without
/// waiting a day).
#[derive(Debug)]
pub struct ManualClock {
    now: watch::Sender<i64>,
}

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            now: watch::channel(start_ms).0,
        })
    }

    /// Moves the clock to `at_ms` (never backwards).
    pub fn set(&self, at_ms: i64) {
        self.now.send_modify(|now| *now = (*now).max(at_ms));
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now.send_modify(|now| *now = now.saturating_add(by));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.now.borrow()
    }

    fn sleep_until(&self, at_ms: i64) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            while *rx.borrow_and_update() < at_ms {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// Starts the task on a thread of its own, at the lowest CPU priority,
/// with a runtime of its own: its sends, body builds and store calls (the
/// store's blocking work is spawned from that thread, so its threads
/// inherit the priority) take the CPU only when turns leave it. The handle
/// resolves once the thread has stopped.
pub(super) fn start(
    hooks: Arc<Webhooks>,
    runtime: WeakOverseer,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("overseer-webhooks".into())
        .spawn(move || {
            lower_priority();
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("overseer-webhooks-io")
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "webhooks: cannot start the delivery runtime; no webhook is delivered");
                    return;
                }
            };
            rt.block_on(async move {
                let client = match client(&hooks.options) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %e, "webhooks: cannot build the HTTP client; no webhook is delivered");
                        return;
                    }
                };
                run(hooks, runtime, client, shutdown).await;
            });
            // Attempts still in flight are dropped with the runtime (their
            // deliveries stay pending); store calls under way finish first.
            rt.shutdown_timeout(SHUTDOWN_WAIT);
            let _ = done.send(());
        });
    tokio::spawn(async move {
        match thread {
            Ok(_) => {
                let _ = stopped.await;
            }
            Err(e) => {
                tracing::error!(error = %e, "webhooks: cannot start the delivery thread; no webhook is delivered");
            }
        }
    })
}

/// How long a stopping delivery thread waits for store calls under way.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Lowers the calling thread to the lowest CPU priority (nice 19): Linux
/// keeps a nice value per thread, and threads it starts inherit it.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers; the
    // target is the calling thread itself.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
    };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "webhooks: cannot lower the delivery thread's priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

fn client(options: &WebhookOptions) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a bundled crypto provider; installing it
    // twice is a harmless no-op.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::builder()
        .dns_resolver(options.targets.resolver())
        // A 3xx is a failed attempt: endpoints are registered where they are.
        .redirect(reqwest::redirect::Policy::none())
        // A proxy from the environment would take deliveries past the
        // address rules.
        .no_proxy()
        .connect_timeout(options.request_timeout.min(Duration::from_secs(10)))
        // Keep-alive connections, as many as attempts run at once: a burst
        // reuses them instead of connecting per delivery.
        .pool_max_idle_per_host(options.concurrency.max(1))
        .timeout(options.request_timeout)
        .user_agent(concat!("overseer-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// How long a claim keeps other nodes off a delivery: an attempt cannot
/// take longer than the request timeout plus building the body.
fn lease(options: &WebhookOptions) -> Duration {
    options.request_timeout * 2 + Duration::from_secs(5)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Bodies being built, by `webhook-id`: the deliveries of one event to
/// several endpoints share one build. An entry lives while an attempt that
/// may use it is in flight, so the map is bounded by `concurrency`.
type Bodies = Arc<Mutex<HashMap<String, Arc<OnceCell<String>>>>>;

async fn run(
    hooks: Arc<Webhooks>,
    runtime: WeakOverseer,
    client: reqwest::Client,
    mut shutdown: watch::Receiver<bool>,
) {
    let options = hooks.options.clone();
    let store = hooks.store.clone();
    let clock = hooks.clock.clone();
    let concurrency = options.concurrency.max(1);
    let mut tasks: JoinSet<Option<Outcome>> = JoinSet::new();
    let mut busy: HashSet<DeliveryKey> = HashSet::new();
    let mut running: HashMap<tokio::task::Id, DeliveryKey> = HashMap::new();
    let bodies: Bodies = Arc::default();
    // Fresh deliveries taken in, waiting for a free slot (their
    // keys are in `busy`, so an intake does not take them again).
    let mut ready: VecDeque<Claim> = VecDeque::new();
    // Whether the store may hold fresh deliveries to take in: at start (what
    // a previous process left), after a checkpoint owed some, and at every
    // sweep; not merely because an attempt finished.
    let mut intake = true;
    let mut gauges_at: Option<Instant> = None;
    // While sessions are busy: when rows were last taken in and attempts
    // last started (see `Pace`).
    let mut intake_at: Option<Instant> = None;
    let mut round_at: Option<Instant> = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let now = clock.now_ms();
        let paced = hooks.subscriptions.busy(PACE.quiet);
        let mut trouble = false;
        // Rows are taken in once the previous intake's are all started.
        if intake
            && ready.is_empty()
            && (!paced || intake_at.is_none_or(|at| at.elapsed() >= PACE.intake_every))
        {
            let limit = if paced {
                PACE.intake_batch
            } else {
                INTAKE_BATCH
            };
            match store.intake(now, limit, &busy).await {
                // A full batch: more may wait behind it; fewer: none until
                // told.
                Ok(claims) => {
                    intake = claims.len() >= limit;
                    intake_at = Some(Instant::now());
                    for claim in claims {
                        busy.insert(claim.delivery.key());
                        ready.push_back(claim);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhooks: cannot take fresh deliveries in; retrying");
                    trouble = true;
                }
            }
        }
        // The gauges scan the store: not while sessions are busy.
        if !paced && gauges_at.is_none_or(|at| at.elapsed() >= SWEEP) {
            gauges_at = Some(Instant::now());
            refresh_gauges(&hooks).await;
        }
        let mut free = concurrency.saturating_sub(tasks.len());
        // The round's turn, while paced: at most `batch` attempts started
        // per `tick`.
        let held = paced && round_at.is_some_and(|at| at.elapsed() < PACE.tick);
        if paced {
            free = if held { 0 } else { free.min(PACE.batch) };
        }
        let mut more_due = false;
        let mut started: Vec<Claim> = Vec::new();
        if free > 0 && !trouble {
            // Retries that are due first (few, and the oldest), then fresh
            // ones.
            let lease_until = now.saturating_add(ms(lease(&options)));
            match store.claim_due(now, lease_until, free, &busy).await {
                Ok(due) => {
                    more_due = due.len() == free;
                    started.extend(due);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhooks: cannot read due deliveries; retrying");
                    trouble = true;
                }
            }
            while started.len() < free {
                let Some(claim) = ready.pop_front() else {
                    break;
                };
                started.push(claim);
            }
        }
        if !started.is_empty() {
            round_at = Some(Instant::now());
        }
        for claim in started {
            let key = claim.delivery.key();
            busy.insert(key.clone());
            let task = tasks.spawn(attempt(
                hooks.clone(),
                runtime.clone(),
                client.clone(),
                bodies.clone(),
                claim,
            ));
            running.insert(task.id(), key);
        }
        // When to look again for due deliveries: at once if a full claim
        // may have left some, else when the next one is due (not before a
        // slot is free), and at least every SWEEP. While paced: at the next
        // tick, whatever wakes.
        let mut wake_at = now.saturating_add(ms(SWEEP));
        if trouble {
            wake_at = now.saturating_add(ms(STORE_RETRY));
        } else if paced {
            wake_at = i64::MAX;
        } else if tasks.len() < concurrency {
            if more_due || !ready.is_empty() || intake {
                wake_at = now;
            } else if let Ok(Some(next)) = store.next_due(now).await {
                wake_at = wake_at.min(next.max(now));
            }
        }
        let sweep = tokio::time::sleep(SWEEP);
        let tick = tokio::time::sleep(if paced { PACE.tick } else { SWEEP });
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                // Every attempt that has finished by now is recorded in one
                // write: under a burst that is one store write per batch of
                // attempts, not one per attempt.
                let mut finished = vec![done];
                while let Some(more) = tasks.try_join_next_with_id() {
                    finished.push(more);
                }
                let mut outcomes = Vec::with_capacity(finished.len());
                let mut keys = Vec::with_capacity(finished.len());
                for done in finished {
                    let id = match done {
                        Ok((id, outcome)) => {
                            outcomes.extend(outcome);
                            id
                        }
                        Err(e) => {
                            // Its delivery stays pending and is tried again
                            // once its claim runs out (sled: at once).
                            tracing::error!(error = %e, "webhooks: a delivery attempt panicked");
                            e.id()
                        }
                    };
                    keys.extend(running.remove(&id));
                }
                save(&hooks, &outcomes).await;
                if let Ok(mut bodies) = bodies.lock() {
                    for key in &keys {
                        bodies.remove(&key.1);
                    }
                }
                for key in &keys {
                    busy.remove(key);
                }
            }
            // While paced, rows written do not wake the task (a burst writes
            // thousands a second): the next tick takes them in.
            () = hooks.subscriptions.wait(), if !paced => intake = true,
            () = tick, if paced => intake = true,
            () = clock.sleep_until(wake_at), if !paced => {}
            // A clock that does not move (tests) must not stop the sweep
            // for rows other nodes wrote.
            () = sweep, if !trouble => intake = true,
        }
        if trouble {
            tokio::time::sleep(STORE_RETRY).await;
        }
    }
    // In-flight attempts are dropped: their deliveries stay pending and are
    // sent again (the same webhook-id) by the next node or start.
    tasks.abort_all();
}

/// Sets the gauges from the store (pending deliveries, disabled endpoints).
async fn refresh_gauges(hooks: &Webhooks) {
    let pending = hooks.store.pending_count().await;
    let endpoints = hooks.store.endpoints(None).await;
    if let (Ok(pending), Ok(endpoints)) = (pending, endpoints) {
        let disabled = endpoints.iter().filter(|e| e.disabled.is_some()).count();
        metrics::gauges(pending, disabled);
    }
}

/// Why an attempt did not deliver.
struct Failure {
    status: Option<StatusCode>,
    error: String,
    retry_after: Option<Duration>,
}

/// One attempt at a claimed delivery; its outcome, to be saved with the
/// others of its batch (`None`: nothing to record, it stays due).
async fn attempt(
    hooks: Arc<Webhooks>,
    runtime: WeakOverseer,
    client: reqwest::Client,
    bodies: Bodies,
    claim: Claim,
) -> Option<Outcome> {
    let Claim {
        mut delivery,
        endpoint,
        fresh,
    } = claim;
    let was_due_at = delivery.next_attempt_at_ms;
    let options = &hooks.options;
    let now = hooks.clock.now_ms();
    let endpoint = match endpoint {
        Some(e) if e.disabled.is_none() => e,
        other => {
            delivery.status = DeliveryStatus::Failed;
            delivery.last_error = Some(match other.and_then(|e| e.disabled) {
                Some(d) => format!("not sent: the endpoint is disabled ({})", d.reason),
                None => "not sent: the endpoint was deleted".into(),
            });
            metrics::failed();
            delivery.compact();
            return Some(Outcome {
                delivery,
                was_due_at,
                fresh,
            });
        }
    };
    if delivery.body.is_none() {
        let cell = match bodies.lock() {
            Ok(mut map) => map.entry(delivery.seed.id.clone()).or_default().clone(),
            Err(_) => Arc::new(OnceCell::new()),
        };
        let built = cell
            .get_or_try_init(|| async {
                match runtime.upgrade() {
                    Some(rt) => payload::build(&rt, &options.public_url, &delivery.seed).await,
                    // The runtime is gone (shutting down): tried again later.
                    None => Err(Unbuildable::Store(StoreError::Io("shutting down".into()))),
                }
            })
            .await;
        match built {
            Ok(body) => delivery.body = Some(body.clone()),
            Err(Unbuildable::Store(e)) => {
                tracing::debug!(error = %e, webhook = %delivery.seed.id, "webhooks: cannot build a body yet");
                return None;
            }
            Err(Unbuildable::Gone(reason)) => {
                // Its session was purged before the body was built: there
                // is nothing to send, now or later.
                tracing::info!(webhook = %delivery.seed.id, session = %delivery.seed.session_id, reason, "webhooks: delivery dropped, its session is gone");
                metrics::dropped(reason);
                delivery.status = DeliveryStatus::Failed;
                delivery.last_error = Some(format!(
                    "not sent: session {} is no longer stored ({reason})",
                    delivery.seed.session_id
                ));
                delivery.compact();
                return Some(Outcome {
                    delivery,
                    was_due_at,
                    fresh,
                });
            }
        }
    }
    let outcome = send(&client, options, &endpoint, &delivery, now).await;
    delivery.attempts = delivery.attempts.saturating_add(1);
    delivery.last_attempt_at_ms = Some(now);
    match outcome {
        Ok(status) => {
            delivery.status = DeliveryStatus::Delivered;
            delivery.delivered_at_ms = Some(now);
            delivery.last_status_code = Some(status.as_u16());
            delivery.last_error = None;
            metrics::delivered(system_ms().saturating_sub(delivery.seed.at_ms));
        }
        Err(failure) => {
            metrics::failed_attempt();
            delivery.last_status_code = failure.status.map(|s| s.as_u16());
            delivery.last_error = Some(failure.error.clone());
            let gone = failure.status == Some(StatusCode::GONE);
            let give_up_at = delivery.created_at_ms.saturating_add(ms(options.max_age));
            let delay =
                backoff(options, delivery.attempts).max(failure.retry_after.unwrap_or_default());
            let next = now
                .saturating_add(ms(delay.min(options.retry_max)))
                .min(give_up_at);
            let reason = if gone {
                Some(format!(
                    "it answered 410 Gone to webhook {} (Standard Webhooks: stop sending)",
                    delivery.seed.id
                ))
            } else if delivery.attempts >= options.max_attempts || next <= now {
                Some(format!(
                    "webhook {} failed {} attempts over {} s; last error: {}",
                    delivery.seed.id,
                    delivery.attempts,
                    now.saturating_sub(delivery.created_at_ms) / 1000,
                    failure.error
                ))
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    delivery.status = DeliveryStatus::Failed;
                    metrics::failed();
                    disable(&hooks, endpoint, reason, now).await;
                }
                None => delivery.next_attempt_at_ms = next,
            }
        }
    }
    delivery.compact();
    Some(Outcome {
        delivery,
        was_due_at,
        fresh,
    })
}

async fn save(hooks: &Webhooks, outcomes: &[Outcome]) {
    if outcomes.is_empty() {
        return;
    }
    if let Err(e) = hooks.store.save_deliveries(outcomes).await {
        // Not recorded: the deliveries are still due as they were, and are
        // tried again (at least once, the same webhook-id).
        tracing::warn!(error = %e, deliveries = outcomes.len(), "webhooks: cannot record delivery attempts");
    }
}

/// Disables `endpoint` with `reason`, in the store and in the view.
async fn disable(hooks: &Webhooks, mut endpoint: Endpoint, reason: String, now: i64) {
    tracing::warn!(endpoint = %endpoint.id, tenant = %endpoint.tenant, %reason, "webhooks: endpoint disabled");
    endpoint.disabled = Some(Disabled { at_ms: now, reason });
    hooks.subscriptions.put(&endpoint);
    if let Err(e) = hooks.store.put_endpoint(&endpoint).await {
        tracing::warn!(error = %e, endpoint = %endpoint.id, "webhooks: cannot record that an endpoint is disabled");
    }
}

/// The delay after `attempts` failed attempts: `retry_initial` × 2^(n-1),
/// plus up to as much again of jitter, at most `retry_max`.
pub(super) fn backoff(options: &WebhookOptions, attempts: u32) -> Duration {
    Backoff::new(options.retry_initial, options.retry_max).delay(attempts.saturating_sub(1))
}

/// One signed POST of the delivery's body.
async fn send(
    client: &reqwest::Client,
    options: &WebhookOptions,
    endpoint: &Endpoint,
    delivery: &Delivery,
    now_ms: i64,
) -> Result<StatusCode, Failure> {
    let failure = |error: String| Failure {
        status: None,
        error,
        retry_after: None,
    };
    let url = options
        .targets
        .check_before_sending(&endpoint.url)
        .map_err(|e| failure(format!("not sent: {e}")))?;
    let body = delivery.body.clone().unwrap_or_default();
    // The attempt's own time (what receivers compare with their clock to
    // refuse replays), not the schedule's.
    let timestamp = system_ms() / 1000;
    let id = delivery.seed.id.as_str();
    // During a rotation's grace period, one signature per secret,
    // space-separated: a receiver holding either verifies.
    let mut signature = String::new();
    for secret in endpoint.signing_secrets(now_ms) {
        let secret = Secret::parse(secret)
            .ok_or_else(|| failure("not sent: the endpoint's secret is unreadable".into()))?;
        if !signature.is_empty() {
            signature.push(' ');
        }
        signature.push_str(&sign(&secret, id, timestamp, body.as_bytes()));
    }
    let response = client
        .post(url)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| {
            failure(if e.is_timeout() {
                format!("no answer within {} s", options.request_timeout.as_secs())
            } else {
                transport_message(&e)
            })
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(status);
    }
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    Err(Failure {
        status: Some(status),
        error: format!("the endpoint answered {status}"),
        retry_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stays_under_the_cap() {
        let options = WebhookOptions {
            retry_initial: Duration::from_secs(5),
            retry_max: Duration::from_secs(3600),
            ..WebhookOptions::default()
        };
        for attempts in 1..=30u32 {
            let d = backoff(&options, attempts);
            let base = Duration::from_secs(5)
                .saturating_mul(1u32 << (attempts - 1).min(20))
                .min(Duration::from_secs(3600));
            assert!(
                d >= base && d <= (base * 2).min(Duration::from_secs(3600)),
                "{attempts}: {d:?} vs {base:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_manual_clock_wakes_sleepers_only_when_moved_past_their_time() {
        let clock = ManualClock::new(1_000);
        let sleeper = tokio::spawn(clock.sleep_until(5_000));
        clock.set(4_999);
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(1));
        sleeper.await.unwrap();
        assert_eq!(clock.now_ms(), 5_000);
    }
}
