//! The seeded fault simulation of the delivery protocol (`docs/src/how/simulation.md`).
//!
//! `simulate [--seeds N] [--from S]` runs seeds S..S+N in every mode combination and prints
//! each failing seed with the command that replays it; `simulate --seed S [--claim-after]
//! [--fenced] [--exclusive | --coalesce] --trace` replays one seed step by step. Exits 1 when
//! any seed fails, 2 on a usage error.
//!
//! `--revert FIX[,FIX]` (with either) undoes those fixes first (`dedup_delivery::revert`);
//! `simulate --canaries [--seeds N] [FIX...]` reverts each fix in turn and prints how many
//! seeds find it (exits 1 when one is not found within N seeds, default 4,000).

use std::collections::BTreeMap;

use dedup_delivery::revert::{self, Fix};
use dedup_host_tests::sim::{self, canary, Mode, Settings};

const USAGE: &str = "usage: simulate [--revert FIX,...] [--seeds N] [--from S]
       simulate [--revert FIX,...] --seed S [--claim-after | --fenced [--exclusive | --coalesce] | --exclusive | --coalesce] [--trace]
       simulate --canaries [--seeds N] [FIX...]
the modes: (no flag: window, claim before), --claim-after, --fenced, --exclusive, --coalesce, --fenced --exclusive, --fenced --coalesce";

/// Options that take a value.
const VALUED: &[&str] = &["--seeds", "--from", "--seed", "--revert"];
/// Options that take none.
const FLAGS: &[&str] = &[
    "--claim-after",
    "--fenced",
    "--exclusive",
    "--coalesce",
    "--trace",
    "--canaries",
];

/// The command line, checked: each option once, values where they belong, fix names only
/// after `--canaries`.
struct Args {
    values: BTreeMap<&'static str, String>,
    flags: Vec<&'static str>,
    names: Vec<String>,
}

impl Args {
    fn parse(raw: &[String]) -> Args {
        let mut args = Args {
            values: BTreeMap::new(),
            flags: Vec::new(),
            names: Vec::new(),
        };
        let mut it = raw.iter();
        while let Some(a) = it.next() {
            if a == "--help" || a == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            if let Some((name, _)) = a.split_once('=').filter(|_| a.starts_with("--")) {
                usage(&format!("write `{name} VALUE`, not `{a}`"));
            }
            if let Some(&name) = VALUED.iter().find(|n| **n == a) {
                let v = it
                    .next()
                    .unwrap_or_else(|| usage(&format!("{name} needs a value")));
                if args.values.insert(name, v.clone()).is_some() {
                    usage(&format!("{name} is given twice"));
                }
            } else if let Some(&name) = FLAGS.iter().find(|n| **n == a) {
                if args.flags.contains(&name) {
                    usage(&format!("{name} is given twice"));
                }
                args.flags.push(name);
            } else if a.starts_with('-') {
                usage(&format!("unknown option `{a}`"));
            } else {
                args.names.push(a.clone());
            }
        }
        args
    }

    fn flag(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }

