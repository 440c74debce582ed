//! Issue 17 "Hostile input", the disk side: the metadata store's journal rows
//! (`shell/src/persist/meta_store/journal.rs`: `row_ops`, `replay_row`, through `MetaStore::open`,
//! `MetaStore::load` and `MetaStore::fold`) fed arbitrary bytes and mutated real rows, written
//! straight into the `meta_journal` table of an in-memory redb database. Every row is refused with
//! a typed error (`MetaStoreError::Corrupt` or `TooDeep`) or read, and what is read matches what
//! a real row holds or re-encodes consistently; nothing panics.
//!
//! The row codec is `pub(super)`, so the store's public face is the way in (as at a restart).
//! The shell has no proptest dependency: cases come from a seeded generator, so every run is the
//! same and a failure names its case.

use redb::backends::InMemoryBackend;
use redb::{Database, Durability, TableDefinition};
use shoal_core::hlc::Version;
use shoal_core::ids::{LogIndex, NodeId, Term};
use shoal_core::meta::log::{Entry, LogMeta, MetaPersist, Pending};
use shoal_core::meta::records::{Record, RecordKind, Setting};
use shoal_core::SeededRng;
use shoal_shell::persist::meta_store::{MetaStore, MetaStoreError};
use std::sync::Arc;

/// The journal table, as `meta_store` declares it.
const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("meta_journal");

fn setting(key: &str, value: u64) -> Record {
    Record::Setting(Setting {
        key: key.to_string(),
        value: serde_json::json!({"v": value, "list": [1, 2, "three"]}),
        removed: false,
        version: Version { wall_ms: 1_700_000_000_000 + value, counter: 0, node: NodeId::new("n1") },
    })
}

fn memory_db() -> Arc<Database> {
    Arc::new(Database::builder().create_with_backend(InMemoryBackend::new()).expect("in-memory database"))
}

/// A real journal row holding every kind of op.
fn real_row() -> Vec<u8> {
    let db = memory_db();
    let store = MetaStore::open(db.clone(), false).unwrap();
    let record = setting("a", 1);
    store.queue(vec![
        MetaPersist::DeleteEntriesThrough(LogIndex(1)),
        MetaPersist::PutRecord(record.clone()),
        MetaPersist::PutRecord(setting("b", 2)),
        MetaPersist::DeleteRecord((RecordKind::Setting, "gone".into())),
        MetaPersist::PutEntry(Entry {
            seq: LogIndex(2),
            term: Term(1),
            version: record.max_version(),
            record: record.clone(),
            origin: NodeId::new("n1"),
        }),
        MetaPersist::PutPending(Pending { id: 7, record: setting("p", 3), sent_back_based: None }),
        MetaPersist::DeletePending(6),
        MetaPersist::PutLogMeta(LogMeta { term: Term(1), last_seq: LogIndex(2), ..LogMeta::default() }),
        MetaPersist::PutPurged(
            (RecordKind::File, "/old".into()),
            Version { wall_ms: 5, counter: 1, node: NodeId::new("n2") },
        ),
        MetaPersist::DeletePurged((RecordKind::File, "/older".into())),
    ]);
    assert_eq!(store.flush().unwrap(), 10);
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(JOURNAL).unwrap();
    let row = table.get(1).unwrap().expect("the flush wrote row 1");
    row.value().to_vec()
}

/// What opening, loading and folding a store whose journal holds `row` does: `Ok` with the
/// records read, or the first error.
fn read_back(row: &[u8]) -> Result<Vec<Record>, MetaStoreError> {
    let db = memory_db();
    {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::None);
        txn.open_table(JOURNAL).unwrap().insert(1, row).unwrap();
        txn.commit().unwrap();
    }
    let store = MetaStore::open(db.clone(), false)?;
    let loaded = store.load()?;
    // A row that loads also folds into the tables, and the tables load the same.
    store.fold()?;
    let again = store.load()?;
    assert_eq!(again.records, loaded.records, "folding changed what a load reads");
    assert_eq!(again.entries, loaded.entries);
    assert_eq!(again.pending, loaded.pending);
    assert_eq!(again.log_meta, loaded.log_meta);
    assert_eq!(again.purged, loaded.purged);
    Ok(loaded.records)
}

fn typed(e: &MetaStoreError) -> bool {
    matches!(e, MetaStoreError::Corrupt(..) | MetaStoreError::TooDeep(..))
}

fn byte(rng: &mut SeededRng) -> u8 {
    u8::from_str_radix(&rng.hex(1), 16).unwrap()
}

fn below(rng: &mut SeededRng, n: usize) -> usize {
    (u64::from_str_radix(&rng.hex(8), 16).unwrap() % n.max(1) as u64) as usize
}

/// One to four random edits: flip a bit, insert, delete or overwrite a byte, or cut the row.
fn mutate(rng: &mut SeededRng, row: &[u8]) -> Vec<u8> {
    let mut out = row.to_vec();
    for _ in 0..1 + below(rng, 4) {
        match below(rng, 5) {
            0 if !out.is_empty() => {
                let at = below(rng, out.len());
                out[at] ^= 1 << below(rng, 8);
            }
            1 => {
                let at = below(rng, out.len() + 1);
                out.insert(at, byte(rng));
            }
            2 if !out.is_empty() => {
                let at = below(rng, out.len());
                out.remove(at);
            }
            3 if !out.is_empty() => {
                let at = below(rng, out.len());
                out[at] = byte(rng);
            }
            _ => out.truncate(below(rng, out.len() + 1)),
        }
    }
    out
}

#[test]
fn a_real_row_reads_back() {
    let records = read_back(&real_row()).expect("a real row loads");
    let keys: Vec<String> = records.iter().map(Record::key).collect();
    assert_eq!(keys, ["a", "b"]);
}

/// Arbitrary bytes as a journal row: refused with a typed error (a row that does not start with
/// the row format byte is always refused), or read.
#[test]
fn arbitrary_rows_are_refused_or_read() {
    let mut rng = SeededRng::new(17);
    for case in 0..100 {
        let len = below(&mut rng, 64);
        let mut row: Vec<u8> = (0..len).map(|_| byte(&mut rng)).collect();
        if case % 2 == 0 && !row.is_empty() {
            // Half of them pass the format byte, to reach the ops.
            row[0] = 1;
        }
        match read_back(&row) {
            Ok(records) => {
                assert_eq!(row.first(), Some(&1), "case {case}: {row:?} read without the format byte");
                assert!(records.iter().all(Record::shape_ok), "case {case}");
            }
            Err(e) => assert!(typed(&e), "case {case}: {row:?}: {e}"),
        }
    }
}

/// A real row mutated: refused with a typed error, or read to records that re-encode to
/// themselves.
#[test]
fn mutated_rows_are_refused_or_read_consistently() {
    let real = real_row();
    let mut rng = SeededRng::new(1717);
    let (mut refused, mut read) = (0, 0);
    for case in 0..200 {
        let row = mutate(&mut rng, &real);
        match read_back(&row) {
            Ok(records) => {
                read += 1;
                for r in records {
                    let text = serde_json::to_vec(&r).unwrap();
                    let back: Record = serde_json::from_slice(&text).unwrap();
                    assert_eq!(back, r, "case {case}");
                }
            }
            Err(e) => {
                refused += 1;
                assert!(typed(&e), "case {case}: {e}");
            }
        }
    }
    // The mutations reach both outcomes (a bit flip inside a string still reads).
    assert!(refused > 0 && read > 0, "refused {refused}, read {read}");
}
