//! Fault injection for tests (cargo feature `fault-injection`, off by
//! default): named points in the actors where a planned fault makes the actor
//! panic, or the whole process abort, on the Nth hit; and named safety checks
//! of the edge (`overseer`'s cluster store) that a planned `bypass` skips
//! from the Nth hit on, so a test can show the next line of defence holding.
//!
//! Owns the plan registry and the hit counting. Without the feature the
//! [`fault_point!`] macro expands to nothing, so release builds contain no
//! trace of it. Plans can be filtered by session, so tests running in one
//! process do not trip over each other's faults.

use std::sync::Mutex;

use crate::model::SessionId;

/// The named points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// In the session actor, right after a checkpoint became durable, before
    /// its events are published and its effects run.
    AfterCheckpoint,
    /// In the session actor, after a call's intent is checkpointed, before
    /// its tool-call actor is spawned.
    BeforeToolDispatch,
    /// In the tool-call actor, after it started and before the tool body runs;
    /// `Panic` fails the *session* actor (which kills the tool with it).
    DuringTool,
    /// In the session actor, while handling a streamed provider event.
    MidStream,
    /// In the session actor, after a decision submission was acknowledged.
    AfterDecisionAck,
    /// In cluster mode, where a node whose own lease ran out by its own
    /// clock refuses to write and drops its sessions (`overseer`'s
    /// PostgreSQL store and heartbeat loop). `Bypass` makes the node carry
    /// on as if its lease were valid, so its stale writes reach the
    /// database's epoch fence.
    IgnoreOwnLease,
    /// In a store, right before it flushes a group of checkpoints (the sled
    /// store's flusher thread); with [`FaultAction::Hang`], a disk that
    /// never answers.
    StoreFlush,
    /// In the sled store's writer, inside the write of a group: after its
    /// batch (every row of its checkpoints and its number) is built and
    /// before it is applied.
    StoreBeforeHeaders,
    /// In the sled store's writer: after a group's batch is applied and
    /// before it is flushed (or, without fsync, confirmed).
    StoreAfterApply,
    /// In the sled store's flusher: after a flush covering groups went
    /// through and before their checkpoints are confirmed.
    StoreBeforeConfirm,
    /// In the sled store's migration to layout 4, after each chunk of rows
    /// it copied and after each old tree it dropped.
    StoreMigration,
    /// In cluster mode, where a node takes back its own sessions after its
    /// lease lapsed (`overseer`'s failover); with [`FaultAction::Fail`],
    /// that round fails as if the database had not answered.
    TakeBack,
}

impl FaultPoint {
    /// Parses the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "after_checkpoint" => Self::AfterCheckpoint,
            "before_tool_dispatch" => Self::BeforeToolDispatch,
            "during_tool" => Self::DuringTool,
            "mid_stream" => Self::MidStream,
            "after_decision_ack" => Self::AfterDecisionAck,
            "ignore_own_lease" => Self::IgnoreOwnLease,
            "store_flush" => Self::StoreFlush,
            "store_before_headers" => Self::StoreBeforeHeaders,
            "store_migration" => Self::StoreMigration,
            "store_after_apply" => Self::StoreAfterApply,
            "store_before_confirm" => Self::StoreBeforeConfirm,
            "take_back" => Self::TakeBack,
            _ => return None,
        })
    }
}

/// What happens when a plan fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Panic in the actor (a supervised failure).
    Panic,
    /// Abort the process (a `kill -9`).
    Abort,
    /// Skip the safety check the point stands for (from the Nth hit on).
    Bypass,
    /// Block the thread that hit the point for as long as the process
    /// lives (a call that never returns, e.g. a wedged disk).
    Hang,
    /// Fail the operation at the point as if the store had not answered,
    /// on the Nth hit only (points that can fail read it with [`check`]).
    Fail,
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPlan {
    /// Where.
    pub point: FaultPoint,
    /// On which hit (1-based) of the point (for the session, if filtered).
    pub nth: u64,
    /// What.
    pub action: FaultAction,
    /// Only hits in this session count; `None` counts every session.
    pub session: Option<SessionId>,
    /// Only hits in sessions of this agent count (e.g. a child whose id is
    /// not known in advance); `None` counts every agent.
    pub agent: Option<String>,
    /// Fire on every hit from the Nth on (a crash loop), not only once.
    pub repeat: bool,
}

