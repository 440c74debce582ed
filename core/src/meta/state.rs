//! The record sets of one node (spec: "Metadata store (ACMS)"): every record by kind and key,
//! merged register by register as they arrive (from the local node, a leader's append, a
//! catch-up page or a snapshot, in any order, any number of times).
//!
//! Tombstones (`removed` records) are kept 7 days by their version's wall time and then purged
//! on every node; a purged key remembers its tombstone's version (up to a bound), so an older
//! copy arriving late from a stale peer cannot bring the record back. The digest is an XOR of
//! per-record hashes, updated incrementally, so two nodes can compare their whole state cheaply.

use crate::hlc::Version;
use crate::ids::FileId;
use crate::meta::records::{FileRecord, LocationState, Policy, Record, RecordKey, RecordKind, RecordMap, RecordSet};
use crate::time::{Millis, DAY_MS};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

pub const TOMBSTONE_TTL_MS: u64 = 7 * DAY_MS;
/// Most purged keys remembered; the oldest are forgotten first.
pub const PURGED_MAX: usize = 100_000;

/// What one [`MetaState::purge`] changed among the purged keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Purge {
    /// The tombstones purged, by key, with their versions (remembered from now on).
    pub purged: Vec<(RecordKey, Version)>,
    /// Remembered keys forgotten to stay within [`PURGED_MAX`] (oldest tombstones first; may
    /// include keys purged in this very call).
    pub forgotten: Vec<RecordKey>,
}

#[derive(Clone, Debug, Default)]
pub struct MetaState {
    records: RecordMap,
    digest: [u8; 32],
    purged: BTreeMap<RecordKey, Version>,
    /// The paths of the file records (live and removed) of each file id: a moved file's
    /// tombstone and its live record share the id, and the questions about a copy left behind
    /// by a move or a remove ask for them by id ([`MetaState::files_with_id`]), once per copy,
    /// which a scan of every record made quadratic in a large folder's removal.
    by_id: BTreeSet<(FileId, String)>,
    /// The paths of removed file records (tombstones, kept 7 days) that still list a copy not
    /// dropped: the disk reconciler looks for copies still to delete or rename among them
    /// ([`MetaState::removed_files_with_copies`]) on every pass, which a remove starts at once.
    tombstones: BTreeSet<String>,
    /// The paths of live files whose replication backoff is set (a failure counted or a wait):
    /// the planner reads them on every pass, and `/metrics` counts them, without a walk over
    /// every record ([`MetaState::files_with_backoff`]).
    backoffs: BTreeSet<String>,
    /// Each old path a live file was moved from (its record's `based_on` names another path),
    /// with the paths of those moved records.
    moved_from: BTreeMap<String, BTreeSet<String>>,
    /// The old paths of [`MetaState::moved_from`] whose record is live again (a newer write
    /// there won over the move's tombstone): the copies the move left there are renamed from
    /// the moved records' side ([`MetaState::left_behind`]).
    left_behind: BTreeSet<String>,
}

/// The path a live file record was moved from, if it was (and nothing changed its header
/// since).
fn moved_from_of(r: &Record) -> Option<String> {
    let Record::File(f) = r else { return None };
    if f.removed || f.is_dir {
        return None;
    }
    f.based_on.as_deref().map(|b| b.path.clone()).filter(|p| *p != f.path)
}

/// A record's share of the digest. Tombstones have none: two nodes that agree on every live
/// record agree, whether or not they still hold (or have purged) the same tombstones, so purge
/// timing differences between nodes never look like divergence.
fn record_hash(r: &Record) -> [u8; 32] {
    if r.is_removed() {
        return [0u8; 32];
    }
    let mut h = Sha256::new();
    r.hash_versions(&mut h);
    h.finalize().into()
}

fn tombstone_with_copies(f: &FileRecord) -> bool {
    f.removed && f.locations.iter().any(|l| l.state != LocationState::Dropped)
}

