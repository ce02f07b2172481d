//! The batch span processor: ended spans go into a bounded queue, and a
//! thread of its own exports them in batches over the OTLP exporter.
//!
//! It exists because the SDK's batch processor neither counts what it drops
//! nor runs an async HTTP client: here a span that finds the queue full, or
//! whose export fails (the collector is down or slow), is dropped and
//! counted (`overseer_otel_spans_dropped_total`), and the request path
//! never waits: `on_end` is one `try_send`. It deliberately does not retry a
//! failed export: spans are diagnostics, and a collector that is down would
//! otherwise hold the queue full.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

/// Spans dropped (queue full, export failed), by Prometheus name.
pub const SPANS_DROPPED_TOTAL: &str = "overseer_otel_spans_dropped_total";
/// Spans the collector accepted.
pub const SPANS_EXPORTED_TOTAL: &str = "overseer_otel_spans_exported_total";

/// Queue and batching of the exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// Spans held at most.
    pub max_queue: usize,
    /// Spans per request at most.
    pub max_batch: usize,
    /// Longest wait before a partial batch is sent.
    pub interval: Duration,
    /// Longest one export request may take.
    pub timeout: Duration,
}

/// What the processor has done, for tests and diagnostics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Spans dropped.
    pub dropped: AtomicU64,
    /// Spans exported.
    pub exported: AtomicU64,
}

enum Control {
    Flush(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

/// The processor the tracer provider calls.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
    counters: Arc<Counters>,
    timeout: Duration,
}

impl QueueProcessor {
    /// Starts the export thread around `exporter`.
    pub(super) fn start<E: SpanExporter + 'static>(
        mut exporter: E,
        resource: &Resource,
        options: ExportOptions,
    ) -> std::io::Result<Self> {
        exporter.set_resource(resource);
        let (spans, queue) = mpsc::channel(options.max_queue.max(1));
        let (control, orders) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let timeout = options.timeout;
        let c = counters.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || runtime.block_on(export_loop(exporter, queue, orders, options, c)))?;
        Ok(Self {
            spans,
            control,
            counters,
            timeout,
        })
    }

    fn order(&self, make: impl FnOnce(oneshot::Sender<()>) -> Control) -> OTelSdkResult {
        let (tx, rx) = oneshot::channel();
        self.control
            .send(make(tx))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        // Called at shutdown or by an explicit flush, never on the request
        // path; bounded by the export timeout (plus one batch interval).
        let deadline = std::time::Instant::now() + self.timeout * 2;
        let mut rx = rx;
        loop {
            match rx.try_recv() {
                Ok(()) => return Ok(()),
                Err(oneshot::error::TryRecvError::Closed) => return Ok(()),
                Err(oneshot::error::TryRecvError::Empty) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(OTelSdkError::Timeout(self.timeout * 2));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(SPANS_DROPPED_TOTAL).increment(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.order(Control::Flush)
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.order(Control::Shutdown)
    }
}

async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut queue: mpsc::Receiver<SpanData>,
    mut orders: mpsc::UnboundedReceiver<Control>,
    options: ExportOptions,
    counters: Arc<Counters>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(options.max_batch);
    let mut tick = tokio::time::interval(options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut done: Option<(oneshot::Sender<()>, bool)> = None;
        tokio::select! {
            span = queue.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    if batch.len() < options.max_batch {
                        continue;
                    }
                }
                None => return,
            },
            _ = tick.tick() => {}
            order = orders.recv() => match order {
                Some(Control::Flush(tx)) => done = Some((tx, false)),
                Some(Control::Shutdown(tx)) => done = Some((tx, true)),
                None => return,
            },
        }
        // Everything queued so far goes, in batches.
        while let Ok(span) = queue.try_recv() {
            batch.push(span);
            if batch.len() >= options.max_batch {
                send(&exporter, std::mem::take(&mut batch), &options, &counters).await;
            }
        }
        if !batch.is_empty() {
            send(&exporter, std::mem::take(&mut batch), &options, &counters).await;
        }
        if let Some((tx, stop)) = done {
            let _ = tx.send(());
            if stop {
                let _ = exporter.shutdown();
                return;
            }
        }
    }
}

async fn send<E: SpanExporter>(
    exporter: &E,
    batch: Vec<SpanData>,
    options: &ExportOptions,
    counters: &Counters,
) {
    let n = batch.len() as u64;
    let ok = matches!(
        tokio::time::timeout(options.timeout, exporter.export(batch)).await,
        Ok(Ok(()))
    );
    if ok {
        counters.exported.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(SPANS_EXPORTED_TOTAL).increment(n);
    } else {
        counters.dropped.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(SPANS_DROPPED_TOTAL).increment(n);
    }
}
