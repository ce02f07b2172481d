//! `http_request`: the built-in tool that lets a model send one HTTP request
//! to an allow-listed host.
//!
//! This module owns the allow-list ([`AllowList`]: an entry matches a host
//! exactly, or as a suffix at a dot boundary), the check of every URL before
//! any connection is made, redirects followed by hand so that each hop is
//! checked against the same list, the response-size cap and the shape of the
//! result (`{"status", "headers", "body"}`). Whether a human approves the
//! request first is the approval policy's (`requires_approval` defaults to
//! true here); the timeout and result cap are also the runtime's
//! (`overseer_actors::tool_call`), with a deadline kept here as well.
//!
//! It deliberately checks host *names*, not the addresses they resolve to:
//! an allow-listed name that resolves to an internal address is reachable.
//! List names you control, and IP literals only for addresses you mean.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec};
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE,
    COOKIE, HOST, LOCATION, PROXY_AUTHORIZATION, TRANSFER_ENCODING,
};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::http_tool::{
    error_chain, is_json, read_capped, too_large, transport_message, BodyError, CONNECT_TIMEOUT,
};

/// Default `max_response_bytes`: a body the model will read, so far below
/// the 10 MiB result cap.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Default `timeout_secs`.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Most redirects followed for one call.
pub const MAX_REDIRECTS: usize = 10;

/// Response headers copied into the result: the ones a model can act on.
const RESULT_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-language",
    "location",
    "etag",
    "last-modified",
    "cache-control",
    "retry-after",
];

/// Request headers the model may not set: they would change where or how the
/// request goes (`Host` could reach another virtual host than the URL's).
const FORBIDDEN_HEADERS: &[HeaderName] = &[HOST, CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION];

/// Configuration of `http_request` (e.g. a `[http_request]` table).
///
/// ```toml
/// [http_request]
/// allow_hosts = ["api.example.com", ".internal.example", "127.0.0.1"]
/// max_response_bytes = 1048576
/// timeout_secs = 30
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestConfig {
    /// Hosts it may reach. An entry matches the host itself and, for a
    /// name, its subdomains (`example.com` allows `api.example.com`, not
    /// `badexample.com`; `.example.com` means the same). IP literals match
    /// exactly. Empty: every request is refused.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Largest response body read; a longer one fails the call (default 1 MiB).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// Seconds for the whole call, redirects included (default 60).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Whether the `per_tool` policy asks a human first (default true).
    #[serde(default = "yes")]
    pub requires_approval: bool,
}

impl Default for HttpRequestConfig {
    fn default() -> Self {
        Self {
            allow_hosts: Vec::new(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            requires_approval: true,
        }
    }
}

fn default_max_response_bytes() -> usize {
    DEFAULT_MAX_RESPONSE_BYTES
}

fn default_timeout_secs() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

fn yes() -> bool {
    true
}

/// Why `http_request` could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpRequestError {
    /// An allow-list entry is not a host.
    #[error("http_request: allow-list entry '{entry}' {reason}")]
    InvalidHost {
        /// The entry as configured.
        entry: String,
        /// Why.
        reason: String,
    },
    /// Another setting is out of range.
    #[error("http_request: {field} {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("http_request: could not build the HTTP client: {0}")]
    Client(String),
}

/// One allow-list entry, normalized the way [`Url`] normalizes hosts
/// (lower case, IDNA, canonical IP literals), so both sides compare alike.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// An IP literal (`127.0.0.1`, `[::1]`): only itself.
    Ip(String),
    /// A name: itself and its subdomains.
    Domain(String),
}

/// The hosts `http_request` may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// Parses and normalizes entries; an entry with a scheme, port, path or
    /// wildcard is refused so that a typo does not silently allow nothing.
    pub fn new(entries: &[String]) -> Result<Self, HttpRequestError> {
        entries
            .iter()
            .map(|e| parse_entry(e))
            .collect::<Result<Vec<_>, _>>()
            .map(|entries| Self { entries })
    }

    /// Whether `host` (as [`Url::host_str`] gives it) is allowed.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.entries.iter().any(|entry| match entry {
            Entry::Ip(ip) => host == ip,
            Entry::Domain(domain) => {
                host == domain
                    || (!is_ip_literal(host)
                        && host
                            .strip_suffix(domain.as_str())
                            .is_some_and(|rest| rest.ends_with('.')))
            }
        })
    }

    /// The normalized entries, for messages.
    pub fn hosts(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Ip(h) | Entry::Domain(h) => h.clone(),
            })
            .collect()
    }

    fn describe(&self) -> String {
        if self.entries.is_empty() {
            "the allow-list is empty".to_owned()
        } else {
            format!("allowed: {}", self.hosts().join(", "))
        }
    }
}

