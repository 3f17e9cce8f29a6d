//! What operators use: the HTTP endpoints of a running host ([`endpoints`]) and the commands
//! that read a deployment's streams and buckets: one key's story ([`story`]), dead letters
//! ([`letters`]) and the cross-layer reconciliation ([`audit`]), all built on [`crate::scan`];
//! [`calls`] reads a key's journaled outbound calls; [`claims`] finds where a route's claims
//! live (its contract first), [`replay`] replays letters, [`waiting`] finds where a route's
//! unsettled source messages begin.

pub mod audit;
pub mod calls;
pub mod claims;
pub mod endpoints;
pub mod letters;
pub mod renamed;
pub mod replay;
pub mod story;
pub mod waiting;
