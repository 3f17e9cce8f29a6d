//! A route's own page: its row of the overview, charts of its last 15 minutes (messages per
//! second by outcome, guest time and the time the host added at p50 and p99, pending
//! messages, a latency histogram; drawn by [`super::charts`]), its config as TOML
//! ([`super::route_toml`]), recent dead letters and its deploy history.

use axum::extract::{Path, State};
use axum::response::Response;
use maud::{html, Markup};

use super::charts::{Histogram, LineChart, Series};
use super::html::{self, key_link, shown, when};
use super::overview::{self, OTHER, OUTCOMES};
use super::window::{Percentiles, RouteView, SPAN, STEP};
use super::{maud_response, route_toml, Failure, Reader, Shared};

/// Each outcome's colour in the charts.
fn color(outcome: &str) -> &'static str {
    match outcome {
        "processed" => "#2a9d4b",
        "duplicate" => "#5b7db1",
        "retried" => "#e08a00",
        "dead_lettered" => "#c0392b",
        "error" => "#8e44ad",
        "busy" => "#7f8c8d",
        "lost_claim" => "#d35400",
        _ => "#16a085",
    }
}

const GUEST: &str = "#1f77b4";
const ADDED: &str = "#e0731f";

fn points() -> usize {
    (SPAN.as_secs() / STEP.as_secs()) as usize
}

/// A series padded (or cut) to the window's points.
fn padded<T: Copy>(values: &[T], f: impl Fn(T) -> Option<f64>) -> Vec<Option<f64>> {
    let mut out: Vec<Option<f64>> = values.iter().map(|v| f(*v)).collect();
    out.resize(points(), None);
    out
}

fn percentiles(label: &str, color: &'static str, p: &Percentiles) -> Vec<Series> {
    vec![
        Series {
            label: format!("{label} p50"),
            color,
            dashed: false,
            points: padded(&p.p50, |v| v),
        },
        Series {
            label: format!("{label} p99"),
            color,
            dashed: true,
            points: padded(&p.p99, |v| v),
        },
    ]
}

/// The route's charts over the window.
pub fn charts(n: &RouteView) -> Markup {
    let step = STEP.as_secs();
    let rates: Vec<Series> = (OUTCOMES.iter().chain(OTHER.iter()))
        .filter_map(|o| {
            let series = n.series.get(*o);
            let counted = series.is_some_and(|s| s.iter().any(|v| *v > 0));
            (counted || *o == "processed").then(|| Series {
                label: o.replace('_', " "),
                color: color(o),
                dashed: false,
                points: padded(series.map_or(&[][..], |s| s), |v| {
                    Some(v as f64 / step as f64)
                }),
            })
        })
        .collect();
    let rate = LineChart {
        id: "chart-rate",
        title: "Messages per second by outcome".into(),
        unit: "msg/s",
        step_s: step,
        series: rates,
    };
    let guest = LineChart {
        id: "chart-guest",
        title: "Guest time per message".into(),
        unit: "ms",
        step_s: step,
        series: percentiles("guest", GUEST, &n.guest_ms),
    };
    let added = LineChart {
        id: "chart-added",
        title: "Latency the host added (handling minus guest time)".into(),
        unit: "ms",
        step_s: step,
        series: percentiles("added", ADDED, &n.added_ms),
    };
    let pending = LineChart {
        id: "chart-pending",
        title: "Pending (not yet delivered by the consumer)".into(),
        unit: "messages",
        step_s: step,
        series: vec![Series {
            label: "pending".into(),
            color: "#555",
            dashed: false,
            points: padded(&n.pending_series, |v| Some(v as f64)),
        }],
    };
    let histogram = Histogram {
        id: "chart-histogram",
        title: "Latency histogram (last 15 min)".into(),
        series: vec![
            ("guest time".into(), GUEST, n.guest_histogram.clone()),
            ("added by the host".into(), ADDED, n.added_histogram.clone()),
        ],
    };
    html! {
        div.charts {
            (rate.render()) (guest.render()) (added.render()) (pending.render()) (histogram.render())
        }
    }
}

