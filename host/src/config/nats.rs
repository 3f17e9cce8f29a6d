//! `[nats]`: how a host or a command reaches NATS (servers, credentials, TLS, the reply
//! prefix).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// NATS connection settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URLs, e.g. `["nats://10.0.0.1:4222"]`.
    #[serde(default)]
    pub urls: Vec<String>,
    /// Where `urls` came from when not from the file (a flag, the environment, a `dev`
    /// running beside it), for error messages; `None` means `nats.urls`.
    #[serde(skip)]
    pub urls_origin: Option<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password (with `user`).
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// Token authentication.
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// NKey seed (`SU...`).
    #[serde(skip_serializing)]
    pub nkey_seed: Option<String>,
    /// Path of a `.creds` file (JWT + seed).
    pub creds_file: Option<PathBuf>,
    /// CA certificate to verify the server with.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// Client key (with `tls_cert`).
    pub tls_key: Option<PathBuf>,
    /// Prefix of this client's reply subjects (default `_INBOX`): give each deployment its
    /// own (`_INBOX_orders`, say) so its users subscribe to `<prefix>.>` only, not to every
    /// client's replies (`dedup-host permissions` prints the sets).
    #[schemars(regex(pattern = r"^[^.*>\s]+$"))]
    pub inbox_prefix: Option<String>,
}

impl NatsConfig {
    /// The prefix of reply subjects: `inbox_prefix`, or `_INBOX`.
    pub fn inbox(&self) -> &str {
        self.inbox_prefix.as_deref().unwrap_or("_INBOX")
    }
}

/// `url` without the `user:password@` (or `token@`) it may carry, for messages and logs: the
/// text up to the last `@` after the scheme goes, wherever it ends (a URL refused for its
/// spaces or a stray `/` in a password still hides its credentials).
pub fn without_credentials(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    match rest.rfind('@') {
        Some(at) => format!("{scheme}{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}
