//! The scoring function and the ranking (reference-facts.md "Scorer").
//!
//! `raw = locality·w + (1 − cpu/100)·w + (1 − ramUsed/ramTotal)·w + diskFree·w
//!        + features·w (only when a job names some) + diversity·w (only when measured)
//!        − min(queue/8, 1)·w − min(latency/1000, 1)·w (only when measured) − w if DEGRADED`,
//! clamped to [0, 1]. An unknown CPU counts as idle (1), unknown memory and disk as half (0.5).

use crate::ids::NodeId;
use crate::membership::NodeState;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The reason a DEGRADED node is held back.
pub const DEGRADED_HELD_BACK: &str = "node is degraded and a healthy node is available";
/// The reason [`best`] gives when there are no candidates at all.
pub const NO_NODE: &str = "no node is available";

/// Queue depth at which the queue penalty is full.
pub const QUEUE_SATURATES: f64 = 8.0;
/// Round trip (ms) at which the distance penalty is full.
pub const LATENCY_SATURATES_MS: f64 = 1000.0;

/// The weight of each factor, each in [0, 1] (config keys `scheduling.weight.<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Weights {
    pub locality: f64,
    pub cpu: f64,
    pub memory: f64,
    pub disk: f64,
    pub queue: f64,
    pub latency: f64,
    pub health: f64,
    pub features: f64,
    pub diversity: f64,
}

impl Default for Weights {
    /// The shipped weights.
    fn default() -> Weights {
        Weights {
            locality: 0.45,
            cpu: 0.20,
            memory: 0.10,
            disk: 0.05,
            queue: 0.10,
            latency: 0.05,
            health: 0.05,
            features: 0.10,
            diversity: 0.05,
        }
    }
}

impl Weights {
    /// Each weight by its name (the config key's last segment), in a fixed order.
    pub const NAMES: [&'static str; 9] =
        ["locality", "cpu", "memory", "disk", "queue", "latency", "health", "features", "diversity"];

    pub fn get(&self, name: &str) -> Option<f64> {
        Some(match name {
            "locality" => self.locality,
            "cpu" => self.cpu,
            "memory" => self.memory,
            "disk" => self.disk,
            "queue" => self.queue,
            "latency" => self.latency,
            "health" => self.health,
            "features" => self.features,
            "diversity" => self.diversity,
            _ => return None,
        })
    }

    /// Set one weight, clamped to [0, 1] (a NaN leaves it as it is); false for an unknown name.
    pub fn set(&mut self, name: &str, value: f64) -> bool {
        let slot = match name {
            "locality" => &mut self.locality,
            "cpu" => &mut self.cpu,
            "memory" => &mut self.memory,
            "disk" => &mut self.disk,
            "queue" => &mut self.queue,
            "latency" => &mut self.latency,
            "health" => &mut self.health,
            "features" => &mut self.features,
            "diversity" => &mut self.diversity,
            _ => return false,
        };
        if !value.is_nan() {
            *slot = value.clamp(0.0, 1.0);
        }
        true
    }
}

/// What is known of one candidate node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inputs {
    pub node: NodeId,
    pub state: NodeState,
    /// Share of the work's input bytes already on the node (1 for the writer of a new file).
    pub locality: f64,
    /// CPU use in percent from the node's health report; `None`: no report.
    pub cpu_pct: Option<f64>,
    /// (used, total) bytes of RAM; `None` or a zero total: unknown.
    pub ram: Option<(u64, u64)>,
    /// The largest free fraction among the node's volumes; `None`: unknown.
    pub disk_free: Option<f64>,
    /// Work queued or running on the node.
    pub queue: u32,
    /// Round trip in ms from the scoring node; 0 or less: not measured (or itself).
    pub latency_ms: f64,
    /// (have, wanted) optional features; only when the work names some.
    pub features: Option<(usize, usize)>,
    /// Distance to the nearest holder as a fraction of one second, in [0, 1]; only when measured
    /// and it applies (three or more nodes, a holder, more than one candidate).
    pub diversity: Option<f64>,
}

impl Inputs {
    /// A node with nothing known but its id and state.
    pub fn new(node: NodeId, state: NodeState) -> Inputs {
        Inputs {
            node,
            state,
            locality: 0.0,
            cpu_pct: None,
            ram: None,
            disk_free: None,
            queue: 0,
            latency_ms: 0.0,
            features: None,
            diversity: None,
        }
    }
}

