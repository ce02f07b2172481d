//! The Standard Webhooks signature: HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}`
//! keyed with the endpoint's secret, sent as `v1,<base64 of the MAC>`; the
//! secret is shown to people as `whsec_` + base64 of its key bytes.
//!
//! It owns the secret's format and the signing, nothing about when or to
//! whom a webhook is sent.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a serialized secret.
const PREFIX: &str = "whsec_";
/// Bytes of a new key: the specification asks for 24 to 64.
const KEY_BYTES: usize = 32;

/// A signing secret.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
    /// The keyed MAC, made once: every signature starts from a clone.
    mac: Hmac<Sha256>,
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl std::fmt::Display for Secret {
    /// `whsec_` + base64 of the key: what the endpoint's owner is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}", STANDARD.encode(&self.key))
    }
}

impl Secret {
    /// A fresh secret from the operating system's random source.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut key = vec![0u8; KEY_BYTES];
        getrandom::fill(&mut key)?;
        // HMAC takes a key of any length, so this never fails.
        Self::from_key(key).ok_or(getrandom::Error::UNEXPECTED)
    }

    /// Parses `whsec_<base64>`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::from_key(STANDARD.decode(s.strip_prefix(PREFIX)?).ok()?)
    }

    fn from_key(key: Vec<u8>) -> Option<Self> {
        if key.is_empty() {
            return None;
        }
        let mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
        Some(Self { key, mac })
    }
}

/// The `webhook-signature` value of `body` sent as message `id` at
/// `timestamp` (Unix seconds): `v1,` + base64 of the HMAC.
pub fn sign(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = secret.mac.clone();
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's reference libraries sign this example so
    /// (`libraries/rust`, test `test_sign`).
    #[test]
    fn signs_the_specifications_example() {
        let secret = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            sign(
                &secret,
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1649367553,
                br#"{"email":"test@example.com","username":"test_user"}"#
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn a_new_secret_round_trips_and_is_random() {
        let a = Secret::generate().unwrap();
        let b = Secret::generate().unwrap();
        assert_ne!(a, b);
        let shown = a.to_string();
        assert!(shown.starts_with("whsec_"), "{shown}");
        assert_eq!(Secret::parse(&shown).unwrap(), a);
        assert!(Secret::parse("not a secret").is_none());
    }
}
