//! Recognising a context overflow in a provider's error, and reading the
//! sizes it states.
//!
//! Servers say "the request does not fit the model's context" in their own
//! words and codes, under various statuses (the test next to each is in
//! `tests/providers.rs`, `overflow_is_recognised_on_every_wire_format`):
//!
//! | server | status | words |
//! |---|---|---|
//! | OpenAI | 400 | code `context_length_exceeded`: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens." / "Input tokens exceed the configured limit of 272000 tokens." |
//! | Anthropic | 400 | `invalid_request_error`: "prompt is too long: 208310 tokens > 200000 maximum" / "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000" |
//! | llama.cpp server | 400 | type `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`: "request (8889 tokens) exceeds the available context size (4096 tokens), try increasing it" (older: "the request exceeds the available context size, try increasing it") |
//! | llama.cpp server (older) | 500, or an error event in the stream | "Context size has been exceeded." |
//! | vLLM | 400 | `BadRequestError`: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion)." / "… your request has 3000 input tokens" |
//! | Ollama | 400 | its llama.cpp runner's error as a JSON string inside `error` (`n_prompt_tokens`, `n_ctx`), or "the prompt is longer than the context length currently available to the model", or "the input length exceeds the context length" |
//! | LiteLLM | 400 | the upstream words, or `ContextWindowExceededError` |
//!
//! This module owns those words and the size extraction only: which status
//! an overflow may come with, and what a session does about one, are
//! `provider`'s and the session machine's. Ollama silently truncates a prompt
//! that is too long unless asked not to, so there an overflow often shows
//! only as a model that forgot the start of the conversation.

use serde_json::Value;

/// Words (lowercase) that say the request does not fit the context.
const NEEDLES: &[&str] = &[
    "context_length_exceeded",
    "contextwindowexceeded",
    "exceed_context_size",
    "maximum context length",
    "context length",
    "context window",
    "context size",
    "exceeds the available context",
    "prompt is too long",
    "input tokens exceed",
    // Anthropic: "input length and `max_tokens` exceed context limit".
    "context limit",
];

/// Whether `text` (an error body, message or code) says the request does
/// not fit the model's context window.
pub(super) fn says_context_overflow(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    NEEDLES.iter().any(|needle| lower.contains(needle))
}

/// The sizes an overflow error states: (the request's tokens, the tokens
/// the context allows), each when stated. Structured fields (llama.cpp's and
/// Ollama's `n_prompt_tokens` and `n_ctx`, also inside a JSON string) win
/// over the numbers in the message.
pub(super) fn overflow_sizes(body: &str) -> (Option<u64>, Option<u64>) {
    let json = serde_json::from_str::<Value>(body).ok();
    let (tokens, limit) = json.as_ref().map(fields).unwrap_or_default();
    let (said_tokens, said_limit) = sizes_in_words(body);
    (tokens.or(said_tokens), limit.or(said_limit))
}

/// `n_prompt_tokens` and `n_ctx` anywhere in `value`, JSON documents held
/// in strings included (Ollama wraps its runner's error that way).
fn fields(value: &Value) -> (Option<u64>, Option<u64>) {
    match value {
        Value::Object(map) => {
            let mut found = (
                map.get("n_prompt_tokens").and_then(Value::as_u64),
                map.get("n_ctx").and_then(Value::as_u64),
            );
            for v in map.values() {
                let (t, l) = fields(v);
                found = (found.0.or(t), found.1.or(l));
            }
            found
        }
        Value::Array(items) => items.iter().fold((None, None), |acc, v| {
            let (t, l) = fields(v);
            (acc.0.or(t), acc.1.or(l))
        }),
        Value::String(s) if s.trim_start().starts_with('{') => serde_json::from_str::<Value>(s)
            .map(|v| fields(&v))
            .unwrap_or_default(),
        _ => (None, None),
    }
}

/// The sizes stated in the servers' words (see the table above).
fn sizes_in_words(text: &str) -> (Option<u64>, Option<u64>) {
    let lower = text.to_ascii_lowercase();
    let t = lower.as_str();
    // Anthropic: "context limit: 197000 + 8192 > 200000".
    if let Some(rest) = after(t, "context limit:") {
        let input = leading_number(rest);
        let output = rest
            .split_once('+')
            .and_then(|(_, r)| leading_number(r.trim_start()));
        let limit = rest
            .split_once('>')
            .and_then(|(_, r)| leading_number(r.trim_start()));
        let tokens = match (input, output) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, _) => a,
        };
        return (tokens, limit);
    }
    // Anthropic: "prompt is too long: 208310 tokens > 200000 maximum".
    if let Some(rest) = after(t, "prompt is too long:") {
        let limit = rest
            .split_once('>')
            .and_then(|(_, r)| leading_number(r.trim_start()));
        return (leading_number(rest), limit);
    }
    let limit = [
        "maximum context length is",
        "configured limit of",
        "available context size (",
        "context window of",
    ]
    .iter()
    .find_map(|p| after(t, p).and_then(leading_number));
    let tokens = [
        "resulted in",
        "you requested",
        "your request has",
        "request (",
    ]
    .iter()
    .find_map(|p| after(t, p).and_then(leading_number));
    (tokens, limit)
}

/// What follows the first `phrase` in `text`, leading spaces skipped.
fn after<'a>(text: &'a str, phrase: &str) -> Option<&'a str> {
    text.find(phrase)
        .map(|i| text[i + phrase.len()..].trim_start())
}

/// The number `text` starts with (digits, `,` and `_` as separators).
fn leading_number(text: &str) -> Option<u64> {
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '_')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_words_are_recognised_with_their_sizes() {
        let cases: &[(&str, Option<u64>, Option<u64>)] = &[
            (
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                Some(9000),
                Some(8192),
            ),
            (
                "Input tokens exceed the configured limit of 272,000 tokens. Your messages resulted in 300000 tokens.",
                Some(300_000),
                Some(272_000),
            ),
            ("prompt is too long: 208310 tokens > 200000 maximum", Some(208_310), Some(200_000)),
            (
                "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens` and try again",
                Some(205_192),
                Some(200_000),
            ),
            (
                "request (8889 tokens) exceeds the available context size (4096 tokens), try increasing it",
                Some(8889),
                Some(4096),
            ),
            ("the request exceeds the available context size, try increasing it", None, None),
            ("Context size has been exceeded.", None, None),
            (
                "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).",
                Some(5000),
                Some(4096),
            ),
            (
                "This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens.",
                Some(3000),
                Some(2048),
            ),
            ("the prompt is longer than the context length currently available to the model", None, None),
            ("the input length exceeds the context length", None, None),
        ];
        for (words, tokens, limit) in cases {
            assert!(says_context_overflow(words), "{words}");
            assert_eq!(overflow_sizes(words), (*tokens, *limit), "{words}");
        }
        for other in [
            "Rate limit reached",
            "invalid api key",
            "model not found",
            "",
        ] {
            assert!(!says_context_overflow(other), "{other}");
        }
    }

    #[test]
    fn structured_sizes_are_read_even_from_a_json_string() {
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert_eq!(overflow_sizes(llama), (Some(5000), Some(4096)));
        let ollama = r#"{"error":"{\"error\":{\"code\":400,\"message\":\"request (8889 tokens) exceeds the available context size (4096 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":8889,\"n_ctx\":4096}}"}"#;
        assert!(says_context_overflow(ollama));
        assert_eq!(overflow_sizes(ollama), (Some(8889), Some(4096)));
    }
}
