//! Retention on PostgreSQL: a terminal session deleted whole in one
//! transaction (header, checkpoint records, queue, decisions, webhook
//! deliveries, the blobs no other row names, its configuration if no other
//! session names it, and the lease of a tree left empty), refused for a session that is not terminal or whose tree another
//! live node owns.
//!
//! It owns no policy: which sessions to purge and when is
//! `overseer_actors::janitor`'s.

use overseer_actors::model::SessionId;
use overseer_actors::store::StoreError;
use uuid::Uuid;

use super::{map_pg, session_id, PgStore};
use crate::store::configs;

impl PgStore {
    /// Deletes a terminal session whole, in one transaction, so a purge cut
    /// short leaves nothing behind (the sled store needs a marker for that).
    ///
    /// Locks, in this order: the session's row (`FOR UPDATE`: a checkpoint
    /// of it waits, then finds nothing to update), its tree's lease row
    /// (`FOR SHARE`: a claim waits), the blobs it names (`FOR UPDATE`, in
    /// hash order), then its configuration (its advisory lock, exclusive,
    /// which a checkpoint taking the configuration up holds shared; see
    /// `writer`). A
    /// checkpoint that stores a blob locks its row too
    /// (`ON CONFLICT DO UPDATE`), so a blob another session is taking up
    /// just now is either seen referenced here (that checkpoint committed
    /// first) or inserted again by it (this purge committed first): never
    /// deleted under a reference.
    ///
    /// In a cluster only the node owning the tree purges (or any node once
    /// the owner is dead): the owner knows whether an actor of the session
    /// still runs. Another live owner is [`StoreError::NotOwner`].
    pub(super) async fn purge_once(&self, id: SessionId) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(map_pg)?;
        self.trip();
        let Some(row) = tx
            .query_opt(
                "SELECT s.header, s.root_id, c.config, s.config_hash
                 FROM sessions s LEFT JOIN configs c ON c.hash = s.config_hash
                 WHERE s.id = $1 FOR UPDATE OF s",
                &[&id.0],
            )
            .await
            .map_err(map_pg)?
        else {
            return Ok(());
        };
        let text: String = row.get(0);
        let root: Uuid = row.get(1);
        let config: Option<String> = row.get(2);
        let config_hash: Option<String> = row.get(3);
        let header = configs::decode_header(&id, text.as_bytes(), |_| Ok(config))?;
        if !header.status.is_terminal() {
            return Err(StoreError::NotTerminal {
                session: id,
                status: header.status,
            });
        }
        let owner = tx
            .query_opt(
                "SELECT n.url FROM leases l JOIN nodes n ON n.id = l.node_id
                 WHERE l.root_id = $1 AND l.node_id <> $2
                   AND n.heartbeat_at > now() - make_interval(secs => $3)
                 FOR SHARE OF l",
                &[
                    &root,
                    &self.inner.node,
                    &self.inner.options.lease.as_secs_f64(),
                ],
            )
            .await
            .map_err(map_pg)?;
        if let Some(owner) = owner {
            let url: String = owner.get(0);
            return Err(StoreError::NotOwner {
                session: id,
                reason: format!("node {url} holds its lease; it purges the session"),
            });
        }
        let hashes: Vec<String> = tx
            .query(
                "SELECT hash FROM blobs WHERE hash IN (
                     SELECT unnest(blobs) FROM checkpoints
                     WHERE session_id = $1 AND blobs IS NOT NULL)
                 ORDER BY hash FOR UPDATE",
                &[&id.0],
            )
            .await
            .map_err(map_pg)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // Its configuration, locked before anyone is asked whether they
        // still name it: see `writer` on a checkpoint taking it up at the
        // same time.
        if let Some(hash) = &config_hash {
            tx.execute(super::writer::LOCK_CONFIGS, &[&vec![hash.as_str()]])
                .await
                .map_err(map_pg)?;
        }
        for sql in [
            "DELETE FROM sessions WHERE id = $1",
            "DELETE FROM checkpoints WHERE session_id = $1",
            "DELETE FROM queue WHERE session_id = $1",
            "DELETE FROM decisions WHERE session_id = $1",
            // Its webhook deliveries (a log bounded per endpoint: no index).
            "DELETE FROM webhook_deliveries WHERE session_id = $1",
        ] {
            tx.execute(sql, &[&id.0]).await.map_err(map_pg)?;
        }
        if !hashes.is_empty() {
            // A new snapshot (read committed): sees every reference
            // committed before the locks above were granted.
            tx.execute(
                "DELETE FROM blobs b WHERE b.hash = ANY($1)
                   AND NOT EXISTS (SELECT 1 FROM checkpoints c
                                   WHERE c.blobs @> ARRAY[b.hash] AND c.blobs IS NOT NULL)",
                &[&hashes],
            )
            .await
            .map_err(map_pg)?;
        }
        if let Some(hash) = &config_hash {
            // A new snapshot (read committed) after the lock: every session
            // naming it that committed before the lock was granted.
            tx.execute(
                "DELETE FROM configs c WHERE c.hash = $1
                   AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.config_hash = c.hash)",
                &[hash],
            )
            .await
            .map_err(map_pg)?;
        }
        // A tree whose last session is gone has no lease to keep.
        let released = tx
            .execute(
                "DELETE FROM leases l WHERE l.root_id = $1
               AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.root_id = $1)",
                &[&root],
            )
            .await
            .map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        if released > 0 {
            self.inner.leases.remove(&session_id(root));
            self.publish_owned();
        }
        Ok(())
    }
}
