//! Write-behind persistence of the metadata store in redb (spec: cluster-runtime.md "Metadata
//! store (ACMS)" → "Persistence"; DESIGN.md "The shell").
//!
//! The core serves everything from memory and says what to write ([`MetaPersist`]). This module
//! keeps those writes in a buffer coalesced per key ([`MetaStore::queue`]) and commits the whole
//! buffer in one write transaction ([`MetaStore::flush`]), which [`spawn_flusher`] does every
//! 50 ms; [`MetaStore::close`] commits the rest. A crash loses at most what was queued since the
//! last flush, which catch-up or a snapshot restores like any other gap.
//!
//! - The buffer lock is held only to add ops or to swap the buffer out; the transaction (and its
//!   disk sync) runs outside it, so a burst of writes never waits for the disk.
//! - Flushes are serialised by a second lock, so two batches can never commit out of order.
//! - A batch whose transaction fails goes back into the buffer *under* whatever was queued
//!   meanwhile (newer ops on the same keys win) and is written again by the next flush.
//!
//! Tables, in the same file as the membership tables of [`crate::store`]:
//! - `meta_records`: `"kind/key"` → JSON of the [`Record`];
//! - `meta_log`: sequence number → JSON of the [`Entry`];
//! - `meta_pending`: submit id → JSON of the [`Pending`] submit;
//! - `meta_log_meta`: `"log"` → JSON of the [`LogMeta`].
//!
//! [`MetaPersist::Clear`] wipes these four tables and nothing else.

use redb::{Database, Durability, ReadableTable, TableDefinition};
use shoal_core::meta::log::{Entry, LogMeta, MetaPersist, Pending};
use shoal_core::meta::records::{Record, RecordKind};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("meta_records");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("meta_log");
const PENDING: TableDefinition<u64, &[u8]> = TableDefinition::new("meta_pending");
const LOG_META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta_log_meta");
const LOG_META_KEY: &str = "log";

#[derive(Debug, thiserror::Error)]
pub enum MetaStoreError {
    #[error("database: {0}")]
    Db(String),
    #[error("stored {0} is corrupt: {1}")]
    Corrupt(String, String),
    #[error("cannot encode {0}: {1}")]
    Encode(String, String),
}

macro_rules! db_err {
    ($($t:ty),*) => { $( impl From<$t> for MetaStoreError { fn from(e: $t) -> Self { MetaStoreError::Db(e.to_string()) } } )* };
}
db_err!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

/// What [`MetaStore::load`] found on disk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetaLoaded {
    pub records: Vec<Record>,
    /// In sequence order.
    pub entries: Vec<Entry>,
    /// In id order.
    pub pending: Vec<Pending>,
    pub log_meta: Option<LogMeta>,
}

/// The row key of a record: `"kind/key"`.
pub fn record_row_key(kind: RecordKind, key: &str) -> String {
    let mut out = String::with_capacity(kind.as_str().len() + 1 + key.len());
    out.push_str(kind.as_str());
    out.push('/');
    out.push_str(key);
    out
}

/// Queued writes, coalesced per key. Applied at a flush in this order: `clear`, the range delete
/// of the log, then every put and delete (each key holds only its last op, so their order does
/// not matter).
#[derive(Debug, Default)]
struct Buffer {
    /// Wipe the metadata tables first (everything queued before the `Clear` is gone).
    clear: bool,
    /// `"kind/key"` → the record to put, or `None` to delete it.
    records: BTreeMap<String, Option<Record>>,
    /// Delete every entry with `seq <=` this.
    delete_entries_through: Option<u64>,
    entries: BTreeMap<u64, Entry>,
    /// id → the submit to put, or `None` to delete it.
    pending: BTreeMap<u64, Option<Pending>>,
    log_meta: Option<LogMeta>,
}

