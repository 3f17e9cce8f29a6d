//! dedup-host's integration tests: one binary, one module per capability.

mod auth;
mod cli_invoke;
mod config;
mod conformance;
mod dedup;
mod failures;
mod hotload;
mod limits;
mod runtime;
mod sandbox;
mod takeover;
