//! The house's layout rule that the compiler does not check: no module
//! imports another that imports it back, directly or around a loop.
//!
//! Modules are files (`x.rs`, its children in `x/`). File A imports file B
//! when A names a path (`use crate::b::Item;`, `super::b::f()`, a child
//! module's `child::Item`) whose longest module prefix is B's file. A child
//! naming its own ancestor (`super::Thing`) is not counted: a folder is one
//! concept, and its parent file is its face. Everything else is, including
//! paths in test modules, since they are compiled into the same crate.
//!
//! The scan reads source text, not the compiler's resolution: it strips
//! comments and literals with a small lexer and follows `use` trees with
//! braces and renames. It does not follow re-exports (a path through a
//! facade counts as an import of the facade), nor glob imports of another
//! module's items used without a path; both only make it see fewer arrows
//! than there are, never invent one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

/// Source text with comments, strings and char literals blanked out.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if b[i..].starts_with(b"/*") {
            let mut depth = 1;
            i += 2;
            while i < b.len() && depth > 0 {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                } else {
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…".
        if (c == b'r' || c == b'b') && (i == 0 || !ident(b[i - 1])) {
            let mut j = i;
            if b[j] == b'b' && j + 1 < b.len() && b[j + 1] == b'r' {
                j += 1;
            }
            if b[j] == b'r' {
                let mut k = j + 1;
                while k < b.len() && b[k] == b'#' {
                    k += 1;
                }
                if k < b.len() && b[k] == b'"' {
                    let hashes = k - j - 1;
                    let mut end = vec![b'"'];
                    end.extend(std::iter::repeat_n(b'#', hashes));
                    let mut m = k + 1;
                    while m < b.len() && !b[m..].starts_with(&end) {
                        m += 1;
                    }
                    i = (m + end.len()).min(b.len());
                    out.push_str("\"\"");
                    continue;
                }
            }
        }
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let rest = &b[i + 1..];
            let len = if rest.first() == Some(&b'\\') {
                rest.iter().skip(1).position(|&x| x == b'\'').map(|p| p + 2)
            } else {
                std::str::from_utf8(&rest[..rest.len().min(5)])
                    .ok()
                    .or_else(|| std::str::from_utf8(&rest[..rest.len().min(4)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[..rest.len().min(3)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[..rest.len().min(2)]).ok())
                    .or_else(|| std::str::from_utf8(&rest[..rest.len().min(1)]).ok())
                    .and_then(|s| s.chars().next())
                    .map(char::len_utf8)
                    .filter(|&n| rest.get(n) == Some(&b'\''))
            };
            if let Some(n) = len {
                i += n + 2;
                out.push_str("''");
                continue;
            }
        }
        // Copy one whole character.
        let ch = src[i..].chars().next().unwrap();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The paths of a `use` tree, each with the name it binds.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").trim();
        return vec![path.to_owned()];
    };
    let close = tree.rfind('}').unwrap_or(tree.len());
    let prefix = &tree[..open];
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in tree[open + 1..close].chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
        .iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(p))
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// Every `.rs` file of a crate's `src/` by module path (the binary's
/// `main.rs` is its own crate and is left out).
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut out = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let parts: ModPath = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        match parts.as_slice() {
            [only] if only == "main" => continue,
            [only] if only == "lib" => {
                out.insert(Vec::new(), file);
            }
            _ => {
                out.insert(parts, file);
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Paths in `text` that start with `head::` (not preceded by an identifier
/// character or `::`).
fn paths_from(text: &str, head: &str) -> Vec<String> {
    let mut out = Vec::new();
    let needle = format!("{head}::");
    let mut from = 0;
    while let Some(at) = text[from..].find(&needle) {
        let start = from + at;
        from = start + needle.len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        let mut end = from;
        loop {
            let seg = text[end..]
                .char_indices()
                .find(|&(_, c)| !is_ident(c))
                .map_or(text.len() - end, |(i, _)| i);
            if seg == 0 {
                break;
            }
            end += seg;
            if text[end..].starts_with("::") {
                let next = text[end + 2..].chars().next();
                if next.is_some_and(is_ident) {
                    end += 2;
                    continue;
                }
            }
            break;
        }
        out.push(text[start..end].to_owned());
    }
    out
}

/// File -> the files it imports, for one crate.
fn imports(src: &Path) -> BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> {
    let mods = modules(src);
    let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    for (here, file) in &mods {
        let text = strip(&std::fs::read_to_string(file).unwrap());
        let mut children = BTreeSet::new();
        let mut paths = Vec::new();
        for (i, _) in text.match_indices("mod ") {
            if text[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let name: String = text[i + 4..].chars().take_while(|&c| is_ident(c)).collect();
            if text[i + 4 + name.len()..].trim_start().starts_with(';') {
                children.insert(name);
            }
        }
        for (i, _) in text.match_indices("use ") {
            if text[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            if let Some(end) = text[i..].find(';') {
                paths.extend(expand(&text[i + 4..i + end]));
            }
        }
        for head in ["crate", "super", "self"] {
            paths.extend(paths_from(&text, head));
        }
        for child in &children {
            paths.extend(paths_from(&text, child));
        }
        for path in paths {
            let segs: Vec<&str> = path
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            let Some(first) = segs.first() else { continue };
            let full: ModPath = match *first {
                "crate" => segs[1..].iter().map(|s| s.to_string()).collect(),
                "super" => {
                    let mut base = here[..here.len().saturating_sub(1)].to_vec();
                    let mut rest = &segs[1..];
                    while rest.first() == Some(&"super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().map(|s| s.to_string()));
                    base
                }
                "self" => {
                    let mut base = here.clone();
                    base.extend(segs[1..].iter().map(|s| s.to_string()));
                    base
                }
                child if children.contains(child) => {
                    let mut base = here.clone();
                    base.extend(segs.iter().map(|s| s.to_string()));
                    base
                }
                _ => continue,
            };
            let Some(target) = (0..=full.len())
                .rev()
                .map(|k| &full[..k])
                .find(|prefix| mods.contains_key(*prefix))
            else {
                continue;
            };
            // Itself, or an ancestor of its own folder.
            if target.len() <= here.len() && here[..target.len()] == *target {
                continue;
            }
            edges
                .entry(file.clone())
                .or_default()
                .entry(mods[target].clone())
                .or_default()
                .insert(path.clone());
        }
    }
    edges
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>) -> Vec<Vec<PathBuf>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            if let Some(next) = self.edges.get(v) {
                for w in next.keys() {
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).unwrap();
                        *lv = (*lv).min(lw);
                    } else if self.on.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).unwrap();
                        *lv = (*lv).min(iw);
                    }
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn describe(
    root: &Path,
    edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>,
    cycle: &[PathBuf],
) -> String {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut text = format!(
        "a cycle of {} files: {}\n",
        cycle.len(),
        cycle.iter().map(|p| rel(p)).collect::<Vec<_>>().join(", ")
    );
    for a in cycle {
        for (b, names) in edges.get(a).into_iter().flatten() {
            if cycle.contains(b) {
                let names: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
                text.push_str(&format!(
                    "  {} -> {}: {}\n",
                    rel(a),
                    rel(b),
                    names.join(", ")
                ));
            }
        }
    }
    text
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = String::new();
    for src in ["src", "actors/src"] {
        let edges = imports(&root.join(src));
        assert!(
            edges.len() > 20,
            "{src}: the scan found too few imports to trust"
        );
        for cycle in cycles(&edges) {
            found.push_str(&describe(root, &edges, &cycle));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{found}");
}

#[test]
fn the_scan_sees_a_cycle_through_a_child_module_and_a_use_tree() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod inner;\npub fn f() { inner::g() }\n// use crate::c;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "use crate::{b::{self, H as Renamed}, a::f};\npub fn g() { let _ = \"crate::c::x\"; }\n",
    )
    .unwrap();
    std::fs::write(src.join("b.rs"), "pub struct H;\n").unwrap();
    let edges = imports(src);
    assert!(cycles(&edges).is_empty(), "{edges:?}");
    // b imports a's child: a -> a/inner -> b -> a/inner is a loop.
    std::fs::write(
        src.join("b.rs"),
        "pub struct H;\nfn k() { crate::a::inner::g() }\n",
    )
    .unwrap();
    let edges = imports(src);
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{edges:?}");
    assert_eq!(
        found[0],
        vec![src.join("a/inner.rs"), src.join("b.rs")],
        "{edges:?}"
    );
}

// ---- the API boundary of overseer-actors ------------------------------------
//
// `overseer-actors` exports the `Overseer` handle, the ports and the types
// they speak; the runtime, the actors and the machine are `pub(crate)`. The
// compiler holds that for the normal build, but not for a test build, where
// the dev-dependency enables `overseer_actors::testing` (a session's actor
// cell, the machine): edge code that used it would build and pass every
// test, and break `cargo build`. This scan closes that gap, and keeps edges
// off the runtime's internals by name.

/// The names of `lib.rs`'s modules that are not `pub` (`mod x;`,
/// `pub(crate) mod x;`): the internals of the crate at `src`.
fn private_modules(src: &Path) -> BTreeSet<String> {
    let text = strip(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        let rest = line
            .strip_prefix("pub(crate) mod ")
            .or_else(|| line.strip_prefix("mod "));
        if let Some(name) = rest.and_then(|r| r.strip_suffix(';')) {
            out.insert(name.trim().to_owned());
        }
    }
    out
}

/// `text` (stripped) with every item under a `#[cfg(...test...)]` (but not
/// `not(test)`) blanked, with the names of test-only child modules declared
/// `mod x;` (their files are test code too).
fn without_test_code(text: &str) -> (String, BTreeSet<String>) {
    let mut out = text.to_owned();
    let mut test_children = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(") {
        let start = from + at;
        let attr_end = start + out[start..].find(']').unwrap_or(out.len() - start);
        let attr = &out[start..attr_end];
        from = attr_end;
        if !attr.contains("test") || attr.contains("not(test") {
            continue;
        }
        // The item: up to its `;` or its balanced `{ ... }`, whichever
        // comes first.
        let body = &out[attr_end..];
        let semi = body.find(';').unwrap_or(body.len());
        let open = body.find('{').unwrap_or(body.len());
        let end = if semi < open {
            let item = body[..semi].trim();
            if let Some(name) = item.rsplit("mod ").next().filter(|_| item.contains("mod ")) {
                test_children.insert(name.trim().to_owned());
            }
            attr_end + semi
        } else {
            let mut depth = 0;
            let mut end = out.len();
            for (i, c) in body.char_indices().skip(open) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = attr_end + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        let blank: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blank);
        from = end;
    }
    (out, test_children)
}

/// What an edge file (stripped, test code blanked) reaches of
/// `overseer-actors` that is not its API.
fn internals_used(text: &str, private: &BTreeSet<String>) -> BTreeSet<String> {
    let mut paths = paths_from(text, "overseer_actors");
    for (i, _) in text.match_indices("use ") {
        if text[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        if let Some(end) = text[i..].find(';') {
            paths.extend(expand(&text[i + 4..i + end]));
        }
    }
    let mut out = BTreeSet::new();
    for path in paths {
        let segs: Vec<&str> = path.split("::").map(str::trim).collect();
        if segs.first() != Some(&"overseer_actors") {
            continue;
        }
        let second = segs.get(1).copied().unwrap_or("");
        if private.contains(second) || second == "Runtime" || second == "testing" {
            out.insert(path.clone());
        }
    }
    // The accessor that handed the runtime's fields to the edges.
    if text.contains(".runtime()") {
        out.insert(".runtime()".to_owned());
    }
    out
}

#[test]
fn edges_reach_overseer_actors_only_through_its_api() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let private = private_modules(&root.join("actors/src"));
    for internal in ["runtime", "machine", "messages", "session", "orchestrator"] {
        assert!(
            private.contains(internal),
            "actors/src/lib.rs: `{internal}` is expected private, found {private:?}"
        );
    }
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    walk(&root.join("src"), &mut files);
    files.sort();
    assert!(
        files.len() > 50,
        "the scan found too few edge files to trust"
    );
    let mut test_only: BTreeSet<PathBuf> = BTreeSet::new();
    let mut found = String::new();
    for file in &files {
        let (text, children) = without_test_code(&strip(&std::fs::read_to_string(file).unwrap()));
        let dir = file.with_extension("");
        let parent = file.parent().unwrap();
        for child in children {
            // `x.rs` declares children in `x/`; `lib.rs`/`main.rs` beside it.
            let base = if matches!(
                file.file_stem().and_then(|s| s.to_str()),
                Some("lib" | "main")
            ) {
                parent.to_path_buf()
            } else {
                dir.clone()
            };
            test_only.insert(base.join(format!("{child}.rs")));
        }
        if test_only.contains(file) {
            continue;
        }
        for used in internals_used(&text, &private) {
            found.push_str(&format!(
                "{}: {used}\n",
                file.strip_prefix(root).unwrap().display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "edge code reaches into overseer-actors' internals (use a method of \
         `Overseer`; `testing` is for test code only):\n{found}"
    );

    // The normal dependency (and no feature of this crate) enables `testing`.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let enables_testing =
            line.contains("\"testing\"") || line.contains("overseer-actors/testing");
        let normal = section == "[dependencies]" && line.starts_with("overseer-actors");
        assert!(
            !(enables_testing && (normal || section == "[features]")),
            "Cargo.toml {section}: `{line}` gives the edge overseer-actors' `testing` internals"
        );
    }
}

#[test]
fn the_boundary_scan_sees_internals_outside_test_code_only() {
    let private: BTreeSet<String> = ["runtime", "machine"].map(String::from).into();
    let src = "use overseer_actors::{model::SessionId, machine::{ForkAt as F}};\n\
               fn f(o: &Overseer) { o.runtime().live.len(); }\n\
               fn g() { overseer_actors::testing::session_cell(); }\n\
               #[cfg(test)]\nmod tests { use overseer_actors::testing::x; fn h() { overseer_actors::runtime::Y; } }\n\
               #[cfg(not(test))]\nfn k() { overseer_actors::Runtime::new(); }\n\
               #[cfg(test)]\nmod more;\n";
    let (text, children) = without_test_code(&strip(src));
    assert_eq!(children, BTreeSet::from(["more".to_owned()]));
    let used = internals_used(&text, &private);
    assert_eq!(
        used,
        [
            ".runtime()",
            "overseer_actors::Runtime::new",
            "overseer_actors::machine::ForkAt",
            "overseer_actors::testing::session_cell",
        ]
        .map(String::from)
        .into(),
        "{text}"
    );
}
