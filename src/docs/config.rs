//! The configuration reference page: every key of every section, its
//! default, its `OVERSEER_*` variable where one exists, and what it does.
//!
//! The keys come from the section types themselves (each refuses unknown
//! keys, and its refusal lists the keys it knows, in declaration order); the
//! defaults and descriptions from the commented defaults file compiled into
//! the binary, [`DEFAULT_CONFIG`] (which `tests/config_file.rs` and the
//! config module's tests hold to the code's defaults); the variables from
//! [`ENV_OVERRIDES`] and the clap arguments that read one. A section the
//! generator does not know is an error naming it, so a new one cannot be
//! left off the page.
//!
//! How the file is read: a key's description is the last paragraph of
//! comment lines above it (paragraphs are split by a bare `#`); earlier
//! paragraphs before a section's first key are the section's introduction.
//! A key set in the file has that value as its default; a commented
//! `# key = value` line is an unset key with an example; in a commented
//! list (`#   key   description`, continuation lines indented deeper) the
//! default is what the description's `Default:` sentence says.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;

use super::{cell, DocsError};
use crate::config::{
    AgentSection, ClusterSection, Config, HttpSection, LimitsSection, ProviderSection,
    RuntimeSection, ScopeTokenSection, StoreSection, TaskSection, WebhooksSection, DEFAULT_CONFIG,
    ENV_OVERRIDES,
};
use crate::provider::RouteConfig;
use crate::tools::http_request::HttpRequestConfig;
use crate::tools::http_tool::HttpToolConfig;
use crate::tools::mcp::McpServerConfig;

/// One section of the file: its name, whether it is an array of tables
/// (`[[agents]]`), and the keys its type accepts.
struct Section {
    name: &'static str,
    array: bool,
    keys: Vec<String>,
}

/// The keys `T` accepts, from its refusal of an unknown key.
pub(crate) fn keys_of<T: DeserializeOwned>() -> Result<Vec<String>, DocsError> {
    let mut probe = toml::Table::new();
    probe.insert("__not_a_key__".into(), toml::Value::Integer(0));
    let message = match toml::Value::Table(probe).try_into::<T>() {
        Ok(_) => {
            return Err(DocsError::Generator(format!(
                "{} accepts unknown keys, so its keys cannot be listed",
                std::any::type_name::<T>()
            )))
        }
        Err(e) => e.to_string(),
    };
    let expected = message
        .split_once("expected one of ")
        .or_else(|| message.split_once("expected "))
        .map(|(_, rest)| rest)
        .ok_or_else(|| DocsError::Generator(format!("no key list in: {message}")))?;
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Err(DocsError::Generator(format!(
            "no keys parsed from: {message}"
        )));
    }
    Ok(keys)
}

/// Keys of the file's top level that are not sections (they come before
/// the first table); a name the configuration does not have is skipped.
const TOP_LEVEL: &[&str] = &["tasks_dir", "skills_dirs"];

/// Every section, in the order the page lists them (the top-level keys
/// first, as the section named ""). A key of [`Config`] that is neither
/// here nor in [`TOP_LEVEL`] is an error (see [`render`]).
fn sections() -> Result<Vec<Section>, DocsError> {
    let top: Vec<String> = keys_of::<Config>()?
        .into_iter()
        .filter(|k| TOP_LEVEL.contains(&k.as_str()))
        .collect();
    let table = |name, keys| Section {
        name,
        array: false,
        keys,
    };
    let array = |name, keys| Section {
        name,
        array: true,
        keys,
    };
    Ok(vec![
        table("", top),
        table("store", keys_of::<StoreSection>()?),
        table("cluster", keys_of::<ClusterSection>()?),
        table("runtime", keys_of::<RuntimeSection>()?),
        table("limits", keys_of::<LimitsSection>()?),
        table("provider", keys_of::<ProviderSection>()?),
        array("models", keys_of::<RouteConfig>()?),
        table("http", keys_of::<HttpSection>()?),
        table("scope_tokens", keys_of::<ScopeTokenSection>()?),
        table("webhooks", keys_of::<WebhooksSection>()?),
        table(
            "telemetry",
            keys_of::<crate::telemetry::TelemetrySection>()?,
        ),
        table("log", keys_of::<crate::telemetry::LogSection>()?),
        array("tools", keys_of::<HttpToolConfig>()?),
        table("http_request", keys_of::<HttpRequestConfig>()?),
        array("mcp_servers", keys_of::<McpServerConfig>()?),
        array("agents", keys_of::<AgentSection>()?),
        array("tasks", keys_of::<TaskSection>()?),
    ])
}

