//! The configuration's unit tests: parsing, layering, validation and the
//! messages of each.

use overseer_actors::model::ApprovalPolicy;

use crate::http::HttpLimits;
use crate::store::{Compression, DEFAULT_CACHE_MB};

use super::providers::default_scenario;
use super::*;
use crate::tools::builtin_registry;

fn no_env(_: &str) -> Option<OsString> {
    None
}

fn parse_err(text: &str) -> String {
    Config::parse(text, "test.toml").unwrap_err().to_string()
}

fn load_text(text: &str, env: impl Fn(&str) -> Option<OsString>) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    let opts = LoadOptions {
        path: Some(path),
        overrides: Overrides::default(),
    };
    Config::load_with_env(&opts, &builtin_registry().unwrap(), env)
}

const MINIMAL: &str = "[[agents]]\nname = \"a\"\n";

#[test]
fn builtin_file_is_valid_and_has_the_demo_agents() {
    let c = Config::builtin().unwrap();
    c.validate(&builtin_registry().unwrap(), "built-in")
        .unwrap();
    assert_eq!(
        c.agent_names(),
        vec!["assistant", "auto", "lead", "researcher", "reviewer"]
    );
    let lead = c.agent("lead").unwrap();
    assert_eq!(lead.subagents, vec!["researcher", "reviewer"]);
    assert_eq!(lead.budget.max_steps, Some(50));
    let assistant = c.agent("assistant").unwrap();
    assert_eq!(assistant.approval, ApprovalPolicy::Always);
    assert_eq!(assistant.tools, vec!["current_time".to_owned()]);
    assert_eq!(c.agent("auto").unwrap().approval, ApprovalPolicy::Auto);
}

#[test]
fn file_values_equal_the_serde_defaults() {
    // The commented file claims to show every default; hold it to that.
    let file = Config::builtin().unwrap();
    let bare = Config::parse(MINIMAL, "t").unwrap();
    assert_eq!(file.runtime, bare.runtime);
    assert_eq!(file.provider, bare.provider);
    assert_eq!(file.store, bare.store);
    assert_eq!(file.http, bare.http);
    assert_eq!(file.scope_tokens, bare.scope_tokens);
    assert_eq!(file.store.durability, Durability::Fsync);
    let a = &bare.agents[0];
    for f in &file.agents {
        assert_eq!(f.model, a.model);
        assert_eq!(f.max_steps, a.max_steps);
        assert_eq!(f.parallel_tool_calls, a.parallel_tool_calls);
        assert_eq!(f.approval_timeout_secs, a.approval_timeout_secs);
    }
    assert_eq!(a.approval, ApprovalPolicy::PerTool);
}

#[test]
fn unknown_variant_names_its_key_in_house_style() {
    let e =
        parse_err("[[agents]]\nname = \"a\"\n[[agents]]\nname = \"b\"\napproval = \"sometimes\"\n");
    assert_eq!(
        e,
        "test.toml: agents[1].approval: unknown variant 'sometimes', expected auto|per_tool|always"
    );
}

