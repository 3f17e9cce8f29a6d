//! The demo's exclusive, contract and forever parts: ledger adjustments that run one per
//! account at a time, the ledger route's contract, and a late re-run whose ledger entry a
//! forever stream refuses.

use std::time::Duration;

use async_nats::jetstream::Context as JetStream;
use async_nats::HeaderMap;

use crate::claim::{key, ClaimRecord, ClaimState};
use crate::config::{Config, DedupMode};
use crate::inspect::stream_messages;

/// The route and transaction re-run late.
const ROUTE: &str = "ledger";
const TRANSACTION: &str = "tx-1";

/// Prints when each ledger adjustment ran, per account, from the entries' `ran_ms`.
pub(super) async fn print_exclusive(js: &JetStream, config: &Config) -> anyhow::Result<()> {
    let Some(stream) = config
        .output_streams
        .iter()
        .find(|o| o.name == "DEMO_LEDGER")
    else {
        return Ok(());
    };
    let mut runs = Vec::new();
    for m in stream_messages(js, &stream.name).await? {
        let entry: serde_json::Value = serde_json::from_slice(&m.payload)?;
        let ran = &entry["ran_ms"];
        if let (Some(start), Some(end)) = (ran[0].as_u64(), ran[1].as_u64()) {
            let name = |f: &str| entry[f].as_str().unwrap_or("?").to_string();
            runs.push((name("account"), name("transaction_id"), start, end));
        }
    }
    let Some(first) = runs.iter().map(|r| r.2).min() else {
        return Ok(());
    };
    runs.sort_by_key(|r| (r.0.clone(), r.2));
    println!("\nExclusive by account (route `{ROUTE}`, 300 ms of work each):");
    for (account, tx, start, end) in &runs {
        let at = |t: u64| (t - first) as f64 / 1000.0;
        println!(
            "  {account:<6} {tx:<5} ran {:.2}-{:.2} s",
            at(*start),
            at(*end)
        );
    }
    println!("  one account's adjustments never overlap and run in publish order; other accounts run beside them");
    Ok(())
}

/// Forgets `tx-1`'s completed record (as the bucket's max age would), waits past the forever
/// ledger stream's duplicate window and publishes the adjustment again: it runs again, and
/// the stream refuses its entry. Returns what happened, in one line.
pub(super) async fn late_rerun(js: &JetStream, config: &Config) -> anyhow::Result<String> {
    let Some(ledger) = config
        .output_streams
        .iter()
        .find(|o| o.dedup == DedupMode::Forever)
    else {
        return Ok("no forever output stream configured".into());
    };
    let kv = js.get_key_value(&config.claims.bucket).await?;
    let claim_key = key::encode(ROUTE, TRANSACTION);
    kv.purge(&claim_key).await?;
    tokio::time::sleep(ledger.duplicate_window + Duration::from_millis(300)).await;
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", "l-1-late");
    let payload = r#"{"account":"acc-1","amount":2500,"transaction_id":"tx-1"}"#;
    js.publish_with_headers("demo.ledger.adjust", h, payload.into())
        .await?
        .await?;
    let started = std::time::Instant::now();
    let record = loop {
        if let Some(entry) = kv.get(&claim_key).await? {
            let record = ClaimRecord::from_bytes(&entry)?;
            if record.state == ClaimState::Completed {
                break record;
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the late re-run did not complete"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let refused = record.outputs.iter().all(|o| o.duplicate);
    Ok(format!(
        "{TRANSACTION} re-run {:.1} s later, after its record was dropped and past the {:?} window: its entry {} by {} (forever: the subject already holds it)",
        ledger.duplicate_window.as_secs_f64() + 0.3,
        ledger.duplicate_window,
        if refused { "was refused" } else { "was NOT refused" },
        ledger.name
    ))
}

/// Plays a stale owner of a fenced route's first key: it commits an output set expecting the
/// revision its claim had before completion, and the server refuses the whole batch. Returns
/// what happened, in one line.
pub(super) async fn stale_commit(js: &JetStream, config: &Config) -> anyhow::Result<String> {
    use crate::claim::ClaimStore as _;
    let Some((route, stream)) = config
        .routes
        .iter()
        .find_map(|r| Some((r, config.fenced_stream(r)?)))
    else {
        return Ok("no fenced route configured".into());
    };
    let claim_key = key::encode(&route.name, "u-1");
    let subject = crate::fenced::claim_subject(&stream.name, &claim_key);
    let store = crate::claim::stream::StreamClaimStore::new(js.clone());
    let Some((record, revision)) = store.get(&subject).await? else {
        return Ok(format!("`{}` key u-1 has no claim record", route.name));
    };
    let stale = crate::bindings::Output {
        subject: "demo.upper.greeting.done".into(),
        payload: b"A STALE OWNER'S OUTPUT".to_vec(),
        headers: Vec::new(),
    };
    let before = revision - 1 - u64::from(record.batch_outputs.unwrap_or(0));
    let refused =
        crate::fenced::commit::commit(js, &subject, &claim_key, &record, before, &[stale], &[])
            .await;
    Ok(format!(
        "route `{}` commits outputs and completion as one atomic batch on {}; a stale owner's batch for u-1 (expecting revision {before}, now {revision}) {}",
        route.name,
        stream.name,
        match refused {
            Err(crate::claim::ClaimError::Conflict) => "was refused whole by the server: nothing stored".to_string(),
            other => format!("was NOT refused: {other:?}"),
        }
    ))
}

/// Prints the ledger route's contract, and what a host configured with other partitions is
/// told: it refuses the route instead of putting an account on another partition.
pub(super) async fn print_contract(js: &JetStream, config: &Config) -> anyhow::Result<()> {
    let store = crate::contract::open(js, config).await?;
    let Some((record, _)) = crate::contract::read(&store, ROUTE).await? else {
        return Ok(());
    };
    let c = &record.contract;
    println!(
        "\nRoute contract of `{ROUTE}` (recorded on the server by {}; every host must agree): claims in {}, effects {:?}, claim {:?}, {} partition(s)",
        record.recorded_by,
        c.claims,
        c.effects,
        c.claim,
        c.partitions.unwrap_or(0)
    );
    let mut bigger = config.clone();
    let Some(route) = bigger.routes.iter_mut().find(|r| r.name == ROUTE) else {
        return Ok(());
    };
    route.partitions = Some(route.partitions() * 2);
    let route = route.clone();
    if let Err(e) = crate::contract::agree(&store, &bigger, &route, "demo").await {
        println!("  a host configured with other partitions is refused the route:\n  {e}");
    }
    Ok(())
}
