//! The provider error policy as a [`Provider`] decorator.
//!
//! Before any visible output (a text delta or a tool call; see `visible`)
//! a rate-limit, server or transport error is retried up to three times,
//! waiting 1 s, 2 s, 4 s (doubling, capped at 10 s) or what the server's
//! `retry-after` asks (on a 429 and a 5xx alike). A server that asks for
//! more than `max_retry_after` (the route's `max_retry_after_secs`, 60 s by
//! default) is not waited for: the request fails at once, saying so. A
//! stream that ends before any output is a transport error, retried like a
//! disconnect. An authentication error re-reads the key from the
//! environment once and retries; when no key was sent at all, the error
//! says which setting would send one. Whatever came before the first
//! visible output (usage so far) is held back meanwhile. Once output is
//! visible, nothing is retried: the error passes through, and the runtime
//! keeps the partial text and records the error beside it.
//!
//! Every attempt is a request made: each failed one is reported to the
//! caller as a usage event (1 in `provider_requests`, with the tokens it
//! reported) when the next is made, so a session's usage counts retries
//! too, even when it stops the stream while they go on.
//!
//! This module owns only that policy. It deliberately knows no wire format
//! and no status code: the inner provider has already classified its failure
//! as a [`ProviderError`]. Waits use `tokio::time`, so tests can run them on
//! a paused clock.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use overseer_actors::model::Usage;
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use serde_json::Value;

use super::KeySource;
use crate::backoff::Backoff;

/// How failures before the first event are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (3).
    pub max_retries: u32,
    /// Wait before the first retry; doubles with each retry, with jitter
    /// ([`Backoff`]).
    pub initial_backoff: Duration,
    /// Longest computed wait.
    pub max_backoff: Duration,
    /// Longest `retry-after` honoured; a server asking for more is answered
    /// with a failure now rather than a turn that hangs for minutes.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(super::DEFAULT_MAX_RETRY_AFTER_SECS),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based) after `error`, or
    /// `None` when the policy gives up (see [`RetryPolicy::too_long`] for
    /// why, when the server asked for too long a wait).
    pub fn delay(&self, retry: u32, error: &ProviderError) -> Option<Duration> {
        if retry >= self.max_retries || !error.is_retryable() {
            return None;
        }
        if let Some(wait) = error.retry_after() {
            return (wait <= self.max_retry_after).then_some(wait);
        }
        Some(Backoff::new(self.initial_backoff, self.max_backoff).delay(retry))
    }

    /// The wait `error` asks for, when it is more than this policy honours.
    pub fn too_long(&self, error: &ProviderError) -> Option<Duration> {
        error
            .retry_after()
            .filter(|wait| error.is_retryable() && *wait > self.max_retry_after)
    }
}

/// A provider that applies the provider error policy to another.
pub struct RetryingProvider {
    retrier: Arc<Retrier>,
}

/// The policy and what it needs, shared with the streams it drives.
struct Retrier {
    inner: Arc<dyn Provider>,
    keys: Option<Arc<KeySource>>,
    policy: RetryPolicy,
}

impl RetryingProvider {
    /// Wraps `inner`. `keys` is the key source `inner` reads, refreshed once
    /// after an authentication failure; without one, auth errors are final.
    pub fn new(
        inner: Arc<dyn Provider>,
        keys: Option<Arc<KeySource>>,
        policy: RetryPolicy,
    ) -> Self {
        Self {
            retrier: Arc::new(Retrier {
                inner,
                keys,
                policy,
            }),
        }
    }
}

/// How one attempt ended before handing anything on.
enum Attempt {
    /// Output became visible (or the stream finished): hand it all on.
    Started(ProviderStream),
    /// It failed before any visible output, having reported this usage.
    Failed(ProviderError, Usage),
}

/// What the policy makes of a failed attempt.
enum Next {
    /// Try again after this wait.
    Retry(Duration),
    /// Give up with this error.
    Fail(ProviderError),
}

