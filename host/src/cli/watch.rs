//! `dedup-host dev --watch [DIR]`: the author's loop while a host runs. The project's sources
//! are scanned every few hundred milliseconds; on a save the project is built, its cases
//! (`cases.toml`) run, and when they pass the component is deployed to the route as its live
//! version. Once every live host serves it, the first outputs of live traffic are printed.
//! A failed build or case prints why and deploys nothing: the hosts keep the version they
//! serve, and the watch goes on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use tokio::task::JoinHandle;

use crate::cases::CaseFile;
use crate::config::Config;
use crate::project::{self, Sources};
use crate::routes::Routes;
use crate::runtime::{InvokeOptions, Runtime};

/// Prints one line on stdout. When the reader has gone (`dev --watch | head -5`), the watch
/// ends as a printing command does in a pipe, but cleanly: the first refused write asks the
/// process to stop (SIGTERM, as `kill` would), so the host drains and the local server stops,
/// instead of a panic that would leave the host serving and the watch dead.
macro_rules! say {
    ($($arg:tt)*) => { say_line(format_args!($($arg)*)) };
}

/// See [`say!`].
fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    static STOPPING: AtomicBool = AtomicBool::new(false);
    let mut out = std::io::stdout().lock();
    let written = writeln!(out, "{line}").and_then(|()| out.flush());
    if written.is_err() && !STOPPING.swap(true, Ordering::SeqCst) {
        eprintln!("dedup-host dev: stdout was closed: stopping the watch and the host");
        // SAFETY: sends a signal to this process; the serving loop handles SIGTERM.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGTERM);
        }
    }
}

/// How often the sources are scanned.
const POLL: Duration = Duration::from_millis(300);
/// How long a deployed version may take to reach every live host before the watch says so.
const SWITCH_WITHIN: Duration = Duration::from_secs(60);
/// How many outputs of live traffic are printed after a deploy.
const OUTPUTS_SHOWN: usize = 3;
/// The case file, in the project's root.
const CASES: &str = "cases.toml";

/// A project watched for one route, checked before anything starts.
pub(super) struct Watch {
    dir: PathBuf,
    route: String,
    options: InvokeOptions,
    outputs: Vec<String>,
    /// Whether `outputs` are the route's `allowed_outputs`, not every output stream's.
    outputs_of_route: bool,
    config: Config,
    /// The config file, when it is a file: a save of it is not a source change.
    config_file: Option<PathBuf>,
}

