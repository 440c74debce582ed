//! The metadata leader lease (spec: "Metadata store (ACMS)" → Leader lease; reference-facts.md
//! "Lease"; DESIGN.md "Leader lease").
//!
//! One member holds a lease used to serialise decisions. No quorum (a two-node cluster must fail
//! over), so a partition can briefly give two leaders; the rules make that safe:
//! - A lease is `(term, holder)`, ordered by term and then holder id. Two claims made on both
//!   sides of a partition can share a term *number* but never a lease: after the partition heals,
//!   the greater lease wins at once, everywhere, by the same rule (reference weakness 1).
//! - Leases are timed on the receiver's own monotonic clock from when it heard them, never by
//!   comparing wall clocks between nodes (weakness 2): a holder's lease is valid for 30 s after
//!   its last renewal as seen by each node.
//! - Only an eligible member (ONLINE or DEGRADED) holds a valid lease. When no valid lease is
//!   known, the eligible member that joined first (ties by id) claims `term + 1`. A node that
//!   just started waits one lease period before claiming, so a restart does not bump the term.
//! - Leadership is sticky: the holder renews every 10 s while it is eligible, even if a member
//!   that joined earlier comes back; it steps down only for a greater lease.
//! - A node that knows a greater lease refuses a lesser one, and says which it knows.

use crate::ids::{NodeId, Term};
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// The largest jump in term a pushed lease may make over the one this node knows.
pub const TERM_JUMP_MAX: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseConfig {
    pub lease_ms: u64,
    pub renew_every_ms: u64,
    pub tick_ms: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig { lease_ms: 30_000, renew_every_ms: 10_000, tick_ms: 5_000 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    pub holder: NodeId,
    pub term: Term,
}

impl Ord for Lease {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.term, &self.holder).cmp(&(other.term, &other.holder))
    }
}

impl PartialOrd for Lease {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A member as the lease sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: NodeId,
    /// Unix seconds it joined the cluster.
    pub joined: u64,
    /// ONLINE or DEGRADED in this node's view (for this node itself: not in an admin state).
    pub eligible: bool,
    /// Alive and heard from lately, whatever its admin state (a member in maintenance or
    /// draining still follows the log): whom a leader asks and waits for
    /// ([`crate::meta::machine::Meta::leader_may_lag`]).
    pub reachable: bool,
}

/// What the lease wants done after a tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Tell every peer about this lease (a claim or a renewal).
    Push(Lease),
}

/// The answer to a lease pushed by a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushVerdict {
    /// Taken (new, renewed or greater). `stepped_down` when this node held a lesser lease.
    Accepted { stepped_down: bool, changed: bool },
    /// Refused: this node knows a greater lease.
    Refused(Lease),
}

#[derive(Clone, Debug)]
pub struct LeaseState {
    me: NodeId,
    config: LeaseConfig,
    known: Option<Lease>,
    /// When `known` was last heard or renewed, on this node's monotonic clock.
    heard_at: Millis,
    /// No claim before this (one lease period after start, when there are peers).
    claim_not_before: Millis,
    /// The highest term this node knows was used, lease or not (restored from disk, or a lease
    /// of ours we no longer hold): a new claim goes above it.
    min_term: Term,
}

