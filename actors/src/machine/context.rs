//! Context management (of the issue on long conversations): keeping a
//! session's requests inside its model's context window.
//!
//! The session estimates a request's tokens from its characters, calibrated
//! by what the provider reported for earlier requests. Past a threshold of
//! the window (default 80 %) the next step is preceded by a *compaction*: the
//! model summarises the older part of the transcript, the summary is stored
//! as a [`TranscriptEntry::Compaction`] entry, and from then on requests carry
//! the summary plus the recent entries. The older entries stay stored and
//! visible in the API; only what the model is sent changes. A boundary is
//! only ever put before a user message or before a step's assistant entry,
//! so a tool call is never separated from its result. A context-overflow
//! error from the provider triggers the same compaction once, then one
//! retry.
//!
//! This module owns the estimates, the boundary and the compaction step's
//! transitions. It deliberately knows no window of any model: the runtime
//! passes the session's in [`Ctx`].

use std::sync::Arc;

use super::{Ctx, Effect, Partial, Session};
use crate::model::{EventKind, StopReason, TranscriptEntry};
use crate::provider::{entry_chars, ProviderError, ProviderRequest, RequestPurpose};

/// Tokens per 1,000 characters before any calibration (4 characters each).
pub(crate) const DEFAULT_TOKENS_PER_KCHAR: u64 = 250;

/// Default share of the window past which a session compacts, in percent.
pub const DEFAULT_COMPACTION_THRESHOLD_PCT: u8 = 80;

/// Share of the window past which a request is reported as critical.
pub(crate) const CRITICAL_PCT: u64 = 95;

/// Share of the window the recent, uncompacted part is kept within.
const KEEP_PCT: u64 = 50;

/// What the model is asked for when it summarises.
pub(crate) const COMPACTION_INSTRUCTIONS: &str =
    "You are compacting a long conversation so it can go on \
within your context window. Write a faithful, self-contained summary of the conversation below: \
the user's goals and instructions, decisions made, facts learned, results of tool calls that \
still matter, and open questions. Do not address the user; write only the summary.";

/// What a stored summary starts with, so a reader of the request knows what
/// it is.
const SUMMARY_PREFIX: &str = "Summary of the earlier conversation (older messages were compacted):";

impl Session {
    /// The transcript as requests carry it: the latest summary (if any),
    /// then every entry from where it ends, compaction entries themselves
    /// excluded, and error entries too (the model did not say them).
    pub(super) fn context_view(&self) -> Vec<Arc<TranscriptEntry>> {
        let sent = |e: &&Arc<TranscriptEntry>| !matches!(e.as_ref(), TranscriptEntry::Error { .. });
        let Some((at, through)) = self.latest_summary() else {
            return super::skills::after_their_steps(
                self.transcript.iter().filter(sent).cloned().collect(),
            );
        };
        let mut view = Vec::with_capacity(self.transcript.len().saturating_sub(through) + 1);
        if let Some(summary) = self.transcript.get(at) {
            view.push(summary.clone());
        }
        // A skill's instructions are never summarised away: the bodies
        // activated before the summary's end follow it whole.
        view.extend(
            self.transcript
                .iter()
                .take(through)
                .filter(|e| matches!(e.as_ref(), TranscriptEntry::SkillActivated { .. }))
                .cloned(),
        );
        view.extend(
            self.transcript
                .iter()
                .skip(through)
                .filter(|e| !matches!(e.as_ref(), TranscriptEntry::Compaction { .. }))
                .filter(sent)
                .cloned(),
        );
        super::skills::after_their_steps(view)
    }

    /// (index of the latest summary entry, index it covers up to).
    fn latest_summary(&self) -> Option<(usize, usize)> {
        let at = usize::try_from(self.header.context.summary_at?).ok()?;
        match self.transcript.get(at)?.as_ref() {
            TranscriptEntry::Compaction { through, .. } => {
                Some((at, usize::try_from(*through).ok()?))
            }
            _ => None,
        }
    }

    fn tokens_per_kchar(&self) -> u64 {
        match self.header.context.tokens_per_kchar {
            0 => DEFAULT_TOKENS_PER_KCHAR,
            n => u64::from(n),
        }
    }

