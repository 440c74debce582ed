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
//!
//! [`config_run`] sweeps the configuration plane across a rolling upgrade under faults.
//! [`drive_run`] does the same for the cluster drive: files written through random nodes under
//! partitions, crashes, flipped bytes and full disks, no acknowledged file ever without a right
//! copy, and N right copies on N nodes after heal.
//! [`jobs_run`] runs jobs and a word count map/reduce under crashes (the leader's too),
//! partitions and skewed clocks: no job on two nodes at once, every job ends once, the count is
//! right.

pub mod config_run;
pub mod drive_run;
pub mod env;
pub mod harness;
pub mod jobs_run;
pub mod run;

pub use config_run::run_config_seed;
pub use drive_run::{drive_cluster_nat, run_drive_seed, run_drive_seed_with, DriveOptions};
pub use harness::{Harness, SimConfig};
pub use jobs_run::run_jobs_seed;
pub use run::{run_seed, RunReport};
