//! Following route contracts within the host's set (issue 47): a route whose contract the
//! host's user may not follow (a reload added it before the set was re-printed) leaves the
//! other routes' contracts followed.

use std::path::Path;
use std::time::Duration;

use dedup_host::components::status;
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host_tests::harness::wait_for;

use super::{as_user, restricted, setup_as_operator};

/// Two routes: `later` is the one the host's user may not follow.
const TWO_ROUTES: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]

[[routes]]
name = "later"
subject = "in.later.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.later.*.done"]
"#;

/// The host follows `upper`'s contract though the server refuses it `later`'s: a change of
/// `upper`'s record under the running host is seen, and the route refused for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_contract_the_host_may_not_follow_leaves_the_others_followed() {
    let bucket = "dedup-contracts-EVENTS";
    let missing = format!("$JS.API.CONSUMER.CREATE.KV_{bucket}.*.$KV.{bucket}.later");
    let (env, text) = restricted(TWO_ROUTES, false, Some(&missing)).await;
    setup_as_operator(&env, &text);
    let mut config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    config.host.instance_id = Some("h".into());
    assert_eq!(contract::bucket_name(&config), bucket);
    let host = dedup_host::serve::start(config.clone())
        .await
        .expect("host starts");

    // `upper`'s contract changes under the running host (the test's unrestricted user).
    let store = env.js.get_key_value(bucket).await.unwrap();
    let (mut record, _) = contract::read(&store, "upper").await.unwrap().unwrap();
    record.contract.forever = !record.contract.forever;
    let bytes = serde_json::to_vec(&record).unwrap();
    store.put("upper", bytes.into()).await.unwrap();

    wait_for(
        Duration::from_secs(60),
        "the host refusing `upper` for its changed contract",
        || async {
            let store = status::open(&env.js, &config).await.ok()?;
            let hosts = status::read_all(&store).await.ok()?;
            hosts
                .iter()
                .find(|h| h.instance_id == "h")
                .and_then(|h| h.routes.get("upper"))
                .and_then(|r| r.contract_refused.clone())
                .map(|_| ())
        },
    )
    .await;
    host.shutdown().await.unwrap();
}
