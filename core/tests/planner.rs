//! The replication planner (spec: cluster-runtime.md "Replication"; reference-facts.md
//! "Planner", weaknesses 5 and 11).

use shoal_core::hlc::Version;
use shoal_core::membership::NodeState;
use shoal_core::meta::records::{FileRecord, Location, LocationState, Policy, Record, Volume};
use shoal_core::meta::state::MetaState;
use shoal_core::storage::planner::{
    plan, plan_backlog, Action, Backoff, InFlight, NodeView, Plan, PlanInput, PlannerConfig, Reason, Scoring,
    BACKLOG_STEP,
};
use shoal_core::{FileId, NodeId, VolumeId};
use std::collections::BTreeMap;

const G: u64 = 1 << 30;

fn v(n: u64) -> Version {
    Version { wall_ms: n, counter: 0, node: NodeId::new("x") }
}

struct World {
    state: MetaState,
    nodes: BTreeMap<NodeId, NodeView>,
    in_flight: Vec<InFlight>,
    backoff: BTreeMap<FileId, Backoff>,
    scoring: Scoring,
}

impl World {
    /// `n` nodes `n0..`, each with one volume `v0..` of 1 TiB with `free` bytes free.
    fn new(n: usize, free: u64) -> World {
        let mut state = MetaState::new();
        let mut nodes = BTreeMap::new();
        for i in 0..n {
            nodes.insert(NodeId::new(format!("n{i}")), NodeView { state: NodeState::Online, offline_for_ms: 0 });
            state.apply(&Record::Volume(volume(i, free)));
        }
        World { state, nodes, in_flight: Vec::new(), backoff: BTreeMap::new(), scoring: Scoring::default() }
    }

    fn policy(&mut self, folder: &str, replicas: u32) {
        self.state.apply(&Record::Policy(Policy { folder: folder.into(), replicas, removed: false, version: v(1) }));
    }

    fn file(&mut self, path: &str, copies: &[(usize, LocationState)]) {
        let locations = copies
            .iter()
            .map(|(i, st)| Location {
                volume_id: VolumeId::new(format!("v{i}")),
                node_id: NodeId::new(format!("n{i}")),
                state: *st,
                checksum: "c".into(),
                updated: v(2),
                content: None,
            })
            .collect();
        let f = FileRecord {
            id: FileId::new(format!("id-{path}")),
            path: path.into(),
            is_dir: false,
            size: G,
            mod_time: 0,
            checksum: "c".into(),
            owner: String::new(),
            primary: Some(VolumeId::new(format!("v{}", copies.first().map_or(0, |c| c.0)))),
            locations,
            replicas: 0,
            removed: false,
            version: v(2),
            repl: None,
            based_on: None,
        };
        self.state.apply(&Record::File(f));
    }

    fn set_node(&mut self, i: usize, state: NodeState, offline_for_ms: u64) {
        self.nodes.insert(NodeId::new(format!("n{i}")), NodeView { state, offline_for_ms });
    }

    fn set_volume(&mut self, i: usize, f: impl FnOnce(&mut Volume)) {
        let mut vol = volume(i, 0);
        if let Some(Record::Volume(cur)) =
            self.state.get(shoal_core::meta::records::RecordKind::Volume, &format!("v{i}"))
        {
            vol = cur.clone();
        }
        f(&mut vol);
        vol.version = Version { wall_ms: vol.version.wall_ms + 1, ..vol.version.clone() };
        vol.usage_version = Version { wall_ms: vol.usage_version.wall_ms + 1, ..vol.usage_version.clone() };
        self.state.apply(&Record::Volume(vol));
    }

    fn input(&self) -> PlanInput<'_> {
        PlanInput {
            now_ms: 1_000_000,
            nodes: &self.nodes,
            in_flight: &self.in_flight,
            backoff: &self.backoff,
            scoring: &self.scoring,
        }
    }

    fn plan(&self) -> Plan {
        plan(&self.state, &self.input(), &PlannerConfig::default())
    }
}

