//! Which `Host` names the console answers. A page on another site can make a browser talk to
//! the console by pointing its own name at 127.0.0.1 (DNS rebinding): the browser then sends
//! that name as `Host`, and treats the answers as the other site's, readable by its script.
//! So only loopback names and addresses, the address the console listens on, any IP address
//! when it listens on all of them, and the names configured in `DEDUP_CONSOLE_HOSTS` (comma
//! separated) are answered.

use std::net::{IpAddr, SocketAddr};

/// The environment variable naming extra host names the console answers to.
pub const HOSTS_ENV: &str = "DEDUP_CONSOLE_HOSTS";

/// The host names and addresses the console answers.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    listen: IpAddr,
    names: Vec<String>,
}

impl AllowedHosts {
    /// The hosts of a console listening on `listen`, plus `names` (a comma-separated list).
    pub fn new(listen: SocketAddr, names: Option<&str>) -> Self {
        let names = names
            .unwrap_or_default()
            .split(',')
            .map(|n| n.trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        Self {
            listen: listen.ip(),
            names,
        }
    }

    /// Why a request with this `Host` header (none: `None`) is not answered, if it is not.
    pub fn refusal(&self, host: Option<&str>) -> Option<String> {
        let Some(host) = host else {
            return Some("the request has no Host header".into());
        };
        let name = bare_host(host).to_ascii_lowercase();
        if self.allows(&name) {
            return None;
        }
        Some(format!(
            "this console does not answer to host `{}`: open it by a loopback address, localhost or the address it listens on, or add the name to {HOSTS_ENV}",
            host.escape_debug()
        ))
    }

    fn allows(&self, name: &str) -> bool {
        if name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        if self.names.iter().any(|n| n == name) {
            return true;
        }
        let ip = name.trim_start_matches('[').trim_end_matches(']');
        match ip.parse::<IpAddr>() {
            // An address is no name another site can point at us.
            Ok(ip) => ip.is_loopback() || ip == self.listen || self.listen.is_unspecified(),
            Err(_) => false,
        }
    }
}

/// The host part of a `Host` header: without its port, an IPv6 address keeping its brackets.
fn bare_host(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_and_addresses_are_answered() {
        let local = AllowedHosts::new("127.0.0.1:8080".parse().unwrap(), None);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "127.0.0.2",
        ] {
            assert_eq!(local.refusal(Some(ok)), None, "{ok}");
        }
        for no in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:8080",
            "127.0.0.1.evil.example",
        ] {
            let refusal = local.refusal(Some(no)).expect(no);
            assert!(refusal.contains(HOSTS_ENV), "{refusal}");
        }
        assert!(local.refusal(None).is_some());
        let named = AllowedHosts::new(
            "10.0.0.5:8080".parse().unwrap(),
            Some("console.internal, ops.example"),
        );
        assert_eq!(named.refusal(Some("console.internal:8080")), None);
        assert_eq!(named.refusal(Some("10.0.0.5:8080")), None);
        assert!(named.refusal(Some("10.0.0.6:8080")).is_some());
        assert!(named.refusal(Some("evil.example")).is_some());
        let all = AllowedHosts::new("0.0.0.0:8080".parse().unwrap(), None);
        assert_eq!(all.refusal(Some("10.0.0.6:8080")), None);
        assert!(all.refusal(Some("evil.example")).is_some());
    }
}
