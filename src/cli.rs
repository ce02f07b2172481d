//! The command line: argument types and the `overseer run` command.
//!
//! `run` hosts the whole runtime in-process on an embedded sled store: it
//! creates one session (or, with `--resume`, takes over one that an earlier
//! process left mid-turn), streams the agent's text to stdout and progress to
//! stderr, settles approvals as `--approve` says (asking on a terminal), and
//! completes the session when its turn ends. This module owns that terminal
//! interaction and the exit status. It deliberately holds no session logic
//! (every decision goes through [`Overseer`]'s public API, exactly as an HTTP
//! client's would) and no output beyond the terminal: `serve` and the HTTP
//! client commands belong next to the HTTP edge.

pub(crate) mod client;
mod cluster;
mod run;
mod serve;
mod store;
mod terminal;
mod tools;

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use overseer_actors::model::{SessionId, SessionStatus, StopReason};
use overseer_actors::tool::ToolRegistryError;
use overseer_actors::SessionError;

use crate::config::ConfigError;
use crate::scenario::ScenarioLoadError;

pub use crate::service::CLI_TENANT;
pub use crate::telemetry::init_tracing;

/// The message the model sees for calls denied by `--approve deny`.
pub const DENY_MESSAGE: &str = "denied by --approve deny";

/// What `overseer --version` prints: the version, then the store layouts
/// and database migrations this binary understands (from their constants,
/// see `store::versions`), so an operator can tell before an upgrade whether
/// a binary opens a store as it is.
fn version_text() -> &'static str {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "{}; {}",
            env!("CARGO_PKG_VERSION"),
            crate::store::versions()
        )
    });
    TEXT.as_str()
}

/// `overseer`: a supervised actor tree hosting LLM agent sessions.
#[derive(Debug, Parser)]
#[command(name = "overseer", version = version_text(), about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one prompt in-process on an embedded store: the agent's text goes
    /// to stdout, progress to stderr. Exits 0 when the turn ends with
    /// `end_turn`, 1 otherwise.
    Run(RunArgs),
    /// Serve the HTTP API (recovers every session first); stops gracefully
    /// on SIGTERM/SIGINT.
    Serve(serve::ServeArgs),
    /// Client commands against a running server (token from OVERSEER_TOKEN).
    Sessions(client::SessionsArgs),
    /// Print a development token minted with OVERSEER_JWT_SECRET (only the
    /// token, on stdout).
    Token(serve::TokenArgs),
    /// List every configured tool (built-ins, http tools, MCP servers' tools)
    /// with its approval default and the agents that have it.
    Tools(tools::ToolsArgs),
    /// Maintenance of a store directory (`store check DIR`), copying one
    /// into PostgreSQL (`store copy --from DIR --to postgres`), backups of a
    /// serving or stopped store (`store backup`) and restoring them
    /// (`store restore`).
    Store(store::StoreArgs),
    /// Cluster mode: the nodes sharing OVERSEER_DATABASE_URL
    /// (`cluster status`).
    Cluster(cluster::ClusterArgs),
    /// Serve the Agent Client Protocol (v1) on stdin/stdout, for editors:
    /// sessions run in-process on the embedded store.
    Acp(crate::acp::AcpArgs),
    /// Print the OpenAPI 3.1 document of the HTTP API (what the server
    /// serves at GET /openapi.json), or write it to a file.
    Openapi(OpenapiArgs),
    /// Write the book's generated reference pages (configuration, command
    /// line, metrics) from the code.
    #[command(hide = true)]
    Docs(DocsArgs),
}

