//! The node's side of the cluster drive's namespace (spec: "Storage (ACS) and the cluster:/
//! drive"): what a put may write and how its record is published, remove, move and mkdir, the
//! copies a read may use, and what each node must do to the copies on its own volumes so the
//! disk follows the replicated records (deletes after a remove, renames after a move). The
//! shell moves the bytes; every decision is here.
//!
//! Rules:
//! - a record is published only after its copies are written: the namespace never shows a
//!   half-written file;
//! - an overwrite keeps the file's id; copies of the older content are marked stale and the
//!   planner repairs them in place;
//! - two concurrent first writes of one path end as one record (the path is the key; the
//!   newer version wins and the other's copies, holding other content, count as stale);
//! - a copy is deleted or renamed on disk only by its own node, and only when the node's own
//!   records say so (a tombstone whose file id is live nowhere on that volume, or a live record
//!   of the same id at the new path), or for a drop task of the current leader when enough
//!   other copies exist.

use super::{ApiError, Node};
use crate::ids::{FileId, NodeId, VolumeId};
use crate::meta::namespace::{self, normalize};
use crate::meta::records::{FileRecord, Location, LocationState, Record, ReplBackoff};
use crate::storage::planner::{Backoff, TaskOutcome};
use crate::storage::transfer;
use crate::time::Millis;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;

/// Every copy is re-checked at least this often (issue 4 "Scrubbing": 14 days).
pub const SCRUB_BOUND_MS: u64 = 14 * 24 * 3600 * 1000;

/// A readable copy of a file's current content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    pub node_id: NodeId,
    pub volume_id: VolumeId,
    /// The volume's folder when the copy is on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Where on this node's volume the copy's bytes may still be while a move's rename has not
    /// run yet (held until the leader takes the move,
    /// [`crate::meta::machine::Meta::awaiting_leader`]): the path it was moved from, when the
    /// copy it had there has this content. Read there when nothing is at the file's path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
}

/// Where a put lands: the canonical path, the id an overwrite keeps, the primary to prefer and
/// how many copies the write makes before it is acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutTarget {
    pub path: String,
    pub file_id: Option<FileId>,
    /// The content the write replaces (the live record's SHA-256), if the path holds a file.
    pub replaces: Option<String>,
    pub primary: Option<VolumeId>,
    pub wanted: u32,
    /// Who writes it (set by the caller; the record of a new file keeps it).
    pub owner: String,
}

/// Work on this node's disk that its records ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum DiskAction {
    /// The file was removed: delete the copy at `path`.
    Delete { volume: VolumeId, folder: String, path: String },
    /// The file moved: rename the copy from `from` to `to`.
    Rename { volume: VolumeId, folder: String, from: String, to: String },
}

/// What the records ask of the copy `l` on this node's volume (whose folder is `folder`) of the
/// removed file `f`, given the live record of the same id with a copy there (its path and that
/// copy's checksum), if any: renamed to the live path while that copy is still this content (one
/// overwritten since supersedes it, and the old bytes just go), nothing when the live record is
/// at the same path, deleted otherwise.
fn disk_action_of(f: &FileRecord, l: &Location, folder: &str, live: Option<(&str, &str)>) -> Option<DiskAction> {
    match live {
        Some((to, sum)) if to != f.path && sum.eq_ignore_ascii_case(&l.checksum) => Some(DiskAction::Rename {
            volume: l.volume_id.clone(),
            folder: folder.to_string(),
            from: f.path.clone(),
            to: to.to_string(),
        }),
        Some((to, _)) if to == f.path => None,
        Some(_) | None => {
            Some(DiskAction::Delete { volume: l.volume_id.clone(), folder: folder.to_string(), path: f.path.clone() })
        }
    }
}

/// Why a destructive `store/delete` is made (the node checks it against its own records).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteRequest {
    pub volume_id: VolumeId,
    pub path: String,
    /// The leader's term, for a drop task; absent for a user's remove.
    #[serde(default)]
    pub term: Option<u64>,
}

fn bad_path(e: impl ToString) -> ApiError {
    ApiError::invalid("bad_path", e.to_string())
}

/// What a move did: the records it moved (files and folders) and each file's old and new path
/// with its copies on disk, so the caller renames those without deriving paths again. The API
/// answers `{from, to, moved}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Moved {
    pub from: String,
    pub to: String,
    /// Records moved (files and folder records).
    #[serde(rename = "moved")]
    pub records: usize,
    #[serde(skip)]
    pub files: Vec<MovedFile>,
}

/// A file just published.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Published {
    pub path: String,
    pub id: FileId,
    pub size: u64,
    pub checksum: String,
    /// Copies written.
    pub copies: usize,
    /// Copies its policy wants.
    pub wanted: u32,
}

/// `mkdir`: `created` is false when the folder was there already.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FolderMade {
    pub path: String,
    pub created: bool,
}

/// `rm`: how many records (files and folders) got tombstones.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FilesRemoved {
    pub path: String,
    pub removed: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MovedFile {
    pub from: String,
    pub to: String,
    /// Its copies on disk: (volume, node).
    pub copies: Vec<(VolumeId, NodeId)>,
}

impl Node {
    pub(super) fn live_file(&self, path: &str) -> Option<&FileRecord> {
        self.meta.state().file(path).filter(|f| !f.removed)
    }

    /// The live files (not folders) at `path` or below it, in path order (`shoal verify`): a
    /// lookup and one range of the records, not a walk of the namespace.
    pub fn live_files_at_or_under(&self, path: &str) -> Result<Vec<FileRecord>, ApiError> {
        let p = normalize(path).map_err(bad_path)?;
        let state = self.meta.state();
        let prefix = if p == "/" { "/".to_string() } else { format!("{p}/") };
        let at = state.file(&p).filter(|_| p != "/");
        let below = state.files_from(&prefix).take_while(|f| f.path.starts_with(&prefix));
        Ok(at.into_iter().chain(below).filter(|f| !f.removed && !f.is_dir).cloned().collect())
    }

    fn is_folder(&self, path: &str) -> bool {
        path == "/"
            || self.live_file(path).is_some_and(|f| f.is_dir)
            || namespace::list(self.meta.state(), path).is_ok_and(|l| !l.is_empty())
    }

    /// 409 when a live file sits at `path` or above it (a file cannot hold files).
    fn check_ancestors(&self, path: &str) -> Result<(), ApiError> {
        let mut at = namespace::parent(path);
        while let Some(a) = at {
            if self.live_file(a).is_some_and(|f| !f.is_dir) {
                return Err(ApiError::conflict("not_a_folder", format!("cluster:{a} is a file, not a folder")));
            }
            at = namespace::parent(a);
        }
        Ok(())
    }

    /// Whether the copy on `volume` of the live file at `path` is still to be renamed there from
    /// the path it was moved from (its holder has not renamed it on disk yet).
    pub fn copy_move_pending(&self, path: &str, volume: &VolumeId) -> bool {
        self.copy_moved_at(path, volume).is_some()
    }

    /// Where the bytes of the copy on `volume` of the live file at `path` lie while its move's
    /// rename has not run: the path it was moved from. Only where the bytes left there are
    /// this content: not those of a copy that was stale before the move and has been repaired
    /// at the new path since, nor bytes landed over content an overwrite kept aside there (the
    /// kept bytes go back first: [`Node::copy_move_waits_for_kept`]). A local read and a peer's
    /// `store/read` of such a copy read it there.
    pub fn moved_copy_source(&self, path: &str, volume: &VolumeId) -> Option<String> {
        let f = self.live_file(path)?;
        let l = f.locations.iter().find(|l| &l.volume_id == volume)?;
        self.copy_moved(path, volume)
            .filter(|g| {
                g.locations.iter().any(|m| {
                    &m.volume_id == volume
                        && m.checksum.eq_ignore_ascii_case(&l.checksum)
                        && m.state != LocationState::Stale
                        && !self.rename_waits_for_kept(volume, &g.path, &m.checksum)
                })
            })
            .map(|g| g.path.clone())
    }

