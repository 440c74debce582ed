//! The node's side of replication tasks (spec: "Replication"): the leader grants each planned
//! task a lease, takes its worker's renewals and its end, and fails it when the lease runs out;
//! every outcome escalates or clears the file's replicated backoff. The table and its rules are
//! [`TaskLeases`]; this module adds who may report (the worker, under a term this leader knows)
//! and the timer, which [`Node::poll_timeout`] announces.

use super::{Event, Node, Purpose};
use crate::ids::{FileId, NodeId};
use crate::storage::chores::Chore;
use crate::storage::planner::{InFlight, Task, TaskOutcome};
use crate::storage::tasks::ReportError;
use crate::time::Millis;
use serde::{Deserialize, Serialize};

/// A task's lease when `replication.task_lease` is not set (reference-facts.md "Planner").
pub const TASK_LEASE_MS: u64 = 30_000;
/// How often a worker renews the lease of a task it carries out.
pub const TASK_RENEW_MS: u64 = 10_000;

/// The body of `repl/renew` and `repl/done`: a worker's report on its task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskReportBody {
    pub term: u64,
    pub task: Task,
    pub ok: bool,
    /// A failure that was a refusal for now (another write's bytes unsettled at the target):
    /// the file waits one base delay, no failure is counted. Sent only when set, so a node of
    /// the previous version still reads every other report.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deferred: bool,
    #[serde(default)]
    pub error: String,
}

/// Worker: a task this node carries out, and when its lease is renewed next.
#[derive(Clone, Debug)]
pub(super) struct Working {
    leader: NodeId,
    term: u64,
    task: Task,
    renew_due: Millis,
}

/// What a worker reports about its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskReport {
    /// Still working: extend the lease (or adopt the task).
    Renew,
    /// Finished, well or not.
    Done(TaskOutcome),
}

impl TaskReportBody {
    /// How the task ended, as this report says.
    pub fn outcome(&self) -> TaskOutcome {
        match (self.ok, self.deferred) {
            (true, _) => TaskOutcome::Succeeded,
            (false, true) => TaskOutcome::Deferred,
            (false, false) => TaskOutcome::Failed,
        }
    }
}

impl Node {
    fn task_lease_ms(&self) -> u64 {
        self.config_number("replication", "task_lease").map_or(TASK_LEASE_MS, |v| v as u64)
    }

    /// Leader: tasks in flight, as the planner takes them.
    pub fn repl_in_flight(&self) -> Vec<InFlight> {
        self.repl_tasks.in_flight()
    }

    /// Leader: the tasks in flight.
    pub fn repl_tasks(&self) -> Vec<Task> {
        self.repl_tasks.tasks()
    }

    /// Leader: a planned task goes out; its lease starts now.
    pub fn repl_grant(&mut self, wall: Millis, task: Task) {
        let now = self.advance_clocks(wall);
        let lease = self.task_lease_ms();
        self.repl_tasks.grant(now, task, lease);
    }

    /// Leader: the worker `sender` reports on `task` under `term`. `Ok(true)` when the task
    /// ended here (its outcome is recorded in the file's backoff).
    pub fn repl_report(
        &mut self,
        wall: Millis,
        sender: &NodeId,
        term: u64,
        task: &Task,
        report: TaskReport,
    ) -> Result<bool, ReportError> {
        let Some(leader_term) = self.leader_term(wall) else { return Err(ReportError::NotLeader) };
        if task.action.worker() != sender || term > leader_term {
            return Err(ReportError::NotAuthorized);
        }
        let now = self.advance_clocks(wall);
        match report {
            TaskReport::Renew => {
                let lease = self.task_lease_ms();
                self.repl_tasks.renew(now, task.clone(), lease)?;
                Ok(false)
            }
            TaskReport::Done(outcome) => {
                self.repl_tasks.done(task)?;
                self.repl_outcome(wall, &task.path, outcome);
                self.repl_count(outcome);
                self.chores.kick(Chore::Plan, now);
                self.dispatch_backlog(wall, outcome);
                Ok(true)
            }
        }
    }

    /// Leader: a task ended by this node's own hand (a drop carried out or refused, a worker
    /// that refused the task).
    pub fn repl_finish(&mut self, wall: Millis, file: &FileId, path: &str, outcome: TaskOutcome) {
        let now = self.advance_clocks(wall);
        self.repl_tasks.finish(file);
        self.repl_outcome(wall, path, outcome);
        self.repl_count(outcome);
        self.chores.kick(Chore::Plan, now);
        self.dispatch_backlog(wall, outcome);
    }

