//! The modes of a route's effects and claims: which routes commit fenced effects and on which
//! stream (docs/src/how/fenced.md), and where claim-after is allowed.

use std::time::Duration;

use super::{ClaimMode, Config, DedupMode, EffectsMode, OutputStreamConfig, RouteConfig};

/// The longest deadline a claim-after route may have: a re-run repeats the whole work.
pub const MAX_CLAIM_AFTER_DEADLINE: Duration = Duration::from_secs(5);
use crate::subject;

impl Config {
    /// The fenced output stream a route with `effects = "fenced"` commits to: the one whose
    /// subjects cover every filter of its `allowed_outputs` (an atomic batch reaches one
    /// stream only). `None` for a window route, or when no such stream is configured.
    pub fn fenced_stream(&self, route: &RouteConfig) -> Option<&OutputStreamConfig> {
        if route.effects != EffectsMode::Fenced || route.allowed_outputs.is_empty() {
            return None;
        }
        self.output_streams.iter().find(|o| {
            o.effects == EffectsMode::Fenced
                && route
                    .allowed_outputs
                    .iter()
                    .all(|f| o.subjects.iter().any(|s| subject::covers(s, f)))
        })
    }

    /// Whether some route that relies on the duplicate window (not fenced) may publish to a
    /// stream capturing `subjects`: only then does that stream's window matter.
    pub fn window_route_reaches(&self, subjects: &[String]) -> bool {
        self.routes.iter().any(|r| {
            self.fenced_stream(r).is_none()
                && r.allowed_outputs
                    .iter()
                    .any(|f| subjects.iter().any(|s| subject::overlaps(f, s)))
        })
    }

    /// Checks the fenced routes and streams; `check(ok, field, message)` records a problem.
    pub(super) fn validate_effects(&self, check: &mut dyn FnMut(bool, String, String)) {
        for (i, o) in self.output_streams.iter().enumerate() {
            if o.effects != EffectsMode::Fenced {
                continue;
            }
            check(
                o.dedup != DedupMode::Forever,
                format!("output_streams[{i}].dedup"),
                format!("stream `{}` cannot be both `dedup = \"forever\"` and `effects = \"fenced\"` (claim records need more than one message per subject): pick one", o.name),
            );
        }
        for (i, r) in self.routes.iter().enumerate() {
            if r.claim == ClaimMode::After {
                let field = format!("routes[{i}].claim");
                let d = r.limits.deadline;
                check(r.effects == EffectsMode::Window, field.clone(), format!("route `{}`: claim = \"after\" has no claim to fence; use effects = \"window\" with it, or claim = \"before\" with fenced effects", r.name));
                check(r.exclusive_by.is_none(), field.clone(), format!("route `{}`: claim = \"after\" cannot hold an entity exclusively; use claim = \"before\" with exclusive_by", r.name));
                check(d <= MAX_CLAIM_AFTER_DEADLINE, field.clone(), format!("route `{}`: claim = \"after\" re-runs the whole handler when two hosts race, so it is for cheap handlers: limits.deadline is {d:?}, at most {MAX_CLAIM_AFTER_DEADLINE:?} is allowed; use claim = \"before\" for OCR, model calls and other long work", r.name));
                check(self.source.ack_wait > d, field, format!("route `{}`: claim = \"after\" sends no progress acks, so source.ack_wait ({:?}) must exceed limits.deadline ({d:?}) or every slow message is delivered twice while it runs", r.name, self.source.ack_wait));
            }
            if r.effects != EffectsMode::Fenced {
                continue;
            }
            let field = format!("routes[{i}].effects");
            if r.allowed_outputs.is_empty() {
                check(false, field, format!("route `{}` is fenced but has no `allowed_outputs`: its claim records live beside its outputs, in the fenced output stream that captures them; list the output subjects, or use effects = \"window\"", r.name));
                continue;
            }
            check(
                self.fenced_stream(r).is_some(),
                field,
                format!(
                    "route `{}` is fenced, but no `[[output_streams]]` entry with effects = \"fenced\" captures all of its allowed_outputs {:?} (an atomic batch reaches one stream): add `effects = \"fenced\"` to the output stream that captures them, or use effects = \"window\" for outputs going to streams the host does not own",
                    r.name, r.allowed_outputs
                ),
            );
        }
    }
}
