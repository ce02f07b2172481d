//! A headless Chromium for the browser tests, driven over the DevTools
//! protocol (CDP) with `chromiumoxide`, and the small API the tests speak:
//! [`Browser::open`] starts a browser of the test's own (a fresh profile:
//! no cookies, storage or windows shared with any other test) with one
//! [`Window`]; a `Window` can `goto`, `wait` for a JavaScript condition,
//! run `js`, `click`, `fill`, type, press `keys`, read `text`, take a
//! `screenshot`, and it records the page's console messages, uncaught
//! errors, CSP violations and dialogs. A new UI test reads:
//!
//! ```ignore
//! let b = Browser::open().await?;
//! b.goto(&url).await?;
//! b.wait("the inbox", "document.querySelector('.cards')").await?;
//! b.click(".card button.approve").await?;
//! let other = b.new_window().await?; // same profile, its own page
//! ```
//!
//! Every wait is on the page's own state (a DOM observer in the page),
//! bounded by [`PATIENCE`], and fails saying what it awaited, what the page
//! showed and what its console said; nothing is timed against it.
//!
//! Why a process per test: the npm package's Chromium runs only as a single
//! process, and a single-process Chromium cannot open a second browser
//! context (`Target.createTarget` in one never answers), so a shared
//! browser could not keep tests apart. A start costs about 0.3 s, and tests
//! may run at the same time. The executable comes from `common::chromium`
//! (the npm package's, or `OVERSEER_TEST_CHROMIUM`); it is unpacked once per
//! process. The CDP connection is polled by a task on the test's runtime.
//!
//! Each browser runs in a process group of its own under a small shell
//! that holds a pipe from the test: when the [`Browser`] is dropped or the
//! test binary exits (normally or not), the pipe closes, and the shell ends
//! the group and removes the profile directory, so no browser outlives its
//! test.
//!
//! It deliberately has no element handles: every call names its element by
//! a CSS selector and finds it when it acts, so a view that re-renders
//! never leaves a test holding a stale reference.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chromiumoxide::cdp::browser_protocol::emulation::{
    SetDeviceMetricsOverrideParams, SetFocusEmulationEnabledParams,
};
use chromiumoxide::cdp::browser_protocol::input::{
    DispatchKeyEventParams, DispatchKeyEventType, InsertTextParams,
};
use chromiumoxide::cdp::browser_protocol::log::EventEntryAdded;
use chromiumoxide::cdp::browser_protocol::page::{
    CaptureScreenshotFormat, EventJavascriptDialogOpening, HandleJavaScriptDialogParams,
};
use chromiumoxide::cdp::js_protocol::runtime::{
    EvaluateParams, EventConsoleApiCalled, EventExceptionThrown, EventExecutionContextCreated,
    RemoteObject,
};
use chromiumoxide::error::CdpError;
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::layout::Point;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::Page;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::common::chromium::{self, Chromium};

/// The longest a browser wait may take before the test fails; it only turns
/// a hang into a failure, nothing is timed against it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The size of a new window (CSS pixels).
pub const WINDOW: (u32, u32) = (1280, 900);

/// How many of the browser's last stderr lines a failure quotes.
const LAST_LINES: usize = 40;

/// What the browser process said last, and whether its connection ended.
#[derive(Default)]
pub struct BrowserLog {
    lines: VecDeque<String>,
    closed: bool,
}

/// Flags of every start: a fresh profile, DevTools on a free port, and no
/// traffic of its own (this machine's network is closed; without these the
/// browser keeps dialling Google's hosts). Background windows keep their
/// timers and rendering: tests drive several windows at once.
fn common_flags(profile: &Path) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--remote-debugging-port=0",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
        "--password-store=basic",
        "--mute-audio",
    ]
    .map(String::from)
    .to_vec();
    flags.push(format!("--user-data-dir={}", profile.display()));
    flags
}

