//! The webhook outbox and delivery log in PostgreSQL: the [`WebhookStore`]
//! of a cluster (tables of migration 5, see `schema`).
//!
//! A checkpoint inserts the deliveries of its events in its own statement
//! (`writer`'s `w`), so a delivery exists exactly when its event committed:
//! there is nothing to take in ([`WebhookStore::intake`] keeps its default).
//! Every node's delivery task claims due deliveries with `FOR UPDATE SKIP
//! LOCKED` and a lease (`lease_node`, `lease_until_ms`): two nodes never
//! claim the same delivery at once, and one claimed by a node that died is
//! claimed again by a survivor once the lease has run out. An attempt's
//! outcome is recorded only while the recording node still holds the claim.
//!
//! Tenants without endpoints cost no row: the checkpoint's insert is an
//! `INSERT … SELECT` joined with the tenant's enabled endpoints (indexed by
//! tenant), read in the checkpoint's own statement, so a registration
//! committed on any node is seen by the next checkpoint on every node, and
//! no node skips on its own view of the registrations (which can lag
//! another node's). What such a tenant's event still costs is its seed, a
//! reference of a few hundred bytes, in the statement's parameters. The
//! seed column holds that reference; the body is built at delivery from the
//! stored session (`crate::webhooks::payload`).
//!
//! It deliberately holds no delivery policy; that is `crate::webhooks`'.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use overseer_actors::store::StoreError;
use uuid::Uuid;

use super::{map_pg, retrying, PgStore, Prepared, READ_RETRY};
use crate::webhooks::{
    Claim, Clock, Delivery, DeliveryKey, DeliveryStatus, Endpoint, Outcome, Seed, Subscriptions,
    SystemClock, WebhookStore, LOG_KEEP,
};

/// Finished deliveries between two prunings of an endpoint's log.
const PRUNE_EVERY: u64 = 256;
static FINISHED: AtomicU64 = AtomicU64::new(0);

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        session: "webhooks".into(),
        detail: format!("unreadable {what}: {e}"),
    }
}

/// Puts `seeds` into the parameters of a checkpoint's statement.
pub(super) fn add_seeds(prepared: &mut Prepared, seeds: &[Seed]) -> Result<(), StoreError> {
    if seeds.is_empty() {
        return Ok(());
    }
    for seed in seeds {
        prepared.hook_ids.push(seed.id.clone());
        prepared.hook_events.push(seed.event.as_str().to_owned());
        prepared.hook_seeds.push(
            serde_json::to_string(seed)
                .map_err(|e| StoreError::io("cannot encode a webhook seed", e))?,
        );
    }
    prepared.hook_now_ms = SystemClock.now_ms();
    Ok(())
}

/// The columns a delivery is read back from, in this order.
const DELIVERY_COLUMNS: &str = "endpoint_id, seed, status, attempts, created_at_ms, \
     next_attempt_at_ms, last_attempt_at_ms, last_status_code, last_error, delivered_at_ms, body";

fn delivery(row: &tokio_postgres::Row) -> Result<Delivery, StoreError> {
    let seed: String = row.get(1);
    let status: String = row.get(2);
    let attempts: i32 = row.get(3);
    let code: Option<i32> = row.get(7);
    Ok(Delivery {
        endpoint: row.get(0),
        seed: serde_json::from_str(&seed).map_err(|e| corrupt("webhook seed", e))?,
        status: DeliveryStatus::parse(&status)
            .ok_or_else(|| corrupt("delivery status", &status))?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        created_at_ms: row.get(4),
        next_attempt_at_ms: row.get(5),
        last_attempt_at_ms: row.get(6),
        last_status_code: code.and_then(|c| u16::try_from(c).ok()),
        last_error: row.get(8),
        delivered_at_ms: row.get(9),
        body: row.get(10),
    })
}

fn endpoint_row(row: &tokio_postgres::Row) -> Result<Endpoint, StoreError> {
    let text: String = row.get(0);
    serde_json::from_str(&text).map_err(|e| corrupt("webhook endpoint", e))
}

impl PgStore {
    /// From now on, checkpoints insert the webhook deliveries of their
    /// events (for the endpoints the database has) and tell
    /// `subscriptions` when they committed some. Call once, before any
    /// session checkpoints.
    pub fn set_webhooks(&self, subscriptions: std::sync::Arc<Subscriptions>) {
        let _ = self.inner.webhooks.set(subscriptions);
    }
}

