//! Example handler: validates a JSON balance adjustment and emits the ledger entry.
//!
//! Input: `{"account": "acc-1", "amount": -250, "transaction_id": "tx-9"}` (amount in minor
//! units). Malformed input is rejected (dead-lettered) with the reason; a valid adjustment
//! yields one output on `ledger.entries.<account>.<transaction_id>`: the subject carries the
//! event's identity, so a forever output stream refuses a late re-run's entry. With the route
//! config `work_ms`, it works that long first and reports when it ran (`ran_ms`, wall clock).
//!
//! Built as `ledger-next` (`guests/rust/ledger-next`, this source under another name), it is
//! the handler's next version, for the safe-deploy workflow: every entry gains a `currency`
//! field, and odd amounts are refused.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::config;
use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Header, Output};
use exports::dedup::handler::handler::Guest;
use serde::{Deserialize, Serialize};

/// A requested change to one account's balance.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Adjustment {
    account: String,
    amount: i64,
    transaction_id: String,
}

/// The ledger entry published for an accepted adjustment.
#[derive(Serialize)]
struct Entry<'a> {
    account: &'a str,
    amount: i64,
    transaction_id: &'a str,
    idempotency_key: &'a str,
    fencing_token: u64,
    /// When the work ran (ms since the epoch), with `work_ms` configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    ran_ms: Option<[u64; 2]>,
    /// The currency (`ledger-next` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<&'static str>,
}

/// Whether this is the next version (built as `ledger-next`).
fn next_version() -> bool {
    env!("CARGO_PKG_NAME") == "ledger-next"
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Ledger;

impl Guest for Ledger {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let adj: Adjustment = serde_json::from_slice(&event.payload)
            .map_err(|e| Failure::Reject(format!("malformed adjustment: {e}")))?;
        for (field, value) in [("account", &adj.account), ("transaction_id", &adj.transaction_id)] {
            if !valid_token(value) {
                return Err(Failure::Reject(format!(
                    "malformed adjustment: {field} `{value}` must be non-empty and use only [A-Za-z0-9_-]"
                )));
            }
        }
        if adj.amount == 0 {
            return Err(Failure::Reject("malformed adjustment: amount must not be zero".into()));
        }
        if next_version() && adj.amount % 2 != 0 {
            return Err(Failure::Reject("malformed adjustment: amount must be even".into()));
        }
        let ran_ms = config::get("work_ms").and_then(|ms| ms.parse::<u64>().ok()).map(|ms| {
            let start = now_ms();
            std::thread::sleep(std::time::Duration::from_millis(ms));
            [start, now_ms()]
        });
        let entry = Entry {
            account: &adj.account,
            amount: adj.amount,
            transaction_id: &adj.transaction_id,
            idempotency_key: &event.key,
            fencing_token: event.fencing_token,
            ran_ms,
            currency: next_version().then_some("EUR"),
        };
        log(
            Level::Info,
            "ledger entry",
            &[
                ("account".to_string(), adj.account.clone()),
                ("amount".to_string(), adj.amount.to_string()),
            ],
        );
        Ok(vec![Output {
            subject: format!("ledger.entries.{}.{}", adj.account, adj.transaction_id),
            payload: serde_json::to_vec(&entry).expect("entry serializes"),
            headers: vec![Header { name: "Content-Type".into(), value: "application/json".into() }],
        }])
    }
}

export!(Ledger);
