//! The one rule by which untrusted text is shown to a person: model output,
//! tool names, arguments and results, titles, metadata, error messages that
//! quote them.
//!
//! What a person approves must be what runs, so text that could look like
//! something else is made visible:
//!
//! - **Hidden characters** are shown as escapes such as `⟨U+202E⟩`: the
//!   characters that change direction (Unicode `Bidi_Control`: U+061C,
//!   U+200E–200F, U+202A–202E, U+2066–2069), the format characters (general
//!   category Cf: zero-width space and joiners, the BOM, tag characters…),
//!   the controls (Cc) and the line and paragraph separators (Zl, Zp). A
//!   newline and a tab stay as they are where the surface shows several
//!   lines ([`Lines::Many`]), and are escaped in a single line
//!   ([`Lines::One`]: a table cell, a title).
//! - **Warnings** ([`Warning`]) name what was found and where: a
//!   `hidden_characters` warning for text holding any of the above (a
//!   newline or a tab alone is not one), and a `mixed_script` warning for a
//!   word whose letters belong to no single script (UTS 39's resolved
//!   script set, e.g. a Cyrillic `а` inside a Latin word). A word is a run
//!   of letters, marks, digits and connectors (`_`); a run is split where
//!   it passes between a CJK script (Han, Hiragana, Katakana, Hangul,
//!   Bopomofo) and another, because those are written without spaces next
//!   to Latin words (`使用Python编程` is three words, none mixed).
//!
//! The character classes come from maintained crates, not from a table
//! written here: `Bidi_Control` and the general categories from
//! `icu_properties` (ICU4X, the Unicode Consortium's own library, the same
//! data pipeline as the ICU tables behind JavaScript's `\p{…}` escapes the
//! page uses), script sets from `unicode-security` (UTS 39 mixed-script
//! detection, the crate rustc's own confusable-identifier lints use).
//!
//! The page implements the same rule in JavaScript (`http/ui/render.js`);
//! `render/cases.json` holds the cases both must pass (this module's tests
//! and `tests/render.rs` run each side against it).
//!
//! This module deliberately changes nothing that is stored, sent to a model
//! or to a tool: the rule is for display only. The API keeps raw data raw
//! (JSON is not a display) and adds the warnings beside it.

use std::borrow::Cow;
use std::fmt::Write as _;

use icu_properties::props::{BidiControl, GeneralCategory, GeneralCategoryGroup};
use icu_properties::{CodePointMapData, CodePointSetData};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use unicode_security::mixed_script::AugmentedScriptSet;

/// Whether the surface shows several lines of the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// One line (a table cell, a title, a prompt): newlines and tabs are
    /// escaped too.
    One,
    /// Several lines (a model's answer, pretty JSON): newlines and tabs stay.
    Many,
}

/// Whether `c` is hidden or changes direction: `Bidi_Control`, Cf, Cc, Zl
/// or Zp.
pub fn is_hidden(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    let gc = CodePointMapData::<GeneralCategory>::new().get(c);
    CodePointSetData::new::<BidiControl>().contains(c)
        || matches!(
            gc,
            GeneralCategory::Format
                | GeneralCategory::Control
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        )
}

/// Whether `c` is shown escaped on a surface of `lines`.
fn is_escaped(c: char, lines: Lines) -> bool {
    is_hidden(c) && !(lines == Lines::Many && (c == '\n' || c == '\t'))
}

/// Whether `c` makes a text worth a `hidden_characters` warning: a newline
/// or a tab is visible wherever it matters (escaped in one line).
fn is_suspect(c: char) -> bool {
    c != '\n' && c != '\t' && is_hidden(c)
}

