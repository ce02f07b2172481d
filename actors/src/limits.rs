//! Size and admission limits: what one tenant's request may cost the service
//! (queued messages, titles, metadata) and how many sessions may be live at
//! once. Plain numbers with their defaults; the machine enforces the queue
//! bounds, [`crate::Overseer`] the sizes at creation, the runtime admission.
//!
//! The defaults are sized for a 2-core, 24 GiB machine: 100,000 live session
//! actors is about 4 GB of resident memory at the measured ~37 KB each
//! (hibernated sessions cost nothing here and are not counted).

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