/// The flags a Chromium needs to run here, by where it came from.
fn flags(chromium: &Chromium, profile: &Path) -> Vec<String> {
    let own: &[&str] = match chromium {
        // chrome-headless-shell built for sandboxes without a GPU: it runs
        // only as a single process, rendering with SwiftShader.
        Chromium::Package(_) => &[
            "--headless=shell",
            "--no-sandbox",
            "--no-zygote",
            "--single-process",
            "--use-gl=angle",
            "--use-angle=swiftshader",
        ],
        // A full Chromium (e.g. Debian's), as root in a container.
        Chromium::Configured(_) => &["--headless=new", "--no-sandbox", "--disable-gpu"],
    };
    let mut all: Vec<String> = own.iter().map(|f| f.to_string()).collect();
    all.extend(common_flags(profile));
    all.push("about:blank".into());
    all
}

fn target_tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Where the screenshots of each run go: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = target_tmp()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(target_tmp);
    dir.join("ui-screenshots")
}

/// Starts `exe` with `flags` under the lifeline shell (which removes `dir`
/// once the browser ended) and waits, bounded, for its DevTools address;
/// returns it, the browser's log and the shell (closing its stdin ends the
/// browser). The error is one line: what to do, and the browser's last
/// words. Blocks.
pub fn start(
    exe: &Path,
    flags: &[String],
    dir: &Path,
) -> Result<(String, Arc<Mutex<BrowserLog>>, Child), String> {
    // The shell starts the browser and lets go of the stderr pipe (so the
    // pipe ends when the browser does), then ignores SIGTERM itself and
    // waits for its stdin to close; then it ends its whole process group
    // and removes the profile.
    let script = r#"
        dir="$1"; shift
        "$@" </dev/null >/dev/null &
        exec 2>/dev/null
        trap '' TERM
        cat >/dev/null
        kill -TERM -$$ 2>/dev/null
        sleep 1
        rm -rf "$dir"
        kill -KILL -$$ 2>/dev/null
    "#;
    let hint = format!(
        "set {} to a working Chromium, or delete tests/node_modules to unpack the npm package's again",
        chromium::ENV
    );
    let mut child = Command::new("setsid")
        .args(["sh", "-c", script, "sh"])
        .arg(dir)
        .arg(exe)
        .args(flags)
        // A full Chromium keeps files in $TMPDIR (org.chromium.Chromium.*)
        // that a killed one leaves behind: they go where the shell cleans.
        .env("TMPDIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {} under setsid: {e}", exe.display()))?;
    let stderr = child
        .stderr
        .take()
        .ok_or("no stderr pipe from the browser")?;
    let log: Arc<Mutex<BrowserLog>> = Arc::default();
    // The browser says where DevTools listens; the rest of what it says is
    // kept (the last lines) for failures, and read to the end so it never
    // blocks on a full pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    let kept = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(ws.trim().to_owned());
                }
            }
            let mut log = kept.lock().unwrap();
            log.lines.push_back(line);
            if log.lines.len() > LAST_LINES {
                log.lines.pop_front();
            }
        }
        kept.lock().unwrap().closed = true;
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(ws) => Ok((ws, log, child)),
        Err(e) => {
            let said = last_words(&log);
            let how = match e {
                std::sync::mpsc::RecvTimeoutError::Timeout => {
                    format!("did not open DevTools within {PATIENCE:?}")
                }
                std::sync::mpsc::RecvTimeoutError::Disconnected => "exited".into(),
            };
            Err(format!(
                "Chromium ({}) {how}: {said}; {hint}",
                exe.display()
            ))
        }
    }
}

/// The browser's last stderr lines, on one line.
fn last_words(log: &Mutex<BrowserLog>) -> String {
    let log = log.lock().unwrap();
    let lines: Vec<&str> = log
        .lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        "it printed nothing".into()
    } else {
        let tail = &lines[lines.len().saturating_sub(5)..];
        format!("it said: {}", tail.join(" | "))
    }
}

/// What a window's page reported: console messages, uncaught errors, log
/// entries (CSP violations among them) and dialogs.
#[derive(Default)]
struct Seen {
    console: Vec<String>,
    dialogs: Vec<String>,
}

