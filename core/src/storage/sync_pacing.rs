//! Whether a volume's fsyncs may share one flush now (cluster-runtime.md "Storage": a copy counts
//! once its bytes are on disk; README "Transfer"). The shell's `disk::sync::GroupSync` makes the
//! copies written at the same time durable with one `syncfs` of the volume's file system; this
//! is the rule that tells it when not to.
//!
//! A `syncfs` also writes whatever else is dirty on that file system: on a disk shared with a
//! large copy, one round could wait for gigabytes that are not shoal's. A round of several files
//! that takes over [`SLOW_ROUND_US`] and over [`SLOW_FACTOR`] times a lone fsync (averaged)
//! therefore turns grouping off for [`ALONE_FOR_MS`]: each file is fsynced on its own meanwhile,
//! and the next round after that tries again. A shared flush that failed turns grouping off for
//! good (each file is then told of its own errors by its own fsync).
//!
//! Pure: the shell hands in how long each flush took (it times its own syscalls) and `now`.

use crate::time::Millis;

/// A round of several files slower than this (and than [`SLOW_FACTOR`] lone fsyncs), in
/// microseconds, flushed more than shoal's writes: grouping stops for a while.
pub const SLOW_ROUND_US: u64 = 100_000;
/// How many lone fsyncs a slow round must exceed as well.
pub const SLOW_FACTOR: u64 = 4;
/// How long each file is fsynced on its own after a slow round.
pub const ALONE_FOR_MS: u64 = 10_000;

/// What lone fsyncs cost on one volume, and until when its files are fsynced alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPacing {
    /// A lone fsync's time in microseconds, averaged (each new one weighs 1/8).
    lone_us: Option<u64>,
    /// Files are fsynced on their own until then.
    alone_until: Option<Millis>,
    /// A shared flush failed: files are fsynced on their own for good.
    failed: bool,
}

impl SyncPacing {
    /// May the file that asks at `now` wait for a shared flush?
    pub fn grouping(&self, now: Millis) -> bool {
        !self.failed && self.alone_until.is_none_or(|until| now >= until)
    }

    /// A flush of `files` files took `took_us` microseconds, ending at `now`. True when it turned
    /// grouping off (a slow round).
    pub fn took(&mut self, files: usize, took_us: u64, now: Millis) -> bool {
        if files <= 1 {
            self.lone_us = Some(match self.lone_us {
                None => took_us,
                Some(avg) => avg.saturating_mul(7).saturating_add(took_us) / 8,
            });
            return false;
        }
        let slow =
            took_us > SLOW_ROUND_US && self.lone_us.is_none_or(|lone| took_us > lone.saturating_mul(SLOW_FACTOR));
        if slow {
            self.alone_until = Some(now.plus(ALONE_FOR_MS));
        }
        slow
    }

    /// A shared flush failed: no more grouping on this volume.
    pub fn flush_failed(&mut self) {
        self.failed = true;
    }

    /// A lone fsync's averaged time, microseconds (none measured yet: `None`).
    pub fn lone_us(&self) -> Option<u64> {
        self.lone_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    #[test]
    fn a_slow_round_of_several_files_turns_grouping_off_for_a_while() {
        let t0 = Millis(1_000_000);
        let mut p = SyncPacing::default();
        assert!(p.grouping(t0));
        assert!(!p.took(1, 5 * MS, t0));
        assert!(!p.took(3, 15 * MS, t0));
        assert!(p.grouping(t0), "a fast round keeps grouping");
        assert!(p.took(3, 150 * MS, t0), "30 lone fsyncs' time for 3 files: something else was flushed");
        assert!(!p.grouping(t0.plus(1)));
        assert!(!p.grouping(t0.plus(ALONE_FOR_MS - 1)));
        assert!(p.grouping(t0.plus(ALONE_FOR_MS)), "tried again after a while");
    }

    #[test]
    fn a_round_is_slow_only_beside_the_lone_fsyncs_of_the_same_disk() {
        let t0 = Millis(0);
        let mut slow_disk = SyncPacing::default();
        slow_disk.took(1, 60 * MS, t0);
        assert!(!slow_disk.took(8, 180 * MS, t0), "on a slow disk a round of 3 lone fsyncs' time is fine");
        assert!(slow_disk.grouping(t0));
        slow_disk.took(1, 30 * MS, t0);
        assert_eq!(slow_disk.lone_us(), Some(56_250), "averaged, each new one weighing 1/8");
        assert!(!slow_disk.took(2, 99 * MS, t0), "under the slow-round floor whatever the lone fsyncs cost");
        let mut fresh = SyncPacing::default();
        assert!(fresh.took(2, 101 * MS, t0), "with no lone fsync measured yet, the floor alone decides");
    }

    #[test]
    fn a_failed_shared_flush_stops_grouping_for_good() {
        let mut p = SyncPacing::default();
        p.flush_failed();
        assert!(!p.grouping(Millis(0)));
        assert!(!p.grouping(Millis(u64::MAX)));
    }
}
