//! Built-in tools and the registry of the tools this binary offers.
//!
//! This module owns the implementations of built-in tools that need the
//! `overseer` crate's dependencies (today: `current_time`) and
//! [`builtin_registry`], the one place that lists them, so a new tool kind is
//! added here and nowhere else. It deliberately does not decide who may call a
//! tool or whether a human must approve it: scope and approval policy are the
//! runtime's (`overseer_actors::session`), and running a call (timeout, size
//! cap, crash isolation) is `overseer_actors::tool_call`'s.
//!
//! With the `fault-injection` feature only, the registry also holds the test
//! tool [`ledger::LedgerAppend`] (process-level crash tests); builds without
//! the feature contain no trace of it.

pub mod http_request;
pub mod http_tool;
#[cfg(feature = "fault-injection")]
pub mod ledger;
pub mod mcp;
pub mod skills;

use std::sync::Arc;

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use overseer_actors::tool::{
    Tool, ToolContext, ToolError, ToolRegistry, ToolRegistryError, ToolSpec,
};

/// `current_time`: the current UTC time as RFC 3339 and as Unix milliseconds.
///
/// Read-only, so it needs no approval under the `per_tool` policy and is
/// idempotent (re-running it after a crash has no effect to duplicate).
#[derive(Debug, Clone)]
pub struct CurrentTime {
    spec: ToolSpec,
}

impl CurrentTime {
    /// The tool's name.
    pub const NAME: &'static str = "current_time";

    /// The tool with its declaration.
    pub fn new() -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    // Only UTC for now: a time-zone database is a dependency
                    // this tool does not need to be useful.
                    "enum": ["UTC"],
                    "description": "Time zone of the answer. Only \"UTC\" is supported."
                }
            },
            "additionalProperties": false
        });
        let spec = ToolSpec::new(
            Self::NAME,
            "Returns the current date and time in UTC, as RFC 3339 text (\"utc\") and as milliseconds since the Unix epoch (\"unix_ms\").",
            parameters,
        )
        .with_approval(false)
        .with_timeout(5)
        .idempotent(true);
        Self { spec }
    }
}

impl Default for CurrentTime {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl Tool for CurrentTime {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        // The arguments were validated against the schema before dispatch, so
        // `timezone` is absent or "UTC": both mean UTC.
        let now = OffsetDateTime::now_utc();
        current_time_value(now)
    }
}

/// The result object for instant `now` (separate so tests can pin the clock).
fn current_time_value(now: OffsetDateTime) -> Result<Value, ToolError> {
    let utc = now
        .format(&Rfc3339)
        .map_err(|e| ToolError::new(format!("could not format the time: {e}")))?;
    let unix_ms = i64::try_from(now.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| ToolError::new("the clock is out of range"))?;
    Ok(json!({"utc": utc, "unix_ms": unix_ms}))
}

/// Every built-in tool, in a stable order.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(CurrentTime::new())];
    // In the registry (so a test's config may give it to an agent, the
    // loader checking tool names against the registry), but in no agent of
    // the default config.
    #[cfg(feature = "fault-injection")]
    let tools = {
        let mut tools = tools;
        tools.push(Arc::new(ledger::LedgerAppend::new()));
        tools
    };
    tools
}

/// The registry of the built-in tools, with their schemas compiled.
pub fn builtin_registry() -> Result<ToolRegistry, ToolRegistryError> {
    ToolRegistry::new(builtin_tools())
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_actors::model::{SessionId, ToolCallId};

    fn ctx() -> ToolContext {
        ToolContext {
            session_id: SessionId::generate(),
            tenant: "t".into(),
            agent: "a".into(),
            call_id: ToolCallId::generate(),
            idempotency_key: "k".into(),
            attempt: 1,
            scope: Default::default(),
        }
    }

    #[test]
    fn registry_lists_current_time_with_its_declaration() {
        let reg = builtin_registry().unwrap();
        let expected: &[&str] = if cfg!(feature = "fault-injection") {
            &["current_time", "ledger_append"]
        } else {
            &["current_time"]
        };
        assert_eq!(reg.names().collect::<Vec<_>>(), expected);
        let spec = reg.spec("current_time").unwrap();
        assert!(!spec.requires_approval);
        assert!(spec.idempotent);
    }

    #[test]
    fn schema_accepts_utc_or_nothing_and_refuses_the_rest() {
        let reg = builtin_registry().unwrap();
        assert!(reg.validate("current_time", &json!({})).is_ok());
        assert!(reg
            .validate("current_time", &json!({"timezone": "UTC"}))
            .is_ok());
        let err = reg
            .validate("current_time", &json!({"timezone": "Europe/Paris"}))
            .unwrap_err();
        assert!(err["error"]
            .as_str()
            .unwrap()
            .starts_with("schema validation failed"));
        assert!(reg.validate("current_time", &json!({"tz": "UTC"})).is_err());
    }

    #[test]
    fn formats_a_pinned_instant() {
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(
            current_time_value(t).unwrap(),
            json!({"utc": "2023-11-14T22:13:20Z", "unix_ms": 1_700_000_000_000_i64})
        );
    }

    #[tokio::test]
    async fn returns_now() {
        let before = OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let v = CurrentTime::new().call(ctx(), json!({})).await.unwrap();
        let ms = v["unix_ms"].as_i64().unwrap();
        assert!(ms >= before);
        let parsed = OffsetDateTime::parse(v["utc"].as_str().unwrap(), &Rfc3339).unwrap();
        assert_eq!(parsed.unix_timestamp_nanos() / 1_000_000, i128::from(ms));
    }
}