impl Watch {
    /// Checks that `dir` holds a handler project and that the route (`route`, else the one
    /// named like the project) takes its versions from the object store. Any other route
    /// must be named: what it serves is replaced. `config_file` is the file `config` was read
    /// from (none for the built-in config).
    pub(super) fn new(
        dir: &Path,
        route: Option<&str>,
        config: &Config,
        config_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            let what = if dir.exists() {
                "is not a folder"
            } else {
                "does not exist"
            };
            anyhow::bail!(
                "--watch: no such folder: `{}` {what}; give the folder of a handler project (`dedup-host new NAME` makes one), or run `dev --watch` inside it",
                dir.display()
            );
        }
        let manifest = project::detect(dir)?;
        let from_store: Vec<&str> = (config.routes.iter())
            .filter(|r| super::store_route(config, &r.name).is_ok())
            .map(|r| r.name.as_str())
            .collect();
        let route = match route {
            Some(route) => route.to_string(),
            None if from_store.contains(&manifest.name.as_str()) => manifest.name.clone(),
            None if from_store.is_empty() => anyhow::bail!(
                "--watch deploys to a route served from the object store, and this config has none: give --config FILE with a [[routes]] entry without `component` (and no `components.dir`)"
            ),
            None => anyhow::bail!(
                "--watch: no route is named like the project `{}`, and the watch replaces what its route serves: give --route NAME (routes served from the object store: {from_store:?})",
                manifest.name
            ),
        };
        super::store_route(config, &route).context("--watch deploys through the object store")?;
        let routes = Routes::unloaded(config)?;
        let options = (routes.get(&route).map(|r| r.options.clone())).unwrap_or_default();
        let r = (config.routes.iter())
            .find(|r| r.name == route)
            .expect("checked by store_route");
        let outputs_of_route = !r.allowed_outputs.is_empty();
        let outputs = if !outputs_of_route {
            (config.output_streams.iter())
                .flat_map(|s| s.subjects.clone())
                .collect()
        } else {
            r.allowed_outputs.clone()
        };
        Ok(Watch {
            dir: dir.to_path_buf(),
            route,
            options,
            outputs,
            outputs_of_route,
            config: config.clone(),
            config_file: config_file.map(Path::to_path_buf),
        })
    }

    /// Starts watching against the servers `urls` (the config's, or the local one `dev`
    /// started); abort the task to stop.
    pub(super) fn start(mut self, urls: Vec<String>) -> JoinHandle<()> {
        self.config.nats.urls = urls;
        tokio::spawn(async move {
            if let Err(e) = self.run().await {
                say!(
                    "watch: stopped: {}; the host goes on serving",
                    crate::text::error_chain(&e)
                );
            }
        })
    }

    /// A first build, test and deploy (none when the route already serves the build), then
    /// one per save, until aborted.
    async fn run(self) -> anyhow::Result<()> {
        let client = crate::connect::connect(&self.config, "dedup-host dev --watch").await?;
        let js = async_nats::jetstream::new(client.clone());
        // The authoring commands' engine and cache: the host in this folder loads from it.
        let runtime = super::compile::runtime(Some(&super::compile::project_cache(&self.dir)))?;
        // The hosts' engine, as `deploy` checks with: what it refuses is not deployed.
        let hosts = crate::components::check::runtime(&self.config)?;
        let mut built = Sources::scan(&self.dir);
        say!(
            "watch: {} ({} files) for route `{}`: a save builds, runs {CASES} and deploys when every case passes; Ctrl-C to stop",
            self.dir.display(),
            built.len(),
            self.route
        );
        say!("watch: the config file is read once, at start: after editing it, restart `dev --watch` (SIGHUP reloads the host's routes, not the cases' options)");
        // What the route serves now: a first build that matches it is not deployed again.
        let bucket = crate::components::store::open(&js, &self.config).await?;
        let mut live = crate::components::store::deployed(&bucket, &self.route).await;
        let mut shown: Option<JoinHandle<()>> = None;
        let mut changed = vec![];
        loop {
            if let Some(task) = shown.take() {
                task.abort();
            }
            // Read again each cycle: a console promote or rollback, or a `deploy` from
            // elsewhere, may have changed what serves since (and a server that has just
            // started may not have answered at first).
            if let Some(now) = crate::components::store::deployed(&bucket, &self.route).await {
                live = Some(now);
            }
            let deployed = self
                .cycle(&changed, &js, [&runtime, &hosts], &mut live)
                .await;
            if deployed {
                shown = Some(tokio::spawn(self.show_outputs(
                    js.clone(),
                    client.clone(),
                    live.clone().unwrap_or_default(),
                )));
            }
            // A save is acted on once two scans agree (an editor may write several files).
            // The config is read once, at start: a save of it alone rebuilds nothing.
            let mut last = built.clone();
            loop {
                tokio::time::sleep(POLL).await;
                let now = Sources::scan(&self.dir);
                if now != built && now == last {
                    changed = now.changed_since(&built);
                    built = now.clone();
                    let config = (self.config_file.as_deref())
                        .filter(|file| Sources::take_file(&mut changed, file));
                    if let Some(file) = config {
                        say!(
                            "\nwatch: {} changed: the config is read once, at start, and a save of it rebuilds nothing; restart `dedup-host dev` to apply it",
                            file.display()
                        );
                    }
                    if !changed.is_empty() {
                        break;
                    }
                }
                last = now;
            }
        }
    }

    /// Builds, tests and deploys once; `live` is the digest the route serves. `runtimes` are
    /// the authoring engine (the cases run on it) and the hosts' (it must load the component
    /// too). Returns whether a new version was deployed; every failure is printed.
    async fn cycle(
        &self,
        changed: &[PathBuf],
        js: &async_nats::jetstream::Context,
        [runtime, hosts]: [&Runtime; 2],
        live: &mut Option<String>,
    ) -> bool {
        let names: Vec<String> = (changed.iter())
            .map(|p| p.strip_prefix(&self.dir).unwrap_or(p).display().to_string())
            .collect();
        if names.is_empty() {
            say!("\nwatch: building");
        } else {
            say!("\nwatch: {} changed: building", names.join(", "));
        }
        let serving = serving(&self.route, live.as_deref());
        match self.build_and_test(runtime).await {
            Err(e) => {
                say!(
                    "watch: {}; not deployed, {serving}",
                    crate::text::error_chain(&e)
                );
                false
            }
            Ok((file, bytes)) => {
                let digest = crate::runtime::digest(&bytes);
                if live.as_deref() == Some(digest.as_str()) {
                    say!("watch: the component did not change: {serving}");
                    return false;
                }
                let (hosts, path, loaded) = (hosts.clone(), file.clone(), bytes.clone());
                let checked = tokio::task::spawn_blocking(move || {
                    super::compile::load(&hosts, &path, &loaded)
                })
                .await
                .map_err(anyhow::Error::from)
                .and_then(|loaded| loaded.map(drop).map_err(anyhow::Error::from));
                if let Err(e) = checked {
                    let e = crate::text::error_chain(&e);
                    say!("watch: the hosts' engine refuses the component: {e}; not deployed, {serving}");
                    return false;
                }
                match self.deploy(js, &bytes).await {
                    Err(e) => {
                        let e = crate::text::error_chain(&e);
                        say!("watch: deploying failed: {e}; {serving}");
                        false
                    }
                    Ok(digest) => {
                        let route = &self.route;
                        say!(
                            "watch: deployed {} to route `{route}`: {digest}",
                            file.display()
                        );
                        *live = Some(digest);
                        true
                    }
                }
            }
        }
    }

    /// Builds the project and runs its cases; the component's path and bytes when all pass.
    async fn build_and_test(&self, runtime: &Runtime) -> anyhow::Result<(PathBuf, Vec<u8>)> {
        let dir = self.dir.clone();
        // The toolchain's output goes where the watch prints, so an error comes before the
        // line that says the build failed.
        let build = move || project::build_on_stdout(&dir, None, false);
        let file = tokio::task::spawn_blocking(build)
            .await?
            .context("the build failed")?;
        let bytes = std::fs::read(&file)
            .with_context(|| format!("cannot read the component `{}`", file.display()))?;
        let (runtime, path, loaded) = (runtime.clone(), file.clone(), bytes.clone());
        let handler =
            tokio::task::spawn_blocking(move || super::compile::load(&runtime, &path, &loaded))
                .await??;
        let cases = self.dir.join(CASES);
        let cases = CaseFile::load(&cases)?;
        let results = crate::cases::run(
            &handler,
            &self.options,
            &cases.cases,
            &cases.shared,
            &self.dir,
        )
        .await?;
        for r in &results {
            match &r.failure {
                None => say!("PASS  {}  ({:.1?})", r.name, r.elapsed),
                Some(why) => say!("FAIL  {}\n  {why}", r.name),
            }
        }
        let failed = results.iter().filter(|r| r.failure.is_some()).count();
        say!("{} passed, {failed} failed", results.len() - failed);
        anyhow::ensure!(failed == 0, "{failed} case(s) failed");
        Ok((file, bytes))
    }

    /// Uploads `bytes` as the route's live version, with `deploy`'s ownership checks.
    async fn deploy(
        &self,
        js: &async_nats::jetstream::Context,
        bytes: &[u8],
    ) -> anyhow::Result<String> {
        super::deploy::refuse_others(js, &self.config, &self.route).await?;
        super::deploy::ship(js, &self.config, &self.route, bytes).await
    }

    /// Waits until every live host serves `digest`, then prints the first outputs of live
    /// traffic on the route's output subjects.
    fn show_outputs(
        &self,
        js: async_nats::jetstream::Context,
        client: async_nats::Client,
        digest: String,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (config, route, subjects) = (
            self.config.clone(),
            self.route.clone(),
            self.outputs.clone(),
        );
        // Without `allowed_outputs` the subjects are every output stream's: other routes'
        // outputs may show, so the lines say so.
        let (whose, label) = if self.outputs_of_route {
            (format!("route `{route}`'s outputs"), "output")
        } else {
            (
                "outputs of any route on the output streams (the route sets no `allowed_outputs`)"
                    .to_string(),
                "stream output",
            )
        };
        async move {
            let what = format!("version {digest}");
            let switched =
                super::wait::every_host(&js, &config, &route, SWITCH_WITHIN, &what, |s| {
                    s.digest.as_deref() == Some(digest.as_str())
                })
                .await;
            match switched {
                Ok(all) => say!("{all}"),
                Err(e) => {
                    say!("watch: {}", crate::text::error_chain(&e));
                    return;
                }
            }
            let mut subscriptions = Vec::new();
            for subject in &subjects {
                match client.subscribe(subject.clone()).await {
                    Ok(s) => subscriptions.push(s),
                    Err(e) => say!("watch: cannot watch outputs on `{subject}`: {e}"),
                }
            }
            say!("watch: the first {OUTPUTS_SHOWN} {whose} of live traffic on {subjects:?}:");
            let mut outputs = futures::stream::select_all(subscriptions).take(OUTPUTS_SHOWN);
            while let Some(m) = outputs.next().await {
                let payload = crate::text::reason(&String::from_utf8_lossy(&m.payload));
                say!("{label}  {}  {payload}", m.subject);
            }
        }
    }
}

/// What a watch line says the route serves when nothing new is deployed: the digest `live`
/// (short, as the console shows it), or that no version is deployed.
fn serving(route: &str, live: Option<&str>) -> String {
    match live {
        Some(digest) => format!("route `{route}` still serves version {}", short(digest)),
        None => format!("route `{route}` has no deployed version (its messages wait for one)"),
    }
}

/// A digest's short form: its first 12 hex digits.
fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_deploys_nothing_names_the_version_served() {
        let digest = format!("sha256:{}", "0123456789ab".repeat(5));
        let line = serving("orders", Some(&digest));
        assert_eq!(line, "route `orders` still serves version 0123456789ab");
        let none = serving("orders", None);
        assert!(none.contains("no deployed version"), "{none}");
    }
}
