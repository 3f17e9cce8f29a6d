use std::collections::HashMap;
use std::sync::Mutex;

use super::*;

/// Records in memory, refusing writes once `fenced`.
#[derive(Default)]
struct Memory {
    records: Mutex<HashMap<u32, CallRecord>>,
    fenced: std::sync::atomic::AtomicBool,
}

impl CallStore for Memory {
    fn read(&self, index: u32) -> StoreFuture<'_, Option<CallRecord>> {
        let found = self.records.lock().unwrap().get(&index).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn write(&self, record: CallRecord) -> StoreFuture<'_, ()> {
        let fenced = self.fenced.load(std::sync::atomic::Ordering::Relaxed);
        if !fenced {
            self.records.lock().unwrap().insert(record.index, record);
        }
        Box::pin(async move {
            match fenced {
                true => Err(JournalError::Fenced),
                false => Ok(()),
            }
        })
    }
}

fn post(body: &str) -> CallRequest {
    CallRequest::new("post", "http://127.0.0.1:9/hooks", body.as_bytes())
}

fn answer() -> RecordedResponse {
    RecordedResponse {
        status: 201,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: b"ok".to_vec(),
    }
}

#[tokio::test]
async fn a_first_call_is_recorded_pending_then_replayed_once_sent() {
    let store = Arc::new(Memory::default());
    let journal = Journal::new(store.clone(), "r.k.a", OnUnknown::Resend);
    assert_eq!(journal.begin(0, &post("x")).await, Ok(Begin::Send));
    journal.pending(0, &post("x"), 1).await.unwrap();
    let pending = store.records.lock().unwrap()[&0].clone();
    assert_eq!(pending.state, CallState::Pending);
    assert_eq!(pending.idempotency_key, "r.k.a.call.0");
    journal.sent(0, &post("x"), answer(), 2).await.unwrap();
    let again = Journal::new(store.clone(), "r.k.a", OnUnknown::Fail);
    assert_eq!(
        again.begin(0, &post("x")).await,
        Ok(Begin::Replay(answer()))
    );
}

#[tokio::test]
async fn a_pending_call_is_resent_or_stopped_as_the_route_says() {
    let store = Arc::new(Memory::default());
    let journal = Journal::new(store.clone(), "r.k.a", OnUnknown::Resend);
    journal.pending(0, &post("x"), 1).await.unwrap();
    assert_eq!(journal.begin(0, &post("x")).await, Ok(Begin::Send));
    let failing = Journal::new(store, "r.k.a", OnUnknown::Fail);
    match failing.begin(0, &post("x")).await {
        Ok(Begin::Stop(reason)) => {
            assert!(reason.contains("outcome unknown"), "{reason}");
            assert!(reason.contains("call 0"), "{reason}");
        }
        other => panic!("expected a stop, got {other:?}"),
    }
}

#[tokio::test]
async fn a_different_request_at_a_recorded_index_is_named_as_non_determinism() {
    let store = Arc::new(Memory::default());
    let journal = Journal::new(store.clone(), "r.k.a", OnUnknown::Resend);
    journal.pending(0, &post("x"), 1).await.unwrap();
    journal.sent(0, &post("x"), answer(), 2).await.unwrap();
    match journal.begin(0, &post("y")).await {
        Ok(Begin::Stop(reason)) => {
            assert!(reason.contains("not deterministic"), "{reason}");
            assert!(reason.contains("outbound call 0"), "{reason}");
        }
        other => panic!("expected a stop, got {other:?}"),
    }
}

#[tokio::test]
async fn a_fenced_store_refuses_the_pending_record() {
    let store = Arc::new(Memory::default());
    store
        .fenced
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let journal = Journal::new(store, "r.k.a", OnUnknown::Resend);
    assert_eq!(
        journal.pending(0, &post("x"), 1).await,
        Err(JournalError::Fenced)
    );
}

#[test]
fn records_round_trip_with_their_body() {
    let record = CallRecord {
        index: 2,
        state: CallState::Sent,
        method: "POST".into(),
        url: "http://h/p".into(),
        body_digest: post("x").body_digest,
        idempotency_key: idempotency_key("r.k.a", 2),
        at_ms: 5,
        response: Some(answer()),
        token: Some(9),
    };
    assert_eq!(CallRecord::from_bytes(&record.to_bytes()).unwrap(), record);
}

#[tokio::test]
async fn a_replay_only_journal_replays_answers_and_refuses_every_other_call() {
    let store = Arc::new(Memory::default());
    let live = Journal::new(store.clone(), "r.k.a", OnUnknown::Resend);
    live.pending(0, &post("x"), 1).await.unwrap();
    live.sent(0, &post("x"), answer(), 2).await.unwrap();
    live.pending(1, &post("x"), 3).await.unwrap();
    let shadow = Journal::new(store.clone(), "r.k.a", OnUnknown::Resend).replay_only();
    assert_eq!(
        shadow.begin(0, &post("x")).await,
        Ok(Begin::Replay(answer()))
    );
    for (index, body) in [(0, "y"), (1, "x"), (2, "x")] {
        match shadow.begin(index, &post(body)).await {
            Ok(Begin::Refuse(_)) => {}
            other => panic!("call {index} of a shadow must be refused, got {other:?}"),
        }
    }
    assert_eq!(
        shadow.pending(2, &post("x"), 4).await,
        Err(JournalError::ReplayOnly)
    );
    assert!(!store.records.lock().unwrap().contains_key(&2));
}