/// What the file says about one key.
#[derive(Debug, Default, Clone)]
struct Entry {
    /// The value it is set to, as written (a key set in the file).
    value: Option<String>,
    /// A commented `# key = value` line's value: unset by default.
    example: Option<String>,
    /// The description, one line.
    description: String,
}

/// What the file says, by section.
#[derive(Debug, Default)]
struct FileDoc {
    entries: BTreeMap<String, BTreeMap<String, Entry>>,
    intros: BTreeMap<String, String>,
}

impl FileDoc {
    fn entry(&self, section: &str, key: &str) -> Option<&Entry> {
        self.entries.get(section).and_then(|s| s.get(key))
    }

    fn has_entries(&self, section: &str) -> bool {
        self.entries.get(section).is_some_and(|s| !s.is_empty())
    }

    /// Records a key the first time it is described (later mentions, such as
    /// an example table, do not replace it).
    fn record(&mut self, section: &str, key: &str, entry: Entry) -> bool {
        let keys = self.entries.entry(section.to_owned()).or_default();
        if keys.contains_key(key) {
            return false;
        }
        keys.insert(key.to_owned(), entry);
        true
    }
}

/// `key = value` (or `key=value`) with a plain key.
fn key_value(text: &str) -> Option<(&str, &str)> {
    let (key, value) = text.split_once('=')?;
    let key = key.trim();
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain.then(|| (key, value.trim()))
}

/// A line without its trailing `# comment` (a `#` outside quotes), and the
/// comment.
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some('"'), '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (Some(q), c) if c == q && !escaped => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => return (line[..i].trim_end(), Some(line[i + 1..].trim())),
            _ => {}
        }
        escaped = false;
    }
    (line, None)
}

/// The section named by a `[name]` or `[[name]]` mention in a comment.
fn mentioned_section<'a>(text: &str, sections: &'a [Section]) -> Option<&'a str> {
    let mut rest = text;
    while let Some(start) = rest.find('[') {
        let after = rest[start..].trim_start_matches('[');
        let end = after.find(']')?;
        let name = &after[..end];
        if let Some(s) = sections.iter().find(|s| s.name == name) {
            return Some(s.name);
        }
        rest = &after[end..];
    }
    None
}

