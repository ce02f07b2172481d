//! `config/overseer.toml` documents every key of the typed configuration:
//! each key of every section (and of every kind of table it can hold) begins
//! a line of the file, set to its default or in a commented list, and every
//! environment override is named. A key added to the code without a line in
//! the file fails here.
//!
//! The keys are read from the types themselves: each section type refuses
//! unknown keys, and its refusal lists the keys it knows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use overseer::config::{
    AgentSection, ClusterSection, Config, HttpSection, LimitsSection, ProviderSection,
    RuntimeSection, ScopeTokenSection, StoreSection, TaskSection, ENV_OVERRIDES,
};
use overseer::provider::RouteConfig;
use overseer::tools::http_request::HttpRequestConfig;
use overseer::tools::http_tool::HttpToolConfig;
use overseer::tools::mcp::McpServerConfig;
use serde::de::DeserializeOwned;

const FILE: &str = include_str!("../../config/overseer.toml");

/// The keys `T` accepts, from the message of its refusal of an unknown key.
fn keys_of<T: DeserializeOwned>() -> Vec<String> {
    let mut probe = toml::Table::new();
    probe.insert("__not_a_key__".into(), toml::Value::Integer(0));
    let message = toml::Value::Table(probe)
        .try_into::<T>()
        .err()
        .expect("an unknown key is refused")
        .to_string();
    let expected = message
        .split_once("expected one of ")
        .or_else(|| message.split_once("expected "))
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no key list in: {message}"));
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty(), "no keys parsed from: {message}");
    keys
}

/// Whether some line of the file, once a leading `#` and spaces are
/// stripped, begins with `key` followed by a space, `=` or `,`.
fn begins_a_line(key: &str) -> bool {
    FILE.lines().any(|line| {
        let line = line.trim_start().trim_start_matches('#').trim_start();
        line.strip_prefix(key)
            .is_some_and(|rest| rest.starts_with([' ', '=', ',']))
    })
}

#[test]
fn every_key_of_every_section_is_in_the_file() {
    let sections: Vec<(&str, Vec<String>)> = vec![
        ("store", keys_of::<StoreSection>()),
        ("cluster", keys_of::<ClusterSection>()),
        ("runtime", keys_of::<RuntimeSection>()),
        ("limits", keys_of::<LimitsSection>()),
        ("provider", keys_of::<ProviderSection>()),
        ("models", keys_of::<RouteConfig>()),
        ("http", keys_of::<HttpSection>()),
        ("scope_tokens", keys_of::<ScopeTokenSection>()),
        ("tools", keys_of::<HttpToolConfig>()),
        ("http_request", keys_of::<HttpRequestConfig>()),
        ("mcp_servers", keys_of::<McpServerConfig>()),
        ("agents", keys_of::<AgentSection>()),
        ("tasks", keys_of::<TaskSection>()),
    ];
    let mut missing = Vec::new();
    for (section, keys) in &sections {
        for key in keys {
            if !begins_a_line(key) {
                missing.push(format!("{section}.{key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys without a line in config/overseer.toml: {missing:?}"
    );
}

#[test]
fn every_section_and_environment_variable_is_in_the_file() {
    let top = keys_of::<Config>();
    assert!(top.contains(&"http".to_owned()) && top.contains(&"scope_tokens".to_owned()));
    for section in top {
        let table = format!("[{section}]");
        let array = format!("[[{section}]]");
        // A plain value at the top (`tasks_dir`, `skills_dirs`) is shown as
        // `key = ...`, before the first table.
        let value = format!("{section} = ");
        let found = FILE.lines().any(|line| {
            let line = line.trim_start().trim_start_matches('#').trim_start();
            line.starts_with(&table) || line.starts_with(&array) || line.starts_with(&value)
        });
        assert!(
            found,
            "section {section} has no [{section}] line in the file"
        );
    }
    for (var, key) in ENV_OVERRIDES {
        assert!(
            FILE.contains(var),
            "{var} (for {key}) is not named in the file"
        );
    }
}

#[test]
fn tables_the_file_sets_show_every_key_with_a_value() {
    // Sections whose keys all have defaults are written out in full, so the
    // file shows the values in effect; keys without a default (an optional
    // path) may be commented out instead.
    let file: toml::Table = toml::from_str(FILE).unwrap();
    for section in ["store", "cluster", "runtime", "http", "scope_tokens"] {
        let table = file[section].as_table().unwrap();
        let keys = match section {
            "store" => keys_of::<StoreSection>(),
            "cluster" => keys_of::<ClusterSection>(),
            "runtime" => keys_of::<RuntimeSection>(),
            "http" => keys_of::<HttpSection>(),
            _ => keys_of::<ScopeTokenSection>(),
        };
        for key in keys {
            let commented = FILE
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("# {key} = ")));
            assert!(
                table.contains_key(&key) || commented,
                "[{section}] {key} is neither set nor shown commented"
            );
        }
    }
    // And the file is what the binary uses when no file is given.
    Config::parse(FILE, "config/overseer.toml").unwrap();
}
