//! The host's HTTP/1.1 client for guests' calls: one connection per call to an address already
//! checked (over TLS for `https`, [`super::tls`]), no redirects followed (a 3xx is the guest's
//! answer), the response body read up to the route's limit.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::Error;

use super::CallResult;
use dedup_delivery::journal::RecordedResponse;

/// A connection ready to carry one request.
pub(super) struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

/// TLS to a server: the route's client settings and the name its certificate must have.
pub(super) struct Tls<'a> {
    pub(super) config: &'a Arc<tokio_rustls::rustls::ClientConfig>,
    pub(super) host: &'a str,
}

/// Connects to `addr`, over `tls` when given (a connect or handshake failure means nothing
/// was sent).
pub(super) async fn connect(
    addr: SocketAddr,
    tls: Option<Tls<'_>>,
) -> Result<Connection, (Error, CallResult)> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| (Error::Connect(e), CallResult::Failed))?;
    match tls {
        None => handshake(stream).await,
        Some(tls) => handshake(super::tls::handshake(tls.config, tls.host, stream).await?).await,
    }
}

/// The HTTP/1.1 handshake over `io`; the connection is driven by a task of its own.
async fn handshake<T>(io: T) -> Result<Connection, (Error, CallResult)>
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
    Ok(Connection { sender })
}

impl Connection {
    /// Sends `request` and reads the answer, its body up to `max_response_bytes`.
    pub(super) async fn send(
        mut self,
        request: http::Request<Full<Bytes>>,
        max_response_bytes: u64,
    ) -> Result<RecordedResponse, (Error, CallResult)> {
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| (Error::Hyper(e), CallResult::Failed))?;
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
        Ok(RecordedResponse {
            status: parts.status.as_u16(),
            headers,
            body: body.to_vec(),
        })
    }
}
