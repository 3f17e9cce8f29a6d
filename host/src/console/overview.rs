//! The overview: every route with its versions and last 15 minutes, every host (a route's
//! own page is [`super::route_page`]). The numbers and sparklines come from
//! [`super::window`]; `/api/overview` serves them as JSON, which the page's script reads every
//! few seconds to update them in place.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use maud::{html, Markup};
use serde::Serialize;

use super::html::{self, shown, when};
use super::window::{HostView, RouteView};
use super::{maud_response, Failure, Reader, Shared};
use crate::candidate::spec::{Mode, Spec, State as CandidateState};
use crate::components::status::{self, HostStatus};
use crate::config::RouteConfig;

/// The outcomes the tables show in columns of their own, in order.
pub const OUTCOMES: [&str; 5] = [
    "processed",
    "duplicate",
    "retried",
    "dead_lettered",
    "error",
];
/// The outcomes summed in the tables' "other" column (each is on the route's page).
pub const OTHER: [&str; 3] = ["busy", "lost_claim", "coalesced"];
/// The outcomes drawn as charts.
const CHARTED: [&str; 3] = ["processed", "retried", "dead_lettered"];

/// What `/api/overview` answers.
#[derive(Debug, Serialize)]
pub struct Overview {
    /// The hosts seen in the last 15 minutes.
    pub hosts: Vec<HostView>,
    /// Each route's numbers over the window.
    pub routes: BTreeMap<String, RouteView>,
}

/// One route's versions: what is deployed, since when, who serves what.
pub(super) struct Versions {
    live: Option<(String, Option<u64>)>,
    file: Option<String>,
    candidate: Option<Spec>,
    hosts: Vec<(String, Option<String>, Option<String>)>,
}

pub(super) async fn versions(
    console: &Shared,
    statuses: &[HostStatus],
) -> BTreeMap<String, Versions> {
    // Read only: a console never creates a deployment's buckets.
    let bucket = console
        .js
        .get_object_store(&console.config.components.bucket)
        .await
        .ok();
    let mut out = BTreeMap::new();
    for r in &console.config.routes {
        let file = console
            .config
            .component_file(r)
            .map(|p| p.display().to_string());
        let (live, candidate) = match (&bucket, &file) {
            (Some(b), None) => (
                crate::components::store::live_version(b, &r.name).await,
                crate::candidate::store::current(b, &r.name)
                    .await
                    .ok()
                    .flatten(),
            ),
            _ => (None, None),
        };
        let hosts = statuses
            .iter()
            .filter_map(|h| {
                let s = h.routes.get(&r.name)?;
                let why = s.refused.clone().or_else(|| s.contract_refused.clone());
                Some((h.instance_id.clone(), s.digest.clone(), why))
            })
            .collect();
        out.insert(
            r.name.clone(),
            Versions {
                live,
                file,
                candidate,
                hosts,
            },
        );
    }
    out
}

