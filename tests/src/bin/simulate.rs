//! The seeded fault simulation of the delivery protocol (`docs/simulation.md`).
//!
//! `simulate [--seeds N] [--from S]` runs seeds S..S+N in both claim modes and prints each
//! failing seed with the command that replays it; `simulate --seed S [--claim-after] --trace`
//! replays one seed step by step. Exits 1 when any seed fails.

use dedup_host_tests::sim::{self, Settings};

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
    let claim_after = args.iter().any(|a| a == "--claim-after");
    if let Some(seed) = value("--seed") {
        let settings = Settings {
            claim_after,
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
    println!("{} seed(s) x 2 modes, {failed} failed", seeds);
    std::process::exit(i32::from(failed > 0));
}

fn usage(problem: &str) -> ! {
    eprintln!("simulate: {problem}\nusage: simulate [--seeds N] [--from S] | --seed S [--claim-after] [--trace]");
    std::process::exit(2)
}
