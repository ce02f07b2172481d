//! The contract of the `CheckpointStore` port, run against the three stores:
//! the embedded sled store (a temp directory), the PostgreSQL store of
//! cluster mode (a database of a throwaway server, see `common::pg`) and the
//! in-memory store the actors' tests and embedders use (`MemStore`). Each
//! contract is one function; `contract!` turns it into a `sled`, a
//! `postgres` and a `memory` test.
//!
//! Covered: checkpoint and reload (header, transcript, metadata, queued
//! messages), only new rows per checkpoint, events after a sequence (paged,
//! bounded by the header), the effect journal in the header's open calls,
//! large results in content-addressed blobs, refusal of a newer schema
//! (read, or written over by a checkpoint of this binary),
//! tenant listing and the recovery listing, the bounded walk over every
//! session (`scan`), purging a terminal session whole (refused for one that
//! is not), the decision index (newest first, paged, filtered, per tenant,
//! purged with its session), bounded transcript reads, and agent
//! configurations stored once per distinct configuration (shared, read back
//! exactly, also after a restart, and purged with their last session). PostgreSQL-only behaviour (fencing, purge and ownership, blobs
//! left behind, migrations, start-up errors, group commit, the heartbeat's own
//! connection) follows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use overseer::store::postgres::{Owner, PgOpenError, PgOptions, PgStore};
use overseer::store::{Durability, SledStore};
use overseer_actors::model::{
    CallState, Decision, DecisionRecord, EventKind, SessionId, SessionStatus, ToolCallId,
    ToolCallRecord, TranscriptEntry, SCHEMA_VERSION,
};
use overseer_actors::store::{
    all_by_status, CheckpointStore, DecisionKind, DecisionQuery, DecisionRow, StoreError,
};
use overseer_actors::testing::sim::{assert_same, big_result, tool_result, Sim};
use serde_json::json;

use common::pg::{shared, PgServer};

// ---------------------------------------------------------------------------
// The two backends

async fn sled_store() -> (Arc<dyn CheckpointStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
    (Arc::new(store), dir)
}

/// A PostgreSQL store on a fresh database, joined (heartbeat) so that it
/// may claim and write.
async fn pg_store() -> (Arc<dyn CheckpointStore>, PgStore) {
    let url = shared().database().await.unwrap();
    let store = PgStore::open(&url, PgOptions::default()).await.unwrap();
    store
        .heartbeat("http://127.0.0.1:1", Duration::from_secs(10))
        .await
        .unwrap();
    (Arc::new(store.clone()), store)
}

macro_rules! contract {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sled() {
                let (store, _dir) = super::sled_store().await;
                super::$name(store.as_ref()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let (store, _pg) = super::pg_store().await;
                super::$name(store.as_ref()).await;
            }

            #[tokio::test]
            async fn memory() {
                let store = overseer_actors::store::MemStore::new();
                super::$name(&store).await;
            }
        }
    };
}

// ---------------------------------------------------------------------------
// The contract

contract!(checkpoint_and_reload);
async fn checkpoint_and_reload(store: &dyn CheckpointStore) {
    let mut sim = Sim::new("acme");
    sim.user("hello");
    sim.status(SessionStatus::Running);
    sim.push(TranscriptEntry::Assistant {
        text: "calling".into(),
        tool_calls: Vec::new(),
        at_ms: 8,
        finish_reason: None,
    });
    sim.write(store).await;
    assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
    assert_eq!(
        store.load_header(sim.id()).await.unwrap(),
        Some(sim.header.clone())
    );

    // A second checkpoint carries only what is new, and the whole reads back.
    sim.push(tool_result(json!({"time": "now"})));
    sim.status(SessionStatus::AwaitingInput);
    let cp = sim.checkpoint();
    assert_eq!(cp.entries.len(), 1, "only the new entry");
    assert!(cp.metadata.is_none(), "metadata is written once");
    store.checkpoint(cp).await.unwrap();
    assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);

    let unknown = SessionId::generate();
    assert!(store.load(unknown).await.unwrap().is_none());
    assert!(store.load_header(unknown).await.unwrap().is_none());
    assert!(store.events_after(unknown, 0, 10).await.unwrap().is_empty());
}

contract!(events_after_a_sequence);
async fn events_after_a_sequence(store: &dyn CheckpointStore) {
    let mut sim = Sim::new("acme");
    let mut other = Sim::new("acme");
    for turn in 1..=24 {
        sim.emit(EventKind::TurnStarted { turn });
        other.emit(EventKind::TurnStarted { turn });
    }
    sim.write(store).await;
    other.write(store).await;
    assert_eq!(sim.events.len(), 25);
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events_after(sim.id(), after, 10).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        after = page.last().unwrap().seq;
        seen.extend(page);
    }
    assert_eq!(seen, sim.events);
    let page = store.events_after(sim.id(), 10, 10).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (11..=20).collect::<Vec<_>>()
    );
    assert!(store
        .events_after(sim.id(), 25, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .events_after(sim.id(), u64::MAX, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store.events_after(sim.id(), 0, 0).await.unwrap().is_empty());
    assert_eq!(
        store.events_after(sim.id(), 0, usize::MAX).await.unwrap(),
        sim.events
    );
}

contract!(the_effect_journal_lives_in_the_header);
async fn the_effect_journal_lives_in_the_header(store: &dyn CheckpointStore) {
    // A dispatched call with no outcome yet (intent durable), and one whose
    // outcome is recorded but not yet in the transcript: exactly what boot
    // recovery sorts (§9).
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::Running);
    let mut running = ToolCallRecord::proposed(
        ToolCallId::generate(),
        "ledger_append".into(),
        json!({"entry": "x"}),
        3,
    );
    running.state = CallState::Running;
    running.attempt = 1;
    running.idempotency_key = Some("key-1".into());
    let mut done =
        ToolCallRecord::proposed(ToolCallId::generate(), "current_time".into(), json!({}), 3);
    done.finish(CallState::Completed, json!({"time": "t"}), 5);
    sim.header.open_calls = vec![running, done];
    sim.write(store).await;
    let stored = store.load(sim.id()).await.unwrap().unwrap();
    assert_eq!(stored.header.open_calls, sim.header.open_calls);
    assert_eq!(
        all_by_status(
            store,
            &[SessionStatus::Running, SessionStatus::AwaitingApproval],
            2
        )
        .await
        .unwrap(),
        vec![sim.header.clone()],
        "boot recovery finds it"
    );
}

contract!(large_results_go_to_blobs);
async fn large_results_go_to_blobs(store: &dyn CheckpointStore) {
    let mut a = Sim::new("acme");
    let mut b = Sim::new("acme");
    a.user("fetch it");
    a.push(tool_result(big_result()));
    a.push(tool_result(json!({"small": true})));
    b.push(tool_result(big_result()));
    b.push(tool_result(big_result()));
    a.write(store).await;
    b.write(store).await;
    assert_same(&store.load(a.id()).await.unwrap().unwrap(), &a);
    assert_same(&store.load(b.id()).await.unwrap().unwrap(), &b);
}

contract!(a_newer_schema_is_refused);
async fn a_newer_schema_is_refused(store: &dyn CheckpointStore) {
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::Running);
    sim.header.schema_version = SCHEMA_VERSION + 1;
    sim.write(store).await;
    let refused = |e: StoreError| match e {
        StoreError::SchemaTooNew {
            session,
            found,
            supported,
        } => {
            assert_eq!(session, sim.id());
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    };
    refused(store.load(sim.id()).await.unwrap_err());
    refused(store.load_header(sim.id()).await.unwrap_err());
    // Boot recovery must not skip it silently.
    refused(
        all_by_status(store, &[SessionStatus::Running], 2)
            .await
            .unwrap_err(),
    );
    let message = store.load(sim.id()).await.unwrap_err().to_string();
    assert!(message.contains("upgrade overseer"), "{message}");
}

