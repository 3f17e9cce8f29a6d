//! `dedup-host console`: a web console for a whole deployment (every host of one source
//! stream), served by the binary itself with its assets embedded. It reads what it shows from
//! NATS: the hosts' feed ([`crate::feed`], followed into a [`window::Window`]), the status
//! bucket, the streams and the claims; it needs no list of hosts. Its changes (replay, purge,
//! promote, abort) run the same code as the CLI's and are recorded in [`crate::activity`].
//!
//! Pages: [`overview`] (routes, hosts, live sparklines), [`route_page`] (a route's charts,
//! drawn by [`charts`], and its config as TOML, [`route_toml`]), [`keys`] (a key's
//! story), [`letters`] (dead letters, bulk replay and purge), [`manage`] (audit, deploys,
//! activity, login). Who may do what: [`auth`], with [`sessions`] for logins and [`hosts`] for
//! the `Host` names answered.

pub mod auth;
pub mod charts;
pub mod hosts;
pub mod html;
pub mod keys;
pub mod letters;
pub mod manage;
pub mod overview;
pub mod route_page;
pub mod route_toml;
pub mod sessions;
pub mod window;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::config::Config;
use auth::Access;
use html::Viewer;
use window::Window;

/// What every handler shares.
pub struct Console {
    /// JetStream on the deployment's server.
    pub js: async_nats::jetstream::Context,
    /// The deployment's config.
    pub config: Arc<Config>,
    /// Who may log in.
    pub access: Access,
    /// The hosts' last 15 minutes.
    pub window: Arc<Window>,
}

/// The console shared by the handlers.
pub type Shared = Arc<Console>;

impl Console {
    /// A connection of the console's user for one write (a replay, a purge, a promote):
    /// what the server refuses it is that write's alone, so the page names the refusal of
    /// its own request, never one of a write another person made meanwhile.
    pub async fn writer(
        &self,
    ) -> anyhow::Result<(async_nats::jetstream::Context, crate::refusals::Refusals)> {
        let refusals = crate::refusals::Refusals::own();
        let client = crate::connect::connect_observed(
            &self.config,
            "dedup-host console write",
            refusals.clone(),
        )
        .await?;
        Ok((async_nats::jetstream::new(client), refusals))
    }

    /// Who is logged in (from the request's cookie or bearer token).
    pub fn who(&self, headers: &HeaderMap) -> Option<String> {
        self.access.who(headers)
    }

    /// Lets a read through, or sends the browser to the login page when reads need a login.
    pub fn gate(&self, headers: &HeaderMap) -> Result<Option<String>, Denied> {
        let who = self.who(headers);
        if who.is_none() && !self.access.reads_open() {
            return Err(Denied::Login);
        }
        Ok(who)
    }

    /// Lets a change through (returns who made it), or says why not: 401 without a login,
    /// 403 without the right CSRF value or from another site.
    pub fn allow_change(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<String, Denied> {
        match self.access.refuse_change(headers, csrf) {
            None => Ok(self.who(headers).unwrap_or_default()),
            Some(refusal) => Err(Denied::Change(refusal)),
        }
    }

    /// The page frame's view of who is looking.
    pub fn viewer(&self, who: Option<String>) -> Viewer {
        let csrf = match who {
            Some(_) => self.access.csrf(),
            None => String::new(),
        };
        Viewer { who, csrf }
    }
}

/// Who reads a page: taken from each request (its cookie or bearer token); a request that
/// needs a login and has none is sent to the login page.
pub struct Reader(pub Viewer);

impl FromRequestParts<Shared> for Reader {
    type Rejection = Denied;

    async fn from_request_parts(parts: &mut Parts, console: &Shared) -> Result<Self, Denied> {
        let who = console.gate(&parts.headers)?;
        Ok(Self(console.viewer(who)))
    }
}

/// Why a request was not let through.
#[derive(Debug, Clone, Copy)]
pub enum Denied {
    /// Reads need a login: the browser is sent to the login page.
    Login,
    /// A change was refused.
    Change(auth::Refusal),
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Self::Login => Redirect::to("/login").into_response(),
            Self::Change(refusal) => {
                let status = match refusal {
                    auth::Refusal::NotLoggedIn => StatusCode::UNAUTHORIZED,
                    _ => StatusCode::FORBIDDEN,
                };
                (status, format!("refused: {}\n", refusal.message())).into_response()
            }
        }
    }
}

/// An error shown as a page (escaped) with status 500.
pub struct Failure(anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Self(e.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let viewer = Viewer::default();
        let body = html::page(
            "Something went wrong",
            &viewer,
            html::notice("error", &format!("{:#}", self.0)),
        );
        (StatusCode::INTERNAL_SERVER_ERROR, maud_response(body)).into_response()
    }
}

/// A page as an HTML response.
pub fn maud_response(markup: maud::Markup) -> Response {
    axum::response::Html(markup.into_string()).into_response()
}

/// Every page and asset.
pub fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/api/overview", get(overview::api))
        .route("/routes/{name}", get(route_page::page))
        .route("/routes/{name}/charts", get(route_page::live_charts))
        .route("/keys", get(keys::page))
        .route("/letters", get(letters::list))
        .route("/letters/{item}", get(letters::one).post(letters::act))
        .route("/audit", get(manage::audit).post(manage::run_audit))
        .route("/deploys", get(manage::deploys))
        .route("/deploys/{action}", post(manage::decide))
        .route("/activity", get(manage::activity))
        .route("/login", get(manage::login_page).post(manage::login))
        .route("/logout", post(manage::logout))
        .route("/assets/console.js", get(script))
        .route("/assets/console.css", get(style))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            answer_our_hosts,
        ))
        .layer(axum::middleware::map_response(protect))
        .with_state(console)
}

/// Answers only requests that name a host the console answers to ([`hosts`]): 421 with the
/// reason otherwise, before any page or change is looked at.
async fn answer_our_hosts(State(console): State<Shared>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match console.access.host_refusal(host) {
        None => next.run(request).await,
        Some(refusal) => (
            StatusCode::MISDIRECTED_REQUEST,
            format!("refused: {refusal}\n"),
        )
            .into_response(),
    }
}

/// Headers on every answer: no inline script or style may run (so even text that slipped
/// through escaping could not), no framing, nothing cached, no referrer to other sites (a
/// same-origin policy keeps the `Origin` header of our own forms, which [`auth`] checks).
async fn protect(mut response: Response) -> Response {
    let h = response.headers_mut();
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/console.js"),
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
}

/// Serves the console on `addr` until the process is stopped; `ready` gets the bound address
/// (port 0 picks a free one).
pub async fn serve(
    config: Config,
    addr: SocketAddr,
    access: Access,
    ready: impl FnOnce(SocketAddr, &Access),
) -> anyhow::Result<()> {
    let client = crate::connect::connect(&config, "dedup-host console").await?;
    let js = async_nats::jetstream::new(client);
    let config = Arc::new(config);
    let window = Arc::new(Window::default());
    tokio::spawn(window::follow(js.clone(), config.clone(), window.clone()));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("the console cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    ready(bound, &access);
    let console = Arc::new(Console {
        js,
        config,
        access,
        window,
    });
    let app = router(console).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
