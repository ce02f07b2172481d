//! Scenario files for the scripted provider: reading them from disk,
//! and the demo scenario compiled into the binary.
//!
//! This module owns only I/O and error reporting (which file, what is wrong
//! with it). The format and its playback are `overseer_actors::scripted`'s; it
//! deliberately adds no rules of its own, so a scenario that loads here plays
//! the same way in any embedding of the actors crate.

use std::path::{Path, PathBuf};

use overseer_actors::scripted::{Scenario, ScenarioError};

/// Where the demo scenario lives in a checkout (and the config default).
pub const DEFAULT_SCENARIO_PATH: &str = "examples/scenarios/approval.json";

/// The demo scenario, compiled in so the binary runs from any directory.
pub const DEFAULT_SCENARIO: &str = include_str!("../examples/scenarios/approval.json");

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioLoadError {
    /// The file could not be read.
    #[error("cannot read scenario file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("scenario file {}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: ScenarioError,
    },
    /// The compiled-in scenario is invalid (a build defect, caught by tests).
    #[error("built-in scenario: {0}")]
    Builtin(ScenarioError),
}

/// Reads and checks a scenario file. Blocking: call it before the async
/// runtime starts or from a blocking thread.
pub fn load(path: &Path) -> Result<Scenario, ScenarioLoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioLoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    Scenario::from_json(&text).map_err(|source| ScenarioLoadError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// The compiled-in demo scenario.
pub fn builtin() -> Result<Scenario, ScenarioLoadError> {
    Scenario::from_json(DEFAULT_SCENARIO).map_err(ScenarioLoadError::Builtin)
}

/// Loads the configured scenario. The default path falls back to the
/// compiled-in copy when the file is absent (running outside a checkout);
/// any other path must exist, so a typo is an error rather than a silent demo.
pub fn resolve(path: &Path) -> Result<Scenario, ScenarioLoadError> {
    if path == Path::new(DEFAULT_SCENARIO_PATH) && !path.exists() {
        return builtin();
    }
    load(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_scenario_scripts_both_config_agents() {
        let s = builtin().unwrap();
        for agent in ["assistant", "auto"] {
            let steps = &s.agents[agent];
            assert_eq!(steps[0].tool_calls[0].name, "current_time");
            assert!(steps[1].text.contains("{{tool_result}}"));
        }
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.json");
        let e = resolve(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.json"), "{e}");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"agents": {"a": [{"txt": "x"}]}}"#).unwrap();
        let e = load(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.json") && e.contains("txt"), "{e}");
    }
}
