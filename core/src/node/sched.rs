//! The node's side of scheduling (spec "Scheduling"): what it knows of each member as scorer
//! inputs (health reports, its own round trips, tasks in flight), the weights from the config
//! plane, `sched status`, `sched weights` and `sched explain --place`.

use super::{ApiError, Node};
use crate::config::resolve::Level;
use crate::ids::NodeId;
use crate::latency::LatencyMatrix;
use crate::sched::{Inputs, Ranked, Weights};
use crate::time::Millis;
use serde::Serialize;
use std::collections::BTreeMap;

/// `sched status`: the weights, every member scored as a neutral candidate (no locality), and
/// the latency matrix the planner last gathered.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SchedStatus {
    pub weights: Weights,
    pub preview: Vec<Ranked>,
    pub latency: LatencyMatrix,
    /// When the matrix was gathered (wall ms; 0: never).
    pub latency_at: u64,
}

/// `sched explain`: what was asked, every node ranked with its factors and reasons, and the
/// chosen node or why there is none. Jobs will answer the same shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `place` (a new copy) or `job`.
    pub kind: &'static str,
    pub subject: String,
    pub ranked: Vec<Ranked>,
    pub chosen: Option<NodeId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_none: Option<String>,
}

/// `sched weights --set/--reset`: the weights now, and what each changed key moved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WeightsSet {
    pub weights: Weights,
    pub changed: Vec<String>,
}

/// How long a gathered latency matrix is used before it is asked for again.
pub const LATENCY_CACHE_MS: u64 = 2 * 60 * 1000;

/// The latency matrix the leader gathers from the members' `GET /cluster/acn/latency`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyCache {
    pub matrix: LatencyMatrix,
    /// Wall time of the last gathering (0: never).
    pub at: Millis,
}

#[derive(serde::Deserialize)]
struct LatencyRow {
    node: NodeId,
    latency: BTreeMap<NodeId, f64>,
}

impl Node {
    /// Leader, with three or more members: ask each member for its latency row when the
    /// matrix is older than two minutes; this node's own row is its own measurements.
    pub(super) fn gather_latency(&mut self, wall: Millis) {
        let members: Vec<NodeId> = self.members.records().filter(|r| !r.removed).map(|r| r.id.clone()).collect();
        if members.len() < 3 || (self.latency.at.0 > 0 && wall.since(self.latency.at) < LATENCY_CACHE_MS) {
            return;
        }
        let now = self.clock.peek(wall);
        self.latency.at = wall;
        let own = self.members.latency_vector();
        self.latency.matrix.insert_row(self.id.clone(), own);
        let me = self.id.clone();
        for p in members.into_iter().filter(|p| p != &me) {
            self.new_request(wall, now, &p, "GET", "/cluster/acn/latency", Vec::new(), super::Purpose::Latency);
        }
    }

    /// A member's latency row came back: keep it, if it is the row of the member asked.
    pub(super) fn take_latency_row(&mut self, _wall: Millis, peer: &NodeId, body: &[u8]) {
        let Ok(row) = serde_json::from_slice::<LatencyRow>(body) else { return };
        if &row.node != peer {
            return;
        }
        let row: BTreeMap<NodeId, f64> = row.latency.into_iter().filter(|(_, ms)| ms.is_finite()).collect();
        self.latency.matrix.insert_row(peer.clone(), row);
    }

    /// What the planner scores with: the weights, the members as candidates, the matrix.
    pub fn planner_scoring(&self, wall: Millis) -> crate::storage::planner::Scoring {
        crate::storage::planner::Scoring {
            weights: self.sched_weights(),
            known: self.sched_inputs(wall),
            latency: self.latency.matrix.clone(),
        }
    }
}

impl Node {
    /// What this node knows of each live member as a scoring candidate: its state, CPU and RAM
    /// from its health report, this node's round trip to it, and its replication tasks in
    /// flight (known on the leader) as its queue.
    pub fn sched_inputs(&self, wall: Millis) -> BTreeMap<NodeId, Inputs> {
        let now = self.clock.peek(wall);
        let mut queue: BTreeMap<NodeId, u32> = BTreeMap::new();
        for t in self.repl_tasks.in_flight() {
            *queue.entry(t.node).or_default() += 1;
        }
        self.members
            .records()
            .filter(|r| !r.removed)
            .map(|r| {
                let mut i = Inputs::new(r.id.clone(), self.members.state(&r.id, now));
                if let Some(h) = &r.health {
                    i.cpu_pct = Some(h.cpu_usage);
                    i.ram = (h.ram_total > 0).then_some((h.ram_used, h.ram_total));
                }
                i.latency_ms = self.members.latency_ms(&r.id);
                i.queue = queue.get(&r.id).copied().unwrap_or(0);
                (r.id.clone(), i)
            })
            .collect()
    }

