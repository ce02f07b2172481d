//! The API of the approval inbox (§16) over a real loopback socket:
//! `GET /v1/approvals` (tenant-wide, newest first, paginated, with the
//! session path of subagents), `GET /v1/events` (the tenant stream: reset,
//! live events, resumption, other tenants kept out) and the security headers
//! of the page and the API. The page itself is driven in a browser by
//! `tests/ui.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use anyhow::{bail, Context};
use common::{expect_error, send, token, Server, Sse, SseMsg, ALL};
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

async fn approvals(s: &Server, token: &str, query: &str) -> anyhow::Result<Value> {
    let (status, v) = send(s.get(&format!("/v1/approvals{query}"), token)).await?;
    if status != 200 {
        bail!("GET /v1/approvals{query} answered {status}: {v}");
    }
    Ok(v)
}

fn call_ids(page: &Value) -> Vec<String> {
    page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["call_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approvals_are_tenant_wide_newest_first_paginated_and_carry_the_path() -> Result {
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);
    let eve = token("globex", "eve", ALL);

    // Three sessions of acme waiting, one of globex, in this order.
    let mut pending = Vec::new();
    for _ in 0..3 {
        pending.push(s.create_pending(&alice).await?);
    }
    let (globex_session, _) = s.create_pending(&eve).await?;
    // A tree: lead delegates to ops, whose approval propagates to the root.
    let lead = s.create(&alice, "lead", Some("go")).await?;
    let mut events = Sse::open(&s, &alice, &lead, None).await?;
    events.until_status("awaiting_approval").await?;

    let all = approvals(&s, &alice, "").await?;
    let items = all["approvals"].as_array().unwrap().clone();
    assert_eq!(items.len(), 4, "{all}");
    assert!(all["next_cursor"].is_null());
    assert!(
        items
            .iter()
            .all(|i| i["session_id"] != json!(globex_session)),
        "another tenant's approval is listed: {all}"
    );
    // Newest request first: the child's (last asked), then the ops sessions
    // in reverse order of creation.
    let child = &items[0];
    assert_eq!(child["root_session_id"], json!(lead));
    assert_eq!(child["agent"], "ops");
    assert_eq!(child["session_path"].as_array().unwrap().len(), 2);
    assert_eq!(child["session_path"][0], json!(lead));
    assert_eq!(child["session_path"][1], child["session_id"]);
    assert_eq!(child["path"][0]["agent"], "lead");
    assert_eq!(child["path"][1]["agent"], "ops");
    let expected: Vec<&str> = pending.iter().rev().map(|(_, c)| c.as_str()).collect();
    let listed: Vec<&str> = items[1..]
        .iter()
        .map(|i| i["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, expected);
    let first = &items[1];
    assert_eq!(first["name"], "write_record");
    assert_eq!(first["description"], "Writes a record.");
    assert_eq!(first["arguments"], json!({"key": 42}));
    assert_eq!(first["parameters"]["required"], json!(["key"]));
    assert_eq!(first["agent"], "ops");
    assert_eq!(first["session_path"], json!([pending[2].0]));
    let requested = first["requested_at_ms"].as_i64().unwrap();
    let deadline = first["approval_deadline_ms"].as_i64().unwrap();
    assert_eq!(
        deadline - requested,
        86_400_000,
        "deadline = request + timeout"
    );
    let times: Vec<i64> = items
        .iter()
        .map(|i| i["requested_at_ms"].as_i64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");

    // Pages of two, following next_cursor, give the same list.
    let page1 = approvals(&s, &alice, "?limit=2").await?;
    let cursor = page1["next_cursor"].as_str().context("a next cursor")?;
    let page2 = approvals(&s, &alice, &format!("?limit=2&cursor={cursor}")).await?;
    assert!(page2["next_cursor"].is_null(), "{page2}");
    let paged: Vec<String> = call_ids(&page1)
        .into_iter()
        .chain(call_ids(&page2))
        .collect();
    assert_eq!(paged, call_ids(&all));

    // Deciding one (here: at the session that owns it) takes it off the list.
    let (sid, cid) = &pending[0];
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{sid}/approvals"),
        &alice,
        &json!({"decisions": {cid: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200);
    let after = approvals(&s, &alice, "").await?;
    assert_eq!(after["approvals"].as_array().unwrap().len(), 3);
    assert!(!call_ids(&after).contains(cid));
    // The other tenant sees its own only.
    let theirs = approvals(&s, &eve, "").await?;
    assert_eq!(call_ids(&theirs).len(), 1);
    assert_eq!(theirs["approvals"][0]["session_id"], json!(globex_session));

    // Refusals.
    expect_error(s.get("/v1/approvals?limit=0", &alice), 400, "invalid_query").await?;
    expect_error(
        s.get("/v1/approvals?limit=201", &alice),
        400,
        "invalid_query",
    )
    .await?;
    let bad = expect_error(
        s.get("/v1/approvals?cursor=zzz", &alice),
        400,
        "invalid_query",
    )
    .await?;
    assert!(bad["error"]["message"].as_str().unwrap().contains("cursor"));
    expect_error(s.get("/v1/approvals?page=2", &alice), 400, "invalid_query").await?;
    expect_error(s.client.get(s.url("/v1/approvals")), 401, "unauthorized").await?;
    let writer = token("acme", "w", &["sessions:write"]);
    expect_error(s.get("/v1/approvals", &writer), 403, "forbidden").await?;
    s.stop().await
}

fn of_type<'a>(msgs: &'a [SseMsg], ty: &str) -> Vec<&'a SseMsg> {
    msgs.iter().filter(|m| m.event == ty).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_stream_resets_then_streams_live_and_resumes_by_id() -> Result {
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);
    let eve = token("globex", "eve", ALL);

    let mut acme = Sse::open_tenant(&s, &alice, None).await?;
    let reset = acme.next_event().await?;
    assert_eq!(reset.event, "reset", "a new client starts with a reset");
    assert_eq!(reset.data["snapshot"], "/v1/approvals");
    let mut globex = Sse::open_tenant(&s, &eve, None).await?;
    assert_eq!(globex.next_event().await?.event, "reset");

    // A new approval arrives with its whole card.
    let (sid, cid) = s.create_pending(&alice).await?;
    let msgs = acme.until(|m| m.event == "approval_requested").await?;
    assert!(msgs.iter().all(|m| m.data["session_id"] == json!(sid)));
    let asked = msgs.last().unwrap();
    assert_eq!(asked.data["call_id"], json!(cid));
    let card = &asked.data["approval"];
    assert_eq!(card["call_id"], json!(cid));
    assert_eq!(card["name"], "write_record");
    assert_eq!(card["arguments"], json!({"key": 42}));
    assert_eq!(card["session_path"], json!([sid]));
    // Summaries carry no texts: the user's prompt is in the stream only in
    // the card's context (why the call is asked).
    assert!(msgs.iter().all(|m| {
        let mut summary = m.data.clone();
        summary.as_object_mut().unwrap().remove("approval");
        !summary.to_string().contains("please write record")
    }));
    assert_eq!(
        asked.data["approval"]["context"]["user_message"]["text"],
        "please write record 42"
    );
    let resume_from = asked.last_id.clone().context("an id")?;

    // Decide it; the stream says so.
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{sid}/approvals"),
        &alice,
        &json!({"decisions": {&cid: {"decision": "deny", "message": "no"}}}),
    ))
    .await?;
    assert_eq!(status, 200);
    let msgs = acme
        .until(|m| m.event == "status_changed" && m.data["status"] == "awaiting_input")
        .await?;
    let decided = of_type(&msgs, "decision_recorded");
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].data["call_id"], json!(cid));
    assert_eq!(decided[0].data["decision"], "deny");
    assert_eq!(decided[0].data["by"], "alice");
    let live_after: Vec<String> = msgs.iter().filter_map(|m| m.last_id.clone()).collect();
    drop(acme);

    // Resuming after the approval replays exactly what followed it.
    let mut resumed = Sse::open_tenant(&s, &alice, Some(&resume_from)).await?;
    let mut replayed = Vec::new();
    for _ in 0..live_after.len() {
        let m = resumed.next_event().await?;
        assert_ne!(m.event, "reset", "a known position resumes without a reset");
        replayed.push(m.last_id.unwrap());
    }
    assert_eq!(replayed, live_after);

    // A position of another stream (a restarted server) resets; a malformed
    // one is refused.
    let mut stale = Sse::open_tenant(&s, &alice, Some("0123456789ab-1-5")).await?;
    let m = stale.next_event().await?;
    assert_eq!(m.event, "reset");
    assert_eq!(m.data["reason"], "unknown_stream");
    expect_error(
        s.get("/v1/events", &alice).header("Last-Event-ID", "17"),
        400,
        "invalid_last_event_id",
    )
    .await?;
    // Another tenant's stream never saw any of it: its next event is its own.
    let (theirs, _) = s.create_pending(&eve).await?;
    let first = globex.next_event().await?;
    assert_eq!(first.data["session_id"], json!(theirs), "{first:?}");
    // The stream needs sessions:read.
    let writer = token("acme", "w", &["sessions:write"]);
    expect_error(s.get("/v1/events", &writer), 403, "forbidden").await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_sessions_approval_leaves_the_tenant_stream_and_the_list() -> Result {
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);
    let mut acme = Sse::open_tenant(&s, &alice, None).await?;
    acme.next_event().await?;
    let (sid, _) = s.create_pending(&alice).await?;
    acme.until(|m| m.event == "approval_requested").await?;
    let (status, _) =
        send(s.post(&format!("/v1/sessions/{sid}/cancel"), &alice, &json!({}))).await?;
    assert_eq!(status, 200);
    // The inbox removes a session's cards when it stops waiting.
    let msgs = acme
        .until(|m| m.event == "status_changed" && m.data["status"] != "awaiting_approval")
        .await?;
    assert_eq!(msgs.last().unwrap().data["session_id"], json!(sid));
    assert!(call_ids(&approvals(&s, &alice, "").await?).is_empty());
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_the_api_carry_the_security_headers() -> Result {
    let s = Server::start().await?;
    let page = common::answer(s.client.get(s.url("/"))).await?;
    assert_eq!(page.status, 200);
    let h = page.headers.clone();
    let csp = h["content-security-policy"].to_str()?;
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(part), "{csp} lacks {part}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(h["content-type"].to_str()?.starts_with("text/html"));
    let etag = h["etag"].to_str()?.to_owned();
    let body = page.text;
    assert!(body.contains("<script type=\"module\" src=\"/ui/app.js\"></script>"));

    // Revalidation answers 304; modules are JavaScript.
    let again = common::answer(s.client.get(s.url("/")).header("If-None-Match", &etag)).await?;
    assert_eq!(again.status, 304);
    for file in [
        "app.js",
        "api.js",
        "auth.js",
        "dom.js",
        "inbox.js",
        "session.js",
        "create.js",
        "desk.js",
        "history.js",
    ] {
        let r = common::answer(s.client.get(s.url(&format!("/ui/{file}")))).await?;
        assert_eq!(r.status, 200, "{file}");
        assert_eq!(r.media_type(), "text/javascript");
        assert_eq!(r.headers["x-content-type-options"], "nosniff");
    }
    expect_error(s.client.get(s.url("/ui/secret.js")), 404, "not_found").await?;

    // API answers: nothing may load from them, and they are never sniffed.
    let api = common::answer(s.client.get(s.url("/v1/sessions"))).await?;
    assert_eq!(api.status, 401);
    assert_eq!(
        api.headers["content-security-policy"],
        "default-src 'none'; frame-ancestors 'none'"
    );
    assert_eq!(api.headers["x-content-type-options"], "nosniff");
    assert_eq!(api.headers["referrer-policy"], "no-referrer");
    s.stop().await
}

