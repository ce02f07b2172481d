//! `ledger_append`: a non-idempotent test tool that exists only with the
//! `fault-injection` feature (process-level crash tests, `tests/crash.rs`).
//!
//! Each execution appends one line `<idempotency_key> <entry>` to the file
//! named by env `OVERSEER_TEST_LEDGER` and syncs it before reporting success,
//! so a test that aborts and restarts the process can count, from outside,
//! how many times each call really ran. It deliberately does nothing to
//! de-duplicate by key: telling a first run from a re-run is the runtime's
//! job, and this tool is how the tests check that it does it.

use std::io::Write;
use std::path::PathBuf;

use serde_json::{json, Value};

use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec};

/// The environment variable naming the ledger file.
pub const LEDGER_ENV: &str = "OVERSEER_TEST_LEDGER";

/// The tool.
#[derive(Debug, Clone)]
pub struct LedgerAppend {
    spec: ToolSpec,
    /// The file; `None` reads [`LEDGER_ENV`] at each call.
    path: Option<PathBuf>,
}

impl LedgerAppend {
    /// The tool's name.
    pub const NAME: &'static str = "ledger_append";

    /// The tool with its declaration: needs approval, not idempotent, so an
    /// interrupted call is asked about again rather than retried.
    pub fn new() -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "entry": {
                    "type": "string",
                    "description": "Text of the line to append (one line)."
                }
            },
            "required": ["entry"],
            "additionalProperties": false
        });
        let spec = ToolSpec::new(
            Self::NAME,
            "Test tool: appends one line to the ledger file named by OVERSEER_TEST_LEDGER.",
            parameters,
        )
        .with_approval(true)
        .with_timeout(10)
        .idempotent(false);
        Self { spec, path: None }
    }

    /// The tool appending to `path` (the environment is not read).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            ..Self::new()
        }
    }
}

impl Default for LedgerAppend {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl Tool for LedgerAppend {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let entry = arguments
            .get("entry")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::new("'entry' must be a string"))?
            .to_owned();
        // One execution must be exactly one line, or counting lines would lie.
        if entry.contains(['\n', '\r']) {
            return Err(ToolError::new("'entry' must be a single line"));
        }
        let path = self
            .path
            .clone()
            .or_else(|| std::env::var_os(LEDGER_ENV).map(PathBuf::from))
            .ok_or_else(|| ToolError::new(format!("{LEDGER_ENV} is not set")))?;
        let line = format!("{} {entry}\n", ctx.idempotency_key);
        // File I/O and fsync block: keep them off the async workers.
        tokio::task::spawn_blocking(move || append_synced(&path, line.as_bytes()))
            .await
            .map_err(|e| ToolError::new(format!("ledger task failed: {e}")))?
            .map_err(|e| ToolError::new(format!("cannot append to the ledger: {e}")))?;
        Ok(json!({"appended": entry, "key": ctx.idempotency_key}))
    }
}

/// Appends `bytes` with one write and syncs the file, so that a line the
/// tool reported is on disk before the session can record the outcome.
fn append_synced(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_actors::model::{SessionId, ToolCallId};

    fn ctx(key: &str) -> ToolContext {
        ToolContext {
            session_id: SessionId::generate(),
            tenant: "t".into(),
            agent: "a".into(),
            call_id: ToolCallId::generate(),
            idempotency_key: key.into(),
            attempt: 1,
            scope: Default::default(),
        }
    }

    #[test]
    fn declares_a_side_effect() {
        let tool = LedgerAppend::new();
        assert!(tool.spec().requires_approval);
        assert!(!tool.spec().idempotent);
        assert_eq!(
            tool.spec().interrupt_policy(),
            overseer_actors::model::OnInterrupt::Ask
        );
    }

    #[tokio::test]
    async fn appends_one_line_per_call_and_refuses_multi_line_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger");
        let tool = LedgerAppend::at(&path);
        tool.call(ctx("k1"), json!({"entry": "one"})).await.unwrap();
        tool.call(ctx("k1"), json!({"entry": "one"})).await.unwrap();
        assert!(tool
            .call(ctx("k2"), json!({"entry": "a\nb"}))
            .await
            .is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "k1 one\nk1 one\n");
    }
}
