//! The replication planner (spec: "Replication"; reference-facts.md "Planner"). A pure
//! function of the record state, the members' liveness, the tasks in flight and the per-file
//! backoff; the metadata leader runs it every 60 s and on demand.
//!
//! Per file (directories and tombstones skipped), with `wanted` from the file's own count or
//! the nearest folder policy:
//! - copies on a volume that no longer exists, or on a node that left, are forgotten;
//! - healthy copies on a node OFFLINE for 10 minutes are marked stale (never deleted);
//! - copies on an evacuating volume or a DRAINING node are to be moved away;
//! - a copy on a node that is only briefly UNKNOWN (or OFFLINE for less than 10 minutes) still
//!   counts, so a short absence causes no extra copy (reference weakness 11);
//! - fewer counted copies than wanted: one pull task, from a healthy copy on a usable node, to
//!   a usable node holding no healthy copy — its stale copy's volume first (`repair`), else the
//!   node the shared scorer ranks best among those with a volume that fits, with site
//!   diversity (distance to the nearest holder) when the cluster has three or more nodes, the
//!   file a holder and more than one node could take it; on that node its roomiest volume that
//!   fits (`replica`, or `evacuate` when the shortfall is an evacuation);
//! - enough counted copies: copies to evacuate are dropped (`evacuate`); more copies on usable
//!   nodes than wanted: the copy on the fullest non-primary volume is dropped (`drop`). A copy
//!   is never dropped unless `wanted` others remain, so the last healthy copy is never deleted.
//!
//! Limits: one task per file, 4 tasks per node, 16 in flight in all. The files a pass left for
//! the limits (up to 4,096) are its backlog: as a task ends well, [`plan_backlog`] plans those
//! files again, so a repair of many files goes on at the pace tasks end instead of waiting for
//! the next pass over every record. A file whose tasks failed
//! waits 30 s, doubling per failure, and 1 h after 5 failures; that [`Backoff`] is data the
//! caller keeps in replicated records, so it survives a change of leader (reference weakness 5).

use crate::ids::{FileId, NodeId, VolumeId};
use crate::membership::NodeState;
use crate::meta::namespace;
use crate::meta::records::{FileRecord, LocationState, Volume};
use crate::meta::state::MetaState;
use crate::storage::placement::{fits, node_usable};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Clone, Debug, PartialEq)]
pub struct PlannerConfig {
    pub per_node_max: usize,
    pub in_flight_max: usize,
    pub stale_after_offline_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_failures_max: u32,
    pub give_up_ms: u64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            per_node_max: 4,
            in_flight_max: 16,
            stale_after_offline_ms: 10 * 60_000,
            backoff_base_ms: 30_000,
            backoff_failures_max: 5,
            give_up_ms: 3_600_000,
        }
    }
}

/// What the planner needs to know about a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub state: NodeState,
    /// How long it has been OFFLINE (0 when it is not).
    pub offline_for_ms: u64,
}

/// A task some node is working on now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub file: FileId,
    /// The node doing the work (the pull's target, the drop's holder).
    pub node: NodeId,
}

/// A file's failure history, kept across passes and leaders.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    pub attempts: u32,
    /// Unix ms before which the file gets no new task.
    pub next_at_ms: u64,
}

impl Backoff {
    /// The backoff after one more failure at `now_ms`: 30 s, 60 s, 120 s, 240 s, then 1 h.
    pub fn after_failure(prev: Option<&Backoff>, now_ms: u64, cfg: &PlannerConfig) -> Backoff {
        let attempts = prev.map_or(0, |b| b.attempts).saturating_add(1);
        let delay = if attempts >= cfg.backoff_failures_max {
            cfg.give_up_ms
        } else {
            cfg.backoff_base_ms.saturating_mul(1 << (attempts - 1).min(30))
        };
        Backoff { attempts, next_at_ms: now_ms.saturating_add(delay) }
    }

    /// The backoff after a deferred task at `now_ms`: the file waits one base delay (30 s) and
    /// its failures are not counted up, so a target that is busy for minutes does not push the
    /// file into the hour-long wait.
    pub fn after_deferral(prev: Option<&Backoff>, now_ms: u64, cfg: &PlannerConfig) -> Backoff {
        let attempts = prev.map_or(0, |b| b.attempts);
        Backoff { attempts, next_at_ms: now_ms.saturating_add(cfg.backoff_base_ms) }
    }

