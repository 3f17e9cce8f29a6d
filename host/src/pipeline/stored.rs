//! A message read back from a stream's leader with the `STREAM.MSG.GET` API, its header block
//! as stored (base64 in the answer): the undeliverable-message handler cleans it, an exclusive
//! route's copier parses it as a delivery's is parsed. async-nats's own read parses the block
//! more strictly than a delivery (and keeps one value of a repeated header), and fails the
//! read of a block it cannot parse without saying which message it was.

use anyhow::Context as _;
use base64::Engine as _;
use serde::Deserialize;

/// A stored message.
#[derive(Debug)]
pub(super) struct Stored {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its subject.
    pub subject: String,
    /// Its header block as stored (`None`: none).
    pub headers: Option<Vec<u8>>,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// The API's answer: the message, or why not.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    error: Option<ApiError>,
}

#[derive(Debug, Deserialize)]
struct ApiError {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

#[derive(Debug, Deserialize)]
struct Message {
    subject: String,
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    hdrs: Option<String>,
    #[serde(default)]
    data: Option<String>,
}

/// `no message found`.
const NO_MESSAGE: u64 = 10037;
/// `stream not found`.
const NO_STREAM: u64 = 10059;

/// Message `sequence` of `stream`; `None` when it is gone (or its stream is).
pub(super) async fn by_sequence(
    client: &async_nats::Client,
    stream: &str,
    sequence: u64,
) -> anyhow::Result<Option<Stored>> {
    let what = format!("message {sequence}");
    let body = serde_json::json!({ "seq": sequence });
    get(client, stream, body, &what, &[NO_MESSAGE, NO_STREAM]).await
}

/// The first message of `stream` on `subject` at sequence `from` or later; `None`: none. A
/// stream not found is an error: a copier's range ended by it would count as copied what it
/// never read.
pub(super) async fn first_on(
    client: &async_nats::Client,
    stream: &str,
    subject: &str,
    from: u64,
) -> anyhow::Result<Option<Stored>> {
    let body = serde_json::json!({ "seq": from, "next_by_subj": subject });
    let what = format!("the first message on `{subject}` from {from}");
    get(client, stream, body, &what, &[NO_MESSAGE]).await
}

/// The API's answer to `body`; `None` for the error codes in `gone`.
async fn get(
    client: &async_nats::Client,
    stream: &str,
    body: serde_json::Value,
    what: &str,
    gone: &[u64],
) -> anyhow::Result<Option<Stored>> {
    let api = format!("$JS.API.STREAM.MSG.GET.{stream}");
    let reply = (client.request(api, body.to_string().into()).await)
        .with_context(|| format!("{what} not readable from `{stream}`"))?;
    let answer: Answer = serde_json::from_slice(&reply.payload)
        .with_context(|| format!("{what} not readable from `{stream}`"))?;
    let m = match (answer.message, answer.error) {
        (Some(m), _) => m,
        (None, Some(e)) if gone.contains(&e.err_code) => return Ok(None),
        (None, e) => {
            let why = e.map_or_else(|| "an empty answer".to_string(), |e| e.description);
            anyhow::bail!("{what} not readable from `{stream}`: {why}")
        }
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let decode = |field: Option<String>| -> anyhow::Result<Option<Vec<u8>>> {
        (field.map(|f| b64.decode(f)).transpose())
            .with_context(|| format!("{what} of `{stream}`: not base64"))
    };
    Ok(Some(Stored {
        sequence: m.seq,
        subject: m.subject,
        headers: decode(m.hdrs)?,
        payload: decode(m.data)?.unwrap_or_default(),
    }))
}
