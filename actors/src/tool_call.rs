//! The tool-call actor: runs exactly one dispatch of one tool call.
//!
//! It owns the tool contract at run time: the per-tool timeout, the
//! 10 MiB result cap with its exact error object, and crash isolation (a
//! panicking tool fails only its own actor; the session, its supervisor, turns
//! the `ActorFailed` event into a `tool crashed` result). It deliberately owns
//! no state machine: the session decides what a result means.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{json, Value};
use std::sync::Arc;
use tracing::Instrument;

use crate::machine::Dispatched;
use crate::messages::{SessionMsg, ToolCallMsg};
use crate::model::ToolCallId;
use crate::tool::{Tool, ToolContext, MAX_RESULT_BYTES};

/// The actor.
pub(crate) struct ToolCallActor;

/// What one dispatch needs.
pub(crate) struct ToolCallArgs {
    /// Shared services (for the in-memory effect journal).
    pub runtime: Arc<crate::runtime::Runtime>,
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Call context (ids, idempotency key, attempt).
    pub ctx: ToolContext,
    /// Arguments to run with.
    pub arguments: Value,
    /// The session to report to.
    pub session: ActorRef<SessionMsg>,
    /// The call's `execute_tool` span (see [`crate::genai`]; disabled when
    /// telemetry is off): the tool runs in it.
    pub span: tracing::Span,
}

/// State: the args, consumed by `Run`.
pub(crate) struct ToolCallState {
    args: Option<ToolCallArgs>,
}

impl Actor for ToolCallActor {
    type Msg = ToolCallMsg;
    type State = ToolCallState;
    type Arguments = ToolCallArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ToolCallArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(ToolCallState { args: Some(args) })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let ToolCallMsg::Run = msg;
        let Some(args) = state.args.take() else {
            return Ok(());
        };
        #[cfg(feature = "fault-injection")]
        {
            use crate::fault::{check, FaultAction, FaultPoint};
            match check(FaultPoint::DuringTool, args.ctx.session_id, &args.ctx.agent) {
                // The session (not this call) is the actor that fails: it
                // dies with the tool running, as in a crash mid-tool.
                Some(FaultAction::Panic) => {
                    let _ = args.session.cast(SessionMsg::InjectedPanic);
                    futures::future::pending::<()>().await;
                }
                Some(FaultAction::Abort) => crate::fault::abort(FaultPoint::DuringTool),
                // A tool that never returns (its timeout ends it).
                Some(FaultAction::Hang) => futures::future::pending::<()>().await,
                // Not a check to skip: nothing to do here.
                Some(FaultAction::Bypass | FaultAction::Fail) | None => {}
            }
        }
        let call_id: ToolCallId = args.ctx.call_id.clone();
        let attempt = args.ctx.attempt;
        let span = tracing::info_span!("tool_call", session_id = %args.ctx.session_id, tool_call_id = %call_id, tool = %args.tool.spec().name);
        let session_id = args.ctx.session_id;
        let journal = &args.runtime.journal;
        journal.advance(session_id, &call_id, attempt, Dispatched::Started);
        // Dropped unfinished if the tool panics or the actor is killed.
        let meter = crate::metrics::ToolRun::start(&args.tool.spec().name);
        let result = run(args.tool.as_ref(), args.ctx, args.arguments)
            .instrument(args.span.clone())
            .instrument(span)
            .await;
        meter.finish(&result);
        crate::genai::tool_finished(&args.span, &result);
        // Journal first: if the session crashed meanwhile, its restart finds
        // the result here instead of running the tool again.
        journal.advance(
            session_id,
            &call_id,
            attempt,
            Dispatched::Finished(result.clone()),
        );
        // The session may be gone (cancelled, crashed); nothing to report to then.
        let _ = args.session.cast(SessionMsg::ToolFinished {
            call_id,
            attempt,
            result,
        });
        myself.stop(None);
        Ok(())
    }
}

/// Runs one call under the tool contract (timeout, size cap). A panic propagates
/// to the actor, which is the point: the supervisor records it.
pub async fn run(tool: &dyn Tool, ctx: ToolContext, arguments: Value) -> Result<Value, Value> {
    let secs = tool.spec().timeout_secs;
    match tokio::time::timeout(Duration::from_secs(secs), tool.call(ctx, arguments)).await {
        Err(_) => Err(json!({"error": format!("tool timed out after {secs} s")})),
        Ok(Err(e)) => Err(e.to_value()),
        Ok(Ok(value)) => cap_result(value),
    }
}

/// Replaces a result over [`MAX_RESULT_BYTES`] by the error object that says so.
pub(crate) fn cap_result(value: Value) -> Result<Value, Value> {
    let size = match serde_json::to_vec(&value) {
        Ok(bytes) => bytes.len(),
        Err(e) => return Err(json!({"error": format!("tool result is not serializable: {e}")})),
    };
    if size > MAX_RESULT_BYTES {
        return Err(json!({
            "error": format!("Tool result exceeded maximum size of {MAX_RESULT_BYTES} bytes"),
            "actual_size": size,
            "truncated": true,
        }));
    }
    Ok(value)
}
