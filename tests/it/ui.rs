//! The approval inbox (§16) end to end in a real headless Chromium, against
//! `overseer serve` as a process: sign-in (link and paste), live cards,
//! decisions (edit with the server's validation message at the field, deny
//! with a reason, several at once, keyboard shortcuts), delegation paths and
//! the tree, cards removed everywhere when decided anywhere, tenants kept
//! apart, model text rendered inert, an expired token back at sign-in; the
//! review desk: search, filters, grouping, order by deadline with the mark
//! of calls close to their automatic denial, why a call is asked, the
//! standing-rule button, the decision history with the diffs of decisions
//! made from the API, the CLI and the page, a read-only token without
//! decide buttons, `D` + reason + Enter, no top bar at sign-in, labels that
//! tell sessions of the same second apart; "fork from here" on a transcript
//! entry (hidden from a read-only token).
//!
//! The browser is the headless Chromium of the npm package
//! `@sparticuz/chromium`, which the tests install and unpack themselves
//! (`common/chromium.rs`), or the one `OVERSEER_TEST_CHROMIUM` names; it is
//! driven over the DevTools protocol (`ui/browser.rs`). One browser process
//! serves the whole binary; each test has its own browser context. The
//! paths that cannot get a browser fail with one line saying what to do
//! (tested at the end of this file). Screenshots of the inbox, the edit form
//! with its error and the session view are saved under
//! `target/ui-screenshots/` in each run. Every wait is on the page's own
//! state (a DOM observer in the browser), bounded, and fails saying what it
//! awaited and what the page showed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "ui/browser.rs"]
mod browser;
use crate::common;
#[path = "ui/served.rs"]
mod served;

use anyhow::Context;
use browser::{Browser, Window};
use reqwest::Method;
use serde_json::json;
use served::{token_until, Served, WRITE_DESCRIPTION};

type Result = anyhow::Result<()>;

/// A JavaScript string literal of `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The condition "a card for `call` is shown".
fn card_shown(call: &str) -> String {
    format!(
        "document.querySelector('.cards .card[data-call=' + {} + ']')",
        lit(&format!("\"{call}\""))
    )
}

fn card_gone(call: &str) -> String {
    format!("!{}", card_shown(call))
}

/// The condition "the main area's text contains `text`".
fn shows(text: &str) -> String {
    format!(
        "document.getElementById('main').innerText.includes({})",
        lit(text)
    )
}

/// Signs in by pasting `token` into the form.
async fn paste_sign_in(b: &Window, s: &Served, token: &str) -> Result {
    b.goto(&s.page("")).await?;
    b.wait("the sign-in form", "document.getElementById('token')")
        .await?;
    b.fill("#token", token).await?;
    b.click("#sign-in").await?;
    b.wait(
        "the inbox after signing in",
        "!document.getElementById('top').hidden && document.querySelector('h1') && document.querySelector('h1').textContent === 'Pending approvals'",
    )
    .await
}

