//! The node's side of jobs (spec "Jobs (AJR / AJS)", "Map / reduce"): submit, cancel and the
//! views any node answers from its records; the leader's scheduling pass, hand-overs, lease
//! clock, renewals and ends, map/reduce coordination and the purge of old records; the
//! worker's runs, their renewals, stops (cancel, timeout, a lost lease) and outcomes.
//!
//! The rules are `crate::jobs`; the scripts run in the shell (`Output::JobRun`), which reports
//! progress, log lines and the outcome back here and stops a script on `Output::JobStop`.
//!
//! Every status change of a job is written by the leader (one writer per term): the queue, a
//! hand-over, the start, the end a worker reports under a lease it still holds, a requeue or
//! failure when a lease runs out. A worker only reports; the cancel flag is anyone's.

use super::{ApiError, ErrorKind, Node, Output, Purpose, Reply};
use crate::ids::{JobId, NodeId};
use crate::jobs::leases::{worker_deadline, LeaseError};
use crate::jobs::mapreduce::{self, ChildView, Expansion, Holding, ParentStep};
use crate::jobs::schedule::{self, Candidate, Queued};
use crate::jobs::submit::{spec_of, JobSubmit};
use crate::jobs::*;
use crate::meta::job::{JobKind, JobLease, JobSpec, JobState, JobStatus, JOB_LOG_LINES_MAX};
use crate::meta::records::{Job, Record, RecordKind};
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// `jobs/run`: the leader hands a run to a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandOver {
    pub job: JobId,
    pub attempt: u32,
    pub term: u64,
    pub spec: JobSpec,
    /// The leader's lease length: the worker times its side with the same one.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
}

fn default_lease_ms() -> u64 {
    LEASE_MS
}

/// `jobs/renew`: a worker renews its run's lease and reports progress and new log lines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewBody {
    pub job: JobId,
    pub attempt: u32,
    pub progress: f64,
    #[serde(default)]
    pub log: Vec<String>,
}

/// How a run ended, as its node reports it (`jobs/done`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoneBody {
    pub job: JobId,
    pub attempt: u32,
    pub status: JobStatus,
    #[serde(default)]
    pub output: Value,
    #[serde(default)]
    pub error: String,
    #[serde(default)]
    pub log: Vec<String>,
}

/// A run the shell is to start: the script and who it is.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRun {
    pub job: JobId,
    pub attempt: u32,
    pub spec: JobSpec,
}

/// Why a run is stopped before its script ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StopWhy {
    Cancelled,
    TimedOut,
    /// The lease could not be renewed in time, or the leader said it is gone: the job may run
    /// elsewhere now, so this run's outcome is dropped.
    LeaseLost,
}

/// How a script ended, from the shell.
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptEnd {
    Returned(Value),
    Threw(String),
}

/// Worker: one run on this node.
#[derive(Clone, Debug)]
pub(super) struct Run {
    attempt: u32,
    timeout_sec: u64,
    /// The lease length the leader granted.
    lease_ms: u64,
    /// Monotonic: when the run was asked to stop (its script gets [`STOP_GRACE_MS`] to end).
    stopped_at: Option<Millis>,
    /// Monotonic: when the run started, its next renewal, the worker's lease deadline.
    started: Millis,
    renew_due: Millis,
    lease_until: Millis,
    progress: f64,
    /// Log lines not reported yet.
    new_log: Vec<String>,
    /// A progress or log report waits (sent at most once a second).
    dirty: bool,
    last_report: Millis,
    stopping: Option<StopWhy>,
    /// The script ended: what to report, and when to offer it next.
    outcome: Option<DoneBody>,
    done_due: Millis,
}

/// How long a stopped script may take to end before its run is given up here (a host call
/// stuck in I/O): the slot is freed and, for a cancel or a timeout, the end is reported anyway.
pub const STOP_GRACE_MS: u64 = 10_000;
/// At most this often a worker reports progress or log lines between its regular renewals
/// (each report rewrites the job's record).
pub const REPORT_MIN_MS: u64 = 2_000;
/// How long the leader leaves out a node that said it runs no jobs before offering it again.
pub const UNABLE_FORGET_MS: u64 = 5 * 60_000;
/// Most map children one map/reduce makes (the reduce lists them all in its arguments).
pub const PARTITIONS_MAX: usize = 10_000;

/// The jobs state a node keeps beside its records.
#[derive(Debug, Default)]
pub(super) struct JobsBook {
    /// Leader: the lease clock.
    leases: crate::jobs::leases::LeaderLeases,
    pass_due: Millis,
    /// Leader: no hand-over before this (a new term waits one lease, so a run the previous
    /// leader handed out just before it went, which these records may not show yet, has been
    /// renewed here or stopped by its node).
    hand_over_from: Millis,
    /// Leader: nodes that said they run no jobs (`cannot_run`), and when: left out of the
    /// candidates for [`UNABLE_FORGET_MS`] (their `jobs.enabled` is their own node's value).
    unable: BTreeMap<NodeId, Millis>,
    /// Worker: runs here.
    runs: BTreeMap<JobId, Run>,
    /// Worker: hand-overs accepted (a repeat is answered, not run again), oldest first.
    accepted: VecDeque<(JobId, u32)>,
    accepted_set: BTreeSet<(JobId, u32)>,
}

/// `POST /v1/jobs`: the new job's id.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobSubmitted {
    pub id: JobId,
}

/// A job as the API shows it (`job status`): its spec without the script, and its state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub id: JobId,
    pub name: String,
    pub kind: JobKind,
    pub owner: String,
    pub status: JobStatus,
    pub node: Option<NodeId>,
    pub attempts: u32,
    pub max_attempts: u32,
    pub progress: f64,
    pub output: Value,
    pub error: String,
    pub reason: String,
    pub priority: i32,
    pub created: u64,
    pub started: u64,
    pub finished: u64,
    pub timeout_sec: u64,
    pub script_name: String,
    pub inputs: usize,
    pub dataset: String,
    pub nodes: Vec<NodeId>,
    pub parent_id: Option<JobId>,
    pub children: Vec<JobId>,
    pub cancel_requested: bool,
    /// Whether a node holds the run's lease now (in the records).
    pub leased_to: Option<NodeId>,
}

/// `job list`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// `job logs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobLog {
    pub id: JobId,
    pub status: JobStatus,
    pub log: Vec<String>,
}

fn view(j: &Job) -> JobView {
    JobView {
        id: j.id.clone(),
        name: j.spec.name.clone(),
        kind: j.spec.kind,
        owner: j.spec.owner.clone(),
        status: j.state.status,
        node: j.state.node.clone(),
        attempts: j.state.attempts,
        max_attempts: j.spec.max_attempts,
        progress: j.state.progress,
        output: j.state.output.clone(),
        error: j.state.error.clone(),
        reason: j.state.reason.clone(),
        priority: j.spec.priority,
        created: j.spec.created,
        started: j.state.started,
        finished: j.state.finished,
        timeout_sec: j.spec.timeout_sec,
        script_name: j.spec.script_name.clone(),
        inputs: j.spec.inputs.len(),
        dataset: j.spec.dataset.clone(),
        nodes: j.spec.nodes.clone(),
        parent_id: j.spec.parent_id.clone(),
        children: j.state.children.clone(),
        cancel_requested: j.cancelled.is_some(),
        leased_to: j.lease.as_ref().map(|l| l.node.clone()),
    }
}