/// Each factor as measured, in [0, 1] (before its weight); `None`: left out of the score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Factors {
    pub locality: f64,
    pub cpu: f64,
    pub memory: f64,
    pub disk: f64,
    /// Penalty share: queue / 8, saturating.
    pub queue: f64,
    /// Penalty share: latency / 1000 ms, saturating; `None` when not measured.
    pub latency: Option<f64>,
    /// 1 when DEGRADED (a penalty), else 0.
    pub health: f64,
    pub features: Option<f64>,
    pub diversity: Option<f64>,
}

fn unit(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// The factors of one candidate.
pub fn factors(i: &Inputs) -> Factors {
    let memory = match i.ram {
        Some((used, total)) if total > 0 => unit(1.0 - used as f64 / total as f64),
        _ => 0.5,
    };
    Factors {
        locality: unit(i.locality),
        cpu: i.cpu_pct.map_or(1.0, |c| unit(1.0 - c / 100.0)),
        memory,
        disk: i.disk_free.map_or(0.5, unit),
        queue: unit(i.queue as f64 / QUEUE_SATURATES),
        latency: (i.latency_ms > 0.0).then(|| unit(i.latency_ms / LATENCY_SATURATES_MS)),
        health: if i.state == NodeState::Degraded { 1.0 } else { 0.0 },
        features: i.features.map(|(have, wanted)| if wanted == 0 { 1.0 } else { unit(have as f64 / wanted as f64) }),
        diversity: i.diversity.filter(|d| *d >= 0.0).map(unit),
    }
}

impl Factors {
    /// The weighted sum before clamping.
    pub fn raw(&self, w: &Weights) -> f64 {
        w.locality * self.locality + w.cpu * self.cpu + w.memory * self.memory + w.disk * self.disk
            - w.queue * self.queue
            - w.latency * self.latency.unwrap_or(0.0)
            - w.health * self.health
            + w.features * self.features.unwrap_or(0.0)
            + w.diversity * self.diversity.unwrap_or(0.0)
    }
}

/// A candidate's score in [0, 1] and the factors it came from.
pub fn score(i: &Inputs, w: &Weights) -> (f64, Factors) {
    let f = factors(i);
    (unit(f.raw(w)), f)
}

/// One candidate as ranked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ranked {
    pub node: NodeId,
    pub state: NodeState,
    pub score: f64,
    pub factors: Factors,
    pub eligible: bool,
    /// Why it is not eligible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Cow<'static, str>>,
}

/// Every candidate in order: the eligible by score (highest first), then id; the ineligible
/// last (by id), each with its reason. `hard_rule` says why a node cannot take the work at all
/// (`Err(reason)`). A DEGRADED node is held back whenever an eligible node that is not
/// DEGRADED exists.
pub fn rank(candidates: &[Inputs], w: &Weights, hard_rule: impl Fn(&Inputs) -> Result<(), String>) -> Vec<Ranked> {
    let mut all: Vec<Ranked> = candidates
        .iter()
        .map(|i| {
            let (score, factors) = score(i, w);
            let verdict = hard_rule(i);
            Ranked {
                node: i.node.clone(),
                state: i.state,
                score,
                factors,
                eligible: verdict.is_ok(),
                reason: verdict.err().map(Cow::Owned),
            }
        })
        .collect();
    let healthy_eligible = all.iter().any(|r| r.eligible && r.state != NodeState::Degraded);
    if healthy_eligible {
        for r in all.iter_mut().filter(|r| r.eligible && r.state == NodeState::Degraded) {
            r.eligible = false;
            r.reason = Some(Cow::Borrowed(DEGRADED_HELD_BACK));
        }
    }
    // Node ids are unique, so the order is total and an unstable sort is deterministic.
    all.sort_unstable_by(|a, b| {
        b.eligible
            .cmp(&a.eligible)
            .then_with(|| if a.eligible { b.score.total_cmp(&a.score) } else { std::cmp::Ordering::Equal })
            .then_with(|| a.node.cmp(&b.node))
    });
    all
}

