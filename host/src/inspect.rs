//! Reading back what landed in a stream (the demo's summary, tests).

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::Context;

/// Every message currently in `stream`, in order.
pub async fn stream_messages(js: &Context, stream: &str) -> anyhow::Result<Vec<StreamMessage>> {
    let mut s = js.get_stream(stream).await?;
    let state = s.info().await?.state.clone();
    let mut out = Vec::with_capacity(state.messages as usize);
    if state.messages == 0 {
        return Ok(out);
    }
    for seq in state.first_sequence..=state.last_sequence {
        match s.get_raw_message(seq).await {
            Ok(m) => out.push(m),
            // Deleted (or rolled up, as a fenced stream's older claim records are).
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(e) if e.to_string().contains("not found") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}