/// Whether `event` is output the caller shows (and so may not be repeated
/// by a retry): text, a tool call, or the finish of a stream that had
/// neither. Usage is bookkeeping, whenever a provider sends it.
fn visible(event: &ProviderEvent) -> bool {
    !matches!(event, ProviderEvent::Usage(_))
}

/// The usage events among `held`, added up.
fn usage_of(held: &[Result<ProviderEvent, ProviderError>]) -> Usage {
    let mut usage = Usage::default();
    for event in held {
        if let Ok(ProviderEvent::Usage(u)) = event {
            usage.add(u);
        }
    }
    usage
}

/// The message of a stream that ended before it showed anything.
const ENDED_BEFORE_OUTPUT: &str = "the stream ended before any output";

impl Retrier {
    /// One attempt, up to its first visible event. Waiting for that event
    /// here is what makes an error that comes before any output retryable.
    async fn attempt(&self, request: &ProviderRequest) -> Attempt {
        let mut stream = match self.inner.stream(request.clone()).await {
            Ok(stream) => stream,
            Err(e) => return Attempt::Failed(e, Usage::default()),
        };
        let mut held = Vec::new();
        loop {
            match stream.next().await {
                Some(Err(e)) => return Attempt::Failed(e, usage_of(&held)),
                Some(Ok(event)) => {
                    let shown = visible(&event);
                    held.push(Ok(event));
                    if shown {
                        return Attempt::Started(futures::stream::iter(held).chain(stream).boxed());
                    }
                }
                // Ended with nothing to show and no finish: as good as a
                // connection that broke there.
                None => {
                    return Attempt::Failed(
                        ProviderError::Transport(ENDED_BEFORE_OUTPUT.into()),
                        usage_of(&held),
                    )
                }
            }
        }
    }

    /// What to do after attempt number `retries + 1` failed with `error`.
    fn next(
        &self,
        error: ProviderError,
        retries: &mut u32,
        key_reloaded: &mut bool,
        request: &ProviderRequest,
    ) -> Next {
        if let ProviderError::Auth(message) = &error {
            let Some(keys) = self.keys.as_ref().filter(|_| !*key_reloaded) else {
                return Next::Fail(error);
            };
            *key_reloaded = true;
            if keys.var().is_none() {
                let why = if keys.current().is_none() {
                    "no API key was sent: a route with a base_url (--base-url) sends one \
                     only from the environment variable its api_key_env (--api-key-env) \
                     names, e.g. --api-key-env OPENAI_API_KEY"
                } else {
                    "the key was given directly and cannot be re-read"
                };
                return Next::Fail(ProviderError::Auth(format!("{message}; {why}")));
            }
            if let Err(why) = keys.reload() {
                return Next::Fail(ProviderError::Auth(format!(
                    "{message}; the key could not be re-read: {why} (api_key_env, --api-key-env)"
                )));
            }
            tracing::warn!(
                session_id = %request.session_id,
                var = keys.var().unwrap_or_default(),
                "provider refused the key; re-read it from the environment and retrying"
            );
            return Next::Retry(Duration::ZERO);
        }
        match self.policy.delay(*retries, &error) {
            Some(wait) => {
                *retries += 1;
                tracing::warn!(
                    session_id = %request.session_id,
                    error = %error,
                    retry = *retries,
                    wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    "provider request failed before any output; retrying"
                );
                Next::Retry(wait)
            }
            None => Next::Fail(match self.policy.too_long(&error) {
                Some(asked) if *retries < self.policy.max_retries => {
                    waited_too_long(error, asked, self.policy.max_retry_after)
                }
                _ if *retries > 0 => gave_up(error, *retries + 1),
                _ => error,
            }),
        }
    }
}

#[async_trait::async_trait]
impl Provider for RetryingProvider {
    fn context_window(&self, model: &str) -> Option<u64> {
        self.retrier.inner.context_window(model)
    }

