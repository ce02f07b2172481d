//! A small W3C WebDriver client over reqwest, and the one headless Chromium
//! every test of `tests/ui.rs` shares.
//!
//! Why hand-rolled: the tests need a handful of commands (navigate, find,
//! click, type, keys, execute script, windows, screenshot), and one browser
//! for the whole test binary while each `#[tokio::test]` runs on its own
//! runtime. Client crates (fantoccini, thirtyfour) keep a connection task on
//! the runtime that created the session, so a session cannot outlive the
//! first test; here the shared state is only the driver's address and the
//! session id, and each test talks to it with its own reqwest client.
//!
//! The browser is Debian's `chromium` driven by its `chromedriver`. Both run
//! in a process group of their own under a small shell that holds a pipe
//! from this process: when the test binary exits (normally or not), the
//! pipe closes and the shell ends the whole group and removes the profile
//! directory, so no browser outlives the tests. Tests take the browser in
//! turn ([`Browser::take`]); each starts from a single fresh window.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use tokio::sync::{Mutex, MutexGuard};

/// The longest a browser wait may take before the test fails; it only turns
/// a hang into a failure, nothing is timed against it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The key WebDriver uses for element references.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Keys of the WebDriver key table.
pub const ENTER: &str = "\u{E007}";

struct Shared {
    driver: String,
    session: String,
    /// Closing it ends the browser's process group (see the module doc).
    _lifeline: ChildStdin,
}

static BROWSER: Mutex<Option<Shared>> = Mutex::const_new(None);

const INSTALL: &str = "the browser tests need Debian's Chromium and its WebDriver: \
install them with `apt-get install -y chromium chromium-driver` (or point CHROMIUM and \
CHROMEDRIVER at a chromium binary and its chromedriver)";

fn program(var: &str, default: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{} not found; {INSTALL}", path.display())
    }
}