/// Arguments of `overseer openapi`.
#[derive(Debug, Clone, Args)]
pub struct OpenapiArgs {
    /// Write the document to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Arguments of the hidden `overseer docs`.
#[derive(Debug, Clone, Args)]
pub struct DocsArgs {
    /// Directory the pages are written to.
    #[arg(long, value_name = "DIR", default_value = crate::docs::REFERENCE_DIR)]
    pub out: PathBuf,
}

/// Arguments of `overseer run`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "With --resume SESSION_ID and no PROMPT, run continues a session that an \
earlier process left (killed while it waited for approval or ran a tool): pending approvals are \
settled per --approve and the turn is followed to its end, as in a fresh run. Pass the same \
--config, --scenario and --data as the run that created it. A session waiting for input (after \
Ctrl-C interrupted its turn) takes a PROMPT as its next message. A resumed session continues on \
the model route it ran on (one made from --provider/--base-url/--model is remembered by the \
session); a route no longer configured is refused. --model and the provider flags mean the \
same as on a new run (a [[models]] route, or a model id and endpoint), applied to the \
session's own route when only the session holds it, and switch the session to the route \
they make.\n\nCtrl-C stops the running turn and keeps the session (it waits \
for input; the run exits with status 130); a second Ctrl-C cancels the session; a third quits \
at once."
)]
pub struct RunArgs {
    /// Config file (default: ./config/overseer.toml if present, else the
    /// built-in defaults).
    #[arg(long, value_name = "FILE", env = "OVERSEER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Agent to run (a resumed session keeps its own).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "assistant",
        conflicts_with = "resume"
    )]
    pub agent: String,
    /// Scenario file for the scripted provider (overrides provider.scenario).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// How tool calls that need approval are decided.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = ApproveMode::Ask)]
    pub approve: ApproveMode,
    /// Data directory of the store (overrides store.data_dir).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Provider of the route the session runs on (overrides `[provider]
    /// kind`): scripted, openai (any OpenAI-compatible server) or anthropic.
    #[arg(long, value_name = "KIND", value_parser = ["scripted", "openai", "anthropic"])]
    pub provider: Option<String>,
    /// Endpoint root of an openai/anthropic provider, e.g.
    /// http://localhost:11434/v1 for Ollama. With it, an API key is sent
    /// only from the variable --api-key-env names (never OPENAI_API_KEY /
    /// ANTHROPIC_API_KEY by default: a local server needs none).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// A configured model route (a [[models]] name) to run on, or else the
    /// model id sent to the --provider openai/anthropic; the same on a new
    /// run and with --resume (which switches the session to it).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Environment variable holding the provider's API key (the session
    /// remembers the variable's name, never the key).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Continue this stored session instead of starting one (a PROMPT is
    /// then its next message, for a session waiting for input).
    #[arg(long, value_name = "SESSION_ID")]
    pub resume: Option<SessionId>,
    /// Run this stored task (`[[tasks]]`, `tasks_dir`) with its agent,
    /// instructions and skills; PROMPT is then the task's context (JSON, or
    /// text), checked against its input schema.
    #[arg(long, value_name = "ID", conflicts_with = "resume")]
    pub task: Option<String>,
    /// Activate this skill before the first message (repeatable). You are a
    /// person: a skill that needs trust is allowed.
    #[arg(long = "skill", value_name = "NAME", conflicts_with = "resume")]
    pub skills: Vec<String>,
    /// The user message (several words are joined with spaces).
    #[arg(value_name = "PROMPT", required_unless_present_any = ["resume", "task"], num_args = 1..)]
    pub prompt: Vec<String>,
}

/// `--approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApproveMode {
    /// Ask on the terminal for each call (stdin must be a terminal).
    Ask,
    /// Approve every call.
    Auto,
    /// Deny every call.
    Deny,
}

