//! Messages whose header block the client could not parse (bytes that are not UTF-8, a line
//! without `:`; nats-server stores whatever a producer sends). The vendored async-nats delivers
//! them without headers and with the raw block (`host/vendor/README.md`) instead of dropping
//! the connection. No retry can make them readable, so each is dead-lettered on its first
//! delivery, the raw block kept in the letter, base64. So is a pinned consumer's delivery
//! whose block the server's appended pin id ran into ([`pin_mangled`]): its headers are not
//! what was published.

use super::effects::headers::RAW_HEADERS;
use super::message::Delivery;
use super::Shared;
use crate::claim::ClaimStore;

impl<S: ClaimStore> Shared<S> {
    /// Dead-letters (or, if no letter can ever be stored, terms) `d` for `route` when its
    /// header block could not be parsed or, for a delivery of a pinned consumer (an exclusive
    /// route's copier, `pinned`), was mangled by the pin id the server appended
    /// ([`pin_mangled`]); returns whether it did.
    pub(super) async fn dead_letter_unreadable(
        &self,
        d: &Delivery,
        route: &str,
        pinned: bool,
    ) -> bool {
        let reason =
            unreadable(&d.message).or_else(|| pinned.then(|| pin_mangled(&d.message)).flatten());
        let Some(reason) = reason else {
            return false;
        };
        self.dead_letter_unclaimed(d, route, "", &reason).await;
        true
    }
}

/// The header nats-server adds to a pinned consumer's deliveries.
const PIN: &str = "Nats-Pin-Id";

/// Why `message`, delivered by a pinned consumer, cannot be taken as published, if the
/// server's pin id ran into its header block's last header. nats-server appends
/// `Nats-Pin-Id: <nuid>` to the stored block after cutting its last two bytes, which it takes
/// for the empty line that ends every block; a producer's raw block that does not end in one
/// (`\r\n\r\n`) then has its last header's value (or name) run into the pin line, so the
/// headers, and an entity or key read from them, are not what was published, and differ with
/// every pin. A well-formed block keeps the server's pin last, a nuid (22 ASCII letters and
/// digits): any other shape means the block was mangled. The takeover's range skips such a
/// block for the same reason (`copier.rs`), so both leave it to this letter.
fn pin_mangled(message: &async_nats::Message) -> Option<String> {
    let headers = message.headers.as_ref()?;
    let run_into = headers.iter().any(|(name, values)| {
        let name: &str = name.as_ref();
        (name != PIN && name.contains(PIN))
            || values.iter().any(|v| v.as_str().contains("Nats-Pin-Id:"))
    });
    let last = headers.get_last(PIN).map(|p| p.as_str());
    let misshapen = last.is_some_and(|p| !dedup_delivery::copier::is_server_pin(p));
    (run_into || misshapen).then(|| {
        "its header block does not end in an empty line (CRLF CRLF): nats-server appends its pin id to the block of each delivery to the route's copier, which then runs into the block's last header, so the headers (and an entity or key read from them) are not what was published; the producer must end the header block with an empty line".to_string()
    })
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
