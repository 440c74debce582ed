//! Jobs in the core (spec "Jobs (AJR / AJS)"; reference-facts.md "Jobs", weaknesses 6 and 7):
//! three in-memory nodes wired by hand (`common::net`), the leader scheduling, handing over,
//! timing leases, and the workers running, renewing and reporting. The scripts themselves are
//! the shell's: here a test plays the shell, taking `Output::JobRun` and calling
//! `job_finished`.

mod common;

use common::net::*;
use proptest::prelude::*;
use serde_json::json;
use shoal_core::ids::{JobId, NodeId};
use shoal_core::jobs::schedule::{self, Candidate, Queued};
use shoal_core::jobs::submit::JobSubmit;
use shoal_core::membership::NodeState;
use shoal_core::meta::job::{JobSpec, JobStatus};
use shoal_core::node::jobs::ScriptEnd;
use shoal_core::records::Capabilities;
use shoal_core::sched::{Inputs, Weights};
use shoal_core::time::{HOUR_MS, MINUTE_MS, SECOND_MS};

/// A, B and C in one cluster (every clock true), after a minute of heartbeats: A leads.
fn cluster() -> Net {
    let mut net = Net::new(&[0, 0, 0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "jobs").expect("create");
    net.pump();
    for j in [1, 2] {
        let (reply, done) = net.join(j, 0);
        assert!(reply.refused.is_none(), "{:?}", reply.body);
        done.expect("joins");
    }
    net.run_for(MINUTE_MS, SECOND_MS);
    assert!(net.nodes[0].leader_term(net.clock(0)).is_some(), "A leads");
    net
}

fn submit(net: &mut Net, at_node: usize, s: JobSubmit) -> JobId {
    let at = net.clock(at_node);
    let id = net.nodes[at_node].job_submit(at, "admin", s).expect("submit").id;
    net.pump();
    id
}

fn script(src: &str) -> JobSubmit {
    JobSubmit { script: src.into(), name: "t".into(), ..Default::default() }
}

fn status(net: &Net, at_node: usize, id: &JobId) -> JobStatus {
    net.nodes[at_node].job_status(id.as_str()).expect("the job is known").status
}

/// Every run handed to any node so far: (node index, job, attempt).
fn runs(net: &Net) -> Vec<(usize, JobId, u32)> {
    let mut out = Vec::new();
    for (i, r) in net.runs.iter().enumerate() {
        out.extend(r.iter().map(|r| (i, r.job.clone(), r.attempt)));
    }
    out
}

fn finish(net: &mut Net, node: usize, job: &JobId, attempt: u32, end: ScriptEnd) {
    let at = net.clock(node);
    net.nodes[node].job_finished(at, job, attempt, end);
    net.pump();
}

/// Spec "Jobs": a submit on any member is scheduled at once by the leader, handed to one
/// node, and its output, published by the leader, reaches every member; `job.completed` is
/// on the bus.
#[test]
fn a_job_submitted_anywhere_runs_once_and_its_output_reaches_every_node() {
    let mut net = cluster();
    let id = submit(&mut net, 2, script("function run(job) { return 1; }"));
    net.run_for(500, 100);
    let handed = runs(&net);
    assert_eq!(handed.len(), 1, "one hand-over: {handed:?}");
    let (w, job, attempt) = handed[0].clone();
    assert_eq!(job, id);
    net.run_for(2 * SECOND_MS, 100);
    assert_eq!(status(&net, 0, &id), JobStatus::Running);
    finish(&mut net, w, &id, attempt, ScriptEnd::Returned(json!({"ok": true})));
    net.run_for(SECOND_MS, 100);
    for i in 0..3 {
        let v = net.nodes[i].job_status(id.as_str()).unwrap();
        assert_eq!(v.status, JobStatus::Succeeded, "on node {i}");
        assert_eq!(v.output, json!({"ok": true}));
        assert_eq!(v.attempts, 1);
        assert_eq!(v.leased_to, None, "the lease is gone");
    }
    let page = net.nodes[0].events_since(0, "job.*", 100);
    assert_eq!(page.events.iter().filter(|e| e.kind == "job.completed").count(), 1);
    net.run_for(MINUTE_MS, SECOND_MS);
    assert_eq!(runs(&net).len(), 1, "never handed out again");
}

/// Spec "Dispatch once": a node accepts each hand-over once even if it is repeated.
#[test]
fn a_repeated_hand_over_is_accepted_once() {
    let mut net = cluster();
    let term = net.nodes[0].leader_term(net.clock(0)).unwrap();
    let body = serde_json::to_vec(&json!({"job": "job-x", "attempt": 1, "term": term,
        "spec": JobSpec { script: "function run(){}".into(), timeout_sec: 60, max_attempts: 3, ..Default::default() }}))
    .unwrap();
    for round in 0..2 {
        let h = net.signed(0, "POST", "/cluster/acn/jobs/run", &body);
        let at = net.clock(1);
        let r = net.nodes[1].handle_acn(at, "POST", "/cluster/acn/jobs/run", Some(&h), &body);
        assert!(r.refused.is_none(), "round {round}: {:?}", r.body);
        net.pump();
    }
    assert_eq!(net.runs[1].len(), 1, "one run for two hand-overs");
    // A hand-over from a node that does not lead that term is refused.
    let h = net.signed(2, "POST", "/cluster/acn/jobs/run", &body);
    let at = net.clock(1);
    let r = net.nodes[1].handle_acn(at, "POST", "/cluster/acn/jobs/run", Some(&h), &body);
    assert_eq!(r.body.pointer("/error/code").and_then(|c| c.as_str()), Some("not_leader"));
}

/// Reference weakness 6: a job waiting for a free slot holds no lease, so it is never
/// requeued from under a node and never runs twice; it is handed over once a slot frees.
#[test]
fn a_job_waiting_for_a_slot_holds_no_lease_and_runs_when_one_frees() {
    let mut net = cluster();
    // Every node has one slot (no cores reported): four jobs, three slots.
    let ids: Vec<JobId> = (0..4).map(|_| submit(&mut net, 0, script("function run(){}"))).collect();
    net.run_for(5 * SECOND_MS, 100);
    let handed = runs(&net);
    assert_eq!(handed.len(), 3, "{handed:?}");
    let waiting: Vec<&JobId> = ids.iter().filter(|id| !handed.iter().any(|h| &h.1 == *id)).collect();
    assert_eq!(waiting.len(), 1);
    let w = net.nodes[0].job_status(waiting[0].as_str()).unwrap();
    assert_eq!((w.status, w.leased_to), (JobStatus::Queued, None));
    // Long past a lease: nothing requeued, nothing handed out twice.
    net.run_for(MINUTE_MS, SECOND_MS);
    assert_eq!(runs(&net).len(), 3);
    let (node, job, attempt) = handed[0].clone();
    finish(&mut net, node, &job, attempt, ScriptEnd::Returned(json!(null)));
    net.run_for(5 * SECOND_MS, 100);
    let handed = runs(&net);
    assert_eq!(handed.len(), 4);
    assert_eq!(&handed.iter().find(|h| &h.1 == waiting[0]).unwrap().0, &node, "into the freed slot");
}

/// Spec "Leases": a silent node's job is requeued and runs elsewhere; it fails after
/// maxAttempts runs; the silent node stops its run on its own before the leader requeues.
#[test]
fn a_silent_nodes_job_is_requeued_then_fails_after_max_attempts() {
    let mut net = cluster();
    // Pinned to B and C, so the leader (A) stays up and keeps the lease clock.
    let pin = vec![net.id(1), net.id(2)];
    let id = submit(&mut net, 0, JobSubmit { max_attempts: Some(2), nodes: pin, ..script("function run(){}") });
    net.run_for(2 * SECOND_MS, 100);
    let (first, _, _) = runs(&net)[0].clone();
    net.down[first] = true;
    net.run_for(29 * SECOND_MS, SECOND_MS);
    assert_eq!(runs(&net).len(), 1, "not requeued before the lease ends");
    // The silent node still looks ONLINE for a while, and a hand-over it never answers holds
    // its lease; once it is seen gone the job moves to the other node.
    net.run_for(80 * SECOND_MS, SECOND_MS);
    let handed = runs(&net);
    assert_eq!(handed.len(), 2, "requeued and handed to the other node: {handed:?}");
    let (second, _, attempt2) = handed[1].clone();
    assert_ne!(second, first);
    assert!(attempt2 > 1, "a new attempt");
    assert_eq!(status(&net, 0, &id), JobStatus::Running);
    net.down[second] = true;
    net.run_for(90 * SECOND_MS, SECOND_MS);
    let v = net.nodes[0].job_status(id.as_str()).unwrap();
    assert_eq!(v.status, JobStatus::Failed, "{v:?}");
    assert!(v.error.contains("went silent"), "{}", v.error);
}

/// The worker's side of a lease: cut off from the leader, a node stops its run before the
/// leader can requeue it (so a job never runs on two nodes under valid leases).
#[test]
fn a_worker_cut_off_from_the_leader_stops_its_run_before_the_lease_ends() {
    let mut net = cluster();
    let pin = vec![net.id(1)];
    let _id = submit(&mut net, 0, JobSubmit { nodes: pin, ..script("function run(){}") });
    net.run_for(2 * SECOND_MS, 100);
    assert_eq!(runs(&net).iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
    let cut_at = net.now;
    net.down[0] = true;
    net.run_for(30 * SECOND_MS, 500);
    let stopped = net.stops[1].len();
    assert_eq!(stopped, 1, "the worker stopped its run");
    assert!(net.now.since(cut_at) <= 30 * SECOND_MS);
}

/// Spec "Leases": cancellation marks the record; the running node stops its script as soon as
/// the cancel reaches it, and the job ends cancelled (not failed, not requeued).
#[test]
fn a_cancel_on_any_node_stops_the_run_and_ends_the_job_cancelled() {
    let mut net = cluster();
    let pin = vec![net.id(1)];
    let id = submit(&mut net, 0, JobSubmit { nodes: pin, ..script("function run(){ while(true){} }") });
    net.run_for(2 * SECOND_MS, 100);
    let (w, _, attempt) = runs(&net)[0].clone();
    let at = net.clock(2);
    net.nodes[2].job_cancel(at, id.as_str()).expect("cancel");
    net.pump();
    net.run_for(SECOND_MS, 100);
    assert_eq!(net.stops[w], vec![(id.clone(), attempt)], "the stop reached the worker within a second");
    finish(&mut net, w, &id, attempt, ScriptEnd::Threw("job interrupted".into()));
    net.run_for(SECOND_MS, 100);
    assert_eq!(status(&net, 2, &id), JobStatus::Cancelled);
    // A queued job cancelled ends without running.
    let q = submit(&mut net, 0, JobSubmit { nodes: vec![NodeId::new("nowhere")], ..script("function run(){}") });
    let at = net.clock(0);
    net.nodes[0].job_cancel(at, q.as_str()).unwrap();
    net.run_for(5 * SECOND_MS, 100);
    assert_eq!(status(&net, 1, &q), JobStatus::Cancelled);
    assert_eq!(runs(&net).len(), 1);
}

/// Reference weakness 7: finished jobs are kept 72 h, then removed on every node (not only on
/// the leader).
#[test]
fn finished_jobs_are_removed_everywhere_after_72_hours() {
    let mut net = cluster();
    let id = submit(&mut net, 0, script("function run(){}"));
    net.run_for(2 * SECOND_MS, 100);
    let (w, _, attempt) = runs(&net)[0].clone();
    finish(&mut net, w, &id, attempt, ScriptEnd::Returned(json!(1)));
    net.run_for(71 * HOUR_MS, 30 * MINUTE_MS);
    assert!(net.nodes[1].job_status(id.as_str()).is_ok(), "kept for 72 h");
    net.run_for(2 * HOUR_MS, 30 * MINUTE_MS);
    net.run_for(MINUTE_MS, SECOND_MS);
    for i in 0..3 {
        assert!(net.nodes[i].job_status(id.as_str()).is_err(), "gone on node {i}");
    }
}

#[test]
fn a_bad_submit_is_refused_with_a_clear_error() {
    let mut net = cluster();
    let at = net.clock(0);
    for (s, want) in [
        (JobSubmit::default(), "no script"),
        (JobSubmit { timeout_sec: Some(0), ..script("x") }, "timeoutSec"),
        (JobSubmit { inputs: vec![format!("cluster:/{}", "x".repeat(300))], ..script("x") }, "bad input"),
        (JobSubmit { dataset: "cluster:/a/[".into(), partition_max: Some(0), ..script("x") }, ""),
        (JobSubmit { max_attempts: Some(0), ..script("x") }, "maxAttempts"),
    ] {
        let e = net.nodes[0].job_submit(at, "admin", s).expect_err("refused");
        assert_eq!(e.code, "bad_job");
        assert!(e.message.contains(want), "{}", e.message);
    }
}

fn cand(id: &str, free: u32, cores: u32) -> Candidate {
    Candidate {
        inputs: Inputs::new(NodeId::new(id), NodeState::Online),
        caps: Capabilities { cpu_cores: cores, ..Default::default() },
        free,
        runs_jobs: true,
    }
}

fn spec(priority: i32, created: u64) -> JobSpec {
    JobSpec { priority, created, script: "x".into(), ..Default::default() }
}

/// Spec "Jobs": the queue runs priority desc, then created asc; requirements and pins are
/// hard rules; a pass hands out no more jobs than there are free slots.
#[test]
fn the_pass_orders_by_priority_then_age_and_fills_only_free_slots() {
    let ids: Vec<JobId> = (0..4).map(|i| JobId::new(format!("j{i}"))).collect();
    let specs = [spec(0, 10), spec(5, 20), spec(0, 5), spec(-1, 1)];
    let mut q: Vec<Queued> = ids.iter().zip(specs.iter()).map(|(id, spec)| Queued { id, spec, blocked: &[] }).collect();
    let mut c = vec![cand("a", 1, 4), cand("b", 1, 4)];
    let out = schedule::pass(&mut q, &mut c, &Weights::default(), |_, _| 0.0);
    let got: Vec<&str> = out.iter().map(|(j, _)| j.as_str()).collect();
    assert_eq!(got, ["j1", "j2"], "priority 5 first, then the older of the priority-0 jobs");
    // Requirements.
    let mut needs = spec(0, 1);
    needs.requirements.min_cores = 8;
    let c = cand("a", 1, 4);
    assert!(schedule::hard_rule(&needs, &[], &c).unwrap_err().contains("cores"));
    needs.requirements.min_cores = 0;
    needs.nodes = vec![NodeId::new("b")];
    assert_eq!(schedule::hard_rule(&needs, &[], &c).unwrap_err(), schedule::LIMITED);
}

proptest! {
    /// A pass never gives a node more jobs than its free slots, never breaks a hard rule, and
    /// a job it skips while an earlier-ordered one ran could not have run anywhere.
    #[test]
    fn a_pass_respects_slots_and_hard_rules(
        jobs in prop::collection::vec((-3i32..3, 0u64..100, prop::option::of(0usize..4)), 0..40),
        slots in prop::collection::vec(0u32..3, 1..5),
    ) {
        let ids: Vec<JobId> = (0..jobs.len()).map(|i| JobId::new(format!("j{i:03}"))).collect();
        let specs: Vec<JobSpec> = jobs.iter().map(|(p, c, pin)| {
            let mut s = spec(*p, *c);
            if let Some(k) = pin { s.nodes = vec![NodeId::new(format!("n{k}"))]; }
            s
        }).collect();
        let mut q: Vec<Queued> = ids.iter().zip(specs.iter()).map(|(id, spec)| Queued { id, spec, blocked: &[] }).collect();
        let mut c: Vec<Candidate> = slots.iter().enumerate().map(|(i, s)| cand(&format!("n{i}"), *s, 2)).collect();
        let before = c.clone();
        let out = schedule::pass(&mut q, &mut c, &Weights::default(), |_, _| 0.0);
        for cand in &before {
            let n = out.iter().filter(|(_, node)| *node == cand.inputs.node).count() as u32;
            prop_assert!(n <= cand.free);
        }
        for (job, node) in &out {
            let spec = &specs[ids.iter().position(|i| i == job).unwrap()];
            let cand = before.iter().find(|c| &c.inputs.node == node).unwrap();
            prop_assert!(schedule::hard_rule(spec, &[], cand).is_ok());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (job, _) in &out { prop_assert!(seen.insert(job.clone()), "a job handed out twice in one pass"); }
    }
}

/// Spec "Jobs": `timeoutSec` is enforced by the running node: its run is stopped and the job
/// fails with "job timed out after Ns" (not requeued).
#[test]
fn a_run_over_its_timeout_is_stopped_and_the_job_fails() {
    let mut net = cluster();
    let id = submit(&mut net, 0, JobSubmit { timeout_sec: Some(5), ..script("function run(){ while(true){} }") });
    net.run_for(2 * SECOND_MS, 100);
    let (w, _, attempt) = runs(&net)[0].clone();
    assert!(net.stops[w].is_empty());
    net.run_for(4 * SECOND_MS, 100);
    assert_eq!(net.stops[w], vec![(id.clone(), attempt)], "stopped at its timeout");
    finish(&mut net, w, &id, attempt, ScriptEnd::Threw("job interrupted".into()));
    net.run_for(SECOND_MS, 100);
    let v = net.nodes[1].job_status(id.as_str()).unwrap();
    assert_eq!(v.status, JobStatus::Failed);
    assert_eq!(v.error, "job timed out after 5s");
    assert_eq!(runs(&net).len(), 1, "not requeued");
}

/// A stopped script that never ends (a host call stuck in I/O) does not hold its slot and its
/// job forever: after the stop grace the run is given up and the cancel reported anyway.
#[test]
fn a_cancelled_run_whose_script_never_ends_is_given_up_after_the_grace() {
    let mut net = cluster();
    let pin = vec![net.id(1)];
    let id = submit(&mut net, 0, JobSubmit { nodes: pin, ..script("function run(){ while(true){} }") });
    net.run_for(2 * SECOND_MS, 100);
    let at = net.clock(2);
    net.nodes[2].job_cancel(at, id.as_str()).expect("cancel");
    net.pump();
    net.run_for(SECOND_MS, 100);
    assert_eq!(net.stops[1].len(), 1, "asked to stop");
    assert_eq!(net.nodes[1].jobs_running().len(), 1, "still running here within the grace");
    net.run_for(12 * SECOND_MS, 500);
    assert!(net.nodes[1].jobs_running().is_empty(), "the slot is free");
    assert_eq!(status(&net, 0, &id), JobStatus::Cancelled);
}

/// A node that leaves its cluster stops the runs it had and keeps nothing of the jobs.
#[test]
fn a_node_that_leaves_stops_its_runs() {
    let mut net = cluster();
    let pin = vec![net.id(1)];
    let id = submit(&mut net, 0, JobSubmit { nodes: pin, ..script("function run(){ while(true){} }") });
    net.run_for(2 * SECOND_MS, 100);
    assert_eq!(net.nodes[1].jobs_running().len(), 1);
    let at = net.clock(1);
    net.nodes[1].leave(at).expect("leave");
    net.pump();
    assert_eq!(net.stops[1].iter().map(|s| &s.0).collect::<Vec<_>>(), [&id], "its run is stopped");
    assert!(net.nodes[1].jobs_running().is_empty());
}

/// A map/reduce parent is looked at every pass; its record carries every child's id and goes
/// to every node each time it is written, so its progress is written only when it moves by a
/// whole percent (150 partitions: each map's end moves it by 0.66 %; every pass wrote it).
#[test]
fn a_parent_of_many_partitions_writes_its_progress_once_per_whole_percent() {
    use shoal_core::meta::job::JobKind;
    use shoal_core::node::volumes::FolderFacts;
    let mut net = cluster();
    let at = net.clock(0);
    let vol = net.nodes[0].volume_add(at, "/srv/a", &FolderFacts::default(), "", 1 << 40, 1 << 39).expect("volume").id;
    let me = net.nodes[0].id().clone();
    for i in 0..150 {
        let path = format!("/data/f{i:03}");
        net.nodes[0].file_publish(at, &path, 10, &"a".repeat(64), at.0, &[(vol.clone(), me.clone())]).expect("publish");
    }
    net.pump();
    // As the cluster's root (the folder rules let an ordinary user read only their own files).
    let s = JobSubmit { dataset: "/data/*".into(), partition_max: Some(1), ..script("x") };
    let at = net.clock(0);
    let parent = net.nodes[0].job_submit(at, shoal_core::identity::ROOT_NAME, s).expect("submit").id;
    net.pump();
    let mut progress_seen: Vec<f64> = Vec::new();
    let mut maps_done = 0;
    for _ in 0..3_000 {
        let handed: Vec<(usize, JobId, u32)> = runs(&net);
        for r in net.runs.iter_mut() {
            r.clear();
        }
        // One run ends per pass, so the parent's progress moves at most once per pass.
        for (node, job, attempt) in handed.into_iter().take(1) {
            let kind = net.nodes[node].job_status(job.as_str()).expect("known").kind;
            maps_done += usize::from(kind == JobKind::Map);
            finish(&mut net, node, &job, attempt, ScriptEnd::Returned(json!(null)));
        }
        net.run_for(3 * SECOND_MS, SECOND_MS);
        let p = net.nodes[1].job_status(parent.as_str()).expect("the parent reaches every node");
        if progress_seen.last() != Some(&p.progress) {
            progress_seen.push(p.progress);
        }
        if p.status.is_final() {
            assert_eq!(p.status, JobStatus::Succeeded, "{}", p.error);
            break;
        }
    }
    assert_eq!(maps_done, 150);
    assert!(
        (90..=102).contains(&progress_seen.len()),
        "one write per whole percent (and the end), not one per map: {} progress values",
        progress_seen.len()
    );
}
