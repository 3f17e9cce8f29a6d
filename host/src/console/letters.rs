//! Dead letters: filter by route, reason text and time, page through them, see one whole, and
//! replay or purge one or every letter matching the filter. The replay and purge are
//! [`crate::ops::letters`]'s, the CLI's code, run in batches of [`BATCH`] with each letter's
//! result shown; each asks for confirmation with the count first and is recorded in
//! [`crate::activity`].

use std::net::SocketAddr;
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use super::html::{self, csrf, key_link, shown, when, Viewer};
use super::{maud_response, Failure, Reader, Shared};
use crate::activity::Entry;
use crate::ops::letters::{self, Action, Letter, Selection};

/// Letters replayed or purged per call of the shared code.
pub const BATCH: usize = 1000;
/// Letters per page.
const PAGE: usize = 50;

/// Which letters: the list's query and every action's form.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Filter {
    /// Only this route's (all when empty).
    #[serde(default)]
    pub route: String,
    /// Only letters whose reason contains this text (any case).
    #[serde(default)]
    pub reason: String,
    /// Stored at or after: a duration back from now (`1h`) or an RFC 3339 time.
    #[serde(default)]
    pub since: String,
    /// Stored before: the same forms.
    #[serde(default)]
    pub until: String,
    /// Only these letter sequences, comma-separated (all matching when empty).
    #[serde(default)]
    pub sequences: String,
    /// The page shown (from 0).
    #[serde(default)]
    pub page: usize,
}

/// An action's form: the filter, the CSRF value, and whether it was confirmed.
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    route: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    sequences: String,
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    confirmed: String,
}

impl ActionForm {
    fn filter(&self) -> Filter {
        Filter {
            route: self.route.clone(),
            reason: self.reason.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            sequences: self.sequences.clone(),
            page: 0,
        }
    }
}

fn time(text: &str, what: &str) -> anyhow::Result<Option<SystemTime>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(back) = humantime::parse_duration(text) {
        return Ok(Some(SystemTime::now() - back));
    }
    humantime::parse_rfc3339_weak(text).map(Some).map_err(|_| {
        anyhow::anyhow!("`{text}` ({what}) is neither a duration such as 1h nor a time such as 2026-11-25T10:00:00Z")
    })
}

impl Filter {
    fn selection(&self) -> anyhow::Result<Selection> {
        let sequences = self
            .sequences
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .map_err(|_| anyhow::anyhow!("`{s}` is not a letter sequence"))
            })
            .collect::<anyhow::Result<Vec<u64>>>()?;
        Ok(Selection {
            route: (!self.route.is_empty()).then(|| self.route.clone()),
            since: time(&self.since, "since")?,
            until: time(&self.until, "until")?,
            reason: (!self.reason.trim().is_empty()).then(|| self.reason.trim().to_string()),
            sequences,
        })
    }

    /// The filter in words, for confirmations and the activity log.
    fn describe(&self) -> String {
        self.selection()
            .map_or_else(|e| e.to_string(), |s| s.describe())
    }

    fn query(&self, page: usize) -> String {
        format!(
            "/letters?route={}&reason={}&since={}&until={}&page={page}",
            html::encode(&self.route),
            html::encode(&self.reason),
            html::encode(&self.since),
            html::encode(&self.until)
        )
    }

    fn hidden(&self) -> Markup {
        html! {
            input type="hidden" name="route" value=(self.route);
            input type="hidden" name="reason" value=(self.reason);
            input type="hidden" name="since" value=(self.since);
            input type="hidden" name="until" value=(self.until);
            input type="hidden" name="sequences" value=(self.sequences);
        }
    }
}