    /// From `handle_timeout`: leases that ran out fail their tasks; a node that is not the
    /// leader keeps no table.
    pub(super) fn repl_tasks_timeout(&mut self, wall: Millis, now: Millis) {
        if self.repl_tasks.is_empty() && self.repl_backlog.is_empty() {
            return;
        }
        if !self.meta.is_leader(now) {
            self.repl_tasks.clear();
            self.repl_backlog.clear();
            return;
        }
        let expired = self.repl_tasks.expire(now);
        if expired.is_empty() {
            return;
        }
        for t in expired {
            self.repl_outcome(wall, &t.path, TaskOutcome::Failed);
            self.repl_stats.expired += 1;
            self.event(Event::ReplTaskExpired { path: t.path });
        }
    }
}

impl Node {
    /// Worker: this node starts carrying out `task`, sent by `leader` under `term`; its lease
    /// is renewed every [`TASK_RENEW_MS`] from the node's timer until [`Node::work_end`].
    /// `false` when this node is at that file's task already.
    pub fn work_begin(&mut self, wall: Millis, leader: &NodeId, term: u64, task: &Task) -> bool {
        let now = self.advance_clocks(wall);
        if self.working.contains_key(&task.file) {
            return false;
        }
        let w = Working { leader: leader.clone(), term, task: task.clone(), renew_due: now.plus(TASK_RENEW_MS) };
        self.working.insert(task.file.clone(), w);
        true
    }

    /// Worker: the task of `file` ended here (its report goes out separately).
    pub fn work_end(&mut self, file: &FileId) {
        self.working.remove(file);
    }

    /// Worker: the files whose tasks this node carries out now.
    pub fn working(&self) -> Vec<FileId> {
        self.working.keys().cloned().collect()
    }

    /// The next renewal of a task this node carries out.
    pub(super) fn work_next_renewal(&self) -> Option<Millis> {
        self.working.values().map(|w| w.renew_due).min()
    }

    /// From `handle_timeout`: renew the lease of each task whose renewal is due, with whoever
    /// holds the metadata lease now (a new leader adopts the task), or with this node's own
    /// table when it is that leader.
    pub(super) fn work_timeout(&mut self, wall: Millis, now: Millis) {
        let due: Vec<FileId> =
            self.working.iter().filter(|(_, w)| w.renew_due <= now).map(|(f, _)| f.clone()).collect();
        for file in due {
            let Some(w) = self.working.get_mut(&file) else { continue };
            w.renew_due = now.plus(TASK_RENEW_MS);
            let w = w.clone();
            let to = self.meta_leader(wall).map_or(w.leader.clone(), |l| l.holder);
            if to == self.id {
                let me = self.id.clone();
                let _ = self.repl_report(wall, &me, w.term, &w.task, TaskReport::Renew);
                continue;
            }
            let body = TaskReportBody { term: w.term, task: w.task, ok: true, deferred: false, error: String::new() };
            let body = serde_json::to_vec(&body).unwrap_or_default();
            self.new_request(wall, now, &to, "POST", "/cluster/acn/repl/renew", body, Purpose::TaskRenew);
        }
    }
}

/// Whether pulled bytes are still a copy of their file, by this node's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullCurrency {
    /// The file is live, the same file, with the content pulled.
    Current,
    /// Overwritten, moved away or removed since: the bytes are no copy of it now.
    Changed,
    /// This node's records do not show the file yet (they may lag the leader's): ask again.
    NotYetKnown,
}

impl Node {
    /// Whether the bytes `task` pulled are still a copy of its file (checked before they are
    /// put in place).
    pub fn pull_currency(&self, task: &Task) -> PullCurrency {
        match self.meta.state().file(&task.path) {
            None => PullCurrency::NotYetKnown,
            Some(f) if f.id != task.file && f.removed => PullCurrency::NotYetKnown,
            Some(f) if !f.removed && f.id == task.file && f.checksum.eq_ignore_ascii_case(&task.checksum) => {
                PullCurrency::Current
            }
            Some(_) => PullCurrency::Changed,
        }
    }

    /// Whether the records list a current copy of `path` on `volume` (then bytes there are
    /// kept even when a pull could not publish its own).
    pub fn current_copy_listed(&self, path: &str, volume: &crate::ids::VolumeId) -> bool {
        self.meta
            .state()
            .file(path)
            .is_some_and(|f| !f.removed && f.locations.iter().any(|l| &l.volume_id == volume && f.is_current(l)))
    }

    /// Whether this node's records know the file `task` pulled (same id at its path).
    pub fn knows_task_file(&self, task: &Task) -> bool {
        self.meta.state().file(&task.path).is_some_and(|f| f.id == task.file)
    }
}
