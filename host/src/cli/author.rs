//! The guest author's commands: `dedup-host new` (a project from the embedded templates),
//! `dedup-host build` (the language's toolchain), `dedup-host wit` (the WIT package this
//! binary serves) and `dedup-host test` (a table of cases run through the runtime, with a
//! JUnit report).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cases::{self, CaseFile};
use crate::config::Config;
use crate::project::{self, Language};
use crate::routes::Routes;
use crate::runtime::InvokeOptions;

/// Flags of `dedup-host new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The handler's language.
    #[arg(long, value_enum)]
    lang: Language,
    /// The handler's name (lower-case letters, digits and `-`): the component is
    /// `<NAME>.wasm`.
    name: String,
    /// Where to create it (default: ./NAME); must be missing or empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Creates a project from the embedded templates.
pub fn new(args: NewArgs) -> anyhow::Result<ExitCode> {
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    let written = project::create(&dir, &args.name, args.lang)?;
    println!(
        "created the {} handler `{}` in {} ({} files)",
        args.lang.title(),
        args.name,
        dir.display(),
        written.len()
    );
    println!(
        "next: cd {} && dedup-host build && dedup-host test",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Flags of `dedup-host build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The project directory.
    #[arg(value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Where to write the component (default: DIR/<name>.wasm).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Install a missing toolchain (apt, pip, npm, cargo) instead of saying what to install.
    #[arg(long)]
    install: bool,
}

/// Builds a project into a component and checks that this host loads it.
pub fn build(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let out = project::build(&args.dir, args.out.as_deref(), args.install)?;
    let runtime = super::compile::runtime(Some(&super::compile::project_cache(&args.dir)))?;
    super::compile::load_file(&runtime, &out).with_context(|| {
        format!(
            "the build wrote `{}`, but it is not a handler",
            out.display()
        )
    })?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!("built {} ({size} bytes)", out.display());
    Ok(ExitCode::SUCCESS)
}

/// Flags of `dedup-host wit`.
#[derive(Debug, Args)]
pub struct WitArgs {
    /// The directory to write the `dedup:handler` package into.
    #[arg(long, value_name = "DIR", default_value = "wit")]
    out: PathBuf,
}

/// Writes the embedded WIT package.
pub fn wit(args: WitArgs) -> anyhow::Result<ExitCode> {
    let written = crate::wit::write(&args.out)
        .with_context(|| format!("cannot write the WIT package into `{}`", args.out.display()))?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `dedup-host test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The case file.
    #[arg(value_name = "CASES", default_value = "cases.toml")]
    cases: PathBuf,
    /// The component to test (default: the case file's `component`).
    #[arg(long, value_name = "FILE")]
    component: Option<PathBuf>,
    /// A host config whose route's limits, configuration and allowed outputs apply (with
    /// `--route`).
    #[arg(long, value_name = "FILE", requires = "route")]
    config: Option<PathBuf>,
    /// The route of `--config` to test as.
    #[arg(long, value_name = "NAME", requires = "config")]
    route: Option<String>,
    /// Also write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
}

/// Runs the cases; exits 1 when any fails.
pub async fn test(args: TestArgs) -> anyhow::Result<ExitCode> {
    let file = CaseFile::load(&args.cases)?;
    let base = args.cases.parent().map(PathBuf::from).unwrap_or_default();
    let component = match (&args.component, &file.component) {
        (Some(c), _) => c.clone(),
        (None, Some(c)) => base.join(c),
        (None, None) => anyhow::bail!(
            "no component: pass --component FILE or set `component = \"...\"` in `{}`",
            args.cases.display()
        ),
    };
    let options = match (&args.config, &args.route) {
        (Some(config), Some(route)) => {
            let config = Config::load(config)?;
            let routes = Routes::unloaded(&config)?;
            let r = routes
                .get(route)
                .with_context(|| format!("no route `{route}` in the config"))?;
            r.options.clone()
        }
        _ => InvokeOptions::default(),
    };
    // The project's cache: `build` compiled it already, and `deploy` from here finds it.
    let runtime = super::compile::runtime(Some(&super::compile::project_cache(&base)))?;
    let handler = super::compile::load_file(&runtime, &component)?;
    let results = cases::run(&handler, &options, &file.cases, &file.shared, &base).await?;
    let failed = results.iter().filter(|r| r.failure.is_some()).count();
    for r in &results {
        match &r.failure {
            None => println!("PASS  {}  ({:.1?})", r.name, r.elapsed),
            Some(why) => println!("FAIL  {}\n  {why}", r.name),
        }
    }
    println!(
        "{} passed, {failed} failed ({})",
        results.len() - failed,
        component.display()
    );
    if let Some(path) = &args.junit {
        let suite = component.display().to_string();
        std::fs::write(path, cases::junit(&suite, &results))
            .with_context(|| format!("cannot write the JUnit report `{}`", path.display()))?;
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
