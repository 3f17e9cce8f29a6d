//! A real headless browser for the console's tests: Debian's Chromium driven through
//! ChromeDriver (WebDriver) with `fantoccini`. Each browser gets its own ChromeDriver on a
//! free port and its own empty profile.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};

use crate::nats::free_port;

/// A ChromeDriver process and the session it drives; both end when dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium (the flags this machine's closed network
    /// needs: no background networking, no component updates, no sync).
    pub async fn start() -> Self {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (installed by tests/setup.sh) starts");
        let profile = tempfile::tempdir().expect("profile dir");
        let options = serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1500,1000",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let mut last = String::new();
        // Chromedriver takes a while to listen on a busy machine: up to a minute.
        for _ in 0..300 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    return Self {
                        client,
                        driver,
                        _profile: profile,
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("no browser session from chromedriver: {last}");
    }

    /// Saves a PNG of the page as it is now.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}