fn parse_entry(raw: &str) -> Result<Entry, HttpRequestError> {
    let invalid = |reason: &str| HttpRequestError::InvalidHost {
        entry: raw.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = raw.trim();
    let name = trimmed.strip_prefix('.').unwrap_or(trimmed);
    let name = name.trim_end_matches('.');
    if name.is_empty() {
        return Err(invalid("is empty"));
    }
    if name.contains('*') {
        return Err(invalid(
            "holds a wildcard; a name already allows its subdomains",
        ));
    }
    let bare_v6 = name.parse::<Ipv6Addr>().is_ok();
    let bracketed_v6 = name.starts_with('[') && name.ends_with(']');
    if name.contains(['/', '@', '?', '#', ' ']) || (name.contains(':') && !bare_v6 && !bracketed_v6)
    {
        return Err(invalid(
            "must be a host name or IP address, without scheme, port or path",
        ));
    }
    let candidate = if bare_v6 {
        format!("[{name}]")
    } else {
        name.to_owned()
    };
    let url = Url::parse(&format!("http://{candidate}/"))
        .map_err(|e| invalid(&format!("is not a valid host: {e}")))?;
    let host = url
        .host_str()
        .ok_or_else(|| invalid("is not a valid host"))?
        .trim_end_matches('.')
        .to_owned();
    Ok(if is_ip_literal(&host) {
        Entry::Ip(host)
    } else {
        Entry::Domain(host)
    })
}

/// Whether a normalized host is an IP literal (suffix rules do not apply).
fn is_ip_literal(host: &str) -> bool {
    host.starts_with('[') || host.parse::<Ipv4Addr>().is_ok()
}

/// The `http_request` tool.
#[derive(Debug)]
pub struct HttpRequestTool {
    spec: ToolSpec,
    allow: AllowList,
    client: reqwest::Client,
    max_response_bytes: usize,
}

/// The arguments (validated against the schema before dispatch).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    method: String,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<Value>,
}

impl HttpRequestTool {
    /// The tool's name.
    pub const NAME: &'static str = "http_request";

    /// The tool, with its allow-list checked and its client built.
    pub fn new(cfg: HttpRequestConfig) -> Result<Self, HttpRequestError> {
        let allow = AllowList::new(&cfg.allow_hosts)?;
        if cfg.timeout_secs == 0 {
            return Err(HttpRequestError::Invalid {
                field: "timeout_secs",
                reason: "must be at least 1".into(),
            });
        }
        if cfg.max_response_bytes == 0 {
            return Err(HttpRequestError::Invalid {
                field: "max_response_bytes",
                reason: "must be at least 1".into(),
            });
        }
        // reqwest is built without a bundled crypto provider; installing it
        // twice is a harmless no-op.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(Duration::from_secs(cfg.timeout_secs)))
            // Redirects are followed by `call`, which checks each hop.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("overseer/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HttpRequestError::Client(error_chain(&e)))?;
        let parameters = json!({
            "type": "object",
            "properties": {
                "method": {
                    "type": "string",
                    "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                    "description": "HTTP method."
                },
                "url": {
                    "type": "string",
                    "description": "Absolute http or https URL on an allowed host."
                },
                "headers": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Request headers."
                },
                "body": {
                    "description": "Request body: a string is sent as text, any other JSON value as JSON."
                }
            },
            "required": ["method", "url"],
            "additionalProperties": false
        });
        let hosts = allow.hosts();
        let description = format!(
            "Sends one HTTP request and returns {{\"status\", \"headers\", \"body\"}} (body as JSON when the response is JSON, else text). Only these hosts and their subdomains may be reached: {}.",
            if hosts.is_empty() {
                "none".to_owned()
            } else {
                hosts.join(", ")
            }
        );
        let spec = ToolSpec::new(Self::NAME, description, parameters)
            .with_approval(cfg.requires_approval)
            .with_timeout(cfg.timeout_secs)
            // A POST may have effects: never re-run on its own after a crash.
            .idempotent(false);
        Ok(Self {
            spec,
            allow,
            client,
            max_response_bytes: cfg.max_response_bytes,
        })
    }

    /// The allow-list in use.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Refuses a URL whose scheme or host is not allowed; `redirect` is the
    /// status and `Location` when the URL comes from a redirect.
    fn check(&self, url: &Url, redirect: Option<(StatusCode, &str)>) -> Result<(), ToolError> {
        let refused = |message: String, host: Option<&str>| {
            let mut details = json!({"allow_hosts": self.allow.hosts()});
            if let Some(host) = host {
                details["host"] = json!(host);
            }
            if let Some((status, location)) = redirect {
                details["status"] = json!(status.as_u16());
                details["location"] = json!(location);
            }
            ToolError {
                message,
                details: Some(details),
            }
        };
        let prefix = match redirect {
            Some(_) => "http_request: redirect refused: ",
            None => "http_request: ",
        };
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refused(
                format!(
                    "{prefix}only http and https URLs are allowed, not '{}'",
                    url.scheme()
                ),
                None,
            ));
        }
        let Some(host) = url.host_str() else {
            return Err(refused(format!("{prefix}the URL has no host"), None));
        };
        if !self.allow.allows(host) {
            return Err(refused(
                format!(
                    "{prefix}host '{host}' is not in the allow-list ({})",
                    self.allow.describe()
                ),
                Some(host),
            ));
        }
        Ok(())
    }
}

