//! Who may use the console. It binds to loopback by default; on any other address it refuses
//! to start without a token, or a user and password, from the config (`[console]`) or the
//! environment (`DEDUP_CONSOLE_TOKEN`, `DEDUP_CONSOLE_USER`, `DEDUP_CONSOLE_PASSWORD`). On
//! loopback without one, pages can be read freely and a token is made up at start (printed,
//! never in a URL), so every change still needs it. Every request must name a host the
//! console answers to ([`super::hosts`]).
//!
//! A login (a POST of the login form) sets an `HttpOnly`, `SameSite=Strict` session cookie
//! holding a random token that expires ([`super::sessions`]; `Secure` behind HTTPS); a logout
//! ends it. Scripts may send `Authorization: Bearer <token>` instead. Every change is a POST
//! carrying the CSRF value (derived from the secret) in its form, and its `Origin`, when
//! sent, must be the console's own.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};

use super::hosts::{AllowedHosts, HOSTS_ENV};
use super::sessions::Sessions;
use crate::config::ConsoleConfig;

/// The session cookie's name.
pub const COOKIE: &str = "dedup_console";

/// Why the console cannot start with these settings.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A non-loopback address and no secret.
    #[error("the console would listen on {addr}, which is not a loopback address, with no token: set `console.token` (or `console.user` and `console.password`) in the config, or DEDUP_CONSOLE_TOKEN in the environment, or listen on 127.0.0.1")]
    OpenOnNetwork {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// A user without a password, or the reverse.
    #[error("`console.user` and `console.password` go together (or DEDUP_CONSOLE_USER and DEDUP_CONSOLE_PASSWORD): set both, or use `console.token`")]
    Incomplete,
    /// A secret too short to resist guessing.
    #[error("the console token (or password) is {0} characters long; use at least 12")]
    TooShort(usize),
}

/// The secret and how it was chosen.
#[derive(Debug, Clone)]
pub struct Access {
    user: Option<String>,
    secret: String,
    configured: bool,
    hosts: AllowedHosts,
    sessions: Sessions,
}

impl Access {
    /// The access for `addr` from the config and the environment (`env` reads a variable).
    pub fn new(
        config: &ConsoleConfig,
        env: impl Fn(&str) -> Option<String>,
        addr: SocketAddr,
    ) -> Result<Self, AccessError> {
        let hosts = AllowedHosts::new(addr, env(HOSTS_ENV).as_deref());
        let token = env("DEDUP_CONSOLE_TOKEN").or_else(|| config.token.clone());
        let user = env("DEDUP_CONSOLE_USER").or_else(|| config.user.clone());
        let password = env("DEDUP_CONSOLE_PASSWORD").or_else(|| config.password.clone());
        let (user, secret) = match (token, user, password) {
            (Some(token), _, _) => (None, token),
            (None, Some(user), Some(password)) => (Some(user), password),
            (None, None, None) => {
                if !addr.ip().is_loopback() {
                    return Err(AccessError::OpenOnNetwork { addr });
                }
                let made_up = hex::encode(rand::random::<[u8; 16]>());
                return Ok(Self {
                    user: None,
                    secret: made_up,
                    configured: false,
                    hosts,
                    sessions: Sessions::default(),
                });
            }
            _ => return Err(AccessError::Incomplete),
        };
        if secret.chars().count() < 12 {
            return Err(AccessError::TooShort(secret.chars().count()));
        }
        Ok(Self {
            user,
            secret,
            configured: true,
            hosts,
            sessions: Sessions::default(),
        })
    }

    /// Whether pages can be read without logging in (loopback, no configured secret).
    pub fn reads_open(&self) -> bool {
        !self.configured
    }

    /// Whether a login asks for a user name too.
    pub fn wants_user(&self) -> bool {
        self.user.is_some()
    }

    /// The made-up token of a loopback console without a configured one (to print at start).
    pub fn made_up_token(&self) -> Option<&str> {
        (!self.configured).then_some(self.secret.as_str())
    }

    fn derived(&self, purpose: &str) -> String {
        let mut h = Sha256::new();
        h.update(purpose.as_bytes());
        h.update([0]);
        h.update(self.secret.as_bytes());
        hex::encode(h.finalize())
    }

    /// Why a request naming `Host` `host` is not answered, if it is not.
    pub fn host_refusal(&self, host: Option<&str>) -> Option<String> {
        self.hosts.refusal(host)
    }

    /// The CSRF value every changing form carries.
    pub fn csrf(&self) -> String {
        self.derived("csrf")
    }

    /// Whether `user` and `secret` are right; compared as digests, so in constant time.
    pub fn check(&self, user: Option<&str>, secret: &str) -> bool {
        let digest = |s: &str| Sha256::digest(s.as_bytes());
        let user_ok = match &self.user {
            Some(expected) => user.is_some_and(|u| digest(u) == digest(expected)),
            None => true,
        };
        user_ok && digest(secret) == digest(&self.secret)
    }