/// `GET /v1/decisions{query}` as `token`, which must answer 200.
async fn decisions(s: &Server, token: &str, query: &str) -> anyhow::Result<Value> {
    let (status, v) = send(s.get(&format!("/v1/decisions{query}"), token)).await?;
    if status != 200 {
        bail!("GET /v1/decisions{query} answered {status}: {v}");
    }
    Ok(v)
}

/// Every row of the history under `filters` (`&k=v…`), page by page of `limit`.
async fn whole_history(
    s: &Server,
    token: &str,
    limit: usize,
    filters: &str,
) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let q = match &cursor {
            Some(c) => format!("?limit={limit}{filters}&cursor={c}"),
            None => format!("?limit={limit}{filters}"),
        };
        let page = decisions(s, token, &q).await?;
        let rows = page["decisions"].as_array().context("decisions")?;
        assert!(rows.len() <= limit, "{page}");
        out.extend(rows.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(out),
        }
    }
    bail!("the history did not end within 100 pages")
}

/// Waits on the session's own stream until it leaves `awaiting_approval`.
async fn until_decided(s: &Server, token: &str, id: &str) -> Result {
    let mut events = Sse::open(s, token, id, None).await?;
    events
        .until(|m| m.event == "decision_recorded")
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_decision_history_lists_every_kind_of_decision_paged_filtered_and_per_tenant() -> Result
{
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);
    let bob = token("acme", "bob", ALL);
    let carol = token("acme", "carol", ALL);
    let eve = token("globex", "eve", ALL);

    // An edit through the API (titled session).
    let (status, created) = send(s.post(
        "/v1/sessions",
        &alice,
        &json!({"agent": "ops", "prompt": "please write record 42", "title": "Quarterly ledger"}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    let edited = created["id"].as_str().context("id")?.to_owned();
    let mut events = Sse::open(&s, &alice, &edited, None).await?;
    let asked = events.until_type("approval_requested").await?;
    let edited_call = asked.last().unwrap().data["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{edited}/approvals"),
        &alice,
        &json!({"decisions": {&edited_call: {"decision": "approve", "override_args": {"key": 43}}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");

    // An approval with the CLI, as carol.
    let (cli, cli_call) = s.create_pending(&alice).await?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_overseer"))
        .args(["sessions", "--url", &s.base, "approve", &cli])
        .env("OVERSEER_TOKEN", &carol)
        .output()
        .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_decided(&s, &alice, &cli).await?;

    // A denial through the API, as bob.
    let (denied, denied_call) = s.create_pending(&alice).await?;
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{denied}/approvals"),
        &bob,
        &json!({"decisions": {&denied_call: {"decision": "deny", "message": "not today"}}}),
    ))
    .await?;
    assert_eq!(status, 200);

    // A timeout (a session with a one-second approval timeout).
    let (status, created) = send(s.post(
        "/v1/sessions",
        &alice,
        &json!({"agent": "ops", "prompt": "please write record 9", "approval_timeout_secs": 1}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    let timed_out = created["id"].as_str().context("id")?.to_owned();
    until_decided(&s, &alice, &timed_out).await?;

    // A standing rule, set before the call is asked, answers it.
    let ruled = s.create(&alice, "ops", None).await?;
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{ruled}/rules"),
        &alice,
        &json!({"tool": "write_record", "rule": "allow"}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    let mut events = Sse::open(&s, &alice, &ruled, None).await?;
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{ruled}/messages"),
        &alice,
        &json!({"text": "please write record 7"}),
    ))
    .await?;
    assert_eq!(status, 202);
    events.until_type("decision_recorded").await?;

    // A child's call, decided at its root: the root's title.
    let (status, created) = send(s.post(
        "/v1/sessions",
        &alice,
        &json!({"agent": "lead", "prompt": "go", "title": "Launch"}),
    ))
    .await?;
    assert_eq!(status, 201);
    let lead = created["id"].as_str().context("id")?.to_owned();
    let mut events = Sse::open(&s, &alice, &lead, None).await?;
    events.until_status("awaiting_approval").await?;
    let pending = approvals(&s, &alice, "").await?;
    let child_item = pending["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["root_session_id"] == json!(lead))
        .context("the child's card")?
        .clone();
    let child_call = child_item["call_id"].as_str().unwrap();
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{lead}/approvals"),
        &alice,
        &json!({"decisions": {child_call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200);

    // Another tenant's decision.
    let (theirs, their_call) = s.create_pending(&eve).await?;
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{theirs}/approvals"),
        &eve,
        &json!({"decisions": {&their_call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200);

    // The whole history: six decisions, newest first, each as made.
    let all = decisions(&s, &alice, "").await?;
    let rows = all["decisions"].as_array().context("decisions")?.clone();
    assert!(all["next_cursor"].is_null(), "{all}");
    assert_eq!(rows.len(), 6, "{all}");
    let times: Vec<i64> = rows.iter().map(|r| r["at_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let row = |call: &str| {
        rows.iter()
            .find(|r| r["call_id"] == json!(call))
            .unwrap_or_else(|| panic!("no row for {call}: {all}"))
            .clone()
    };
    let edit = row(&edited_call);
    assert_eq!(edit["decision"], "approve_with_edit");
    assert_eq!(edit["by"], "alice");
    assert_eq!(edit["approved"], true);
    assert_eq!(edit["args_diff"], json!({"key": {"from": 42, "to": 43}}));
    assert_eq!(edit["title"], "Quarterly ledger");
    assert_eq!(edit["session_id"], json!(edited));
    assert_eq!(edit["agent"], "ops");
    assert_eq!(edit["tool"], "write_record");
    let by_cli = row(&cli_call);
    assert_eq!(
        (&by_cli["decision"], &by_cli["by"]),
        (&json!("approve"), &json!("carol"))
    );
    assert!(by_cli["args_diff"].is_null());
    let denial = row(&denied_call);
    assert_eq!(
        (&denial["decision"], &denial["by"]),
        (&json!("deny"), &json!("bob"))
    );
    assert_eq!(
        (&denial["reason"], &denial["approved"]),
        (&json!("not today"), &json!(false))
    );
    let timeout = rows
        .iter()
        .find(|r| r["session_id"] == json!(timed_out))
        .context("the timeout's row")?;
    assert_eq!(
        (&timeout["decision"], &timeout["by"]),
        (&json!("timeout"), &json!("system"))
    );
    assert_eq!(timeout["reason"], "No approval decision received");
    let rule = rows
        .iter()
        .find(|r| r["session_id"] == json!(ruled))
        .context("the rule's row")?;
    assert_eq!(
        (&rule["decision"], &rule["by"]),
        (&json!("rule"), &json!("rule:allow"))
    );
    assert_eq!(rule["approved"], true);
    let child = row(child_call);
    assert_eq!(child["root_session_id"], json!(lead));
    assert_eq!(child["session_id"], child_item["session_id"]);
    assert_eq!(
        child["title"], "Launch",
        "a child's row carries its root's title"
    );
    assert!(rows.iter().all(|r| r["session_id"] != json!(theirs)));

    // Pages of two, following next_cursor, give the same rows.
    assert_eq!(whole_history(&s, &alice, 2, "").await?, rows);
    // Each filter.
    let calls = |rows: Vec<Value>| -> Vec<String> {
        rows.iter()
            .map(|r| r["call_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        calls(whole_history(&s, &alice, 1, "&by=bob").await?),
        vec![denied_call.clone()]
    );
    assert_eq!(
        calls(whole_history(&s, &alice, 1, "&by=carol").await?),
        vec![cli_call.clone()]
    );
    assert_eq!(
        whole_history(&s, &alice, 2, "&tool=write_record").await?,
        rows
    );
    assert!(whole_history(&s, &alice, 2, "&tool=delegate_task")
        .await?
        .is_empty());
    assert_eq!(whole_history(&s, &alice, 3, "&agent=ops").await?, rows);
    assert!(whole_history(&s, &alice, 3, "&agent=lead")
        .await?
        .is_empty());
    assert_eq!(
        whole_history(&s, &alice, 50, "&agent=&tool=&by=").await?,
        rows,
        "empty filters filter nothing"
    );

    // The other tenant sees its own only, even with this tenant's cursor.
    let theirs_page = decisions(&s, &eve, "").await?;
    assert_eq!(theirs_page["decisions"].as_array().unwrap().len(), 1);
    assert_eq!(theirs_page["decisions"][0]["call_id"], json!(their_call));
    let first = decisions(&s, &alice, "?limit=1").await?;
    let cursor = first["next_cursor"].as_str().context("a cursor")?;
    let crossed = decisions(&s, &eve, &format!("?cursor={cursor}")).await?;
    assert!(crossed["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["call_id"] == json!(their_call)));

    // Refusals: a cursor that is not one, names the cursor; bad limits;
    // unknown parameters; no token; no read scope.
    for bad in ["zzz", "00", "not-a-cursor!", "0123456789abcdef"] {
        let e = expect_error(
            s.get(&format!("/v1/decisions?cursor={bad}"), &alice),
            400,
            "invalid_query",
        )
        .await?;
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cursor") && message.contains(bad),
            "{message}"
        );
    }
    expect_error(s.get("/v1/decisions?limit=0", &alice), 400, "invalid_query").await?;
    expect_error(
        s.get("/v1/decisions?limit=201", &alice),
        400,
        "invalid_query",
    )
    .await?;
    expect_error(
        s.get("/v1/decisions?session=1", &alice),
        400,
        "invalid_query",
    )
    .await?;
    expect_error(s.client.get(s.url("/v1/decisions")), 401, "unauthorized").await?;
    let writer = token("acme", "w", &["sessions:write"]);
    expect_error(s.get("/v1/decisions", &writer), 403, "forbidden").await?;

    // The history is the store's: a restarted server lists the same.
    let dir = s.stop_keep_data().await?;
    let s = Server::start_in(dir, common::hs256(), Default::default()).await?;
    assert_eq!(decisions(&s, &alice, "").await?["decisions"], json!(rows));
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_say_why_the_call_is_asked_bounded_and_me_says_what_a_token_may_do() -> Result {
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);
    let mut feed = Sse::open_tenant(&s, &alice, None).await?;
    assert_eq!(feed.next_event().await?.event, "reset");

    let (sid, cid) = s.create_pending(&alice).await?;
    let page = approvals(&s, &alice, "").await?;
    let card = &page["approvals"][0];
    assert_eq!(card["call_id"], json!(cid));
    let context = &card["context"];
    assert_eq!(context["model_text"]["text"], "I will write record 42.");
    assert_eq!(context["model_text"]["truncated"], false);
    assert_eq!(context["user_message"]["text"], "please write record 42");
    assert_eq!(context["user_message"]["bytes"], 22);
    // The live card carries it too.
    let msgs = feed.until(|m| m.event == "approval_requested").await?;
    let live = &msgs.last().unwrap().data["approval"];
    assert_eq!(live["session_id"], json!(sid));
    assert_eq!(live["context"], *context);

    // A 100 KB message is cut at the bound, at a character boundary.
    let long = format!("write record 5 {}", "é".repeat(50_000));
    let id = s.create(&alice, "ops", Some(&long)).await?;
    let mut events = Sse::open(&s, &alice, &id, None).await?;
    events.until_type("approval_requested").await?;
    let page = approvals(&s, &alice, "").await?;
    let card = page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["session_id"] == json!(id))
        .context("the long card")?;
    let user = &card["context"]["user_message"];
    assert_eq!(user["truncated"], true);
    assert_eq!(user["bytes"], long.len());
    let text = user["text"].as_str().unwrap();
    assert!(text.len() <= 4096 && text.len() > 4000, "{}", text.len());
    assert!(long.starts_with(text));

    // A child's card: its goal and its own step's text.
    let lead = s.create(&alice, "lead", Some("go")).await?;
    let mut events = Sse::open(&s, &alice, &lead, None).await?;
    events.until_status("awaiting_approval").await?;
    let page = approvals(&s, &alice, "").await?;
    let child = page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["root_session_id"] == json!(lead))
        .context("the child's card")?;
    assert_eq!(child["context"]["user_message"]["text"], "write record 5");
    assert_eq!(
        child["context"]["model_text"]["text"],
        "I will write record 5."
    );

    // What a token may do.
    let (status, me) = send(s.get("/v1/me", &alice)).await?;
    assert_eq!(status, 200);
    assert_eq!(
        (&me["sub"], &me["tenant"]),
        (&json!("alice"), &json!("acme"))
    );
    assert_eq!(
        me["may"],
        json!({"read": true, "write": true, "decide": true, "admin": false})
    );
    let reader = token("acme", "rita", &["sessions:read"]);
    let (_, me) = send(s.get("/v1/me", &reader)).await?;
    assert_eq!(me["scopes"], json!(["sessions:read"]));
    assert_eq!(me["may"]["decide"], false);
    assert_eq!(me["may"]["read"], true);
    let admin = token("acme", "root", &["admin"]);
    let (_, me) = send(s.get("/v1/me", &admin)).await?;
    assert_eq!(
        me["may"],
        json!({"read": true, "write": true, "decide": true, "admin": true})
    );
    expect_error(s.client.get(s.url("/v1/me")), 401, "unauthorized").await?;
    s.stop().await
}
