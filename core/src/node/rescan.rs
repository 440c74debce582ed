//! What a rescan makes of the files it finds in a volume folder (spec: "Storage (ACS)",
//! "Replication": "the store can always be rebuilt from the real files"). The shell walks the
//! folder and hashes what this module asks it to; every decision is here: which files need a
//! hash and why ([`VolumeFacts::rescan_plan`]), and what a hash means
//! ([`Node::rescan_outcome`]): a changed current copy turns stale, a stale copy of the file's
//! present content with the right bytes is a copy again, right bytes the records do not list
//! are added as a copy, a file with no record is adopted (only once the leader confirmed it
//! has none, which the shell asks), and a current copy that vanished turns stale (not one whose
//! bytes still lie at an old path of a move its rename has not reached yet, any of them after
//! a chain of moves).

use super::files::VolumeFacts;
use super::Node;
use crate::ids::{FileId, VolumeId};
use crate::meta::records::LocationState;
use crate::time::Millis;

/// How much newer than its last check a copy's mtime must be to count as touched (mtime
/// granularity and clock steps on one host).
pub const MTIME_SLACK_MS: u64 = 2_000;

/// A regular file a rescan found in a volume folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: String,
    pub size: u64,
    /// Their mtime, what an adoption is judged by (not their ctime, which also moves when
    /// shoal renames a leftover copy and would make it look newer than the removal of its path).
    pub mtime_ms: u64,
}

/// A file the rescan must hash, and what the hash decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RescanCheck {
    /// A current copy whose size or mtime moved since its last check: other content makes it
    /// stale.
    Changed { checksum: String, size: u64 },
    /// A stale copy recorded with the file's present content, of the right size (marked while
    /// its node was away, or found corrupt): right bytes make it a copy again, with no transfer.
    Restore { id: FileId, checksum: String },
    /// Bytes of the right size at a live file's path that the records do not list here: right
    /// bytes are added as a copy.
    Add { id: FileId, checksum: String },
    /// No live file at this path in this node's records: adopted as a new file, once the
    /// metadata leader confirms it has none either (this node's records may lag).
    Adopt { mtime_ms: u64 },
}

/// What a rescan of one volume asks for: files to hash, and current copies that vanished
/// (path, the file's checksum), which turn stale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RescanPlan {
    pub checks: Vec<(String, RescanCheck)>,
    pub vanished: Vec<(String, String)>,
}

/// What a rescan did about one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RescanDid {
    Nothing,
    MarkedStale,
    Restored,
    Added,
    Adopted,
    /// A file with no record that is not adopted (yet): the path is taken, was removed after
    /// the bytes came there, or bytes landed there moments ago.
    NotAdopted,
}

impl VolumeFacts {
    /// The checks for the files `found` on this volume, and the current copies not found.
    /// Paths a delete or rename is on its way to are left alone. The facts must be read
    /// before the folder is walked: bytes landed and recorded during the walk are then neither
    /// found nor listed, instead of listed and taken for vanished.
    pub fn rescan_plan(&self, found: &[Found]) -> RescanPlan {
        let mut plan = RescanPlan::default();
        for f in found {
            if self.pending.contains(&f.path) {
                continue;
            }
            let check = match self.live.get(&f.path) {
                Some(live) => match live.copy {
                    Some(c) if c.current => {
                        let touched = f.size != live.size || f.mtime_ms > c.checked_ms.saturating_add(MTIME_SLACK_MS);
                        touched.then(|| RescanCheck::Changed { checksum: live.checksum.clone(), size: live.size })
                    }
                    Some(c) if c.of_this_content && f.size == live.size => {
                        Some(RescanCheck::Restore { id: live.id.clone(), checksum: live.checksum.clone() })
                    }
                    Some(_) => None,
                    None if f.size == live.size => {
                        Some(RescanCheck::Add { id: live.id.clone(), checksum: live.checksum.clone() })
                    }
                    None => None,
                },
                None => Some(RescanCheck::Adopt { mtime_ms: f.mtime_ms }),
            };
            if let Some(check) = check {
                plan.checks.push((f.path.clone(), check));
            }
        }
        let present: std::collections::BTreeSet<&str> = found.iter().map(|f| f.path.as_str()).collect();
        for (path, live) in &self.live {
            // Bytes still at the old path of a move whose rename has not run yet are this
            // copy, not a vanished one.
            let waiting = self.arriving.get(path).is_some_and(|from| from.iter().any(|f| present.contains(f.as_str())));
            if live.copy.is_some_and(|c| c.current) && !present.contains(path.as_str()) && !waiting {
                plan.vanished.push((path.clone(), live.checksum.clone()));
            }
        }
        plan
    }
}

