//! `overseer run`: one session in-process, on the embedded store, with the
//! agent's text streamed to stdout, progress on stderr, and approvals asked
//! on the terminal (or decided by `--approve`). `--resume` continues a session
//! a previous process left.
//!
//! Its runtime is built by `service`, exactly as `serve` builds its own; this
//! module owns only following one session's events and deciding its calls.

mod question;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc};

use overseer_actors::model::{
    merge_override, CallState, Decision, Event, EventKind, Notification, SessionHeader, SessionId,
    SessionStatus, StopReason, Submission, ToolCallId, Usage,
};
use overseer_actors::provider::Provider;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::{
    CreateSession, Overseer, PendingApproval, SessionError, SessionOverrides, TaskRun,
};

use crate::service::descendants;

use super::{status, terminal, ApproveMode, CliError, RunArgs, CLI_TENANT, DENY_MESSAGE};
use crate::config::{Config, LoadOptions, Overrides};
use crate::provider::{process_env, ProviderKind, RouteConfig, RoutedProvider};
use crate::render;
use crate::tools::builtin_registry;
use question::{Read, Watch};

/// Longest excerpt of a tool result or arguments on a status line.
const EXCERPT_CHARS: usize = 200;

/// How often a run reads its session's events from the store, besides the
/// live stream (see `Follower::follow`).
const STORE_POLL: Duration = Duration::from_secs(1);

/// Longest a run waits, once its turn is over, for the questions still on
/// the terminal to end with their line.
const QUESTIONS_CLOSE: Duration = Duration::from_secs(2);

/// What a run works on.
enum Target {
    /// A new session of `agent`, started with `prompt`, on `route` (the
    /// agent's own when `None`).
    New {
        agent: String,
        prompt: String,
        route: Option<String>,
        /// `--task`: the stored task, with the prompt as its context.
        task: Option<String>,
        /// `--skill`: skills a person activates before the first message.
        skills: Vec<String>,
    },
    /// A stored session, continued on its own route, or switched to the
    /// route `flags` make (between turns): mid-turn, its turn is followed;
    /// waiting for input, it is given `prompt`, if any.
    Resume {
        id: SessionId,
        prompt: Option<String>,
        flags: RouteFlags,
    },
}

/// `--provider`, `--base-url`, `--model` and `--api-key-env`.
#[derive(Debug, Clone, Default)]
struct RouteFlags {
    provider: Option<String>,
    base_url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
}

impl RouteFlags {
    fn of(args: &RunArgs) -> Self {
        Self {
            provider: args.provider.clone(),
            base_url: args.base_url.clone(),
            model: args.model.clone(),
            api_key_env: args.api_key_env.clone(),
        }
    }

    /// Whether a flag other than `--model` is given: `--model` is then a
    /// model id, never a route name.
    fn endpoint(&self) -> bool {
        self.provider.is_some() || self.base_url.is_some() || self.api_key_env.is_some()
    }

    /// The configured route `--model` alone names, if it does.
    fn named_route(&self, configured: &[String]) -> Option<String> {
        let model = self.model.as_ref().filter(|_| !self.endpoint())?;
        configured.iter().any(|r| r == model).then(|| model.clone())
    }

    /// `route` with the flags applied.
    fn apply(&self, route: &mut RouteConfig) -> Result<(), CliError> {
        if let Some(kind) = &self.provider {
            route.provider = kind
                .parse()
                .map_err(|e: crate::provider::ProviderConfigError| {
                    CliError::Usage(e.to_string())
                })?;
        }
        if let Some(url) = &self.base_url {
            route.base_url = Some(url.clone());
        }
        if let Some(model) = &self.model {
            route.model.clone_from(model);
        }
        if let Some(var) = &self.api_key_env {
            route.api_key_env = Some(var.clone());
        }
        Ok(())
    }

    /// `--model` alone on a scripted route: not a route, and no model id
    /// the scripted provider could use.
    fn refuse_bare_model(
        &self,
        route: &RouteConfig,
        configured: &[String],
    ) -> Result<(), CliError> {
        match &self.model {
            Some(model) if !self.endpoint() && route.provider == ProviderKind::Scripted => {
                Err(CliError::Usage(format!(
                    "--model: '{model}' is not a configured model route (configured: {}); as a \
                     model id it needs --provider openai or anthropic (the scripted provider \
                     has no models)",
                    configured.join(", ")
                )))
            }
            _ => Ok(()),
        }
    }
}

