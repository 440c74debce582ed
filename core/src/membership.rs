//! The member list of one node: merge, liveness and latency (spec: cluster-runtime.md
//! "Membership"; reference-facts.md "LWW", "Liveness", "Heartbeat").
//!
//! Merging a batch of records is per register (see [`crate::records`]): commutative,
//! associative and idempotent for records written by their legitimate signers, with the HLC
//! version as the total order. Signatures are checked only when a register would change, so
//! merging a heartbeat that brings nothing new costs a few comparisons per record.
//!
//! Liveness is computed, never gossiped: each node keeps `last_seen` on its *own* clock. A
//! `lastSeen` learnt from a peer is translated by the peer's `time` (age on the peer's clock,
//! applied to ours), so a peer whose clock is minutes off cannot make a dead node look alive.
//! Removed ids are remembered after their tombstone is purged, so a stale peer cannot bring a
//! removed node back.

use crate::hlc::Hlc;
use crate::ids::NodeId;
use crate::records::{AdminState, NodeRecord};
use crate::time::{Millis, DAY_MS};
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Intervals and thresholds of membership. Defaults are the spec's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct MembershipConfig {
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    /// Heard from within this long: ONLINE (or DEGRADED).
    pub online_within_ms: u64,
    /// Silent up to this long: UNKNOWN; beyond it OFFLINE.
    pub unknown_within_ms: u64,
    pub tombstone_ttl_ms: u64,
    pub degraded_cpu_pct: f64,
    pub degraded_ram_frac: f64,
    pub degraded_disk_free_frac: f64,
    pub latency_alpha: f64,
    /// How often node states are recomputed for events.
    pub state_tick_ms: u64,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            heartbeat_interval_ms: 15_000,
            heartbeat_timeout_ms: 20_000,
            online_within_ms: 45_000,
            unknown_within_ms: 180_000,
            tombstone_ttl_ms: 7 * DAY_MS,
            degraded_cpu_pct: 97.0,
            degraded_ram_frac: 0.97,
            degraded_disk_free_frac: 0.02,
            latency_alpha: 0.3,
            state_tick_ms: 5_000,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum NodeState {
    Online,
    Degraded,
    Unknown,
    Offline,
    Maintenance,
    Draining,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Online => "ONLINE",
            NodeState::Degraded => "DEGRADED",
            NodeState::Unknown => "UNKNOWN",
            NodeState::Offline => "OFFLINE",
            NodeState::Maintenance => "MAINTENANCE",
            NodeState::Draining => "DRAINING",
        }
    }
}

/// How a batch of records reached us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// From a member over a signed request: new records need an admission by a known member.
    Gossip,
    /// The member list in the reply to our own join: the issuer vouches for it.
    JoinReply,
}

/// What a merge changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeOutcome {
    /// Records inserted or changed; persist them.
    pub changed: Vec<NodeId>,
    /// Records newly removed.
    pub removed: Vec<NodeId>,
    /// Records newly inserted.
    pub added: Vec<NodeId>,
    /// Our own record came back newer than ours (we must re-sign past it).
    pub own_owner_newer: Option<crate::hlc::Version>,
}

#[derive(Clone, Debug, Default)]
struct PeerSoft {
    last_seen: Millis,
    latency_ms: Option<f64>,
    /// How far the peer's clock is ahead of ours, latest sample.
    clock_offset_ms: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct Membership {
    me: NodeId,
    config: MembershipConfig,
    records: BTreeMap<NodeId, NodeRecord>,
    soft: BTreeMap<NodeId, PeerSoft>,
    purged: BTreeSet<NodeId>,
    /// Public keys already decoded, by their base64 text: decoding one (a point decompression)
    /// cost as much as a fifth of verifying a request's signature, on every request.
    keys: std::cell::RefCell<BTreeMap<String, VerifyingKey>>,
}

/// Most decoded keys kept (members, and the removed ones whose old marks are checked).
const KEYS_CACHED_MAX: usize = 1024;

impl Membership {
    pub fn new(me: NodeId, config: MembershipConfig) -> Membership {
        Membership {
            me,
            config,
            records: BTreeMap::new(),
            soft: BTreeMap::new(),
            purged: BTreeSet::new(),
            keys: Default::default(),
        }
    }

    /// The decoded key of a record (cached by its text, so a changed key is decoded afresh).
    fn decoded_key(&self, r: &NodeRecord) -> Option<VerifyingKey> {
        if let Some(k) = self.keys.borrow().get(&r.public_key) {
            return Some(*k);
        }
        let k = r.key()?;
        let mut keys = self.keys.borrow_mut();
        if keys.len() >= KEYS_CACHED_MAX {
            keys.clear();
        }
        keys.insert(r.public_key.clone(), k);
        Some(k)
    }

