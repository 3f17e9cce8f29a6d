//! Keep-alive connections of one route's calls ([`super::HttpGrant`] holds the pool, so routes
//! never share one), reused by later calls to the same checked address: the same scheme, host
//! name (a TLS connection's certificate was checked for it), port and resolved IP, with the
//! route's TLS roots. A call still resolves and checks its address (allowlist, private
//! addresses) every time; only a connection to the very address it checked is reused.
//!
//! Bounded: at most [`MAX_IDLE_PER_KEY`] idle connections an address and [`MAX_IDLE`] a
//! route; one idle longer than [`IDLE_TIMEOUT`] is closed (a sweep runs while any is idle).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;

/// How long a connection may stay idle before it is closed: under the 5 s keep-alive common
/// servers (Node.js, Apache) close idle connections after, so a reused one is rarely closed
/// by the server just as a request goes out.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Most idle connections kept to one address.
pub(super) const MAX_IDLE_PER_KEY: usize = 64;
/// Most idle connections kept by one route.
pub(super) const MAX_IDLE: usize = 256;

/// The address a connection goes to, as the call checked it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    /// `http` or `https`.
    pub(super) scheme: String,
    /// The URL's host (what a TLS certificate was checked against).
    pub(super) host: String,
    /// The URL's port.
    pub(super) port: u16,
    /// The resolved address the call checked and connects to.
    pub(super) addr: SocketAddr,
}

/// The sending half of an HTTP/1.1 connection (its driver runs as a task of its own).
pub(super) type Sender = SendRequest<Full<Bytes>>;

struct Idle {
    sender: Sender,
    since: Instant,
}

#[derive(Default)]
struct Inner {
    idle: HashMap<Key, Vec<Idle>>,
    count: usize,
    /// A sweep task is running (it stops once nothing is idle).
    sweeping: bool,
}

/// One route's idle connections, by address.
#[derive(Default)]
pub(crate) struct Pool {
    inner: Mutex<Inner>,
}

impl Pool {
    /// An idle connection to `key` ready for a request (the most recently used), if any.
    pub(super) fn take(&self, key: &Key) -> Option<Sender> {
        let mut inner = self.inner.lock().expect("connection pool");
        let inner = &mut *inner;
        let list = inner.idle.get_mut(key)?;
        let mut found = None;
        while let Some(idle) = list.pop() {
            inner.count -= 1;
            // Only ready connections are pooled: one not ready now was closed meanwhile.
            if idle.since.elapsed() < IDLE_TIMEOUT && idle.sender.is_ready() {
                found = Some(idle.sender);
                break;
            }
        }
        if list.is_empty() {
            inner.idle.remove(key);
        }
        found
    }

    /// Keeps `sender`, whose answer was read in full, for a later call to `key`: now if its
    /// connection is ready for another request, once it is otherwise (closed: dropped).
    pub(super) fn put(self: &Arc<Self>, key: Key, mut sender: Sender) {
        if sender.is_closed() {
            return;
        }
        if sender.is_ready() {
            return self.keep(key, sender);
        }
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            let ready = tokio::time::timeout(IDLE_TIMEOUT, sender.ready()).await;
            if let (Ok(Ok(())), Some(pool)) = (ready, pool.upgrade()) {
                pool.keep(key, sender);
            }
        });
    }

    fn keep(self: &Arc<Self>, key: Key, sender: Sender) {
        let mut inner = self.inner.lock().expect("connection pool");
        let list = inner.idle.entry(key).or_default();
        if list.len() >= MAX_IDLE_PER_KEY {
            return;
        }
        list.push(Idle {
            sender,
            since: Instant::now(),
        });
        inner.count += 1;
        if inner.count > MAX_IDLE {
            inner.evict_oldest();
        }
        if !inner.sweeping {
            inner.sweeping = true;
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }

    /// How many connections are idle (tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.inner.lock().expect("connection pool").count
    }

    /// How many idle connections are still ready for a request (tests).
    #[cfg(test)]
    fn ready_idle(&self) -> usize {
        let inner = self.inner.lock().expect("connection pool");
        let mut all = inner.idle.values().flatten();
        all.by_ref().filter(|idle| idle.sender.is_ready()).count()
    }
}

impl Inner {
    /// Closes the connection idle longest.
    fn evict_oldest(&mut self) {
        let oldest = (self.idle.iter())
            .filter_map(|(key, list)| Some((key, list.first()?.since)))
            .min_by_key(|(_, since)| *since)
            .map(|(key, _)| key.clone());
        if let Some(key) = oldest {
            let list = self.idle.get_mut(&key).expect("the key just found");
            list.remove(0);
            self.count -= 1;
            if list.is_empty() {
                self.idle.remove(&key);
            }
        }
    }

    /// Closes every connection idle past [`IDLE_TIMEOUT`] or closed by its server.
    fn prune(&mut self) {
        for list in self.idle.values_mut() {
            list.retain(|idle| idle.since.elapsed() < IDLE_TIMEOUT && !idle.sender.is_closed());
        }
        self.idle.retain(|_, list| !list.is_empty());
        self.count = self.idle.values().map(Vec::len).sum();
    }
}

/// Closes idle connections as they time out, until none is idle or the route is gone.
async fn sweep(pool: Weak<Pool>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT / 2).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut inner = pool.inner.lock().expect("connection pool");
        inner.prune();
        if inner.count == 0 {
            inner.sweeping = false;
            return;
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