/// `overseer run`. Everything that can be refused without side effects
/// (config, agent, terminal, scenario, a data directory that does not exist
/// for `--resume`) is checked before the store is opened, so a refused run
/// leaves no trace on disk.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let target = match args.resume {
        Some(id) => {
            let prompt = args.prompt.join(" ");
            if !args.prompt.is_empty() && prompt.trim().is_empty() {
                return Err(CliError::EmptyPrompt);
            }
            Target::Resume {
                id,
                prompt: (!args.prompt.is_empty()).then_some(prompt),
                flags: RouteFlags::of(&args),
            }
        }
        None => {
            let prompt = args.prompt.join(" ");
            if prompt.trim().is_empty() && args.task.is_none() {
                return Err(CliError::EmptyPrompt);
            }
            Target::New {
                agent: args.agent.clone(),
                prompt,
                route: None,
                task: args.task.clone(),
                skills: args.skills.clone(),
            }
        }
    };
    let tools = builtin_registry()?;
    let options = LoadOptions {
        path: args.config.clone(),
        overrides: Overrides {
            data_dir: args.data.clone(),
            durability: None,
            scenario: args.scenario.clone(),
        },
    };
    let mut config = Config::load(&options, &tools)?;
    let _telemetry = crate::cli::start_telemetry(&config)?;
    let mut target = target;
    if let Target::New { route, .. } = &mut target {
        *route = route_from_flags(&mut config, &RouteFlags::of(&args))?;
    }
    if config.store.kind == crate::config::StoreKind::Postgres {
        return Err(CliError::Usage(
            "overseer run works on the embedded sled store; store.kind = \"postgres\" (cluster mode) is for overseer serve".into(),
        ));
    }
    // A task runs with its own agent.
    if let Target::New {
        task: Some(task),
        agent,
        ..
    } = &mut target
    {
        match config.tasks.iter().find(|t| t.id.as_deref() == Some(task)) {
            Some(t) => agent.clone_from(&t.agent),
            None => {
                let ids: Vec<&str> = config
                    .tasks
                    .iter()
                    .filter_map(|t| t.id.as_deref())
                    .collect();
                return Err(CliError::Usage(format!(
                    "--task: no task named '{task}' (tasks: {})",
                    if ids.is_empty() {
                        "none".to_owned()
                    } else {
                        ids.join(", ")
                    }
                )));
            }
        }
    }
    match &target {
        Target::New { agent, .. } if config.agent(agent).is_none() => {
            return Err(CliError::UnknownAgent {
                name: agent.clone(),
                available: config.agent_names().join(", "),
            });
        }
        // Opening the store would create the directory: a mistyped --data
        // must not leave an empty database behind.
        Target::Resume { id, .. } if !config.store.data_dir.exists() => {
            return Err(CliError::NoSuchSession {
                id: *id,
                dir: config.store.data_dir.clone(),
            });
        }
        _ => {}
    }
    if args.approve == ApproveMode::Ask && !std::io::stdin().is_terminal() {
        return Err(CliError::NotATerminal);
    }
    let routes = crate::service::build_providers(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let result = rt.block_on(run_session(config, tools, routes, target, args.approve));
    // A terminal read may still wait for a line nobody will type (the turn
    // ended while a prompt was open): do not wait for it.
    rt.shutdown_timeout(Duration::from_millis(100));
    result
}

/// The route a new session runs on, by the flags: `--model` alone naming a
/// configured route (a `[[models]]` name, or the default route's) chooses
/// it; otherwise the flags are applied to `[provider]`, and the route it
/// then is, is chosen. `None` without any: the agent's own route.
fn route_from_flags(config: &mut Config, flags: &RouteFlags) -> Result<Option<String>, CliError> {
    let configured = config.route_names();
    if flags.model.is_none() && !flags.endpoint() {
        return Ok(None);
    }
    if let Some(route) = flags.named_route(&configured) {
        return Ok(Some(route));
    }
    flags.refuse_bare_model(&config.provider.route(), &configured)?;
    config.apply_provider_flags(
        flags.provider.as_deref(),
        flags.base_url.clone(),
        flags.model.clone(),
        flags.api_key_env.clone(),
    );
    Ok(Some(config.default_route_name()))
}

/// The route a resumed session switches to, by the flags, the same way as
/// for a new session (see [`route_from_flags`]), except that the flags
/// apply to the session's own route when only the session holds it (one
/// made from flags or `[provider]`): `--resume ID --model other` keeps its
/// server, `--resume ID --api-key-env VAR` its model. The route is built
/// here when no configuration has it. `None` without any flag.
fn route_for_resume(
    routes: &RoutedProvider,
    stored: &SessionHeader,
    flags: &RouteFlags,
    default: &RouteConfig,
    configured: &[String],
) -> Result<Option<String>, CliError> {
    if flags.model.is_none() && !flags.endpoint() {
        return Ok(None);
    }
    if let Some(route) = flags.named_route(configured) {
        return Ok(Some(route));
    }
    let mut route = recorded_route(stored).unwrap_or_else(|| default.clone());
    flags.refuse_bare_model(&route, configured)?;
    flags.apply(&mut route)?;
    let name = route.label();
    if !routes.serves(&name) {
        routes.add(&route, process_env()).map_err(|source| {
            crate::service::ServiceError::Provider {
                route: name.clone(),
                source,
            }
        })?;
    }
    Ok(Some(name))
}

/// The route a session recorded, when it is one no configuration holds
/// (made without a name) and it is the route the session runs on.
fn recorded_route(stored: &SessionHeader) -> Option<RouteConfig> {
    stored
        .config
        .route
        .as_ref()
        .and_then(RouteConfig::from_description)
        .filter(|route| route.label() == stored.config.model)
}