fn clip(line: &str) -> String {
    if line.len() <= 1000 {
        return line.to_string();
    }
    let mut cut = 1000;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &line[..cut])
}

/// Keep the last [`JOB_LOG_LINES_MAX`] lines.
fn append_log(log: &mut Vec<String>, new: &[String]) {
    log.extend(new.iter().map(|l| clip(l)));
    if log.len() > JOB_LOG_LINES_MAX {
        let cut = log.len() - JOB_LOG_LINES_MAX;
        log.drain(..cut);
    }
}

fn job_error(kind: ErrorKind, code: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::new(kind, code, msg.into())
}

// ---- what any node answers ----

impl Node {
    fn job_record(&self, id: &JobId) -> Option<&Job> {
        match self.meta.state().get(RecordKind::Job, id.as_str()) {
            Some(Record::Job(j)) if !j.removed => Some(j),
            _ => None,
        }
    }

    fn jobs_iter(&self) -> impl Iterator<Item = &Job> {
        self.meta.state().of_kind(RecordKind::Job).filter_map(|r| match r {
            Record::Job(j) if !j.removed => Some(j),
            _ => None,
        })
    }

    fn job_lookup(&self, id: &str) -> Result<&Job, ApiError> {
        let id = JobId::new(id);
        self.job_record(&id).ok_or_else(|| job_error(ErrorKind::NotFound, "unknown_job", format!("no job {id}")))
    }

    /// `POST /v1/jobs`: a new job, queued; the leader schedules it at once.
    pub fn job_submit(&mut self, wall: Millis, owner: &str, submit: JobSubmit) -> Result<JobSubmitted, ApiError> {
        self.in_cluster()?;
        let spec = spec_of(submit, owner, wall.0).map_err(|e| ApiError::invalid("bad_job", e.to_string()))?;
        let id = JobId::new(self.rng.uuid_v4());
        self.job_create(wall, id.clone(), spec, "waiting for a node");
        Ok(JobSubmitted { id })
    }

    fn job_create(&mut self, wall: Millis, id: JobId, spec: JobSpec, reason: &str) {
        let v = self.hlc.next(wall);
        let state = Box::new(JobState { reason: reason.to_string(), ..Default::default() });
        let job = Job {
            id,
            spec: Box::new(spec),
            removed: false,
            version: v.clone(),
            state,
            state_version: v.clone(),
            lease: None,
            lease_version: v,
            cancelled: None,
        };
        self.submit_record(wall, Record::Job(job));
        let now = self.clock.peek(wall);
        self.jobs.pass_due = self.jobs.pass_due.min(now);
    }

    /// `GET /v1/jobs`: unfinished jobs (all with `all`), newest first; children of map/reduce
    /// jobs are left out unless `all`.
    pub fn job_list(&self, all: bool) -> JobList {
        let mut jobs: Vec<JobView> = self
            .jobs_iter()
            .filter(|j| all || (!j.state.status.is_final() && j.spec.parent_id.is_none()))
            .map(view)
            .collect();
        jobs.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
        JobList { jobs }
    }

    /// Whether another node (the leader, or a follower when this node leads) holds this
    /// node's latest write of the job, so it survives losing this node.
    pub fn job_held_elsewhere(&self, id: &JobId) -> bool {
        self.meta.held_elsewhere(RecordKind::Job, id.as_str())
    }

    pub fn job_status(&self, id: &str) -> Result<JobView, ApiError> {
        self.job_lookup(id).map(view)
    }

    pub fn job_logs(&self, id: &str) -> Result<JobLog, ApiError> {
        let j = self.job_lookup(id)?;
        Ok(JobLog { id: j.id.clone(), status: j.state.status, log: j.state.log.clone() })
    }

    /// `POST /v1/jobs/{id}/cancel`: marks the record; the leader ends a job that waits, the
    /// running node stops its script.
    pub fn job_cancel(&mut self, wall: Millis, id: &str) -> Result<JobView, ApiError> {
        self.in_cluster()?;
        let mut j = self.job_lookup(id)?.clone();
        if j.state.status.is_final() {
            return Err(job_error(
                ErrorKind::Conflict,
                "job_finished",
                format!("job {} is {} already", j.id, j.state.status.as_str()),
            ));
        }
        if j.cancelled.is_none() {
            j.cancelled = Some(self.hlc.next(wall));
            self.submit_record(wall, Record::Job(j.clone()));
        }
        let now = self.clock.peek(wall);
        self.jobs.pass_due = self.jobs.pass_due.min(now);
        self.jobs_check_cancels(wall, now);
        Ok(view(&j))
    }

    /// `job explain`: the ranking a pass would make for this job now, with every node's factors
    /// and reasons (the scorer's explain shape).
    pub fn job_explain(&self, wall: Millis, id: &str) -> Result<super::sched::Explanation, ApiError> {
        let j = self.job_lookup(id)?;
        let candidates = self.job_candidates(wall);
        let weights = self.sched_weights();
        let q = Queued { id: &j.id, spec: &j.spec, blocked: &j.state.blocked };
        let ranked = schedule::rank_for(&q, &candidates, &weights, &|spec, node| self.job_locality(spec, node));
        let (chosen, why_none) = match crate::sched::best(&ranked) {
            Ok(r) => (Some(r.node.clone()), None),
            Err(why) => (None, Some(why)),
        };
        let subject = format!("{} ({}, {})", j.id, j.spec.name, j.state.status.as_str());
        Ok(super::sched::Explanation { kind: "job", subject, ranked, chosen, why_none })
    }
}

// ---- the leader ----

impl Node {
    fn jobs_lease_ms(&self) -> u64 {
        self.config_number("jobs", "lease").map_or(LEASE_MS, |v| v as u64)
    }

    fn jobs_pass_ms(&self) -> u64 {
        self.config_number("jobs", "pass_every").map_or(PASS_MS, |v| v as u64)
    }

    /// Share of `spec`'s input bytes with a healthy copy on `node`.
    fn job_locality(&self, spec: &JobSpec, node: &NodeId) -> f64 {
        let (mut total, mut here) = (0u128, 0u128);
        for p in &spec.inputs {
            let Some(f) = self.meta.state().file(p).filter(|f| !f.removed) else { continue };
            let size = f.size.max(1) as u128;
            total += size;
            if f.locations.iter().any(|l| &l.node_id == node && l.state.is_healthy()) {
                here += size;
            }
        }
        if total == 0 {
            0.0
        } else {
            here as f64 / total as f64
        }
    }

    /// Every member as a candidate for jobs: its scorer inputs, capabilities and free slots.
    fn job_candidates(&self, wall: Millis) -> Vec<Candidate> {
        let inputs = self.sched_inputs(wall);
        let used = self.jobs.leases.per_node();
        let now = self.clock.peek(wall);
        let unable = |n: &NodeId| self.jobs.unable.get(n).is_some_and(|at| now.since(*at) < UNABLE_FORGET_MS);
        let slots_set = self.config_number("jobs", "slots").unwrap_or(0.0) as u32;
        self.members
            .records()
            .filter(|r| !r.removed)
            .filter_map(|r| {
                let mut i = inputs.get(&r.id)?.clone();
                let running = used.get(&r.id).copied().unwrap_or(0);
                i.queue = running;
                let slots = if slots_set > 0 { slots_set } else { r.capabilities.cpu_cores.max(1) };
                Some(Candidate {
                    inputs: i,
                    caps: r.capabilities.clone(),
                    free: slots.saturating_sub(running),
                    runs_jobs: !unable(&r.id),
                })
            })
            .collect()
    }