impl Buffer {
    fn push(&mut self, op: MetaPersist) {
        match op {
            MetaPersist::PutRecord(r) => {
                self.records.insert(record_row_key(r.kind(), &r.key()), Some(r));
            }
            MetaPersist::DeleteRecord((kind, key)) => {
                self.records.insert(record_row_key(kind, &key), None);
            }
            MetaPersist::PutEntry(e) => {
                self.entries.insert(e.seq.0, e);
            }
            MetaPersist::DeleteEntriesThrough(n) => self.delete_entries_through(n.0),
            MetaPersist::PutPending(p) => {
                self.pending.insert(p.id, Some(p));
            }
            MetaPersist::DeletePending(id) => {
                self.pending.insert(id, None);
            }
            MetaPersist::PutLogMeta(m) => self.log_meta = Some(m),
            MetaPersist::Clear => *self = Buffer { clear: true, ..Buffer::default() },
        }
    }

    fn delete_entries_through(&mut self, n: u64) {
        self.entries = match n.checked_add(1) {
            Some(first_kept) => self.entries.split_off(&first_kept),
            None => BTreeMap::new(),
        };
        self.delete_entries_through = Some(self.delete_entries_through.map_or(n, |m| m.max(n)));
    }

    /// Put `later` (queued after everything in `self`) on top of `self`: its ops replace ours on
    /// the same keys, its range delete drops our entries, its `Clear` drops everything of ours.
    fn absorb(&mut self, later: Buffer) {
        if later.clear || self.is_empty() {
            *self = later;
            return;
        }
        self.records.extend(later.records);
        if let Some(n) = later.delete_entries_through {
            self.delete_entries_through(n);
        }
        self.entries.extend(later.entries);
        self.pending.extend(later.pending);
        if later.log_meta.is_some() {
            self.log_meta = later.log_meta;
        }
    }

