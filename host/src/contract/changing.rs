//! The change-in-progress mark of a contract record: a `setup --change-route` (or
//! `--rename-route`) run writes it beside the record before it moves anything, renews its
//! lease while it moves claims and queued messages, and clears it with the record it ends
//! with. A second run that finds a live mark of another run refuses, naming it; a mark whose
//! lease lapsed (its run died, or stopped and released it) is taken over by the next run,
//! which finishes the change or calls it off.

use std::time::Duration;

use async_nats::jetstream::kv::{self, Store};
use serde::{Deserialize, Serialize};

use super::{ContractError, ContractRecord, Lookup, RouteContract};

/// A contract change under way (`dedup-host setup --change-route`), stored beside the record
/// (field `changing`, which hosts that predate it ignore). The change writes it, by revision,
/// before it looks for serving hosts, and the record it ends with clears it: a host that
/// starts meanwhile reads it after it took its serving subscription ([`crate::presence`]),
/// so it is either seen by the change's probe or sees this and does not start the route.
/// A change that stopped part-way leaves it for the operator to see and finish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changing {
    /// The contract the change moves to.
    pub to: RouteContract,
    /// When the change began, in Unix milliseconds (kept by every run that takes it over).
    pub since_ms: u64,
    /// The run holding the mark; `None` in a mark written by a release that predates runs,
    /// which counts as lapsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<ChangeRun>,
}

/// One `setup --change-route` / `--rename-route` process holding a change mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRun {
    /// A random id of the run, unique per process start.
    pub id: String,
    /// The machine it runs on.
    pub host: String,
    /// The user that runs it.
    pub user: String,
    /// Its process id.
    pub pid: u32,
    /// When it started, in Unix milliseconds (its clock).
    pub started_ms: u64,
    /// Until when its lease holds unless renewed, in Unix milliseconds (its clock); 0 once
    /// the run stopped and released it.
    pub lease_until_ms: u64,
}

impl ChangeRun {
    /// This process, holding a lease of `lease` from now.
    pub fn this_process(lease: Duration) -> Self {
        let now = crate::claim::record::now_ms();
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let host = env("HOSTNAME")
            .or_else(|| {
                let name = std::fs::read_to_string("/etc/hostname").ok()?;
                Some(name.trim().to_string()).filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| "unknown".into());
        ChangeRun {
            id: format!("{:016x}", rand::random::<u64>()),
            host,
            user: env("USER")
                .or_else(|| env("LOGNAME"))
                .unwrap_or_else(|| "unknown".into()),
            pid: std::process::id(),
            started_ms: now,
            lease_until_ms: now + lease.as_millis() as u64,
        }
    }

    /// Whether the lease still holds at `now_ms`, allowing `skew` between the run's clock and
    /// the reader's (the claims' `clock_skew`).
    pub fn is_live(&self, now_ms: u64, skew: Duration) -> bool {
        now_ms < self.lease_until_ms.saturating_add(skew.as_millis() as u64)
    }

    /// The run in words: who, where, since when, and until when its lease holds.
    pub fn describe(&self, now_ms: u64) -> String {
        let lease = match self.lease_until_ms {
            0 => "its lease released".to_string(),
            until => format!("lease until {}", crate::times::when(until, now_ms)),
        };
        format!(
            "run `{}` of user `{}` on host `{}` (pid {}), started {}, {lease}",
            self.id,
            self.user,
            self.host,
            self.pid,
            crate::times::when(self.started_ms, now_ms)
        )
    }
}

impl Changing {
    /// The run holding this mark, while its lease is live at `now_ms` (see
    /// [`ChangeRun::is_live`]); `None` for a lapsed, released or older mark.
    pub fn live_run(&self, now_ms: u64, skew: Duration) -> Option<&ChangeRun> {
        self.run.as_ref().filter(|r| r.is_live(now_ms, skew))
    }
}

/// A contract record as stored: the record, and the change under way if any.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    record: ContractRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    changing: Option<Changing>,
}

