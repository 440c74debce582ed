//! The background work of a node and when each piece is due (spec: cluster-runtime.md
//! "Replication", "Scrubbing"; DESIGN.md "one driver task").
//!
//! A node has a handful of chores that run again and again: the leader's planner pass, carrying
//! out what the records ask of the disks, scrubbing one copy after another at a bounded rate,
//! rescanning the volume folders, and measuring the volumes. This table owns *when*: each
//! chore's next deadline, whether it is under way (a chore never runs twice at once), a kick
//! that arrives while it runs (it runs again as soon as it ends), and how soon a kick may bring
//! a chore whose runs are spaced (the planner's). The node announces the
//! earliest deadline through `poll_timeout`; the shell carries a started chore out and reports
//! its end. Pure: time is an argument.

use crate::time::Millis;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One kind of background work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Chore {
    /// The metadata leader's replication planner pass (run inside the core).
    Plan,
    /// Delete and rename copies on this node's disks as the records ask.
    Reconcile,
    /// Re-hash the next copy due for a check.
    Scrub,
    /// Walk the volume folders and compare them with the records.
    Rescan,
    /// Measure the free and total space of this node's volumes.
    Usage,
}

impl Chore {
    pub const ALL: [Chore; 5] = [Chore::Plan, Chore::Reconcile, Chore::Scrub, Chore::Rescan, Chore::Usage];
}

/// When the first run of each chore is due after a node enters a cluster (or starts in one):
/// the planner, the reconciler and the measurement at once; the scrub after 30 s and the rescan
/// after 20 s, so a node that just started settles (catches up its records) first.
pub fn first_delay_ms(chore: Chore) -> u64 {
    match chore {
        Chore::Plan | Chore::Reconcile | Chore::Usage => 0,
        Chore::Scrub => 30_000,
        Chore::Rescan => 20_000,
    }
}

/// Deadlines of the chores; see the module doc.
#[derive(Clone, Debug, Default)]
pub struct Chores {
    due: BTreeMap<Chore, Millis>,
    running: BTreeSet<Chore>,
    kicked: BTreeSet<Chore>,
    /// The earliest a kick may bring a chore ([`Chores::space_kicks`]).
    kick_floor: BTreeMap<Chore, Millis>,
}

impl Chores {
    /// Every chore scheduled for its first run from `now` (what was under way is forgotten:
    /// the node entered a cluster or restarted).
    pub fn start(&mut self, now: Millis) {
        self.running.clear();
        self.kicked.clear();
        self.due = Chore::ALL.iter().map(|c| (*c, now.plus(first_delay_ms(*c)))).collect();
    }

    /// No chore runs (the node left its cluster).
    pub fn stop(&mut self) {
        self.due.clear();
        self.running.clear();
        self.kicked.clear();
    }

    /// The earliest deadline of a chore that is not under way.
    pub fn next_due(&self) -> Option<Millis> {
        self.due.iter().filter(|(c, _)| !self.running.contains(c)).map(|(_, d)| *d).min()
    }

    /// The chores due at `now`, in a fixed order; each is under way from now on and has no
    /// deadline until [`Chores::done`].
    pub fn take_due(&mut self, now: Millis) -> Vec<Chore> {
        let due: Vec<Chore> =
            self.due.iter().filter(|(c, d)| **d <= now && !self.running.contains(c)).map(|(c, _)| *c).collect();
        for c in &due {
            self.due.remove(c);
            self.running.insert(*c);
            self.kicked.remove(c);
        }
        due
    }

    /// `chore` ended at `now`: it is due again after `every` ms, or at once when it was kicked
    /// while it ran. A chore that was not under way keeps its deadline.
    pub fn done(&mut self, chore: Chore, now: Millis, every_ms: u64) {
        if !self.running.remove(&chore) {
            return;
        }
        let regular = now.plus(every_ms);
        let next = if self.kicked.remove(&chore) { self.kicked_at(chore, now).min(regular) } else { regular };
        self.due.insert(chore, next);
    }

    /// Kicks of `chore` bring it no earlier than `until` (its own interval still runs it
    /// then): a chore whose run costs in proportion to the records, kicked by every finished
    /// task, would otherwise run back to back.
    pub fn space_kicks(&mut self, chore: Chore, until: Millis) {
        self.kick_floor.insert(chore, until);
    }

    fn kicked_at(&self, chore: Chore, now: Millis) -> Millis {
        self.kick_floor.get(&chore).map_or(now, |f| now.max(*f))
    }

    /// Run `chore` as soon as possible: now if it is idle, right after it ends if it is under
    /// way. A node outside a cluster (no chores scheduled) ignores kicks.
    pub fn kick(&mut self, chore: Chore, now: Millis) {
        if self.running.contains(&chore) {
            self.kicked.insert(chore);
        } else if self.due.contains_key(&chore) {
            let at = self.kicked_at(chore, now);
            if let Some(d) = self.due.get_mut(&chore) {
                *d = (*d).min(at);
            }
        }
    }

    /// Whether `chore` is under way.
    pub fn is_running(&self, chore: Chore) -> bool {
        self.running.contains(&chore)
    }

    /// The deadline of `chore`, when it is scheduled and not under way.
    pub fn due_at(&self, chore: Chore) -> Option<Millis> {
        self.due.get(&chore).copied()
    }
}

