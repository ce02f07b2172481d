#![allow(clippy::unwrap_used, clippy::expect_used)]
// A harness, like the tests: a failed step panics and stops the run.

//! Figures for stored tasks, skills and forks (issue 27), measured, never
//! asserted:
//!
//! 1. the tokens of a session's first request with 50 skills available
//!    (listed by name and description only) against the same request with
//!    every body inlined, by the estimate sessions themselves use
//!    (`approx_chars` × 250 tokens per 1,000 characters, before any
//!    calibration by a provider's counts; no tokenizer);
//! 2. the latency of forking a session whose transcript has 10,000 entries
//!    (and 15,000 events) on a real sled directory: at its latest
//!    checkpoint, and at an event in the middle of its history; and of
//!    listing its history.
//!
//! ```text
//! cargo bench --bench library [-- --runs N]
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use overseer::store::{Durability, SledStore};
use overseer_actors::model::{
    AgentConfig, Event, EventKind, FinishReason, SessionHeader, SessionId, SessionStatus,
    StopReason, TranscriptEntry, Usage,
};
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use overseer_actors::skills::{activation_text, Skill, SkillCatalog};
use overseer_actors::store::{Checkpoint, CheckpointStore, MemStore};
use overseer_actors::tasks::TaskCatalog;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::ForkAt;
use overseer_actors::{CreateSession, Library, Overseer, RuntimeConfig};

/// Answers every request at once and keeps the first.
struct FirstRequest(Arc<Mutex<Option<ProviderRequest>>>);

#[async_trait::async_trait]
impl Provider for FirstRequest {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        self.0.lock().unwrap().get_or_insert(request);
        Ok(futures::stream::iter(vec![
            Ok(ProviderEvent::TextDelta("ok".into())),
            Ok(ProviderEvent::Done(FinishReason::Stop)),
        ])
        .boxed())
    }
}

/// Tokens of `chars` characters by the sessions' uncalibrated estimate.
fn tokens(chars: u64) -> u64 {
    chars * 250 / 1000
}

/// 50 skills shaped like real ones: a description of one or two sentences
/// (~150–300 characters), a body of ~2,000–8,000 characters (the format
/// advises keeping a body under ~5,000 tokens; published skills mostly run
/// 1,000–2,000).
fn skills() -> Vec<Skill> {
    (0..50)
        .map(|i| {
            let description = format!(
                "Skill number {i}: does one particular job for the team, step by step. {}",
                "Use it when the request mentions that job or its usual inputs. ".repeat(1 + i % 4)
            );
            let body = format!(
                "# Skill {i}\n\n{}",
                "1. Read the request and the inputs it names; check each against the rules below before acting.\n"
                    .repeat(20 + (i * 37) % 60)
            );
            Skill {
                name: format!("skill-{i}"),
                description,
                body,
                dir: PathBuf::from(format!("/skills/skill-{i}")),
                requires_trust: false,
                front_matter: Default::default(),
            }
        })
        .collect()
}

