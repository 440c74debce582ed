//! Bytes put in place that the records may not account for yet (spec: "Storage (ACS) and the
//! cluster:/ drive"; the same-volume race of issue 4). A put's commit lands its bytes before
//! its record arrives; a pull lands a copy before the copy is published. While such bytes are
//! **unsettled**, nothing deletes or renames over them, and no other write of the same path
//! lands over them: a removal or move decided from records older than those bytes would
//! destroy the newer write.
//!
//! Bytes settle when a record accounts for them (a live record lists a copy with their checksum
//! on that volume, or a removal of that very content came after them), when their writer gives
//! up on them ([`LandedBytes::forget`]), or after [`LANDED_MAX_MS`]. The shell renames the bytes
//! into place under its own landing lock and notes them here; the rules are this module's.
//!
//! The registry lives in memory, so a crash forgets it. Bytes found at a path with no note that
//! were last modified before this process started and less than [`LANDED_MAX_MS`] ago
//! ([`landed_before_start`]) may be bytes the last run landed whose record this node has not seen
//! yet: the shell hashes them and notes them as landed at their mtime
//! ([`LandedBytes::note_found`]) before anything deletes, renames or adopts over them. Without
//! that, a stale removal or a drop decided from older records could delete the bytes of a newer
//! put that landed just before the crash.
//!
//! **Kept bytes.** An overwrite lands its bytes over the path's current copy before its record
//! is published. So that a put whose record never comes (its publish failed, or its node died
//! first) does not destroy the acknowledged content it was replacing, the shell links the old
//! bytes to a kept name first ([`crate::storage::transfer::kept_file_name`]) and notes them here
//! ([`LandedBytes::note_kept`]). What becomes of them is [`LandedBytes::kept_fate`]: once the
//! new bytes are settled and this node's records are current, they are put back when the
//! records still name their content as the path's, with a copy on that volume (the overwrite
//! never took effect), and dropped otherwise (a newer record took over, or the file went).

use crate::ids::VolumeId;
use crate::meta::path::normalize;
use crate::meta::records::{FileRecord, LocationState};
use crate::meta::state::MetaState;
use crate::time::Millis;
use std::collections::{BTreeMap, BTreeSet};

/// How long landed bytes stay protected at most, waiting for their record.
pub const LANDED_MAX_MS: u64 = 10 * 60_000;

/// Whether bytes found with no note, last modified at `mtime_ms`, may be bytes this node's last
/// run landed that the records do not account for yet: modified before this process started at
/// `started`, and less than [`LANDED_MAX_MS`] before `now` (older ones would have settled by
/// now anyway). All three are on the clock that stamps the files' mtimes, the file system's.
pub fn landed_before_start(mtime_ms: u64, started: Millis, now: Millis) -> bool {
    mtime_ms <= started.0 && mtime_ms.saturating_add(LANDED_MAX_MS) >= now.0
}

/// The last bytes landed at each (volume, path): their checksum and when; and the bytes set
/// aside by overwrites, not yet put back or dropped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LandedBytes {
    entries: BTreeMap<(VolumeId, String), (String, Millis)>,
    /// (volume, path, checksum) of bytes kept aside under a kept name.
    kept: BTreeSet<(VolumeId, String, String)>,
    /// The paths whose bytes from before this start were found and noted
    /// ([`LandedBytes::note_found`]): once that note ages out they are settled, whatever the
    /// file system's clock says (one behind this node's, as a network file system's or the
    /// simulator's may be, made them look fresh again, noted again every ten minutes, and
    /// a repair of that path was refused as busy for ever).
    found: BTreeSet<(VolumeId, String)>,
    /// When the notes older than [`LANDED_MAX_MS`] are next swept out: a note is otherwise
    /// dropped only when someone asks about its path again, and most paths are never asked
    /// about again (one note per put, kept for the node's lifetime).
    next_sweep: Millis,
}