/// Makes sure the route a resumed session runs on is served: by the
/// configuration (its name is configured), or rebuilt from the session's
/// own record when it is a route no configuration holds (one made from
/// flags or `[provider]`). A `[[models]]` route that is no longer
/// configured, or a session that recorded no route, is refused: never
/// continued on another route behind the user's back.
fn serve_stored_route(
    routes: &RoutedProvider,
    stored: &SessionHeader,
    configured: &[String],
) -> Result<(), CliError> {
    let name = &stored.config.model;
    if routes.serves(name) {
        return Ok(());
    }
    let Some(route) = recorded_route(stored) else {
        return Err(CliError::RouteNotConfigured {
            id: stored.id,
            route: name.clone(),
            configured: configured.join(", "),
        });
    };
    routes
        .add(&route, process_env())
        .map_err(|source| crate::service::ServiceError::Provider {
            route: name.clone(),
            source,
        })?;
    status(format_args!(
        "model route: {name} (as the session recorded it)"
    ));
    Ok(())
}

async fn run_session(
    mut config: Config,
    tools: ToolRegistry,
    routes: Arc<RoutedProvider>,
    target: Target,
    mode: ApproveMode,
) -> Result<(), CliError> {
    let resume = ResumeRoutes {
        routes: &routes,
        configured: config.route_names(),
        default: config.provider.route(),
    };
    let provider: Arc<dyn Provider> = routes.clone();
    let data_dir = config.store.data_dir.clone();
    // The built-ins validated the config; the full set adds http tools,
    // http_request and the tools of MCP servers (connected here, kept alive
    // for the run).
    let _ = &tools;
    let all_tools = crate::service::build_tools(&mut config).await?;
    // The same runtime as `serve`'s; recovery is `drive`'s, after it has
    // subscribed to its session.
    let (overseer, _store) = crate::service::open(&config, &all_tools, provider).await?;
    let outcome = drive(&overseer, &resume, target, mode, data_dir).await;
    // Shut down whatever happened, so the store is flushed.
    let shutdown = overseer.shutdown().await;
    outcome?;
    shutdown?;
    Ok(())
}

/// What `--resume` needs to find (or build) a session's route.
struct ResumeRoutes<'a> {
    routes: &'a RoutedProvider,
    /// The configured route names.
    configured: Vec<String>,
    /// `[provider]`, as configured (no flags applied).
    default: RouteConfig,
}

