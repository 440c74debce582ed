//! Hybrid logical clock versions (DESIGN.md "Versions and merge").
//!
//! A [`Version`] is `(wall_ms, counter, node)`, compared in that order, so it is a total
//! order: two different writers never produce equal versions, and last-writer-wins has a
//! deterministic tie-break. An [`Hlc`] hands out versions that are strictly increasing on one
//! node and that jump past every version the node has seen from a peer, so a write made after
//! seeing another write always wins over it, whatever the two wall clocks say. A node whose
//! clock runs ahead can therefore win only until the others have heard from it.

use crate::ids::NodeId;
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub wall_ms: u64,
    pub counter: u32,
    pub node: NodeId,
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.wall_ms, self.counter, &self.node).cmp(&(other.wall_ms, other.counter, &other.node))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}@{}", self.wall_ms, self.counter, self.node)
    }
}

/// The clock state of one node. Monotonic: every `next` is greater than every version this
/// node handed out or observed before.
/// How far ahead of this node's physical clock a peer's version may be and still be taken:
/// the largest peer clock offset allowed (10 min) plus the request window (5 min).
pub const AHEAD_MAX_MS: u64 = 15 * 60_000;

#[derive(Clone, Debug)]
pub struct Hlc {
    node: NodeId,
    wall_ms: u64,
    counter: u32,
    /// The latest physical (wall) time this node was handed; 0 until then.
    physical_ms: u64,
}

impl Hlc {
    pub fn new(node: NodeId) -> Hlc {
        Hlc { node, wall_ms: 0, counter: 0, physical_ms: 0 }
    }

    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// Note the node's physical time (versions too far ahead of it are refused).
    pub fn set_physical(&mut self, now: Millis) {
        self.physical_ms = self.physical_ms.max(now.0);
    }

    /// Whether a peer's version is believable: not more than [`AHEAD_MAX_MS`] ahead of this
    /// node's clock. A version from the far future would pin every clock and win every merge
    /// for ever, so records carrying one are refused.
    pub fn acceptable(&self, v: &Version) -> bool {
        self.physical_ms == 0 || v.wall_ms <= self.physical_ms.saturating_add(AHEAD_MAX_MS)
    }

    /// A new version for a local write at `now`.
    pub fn next(&mut self, now: Millis) -> Version {
        self.set_physical(now);
        if now.0 > self.wall_ms {
            self.wall_ms = now.0;
            self.counter = 0;
        } else if self.counter == u32::MAX {
            // Counter exhausted: move the logical wall forward by one ms instead of wrapping.
            self.wall_ms = self.wall_ms.saturating_add(1);
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        Version { wall_ms: self.wall_ms, counter: self.counter, node: self.node.clone() }
    }

    /// Advance past a version seen from a peer (ignored when not [`Hlc::acceptable`]).
    pub fn observe(&mut self, v: &Version) {
        if !self.acceptable(v) {
            return;
        }
        match v.wall_ms.cmp(&self.wall_ms) {
            Ordering::Greater => {
                self.wall_ms = v.wall_ms;
                self.counter = v.counter;
            }
            Ordering::Equal => self.counter = self.counter.max(v.counter),
            Ordering::Less => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s)
    }

    #[test]
    fn a_version_from_the_far_future_is_not_believed() {
        let mut clock = Hlc::new(n("me"));
        clock.set_physical(Millis(1_000_000));
        let poison = Version { wall_ms: u64::MAX, counter: u32::MAX, node: n("evil") };
        assert!(!clock.acceptable(&poison));
        clock.observe(&poison);
        assert!(clock.next(Millis(1_000_001)).wall_ms < 2_000_000);
        let ahead = Version { wall_ms: 1_000_000 + AHEAD_MAX_MS, counter: 0, node: n("fast") };
        assert!(clock.acceptable(&ahead));
    }

    #[test]
    fn equal_timestamps_are_ordered_by_node() {
        let a = Version { wall_ms: 5, counter: 0, node: n("a") };
        let b = Version { wall_ms: 5, counter: 0, node: n("b") };
        assert!(a < b);
        assert_ne!(a, b);
    }

    #[test]
    fn a_write_after_seeing_a_clock_ahead_wins() {
        let mut ahead = Hlc::new(n("ahead"));
        let mut behind = Hlc::new(n("behind"));
        let v_ahead = ahead.next(Millis(1_000_000 + 240_000));
        behind.observe(&v_ahead);
        let v_behind = behind.next(Millis(1_000_000));
        assert!(v_behind > v_ahead);
    }

    proptest! {
        #[test]
        fn versions_are_strictly_monotonic(steps in proptest::collection::vec((0u64..10_000, any::<bool>(), 0u64..20_000, 0u32..5), 1..200)) {
            let mut clock = Hlc::new(n("me"));
            let mut last: Option<Version> = None;
            for (now, observe, peer_ms, peer_ctr) in steps {
                if observe {
                    let seen = Version { wall_ms: peer_ms, counter: peer_ctr, node: n("peer") };
                    clock.observe(&seen);
                    let v = clock.next(Millis(now));
                    prop_assert!(v > seen);
                    if let Some(l) = &last { prop_assert!(&v > l); }
                    last = Some(v);
                } else {
                    let v = clock.next(Millis(now));
                    prop_assert!(v.wall_ms >= now);
                    if let Some(l) = &last { prop_assert!(&v > l); }
                    last = Some(v);
                }
            }
        }

        #[test]
        fn version_order_is_total_and_antisymmetric(a in (0u64..5, 0u32..3, "[ab]"), b in (0u64..5, 0u32..3, "[ab]")) {
            let va = Version { wall_ms: a.0, counter: a.1, node: NodeId(a.2) };
            let vb = Version { wall_ms: b.0, counter: b.1, node: NodeId(b.2) };
            match va.cmp(&vb) {
                Ordering::Equal => prop_assert_eq!(&va, &vb),
                Ordering::Less => prop_assert_eq!(vb.cmp(&va), Ordering::Greater),
                Ordering::Greater => prop_assert_eq!(vb.cmp(&va), Ordering::Less),
            }
        }
    }
}
