//! The console's other pages: the audit (run from the page), deploys (candidates, their
//! differences and samples, promote and abort), the activity log, and the login and logout.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use super::html::{self, csrf, key_link, shown, when, Viewer};
use super::{maud_response, Failure, Reader, Shared};
use crate::activity::Entry;
use crate::candidate::record::{self, Sample};
use crate::candidate::store as candidates;
use crate::components::store;

/// The audit page's query, and its form (which runs it).
#[derive(Debug, Default, Deserialize)]
pub struct AuditQuery {
    /// Only source messages newer than this (`1h`).
    #[serde(default)]
    pub since: String,
    /// The CSRF value (the form's).
    #[serde(default)]
    pub csrf: Option<String>,
}

/// `GET /audit`: the page, which offers to run the audit (a GET never runs it: a link or an
/// image on another site could).
pub async fn audit(Reader(viewer): Reader, Query(q): Query<AuditQuery>) -> Response {
    maud_response(audit_page(&viewer, &q.since, None))
}

/// `POST /audit`: runs the audit (a logged-in form with its CSRF value: it reads every
/// stream and claim, which a foreign page must not make the console do).
pub async fn run_audit(
    State(console): State<Shared>,
    headers: HeaderMap,
    Form(q): Form<AuditQuery>,
) -> Result<Response, Failure> {
    let who = match console.allow_change(&headers, q.csrf.as_deref()) {
        Ok(who) => who,
        Err(denied) => return Ok(denied.into_response()),
    };
    let since = match q.since.trim() {
        "" => None,
        s => Some(
            std::time::SystemTime::now()
                - humantime::parse_duration(s)
                    .map_err(|e| anyhow::anyhow!("`{s}` is not a duration such as 1h: {e}"))?,
        ),
    };
    let report = crate::ops::audit::run(&console.js, &console.config, since).await?;
    let viewer = console.viewer(Some(who));
    Ok(maud_response(audit_page(&viewer, &q.since, Some(&report))))
}

fn audit_page(viewer: &Viewer, since: &str, report: Option<&crate::ops::audit::Report>) -> Markup {
    let body = html! {
        form.filter method="post" action="/audit" {
            (csrf(viewer))
            label { "messages newer than " input type="text" name="since" value=(since) placeholder="all, or 1h"; }
            button #run-audit type="submit" { "Run the audit" }
        }
        p.meta { "Reconciles the source stream, the claims, the outputs and the dead letters (read-only)." @if viewer.who.is_none() { " Running it needs a login." } }
        @if let Some(r) = report {
            table #audit-summary { tbody {
                tr { th { "messages" } td.num { (r.messages) } }
                tr { th { "keys" } td.num { (r.keys) } }
                tr { th { "completed" } td.num { (r.completed) } }
                tr { th { "dead-lettered" } td.num { (r.dead_lettered) } }
                tr { th { "pending" } td.num { (r.pending) } }
                tr { th { "duplicates" } td.num { (r.duplicates) } }
                tr { th { "outputs" } td.num { (r.outputs) } }
                tr { th { "pending calls" } td.num { (r.pending_calls) } }
                tr { th { "anomalies" } td.num #anomaly-count { (r.anomalies.len()) } }
            } }
            @if r.anomalies.is_empty() { (html::notice("ok", "No anomaly: every key is completed with its outputs, dead-lettered, or legitimately pending.")) }
            @else {
                table #anomalies { thead { tr { th { "class" } th { "key" } th { "detail" } } }
                    tbody { @for a in &r.anomalies { tr {
                        td { (a.class) }
                        td { (anomaly_key(&a.key)) }
                        td { (shown(&a.detail)) }
                    } } } }
            }
        }
    };
    html::page("Audit", viewer, body)
}

/// A readable claim key `<route>.k.<key>` links to its story; a hashed one is shown as text.
fn anomaly_key(claim_key: &str) -> Markup {
    let mut parts = claim_key.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(route), Some("k"), Some(key)) => key_link(route, key),
        _ => html! { code { (shown(claim_key)) } },
    }
}

