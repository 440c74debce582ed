//! The cluster's latency matrix (spec: "Scheduling", site diversity; reference-facts "Scorer").
//! Each node measures only its own round trips (EWMA in [`crate::membership`]); the matrix is
//! assembled from the vectors members answer on `GET /cluster/acn/latency`. A pair's latency is
//! the mean of both directions, or the one direction measured, or -1 when neither is.

use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyMatrix {
    /// `rows[a][b]`: a's measured round trip to b in ms (-1 never measured).
    pub rows: BTreeMap<NodeId, BTreeMap<NodeId, f64>>,
}

impl LatencyMatrix {
    pub fn insert_row(&mut self, from: NodeId, row: BTreeMap<NodeId, f64>) {
        self.rows.insert(from, row);
    }

    fn one_way(&self, a: &NodeId, b: &NodeId) -> f64 {
        self.rows.get(a).and_then(|r| r.get(b)).copied().unwrap_or(-1.0)
    }

    pub fn pair(&self, a: &NodeId, b: &NodeId) -> f64 {
        if a == b {
            return 0.0;
        }
        pair_latency(self.one_way(a, b), self.one_way(b, a))
    }

    /// Every unordered pair of nodes present in the matrix with its pair latency.
    pub fn pairs(&self) -> Vec<(NodeId, NodeId, f64)> {
        let mut ids: Vec<&NodeId> = self.rows.keys().chain(self.rows.values().flat_map(|r| r.keys())).collect();
        ids.sort();
        ids.dedup();
        let mut out = Vec::new();
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                out.push(((*a).clone(), (*b).clone(), self.pair(a, b)));
            }
        }
        out
    }
}

/// Mean of the two directions when both are measured (negative = not measured).
pub fn pair_latency(a_to_b: f64, b_to_a: f64) -> f64 {
    match (a_to_b >= 0.0, b_to_a >= 0.0) {
        (true, true) => (a_to_b + b_to_a) / 2.0,
        (true, false) => a_to_b,
        (false, true) => b_to_a,
        (false, false) => -1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_latency_is_the_mean_of_both_directions() {
        let (a, b, c) = (NodeId::new("a"), NodeId::new("b"), NodeId::new("c"));
        let mut m = LatencyMatrix::default();
        m.insert_row(a.clone(), [(b.clone(), 10.0), (c.clone(), -1.0)].into());
        m.insert_row(b.clone(), [(a.clone(), 20.0)].into());
        assert_eq!(m.pair(&a, &b), 15.0);
        assert_eq!(m.pair(&b, &a), 15.0);
        assert_eq!(m.pair(&a, &c), -1.0);
        assert_eq!(m.pair(&a, &a), 0.0);
        assert_eq!(m.pairs().len(), 3);
    }
}