fn parse(text: &str, sections: &[Section]) -> FileDoc {
    let known = |section: &str, key: &str| {
        sections
            .iter()
            .any(|s| s.name == section && s.keys.iter().any(|k| k == key))
    };
    let is_array = |section: &str| sections.iter().any(|s| s.name == section && s.array);
    let mut doc = FileDoc::default();
    let mut header: Option<String> = None;
    let mut list: Option<String> = None;
    let mut para: Vec<String> = Vec::new();
    // The open list item: its section, key and indent.
    let mut item: Option<(String, String, usize)> = None;
    // The key on the line before, for a key that follows it directly.
    let mut previous: Option<(String, String)> = None;
    // Whether this paragraph already named the section its list is of: a
    // later mention in the same paragraph ("… every other agent by
    // [provider]") is prose, not a new list.
    let mut switched = false;

    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            para.clear();
            item = None;
            previous = None;
            switched = false;
            continue;
        }
        if let Some(body) = trimmed.strip_prefix('#') {
            let indent = body.len() - body.trim_start().len();
            let text = body.trim();
            if text.is_empty() {
                // A paragraph break: what came before a section's first key
                // introduces the section.
                if let Some(section) = &header {
                    if !para.is_empty() && !doc.has_entries(section) {
                        let intro = doc.intros.entry(section.clone()).or_default();
                        if !intro.is_empty() {
                            intro.push(' ');
                        }
                        intro.push_str(&para.join(" "));
                    }
                }
                para.clear();
                item = None;
                switched = false;
                continue;
            }
            if indent >= 2 {
                let (first, rest) = text
                    .split_once(char::is_whitespace)
                    .map_or((text, ""), |(f, r)| (f, r));
                let spaced =
                    rest.is_empty() || text[first.len()..].chars().take(2).all(char::is_whitespace);
                if let Some(section) = list.clone() {
                    if spaced && known(&section, first) {
                        if !para.is_empty() && !doc.has_entries(&section) {
                            doc.intros
                                .entry(section.clone())
                                .or_insert_with(|| para.join(" "));
                        }
                        para.clear();
                        let entry = Entry {
                            description: rest.trim().to_owned(),
                            ..Entry::default()
                        };
                        item = doc
                            .record(&section, first, entry)
                            .then(|| (section.clone(), first.to_owned(), indent));
                        previous = None;
                        continue;
                    }
                }
                if let Some((section, key, item_indent)) = &item {
                    if indent > *item_indent {
                        if let Some(e) = doc.entries.get_mut(section).and_then(|s| s.get_mut(key)) {
                            if !e.description.is_empty() {
                                e.description.push(' ');
                            }
                            e.description.push_str(text);
                        }
                        continue;
                    }
                }
            }
            item = None;
            if indent == 1 {
                let section = header.clone().unwrap_or_default();
                let (text, trailing) = split_comment(text);
                if let Some((key, value)) = key_value(text) {
                    if known(&section, key) && !is_array(&section) {
                        // Commented keys right below another share its
                        // comment block (`# tls_cert = …` / `# tls_key = …`).
                        let description = if let Some(comment) = trailing {
                            comment.to_owned()
                        } else if para.is_empty() {
                            previous
                                .as_ref()
                                .and_then(|(s, k)| doc.entry(s, k))
                                .map(|e| e.description.clone())
                                .unwrap_or_default()
                        } else {
                            para.join(" ")
                        };
                        let entry = Entry {
                            example: Some(value.to_owned()),
                            description,
                            ..Entry::default()
                        };
                        doc.record(&section, key, entry);
                        previous = Some((section.clone(), key.to_owned()));
                        para.clear();
                        continue;
                    }
                }
            }
            if let Some(section) = mentioned_section(text, sections).filter(|_| !switched) {
                list = Some(section.to_owned());
                switched = true;
            }
            para.push(text.to_owned());
            continue;
        }
        if trimmed.starts_with('[') {
            let name = trimmed.trim_matches(|c| c == '[' || c == ']').trim();
            header = Some(name.to_owned());
            list = Some(name.to_owned());
            para.clear();
            item = None;
            previous = None;
            switched = false;
            continue;
        }
        let (line, trailing) = split_comment(trimmed);
        if let (Some(section), Some((key, value))) = (&header, key_value(line)) {
            if !is_array(section) {
                // A trailing comment describes its key; the block above it
                // then introduces the section, if no key came before.
                if trailing.is_some() && !para.is_empty() && !doc.has_entries(section) {
                    doc.intros
                        .entry(section.clone())
                        .or_insert_with(|| para.join(" "));
                }
                let description = if let Some(comment) = trailing {
                    comment.to_owned()
                } else if para.is_empty() {
                    previous
                        .as_ref()
                        .and_then(|(s, k)| doc.entry(s, k))
                        .map(|e| e.description.clone())
                        .unwrap_or_default()
                } else {
                    para.join(" ")
                };
                let entry = Entry {
                    value: Some(value.to_owned()),
                    description,
                    ..Entry::default()
                };
                doc.record(section, key, entry);
                // A key right below this one shares its comment block, not
                // its own trailing comment.
                previous = trailing
                    .is_none()
                    .then(|| (section.clone(), key.to_owned()));
            }
        }
        para.clear();
    }
    doc
}

