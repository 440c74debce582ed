//! What a node reports to `/metrics` (issue 17 "Operators"): one read of the node's gauges and
//! counters, typed, so the shell only formats it. Nothing here decides anything; the values
//! are the ones the node's other modules keep (membership, the metadata lease and log, the
//! replication and scrub counters, the volumes).

use super::Node;
use crate::time::Millis;

/// One volume's space, as its record says.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeGauge {
    pub id: String,
    pub node: String,
    pub local: bool,
    pub capacity: u64,
    pub free: u64,
    pub low_space: bool,
    pub read_only: bool,
}

/// A node's figures at one instant.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeGauges {
    pub in_cluster: bool,
    /// Members (not removed) by their computed state, in state-name order.
    pub members_by_state: Vec<(&'static str, u64)>,
    pub heartbeats_sent: u64,
    /// Nonces of verified requests kept (bounded by the cache's capacity), and signed
    /// requests refused since start.
    pub acn_nonces: u64,
    pub acn_refused: u64,
    /// The highest lease term known, whether this node holds the lease, and how often the
    /// lease changed since start.
    pub term: u64,
    pub is_leader: bool,
    pub leader_changes: u64,
    pub log_applied: u64,
    pub log_entries: u64,
    pub records: u64,
    /// Records submitted here and not yet taken by the leader.
    pub pending_submits: u64,
    /// Leader: entries each follower is behind.
    pub log_lag: Vec<(String, u64)>,
    pub repl_passes: u64,
    pub repl_dispatched: u64,
    /// Of those, handed out from the backlog as other tasks ended.
    pub repl_backlog_dispatched: u64,
    /// Leader: files the last pass left for the task limits, still waiting for a slot.
    pub repl_backlog: u64,
    pub repl_succeeded: u64,
    pub repl_failed: u64,
    pub repl_deferred: u64,
    pub repl_expired: u64,
    /// Replication tasks this node holds a lease on (leader) and files it is working on.
    pub repl_tasks: u64,
    pub repl_working: u64,
    /// Files waiting out a replication backoff.
    pub repl_backoffs: u64,
    pub scrubbed_copies: u64,
    pub scrubbed_bytes: u64,
    pub scrub_mismatches: u64,
    /// Local copies whose last check is older than the scrub bound.
    pub scrub_overdue: u64,
    /// Age of the oldest check among this node's current copies (none: no copies).
    pub scrub_oldest_age_ms: Option<u64>,
    pub volumes: Vec<VolumeGauge>,
}

impl Node {
    /// The figures `/metrics` reports, read at `wall`.
    pub fn gauges(&self, wall: Millis) -> NodeGauges {
        let now = self.clock.peek(wall);
        let mut by_state: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for r in self.members().records().filter(|r| !r.removed) {
            *by_state.entry(self.node_state(&r.id, wall).as_str()).or_default() += 1;
        }
        let meta = self.meta.status(now);
        let stats = self.repl_stats();
        let volumes = self
            .volume_list()
            .volumes
            .into_iter()
            .filter(|v| !v.volume.removed)
            .map(|v| VolumeGauge {
                id: v.volume.id.to_string(),
                node: v.volume.node_id.to_string(),
                local: v.local,
                capacity: v.volume.capacity,
                free: v.volume.free,
                low_space: v.volume.low_space,
                read_only: v.volume.read_only,
            })
            .collect();
        let (scrub_overdue, scrub_oldest_age_ms) = self.scrub_figures(wall);
        NodeGauges {
            in_cluster: self.cluster().is_some(),
            members_by_state: by_state.into_iter().collect(),
            heartbeats_sent: self.heartbeats_sent(),
            acn_nonces: self.verifier.nonce_count() as u64,
            acn_refused: self.acn_refused,
            term: meta.term.0,
            is_leader: meta.is_leader,
            leader_changes: self.meta.leader_changes(),
            log_applied: meta.applied.0,
            log_entries: meta.log_entries as u64,
            records: meta.records as u64,
            pending_submits: meta.pending as u64,
            log_lag: self.meta.peer_lag(now).into_iter().map(|(id, lag)| (id.to_string(), lag)).collect(),
            repl_passes: stats.passes,
            repl_dispatched: stats.dispatched,
            repl_backlog_dispatched: stats.backlog_dispatched,
            repl_backlog: self.repl_backlog.len() as u64,
            repl_succeeded: stats.succeeded,
            repl_failed: stats.failed,
            repl_deferred: stats.deferred,
            repl_expired: stats.expired,
            repl_tasks: self.repl_tasks().len() as u64,
            repl_working: self.working().len() as u64,
            repl_backoffs: self.repl_backoffs().len() as u64,
            scrubbed_copies: stats.scrubbed_copies,
            scrubbed_bytes: stats.scrubbed_bytes,
            scrub_mismatches: stats.scrub_mismatches,
            scrub_overdue,
            scrub_oldest_age_ms,
            volumes,
        }
    }
}
