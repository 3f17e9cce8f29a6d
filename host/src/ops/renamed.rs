//! Replaying a dead letter of a route that was renamed (`setup --rename-route OLD NEW`): the
//! letter names `OLD` (its route and claim-key headers), but the message it republishes is
//! consumed by `NEW`, whose claim of the key is the one that decides whether it runs.
//! Resetting `OLD`'s record would run nothing (the copy under `NEW` stays failed for good).
//!
//! A rename leaves its mark in every record it copies: `outputs_as` (the old claim key, its
//! outputs' ids) and `calls_as` (the same, for its calls' idempotency keys; carried by every
//! later claim of the key, and kept from the first name through a chain of renames). So the
//! route a letter of `OLD` is replayed against is the route of this config whose record of
//! the same key names the letter's claim key there: found by the records themselves, in
//! this deployment's claim stores, whatever the name and however many renames since.

use super::claims::{Claim, Claims};
use crate::config::Config;

/// Where a letter's key is reset before its message is published again.
pub(super) enum Target {
    /// The letter's own route: this config names it (or the letter names no key).
    Own,
    /// The route the letter's route was renamed to, with its claim of the letter's key.
    Renamed {
        /// The route's name now.
        to: String,
        /// Its claim of the key.
        claim: Box<Claim>,
    },
    /// No route of this config holds the key renamed from the letter's route: why, in
    /// words (the letter is refused: nothing would run its key).
    Gone(String),
}

/// Where the key of a dead letter of route `old`, first stored on `subject` under claim key
/// `claim_key`, is replayed (see the module documentation). Takes the letter's parts, not
/// the letter: `super::letters` lists letters with this, so this module does not import it.
pub(super) async fn target(
    claims: &mut Claims,
    config: &Config,
    (old, subject, claim_key): (&str, &str, Option<String>),
) -> anyhow::Result<Target> {
    if old.is_empty() || config.routes.iter().any(|r| r.name == old) {
        return Ok(Target::Own);
    }
    let Some(old_key) = claim_key else {
        return Ok(Target::Own);
    };
    // `<route>.k.<key>`: the same key under another route's name.
    let suffix = &old_key[old.len()..];
    let mut found = Vec::new();
    let mut unread = Vec::new();
    // Only a route that consumes the letter's subject can run it: a route of another name
    // whose record merely looks renamed (another deployment's claims in a shared bucket) is
    // never reset for a message it would not see.
    let consuming = config
        .routes
        .iter()
        .filter(|r| crate::subject::matches(&r.subject, subject));
    for route in consuming {
        let claim_key = format!("{}{suffix}", route.name);
        match claims.get(&route.name, &claim_key).await {
            Ok(claim) => {
                let renamed = claim.record.as_ref().is_some_and(|(r, _)| {
                    r.outputs_as.as_deref() == Some(old_key.as_str())
                        || r.calls_as.as_deref() == Some(old_key.as_str())
                });
                if renamed {
                    found.push((route.name.clone(), claim));
                }
            }
            Err(e) => unread.push(format!("route `{}`: {e:#}", route.name)),
        }
    }
    if found.len() > 1 {
        let names: Vec<String> = found.iter().map(|(n, _)| format!("`{n}`")).collect();
        return Ok(Target::Gone(format!(
            "route `{old}` is not in this config, and routes {} each hold key `{old_key}` renamed from it: cannot tell which one runs it; replay with a config that names only one of them",
            names.join(", ")
        )));
    }
    if let Some((to, claim)) = found.pop() {
        return Ok(Target::Renamed {
            to,
            claim: Box::new(claim),
        });
    }
    let unread = match unread.is_empty() {
        true => String::new(),
        false => format!(" (not read: {})", unread.join("; ")),
    };
    Ok(Target::Gone(format!(
        "route `{old}` is not in this config, and no route of it holds key `{old_key}` renamed from `{old}` (a rename keeps the old claim key in each record it copies){unread}: nothing would run the key, so it is not replayed; replay it with the config that names `{old}`, or, if the route was renamed, with the config that names its new name once `dedup-host setup --rename-route {old} <new>` has run"
    )))
}