fn volume(i: usize, free: u64) -> Volume {
    Volume {
        id: VolumeId::new(format!("v{i}")),
        node_id: NodeId::new(format!("n{i}")),
        name: String::new(),
        fsh_uuid: String::new(),
        subpath: String::new(),
        read_only: false,
        evacuating: false,
        removed: false,
        version: v(1),
        capacity: 1 << 40,
        free,
        low_space: false,
        usage_version: v(1),
    }
}

use LocationState::{Committed, Stale, Verified};

fn pull_target(p: &Plan) -> Vec<(String, Reason)> {
    p.tasks
        .iter()
        .filter_map(|t| match &t.action {
            Action::Pull { target_node, .. } => Some((target_node.to_string(), t.reason)),
            _ => None,
        })
        .collect()
}

fn drops(p: &Plan) -> Vec<(String, Reason)> {
    p.tasks
        .iter()
        .filter_map(|t| match &t.action {
            Action::Drop { volume, .. } => Some((volume.to_string(), t.reason)),
            _ => None,
        })
        .collect()
}

/// Under-replicated files get one pull task to the roomiest node without a copy.
#[test]
fn an_under_replicated_file_gets_one_pull_to_the_roomiest_other_node() {
    let mut w = World::new(3, 100 * G);
    w.set_volume(2, |v| v.free = 500 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, Committed)]);
    let p = w.plan();
    assert_eq!(pull_target(&p), vec![("n2".to_string(), Reason::Replica)]);
    assert_eq!(p.stats.under, 1);
}

/// A stale copy is repaired in place.
#[test]
fn a_stale_copy_is_repaired_in_place() {
    let mut w = World::new(3, 100 * G);
    w.set_volume(2, |v| v.free = 500 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, Verified), (1, Stale)]);
    assert_eq!(pull_target(&w.plan()), vec![("n1".to_string(), Reason::Repair)]);
}

/// Weakness 11: a node briefly UNKNOWN (or OFFLINE for less than 10 minutes) causes no extra copy;
/// after 10 minutes OFFLINE its copies turn stale (never deleted) and are replaced.
#[test]
fn a_briefly_absent_node_causes_no_extra_copy_but_ten_minutes_offline_turns_stale() {
    let mut w = World::new(3, 100 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, Committed), (1, Committed)]);
    w.set_node(1, NodeState::Unknown, 0);
    assert!(w.plan().tasks.is_empty());
    w.set_node(1, NodeState::Offline, 9 * 60_000);
    assert!(w.plan().tasks.is_empty());
    w.set_node(1, NodeState::Offline, 10 * 60_000);
    let p = w.plan();
    assert_eq!(p.mark_stale.len(), 1);
    assert_eq!(p.mark_stale[0].node.as_str(), "n1");
    assert_eq!(pull_target(&p), vec![("n2".to_string(), Reason::Replica)]);
    assert!(drops(&p).is_empty(), "a stale copy is never deleted by the planner");
}

/// Over-replicated files drop the copy on the fullest non-primary volume.
#[test]
fn an_over_replicated_file_drops_the_copy_on_the_fullest_non_primary_volume() {
    let mut w = World::new(4, 100 * G);
    w.set_volume(0, |v| v.free = G); // fullest, but primary
    w.set_volume(2, |v| v.free = 10 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, Committed), (1, Committed), (2, Committed)]);
    assert_eq!(drops(&w.plan()), vec![("v2".to_string(), Reason::Drop)]);
    // With a copy on an UNKNOWN node, only usable copies count toward dropping.
    w.set_node(1, NodeState::Unknown, 0);
    assert!(drops(&w.plan()).is_empty());
}

