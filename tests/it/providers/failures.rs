//! Issue 32, providers: `retry-after` on 5xx as on 429 and its cap, a
//! stream that ends before any output, context overflows in every server's
//! words and on a session's first request, the 401 of a route that sends
//! no key, failures kept out of what the model is sent, and usage that
//! counts every request. Each against a real HTTP server on loopback.

use super::*;
use overseer_actors::model::SessionStatus;

/// A JSON error body in OpenAI's shape.
fn oa_error(message: &str, kind: &str) -> String {
    json!({"error": {"message": message, "type": kind}}).to_string()
}

#[tokio::test]
async fn retry_after_is_honoured_on_a_503_as_on_a_429() {
    let run = |kind: ProviderKind| async move {
        let server = TestServer::start(move |n, _| match n {
            0 => Reply::Status(
                503,
                vec![("retry-after", "1")],
                oa_error("The engine is currently overloaded", "server_error"),
            ),
            _ if kind == ProviderKind::Openai => oa_text_reply(&["after ", "the wait"]),
            _ => an_text_reply(&["after ", "the wait"]),
        })
        .await;
        // Millisecond backoff: only the header can make the retry wait 1 s.
        let provider =
            RetryingProvider::new(raw(kind, endpoint(kind, &server)), None, fast_policy());
        let (items, spent) = split_usage(collect(&provider, hello()).await);
        assert_eq!(text_of(&items), "after the wait", "{kind}: {items:?}");
        assert_eq!(server.count(), 2, "{kind}");
        assert_eq!(spent.provider_requests, 1, "{kind}: the 503 counts");
        // The server's own clock: the retry came no sooner than it asked.
        let gap = server.request(1).at - server.request(0).at;
        assert!(
            gap >= Duration::from_secs(1),
            "{kind}: retried after {gap:?}"
        );
    };
    futures::join!(run(ProviderKind::Openai), run(ProviderKind::Anthropic));
}

#[tokio::test]
async fn a_retry_after_past_the_cap_fails_the_turn_saying_so() {
    // Through a session: the turn ends in error at once, and says why.
    let server = TestServer::start(|_, _| {
        Reply::Status(
            503,
            vec![("retry-after", "120")],
            oa_error("Service Unavailable", "server_error"),
        )
    })
    .await;
    let ov = launcher_overseer(built(&route(ProviderKind::Openai, &server))).await;
    let (stop, transcript) = first_turn(&ov, "Hello").await;
    assert_eq!(stop, StopReason::Error);
    let Some(TranscriptEntry::Error { message, .. }) = transcript.last() else {
        panic!("{transcript:#?}")
    };
    assert!(
        message.contains("server error 503")
            && message.contains(
                "the server asked to retry after 120 s, more than the 60 s max_retry_after_secs allows"
            ),
        "{message}"
    );
    assert_eq!(server.count(), 1, "not retried");
    ov.shutdown().await.unwrap();

    // The cap is the route's setting, and a 429 obeys it too.
    let server = TestServer::start(|_, _| {
        Reply::Status(
            429,
            vec![("retry-after", "5")],
            oa_error("Rate limit reached", "rate_limit_error"),
        )
    })
    .await;
    let mut capped = route(ProviderKind::Anthropic, &server);
    capped.max_retry_after_secs = 2;
    let items = collect(built(&capped).as_ref(), hello()).await;
    assert!(
        matches!(items.as_slice(), [Err(ProviderError::RateLimited { message, .. })]
            if message.contains("retry after 5 s, more than the 2 s max_retry_after_secs")),
        "{items:?}"
    );
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn a_stream_that_ends_before_any_output_is_retried_like_a_disconnect() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |n, _| match (kind, n) {
            // An empty body, then a body that only opened the message.
            (_, 0) => sse(vec![]),
            (ProviderKind::Openai, 1) => sse(vec![oa_role()]),
            (_, 1) => sse(vec![an_start(5), an_ping()]),
            (ProviderKind::Openai, _) => oa_text_reply(&["at last"]),
            _ => an_text_reply(&["at last"]),
        })
        .await;
        let provider =
            RetryingProvider::new(raw(kind, endpoint(kind, &server)), None, fast_policy());
        let (items, spent) = split_usage(collect(&provider, hello()).await);
        assert_eq!(text_of(&items), "at last", "{kind}: {items:?}");
        assert!(
            matches!(
                items.last(),
                Some(Ok(ProviderEvent::Done(FinishReason::Stop)))
            ),
            "{kind}: {items:?}"
        );
        assert_eq!(server.count(), 3, "{kind}");
        assert_eq!(
            spent.provider_requests, 2,
            "{kind}: both cut attempts count"
        );
    }
}