/// Whether the page is wider than the window (it must not be, at 375 px).
async fn overflows(b: &Window) -> anyhow::Result<bool> {
    Ok(b.js(
        "return document.documentElement.scrollWidth > window.innerWidth + 1",
        json!([]),
    )
    .await?
    .as_bool()
    .unwrap_or(true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_then_an_edit_refused_at_the_field_then_fixed_shows_the_result() -> Result {
    let s = Served::start().await?;
    let link = s.link("acme", "alice")?;
    assert!(link.starts_with(&format!("{}/#token=", s.url)), "{link}");
    let token = link.split_once("#token=").unwrap().1.to_owned();
    let b = Browser::open().await?;

    // The link signs in; the token moves to sessionStorage and leaves the
    // address bar; nothing goes to localStorage.
    b.goto(&link).await?;
    b.wait(
        "signed in as alice",
        "document.getElementById('whoami').textContent === 'alice @ acme'",
    )
    .await?;
    let url = b.url().await?;
    assert!(
        !url.contains("token"),
        "the token is still in the address bar: {url}"
    );
    let stored = b
        .js("return [sessionStorage.getItem('overseer.token'), localStorage.length, history.length]", json!([]))
        .await?;
    assert_eq!(stored[0], json!(token));
    assert_eq!(stored[1], json!(0), "nothing in localStorage");
    b.wait("the empty inbox", &shows("No pending approvals"))
        .await?;

    // A session created elsewhere (the API) shows up without a reload.
    let id = s
        .create(
            &token,
            "ops",
            "please write record 42",
            Some("Quarterly ledger"),
        )
        .await?;
    let call = s.pending_call(&token, &id).await?;
    b.wait("the new approval's card", &card_shown(&call))
        .await?;
    let card = format!(".card[data-call=\"{call}\"]");
    let text = b.text(&card).await?;
    for want in [
        "write_record",
        "asked by ops",
        "Quarterly ledger",
        WRITE_DESCRIPTION,
        "\"key\": 42",
        "Waiting",
        "denied automatically in 2", // 23 h 59 min or 24 h
    ] {
        assert!(text.contains(want), "the card lacks {want:?}:\n{text}");
    }
    assert_eq!(b.text("#inbox-count").await?, "1");
    b.screenshot("inbox").await?;

    // Edit the arguments with a value the tool's schema refuses: the
    // change is shown before it is confirmed; then the server's message is
    // shown at the field, which is marked invalid.
    b.click(&format!("{card} button[aria-label^='Edit arguments']"))
        .await?;
    b.fill(
        &format!("{card} textarea.args-editor"),
        r#"{"key": "forty-two"}"#,
    )
    .await?;
    b.click(&format!("{card} form.edit button[type=submit]"))
        .await?;
    b.wait(
        "the change shown before it is confirmed",
        &format!(
            "!document.querySelector({}).hidden",
            lit(&format!("{card} .edit-preview"))
        ),
    )
    .await?;
    let preview = b.text(&format!("{card} .edit-preview")).await?;
    assert!(preview.contains(r#"key: 42 → "forty-two""#), "{preview}");
    b.click(&format!("{card} button.confirm-edit")).await?;
    b.wait(
        "the validation message at the field",
        &format!(
            "document.querySelector({}).textContent.length > 0",
            lit(&format!("{card} .field-error"))
        ),
    )
    .await?;
    let error = b.text(&format!("{card} .field-error")).await?;
    assert!(error.contains("schema validation failed"), "{error}");
    assert!(
        error.contains("forty-two") || error.contains("integer"),
        "{error}"
    );
    let field = b
        .js(
            "const t = document.querySelector(arguments[0] + ' textarea.args-editor'); \
             const e = document.querySelector(arguments[0] + ' .field-error'); \
             return [t.getAttribute('aria-invalid'), t.getAttribute('aria-describedby').split(' ').includes(e.id), document.activeElement === t];",
            json!([card]),
        )
        .await?;
    assert_eq!(
        field,
        json!(["true", true, true]),
        "invalid, described by the message, focused"
    );
    assert!(s.tool_calls().is_empty(), "nothing ran");
    b.screenshot("edit-error").await?;

    // Fixed, reviewed and confirmed, it is approved; the card goes away.
    b.fill(&format!("{card} textarea.args-editor"), r#"{"key": 43}"#)
        .await?;
    b.click(&format!("{card} form.edit button[type=submit]"))
        .await?;
    b.click(&format!("{card} button.confirm-edit")).await?;
    b.wait("the decided card to go", &card_gone(&call)).await?;
    b.wait(
        "the inbox count at zero",
        "document.getElementById('inbox-count').textContent === '0'",
    )
    .await?;

    // The session view shows the result, the final answer and the decision
    // with who and the argument diff.
    b.goto(&s.page(&format!("#/s/{id}"))).await?;
    b.wait("the final answer", &shows("Result: {\"written\":43}"))
        .await?;
    b.wait(
        "the call completed",
        "document.querySelector('.call[data-state=completed]')",
    )
    .await?;
    let main = b.text("main").await?;
    assert!(main.contains("Approved by alice"), "{main}");
    assert!(main.contains("key: 42 → 43"), "{main}");
    assert!(main.contains("please write record 42"), "{main}");
    assert!(main.contains("Quarterly ledger"), "{main}");
    assert_eq!(
        s.tool_calls(),
        vec![("write_record".to_owned(), json!({"key": 43}))]
    );
    b.screenshot("session").await?;

    // At 375 px wide nothing needs horizontal scrolling.
    b.set_size(375, 812).await?;
    assert!(
        !overflows(&b).await?,
        "the session view overflows at 375 px"
    );
    b.goto(&s.page("#/inbox")).await?;
    b.wait("the inbox", "document.querySelector('.toolbar')")
        .await?;
    assert!(!overflows(&b).await?, "the inbox overflows at 375 px");
    b.screenshot("inbox-375px").await?;

    // The token never travelled in a URL the page requested.
    let urls = b
        .js("return performance.getEntriesByType('resource').map(e => e.name).concat([location.href])", json!([]))
        .await?;
    assert!(!urls.to_string().contains(&token), "{urls}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_typed_at_the_keyboard_reaches_the_model_then_a_message_and_done() -> Result {
    let s = Served::start().await?;
    let bob = s.token("acme", "bob");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &bob).await?;
    let id = s.create(&bob, "ops", "please write record 7", None).await?;
    let call = s.pending_call(&bob, &id).await?;
    b.wait("the card", &card_shown(&call)).await?;

    // Keyboard only: j focuses the first card, d opens its reason field.
    b.keys(&["j"]).await?;
    let focused = b
        .js("return document.activeElement.classList.contains('card') && document.activeElement.dataset.call", json!([]))
        .await?;
    assert_eq!(focused, json!(call), "j focuses the card");
    b.keys(&["d"]).await?;
    b.wait(
        "the reason field focused",
        "document.activeElement.classList.contains('reason')",
    )
    .await?;
    b.type_into(
        &format!(".card[data-call=\"{call}\"] input.reason"),
        "not on a Friday",
    )
    .await?;
    b.keys(&["Enter"]).await?;
    b.wait("the denied card to go", &card_gone(&call)).await?;
    assert!(s.tool_calls().is_empty(), "a denied call never runs");

    // The model's next text quotes the reason; the decision says who.
    b.goto(&s.page(&format!("#/s/{id}"))).await?;
    b.wait(
        "the model quoting the reason",
        &shows("Result: Tool denied by user: not on a Friday"),
    )
    .await?;
    b.wait(
        "the call denied",
        "document.querySelector('.call[data-state=denied]')",
    )
    .await?;
    let main = b.text("main").await?;
    assert!(main.contains("Denied by bob"), "{main}");

    // Send a follow-up message, then mark the session done.
    b.fill(".message-form textarea", "thanks").await?;
    b.click(".message-form button[type=submit]").await?;
    b.wait("the reply to the message", &shows("Anything else?"))
        .await?;
    b.wait(
        "awaiting input again",
        "document.querySelector('.status.awaiting_input')",
    )
    .await?;
    b.click("#done-session").await?;
    b.wait(
        "the session completed",
        "document.querySelector('.status.completed')",
    )
    .await?;
    let disabled = b
        .js("return [...document.querySelectorAll('.message-form button, #cancel-session, #done-session')].every(x => x.disabled)", json!([]))
        .await?;
    assert_eq!(
        disabled,
        json!(true),
        "a finished session offers no actions"
    );
    let state = s
        .api(Method::GET, &format!("/v1/sessions/{id}"), &bob, None)
        .await?;
    assert_eq!(state["status"], "completed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_approval_shows_its_path_and_is_decided_from_the_inbox() -> Result {
    let s = Served::start().await?;
    let link = s.link("acme", "carol")?;
    let b = Browser::open().await?;
    b.goto(&link).await?;
    b.wait(
        "signed in",
        "document.getElementById('whoami').textContent === 'carol @ acme'",
    )
    .await?;

    // New session: agent picker, title and prompt.
    b.click("#nav-new").await?;
    b.wait(
        "the agent list",
        "document.querySelector('select option[value=lead]')",
    )
    .await?;
    b.click("select option[value=lead]").await?;
    b.wait("the agent described", &shows("Delegates to: ops"))
        .await?;
    b.fill("form.create input[type=text]", "Launch plan")
        .await?;
    b.fill("form.create textarea", "Plan the launch").await?;
    b.click("form.create button[type=submit]").await?;
    b.wait("the new session's view", "location.hash.startsWith('#/s/')")
        .await?;
    let id = b
        .js("return location.hash.slice(4)", json!([]))
        .await?
        .as_str()
        .context("session id")?
        .to_owned();

    // The child's approval surfaces in the session view and in the inbox,
    // with the path of sessions that leads to it.
    b.wait(
        "the child's approval in the session view",
        &shows("Subagent path: lead › ops"),
    )
    .await?;
    b.click("#nav-inbox").await?;
    b.wait("the child's card", "document.querySelector('.cards .card')")
        .await?;
    let card = b.text(".cards .card").await?;
    for want in [
        "Subagent path: lead › ops",
        "asked by ops",
        "Launch plan",
        "\"key\": 5",
    ] {
        assert!(card.contains(want), "the card lacks {want:?}:\n{card}");
    }
    let approvals = s
        .api(
            Method::GET,
            "/v1/approvals",
            &s.token("acme", "carol"),
            None,
        )
        .await?;
    let item = &approvals["approvals"][0];
    assert_eq!(item["root_session_id"], json!(id));
    assert_ne!(item["session_id"], json!(id), "owned by the child");

    // Decided from the inbox; the tree finishes.
    b.click(".cards .card button.approve").await?;
    b.wait("the card to go", "!document.querySelector('.cards .card')")
        .await?;
    b.goto(&s.page(&format!("#/s/{id}"))).await?;
    // The child's final text, inside the delegate_task result.
    b.wait("the lead's final answer", &shows(r#"lead: {"#))
        .await?;
    let main = b.text("main").await?;
    assert!(main.contains(r#"Result: {\"written\":5}"#), "{main}");
    b.wait(
        "the tree with both sessions, the child finished",
        "document.querySelectorAll('.tree li').length === 2 && !document.querySelector('.tree .status.awaiting_approval') && !document.querySelector('.tree .status.running')",
    )
    .await?;
    let tree = b.text(".tree").await?;
    assert!(tree.contains("lead"), "{tree}");
    assert!(tree.contains("ops"), "{tree}");
    assert!(tree.contains("tokens"), "usage per node: {tree}");
    assert_eq!(
        s.tool_calls(),
        vec![("write_record".to_owned(), json!({"key": 5}))]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_decided_anywhere_leaves_every_inbox_and_tenants_see_only_their_own() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let eve = s.token("globex", "eve");
    let b = Browser::open().await?;
    // Three windows: alice twice, eve (another tenant) once.
    let a: &Window = &b;
    paste_sign_in(a, &s, &alice).await?;
    let w2 = b.new_window().await?;
    paste_sign_in(&w2, &s, &alice).await?;
    let w3 = b.new_window().await?;
    paste_sign_in(&w3, &s, &eve).await?;

    let mut sessions = Vec::new();
    for n in 1..=4 {
        let id = s
            .create(
                &alice,
                "ops",
                &format!("write record {n}"),
                Some(&format!("job {n}")),
            )
            .await?;
        let call = s.pending_call(&alice, &id).await?;
        sessions.push((id, call));
    }
    let hasty = s.create(&alice, "hasty", "record 9", None).await?;
    let hasty_call = s.pending_call(&alice, &hasty).await?;
    let every = sessions
        .iter()
        .map(|(_, c)| card_shown(c))
        .collect::<Vec<_>>()
        .join(" && ");
    for w in [a, &w2] {
        w.wait("every card", &every).await?;
    }

    // Decided in one window.
    let (s1, c1) = &sessions[0];
    a.click(&format!(".card[data-call=\"{c1}\"] button.approve"))
        .await?;
    w2.wait("the card decided in the other window to go", &card_gone(c1))
        .await?;

    // Decided through the API. How long the card took to leave the other
    // window is printed (measured in the browser, from just before the
    // request), never asserted.
    let (s2, c2) = &sessions[1];
    w2.js(
        "window.__goneAt = null; const sel = arguments[0]; \
         const o = new MutationObserver(() => { if (!document.querySelector(sel)) { window.__goneAt = Date.now(); o.disconnect(); } }); \
         o.observe(document, {subtree: true, childList: true});",
        json!([format!(".cards .card[data-call=\"{c2}\"]")]),
    )
    .await?;
    let sent_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    s.api(
        Method::POST,
        &format!("/v1/sessions/{s2}/approvals"),
        &alice,
        Some(json!({"decisions": {c2: {"decision": "approve"}}})),
    )
    .await?;
    for w in [&w2, a] {
        w.wait("the card decided through the API to go", &card_gone(c2))
            .await?;
    }
    if let Some(gone_at) = w2.js("return window.__goneAt", json!([])).await?.as_i64() {
        eprintln!(
            "measured: a card decided through the API left another open inbox {} ms after the request was sent",
            gone_at - sent_at
        );
    }

    // Decided with the CLI.
    let (s3, c3) = &sessions[2];
    let out = std::process::Command::new(served::BIN)
        .args(["sessions", "--url", &s.url, "approve", s3])
        .env("OVERSEER_TOKEN", &alice)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for w in [a, &w2] {
        w.wait("the card decided with the CLI to go", &card_gone(c3))
            .await?;
    }

    // Decided by the approval timeout.
    for w in [a, &w2] {
        w.wait("the timed-out card to go", &card_gone(&hasty_call))
            .await?;
    }

    // Cancelled from the session view in one window (confirm, then cancel).
    let (s4, c4) = &sessions[3];
    a.goto(&s.page(&format!("#/s/{s4}"))).await?;
    a.wait(
        "the session view",
        "document.querySelector('.status.awaiting_approval')",
    )
    .await?;
    a.click("#cancel-session").await?;
    a.wait("the confirmation", &shows("Confirm: cancel"))
        .await?;
    a.click("#cancel-session").await?;
    a.wait(
        "the session cancelled",
        "document.querySelector('.status.cancelled')",
    )
    .await?;
    w2.wait("the cancelled session's card to go", &card_gone(c4))
        .await?;

    // Several at once, by keyboard, in the second window.
    let mut batch = Vec::new();
    for n in 5..=6 {
        let id = s
            .create(&alice, "ops", &format!("write record {n}"), None)
            .await?;
        batch.push(s.pending_call(&alice, &id).await?);
    }
    let both = format!("{} && {}", card_shown(&batch[0]), card_shown(&batch[1]));
    w2.wait("the two new cards", &both).await?;
    w2.js("document.getElementById('main').focus()", json!([]))
        .await?;
    w2.keys(&["j", "x", "j", "x"]).await?;
    w2.wait("two selected", &shows("2 selected")).await?;
    w2.keys(&["A"]).await?;
    let gone = format!("{} && {}", card_gone(&batch[0]), card_gone(&batch[1]));
    w2.wait("the approved cards to go", &gone).await?;
    a.goto(&s.page("#/inbox")).await?;
    a.wait(
        "an empty inbox in the first window",
        &shows("No pending approvals"),
    )
    .await?;
    // A card goes when its decision is recorded; the tool runs after that.
    common::eventually(
        "the approved calls to run",
        std::time::Duration::from_millis(50),
        || async {
            let calls = s.tool_calls();
            if calls.len() >= 5 {
                Ok(())
            } else {
                Err(format!("{calls:?}"))
            }
        },
    )
    .await;
    let ran: Vec<i64> = s
        .tool_calls()
        .iter()
        .map(|(_, args)| args["key"].as_i64().unwrap())
        .collect();
    let mut sorted = ran.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![1, 2, 3, 5, 6], "approved calls ran once each");

    // The other tenant saw none of it, and cannot open it.
    w3.wait("globex's empty inbox", &shows("No pending approvals"))
        .await?;
    assert_eq!(w3.text("#inbox-count").await?, "0");
    assert_eq!(w3.count(".cards .card").await?, 0);
    w3.goto(&s.page(&format!("#/s/{s1}"))).await?;
    w3.wait(
        "not found for another tenant's session",
        &shows("Session not found"),
    )
    .await?;
    let theirs = s.api(Method::GET, "/v1/approvals", &eve, None).await?;
    assert_eq!(theirs["approvals"], json!([]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_tool_and_user_text_is_rendered_as_inert_text() -> Result {
    let s = Served::start().await?;
    let dave = s.token("acme", "dave");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &dave).await?;
    let payload = r#"hi <script>window.__xss=1;alert('script')</script><img src=x onerror="window.__xss=2;alert('img')">"#;
    let title = "<img src=/ui/title-x onerror=alert(3)>";
    // Any CSP violation from here on (an inline handler, an inline style,
    // a foreign load) is counted.
    b.js(
        "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));",
        json!([]),
    )
    .await?;
    let id = s.create(&dave, "echo", payload, Some(title)).await?;
    let call = s.pending_call(&dave, &id).await?;
    b.wait("the card", &card_shown(&call)).await?;

    let inert = "document.querySelectorAll('main script, main img, main iframe').length === 0 \
                 && window.__xss === undefined \
                 && !performance.getEntriesByType('resource').some(e => /\\/x$|title-x/.test(e.name))";
    let check = |what: &'static str| {
        let b = &b;
        async move {
            let ok = b.js(&format!("return {inert}"), json!([])).await?;
            assert_eq!(ok, json!(true), "{what}: markup was interpreted");
            assert_eq!(b.dialogs(), Vec::<String>::new(), "{what}: a dialog opened");
            anyhow::Ok(())
        }
    };
    let card = b.text(&format!(".card[data-call=\"{call}\"]")).await?;
    assert!(
        card.contains("<script>window.__xss=1;alert('script')</script>"),
        "{card}"
    );
    assert!(card.contains(title), "{card}");
    check("the inbox").await?;

    b.click(&format!(".card[data-call=\"{call}\"] button.approve"))
        .await?;
    b.wait("the card to go", &card_gone(&call)).await?;
    // Through the page's own link (a hash change: the listener stays).
    b.js("location.hash = '#/s/' + arguments[0]", json!([id]))
        .await?;
    b.wait("the final answer", &shows("Noted: {\"annotated\":"))
        .await?;
    let main = b.text("main").await?;
    assert!(main.contains(&format!("You said: {payload}")), "{main}");
    assert!(main.contains(title), "{main}");
    check("the session view").await?;
    let violations = b.js("return window.__violations", json!([])).await?;
    assert_eq!(violations, json!([]), "the page broke its own CSP");
    // The browser's own log agrees, from the first load on.
    let reported: Vec<String> = b
        .console()
        .into_iter()
        .filter(|line| line.starts_with("security"))
        .collect();
    assert_eq!(
        reported,
        Vec::<String>::new(),
        "the browser reported a CSP violation"
    );
    let doc_title = b.js("return document.title", json!([])).await?;
    assert!(doc_title.as_str().unwrap().contains(title), "{doc_title}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_returns_to_sign_in_with_a_clear_message() -> Result {
    let s = Served::start().await?;
    let b = Browser::open().await?;

    // A token that expires while the page is open: back to sign-in when it
    // does, and the token is forgotten.
    let soon = token_until("acme", "erin", jsonwebtoken::get_current_timestamp() + 3);
    b.goto(&s.page("")).await?;
    b.wait("the sign-in form", "document.getElementById('token')")
        .await?;
    b.fill("#token", &soon).await?;
    b.click("#sign-in").await?;
    b.wait(
        "sign-in again once the token expired",
        "document.getElementById('signin-error') && /expired/.test(document.getElementById('signin-error').textContent)",
    )
    .await?;
    let stored = b
        .js("return sessionStorage.getItem('overseer.token')", json!([]))
        .await?;
    assert_eq!(stored, json!(null), "an expired token is forgotten");

    // A stored token the server refuses (it expired while the tab was
    // away): the next request answers 401 and the page says why.
    paste_sign_in(&b, &s, &s.token("acme", "erin")).await?;
    // Once the inbox has loaded, nothing is asked of the server until the
    // next action.
    b.wait("the empty inbox", &shows("No pending approvals"))
        .await?;
    let expired = token_until("acme", "erin", jsonwebtoken::get_current_timestamp() - 60);
    b.js(
        "sessionStorage.setItem('overseer.token', arguments[0])",
        json!([expired]),
    )
    .await?;
    b.click("#nav-new").await?;
    b.wait(
        "the server's refusal at sign-in",
        "document.getElementById('signin-error') && document.getElementById('signin-error').textContent.includes('invalid token: expired')",
    )
    .await?;
    let message = b.text("#signin-error").await?;
    assert!(message.contains("Sign in again"), "{message}");
    assert!(b
        .js("return document.getElementById('top').hidden", json!([]))
        .await?
        .as_bool()
        .unwrap());
    Ok(())
}

// ---- the review desk -------------------------------------------------------------

/// The condition "the card for `call` is shown and `cond` holds of it (`c`)".
fn card_where(call: &str, cond: &str) -> String {
    format!(
        "(() => {{ const c = document.querySelector('.board .card[data-call=' + {} + ']'); return Boolean(c && ({cond})); }})()",
        lit(&format!("\"{call}\""))
    )
}

/// The call ids of the cards shown, in order.
async fn shown_calls(b: &Window) -> anyhow::Result<Vec<String>> {
    let v = b
        .js(
            "return [...document.querySelectorAll('.board .card')].map(c => c.dataset.call)",
            json!([]),
        )
        .await?;
    Ok(serde_json::from_value(v)?)
}

/// Sets a filter control's value as a person would (an input or change event).
async fn set_control(b: &Window, css: &str, value: &str, event: &str) -> Result {
    b.js(
        "const e = document.querySelector(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event(arguments[2], {bubbles: true}));",
        json!([css, value, event]),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_screen_has_no_top_bar() -> Result {
    let s = Served::start().await?;
    let b = Browser::open().await?;
    b.goto(&s.page("")).await?;
    b.wait("the sign-in form", "document.getElementById('token')")
        .await?;
    let top = b
        .js(
            "const t = document.getElementById('top'); const r = t.getBoundingClientRect(); \
             return [t.hidden, getComputedStyle(t).display, r.height, document.getElementById('sign-out').offsetParent === null];",
            json!([]),
        )
        .await?;
    assert_eq!(
        top,
        json!([true, "none", 0, true]),
        "the top bar shows at sign-in"
    );
    // Signed in, it shows; signed out again, it goes.
    paste_sign_in(&b, &s, &s.token("acme", "alice")).await?;
    assert_eq!(
        b.js(
            "return getComputedStyle(document.getElementById('top')).display",
            json!([])
        )
        .await?,
        json!("flex")
    );
    b.click("#sign-out").await?;
    b.wait(
        "the top bar gone at sign-in",
        "document.getElementById('token') && getComputedStyle(document.getElementById('top')).display === 'none'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_of_two_sessions_created_in_the_same_second_differ() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &alice).await?;
    let first = s
        .create(&alice, "ops", "please write record 1", None)
        .await?;
    let second = s
        .create(&alice, "ops", "please write record 2", None)
        .await?;
    // Same time prefix (UUIDv7): what the page used to show.
    assert_eq!(first[..6], second[..6], "{first} {second}");
    let (c1, c2) = (
        s.pending_call(&alice, &first).await?,
        s.pending_call(&alice, &second).await?,
    );
    b.wait(
        "both cards",
        &format!("{} && {}", card_shown(&c1), card_shown(&c2)),
    )
    .await?;
    let label = |call: &str| format!(".card[data-call=\"{call}\"] a.session-link");
    let (l1, l2) = (b.text(&label(&c1)).await?, b.text(&label(&c2)).await?);
    assert_ne!(l1, l2, "two sessions of the same second look the same");
    assert!(
        !l1.contains(&first[..8]) && !l2.contains(&second[..8]),
        "{l1} / {l2}"
    );
    // The session view's title tells them apart too.
    b.goto(&s.page(&format!("#/s/{first}"))).await?;
    b.wait("the first session", "document.querySelector('.status')")
        .await?;
    let h1 = b.text("main h1").await?;
    b.goto(&s.page(&format!("#/s/{second}"))).await?;
    b.wait("the second session", &format!("document.querySelector('main h1') && document.querySelector('main h1').textContent !== {}", lit(&h1)))
        .await?;
    assert_eq!(b.text("main h1").await?, l2);
    assert_eq!(h1, l1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desk_searches_filters_groups_and_orders_by_deadline() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &alice).await?;
    let ledger = s
        .create(
            &alice,
            "ops",
            "please write record 43",
            Some("Quarterly ledger"),
        )
        .await?;
    let ledger_call = s.pending_call(&alice, &ledger).await?;
    let milk = s.create(&alice, "echo", "remember the milk", None).await?;
    let milk_call = s.pending_call(&alice, &milk).await?;
    let pair = s
        .create(&alice, "pair", "please write record 7", Some("Pair"))
        .await?;
    s.pending_call(&alice, &pair).await?;
    let pair_calls: Vec<String> = s
        .api(
            Method::GET,
            &format!("/v1/sessions/{pair}/approvals"),
            &alice,
            None,
        )
        .await?["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pair_calls.len(), 2);
    // Asked last, but denied automatically first (45 s).
    let urgent = s
        .create(&alice, "urgent", "please write record 9", None)
        .await?;
    let urgent_call = s.pending_call(&alice, &urgent).await?;
    b.wait(
        "five cards",
        "document.querySelectorAll('.board .card').length === 5",
    )
    .await?;
    // Newest request first.
    assert_eq!(shown_calls(&b).await?[0], urgent_call);

    // Search: the session's title, the text of the arguments, several words.
    set_control(&b, "input.search", "ledger", "input").await?;
    b.wait(
        "only the ledger",
        "document.querySelectorAll('.board .card').length === 1",
    )
    .await?;
    assert_eq!(shown_calls(&b).await?, vec![ledger_call.clone()]);
    assert!(b.text(".shown-count").await?.contains("Showing 1 of 5"));
    set_control(&b, "input.search", "MILK remember", "input").await?;
    b.wait("only the milk", &card_shown(&milk_call)).await?;
    assert_eq!(shown_calls(&b).await?, vec![milk_call.clone()]);
    set_control(&b, "input.search", "nothing like this", "input").await?;
    b.wait("none shown", "document.querySelectorAll('.board .card').length === 0 && !document.querySelector('.none-shown').hidden").await?;
    set_control(&b, "input.search", "", "input").await?;
    // Filters: agent, tool.
    set_control(&b, "select.filter-agent", "pair", "change").await?;
    b.wait(
        "the pair's two",
        "document.querySelectorAll('.board .card').length === 2",
    )
    .await?;
    set_control(&b, "select.filter-agent", "", "change").await?;
    set_control(&b, "select.filter-tool", "annotate", "change").await?;
    b.wait(
        "the annotate card",
        "document.querySelectorAll('.board .card').length === 1",
    )
    .await?;
    assert_eq!(shown_calls(&b).await?, vec![milk_call.clone()]);
    set_control(&b, "select.filter-tool", "", "change").await?;
    b.wait(
        "all five",
        "document.querySelectorAll('.board .card').length === 5",
    )
    .await?;

    // Grouped by session: the pair's two calls under one heading, with a
    // button that approves both.
    b.click("input.group-by-session").await?;
    b.wait(
        "groups",
        "document.querySelectorAll('.board .group').length === 4",
    )
    .await?;
    let group = format!(".group[data-session=\"{pair}\"]");
    let head = b.text(&format!("{group} .group-head")).await?;
    assert!(
        head.contains("Pair") && head.contains("2 pending"),
        "{head}"
    );
    let in_group: Vec<String> = serde_json::from_value(
        b.js("return [...document.querySelectorAll(arguments[0] + ' .card')].map(c => c.dataset.call)", json!([group]))
            .await?,
    )?;
    assert_eq!(in_group.len(), 2);
    assert!(pair_calls.iter().all(|c| in_group.contains(c)));
    b.click(&format!("{group} button.approve-session")).await?;
    b.wait(
        "the pair's cards gone",
        &format!(
            "{} && {}",
            card_gone(&pair_calls[0]),
            card_gone(&pair_calls[1])
        ),
    )
    .await?;
    b.click("input.group-by-session").await?;

    // By deadline: the urgent call first, marked close to its automatic
    // denial, its countdown ticking every second.
    set_control(&b, "select.order", "deadline", "change").await?;
    b.wait(
        "the urgent card first",
        &format!(
            "document.querySelector('.board .card').dataset.call === {}",
            lit(&urgent_call)
        ),
    )
    .await?;
    assert_eq!(
        shown_calls(&b).await?,
        vec![urgent_call.clone(), ledger_call.clone(), milk_call.clone()]
    );
    b.wait(
        "the urgent card marked",
        &card_where(
            &urgent_call,
            "c.classList.contains('due-soon') && !c.querySelector('.due-mark').hidden",
        ),
    )
    .await?;
    assert!(b
        .text(&format!(".card[data-call=\"{urgent_call}\"] .due-mark"))
        .await?
        .contains("automatic denial"));
    let ledger_marked = b
        .js(
            "return document.querySelector(arguments[0]).classList.contains('due-soon')",
            json!([format!(".card[data-call=\"{ledger_call}\"]")]),
        )
        .await?;
    assert_eq!(ledger_marked, json!(false), "a day away is not close");
    let clock = format!(".card[data-call=\"{urgent_call}\"] time.clock[data-kind=until]");
    let before = b.text(&clock).await?;
    b.wait(
        "the countdown to move",
        &format!(
            "document.querySelector({}).textContent !== {}",
            lit(&clock),
            lit(&before)
        ),
    )
    .await?;
    common::eventually(
        "the pair's two calls to run",
        std::time::Duration::from_millis(50),
        || async {
            let calls = s.tool_calls();
            if calls.len() == 2 {
                Ok(())
            } else {
                Err(format!("{calls:?}"))
            }
        },
    )
    .await;
    let mut keys: Vec<i64> = s
        .tool_calls()
        .iter()
        .map(|(_, a)| a["key"].as_i64().unwrap())
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![7, 8], "only the approved pair ran");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_then_a_reason_then_enter_denies_the_selection() -> Result {
    let s = Served::start().await?;
    let bob = s.token("acme", "bob");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &bob).await?;
    let mut calls = Vec::new();
    for n in 1..=3 {
        let id = s
            .create(&bob, "ops", &format!("please write record {n}"), None)
            .await?;
        calls.push((id.clone(), s.pending_call(&bob, &id).await?));
    }
    let all = calls
        .iter()
        .map(|(_, c)| card_shown(c))
        .collect::<Vec<_>>()
        .join(" && ");
    b.wait("three cards", &all).await?;
    // Select the two newest with the keyboard, then D, a reason, Enter.
    b.js("document.getElementById('main').focus()", json!([]))
        .await?;
    b.keys(&["j", "x", "j", "x"]).await?;
    b.wait("two selected", &shows("2 selected")).await?;
    b.keys(&["D"]).await?;
    b.wait(
        "the reason field focused",
        "document.activeElement.classList.contains('bulk-reason')",
    )
    .await?;
    b.type_into("input.bulk-reason", "not this week").await?;
    b.keys(&["Enter"]).await?;
    let (kept, denied) = (&calls[0], &calls[1..]);
    b.wait(
        "the selection denied",
        &format!("{} && {}", card_gone(&denied[0].1), card_gone(&denied[1].1)),
    )
    .await?;
    assert!(
        b.js(
            &format!("return Boolean({})", card_shown(&kept.1)),
            json!([])
        )
        .await?
        .as_bool()
        .unwrap(),
        "the unselected card stays"
    );
    assert!(s.tool_calls().is_empty(), "a denied call never runs");
    for (id, call) in denied {
        let state = s
            .api(Method::GET, &format!("/v1/sessions/{id}"), &bob, None)
            .await?;
        let text = state.to_string();
        assert!(
            text.contains("Tool denied by user: not this week"),
            "{call}: {text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_sees_no_decide_buttons() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let id = s
        .create(&alice, "ops", "please write record 4", Some("Audit"))
        .await?;
    let call = s.pending_call(&alice, &id).await?;
    let reader = served::token_scoped("acme", "rita", &["sessions:read"]);
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &reader).await?;
    b.wait("the card", &card_shown(&call)).await?;
    let controls = b
        .js(
            "return [...document.querySelectorAll('main button.approve, main button.deny, main button.edit, main .rule-allow, main .rule-reject, main input.select, main .bulk, main .approve-session')].length",
            json!([]),
        )
        .await?;
    assert_eq!(controls, json!(0), "a read-only token is offered decisions");
    assert!(b.text("main").await?.contains("Read-only"));
    assert!(b.text("#whoami").await?.contains("read-only"));
    assert!(b
        .js(
            "return document.getElementById('nav-new').hidden",
            json!([])
        )
        .await?
        .as_bool()
        .unwrap());
    // Keyboard shortcuts decide nothing either.
    b.js("document.querySelector('.board .card').focus()", json!([]))
        .await?;
    b.keys(&["a", "x", "A"]).await?;
    // Grouped, no approve-all; the session view has no cards' buttons.
    b.click("input.group-by-session").await?;
    b.wait("grouped", "document.querySelector('.board .group')")
        .await?;
    assert_eq!(b.count(".approve-session").await?, 0);
    b.goto(&s.page(&format!("#/s/{id}"))).await?;
    b.wait(
        "the session's pending card",
        "document.querySelector('main .card')",
    )
    .await?;
    assert_eq!(b.count("main .card button").await?, 0);
    // Nor does it offer to fork (that creates a session).
    let forks = b
        .js(
            "const f = [...document.querySelectorAll('main button.fork')]; return f.length > 0 && f.every(x => x.hidden)",
            json!([]),
        )
        .await?;
    assert_eq!(forks, json!(true), "a read-only token is offered forks");
    let pending = s
        .api(
            Method::GET,
            &format!("/v1/sessions/{id}/approvals"),
            &alice,
            None,
        )
        .await?;
    assert_eq!(
        pending["pending"][0]["call_id"],
        json!(call),
        "still pending"
    );
    assert!(s.tool_calls().is_empty());
    Ok(())
}

/// "Fork from here" on a transcript entry of the session view (§17): a new
/// session of the tenant with the transcript up to that entry, opened in
/// the page; the source is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_from_here_opens_a_new_session_and_leaves_the_source() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let id = s
        .create(&alice, "ops", "please write record 9", Some("Fork me"))
        .await?;
    let call = s.pending_call(&alice, &id).await?;
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &alice).await?;
    b.goto(&s.page(&format!("#/s/{id}"))).await?;
    b.wait(
        "the fork action on the user's message",
        "document.querySelector('li.entry.user button.fork[data-index=\"1\"]')",
    )
    .await?;
    b.click("li.entry.user button.fork[data-index=\"1\"]")
        .await?;
    let source = lit(&format!("#/s/{id}"));
    b.wait(
        "the fork's page",
        &format!("location.hash.startsWith('#/s/') && location.hash !== {source}"),
    )
    .await?;
    let hash = b.js("return location.hash", json!([])).await?;
    let fork = hash
        .as_str()
        .and_then(|h| h.strip_prefix("#/s/"))
        .context("the fork's id in the address")?
        .to_owned();
    let f = s
        .api(Method::GET, &format!("/v1/sessions/{fork}"), &alice, None)
        .await?;
    assert_eq!(f["forked_from"]["session"], json!(id), "{f}");
    assert_eq!(f["forked_from"]["index"], json!(1), "{f}");
    assert_eq!(f["transcript"][0]["text"], "please write record 9", "{f}");
    let pending = s
        .api(
            Method::GET,
            &format!("/v1/sessions/{id}/approvals"),
            &alice,
            None,
        )
        .await?;
    assert_eq!(
        pending["pending"][0]["call_id"],
        json!(call),
        "the source still waits"
    );
    assert!(s.tool_calls().is_empty(), "nothing ran");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rule_button_stops_the_next_call_from_being_asked() -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &alice).await?;
    // Every card this session ever shows is counted.
    b.js(
        "window.__seen = new Set(); const o = new MutationObserver(() => { for (const c of document.querySelectorAll('.board .card')) window.__seen.add(c.dataset.call); }); o.observe(document, {subtree: true, childList: true});",
        json!([]),
    )
    .await?;
    let id = s
        .create(&alice, "twice", "please write record 3", None)
        .await?;
    let call = s.pending_call(&alice, &id).await?;
    b.wait("the first call's card", &card_shown(&call)).await?;
    // The card explains itself: the model's text and the user's message.
    let why = format!(".card[data-call=\"{call}\"] details.why");
    assert_eq!(
        b.js(
            "return document.querySelector(arguments[0]).open",
            json!([why])
        )
        .await?,
        json!(false),
        "collapsed by default"
    );
    b.click(&format!("{why} summary")).await?;
    let text = b.text(&why).await?;
    assert!(
        text.contains("First: record 3.") && text.contains("please write record 3"),
        "{text}"
    );

    b.click(&format!(".card[data-call=\"{call}\"] button.rule-allow"))
        .await?;
    b.wait("the card gone", &card_gone(&call)).await?;
    // The next call of the tool runs without being asked.
    common::eventually(
        "the turn to end",
        std::time::Duration::from_millis(50),
        || async {
            let state = s
                .api(Method::GET, &format!("/v1/sessions/{id}"), &alice, None)
                .await
                .map_err(|e| e.to_string())?;
            if state["status"] == "awaiting_input" {
                Ok(())
            } else {
                Err(state["status"].to_string())
            }
        },
    )
    .await;
    assert_eq!(
        s.tool_calls(),
        vec![
            ("write_record".to_owned(), json!({"key": 3})),
            ("write_record".to_owned(), json!({"key": 99}))
        ]
    );
    let seen = b.js("return [...window.__seen]", json!([])).await?;
    assert_eq!(seen, json!([call]), "the second call was asked");
    let history = s.api(Method::GET, "/v1/decisions", &alice, None).await?;
    let kinds: Vec<(String, String)> = history["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["decision"].as_str().unwrap().to_owned(),
                d["by"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("rule".into(), "rule:allow".into()),
            ("approve".into(), "alice".into())
        ]
    );
    let state = s
        .api(Method::GET, &format!("/v1/sessions/{id}"), &alice, None)
        .await?;
    assert_eq!(state["tool_rules"], json!({"write_record": "allow"}));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_lists_decisions_made_from_the_api_the_cli_and_the_page_with_their_diffs(
) -> Result {
    let s = Served::start().await?;
    let alice = s.token("acme", "alice");
    let b = Browser::open().await?;
    paste_sign_in(&b, &s, &alice).await?;

    // From the API, with an edit.
    let api_session = s
        .create(&alice, "ops", "please write record 42", Some("By API"))
        .await?;
    let api_call = s.pending_call(&alice, &api_session).await?;
    s.api(
        Method::POST,
        &format!("/v1/sessions/{api_session}/approvals"),
        &alice,
        Some(json!({"decisions": {&api_call: {"decision": "approve", "override_args": {"key": 43}}}})),
    )
    .await?;
    // From the CLI, as carol.
    let cli_session = s
        .create(&alice, "ops", "please write record 5", None)
        .await?;
    let cli_call = s.pending_call(&alice, &cli_session).await?;
    let out = std::process::Command::new(served::BIN)
        .args([
            "sessions",
            "--url",
            &s.url,
            "approve",
            &cli_session,
            "--deny",
            "from the terminal",
        ])
        .env("OVERSEER_TOKEN", s.token("acme", "carol"))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // From the page: an edit that changes a value and removes an optional
    // argument, shown as a diff before it is confirmed.
    let page_session = s.create(&alice, "echo", "remember the milk", None).await?;
    let page_call = s.pending_call(&alice, &page_session).await?;
    b.wait("the page's card", &card_shown(&page_call)).await?;
    let card = format!(".card[data-call=\"{page_call}\"]");
    b.click(&format!("{card} button.edit")).await?;
    b.fill(
        &format!("{card} textarea.args-editor"),
        r#"{"text": "remember the oat milk"}"#,
    )
    .await?;
    b.click(&format!("{card} form.edit button[type=submit]"))
        .await?;
    b.wait(
        "the diff before confirming",
        &format!(
            "!document.querySelector({}).hidden",
            lit(&format!("{card} .edit-preview"))
        ),
    )
    .await?;
    let preview = b.text(&format!("{card} .edit-preview")).await?;
    assert!(
        preview.contains(r#"text: "remember the milk" → "remember the oat milk""#),
        "{preview}"
    );
    assert!(
        preview.contains(r#"note: "optional" → removed"#),
        "{preview}"
    );
    assert!(
        s.tool_calls().iter().all(|(tool, _)| tool != "annotate"),
        "nothing runs before the edit is confirmed"
    );
    b.click(&format!("{card} button.confirm-edit")).await?;
    b.wait("the edited card gone", &card_gone(&page_call))
        .await?;

    // The history: all three, newest first, each with who and its diff.
    b.click("#nav-history").await?;
    b.wait(
        "three decisions",
        "document.querySelectorAll('.decision-row').length === 3",
    )
    .await?;
    let order: Vec<String> = serde_json::from_value(
        b.js(
            "return [...document.querySelectorAll('.decision-row')].map(r => r.dataset.call)",
            json!([]),
        )
        .await?,
    )?;
    assert_eq!(
        order,
        vec![page_call.clone(), cli_call.clone(), api_call.clone()]
    );
    let row = |call: &str| format!(".decision-row[data-call=\"{call}\"]");
    let page_row = b.text(&row(&page_call)).await?;
    for want in [
        "Approved with edits",
        "annotate",
        "by alice",
        r#"note: "optional" → removed"#,
        r#"text: "remember the milk" → "remember the oat milk""#,
    ] {
        assert!(
            page_row.contains(want),
            "the page's row lacks {want:?}: {page_row}"
        );
    }
    let cli_row = b.text(&row(&cli_call)).await?;
    for want in ["Denied", "by carol", "write_record"] {
        assert!(
            cli_row.contains(want),
            "the CLI's row lacks {want:?}: {cli_row}"
        );
    }
    let api_row = b.text(&row(&api_call)).await?;
    for want in ["Approved with edits", "by alice", "key: 42 → 43", "By API"] {
        assert!(
            api_row.contains(want),
            "the API's row lacks {want:?}: {api_row}"
        );
    }
    // Filtered by who decided.
    b.fill(".history-filters input[name=by]", "carol").await?;
    b.click(".history-filters button[type=submit]").await?;
    b.wait("carol's only", &format!("document.querySelectorAll('.decision-row').length === 1 && document.querySelector('.decision-row').dataset.call === {}", lit(&cli_call)))
        .await?;
    // What ran is exactly what was approved (a decision is recorded before
    // its tool runs).
    common::eventually(
        "the approved calls to run",
        std::time::Duration::from_millis(50),
        || async {
            let calls = s.tool_calls();
            if calls.len() >= 2 {
                Ok(())
            } else {
                Err(format!("{calls:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        s.tool_calls(),
        vec![
            ("write_record".to_owned(), json!({"key": 43})),
            (
                "annotate".to_owned(),
                json!({"text": "remember the oat milk"})
            )
        ]
    );
    b.screenshot("history").await?;
    Ok(())
}

// ---- the browser helper itself ---------------------------------------------------

/// Serves `html` at `/` of a loopback server of the test's own (no CSP);
/// its address.
async fn serve_html(html: &'static str) -> anyhow::Result<String> {
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(html) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helper_waits_across_a_reload_and_a_failed_wait_says_what_the_page_showed() -> Result {
    let b = Browser::open().await?;
    b.goto(&serve_html("<p id=p>first</p>").await?).await?;
    // A wait whose document is replaced under it goes on in the new one.
    b.js(
        "window.before = true; setTimeout(() => location.reload(), 200)",
        json!([]),
    )
    .await?;
    b.wait(
        "the reloaded page",
        "window.before === undefined && performance.getEntriesByType('navigation')[0].type === 'reload'",
    )
    .await?;
    // What the page reports is kept, and a wait that fails quotes it with
    // the page's text.
    b.js(
        "console.error('from the page'); setTimeout(() => { throw new Error('thrown later'); }, 0); alert('hello')",
        json!([]),
    )
    .await?;
    b.set_patience(std::time::Duration::from_secs(1));
    let message = b
        .wait("something that never comes", "document.getElementById('q')")
        .await
        .unwrap_err()
        .to_string();
    for want in [
        "waited for something that never comes (document.getElementById('q')): not true after 1s",
        "--- the page showed:\nfirst",
        "console.error: from the page",
        "uncaught: Uncaught Error: thrown later",
        "dialog alert: hello",
    ] {
        assert!(
            message.contains(want),
            "{want:?} is missing from:\n{message}"
        );
    }
    assert_eq!(b.dialogs(), vec!["alert: hello".to_owned()]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helper_clicks_only_what_it_names_and_says_what_covers_it() -> Result {
    let b = Browser::open().await?;
    // A button that jumps away when pressed (as when a list grows above
    // it): the release lands elsewhere; that release and its click are
    // stopped before the page sees them, and the click is tried again.
    b.goto(
        &serve_html(
        "<div id=top></div><button id=b>go</button><p id=log></p>\
         <script>\
           const b = document.getElementById('b'), log = document.getElementById('log');\
           let moved = false;\
           b.addEventListener('mousedown', () => { if (!moved) { moved = true; document.getElementById('top').style.height = '300px'; } });\
           b.addEventListener('click', () => log.textContent += 'button;');\
           document.body.addEventListener('click', (e) => { if (e.target !== b) log.textContent += 'elsewhere;'; });\
         </script>",
        )
        .await?,
    )
    .await?;
    b.click("#b").await?;
    assert_eq!(b.text("#log").await?, "button;");

    // Covered, missing and disabled elements fail saying so.
    b.goto(
        &serve_html(
        "<button id=under>under</button><div id=cover style='position:fixed;inset:0;background:#fff'>cover</div>\
         <button id=off disabled>off</button>",
        )
        .await?,
    )
    .await?;
    b.set_patience(std::time::Duration::from_secs(1));
    let covered = b.click("#under").await.unwrap_err().to_string();
    assert!(
        covered.contains("clicking #under: for 1s its centre showed <div id=\"cover\""),
        "{covered}"
    );
    let missing = b.click("#nothing").await.unwrap_err().to_string();
    assert_eq!(missing, "clicking #nothing: no element matches");
    let disabled = b.click("#off").await.unwrap_err().to_string();
    assert_eq!(disabled, "clicking #off: it is disabled");
    Ok(())
}

// ---- getting a browser -----------------------------------------------------------

/// A `tests/`-like directory with `@sparticuz/chromium` "installed" and an
/// executable script `name` in it.
fn fake_tests_dir(name: &str, script: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("node_modules/@sparticuz/chromium");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("package.json"), "{}").unwrap();
    let program = dir.path().join(name);
    std::fs::write(&program, script).unwrap();
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&program)
        .status()
        .unwrap();
    assert!(status.success());
    let program = program.display().to_string();
    (dir, program)
}

#[test]
fn a_configured_chromium_is_used_as_named_and_must_be_a_file() {
    use common::chromium::{locate, Chromium, ENV};
    use common::npm::Programs;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("my-chromium");
    std::fs::write(&exe, "").unwrap();
    // No npm or node is needed for a configured one.
    let none = Programs {
        node: "overseer-test-no-such-node",
        npm: "overseer-test-no-such-npm",
    };
    assert_eq!(
        locate(Some(exe.clone().into()), dir.path(), none),
        Ok(Chromium::Configured(exe))
    );
    let missing = dir.path().join("no-such-chromium");
    let message = locate(Some(missing.clone().into()), dir.path(), none).unwrap_err();
    assert!(
        message.starts_with(&format!(
            "{ENV} names {}, which is not a file",
            missing.display()
        )),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message}");
}

#[test]
fn chromium_is_unpacked_once_and_an_unpack_that_failed_leaves_no_browser() {
    use common::chromium::{unpacked, ENV};
    use common::npm::Programs;
    // A `node` that does what the package's unpacker does: writes the
    // browser into $TMPDIR and prints its path; it counts its runs.
    let (dir, node) = fake_tests_dir(
        "node",
        "#!/bin/sh\necho run >> \"$(dirname \"$0\")/runs\"\n: > \"$TMPDIR/chromium\"\nprintf %s \"$TMPDIR/chromium\"\n",
    );
    let programs = Programs {
        node: &node,
        npm: "npm",
    };
    let runs = || {
        std::fs::read_to_string(dir.path().join("runs"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let browser = unpacked(dir.path(), programs).unwrap();
    assert_eq!(
        browser,
        dir.path().join("node_modules/.overseer-chromium/chromium")
    );
    assert!(browser.is_file());
    assert_eq!(runs(), 1);
    assert_eq!(unpacked(dir.path(), programs).unwrap(), browser);
    assert_eq!(runs(), 1, "a finished unpack is used as it is");

    // An unpack that did not finish (no mark) is done again.
    std::fs::remove_file(dir.path().join("node_modules/.overseer-chromium/.unpacked")).unwrap();
    assert_eq!(unpacked(dir.path(), programs).unwrap(), browser);
    assert_eq!(runs(), 2);

    // One that fails says why in one line, and leaves nothing to run.
    let (dir, node) = fake_tests_dir(
        "node",
        "#!/bin/sh\n: > \"$TMPDIR/chromium\"\necho 'Error: ENOSPC: no space left on device' >&2\nexit 1\n",
    );
    let message = unpacked(
        dir.path(),
        Programs {
            node: &node,
            npm: "npm",
        },
    )
    .unwrap_err();
    assert!(
        message.starts_with("unpacking Chromium from @sparticuz/chromium failed"),
        "{message}"
    );
    assert!(
        message.contains("ENOSPC: no space left on device"),
        "{message}"
    );
    assert!(message.contains(ENV), "{message}");
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(!dir.path().join("node_modules/.overseer-chromium").exists());
}

#[test]
fn without_node_the_unpack_fails_saying_what_to_install() {
    use common::chromium::unpacked;
    use common::npm::{Programs, INSTALL_HINT};
    let (dir, _) = fake_tests_dir("unused", "");
    let message = unpacked(
        dir.path(),
        Programs {
            node: "overseer-test-no-such-node",
            npm: "npm",
        },
    )
    .unwrap_err();
    assert!(message.contains("overseer-test-no-such-node"), "{message}");
    assert!(message.contains(INSTALL_HINT), "{message}");
    assert!(!message.contains('\n'), "one line: {message}");
    // Without the package in node_modules, it says so.
    std::fs::remove_dir_all(dir.path().join("node_modules/@sparticuz")).unwrap();
    let message = unpacked(dir.path(), Programs::default()).unwrap_err();
    assert!(
        message.contains("@sparticuz/chromium/package.json is missing"),
        "{message}"
    );
}

#[test]
fn a_chromium_that_cannot_start_fails_saying_what_it_printed() {
    let (dir, exe) = fake_tests_dir(
        "chromium",
        "#!/bin/sh\necho 'chromium: error while loading shared libraries: libnss3.so' >&2\nexit 127\n",
    );
    let profile = dir.path().join("profile");
    std::fs::create_dir(&profile).unwrap();
    let message = match browser::start(std::path::Path::new(&exe), &[], &profile) {
        Ok(_) => panic!("a browser that exits started"),
        Err(message) => message,
    };
    assert!(
        message.contains(&format!("Chromium ({exe}) exited")),
        "{message}"
    );
    assert!(message.contains("libnss3.so"), "{message}");
    assert!(message.contains(common::chromium::ENV), "{message}");
    assert!(!message.contains('\n'), "one line: {message}");
}
