//! Cluster mode (§15, issue 13) end to end: `overseer serve` processes over
//! one PostgreSQL database (a throwaway server, see `common::pg`), driven
//! over HTTP like any client, checked from outside (the ledger file of the
//! non-idempotent `ledger_append` tool counts how often each call really
//! ran; the database says who owns what).
//!
//! - three nodes, 300 sessions created round-robin, approvals sent to random
//!   nodes: all finish, every tool ran exactly once, and event streams opened
//!   on a node that does not own the session see every event;
//! - `kill -9` of a node holding 120 parked sessions: its three survivors
//!   split them (none takes more than twice its share; the test prints the
//!   spread and how long it took), each logs what it took, and they finish
//!   them on approvals sent to them; no acknowledged decision is lost;
//! - a node stopped (SIGSTOP) past its lease, taken over, then continued:
//!   none of its writes lands, it drops its actors, each call ran once; a
//!   second one made to skip its own-clock check (a fault point) writes,
//!   and the database's epoch fence refuses every write;
//! - a stopped (hung, not yet dead) owner: the other nodes serve their own
//!   sessions and answer their probes while their forward budget waits on
//!   it, then fail forwards to it fast; a transaction it left open is ended
//!   by the server before its lease runs out;
//! - a node started with a live node's `advertise_url` refuses to join;
//! - the database restarted under load: the nodes reconnect, requests in
//!   flight succeed or get 503, nothing acknowledged is lost;
//! - an event stream followed on a node that never owns the session,
//!   resumed with `Last-Event-ID` on another survivor after the owner was
//!   killed: every later event exactly once, in order, to the session's end;
//! - sessions parked at an approval with a timeout on a node killed before
//!   the deadline: the survivor that takes them over fires their timers
//!   (the calls are denied by `system`, never run, the turns end);
//! - the tenant stream (`/v1/events`) on one node carries the sessions that
//!   run on another, and resets its clients after the relay lost its
//!   connection;
//! - `overseer cluster status`: active sessions per node, dead nodes listed
//!   and then pruned;
//! - `overseer store copy` from a sled directory with finished, parked and
//!   delegating sessions: the copies are equal, the parked ones finish on the
//!   cluster, and a second copy copies nothing;
//! - upgrades: a database migrated past this binary is refused in one line
//!   naming both versions; two nodes starting together on a fresh database
//!   migrate it once (the advisory lock); `store backup` against a node
//!   refused with the pointer to `pg_dump`.
//!
//! The heavy tests take turns (`SERIAL`): nodes starved of CPU by another
//! test's nodes would miss heartbeats on a two-core machine.

#![cfg(feature = "fault-injection")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use overseer::store::postgres::{PgOptions, PgStore};
use overseer::store::{Durability, SledStore};
use overseer_actors::store::{all_by_status, CheckpointStore};
use serde_json::Value;

