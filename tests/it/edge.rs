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

use crate::common;

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

    let resp = common::answer(s.get("/v1/sessions", &t)).await?;
    assert_eq!(resp.status, 503);
    assert_eq!(resp.retry_after(), Some(1));
    let v = resp.body;
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

/// Where the disk failure happened: a path no caller should see (nor the
/// OS error under it).
const IO_CONTEXT: &str = "writing /srv/overseer/secret-dir/db";

/// An in-memory store that fails writes, listings and its health check
/// while `broken` is set, with a full disk's OS error as the cause.
struct FailingStore {
    inner: MemStore,
    broken: AtomicBool,
}

impl FailingStore {
    fn fail(&self) -> Result<(), StoreError> {
        if self.broken.load(Ordering::SeqCst) {
            Err(StoreError::io(
                IO_CONTEXT,
                std::io::Error::from_raw_os_error(28),
            ))
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
        self.fail()?;
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
    // A read that fails is the server's fault: 500, never a 400.
    let v = expect_error(s.get("/v1/sessions", &t), 500, "internal").await?;
    assert_eq!(
        v["error"]["message"],
        "internal storage error; the request was not applied"
    );
    hides(&v);

    // Space returns: ready again.
    store.broken.store(false, Ordering::SeqCst);
    let (status, _) = send(s.client.get(s.url("/readyz"))).await?;
    assert_eq!(status, 200);
    s.stop().await
}

// ---- issue 32 item 8: bodies, Retry-After, echoes, HTTP/2 -------------------------------------

/// Every POST validates its body as the README says: `interrupt`, `cancel`
/// and `done` take no parameters (no body, or `{}`), and refuse anything
/// else instead of ignoring it; the routes with parameters refuse a body
/// that is not JSON (415) or not well-formed (400). A refused request
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_post_validates_its_body_the_parameterless_ones_included() -> TestResult {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;
    let raw = |path: &str, content_type: Option<&str>, body: &'static str| {
        let mut request = s.client.post(s.url(path)).bearer_auth(&t).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        request
    };
    for action in ["interrupt", "cancel", "done"] {
        let path = format!("/v1/sessions/{id}/{action}");
        for (content_type, body, status, code) in [
            (Some("application/json"), "garbage", 400, "malformed_json"),
            (
                Some("application/json"),
                "{\"force\": true}",
                400,
                "invalid_body",
            ),
            (Some("application/json"), "[]", 400, "invalid_body"),
            (Some("application/json"), "null", 400, "invalid_body"),
            (
                Some("text/plain"),
                "stop now",
                415,
                "unsupported_media_type",
            ),
            (None, "stop now", 415, "unsupported_media_type"),
        ] {
            let v = expect_error(raw(&path, content_type, body), status, code).await?;
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{action} {body:?}: {v}"
            );
        }
        let v = expect_error(
            raw(&path, Some("application/json"), "{\"force\": true}"),
            400,
            "invalid_body",
        )
        .await?;
        assert!(
            v["error"]["message"].as_str().unwrap().contains("`force`"),
            "the message names the field: {v}"
        );
    }
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    assert_eq!(
        state["status"], "pending",
        "a refused request changed the session"
    );

