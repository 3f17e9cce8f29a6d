//! The seeded fault simulation of the delivery protocol (`docs/src/how/simulation.md`).
//!
//! `simulate [--seeds N] [--from S]` runs seeds S..S+N in every mode combination and prints
//! each failing seed with the command that replays it; `simulate --seed S [--claim-after]
//! [--fenced] [--exclusive | --coalesce] --trace` replays one seed step by step. Exits 1 when
//! any seed fails.
//!
//! `--revert FIX[,FIX]` (with either) undoes those fixes first (`dedup_delivery::revert`);
//! `simulate --canaries [--seeds N] [FIX...]` reverts each fix in turn and prints how many
//! seeds find it (exits 1 when one is not found within N seeds, default 4,000).

use dedup_delivery::revert::{self, Fix};
use dedup_host_tests::sim::{self, canary, Mode, Settings};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<u64> {
        let at = args.iter().position(|a| a == name)?;
        let v = args
            .get(at + 1)
            .unwrap_or_else(|| usage(&format!("{name} needs a number")));
        Some(
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name} needs a number, not `{v}`"))),
        )
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    if flag("--canaries") {
        canaries(&args, value("--seeds").unwrap_or(4_000));
    }
    if let Some(at) = args.iter().position(|a| a == "--revert") {
        let names = args
            .get(at + 1)
            .unwrap_or_else(|| usage("--revert needs a fix name"));
        let fixes: Vec<Fix> = names.split(',').map(fix).collect();
        revert::set(&fixes);
    }
    if let Some(seed) = value("--seed") {
        let coalesce = flag("--coalesce");
        let mode = Mode {
            claim_after: flag("--claim-after"),
            fenced: flag("--fenced"),
            exclusive: coalesce || flag("--exclusive"),
            coalesce,
        };
        if !Mode::all().contains(&mode) {
            usage("claim-after is neither fenced nor exclusive");
        }
        let settings = Settings {
            mode,
            ..Settings::default()
        };
        let report = sim::run(seed, settings, args.iter().any(|a| a == "--trace"));
        for line in &report.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}: {} steps, {} violation(s)",
            report.steps,
            report.violations.len()
        );
        for v in &report.violations {
            println!("  {v}");
        }
        std::process::exit(i32::from(!report.violations.is_empty()));
    }
    let (seeds, from) = (
        value("--seeds").unwrap_or(1000),
        value("--from").unwrap_or(0),
    );
    let failed = sim::explore(from, seeds, Settings::default(), |line| println!("{line}"));
    println!(
        "{seeds} seed(s) x {} modes, {failed} run(s) failed",
        Mode::all().len()
    );
    std::process::exit(i32::from(failed > 0));
}

/// Reverts each named fix (every one when none is named) in turn, up to the first failing seed.
fn canaries(args: &[String], seeds: u64) -> ! {
    let named: Vec<Fix> = args
        .iter()
        .filter(|a| !a.starts_with("--") && a.parse::<u64>().is_err())
        .map(|a| fix(a))
        .collect();
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
        let names: Vec<&str> = Fix::ALL.iter().map(|f| f.name()).collect();
        usage(&format!(
            "no fix is named `{name}`; the fixes: {}",
            names.join(", ")
        ))
    })
}

fn usage(problem: &str) -> ! {
    eprintln!("simulate: {problem}\nusage: simulate [--revert FIX,...] [--seeds N] [--from S] | [--revert FIX,...] --seed S [--claim-after] [--fenced] [--exclusive | --coalesce] [--trace] | --canaries [--seeds N] [FIX...]");
    std::process::exit(2)
}
