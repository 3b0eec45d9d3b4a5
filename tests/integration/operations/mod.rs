//! Running the module in production: Redis Cluster, faults (cut links,
//! resyncs under traffic, eviction), a crash with the AOF on, a million keys
//! expiring, sustained pipelined load with a replica, the propagation modes,
//! and a storm of random arguments.

mod argument_storm;
mod cluster;
mod crash_recovery;
mod faults;
mod load_expiry;
mod propagation_modes;
mod sustained_load;
