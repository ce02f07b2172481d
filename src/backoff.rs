//! The one backoff policy of every retry loop at the edge: provider
//! requests, http tools, MCP reconnects, webhook deliveries, PostgreSQL
//! statements retried across a restart and the event relay's reconnects. Exponential
//! (doubling from `initial`, at most `max`) with jitter, so that many
//! sessions failing together (a provider's outage, a restarted MCP server)
//! do not retry in lockstep. The arithmetic is `backon`'s; each use
//! configures its own bounds.
//!
//! It owns the wait between attempts only: how many attempts, what is
//! retryable and a server's `retry-after` stay with each caller. The actor
//! tree's restart policy (`overseer_actors::supervision`) is a pure decision
//! over its restart history and deliberately has no randomness.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait before the first retry (without jitter).
    pub initial: Duration,
    /// Longest wait, jitter included.
    pub max: Duration,
    /// Adds up to as much again of random wait to each delay.
    pub jitter: bool,
}

impl Backoff {
    /// Doubling from `initial` up to `max`, with jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: true,
        }
    }

    /// The same without jitter (for a caller that needs exact waits).
    pub const fn exact(self) -> Self {
        Self {
            jitter: false,
            ..self
        }
    }

    /// The wait before retry number `retry` (0-based):
    /// `initial` × 2^`retry`, plus up to as much again of jitter, at most
    /// `max`.
    pub fn delay(&self, retry: u32) -> Duration {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times();
        if self.jitter {
            builder = builder.with_jitter();
        }
        let n = usize::try_from(retry).unwrap_or(usize::MAX).min(64);
        let d = builder.build().nth(n).unwrap_or(self.max).min(self.max);
        // backon multiplies in f32: 2 × 100 ms is 200.000003 ms. Whole
        // microseconds keep the doubling exact.
        Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_with_at_most_as_much_again_of_jitter_under_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut jittered = false;
        for retry in 0..8u32 {
            let base = Duration::from_millis(100)
                .saturating_mul(2u32.pow(retry))
                .min(Duration::from_secs(1));
            for _ in 0..50 {
                let d = b.delay(retry);
                assert!(d >= base && d <= (base * 2).min(b.max), "{retry}: {d:?}");
                jittered |= d != base;
            }
            assert_eq!(b.exact().delay(retry), base, "{retry}");
        }
        assert!(jittered, "no delay had jitter");
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    #[test]
    fn a_zero_initial_wait_stays_zero() {
        let b = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::ZERO);
        assert_eq!(b.delay(5), Duration::ZERO);
    }
}
