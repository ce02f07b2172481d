//! Text on its way to a terminal: escaping and writing.
//!
//! Everything the CLI prints that it did not write itself (titles, agent and
//! tool names, a model's text, tool arguments and results, error messages
//! echoed from a server) goes through the one rendering rule of
//! [`crate::render`]: an escape sequence in a session title would clear the
//! screen, retitle the window or rewrite earlier output, and a
//! right-to-left override or a zero-width space would show an approver
//! something other than what runs. Hidden characters appear as
//! `⟨U+202E⟩`, and the rule's warnings are printed beside the text. This
//! module deliberately does not decide what a command prints, only how it
//! reaches the terminal.

use std::borrow::Cow;
use std::io::Write;

use serde_json::{Map, Value};

use crate::render::{self, Lines, Warning};

/// `text` for a single line (a table cell, a status line): every hidden
/// character escaped, newlines and tabs included.
pub(crate) fn inline(text: &str) -> Cow<'_, str> {
    render::display(text, Lines::One)
}

/// `text` that may span lines (a model's answer): newlines and tabs kept,
/// every other hidden character escaped.
pub(crate) fn multiline(text: &str) -> Cow<'_, str> {
    render::display(text, Lines::Many)
}

/// `value` as pretty JSON for programs that read the output (`sessions
/// show`): it parses back to exactly `value`, and the rule's hidden
/// characters are JSON escapes (`\u202e`), never raw.
pub(crate) fn json(value: &Value) -> String {
    render::escaped_json(value)
}

/// `value` as pretty JSON for a person (an approval prompt): exactly what
/// a tool receives, hidden characters shown as `⟨U+202E⟩`. One string per
/// line.
pub(crate) fn shown_json(value: &Value) -> Vec<String> {
    render::display_json(value)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One line per warning: `warning: /arguments/attachment: contains …`.
pub(crate) fn warning_lines(warnings: &[Warning]) -> Vec<String> {
    warnings
        .iter()
        .map(|w| format!("warning: {}", w.line()))
        .collect()
}

/// What an edit changes, one line per changed key: `key: old → new`
/// (`diff` as the session records it: `{key: {from, to}}`), values as
/// compact JSON, every line shown through the rule.
pub(crate) fn diff_lines(diff: &Map<String, Value>) -> Vec<String> {
    diff.iter()
        .map(|(key, change)| {
            let side = |v: Option<&Value>| v.map_or_else(|| "null".to_owned(), Value::to_string);
            format!(
                "  {}: {} → {}",
                inline(key),
                inline(&side(change.get("from"))),
                inline(&side(change.get("to")))
            )
        })
        .collect()
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
    use serde_json::json;

    #[test]
    fn escapes_every_hidden_character() {
        assert_eq!(inline("plain title"), "plain title");
        assert!(matches!(inline("plain"), Cow::Borrowed(_)));
        assert_eq!(inline("a\u{1b}[2Jb"), "a⟨U+001B⟩[2Jb");
        assert_eq!(inline("x\ny\tz\r"), "x⟨U+000A⟩y⟨U+0009⟩z⟨U+000D⟩");
        assert_eq!(inline("\u{7f}\u{9b}31m"), "⟨U+007F⟩⟨U+009B⟩31m");
        assert_eq!(inline("abc\u{202e}fed\u{200b}"), "abc⟨U+202E⟩fed⟨U+200B⟩");
        assert_eq!(multiline("line 1\nline\t2\u{7}"), "line 1\nline\t2⟨U+0007⟩");
    }

    #[test]
    fn json_output_stays_json_and_safe() {
        let v = json!({"title": "a\u{1b}[2J\u{9b}\u{202e}b\u{200b}", "n": 1});
        let text = json(&v);
        assert!(
            !text.chars().any(|c| render::is_hidden(c) && c != '\n'),
            "{text}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn an_edit_is_shown_as_its_changed_keys() {
        let diff = json!({"attachment": {"from": "invoice_\u{202e}fdp.exe", "to": "invoice.pdf"},
            "new\u{200b}": {"from": null, "to": 1}});
        let lines = diff_lines(diff.as_object().unwrap());
        assert_eq!(
            lines,
            vec![
                "  attachment: \"invoice_⟨U+202E⟩fdp.exe\" → \"invoice.pdf\"",
                "  new⟨U+200B⟩: null → 1"
            ]
        );
    }
}
