//! Keyed tamper evidence: an HMAC-SHA256 key the host supplies at open (from a keychain, a
//! keystore or a file), so that history rewritten by someone who can recompute every SHA-256 of
//! the plain chain is still detected. The key lives only in memory: nothing derived from it that
//! would help recover it is ever written to the state directory, a log or an error.
//!
//! What is authenticated (docs/rollout-format.md, "Keyed mode"):
//! - every head anchor (JSONL anchor slot, SQLite `threads` row) carries `mac` over the thread id
//!   and the anchor's whole text (seq, head hash, offset, generation, cached state);
//! - every `seal_every` events a `sealed` event in the log carries `mac` over (thread id, seq,
//!   hash) of the event before it, so the log alone vouches for its prefix;
//! - in a store with an id (`identity`), the anchor also names the store: the JSONL anchor's
//!   text carries `store=<id>` (inside what its MAC covers), the SQLite `store_bindings` row
//!   carries a MAC over (thread id, store id, the row's text), so a keyed thread copied into
//!   another store under the same key is refused by name.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;

/// Domain separation: a MAC made for one purpose can never be replayed as another.
const ANCHOR_DOMAIN: &[u8] = b"cc-rollout-v1 anchor\n";
const SEAL_DOMAIN: &[u8] = b"cc-rollout-v1 seal\n";
const KEY_ID_DOMAIN: &[u8] = b"cc-rollout-v1 key-id";
const STORE_DOMAIN: &[u8] = b"cc-rollout-v1 store\n";

/// A 32-byte rollout key. Never printed (its `Debug` is redacted), wiped from memory on drop.
/// The store binds it to its identity when it opens (`store_id`); a key from the host is not
/// bound to any store.
#[derive(Clone)]
pub struct RolloutKey {
    bytes: [u8; 32],
    store_id: Option<String>,
}

impl RolloutKey {
    /// Length of a key, in bytes.
    pub const LEN: usize = 32;

    pub fn from_bytes(bytes: [u8; 32]) -> RolloutKey {
        RolloutKey {
            bytes,
            store_id: None,
        }
    }

    /// The same key, bound to the store with id `store_id` (`None`: a store written before
    /// store ids, whose anchors name no store).
    pub(crate) fn bound_to(&self, store_id: Option<&str>) -> RolloutKey {
        RolloutKey {
            bytes: self.bytes,
            store_id: store_id.map(str::to_string),
        }
    }

    /// The id of the store this key was bound to when the store opened.
    pub fn store_id(&self) -> Option<&str> {
        self.store_id.as_deref()
    }

    /// Exactly 32 bytes, else an error that says so (without echoing them).
    pub fn from_slice(bytes: &[u8]) -> Result<RolloutKey, String> {
        let arr: [u8; 32] = bytes.try_into().map_err(|_| {
            format!(
                "a rollout key is exactly 32 bytes, got {}; generate one with `head -c 32 /dev/urandom`",
                bytes.len()
            )
        })?;
        Ok(RolloutKey::from_bytes(arr))
    }

    /// A key file holds 32 raw bytes, or 64 hex digits (optionally followed by a newline).
    /// Refuses files other users can read: a key anyone can read authenticates nothing.
    pub fn from_file(path: &Path) -> Result<RolloutKey, String> {
        use std::os::unix::fs::MetadataExt;
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the key file {shown}: {e}"))?;
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "the key file {shown} has mode {:o}, readable by others; run `chmod 600` on it",
                meta.mode() & 0o777
            ));
        }
        let mut raw =
            std::fs::read(path).map_err(|e| format!("cannot read the key file {shown}: {e}"))?;
        let key = Self::parse_file_bytes(&raw);
        wipe(&mut raw);
        key.map_err(|why| format!("the key file {shown} {why}"))
    }

    fn parse_file_bytes(raw: &[u8]) -> Result<RolloutKey, String> {
        if raw.len() == 32 {
            return Self::from_slice(raw);
        }
        let text = raw.strip_suffix(b"\n").unwrap_or(raw);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.len() == 64 && text.iter().all(u8::is_ascii_hexdigit) {
            let mut bytes = [0u8; 32];
            for (i, pair) in text.chunks(2).enumerate() {
                let hi = (pair[0] as char).to_digit(16).expect("hex checked");
                let lo = (pair[1] as char).to_digit(16).expect("hex checked");
                bytes[i] = (hi * 16 + lo) as u8;
            }
            let key = RolloutKey::from_bytes(bytes);
            wipe(&mut bytes);
            return Ok(key);
        }
        Err(format!(
            "holds {} bytes; it must hold exactly 32 raw bytes or 64 hex digits \
             (e.g. `head -c 32 /dev/urandom > FILE` or `openssl rand -hex 32 > FILE`)",
            raw.len()
        ))
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> String {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.bytes)
            .expect("HMAC accepts a key of any length");
        m.update(domain);
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                m.update(b"\n");
            }
            m.update(p);
        }
        cc_agent_protocol::hex_lower(&m.finalize().into_bytes())
    }

    /// `mac` of an anchor: over the thread id and the anchor's text before ` mac=`.
    pub fn anchor_mac(&self, thread_id: &str, body: &str) -> String {
        self.mac(ANCHOR_DOMAIN, &[thread_id.as_bytes(), body.as_bytes()])
    }

    /// `mac` of a SQLite store binding: over the thread id, the store id and the text of the
    /// thread's row (`ccrow1 …`, what the row's own MAC covers).
    pub fn store_binding_mac(&self, thread_id: &str, store_id: &str, row_body: &str) -> String {
        self.mac(
            STORE_DOMAIN,
            &[
                thread_id.as_bytes(),
                store_id.as_bytes(),
                row_body.as_bytes(),
            ],
        )
    }

    /// `mac` of a `sealed` event: over (thread id, seq, hash) of the event it seals.
    pub fn seal_mac(&self, thread_id: &str, seq: u64, hash: &str) -> String {
        self.mac(
            SEAL_DOMAIN,
            &[
                thread_id.as_bytes(),
                seq.to_string().as_bytes(),
                hash.as_bytes(),
            ],
        )
    }

    /// 16 hex digits naming the key (an HMAC output, so it says nothing about the key itself):
    /// lets verification tell "made with another key" from "forged".
    pub fn key_id(&self) -> String {
        self.mac(KEY_ID_DOMAIN, &[])[..16].to_string()
    }
}

