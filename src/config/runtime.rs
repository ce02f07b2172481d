//! `[runtime]` and `[limits]`: supervision, timing and what one caller can
//! make a session or the node hold. Converted into the runtime's own
//! [`RuntimeConfig`](overseer_actors::RuntimeConfig) and
//! [`Limits`](overseer_actors::Limits) by [`super::Config`].

use serde::Deserialize;

/// `[runtime]`: supervision and timing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// Restarts allowed within the window.
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// Restart-counting window, seconds.
    #[serde(default = "default_restart_window_secs")]
    pub restart_window_secs: u64,
    /// Idle time before a session hibernates, seconds.
    #[serde(default = "default_idle_hibernate_secs")]
    pub idle_hibernate_secs: u64,
    /// Percent of `limits.max_live_sessions` past which the idle time
    /// shortens (see `overseer_actors::IdlePressure`).
    #[serde(default = "default_idle_pressure_share_pct")]
    pub idle_pressure_share_pct: u8,
    /// The shortest idle time, reached at the live-session limit, seconds.
    #[serde(default = "default_idle_hibernate_floor_secs")]
    pub idle_hibernate_floor_secs: u64,
    /// How long a session stays at rest before it lets go of what it can
    /// read back, seconds; 0 at once.
    #[serde(default = "default_rest_after_secs")]
    pub rest_after_secs: u64,
    /// How long an API call waits for a session actor, seconds.
    #[serde(default = "default_call_timeout_secs")]
    pub call_timeout_secs: u64,
    /// Share of a model's context window, percent, past which a session
    /// compacts its older transcript.
    #[serde(default = "default_compaction_threshold_pct")]
    pub compaction_threshold_pct: u8,
}

fn default_idle_pressure_share_pct() -> u8 {
    overseer_actors::IdlePressure::default().share_pct
}
fn default_idle_hibernate_floor_secs() -> u64 {
    overseer_actors::IdlePressure::default().floor.as_secs()
}
fn default_rest_after_secs() -> u64 {
    overseer_actors::DEFAULT_REST_AFTER.as_secs()
}
fn default_compaction_threshold_pct() -> u8 {
    overseer_actors::DEFAULT_COMPACTION_THRESHOLD_PCT
}

impl Default for RuntimeSection {
    fn default() -> Self {
        Self {
            max_restarts: default_max_restarts(),
            restart_window_secs: default_restart_window_secs(),
            idle_hibernate_secs: default_idle_hibernate_secs(),
            idle_pressure_share_pct: default_idle_pressure_share_pct(),
            idle_hibernate_floor_secs: default_idle_hibernate_floor_secs(),
            rest_after_secs: default_rest_after_secs(),
            call_timeout_secs: default_call_timeout_secs(),
            compaction_threshold_pct: default_compaction_threshold_pct(),
        }
    }
}

/// `[limits]`: size and admission limits (see `overseer_actors::Limits`,
/// whose defaults these are).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Live session actors past which new sessions and activations by API
    /// requests get 503.
    #[serde(default = "default_max_live_sessions")]
    pub max_live_sessions: usize,
    /// Messages one session may hold queued behind its running turn.
    #[serde(default = "default_max_queued_messages")]
    pub max_queued_messages: u64,
    /// Bytes of text one session may hold queued.
    #[serde(default = "default_max_queued_bytes")]
    pub max_queued_bytes: u64,
    /// Bytes of a session title.
    #[serde(default = "default_max_title_bytes")]
    pub max_title_bytes: u64,
    /// Bytes of a session's metadata (JSON).
    #[serde(default = "default_max_metadata_bytes")]
    pub max_metadata_bytes: u64,
    /// Live session actors one tenant may have (unset: no quota).
    #[serde(default)]
    pub max_live_sessions_per_tenant: Option<usize>,
    /// Sessions one tenant may create per UTC day (unset: no quota).
    #[serde(default)]
    pub max_sessions_per_tenant_per_day: Option<u64>,
}

impl Default for LimitsSection {
    fn default() -> Self {
        let l = overseer_actors::Limits::default();
        Self {
            max_live_sessions: l.max_live_sessions,
            max_queued_messages: l.max_queued_messages,
            max_queued_bytes: l.max_queued_bytes,
            max_title_bytes: l.max_title_bytes,
            max_metadata_bytes: l.max_metadata_bytes,
            max_live_sessions_per_tenant: l.max_live_sessions_per_tenant,
            max_sessions_per_tenant_per_day: l.max_sessions_per_tenant_per_day,
        }
    }
}

impl LimitsSection {
    /// The limits as the runtime takes them.
    pub fn to_limits(&self) -> overseer_actors::Limits {
        overseer_actors::Limits {
            max_live_sessions: self.max_live_sessions,
            max_queued_messages: self.max_queued_messages,
            max_queued_bytes: self.max_queued_bytes,
            max_title_bytes: self.max_title_bytes,
            max_metadata_bytes: self.max_metadata_bytes,
            max_live_sessions_per_tenant: self.max_live_sessions_per_tenant,
            max_sessions_per_tenant_per_day: self.max_sessions_per_tenant_per_day,
        }
    }
}

fn default_max_live_sessions() -> usize {
    overseer_actors::Limits::default().max_live_sessions
}
fn default_max_queued_messages() -> u64 {
    overseer_actors::Limits::default().max_queued_messages
}
fn default_max_queued_bytes() -> u64 {
    overseer_actors::Limits::default().max_queued_bytes
}
fn default_max_title_bytes() -> u64 {
    overseer_actors::Limits::default().max_title_bytes
}
fn default_max_metadata_bytes() -> u64 {
    overseer_actors::Limits::default().max_metadata_bytes
}

fn default_max_restarts() -> u32 {
    3
}
fn default_restart_window_secs() -> u64 {
    60
}
fn default_idle_hibernate_secs() -> u64 {
    300
}
fn default_call_timeout_secs() -> u64 {
    30
}