async fn skills_figures() {
    let skills = skills();
    let names: Vec<String> = skills.iter().map(|s| s.name.clone()).collect();
    let bodies: String = skills
        .iter()
        .map(|s| activation_text(&s.name, &s.body))
        .collect::<Vec<_>>()
        .join("\n\n");
    let library = Library::new(TaskCatalog::default(), SkillCatalog::new(skills).unwrap());
    let mut agent = AgentConfig::new("a", &[]);
    agent.instructions = "You are a helpful assistant for the operations team.".into();
    agent.skills = names;
    let seen = Arc::new(Mutex::new(None));
    let ov = Overseer::start_with(
        vec![agent],
        library,
        Arc::new(MemStore::new()),
        Arc::new(FirstRequest(seen.clone())),
        ToolRegistry::default(),
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("What changed in the deploy pipeline last week?".into()),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let request = loop {
        if let Some(r) = seen.lock().unwrap().clone() {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let listed = request.approx_chars();
    let inlined = listed + bodies.len() as u64;
    println!("first request, 50 skills available (estimate: characters x 250 / 1000):");
    println!(
        "  names and descriptions only: {:>8} chars  {:>7} tokens  (the listing: {} chars)",
        listed,
        tokens(listed),
        request.instructions.len()
    );
    println!(
        "  every body inlined:          {:>8} chars  {:>7} tokens  ({:.1}x)",
        inlined,
        tokens(inlined),
        inlined as f64 / listed as f64
    );
    ov.shutdown().await.unwrap();
}

/// Writes a session of `entries` transcript entries (user and assistant in
/// turn, one turn per pair) as one checkpoint, with the events its turns
/// would have had.
async fn long_session(store: &SledStore, entries: u64) -> SessionId {
    let id = SessionId::generate();
    let agent = AgentConfig::new("a", &[]);
    let now = 1_700_000_000_000;
    let mut header = SessionHeader::new(id, "t".into(), "a".into(), agent.effective(), now);
    let mut transcript = Vec::new();
    let mut events = Vec::new();
    let mut seq = 0;
    let mut ev = |kind: EventKind, events: &mut Vec<Event>| {
        seq += 1;
        events.push(Event {
            session_id: id,
            seq,
            at_ms: now,
            kind,
        });
    };
    ev(EventKind::SessionCreated { agent: "a".into() }, &mut events);
    for turn in 1..=entries / 2 {
        let text = format!("question {turn}: {}", "how does this part work? ".repeat(4));
        transcript.push(TranscriptEntry::User { text, at_ms: now });
        ev(EventKind::TurnStarted { turn: turn as u32 }, &mut events);
        let answer = format!(
            "answer {turn}: {}",
            "it works like this, step by step. ".repeat(6)
        );
        transcript.push(TranscriptEntry::Assistant {
            text: answer.clone(),
            tool_calls: vec![],
            at_ms: now,
            finish_reason: Some(FinishReason::Stop),
        });
        ev(
            EventKind::AssistantMessage {
                step: 1,
                text: answer,
            },
            &mut events,
        );
        ev(
            EventKind::TurnEnded {
                turn: turn as u32,
                stop_reason: StopReason::EndTurn,
                usage: Usage::default(),
                output: None,
            },
            &mut events,
        );
    }
    header.status = SessionStatus::AwaitingInput;
    header.turn = (entries / 2) as u32;
    header.transcript_len = transcript.len() as u64;
    header.last_event_seq = seq;
    header.last_stop_reason = Some(StopReason::EndTurn);
    store
        .checkpoint(Checkpoint {
            header,
            entries: transcript
                .into_iter()
                .enumerate()
                .map(|(i, e)| (i as u64, Arc::new(e)))
                .collect(),
            events: Arc::new(events),
            metadata: None,
            queued: Vec::new(),
            dequeued: 0..0,
        })
        .await
        .unwrap();
    id
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn fork_figures(runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), Durability::Os).unwrap();
    let src = long_session(&store, 10_000).await;
    let ov = Overseer::start(
        vec![AgentConfig::new("a", &[])],
        Arc::new(store.clone()),
        Arc::new(FirstRequest(Arc::default())),
        ToolRegistry::default(),
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    let mid = ov.history(src).await.unwrap()[2_500].seq;
    let mut latest = Vec::new();
    let mut at_mid = Vec::new();
    let mut history = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let f = ov.fork(src, ForkAt::Latest, None).await.unwrap();
        latest.push(t.elapsed());
        assert_eq!(ov.state(f).await.unwrap().transcript.len(), 10_000);
        let t = Instant::now();
        ov.fork(src, ForkAt::Seq(mid), None).await.unwrap();
        at_mid.push(t.elapsed());
        let t = Instant::now();
        let points = ov.history(src).await.unwrap();
        history.push(t.elapsed());
        assert_eq!(points.len(), 5_000);
    }
    println!("fork of a session with 10,000 transcript entries, 15,001 events (sled, durability os, {runs} runs, p50):");
    println!(
        "  at its latest checkpoint:        {:>8.1} ms",
        p50(latest).as_secs_f64() * 1e3
    );
    println!(
        "  at an event mid-history:         {:>8.1} ms",
        p50(at_mid).as_secs_f64() * 1e3
    );
    println!(
        "  GET history (5,000 fork points): {:>8.1} ms",
        p50(history).as_secs_f64() * 1e3
    );
    ov.shutdown().await.unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        skills_figures().await;
        fork_figures(runs).await;
    });
}
