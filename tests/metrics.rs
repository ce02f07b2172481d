//! Black-box tests of `GET /metrics` (§13) and of `/readyz`'s store check,
//! over a real loopback socket: the whole service (sled in a temp dir, the
//! scripted provider, a tool that needs approval) driven with reqwest, and
//! the Prometheus text parsed by a small parser here.
//!
//! The recorder is process-wide, so every metric assertion lives in this
//! file (its own test process) and in ONE test, which is the only one here
//! that creates sessions; the other tests touch no metric they could
//! disturb. Values that are settled by an actor stopping (a gauge moved
//! when an actor's state is dropped) are awaited by re-scraping, bounded by
//! the harness's patience; everything else is asserted exactly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use common::{expect_error, send, token, Server, Sse, ALL, OPS_USAGE, PATIENCE};
use overseer::http::{self, HttpOptions};
use overseer_actors::metrics as m;
use overseer_actors::model::{Event, SessionHeader, SessionId, SessionStatus};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::{
    Checkpoint, CheckpointStore, MemStore, SessionSummary, StoreError, StoredSession,
};
use overseer_actors::tool::ToolRegistry;
use overseer_actors::{Overseer, RuntimeConfig};
use serde_json::json;

type Result = anyhow::Result<()>;

// ---- a tiny parser of the Prometheus text format ---------------------------

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Scrape {
    /// `# TYPE` of each family.
    types: HashMap<String, String>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// Parses the text exposition format, failing on any line that is not a
    /// comment, a `# TYPE`/`# HELP` line or a sample `name{labels} value`.
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut out = Scrape::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                let mut words = rest.split_whitespace();
                if words.next() == Some("TYPE") {
                    let name = words.next().context("TYPE without a name")?;
                    let ty = words.next().context("TYPE without a type")?;
                    ensure!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty),
                        "line {n}: unknown type {ty}"
                    );
                    ensure!(valid_name(name), "line {n}: bad metric name {name}");
                    out.types.insert(name.to_owned(), ty.to_owned());
                }
                continue;
            }
            out.samples
                .push(parse_sample(line).with_context(|| format!("line {n}: {line}"))?);
        }
        for s in &out.samples {
            ensure!(
                out.types.contains_key(family(&s.name, &out.types)),
                "sample {} has no # TYPE",
                s.name
            );
        }
        Ok(out)
    }

    /// Samples named `name` carrying every label of `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum over the matching samples (0 when there are none: a series
    /// that was never touched).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn type_of(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The family a sample belongs to (`x_bucket` → `x` for a histogram `x`).
fn family<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.contains_key(base) {
                return base;
            }
        }
    }
    name
}