    pub fn me(&self) -> &NodeId {
        &self.me
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    pub fn set_config(&mut self, c: MembershipConfig) {
        self.config = c;
    }

    pub fn records(&self) -> impl Iterator<Item = &NodeRecord> {
        self.records.values()
    }

    pub fn get(&self, id: &NodeId) -> Option<&NodeRecord> {
        self.records.get(id)
    }

    pub fn get_mut(&mut self, id: &NodeId) -> Option<&mut NodeRecord> {
        self.records.get_mut(id)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn purged(&self) -> impl Iterator<Item = &NodeId> {
        self.purged.iter()
    }

    /// Live members other than this node.
    pub fn peers(&self) -> impl Iterator<Item = &NodeRecord> {
        self.records.values().filter(move |r| !r.removed && r.id != self.me)
    }

    /// The key of a live (not removed) member, for verifying its requests.
    pub fn member_key(&self, id: &NodeId) -> Option<VerifyingKey> {
        self.records.get(id).filter(|r| !r.removed).and_then(|r| self.decoded_key(r))
    }

    /// The key of any known record, removed or not, for checking marks it signed earlier.
    fn author_key(&self, id: &NodeId) -> Option<VerifyingKey> {
        self.records.get(id).and_then(|r| self.decoded_key(r))
    }

    /// Put a record in place as is (restore from disk, our own record).
    pub fn insert(&mut self, r: NodeRecord) {
        self.records.insert(r.id.clone(), r);
    }

    pub fn remember_purged(&mut self, id: NodeId) {
        self.purged.insert(id);
    }

    pub fn clear(&mut self) {
        self.records.clear();
        self.soft.clear();
        self.purged.clear();
    }

    /// Merge a batch from a peer. `sender_now` is the sender's clock when it sent the batch (for
    /// translating `lastSeen`), `None` when the batch carries no time.
    pub fn merge(
        &mut self,
        now: Millis,
        batch: &[NodeRecord],
        sender_now: Option<Millis>,
        trust: Trust,
        hlc: &mut Hlc,
    ) -> MergeOutcome {
        let mut out = MergeOutcome::default();
        // Pass 1: owner registers and new records, so marks in the same batch can find their
        // authors. New records admitted by another new record are retried until nothing moves.
        let mut fresh: Vec<&NodeRecord> = Vec::new();
        for theirs in batch {
            if self.purged.contains(&theirs.id) || !hlc.acceptable(&theirs.owner_version) {
                continue;
            }
            hlc.observe(&theirs.owner_version);
            if theirs.id == self.me {
                if let Some(ours) = self.records.get(&self.me) {
                    if theirs.owner_version > ours.owner_version && theirs.public_key == ours.public_key {
                        out.own_owner_newer = Some(theirs.owner_version.clone());
                    }
                }
                continue;
            }
            match self.records.get_mut(&theirs.id) {
                Some(ours) => {
                    if ours.merge_owner(theirs) {
                        out.changed.push(theirs.id.clone());
                    }
                }
                None => fresh.push(theirs),
            }
        }
        loop {
            let before = fresh.len();
            let mut still = Vec::new();
            for theirs in fresh {
                if let Some(ours) = self.records.get_mut(&theirs.id) {
                    // Another copy of this id earlier in the batch was just admitted: this copy's
                    // owner register still merges, or the result would depend on batch order.
                    if ours.merge_owner(theirs) && !out.changed.contains(&theirs.id) {
                        out.changed.push(theirs.id.clone());
                    }
                    continue;
                }
                if self.admissible(theirs, trust) {
                    self.records.insert(theirs.id.clone(), admitted_copy(theirs));
                    out.added.push(theirs.id.clone());
                    out.changed.push(theirs.id.clone());
                } else {
                    still.push(theirs);
                }
            }
            fresh = still;
            if fresh.is_empty() || fresh.len() == before {
                break;
            }
        }
        // Pass 2: admin state, removal, health and lastSeen.
        for theirs in batch {
            if self.purged.contains(&theirs.id) || !self.records.contains_key(&theirs.id) {
                continue;
            }
            let believable = |m: &Option<crate::records::Mark>| m.as_ref().is_none_or(|m| hlc.acceptable(&m.version));
            let health_believable = theirs.health.as_ref().is_none_or(|h| {
                hlc.acceptable(&crate::hlc::Version { wall_ms: h.timestamp, counter: 0, node: theirs.id.clone() })
            });
            if !believable(&theirs.admin) || !believable(&theirs.removal) || !health_believable {
                continue;
            }
            if let Some(m) = &theirs.admin {
                hlc.observe(&m.version);
            }
            if let Some(m) = &theirs.removal {
                hlc.observe(&m.version);
            }
            let keys: BTreeMap<NodeId, VerifyingKey> = [theirs.admin.as_ref(), theirs.removal.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|m| self.author_key(&m.by).map(|k| (m.by.clone(), k)))
                .collect();
            let is_me = theirs.id == self.me;
            let ours = self.records.get_mut(&theirs.id).expect("checked above");
            let was_removed = ours.removed;
            let mut changed = ours.merge_admin(theirs, |id| keys.get(id).copied());
            changed |= ours.merge_removal(theirs, |id| keys.get(id).copied());
            if !is_me {
                // Health is soft state: merged, but not a change worth persisting.
                ours.merge_health(theirs);
            }
            if changed && !out.changed.contains(&theirs.id) {
                out.changed.push(theirs.id.clone());
            }
            if !was_removed && ours.removed {
                out.removed.push(theirs.id.clone());
            }
            if !is_me {
                let age = match (theirs.last_seen_age_ms, sender_now) {
                    (Some(age), _) => Some(age),
                    (None, Some(sender_now)) if theirs.last_seen_ms > 0 => {
                        Some(sender_now.since(Millis(theirs.last_seen_ms)))
                    }
                    _ => None,
                };
                if let Some(age) = age {
                    self.saw_at(&theirs.id, Millis(now.0.saturating_sub(age)), now);
                }
            }
        }
        out
    }

    fn admissible(&self, r: &NodeRecord, trust: Trust) -> bool {
        if !r.shape_ok() {
            return false;
        }
        let Some(key) = r.key() else { return false };
        if !r.owner_sig_valid(&key) || r.owner_version.node != r.id {
            return false;
        }
        let Some(adm) = &r.admitted else { return false };
        if adm.by == r.id {
            // Only the founder admits itself; we accept that only from the issuer we joined through.
            return trust == Trust::JoinReply && r.admission_valid(&key);
        }
        match self.author_key(&adm.by) {
            Some(author) => r.admission_valid(&author),
            None => trust == Trust::JoinReply && batch_admission_ok(r),
        }
    }

    /// Record that we heard from `id` at `at` (our clock), never later than `now`.
    pub fn saw_at(&mut self, id: &NodeId, at: Millis, now: Millis) {
        let at = at.min(now);
        let soft = self.soft.entry(id.clone()).or_default();
        if at > soft.last_seen {
            soft.last_seen = at;
        }
    }

    pub fn last_seen(&self, id: &NodeId) -> Millis {
        self.soft.get(id).map(|s| s.last_seen).unwrap_or(Millis::ZERO)
    }

    /// Fold one round-trip sample into the EWMA (first sample taken as is).
    pub fn record_rtt(&mut self, id: &NodeId, rtt_ms: f64) {
        let alpha = self.config.latency_alpha;
        let soft = self.soft.entry(id.clone()).or_default();
        soft.latency_ms = Some(match soft.latency_ms {
            None => rtt_ms,
            Some(prev) => alpha * rtt_ms + (1.0 - alpha) * prev,
        });
    }

    /// Note a sample of how far `id`'s clock is ahead of ours (clamped to the accepted range).
    pub fn record_clock_offset(&mut self, id: &NodeId, offset_ms: i64) {
        let max = crate::acn::PEER_OFFSET_MAX_MS;
        self.soft.entry(id.clone()).or_default().clock_offset_ms = Some(offset_ms.clamp(-max, max));
    }

    /// Our estimate of how far `id`'s clock is ahead of ours (0 when unknown).
    pub fn clock_offset_ms(&self, id: &NodeId) -> i64 {
        self.soft.get(id).and_then(|s| s.clock_offset_ms).unwrap_or(0)
    }

    /// 0 for this node, -1 when never measured.
    pub fn latency_ms(&self, id: &NodeId) -> f64 {
        if id == &self.me {
            return 0.0;
        }
        self.soft.get(id).and_then(|s| s.latency_ms).unwrap_or(-1.0)
    }

    /// This node's round trips to its live peers.
    pub fn latency_vector(&self) -> BTreeMap<NodeId, f64> {
        self.peers().map(|r| (r.id.clone(), self.latency_ms(&r.id))).collect()
    }

    /// The computed state of `id` at `now` (reference-facts "Liveness"): an admin state
    /// overrides, even for this node; otherwise [`Membership::liveness`].
    pub fn state(&self, id: &NodeId, now: Millis) -> NodeState {
        match self.records.get(id).map(|r| r.admin_state) {
            Some(AdminState::Maintenance) => NodeState::Maintenance,
            Some(AdminState::Draining) => NodeState::Draining,
            _ => self.liveness(id, now),
        }
    }

    /// Liveness alone, ignoring any admin state: this node is ONLINE; a peer never heard from is
    /// UNKNOWN; heard within the online window ONLINE (DEGRADED when its health says so), then
    /// UNKNOWN, then OFFLINE.
    pub fn liveness(&self, id: &NodeId, now: Millis) -> NodeState {
        let Some(r) = self.records.get(id) else { return NodeState::Unknown };
        if id == &self.me {
            return NodeState::Online;
        }
        let seen = self.last_seen(id);
        if seen == Millis::ZERO {
            return NodeState::Unknown;
        }
        let age = now.since(seen);
        if age <= self.config.online_within_ms {
            if self.degraded(r) {
                NodeState::Degraded
            } else {
                NodeState::Online
            }
        } else if age <= self.config.unknown_within_ms {
            NodeState::Unknown
        } else {
            NodeState::Offline
        }
    }

    fn degraded(&self, r: &NodeRecord) -> bool {
        let Some(h) = &r.health else { return false };
        if h.timestamp == 0 {
            return false;
        }
        let c = &self.config;
        let ram_full = h.ram_total > 0 && (h.ram_used as f64 / h.ram_total as f64) >= c.degraded_ram_frac;
        let disk_full = h.disk_total > 0 && (h.disk_free as f64 / h.disk_total as f64) <= c.degraded_disk_free_frac;
        h.cpu_usage >= c.degraded_cpu_pct || ram_full || disk_full
    }

    /// Drop tombstones older than the TTL; returns the purged ids.
    pub fn purge_tombstones(&mut self, now: Millis) -> Vec<NodeId> {
        let ttl = self.config.tombstone_ttl_ms;
        let gone: Vec<NodeId> = self
            .records
            .values()
            .filter(|r| r.removal.as_ref().is_some_and(|m| now.since(Millis(m.version.wall_ms)) > ttl))
            .map(|r| r.id.clone())
            .collect();
        for id in &gone {
            self.records.remove(id);
            self.soft.remove(id);
            self.purged.insert(id.clone());
        }
        gone
    }

    /// Records as sent to peers at `now` (this node's monotonic time) and `wall` (its wall
    /// clock): `lastSeenAgeMs` from our monotonic view, `lastSeen` as the wall time it implies.
    pub fn wire_records_at(&self, now: Millis, wall: Millis) -> Vec<NodeRecord> {
        self.records
            .values()
            .map(|r| {
                let mut r = r.clone();
                let seen = self.last_seen(&r.id);
                if r.id == self.me || seen == Millis::ZERO {
                    r.last_seen = 0;
                    r.last_seen_ms = 0;
                    r.last_seen_age_ms = None;
                } else {
                    let age = now.since(seen);
                    r.last_seen_ms = wall.0.saturating_sub(age);
                    r.last_seen = r.last_seen_ms / 1000;
                    r.last_seen_age_ms = Some(age);
                }
                r
            })
            .collect()
    }

    /// Records as sent to peers: `lastSeen` filled in from our clock.
    pub fn wire_records(&self) -> Vec<NodeRecord> {
        self.records
            .values()
            .map(|r| {
                let mut r = r.clone();
                let seen = if r.id == self.me { Millis::ZERO } else { self.last_seen(&r.id) };
                r.last_seen = seen.as_secs();
                r.last_seen_ms = seen.0;
                r
            })
            .collect()
    }

    /// A digest-friendly view: every record's register versions, in id order.
    pub fn versions(&self) -> Vec<(NodeId, String)> {
        self.records
            .values()
            .map(|r| {
                let (o, a, d) = r.register_versions();
                let f = |v: Option<crate::hlc::Version>| v.map(|v| v.to_string()).unwrap_or_default();
                (r.id.clone(), format!("{o}|{}|{}|{}", f(a), f(d), r.removed))
            })
            .collect()
    }
}

/// The parts of a new record that stand on their own; registers that need an author are
/// merged afterwards, each checked against its author's key.
fn admitted_copy(theirs: &NodeRecord) -> NodeRecord {
    let mut fresh = theirs.clone();
    fresh.admin_state = AdminState::Active;
    fresh.admin = None;
    fresh.removed = false;
    fresh.removal = None;
    let health_ok = fresh.key().is_some_and(|k| fresh.health_valid(&k));
    if !health_ok {
        fresh.health = None;
        fresh.health_sig.clear();
    }
    fresh.last_seen = 0;
    fresh.last_seen_ms = 0;
    fresh.last_seen_age_ms = None;
    fresh
}

/// A record admitted by a member we have not seen yet, arriving in the issuer's own join reply:
/// we cannot check the admission, but the issuer vouches for the list and its owner signature holds.
fn batch_admission_ok(r: &NodeRecord) -> bool {
    r.admitted.is_some()
}
