//! The operator's replay of every dead letter after a fix, as a model event (`dead-letters
//! replay --all`).

use dedup_host::claim::record::virtual_clock;

use super::{space, Hosts};

impl Hosts {
    /// An operator replays every dead letter after fixing the handler (`dead-letters replay`):
    /// each key's record is reset ([`ClaimRecord::reset_for_replay`]) and its message
    /// published again. Returns how many were replayed.
    ///
    /// [`ClaimRecord::reset_for_replay`]: dedup_host::claim::ClaimRecord::reset_for_replay
    pub fn replay(&mut self) -> usize {
        let mut w = self.world.lock().expect("one thread");
        let space = space(&w);
        // A letter of an earlier name replays under the route's name now (`ops::renamed`).
        let space = format!("{space}{}", w.route);
        let mut keys = w.dead_letters.clone();
        keys.sort();
        keys.dedup();
        let mut replayed = 0;
        for (letter, key) in keys.iter().enumerate() {
            let mut fresh_from = 0;
            if let Some((mut record, revision)) = w.record(&format!("{space}{key}")).cloned() {
                // A key whose effects a version now gone began waits for the operator's
                // choice its letter names (reinstall that version, or delete the key).
                let gone = (record.effects_by.as_ref())
                    .is_some_and(|v| !w.components.versions.installed(v));
                if !record.replayable() || gone {
                    continue;
                }
                virtual_clock::set(Some(w.now));
                record.reset_for_replay(letter as u64 + 1);
                virtual_clock::set(None);
                match w.operator_update(&format!("{space}{key}"), &record, revision) {
                    Some(reset) => {
                        fresh_from = reset;
                        w.lag_replay(&format!("{space}{key}"), reset);
                    }
                    None => continue,
                }
            }
            let entity = w
                .streams
                .source
                .iter()
                .find(|m| m.key == *key)
                .map(|m| m.entity.clone())
                .unwrap_or_default();
            let now = w.now;
            let sequence = w.streams.publish(key, &entity, now, fresh_from);
            w.replayed.insert(key.clone());
            w.log(|| format!("replay {key} as source message {sequence}"));
            replayed += 1;
        }
        replayed
    }
}
