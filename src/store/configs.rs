//! Interned agent configurations, as every engine stores them: a header
//! names its configuration by content hash (`"config_hash":"<sha256 hex>"`
//! in place of `"config":{…}`), and the configuration itself is stored once
//! per distinct configuration, under that hash, beside the headers (issue
//! 28: it was a third of the header's bytes, rewritten at every
//! checkpoint). Reading joins the two again, so every reader sees the header
//! exactly as before; a header that embeds its configuration (written before
//! interning, or by layouts up to 4) reads as it always did.
//!
//! The hash is [`SharedConfig::hash`]: SHA-256 of the configuration's JSON,
//! made once per configuration value, not per checkpoint. The header's JSON
//! is made whole (its configuration from the JSON `SharedConfig` keeps) and
//! the configuration's bytes are then swapped for the reference: the one
//! `"config":` key at the top level, followed by exactly those bytes. No
//! other field before it holds an object with free-form keys, and a JSON
//! string cannot hold an unescaped quote, so the first match is the field.
//!
//! A store that reads many headers keeps the configurations it has read
//! ([`DecodedConfigs`]): a hash names one content for ever, so a header
//! naming a configuration already read is parsed without it and shares it,
//! its hash already made.
//!
//! It owns no I/O and no engine: where the configurations live, and when one
//! is deleted, is each engine's (`sled/configs`, `postgres`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use memchr::memmem::Finder;
use overseer_actors::model::{EffectiveConfig, SessionHeader, SessionId, SharedConfig};
use overseer_actors::store::StoreError;

use super::codec::{corrupt, decode_header as decode_whole, to_json, HEADER_GUESS};

/// The key a stored header names its configuration under.
const REF_KEY: &[u8] = b"\"config_hash\":\"";
/// The key of an embedded configuration.
const EMBEDDED_KEY: &[u8] = b"\"config\":";
/// Hex digits of a hash.
const HASH_HEX: usize = 64;

/// Searchers for the two keys, built once: every checkpoint looks for its
/// configuration in its header's JSON, and every read for the reference.
/// (A byte-by-byte scan was a seventh of encoding a header; a searcher
/// built per call for the whole configuration's bytes cost twice that.)
static EMBEDDED: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(EMBEDDED_KEY));
static REFERENCE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(REF_KEY));

/// A configuration to store once: its hash (hex) and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Interned {
    /// SHA-256 of `json`, lowercase hex.
    pub(super) hash: String,
    /// The configuration's JSON, as a header embedding it would hold it.
    pub(super) json: Vec<u8>,
}

/// A header encoded for storage: its JSON naming its configuration by
/// hash, and the configuration to keep under that hash.
pub(super) fn encode_header(header: &SessionHeader) -> Result<(Vec<u8>, Interned), StoreError> {
    let id = header.id;
    let whole = to_json(header, HEADER_GUESS)
        .map_err(|e| corrupt(id, format!("cannot encode header: {e}")))?;
    let raw = header
        .config
        .json()
        .ok_or_else(|| corrupt(id, "cannot encode the configuration"))?
        .get()
        .as_bytes();
    let at = EMBEDDED
        .find(&whole)
        .filter(|&at| whole[at + EMBEDDED_KEY.len()..].starts_with(raw))
        .ok_or_else(|| corrupt(id, "the encoded header does not hold its configuration"))?;
    let field_len = EMBEDDED_KEY.len() + raw.len();
    let mut hex = [0u8; HASH_HEX];
    hex::encode_to_slice(header.config.hash(), &mut hex)
        .map_err(|e| corrupt(id, format!("cannot name the configuration: {e}")))?;
    let hash = String::from_utf8_lossy(&hex).into_owned();
    let mut out = Vec::with_capacity(whole.len() - field_len + REF_KEY.len() + HASH_HEX + 1);
    out.extend_from_slice(&whole[..at]);
    out.extend_from_slice(REF_KEY);
    out.extend_from_slice(hash.as_bytes());
    out.push(b'"');
    out.extend_from_slice(&whole[at + field_len..]);
    Ok((
        out,
        Interned {
            hash,
            json: raw.to_vec(),
        },
    ))
}

