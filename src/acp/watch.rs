//! Following one call the editor is being asked about, until it no longer
//! waits for the editor: the events of the session that owns it (live, plus
//! the store on gaps, lags and now and then, as the follower reads them)
//! checked against [`PromptClosed`], the one rule of what closes a question.
//!
//! One watch lives exactly as long as one open permission request; it
//! decides nothing and sends nothing to the editor.

use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use overseer_actors::model::{Event, Notification, PromptClosed, SessionId, ToolCallId};

use super::sessions::{Feed, Sessions};

/// How often a local watch reads the store besides the live stream (an actor
/// restarted after a checkpoint never publishes that checkpoint's events).
const STORE_POLL: Duration = Duration::from_secs(1);

/// A call being watched.
pub(crate) struct CallWatch {
    sessions: Sessions,
    owner: SessionId,
    call: ToolCallId,
    feed: Feed,
    /// The owner's last event seen.
    last: u64,
}

impl CallWatch {
    /// Starts watching `call` of `owner` from its event `after` (the event
    /// that asked, or the state the call was read from as waiting); `None`:
    /// read the owner's state now. `Err` when the call already does not wait.
    pub(crate) async fn start(
        sessions: &Sessions,
        owner: SessionId,
        call: &ToolCallId,
        after: Option<u64>,
    ) -> Result<Self, PromptClosed> {
        // Subscribed before anything is read, so nothing falls in between.
        let feed = sessions.subscribe(owner);
        let last = match after {
            Some(seq) => seq,
            None => match sessions.state(owner).await {
                Ok(stored) => {
                    let h = &stored.header;
                    let record = h.open_calls.iter().find(|c| &c.id == call);
                    if let Some(closed) = PromptClosed::by_record(record) {
                        return Err(closed);
                    }
                    h.last_event_seq
                }
                Err(e) => {
                    // Every event of the session then: slower, never wrong.
                    tracing::warn!(session = %owner, call = %call, "cannot read the session's state: {e}");
                    0
                }
            },
        };
        let mut watch = Self {
            sessions: sessions.clone(),
            owner,
            call: call.clone(),
            feed: feed.after(last),
            last,
        };
        match watch.catch_up().await {
            Some(closed) => Err(closed),
            None => Ok(watch),
        }
    }

    /// Waits until the call no longer waits for the editor, and says why.
    pub(crate) async fn closed(&mut self) -> PromptClosed {
        let local = self.sessions.local().is_some();
        let mut poll = tokio::time::interval(STORE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.reset();
        loop {
            let next = tokio::select! {
                n = self.feed.recv() => Some(n),
                _ = poll.tick(), if local => None,
            };
            let closed = match next {
                Some(Ok(Notification::Event(event))) => match self.gap_before(&event).await {
                    Some(closed) => Some(closed),
                    None => self.event(&event),
                },
                Some(Ok(Notification::TextDelta { .. })) => None,
                Some(Err(RecvError::Lagged(_))) | None => self.catch_up().await,
                Some(Err(RecvError::Closed)) => {
                    // The session cannot be followed (a server that no
                    // longer shows it): nobody could act on an answer.
                    tracing::info!(session = %self.owner, call = %self.call, "the session's events ended");
                    Some(PromptClosed::Gone)
                }
            };
            if let Some(closed) = closed {
                return closed;
            }
        }
    }

    /// Events checkpointed but never published (their actor died in
    /// between) come from the store, before `event`.
    async fn gap_before(&mut self, event: &Event) -> Option<PromptClosed> {
        if event.seq > self.last + 1 {
            self.catch_up().await
        } else {
            None
        }
    }

    /// The owner's stored events after the last one seen (locally; a remote
    /// feed resumes by `Last-Event-ID` and leaves no gap).
    async fn catch_up(&mut self) -> Option<PromptClosed> {
        match self.sessions.events_after(self.owner, self.last).await {
            Ok(events) => events.iter().find_map(|e| self.event(e)),
            Err(e) => {
                tracing::warn!(session = %self.owner, "cannot read stored events: {e}");
                None
            }
        }
    }

    fn event(&mut self, event: &Event) -> Option<PromptClosed> {
        // Events read from the store may repeat live ones.
        if event.seq <= self.last {
            return None;
        }
        self.last = event.seq;
        PromptClosed::by_event(&event.kind, &self.call)
    }
}