    // No body, or `{}`, is accepted.
    let (status, v) = send(raw(&format!("/v1/sessions/{id}/interrupt"), None, "")).await?;
    assert_eq!(status, 200, "{v}");
    let (status, v) = send(raw(
        &format!("/v1/sessions/{id}/interrupt"),
        Some("application/json"),
        "{}",
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    let (status, v) = send(raw(
        &format!("/v1/sessions/{id}/cancel"),
        Some("application/json"),
        " {} ",
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "cancelled");

    // The routes with parameters.
    let other = s.create(&t, "chat", None).await?;
    for path in [
        "/v1/sessions".to_owned(),
        format!("/v1/sessions/{other}/messages"),
        format!("/v1/sessions/{other}/approvals"),
        format!("/v1/sessions/{other}/model"),
        format!("/v1/sessions/{other}/rules"),
    ] {
        expect_error(
            raw(&path, Some("text/plain"), "hello"),
            415,
            "unsupported_media_type",
        )
        .await?;
        expect_error(
            raw(&path, Some("application/json"), "{"),
            400,
            "malformed_json",
        )
        .await?;
    }
    s.stop().await
}

/// Every 429 says when to come back, as every 503 does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_429_with_retry_after() -> TestResult {
    let s = Server::start_with_runtime(overseer_actors::RuntimeConfig {
        limits: overseer_actors::Limits {
            max_queued_messages: 1,
            ..overseer_actors::Limits::default()
        },
        ..overseer_actors::RuntimeConfig::default()
    })
    .await?;
    let t = token("acme", "alice", ALL);
    let (id, _call) = s.create_pending(&t).await?;
    let path = format!("/v1/sessions/{id}/messages");
    let (status, v) = send(s.post(&path, &t, &json!({"text": "queued"}))).await?;
    assert_eq!(status, 202, "{v}");
    let resp = s
        .post(&path, &t, &json!({"text": "one too many"}))
        .send()
        .await?;
    assert_eq!(resp.status(), 429);
    let retry_after = resp
        .headers()
        .get("retry-after")
        .context("a 429 without Retry-After")?
        .to_str()?
        .parse::<u64>()?;
    assert!(retry_after >= 1);
    let v: Value = resp.json().await?;
    assert_eq!(v["error"]["code"], "queue_full", "{v}");
    s.stop().await
}

/// A client's string echoed in an error (an id, a cursor, a name, a key, a
/// value serde could not take) is cut to 200 characters, saying how long it
/// was: an error never ships a client's megabyte back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_strings_echoed_in_errors_are_cut_to_200_characters() -> TestResult {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;
    let long = |n: usize| "x".repeat(n);
    // At most 200 of the client's characters in a row, and the count.
    let check = |what: &str, v: &Value, total: usize| {
        let text = v.to_string();
        assert!(
            !text.contains(&long(201)),
            "{what}: more than 200 characters echoed: {text}"
        );
        assert!(
            text.contains(&format!("({total} characters)")),
            "{what}: does not say how long the string was: {text}"
        );
    };
    let v = expect_error(
        s.get(&format!("/v1/sessions/{}", long(5000)), &t),
        400,
        "invalid_id",
    )
    .await?;
    check("a session id", &v, 5000);
    let v = expect_error(
        s.get(&format!("/v1/approvals?cursor={}", long(6000)), &t),
        400,
        "invalid_query",
    )
    .await?;
    check("an inbox cursor", &v, 6000);
    let v = expect_error(
        s.post("/v1/sessions", &t, &json!({"agent": long(100_000)})),
        400,
        "unknown_agent",
    )
    .await?;
    check("an agent name", &v, 100_000);
    let v = expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "model": long(50_000)}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    check("a model route", &v, 50_000);
    let v = expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "max_steps": long(70_000)}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    check("a value of the wrong type", &v, 70_000);
    let v = expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", long(30_000): 1}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    check("an unknown field", &v, 30_000);
    let decisions: serde_json::Map<String, Value> = (0..100)
        .map(|n| (format!("{n}{}", long(1000)), json!({"decision": "approve"})))
        .collect();
    let v = expect_error(
        s.post(
            &format!("/v1/sessions/{id}/approvals"),
            &t,
            &json!({"decisions": decisions}),
        ),
        400,
        "unknown_calls",
    )
    .await?;
    check("unknown call ids", &v, 1001);
    assert!(
        v["error"]["details"]["call_ids"].as_array().unwrap().len() <= 50,
        "{v}"
    );
    assert!(v.to_string().len() < 64 * 1024, "{v}");
    s.stop().await
}

/// A client that opens with HTTP/2's preface (prior knowledge) gets one
/// clear answer in HTTP/2: the server's SETTINGS, then GOAWAY with
/// HTTP_1_1_REQUIRED and a sentence; HTTP/1.1 goes on as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http2_prior_knowledge_client_is_told_to_use_http_1_1() -> TestResult {
    let s = Server::start().await?;
    let mut c = connect(&s).await?;
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    // The client's own SETTINGS frame (empty).
    c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?;
    let answer = read_to_close(&mut c).await?;
    let mut frames = Vec::new();
    let mut rest = &answer[..];
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, stream) = (
            rest[3],
            u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]),
        );
        let payload = rest.get(9..9 + len).context("a truncated frame")?;
        frames.push((kind, stream, payload.to_vec()));
        rest = &rest[9 + len..];
    }
    assert!(rest.is_empty(), "trailing bytes: {answer:?}");
    let kinds: Vec<u8> = frames.iter().map(|f| f.0).collect();
    assert_eq!(kinds, [4, 7], "SETTINGS then GOAWAY: {answer:?}");
    let goaway = &frames[1].2;
    assert_eq!(frames[1].1, 0, "GOAWAY is on stream 0");
    assert_eq!(&goaway[0..4], &[0, 0, 0, 0], "no stream was processed");
    assert_eq!(
        u32::from_be_bytes([goaway[4], goaway[5], goaway[6], goaway[7]]),
        0xd
    );
    let debug = String::from_utf8_lossy(&goaway[8..]);
    assert!(debug.contains("HTTP/1.1"), "{debug}");

    drop(c);
    let (status, _) = send(s.client.get(s.url("/healthz"))).await?;
    assert_eq!(status, 200);
    s.stop().await
}