/// Why a command failed. Every message is one line; the binary prints it as
/// `error: <message>`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Writing an output file (or stdout) failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Telemetry could not start.
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    /// Assembling the service (providers, store, recovery).
    #[error(transparent)]
    Service(#[from] crate::service::ServiceError),
    /// Serving the API.
    #[error(transparent)]
    Serve(#[from] serve::ServeError),
    /// A client command.
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// Scenario file.
    #[error(transparent)]
    Scenario(#[from] ScenarioLoadError),
    /// Built-in tools.
    #[error("tools: {0}")]
    Tools(#[from] ToolRegistryError),
    /// `--agent` names no configured agent.
    #[error("unknown agent '{name}' (configured: {available})")]
    UnknownAgent {
        /// The name given.
        name: String,
        /// The configured names.
        available: String,
    },
    /// `--approve ask` without a terminal to ask on.
    #[error("--approve ask needs a terminal on stdin to ask for approvals; use --approve auto or --approve deny when stdin is not a terminal")]
    NotATerminal,
    /// Blank prompt.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The session API refused a request.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The turn ended, but not with `end_turn`.
    #[error("turn ended with {reason}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    TurnEnded {
        /// The stop reason.
        reason: StopReason,
        /// The session's last error message, if any.
        detail: Option<String>,
    },
    /// The live event stream stopped before the turn ended.
    #[error("the session's event stream closed before its turn ended")]
    StreamClosed,
    /// `--resume` names a session the store does not hold.
    #[error("no session {id} in {}", dir.display())]
    NoSuchSession {
        /// The id given.
        id: SessionId,
        /// The data directory searched.
        dir: PathBuf,
    },
    /// `--resume` names a session that ended before this run, not with
    /// `end_turn` (or that failed or was cancelled).
    #[error("session {id} is {status}{}{}",
        reason.map(|r| format!("; its last turn ended with {r}")).unwrap_or_default(),
        detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    AlreadyEnded {
        /// The session.
        id: SessionId,
        /// Its terminal status.
        status: SessionStatus,
        /// Its last stop reason.
        reason: Option<StopReason>,
        /// Its recorded error, if any.
        detail: Option<String>,
    },
    /// `--resume` names a session that has no turn to continue.
    #[error("session {0} is pending: it has no message yet, so there is no turn to resume; give a PROMPT to start one")]
    NothingToResume(SessionId),
    /// `--resume` without a PROMPT names a session whose last turn was
    /// interrupted: it waits for its next message.
    #[error("session {0} waits for input (its last turn was interrupted); continue it with `overseer run --resume {0} PROMPT`")]
    AwaitsInput(SessionId),
    /// `--resume` with a PROMPT (or `--model`) names a session in the middle
    /// of a turn.
    #[error("session {id} is {status}, in the middle of a turn: resume it without a PROMPT or --model first, then send the next message")]
    MidTurn {
        /// The session.
        id: SessionId,
        /// Its status.
        status: SessionStatus,
    },
    /// `--resume` names a session whose model route is not configured and
    /// cannot be rebuilt from its record.
    #[error("session {id} runs on model route '{route}', which is not configured (configured: {configured}): add it as a [[models]] route, or continue the session on another with --model ROUTE or --provider/--base-url/--model")]
    RouteNotConfigured {
        /// The session.
        id: SessionId,
        /// Its route.
        route: String,
        /// The configured routes.
        configured: String,
    },
    /// Ctrl-C stopped the turn; the session is kept.
    #[error("interrupted: session {0} is kept and waits for input; continue it with `overseer run --resume {0} PROMPT`")]
    Interrupted(SessionId),
    /// `overseer store`.
    #[error(transparent)]
    StoreCommand(#[from] store::StoreCliError),
    /// `overseer acp`.
    #[error(transparent)]
    Acp(#[from] crate::acp::AcpError),
    /// `overseer docs`.
    #[error(transparent)]
    Docs(#[from] crate::docs::DocsError),
    /// A command-line value (or the environment it names) was refused
    /// before anything ran. The binary exits with status 2 for it.
    #[error("{0}")]
    Usage(String),
    /// Writing the command's output to stdout failed (e.g. a closed pipe).
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
    /// `OVERSEER_FAULT` is malformed (only with the `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    #[error("fault injection: {0}")]
    Fault(String),
}

impl CliError {
    /// The process exit status for this error: 2 for a refused command
    /// line (as for the parser's own usage errors), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            // As a shell reports a process stopped by SIGINT.
            Self::Interrupted(_) => 130,
            _ => 1,
        }
    }
}

/// Arms the fault planned in env `OVERSEER_FAULT` (`point:nth:panic|abort`),
/// if any, and says so on stderr. Process-wide: the binary calls it once at
/// start-up. Exists only with the `fault-injection` feature.
#[cfg(feature = "fault-injection")]
pub fn arm_faults() -> Result<(), CliError> {
    match overseer_actors::fault::arm_from_env() {
        Ok(Some(spec)) => {
            status(format_args!("fault injection armed: {spec}"));
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(CliError::Fault(e)),
    }
}

/// Runs a parsed command line.
pub fn execute(cli: Cli) -> Result<(), CliError> {
    // The commands that read a configuration start logging (and telemetry)
    // from it, once it is loaded (`start_telemetry`).
    if !matches!(
        cli.command,
        Command::Run(_) | Command::Serve(_) | Command::Acp(_)
    ) {
        init_tracing();
    }
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Sessions(args) => client::sessions(args),
        Command::Token(args) => serve::token(args),
        Command::Tools(args) => tools::list(args),
        Command::Store(args) => Ok(store::run(args)?),
        Command::Cluster(args) => cluster::run(args),
        Command::Acp(args) => Ok(crate::acp::run(args)?),
        Command::Openapi(args) => openapi(&args),
        Command::Docs(args) => {
            let command = <Cli as clap::CommandFactory>::command();
            for path in crate::docs::write_reference(&args.out, &command)? {
                status(format_args!("wrote {}", path.display()));
            }
            Ok(())
        }
    }
}

/// `overseer openapi`: the document, to stdout or `--out`.
fn openapi(args: &OpenapiArgs) -> Result<(), CliError> {
    let text = format!("{}\n", crate::http::openapi::document_json());
    match &args.out {
        Some(path) => std::fs::write(path, text).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        }),
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|source| CliError::Write {
                    path: PathBuf::from("<stdout>"),
                    source,
                })
        }
    }
}

