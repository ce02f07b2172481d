//! `[log] format = "json"`: one JSON object per line with `timestamp`
//! (RFC 3339, UTC), `level`, `target`, `message`, `fields` (the event's
//! other fields), `span` (the innermost span's name) and, inside a traced
//! span, `trace_id` and `span_id` (hex, as the collector shows them).
//!
//! It owns the line's shape only; which lines are written is `RUST_LOG`'s.

use std::fmt;

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON line format.
pub(super) struct JsonLines;

#[derive(Default)]
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = fields.remove("message").unwrap_or(Value::Null);
        let meta = event.metadata();
        let timestamp = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut line = Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("message".into(), message);
        line.insert("fields".into(), Value::Object(fields));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = true;
            for span in scope {
                if innermost {
                    line.insert("span".into(), span.name().into());
                    innermost = false;
                }
                let found = tracing::dispatcher::get_default(|dispatch| {
                    tracing_opentelemetry::get_otel_context(&span.id(), dispatch)
                });
                let Some(cx) = found else { continue };
                let sc = cx.span().span_context().clone();
                if sc.is_valid() {
                    line.insert("trace_id".into(), sc.trace_id().to_string().into());
                    line.insert("span_id".into(), sc.span_id().to_string().into());
                    break;
                }
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}
