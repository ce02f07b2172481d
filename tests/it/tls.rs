//! TLS at the edge and between nodes, with real `overseer serve` processes
//! and certificates generated here (`rcgen`): HTTPS with a private CA over
//! HTTP/1.1 and HTTP/2 (ALPN); a certificate reloaded (SIGHUP, then a file
//! change) while an event stream stays open; nodes of a cluster forwarding
//! over HTTPS with `http.ca_bundle`; and a forward over plain HTTP to a
//! non-loopback address refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use common::{send, Sse, PATIENCE, SECRET};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

/// One approval, then an answer: a session that waits for a decision.
const SCENARIO: &str = r#"{
  "name": "tls",
  "agents": {
    "clerk": [
      {"text": "Checking the time.", "tool_calls": [{"name": "current_time", "arguments": {}}]},
      {"text": "Done: {{tool_result}}"}
    ]
  }
}"#;

/// A private CA.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for 127.0.0.1 and localhost: (cert PEM, key PEM).
    fn server_cert(&self) -> (String, String) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A client trusting only this CA.
    fn client(&self) -> reqwest::Client {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.pem().as_bytes()).unwrap())
            .timeout(PATIENCE)
            .build()
            .unwrap()
    }
}

/// Writes `contents` to `path` in one step (a rename), as a deployment
/// tool would, so the server never reads half a file.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// One `overseer serve` process over TLS.
struct Served {
    served: common::served::Served,
    addr: String,
}

impl Served {
    fn start(config: &Path, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut cmd = common::served::command();
        cmd.arg("--config")
            .arg(config)
            .env("OVERSEER_JWT_SECRET", SECRET)
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let served = common::served::Served::start_with(cmd, "https", PATIENCE)?;
        let addr = served.addr().to_owned();
        Ok(Self { served, addr })
    }

