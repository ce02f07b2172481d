//! Size and admission limits: what one tenant's request may cost the service
//! (queued messages, titles, metadata) and how many sessions may be live at
//! once. Plain numbers with their defaults; the machine enforces the queue
//! bounds, [`crate::Overseer`] the sizes at creation, the runtime admission.
//!
//! The defaults are sized for a 2-core, 24 GiB machine: 100,000 live session
//! actors is about 4 GB of resident memory at the measured ~37 KB each
//! (hibernated sessions cost nothing here and are not counted). Past a share
//! of that limit, idle sessions hibernate sooner ([`IdlePressure`]).

/// The limits of one runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Live session actors (roots and children) at which new sessions and
    /// activations by API requests are refused with `Overloaded`, and idle
    /// sessions are asked to hibernate early.
    pub max_live_sessions: usize,
    /// Messages one session may hold queued behind its running turn.
    pub max_queued_messages: u64,
    /// Bytes of text one session may hold queued behind its running turn.
    pub max_queued_bytes: u64,
    /// Bytes of a session's title.
    pub max_title_bytes: u64,
    /// Bytes of a session's metadata (as JSON).
    pub max_metadata_bytes: u64,
    /// Live session actors one tenant may have (`None`: no quota).
    pub max_live_sessions_per_tenant: Option<usize>,
    /// Sessions one tenant may create per day, UTC (`None`: no quota).
    pub max_sessions_per_tenant_per_day: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_live_sessions: 100_000,
            max_queued_messages: 100,
            max_queued_bytes: 4 * 1024 * 1024,
            max_title_bytes: 512,
            max_metadata_bytes: 64 * 1024,
            max_live_sessions_per_tenant: None,
            max_sessions_per_tenant_per_day: None,
        }
    }
}

/// How the live-session limit shortens the idle time after which a session
/// hibernates (`idle_hibernate_secs`), so that sessions waiting for a human
/// make room long before the limit refuses anyone.
///
/// Up to `share_pct` percent of `max_live_sessions` nothing changes. Past
/// it the idle time falls from the configured one to `floor`, reached at the
/// limit, by the same factor for each equal step of the way (a geometric
/// slope: it shortens at once when pressure begins and gently near the
/// floor). A session idle longer than the idle time of the moment
/// hibernates, so as the live count falls the idle time grows again: under
/// a steady load the count settles where sessions arrive as fast as they
/// hibernate, and at the limit it is `floor` times the arrival rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePressure {
    /// Percent of `max_live_sessions` past which the idle time shortens
    /// (1 to 100; 100: only at the limit).
    pub share_pct: u8,
    /// The shortest idle time, reached at the limit. Longer than the
    /// configured idle time: the configured one.
    pub floor: std::time::Duration,
}

impl Default for IdlePressure {
    fn default() -> Self {
        Self {
            share_pct: 50,
            floor: std::time::Duration::from_secs(10),
        }
    }
}

impl IdlePressure {
    /// Live sessions past which the idle time shortens, for `limit`.
    pub fn start(&self, limit: usize) -> usize {
        limit.saturating_mul(usize::from(self.share_pct.clamp(1, 100))) / 100
    }

    /// The idle time after which a session hibernates while `live` session
    /// actors are live under `limit`, when it is `idle` without pressure.
    pub fn idle_time(
        &self,
        idle: std::time::Duration,
        live: usize,
        limit: usize,
    ) -> std::time::Duration {
        let start = self.start(limit);
        let floor = self.floor.min(idle);
        if live >= limit {
            return floor;
        }
        if live <= start {
            return idle;
        }
        let x = (live - start) as f64 / (limit - start) as f64;
        let ratio = floor.as_secs_f64() / idle.as_secs_f64();
        let secs = idle.as_secs_f64() * ratio.powf(x);
        std::time::Duration::from_secs_f64(secs).clamp(floor, idle)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_idle_time_falls_from_the_share_to_the_floor_at_the_limit() {
        let p = IdlePressure {
            share_pct: 50,
            floor: Duration::from_secs(10),
        };
        let idle = Duration::from_secs(300);
        let at = |live| p.idle_time(idle, live, 100).as_secs_f64();
        assert_eq!(at(0), 300.0);
        assert_eq!(at(50), 300.0);
        assert_eq!(at(100), 10.0);
        assert_eq!(at(1_000), 10.0);
        // Geometric: half way is the geometric mean of the two ends.
        assert!(
            (at(75) - (300.0f64 * 10.0).sqrt()).abs() < 0.01,
            "{}",
            at(75)
        );
        let mut last = f64::MAX;
        for live in 50..=100 {
            assert!(at(live) <= last, "never longer as pressure grows");
            last = at(live);
        }
        // A floor above the idle time changes nothing.
        let p = IdlePressure {
            share_pct: 50,
            floor: Duration::from_secs(600),
        };
        assert_eq!(p.idle_time(idle, 100, 100), idle);
        // Share 100: only at the limit.
        let p = IdlePressure {
            share_pct: 100,
            floor: Duration::from_secs(10),
        };
        assert_eq!(p.idle_time(idle, 99, 100), idle);
        assert_eq!(p.idle_time(idle, 100, 100), Duration::from_secs(10));
    }
}
