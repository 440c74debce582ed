//! The journal of the metadata store: one row per flushed batch, its binary codec, and
//! replaying rows over the tables (see the module doc of `meta_store`).

use super::*;

/// Version byte at the start of every journal row.
pub(super) const ROW_FORMAT: u8 = 1;
pub(super) const OP_CLEAR: u8 = 1;
pub(super) const OP_DELETE_ENTRIES_THROUGH: u8 = 2;
pub(super) const OP_PUT_RECORD: u8 = 3;
pub(super) const OP_DELETE_RECORD: u8 = 4;
pub(super) const OP_PUT_ENTRY: u8 = 5;
pub(super) const OP_PUT_PENDING: u8 = 6;
pub(super) const OP_DELETE_PENDING: u8 = 7;
pub(super) const OP_PUT_LOG_META: u8 = 8;
pub(super) const OP_PUT_PURGED: u8 = 9;
pub(super) const OP_DELETE_PURGED: u8 = 10;

/// One journal row: a coalesced batch in the order it is applied (`Clear`, the range delete,
/// records, entries, pending submits, log meta, purged keys), so replaying its ops one by one
/// gives the batch's effect. Rows written before purged keys were persisted hold none of their
/// ops and decode as they did.
///
/// `[ROW_FORMAT: u8][op count: u64 LE]` then per op a tag byte and its fields: u64 little-endian;
/// a key or a value as `[len: u32 LE][bytes]`, a value being the JSON its table row holds.
///
/// | op | fields |
/// |---|---|
/// | `OP_CLEAR` | — |
/// | `OP_DELETE_ENTRIES_THROUGH` | seq |
/// | `OP_PUT_RECORD` | `"kind/key"`, JSON of the record |
/// | `OP_DELETE_RECORD` | `"kind/key"` |
/// | `OP_PUT_ENTRY` | seq, JSON of the entry |
/// | `OP_PUT_PENDING` | id, JSON of the submit |
/// | `OP_DELETE_PENDING` | id |
/// | `OP_PUT_LOG_META` | JSON of the log meta |
/// | `OP_PUT_PURGED` | `"kind/key"`, JSON of the tombstone's version |
/// | `OP_DELETE_PURGED` | `"kind/key"` |
pub(super) fn encode_row(b: &Buffer) -> Result<Vec<u8>, MetaStoreError> {
    let mut out = Vec::with_capacity(16 + b.len() * 192);
    out.push(ROW_FORMAT);
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    if b.clear {
        out.push(OP_CLEAR);
    }
    if let Some(n) = b.delete_entries_through {
        out.push(OP_DELETE_ENTRIES_THROUGH);
        out.extend_from_slice(&n.to_le_bytes());
    }
    for (key, op) in &b.records {
        let what = || format!("record {key}");
        match op {
            Some(r) => {
                out.push(OP_PUT_RECORD);
                put_bytes(&mut out, key.as_bytes(), what)?;
                put_json(&mut out, r, what)?;
            }
            None => {
                out.push(OP_DELETE_RECORD);
                put_bytes(&mut out, key.as_bytes(), what)?;
            }
        }
    }
    for (seq, e) in &b.entries {
        out.push(OP_PUT_ENTRY);
        out.extend_from_slice(&seq.to_le_bytes());
        put_json(&mut out, e, || format!("log entry {seq}"))?;
    }
    for (id, op) in &b.pending {
        match op {
            Some(p) => {
                out.push(OP_PUT_PENDING);
                out.extend_from_slice(&id.to_le_bytes());
                put_json(&mut out, p, || format!("pending submit {id}"))?;
            }
            None => {
                out.push(OP_DELETE_PENDING);
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }
    if let Some(m) = &b.log_meta {
        out.push(OP_PUT_LOG_META);
        put_json(&mut out, m, || "log meta".to_string())?;
    }
    for (key, op) in &b.purged {
        let what = || format!("purged key {key}");
        match op {
            Some(v) => {
                out.push(OP_PUT_PURGED);
                put_bytes(&mut out, key.as_bytes(), what)?;
                put_json(&mut out, v, what)?;
            }
            None => {
                out.push(OP_DELETE_PURGED);
                put_bytes(&mut out, key.as_bytes(), what)?;
            }
        }
    }
    Ok(out)
}

pub(super) fn put_len(
    out: &mut [u8],
    at: usize,
    len: usize,
    what: impl FnOnce() -> String,
) -> Result<(), MetaStoreError> {
    let len = u32::try_from(len).map_err(|_| MetaStoreError::Encode(what(), format!("{len} bytes is too long")))?;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8], what: impl FnOnce() -> String) -> Result<(), MetaStoreError> {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    put_len(out, at, bytes.len(), what)?;
    out.extend_from_slice(bytes);
    Ok(())
}

/// The JSON of `value`, length-prefixed, serialised straight into the row.
pub(super) fn put_json<T: serde::Serialize>(
    out: &mut Vec<u8>,
    value: &T,
    what: impl Fn() -> String,
) -> Result<(), MetaStoreError> {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    serde_json::to_writer(&mut *out, value).map_err(|e| MetaStoreError::Encode(what(), e.to_string()))?;
    let len = out.len() - at - 4;
    put_len(out, at, len, what)
}

/// Reads the fields of one journal row; every error names the row.
pub(super) struct RowReader<'a> {
    pub(super) row: u64,
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> RowReader<'a> {
    pub(super) fn corrupt(&self, why: String) -> MetaStoreError {
        MetaStoreError::Corrupt(format!("journal row {}", self.row), format!("{why} (at byte {})", self.at))
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], MetaStoreError> {
        let left = self.bytes.len() - self.at;
        if left < n {
            return Err(self.corrupt(format!("truncated: {n} bytes expected, {left} left")));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    pub(super) fn u8(&mut self) -> Result<u8, MetaStoreError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u64(&mut self) -> Result<u64, MetaStoreError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8], MetaStoreError> {
        let b = self.take(4)?;
        let len = u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
        self.take(len as usize)
    }

    pub(super) fn raw(&mut self) -> Result<Raw<'a>, MetaStoreError> {
        Ok(Raw { row: self.row, bytes: self.bytes()? })
    }

    pub(super) fn key(&mut self) -> Result<String, MetaStoreError> {
        let b = self.bytes()?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.corrupt(format!("key is not UTF-8: {e}"))),
        }
    }

    /// The row's header: its format and op count.
    pub(super) fn header(&mut self) -> Result<u64, MetaStoreError> {
        let format = self.u8()?;
        if format != ROW_FORMAT {
            return Err(self.corrupt(format!("unknown row format {format}")));
        }
        self.u64()
    }
}