/// The first eligible candidate of a ranking, or why there is none: the first ineligible
/// node's reason, or [`NO_NODE`] when there were no candidates.
pub fn best(ranked: &[Ranked]) -> Result<&Ranked, String> {
    match ranked.first() {
        Some(r) if r.eligible => Ok(r),
        Some(r) => Err(format!("{}: {}", r.node, r.reason.as_deref().unwrap_or("not eligible"))),
        None => Err(NO_NODE.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(id: &str) -> Inputs {
        Inputs::new(NodeId::new(id), NodeState::Online)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// The reference's numbers: an idle node with nothing known scores
    /// 0.20 (cpu) + 0.05 (memory 0.5) + 0.025 (disk 0.5) = 0.275.
    #[test]
    fn an_unknown_node_scores_the_reference_defaults() {
        let (s, f) = score(&node("a"), &Weights::default());
        assert!(close(s, 0.275), "{s}");
        assert_eq!((f.cpu, f.memory, f.disk), (1.0, 0.5, 0.5));
        assert_eq!((f.latency, f.features, f.diversity), (None, None, None));
    }

    #[test]
    fn each_factor_moves_the_score_by_its_weight() {
        let w = Weights::default();
        let base = score(&node("a"), &w).0;
        let with = |f: &dyn Fn(&mut Inputs)| {
            let mut i = node("a");
            f(&mut i);
            score(&i, &w).0 - base
        };
        assert!(close(with(&|i| i.locality = 1.0), 0.45));
        assert!(close(with(&|i| i.cpu_pct = Some(50.0)), -0.10));
        assert!(close(with(&|i| i.ram = Some((1, 4))), 0.10 * 0.75 - 0.05));
        assert!(close(with(&|i| i.disk_free = Some(1.0)), 0.025));
        assert!(close(with(&|i| i.queue = 4), -0.05));
        assert!(close(with(&|i| i.queue = 80), -0.10), "the queue penalty saturates at 8");
        assert!(close(with(&|i| i.latency_ms = 500.0), -0.025));
        assert!(close(with(&|i| i.latency_ms = -1.0), 0.0), "an unmeasured latency is left out");
        assert!(close(with(&|i| i.state = NodeState::Degraded), -0.05));
        assert!(close(with(&|i| i.features = Some((1, 2))), 0.05));
        assert!(close(with(&|i| i.diversity = Some(0.4)), 0.02));
        assert!(close(with(&|i| i.diversity = Some(-1.0)), 0.0), "an unmeasured distance is left out");
    }

    #[test]
    fn the_score_is_clamped_to_zero_and_one() {
        let mut w = Weights::default();
        for n in Weights::NAMES {
            w.set(n, 1.0);
        }
        let mut i = node("a");
        i.locality = 1.0;
        i.features = Some((2, 2));
        i.diversity = Some(1.0);
        assert_eq!(score(&i, &w).0, 1.0);
        let mut i = node("a");
        i.cpu_pct = Some(100.0);
        i.ram = Some((8, 8));
        i.disk_free = Some(0.0);
        i.queue = 100;
        i.latency_ms = 5000.0;
        i.state = NodeState::Degraded;
        assert_eq!(score(&i, &w).0, 0.0);
    }

    #[test]
    fn weights_are_clamped_and_named() {
        let mut w = Weights::default();
        assert!(w.set("cpu", 3.0));
        assert_eq!(w.cpu, 1.0);
        assert!(w.set("cpu", -1.0));
        assert_eq!(w.cpu, 0.0);
        assert!(!w.set("nope", 0.5));
        for n in Weights::NAMES {
            assert!(w.get(n).is_some(), "{n}");
        }
    }

    #[test]
    fn ranking_holds_degraded_back_only_while_a_healthy_node_is_eligible() {
        let w = Weights::default();
        let mut d = node("a");
        d.state = NodeState::Degraded;
        d.locality = 1.0; // would win on score
        let h = node("b");
        let r = rank(&[d.clone(), h.clone()], &w, |_| Ok(()));
        assert_eq!(r[0].node.as_str(), "b");
        assert_eq!((r[1].eligible, r[1].reason.as_deref()), (false, Some(DEGRADED_HELD_BACK)));
        // The healthy node cannot take it: the degraded one may.
        let r = rank(&[d, h], &w, |i| if i.node.as_str() == "b" { Err("no room".into()) } else { Ok(()) });
        assert_eq!((r[0].node.as_str(), r[0].eligible), ("a", true));
        assert_eq!(r[1].reason.as_deref(), Some("no room"));
    }

    #[test]
    fn best_explains_an_empty_answer() {
        let w = Weights::default();
        assert_eq!(best(&rank(&[], &w, |_| Ok(()))), Err(NO_NODE.to_string()));
        let r = rank(&[node("a")], &w, |_| Err("volume full".into()));
        assert_eq!(best(&r), Err("a: volume full".to_string()));
        let r = rank(&[node("b"), node("a")], &w, |_| Ok(()));
        assert_eq!(best(&r).unwrap().node.as_str(), "a", "equal scores: by id");
    }

    fn state() -> impl Strategy<Value = NodeState> {
        prop::sample::select(vec![
            NodeState::Online,
            NodeState::Degraded,
            NodeState::Unknown,
            NodeState::Offline,
            NodeState::Maintenance,
            NodeState::Draining,
        ])
    }

    fn inputs() -> impl Strategy<Value = Inputs> {
        (
            0u8..40,
            state(),
            (-1.0f64..2.0, prop::option::of(-10.0f64..200.0), prop::option::of((0u64..100, 0u64..100))),
            (prop::option::of(-1.0f64..2.0), 0u32..20, -5.0f64..3000.0),
            (prop::option::of((0usize..5, 0usize..5)), prop::option::of(-1.0f64..2.0)),
        )
            .prop_map(
                |(id, state, (locality, cpu_pct, ram), (disk_free, queue, latency_ms), (features, diversity))| Inputs {
                    node: NodeId::new(format!("n{id:02}")),
                    state,
                    locality,
                    cpu_pct,
                    ram,
                    disk_free,
                    queue,
                    latency_ms,
                    features,
                    diversity,
                },
            )
    }

    fn weights() -> impl Strategy<Value = Weights> {
        prop::collection::vec(-0.5f64..1.5, 9).prop_map(|v| {
            let mut w = Weights::default();
            for (n, x) in Weights::NAMES.iter().zip(v) {
                w.set(n, x);
            }
            w
        })
    }

    proptest! {
        #[test]
        fn every_score_is_in_zero_one(i in inputs(), w in weights()) {
            let (s, _) = score(&i, &w);
            prop_assert!((0.0..=1.0).contains(&s), "{}", s);
        }

        /// Total and stable: every candidate once, the same order whatever the input order; a
        /// DEGRADED node never ahead of an eligible healthy one; every ineligible one has a reason.
        #[test]
        fn ranking_is_total_stable_and_explained(
            mut nodes in prop::collection::vec(inputs(), 0..12),
            w in weights(),
            shuffle in any::<u64>(),
        ) {
            nodes.sort_by(|a, b| a.node.cmp(&b.node));
            nodes.dedup_by(|a, b| a.node == b.node);
            let rule = |i: &Inputs| if crate::storage::placement::node_usable(i.state) { Ok(()) } else { Err(format!("node is {}", i.state.as_str())) };
            let ranked = rank(&nodes, &w, rule);
            prop_assert_eq!(ranked.len(), nodes.len());
            let mut shuffled = nodes.clone();
            let mut rng = crate::rng::SeededRng::new(shuffle);
            for k in (1..shuffled.len()).rev() {
                let j = (rng.next_u64() % (k as u64 + 1)) as usize;
                shuffled.swap(k, j);
            }
            prop_assert_eq!(&rank(&shuffled, &w, rule), &ranked, "the same inputs in any order rank the same");
            let first_ineligible = ranked.iter().position(|r| !r.eligible).unwrap_or(ranked.len());
            prop_assert!(ranked[first_ineligible..].iter().all(|r| !r.eligible && r.reason.is_some()));
            for (k, r) in ranked[..first_ineligible].iter().enumerate() {
                prop_assert!(r.reason.is_none());
                if k > 0 {
                    prop_assert!(ranked[k - 1].score >= r.score);
                }
                if r.state == NodeState::Degraded {
                    prop_assert!(ranked.iter().all(|o| !(o.eligible && o.state != NodeState::Degraded)));
                }
            }
        }
    }
}
