//! The context windows of well-known model ids, for routes that do not
//! configure `context_window`.
//!
//! This module owns the table only. Windows are the providers' published
//! figures (OpenAI: platform.openai.com/docs/models; Anthropic:
//! docs.anthropic.com/en/docs/about-claude/models), in tokens, as of this
//! writing:
//!
//! | model id prefix                              | window    |
//! |----------------------------------------------|-----------|
//! | `gpt-5`                                      | 400,000   |
//! | `gpt-4.1`                                    | 1,047,576 |
//! | `gpt-4o`, `chatgpt-4o`, `gpt-4-turbo`        | 128,000   |
//! | `gpt-4-32k`                                  | 32,768    |
//! | `gpt-4` (other)                              | 8,192     |
//! | `gpt-3.5-turbo`                              | 16,385    |
//! | `o1-mini`, `o1-preview`                      | 128,000   |
//! | `o1`, `o3`, `o4-mini`                        | 200,000   |
//! | `claude-2.0`, `claude-instant`               | 100,000   |
//! | `claude-` (Claude 2.1, 3, 3.5, 3.7, 4, 4.x)  | 200,000   |
//!
//! A prefix matches the id itself or the id after a router's `vendor/`
//! prefix (`openai/gpt-4o` on OpenRouter or LiteLLM). Where a family has
//! members of different sizes the smaller figure is used (a smaller window
//! only compacts earlier). Open-weight models are deliberately absent: the
//! window a server such as Ollama or llama.cpp serves is its own setting
//! (`num_ctx`, `--ctx-size`), not the model's, so such a route should set
//! `context_window` itself.

/// `(id prefix, window)`, most specific first: the first match wins.
const KNOWN: &[(&str, u64)] = &[
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1-mini", 128_000),
    ("o1-preview", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-2.0", 100_000),
    ("claude-instant", 100_000),
    ("claude-", 200_000),
];

/// The published context window of model id `model`, if it is a
/// well-known one (see the table above).
pub fn known_context_window(model: &str) -> Option<u64> {
    let id = model.rsplit('/').next().unwrap_or(model).trim();
    KNOWN
        .iter()
        .find(|(prefix, _)| id.starts_with(prefix))
        .map(|(_, window)| *window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_ids_have_their_windows_and_others_none() {
        assert_eq!(known_context_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(known_context_window("gpt-4.1-nano"), Some(1_047_576));
        assert_eq!(known_context_window("gpt-4"), Some(8_192));
        assert_eq!(known_context_window("o3-mini"), Some(200_000));
        assert_eq!(known_context_window("o1-mini"), Some(128_000));
        assert_eq!(known_context_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known_context_window("openai/gpt-4o"), Some(128_000));
        assert_eq!(known_context_window("llama3.2"), None);
        assert_eq!(known_context_window(""), None);
    }
}
