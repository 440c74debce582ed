//! The write-behind buffer of the metadata store: ops coalesced per key, and the same shape
//! over the journal's encoded values ([`Overlay`]).

use super::*;

/// Writes coalesced per key: the buffer (decoded values, [`Buffer`]) and the journal replayed
/// ([`Overlay`], the encoded values as the journal rows hold them). Applied in this order:
/// `clear`, the range delete of the log, then every put and delete (each key holds only its last
/// op, so their order does not matter).
#[derive(Debug)]
pub(super) struct Batch<R, E, P, M, V> {
    /// Wipe the metadata tables first (everything before the `Clear` is gone).
    pub(super) clear: bool,
    /// `"kind/key"` → the record to put, or `None` to delete it.
    pub(super) records: BTreeMap<String, Option<R>>,
    /// Delete every entry with `seq <=` this.
    pub(super) delete_entries_through: Option<u64>,
    pub(super) entries: BTreeMap<u64, E>,
    /// id → the submit to put, or `None` to delete it.
    pub(super) pending: BTreeMap<u64, Option<P>>,
    pub(super) log_meta: Option<M>,
    /// `"kind/key"` → the purged tombstone's version to remember, or `None` to forget it.
    pub(super) purged: BTreeMap<String, Option<V>>,
}

/// Queued writes.
pub(super) type Buffer = Batch<Record, Entry, Pending, LogMeta, Version>;

/// The journal replayed: each value is the JSON a table row would hold, and the journal row it
/// came from (to name it in errors).
pub(super) type Overlay<'a> = Batch<Raw<'a>, Raw<'a>, Raw<'a>, Raw<'a>, Raw<'a>>;

#[derive(Clone, Copy, Debug)]
pub(super) struct Raw<'a> {
    pub(super) row: u64,
    pub(super) bytes: &'a [u8],
}

impl<R, E, P, M, V> Default for Batch<R, E, P, M, V> {
    fn default() -> Self {
        Batch {
            clear: false,
            records: BTreeMap::new(),
            delete_entries_through: None,
            entries: BTreeMap::new(),
            pending: BTreeMap::new(),
            log_meta: None,
            purged: BTreeMap::new(),
        }
    }
}

impl Buffer {
    pub(super) fn push(&mut self, op: MetaPersist) {
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
            MetaPersist::PutPurged((kind, key), v) => {
                self.purged.insert(record_row_key(kind, &key), Some(v));
            }
            MetaPersist::DeletePurged((kind, key)) => {
                self.purged.insert(record_row_key(kind, &key), None);
            }
            MetaPersist::Clear => self.wipe(),
        }
    }
}

impl<R, E, P, M, V> Batch<R, E, P, M, V> {
    /// A `Clear`: drop everything before it.
    pub(super) fn wipe(&mut self) {
        *self = Batch { clear: true, ..Batch::default() }
    }

    pub(super) fn delete_entries_through(&mut self, n: u64) {
        self.entries = match n.checked_add(1) {
            Some(first_kept) => self.entries.split_off(&first_kept),
            None => BTreeMap::new(),
        };
        self.delete_entries_through = Some(self.delete_entries_through.map_or(n, |m| m.max(n)));
    }

    /// Put `later` (queued after everything in `self`) on top of `self`: its ops replace ours on
    /// the same keys, its range delete drops our entries, its `Clear` drops everything of ours.
    pub(super) fn absorb(&mut self, later: Self) {
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
        self.purged.extend(later.purged);
    }

    /// Coalesced ops held (a `Clear` and a range delete count one each).
    pub(super) fn len(&self) -> usize {
        usize::from(self.clear)
            + self.records.len()
            + usize::from(self.delete_entries_through.is_some())
            + self.entries.len()
            + self.pending.len()
            + usize::from(self.log_meta.is_some())
            + self.purged.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
