//! `read_skill_resource {name, path}`: one file of an active skill's
//! folder, as text.
//!
//! The path is relative to the skill's folder and must stay inside it: an
//! absolute path or a `..` component is refused before anything is read,
//! and what the path resolves to (symlinks followed) must still lie under
//! the folder, so a link pointing out of it is refused too. A file larger
//! than a tool result may be (10 MiB) is refused by its size without
//! being read. Whether the session may read this skill (it must be one of
//! its skills, and active) is the session's to decide before the call runs.
//!
//! It deliberately only reads: a skill's `scripts/` are never executed by
//! overseer; running them is a tool's business, under approval.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use overseer_actors::skills::{read_resource_schema, SkillCatalog, READ_SKILL_RESOURCE};
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec, MAX_RESULT_BYTES};

/// The tool over the skills of `catalog`.
pub struct ReadSkillResource {
    spec: ToolSpec,
    catalog: Arc<SkillCatalog>,
}

impl ReadSkillResource {
    /// The tool.
    pub fn new(catalog: Arc<SkillCatalog>) -> Self {
        Self {
            spec: ToolSpec::new(
                READ_SKILL_RESOURCE,
                "Read a file of an active skill (e.g. one of its references/), by its path inside the skill's folder.",
                read_resource_schema(),
            )
            .idempotent(true),
            catalog,
        }
    }
}

/// Why a resource cannot be read: said to the model as the call's error.
fn refuse(message: String) -> ToolError {
    ToolError::new(message)
}

/// `path` if it is a plain relative path (no root, no `..`, not empty).
fn relative(path: &str) -> Result<PathBuf, ToolError> {
    let p = Path::new(path);
    if path.trim().is_empty() {
        return Err(refuse("path: must not be empty".into()));
    }
    for c in p.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(refuse(format!(
                    "path: '{path}' leaves the skill's folder ('..' is not allowed)"
                )))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(format!(
                    "path: '{path}' must be relative to the skill's folder"
                )))
            }
        }
    }
    Ok(p.to_path_buf())
}

/// Reads `rel` under `dir` (blocking).
fn read_under(dir: &Path, rel: &Path, shown: &str) -> Result<Value, ToolError> {
    let full = dir.join(rel);
    let real = full.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => refuse(format!("path: no file '{shown}' in the skill")),
        _ => refuse(format!("path: cannot read '{shown}': {e}")),
    })?;
    if !real.starts_with(dir) {
        return Err(refuse(format!(
            "path: '{shown}' leads outside the skill's folder (a link out of it is not followed)"
        )));
    }
    let meta = std::fs::metadata(&real)
        .map_err(|e| refuse(format!("path: cannot read '{shown}': {e}")))?;
    if !meta.is_file() {
        return Err(refuse(format!("path: '{shown}' is not a file")));
    }
    if meta.len() > MAX_RESULT_BYTES as u64 {
        return Err(ToolError {
            message: format!(
                "path: '{shown}' is {} bytes, over the maximum tool result of {MAX_RESULT_BYTES} bytes",
                meta.len()
            ),
            details: Some(json!({"actual_size": meta.len(), "truncated": true})),
        });
    }
    let bytes =
        std::fs::read(&real).map_err(|e| refuse(format!("path: cannot read '{shown}': {e}")))?;
    let content = String::from_utf8(bytes)
        .map_err(|_| refuse(format!("path: '{shown}' is not a text file (UTF-8)")))?;
    Ok(json!({"path": shown, "content": content}))
}

#[async_trait::async_trait]
impl Tool for ReadSkillResource {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let arg = |k: &str| {
            arguments
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (name, path) = (arg("name"), arg("path"));
        let skill = self
            .catalog
            .get(&name)
            .ok_or_else(|| refuse(format!("name: no skill named '{name}'")))?
            .clone();
        let rel = relative(&path)?;
        let mut value = tokio::task::spawn_blocking(move || read_under(&skill.dir, &rel, &path))
            .await
            .map_err(|e| refuse(format!("the read failed: {e}")))??;
        if let Value::Object(m) = &mut value {
            m.insert("skill".into(), Value::String(name));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_pass() {
        assert!(relative("references/a.md").is_ok());
        assert!(relative("./a.md").is_ok());
        for bad in ["", "../x", "a/../../x", "/etc/passwd", "references/../../x"] {
            assert!(relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_link_out_of_the_folder_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let skill = root.path().join("s");
        std::fs::create_dir_all(skill.join("references")).unwrap();
        std::fs::write(skill.join("references/ok.md"), "fine").unwrap();
        std::fs::write(root.path().join("secret.txt"), "secret").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.path().join("secret.txt"), skill.join("leak.md")).unwrap();
        let dir = skill.canonicalize().unwrap();
        let ok = read_under(&dir, Path::new("references/ok.md"), "references/ok.md").unwrap();
        assert_eq!(ok["content"], "fine");
        #[cfg(unix)]
        {
            let e = read_under(&dir, Path::new("leak.md"), "leak.md").unwrap_err();
            assert!(e.message.contains("outside"), "{e}");
        }
        let e = read_under(&dir, Path::new("missing.md"), "missing.md").unwrap_err();
        assert!(e.message.contains("no file"), "{e}");
    }
}
