//! The node's side of landed bytes ([`crate::storage::landed`]): the registry is node state,
//! judged against this node's records and its own monotonic clock. The shell renames bytes into
//! place under its landing lock, asking here first and noting them after.

use super::Node;
use crate::ids::VolumeId;
use crate::storage::landed::landed_before_start;
use crate::time::Millis;

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
}
