//! The two clocks on a run's lease (spec "Jobs": leases; DESIGN.md "Leader lease").
//!
//! The leader times each lease on its own clock from the last renewal it *received*; the
//! worker times it on its own clock from the last renewal it *sent* that was answered, less
//! [`WORKER_LEASE_MARGIN_MS`]. A renewal is received after it is sent, so the worker's deadline
//! always comes first: by the time the leader requeues a silent node's job, that node has
//! stopped it, and no job runs on two nodes under valid leases. No wall clocks are compared.

use super::WORKER_LEASE_MARGIN_MS;
use crate::ids::{JobId, NodeId};
use crate::time::Millis;
use std::collections::BTreeMap;

/// One lease as the leader times it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub node: NodeId,
    pub attempt: u32,
    pub deadline: Millis,
}

/// Why a worker's report is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("this node is not the leader")]
    NotLeader,
    #[error("the lease of this run is not held (the job was requeued, finished or never handed to you)")]
    Lost,
}

/// The leader's book: every lease it granted or adopted, under the term it holds.
#[derive(Clone, Debug, Default)]
pub struct LeaderLeases {
    /// The term the book was built for; another term rebuilds it.
    pub term: u64,
    held: BTreeMap<JobId, Held>,
}

impl LeaderLeases {
    /// A new leader adopts every lease in the records as if renewed now, so a run under way
    /// keeps going if its node is alive, and is requeued a whole lease later if not.
    pub fn adopt(
        &mut self,
        term: u64,
        now: Millis,
        lease_ms: u64,
        leased: impl IntoIterator<Item = (JobId, NodeId, u32)>,
    ) {
        self.term = term;
        self.held = leased
            .into_iter()
            .map(|(job, node, attempt)| (job, Held { node, attempt, deadline: now.plus(lease_ms) }))
            .collect();
    }

    pub fn grant(&mut self, job: JobId, node: NodeId, attempt: u32, now: Millis, lease_ms: u64) {
        self.held.insert(job, Held { node, attempt, deadline: now.plus(lease_ms) });
    }

    /// The worker `node` renews its run `attempt` of `job`.
    pub fn renew(
        &mut self,
        job: &JobId,
        node: &NodeId,
        attempt: u32,
        now: Millis,
        lease_ms: u64,
    ) -> Result<(), LeaseError> {
        match self.held.get_mut(job) {
            Some(h) if &h.node == node && h.attempt == attempt => {
                h.deadline = h.deadline.max(now.plus(lease_ms));
                Ok(())
            }
            _ => Err(LeaseError::Lost),
        }
    }

    /// Whether `node` holds `job`'s lease for `attempt` now.
    pub fn holds(&self, job: &JobId, node: &NodeId, attempt: u32) -> bool {
        self.held.get(job).is_some_and(|h| &h.node == node && h.attempt == attempt)
    }

    pub fn get(&self, job: &JobId) -> Option<&Held> {
        self.held.get(job)
    }

    pub fn release(&mut self, job: &JobId) -> Option<Held> {
        self.held.remove(job)
    }

    /// Leases whose deadline passed, taken out of the book.
    pub fn expire(&mut self, now: Millis) -> Vec<(JobId, Held)> {
        let gone: Vec<JobId> = self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(j, _)| j.clone()).collect();
        gone.into_iter().filter_map(|j| self.held.remove(&j).map(|h| (j, h))).collect()
    }

    pub fn next_deadline(&self) -> Option<Millis> {
        self.held.values().map(|h| h.deadline).min()
    }

    /// Runs under lease on each node (its used slots).
    pub fn per_node(&self) -> BTreeMap<NodeId, u32> {
        let mut m = BTreeMap::new();
        for h in self.held.values() {
            *m.entry(h.node.clone()).or_default() += 1;
        }
        m
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn clear(&mut self) {
        self.held.clear();
        self.term = 0;
    }
}

/// The worker's deadline for a run whose renewal sent at `sent` was answered.
pub fn worker_deadline(sent: Millis, lease_ms: u64) -> Millis {
    sent.plus(lease_ms.saturating_sub(WORKER_LEASE_MARGIN_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s)
    }

    #[test]
    fn only_the_holder_of_the_attempt_renews() {
        let mut b = LeaderLeases::default();
        let j = JobId::new("j");
        b.grant(j.clone(), n("a"), 2, Millis(0), 30_000);
        assert_eq!(b.renew(&j, &n("b"), 2, Millis(1), 30_000), Err(LeaseError::Lost));
        assert_eq!(b.renew(&j, &n("a"), 1, Millis(1), 30_000), Err(LeaseError::Lost), "an older attempt is stale");
        assert_eq!(b.renew(&j, &n("a"), 2, Millis(10_000), 30_000), Ok(()));
        assert!(b.expire(Millis(39_999)).is_empty());
        assert_eq!(b.expire(Millis(40_000)).len(), 1);
        assert!(b.is_empty());
    }

    #[test]
    fn the_worker_gives_up_before_the_leader_requeues() {
        // The worker's renewal is sent at 100 and received at 100 or later.
        for received in [100, 150, 5_000] {
            let mut b = LeaderLeases::default();
            let j = JobId::new("j");
            b.grant(j.clone(), n("a"), 1, Millis(0), 30_000);
            b.renew(&j, &n("a"), 1, Millis(received), 30_000).unwrap();
            let worker = worker_deadline(Millis(100), 30_000);
            assert!(worker < b.get(&j).unwrap().deadline);
        }
    }

    #[test]
    fn a_new_leader_gives_every_adopted_lease_a_whole_term() {
        let mut b = LeaderLeases::default();
        b.adopt(7, Millis(1_000), 30_000, [(JobId::new("j"), n("a"), 3)]);
        assert_eq!(b.term, 7);
        assert!(b.holds(&JobId::new("j"), &n("a"), 3));
        assert_eq!(b.next_deadline(), Some(Millis(31_000)));
    }
}