#[test]
fn unknown_keys_are_errors_everywhere() {
    assert!(parse_err("bogus = 1\n").contains("bogus: unknown key"));
    let e = parse_err("[store]\nbogus = 1\n");
    assert!(
        e.contains("store.bogus: unknown key, expected one of kind, pool_size, data_dir, durability, cache_mb"),
        "{e}"
    );
    let e = parse_err("[[agents]]\nname = \"a\"\ncolour = \"red\"\n");
    assert!(e.contains("agents[0].colour: unknown key"), "{e}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let e = parse_err(
        "[store]\ndurability = \"never\"\n[runtime]\nmax_restarts = -1\ncall_timeout_secs = \"x\"\n[[agents]]\nmodel = \"m\"\n",
    );
    assert!(
        e.contains("store.durability: unknown variant 'never', expected fsync|os"),
        "{e}"
    );
    assert!(e.contains("runtime.max_restarts: invalid value"), "{e}");
    assert!(e.contains("runtime.call_timeout_secs: invalid type"), "{e}");
    assert!(e.contains("agents[0].name: required"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn session_limits_are_read_and_checked_with_their_keys() {
    let text = "[limits]\nmax_queued_messages = 0\nmax_title_bytes = 0\n[[agents]]\nname = \"a\"\n";
    let e = load_text(text, no_env).unwrap_err().to_string();
    assert!(
        e.contains("limits.max_queued_messages: must be at least 1"),
        "{e}"
    );
    assert!(
        e.contains("limits.max_title_bytes: must be at least 1"),
        "{e}"
    );
    let text = "[limits]\nmax_live_sessions = 7\n[[agents]]\nname = \"a\"\n";
    let c = load_text(text, no_env).unwrap();
    let limits = c.runtime_config().limits;
    assert_eq!(limits.max_live_sessions, 7);
    assert_eq!(
        limits.max_queued_bytes,
        overseer_actors::Limits::default().max_queued_bytes
    );
}

#[test]
fn idle_pressure_keys_reach_the_runtime_and_are_checked() {
    let c = load_text(MINIMAL, no_env).unwrap();
    assert_eq!(
        c.runtime_config().idle_pressure,
        overseer_actors::IdlePressure::default()
    );
    let text = "[runtime]\nidle_pressure_share_pct = 80\nidle_hibernate_floor_secs = 30\n[[agents]]\nname = \"a\"\n";
    let p = load_text(text, no_env)
        .unwrap()
        .runtime_config()
        .idle_pressure;
    assert_eq!((p.share_pct, p.floor), (80, Duration::from_secs(30)));
    let text = "[runtime]\nidle_pressure_share_pct = 0\nidle_hibernate_floor_secs = 0\n[[agents]]\nname = \"a\"\n";
    let e = load_text(text, no_env).unwrap_err().to_string();
    assert!(
        e.contains("runtime.idle_pressure_share_pct: must be between 1 and 100"),
        "{e}"
    );
    assert!(
        e.contains("runtime.idle_hibernate_floor_secs: must be at least 1"),
        "{e}"
    );
}

#[test]
fn schemas_past_their_bounds_are_config_errors_naming_the_key() {
    let deep = |levels: usize| {
        format!(
            "{}{{ type = \"string\" }}{}",
            "{ items = ".repeat(levels - 1),
            " }".repeat(levels - 1)
        )
    };
    let max = overseer_actors::schema::MAX_SCHEMA_DEPTH;
    let text = format!(
        "[[tools]]\nname = \"t\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/t\"\nparameters = {}\n[[agents]]\nname = \"a\"\noutput_schema = {}\n",
        deep(max + 1),
        deep(max + 1)
    );
    let e = load_text(&text, no_env).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "tools[0].parameters: nested deeper than {max} levels"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "agents[0].output_schema: nested deeper than {max} levels"
        )),
        "{e}"
    );
    let text = format!(
        "[[tools]]\nname = \"t\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/t\"\nparameters = {}\n[[agents]]\nname = \"a\"\noutput_schema = {}\n",
        deep(max),
        deep(max)
    );
    load_text(&text, no_env).unwrap();
}

#[test]
fn http_limits_are_checked_with_their_keys() {
    let text = "[http]\njwt_leeway_secs = 3600\nheader_read_timeout_secs = 0\nmax_connections = 0\nmax_in_flight_requests = 100000\n[[agents]]\nname = \"a\"\n";
    let e = load_text(text, no_env).unwrap_err().to_string();
    assert!(
        e.contains("http.jwt_leeway_secs: must be at most 300"),
        "{e}"
    );
    assert!(
        e.contains("http.header_read_timeout_secs: must be at least 1"),
        "{e}"
    );
    assert!(
        e.contains("http.max_connections: must be between 1 and 65535"),
        "{e}"
    );
    assert!(
        e.contains("http.max_in_flight_requests: must be between"),
        "{e}"
    );
    let c = Config::builtin().unwrap();
    let limits = c.http.options().limits;
    assert_eq!(limits, HttpLimits::default());
    assert_eq!(c.http.jwt_leeway(), Duration::from_secs(5));
}

