//! The node's background work, driven by its one timer (DESIGN.md "one driver task"; spec:
//! "Replication", "Scrubbing"). [`Chores`] says when each chore is due; this module runs the
//! ones that are pure decisions (the leader's planner pass, which copy the scrub checks next and
//! how long it then rests) and asks the shell for the ones that are I/O
//! ([`Output::Chore`], [`Output::ScrubCopy`], [`Output::ReplDispatch`]). The shell reports each
//! end ([`Node::chore_done`], [`Node::scrub_result`]) and the next deadline is announced through
//! `poll_timeout`.

use super::files::LocalCopy;
use super::{Node, Output};
use crate::meta::records::LocationState;
use crate::meta::state::MetaState;
use crate::storage::chores::{scrub_rest_ms, Chore};
use crate::storage::planner::{self, PlanInput, PlanStats, PlannerConfig, TaskOutcome};
use crate::time::Millis;
use serde::Serialize;

/// How often the leader plans when `replication.plan_every` is not set.
pub const PLAN_EVERY_MS: u64 = 60_000;
/// How often a node that is not the leader looks whether it has become it.
pub const PLAN_FOLLOWER_EVERY_MS: u64 = 5_000;
/// How often the records' disk work is carried out when `storage.reconcile_every` is not set.
pub const RECONCILE_EVERY_MS: u64 = 10_000;
/// How often the volume folders are rescanned when `storage.rescan_every` is not set.
pub const RESCAN_EVERY_MS: u64 = 30 * 60_000;
/// How often volumes are measured when `storage.usage_every` is not set.
pub const USAGE_EVERY_MS: u64 = 60_000;
/// Bytes per second the scrub reads on average when `storage.scrub_rate` is not set.
pub const SCRUB_RATE_DEFAULT: f64 = 20.0 * 1024.0 * 1024.0;
/// How long a copy goes unchecked before the scrub re-hashes it, when `storage.scrub_min_age`
/// is not set.
pub const SCRUB_MIN_AGE_DEFAULT_MS: u64 = 24 * 3_600_000;

/// How long after a move the scrub reads its copy's missing bytes as a rename still to run
/// (the reconciler renames within a minute unless the rename is held).
pub const RENAME_GRACE_MS: u64 = 10 * 60_000;
/// How long the scrub rests when no copy is due, and after each batch.
pub const SCRUB_IDLE_MS: u64 = 60_000;
/// The shortest interval a config key can give a chore (zero would run it back to back).
pub const CHORE_EVERY_MIN_MS: u64 = 1_000;

/// The planner's cost per record it walks is ~0.5–1 µs (`cargo bench --bench planner`); a pass
/// brought by a kick (every finished task, stale copy or short put kicks one) starts no sooner
/// than this many µs per record after the last began, so kicked passes take at most a tenth or
/// so of the leader's time (200,000 records: 1 s apart; small clusters: at once).
pub const PLAN_KICK_GAP_US_PER_RECORD: u64 = 5;
/// The most a kicked pass waits for the spacing.
pub const PLAN_KICK_GAP_MAX_MS: u64 = 5_000;

/// How long after a planner pass began a kick may start the next, for `records` records.
pub fn plan_kick_gap_ms(records: usize) -> u64 {
    (records as u64).saturating_mul(PLAN_KICK_GAP_US_PER_RECORD).div_ceil(1000).min(PLAN_KICK_GAP_MAX_MS)
}
/// The most copies the scrub takes from one look at the records.
const SCRUB_BATCH: usize = 1000;

/// What the replication and scrub chores did on this node since it started (`repl status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplStats {
    pub passes: u64,
    pub dispatched: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Tasks a busy target refused for now (not counted as failures).
    pub deferred: u64,
    pub expired: u64,
    /// Tasks handed out from the backlog as others ended (no full pass): counted in
    /// `dispatched` too.
    pub backlog_dispatched: u64,
    pub scrubbed_copies: u64,
    pub scrubbed_bytes: u64,
    pub scrub_mismatches: u64,
    pub last_plan: Option<PlanStats>,
}

impl Node {
    /// From `handle_timeout`: start every chore that is due.
    pub(super) fn chores_timeout(&mut self, wall: Millis, now: Millis) {
        for chore in self.chores.take_due(now) {
            match chore {
                Chore::Plan => {
                    let every = match self.leader_term(wall) {
                        Some(term) => {
                            self.plan_pass(wall, term);
                            self.chores.space_kicks(Chore::Plan, now.plus(plan_kick_gap_ms(self.meta.state().len())));
                            self.config_number("replication", "plan_every")
                                .map_or(PLAN_EVERY_MS, |v| (v as u64).max(CHORE_EVERY_MIN_MS))
                        }
                        None => PLAN_FOLLOWER_EVERY_MS,
                    };
                    self.chores.done(Chore::Plan, now, every);
                }
                Chore::Scrub => self.scrub_next(wall, now),
                Chore::Reconcile | Chore::Rescan | Chore::Usage => self.push_output(Output::Chore(chore)),
            }
        }
    }

