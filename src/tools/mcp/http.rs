//! The HTTP client of streamable HTTP MCP servers: rmcp's reqwest client,
//! plus the caller's scope token as `Authorization: Bearer` on each tool call.
//!
//! rmcp sends one connection's requests from a worker task with one fixed
//! `Authorization` value, but a scope token belongs to one call (its session,
//! its call id). So the tool puts the token in the call's `_meta` under
//! [`SCOPE_TOKEN_META_KEY`], and this client, which sees each message just
//! before it is written, moves it from the body to the header. Nothing else
//! (handshake, listing, the server's event stream) carries a token: no call
//! is being made for anyone then.
//!
//! It also makes a server's refusal of a stale session recognisable to rmcp
//! (see [`session_refused`]), so that after a server restart rmcp opens a new
//! session and retries the request once instead of letting it wait for its
//! timeout.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde_json::Value;

/// `_meta` key of a `tools/call` request that carries the scope token from the
/// tool to this client. Removed before the request is sent.
pub const SCOPE_TOKEN_META_KEY: &str = "dev.overseer/scope_token";

/// An rmcp HTTP client that turns a call's scope token into its bearer token.
#[derive(Clone)]
pub(crate) struct ScopedClient<C> {
    inner: C,
}

impl<C> ScopedClient<C> {
    pub(crate) fn new(inner: C) -> Self {
        Self { inner }
    }
}

/// The reqwest client of HTTP servers: no redirects (a POST of a JSON-RPC
/// message must not turn into a GET, nor a token follow a redirect to another
/// host), and no idle pooling (rmcp's advice: a reused connection whose last
/// response was not fully read stalls on delayed ACKs).
pub(crate) fn reqwest_client() -> Result<reqwest_mcp::Client, reqwest_mcp::Error> {
    // reqwest is built without a default TLS provider; building a client
    // needs one even for plain HTTP. Installing is idempotent across crates.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest_mcp::Client::builder()
        .redirect(reqwest_mcp::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
}

/// Removes the scope token from a `tools/call` message, returning it.
fn take_scope_token(message: &mut ClientJsonRpcMessage) -> Option<String> {
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &mut request.request else {
        return None;
    };
    let meta = call.params.meta.as_mut()?;
    match meta.0 .0.remove(SCOPE_TOKEN_META_KEY)? {
        Value::String(token) => Some(token),
        _ => None,
    }
}

/// The id of a request message (`None` for notifications and answers).
fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

/// `response` to a request sent in a session, with the server's refusal of
/// that session reported as rmcp's `SessionExpired`.
///
/// rmcp re-initializes the session and retries the request once when a POST
/// in a session is answered 404, the MCP spec's answer to an unknown
/// `Mcp-Session-Id`. Some servers answer 400 with a JSON-RPC error that
/// carries no id instead (server-everything, the reference servers' example,
/// does after a restart); rmcp cannot match such an error to the request and
/// drops it, so the call would wait for its timeout. A request in a session
/// answered with an error for no request (or for another one) was refused
/// before the server read it, which for a well-formed request means the
/// session: it is reported as the 404 it stands for.
fn session_refused<E: std::error::Error + Send + Sync + 'static>(
    request: Option<RequestId>,
    in_session: bool,
    response: Result<StreamableHttpPostResponse, StreamableHttpError<E>>,
) -> Result<StreamableHttpPostResponse, StreamableHttpError<E>> {
    let Some(request) = request.filter(|_| in_session) else {
        return response;
    };
    match response {
        Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _))
            if error.id.as_ref() != Some(&request) =>
        {
            tracing::debug!(
                "the MCP server refused the session ({}: {}); re-initializing",
                error.error.code.0,
                error.error.message
            );
            Err(StreamableHttpError::SessionExpired)
        }
        other => other,
    }
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for ScopedClient<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let auth = take_scope_token(&mut message).or(auth_header);
        let (id, in_session) = (request_id(&message), session_id.is_some());
        let response = self
            .inner
            .post_message(uri, message, session_id, auth, custom_headers)
            .await;
        session_refused(id, in_session, response)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let auth = take_scope_token(&mut message).or(auth_header);
        let (id, in_session) = (request_id(&message), session_id.is_some());
        let response = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        session_refused(id, in_session, response)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let auth = take_scope_token(&mut message).or(auth_header);
        let (id, in_session) = (request_id(&message), session_id.is_some());
        let response = self
            .inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth,
                custom_headers,
                limits,
            )
            .await;
        session_refused(id, in_session, response)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, JsonRpcRequest, RequestId, RequestMetaObject,
    };

    fn call_with_meta(meta: Option<RequestMetaObject>) -> ClientJsonRpcMessage {
        let mut params = CallToolRequestParams::new("echo");
        params.meta = meta;
        JsonRpcMessage::Request(JsonRpcRequest::new(
            RequestId::Number(1),
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
        ))
    }

    type Answer = Result<StreamableHttpPostResponse, StreamableHttpError<std::io::Error>>;

    fn error_answer(id: Option<RequestId>) -> Answer {
        let message: rmcp::model::ServerJsonRpcMessage = serde_json::from_value(match id {
            Some(id) => serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "no"}}),
            None => serde_json::json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}),
        })
        .unwrap();
        Ok(StreamableHttpPostResponse::Json(message, None))
    }

    fn is_expired(answer: &Answer) -> bool {
        matches!(answer, Err(StreamableHttpError::SessionExpired))
    }

    #[test]
    fn an_error_for_no_request_in_a_session_is_a_refused_session() {
        let id = Some(RequestId::Number(7));
        assert!(is_expired(&session_refused(
            id.clone(),
            true,
            error_answer(None)
        )));
        assert!(is_expired(&session_refused(
            id.clone(),
            true,
            error_answer(Some(RequestId::Number(8)))
        )));
        // The server's answer to the request itself is the call's result.
        assert!(!is_expired(&session_refused(
            id.clone(),
            true,
            error_answer(id.clone())
        )));
        // Without a session (initialize) or without a request (a
        // notification) there is no session to renew.
        assert!(!is_expired(&session_refused(id, false, error_answer(None))));
        assert!(!is_expired(&session_refused(
            None,
            true,
            error_answer(None)
        )));
    }

    #[test]
    fn the_token_moves_out_of_the_body() {
        let mut meta = RequestMetaObject::new();
        meta.0
             .0
            .insert(SCOPE_TOKEN_META_KEY.into(), Value::String("tok".into()));
        meta.0 .0.insert("progressToken".into(), Value::from(3));
        let mut message = call_with_meta(Some(meta));
        assert_eq!(take_scope_token(&mut message).as_deref(), Some("tok"));
        let body = serde_json::to_value(&message).unwrap();
        assert!(!body.to_string().contains("tok\""), "{body}");
        assert_eq!(body["params"]["_meta"]["progressToken"], 3);
        // Gone once taken: a retried message carries none.
        assert_eq!(take_scope_token(&mut message), None);
        assert_eq!(take_scope_token(&mut call_with_meta(None)), None);
    }
}