#[test]
fn syntax_errors_give_a_position_on_one_line() {
    let e = parse_err("[store]\ndata_dir = \n");
    assert!(e.starts_with("test.toml:2:"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn validation_names_agent_and_tool() {
    let text = "[[agents]]\nname = \"a\"\ntools = [\"current_time\", \"launch_rockets\"]\nmax_steps = 0\n[[agents]]\nname = \"a\"\n";
    let e = load_text(text, no_env).unwrap_err().to_string();
    // (The fault-injection build adds a test tool to the available list.)
    assert!(
        e.contains(
            "agents[0].tools: agent 'a' lists unknown tool 'launch_rockets' (available: current_time"
        ),
        "{e}"
    );
    assert!(e.contains("agents[0].max_steps: must be at least 1"), "{e}");
    assert!(
        e.contains("agents[1].name: duplicate agent name 'a' (also agents[0])"),
        "{e}"
    );
    let e = load_text("[store]\n", no_env).unwrap_err().to_string();
    assert!(e.contains("agents: at least one"), "{e}");
}

#[test]
fn agent_servers_patterns_and_approval_rules_are_checked_naming_the_agent() {
    let text = r#"
[[mcp_servers]]
name = "shared"
command = "node"

[[agents]]
name = "a"
tools = ["current_time", "fs.*"]
mcp_servers = ["shared", "missing", { name = "own", command = "node" }, "shared"]
tool_approvals = { current_time = true, own__write = false, launch_rockets = true, "own__*" = true }

[[agents]]
name = "b"
mcp_servers = [{ name = "own", command = "node" }, { name = "shared", url = "http://127.0.0.1:1/mcp" }]

[[agents]]
name = "c"
tools = ["own__write"]
"#;
    let e = load_text(text, no_env).unwrap_err().to_string();
    for expected in [
        "agents[0].mcp_servers[1]: agent 'a' names MCP server 'missing', which no [[mcp_servers]] entry defines",
        "agents[0].mcp_servers[3]: agent 'a' lists MCP server 'shared' twice",
        "agents[0].tools: agent 'a' lists tool pattern 'fs.*', which may contain only letters, digits, '_', '-' and '*'",
        "agents[0].tool_approvals: agent 'a' sets an approval rule for 'launch_rockets', which is not one of its tools",
        "agents[1].mcp_servers[0]: agent 'b' defines MCP server 'own', which agent 'a' defines too",
        "agents[1].mcp_servers[1]: agent 'b' defines MCP server 'shared', a name [[mcp_servers]] already uses",
        // Agent a's own server is not b's.
        "agents[2].tools: agent 'c' lists unknown tool 'own__write'",
    ] {
        assert!(e.contains(expected), "missing «{expected}» in {e}");
    }
    // Rules for a's tools (own server, pattern, listed) are accepted.
    assert!(!e.contains("'own__write', which is not"), "{e}");
    assert!(!e.contains("'current_time', which is not"), "{e}");

    // A misspelt key of an inline server is named where it is.
    let e = parse_err(
        "[[agents]]\nname = \"a\"\nmcp_servers = [{ name = \"x\", comand = \"node\" }, 5]\n",
    );
    assert!(
        e.contains("agents[0].mcp_servers[0]: unknown key, expected one of"),
        "{e}"
    );
    assert!(
        e.contains("agents[0].mcp_servers[1]: expected a server name or a table"),
        "{e}"
    );
    // delegate_task has a rule only for an agent that delegates.
    let e = load_text(
        "[[agents]]\nname = \"a\"\ntool_approvals = { delegate_task = true }\n",
        no_env,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("rule for 'delegate_task'"), "{e}");
    load_text(
        "[[agents]]\nname = \"a\"\nsubagents = [\"a\"]\ntool_approvals = { delegate_task = true }\n",
        no_env,
    )
    .unwrap();
}

/// A tool that only has a name (resolution looks at names alone).
struct Named(overseer_actors::tool::ToolSpec);

#[async_trait::async_trait]
impl overseer_actors::tool::Tool for Named {
    fn spec(&self) -> &overseer_actors::tool::ToolSpec {
        &self.0
    }
    async fn call(
        &self,
        _: overseer_actors::tool::ToolContext,
        _: serde_json::Value,
    ) -> Result<serde_json::Value, overseer_actors::tool::ToolError> {
        Ok(serde_json::Value::Null)
    }
}

fn registry(names: &[&str]) -> ToolRegistry {
    let tools = names
        .iter()
        .map(|n| {
            let spec = overseer_actors::tool::ToolSpec::new(
                *n,
                "d",
                serde_json::json!({"type": "object"}),
            );
            std::sync::Arc::new(Named(spec)) as std::sync::Arc<dyn overseer_actors::tool::Tool>
        })
        .collect();
    ToolRegistry::new(tools).unwrap()
}

#[test]
fn resolution_expands_patterns_and_servers_and_keeps_own_servers_private() {
    let text = r#"
[[mcp_servers]]
name = "fs"
command = "node"

[[agents]]
name = "a"
tools = ["current_time", "fs__read*"]
mcp_servers = [{ name = "own", command = "node" }]
tool_approvals = { "own__*" = false, own__write = true, "fs__*" = true }

[[agents]]
name = "b"
tools = ["*"]
mcp_servers = ["fs"]
"#;
    let mut c = load_text(text, no_env).unwrap();
    let reg = registry(&[
        "current_time",
        "fs__read_file",
        "fs__read_dir",
        "fs__write_file",
        "own__read",
        "own__write",
    ]);
    c.resolve_agent_tools(&reg).unwrap();
    let a = c.agent("a").unwrap();
    let mut tools = a.tools.clone();
    tools.sort();
    assert_eq!(
        tools,
        [
            "current_time",
            "fs__read_dir",
            "fs__read_file",
            "own__read",
            "own__write"
        ]
    );
    let rules: Vec<(&str, bool)> = a
        .tool_approvals
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        rules,
        [
            ("fs__read_dir", true),
            ("fs__read_file", true),
            ("own__read", false),
            // The exact name wins over the pattern.
            ("own__write", true),
        ]
    );
    let b = c.agent("b").unwrap();
    assert!(
        b.tools.iter().all(|t| !t.starts_with("own__")),
        "{:?}",
        b.tools
    );
    assert!(b.tools.contains(&"fs__write_file".to_owned()));

    // A pattern that matches nothing, in tools or in rules, names the agent.
    let mut c = load_text(
        "[[agents]]\nname = \"solo\"\ntools = [\"current_time\", \"nothing__*\"]\n",
        no_env,
    )
    .unwrap();
    let e = c.resolve_agent_tools(&reg).unwrap_err();
    assert!(
        e.starts_with("agent 'solo': the tool pattern 'nothing__*' matches no tool"),
        "{e}"
    );
    let mut c = load_text(
        "[[agents]]\nname = \"solo\"\ntools = [\"current_time\"]\ntool_approvals = { \"fs__*\" = true }\n",
        no_env,
    )
    .unwrap();
    let e = c.resolve_agent_tools(&reg).unwrap_err();
    assert!(
        e.starts_with("agent 'solo': the tool_approvals pattern 'fs__*' matches none of its tools"),
        "{e}"
    );
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let env = |var: &str| match var {
        "OVERSEER_DATA_DIR" => Some(OsString::from("/env/data")),
        "OVERSEER_DURABILITY" => Some(OsString::from("os")),
        "OVERSEER_MAX_RESTARTS" => Some(OsString::from("7")),
        "OVERSEER_SCENARIO" => Some(OsString::from("")),
        _ => None,
    };
    let c = load_text(MINIMAL, env).unwrap();
    assert_eq!(c.store.data_dir, PathBuf::from("/env/data"));
    assert_eq!(c.store.durability, Durability::Os);
    assert_eq!(c.runtime.max_restarts, 7);
    assert_eq!(c.runtime_config().restart.max_restarts, 7);
    // Empty means unset.
    assert_eq!(c.provider.scenario, default_scenario());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, MINIMAL).unwrap();
    let opts = LoadOptions {
        path: Some(path),
        overrides: Overrides {
            data_dir: Some("/flag/data".into()),
            ..Overrides::default()
        },
    };
    let c = Config::load_with_env(&opts, &builtin_registry().unwrap(), env).unwrap();
    assert_eq!(c.store.data_dir, PathBuf::from("/flag/data"));
}

#[test]
fn bad_env_values_name_the_variable_and_key() {
    let env = |var: &str| match var {
        "OVERSEER_DURABILITY" => Some(OsString::from("sometimes")),
        "OVERSEER_CALL_TIMEOUT_SECS" => Some(OsString::from("soon")),
        _ => None,
    };
    let e = load_text(MINIMAL, env).unwrap_err().to_string();
    assert!(e.starts_with("environment: "), "{e}");
    assert!(e.contains("OVERSEER_DURABILITY (store.durability): unknown variant 'sometimes', expected fsync|os"), "{e}");
    assert!(
        e.contains("OVERSEER_CALL_TIMEOUT_SECS (runtime.call_timeout_secs): expected an integer"),
        "{e}"
    );
}

#[test]
fn store_cache_mb_is_validated_and_reaches_the_store_options() {
    let c = load_text(MINIMAL, no_env).unwrap();
    assert_eq!(c.store.cache_mb, DEFAULT_CACHE_MB);
    assert_eq!(c.store.options().cache_mb, DEFAULT_CACHE_MB);
    let c = load_text(&format!("[store]\ncache_mb = 256\n{MINIMAL}"), no_env).unwrap();
    assert_eq!(c.store.options().cache_mb, 256);

    for bad in ["0", "65537"] {
        let e = load_text(&format!("[store]\ncache_mb = {bad}\n{MINIMAL}"), no_env)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "store.cache_mb: must be between 1 and 65536 (MiB), found {bad}"
            )),
            "{e}"
        );
    }
    let e = parse_err("[store]\ncache_mb = -5\n");
    assert!(e.contains("store.cache_mb: invalid value"), "{e}");
    let e = parse_err("[store]\ncache_mb = \"lots\"\n");
    assert!(e.contains("store.cache_mb: invalid type"), "{e}");

    let env = |var: &str| match var {
        "OVERSEER_STORE_CACHE_MB" => Some(OsString::from("32")),
        _ => None,
    };
    assert_eq!(load_text(MINIMAL, env).unwrap().store.cache_mb, 32);
    let env = |var: &str| match var {
        "OVERSEER_STORE_CACHE_MB" => Some(OsString::from("big")),
        _ => None,
    };
    let e = load_text(MINIMAL, env).unwrap_err().to_string();
    assert!(
        e.contains("OVERSEER_STORE_CACHE_MB (store.cache_mb): expected an integer"),
        "{e}"
    );
}

