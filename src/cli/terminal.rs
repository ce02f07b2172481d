//! Text on its way to a terminal: escaping and writing.
//!
//! Everything the CLI prints that it did not write itself (titles, agent and
//! tool names, a model's text, tool results, error messages echoed from a
//! server) may contain control characters: an escape sequence in a session
//! title would clear the screen, retitle the window or rewrite earlier
//! output. This module owns the one rule: every control character (C0, DEL,
//! C1) and every bidirectional override is shown escaped, Rust-style
//! (`\u{1b}`, `\n`), never sent raw. It deliberately does not decide what a
//! command prints, only how it reaches the terminal.

use std::borrow::Cow;
use std::io::Write;

use serde_json::Value;

use crate::auth::is_unsafe_char;

/// `text` for a single line (a table cell, a status line): every unsafe
/// character escaped, newlines and tabs included.
pub(crate) fn inline(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// `text` that may span lines (a model's answer): newlines and tabs kept,
/// every other unsafe character escaped.
pub(crate) fn multiline(text: &str) -> Cow<'_, str> {
    escape(text, |c| c == '\n' || c == '\t')
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe_char(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe_char(c) && !keep(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as pretty JSON that is safe on a terminal. serde_json escapes C0
/// controls inside strings but not DEL, C1 controls or bidi overrides;
/// those can only occur inside strings, where `\uXXXX` is their JSON escape.
pub(crate) fn json(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    if !text.chars().any(|c| is_unsafe_char(c) && c != '\n') {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe_char(c) && c != '\n' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `line` and a newline to stdout. Unlike `println!`, a closed stdout
/// (`overseer … | head -0`) is an error to report, not a panic.
pub(crate) fn print_line(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_control_and_bidi_character() {
        assert_eq!(inline("plain title"), "plain title");
        assert!(matches!(inline("plain"), Cow::Borrowed(_)));
        assert_eq!(inline("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(inline("x\ny\tz\r"), "x\\ny\\tz\\r");
        assert_eq!(inline("\u{7f}\u{9b}31m"), "\\u{7f}\\u{9b}31m");
        assert_eq!(inline("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(multiline("line 1\nline\t2\u{7}"), "line 1\nline\t2\\u{7}");
    }

    #[test]
    fn json_output_stays_json_and_safe() {
        let v = serde_json::json!({"title": "a\u{1b}[2J\u{9b}\u{202e}b", "n": 1});
        let text = json(&v);
        assert!(
            !text.chars().any(|c| is_unsafe_char(c) && c != '\n'),
            "{text}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