/// Creates (or takes over) the session, follows it to the end of its turn,
/// completes it.
async fn drive(
    overseer: &Overseer,
    resume: &ResumeRoutes<'_>,
    target: Target,
    mode: ApproveMode,
    dir: PathBuf,
) -> Result<(), CliError> {
    // Listening before the session starts, so no Ctrl-C during its turn
    // falls to the default handler (which would kill the process).
    let (interrupt_tx, mut interrupt_rx) = mpsc::unbounded_channel();
    let interrupts = watch_interrupts(interrupt_tx);
    let (id, mut rx, resumed) = match target {
        Target::New {
            agent,
            prompt,
            route,
            task,
            skills,
        } => {
            // Sessions interrupted mid-turn by an earlier process resume
            // here; they are not ours to follow, but leaving them dormant
            // would orphan them.
            let recovered = overseer.recover().await?;
            if recovered > 0 {
                status(format_args!(
                    "recovered {recovered} interrupted session(s) from the store"
                ));
            }
            let id = SessionId::generate();
            // Subscribe before the session exists so not one event is missed.
            let rx = overseer.subscribe(id);
            match task {
                Some(task) => {
                    // The prompt is the task's context: JSON if it parses,
                    // else text.
                    let context = (!prompt.trim().is_empty()).then(|| {
                        serde_json::from_str(&prompt)
                            .unwrap_or(serde_json::Value::String(prompt.clone()))
                    });
                    overseer
                        .run_task(TaskRun {
                            task,
                            context,
                            tenant: CLI_TENANT.into(),
                            id: Some(id),
                            skills,
                            ..TaskRun::default()
                        })
                        .await?;
                }
                None => {
                    let req = CreateSession {
                        agent,
                        tenant: CLI_TENANT.into(),
                        prompt: Some(prompt),
                        id: Some(id),
                        overrides: SessionOverrides {
                            model: route,
                            ..SessionOverrides::default()
                        },
                        ..CreateSession::default()
                    };
                    if skills.is_empty() {
                        overseer.create_session(req).await?;
                    } else {
                        overseer.create_session_with_skills(req, skills).await?;
                    }
                }
            }
            status(format_args!("session: {id}"));
            (id, rx, None)
        }
        Target::Resume { id, prompt, flags } => {
            // Subscribe before anything activates the session, and read its
            // state while it still lives only on disk: every event after
            // that snapshot then arrives on `rx`, none before it.
            let rx = overseer.subscribe(id);
            let stored = overseer
                .store()
                .load_header(id)
                .await
                .map_err(SessionError::from)?
                .ok_or(CliError::NoSuchSession { id, dir })?;
            status(format_args!("session: {id}"));
            status(format_args!("resuming: {}", where_it_stands(&stored)));
            let route = if stored.status.is_terminal() {
                None
            } else {
                route_for_resume(
                    resume.routes,
                    &stored,
                    &flags,
                    &resume.default,
                    &resume.configured,
                )?
            };
            // The same route as the session's is no switch.
            let route = route.filter(|r| *r != stored.config.model);
            if route.is_none() && !stored.status.is_terminal() {
                serve_stored_route(resume.routes, &stored, &resume.configured)?;
            }
            let mid_turn = match stored.status {
                SessionStatus::Running | SessionStatus::AwaitingApproval => {
                    if prompt.is_some() || route.is_some() {
                        return Err(CliError::MidTurn {
                            id,
                            status: stored.status,
                        });
                    }
                    true
                }
                SessionStatus::Pending | SessionStatus::AwaitingInput => {
                    if let Some(route) = &route {
                        overseer.set_model(id, route).await?;
                        status(format_args!(
                            "model route: {} -> {route}",
                            stored.config.model
                        ));
                    }
                    match prompt {
                        Some(prompt) => {
                            let recovered = overseer.recover().await?;
                            if recovered > 0 {
                                status(format_args!(
                                    "recovered {recovered} interrupted session(s) from the store"
                                ));
                            }
                            overseer.send_message(id, prompt).await?;
                            false
                        }
                        None if route.is_some() => {
                            status(format_args!(
                                "session {id} waits for its next message (give a PROMPT to send one)"
                            ));
                            return Ok(());
                        }
                        None if stored.status == SessionStatus::Pending => {
                            return Err(CliError::NothingToResume(id))
                        }
                        // Kept on purpose by Ctrl-C: not completed behind the
                        // user's back.
                        None if stored.last_stop_reason == Some(StopReason::Interrupted) => {
                            return Err(CliError::AwaitsInput(id))
                        }
                        None => {
                            // The turn ended but the process that ran it
                            // stopped before completing the session: finish
                            // as it would have.
                            overseer.done(id).await?;
                            return exit_status(stored.last_stop_reason, stored.error);
                        }
                    }
                }
                SessionStatus::Completed | SessionStatus::Failed | SessionStatus::Cancelled => {
                    return ended(&stored);
                }
            };
            if mid_turn {
                let recovered = overseer.recover().await?;
                if recovered > 1 {
                    status(format_args!(
                        "recovered {} other interrupted session(s) from the store",
                        recovered - 1
                    ));
                }
                // `recover` activated it (it is mid-turn); make sure, since a
                // running session that nothing activates would never go on.
                overseer.activate(id).await?;
            }
            // Followed from the stored snapshot: what came before it is not
            // this run's to report.
            (id, rx, Some(stored))
        }
    };

    let (pending_tx, pending_rx) = mpsc::unbounded_channel();
    let decider = tokio::spawn(decide_calls(overseer.clone(), id, mode, pending_rx));

    // Subagents' approvals surface at the root but are announced on the
    // children's own event streams: watch the tree for them.
    let children = tokio::spawn(watch_children(
        overseer.clone(),
        id,
        overseer.subscribe(id),
        pending_tx.clone(),
    ));
    let mut follower = Follower::new(pending_tx);
    if let Some(stored) = &resumed {
        follower.take_over(stored);
    }
    let end = follower
        .follow(overseer, id, &mut rx, &mut interrupt_rx)
        .await;
    interrupts.abort();
    children.abort();
    drop(follower);
    // The turn is over, and so is every question of it: an open one says
    // so (its call's events close it) rather than being cut off.
    let stop = decider.abort_handle();
    if tokio::time::timeout(QUESTIONS_CLOSE, decider)
        .await
        .is_err()
    {
        stop.abort();
    }
    let end = end?;

    // Ctrl-C stopped the turn: the session is kept, waiting for input.
    if end.reason == StopReason::Interrupted {
        return Err(CliError::Interrupted(id));
    }
    // The CLI sends no follow-up, so complete the session rather than leave it
    // awaiting input forever (a cancelled one is already terminal).
    let state = overseer.state(id).await?;
    if !state.header.status.is_terminal() {
        overseer.done(id).await?;
    }
    exit_status(Some(end.reason), end.detail)
}

/// The exit status of a run whose turn ended with `reason`.
fn exit_status(reason: Option<StopReason>, detail: Option<String>) -> Result<(), CliError> {
    match reason {
        Some(StopReason::EndTurn) | None => Ok(()),
        Some(reason) => Err(CliError::TurnEnded { reason, detail }),
    }
}

/// The outcome of resuming a session that is already terminal: success only
/// for a completed session whose last turn ended normally.
fn ended(header: &SessionHeader) -> Result<(), CliError> {
    ended_with(
        header.id,
        header.status,
        header.last_stop_reason,
        header.error.clone(),
    )
}

fn ended_with(
    id: SessionId,
    status: SessionStatus,
    reason: Option<StopReason>,
    detail: Option<String>,
) -> Result<(), CliError> {
    if status == SessionStatus::Completed && matches!(reason, Some(StopReason::EndTurn) | None) {
        return Ok(());
    }
    Err(CliError::AlreadyEnded {
        id,
        status,
        reason,
        detail,
    })
}

