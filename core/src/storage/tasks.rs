//! The leader's table of replication tasks in flight and their leases (spec: "Replication";
//! reference-facts.md "Planner": task lease 30 s, renewed every 10 s; weakness 5: the backoff
//! must escalate, so a lease that runs out is a failure of the file, not a forgotten task).
//!
//! Rules it keeps, each with a unit test below:
//! - a task is **granted** with a lease of `lease_ms` from `now` (the node's monotonic time);
//! - a worker's **renew** extends the lease of the task in flight for that file; a renew of a
//!   task not in the table (begun under an earlier leader, or whose lease ran out here) is
//!   **adopted**, so a new leader takes over work under way instead of planning it twice; a
//!   renew of a *different* task while one is in flight for the file is refused;
//! - only the task in flight **ends** it: a late "done" of an expired task, or of a task never
//!   given, neither ends nor blocks the current one;
//! - a lease that runs out **expires** the task: it leaves the table and counts as a failure;
//! - a node that is not the leader holds no table (**clear**).
//!
//! Who may report (the worker itself, under a term the leader knows) is checked by the node
//! ([`crate::node::Node::repl_report`]); this table only keeps the leases.

use crate::ids::FileId;
use crate::storage::planner::{InFlight, Task};
use crate::time::Millis;
use std::collections::BTreeMap;

/// Why a worker's report was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("this node is not the leader")]
    NotLeader,
    #[error("the task is not the sender's, or not of a known term")]
    NotAuthorized,
    #[error("another task for that file is in flight")]
    OtherInFlight,
    #[error("that task is not in flight (its lease ran out?)")]
    NotInFlight,
}

/// The tasks in flight by file, each with the monotonic time its lease runs out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskLeases {
    in_flight: BTreeMap<FileId, (Task, Millis)>,
}

impl TaskLeases {
    /// Grant `task` until `now + lease_ms` (replacing any task of the same file).
    pub fn grant(&mut self, now: Millis, task: Task, lease_ms: u64) {
        self.in_flight.insert(task.file.clone(), (task, now.plus(lease_ms)));
    }

    /// A worker renews `task`: extended, or adopted when the file has no task in flight.
    pub fn renew(&mut self, now: Millis, task: Task, lease_ms: u64) -> Result<(), ReportError> {
        match self.in_flight.get(&task.file) {
            Some((current, _)) if current != &task => Err(ReportError::OtherInFlight),
            _ => {
                self.grant(now, task, lease_ms);
                Ok(())
            }
        }
    }

    /// A worker says `task` ended: it leaves the table if it is the one in flight.
    pub fn done(&mut self, task: &Task) -> Result<(), ReportError> {
        match self.in_flight.get(&task.file) {
            Some((current, _)) if current == task => {
                self.in_flight.remove(&task.file);
                Ok(())
            }
            _ => Err(ReportError::NotInFlight),
        }
    }

    /// The task of `file` ended by the leader's own hand (a drop it carried out, a refusal).
    pub fn finish(&mut self, file: &FileId) -> Option<Task> {
        self.in_flight.remove(file).map(|(t, _)| t)
    }

    /// Tasks whose lease ran out by `now`, removed from the table, in file order.
    pub fn expire(&mut self, now: Millis) -> Vec<Task> {
        let gone: Vec<FileId> =
            self.in_flight.iter().filter(|(_, (_, until))| *until <= now).map(|(f, _)| f.clone()).collect();
        gone.into_iter().filter_map(|f| self.in_flight.remove(&f).map(|(t, _)| t)).collect()
    }

    /// The earliest time a lease runs out.
    pub fn next_expiry(&self) -> Option<Millis> {
        self.in_flight.values().map(|(_, until)| *until).min()
    }

    pub fn clear(&mut self) {
        self.in_flight.clear();
    }

    /// The tasks in flight, as the planner takes them.
    pub fn in_flight(&self) -> Vec<InFlight> {
        self.in_flight
            .values()
            .map(|(t, _)| InFlight { file: t.file.clone(), node: t.action.worker().clone() })
            .collect()
    }

    pub fn tasks(&self) -> Vec<Task> {
        self.in_flight.values().map(|(t, _)| t.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{NodeId, VolumeId};
    use crate::storage::planner::{Action, Reason};

    fn task(file: &str, worker: &str) -> Task {
        Task {
            file: FileId::new(file),
            path: format!("/{file}"),
            size: 1,
            checksum: "00".into(),
            action: Action::Pull {
                source_node: NodeId::new("src"),
                source_volume: VolumeId::new("v0"),
                target_node: NodeId::new(worker),
                target_volume: VolumeId::new("v1"),
            },
            reason: Reason::Replica,
        }
    }

    #[test]
    fn a_granted_task_expires_when_its_lease_runs_out_unless_renewed() {
        let mut t = TaskLeases::default();
        t.grant(Millis(1_000), task("f", "w"), 30_000);
        assert_eq!(t.next_expiry(), Some(Millis(31_000)));
        assert!(t.expire(Millis(30_999)).is_empty());
        t.renew(Millis(20_000), task("f", "w"), 30_000).unwrap();
        assert!(t.expire(Millis(31_000)).is_empty(), "renewed until 50 s");
        assert_eq!(t.expire(Millis(50_000)), vec![task("f", "w")]);
        assert!(t.is_empty());
        assert_eq!(t.next_expiry(), None);
    }

    #[test]
    fn a_renew_of_an_unknown_task_is_adopted_and_a_different_task_is_refused() {
        let mut t = TaskLeases::default();
        // Begun under an earlier leader: adopted.
        t.renew(Millis(0), task("f", "w1"), 30_000).unwrap();
        assert_eq!(t.tasks(), vec![task("f", "w1")]);
        assert_eq!(t.in_flight(), vec![InFlight { file: FileId::new("f"), node: NodeId::new("w1") }]);
        // Another worker's task for the same file is not.
        assert_eq!(t.renew(Millis(1), task("f", "w2"), 30_000), Err(ReportError::OtherInFlight));
        assert_eq!(t.tasks(), vec![task("f", "w1")]);
    }

    #[test]
    fn only_the_task_in_flight_ends_it() {
        let mut t = TaskLeases::default();
        t.grant(Millis(0), task("f", "w1"), 30_000);
        assert_eq!(t.done(&task("f", "w2")), Err(ReportError::NotInFlight));
        assert_eq!(t.done(&task("g", "w1")), Err(ReportError::NotInFlight));
        assert_eq!(t.len(), 1);
        t.done(&task("f", "w1")).unwrap();
        assert!(t.is_empty());
        // A late report after the lease ran out ends nothing.
        t.grant(Millis(0), task("f", "w1"), 10);
        assert_eq!(t.expire(Millis(10)).len(), 1);
        assert_eq!(t.done(&task("f", "w1")), Err(ReportError::NotInFlight));
    }

    #[test]
    fn finish_and_clear_empty_the_table() {
        let mut t = TaskLeases::default();
        t.grant(Millis(0), task("f", "w"), 10);
        t.grant(Millis(0), task("g", "w"), 10);
        assert_eq!(t.finish(&FileId::new("f")), Some(task("f", "w")));
        assert_eq!(t.finish(&FileId::new("f")), None);
        t.clear();
        assert!(t.is_empty());
    }
}