/// A live file whose replication backoff register holds anything back.
pub fn backoff_set(f: &FileRecord) -> bool {
    !f.removed && f.repl.as_ref().is_some_and(|b| b.attempts > 0 || b.next_at_ms > 0)
}

fn file_id(r: &Record) -> Option<&FileId> {
    match r {
        Record::File(f) => Some(&f.id),
        _ => None,
    }
}

fn xor_into(acc: &mut [u8; 32], h: &[u8; 32]) {
    for (a, b) in acc.iter_mut().zip(h) {
        *a ^= b;
    }
}

impl MetaState {
    pub fn new() -> MetaState {
        MetaState::default()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Hex digest of every live record's register versions; equal digests mean equal live
    /// record sets.
    pub fn digest(&self) -> String {
        hex::encode(self.digest)
    }

    pub fn get(&self, kind: RecordKind, key: &str) -> Option<&Record> {
        self.records.get(&(kind, key.to_string()))
    }

    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values()
    }

    /// Merge one record in. Returns the stored result when anything changed (to persist).
    pub fn apply(&mut self, incoming: &Record) -> Option<&Record> {
        let key = (incoming.kind(), incoming.key());
        if !self.purged.is_empty() {
            if let Some(tomb) = self.purged.get(&key) {
                if incoming.main_version() <= tomb {
                    return None;
                }
            }
        }
        let is_file = key.0 == RecordKind::File;
        match self.records.entry(key.clone()) {
            std::collections::btree_map::Entry::Occupied(slot) => {
                let existing = slot.into_mut();
                let before = record_hash(existing);
                let id_before = file_id(existing).cloned();
                let from_before = moved_from_of(existing);
                if !existing.merge(incoming) {
                    return None;
                }
                let after = record_hash(existing);
                xor_into(&mut self.digest, &before);
                xor_into(&mut self.digest, &after);
                if let (Some(old), Record::File(f)) = (id_before, &*existing) {
                    if old != f.id {
                        self.by_id.remove(&(old, f.path.clone()));
                        self.by_id.insert((f.id.clone(), f.path.clone()));
                    }
                    if tombstone_with_copies(f) {
                        self.tombstones.insert(f.path.clone());
                    } else {
                        self.tombstones.remove(&f.path);
                    }
                    if backoff_set(f) {
                        self.backoffs.insert(f.path.clone());
                    } else {
                        self.backoffs.remove(&f.path);
                    }
                }
                if is_file {
                    let from_after = moved_from_of(existing);
                    self.index_move(&key.1, from_before, from_after);
                }
                self.records.get(&key)
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                let mut record = incoming.clone();
                if let Record::File(f) = &mut record {
                    f.canonicalize_locations();
                    self.by_id.insert((f.id.clone(), f.path.clone()));
                    if tombstone_with_copies(f) {
                        self.tombstones.insert(f.path.clone());
                    }
                    if backoff_set(f) {
                        self.backoffs.insert(f.path.clone());
                    }
                }
                xor_into(&mut self.digest, &record_hash(&record));
                let from_after = moved_from_of(&record);
                slot.insert(record);
                if is_file {
                    self.index_move(&key.1, None, from_after);
                }
                self.records.get(&key)
            }
        }
    }

    /// Set the record at `key` to `record` (`None`: no record), whatever the versions: the
    /// undo of a change of this node's own that the leader refused and no other node holds
    /// ([`crate::meta::machine::Meta`]). Never for a record from a peer: merges are
    /// [`MetaState::apply`].
    pub fn replace(&mut self, key: &RecordKey, record: Option<Record>) {
        if let Some(old) = self.records.remove(key) {
            xor_into(&mut self.digest, &record_hash(&old));
            if let Record::File(f) = &old {
                self.by_id.remove(&(f.id.clone(), f.path.clone()));
                self.tombstones.remove(&f.path);
                self.backoffs.remove(&f.path);
            }
            if key.0 == RecordKind::File {
                self.index_move(&key.1, moved_from_of(&old), None);
            }
        }
        if let Some(r) = record.filter(|r| (r.kind(), r.key()) == *key) {
            self.apply(&r);
        }
    }