    /// Write a job's changed registers (each with a new version).
    fn job_write(&mut self, wall: Millis, mut j: Job, state: Option<Box<JobState>>, lease: Option<Option<JobLease>>) {
        if let Some(s) = state {
            j.state = s;
            j.state_version = self.hlc.next(wall);
        }
        if let Some(l) = lease {
            j.lease = l;
            j.lease_version = self.hlc.next(wall);
        }
        self.submit_record(wall, Record::Job(j));
    }

    /// A job ends here (leader): its final state, the lease gone, the event on the bus.
    fn job_end(&mut self, wall: Millis, j: Job, status: JobStatus, output: Value, error: String, reason: String) {
        let mut state = j.state.clone();
        state.status = status;
        state.output = output;
        state.error = error.clone();
        state.reason = reason;
        state.finished = wall.0;
        if status == JobStatus::Succeeded {
            state.progress = 1.0;
        }
        self.jobs.leases.release(&j.id);
        let data = json!({"id": j.id, "name": j.spec.name, "kind": j.spec.kind, "status": status,
            "node": state.node, "attempts": state.attempts, "error": error, "parentId": j.spec.parent_id});
        let parent = j.spec.parent_id.clone();
        if j.spec.kind == JobKind::Mapreduce {
            // The maps' spilled pairs served the reduce; they go with the parent's end.
            let _ = self.file_remove(wall, &format!("{SPILL_DIR}/{}/maps", j.id), true);
        }
        self.job_write(wall, j, Some(state), Some(None));
        let kind = if status == JobStatus::Succeeded { "job.completed" } else { "job.failed" };
        self.raise(wall, kind, data);
        if parent.is_some() {
            let now = self.clock.peek(wall);
            self.jobs.pass_due = self.jobs.pass_due.min(now);
        }
    }

    pub(super) fn jobs_next_due(&self) -> Option<Millis> {
        let worker = self
            .jobs
            .runs
            .values()
            .map(|r| match (&r.outcome, r.stopped_at) {
                (Some(_), _) => r.done_due,
                (None, Some(at)) => r.renew_due.min(at.plus(STOP_GRACE_MS)),
                (None, None) => r.renew_due.min(r.lease_until),
            })
            .min();
        let leader = self.jobs.leases.next_deadline();
        let pass = Some(self.jobs.pass_due);
        [worker, leader, pass].into_iter().flatten().min()
    }

    /// From `handle_timeout`: the worker's runs, the leader's leases and pass.
    pub(super) fn jobs_timeout(&mut self, wall: Millis, now: Millis) {
        self.jobs_worker_timeout(wall, now);
        if !self.meta.is_leader(now) {
            if !self.jobs.leases.is_empty() || self.jobs.leases.term != 0 {
                self.jobs.leases.clear();
            }
            if now >= self.jobs.pass_due {
                self.jobs.pass_due = now.plus(self.jobs_pass_ms());
            }
            return;
        }
        self.jobs_adopt(now);
        for (id, held) in self.jobs.leases.expire(now) {
            let Some(j) = self.job_record(&id).cloned() else { continue };
            if j.state.status.is_final() {
                continue;
            }
            self.job_lease_ran_out(wall, j, &held.node);
        }
        if now >= self.jobs.pass_due {
            self.jobs.pass_due = now.plus(self.jobs_pass_ms());
            self.jobs_pass(wall, now);
        }
    }

    /// A leader of a new term adopts the leases in the records.
    fn jobs_adopt(&mut self, now: Millis) {
        let Some(term) = self.meta.known_lease().map(|l| l.term.0) else { return };
        if self.jobs.leases.term == term {
            return;
        }
        let leased: Vec<(JobId, NodeId, u32)> = self
            .jobs_iter()
            .filter(|j| !j.state.status.is_final())
            .filter_map(|j| j.lease.as_ref().map(|l| (j.id.clone(), l.node.clone(), l.attempt)))
            .collect();
        let lease_ms = self.jobs_lease_ms();
        self.jobs.leases.adopt(term, now, lease_ms, leased);
        // The cluster's first term follows no leader that could have handed anything out.
        self.jobs.hand_over_from = if term <= 1 { now } else { now.plus(lease_ms) };
    }

    /// A run's lease ran out on the leader: the node went silent. Requeue the job, or fail it
    /// after `maxAttempts` runs, or end it cancelled when a cancel waits.
    fn job_lease_ran_out(&mut self, wall: Millis, j: Job, node: &NodeId) {
        if j.cancelled.is_some() {
            return self.job_end(wall, j, JobStatus::Cancelled, Value::Null, String::new(), "cancelled".into());
        }
        if j.state.attempts >= j.spec.max_attempts {
            let e = format!("node {node} went silent; gave up after {} attempts", j.state.attempts);
            return self.job_end(wall, j, JobStatus::Failed, Value::Null, e.clone(), e);
        }
        let mut state = j.state.clone();
        state.status = JobStatus::Queued;
        state.reason = format!("node {node} went silent (its lease ran out); requeued");
        self.job_write(wall, j, Some(state), Some(None));
    }

    /// The scheduling pass (leader, every 3 s and at once on a submit).
    fn jobs_pass(&mut self, wall: Millis, now: Millis) {
        let retention = self.config_number("jobs", "retention").map_or(RETENTION_MS, |v| v as u64);
        // What each job needs, read without copying the records (scripts can be large); a job
        // that needs work is copied then.
        let light: Vec<(JobId, JobStatus, JobKind, bool, u64, Option<JobId>)> = self
            .jobs_iter()
            .map(|j| {
                let parent = j.spec.parent_id.clone();
                (j.id.clone(), j.state.status, j.spec.kind, j.cancelled.is_some(), j.state.finished, parent)
            })
            .collect();
        let mut queued: Vec<JobId> = Vec::new();
        for (id, status, kind, cancelled, finished, parent) in light {
            if status.is_final() {
                // A child goes with its parent: never while the parent still needs its result.
                let parent_done =
                    parent.as_ref().is_none_or(|p| self.job_record(p).is_none_or(|p| p.state.status.is_final()));
                if parent_done && finished > 0 && wall.since(Millis(finished)) > retention {
                    if let Some(j) = self.job_record(&id).cloned() {
                        self.job_purge(wall, j);
                    }
                }
                continue;
            }
            if status == JobStatus::Queued && !cancelled && kind != JobKind::Mapreduce {
                if kind == JobKind::Map {
                    self.job_repin(wall, now, &id);
                }
                queued.push(id);
                continue;
            }
            if kind == JobKind::Mapreduce {
                self.job_coordinate(wall, &id);
                continue;
            }
            let Some(j) = self.job_record(&id).cloned() else { continue };
            match (kind, status) {
                (_, JobStatus::Queued) => self.job_end(
                    wall,
                    j,
                    JobStatus::Cancelled,
                    Value::Null,
                    String::new(),
                    "cancelled before it ran".into(),
                ),
                (_, JobStatus::Scheduled | JobStatus::Running) => self.job_follow_up(wall, now, j),
                _ => {}
            }
        }
        if queued.is_empty() || now < self.jobs.hand_over_from {
            return;
        }
        let mut candidates = self.job_candidates(wall);
        let weights = self.sched_weights();
        let assigned = {
            let mut q: Vec<Queued> = queued
                .iter()
                .filter_map(|id| self.job_record(id))
                .map(|j| Queued { id: &j.id, spec: &j.spec, blocked: &j.state.blocked })
                .collect();
            schedule::pass(&mut q, &mut candidates, &weights, |spec, node| self.job_locality(spec, node))
        };
        for (id, node) in assigned {
            let Some(j) = self.job_record(&id).cloned() else { continue };
            self.job_hand_over(wall, now, j, node);
        }
    }