/// What becomes of bytes an overwrite kept aside ([`LandedBytes::kept_fate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeptFate {
    /// Not yet: the bytes landed over them are unsettled, or this node's records may lag.
    Wait,
    /// The records still name their content at the path, with a copy on the volume: the
    /// overwrite never took effect, and they go back in place. Or a move's tombstone there
    /// names them as the copy its rename carries to the new path (the overwrite, refused, or
    /// lost to the move, never reached the records): they go back so the rename takes them,
    /// not the bytes landed over them ([`moved_copy`]).
    Restore,
    /// The records moved on (a newer content, a removal, a move): they go.
    Drop,
}

fn key(volume: &VolumeId, path: &str) -> (VolumeId, String) {
    (volume.clone(), normalize(path).unwrap_or_else(|_| path.to_string()))
}

impl LandedBytes {
    /// Bytes with `checksum` were just put in place at `path` on `volume`.
    pub fn note(&mut self, volume: &VolumeId, path: &str, checksum: &str, now: Millis) {
        self.sweep(now);
        self.entries.insert(key(volume, path), (checksum.to_ascii_lowercase(), now));
    }

    /// Drop the notes past [`LANDED_MAX_MS`] (settled by age whatever the records say), at
    /// most once per that window: the registry holds about one window's landings.
    fn sweep(&mut self, now: Millis) {
        if now < self.next_sweep {
            return;
        }
        self.entries.retain(|_, (_, at)| now.since(*at) <= LANDED_MAX_MS);
        self.next_sweep = now.plus(LANDED_MAX_MS);
    }

    /// How many landings are noted.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes with `checksum` found at `path` on `volume`, landed `age_ms` before `now` by this
    /// node's last run ([`landed_before_start`]): noted as landed then, unless bytes landed
    /// there since are noted already (they are newer).
    pub fn note_found(&mut self, volume: &VolumeId, path: &str, checksum: &str, age_ms: u64, now: Millis) {
        let at = Millis(now.0.saturating_sub(age_ms));
        let k = key(volume, path);
        self.found.insert(k.clone());
        self.entries.entry(k).or_insert_with(|| (checksum.to_ascii_lowercase(), at));
    }

    /// Whether bytes landed at `path` on `volume` are noted (settled ones are dropped as found),
    /// or bytes from before this start were found there once already.
    pub fn noted(&self, volume: &VolumeId, path: &str) -> bool {
        let k = key(volume, path);
        self.entries.contains_key(&k) || self.found.contains(&k)
    }

    /// Forget bytes with `checksum` at `path` on `volume` (their write gave up), so they hold
    /// no other write back. Whether they were still the last bytes landed there.
    pub fn forget(&mut self, volume: &VolumeId, path: &str, checksum: &str) -> bool {
        let k = key(volume, path);
        let ours = self.entries.get(&k).is_some_and(|(sum, _)| sum.eq_ignore_ascii_case(checksum));
        if ours {
            self.entries.remove(&k);
        }
        ours
    }

    /// Bytes with `checksum`, the path's content an overwrite landed over, are kept aside at
    /// `path` on `volume` (found again by a rescan after a restart, too).
    pub fn note_kept(&mut self, volume: &VolumeId, path: &str, checksum: &str) {
        let (v, p) = key(volume, path);
        self.kept.insert((v, p, checksum.to_ascii_lowercase()));
    }

    /// Bytes kept aside, put back or dropped: forgotten.
    pub fn kept_done(&mut self, volume: &VolumeId, path: &str, checksum: &str) {
        let (v, p) = key(volume, path);
        self.kept.remove(&(v, p, checksum.to_ascii_lowercase()));
    }

    /// Every (volume, path, checksum) kept aside.
    pub fn kept(&self) -> impl Iterator<Item = &(VolumeId, String, String)> {
        self.kept.iter()
    }

    /// Whether bytes with `checksum` are kept aside at `path` on `volume`.
    pub fn keeps(&self, volume: &VolumeId, path: &str, checksum: &str) -> bool {
        let (v, p) = key(volume, path);
        self.kept.contains(&(v, p, checksum.to_ascii_lowercase()))
    }

