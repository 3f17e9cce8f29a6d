//! A route's outbound-HTTP grant ([`crate::runtime::http::HttpGrant`]), built from its
//! `[routes.http]` when the route is built (at start, and by a reload for each route it adds
//! or changes). The config's validation checked the settings and read the `ca_file`, but the
//! file may have become unreadable since: a route whose grant cannot be built is refused
//! with an error naming it and the file, never served without a grant (every call it made
//! would be denied with nothing saying why).

use std::path::PathBuf;

use crate::config::{Config, RouteConfig};
use crate::metrics::Metrics;
use crate::runtime::http::HttpGrant;

/// A route's `[routes.http]` that gives no grant: the route is not built.
#[derive(Debug, Clone, thiserror::Error)]
#[error("route `{route}`: its outbound-HTTP grant ([routes.http]) cannot be built: {}{}; a route without its grant would have every call denied, so it is not served. {}, then reload (or restart) the host", problems.join("; "), ca_file.as_ref().map(|f| format!(" (ca_file `{}`)", f.display())).unwrap_or_default(), fix(ca_file))]
pub struct GrantError {
    /// The route.
    pub route: String,
    /// Its `ca_file`, resolved against the config's folder, if it names one.
    pub ca_file: Option<PathBuf>,
    /// What is wrong with the settings.
    pub problems: Vec<String>,
}

/// The fix a [`GrantError`] names.
fn fix(ca_file: &Option<PathBuf>) -> String {
    match ca_file {
        Some(file) => format!("Make `{}` a readable PEM file of CA certificates (or remove `ca_file` to trust only the system's roots)", file.display()),
        None => "Fix the route's [routes.http] settings as named".to_string(),
    }
}

/// Route `r`'s grant, observed by `metrics` (`None`: the route has no `[routes.http]`).
pub(super) fn http_grant(
    config: &Config,
    r: &RouteConfig,
    metrics: &Metrics,
) -> Result<Option<HttpGrant>, GrantError> {
    let Some(h) = &r.http else {
        return Ok(None);
    };
    let mut h = h.clone();
    h.ca_file = h.ca_file.map(|f| config.resolve(&f));
    let grant = HttpGrant::new(&h).map_err(|problems| GrantError {
        route: r.name.clone(),
        ca_file: h.ca_file.clone(),
        problems,
    })?;
    Ok(Some(grant.observed(metrics.http_calls(&r.name))))
}