    /// Waits for a stderr line matching `pred`.
    fn until_line(&mut self, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        self.served.until_line(pred)
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    fn signal(&self, sig: &str) {
        self.served.signal(sig);
    }
}

fn token() -> String {
    common::token(
        "acme",
        "alice",
        &[
            "sessions:read",
            "sessions:write",
            "approvals:write",
            "admin",
        ],
    )
}

/// The parts of a configuration every test here shares: the scripted
/// `clerk` (one approval), TLS from `dir`'s files, and `extra` sections.
fn config(dir: &Path, store: &str, http_extra: &str, extra: &str) -> PathBuf {
    let scenario = dir.join("scenario.json");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let path = dir.join(format!("overseer-{}.toml", uuid::Uuid::new_v4()));
    let text = format!(
        "{store}\n\
         [http]\ntls_cert = {cert:?}\ntls_key = {key:?}\n{http_extra}\n\
         [provider]\nkind = \"scripted\"\nscenario = {scenario:?}\n\n\
         [[agents]]\nname = \"clerk\"\ntools = [\"current_time\"]\napproval = \"always\"\n\
         {extra}\n",
        cert = dir.join("cert.pem").display().to_string(),
        key = dir.join("key.pem").display().to_string(),
        scenario = scenario.display().to_string(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn sled_store(dir: &Path) -> String {
    format!(
        "[store]\nkind = \"sled\"\ndata_dir = {:?}\n",
        dir.join("data").display().to_string()
    )
}

fn write_cert(dir: &Path, (cert, key): &(String, String)) {
    replace(&dir.join("cert.pem"), cert);
    replace(&dir.join("key.pem"), key);
}

/// Creates a `clerk` session at `base` and waits for its approval; returns
/// (session id, call id).
async fn pending_session(client: &reqwest::Client, base: &str) -> anyhow::Result<(String, String)> {
    let (status, v) = send(
        client
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(token())
            .json(&json!({"agent": "clerk", "prompt": "what time is it?"})),
    )
    .await?;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().context("id")?.to_owned();
    let call = common::eventually("a pending approval", Duration::from_millis(50), || {
        let req = client
            .get(format!("{base}/v1/sessions/{id}/approvals"))
            .bearer_auth(token());
        async move {
            let (_, v) = send(req).await.map_err(|e| e.to_string())?;
            v["pending"][0]["call_id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| v.to_string())
        }
    })
    .await;
    Ok((id, call))
}

async fn approve(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    call: &str,
) -> anyhow::Result<(u16, Value)> {
    send(
        client
            .post(format!("{base}/v1/sessions/{id}/approvals"))
            .bearer_auth(token())
            .json(&json!({"decisions": {call: {"decision": "approve"}}})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_private_ca_speaks_http2_and_http1() -> Result {
    let dir = tempfile::tempdir()?;
    let ca = Ca::new("test CA");
    write_cert(dir.path(), &ca.server_cert());
    let config = config(dir.path(), &sled_store(dir.path()), "", "");
    let served = Served::start(&config, &[])?;

    // ALPN: a client offering h2 gets HTTP/2.
    let resp = common::answer(ca.client().get(served.url("/healthz"))).await?;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.version, reqwest::Version::HTTP_2);
    // A client offering only HTTP/1.1 gets it.
    let h1 = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes())?)
        .http1_only()
        .build()?;
    let resp = common::answer(h1.get(served.url("/healthz"))).await?;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.version, reqwest::Version::HTTP_11);
    // The API itself over HTTP/2, auth included.
    let (status, v) = send(ca.client().get(served.url("/v1/me")).bearer_auth(token())).await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tenant"], "acme");
    // A client that does not trust the CA is refused by its own check.
    let stranger = Ca::new("another CA").client();
    assert!(stranger.get(served.url("/healthz")).send().await.is_err());
    // Plain HTTP on the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", served.addr))
        .send()
        .await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() != 200));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_certificate_keeps_the_open_event_stream() -> Result {
    let dir = tempfile::tempdir()?;
    let first = Ca::new("first CA");
    write_cert(dir.path(), &first.server_cert());
    let config = config(dir.path(), &sled_store(dir.path()), "", "");
    let mut served = Served::start(&config, &[])?;
    let base = served.url("");
    let client = first.client();
    let (id, call) = pending_session(&client, &base).await?;
    let mut events = Sse::from_request(
        client
            .get(format!("{base}/v1/sessions/{id}/events"))
            .bearer_auth(token()),
    )
    .await?;
    events.until_type("approval_requested").await?;

    // A new certificate from another CA, then SIGHUP.
    let second = Ca::new("second CA");
    write_cert(dir.path(), &second.server_cert());
    served.signal("-HUP");
    served
        .until_line(|l| l.starts_with("reloaded the TLS certificate") && l.ends_with("(SIGHUP)"))?;
    // New handshakes get the new certificate…
    let resp = common::answer(second.client().get(served.url("/healthz"))).await?;
    assert_eq!(resp.status, 200);
    assert!(
        first
            .client()
            .get(served.url("/healthz"))
            .send()
            .await
            .is_err(),
        "a new connection still got the old certificate"
    );
    // …while the stream opened before goes on: the decision made over a
    // new connection reaches it.
    let (status, v) = approve(&second.client(), &base, &id, &call).await?;
    assert_eq!(status, 200, "{v}");
    events.until_type("turn_ended").await?;

    // Replacing the files is enough (no signal): back to the first CA.
    write_cert(dir.path(), &first.server_cert());
    served.until_line(|l| {
        l.starts_with("reloaded the TLS certificate") && l.ends_with("(a file changed)")
    })?;
    let resp = common::answer(first.client().get(served.url("/healthz"))).await?;
    assert_eq!(resp.status, 200);

    // A broken pair is not taken: the server keeps what it serves.
    replace(
        &dir.path().join("key.pem"),
        &KeyPair::generate()?.serialize_pem(),
    );
    served.signal("-HUP");
    let resp = common::answer(first.client().get(served.url("/healthz"))).await?;
    assert_eq!(resp.status, 200);
    Ok(())
}

/// A PostgreSQL `[store]` and `[cluster]` for `database`, advertising
/// `advertise` if given.
fn pg_store(advertise: Option<&str>) -> String {
    let advertise = advertise
        .map(|u| format!("advertise_url = {u:?}\n"))
        .unwrap_or_default();
    format!(
        "[store]\nkind = \"postgres\"\npool_size = 4\n\n\
         [cluster]\nheartbeat_secs = 1\nlease_secs = 4\n{advertise}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_forward_over_https_with_a_private_ca() -> Result {
    let database = common::pg::shared().database().await?;
    let dir = tempfile::tempdir()?;
    let ca = Ca::new("cluster CA");
    write_cert(dir.path(), &ca.server_cert());
    std::fs::write(dir.path().join("ca.pem"), ca.pem())?;
    let http_extra = format!(
        "ca_bundle = {:?}\n",
        dir.path().join("ca.pem").display().to_string()
    );
    // No advertise URL: each node advertises https:// and its listener.
    let config = config(dir.path(), &pg_store(None), &http_extra, "");
    let env = [("OVERSEER_DATABASE_URL", database.as_str())];
    let owner = Served::start(&config, &env)?;
    let other = Served::start(&config, &env)?;
    let client = ca.client();
    let (id, call) = pending_session(&client, &owner.url("")).await?;
    // Asked of the other node, the owner answers, over HTTPS.
    let (status, v) = send(
        client
            .get(other.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(token()),
    )
    .await?;
    assert_eq!(status, 200, "{v}");
    let (status, v) = approve(&client, &other.url(""), &id, &call).await?;
    assert_eq!(status, 200, "forwarded decision: {v}");
    let metrics = common::answer(client.get(other.url("/metrics")).bearer_auth(token()))
        .await?
        .text;
    let forwarded_ok = metrics
        .lines()
        .find(|l| {
            l.starts_with("overseer_cluster_forwarded_requests_total")
                && l.contains("outcome=\"ok\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(forwarded_ok >= 2.0, "forwards: {forwarded_ok}\n{metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_over_plain_http_off_loopback_is_refused() -> Result {
    let database = common::pg::shared().database().await?;
    let dir = tempfile::tempdir()?;
    let ca = Ca::new("cluster CA");
    write_cert(dir.path(), &ca.server_cert());
    let env = [("OVERSEER_DATABASE_URL", database.as_str())];
    // The owner advertises plain HTTP on an address off loopback
    // (TEST-NET-1: never connected to, the refusal comes first).
    let owner_config = config(dir.path(), &pg_store(Some("http://192.0.2.1:9")), "", "");
    let owner = Served::start(&owner_config, &env)?;
    let config = config(dir.path(), &pg_store(None), "", "");
    let other = Served::start(&config, &env)?;
    let client = ca.client();
    let (id, _call) = pending_session(&client, &owner.url("")).await?;
    let (status, v) = send(
        client
            .get(other.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(token()),
    )
    .await?;
    assert_eq!(status, 500, "{v}");
    assert_eq!(v["error"]["code"], "insecure_forward", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("cluster.allow_plain_http"), "{message}");
    assert!(message.contains("http://192.0.2.1:9"), "{message}");
    drop(other);

    // Allowed explicitly, the forward is attempted (and, to an address
    // nobody answers at, ends as an unreachable owner instead).
    let allowing = config_allowing(dir.path());
    let other = Served::start(&allowing, &env)?;
    let (status, v) = send(
        client
            .get(other.url(&format!("/v1/sessions/{id}")))
            .bearer_auth(token()),
    )
    .await?;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "owner_unreachable", "{v}");
    drop(owner);
    Ok(())
}

fn config_allowing(dir: &Path) -> PathBuf {
    config(
        dir,
        &format!("{}allow_plain_http = true\n", pg_store(None)),
        "",
        "",
    )
}