contract!(a_checkpoint_over_a_newer_schema_is_refused_and_writes_nothing);
async fn a_checkpoint_over_a_newer_schema_is_refused_and_writes_nothing(
    store: &dyn CheckpointStore,
) {
    // A newer binary wrote the session (a rolling upgrade, rolled back)...
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::Running);
    sim.header.schema_version = SCHEMA_VERSION + 1;
    sim.write(store).await;
    let written = sim.events.len();
    // ...and this one, which knows less of it, checkpoints it again: the
    // header it would write drops what it does not know, so it must not
    // land, nor anything of its checkpoint.
    sim.header.schema_version = SCHEMA_VERSION;
    sim.user("from the older binary");
    sim.status(SessionStatus::Cancelled);
    match store.checkpoint(sim.checkpoint()).await {
        Err(StoreError::SchemaTooNew {
            session,
            found,
            supported,
        }) => {
            assert_eq!(session, sim.id());
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    match store.load_header(sim.id()).await {
        Err(StoreError::SchemaTooNew { found, .. }) => assert_eq!(found, SCHEMA_VERSION + 1),
        other => panic!("the newer header was replaced: {other:?}"),
    }
    match store.events_after(sim.id(), 0, usize::MAX).await {
        Ok(events) => assert_eq!(events.len(), written, "{events:?}"),
        Err(StoreError::SchemaTooNew { .. }) => {}
        Err(other) => panic!("{other:?}"),
    }
}

contract!(queued_messages_and_metadata);
async fn queued_messages_and_metadata(store: &dyn CheckpointStore) {
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::Running);
    sim.enqueue("first");
    sim.enqueue("second");
    sim.write(store).await;
    assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
    let header = store.load_header(sim.id()).await.unwrap().unwrap();
    let json = serde_json::to_string(&header).unwrap();
    assert!(
        !json.contains("first") && !json.contains("ünïcode"),
        "{json}"
    );
    sim.dequeue();
    sim.enqueue("third");
    sim.write(store).await;
    let stored = store.load(sim.id()).await.unwrap().unwrap();
    assert_same(&stored, &sim);
    let texts: Vec<&str> = stored.inbox.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["second", "third"]);
    // Queued and taken in the same checkpoint.
    sim.enqueue("fourth");
    sim.dequeue();
    sim.dequeue();
    sim.dequeue();
    sim.write(store).await;
    let stored = store.load(sim.id()).await.unwrap().unwrap();
    assert!(stored.inbox.is_empty(), "{:?}", stored.inbox);
    assert_same(&stored, &sim);
}

contract!(tenants_are_listed_apart_and_paged);
async fn tenants_are_listed_apart_and_paged(store: &dyn CheckpointStore) {
    let mut want = Vec::new();
    for tenant in ["acme", "acme", "acm", "acme2", "acme", "acme", "acme"] {
        let mut sim = Sim::new(tenant);
        sim.write(store).await;
        if tenant == "acme" {
            want.push(sim.header.clone());
        }
    }
    want.sort_by_key(|h| h.id);
    let mut got = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list_tenant("acme", cursor, 2).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        cursor = page.last().map(|h| h.id);
        got.extend(page);
    }
    assert_eq!(got, want);
    assert_eq!(store.list_tenant("acm", None, 10).await.unwrap().len(), 1);
    assert!(store
        .list_tenant("other", None, 10)
        .await
        .unwrap()
        .is_empty());
}

contract!(recovery_lists_only_active_sessions);
async fn recovery_lists_only_active_sessions(store: &dyn CheckpointStore) {
    let mut active = Vec::new();
    for status in [
        SessionStatus::Running,
        SessionStatus::AwaitingInput,
        SessionStatus::AwaitingApproval,
        SessionStatus::Completed,
    ] {
        let mut sim = Sim::new("acme");
        sim.status(status);
        sim.write(store).await;
        if matches!(
            status,
            SessionStatus::Running | SessionStatus::AwaitingApproval
        ) {
            active.push(sim.header.clone());
        }
    }
    let mut got = all_by_status(
        store,
        &[SessionStatus::Running, SessionStatus::AwaitingApproval],
        2,
    )
    .await
    .unwrap();
    got.sort_by_key(|h| h.id);
    active.sort_by_key(|h| h.id);
    assert_eq!(got, active);
    assert_eq!(all_by_status(store, &[], 2).await.unwrap().len(), 4);
}

contract!(scan_walks_every_session_in_bounded_pages);
async fn scan_walks_every_session_in_bounded_pages(store: &dyn CheckpointStore) {
    let mut want = Vec::new();
    for (tenant, status) in [
        ("a", SessionStatus::Running),
        ("b", SessionStatus::Completed),
        ("a", SessionStatus::AwaitingInput),
        ("c", SessionStatus::Pending),
        ("b", SessionStatus::Failed),
    ] {
        let mut sim = Sim::new(tenant);
        sim.status(status);
        sim.write(store).await;
        want.push(sim.header.clone());
    }
    want.sort_by_key(|h| h.id);
    let mut got = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = store.scan(after, 2).await.unwrap();
        assert!(page.len() <= 2, "{} headers in a page of 2", page.len());
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        got.extend(page);
        pages += 1;
        assert!(pages <= want.len(), "the walk does not end");
    }
    assert_eq!(got, want, "every header once, ascending by id");
    assert!(store.scan(None, 0).await.unwrap().is_empty());
    assert_eq!(store.scan(None, 100).await.unwrap(), want);
    assert_eq!(
        store.scan(Some(want[2].id), 100).await.unwrap(),
        want[3..].to_vec(),
        "strictly after the cursor"
    );
}

contract!(purge_removes_a_terminal_session_whole);
async fn purge_removes_a_terminal_session_whole(store: &dyn CheckpointStore) {
    // `gone` shares one large result with `kept` and has one of its own;
    // events, queued messages and metadata too.
    let mut gone = Sim::new("acme");
    gone.user("fetch");
    gone.push(tool_result(big_result()));
    gone.push(tool_result(json!({"own": "x".repeat(70 * 1024)})));
    gone.enqueue("later");
    gone.status(SessionStatus::Running);
    gone.write(store).await;
    gone.status(SessionStatus::Completed);
    gone.write(store).await;
    let mut kept = Sim::new("acme");
    kept.push(tool_result(big_result()));
    kept.status(SessionStatus::Completed);
    kept.write(store).await;

    store.purge(gone.id()).await.unwrap();
    assert!(store.load(gone.id()).await.unwrap().is_none());
    assert!(store.load_header(gone.id()).await.unwrap().is_none());
    assert!(store
        .events_after(gone.id(), 0, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.list_tenant("acme", None, 10).await.unwrap(),
        vec![kept.header.clone()]
    );
    assert_eq!(
        store.scan(None, 10).await.unwrap(),
        vec![kept.header.clone()]
    );
    assert_eq!(
        all_by_status(store, &[], 2).await.unwrap(),
        vec![kept.header.clone()]
    );
    // The blob `kept` still names is still there.
    assert_same(&store.load(kept.id()).await.unwrap().unwrap(), &kept);

    // Purging again, or a session that never was, does nothing.
    store.purge(gone.id()).await.unwrap();
    store.purge(SessionId::generate()).await.unwrap();

    // Once `kept` is gone too, a new session with the same large result
    // stores it again and reads it back.
    store.purge(kept.id()).await.unwrap();
    assert!(store.load(kept.id()).await.unwrap().is_none());
    let mut again = Sim::new("acme");
    again.push(tool_result(big_result()));
    again.write(store).await;
    assert_same(&store.load(again.id()).await.unwrap().unwrap(), &again);
}

contract!(purging_a_session_that_has_not_ended_is_refused);
async fn purging_a_session_that_has_not_ended_is_refused(store: &dyn CheckpointStore) {
    for status in [
        SessionStatus::Pending,
        SessionStatus::Running,
        SessionStatus::AwaitingInput,
        SessionStatus::AwaitingApproval,
    ] {
        let mut sim = Sim::new("acme");
        sim.user("hello");
        sim.push(tool_result(big_result()));
        sim.status(status);
        sim.write(store).await;
        match store.purge(sim.id()).await {
            Err(StoreError::NotTerminal {
                session,
                status: found,
            }) => {
                assert_eq!(session, sim.id());
                assert_eq!(found, status);
            }
            other => panic!("purging a {status} session: expected NotTerminal, got {other:?}"),
        }
        let message = store.purge(sim.id()).await.unwrap_err().to_string();
        assert!(message.contains(&sim.id().to_string()), "{message}");
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events,
            "nothing deleted"
        );
    }
    for status in [SessionStatus::Failed, SessionStatus::Cancelled] {
        let mut sim = Sim::new("acme");
        sim.status(status);
        sim.write(store).await;
        store.purge(sim.id()).await.unwrap();
        assert!(store.load(sim.id()).await.unwrap().is_none(), "{status}");
    }
}