#[test]
fn store_compression_is_validated_and_reaches_the_store_options() {
    let c = load_text(MINIMAL, no_env).unwrap();
    assert_eq!(c.store.options().compression, Compression::None);
    let c = load_text(
        &format!("[store]\ncompression = \"zstd\"\n{MINIMAL}"),
        no_env,
    )
    .unwrap();
    assert_eq!(c.store.options().compression, Compression::Zstd);

    let e = parse_err("[store]\ncompression = \"lz4\"\n");
    assert!(
        e.contains("store.compression: unknown variant 'lz4', expected none|zstd"),
        "{e}"
    );
    let env = |var: &str| match var {
        "OVERSEER_STORE_COMPRESSION" => Some(OsString::from("zstd")),
        _ => None,
    };
    assert_eq!(
        load_text(MINIMAL, env).unwrap().store.compression,
        Compression::Zstd
    );
    let env = |var: &str| match var {
        "OVERSEER_STORE_COMPRESSION" => Some(OsString::from("gzip")),
        _ => None,
    };
    let e = load_text(MINIMAL, env).unwrap_err().to_string();
    assert!(
        e.contains("OVERSEER_STORE_COMPRESSION (store.compression): unknown variant 'gzip'"),
        "{e}"
    );
    // PostgreSQL's store has no such setting: saying it is a mistake.
    let e = load_text(
        &format!("[store]\nkind = \"postgres\"\ncompression = \"zstd\"\n{MINIMAL}"),
        no_env,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("store.compression: applies to the sled store only"),
        "{e}"
    );
}

