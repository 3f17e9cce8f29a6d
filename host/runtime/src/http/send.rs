//! The host's HTTP/1.1 client for guests' calls: a keep-alive connection to an address already
//! checked (over TLS for `https`, [`super::tls`]), reused from the route's [`Pool`] when one to
//! that very address is idle, no redirects followed (a 3xx is the guest's answer), the
//! response body read up to the route's limit.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::Error;

use super::pool::{Key, Pool, Sender};
use super::CallResult;
use dedup_delivery::journal::RecordedResponse;

/// The route's TLS client settings, for an `https` call.
pub(super) type Tls = Arc<tokio_rustls::rustls::ClientConfig>;

/// A connection ready to carry one request, to the address `key` names.
pub(super) struct Connection {
    sender: Sender,
    /// Taken from the pool: its server may have closed it meanwhile.
    reused: bool,
    key: Key,
    tls: Option<Tls>,
    /// Where the connection goes once its answer is read (`None`: closed instead).
    pool: Option<Arc<Pool>>,
}

/// A connection to `key`'s address (checked by the caller), over `tls` when given: an idle
/// one of `pool` when `pool` is given, else a new one (a connect or handshake failure means
/// nothing was sent).
///
/// A route that fails calls of unknown outcome (`on_unknown = "fail"`) passes no pool: a
/// kept-alive connection can turn out closed only after the call's PENDING record is
/// written, and a new connection that then fails would leave PENDING a call that never
/// went out (an "outcome unknown" dead letter for nothing). Its connections are opened
/// before PENDING, each for one call.
pub(super) async fn connect(
    pool: Option<&Arc<Pool>>,
    key: Key,
    tls: Option<&Tls>,
) -> Result<Connection, (Error, CallResult)> {
    let (sender, reused) = match pool.and_then(|pool| pool.take(&key)) {
        Some(sender) => (sender, true),
        // Boxed: the connect and TLS handshake's state would otherwise be moved with every
        // future that holds this one.
        None => (Box::pin(open(&key, tls)).await?, false),
    };
    Ok(Connection {
        sender,
        reused,
        key,
        tls: tls.cloned(),
        pool: pool.cloned(),
    })
}

/// A new connection to `key`'s address, over `tls` when given.
async fn open(key: &Key, tls: Option<&Tls>) -> Result<Sender, (Error, CallResult)> {
    let stream = tokio::net::TcpStream::connect(key.addr)
        .await
        .map_err(|e| (Error::Connect(e), CallResult::Failed))?;
    match tls {
        None => handshake(stream).await,
        Some(config) => handshake(super::tls::handshake(config, &key.host, stream).await?).await,
    }
}

/// The HTTP/1.1 handshake over `io`; the connection is driven by a task of its own.
async fn handshake<T>(io: T) -> Result<Sender, (Error, CallResult)>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| (Error::Hyper(e), CallResult::Failed))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("outbound HTTP connection ended: {e}");
        }
    });
    Ok(sender)
}

impl Connection {
    /// Sends `request` and reads the answer, its body up to `max_response_bytes`; the
    /// connection goes back to the pool once the answer is read in full. A reused connection
    /// its server closed before the request went out is replaced by a new one to the same
    /// address, once (nothing was sent on the closed one).
    pub(super) async fn send(
        mut self,
        request: http::Request<Full<Bytes>>,
        max_response_bytes: u64,
    ) -> Result<RecordedResponse, (Error, CallResult)> {
        let failed = |e| (Error::Hyper(e), CallResult::Failed);
        let response = match self.sender.try_send_request(request).await {
            Ok(response) => response,
            Err(mut e) => match (self.reused, e.take_message()) {
                (true, Some(request)) => {
                    tracing::debug!(
                        "a kept-alive connection to {} was closed before the request went out: sending it on a new one ({})",
                        self.key.addr,
                        e.error()
                    );
                    self.sender = Box::pin(open(&self.key, self.tls.as_ref())).await?;
                    self.sender.send_request(request).await.map_err(failed)?
                }
                _ => return Err(failed(e.into_error())),
            },
        };
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, max_response_bytes as usize)
            .collect()
            .await
            .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
                Ok(_) => (
                    Error::HttpResponseBodySize(Some(max_response_bytes)),
                    CallResult::Limit,
                ),
                Err(e) => (
                    Error::InternalError(Some(format!("reading the response body: {e}"))),
                    CallResult::Failed,
                ),
            })?
            .to_bytes();
        let headers = parts
            .headers
            .iter()
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
            .collect();
        if let Some(pool) = &self.pool {
            pool.put(self.key, self.sender);
        }
        Ok(RecordedResponse {
            status: parts.status.as_u16(),
            headers,
            body: body.to_vec(),
        })
    }
}