    /// What becomes of the bytes with `checksum` kept aside at `path` on `volume`, given this
    /// node's records `state` and whether they are `current` (a leader known, nothing of this
    /// node's waiting for it, every entry applied): while they may lag, nothing is decided, as
    /// a node cut off since the overwrite landed would otherwise put the old bytes back over a
    /// published write it has not heard of. Nothing either while the bytes landed over them
    /// are unsettled (their record may be on its way).
    pub fn kept_fate(
        &self,
        state: &MetaState,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        current: bool,
        now: Millis,
    ) -> KeptFate {
        if !current || self.unsettled_at(state, volume, path, now) {
            return KeptFate::Wait;
        }
        let (_, p) = key(volume, path);
        let named = state.file(&p).is_some_and(|f| {
            !f.is_dir
                && ((!f.removed && f.checksum.eq_ignore_ascii_case(checksum) && lists_copy(f, volume, checksum))
                    || moved_copy(state, f, volume, checksum))
        });
        if named {
            KeptFate::Restore
        } else {
            KeptFate::Drop
        }
    }

    /// [`LandedBytes::unsettled`] without dropping what it finds settled.
    fn unsettled_at(&self, state: &MetaState, volume: &VolumeId, path: &str, now: Millis) -> bool {
        let k = key(volume, path);
        let Some((sum, at)) = self.entries.get(&k) else { return false };
        !accounts_for(state, volume, &k.1, sum) && now.since(*at) <= LANDED_MAX_MS
    }

    /// Whether bytes landed at `path` on `volume` that `state` does not account for yet. Bytes
    /// found settled are dropped from the registry.
    pub fn unsettled(&mut self, state: &MetaState, volume: &VolumeId, path: &str, now: Millis) -> bool {
        let k = key(volume, path);
        let Some((sum, at)) = self.entries.get(&k).cloned() else { return false };
        if accounts_for(state, volume, &k.1, &sum) || now.since(at) > LANDED_MAX_MS {
            self.entries.remove(&k);
            return false;
        }
        true
    }

    /// Whether bytes other than `checksum` landed at `path` on `volume` and are unsettled.
    pub fn other_unsettled(
        &mut self,
        state: &MetaState,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        now: Millis,
    ) -> bool {
        let other = self.entries.get(&key(volume, path)).is_some_and(|(sum, _)| !sum.eq_ignore_ascii_case(checksum));
        other && self.unsettled(state, volume, path, now)
    }

    /// Whether any bytes landed on `volume` are unsettled (it is not retired meanwhile).
    pub fn volume_unsettled(&mut self, state: &MetaState, volume: &VolumeId, now: Millis) -> bool {
        let paths: Vec<String> = self.entries.keys().filter(|(v, _)| v == volume).map(|(_, p)| p.clone()).collect();
        paths.iter().any(|p| self.unsettled(state, volume, p, now))
    }
}

/// Whether `state` accounts for bytes with `sum` at the normalised `path` on `volume`: a live
/// record with this copy, or a removal of that very content (written after the bytes: a later
/// remove knows of them), or a move that renames them: the tombstone lists this copy with
/// this content and so does the moved file's record at its new path (an overwrite the leader
/// carried along a move it raced: [`crate::meta::machine::Meta`]).
fn accounts_for(state: &MetaState, volume: &VolumeId, path: &str, sum: &str) -> bool {
    state.file(path).is_some_and(|f| {
        (!f.removed && f.locations.iter().any(|l| &l.volume_id == volume && l.checksum.eq_ignore_ascii_case(sum)))
            || (f.removed && f.checksum.eq_ignore_ascii_case(sum))
            || moved_copy(state, f, volume, sum)
    })
}

/// Whether `f` lists a copy on `volume` with content `sum` (not dropped).
fn lists_copy(f: &FileRecord, volume: &VolumeId, sum: &str) -> bool {
    f.locations
        .iter()
        .any(|l| &l.volume_id == volume && l.checksum.eq_ignore_ascii_case(sum) && l.state != LocationState::Dropped)
}

