//! The seeded fault simulation of the delivery protocol (`docs/src/how/simulation.md`).
//!
//! `simulate [--seeds N] [--from S]` runs seeds S..S+N in every mode combination and prints
//! each failing seed with the command that replays it; `simulate --seed S [--claim-after]
//! [--fenced] [--exclusive | --coalesce] --trace` replays one seed step by step. Exits 1 when
//! any seed fails.

use dedup_host_tests::sim::{self, Mode, Settings};

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

fn usage(problem: &str) -> ! {
    eprintln!("simulate: {problem}\nusage: simulate [--seeds N] [--from S] | --seed S [--claim-after] [--fenced] [--exclusive | --coalesce] [--trace]");
    std::process::exit(2)
}