/// A test's own browser and its first window (which it derefs to).
/// Dropping it ends the browser.
pub struct Browser {
    cdp: chromiumoxide::Browser,
    log: Arc<Mutex<BrowserLog>>,
    first: Window,
    executable: PathBuf,
    connection: tokio::task::JoinHandle<()>,
    /// The lifeline shell: closing its stdin ends the browser's process
    /// group (see the module doc).
    shell: Option<Child>,
}

impl Deref for Browser {
    type Target = Window;
    fn deref(&self) -> &Window {
        &self.first
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.connection.abort();
        if let Some(mut shell) = self.shell.take() {
            drop(shell.stdin.take());
            // Reaped off the test's threads: the shell lingers a second to
            // let the browser exit before it removes the profile.
            std::thread::spawn(move || shell.wait());
        }
    }
}

impl Browser {
    /// Starts a browser of this test's own (unpacking Chromium on the
    /// process's first use) with one empty window of [`WINDOW`]'s size.
    pub async fn open() -> anyhow::Result<Self> {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let chromium = chromium::executable().await;
        let profile = target_tmp().join(format!(
            "ui-chromium-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let executable = chromium.path().to_owned();
        let exe = executable.clone();
        let started = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&profile);
            std::fs::create_dir_all(&profile)
                .map_err(|e| format!("cannot create {}: {e}", profile.display()))?;
            start(&exe, &flags(&chromium, &profile.join("profile")), &profile)
        })
        .await
        .context("the browser start task panicked")?;
        let (ws, log, shell) = started.map_err(|message| anyhow!("{message}"))?;
        // From here on, an early return drops the shell's stdin: the
        // browser ends.
        let config = HandlerConfig {
            // The page's own size; `Window::set_size` changes it.
            viewport: None,
            ..HandlerConfig::default()
        };
        let (cdp, mut handler) = tokio::time::timeout(
            PATIENCE,
            chromiumoxide::Browser::connect_with_config(ws.clone(), config),
        )
        .await
        .map_err(|_| {
            anyhow!("Chromium did not accept a DevTools connection at {ws} within {PATIENCE:?}")
        })?
        .map_err(|e| anyhow!("cannot connect to Chromium at {ws}: {e}"))?;
        // Errors of single messages (an event this client cannot parse) do
        // not end the connection; its end does.
        let ended = log.clone();
        let connection = tokio::spawn(async move {
            while handler.next().await.is_some() {}
            ended.lock().unwrap().closed = true;
        });
        let first = Window::new(&cdp, &log).await?;
        Ok(Self {
            cdp,
            log,
            first,
            executable,
            connection,
            shell: Some(shell),
        })
    }

    /// Another window of this browser (it shares cookies and localStorage
    /// with the others, not sessionStorage).
    pub async fn new_window(&self) -> anyhow::Result<Window> {
        Window::new(&self.cdp, &self.log).await
    }

    /// The Chromium this test runs.
    pub fn executable(&self) -> &Path {
        &self.executable
    }
}

/// An error of a CDP command, with the browser's last words when its
/// connection is gone.
fn failed(log: &Mutex<BrowserLog>, doing: &str, e: CdpError) -> anyhow::Error {
    let closed = log.lock().unwrap().closed;
    if closed {
        anyhow!(
            "{doing}: {e}; the browser's connection ended: {}",
            last_words(log)
        )
    } else {
        anyhow!("{doing}: {e}")
    }
}

/// One page of a test's browser.
pub struct Window {
    page: Page,
    log: Arc<Mutex<BrowserLog>>,
    seen: Arc<Mutex<Seen>>,
    /// How long `wait` and `click` may take (ms); [`PATIENCE`] unless set.
    patience_ms: AtomicU64,
    /// Signalled when the page made a JavaScript context (a new document).
    fresh_context: Arc<Notify>,
}

impl Window {
    async fn new(
        cdp: &chromiumoxide::Browser,
        log: &Arc<Mutex<BrowserLog>>,
    ) -> anyhow::Result<Self> {
        let page = cdp
            .new_page("about:blank")
            .await
            .map_err(|e| failed(log, "opening a window", e))?;
        let w = Self {
            page,
            log: log.clone(),
            seen: Arc::default(),
            patience_ms: AtomicU64::new(PATIENCE.as_millis() as u64),
            fresh_context: Arc::default(),
        };
        w.record().await?;
        // Each window behaves as the focused one (tests type into several).
        w.cmd("emulating focus", SetFocusEmulationEnabledParams::new(true))
            .await?;
        w.set_size(WINDOW.0, WINDOW.1).await?;
        Ok(w)
    }

