//! `overseer serve` and `overseer token`: the long-running service and the
//! development token minter.
//!
//! Owns process-level concerns of the service: reading the auth key, binding
//! the listener, recovering before serving, and the graceful shutdown on
//! SIGTERM/SIGINT (stop accepting, give open connections
//! `http.shutdown_grace_secs` to finish and drop the rest, stop the actors,
//! flush sled, exit 0). The shutdown has a deadline whatever state the store
//! is in: [`EXIT_SLACK`] after the grace, a watchdog ends the process,
//! saying what the store had not confirmed (none of it was acknowledged to
//! anyone, so nothing confirmed is lost). The API itself is `crate::http`.
//!
//! `token` validates everything before minting (a token with no scope, one
//! that never expires, a tenant with a newline, a guessable secret are all
//! refused with exit status 2 and one line naming the flag), and reports a
//! closed stdout instead of panicking.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use overseer_actors::WeakOverseer;

use crate::auth::{self, AuthConfig};
use crate::cluster::{Cluster, ClusterOptions};
use crate::config::{AuthMode, Config, LoadOptions, Overrides, StoreKind};
use crate::http::{self, HttpOptions};
use crate::service;
use crate::tools::builtin_registry;

use super::{terminal, CliError};

/// `overseer serve` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (default: config/overseer.toml, else the built-in defaults).
    #[arg(long, value_name = "FILE", env = "OVERSEER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (default: http.listen of the configuration).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory (default: store.data_dir of the configuration).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Upgrade a store directory of an older layout in place, keeping a copy
    /// of it as it was in `<DIR>.pre-upgrade-format-<N>` first (what the
    /// previous binary opens, to roll back). Without it such a directory is
    /// refused, in one line saying what would change.
    #[arg(long)]
    pub upgrade: bool,
}

/// `overseer token` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// Tenant the token acts for.
    #[arg(long)]
    pub tenant: String,
    /// Subject (who): recorded as `approved_by` on decisions.
    #[arg(long)]
    pub sub: String,
    /// Comma-separated scopes (at least one): sessions:read, sessions:write,
    /// approvals:write, webhooks:write, admin.
    #[arg(long, value_delimiter = ',', required = true)]
    pub scopes: Vec<String>,
    /// Lifetime in seconds (1 to 31622400, a year and a day).
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    /// Print a sign-in link to the approval inbox served at this address
    /// (e.g. http://127.0.0.1:8080) instead of the bare token. The token
    /// travels in the link's fragment, which browsers never send to a
    /// server; the page moves it into the tab's sessionStorage.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

