//! The HTTP edge under hostile and heavy use, over a real loopback socket:
//! clients that never finish their headers or their body, more connections
//! than the cap, more requests than the in-flight limit, requests hyper
//! refuses on its own (too long, too large, malformed), and a failing store
//! whose error texts must not reach callers.
//!
//! Raw TCP is used wherever a well-behaved client library would not do what
//! the test needs (stop half-way through a head, send garbage). Every wait
//! is bounded by `PATIENCE` and fails with a message; the one short window
//! (a queued connection stays unanswered while the cap is full) can only
//! pass spuriously, never fail spuriously.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use common::{expect_error, send, token, Server, Sse, ALL, PATIENCE};
use overseer::http::HttpOptions;
use overseer_actors::model::{Event, SessionHeader, SessionId, SessionStatus};
use overseer_actors::store::{
    Checkpoint, CheckpointStore, MemStore, SessionSummary, StoreError, StoredSession,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type TestResult = anyhow::Result<()>;

fn options(edit: impl FnOnce(&mut overseer::http::HttpLimits)) -> HttpOptions {
    let mut options = HttpOptions::default();
    edit(&mut options.limits);
    options
}

async fn connect(s: &Server) -> anyhow::Result<TcpStream> {
    Ok(TcpStream::connect(s.base.trim_start_matches("http://")).await?)
}

/// Reads until the server closes the connection (a reset counts as closed).
async fn read_to_close(stream: &mut TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => return,
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .context("the server never closed the connection")?;
    Ok(out)
}

/// Reads one response head and its `content-length` body.
async fn read_response(stream: &mut TcpStream) -> anyhow::Result<(u16, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    let body = buf[end + 4..end + 4 + length].to_vec();
                    buf.drain(..end + 4 + length);
                    return Ok((head, body));
                }
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                bail!(
                    "connection closed before a whole response: {:?}",
                    String::from_utf8_lossy(&buf)
                );
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let (head, body) = tokio::time::timeout(PATIENCE, read)
        .await
        .context("no response")??;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    Ok((status, head, body))
}

fn error_code(body: &[u8]) -> anyhow::Result<String> {
    let v: Value = serde_json::from_slice(body)
        .with_context(|| format!("non-JSON body: {:?}", String::from_utf8_lossy(body)))?;
    if !v["error"]["message"].is_string() {
        bail!("not the error shape: {v}");
    }
    Ok(v["error"]["code"].as_str().context("code")?.to_owned())
}

// ---- slow and half-open clients ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_whose_head_never_finishes_is_closed_after_the_header_timeout() -> TestResult {
    let s = Server::start_with(
        common::hs256(),
        options(|l| l.header_read_timeout = Duration::from_secs(1)),
    )
    .await?;
    let mut half = connect(&s).await?;
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: overseer\r\nX-Slow: ")
        .await?;
    let answer = read_to_close(&mut half).await?;
    assert!(
        answer.is_empty(),
        "there is no request to answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    // Whoever finishes their head is served as usual.
    let (status, v) = send(s.client.get(s.url("/healthz"))).await?;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_the_connection_cap_new_connections_wait_until_one_closes() -> TestResult {
    // Stalled connections are held by the test itself here (long timeout).
    let s = Server::start_with(
        common::hs256(),
        options(|l| {
            l.max_connections = 2;
            l.header_read_timeout = Duration::from_secs(600);
        }),
    )
    .await?;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut c = connect(&s).await?;
        c.write_all(b"GET /healthz HTTP/1.1\r\n").await?;
        stalled.push(c);
    }
    let mut queued = connect(&s).await?;
    queued
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: overseer\r\nConnection: close\r\n\r\n")
        .await?;
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), queued.read(&mut byte)).await;
    assert!(
        early.is_err(),
        "a connection past the cap must wait, but it was answered: {early:?}"
    );
    // One stalled client goes away: its slot serves the queued connection.
    drop(stalled.pop());
    let (status, _, body) = read_response(&mut queued).await?;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    drop(stalled);
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_connections_at_the_cap_time_out_and_healthz_answers() -> TestResult {
    let s = Server::start_with(
        common::hs256(),
        options(|l| {
            l.max_connections = 2;
            l.header_read_timeout = Duration::from_secs(1);
        }),
    )
    .await?;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut c = connect(&s).await?;
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: over").await?;
        stalled.push(c);
    }
    let (status, v) = tokio::time::timeout(PATIENCE, send(s.client.get(s.url("/healthz"))))
        .await
        .context("/healthz never answered behind the stalled connections")??;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    for mut c in stalled {
        let answer = read_to_close(&mut c).await?;
        assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
    }
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_does_not_arrive_in_time_is_a_408_in_the_error_shape() -> TestResult {
    let s = Server::start_with(
        common::hs256(),
        options(|l| l.request_body_timeout = Duration::from_secs(1)),
    )
    .await?;
    let t = token("acme", "alice", ALL);
    let mut c = connect(&s).await?;
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: overseer\r\nAuthorization: Bearer {t}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"agent\":"
    );
    c.write_all(head.as_bytes()).await?;
    let (status, _, body) = read_response(&mut c).await?;
    assert_eq!(status, 408);
    assert_eq!(error_code(&body)?, "request_timeout");
    s.stop().await
}