    async fn cmd<T: chromiumoxide::Command>(
        &self,
        doing: &str,
        cmd: T,
    ) -> anyhow::Result<T::Response> {
        self.page
            .execute(cmd)
            .await
            .map(|r| r.result)
            .map_err(|e| failed(&self.log, doing, e))
    }

    /// Records what the page reports (see [`Seen`]); a dialog is recorded
    /// and dismissed, so no test hangs on one.
    async fn record(&self) -> anyhow::Result<()> {
        let err = |e| failed(&self.log, "listening to the page", e);
        let mut console = self
            .page
            .event_listener::<EventConsoleApiCalled>()
            .await
            .map_err(err)?;
        let mut thrown = self
            .page
            .event_listener::<EventExceptionThrown>()
            .await
            .map_err(err)?;
        let mut logged = self
            .page
            .event_listener::<EventEntryAdded>()
            .await
            .map_err(err)?;
        let mut dialogs = self
            .page
            .event_listener::<EventJavascriptDialogOpening>()
            .await
            .map_err(err)?;
        let mut contexts = self
            .page
            .event_listener::<EventExecutionContextCreated>()
            .await
            .map_err(err)?;
        let seen = self.seen.clone();
        let page = self.page.clone();
        let fresh = self.fresh_context.clone();
        tokio::spawn(async move {
            loop {
                let line = tokio::select! {
                    Some(e) = console.next() => {
                        let args: Vec<String> = e.args.iter().map(describe).collect();
                        format!("console.{}: {}", e.r#type.as_ref(), args.join(" "))
                    }
                    Some(e) = thrown.next() => {
                        let d = &e.exception_details;
                        let what = d.exception.as_ref().map(describe).unwrap_or_default();
                        format!("uncaught: {} {what}", d.text)
                    }
                    Some(e) = logged.next() => {
                        format!("{} {}: {}", e.entry.source.as_ref(), e.entry.level.as_ref(), e.entry.text)
                    }
                    Some(e) = dialogs.next() => {
                        seen.lock().unwrap().dialogs.push(format!("{}: {}", e.r#type.as_ref(), e.message));
                        let _ = page.execute(HandleJavaScriptDialogParams::new(false)).await;
                        format!("dialog {}: {}", e.r#type.as_ref(), e.message)
                    }
                    Some(_) = contexts.next() => {
                        fresh.notify_one();
                        continue;
                    }
                    else => break,
                };
                seen.lock().unwrap().console.push(line);
            }
        });
        Ok(())
    }

    /// Sets how long this window's `wait` and `click` may take before they
    /// fail ([`PATIENCE`] by default).
    pub fn set_patience(&self, patience: Duration) {
        self.patience_ms
            .store(patience.as_millis() as u64, Ordering::Relaxed);
    }

    fn patience(&self) -> Duration {
        Duration::from_millis(self.patience_ms.load(Ordering::Relaxed))
    }

    /// Loads `url` and waits for it to load; a `url` that differs from the
    /// current address only in its fragment is a navigation within the
    /// page (no load), as when a person edits the address bar.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        let current = self.url().await?;
        let base = |u: &str| u.split('#').next().unwrap_or_default().to_owned();
        if url.contains('#') && base(url) == base(&current) {
            self.js("location.href = arguments[0]", json!([url]))
                .await
                .with_context(|| format!("going to {url}"))?;
            return Ok(());
        }
        self.page
            .goto(url)
            .await
            .map(drop)
            .map_err(|e| failed(&self.log, &format!("loading {url}"), e))
    }

    /// The window's address.
    pub async fn url(&self) -> anyhow::Result<String> {
        Ok(self
            .js("return location.href", json!([]))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// Evaluates the expression `expression` in the page (awaiting a
    /// promise); its value as JSON (`undefined` is null).
    async fn eval(&self, expression: String) -> anyhow::Result<Value> {
        let params = EvaluateParams::builder()
            .expression(expression)
            .await_promise(true)
            .return_by_value(true)
            .build()
            .map_err(|e| anyhow!("evaluation parameters: {e}"))?;
        let answer = self.cmd("running a script", params).await?;
        if let Some(e) = answer.exception_details {
            let what = e.exception.as_ref().map(describe).unwrap_or_default();
            bail!("the script threw: {} {what}", e.text);
        }
        Ok(answer.result.value.unwrap_or(Value::Null))
    }

    /// Runs `script`, a function body (`arguments` holds `args`, a JSON
    /// array; `return` gives the value, awaited if it is a promise).
    pub async fn js(&self, script: &str, args: Value) -> anyhow::Result<Value> {
        let args = if args.is_array() { args } else { json!([args]) };
        self.eval(format!(
            "(async function () {{ {script}\n}}).apply(null, {args})"
        ))
        .await
    }

    /// Waits until the JavaScript expression `condition` is truthy on the
    /// page: checked at once, then on every DOM change (and on a slow tick,
    /// for conditions that are not in the DOM). Bounded by the window's
    /// patience ([`PATIENCE`] unless set); the
    /// failure says what was awaited, what the page showed and its console.
    pub async fn wait(&self, what: &str, condition: &str) -> anyhow::Result<()> {
        let patience = self.patience();
        let deadline = tokio::time::Instant::now() + patience;
        // One evaluation waits in the page for at most a slice, far below
        // any CDP command timeout; the loop waits again until the deadline,
        // also after a navigation replaced the document the promise lived in
        // (then once the new document has its JavaScript context).
        let outcome = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let slice = left.min(Duration::from_secs(5)).as_millis();
            let script = format!(
                r#"new Promise((resolve) => {{
                    const check = () => {{ try {{ return Boolean({condition}); }} catch (e) {{ return false; }} }};
                    if (check()) {{ resolve(true); return; }}
                    let finished = false;
                    const finish = (ok) => {{
                        if (finished) return;
                        finished = true; observer.disconnect(); clearInterval(tick); clearTimeout(timer); resolve(ok);
                    }};
                    const observer = new MutationObserver(() => {{ if (check()) finish(true); }});
                    observer.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
                    const tick = setInterval(() => {{ if (check()) finish(true); }}, 100);
                    const timer = setTimeout(() => finish(check()), {slice});
                }})"#
            );
            let answer = self.eval(script).await;
            let expired = tokio::time::Instant::now() >= deadline;
            match answer {
                Ok(Value::Bool(false)) if !expired => {}
                Err(e) if replaced(&e) && !expired => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let _ = tokio::time::timeout(left, self.fresh_context.notified()).await;
                }
                other => break other,
            }
        };
        let why = match outcome {
            Ok(Value::Bool(true)) => return Ok(()),
            Ok(_) => format!("not true after {patience:?}"),
            Err(e) => e.to_string(),
        };
        let page = self
            .js(
                "return document.body ? document.body.innerText : ''",
                json!([]),
            )
            .await
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let page: String = page.chars().take(4000).collect();
        let console = self.console();
        let console = &console[console.len().saturating_sub(20)..];
        bail!(
            "waited for {what} ({condition}): {why}\n--- the page showed:\n{page}\n--- its console said:\n{}",
            console.join("\n")
        )
    }

