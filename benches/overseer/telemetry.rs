//! `--telemetry off|live|dead` (issue 30): the workload with trace export to
//! a live OTLP receiver (a local HTTP server that accepts and discards, on a
//! thread of its own) or to a port nothing listens on (every export fails,
//! its spans are dropped and counted). The figure against `off` is the cost
//! of tracing per session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::Res;

/// Requests the live receiver answered.
pub static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Starts telemetry for `mode`; `None` for `off`.
pub fn start(mode: &str) -> Res<Option<overseer::telemetry::Telemetry>> {
    let endpoint = match mode {
        "off" => return Ok(None),
        "live" => live_receiver()?,
        "dead" => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            format!("http://{}", l.local_addr()?)
        }
        other => return Err(format!("--telemetry is off, live or dead, not {other}").into()),
    };
    let section = overseer::telemetry::TelemetrySection {
        otlp_endpoint: endpoint,
        service_name: "overseer-bench".into(),
        ..Default::default()
    };
    let settings = section.resolve(|_| None)?;
    let telemetry = overseer::telemetry::init(
        &overseer::telemetry::LogSection::default(),
        settings.as_ref(),
    )?;
    Ok(Some(telemetry))
}

fn live_receiver() -> Res<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let url = format!("http://{}", listener.local_addr()?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let received = Arc::new(());
    std::thread::spawn(move || {
        let _keep = received;
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let app = axum::Router::new().route(
                "/v1/traces",
                axum::routing::post(|_body: axum::body::Bytes| async {
                    RECEIVED.fetch_add(1, Ordering::Relaxed);
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }),
            );
            let _ = axum::serve(listener, app).await;
        });
    });
    Ok(url)
}