#[async_trait::async_trait]
impl WebhookStore for PgStore {
    async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<(), StoreError> {
        let text = serde_json::to_string(endpoint)
            .map_err(|e| StoreError::io("cannot encode an endpoint", e))?;
        let events: Vec<String> = endpoint
            .events
            .iter()
            .map(|e| e.as_str().to_owned())
            .collect();
        let disabled = endpoint.disabled.is_some();
        retrying(self.inner.options.write_retry, || async {
            let client = self.client().await?;
            self.trip();
            client
                .execute(
                    "INSERT INTO webhook_endpoints (id, tenant, events, disabled, endpoint)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant,
                         events = EXCLUDED.events, disabled = EXCLUDED.disabled,
                         endpoint = EXCLUDED.endpoint",
                    &[&endpoint.id, &endpoint.tenant, &events, &disabled, &text],
                )
                .await
                .map_err(map_pg)
        })
        .await
        .map(|_| ())
    }

    async fn endpoint(&self, id: Uuid) -> Result<Option<Endpoint>, StoreError> {
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query_opt(
                    "SELECT endpoint FROM webhook_endpoints WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(map_pg)?
                .map(|r| endpoint_row(&r))
                .transpose()
        })
        .await
    }

    async fn endpoints(&self, tenant: Option<&str>) -> Result<Vec<Endpoint>, StoreError> {
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query(
                    "SELECT endpoint FROM webhook_endpoints
                     WHERE $1::text IS NULL OR tenant = $1 ORDER BY id",
                    &[&tenant],
                )
                .await
                .map_err(map_pg)?
                .iter()
                .map(endpoint_row)
                .collect()
        })
        .await
    }

    async fn delete_endpoint(&self, id: Uuid) -> Result<bool, StoreError> {
        retrying(self.inner.options.write_retry, || async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(map_pg)?;
            self.trip();
            tx.execute(
                "DELETE FROM webhook_deliveries WHERE endpoint_id = $1",
                &[&id],
            )
            .await
            .map_err(map_pg)?;
            let n = tx
                .execute("DELETE FROM webhook_endpoints WHERE id = $1", &[&id])
                .await
                .map_err(map_pg)?;
            tx.commit().await.map_err(map_pg)?;
            Ok(n > 0)
        })
        .await
    }

    async fn claim_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
        _busy: &HashSet<DeliveryKey>,
    ) -> Result<Vec<Claim>, StoreError> {
        // Claims this node holds are not claimable (`lease_until_ms`), so
        // `busy` needs no check here. The endpoint comes with each claim.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "UPDATE webhook_deliveries d SET lease_node = $1, lease_until_ms = $2
             FROM (SELECT endpoint_id, id FROM webhook_deliveries
                   WHERE status = 'pending' AND next_attempt_at_ms <= $3 AND lease_until_ms <= $3
                   ORDER BY next_attempt_at_ms LIMIT $4
                   FOR UPDATE SKIP LOCKED) c
             WHERE d.endpoint_id = c.endpoint_id AND d.id = c.id
             RETURNING {}, (SELECT e.endpoint FROM webhook_endpoints e WHERE e.id = d.endpoint_id)",
            DELIVERY_COLUMNS
                .split(", ")
                .map(|c| format!("d.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let node = self.inner.node;
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query(&sql, &[&node, &lease_until_ms, &now_ms, &limit])
                .await
                .map_err(map_pg)?
                .iter()
                .map(|row| {
                    let endpoint: Option<String> = row.get(11);
                    Ok(Claim {
                        delivery: delivery(row)?,
                        endpoint: endpoint
                            .map(|text| serde_json::from_str(&text))
                            .transpose()
                            .map_err(|e| corrupt("webhook endpoint", e))?,
                        // The checkpoint wrote the delivery itself.
                        fresh: false,
                    })
                })
                .collect()
        })
        .await
    }

    async fn next_due(&self, after_ms: i64) -> Result<Option<i64>, StoreError> {
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            let row = client
                .query_one(
                    "SELECT min(GREATEST(next_attempt_at_ms, lease_until_ms))
                     FROM webhook_deliveries
                     WHERE status = 'pending' AND GREATEST(next_attempt_at_ms, lease_until_ms) > $1",
                    &[&after_ms],
                )
                .await
                .map_err(map_pg)?;
            Ok(row.get::<_, Option<i64>>(0))
        })
        .await
    }

    async fn save_deliveries(&self, outcomes: &[Outcome]) -> Result<(), StoreError> {
        if outcomes.is_empty() {
            return Ok(());
        }
        // One statement for the batch: the columns as arrays, unnested.
        let n = outcomes.len();
        let mut endpoints = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(n);
        let mut statuses = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut next = Vec::with_capacity(n);
        let mut last_at = Vec::with_capacity(n);
        let mut codes = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut delivered = Vec::with_capacity(n);
        let mut bodies = Vec::with_capacity(n);
        let mut seeds = Vec::with_capacity(n);
        let mut finished: Vec<Uuid> = Vec::new();
        for Outcome { delivery: d, .. } in outcomes {
            endpoints.push(d.endpoint);
            ids.push(d.seed.id.clone());
            statuses.push(d.status.as_str().to_owned());
            attempts.push(i32::try_from(d.attempts).unwrap_or(i32::MAX));
            next.push(d.next_attempt_at_ms);
            last_at.push(d.last_attempt_at_ms);
            codes.push(d.last_status_code.map(i32::from));
            errors.push(d.last_error.clone());
            delivered.push(d.delivered_at_ms);
            bodies.push(d.body.clone());
            seeds.push(
                serde_json::to_string(&d.seed)
                    .map_err(|e| StoreError::io("cannot encode a webhook seed", e))?,
            );
            if d.status != DeliveryStatus::Pending && !finished.contains(&d.endpoint) {
                finished.push(d.endpoint);
            }
        }
        let node = self.inner.node;
        retrying(self.inner.options.write_retry, || async {
            let client = self.client().await?;
            self.trip();
            client
                .execute(
                    "UPDATE webhook_deliveries d SET status = u.status, attempts = u.attempts,
                         next_attempt_at_ms = u.next, last_attempt_at_ms = u.last_at,
                         last_status_code = u.code, last_error = u.error,
                         delivered_at_ms = u.delivered, body = u.body, seed = u.seed,
                         lease_node = NULL, lease_until_ms = 0
                     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::bigint[],
                                 $6::bigint[], $7::int[], $8::text[], $9::bigint[], $10::text[],
                                 $11::text[])
                          AS u(endpoint_id, id, status, attempts, next, last_at, code, error,
                               delivered, body, seed)
                     WHERE d.endpoint_id = u.endpoint_id AND d.id = u.id AND d.lease_node = $12",
                    &[
                        &endpoints, &ids, &statuses, &attempts, &next, &last_at, &codes, &errors,
                        &delivered, &bodies, &seeds, &node,
                    ],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        let count = finished.len() as u64;
        let before = FINISHED.fetch_add(count, Ordering::Relaxed);
        if count > 0 && before / PRUNE_EVERY != (before + count) / PRUNE_EVERY {
            let keep = i64::try_from(LOG_KEEP).unwrap_or(i64::MAX);
            let client = self.client().await?;
            self.trip();
            for endpoint in finished {
                // The newest LOG_KEEP stay, and older ones still pending.
                client
                    .execute(
                        "DELETE FROM webhook_deliveries WHERE endpoint_id = $1 AND status <> 'pending'
                           AND id < (SELECT min(id) FROM (
                               SELECT id FROM webhook_deliveries WHERE endpoint_id = $1
                               ORDER BY id DESC LIMIT $2) newest)
                           AND (SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1) > $2",
                        &[&endpoint, &keep],
                    )
                    .await
                    .map_err(map_pg)?;
            }
        }
        Ok(())
    }

    async fn pending_count(&self) -> Result<u64, StoreError> {
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            let row = client
                .query_one(
                    "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'",
                    &[],
                )
                .await
                .map_err(map_pg)?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .await
    }

    async fn deliveries(
        &self,
        endpoint: Uuid,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
             WHERE endpoint_id = $1 AND ($2::text IS NULL OR id < $2)
             ORDER BY id DESC LIMIT $3"
        );
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query(&sql, &[&endpoint, &before, &limit])
                .await
                .map_err(map_pg)?
                .iter()
                .map(delivery)
                .collect()
        })
        .await
    }
}