/// How long the scrub rests after hashing `bytes`, so that it reads at most `rate` bytes per
/// second on average (`storage.scrub_rate`). A rate of zero or less does not limit.
pub fn scrub_rest_ms(bytes: u64, rate_per_s: f64) -> u64 {
    if rate_per_s.is_nan() || rate_per_s <= 0.0 {
        return 0;
    }
    let ms = (bytes as f64 / rate_per_s * 1000.0).ceil();
    if ms >= u64::MAX as f64 {
        u64::MAX
    } else {
        ms as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Millis {
        Millis(ms)
    }

    #[test]
    fn a_started_table_runs_each_chore_after_its_first_delay() {
        let mut c = Chores::default();
        assert_eq!(c.next_due(), None, "nothing runs outside a cluster");
        c.start(at(1_000));
        assert_eq!(c.next_due(), Some(at(1_000)));
        assert_eq!(c.take_due(at(1_000)), vec![Chore::Plan, Chore::Reconcile, Chore::Usage]);
        assert_eq!(c.next_due(), Some(at(21_000)), "the rescan is next");
        assert!(c.take_due(at(20_999)).is_empty());
        assert_eq!(c.take_due(at(31_000)), vec![Chore::Scrub, Chore::Rescan]);
        assert_eq!(c.next_due(), None, "every chore is under way");
    }

    #[test]
    fn a_chore_never_runs_twice_at_once_and_is_due_again_after_its_interval() {
        let mut c = Chores::default();
        c.start(at(0));
        c.take_due(at(0));
        assert!(c.is_running(Chore::Reconcile));
        assert!(!c.take_due(at(100_000)).contains(&Chore::Reconcile), "under way: not started again");
        c.done(Chore::Reconcile, at(500), 60_000);
        assert_eq!(c.due_at(Chore::Reconcile), Some(at(60_500)));
        assert!(!c.is_running(Chore::Reconcile));
    }

    #[test]
    fn a_kick_runs_an_idle_chore_now_and_a_running_one_again_when_it_ends() {
        let mut c = Chores::default();
        c.start(at(0));
        c.take_due(at(0));
        c.done(Chore::Plan, at(10), 10_000);
        c.kick(Chore::Plan, at(20));
        assert_eq!(c.due_at(Chore::Plan), Some(at(20)), "idle: due at once");
        c.take_due(at(20));
        c.kick(Chore::Plan, at(30));
        assert_eq!(c.next_due(), Some(at(20_000)), "under way: not due while it runs");
        c.done(Chore::Plan, at(40), 10_000);
        assert_eq!(c.due_at(Chore::Plan), Some(at(40)), "kicked while it ran: due as it ends");
        c.take_due(at(40));
        c.done(Chore::Plan, at(50), 10_000);
        assert_eq!(c.due_at(Chore::Plan), Some(at(10_050)), "the kick was used up");
    }

    #[test]
    fn spaced_kicks_bring_a_chore_no_earlier_than_its_floor() {
        let mut c = Chores::default();
        c.start(at(0));
        c.take_due(at(0));
        c.done(Chore::Plan, at(10), 60_000);
        c.space_kicks(Chore::Plan, at(1_010));
        c.kick(Chore::Plan, at(20));
        assert_eq!(c.due_at(Chore::Plan), Some(at(1_010)), "idle: due at the floor, not at once");
        c.take_due(at(1_010));
        c.space_kicks(Chore::Plan, at(2_010));
        c.kick(Chore::Plan, at(1_020));
        c.done(Chore::Plan, at(1_030), 60_000);
        assert_eq!(c.due_at(Chore::Plan), Some(at(2_010)), "kicked while it ran: due at the floor");
        c.take_due(at(2_010));
        c.done(Chore::Plan, at(2_020), 60_000);
        c.kick(Chore::Plan, at(5_000));
        assert_eq!(c.due_at(Chore::Plan), Some(at(5_000)), "past the floor: at once again");
        // The chore's own interval, shorter than the spacing, still runs it then.
        c.take_due(at(5_000));
        c.space_kicks(Chore::Plan, at(20_000));
        c.kick(Chore::Plan, at(5_010));
        c.done(Chore::Plan, at(5_020), 1_000);
        assert_eq!(c.due_at(Chore::Plan), Some(at(6_020)), "the interval comes before the floor");
        // Other chores are not spaced.
        c.take_due(at(5_000));
        c.done(Chore::Reconcile, at(0), 60_000);
        c.kick(Chore::Reconcile, at(5_001));
        assert_eq!(c.due_at(Chore::Reconcile), Some(at(5_001)));
    }

    #[test]
    fn a_late_report_of_a_chore_not_under_way_changes_nothing_and_a_stopped_table_ignores_kicks() {
        let mut c = Chores::default();
        c.start(at(0));
        c.done(Chore::Scrub, at(5), 1);
        assert_eq!(c.due_at(Chore::Scrub), Some(at(30_000)));
        c.stop();
        c.kick(Chore::Plan, at(7));
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn the_scrub_rests_in_proportion_to_what_it_read() {
        assert_eq!(scrub_rest_ms(20 * 1024 * 1024, 20.0 * 1024.0 * 1024.0), 1_000);
        assert_eq!(scrub_rest_ms(1, 1000.0), 1);
        assert_eq!(scrub_rest_ms(0, 1000.0), 0);
        assert_eq!(scrub_rest_ms(1 << 30, 0.0), 0, "no limit");
        assert_eq!(scrub_rest_ms(1 << 30, f64::NAN), 0);
        assert_eq!(scrub_rest_ms(u64::MAX, 1e-300), u64::MAX);
    }
}