/// `GET /letters`.
pub async fn list(
    State(console): State<Shared>,
    Reader(viewer): Reader,
    Query(filter): Query<Filter>,
) -> Result<Response, Failure> {
    let mut matching = letters::list(&console.js, &console.config, &filter.selection()?).await?;
    matching.reverse();
    let pages = matching.len().div_ceil(PAGE).max(1);
    let page = filter.page.min(pages - 1);
    let shown_letters = matching.iter().skip(page * PAGE).take(PAGE);
    let body = html! {
        form.filter method="get" action="/letters" {
            label { "route " select name="route" {
                option value="" { "every route" }
                @for r in &console.config.routes {
                    option value=(r.name) selected[filter.route == r.name] { (r.name) }
                }
            } }
            label { "reason contains " input type="text" name="reason" value=(filter.reason); }
            label { "since " input type="text" name="since" value=(filter.since) placeholder="1h or 2026-11-25T10:00:00Z"; }
            label { "until " input type="text" name="until" value=(filter.until); }
            button type="submit" { "Filter" }
        }
        p #matching data-count=(matching.len()) { (matching.len()) " dead letter(s) match " (filter.describe()) "." }
        @if !matching.is_empty() {
            div.actions {
                form method="post" action="/letters/replay" {
                    (filter.hidden()) (csrf(&viewer))
                    button #replay-all type="submit" { "Replay all " (matching.len()) " matching…" }
                }
                form method="post" action="/letters/purge" {
                    (filter.hidden()) (csrf(&viewer))
                    button #purge-all type="submit" { "Purge the replayed among them…" }
                }
            }
            table #letters {
                thead { tr { th { "letter" } th { "stored" } th { "route" } th { "key" } th { "attempt" } th { "reason" } th { "subject" } } }
                tbody { @for l in shown_letters { (letter_row(l)) } }
            }
            p.pages {
                "page " (page + 1) " of " (pages) " "
                @if page > 0 { a href=(filter.query(page - 1)) { "← newer" } " " }
                @if page + 1 < pages { a href=(filter.query(page + 1)) { "older →" } }
            }
        }
    };
    Ok(maud_response(html::page("Dead letters", &viewer, body)))
}

fn letter_row(l: &Letter) -> Markup {
    html! {
        tr data-sequence=(l.sequence) {
            td { a href=(format!("/letters/{}", l.sequence)) { (l.sequence) } }
            td { (when(l.time_ms)) }
            td { (shown(&l.route)) }
            td { (key_link(&l.route, &l.key)) }
            td.num { (l.attempt) }
            td.reason { (shown(&l.reason)) }
            td { (shown(&l.subject)) }
        }
    }
}

/// `GET /letters/{sequence}`: one letter whole.
pub async fn one(
    State(console): State<Shared>,
    Reader(viewer): Reader,
    Path(sequence): Path<u64>,
) -> Result<Response, Failure> {
    let selection = Selection {
        sequences: vec![sequence],
        ..Default::default()
    };
    let found = letters::list(&console.js, &console.config, &selection).await?;
    let l = found.first().expect("list names every sequence asked for");
    let single = Filter {
        sequences: sequence.to_string(),
        ..Default::default()
    };
    let body = html! {
        table.config { tbody {
            tr { th { "stored" } td { (when(l.time_ms)) } }
            tr { th { "route" } td { (shown(&l.route)) } }
            tr { th { "key" } td { (key_link(&l.route, &l.key)) } }
            tr { th { "attempt" } td { (l.attempt) } }
            tr { th { "reason" } td.reason { (shown(&l.reason)) } }
            tr { th { "subject" } td { (shown(&l.subject)) } }
            tr { th { "source sequence" } td { (l.source_sequence.map_or("—".into(), |s| s.to_string())) } }
            @if let Some(size) = l.truncated { tr { th { "original size" } td { (size) " bytes (the letter holds the first part; a replay reads the source message)" } } }
        } }
        div.actions {
            form method="post" action="/letters/replay" { (single.hidden()) (csrf(&viewer)) button type="submit" { "Replay this letter…" } }
            form method="post" action="/letters/purge" { (single.hidden()) (csrf(&viewer)) button type="submit" { "Purge this letter…" } }
        }
        h2 { "Headers" }
        table.headers { tbody { @for (name, value) in l.headers() { tr { th { (shown(&name)) } td { (shown(&value)) } } } } }
        h2 { "Payload" }
        (html::payload(l.payload()))
    };
    Ok(maud_response(html::page(
        &format!("Dead letter {sequence}"),
        &viewer,
        body,
    )))
}