/// Evacuation: first a copy elsewhere, then the evacuating copy is dropped; a DRAINING node too.
#[test]
fn evacuating_volumes_and_draining_nodes_are_emptied_copy_first() {
    let mut w = World::new(3, 100 * G);
    w.policy("/", 1);
    w.set_volume(0, |v| v.evacuating = true);
    w.file("/a", &[(0, Committed)]);
    assert_eq!(pull_target(&w.plan()).len(), 1);
    assert_eq!(w.plan().tasks[0].reason, Reason::Evacuate);
    w.file("/a", &[(0, Committed), (2, Committed)]);
    assert_eq!(drops(&w.plan()), vec![("v0".to_string(), Reason::Evacuate)]);

    let mut d = World::new(3, 100 * G);
    d.policy("/", 1);
    d.set_node(1, NodeState::Draining, 0);
    d.file("/b", &[(1, Committed)]);
    let p = d.plan();
    assert_eq!(p.tasks.len(), 1);
    assert!(
        matches!(&p.tasks[0].action, Action::Pull { source_node, .. } if source_node.as_str() == "n1"),
        "a draining node still serves reads"
    );
}

/// An evacuating copy is let go only once enough copies are on nodes reachable now: a copy on
/// an UNKNOWN (or briefly OFFLINE) node holds back an extra copy but never stands in for the
/// one being emptied.
#[test]
fn an_evacuation_never_drops_the_last_copy_on_a_reachable_node() {
    let mut w = World::new(3, 100 * G);
    w.policy("/", 1);
    w.set_volume(0, |v| v.evacuating = true);
    w.file("/a", &[(0, Committed), (1, Committed)]);
    assert_eq!(drops(&w.plan()), vec![("v0".to_string(), Reason::Evacuate)]);
    for (state, offline_for) in [(NodeState::Unknown, 0), (NodeState::Offline, 2 * 60_000)] {
        w.set_node(1, state, offline_for);
        let p = w.plan();
        assert!(drops(&p).is_empty(), "{state:?}: the evacuating copy is the only reachable one: {:?}", p.tasks);
        assert!(pull_target(&p).is_empty(), "{state:?}: and the absent copy still counts against an extra one");
    }
    let mut d = World::new(3, 100 * G);
    d.policy("/", 1);
    d.set_node(0, NodeState::Draining, 0);
    d.set_node(1, NodeState::Unknown, 0);
    d.file("/b", &[(0, Committed), (1, Committed)]);
    assert!(drops(&d.plan()).is_empty(), "a draining node keeps its copy while the other is UNKNOWN");
}

/// Copies count once per node: two on one node make one, so the file gets a copy on another
/// node, and then the second copy on the first node is dropped.
#[test]
fn two_copies_on_one_node_count_as_one() {
    let mut w = World::new(3, 100 * G);
    let mut extra = volume(0, 100 * G);
    extra.id = VolumeId::new("v0b");
    w.state.apply(&Record::Volume(extra));
    w.policy("/", 2);
    w.file("/a", &[(0, Committed)]);
    let mut f = w.state.file("/a").cloned().unwrap();
    let mut second = f.locations[0].clone();
    second.volume_id = VolumeId::new("v0b");
    f.locations.push(second);
    f.version = v(3);
    w.state.apply(&Record::File(f.clone()));
    let p = w.plan();
    assert_eq!(p.tasks.len(), 1, "{:?}", p.tasks);
    assert!(matches!(&p.tasks[0].action, Action::Pull { target_node, .. } if target_node.as_str() != "n0"));
    let mut third = f.locations[0].clone();
    third.volume_id = VolumeId::new("v1");
    third.node_id = NodeId::new("n1");
    f.locations.push(third);
    f.version = v(4);
    w.state.apply(&Record::File(f.clone()));
    assert_eq!(drops(&w.plan()), vec![("v0b".to_string(), Reason::Drop)]);
    // When the node's first copy (by volume id) is on an evacuating volume, that one goes.
    w.set_volume(0, |v| v.evacuating = true);
    assert_eq!(drops(&w.plan()), vec![("v0".to_string(), Reason::Drop)]);
}