/// One line on where a stored session stands, for `--resume`.
fn where_it_stands(h: &SessionHeader) -> String {
    let at = format!("turn {}, step {}", h.turn, h.step);
    let count = |state: CallState| h.open_calls.iter().filter(|c| c.state == state).count();
    match h.status {
        SessionStatus::Running if h.open_calls.is_empty() => {
            format!("running ({at}): the model call in flight is issued again")
        }
        SessionStatus::Running => format!(
            "running ({at}): {} tool call(s) were running, {} wait to run",
            count(CallState::Running),
            count(CallState::Approved)
        ),
        SessionStatus::AwaitingApproval => format!(
            "awaiting_approval ({at}): {} call(s) wait for a decision, {} were running",
            count(CallState::AwaitingApproval),
            count(CallState::Running)
        ),
        status => match h.last_stop_reason {
            Some(reason) => format!("{status}: its last turn ended with {reason}"),
            None => format!("{status}"),
        },
    }
}

/// How a turn ended.
struct TurnEnd {
    reason: StopReason,
    detail: Option<String>,
}

/// A call waiting for a decision, as announced by its event.
struct PendingCall {
    /// The session that owns it (the root's, or a subagent's).
    session: SessionId,
    id: ToolCallId,
    name: String,
    arguments: Value,
    outcome_unknown: bool,
}

/// Follows one session's notifications: text to stdout, progress to stderr,
/// approval requests to the decider.
struct Follower {
    pending: mpsc::UnboundedSender<PendingCall>,
    names: HashMap<ToolCallId, String>,
    last_seq: u64,
    last_error: Option<String>,
    /// Text of the current step already written to stdout.
    printed: String,
    /// Deltas may have been lost (lagged): print the step's stored text.
    resync: bool,
}

impl Follower {
    fn new(pending: mpsc::UnboundedSender<PendingCall>) -> Self {
        Self {
            pending,
            names: HashMap::new(),
            last_seq: 0,
            last_error: None,
            printed: String::new(),
            resync: false,
        }
    }

    /// Starts from a stored snapshot instead of a new session: events up to
    /// its last one are already reflected in it, and its pending approvals
    /// will announce themselves no more, so they go to the decider now.
    fn take_over(&mut self, header: &SessionHeader) {
        self.last_seq = header.last_event_seq;
        for call in &header.open_calls {
            self.names.insert(call.id.clone(), call.name.clone());
            if call.state == CallState::AwaitingApproval {
                let note = if call.outcome_unknown {
                    " [outcome unknown: it was running when the process stopped]"
                } else {
                    ""
                };
                status(format_args!(
                    "approval pending: {} {} ({}){note}",
                    call.name,
                    excerpt(call.run_arguments()),
                    call.id
                ));
                let _ = self.pending.send(PendingCall {
                    session: header.id,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.run_arguments().clone(),
                    outcome_unknown: call.outcome_unknown,
                });
            }
        }
    }