/// `U+202E`: how warnings name a character.
pub fn code_point(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// `text` as a person is shown it: every hidden character as `⟨U+XXXX⟩`.
pub fn display(text: &str, lines: Lines) -> Cow<'_, str> {
    if !text.chars().any(|c| is_escaped(c, lines)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_escaped(c, lines) {
            let _ = write!(out, "⟨{}⟩", code_point(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as pretty JSON (two-space indent, keys in their order) shown
/// through the rule: what a tool will receive, with every hidden character
/// visible. Hidden characters only occur inside strings (serde_json writes
/// the C0 controls as JSON escapes already).
pub fn display_json(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    display(&text, Lines::Many).into_owned()
}

/// `value` as pretty JSON that parses back to exactly `value`, with every
/// hidden character written as a JSON `\uXXXX` escape: for output that
/// programs read as JSON (`overseer sessions show`) and for text a person
/// edits and sends back.
pub fn escaped_json(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    if !text.chars().any(|c| c != '\n' && is_hidden(c)) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c != '\n' && is_hidden(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What a warning is about. Codes are stable: clients may key on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// Hidden or direction-changing characters (`chars` lists them).
    HiddenCharacters,
    /// A word that mixes scripts (`words` lists them).
    MixedScript,
}

/// One finding of the rule, in the API and on every surface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Warning {
    /// What was found.
    pub code: WarningCode,
    /// Where: a JSON Pointer (RFC 6901) into the object that carries the
    /// warning, e.g. `/title` or `/arguments/attachment` (a key with
    /// hidden characters is reported at its member's pointer).
    pub field: String,
    /// A sentence for a person, without the field.
    pub message: String,
    /// For `hidden_characters`: the characters found (`U+202E`), distinct,
    /// in order of appearance, at most [`MAX_LISTED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chars: Vec<String>,
    /// For `mixed_script`: the words found, distinct, in order, at most
    /// [`MAX_LISTED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub words: Vec<String>,
}

/// Most characters or words a warning lists (a long text may hold many).
pub const MAX_LISTED: usize = 8;

impl Warning {
    fn new(code: WarningCode, field: &str) -> Self {
        Self {
            code,
            field: field.to_owned(),
            message: String::new(),
            chars: Vec::new(),
            words: Vec::new(),
        }
    }

    fn add(list: &mut Vec<String>, item: String) {
        if list.len() < MAX_LISTED && !list.contains(&item) {
            list.push(item);
        }
    }

    fn finish(mut self) -> Self {
        self.message = match self.code {
            WarningCode::HiddenCharacters => format!(
                "contains hidden or direction-changing characters: {}",
                self.chars.join(", ")
            ),
            WarningCode::MixedScript => {
                format!("mixes scripts within a word: {}", self.words.join(", "))
            }
        };
        self
    }

    /// `field: message`, the line a surface shows.
    pub fn line(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// Collects the warnings of the fields of one object, one warning per
/// (field, code).
#[derive(Debug, Default)]
pub struct Warnings {
    found: Vec<Warning>,
}

impl Warnings {
    /// No warnings yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn entry(&mut self, code: WarningCode, field: &str) -> &mut Warning {
        let at = match self
            .found
            .iter()
            .position(|w| w.code == code && w.field == field)
        {
            Some(at) => at,
            None => {
                self.found.push(Warning::new(code, field));
                self.found.len() - 1
            }
        };
        &mut self.found[at]
    }

    /// Checks `text`, found at `field`.
    pub fn text(&mut self, field: &str, text: &str) -> &mut Self {
        // Printable ASCII has no hidden character and only Latin letters.
        if text
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) || b == b'\n' || b == b'\t')
        {
            return self;
        }
        for c in text.chars().filter(|c| is_suspect(*c)) {
            let w = self.entry(WarningCode::HiddenCharacters, field);
            Warning::add(&mut w.chars, code_point(c));
        }
        for word in mixed_script_words(text) {
            let w = self.entry(WarningCode::MixedScript, field);
            Warning::add(&mut w.words, word.to_owned());
        }
        self
    }

    /// Checks every key and string of `value`, found at `field`; each is
    /// reported at its own pointer below `field`.
    pub fn json(&mut self, field: &str, value: &Value) -> &mut Self {
        match value {
            Value::String(s) => {
                self.text(field, s);
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.json(&format!("{field}/{i}"), item);
                }
            }
            Value::Object(members) => {
                for (key, item) in members {
                    let at = format!("{field}/{}", key.replace('~', "~0").replace('/', "~1"));
                    self.text(&at, key);
                    self.json(&at, item);
                }
            }
            _ => {}
        }
        self
    }

    /// The warnings found, in the order their fields were checked.
    pub fn finish(self) -> Vec<Warning> {
        self.found.into_iter().map(Warning::finish).collect()
    }
}

/// The warnings of a tool call as a person is asked about it: its tool
/// name (`/name`) and its arguments (`/arguments/…`).
pub fn call_warnings(name: &str, arguments: &Value) -> Vec<Warning> {
    let mut w = Warnings::new();
    w.text("/name", name).json("/arguments", arguments);
    w.finish()
}

/// Whether `c` belongs to a word: a letter, a mark, a digit or a connector.
fn is_word_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    let gc = CodePointMapData::<GeneralCategory>::new().get(c);
    GeneralCategoryGroup::Letter.contains(gc)
        || GeneralCategoryGroup::Mark.contains(gc)
        || GeneralCategoryGroup::Number.contains(gc)
        || gc == GeneralCategory::ConnectorPunctuation
}

/// Whether a character of this (not all-script) set is written in a CJK
/// script: UTS 39 augments Han, Hiragana, Katakana, Hangul and Bopomofo
/// with the writing systems Hanb, Jpan and Kore.
fn is_cjk(set: &AugmentedScriptSet) -> bool {
    set.hanb || set.jpan || set.kore
}

/// The words of `text` that are not single-script.
fn mixed_script_words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut set = AugmentedScriptSet::default();
    let mut cjk: Option<bool> = None;
    let mut flush = |start: &mut Option<usize>, end: usize, set: &mut AugmentedScriptSet| {
        if let Some(s) = start.take() {
            if set.is_empty() {
                out.push(&text[s..end]);
            }
        }
        *set = AugmentedScriptSet::default();
    };
    for (i, c) in text.char_indices() {
        if !is_word_char(c) {
            flush(&mut start, i, &mut set);
            cjk = None;
            continue;
        }
        let this = AugmentedScriptSet::for_char(c);
        if !this.is_all() {
            let this_cjk = is_cjk(&this);
            if cjk.is_some_and(|prev| prev != this_cjk) {
                flush(&mut start, i, &mut set);
            }
            cjk = Some(this_cjk);
        }
        start.get_or_insert(i);
        set.intersect_with(this);
    }
    flush(&mut start, text.len(), &mut set);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The cases the page's `render.js` must pass too (`tests/render.rs`).
    const CASES: &str = include_str!("render/cases.json");

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Case {
        name: String,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        json: Option<Value>,
        #[serde(default)]
        multiline: bool,
        display: String,
        warnings: Vec<Warning>,
    }

    #[test]
    fn the_shared_fixture_cases_hold() {
        let cases: Vec<Case> = serde_json::from_str(CASES).unwrap();
        assert!(cases.len() >= 15, "the fixture lost its cases");
        for case in cases {
            let (shown, warnings) = match (&case.text, &case.json) {
                (Some(text), None) => {
                    let lines = if case.multiline {
                        Lines::Many
                    } else {
                        Lines::One
                    };
                    let mut w = Warnings::new();
                    w.text("", text);
                    (display(text, lines).into_owned(), w.finish())
                }
                (None, Some(value)) => {
                    let mut w = Warnings::new();
                    w.json("", value);
                    (display_json(value), w.finish())
                }
                _ => panic!("{}: a case has either text or json", case.name),
            };
            assert_eq!(shown, case.display, "display of {}", case.name);
            assert_eq!(warnings, case.warnings, "warnings of {}", case.name);
        }
    }

    #[test]
    fn the_classes_are_the_unicode_properties() {
        for c in ['\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202E}'] {
            assert!(is_hidden(c), "Bidi_Control {c:?}");
        }
        for c in '\u{2066}'..='\u{2069}' {
            assert!(is_hidden(c), "isolate {c:?}");
        }
        for c in [
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{E0041}',
        ] {
            assert!(is_hidden(c), "Cf {c:?}");
        }
        for c in [
            '\u{0}', '\u{1b}', '\u{7f}', '\u{85}', '\u{9b}', '\u{2028}', '\u{2029}',
        ] {
            assert!(is_hidden(c), "Cc/Zl/Zp {c:?}");
        }
        for c in [
            'a', ' ', '\u{a0}', 'é', '中', 'ب', '😀', '\u{0301}', '\u{FE0F}',
        ] {
            assert!(!is_hidden(c), "{c:?} is visible");
        }
    }

    #[test]
    fn display_is_idempotent_and_borrows_clean_text() {
        assert!(matches!(display("plain", Lines::One), Cow::Borrowed(_)));
        let once = display("a\u{202e}b\u{200b}\n", Lines::One).into_owned();
        assert_eq!(once, "a⟨U+202E⟩b⟨U+200B⟩⟨U+000A⟩");
        assert_eq!(display(&once, Lines::One), once);
    }

    #[test]
    fn escaped_json_parses_back_to_the_exact_value() {
        let v = json!({"t": "a\u{1b}[2J\u{9b}\u{202e}b\u{200b}\u{1F600}\u{E0041}", "n": [1, "\u{2066}"]});
        let text = escaped_json(&v);
        assert!(!text.chars().any(|c| c != '\n' && is_hidden(c)), "{text}");
        assert!(
            text.contains("\\u202e") && text.contains("\\udb40\\udc41"),
            "{text}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn warnings_point_at_their_field_and_merge_per_field() {
        let mut w = Warnings::new();
        w.text("/title", "Q3 \u{202e}report pаypal").json(
            "/arguments",
            &json!({"a/b\u{200b}": "x\u{200b}", "list": ["ok", "ѕtop"]}),
        );
        let got = w.finish();
        let fields: Vec<(&str, WarningCode)> =
            got.iter().map(|w| (w.field.as_str(), w.code)).collect();
        assert_eq!(
            fields,
            vec![
                ("/title", WarningCode::HiddenCharacters),
                ("/title", WarningCode::MixedScript),
                ("/arguments/a~1b\u{200b}", WarningCode::HiddenCharacters),
                ("/arguments/list/1", WarningCode::MixedScript),
            ]
        );
        // The key's and the value's hidden characters: one warning.
        assert_eq!(got[2].chars, vec!["U+200B"]);
        assert_eq!(
            got[0].line(),
            "/title: contains hidden or direction-changing characters: U+202E"
        );
        assert_eq!(got[1].words, vec!["pаypal"]);
    }

    #[test]
    fn a_long_text_lists_a_bounded_number_of_findings() {
        let text: String = (0..100u32)
            .filter_map(|i| char::from_u32(0xE0020 + i))
            .collect();
        let mut w = Warnings::new();
        w.text("/x", &text);
        let got = w.finish();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].chars.len(), MAX_LISTED);
    }
}