#[tokio::test]
async fn overflow_is_recognised_on_every_wire_format() {
    /// (server, status, body, the tokens and the limit it states).
    type Case = (&'static str, u16, Value, Option<u64>, Option<u64>);
    let cases: Vec<Case> = vec![
        (
            "openai",
            400,
            json!({"error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"
            }}),
            Some(9000),
            Some(8192),
        ),
        (
            "llama.cpp",
            400,
            json!({"error": {
                "code": 400,
                "message": "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096
            }}),
            Some(5000),
            Some(4096),
        ),
        (
            "llama.cpp, older",
            400,
            json!({"error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "invalid_request_error"
            }}),
            None,
            None,
        ),
        (
            "llama.cpp, older still",
            500,
            json!({"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}),
            None,
            None,
        ),
        (
            "vllm",
            400,
            json!({
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError", "param": null, "code": 400
            }),
            Some(5000),
            Some(4096),
        ),
        (
            "ollama",
            400,
            json!({"error": "{\"error\":{\"code\":400,\"message\":\"request (8889 tokens) exceeds the available context size (4096 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":8889,\"n_ctx\":4096}}"}),
            Some(8889),
            Some(4096),
        ),
        (
            "ollama, shift off",
            400,
            json!({"error": {"message": "the prompt is longer than the context length currently available to the model", "type": "invalid_request_error", "param": null, "code": null}}),
            None,
            None,
        ),
    ];
    for (server_name, status, body, tokens, limit) in cases {
        let text = body.to_string();
        let server =
            TestServer::start(move |_, _| Reply::Status(status, vec![], text.clone())).await;
        let items = collect(
            built(&route(ProviderKind::Openai, &server)).as_ref(),
            hello(),
        )
        .await;
        match items.as_slice() {
            [Err(ProviderError::ContextOverflow {
                tokens: t,
                limit: l,
                ..
            })] => assert_eq!((*t, *l), (tokens, limit), "{server_name}"),
            other => panic!("{server_name}: {other:?}"),
        }
        assert_eq!(server.count(), 1, "{server_name}: not retried");
    }

    // Anthropic's words, on its own wire format.
    let anthropic: Vec<(Value, Option<u64>, Option<u64>)> = vec![
        (
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "prompt is too long: 208327 tokens > 200000 maximum"}}),
            Some(208_327),
            Some(200_000),
        ),
        (
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"}}),
            Some(209_573),
            Some(200_000),
        ),
    ];
    for (body, tokens, limit) in anthropic {
        let text = body.to_string();
        let server = TestServer::start(move |_, _| Reply::Status(400, vec![], text.clone())).await;
        let items = collect(
            built(&route(ProviderKind::Anthropic, &server)).as_ref(),
            hello(),
        )
        .await;
        assert!(
            matches!(items.as_slice(), [Err(ProviderError::ContextOverflow { tokens: t, limit: l, .. })]
                if (*t, *l) == (tokens, limit)),
            "{body}: {items:?}"
        );
    }

    // Inside a stream: llama.cpp's error event, and Anthropic's.
    let oa = TestServer::start(|_, _| {
        sse(vec![
            "data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}}\n\n".into(),
        ])
    })
    .await;
    let an = TestServer::start(|_, _| {
        sse(vec![
            an_start(3),
            an(
                "error",
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 300000 tokens > 200000 maximum"}}),
            ),
        ])
    })
    .await;
    for (kind, server) in [(ProviderKind::Openai, &oa), (ProviderKind::Anthropic, &an)] {
        let (items, _) = split_usage(collect(built(&route(kind, server)).as_ref(), hello()).await);
        assert!(
            matches!(
                items.as_slice(),
                [Err(ProviderError::ContextOverflow { .. })]
            ),
            "{kind}: {items:?}"
        );
        assert_eq!(server.count(), 1, "{kind}: not retried");
    }
}

