//! Reading skills in the Agent Skills format (agentskills.io) from the
//! configured `skills_dirs`: each folder of a directory that holds a
//! `SKILL.md` is a skill.
//!
//! `SKILL.md` is YAML front matter between `---` lines, then a Markdown body.
//! Checked at start, every file of every directory: `name` (1 to 64
//! lower-case letters, digits and hyphens, no hyphen first, last or twice in
//! a row, equal to its folder's name), `description` (1 to 1,024
//! characters), and when present `license` (text), `compatibility` (1 to 500
//! characters), `metadata` (a map of plain values) and `allowed-tools` (a
//! space-separated list, or a YAML list). Other fields are kept as written.
//! A bad file stops start-up with one line naming the file and the field.
//! A skill needs a person's trust when its `metadata.requires-trust` is true
//! or its directory is configured `trusted = false`.
//!
//! This module owns parsing and validation only. It deliberately runs
//! nothing a skill holds (`scripts/` are never executed by overseer) and
//! reads no resource after start: `tools::skills` serves those on request.

use std::path::{Path, PathBuf};

use serde_json::Value;

use overseer_actors::skills::{Skill, SkillCatalog};

/// Longest `name` (the format's limit).
pub const MAX_NAME: usize = 64;
/// Longest `description` (the format's limit), in characters.
pub const MAX_DESCRIPTION: usize = 1024;
/// Longest `compatibility` (the format's limit), in characters.
pub const MAX_COMPATIBILITY: usize = 500;
/// Largest `SKILL.md` read (a body is meant to stay under ~5,000 tokens).
pub const MAX_SKILL_FILE: u64 = 1024 * 1024;

/// A directory of skill folders, and whether its skills may be activated by
/// the model (`trusted`) or only by a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillsDir {
    /// The directory.
    pub path: PathBuf,
    /// Whether the model may activate its skills (else only a person).
    pub trusted: bool,
}

/// Why the skills could not be read. One line, naming the file (and the
/// field, when one is wrong).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkillError {
    /// A directory or file could not be read.
    #[error("skills: cannot read {}: {reason}", path.display())]
    Read {
        /// What.
        path: PathBuf,
        /// The OS's words.
        reason: String,
    },
    /// A `SKILL.md` is malformed.
    #[error("skills: {}: {field}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field (`name`, `metadata.requires-trust`, `front matter`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Two skills share a name.
    #[error("skills: {0}")]
    Duplicate(String),
}

/// Reads every skill of `dirs` (blocking: call it from a blocking thread).
pub fn load(dirs: &[SkillsDir]) -> Result<SkillCatalog, SkillError> {
    let mut skills = Vec::new();
    for dir in dirs {
        let entries = std::fs::read_dir(&dir.path).map_err(|e| SkillError::Read {
            path: dir.path.clone(),
            reason: e.to_string(),
        })?;
        let mut folders: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| SkillError::Read {
                path: dir.path.clone(),
                reason: e.to_string(),
            })?;
            let path = entry.path();
            if path.is_dir() && path.join("SKILL.md").is_file() {
                folders.push(path);
            }
        }
        folders.sort();
        for folder in folders {
            skills.push(read_skill(&folder, dir.trusted)?);
        }
    }
    SkillCatalog::new(skills).map_err(SkillError::Duplicate)
}

/// Reads and checks the skill in `folder`.
pub fn read_skill(folder: &Path, trusted_dir: bool) -> Result<Skill, SkillError> {
    let file = folder.join("SKILL.md");
    let size = std::fs::metadata(&file)
        .map_err(|e| SkillError::Read {
            path: file.clone(),
            reason: e.to_string(),
        })?
        .len();
    if size > MAX_SKILL_FILE {
        return Err(invalid(
            &file,
            "(file)",
            format!("is {size} bytes, more than the {MAX_SKILL_FILE} read"),
        ));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| SkillError::Read {
        path: file.clone(),
        reason: e.to_string(),
    })?;
    let folder_name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = folder.canonicalize().map_err(|e| SkillError::Read {
        path: folder.to_path_buf(),
        reason: e.to_string(),
    })?;
    parse(&file, &folder_name, &text, dir, trusted_dir)
}

fn invalid(path: &Path, field: &str, message: impl Into<String>) -> SkillError {
    SkillError::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        message: message.into(),
    }
}

/// Splits `text` into front matter and body: the file must start with a
/// `---` line, and the front matter ends at the next `---` line.
fn split(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            let front = &rest[..at];
            let body = &rest[at + line.len()..];
            return Some((front, body));
        }
        at += line.len();
    }
    None
}