    fn describe_route(&self, model: &str) -> Option<Value> {
        self.retrier.inner.describe_route(model)
    }

    /// The attempts run inside the returned stream, so that each failed
    /// one is reported (a usage event of one request, with the tokens it
    /// reported) as soon as the next one is made: a caller that drops the
    /// stream in between (an interrupt) has counted exactly the requests
    /// made. The request of the attempt in flight is the caller's own.
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let retrier = self.retrier.clone();
        Ok(Box::pin(async_stream::stream! {
            let mut retries = 0u32;
            let mut key_reloaded = false;
            loop {
                let (error, spent) = match retrier.attempt(&request).await {
                    Attempt::Started(mut stream) => {
                        while let Some(item) = stream.next().await {
                            yield item;
                        }
                        return;
                    }
                    Attempt::Failed(e, spent) => (e, spent),
                };
                match retrier.next(error, &mut retries, &mut key_reloaded, &request) {
                    Next::Retry(wait) => {
                        // An event of the request's `chat` span.
                        tracing::info!(
                            target: overseer_actors::genai::TARGET,
                            retry = retries,
                            wait_ms = wait.as_millis() as u64,
                            "provider request retried"
                        );
                        tokio::time::sleep(wait).await;
                        yield Ok(ProviderEvent::Usage(Usage {
                            provider_requests: 1,
                            ..spent
                        }));
                    }
                    Next::Fail(error) => {
                        if spent.input_tokens > 0 || spent.output_tokens > 0 {
                            yield Ok(ProviderEvent::Usage(Usage {
                                provider_requests: 0,
                                ..spent
                            }));
                        }
                        yield Err(error);
                        return;
                    }
                }
            }
        }))
    }
}

/// Appends `note` to the message of a retryable error.
fn noted(error: ProviderError, note: &str) -> ProviderError {
    match error {
        ProviderError::RateLimited {
            retry_after,
            message,
        } => ProviderError::RateLimited {
            retry_after,
            message: message + note,
        },
        ProviderError::Transport(m) => ProviderError::Transport(m + note),
        ProviderError::Server {
            status,
            retry_after,
            message,
        } => ProviderError::Server {
            status,
            retry_after,
            message: message + note,
        },
        other => other,
    }
}

/// Says in the error how hard we tried, so "server error 500" is not read
/// as a single unlucky request.
fn gave_up(error: ProviderError, attempts: u32) -> ProviderError {
    noted(error, &format!(" (gave up after {attempts} attempts)"))
}

/// Says in the error that the server asked for a longer wait than allowed,
/// and which setting allows it.
fn waited_too_long(error: ProviderError, asked: Duration, cap: Duration) -> ProviderError {
    noted(
        error,
        &format!(
            " (the server asked to retry after {} s, more than the {} s max_retry_after_secs allows: not retried)",
            secs(asked),
            secs(cap)
        ),
    )
}

