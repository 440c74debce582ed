//! The node's side of landed bytes ([`crate::storage::landed`]): the registry is node state,
//! judged against this node's records and its own monotonic clock. The shell renames bytes into
//! place under its landing lock, asking here first and noting them after.

use super::Node;
use crate::ids::VolumeId;
use crate::storage::landed::{landed_before_start, KeptFate};
use crate::time::Millis;
use serde::Serialize;

/// What to do with bytes an overwrite kept aside ([`Node::kept_actions`]); `folder` is the
/// volume's folder, `checksum` the kept bytes' content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum KeptAction {
    /// Put them back at `path` (the overwrite never took effect).
    Restore { volume: VolumeId, folder: String, path: String, checksum: String },
    /// Delete them (the records moved on).
    Drop { volume: VolumeId, folder: String, path: String, checksum: String },
}

impl Node {
    /// Bytes with `checksum` were just put in place at `path` on `volume`.
    pub fn landed_note(&mut self, wall: Millis, volume: &VolumeId, path: &str, checksum: &str) {
        let now = self.advance_clocks(wall);
        self.landed.note(volume, path, checksum, now);
    }

    /// Whether bytes found at `path` on `volume`, modified at `mtime_ms`, must be hashed and
    /// noted ([`Node::landed_found`]) before anything deletes, renames or adopts over them:
    /// nothing is noted there, and they may be bytes this node's last run landed whose record
    /// it has not seen yet ([`landed_before_start`]; `started` and `file_now` on the file
    /// system's clock). The registry is in memory; this is what a crash would otherwise forget.
    pub fn landed_unknown(
        &self,
        volume: &VolumeId,
        path: &str,
        mtime_ms: u64,
        started: Millis,
        file_now: Millis,
    ) -> bool {
        !self.landed.noted(volume, path) && landed_before_start(mtime_ms, started, file_now)
    }

    /// Bytes with `checksum`, modified at `mtime_ms` (before this start), were found at `path`
    /// on `volume`: noted as landed then, so they settle like bytes landed in this run.
    pub fn landed_found(
        &mut self,
        wall: Millis,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        mtime_ms: u64,
        file_now: Millis,
    ) {
        let now = self.advance_clocks(wall);
        self.landed.note_found(volume, path, checksum, file_now.0.saturating_sub(mtime_ms), now);
    }

    /// Their write gave up on bytes with `checksum` at `path` on `volume`: whether they were
    /// still the last bytes landed there.
    pub fn landed_forget(&mut self, volume: &VolumeId, path: &str, checksum: &str) -> bool {
        self.landed.forget(volume, path, checksum)
    }

    /// Whether bytes landed at `path` on `volume` that the records do not account for yet.
    pub fn landed_unsettled(&mut self, wall: Millis, volume: &VolumeId, path: &str) -> bool {
        let now = self.advance_clocks(wall);
        self.landed.unsettled(self.meta.state(), volume, path, now)
    }

    /// Whether bytes with `checksum`, written by someone who knew the path's content as
    /// `replaces`, must not replace what is at `path` on `volume` now: other bytes landed there
    /// that the records do not account for yet, or (`occupied`: a file is there) it is a current
    /// copy of other content the writer did not know of ([`Node::may_replace_copy`]). Of two
    /// writes of one path racing to one volume, the disk keeps the bytes of the one whose
    /// record can win, never one's record over the other's bytes.
    pub fn landed_refuses(
        &mut self,
        wall: Millis,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        replaces: Option<&str>,
        occupied: bool,
    ) -> bool {
        let now = self.advance_clocks(wall);
        if self.landed.other_unsettled(self.meta.state(), volume, path, checksum, now) {
            return true;
        }
        occupied && !self.may_replace_copy(path, volume, checksum, replaces)
    }

    /// Whether bytes landed on `volume` are unsettled (it is not retired meanwhile).
    pub fn landed_on_volume(&mut self, wall: Millis, volume: &VolumeId) -> bool {
        let now = self.advance_clocks(wall);
        self.landed.volume_unsettled(self.meta.state(), volume, now)
    }

    /// Bytes with `checksum`, the content an overwrite landed over at `path` on `volume`, are
    /// kept aside (or a rescan found them so after a restart).
    pub fn kept_note(&mut self, volume: &VolumeId, path: &str, checksum: &str) {
        self.landed.note_kept(volume, path, checksum);
    }

    /// Kept bytes were put back or dropped (or are gone from the disk).
    pub fn kept_done(&mut self, volume: &VolumeId, path: &str, checksum: &str) {
        self.landed.kept_done(volume, path, checksum);
    }

    /// Whether this node's records may be taken as the cluster's now: a metadata leader is
    /// known (this node's lease is live), every entry it knows is applied and nothing it wrote
    /// waits for the leader. A node cut off from the leader loses its lease within the lease
    /// time, long before bytes landed by a write settle by age ([`crate::storage::landed`]).
    fn records_current(&self, wall: Millis) -> bool {
        self.meta.leader(self.clock.peek(wall)).is_some() && self.meta.pending_len() == 0
    }

    /// What this node must do with the bytes overwrites kept aside on its volumes
    /// ([`crate::storage::landed::LandedBytes::kept_fate`]); kept bytes on a volume no longer
    /// this node's are forgotten by the shell when it finds them gone.
    pub fn kept_actions(&self, wall: Millis) -> Vec<KeptAction> {
        let kept: Vec<_> = self.landed.kept().cloned().collect();
        kept.into_iter().filter_map(|(volume, path, checksum)| self.kept_action(wall, volume, path, checksum)).collect()
    }

    fn kept_action(&self, wall: Millis, volume: VolumeId, path: String, checksum: String) -> Option<KeptAction> {
        let folder = self.local_volume(volume.as_str())?.subpath.clone();
        let now = self.clock.peek(wall);
        let current = self.records_current(wall);
        match self.landed.kept_fate(self.meta.state(), &volume, &path, &checksum, current, now) {
            KeptFate::Wait => None,
            KeptFate::Restore => Some(KeptAction::Restore { volume, folder, path, checksum }),
            KeptFate::Drop => Some(KeptAction::Drop { volume, folder, path, checksum }),
        }
    }

    /// Whether `action` (from [`Node::kept_actions`]) is still what the records ask for, now:
    /// asked again under the landing lock just before it is carried out.
    pub fn kept_action_holds(&self, wall: Millis, action: &KeptAction) -> bool {
        let (KeptAction::Restore { volume, path, checksum, .. } | KeptAction::Drop { volume, path, checksum, .. }) =
            action;
        self.kept_action(wall, volume.clone(), path.clone(), checksum.clone()).as_ref() == Some(action)
    }

    /// Kept bytes were put back at `path` on `volume` and now hash to `hashed`: forgotten, and
    /// published as a current copy again when they are the live file's content and the records
    /// took this volume's copy for stale meanwhile (a rescan or a get found the overwrite's
    /// bytes there). Whether a copy was published.
    pub fn kept_restored(&mut self, wall: Millis, volume: &VolumeId, path: &str, checksum: &str, hashed: &str) -> bool {
        self.landed.kept_done(volume, path, checksum);
        let Some(f) = self.live_file(path).cloned() else { return false };
        if !f.checksum.eq_ignore_ascii_case(hashed) {
            return false;
        }
        if f.locations.iter().any(|l| &l.volume_id == volume && f.is_current(l)) {
            return false;
        }
        self.copy_publish(wall, path, &f.id, hashed, volume)
    }
}