fn parse_sample(line: &str) -> anyhow::Result<Sample> {
    let name_end = line.find(['{', ' ']).context("no value")?;
    let name = &line[..name_end];
    ensure!(valid_name(name), "bad metric name {name:?}");
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(body) => parse_labels(body)?,
        None => (BTreeMap::new(), &line[name_end..]),
    };
    let mut fields = rest.split_whitespace();
    let raw = fields.next().context("no value")?;
    let value = match raw {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other
            .parse::<f64>()
            .with_context(|| format!("bad value {other:?}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().context("bad timestamp")?;
    }
    ensure!(fields.next().is_none(), "trailing fields");
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"}` (after the `{`): the labels and what follows the `}`.
fn parse_labels(mut rest: &str) -> anyhow::Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').context("label without '='")?;
        let key = &rest[..eq];
        ensure!(valid_name(key), "bad label name {key:?}");
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .context("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => bail!("dangling escape"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => bail!("unterminated label value"),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = &rest[close + 1..];
        ensure!(
            rest.starts_with(',') || rest.starts_with('}'),
            "expected ',' or '}}' after a label"
        );
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

#[test]
fn the_parser_reads_labels_escapes_and_types() -> Result {
    let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{k=\"v\",q=\"say \\\"hi\\\"\\n\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
    let s = Scrape::parse(text)?;
    assert_eq!(s.sum("a_total", &[("q", "say \"hi\"\n")]), 3.0);
    assert_eq!(s.sum("h_bucket", &[("le", "+Inf")]), 2.0);
    assert_eq!(s.type_of("h"), Some("histogram"));
    assert!(Scrape::parse("no_type 1\n").is_err());
    assert!(Scrape::parse("# TYPE x gauge\nx{k=v} 1\n").is_err());
    Ok(())
}

// ---- helpers ---------------------------------------------------------------

async fn scrape(s: &Server, token: &str) -> anyhow::Result<Scrape> {
    let resp = common::answer(s.get("/metrics", token)).await?;
    let status = resp.status;
    let ct = resp.header("content-type").unwrap_or_default().to_owned();
    let text = resp.text;
    ensure!(status == 200, "/metrics answered {status}: {text}");
    ensure!(
        ct.starts_with("text/plain; version=0.0.4"),
        "content-type {ct}"
    );
    Scrape::parse(&text)
}

/// Re-scrapes until `check` passes (for gauges an actor moves when it
/// stops, which happens just after the event a test can wait for).
async fn eventually(
    s: &Server,
    token: &str,
    what: &str,
    check: impl Fn(&Scrape) -> bool,
) -> anyhow::Result<Scrape> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let got = scrape(s, token).await?;
        if check(&got) {
            return Ok(got);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{what} never held; last scrape: {:?}", got.samples);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn live(s: &Scrape, status: &str) -> f64 {
    s.sum(m::LIVE_SESSIONS, &[("status", status)])
}

fn count(s: &Scrape, histogram: &str, labels: &[(&str, &str)]) -> f64 {
    s.sum(&format!("{histogram}_count"), labels)
}

// ---- the scenario ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_a_session_through_approval_restart_and_completion() -> Result {
    // Installed before any runtime starts (the gauges are deltas), and
    // idempotent: a second install hands back the same recorder.
    let handle = overseer::metrics::install_recorder()?;
    let again = overseer::metrics::install_recorder()?;
    assert!(again.render().contains(m::SESSION_RESTARTS_TOTAL));
    drop(handle);

    let s = Server::start().await?;
    let admin = token("acme", "ops-admin", &["admin"]);
    let alice = token("acme", "alice", ALL);

    // Access: a token is needed, and `admin` (not any scope) is.
    expect_error(s.client.get(s.url("/metrics")), 401, "unauthorized").await?;
    expect_error(s.get("/metrics", &alice), 403, "forbidden").await?;

    let base = scrape(&s, &admin).await?;
    // Families without labels are there from the start, at zero.
    for (family, ty) in [
        (m::RUNNING_TOOL_CALLS, "gauge"),
        (m::PENDING_APPROVALS, "gauge"),
        (m::CHECKPOINT_BYTES_TOTAL, "counter"),
        (m::SESSION_RESTARTS_TOTAL, "counter"),
        (m::SESSION_HIBERNATIONS_TOTAL, "counter"),
        (m::SESSION_ACTIVATIONS_TOTAL, "counter"),
    ] {
        assert_eq!(base.type_of(family), Some(ty), "{family}");
    }
    assert_eq!(base.sum(m::PENDING_APPROVALS, &[]), 0.0);
    assert_eq!(base.sum(m::RUNNING_TOOL_CALLS, &[]), 0.0);

    // A session parks on an approval.
    let (id, call) = s.create_pending(&alice).await?;
    let parked = scrape(&s, &admin).await?;
    assert_eq!(parked.sum(m::PENDING_APPROVALS, &[]), 1.0);
    assert_eq!(live(&parked, "awaiting_approval"), 1.0);
    assert_eq!(
        parked.sum(m::PROVIDER_REQUESTS_TOTAL, &[("outcome", "ok")]),
        1.0
    );
    assert_eq!(
        parked.sum(m::PROVIDER_TOKENS_TOTAL, &[("kind", "input")]),
        OPS_USAGE[0].0 as f64
    );
    assert_eq!(
        count(&parked, m::PROVIDER_FIRST_EVENT_SECONDS, &[]),
        1.0,
        "one first event per stream"
    );
    assert!(count(&parked, m::CHECKPOINT_SECONDS, &[]) >= 2.0);
    assert_eq!(parked.type_of(m::CHECKPOINT_SECONDS), Some("histogram"));

    // A restart: the session only waits for a decision, so recovery leaves
    // it on disk (no actor, not live) with its approval still pending,
    // counted once, not twice nor zero times; the decision activates it.
    let dir = s.stop_keep_data().await?;
    let s = Server::start_in(dir, common::hs256(), HttpOptions::default()).await?;
    let back = eventually(&s, &admin, "the old actor's gauge is gone", |sc| {
        live(sc, "awaiting_approval") == 0.0
    })
    .await?;
    assert_eq!(back.sum(m::SESSION_ACTIVATIONS_TOTAL, &[]), 0.0);
    assert_eq!(back.sum(m::PENDING_APPROVALS, &[]), 1.0);

    // Approve it, and follow it to the end of its turn.
    let mut events = Sse::open(&s, &alice, &id, None).await?;
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{id}/approvals"),
        &alice,
        &json!({"decisions": {&call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    let all = events.until_status("awaiting_input").await?;
    let stored: Vec<_> = all.iter().filter(|e| e.id.is_some()).collect();

    let done = eventually(&s, &admin, "the tool-call actor has stopped", |sc| {
        sc.sum(m::RUNNING_TOOL_CALLS, &[]) == 0.0
    })
    .await?;
    assert_eq!(done.sum(m::PENDING_APPROVALS, &[]), 0.0);
    assert_eq!(live(&done, "awaiting_approval"), 0.0);
    assert_eq!(live(&done, "awaiting_input"), 1.0);

    assert_eq!(
        count(&done, m::APPROVAL_WAIT_SECONDS, &[("outcome", "approved")]),
        1.0
    );
    assert_eq!(count(&done, m::APPROVAL_WAIT_SECONDS, &[]), 1.0);
    assert_eq!(
        count(
            &done,
            m::TOOL_DURATION_SECONDS,
            &[("tool", "write_record"), ("outcome", "ok")]
        ),
        1.0
    );
    assert_eq!(count(&done, m::TOOL_DURATION_SECONDS, &[]), 1.0);
    let inf = done.sum(
        &format!("{}_bucket", m::TOOL_DURATION_SECONDS),
        &[("tool", "write_record"), ("le", "+Inf")],
    );
    assert_eq!(inf, 1.0, "the +Inf bucket holds every observation");

    // Two provider streams, each with the usage its scenario step reports.
    assert_eq!(
        done.sum(m::PROVIDER_REQUESTS_TOTAL, &[("outcome", "ok")]),
        2.0
    );
    assert_eq!(done.sum(m::PROVIDER_REQUESTS_TOTAL, &[]), 2.0);
    assert_eq!(
        count(&done, m::PROVIDER_STREAM_SECONDS, &[("outcome", "ok")]),
        2.0
    );
    assert_eq!(count(&done, m::PROVIDER_FIRST_EVENT_SECONDS, &[]), 2.0);
    let (input, output) = OPS_USAGE
        .iter()
        .fold((0, 0), |(i, o), (di, dout)| (i + di, o + dout));
    assert_eq!(
        done.sum(m::PROVIDER_TOKENS_TOTAL, &[("kind", "input")]),
        input as f64
    );
    assert_eq!(
        done.sum(m::PROVIDER_TOKENS_TOTAL, &[("kind", "output")]),
        output as f64
    );

    // Checkpoints: at least one per transition driven (create, approval
    // requested, decision, tool finished, turn ended), and their bytes at
    // least the events they carried.
    assert!(
        count(&done, m::CHECKPOINT_SECONDS, &[]) >= 5.0,
        "{}",
        count(&done, m::CHECKPOINT_SECONDS, &[])
    );
    let event_bytes: usize = stored.iter().map(|e| e.data.to_string().len()).sum();
    assert!(
        done.sum(m::CHECKPOINT_BYTES_TOTAL, &[]) >= event_bytes as f64,
        "{} bytes checkpointed, {event_bytes} bytes of events",
        done.sum(m::CHECKPOINT_BYTES_TOTAL, &[])
    );
    assert_eq!(done.sum(m::CHECKPOINT_ERRORS_TOTAL, &[]), 0.0);

    assert_eq!(done.sum(m::SESSION_RESTARTS_TOTAL, &[]), 0.0);
    assert_eq!(done.sum(m::SESSION_HIBERNATIONS_TOTAL, &[]), 0.0);
    assert_eq!(done.sum(m::SESSION_ACTIVATIONS_TOTAL, &[]), 1.0);

    // `/readyz` checked the (sled) store with a real write.
    let (status, v) = send(s.client.get(s.url("/readyz"))).await?;
    assert_eq!((status, v["status"].as_str()), (200, Some("ready")));
    s.stop().await?;

    // `metrics_public` opens the route to a scraper without a token.
    let public = HttpOptions {
        metrics_public: true,
        ..HttpOptions::default()
    };
    let s = Server::start_with(common::hs256(), public).await?;
    let resp = common::answer(s.client.get(s.url("/metrics"))).await?;
    assert_eq!(resp.status, 200);
    s.stop().await
}

// ---- /readyz and a store that cannot write -----------------------------------

/// A [`MemStore`] whose disk is full.
#[derive(Clone, Default)]
struct FullDisk(MemStore);

#[async_trait::async_trait]
impl CheckpointStore for FullDisk {
    async fn checkpoint(&self, checkpoint: Checkpoint) -> std::result::Result<(), StoreError> {
        self.0.checkpoint(checkpoint).await
    }
    async fn load(&self, id: SessionId) -> std::result::Result<Option<StoredSession>, StoreError> {
        self.0.load(id).await
    }
    async fn load_header(
        &self,
        id: SessionId,
    ) -> std::result::Result<Option<SessionHeader>, StoreError> {
        self.0.load_header(id).await
    }
    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> std::result::Result<Vec<Event>, StoreError> {
        self.0.events_after(id, after, limit).await
    }
    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> std::result::Result<Vec<SessionSummary>, StoreError> {
        self.0.list_by_status(statuses, after, limit).await
    }
    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> std::result::Result<Vec<SessionSummary>, StoreError> {
        self.0.list_tenant(tenant, after, limit).await
    }
    async fn flush(&self) -> std::result::Result<(), StoreError> {
        self.0.flush().await
    }
    async fn health_check(&self) -> std::result::Result<(), StoreError> {
        Err(StoreError::Io("No space left on device".into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_when_the_store_cannot_write() -> Result {
    // reqwest is built without a default TLS provider (see tests/common).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let overseer = Overseer::start(
        Vec::new(),
        Arc::new(FullDisk::default()),
        Arc::new(ScriptedProvider::new(Scenario::from_json(
            r#"{"name": "empty", "agents": {}}"#,
        )?)),
        ToolRegistry::new(Vec::new())?,
        RuntimeConfig::default(),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/readyz", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(
        overseer.clone(),
        listener,
        overseer::auth::AuthConfig::None,
        async move {
            let _ = stopped.await;
        },
    ));
    let v = expect_error(reqwest::Client::new().get(&url), 503, "store_unavailable").await?;
    // The route is unauthenticated: it says what kind of problem it is
    // (issue 32: `/readyz` says why), the store's own error goes to the log.
    assert_eq!(v["error"]["details"]["reason"], "disk_full", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the disk is full"), "{v}");
    assert!(!message.contains("No space left on device"), "{v}");
    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, server).await???;
    overseer.shutdown().await?;
    Ok(())
}
