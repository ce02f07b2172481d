//! `read_text_file` and `write_text_file`: tools the editor executes. An
//! agent that lists them gets them in sessions whose client advertises
//! `fs.readTextFile` / `fs.writeTextFile` (they are narrowed out of the
//! others' scope at `session/new`); a call goes to the client as
//! `fs/read_text_file` or `fs/write_text_file` for the calling tree's ACP
//! session. They pass through the same approval rules as any tool: reading
//! needs no approval by default, writing does.
//!
//! They exist only under `overseer acp`; the connection they speak on is
//! set once the client has initialized.

use std::sync::{Arc, OnceLock};

use agent_client_protocol::v1::schema::{ReadTextFileRequest, WriteTextFileRequest};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Client;
use serde_json::{json, Value};

use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec};

/// Name of the read tool.
pub(crate) const READ_TEXT_FILE: &str = "read_text_file";
/// Name of the write tool.
pub(crate) const WRITE_TEXT_FILE: &str = "write_text_file";

/// The client connection, once there is one.
pub(crate) type ClientSlot = Arc<OnceLock<ConnectionTo<Client>>>;

/// Both tools, speaking on `client`.
pub(crate) fn tools(client: &ClientSlot) -> Vec<Arc<dyn Tool>> {
    let read = ToolSpec::new(
        READ_TEXT_FILE,
        "Reads a text file through the user's editor (unsaved changes included). `path` is absolute; `line` (1-based) and `limit` select lines.",
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Absolute path of the file."},
                "line": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    )
    .with_approval(false)
    .with_timeout(60);
    let write = ToolSpec::new(
        WRITE_TEXT_FILE,
        "Writes a text file through the user's editor, creating it if needed. `path` is absolute.",
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Absolute path of the file."},
                "content": {"type": "string"}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    )
    .with_approval(true)
    .with_timeout(60);
    vec![
        Arc::new(ClientFs {
            spec: read,
            client: client.clone(),
        }),
        Arc::new(ClientFs {
            spec: write,
            client: client.clone(),
        }),
    ]
}

struct ClientFs {
    spec: ToolSpec,
    client: ClientSlot,
}

fn text(args: &Value, key: &str) -> Result<String, ToolError> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ToolError::new(format!("{key}: a string is required")))
}

fn line_arg(args: &Value, key: &str) -> Option<u32> {
    args.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

#[async_trait::async_trait]
impl Tool for ClientFs {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, args: Value) -> Result<Value, ToolError> {
        let Some(client) = self.client.get() else {
            return Err(ToolError::new("no editor is connected"));
        };
        // The editor knows the tree by its root: the ACP session.
        let session = ctx
            .scope
            .root_session_id
            .unwrap_or(ctx.session_id)
            .to_string();
        let path = text(&args, "path")?;
        if !std::path::Path::new(&path).is_absolute() {
            return Err(ToolError::new(format!(
                "path: must be absolute, got '{path}'"
            )));
        }
        let refused = |e: agent_client_protocol::Error| {
            let detail = e
                .data
                .as_ref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            ToolError::new(format!("the editor refused: {}{detail}", e.message))
        };
        if self.spec.name == READ_TEXT_FILE {
            let request = ReadTextFileRequest::new(session, path)
                .line(line_arg(&args, "line"))
                .limit(line_arg(&args, "limit"));
            let response = client
                .send_request(request)
                .block_task()
                .await
                .map_err(refused)?;
            Ok(json!({ "content": response.content }))
        } else {
            let content = text(&args, "content")?;
            let bytes = content.len();
            client
                .send_request(WriteTextFileRequest::new(session, path.clone(), content))
                .block_task()
                .await
                .map_err(refused)?;
            Ok(json!({ "written": path, "bytes": bytes }))
        }
    }
}
