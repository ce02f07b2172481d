//! A throwaway PostgreSQL server for the tests of cluster mode: Debian's
//! `postgresql` binaries, `initdb` into a temp directory and `pg_ctl start`
//! on a free loopback port, run as the unprivileged `postgres` user when the
//! tests run as root (PostgreSQL refuses to run as root). One server per test
//! binary ([`shared`]), one database per test ([`PgServer::database`]); a
//! test that restarts the server gets its own ([`PgServer::start`]).
//!
//! Nothing outlives the test process: beside each server runs a small
//! watchdog shell that stops it (`pg_ctl stop -m immediate`) and removes its
//! directory as soon as the test process is gone, however it ended.
//!
//! Where the binaries are missing the tests fail, saying how to install them;
//! they are never skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use anyhow::{bail, Context};

const INSTALL_HINT: &str =
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found in \
/usr/lib/postgresql/*/bin; the cluster-mode tests start a throwaway server with them. \
Install Debian's package: `apt-get install postgresql`";

/// A running throwaway server.
pub struct PgServer {
    pub port: u16,
    fsync: bool,
    bin: PathBuf,
    data: PathBuf,
    root: PathBuf,
    next_db: AtomicUsize,
}

/// The server every test of this binary shares.
// Test support (the bench includes this file too): a server that cannot
// start is the test's failure, with its reason.
#[allow(clippy::expect_used)]
pub fn shared() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| PgServer::start().expect("start the test PostgreSQL server"))
}

/// The directory of the newest installed PostgreSQL's binaries.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("pg_ctl").exists().then_some((v, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    match found.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!("{INSTALL_HINT}"),
    }
}

/// Whether this process runs as root (`/proc/self` belongs to the
/// effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `sh -c script`, as the `postgres` user when we are root.
fn as_pg(script: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh", "-c", script]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{what}: cannot run"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

impl PgServer {
    /// Initialises and starts a new server (a few seconds), with `fsync`
    /// off: tests check behaviour, not survival of a power cut.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(false)
    }

    /// [`PgServer::start`], choosing whether the server flushes its
    /// write-ahead log (the benchmarks measure with it on, as deployed).
    pub fn start_with(fsync: bool) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        if is_root() {
            let ok = Command::new("id")
                .args(["-u", "postgres"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                bail!("the tests run as root, and PostgreSQL refuses to: they run it as the `postgres` user, which does not exist. {INSTALL_HINT}");
            }
        }
        let root = tempfile::Builder::new()
            .prefix("overseer-pg-")
            .tempdir()?
            .keep();
        if is_root() {
            let mut chown = Command::new("chown");
            chown.args(["postgres:", &root.display().to_string()]);
            run(chown, "chown the test database directory")?;
        }
        let data = root.join("data");
        let port = free_port()?;
        let server = Self {
            port,
            fsync,
            bin,
            data,
            root,
            next_db: AtomicUsize::new(0),
        };
        run(
            as_pg(&format!(
                "{} -D {} -U postgres --auth=trust -E UTF8 --no-sync >/dev/null",
                quote(&server.bin.join("initdb")),
                quote(&server.data)
            )),
            "initdb",
        )?;
        server.pg_start()?;
        server.watchdog()?;
        Ok(server)
    }

    /// `pg_ctl start`, waiting until it accepts connections.
    pub fn pg_start(&self) -> anyhow::Result<()> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 \
             -c fsync={fsync} -c full_page_writes={fsync} -c shared_buffers=128MB",
            self.port,
            self.root.display(),
            fsync = if self.fsync { "on" } else { "off" },
        );
        run(
            as_pg(&format!(
                "{} -D {} -l {} -w -t 60 -o '{opts}' start >/dev/null",
                quote(&self.bin.join("pg_ctl")),
                quote(&self.data),
                quote(&self.root.join("log"))
            )),
            "pg_ctl start",
        )
    }

    /// `pg_ctl stop -m fast`: disconnects every client.
    pub fn pg_stop(&self) -> anyhow::Result<()> {
        run(
            as_pg(&format!(
                "{} -D {} -m fast -w stop >/dev/null",
                quote(&self.bin.join("pg_ctl")),
                quote(&self.data)
            )),
            "pg_ctl stop",
        )
    }

    /// Stops the server and removes its directory once this process is gone.
    fn watchdog(&self) -> anyhow::Result<()> {
        let script = format!(
            "while [ -d /proc/{pid} ]; do sleep 1; done; \
             {pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {root}",
            pid = std::process::id(),
            pg_ctl = quote(&self.bin.join("pg_ctl")),
            data = quote(&self.data),
            root = quote(&self.root),
        );
        as_pg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start the test database's watchdog")?;
        Ok(())
    }

    /// The URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// A fresh, empty database for one test; returns its URL.
    pub async fn database(&self) -> anyhow::Result<String> {
        let n = self.next_db.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        let (client, conn) = tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls)
            .await
            .context("connect to the test server")?;
        let task = tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .context("create the test database")?;
        drop(client);
        let _ = task.await;
        Ok(self.url(&name))
    }

    /// Runs SQL on database `url` (test set-up and inspection).
    pub async fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let task = tokio::spawn(conn);
        client.batch_execute(sql).await?;
        drop(client);
        let _ = task.await;
        Ok(())
    }

    /// One `bigint` (or count) from a query on `url`.
    pub async fn scalar(url: &str, sql: &str) -> anyhow::Result<i64> {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let task = tokio::spawn(conn);
        let v: i64 = client.query_one(sql, &[]).await?.get(0);
        drop(client);
        let _ = task.await;
        Ok(v)
    }
}
