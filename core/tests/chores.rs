//! The node's background chores (core/src/node/chores.rs, storage/chores.rs) driven through its
//! one timer: the leader's planner pass runs inside `handle_timeout` on its interval and at once
//! when kicked; disk work, rescans and measuring are asked of the shell and come due again only
//! after the shell reports their end; the scrub hands out one copy at a time and rests in
//! proportion to what it read. Time is only the `Millis` handed in.

mod common;

use shoal_core::meta::records::LocationState;
use shoal_core::node::files::LocalCopy;
use shoal_core::node::volumes::FolderFacts;
use shoal_core::node::{Node, Output};
use shoal_core::storage::chores::Chore;
use shoal_core::storage::planner::TaskOutcome;
use shoal_core::time::{Millis, HOUR_MS, SECOND_MS};
use shoal_core::{NodeId, VolumeId};

const T0: Millis = Millis(1_800_000_000_000);
const MIB: u64 = 1024 * 1024;

fn at(ms: u64) -> Millis {
    T0.plus(ms)
}

/// Node 1, alone in a new cluster with one volume of its own, holding the metadata lease
/// (its first timer turn, at T0, has run).
fn lone_leader() -> (Node, VolumeId) {
    let mut n = common::node_one();
    n.create_cluster(T0, "c").expect("create the cluster");
    let v = n.volume_add(T0, "/srv/n1", &FolderFacts::default(), "", 1 << 40, 1 << 39).expect("add a volume");
    let vol = v.id;
    n.handle_timeout(T0);
    assert!(n.leader_term(T0).is_some(), "a lone member takes the lease");
    (n, vol)
}

fn outputs(n: &mut Node) -> Vec<Output> {
    std::iter::from_fn(|| n.poll_output()).collect()
}