/// `GET /deploys`.
pub async fn deploys(
    State(console): State<Shared>,
    Reader(viewer): Reader,
) -> Result<Response, Failure> {
    let Ok(bucket) = console
        .js
        .get_object_store(&console.config.components.bucket)
        .await
    else {
        let body = html! { p { "No component has been deployed to the object store (bucket `" (console.config.components.bucket) "` does not exist)." } };
        return Ok(maud_response(html::page("Deploys", &viewer, body)));
    };
    let mut sections = Vec::new();
    let mut findings = None;
    for r in &console.config.routes {
        if let Some(file) = console.config.component_file(r) {
            sections.push(html! { section { h2 { (r.name) } p.meta { "Served from the file " code { (file.display().to_string()) } ": its candidate is a file beside it on each host; use `dedup-host promote` or `abort` there." } } });
            continue;
        }
        let Some(spec) = candidates::current(&bucket, &r.name).await? else {
            continue;
        };
        let live = store::deployed(&bucket, &r.name).await.unwrap_or_default();
        // Read only, once: hosts create the findings bucket when they first compare.
        if findings.is_none() {
            let name = record::bucket_name(&console.config.components.bucket);
            findings = console.js.get_key_value(name).await.ok();
        }
        let report = match &findings {
            Some(store) => record::read(store, &r.name, &spec.digest).await?,
            None => record::Report::default(),
        };
        let c = &report.counts;
        sections.push(html! {
            section.candidate data-route=(r.name) {
                h2 { (r.name) }
                p { "candidate " code { (spec.digest) } " beside live " code { (live) } }
                p { (super::overview::candidate_words(&spec)) }
                table { tbody {
                    tr { th { "compared" } td.num { (c.compared) } }
                    tr { th { "matches" } td.num { (c.matches) } }
                    tr { th { "differences" } td.num { (c.differences) } }
                    tr { th { "noise (live vs live)" } td.num { (c.noise) } }
                    tr { th { "skipped (no spare slot)" } td.num { (c.skipped) } }
                    @for (kind, n) in &c.kinds { tr { th { "· " (kind.label()) } td.num { (n) } } }
                    tr { th { "hosts reporting" } td.num { (report.hosts) } }
                } }
                @if !report.first.is_empty() || !report.last.is_empty() {
                    h3 { "Samples" }
                    @for s in report.first.values().chain(report.last.iter().rev().take(10)) { (sample(&r.name, s)) }
                }
                div.actions {
                    form method="post" action="/deploys/promote" {
                        input type="hidden" name="route" value=(r.name);
                        input type="hidden" name="digest" value=(spec.digest);
                        (csrf(&viewer))
                        button type="submit" { "Promote…" }
                    }
                    form method="post" action="/deploys/abort" {
                        input type="hidden" name="route" value=(r.name);
                        input type="hidden" name="digest" value=(spec.digest);
                        (csrf(&viewer))
                        button type="submit" { "Abort…" }
                    }
                }
            }
        });
    }
    let body = html! {
        @if sections.is_empty() { p { "No route has a candidate. Deploy one with " code { "dedup-host deploy --route R --shadow FILE" } " (or " code { "--canary P% FILE" } ")." } }
        @for s in sections { (s) }
    };
    Ok(maud_response(html::page("Deploys", &viewer, body)))
}

fn sample(route: &str, s: &Sample) -> Markup {
    html! {
        div.sample {
            p { "sequence " (s.sequence) ", key " (key_link(route, &s.key)) ", " (when(s.at_ms)) ": differs at " (shown(&s.differences.join(", "))) }
            table { thead { tr { th { "" } th { "outcome" } th { "outputs" } } }
                tbody { @for (who, run) in [("live", &s.live), ("candidate", &s.candidate)] { tr {
                    td { (who) }
                    td { (run.outcome) @if let Some(r) = &run.reason { " (" (shown(r)) ")" } }
                    td { @for o in &run.outputs { div { code { (shown(&o.subject)) } " " (shown(&o.payload)) } } }
                } } } }
        }
    }
}

/// The promote and abort forms.
#[derive(Debug, Deserialize)]
pub struct CandidateForm {
    route: String,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    confirmed: String,
}