impl Node {
    /// The shell hashed the file at `path` on `volume` for `check`: `hashed` is its size and
    /// SHA-256 (`None`: it could not be read). Records what that means.
    pub fn rescan_outcome(
        &mut self,
        wall: Millis,
        volume: &VolumeId,
        path: &str,
        check: &RescanCheck,
        hashed: Option<(u64, String)>,
    ) -> RescanDid {
        match check {
            RescanCheck::Changed { checksum, size } => {
                let same = hashed.as_ref().is_some_and(|(s, sum)| s == size && sum.eq_ignore_ascii_case(checksum));
                if same {
                    return RescanDid::Nothing;
                }
                self.copy_mark(wall, path, volume, LocationState::Stale, checksum);
                RescanDid::MarkedStale
            }
            RescanCheck::Restore { id, checksum } | RescanCheck::Add { id, checksum } => {
                let Some((_, sum)) = hashed.filter(|(_, sum)| sum.eq_ignore_ascii_case(checksum)) else {
                    return RescanDid::Nothing;
                };
                if !self.copy_publish(wall, path, id, &sum, volume) {
                    return RescanDid::Nothing;
                }
                if matches!(check, RescanCheck::Restore { .. }) {
                    RescanDid::Restored
                } else {
                    RescanDid::Added
                }
            }
            RescanCheck::Adopt { mtime_ms } => {
                let Some((size, sum)) = hashed else { return RescanDid::Nothing };
                match self.copy_adopt(wall, path, volume, size, &sum, *mtime_ms) {
                    Ok(_) => RescanDid::Adopted,
                    Err(_) => RescanDid::NotAdopted,
                }
            }
        }
    }

    /// Current copies on `volume` that a rescan did not find (path, checksum) turn stale.
    pub fn rescan_vanished(&mut self, wall: Millis, volume: &VolumeId, vanished: &[(String, String)]) -> u64 {
        // Counted as marked only where the mark took (a path moved away or overwritten since
        // the walk is refused by `copy_mark`'s guards).
        let mut marked = 0;
        for (path, checksum) in vanished {
            if self.copy_mark(wall, path, volume, LocationState::Stale, checksum) {
                marked += 1;
            }
        }
        marked
    }
}

#[cfg(test)]
mod tests {
    use super::super::files::{CopyFact, LiveFile};
    use super::*;

    fn live(size: u64, copy: Option<CopyFact>) -> LiveFile {
        LiveFile { id: FileId::new("id"), size, checksum: "a".repeat(64), copy }
    }

    fn copy(current: bool, of_this_content: bool) -> Option<CopyFact> {
        Some(CopyFact { current, of_this_content, checked_ms: 10_000 })
    }

    fn found(path: &str, size: u64, mtime_ms: u64) -> Found {
        Found { path: path.into(), size, mtime_ms }
    }

    #[test]
    fn each_kind_of_file_found_gets_its_check_and_untouched_right_copies_none() {
        let mut facts = VolumeFacts::default();
        facts.live.insert("/same".into(), live(5, copy(true, true)));
        facts.live.insert("/grown".into(), live(5, copy(true, true)));
        facts.live.insert("/touched".into(), live(5, copy(true, true)));
        facts.live.insert("/stale".into(), live(5, copy(false, true)));
        facts.live.insert("/stale-other".into(), live(5, copy(false, false)));
        facts.live.insert("/unlisted".into(), live(5, None));
        facts.live.insert("/unlisted-short".into(), live(5, None));
        facts.live.insert("/gone".into(), live(5, copy(true, true)));
        facts.live.insert("/gone-stale".into(), live(5, copy(false, true)));
        facts.pending.insert("/moving".into());
        let plan = facts.rescan_plan(&[
            found("/same", 5, 11_000),
            found("/grown", 6, 10_000),
            found("/touched", 5, 12_001),
            found("/stale", 5, 0),
            found("/stale-other", 5, 0),
            found("/unlisted", 5, 0),
            found("/unlisted-short", 4, 0),
            found("/moving", 5, 0),
            found("/new", 3, 77),
        ]);
        let sum = "a".repeat(64);
        let id = FileId::new("id");
        assert_eq!(
            plan.checks,
            vec![
                ("/grown".into(), RescanCheck::Changed { checksum: sum.clone(), size: 5 }),
                ("/touched".into(), RescanCheck::Changed { checksum: sum.clone(), size: 5 }),
                ("/stale".into(), RescanCheck::Restore { id: id.clone(), checksum: sum.clone() }),
                ("/unlisted".into(), RescanCheck::Add { id, checksum: sum.clone() }),
                ("/new".into(), RescanCheck::Adopt { mtime_ms: 77 }),
            ]
        );
        assert_eq!(plan.vanished, vec![("/gone".into(), sum)], "only a current copy that vanished turns stale");
    }
}