    fn number(&self, name: &str) -> Option<u64> {
        let v = self.values.get(name)?;
        Some(
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name} needs a number, not `{v}`"))),
        )
    }

    /// Refuses `name` (an option or flag) when `with` is given, saying why.
    fn refuse_with(&self, name: &str, with: &str) {
        if self.flag(name) || self.values.contains_key(name) {
            usage(&format!("{name} does not go with {with}"));
        }
    }
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = Args::parse(&raw);
    check_env();
    if args.flag("--canaries") {
        for name in ["--seed", "--from", "--revert", "--trace"].iter().chain(&[
            "--claim-after",
            "--fenced",
            "--exclusive",
            "--coalesce",
        ]) {
            args.refuse_with(name, "--canaries (it searches every mode, each fix alone)");
        }
        canaries(&args.names, seeds(&args, 4_000));
    }
    if let Some(name) = args.names.first() {
        usage(&format!(
            "unexpected argument `{name}` (fix names go after --canaries, or to --revert)"
        ));
    }
    if let Some(names) = args.values.get("--revert") {
        let fixes: Vec<Fix> = names.split(',').map(fix).collect();
        revert::set(&fixes);
    }
    if let Some(seed) = args.number("--seed") {
        args.refuse_with("--seeds", "--seed (one seed)");
        args.refuse_with("--from", "--seed (one seed)");
        if args.flag("--exclusive") && args.flag("--coalesce") {
            usage("give --coalesce or --exclusive, not both (--coalesce is exclusive)");
        }
        let coalesce = args.flag("--coalesce");
        let mode = Mode {
            claim_after: args.flag("--claim-after"),
            fenced: args.flag("--fenced"),
            exclusive: coalesce || args.flag("--exclusive"),
            coalesce,
        };
        if !Mode::all().contains(&mode) {
            usage("--claim-after does not go with --fenced, --exclusive or --coalesce");
        }
        let settings = Settings {
            mode,
            ..Settings::default()
        };
        let report = sim::run(seed, settings, args.flag("--trace"));
        for line in &report.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}{}{}: {} steps, {} violation(s)",
            mode.flags(),
            sim::reverted_flag(),
            report.steps,
            report.violations.len()
        );
        for v in &report.violations {
            println!("  {v}");
        }
        std::process::exit(i32::from(!report.violations.is_empty()));
    }
    for name in [
        "--claim-after",
        "--fenced",
        "--exclusive",
        "--coalesce",
        "--trace",
    ] {
        args.refuse_with(name, "a run of many seeds (every mode runs; give --seed S)");
    }
    let (seeds, from) = (seeds(&args, 1000), args.number("--from").unwrap_or(0));
    if from.checked_add(seeds).is_none() {
        usage(&format!(
            "--from {from} with --seeds {seeds} goes past the last seed"
        ));
    }
    let failed = sim::explore(from, seeds, Settings::default(), |line| println!("{line}"));
    println!(
        "{seeds} seed(s) from {from} x {} modes{}, {failed} run(s) failed",
        Mode::all().len(),
        sim::reverted_flag()
    );
    std::process::exit(i32::from(failed > 0));
}

/// `--seeds`, at least 1, or `default`.
fn seeds(args: &Args, default: u64) -> u64 {
    match args.number("--seeds").unwrap_or(default) {
        0 => usage("--seeds needs at least 1"),
        n => n,
    }
}

/// A fix switched off through the environment is said, and an unknown name refused: a run
/// that fails for a reason its replay command does not give would mislead.
fn check_env() {
    let Ok(names) = std::env::var(revert::ENV) else {
        return;
    };
    for name in names.split(',').filter(|n| !n.trim().is_empty()) {
        fix(name.trim());
    }
    eprintln!(
        "simulate: {}={names} is set: those fixes are reverted in every run",
        revert::ENV
    );
}

/// Reverts each named fix (every one when none is named) in turn, up to the first failing seed.
fn canaries(names: &[String], seeds: u64) -> ! {
    let named: Vec<Fix> = names.iter().map(|a| fix(a)).collect();
    let fixes = match named.is_empty() {
        true => Fix::ALL.to_vec(),
        false => named,
    };
    let mut missed = 0;
    for f in fixes {
        let found = canary::find(f, seeds, Settings::default());
        missed += u32::from(found.first.is_none());
        println!("{}", found.line());
    }
    std::process::exit(i32::from(missed > 0))
}

fn fix(name: &str) -> Fix {
    Fix::parse(name).unwrap_or_else(|| {
        let wanted = name.to_ascii_lowercase().replace('_', "-");
        let hint = match Fix::parse(&wanted) {
            Some(f) => format!(" (did you mean `{}`?)", f.name()),
            None => String::new(),
        };
        let names: Vec<&str> = Fix::ALL.iter().map(|f| f.name()).collect();
        usage(&format!(
            "no fix is named `{name}`{hint}; the fixes: {}",
            names.join(", ")
        ))
    })
}

fn usage(problem: &str) -> ! {
    eprintln!("simulate: {problem}\n{USAGE}");
    std::process::exit(2)
}
