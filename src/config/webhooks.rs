//! `[webhooks]`: how `overseer serve` delivers webhooks, and the checks of
//! those keys. Endpoints are registered over the API, not here
//! (`crate::webhooks`).

use std::time::Duration;

use super::{yes, Problem};
use serde::Deserialize;

/// `[webhooks]`: how `overseer serve` delivers webhooks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksSection {
    /// Whether the `/v1/webhooks` routes exist and events are delivered.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The public address of this service (`https://overseer.example.com`):
    /// payloads link to its inbox page. Empty: no links.
    #[serde(default)]
    pub public_url: String,
    /// Whether endpoints may be loopback addresses (127.0.0.0/8, ::1,
    /// localhost): a receiver on the same machine (tests, development).
    #[serde(default)]
    pub allow_loopback: bool,
    /// Whether endpoints may be private addresses (10/8, 172.16/12,
    /// 192.168/16, 100.64/10, fc00::/7).
    #[serde(default)]
    pub allow_private: bool,
    /// Seconds one attempt may take.
    #[serde(default = "default_hook_timeout")]
    pub request_timeout_secs: u64,
    /// Milliseconds before the first retry; doubled (with jitter) after
    /// each failed attempt.
    #[serde(default = "default_hook_retry_initial")]
    pub retry_initial_ms: u64,
    /// Longest delay between two attempts, seconds.
    #[serde(default = "default_hook_retry_max")]
    pub retry_max_secs: u64,
    /// A delivery still failing this many seconds after its event is given
    /// up, and its endpoint disabled with the reason recorded.
    #[serde(default = "default_hook_max_age")]
    pub max_age_secs: u64,
    /// A delivery that failed this many attempts is given up likewise.
    #[serde(default = "default_hook_max_attempts")]
    pub max_attempts: u32,
    /// Attempts in flight at once on a node.
    #[serde(default = "default_hook_concurrency")]
    pub concurrency: usize,
}

impl Default for WebhooksSection {
    fn default() -> Self {
        Self {
            enabled: true,
            public_url: String::new(),
            allow_loopback: false,
            allow_private: false,
            request_timeout_secs: default_hook_timeout(),
            retry_initial_ms: default_hook_retry_initial(),
            retry_max_secs: default_hook_retry_max(),
            max_age_secs: default_hook_max_age(),
            max_attempts: default_hook_max_attempts(),
            concurrency: default_hook_concurrency(),
        }
    }
}

impl WebhooksSection {
    /// The delivery options this section describes.
    pub fn options(&self) -> crate::webhooks::WebhookOptions {
        crate::webhooks::WebhookOptions {
            public_url: self.public_url.trim_end_matches('/').to_owned(),
            targets: crate::webhooks::TargetRules {
                allow_loopback: self.allow_loopback,
                allow_private: self.allow_private,
            },
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            retry_initial: Duration::from_millis(self.retry_initial_ms),
            retry_max: Duration::from_secs(self.retry_max_secs),
            max_age: Duration::from_secs(self.max_age_secs),
            max_attempts: self.max_attempts,
            concurrency: self.concurrency,
        }
    }

    pub(super) fn problems(&self, out: &mut Vec<Problem>) {
        let ranges: [(&str, u64, u64, u64); 6] = [
            (
                "webhooks.request_timeout_secs",
                self.request_timeout_secs,
                1,
                300,
            ),
            (
                "webhooks.retry_initial_ms",
                self.retry_initial_ms,
                10,
                3_600_000,
            ),
            ("webhooks.retry_max_secs", self.retry_max_secs, 1, 86_400),
            ("webhooks.max_age_secs", self.max_age_secs, 1, 7 * 86_400),
            (
                "webhooks.max_attempts",
                u64::from(self.max_attempts),
                1,
                1_000,
            ),
            ("webhooks.concurrency", self.concurrency as u64, 1, 1_024),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                out.push(Problem::new(
                    key,
                    format!("must be between {min} and {max}, found {value}"),
                ));
            }
        }
        if self.retry_max_secs.saturating_mul(1000) < self.retry_initial_ms {
            out.push(Problem::new(
                "webhooks.retry_max_secs",
                format!(
                    "must be at least webhooks.retry_initial_ms ({} ms), found {} s",
                    self.retry_initial_ms, self.retry_max_secs
                ),
            ));
        }
        let url = self.public_url.trim();
        if !url.is_empty() {
            let parsed = reqwest::Url::parse(url);
            let ok = parsed.as_ref().is_ok_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host_str().is_some_and(|h| !h.is_empty())
                    && u.query().is_none()
                    && u.fragment().is_none()
            });
            if !ok {
                out.push(Problem::new(
                    "webhooks.public_url",
                    format!("'{url}' is not an http(s) address like https://overseer.example.com"),
                ));
            }
        }
    }
}

fn default_hook_timeout() -> u64 {
    15
}
fn default_hook_retry_initial() -> u64 {
    5_000
}
fn default_hook_retry_max() -> u64 {
    3_600
}
fn default_hook_max_age() -> u64 {
    86_400
}
fn default_hook_max_attempts() -> u32 {
    100
}
fn default_hook_concurrency() -> usize {
    16
}
