//! A question about one call on the terminal (`--approve ask`) that ends as
//! soon as the call no longer waits for it: decided elsewhere (the approval
//! timeout, a standing rule, a decision through the in-process API), or
//! ended with its turn (Ctrl-C's interrupt, a failure). [`Watch`] follows
//! the call's own session against [`PromptClosed`], the one rule of what
//! closes a question; [`read_line`] reads the answer and gives up when the
//! watch says so.
//!
//! A closed question's read stops before taking anything from the
//! terminal, and what was typed for it and not yet entered is discarded:
//! a keystroke meant for one call never answers the next one. That takes
//! poll(2) and tcflush(3), so on other platforms a question is closed only
//! once its line is read (the line then decides nothing).

use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};

use overseer_actors::model::{Event, Notification, PromptClosed, SessionId, ToolCallId};
use overseer_actors::Overseer;

use crate::cli::terminal;

/// How often a watch reads the store besides the live stream (an actor
/// restarted after a checkpoint never publishes that checkpoint's events).
const STORE_POLL: Duration = Duration::from_secs(1);

/// One call being asked about, followed until it no longer waits.
pub(super) struct Watch {
    overseer: Overseer,
    owner: SessionId,
    call: ToolCallId,
    rx: broadcast::Receiver<Notification>,
    last: u64,
}

impl Watch {
    /// Starts following `call` of `owner`; `Err` if it already does not
    /// wait (then it is not asked at all).
    pub(super) async fn start(
        overseer: &Overseer,
        owner: SessionId,
        call: &ToolCallId,
    ) -> Result<Self, PromptClosed> {
        // Subscribed before the header is read: nothing falls in between.
        let rx = overseer.subscribe(owner);
        let last = match overseer.header(owner).await {
            Ok(h) => {
                let record = h.open_calls.iter().find(|c| &c.id == call);
                if let Some(closed) = PromptClosed::by_record(record) {
                    return Err(closed);
                }
                h.last_event_seq
            }
            // Asked anyway; the events from the first tell the rest.
            Err(_) => 0,
        };
        Ok(Self {
            overseer: overseer.clone(),
            owner,
            call: call.clone(),
            rx,
            last,
        })
    }

    /// Waits until the call no longer waits, and says why.
    pub(super) async fn closed(mut self) -> PromptClosed {
        let mut poll = tokio::time::interval(STORE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                n = self.rx.recv() => Some(n),
                _ = poll.tick() => None,
            };
            let closed = match next {
                Some(Ok(Notification::Event(event))) if event.seq <= self.last + 1 => {
                    self.event(&event)
                }
                // A gap (events checkpointed, never published), a lag or a
                // poll: the store has every event, in order.
                Some(Ok(Notification::Event(_))) | Some(Err(RecvError::Lagged(_))) | None => {
                    self.catch_up().await
                }
                Some(Ok(Notification::TextDelta { .. })) => None,
                // The runtime is shutting down: nobody can decide any more.
                Some(Err(RecvError::Closed)) => Some(PromptClosed::Gone),
            };
            if let Some(closed) = closed {
                return closed;
            }
        }
    }

    async fn catch_up(&mut self) -> Option<PromptClosed> {
        let events = self
            .overseer
            .events_after(self.owner, self.last, usize::MAX)
            .await
            .ok()?;
        events.iter().find_map(|e| self.event(e))
    }

    fn event(&mut self, event: &Event) -> Option<PromptClosed> {
        if event.seq <= self.last {
            return None;
        }
        self.last = event.seq;
        PromptClosed::by_event(&event.kind, &self.call)
    }
}

/// What a question got.
pub(super) enum Read {
    /// A line (`None` at the end of input).
    Line(Option<String>),
    /// Nothing: the call stopped waiting first.
    Closed(PromptClosed),
}

/// Prints `prompt` on stderr and reads one line from stdin on a blocking
/// thread (never on an async worker), unless `closed` ends first.
#[cfg(unix)]
pub(super) async fn read_line(
    prompt: String,
    closed: &mut (impl Future<Output = PromptClosed> + Unpin),
) -> Read {
    // Dropping the writer is the reader's signal to stop.
    let (stop, stop_writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => {
            tracing::warn!("cannot make a pipe to stop a question: {e}");
            return read_to_end(prompt, closed).await;
        }
    };
    let mut reading = tokio::task::spawn_blocking(move || {
        show(&prompt);
        let stdin = std::io::stdin();
        tty::read_line(std::os::fd::AsFd::as_fd(&stdin), &stop)
    });
    tokio::select! {
        got = &mut reading => match got {
            Ok(tty::Got::Line(line)) => Read::Line(Some(line)),
            Ok(tty::Got::End) | Err(_) => Read::Line(None),
            // Only `stop_writer`'s drop stops it, and that is below; were it
            // ever to, the question is over but decides nothing.
            Ok(tty::Got::Stopped) => Read::Closed(PromptClosed::Gone),
        },
        why = closed => {
            drop(stop_writer);
            // The reader stops at once, or has just read a line typed for
            // this question, which decides nothing now.
            let _ = reading.await;
            Read::Closed(why)
        }
    }
}