/// A copy is never deleted while it is the only healthy one.
#[test]
fn the_only_healthy_copy_is_never_dropped_even_when_evacuating_with_no_target() {
    let mut w = World::new(1, 100 * G);
    w.policy("/", 1);
    w.set_volume(0, |v| v.evacuating = true);
    w.file("/a", &[(0, Committed)]);
    let p = w.plan();
    assert!(p.tasks.is_empty());
    assert_eq!(p.stats.no_target, 1);
}

/// A full volume takes no new copy; copies on removed volumes are forgotten.
#[test]
fn a_full_volume_takes_nothing_and_gone_volumes_are_forgotten() {
    let mut w = World::new(3, 100 * G);
    w.set_volume(1, |v| v.free = G); // less than size + 10 % + 64 MiB
    w.set_volume(2, |v| v.removed = true);
    w.policy("/", 2);
    w.file("/a", &[(0, Committed), (2, Committed)]);
    let p = w.plan();
    assert_eq!(p.forget.len(), 1);
    assert!(p.tasks.is_empty());
    assert_eq!(p.stats.no_target, 1);
}

/// Limits: 4 tasks per node, 16 in flight in all, one task per file.
#[test]
fn tasks_are_limited_per_node_and_in_total() {
    let mut w = World::new(2, 10_000 * G);
    w.policy("/", 2);
    for i in 0..10 {
        w.file(&format!("/f{i}"), &[(0, Committed)]);
    }
    assert_eq!(w.plan().tasks.len(), 4, "only n1 can take copies: 4 per node");
    let mut w = World::new(10, 10_000 * G);
    w.policy("/", 2);
    for i in 0..40 {
        w.file(&format!("/f{i:02}"), &[(0, Committed)]);
    }
    let p = w.plan();
    assert_eq!(p.tasks.len(), 16);
    assert_eq!(p.stats.deferred, 24);
    w.in_flight = vec![InFlight { file: FileId::new("id-/f00"), node: NodeId::new("n1") }];
    let p = w.plan();
    assert_eq!(p.tasks.len(), 15);
    assert!(p.tasks.iter().all(|t| t.path != "/f00"));
}

/// Weakness 5: backoff escalates 30 s, 60 s, 120 s, 240 s, then 1 h, and a file waiting on it
/// gets no task.
#[test]
fn backoff_really_escalates_and_holds_the_file_back() {
    let cfg = PlannerConfig::default();
    let mut b: Option<Backoff> = None;
    let mut delays = Vec::new();
    for _ in 0..6 {
        let next = Backoff::after_failure(b.as_ref(), 0, &cfg);
        delays.push(next.next_at_ms);
        b = Some(next);
    }
    assert_eq!(delays, vec![30_000, 60_000, 120_000, 240_000, 3_600_000, 3_600_000]);
    let mut w = World::new(2, 100 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, Committed)]);
    w.backoff.insert(FileId::new("id-/a"), Backoff { attempts: 2, next_at_ms: 2_000_000 });
    let p = w.plan();
    assert!(p.tasks.is_empty());
    assert_eq!(p.stats.waiting_backoff, 1);
    w.backoff.insert(FileId::new("id-/a"), Backoff { attempts: 2, next_at_ms: 999_999 });
    assert_eq!(w.plan().tasks.len(), 1);

    // A drop that failed backs off too, instead of being sent again at every pass.
    let mut o = World::new(3, 100 * G);
    o.policy("/", 1);
    o.file("/b", &[(0, Committed), (1, Committed)]);
    assert_eq!(drops(&o.plan()).len(), 1);
    o.backoff.insert(FileId::new("id-/b"), Backoff { attempts: 1, next_at_ms: 1_030_000 });
    let p = o.plan();
    assert!(p.tasks.is_empty(), "{:?}", p.tasks);
    assert_eq!(p.stats.waiting_backoff, 1);
}

