//! An exclusive route's copier over JetStream ([`dedup_delivery::copier`], which decides
//! when a host takes over, what it copies first and in which order): the route's epochs on
//! its order subject in the work queue ([`exclusive::order_subject`]), its source consumer's
//! ack floor and last delivered sequence, the source messages read back for a takeover, and
//! copies fenced on the epoch with `Nats-Expected-Last-Subject-Sequence-Subject`.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self};
use async_nats::HeaderMap;
use dedup_delivery::copier::{CopierIo, Refused, Window};

use crate::config::Config;
use crate::exclusive;
use crate::idempotency;
use crate::routes::{Exclusive, Route};

/// One exclusive route's copier I/O.
pub(super) struct JsCopier<'a> {
    /// The host's JetStream context.
    pub js: &'a jetstream::Context,
    /// The host's config (the source stream, the work queue's name).
    pub config: &'a Config,
    /// The exclusive route.
    pub route: &'a Route,
    /// How the route finds a message's entity.
    pub exclusive: &'a Exclusive,
}

/// The entity of a source message, or why it has none.
pub(super) fn entity_of(
    exclusive: &Exclusive,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<String, String> {
    idempotency::derive(&exclusive.by, subject, headers, payload)
        .map_err(|missing| format!("no entity key (exclusive_by): {missing}"))
}

impl JsCopier<'_> {
    /// Stores the copy of source message `sequence` (`subject`, `headers`, `payload`) on its
    /// entity's partition, fenced on `epoch`.
    pub async fn copy(
        &self,
        epoch: u64,
        sequence: u64,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: bytes::Bytes,
    ) -> Result<(), Refused> {
        let (config, route) = (self.config, &self.route.name);
        let entity =
            entity_of(self.exclusive, subject, headers, &payload).map_err(Refused::ForGood)?;
        let to = exclusive::work_subject(config, route, self.exclusive.partitions, &entity);
        let mut h = exclusive::queued_headers(headers, route, subject, sequence);
        let order = exclusive::order_subject(config, route);
        h.insert(
            "Nats-Expected-Last-Subject-Sequence-Subject",
            order.as_str(),
        );
        h.insert(
            "Nats-Expected-Last-Subject-Sequence",
            epoch.to_string().as_str(),
        );
        let stored = async { self.js.publish_with_headers(to, h, payload).await?.await }.await;
        match stored {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => Err(Refused::ForGood(
                format!("too big to queue for exclusive route `{route}`: {e}"),
            )),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(Refused::Epoch),
            Err(e) => Err(Refused::Other(format!(
                "cannot queue for exclusive route `{route}`: {e}"
            ))),
        }
    }

    async fn queue(&self) -> Result<jetstream::stream::Stream<()>, String> {
        let name = exclusive::stream_name(self.config);
        (self.js.get_stream_no_info(&name).await).map_err(|e| format!("cannot open `{name}`: {e}"))
    }

    async fn source(&self) -> Result<jetstream::stream::Stream<()>, String> {
        let name = &self.config.source.stream;
        (self.js.get_stream_no_info(name).await).map_err(|e| format!("cannot open `{name}`: {e}"))
    }
}

impl CopierIo for JsCopier<'_> {
    async fn last_epoch(&self) -> Result<u64, String> {
        let order = exclusive::order_subject(self.config, &self.route.name);
        match self
            .queue()
            .await?
            .get_last_raw_message_by_subject(&order)
            .await
        {
            Ok(m) => Ok(m.sequence),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(format!("cannot read the copier epoch on `{order}`: {e}")),
        }
    }

    async fn write_epoch(&self, last: u64) -> Result<u64, Refused> {
        let order = exclusive::order_subject(self.config, &self.route.name);
        let mut h = HeaderMap::new();
        h.insert(
            "Nats-Expected-Last-Subject-Sequence",
            last.to_string().as_str(),
        );
        let written = async {
            let payload = bytes::Bytes::new();
            self.js
                .publish_with_headers(order.clone(), h, payload)
                .await?
                .await
        };
        match written.await {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(Refused::Epoch),
            Err(e) => Err(Refused::Other(format!(
                "cannot write a copier epoch on `{order}`: {e}"
            ))),
        }
    }

    async fn window(&self) -> Result<Window, String> {
        let name = crate::setup::route_consumer_name(self.config, &self.route.name);
        let info = (self.source().await?.consumer_info(&name).await)
            .map_err(|e| format!("cannot read consumer `{name}`: {e}"))?;
        let pinned = (info.priority_groups.iter())
            .find(|g| g.group == exclusive::COPIER_GROUP)
            .and_then(|g| g.pinned_client_id.clone());
        Ok(Window {
            floor: info.ack_floor.stream_sequence,
            delivered: info.delivered.stream_sequence,
            pinned,
        })
    }

    /// Read back from the source stream's leader, its header block parsed as a delivery's
    /// ([`super::stored`]): a block that does not parse, or does not end in an empty line,
    /// is skipped (its own delivery dead-letters it, `unreadable.rs`), and a repeated header
    /// keeps every value, so the copy lands on the entity its delivery's turn was taken for.
    async fn copy_next(
        &self,
        after: u64,
        through: u64,
        epoch: u64,
    ) -> Result<Option<u64>, Refused> {
        let stream = &self.config.source.stream;
        let client = self.js.client();
        let m = match super::stored::first_on(&client, stream, &self.route.subject, after + 1).await
        {
            Ok(Some(m)) if m.sequence > after && m.sequence <= through => m,
            Ok(_) => return Ok(None),
            Err(e) => return Err(Refused::Other(format!("{e:#}"))),
        };
        let headers = match m.headers.as_deref() {
            None => None,
            // Delivered, its pin id runs into its last header: its delivery dead-letters it
            // (`unreadable::pin_mangled`).
            Some(block) if !block.ends_with(b"\r\n\r\n") => return Ok(Some(m.sequence)),
            Some(block) => match async_nats::connection::parse_headers(block) {
                Ok((headers, _, _)) => Some(headers),
                Err(_) => return Ok(Some(m.sequence)),
            },
        };
        match self
            .copy(
                epoch,
                m.sequence,
                &m.subject,
                headers.as_ref(),
                m.payload.into(),
            )
            .await
        {
            // Its own delivery dead-letters it.
            Ok(()) | Err(Refused::ForGood(_)) => Ok(Some(m.sequence)),
            Err(e) => Err(e),
        }
    }
}
