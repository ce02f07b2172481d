//! `overseer cluster status`: the nodes of a cluster as the database
//! sees them: id, advertised URL, alive or dead, heartbeat age, and how many
//! active sessions (running or awaiting approval) each owns: on a dead node,
//! what is still to be taken over. Dead nodes stay listed, marked dead,
//! until the live nodes prune them (`cluster.dead_node_retention_secs`). It
//! connects to `OVERSEER_DATABASE_URL` itself, so it works whether or not
//! any node is up.
//!
//! Owns the command line and the table (or `--json`); the figures are the
//! store's (`crate::store::postgres::PgStore::nodes`).

use std::io::Write;
use std::time::Duration;

use crate::store::postgres::{NodeStatus, PgOptions, PgStore, DATABASE_URL_ENV};

use super::CliError;

/// `overseer cluster` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// What `overseer cluster` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClusterCommand {
    /// List the nodes: id, URL, alive or dead, heartbeat age, active sessions
    /// owned (running or awaiting approval). Reads OVERSEER_DATABASE_URL.
    Status {
        /// A node is dead once its heartbeat is older than this
        /// (`cluster.lease_secs` of the nodes).
        #[arg(long, default_value_t = 10, value_name = "SECS")]
        lease_secs: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `overseer cluster …`.
pub fn run(args: ClusterArgs) -> Result<(), CliError> {
    let ClusterCommand::Status { lease_secs, json } = args.command;
    let url = std::env::var(DATABASE_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{DATABASE_URL_ENV}: not set; export the cluster's database URL (postgres://user:password@host:5432/dbname)"
            ))
        })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let nodes = rt.block_on(async {
        let store = PgStore::open(
            &url,
            PgOptions {
                pool_size: 2,
                lease: Duration::from_secs(lease_secs.max(1)),
                ..PgOptions::default()
            },
        )
        .await
        .map_err(crate::service::ServiceError::from)?;
        store.nodes().await.map_err(|e| CliError::Session(e.into()))
    })?;
    let text = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))
                .unwrap_or_default()
        )
    } else {
        table(&nodes)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

fn table(nodes: &[NodeStatus]) -> String {
    let mut out = format!(
        "{:<36}  {:<28}  {:<5}  {:>13}  {:>15}\n",
        "NODE", "URL", "STATE", "HEARTBEAT AGE", "ACTIVE SESSIONS"
    );
    for n in nodes {
        out.push_str(&format!(
            "{:<36}  {:<28}  {:<5}  {:>12.1}s  {:>15}\n",
            n.id,
            super::terminal::inline(&n.url),
            if n.alive { "alive" } else { "dead" },
            n.heartbeat_age_secs,
            n.active_sessions
        ));
    }
    if nodes.is_empty() {
        out.push_str("(no nodes)\n");
    }
    out
}
