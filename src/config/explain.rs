//! Turning serde's refusal of a file into problems named by key: which keys
//! made a whole-file deserialization fail, and one-line messages.

use super::{
    AgentSection, ClusterSection, Config, ConfigError, HttpSection, Problem, ProviderSection,
    RuntimeSection, ScopeTokenSection, StoreSection, TaskSection,
};
use crate::provider::RouteConfig;
use crate::tools::http_tool::HttpToolConfig;
use crate::tools::mcp::McpServerConfig;
use serde::de::DeserializeOwned;
use toml::{Table, Value};

pub(super) fn syntax_error(origin: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let start = e.span().map_or(0, |s| s.start).min(text.len());
    let before = text.get(..start).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConfigError::Syntax {
        origin: origin.to_owned(),
        line,
        column,
        message: one_line(e.message()),
    }
}

/// Finds which keys made a whole-file deserialization fail.
///
/// Serde reports *what* is wrong but not *where*; rather than depend on a
/// path-tracking deserializer, each key is tried alone (inside a minimal valid
/// table) against the same derived types, so the messages and the rules stay
/// those of the types themselves.
pub(super) fn explain(table: &Table, whole: &toml::de::Error) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (key, value) in table {
        match (key.as_str(), value) {
            ("store", Value::Table(t)) => {
                problems.extend(bad_keys::<StoreSection>(t, &Table::new(), "store"))
            }
            ("cluster", Value::Table(t)) => {
                problems.extend(bad_keys::<ClusterSection>(t, &Table::new(), "cluster"))
            }
            ("runtime", Value::Table(t)) => {
                problems.extend(bad_keys::<RuntimeSection>(t, &Table::new(), "runtime"))
            }
            ("provider", Value::Table(t)) => {
                problems.extend(bad_keys::<ProviderSection>(t, &Table::new(), "provider"))
            }
            ("http", Value::Table(t)) => {
                problems.extend(bad_keys::<HttpSection>(t, &Table::new(), "http"))
            }
            ("scope_tokens", Value::Table(t)) => problems.extend(bad_keys::<ScopeTokenSection>(
                t,
                &Table::new(),
                "scope_tokens",
            )),
            ("tools" | "mcp_servers", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let bad = if key == "tools" {
                        item.clone().try_into::<HttpToolConfig>().err()
                    } else {
                        item.clone().try_into::<McpServerConfig>().err()
                    };
                    if let Some(e) = bad {
                        problems.push(problem_for(&format!("{key}[{i}]"), e.message()));
                    }
                }
            }
            ("models", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Err(e) = item.clone().try_into::<RouteConfig>() {
                        problems.push(problem_for(&format!("models[{i}]"), e.message()));
                    }
                }
            }
            ("agents", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    problems.extend(explain_agent(i, item));
                }
            }
            ("tasks", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Err(e) = item.clone().try_into::<TaskSection>() {
                        problems.push(problem_for(&format!("tasks[{i}]"), e.message()));
                    }
                }
            }
            _ => {
                let mut alone = Table::new();
                alone.insert(key.clone(), value.clone());
                if let Err(e) = Value::Table(alone).try_into::<Config>() {
                    problems.push(problem_for(key, e.message()));
                }
            }
        }
    }
    if problems.is_empty() {
        problems.push(Problem::new("(document)", humanize(whole.message())));
    }
    problems
}

fn explain_agent(i: usize, item: &Value) -> Vec<Problem> {
    let path = format!("agents[{i}]");
    let Value::Table(t) = item else {
        return vec![Problem::new(
            path,
            format!("expected a table ([[agents]]), found {}", item.type_str()),
        )];
    };
    let mut base = Table::new();
    base.insert("name".into(), Value::String("_".into()));
    let mut problems = Vec::new();
    if !t.contains_key("name") {
        problems.push(Problem::new(format!("{path}.name"), "required"));
    }
    let mut rest = t.clone();
    if let Some(servers) = rest.remove("mcp_servers") {
        problems.extend(explain_agent_servers(&path, &servers));
    }
    problems.extend(bad_keys::<AgentSection>(&rest, &base, &path));
    if problems.is_empty() {
        if let Err(e) = item.clone().try_into::<AgentSection>() {
            problems.push(Problem::new(path, humanize(e.message())));
        }
    }
    problems
}

/// An agent's `mcp_servers`, entry by entry: a name, or a table with the
/// keys of `[[mcp_servers]]` (whose own message names the bad key; serde's
/// for the pair would only say that neither shape fits).
fn explain_agent_servers(path: &str, servers: &Value) -> Vec<Problem> {
    let Value::Array(items) = servers else {
        return vec![Problem::new(
            format!("{path}.mcp_servers"),
            format!(
                "expected an array of server names or tables, found {}",
                servers.type_str()
            ),
        )];
    };
    let mut problems = Vec::new();
    for (j, item) in items.iter().enumerate() {
        let key = format!("{path}.mcp_servers[{j}]");
        match item {
            Value::String(_) => {}
            Value::Table(_) => {
                if let Err(e) = item.clone().try_into::<McpServerConfig>() {
                    problems.push(problem_for(&key, e.message()));
                }
            }
            other => problems.push(Problem::new(
                key,
                format!(
                    "expected a server name or a table with the keys of [[mcp_servers]], found {}",
                    other.type_str()
                ),
            )),
        }
    }
    problems
}

fn bad_keys<T: DeserializeOwned>(table: &Table, base: &Table, path: &str) -> Vec<Problem> {
    table
        .iter()
        .filter_map(|(k, v)| {
            let mut alone = base.clone();
            alone.insert(k.clone(), v.clone());
            Value::Table(alone)
                .try_into::<T>()
                .err()
                .map(|e| problem_for(&format!("{path}.{k}"), e.message()))
        })
        .collect()
}

pub(super) fn problem_for(key: &str, message: &str) -> Problem {
    Problem::new(key, humanize(message))
}

/// Rewrites serde's messages into the house style:
/// ``unknown variant `x`, expected one of `a`, `b` `` becomes
/// `unknown variant 'x', expected a|b`, and an unknown field becomes
/// `unknown key, expected one of a, b` (the key is already in the path).
pub(super) fn humanize(message: &str) -> String {
    let message = one_line(message);
    let (head, options) = if let Some((head, tail)) = message.split_once(", expected one of ") {
        let options: Vec<String> = tail
            .split(", ")
            .map(|s| s.trim_matches('`').to_owned())
            .collect();
        (head.to_owned(), options)
    } else if let Some((head, tail)) = message
        .split_once(", expected `")
        .filter(|(h, _)| h.starts_with("unknown "))
    {
        let options = tail
            .trim_end_matches('`')
            .split("` or `")
            .map(str::to_owned)
            .collect();
        (head.to_owned(), options)
    } else {
        return message.replace('`', "'");
    };
    if head.starts_with("unknown field") {
        format!("unknown key, expected one of {}", options.join(", "))
    } else {
        format!("{}, expected {}", head.replace('`', "'"), options.join("|"))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