    /// A job under lease: re-send a hand-over whose answer never came (the node accepts each
    /// attempt once); adopt a lease the book lacks.
    fn job_follow_up(&mut self, wall: Millis, now: Millis, j: Job) {
        if j.cancelled.is_some() && j.state.status == JobStatus::Scheduled {
            // Not started (or its start not heard of): end it; a node that did start it sees
            // the cancel and stops.
            return self.job_end(wall, j, JobStatus::Cancelled, Value::Null, String::new(), "cancelled".into());
        }
        let Some(lease) = j.lease.clone() else {
            // Scheduled or running with no lease in the records (registers written by two
            // leaders): the lease this leader times is the truth, else queue it again.
            if let Some(h) = self.jobs.leases.get(&j.id).cloned() {
                let Some(term) = self.leader_term(wall) else { return };
                let lease = JobLease { node: h.node, attempt: h.attempt, term };
                return self.job_write(wall, j, None, Some(Some(lease)));
            }
            let mut state = j.state.clone();
            state.status = JobStatus::Queued;
            return self.job_write(wall, j, Some(state), None);
        };
        if self.jobs.leases.get(&j.id).is_none() {
            let lease_ms = self.jobs_lease_ms();
            self.jobs.leases.grant(j.id.clone(), lease.node.clone(), lease.attempt, now, lease_ms);
        }
        if j.state.status == JobStatus::Scheduled {
            let in_flight =
                self.in_flight.values().any(|f| matches!(&f.purpose, Purpose::JobHandOver { job, .. } if *job == j.id));
            let reachable = schedule::runs_work(self.members.state(&lease.node, now));
            if !in_flight && reachable {
                // The lease runs from this send: a worker that takes a late hand-over times its
                // side from its receipt.
                let lease_ms = self.jobs_lease_ms();
                self.jobs.leases.grant(j.id.clone(), lease.node.clone(), lease.attempt, now, lease_ms);
                self.job_send_hand_over(wall, now, &j, &lease);
            }
        }
    }

    /// Hand `j` to `node`: a new attempt, its lease granted now, the record scheduled.
    fn job_hand_over(&mut self, wall: Millis, now: Millis, j: Job, node: NodeId) {
        let Some(term) = self.leader_term(wall) else { return };
        // Every hand-over gets a new attempt number (a counter in the record, never reused),
        // so a node that accepted an earlier one cannot take this one for a repeat.
        let attempt = j.state.handovers.max(j.lease.as_ref().map_or(0, |l| l.attempt)) + 1;
        let attempt = attempt.max(self.jobs.leases.get(&j.id).map_or(0, |h| h.attempt + 1));
        let lease = JobLease { node: node.clone(), attempt, term };
        let lease_ms = self.jobs_lease_ms();
        self.jobs.leases.grant(j.id.clone(), node.clone(), attempt, now, lease_ms);
        let mut state = j.state.clone();
        state.status = JobStatus::Scheduled;
        state.node = Some(node.clone());
        state.handovers = attempt;
        state.reason = format!("handed to {node}");
        let mut written = j.clone();
        written.state = state.clone();
        written.lease = Some(lease.clone());
        self.job_write(wall, j, Some(state), Some(Some(lease.clone())));
        self.job_send_hand_over(wall, now, &written, &lease);
    }

    fn job_send_hand_over(&mut self, wall: Millis, now: Millis, j: &Job, lease: &JobLease) {
        let lease_ms = self.jobs_lease_ms();
        let body =
            HandOver { job: j.id.clone(), attempt: lease.attempt, term: lease.term, spec: (*j.spec).clone(), lease_ms };
        if lease.node == self.id {
            let me = self.id.clone();
            let reply = self.job_accept(wall, now, &me, body);
            let answer =
                super::PeerAnswer { refused: reply.refused, body: serde_json::to_vec(&reply.body).unwrap_or_default() };
            self.job_handed(wall, now, &j.id, lease.attempt, &me, Ok(answer));
            return;
        }
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let purpose = Purpose::JobHandOver { job: j.id.clone(), attempt: lease.attempt };
        self.new_request(wall, now, &lease.node, "POST", "/cluster/acn/jobs/run", bytes, purpose);
    }

