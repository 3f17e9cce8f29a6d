//! The route table: which handler runs for which subject, with what key source and limits.

use std::sync::Arc;

use anyhow::Context as _;

use crate::bindings::Event;
use crate::config::{Config, KeySource, MissingKey, RouteConfig};
use crate::runtime::{Handler, Invocation, InvokeOptions, Outcome, Runtime};
use crate::subject;

/// What runs a route's events.
#[derive(Clone, Debug)]
pub enum Guest {
    /// A WebAssembly component.
    Wasm(Handler),
    /// Succeeds at once with no outputs: measures the dedup guard without wasm.
    Noop,
}

impl Guest {
    /// The digest recorded in claims.
    pub fn digest(&self) -> &str {
        match self {
            Guest::Wasm(h) => h.digest(),
            Guest::Noop => "noop",
        }
    }

    /// Runs one event.
    pub async fn invoke(&self, event: Event, options: &InvokeOptions) -> Invocation {
        match self {
            Guest::Wasm(h) => h.invoke(event, options).await,
            Guest::Noop => Invocation {
                outcome: Outcome::Success(Vec::new()),
                logs: Vec::new(),
                elapsed: Default::default(),
            },
        }
    }
}

/// One route, ready to serve.
#[derive(Debug)]
pub struct Route {
    /// Route name.
    pub name: String,
    /// Subject filter.
    pub subject: String,
    /// Key source.
    pub key: KeySource,
    /// What to do without a key.
    pub missing_key: MissingKey,
    /// Largest accepted payload.
    pub max_payload_bytes: usize,
    /// Limits and configuration for invocations.
    pub options: InvokeOptions,
    /// The handler.
    pub guest: Guest,
}

/// All routes of a host. Route filters never overlap (validated), so at most one matches.
#[derive(Debug, Default)]
pub struct Routes {
    routes: Vec<Arc<Route>>,
}

impl Routes {
    /// Loads every route's component; fails naming the route and the file.
    pub fn load(runtime: &Runtime, config: &Config) -> anyhow::Result<Self> {
        let mut routes = Vec::new();
        for r in &config.routes {
            let path = config.resolve(&r.component);
            let handler = runtime
                .load_file(&path)
                .with_context(|| format!("route `{}`", r.name))?;
            routes.push(Self::route(r, Guest::Wasm(handler)));
        }
        Ok(Self { routes })
    }

    /// Builds routes from the config with the given guest for every route (benchmarks).
    pub fn with_guest(config: &Config, guest: Guest) -> Self {
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| Self::route(r, guest.clone()))
                .collect(),
        }
    }

    fn route(r: &RouteConfig, guest: Guest) -> Arc<Route> {
        Arc::new(Route {
            name: r.name.clone(),
            subject: r.subject.clone(),
            key: r.key.clone(),
            missing_key: r.missing_key,
            max_payload_bytes: r.max_payload_bytes,
            options: InvokeOptions {
                limits: r.limits.clone(),
                config: Arc::new(r.config.clone()),
            },
            guest,
        })
    }

    /// The route whose filter matches `subject`.
    pub fn find(&self, subject: &str) -> Option<Arc<Route>> {
        self.routes
            .iter()
            .find(|r| subject::matches(&r.subject, subject))
            .cloned()
    }

    /// Every route.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }
}