/// Why the service could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The auth key could not be read or used.
    #[error("auth: {0}")]
    Auth(#[from] auth::AuthError),
    /// The public key file could not be read.
    #[error("http.public_key_pem: cannot read {path}: {source}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The listener or options were refused.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// Binding or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The configured address is not an address.
    #[error("http.listen: '{0}' is not an address like 127.0.0.1:8080")]
    Listen(String),
    /// Cluster mode on an address other nodes cannot be told about.
    #[error("cluster.advertise_url: not set, and the listener {0} is not an address other nodes can reach; set it to this node's URL, e.g. http://10.0.0.5:8080")]
    Advertise(SocketAddr),
    /// Joining the cluster failed.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The TLS certificate or key is unusable.
    #[error(transparent)]
    Tls(#[from] http::tls::TlsError),
    /// `http.ca_bundle` could not be read.
    #[error("http.ca_bundle: cannot read {path}: {source}")]
    CaBundle {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs the service until SIGTERM or SIGINT.
pub fn serve(args: ServeArgs) -> Result<(), CliError> {
    let tools = builtin_registry()?;
    let options = LoadOptions {
        path: args.config.clone(),
        overrides: Overrides {
            data_dir: args.data.clone(),
            durability: None,
            scenario: None,
        },
    };
    let mut config = Config::load(&options, &tools)?;
    let telemetry = crate::cli::start_telemetry(&config)?;
    let addr = match args.listen {
        Some(a) => a,
        None => config
            .http
            .listen
            .parse()
            .map_err(|_| ServeError::Listen(config.http.listen.clone()))?,
    };
    let ca_bundle = match &config.http.ca_bundle {
        Some(path) => Some(std::fs::read(path).map_err(|source| ServeError::CaBundle {
            path: path.clone(),
            source,
        })?),
        None => None,
    };
    let auth = auth_config(&config, ca_bundle.clone())?;
    // Refuse `auth = "none"` off loopback before anything is opened.
    http::check_listener(addr, &auth).map_err(ServeError::from)?;
    let tls = match config.http.tls_files() {
        Some(files) => Some(http::tls::Tls::load(files).map_err(ServeError::from)?),
        None => None,
    };
    let mut http_options: HttpOptions = config.http.options();
    http_options.tls = tls.clone();
    http_options.model_routes = config.route_names();
    http_options.validate().map_err(ServeError::from)?;
    let provider = service::build_providers(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(async move {
        if let Err(e) = crate::metrics::install_recorder() {
            tracing::warn!("metrics disabled: {e}");
        }
        // Built-ins validated the config; now the full set (http tools,
        // http_request, MCP servers connected here).
        let all_tools = service::build_tools(&mut config).await?;
        let _ = &tools;
        if let AuthConfig::Jwks(keys) = &auth {
            // At start, so the first request does not wait for it; a
            // provider down now is retried by the first token.
            match keys.prefetch().await {
                Ok(n) => tracing::info!(url = %keys.url(), keys = n, "identity provider keys fetched"),
                Err(e) => tracing::warn!(error = %e, "identity provider keys not fetched at start; the first token fetches them"),
            }
        }
        let (overseer, cluster, listener, bound, webhooks, watch) = match config.store.kind {
            StoreKind::Sled => {
                let upgrade = if args.upgrade {
                    crate::store::Upgrade::KeepCopy
                } else {
                    crate::store::Upgrade::Refuse
                };
                let store = service::open_sled(&config, upgrade).await?;
                let webhooks =
                    service::webhooks(&config, Arc::new(store.clone()), |view| {
                        store.set_webhooks(view)
                    })
                    .await?;
                let overseer = overseer_actors::Overseer::start_with(
                    config.agent_configs(),
                    all_tools.library.clone(),
                    Arc::new(store.clone()),
                    provider,
                    all_tools.registry.clone(),
                    config.runtime_config(),
                )
                .await
                .map_err(crate::service::ServiceError::from)?;
                overseer
                    .recover()
                    .await
                    .map_err(crate::service::ServiceError::from)?;
                let (listener, bound) = bind(addr).await?;
                (overseer, None, listener, bound, webhooks, Some(store.watch()))
            }
            StoreKind::Postgres => {
                let store = service::open_postgres(&config).await?;
                let webhooks =
                    service::webhooks(&config, Arc::new(store.clone()), |view| {
                        store.set_webhooks(view)
                    })
                    .await?;
                let overseer = overseer_actors::Overseer::start_with(
                    config.agent_configs(),
                    all_tools.library.clone(),
                    std::sync::Arc::new(store.clone()),
                    provider,
                    all_tools.registry.clone(),
                    config.runtime_config(),
                )
                .await
                .map_err(crate::service::ServiceError::from)?;
                let (listener, bound) = bind(addr).await?;
                let advertise_url = if config.cluster.advertise_url.is_empty() {
                    if bound.ip().is_unspecified() {
                        return Err(ServeError::Advertise(bound).into());
                    }
                    let scheme = if tls.is_some() { "https" } else { "http" };
                    format!("{scheme}://{bound}")
                } else {
                    config.cluster.advertise_url.clone()
                };
                if !http::secure_enough(&advertise_url) && !config.cluster.allow_plain_http {
                    tracing::warn!(
                        %advertise_url,
                        "this node advertises plain HTTP off loopback: the other nodes refuse to forward requests to it (serve TLS, or set cluster.allow_plain_http)"
                    );
                }
                // Joining takes over what nobody owns before anything is served.
                let cluster = Cluster::join(
                    store,
                    overseer.clone(),
                    ClusterOptions {
                        advertise_url,
                        heartbeat: Duration::from_secs(config.cluster.heartbeat_secs),
                        failover_concurrency: config.cluster.failover_concurrency,
                        // Capped below the lease by the router.
                        forward_timeout: Duration::from_secs(config.runtime.call_timeout_secs + 5),
                        max_in_flight_forwards: config.cluster.max_in_flight_forwards,
                        dead_node_retention: Duration::from_secs(
                            config.cluster.dead_node_retention_secs,
                        ),
                        ca_bundle: ca_bundle.clone(),
                        allow_plain_http: config.cluster.allow_plain_http,
                    },
                )
                .await
                .map_err(ServeError::from)?;
                http_options.cluster = Some(cluster.routing());
                (overseer, Some(cluster), listener, bound, webhooks, None)
            }
        };
        // Deliveries run beside the sessions, from the outbox the store
        // writes with their checkpoints (what a previous process left too).
        let (stop_hooks, hooks_stopped) = tokio::sync::watch::channel(false);
        let delivery = webhooks
            .as_ref()
            .map(|hooks| hooks.start(&overseer, hooks_stopped));
        http_options.webhooks = webhooks;
        let grace = http_options.limits.shutdown_grace;
        let runtime = overseer.downgrade();
        let (stop_tls, tls_stopped) = tokio::sync::watch::channel(false);
        let tls_watch = tls.map(|tls| {
            let mut stopped = tls_stopped;
            tokio::spawn(tls.watch(async move {
                let _ = stopped.wait_for(|s| *s).await;
            }))
        });
        let signal = async move {
            shutdown_signal().await;
            let _ = stop_tls.send(true);
            arm_exit_watchdog(grace + EXIT_SLACK, watch, runtime);
        };
        // Scripts and tests read the bound address (the port may be 0).
        // Not eprintln!: a closed stderr must not panic a running service.
        let _ = writeln!(std::io::stderr(), "listening on {bound}");
        http::serve_with(
            overseer.clone(),
            listener,
            auth,
            http_options,
            signal,
        )
        .await
        .map_err(|source| ServeError::Io {
            addr: bound.to_string(),
            source,
        })?;
        let _ = writeln!(
            std::io::stderr(),
            "shutting down: stopping sessions and flushing the store"
        );
        if let Some(cluster) = &cluster {
            cluster.stop_tasks();
        }
        if let Some(task) = tls_watch {
            task.abort();
        }
        // Attempts in flight are dropped; their deliveries stay pending and
        // go out (with the same webhook-id) after the next start.
        let _ = stop_hooks.send(true);
        if let Some(task) = delivery {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        if let Err(e) = overseer.shutdown().await {
            let _ = writeln!(
                std::io::stderr(),
                "shutting down: the store's final flush failed; every checkpoint confirmed \
                 before was already on disk, and nothing after the failure was acknowledged"
            );
            return Err(crate::service::ServiceError::from(e).into());
        }
        if let Some(cluster) = cluster {
            // The other nodes take this node's active sessions at once.
            if let Err(e) = cluster.leave().await {
                tracing::warn!(error = %e, "could not give up this node's leases; they run out on their own");
            }
        }
        Ok::<(), CliError>(())
    })?;
    // Blocking tasks still running (a listing) are not waited for long: the
    // watchdog's deadline holds in any case.
    rt.shutdown_timeout(Duration::from_secs(1));
    // The spans still queued go to the collector (bounded by its timeout).
    telemetry.shutdown();
    Ok(())
}

/// How long after the shutdown grace the process may take to stop its
/// sessions and flush the store before the watchdog ends it: the whole
/// shutdown stays within `shutdown_grace_secs` + 5 s.
const EXIT_SLACK: Duration = Duration::from_millis(4_500);

/// Starts a thread that ends the process `after` from now unless it has
/// ended by then, saying what was not confirmed: a store that cannot write
/// (a full disk), a session actor waiting on it, or anything else stuck must
/// not keep a stopping server, and the store's lock with it, for ever.
/// Nothing it cuts short was acknowledged to a caller: a checkpoint is
/// confirmed only once durable.
fn arm_exit_watchdog(
    after: Duration,
    store: Option<crate::store::StoreWatch>,
    runtime: WeakOverseer,
) {
    let deadline = Instant::now() + after;
    let spawned = std::thread::Builder::new()
        .name("overseer-exit-watchdog".into())
        .spawn(move || {
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
            let _ = writeln!(
                std::io::stderr(),
                "{}",
                unconfirmed_at_exit(after, store.as_ref(), &runtime)
            );
            std::process::exit(EXIT_WATCHDOG);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the shutdown watchdog; the shutdown has no deadline");
    }
}

/// The exit status of a shutdown the watchdog ended.
const EXIT_WATCHDOG: i32 = 3;

/// Most session ids named in the watchdog's line.
const NAMED_SESSIONS: usize = 10;

/// The watchdog's line: what the store had not confirmed, and which
/// sessions were still stopping.
fn unconfirmed_at_exit(
    after: Duration,
    store: Option<&crate::store::StoreWatch>,
    runtime: &WeakOverseer,
) -> String {
    let mut line = format!(
        "shutting down: not done {:.1} s after the signal; exiting without waiting further",
        after.as_secs_f64()
    );
    if let Some(store) = store {
        line.push_str(&format!(
            "; {} store write(s) (checkpoints, flushes) not confirmed",
            store.unconfirmed()
        ));
        if let Some(outage) = store.outage() {
            line.push_str(&format!(" ({outage})"));
        }
    }
    if let Some(rt) = runtime.upgrade() {
        let ids: Vec<String> = rt.live_ids().iter().map(ToString::to_string).collect();
        if !ids.is_empty() {
            let named = ids.iter().take(NAMED_SESSIONS).cloned().collect::<Vec<_>>();
            let more = ids.len().saturating_sub(NAMED_SESSIONS);
            line.push_str(&format!(
                "; {} session(s) still stopping: {}{}",
                ids.len(),
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
    }
    line.push_str(
        "; none of it was acknowledged to a caller, so nothing confirmed is lost: those \
         sessions resume from their last checkpoint at the next start",
    );
    line
}

async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Io {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Io {
        addr: addr.to_string(),
        source,
    })?;
    Ok((listener, bound))
}

/// The authentication `config` describes: the key, the claim rules and
/// the leeway (`ca_bundle`: the CAs a JWKS fetch trusts besides the
/// built-in roots).
fn auth_config(config: &Config, ca_bundle: Option<Vec<u8>>) -> Result<AuthConfig, ServeError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| ServeError::KeyFile {
            path: path.clone(),
            source,
        })
    };
    let http = &config.http;
    let keys = match http.auth {
        AuthMode::None => AuthConfig::None,
        AuthMode::Hs256 => AuthConfig::hs256_from_env()?,
        AuthMode::Rs256 | AuthMode::Es256 => {
            let Some(path) = &config.http.public_key_pem else {
                return Err(ServeError::Auth(auth::AuthError::InvalidKey(
                    "http.public_key_pem is required for rs256/es256".into(),
                )));
            };
            let pem = read(path)?;
            if config.http.auth == AuthMode::Rs256 {
                AuthConfig::rs256_pem(&pem)?
            } else {
                AuthConfig::es256_pem(&pem)?
            }
        }
        AuthMode::Jwks => {
            let Some(url) = &http.jwks_url else {
                return Err(ServeError::Auth(auth::AuthError::InvalidKey(
                    "http.jwks_url is required for jwks".into(),
                )));
            };
            let verifier = auth::jwks::JwksVerifier::new(auth::jwks::JwksOptions {
                url: url.clone(),
                min_refresh: Duration::from_secs(http.jwks_min_refresh_secs),
                fetch_timeout: JWKS_FETCH_TIMEOUT,
                ca_bundle,
                rules: http.claim_rules(),
                leeway_secs: http.jwt_leeway_secs,
            })?;
            return Ok(AuthConfig::Jwks(Arc::new(verifier)));
        }
    };
    Ok(keys
        .with_leeway(http.jwt_leeway())
        .with_claims(http.claim_rules()))
}

/// How long one fetch of the identity provider's key set may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// The inbox link for `base` handing over `token` in the fragment, or a
/// usage error naming `--url`. Only an `http(s)://host[:port][/path]`
/// address is accepted: a query, a fragment or credentials in it would end
/// up somewhere the token does not belong.
pub fn inbox_link(base: &str, token: &str) -> Result<String, CliError> {
    let bad = |why: &str| CliError::Usage(format!("--url: '{base}' {why}"));
    let url = reqwest::Url::parse(base.trim())
        .map_err(|e| bad(&format!("is not a URL like http://127.0.0.1:8080 ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("must start with http:// or https://"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("must not have a query or a fragment"));
    }
    let mut page = url.as_str().trim_end_matches('/').to_owned();
    page.push_str("/#token=");
    page.push_str(token);
    Ok(page)
}

/// Prints a token minted from `OVERSEER_JWT_SECRET`, and nothing else, on
/// stdout (with `--url`, the inbox's sign-in link carrying it).
pub fn token(args: TokenArgs) -> Result<(), CliError> {
    // Checked before minting, so a bad address fails without a token.
    if let Some(url) = &args.url {
        inbox_link(url, "")?;
    }
    let secret = std::env::var(auth::SECRET_ENV).map_err(|_| {
        CliError::Usage(format!(
            "{}: not set; export the server's HS256 secret to mint a token for it",
            auth::SECRET_ENV
        ))
    })?;
    let scopes: Vec<String> = args
        .scopes
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let token = auth::mint(
        secret.as_bytes(),
        &args.tenant,
        &args.sub,
        &scopes,
        Duration::from_secs(args.ttl),
    )
    .map_err(|e| {
        use auth::AuthError as E;
        let flag = match &e {
            E::EmptyClaim("tenant") | E::InvalidClaim("tenant") => "--tenant",
            E::EmptyClaim(_) | E::InvalidClaim(_) => "--sub",
            E::NoScopes | E::UnknownScope(_) => "--scopes",
            E::InvalidTtl { .. } => "--ttl",
            _ => auth::SECRET_ENV,
        };
        CliError::Usage(format!("{flag}: {e}"))
    })?;
    let line = match &args.url {
        Some(url) => inbox_link(url, &token)?,
        None => token,
    };
    terminal::print_line(&line).map_err(CliError::Stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_link_carries_the_token_in_the_fragment_only() {
        assert_eq!(
            inbox_link("http://127.0.0.1:8080", "a.b.c").unwrap(),
            "http://127.0.0.1:8080/#token=a.b.c"
        );
        assert_eq!(
            inbox_link("https://ops.example.com/overseer/", "a.b.c").unwrap(),
            "https://ops.example.com/overseer/#token=a.b.c"
        );
        for bad in [
            "127.0.0.1:8080",
            "ftp://host",
            "http://user:pw@host",
            "http://host/?x=1",
            "http://host/#a",
            "not a url",
        ] {
            let e = inbox_link(bad, "t").unwrap_err();
            assert!(e.to_string().starts_with("--url:"), "{bad}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
    }
}
