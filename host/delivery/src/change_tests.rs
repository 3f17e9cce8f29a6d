//! A contract change's decisions and its move of claim records over in-memory stores.

use futures::FutureExt as _;

use super::*;
use crate::claim::memory::MemoryClaimStore;
use crate::claim::record::sample;

const WINDOW_TO_FENCED: Claims<'static> = Claims {
    from: "bucket claims",
    to: "stream OUT",
    window_to_fenced: true,
};

const BUCKET_TO_BUCKET: Claims<'static> = Claims {
    from: "bucket claims",
    to: "bucket claims-next",
    window_to_fenced: false,
};

fn none(_: &str) -> bool {
    false
}

fn records() -> Vec<(String, ClaimRecord)> {
    vec![
        ("r.done".into(), sample(ClaimState::Completed, false)),
        ("r.open".into(), sample(ClaimState::Failed, false)),
        ("r.running".into(), sample(ClaimState::InProgress, false)),
        ("r.dead".into(), sample(ClaimState::Failed, true)),
    ]
}

#[test]
fn every_record_moves_between_any_two_stores_settled_or_not() {
    let copies = plan(records(), BUCKET_TO_BUCKET, &none, "change").unwrap();
    let keys: Vec<&str> = copies.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(keys, ["r.done", "r.open", "r.running", "r.dead"]);
    assert!(copies.iter().all(|c| !c.accepted));
}

#[test]
fn window_to_fenced_is_refused_while_a_key_is_open_naming_it() {
    let refused = plan(records(), WINDOW_TO_FENCED, &none, "change").unwrap_err();
    assert_eq!(
        refused,
        Refused::Unsettled {
            count: 2,
            keys: vec!["r.open".into(), "r.running".into()]
        }
    );
}

#[test]
fn a_key_dead_after_its_outputs_moves_to_fenced_only_accepted_and_marked() {
    let mut dead = sample(ClaimState::Failed, true);
    dead.unknown_effects = true;
    let records = vec![("r.dead".to_string(), dead)];
    let refused = plan(records.clone(), WINDOW_TO_FENCED, &none, "c").unwrap_err();
    assert!(matches!(refused, Refused::DeadWithEffects { count: 1, .. }));
    let accepts = |k: &str| k == "r.dead";
    let copies = plan(records, WINDOW_TO_FENCED, &accepts, "c").unwrap();
    assert!(copies[0].accepted && copies[0].record.is_accepted_dead());
}

#[test]
fn a_copy_writes_over_an_older_record_and_not_over_the_same_one() {
    let to = MemoryClaimStore::new();
    let done = sample(ClaimState::Completed, false);
    let open = sample(ClaimState::Failed, false);
    let copy = |r: &ClaimRecord| copy_record(&to, "k", r).now_or_never().unwrap().unwrap();
    assert!(copy(&open), "created");
    assert!(copy(&done), "written over the older record");
    assert!(!copy(&done), "already there");
    let (there, _) = to.get("k").now_or_never().unwrap().unwrap().unwrap();
    assert_eq!(there, done);
}

#[test]
fn a_run_records_changes_calls_off_or_leaves_the_record() {
    assert_eq!(run(false, false, true), Run::Record);
    assert_eq!(run(true, true, false), Run::Unchanged);
    assert_eq!(run(true, true, true), Run::CallOff);
    assert_eq!(run(true, false, true), Run::Change);
    assert_eq!(run(true, false, false), Run::Change);
}

#[test]
fn only_a_first_run_refused_before_moving_clears_its_mark() {
    assert_eq!(stop(false, true, true), Stop::Clear);
    assert_eq!(stop(false, true, false), Stop::Release);
    assert_eq!(stop(false, false, true), Stop::Release);
    assert_eq!(stop(true, true, true), Stop::Leave);
}

#[test]
fn evidence_names_each_serving_host_once_with_every_fact() {
    let status = vec!["h1".to_string(), "h2".to_string()];
    let lines = evidence(Some("h1"), &status);
    assert_eq!(
        lines,
        [
            "host `h1` answered that it serves it and its status says so",
            "host `h2`'s status says it serves it"
        ]
    );
    assert!(evidence(None, &[]).is_empty());
}