pub(super) async fn statuses(console: &Shared) -> Vec<HostStatus> {
    let bucket = &console.config.components.status_bucket;
    match console.js.get_key_value(bucket).await {
        Ok(store) => status::read_all(&store).await.unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// `GET /api/overview`.
pub async fn api(State(console): State<Shared>, _reader: Reader) -> Response {
    Json(Overview {
        hosts: console.window.hosts(),
        routes: console.window.routes(),
    })
    .into_response()
}

/// `GET /`.
pub async fn page(
    State(console): State<Shared>,
    Reader(viewer): Reader,
) -> Result<Response, Failure> {
    let statuses = statuses(&console).await;
    let versions = versions(&console, &statuses).await;
    let numbers = console.window.routes();
    let hosts = console.window.hosts();
    let body = html! {
        section {
            h2 { "Routes" }
            p.meta { "Counts over the last 15 minutes, summed over every host; they update every few seconds." }
            table #routes {
                (route_head())
                tbody {
                    @for r in &console.config.routes {
                        (route_row(r, versions.get(&r.name), numbers.get(&r.name)))
                    }
                }
            }
        }
        section {
            h2 { "Hosts" }
            (hosts_table(&hosts))
        }
    };
    Ok(maud_response(html::page("Overview", &viewer, body)))
}

/// The routes table's header row.
pub(super) fn route_head() -> Markup {
    html! {
        thead { tr {
            th { "route" } th { "live version" } th { "served by" } th { "candidate" }
            @for o in OUTCOMES { th { (o.replace('_', " ")) } }
            th title="busy, lost claim, coalesced" { "other" }
            th { "dedup hits" } th { "in flight" } th { "pending" } th title="messages per 15 s; the route's page has charts with axes" { "last 15 min, per 15 s" }
        } }
    }
}

fn live_cell(v: Option<&Versions>) -> Markup {
    html! {
        @match v {
            Some(Versions { file: Some(file), .. }) => {
                "file " code title=(shown(file)) { (shown(file.rsplit('/').next().unwrap_or(file))) }
            }
            Some(Versions { live: Some((digest, since)), .. }) => {
                code title=(digest) { (short(digest)) }
                @if let Some(since) = since { br; span.meta { "since " (when(*since)) } }
            }
            _ => { span.warn { "none deployed" } }
        }
    }
}

pub(super) fn route_row(r: &RouteConfig, v: Option<&Versions>, n: Option<&RouteView>) -> Markup {
    let empty = RouteView::default();
    let n = n.unwrap_or(&empty);
    let name = &r.name;
    let cell = |group: &str, key: &str, value: u64| {
        html! { td.num data-live=(format!("{name}|{group}|{key}")) { (value) } }
    };
    html! {
        tr data-route=(name) {
            td { a href=(format!("/routes/{}", html::encode(name))) { (name) } br; span.meta { (r.subject) } }
            td { (live_cell(v)) }
            td {
                @for (host, digest, why) in v.map(|v| v.hosts.as_slice()).unwrap_or_default() {
                    div title=(digest.clone().unwrap_or_default()) {
                        (host) ": " (digest.as_deref().map_or("not served".into(), short))
                        @if let Some(why) = why { " " span.warn { (shown(why)) } }
                    }
                }
            }
            td {
                @match v.and_then(|v| v.candidate.as_ref()) {
                    Some(c) => { a href="/deploys" { code title=(c.digest) { (short(&c.digest)) } } " " (candidate_words(c)) }
                    None => { "—" }
                }
            }
            @for o in OUTCOMES { (cell("outcomes", o, n.outcomes.get(o).copied().unwrap_or(0))) }
            (cell("other", "", OTHER.iter().map(|o| n.outcomes.get(*o).copied().unwrap_or(0)).sum()))
            td.num data-live=(format!("{name}|hits|all")) { (n.hits.values().sum::<u64>()) }
            (cell("gauge", "in_flight", n.in_flight))
            (cell("gauge", "pending", n.pending))
            td { @for o in CHARTED { div.spark { (chart(name, o, n.series.get(o))) span.meta { (o.replace('_', " ")) } } } }
        }
    }
}

/// A candidate in the words `deploy` takes (`shadow`, `canary 20% of keys`) and what became
/// of it: running since when, or rolled back when, by which host and why.
pub(super) fn candidate_words(c: &Spec) -> Markup {
    let mode = match c.mode {
        Mode::Shadow { secondary: false } => "shadow".to_string(),
        Mode::Shadow { secondary: true } => "shadow, live version run twice".to_string(),
        Mode::Canary { percent } => format!("canary {percent}% of keys"),
    };
    html! {
        span.candidate-mode { (mode) } ", "
        @match &c.state {
            CandidateState::Running => { "running since " (when(c.since_ms)) }
            CandidateState::RolledBack { reason, by, at_ms } => {
                span.warn { "rolled back" } " " (when(*at_ms)) " by " (shown(by)) ": " (shown(reason))
            }
        }
    }
}

/// A sparkline the page's script redraws from `/api/overview`.
fn chart(route: &str, outcome: &str, series: Option<&Vec<u64>>) -> Markup {
    let points = series.map(|s| polyline(s)).unwrap_or_default();
    html! {
        svg.chart viewBox="0 0 60 20" preserveAspectRatio="none" data-series=(format!("{route}|{outcome}")) {
            title { (outcome.replace('_', " ")) " per 15 s" }
            polyline class=(format!("line {outcome}")) points=(points) {}
        }
    }
}

/// The points of a sparkline 60 wide and 20 high, scaled to the series' maximum.
pub fn polyline(series: &[u64]) -> String {
    let max = series.iter().copied().max().unwrap_or(0).max(1) as f64;
    series
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{i},{:.1}", 20.0 - 19.0 * (*v as f64) / max))
        .collect::<Vec<_>>()
        .join(" ")
}

fn hosts_table(hosts: &[HostView]) -> Markup {
    html! {
        @if hosts.is_empty() {
            (html::notice("warn", "No host has reported in the last 15 minutes (hosts publish every 3 s while they run)."))
        } @else {
            table #hosts {
                thead { tr { th { "host" } th { "version" } th { "up" } th { "ready" } th { "why not ready" } } }
                tbody {
                    @for h in hosts {
                        tr data-host=(h.instance_id) {
                            td { (h.instance_id) }
                            td { (h.version) }
                            td { (humantime::format_duration(std::time::Duration::from_secs(h.uptime_s))) }
                            td {
                                @if h.gone { span.warn { "gone (last seen " (h.seen_s) " s ago)" } }
                                @else if h.ready { span.ok { "ready" } }
                                @else { span.warn { "not ready" } }
                            }
                            td { @for m in h.missing.iter().chain(&h.warnings) { div { (shown(m)) } } }
                        }
                    }
                }
            }
        }
    }
}

