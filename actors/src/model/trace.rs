//! The W3C trace context a session carries in its header, so that the spans
//! of a turn resumed after a restart, a hibernation or a failover join the
//! trace the turn started in (issue 30).
//!
//! Plain data: two `traceparent` strings
//! (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`). It deliberately
//! knows nothing of spans or exporters: [`crate::genai`] makes and reads
//! them, the `overseer` crate's telemetry turns them into OpenTelemetry
//! contexts.

use serde::{Deserialize, Serialize};

/// Where a session's current turn sits in a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceLink {
    /// The turn's parent: the caller's `traceparent` (on create or on a
    /// message), or, for a child session, its parent's `delegate_task` span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The current turn's own span (`invoke_agent`): a turn resumed in
    /// another actor continues this trace and links to this span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<String>,
}

/// Whether `value` is a well-formed W3C `traceparent` of version 00 with a
/// non-zero trace id and span id.
pub fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match parts.as_slice() {
        [version, trace, span, flags] => {
            hex(version, 2)
                && *version != "ff"
                && hex(trace, 32)
                && trace.bytes().any(|b| b != b'0')
                && hex(span, 16)
                && span.bytes().any(|b| b != b'0')
                && hex(flags, 2)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_checked() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!is_traceparent(bad), "{bad}");
        }
    }
}