/// Where a stored header names its configuration: the byte range of the
/// whole `"config_hash":"…"` member and the hash; `None` for a header that
/// embeds its configuration.
fn reference(bytes: &[u8]) -> Option<(std::ops::Range<usize>, &str)> {
    let start = REFERENCE.find(bytes)?;
    let from = start + REF_KEY.len();
    let hash = bytes.get(from..from + HASH_HEX)?;
    if bytes.get(from + HASH_HEX) != Some(&b'"') || !hash.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let hash = std::str::from_utf8(hash).ok()?;
    Some((start..from + HASH_HEX + 1, hash))
}

/// The hash of the configuration a stored header names, or `None` when it
/// embeds its configuration.
pub(super) fn hash_of(bytes: &[u8]) -> Option<&str> {
    reference(bytes).map(|(_, hash)| hash)
}

/// The stored header with its configuration embedded again: the bytes a
/// header stored before interning would hold. `bytes` as they are when they
/// name no configuration.
pub(super) fn join<'a, B: AsRef<[u8]>>(
    id: &SessionId,
    bytes: &'a [u8],
    config: impl FnOnce(&str) -> Result<Option<B>, StoreError>,
) -> Result<std::borrow::Cow<'a, [u8]>, StoreError> {
    let Some((span, hash)) = reference(bytes) else {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    };
    let json = config(hash)?.ok_or_else(|| {
        corrupt(
            id,
            format!("the header names configuration {hash}, which is not stored"),
        )
    })?;
    let json = json.as_ref();
    let mut out = Vec::with_capacity(bytes.len() - span.len() + EMBEDDED_KEY.len() + json.len());
    out.extend_from_slice(&bytes[..span.start]);
    out.extend_from_slice(EMBEDDED_KEY);
    out.extend_from_slice(json);
    out.extend_from_slice(&bytes[span.end..]);
    Ok(std::borrow::Cow::Owned(out))
}

/// Decodes a stored header, joined with the configuration it names, read
/// through `config` (hash hex → JSON); a header that embeds its
/// configuration decodes as it is. A newer snapshot is refused as such.
pub(super) fn decode_header<B: AsRef<[u8]>>(
    id: &SessionId,
    bytes: &[u8],
    config: impl FnOnce(&str) -> Result<Option<B>, StoreError>,
) -> Result<SessionHeader, StoreError> {
    // Parsed once: the whole header refuses a newer schema itself. Peeked
    // at only when what it names cannot be joined, so that a header of a
    // newer schema is refused for that rather than for a configuration it
    // names some other way (a second parse of every header read was a
    // quarter of reading one back).
    match join(id, bytes, config) {
        Ok(joined) => decode_whole(id, &joined),
        Err(e) if e.is_unavailable() => Err(e),
        Err(e) => {
            super::codec::peek(id, bytes)?;
            Err(e)
        }
    }
}

/// Configurations already read, by hash, shared by every header read
/// later that names one: such a header is parsed with a small stand-in in
/// place of the configuration, which is then swapped for the one kept. A
/// hash names one content, so what is kept never goes stale; a
/// configuration purged since stays kept, harmlessly, until the store
/// closes. Recovery reads every active header, and every activation one
/// more: parsing the configuration each time, and hashing it again for the
/// session's next checkpoint, was a third of reading a header back with
/// the default agent's short instructions, more with real ones.
#[derive(Default)]
pub(in crate::store) struct DecodedConfigs(Mutex<Decoded>);

#[derive(Default)]
struct Decoded {
    by_hash: HashMap<String, SharedConfig>,
    /// The JSON of a configuration with every list and text emptied: what
    /// stands in for a kept configuration while a header is parsed. Made
    /// from the first configuration kept, so it parses whatever fields the
    /// configuration has.
    stand_in: Option<Arc<[u8]>>,
}