    /// When the move whose rename would bring the copy on `volume` to `path` was decided (wall
    /// ms of its tombstone), if that rename has not run yet.
    pub fn copy_moved_at(&self, path: &str, volume: &VolumeId) -> Option<u64> {
        self.copy_moved(path, volume).map(|g| g.version.wall_ms)
    }

    /// Whether the rename that would bring the copy on `volume` to `path` waits for bytes an
    /// overwrite kept aside at the move's old path ([`Node::rename_waits_for_kept`]): they go
    /// back in place first, at the latest once the bytes landed over them settle.
    pub fn copy_move_waits_for_kept(&self, path: &str, volume: &VolumeId) -> bool {
        self.copy_moved(path, volume).is_some_and(|g| {
            g.locations.iter().any(|l| {
                &l.volume_id == volume
                    && l.state != LocationState::Dropped
                    && self.rename_waits_for_kept(volume, &g.path, &l.checksum)
            })
        })
    }

    /// The record at the old path of the newest move whose rename would bring the copy on
    /// `volume` to `path`, if that rename has not run yet: the copy's bytes are still at its
    /// path. The move's tombstone; or the live record a newer write made there, which still
    /// lists the bytes the move left behind ([`Node::left_behind_rename`]).
    fn copy_moved(&self, path: &str, volume: &VolumeId) -> Option<&FileRecord> {
        let f = self.live_file(path)?;
        let tombstone = self
            .meta
            .state()
            .files_with_id(&f.id)
            .filter(|g| {
                g.removed
                    && g.path != f.path
                    && g.locations.iter().any(|l| &l.volume_id == volume && l.state != LocationState::Dropped)
            })
            .max_by(|a, b| a.version.cmp(&b.version));
        tombstone.or_else(|| {
            let old = f.based_on.as_deref().map(|b| b.path.as_str()).filter(|p| *p != f.path)?;
            let (to, _) = self.left_behind_rename(old, volume)?;
            (to == f.path).then(|| self.meta.state().file(old)).flatten()
        })
    }

    /// A copy a move left behind at `old` on `volume` although the record there is live again
    /// (a newer write won the path over the move's tombstone: a new file put through a node
    /// that never knew the moved one, or an overwrite the move was decided without), and with
    /// the tombstone went the only trace of the rename (simulator `--races` seed 5287:
    /// the moved file's record kept a copy nothing renamed, and the planner then repaired the
    /// old path's copy over its bytes). Found from the moved record's side instead: a live
    /// record moved from `old` (its `based_on`) lists a copy on `volume` with the content
    /// `old`'s record lists there as not its own, written there before the move was decided
    /// (bytes a later write put at `old`, of the same content by chance, are that write's).
    /// Its new path and that content.
    pub fn left_behind_rename(&self, old: &str, volume: &VolumeId) -> Option<(String, String)> {
        let state = self.meta.state();
        let r = state.file(old).filter(|f| !f.removed && !f.is_dir)?;
        let here = r.locations.iter().find(|l| &l.volume_id == volume && l.state != LocationState::Dropped)?;
        if here.checksum.is_empty() || here.checksum.eq_ignore_ascii_case(&r.checksum) {
            return None;
        }
        state
            .moved_records_from(old)
            .find(|m| {
                here.content_version() < &m.version
                    && m.locations.iter().any(|l| {
                        &l.volume_id == volume
                            && l.state != LocationState::Dropped
                            && l.checksum.eq_ignore_ascii_case(&here.checksum)
                    })
            })
            .map(|m| (m.path.clone(), here.checksum.clone()))
    }

    /// A remove or a move is decided from this node's records, and lists the copies they know:
    /// not while those may hold half of what the leader holds
    /// ([`crate::meta::machine::Meta::records_settling`]: a record made from a copy mark alone,
    /// without the copies its full record lists). A move decided from such a record named one
    /// copy of three, the leader took it, and the holders of the other two deleted theirs;
    /// the one left was rotten (simulator seed 7050). (A leader whose own removes and moves
    /// wait for their check queues the next ones behind them, where the check's undo reaches
    /// them: [`crate::meta::machine::Meta::leader_may_lag`].)
    fn check_records_settled(&self) -> Result<(), ApiError> {
        if self.meta.records_settling() {
            return Err(ApiError::conflict(
                "records_settling",
                "this node is catching up with the leader's records; nothing was changed, retry shortly",
            ));
        }
        Ok(())
    }

