//! A key's story, the one `dedup-host inspect` tells ([`crate::ops::story`]): reached by the
//! search box (a key, or a source stream sequence) and by every link on a key.

use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;

use super::html::{self, shown, when};
use super::{maud_response, Failure, Reader, Shared};
use crate::ops::story::{self, Story, Target};

/// The search.
#[derive(Debug, Default, Deserialize)]
pub struct Search {
    /// A key, or a source stream sequence (digits).
    #[serde(default)]
    pub q: String,
    /// Only this route (all routes when absent).
    #[serde(default)]
    pub route: Option<String>,
}

/// `GET /keys?q=..&route=..`.
pub async fn page(
    State(console): State<Shared>,
    Reader(viewer): Reader,
    Query(search): Query<Search>,
) -> Result<Response, Failure> {
    let q = search.q.trim();
    let routes: Vec<&str> = console
        .config
        .routes
        .iter()
        .map(|r| r.name.as_str())
        .filter(|r| {
            search
                .route
                .as_deref()
                .is_none_or(|only| only.is_empty() || only == *r)
        })
        .collect();
    let mut stories = Vec::new();
    let mut notes = Vec::new();
    if !q.is_empty() {
        for route in routes {
            // Digits may be a sequence or a key: both are looked up.
            let mut targets = vec![Target::Key(q.to_string())];
            if let Ok(sequence) = q.parse::<u64>() {
                targets.push(Target::Sequence(sequence));
            }
            for target in targets {
                match story::tell(&console.js, &console.config, route, target).await {
                    Ok(s) if known(&s) => {
                        if !stories.iter().any(|o: &Story| o.claim_key == s.claim_key) {
                            stories.push(s);
                        }
                    }
                    Ok(_) => {}
                    // A sequence on another route's subject, or gone: said once, quietly.
                    Err(e) => notes.push(format!("{route}: {e:#}")),
                }
            }
        }
    }
    let body = html! {
        form.search-big method="get" action="/keys" {
            input type="search" name="q" value=(q) placeholder="key or stream sequence";
            select name="route" {
                option value="" { "every route" }
                @for r in &console.config.routes {
                    option value=(r.name) selected[search.route.as_deref() == Some(r.name.as_str())] { (r.name) }
                }
            }
            button type="submit" { "Find" }
        }
        @if !q.is_empty() && stories.is_empty() {
            (html::notice("warn", &format!("No route knows key or sequence `{}`: no claim record, no dead letter and no source message carries it.", shown(q))))
            @for n in &notes { p.meta { (shown(n)) } }
        }
        @for s in &stories { (story_view(s)) }
    };
    let title = if q.is_empty() {
        "Find a key".to_string()
    } else {
        format!("Key {}", shown(q))
    };
    Ok(maud_response(html::page(&title, &viewer, body)))
}

fn known(s: &Story) -> bool {
    s.claim.is_some() || !s.dead_letters.is_empty() || !s.source_sequences.is_empty()
}

fn story_view(s: &Story) -> Markup {
    html! {
        article.story data-claim-key=(s.claim_key) {
            h2 { "Route " (s.route) ": " span.key { (shown(&s.key)) } }
            p.verdict { (shown(&s.verdict)) }
            table.config { tbody {
                tr { th { "claim key" } td { code { (shown(&s.claim_key)) } } }
                @if let Some(c) = &s.claim {
                    tr { th { "state" } td { (format!("{:?}", c.state).to_lowercase()) @if c.permanent { " (permanent)" } } }
                    tr { th { "revision" } td { (s.revision.unwrap_or(0)) } }
                    tr { th { "owner" } td { (shown(&c.owner)) } }
                    tr { th { "attempt" } td { (c.attempt) } }
                    // Only a key in progress has a lease; a settled one's expiry means nothing.
                    @if c.state == crate::claim::ClaimState::InProgress {
                        tr { th { "fencing token" } td { (c.fencing_token.map_or("—".into(), |t| t.to_string())) } }
                        tr { th { "lease expires" } td { (when(c.lease_expires_ms)) } }
                    }
                    tr { th { "version" } td { code { (c.digest) } } }
                    tr { th { "reason" } td { (shown(c.reason.as_deref().unwrap_or("—"))) } }
                    tr { th { "created" } td { (when(c.created_ms)) } }
                    tr { th { "updated" } td { (when(c.updated_ms)) } }
                    @if let Some(at) = c.retry_at_ms { tr { th { "retry at" } td { (when(at)) } } }
                } @else {
                    tr { th { "claim record" } td { "none" } }
                }
            } }
            h3 { "Outputs" }
            @if s.outputs.is_empty() { p { "None recorded." } } @else {
                table { thead { tr { th { "output id" } th { "stream" } th { "sequence" } th { "present" } } }
                    tbody { @for o in &s.outputs { tr {
                        td { code { (shown(&o.id)) } } td { (o.stream) } td.num { (o.sequence) }
                        td { @if o.present { span.ok { "present" } } @else { span.warn { "missing" } } }
                    } } } }
            }
            h3 { "Outbound calls" }
            @if s.calls.is_empty() { p { "None journaled." } } @else {
                table.calls { thead { tr { th { "call" } th { "method" } th { "URL" } th { "status" } th { "when" } th { "how" } th { "idempotency key" } } }
                    tbody { @for c in &s.calls { tr {
                        td.num { (c.index) } td { (shown(&c.method)) } td { code { (shown(&c.url)) } }
                        td.num { (c.status.map_or("—".into(), |s| s.to_string())) }
                        td { (when(c.at_ms)) }
                        td { @if c.how == "pending" { span.warn { "pending (outcome unknown)" } } @else { (c.how) } }
                        td { code { (shown(&c.idempotency_key)) } }
                    } } } }
            }
            h3 { "Deliveries (source stream sequences)" }
            p { @if s.source_sequences.is_empty() { "none left in the source stream" } @else {
                (s.source_sequences.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
            } }
            h3 { "Dead letters" }
            @if s.dead_letters.is_empty() { p { "None." } } @else {
                table { thead { tr { th { "letter" } th { "stored" } th { "attempt" } th { "reason" } } }
                    tbody { @for l in &s.dead_letters { tr {
                        td { a href=(format!("/letters/{}", l.sequence)) { (l.sequence) } }
                        td { (when(l.time_ms)) } td.num { (l.attempt) } td { (shown(&l.reason)) }
                    } } } }
            }
        }
    }
}