/// Starts logging in `[log]`'s format and, when `[telemetry]` or the
/// `OTEL_EXPORTER_OTLP_*` variables name a collector, trace export. The
/// guard exports what is queued when dropped.
pub fn start_telemetry(
    config: &crate::config::Config,
) -> Result<crate::telemetry::Telemetry, CliError> {
    let settings = config.telemetry_settings(|var| std::env::var_os(var))?;
    Ok(crate::telemetry::init(&config.log, settings.as_ref())?)
}

/// Writes one progress line to stderr (without `eprintln!`'s panic on a
/// closed stderr). The line is formatted first and written with one call:
/// stderr is unbuffered, so `writeln!` would issue one write per piece, and a
/// process that dies meanwhile (a crash in another thread) would leave a torn
/// line for whoever parses it (`decision acknowledged: …`).
///
/// Status lines carry stored text (tool names, results, error messages), so
/// control characters in them are escaped.
pub(crate) fn status(line: impl Display) {
    let line = format!("{}\n", terminal::inline(&line.to_string()));
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Prints a command's error as the one line the binary ends with.
pub fn report(error: &CliError) {
    // Messages are one line by construction; this guards against a foreign
    // error (sled, I/O) that is not.
    // With its causes (a store error keeps the OS error beneath it).
    let message = overseer_actors::error::chain(error);
    let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
    status(format_args!("error: {message}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_command_line() {
        let cli = Cli::try_parse_from([
            "overseer",
            "run",
            "--agent",
            "auto",
            "--approve",
            "deny",
            "--data",
            "/tmp/d",
            "What",
            "time?",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.agent, "auto");
        assert_eq!(args.approve, ApproveMode::Deny);
        assert_eq!(args.prompt.join(" "), "What time?");
        let cli = Cli::try_parse_from(["overseer", "run", "hi"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.agent, "assistant");
        assert_eq!(args.approve, ApproveMode::Ask);
        assert!(Cli::try_parse_from(["overseer", "run", "--approve", "maybe", "hi"]).is_err());
    }

    #[test]
    fn resume_takes_a_session_id_and_an_optional_prompt() {
        let id = SessionId::generate();
        let cli = Cli::try_parse_from([
            "overseer",
            "run",
            "--resume",
            &id.to_string(),
            "--approve",
            "auto",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.resume, Some(id));
        assert!(args.prompt.is_empty());
        // A prompt is the next message of a session waiting for input...
        let cli = Cli::try_parse_from(["overseer", "run", "--resume", &id.to_string(), "go", "on"])
            .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.prompt.join(" "), "go on");
        // ...but another agent makes no sense for a stored session.
        assert!(Cli::try_parse_from([
            "overseer",
            "run",
            "--resume",
            &id.to_string(),
            "--agent",
            "auto"
        ])
        .is_err());
        let e = Cli::try_parse_from(["overseer", "run", "--resume", "nope"]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        // Without --resume the prompt stays required.
        assert!(Cli::try_parse_from(["overseer", "run"]).is_err());
    }

    #[test]
    fn turn_end_error_is_one_line() {
        let e = CliError::TurnEnded {
            reason: StopReason::MaxSteps,
            detail: None,
        };
        assert_eq!(e.to_string(), "turn ended with max_steps");
    }
}
