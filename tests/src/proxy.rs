//! A NATS protocol proxy between a client and one server that drops chosen publishes from
//! the client, to show what a message lost on the way does: everything else (and everything
//! the server sends) passes through unchanged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which client publishes to drop: `(subject, payload) -> drop?`.
pub type Filter = Arc<dyn Fn(&str, &[u8]) -> bool + Send + Sync>;

/// A running proxy: the URL clients connect to, and how many publishes it dropped.
pub struct DroppingProxy {
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    /// Publishes dropped so far.
    pub dropped: Arc<AtomicUsize>,
}

impl DroppingProxy {
    /// Starts a proxy to `upstream` (`host:port`) that drops at most `limit` client
    /// publishes matching `filter`, across all its connections.
    pub async fn start(upstream: String, limit: usize, filter: Filter) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let url = format!("nats://{}", listener.local_addr().expect("proxy address"));
        let dropped = Arc::new(AtomicUsize::new(0));
        let count = dropped.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (filter, count) = (filter.clone(), count.clone());
                tokio::spawn(pump(client, server, limit, filter, count));
            }
        });
        Self { url, dropped }
    }

    /// Publishes dropped so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// Copies the server's bytes to the client as they come, and the client's operations to
/// the server one at a time, leaving out the publishes to drop.
async fn pump(
    client: TcpStream,
    server: TcpStream,
    limit: usize,
    filter: Filter,
    dropped: Arc<AtomicUsize>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
    });
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    'read: while let Ok(n) = client_rx.read(&mut buf).await {
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut forward = Vec::with_capacity(pending.len());
        let mut at = 0;
        while let Some(op) = next_op(&pending[at..]) {
            let bytes = &pending[at..at + op.len];
            let drop_it = op.publish.as_ref().is_some_and(|(subject, payload)| {
                dropped.load(Ordering::SeqCst) < limit && filter(subject, &bytes[payload.clone()])
            });
            if drop_it {
                dropped.fetch_add(1, Ordering::SeqCst);
            } else {
                forward.extend_from_slice(bytes);
            }
            at += op.len;
        }
        pending.drain(..at);
        if server_tx.write_all(&forward).await.is_err() {
            break 'read;
        }
    }
    down.abort();
}

/// One complete client operation at the start of a buffer.
struct Op {
    /// Its length in bytes, payload included.
    len: usize,
    /// For `PUB` and `HPUB`: the subject and where the payload (after any headers) lies.
    publish: Option<(String, std::ops::Range<usize>)>,
}

/// The first complete operation in `buf`, if it holds one.
fn next_op(buf: &[u8]) -> Option<Op> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[..line_end]).ok()?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let head = line_end + 2;
    let verb = words
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    let (total, headers) = match verb.as_str() {
        "PUB" => (words.last()?.parse::<usize>().ok()?, 0),
        "HPUB" => (
            words.last()?.parse::<usize>().ok()?,
            words.get(words.len() - 2)?.parse::<usize>().ok()?,
        ),
        _ => {
            return Some(Op {
                len: head,
                publish: None,
            })
        }
    };
    let len = head + total + 2;
    if buf.len() < len {
        return None;
    }
    let subject = words.get(1)?.to_string();
    Some(Op {
        len,
        publish: Some((subject, head + headers..head + total)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_cut_at_their_payloads() {
        let buf = b"PING\r\nPUB a.b _INBOX.1 4\r\n+ACK\r\nHPUB c 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPUB x 10\r\n012";
        let op = next_op(buf).unwrap();
        assert_eq!((op.len, op.publish.is_none()), (6, true));
        let rest = &buf[6..];
        let op = next_op(rest).unwrap();
        let (subject, payload) = op.publish.unwrap();
        assert_eq!((subject.as_str(), &rest[payload]), ("a.b", &b"+ACK"[..]));
        let rest = &rest[op.len..];
        let op = next_op(rest).unwrap();
        let (subject, payload) = op.publish.unwrap();
        assert_eq!((subject.as_str(), &rest[payload]), ("c", &b"hi"[..]));
        assert!(
            next_op(&rest[op.len..]).is_none(),
            "an incomplete payload waits"
        );
    }
}
