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

use crate::ids::VolumeId;
use crate::meta::path::normalize;
use crate::meta::state::MetaState;
use crate::time::Millis;
use std::collections::BTreeMap;

/// How long landed bytes stay protected at most, waiting for their record.
pub const LANDED_MAX_MS: u64 = 10 * 60_000;

/// The last bytes landed at each (volume, path): their checksum and when.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LandedBytes {
    entries: BTreeMap<(VolumeId, String), (String, Millis)>,
}

fn key(volume: &VolumeId, path: &str) -> (VolumeId, String) {
    (volume.clone(), normalize(path).unwrap_or_else(|_| path.to_string()))
}

impl LandedBytes {
    /// Bytes with `checksum` were just put in place at `path` on `volume`.
    pub fn note(&mut self, volume: &VolumeId, path: &str, checksum: &str, now: Millis) {
        self.entries.insert(key(volume, path), (checksum.to_ascii_lowercase(), now));
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

    /// Whether bytes landed at `path` on `volume` that `state` does not account for yet. Bytes
    /// found settled are dropped from the registry.
    pub fn unsettled(&mut self, state: &MetaState, volume: &VolumeId, path: &str, now: Millis) -> bool {
        let k = key(volume, path);
        let Some((sum, at)) = self.entries.get(&k).cloned() else { return false };
        let accounted = state.file(&k.1).is_some_and(|f| {
            // A live record with this copy, or one written after the bytes (a later remove or
            // overwrite knows of them).
            (!f.removed && f.locations.iter().any(|l| &l.volume_id == volume && l.checksum.eq_ignore_ascii_case(&sum)))
                || (f.removed && f.checksum.eq_ignore_ascii_case(&sum))
        });
        if accounted || now.since(at) > LANDED_MAX_MS {
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
            }],
            replicas: 0,
            removed,
            version,
            repl: None,
        })
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