#[test]
fn tls_and_identity_provider_keys_are_validated() {
    let c = load_text(
        &format!("[http]\nauth = \"jwks\"\njwks_url = \"https://idp.example.com/jwks\"\nissuer = \"https://idp.example.com/\"\naudience = \"overseer\"\ntenant_claim = \"org\"\nscopes_claim = \"scope\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n{MINIMAL}"),
        no_env,
    )
    .unwrap();
    assert_eq!(c.http.auth, AuthMode::Jwks);
    assert!(c.http.tls_files().is_some());
    assert_eq!(c.http.claim_rules().scopes_claim, "scope");
    let problems = |text: &str| {
        load_text(&format!("{text}{MINIMAL}"), no_env)
            .unwrap_err()
            .to_string()
    };
    let e = problems("[http]\nauth = \"jwks\"\ntls_cert = \"c.pem\"\njwks_min_refresh_secs = 0\ntenant_claim = \" \"\n");
    for expected in [
        "http.jwks_url: required when http.auth is jwks",
        "http.tls_key: required with http.tls_cert",
        "http.jwks_min_refresh_secs: must be at least 1",
        "http.tenant_claim: must name a claim",
    ] {
        assert!(e.contains(expected), "{expected}: {e}");
    }
    let e = problems("[http]\nauth = \"jwks\"\njwks_url = \"http://idp.example.com/jwks\"\ntls_key = \"k.pem\"\n");
    assert!(
        e.contains("http.jwks_url: 'http://idp.example.com/jwks': keys over plain HTTP"),
        "{e}"
    );
    assert!(
        e.contains("http.tls_cert: required with http.tls_key"),
        "{e}"
    );
    let e = problems("[http]\nauth = \"none\"\naudience = \"x\"\njwks_url = \"https://idp/jwks\"\nissuer = \"\"\n");
    assert!(
        e.contains("http.audience: only checked when http.auth is a token mode"),
        "{e}"
    );
    assert!(
        e.contains("http.jwks_url: only used when http.auth is jwks"),
        "{e}"
    );
    assert!(e.contains("http.issuer: must not be empty"), "{e}");
    // Loopback keys over plain HTTP are fine (a sidecar, a test).
    assert!(load_text(
        &format!("[http]\nauth = \"jwks\"\njwks_url = \"http://127.0.0.1:9000/jwks\"\n{MINIMAL}"),
        no_env
    )
    .is_ok());
}