    /// Whether this register holds anything back (a failure counted, or a wait set).
    pub fn is_set(&self) -> bool {
        self.attempts > 0 || self.next_at_ms > 0
    }
}

/// How a replication task ended, as its worker (or the leader) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskOutcome {
    /// The copy was made or dropped: the file's backoff is cleared.
    Succeeded,
    /// The task failed: the file's backoff escalates (30 s doubling, then 1 h).
    Failed,
    /// The target refused for now because another write's bytes are unsettled at that path
    /// (they settle within ten minutes, `LANDED_MAX_MS`): the file waits one base delay, and the
    /// refusal is not counted as a failure.
    Deferred,
}

/// The codes a pull is refused with while the bytes at a path are unsettled: from its target,
/// `busy` (another write's bytes found before or after the copy was taken) and
/// `write_conflict` (found under the landing lock); from its source, `rename_pending` (the
/// copy is still at the path it was moved from, its rename waiting for bytes an overwrite kept
/// aside there to go back first: at most until the bytes landed over them settle).
const UNSETTLED_REFUSALS: [&str; 3] = ["busy", "write_conflict", "rename_pending"];

impl TaskOutcome {
    /// How a pull that failed with error `code` ended: a refusal because the target path is
    /// busy with unsettled bytes, or the source's copy still waits for its rename, is
    /// deferred; anything else failed.
    pub fn of_pull_error(code: &str) -> TaskOutcome {
        if UNSETTLED_REFUSALS.contains(&code) {
            TaskOutcome::Deferred
        } else {
            TaskOutcome::Failed
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    Replica,
    Repair,
    Evacuate,
    Drop,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", tag = "kind")]
pub enum Action {
    Pull { source_node: NodeId, source_volume: VolumeId, target_node: NodeId, target_volume: VolumeId },
    Drop { node: NodeId, volume: VolumeId },
}

impl Action {
    /// The node that carries the task out.
    pub fn worker(&self) -> &NodeId {
        match self {
            Action::Pull { target_node, .. } => target_node,
            Action::Drop { node, .. } => node,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub file: FileId,
    pub path: String,
    pub size: u64,
    pub checksum: String,
    pub action: Action,
    pub reason: Reason,
}

/// A copy to re-label (stale) or forget (its volume or node is gone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyRef {
    pub path: String,
    pub volume: VolumeId,
    pub node: NodeId,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanStats {
    pub files: u64,
    pub healthy: u64,
    pub under: u64,
    pub over: u64,
    pub evacuating: u64,
    pub waiting_backoff: u64,
    pub in_flight: u64,
    /// Under-replicated with no node that can take a copy.
    pub no_target: u64,
    /// Under-replicated with no readable copy right now.
    pub no_source: u64,
    /// Left for a later pass by the task limits.
    pub deferred: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub tasks: Vec<Task>,
    pub mark_stale: Vec<CopyRef>,
    pub forget: Vec<CopyRef>,
    pub stats: PlanStats,
    /// The paths of files a full pass left for the task limits, to plan again as tasks end
    /// ([`plan_backlog`]); the leader keeps them, nobody else.
    #[serde(skip)]
    pub backlog: Vec<String>,
}

pub struct PlanInput<'a> {
    pub now_ms: u64,
    pub nodes: &'a BTreeMap<NodeId, NodeView>,
    pub in_flight: &'a [InFlight],
    pub backoff: &'a BTreeMap<FileId, Backoff>,
    pub scoring: &'a Scoring,
}

/// What the scorer needs to choose a target: the weights, what is known of each node (health,
/// round trip, queue), and the cluster's latency matrix for site diversity.
#[derive(Clone, Debug, Default)]
pub struct Scoring {
    pub weights: crate::sched::Weights,
    pub known: BTreeMap<NodeId, crate::sched::Inputs>,
    pub latency: crate::latency::LatencyMatrix,
}

impl Scoring {
    /// The best node among `candidates` (each with its largest free fraction), or `None`. The
    /// network distance is the round trip from `source` (the copy travels from there), from
    /// the matrix; not measured, it is left out (the leader's own round trips would favour
    /// the leader itself).
    fn choose<'v>(
        &self,
        candidates: &[(&'v Volume, NodeState, Option<f64>)],
        holders: &BTreeSet<&NodeId>,
        cluster_nodes: usize,
        source: &NodeId,
    ) -> Option<&'v Volume> {
        let diverse = crate::sched::diversity_applies(cluster_nodes, holders.len(), candidates.len());
        let inputs: Vec<crate::sched::Inputs> = candidates
            .iter()
            .map(|(v, state, disk)| {
                let mut i = self
                    .known
                    .get(&v.node_id)
                    .cloned()
                    .unwrap_or_else(|| crate::sched::Inputs::new(v.node_id.clone(), *state));
                i.state = *state;
                i.locality = 0.0;
                i.disk_free = *disk;
                i.features = None;
                i.latency_ms = self.latency.pair(source, &v.node_id).max(0.0);
                if diverse {
                    i.diversity = crate::sched::site_diversity(&self.latency, &v.node_id, holders.iter().copied());
                    i.latency_ms = 0.0;
                } else {
                    i.diversity = None;
                }
                i
            })
            .collect();
        let ranked = crate::sched::rank(&inputs, &self.weights, |_| Ok(()));
        let best = crate::sched::best(&ranked).ok()?;
        candidates.iter().find(|(v, _, _)| v.node_id == best.node).map(|(v, _, _)| *v)
    }
}

/// Task counts by worker, and the total, checked against the limits.
struct Budget<'c> {
    per_node: BTreeMap<NodeId, usize>,
    total: usize,
    cfg: &'c PlannerConfig,
}

impl Budget<'_> {
    fn full(&self) -> bool {
        self.total >= self.cfg.in_flight_max
    }
    fn node_has_room(&self, n: &NodeId) -> bool {
        self.per_node.get(n).copied().unwrap_or(0) < self.cfg.per_node_max
    }
    fn take(&mut self, n: &NodeId) {
        *self.per_node.entry(n.clone()).or_default() += 1;
        self.total += 1;
    }
}

/// The most files a pass keeps for [`plan_backlog`]: those it left for the task limits, in the
/// order it met them.
pub const BACKLOG_MAX: usize = 4096;
/// The most backlog files one [`plan_backlog`] call plans again (those it passes over for the
/// limits go to the back), so a task's end costs a bounded piece of the leader's time.
pub const BACKLOG_STEP: usize = 256;

/// Whether a file's plan was cut short by the task limits (it is worth planning again when a
/// task ends) or decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planned {
    Decided,
    LeftForLimits,
}

/// One planning: what it looks at once (the volumes, the targets, each node's disk), the
/// limits as they fill, and its output.
struct Pass<'a, 'c> {
    state: &'a MetaState,
    input: &'a PlanInput<'a>,
    cfg: &'c PlannerConfig,
    volumes: BTreeMap<&'a VolumeId, &'a Volume>,
    /// Writable volumes on usable nodes, roomiest first.
    targets: Vec<&'a Volume>,
    /// Each target node's largest free fraction (the scorer's disk factor).
    node_disk: BTreeMap<&'a NodeId, Option<f64>>,
    busy: BTreeSet<&'a FileId>,
    budget: Budget<'c>,
    policy_cache: Option<(String, u32)>,
    out: Plan,
}

/// A full pass over every file record: its tasks within the limits, and in
/// [`Plan::backlog`] the files (up to [`BACKLOG_MAX`]) it left for the limits.
pub fn plan(state: &MetaState, input: &PlanInput<'_>, cfg: &PlannerConfig) -> Plan {
    let mut pass = Pass::new(state, input, cfg);
    for f in state.files() {
        if pass.file(f) == Planned::LeftForLimits && pass.out.backlog.len() < BACKLOG_MAX {
            pass.out.backlog.push(f.path.clone());
        }
    }
    pass.out
}

/// Plan again the files a pass left for the task limits (`backlog`, front first), so the tasks
/// that fit now go out without a new pass over every record (a task ended, freeing its
/// slot). Stops when the limits are full or after [`BACKLOG_STEP`] files; a file passed over
/// again for the limits goes to the back, one that needs nothing now (healthy, removed,
/// waiting on its backoff, busy) leaves the backlog. Exactly what a full pass would decide
/// for those files with the tasks in flight now.
pub fn plan_backlog(
    state: &MetaState,
    backlog: &mut VecDeque<String>,
    input: &PlanInput<'_>,
    cfg: &PlannerConfig,
) -> Plan {
    let mut pass = Pass::new(state, input, cfg);
    let mut again = Vec::new();
    for _ in 0..BACKLOG_STEP {
        if pass.budget.full() {
            break;
        }
        let Some(path) = backlog.pop_front() else { break };
        let Some(f) = state.file(&path) else { continue };
        if pass.file(f) == Planned::LeftForLimits {
            again.push(path);
        }
    }
    backlog.extend(again);
    pass.out
}

impl<'a, 'c> Pass<'a, 'c> {
    fn new(state: &'a MetaState, input: &'a PlanInput<'a>, cfg: &'c PlannerConfig) -> Pass<'a, 'c> {
        let volumes: BTreeMap<&VolumeId, &Volume> = state
            .of_kind(crate::meta::records::RecordKind::Volume)
            .filter_map(|r| match r {
                crate::meta::records::Record::Volume(v) if !v.removed => Some((&v.id, v)),
                _ => None,
            })
            .collect();
        let usable = |n: &NodeId| input.nodes.get(n).is_some_and(|v| node_usable(v.state));
        let mut targets: Vec<&Volume> = volumes
            .values()
            .copied()
            .filter(|v| usable(&v.node_id) && crate::storage::placement::writable(v))
            .collect();
        targets.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.id.cmp(&b.id)));
        let mut node_disk: BTreeMap<&NodeId, Option<f64>> = BTreeMap::new();
        for v in &targets {
            let frac = (v.capacity > 0).then(|| v.free as f64 / v.capacity as f64);
            let e = node_disk.entry(&v.node_id).or_insert(frac);
            *e = match (*e, frac) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        let busy: BTreeSet<&FileId> = input.in_flight.iter().map(|t| &t.file).collect();
        let mut budget = Budget { per_node: BTreeMap::new(), total: 0, cfg };
        for t in input.in_flight {
            budget.take(&t.node);
        }
        let mut out = Plan::default();
        out.stats.in_flight = input.in_flight.len() as u64;
        Pass { state, input, cfg, volumes, targets, node_disk, busy, budget, policy_cache: None, out }
    }

