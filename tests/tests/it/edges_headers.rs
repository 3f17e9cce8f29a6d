//! A source message whose header block the client cannot parse (not UTF-8, a line without
//! `:`; nats-server stores what any producer sends) is that message's problem alone: it is
//! dead-lettered on its first delivery with the reason and its raw header bytes, and the
//! host's connection, with every other route's heartbeats and acks, stays up.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use base64::Engine as _;
use dedup_host::pipeline::effects::headers;
use dedup_host_tests::harness::{
    http_get, wait_for, TestEnv, Timing, DEAD, OUTPUTS, SOURCE, UPPER_ROUTE,
};
use dedup_host_tests::nats::{free_port, NatsCluster, NatsServer};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Stores `header_block` and `payload` on `subject` over a raw connection (`HPUB`), as a
/// producer in any language can; returns once the server answered a `PING` after it.
pub(super) async fn publish_raw(port: u16, subject: &str, header_block: &[u8], payload: &[u8]) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to nats-server");
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    read.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("INFO "), "{line}");
    let mut op =
        b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\n"
            .to_vec();
    let total = header_block.len() + payload.len();
    op.extend_from_slice(format!("HPUB {subject} {} {total}\r\n", header_block.len()).as_bytes());
    op.extend_from_slice(header_block);
    op.extend_from_slice(payload);
    op.extend_from_slice(b"\r\nPING\r\n");
    write.write_all(&op).await.unwrap();
    loop {
        line.clear();
        read.read_line(&mut line).await.unwrap();
        assert!(
            !line.starts_with("-ERR"),
            "the server refused the HPUB: {line}"
        );
        if line.starts_with("PONG") {
            return;
        }
    }
}

/// The client ids of the connections named `name`, from the server's `/connz`.
pub(super) fn connection_ids(monitor: SocketAddr, name: &str) -> BTreeSet<u64> {
    let (status, body) = http_get(monitor, "/connz?limit=1000").expect("/connz answers");
    assert_eq!(status, 200, "{body}");
    let connz: serde_json::Value = serde_json::from_str(&body).expect("/connz is JSON");
    connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == name)
        .filter_map(|c| c["cid"].as_u64())
        .collect()
}

/// A test environment whose server has its monitoring port open (to read its connections),
/// and that port's address.
pub(super) async fn monitored_env() -> (TestEnv, SocketAddr) {
    let monitor_port = free_port();
    let server = NatsServer::start_with(&["-m", &monitor_port.to_string()]);
    let env = TestEnv {
        js: async_nats::jetstream::new(server.connect().await),
        servers: NatsCluster {
            nodes: vec![server],
        },
        dir: tempfile::tempdir().unwrap(),
        fenced_outputs: false,
    };
    let monitor = SocketAddr::from(([127, 0, 0, 1], monitor_port));
    (env, monitor)
}

/// No consumer of the source stream ever redelivered a message.
async fn assert_nothing_redelivered(env: &TestEnv) {
    let stream = env.js.get_stream(SOURCE).await.unwrap();
    let mut consumers = stream.consumers();
    while let Some(info) = consumers.next().await {
        let info = info.unwrap();
        assert_eq!(info.num_redelivered, 0, "{info:?}");
    }
}