    /// The answer to a hand-over: started, refused for good or for now, or unknown (then the
    /// lease stands and the next pass asks again with the same attempt).
    pub(super) fn job_handed(
        &mut self,
        wall: Millis,
        now: Millis,
        id: &JobId,
        attempt: u32,
        node: &NodeId,
        result: Result<super::PeerAnswer, String>,
    ) {
        let Ok(answer) = result else { return };
        if !self.meta.is_leader(now) || !self.jobs.leases.holds(id, node, attempt) {
            return;
        }
        let Some(j) = self.job_record(id).cloned() else { return };
        if j.state.status.is_final() {
            return;
        }
        match answer.refused {
            None => self.job_started(wall, j, node),
            Some(kind) => {
                let why = serde_json::from_slice::<Value>(&answer.body)
                    .ok()
                    .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_string))
                    .unwrap_or_else(|| "refused".into());
                self.jobs.leases.release(id);
                let mut state = j.state.clone();
                state.status = JobStatus::Queued;
                let code = serde_json::from_slice::<Value>(&answer.body)
                    .ok()
                    .and_then(|v| v.pointer("/error/code").and_then(|c| c.as_str()).map(str::to_string));
                if code.as_deref() == Some("cannot_run") {
                    self.jobs.unable.insert(node.clone(), now);
                }
                if kind == ErrorKind::Forbidden {
                    // "no account for the owner" or "cannot run jobs": never offered again.
                    if !state.blocked.contains(node) {
                        state.blocked.push(node.clone());
                    }
                    state.reason = format!("{node} refused it for good: {why}");
                } else {
                    state.reason = format!("{node} could not take it now: {why}");
                }
                self.job_write(wall, j, Some(state), Some(None));
            }
        }
    }

    /// The node took the run: the record says running.
    fn job_started(&mut self, wall: Millis, j: Job, node: &NodeId) {
        if j.state.status != JobStatus::Scheduled {
            return;
        }
        let mut state = j.state.clone();
        state.status = JobStatus::Running;
        state.node = Some(node.clone());
        state.attempts += 1;
        state.started = wall.0;
        state.reason = format!("running on {node}");
        self.job_write(wall, j, Some(state), None);
    }

    /// `jobs/renew` from `sender` (or this node's own run).
    pub(super) fn jobs_take_renew(&mut self, wall: Millis, sender: &NodeId, b: RenewBody) -> Result<bool, LeaseError> {
        let now = self.advance_clocks(wall);
        if !self.meta.is_leader(now) {
            return Err(LeaseError::NotLeader);
        }
        self.jobs_adopt(now);
        let lease_ms = self.jobs_lease_ms();
        self.jobs.leases.renew(&b.job, sender, b.attempt, now, lease_ms)?;
        let Some(j) = self.job_record(&b.job).cloned() else { return Err(LeaseError::Lost) };
        let cancelled = j.cancelled.is_some();
        let j = if j.state.status == JobStatus::Scheduled {
            self.job_started(wall, j.clone(), sender);
            self.job_record(&b.job).cloned().unwrap_or(j)
        } else {
            j
        };
        let progress = b.progress.clamp(0.0, 1.0);
        if !b.log.is_empty() || (progress - j.state.progress).abs() > 1e-9 {
            let mut state = j.state.clone();
            state.progress = if progress.is_finite() { progress } else { state.progress };
            append_log(&mut state.log, &b.log);
            self.job_write(wall, j, Some(state), None);
        }
        Ok(cancelled)
    }

    /// `jobs/done` from `sender`: the run's outcome, taken while its lease holds (a repeat of
    /// an end already taken is answered as taken).
    pub(super) fn jobs_take_done(&mut self, wall: Millis, sender: &NodeId, b: DoneBody) -> Result<(), LeaseError> {
        let now = self.advance_clocks(wall);
        if !self.meta.is_leader(now) {
            return Err(LeaseError::NotLeader);
        }
        self.jobs_adopt(now);
        let Some(j) = self.job_record(&b.job).cloned() else { return Err(LeaseError::Lost) };
        if j.state.status.is_final() && j.state.node.as_ref() == Some(sender) && j.state.handovers == b.attempt {
            return Ok(());
        }
        if !self.jobs.leases.holds(&b.job, sender, b.attempt) {
            return Err(LeaseError::Lost);
        }
        let mut j = j;
        if j.state.status == JobStatus::Scheduled {
            j.state.attempts += 1;
            j.state.started = wall.0;
        }
        j.state.node = Some(sender.clone());
        append_log(&mut j.state.log, &b.log);
        let status = match b.status {
            JobStatus::Succeeded | JobStatus::Cancelled => b.status,
            _ => JobStatus::Failed,
        };
        let reason = match status {
            JobStatus::Succeeded => "finished".to_string(),
            JobStatus::Cancelled => "cancelled".to_string(),
            _ => format!("failed on {sender}"),
        };
        self.job_end(wall, j, status, b.output, b.error, reason);
        Ok(())
    }

    /// Finished longer than the retention: the record becomes a tombstone (purged in turn on
    /// every node), with the spec and state dropped (reference weakness 7).
    fn job_purge(&mut self, wall: Millis, j: Job) {
        // Its output file, if it was too large for the record.
        let _ = self.file_remove(wall, &format!("{SPILL_DIR}/{}", j.id), true);
        let v = self.hlc.next(wall);
        let tomb = Job {
            id: j.id,
            spec: Box::default(),
            removed: true,
            version: v.clone(),
            // Final, so it outranks the old state; nothing else of it is kept.
            state: Box::new(JobState { status: j.state.status, finished: j.state.finished, ..Default::default() }),
            state_version: v.clone(),
            lease: None,
            lease_version: v,
            cancelled: j.cancelled,
        };
        self.submit_record(wall, Record::Job(tomb));
    }

    /// A map/reduce parent: expand its dataset into map children, then the reduce, then end.
    /// It is looked at every pass while it runs, so its children are read where they are and
    /// the parent is copied only to be changed (a parent of 10,000 partitions was copied with
    /// all its children every 3 s), and its progress is written when it moves by a whole
    /// percent (its record, with up to 10,000 child ids, went to every node after every child).
    fn job_coordinate(&mut self, wall: Millis, id: &JobId) {
        enum Next {
            Expand,
            /// Cancel the children still open; end the parent too when `end`.
            Cancel {
                end: bool,
            },
            Wait,
            Step(ParentStep),
        }
        let Some(j) = self.job_record(id) else { return };
        let next = if j.state.children.is_empty() {
            if j.cancelled.is_some() {
                Next::Cancel { end: true }
            } else {
                Next::Expand
            }
        } else {
            let children: Vec<&Job> = j.state.children.iter().filter_map(|c| self.job_record(c)).collect();
            let missing = children.len() < j.state.children.len();
            if j.cancelled.is_some() {
                Next::Cancel { end: missing || children.iter().all(|c| c.state.status.is_final()) }
            } else if missing {
                Next::Wait // a child's record has not come back here yet
            } else {
                let views: Vec<ChildView> = children
                    .iter()
                    .map(|c| ChildView { id: &c.id, kind: c.spec.kind, status: c.state.status, error: &c.state.error })
                    .collect();
                match mapreduce::parent_step(&views) {
                    ParentStep::Wait { progress }
                        if whole_percent(progress) == whole_percent(j.state.progress)
                            && j.state.status == JobStatus::Running =>
                    {
                        Next::Wait
                    }
                    step => Next::Step(step),
                }
            }
        };
        if matches!(next, Next::Wait) {
            return;
        }
        let j = j.clone();
        match next {
            Next::Wait => {}
            Next::Expand => self.job_expand(wall, j),
            Next::Cancel { end } => {
                self.job_cancel_children(wall, &j.state.children);
                if end {
                    self.job_end(wall, j, JobStatus::Cancelled, Value::Null, String::new(), "cancelled".into());
                }
            }
            Next::Step(ParentStep::Wait { progress }) => {
                let mut state = j.state.clone();
                state.progress = progress;
                state.status = JobStatus::Running;
                self.job_write(wall, j, Some(state), None);
            }
            Next::Step(ParentStep::Reduce) => {
                let maps: Vec<JobId> = j.state.children.clone();
                let id = JobId::new(self.rng.uuid_v4());
                let mut spec = mapreduce::child_spec(&j.spec, &j.id, JobKind::Reduce, 0, None, wall.0);
                spec.args = json!({"maps": maps, "args": j.spec.args});
                self.job_create(wall, id.clone(), spec, "waiting for a node");
                let mut state = j.state.clone();
                state.children.push(id);
                state.reason = "reducing".into();
                self.job_write(wall, j, Some(state), None);
            }
            Next::Step(ParentStep::Succeed { reduce }) => {
                let output = self.job_record(&reduce).map(|c| c.state.output.clone()).unwrap_or_default();
                self.job_end(wall, j, JobStatus::Succeeded, output, String::new(), "finished".into());
            }
            Next::Step(ParentStep::Fail { error }) => {
                self.job_cancel_children(wall, &j.state.children);
                self.job_end(wall, j, JobStatus::Failed, Value::Null, error.clone(), error);
            }
        }
    }

    /// A queued map child whose pinned nodes are all gone (not ONLINE or DEGRADED) is pinned
    /// again to the usable nodes that now hold every one of its files, if any.
    fn job_repin(&mut self, wall: Millis, now: Millis, id: &JobId) {
        let Some(j) = self.job_record(id) else { return };
        let usable = |n: &NodeId| schedule::runs_work(self.members.state(n, now));
        if j.spec.nodes.iter().any(usable) {
            return;
        }
        let mut holders: Option<Vec<NodeId>> = None;
        for p in &j.spec.inputs {
            let here: Vec<NodeId> = self
                .meta
                .state()
                .file(p)
                .filter(|f| !f.removed)
                .map(|f| {
                    f.locations
                        .iter()
                        .filter(|l| l.state.is_healthy() && usable(&l.node_id))
                        .map(|l| l.node_id.clone())
                        .collect()
                })
                .unwrap_or_default();
            holders = Some(match holders {
                None => here,
                Some(h) => h.into_iter().filter(|n| here.contains(n)).collect(),
            });
        }
        let Some(mut nodes) = holders.filter(|h| !h.is_empty()) else { return };
        nodes.sort();
        nodes.dedup();
        let mut j = j.clone();
        j.spec.nodes = nodes;
        j.version = self.hlc.next(wall);
        self.submit_record(wall, Record::Job(j));
    }

    fn job_cancel_children(&mut self, wall: Millis, children: &[JobId]) {
        let open: Vec<Job> = children
            .iter()
            .filter_map(|c| self.job_record(c))
            .filter(|c| !c.state.status.is_final() && c.cancelled.is_none())
            .cloned()
            .collect();
        for mut c in open {
            c.cancelled = Some(self.hlc.next(wall));
            self.submit_record(wall, Record::Job(c));
        }
    }

    fn job_expand(&mut self, wall: Millis, j: Job) {
        let now = self.clock.peek(wall);
        let paths = match crate::meta::namespace::glob(self.meta.state(), &j.spec.dataset) {
            Ok(p) => p,
            Err(e) => {
                let e = format!("bad dataset: {e}");
                return self.job_end(wall, j, JobStatus::Failed, Value::Null, e.clone(), e);
            }
        };
        // The owner's rules hold for the dataset too: files they may not read are not theirs to
        // map (the children's reads would be refused anyway; their names are not shown either).
        let view = self.access_view(&self.principal_of_owner(&j.spec.owner));
        let holdings: Vec<Holding> = paths
            .iter()
            .filter(|p| view.check(p, crate::identity::access::Mode::Read).is_ok())
            .filter_map(|p| self.meta.state().file(p))
            .map(|f| Holding {
                path: f.path.clone(),
                holders: f
                    .locations
                    .iter()
                    .filter(|l| l.state.is_healthy() && schedule::runs_work(self.members.state(&l.node_id, now)))
                    .map(|l| l.node_id.clone())
                    .collect(),
            })
            .collect();
        match mapreduce::expand(&holdings, j.spec.partition_max, &j.spec.nodes) {
            Expansion::Empty => {
                self.job_end(wall, j, JobStatus::Succeeded, json!({}), String::new(), "empty dataset".into())
            }
            Expansion::Unreachable(e) => self.job_end(wall, j, JobStatus::Failed, Value::Null, e.clone(), e),
            Expansion::Partitions(parts) if parts.len() > PARTITIONS_MAX => {
                let e = format!(
                    "the dataset makes {} partitions of at most {} files; at most {PARTITIONS_MAX}: raise partitionMax",
                    parts.len(),
                    j.spec.partition_max
                );
                self.job_end(wall, j, JobStatus::Failed, Value::Null, e.clone(), e)
            }
            Expansion::Partitions(parts) => {
                let mut children = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    let id = JobId::new(self.rng.uuid_v4());
                    let spec = mapreduce::child_spec(&j.spec, &j.id, JobKind::Map, i + 1, Some(p), wall.0);
                    self.job_create(wall, id.clone(), spec, "waiting for a node");
                    children.push(id);
                }
                let mut state = j.state.clone();
                state.status = JobStatus::Running;
                state.started = wall.0;
                state.reason = format!("mapping {} files in {} partitions", paths.len(), parts.len());
                state.children = children;
                self.job_write(wall, j, Some(state), None);
            }
        }
    }
}