/// A call of `tool` waiting for a decision in `sim`'s open step.
fn ask(sim: &mut Sim, tool: &str) -> ToolCallId {
    let mut call =
        ToolCallRecord::proposed(ToolCallId::generate(), tool.into(), json!({"k": 1}), 3);
    call.state = CallState::AwaitingApproval;
    let id = call.id.clone();
    sim.header.open_calls.push(call);
    id
}

/// Records `decision` by `by` at `at_ms` for `call` of the open step.
fn decide(
    sim: &mut Sim,
    call: &ToolCallId,
    decision: Decision,
    by: &str,
    at_ms: i64,
    diff: Option<serde_json::Value>,
) {
    let record = DecisionRecord {
        decision,
        by: Some(by.into()),
        at_ms,
        metadata: None,
        args_diff: diff,
    };
    let open = sim
        .header
        .open_calls
        .iter_mut()
        .find(|c| &c.id == call)
        .unwrap();
    open.decision = Some(record.clone());
    open.state = CallState::Approved;
    sim.emit(EventKind::DecisionRecorded {
        call_id: call.clone(),
        record,
    });
}

/// Moves the open step's calls into the transcript (the step closes).
fn close_step(sim: &mut Sim) {
    for mut call in std::mem::take(&mut sim.header.open_calls) {
        call.finish(CallState::Completed, json!({"ok": true}), 5);
        sim.push(TranscriptEntry::ToolResult { call });
    }
}

fn query(limit: usize) -> DecisionQuery {
    DecisionQuery {
        limit,
        ..DecisionQuery::default()
    }
}

/// Every row of the tenant's history under `q`, page by page.
async fn history(
    store: &dyn CheckpointStore,
    tenant: &str,
    mut q: DecisionQuery,
) -> Vec<DecisionRow> {
    let mut out = Vec::new();
    for _ in 0..100 {
        let page = store.decisions(tenant, &q).await.unwrap();
        assert!(page.rows.len() <= q.limit, "a page holds at most its limit");
        out.extend(page.rows);
        match page.next {
            Some(next) => q.before = Some(next),
            None => return out,
        }
    }
    panic!("the history did not end within 100 pages");
}

fn times(rows: &[DecisionRow]) -> Vec<i64> {
    rows.iter().map(|r| r.at_ms).collect()
}

contract!(decisions_are_indexed_per_tenant_newest_first_and_purged_with_their_session);
async fn decisions_are_indexed_per_tenant_newest_first_and_purged_with_their_session(
    store: &dyn CheckpointStore,
) {
    // `one` (agent a, titled): an approval, a denial, and an edit whose
    // checkpoint also closes the step (the call is then only in the new
    // transcript entries).
    let mut one = Sim::new("acme");
    one.header.title = Some("Ledger".into());
    let (c1, c2, c3) = (
        ask(&mut one, "write"),
        ask(&mut one, "fetch"),
        ask(&mut one, "write"),
    );
    one.status(SessionStatus::AwaitingApproval);
    one.write(store).await;
    decide(&mut one, &c1, Decision::approve(), "alice", 100, None);
    one.write(store).await;
    decide(&mut one, &c2, Decision::deny("not today"), "bob", 200, None);
    let edit = Decision::Approve {
        override_args: json!({"k": 2}).as_object().cloned(),
        remove_args: Vec::new(),
    };
    decide(
        &mut one,
        &c3,
        edit,
        "alice",
        300,
        Some(json!({"k": {"from": 1, "to": 2}})),
    );
    close_step(&mut one);
    one.status(SessionStatus::Running);
    one.write(store).await;
    // `two` (agent b): a timeout and a standing rule.
    let mut two = Sim::new("acme");
    two.header.agent = "b".into();
    let (t1, t2) = (ask(&mut two, "write"), ask(&mut two, "write"));
    decide(
        &mut two,
        &t1,
        Decision::deny("No approval decision received"),
        "system",
        150,
        None,
    );
    decide(&mut two, &t2, Decision::approve(), "rule:allow", 250, None);
    two.status(SessionStatus::Running);
    two.write(store).await;
    // Another tenant's decision, between them in time.
    let mut other = Sim::new("globex");
    let g = ask(&mut other, "write");
    decide(&mut other, &g, Decision::approve(), "eve", 275, None);
    other.write(store).await;

    let all = history(store, "acme", query(50)).await;
    assert_eq!(times(&all), vec![300, 250, 200, 150, 100]);
    let kinds: Vec<DecisionKind> = all.iter().map(|r| r.decision).collect();
    assert_eq!(
        kinds,
        vec![
            DecisionKind::ApproveWithEdit,
            DecisionKind::Rule,
            DecisionKind::Deny,
            DecisionKind::Timeout,
            DecisionKind::Approve
        ]
    );
    let edit = &all[0];
    assert_eq!(edit.session_id, one.id());
    assert_eq!(edit.root_session_id, one.id());
    assert_eq!(edit.agent, "a");
    assert_eq!(edit.title.as_deref(), Some("Ledger"));
    assert_eq!(edit.call_id, c3);
    assert_eq!(edit.tool, "write", "found in the step's closing entries");
    assert_eq!(edit.by.as_deref(), Some("alice"));
    assert!(edit.approved);
    assert_eq!(edit.args_diff, Some(json!({"k": {"from": 1, "to": 2}})));
    let denial = &all[2];
    assert_eq!((denial.tool.as_str(), denial.approved), ("fetch", false));
    assert_eq!(denial.reason.as_deref(), Some("not today"));
    assert!(all.iter().all(|r| r.tenant == "acme"));

    // Pages of two give the same rows; a page after the newest starts below it.
    assert_eq!(history(store, "acme", query(2)).await, all);
    let first = store.decisions("acme", &query(2)).await.unwrap();
    assert_eq!(times(&first.rows), vec![300, 250]);
    assert_eq!(first.next, Some(all[1].position()));
    let after_newest = DecisionQuery {
        before: Some(all[0].position()),
        ..query(50)
    };
    assert_eq!(
        times(&history(store, "acme", after_newest).await),
        vec![250, 200, 150, 100]
    );
    // The last page says there is no more.
    let last = store.decisions("acme", &query(5)).await.unwrap();
    assert_eq!(last.rows.len(), 5);
    assert_eq!(last.next, None);

    // Each filter, exact.
    let by_agent = DecisionQuery {
        agent: Some("b".into()),
        ..query(1)
    };
    assert_eq!(
        times(&history(store, "acme", by_agent).await),
        vec![250, 150]
    );
    let by_tool = DecisionQuery {
        tool: Some("fetch".into()),
        ..query(1)
    };
    assert_eq!(times(&history(store, "acme", by_tool).await), vec![200]);
    let by_who = DecisionQuery {
        by: Some("alice".into()),
        ..query(1)
    };
    assert_eq!(times(&history(store, "acme", by_who).await), vec![300, 100]);
    let nobody = DecisionQuery {
        by: Some("mallory".into()),
        ..query(3)
    };
    assert!(history(store, "acme", nobody).await.is_empty());

    // Tenants apart: each sees its own, whatever the cursor.
    assert_eq!(times(&history(store, "globex", query(10)).await), vec![275]);
    let foreign_cursor = DecisionQuery {
        before: Some(all[0].position()),
        ..query(10)
    };
    assert_eq!(
        times(&history(store, "globex", foreign_cursor).await),
        vec![275]
    );
    assert!(history(store, "initech", query(10)).await.is_empty());

    // Purging a session removes its rows, and only its.
    one.status(SessionStatus::Completed);
    one.write(store).await;
    store.purge(one.id()).await.unwrap();
    assert_eq!(
        times(&history(store, "acme", query(10)).await),
        vec![250, 150]
    );
    assert_eq!(times(&history(store, "globex", query(10)).await), vec![275]);
}

