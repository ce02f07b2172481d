//! [`SharedConfig`]: a session's [`EffectiveConfig`] held behind an `Arc`,
//! with its JSON kept once it has been written.
//!
//! Every session records the configuration it runs under in its header (so
//! that a later change to the agent's preset does not change it), and the
//! header is cloned and serialized at every checkpoint. Most sessions of an
//! agent run under the very same configuration, though, and it changes at
//! most once or twice in a session's life (a model switch). Sharing it makes
//! a header clone an `Arc` increment instead of a deep copy of the
//! instructions and tool lists, lets the sessions of one agent share one copy
//! in memory (the runtime interns it, `Runtime::share_config`), and lets the
//! JSON of the configuration be produced once per configuration instead of
//! once per checkpoint: the stored bytes are exactly what serializing the
//! configuration gives.
//!
//! Its content hash ([`SharedConfig::hash`]: SHA-256 of that JSON) is kept
//! the same way, once per configuration: the stores keep each distinct
//! configuration once, under its hash, and a stored header names its
//! configuration by that hash instead of carrying it (issue 28).
//!
//! This module deliberately owns no policy on which configurations are
//! shared: that is the runtime's.

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::EffectiveConfig;

/// A shared, copy-on-write [`EffectiveConfig`]; reads go through `Deref`,
/// changes through [`SharedConfig::make_mut`].
#[derive(Clone)]
pub struct SharedConfig(Arc<Inner>);

struct Inner {
    config: EffectiveConfig,
    /// The configuration's JSON, made at its first serialization. Only ever
    /// set for this exact value: [`SharedConfig::make_mut`] drops it.
    json: OnceLock<Box<RawValue>>,
    /// SHA-256 of `json`, made when first asked for; dropped with it.
    hash: OnceLock<[u8; 32]>,
}

/// The hash of a value whose JSON cannot be made, which serde_json cannot
/// fail at for this type (string keys, no failing serializer). Never
/// stored: a store encodes the JSON itself, which fails first.
const UNHASHABLE: [u8; 32] = [0; 32];

impl SharedConfig {
    /// The configuration, to change: a copy of its own if another session
    /// shares it, and in either case without the JSON made before the change.
    pub fn make_mut(&mut self) -> &mut EffectiveConfig {
        let inner = Arc::make_mut(&mut self.0);
        inner.json = OnceLock::new();
        inner.hash = OnceLock::new();
        &mut inner.config
    }

    /// The configuration's JSON, exactly as serializing it gives (and as a
    /// header embeds it), made once per configuration.
    pub fn json(&self) -> Option<&RawValue> {
        if let Some(raw) = self.0.json.get() {
            return Some(raw);
        }
        let raw = serde_json::value::to_raw_value(&self.0.config).ok()?;
        Some(self.0.json.get_or_init(|| raw))
    }

    /// SHA-256 of [`SharedConfig::json`]: the content hash by which the
    /// stores keep one copy of each distinct configuration. Computed once
    /// per configuration value (not per checkpoint): every session sharing
    /// this value, and every checkpoint of each, reuses it.
    pub fn hash(&self) -> [u8; 32] {
        *self.0.hash.get_or_init(|| match self.json() {
            Some(raw) => Sha256::digest(raw.get().as_bytes()).into(),
            None => UNHASHABLE,
        })
    }

    /// Whether both are the same shared value (not merely equal).
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Clone for Inner {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            json: OnceLock::new(),
            hash: OnceLock::new(),
        }
    }
}

impl From<EffectiveConfig> for SharedConfig {
    fn from(config: EffectiveConfig) -> Self {
        Self(Arc::new(Inner {
            config,
            json: OnceLock::new(),
            hash: OnceLock::new(),
        }))
    }
}

impl Deref for SharedConfig {
    type Target = EffectiveConfig;

    fn deref(&self) -> &EffectiveConfig {
        &self.0.config
    }
}

impl PartialEq for SharedConfig {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.0.config == other.0.config
    }
}

impl PartialEq<EffectiveConfig> for SharedConfig {
    fn eq(&self, other: &EffectiveConfig) -> bool {
        self.0.config == *other
    }
}

