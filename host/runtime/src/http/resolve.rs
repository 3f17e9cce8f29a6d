//! Name resolution for outbound calls: the addresses a host name stands for, resolved once per
//! call; the call connects to an address checked here, never to the name again (no DNS
//! rebinding between the check and the connect).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// Test-only: `name=ip,name=ip` answers for names no resolver knows, so the tests can make a
/// public-looking name resolve to a loopback address.
const TEST_RESOLVE: &str = "DEDUP_HOST_TEST_RESOLVE";

/// The addresses of `host:port`.
pub(super) async fn addresses(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Some(ip) = super::allow::literal(host) {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if let Some(ip) = overrides().get(&host.to_ascii_lowercase()) {
        return Ok(vec![SocketAddr::new(*ip, port)]);
    }
    Ok(tokio::net::lookup_host((host, port)).await?.collect())
}

fn overrides() -> &'static HashMap<String, IpAddr> {
    static OVERRIDES: OnceLock<HashMap<String, IpAddr>> = OnceLock::new();
    OVERRIDES.get_or_init(|| {
        let text = std::env::var(TEST_RESOLVE).unwrap_or_default();
        text.split(',')
            .filter_map(|pair| {
                let (name, ip) = pair.split_once('=')?;
                Some((name.trim().to_ascii_lowercase(), ip.trim().parse().ok()?))
            })
            .collect()
    })
}