fn header(letter: &StreamMessage, name: &str) -> String {
    letter
        .headers
        .get(name)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_header_block_is_dead_lettered_at_once_and_the_connection_stays_up() {
    let (env, monitor) = monitored_env().await;
    // A server max deliver that only redeliveries would reach: the letters must not need it.
    let mut config = env.config(&Timing::default(), UPPER_ROUTE);
    config.source.server_max_deliver = 50;
    config.host.instance_id = Some("h".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    let name = "dedup-host h";

    env.publish("in.upper.before", "before", &[], "a").await;
    env.wait_completed("upper", &["before"], Duration::from_secs(30))
        .await;
    let connections = connection_ids(monitor, name);
    assert!(!connections.is_empty(), "the host is connected as `{name}`");

    let not_utf8: &[u8] = b"NATS/1.0\r\nNats-Msg-Id: not-utf8\r\nX-Bad: \xff\xfe\r\n\r\n";
    let no_colon: &[u8] = b"NATS/1.0\r\nNats-Msg-Id: no-colon\r\nno colon here\r\n\r\n";
    let port = env.server().port();
    publish_raw(port, "in.upper.not-utf8", not_utf8, b"poison-1").await;
    publish_raw(port, "in.upper.no-colon", no_colon, b"poison-2").await;
    env.publish("in.upper.after", "after", &[], "b").await;

    let letters = wait_for(Duration::from_secs(30), "both dead letters", || async {
        let letters = env.messages(DEAD).await;
        (letters.len() >= 2).then_some(letters)
    })
    .await;
    for (block, payload, why, route) in [
        (
            not_utf8,
            &b"poison-1"[..],
            "header isn't valid utf-8",
            "upper",
        ),
        (
            no_colon,
            &b"poison-2"[..],
            "header line has no `:`",
            "upper",
        ),
    ] {
        let letter = letters
            .iter()
            .find(|l| &l.payload[..] == payload)
            .unwrap_or_else(|| panic!("a letter for {payload:?}: {letters:?}"));
        let reason = header(letter, headers::REASON);
        assert!(
            reason.contains("invalid header block") && reason.contains(why),
            "{reason}"
        );
        assert_eq!(header(letter, headers::ATTEMPT), "0", "no guest ran it");
        assert_eq!(header(letter, headers::ROUTE), route);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(header(letter, headers::RAW_HEADERS))
            .expect("the raw block is base64");
        assert_eq!(raw, block, "the raw header block, byte for byte");
    }
    // The message after them completes, nothing is pending or unacknowledged (each was
    // termed on its first delivery), and nothing was ever redelivered.
    env.wait_completed("upper", &["after"], Duration::from_secs(30))
        .await;
    env.wait_drained(Duration::from_secs(30)).await;
    assert_nothing_redelivered(&env).await;
    assert_eq!(env.messages(DEAD).await.len(), 2, "one letter each");
    assert_eq!(env.messages(OUTPUTS).await.len(), 2, "before and after");
    // The same connections as before: none was dropped and re-made.
    assert_eq!(connection_ids(monitor, name), connections);
    host.shutdown().await.unwrap();
}

/// A producer may write any status line into a stored message's header block (`NATS/1.0 409
/// Consumer Deleted`, `408`, `503`): the pull must not take it for the server's word about the
/// pull (ending it, or dropping the message unacked). It runs like any other message, on the
/// same connection. (Guards the client and server as they are: a review feared the pull
/// would end; with nats-server 2.15 and async-nats 0.51 it does not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_line_written_by_a_producer_is_an_ordinary_message() {
    let (env, monitor) = monitored_env().await;
    let mut config = env.config(&Timing::default(), UPPER_ROUTE);
    config.host.instance_id = Some("s".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    let name = "dedup-host s";
    env.publish("in.upper.before", "before", &[], "a").await;
    env.wait_completed("upper", &["before"], Duration::from_secs(30))
        .await;
    let connections = connection_ids(monitor, name);

    let port = env.server().port();
    let blocks: [(&str, &[u8]); 3] = [
        (
            "deleted",
            b"NATS/1.0 409 Consumer Deleted\r\nNats-Msg-Id: deleted\r\n\r\n",
        ),
        (
            "timeout",
            b"NATS/1.0 408 Request Timeout\r\nNats-Msg-Id: timeout\r\n\r\n",
        ),
        (
            "no-responders",
            b"NATS/1.0 503\r\nNats-Msg-Id: no-responders\r\n\r\n",
        ),
    ];
    for (key, block) in blocks {
        publish_raw(port, &format!("in.upper.{key}"), block, key.as_bytes()).await;
    }
    env.publish("in.upper.after", "after", &[], "b").await;
    env.wait_completed(
        "upper",
        &["deleted", "timeout", "no-responders", "after"],
        Duration::from_secs(60),
    )
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    assert_nothing_redelivered(&env).await;
    assert!(env.messages(DEAD).await.is_empty(), "no letters");
    assert_eq!(env.messages(OUTPUTS).await.len(), 5, "one output each");
    assert_eq!(connection_ids(monitor, name), connections);
    host.shutdown().await.unwrap();
}