use common::cluster::{
    approve, create, get, pending, wait_status, Node, NodeOptions, Settings, World,
};
use common::pg::{shared, PgServer};
use common::{eventually, Sse};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sessions owned, per node id, as the database says.
async fn owners(world: &World, ids: &[String]) -> anyhow::Result<Vec<(String, i64)>> {
    let (client, conn) = tokio_postgres::connect(&world.database, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    let ids: Vec<uuid::Uuid> = ids.iter().map(|i| i.parse().unwrap()).collect();
    let rows = client
        .query(
            "SELECT COALESCE(l.node_id::text, '-'), count(*) FROM unnest($1::uuid[]) AS s(id)
             LEFT JOIN leases l ON l.root_id = s.id GROUP BY 1 ORDER BY 1",
            &[&ids],
        )
        .await?;
    drop(client);
    let _ = task.await;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Node id (as text) of a running node, from the database (by its URL).
async fn node_id(world: &World, node: &Node) -> anyhow::Result<String> {
    let (client, conn) = tokio_postgres::connect(&world.database, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    let row = client
        .query_one("SELECT id::text FROM nodes WHERE url = $1", &[&node.url])
        .await?;
    drop(client);
    let _ = task.await;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_finish_300_sessions_with_every_tool_run_once() {
    let _turn = SERIAL.lock().await;
    // No node dies here: the deployed lease (heartbeat 2 s, lease 10 s), so
    // that a node starved of CPU by the load on a shared two-core machine
    // does not run past its own lease and refuse work it owns.
    let settings = Settings {
        heartbeat_secs: 2,
        lease_secs: 10,
        ..Settings::default()
    };
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let nodes: Vec<Node> = (0..3).map(|_| world.node().unwrap()).collect();
    const N: usize = 300;
    let started = Instant::now();
    let results = futures::stream::iter(0..N)
        .map(|i| {
            let world = &world;
            let nodes = &nodes;
            async move {
                let owner = &nodes[i % 3];
                let id = create(world, owner, i).await?;
                // Watched on a node that does not own it, from the start.
                let watcher = &nodes[(i + 1) % 3];
                let events = tokio::spawn({
                    let url = watcher.url.clone();
                    let client = world.client.clone();
                    let token = world.token();
                    let id = id.clone();
                    async move {
                        let req = client
                            .get(format!("{url}/v1/sessions/{id}/events"))
                            .bearer_auth(token);
                        let mut sse = Sse::from_request(req).await?;
                        let msgs = sse.until_type("turn_ended").await?;
                        anyhow::Ok(common::ids(&msgs))
                    }
                });
                let calls = pending(world, &nodes[(i + 2) % 3], &id).await?;
                // To a random node.
                let to = &nodes[(i * 7 + i / 3) % 3];
                let (status, v) = approve(world, to, &id, &calls).await?;
                anyhow::ensure!(status == 200, "approval answered {status}: {v}");
                let seen = events.await??;
                let session = wait_status(world, owner, &id, "awaiting_input").await?;
                anyhow::Ok((id, seen, session))
            }
        })
        .buffer_unordered(48)
        .collect::<Vec<_>>()
        .await;
    eprintln!("300 sessions through 3 nodes in {:.1?}", started.elapsed());
    let mut ids = Vec::new();
    for r in results {
        let (id, seen, session) = r.unwrap();
        let last = session["last_event_seq"].as_u64().unwrap();
        // Every event up to the turn's end, in order, none twice: the
        // stream was on a node that never owned the session.
        let want: Vec<u64> = (1..=seen.last().copied().unwrap_or(0)).collect();
        assert_eq!(seen, want, "events of {id} seen on a non-owner");
        assert!(last >= *seen.last().unwrap(), "{id}: {session}");
        ids.push(id);
    }
    let ledger = world.ledger();
    assert_eq!(ledger.len(), N, "one entry per session: {ledger:?}");
    assert!(
        ledger.values().all(|&n| n == 1),
        "every tool ran exactly once: {:?}",
        ledger.iter().filter(|(_, n)| **n != 1).collect::<Vec<_>>()
    );
    // The sessions stayed on the nodes that created them.
    let owned = owners(&world, &ids).await.unwrap();
    assert_eq!(owned.len(), 3, "{owned:?}");
    assert!(owned.iter().all(|(_, n)| *n == 100), "{owned:?}");
    // Approvals sent to non-owners went to the owner.
    let mut forwarded = 0.0;
    for n in &nodes {
        forwarded += n
            .metric(&world, "overseer_cluster_forwarded_requests_total")
            .await
            .unwrap();
    }
    assert!(forwarded > 0.0);
}

/// How many sessions a node's log says it took over from `from` (node id),
/// summed over its takeover lines.
fn logged_takeovers(node: &Node, from: &str) -> usize {
    node.log()
        .lines()
        .filter(|l| l.contains(&format!("from node {from} in ")))
        .filter_map(|l| {
            let rest = l.split("took over ").nth(1)?;
            rest.split(' ').next()?.parse::<usize>().ok()
        })
        .sum()
}

/// A node holding parked sessions is killed; its three survivors split
/// them (rendezvous hashing: none takes more than twice its share), each
/// logs what it took from whom, and every session finishes on approvals
/// sent to the survivors, every decision kept and every tool run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_node_s_parked_sessions_are_spread_over_the_survivors_and_finish() {
    let _turn = SERIAL.lock().await;
    let settings = Settings::default();
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let mut doomed = world.node().unwrap();
    let survivors = [
        world.node().unwrap(),
        world.node().unwrap(),
        world.node().unwrap(),
    ];
    const N: usize = 120;
    let ids: Vec<String> = futures::stream::iter(0..N)
        .map(|i| {
            let world = &world;
            let doomed = &doomed;
            async move {
                let id = create(world, doomed, i).await?;
                let calls = pending(world, doomed, &id).await?;
                anyhow::Ok((id, calls))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .map(|(id, _)| id)
        .collect();
    let doomed_id = node_id(&world, &doomed).await.unwrap();
    assert_eq!(
        owners(&world, &ids).await.unwrap(),
        vec![(doomed_id.clone(), N as i64)]
    );

    doomed.kill9();
    let killed = Instant::now();
    let mut survivor_ids = Vec::new();
    for s in &survivors {
        survivor_ids.push(node_id(&world, s).await.unwrap());
    }
    let taken_over = eventually(
        "the survivors to take over",
        Duration::from_millis(50),
        || async {
            let owned = owners(&world, &ids).await.unwrap();
            let by_survivors: i64 = owned
                .iter()
                .filter(|(n, _)| survivor_ids.contains(n))
                .map(|(_, c)| c)
                .sum();
            if by_survivors == N as i64 {
                Ok(killed.elapsed())
            } else {
                Err(format!("owners {owned:?}"))
            }
        },
    )
    .await;
    eprintln!(
        "takeover of {N} parked sessions after kill -9: {taken_over:.2?} (lease_secs = {})",
        settings.lease_secs
    );
    // Spread: each survivor took about a third, none more than twice that.
    let owned = owners(&world, &ids).await.unwrap();
    eprintln!("sessions per survivor: {owned:?}");
    for (node, count) in &owned {
        assert!(
            *count as usize <= 2 * N / survivors.len(),
            "{node} took {count} of {N}: {owned:?}"
        );
    }
    // Each logged what it took, from whom: as many as it holds.
    for (s, sid) in survivors.iter().zip(&survivor_ids) {
        let holds = owned
            .iter()
            .find(|(n, _)| n == sid)
            .map_or(0, |(_, c)| *c as usize);
        eventually(
            "the survivor to log its takeovers",
            Duration::from_millis(100),
            || async {
                let logged = logged_takeovers(s, &doomed_id);
                if logged == holds {
                    for line in s.log().lines().filter(|l| l.contains("took over")) {
                        eprintln!("{line}");
                    }
                    Ok(())
                } else {
                    Err(format!("logged {logged}, holds {holds}:\n{}", s.log()))
                }
            },
        )
        .await;
    }

    // Approvals to the survivors, at random; each acknowledged decision must
    // be in the session.
    let acked = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let world = &world;
            let survivors = &survivors;
            async move {
                let to = &survivors[i % survivors.len()];
                let calls = pending(world, to, id).await?;
                let (status, v) = approve(world, to, id, &calls).await?;
                anyhow::ensure!(status == 200, "approval of {id} answered {status}: {v}");
                anyhow::Ok((id.clone(), calls))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    for r in acked {
        let (id, calls) = r.unwrap();
        let s = wait_status(&world, &survivors[0], &id, "awaiting_input")
            .await
            .unwrap();
        let transcript = s["transcript"].to_string();
        for c in &calls {
            assert!(
                transcript.contains(c.as_str()),
                "decision for {c} lost: {s}"
            );
        }
    }
    let ledger = world.ledger();
    assert_eq!(ledger.len(), N);
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
    let mut claims = 0.0;
    for s in &survivors {
        claims += s
            .metric(&world, "overseer_cluster_claims_total")
            .await
            .unwrap();
    }
    assert!(claims >= N as f64, "{claims}");
}

/// Two nodes are stopped (SIGSTOP) past their lease with sessions parked at
/// an approval; a survivor takes the sessions over and finishes them; the
/// two are continued once their approval timers are overdue, so each has
/// every reason to write (deny the calls it still thinks are waiting):
///
/// - the first stops itself by its own clock: it drops every actor and
///   writes nothing;
/// - the second has that check skipped (fault point `ignore_own_lease`), so
///   its stale writes really reach the database, whose epoch fence refuses
///   every one (`fenced_writes_total{by="database"}` counts them) and the
///   refused actors stop.
///
/// Either way nothing of theirs lands and every tool ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_paused_past_its_lease_lands_no_write_whether_its_clock_or_the_fence_stops_it() {
    let _turn = SERIAL.lock().await;
    let settings = Settings {
        // Past the takeover and the approvals, before the nodes are continued.
        approval_timeout_secs: 14,
        ..Settings::default()
    };
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let paused = world.node().unwrap();
    let stale = world
        .node_with(&NodeOptions {
            fault: Some("ignore_own_lease:1:bypass".into()),
            ..NodeOptions::default()
        })
        .unwrap();
    let survivor = world.node().unwrap();
    const N: usize = 10;
    let mut ids = Vec::new();
    for (i, node) in [&paused, &stale]
        .into_iter()
        .cycle()
        .take(2 * N)
        .enumerate()
    {
        let id = create(&world, node, i).await.unwrap();
        pending(&world, node, &id).await.unwrap();
        ids.push(id);
    }
    let created = Instant::now();
    for node in [&paused, &stale] {
        let live = node.metric(&world, "overseer_live_sessions").await.unwrap();
        assert_eq!(live, N as f64);
    }
    paused.sigstop();
    stale.sigstop();
    let survivor_id = node_id(&world, &survivor).await.unwrap();
    eventually(
        "the survivor to take over",
        Duration::from_millis(100),
        || async {
            let owned = owners(&world, &ids).await.unwrap();
            if owned == vec![(survivor_id.clone(), 2 * N as i64)] {
                Ok(())
            } else {
                Err(format!("owners {owned:?}"))
            }
        },
    )
    .await;
    for id in &ids {
        let calls = pending(&world, &survivor, id).await.unwrap();
        let (status, v) = approve(&world, &survivor, id, &calls).await.unwrap();
        assert_eq!(status, 200, "{v}");
    }
    let mut finished = Vec::new();
    for id in &ids {
        finished.push(
            wait_status(&world, &survivor, id, "awaiting_input")
                .await
                .unwrap(),
        );
    }
    // Continue the stopped nodes only once their approval timers are due.
    let overdue = Duration::from_secs(settings.approval_timeout_secs + 1);
    if let Some(rest) = overdue.checked_sub(created.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    paused.sigcont();
    stale.sigcont();
    // The first drops its actors by its own clock.
    eventually(
        "the paused node to drop its actors",
        Duration::from_millis(100),
        || async {
            let live = paused.metric(&world, "overseer_live_sessions").await;
            if matches!(live, Ok(v) if v == 0.0) {
                Ok(())
            } else {
                Err(format!("live sessions {live:?}\n{}", paused.log()))
            }
        },
    )
    .await;
    assert!(
        paused.log().contains("dropping every session"),
        "{}",
        paused.log()
    );
    // The second writes, and the database refuses each write; each refused
    // actor stops.
    eventually(
        "the database to refuse the stale node's writes",
        Duration::from_millis(100),
        || async {
            let fenced = stale
                .metric_where(
                    &world,
                    "overseer_cluster_fenced_writes_total",
                    "by=\"database\"",
                )
                .await;
            let live = stale.metric(&world, "overseer_live_sessions").await;
            match (&fenced, &live) {
                (Ok(f), Ok(l)) if *f >= N as f64 && *l == 0.0 => Ok(()),
                _ => Err(format!("fenced {fenced:?}, live {live:?}\n{}", stale.log())),
            }
        },
    )
    .await;
    assert!(
        !stale.log().contains("dropping every session"),
        "the fault point skipped its own check: {}",
        stale.log()
    );
    // Nothing of either landed: every session is as the survivor left it.
    for (id, before) in ids.iter().zip(&finished) {
        let now = get(&world, &survivor, &format!("/v1/sessions/{id}"))
            .await
            .unwrap();
        assert_eq!(
            now["last_event_seq"], before["last_event_seq"],
            "{id}: {now}"
        );
        assert_eq!(now["status"], "awaiting_input");
        assert!(
            !now.to_string().contains("No approval decision received"),
            "{now}"
        );
    }
    let ledger = world.ledger();
    assert_eq!(ledger.len(), 2 * N);
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restart_under_load_loses_nothing_acknowledged() {
    let _turn = SERIAL.lock().await;
    // Its own server: this test restarts it.
    let server = PgServer::start().unwrap();
    let world = World::new(server.database().await.unwrap(), &Settings::default()).unwrap();
    let nodes = [world.node().unwrap(), world.node().unwrap()];
    const N: usize = 60;
    // The restart is driven by what the service does, not by the clock: the
    // database stops once a third of the sessions are acknowledged, and
    // starts again once both nodes have refused a create while it was down.
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let load = futures::stream::iter(0..N)
        .map(|i| {
            let world = &world;
            let nodes = &nodes;
            let acked_tx = acked_tx.clone();
            async move {
                let node = &nodes[i % 2];
                let id = loop {
                    match create(world, node, i).await {
                        Ok(id) => break id,
                        Err(e) => {
                            // While the database is down a create is refused
                            // (503, store unavailable) or its connection is
                            // cut; anything else is a defect.
                            let text = e.to_string();
                            anyhow::ensure!(
                                text.contains("answered 503") || text.contains("error sending"),
                                "create: {text}"
                            );
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                };
                let _ = acked_tx.send(());
                let calls = pending(world, &nodes[(i + 1) % 2], &id).await?;
                let (status, v) = approve(world, &nodes[(i + 1) % 2], &id, &calls).await?;
                anyhow::ensure!(status == 200, "approval answered {status}: {v}");
                anyhow::Ok(id)
            }
        })
        // A window of clients, so that some sessions are acknowledged before
        // the stop and others are created, parked and approved across it.
        .buffer_unordered(12);
    let restart = async {
        for _ in 0..N / 3 {
            acked_rx.recv().await;
        }
        server.pg_stop().unwrap();
        // Each node refuses a create with a 503 that says why: the store is
        // unavailable, or (the heartbeat failing too) its lease ran out.
        for node in &nodes {
            let (status, v) = loop {
                let (status, v) = common::send(
                    world
                        .client
                        .post(format!("{}/v1/sessions", node.url))
                        .bearer_auth(world.token())
                        .json(&serde_json::json!({"agent": "clerk", "prompt": "probe"})),
                )
                .await
                .unwrap();
                // A create already past its checkpoint when the database
                // went away may still land: probe again.
                if status != 201 {
                    break (status, v);
                }
            };
            assert_eq!(status, 503, "{v}");
            let message = v["error"]["message"].as_str().unwrap_or_default();
            assert!(
                v["error"]["code"] == "store_unavailable"
                    || (v["error"]["code"] == "not_owner" && message.contains("lease has run out")),
                "{v}"
            );
        }
        // Creates acknowledged before the database came back: fewer than
        // all of them, or the load did not overlap the restart.
        let mut acked = N / 3;
        while acked_rx.try_recv().is_ok() {
            acked += 1;
        }
        server.pg_start().unwrap();
        acked
    };
    let (ids, acked_before_start) = tokio::time::timeout(Duration::from_secs(240), async {
        tokio::join!(load.collect::<Vec<_>>(), restart)
    })
    .await
    .expect("the load and the restart finished");
    assert!(
        acked_before_start < N,
        "every create was acknowledged before the database came back: the restart overlapped no load"
    );
    let ids: Vec<String> = ids.into_iter().map(|r| r.unwrap()).collect();
    for id in &ids {
        // A call the restart interrupted while its tool may have been
        // running comes back `awaiting_approval`, marked `outcome_unknown`
        // (the tool is not idempotent: the session asks again rather than
        // run it twice). The person decides from the ledger, as an operator
        // would: denied if it ran, approved if it did not.
        let deadline = Instant::now() + Duration::from_secs(60);
        let s = loop {
            let s = get(&world, &nodes[0], &format!("/v1/sessions/{id}"))
                .await
                .unwrap();
            if s["status"] == "awaiting_input" {
                break s;
            }
            assert!(Instant::now() < deadline, "never settled: {s}");
            let unknown = s["open_calls"].as_array().and_then(|calls| {
                calls
                    .iter()
                    .find(|c| c["state"] == "awaiting_approval" && c["outcome_unknown"] == true)
            });
            if let Some(call) = unknown {
                let entry = call["arguments"]["entry"].as_str().unwrap_or_default();
                let decision = if world.ledger().contains_key(entry) {
                    "deny"
                } else {
                    "approve"
                };
                let call_id = call["id"].as_str().unwrap_or_default();
                let (status, v) = common::send(
                    world
                        .client
                        .post(format!("{}/v1/sessions/{id}/approvals", nodes[0].url))
                        .bearer_auth(world.token())
                        .json(&serde_json::json!({"decisions": {call_id: {"decision": decision}}})),
                )
                .await
                .unwrap();
                assert!(status == 200 || status == 503, "{decision}: {status} {v}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(s["transcript"].to_string().contains("Recorded"), "{s}");
    }
    let ledger = world.ledger();
    assert_eq!(ledger.len(), N, "{ledger:?}");
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
    for n in &nodes {
        let ready = world
            .client
            .get(format!("{}/readyz", n.url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(ready, 200, "{}", n.log());
    }
}

/// A node whose lease lapsed while PostgreSQL was down lets its sessions
/// go (nothing it holds may be written), and once it heartbeats again it
/// takes them back by itself: no request needs to touch them, and no other
/// node would (the lease rows name a node that is alive). The first
/// take-back fails here (fault `take_back:1:fail`: the database not yet
/// answering it), as it could after a restart on a loaded machine; the
/// node keeps trying in the next rounds instead of leaving the session
/// `running` with nobody to resume it (the flake of the restart test above).
/// Driven by what the node reports, never by the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_takes_back_its_sessions_after_the_database_was_down_past_its_lease() {
    let _turn = SERIAL.lock().await;
    // Its own server: this test stops it.
    let server = PgServer::start().unwrap();
    let world = World::new(server.database().await.unwrap(), &Settings::default()).unwrap();
    let node = world
        .node_with(&NodeOptions {
            fault: Some("take_back:1:fail".into()),
            ..NodeOptions::default()
        })
        .unwrap();
    let id = create(&world, &node, 0).await.unwrap();
    let calls = pending(&world, &node, &id).await.unwrap();
    server.pg_stop().unwrap();
    let logged = |line: &'static str| {
        let node = &node;
        eventually(line, Duration::from_millis(100), move || async move {
            if node.log().contains(line) {
                Ok(())
            } else {
                Err(node.log())
            }
        })
    };
    // Its lease ran out by its own clock: it drops every session.
    logged("dropping every session").await;
    server.pg_start().unwrap();
    logged("injected fault (take_back)").await;
    // The next round takes it back, before any request about it.
    logged("took back 1 session(s) of this node").await;
    let (status, v) = approve(&world, &node, &id, &calls).await.unwrap();
    assert_eq!(status, 200, "{v}");
    let s = wait_status(&world, &node, &id, "awaiting_input")
        .await
        .unwrap();
    assert!(s["transcript"].to_string().contains("Recorded"), "{s}");
    assert_eq!(world.ledger().len(), 1, "{}", node.log());
}

/// `store copy` reads a directory of an older layout where it is: the
/// committed layout-3 fixture is copied whole and is still layout 3 after
/// (a copy never upgrades its source), and the parked session arrives
/// waiting for its approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_copy_reads_an_older_layout_where_it_is_and_leaves_it_untouched() {
    let database = shared().database().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let fixture =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-3");
    std::fs::create_dir_all(&data).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), data.join(entry.file_name())).unwrap();
        }
    }
    let run = |args: &[&str]| {
        std::process::Command::new(common::served::BIN)
            .args(args)
            .arg(&data)
            .args(if args[1] == "copy" {
                &["--to", "postgres"][..]
            } else {
                &[][..]
            })
            .env("OVERSEER_DATABASE_URL", &database)
            .output()
            .unwrap()
    };
    let out = run(&["store", "copy", "--from"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("copied 5 session(s)"), "{stdout}");
    let check = run(&["store", "check"]);
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{report}");
    assert!(report.contains("layout version 3"), "{report}");

    let pg = PgStore::open(&database, PgOptions::default())
        .await
        .unwrap();
    let parked: overseer_actors::model::SessionId =
        "01a23c69-284a-70f9-9a13-29e313219311".parse().unwrap();
    let stored = pg.load(parked).await.unwrap().unwrap();
    assert_eq!(
        stored.header.status,
        overseer_actors::model::SessionStatus::AwaitingApproval
    );
    assert_eq!(all_by_status(&pg, &[], 2).await.unwrap().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_copy_moves_every_session_and_the_parked_ones_finish_on_the_cluster() {
    let _turn = SERIAL.lock().await;
    let database = shared().database().await.unwrap();
    // A single node on sled: one finished, parked and delegating sessions.
    let sled_world = World::new(
        database.clone(),
        &Settings {
            store: "sled",
            ..Settings::default()
        },
    )
    .unwrap();
    let data = sled_world.dir.path().join("data");
    let mut single = sled_world.node().unwrap();
    let finished = create(&sled_world, &single, 1).await.unwrap();
    let calls = pending(&sled_world, &single, &finished).await.unwrap();
    approve(&sled_world, &single, &finished, &calls)
        .await
        .unwrap();
    wait_status(&sled_world, &single, &finished, "awaiting_input")
        .await
        .unwrap();
    let mut parked = Vec::new();
    for n in 2..5 {
        let id = create(&sled_world, &single, n).await.unwrap();
        pending(&sled_world, &single, &id).await.unwrap();
        parked.push(id);
    }
    let (status, v) = common::send(
        sled_world
            .client
            .post(format!("{}/v1/sessions", single.url))
            .bearer_auth(sled_world.token())
            .json(&serde_json::json!({"agent": "lead", "prompt": "record 9"})),
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{v}");
    let delegating = v["id"].as_str().unwrap().to_owned();
    pending(&sled_world, &single, &delegating).await.unwrap();
    assert!(single.terminate().unwrap().success());

    let copy = || {
        std::process::Command::new(common::served::BIN)
            .args(["store", "copy", "--from"])
            .arg(&data)
            .args(["--to", "postgres"])
            .env("OVERSEER_DATABASE_URL", &database)
            .output()
            .unwrap()
    };
    let out = copy();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The child of the delegating session is a session too.
    assert!(stdout.contains("copied 6 session(s)"), "{stdout}");
    let again = copy();
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success());
    assert!(
        stdout.contains("copied 0 session(s) with 0 event(s)") && stdout.contains("6 already"),
        "{stdout}"
    );

    // The copies are equal, events included.
    {
        let sled = SledStore::open(&data, Durability::Os).unwrap();
        let pg = PgStore::open(&database, PgOptions::default())
            .await
            .unwrap();
        let all = all_by_status(&sled, &[], 2).await.unwrap();
        assert_eq!(all.len(), 6);
        for h in all {
            let a = sled.load(h.id).await.unwrap().unwrap();
            let b = pg.load(h.id).await.unwrap().unwrap();
            assert_eq!(a.header, b.header);
            assert_eq!(a.transcript, b.transcript);
            assert_eq!(a.metadata, b.metadata);
            assert_eq!(a.inbox, b.inbox);
            assert_eq!(
                sled.events_after(h.id, 0, usize::MAX).await.unwrap(),
                pg.events_after(h.id, 0, usize::MAX).await.unwrap()
            );
        }
    }

    // The parked ones (and the delegation) finish on a cluster.
    let world = World::new(database, &Settings::default()).unwrap();
    std::fs::copy(&sled_world.ledger, &world.ledger).unwrap();
    let nodes = [world.node().unwrap(), world.node().unwrap()];
    for (i, id) in parked.iter().chain([&delegating]).enumerate() {
        let node = &nodes[i % 2];
        let calls = pending(&world, node, id).await.unwrap();
        let (status, v) = approve(&world, node, id, &calls).await.unwrap();
        assert_eq!(status, 200, "{v}");
    }
    for id in &parked {
        wait_status(&world, &nodes[1], id, "awaiting_input")
            .await
            .unwrap();
    }
    let lead = wait_status(&world, &nodes[0], &delegating, "awaiting_input")
        .await
        .unwrap();
    assert!(lead["transcript"].to_string().contains("lead: "), "{lead}");
    let ledger = world.ledger();
    let want: BTreeSet<String> = ["n1", "n2", "n3", "n4", "n9"].map(String::from).into();
    assert_eq!(
        ledger.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "{ledger:?}"
    );
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
}

/// `overseer cluster status` lists the nodes, alive or dead, with the
/// active sessions each owns (a session waiting for input is not active);
/// a killed node is listed as dead, then pruned after the retention
/// although a lease still names it (its idle session is served by whoever
/// is asked); and a node given a database that does not answer refuses to
/// start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_lists_active_sessions_prunes_dead_nodes_and_a_bad_database_url_is_a_start_up_error(
) {
    let _turn = SERIAL.lock().await;
    let settings = Settings {
        dead_node_retention_secs: 8,
        ..Settings::default()
    };
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let a = world.node().unwrap();
    let mut b = world.node().unwrap();
    let parked = create(&world, &a, 5).await.unwrap();
    pending(&world, &a, &parked).await.unwrap();
    let mut idle = Vec::new();
    for node in [&a, &b] {
        let id = create(&world, node, 6).await.unwrap();
        let calls = pending(&world, node, &id).await.unwrap();
        approve(&world, node, &id, &calls).await.unwrap();
        wait_status(&world, node, &id, "awaiting_input")
            .await
            .unwrap();
        idle.push(id);
    }
    b.kill9();
    let status = |json: bool| {
        let mut cmd = std::process::Command::new(common::served::BIN);
        cmd.args(["cluster", "status", "--lease-secs", "4"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .env("OVERSEER_DATABASE_URL", &world.database)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let nodes = |stdout: Vec<u8>| -> Vec<Value> {
        let v: Value = serde_json::from_slice(&stdout).unwrap();
        v["nodes"].as_array().unwrap().clone()
    };
    let (listed, table) = eventually(
        "a node reported dead",
        Duration::from_millis(200),
        || async {
            let listed = nodes(status(true));
            let table = String::from_utf8(status(false)).unwrap();
            if listed.iter().any(|n| n["alive"] == false) && table.contains("dead") {
                Ok((listed, table))
            } else {
                Err(format!("{listed:?}\n{table}"))
            }
        },
    )
    .await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let alive = listed.iter().find(|n| n["alive"] == true).unwrap();
    assert_eq!(alive["url"], a.url.as_str());
    assert_eq!(
        alive["active_sessions"], 1,
        "the idle session is not active"
    );
    assert!(
        table.contains("ACTIVE SESSIONS") && table.contains("alive") && table.contains(&a.url),
        "{table}"
    );
    // Pruned after the retention, although its idle session's lease names
    // it still.
    eventually(
        "the dead node pruned",
        Duration::from_millis(200),
        || async {
            let listed = nodes(status(true));
            if listed.len() == 1 && listed[0]["url"] == a.url.as_str() {
                Ok(())
            } else {
                Err(format!("{listed:?}\n{}", a.log()))
            }
        },
    )
    .await;
    assert!(
        a.log().contains("removed the row of a node dead"),
        "{}",
        a.log()
    );
    let dead_lease = owners(&world, &idle[1..]).await.unwrap();
    assert_eq!(dead_lease.len(), 1);
    assert_ne!(dead_lease[0].0, node_id(&world, &a).await.unwrap());
    let v = get(&world, &a, &format!("/v1/sessions/{}", idle[1]))
        .await
        .unwrap();
    assert_eq!(v["status"], "awaiting_input", "{v}");

    // Start-up errors name what is wrong.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (url, expect) in [
        ("", "OVERSEER_DATABASE_URL"),
        ("mysql://x", "not a PostgreSQL connection string"),
        (
            &*format!("postgres://u:pw@127.0.0.1:{port}/db"),
            &*format!("cannot connect to PostgreSQL at 127.0.0.1:{port}/db"),
        ),
    ] {
        let out = std::process::Command::new(common::served::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&world.config)
            .env("OVERSEER_JWT_SECRET", common::SECRET)
            .env("OVERSEER_DATABASE_URL", url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(expect), "{url}: {stderr}");
        assert!(!stderr.contains(":pw@"), "{stderr}");
    }
}

/// A second node started with the `advertise_url` of a live node refuses
/// to join, in one line naming that node, and leaves no row; once that
/// node is killed (its heartbeats stop) a node restarted with its URL joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_live_node_s_advertise_url_refuses_to_join() {
    let _turn = SERIAL.lock().await;
    let world = World::new(shared().database().await.unwrap(), &Settings::default()).unwrap();
    let mut a = world.node().unwrap();
    let a_id = node_id(&world, &a).await.unwrap();
    let same_url = NodeOptions {
        advertise_url: Some(a.url.clone()),
        ..NodeOptions::default()
    };
    let (status, stderr) = world.refused_node(&same_url).unwrap();
    assert!(!status.success(), "{stderr}");
    let refusal: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("already advertises"))
        .collect();
    assert_eq!(refusal.len(), 1, "{stderr}");
    eprintln!("{}", refusal[0]);
    assert!(
        refusal[0].contains(&a_id)
            && refusal[0].contains(&a.url)
            && refusal[0].contains("cluster.advertise_url"),
        "{stderr}"
    );
    let rows = database_count(&world, "SELECT count(*) FROM nodes").await;
    assert_eq!(rows, 1, "the refused node left no row");

    // A crashed node's URL is free once its heartbeats have stopped.
    a.kill9();
    let b = world.node_with(&same_url).unwrap();
    let joined = database_count(
        &world,
        &format!(
            "SELECT count(*) FROM nodes WHERE url = '{}' AND id <> '{a_id}'",
            a.url
        ),
    )
    .await;
    assert_eq!(joined, 1, "{}", b.log());
}

/// One figure from the database.
async fn database_count(world: &World, sql: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(&world.database, tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(conn);
    let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
    drop(client);
    let _ = task.await;
    n
}

/// Status, `Retry-After` and body of one request, not retried (status 0
/// and the error as the body when it got no answer). The answer is held to
/// the OpenAPI document like every other ([`common::answer`]).
async fn once(req: reqwest::RequestBuilder) -> (u16, Option<u64>, Value) {
    match common::answer(req).await {
        Ok(answer) => {
            let body = if answer.body.is_null() {
                Value::from(answer.text.clone())
            } else {
                answer.body.clone()
            };
            (answer.status, answer.retry_after(), body)
        }
        Err(e) => (0, None, Value::from(e.to_string())),
    }
}

/// Opens on `addr` a request whose body never comes, asking to be told when
/// the server wants it (`Expect: 100-continue`). A node asks for the body
/// (`100 Continue`) only once its admission has given the request a slot,
/// so this returns the connection holding a slot, or the answer the node
/// gave instead (503 `overloaded` when it had none free).
async fn held_request(addr: &str) -> Result<tokio::net::TcpStream, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let held = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(
            b"POST /v1/sessions HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n\
              content-length: 100\r\nexpect: 100-continue\r\n\r\n",
        )
        .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(conn.read_u8().await?);
        }
        anyhow::Ok((conn, String::from_utf8_lossy(&head).into_owned()))
    };
    match tokio::time::timeout(common::PATIENCE, held).await {
        Ok(Ok((conn, head))) if head.starts_with("HTTP/1.1 100 ") => Ok(conn),
        Ok(Ok((_, head))) => Err(head),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within PATIENCE".into()),
    }
}

/// Node A, owning a session, is stopped (SIGSTOP) and answers nothing, but
/// is not yet dead (its lease has not run out). Node B:
///
/// - with its budget of local work taken up (clients that never send their
///   body), still answers `/healthz`, `/readyz` and `/metrics`;
/// - with its whole forward budget waiting on A, refuses one more forward
///   at once (503 `overloaded`) and still serves its own session and its
///   probes (the waiting forwards were still waiting then);
/// - answers each waiting forward with 503 `owner_unreachable` and
///   `Retry-After` at the forward deadline (below the lease), and then
///   fails forwards to A fast, without sending them (the breaker);
/// - forwards to A again once A is continued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_owner_costs_the_other_nodes_neither_their_sessions_nor_their_probes() {
    let _turn = SERIAL.lock().await;
    const BUDGET: usize = 4;
    let settings = Settings {
        // A forward deadline of 4 s (half the lease): room for the checks
        // made while the forwards wait.
        lease_secs: 8,
        max_in_flight_requests: BUDGET,
        max_in_flight_forwards: BUDGET,
        ..Settings::default()
    };
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let a = world.node().unwrap();
    let b = world.node().unwrap();
    let on_a = create(&world, &a, 1).await.unwrap();
    pending(&world, &a, &on_a).await.unwrap();
    let on_b = create(&world, &b, 2).await.unwrap();
    pending(&world, &b, &on_b).await.unwrap();
    let token = world.token();
    let admin = common::token("acme", "ops", &["admin"]);
    let get_on_b = |path: &str| {
        world
            .client
            .get(format!("{}{path}", b.url))
            .bearer_auth(&token)
    };
    let probes_answer = || async {
        for (path, auth) in [
            ("/healthz", None),
            ("/readyz", None),
            ("/metrics", Some(&admin)),
        ] {
            let mut req = world.client.get(format!("{}{path}", b.url));
            if let Some(auth) = auth {
                req = req.bearer_auth(auth);
            }
            let (status, _, v) = once(req).await;
            assert_eq!(status, 200, "{path}: {v}");
        }
    };

    // Local work's budget taken up: the probes are still answered. Each
    // slot is seen taken (B asked for the body) before B is asked anything
    // else: a request sent meanwhile would hold a slot for a moment, and a
    // slow request arriving then is refused, leaving a slot free for good
    // (the cause of this test's old flakiness).
    let addr = b.url.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    let mut refused = Vec::new();
    while slow.len() < BUDGET {
        match held_request(&addr).await {
            Ok(conn) => slow.push(conn),
            Err(answer) => {
                refused.push(answer);
                assert!(refused.len() < 10, "B refused: {refused:?}");
            }
        }
    }
    if !refused.is_empty() {
        eprintln!("slow requests B refused before it held {BUDGET}: {refused:?}");
    }
    // `/v1/me`: admitted like any API request, and never forwarded (a
    // session route may be, which gives its local slot back).
    let (status, _, v) = once(get_on_b("/v1/me")).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (503, &Value::from("overloaded")),
        "B's budget of local work taken up: {v}"
    );
    probes_answer().await;
    drop(slow);
    get(&world, &b, &format!("/v1/sessions/{on_b}"))
        .await
        .unwrap();

    // A hangs. B's forward budget fills with requests waiting on it.
    a.sigstop();
    let waiting: Vec<_> = (0..BUDGET)
        .map(|_| tokio::spawn(once(get_on_b(&format!("/v1/sessions/{on_a}")))))
        .collect();
    eventually(
        "B's forward budget to fill",
        Duration::from_millis(50),
        || async {
            let n = b
                .metric(&world, "overseer_cluster_forwards_in_flight")
                .await
                .map_err(|e| e.to_string())?;
            if n == BUDGET as f64 {
                Ok(())
            } else {
                Err(format!("{n} forwards in flight"))
            }
        },
    )
    .await;
    let (status, _, v) = once(get_on_b(&format!("/v1/sessions/{on_a}"))).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (503, &Value::from("overloaded")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("forwarding"),
        "{v}"
    );
    let (status, _, v) = once(get_on_b(&format!("/v1/sessions/{on_b}"))).await;
    assert_eq!(status, 200, "B's own session: {v}");
    probes_answer().await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "the forwards were still waiting on A while B answered"
    );
    for w in waiting {
        let (status, retry_after, v) = w.await.unwrap();
        assert_eq!(status, 503, "{v}");
        assert_eq!(v["error"]["code"], "owner_unreachable", "{v}");
        assert!(retry_after.is_some_and(|s| s >= 1), "{v}");
    }
    // They were answered within the lease: A still owns its session (once
    // its lease runs out, B would take it).
    let a_id = node_id(&world, &a).await.unwrap();
    assert_eq!(
        owners(&world, std::slice::from_ref(&on_a)).await.unwrap(),
        vec![(a_id, 1)],
        "the forwards outlived the owner's lease"
    );
    // Now B fails forwards to A fast: not sent at all (a request that
    // happens to be the breaker's probe is sent, and waits, instead).
    eventually(
        "a forward to A refused without being sent",
        Duration::from_millis(10),
        || async {
            let before = b
                .metric_where(
                    &world,
                    "overseer_cluster_forwarded_requests_total",
                    "breaker_open",
                )
                .await
                .map_err(|e| e.to_string())?;
            let (status, retry_after, v) = once(get_on_b(&format!("/v1/sessions/{on_a}"))).await;
            assert_eq!(status, 503, "{v}");
            assert_eq!(v["error"]["code"], "owner_unreachable", "{v}");
            assert!(retry_after.is_some_and(|s| s >= 1), "{v}");
            let after = b
                .metric_where(
                    &world,
                    "overseer_cluster_forwarded_requests_total",
                    "breaker_open",
                )
                .await
                .map_err(|e| e.to_string())?;
            if after == before + 1.0 {
                Ok(())
            } else {
                Err(format!("sent as the probe: {v}"))
            }
        },
    )
    .await;
    // A continued: B's probe is answered and forwards go through again.
    a.sigcont();
    eventually(
        "B to forward to A again",
        Duration::from_millis(200),
        || async {
            let (status, _, v) = once(get_on_b(&format!("/v1/sessions/{on_a}"))).await;
            if status == 200 {
                Ok(())
            } else {
                Err(format!("{status}: {v}\nA:\n{}\nB:\n{}", a.log(), b.log()))
            }
        },
    )
    .await;
}

/// A node stopped (SIGSTOP, a hung VM) inside a transaction keeps the row
/// locks it took; the server ends such a transaction once it has idled for
/// half the lease (the store's connections ask for that), so a lease row it
/// locked never blocks the takeover of its tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_by_a_stopped_node_is_ended_before_its_lease_runs_out() {
    let _turn = SERIAL.lock().await;
    let database = shared().database().await.unwrap();
    let store = PgStore::open(
        &database,
        PgOptions {
            lease: Duration::from_secs(2),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    // The stopped node: connected as the store connects, a lease row
    // locked as a checkpoint locks it, then silence.
    let (stopped, connection) = store
        .connection_config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let root = uuid::Uuid::new_v4();
    stopped
        .execute(
            "INSERT INTO leases (root_id, node_id, epoch) VALUES ($1, NULL, 1)",
            &[&root],
        )
        .await
        .unwrap();
    stopped
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM leases WHERE root_id = '{root}' FOR SHARE"
        ))
        .await
        .unwrap();
    // A takeover's update of that row goes through.
    let (other, other_connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls)
        .await
        .unwrap();
    let other_connection = tokio::spawn(other_connection);
    let updated = tokio::time::timeout(
        common::PATIENCE,
        other.execute(
            "UPDATE leases SET epoch = epoch + 1 WHERE root_id = $1",
            &[&root],
        ),
    )
    .await
    .expect("the takeover waited on the stopped node's lock")
    .unwrap();
    assert_eq!(updated, 1);
    // Because the server ended the stopped node's session.
    let ended = tokio::time::timeout(common::PATIENCE, connection)
        .await
        .unwrap()
        .unwrap();
    let error = ended.expect_err("the server ended the connection");
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT),
        "{error:?}"
    );
    drop(other);
    let _ = other_connection.await;
}

/// Opens the event stream of `id` on `node`, resuming after `last` if given.
/// Its own client: a stream outlives the test client's request timeout.
async fn stream(world: &World, node: &Node, id: &str, last: Option<u64>) -> anyhow::Result<Sse> {
    let mut req = reqwest::Client::new()
        .get(format!("{}/v1/sessions/{id}/events", node.url))
        .bearer_auth(world.token());
    if let Some(last) = last {
        req = req.header("Last-Event-ID", last.to_string());
    }
    Sse::from_request(req).await
}

/// The stored events of a stream, as (id, type, data).
fn stored(msgs: &[common::SseMsg]) -> Vec<(u64, String, Value)> {
    msgs.iter()
        .filter_map(|m| Some((m.id?, m.event.clone(), m.data.clone())))
        .collect()
}

/// A client follows a session parked on node A from node B (which never
/// owns it); A is killed; the client resumes on another survivor with
/// `Last-Event-ID` before anyone has taken the session over, a survivor
/// takes it, the call is approved and the session done: the resumed stream
/// carries every later event exactly once and in order up to the session's
/// end, and together with
/// what the client had seen it is the session's whole log. A second client
/// that never disconnected (on B) sees the whole log too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_stream_resumes_by_id_on_a_survivor_across_an_owner_change() {
    let _turn = SERIAL.lock().await;
    let world = World::new(shared().database().await.unwrap(), &Settings::default()).unwrap();
    let mut a = world.node().unwrap();
    let b = world.node().unwrap();
    let c = world.node().unwrap();
    let id = create(&world, &a, 7).await.unwrap();
    pending(&world, &a, &id).await.unwrap();

    // The client, on B: everything up to the approval request.
    let mut first = stream(&world, &b, &id, None).await.unwrap();
    let before = first.until_type("approval_requested").await.unwrap();
    let last_seen = *common::ids(&before).last().unwrap();
    drop(first);
    // A second client on B that stays connected throughout.
    let mut steady = stream(&world, &b, &id, None).await.unwrap();
    let steady_before = steady.until_type("approval_requested").await.unwrap();
    assert_eq!(stored(&steady_before), stored(&before));

    let a_id = node_id(&world, &a).await.unwrap();
    a.kill9();
    // The client reconnects to C while the session still belongs to the
    // dead node (its lease has not run out yet).
    let mut resumed = stream(&world, &c, &id, Some(last_seen)).await.unwrap();
    let survivors = [
        node_id(&world, &b).await.unwrap(),
        node_id(&world, &c).await.unwrap(),
    ];
    let ids = [id.clone()];
    let owner = eventually(
        "a survivor to take the session over",
        Duration::from_millis(100),
        || async {
            let owned = owners(&world, &ids).await.unwrap();
            match owned.as_slice() {
                [(n, 1)] if survivors.contains(n) => Ok(n.clone()),
                _ => Err(format!("owners {owned:?} (dead node {a_id})")),
            }
        },
    )
    .await;
    eprintln!("taken over by {owner}");
    // Approved through the survivor the client is connected to.
    let calls = pending(&world, &c, &id).await.unwrap();
    let (status, v) = approve(&world, &c, &id, &calls).await.unwrap();
    assert_eq!(status, 200, "{v}");
    wait_status(&world, &b, &id, "awaiting_input")
        .await
        .unwrap();
    // And to its end, asked of the other survivor.
    let (status, v) = common::send(
        world
            .client
            .post(format!("{}/v1/sessions/{id}/done", b.url))
            .bearer_auth(world.token())
            .json(&serde_json::json!({})),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    let end = |m: &common::SseMsg| m.event == "status_changed" && m.data["status"] == "completed";
    let after = resumed.until(end).await.unwrap();
    let steady_after = steady.until(end).await.unwrap();

    let after_ids = common::ids(&after);
    assert!(
        after_ids.first().is_some_and(|&f| f == last_seen + 1),
        "the resumed stream starts right after {last_seen}: {after_ids:?}"
    );
    // The whole log, read afresh once the turn has ended.
    let mut whole = stream(&world, &b, &id, None).await.unwrap();
    let whole = stored(&whole.until(end).await.unwrap());
    let want: Vec<u64> = (1..=whole.last().unwrap().0).collect();
    assert_eq!(
        whole.iter().map(|e| e.0).collect::<Vec<_>>(),
        want,
        "the stored log has no hole"
    );
    let mut seen = stored(&before);
    seen.extend(stored(&after));
    assert_eq!(
        seen, whole,
        "seen before the kill + resumed = the whole log"
    );
    let mut steady_seen = stored(&steady_before);
    steady_seen.extend(stored(&steady_after));
    assert_eq!(steady_seen, whole, "the stream that stayed connected");
    let session = wait_status(&world, &c, &id, "completed").await.unwrap();
    assert_eq!(session["last_event_seq"].as_u64(), Some(want.len() as u64));
    let ledger = world.ledger();
    assert_eq!(ledger.get("n7"), Some(&1), "{ledger:?}");
}

/// Status of each session, as the database says.
async fn statuses(world: &World, ids: &[String]) -> anyhow::Result<Vec<String>> {
    let (client, conn) = tokio_postgres::connect(&world.database, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    let mut out = Vec::new();
    for id in ids {
        let id: uuid::Uuid = id.parse()?;
        let row = client
            .query_one("SELECT status FROM sessions WHERE id = $1", &[&id])
            .await?;
        out.push(row.get(0));
    }
    drop(client);
    let _ = task.await;
    Ok(out)
}

/// Sessions parked at an approval with a timeout on node A; A is killed
/// before the deadline; nobody decides. The survivor that takes them over
/// arms their timers again (for what is left of the recorded deadline), and
/// each times out as on a single node: the call is denied by `system`, never
/// runs, the model is told, and the turn ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_survivor_fires_the_approval_timers_of_the_sessions_it_took_over() {
    let _turn = SERIAL.lock().await;
    let settings = Settings {
        // Past the takeover (lease 4 s): the survivor must arm the timers
        // itself for the rest of the deadline.
        approval_timeout_secs: 10,
        ..Settings::default()
    };
    let world = World::new(shared().database().await.unwrap(), &settings).unwrap();
    let mut doomed = world.node().unwrap();
    let survivor = world.node().unwrap();
    const N: usize = 5;
    let ids: Vec<String> = futures::stream::iter(0..N)
        .map(|i| {
            let world = &world;
            let doomed = &doomed;
            async move {
                let id = create(world, doomed, i).await?;
                pending(world, doomed, &id).await?;
                anyhow::Ok(id)
            }
        })
        .buffer_unordered(N)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    doomed.kill9();
    // What the dead node left: every session still waiting for a decision
    // (its timers had not fired).
    let left = statuses(&world, &ids).await.unwrap();
    assert!(
        left.iter().all(|s| s == "awaiting_approval"),
        "the timers fired on the killed node already (test setup too slow?): {left:?}"
    );
    let survivor_id = node_id(&world, &survivor).await.unwrap();
    // Nobody touches the sessions: no request, no decision.
    eventually(
        "the survivor to take the sessions over and time their approvals out",
        Duration::from_millis(200),
        || async {
            let now = statuses(&world, &ids).await.unwrap();
            let owned = owners(&world, &ids).await.unwrap();
            if now.iter().all(|s| s == "awaiting_input")
                && owned == vec![(survivor_id.clone(), N as i64)]
            {
                Ok(())
            } else {
                Err(format!(
                    "statuses {now:?}, owners {owned:?}\n{}",
                    survivor.log()
                ))
            }
        },
    )
    .await;
    for id in &ids {
        let s = get(&world, &survivor, &format!("/v1/sessions/{id}"))
            .await
            .unwrap();
        let transcript = s["transcript"].to_string();
        assert!(
            transcript.contains("No approval decision received")
                && transcript.contains("\"system\""),
            "{id} timed out, decided by the system: {s}"
        );
    }
    let ledger = world.ledger();
    assert!(ledger.is_empty(), "no timed-out call ran: {ledger:?}");
}

/// The tenant stream (`/v1/events`) of a node, through the shared reader.
struct TenantStream {
    events: Sse,
}

impl TenantStream {
    async fn open(world: &World, node: &Node) -> anyhow::Result<Self> {
        let events = Sse::from_request(
            reqwest::Client::new()
                .get(format!("{}/v1/events", node.url))
                .bearer_auth(world.token()),
        )
        .await?;
        Ok(Self { events })
    }

    /// The next event's type and data.
    async fn next(&mut self) -> anyhow::Result<(String, Value)> {
        let m = self.events.next_event().await?;
        Ok((m.event, m.data))
    }

    /// Events up to and including the first that satisfies `pred`.
    async fn until(
        &mut self,
        pred: impl Fn(&str, &Value) -> bool,
    ) -> anyhow::Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        loop {
            let (event, data) = self.next().await?;
            let done = pred(&event, &data);
            out.push((event, data));
            if done {
                return Ok(out);
            }
        }
    }
}

/// The tenant stream on one node carries the tenant's sessions that run on
/// another: a session created and parked on A shows up on B's stream with
/// its inbox card, and its approval on A (and the turn's end) follows; B's
/// snapshot (`/v1/approvals`) lists it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_stream_on_any_node_carries_sessions_running_on_others() {
    let _turn = SERIAL.lock().await;
    let world = World::new(shared().database().await.unwrap(), &Settings::default()).unwrap();
    let a = world.node().unwrap();
    let b = world.node().unwrap();
    let mut feed = TenantStream::open(&world, &b).await.unwrap();
    let (first, data) = feed.next().await.unwrap();
    assert_eq!(first, "reset", "{data}");

    let id = create(&world, &a, 11).await.unwrap();
    let calls = pending(&world, &a, &id).await.unwrap();
    let of = |data: &Value| data["session_id"] == id.as_str();
    let asked = feed
        .until(|event, data| event == "approval_requested" && of(data))
        .await
        .unwrap();
    let (_, card) = asked.last().unwrap();
    assert_eq!(card["approval"]["call_id"], calls[0].as_str(), "{card}");
    let snapshot = get(&world, &b, "/v1/approvals").await.unwrap();
    assert!(snapshot.to_string().contains(&calls[0]), "{snapshot}");

    let (status, v) = approve(&world, &a, &id, &calls).await.unwrap();
    assert_eq!(status, 200, "{v}");
    let rest = feed
        .until(|event, data| {
            event == "status_changed" && of(data) && data["status"] == "awaiting_input"
        })
        .await
        .unwrap();
    let kinds: Vec<&str> = rest
        .iter()
        .filter(|(_, d)| of(d))
        .map(|(e, _)| e.as_str())
        .collect();
    assert!(
        kinds.contains(&"decision_recorded") && kinds.contains(&"tool_call_finished"),
        "{kinds:?}"
    );
    // Each of the session's events once, in order.
    let seqs: Vec<u64> = asked
        .iter()
        .chain(&rest)
        .filter(|(_, d)| of(d))
        .filter_map(|(_, d)| d["seq"].as_u64())
        .collect();
    let want: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
    assert_eq!(seqs, want);
}