    /// The shell finished a chore it was asked for ([`Output::Chore`]); it is due again after
    /// its interval (a config key), or at once when it was kicked meanwhile.
    pub fn chore_done(&mut self, wall: Millis, chore: Chore) {
        let now = self.advance_clocks(wall);
        let every = |key: &str, default: u64| {
            self.config_number("storage", key).map_or(default, |v| (v.max(0.0) as u64).max(CHORE_EVERY_MIN_MS))
        };
        let every = match chore {
            Chore::Reconcile => every("reconcile_every", RECONCILE_EVERY_MS),
            Chore::Rescan => every("rescan_every", RESCAN_EVERY_MS),
            Chore::Usage => every("usage_every", USAGE_EVERY_MS),
            Chore::Plan => return,
            Chore::Scrub => SCRUB_IDLE_MS,
        };
        self.chores.done(chore, now, every);
    }

    /// Run `chore` as soon as it can (a planner pass after a put left copies missing, the disk
    /// work after a remove, a scrub asked for by an operator).
    pub fn chore_kick(&mut self, wall: Millis, chore: Chore) {
        let now = self.advance_clocks(wall);
        self.chores.kick(chore, now);
    }

    /// When `chore` is due next (`None` while it runs, or outside a cluster).
    pub fn chore_due(&self, chore: Chore) -> Option<Millis> {
        self.chores.due_at(chore).map(|m| self.clock.to_wall(m))
    }

    /// What replication and scrubbing did here.
    pub fn repl_stats(&self) -> &ReplStats {
        &self.repl_stats
    }

    pub(super) fn repl_count(&mut self, outcome: TaskOutcome) {
        match outcome {
            TaskOutcome::Succeeded => self.repl_stats.succeeded += 1,
            TaskOutcome::Failed => self.repl_stats.failed += 1,
            TaskOutcome::Deferred => self.repl_stats.deferred += 1,
        }
    }

    /// Leader: one planner pass over every file record. Its tasks go out ([`Node::carry_out`]);
    /// the files it left for the task limits become the backlog.
    fn plan_pass(&mut self, wall: Millis, term: u64) {
        self.gather_latency(wall);
        let mut plan = self.with_plan_input(wall, planner::plan);
        self.repl_stats.passes += 1;
        self.repl_stats.last_plan = Some(plan.stats.clone());
        self.repl_backlog = std::mem::take(&mut plan.backlog).into();
        self.carry_out(wall, term, plan);
    }

    /// Leader: a task ended well (its slot is free): the backlog's files are planned again,
    /// without a pass over every record, and the tasks that fit now go out. A full pass, still
    /// kicked by the task's end, follows up on the file itself once its spacing allows; until
    /// then the backlog keeps a repair of many files going at the pace its tasks end. A task
    /// that failed or was deferred hands out nothing here (an unreachable or busy target would
    /// otherwise drain the backlog into failures at the network's pace); the next pass does.
    pub(super) fn dispatch_backlog(&mut self, wall: Millis, ended: TaskOutcome) {
        if self.repl_backlog.is_empty() || ended != TaskOutcome::Succeeded {
            return;
        }
        let Some(term) = self.leader_term(wall) else {
            self.repl_backlog.clear();
            return;
        };
        let mut backlog = std::mem::take(&mut self.repl_backlog);
        let plan =
            self.with_plan_input(wall, |state, input, cfg| planner::plan_backlog(state, &mut backlog, input, cfg));
        self.repl_backlog = backlog;
        self.repl_stats.backlog_dispatched += plan.tasks.len() as u64;
        self.carry_out(wall, term, plan);
    }