/// The op count in the header of a journal row.
pub(super) fn row_ops(row: u64, bytes: &[u8]) -> Result<usize, MetaStoreError> {
    let mut r = RowReader { row, bytes, at: 0 };
    let count = r.header()?;
    usize::try_from(count).map_err(|_| r.corrupt(format!("op count {count} is too large")))
}

/// Replay journal row `row` on top of `overlay`; returns its op count.
pub(super) fn replay_row<'a>(overlay: &mut Overlay<'a>, row: u64, bytes: &'a [u8]) -> Result<usize, MetaStoreError> {
    let mut r = RowReader { row, bytes, at: 0 };
    let count = r.header()?;
    let mut ops = 0u64;
    while r.at < bytes.len() {
        match r.u8()? {
            OP_CLEAR => overlay.wipe(),
            OP_DELETE_ENTRIES_THROUGH => {
                let n = r.u64()?;
                overlay.delete_entries_through(n);
            }
            OP_PUT_RECORD => {
                let key = r.key()?;
                let value = r.raw()?;
                overlay.records.insert(key, Some(value));
            }
            OP_DELETE_RECORD => {
                let key = r.key()?;
                overlay.records.insert(key, None);
            }
            OP_PUT_ENTRY => {
                let seq = r.u64()?;
                let value = r.raw()?;
                overlay.entries.insert(seq, value);
            }
            OP_PUT_PENDING => {
                let id = r.u64()?;
                let value = r.raw()?;
                overlay.pending.insert(id, Some(value));
            }
            OP_DELETE_PENDING => {
                let id = r.u64()?;
                overlay.pending.insert(id, None);
            }
            OP_PUT_LOG_META => overlay.log_meta = Some(r.raw()?),
            OP_PUT_PURGED => {
                let key = r.key()?;
                let value = r.raw()?;
                overlay.purged.insert(key, Some(value));
            }
            OP_DELETE_PURGED => {
                let key = r.key()?;
                overlay.purged.insert(key, None);
            }
            tag => {
                r.at -= 1;
                return Err(r.corrupt(format!("unknown op {tag}")));
            }
        }
        ops += 1;
    }
    if ops != count {
        return Err(r.corrupt(format!("holds {ops} ops, its header says {count}")));
    }
    // ops == count, which fits a usize (the row holds at least one byte per op).
    Ok(ops as usize)
}

