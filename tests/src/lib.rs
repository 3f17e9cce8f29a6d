//! Shared support for dedup-host's integration tests and benchmarks: a real nats-server per
//! test on a free port, and the paths of the example guests built by `guests/build.sh`.

pub mod bench;
pub mod browser;
pub mod console;
pub mod endpoint;
pub mod guest_calls;
pub mod guests;
pub mod harness;
pub mod nats;
pub mod netlab;
pub mod proxy;
pub mod readme;
pub mod schema;
pub mod sim;
