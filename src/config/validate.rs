//! The rules across values: unique agent names, existing tools, limits
//! within range. The shape of each key (types, unknown keys) is serde's,
//! explained by `explain`.

use std::collections::BTreeMap;

use super::http::http_edge_problems;
use super::{
    is_pattern, AuthMode, Config, Problem, ProviderKind, StoreKind, MAX_JWT_LEEWAY_SECS,
    MAX_POOL_SIZE,
};
use crate::http::MAX_COUNT_LIMIT;
use crate::store::{Compression, MAX_CACHE_MB};
use overseer_actors::tool::ToolRegistry;

impl Config {
    pub(super) fn problems(&self, tools: &ToolRegistry) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.store.data_dir.as_os_str().is_empty() {
            out.push(Problem::new("store.data_dir", "must not be empty"));
        }
        if self.store.kind == StoreKind::Postgres && self.store.compression != Compression::None {
            out.push(Problem::new(
                "store.compression",
                "applies to the sled store only (PostgreSQL compresses large values itself); \
                 remove it or set it to \"none\"",
            ));
        }
        if !(1..=MAX_CACHE_MB).contains(&self.store.cache_mb) {
            out.push(Problem::new(
                "store.cache_mb",
                format!(
                    "must be between 1 and {MAX_CACHE_MB} (MiB), found {}",
                    self.store.cache_mb
                ),
            ));
        }
        if self.store.pool_size < 2 || self.store.pool_size > MAX_POOL_SIZE {
            out.push(Problem::new(
                "store.pool_size",
                format!(
                    "must be between 2 and {MAX_POOL_SIZE}, found {}",
                    self.store.pool_size
                ),
            ));
        }
        let c = &self.cluster;
        if c.heartbeat_secs == 0 {
            out.push(Problem::new("cluster.heartbeat_secs", "must be at least 1"));
        }
        if c.lease_secs < 2 * c.heartbeat_secs.max(1) + 1 {
            out.push(Problem::new(
                "cluster.lease_secs",
                format!(
                    "must be more than twice cluster.heartbeat_secs ({}), so that one late heartbeat does not make a live node dead; found {}",
                    c.heartbeat_secs, c.lease_secs
                ),
            ));
        }
        if c.failover_concurrency == 0 {
            out.push(Problem::new(
                "cluster.failover_concurrency",
                "must be at least 1",
            ));
        }
        if c.max_in_flight_forwards == 0 || c.max_in_flight_forwards > crate::http::MAX_COUNT_LIMIT
        {
            out.push(Problem::new(
                "cluster.max_in_flight_forwards",
                format!(
                    "must be between 1 and {}, found {}",
                    crate::http::MAX_COUNT_LIMIT,
                    c.max_in_flight_forwards
                ),
            ));
        }
        if c.dead_node_retention_secs < c.lease_secs {
            out.push(Problem::new(
                "cluster.dead_node_retention_secs",
                format!(
                    "must be at least cluster.lease_secs ({}): a node is dead only after that; found {}",
                    c.lease_secs, c.dead_node_retention_secs
                ),
            ));
        }
        let http = ["http://", "https://"]
            .iter()
            .any(|p| c.advertise_url.starts_with(p));
        if !c.advertise_url.is_empty() && !http {
            out.push(Problem::new(
                "cluster.advertise_url",
                format!(
                    "'{}' is not an http(s) URL like http://10.0.0.5:8080",
                    c.advertise_url
                ),
            ));
        }
        let at_least_one = [
            (
                "runtime.restart_window_secs",
                self.runtime.restart_window_secs,
            ),
            ("runtime.call_timeout_secs", self.runtime.call_timeout_secs),
            (
                "runtime.idle_hibernate_floor_secs",
                self.runtime.idle_hibernate_floor_secs,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        if self.store.retention_days == Some(0) {
            out.push(Problem::new(
                "store.retention_days",
                "must be at least 1 (leave it unset to keep sessions for ever)",
            ));
        }
        if !(1..=100).contains(&self.runtime.idle_pressure_share_pct) {
            out.push(Problem::new(
                "runtime.idle_pressure_share_pct",
                format!(
                    "must be between 1 and 100 (percent of limits.max_live_sessions), found {}",
                    self.runtime.idle_pressure_share_pct
                ),
            ));
        }
        if !(10..=99).contains(&self.runtime.compaction_threshold_pct) {
            out.push(Problem::new(
                "runtime.compaction_threshold_pct",
                format!(
                    "must be between 10 and 99 (percent), found {}",
                    self.runtime.compaction_threshold_pct
                ),
            ));
        }
        let l = &self.limits;
        let limits = [
            ("limits.max_live_sessions", l.max_live_sessions as u64),
            ("limits.max_queued_messages", l.max_queued_messages),
            ("limits.max_queued_bytes", l.max_queued_bytes),
            ("limits.max_title_bytes", l.max_title_bytes),
            ("limits.max_metadata_bytes", l.max_metadata_bytes),
        ];
        for (key, value) in limits {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        if self.provider.kind == ProviderKind::Scripted
            && self.provider.scenario.as_os_str().is_empty()
        {
            out.push(Problem::new("provider.scenario", "must not be empty"));
        }
        if self.provider.context_window == Some(0) {
            out.push(Problem::new(
                "provider.context_window",
                "must be at least 1 (tokens)",
            ));
        }
        if self.provider.max_retry_after_secs.is_some_and(|s| s > 3600) {
            out.push(Problem::new(
                "provider.max_retry_after_secs",
                "must be at most 3600",
            ));
        }
        for (i, route) in self.models.iter().enumerate() {
            match &route.name {
                None => out.push(Problem::new(
                    format!("models[{i}].name"),
                    "required: agents name a route by it",
                )),
                Some(n) if self.models[..i].iter().any(|r| r.name.as_ref() == Some(n)) => {
                    out.push(Problem::new(
                        format!("models[{i}].name"),
                        format!("duplicate route '{n}'"),
                    ))
                }
                Some(_) => {}
            }
            if let Err(e) = route.validate() {
                out.push(Problem::new(format!("models[{i}]"), e.to_string()));
            }
        }
        self.webhooks.problems(&mut out);
        for (key, problem) in self.telemetry.problems() {
            out.push(Problem::new(key, problem));
        }
        if self.http.listen.parse::<std::net::SocketAddr>().is_err() {
            out.push(Problem::new(
                "http.listen",
                format!(
                    "'{}' is not an address like 127.0.0.1:8080",
                    self.http.listen
                ),
            ));
        }
        if matches!(self.http.auth, AuthMode::Rs256 | AuthMode::Es256)
            && self.http.public_key_pem.is_none()
        {
            out.push(Problem::new(
                "http.public_key_pem",
                "required when http.auth is rs256 or es256",
            ));
        }
        let http = &self.http;
        http_edge_problems(http, &mut out);
        if http.jwt_leeway_secs > MAX_JWT_LEEWAY_SECS {
            out.push(Problem::new(
                "http.jwt_leeway_secs",
                format!("must be at most {MAX_JWT_LEEWAY_SECS}"),
            ));
        }
        let http_secs = [
            (
                "http.header_read_timeout_secs",
                http.header_read_timeout_secs,
            ),
            (
                "http.request_body_timeout_secs",
                http.request_body_timeout_secs,
            ),
            ("http.idle_timeout_secs", http.idle_timeout_secs),
        ];
        for (key, value) in http_secs {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        let http_counts = [
            ("http.max_connections", http.max_connections),
            ("http.max_in_flight_requests", http.max_in_flight_requests),
        ];
        for (key, value) in http_counts {
            if value == 0 || value > MAX_COUNT_LIMIT {
                out.push(Problem::new(
                    key,
                    format!("must be between 1 and {MAX_COUNT_LIMIT}"),
                ));
            }
        }
        if self.agents.is_empty() {
            out.push(Problem::new(
                "agents",
                "at least one [[agents]] table is required",
            ));
        }
        // A declared tool's schema is held to the bounds of every user
        // schema (`overseer_actors::schema`), reported here under its key.
        for (i, tool) in self.tools.iter().enumerate() {
            if let Err(e) = overseer_actors::schema::check(&tool.parameters) {
                out.push(Problem::new(
                    format!("tools[{i}].parameters"),
                    e.to_string(),
                ));
            }
        }
        self.task_problems(&mut out);
        let available = tools.names().collect::<Vec<_>>().join(", ");
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let at = |key: &str| format!("agents[{i}].{key}");
            if agent.name.trim().is_empty() {
                out.push(Problem::new(at("name"), "must not be empty"));
            } else if let Some(first) = seen.get(agent.name.as_str()) {
                out.push(Problem::new(
                    at("name"),
                    format!(
                        "duplicate agent name '{}' (also agents[{first}])",
                        agent.name
                    ),
                ));
            } else {
                seen.insert(&agent.name, i);
            }
            if agent.max_steps == 0 {
                out.push(Problem::new(at("max_steps"), "must be at least 1"));
            }
            if agent.approval_timeout_secs == 0 {
                out.push(Problem::new(
                    at("approval_timeout_secs"),
                    "must be at least 1",
                ));
            }
            for sub in &agent.subagents {
                if !self.agents.iter().any(|a| &a.name == sub) {
                    out.push(Problem::new(
                        at("subagents"),
                        format!("agent '{}' lists unknown subagent '{sub}'", agent.name),
                    ));
                }
            }
            if agent.max_children == 0 {
                out.push(Problem::new(at("max_children"), "must be at least 1"));
            }
            if let Some(schema) = &agent.output_schema {
                if let Err(e) = overseer_actors::schema::check_output(schema) {
                    out.push(Problem::new(at("output_schema"), e.to_string()));
                }
            }
            self.agent_tool_problems(i, &mut out);
            self.agent_task_problems(i, &mut out);
            for (j, tool) in agent.tools.iter().enumerate() {
                if agent.tools[..j].contains(tool) {
                    out.push(Problem::new(
                        at("tools"),
                        format!("agent '{}' lists tool '{tool}' twice", agent.name),
                    ));
                } else if is_pattern(tool) {
                    // Checked when the servers have listed their tools.
                } else if !self.declares_tool_for(tools, agent, tool) {
                    out.push(Problem::new(
                        at("tools"),
                        format!(
                            "agent '{}' lists unknown tool '{tool}' (available: {available})",
                            agent.name
                        ),
                    ));
                }
            }
        }
        out
    }
}