/// Seconds, without a fraction when there is none.
fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use overseer_actors::model::{SessionId, Usage};
    use overseer_actors::provider::FinishReason;

    /// Answers its first request with `first`, every later one with `then`.
    struct Twice {
        calls: AtomicUsize,
        first: Vec<Result<ProviderEvent, ProviderError>>,
        then: Vec<Result<ProviderEvent, ProviderError>>,
    }

    #[async_trait::async_trait]
    impl Provider for Twice {
        async fn stream(&self, _: ProviderRequest) -> Result<ProviderStream, ProviderError> {
            let items = if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                self.first.clone()
            } else {
                self.then.clone()
            };
            Ok(futures::stream::iter(items).boxed())
        }
    }

    fn request() -> ProviderRequest {
        ProviderRequest {
            session_id: SessionId::generate(),
            agent: "a".into(),
            model: "m".into(),
            instructions: String::new(),
            transcript: Vec::new(),
            tools: Vec::new(),
            output_schema: None,
            purpose: Default::default(),
        }
    }

    fn usage(input: u64) -> ProviderEvent {
        ProviderEvent::Usage(Usage {
            input_tokens: input,
            ..Usage::default()
        })
    }

    async fn run(inner: Twice) -> (Vec<Result<ProviderEvent, ProviderError>>, usize) {
        let inner = Arc::new(inner);
        let policy = RetryPolicy {
            initial_backoff: Duration::ZERO,
            ..RetryPolicy::default()
        };
        let provider = RetryingProvider::new(inner.clone(), None, policy);
        let items = match provider.stream(request()).await {
            Ok(stream) => stream.collect().await,
            Err(e) => vec![Err(e)],
        };
        (items, inner.calls.load(Ordering::SeqCst))
    }

    fn broke() -> ProviderError {
        ProviderError::Transport("the stream broke".into())
    }

    #[tokio::test]
    async fn usage_before_any_output_does_not_stop_a_retry() {
        let hello = ProviderEvent::TextDelta("Hello".into());
        let done = ProviderEvent::Done(FinishReason::Stop);
        let (items, calls) = run(Twice {
            calls: AtomicUsize::new(0),
            first: vec![Ok(usage(5)), Err(broke())],
            then: vec![Ok(usage(7)), Ok(hello.clone()), Ok(done.clone())],
        })
        .await;
        assert_eq!(calls, 2);
        // The failed attempt is handed on as a request made (with what it
        // reported), ahead of the retry's own events.
        let failed = ProviderEvent::Usage(Usage {
            provider_requests: 1,
            input_tokens: 5,
            ..Usage::default()
        });
        assert_eq!(items, vec![Ok(failed), Ok(usage(7)), Ok(hello), Ok(done)]);
    }

    #[tokio::test]
    async fn an_error_after_visible_output_is_not_retried() {
        let call = ProviderEvent::ToolCall {
            name: "t".into(),
            arguments: serde_json::json!({}),
        };
        let (items, calls) = run(Twice {
            calls: AtomicUsize::new(0),
            first: vec![Ok(usage(5)), Ok(call.clone()), Err(broke())],
            then: vec![],
        })
        .await;
        assert_eq!(calls, 1);
        assert_eq!(items, vec![Ok(usage(5)), Ok(call), Err(broke())]);
    }

    #[test]
    fn backoff_doubles_from_one_second_with_jitter_capped_at_ten() {
        let p = RetryPolicy {
            max_retries: 6,
            ..RetryPolicy::default()
        };
        let server = ProviderError::Server {
            status: 500,
            retry_after: None,
            message: String::new(),
        };
        for (retry, base) in [(0, 1), (1, 2), (2, 4), (3, 8), (4, 10), (5, 10)] {
            let wait = p.delay(retry, &server).unwrap();
            let (lo, hi) = (
                Duration::from_secs(base),
                Duration::from_secs((2 * base).min(10)),
            );
            assert!(wait >= lo && wait <= hi, "retry {retry}: {wait:?}");
        }
        assert_eq!(p.delay(6, &server), None);
    }

    #[test]
    fn retry_after_is_honoured_within_bounds_and_other_errors_are_final() {
        let p = RetryPolicy::default();
        let limited = |secs| ProviderError::RateLimited {
            retry_after: Some(Duration::from_secs(secs)),
            message: String::new(),
        };
        assert_eq!(p.delay(0, &limited(0)), Some(Duration::ZERO));
        assert_eq!(p.delay(2, &limited(30)), Some(Duration::from_secs(30)));
        assert_eq!(p.delay(0, &limited(3600)), None);
        assert_eq!(p.delay(3, &limited(0)), None);
        assert_eq!(p.delay(0, &ProviderError::BadResponse("x".into())), None);
        assert_eq!(p.delay(0, &ProviderError::Auth("x".into())), None);
    }
}