contract!(entries_read_a_bounded_range_of_the_committed_transcript);
async fn entries_read_a_bounded_range_of_the_committed_transcript(store: &dyn CheckpointStore) {
    let mut sim = Sim::new("acme");
    for n in 0..6 {
        sim.user(&format!("m{n}"));
    }
    sim.push(tool_result(big_result()));
    sim.write(store).await;
    let texts = |entries: Vec<Arc<TranscriptEntry>>| -> Vec<String> {
        entries
            .iter()
            .map(|e| match &**e {
                TranscriptEntry::User { text, .. } => text.clone(),
                TranscriptEntry::ToolResult { .. } => "result".into(),
                other => format!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(
        texts(store.entries(sim.id(), 2..4).await.unwrap()),
        vec!["m2", "m3"]
    );
    // Past the end: what there is; a blob is read back whole.
    let tail = store.entries(sim.id(), 5..100).await.unwrap();
    assert_eq!(texts(tail.clone()), vec!["m5", "result"]);
    assert_eq!(*tail[1], *sim.transcript[6]);
    assert!(store.entries(sim.id(), 7..9).await.unwrap().is_empty());
    assert!(store.entries(sim.id(), 3..3).await.unwrap().is_empty());
    assert!(store
        .entries(SessionId::generate(), 0..5)
        .await
        .unwrap()
        .is_empty());
}

contract!(a_configuration_is_stored_once_and_goes_with_its_last_session);
async fn a_configuration_is_stored_once_and_goes_with_its_last_session(
    store: &dyn CheckpointStore,
) {
    // Two sessions of one agent under one configuration, checkpointed
    // several times each (side by side, so a group may hold both): it is
    // stored once.
    let mut a = Sim::new("acme");
    let mut b = Sim::new("acme");
    assert_eq!(a.header.config, b.header.config);
    for status in [SessionStatus::Running, SessionStatus::Completed] {
        a.status(status);
        b.status(status);
        let (ca, cb) = (a.checkpoint(), b.checkpoint());
        store.claim(a.header.root_id).await.unwrap();
        store.claim(b.header.root_id).await.unwrap();
        let (ra, rb) = futures::join!(store.checkpoint(ca), store.checkpoint(cb));
        ra.unwrap();
        rb.unwrap();
        assert_eq!(store.stored_configs().await.unwrap(), 1);
    }
    // Read back whole, every way a header is read.
    for sim in [&a, &b] {
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
        assert_eq!(
            store.load_header(sim.id()).await.unwrap().as_ref(),
            Some(&sim.header)
        );
    }
    let listed = store.list_tenant("acme", None, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|h| h.config == a.header.config));
    assert_eq!(store.scan(None, 10).await.unwrap().len(), 2);

    // A session that moves to a configuration of its own: one more, and the
    // one it leaves stays for the others.
    let mut c = Sim::new("acme");
    c.write(store).await;
    assert_eq!(store.stored_configs().await.unwrap(), 1);
    c.header.config.make_mut().model = "other-model".into();
    c.status(SessionStatus::Running);
    c.write(store).await;
    assert_eq!(store.stored_configs().await.unwrap(), 2);
    assert_same(&store.load(c.id()).await.unwrap().unwrap(), &c);
    // ... and moving again, it leaves nobody on the one it had: gone.
    c.header.config.make_mut().max_steps = 3;
    c.status(SessionStatus::Cancelled);
    c.write(store).await;
    assert_eq!(store.stored_configs().await.unwrap(), 2);
    assert_same(&store.load(c.id()).await.unwrap().unwrap(), &c);

    // Purging one of the sharers keeps it for the other; the last takes it.
    store.purge(a.id()).await.unwrap();
    assert_eq!(store.stored_configs().await.unwrap(), 2);
    assert_same(&store.load(b.id()).await.unwrap().unwrap(), &b);
    store.purge(c.id()).await.unwrap();
    assert_eq!(store.stored_configs().await.unwrap(), 1);
    store.purge(b.id()).await.unwrap();
    assert_eq!(store.stored_configs().await.unwrap(), 0);

    // A new session under it stores it again.
    let mut again = Sim::new("acme");
    again.write(store).await;
    assert_eq!(store.stored_configs().await.unwrap(), 1);
    assert_same(&store.load(again.id()).await.unwrap().unwrap(), &again);
}

/// Sessions written under configurations of their own and under a shared
/// one, for [`read_after_restart`].
async fn write_for_restart(before: &dyn CheckpointStore) -> Vec<Sim> {
    let mut sims = Vec::new();
    for n in 0..3 {
        let mut sim = Sim::new("acme");
        if n > 0 {
            let config = sim.header.config.make_mut();
            config.instructions = format!("Session {n}: \"quoted\", ünïcode ✓");
            config.tool_approvals.insert("current_time".into(), n == 1);
        }
        sim.status(SessionStatus::AwaitingApproval);
        sim.write(before).await;
        sims.push(sim);
    }
    let mut shared = Sim::new("acme");
    shared.status(SessionStatus::AwaitingApproval);
    shared.write(before).await;
    sims.push(shared);
    assert_eq!(before.stored_configs().await.unwrap(), 3);
    sims
}

/// Read by a store opened afresh on the same data (a restart): each header
/// carries exactly its configuration, whose hash is the one it was written
/// with.
async fn read_after_restart(after: &dyn CheckpointStore, sims: &[Sim]) {
    assert_eq!(after.stored_configs().await.unwrap(), 3);
    for sim in sims {
        let stored = after.load(sim.id()).await.unwrap().unwrap();
        assert_same(&stored, sim);
        assert_eq!(stored.header.config.hash(), sim.header.config.hash());
        assert_eq!(
            serde_json::to_string(&stored.header.config).unwrap(),
            serde_json::to_string(&sim.header.config).unwrap()
        );
    }
    // Boot recovery's listing too.
    let active = all_by_status(after, &[SessionStatus::AwaitingApproval], 2)
        .await
        .unwrap();
    let mut want: Vec<_> = sims.iter().map(|s| s.header.clone()).collect();
    want.sort_by_key(|h| h.id);
    assert_eq!(active, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_configurations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
    let sims = write_for_restart(&store).await;
    drop(store);
    let reopened = SledStore::open(dir.path(), Durability::Fsync).unwrap();
    read_after_restart(&reopened, &sims).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_configurations_survive_a_restart() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    let sims = write_for_restart(&store).await;
    drop(store);
    let reopened = PgStore::open(&url, PgOptions::default()).await.unwrap();
    read_after_restart(&reopened, &sims).await;
}

// ---------------------------------------------------------------------------
// PostgreSQL only

async fn open_pg(url: &str, lease: Duration) -> PgStore {
    let store = PgStore::open(
        url,
        PgOptions {
            lease,
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    store
        .heartbeat(&format!("http://node-{}", store.node_id()), lease)
        .await
        .unwrap();
    store
}

/// Two nodes on one database: while the owner lives the other may not claim
/// its tree; once the owner's heartbeat is older than the lease the other
/// takes it with a new epoch, and the old owner — even with a fresh
/// heartbeat, as after a pause — lands no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_lease_lands_no_write() {
    let url = shared().database().await.unwrap();
    let lease = Duration::from_secs(2);
    let a = open_pg(&url, lease).await;
    let b = open_pg(&url, lease).await;
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::AwaitingApproval);
    sim.write(&a).await;
    assert_eq!(a.owner(sim.id()).await.unwrap(), Owner::Here);
    match b.claim(sim.id()).await {
        Err(StoreError::NotOwner { reason, .. }) => {
            assert!(reason.contains(&a.node_id().to_string()), "{reason}")
        }
        other => panic!("expected NotOwner, got {other:?}"),
    }
    // B sees A as the owner; A stops heartbeating (paused).
    assert!(
        matches!(b.owner(sim.id()).await.unwrap(), Owner::Node { id, .. } if id == a.node_id())
    );
    let taken = wait_for(Duration::from_secs(30), || async {
        b.heartbeat("http://b", lease).await.unwrap();
        b.claim(sim.id()).await.ok()
    })
    .await;
    assert!(
        taken,
        "B claims the tree once A's heartbeat is older than the lease"
    );
    let mut later = sim.clone();
    later.status(SessionStatus::Running);
    b.checkpoint(later.checkpoint()).await.unwrap();

    // A comes back: a fresh heartbeat, but the epoch it holds is old.
    a.heartbeat("http://a", lease).await.unwrap();
    sim.status(SessionStatus::Cancelled);
    let err = a.checkpoint(sim.checkpoint()).await.unwrap_err();
    assert!(err.is_not_owner(), "{err:?}");
    let stored = b.load(sim.id()).await.unwrap().unwrap();
    assert_eq!(stored.header, later.header, "A's write did not land");
    // And A now knows: it no longer claims to hold the tree.
    assert_eq!(a.leases_held(), 0);
    assert!(
        matches!(a.owner(sim.id()).await.unwrap(), Owner::Node { id, .. } if id == b.node_id())
    );
}

/// An actor can outlive its node's leases: a restart's read or an
/// activation in flight while the leases were dropped spawns it after the
/// drop, and the take-back that ran meanwhile skipped it as live. Its write
/// is refused (this node holds no lease of its tree), and since its lease
/// row still names this node no other node will ever take it: the refusal
/// owes a take-back, which finds the tree and claims it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_for_want_of_a_lease_owes_the_take_back_of_its_tree() {
    let url = shared().database().await.unwrap();
    let a = open_pg(&url, Duration::from_secs(30)).await;
    a.heartbeat("http://a", Duration::from_secs(30))
        .await
        .unwrap();
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::AwaitingApproval);
    sim.write(&a).await;
    assert!(!a.take_let_go(), "nothing was let go yet");
    // The leases forgotten in memory, the node itself alive (its clock
    // valid): what an actor spawned after the drop finds.
    a.sweep_leases(Duration::ZERO, |_| false);
    assert_eq!(a.leases_held(), 0);
    sim.status(SessionStatus::Running);
    let err = a.checkpoint(sim.checkpoint()).await.unwrap_err();
    assert!(err.is_not_owner(), "{err:?}");
    assert!(
        a.take_let_go(),
        "a write refused for want of a lease owes a take-back"
    );
    let own = a.own_unheld_roots(usize::MAX, |_| true).await.unwrap();
    assert_eq!(own, vec![sim.id()], "the take-back finds the tree");
    assert!(a.claim(sim.id()).await.unwrap(), "and claims it again");
    a.checkpoint(sim.checkpoint()).await.unwrap();
    let stored = a.load(sim.id()).await.unwrap().unwrap();
    assert_eq!(stored.header, sim.header);
}

/// What a purge leaves in the tables: no blob another session does not
/// name, no lease of a tree with no session left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_deletes_unnamed_blobs_and_the_lease_of_an_emptied_tree() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    let count = |sql: &'static str| {
        let url = url.clone();
        async move { PgServer::scalar(&url, sql).await.unwrap() }
    };
    let mut gone = Sim::new("acme");
    gone.push(tool_result(big_result()));
    gone.push(tool_result(json!({"own": "y".repeat(70 * 1024)})));
    gone.status(SessionStatus::Completed);
    gone.write(&store).await;
    let mut kept = Sim::new("acme");
    kept.push(tool_result(big_result()));
    kept.status(SessionStatus::Cancelled);
    kept.write(&store).await;
    assert_eq!(count("SELECT count(*) FROM blobs").await, 2);
    assert_eq!(count("SELECT count(*) FROM leases").await, 2);

    store.purge(gone.id()).await.unwrap();
    assert_eq!(
        count("SELECT count(*) FROM blobs").await,
        1,
        "the shared one stays"
    );
    for table in ["checkpoints", "queue"] {
        let sql = format!(
            "SELECT count(*) FROM {table} WHERE session_id = '{}'",
            gone.id()
        );
        assert_eq!(PgServer::scalar(&url, &sql).await.unwrap(), 0, "{table}");
    }
    assert_eq!(count("SELECT count(*) FROM leases").await, 1);
    assert_eq!(
        store.leases_held(),
        1,
        "the node forgets the released lease"
    );

    store.purge(kept.id()).await.unwrap();
    assert_eq!(count("SELECT count(*) FROM blobs").await, 0);
    assert_eq!(count("SELECT count(*) FROM sessions").await, 0);
    assert_eq!(count("SELECT count(*) FROM checkpoints").await, 0);
    assert_eq!(count("SELECT count(*) FROM leases").await, 0);
}

