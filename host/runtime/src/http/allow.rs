//! A route's HTTP allowlist: which scheme, host, port, path prefix and methods a guest may
//! call, and which resolved addresses it may reach (no loopback or private address unless a
//! rule names one: an IP literal or `localhost`).

use std::net::IpAddr;

/// One parsed `allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `http` or `https`.
    pub scheme: String,
    /// The host, lower case, exactly as it must appear in a request.
    pub host: String,
    /// The port; `None` allows any (`:*`).
    pub port: Option<u16>,
    /// The path a request's path must start with (`/` allows every path).
    pub path_prefix: String,
    /// Methods allowed, upper case; empty allows any.
    pub methods: Vec<String>,
}

impl Rule {
    /// Parses `scheme://host[:port|:*][/path-prefix[*]]` with `methods`; says what is wrong.
    pub fn parse(url: &str, methods: &[String]) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("`{url}` has no scheme: write `http://host:port/path`"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!(
                "`{url}`: scheme `{scheme}` is not allowed; use `https` or `http`"
            ));
        }
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let path_prefix = path.strip_suffix('*').unwrap_or(path).to_string();
        if path_prefix.contains('*') || path_prefix.contains('?') {
            return Err(format!(
                "`{url}`: a path prefix may end with `*` but hold no other wildcard or query"
            ));
        }
        let (host, port) = split_port(authority, default_port(&scheme))
            .ok_or_else(|| format!("`{url}`: the port must be a number from 1 to 65535 or `*`"))?;
        if host.is_empty() || host.contains('*') || host.contains('@') {
            return Err(format!(
                "`{url}`: name one host exactly (no user, no wildcard)"
            ));
        }
        let methods = methods.iter().map(|m| m.to_ascii_uppercase()).collect();
        Ok(Self {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            path_prefix,
            methods,
        })
    }

    /// Whether a request `method` to `scheme://host:port/path` is allowed by this rule.
    pub fn allows(&self, method: &str, scheme: &str, host: &str, port: u16, path: &str) -> bool {
        self.scheme == scheme
            && self.host.eq_ignore_ascii_case(host)
            && self.port.is_none_or(|p| p == port)
            && path.starts_with(&self.path_prefix)
            && (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
    }

    /// Whether the rule names its host explicitly enough to reach loopback and private
    /// addresses: an IP literal, or `localhost`.
    pub fn names_private(&self) -> bool {
        self.host == "localhost" || literal(&self.host).is_some()
    }
}

/// The port of a URL of `scheme` that names none: 443 for `https`, 80 otherwise.
pub fn default_port(scheme: &str) -> u16 {
    match scheme {
        "https" => 443,
        _ => 80,
    }
}

/// `host[:port|:*]`, with `[v6]` literals, `default` when no port is named; `None` when the
/// port does not parse.
fn split_port(authority: &str, default: u16) -> Option<(&str, Option<u16>)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    match port {
        None => Some((host, Some(default))),
        Some("*") => Some((host, None)),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(|p| (host, Some(p))),
    }
}

/// `host` as an IP address, when it is a literal (`[::1]` or `::1` or `127.0.0.1`).
pub fn literal(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

/// Whether `ip` is not a public address: loopback, private, link-local, shared (CGNAT),
/// unspecified, broadcast, multicast, documentation, benchmarking (198.18/15), reserved
/// (240/4), or an IPv6 address that carries an IPv4 one (mapped, compatible, NAT64
/// `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`) that is one of those: behind DNS64 a
/// name resolving to `64:ff9b::a00:1` reaches 10.0.0.1.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if (a == 198 && (b == 18 || b == 19)) || a >= 240 {
                return true;
            }
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || (a == 100 && (64..128).contains(&b))
                || a == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                is_private(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)))
            };
            // NAT64 (well-known and local-use prefixes): the IPv4 address is the last 32 bits.
            if (s[0] == 0x64 && s[1] == 0xff9b) && (s[2..6] == [0; 4] || s[2] == 1) {
                return embedded(s[6], s[7]);
            }
            // 6to4: the IPv4 address follows the prefix.
            if s[0] == 0x2002 {
                return embedded(s[1], s[2]);
            }
            // IPv4-compatible (deprecated, still routed by some stacks): `::a.b.c.d`.
            if s[..6] == [0; 6] && !v6.is_loopback() && !v6.is_unspecified() {
                return embedded(s[6], s[7]);
            }
            let first = s[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(url: &str) -> Rule {
        Rule::parse(url, &[]).expect(url)
    }

    #[test]
    fn rules_match_scheme_host_port_path_and_methods() {
        let r = rule("http://127.0.0.1:*/hooks/*");
        assert!(r.allows("POST", "http", "127.0.0.1", 8080, "/hooks/a"));
        assert!(!r.allows("POST", "http", "127.0.0.1", 8080, "/other"));
        assert!(!r.allows("POST", "http", "127.0.0.2", 8080, "/hooks/a"));
        let r = rule("http://api.example.com");
        assert!(r.allows("GET", "http", "API.example.com", 80, "/x"));
        assert!(!r.allows("GET", "http", "api.example.com", 81, "/x"));
        let r = Rule::parse("http://h:8/p", &["post".into()]).unwrap();
        assert!(r.allows("POST", "http", "h", 8, "/p"));
        assert!(!r.allows("DELETE", "http", "h", 8, "/p"));
        let r = rule("https://api.example.com/v1/");
        assert!(r.allows("POST", "https", "api.example.com", 443, "/v1/x"));
        assert!(
            !r.allows("POST", "http", "api.example.com", 443, "/v1/x"),
            "an https rule does not let plain http through"
        );
        assert!(!r.allows("POST", "https", "api.example.com", 80, "/v1/x"));
    }

    #[test]
    fn bad_rules_are_refused_naming_the_fix() {
        assert!(Rule::parse("ftp://h", &[])
            .unwrap_err()
            .contains("use `https` or `http`"));
        assert!(Rule::parse("h:80/x", &[])
            .unwrap_err()
            .contains("no scheme"));
        assert!(Rule::parse("http://h:0/", &[])
            .unwrap_err()
            .contains("port"));
        assert!(Rule::parse("http://*.h/", &[])
            .unwrap_err()
            .contains("one host"));
    }

    #[test]
    fn only_literals_and_localhost_name_private_addresses() {
        assert!(rule("http://127.0.0.1:*/").names_private());
        assert!(rule("http://[::1]:*/").names_private());
        assert!(rule("http://localhost:*/").names_private());
        assert!(!rule("http://api.example.com/").names_private());
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "198.18.0.1",
            "240.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::7f00:1",
            "2002:a00:1::1",
            "::10.0.0.1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "2606:4700::1111",
        ] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }
}