/// Where a response redirects to, if it is a redirect with a `Location`.
fn redirect_target(response: &reqwest::Response, from: &Url) -> Option<Result<Url, String>> {
    if !matches!(
        response.status(),
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    ) {
        return None;
    }
    let location = response.headers().get(LOCATION)?;
    Some(
        location
            .to_str()
            .map_err(|_| "the Location header is not text".to_owned())
            .and_then(|l| from.join(l).map_err(|e| format!("bad Location '{l}': {e}"))),
    )
}

/// The request headers of the arguments, with the forbidden ones refused.
fn request_headers(args: &BTreeMap<String, String>) -> Result<HeaderMap, ToolError> {
    let mut map = HeaderMap::new();
    for (name, value) in args {
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            ToolError::new(format!("http_request: '{name}' is not a valid header name"))
        })?;
        if FORBIDDEN_HEADERS.contains(&header) {
            return Err(ToolError::new(format!(
                "http_request: header '{name}' may not be set"
            )));
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            ToolError::new(format!(
                "http_request: the value of header '{name}' is not a valid header value"
            ))
        })?;
        map.append(header, value);
    }
    Ok(map)
}

/// The body bytes and their default content type.
fn request_body(body: Option<Value>) -> Result<Option<(Vec<u8>, &'static str)>, ToolError> {
    match body {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some((text.into_bytes(), "text/plain; charset=utf-8"))),
        Some(other) => serde_json::to_vec(&other)
            .map(|bytes| Some((bytes, "application/json")))
            .map_err(|e| ToolError::new(format!("http_request: body is not serializable: {e}"))),
    }
}

