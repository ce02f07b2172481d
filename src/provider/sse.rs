//! Server-sent events off a streaming HTTP response, and the loop that turns
//! them into provider events through a wire-format [`Decoder`].
//!
//! This module owns the parts both providers share: the idle timeout (a
//! stream silent for too long is cut), the mapping of transport and
//! framing failures onto [`ProviderError`], the rule that a stream which
//! ends without a finish is a transport error (retried like a disconnect
//! when nothing was output yet), and its converse: a stream that had
//! reached its finish (OpenAI's `finish_reason`, Anthropic's `stop_reason`)
//! is complete even when its connection then breaks or stalls before the
//! trailer (usage, `[DONE]`, `message_stop`), so the tool calls it finished
//! are kept and the step goes on. The SSE framing itself is parsed by the
//! `eventsource-stream` crate, not by hand; the meaning of each event's data
//! is deliberately left to the decoders.

use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use overseer_actors::provider::{ProviderError, ProviderEvent, ProviderStream};

use super::error_chain;

/// A wire format's reading of an event stream.
pub(super) trait Decoder: Send + 'static {
    /// Handles one SSE event; returns the provider events it completes, in
    /// order. A [`ProviderEvent::Done`] among them ends the stream.
    fn event(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError>;

    /// The body ended: returns what is still pending (ending with `Done`) if
    /// the stream had finished, else an error.
    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError>;

    /// Whether the model has said why it stopped: all its output is in, and
    /// only the trailer may still come.
    fn finished(&self) -> bool;
}

/// The message of a stream that stopped before its finish.
pub(super) const ENDED_WITHOUT_FINISH: &str = "the stream ended without a finish";

/// A stream that stopped before its finish: a transport error, like a
/// connection that broke at the same point (a server or proxy that closes
/// the body cleanly mid-answer is no different), so before any output it
/// is retried.
pub(super) fn ended_without_finish() -> ProviderError {
    ProviderError::Transport(ENDED_WITHOUT_FINISH.into())
}

/// Decodes `response`'s body with `decoder`. The stream ends after `Done` or
/// after the first error; dropping it drops the response, which cancels the
/// request.
pub(super) fn decode<D: Decoder>(
    response: reqwest::Response,
    idle: Duration,
    mut decoder: D,
) -> ProviderStream {
    let events = guarded(response, idle).eventsource();
    Box::pin(async_stream::stream! {
        let mut events = std::pin::pin!(events);
        loop {
            let (batch, finished) = match events.next().await {
                Some(Ok(event)) => (decoder.event(&event), false),
                Some(Err(e)) => {
                    let e = framing_error(e);
                    if decoder.finished() {
                        // What broke is the trailer, not the answer.
                        tracing::warn!(
                            error = %e,
                            "the provider stream broke after its finish; keeping the complete answer"
                        );
                        (decoder.end(), true)
                    } else {
                        (Err(e), true)
                    }
                }
                None => (decoder.end(), true),
            };
            match batch {
                Ok(batch) => {
                    for event in batch {
                        let done = matches!(event, ProviderEvent::Done(_));
                        yield Ok(event);
                        if done {
                            return;
                        }
                    }
                    if finished {
                        // A decoder that reports the end without a `Done`
                        // must not turn into a silent success.
                        yield Err(ended_without_finish());
                        return;
                    }
                }
                Err(e) => {
                    yield Err(e);
                    return;
                }
            }
        }
    })
}

/// The body's bytes, cut with a transport error when nothing arrives for
/// `idle`. The timeout is per chunk, not for the whole stream: a long answer
/// that keeps streaming is never cut.
fn guarded(
    response: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = Result<impl AsRef<[u8]> + Send, ProviderError>> + Send {
    async_stream::stream! {
        let mut body = std::pin::pin!(response.bytes_stream());
        loop {
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(chunk))) => yield Ok(chunk),
                Ok(Some(Err(e))) => {
                    yield Err(ProviderError::Transport(format!(
                        "the stream broke: {}",
                        error_chain(&e)
                    )));
                    return;
                }
                Ok(None) => return,
                Err(_) => {
                    yield Err(ProviderError::Transport(format!(
                        "stream stalled for {} s",
                        idle.as_secs_f64()
                    )));
                    return;
                }
            }
        }
    }
}

fn framing_error(e: EventStreamError<ProviderError>) -> ProviderError {
    match e {
        EventStreamError::Transport(e) => e,
        EventStreamError::Utf8(e) => {
            ProviderError::BadResponse(format!("the event stream is not UTF-8: {e}"))
        }
        EventStreamError::Parser(e) => {
            ProviderError::BadResponse(format!("the event stream is malformed: {e}"))
        }
    }
}
