//! The record-or-read step of a route's contract over an in-memory store.

use std::sync::Mutex;

use super::*;

/// One route's key: its history of writes, `None` a deletion; `raced` writes lose first.
#[derive(Default)]
struct Memory {
    key: Mutex<Key>,
}

#[derive(Default)]
struct Key {
    history: Vec<Option<&'static str>>,
    changing: Option<u64>,
    raced: usize,
    writes: Vec<(&'static str, u64)>,
}

impl Memory {
    fn with(history: &[Option<&'static str>], changing: Option<u64>) -> Self {
        let key = Key {
            history: history.to_vec(),
            changing,
            ..Key::default()
        };
        Self {
            key: Mutex::new(key),
        }
    }
}

impl ContractStore for Memory {
    type Record = &'static str;
    type Error = ();

    async fn get(&self, _: &str) -> Result<Found<&'static str>, ()> {
        let key = self.key.lock().unwrap();
        let revision = key.history.len() as u64;
        Ok(match key.history.last() {
            None => Found::Never,
            Some(None) => Found::Deleted(revision),
            Some(Some("garbage")) => Found::Unreadable {
                revision,
                reason: "not json".into(),
            },
            Some(Some(record)) => Found::Recorded {
                record,
                revision,
                changing: key.changing,
            },
        })
    }

    async fn update(&self, _: &str, record: &&'static str, revision: u64) -> Result<Written, ()> {
        let mut key = self.key.lock().unwrap();
        key.writes.push((record, revision));
        if key.raced > 0 {
            key.raced -= 1;
            key.history.push(Some("theirs"));
            return Ok(Written::Raced);
        }
        if key.history.len() as u64 != revision {
            return Ok(Written::Raced);
        }
        key.history.push(Some(record));
        Ok(Written::Written)
    }
}

const HOST: Writer = Writer::Host {
    holds_wanted: false,
};

#[tokio::test]
async fn a_route_never_set_up_gets_the_writers_contract_recorded_over_revision_zero() {
    for writer in [Writer::Setup, HOST] {
        let store = Memory::default();
        let settled = settle(&store, "r", writer, || "mine").await;
        assert_eq!(settled, Ok(Settled::Recorded), "{writer:?}");
        assert_eq!(store.key.lock().unwrap().writes, [("mine", 0)]);
    }
}

#[tokio::test]
async fn a_recorded_contract_is_found_not_written() {
    let store = Memory::with(&[Some("theirs")], None);
    let settled = settle(&store, "r", HOST, || "mine").await;
    let found = Settled::Found {
        record: "theirs",
        changing: None,
    };
    assert_eq!(settled, Ok(found));
    assert!(store.key.lock().unwrap().writes.is_empty());
}

#[tokio::test]
async fn a_change_under_way_keeps_a_host_out_but_not_set_up() {
    let store = Memory::with(&[Some("theirs")], Some(7));
    let host = settle(&store, "r", HOST, || "mine").await.unwrap();
    assert_eq!(
        host,
        Settled::Found {
            record: "theirs",
            changing: Some(7)
        }
    );
    let setup = settle(&store, "r", Writer::Setup, || "mine").await.unwrap();
    assert_eq!(
        setup,
        Settled::Found {
            record: "theirs",
            changing: None
        }
    );
}

#[tokio::test]
async fn a_host_never_records_over_a_deleted_contract() {
    let store = Memory::with(&[Some("old"), None], None);
    assert_eq!(
        settle(&store, "r", HOST, || "mine").await,
        Ok(Settled::Deleted)
    );
    let holds = Writer::Host { holds_wanted: true };
    assert_eq!(
        settle(&store, "r", holds, || "mine").await,
        Ok(Settled::Held)
    );
    assert!(store.key.lock().unwrap().writes.is_empty(), "never written");
    assert_eq!(
        settle(&store, "r", Writer::Setup, || "mine").await,
        Ok(Settled::Recorded)
    );
    assert_eq!(
        store.key.lock().unwrap().writes,
        [("mine", 2)],
        "set-up writes over the deletion's revision"
    );
}

#[tokio::test]
async fn only_set_up_records_over_an_unreadable_record() {
    let store = Memory::with(&[Some("garbage")], None);
    assert_eq!(
        settle(&store, "r", HOST, || "mine").await,
        Ok(Settled::Unreadable("not json".into()))
    );
    assert_eq!(
        settle(&store, "r", Writer::Setup, || "mine").await,
        Ok(Settled::Recorded)
    );
}

#[tokio::test]
async fn a_lost_race_reads_again_and_finds_the_winners_record() {
    let store = Memory::default();
    store.key.lock().unwrap().raced = 1;
    let settled = settle(&store, "r", HOST, || "mine").await;
    assert_eq!(
        settled,
        Ok(Settled::Found {
            record: "theirs",
            changing: None
        })
    );
}

#[tokio::test]
async fn writes_that_keep_losing_end_exhausted() {
    let store = Memory::with(&[Some("old"), None], None);
    store.key.lock().unwrap().raced = TRIES;
    // Every race leaves a deletion behind, so the next read finds one again.
    struct Deleting(Memory);
    impl ContractStore for Deleting {
        type Record = &'static str;
        type Error = ();
        async fn get(&self, r: &str) -> Result<Found<&'static str>, ()> {
            {
                let mut key = self.0.key.lock().unwrap();
                if key.history.last() == Some(&Some("theirs")) {
                    key.history.push(None);
                }
            }
            self.0.get(r).await
        }
        async fn update(&self, r: &str, rec: &&'static str, rev: u64) -> Result<Written, ()> {
            self.0.update(r, rec, rev).await
        }
    }
    let store = Deleting(store);
    let settled = settle(&store, "r", Writer::Setup, || "mine").await;
    assert_eq!(settled, Ok(Settled::Exhausted));
    assert_eq!(store.0.key.lock().unwrap().writes.len(), TRIES);
}

#[test]
fn a_change_under_way_counts_only_for_a_record_that_agrees() {
    let found = |changing| Settled::Found {
        record: "theirs",
        changing,
    };
    let judge = |r: &&str| match *r {
        "mine" => Ok(()),
        _ => Err(Comparison::Differs),
    };
    assert_eq!(
        found(Some(7)).verdict(judge),
        Verdict::Refused(Comparison::Differs),
        "a config refused for itself learns why"
    );
    let agreeing = Settled::Found {
        record: "mine",
        changing: Some(7),
    };
    assert_eq!(agreeing.verdict(judge), Verdict::Changing(7));
    assert_eq!(
        Verdict::Changing::<Comparison>(7).comparison(),
        Some(Comparison::Changing)
    );
    assert_eq!(
        found(None).verdict(judge).comparison(),
        Some(Comparison::Differs)
    );
    for settled in [Settled::Recorded, Settled::Held] {
        assert_eq!(
            settled.verdict(judge).comparison(),
            Some(Comparison::Agrees)
        );
    }
    assert_eq!(
        Settled::<&str>::Deleted.verdict(judge).comparison(),
        Some(Comparison::Deleted)
    );
    assert_eq!(Settled::<&str>::Exhausted.verdict(judge).comparison(), None);
    assert_eq!(
        Settled::<&str>::Unreadable("x".into())
            .verdict(judge)
            .comparison(),
        None
    );
}
