//! The client kit against real servers: `cargo test --release -p
//! redis-ratelimit-client` (the Makefile's `test-kit-rust`).

mod harness;

mod acquire;
mod calls;
mod cluster;
mod fallback;
mod grants;
mod grpc;
mod instances;
mod layer;
mod leases;
mod observability;
mod protection;
mod quota;
mod savings;
mod sentinel;
mod slow_spells;