/// The rows of the journal, in order (the guards keep their bytes readable).
pub(super) type JournalRows<'t> = Vec<(u64, AccessGuard<'t, &'static [u8]>)>;

pub(super) fn journal_rows<T: ReadableTable<u64, &'static [u8]>>(
    journal: &T,
) -> Result<JournalRows<'_>, MetaStoreError> {
    let mut out = Vec::new();
    for row in journal.iter()? {
        let (k, v) = row?;
        out.push((k.value(), v));
    }
    Ok(out)
}

/// Every journal row replayed in order; and the number of ops they hold.
pub(super) fn replay<'a>(rows: &'a JournalRows<'_>) -> Result<(Overlay<'a>, usize), MetaStoreError> {
    let mut overlay = Overlay::default();
    let mut ops = 0usize;
    for (row, bytes) in rows {
        ops = ops.saturating_add(replay_row(&mut overlay, *row, bytes.value())?);
    }
    Ok((overlay, ops))
}

/// A value read for [`MetaStore::load`] or [`MetaStore::entries_after`]: a table row, or the op of
/// a journal row that replaces it.
pub(super) enum Src<'g, 'j> {
    Table(AccessGuard<'g, &'static [u8]>),
    Journal(Raw<'j>),
}

impl Src<'_, '_> {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Src::Table(g) => g.value(),
            Src::Journal(raw) => raw.bytes,
        }
    }

    /// `what` (e.g. "record setting/x"), and the journal row it came from.
    pub(super) fn name(&self, what: String) -> String {
        match self {
            Src::Table(_) => what,
            Src::Journal(raw) => format!("{what} in journal row {}", raw.row),
        }
    }
}

/// The rows of a table and the journal's ops on the same keys, both in key order, merged into
/// what the table would hold after a fold: a journal op replaces the table row with its key
/// (which is skipped unread), a `None` op yields nothing.
pub(super) struct Merged<T: Iterator, J: Iterator> {
    pub(super) table: Peekable<T>,
    pub(super) journal: Peekable<J>,
}

pub(super) fn merged<'g, 'j, K, T, J>(table: T, journal: J) -> Merged<T, J>
where
    T: Iterator<Item = Result<(K, AccessGuard<'g, &'static [u8]>), MetaStoreError>>,
    J: Iterator<Item = (K, Option<Raw<'j>>)>,
{
    Merged { table: table.peekable(), journal: journal.peekable() }
}

impl<'g, 'j, K: Ord, T, J> Iterator for Merged<T, J>
where
    T: Iterator<Item = Result<(K, AccessGuard<'g, &'static [u8]>), MetaStoreError>>,
    J: Iterator<Item = (K, Option<Raw<'j>>)>,
{
    type Item = Result<(K, Src<'g, 'j>), MetaStoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let from_table = match (self.table.peek(), self.journal.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) | (Some(Ok(_)), None) => true,
                (None, Some(_)) => false,
                (Some(Ok((tk, _))), Some((jk, _))) => match tk.cmp(jk) {
                    KeyOrder::Less => true,
                    KeyOrder::Equal => {
                        // Replaced by the journal.
                        self.table.next();
                        false
                    }
                    KeyOrder::Greater => false,
                },
            };
            if from_table {
                return self.table.next().map(|r| r.map(|(k, g)| (k, Src::Table(g))));
            }
            if let Some((k, Some(raw))) = self.journal.next() {
                return Some(Ok((k, Src::Journal(raw))));
            }
            // A delete: the table row (if any) is gone.
        }
    }
}