/// `GET /routes/{name}`.
pub async fn page(
    State(console): State<Shared>,
    Path(name): Path<String>,
    Reader(viewer): Reader,
) -> Result<Response, Failure> {
    let Some(r) = console.config.routes.iter().find(|r| r.name == name) else {
        return Err(anyhow::anyhow!("no route `{name}` in this console's config").into());
    };
    let statuses = overview::statuses(&console).await;
    let versions = overview::versions(&console, &statuses).await;
    let numbers = console.window.routes();
    let selection = crate::ops::letters::Selection {
        route: Some(name.clone()),
        ..Default::default()
    };
    let mut letters = crate::ops::letters::list(&console.js, &console.config, &selection).await?;
    letters.reverse();
    letters.truncate(20);
    let history: Vec<_> = crate::activity::list(&console.js, &console.config, 1000)
        .await?
        .into_iter()
        .filter(|e| e.route == name && e.is_deploy())
        .take(50)
        .collect();
    let n = numbers.get(&name).cloned().unwrap_or_default();
    let config = route_toml::lines(r, &console.config.host);
    let body = html! {
        table #routes {
            (overview::route_head())
            tbody { (overview::route_row(r, versions.get(&name), Some(&n))) }
        }
        h2 { "Last 15 minutes" }
        p.meta { "Summed over every host; the charts redraw every few seconds (without JavaScript, reload the page for newer points)." }
        div #live-charts data-src=(format!("/routes/{}/charts", html::encode(&name))) { (charts(&n)) }
        h2 { "Messages by outcome (15 min)" }
        table { tbody { @for (outcome, count) in &n.outcomes { tr { td { (outcome.replace('_', " ")) } td.num { (count) } } } } }
        h2 { "Dedup hits by layer (15 min)" }
        table { tbody { @for (layer, count) in &n.hits { tr { td { (layer) } td.num { (count) } } } } }
        p { "outputs published: " (n.outputs) ", unacknowledged: " (n.ack_pending) ", free guest slots: " (n.free_slots) }
        h2 { "Config" }
        p.meta { "As written in the config file; values equal to the default are marked, unset ones show the value in effect. The guest's config values are not shown." }
        pre.toml #config {
            @for line in &config {
                span class=(if line.default { "line default" } else { "line" }) { (line.text) } "\n"
            }
        }
        h2 { "Recent dead letters" }
        @if letters.is_empty() { p { "None." } } @else {
            table { thead { tr { th { "letter" } th { "stored" } th { "key" } th { "reason" } } }
                tbody { @for l in &letters { tr {
                    td { a href=(format!("/letters/{}", l.sequence)) { (l.sequence) } }
                    td { (when(l.time_ms)) }
                    td { (key_link(&l.route, &l.key)) }
                    td { (shown(&l.reason)) }
                } } } }
            p { a href=(format!("/letters?route={}", html::encode(&name))) { "all of this route's dead letters" } }
        }
        h2 { "Deploy history" }
        @if history.is_empty() { p { "No deploys recorded yet." } } @else {
            table { thead { tr { th { "when" } th { "who" } th { "what" } th { "version" } th { "result" } } }
                tbody { @for e in &history { tr {
                    td { (when(e.at_ms)) } td { (shown(&e.who)) } td { (e.action) } td { (shown(&e.target)) } td { (shown(&e.result)) }
                } } } }
        }
    };
    Ok(maud_response(html::page(
        &format!("Route {name}"),
        &viewer,
        body,
    )))
}

/// `GET /routes/{name}/charts`: the route's charts alone, drawn on the server as on its
/// page; the page's script fetches them every few seconds to redraw them in place.
pub async fn live_charts(
    State(console): State<Shared>,
    Path(name): Path<String>,
    Reader(_viewer): Reader,
) -> Result<Response, Failure> {
    if !console.config.routes.iter().any(|r| r.name == name) {
        return Err(anyhow::anyhow!("no route `{name}` in this console's config").into());
    }
    let n = console
        .window
        .routes()
        .get(&name)
        .cloned()
        .unwrap_or_default();
    Ok(maud_response(charts(&n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_with_no_numbers_yet_still_draws_every_chart() {
        let out = charts(&RouteView::default()).into_string();
        for id in [
            "chart-rate",
            "chart-guest",
            "chart-added",
            "chart-pending",
            "chart-histogram",
        ] {
            assert!(out.contains(&format!("id=\"{id}\"")), "{id}");
        }
        assert!(out.contains(">msg/s</text>") && out.contains(">ms</text>"));
    }
}