/// Distinct configurations kept at most (a few megabytes with long
/// instructions). Sessions of one agent share one; past this many
/// (overrides on every session), the rest are parsed with their headers,
/// as before.
const DECODED_MAX: usize = 1_024;

impl std::fmt::Debug for DecodedConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodedConfigs")
            .field("kept", &self.lock().by_hash.len())
            .finish()
    }
}

impl DecodedConfigs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Decoded> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The configuration kept under `hash`, and the stand-in.
    fn get(&self, hash: &str) -> Option<(SharedConfig, Arc<[u8]>)> {
        let decoded = self.lock();
        Some((
            decoded.by_hash.get(hash)?.clone(),
            decoded.stand_in.clone()?,
        ))
    }

    /// Keeps `config`, read under `hash`.
    fn keep(&self, hash: &str, config: &SharedConfig) {
        // Made outside the lock, once per distinct configuration: the hash
        // (which every sharer's next checkpoint names) and the stand-in.
        config.hash();
        let stand_in = self
            .lock()
            .stand_in
            .is_none()
            .then(|| stand_in(config))
            .flatten();
        let mut decoded = self.lock();
        if decoded.by_hash.len() >= DECODED_MAX {
            return;
        }
        decoded.by_hash.insert(hash.to_owned(), config.clone());
        if decoded.stand_in.is_none() {
            decoded.stand_in = stand_in.map(Arc::from);
        }
    }
}

/// `config` with its texts and lists emptied, as JSON.
fn stand_in(config: &EffectiveConfig) -> Option<Vec<u8>> {
    let mut small = config.clone();
    small.instructions.clear();
    small.tools.clear();
    small.model.clear();
    small.route = None;
    small.subagents.clear();
    small.output_schema = None;
    small.tool_approvals.clear();
    small.skills.clear();
    small.tasks.clear();
    serde_json::to_vec(&small).ok()
}

