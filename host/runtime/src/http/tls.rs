//! The TLS client of `https` calls: rustls (the `ring` provider, TLS 1.3, as the NATS client
//! already uses it) over the connection to the address the call checked. The server name
//! and the certificate's name are the URL's host; the trusted roots are the system's plus a
//! route's `ca_file`. A certificate that does not verify is the guest's error
//! (`TlsCertificateError`), never a trap.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use wasmtime_wasi_http::Error;

use super::CallResult;

/// The certificates of a PEM file of CA certificates (a route's `ca_file`), or what is wrong
/// with it.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read `{shown}`: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{shown}` is not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "`{shown}` holds no `-----BEGIN CERTIFICATE-----` block"
        ));
    }
    let mut store = RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| format!("`{shown}` holds a certificate that cannot be a root: {e}"))?;
    }
    Ok(certs)
}

/// The TLS client settings of a route: the system's roots, plus those of `ca_file`.
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(system_roots().iter().cloned());
    if let Some(path) = ca_file {
        for cert in read_ca_file(path)? {
            roots.add(cert).map_err(|e| e.to_string())?;
        }
    }
    if roots.is_empty() {
        tracing::warn!(
            "no trusted root certificates (the system has none, and no `ca_file` is set): every https call will fail its certificate check"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up the TLS client: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The system's root certificates, read once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::debug!("reading the system's root certificates: {error}");
        }
        found.certs
    })
}

/// TLS over `stream` to `host` (a name or an IP literal, which the certificate must name).
pub(super) async fn handshake(
    config: &Arc<ClientConfig>,
    host: &str,
    stream: TcpStream,
) -> Result<TlsStream<TcpStream>, (Error, CallResult)> {
    let name = ServerName::try_from(host.to_string()).map_err(|_| {
        let error = Error::DnsError {
            rcode: Some(format!("`{host}` is not a valid TLS server name")),
            info_code: None,
        };
        (error, CallResult::Failed)
    })?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, stream)
        .await
        .map_err(|e| (error_code(&e), CallResult::Failed))
}

/// The error code a guest sees for a failed handshake.
fn error_code(e: &std::io::Error) -> Error {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    tracing::debug!("TLS handshake failed: {e}");
    match tls {
        Some(rustls::Error::InvalidCertificate(_)) => Error::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => Error::TlsAlertReceived {
            alert_id: Some(u8::from(*alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        Some(_) => Error::TlsProtocolError,
        None => Error::ConnectionTerminated,
    }
}
