//! One scheduling pass (spec "Jobs": scheduling, pinning, dispatch once): the queue in order
//! (priority desc, created asc, id), each job ranked by the shared scorer over the nodes with
//! a free slot that may run it, the best one taking it. A pass ends early once no node has a
//! free slot, so a long queue costs its sort, not a ranking per job.
//!
//! A job waiting for a slot stays queued here, holding no lease (reference weakness 6): only a
//! hand-over, to a node with a free slot, grants one.

use crate::ids::{JobId, NodeId};
use crate::membership::NodeState;
use crate::meta::job::{JobSpec, Requirements};
use crate::records::Capabilities;
use crate::sched::{Inputs, Ranked, Weights};
use std::cmp::Ordering;

/// A node as the pass sees it: what it is, what it can hold, how it scores.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub inputs: Inputs,
    pub caps: Capabilities,
    /// Jobs it may still start now (its slots less its runs under lease).
    pub free: u32,
    /// It said it runs no jobs (`jobs.enabled` false, or it refused as unable).
    pub runs_jobs: bool,
}

/// A queued job as the pass sees it.
#[derive(Clone, Copy, Debug)]
pub struct Queued<'a> {
    pub id: &'a JobId,
    pub spec: &'a JobSpec,
    /// Nodes that refused it for good.
    pub blocked: &'a [NodeId],
}

/// Reasons a node cannot take a job at all.
pub const LIMITED: &str = "job is limited to other nodes";
pub const NO_SLOT: &str = "no free slot";

/// Why `c` can never run `job` (its capabilities, the pin, a refusal), or `Ok`. A full node is
/// not refused here: that is [`NO_SLOT`], a wait.
pub fn hard_rule(spec: &JobSpec, blocked: &[NodeId], c: &Candidate) -> Result<(), String> {
    let id = &c.inputs.node;
    if !crate::storage::placement::node_usable(c.inputs.state) {
        return Err(format!("node is {}", c.inputs.state.as_str()));
    }
    if !spec.nodes.is_empty() && !spec.nodes.contains(id) {
        return Err(LIMITED.into());
    }
    if !c.runs_jobs {
        return Err("node does not run jobs".into());
    }
    if blocked.contains(id) {
        return Err("node refused this job (no account for its owner, or cannot run it)".into());
    }
    requirements_met(&spec.requirements, &c.caps)
}

/// Whether a capability manifest satisfies a job's requirements, or the first one missing.
pub fn requirements_met(r: &Requirements, caps: &Capabilities) -> Result<(), String> {
    if let Some(f) = r.features.iter().find(|f| !caps.features.get(f.as_str()).copied().unwrap_or(false)) {
        return Err(format!("lacks feature {f}"));
    }
    if r.min_ram > 0 && caps.total_ram < r.min_ram {
        return Err(format!("has {} bytes of RAM, needs {}", caps.total_ram, r.min_ram));
    }
    if r.min_cores > 0 && caps.cpu_cores < r.min_cores {
        return Err(format!("has {} cores, needs {}", caps.cpu_cores, r.min_cores));
    }
    if !r.os.is_empty() && !r.os.eq_ignore_ascii_case(&caps.os) {
        return Err(format!("runs {}, needs {}", caps.os, r.os));
    }
    if !r.arch.is_empty() && !r.arch.eq_ignore_ascii_case(&caps.arch) {
        return Err(format!("is {}, needs {}", caps.arch, r.arch));
    }
    Ok(())
}

/// The queue's order: priority desc, then created asc, then id (total, so deterministic).
pub fn queue_order(a: &Queued, b: &Queued) -> Ordering {
    b.spec.priority.cmp(&a.spec.priority).then(a.spec.created.cmp(&b.spec.created)).then_with(|| a.id.cmp(b.id))
}

/// Rank every candidate for `job` (locality from `locality(spec, node)`), full nodes ranked but
/// ineligible with [`NO_SLOT`].
pub fn rank_for(
    q: &Queued,
    candidates: &[Candidate],
    weights: &Weights,
    locality: &impl Fn(&JobSpec, &NodeId) -> f64,
) -> Vec<Ranked> {
    let inputs: Vec<Inputs> = candidates
        .iter()
        .map(|c| {
            let mut i = c.inputs.clone();
            i.locality = if q.spec.inputs.is_empty() { 0.0 } else { locality(q.spec, &i.node) };
            i
        })
        .collect();
    let verdicts: std::collections::BTreeMap<&NodeId, Result<(), String>> = candidates
        .iter()
        .map(|c| {
            let v =
                hard_rule(q.spec, q.blocked, c).and_then(|()| if c.free == 0 { Err(NO_SLOT.into()) } else { Ok(()) });
            (&c.inputs.node, v)
        })
        .collect();
    crate::sched::rank(&inputs, weights, |i| verdicts.get(&i.node).cloned().unwrap_or(Err(NO_SLOT.into())))
}

/// One pass: the queue in order, each job to the best node with a free slot (each hand-over
/// uses a slot and adds to the node's queue factor). Jobs no node can take now are left queued.
pub fn pass<'a>(
    queue: &mut [Queued<'a>],
    candidates: &mut [Candidate],
    weights: &Weights,
    locality: impl Fn(&JobSpec, &NodeId) -> f64,
) -> Vec<(JobId, NodeId)> {
    queue.sort_unstable_by(queue_order);
    let mut out = Vec::new();
    for q in queue.iter() {
        if candidates.iter().all(|c| c.free == 0) {
            break;
        }
        // Cheap test first: some node with a slot that the hard rules allow.
        if !candidates.iter().any(|c| c.free > 0 && hard_rule(q.spec, q.blocked, c).is_ok()) {
            continue;
        }
        let ranked = rank_for(q, candidates, weights, &locality);
        let Some(best) = ranked.first().filter(|r| r.eligible) else { continue };
        let node = best.node.clone();
        if let Some(c) = candidates.iter_mut().find(|c| c.inputs.node == node) {
            c.free -= 1;
            c.inputs.queue += 1;
        }
        out.push((q.id.clone(), node));
    }
    out
}

/// A state the pass treats as able to run work.
pub fn runs_work(state: NodeState) -> bool {
    crate::storage::placement::node_usable(state)
}
