//! The approval inbox's web page: `GET /` and its assets under
//! `/ui/`, compiled into the binary, and the security headers of every
//! response.
//!
//! This module owns serving the page: the files in `ui/` (plain ES modules
//! and one stylesheet, no build step, nothing loaded from elsewhere), their
//! content types and validators, and the headers that make the page hard to
//! abuse: a Content-Security-Policy that allows scripts, styles and
//! connections from this origin only (no inline script or style, no `eval`,
//! no framing), `X-Content-Type-Options: nosniff`, `Referrer-Policy:
//! no-referrer` (a URL never leaks to another site) and `X-Frame-Options`
//! for browsers that predate `frame-ancestors`. API answers get a policy that
//! allows nothing at all. It deliberately holds no data and needs no token:
//! the page signs in and calls the API like any client.

use std::sync::LazyLock;

use axum::extract::{Path, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::ApiError;

/// The policy of the page and its assets.
pub const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The policy of every other answer (JSON, event streams): nothing may load.
pub const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// One compiled-in file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page's files, by the name they are served under (`/ui/<name>`).
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_str!("ui/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("ui/style.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_str!("ui/icon.svg"),
    },
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_str!("ui/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: JS,
        body: include_str!("ui/api.js"),
    },
    Asset {
        name: "dom.js",
        content_type: JS,
        body: include_str!("ui/dom.js"),
    },
    Asset {
        name: "render.js",
        content_type: JS,
        body: include_str!("ui/render.js"),
    },
    Asset {
        name: "auth.js",
        content_type: JS,
        body: include_str!("ui/auth.js"),
    },
    Asset {
        name: "inbox.js",
        content_type: JS,
        body: include_str!("ui/inbox.js"),
    },
    Asset {
        name: "session.js",
        content_type: JS,
        body: include_str!("ui/session.js"),
    },
    Asset {
        name: "create.js",
        content_type: JS,
        body: include_str!("ui/create.js"),
    },
    Asset {
        name: "desk.js",
        content_type: JS,
        body: include_str!("ui/desk.js"),
    },
    Asset {
        name: "history.js",
        content_type: JS,
        body: include_str!("ui/history.js"),
    },
];

/// Strong validators of the assets (hash of their bytes), computed once.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body.as_bytes());
            format!("\"{}\"", hex::encode(&digest[..12]))
        })
        .collect()
});

fn serve(index: usize, headers: &HeaderMap) -> Response {
    let (asset, etag) = (&ASSETS[index], &ETAGS[index]);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let h = response.headers_mut();
    // Revalidated on every load (cheap: a 304), so a new binary's page is
    // never mixed with an old module from the cache.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_CSP),
    );
    response
}

/// `GET /`: the page.
#[utoipa::path(
    get, path = "/", tag = "ui",
    responses(
        (status = 200, description = "The approval inbox's page", content_type = "text/html", body = String),
        (status = 304, description = "Not modified (`If-None-Match`)")
    )
)]
pub(super) async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

/// `GET /ui/{file}`.
#[utoipa::path(
    get, path = "/ui/{file}", tag = "ui",
    params(("file" = String, Path, description = "The file")),
    responses(
        (status = 200, description = "A static file of the page (script, style sheet, icon)", content(
            (String = "text/javascript"),
            (String = "text/css"),
            (String = "image/svg+xml")
        )),
        (status = 304, description = "Not modified (`If-None-Match`)"),
        (status = 404, description = "No such file", body = crate::http::openapi::schemas::ErrorBody)
    )
)]
pub(super) async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.name == file) {
        Some(i) => serve(i, &headers),
        None => ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such file").into_response(),
    }
}

/// Adds the security headers to every answer of the router.
pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(API_CSP),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_or_style_and_loads_only_its_own_files() {
        let page = ASSETS[0].body;
        // Every <script> has a src on this origin, and nothing is inline.
        for (i, _) in page.match_indices("<script") {
            let tag = &page[i..i + page[i..].find('>').unwrap_or(0)];
            assert!(tag.contains("src=\"/ui/"), "{tag}");
        }
        for needle in [" style=", "<style", "javascript:", "http://", "https://"] {
            assert!(!page.contains(needle), "index.html contains {needle:?}");
        }
        // No event-handler attributes (onclick=, onload=, …).
        for word in page.split(|c: char| c.is_whitespace() || c == '<') {
            let attr = word.split('=').next().unwrap_or("");
            assert!(
                !(word.contains('=') && attr.starts_with("on")),
                "index.html has an inline handler: {word}"
            );
        }
        assert!(!PAGE_CSP.contains("unsafe"));
        // The modules never write markup from strings, nor evaluate code.
        for a in ASSETS.iter().filter(|a| a.content_type == JS) {
            for needle in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "localStorage",
            ] {
                assert!(!a.body.contains(needle), "{} uses {needle}", a.name);
            }
        }
    }

    #[test]
    fn every_module_the_page_imports_is_served() {
        for a in ASSETS.iter().filter(|a| a.content_type == JS) {
            for (i, _) in a.body.match_indices("from './") {
                let rest = &a.body[i + "from './".len()..];
                let name = &rest[..rest.find('\'').unwrap_or(0)];
                assert!(
                    ASSETS.iter().any(|b| b.name == name),
                    "{} imports {name}, which is not served",
                    a.name
                );
            }
        }
    }
}