/// Announcements made while a node's relay was disconnected cannot be
/// replayed for sessions nobody names: after the database comes back, the
/// tenant stream tells its clients to reload their snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_stream_resets_when_the_relay_lost_its_connection() {
    let _turn = SERIAL.lock().await;
    // Its own server: this test restarts it.
    let server = PgServer::start().unwrap();
    let world = World::new(server.database().await.unwrap(), &Settings::default()).unwrap();
    let node = world.node().unwrap();
    let mut feed = TenantStream::open(&world, &node).await.unwrap();
    let (first, data) = feed.next().await.unwrap();
    assert_eq!(
        (first.as_str(), &data["reason"]),
        ("reset", &Value::from("new_client"))
    );
    server.pg_stop().unwrap();
    server.pg_start().unwrap();
    let (event, data) = feed.next().await.unwrap();
    assert_eq!(event, "reset", "{data}");
    assert_eq!(data["reason"], "events_missed", "{data}");
    // And it goes on: a session created now shows up.
    let id = create(&world, &node, 12).await.unwrap();
    feed.until(|event, data| event == "approval_requested" && data["session_id"] == id.as_str())
        .await
        .unwrap();
}

/// Migration 6 on a database the previous release wrote (migrations 1–5,
/// layout 2: a row per transcript entry and per event), committed as
/// `tests/fixtures/postgres-layout-5/dump.sql` with what that release read
/// back from it (`sessions.json`): a finished session, two parked on an
/// approval, a delegation parked in its child, and one written through the
/// store with a large result in a blob, queued messages and metadata. This
/// binary migrates it at open (one record per session, the old tables
/// dropped), reads every session back exactly as the old one did, pages of
/// events and ranges of the transcript included, and finishes the parked
/// ones on a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_6_moves_layout_2_rows_into_records_and_the_parked_sessions_finish() {
    use overseer_actors::model::SessionId;
    let _turn = SERIAL.lock().await;
    let database = shared().database().await.unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/postgres-layout-5");
    // The fixture's approvals were asked with a one-hour deadline when it
    // was made; a node would deny them as expired. Each deadline moves ten
    // years on, in the dump and in what the old release read back alike,
    // so the parked calls are still open whenever this test runs.
    let mut dump = std::fs::read_to_string(fixture.join("dump.sql")).unwrap();
    let mut sessions_json = std::fs::read_to_string(fixture.join("sessions.json")).unwrap();
    let key = "approval_deadline_ms\":";
    let deadlines: BTreeSet<String> = dump
        .match_indices(key)
        .map(|(at, _)| {
            dump[at + key.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .collect();
    assert_eq!(deadlines.len(), 4, "{deadlines:?}");
    for old in &deadlines {
        let new = (old.parse::<u64>().unwrap() + 10 * 365 * 86_400_000).to_string();
        dump = dump.replace(old.as_str(), &new);
        sessions_json = sessions_json.replace(old.as_str(), &new);
    }
    PgServer::execute(&database, &dump).await.unwrap();
    let scalar = |sql: &'static str| {
        let database = database.clone();
        async move { PgServer::scalar(&database, sql).await.unwrap() }
    };
    assert_eq!(
        scalar("SELECT max(version)::bigint FROM overseer_migrations").await,
        5
    );
    let old_rows =
        scalar("SELECT (SELECT count(*) FROM transcript) + (SELECT count(*) FROM events)").await;
    assert!(old_rows > 30, "{old_rows}");
    let expected: Vec<Value> = serde_json::from_str(&sessions_json).unwrap();
    assert_eq!(expected.len(), 6);

    {
        let store = PgStore::open(&database, PgOptions::default())
            .await
            .unwrap();
        // Migration 6, and every later one.
        assert_eq!(
            scalar("SELECT max(version)::bigint FROM overseer_migrations").await,
            i64::from(overseer::store::pg_migration())
        );
        assert_eq!(
            scalar("SELECT count(*) FROM pg_tables WHERE tablename IN ('transcript', 'events')")
                .await,
            0,
            "the layout-2 tables are gone"
        );
        assert_eq!(
            scalar("SELECT count(*) FROM checkpoints").await,
            6,
            "one record per session"
        );
        // Migration 8 computed `active` for every row it found.
        let active = expected
            .iter()
            .filter(|s| {
                ["running", "awaiting_approval"].contains(&s["header"]["status"].as_str().unwrap())
            })
            .count();
        assert!(active >= 3, "{active}");
        assert_eq!(
            scalar("SELECT count(*) FROM sessions WHERE active").await,
            active as i64
        );
        for want in &expected {
            let id: SessionId = serde_json::from_value(want["header"]["id"].clone()).unwrap();
            let s = store.load(id).await.unwrap().unwrap();
            let events = store.events_after(id, 0, usize::MAX).await.unwrap();
            let got = serde_json::json!({
                "header": s.header, "transcript": s.transcript, "metadata": s.metadata,
                "inbox": s.inbox, "events": events,
            });
            assert_eq!(&got, want, "session {id}");
            let page = store.events_after(id, 1, 2).await.unwrap();
            assert_eq!(
                serde_json::to_value(&page).unwrap(),
                Value::Array(
                    want["events"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .skip(1)
                        .take(2)
                        .cloned()
                        .collect()
                ),
                "session {id}"
            );
            let len = s.transcript.len() as u64;
            let tail = store.entries(id, 1..len).await.unwrap();
            assert_eq!(
                tail,
                s.transcript[1.min(s.transcript.len())..],
                "session {id}"
            );
        }
    }

    // The parked roots (the delegation's approval is its child's, asked on
    // the root) finish on a node of this binary, each call run once.
    let world = World::new(database, &Settings::default()).unwrap();
    let node = world.node().unwrap();
    let parked: Vec<String> = expected
        .iter()
        .filter(|s| {
            s["header"]["parent"].is_null()
                && s["header"]["tenant"] != "other"
                && s["header"]["status"] != "awaiting_input"
        })
        .map(|s| s["header"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(parked.len(), 3, "{parked:?}");
    for id in &parked {
        let calls = pending(&world, &node, id).await.unwrap();
        let (status, v) = approve(&world, &node, id, &calls).await.unwrap();
        assert_eq!(status, 200, "{v}");
    }
    for id in &parked {
        wait_status(&world, &node, id, "awaiting_input")
            .await
            .unwrap();
    }
    let ledger = world.ledger();
    let want: BTreeSet<String> = ["n2", "n3", "n9"].map(String::from).into();
    assert_eq!(
        ledger.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "{ledger:?}"
    );
    assert!(ledger.values().all(|&n| n == 1), "{ledger:?}");
}

/// The rolling-upgrade rule, from the database's side: a binary never
/// serves a database migrated past what it knows. A database whose
/// `overseer_migrations` records a version newer than this binary's (as a
/// newer binary would have left it) is refused at start, in one line naming
/// both versions, and left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_past_this_binary_is_refused_in_one_line_naming_both_versions() {
    let _turn = SERIAL.lock().await;
    let world = World::new(shared().database().await.unwrap(), &Settings::default()).unwrap();
    // The binary migrates a fresh database to what it knows, which is what
    // `--version` says.
    let mut node = world.node().unwrap();
    node.terminate().unwrap();
    let known = database_count(
        &world,
        "SELECT max(version)::bigint FROM overseer_migrations",
    )
    .await;
    let out = std::process::Command::new(common::served::BIN)
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains(&format!("PostgreSQL migrations 1–{known}")),
        "{version}"
    );
    let newer = known + 1;
    PgServer::execute(
        &world.database,
        &format!("INSERT INTO overseer_migrations (version) VALUES ({newer})"),
    )
    .await
    .unwrap();
    let (status, stderr) = world.refused_node(&NodeOptions::default()).unwrap();
    assert!(!status.success(), "{stderr}");
    let refusal: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("schema is version"))
        .collect();
    assert_eq!(refusal.len(), 1, "{stderr}");
    eprintln!("{}", refusal[0]);
    assert!(
        refusal[0].contains(&format!("version {newer}"))
            && refusal[0].contains(&format!("at most version {known}")),
        "{stderr}"
    );
    assert_eq!(
        database_count(&world, "SELECT count(*) FROM overseer_migrations").await,
        newer,
        "nothing was migrated or removed"
    );
}

/// Two nodes started at once on a fresh database: the migrations run under
/// an advisory lock, so one node applies each migration exactly once while
/// the other waits and then finds them applied; both serve, and a session
/// created on one is read through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_starting_together_on_a_fresh_database_migrate_it_once() {
    let _turn = SERIAL.lock().await;
    let world = World::new(shared().database().await.unwrap(), &Settings::default()).unwrap();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| world.node());
        let b = s.spawn(|| world.node());
        (a.join().unwrap(), b.join().unwrap())
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    let applied = database_count(&world, "SELECT count(*) FROM overseer_migrations").await;
    let distinct = database_count(
        &world,
        "SELECT count(DISTINCT version) FROM overseer_migrations",
    )
    .await;
    let newest = database_count(
        &world,
        "SELECT max(version)::bigint FROM overseer_migrations",
    )
    .await;
    assert_eq!(
        (applied, distinct),
        (newest, newest),
        "each migration once: {}\n{}",
        a.log(),
        b.log()
    );
    let id = create(&world, &a, 1).await.unwrap();
    let through_b = get(&world, &b, &format!("/v1/sessions/{id}"))
        .await
        .unwrap();
    assert_eq!(through_b["id"], id.as_str());

    // `store backup` against a cluster node: PostgreSQL is backed up with
    // its own tools, and the refusal says which.
    let target = world.dir.path().join("backup");
    let out = std::process::Command::new(common::served::BIN)
        .args(["store", "backup", "--url", &a.url, "--to"])
        .arg(&target)
        .env("OVERSEER_TOKEN", common::token("acme", "ops", &["admin"]))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("409") && err.contains("pg_dump") && err.contains("point-in-time"),
        "{err}"
    );
    assert!(!target.exists(), "nothing was kept");
}
