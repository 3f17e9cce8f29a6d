//! Connecting with the configured authentication against a server that requires it.

use std::path::Path;

use dedup_host::config::Config;
use dedup_host::serve;
use dedup_host_tests::guests::guest;
use dedup_host_tests::nats::NatsServer;

fn config(url: &str, auth: &str) -> Config {
    let text = format!(
        r#"
[nats]
urls = ["{url}"]
{auth}
[source]
subjects = ["a.*"]
[[routes]]
name = "a"
subject = "a.*"
component = "{component}"
"#,
        component = guest("uppercase").display()
    );
    Config::parse(&text, Path::new("auth.toml"), ".".into()).expect("valid")
}

#[tokio::test]
async fn token_and_user_password_authentication_connect_and_wrong_ones_are_explained() {
    let server = NatsServer::start_with(&["--auth", "s3cret"]);
    let host = serve::start(config(&server.url(), "token = \"s3cret\""))
        .await
        .expect("token accepted");
    host.shutdown().await.unwrap();
    let err = serve::start(config(&server.url(), "token = \"wrong\""))
        .await
        .err()
        .expect("wrong token refused");
    assert!(format!("{err:#}").contains("nats.urls"), "{err:#}");

    let server = NatsServer::start_with(&["--user", "svc", "--pass", "pw"]);
    let host = serve::start(config(&server.url(), "user = \"svc\"\npassword = \"pw\""))
        .await
        .expect("user accepted");
    host.shutdown().await.unwrap();
}