/// The node that owns a tree purges its sessions (it knows whether their
/// actors still run); another live node is refused and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_of_a_live_tree_purges_it() {
    let url = shared().database().await.unwrap();
    let lease = Duration::from_secs(30);
    let a = open_pg(&url, lease).await;
    let b = open_pg(&url, lease).await;
    let mut sim = Sim::new("acme");
    sim.push(tool_result(big_result()));
    sim.status(SessionStatus::Completed);
    sim.write(&a).await;
    match b.purge(sim.id()).await {
        Err(StoreError::NotOwner { session, reason }) => {
            assert_eq!(session, sim.id());
            assert!(reason.contains(&a.node_id().to_string()), "{reason}");
        }
        other => panic!("expected NotOwner, got {other:?}"),
    }
    assert_same(&b.load(sim.id()).await.unwrap().unwrap(), &sim);
    a.purge(sim.id()).await.unwrap();
    assert!(b.load(sim.id()).await.unwrap().is_none());
}

/// A purge and checkpoints of other sessions taking up the blob it would
/// delete, at the same time: every session written reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_never_deletes_a_blob_a_concurrent_checkpoint_names() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    for round in 0..20 {
        let result = json!({"round": round, "body": "z".repeat(80 * 1024)});
        let mut gone = Sim::new("acme");
        gone.push(tool_result(result.clone()));
        gone.status(SessionStatus::Completed);
        gone.write(&store).await;
        let mut takers: Vec<Sim> = (0..3)
            .map(|_| {
                let mut sim = Sim::new("acme");
                sim.push(tool_result(result.clone()));
                sim
            })
            .collect();
        for sim in &takers {
            store.claim(sim.id()).await.unwrap();
        }
        let writes = takers.iter_mut().map(|sim| {
            let cp = sim.checkpoint();
            let store = store.clone();
            tokio::spawn(async move { store.checkpoint(cp).await })
        });
        let purge = {
            let store = store.clone();
            tokio::spawn(async move { store.purge(gone.id()).await })
        };
        for w in futures::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        purge.await.unwrap().unwrap();
        for sim in &takers {
            let stored = store.load(sim.id()).await.unwrap();
            assert_same(&stored.expect("written"), sim);
        }
    }
}

