//! The §11 error policy as a [`Provider`] decorator.
//!
//! Before any visible output (a text delta or a tool call; see `visible`)
//! a rate-limit, server or transport error is retried up to three times,
//! waiting 1 s, 2 s, 4 s (doubling, capped at 10 s) or what the server's
//! `retry-after` asks; an authentication error re-reads the key from the
//! environment once and retries. Whatever came before the first visible
//! output (usage so far) is held back meanwhile, and dropped with the failed
//! attempt. Once output is visible, nothing is retried: the error passes
//! through, and the runtime keeps the partial text and records
//! `[Provider error: …]`.
//!
//! This module owns only that policy. It deliberately knows no wire format
//! and no status code: the inner provider has already classified its failure
//! as a [`ProviderError`]. Waits use `tokio::time`, so tests can run them on
//! a paused clock.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};

use super::KeySource;

/// How failures before the first event are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (§11: 3).
    pub max_retries: u32,
    /// Wait before the first retry; doubles with each retry.
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
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based) after `error`, or
    /// `None` when the policy gives up.
    pub fn delay(&self, retry: u32, error: &ProviderError) -> Option<Duration> {
        if retry >= self.max_retries || !error.is_retryable() {
            return None;
        }
        if let ProviderError::RateLimited {
            retry_after: Some(wait),
            ..
        } = error
        {
            return (*wait <= self.max_retry_after).then_some(*wait);
        }
        let factor = 2u32.saturating_pow(retry);
        Some(
            self.initial_backoff
                .saturating_mul(factor)
                .min(self.max_backoff),
        )
    }
}

/// A provider that applies the §11 error policy to another.
pub struct RetryingProvider {
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
            inner,
            keys,
            policy,
        }
    }
}

/// How one attempt ended before handing anything on.
enum Attempt {
    /// Output became visible (or the stream finished or ended): hand it all
    /// on.
    Started(ProviderStream),
    /// It failed before any visible output.
    Failed(ProviderError),
}

/// Whether `event` is output the caller shows (and so may not be repeated
/// by a retry): text, a tool call, or the finish of a stream that had
/// neither. Usage is bookkeeping, whenever a provider sends it.
fn visible(event: &ProviderEvent) -> bool {
    !matches!(event, ProviderEvent::Usage(_))
}

impl RetryingProvider {
    /// One attempt, up to its first visible event. Waiting for that event
    /// here is what makes an error that comes before any output retryable.
    async fn attempt(&self, request: &ProviderRequest) -> Attempt {
        let mut stream = match self.inner.stream(request.clone()).await {
            Ok(stream) => stream,
            Err(e) => return Attempt::Failed(e),
        };
        let mut held = Vec::new();
        loop {
            match stream.next().await {
                Some(Err(e)) => return Attempt::Failed(e),
                Some(Ok(event)) => {
                    let shown = visible(&event);
                    held.push(Ok(event));
                    if shown {
                        return Attempt::Started(futures::stream::iter(held).chain(stream).boxed());
                    }
                }
                // A stream without a finish is the caller's to judge.
                None => return Attempt::Started(futures::stream::iter(held).boxed()),
            }
        }
    }
}

#[async_trait::async_trait]
impl Provider for RetryingProvider {
    fn context_window(&self, model: &str) -> Option<u64> {
        self.inner.context_window(model)
    }

    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let mut retries = 0u32;
        let mut key_reloaded = false;
        loop {
            let error = match self.attempt(&request).await {
                Attempt::Started(stream) => return Ok(stream),
                Attempt::Failed(e) => e,
            };
            if let ProviderError::Auth(message) = &error {
                let Some(keys) = self.keys.as_ref().filter(|_| !key_reloaded) else {
                    return Err(error);
                };
                key_reloaded = true;
                if let Err(why) = keys.reload() {
                    return Err(ProviderError::Auth(format!(
                        "{message}; the key could not be re-read: {why}"
                    )));
                }
                tracing::warn!(
                    session_id = %request.session_id,
                    var = keys.var().unwrap_or_default(),
                    "provider refused the key; re-read it from the environment and retrying"
                );
                continue;
            }
            match self.policy.delay(retries, &error) {
                Some(wait) => {
                    retries += 1;
                    tracing::warn!(
                        session_id = %request.session_id,
                        error = %error,
                        retry = retries,
                        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        "provider request failed before any output; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                None if retries > 0 => return Err(gave_up(error, retries + 1)),
                None => return Err(error),
            }
        }
    }
}

/// Says in the error how hard we tried, so "server error 500" is not read
/// as a single unlucky request.
fn gave_up(error: ProviderError, attempts: u32) -> ProviderError {
    let note = format!(" (gave up after {attempts} attempts)");
    match error {
        ProviderError::RateLimited {
            retry_after,
            message,
        } => ProviderError::RateLimited {
            retry_after,
            message: message + &note,
        },
        ProviderError::Transport(m) => ProviderError::Transport(m + &note),
        ProviderError::Server { status, message } => ProviderError::Server {
            status,
            message: message + &note,
        },
        other => other,
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
        // The failed attempt's usage is not handed on; the retry's is.
        assert_eq!(items, vec![Ok(usage(7)), Ok(hello), Ok(done)]);
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
    fn backoff_doubles_from_one_second_capped_at_ten() {
        let p = RetryPolicy {
            max_retries: 6,
            ..RetryPolicy::default()
        };
        let server = ProviderError::Server {
            status: 500,
            message: String::new(),
        };
        let waits: Vec<_> = (0..7).map(|r| p.delay(r, &server)).collect();
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(waits, vec![s(1), s(2), s(4), s(8), s(10), s(10), None]);
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
