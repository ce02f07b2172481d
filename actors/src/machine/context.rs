//! Context management (§15 of the issue on long conversations): keeping a
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
pub const COMPACTION_INSTRUCTIONS: &str = "You are compacting a long conversation so it can go on \
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