fn chores_asked(out: &[Output]) -> Vec<Chore> {
    out.iter()
        .filter_map(|o| match o {
            Output::Chore(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn scrub_asked(out: &[Output]) -> Vec<LocalCopy> {
    out.iter()
        .filter_map(|o| match o {
            Output::ScrubCopy(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// Publish a file of `size` bytes with its one copy on `vol`.
fn publish(n: &mut Node, wall: Millis, path: &str, size: u64, vol: &VolumeId) {
    let me = n.id().clone();
    n.file_publish(wall, path, size, &"a".repeat(64), wall.0, &[(vol.clone(), me)]).expect("publish");
}

#[test]
fn the_leader_plans_on_its_interval_and_at_once_when_kicked() {
    let (mut n, _) = lone_leader();
    assert_eq!(n.repl_stats().passes, 1, "the first pass runs as the node starts leading");
    n.handle_timeout(at(30 * SECOND_MS));
    assert_eq!(n.repl_stats().passes, 1, "not due yet");
    assert!(n.poll_timeout().is_some_and(|d| d <= at(60 * SECOND_MS)), "the next pass is announced");
    n.handle_timeout(at(60 * SECOND_MS));
    assert_eq!(n.repl_stats().passes, 2, "due after replication.plan_every (60 s)");
    n.chore_kick(at(61 * SECOND_MS), Chore::Plan);
    assert!(n.poll_timeout().is_some_and(|d| d <= at(61 * SECOND_MS)), "a kick brings the deadline forward");
    n.handle_timeout(at(61 * SECOND_MS));
    assert_eq!(n.repl_stats().passes, 3, "a kicked pass runs at the next turn");
}

/// A kicked pass walks every record as a periodic one does; every finished task kicks one, so
/// with many records they are spaced (`plan_kick_gap_ms`: 5 µs per record, at most 5 s) instead
/// of running back to back on the leader.
#[test]
fn kicked_passes_are_spaced_in_proportion_to_the_records() {
    use shoal_core::node::chores::plan_kick_gap_ms;
    assert_eq!(plan_kick_gap_ms(0), 0);
    assert_eq!(plan_kick_gap_ms(200), 1);
    assert_eq!(plan_kick_gap_ms(200_000), 1_000);
    assert_eq!(plan_kick_gap_ms(100_000_000), 5_000);
    let (mut n, vol) = lone_leader();
    for i in 0..4_000 {
        publish(&mut n, at(1_000 + i), &format!("/many/f{i}"), 10, &vol);
    }
    let start = at(60 * SECOND_MS);
    n.handle_timeout(start);
    let passes = n.repl_stats().passes;
    let gap = plan_kick_gap_ms(n.meta_status(start).meta.records);
    assert!(gap >= 20, "4,000 files: a gap of {gap} ms");
    n.chore_kick(start.plus(1), Chore::Plan);
    assert_eq!(n.chore_due(Chore::Plan), Some(start.plus(gap)), "not before the gap");
    n.handle_timeout(start.plus(gap - 1));
    assert_eq!(n.repl_stats().passes, passes);
    n.handle_timeout(start.plus(gap));
    assert_eq!(n.repl_stats().passes, passes + 1, "the kicked pass runs once the gap is over");
}

#[test]
fn a_pass_ends_a_copy_of_a_gone_volume_and_a_finished_task_asks_for_another_pass() {
    let (mut n, vol) = lone_leader();
    publish(&mut n, at(1_000), "/f", 10, &vol);
    // A second copy on a volume no node has: the pass forgets it.
    let ghost = VolumeId::new("ghost-volume");
    let ghost_node = NodeId::new("bbbbbbbb-bbbb-4bbb-8bbb-000000000002");
    let f = n.meta().state().file("/f").cloned().expect("the record");
    n.file_publish(
        at(2_000),
        "/f",
        10,
        &f.checksum,
        at(2_000).0,
        &[(vol.clone(), n.id().clone()), (ghost.clone(), ghost_node)],
    )
    .expect("publish with a ghost copy");
    n.chore_kick(at(3_000), Chore::Plan);
    n.handle_timeout(at(3_000));
    let f = n.meta().state().file("/f").cloned().expect("the record");
    let g = f.locations.iter().find(|l| l.volume_id == ghost).expect("the ghost copy is listed");
    assert_eq!(g.state, LocationState::Dropped, "a copy on a volume no node has is forgotten by the pass");
    // A task this leader ended by its own hand counts and asks for a pass at once.
    let passes = n.repl_stats().passes;
    n.repl_finish(at(4_000), &f.id, "/f", TaskOutcome::Failed);
    assert_eq!(n.repl_stats().failed, 1);
    n.handle_timeout(at(4_000));
    assert_eq!(n.repl_stats().passes, passes + 1);
}

#[test]
fn disk_work_rescans_and_measuring_are_asked_of_the_shell_and_due_again_only_after_they_end() {
    let (mut n, _) = lone_leader();
    let first = chores_asked(&outputs(&mut n));
    assert_eq!(first, vec![Chore::Reconcile, Chore::Usage], "disk work and measuring at once");
    n.handle_timeout(at(15 * SECOND_MS));
    assert!(chores_asked(&outputs(&mut n)).is_empty(), "under way: not asked twice");
    n.chore_done(at(15 * SECOND_MS), Chore::Reconcile);
    n.handle_timeout(at(20 * SECOND_MS));
    assert_eq!(chores_asked(&outputs(&mut n)), vec![Chore::Rescan], "the rescan 20 s after start");
    n.handle_timeout(at(25 * SECOND_MS));
    assert_eq!(chores_asked(&outputs(&mut n)), vec![Chore::Reconcile], "disk work 10 s after its last end");
    assert_eq!(n.chore_due(Chore::Usage), None, "measuring still under way");
    n.chore_done(at(26 * SECOND_MS), Chore::Usage);
    assert_eq!(n.chore_due(Chore::Usage), Some(at(86 * SECOND_MS)), "measured again after storage.usage_every");
}

#[test]
fn the_scrub_checks_one_copy_at_a_time_rests_in_proportion_and_a_mismatch_is_marked_stale() {
    let (mut n, vol) = lone_leader();
    publish(&mut n, at(1_000), "/a", 40 * MIB, &vol);
    publish(&mut n, at(1_000), "/b", 10, &vol);
    // Copies are checked once they are a day old (storage.scrub_min_age).
    let day = at(25 * HOUR_MS);
    n.handle_timeout(day);
    let asked = scrub_asked(&outputs(&mut n));
    assert_eq!(asked.len(), 1, "one copy at a time");
    assert_eq!(asked[0].path, "/a");
    n.handle_timeout(day.plus(1));
    assert!(scrub_asked(&outputs(&mut n)).is_empty(), "nothing more while it is hashed");
    assert!(n.scrub_result(day, &asked[0], Some((40 * MIB, asked[0].checksum.clone()))));
    assert_eq!(
        n.chore_due(Chore::Scrub),
        Some(day.plus(2 * SECOND_MS)),
        "40 MiB at 20 MiB/s: the scrub rests 2 s before the next copy"
    );
    n.handle_timeout(day.plus(2 * SECOND_MS));
    let asked = scrub_asked(&outputs(&mut n));
    assert_eq!(asked.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(), vec!["/b"]);
    let passes = n.repl_stats().passes;
    assert!(!n.scrub_result(day.plus(2 * SECOND_MS), &asked[0], Some((10, "f".repeat(64)))));
    let b = n.meta().state().file("/b").cloned().expect("the record");
    assert_eq!(b.locations[0].state, LocationState::Stale, "a copy that does not match is marked stale");
    assert_eq!(n.repl_stats().scrub_mismatches, 1);
    assert_eq!(n.repl_stats().scrubbed_copies, 2);
    assert_eq!(
        n.chore_due(Chore::Scrub),
        Some(day.plus(62 * SECOND_MS)),
        "the batch is through: the scrub rests a minute"
    );
    n.handle_timeout(day.plus(2 * SECOND_MS));
    assert_eq!(n.repl_stats().passes, passes + 1, "a mismatch asks for a planner pass to repair it");
}

#[test]
fn a_worker_renews_its_tasks_lease_on_the_nodes_timer_until_the_task_ends() {
    use shoal_core::node::Event;
    use shoal_core::storage::planner::{Action, Reason, Task};
    use shoal_core::FileId;
    let (mut n, vol) = lone_leader();
    let me = n.id().clone();
    let term = n.leader_term(T0).expect("leader");
    let task = Task {
        file: FileId::new("f1"),
        path: "/f".into(),
        size: 10,
        checksum: "a".repeat(64),
        action: Action::Pull {
            source_node: NodeId::new("bbbbbbbb-bbbb-4bbb-8bbb-000000000002"),
            source_volume: VolumeId::new("far"),
            target_node: me.clone(),
            target_volume: vol,
        },
        reason: Reason::Replica,
    };
    assert!(n.work_begin(at(1_000), &me, term, &task));
    assert!(!n.work_begin(at(1_000), &me, term, &task), "one task per file at a time");
    assert_eq!(n.working(), vec![task.file.clone()]);
    assert!(n.repl_tasks().is_empty(), "this leader never granted it (an earlier leader did)");
    assert!(n.poll_timeout().is_some_and(|d| d <= at(11_000)), "the renewal is announced");
    n.handle_timeout(at(11_000));
    assert_eq!(n.repl_tasks(), vec![task.clone()], "the renewal reached the leader, who adopted the task");
    // Renewed every 10 s: the 30 s lease never runs out while the task runs.
    for s in [21, 31, 41, 51] {
        n.handle_timeout(at(s * SECOND_MS));
    }
    let expired = |out: &[Output]| out.iter().any(|o| matches!(o, Output::Event(Event::ReplTaskExpired { .. })));
    assert!(!expired(&outputs(&mut n)), "renewed in time");
    assert_eq!(n.repl_tasks().len(), 1);
    // The task ends here without a report reaching the leader: no more renewals, the lease runs out.
    n.work_end(&task.file);
    assert!(n.working().is_empty());
    n.handle_timeout(at(90 * SECOND_MS));
    assert!(expired(&outputs(&mut n)), "a task no longer renewed fails when its lease runs out");
    assert_eq!(n.repl_stats().expired, 1);
}

/// Tasks a pass left for the limits go out as other tasks end well, without a new pass over every
/// record (a full pass at 200,000 records is spaced a second apart and costs the leader
/// ~100 ms; a repair of many files would otherwise move at 16 tasks per pass).
#[test]
fn a_finished_task_hands_out_the_next_one_from_the_backlog_without_a_pass() {
    use shoal_core::storage::planner::{Action, Task};
    let (mut n, vol) = lone_leader();
    let second = n.volume_add(at(500), "/srv/n1b", &FolderFacts::default(), "", 1 << 40, 1 << 39).expect("a volume").id;
    let me = n.id().clone();
    // Ten files with a copy on each of the node's two volumes: each second copy is to drop,
    // at most 4 tasks per node at a time.
    for i in 0..10 {
        let path = format!("/dup/f{i}");
        n.file_publish(
            at(1_000 + i),
            &path,
            10,
            &"a".repeat(64),
            at(1_000).0,
            &[(vol.clone(), me.clone()), (second.clone(), me.clone())],
        )
        .expect("publish");
    }
    let dispatched = |out: &[Output]| -> Vec<Task> {
        out.iter()
            .filter_map(|o| match o {
                Output::ReplDispatch { task, .. } => Some(task.clone()),
                _ => None,
            })
            .collect()
    };
    outputs(&mut n);
    n.chore_kick(at(2_000), Chore::Plan);
    n.handle_timeout(at(2_000));
    let first = dispatched(&outputs(&mut n));
    assert_eq!(first.len(), 4, "the per-node limit: {first:?}");
    assert!(first.iter().all(|t| matches!(t.action, Action::Drop { .. })));
    let passes = n.repl_stats().passes;
    assert_eq!(n.gauges(at(2_000)).repl_backlog, 6);

    // One drop ends: the next file's task goes out in the same call, before any timer turn.
    n.repl_finish(at(3_000), &first[0].file, &first[0].path, TaskOutcome::Succeeded);
    let next = dispatched(&outputs(&mut n));
    assert_eq!(next.len(), 1, "{next:?}");
    assert!(first.iter().all(|t| t.file != next[0].file), "another file: {}", next[0].path);
    assert_eq!(n.repl_stats().passes, passes, "no pass ran");
    assert_eq!((n.repl_stats().backlog_dispatched, n.gauges(at(3_000)).repl_backlog), (1, 5));
    assert_eq!(n.repl_tasks().len(), 4, "granted a lease like any task");

    // A backlog file that no longer needs work leaves the backlog without a task.
    let gone: Vec<String> =
        (0..10).map(|i| format!("/dup/f{i}")).filter(|p| first.iter().chain(&next).all(|t| &t.path != p)).collect();
    n.file_remove(at(3_500), &gone[0], false).expect("remove");
    outputs(&mut n);
    n.repl_finish(at(4_000), &first[1].file, &first[1].path, TaskOutcome::Succeeded);
    let then = dispatched(&outputs(&mut n));
    assert_eq!(then.len(), 1);
    assert_eq!(then[0].path, gone[1], "the removed file was passed over");
    assert_eq!(n.gauges(at(4_000)).repl_backlog, 3);

    // A task that failed hands out nothing (its target may be unreachable): the next pass does.
    n.repl_finish(at(5_000), &first[2].file, &first[2].path, TaskOutcome::Failed);
    assert!(dispatched(&outputs(&mut n)).is_empty());
    assert_eq!(n.gauges(at(5_000)).repl_backlog, 3);
}