    /// Keep [`MetaState::moved_from`] and [`MetaState::left_behind`] true after the record at
    /// `path` changed: it was moved from `before` and is moved from `after` now (`None`: not a
    /// live moved record); and `path` itself may be an old path whose record came back.
    fn index_move(&mut self, path: &str, before: Option<String>, after: Option<String>) {
        if before != after {
            if let Some(b) = &before {
                if let Some(set) = self.moved_from.get_mut(b) {
                    set.remove(path);
                    if set.is_empty() {
                        self.moved_from.remove(b);
                    }
                }
                self.refresh_left_behind(b);
            }
            if let Some(a) = &after {
                self.moved_from.entry(a.clone()).or_default().insert(path.to_string());
                self.refresh_left_behind(a);
            }
        }
        self.refresh_left_behind(path);
    }

    fn refresh_left_behind(&mut self, old: &str) {
        if !self.moved_from.contains_key(old) {
            self.left_behind.remove(old);
            return;
        }
        if self.file(old).is_some_and(|f| !f.removed && !f.is_dir) {
            self.left_behind.insert(old.to_string());
        } else {
            self.left_behind.remove(old);
        }
    }

    /// The paths some live file was moved from whose record is live again, in path order:
    /// usually none.
    pub fn left_behind_paths(&self) -> impl Iterator<Item = &str> {
        self.left_behind.iter().map(String::as_str)
    }

