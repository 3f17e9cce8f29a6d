//! Login sessions: a random token per login, known only to the browser it was sent to and
//! kept here (as its digest) with an expiry; a logout ends it, and so does a console restart.
//! Nothing about the secret can be read from a cookie, and an old cookie stops working.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// The live sessions of one console.
#[derive(Debug, Clone)]
pub struct Sessions {
    ttl: Duration,
    live: Arc<Mutex<HashMap<[u8; 32], Session>>>,
}

#[derive(Debug)]
struct Session {
    who: String,
    expires: Instant,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(SESSION_TTL)
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Sessions {
    /// No sessions yet; each login lasts `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            live: Arc::default(),
        }
    }

    /// How long a login lasts (the cookie's `Max-Age`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Starts a session for `who`; returns its token (the cookie's value).
    pub fn start(&self, who: &str) -> String {
        let token = hex::encode(rand::random::<[u8; 32]>());
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, s| s.expires > now);
        live.insert(
            digest(&token),
            Session {
                who: who.to_string(),
                expires: now + self.ttl,
            },
        );
        token
    }

    /// Who the session `token` belongs to, while it lasts.
    pub fn who(&self, token: &str) -> Option<String> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.get(&digest(token))
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.who.clone())
    }

    /// Ends the session `token` (a logout).
    pub fn end(&self, token: &str) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.remove(&digest(token));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_random_expire_and_end() {
        let sessions = Sessions::default();
        let a = sessions.start("ops");
        let b = sessions.start("ops");
        assert_ne!(a, b, "a new token per login");
        assert_eq!(sessions.who(&a).as_deref(), Some("ops"));
        assert_eq!(sessions.who("forged"), None);
        sessions.end(&a);
        assert_eq!(sessions.who(&a), None, "a logout ends it");
        assert_eq!(sessions.who(&b).as_deref(), Some("ops"));
        let expired = Sessions::new(Duration::ZERO);
        let old = expired.start("ops");
        assert_eq!(expired.who(&old), None, "an expired session is refused");
    }
}
