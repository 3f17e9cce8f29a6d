//! Messages whose header block the client could not parse (bytes that are not UTF-8, a line
//! without `:`; nats-server stores whatever a producer sends). The vendored async-nats delivers
//! them without headers and with the raw block (`host/vendor/README.md`) instead of dropping
//! the connection. No retry can make them readable, so each is dead-lettered on its first
//! delivery, the raw block kept in the letter, base64.

use super::effects::headers::RAW_HEADERS;
use super::message::Delivery;
use super::Shared;
use crate::claim::ClaimStore;

impl<S: ClaimStore> Shared<S> {
    /// Dead-letters (or, if no letter can ever be stored, terms) `d` for `route` when its
    /// header block could not be parsed; returns whether it did.
    pub(super) async fn dead_letter_unreadable(&self, d: &Delivery, route: &str) -> bool {
        let Some(reason) = unreadable(&d.message) else {
            return false;
        };
        self.dead_letter_unclaimed(d, route, "", &reason).await;
        true
    }
}

/// Why `message` cannot be taken, if its header block did not parse.
fn unreadable(message: &async_nats::Message) -> Option<String> {
    message.raw_headers.as_ref()?;
    let why = message
        .description
        .as_deref()
        .unwrap_or("invalid header block");
    Some(format!(
        "{why}; the raw block is in this letter's `{RAW_HEADERS}` header (base64): the producer must publish `Name: value` header lines in UTF-8"
    ))
}
