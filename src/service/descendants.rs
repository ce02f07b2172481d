//! Watching a delegation tree for its descendants' pending approvals, for
//! the two front ends that follow one root and ask a person about every
//! call of its tree: `overseer run` and `overseer acp`.
//!
//! A root's own calls are announced by its own events; a subagent's are
//! announced on the child's stream, which the front end does not follow.
//! The root starts waiting whenever a child that propagates its approvals
//! does, so each time the root's events say it starts waiting (or some
//! were missed) the tree's pending calls are listed and each new one is
//! handed on, once while it stays pending.
//!
//! It owns only that loop. Where the list comes from (the runtime in this
//! process, or a server over HTTP) and what "handing on" means (a terminal
//! question, an editor's permission request) are the caller's.

use std::collections::HashSet;
use std::future::Future;

use overseer_actors::model::{Notification, SessionId, ToolCallId};
use tokio::sync::broadcast::error::RecvError;

/// A stream of a root's notifications: the runtime's broadcast receiver,
/// or a server's event stream read into the same shape.
pub(crate) trait Notifications {
    /// The next notification, `Lagged` when some were missed, `Closed` at
    /// the end.
    fn next(&mut self) -> impl Future<Output = Result<Notification, RecvError>> + Send;
}

impl Notifications for tokio::sync::broadcast::Receiver<Notification> {
    fn next(&mut self) -> impl Future<Output = Result<Notification, RecvError>> + Send {
        self.recv()
    }
}

/// A pending call of the tree, as the list gives it.
pub(crate) trait TreeCall {
    /// The session that owns the call.
    fn session(&self) -> SessionId;
    /// The call.
    fn call(&self) -> &ToolCallId;
}

impl TreeCall for overseer_actors::PendingApproval {
    fn session(&self) -> SessionId {
        self.session_id
    }
    fn call(&self) -> &ToolCallId {
        &self.call.id
    }
}

/// Hands `announce` every pending call of a descendant of `root`, each
/// once while it is pending. Looks once at the start (a loaded session may
/// already wait for a child), then whenever `rx` says the root starts
/// waiting or missed events; ends when `rx` closes.
pub(crate) async fn watch<P, E, L, F>(
    root: SessionId,
    mut rx: impl Notifications,
    mut list: L,
    mut announce: impl FnMut(P),
) where
    P: TreeCall,
    L: FnMut() -> F,
    F: Future<Output = Result<Vec<P>, E>>,
{
    let mut seen: HashSet<ToolCallId> = HashSet::new();
    let mut first = true;
    loop {
        let look = if std::mem::take(&mut first) {
            true
        } else {
            match rx.next().await {
                Ok(n) => n.starts_awaiting_approval(),
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            }
        };
        if !look {
            continue;
        }
        // The child's request may land a moment after the root's status
        // changed; a second look catches it without polling forever.
        for _ in 0..2 {
            let Ok(pending) = list().await else {
                break;
            };
            // Only calls still pending are remembered: the set stays as
            // small as the tree's open approvals.
            seen.retain(|c| pending.iter().any(|p| p.call() == c));
            for p in pending.into_iter().filter(|p| p.session() != root) {
                if seen.insert(p.call().clone()) {
                    announce(p);
                }
            }
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::{Arc, Mutex};

    use overseer_actors::model::{Event, EventKind, Notification, SessionStatus};
    use tokio::sync::broadcast;

    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Call(SessionId, ToolCallId);

    impl TreeCall for Call {
        fn session(&self) -> SessionId {
            self.0
        }
        fn call(&self) -> &ToolCallId {
            &self.1
        }
    }

    #[tokio::test]
    async fn each_descendant_call_is_announced_once_while_pending_and_the_roots_never() {
        let root = SessionId::generate();
        let child = SessionId::generate();
        let own = Call(root, ToolCallId::from("own"));
        let a = Call(child, ToolCallId::from("a"));
        let b = Call(child, ToolCallId::from("b"));
        let lists = Arc::new(Mutex::new(vec![
            // Looked at the start: the child's `a` waits already.
            vec![own.clone(), a.clone()],
            vec![own.clone(), a.clone()],
            // Then `a` is decided and `b` asked: `a` is forgotten.
            vec![b.clone()],
            vec![b.clone()],
            // And `a` asked again: announced again.
            vec![a.clone(), b.clone()],
            vec![a.clone(), b.clone()],
        ]));
        let (tx, rx) = broadcast::channel(8);
        let announced = Arc::new(Mutex::new(Vec::new()));
        let seen = announced.clone();
        let source = lists.clone();
        let watcher = tokio::spawn(watch(
            root,
            rx,
            move || {
                let next = source.lock().unwrap().drain(..1).next().unwrap_or_default();
                async move { Ok::<_, ()>(next) }
            },
            move |p| seen.lock().unwrap().push(p),
        ));
        let waiting = || {
            Notification::Event(Event {
                session_id: root,
                seq: 0,
                at_ms: 0,
                kind: EventKind::StatusChanged {
                    status: SessionStatus::AwaitingApproval,
                },
            })
        };
        tx.send(waiting()).unwrap();
        tx.send(waiting()).unwrap();
        drop(tx);
        watcher.await.unwrap();
        assert_eq!(*announced.lock().unwrap(), vec![a.clone(), b, a]);
        assert!(lists.lock().unwrap().is_empty(), "every look was taken");
    }
}