// ---- admission control ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_in_flight_limit_requests_get_503_overloaded_with_retry_after() -> TestResult {
    let s = Server::start_with(common::hs256(), options(|l| l.max_in_flight_requests = 1)).await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;

    // An open event stream holds no slot once it has started.
    let _events = Sse::open(&s, &t, &id, None).await?;
    let (status, v) = send(s.get("/v1/sessions", &t)).await?;
    assert_eq!(status, 200, "{v}");

    // A request whose body is still coming holds the only slot. The server
    // asks for the body (100 Continue) only once it has admitted it.
    let mut slow = connect(&s).await?;
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: overseer\r\nAuthorization: Bearer {t}\r\nContent-Type: application/json\r\nContent-Length: 16\r\nExpect: 100-continue\r\n\r\n"
    );
    slow.write_all(head.as_bytes()).await?;
    let (status, _, _) = read_response(&mut slow).await?;
    assert_eq!(status, 100, "the server admitted the request");

    let resp = s.get("/v1/sessions", &t).send().await?;
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let v: Value = resp.json().await?;
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    // The liveness probe is never refused.
    let (status, _) = send(s.client.get(s.url("/healthz"))).await?;
    assert_eq!(status, 200);

    // The slow request finishes; its slot is free again.
    slow.write_all(br#"{"agent":"chat"}"#).await?;
    let (status, _, body) = read_response(&mut slow).await?;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let (status, v) = send(s.get("/v1/sessions", &t)).await?;
    assert_eq!(status, 200, "{v}");
    s.stop().await
}

// ---- every error in the error shape ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn too_long_too_large_and_malformed_requests_answer_json() -> TestResult {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);

    let long = format!("/v1/sessions?cursor={}", "a".repeat(9 * 1024));
    expect_error(s.get(&long, &t), 414, "uri_too_long").await?;

    // A head over 32 KiB (within what hyper buffers, so it reads it whole).
    let big = "b".repeat(34 * 1024);
    expect_error(
        s.get("/v1/sessions", &t).header("x-big", big),
        431,
        "headers_too_large",
    )
    .await?;
    // More than 100 header fields.
    let mut many = s.get("/v1/sessions", &t);
    for i in 0..120 {
        many = many.header(format!("x-h{i}"), "v");
    }
    expect_error(many, 431, "headers_too_large").await?;

    // A request line hyper cannot parse.
    let mut c = connect(&s).await?;
    c.write_all(b"GET /\x01bad HTTP/1.1\r\nHost: overseer\r\n\r\n")
        .await?;
    let (status, head, body) = read_response(&mut c).await?;
    assert_eq!(status, 400, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert_eq!(error_code(&body)?, "malformed_request");

    // Unknown methods and routes, one after the other on a kept-alive
    // connection.
    let mut c = connect(&s).await?;
    c.write_all(b"PUT /v1/sessions HTTP/1.1\r\nHost: overseer\r\n\r\n")
        .await?;
    let (status, _, body) = read_response(&mut c).await?;
    assert_eq!(
        (status, error_code(&body)?.as_str()),
        (405, "method_not_allowed")
    );
    c.write_all(b"GET /nowhere HTTP/1.1\r\nHost: overseer\r\n\r\n")
        .await?;
    let (status, _, body) = read_response(&mut c).await?;
    assert_eq!((status, error_code(&body)?.as_str()), (404, "not_found"));
    s.stop().await
}

// ---- failing stores: stable answers, details in the log ----------------------------------------

/// What a disk failure's text looks like: an OS error and a path, neither of
/// which a caller should see.
const IO_DETAIL: &str = "No space left on device (os error 28) in /srv/overseer/secret-dir/db";

/// An in-memory store that fails writes while `broken` is set.
struct FailingStore {
    inner: MemStore,
    broken: AtomicBool,
}

impl FailingStore {
    fn fail(&self) -> Result<(), StoreError> {
        if self.broken.load(Ordering::SeqCst) {
            Err(StoreError::Io(IO_DETAIL.into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl CheckpointStore for FailingStore {
    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        self.fail()?;
        self.inner.checkpoint(checkpoint).await
    }
    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        self.inner.load(id).await
    }
    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.inner.load_header(id).await
    }
    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_after(id, after, limit).await
    }
    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_by_status(statuses, after, limit).await
    }
    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_tenant(tenant, after, limit).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    async fn health_check(&self) -> Result<(), StoreError> {
        self.fail()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_failures_answer_stable_codes_without_io_details() -> TestResult {
    let store = Arc::new(FailingStore {
        inner: MemStore::new(),
        broken: AtomicBool::new(false),
    });
    let s = Server::start_on_store(
        tempfile::tempdir()?,
        store.clone(),
        common::hs256(),
        HttpOptions::default(),
    )
    .await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;

    store.broken.store(true, Ordering::SeqCst);
    let hides = |v: &Value| {
        let text = v.to_string();
        assert!(
            !text.contains("os error") && !text.contains("secret-dir"),
            "I/O details leaked: {text}"
        );
    };
    // The unauthenticated readiness probe.
    let v = expect_error(s.client.get(s.url("/readyz")), 503, "store_unavailable").await?;
    hides(&v);
    // A message whose checkpoint fails.
    let resp = s
        .post(
            &format!("/v1/sessions/{id}/messages"),
            &t,
            &json!({"text": "hello"}),
        )
        .send()
        .await?;
    let status = resp.status().as_u16();
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await?;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{v}"
    );
    assert_eq!(
        v["error"]["message"],
        format!("session {id} is temporarily unavailable; retry shortly")
    );
    hides(&v);

    // Space returns: ready again.
    store.broken.store(false, Ordering::SeqCst);
    let (status, _) = send(s.client.get(s.url("/readyz"))).await?;
    assert_eq!(status, 200);
    s.stop().await
}
