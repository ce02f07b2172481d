//! The durable implementations of the [`CheckpointStore`] port, side by
//! side: the embedded sled store ([`sled`], [`SledStore`]) and the PostgreSQL
//! store of cluster mode ([`postgres`]), with what they share: the stored
//! form of a session (`codec`: header, transcript entry, events, blobs; no
//! engine types; `record`: the per-checkpoint record of layout 4, issue
//! 28; `configs`: agent configurations stored once each, by hash, and named
//! by hash in the headers), [`Durability`], copying every session from one store to
//! another ([`copy`]). The offline verification of a sled directory
//! (`overseer store check`) is the sled store's (`sled::check`).
//!
//! Nothing of one engine is in the other: each owns its keys or tables, its
//! writer and its migrations, and reads and writes the shared codec's values.
//! It deliberately owns no session semantics: what goes into a checkpoint,
//! and when, is decided by `overseer-actors`, whose in-memory store
//! (`MemStore`) keeps the same contract for tests and embedding
//! (`tests/store_contract.rs` runs the contract on all three).
//!
//! [`CheckpointStore`]: overseer_actors::store::CheckpointStore

pub mod backup;
mod codec;
mod configs;
pub mod copy;
pub mod postgres;
// Read and written by the stores from layout 4 on; until they are wired to
// it (the next commits), only its tests use it.
#[allow(dead_code)]
mod record;
pub mod sled;
pub mod upgrade;

pub use self::sled::check::{check, CheckReport};
pub use self::sled::{
    Compression, Inspector, OpenError, SledStore, StoreOptions, StoreWatch, DEFAULT_CACHE_MB,
    MAX_CACHE_MB,
};
pub use self::upgrade::Upgrade;

/// The oldest sled layout this binary reads (and upgrades).
pub const OLDEST_SLED_LAYOUT: u32 = 1;
/// The oldest PostgreSQL migration (an empty database is migrated from it).
pub const OLDEST_PG_MIGRATION: i32 = 1;

/// The sled layout this binary writes.
pub fn sled_layout() -> u32 {
    self::sled::FORMAT_VERSION
}

/// The newest PostgreSQL migration this binary knows.
pub fn pg_migration() -> i32 {
    self::postgres::latest_migration()
}

/// The store layouts and database migrations this binary understands, from
/// the stores' constants: what `overseer --version` prints after the
/// version number.
pub fn versions() -> String {
    format!(
        "sled layout {} (reads {}–{}), PostgreSQL migrations {}–{}",
        sled_layout(),
        OLDEST_SLED_LAYOUT,
        sled_layout(),
        OLDEST_PG_MIGRATION,
        pg_migration()
    )
}

/// When `checkpoint` returns (`durability` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the checkpoint is flushed to disk; concurrent checkpoints share
    /// one flush.
    #[default]
    Fsync,
    /// As soon as sled has the checkpoint in memory; nothing waits for a
    /// flush. sled's own background flusher still writes dirty buffers every
    /// 500 ms, so a crash loses at most about that much.
    Os,
}