// ---- the worker ----

impl Node {
    fn jobs_slots(&self) -> u32 {
        match self.config_number("jobs", "slots") {
            Some(n) if n >= 1.0 => n as u32,
            _ => self.me.capabilities.cpu_cores.max(1),
        }
    }

    /// `jobs/run` from `sender`: accept a hand-over once per attempt, when this node runs jobs
    /// and has a free slot.
    pub(super) fn job_accept(&mut self, wall: Millis, now: Millis, sender: &NodeId, b: HandOver) -> Reply {
        if !self.is_leader_of(wall, sender, b.term) {
            return Reply::error(ErrorKind::Conflict, "not_leader", "the sender does not hold the lease of that term");
        }
        let key = (b.job.clone(), b.attempt);
        if self.jobs.accepted_set.contains(&key) {
            return Reply::ok(json!({"accepted": true, "repeat": true}));
        }
        if self
            .config_resolved_own()
            .get("jobs")
            .and_then(|m| m.get("enabled"))
            .and_then(|r| r.value.as_ref())
            .and_then(Value::as_bool)
            == Some(false)
        {
            return Reply::error(
                ErrorKind::Forbidden,
                "cannot_run",
                "this node does not run jobs (jobs.enabled is false)",
            );
        }
        if b.spec.kind == JobKind::Mapreduce {
            return Reply::error(ErrorKind::Forbidden, "cannot_run", "a map/reduce parent is never run by a node");
        }
        let running = self.jobs.runs.values().filter(|r| r.outcome.is_none()).count() as u32;
        if running >= self.jobs_slots() {
            return Reply::error(
                ErrorKind::Conflict,
                "busy",
                format!("all {running} job slots of this node are in use"),
            );
        }
        if self.jobs.runs.contains_key(&b.job) {
            return Reply::error(ErrorKind::Conflict, "busy", "an earlier run of this job is still ending here");
        }
        if b.spec.kind == JobKind::Reduce {
            // The reduce reads its maps' results from this node's records: not before they are
            // here (a temporary refusal; the leader hands it over again).
            let maps: Vec<JobId> =
                b.spec.args.get("maps").and_then(|m| serde_json::from_value(m.clone()).ok()).unwrap_or_default();
            if maps.iter().any(|m| self.job_record(m).is_none_or(|j| j.state.status != JobStatus::Succeeded)) {
                return Reply::error(
                    ErrorKind::Conflict,
                    "not_ready",
                    "this node's records do not show every map's result yet",
                );
            }
        }
        self.jobs.accepted.push_back(key.clone());
        self.jobs.accepted_set.insert(key);
        while self.jobs.accepted.len() > ACCEPTED_MAX {
            if let Some(old) = self.jobs.accepted.pop_front() {
                self.jobs.accepted_set.remove(&old);
            }
        }
        let lease_ms = b.lease_ms.max(3 * WORKER_LEASE_MARGIN_MS);
        let run = Run {
            attempt: b.attempt,
            timeout_sec: b.spec.timeout_sec,
            lease_ms,
            stopped_at: None,
            started: now,
            // Renew at once, so the deadline is anchored on an answered renewal's send time;
            // until then only a short grace, well inside the lease the leader granted when it
            // sent this hand-over.
            renew_due: now,
            lease_until: now.plus((2 * WORKER_LEASE_MARGIN_MS).min(lease_ms / 3)),
            progress: 0.0,
            new_log: Vec::new(),
            dirty: false,
            last_report: now,
            stopping: None,
            outcome: None,
            done_due: now,
        };
        self.jobs.runs.insert(b.job.clone(), run);
        self.push_output(Output::JobRun(Box::new(JobRun { job: b.job, attempt: b.attempt, spec: b.spec })));
        Reply::ok(json!({"accepted": true}))
    }