#[async_trait::async_trait]
impl Tool for HttpRequestTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let deadline = Instant::now() + Duration::from_secs(self.spec.timeout_secs);
        let args: Args = serde_json::from_value(arguments)
            .map_err(|e| ToolError::new(format!("http_request: invalid arguments: {e}")))?;
        let mut method =
            Method::from_bytes(args.method.to_ascii_uppercase().as_bytes()).map_err(|_| {
                ToolError::new(format!(
                    "http_request: '{}' is not an HTTP method",
                    args.method
                ))
            })?;
        let mut url = Url::parse(&args.url).map_err(|e| {
            ToolError::new(format!(
                "http_request: '{}' is not a valid URL: {e}",
                args.url
            ))
        })?;
        // Before anything else touches the network.
        self.check(&url, None)?;
        let mut headers = request_headers(&args.headers)?;
        let mut body = request_body(args.body)?;
        if let Some((_, content_type)) = &body {
            if !headers.contains_key(CONTENT_TYPE) {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            }
        }
        let mut redirects = 0;
        loop {
            let origin = url.origin().ascii_serialization();
            let timed_out = || ToolError {
                message: format!(
                    "http_request: no answer from {origin} within {} s",
                    self.spec.timeout_secs
                ),
                details: Some(json!({"timed_out": true})),
            };
            let transport = |e: &reqwest::Error| {
                let what = if e.is_connect() {
                    "could not connect to"
                } else {
                    "request failed to"
                };
                ToolError::new(format!(
                    "http_request: {what} {origin}: {}",
                    transport_message(e)
                ))
            };
            let mut request = self
                .client
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            // The call's `execute_tool` span (telemetry on) is the parent.
            if let Some(traceparent) = crate::telemetry::traceparent() {
                request = request.header("traceparent", traceparent);
            }
            if let Some((bytes, _)) = &body {
                request = request.body(bytes.clone());
            }
            let mut response = match tokio::time::timeout_at(deadline, request.send()).await {
                Err(_) => return Err(timed_out()),
                Ok(Err(e)) => return Err(transport(&e)),
                Ok(Ok(response)) => response,
            };
            let status = response.status();
            if let Some(target) = redirect_target(&response, &url) {
                let next = target.map_err(|reason| {
                    ToolError::new(format!("http_request: redirect refused: {reason}"))
                })?;
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(ToolError::new(format!(
                        "http_request: more than {MAX_REDIRECTS} redirects"
                    )));
                }
                self.check(&next, Some((status, next.as_str())))?;
                // What browsers (and reqwest) do: 303, and 301/302 after a
                // POST, continue as a body-less GET.
                let to_get = (status == StatusCode::SEE_OTHER && method != Method::HEAD)
                    || (matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                        && method == Method::POST);
                if to_get {
                    method = Method::GET;
                    body = None;
                    headers.remove(CONTENT_TYPE);
                }
                // Credentials given for one origin are not handed to another.
                if next.origin() != url.origin() {
                    headers.remove(AUTHORIZATION);
                    headers.remove(COOKIE);
                    headers.remove(PROXY_AUTHORIZATION);
                }
                url = next;
                continue;
            }
            let json = is_json(response.headers());
            let copied: serde_json::Map<String, Value> = RESULT_HEADERS
                .iter()
                .filter_map(|name| {
                    let value = response.headers().get(*name)?.to_str().ok()?;
                    Some(((*name).to_owned(), Value::String(value.to_owned())))
                })
                .collect();
            let bytes = match tokio::time::timeout_at(
                deadline,
                read_capped(&mut response, self.max_response_bytes),
            )
            .await
            {
                Err(_) => return Err(timed_out()),
                Ok(Err(BodyError::TooLarge)) => {
                    return Err(too_large("http_request:", self.max_response_bytes))
                }
                Ok(Err(BodyError::Transport(e))) => return Err(transport(&e)),
                Ok(Ok(bytes)) => bytes,
            };
            // JSON that does not parse is still shown, as text: a model can
            // read a broken answer, and the request did happen.
            let body = json
                .then(|| serde_json::from_slice::<Value>(&bytes).ok())
                .flatten()
                .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            let mut result = json!({
                "status": status.as_u16(),
                "headers": copied,
                "body": body,
            });
            if redirects > 0 {
                result["url"] = json!(url.as_str());
            }
            return Ok(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::new(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn entries_match_exactly_or_as_a_dot_suffix() {
        let l = list(&["example.com", ".internal.test", "127.0.0.1", "::1"]);
        assert!(l.allows("example.com"));
        assert!(l.allows("api.example.com"));
        assert!(l.allows("a.b.example.com"));
        assert!(l.allows("example.com."));
        assert!(!l.allows("badexample.com"));
        assert!(!l.allows("example.com.evil.net"));
        assert!(!l.allows("com"));
        assert!(l.allows("internal.test"));
        assert!(l.allows("svc.internal.test"));
        assert!(l.allows("127.0.0.1"));
        assert!(!l.allows("0.0.1"));
        assert!(!l.allows("127.0.0.10"));
        assert!(l.allows("[::1]"));
        assert!(!l.allows("localhost"));
    }

    #[test]
    fn ip_entries_do_not_match_by_suffix() {
        let l = list(&["0.0.1"]);
        // "0.0.1" is an IPv4 shorthand for 0.0.0.1: only that address.
        assert!(!l.allows("127.0.0.1"));
        assert!(l.allows("0.0.0.1"));
    }

    #[test]
    fn entries_are_normalized_like_urls() {
        let l = list(&["API.Example.COM", "[::1]"]);
        assert_eq!(l.hosts(), vec!["api.example.com", "[::1]"]);
        let url = Url::parse("http://API.example.com:8080/x").unwrap();
        assert!(l.allows(url.host_str().unwrap()));
    }

    #[test]
    fn malformed_entries_are_refused() {
        for bad in [
            "",
            ".",
            "https://example.com",
            "example.com:8080",
            "example.com/path",
            "*.example.com",
            "user@example.com",
        ] {
            assert!(
                AllowList::new(&[bad.to_owned()]).is_err(),
                "'{bad}' should be refused"
            );
        }
    }

    #[test]
    fn config_defaults() {
        let cfg: HttpRequestConfig = toml::from_str("allow_hosts = [\"example.com\"]").unwrap();
        assert_eq!(cfg.max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
        assert_eq!(cfg.timeout_secs, 60);
        assert!(cfg.requires_approval);
        assert!(toml::from_str::<HttpRequestConfig>("allow = []").is_err());
        let tool = HttpRequestTool::new(cfg).unwrap();
        assert!(tool.spec().requires_approval);
        assert!(!tool.spec().idempotent);
        assert!(tool.spec().description.contains("example.com"));
    }
}
