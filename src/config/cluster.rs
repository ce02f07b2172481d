//! `[cluster]`: membership, ownership and failover in cluster mode (read
//! only with `store.kind = "postgres"`).

use serde::Deserialize;

/// `[cluster]`: membership, ownership and failover of cluster mode.
/// Read only when `store.kind = "postgres"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Seconds between two heartbeats of a node.
    #[serde(default = "default_heartbeat_secs")]
    pub heartbeat_secs: u64,
    /// A node whose heartbeat is older than this many seconds is dead, and
    /// its sessions are taken over.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
    /// The URL other nodes reach this one's API at; empty: `http://` and
    /// the address it listens on (which must then not be 0.0.0.0).
    #[serde(default)]
    pub advertise_url: String,
    /// Sessions one node activates at once when it takes over a dead
    /// node's sessions.
    #[serde(default = "default_failover_concurrency")]
    pub failover_concurrency: usize,
    /// Most requests a node forwards to the owners of their sessions at
    /// once, counted apart from `http.max_in_flight_requests` (its own
    /// work); past it: 503 `overloaded`.
    #[serde(default = "default_max_in_flight_forwards")]
    pub max_in_flight_forwards: usize,
    /// A dead node stays listed (as dead) by `overseer cluster status` this
    /// many seconds after its last heartbeat; then its row is removed.
    #[serde(default = "default_dead_node_retention_secs")]
    pub dead_node_retention_secs: u64,
    /// Allow forwarding requests (and the caller's bearer token) over plain
    /// HTTP to a node whose advertise URL is not on loopback. Off: such a
    /// forward is refused (use `https://` advertise URLs).
    #[serde(default)]
    pub allow_plain_http: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            heartbeat_secs: default_heartbeat_secs(),
            lease_secs: default_lease_secs(),
            advertise_url: String::new(),
            failover_concurrency: default_failover_concurrency(),
            max_in_flight_forwards: default_max_in_flight_forwards(),
            dead_node_retention_secs: default_dead_node_retention_secs(),
            allow_plain_http: false,
        }
    }
}

fn default_max_in_flight_forwards() -> usize {
    128
}
fn default_dead_node_retention_secs() -> u64 {
    3_600
}

fn default_heartbeat_secs() -> u64 {
    2
}
fn default_lease_secs() -> u64 {
    10
}
fn default_failover_concurrency() -> usize {
    32
}