    /// Clicks the element matching `css` with the mouse, at its centre, as
    /// a person would: scrolled into view, once its box stopped moving for
    /// two animation frames, and not covered by another element. Pages
    /// move things under the pointer (a list grows above a button), so the
    /// press is guarded in the page: a press or click that would land on
    /// another element is stopped before the page sees it and the click is
    /// tried again, within the window's patience. Fails if nothing matches, the
    /// element is disabled, or it stays covered. An `<option>` is selected
    /// in its `<select>` instead (what a person does with two clicks).
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let patience = self.patience();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let at = self
                .js(CLICK_PREPARE_JS, json!([css]))
                .await
                .with_context(|| format!("clicking {css}"))?;
            if at["missing"] == json!(true) {
                bail!("clicking {css}: no element matches");
            }
            if at["disabled"] == json!(true) {
                bail!("clicking {css}: it is disabled");
            }
            if at["selected"] == json!(true) {
                return Ok(());
            }
            if let (Some(x), Some(y)) = (at["x"].as_f64(), at["y"].as_f64()) {
                self.page
                    .click(Point { x, y })
                    .await
                    .map_err(|e| failed(&self.log, &format!("clicking {css}"), e))?;
                let landed = self.js(CLICK_FINISH_JS, json!([])).await?;
                if landed == json!(true) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                let covered = at["covered"].as_str().unwrap_or("another element");
                bail!("clicking {css}: for {patience:?} its centre showed {covered}, or it moved under the pointer");
            }
        }
    }

    /// Focuses the field matching `css`, with its caret at the end
    /// (`select_all`: its whole text selected).
    async fn focus(&self, css: &str, select_all: bool) -> anyhow::Result<()> {
        let found = self
            .js(
                r#"const el = document.querySelector(arguments[0]);
                if (!el) return false;
                el.focus();
                if (arguments[1] && el.select) el.select();
                else if (el.setSelectionRange && typeof el.value === 'string') el.setSelectionRange(el.value.length, el.value.length);
                return document.activeElement === el;"#,
                json!([css, select_all]),
            )
            .await?;
        if found != json!(true) {
            bail!("no focusable element matches {css}");
        }
        Ok(())
    }

    /// Replaces the text of the field matching `css` with `text`, as typing
    /// over a selection does (`input` events, no key events).
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        self.focus(css, true).await?;
        if text.is_empty() {
            self.keys(&["Delete"]).await
        } else {
            self.insert(text).await
        }
    }

    /// Types `text` at the end of the field matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        self.focus(css, false).await?;
        self.insert(text).await
    }

    async fn insert(&self, text: &str) -> anyhow::Result<()> {
        self.cmd("typing", InsertTextParams::new(text))
            .await
            .map(drop)
    }

    /// Presses keys on whatever has the focus, one after another: key names
    /// of the DOM (`"j"`, `"A"`, `"Enter"`, `"Escape"`, `"ArrowDown"`).
    pub async fn keys(&self, keys: &[&str]) -> anyhow::Result<()> {
        for key in keys {
            let def = chromiumoxide::keys::get_key_definition(key)
                .with_context(|| format!("no key named {key:?}"))?;
            let text = def
                .text
                .or((def.key.chars().count() == 1).then_some(def.key));
            let mut down = DispatchKeyEventParams::builder()
                .key(def.key)
                .code(def.code)
                .windows_virtual_key_code(def.key_code)
                .native_virtual_key_code(def.key_code);
            down = match text {
                Some(t) => down.r#type(DispatchKeyEventType::KeyDown).text(t),
                None => down.r#type(DispatchKeyEventType::RawKeyDown),
            };
            let up = DispatchKeyEventParams::builder()
                .r#type(DispatchKeyEventType::KeyUp)
                .key(def.key)
                .code(def.code)
                .windows_virtual_key_code(def.key_code)
                .native_virtual_key_code(def.key_code);
            for event in [down, up] {
                let event = event.build().map_err(|e| anyhow!("key {key}: {e}"))?;
                self.cmd(&format!("pressing {key}"), event).await?;
            }
        }
        Ok(())
    }

    /// The visible text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let v = self
            .js(
                "const el = document.querySelector(arguments[0]); return el ? el.innerText : null;",
                json!([css]),
            )
            .await?;
        v.as_str()
            .map(str::to_owned)
            .with_context(|| format!("no element matches {css}"))
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> anyhow::Result<usize> {
        let v = self
            .js(
                "return document.querySelectorAll(arguments[0]).length",
                json!([css]),
            )
            .await?;
        v.as_u64()
            .map(|n| n as usize)
            .context("a count of elements")
    }

    /// Every alert, confirm or prompt the page opened so far (each was
    /// dismissed at once), as "type: message".
    pub fn dialogs(&self) -> Vec<String> {
        self.seen.lock().unwrap().dialogs.clone()
    }

    /// What the page reported so far, a line each: console calls
    /// (`console.error: …`), uncaught errors (`uncaught: …`), the browser's
    /// log (`security error: Refused to …` for a CSP violation, `network
    /// error: …`) and dialogs.
    pub fn console(&self) -> Vec<String> {
        self.seen.lock().unwrap().console.clone()
    }

    /// Saves a PNG of the window as `target/ui-screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let png = self
            .page
            .screenshot(
                ScreenshotParams::builder()
                    .format(CaptureScreenshotFormat::Png)
                    .build(),
            )
            .await
            .map_err(|e| failed(&self.log, "taking a screenshot", e))?;
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Sets the window's size in CSS pixels (what the page's layout sees).
    pub async fn set_size(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.cmd(
            "resizing the window",
            SetDeviceMetricsOverrideParams::new(width, height, 1.0, false),
        )
        .await
        .map(drop)
    }
}