    /// The estimated tokens of a request.
    pub(super) fn estimate_tokens(&self, request: &ProviderRequest) -> u64 {
        request
            .approx_chars()
            .saturating_mul(self.tokens_per_kchar())
            / 1000
    }

    /// The estimated tokens of `chars` characters the model streamed.
    pub(super) fn estimate_streamed_tokens(&self, chars: u64) -> u64 {
        chars.saturating_mul(self.tokens_per_kchar()).div_ceil(1000)
    }

    /// Learns, from the input tokens the provider reported for the request
    /// just answered, how many tokens a character is worth to this model.
    pub(super) fn calibrate(&mut self, input_tokens: u64, ctx: Ctx<'_>) {
        let chars = self.provider_request(ctx.tools).approx_chars();
        if chars < 200 {
            return; // too short to say anything reliable
        }
        let per_kchar = (input_tokens.saturating_mul(1000) / chars).clamp(50, 2000);
        self.header.context.tokens_per_kchar = u32::try_from(per_kchar).unwrap_or(250);
    }

    /// Where to compact to keep the recent part within half of `window`: the
    /// earliest step boundary past the current summary whose tail fits, or
    /// (when nothing fits) the last boundary before the current user message.
    /// `None` when there is nothing more to compact.
    pub(super) fn compaction_boundary(&self, window: u64) -> Option<u64> {
        let start = self.latest_summary().map_or(0, |(_, through)| through);
        let len = self.transcript.len();
        // The current turn's question is always kept.
        let last_user = self
            .transcript
            .iter()
            .rposition(|e| matches!(e.as_ref(), TranscriptEntry::User { .. }))?;
        let budget = window.saturating_mul(KEEP_PCT) / 100;
        let per_kchar = self.tokens_per_kchar();
        let mut tail_chars: u64 = 0;
        let mut best = None;
        for i in (start + 1..len).rev() {
            tail_chars += entry_chars(&self.transcript[i]) as u64;
            let boundary = matches!(
                self.transcript[i].as_ref(),
                TranscriptEntry::User { .. } | TranscriptEntry::Assistant { .. }
            );
            if !boundary || i > last_user {
                continue;
            }
            if tail_chars.saturating_mul(per_kchar) / 1000 > budget {
                // Keeping more would not fit: compact up to here at least.
                return best.or(Some(i as u64));
            }
            best = Some(i as u64);
        }
        // Everything after the summary fits: compact only if something
        // before the current question is left to summarise.
        best.filter(|&b| b as usize > start)
    }

    /// Starts the step's request, compacting first when it would pass the
    /// threshold of the model's window.
    pub(super) fn request_step(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let request = self.provider_request(ctx.tools);
        if let Some(window) = ctx.context_window.filter(|w| *w > 0) {
            let estimate = self.estimate_tokens(&request);
            let threshold = u64::from(ctx.compaction_threshold_pct);
            if estimate.saturating_mul(100) > window.saturating_mul(threshold) {
                if let Some(through) = self.compaction_boundary(window) {
                    self.begin_compaction(through, ctx, fx);
                    return;
                }
            }
            if estimate.saturating_mul(100) > window.saturating_mul(CRITICAL_PCT) {
                self.emit(
                    EventKind::ContextPressure {
                        estimated_tokens: estimate,
                        context_window: window,
                    },
                    ctx.now_ms,
                );
            }
        }
        fx.push(Effect::StartStream(request));
    }

    /// Asks the model for a summary of the entries before `through`.
    pub(super) fn begin_compaction(&mut self, through: u64, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        self.header.context.compacting_through = Some(through);
        self.dirty = true;
        self.partial = Partial::default();
        fx.push(Effect::StartStream(self.compaction_request(through, ctx)));
    }

    /// The request for a summary of the entries before `through` (the
    /// previous summary standing for what it covers).
    pub(super) fn compaction_request(&self, through: u64, ctx: Ctx<'_>) -> ProviderRequest {
        let through = usize::try_from(through).unwrap_or(usize::MAX);
        let (start, mut transcript) = match self.latest_summary() {
            Some((at, covered)) => (covered, vec![self.transcript[at].clone()]),
            None => (0, Vec::new()),
        };
        transcript.extend(
            self.transcript
                .iter()
                .take(through)
                .skip(start)
                .filter(|e| {
                    !matches!(
                        e.as_ref(),
                        TranscriptEntry::Compaction { .. }
                            | TranscriptEntry::Error { .. }
                            // Kept whole beside the summary, never in it.
                            | TranscriptEntry::SkillActivated { .. }
                    )
                })
                .cloned(),
        );
        let mut request = self.provider_request(ctx.tools);
        request.instructions = COMPACTION_INSTRUCTIONS.to_owned();
        request.transcript = transcript;
        request.tools = Vec::new();
        request.output_schema = None;
        request.purpose = RequestPurpose::Compaction;
        request
    }