/// Whether bytes with `sum` on `volume` at the path of `f`, a move's tombstone, are the copy the
/// move renames: the tombstone lists that copy with that content and so does the moved file's
/// record at its new path.
fn moved_copy(state: &MetaState, f: &FileRecord, volume: &VolumeId, sum: &str) -> bool {
    f.removed
        && lists_copy(f, volume, sum)
        && state.files_with_id(&f.id).any(|g| !g.removed && g.path != f.path && lists_copy(g, volume, sum))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Version;
    use crate::ids::{FileId, NodeId};
    use crate::meta::records::{FileRecord, Location, LocationState, Record};

    fn record(path: &str, volume: &str, sum: &str, removed: bool, wall: u64) -> Record {
        let version = Version { wall_ms: wall, counter: 0, node: NodeId::new("n") };
        Record::File(FileRecord {
            id: FileId::new("f"),
            path: path.into(),
            is_dir: false,
            size: 1,
            mod_time: 0,
            checksum: sum.into(),
            owner: String::new(),
            primary: None,
            locations: vec![Location {
                volume_id: VolumeId::new(volume),
                node_id: NodeId::new("n"),
                checksum: sum.into(),
                state: LocationState::Committed,
                updated: version.clone(),
                content: None,
            }],
            replicas: 0,
            removed,
            version,
            repl: None,
            based_on: None,
        })
    }

    #[test]
    fn notes_past_the_window_are_swept_so_the_registry_holds_about_one_window() {
        let v = VolumeId::new("v");
        let mut l = LandedBytes::default();
        for i in 0..1_300u64 {
            // A put every second, for 1,300 s; nobody asks about these paths again.
            l.note(&v, &format!("/p{i}"), "ab", Millis(i * 1_000));
        }
        assert!(l.len() <= 2 * (LANDED_MAX_MS / 1_000) as usize + 1, "{} notes kept", l.len());
        assert!(l.noted(&v, "/p1299"), "a recent note stays");
        assert!(!l.noted(&v, "/p0"), "one past the window went");
    }

    #[test]
    fn landed_bytes_stay_unsettled_until_a_record_accounts_for_them_or_they_age_out() {
        let v = VolumeId::new("v");
        let mut state = MetaState::new();
        let mut l = LandedBytes::default();
        l.note(&v, "a//b", "AA", Millis(0));
        assert!(l.unsettled(&state, &v, "/a/b", Millis(1)), "the path is normalised");
        assert!(l.other_unsettled(&state, &v, "/a/b", "bb", Millis(1)));
        assert!(!l.other_unsettled(&state, &v, "/a/b", "aa", Millis(1)), "the same bytes hold nothing back");
        assert!(l.volume_unsettled(&state, &v, Millis(1)));
        assert!(!l.volume_unsettled(&state, &VolumeId::new("w"), Millis(1)));
        // A record listing a copy of other content on that volume does not settle them...
        state.apply(&record("/a/b", "v", "cc", false, 1));
        assert!(l.unsettled(&state, &v, "/a/b", Millis(2)));
        // ...one listing these bytes does.
        state.apply(&record("/a/b", "v", "aa", false, 2));
        assert!(!l.unsettled(&state, &v, "/a/b", Millis(3)));
        // A removal of that very content settles bytes too; and 10 minutes do.
        l.note(&v, "/x", "dd", Millis(0));
        state.apply(&record("/x", "v", "dd", true, 3));
        assert!(!l.unsettled(&state, &v, "/x", Millis(1)));
        l.note(&v, "/y", "ee", Millis(0));
        assert!(l.unsettled(&MetaState::new(), &v, "/y", Millis(LANDED_MAX_MS)));
        assert!(!l.unsettled(&MetaState::new(), &v, "/y", Millis(LANDED_MAX_MS + 1)));
    }

    #[test]
    fn bytes_found_from_before_the_start_are_judged_like_bytes_landed_at_their_mtime() {
        let started = Millis(100_000);
        // Modified before the start and within the window: maybe the last run's landing.
        assert!(landed_before_start(99_000, started, Millis(101_000)));
        assert!(landed_before_start(100_000, started, Millis(100_000 + LANDED_MAX_MS)));
        // Modified after the start: this run's landings are noted as they land.
        assert!(!landed_before_start(100_001, started, Millis(101_000)));
        // Older than the window: they would have settled anyway.
        assert!(!landed_before_start(99_000, started, Millis(99_001 + LANDED_MAX_MS)));

        let v = VolumeId::new("v");
        let mut l = LandedBytes::default();
        assert!(!l.noted(&v, "/p"));
        l.note_found(&v, "/p", "AA", 1_000, Millis(50_000));
        assert!(l.noted(&v, "/p"));
        // A removal of other content does not account for them...
        let mut state = MetaState::new();
        state.apply(&record("/p", "v", "bb", true, 1));
        assert!(l.unsettled(&state, &v, "/p", Millis(50_000)));
        // ...and they age out from their mtime, not from when they were found.
        assert!(l.unsettled(&state, &v, "/p", Millis(49_000 + LANDED_MAX_MS)));
        assert!(!l.unsettled(&state, &v, "/p", Millis(49_001 + LANDED_MAX_MS)));
        // Bytes landed since they were found are newer: a late finding does not replace them.
        l.note(&v, "/q", "cc", Millis(60_000));
        l.note_found(&v, "/q", "dd", 0, Millis(60_001));
        assert!(l.other_unsettled(&MetaState::new(), &v, "/q", "dd", Millis(60_002)));
        assert!(!l.other_unsettled(&MetaState::new(), &v, "/q", "cc", Millis(60_002)));
    }

    #[test]
    fn kept_bytes_go_back_only_when_current_records_still_name_them_and_go_when_they_moved_on() {
        let (v, w) = (VolumeId::new("v"), VolumeId::new("w"));
        let mut l = LandedBytes::default();
        let mut state = MetaState::new();
        state.apply(&record("/f", "v", "aa", false, 1));
        // An overwrite landed bb over aa on v, keeping aa aside.
        l.note(&v, "/f", "bb", Millis(0));
        l.note_kept(&v, "/f", "AA");
        assert_eq!(l.kept().count(), 1);
        // While the new bytes are unsettled (their record may be on its way), or while this
        // node's records may lag, nothing is decided.
        assert_eq!(l.kept_fate(&state, &v, "/f", "aa", true, Millis(1)), KeptFate::Wait);
        assert!(l.unsettled(&state, &v, "/f", Millis(1)), "looking does not settle anything");
        assert_eq!(l.kept_fate(&state, &v, "/f", "aa", false, Millis(LANDED_MAX_MS + 1)), KeptFate::Wait);
        // Its record never came: aa is still the path's content with a copy on v, so it goes back.
        assert_eq!(l.kept_fate(&state, &v, "/f", "aa", true, Millis(LANDED_MAX_MS + 1)), KeptFate::Restore);
        // The writer gave up on bb: no need to wait for its age.
        assert!(l.forget(&v, "/f", "bb"));
        assert_eq!(l.kept_fate(&state, &v, "/f", "aa", true, Millis(1)), KeptFate::Restore);
        // Kept bytes on a volume the record lists no copy on are no copy of anything.
        assert_eq!(l.kept_fate(&state, &w, "/f", "aa", true, Millis(1)), KeptFate::Drop);
        // The overwrite published: the record names bb, and aa goes.
        l.note(&v, "/f", "bb", Millis(2));
        state.apply(&record("/f", "v", "bb", false, 2));
        assert_eq!(l.kept_fate(&state, &v, "/f", "aa", true, Millis(3)), KeptFate::Drop);
        // A removal of the file drops them too, once the bytes landed since have settled.
        let mut removed = MetaState::new();
        removed.apply(&record("/f", "v", "aa", true, 3));
        assert_eq!(l.kept_fate(&removed, &v, "/f", "aa", true, Millis(3)), KeptFate::Wait);
        assert_eq!(l.kept_fate(&removed, &v, "/f", "aa", true, Millis(3 + LANDED_MAX_MS)), KeptFate::Drop);
        l.kept_done(&v, "/f", "aa");
        assert_eq!(l.kept().count(), 0);
    }

    #[test]
    fn only_the_last_bytes_landed_are_forgotten() {
        let v = VolumeId::new("v");
        let mut l = LandedBytes::default();
        l.note(&v, "/p", "aa", Millis(0));
        l.note(&v, "/p", "bb", Millis(1));
        assert!(!l.forget(&v, "/p", "aa"), "newer bytes landed since");
        assert!(l.unsettled(&MetaState::new(), &v, "/p", Millis(2)));
        assert!(l.forget(&v, "/p", "BB"));
        assert!(!l.unsettled(&MetaState::new(), &v, "/p", Millis(2)));
    }
}
