//! Example handler: validates a JSON balance adjustment and emits the ledger entry.
//!
//! Input: `{"account": "acc-1", "amount": -250, "transaction_id": "tx-9"}` (amount in minor
//! units). Malformed input is rejected (dead-lettered) with the reason; a valid adjustment
//! yields one output on `ledger.entries.<account>`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

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
}

struct Ledger;

impl Guest for Ledger {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let adj: Adjustment = serde_json::from_slice(&event.payload)
            .map_err(|e| Failure::Reject(format!("malformed adjustment: {e}")))?;
        if adj.account.is_empty() || !adj.account.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(Failure::Reject(format!(
                "malformed adjustment: account `{}` must be non-empty and use only [A-Za-z0-9_-]",
                adj.account
            )));
        }
        if adj.amount == 0 {
            return Err(Failure::Reject("malformed adjustment: amount must not be zero".into()));
        }
        let entry = Entry {
            account: &adj.account,
            amount: adj.amount,
            transaction_id: &adj.transaction_id,
            idempotency_key: &event.key,
            fencing_token: event.fencing_token,
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
            subject: format!("ledger.entries.{}", adj.account),
            payload: serde_json::to_vec(&entry).expect("entry serializes"),
            headers: vec![Header { name: "Content-Type".into(), value: "application/json".into() }],
        }])
    }
}

export!(Ledger);
