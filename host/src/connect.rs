//! Connecting to NATS with the configured authentication and TLS.

use std::time::Duration;

use anyhow::Context;
use async_nats::{ConnectOptions, ServerAddr};

use crate::config::Config;

/// Connects to the configured servers as `name` (shown in the server's connection list).
pub async fn connect(config: &Config, name: &str) -> anyhow::Result<async_nats::Client> {
    connect_observed(config, name, crate::refusals::Refusals::process()).await
}

/// [`connect`], keeping what the server refuses this connection in `refusals` (besides the
/// process-wide list): an action on its own connection reports its own refusals only.
pub async fn connect_observed(
    config: &Config,
    name: &str,
    refusals: crate::refusals::Refusals,
) -> anyhow::Result<async_nats::Client> {
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
    let mut servers = Vec::with_capacity(n.urls.len());
    for (i, url) in n.urls.iter().enumerate() {
        let server: ServerAddr = url.trim().parse().with_context(|| {
            let url = without_credentials(url);
            format!("`nats.urls[{i}]` `{url}` is not a server URL (example: nats://10.0.0.1:4222)")
        })?;
        servers.push(server);
    }
    options = liveness(options, config.claims.heartbeat)
        .custom_inbox_prefix(n.inbox())
        .event_callback(move |event| {
            let refusals = refusals.clone();
            async move {
                // A refused subject is named at once and kept for the error of whatever
                // waits on it (`crate::refusals`).
                if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = &event
                {
                    refusals.observe(text);
                }
            }
        });
    // Every URL is handed over as its own server, so the client fails over among them.
    let client = options.name(name).connect(servers).await.map_err(|e| {
        let origin = n
            .urls_origin
            .as_deref()
            .unwrap_or("`nats.urls` in the config");
        let fix = fix(&e);
        let urls: Vec<String> = n.urls.iter().map(|u| without_credentials(u)).collect();
        anyhow::Error::new(e).context(format!(
            "cannot connect to NATS at {} (from {origin}): {fix}",
            urls.join(", ")
        ))
    })?;
    check_version(&client.server_info().version)?;
    Ok(client)
}

/// `url` without the credentials it may carry, for messages and logs.
pub use crate::config::without_credentials;

/// What to check when connecting failed, by what failed: the TLS handshake (a certificate the
/// other side does not trust, or one outside its validity), the credentials, or reaching the
/// server at all.
fn fix(error: &async_nats::ConnectError) -> &'static str {
    use async_nats::ConnectErrorKind as Kind;
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    let text = text.to_ascii_lowercase();
    if error.kind() == Kind::Tls || text.contains("certificate") || text.contains("tls") {
        "the TLS handshake failed: check that `nats.tls_ca` is the CA that signed the server's certificate, that the certificate is valid now (not expired) and names the host of the URL, and, where the server asks for client certificates, `nats.tls_cert` and `nats.tls_key`"
    } else if matches!(
        error.kind(),
        Kind::AuthorizationViolation | Kind::Authentication
    ) {
        "the server refused the credentials: check `nats.user`/`password`, `token`, `nkey_seed` or `creds_file` against the server's users"
    } else {
        "is the server running and reachable? Start a local one with `dedup-host dev`, or name another with --nats-url"
    }
}

/// How soon a dead connection is noticed and a healed one used again.
///
/// A connection cut off by the network (no reset, no FIN: a partition, a dead middlebox) looks
/// alive to TCP for minutes, and the client's default ping every 60 s notices it only after
/// three of them; meanwhile every claim, renewal and publish waits on it. Pinging an idle
/// connection every heartbeat (at least 1 s, at most 30 s) drops one that answered nothing for
/// three pings, so a host notices within a few heartbeats, while its leases still run (a lease
/// outlasts three heartbeats, rule 9). A new connection is then tried at once, then every 0.5–1.25 s (spread at random), each
/// attempt given 2 s, so work resumes within about a second of the heal instead of after TCP's
/// retransmission backoff on the dead connection.
fn liveness(options: ConnectOptions, heartbeat: Duration) -> ConnectOptions {
    options
        .ping_interval(heartbeat.clamp(Duration::from_secs(1), Duration::from_secs(30)))
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|attempts| match attempts {
            0 | 1 => Duration::ZERO,
            // Spread by up to 250 ms, so a fleet cut off together does not reconnect in step.
            n => Duration::from_millis((n as u64 * 250).min(1_000) + rand::random::<u64>() % 250),
        })
}

/// The oldest nats-server the claim protocol is sound on (message TTLs and the replicated
/// compare-and-swap fixes, DESIGN.md §2 rule 12).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);

/// Refuses servers older than [`MIN_SERVER_VERSION`].
pub fn check_version(version: &str) -> anyhow::Result<()> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let (major, minor) = MIN_SERVER_VERSION;
    anyhow::ensure!(
        found >= MIN_SERVER_VERSION,
        "nats-server {version} is too old: dedup-host needs {major}.{minor} or newer (replicated compare-and-swap fixes, message TTLs); upgrade the server"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_version, without_credentials};

    #[test]
    fn urls_are_shown_without_their_credentials() {
        assert_eq!(
            without_credentials("nats://alice:s3cret@10.0.0.1:4222"),
            "nats://10.0.0.1:4222"
        );
        assert_eq!(
            without_credentials("tls://tok@en@nats.example:4222/x"),
            "tls://nats.example:4222/x"
        );
        assert_eq!(without_credentials("u:p@127.0.0.1:4222"), "127.0.0.1:4222");
        assert_eq!(
            without_credentials("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
    }

    #[test]
    fn servers_before_2_11_are_refused() {
        assert!(check_version("2.15.1").is_ok());
        assert!(check_version("2.11.0").is_ok());
        assert!(check_version("3.0.0-beta").is_ok());
        let err = check_version("2.10.22").unwrap_err().to_string();
        assert!(err.contains("2.10.22") && err.contains("2.11"), "{err}");
        assert!(check_version("2.9.0").is_err());
    }
}
