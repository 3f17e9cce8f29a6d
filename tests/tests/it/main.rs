//! dedup-host's integration tests: one binary, one module per capability.

mod attempts;
mod auth;
mod authoring;
mod boundary;
mod chaos;
mod cli_invoke;
mod cluster;
mod config;
mod conformance;
mod dedup;
mod exclusive;
mod failures;
mod fairness;
mod forever;
mod hotload;
mod lifecycle;
mod limits;
mod operations;
mod ownership;
mod provision;
mod reload;
mod repairs;
mod runtime;
mod sandbox;
mod structure;
mod takeover;