    /// Who the request comes from, when it is logged in (cookie) or carries the token.
    pub fn who(&self, headers: &HeaderMap) -> Option<String> {
        let name = self.user.clone().unwrap_or_else(|| "token".into());
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|t| self.user.is_none() && self.check(None, t)) {
            return Some(name);
        }
        session_token(headers).and_then(|t| self.sessions.who(&t))
    }

    /// Why a changing request is refused, if it is: not logged in, a wrong CSRF value, or a
    /// foreign `Origin`.
    pub fn refuse_change(&self, headers: &HeaderMap, csrf: Option<&str>) -> Option<Refusal> {
        if self.who(headers).is_none() {
            return Some(Refusal::NotLoggedIn);
        }
        let expected = self.csrf();
        if csrf.is_none_or(|c| Sha256::digest(c.as_bytes()) != Sha256::digest(expected.as_bytes()))
        {
            return Some(Refusal::Csrf);
        }
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if let (Some(origin), Some(host)) = (origin, host) {
            let bare = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            if bare != Some(host) {
                return Some(Refusal::Origin);
            }
        }
        None
    }

    /// Starts a session for a login whose secret was checked; returns the `Set-Cookie`
    /// value (`secure` when the console is reached over HTTPS).
    pub fn login_cookie(&self, secure: bool) -> String {
        let name = self.user.clone().unwrap_or_else(|| "token".into());
        let token = self.sessions.start(&name);
        let secure = if secure { "; Secure" } else { "" };
        format!(
            "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
            self.sessions.ttl().as_secs()
        )
    }

    /// Ends the request's session, if it has one; returns the `Set-Cookie` value that
    /// removes the cookie.
    pub fn logout_cookie(&self, headers: &HeaderMap) -> String {
        if let Some(token) = session_token(headers) {
            self.sessions.end(&token);
        }
        format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
    }
}

/// The session token of the request's cookie, if it has one.
fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Whether the request reached the console over HTTPS (through a proxy that terminates it).
pub fn over_https(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("x-forwarded-proto").is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        || header("origin").is_some_and(|o| o.starts_with("https://"))
}

/// Why a change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No session cookie and no bearer token.
    NotLoggedIn,
    /// The form's CSRF value is missing or wrong.
    Csrf,
    /// The request came from another site.
    Origin,
}

impl Refusal {
    /// The sentence shown.
    pub fn message(self) -> &'static str {
        match self {
            Self::NotLoggedIn => "log in with the console's token first (/login)",
            Self::Csrf => {
                "the form's CSRF value is missing or wrong: reload the page and try again"
            }
            Self::Origin => "the request came from another site",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_network_address_needs_a_secret_and_loopback_makes_one_up() {
        let none = ConsoleConfig::default();
        let err = Access::new(&none, |_| None, addr("0.0.0.0:8080")).unwrap_err();
        assert!(err.to_string().contains("DEDUP_CONSOLE_TOKEN"), "{err}");
        let local = Access::new(&none, |_| None, addr("127.0.0.1:8080")).expect("loopback");
        assert!(local.reads_open() && local.made_up_token().is_some());
        let env = |k: &str| (k == "DEDUP_CONSOLE_TOKEN").then(|| "a-long-enough-token".to_string());
        let token = Access::new(&none, env, addr("0.0.0.0:8080")).expect("token");
        assert!(!token.reads_open() && token.check(None, "a-long-enough-token"));
        assert!(!token.check(None, "a-long-enough-tokeN"));
        let short = |k: &str| (k == "DEDUP_CONSOLE_TOKEN").then(|| "short".to_string());
        assert!(Access::new(&none, short, addr("0.0.0.0:1")).is_err());
        let half = ConsoleConfig {
            user: Some("ops".into()),
            ..Default::default()
        };
        assert!(matches!(
            Access::new(&half, |_| None, addr("127.0.0.1:1")),
            Err(AccessError::Incomplete)
        ));
    }

    #[test]
    fn a_change_needs_the_session_and_the_csrf_value_and_our_origin() {
        let config = ConsoleConfig {
            token: Some("a-long-enough-token".into()),
            ..Default::default()
        };
        let access = Access::new(&config, |_| None, addr("127.0.0.1:8080")).expect("access");
        let mut headers = HeaderMap::new();
        let csrf = access.csrf();
        assert_eq!(
            access.refuse_change(&headers, Some(&csrf)),
            Some(Refusal::NotLoggedIn)
        );
        let forged = format!("{COOKIE}={}", access.derived("session"));
        headers.insert(header::COOKIE, forged.parse().expect("header"));
        assert_eq!(
            access.who(&headers),
            None,
            "a cookie derived from the secret"
        );
        let set = access.login_cookie(false);
        assert!(set.contains("HttpOnly; SameSite=Strict") && set.contains("Max-Age="));
        assert!(!set.contains("Secure") && access.login_cookie(true).ends_with("; Secure"));
        let token = set.split(';').next().unwrap().split_once('=').unwrap().1;
        let cookie = format!("other=1; {COOKIE}={token}");
        headers.insert(header::COOKIE, cookie.parse().expect("header"));
        assert_eq!(access.who(&headers).as_deref(), Some("token"));
        assert_eq!(access.refuse_change(&headers, None), Some(Refusal::Csrf));
        assert_eq!(access.refuse_change(&headers, Some(&csrf)), None);
        headers.insert(header::HOST, "127.0.0.1:8080".parse().expect("header"));
        headers.insert(
            header::ORIGIN,
            "http://evil.example".parse().expect("header"),
        );
        assert_eq!(
            access.refuse_change(&headers, Some(&csrf)),
            Some(Refusal::Origin)
        );
        assert!(access.logout_cookie(&headers).contains("Max-Age=0"));
        assert_eq!(access.who(&headers), None, "a logout ends the session");
    }
}
