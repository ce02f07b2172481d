//! The connections under the router: the accept loop, the cap on open
//! connections, per-connection timeouts, and the shutdown with a deadline.
//!
//! This module owns everything that happens before a request exists or
//! after it no longer matters: accepting, reading request heads in bounded
//! time, closing connections whose client stopped reading, and dropping
//! whatever is still open once the shutdown grace has passed. In plain
//! text it speaks HTTP/1.1 only (through hyper's `http1` connection). A
//! client that opens with HTTP/2's connection preface (prior knowledge,
//! `h2c`) gets one clear answer in its own protocol, a `GOAWAY` with
//! `HTTP_1_1_REQUIRED` and a sentence saying so ([`refuse_h2`]), instead of
//! a connection closed without a word. With TLS (`super::tls`) the
//! handshake runs under the header-read timeout, and ALPN decides: `h2`
//! gets hyper's `http2` connection, anything else HTTP/1.1. It
//! deliberately knows nothing of routes, auth or sessions: each request goes
//! to the router as is, and what a request may take once it exists is
//! `admission`'s.
//!
//! Why not `axum::serve`: it has no header-read timeout, no connection cap
//! and no deadline on its graceful shutdown, so one client that never
//! finishes its headers holds a connection (and the shutdown) forever.
//!
//! Errors hyper answers by itself (a head over [`MAX_HEAD_BYTES`], more than
//! [`MAX_HEADERS`] fields, a request line it cannot parse) would go out with
//! an empty body; [`ConnIo`] recognises those bodiless heads on their way
//! out and sends the API's JSON error shape instead.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::{AppState, HttpLimits, MAX_HEADERS, MAX_HEAD_BYTES};

/// hyper's read buffer: room for the largest head plus a little, and the
/// bound on what one connection buffers while reading.
const READ_BUFFER_BYTES: usize = MAX_HEAD_BYTES + 8 * 1024;

/// How long the accept loop pauses after an accept error that is not about
/// one connection (e.g. out of file descriptors), so it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Accepts connections on `listener` and serves `app` on each until
/// `shutdown` resolves; then stops accepting, tells `state` (event streams
/// end), and returns once every connection has finished or been dropped at
/// the grace deadline.
pub(super) async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: &HttpLimits,
    state: &AppState,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let max = limits.max_connections.clamp(1, super::MAX_COUNT_LIMIT);
    let slots = Arc::new(Semaphore::new(max));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .max_buf_size(READ_BUFFER_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    let http1 = Arc::new(http1);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(MAX_HEAD_BYTES).unwrap_or(u32::MAX));
    let http2 = Arc::new(http2);
    tokio::pin!(shutdown);
    loop {
        // At the cap, stop accepting: the kernel's backlog holds new
        // connections until one of ours closes.
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "accept failed; pausing before the next accept");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    }
                }
            },
        };
        tokio::spawn(serve_one(
            stream,
            tls.clone(),
            Protocols {
                http1: http1.clone(),
                http2: http2.clone(),
            },
            app.clone(),
            limits.clone(),
            state.shutdown_signal(),
            slot,
        ));
    }
    tracing::info!("shutting down the API: no new connections, closing event streams");
    state.begin_shutdown();
    drop(listener);
    // Every connection holds a slot until it ends, and each ends by the
    // grace deadline at the latest: all slots back means all connections
    // are gone.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Errors of `accept` that concern one connection only (it was reset
/// before it was accepted): the next accept is unaffected.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The connection builders, shared by every connection.
struct Protocols {
    http1: Arc<hyper::server::conn::http1::Builder>,
    http2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
}

/// Drives a hyper connection until it ends, or, once `shutdown` is set,
/// lets it finish what is in progress until the grace deadline.
macro_rules! drive {
    ($conn:expr, $shutdown:expr, $limits:expr) => {{
        let conn = $conn;
        tokio::pin!(conn);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // A closed channel (the state is gone) is a shutdown too.
            _ = $shutdown.wait_for(|stopping| *stopping) => {}
        }
        // Finish the request in progress (event streams end on the same
        // signal), answer nothing more, and give up at the deadline.
        conn.as_mut().graceful_shutdown();
        if tokio::time::timeout($limits.shutdown_grace, conn)
            .await
            .is_err()
        {
            tracing::info!(
                grace_secs = $limits.shutdown_grace.as_secs(),
                "dropping a connection still open at the shutdown deadline"
            );
        }
    }};
}