/// [`decode_header`], sharing the configurations `decoded` keeps and
/// keeping the one it reads.
pub(in crate::store) fn decode_header_kept<B: AsRef<[u8]>>(
    id: &SessionId,
    bytes: &[u8],
    decoded: &DecodedConfigs,
    config: impl FnOnce(&str) -> Result<Option<B>, StoreError>,
) -> Result<SessionHeader, StoreError> {
    let Some((_, hash)) = reference(bytes) else {
        return decode_header(id, bytes, config);
    };
    if let Some((kept, stand_in)) = decoded.get(hash) {
        let mut header = decode_header(id, bytes, |_| Ok(Some(&*stand_in)))?;
        header.config = kept;
        return Ok(header);
    }
    let header = decode_header(id, bytes, config)?;
    decoded.keep(hash, &header.config);
    Ok(header)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use overseer_actors::model::{AgentConfig, SCHEMA_VERSION};
    use serde_json::json;

    fn header() -> SessionHeader {
        let mut agent = AgentConfig::new("assistant", &["current_time", "http_request"]);
        agent.instructions = "You help. \"config\":{} is not a field here.".into();
        let mut header = SessionHeader::new(
            SessionId::generate(),
            "acme".into(),
            "assistant".into(),
            agent.effective(),
            1,
        );
        // Fields before and after the configuration that look like it.
        header.title = Some("\"config\":{\"x\":1}, \"config_hash\":\"ab\"".into());
        header.output = Some(json!({"config": {"instructions": "no"}}));
        header
    }

    #[test]
    fn a_header_is_stored_without_its_configuration_and_joins_back_exactly() {
        let header = header();
        let whole = serde_json::to_vec(&header).unwrap();
        let (stored, interned) = encode_header(&header).unwrap();
        assert_eq!(interned.hash, hex::encode(header.config.hash()));
        assert_eq!(interned.json, serde_json::to_vec(&*header.config).unwrap());
        assert_eq!(hash_of(&stored), Some(interned.hash.as_str()));
        assert_eq!(
            stored.len() + interned.json.len() + EMBEDDED_KEY.len(),
            whole.len() + REF_KEY.len() + HASH_HEX + 1
        );
        let value: serde_json::Value = serde_json::from_slice(&stored).unwrap();
        assert!(value.get("config").is_none(), "{value}");
        assert_eq!(value["config_hash"], json!(interned.hash));
        // The title's look-alike stayed as it was.
        assert_eq!(value["title"], json!(header.title));

        let joined = join(&header.id, &stored, |h| {
            assert_eq!(h, interned.hash);
            Ok(Some(interned.json.clone()))
        })
        .unwrap();
        assert_eq!(&*joined, &whole[..], "byte for byte what was stored before");
        let back = decode_header(&header.id, &stored, |_| Ok(Some(&interned.json))).unwrap();
        assert_eq!(back, header);
    }

    #[test]
    fn an_embedded_configuration_reads_as_it_is_and_a_missing_one_is_corrupt() {
        let header = header();
        let whole = serde_json::to_vec(&header).unwrap();
        assert_eq!(hash_of(&whole), None);
        let back = decode_header(&header.id, &whole, |_| -> Result<Option<Vec<u8>>, _> {
            panic!("nothing to look up")
        })
        .unwrap();
        assert_eq!(back, header);

        let (stored, _) = encode_header(&header).unwrap();
        let err = decode_header(&header.id, &stored, |_| Ok(None::<Vec<u8>>)).unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains("not stored")),
            "{err}"
        );
    }

    #[test]
    fn a_newer_header_naming_a_configuration_is_refused_as_newer() {
        let mut header = header();
        header.schema_version = SCHEMA_VERSION + 1;
        let (stored, _) = encode_header(&header).unwrap();
        let err = decode_header(&header.id, &stored, |_| Ok(None::<Vec<u8>>)).unwrap_err();
        assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
        // Its configuration stored or not.
        let (_, interned) = encode_header(&header).unwrap();
        let err = decode_header(&header.id, &stored, |_| Ok(Some(interned.json))).unwrap_err();
        assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
    }

    /// A header naming a configuration already read shares it, never looks
    /// it up again, and reads exactly as a header decoded whole does.
    #[test]
    fn a_configuration_read_once_is_shared_by_every_header_naming_it() {
        let kept = DecodedConfigs::default();
        let first = header();
        let mut second = header();
        second.title = Some("another".into());
        second.config = first.config.clone();
        let (a, interned) = encode_header(&first).unwrap();
        let (b, _) = encode_header(&second).unwrap();
        let lookups = std::cell::Cell::new(0);
        let look = |_: &str| {
            lookups.set(lookups.get() + 1);
            Ok(Some(interned.json.clone()))
        };
        let read_a = decode_header_kept(&first.id, &a, &kept, look).unwrap();
        assert_eq!(lookups.get(), 1);
        let read_b = decode_header_kept(&second.id, &b, &kept, |_| -> Result<Option<Vec<u8>>, _> {
            panic!("a kept configuration is looked up again")
        })
        .unwrap();
        assert_eq!(read_a, decode_header(&first.id, &a, look).unwrap());
        assert_eq!(read_b, decode_header(&second.id, &b, look).unwrap());
        assert_eq!(read_b, second);
        assert!(
            read_a.config.ptr_eq(&read_b.config),
            "one configuration, shared"
        );
        assert_eq!(read_b.config.hash(), first.config.hash());
        // A newer header naming it is refused as newer all the same.
        let mut newer = second.clone();
        newer.schema_version = SCHEMA_VERSION + 1;
        let (stored, _) = encode_header(&newer).unwrap();
        let err = decode_header_kept(&newer.id, &stored, &kept, look).unwrap_err();
        assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
    }
}
