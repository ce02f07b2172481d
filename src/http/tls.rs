//! TLS on the listener (`[http] tls_cert` / `tls_key`): the rustls server
//! configuration, with HTTP/2 and HTTP/1.1 offered by ALPN, and its
//! certificate reloaded without a restart.
//!
//! It owns reading the PEM files, the certificate a new handshake gets, and
//! reloading it (on SIGHUP, or when either file changes, seen by polling
//! every [`POLL`]). A reload only changes what the *next* handshake gets:
//! open connections (event streams included) keep theirs and are never
//! dropped for it. A reload that fails (a half-written file, a key that
//! does not match the certificate) is logged and changes nothing; the
//! server goes on with the certificate it has.
//!
//! It deliberately knows nothing of connections (`conn` does the handshake
//! under its own timeouts) nor of what is served over them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// How often the certificate and key files are looked at for a change.
pub const POLL: Duration = Duration::from_secs(2);

/// Why a certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key}: cannot read {path}: {source}")]
    Read {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{key}: {path}: {why}")]
    Pem {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the certificate and key together.
    #[error("http.tls_cert / http.tls_key: {0}")]
    Rustls(String),
}

/// Where the certificate chain and its key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The listener's TLS: the acceptor `conn` hands connections to, and the
/// certificate it can swap.
pub struct Tls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    resolver: Arc<Reloadable>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

/// The certificate new handshakes get.
#[derive(Debug)]
struct Reloadable {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloadable {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c))
    }
}

impl Tls {
    /// Loads `files` and builds the server configuration (TLS 1.2 and 1.3,
    /// ALPN `h2` then `http/1.1`).
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let certified = load_certified(&files, &provider)?;
        let resolver = Arc::new(Reloadable {
            current: RwLock::new(Arc::new(certified)),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(Self {
            files,
            provider,
            resolver,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        }))
    }

    /// The acceptor for new connections.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// The files it serves.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again and, if they hold a usable certificate and
    /// key, gives them to every handshake from now on.
    pub fn reload(&self) -> Result<(), TlsError> {
        let certified = load_certified(&self.files, &self.provider)?;
        if let Ok(mut current) = self.resolver.current.write() {
            *current = Arc::new(certified);
        }
        Ok(())
    }

    /// Reloads on SIGHUP and when either file changes, until `stop`
    /// resolves. Each reload is logged and announced on stderr
    /// (`reloaded the TLS certificate from … (SIGHUP)` or `(a file
    /// changed)`), each failure logged. The SIGHUP handler is installed
    /// before this returns (a SIGHUP's default action ends the process), so
    /// call it before announcing that the server listens.
    pub fn watch(
        self: Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        #[cfg(unix)]
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler; the certificate is reloaded when its files change");
                None
            }
        };
        async move {
            tokio::pin!(stop);
            let mut seen = self.stamp();
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hup.as_mut() {
                        Some(s) => {
                            s.recv().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<()>();
                let why = tokio::select! {
                    () = &mut stop => return,
                    () = hangup => "SIGHUP",
                    () = tokio::time::sleep(POLL) => {
                        if self.stamp() == seen {
                            continue;
                        }
                        "a file changed"
                    }
                };
                seen = self.stamp();
                self.reload_announced(why);
            }
        }
    }

    fn reload_announced(&self, why: &str) {
        match self.reload() {
            Ok(()) => {
                tracing::info!(cert = %self.files.cert.display(), why, "reloaded the TLS certificate");
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "reloaded the TLS certificate from {} ({why})",
                    self.files.cert.display()
                );
            }
            Err(e) => tracing::error!(
                error = %e, why,
                "the TLS certificate was not reloaded; still serving the previous one"
            ),
        }
    }

    /// What identifies the files' contents cheaply: their modification
    /// times and lengths.
    fn stamp(&self) -> [Option<(SystemTime, u64)>; 2] {
        let of = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        [of(&self.files.cert), of(&self.files.key)]
    }
}

fn load_certified(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let read = |key: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            key,
            path: path.to_owned(),
            source,
        })
    };
    let cert_pem = read("http.tls_cert", &files.cert)?;
    let key_pem = read("http.tls_key", &files.key)?;
    let pem = |key: &'static str, path: &Path, why: String| TlsError::Pem {
        key,
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            pem(
                "http.tls_cert",
                &files.cert,
                format!("not PEM certificates: {e}"),
            )
        })?;
    if certs.is_empty() {
        return Err(pem(
            "http.tls_cert",
            &files.cert,
            "no CERTIFICATE block (expected a PEM certificate chain, leaf first)".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        pem(
            "http.tls_key",
            &files.key,
            format!("no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        TlsError::Rustls(format!(
            "the key does not fit the certificate, or is of a kind not supported: {e}"
        ))
    })
}