/// A purge of the last session under a configuration, and checkpoints of
/// new sessions taking that configuration up, at the same time: every
/// session written reads back whole (its configuration was not deleted
/// under it), and the configuration is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_never_deletes_a_configuration_a_concurrent_checkpoint_takes_up() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    for round in 0..60 {
        let mut gone = Sim::new("acme");
        gone.header.config.make_mut().instructions = format!("round {round}");
        let config = gone.header.config.clone();
        gone.status(SessionStatus::Completed);
        gone.write(&store).await;
        let mut takers: Vec<Sim> = (0..8)
            .map(|_| {
                let mut sim = Sim::new("acme");
                sim.header.config = config.clone();
                sim
            })
            .collect();
        for sim in &takers {
            store.claim(sim.id()).await.unwrap();
        }
        // The purge goes first, the checkpoints a few round trips later, a
        // few more each round: over the rounds they meet the purge at each
        // of its statements, the one asking who still names the
        // configuration among them.
        let purge = {
            let store = store.clone();
            tokio::spawn(async move { store.purge(gone.id()).await })
        };
        for _ in 0..round % 12 {
            store.health_check().await.unwrap();
        }
        let writes = takers.iter_mut().map(|sim| {
            let cp = sim.checkpoint();
            let store = store.clone();
            tokio::spawn(async move { store.checkpoint(cp).await })
        });
        for w in futures::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        purge.await.unwrap().unwrap();
        for sim in &takers {
            let stored = store.load(sim.id()).await.unwrap();
            assert_same(&stored.expect("written"), sim);
        }
        assert_eq!(
            PgServer::scalar(
                &url,
                &format!(
                    "SELECT count(*) FROM configs WHERE hash = '{}'",
                    hex::encode(config.hash())
                )
            )
            .await
            .unwrap(),
            1
        );
    }
}

/// The lock a purge and a checkpoint taking a configuration up share, from
/// the purge's side: a purge that finds the configuration held by a
/// transaction taking it up (another connection here, as a checkpoint)
/// waits for it, then sees that transaction's session naming it, and keeps
/// the configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_for_a_checkpoint_taking_its_configuration_up_and_keeps_it() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(60)).await;
    let mut gone = Sim::new("acme");
    gone.header.config.make_mut().instructions = "purged while taken up".into();
    let hash = hex::encode(gone.header.config.hash());
    gone.status(SessionStatus::Completed);
    gone.write(&store).await;

    let taker = connect(&url).await;
    taker
        .batch_execute(&format!("BEGIN; {}", lock_config(&hash, true)))
        .await
        .unwrap();
    let purge = tokio::spawn({
        let store = store.clone();
        let id = gone.id();
        async move { store.purge(id).await }
    });
    assert!(
        wait_for(Duration::from_secs(30), || async {
            (PgServer::scalar(&url, WAITING_ON_LOCKS).await.unwrap() == 1).then_some(())
        })
        .await,
        "the purge never waited on the configuration's lock"
    );
    taker
        .batch_execute(&format!(
            "INSERT INTO sessions (id, root_id, tenant, status, schema_version, last_event_seq,
                                   transcript_len, header, config_hash)
             VALUES (gen_random_uuid(), gen_random_uuid(), 'acme', 'idle', 1, 0, 0, '{{}}',
                     '{hash}');
             COMMIT"
        ))
        .await
        .unwrap();
    purge.await.unwrap().unwrap();
    let kept = format!("SELECT count(*) FROM configs WHERE hash = '{hash}'");
    assert_eq!(
        PgServer::scalar(&url, &kept).await.unwrap(),
        1,
        "a configuration a committed session names is kept"
    );
}

/// From the checkpoint's side: a checkpoint taking up a configuration that
/// a purge holds waits for the purge; the purge, which cannot see the
/// uncommitted session, deletes it, and the checkpoint then stores it anew:
/// its session reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_taking_up_a_configuration_a_purge_holds_waits_and_stores_it_anew() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(60)).await;
    let mut sim = Sim::new("acme");
    sim.header.config.make_mut().instructions = "taken up under a purge".into();
    let hash = hex::encode(sim.header.config.hash());
    let json = sim.header.config.json().unwrap().get().to_owned();

    // A purge of the last session that named it, past its look at who
    // else does: the row is there, and the purge holds its lock.
    let purger = connect(&url).await;
    purger
        .execute(
            "INSERT INTO configs (hash, config) VALUES ($1, $2)",
            &[&hash, &json],
        )
        .await
        .unwrap();
    purger
        .batch_execute(&format!("BEGIN; {}", lock_config(&hash, false)))
        .await
        .unwrap();
    store.claim(sim.id()).await.unwrap();
    let write = tokio::spawn({
        let store = store.clone();
        let cp = sim.checkpoint();
        async move { store.checkpoint(cp).await }
    });
    assert!(
        wait_for(Duration::from_secs(30), || async {
            (PgServer::scalar(&url, WAITING_ON_LOCKS).await.unwrap() == 1).then_some(())
        })
        .await,
        "the checkpoint never waited on the configuration's lock"
    );
    let deleted = purger
        .execute(
            "DELETE FROM configs c WHERE c.hash = $1
               AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.config_hash = c.hash)",
            &[&hash],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the purge sees no committed session naming it");
    purger.batch_execute("COMMIT").await.unwrap();
    write.await.unwrap().unwrap();
    let stored = store.load(sim.id()).await.unwrap();
    assert_same(&stored.expect("written"), &sim);
    let kept = format!("SELECT count(*) FROM configs WHERE hash = '{hash}'");
    assert_eq!(PgServer::scalar(&url, &kept).await.unwrap(), 1);
}

/// A node whose own lease ran out by its own clock (no heartbeat since)
/// refuses to write and to claim, though it still holds the tree's lease
/// and the database would take the write (the lease row names it, at its
/// epoch): its clock alone stops it. A heartbeat gives the lease back, and
/// the same write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_own_lease_refuses_to_write() {
    let url = shared().database().await.unwrap();
    let lease = Duration::from_secs(4);
    let store = open_pg(&url, lease).await;
    let mut sim = Sim::new("acme");
    sim.write(&store).await;
    // No heartbeat from here on.
    assert!(
        wait_for(Duration::from_secs(30), || async {
            (!store.lease_valid()).then_some(())
        })
        .await,
        "the node's own lease never ran out"
    );
    assert_eq!(store.leases_held(), 1, "the tree's lease is still held");
    let before = store.load(sim.id()).await.unwrap().unwrap().header;
    sim.status(SessionStatus::Cancelled);
    let cp = sim.checkpoint();
    let err = store.checkpoint(cp.clone()).await.unwrap_err();
    assert!(
        err.is_not_owner() && err.to_string().contains("lease has run out"),
        "{err:?}"
    );
    let stored = store.load(sim.id()).await.unwrap().unwrap();
    assert_eq!(stored.header, before, "nothing landed");
    match store.claim(sim.id()).await {
        Err(e) if e.is_not_owner() => {}
        other => panic!("a claim past the node's own lease: {other:?}"),
    }
    store
        .heartbeat(&format!("http://node-{}", store.node_id()), lease)
        .await
        .unwrap();
    store.checkpoint(cp).await.unwrap();
    let stored = store.load(sim.id()).await.unwrap().unwrap();
    assert_eq!(stored.header.status, SessionStatus::Cancelled);
}