/// Serves one connection until it ends, or until a shutdown's grace runs
/// out. `_slot` is its place under the connection cap.
async fn serve_one(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    protocols: Protocols,
    app: Router,
    limits: HttpLimits,
    mut shutdown: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    // Without TCP_NODELAY, Nagle's algorithm holds back the small writes of
    // an event stream until the client's delayed ACK (~40 ms per event).
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        app.clone().oneshot(request.map(axum::body::Body::new))
    });
    let Some(acceptor) = tls else {
        match opening(&stream, limits.header_read_timeout).await {
            Opening::Http1 => {}
            // Nothing within the time a request head has: hyper would close
            // it too.
            Opening::Silent => return,
            Opening::Http2 => {
                return refuse_h2(stream, REFUSAL_LINGER.min(limits.idle_timeout)).await
            }
        }
        let io = TokioIo::new(ConnIo::new(stream, limits.idle_timeout));
        drive!(
            protocols.http1.serve_connection(io, service),
            shutdown,
            limits
        );
        return;
    };
    // The handshake is the client's first words: it gets the time a
    // request head has.
    let stream =
        match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("no TLS handshake within the header-read timeout");
                return;
            }
        };
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        let io = TokioIo::new(ConnIo::h2(stream, limits.idle_timeout));
        drive!(
            protocols.http2.serve_connection(io, service),
            shutdown,
            limits
        );
    } else {
        let io = TokioIo::new(ConnIo::new(stream, limits.idle_timeout));
        drive!(
            protocols.http1.serve_connection(io, service),
            shutdown,
            limits
        );
    }
}

/// HTTP/2's connection preface (RFC 9113): a client with prior
/// knowledge sends it first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a connection opens.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    /// Anything but HTTP/2's preface: hyper's HTTP/1.1 takes it.
    Http1,
    /// HTTP/2 with prior knowledge.
    Http2,
    /// Nothing (or only part of the preface) within the wait.
    Silent,
}

/// Looks (without reading) at the first bytes of a connection, waiting at
/// most `wait` for them: whether it opens with HTTP/2's preface. An HTTP/1.1
/// request differs from it by its second byte at the latest, so this costs
/// one `peek` per connection.
async fn opening(stream: &TcpStream, wait: Duration) -> Opening {
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            // An error reading is hyper's to meet (and report).
            Ok(Err(_)) => return Opening::Http1,
            Err(_) => return Opening::Silent,
        };
        if n == 0 || buf[..n] != H2_PREFACE[..n] {
            return Opening::Http1;
        }
        if n == H2_PREFACE.len() {
            return Opening::Http2;
        }
        // Part of the preface so far: look again shortly (a peek returns
        // at once while those bytes are unread).
        if tokio::time::timeout_at(deadline, tokio::time::sleep(PREFACE_POLL))
            .await
            .is_err()
        {
            return Opening::Silent;
        }
    }
}

/// How often [`opening`] looks again at a connection that sent part of the
/// HTTP/2 preface.
const PREFACE_POLL: Duration = Duration::from_millis(10);

/// Most time an HTTP/2 connection is kept after its refusal, for the client
/// to read it and close (a shutdown waits for it too).
const REFUSAL_LINGER: Duration = Duration::from_secs(2);