    /// The live file records moved from `old` (their `based_on` names it), in path order.
    pub fn moved_records_from<'a>(&'a self, old: &str) -> impl Iterator<Item = &'a FileRecord> + 'a {
        self.moved_from.get(old).into_iter().flatten().filter_map(|p| self.file(p))
    }

    /// The removed file records (tombstones) that list a copy not dropped yet, in path order.
    pub fn removed_files_with_copies(&self) -> impl Iterator<Item = &FileRecord> {
        self.tombstones.iter().filter_map(|p| self.file(p)).filter(|f| tombstone_with_copies(f))
    }

    /// The live files whose replication backoff is set, in path order.
    pub fn files_with_backoff(&self) -> impl Iterator<Item = &FileRecord> {
        self.backoffs.iter().filter_map(|p| self.file(p)).filter(|f| backoff_set(f))
    }

    /// The file records (live and removed) whose id is `id`, in path order.
    pub fn files_with_id<'a>(&'a self, id: &'a FileId) -> impl Iterator<Item = &'a FileRecord> + 'a {
        self.by_id
            .range((id.clone(), String::new())..)
            .take_while(move |(i, _)| i == id)
            .filter_map(|(_, p)| self.file(p))
            .filter(move |f| f.id == *id)
    }

    /// Drop tombstones older than the TTL at wall time `now`; returns the purged keys.
    pub fn purge_tombstones(&mut self, now: Millis) -> Vec<RecordKey> {
        self.purge(now).purged.into_iter().map(|(k, _)| k).collect()
    }

    /// Drop tombstones older than the TTL at wall time `now`; returns what changed among the
    /// purged keys, for the shell to persist (see [`Purge`]).
    pub fn purge(&mut self, now: Millis) -> Purge {
        let gone: Vec<RecordKey> = self
            .records
            .iter()
            .filter(|(_, r)| r.is_removed() && now.since(Millis(r.main_version().wall_ms)) > TOMBSTONE_TTL_MS)
            .map(|(k, _)| k.clone())
            .collect();
        let mut purged = Vec::with_capacity(gone.len());
        for k in gone {
            if let Some(r) = self.records.remove(&k) {
                xor_into(&mut self.digest, &record_hash(&r));
                if let Record::File(f) = &r {
                    self.by_id.remove(&(f.id.clone(), f.path.clone()));
                    self.tombstones.remove(&f.path);
                    self.backoffs.remove(&f.path);
                }
                let v = r.main_version().clone();
                self.remember_purged(k.clone(), v.clone());
                purged.push((k, v));
            }
        }
        let forgotten = self.forget_beyond_bound();
        Purge { purged, forgotten }
    }

    /// Put back purged keys read from disk (before any record is applied, so an older copy of a
    /// purged record is refused). A key given twice keeps its newest version. Returns the keys
    /// forgotten to stay within [`PURGED_MAX`] (to delete from disk).
    pub fn restore_purged(&mut self, markers: impl IntoIterator<Item = (RecordKey, Version)>) -> Vec<RecordKey> {
        for (k, v) in markers {
            self.remember_purged(k, v);
        }
        self.forget_beyond_bound()
    }

    /// The purged keys remembered, with their tombstones' versions, in key order.
    pub fn purged(&self) -> impl Iterator<Item = (&RecordKey, &Version)> {
        self.purged.iter()
    }

    fn remember_purged(&mut self, k: RecordKey, v: Version) {
        match self.purged.entry(k) {
            std::collections::btree_map::Entry::Occupied(mut slot) => {
                if *slot.get() < v {
                    slot.insert(v);
                }
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(v);
            }
        }
    }

    /// Forget the oldest purged keys beyond [`PURGED_MAX`]; returns them.
    fn forget_beyond_bound(&mut self) -> Vec<RecordKey> {
        let excess = self.purged.len().saturating_sub(PURGED_MAX);
        if excess == 0 {
            return Vec::new();
        }
        // One sort, not a scan per forgotten key: a mass delete purges many keys at once.
        let mut by_age: Vec<(&Version, &RecordKey)> = self.purged.iter().map(|(k, v)| (v, k)).collect();
        by_age.sort();
        let forgotten: Vec<RecordKey> = by_age.into_iter().take(excess).map(|(_, k)| k.clone()).collect();
        for k in &forgotten {
            self.purged.remove(k);
        }
        forgotten
    }

    /// Records (tombstones included) in key order after `after` (from the start with `None`).
    pub fn records_after<'a>(
        &'a self,
        after: Option<&RecordKey>,
    ) -> impl Iterator<Item = (&'a RecordKey, &'a Record)> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        self.records.range((lower, Bound::Unbounded))
    }

    /// Every record, tombstones included, as a snapshot carries them.
    pub fn snapshot(&self) -> RecordSet {
        let mut set = RecordSet::default();
        for r in self.records.values() {
            set.push(r.clone());
        }
        set
    }

    /// Forget everything (the node left its cluster).
    pub fn clear(&mut self) {
        *self = MetaState::default();
    }

    // ---- views for the namespace ----

    pub fn file(&self, path: &str) -> Option<&FileRecord> {
        match self.records.get(&(RecordKind::File, path.to_string())) {
            Some(Record::File(f)) => Some(f),
            _ => None,
        }
    }

    /// File records (tombstones included) in path order, starting at `from`.
    pub fn files_from<'a>(&'a self, from: &str) -> impl Iterator<Item = &'a FileRecord> + 'a {
        self.records.range((RecordKind::File, from.to_string())..).map_while(|(k, r)| match r {
            Record::File(f) if k.0 == RecordKind::File => Some(f),
            _ => None,
        })
    }

    pub fn files(&self) -> impl Iterator<Item = &FileRecord> {
        self.files_from("")
    }

    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.records.range((RecordKind::Policy, String::new())..).map_while(|(k, r)| match r {
            Record::Policy(p) if k.0 == RecordKind::Policy => Some(p),
            _ => None,
        })
    }

    pub fn of_kind(&self, kind: RecordKind) -> impl Iterator<Item = &Record> {
        self.records.range((kind, String::new())..).take_while(move |(k, _)| k.0 == kind).map(|(_, r)| r)
    }

    /// The records of `kind` whose key starts with `prefix`, in key order: a range of the
    /// map, not a scan of the kind (settings hold long append-only logs beside a few values).
    pub fn of_kind_under<'a>(&'a self, kind: RecordKind, prefix: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records
            .range((kind, prefix.to_string())..)
            .take_while(move |(k, _)| k.0 == kind && k.1.starts_with(prefix))
            .map(|(_, r)| r)
    }
}
