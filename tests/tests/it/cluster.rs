//! Hosts on a 3-node cluster: every stream and bucket at the configured replicas, and a host
//! given every node's URL starts and serves while the first node is down.

use std::time::Duration;

use dedup_host_tests::harness::{TestEnv, Timing, BUCKET, DEAD, OUTPUTS, SOURCE, UPPER_ROUTE};

const ROUTES: &str = UPPER_ROUTE;

async fn replicas(env: &TestEnv, stream: &str) -> usize {
    let mut s = env.js.get_stream(stream).await.unwrap();
    s.info().await.unwrap().config.num_replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_every_url_serves_while_the_first_node_is_down() {
    let mut env = TestEnv::start_cluster().await;
    let timing = Timing::default();
    // Set-up while every node is up: everything at three replicas.
    let host = env.host(&timing, ROUTES, "setup").await;
    for stream in [
        SOURCE,
        DEAD,
        OUTPUTS,
        &format!("KV_{BUCKET}"),
        "KV_dedup-hosts-EVENTS",
        "KV_dedup-contracts-EVENTS",
    ] {
        assert_eq!(replicas(&env, stream).await, 3, "stream `{stream}`");
    }
    host.shutdown().await.unwrap();

    env.servers.nodes[0].kill();
    let mut child = env.host_process(&timing, ROUTES, "survivor").await;
    for i in 0..20 {
        env.publish(&format!("in.upper.m{i}"), &format!("m{i}"), &[], "abc")
            .await;
    }
    let keys: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("upper", &keys, Duration::from_secs(60))
        .await;
    assert_eq!(env.messages(OUTPUTS).await.len(), 20);
    let _ = child.kill();
    let _ = child.wait();
}