/// What an HTTP/2 client is told: the server's preface (an empty SETTINGS
/// frame), then `GOAWAY` (last stream 0, `HTTP_1_1_REQUIRED`) whose debug
/// data says what to do.
fn h2_refusal() -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const HTTP_1_1_REQUIRED: u32 = 0xd;
    let debug: &[u8] = b"this server speaks HTTP/1.1 only: send the request as HTTP/1.1 \
        (or put an HTTP/2 proxy in front of it)";
    let frame = |kind: u8, payload: &[u8]| {
        let len = payload.len().to_be_bytes();
        let mut out = vec![len[len.len() - 3], len[len.len() - 2], len[len.len() - 1]];
        out.extend_from_slice(&[kind, 0, 0, 0, 0, 0]);
        out.extend_from_slice(payload);
        out
    };
    let mut goaway = Vec::with_capacity(8 + debug.len());
    goaway.extend_from_slice(&0u32.to_be_bytes());
    goaway.extend_from_slice(&HTTP_1_1_REQUIRED.to_be_bytes());
    goaway.extend_from_slice(debug);
    let mut out = frame(SETTINGS, &[]);
    out.extend(frame(GOAWAY, &goaway));
    out
}

/// Answers an HTTP/2 client with [`h2_refusal`] and closes the connection
/// once the client has read it. What the client sent is read and dropped
/// until it closes (at most `wait`): closing a socket with unread input
/// resets it, and the client could lose the answer.
async fn refuse_h2(mut stream: TcpStream, wait: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tracing::debug!("an HTTP/2 (prior knowledge) connection: answered GOAWAY HTTP_1_1_REQUIRED");
    let answered = tokio::time::timeout(wait, async {
        stream.write_all(&h2_refusal()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), io::Error>(())
    })
    .await;
    if let Ok(Err(e)) = answered {
        tracing::debug!(error = %e, "the HTTP/2 refusal could not be delivered");
    }
}

/// A connection's socket as hyper sees it, with two additions:
///
/// - a write that makes no progress (the client stopped reading) for the
///   idle timeout fails with `TimedOut`, which ends the connection;
/// - a bodiless error response that hyper writes on its own (400, 414, 431
///   for a request it could not parse) is replaced by the same status with
///   the API's JSON error body. The router never sends these statuses
///   without a body, so a head with `content-length: 0` is hyper's.
struct ConnIo<T> {
    inner: T,
    idle_timeout: Duration,
    /// Armed while a write waits for the client to read.
    stalled: Option<Pin<Box<Sleep>>>,
    /// The JSON answer replacing hyper's bodiless one, and how much of it
    /// was written.
    replacement: Option<(Vec<u8>, usize)>,
    /// Whether hyper's HTTP/1.1 error heads are looked for (not in HTTP/2's
    /// binary frames).
    intercepts: bool,
}

impl<T> ConnIo<T> {
    fn new(inner: T, idle_timeout: Duration) -> Self {
        Self {
            inner,
            idle_timeout,
            stalled: None,
            replacement: None,
            intercepts: true,
        }
    }

    /// For an HTTP/2 connection: the write timeout only.
    fn h2(inner: T, idle_timeout: Duration) -> Self {
        Self {
            intercepts: false,
            ..Self::new(inner, idle_timeout)
        }
    }
}

/// Passes a write's result through, failing a write that has been pending
/// for longer than `timeout` (the client stopped reading).
fn track<R>(
    stalled: &mut Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    cx: &mut Context<'_>,
    polled: Poll<io::Result<R>>,
) -> Poll<io::Result<R>> {
    match polled {
        Poll::Ready(result) => {
            *stalled = None;
            Poll::Ready(result)
        }
        Poll::Pending => {
            let sleep = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read nothing within the idle timeout",
                ))),
                Poll::Pending => Poll::Pending,
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> ConnIo<T> {
    /// Passes an inner write's result through [`track`].
    fn track<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        track(&mut self.stalled, self.idle_timeout, cx, polled)
    }

    /// Writes what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Self {
            inner,
            idle_timeout,
            stalled,
            replacement,
            ..
        } = self;
        while let Some((bytes, written)) = replacement {
            if *written >= bytes.len() {
                *replacement = None;
                break;
            }
            let polled = Pin::new(&mut *inner).poll_write(cx, &bytes[*written..]);
            match ready!(track(stalled, *idle_timeout, cx, polled))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => *written += n,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes the queued replacement at once, as hyper's own write would
    /// have been: after an error answer hyper closes the connection, and it
    /// may drop the socket without a flush. What the socket does not take
    /// now is written on the next write, flush or shutdown.
    fn start_replacement(&mut self, cx: &mut Context<'_>, n: usize) -> Poll<io::Result<usize>> {
        match self.poll_replacement(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) | Poll::Pending => Poll::Ready(Ok(n)),
        }
    }

    /// If `buf` is one of hyper's own bodiless error heads, queues the JSON
    /// replacement and returns how many bytes of hyper's to report written
    /// (all of them: hyper must not send the rest).
    fn intercept(&mut self, buf: &[u8], total: usize) -> Option<usize> {
        if !self.intercepts {
            return None;
        }
        let replacement = json_error_response(buf)?;
        self.replacement = Some((replacement, 0));
        Some(total)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_replacement(cx))?;
        if let Some(n) = this.intercept(buf, buf.len()) {
            return this.start_replacement(cx, n);
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.track(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_replacement(cx))?;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            let total = bufs.iter().map(|b| b.len()).sum();
            if let Some(n) = this.intercept(first, total) {
                return this.start_replacement(cx, n);
            }
        }
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_replacement(cx))?;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.track(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_replacement(cx))?;
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.track(cx, polled)
    }
}