/// Removes the sentence that starts with `marker` (up to its full stop),
/// returning the text without it and the sentence's remainder.
fn take_sentence(text: &str, marker: &str) -> (String, Option<String>) {
    let Some(start) = text.find(marker) else {
        return (text.to_owned(), None);
    };
    let after = &text[start + marker.len()..];
    let end = after
        .find(". ")
        .unwrap_or_else(|| after.strip_suffix('.').map_or(after.len(), str::len));
    let said = after[..end].trim().to_owned();
    let skip = (end + 1).min(after.len());
    let rest = format!("{}{}", &text[..start], after[skip..].trim_start());
    (rest.trim().to_owned(), Some(said))
}

/// The default to show and the description without the sentences the
/// table's columns already say.
fn columns(key: &str, entry: Option<&Entry>) -> (String, String) {
    let Some(entry) = entry else {
        return (
            "—".to_owned(),
            "(not described in config/overseer.toml)".to_owned(),
        );
    };
    let own = entry
        .description
        .strip_prefix(&format!("{key}: "))
        .unwrap_or(&entry.description);
    let (description, _) = take_sentence(own, "Env: ");
    let (description, said) = match take_sentence(&description, "Defaults: ") {
        (d, Some(s)) => (d, Some(s)),
        (d, None) => take_sentence(&d, "Default: "),
    };
    let required = description.starts_with("required");
    let description = if required {
        description
            .trim_start_matches("required")
            .trim_start_matches([':', ','])
            .trim()
            .to_owned()
    } else {
        description
    };
    let default = if let Some(value) = &entry.value {
        format!("`{value}`")
    } else if required {
        "required".to_owned()
    } else {
        match said {
            Some(said) if is_literal(&said) => format!("`{said}`"),
            Some(said) => said,
            None if entry.example.is_some() => "unset".to_owned(),
            None => "—".to_owned(),
        }
    };
    let description = match &entry.example {
        Some(example) => {
            let stop = if description.is_empty() || description.ends_with(['.', ':', ')']) {
                ""
            } else {
                "."
            };
            format!("{description}{stop} Example: `{example}`.")
        }
        None => description,
    };
    (default, description.trim().to_owned())
}

/// Whether `text` is one TOML value (`60`, `"POST"`, `[]`), to be shown as
/// code; prose such as `none` or `4096, or half …` is not.
fn is_literal(text: &str) -> bool {
    toml::from_str::<toml::Table>(&format!("v = {text}")).is_ok()
}

/// A list's introduction without the list's own name and its "Keys:".
fn tidy_intro(intro: &str) -> String {
    let mut text = intro.trim();
    for end in ["Keys and defaults:", "Keys:"] {
        text = text.strip_suffix(end).unwrap_or(text).trim_end();
    }
    if text.starts_with('[') {
        if let Some((_, rest)) = text.split_once("]: ") {
            text = rest;
        }
    }
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().collect::<String>() + chars.as_str()
    })
}

