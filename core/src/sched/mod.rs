//! Scheduling (spec cluster-runtime.md "Scheduling"; reference-facts.md "Scorer"): the one
//! scorer that write placement, the replication planner and the job scheduler all call.
//!
//! - [`score`]: the nine factors, their weights, a score in [0, 1] that carries its factors;
//! - [`rank`]: every candidate in order, eligible first (score, then id), DEGRADED nodes held
//!   back while a healthy eligible node exists, the ineligible last with their reasons;
//!   [`best`] explains an empty answer instead of failing silently.
//!
//! Pure: the caller gathers the inputs (health reports, volumes, latencies, queue depths);
//! the same inputs give the same ranking on every node.

pub mod score;

pub use score::{best, rank, score, Factors, Inputs, Ranked, Weights, DEGRADED_HELD_BACK, NO_NODE};