impl LeaseState {
    pub fn new(me: NodeId, config: LeaseConfig, now: Millis) -> LeaseState {
        let claim_not_before = now.plus(config.lease_ms);
        LeaseState { me, config, known: None, heard_at: Millis::ZERO, claim_not_before, min_term: Term(0) }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    pub fn set_config(&mut self, c: LeaseConfig) {
        self.config = c;
    }

    /// The greatest lease this node knows, valid or not.
    pub fn known(&self) -> Option<&Lease> {
        self.known.as_ref()
    }

    pub fn term(&self) -> Term {
        self.known.as_ref().map(|l| l.term).unwrap_or_default().max(self.min_term)
    }

    /// Remember that `term` was used (e.g. the term of the log restored from disk).
    pub fn note_term(&mut self, term: Term) {
        self.min_term = self.min_term.max(term);
    }

    /// Monotonic time at which the known lease lapses if not renewed.
    pub fn expires_at(&self) -> Option<Millis> {
        self.known.as_ref().map(|_| self.heard_at.plus(self.config.lease_ms))
    }

    /// The valid lease at `now`, if any. `eligible` says whether a member may hold one.
    pub fn valid(&self, now: Millis, eligible: impl Fn(&NodeId) -> bool) -> Option<&Lease> {
        let l = self.known.as_ref()?;
        (now < self.heard_at.plus(self.config.lease_ms) && eligible(&l.holder)).then_some(l)
    }

    pub fn is_leader(&self, now: Millis, eligible: impl Fn(&NodeId) -> bool) -> bool {
        self.valid(now, eligible).is_some_and(|l| l.holder == self.me)
    }

    /// Claim or renew as needed. `members` includes this node.
    pub fn tick(&mut self, now: Millis, members: &[Candidate]) -> Option<LeaseAction> {
        let eligible = |id: &NodeId| members.iter().any(|c| &c.id == id && c.eligible);
        let me_eligible = eligible(&self.me);
        if let Some(l) = self.valid(now, eligible).cloned() {
            if l.holder == self.me {
                if !me_eligible {
                    return None; // let it lapse
                }
                if now.since(self.heard_at) >= self.config.renew_every_ms {
                    self.heard_at = now;
                    return Some(LeaseAction::Push(l));
                }
            }
            return None;
        }
        if !me_eligible {
            return None;
        }
        // Any other member, eligible or not yet heard from, is a reason to listen first.
        let others = members.iter().any(|c| c.id != self.me);
        if others && now < self.claim_not_before {
            return None;
        }
        let candidate =
            members.iter().filter(|c| c.eligible).min_by(|a, b| (a.joined, &a.id).cmp(&(b.joined, &b.id)))?;
        if candidate.id != self.me {
            return None;
        }
        let lease = Lease { holder: self.me.clone(), term: Term(self.term().0.saturating_add(1)) };
        self.known = Some(lease.clone());
        self.heard_at = now;
        Some(LeaseAction::Push(lease))
    }

    /// A peer pushed `lease` (a claim, a renewal, or an append carrying it).
    pub fn on_push(&mut self, now: Millis, lease: Lease) -> PushVerdict {
        if lease.term.0 > self.term().0.saturating_add(TERM_JUMP_MAX) {
            // No real cluster makes a million claims at once: a term this far ahead would wedge
            // the lease (nothing could ever go above it).
            if let Some(k) = &self.known {
                return PushVerdict::Refused(k.clone());
            }
            return PushVerdict::Refused(Lease { holder: self.me.clone(), term: self.term() });
        }
        match &self.known {
            Some(k) if lease < *k => PushVerdict::Refused(k.clone()),
            Some(k) if lease == *k => {
                self.heard_at = now;
                PushVerdict::Accepted { stepped_down: false, changed: false }
            }
            known => {
                let stepped_down = known.as_ref().is_some_and(|k| k.holder == self.me && lease.holder != self.me);
                self.known = Some(lease);
                self.heard_at = now;
                PushVerdict::Accepted { stepped_down, changed: true }
            }
        }
    }

    /// A peer refused our push and named a greater lease: adopt it.
    /// Returns true when this node stepped down.
    pub fn on_refused(&mut self, now: Millis, theirs: Lease) -> bool {
        if theirs.term.0 > self.term().0.saturating_add(TERM_JUMP_MAX) {
            return false;
        }
        if theirs.holder == self.me && self.known.as_ref() != Some(&theirs) {
            // A lease of ours from before a restart: we no longer hold its log, so we must not
            // act on it. Claim above it instead.
            self.min_term = self.min_term.max(theirs.term);
            return false;
        }
        match &self.known {
            Some(k) if theirs <= *k => false,
            known => {
                let stepped_down = known.as_ref().is_some_and(|k| k.holder == self.me);
                self.known = Some(theirs);
                self.heard_at = now;
                stepped_down
            }
        }
    }

    /// Forget everything (the node left its cluster).
    pub fn clear(&mut self, now: Millis) {
        self.known = None;
        self.heard_at = Millis::ZERO;
        self.claim_not_before = now;
        self.min_term = Term(0);
    }

    /// Allow an immediate claim (a freshly created cluster has nobody to wait for).
    pub fn allow_claim_now(&mut self, now: Millis) {
        self.claim_not_before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s)
    }

    fn members(list: &[(&str, u64, bool)]) -> Vec<Candidate> {
        list.iter()
            .map(|(id, joined, eligible)| Candidate {
                id: n(id),
                joined: *joined,
                eligible: *eligible,
                reachable: *eligible,
            })
            .collect()
    }

    const L: u64 = 30_000;

    #[test]
    fn the_earliest_joined_eligible_member_claims_after_the_start_grace() {
        let ms = members(&[("a", 10, true), ("b", 5, true)]);
        let mut b = LeaseState::new(n("b"), LeaseConfig::default(), Millis(0));
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        assert_eq!(b.tick(Millis(1_000), &ms), None, "waits one lease period after start");
        assert_eq!(a.tick(Millis(L + 1), &ms), None, "a is not the candidate");
        let Some(LeaseAction::Push(lease)) = b.tick(Millis(L + 1), &ms) else { panic!("b claims") };
        assert_eq!(lease, Lease { holder: n("b"), term: Term(1) });
        assert!(matches!(a.on_push(Millis(L + 2), lease), PushVerdict::Accepted { .. }));
        assert!(a.valid(Millis(L + 2), |_| true).is_some());
    }

