//! What the actor tree does when its store says a session is not this
//! node's to write (cluster mode, §15), through a store that can be told so:
//! the refused write changes nothing and the caller is told it is owned
//! elsewhere; the actor stops and is not restarted (a restart would resume,
//! and could dispatch, on the wrong node); activation asks the store first
//! and is refused; and `drop_actors` stops every actor without a write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use overseer_actors::model::{
    Decision, Event, SessionHeader, SessionId, SessionStatus, Submission,
};
use overseer_actors::store::{
    all_by_status, Checkpoint, CheckpointStore, MemStore, SessionSummary, StoreError, StoredSession,
};
use overseer_actors::{Overseer, RuntimeConfig, SessionError};

/// A `MemStore` whose node can lose every tree at once.
#[derive(Clone, Default)]
struct Fenced {
    inner: MemStore,
    lost: Arc<AtomicBool>,
    claims: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl Fenced {
    fn not_owner(session: SessionId) -> StoreError {
        StoreError::NotOwner {
            session,
            reason: "another node took over its tree".into(),
        }
    }
}

#[async_trait::async_trait]
impl CheckpointStore for Fenced {
    async fn checkpoint(&self, cp: Checkpoint) -> Result<(), StoreError> {
        if self.lost.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Self::not_owner(cp.header.id));
        }
        self.inner.checkpoint(cp).await
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
        Ok(())
    }
    async fn claim(&self, root: SessionId) -> Result<bool, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            return Err(Self::not_owner(root));
        }
        Ok(false)
    }
}

async fn start(store: &Fenced) -> Overseer {
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    Overseer::start(
        vec![agent(&["echo"])],
        Arc::new(store.clone()),
        scripted(echo_then_answer()),
        tools(runs, seen),
        RuntimeConfig::default(),
    )
    .await
    .unwrap()
}

async fn parked(ov: &Overseer) -> (SessionId, overseer_actors::model::ToolCallId) {
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(overseer_actors::CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("go".into()),
        id: Some(id),
        ..Default::default()
    })
    .await
    .unwrap();
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = ov.state(id).await.unwrap().header.open_calls[0].id.clone();
    (id, call)
}

#[tokio::test(start_paused = true)]
async fn a_session_another_node_owns_is_neither_written_nor_restarted() {
    let store = Fenced::default();
    let ov = start(&store).await;
    let (id, call) = parked(&ov).await;
    assert!(
        store.claims.load(Ordering::SeqCst) >= 1,
        "create claims the tree"
    );
    let before = store.inner.checkpoints();

    store.lost.store(true, Ordering::SeqCst);
    let err = bounded(
        "the refused decision",
        ov.submit(id, Submission::one(call.clone(), Decision::approve())),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, SessionError::Store(e) if e.is_not_owner()),
        "the caller learns the session is owned elsewhere: {err:?}"
    );
    // The actor went and was not restarted: nothing live, nothing written,
    // the decision not recorded, the tool never ran.
    poll("the actor to stop", Duration::from_millis(10), || async {
        (ov.bookkeeping().live == 0).then_some(())
    })
    .await;
    // Past every restart backoff (100 ms × 2ⁿ, at most 5 s), on paused time.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(ov.bookkeeping().live, 0, "not restarted");
    assert_eq!(
        ov.metrics().restarts.load(Ordering::SeqCst),
        0,
        "no restart was even scheduled"
    );
    assert_eq!(store.inner.checkpoints(), before);
    assert_eq!(
        store.inner.load(id).await.unwrap().unwrap().header.status,
        SessionStatus::AwaitingApproval
    );
    assert_eq!(ov.restart_histories().await.unwrap(), 0);
    // Activation asks the store first, and is refused.
    let err = ov
        .submit(id, Submission::one(call, Decision::approve()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::Store(e) if e.is_not_owner()),
        "{err:?}"
    );
    assert_eq!(ov.bookkeeping().live, 0);
    assert_eq!(store.inner.checkpoints(), before);
}

#[tokio::test]
async fn drop_actors_stops_every_session_and_writes_nothing() {
    let store = Fenced::default();
    let ov = start(&store).await;
    for _ in 0..3 {
        parked(&ov).await;
    }
    assert_eq!(ov.bookkeeping().live, 3);
    assert_eq!(ov.bookkeeping().timers, 3);
    let before = store.inner.checkpoints();
    assert_eq!(bounded("drop_actors", ov.drop_actors()).await, 3);
    let held = ov.bookkeeping();
    assert_eq!(
        (held.live, held.journal, held.timers),
        (0, 0, 0),
        "{held:?}"
    );
    assert_eq!(store.inner.checkpoints(), before);
    // The sessions are intact on disk and come back on the next request.
    let id = all_by_status(&store.inner, &[], 2).await.unwrap()[0].id;
    let call = ov.state(id).await.unwrap().header.open_calls[0].id.clone();
    ov.submit(id, Submission::one(call, Decision::approve()))
        .await
        .unwrap();
    assert_eq!(store.refused.load(Ordering::SeqCst), 0);
}