/// A pool taken up by statements waiting on a lock (as under a burst of
/// checkpoints) does not hold up the heartbeat: it renews on a connection of
/// its own; and when that connection is lost, the next heartbeat makes a
/// new one and renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_renew_while_the_pool_is_taken_up_and_reconnect_after_a_loss() {
    let url = shared().database().await.unwrap();
    let store = PgStore::open(
        &url,
        PgOptions {
            pool_size: 2,
            lease: Duration::from_secs(60),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    // Longer than the pool waits for a free connection: a heartbeat that
    // needs one fails, one that does not succeeds.
    let patience = Duration::from_secs(30);
    let me = format!("http://node-{}", store.node_id());
    store.heartbeat(&me, patience).await.unwrap();
    let beat_at = format!(
        "SELECT (EXTRACT(EPOCH FROM heartbeat_at) * 1000000)::bigint FROM nodes WHERE id = '{}'",
        store.node_id()
    );
    let scalar = |sql: String| {
        let url = url.clone();
        async move { PgServer::scalar(&url, &sql).await.unwrap() }
    };

    let locker = lock_leases(&url).await;
    // Both pooled connections now wait on the lock: a claim, and a
    // failover's claim (claims made together would share one statement).
    let roots = [SessionId::generate(), SessionId::generate()];
    let claims = [
        tokio::spawn({
            let store = store.clone();
            async move { store.claim(roots[0]).await }
        }),
        tokio::spawn({
            let store = store.clone();
            async move { Ok(store.claim_many(&roots[1..]).await? == roots[1..]) }
        }),
    ];
    assert!(
        wait_for(patience, || async {
            (scalar(WAITING_ON_LOCKS.to_owned()).await == 2).then_some(())
        })
        .await,
        "both pooled connections never waited on the lock"
    );
    let before = scalar(beat_at.clone()).await;
    store
        .heartbeat(&me, patience)
        .await
        .expect("a heartbeat while the pool is taken up");
    let renewed = scalar(beat_at.clone()).await;
    assert!(renewed > before, "{renewed} > {before}");
    assert!(store.lease_valid());

    // The heartbeat's connection is lost (killed on the server side).
    let killed = scalar(format!(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
           WHERE datname = current_database() AND application_name = '{}') t",
        overseer::store::postgres::HEARTBEAT_APPLICATION
    ))
    .await;
    assert_eq!(killed, 1, "the heartbeat has one connection of its own");
    store
        .heartbeat(&me, patience)
        .await
        .expect("a heartbeat after its connection was lost");
    let again = scalar(beat_at.clone()).await;
    assert!(again > renewed, "{again} > {renewed}");

    // The waiting claims go through once the lock is released.
    locker.batch_execute("ROLLBACK").await.unwrap();
    for claim in claims {
        assert!(
            claim.await.unwrap().unwrap(),
            "a waiting claim took its tree"
        );
    }
}

/// A checkpoint that keeps its session active (running or awaiting
/// approval, as every turn's do) changes no indexed column of its header
/// row, so PostgreSQL rewrites the row on its page with no new entry in
/// any index (a HOT update): only a session's start and its end (`active`
/// changes) write index entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_updates_while_a_session_stays_active_write_no_index_entry() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(60)).await;
    let mut sim = Sim::new("acme");
    sim.status(SessionStatus::Running);
    sim.write(&store).await;
    for turn in 0..10 {
        sim.status(if turn % 2 == 0 {
            SessionStatus::AwaitingApproval
        } else {
            SessionStatus::Running
        });
        sim.write(&store).await;
    }
    sim.status(SessionStatus::AwaitingInput);
    sim.write(&store).await;
    // The writing connections report their counters within seconds of
    // going idle.
    let counts = "SELECT n_tup_upd * 1000 + n_tup_hot_upd FROM pg_stat_user_tables
                  WHERE relname = 'sessions'";
    let seen = counted(&url, counts, 11 * 1000).await;
    assert_eq!(
        (seen / 1000, seen % 1000),
        (11, 10),
        "updates, of which HOT: each but the end's"
    );
}

/// A checkpoint's fence reads the lease of its own tree, not every lease its
/// node holds: what a group of checkpoints costs does not grow with the
/// number of trees its node owns. Counted by PostgreSQL: the lease rows
/// read by 300 checkpoints written together (queued behind a lock, so
/// that they go in large groups) by a node holding 2,310 trees, whose
/// statistics lag behind, as after a burst of new trees or a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reads_its_own_lease_not_every_lease_its_node_holds() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(60)).await;
    for _ in 0..10 {
        assert!(store.claim(SessionId::generate()).await.unwrap());
    }
    PgServer::execute(&url, "ANALYZE leases").await.unwrap();
    let mut sims: Vec<Sim> = (0..300).map(|_| Sim::new("acme")).collect();
    let roots = sims
        .iter()
        .map(|s| s.id())
        .chain((0..2_000).map(|_| SessionId::generate()));
    let held = 10 + 300 + 2_000;
    for claimed in futures::future::join_all(roots.map(|r| store.claim(r))).await {
        assert!(claimed.unwrap());
    }
    // A backend reports all its counters together, within seconds of
    // going idle: once the claims' rows are counted, so are their reads.
    let stat =
        |column: &str| format!("SELECT {column} FROM pg_stat_user_tables WHERE relname = 'leases'");
    counted(&url, &stat("n_tup_ins"), held).await;
    let reads = stat("seq_tup_read + coalesce(idx_tup_fetch, 0)");
    let before = PgServer::scalar(&url, &reads).await.unwrap();

    let locker = lock_leases(&url).await;
    let mut writes: Vec<_> = sims
        .iter_mut()
        .map(|sim| {
            sim.status(SessionStatus::Running);
            Box::pin(store.checkpoint(sim.checkpoint()))
        })
        .collect();
    for write in &mut writes {
        assert!(futures::poll!(write.as_mut()).is_pending());
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    for written in futures::future::join_all(writes).await {
        written.unwrap();
    }
    let sessions = "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'sessions'";
    counted(&url, sessions, 300).await;
    let read = PgServer::scalar(&url, &reads).await.unwrap() - before;
    assert!(
        read < held,
        "300 checkpoints read {read} lease rows of the {held} their node holds"
    );
}

