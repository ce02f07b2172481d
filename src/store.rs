//! The durable implementations of the [`CheckpointStore`] port, side by
//! side: the embedded sled store ([`sled`], [`SledStore`]) and the PostgreSQL
//! store of cluster mode ([`postgres`]), with what they share: the stored
//! form of a session (`codec`: header, transcript entry, events, blobs; no
//! engine types), [`Durability`], copying every session from one store to
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
pub mod copy;
pub mod postgres;
pub mod sled;
pub mod upgrade;

pub use self::sled::check::{check, CheckReport};
pub use self::sled::{
    Compression, Inspector, OpenError, SledStore, StoreOptions, StoreWatch, DEFAULT_CACHE_MB,
    MAX_CACHE_MB,
};
pub use self::upgrade::Upgrade;

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
