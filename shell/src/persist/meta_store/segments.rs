//! The log's entries on disk, in segments: one redb table per run of consecutive sequence
//! numbers (`meta_log.START`, START zero-padded so the names sort by number), so that dropping
//! the entries the log no longer keeps deletes whole tables instead of row after row.
//!
//! Why: the log keeps its last 10,000 entries, so every entry written is deleted again a little
//! later. redb deletes a row by rewriting the B-tree around it; a fold that dropped ten thousand
//! entries one by one was 8–9 % of all CPU of a 3-node cluster under 16 writing clients (perf,
//! issue 18). `delete_table` frees a table's pages without touching its rows; only the segment
//! that holds the boundary loses rows one by one (fewer than a segment's length).
//!
//! Reading and deleting do not need the segment length (a segment is known by its name, its
//! end by its last row), so stores written with another length read the same. Before segments,
//! the entries were one table, `meta_log`: [`migrate_legacy`] moves its rows into segments
//! when the store is opened.

use super::MetaStoreError;
use redb::{AccessGuard, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use std::ops::Bound;

/// Sequence numbers per segment in a running node.
pub(super) const LOG_SEGMENT: u64 = 1024;

const PREFIX: &str = "meta_log.";

/// The single log table of stores written before segments.
const LEGACY_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("meta_log");

/// The name of the segment table starting at `start`.
pub(super) fn segment_name(start: u64) -> String {
    format!("{PREFIX}{start:020}")
}

/// The segment table named `name`.
pub(super) fn segment(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

/// The start of the segment of `len` sequence numbers that holds `seq`.
pub(super) fn segment_start(seq: u64, len: u64) -> u64 {
    seq - seq % len.max(1)
}

/// The starts of the segment tables among `tables`, ascending.
fn starts(tables: impl Iterator<Item = redb::UntypedTableHandle>) -> Vec<u64> {
    let mut out: Vec<u64> =
        tables.filter_map(|t| t.name().strip_prefix(PREFIX).and_then(|n| n.parse::<u64>().ok())).collect();
    out.sort_unstable();
    out
}

/// Drop every entry with `seq <= through`: whole segments whose last row is at most `through`,
/// and the rows of the one segment it falls inside.
pub(super) fn delete_through(txn: &redb::WriteTransaction, through: u64) -> Result<(), MetaStoreError> {
    for start in starts(txn.list_tables()?) {
        if start > through {
            break;
        }
        let name = segment_name(start);
        let mut table = txn.open_table(segment(&name))?;
        let last = table.last()?.map(|(k, _)| k.value());
        if last.is_none_or(|last| last <= through) {
            drop(table);
            txn.delete_table(segment(&name))?;
        } else {
            table.retain_in(..=through, |_, _| false)?;
        }
    }
    Ok(())
}

/// Delete every segment (a `Clear`), and the legacy table if one is left.
pub(super) fn delete_all(txn: &redb::WriteTransaction) -> Result<(), MetaStoreError> {
    for start in starts(txn.list_tables()?) {
        txn.delete_table(segment(&segment_name(start)))?;
    }
    txn.delete_table(LEGACY_LOG)?;
    Ok(())
}

/// Write `entries` (ascending sequence numbers) into their segments of `len` numbers.
pub(super) fn insert<'a>(
    txn: &redb::WriteTransaction,
    entries: impl Iterator<Item = (u64, &'a [u8])>,
    len: u64,
) -> Result<(), MetaStoreError> {
    let mut open: Option<(u64, redb::Table<u64, &'static [u8]>)> = None;
    for (seq, bytes) in entries {
        let start = segment_start(seq, len);
        let table = match &mut open {
            Some((s, table)) if *s == start => table,
            _ => {
                open = None;
                let name = segment_name(start);
                &mut open.insert((start, txn.open_table(segment(&name))?)).1
            }
        };
        table.insert(seq, bytes)?;
    }
    Ok(())
}

/// One stored entry: its sequence number and its JSON.
pub(super) type StoredEntry = Result<(u64, AccessGuard<'static, &'static [u8]>), MetaStoreError>;

/// Every stored entry with a sequence number after `first`'s bound, ascending, across the
/// segments.
pub(super) fn read_from(
    txn: &redb::ReadTransaction,
    first: Bound<u64>,
) -> Result<impl Iterator<Item = StoredEntry> + use<>, MetaStoreError> {
    let mut ranges = Vec::new();
    let starts = starts(txn.list_tables()?);
    for (i, start) in starts.iter().enumerate() {
        // A segment that ends before the first wanted number is passed over unopened.
        if let (Bound::Excluded(f) | Bound::Included(f), Some(next)) = (first, starts.get(i + 1)) {
            if *next <= f {
                continue;
            }
        }
        let table = txn.open_table(segment(&segment_name(*start)))?;
        ranges.push(table.range::<u64>((first, Bound::Unbounded))?);
    }
    Ok(ranges.into_iter().flatten().map(|row| {
        let (k, v) = row?;
        Ok((k.value(), v))
    }))
}

/// Move the rows of the legacy single log table into segments and drop it (at open).
pub(super) fn migrate_legacy(txn: &redb::WriteTransaction, len: u64) -> Result<(), MetaStoreError> {
    let legacy = txn.list_tables()?.any(|t| t.name() == LEGACY_LOG.name());
    if !legacy {
        return Ok(());
    }
    {
        let table = txn.open_table(LEGACY_LOG)?;
        if !table.is_empty()? {
            let rows = table.iter()?.map(|row| {
                let (k, v) = row?;
                Ok::<_, MetaStoreError>((k.value(), v.value().to_vec()))
            });
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            insert(txn, rows.iter().map(|(k, v)| (*k, v.as_slice())), len)?;
        }
    }
    txn.delete_table(LEGACY_LOG)?;
    Ok(())
}

/// The legacy table, for tests that write a store as an older build did.
#[cfg(test)]
pub(super) const LEGACY: TableDefinition<u64, &[u8]> = LEGACY_LOG;

/// The segment tables present, by start (tests).
#[cfg(test)]
pub(super) fn segment_starts(txn: &redb::ReadTransaction) -> Vec<u64> {
    starts(txn.list_tables().unwrap())
}
