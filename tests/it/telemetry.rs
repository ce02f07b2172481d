//! Traces over OTLP and JSON logs (issue 30), with `overseer serve` as a
//! process and a test OTLP receiver: an HTTP server decoding the real OTLP
//! protobuf (`opentelemetry-proto`). It also stands in for an http tool, to
//! see the `traceparent` the tool is sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use serde_json::{json, Value};

use crate::common::served::{self, Served};

/// A span as received.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace: String,
    id: String,
    parent: String,
    links: Vec<String>,
    attrs: HashMap<String, String>,
}

/// A histogram data point as received (cumulative: later exports repeat
/// it with the totals so far).
#[derive(Debug, Clone)]
struct Point {
    name: String,
    unit: String,
    attrs: HashMap<String, String>,
    count: u64,
    sum: f64,
    bounds: Vec<f64>,
}

#[derive(Default)]
struct Seen {
    spans: Vec<Got>,
    /// Histogram points of every metrics export, in arrival order.
    points: Vec<Point>,
    /// Metric export requests received.
    metric_exports: usize,
    /// `traceparent` headers the stand-in tool received.
    tool_traceparents: Vec<String>,
    service: Option<String>,
}

struct Receiver {
    url: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn any(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

async fn receiver() -> Receiver {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let traces = seen.clone();
    let tool = seen.clone();
    let meters = seen.clone();
    let app = axum::Router::new()
        .route(
            "/v1/metrics",
            post(move |body: Bytes| {
                let seen = meters.clone();
                async move {
                    let req = ExportMetricsServiceRequest::decode(body).unwrap();
                    let mut seen = seen.lock().unwrap();
                    seen.metric_exports += 1;
                    for rm in req.resource_metrics {
                        for sm in rm.scope_metrics {
                            for m in sm.metrics {
                                let Some(Data::Histogram(h)) = m.data else {
                                    continue;
                                };
                                for p in h.data_points {
                                    seen.points.push(Point {
                                        name: m.name.clone(),
                                        unit: m.unit.clone(),
                                        attrs: p
                                            .attributes
                                            .iter()
                                            .map(|kv| (kv.key.clone(), any(&kv.value)))
                                            .collect(),
                                        count: p.count,
                                        sum: p.sum.unwrap_or_default(),
                                        bounds: p.explicit_bounds.clone(),
                                    });
                                }
                            }
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportMetricsServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        )
        .route(
            "/v1/traces",
            post(move |body: Bytes| {
                let seen = traces.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).unwrap();
                    let mut seen = seen.lock().unwrap();
                    for rs in req.resource_spans {
                        if let Some(r) = &rs.resource {
                            for kv in &r.attributes {
                                if kv.key == "service.name" {
                                    seen.service = Some(any(&kv.value));
                                }
                            }
                        }
                        for ss in rs.scope_spans {
                            for s in ss.spans {
                                seen.spans.push(Got {
                                    name: s.name.clone(),
                                    trace: hex(&s.trace_id),
                                    id: hex(&s.span_id),
                                    parent: hex(&s.parent_span_id),
                                    links: s.links.iter().map(|l| hex(&l.span_id)).collect(),
                                    attrs: s
                                        .attributes
                                        .iter()
                                        .map(|kv| (kv.key.clone(), any(&kv.value)))
                                        .collect(),
                                });
                            }
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        )
        .route(
            "/probe",
            post(move |headers: HeaderMap| {
                let seen = tool.clone();
                async move {
                    if let Some(tp) = headers.get("traceparent") {
                        seen.lock()
                            .unwrap()
                            .tool_traceparents
                            .push(tp.to_str().unwrap().to_owned());
                    }
                    axum::Json(json!({"probed": true}))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Receiver { url, seen, task }
}

/// `overseer serve` with `config`, extra environment for the process only.
fn serve(data: &Path, config: &Path, env: &[(&str, &str)]) -> Served {
    let mut cmd = served::command();
    cmd.arg("--data")
        .arg(data)
        .arg("--config")
        .arg(config)
        // Exports every 50 ms, so the spans of a process killed later have
        // left it (the receiver is polled, nothing is timed).
        .env("OTEL_BSP_SCHEDULE_DELAY", "50");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Served::start(cmd).unwrap()
}

const SCENARIO: &str = r#"{
  "name": "telemetry",
  "agents": {
    "lead": [
      { "text": "Delegating.", "tool_calls": [{ "name": "delegate_task", "arguments": { "agent": "worker", "goal": "Probe it." } }],
        "usage": { "input_tokens": 101, "output_tokens": 11 } },
      { "text": "Done: {{tool_result}}", "usage": { "input_tokens": 202, "output_tokens": 22 } }
    ],
    "worker": [
      { "text": "Probing.", "tool_calls": [{ "name": "probe", "arguments": {"what": "secret-argument"} }],
        "usage": { "input_tokens": 33, "output_tokens": 3 } },
      { "text": "Probed: {{tool_result}}", "usage": { "input_tokens": 44, "output_tokens": 4 } }
    ],
    "echo": [
      { "text": "One.", "usage": { "input_tokens": 7, "output_tokens": 1 } },
      { "text": "Two.", "usage": { "input_tokens": 8, "output_tokens": 2 } }
    ],
    "solo": [
      { "text": "Probing alone.", "tool_calls": [{ "name": "probe", "arguments": {"what": "secret-argument"} }],
        "usage": { "input_tokens": 55, "output_tokens": 5 } },
      { "text": "Probed: {{tool_result}}", "usage": { "input_tokens": 66, "output_tokens": 6 } }
    ]
  }
}"#;

fn write_config(dir: &Path, endpoint: &str, tool_url: &str, extra: &str) -> std::path::PathBuf {
    let scenario = dir.join("scenario.json");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let config = dir.join("overseer.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{scenario}"

[http]
auth = "none"
metrics_public = true

[telemetry]
otlp_endpoint = "{endpoint}"
service_name = "overseer-test"
{extra}

[[tools]]
name = "probe"
description = "Probes."
url = "{tool_url}/probe"
requires_approval = true

[[agents]]
name = "lead"
model = "scripted"
instructions = "Lead."
tools = ["probe"]
approval = "auto"
subagents = ["worker"]
child_approval = "propagate"

[[agents]]
name = "worker"
model = "scripted"
instructions = "Work."
tools = ["probe"]
approval = "always"

[[agents]]
name = "echo"
model = "scripted"
instructions = "Echo."
tools = []
approval = "auto"

[[agents]]
name = "solo"
model = "scripted"
instructions = "Solo."
tools = ["probe"]
approval = "always"
"#,
            scenario = scenario.display()
        ),
    )
    .unwrap();
    config
}

/// The shared helper: each answer is also held to the OpenAPI document.
async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    crate::common::send(req).await.unwrap()
}

/// Polls until `check` says yes (a bounded number of real queries).
async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    for _ in 0..1500 {
        if let Some(v) = check() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

async fn status_of(http: &reqwest::Client, url: &str, id: &str) -> String {
    let (_, v) = send(http.get(format!("{url}/v1/sessions/{id}"))).await;
    v["status"].as_str().unwrap_or("").to_owned()
}

async fn wait_status(http: &reqwest::Client, url: &str, id: &str, want: &str) {
    for _ in 0..1500 {
        if status_of(http, url, id).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("session {id} never reached {want}");
}

async fn approve_all(http: &reqwest::Client, url: &str, id: &str) {
    let calls = loop {
        let (_, v) = send(http.get(format!("{url}/v1/sessions/{id}/approvals"))).await;
        let calls: Vec<String> = v["pending"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["call_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if !calls.is_empty() {
            break calls;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let decisions: serde_json::Map<String, Value> = calls
        .iter()
        .map(|c| (c.clone(), json!({"decision": "approve"})))
        .collect();
    let (status, body) = send(
        http.post(format!("{url}/v1/sessions/{id}/approvals"))
            .json(&json!({ "decisions": decisions })),
    )
    .await;
    assert!(status < 300, "{status} {body}");
}

fn spans(r: &Receiver) -> Vec<Got> {
    r.seen.lock().unwrap().spans.clone()
}

fn one<'a>(spans: &'a [Got], name: &str) -> &'a Got {
    let found: Vec<&Got> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one '{name}' span: {spans:#?}");
    found[0]
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A delegation with an approval, started with the caller's `traceparent`:
/// one trace; invoke_agent, chat, execute_tool and the approval wait; the
/// child's turn under the parent's `delegate_task` span; the token counts
/// of the scripted provider; the http tool sent its span's `traceparent`;
/// no content recorded (off by default); JSON log lines carry the trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_with_an_approval_is_one_trace_under_the_callers_span() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let r = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &r.url, &r.url, "");
    std::fs::write(
        dir.path().join("log.toml"),
        std::fs::read_to_string(&config).unwrap() + "\n[log]\nformat = \"json\"\n",
    )
    .unwrap();
    let mut served = serve(&dir.path().join("data"), &dir.path().join("log.toml"), &[]);
    let http = reqwest::Client::new();
    let (status, created) = send(
        http.post(format!("{}/v1/sessions", served.url))
            .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
            .json(&json!({"agent": "lead", "prompt": "Go."})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    approve_all(&http, &served.url, &id).await;
    wait_status(&http, &served.url, &id, "awaiting_input").await;
    served.sigterm();

    let got = spans(&r);
    assert!(got.iter().all(|s| s.trace == CALLER_TRACE), "{got:#?}");
    let lead = one(&got, "invoke_agent lead");
    assert_eq!(
        lead.parent, CALLER_SPAN,
        "the caller's span is the root's parent"
    );
    assert_eq!(lead.attrs["gen_ai.agent.name"], "lead");
    assert_eq!(lead.attrs["gen_ai.conversation.id"], id);
    assert_eq!(lead.attrs["gen_ai.operation.name"], "invoke_agent");
    let delegate = one(&got, "execute_tool delegate_task");
    assert_eq!(delegate.parent, lead.id);
    let worker = one(&got, "invoke_agent worker");
    assert_eq!(
        worker.parent, delegate.id,
        "the child's turn is under the tool span"
    );
    let probe = one(&got, "execute_tool probe");
    assert_eq!(probe.parent, worker.id);
    assert_eq!(probe.attrs["gen_ai.tool.name"], "probe");
    assert!(probe.attrs["gen_ai.tool.call.id"].starts_with("call_"));
    assert_eq!(probe.attrs["overseer.tool.outcome"], "completed");
    let approval = one(&got, "approval probe");
    assert_eq!(approval.parent, worker.id);
    assert_eq!(approval.attrs["overseer.approval.decision"], "approved");
    assert!(approval.attrs.contains_key("overseer.approval.wait_ms"));
    // Chat spans: two per agent, with the scripted usage.
    let chats: Vec<&Got> = got.iter().filter(|s| s.name.starts_with("chat ")).collect();
    assert_eq!(chats.len(), 4, "{chats:#?}");
    let mut tokens: Vec<(String, String, String)> = chats
        .iter()
        .map(|c| {
            assert_eq!(c.attrs["gen_ai.operation.name"], "chat");
            assert_eq!(c.attrs["gen_ai.provider.name"], "scripted");
            assert!(c.attrs.contains_key("gen_ai.request.model"));
            assert!(c.attrs.contains_key("gen_ai.response.finish_reasons"));
            assert!(c.parent == lead.id || c.parent == worker.id);
            // Content is off by default.
            assert!(!c.attrs.contains_key("gen_ai.input.messages"));
            assert!(!c.attrs.contains_key("gen_ai.output.messages"));
            (
                if c.parent == lead.id {
                    "lead"
                } else {
                    "worker"
                }
                .to_owned(),
                c.attrs["gen_ai.usage.input_tokens"].clone(),
                c.attrs["gen_ai.usage.output_tokens"].clone(),
            )
        })
        .collect();
    tokens.sort();
    assert_eq!(
        tokens,
        [
            ("lead".into(), "101".into(), "11".into()),
            ("lead".into(), "202".into(), "22".into()),
            ("worker".into(), "33".into(), "3".into()),
            ("worker".into(), "44".into(), "4".into()),
        ]
    );
    assert!(!probe.attrs.contains_key("gen_ai.tool.call.arguments"));
    assert_eq!(
        r.seen.lock().unwrap().service.as_deref(),
        Some("overseer-test")
    );
    // The http tool was sent the `traceparent` of its execute_tool span.
    let sent = r.seen.lock().unwrap().tool_traceparents.clone();
    assert_eq!(sent, [format!("00-{CALLER_TRACE}-{}-01", probe.id)]);
    // JSON logs: every line of the log layer parses; the turn's end carries
    // the trace id.
    let logs = served.log.lock().unwrap().clone();
    let json: Vec<Value> = logs
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ended: Vec<&Value> = json
        .iter()
        .filter(|l| l["message"] == "turn ended")
        .collect();
    assert_eq!(ended.len(), 2, "{logs:#?}");
    for line in ended {
        assert_eq!(line["trace_id"], CALLER_TRACE, "{line}");
        assert!(line["span_id"].is_string());
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["target"], "genai");
        assert!(line["timestamp"].is_string());
        assert!(line["fields"]["session_id"].is_string());
    }
    r.task.abort();
}

/// kill -9 while a call waits for approval; after the restart the turn
/// resumes in the same trace, linked to the interrupted turn span; with
/// `capture_content` the contents are on the spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_resumed_turn_stays_in_its_trace_and_content_is_captured_when_asked() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let r = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &r.url, &r.url, "capture_content = true");
    let data = dir.path().join("data");
    let mut served = serve(&data, &config, &[]);
    let http = reqwest::Client::new();
    let (status, created) = send(
        http.post(format!("{}/v1/sessions", served.url))
            .json(&json!({"agent": "solo", "prompt": "Go alone."})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    // And a delegation, whose child waits for the approval.
    let (status, created) = send(
        http.post(format!("{}/v1/sessions", served.url))
            .json(&json!({"agent": "lead", "prompt": "Go with help."})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let lead_id = created["id"].as_str().unwrap().to_owned();
    wait_status(&http, &served.url, &id, "awaiting_approval").await;
    wait_status(&http, &served.url, &lead_id, "awaiting_approval").await;
    // The first step's chat span has left the process.
    let first = until("the first chat span", || {
        spans(&r).into_iter().find(|s| {
            s.name.starts_with("chat ")
                && s.attrs
                    .get("gen_ai.input.messages")
                    .is_some_and(|m| m.contains("Go alone."))
        })
    })
    .await;
    until("the chat spans of the delegation", || {
        (spans(&r)
            .iter()
            .filter(|s| s.name.starts_with("chat "))
            .count()
            >= 3)
            .then_some(())
    })
    .await;
    let before = spans(&r).len();
    assert!(first.attrs["gen_ai.input.messages"].contains("Go alone."));
    assert!(first.attrs["gen_ai.output.messages"].contains("Probing alone."));
    served.kill9();

    let mut served = serve(&data, &config, &[]);
    approve_all(&http, &served.url, &id).await;
    wait_status(&http, &served.url, &id, "awaiting_input").await;
    approve_all(&http, &served.url, &lead_id).await;
    wait_status(&http, &served.url, &lead_id, "awaiting_input").await;
    served.sigterm();
    let all = spans(&r);
    // The delegation, resumed: the child's turn under the parent's
    // delegate_task span of the new process, all in the lead's trace.
    let lead = one(&all, "invoke_agent lead").clone();
    let delegated: Vec<&Got> = all.iter().filter(|s| s.trace == lead.trace).collect();
    let delegated: Vec<Got> = delegated.into_iter().cloned().collect();
    let delegate = one(&delegated, "execute_tool delegate_task");
    assert_eq!(delegate.parent, lead.id);
    let worker = one(&delegated, "invoke_agent worker");
    assert_eq!(worker.parent, delegate.id, "{all:#?}");
    assert_eq!(worker.attrs["overseer.resumed"], "true");
    assert_eq!(one(&delegated, "execute_tool probe").parent, worker.id);
    assert!(before <= all.len());
    let got: Vec<Got> = all.into_iter().filter(|s| s.trace != lead.trace).collect();
    assert!(
        got.iter().all(|s| s.trace == first.trace),
        "every span is in the first trace: {got:#?}"
    );
    let turn = one(&got, "invoke_agent solo");
    assert_eq!(turn.attrs["overseer.resumed"], "true");
    // Under, and linked to, the turn span the kill interrupted.
    assert_eq!(turn.parent, first.parent);
    assert_eq!(turn.links, vec![first.parent.clone()]);
    let probe = one(&got, "execute_tool probe");
    assert_eq!(probe.parent, turn.id);
    assert!(probe.attrs["gen_ai.tool.call.arguments"].contains("secret-argument"));
    assert!(probe.attrs["gen_ai.tool.call.result"].contains("probed"));
    let chats = got.iter().filter(|s| s.name.starts_with("chat ")).count();
    assert_eq!(chats, 2);
    r.task.abort();
}

async fn metric(http: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = crate::common::answer(http.get(format!("{url}/metrics")))
        .await
        .unwrap()
        .text;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// With the collector down, sessions finish and the dropped spans are
/// counted; the GenAI histograms are on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_sessions_finish_and_dropped_spans_are_counted() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let tool = receiver().await;
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &dead, &tool.url, "");
    let mut served = serve(&dir.path().join("data"), &config, &[]);
    let http = reqwest::Client::new();
    for i in 0..3 {
        // A malformed traceparent is ignored (W3C Trace Context), not refused.
        let (status, created) = send(
            http.post(format!("{}/v1/sessions", served.url))
                .header("traceparent", if i == 0 { "00-not-a-trace-01" } else { "" })
                .json(&json!({"agent": "solo", "prompt": "Go."})),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        approve_all(&http, &served.url, &id).await;
        wait_status(&http, &served.url, &id, "awaiting_input").await;
    }
    let mut dropped = 0.0;
    for _ in 0..1500 {
        dropped = metric(&http, &served.url, "overseer_otel_spans_dropped_total").await;
        if dropped >= 12.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 3 sessions × (turn, 2 chats, approval, tool) = 15 spans, none delivered.
    assert!(dropped >= 12.0, "dropped {dropped}");
    assert_eq!(
        metric(&http, &served.url, "overseer_otel_spans_exported_total").await,
        0.0
    );
    let tokens = metric(&http, &served.url, "gen_ai_client_token_usage_count").await;
    assert!(tokens >= 12.0, "token usage histogram count {tokens}");
    assert!(metric(&http, &served.url, "gen_ai_client_operation_duration_count").await >= 6.0);
    served.sigterm();
    tool.task.abort();
}

/// A `traceparent` on `POST /messages` makes the caller's span the parent of
/// the turn the message starts; a turn without one is a trace of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_a_traceparent_starts_a_turn_under_the_callers_span() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let r = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &r.url, &r.url, "");
    let mut served = serve(&dir.path().join("data"), &config, &[]);
    let http = reqwest::Client::new();
    let (status, created) = send(
        http.post(format!("{}/v1/sessions", served.url))
            .json(&json!({"agent": "echo", "prompt": "First."})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    wait_status(&http, &served.url, &id, "awaiting_input").await;
    let caller = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let (status, body) = send(
        http.post(format!("{}/v1/sessions/{id}/messages", served.url))
            .header("traceparent", format!("00-{caller}-{caller_span}-01"))
            .json(&json!({"text": "Second."})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    until("the second turn", || {
        (spans(&r)
            .iter()
            .filter(|s| s.name == "invoke_agent echo")
            .count()
            == 2)
            .then_some(())
    })
    .await;
    served.sigterm();
    let got = spans(&r);
    let turns: Vec<&Got> = got
        .iter()
        .filter(|s| s.name == "invoke_agent echo")
        .collect();
    let first = turns.iter().find(|t| t.trace != caller).unwrap();
    assert!(
        first.parent.is_empty(),
        "the first turn is a root: {first:?}"
    );
    let second = turns.iter().find(|t| t.trace == caller).unwrap();
    assert_eq!(second.parent, caller_span);
    r.task.abort();
}

/// The latest point of histogram `name` whose attributes include `with`.
fn latest(r: &Receiver, name: &str, with: &[(&str, &str)]) -> Option<Point> {
    r.seen
        .lock()
        .unwrap()
        .points
        .iter()
        .rev()
        .find(|p| {
            p.name == name
                && with
                    .iter()
                    .all(|(k, v)| p.attrs.get(*k).map(String::as_str) == Some(*v))
        })
        .cloned()
}

/// The GenAI client histograms reach the collector over OTLP with the
/// conventions' names, units, attributes and bucket boundaries: two turns
/// of the scripted provider are two operations, and the token sums are the
/// scenario's (7 + 8 in, 1 + 2 out). `OTEL_METRICS_EXPORTER=none` keeps
/// traces and turns metrics off: no export, even at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_histograms_are_exported_over_otlp_unless_metrics_are_off() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    for metrics_on in [true, false] {
        let r = receiver().await;
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), &r.url, &r.url, "");
        let mut env = vec![("OTEL_METRIC_EXPORT_INTERVAL", "100")];
        if !metrics_on {
            env.push(("OTEL_METRICS_EXPORTER", "none"));
        }
        let mut served = serve(&dir.path().join("data"), &config, &env);
        let http = reqwest::Client::new();
        let (status, created) = send(
            http.post(format!("{}/v1/sessions", served.url))
                .json(&json!({"agent": "echo", "prompt": "First."})),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        wait_status(&http, &served.url, &id, "awaiting_input").await;
        let (status, body) = send(
            http.post(format!("{}/v1/sessions/{id}/messages", served.url))
                .json(&json!({"text": "Second."})),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        // The second turn's spans are out: both operations are recorded.
        until("the second turn", || {
            (spans(&r)
                .iter()
                .filter(|s| s.name == "invoke_agent echo")
                .count()
                == 2)
                .then_some(())
        })
        .await;
        if !metrics_on {
            // Shutdown exports what is left; with metrics off there is none.
            served.sigterm();
            assert_eq!(r.seen.lock().unwrap().metric_exports, 0);
            r.task.abort();
            continue;
        }
        let chat = [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "scripted"),
        ];
        // What was received, should a wait below fail.
        let dump = || {
            let seen = r.seen.lock().unwrap();
            eprintln!(
                "{} metric exports; points: {:#?}; server log: {:#?}",
                seen.metric_exports,
                seen.points,
                served.log.lock().unwrap()
            );
        };
        let mut input = None;
        for _ in 0..1500 {
            input = latest(
                &r,
                "gen_ai.client.token.usage",
                &[chat[0], chat[1], ("gen_ai.token.type", "input")],
            )
            .filter(|p| p.count == 2);
            if input.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(input) = input else {
            dump();
            panic!("never: the input tokens of both turns");
        };
        assert_eq!(input.sum, 15.0, "{input:?}");
        assert_eq!(input.unit, "{token}");
        assert_eq!(input.bounds.first(), Some(&1.0), "{input:?}");
        assert!(
            input.attrs.contains_key("gen_ai.request.model"),
            "{input:?}"
        );
        let output = latest(
            &r,
            "gen_ai.client.token.usage",
            &[chat[0], chat[1], ("gen_ai.token.type", "output")],
        )
        .unwrap();
        assert_eq!((output.count, output.sum), (2, 3.0), "{output:?}");
        let duration = until("both operations' durations", || {
            latest(&r, "gen_ai.client.operation.duration", &chat).filter(|p| p.count == 2)
        })
        .await;
        assert_eq!(duration.unit, "s");
        assert!(duration.sum > 0.0, "{duration:?}");
        assert_eq!(duration.bounds.first(), Some(&0.01), "{duration:?}");
        served.sigterm();
        r.task.abort();
    }
}