    pub fn sched_status(&self, wall: Millis) -> SchedStatus {
        let w = self.sched_weights();
        let inputs: Vec<Inputs> = self.sched_inputs(wall).into_values().collect();
        let preview = crate::sched::rank(&inputs, &w, |i| {
            if crate::storage::placement::node_usable(i.state) {
                Ok(())
            } else {
                Err(format!("node is {}", i.state.as_str()))
            }
        });
        SchedStatus { weights: w, preview, latency: self.latency.matrix.clone(), latency_at: self.latency.at.0 }
    }

    /// Why each node would or would not take a new copy of `size` bytes (of `path`, whose
    /// copies' nodes are left out and whose primary is preferred, when it exists), written here.
    pub fn sched_explain_place(&self, wall: Millis, size: u64, path: Option<&str>) -> Result<Explanation, ApiError> {
        let now = self.clock.peek(wall);
        let (primary, holders, subject) = match path {
            Some(p) => {
                let p =
                    crate::meta::namespace::normalize(p).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
                let f = self.meta.state().file(&p).filter(|f| !f.removed && !f.is_dir);
                let holders: Vec<NodeId> = f
                    .map(|f| f.locations.iter().filter(|l| f.is_current(l)).map(|l| l.node_id.clone()).collect())
                    .unwrap_or_default();
                (f.and_then(|f| f.primary.clone()), holders, format!("a copy of {size} bytes of cluster:{p}"))
            }
            None => (None, vec![], format!("a new copy of {size} bytes")),
        };
        let states: Vec<(crate::meta::records::Volume, crate::membership::NodeState)> =
            self.volumes().map(|v| (v.clone(), self.members.state(&v.node_id, now))).collect();
        let ask = crate::storage::placement::PlaceAsk {
            size,
            writer: &self.id,
            primary: primary.as_ref(),
            exclude: &holders,
            latency: Some(&self.latency.matrix),
        };
        let ranked = crate::storage::placement::place_ranking(
            states.iter().map(|(v, s)| (v, *s)),
            &self.sched_inputs(wall),
            &self.sched_weights(),
            ask,
        );
        let (chosen, why_none) = match crate::sched::best(&ranked) {
            Ok(r) => (Some(r.node.clone()), None),
            Err(why) => (None, Some(why)),
        };
        Ok(Explanation { kind: "place", subject, ranked, chosen, why_none })
    }

    /// `sched weights`: set some weights and/or reset all to the shipped values, cluster-wide
    /// (mesh level), each through the config plane with `why` so it has a history.
    pub fn sched_set_weights(
        &mut self,
        wall: Millis,
        set: &[(String, f64)],
        reset: bool,
        why: &str,
        account: &str,
    ) -> Result<WeightsSet, ApiError> {
        self.in_cluster()?;
        for (name, v) in set {
            if Weights::default().get(name).is_none() {
                return Err(ApiError::invalid(
                    "bad_weight",
                    format!("no weight {name:?}: one of {}", Weights::NAMES.join(", ")),
                ));
            }
            if !(0.0..=1.0).contains(v) {
                return Err(ApiError::invalid("bad_weight", format!("weight {name} must be between 0 and 1, not {v}")));
            }
        }
        if set.is_empty() && !reset {
            return Err(ApiError::invalid("bad_weight", "name a weight to set (NAME=VALUE) or reset"));
        }
        let mut changed = Vec::new();
        let level = |name: &str| Level::Mesh { key: format!("scheduling.weight.{name}") };
        if reset {
            let stored: Vec<Level> = self.config_entries().into_keys().collect();
            for name in Weights::NAMES {
                let l = level(name);
                if stored.contains(&l) {
                    self.config_set(wall, &l, None, why, account)?;
                    changed.push(l.name());
                }
            }
        }
        for (name, v) in set {
            let l = level(name);
            self.config_set(wall, &l, Some(&serde_json::json!(v)), why, account)?;
            changed.push(l.name());
        }
        Ok(WeightsSet { weights: self.sched_weights(), changed })
    }
}