/// `POST /deploys/promote` and `POST /deploys/abort`.
pub async fn decide(
    State(console): State<Shared>,
    Path(action): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<CandidateForm>,
) -> Result<Response, Failure> {
    let action = match action.as_str() {
        "promote" => "promote",
        "abort" => "abort",
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    let who = match console.allow_change(&headers, form.csrf.as_deref()) {
        Ok(who) => who,
        Err(denied) => return Ok(denied.into_response()),
    };
    let viewer = console.viewer(Some(who.clone()));
    if !console.config.routes.iter().any(|r| r.name == form.route) {
        let e = anyhow::anyhow!("no route `{}` in this console's config", form.route);
        return Err(e.into());
    }
    // The write's own connection: its refusals are this write's alone.
    let (js, refusals) = console.writer().await?;
    let bucket = store::open(&js, &console.config).await?;
    if form.confirmed != "yes" {
        let body = html! {
            p #confirm data-count="1" { (action) " the candidate " code { (form.digest) } " of route " strong { (form.route) } " on every host that serves it?" }
            form method="post" action=(format!("/deploys/{action}")) {
                input type="hidden" name="route" value=(form.route);
                input type="hidden" name="digest" value=(form.digest);
                input type="hidden" name="confirmed" value="yes";
                (csrf(&viewer))
                button #confirm-button type="submit" { "Yes, " (action) }
                " " a href="/deploys" { "cancel" }
            }
        };
        return Ok(maud_response(html::page(
            &format!("Confirm {action}"),
            &viewer,
            body,
        )));
    }
    let started = std::time::Instant::now();
    let result = match action {
        "promote" => store::promote(&bucket, &form.route, Some(&form.digest))
            .await
            .map(|live| format!("every host now serves {live}")),
        _ => match candidates::current(&bucket, &form.route).await? {
            Some(spec) if spec.digest == form.digest => candidates::delete(&bucket, &form.route)
                .await
                .map(|()| "dropped; the live version runs every key".to_string()),
            Some(spec) => Err(anyhow::anyhow!(
                "the candidate changed to {} meanwhile; not aborted",
                spec.digest
            )),
            None => Err(anyhow::anyhow!(
                "route `{}` has no candidate any more",
                form.route
            )),
        },
    };
    // A write the console's NATS user may not make names the subject to grant.
    let result = result.unwrap_or_else(|e| format!("failed: {:#}", refusals.explain(e, started)));
    let mut entry = Entry::now(
        &format!("console {who}@{peer}"),
        action,
        &form.route,
        form.digest.clone(),
    );
    entry.count = 1;
    entry.result = result.clone();
    crate::activity::record(&console.js, &console.config, &entry).await;
    let body = html! {
        p #summary { (action) " " code { (form.digest) } " of route " (form.route) ": " (result) }
        p { a href="/deploys" { "back to deploys" } }
    };
    Ok(maud_response(html::page(
        &format!("{action}: result"),
        &viewer,
        body,
    )))
}

/// `GET /activity`.
pub async fn activity(
    State(console): State<Shared>,
    Reader(viewer): Reader,
) -> Result<Response, Failure> {
    let entries = crate::activity::list(&console.js, &console.config, 500).await?;
    let body = html! {
        p.meta { "Every change made from the console or the CLI, and every automatic rollback, newest first." }
        @if entries.is_empty() { p { "Nothing yet." } } @else {
            table #activity { thead { tr { th { "when" } th { "who" } th { "action" } th { "route" } th { "what" } th { "items" } th { "result" } } }
                tbody { @for e in &entries { (entry_row(e)) } } }
        }
    };
    Ok(maud_response(html::page("Activity", &viewer, body)))
}

fn entry_row(e: &Entry) -> Markup {
    html! {
        tr {
            td { (when(e.at_ms)) } td { (shown(&e.who)) } td.action { (e.action) } td { (shown(&e.route)) }
            td { (shown(&e.target)) } td.num { (e.count) } td { (shown(&e.result)) }
        }
    }
}

/// The login form's fields.
#[derive(Debug, Default, Deserialize)]
pub struct Login {
    /// The user, when the console has one.
    #[serde(default)]
    pub user: Option<String>,
    /// The token or password.
    #[serde(default)]
    pub token: Option<String>,
}

fn login_form(viewer: &Viewer, wants_user: bool, failed: bool) -> Markup {
    html::page(
        "Log in",
        viewer,
        html! {
            @if failed { (html::notice("error", "Wrong token (or user and password).")) }
            form.login method="post" action="/login" {
                @if wants_user { label { "user " input type="text" name="user" autocomplete="username"; } }
                label { (if wants_user { "password " } else { "token " }) input #token type="password" name="token" autocomplete="current-password"; }
                button #login type="submit" { "Log in" }
            }
        },
    )
}

/// `GET /login`: the form only (a secret in a URL would stay in histories and logs).
pub async fn login_page(State(console): State<Shared>) -> Response {
    let viewer = Viewer::default();
    maud_response(login_form(&viewer, console.access.wants_user(), false))
}

/// `POST /login`: a new session for the right secret.
pub async fn login(
    State(console): State<Shared>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Response {
    let token = login.token.unwrap_or_default();
    if console.access.check(login.user.as_deref(), &token) {
        let cookie = console
            .access
            .login_cookie(super::auth::over_https(&headers));
        return (
            StatusCode::SEE_OTHER,
            [(header::SET_COOKIE, cookie)],
            Redirect::to("/"),
        )
            .into_response();
    }
    let viewer = Viewer::default();
    let page = login_form(&viewer, console.access.wants_user(), true);
    (StatusCode::UNAUTHORIZED, maud_response(page)).into_response()
}

/// The logout form's fields.
#[derive(Debug, Default, Deserialize)]
pub struct Logout {
    /// The CSRF value.
    #[serde(default)]
    pub csrf: Option<String>,
}

/// `POST /logout`: ends the session (its cookie no longer logs in, wherever it was copied).
pub async fn logout(
    State(console): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<Logout>,
) -> Response {
    if let Err(denied) = console.allow_change(&headers, form.csrf.as_deref()) {
        return denied.into_response();
    }
    let cookie = console.access.logout_cookie(&headers);
    (
        StatusCode::SEE_OTHER,
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/"),
    )
        .into_response()
}