    #[test]
    fn the_holder_renews_every_ten_seconds_and_followers_time_it_from_receipt() {
        let ms = members(&[("a", 1, true), ("b", 2, true)]);
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        a.allow_claim_now(Millis(0));
        let Some(LeaseAction::Push(l)) = a.tick(Millis(0), &ms) else { panic!() };
        assert_eq!(a.tick(Millis(9_999), &ms), None);
        assert_eq!(a.tick(Millis(10_000), &ms), Some(LeaseAction::Push(l.clone())));
        // A follower whose wall clock is minutes off still times the lease from receipt.
        let mut b = LeaseState::new(n("b"), LeaseConfig::default(), Millis(5_000_000));
        b.on_push(Millis(5_000_000), l.clone());
        assert!(b.valid(Millis(5_000_000 + L - 1), |_| true).is_some());
        assert!(b.valid(Millis(5_000_000 + L), |_| true).is_none());
    }

    #[test]
    fn leadership_is_sticky_when_an_earlier_member_returns() {
        let mut b = LeaseState::new(n("b"), LeaseConfig::default(), Millis(0));
        b.allow_claim_now(Millis(0));
        let without_a = members(&[("a", 1, false), ("b", 2, true)]);
        assert!(b.tick(Millis(0), &without_a).is_some());
        let with_a = members(&[("a", 1, true), ("b", 2, true)]);
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        a.on_push(Millis(10), b.known().unwrap().clone());
        for t in (5_000..120_000).step_by(5_000) {
            b.tick(Millis(t), &with_a);
            assert_eq!(a.tick(Millis(t), &with_a), None, "a must not claim while b renews");
            a.on_push(Millis(t), b.known().unwrap().clone());
        }
        assert!(b.is_leader(Millis(119_000), |_| true));
    }

    #[test]
    fn two_leaders_with_the_same_term_resolve_at_once_by_holder() {
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        let mut b = LeaseState::new(n("b"), LeaseConfig::default(), Millis(0));
        a.allow_claim_now(Millis(0));
        b.allow_claim_now(Millis(0));
        let la = match a.tick(Millis(0), &members(&[("a", 1, true), ("b", 2, false)])) {
            Some(LeaseAction::Push(l)) => l,
            None => panic!(),
        };
        let lb = match b.tick(Millis(0), &members(&[("a", 1, false), ("b", 2, true)])) {
            Some(LeaseAction::Push(l)) => l,
            None => panic!(),
        };
        assert_eq!(la.term, lb.term);
        // Heal: each hears the other's push.
        assert_eq!(b.on_push(Millis(1), la.clone()), PushVerdict::Refused(lb.clone()));
        assert_eq!(a.on_push(Millis(1), lb.clone()), PushVerdict::Accepted { stepped_down: true, changed: true });
        assert!(!a.is_leader(Millis(2), |_| true));
        assert!(b.is_leader(Millis(2), |_| true));
    }

    #[test]
    fn a_node_that_knows_a_higher_term_refuses_a_lower_one() {
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        a.on_push(Millis(0), Lease { holder: n("c"), term: Term(7) });
        let low = Lease { holder: n("z"), term: Term(6) };
        assert_eq!(a.on_push(Millis(1), low), PushVerdict::Refused(Lease { holder: n("c"), term: Term(7) }));
        // Even once the known lease has lapsed, a lower term is refused; the next claim goes above it.
        assert!(matches!(a.on_push(Millis(100_000), Lease { holder: n("z"), term: Term(5) }), PushVerdict::Refused(_)));
        a.allow_claim_now(Millis(100_000));
        let Some(LeaseAction::Push(l)) = a.tick(Millis(100_000), &members(&[("a", 1, true)])) else { panic!() };
        assert_eq!(l.term, Term(8));
    }

    #[test]
    fn an_ineligible_holder_lets_its_lease_lapse_and_the_next_candidate_claims() {
        let mut a = LeaseState::new(n("a"), LeaseConfig::default(), Millis(0));
        a.allow_claim_now(Millis(0));
        let Some(LeaseAction::Push(l)) = a.tick(Millis(0), &members(&[("a", 1, true), ("b", 2, true)])) else {
            panic!()
        };
        let mut b = LeaseState::new(n("b"), LeaseConfig::default(), Millis(0));
        b.on_push(Millis(0), l);
        // a goes into maintenance: it stops renewing; b sees a ineligible and claims a higher term.
        let a_out = members(&[("a", 1, false), ("b", 2, true)]);
        assert_eq!(a.tick(Millis(10_000), &a_out), None);
        let Some(LeaseAction::Push(lb)) = b.tick(Millis(31_000), &a_out) else { panic!("b claims") };
        assert_eq!(lb, Lease { holder: n("b"), term: Term(2) });
    }
}