/// The configuration reference page.
pub(super) fn render(cli: &clap::Command) -> Result<String, DocsError> {
    let sections = sections()?;
    for name in keys_of::<Config>()? {
        if !TOP_LEVEL.contains(&name.as_str()) && !sections.iter().any(|s| s.name == name) {
            return Err(DocsError::Generator(format!(
                "the config section [{name}] is not on the reference page: add it to \
                 `sections` in src/docs/config.rs"
            )));
        }
    }
    let doc = parse(DEFAULT_CONFIG, &sections);
    let env: BTreeMap<&str, &str> = ENV_OVERRIDES.iter().map(|(v, k)| (*k, *v)).collect();

    let mut out = String::new();
    out.push_str("# Configuration\n\n");
    out.push_str(
        "Every key of the configuration file, with its default and the `OVERSEER_*` \
         environment variable that overrides it, where one exists. The file is \
         `config/overseer.toml` in the repository, where each key has a comment (the same file is compiled into the binary and used when no \
         file is given and `./config/overseer.toml` does not exist).\n\n",
    );
    out.push_str(
        "Precedence: the file (`--config FILE` or `OVERSEER_CONFIG`; a file given that \
         way must exist), then the environment variables below, then command-line \
         flags. Unknown keys are errors, and every invalid value is reported with its \
         key, all problems of a file at once. Secrets (provider keys, the JWT secret, \
         the database URL) never go in the file: they come from the environment only. \
         Relative paths are relative to the working directory. An empty environment \
         variable counts as unset.\n\n",
    );
    out.push_str("## Environment variables\n\n");
    out.push_str("Variables that override a key of the file:\n\n");
    out.push_str("| Variable | Key |\n|---|---|\n");
    for (var, key) in ENV_OVERRIDES {
        out.push_str(&format!("| `{var}` | [`{key}`](#{}) |\n", anchor(key)));
    }
    out.push_str("\nVariables read by command-line flags (the flag wins):\n\n");
    out.push_str("| Variable | Flag |\n|---|---|\n");
    for (var, flag) in super::cli::env_flags(cli) {
        out.push_str(&format!("| `{var}` | {} |\n", cell(&flag)));
    }
    out.push_str("\nSecrets and client settings, read from the environment only:\n\n");
    out.push_str("| Variable | What |\n|---|---|\n");
    for (var, what) in secrets() {
        out.push_str(&format!("| `{var}` | {} |\n", cell(&what)));
    }

    for section in &sections {
        if section.keys.is_empty() {
            continue;
        }
        let title = if section.name.is_empty() {
            "Top-level keys".to_owned()
        } else if section.array {
            format!("[[{}]]", section.name)
        } else {
            format!("[{}]", section.name)
        };
        if section.name.is_empty() {
            out.push_str(&format!("\n## {title}\n\n"));
        } else {
            out.push_str(&format!("\n## `{title}`\n\n"));
        }
        if let Some(intro) = doc.intros.get(section.name) {
            let intro = tidy_intro(intro);
            if !intro.is_empty() {
                out.push_str(&intro);
                out.push_str("\n\n");
            }
        }
        out.push_str("| Key | Default | Variable | Description |\n|---|---|---|---|\n");
        for key in &section.keys {
            let (default, description) = columns(key, doc.entry(section.name, key));
            let full = if section.name.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", section.name)
            };
            let var = env
                .get(full.as_str())
                .map_or_else(String::new, |v| format!("`{v}`"));
            out.push_str(&format!(
                "| <a id=\"{}\"></a>`{key}` | {} | {var} | {} |\n",
                anchor(&full),
                cell(&default),
                cell(&description)
            ));
        }
    }
    Ok(out)
}

/// The anchor of a key's row: `store.kind` → `store-kind`.
fn anchor(key: &str) -> String {
    key.replace(['.', '_'], "-")
}

/// Variables the code reads directly, not as overrides of a key.
fn secrets() -> Vec<(String, String)> {
    vec![
        (
            crate::auth::SECRET_ENV.to_owned(),
            "The HS256 secret API tokens are verified with (`[http] auth = \"hs256\"`), \
             at least 32 bytes with at least 8 distinct byte values; `overseer token` signs \
             with it."
                .to_owned(),
        ),
        (
            crate::store::postgres::DATABASE_URL_ENV.to_owned(),
            "The PostgreSQL URL of `[store] kind = \"postgres\"` (cluster mode), e.g. \
             `postgres://user:password@host:5432/dbname`."
                .to_owned(),
        ),
        (
            ScopeTokenSection::default().secret_env,
            "The HS256 secret of the scope tokens sent to http tools and MCP servers (the \
             variable `[scope_tokens] secret_env` names); unset, no token is sent."
                .to_owned(),
        ),
        (
            "OPENAI_API_KEY, ANTHROPIC_API_KEY".to_owned(),
            "Provider keys of routes without a `base_url` (or the variable a route's \
             `api_key_env` names)."
                .to_owned(),
        ),
        (
            "OVERSEER_TOKEN".to_owned(),
            "The bearer token of the client commands (`overseer sessions …`, `overseer acp \
             --server`)."
                .to_owned(),
        ),
        (
            "RUST_LOG".to_owned(),
            "Log filter (logs go to stderr; default `warn`).".to_owned(),
        ),
        (
            "NO_COLOR".to_owned(),
            "Set: logs are never coloured.".to_owned(),
        ),
    ]
}