/// `POST /letters/replay` and `POST /letters/purge`.
pub async fn act(
    State(console): State<Shared>,
    Path(action): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Result<Response, Failure> {
    let action = match action.as_str() {
        "replay" => "replay",
        "purge" => "purge",
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    let who = match console.allow_change(&headers, form.csrf.as_deref()) {
        Ok(who) => who,
        Err(denied) => return Ok(denied.into_response()),
    };
    let viewer = console.viewer(Some(who.clone()));
    let filter = form.filter();
    let selection = filter.selection()?;
    // A replay takes the letters of routes renamed since, as the list shows them.
    let matching = match action {
        "replay" => letters::list_with_renamed(&console.js, &console.config, &selection).await?,
        _ => letters::list(&console.js, &console.config, &selection).await?,
    };
    let what = selection.describe();
    if form.confirmed != "yes" {
        return Ok(maud_response(confirm(
            &viewer,
            &filter,
            action,
            matching.len(),
            &what,
        )));
    }
    let mut actions: Vec<Action> = Vec::with_capacity(matching.len());
    let named = !selection.sequences.is_empty();
    // A write the console's NATS user may not make names the subject to grant: refusals
    // of this write's own connection only.
    let (js, refusals) = console.writer().await?;
    let started = std::time::Instant::now();
    for batch in matching.chunks(BATCH) {
        let batch = batch.to_vec();
        let config = &console.config;
        let done = match action {
            "replay" => {
                let (dry_run, force, fresh_effects) = (false, false, false);
                crate::ops::replay::replay_observed(
                    &js,
                    config,
                    batch,
                    dry_run,
                    force,
                    fresh_effects,
                    &refusals,
                )
                .await
            }
            _ => letters::purge(&js, config, batch, named, false).await,
        };
        actions.extend(done.map_err(|e| refusals.explain(e, started))?);
    }
    let summary = letters::summary(&actions);
    let mut entry = Entry::now(
        &format!("console {who}@{peer}"),
        action,
        &filter.route,
        what.clone(),
    );
    entry.count = actions.len() as u64;
    entry.result = summary.clone();
    crate::activity::record(&console.js, &console.config, &entry).await;
    let body = html! {
        p #summary { (action) " of " (what) ": " (summary) }
        table #results {
            thead { tr { th { "letter" } th { "route" } th { "key" } th { "result" } th { "detail" } } }
            tbody { @for a in &actions { tr data-sequence=(a.sequence) {
                td { (a.sequence) } td { (shown(&a.route)) } td { (key_link(&a.route, &a.key)) }
                td.result { (a.action) } td { (shown(&a.detail)) }
            } } }
        }
        p { a href="/letters" { "back to the dead letters" } " · " a href="/activity" { "activity" } }
    };
    Ok(maud_response(html::page(
        &format!("{action}: results"),
        &viewer,
        body,
    )))
}

fn confirm(viewer: &Viewer, filter: &Filter, action: &str, count: usize, what: &str) -> Markup {
    let body = html! {
        p #confirm data-count=(count) {
            (action) " " strong { (count) } " dead letter(s): " (what) "?"
        }
        @if action == "replay" {
            p.meta { "Each letter's key is reset and its message published again on its subject; a key that completed since is skipped." }
        } @else {
            p.meta { "Letters whose key has completed since (their replay ran) are deleted; the others are kept." }
        }
        form method="post" action=(format!("/letters/{action}")) {
            (filter.hidden()) (csrf(viewer))
            input type="hidden" name="confirmed" value="yes";
            button #confirm-button type="submit" { "Yes, " (action) " " (count) }
            " " a href="/letters" { "cancel" }
        }
    };
    html::page(&format!("Confirm {action}"), viewer, body)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_filter_reads_durations_times_and_sequences_and_says_what_it_selects() {
        let f = Filter {
            route: "r".into(),
            reason: " boom ".into(),
            since: "1h".into(),
            until: "2026-11-25T10:00:00Z".into(),
            sequences: "3, 5".into(),
            page: 0,
        };
        let s = f.selection().expect("valid");
        assert_eq!(s.sequences, vec![3, 5]);
        assert_eq!(s.reason.as_deref(), Some("boom"));
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let since = s.since.expect("since");
        assert!(
            since <= hour_ago + Duration::from_secs(5)
                && since >= hour_ago - Duration::from_secs(5)
        );
        assert!(f.describe().contains("reason contains \"boom\""));
        let bad = Filter {
            since: "yesterday-ish".into(),
            ..Default::default()
        };
        assert!(bad
            .selection()
            .unwrap_err()
            .to_string()
            .contains("yesterday-ish"));
    }
}