fn target_tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Where the screenshots of each run go: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = target_tmp()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(target_tmp)
        .join("ui-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

async fn launch() -> anyhow::Result<Shared> {
    let chromium = program("CHROMIUM", "/usr/bin/chromium")?;
    let chromedriver = program("CHROMEDRIVER", "/usr/bin/chromedriver")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let profile = target_tmp().join(format!("ui-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile)?;
    // The shell starts the driver, then ignores SIGTERM itself and waits
    // for its stdin to close; then it ends its whole process group (driver
    // and browsers) and removes the profile.
    let script = r#"
        "$1" --port="$2" --log-path="$3/chromedriver.log" &
        trap '' TERM
        cat >/dev/null
        kill -TERM -$$ 2>/dev/null
        sleep 1
        rm -rf "$3"
        kill -KILL -$$ 2>/dev/null
    "#;
    let mut child = Command::new("setsid")
        .arg("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(&chromedriver)
        .arg(port.to_string())
        .arg(&profile)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", chromedriver.display()))?;
    let lifeline = child.stdin.take().context("driver stdin")?;
    let stdout = child.stdout.take().context("driver stdout")?;
    // The driver says when it listens; wait for that line, bounded.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut sent = false;
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if !sent && line.contains("started successfully") {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    rx.recv_timeout(PATIENCE)
        .map_err(|_| anyhow!("chromedriver did not start within {PATIENCE:?}; {INSTALL}"))?;
    let driver = format!("http://127.0.0.1:{port}");
    let args = [
        "--headless=new".to_owned(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--disable-quic".into(),
        "--disable-extensions".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--password-store=basic".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.join("profile").display()),
    ];
    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "unhandledPromptBehavior": "ignore",
        "timeouts": {"script": PATIENCE.as_millis() as u64, "pageLoad": PATIENCE.as_millis() as u64, "implicit": 0},
        "goog:chromeOptions": {"binary": chromium.to_string_lossy(), "args": args},
    }}});
    let http = reqwest::Client::new();
    let answer = command(
        &http,
        reqwest::Method::POST,
        &format!("{driver}/session"),
        Some(caps),
    )
    .await
    .with_context(|| format!("Chromium did not start under chromedriver; {INSTALL}"))?;
    let session = answer["sessionId"]
        .as_str()
        .context("a WebDriver session id")?
        .to_owned();
    Ok(Shared {
        driver,
        session,
        _lifeline: lifeline,
    })
}

async fn command(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let mut req = http.request(method.clone(), url);
    if let Some(body) = body {
        req = req.json(&body);
    } else if method == reqwest::Method::POST {
        req = req.json(&json!({}));
    }
    let resp = tokio::time::timeout(PATIENCE + Duration::from_secs(10), req.send())
        .await
        .map_err(|_| anyhow!("WebDriver did not answer {method} {url}"))??;
    let status = resp.status();
    let v: Value = resp.json().await?;
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if !status.is_success() {
        bail!(
            "WebDriver {method} {url}: {} ({})",
            value["error"].as_str().unwrap_or("error"),
            value["message"]
                .as_str()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    Ok(value)
}

/// The shared browser, held by one test at a time.
pub struct Browser {
    guard: MutexGuard<'static, Option<Shared>>,
    http: reqwest::Client,
    base: String,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct El(String);

impl Browser {
    /// Takes the browser (starting it on first use) and leaves it with one
    /// fresh, empty window of the default size.
    pub async fn take() -> anyhow::Result<Self> {
        let mut guard = BROWSER.lock().await;
        if guard.is_none() {
            *guard = Some(launch().await?);
        }
        let shared = guard.as_ref().context("browser")?;
        let base = format!("{}/session/{}", shared.driver, shared.session);
        let b = Self {
            guard,
            http: reqwest::Client::new(),
            base,
        };
        // A new window for this test, every other one closed: no state
        // (sessionStorage is per window) carries over.
        let fresh = b.new_window().await?;
        for handle in b.windows().await? {
            if handle != fresh {
                b.switch_to(&handle).await?;
                b.cmd(reqwest::Method::DELETE, "/window", None).await?;
            }
        }
        b.switch_to(&fresh).await?;
        b.set_size(1280, 900).await?;
        Ok(b)
    }

    async fn cmd(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let _ = &self.guard;
        command(&self.http, method, &format!("{}{path}", self.base), body).await
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.cmd(reqwest::Method::GET, path, None).await
    }

    /// Loads `url` in the current window.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    /// The current window's address.
    pub async fn url(&self) -> anyhow::Result<String> {
        Ok(self.get("/url").await?.as_str().unwrap_or("").to_owned())
    }

    /// Runs `script` (a function body; `arguments` holds `args`).
    pub async fn js(&self, script: &str, args: Value) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// Waits until the JavaScript expression `condition` is truthy on the
    /// current page: checked at once, then on every DOM change (and on a
    /// slow tick, for conditions that are not in the DOM). Bounded by
    /// [`PATIENCE`]; the failure says what was awaited and what the page showed.
    pub async fn wait(&self, what: &str, condition: &str) -> anyhow::Result<()> {
        let script = format!(
            r#"const done = arguments[arguments.length - 1];
            const check = () => {{ try {{ return Boolean({condition}); }} catch (e) {{ return false; }} }};
            if (check()) {{ done(true); return; }}
            let finished = false;
            const finish = () => {{ if (!finished && check()) {{ finished = true; observer.disconnect(); clearInterval(tick); done(true); }} }};
            const observer = new MutationObserver(finish);
            observer.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
            const tick = setInterval(finish, 100);"#
        );
        match self
            .post("/execute/async", json!({"script": script, "args": []}))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
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
                bail!("waited for {what} ({condition}): {e}\n--- the page showed:\n{page}")
            }
        }
    }

    /// The first element matching `css`.
    pub async fn find(&self, css: &str) -> anyhow::Result<El> {
        let v = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await
            .with_context(|| format!("no element matches {css}"))?;
        Ok(El(v[ELEMENT].as_str().context("element id")?.to_owned()))
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> anyhow::Result<Vec<El>> {
        let v = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|s| El(s.to_owned())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let el = self.find(css).await?;
        self.post(&format!("/element/{}/click", el.0), json!({}))
            .await
            .with_context(|| format!("clicking {css}"))
            .map(drop)
    }

    /// Replaces the value of the field matching `css` by typing `text`.
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let el = self.find(css).await?;
        self.post(&format!("/element/{}/clear", el.0), json!({}))
            .await?;
        self.type_into(&el, text).await
    }

    /// Types `text` into `el` (WebDriver key codes allowed).
    pub async fn type_into(&self, el: &El, text: &str) -> anyhow::Result<()> {
        self.post(&format!("/element/{}/value", el.0), json!({ "text": text }))
            .await
            .map(drop)
    }

    /// Presses keys on whatever has the focus, one after another.
    pub async fn keys(&self, keys: &[&str]) -> anyhow::Result<()> {
        let mut actions = Vec::new();
        for k in keys {
            actions.push(json!({"type": "keyDown", "value": k}));
            actions.push(json!({"type": "keyUp", "value": k}));
        }
        self.post(
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}),
        )
        .await?;
        self.cmd(reqwest::Method::DELETE, "/actions", None)
            .await
            .map(drop)
    }

    /// The visible text of the first element matching `css`, read in one
    /// step (a view that re-renders cannot leave a stale reference).
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

    /// The text of an open alert, confirm or prompt dialog, if any.
    pub async fn dialog(&self) -> anyhow::Result<Option<String>> {
        match self.get("/alert/text").await {
            Ok(v) => Ok(Some(v.as_str().unwrap_or("").to_owned())),
            Err(e) if e.to_string().contains("no such alert") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Saves a PNG of the current window as `target/ui-screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let b64 = self.get("/screenshot").await?;
        let png = base64_decode(b64.as_str().context("screenshot data")?)?;
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Opens a new top-level window; returns its handle (not switched to).
    pub async fn new_window(&self) -> anyhow::Result<String> {
        let v = self.post("/window/new", json!({"type": "window"})).await?;
        Ok(v["handle"].as_str().context("window handle")?.to_owned())
    }

    /// Every window's handle.
    pub async fn windows(&self) -> anyhow::Result<Vec<String>> {
        let v = self.get("/window/handles").await?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Makes `handle` the window commands go to.
    pub async fn switch_to(&self, handle: &str) -> anyhow::Result<()> {
        self.post("/window", json!({ "handle": handle }))
            .await
            .map(drop)
    }

    /// Resizes the current window (its outer size).
    pub async fn set_size(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await
            .map(drop)
    }
}

fn base64_decode(s: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            _ => bail!("not base64: {c}"),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}
