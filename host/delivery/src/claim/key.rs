//! Turning (route, idempotency key) into a valid KV key, deterministically and without
//! collisions: KV keys allow only `[-/_=.a-zA-Z0-9]`, no empty `.` tokens and limited length.

use sha2::{Digest, Sha256};

/// Keys longer than this are hashed.
const MAX_PLAIN_LEN: usize = 200;

/// The KV key of a route's idempotency key.
///
/// A key that is already safe is kept readable as `<route>.k.<key>`; any other key becomes
/// `<route>.h.<sha256 hex>`. The different middle token keeps the two forms from colliding.
/// Route names are validated to `[A-Za-z0-9_-]+`.
pub fn encode(route: &str, key: &str) -> String {
    if is_plain(key) {
        format!("{route}.k.{key}")
    } else {
        format!("{route}.h.{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

/// The id of output `index` of a claim key, `<claim key>#<index>`: its `Nats-Msg-Id` (window
/// effects) or its `Dedup-Output-Id` (fenced effects).
pub fn output_id(claim_key: &str, index: usize) -> String {
    format!("{claim_key}#{index}")
}

/// Whether a key of a claim store is a claim key ([`encode`]: `<route>.k.<key>` or
/// `<route>.h.<hex>`, three tokens, since neither a route name nor a plain key has a dot),
/// not one of the entries a claim's call journal keeps under it (`<claim key>.call.<i>`,
/// [`crate::journal::idempotency_key`]).
pub fn is_claim_key(key: &str) -> bool {
    key.split('.').count() == 3
}

fn is_plain(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_PLAIN_LEN
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | '/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_journal_entry_is_not_a_claim_key() {
        let key = encode("orders", "abc-123");
        assert!(is_claim_key(&key));
        assert!(is_claim_key(&encode("orders", "a.b")));
        assert!(!is_claim_key(&crate::journal::idempotency_key(&key, 0)));
    }

    #[test]
    fn safe_keys_stay_readable() {
        assert_eq!(encode("orders", "abc-123"), "orders.k.abc-123");
    }

    #[test]
    fn unsafe_and_long_keys_are_hashed_and_never_collide_with_plain_ones() {
        let dotted = encode("r", "a.b");
        assert!(dotted.starts_with("r.h."), "{dotted}");
        assert_ne!(encode("r", "a b"), encode("r", "a_b"));
        assert!(encode("r", &"x".repeat(500)).starts_with("r.h."));
        assert!(encode("r", "").starts_with("r.h."));
        // A plain key that looks like a hash still lands under `.k.`.
        let h = hex::encode(Sha256::digest(b"a.b"));
        assert_ne!(encode("r", &h), dotted);
    }
}