#[cfg(not(unix))]
pub(super) async fn read_line(
    prompt: String,
    closed: &mut (impl Future<Output = PromptClosed> + Unpin),
) -> Read {
    read_to_end(prompt, closed).await
}

/// The question without a way to stop its read: it ends with its line.
async fn read_to_end(
    prompt: String,
    closed: &mut (impl Future<Output = PromptClosed> + Unpin),
) -> Read {
    let line = tokio::task::spawn_blocking(move || {
        show(&prompt);
        let mut line = String::new();
        match std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    })
    .await
    .ok()
    .flatten();
    // A call closed meanwhile takes no answer.
    match futures::poll!(closed) {
        std::task::Poll::Ready(why) => Read::Closed(why),
        std::task::Poll::Pending => Read::Line(line),
    }
}

fn show(prompt: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{}", terminal::inline(prompt));
    let _ = err.flush();
}

/// Reading one line from a terminal, stoppably.
#[cfg(unix)]
mod tty {
    use std::os::fd::{AsFd, BorrowedFd};

    use nix::errno::Errno;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::termios::{tcflush, FlushArg};

    /// What a read got.
    #[derive(Debug, PartialEq)]
    pub(super) enum Got {
        /// A line, with its newline.
        Line(String),
        /// The end of input.
        End,
        /// `stop` became readable or closed first: nothing was read, and
        /// what was typed and not entered was discarded.
        Stopped,
    }

    /// Waits for a line on `input` or for `stop`, whichever comes first.
    /// The line is read a byte at a time, so nothing after it is taken
    /// from the terminal (a terminal in canonical mode hands over whole
    /// lines, so this is one line's bytes).
    pub(super) fn read_line(input: BorrowedFd<'_>, stop: &impl AsFd) -> Got {
        loop {
            let mut fds = [
                PollFd::new(input, PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                // A signal (Ctrl-C is handled by the runtime): wait again.
                Err(Errno::EINTR) => continue,
                Err(_) => return Got::End,
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                // Not a terminal (a test's pipe): nothing to discard.
                let _ = tcflush(input, FlushArg::TCIFLUSH);
                return Got::Stopped;
            }
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                break;
            }
        }
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            match nix::unistd::read(input, &mut byte) {
                Ok(0) if line.is_empty() => return Got::End,
                Ok(0) => break,
                Ok(_) => {
                    line.push(byte[0]);
                    if byte[0] == b'\n' {
                        break;
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(_) if line.is_empty() => return Got::End,
                Err(_) => break,
            }
        }
        Got::Line(String::from_utf8_lossy(&line).into_owned())
    }

    #[cfg(test)]
    mod tests {
        #![allow(clippy::unwrap_used, clippy::expect_used)]

        use std::io::Write;
        use std::os::fd::AsFd;

        use super::*;

        /// A reader on the slave side of a fresh pseudo-terminal, stopped by
        /// dropping the returned writer.
        fn reading(
            slave: &std::sync::Arc<std::os::fd::OwnedFd>,
        ) -> (std::io::PipeWriter, std::thread::JoinHandle<Got>) {
            let (stop, stop_writer) = std::io::pipe().unwrap();
            let slave = slave.clone();
            let reader = std::thread::spawn(move || read_line(slave.as_fd(), &stop));
            (stop_writer, reader)
        }

        #[test]
        fn a_stopped_read_takes_nothing_and_discards_what_was_typed_for_it() {
            let pty = nix::pty::openpty(None, None).unwrap();
            let slave = std::sync::Arc::new(pty.slave);
            let mut master = std::fs::File::from(pty.master);

            // An entered line is read, its newline included.
            let (_keep, reader) = reading(&slave);
            master.write_all(b"y\n").unwrap();
            assert_eq!(reader.join().unwrap(), Got::Line("y\n".into()));

            // Typed, not entered, and the question closes: gone.
            let (stop, reader) = reading(&slave);
            master.write_all(b"y").unwrap();
            drop(stop);
            assert_eq!(reader.join().unwrap(), Got::Stopped);

            // The next question's Enter is an empty line, not that "y".
            let (_keep, reader) = reading(&slave);
            master.write_all(b"\n").unwrap();
            assert_eq!(reader.join().unwrap(), Got::Line("\n".into()));
        }
    }
}