#[tokio::test]
async fn a_first_request_overflow_ends_the_turn_with_context_overflow_and_the_sizes() {
    let server = TestServer::start(|_, _| {
        Reply::Status(
            400,
            vec![],
            json!({"error": {
                "code": 400,
                "message": "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096
            }})
            .to_string(),
        )
    })
    .await;
    let ov = launcher_overseer(built(&route(ProviderKind::Openai, &server))).await;
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("A question far too long for this model".into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let EventKind::Error { message } =
        until(&mut rx, |k| matches!(k, EventKind::Error { .. })).await
    else {
        unreachable!()
    };
    assert!(
        message.contains("about 5000 tokens (counted by the provider)")
            && message.contains("the model's context window allows 4096"),
        "{message}"
    );
    let ended = until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await;
    assert!(
        matches!(
            ended,
            EventKind::TurnEnded {
                stop_reason: StopReason::ContextOverflow,
                ..
            }
        ),
        "{ended:?}"
    );
    let state = ov.state(id).await.unwrap();
    assert_eq!(state.header.status, SessionStatus::AwaitingInput);
    assert!(matches!(
        state.transcript.last().map(|e| e.as_ref()),
        Some(TranscriptEntry::Error {
            estimated_tokens: Some(5000),
            context_window: Some(4096),
            ..
        })
    ));
    // Nothing before the question to compact: no summary was asked for.
    assert_eq!(server.count(), 1);
    ov.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_401_from_a_route_that_sends_no_key_names_the_flag() {
    let server = TestServer::start(|_, _| {
        Reply::Status(
            401,
            vec![],
            oa_error("Incorrect API key provided", "invalid_request_error"),
        )
    })
    .await;
    // A base_url and no api_key_env: no key, by design, even if
    // OPENAI_API_KEY is set.
    let env = FakeEnv::default();
    env.set("OPENAI_API_KEY", "sk-not-for-this-route");
    let items = collect(
        built_with(&route(ProviderKind::Openai, &server), &env).as_ref(),
        hello(),
    )
    .await;
    assert!(
        matches!(items.as_slice(), [Err(ProviderError::Auth(m))]
            if m.contains("no API key was sent") && m.contains("--api-key-env")),
        "{items:?}"
    );
    assert!(server.request(0).headers.get("authorization").is_none());
    assert_eq!(server.count(), 1, "nothing to re-read: not retried");
}

#[tokio::test]
async fn routes_have_a_default_output_limit_that_can_be_overridden() {
    let server = TestServer::start(|_, _| oa_text_reply(&["ok"])).await;
    let mut r = route(ProviderKind::Openai, &server);
    let limit = |r: &RouteConfig| {
        let server = &server;
        let provider = built(r);
        async move {
            let before = server.count();
            collect(provider.as_ref(), hello()).await;
            server.request(before).body["max_tokens"].clone()
        }
    };
    assert_eq!(limit(&r).await, json!(4096), "the default");
    r.context_window = Some(2048);
    assert_eq!(limit(&r).await, json!(1024), "at most half a known window");
    r.max_tokens = Some(77);
    assert_eq!(limit(&r).await, json!(77), "the route's own");
}

/// A provider failure is recorded beside the partial text, and the next
/// request carries the partial text but never the failure.
#[tokio::test]
async fn a_provider_failure_never_appears_in_a_later_requests_messages() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = BreakingServer::start(move |n| match (kind, n) {
            (ProviderKind::Openai, 0) => (
                vec![oa_role(), oa_text("Partial "), oa_text("answer")],
                true,
            ),
            (_, 0) => (
                vec![an_start(3), an_text_start(0), an_text(0, "Partial answer")],
                true,
            ),
            _ => (text_answer(kind, &["Picked up."]), false),
        })
        .await;
        let ov = launcher_overseer(built(&server.route(kind))).await;
        let id = SessionId::generate();
        let mut rx = ov.subscribe(id);
        ov.create_session(CreateSession {
            agent: "a".into(),
            tenant: "t".into(),
            prompt: Some("Say something".into()),
            id: Some(id),
            ..CreateSession::default()
        })
        .await
        .unwrap();
        let EventKind::Error { message } =
            until(&mut rx, |k| matches!(k, EventKind::Error { .. })).await
        else {
            unreachable!()
        };
        assert!(message.contains("the stream broke"), "{kind}: {message}");
        until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await;
        ov.send_message(id, "Go on").await.unwrap();
        let ended = until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await;
        assert!(
            matches!(
                ended,
                EventKind::TurnEnded {
                    stop_reason: StopReason::EndTurn,
                    ..
                }
            ),
            "{kind}: {ended:?}"
        );
        let bodies = server.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 2, "{kind}");
        let messages = &bodies[1]["messages"];
        let sent = messages.to_string();
        assert!(sent.contains("Partial answer"), "{kind}: {sent}");
        for word in ["broke", "error", "Error"] {
            assert!(!sent.contains(word), "{kind}: '{word}' was sent: {sent}");
        }
        let roles: Vec<&str> = messages
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user"], "{kind}");
        ov.shutdown().await.unwrap();
    }
}

