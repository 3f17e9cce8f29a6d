//! dedup-host: a WebAssembly plugin host for dedup-guarded NATS JetStream message handlers.
//!
//! Where things live: below this crate, `dedup-delivery` (`host/delivery`: the delivery logic,
//! free of the NATS client and wasmtime) and `dedup-runtime` (`host/runtime`: the wasmtime
//! engine, loading, validating and invoking components, the imports guests may call, limits),
//! re-exported here as [`runtime`], [`bindings`], [`host_api`], [`limits`], [`subject`] and
//! [`text`] so that paths inside the host read as before. In this crate:
//! - [`cli`]: the `dedup-host` command line.
//! - [`serve`]: a host's life (connect, set up, start, reload routes, drain, stop), the one module that knows
//!   both the [`pipeline`] (processing deliveries) and the [`components`] sources (finding and
//!   installing versions, read from the object store with [`objects`]); both work on the
//!   routing table in [`routes`].
//! - [`claim`]: the claim protocol on NATS KV; [`setup`]: streams, consumers and buckets
//!   ([`capture`]: which streams capture a subject);
//!   [`ownership`]: which deployment owns them; [`rename`]: renaming a route.
//! - [`metrics`], [`health`], [`logging`]: what a running host tells operators; [`ops`]: the
//!   endpoints that serve it and the commands that read a deployment (inspect, dead letters,
//!   audit); [`console`]: the web console over a whole deployment, fed by each host's
//!   [`feed`], its changes recorded in [`activity`].
//! - [`permissions`]: the least-privilege NATS permissions of each role; [`refusals`]: the
//!   subjects the server refused, named in errors.

#![warn(missing_docs)]

pub use dedup_delivery::{subject, text};
pub use dedup_runtime as runtime;
pub use dedup_runtime::{bindings, cpu, durations, host_api, limits, size};

pub mod activity;
pub mod candidate;
pub mod capture;
pub mod cases;
pub mod claim;
pub mod cli;
pub mod components;
pub mod config;
pub mod connect;
pub mod console;
pub mod consumer_limit;
pub mod consumers;
pub mod contract;
pub mod contract_change;
pub mod dev;
pub mod exclusive;
pub mod feed;
pub mod fenced;
pub mod forever;
pub mod health;
pub mod idempotency;
pub mod inspect;
pub mod kv_keys;
pub mod logging;
pub mod metrics;
pub mod objects;
pub mod ops;
pub mod ownership;
pub mod permissions;
pub mod pipeline;
pub mod plan;
pub mod presence;
pub mod project;
pub mod provision;
pub mod reference;
pub mod refusals;
pub mod rename;
pub mod rollout_metrics;
pub mod routes;
pub mod scan;
pub mod serve;
pub mod setup;
pub mod source_consumer;
pub mod stranded;

pub mod telemetry;
pub mod times;
pub mod wit;
