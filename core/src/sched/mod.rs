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

use crate::ids::NodeId;
use crate::latency::LatencyMatrix;

/// A candidate's site diversity (spec "Site diversity"): its distance to the nearest node that
/// already holds the data, as a fraction of one second (capped at 1); `None` when no pair to a
/// holder is measured.
pub fn site_diversity<'a>(
    matrix: &LatencyMatrix,
    candidate: &NodeId,
    holders: impl IntoIterator<Item = &'a NodeId>,
) -> Option<f64> {
    holders
        .into_iter()
        .map(|h| matrix.pair(candidate, h))
        .filter(|d| *d >= 0.0)
        .min_by(|a, b| a.total_cmp(b))
        .map(|d| (d / 1000.0).min(1.0))
}

/// Whether site diversity applies: three or more nodes in the cluster, at least one holder, and
/// more than one place the copy could go. Where it applies, the network distance factor is
/// left out: both would read the same round trips with opposite signs and cancel out.
pub fn diversity_applies(cluster_nodes: usize, holders: usize, candidates: usize) -> bool {
    cluster_nodes >= 3 && holders >= 1 && candidates > 1
}

pub use score::{best, rank, score, Factors, Inputs, Ranked, Weights, DEGRADED_HELD_BACK, NO_NODE};