    fn usable(&self, n: &NodeId) -> bool {
        self.input.nodes.get(n).is_some_and(|v| node_usable(v.state))
    }

    /// The copies `f` should have: its own count, or the nearest folder policy (looked up once
    /// per folder while files of one folder follow each other).
    fn wanted(&mut self, f: &FileRecord) -> usize {
        if f.replicas > 0 {
            return f.replicas as usize;
        }
        let parent = namespace::parent(&f.path).unwrap_or("/");
        match &self.policy_cache {
            Some((p, w)) if p == parent => *w as usize,
            _ => {
                let w = namespace::policy_for(self.state, &f.path);
                self.policy_cache = Some((parent.to_string(), w));
                w as usize
            }
        }
    }

    /// Plan one file: at most one task, and the copies to re-label or forget.
    fn file(&mut self, f: &'a FileRecord) -> Planned {
        if f.removed || f.is_dir {
            return Planned::Decided;
        }
        let (input, cfg) = (self.input, self.cfg);
        self.out.stats.files += 1;
        let wanted = self.wanted(f);
        let mut counted = 0usize; // healthy, not to be evacuated, not stale-by-absence
        let mut on_usable: Vec<(&Volume, &NodeId)> = Vec::new(); // counted copies on usable nodes
        let mut evac: Vec<(&Volume, &NodeId)> = Vec::new();
        // Copies to pull from, with whether a scrub has verified them since they were written.
        let mut sources: Vec<(&VolumeId, &NodeId, bool)> = Vec::new();
        let mut holders: BTreeSet<&NodeId> = BTreeSet::new();
        let mut stale_here: Vec<&Volume> = Vec::new();
        // Further current copies on a node that holds one already: they count once.
        let mut duplicates: Vec<(&Volume, &NodeId)> = Vec::new();
        for l in &f.locations {
            if l.state == LocationState::Dropped {
                continue;
            }
            let (Some(vol), Some(node)) = (self.volumes.get(&l.volume_id).copied(), input.nodes.get(&l.node_id)) else {
                self.out.forget.push(CopyRef {
                    path: f.path.clone(),
                    volume: l.volume_id.clone(),
                    node: l.node_id.clone(),
                });
                continue;
            };
            if f.is_current(l) {
                if node.state == NodeState::Offline && node.offline_for_ms >= cfg.stale_after_offline_ms {
                    self.out.mark_stale.push(CopyRef {
                        path: f.path.clone(),
                        volume: l.volume_id.clone(),
                        node: l.node_id.clone(),
                    });
                    continue;
                }
                if !holders.insert(&l.node_id) {
                    // The node's earlier copy is on an evacuating volume and this one is not:
                    // this one counts, and the evacuating one is the extra to drop.
                    let evacuating_twin = (!vol.evacuating && node.state != NodeState::Draining)
                        .then(|| evac.iter().position(|(_, n)| *n == &l.node_id))
                        .flatten();
                    match evacuating_twin {
                        Some(k) => {
                            let twin = evac.remove(k);
                            if node_usable(node.state) {
                                duplicates.push(twin);
                            }
                        }
                        None => {
                            if node_usable(node.state) {
                                duplicates.push((vol, &l.node_id));
                            }
                            continue;
                        }
                    }
                }
                // DRAINING nodes take no new copies but still serve reads.
                if node_usable(node.state) || node.state == NodeState::Draining {
                    sources.push((&l.volume_id, &l.node_id, l.state == LocationState::Verified));
                }
                if vol.evacuating || node.state == NodeState::Draining {
                    evac.push((vol, &l.node_id));
                } else {
                    counted += 1;
                    if node_usable(node.state) {
                        on_usable.push((vol, &l.node_id));
                    }
                }
            } else if l.state == LocationState::Stale || l.state.is_healthy() {
                // Stale, or readable but holding an older content of the file.
                stale_here.push(vol);
            }
        }
        if !evac.is_empty() {
            self.out.stats.evacuating += 1;
        }
        if counted < wanted {
            self.out.stats.under += 1;
            if self.busy.contains(&f.id) {
                return Planned::Decided;
            }
            if input.backoff.get(&f.id).is_some_and(|b| b.next_at_ms > input.now_ms) {
                self.out.stats.waiting_backoff += 1;
                return Planned::Decided;
            }
            if self.budget.full() {
                self.out.stats.deferred += 1;
                return Planned::LeftForLimits;
            }
            if sources.is_empty() {
                self.out.stats.no_source += 1;
                return Planned::Decided;
            }
            // Verified copies first, then the others, each in volume order; after each failed
            // attempt the next one, so a source that cannot serve the copy (its bytes not yet
            // where the records say, or rotten) does not hold the file back while another
            // could (simulator seed 7541: every pull went to a copy whose rename was held, the
            // file's backoff grew to an hour, and a verified copy was never asked).
            sources.sort_by_key(|(_, _, verified)| !verified);
            let attempts = input.backoff.get(&f.id).map_or(0, |b| b.attempts as usize);
            let (src_vol, src_node, _) = sources[attempts % sources.len()];
            // Whether a node that could take the copy was passed over for its task limit.
            let mut passed_for_room = false;
            let repair = stale_here.iter().copied().find(|v| {
                let could = self.usable(&v.node_id) && !holders.contains(&v.node_id) && fits(v, f.size);
                let room = self.budget.node_has_room(&v.node_id);
                passed_for_room |= could && !room;
                could && room
            });
            let (target, reason) = match repair {
                Some(v) => (Some(v), Reason::Repair),
                None => {
                    // Each candidate node once, with its roomiest volume that fits.
                    let mut candidates: Vec<(&Volume, NodeState, Option<f64>)> = Vec::new();
                    let mut seen: BTreeSet<&NodeId> = BTreeSet::new();
                    for v in self.targets.iter().copied() {
                        if holders.contains(&v.node_id) || !fits(v, f.size) || !seen.insert(&v.node_id) {
                            continue;
                        }
                        if !self.budget.node_has_room(&v.node_id) {
                            passed_for_room = true;
                            continue;
                        }
                        let state = input.nodes.get(&v.node_id).map_or(NodeState::Unknown, |n| n.state);
                        candidates.push((v, state, self.node_disk.get(&v.node_id).copied().flatten()));
                    }
                    let t = input.scoring.choose(&candidates, &holders, input.nodes.len(), src_node);
                    let reason = if !evac.is_empty() && counted + evac.len() >= wanted {
                        Reason::Evacuate
                    } else {
                        Reason::Replica
                    };
                    (t, reason)
                }
            };
            let Some(target) = target else {
                self.out.stats.no_target += 1;
                // A node at its task limit was passed over: it may take it once a task ends.
                return if passed_for_room { Planned::LeftForLimits } else { Planned::Decided };
            };
            self.budget.take(&target.node_id);
            self.out.tasks.push(Task {
                file: f.id.clone(),
                path: f.path.clone(),
                size: f.size,
                checksum: f.checksum.clone(),
                action: Action::Pull {
                    source_node: src_node.clone(),
                    source_volume: src_vol.clone(),
                    target_node: target.node_id.clone(),
                    target_volume: target.id.clone(),
                },
                reason,
            });
            return Planned::Decided;
        }
        self.out.stats.healthy += 1;
        if self.busy.contains(&f.id) {
            return Planned::Decided;
        }
        // The copy to let go, if any: a second copy on one node first (it adds nothing), then
        // an evacuating or draining copy once enough copies are elsewhere (on nodes reachable
        // now: copies on UNKNOWN or briefly OFFLINE nodes hold back an extra copy but never let
        // one go), then the copy on the fullest non-primary volume beyond the policy.
        let reachable_enough = on_usable.len() >= wanted;
        let candidate = if let Some((vol, node)) = duplicates.first().copied() {
            Some((vol, node, Reason::Drop))
        } else if let Some((vol, node)) =
            evac.iter().copied().filter(|_| reachable_enough).find(|(_, n)| self.usable(n) || is_draining(input, n))
        {
            Some((vol, node, Reason::Evacuate))
        } else if on_usable.len() > wanted {
            self.out.stats.over += 1;
            let primary = f.primary.as_ref();
            on_usable
                .iter()
                .copied()
                .filter(|(v, _)| Some(&v.id) != primary)
                .min_by(|(a, _), (b, _)| free_frac(a).total_cmp(&free_frac(b)).then_with(|| a.id.cmp(&b.id)))
                .map(|(vol, node)| (vol, node, Reason::Drop))
        } else {
            None
        };
        let Some((vol, node, reason)) = candidate else { return Planned::Decided };
        // A drop that failed (the holder saw fewer copies than this plan did) backs off like a
        // pull, instead of being sent again at every pass.
        if input.backoff.get(&f.id).is_some_and(|b| b.next_at_ms > input.now_ms) {
            self.out.stats.waiting_backoff += 1;
            return Planned::Decided;
        }
        if self.budget.node_has_room(node) && !self.budget.full() {
            self.budget.take(node);
            self.out.tasks.push(drop_task(f, node, vol, reason));
            Planned::Decided
        } else {
            self.out.stats.deferred += 1;
            Planned::LeftForLimits
        }
    }
}

fn is_draining(input: &PlanInput<'_>, n: &NodeId) -> bool {
    input.nodes.get(n).is_some_and(|v| v.state == NodeState::Draining)
}

fn free_frac(v: &Volume) -> f64 {
    if v.capacity == 0 {
        0.0
    } else {
        v.free as f64 / v.capacity as f64
    }
}

fn drop_task(f: &FileRecord, node: &NodeId, vol: &Volume, reason: Reason) -> Task {
    Task {
        file: f.id.clone(),
        path: f.path.clone(),
        size: f.size,
        checksum: f.checksum.clone(),
        action: Action::Drop { node: node.clone(), volume: vol.id.clone() },
        reason,
    }
}
