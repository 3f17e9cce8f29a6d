//! Forever deduplication: streams that admit one message per subject (discard new per
//! subject, nats-server 2.9+) and refuse a repeat at any later time within their retention,
//! where the duplicate window refuses one only for minutes.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::stream;

/// The server's error code for a store refused (here: the subject already holds a message).
const STREAM_STORE_FAILED: u64 = 10077;

/// Makes `config` a forever stream: discard new, one message per subject, per subject.
pub fn apply(config: &mut stream::Config) {
    config.discard = stream::DiscardPolicy::New;
    config.max_messages_per_subject = 1;
    config.discard_new_per_subject = true;
}

/// Whether an existing stream refuses a second message on a subject.
pub fn is_forever(config: &stream::Config) -> bool {
    config.discard == stream::DiscardPolicy::New
        && config.max_messages_per_subject == 1
        && config.discard_new_per_subject
}

/// Whether a publish was refused because its subject already holds a message in a forever
/// stream: a duplicate, not a failure.
pub fn refused_as_duplicate(error: &PublishError) -> bool {
    if error.kind() != PublishErrorKind::Other {
        return false;
    }
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|e| {
            e.error_code().0 == STREAM_STORE_FAILED
                && e.to_string().contains("maximum messages per subject")
        })
}