fn pull_source(p: &Plan) -> Vec<String> {
    p.tasks
        .iter()
        .filter_map(|t| match &t.action {
            Action::Pull { source_node, .. } => Some(source_node.to_string()),
            _ => None,
        })
        .collect()
}

/// A pull reads from a verified copy first, and after each failed attempt from the next
/// copy: a source that cannot serve (its rename held, its bytes rotten) does not hold the file
/// back while another could (simulator seed 7541).
#[test]
fn a_pull_reads_a_verified_copy_first_and_another_after_a_failure() {
    let mut w = World::new(4, 100 * G);
    w.policy("/", 3);
    w.file("/a", &[(0, Committed), (1, Verified)]);
    assert_eq!(pull_source(&w.plan()), vec!["n1".to_string()], "the verified copy first");
    w.backoff.insert(FileId::new("id-/a"), Backoff { attempts: 1, next_at_ms: 999_999 });
    assert_eq!(pull_source(&w.plan()), vec!["n0".to_string()], "after one failure, the other");
    w.backoff.insert(FileId::new("id-/a"), Backoff { attempts: 2, next_at_ms: 999_999 });
    assert_eq!(pull_source(&w.plan()), vec!["n1".to_string()], "and back");
}

/// The nearest folder policy decides; a file's own count overrides it.
#[test]
fn the_nearest_folder_policy_decides_the_copy_count() {
    let mut w = World::new(4, 100 * G);
    w.policy("/", 1);
    w.policy("/photos", 3);
    w.file("/photos/x.jpg", &[(0, Committed)]);
    w.file("/docs/y.txt", &[(0, Committed)]);
    let p = w.plan();
    assert_eq!(p.tasks.len(), 1);
    assert_eq!(p.tasks[0].path, "/photos/x.jpg");
}

/// The low-space guard through a node: a volume below 5 % free goes low-space (read-only for
/// placement), recovers above 7 %, and an admin's read-only is untouched by it.
#[test]
fn the_low_space_guard_flips_a_volume_and_leaves_an_admins_read_only_alone() {
    use shoal_core::membership::MembershipConfig;
    use shoal_core::node::{Node, NodeConfig, SelfInfo};
    let key = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
    let me = SelfInfo {
        name: "n".into(),
        advertise_url: "http://127.0.0.1:1".into(),
        software_version: "t".into(),
        capabilities: Default::default(),
        tls_pin: String::new(),
    };
    let cfg = NodeConfig { membership: MembershipConfig::default(), meta: Default::default() };
    let mut node = Node::new(NodeId::new("11111111-1111-4111-8111-111111111111"), key, 1, cfg, me);
    let t0 = shoal_core::Millis(1_800_000_000_000);
    node.create_cluster(t0, "c").unwrap();
    let v = node.volume_add(t0, "/srv/a", &shoal_core::node::volumes::FolderFacts::default(), "", 1000, 500).unwrap();
    let id = v.id.clone();
    let low = |n: &Node| n.volume_list().volumes[0].volume.low_space;
    node.volume_usage(shoal_core::Millis(t0.0 + 1), &id, 1000, 40);
    assert!(low(&node), "below 5 % free");
    node.volume_usage(shoal_core::Millis(t0.0 + 2), &id, 1000, 60);
    assert!(low(&node), "between 5 and 7 % it stays low");
    node.volume_usage(shoal_core::Millis(t0.0 + 3), &id, 1000, 80);
    assert!(!low(&node), "above 7 % it recovers");
    node.volume_set_read_only(shoal_core::Millis(t0.0 + 4), id.as_str(), true).unwrap();
    node.volume_usage(shoal_core::Millis(t0.0 + 5), &id, 1000, 900);
    assert!(node.volume_list().volumes[0].volume.read_only);
}

