//! Ephemeral consumers in the host's set (issue 47): only on the streams a host watches.

use std::time::Duration;

use dedup_host_tests::harness::{wait_for, DEAD, OUTPUTS, UPPER_ROUTE};

use super::{connect_as, restricted, setup_as_operator, violations};

/// The host's set creates ephemeral consumers only on the streams it watches (the claims
/// bucket's markers, the component store): one on the source, dead-letter or output stream
/// could have the stream delivered to any subject (the server checks no permission on a
/// consumer's delivery subject), and is refused to the host's user.
#[tokio::test]
async fn the_host_role_is_refused_an_ephemeral_consumer_outside_its_set() {
    use async_nats::jetstream::consumer::push::OrderedConfig;
    let (env, text) = restricted(UPPER_ROUTE, false, None).await;
    setup_as_operator(&env, &text);
    let host = async_nats::jetstream::new(connect_as(&env, "host", "_INBOX_orders").await);
    let ordered = || OrderedConfig {
        deliver_subject: "_INBOX_orders.spy".into(),
        ..Default::default()
    };
    let claims = host
        .get_stream("KV_claims")
        .await
        .expect("the host reads the claims");
    claims
        .create_consumer(ordered())
        .await
        .expect("the host watches the claims bucket");
    for stream in ["EVENTS", DEAD, OUTPUTS] {
        let s = host.get_stream(stream).await.expect("the host reads it");
        assert!(s.create_consumer(ordered()).await.is_err(), "{stream}");
        let subject = format!("\"$JS.API.CONSUMER.CREATE.{stream}\"");
        wait_for(
            Duration::from_secs(30),
            &format!("the refusal of {subject} logged"),
            || async {
                violations(&env)
                    .iter()
                    .any(|l| l.contains("Publish Violation") && l.contains(&subject))
                    .then_some(())
            },
        )
        .await;
    }
}
