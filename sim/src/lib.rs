//! shoal-sim: runs the real shell code of N shoal nodes inside turmoil (DESIGN.md "The
//! simulator").
//!
//! One `u64` seed drives everything: turmoil's network and tokio's scheduling, every node's RNG,
//! the clock offsets and drifts, and the fault schedule. A run is a safety phase with faults
//! (partitions two-way and one-way, hold/release, crash and bounce with the data dir kept,
//! latency, admin state changes, a removal) during which invariants are checked every simulated
//! second, then a liveness phase that heals everything and requires convergence within two
//! heartbeat intervals. Every check folds the cluster's state into a trace digest, so the same
//! seed must give the same digest (tested). `SEED=n` replays one seed.

pub mod env;
pub mod harness;
pub mod run;

pub use harness::{Harness, SimConfig};
pub use run::{run_seed, RunReport};
