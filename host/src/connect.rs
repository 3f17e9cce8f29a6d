//! Connecting to NATS with the configured authentication and TLS.

use anyhow::Context;
use async_nats::ConnectOptions;

use crate::config::Config;

/// Connects to the configured servers as `name` (shown in the server's connection list).
pub async fn connect(config: &Config, name: &str) -> anyhow::Result<async_nats::Client> {
    let n = &config.nats;
    anyhow::ensure!(
        !n.urls.is_empty(),
        "`nats.urls` is empty: name a server, or use `dedup-host dev` to start a local one"
    );
    let mut options = match &n.creds_file {
        Some(path) => {
            let path = config.resolve(path);
            ConnectOptions::with_credentials_file(&path)
                .await
                .with_context(|| {
                    format!("`nats.creds_file` `{}`: cannot read it", path.display())
                })?
        }
        None => ConnectOptions::new(),
    };
    if let (Some(user), Some(password)) = (&n.user, &n.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &n.token {
        options = options.token(token.clone());
    }
    if let Some(seed) = &n.nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let Some(ca) = &n.tls_ca {
        options = options
            .add_root_certificates(config.resolve(ca))
            .require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&n.tls_cert, &n.tls_key) {
        options = options.add_client_certificate(config.resolve(cert), config.resolve(key));
    }
    let urls = n.urls.join(",");
    options
        .name(name)
        .connect(urls.as_str())
        .await
        .with_context(|| format!("cannot connect to NATS at `{urls}` (`nats.urls`)"))
}
