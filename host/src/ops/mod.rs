//! What operators use: the HTTP endpoints of a running host ([`endpoints`]) and the commands
//! that read a deployment's streams and buckets: one key's story ([`story`]), dead letters
//! ([`letters`]) and the cross-layer reconciliation ([`audit`]), all built on [`crate::scan`].

pub mod audit;
pub mod endpoints;
pub mod letters;
pub mod story;