    /// 409 while bytes of a write of one of `records`' files landed on a volume of this node
    /// and its records do not account for them yet (the write's record is on its way, from the
    /// node that took the put): a remove or a move decided now would be decided from records
    /// older than those bytes. Simulator seed 3920: the leader moved a file while an
    /// overwrite's copy sat on its volume and the overwrite's record had not reached it; the
    /// move named the old content's copies, which the overwrite was retiring, and its
    /// tombstone, newer by version, dropped the overwrite: neither content was left.
    fn check_no_write_landed(&mut self, wall: Millis, records: &[FileRecord]) -> Result<(), ApiError> {
        let volumes = self.local_volumes();
        for f in records.iter().filter(|f| !f.is_dir) {
            for (v, _) in &volumes {
                if self.landed_unsettled(wall, v, &f.path) {
                    return Err(ApiError::conflict(
                        "write_in_flight",
                        format!(
                            "a write of cluster:{} is on its way to this node's records; nothing was changed, retry shortly",
                            f.path
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// 409 while a removed file at `path` still has a copy to be renamed to where it moved: a
    /// new file there would take the old path's record, and with it the only trace of that
    /// rename (the holder renames within seconds once it hears of the move).
    fn check_no_pending_rename(&self, path: &str) -> Result<(), ApiError> {
        let Some(old) = self.meta.state().file(path).filter(|f| f.removed) else { return Ok(()) };
        let pending = old.locations.iter().filter(|l| l.state != LocationState::Dropped).any(|l| {
            self.meta.state().files_with_id(&old.id).any(|g| {
                !g.removed
                    && g.locations.iter().any(|m| m.volume_id == l.volume_id && m.state != LocationState::Dropped)
            })
        });
        if pending {
            return Err(ApiError::conflict(
                "path_busy",
                format!("cluster:{path} was just moved and its copies are still being renamed; retry shortly"),
            ));
        }
        Ok(())
    }

    /// Copies of a removed file at `path` not yet deleted from disk: a new record at the path
    /// keeps them, as stale, so they stay known (the planner repairs or drops them) instead of
    /// lying on disk unrecorded.
    fn leftover_copies(&self, path: &str, version: &crate::hlc::Version, skip: &[VolumeId]) -> Vec<Location> {
        let Some(old) = self.meta.state().file(path).filter(|f| f.removed) else { return vec![] };
        old.locations
            .iter()
            .filter(|l| l.state != LocationState::Dropped && !skip.contains(&l.volume_id))
            .map(|l| Location { state: LocationState::Stale, ..l.restamped(version.clone()) })
            .collect()
    }

    /// Whether bytes with `checksum`, written by someone who knew the path's content as
    /// `replaces` (none: a first write), may replace the file at `path` on this node's `volume`.
    /// Not when that file is a current copy of the live record with other content the writer
    /// did not know of: the writer raced another write of the path, and if its record lost
    /// the merge, the winner's copy would be gone. (Stale copies and files no record lists
    /// may be replaced.)
    ///
    /// Nor when the file is the copy of a moved file still waiting on this volume to be renamed
    /// to its new path: it is that file's content, whatever the old path's record says now
    /// (a tombstone, or a live record the move left it behind under).
    pub fn may_replace_copy(&self, path: &str, volume: &VolumeId, checksum: &str, replaces: Option<&str>) -> bool {
        let Ok(p) = normalize(path) else { return true };
        if self.left_behind_rename(&p, volume).is_some() {
            return false;
        }
        if let Some(old) = self.meta.state().file(&p).filter(|f| f.removed) {
            let here = |f: &FileRecord| {
                f.locations.iter().any(|l| &l.volume_id == volume && l.state != LocationState::Dropped)
            };
            let moving = here(old) && self.meta.state().files_with_id(&old.id).any(|g| !g.removed && here(g));
            return !moving;
        }
        let Some(f) = self.live_file(&p) else { return true };
        let Some(copy) = f.locations.iter().find(|l| &l.volume_id == volume && f.is_current(l)) else {
            return true;
        };
        let held = if copy.checksum.is_empty() { &f.checksum } else { &copy.checksum };
        held.eq_ignore_ascii_case(checksum) || replaces.is_some_and(|r| r.eq_ignore_ascii_case(held))
    }

    /// Whether this node's latest change to the file record at `path` is held by another node
    /// too ([`crate::meta::machine::Meta::held_elsewhere`]).
    pub fn file_record_held_elsewhere(&self, path: &str) -> bool {
        let p = normalize(path).unwrap_or_else(|_| path.to_string());
        self.meta.held_elsewhere(crate::meta::records::RecordKind::File, &p)
    }

    /// Whether `path` can take a file, and how the write goes (see [`PutTarget`]).
    pub fn file_put_target(&self, path: &str) -> Result<PutTarget, ApiError> {
        self.in_cluster()?;
        transfer::copy_segments(path).map_err(bad_path)?;
        let p = normalize(path).map_err(bad_path)?;
        if self.is_folder(&p) {
            return Err(ApiError::conflict("is_a_folder", format!("cluster:{p} is a folder")));
        }
        self.check_ancestors(&p)?;
        self.check_no_pending_rename(&p)?;
        let existing = self.live_file(&p);
        let wanted = match existing {
            Some(f) => namespace::wanted_copies(self.meta.state(), f),
            None => namespace::policy_for(self.meta.state(), &p),
        };
        Ok(PutTarget {
            path: p,
            file_id: existing.map(|f| f.id.clone()),
            replaces: existing.map(|f| f.checksum.to_ascii_lowercase()),
            primary: existing.and_then(|f| f.primary.clone()),
            wanted: wanted.max(1),
            owner: String::new(),
        })
    }

    /// Publish a file whose bytes are written: `copies` are (volume, node) holding `checksum`,
    /// the first being the primary. An overwrite keeps the id and marks copies of the older
    /// content stale.
    pub fn file_publish(
        &mut self,
        wall: Millis,
        path: &str,
        size: u64,
        checksum: &str,
        mod_time: u64,
        copies: &[(VolumeId, NodeId)],
    ) -> Result<Published, ApiError> {
        self.file_publish_as(wall, path, size, checksum, mod_time, copies, "")
    }

    /// [`Node::file_publish`] by `owner` (an account; the first writer of a path owns it).
    #[allow(clippy::too_many_arguments)]
    pub fn file_publish_as(
        &mut self,
        wall: Millis,
        path: &str,
        size: u64,
        checksum: &str,
        mod_time: u64,
        copies: &[(VolumeId, NodeId)],
        owner: &str,
    ) -> Result<Published, ApiError> {
        let target = self.file_put_target(path)?;
        transfer::check_checksum(checksum).map_err(|e| ApiError::invalid("bad_checksum", e.to_string()))?;
        if copies.is_empty() {
            return Err(ApiError::invalid("no_copies", "a file is published with at least one copy"));
        }
        // A copy on a volume retired while the bytes were on their way would be forgotten at
        // once: it is left out, and the others published.
        let copies: Vec<(VolumeId, NodeId)> = copies.iter().filter(|(v, _)| !self.volume_removed(v)).cloned().collect();
        let Some((primary, _)) = copies.first() else {
            return Err(ApiError::unavailable(
                "volume_removed",
                "every volume written was retired meanwhile; put it again",
            ));
        };
        let copies = copies.as_slice();
        let version = self.hlc.next(wall);
        let old = self.meta.state().file(&target.path).cloned();
        let id = target.file_id.clone().unwrap_or_else(|| FileId::new(self.rng.uuid_v4()));
        let mut locations: Vec<Location> = copies
            .iter()
            .map(|(v, n)| Location {
                volume_id: v.clone(),
                node_id: n.clone(),
                state: LocationState::Committed,
                checksum: checksum.to_string(),
                updated: version.clone(),
                content: None,
            })
            .collect();
        let written: Vec<VolumeId> = copies.iter().map(|(v, _)| v.clone()).collect();
        locations.extend(self.leftover_copies(&target.path, &version, &written));
        let mut replicas = 0;
        if let Some(old) = old.as_ref().filter(|o| !o.removed) {
            replicas = old.replicas;
            for l in &old.locations {
                if copies.iter().any(|(v, _)| *v == l.volume_id) || l.state == LocationState::Dropped {
                    continue;
                }
                let same = l.checksum.eq_ignore_ascii_case(checksum);
                if !same && l.state.is_healthy() {
                    locations.push(l.relabeled(LocationState::Stale, version.clone()));
                }
            }
        }
        let record = FileRecord {
            id,
            path: target.path.clone(),
            is_dir: false,
            size,
            mod_time,
            checksum: checksum.to_ascii_lowercase(),
            owner: old
                .as_ref()
                .filter(|o| !o.removed && !o.owner.is_empty())
                .map_or_else(|| owner.to_string(), |o| o.owner.clone()),
            primary: Some(primary.clone()),
            locations,
            replicas,
            removed: false,
            // A new file starts with no failures behind it (the register outlives a removal).
            repl: target
                .file_id
                .is_none()
                .then(|| Box::new(ReplBackoff { attempts: 0, next_at_ms: 0, version: version.clone() })),
            version,
            based_on: None,
        };
        let mut out = record.clone();
        out.canonicalize_locations();
        self.submit_record(wall, Record::File(record));
        let data = json!({"path": out.path, "id": out.id, "size": size, "checksum": out.checksum});
        self.raise(wall, "file.created", data);
        Ok(Published {
            path: out.path,
            id: out.id,
            size,
            checksum: out.checksum,
            copies: copies.len(),
            wanted: target.wanted,
        })
    }

    /// `mkdir`: an explicit folder record (a folder that exists already is fine).
    pub fn file_mkdir(&mut self, wall: Millis, path: &str) -> Result<FolderMade, ApiError> {
        self.in_cluster()?;
        let p = normalize(path).map_err(bad_path)?;
        if self.is_folder(&p) {
            return Ok(FolderMade { path: p, created: false });
        }
        if self.live_file(&p).is_some() {
            return Err(ApiError::conflict("exists", format!("cluster:{p} is a file")));
        }
        transfer::copy_segments(&p).map_err(bad_path)?;
        self.check_ancestors(&p)?;
        self.check_no_pending_rename(&p)?;
        let version = self.hlc.next(wall);
        let record = FileRecord {
            id: FileId::new(self.rng.uuid_v4()),
            path: p.clone(),
            is_dir: true,
            size: 0,
            mod_time: wall.0,
            checksum: String::new(),
            owner: String::new(),
            primary: None,
            locations: vec![],
            replicas: 0,
            removed: false,
            version,
            repl: None,
            based_on: None,
        };
        self.submit_record(wall, Record::File(record));
        Ok(FolderMade { path: p, created: true })
    }

    /// Live records at `p` and below it (the folder itself first when it has a record).
    fn subtree(&self, p: &str) -> Vec<FileRecord> {
        let prefix = if p == "/" { "/".to_string() } else { format!("{p}/") };
        let mut out: Vec<FileRecord> = self.live_file(p).cloned().into_iter().collect();
        out.extend(
            self.meta
                .state()
                .files_from(&prefix)
                .take_while(|f| f.path.starts_with(&prefix))
                .filter(|f| !f.removed)
                .cloned(),
        );
        out
    }

    /// `rm [-r]`: tombstones for the file, or the folder and (with `recursive`) all below it.
    /// Each node then deletes its own copies (see [`Node::disk_actions`]).
    pub fn file_remove(&mut self, wall: Millis, path: &str, recursive: bool) -> Result<FilesRemoved, ApiError> {
        self.in_cluster()?;
        self.check_records_settled()?;
        let p = normalize(path).map_err(bad_path)?;
        if p == "/" {
            return Err(ApiError::invalid("bad_path", "the root cannot be removed"));
        }
        let records = self.subtree(&p);
        if records.is_empty() {
            return Err(ApiError::not_found("not_found", format!("nothing at cluster:{p}")));
        }
        let is_folder = self.is_folder(&p);
        if is_folder && !recursive && records.iter().any(|f| f.path != p) {
            return Err(ApiError::conflict("folder_not_empty", format!("cluster:{p} is not empty; use -r")));
        }
        self.check_no_write_landed(wall, &records)?;
        let n = records.len();
        for f in records {
            let version = self.hlc.next(wall);
            let based_on = Some(f.based_on_this());
            self.submit_record(wall, Record::File(FileRecord { removed: true, version, repl: None, based_on, ..f }));
        }
        self.raise(wall, "file.removed", json!({"path": p, "records": n}));
        Ok(FilesRemoved { path: p, removed: n })
    }

    /// `mv`: the file or folder gets new records at `to` with the same ids and copies, and the
    /// old paths tombstones; each holder then renames its copies on disk.
    pub fn file_move(&mut self, wall: Millis, from: &str, to: &str) -> Result<Moved, ApiError> {
        self.in_cluster()?;
        self.check_records_settled()?;
        let from = normalize(from).map_err(bad_path)?;
        let to = normalize(to).map_err(bad_path)?;
        if from == "/" || to == "/" {
            return Err(ApiError::invalid("bad_path", "the root cannot be moved"));
        }
        transfer::copy_segments(&to).map_err(bad_path)?;
        if namespace::is_within(&to, &from) {
            return Err(ApiError::invalid("bad_path", "a folder cannot move into itself"));
        }
        let records = self.subtree(&from);
        if records.is_empty() {
            return Err(ApiError::not_found("not_found", format!("nothing at cluster:{from}")));
        }
        if self.live_file(&to).is_some() || self.is_folder(&to) {
            return Err(ApiError::conflict("exists", format!("cluster:{to} exists")));
        }
        self.check_ancestors(&to)?;
        let n = records.len();
        for f in &records {
            self.check_no_pending_rename(&format!("{to}{}", &f.path[from.len()..]))?;
        }
        self.check_no_write_landed(wall, &records)?;
        // Each file's copies on disk, before the move: what the disk reconcilers rename.
        let files = self
            .file_copies_under(&from)
            .into_iter()
            .map(|(path, copies)| MovedFile { to: format!("{to}{}", &path[from.len()..]), from: path, copies })
            .collect();
        // Every record at its new path and every tombstone at its old one go out together: a
        // node lost in the middle must not leave a file at both paths.
        let mut out = Vec::with_capacity(2 * n);
        for f in records {
            let new_path = format!("{to}{}", &f.path[from.len()..]);
            let version = self.hlc.next(wall);
            let mut locations: Vec<Location> = f.locations.iter().map(|l| l.restamped(version.clone())).collect();
            let moved_vols: Vec<VolumeId> = locations.iter().map(|l| l.volume_id.clone()).collect();
            locations.extend(self.leftover_copies(&new_path, &version, &moved_vols));
            let repl = Some(Box::new(ReplBackoff {
                attempts: f.repl.as_ref().map_or(0, |b| b.attempts),
                next_at_ms: f.repl.as_ref().map_or(0, |b| b.next_at_ms),
                version: version.clone(),
            }));
            // Both records were decided from this node's record at the old path: the leader
            // takes them only while that is still its record there (`BasedOn`).
            let based_on = Some(f.based_on_this());
            let moved = FileRecord {
                path: new_path,
                version: version.clone(),
                locations,
                repl,
                based_on: based_on.clone(),
                ..f.clone()
            };
            out.push(Record::File(moved));
            let version = self.hlc.next(wall);
            out.push(Record::File(FileRecord { removed: true, version, repl: None, based_on, ..f }));
        }
        self.submit_records(wall, out);
        self.raise(wall, "file.renamed", json!({"from": from, "to": to, "records": n}));
        Ok(Moved { from, to, records: n, files })
    }

    /// Live files at `path` and below it, each with its copies on disk (volume, node): what a
    /// move of `path` has to rename.
    pub fn file_copies_under(&self, path: &str) -> Vec<(String, Vec<(VolumeId, NodeId)>)> {
        let Ok(p) = normalize(path) else { return vec![] };
        self.subtree(&p)
            .into_iter()
            .filter(|f| !f.is_dir)
            .map(|f| {
                let copies = f
                    .locations
                    .iter()
                    .filter(|l| l.state != LocationState::Dropped)
                    .map(|l| (l.volume_id.clone(), l.node_id.clone()))
                    .collect();
                (f.path, copies)
            })
            .collect()
    }

    /// The live file at `path` and its readable copies of the current content: this node's
    /// first, then reachable members (ONLINE before others), by node id.
    pub fn file_sources(&self, path: &str, wall: Millis) -> Result<(FileRecord, Vec<Source>), ApiError> {
        let p = normalize(path).map_err(bad_path)?;
        let f = match self.live_file(&p) {
            Some(f) if f.is_dir => return Err(ApiError::conflict("is_a_folder", format!("cluster:{p} is a folder"))),
            Some(f) => f.clone(),
            None if self.is_folder(&p) => {
                return Err(ApiError::conflict("is_a_folder", format!("cluster:{p} is a folder")))
            }
            None => return Err(ApiError::not_found("not_found", format!("nothing at cluster:{p}"))),
        };
        let now = self.clock.peek(wall);
        let mut ranked: Vec<(u8, Source)> = f
            .locations
            .iter()
            .filter(|l| f.is_current(l))
            .filter_map(|l| {
                let local = self.local_volume(l.volume_id.as_str());
                if let Some(v) = local {
                    let moved_from = self.moved_copy_source(&f.path, &l.volume_id);
                    return Some((
                        0,
                        Source {
                            node_id: l.node_id.clone(),
                            volume_id: l.volume_id.clone(),
                            folder: Some(v.subpath),
                            moved_from,
                        },
                    ));
                }
                let rec = self.members.get(&l.node_id).filter(|r| !r.removed)?;
                let rank = match self.members.state(&rec.id, now) {
                    crate::membership::NodeState::Online => 1,
                    crate::membership::NodeState::Offline => 3,
                    _ => 2,
                };
                let (node_id, volume_id) = (l.node_id.clone(), l.volume_id.clone());
                Some((rank, Source { node_id, volume_id, folder: None, moved_from: None }))
            })
            .collect();
        ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.node_id.cmp(&b.1.node_id)));
        Ok((f, ranked.into_iter().map(|(_, s)| s).collect()))
    }

    /// Change one copy's state, if the file still has the content `checksum` (a scrub or a
    /// verify that started before an overwrite says nothing about the new content). Returns
    /// whether a record was written.
    pub fn copy_mark(
        &mut self,
        wall: Millis,
        path: &str,
        volume: &VolumeId,
        state: LocationState,
        checksum: &str,
    ) -> bool {
        let Some(f) = self.meta.state().file(path).cloned() else { return false };
        let dropping = state == LocationState::Dropped;
        if !dropping && (f.removed || !f.checksum.eq_ignore_ascii_case(checksum)) {
            return false;
        }
        let Some(l) = f.locations.iter().find(|l| &l.volume_id == volume).cloned() else { return false };
        let version = self.hlc.next(wall);
        let loc = l.relabeled(state, version);
        // A copy's change is no decision from the header (`based_on` stays with the decision).
        self.submit_record(wall, Record::File(FileRecord { locations: vec![loc], based_on: None, ..f }));
        true
    }

    /// A replication worker's verified copy of `path` on its `volume`, if the file still has
    /// that id and content.
    pub fn copy_publish(&mut self, wall: Millis, path: &str, file: &FileId, checksum: &str, volume: &VolumeId) -> bool {
        let Some(f) = self.live_file(path).cloned() else { return false };
        if &f.id != file || !f.checksum.eq_ignore_ascii_case(checksum) || self.volume_removed(volume) {
            return false;
        }
        // Copies count once per node: a second current copy on another volume of this node
        // (a rescan finding the file in two of its folders) would stand in for a copy on
        // another node.
        if f.locations.iter().any(|l| l.node_id == self.id && &l.volume_id != volume && f.is_current(l)) {
            return false;
        }
        let version = self.hlc.next(wall);
        let loc = Location {
            volume_id: volume.clone(),
            node_id: self.id.clone(),
            state: LocationState::Verified,
            checksum: f.checksum.clone(),
            updated: version,
            content: None,
        };
        // A copy's change is no decision from the header (`based_on` stays with the decision).
        self.submit_record(wall, Record::File(FileRecord { locations: vec![loc], based_on: None, ..f }));
        true
    }

    /// Adopt a file found in one of this node's volume folders with no record behind it (a
    /// rescan): a new record holding this one copy, modified at `mod_time`. Refused when the
    /// path is taken, was removed after that time, or bytes landed there moments ago.
    pub fn copy_adopt(
        &mut self,
        wall: Millis,
        path: &str,
        volume: &VolumeId,
        size: u64,
        checksum: &str,
        mod_time: u64,
    ) -> Result<(), ApiError> {
        let p = normalize(path).map_err(bad_path)?;
        let name = p.rsplit('/').next().unwrap_or_default();
        if super::volumes::NEVER_ADOPTED.contains(&name) {
            // A node's key, token or database dropped into a volume is never published.
            return Err(ApiError::forbidden("never_adopted", format!("{name} files are never adopted")));
        }
        if let Some(f) = self.live_file(&p).cloned() {
            // Known file, copy unknown here: add it when it holds the current content.
            if f.is_dir || !f.checksum.eq_ignore_ascii_case(checksum) {
                return Err(ApiError::conflict("exists", format!("cluster:{p} holds other content")));
            }
            self.copy_publish(wall, &p, &f.id, checksum, volume);
            return Ok(());
        }
        // Bytes older than the removal of their path are what that removal (or a move away)
        // left behind on a node that missed it, not a new file: adopting them would bring an
        // acknowledged remove or move back.
        if self.removed_since(&p, mod_time) {
            return Err(ApiError::conflict(
                "removed_since",
                format!("cluster:{p} was removed or moved away after these bytes were written"),
            ));
        }
        // Bytes a write landed here moments ago are that write's copy, its record on the way
        // (a put's copy lands before the put publishes its record): adopted, they would make
        // a record newer than the put's own, with another id, over it (the chaos test saw an
        // acknowledged put replaced so, and then a remove of it undone).
        if self.landed_unsettled(wall, volume, &p) {
            return Err(ApiError::conflict(
                "landed",
                format!("bytes landed at cluster:{p} moments ago and their record is on its way"),
            ));
        }
        self.file_publish(wall, &p, size, checksum, mod_time, &[(volume.clone(), self.id.clone())]).map(|_| ())
    }

    /// Record how a replication task of `path` ended: a failure escalates its backoff (30 s
    /// doubling, 1 h after 5 failures), a deferral makes it wait one base delay without counting
    /// a failure, a success clears it.
    pub fn repl_outcome(&mut self, wall: Millis, path: &str, outcome: TaskOutcome) {
        let Some(f) = self.live_file(path).cloned() else { return };
        let prev = f.repl.as_ref().map(|b| Backoff { attempts: b.attempts, next_at_ms: b.next_at_ms });
        let next = match outcome {
            TaskOutcome::Succeeded => {
                if !prev.as_ref().is_some_and(Backoff::is_set) {
                    return;
                }
                Backoff::default()
            }
            TaskOutcome::Failed => Backoff::after_failure(prev.as_ref(), wall.0, &self.planner_config()),
            TaskOutcome::Deferred => Backoff::after_deferral(prev.as_ref(), wall.0, &self.planner_config()),
        };
        let version = self.hlc.next(wall);
        let repl = ReplBackoff { attempts: next.attempts, next_at_ms: next.next_at_ms, version };
        let backoff = FileRecord { repl: Some(Box::new(repl)), locations: vec![], based_on: None, ..f };
        self.submit_record(wall, Record::File(backoff));
    }

    /// Every file's replication backoff, for the planner.
    pub fn repl_backoffs(&self) -> BTreeMap<FileId, Backoff> {
        self.meta.state().files_with_backoff().filter_map(|f| Some((f.id.clone(), backoff_of(f)?))).collect()
    }

    /// What this node must do to its own volumes so they follow the records: delete copies of
    /// removed files, rename copies of moved ones. A tombstone's copy is renamed when a live
    /// record of the same id lists this volume, and deleted only when none does.
    pub fn disk_actions(&self) -> Vec<DiskAction> {
        self.disk_actions_asked(true)
    }

    /// [`Node::disk_actions`]; with `hold`, none for a remove or move the leader has not taken
    /// yet (it may refuse it: [`crate::meta::records::BasedOn`]) or that waits for kept bytes
    /// ([`Node::rename_waits_for_kept`]), and none at all while the
    /// records may hold half a decision ([`crate::meta::machine::Meta::records_settling`]). Without, every action the
    /// records ask for: where a copy is, or is to be (a rescan reads the bytes still at a
    /// move's old path as the copy at its new one).
    fn disk_actions_asked(&self, hold: bool) -> Vec<DiskAction> {
        let own: BTreeMap<VolumeId, String> = self.local_volumes().into_iter().collect();
        if own.is_empty() || (hold && self.meta.records_settling()) {
            return vec![];
        }
        // The copies of removed files still on this node's volumes: usually none or few, so
        // the live records are looked at only for their ids (not gathered for the whole
        // namespace on every pass: a remove runs this pass at once).
        let own = &own;
        let mut puts_waiting: Option<std::collections::BTreeSet<&str>> = None;
        let pending: Vec<(&FileRecord, &Location, &String)> = self
            .meta
            .state()
            .removed_files_with_copies()
            .filter(|f| !f.is_dir)
            .filter(|f| !hold || !self.meta.awaiting_leader(&f.path))
            .filter(|f| {
                !hold || !puts_waiting.get_or_insert_with(|| self.meta.puts_awaiting_leader()).contains(f.path.as_str())
            })
            .flat_map(|f| {
                f.locations.iter().filter(|l| l.state != LocationState::Dropped).filter_map(move |l| {
                    let folder = own.get(&l.volume_id)?;
                    Some((f, l, folder))
                })
            })
            .collect();
        let mut actions = self.left_behind_actions(own, hold);
        if pending.is_empty() {
            return actions;
        }
        let ids: std::collections::BTreeSet<&FileId> = pending.iter().map(|(f, ..)| &f.id).collect();
        let mut live: BTreeMap<(&FileId, &VolumeId), (&str, &str)> = BTreeMap::new();
        let state = self.meta.state();
        for f in ids.iter().flat_map(|id| state.files_with_id(id)).filter(|f| !f.removed && !f.is_dir) {
            for l in f.locations.iter().filter(|l| own.contains_key(&l.volume_id) && l.state != LocationState::Dropped)
            {
                live.insert((&f.id, &l.volume_id), (&f.path, &l.checksum));
            }
        }
        actions.extend(
            pending
                .into_iter()
                .filter(|(f, l, _)| !hold || !self.rename_waits_for_kept(&l.volume_id, &f.path, &l.checksum))
                .filter_map(|(f, l, folder)| {
                    let to = live.get(&(&f.id, &l.volume_id)).copied().or_else(|| self.late_copy_home(f, l));
                    disk_action_of(f, l, folder, to)
                }),
        );
        actions
    }

    /// Where a copy `l` of the moved file whose tombstone is `f` goes when the moved file's
    /// record does not list its volume: a copy made after the move was decided (a pull on the
    /// other side of a partition, merged into the tombstone) holds the moved file's content
    /// all the same. It is renamed to the moved file's path and published there
    /// ([`Node::removed_copy_renamed`]), not deleted (simulator `--races` seed 6443: a move
    /// decided from a record older than a copy pulled since deleted that copy, the file's
    /// only good one).
    fn late_copy_home<'a>(&'a self, f: &'a FileRecord, l: &Location) -> Option<(&'a str, &'a str)> {
        if l.checksum.is_empty() || !l.state.is_healthy() {
            return None;
        }
        self.meta
            .state()
            .files_with_id(&f.id)
            .filter(|g| !g.removed && !g.is_dir && g.path != f.path && g.checksum.eq_ignore_ascii_case(&l.checksum))
            .map(|g| (g.path.as_str(), g.checksum.as_str()))
            .last()
    }

    /// The renames of copies moves left behind at paths whose record is live again
    /// ([`Node::left_behind_rename`]) on this node's volumes `own`; with `hold`, not while the
    /// move or the old path's write waits for the leader, nor while kept bytes are to go back
    /// there first.
    fn left_behind_actions(&self, own: &BTreeMap<VolumeId, String>, hold: bool) -> Vec<DiskAction> {
        let mut out = Vec::new();
        for old in self.meta.state().left_behind_paths() {
            for (volume, folder) in own {
                let Some((to, sum)) = self.left_behind_rename(old, volume) else { continue };
                let held = self.meta.awaiting_leader(old)
                    || self.meta.awaiting_leader(&to)
                    || self.rename_waits_for_kept(volume, old, &sum);
                if hold && held {
                    continue;
                }
                out.push(DiskAction::Rename {
                    volume: volume.clone(),
                    folder: folder.clone(),
                    from: old.to_string(),
                    to,
                });
            }
        }
        out
    }

    /// Whether the copy with `checksum` on `volume` of the moved or removed file at `path` is
    /// bytes an overwrite kept aside there (bytes landed over them since, their write refused
    /// or lost to the move): nothing is renamed or deleted there until they are back in place
    /// ([`crate::storage::landed::KeptFate::Restore`]), or the rename would carry the landed
    /// bytes to the new path as the moved file's copy and the kept ones would go. After a
    /// restart, until a rescan found what is kept, any copy may be (simulator `--races` seed
    /// 6396: a peer's pull read the landed bytes at the old path as the moved copy and marked
    /// it stale).
    fn rename_waits_for_kept(&self, volume: &VolumeId, path: &str, checksum: &str) -> bool {
        self.kept_unwalked.contains(volume) || self.landed.keeps(volume, path, checksum)
    }

    /// A rescan of this run walked `volume`: the bytes kept aside on it are known
    /// ([`Node::kept_note`]).
    pub fn kept_walked(&mut self, volume: &VolumeId) {
        self.kept_unwalked.remove(volume);
    }

    /// Whether `action` (from [`Node::disk_actions`], some time ago) is still what the records
    /// ask for, now: checked again just before it is carried out, under the landing lock, so a
    /// delete or rename decided before a new put landed at that path never destroys the new
    /// bytes (a put after `rm` or after `mv`, whose record lists this volume by now).
    pub fn disk_action_holds(&self, action: &DiskAction) -> bool {
        let (volume, path) = match action {
            DiskAction::Delete { volume, path, .. } => (volume, path),
            DiskAction::Rename { volume, from, .. } => (volume, from),
        };
        let Some(folder) = self.local_volume(volume.as_str()).map(|v| v.subpath.clone()) else { return false };
        if let DiskAction::Rename { from, .. } = action {
            if self.meta.state().file(from).is_some_and(|f| !f.removed) {
                // A copy a move left behind under a live record ([`Node::left_behind_rename`]).
                if self.meta.records_settling() {
                    return false;
                }
                let own = BTreeMap::from([(volume.clone(), folder)]);
                return self.left_behind_actions(&own, true).iter().any(|a| a == action);
            }
        }
        let Some(f) = self.meta.state().file(path).filter(|f| f.removed && !f.is_dir) else { return false };
        if self.meta.awaiting_leader(path) || self.meta.records_settling() || self.meta.put_awaits_leader(path) {
            return false;
        }
        let Some(l) = f.locations.iter().find(|l| &l.volume_id == volume && l.state != LocationState::Dropped) else {
            return false;
        };
        if self.rename_waits_for_kept(volume, path, &l.checksum) {
            return false;
        }
        // As `disk_actions` finds it: the last live record of the id with a copy on the volume;
        // else a moved record of that content (a copy made after the move was decided).
        let live = self
            .meta
            .state()
            .files_with_id(&f.id)
            .filter(|g| !g.removed && !g.is_dir)
            .filter_map(|g| {
                let m = g.locations.iter().find(|m| &m.volume_id == volume && m.state != LocationState::Dropped)?;
                Some((g.path.as_str(), m.checksum.as_str()))
            })
            .last()
            .or_else(|| self.late_copy_home(f, l));
        disk_action_of(f, l, &folder, live).as_ref() == Some(action)
    }

    /// A copy of a moved file renamed from `from` to `to` on `volume` (`moved`: bytes were
    /// there to move): dropped at the old path ([`Node::removed_copy_dropped`]), and published
    /// at the new one when the moved file's record (the same id) does not list that volume yet
    /// (a copy made after the move was decided: [`Node::late_copy_home`]), in the state its old
    /// entry had, as a re-label of the same content. Not when nothing was moved, nor when the
    /// node holds a current copy of the file on another volume already (a copy counts once per
    /// node).
    pub fn removed_copy_renamed(&mut self, wall: Millis, from: &str, to: &str, volume: &VolumeId, moved: bool) -> bool {
        let old = self.meta.state().file(from).filter(|f| f.removed).and_then(|f| {
            let l = f.locations.iter().find(|l| &l.volume_id == volume && l.state.is_healthy())?;
            Some((f.id.clone(), l.clone()))
        });
        let dropped = self.removed_copy_dropped(wall, from, volume);
        let (Some((id, old)), true) = (old, moved) else { return dropped };
        let Some(g) = self.live_file(to).filter(|g| g.id == id).cloned() else { return dropped };
        let listed = g.locations.iter().any(|l| &l.volume_id == volume && l.state != LocationState::Dropped);
        let twin = g.locations.iter().any(|l| l.node_id == self.id && &l.volume_id != volume && g.is_current(l));
        if listed || twin || !g.checksum.eq_ignore_ascii_case(&old.checksum) || self.volume_removed(volume) {
            return dropped;
        }
        let loc = old.relabeled(old.state, self.hlc.next(wall));
        self.submit_record(wall, Record::File(FileRecord { locations: vec![loc], based_on: None, ..g }));
        dropped
    }

    /// Mark the copy on `volume` of the removed file at `path` dropped, once its bytes are
    /// deleted or renamed away; nothing when the path holds a live record again by now (a put
    /// after `rm` or `mv`): that record's copy there is new bytes, not the ones that went.
    /// A copy a move left behind under a live record ([`Node::left_behind_rename`]) is marked
    /// dropped there too once renamed away.
    pub fn removed_copy_dropped(&mut self, wall: Millis, path: &str, volume: &VolumeId) -> bool {
        let removed = self.meta.state().file(path).is_some_and(|f| f.removed);
        if !removed && self.left_behind_rename(path, volume).is_none() {
            return false;
        }
        self.copy_mark(wall, path, volume, LocationState::Dropped, "")
    }

    /// Whether `sender` may have this node delete a copy (`store/delete`): for a user's remove
    /// the record must be a tombstone here with no live record of its id on that volume; for
    /// a drop task `sender` must hold the lease of `term` and the file must keep as many other
    /// current copies as it wants. Returns the volume's folder.
    pub fn authorize_delete(&self, wall: Millis, sender: &NodeId, req: &DeleteRequest) -> Result<String, ApiError> {
        let p = normalize(&req.path).map_err(bad_path)?;
        let vol = self
            .local_volume(req.volume_id.as_str())
            .ok_or_else(|| ApiError::not_found("unknown_volume", "the volume is not on this node"))?;
        let refuse = |why: &str| ApiError::conflict("not_authorized", why.to_string());
        let Some(f) = self.meta.state().file(&p) else {
            return Err(refuse("this node knows no record of that path"));
        };
        match req.term {
            None => {
                if !f.removed {
                    return Err(refuse("the file is not removed in this node's records (yet)"));
                }
                let live_elsewhere = self.meta.state().files_with_id(&f.id).any(|g| {
                    !g.removed
                        && g.locations.iter().any(|l| l.volume_id == req.volume_id && l.state != LocationState::Dropped)
                });
                if live_elsewhere {
                    return Err(refuse("the copy belongs to a moved file"));
                }
            }
            Some(term) => {
                let now = self.clock.peek(wall);
                let lease = self.meta.leader(now);
                if !lease.is_some_and(|l| l.term.0 == term && &l.holder == sender) {
                    return Err(refuse("the sender does not hold the lease of that term"));
                }
                self.check_drop(wall, f, &req.volume_id)?;
            }
        }
        Ok(vol.subpath)
    }

    /// A copy on `volume` may be dropped only while current copies on other volumes remain on
    /// `wanted` different nodes, each this node or ONLINE or DEGRADED at wall time `wall`: a
    /// copy on a node UNKNOWN, briefly OFFLINE, in maintenance or draining still counts against
    /// making an extra copy, but never toward deleting one.
    pub fn check_drop(&self, wall: Millis, f: &FileRecord, volume: &VolumeId) -> Result<(), ApiError> {
        let wanted = namespace::wanted_copies(self.meta.state(), f) as usize;
        let now = self.clock.peek(wall);
        let up =
            |n: &crate::NodeId| *n == self.id || crate::storage::placement::node_usable(self.members.state(n, now));
        // Copies count once per node: N copies mean N nodes.
        let others: std::collections::BTreeSet<&crate::NodeId> = f
            .locations
            .iter()
            .filter(|l| &l.volume_id != volume && f.is_current(l) && up(&l.node_id))
            .map(|l| &l.node_id)
            .collect();
        let others = others.len();
        if f.removed || others < wanted {
            return Err(ApiError::conflict(
                "not_authorized",
                format!("only {others} other node(s) hold a current copy (wanted {wanted}); the copy stays"),
            ));
        }
        Ok(())
    }

    /// Whether a rename on disk of a copy on `volume` from `from` to `to` is what this node's
    /// records say happened (`store/rename`). Returns the volume's folder.
    pub fn authorize_rename(&self, volume: &VolumeId, from: &str, to: &str) -> Result<String, ApiError> {
        let from = normalize(from).map_err(bad_path)?;
        let to = normalize(to).map_err(bad_path)?;
        let vol = self
            .local_volume(volume.as_str())
            .ok_or_else(|| ApiError::not_found("unknown_volume", "the volume is not on this node"))?;
        let copy = |f: &FileRecord| {
            f.locations.iter().find(|l| &l.volume_id == volume && l.state != LocationState::Dropped).cloned()
        };
        let old = self.meta.state().file(&from).filter(|f| f.removed).and_then(|f| Some((f.id.clone(), copy(f)?)));
        let new = self.live_file(&to).and_then(|f| Some((f.id.clone(), copy(f)?)));
        match (old, new) {
            // The same file, and the copy at the new name still this content: a put over the
            // new name since the move is other bytes, which the old ones must not replace.
            // Unless the copy's bytes are kept aside there, an overwrite's landed over them
            // (`rename_waits_for_kept`): they go back in place first, or the landed ones would
            // be renamed as the moved file's copy (simulator `--races` seed 5181: the mover's
            // rename took a refused put's bytes).
            (Some((a, o)), Some((b, n))) if a == b && o.checksum.eq_ignore_ascii_case(&n.checksum) => {
                if self.rename_waits_for_kept(volume, &from, &o.checksum) {
                    return Err(ApiError::conflict(
                        "kept_first",
                        "the copy's bytes are kept aside at the old name and go back in place first",
                    ));
                }
                Ok(vol.subpath)
            }
            _ => Err(ApiError::conflict("not_authorized", "this node's records do not show that move (yet)")),
        }
    }

    /// Whether the rename on disk of the copy on `volume` from `from` to `to` is done already:
    /// the old path's tombstone lists that copy dropped and the live record of the same id at
    /// `to` lists the volume (this node's reconciler renamed it before the mover asked).
    pub fn rename_done(&self, volume: &VolumeId, from: &str, to: &str) -> bool {
        let (Ok(from), Ok(to)) = (normalize(from), normalize(to)) else { return false };
        let Some(old) = self.meta.state().file(&from).filter(|f| f.removed) else { return false };
        let dropped = old.locations.iter().any(|l| &l.volume_id == volume && l.state == LocationState::Dropped);
        let moved_here = self.live_file(&to).is_some_and(|f| {
            f.id == old.id && f.locations.iter().any(|l| &l.volume_id == volume && l.state != LocationState::Dropped)
        });
        dropped && moved_here
    }

    /// The leader's current lease term, when this node holds it.
    pub fn leader_term(&self, wall: Millis) -> Option<u64> {
        let now = self.clock.peek(wall);
        self.meta.is_leader(now).then(|| self.meta.known_lease().map(|l| l.term.0)).flatten()
    }

    /// Whether `sender` is the leader of `term` in this node's view (a task's warrant).
    pub fn is_leader_of(&self, wall: Millis, sender: &NodeId, term: u64) -> bool {
        let now = self.clock.peek(wall);
        self.meta.leader(now).is_some_and(|l| l.term.0 == term && &l.holder == sender)
    }

    /// A numeric cluster setting, when set.
    pub fn setting_number(&self, key: &str) -> Option<f64> {
        match self.meta.state().get(crate::meta::records::RecordKind::Setting, key) {
            Some(Record::Setting(s)) if !s.removed => s.value.as_f64(),
            _ => None,
        }
    }

    /// This node's copies of current content due for a scrub (last checked at least
    /// `min_age_ms` ago), least recently checked first.
    /// `GET meta/file?path=`: whether this node's records hold a live file at the path. A
    /// node's rescan asks the leader before it adopts a file it found with no record: its own
    /// records may lag (just restarted, cut off), and an adoption is a newer record that would
    /// override the file's real one.
    ///
    /// With `mtime=` (the found bytes' modification time, unix ms) it also says whether they
    /// may be adopted (`adoptable`): no live file there, and no removal (or move away) of the
    /// path after the bytes were written ([`Node::adoptable`]). The asking node's own records
    /// may not hold the removal yet, and "not live" alone would let it bring the path back.
    pub fn answer_file_exists(&self, target: &str) -> super::Reply {
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        let raw = query.split('&').find_map(|kv| kv.strip_prefix("path=")).unwrap_or("");
        let mtime = query.split('&').find_map(|kv| kv.strip_prefix("mtime=")).map(str::parse::<u64>);
        let decoded = transfer::decode_query_value(raw);
        match (normalize(&decoded), mtime) {
            (Err(e), _) => super::Reply::error(super::ErrorKind::Invalid, "bad_path", e.to_string()),
            (_, Some(Err(_))) => super::Reply::error(super::ErrorKind::Invalid, "bad_mtime", "mtime is unix ms"),
            (Ok(p), mtime) => {
                let mut body = json!({ "path": p, "live": self.live_file(&p).is_some() });
                if let Some(Ok(mtime)) = mtime {
                    body["adoptable"] = json!(self.adoptable(&p, mtime));
                }
                super::Reply::ok(body)
            }
        }
    }

    /// Whether bytes found at `path`, last modified at `mtime_ms` (unix ms), with no record of
    /// their own, may be adopted as a new file by these records: no live file is there, and
    /// the path was not removed or moved away after they were written.
    pub fn adoptable(&self, path: &str, mtime_ms: u64) -> bool {
        self.live_file(path).is_none() && !self.removed_since(path, mtime_ms)
    }

    /// Whether the records hold a removal of `path` (a remove, or a move away) no older than
    /// bytes written there at `mtime_ms`: those bytes are what it left behind.
    fn removed_since(&self, path: &str, mtime_ms: u64) -> bool {
        self.meta.state().file(path).is_some_and(|f| f.removed && mtime_ms <= f.version.wall_ms)
    }

    /// This node's current copies not checked (written, pulled, scrubbed or verified) for
    /// longer than [`SCRUB_BOUND_MS`]: nonzero means the scrub's settings or this node's load
    /// broke the promise that every copy is re-checked within 14 days.
    pub fn scrub_overdue(&self, wall: Millis) -> u64 {
        self.scrub_figures(wall).0
    }

    /// Age of the oldest check among this node's current copies (a check stamped by a clock
    /// ahead of ours counts as made now); `None` with no copies.
    pub fn scrub_oldest_age(&self, wall: Millis) -> Option<u64> {
        self.scrub_figures(wall).1
    }

    /// [`Node::scrub_overdue`] and [`Node::scrub_oldest_age`] in one walk over the records
    /// (`/metrics` reports both).
    pub fn scrub_figures(&self, wall: Millis) -> (u64, Option<u64>) {
        let own: std::collections::BTreeSet<VolumeId> = self.local_volumes().into_iter().map(|(v, _)| v).collect();
        if own.is_empty() {
            return (0, None);
        }
        let (mut overdue, mut oldest) = (0, None);
        for f in self.meta.state().files().filter(|f| !f.removed && !f.is_dir) {
            for l in f.locations.iter().filter(|l| f.is_current(l) && own.contains(&l.volume_id)) {
                let age = wall.0.saturating_sub(l.updated.wall_ms);
                overdue += u64::from(age > SCRUB_BOUND_MS);
                oldest = oldest.max(Some(age));
            }
        }
        (overdue, oldest)
    }

    pub fn scrub_queue(&self, wall: Millis, min_age_ms: u64) -> Vec<LocalCopy> {
        let own: BTreeMap<VolumeId, String> = self.local_volumes().into_iter().collect();
        let mut out: Vec<(u64, LocalCopy)> = Vec::new();
        for f in self.meta.state().files().filter(|f| !f.removed && !f.is_dir) {
            for l in f.locations.iter().filter(|l| f.is_current(l)) {
                let Some(folder) = own.get(&l.volume_id) else { continue };
                // A check stamped by a clock ahead of ours counts as made now.
                if l.updated.wall_ms.min(wall.0).saturating_add(min_age_ms) > wall.0 {
                    continue;
                }
                out.push((l.updated.wall_ms, LocalCopy::of(f, &l.volume_id, folder)));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.path.cmp(&b.1.path)));
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// What this node's records say about one of its volumes: every live file with its copy
    /// there (if any, and whether it is current), the paths of removed files whose copy there
    /// is still to be deleted or renamed, and, of those, the ones a move's rename is to bring
    /// to a live path (`arriving`, by the rule [`Node::disk_actions`] renames by). For a
    /// rescan.
    pub fn volume_facts(&self, volume: &VolumeId) -> VolumeFacts {
        let mut facts = VolumeFacts::default();
        // The reconciler's own renames: a chain of moves (a → b → c before the rename ran)
        // leaves several old paths, any of which may hold the bytes.
        for a in self.disk_actions_asked(false) {
            if let DiskAction::Rename { volume: v, from, to, .. } = a {
                if &v == volume {
                    facts.arriving.entry(to).or_default().push(from);
                }
            }
        }
        for f in self.meta.state().files().filter(|f| !f.is_dir) {
            let here = f.locations.iter().find(|l| &l.volume_id == volume && l.state != LocationState::Dropped);
            if f.removed {
                if here.is_some() {
                    facts.pending.insert(f.path.clone());
                }
                continue;
            }
            facts.live.insert(
                f.path.clone(),
                LiveFile {
                    id: f.id.clone(),
                    size: f.size,
                    checksum: f.checksum.clone(),
                    copy: here.map(|l| CopyFact {
                        current: f.is_current(l),
                        of_this_content: l.checksum.eq_ignore_ascii_case(&f.checksum),
                        checked_ms: l.updated.wall_ms,
                    }),
                },
            );
        }
        facts
    }
}

/// One copy on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalCopy {
    pub path: String,
    pub file: FileId,
    pub volume: VolumeId,
    pub folder: String,
    pub size: u64,
    pub checksum: String,
}

impl LocalCopy {
    fn of(f: &FileRecord, volume: &VolumeId, folder: &str) -> LocalCopy {
        LocalCopy {
            path: f.path.clone(),
            file: f.id.clone(),
            volume: volume.clone(),
            folder: folder.to_string(),
            size: f.size,
            checksum: f.checksum.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeFacts {
    pub live: BTreeMap<String, LiveFile>,
    /// Removed files whose copy on the volume is still to be deleted or renamed.
    pub pending: std::collections::BTreeSet<String>,
    /// Copies a move's rename is still to bring to their new path: new path → the paths the
    /// bytes may lie at until then (more than one after a chain of moves).
    pub arriving: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveFile {
    pub id: FileId,
    pub size: u64,
    pub checksum: String,
    pub copy: Option<CopyFact>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyFact {
    pub current: bool,
    /// The copy was recorded with the file's present content (a stale one of those may be
    /// right again: marked stale while its node was away).
    pub of_this_content: bool,
    /// When the copy was last written or verified (unix ms).
    pub checked_ms: u64,
}

/// The replication backoff a live file's record holds, if any is set.
fn backoff_of(f: &FileRecord) -> Option<Backoff> {
    let b = f.repl.as_ref().filter(|_| crate::meta::state::backoff_set(f))?;
    Some(Backoff { attempts: b.attempts, next_at_ms: b.next_at_ms })
}