fn short(digest: &str) -> String {
    let d = digest.strip_prefix("sha256:").unwrap_or(digest);
    d.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes table's row of a route whose candidate is `mode`, in `state`.
    fn row(mode: Mode, state: CandidateState) -> String {
        let route: RouteConfig = toml::from_str("name = \"r\"\nsubject = \"in.>\"").unwrap();
        let versions = Versions {
            live: None,
            file: None,
            candidate: Some(Spec {
                digest: "sha256:0123456789abcdef".into(),
                mode,
                ignore: Vec::new(),
                margins: Default::default(),
                auto_promote: None,
                since_ms: 1,
                state,
            }),
            hosts: Vec::new(),
        };
        route_row(&route, Some(&versions), None).into_string()
    }

    #[test]
    fn a_candidate_is_shown_in_the_words_deploy_takes_and_its_texts_are_escaped() {
        let canary = row(Mode::Canary { percent: 20 }, CandidateState::Running);
        assert!(
            canary.contains(">canary 20% of keys</span>, running since "),
            "{canary}"
        );
        let shadow = row(Mode::Shadow { secondary: false }, CandidateState::Running);
        assert!(
            shadow.contains(">shadow</span>, running since "),
            "{shadow}"
        );

        let rolled = row(
            Mode::Canary { percent: 5 },
            CandidateState::RolledBack {
                reason: "<script>alert(1)</script> errors 3% over live".into(),
                by: "host-<b>".into(),
                at_ms: 2,
            },
        );
        assert!(rolled.contains(">rolled back</span>"), "{rolled}");
        assert!(
            rolled.contains(
                "by host-&lt;b&gt;: &lt;script&gt;alert(1)&lt;/script&gt; errors 3% over live"
            ),
            "{rolled}"
        );
        for debug in ["rolledback", "reason:", "at_ms"] {
            assert!(!rolled.contains(debug), "Rust's Debug form: {rolled}");
        }
        assert!(!rolled.contains("<script>"), "{rolled}");
    }
}