/// Compares two MACs in time independent of where they differ.
pub(crate) fn mac_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl std::fmt::Debug for RolloutKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RolloutKey(<redacted>)")
    }
}

impl Drop for RolloutKey {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// Overwrites secret bytes in a way the optimiser may not remove.
fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, exclusive reference to one byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_key() {
        let k = RolloutKey::from_bytes([0xab; 32]);
        let shown = format!("{k:?}");
        assert_eq!(shown, "RolloutKey(<redacted>)");
        assert!(!shown.to_lowercase().contains("ab"));
    }

    #[test]
    fn key_files_take_raw_or_hex_and_refuse_anything_else() {
        let raw = RolloutKey::parse_file_bytes(&[7u8; 32]).unwrap();
        let hex =
            RolloutKey::parse_file_bytes(format!("{}\n", "07".repeat(32)).as_bytes()).unwrap();
        assert_eq!(raw.bytes, hex.bytes);
        assert!(RolloutKey::parse_file_bytes(&[7u8; 31]).is_err());
        assert!(RolloutKey::parse_file_bytes(&[7u8; 33]).is_err());
        assert!(RolloutKey::parse_file_bytes("0".repeat(63).as_bytes()).is_err());
        assert!(RolloutKey::parse_file_bytes("g".repeat(64).as_bytes()).is_err());
    }

    #[test]
    fn macs_are_bound_to_their_inputs_and_key() {
        let k = RolloutKey::from_bytes([1; 32]);
        let other = RolloutKey::from_bytes([2; 32]);
        let m = k.seal_mac("alpha", 5, &"a".repeat(64));
        assert_eq!(m.len(), 64);
        assert_ne!(m, k.seal_mac("bravo", 5, &"a".repeat(64)));
        assert_ne!(m, k.seal_mac("alpha", 6, &"a".repeat(64)));
        assert_ne!(m, other.seal_mac("alpha", 5, &"a".repeat(64)));
        // A seal MAC is never a valid anchor MAC for the same bytes.
        assert_ne!(m, k.anchor_mac("alpha", &format!("5\n{}", "a".repeat(64))));
        assert_ne!(k.key_id(), other.key_id());
        // A store binding is bound to its store id and never equals the anchor MAC of its row.
        let b = k.store_binding_mac("alpha", "0123456789abcdef", "ccrow1 seq=5");
        assert_ne!(
            b,
            k.store_binding_mac("alpha", "0123456789abcdee", "ccrow1 seq=5")
        );
        assert_ne!(
            b,
            k.store_binding_mac("bravo", "0123456789abcdef", "ccrow1 seq=5")
        );
        assert_ne!(b, k.anchor_mac("alpha", "ccrow1 seq=5"));
        // Binding a key to a store changes no MAC it makes (the store id is in their input).
        let bound = k.bound_to(Some("0123456789abcdef"));
        assert_eq!(bound.key_id(), k.key_id());
        assert_eq!(bound.seal_mac("alpha", 5, &"a".repeat(64)), m);
        assert!(mac_eq(&m, &m.clone()) && !mac_eq(&m, &m[1..]));
    }
}