    /// Coalesced ops held (a `Clear` and a range delete count one each).
    fn len(&self) -> usize {
        usize::from(self.clear)
            + self.records.len()
            + usize::from(self.delete_entries_through.is_some())
            + self.entries.len()
            + self.pending.len()
            + usize::from(self.log_meta.is_some())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
type CommitHook = Box<dyn Fn(&MetaStore) -> Result<(), MetaStoreError> + Send + Sync>;

/// The metadata tables of `cluster.redb`, written behind.
pub struct MetaStore {
    db: Arc<Database>,
    durable: bool,
    buffer: Mutex<Buffer>,
    /// Held for a whole flush, so batches commit in the order they were swapped out.
    flushing: Mutex<()>,
    commits: AtomicU64,
    /// Runs inside the write transaction just before its commit (tests: fail or interleave).
    #[cfg(test)]
    before_commit: Mutex<Option<CommitHook>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics half-way through changing the buffer; a poisoned lock still holds a
    // consistent value.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MetaStore {
    /// Use the metadata tables of `db` (creating them if needed), e.g. the database of
    /// [`crate::store::Store::database`]. `durable: false` skips fsync (simulation only).
    pub fn open(db: Arc<Database>, durable: bool) -> Result<MetaStore, MetaStoreError> {
        let mut txn = db.begin_write()?;
        if !durable {
            txn.set_durability(Durability::None);
        }
        {
            txn.open_table(RECORDS)?;
            txn.open_table(LOG)?;
            txn.open_table(PENDING)?;
            txn.open_table(LOG_META)?;
        }
        txn.commit()?;
        Ok(MetaStore {
            db,
            durable,
            buffer: Mutex::new(Buffer::default()),
            flushing: Mutex::new(()),
            commits: AtomicU64::new(0),
            #[cfg(test)]
            before_commit: Mutex::new(None),
        })
    }

    /// Whether commits fsync (set at [`MetaStore::open`]).
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// Add writes to the buffer, coalesced per key. Never touches the disk.
    pub fn queue(&self, ops: Vec<MetaPersist>) {
        if ops.is_empty() {
            return;
        }
        let mut buf = lock(&self.buffer);
        for op in ops {
            buf.push(op);
        }
    }

    /// Coalesced ops waiting for the next flush.
    pub fn buffered(&self) -> usize {
        lock(&self.buffer).len()
    }

    /// Write transactions committed by flushes so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Write the whole buffer in one transaction; returns the number of coalesced ops written.
    /// If the transaction fails the ops go back into the buffer (under any newer ops queued
    /// meanwhile) and the error is returned; the next flush tries again.
    pub fn flush(&self) -> Result<usize, MetaStoreError> {
        let _order = lock(&self.flushing);
        let batch = std::mem::take(&mut *lock(&self.buffer));
        if batch.is_empty() {
            return Ok(0);
        }
        let n = batch.len();
        match self.write(&batch) {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                Ok(n)
            }
            Err(e) => {
                let mut buf = lock(&self.buffer);
                let newer = std::mem::take(&mut *buf);
                *buf = batch;
                buf.absorb(newer);
                Err(e)
            }
        }
    }

    /// Flush what is left (call on shutdown).
    pub fn close(&self) -> Result<usize, MetaStoreError> {
        self.flush()
    }

    fn write(&self, b: &Buffer) -> Result<(), MetaStoreError> {
        let mut txn = self.db.begin_write()?;
        if !self.durable {
            txn.set_durability(Durability::None);
        }
        if b.clear {
            txn.delete_table(RECORDS)?;
            txn.delete_table(LOG)?;
            txn.delete_table(PENDING)?;
            txn.delete_table(LOG_META)?;
        }
        {
            let mut scratch = Vec::with_capacity(256);
            let mut records = txn.open_table(RECORDS)?;
            for (key, op) in &b.records {
                match op {
                    Some(r) => {
                        encode(&mut scratch, r, || format!("record {key}"))?;
                        records.insert(key.as_str(), scratch.as_slice())?;
                    }
                    None => {
                        records.remove(key.as_str())?;
                    }
                }
            }
            drop(records);
            let mut log = txn.open_table(LOG)?;
            if let Some(n) = b.delete_entries_through {
                log.retain_in(..=n, |_, _| false)?;
            }
            for (seq, e) in &b.entries {
                encode(&mut scratch, e, || format!("log entry {seq}"))?;
                log.insert(*seq, scratch.as_slice())?;
            }
            drop(log);
            let mut pending = txn.open_table(PENDING)?;
            for (id, op) in &b.pending {
                match op {
                    Some(p) => {
                        encode(&mut scratch, p, || format!("pending submit {id}"))?;
                        pending.insert(*id, scratch.as_slice())?;
                    }
                    None => {
                        pending.remove(*id)?;
                    }
                }
            }
            drop(pending);
            // Opened even when there is nothing to put: a `Clear` deleted it, and it must exist.
            let mut log_meta = txn.open_table(LOG_META)?;
            if let Some(m) = &b.log_meta {
                encode(&mut scratch, m, || "log meta".to_string())?;
                log_meta.insert(LOG_META_KEY, scratch.as_slice())?;
            }
        }
        #[cfg(test)]
        if let Some(hook) = lock(&self.before_commit).as_ref() {
            hook(self)?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Everything on disk (flushes first). Meant for startup; a corrupt row is an error naming it.
    pub fn load(&self) -> Result<MetaLoaded, MetaStoreError> {
        self.flush()?;
        let txn = self.db.begin_read()?;
        let mut out = MetaLoaded::default();
        for row in txn.open_table(RECORDS)?.iter()? {
            let (k, v) = row?;
            let key = k.value();
            let what = || format!("record {key}");
            let r: Record = decode(v.value(), what)?;
            let actual = record_row_key(r.kind(), &r.key());
            if actual != key {
                return Err(MetaStoreError::Corrupt(what(), format!("holds the record {actual}")));
            }
            out.records.push(r);
        }
        for row in txn.open_table(LOG)?.iter()? {
            let (k, v) = row?;
            out.entries.push(decode_entry(k.value(), v.value())?);
        }
        for row in txn.open_table(PENDING)?.iter()? {
            let (k, v) = row?;
            let id = k.value();
            let what = || format!("pending submit {id}");
            let p: Pending = decode(v.value(), what)?;
            if p.id != id {
                return Err(MetaStoreError::Corrupt(what(), format!("holds the submit {}", p.id)));
            }
            out.pending.push(p);
        }
        if let Some(v) = txn.open_table(LOG_META)?.get(LOG_META_KEY)? {
            out.log_meta = Some(decode(v.value(), || "log meta".to_string())?);
        }
        Ok(out)
    }

    /// Up to `limit` log entries with `seq > after`, in order, read from disk (flushes first).
    /// For catch-up of a range no longer in memory.
    pub fn entries_after(&self, after: u64, limit: usize) -> Result<Vec<Entry>, MetaStoreError> {
        self.flush()?;
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        for row in log.range((Bound::Excluded(after), Bound::Unbounded))? {
            let (k, v) = row?;
            out.push(decode_entry(k.value(), v.value())?);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }
}

fn encode<T: serde::Serialize>(
    scratch: &mut Vec<u8>,
    value: &T,
    what: impl FnOnce() -> String,
) -> Result<(), MetaStoreError> {
    scratch.clear();
    serde_json::to_writer(&mut *scratch, value).map_err(|e| MetaStoreError::Encode(what(), e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: impl FnOnce() -> String) -> Result<T, MetaStoreError> {
    serde_json::from_slice(bytes).map_err(|e| MetaStoreError::Corrupt(what(), e.to_string()))
}

fn decode_entry(seq: u64, bytes: &[u8]) -> Result<Entry, MetaStoreError> {
    let what = || format!("log entry {seq}");
    let e: Entry = decode(bytes, what)?;
    if e.seq.0 != seq {
        return Err(MetaStoreError::Corrupt(what(), format!("holds the entry {}", e.seq)));
    }
    Ok(e)
}

/// Flush `store` every `every` (50 ms in a node) until `stop` turns true (or its sender is
/// dropped), then flush a last time. A failed flush is logged and retried at the next tick.
///
/// A durable store commits on the blocking pool (its fsync must not hold up a runtime worker); a
/// non-durable one (simulation) commits inline, so a simulated run stays on the simulated clock.
pub fn spawn_flusher(store: Arc<MetaStore>, every: Duration, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let mut failures = 0u64;
        loop {
            if *stop.borrow_and_update() {
                break;
            }
            tokio::select! {
                _ = tick.tick() => flush_logged(&store, &mut failures).await,
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        if let Err(e) = flush_on(&store).await {
            tracing::error!(error = %e, buffered = store.buffered(), "final metadata flush failed; queued writes lost");
        }
    })
}

async fn flush_on(store: &Arc<MetaStore>) -> Result<usize, MetaStoreError> {
    if store.durable() {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.flush()).await {
            Ok(r) => r,
            Err(e) => Err(MetaStoreError::Db(format!("flush task: {e}"))),
        }
    } else {
        store.flush()
    }
}

async fn flush_logged(store: &Arc<MetaStore>, failures: &mut u64) {
    match flush_on(store).await {
        Ok(_) => {
            if *failures > 0 {
                tracing::info!(failures = *failures, "metadata flush works again");
                *failures = 0;
            }
        }
        Err(e) => {
            *failures += 1;
            // Every tick retries; the log gets the first failure and then one in a hundred.
            if *failures % 100 == 1 {
                tracing::error!(error = %e, failures = *failures, buffered = store.buffered(), "metadata flush failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use redb::ReadableTableMetadata;
    use shoal_core::hlc::Version;
    use shoal_core::ids::{LogIndex, NodeId, Term};
    use shoal_core::meta::records::Setting;
    use shoal_core::node::PersistOp;
    use std::path::Path;

    fn setting(key: &str, value: u64) -> Record {
        Record::Setting(Setting {
            key: key.to_string(),
            value: serde_json::json!(value),
            removed: false,
            version: Version { wall_ms: 1_700_000_000_000u64.wrapping_add(value), counter: 0, node: NodeId::new("n1") },
        })
    }

    fn entry(seq: u64) -> Entry {
        let record = setting(&format!("e{seq}"), seq);
        Entry { seq: LogIndex(seq), term: Term(1), version: record.max_version(), record, origin: NodeId::new("n1") }
    }

    fn pending(id: u64) -> Pending {
        Pending { id, record: setting(&format!("p{id}"), id) }
    }

    fn log_meta(last: u64) -> LogMeta {
        LogMeta { term: Term(1), last_seq: LogIndex(last), ..LogMeta::default() }
    }

    fn put(key: &str, value: u64) -> MetaPersist {
        MetaPersist::PutRecord(setting(key, value))
    }

    fn del(key: &str) -> MetaPersist {
        MetaPersist::DeleteRecord((RecordKind::Setting, key.to_string()))
    }

    fn buffer(ops: Vec<MetaPersist>) -> Buffer {
        let mut b = Buffer::default();
        for op in ops {
            b.push(op);
        }
        b
    }

    fn open(path: &Path) -> (Store, MetaStore) {
        let store = Store::open(path, true).unwrap();
        let meta = MetaStore::open(store.database(), true).unwrap();
        (store, meta)
    }

    fn seqs(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.seq.0).collect()
    }

    fn keys(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| r.key()).collect()
    }

    #[test]
    fn put_then_delete_is_a_delete_and_two_puts_keep_the_last() {
        let b = buffer(vec![put("a", 1), del("a"), put("b", 1), put("b", 2), del("c"), put("c", 3)]);
        assert_eq!(b.records.len(), 3);
        assert_eq!(b.records["setting/a"], None);
        assert_eq!(b.records["setting/b"], Some(setting("b", 2)));
        assert_eq!(b.records["setting/c"], Some(setting("c", 3)));

        let b = buffer(vec![
            MetaPersist::PutPending(pending(1)),
            MetaPersist::DeletePending(1),
            MetaPersist::PutLogMeta(log_meta(1)),
            MetaPersist::PutLogMeta(log_meta(2)),
        ]);
        assert_eq!(b.pending[&1], None);
        assert_eq!(b.log_meta, Some(log_meta(2)));
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn delete_entries_through_drops_buffered_entries() {
        let b = buffer(vec![
            MetaPersist::PutEntry(entry(1)),
            MetaPersist::PutEntry(entry(2)),
            MetaPersist::PutEntry(entry(3)),
            MetaPersist::DeleteEntriesThrough(LogIndex(2)),
            MetaPersist::DeleteEntriesThrough(LogIndex(1)),
            MetaPersist::PutEntry(entry(4)),
        ]);
        assert_eq!(b.entries.keys().copied().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(b.delete_entries_through, Some(2));
        let b =
            buffer(vec![MetaPersist::PutEntry(entry(u64::MAX)), MetaPersist::DeleteEntriesThrough(LogIndex(u64::MAX))]);
        assert!(b.entries.is_empty());
    }

    #[test]
    fn clear_discards_what_was_buffered_before_it() {
        let b = buffer(vec![
            put("a", 1),
            MetaPersist::PutEntry(entry(1)),
            MetaPersist::PutPending(pending(1)),
            MetaPersist::PutLogMeta(log_meta(1)),
            MetaPersist::DeleteEntriesThrough(LogIndex(1)),
            MetaPersist::Clear,
            put("b", 1),
        ]);
        assert!(b.clear);
        assert_eq!(b.records.keys().cloned().collect::<Vec<_>>(), vec!["setting/b".to_string()]);
        assert!(b.entries.is_empty() && b.pending.is_empty() && b.log_meta.is_none());
        assert_eq!(b.delete_entries_through, None);
    }

    #[test]
    fn requeued_batch_goes_under_newer_ops() {
        // A failed batch, then what was queued while it was being written.
        let mut failed = buffer(vec![
            put("a", 1),
            put("b", 1),
            MetaPersist::PutEntry(entry(1)),
            MetaPersist::PutEntry(entry(5)),
            MetaPersist::PutPending(pending(1)),
            MetaPersist::PutLogMeta(log_meta(5)),
        ]);
        let newer = buffer(vec![
            del("a"),
            put("c", 2),
            MetaPersist::DeleteEntriesThrough(LogIndex(3)),
            MetaPersist::DeletePending(1),
        ]);
        failed.absorb(newer);
        assert_eq!(failed.records["setting/a"], None);
        assert_eq!(failed.records["setting/b"], Some(setting("b", 1)));
        assert_eq!(failed.records["setting/c"], Some(setting("c", 2)));
        assert_eq!(failed.entries.keys().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(failed.delete_entries_through, Some(3));
        assert_eq!(failed.pending[&1], None);
        assert_eq!(failed.log_meta, Some(log_meta(5)));

        // A newer Clear wins over the whole failed batch.
        let mut failed = buffer(vec![put("a", 1), MetaPersist::PutEntry(entry(1))]);
        failed.absorb(buffer(vec![MetaPersist::Clear, put("z", 9)]));
        assert!(failed.clear);
        assert_eq!(failed.len(), 2);
        assert_eq!(failed.records["setting/z"], Some(setting("z", 9)));

        // A failed Clear stays a Clear under newer puts.
        let mut failed = buffer(vec![MetaPersist::Clear, put("a", 1)]);
        failed.absorb(buffer(vec![put("a", 2)]));
        assert!(failed.clear);
        assert_eq!(failed.records["setting/a"], Some(setting("a", 2)));
    }

    #[test]
    fn one_transaction_per_flush_and_load_returns_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, meta) = open(&dir.path().join("cluster.redb"));
        assert_eq!(meta.flush().unwrap(), 0);
        assert_eq!(meta.commits(), 0, "an empty buffer commits nothing");

        let mut ops = Vec::new();
        for i in 0..100 {
            ops.push(put(&format!("k{i:03}"), i));
            ops.push(MetaPersist::PutEntry(entry(i + 1)));
        }
        ops.push(del("k000"));
        ops.push(MetaPersist::PutPending(pending(7)));
        ops.push(MetaPersist::PutPending(pending(8)));
        ops.push(MetaPersist::DeletePending(8));
        ops.push(MetaPersist::PutLogMeta(log_meta(100)));
        meta.queue(ops);
        assert_eq!(meta.buffered(), 100 + 100 + 2 + 1);
        assert_eq!(meta.flush().unwrap(), 203);
        assert_eq!(meta.commits(), 1);
        assert_eq!(meta.buffered(), 0);

        let loaded = meta.load().unwrap();
        assert_eq!(meta.commits(), 1, "load of a flushed store commits nothing");
        assert_eq!(loaded.records.len(), 99);
        assert_eq!(loaded.records[0], setting("k001", 1));
        assert_eq!(seqs(&loaded.entries), (1..=100).collect::<Vec<_>>());
        assert_eq!(loaded.entries[41], entry(42));
        assert_eq!(loaded.pending, vec![pending(7)]);
        assert_eq!(loaded.log_meta, Some(log_meta(100)));

        // Compaction is a range delete on disk.
        meta.queue(vec![MetaPersist::DeleteEntriesThrough(LogIndex(60)), MetaPersist::PutEntry(entry(101))]);
        assert_eq!(meta.flush().unwrap(), 2);
        assert_eq!(meta.commits(), 2);
        assert_eq!(seqs(&meta.load().unwrap().entries), (61..=101).collect::<Vec<_>>());
    }

    #[test]
    fn entries_after_flushes_and_reads_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, meta) = open(&dir.path().join("cluster.redb"));
        meta.queue((1..=50).map(|i| MetaPersist::PutEntry(entry(i))).collect());
        meta.flush().unwrap();
        meta.queue((51..=60).map(|i| MetaPersist::PutEntry(entry(i))).collect());
        assert_eq!(seqs(&meta.entries_after(45, 10).unwrap()), (46..=55).collect::<Vec<_>>());
        assert_eq!(meta.buffered(), 0, "reading the log back flushes first");
        assert_eq!(seqs(&meta.entries_after(58, 10).unwrap()), vec![59, 60]);
        assert!(meta.entries_after(60, 10).unwrap().is_empty());
        assert!(meta.entries_after(0, 0).unwrap().is_empty());
        assert!(meta.entries_after(u64::MAX, 10).unwrap().is_empty());
    }

    #[test]
    fn clear_wipes_the_meta_tables_but_not_membership() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.redb");
        {
            let (store, meta) = open(&path);
            store.apply(&[PersistOp::PutPurged(NodeId::new("gone"))]).unwrap();
            meta.queue(vec![
                put("a", 1),
                MetaPersist::PutEntry(entry(1)),
                MetaPersist::PutPending(pending(1)),
                MetaPersist::PutLogMeta(log_meta(1)),
            ]);
            meta.flush().unwrap();
            meta.queue(vec![put("queued-before-clear", 1), MetaPersist::Clear, put("after", 2)]);
            meta.flush().unwrap();
            let loaded = meta.load().unwrap();
            assert_eq!(loaded.records, vec![setting("after", 2)]);
            assert!(loaded.entries.is_empty() && loaded.pending.is_empty() && loaded.log_meta.is_none());
        }
        // Reopened: membership is still there, the metadata still cleared.
        let (store, meta) = open(&path);
        assert_eq!(store.load().unwrap().purged, vec![NodeId::new("gone")]);
        assert_eq!(keys(&meta.load().unwrap().records), vec!["after".to_string()]);
    }

    #[test]
    fn a_crash_loses_at_most_the_unflushed_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.redb");
        {
            let (_store, meta) = open(&path);
            meta.queue(vec![put("flushed", 1), MetaPersist::PutEntry(entry(1)), MetaPersist::PutLogMeta(log_meta(1))]);
            meta.flush().unwrap();
            meta.queue(vec![
                put("unflushed", 2),
                MetaPersist::PutEntry(entry(2)),
                MetaPersist::PutLogMeta(log_meta(2)),
            ]);
            // Dropped without close.
        }
        let (_store, meta) = open(&path);
        let loaded = meta.load().unwrap();
        assert_eq!(loaded.records, vec![setting("flushed", 1)]);
        assert_eq!(loaded.entries, vec![entry(1)]);
        assert_eq!(loaded.log_meta, Some(log_meta(1)));

        // And close does flush the rest.
        meta.queue(vec![put("closed", 3)]);
        assert_eq!(meta.close().unwrap(), 1);
        drop(meta);
        drop(_store);
        let (_store, meta) = open(&path);
        assert_eq!(keys(&meta.load().unwrap().records), vec!["closed".to_string(), "flushed".to_string()]);
    }

    #[test]
    fn a_failed_batch_is_retried_without_overwriting_newer_ops() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, meta) = open(&dir.path().join("cluster.redb"));
        meta.queue(vec![
            put("a", 1),
            put("b", 1),
            MetaPersist::PutEntry(entry(1)),
            MetaPersist::PutLogMeta(log_meta(1)),
        ]);
        // The transaction has written the batch; before its commit, more ops arrive (the buffer
        // lock is free during the write) and the commit fails: the transaction is aborted.
        *lock(&meta.before_commit) = Some(Box::new(|m: &MetaStore| {
            m.queue(vec![put("a", 2), del("b"), MetaPersist::PutEntry(entry(2))]);
            Err(MetaStoreError::Db("injected failure".into()))
        }));
        let err = meta.flush().unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
        assert_eq!(meta.commits(), 0);
        // Nothing of the aborted transaction reached the disk.
        {
            let txn = meta.db.begin_read().unwrap();
            assert!(txn.open_table(RECORDS).unwrap().is_empty().unwrap());
            assert!(txn.open_table(LOG).unwrap().is_empty().unwrap());
        }
        // The failed batch is back under the newer ops.
        assert_eq!(meta.buffered(), 2 + 2 + 1);
        *lock(&meta.before_commit) = None;
        assert_eq!(meta.flush().unwrap(), 5);
        let loaded = meta.load().unwrap();
        assert_eq!(loaded.records, vec![setting("a", 2)]);
        assert_eq!(loaded.entries, vec![entry(1), entry(2)]);
        assert_eq!(loaded.log_meta, Some(log_meta(1)));
    }

    /// A real I/O failure from redb (not an injected one): the error comes back (no panic) and
    /// the batch stays buffered. redb refuses further writes after an I/O error until the
    /// database is reopened, so the retry here keeps failing and keeps the batch.
    #[test]
    fn a_real_io_error_keeps_the_batch() {
        use redb::backends::FileBackend;
        use redb::StorageBackend;
        use std::sync::atomic::AtomicBool;

        #[derive(Debug)]
        struct Flaky(FileBackend, Arc<AtomicBool>);
        impl StorageBackend for Flaky {
            fn len(&self) -> std::io::Result<u64> {
                self.0.len()
            }
            fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
                self.0.read(offset, len)
            }
            fn set_len(&self, len: u64) -> std::io::Result<()> {
                self.0.set_len(len)
            }
            fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
                if self.1.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("disk on fire"));
                }
                self.0.sync_data(eventual)
            }
            fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
                self.0.write(offset, data)
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("cluster.redb"))
            .unwrap();
        let fail = Arc::new(AtomicBool::new(false));
        let backend = Flaky(FileBackend::new(file).unwrap(), fail.clone());
        let db = Arc::new(Database::builder().create_with_backend(backend).unwrap());
        let meta = MetaStore::open(db, true).unwrap();
        meta.queue(vec![put("ok", 1)]);
        meta.flush().unwrap();

        fail.store(true, Ordering::SeqCst);
        meta.queue(vec![put("a", 1), MetaPersist::PutEntry(entry(1))]);
        let err = meta.flush().unwrap_err();
        assert!(matches!(err, MetaStoreError::Db(_)), "{err}");
        assert_eq!(meta.buffered(), 2);
        meta.queue(vec![put("a", 2)]);
        fail.store(false, Ordering::SeqCst);
        assert!(meta.flush().is_err());
        assert_eq!(meta.buffered(), 2);
        assert_eq!(lock(&meta.buffer).records["setting/a"], Some(setting("a", 2)));
    }

    #[test]
    fn corrupt_rows_are_errors_naming_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, meta) = open(&dir.path().join("cluster.redb"));
        let write = |f: &dyn Fn(&redb::WriteTransaction)| {
            let txn = meta.db.begin_write().unwrap();
            f(&txn);
            txn.commit().unwrap();
        };
        write(&|t| {
            t.open_table(RECORDS).unwrap().insert("setting/x", b"{not json".as_slice()).unwrap();
        });
        let err = meta.load().unwrap_err();
        assert!(matches!(&err, MetaStoreError::Corrupt(row, _) if row == "record setting/x"), "{err}");

        // A well-formed record under another record's key.
        let json = serde_json::to_vec(&setting("y", 1)).unwrap();
        write(&|t| {
            t.open_table(RECORDS).unwrap().insert("setting/x", json.as_slice()).unwrap();
        });
        let err = meta.load().unwrap_err();
        assert!(err.to_string().contains("record setting/x") && err.to_string().contains("setting/y"), "{err}");

        write(&|t| {
            t.open_table(RECORDS).unwrap().remove("setting/x").unwrap();
            let json = serde_json::to_vec(&entry(4)).unwrap();
            t.open_table(LOG).unwrap().insert(3, json.as_slice()).unwrap();
        });
        let err = meta.load().unwrap_err();
        assert!(err.to_string().contains("log entry 3"), "{err}");
        assert!(meta.entries_after(0, 10).unwrap_err().to_string().contains("log entry 3"));

        write(&|t| {
            t.open_table(LOG).unwrap().remove(3).unwrap();
            t.open_table(PENDING).unwrap().insert(9, b"[]".as_slice()).unwrap();
        });
        assert!(meta.load().unwrap_err().to_string().contains("pending submit 9"));

        write(&|t| {
            t.open_table(PENDING).unwrap().remove(9).unwrap();
            t.open_table(LOG_META).unwrap().insert(LOG_META_KEY, b"7".as_slice()).unwrap();
        });
        assert!(meta.load().unwrap_err().to_string().contains("log meta"));
    }

    #[tokio::test]
    async fn the_flusher_flushes_every_tick_and_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, meta) = open(&dir.path().join("cluster.redb"));
        let meta = Arc::new(meta);
        let (stop_tx, stop_rx) = watch::channel(false);
        let flusher = spawn_flusher(meta.clone(), Duration::from_millis(10), stop_rx);

        meta.queue(vec![put("a", 1)]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while meta.commits() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no flush within 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(meta.buffered(), 0);

        // A failing tick is retried at the next one.
        *lock(&meta.before_commit) = Some(Box::new(|_: &MetaStore| Err(MetaStoreError::Db("injected".into()))));
        meta.queue(vec![put("b", 2)]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(meta.buffered(), 1);
        *lock(&meta.before_commit) = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while meta.buffered() != 0 {
            assert!(tokio::time::Instant::now() < deadline, "no retry within 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // The last writes are flushed at stop, even with a long interval.
        let (stop_tx2, stop_rx2) = watch::channel(false);
        stop_tx.send(true).unwrap();
        flusher.await.unwrap();
        let flusher = spawn_flusher(meta.clone(), Duration::from_secs(3600), stop_rx2);
        meta.queue(vec![put("c", 3)]);
        stop_tx2.send(true).unwrap();
        flusher.await.unwrap();
        assert_eq!(meta.buffered(), 0);
        assert_eq!(keys(&meta.load().unwrap().records), vec!["a", "b", "c"]);
    }
}
