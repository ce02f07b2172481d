//! Layering over the file: the `OVERSEER_*` environment variables that
//! override scalar keys, then the command-line flags. Every bad variable is
//! reported at once, with the messages the file's keys would get.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use toml::Value;

use super::explain::humanize;
use super::{Config, ConfigError, Overrides, Problem};

/// The environment variables that override scalar keys, with those keys.
/// An empty variable counts as unset, as container runtimes often set them so.
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("OVERSEER_STORE_KIND", "store.kind"),
    ("OVERSEER_DATA_DIR", "store.data_dir"),
    ("OVERSEER_DURABILITY", "store.durability"),
    ("OVERSEER_STORE_CACHE_MB", "store.cache_mb"),
    ("OVERSEER_STORE_COMPRESSION", "store.compression"),
    ("OVERSEER_MAX_RESTARTS", "runtime.max_restarts"),
    (
        "OVERSEER_RESTART_WINDOW_SECS",
        "runtime.restart_window_secs",
    ),
    (
        "OVERSEER_IDLE_HIBERNATE_SECS",
        "runtime.idle_hibernate_secs",
    ),
    ("OVERSEER_REST_AFTER_SECS", "runtime.rest_after_secs"),
    ("OVERSEER_CALL_TIMEOUT_SECS", "runtime.call_timeout_secs"),
    ("OVERSEER_PROVIDER", "provider.kind"),
    ("OVERSEER_SCENARIO", "provider.scenario"),
];

impl Config {
    pub(super) fn apply_env(
        &mut self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<(), ConfigError> {
        // Empty counts as unset (see ENV_OVERRIDES).
        let get = |var: &str| env(var).filter(|v| !v.is_empty());
        let mut problems = Vec::new();
        if let Some(dir) = get("OVERSEER_DATA_DIR") {
            self.store.data_dir = PathBuf::from(dir);
        }
        if let Some(path) = get("OVERSEER_SCENARIO") {
            self.provider.scenario = PathBuf::from(path);
        }
        env_value(
            &get,
            "OVERSEER_STORE_KIND",
            false,
            &mut self.store.kind,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_DURABILITY",
            false,
            &mut self.store.durability,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_STORE_CACHE_MB",
            true,
            &mut self.store.cache_mb,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_STORE_COMPRESSION",
            false,
            &mut self.store.compression,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_PROVIDER",
            false,
            &mut self.provider.kind,
            &mut problems,
        );
        let rt = &mut self.runtime;
        env_value(
            &get,
            "OVERSEER_MAX_RESTARTS",
            true,
            &mut rt.max_restarts,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_RESTART_WINDOW_SECS",
            true,
            &mut rt.restart_window_secs,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_IDLE_HIBERNATE_SECS",
            true,
            &mut rt.idle_hibernate_secs,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_REST_AFTER_SECS",
            true,
            &mut rt.rest_after_secs,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_CALL_TIMEOUT_SECS",
            true,
            &mut rt.call_timeout_secs,
            &mut problems,
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: "environment".into(),
                problems,
            })
        }
    }

    pub(super) fn apply_overrides(&mut self, o: &Overrides) {
        if let Some(dir) = &o.data_dir {
            self.store.data_dir.clone_from(dir);
        }
        if let Some(d) = o.durability {
            self.store.durability = d;
        }
        if let Some(path) = &o.scenario {
            self.provider.scenario.clone_from(path);
        }
    }
}

/// Applies one environment override, recording a problem instead of failing
/// so every bad variable is reported at once.
fn env_value<T: DeserializeOwned>(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &str,
    numeric: bool,
    slot: &mut T,
    problems: &mut Vec<Problem>,
) {
    let Some(raw) = get(var) else { return };
    let key = ENV_OVERRIDES
        .iter()
        .find(|(v, _)| *v == var)
        .map_or("?", |(_, k)| *k);
    let name = format!("{var} ({key})");
    let Some(raw) = raw.to_str() else {
        problems.push(Problem::new(name, "not valid UTF-8"));
        return;
    };
    // Going through a TOML value gives the same messages as the file.
    let value = if numeric {
        match raw.trim().parse::<i64>() {
            Ok(n) => Value::Integer(n),
            Err(_) => {
                problems.push(Problem::new(
                    name,
                    format!("expected an integer, found '{raw}'"),
                ));
                return;
            }
        }
    } else {
        Value::String(raw.to_owned())
    };
    match value.try_into::<T>() {
        Ok(v) => *slot = v,
        Err(e) => problems.push(Problem::new(name, humanize(e.message()))),
    }
}