    /// The summary stream ended: store the summary and go on with the step
    /// (or end the turn if the model could not summarise).
    pub(super) fn compaction_ended(
        &mut self,
        through: u64,
        partial: Partial,
        result: Result<(), ProviderError>,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        let summary = partial.text.trim().to_owned();
        let failure = match &result {
            Err(e) => Some(format!("the conversation could not be compacted: {e}")),
            Ok(()) if summary.is_empty() => {
                Some("the conversation could not be compacted: the summary was empty".to_owned())
            }
            Ok(()) => None,
        };
        if let Some(message) = failure {
            // Said by no one in the conversation: an error entry, not text.
            let kind = match &result {
                Err(e) => Some(e.kind()),
                Ok(()) => None,
            };
            self.record_error(message, kind, None, ctx);
            self.end_turn(StopReason::Error, ctx, fx);
            return;
        }
        let until = usize::try_from(through).unwrap_or(usize::MAX);
        let assistant_entries = self
            .transcript
            .iter()
            .take(until)
            .map(|e| match e.as_ref() {
                TranscriptEntry::Assistant { .. } => 1,
                _ => 0,
            })
            .sum::<u64>();
        let text = format!("{SUMMARY_PREFIX}\n{summary}");
        self.header.context.summary_at = Some(self.transcript.len() as u64);
        self.push_entry(TranscriptEntry::Compaction {
            summary: text.clone(),
            through,
            assistant_entries,
            at_ms: ctx.now_ms,
        });
        self.emit(
            EventKind::Compacted {
                through,
                summary: text,
            },
            ctx.now_ms,
        );
        self.request_step(ctx, fx);
    }
}

#[cfg(test)]
mod tests {
    //! The context rules on their own: what a request carries, where a
    //! compaction may cut, how tokens are estimated and calibrated, and the
    //! compaction step driven through [`Session::apply`].

    use serde_json::json;