// ---- the scorer chooses the target (issue 13) ----

fn first_target(p: &Plan) -> String {
    match &p.tasks[0].action {
        Action::Pull { target_node, .. } => target_node.to_string(),
        other => panic!("expected a pull, got {other:?}"),
    }
}

/// Three sites: n0 and n1 near each other, n2 far. The second copy of a file on n0 goes to the
/// far site even though the near node has more room; without a measured matrix, room decides.
#[test]
fn the_second_copy_lands_in_another_site() {
    let mut w = World::new(3, 100 * G);
    w.set_volume(1, |v| v.free = 300 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, LocationState::Committed)]);
    assert_eq!(first_target(&w.plan()), "n1", "no matrix: the roomiest node");
    let mut m = shoal_core::latency::LatencyMatrix::default();
    let row = |pairs: &[(&str, f64)]| pairs.iter().map(|(n, ms)| (NodeId::new(*n), *ms)).collect();
    m.insert_row(NodeId::new("n0"), row(&[("n1", 2.0), ("n2", 400.0)]));
    m.insert_row(NodeId::new("n1"), row(&[("n0", 2.0), ("n2", 400.0)]));
    m.insert_row(NodeId::new("n2"), row(&[("n0", 400.0), ("n1", 400.0)]));
    w.scoring.latency = m;
    assert_eq!(first_target(&w.plan()), "n2", "the far site");
    // A busy far node loses again: the score carries every factor.
    let mut busy = shoal_core::sched::Inputs::new(NodeId::new("n2"), NodeState::Online);
    busy.cpu_pct = Some(100.0);
    w.scoring.known.insert(NodeId::new("n2"), busy);
    assert_eq!(first_target(&w.plan()), "n1");
}

/// With two nodes diversity is left out (the reference's rule: three or more nodes).
#[test]
fn diversity_needs_three_nodes() {
    let mut w = World::new(2, 100 * G);
    w.policy("/", 2);
    w.file("/a", &[(0, LocationState::Committed)]);
    let mut m = shoal_core::latency::LatencyMatrix::default();
    m.insert_row(NodeId::new("n0"), [(NodeId::new("n1"), 900.0)].into_iter().collect());
    w.scoring.latency = m;
    let p = w.plan();
    assert_eq!(first_target(&p), "n1");
}

/// A DEGRADED target is held back while a healthy one can take the copy.
#[test]
fn a_degraded_target_is_held_back() {
    let mut w = World::new(3, 100 * G);
    w.set_volume(1, |v| v.free = 900 * G);
    w.set_node(1, NodeState::Degraded, 0);
    w.policy("/", 2);
    w.file("/a", &[(0, LocationState::Committed)]);
    assert_eq!(first_target(&w.plan()), "n2");
}

fn backlog_plan(w: &World, backlog: &mut std::collections::VecDeque<String>) -> Plan {
    plan_backlog(&w.state, backlog, &w.input(), &PlannerConfig::default())
}

fn in_flight_of(p: &Plan) -> Vec<InFlight> {
    p.tasks.iter().map(|t| InFlight { file: t.file.clone(), node: t.action.worker().clone() }).collect()
}

