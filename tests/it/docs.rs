//! The book (`docs/`) and the repository's Markdown stand alone and cannot
//! go stale: the generated reference pages are what the code renders now,
//! the book builds with mdBook, every relative link and anchor resolves,
//! the event types, session statuses and stop reasons the code has are all
//! documented, and nothing cites the spec outside the repository.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Component, Path, PathBuf};

use clap::CommandFactory;
use overseer::cli::Cli;
use overseer::docs::{reference_pages, REFERENCE_DIR, REGENERATE};
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use serde::de::DeserializeOwned;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn generated_reference_pages_match_the_code() {
    // `OVERSEER_WRITE_DOCS=1 cargo test --test docs` rewrites the pages
    // instead (what `overseer docs` does, without building the binary).
    if std::env::var_os("OVERSEER_WRITE_DOCS").is_some() {
        overseer::docs::write_reference(&root().join(REFERENCE_DIR), &Cli::command()).unwrap();
    }
    let mut stale = Vec::new();
    for page in reference_pages(&Cli::command()).unwrap() {
        let path = root().join(REFERENCE_DIR).join(page.file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != page.text {
            let line = committed
                .lines()
                .zip(page.text.lines())
                .position(|(a, b)| a != b)
                .map_or_else(
                    || committed.lines().count().min(page.text.lines().count()) + 1,
                    |i| i + 1,
                );
            stale.push(format!(
                "{REFERENCE_DIR}/{} (first difference at line {line})",
                page.file
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "generated reference pages differ from what the code renders: {}\nregenerate them with `{REGENERATE}` and commit the result",
        stale.join(", ")
    );
}

#[test]
fn the_book_builds_with_mdbook() {
    let out = tempfile::tempdir().unwrap();
    let mut book = mdbook_driver::MDBook::load(root().join("docs")).unwrap();
    book.config.build.build_dir = out.path().to_path_buf();
    book.build().unwrap();
    for page in ["index.html", "reference/config.html", "reference/cli.html"] {
        assert!(out.path().join(page).is_file(), "{page} was not built");
    }
}

/// The Markdown files whose links must resolve: the book's sources and the
/// repository's own pages.
fn markdown_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "CHANGELOG.md",
        "SECURITY.md",
        "ARCHITECTURE.md",
        "benches/HISTORY.md",
    ]
    .iter()
    .map(|f| root().join(f))
    .collect();
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// mdBook's heading ids (`mdbook-html`'s `id_from_content`, made unique
/// with `-1`, `-2`, … as it does; GitHub's are the same for these pages).
fn id_from_content(content: &str) -> String {
    content
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|ch| {
            if ch.is_alphanumeric() || ch == '_' || ch == '-' {
                Some(ch)
            } else if ch.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

struct Scanned {
    links: Vec<String>,
    anchors: HashSet<String>,
}

fn scan(text: &str) -> Scanned {
    let mut links = Vec::new();
    let mut anchors = HashSet::new();
    let mut heading: Option<String> = None;
    // The extensions mdBook turns on (not wikilinks: `[[agents]]` is text).
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES;
    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                if let Some(h) = heading.take() {
                    let id = id_from_content(&h);
                    let mut unique = id.clone();
                    let mut n = 1;
                    while !anchors.insert(unique.clone()) {
                        unique = format!("{id}-{n}");
                        n += 1;
                    }
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                links.push(dest_url.to_string());
            }
            Event::Html(html) | Event::InlineHtml(html) => {
                for part in html.split("id=\"").skip(1) {
                    if let Some(end) = part.find('"') {
                        anchors.insert(part[..end].to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    Scanned { links, anchors }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    let book = root().join("docs/src");
    let mut scanned: BTreeMap<PathBuf, Scanned> = BTreeMap::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        scanned.insert(file.clone(), scan(&text));
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for (file, page) in &scanned {
        let shown = file.strip_prefix(root()).unwrap().display().to_string();
        for link in &page.links {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = link
                .split_once('#')
                .map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            if file.starts_with(&book) && !target.starts_with(&book) {
                broken.push(format!("{shown}: {link} leaves the book (docs/src)"));
                continue;
            }
            if !target.starts_with(root()) {
                broken.push(format!("{shown}: {link} leaves the repository"));
                continue;
            }
            if !target.exists() {
                broken.push(format!("{shown}: {link}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let anchors = match scanned.get(&target) {
                    Some(s) => &s.anchors,
                    None => {
                        broken.push(format!("{shown}: {link}: anchor into a file not checked"));
                        continue;
                    }
                };
                if !anchors.contains(anchor) {
                    broken.push(format!(
                        "{shown}: {link}: no heading or id `{anchor}` there"
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_book_page_is_in_the_summary() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = scan(&summary)
        .links
        .iter()
        .map(|l| normalize(&src.join(l)))
        .collect();
    let orphans: Vec<String> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with(&src) && !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(
        orphans.is_empty(),
        "pages not in docs/src/SUMMARY.md: {orphans:?}"
    );
}

/// The wire names of an enum's variants, from serde's refusal of an
/// unknown one (`expected one of `a`, `b``).
fn variants_of<T: DeserializeOwned>(probe: serde_json::Value) -> Vec<String> {
    let message = serde_json::from_value::<T>(probe)
        .err()
        .unwrap()
        .to_string();
    let list = message.split_once("expected one of ").unwrap().1;
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn event_types_statuses_and_stop_reasons_are_documented() {
    use overseer::actors::model::{EventKind, SessionStatus, StopReason};
    let page = std::fs::read_to_string(root().join("docs/src/reference/events.md")).unwrap();
    let names = [
        (
            "event type",
            variants_of::<EventKind>(serde_json::json!({"type": "__none__"})),
        ),
        (
            "session status",
            variants_of::<SessionStatus>(serde_json::json!("__none__")),
        ),
        (
            "stop reason",
            variants_of::<StopReason>(serde_json::json!("__none__")),
        ),
    ];
    let mut missing = Vec::new();
    for (what, list) in &names {
        assert!(list.len() > 3, "{what}s: {list:?}");
        for name in list {
            if !page.contains(&format!("`{name}`")) {
                missing.push(format!("{what} `{name}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not documented in docs/src/reference/events.md: {missing:?}"
    );
}

#[test]
fn nothing_cites_the_spec_outside_the_repository() {
    let mut files = markdown_files();
    files.push(root().join("config/overseer.toml"));
    let mut dirs = vec![root().join("src"), root().join("actors/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "md") {
                files.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // A section sign is a citation of the spec unless it cites an RFC.
            let spec_section = line
                .match_indices('§')
                .any(|(i, _)| line[..i].rfind("RFC").is_none_or(|j| i - j > 16));
            if line.contains("DESIGN") || spec_section {
                found.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(root()).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of DESIGN.md (not in the repository); point to the book page or the module that holds the fact:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_test_file_is_on_the_tests_page() {
    let page = std::fs::read_to_string(root().join("docs/src/development/tests.md")).unwrap();
    let mut missing = Vec::new();
    for dir in ["tests", "tests/it", "actors/tests", "actors/tests/it"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if !page.contains(&format!("`{name}`")) {
                    missing.push(format!("{dir}/{name}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "test files not on docs/src/development/tests.md: {missing:?}"
    );
}

/// The Rust sources a guard can live in: both crates' code and tests.
fn rust_sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("node_modules") && !path.ends_with("fixtures") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    for dir in ["src", "tests", "actors/src", "actors/tests", "benches"] {
        walk(&root().join(dir), &mut out);
    }
    out
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(ident)
            && !text[at + word.len()..].chars().next().is_some_and(ident)
    })
}

/// The test names the `*Guard(s):*` parts of `text` cite, each with the
/// file it names or that the name before it named (`::name`), or `None`
/// for a unit test named by its module path.
fn cited_guards(text: &str) -> Vec<(Option<String>, String)> {
    let mut cited = Vec::new();
    let mut file: Option<String> = None;
    let mut in_guards = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let new_item = line.starts_with("- ")
            || trimmed.split_once(". ").is_some_and(|(n, _)| {
                !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) && !line.starts_with(' ')
            })
            || trimmed.is_empty()
            || trimmed.starts_with('#');
        if new_item {
            in_guards = false;
            file = None;
        }
        let mut rest = line;
        if let Some(at) = rest.find("*Guard") {
            in_guards = true;
            rest = &rest[at..];
        }
        if !in_guards {
            continue;
        }
        for (i, span) in rest.split('`').enumerate() {
            if i % 2 == 0 || !span.contains("::") && !span.ends_with(".rs") {
                continue;
            }
            if !span
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_/.:-".contains(c))
            {
                continue;
            }
            let (path, name) = match span.split_once(".rs") {
                Some((path, name)) => {
                    file = Some(format!("{path}.rs"));
                    (file.clone(), name.rsplit("::").next().unwrap_or(name))
                }
                None if span.starts_with("::") => {
                    (file.clone(), span.rsplit("::").next().unwrap_or(span))
                }
                None => {
                    file = None;
                    (None, span.rsplit("::").next().unwrap_or(span))
                }
            };
            if !name.is_empty() {
                cited.push((path, name.to_owned()));
            } else if let Some(path) = path {
                cited.push((Some(path), String::new()));
            }
        }
    }
    cited
}

#[test]
fn every_guard_named_in_the_docs_exists() {
    let sources = rust_sources();
    let mut missing = Vec::new();
    let mut seen = 0;
    for doc in ["ARCHITECTURE.md", "docs/src/development/guarantees.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (file, name) in cited_guards(&text) {
            seen += 1;
            let found = match &file {
                // `file.rs::sub::name` may live in `file/sub.rs`.
                Some(file) => {
                    let dir = root().join(file.trim_end_matches(".rs"));
                    std::fs::read_to_string(root().join(file))
                        .is_ok_and(|text| name.is_empty() || has_word(&text, &name))
                        || sources
                            .iter()
                            .any(|(path, text)| path.starts_with(&dir) && has_word(text, &name))
                }
                None => sources.iter().any(|(_, text)| has_word(text, &name)),
            };
            if !found {
                missing.push(format!("{doc}: {}::{name}", file.unwrap_or_default()));
            }
        }
    }
    assert!(seen > 100, "only {seen} guards found: the scan is broken");
    assert!(
        missing.is_empty(),
        "guards named but not found: {missing:#?}"
    );
}

#[test]
fn the_guard_scan_reads_files_continuations_and_module_paths() {
    let text = "- **Rule.** Text `not::a_guard`. *Guards:*\n  `tests/it/x.rs::one`,\n  `::two` (`::three`), `m::tests::four`, `tests/it/y.rs`.\n- `after::the_item`\n";
    assert_eq!(
        cited_guards(text),
        vec![
            (Some("tests/it/x.rs".into()), "one".into()),
            (Some("tests/it/x.rs".into()), "two".into()),
            (Some("tests/it/x.rs".into()), "three".into()),
            (None, "four".into()),
            (Some("tests/it/y.rs".into()), String::new()),
        ]
    );
}