/// The first half of [`Window::click`] (`arguments[0]`: the selector):
/// finds the element, scrolls it into view, waits until its box stayed put
/// for two animation frames, checks what is at its centre, and arms a guard
/// that stops any press or click landing elsewhere. Answers `{x, y}`, or
/// why not: `missing`, `disabled`, `covered` (what is on top), `selected`
/// (an option, chosen without the mouse).
const CLICK_PREPARE_JS: &str = r#"
    const el = document.querySelector(arguments[0]);
    if (!el) return {missing: true};
    if (el instanceof HTMLOptionElement) {
        const select = el.closest('select');
        el.selected = true;
        select.dispatchEvent(new Event('input', {bubbles: true}));
        select.dispatchEvent(new Event('change', {bubbles: true}));
        return {selected: true};
    }
    if (el.disabled) return {disabled: true};
    el.scrollIntoView({block: 'center', inline: 'center'});
    // A hidden page may not paint: a frame or 50 ms, whichever comes first.
    const frame = () => new Promise((r) => { requestAnimationFrame(r); setTimeout(r, 50); });
    const box = () => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.width, r.height].join(); };
    let last = box();
    for (let i = 0; i < 40; i++) {
        await frame(); await frame();
        const now = box();
        if (now === last) break;
        last = now;
    }
    const r = el.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    const top = document.elementFromPoint(x, y);
    if (!top || !(top === el || el.contains(top))) {
        return {covered: top ? top.outerHTML.slice(0, 200) : 'nothing (it is off screen or has no size)'};
    }
    const state = {landed: null};
    const guard = (e) => {
        if (e.target === el || el.contains(e.target)) {
            if (e.type === 'click') state.landed = true;
        } else {
            e.preventDefault();
            e.stopImmediatePropagation();
            state.landed = false;
        }
    };
    const types = ['pointerdown', 'mousedown', 'pointerup', 'mouseup', 'click'];
    for (const t of types) window.addEventListener(t, guard, {capture: true});
    state.disarm = () => { for (const t of types) window.removeEventListener(t, guard, {capture: true}); };
    window.__overseerClick = state;
    return {x, y};
"#;

/// The second half of [`Window::click`]: disarms the guard; whether the
/// click reached the element (and nothing else). Without a guard the
/// document is a new one: the click loaded another page.
const CLICK_FINISH_JS: &str = r#"
    const state = window.__overseerClick;
    if (!state) return true;
    delete window.__overseerClick;
    state.disarm();
    return state.landed === true;
"#;

/// Whether an evaluation failed because a navigation replaced the document
/// it ran in (CDP's "Inspected target navigated or closed", "Execution
/// context was destroyed", "Cannot find context with specified id").
fn replaced(e: &anyhow::Error) -> bool {
    let e = e.to_string();
    e.contains("navigated or closed") || e.contains("context")
}

/// A remote value as text: its value, or its description.
fn describe(o: &RemoteObject) -> String {
    match (&o.value, &o.description) {
        (Some(Value::String(s)), _) => s.clone(),
        (Some(v), _) => v.to_string(),
        (None, Some(d)) => d.clone(),
        (None, None) => o.r#type.as_ref().to_owned(),
    }
}
