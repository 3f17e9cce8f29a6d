//! `dedup-bench`: runs dedup-host's benchmarks:
//! `dedup-bench invoke [ITERATIONS]`, `dedup-bench pipeline [MESSAGES] [LATENCY_SAMPLES]`, `dedup-bench fairness [MESSAGES]`.

use dedup_host_tests::bench;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("all");
    let number = |i: usize, default: usize| -> anyhow::Result<usize> {
        Ok(args
            .get(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    match which {
        "invoke" => bench::invoke::run(number(1, 20_000)?).await,
        "pipeline" => bench::pipeline::run(number(1, 20_000)?, number(2, 500)?).await,
        "fairness" => bench::fairness::run(number(1, 20_000)?).await,
        other => anyhow::bail!("unknown benchmark `{other}`; choose: invoke, pipeline, fairness"),
    }
}