static PLANS: Mutex<Vec<(FaultPlan, u64)>> = Mutex::new(Vec::new());

/// Adds a plan.
pub fn arm(plan: FaultPlan) {
    PLANS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((plan, 0));
}

/// Arms the plan in env `OVERSEER_FAULT` = `point:nth:panic|abort|bypass|hang|fail`,
/// if set (`bypass` holds from the Nth hit on).
/// Returns a description of what was armed, or an error naming the bad part.
pub fn arm_from_env() -> Result<Option<String>, String> {
    let Ok(spec) = std::env::var("OVERSEER_FAULT") else {
        return Ok(None);
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let [point, nth, action] = parts.as_slice() else {
        return Err(format!(
            "OVERSEER_FAULT={spec}: expected point:nth:panic|abort|bypass|hang|fail"
        ));
    };
    let point =
        FaultPoint::parse(point).ok_or(format!("OVERSEER_FAULT: unknown point '{point}'"))?;
    let nth: u64 = nth
        .parse()
        .map_err(|_| format!("OVERSEER_FAULT: nth '{nth}' is not a number"))?;
    let action = match *action {
        "panic" => FaultAction::Panic,
        "abort" => FaultAction::Abort,
        "bypass" => FaultAction::Bypass,
        "hang" => FaultAction::Hang,
        "fail" => FaultAction::Fail,
        other => return Err(format!("OVERSEER_FAULT: unknown action '{other}'")),
    };
    arm(FaultPlan {
        point,
        nth,
        action,
        session: None,
        agent: None,
        repeat: action == FaultAction::Bypass,
    });
    Ok(Some(spec))
}

/// Counts a hit of `point` in `session` (of `agent`) and fires a matching plan.
pub fn hit(point: FaultPoint, session: SessionId, agent: &str) {
    match check(point, session, agent) {
        Some(FaultAction::Panic) => panic!("injected fault at {point:?}"),
        Some(FaultAction::Abort) => abort(point),
        Some(FaultAction::Hang) => hang(point),
        Some(FaultAction::Bypass | FaultAction::Fail) | None => {}
    }
}

/// Blocks this thread for as long as the process lives.
pub fn hang(point: FaultPoint) -> ! {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "injected fault: hanging at {point:?} for good"
    );
    loop {
        std::thread::park();
    }
}

/// Counts a hit of a point outside any session (a store's) and fires a
/// matching plan.
pub fn hit_outside_sessions(point: FaultPoint) {
    hit(point, SessionId(uuid::Uuid::nil()), "")
}

/// Aborts the process like a `kill -9` would end it.
pub fn abort(point: FaultPoint) -> ! {
    // Not eprintln!: with stderr closed it would panic instead of aborting.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "injected fault: aborting the process at {point:?}"
    );
    std::process::abort()
}

/// Whether a planned `bypass` skips the check at `point` now (a hit of a
/// node-wide point: plans filtered by session or agent never match).
pub fn bypassed(point: FaultPoint) -> bool {
    check(point, SessionId(uuid::Uuid::nil()), "") == Some(FaultAction::Bypass)
}

/// Whether a planned `fail` fails the node-wide operation at `point` now.
pub fn failed(point: FaultPoint) -> bool {
    check(point, SessionId(uuid::Uuid::nil()), "") == Some(FaultAction::Fail)
}

/// Counts a hit and returns the action of a plan that fires, without firing it.
pub fn check(point: FaultPoint, session: SessionId, agent: &str) -> Option<FaultAction> {
    let mut fire = None;
    {
        let mut plans = PLANS.lock().unwrap_or_else(|e| e.into_inner());
        for (plan, hits) in plans.iter_mut() {
            if plan.point != point
                || plan.session.is_some_and(|s| s != session)
                || plan.agent.as_deref().is_some_and(|a| a != agent)
            {
                continue;
            }
            *hits += 1;
            if *hits == plan.nth || (plan.repeat && *hits > plan.nth) {
                fire = Some(plan.action);
            }
        }
    }
    fire
}

/// Marks a fault point. Expands to nothing without the `fault-injection` feature.
macro_rules! fault_point {
    ($point:ident, $header:expr) => {
        #[cfg(feature = "fault-injection")]
        {
            let header: &$crate::model::SessionHeader = $header;
            $crate::fault::hit($crate::fault::FaultPoint::$point, header.id, &header.agent);
        }
    };
}
pub(crate) use fault_point;