    /// Worker: the script reports progress (clamped to 0..1).
    pub fn job_progress(&mut self, wall: Millis, job: &JobId, attempt: u32, progress: f64) {
        let now = self.advance_clocks(wall);
        if let Some(r) = self.jobs.runs.get_mut(job).filter(|r| r.attempt == attempt && r.outcome.is_none()) {
            if progress.is_finite() {
                r.progress = progress.clamp(0.0, 1.0);
                r.dirty = true;
                r.renew_due = r.renew_due.min(r.last_report.plus(REPORT_MIN_MS).max(now));
            }
        }
    }

    /// Worker: the script logs a line.
    pub fn job_log(&mut self, wall: Millis, job: &JobId, attempt: u32, line: &str) {
        let now = self.advance_clocks(wall);
        if let Some(r) = self.jobs.runs.get_mut(job).filter(|r| r.attempt == attempt && r.outcome.is_none()) {
            append_log(&mut r.new_log, &[line.to_string()]);
            r.dirty = true;
            r.renew_due = r.renew_due.min(r.last_report.plus(REPORT_MIN_MS).max(now));
        }
    }

    /// Worker: the script ended. Its outcome goes to the leader (again every 2 s until taken),
    /// unless the run was stopped for a lost lease.
    pub fn job_finished(&mut self, wall: Millis, job: &JobId, attempt: u32, end: ScriptEnd) {
        let now = self.advance_clocks(wall);
        let Some(r) = self.jobs.runs.get_mut(job).filter(|r| r.attempt == attempt && r.outcome.is_none()) else {
            return;
        };
        let (status, output, error) = match (r.stopping, end) {
            (Some(StopWhy::LeaseLost), _) => {
                self.jobs.runs.remove(job);
                return;
            }
            (Some(StopWhy::Cancelled), _) => (JobStatus::Cancelled, Value::Null, "job cancelled".to_string()),
            (Some(StopWhy::TimedOut), _) => {
                (JobStatus::Failed, Value::Null, format!("job timed out after {}s", r.timeout_sec))
            }
            (None, ScriptEnd::Returned(v))
                if crate::meta::records::json_depth(&v) > crate::meta::records::API_VALUE_DEPTH_MAX =>
            {
                (
                    JobStatus::Failed,
                    Value::Null,
                    format!("the output nests deeper than {} levels", crate::meta::records::API_VALUE_DEPTH_MAX),
                )
            }
            (None, ScriptEnd::Returned(v)) if serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len()) > 1 << 20 => {
                (JobStatus::Failed, Value::Null, "the output is over 1 MiB and could not be spilled to a file".into())
            }
            (None, ScriptEnd::Returned(v)) => (JobStatus::Succeeded, v, String::new()),
            (None, ScriptEnd::Threw(e)) => (JobStatus::Failed, Value::Null, clip(&e)),
        };
        let log = std::mem::take(&mut r.new_log);
        r.outcome = Some(DoneBody { job: job.clone(), attempt, status, output, error, log });
        r.done_due = now;
        self.jobs_worker_timeout(wall, now);
    }

    /// This node left its cluster: every run here is stopped and forgotten, and the leader's
    /// book emptied.
    pub(super) fn jobs_forget_all(&mut self) {
        let runs: Vec<(JobId, u32, bool)> = self
            .jobs
            .runs
            .iter()
            .map(|(j, r)| (j.clone(), r.attempt, r.outcome.is_none() && r.stopping.is_none()))
            .collect();
        for (job, attempt, live) in runs {
            if live {
                self.push_output(Output::JobStop { job, attempt, why: StopWhy::LeaseLost });
            }
        }
        self.jobs = JobsBook::default();
    }

    /// Worker: the runs going on here (job, attempt).
    pub fn jobs_running(&self) -> Vec<(JobId, u32)> {
        self.jobs.runs.iter().filter(|(_, r)| r.outcome.is_none()).map(|(j, r)| (j.clone(), r.attempt)).collect()
    }

    fn job_stop(&mut self, now: Millis, job: &JobId, why: StopWhy) {
        let Some(r) = self.jobs.runs.get_mut(job).filter(|r| r.stopping.is_none() && r.outcome.is_none()) else {
            return;
        };
        r.stopping = Some(why);
        r.stopped_at = Some(now);
        let attempt = r.attempt;
        self.push_output(Output::JobStop { job: job.clone(), attempt, why });
    }

    /// Job records came in from a peer: stop cancelled runs here; on the leader, pass now.
    pub(super) fn jobs_records_arrived(&mut self, wall: Millis, now: Millis) {
        self.jobs_check_cancels(wall, now);
        if self.meta.is_leader(now) {
            self.jobs.pass_due = self.jobs.pass_due.min(now);
        }
    }

    /// Stop the runs here whose record carries a cancel (checked as records arrive).
    pub(super) fn jobs_check_cancels(&mut self, _wall: Millis, now: Millis) {
        if self.jobs.runs.is_empty() {
            return;
        }
        let cancelled: Vec<JobId> = self
            .jobs
            .runs
            .keys()
            .filter(|id| self.job_record(id).is_some_and(|j| j.cancelled.is_some()))
            .cloned()
            .collect();
        for id in cancelled {
            self.job_stop(now, &id, StopWhy::Cancelled);
        }
    }

    fn jobs_worker_timeout(&mut self, wall: Millis, now: Millis) {
        if self.jobs.runs.is_empty() {
            return;
        }
        self.jobs_check_cancels(wall, now);
        let ids: Vec<JobId> = self.jobs.runs.keys().cloned().collect();
        let leader = self.meta_leader(wall).map(|l| l.holder);
        for id in ids {
            let Some(r) = self.jobs.runs.get(&id).cloned() else { continue };
            if let Some(done) = r.outcome.clone() {
                if now >= r.lease_until {
                    // Too late: the leader has let the lease go; the job runs again elsewhere.
                    self.jobs.runs.remove(&id);
                } else if now >= r.done_due {
                    if let Some(r) = self.jobs.runs.get_mut(&id) {
                        r.done_due = now.plus(DONE_RETRY_MS);
                    }
                    if let Some(to) = leader.clone() {
                        self.job_report_done(wall, now, &to, done);
                    }
                }
                continue;
            }
            if let Some(at) = r.stopped_at.filter(|at| now >= at.plus(STOP_GRACE_MS)) {
                // Stopped, and its script has not ended (a host call stuck in I/O): the run is
                // given up here, its slot freed; a cancel or a timeout is reported anyway.
                let _ = at;
                let end = match r.stopping {
                    Some(StopWhy::Cancelled) => {
                        Some((JobStatus::Cancelled, "job cancelled (its script did not stop)".to_string()))
                    }
                    Some(StopWhy::TimedOut) => {
                        Some((JobStatus::Failed, format!("job timed out after {}s", r.timeout_sec)))
                    }
                    _ => None,
                };
                match end {
                    Some((status, error)) => {
                        if let Some(r) = self.jobs.runs.get_mut(&id) {
                            let log = std::mem::take(&mut r.new_log);
                            r.outcome = Some(DoneBody {
                                job: id.clone(),
                                attempt: r.attempt,
                                status,
                                output: Value::Null,
                                error,
                                log,
                            });
                            r.done_due = now;
                        }
                    }
                    None => {
                        self.jobs.runs.remove(&id);
                    }
                }
                continue;
            }
            if r.stopping == Some(StopWhy::LeaseLost) {
                continue; // nothing to renew: the job may run elsewhere now
            }
            if r.stopping.is_none() {
                if now >= r.lease_until {
                    self.job_stop(now, &id, StopWhy::LeaseLost);
                    continue;
                }
                if now.since(r.started) >= r.timeout_sec.saturating_mul(1000) {
                    self.job_stop(now, &id, StopWhy::TimedOut);
                }
            }
            if now >= r.renew_due {
                let Some(to) = leader.clone() else {
                    // No leader known (an election): ask again in a second.
                    if let Some(r) = self.jobs.runs.get_mut(&id) {
                        r.renew_due = now.plus(1_000);
                    }
                    continue;
                };
                let lease_ms = r.lease_ms;
                let body =
                    RenewBody { job: id.clone(), attempt: r.attempt, progress: r.progress, log: r.new_log.clone() };
                if let Some(r) = self.jobs.runs.get_mut(&id) {
                    r.renew_due = now.plus(lease_ms / 3);
                    r.last_report = now;
                    r.new_log.clear();
                    r.dirty = false;
                }
                self.job_report_renew(wall, now, &to, body);
            }
        }
    }

    fn job_report_renew(&mut self, wall: Millis, now: Millis, to: &NodeId, body: RenewBody) {
        let (job, attempt) = (body.job.clone(), body.attempt);
        if to == &self.id {
            let me = self.id.clone();
            let r = self.jobs_take_renew(wall, &me, body);
            self.job_renewed(wall, now, &job, attempt, now, r.map_err(|e| e.to_string()));
            return;
        }
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        self.new_request(wall, now, to, "POST", "/cluster/acn/jobs/renew", bytes, Purpose::JobRenew { job, attempt });
    }

    fn job_report_done(&mut self, wall: Millis, now: Millis, to: &NodeId, body: DoneBody) {
        let (job, attempt) = (body.job.clone(), body.attempt);
        if to == &self.id {
            let me = self.id.clone();
            let r = self.jobs_take_done(wall, &me, body);
            self.job_done_answered(&job, attempt, r.map_err(|e| e.to_string()));
            return;
        }
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        self.new_request(wall, now, to, "POST", "/cluster/acn/jobs/done", bytes, Purpose::JobDone { job, attempt });
    }

    /// The leader's answer to a renewal sent at `sent`: `Ok(cancelled)`, or why it was refused.
    pub(super) fn job_renewed(
        &mut self,
        _wall: Millis,
        now: Millis,
        job: &JobId,
        attempt: u32,
        sent: Millis,
        r: Result<bool, String>,
    ) {
        let Some(run) = self.jobs.runs.get_mut(job).filter(|x| x.attempt == attempt) else { return };
        let lease_ms = run.lease_ms;
        match r {
            Ok(cancelled) => {
                run.lease_until = run.lease_until.max(worker_deadline(sent, lease_ms));
                if cancelled {
                    self.job_stop(now, job, StopWhy::Cancelled);
                }
            }
            Err(e) if e == LeaseError::Lost.to_string() || e.contains("lease_lost") => {
                self.job_stop(now, job, StopWhy::LeaseLost);
                if let Some(run) = self.jobs.runs.get(job) {
                    if run.outcome.is_some() {
                        self.jobs.runs.remove(job);
                    }
                }
            }
            Err(_) => {
                // Not the leader, or no answer: try again soon.
                run.renew_due = run.renew_due.min(now.plus(1_000));
            }
        }
    }

    /// The leader's answer to an outcome: taken (the run is over here) or refused.
    pub(super) fn job_done_answered(&mut self, job: &JobId, attempt: u32, r: Result<(), String>) {
        match r {
            Ok(()) => {
                self.jobs.runs.remove(job);
            }
            Err(e) if e == LeaseError::Lost.to_string() || e.contains("lease_lost") => {
                self.jobs.runs.remove(job);
            }
            Err(_) => {
                let _ = attempt;
            }
        }
    }

    /// `jobs/run`, `jobs/renew`, `jobs/done` from verified member `sender`.
    pub(super) fn answer_jobs(
        &mut self,
        wall: Millis,
        now: Millis,
        endpoint: &str,
        sender: &NodeId,
        body: &[u8],
    ) -> Reply {
        let bad = |e: serde_json::Error| Reply::error(ErrorKind::Invalid, "bad_body", format!("{endpoint} body: {e}"));
        let refused = |e: LeaseError| match e {
            LeaseError::NotLeader => Reply::error(ErrorKind::Conflict, "not_leader", e.to_string()),
            LeaseError::Lost => Reply::error(ErrorKind::Conflict, "lease_lost", e.to_string()),
        };
        match endpoint {
            "jobs/run" => match serde_json::from_slice::<HandOver>(body) {
                Ok(b) => self.job_accept(wall, now, sender, b),
                Err(e) => bad(e),
            },
            "jobs/renew" => match serde_json::from_slice::<RenewBody>(body) {
                Ok(b) => match self.jobs_take_renew(wall, sender, b) {
                    Ok(cancelled) => {
                        Reply::ok(json!({"ok": true, "cancelled": cancelled, "leaseMs": self.jobs_lease_ms()}))
                    }
                    Err(e) => refused(e),
                },
                Err(e) => bad(e),
            },
            _ => match serde_json::from_slice::<DoneBody>(body) {
                Ok(b) => match self.jobs_take_done(wall, sender, b) {
                    Ok(()) => Reply::ok(json!({"ok": true})),
                    Err(e) => refused(e),
                },
                Err(e) => bad(e),
            },
        }
    }

    /// A peer answered a jobs request this node sent.
    pub(super) fn jobs_on_response(
        &mut self,
        wall: Millis,
        now: Millis,
        peer: &NodeId,
        sent: Millis,
        purpose: &Purpose,
        result: Result<super::PeerAnswer, String>,
    ) {
        let refusal = |a: &super::PeerAnswer| {
            serde_json::from_slice::<Value>(&a.body)
                .ok()
                .and_then(|v| v.pointer("/error/code").and_then(|c| c.as_str()).map(str::to_string))
                .unwrap_or_else(|| "refused".into())
        };
        match purpose {
            Purpose::JobHandOver { job, attempt } => self.job_handed(wall, now, job, *attempt, peer, result),
            Purpose::JobRenew { job, attempt } => {
                let r = match result {
                    Ok(a) if a.refused.is_none() => Ok(serde_json::from_slice::<Value>(&a.body)
                        .ok()
                        .and_then(|v| v.get("cancelled").and_then(Value::as_bool))
                        .unwrap_or(false)),
                    Ok(a) => Err(refusal(&a)),
                    Err(e) => Err(e),
                };
                self.job_renewed(wall, now, job, *attempt, sent, r);
            }
            Purpose::JobDone { job, attempt } => {
                let r = match result {
                    Ok(a) if a.refused.is_none() => Ok(()),
                    Ok(a) => Err(refusal(&a)),
                    Err(e) => Err(e),
                };
                self.job_done_answered(job, *attempt, r);
            }
            _ => {}
        }
    }
}

/// A map/reduce parent's progress in whole percent: it is written again only when this moves.
fn whole_percent(progress: f64) -> i64 {
    (progress * 100.0).floor() as i64
}