/// An interrupted request is a request made: it counts, with the tokens
/// the provider reported (Anthropic's prompt, in `message_start`) or
/// streamed (estimated from the text that came).
#[tokio::test]
async fn usage_after_an_interrupt_counts_the_request() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |_, _| {
            let parts = match kind {
                ProviderKind::Openai => vec![oa_role(), oa_text(&"Thinking hard ".repeat(20))],
                _ => vec![
                    an_start(25),
                    an_text_start(0),
                    an_text(0, &"Thinking hard ".repeat(20)),
                ],
            };
            Reply::Sse(parts.into_iter().map(Part::Bytes).collect(), End::Stall)
        })
        .await;
        let ov = launcher_overseer(built(&route(kind, &server))).await;
        let id = SessionId::generate();
        let mut rx = ov.subscribe(id);
        ov.create_session(CreateSession {
            agent: "a".into(),
            tenant: "t".into(),
            prompt: Some("Think".into()),
            id: Some(id),
            ..CreateSession::default()
        })
        .await
        .unwrap();
        // Once text has streamed, the turn is stopped.
        tokio::time::timeout(Duration::from_secs(20), async {
            while !matches!(rx.recv().await, Ok(Notification::TextDelta { .. })) {}
        })
        .await
        .expect("no text streamed");
        ov.interrupt(id).await.unwrap();
        let usage = ov.state(id).await.unwrap().header.usage;
        assert_eq!(usage.provider_requests, 1, "{kind}: {usage:?}");
        // 280 characters streamed, at 250 tokens per 1,000 before any
        // calibration.
        assert_eq!(usage.output_tokens, 70, "{kind}: {usage:?}");
        match kind {
            ProviderKind::Anthropic => assert_eq!(usage.input_tokens, 25, "reported"),
            _ => assert!(usage.input_tokens > 0, "estimated: {usage:?}"),
        }
        assert_eq!(server.count(), 1);
        ov.shutdown().await.unwrap();
    }
}
