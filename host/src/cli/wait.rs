//! `--wait DURATION` of `deploy`, `promote` and `abort`: waits until every live host reports
//! (in the status bucket) that it serves what was just stored, so a script or a pipeline can go
//! on once the change is in effect everywhere.

use std::time::{Duration, Instant};

use crate::components::status::{self, RouteStatus};
use crate::config::Config;

/// A host whose status is older than this is taken for gone (it refreshes every 10 s).
const LIVE_WITHIN: Duration = Duration::from_secs(25);

/// Waits at most `wait` until every live host serving `route` has a status that `check`
/// accepts; `what` names what they must have (`candidate sha256:…`, `no candidate`). Names the hosts still behind.
/// Returns the line that says so, for the caller to print its own way (a watch's stdout may
/// have been closed).
pub async fn every_host(
    js: &async_nats::jetstream::Context,
    config: &Config,
    route: &str,
    wait: Duration,
    what: &str,
    check: impl Fn(&RouteStatus) -> bool,
) -> anyhow::Result<String> {
    let kv = status::open(js, config).await?;
    let started = Instant::now();
    loop {
        let now = crate::claim::record::now_ms();
        let hosts = status::read_all(&kv).await?;
        let live: Vec<(&str, &RouteStatus)> = hosts
            .iter()
            .filter(|h| now.saturating_sub(h.updated_ms) < LIVE_WITHIN.as_millis() as u64)
            .filter_map(|h| Some((h.instance_id.as_str(), h.routes.get(route)?)))
            .collect();
        let behind: Vec<&str> = live
            .iter()
            .filter(|(_, s)| !check(s))
            .map(|(host, _)| *host)
            .collect();
        if behind.is_empty() {
            return Ok(format!(
                "route `{route}`: all {} live host(s) have {what}",
                live.len()
            ));
        }
        if started.elapsed() >= wait {
            anyhow::bail!(
                "after {wait:?}, host(s) {behind:?} do not have {what} yet: `dedup-host routes` shows what each serves and why a version was refused"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