/// Checks one `SKILL.md` (`path` names it in errors; `folder` is its
/// folder's name, which `name` must equal).
pub fn parse(
    path: &Path,
    folder: &str,
    text: &str,
    dir: PathBuf,
    trusted_dir: bool,
) -> Result<Skill, SkillError> {
    let Some((front, body)) = split(text) else {
        return Err(invalid(
            path,
            "front matter",
            "missing: the file must start with YAML front matter between two '---' lines",
        ));
    };
    let value: Value = serde_yaml_ng::from_str(front).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" (line {}, column {})", l.line() + 1, l.column()))
            .unwrap_or_default();
        invalid(path, "front matter", format!("not valid YAML{at}: {e}"))
    })?;
    let Value::Object(fields) = value else {
        return Err(invalid(path, "front matter", "must be a mapping of fields"));
    };
    let text_field = |key: &str| -> Result<Option<&str>, SkillError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(invalid(
                path,
                key,
                format!("must be text, found {}", kind(other)),
            )),
        }
    };
    let name = text_field("name")?.ok_or_else(|| invalid(path, "name", "required"))?;
    check_name(name).map_err(|m| invalid(path, "name", m))?;
    if name != folder {
        return Err(invalid(
            path,
            "name",
            format!("'{name}' must equal its folder's name '{folder}'"),
        ));
    }
    let description =
        text_field("description")?.ok_or_else(|| invalid(path, "description", "required"))?;
    let chars = description.chars().count();
    if description.trim().is_empty() || chars > MAX_DESCRIPTION {
        return Err(invalid(
            path,
            "description",
            format!("must be 1 to {MAX_DESCRIPTION} characters, found {chars}"),
        ));
    }
    text_field("license")?;
    if let Some(c) = text_field("compatibility")? {
        let n = c.chars().count();
        if c.trim().is_empty() || n > MAX_COMPATIBILITY {
            return Err(invalid(
                path,
                "compatibility",
                format!("must be 1 to {MAX_COMPATIBILITY} characters, found {n}"),
            ));
        }
    }
    match fields.get("allowed-tools") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
        Some(other) => {
            return Err(invalid(
                path,
                "allowed-tools",
                format!(
                    "must be a space-separated list of tool names, found {}",
                    kind(other)
                ),
            ))
        }
    }
    let mut requires_trust = !trusted_dir;
    match fields.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(meta)) => {
            for (k, v) in meta {
                if v.is_object() || v.is_array() {
                    return Err(invalid(
                        path,
                        &format!("metadata.{k}"),
                        format!("must be a plain value (text), found {}", kind(v)),
                    ));
                }
            }
            match meta.get("requires-trust") {
                None => {}
                Some(Value::Bool(b)) => requires_trust |= *b,
                Some(Value::String(s)) if s == "true" || s == "false" => {
                    requires_trust |= s == "true"
                }
                Some(other) => {
                    return Err(invalid(
                        path,
                        "metadata.requires-trust",
                        format!("must be true or false, found {other}"),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                path,
                "metadata",
                format!("must be a mapping of keys to values, found {}", kind(other)),
            ))
        }
    }
    Ok(Skill {
        name: name.to_owned(),
        description: description.to_owned(),
        body: body.trim().to_owned(),
        dir,
        requires_trust,
        front_matter: fields.clone(),
    })
}

/// The format's rule for `name`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if name.is_empty() || name.len() > MAX_NAME || !ok_chars {
        return Err(format!(
            "'{name}' must be 1 to {MAX_NAME} lower-case letters, digits and hyphens"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(format!(
            "'{name}' must not start or end with a hyphen, nor hold two in a row"
        ));
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(folder: &str, text: &str) -> Result<Skill, SkillError> {
        parse(
            Path::new("x/SKILL.md"),
            folder,
            text,
            PathBuf::from("x"),
            true,
        )
    }

    #[test]
    fn a_valid_skill_keeps_every_field() {
        let s = parse_text(
            "pdf-forms",
            "---\nname: pdf-forms\ndescription: Fill PDF forms.\nlicense: MIT\nallowed-tools: Read Write\nmetadata:\n  author: ops\n  requires-trust: true\nx-custom: kept\n---\n# Body\nDo it.\n",
        )
        .unwrap();
        assert_eq!(s.name, "pdf-forms");
        assert_eq!(s.body, "# Body\nDo it.");
        assert!(s.requires_trust);
        assert_eq!(s.front_matter["x-custom"], "kept");
        assert_eq!(s.front_matter["license"], "MIT");
    }

    #[test]
    fn bad_files_name_the_field() {
        let cases = [
            ("a", "no front matter", "front matter"),
            ("a", "---\nname: a\n", "front matter"),
            ("a", "---\nname: [a\n---\n", "front matter"),
            ("a", "---\ndescription: d\n---\n", "name"),
            ("Bad", "---\nname: Bad\ndescription: d\n---\n", "name"),
            ("a-", "---\nname: a-\ndescription: d\n---\n", "name"),
            ("a--b", "---\nname: a--b\ndescription: d\n---\n", "name"),
            ("b", "---\nname: a\ndescription: d\n---\n", "name"),
            ("a", "---\nname: a\n---\n", "description"),
            ("a", "---\nname: a\ndescription: 3\n---\n", "description"),
            (
                "a",
                "---\nname: a\ndescription: d\nmetadata: 3\n---\n",
                "metadata",
            ),
            (
                "a",
                "---\nname: a\ndescription: d\nmetadata:\n  requires-trust: maybe\n---\n",
                "metadata.requires-trust",
            ),
            (
                "a",
                "---\nname: a\ndescription: d\ncompatibility: ''\n---\n",
                "compatibility",
            ),
            (
                "a",
                "---\nname: a\ndescription: d\nallowed-tools: {x: 1}\n---\n",
                "allowed-tools",
            ),
        ];
        for (folder, text, field) in cases {
            match parse_text(folder, text) {
                Err(SkillError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let long = format!("---\nname: a\ndescription: {}\n---\n", "d".repeat(1025));
        assert!(
            matches!(parse_text("a", &long), Err(SkillError::Invalid { field, .. }) if field == "description")
        );
        let name = "a".repeat(65);
        let text = format!("---\nname: {name}\ndescription: d\n---\n");
        assert!(parse_text(&name, &text).is_err());
    }
}
