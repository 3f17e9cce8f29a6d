//! Versions in a simulated host's deliveries (issue 42, finding 8): the version the host's
//! split chooses for a key ([`candidate::runs_key`], over what the host runs now:
//! [`Components::view`]), the version a claim runs ([`pinned::version`]: the one that began
//! the key's effects, if installed here; what becomes of a claim whose pinned version is not
//! is decided by the host's `before::run`, over [`super::running::SimRun`]), all the host's
//! own functions; and a shadow candidate's run beside the live version, whose outputs are
//! compared and thrown away.
//!
//! [`Components::view`]: super::world::Components::view

use dedup_delivery::pinned::{self, Gone, Pinned};
use dedup_host::candidate::{self, Mode as Split};

use super::ctx::Ctx;
use super::handler::Handler;
use super::running::SimRun;
use super::world::Version;

impl Ctx {
    /// The version this host's split runs `key` on now: its canary candidate for the keys
    /// the host's own split gives it ([`candidate::runs_key`]), else its live version. A
    /// shadow takes no key: one that did is a violation.
    pub(super) fn chosen(&self, key: &str) -> String {
        let (chosen, shadow) = {
            let w = self.world();
            let view = w.components.view(self.host);
            match &view.candidate {
                Some((digest, split)) if candidate::runs_key(split, true, key) => {
                    (digest.clone(), matches!(split, Split::Shadow { .. }))
                }
                _ => (view.live.clone(), false),
            }
        };
        if shadow {
            self.violation(format!(
                "h{}'s split runs {key} on {chosen}, a shadow candidate: its effects would be stored",
                self.host
            ));
        }
        chosen
    }

    /// Pins claimed delivery `run` (made with the version the split chose) as the host does
    /// ([`pinned::version`]): it runs the version its claim names, if installed here; else
    /// it names that version as not installed ([`pinned::Gone`]), and the host's own
    /// [`before::run`] settles it ([`pinned::settle_missing`]: whether the bucket still offers
    /// that version is read from the model's components, unless the host is cut off from the
    /// server) once it is not superseded.
    ///
    /// [`before::run`]: dedup_delivery::before::run
    pub(super) async fn pin(&self, run: &mut SimRun<'_>) {
        let claimed = run.lease.digest().await;
        let installed = |digest: &str| {
            let w = self.world();
            let here = w.components.view(self.host).installed(digest);
            here.then(|| digest.to_string())
        };
        let chosen = run.version.clone();
        match pinned::version(chosen, String::as_str, &claimed, installed) {
            Pinned::Run(version) => run.version = version,
            Pinned::Gone(_) => {
                run.gone = Some(Gone {
                    reason: pinned::gone("r", &run.at.key, &claimed),
                    digest: claimed,
                    delivered: run.at.number,
                })
            }
        }
    }

    /// Whether the components bucket still offers version `digest` (its live version or the
    /// candidate), read as the host reads it: unless the host is cut off from the server.
    pub(super) async fn offered(&self, digest: &str) -> Result<bool, String> {
        match self.reaches_server().await {
            true => Ok(self.world().components.versions.installed(digest)),
            false => Err("timed out: cut off from the server".to_string()),
        }
    }

    /// A run of `key`'s `handler` on version `version`: on a host running a shadow
    /// candidate beside that live version, the candidate runs too (off the message path, as
    /// the host's shadow runs do), its outputs compared and thrown away: made as a shadow's,
    /// so that one stored would show.
    pub(super) fn shadow(&self, key: &str, handler: Handler, version: &str) {
        let candidate = {
            let w = self.world();
            let view = w.components.view(self.host);
            match &view.candidate {
                Some((digest, Split::Shadow { .. })) if view.live == version => {
                    Some(digest.clone())
                }
                _ => None,
            }
        };
        let Some(digest) = candidate else {
            return;
        };
        let made = Version {
            digest,
            shadow: true,
        };
        let outputs = self.outputs(key, handler, made);
        let mut w = self.world();
        w.components.shadow_runs += 1;
        w.log(|| {
            format!(
                "h{} shadow-runs {key} on {}: {} outputs compared and thrown away",
                self.host,
                outputs.version.digest,
                outputs.list.len()
            )
        });
    }
}
