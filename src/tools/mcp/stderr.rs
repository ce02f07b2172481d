//! The last lines a stdio MCP server wrote to its stderr.
//!
//! A server that fails to start usually says why on stderr, so start-up errors
//! and "server exited" reasons quote it. The pipe is drained continuously (a
//! chatty server must never block on a full pipe) into a small ring of lines,
//! each also logged at `debug`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;

/// Lines kept.
const MAX_LINES: usize = 40;
/// Characters kept of one line.
const MAX_LINE_CHARS: usize = 500;

/// The tail of one process's stderr.
#[derive(Clone)]
pub(crate) struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    eof: watch::Receiver<bool>,
}

impl StderrTail {
    /// Starts draining `pipe` in a task of its own.
    pub(crate) fn spawn(pipe: impl AsyncRead + Unpin + Send + 'static, server: String) -> Self {
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let (eof_tx, eof) = watch::channel(false);
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&buf);
                        let line: String = text.trim_end().chars().take(MAX_LINE_CHARS).collect();
                        tracing::debug!(mcp_server = %server, "stderr: {line}");
                        // A poisoned lock only means another thread panicked
                        // mid-push; the lines are still usable.
                        let mut lines = sink.lock().unwrap_or_else(|p| p.into_inner());
                        if lines.len() == MAX_LINES {
                            lines.pop_front();
                        }
                        lines.push_back(line);
                    }
                }
            }
            let _ = eof_tx.send(true);
        });
        Self { lines, eof }
    }

    /// Waits (at most `patience`) until the pipe is closed, so that a process
    /// that just died has had its last words read.
    pub(crate) async fn settle(&self, patience: Duration) {
        let mut eof = self.eof.clone();
        let _ = tokio::time::timeout(patience, eof.wait_for(|done| *done)).await;
    }

    /// The kept lines, oldest first, joined by newlines (empty if none).
    pub(crate) fn text(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .iter()
            .filter(|l| !l.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_the_last_lines_and_sees_the_end() {
        let mut input = String::new();
        for i in 0..100 {
            input.push_str(&format!("line {i}\n"));
        }
        input.push_str("no newline at the end");
        let tail = StderrTail::spawn(std::io::Cursor::new(input.into_bytes()), "t".into());
        tail.settle(Duration::from_secs(5)).await;
        let text = tail.text();
        assert!(text.ends_with("line 99\nno newline at the end"), "{text}");
        assert!(!text.contains("line 60\n"));
        assert_eq!(text.lines().count(), MAX_LINES);
    }
}