#[test]
fn store_kind_and_cluster_keys_are_validated() {
    let c = load_text(MINIMAL, no_env).unwrap();
    assert_eq!(c.store.kind, StoreKind::Sled);
    assert_eq!(c.cluster, ClusterSection::default());
    let c = load_text(
        &format!("[store]\nkind = \"postgres\"\npool_size = 8\n[cluster]\nheartbeat_secs = 1\nlease_secs = 3\nadvertise_url = \"http://10.0.0.5:8080\"\n{MINIMAL}"),
        no_env,
    )
    .unwrap();
    assert_eq!(c.store.kind, StoreKind::Postgres);
    assert_eq!(c.store.pool_size, 8);
    assert_eq!(c.cluster.lease_secs, 3);
    let e = parse_err("[store]\nkind = \"mysql\"\n");
    assert!(
        e.contains("store.kind: unknown variant 'mysql', expected sled|postgres"),
        "{e}"
    );
    let e = parse_err("[cluster]\nbogus = 1\n");
    assert!(e.contains("cluster.bogus: unknown key"), "{e}");
    let e = load_text(
        &format!("[cluster]\nheartbeat_secs = 5\nlease_secs = 10\nfailover_concurrency = 0\nadvertise_url = \"10.0.0.5:80\"\nmax_in_flight_forwards = 0\ndead_node_retention_secs = 9\n[store]\npool_size = 1\n{MINIMAL}"),
        no_env,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("cluster.max_in_flight_forwards: must be between 1 and 65535, found 0"),
        "{e}"
    );
    assert!(
        e.contains("cluster.dead_node_retention_secs: must be at least cluster.lease_secs (10)"),
        "{e}"
    );
    assert!(
        e.contains("cluster.lease_secs: must be more than twice cluster.heartbeat_secs (5)"),
        "{e}"
    );
    assert!(
        e.contains("cluster.failover_concurrency: must be at least 1"),
        "{e}"
    );
    assert!(
        e.contains("cluster.advertise_url: '10.0.0.5:80' is not an http(s) URL"),
        "{e}"
    );
    assert!(
        e.contains("store.pool_size: must be between 2 and 1000, found 1"),
        "{e}"
    );
    let env = |var: &str| match var {
        "OVERSEER_STORE_KIND" => Some(OsString::from("postgres")),
        _ => None,
    };
    assert_eq!(
        load_text(MINIMAL, env).unwrap().store.kind,
        StoreKind::Postgres
    );
    let env = |var: &str| match var {
        "OVERSEER_STORE_KIND" => Some(OsString::from("pg")),
        _ => None,
    };
    let e = load_text(MINIMAL, env).unwrap_err().to_string();
    assert!(
        e.contains("OVERSEER_STORE_KIND (store.kind): unknown variant 'pg'"),
        "{e}"
    );
}

#[test]
fn explicit_missing_file_is_an_error_naming_it() {
    let opts = LoadOptions {
        path: Some("/nonexistent/overseer.toml".into()),
        overrides: Overrides::default(),
    };
    let e = Config::load_with_env(&opts, &builtin_registry().unwrap(), no_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/overseer.toml"), "{e}");
}

#[test]
fn converts_to_runtime_types() {
    let c = Config::builtin().unwrap();
    let agents = c.agent_configs();
    assert_eq!(agents[0].name, "assistant");
    assert_eq!(agents[0].max_steps, 10);
    let rc = c.runtime_config();
    assert_eq!(rc.call_timeout, Duration::from_secs(30));
    assert_eq!(rc.restart.restart_window_secs, 60);
    assert_eq!(rc.idle_hibernate, Some(Duration::from_secs(300)));
    let mut c = c;
    c.runtime.idle_hibernate_secs = 0;
    assert_eq!(c.runtime_config().idle_hibernate, None);
}