/// Claims made together are taken together: while one claim's statement
/// waits on a lock, the claims made meanwhile queue, and the next statement
/// takes them all (a root asked twice among them); each caller gets its own
/// answer: a root another live node holds is refused, naming that node,
/// and the rest of its group lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_made_together_share_one_statement_and_each_gets_its_own_answer() {
    let url = shared().database().await.unwrap();
    let lease = Duration::from_secs(60);
    let a = open_pg(&url, lease).await;
    let b = open_pg(&url, lease).await;
    let mut held = Sim::new("acme");
    held.status(SessionStatus::AwaitingApproval);
    held.write(&b).await;

    let locker = lock_leases(&url).await;
    let trips = a.round_trips();
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.claim(SessionId::generate()).await }
    });
    assert!(
        wait_for(Duration::from_secs(30), || async {
            (PgServer::scalar(&url, WAITING_ON_LOCKS).await.unwrap() == 1).then_some(())
        })
        .await,
        "the first claim never waited on the lock"
    );
    let roots: Vec<SessionId> = (0..40).map(|_| SessionId::generate()).collect();
    let asked: Vec<SessionId> = roots.iter().copied().chain([roots[0], held.id()]).collect();
    let mut claims: Vec<_> = asked.iter().map(|&root| Box::pin(a.claim(root))).collect();
    for claim in &mut claims {
        // Polled once: queued, waiting for the statement under way.
        assert!(futures::poll!(claim.as_mut()).is_pending());
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert!(first.await.unwrap().unwrap());
    let answers = futures::future::join_all(claims).await;

    for (root, answer) in asked.iter().zip(&answers) {
        if *root == held.id() {
            match answer {
                Err(StoreError::NotOwner { reason, .. }) => {
                    assert!(reason.contains(&b.node_id().to_string()), "{reason}")
                }
                other => panic!("a tree another live node holds: {other:?}"),
            }
        } else {
            assert!(matches!(answer, Ok(true)), "{root:?}: {answer:?}");
        }
    }
    assert_eq!(a.leases_held(), 1 + roots.len());
    // The first claim's statement, one for the 41 claims queued while it
    // waited, and the look-up of who holds the refused one.
    assert_eq!(a.round_trips() - trips, 3);
}

/// A connection of the test's own (not an overseer store's).
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Takes configuration `hash`'s advisory lock for the transaction, as a
/// checkpoint taking it up (`shared`) or a purge (not) does.
fn lock_config(hash: &str, shared: bool) -> String {
    let f = if shared {
        "pg_advisory_xact_lock_shared"
    } else {
        "pg_advisory_xact_lock"
    };
    format!("SELECT {f}(1870029670, ('x' || left('{hash}', 8))::bit(32)::int)")
}

/// Connections of overseer stores waiting on a lock now.
const WAITING_ON_LOCKS: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = 'overseer'
      AND wait_event_type = 'Lock'";

/// A connection holding every row of `leases` locked until it rolls back:
/// each claim (and each checkpoint's fence) waits on it.
async fn lock_leases(url: &str) -> tokio_postgres::Client {
    let locker = connect(url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    locker
}

/// Waits (a minute at most) until the count `sql` asks of PostgreSQL's
/// statistics reaches `at_least`, and returns it: a backend reports its
/// counters within seconds of going idle.
async fn counted(url: &str, sql: &str, at_least: i64) -> i64 {
    let seen = std::cell::Cell::new(0);
    let ok = wait_for(Duration::from_secs(60), || async {
        seen.set(PgServer::scalar(url, sql).await.unwrap());
        (seen.get() >= at_least).then_some(())
    })
    .await;
    assert!(ok, "never counted ({sql}): {}", seen.get());
    seen.get()
}

async fn wait_for<F, Fut, T>(patience: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        if f().await.is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_a_newer_binary_is_refused_and_left_untouched() {
    let url = shared().database().await.unwrap();
    drop(PgStore::open(&url, PgOptions::default()).await.unwrap());
    let known = PgServer::scalar(&url, "SELECT count(*) FROM overseer_migrations")
        .await
        .unwrap();
    PgServer::execute(
        &url,
        "INSERT INTO overseer_migrations (version) VALUES (999)",
    )
    .await
    .unwrap();
    let err = PgStore::open(&url, PgOptions::default()).await.unwrap_err();
    assert!(
        matches!(err, PgOpenError::SchemaTooNew { found: 999, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade overseer"), "{err}");
    let versions = PgServer::scalar(&url, "SELECT count(*) FROM overseer_migrations")
        .await
        .unwrap();
    assert_eq!(versions, known + 1, "nothing applied on top");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_applied_once_by_nodes_starting_together() {
    let url = shared().database().await.unwrap();
    let opens = (0..4).map(|_| PgStore::open(&url, PgOptions::default()));
    for store in futures::future::join_all(opens).await {
        store.unwrap();
    }
    // Each version once: the newest is also the count.
    let versions = PgServer::scalar(&url, "SELECT count(*) FROM overseer_migrations")
        .await
        .unwrap();
    let newest = PgServer::scalar(&url, "SELECT max(version)::bigint FROM overseer_migrations")
        .await
        .unwrap();
    assert_eq!(versions, newest);
    assert!(newest >= 2, "{newest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_or_an_unreachable_database_is_a_clear_error() {
    let err = PgStore::open("mysql://nope", PgOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, PgOpenError::InvalidUrl(_)), "{err:?}");
    assert!(err.to_string().contains("OVERSEER_DATABASE_URL"), "{err}");

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://u:secret-pw@127.0.0.1:{port}/db");
    let err = PgStore::open(
        &url,
        PgOptions {
            connect_timeout: Duration::from_secs(2),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, PgOpenError::Unreachable { .. }), "{err:?}");
    assert!(
        message.contains(&format!("127.0.0.1:{port}/db")),
        "{message}"
    );
    assert!(!message.contains("secret-pw"), "{message}");
}

/// Checkpoints arriving together share transactions (group commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checkpoints_share_transactions() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    let mut sims: Vec<Sim> = (0..300).map(|_| Sim::new("acme")).collect();
    for sim in &sims {
        store.claim(sim.id()).await.unwrap();
    }
    let before = store.commits();
    let writes = sims.iter_mut().map(|sim| {
        let cp = sim.checkpoint();
        let store = store.clone();
        tokio::spawn(async move { store.checkpoint(cp).await })
    });
    for w in futures::future::join_all(writes).await {
        w.unwrap().unwrap();
    }
    let after = store.commits();
    for sim in &sims {
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
    }
    assert!(
        after - before < 300,
        "{} transactions for 300 checkpoints",
        after - before
    );
}

/// Layout 3 on PostgreSQL: a checkpoint with anything new is one
/// `checkpoints` row (its entries and events as one record) beside the
/// header row; one with nothing new writes the header only; the layout-2
/// tables are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_is_one_record_row_beside_the_header_row() {
    let url = shared().database().await.unwrap();
    let store = open_pg(&url, Duration::from_secs(10)).await;
    let mut sim = Sim::new("acme");
    sim.user("hello");
    sim.status(SessionStatus::Running);
    sim.write(&store).await;
    sim.push(tool_result(big_result()));
    sim.push(TranscriptEntry::Assistant {
        text: "done".into(),
        tool_calls: Vec::new(),
        at_ms: 8,
        finish_reason: None,
    });
    sim.status(SessionStatus::AwaitingInput);
    sim.write(&store).await;
    // Nothing new but the header (a usage update, say).
    sim.header.updated_at_ms += 1;
    sim.write(&store).await;
    let rows = format!(
        "SELECT count(*) FROM checkpoints WHERE session_id = '{}'",
        sim.id()
    );
    assert_eq!(PgServer::scalar(&url, &rows).await.unwrap(), 2);
    assert_eq!(
        PgServer::scalar(
            &url,
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('transcript', 'events')"
        )
        .await
        .unwrap(),
        0
    );
    assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
    assert_eq!(
        store.events_after(sim.id(), 0, usize::MAX).await.unwrap(),
        sim.events
    );
    // A range that spans both records, and a page of events that does.
    let both = store.entries(sim.id(), 0..3).await.unwrap();
    assert_eq!(both, sim.transcript[..3]);
    let page = store.events_after(sim.id(), 1, 2).await.unwrap();
    assert_eq!(page, sim.events[1..3]);
}