    async fn follow(
        &mut self,
        overseer: &Overseer,
        id: SessionId,
        rx: &mut broadcast::Receiver<Notification>,
        interrupts: &mut mpsc::UnboundedReceiver<()>,
    ) -> Result<TurnEnd, CliError> {
        let mut presses = 0u8;
        // A session actor that fails right after a checkpoint is restarted
        // from it without that checkpoint's events ever being published, so
        // the live stream can miss a step's last events and then fall silent
        // (e.g. the approval request the run is waiting for). The store has
        // them: read it now and then, so a run never waits forever for news
        // that was recorded.
        let mut poll = tokio::time::interval(STORE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.reset();
        loop {
            tokio::select! {
                n = rx.recv() => match n {
                    Ok(Notification::TextDelta { text, .. }) => self.text(&text),
                    Ok(Notification::Event(event)) => {
                        if event.seq > self.last_seq + 1 {
                            // A gap: events were checkpointed but never
                            // published (their actor died in between). The
                            // store has them, and this one, in order.
                            if let Some(end) = self.catch_up(overseer, id).await? {
                                return Ok(end);
                            }
                        }
                        if let Some(end) = self.event(event) {
                            return Ok(end);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // The live buffer overflowed: the store has every
                        // event; only text deltas are gone (see `resync`).
                        self.resync = true;
                        if let Some(end) = self.catch_up(overseer, id).await? {
                            return Ok(end);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return Err(CliError::StreamClosed),
                },
                _ = poll.tick() => {
                    if let Some(end) = self.catch_up(overseer, id).await? {
                        return Ok(end);
                    }
                }
                Some(()) = interrupts.recv(), if presses < 2 => {
                    presses += 1;
                    self.end_line();
                    if presses == 1 {
                        status(
                            "interrupted: stopping the turn; the session is kept \
                             (Ctrl-C again cancels it)",
                        );
                        if let Err(e) = overseer.interrupt(id).await {
                            status(format_args!("could not interrupt the turn: {e}"));
                        }
                    } else {
                        status("cancelling the session (Ctrl-C again quits at once)");
                        if let Err(e) = overseer.cancel(id).await {
                            status(format_args!("could not cancel the session: {e}"));
                        }
                    }
                }
            }
        }
    }

    /// Handles the stored events after the last one seen.
    async fn catch_up(
        &mut self,
        overseer: &Overseer,
        id: SessionId,
    ) -> Result<Option<TurnEnd>, CliError> {
        let missed = overseer.events_after(id, self.last_seq, usize::MAX).await?;
        for event in missed {
            if let Some(end) = self.event(event) {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    fn text(&mut self, text: &str) {
        self.printed.push_str(text);
        out(text);
    }

    /// Handles one durable event; returns how the turn ended, at its end.
    fn event(&mut self, event: Event) -> Option<TurnEnd> {
        // Events replayed after a lag may repeat live ones.
        if event.seq <= self.last_seq {
            return None;
        }
        self.last_seq = event.seq;
        let session = event.session_id;
        match event.kind {
            EventKind::AssistantMessage { text, .. } => {
                if self.resync {
                    let rest = text.strip_prefix(self.printed.as_str()).unwrap_or(&text);
                    out(rest);
                    self.printed.push_str(rest);
                    self.resync = false;
                }
                self.end_line();
            }
            EventKind::ToolCallProposed {
                call_id,
                name,
                arguments,
            } => {
                status(format_args!(
                    "tool proposed: {name} {} ({call_id})",
                    excerpt(&arguments)
                ));
                self.names.insert(call_id, name);
            }
            EventKind::ApprovalRequested {
                call_id,
                name,
                arguments,
                outcome_unknown,
            } => {
                let note = if outcome_unknown {
                    " [outcome unknown: it was running when the process stopped]"
                } else {
                    ""
                };
                status(format_args!(
                    "approval requested: {name} {} ({call_id}){note}",
                    excerpt(&arguments)
                ));
                let _ = self.pending.send(PendingCall {
                    session,
                    id: call_id,
                    name,
                    arguments,
                    outcome_unknown,
                });
            }
            EventKind::DecisionRecorded { call_id, record } => {
                let by = record.by.as_deref().unwrap_or("unknown");
                let line = match &record.decision {
                    Decision::Approve { .. } => match &record.args_diff {
                        Some(diff) => format!("approved by {by} with edits {}", excerpt(diff)),
                        None => format!("approved by {by}"),
                    },
                    Decision::Deny { message } => format!(
                        "denied by {by}: {}",
                        message.as_deref().unwrap_or("(no reason)")
                    ),
                };
                status(format_args!("decision: {line} ({call_id})"));
            }
            EventKind::ToolCallStarted { call_id, attempt } if attempt > 1 => {
                status(format_args!(
                    "tool re-dispatched: {} attempt {attempt} ({call_id})",
                    self.name(&call_id)
                ));
            }
            EventKind::ToolCallFinished {
                call_id,
                state,
                result,
            } => {
                let label = match state {
                    CallState::Completed => "tool done",
                    _ => "tool ended",
                };
                let shown = match &result {
                    Value::String(s) => s.clone(),
                    other => excerpt(other),
                };
                status(format_args!(
                    "{label}: {} {} ({call_id}): {shown}",
                    self.name(&call_id),
                    call_state_name(state),
                ));
            }
            EventKind::Error { message } => {
                self.end_line();
                status(format_args!("session error: {message}"));
                self.last_error = Some(message);
            }
            EventKind::TurnEnded {
                stop_reason, usage, ..
            } => {
                self.end_line();
                status(format_args!(
                    "turn ended: {stop_reason} ({})",
                    usage_line(&usage)
                ));
                return Some(TurnEnd {
                    reason: stop_reason,
                    detail: self.last_error.take(),
                });
            }
            EventKind::StatusChanged { status: s } if s.is_terminal() => {
                // A session can fail (restart limit) outside a turn: no
                // TurnEnded comes then.
                self.end_line();
                return Some(TurnEnd {
                    reason: StopReason::Error,
                    detail: Some(
                        self.last_error
                            .take()
                            .unwrap_or_else(|| format!("the session is {s}")),
                    ),
                });
            }
            _ => {}
        }
        None
    }

    fn name(&self, id: &ToolCallId) -> &str {
        self.names.get(id).map_or("tool", String::as_str)
    }

    /// Ends the agent's line on stdout so stderr lines do not run into it.
    fn end_line(&mut self) {
        if !self.printed.is_empty() && !self.printed.ends_with('\n') {
            out("\n");
        }
        self.printed.clear();
    }
}

/// Sends the decider every pending approval of a descendant of `root` (its
/// own calls are announced by its events), each once while it is pending.
async fn watch_children(
    overseer: Overseer,
    root: SessionId,
    rx: tokio::sync::broadcast::Receiver<Notification>,
    pending: mpsc::UnboundedSender<PendingCall>,
) {
    let list = {
        let overseer = overseer.clone();
        move || {
            let overseer = overseer.clone();
            async move { overseer.pending_approvals(root).await }
        }
    };
    descendants::watch(root, rx, list, |p: PendingApproval| {
        status(format_args!(
            "approval requested by subagent session {}: {} {} ({})",
            p.session_id,
            p.call.name,
            excerpt(&p.call.arguments),
            p.call.id
        ));
        let _ = pending.send(PendingCall {
            session: p.session_id,
            id: p.call.id.clone(),
            name: p.call.name.clone(),
            arguments: p.call.arguments.clone(),
            outcome_unknown: p.call.outcome_unknown,
        });
    })
    .await;
}

/// Settles approval requests one at a time, in the order they were asked.
async fn decide_calls(
    overseer: Overseer,
    id: SessionId,
    mode: ApproveMode,
    mut pending: mpsc::UnboundedReceiver<PendingCall>,
) {
    let by = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .map_or_else(|_| "cli".to_owned(), |u| format!("cli:{u}"));
    while let Some(call) = pending.recv().await {
        // Failures are reported by `submit`; the session's events tell the rest.
        match mode {
            ApproveMode::Auto => {
                let _ = submit(&overseer, id, &call, Decision::approve(), &by).await;
            }
            ApproveMode::Deny => {
                let _ = submit(&overseer, id, &call, Decision::deny(DENY_MESSAGE), &by).await;
            }
            ApproveMode::Ask => ask(&overseer, id, &call, &by).await,
        }
    }
}

/// How often, and how patiently, a decision is given again to a session
/// that was restarting (about 20 s in all: a restart's backoff is shorter).
const SUBMIT_RETRIES: u32 = 25;
const SUBMIT_RETRY_FIRST: Duration = Duration::from_millis(20);
const SUBMIT_RETRY_MAX: Duration = Duration::from_secs(1);

async fn submit(
    overseer: &Overseer,
    id: SessionId,
    call: &PendingCall,
    decision: Decision,
    by: &str,
) -> Result<(), SessionError> {
    let verb = match &decision {
        Decision::Approve { .. } => "approve",
        Decision::Deny { .. } => "deny",
    };
    let mut submission = Submission::one(call.id.clone(), decision);
    submission.approved_by = Some(by.to_owned());
    // A session actor that fails while the decision waits in its mailbox
    // drops it; its supervisor restarts it from its checkpoint, where the
    // call still waits for a decision. Nobody else will give it in a run, so
    // give it again (a decision that did land is refused as decided: no
    // call runs twice).
    let mut result = overseer.submit(id, submission.clone()).await;
    let mut backoff = SUBMIT_RETRY_FIRST;
    for _ in 0..SUBMIT_RETRIES {
        if !matches!(result, Err(SessionError::Unavailable { .. })) {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(SUBMIT_RETRY_MAX);
        result = overseer.submit(id, submission.clone()).await;
    }
    if result.is_ok() {
        // Printed only once `submit` returned: the decision is checkpointed.
        // A stable line that tools (and the crash tests) may parse.
        status(format_args!("decision acknowledged: {} {verb}", call.id));
    }
    if let Err(e) = &result {
        if !matches!(e, SessionError::InvalidOverride { .. }) {
            // Decided elsewhere (timeout, cancel): the events tell the rest.
            status(format_args!(
                "could not submit the decision for {}: {e}",
                call.id
            ));
        }
    }
    result
}

/// Asks on the terminal until the decision is accepted, or until the call
/// no longer waits (decided elsewhere, or its turn ended): then the question
/// ends with a line saying who decided and how.
async fn ask(overseer: &Overseer, id: SessionId, call: &PendingCall, by: &str) {
    let closed = match Watch::start(overseer, call.session, &call.id).await {
        Ok(watch) => watch.closed(),
        Err(why) => return closed_line("not asked", call, &why),
    };
    show_call(call);
    let mut closed = Box::pin(closed);
    let mut read = async |prompt: String| match question::read_line(prompt, &mut closed).await {
        Read::Line(line) => Ok(line),
        Read::Closed(why) => {
            closed_line("question closed", call, &why);
            Err(())
        }
    };
    loop {
        let note = if call.outcome_unknown {
            " (it was running when the process stopped; approving runs it again)"
        } else {
            ""
        };
        let question = format!(
            "approve {} ({}){note}? [y]es/[n]o/[e]dit: ",
            call.name, call.id
        );
        let Ok(answer) = read(question).await else {
            return;
        };
        let Some(answer) = answer else {
            // End of input: nobody is left to ask.
            let _ = submit(
                overseer,
                id,
                call,
                Decision::deny("no answer (end of input)"),
                by,
            )
            .await;
            return;
        };
        let decision = match answer.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Decision::approve(),
            "n" | "no" => {
                let Ok(reason) = read("reason (optional): ".to_owned()).await else {
                    return;
                };
                let reason = reason
                    .map(|r| r.trim().to_owned())
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| "denied at the terminal".to_owned());
                Decision::deny(reason)
            }
            "e" | "edit" => {
                let Ok(text) = read("arguments to replace, as a JSON object: ".to_owned()).await
                else {
                    return;
                };
                let Some(text) = text else {
                    continue;
                };
                match serde_json::from_str::<Map<String, Value>>(text.trim()) {
                    Ok(override_args) => {
                        show_edit(call, &override_args);
                        let Ok(confirmed) =
                            read("approve with these arguments? [y]es/[n]o: ".to_owned()).await
                        else {
                            return;
                        };
                        if !matches!(
                            confirmed.map(|a| a.trim().to_ascii_lowercase()).as_deref(),
                            Some("y" | "yes")
                        ) {
                            continue;
                        }
                        Decision::Approve {
                            override_args: Some(override_args),
                            remove_args: Vec::new(),
                        }
                    }
                    Err(e) => {
                        status(format_args!("not a JSON object: {e}"));
                        continue;
                    }
                }
            }
            _ => {
                status("answer y, n or e");
                continue;
            }
        };
        match submit(overseer, id, call, decision, by).await {
            Err(e @ SessionError::InvalidOverride { .. }) => status(format_args!("error: {e}")),
            _ => return,
        }
    }
}

/// Shows the call a person is asked about, through the rendering rule: the
/// arguments as pretty JSON of exactly what the tool will receive, then the
/// rule's warnings.
fn show_call(call: &PendingCall) {
    status(format_args!("{} ({}) will receive:", call.name, call.id));
    print_block(&call.name, &call.arguments);
}

/// Pretty JSON of `arguments` and the warnings about them, on stderr.
fn print_block(name: &str, arguments: &Value) {
    for line in terminal::shown_json(arguments) {
        status(line);
    }
    let warnings = render::call_warnings(name, arguments);
    for line in terminal::warning_lines(&warnings) {
        status(line);
    }
}

/// Shows what an edit changes and what the tool will then receive, before
/// the person is asked to approve that. An edit replaces the keys it names
/// (a shallow merge, as the session applies it).
fn show_edit(call: &PendingCall, edit: &Map<String, Value>) {
    let (merged, diff) = match merge_override(&call.arguments, edit, &[]) {
        Ok(merged) => merged,
        // Only removals can be refused, and this edit removes nothing.
        Err(problem) => {
            status(problem);
            return;
        }
    };
    match diff.as_object().filter(|d| !d.is_empty()) {
        Some(changes) => {
            status("your edit changes:");
            for line in terminal::diff_lines(changes) {
                status(line);
            }
        }
        None => status("your edit changes nothing"),
    }
    status(format_args!(
        "{} ({}) will then receive:",
        call.name, call.id
    ));
    print_block(&call.name, &merged);
}

/// The line that ends a question the call's decision elsewhere closed (or
/// says why a queued one is not asked).
fn closed_line(what: &str, call: &PendingCall, why: &overseer_actors::model::PromptClosed) {
    status(format_args!("{what}: {} ({}) {why}", call.name, call.id));
}

/// Forwards Ctrl-C: the first interrupts the turn (the session is kept), the
/// second cancels the session; a third exits at once (checkpoints are
/// already durable, so nothing is lost).
///
/// The handler is registered before this returns (not when the task first
/// runs): from then on Ctrl-C no longer kills the process.
fn watch_interrupts(tx: mpsc::UnboundedSender<()>) -> tokio::task::JoinHandle<()> {
    #[cfg(unix)]
    let mut signals =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            #[cfg(unix)]
            let got = match signals.as_mut() {
                Some(s) => s.recv().await.is_some(),
                None => tokio::signal::ctrl_c().await.is_ok(),
            };
            #[cfg(not(unix))]
            let got = tokio::signal::ctrl_c().await.is_ok();
            if !got {
                return;
            }
            seen += 1;
            // The first interrupts the turn, the second cancels the session,
            // the third does not wait for either.
            if seen > 2 {
                std::process::exit(130);
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    })
}

/// Writes the agent's text to stdout, control characters escaped (a
/// model's text is not trusted with the terminal). Write errors (a closed
/// pipe) are ignored: the session goes on and its transcript is in the store.
fn out(text: &str) {
    let text = terminal::multiline(text);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

fn excerpt(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= EXCERPT_CHARS {
        return text;
    }
    let cut: String = text.chars().take(EXCERPT_CHARS).collect();
    format!("{cut}…")
}

fn call_state_name(state: CallState) -> &'static str {
    match state {
        CallState::Proposed => "proposed",
        CallState::AwaitingApproval => "awaiting_approval",
        CallState::Approved => "approved",
        CallState::Denied => "denied",
        CallState::Running => "running",
        CallState::Completed => "completed",
        CallState::Failed => "failed",
        CallState::Cancelled => "cancelled",
    }
}

fn usage_line(u: &Usage) -> String {
    format!(
        "{} provider request(s), {} input + {} output tokens, {} tool call(s)",
        u.provider_requests, u.input_tokens, u.output_tokens, u.tool_calls
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_session_exits_per_its_last_stop_reason() {
        let id = SessionId::generate();
        let ended = |status, reason| ended_with(id, status, Some(reason), None);
        assert!(ended(SessionStatus::Completed, StopReason::EndTurn).is_ok());
        let e = ended(SessionStatus::Completed, StopReason::MaxSteps).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("session {id} is completed; its last turn ended with max_steps")
        );
        let e = ended(SessionStatus::Cancelled, StopReason::Cancelled).unwrap_err();
        assert!(e
            .to_string()
            .ends_with("is cancelled; its last turn ended with cancelled"));
        let e = ended_with(
            id,
            SessionStatus::Failed,
            Some(StopReason::EndTurn),
            Some("restart limit exceeded: boom".into()),
        )
        .unwrap_err();
        assert!(
            e.to_string().ends_with(
                "is failed; its last turn ended with end_turn: restart limit exceeded: boom"
            ),
            "{e}"
        );
    }
}