impl std::fmt::Debug for SharedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.config.fmt(f)
    }
}

/// Writes the kept JSON as it is (serde_json's raw value, which its writer
/// and `to_value` understand). Every serialization of a header is JSON (the
/// checkpoint format, the API); another format would see serde_json's
/// private raw-value struct instead.
impl Serialize for SharedConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.json() {
            Some(raw) => raw.serialize(serializer),
            // Cannot happen for this type (string keys, no failing
            // serializer); the plain path reports whatever it was.
            None => self.0.config.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for SharedConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        EffectiveConfig::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AgentConfig;

    fn config() -> EffectiveConfig {
        let mut agent = AgentConfig::new("a", &["t1", "t2"]);
        agent.instructions = "Be \"brief\".\nNo tabs:\t".into();
        agent.effective()
    }

    #[test]
    fn serializes_exactly_as_the_configuration_itself_every_time() {
        let plain = serde_json::to_string(&config()).unwrap();
        let shared = SharedConfig::from(config());
        // The first serialization makes the JSON, the second reuses it.
        assert_eq!(serde_json::to_string(&shared).unwrap(), plain);
        assert!(shared.0.json.get().is_some());
        assert_eq!(serde_json::to_string(&shared).unwrap(), plain);
        // Inside a value and through `to_value`, the same.
        assert_eq!(
            serde_json::to_value(&shared).unwrap(),
            serde_json::to_value(config()).unwrap()
        );
        let back: SharedConfig = serde_json::from_str(&plain).unwrap();
        assert_eq!(back, config());
    }

    #[test]
    fn the_hash_is_sha256_of_the_json_made_once_and_follows_a_change() {
        let mut mine = SharedConfig::from(config());
        let plain = serde_json::to_string(&config()).unwrap();
        let expected: [u8; 32] = Sha256::digest(plain.as_bytes()).into();
        assert_eq!(mine.hash(), expected);
        assert!(mine.0.hash.get().is_some());
        // Sharers reuse it; an equal configuration built apart hashes alike.
        let theirs = mine.clone();
        assert_eq!(theirs.hash(), expected);
        assert_eq!(SharedConfig::from(config()).hash(), expected);
        // Read back from its JSON, the same configuration has the same hash.
        let back: SharedConfig = serde_json::from_str(&plain).unwrap();
        assert_eq!(back.hash(), expected);

        mine.make_mut().model = "other".into();
        let mut changed = config();
        changed.model = "other".into();
        let changed: [u8; 32] =
            Sha256::digest(serde_json::to_string(&changed).unwrap().as_bytes()).into();
        assert_eq!(mine.hash(), changed);
        assert_ne!(mine.hash(), theirs.hash());
        assert_eq!(theirs.hash(), expected);
        // Changed again while no one else shares it: the hash made in
        // between must not survive.
        mine.make_mut().max_steps = 3;
        let mut again = config();
        again.model = "other".into();
        again.max_steps = 3;
        let again: [u8; 32] =
            Sha256::digest(serde_json::to_string(&again).unwrap().as_bytes()).into();
        assert_eq!(mine.hash(), again);
    }

    #[test]
    fn a_change_is_serialized_and_leaves_the_other_sharers_alone() {
        let mut mine = SharedConfig::from(config());
        let theirs = mine.clone();
        assert!(mine.ptr_eq(&theirs));
        let before = serde_json::to_string(&mine).unwrap();

        mine.make_mut().model = "other".into();
        assert!(!mine.ptr_eq(&theirs));
        assert_eq!(theirs.model, config().model);
        assert_eq!(serde_json::to_string(&theirs).unwrap(), before);
        let mut expected = config();
        expected.model = "other".into();
        assert_eq!(
            serde_json::to_string(&mine).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );

        // Changed again while no one else shares it: the JSON made in
        // between must not survive either.
        mine.make_mut().max_steps = 3;
        expected.max_steps = 3;
        assert_eq!(
            serde_json::to_string(&mine).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
    }
}