    use super::*;
    use crate::limits::Limits;
    use crate::machine::Input;
    use crate::model::{
        AgentConfig, CallState, ProposedCall, SessionHeader, SessionId, ToolCallId, ToolCallRecord,
    };
    use crate::provider::ProviderEvent;
    use crate::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};

    const NOW: i64 = 1_700_000_000_000;

    struct Noop(ToolSpec);

    #[async_trait::async_trait]
    impl Tool for Noop {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(
            &self,
            _ctx: ToolContext,
            _args: serde_json::Value,
        ) -> Result<serde_json::Value, ToolError> {
            Ok(serde_json::Value::Null)
        }
    }

    fn tools() -> ToolRegistry {
        let spec = ToolSpec::new("look", "looks things up", json!({"type": "object"}));
        let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Noop(spec))];
        ToolRegistry::new(tools).unwrap()
    }

    fn session() -> Session {
        let agent = AgentConfig::new("a", &["look"]);
        let id = SessionId(uuid::Uuid::from_u128(11));
        let header = SessionHeader::new(id, "t".into(), "a".into(), agent.effective(), NOW);
        let mut s = Session::new(header);
        s.mark_persisted();
        s
    }

    fn ctx(tools: &ToolRegistry, window: Option<u64>) -> Ctx<'_> {
        Ctx {
            tools,
            now_ms: NOW,
            seed: 1,
            limits: Limits::default(),
            context_window: window,
            compaction_threshold_pct: DEFAULT_COMPACTION_THRESHOLD_PCT,
        }
    }

    fn user(text: &str) -> TranscriptEntry {
        TranscriptEntry::User {
            text: text.into(),
            at_ms: NOW,
        }
    }

    fn assistant(text: &str, calls: &[&str]) -> TranscriptEntry {
        TranscriptEntry::Assistant {
            text: text.into(),
            tool_calls: calls
                .iter()
                .map(|id| ProposedCall {
                    id: ToolCallId((*id).into()),
                    name: "look".into(),
                    arguments: json!({}),
                })
                .collect(),
            at_ms: NOW,
            finish_reason: None,
        }
    }

    fn result(id: &str, text: &str) -> TranscriptEntry {
        let mut call =
            ToolCallRecord::proposed(ToolCallId(id.into()), "look".into(), json!({}), NOW);
        call.finish(CallState::Completed, json!(text), NOW);
        TranscriptEntry::ToolResult { call }
    }

    fn error(message: &str) -> TranscriptEntry {
        TranscriptEntry::Error {
            message: message.into(),
            kind: Some("transport".into()),
            estimated_tokens: None,
            context_window: None,
            at_ms: NOW,
        }
    }

    fn summary(through: u64) -> TranscriptEntry {
        TranscriptEntry::Compaction {
            summary: format!("{SUMMARY_PREFIX}\nearlier"),
            through,
            assistant_entries: 1,
            at_ms: NOW,
        }
    }

    fn with(entries: Vec<TranscriptEntry>) -> Session {
        let mut s = session();
        s.transcript = entries.into_iter().map(Arc::new).collect();
        s.header.transcript_len = s.transcript.len() as u64;
        s
    }

    /// A conversation of `turns` turns, each a question, a call, its result
    /// and an answer, every text `chars` long.
    fn conversation(turns: usize, chars: usize) -> Vec<TranscriptEntry> {
        let text = "w".repeat(chars);
        (0..turns)
            .flat_map(|t| {
                let id = format!("c{t}");
                [
                    user(&text),
                    assistant(&text, &[&id]),
                    result(&id, &text),
                    assistant(&text, &[]),
                ]
            })
            .collect()
    }

    fn roles(entries: &[Arc<TranscriptEntry>]) -> Vec<&'static str> {
        entries
            .iter()
            .map(|e| match e.as_ref() {
                TranscriptEntry::User { .. } => "user",
                TranscriptEntry::Assistant { .. } => "assistant",
                TranscriptEntry::ToolResult { .. } => "result",
                TranscriptEntry::Compaction { .. } => "summary",
                TranscriptEntry::Error { .. } => "error",
                TranscriptEntry::ModelChanged { .. } => "model",
                TranscriptEntry::ToolRuleSet { .. } => "rule",
                TranscriptEntry::SkillActivated { .. } => "skill",
            })
            .collect()
    }

    #[test]
    fn requests_carry_the_latest_summary_and_what_follows_it_never_an_error() {
        // No summary: everything but the errors, in order.
        let s = with(vec![
            user("q1"),
            assistant("a1", &[]),
            error("broke"),
            user("q2"),
        ]);
        assert_eq!(roles(&s.context_view()), ["user", "assistant", "user"]);

        // A summary is appended where the conversation was when it was
        // written, after the question it was made for; requests carry the
        // latest one, then every entry from where it ends, other summaries
        // and errors left out.
        let mut s = with(vec![
            user("q1"),           // 0
            assistant("a1", &[]), // 1
            user("q2"),           // 2
            summary(2),           // 3: covers 0..2
            assistant("a2", &[]), // 4
            error("broke"),       // 5
            user("q3"),           // 6
            summary(6),           // 7: covers 0..6
            assistant("a3", &[]), // 8
        ]);
        s.header.context.summary_at = Some(7);
        let view = s.context_view();
        assert_eq!(roles(&view), ["summary", "user", "assistant"]);
        assert!(
            Arc::ptr_eq(&view[0], &s.transcript[7]),
            "the latest summary"
        );
        assert!(Arc::ptr_eq(&view[1], &s.transcript[6]));
        s.header.context.summary_at = Some(3);
        assert_eq!(
            roles(&s.context_view()),
            ["summary", "user", "assistant", "user", "assistant"]
        );
        // An index that names no summary is not trusted: the whole
        // transcript but its errors.
        s.header.context.summary_at = Some(6);
        assert_eq!(s.context_view().len(), 8);
        // The request the model gets is that view.
        let tools = tools();
        s.header.context.summary_at = Some(7);
        assert_eq!(s.provider_request(&tools).transcript.len(), 3);
    }

    #[test]
    fn a_boundary_falls_only_before_a_question_or_an_answer_never_inside_a_step() {
        let mut entries = conversation(6, 400);
        entries.push(user("the current question"));
        let s = with(entries);
        let last_user = s.transcript.len() - 1;
        let mut cuts = std::collections::BTreeSet::new();
        for window in [100, 300, 600, 1_000, 2_000, 4_000, 100_000] {
            let Some(b) = s.compaction_boundary(window) else {
                continue;
            };
            let b = b as usize;
            assert!(b > 0 && b <= last_user, "window {window}: {b}");
            assert!(
                matches!(
                    s.transcript[b].as_ref(),
                    TranscriptEntry::User { .. } | TranscriptEntry::Assistant { .. }
                ),
                "window {window}: cut before a {:?}",
                roles(&s.transcript[b..=b])
            );
            // Nothing kept starts with a result whose call was summarised.
            assert!(!matches!(
                s.transcript[b].as_ref(),
                TranscriptEntry::ToolResult { .. }
            ));
            cuts.insert(b);
        }
        assert!(cuts.len() >= 3, "the cut moves with the window: {cuts:?}");
        // A smaller window never keeps more.
        let at = |w| s.compaction_boundary(w).unwrap_or(0);
        assert!(at(300) >= at(2_000));

        // Nothing before the current question: nothing to compact.
        let s = with(vec![user(&"q".repeat(40_000))]);
        assert_eq!(s.compaction_boundary(100), None);
        // Only what came after the latest summary is summarised again:
        // right after one, nothing; once a step and a question follow, up
        // to that question.
        let mut s = with(vec![
            user("q1"),           // 0
            assistant("a1", &[]), // 1
            user("q2"),           // 2
            summary(2),           // 3: covers 0..2
        ]);
        s.header.context.summary_at = Some(3);
        assert_eq!(s.compaction_boundary(1), None);
        s.transcript.push(Arc::new(assistant("a2", &[])));
        s.transcript.push(Arc::new(user("q3")));
        assert_eq!(s.compaction_boundary(1), Some(5));
    }

    #[test]
    fn estimates_are_calibrated_by_reported_usage_within_bounds() {
        let tools = tools();
        let mut s = with(vec![user(&"x".repeat(4_000))]);
        let request = s.provider_request(&tools);
        let chars = request.approx_chars();
        assert_eq!(
            s.estimate_tokens(&request),
            chars * 250 / 1000,
            "4 characters a token"
        );
        assert_eq!(s.estimate_streamed_tokens(1), 1, "rounded up");

        // The provider counted twice as many: later estimates follow it.
        s.calibrate(chars * 500 / 1000, ctx(&tools, None));
        assert_eq!(s.header.context.tokens_per_kchar, 500);
        assert_eq!(s.estimate_tokens(&request), chars * 500 / 1000);
        // Absurd reports are clamped.
        s.calibrate(chars * 100, ctx(&tools, None));
        assert_eq!(s.header.context.tokens_per_kchar, 2_000);
        s.calibrate(0, ctx(&tools, None));
        assert_eq!(s.header.context.tokens_per_kchar, 50);

        // Too short a request says nothing reliable.
        let mut short = with(vec![user("hi")]);
        let short_chars = short.provider_request(&tools).approx_chars();
        assert!(short_chars < 200, "{short_chars}");
        short.calibrate(1_000, ctx(&tools, None));
        assert_eq!(short.header.context.tokens_per_kchar, 0, "not calibrated");
    }

    #[test]
    fn a_step_past_the_threshold_compacts_first_and_a_critical_one_is_reported() {
        let tools = tools();
        // 6 turns of 4 × 400 characters: about 2,400 tokens; a window of
        // 2,000 is past 80 %.
        let mut entries = conversation(6, 400);
        entries.push(user("now"));
        let mut s = with(entries);
        let mut fx = Vec::new();
        s.request_step(ctx(&tools, Some(2_000)), &mut fx);
        let through = s.header.context.compacting_through.expect("compacting");
        match fx.as_slice() {
            [Effect::StartStream(r)] => {
                assert_eq!(r.purpose, RequestPurpose::Compaction);
                assert!(r.tools.is_empty() && r.output_schema.is_none());
                assert_eq!(r.instructions, COMPACTION_INSTRUCTIONS);
                assert_eq!(r.transcript.len(), through as usize, "what it summarises");
            }
            other => panic!("{other:?}"),
        }

        // Under the threshold: the step itself.
        let mut s = with(vec![user("short")]);
        let mut fx = Vec::new();
        s.request_step(ctx(&tools, Some(100_000)), &mut fx);
        assert!(
            matches!(fx.as_slice(), [Effect::StartStream(r)] if r.purpose == RequestPurpose::Step)
        );
        assert!(s.pending_events().is_empty());

        // Past the critical share with nothing to compact: asked as it is,
        // and the pressure is an event.
        let mut s = with(vec![user(&"q".repeat(4_000))]);
        let mut fx = Vec::new();
        s.request_step(ctx(&tools, Some(1_000)), &mut fx);
        assert!(
            matches!(fx.as_slice(), [Effect::StartStream(r)] if r.purpose == RequestPurpose::Step)
        );
        assert!(s.pending_events().iter().any(|e| matches!(
            e.kind,
            EventKind::ContextPressure {
                context_window: 1_000,
                ..
            }
        )));
    }

    #[test]
    fn the_summary_request_leaves_out_errors_and_stands_on_the_previous_summary() {
        let tools = tools();
        let mut s = with(vec![
            user("q1"),           // 0
            assistant("a1", &[]), // 1
            summary(2),           // 2: covers 0..2
            user("q2"),           // 3
            error("broke"),       // 4
            assistant("a2", &[]), // 5
            user("q3"),           // 6
        ]);
        s.header.context.summary_at = Some(2);
        let r = s.compaction_request(6, ctx(&tools, None));
        assert_eq!(roles(&r.transcript), ["summary", "user", "assistant"]);
        assert_eq!(r.purpose, RequestPurpose::Compaction);
    }

    /// Through the machine: a step past the threshold streams a summary; a
    /// summary is stored as an entry and the step goes on carrying it; an
    /// empty summary ends the turn with an error entry.
    #[test]
    fn a_summary_is_stored_and_carried_and_an_empty_one_ends_the_turn() {
        let tools = tools();
        let window = Some(2_000);
        let start = |s: &mut Session| {
            s.apply(
                Input::Message {
                    text: "and now?".into(),
                    message_id: None,
                },
                ctx(&tools, window),
            )
            .unwrap()
        };
        let mut s = with(conversation(6, 400));
        s.header.status = crate::model::SessionStatus::AwaitingInput;
        let fx = start(&mut s);
        assert!(
            matches!(fx.as_slice(), [Effect::StartStream(r)] if r.purpose == RequestPurpose::Compaction)
        );
        let through = s.header.context.compacting_through.unwrap();
        s.apply(
            Input::Provider(ProviderEvent::TextDelta("they talked".into())),
            ctx(&tools, window),
        )
        .unwrap();
        let fx = s
            .apply(Input::StreamEnded(Ok(())), ctx(&tools, window))
            .unwrap();
        let at = s.header.context.summary_at.unwrap() as usize;
        match s.transcript[at].as_ref() {
            TranscriptEntry::Compaction {
                summary,
                through: t,
                ..
            } => {
                assert_eq!(*t, through);
                assert!(summary.starts_with(SUMMARY_PREFIX) && summary.ends_with("they talked"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.header.context.compacting_through, None);
        match fx.as_slice() {
            [Effect::StartStream(r)] => {
                assert_eq!(r.purpose, RequestPurpose::Step);
                assert!(
                    Arc::ptr_eq(&r.transcript[0], &s.transcript[at]),
                    "summary first"
                );
                assert_eq!(
                    r.transcript.len(),
                    s.transcript.len() - through as usize,
                    "the summary, then everything from where it ends"
                );
            }
            other => panic!("{other:?}"),
        }

        let mut s = with(conversation(6, 400));
        s.header.status = crate::model::SessionStatus::AwaitingInput;
        start(&mut s);
        let fx = s
            .apply(Input::StreamEnded(Ok(())), ctx(&tools, window))
            .unwrap();
        assert!(fx.is_empty(), "{fx:?}");
        assert_eq!(s.header.last_stop_reason, Some(StopReason::Error));
        assert_eq!(s.header.context.summary_at, None);
        assert!(matches!(
            s.transcript.last().map(|e| e.as_ref()),
            Some(TranscriptEntry::Error { message, .. }) if message.contains("summary was empty")
        ));
    }
}