/// The stored bytes of `record` with the change under way `changing`, if any.
pub fn encode(record: &ContractRecord, changing: Option<&Changing>) -> bytes::Bytes {
    let stored = Stored {
        record: record.clone(),
        changing: changing.cloned(),
    };
    serde_json::to_vec(&stored)
        .expect("record serializes")
        .into()
}

/// Whether the stored bytes `value` of a contract record carry a change under way.
pub fn is_marked(value: &[u8]) -> bool {
    serde_json::from_slice::<Stored>(value).is_ok_and(|s| s.changing.is_some())
}

/// [`super::lookup`], with the contract change under way that the record carries, if any.
pub async fn lookup_marked(
    store: &Store,
    route: &str,
) -> Result<(Lookup, Option<Changing>), ContractError> {
    let entry = store.entry(route).await.map_err(|e| ContractError::Store {
        route: route.to_string(),
        bucket: store.name.clone(),
        reason: e.to_string(),
    })?;
    Ok(match entry {
        None => (Lookup::Never, None),
        Some(entry) if entry.operation != kv::Operation::Put => {
            (Lookup::Deleted(entry.revision), None)
        }
        Some(entry) => match serde_json::from_slice::<Stored>(&entry.value) {
            Ok(stored) => (
                Lookup::Recorded(stored.record, entry.revision),
                stored.changing,
            ),
            Err(e) => (Lookup::Unreadable(entry.revision, e.to_string()), None),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract() -> RouteContract {
        let text = "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r.*\"\n";
        let path = std::path::Path::new("t.toml");
        let config = crate::config::Config::parse(text, path, std::env::temp_dir()).expect("valid");
        super::super::of(&config, &config.routes[0])
    }

    #[test]
    fn a_change_mark_travels_beside_the_record_and_older_readers_ignore_it() {
        let record = ContractRecord {
            contract: contract(),
            recorded_by: "setup".into(),
            recorded_ms: 1,
            deployment: Some("d".into()),
            consumer: None,
            subjects: None,
        };
        let mark = Changing {
            to: contract(),
            since_ms: 7,
            run: Some(ChangeRun::this_process(Duration::from_secs(30))),
        };
        let bytes = encode(&record, Some(&mark));
        assert!(is_marked(&bytes));
        let stored: Stored = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            (stored.record, stored.changing),
            (record.clone(), Some(mark))
        );
        let plain: ContractRecord = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            plain, record,
            "a host that predates the mark reads the record"
        );
        assert!(!is_marked(&encode(&record, None)));
    }

    #[test]
    fn a_mark_is_live_only_while_its_run_holds_the_lease() {
        let run = ChangeRun::this_process(Duration::from_secs(30));
        let older = Changing {
            to: contract(),
            since_ms: 1,
            run: None,
        };
        let skew = Duration::from_secs(2);
        let now = run.started_ms;
        assert_eq!(
            older.live_run(now, skew),
            None,
            "a mark without a run lapsed"
        );
        let held = Changing {
            run: Some(run.clone()),
            ..older.clone()
        };
        assert_eq!(held.live_run(now, skew), Some(&run));
        let after = run.lease_until_ms + 2_000;
        assert_eq!(held.live_run(after - 1, skew), Some(&run), "skew allowed");
        assert_eq!(held.live_run(after, skew), None);
        let text = run.describe(now);
        assert!(
            text.contains(&run.id) && text.contains(&run.host) && text.contains("lease until"),
            "{text}"
        );
        // A mark written before runs were recorded (no `run`) still parses, as lapsed.
        let mut before = serde_json::to_value(&older).unwrap();
        assert!(before.get("run").is_none(), "{before}");
        before["since_ms"] = 3.into();
        let parsed: Changing = serde_json::from_value(before).unwrap();
        assert_eq!((parsed.since_ms, parsed.run), (3, None));
    }
}
