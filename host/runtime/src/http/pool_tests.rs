use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Key, Pool};
use crate::http::send;

/// How a test server treats a connection after its first answer.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// Keeps it open for more requests.
    KeepAlive,
    /// Answers with `connection: close` and closes it.
    Close,
    /// Closes it silently once the answer is out (an idle timeout of the server's).
    Drop,
}

/// A loopback HTTP/1.1 server answering every request `200 ok`, counting its connections.
async fn server(after: After) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    // Requests here carry no body: one ends at its blank line.
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let answer: &[u8] = match after {
                            After::Close => {
                                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                            }
                            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                        };
                        stream.write_all(answer).await.unwrap();
                        if after != After::KeepAlive {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

fn key(addr: SocketAddr) -> Key {
    Key {
        scheme: "http".into(),
        host: "127.0.0.1".into(),
        port: addr.port(),
        addr,
    }
}

fn get() -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .uri("/hooks/x")
        .header(http::header::HOST, "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// One call to `key` through `pool`: its status.
async fn call(pool: &Arc<Pool>, key: Key) -> u16 {
    let connection = send::connect(Some(pool), key, None)
        .await
        .map_err(|e| e.0)
        .unwrap();
    let response = connection.send(get(), 1024).await.map_err(|e| e.0).unwrap();
    assert_eq!(response.body, b"ok");
    response.status
}

/// Waits until `pool` holds `n` idle connections (a connection is kept once it is ready).
async fn idle(pool: &Pool, n: usize) {
    for _ in 0..1000 {
        if pool.idle() == n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the pool holds {} idle connections, not {n}", pool.idle());
}

#[tokio::test]
async fn calls_to_the_same_address_reuse_one_connection() {
    let (addr, accepted) = server(After::KeepAlive).await;
    let pool = Arc::new(Pool::default());
    for _ in 0..5 {
        assert_eq!(call(&pool, key(addr)).await, 200);
        idle(&pool, 1).await;
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection for five calls"
    );
}

#[tokio::test]
async fn a_call_given_no_pool_opens_its_own_connection_and_keeps_none() {
    let (addr, accepted) = server(After::KeepAlive).await;
    let pool = Arc::new(Pool::default());
    call(&pool, key(addr)).await;
    idle(&pool, 1).await;
    // A route with `on_unknown = "fail"` passes no pool: the idle one is not taken.
    for n in 2..=3 {
        let connection = send::connect(None, key(addr), None)
            .await
            .map_err(|e| e.0)
            .unwrap();
        let response = connection.send(get(), 1024).await.map_err(|e| e.0).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(accepted.load(Ordering::SeqCst), n, "a new connection each");
    }
    assert_eq!(pool.idle(), 1, "nothing put back");
}

#[tokio::test]
async fn another_address_or_host_name_gets_its_own_connection() {
    let (addr, accepted) = server(After::KeepAlive).await;
    let pool = Arc::new(Pool::default());
    call(&pool, key(addr)).await;
    idle(&pool, 1).await;
    let named = Key {
        host: "localhost".into(),
        ..key(addr)
    };
    call(&pool, named.clone()).await;
    idle(&pool, 2).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "a host name is part of the key"
    );
    call(&pool, named).await;
    call(&pool, key(addr)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "each reused");
    // Another pool (another route) never gets this one's connections.
    call(&Arc::new(Pool::default()), key(addr)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_connection_the_server_closes_is_not_reused() {
    for after in [After::Close, After::Drop] {
        let (addr, accepted) = server(after).await;
        let pool = Arc::new(Pool::default());
        for n in 1..=3 {
            assert_eq!(call(&pool, key(addr)).await, 200, "call {n} answered");
            // Once this host saw the close, the next call opens a new connection. (A request
            // that goes out just as the server closes can fail, with any client.)
            for _ in 0..1000 {
                if pool.ready_idle() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(pool.ready_idle(), 0, "the close is seen");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            3,
            "a new connection per call"
        );
    }
}

#[tokio::test]
async fn the_pool_is_bounded_per_address() {
    let (addr, accepted) = server(After::KeepAlive).await;
    let pool = Arc::new(Pool::default());
    let many = super::MAX_IDLE_PER_KEY + 3;
    let connections: Vec<_> = futures_join(&pool, key(addr), many).await;
    for connection in connections {
        connection.send(get(), 1024).await.map_err(|e| e.0).unwrap();
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        many,
        "each answered on its own"
    );
    idle(&pool, super::MAX_IDLE_PER_KEY).await;
}

/// `n` connections to `key` at once (none idle in between: each a new one).
async fn futures_join(pool: &Arc<Pool>, key: Key, n: usize) -> Vec<send::Connection> {
    let mut connections = Vec::new();
    for _ in 0..n {
        let connection = send::connect(Some(pool), key.clone(), None).await;
        connections.push(connection.map_err(|e| e.0).unwrap());
    }
    connections
}
