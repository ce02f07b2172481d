//! How the failures of rmcp read in overseer's error results and reasons.
//!
//! What an MCP call fails with reaches the model (and the operator's log) as
//! text, so it must be a plain sentence. Several of rmcp's `Display`s are not:
//! a transport error names its transport by `std::any::type_name` (`Transport
//! [rmcp::transport::worker::WorkerTransport<…>] error: …`), and some
//! handshake errors print values with `{:?}` (`Some("text/plain")`,
//! `ProtocolVersion("…")`). This module renders the errors overseer meets
//! from their parts instead, and falls back to an error's own message and
//! causes for anything else.
//!
//! It deliberately does not decide whether a server counts as unavailable;
//! that is the hub's (`super::Server::call_error`).

use std::error::Error;

use rmcp::service::ClientInitializeError;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::transport::DynamicTransportError;
use rmcp::ServiceError;

/// The transport error of an HTTP server's connection.
type HttpError = StreamableHttpError<reqwest_mcp::Error>;

/// `error` and its causes as plain text.
pub(crate) fn plain(error: &(dyn Error + 'static)) -> String {
    if let Some(e) = error.downcast_ref::<DynamicTransportError>() {
        // Its own message only adds the transport's Rust type name.
        return plain(e.error.as_ref());
    }
    if let Some(e) = error.downcast_ref::<HttpError>() {
        return http(e);
    }
    if let Some(e) = error.downcast_ref::<reqwest_mcp::Error>() {
        return request(e);
    }
    if let Some(e) = error.downcast_ref::<ServiceError>() {
        return service(e);
    }
    if let Some(e) = error.downcast_ref::<ClientInitializeError>() {
        return initialize(e);
    }
    with_causes(error)
}

/// A failed request to a connected server.
pub(crate) fn service(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(data) => format!("MCP error {}: {}", data.code.0, data.message),
        ServiceError::TransportSend(e) => plain(e),
        ServiceError::TransportClosed => "the connection closed".to_owned(),
        ServiceError::UnexpectedResponse => {
            "the server answered with a response of the wrong kind".to_owned()
        }
        ServiceError::Cancelled { reason } => match reason {
            Some(reason) => format!("the request was cancelled: {reason}"),
            None => "the request was cancelled".to_owned(),
        },
        ServiceError::Timeout { timeout } => {
            format!("no answer within {} ms", timeout.as_millis())
        }
        other => with_causes(other),
    }
}

/// A failed MCP handshake.
pub(crate) fn initialize(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::ExpectedInitResponse(_)
        | ClientInitializeError::ExpectedInitResult(_) => {
            "the server did not answer the initialize request with an initialize result".to_owned()
        }
        ClientInitializeError::TransportError { error, context } => {
            format!("{} (step: {context})", plain(error))
        }
        ClientInitializeError::ConnectionClosed(context) => {
            format!("the connection closed (step: {context})")
        }
        ClientInitializeError::JsonRpcError(data) => format!(
            "the server refused the initialize request: MCP error {}: {}",
            data.code.0, data.message
        ),
        ClientInitializeError::NoCompatibleProtocolVersion {
            client_supported,
            server_supported,
        } => {
            let list = |versions: &[rmcp::model::ProtocolVersion]| {
                versions
                    .iter()
                    .map(|v| v.as_str().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "no MCP protocol version both support (overseer: {}; the server: {})",
                list(client_supported),
                list(server_supported)
            )
        }
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => initialize(fallback),
        other => with_causes(other),
    }
}

/// A failure of the streamable HTTP transport.
fn http(error: &HttpError) -> String {
    match error {
        HttpError::Client(e) => request(e),
        HttpError::UnexpectedContentType(Some(content_type)) => format!(
            "the server answered with content type '{content_type}', neither JSON nor an event stream (is the url an MCP endpoint?)"
        ),
        HttpError::UnexpectedContentType(None) => {
            "the server answered without a content type (is the url an MCP endpoint?)".to_owned()
        }
        HttpError::SessionExpired => {
            "the server no longer accepts overseer's MCP session (it may have restarted), and a new session could not take over the request".to_owned()
        }
        HttpError::ReinitializationFailed(data) => format!(
            "the server refused a new MCP session: MCP error {}: {}",
            data.code.0, data.message
        ),
        HttpError::TransportChannelClosed => "the connection closed".to_owned(),
        other => with_causes(other),
    }
}

/// A failed HTTP exchange: what failed, and the root cause (a refused
/// connection, a reset) that reqwest's own message leaves out.
fn request(error: &reqwest_mcp::Error) -> String {
    let root = root_cause(error);
    let url = error
        .url()
        .map(|u| u.as_str().to_owned())
        .unwrap_or_else(|| "the server".to_owned());
    if error.is_connect() {
        return match root {
            Some(root) => format!("could not connect to {url}: {root}"),
            None => format!("could not connect to {url}"),
        };
    }
    if error.is_timeout() {
        return format!("no answer from {url} in time");
    }
    if let Some(status) = error.status() {
        return format!("{url} answered HTTP {status}");
    }
    match root {
        Some(root) => format!("{error}: {root}"),
        None => error.to_string(),
    }
}

/// The innermost cause of `error`, if it has any.
fn root_cause(error: &(dyn Error + 'static)) -> Option<String> {
    let mut cause = error.source()?;
    while let Some(next) = cause.source() {
        cause = next;
    }
    Some(cause.to_string())
}

/// `error`'s message, then each cause's that does not repeat it.
fn with_causes(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_and_content_type_errors_are_sentences() {
        let text = http(&HttpError::UnexpectedContentType(Some("text/plain".into())));
        assert_eq!(
            text,
            "the server answered with content type 'text/plain', neither JSON nor an event stream (is the url an MCP endpoint?)"
        );
        assert!(http(&HttpError::SessionExpired).starts_with("the server no longer accepts"));
        let e = ClientInitializeError::ExpectedInitResponse(None);
        assert!(!initialize(&e).contains("None"));
    }

    #[test]
    fn a_transport_error_loses_its_type_name() {
        let inner: Box<dyn Error + Send + Sync> = Box::new(HttpError::TransportChannelClosed);
        let e = DynamicTransportError::from_parts(
            std::any::type_name::<HttpError>(),
            std::any::TypeId::of::<HttpError>(),
            inner,
        );
        assert!(
            e.to_string().contains("::"),
            "rmcp's own text names the type"
        );
        assert_eq!(plain(&e), "the connection closed");
        assert_eq!(
            service(&ServiceError::TransportSend(e)),
            "the connection closed"
        );
    }
}
