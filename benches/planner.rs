//! The replication planner over 1,000,000 file records and 100 nodes (issue: "in under 1 s").
//! Each file wants 2 copies (root policy); 98 % have 2 healthy copies, 1 % one (under), 1 % three
//! (over); one node is OFFLINE for 20 minutes, another briefly UNKNOWN. Targets are chosen by
//! the scorer with every factor known (health, round trips, a full latency matrix for site
//! diversity). Side by side: the default limits (16 tasks in flight), and no limit (every
//! under-replicated file ranks the nodes: 10,000 rankings of ~98 nodes). And what a task's end
//! costs the leader when the next task comes from the pass's backlog instead of a new pass.
//! `cargo bench --bench planner`.

use criterion::{criterion_group, criterion_main, Criterion};
use shoal_core::hlc::Version;
use shoal_core::membership::NodeState;
use shoal_core::meta::records::{FileRecord, Location, LocationState, Policy, Record, Volume};
use shoal_core::meta::state::MetaState;
use shoal_core::sched::Inputs;
use shoal_core::storage::planner::{plan, plan_backlog, InFlight, NodeView, PlanInput, PlannerConfig, Scoring};
use shoal_core::{FileId, NodeId, VolumeId};
use std::collections::BTreeMap;

const FILES: usize = 1_000_000;
const NODES: usize = 100;

fn v() -> Version {
    Version { wall_ms: 1, counter: 0, node: NodeId::new("bench") }
}

fn build() -> (MetaState, BTreeMap<NodeId, NodeView>) {
    let mut state = MetaState::new();
    let mut nodes = BTreeMap::new();
    for i in 0..NODES {
        let st = match i {
            7 => NodeView { state: NodeState::Offline, offline_for_ms: 20 * 60_000 },
            8 => NodeView { state: NodeState::Unknown, offline_for_ms: 0 },
            _ => NodeView { state: NodeState::Online, offline_for_ms: 0 },
        };
        nodes.insert(NodeId::new(format!("node-{i:03}")), st);
        state.apply(&Record::Volume(Volume {
            id: VolumeId::new(format!("vol-{i:03}")),
            node_id: NodeId::new(format!("node-{i:03}")),
            name: String::new(),
            fsh_uuid: String::new(),
            subpath: String::new(),
            read_only: false,
            evacuating: false,
            removed: false,
            version: v(),
            capacity: 4 << 40,
            free: (1 << 40) + (i as u64) * (1 << 30),
            low_space: false,
            usage_version: v(),
        }));
    }
    state.apply(&Record::Policy(Policy { folder: "/".into(), replicas: 2, removed: false, version: v() }));
    for f in 0..FILES {
        let copies = match f % 100 {
            0 => 1,
            1 => 3,
            _ => 2,
        };
        let locations = (0..copies)
            .map(|c| {
                let n = (f + c * 37) % NODES;
                Location {
                    volume_id: VolumeId::new(format!("vol-{n:03}")),
                    node_id: NodeId::new(format!("node-{n:03}")),
                    state: LocationState::Verified,
                    checksum: String::new(),
                    updated: v(),
                    content: None,
                }
            })
            .collect();
        state.apply(&Record::File(FileRecord {
            id: FileId::new(format!("file-{f:07}")),
            path: format!("/data/d{:03}/f{f:07}", f % 1000),
            is_dir: false,
            size: 1 << 20,
            mod_time: 0,
            checksum: String::new(),
            owner: String::new(),
            primary: None,
            locations,
            replicas: 0,
            removed: false,
            version: v(),
            repl: None,
            based_on: None,
        }));
    }
    (state, nodes)
}

/// Every node known to the scorer: health, a round trip, and the whole latency matrix (ten
/// sites of ten nodes: 2 ms within a site, 50-140 ms between).
fn scoring(nodes: &BTreeMap<NodeId, NodeView>) -> Scoring {
    let mut s = Scoring::default();
    let ids: Vec<NodeId> = nodes.keys().cloned().collect();
    for (i, id) in ids.iter().enumerate() {
        let mut inp = Inputs::new(id.clone(), nodes[id].state);
        inp.cpu_pct = Some((i * 7 % 100) as f64);
        inp.ram = Some(((i as u64 % 16) << 30, 16 << 30));
        inp.latency_ms = (i * 13 % 400) as f64;
        s.known.insert(id.clone(), inp);
        let row = ids
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(j, b)| (b.clone(), if i / 10 == j / 10 { 2.0 } else { 50.0 + ((i / 10 + j / 10) * 10) as f64 }))
            .collect();
        s.latency.insert_row(id.clone(), row);
    }
    s
}

fn bench(c: &mut Criterion) {
    let (state, nodes) = build();
    let backoff = BTreeMap::new();
    let scoring = scoring(&nodes);
    let input = PlanInput { now_ms: 10_000_000, nodes: &nodes, in_flight: &[], backoff: &backoff, scoring: &scoring };
    let cfg = PlannerConfig::default();
    let unlimited = PlannerConfig { in_flight_max: usize::MAX, per_node_max: usize::MAX, ..PlannerConfig::default() };
    let p = plan(&state, &input, &cfg);
    println!("plan over {} files: {} tasks, stats {:?}", p.stats.files, p.tasks.len(), p.stats);
    let p = plan(&state, &input, &unlimited);
    println!("unlimited: {} tasks, stats {:?}", p.tasks.len(), p.stats);
    let mut g = c.benchmark_group("planner");
    g.sample_size(10);
    g.bench_function("plan_1m_files_100_nodes", |b| b.iter(|| plan(&state, &input, &cfg)));
    g.bench_function("plan_1m_files_100_nodes_every_target_ranked", |b| b.iter(|| plan(&state, &input, &unlimited)));
    // A task of the pass ended: the next one from the pass's backlog, no pass over the records.
    let first = plan(&state, &input, &cfg);
    let in_flight: Vec<InFlight> =
        first.tasks[1..].iter().map(|t| InFlight { file: t.file.clone(), node: t.action.worker().clone() }).collect();
    let one_free = PlanInput { in_flight: &in_flight, ..input };
    let mut backlog = first.backlog.clone().into();
    let next = plan_backlog(&state, &mut backlog, &one_free, &cfg);
    println!("backlog of {}: one slot free gives {} task(s)", first.backlog.len(), next.tasks.len());
    g.bench_function("plan_backlog_one_slot_free_1m_files_100_nodes", |b| {
        b.iter_batched(
            || std::collections::VecDeque::from(first.backlog.clone()),
            |mut backlog| plan_backlog(&state, &mut backlog, &one_free, &cfg),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