/// A pass keeps, in order, the files it left for the task limits; planning that backlog again
/// with a slot free gives the task a full pass would give, from the front, and drops the files
/// that need nothing now.
#[test]
fn the_files_left_for_the_limits_are_planned_again_from_the_backlog() {
    let mut w = World::new(10, 10_000 * G);
    w.policy("/", 2);
    for i in 0..40 {
        w.file(&format!("/f{i:02}"), &[(0, Committed)]);
    }
    let p = w.plan();
    assert_eq!(p.tasks.len(), 16);
    let expect: Vec<String> = (16..40).map(|i| format!("/f{i:02}")).collect();
    assert_eq!(p.backlog, expect);
    w.in_flight = in_flight_of(&p);
    let mut backlog: std::collections::VecDeque<String> = p.backlog.into();
    // All 16 slots taken: nothing goes out, nothing is lost.
    let none = backlog_plan(&w, &mut backlog);
    assert!(none.tasks.is_empty());
    assert_eq!(backlog.len(), 24);
    // One task ended (its file got its copy): the backlog's first file gets the task a full
    // pass would give it.
    let ended = w.in_flight.remove(0);
    let target: usize = ended.node.to_string()[1..].parse().unwrap();
    w.file("/f00", &[(0, Committed), (target, Committed)]);
    let one = backlog_plan(&w, &mut backlog);
    assert_eq!(one.tasks.iter().map(|t| t.path.as_str()).collect::<Vec<_>>(), vec!["/f16"]);
    assert_eq!(one.tasks, w.plan().tasks, "what a full pass would decide now");
    assert_eq!(backlog.front().map(String::as_str), Some("/f17"));
    w.in_flight.push(InFlight { file: one.tasks[0].file.clone(), node: one.tasks[0].action.worker().clone() });
    // Two slots free; /f17 got its copy meanwhile and /f18 waits on its backoff: both leave
    // the backlog, /f19 and /f20 go out.
    w.in_flight.drain(0..2);
    w.file("/f17", &[(0, Committed), (5, Committed)]);
    w.backoff.insert(FileId::new("id-/f18"), Backoff { attempts: 1, next_at_ms: 2_000_000 });
    let two = backlog_plan(&w, &mut backlog);
    assert_eq!(two.tasks.iter().map(|t| t.path.as_str()).collect::<Vec<_>>(), vec!["/f19", "/f20"]);
    assert_eq!(backlog.len(), 19);
    assert_eq!(backlog.front().map(String::as_str), Some("/f21"));
}

/// A file passed over because the only nodes that could take it are at their task limit stays
/// in the backlog (at the back), and one call plans at most `BACKLOG_STEP` files.
#[test]
fn files_waiting_on_a_busy_node_stay_in_the_backlog_and_a_call_is_bounded() {
    let mut w = World::new(2, 10_000 * G);
    w.policy("/", 2);
    for i in 0..300 {
        w.file(&format!("/f{i:03}"), &[(0, Committed)]);
    }
    let p = w.plan();
    assert_eq!(p.tasks.len(), 4, "only n1 can take copies: 4 per node");
    assert_eq!(p.backlog.len(), 296, "no target now, but n1 is at its limit");
    w.in_flight = in_flight_of(&p);
    let mut backlog: std::collections::VecDeque<String> = p.backlog.into();
    let none = backlog_plan(&w, &mut backlog);
    assert!(none.tasks.is_empty());
    assert_eq!(backlog.len(), 296, "kept");
    assert_eq!(none.stats.files as usize, BACKLOG_STEP, "one call plans at most BACKLOG_STEP files");
    assert_eq!(backlog.front().map(String::as_str), Some("/f260"), "those planned went to the back");
    w.in_flight.pop();
    let one = backlog_plan(&w, &mut backlog);
    assert_eq!(one.tasks.iter().map(|t| t.path.as_str()).collect::<Vec<_>>(), vec!["/f260"]);
    assert_eq!(backlog.len(), 295);
    // A full volume on n1: nothing could take these files, limits or not: a pass keeps none.
    w.set_volume(1, |v| v.free = 0);
    w.in_flight.clear();
    let p = w.plan();
    assert!(p.tasks.is_empty() && p.backlog.is_empty(), "{:?}", p.backlog.len());
    // Nor when n1 is also at its task limit: it was not passed over for the limit.
    w.in_flight =
        (0..4).map(|i| InFlight { file: FileId::new(format!("other-{i}")), node: NodeId::new("n1") }).collect();
    let p = w.plan();
    assert!(p.tasks.is_empty() && p.backlog.is_empty(), "{:?}", p.backlog.len());
}