    /// What the planner reads, as this leader knows it now (the members, the tasks in flight,
    /// the files' backoffs, the scorer's inputs, the config), handed to `plan`.
    fn with_plan_input<R>(
        &self,
        wall: Millis,
        plan: impl FnOnce(&MetaState, &PlanInput<'_>, &PlannerConfig) -> R,
    ) -> R {
        let (nodes, in_flight, backoff) = (self.planner_nodes(wall), self.repl_in_flight(), self.repl_backoffs());
        let scoring = self.planner_scoring(wall);
        let input =
            PlanInput { now_ms: wall.0, nodes: &nodes, in_flight: &in_flight, backoff: &backoff, scoring: &scoring };
        plan(self.meta.state(), &input, &self.planner_config())
    }

    /// Leader: what a plan decided is done. Copies to re-label are marked, and each task is
    /// granted its lease and handed to the shell to send ([`Output::ReplDispatch`]).
    fn carry_out(&mut self, wall: Millis, term: u64, plan: planner::Plan) {
        for c in &plan.mark_stale {
            if let Some(f) = self.meta.state().file(&c.path).cloned() {
                self.copy_mark(wall, &c.path, &c.volume, LocationState::Stale, &f.checksum);
            }
        }
        for c in &plan.forget {
            self.copy_mark(wall, &c.path, &c.volume, LocationState::Dropped, "");
        }
        for task in plan.tasks {
            self.repl_grant(wall, task.clone());
            self.repl_stats.dispatched += 1;
            self.push_output(Output::ReplDispatch { term, task });
        }
    }

    /// The scrub's next step: hand the shell the next copy due for a check, or rest when none
    /// is.
    fn scrub_next(&mut self, wall: Millis, now: Millis) {
        if self.scrub_pending.is_empty() {
            let min_age =
                self.config_number("storage", "scrub_min_age").map_or(SCRUB_MIN_AGE_DEFAULT_MS, |v| v.max(0.0) as u64);
            self.scrub_pending = self.scrub_queue(wall, min_age).into_iter().take(SCRUB_BATCH).collect();
        }
        match self.scrub_pending.pop_front() {
            Some(copy) => self.push_output(Output::ScrubCopy(copy)),
            None => self.chores.done(Chore::Scrub, now, SCRUB_IDLE_MS),
        }
    }

    /// The shell hashed `copy` (`None`: it could not be read). The copy is marked verified or
    /// stale (a stale one gets a planner pass to repair it), and the scrub rests long enough
    /// to keep its average read rate at `storage.scrub_rate`. Returns whether the copy matched.
    pub fn scrub_result(&mut self, wall: Millis, copy: &LocalCopy, hashed: Option<(u64, String)>) -> bool {
        let now = self.advance_clocks(wall);
        let ok = matches!(&hashed, Some((size, sum)) if *size == copy.size && *sum == copy.checksum);
        let read = hashed.as_ref().map_or(0, |h| h.0);
        // A copy just moved here whose rename has not run yet is not missing: it is still at
        // the old path. The rename waits for the leader to take the move, for the records to
        // settle ([`crate::meta::machine::Meta::records_settling`]), for bytes an overwrite
        // kept aside at the old path to go back first (at the latest once the bytes landed
        // over them settle, 10 minutes after they landed or after a restart found them: seed
        // 6396 marked a moved file's only copy stale while its rename waited so, and the file
        // had no current copy once it ran), or for the reconciler's next pass (one whose old
        // path holds nothing is dropped by that pass, and a miss after it counts). Past
        // [`RENAME_GRACE_MS`] without such a hold, a rename that keeps failing no longer hides
        // a missing copy.
        let unread_move = hashed.is_none()
            && self.copy_moved_at(&copy.path, &copy.volume).is_some_and(|at| {
                self.meta.awaiting_leader(&copy.path)
                    || self.meta.records_settling()
                    || self.copy_move_waits_for_kept(&copy.path, &copy.volume)
                    || wall.0.saturating_sub(at) < RENAME_GRACE_MS
            });
        self.repl_stats.scrubbed_copies += 1;
        self.repl_stats.scrubbed_bytes += read;
        let state = if ok { LocationState::Verified } else { LocationState::Stale };
        let before = self
            .meta
            .state()
            .file(&copy.path)
            .and_then(|f| f.locations.iter().find(|l| l.volume_id == copy.volume).map(|l| l.state));
        if !unread_move {
            self.copy_mark(wall, &copy.path, &copy.volume, state, &copy.checksum);
        }
        if before != Some(state) && !unread_move {
            // An event when a copy's state changes, not for every re-check of a good copy.
            let kind = if ok { "replica.verified" } else { "replica.stale" };
            let data = serde_json::json!({"path": copy.path, "volume": copy.volume, "node": self.id});
            self.raise(wall, kind, data);
        }
        if !ok && !unread_move {
            self.repl_stats.scrub_mismatches += 1;
            self.chores.kick(Chore::Plan, now);
        }
        let rate = self.config_number("storage", "scrub_rate").unwrap_or(SCRUB_RATE_DEFAULT);
        let mut rest = scrub_rest_ms(read, rate);
        if self.scrub_pending.is_empty() {
            // A batch is through: rest before looking at the records again.
            rest = rest.max(SCRUB_IDLE_MS);
        }
        self.chores.done(Chore::Scrub, now, rest);
        ok || unread_move
    }
}
