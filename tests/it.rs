//! The integration tests of `overseer`, one binary (linking the crate once
//! instead of once per file): a module per former test file, under `it/`.
//! `store.rs` (a global tracing subscriber it captures logs with),
//! `metrics.rs` and `webhooks.rs` (the process-wide metrics recorder, whose
//! counts and gauges they assert) stay binaries of their own.

mod common;

#[path = "it/acp.rs"]
mod acp;
#[path = "it/agent_tools.rs"]
mod agent_tools;
#[path = "it/backup.rs"]
mod backup;
#[path = "it/bounds.rs"]
mod bounds;
#[path = "it/cli.rs"]
mod cli;
#[path = "it/cli_client.rs"]
mod cli_client;
#[path = "it/cluster.rs"]
mod cluster;
#[path = "it/config_file.rs"]
mod config_file;
#[path = "it/crash.rs"]
mod crash;
#[path = "it/docs.rs"]
mod docs;
#[path = "it/edge.rs"]
mod edge;
#[path = "it/http.rs"]
mod http;
#[path = "it/http_tools.rs"]
mod http_tools;
#[path = "it/inbox_api.rs"]
mod inbox_api;
#[path = "it/jwks.rs"]
mod jwks;
#[path = "it/layout.rs"]
mod layout;
#[path = "it/library.rs"]
mod library;
#[path = "it/limits.rs"]
mod limits;
#[path = "it/mcp.rs"]
mod mcp;
#[path = "it/openapi.rs"]
mod openapi;
#[path = "it/providers.rs"]
mod providers;
#[path = "it/render.rs"]
mod render;
#[path = "it/scope_tokens.rs"]
mod scope_tokens;
#[path = "it/serve.rs"]
mod serve;
#[path = "it/store_contract.rs"]
mod store_contract;
#[path = "it/telemetry.rs"]
mod telemetry;
#[path = "it/tls.rs"]
mod tls;
#[path = "it/ui.rs"]
mod ui;
