//! `[store]`: which checkpoint store a node uses and its options. It
//! deliberately opens nothing: `crate::service` does.

use std::path::PathBuf;

use crate::store::{Compression, Durability, StoreOptions, DEFAULT_CACHE_MB};
use serde::Deserialize;

/// Which checkpoint store a node uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The embedded sled database in `data_dir` (one node).
    #[default]
    Sled,
    /// PostgreSQL at `OVERSEER_DATABASE_URL`, shared by the nodes of a
    /// cluster.
    Postgres,
}

/// `[store]`: the embedded sled database, or PostgreSQL in cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `sled` (the default) or `postgres`.
    #[serde(default)]
    pub kind: StoreKind,
    /// Most connections a node opens to PostgreSQL.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Database directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Flush policy of checkpoints.
    #[serde(default)]
    pub durability: Durability,
    /// Most memory sled's page cache may hold, MiB.
    #[serde(default = "default_cache_mb")]
    pub cache_mb: u64,
    /// How a new sled directory stores its log: `none` (the default) or
    /// `zstd` (sled only; an existing directory keeps what it was created
    /// with).
    #[serde(default)]
    pub compression: Compression,
    /// Terminal sessions older than this many days are purged (unset: kept).
    #[serde(default)]
    pub retention_days: Option<u64>,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            kind: StoreKind::default(),
            pool_size: default_pool_size(),
            data_dir: default_data_dir(),
            durability: Durability::default(),
            cache_mb: default_cache_mb(),
            compression: Compression::default(),
            retention_days: None,
        }
    }
}

impl StoreSection {
    /// How the store is opened.
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            durability: self.durability,
            cache_mb: self.cache_mb,
            compression: self.compression,
            ..StoreOptions::default()
        }
    }
}

fn default_cache_mb() -> u64 {
    DEFAULT_CACHE_MB
}

fn default_pool_size() -> usize {
    crate::store::postgres::DEFAULT_POOL_SIZE
}

/// Largest `store.pool_size`.
pub const MAX_POOL_SIZE: usize = 1_000;

fn default_data_dir() -> PathBuf {
    PathBuf::from("data")
}
