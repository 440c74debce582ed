//! The state each service keeps in the node handle ([`crate::node::handle::Shared`]), apart
//! from the code that uses it, so that the handle depends on no service: the chunked
//! transfer's upload sessions, writes under way and landing lock (used by
//! `crate::services::store_service` and `crate::services::drive`), and replication's pulls in flight and disk-work
//! figures (used by `crate::services::replication`).

use crate::disk::hash::FileHash;
use crate::disk::sync::{GroupSync, SyncFigures};
use crate::sync::lock;
use axum::body::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use shoal_core::node::chores::ReplStats;
use shoal_core::node::ApiError;
use shoal_core::storage::planner::Task;
use shoal_core::storage::transfer::{UploadSession, Uploads};
use shoal_core::{FileId, VolumeId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct StoreService {
    /// The open upload sessions (their rules are the core's `Uploads`) and, by session id, the
    /// whole-file hash of each, taken as its chunks arrive.
    pub(crate) sessions: Mutex<Sessions>,
    /// Bytes put in place that the records may not account for yet.
    pub landed: Landed,
    /// Writes under way per volume that no session shows (a local copy of a put, a commit
    /// between its session and its landing), and the grouped fsyncs they share.
    pub(crate) writers: Arc<Mutex<BTreeMap<VolumeId, Writers>>>,
    /// How the copies' fsyncs went, for `/metrics`.
    pub sync_figures: Arc<SyncFigures>,
}

/// The writes under way on one volume.
pub(crate) struct Writers {
    count: usize,
    /// Their fsyncs, grouped while any is under way (the volume folder is open only then, so a
    /// volume that is removed is not held open by shoal).
    sync: Option<Arc<GroupSync>>,
}

/// A write to a volume under way, until dropped: the volume is not retired meanwhile.
pub struct WriteGuard {
    writers: Arc<Mutex<BTreeMap<VolumeId, Writers>>>,
    volume: VolumeId,
    sync: Option<Arc<GroupSync>>,
    figures: Arc<SyncFigures>,
}

impl WriteGuard {
    /// The volume written to.
    pub fn volume(&self) -> &VolumeId {
        &self.volume
    }

    /// Make `file` (a part file or a folder of this volume) durable, in one flush with the other
    /// writes to the volume that ask at the same time ([`GroupSync`]). Blocks.
    pub fn sync(&self, file: &std::fs::File) -> std::io::Result<()> {
        match &self.sync {
            Some(group) => group.sync(file),
            None => {
                self.figures.lone_sync();
                file.sync_all()
            }
        }
    }

    /// Open `dir` and make its entries durable, as [`WriteGuard::sync`]. A file system that
    /// cannot fsync a folder at all (`EINVAL`, `ENOTSUP`: some network and FUSE ones) is no
    /// error; any other failure is.
    pub fn sync_folder(&self, dir: &std::path::Path) -> std::io::Result<()> {
        crate::disk::sync::folder_sync_result(self.sync(&std::fs::File::open(dir)?))
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut w = lock(&self.writers);
        if let Some(n) = w.get_mut(&self.volume) {
            n.count -= 1;
            if n.count == 0 {
                w.remove(&self.volume);
            }
        }
    }
}

impl StoreService {
    /// Mark a write to `volume`, whose folder is `folder`, under way until the guard is dropped.
    /// Blocks briefly (opens the folder when no other write is under way there).
    pub fn writing(&self, volume: &VolumeId, folder: &std::path::Path) -> WriteGuard {
        let mut w = lock(&self.writers);
        let figures = self.sync_figures.clone();
        let entry = w.entry(volume.clone()).or_insert_with(|| Writers {
            count: 0,
            sync: GroupSync::for_folder(folder, figures.clone()).map(Arc::new),
        });
        entry.count += 1;
        WriteGuard { writers: self.writers.clone(), volume: volume.clone(), sync: entry.sync.clone(), figures }
    }
}

/// The open upload sessions and the running whole-file hash of each, by session id.
#[derive(Default)]
pub(crate) struct Sessions {
    pub(crate) book: Uploads,
    pub(crate) hashes: BTreeMap<String, Arc<Mutex<InOrderHash>>>,
}

impl Sessions {
    pub(crate) fn remove(&mut self, id: &str) -> Option<UploadSession> {
        self.hashes.remove(id);
        self.book.remove(id)
    }
}

/// The whole-file SHA-256 of an upload, taken as its chunks arrive, so the commit need not
/// read the file back. Chunks that come ahead of their turn wait (a few, in memory); past
/// that, or when a chunk is sent again after it was hashed, the hash is given up and the
/// commit reads the part file instead.
pub(crate) struct InOrderHash {
    hasher: FileHash,
    next: u64,
    early: BTreeMap<u64, Bytes>,
    given_up: bool,
}

/// Most chunks held in memory waiting for an earlier one.
const EARLY_CHUNKS_MAX: usize = 4;

impl InOrderHash {
    pub(crate) fn new() -> InOrderHash {
        InOrderHash { hasher: FileHash::new(), next: 0, early: BTreeMap::new(), given_up: false }
    }

    /// The whole-file hash as it stands when chunk `index` is the next it takes: a copy to
    /// advance over that chunk in the same pass as the chunk's own digest
    /// ([`FileHash::update_with_chunk_sum`]), handed back to [`InOrderHash::offer`].
    pub(crate) fn at(&self, index: u64) -> Option<FileHash> {
        (!self.given_up && self.next == index).then(|| self.hasher.clone())
    }

    /// Chunk `index` (its bytes verified) was written. `advanced`: the hash of [`InOrderHash::at`]
    /// for this index, advanced over these bytes; taken when chunk `index` is still the next
    /// (the state only moves when the next chunk is taken, so it is the one that was copied).
    pub(crate) fn offer(&mut self, index: u64, bytes: Bytes, advanced: Option<(u64, FileHash)>) {
        if self.given_up {
            return;
        }
        let too_early = index != self.next && self.early.len() >= EARLY_CHUNKS_MAX;
        if index < self.next || self.early.contains_key(&index) || too_early {
            // Sent again (perhaps with other bytes), or too far ahead: read the file at commit.
            self.given_up = true;
            self.early.clear();
            return;
        }
        match advanced {
            Some((at, hash)) if at == index && index == self.next => {
                self.hasher = hash;
                self.next += 1;
            }
            _ => {
                self.early.insert(index, bytes);
            }
        }
        while let Some(b) = self.early.remove(&self.next) {
            self.hasher.update(&b);
            self.next += 1;
        }
    }

    /// The whole-file SHA-256 when every one of `chunks` chunks was hashed in order.
    pub(crate) fn finish(&self, chunks: u64) -> Option<String> {
        (!self.given_up && self.next == chunks).then(|| self.hasher.hex())
    }
}

/// Landing bytes: the rename into place, under one lock so two landings at one path never both
/// pass the check. Which bytes are unsettled, and what may land over what, is the core's
/// (`shoal_core::storage::landed`, `Node::landed_*`).
#[derive(Default)]
pub struct Landed {
    pub(crate) landing: Mutex<()>,
}

/// Another write's bytes landed at this path moments ago and its record has not settled.
#[derive(Debug)]
pub struct WriteConflict;

impl WriteConflict {
    pub fn api_error(&self) -> ApiError {
        ApiError::conflict(
            "write_conflict",
            "another write of this path landed on this volume moments ago and is not settled yet; try again",
        )
    }
}

/// Replication bookkeeping of this node's shell: the pulls it runs now and the disk work it
/// did (what the core decided and counted is in [`Node::repl_stats`]).
///
/// [`Node::repl_stats`]: shoal_core::node::Node::repl_stats
#[derive(Default)]
pub struct ReplState {
    /// Figures for `repl status`.
    pub(crate) stats: Mutex<DiskStats>,
    /// When this process started, on the file clock: part files older than that belong to
    /// no upload.
    pub(crate) started: Mutex<Option<shoal_core::Millis>>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskStats {
    pub disk_deletes: u64,
    pub disk_renames: u64,
    /// Bytes an overwrite kept aside and put back, its record never having come.
    pub kept_restored: u64,
    pub adopted: u64,
    pub rescans: u64,
}

impl ReplState {
    /// `repl status` figures: the core's counts (`core`), this shell's disk work, the leader's
    /// task table `in_flight` and the pulls running here (`running`, the core's worker table).
    pub fn stats(&self, core: &ReplStats, in_flight: Vec<Task>, running: Vec<FileId>) -> Value {
        let mut stats = json!(core);
        if let (Some(o), Value::Object(d)) = (stats.as_object_mut(), json!(*lock(&self.stats))) {
            o.extend(d);
        }
        json!({ "stats": stats, "inFlight": in_flight, "running": running })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b))
    }

    #[test]
    fn the_in_order_hash_waits_for_early_chunks_and_gives_up_on_resent_ones() {
        let parts: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![i; 100])).collect();
        let whole: Vec<u8> = parts.iter().flat_map(|b| b.to_vec()).collect();

        let mut h = InOrderHash::new();
        for i in [1, 0, 3, 2] {
            h.offer(i, parts[i as usize].clone(), None);
        }
        assert_eq!(h.finish(4), Some(sha(&whole)), "chunks a little out of order still hash in order");
        assert_eq!(h.finish(5), None, "a missing chunk means no hash");

        let mut h = InOrderHash::new();
        h.offer(0, parts[0].clone(), None);
        h.offer(0, Bytes::from(vec![9u8; 100]), None);
        assert_eq!(h.finish(1), None, "a chunk sent again may carry other bytes: read the file instead");

        let mut h = InOrderHash::new();
        for i in 1..=(EARLY_CHUNKS_MAX as u64 + 1) {
            h.offer(i, parts[0].clone(), None);
        }
        assert!(h.given_up && h.early.is_empty(), "too many early chunks are not kept in memory");

        let mut h = InOrderHash::new();
        for i in 1..=EARLY_CHUNKS_MAX as u64 {
            h.offer(i, parts[0].clone(), None);
        }
        h.offer(0, parts[0].clone(), None);
        assert!(h.finish(EARLY_CHUNKS_MAX as u64 + 1).is_some(), "the chunk that drains them is taken");
    }

    /// A chunk hashed in one pass with the whole file (`at`, then `offer` with the advanced
    /// hash) gives the same whole-file SHA-256; an advanced hash that no longer fits is not taken.
    #[test]
    fn a_chunk_hashed_with_its_file_in_one_pass_advances_the_in_order_hash() {
        let parts: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![i; 4096])).collect();
        let whole: Vec<u8> = parts.iter().flat_map(|b| b.to_vec()).collect();
        let advanced = |h: &InOrderHash, i: u64| {
            h.at(i).map(|mut f| {
                assert_eq!(hex::encode(f.update_with_chunk_sum(&parts[i as usize])), sha(&parts[i as usize]));
                (i, f)
            })
        };
        let mut h = InOrderHash::new();
        assert!(h.at(1).is_none(), "only the next chunk's hash is handed out");
        let early = advanced(&h, 0);
        h.offer(1, parts[1].clone(), None);
        h.offer(0, parts[0].clone(), early);
        let two = advanced(&h, 2);
        let three = advanced(&h, 2).map(|(_, f)| (3, f));
        h.offer(3, parts[3].clone(), three);
        h.offer(2, parts[2].clone(), two);
        assert_eq!(h.finish(4), Some(sha(&whole)), "every chunk in order, whether it came advanced or not");

        // An advanced hash of another index is ignored: the bytes are hashed the usual way.
        let mut h = InOrderHash::new();
        h.offer(0, parts[0].clone(), None);
        let other = advanced(&h, 1).map(|(_, f)| (0, f));
        h.offer(1, parts[1].clone(), other);
        assert_eq!(h.finish(2), Some(sha(&whole[..8192])));
    }
}

/// The jobs running on this node: each run's stop flag, which its script's interrupt hook
/// reads (`services::jobs`).
#[derive(Default)]
pub struct JobsState {
    pub stops: std::sync::Mutex<BTreeMap<(shoal_core::ids::JobId, u32), Arc<std::sync::atomic::AtomicBool>>>,
}

/// What runs a job's script.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobsEngine {
    /// QuickJS, each run on its own thread (`services::jobs::script`).
    #[default]
    QuickJs,
    /// The simulator's: no JavaScript (a real thread would run outside the simulated clock and
    /// break a seed's replay); the job's kind and args say what to do, natively, on the node's
    /// own task (`services::jobs::simulated`).
    Simulated,
}