/// The JSON answer replacing `buf` when `buf` starts with a response head
/// that hyper writes by itself: status 400, 414 or 431 with
/// `content-length: 0`.
fn json_error_response(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let status = rest.get(..3)?;
    let (status, reason, code, message) = match status {
        b"400" => (
            400,
            "Bad Request",
            "malformed_request",
            "the request is not valid HTTP/1.1".to_owned(),
        ),
        b"414" => (
            414,
            "URI Too Long",
            "uri_too_long",
            format!(
                "the request target exceeds {} KiB",
                super::MAX_URI_BYTES / 1024
            ),
        ),
        b"431" => (
            431,
            "Request Header Fields Too Large",
            "headers_too_large",
            format!(
                "the request head exceeds {} KiB or {MAX_HEADERS} header fields",
                MAX_HEAD_BYTES / 1024
            ),
        ),
        _ => return None,
    };
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    // Up to and including the last header line's CRLF.
    let head = buf.get(..end + 2)?.to_ascii_lowercase();
    const EMPTY: &[u8] = b"\r\ncontent-length: 0\r\n";
    if !head.windows(EMPTY.len()).any(|w| w == EMPTY) {
        return None;
    }
    let body = json!({"error": {"code": code, "message": message}}).to_string();
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_reads_times_out() {
        // A 64-byte pipe whose far end nobody reads.
        let (near, _far) = tokio::io::duplex(64);
        let mut io = ConnIo::new(near, Duration::from_secs(60));
        let err = io
            .write_all(&[b'x'; 1024])
            .await
            .expect_err("the write cannot complete");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_a_stalled_one() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = ConnIo::new(near, Duration::from_secs(60));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 16];
            loop {
                // Reads a little every 30 s: progress within every minute.
                tokio::time::sleep(Duration::from_secs(30)).await;
                match far.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        io.write_all(&[b'y'; 256]).await.unwrap();
        io.shutdown().await.unwrap();
        drop(io);
        assert_eq!(reader.await.unwrap().len(), 256);
    }

    #[tokio::test]
    async fn hypers_own_error_answers_go_out_as_json() {
        let (near, mut far) = tokio::io::duplex(4096);
        let mut io = ConnIo::new(near, Duration::from_secs(60));
        io.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        io.shutdown().await.unwrap();
        drop(io);
        let mut out = String::new();
        far.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.contains("content-type: application/json"), "{out}");
        assert!(out.ends_with(r#""code":"headers_too_large","message":"the request head exceeds 32 KiB or 100 header fields"}}"#), "{out}");
    }

    #[test]
    fn only_bodiless_error_heads_are_replaced() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n";
        let out = json_error_response(hyper_431).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "headers_too_large");
        // The router's own answers carry a body and pass through.
        assert!(json_error_response(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 52\r\n\r\n{}"
        )
        .is_none());
        assert!(json_error_response(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        // A length that merely starts with a zero digit is not empty.
        assert!(json_error_response(
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 05\r\n\r\nhello"
        )
        .is_none());
        // Only a whole head is recognised.
        assert!(json_error_response(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
        )
        .is_none());
    }
}
