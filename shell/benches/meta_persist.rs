//! Write-behind persistence of the metadata store (`shell/src/meta_store.rs`): how many records
//! per second reach a durable redb file when they are queued in batches the size of 50 ms of
//! arrivals and each batch is committed in one transaction (with its fsync).
//!
//! Run: `cargo bench -p shoal-shell --bench meta_persist -- --warm-up-time 1 --measurement-time 5`.
//!
//! - `put_settings_200k`: 200,000 distinct small settings, 10,000 per flush, into a fresh file
//!   (keys spread over the key space, so every batch lands all over the tree); target >= 200,000
//!   records/s.
//! - `coalesce_1k_keys`: 200,000 puts to the same 1,000 keys, 10,000 per flush: each flush writes
//!   1,000 rows.
//! - `put_changes_200k`: 200,000 changes as the log produces them (the record, its log entry and
//!   the log meta), 10,000 changes per flush.
//!
//! The ops are built before the timer starts; the time covers `queue` plus `flush`.

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use shoal_core::hlc::Version;
use shoal_core::ids::{LogIndex, NodeId, Term};
use shoal_core::meta::log::{Entry, LogMeta, MetaPersist};
use shoal_core::meta::records::{Record, Setting};
use shoal_shell::meta_store::MetaStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOTAL: usize = 200_000;
const PER_FLUSH: usize = 10_000;

fn setting(key: String, i: u64) -> Record {
    Record::Setting(Setting {
        key,
        value: serde_json::json!(i),
        removed: false,
        version: Version { wall_ms: 1_700_000_000_000 + i, counter: 0, node: NodeId::new("bench-node") },
    })
}

/// The i-th distinct key, spread over the key space (a bijection on u32).
fn spread_key(i: usize) -> String {
    format!("bench.{:08x}", (i as u32).wrapping_mul(2_654_435_761))
}

fn fresh_store() -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = redb::Database::create(dir.path().join("cluster.redb")).expect("create db");
    let store = MetaStore::open(Arc::new(db), true).expect("open meta store");
    (dir, store)
}

/// Queue and flush `batches` into a fresh durable file; returns the time it took.
fn run(batches: Vec<Vec<MetaPersist>>) -> Duration {
    let (_dir, store) = fresh_store();
    let start = Instant::now();
    for batch in batches {
        store.queue(batch);
        store.flush().expect("flush");
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("meta_persist");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.throughput(Throughput::Elements(TOTAL as u64));

    g.bench_function("put_settings_200k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batches = (0..TOTAL / PER_FLUSH)
                    .map(|f| {
                        (f * PER_FLUSH..(f + 1) * PER_FLUSH)
                            .map(|i| MetaPersist::PutRecord(setting(spread_key(i), i as u64)))
                            .collect()
                    })
                    .collect();
                total += run(batches);
            }
            total
        })
    });

    g.bench_function("coalesce_1k_keys", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batches = (0..TOTAL / PER_FLUSH)
                    .map(|f| {
                        (f * PER_FLUSH..(f + 1) * PER_FLUSH)
                            .map(|i| MetaPersist::PutRecord(setting(spread_key(i % 1000), i as u64)))
                            .collect()
                    })
                    .collect();
                total += run(batches);
            }
            total
        })
    });

    g.bench_function("put_changes_200k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batches = (0..TOTAL / PER_FLUSH)
                    .map(|f| {
                        let mut ops = Vec::with_capacity(3 * PER_FLUSH);
                        for i in f * PER_FLUSH..(f + 1) * PER_FLUSH {
                            let seq = i as u64 + 1;
                            let record = setting(spread_key(i), i as u64);
                            let entry = Entry {
                                seq: LogIndex(seq),
                                term: Term(1),
                                version: record.max_version(),
                                record: record.clone(),
                                origin: NodeId::new("bench-node"),
                            };
                            ops.push(MetaPersist::PutRecord(record));
                            ops.push(MetaPersist::PutEntry(entry));
                            ops.push(MetaPersist::PutLogMeta(LogMeta {
                                term: Term(1),
                                last_seq: LogIndex(seq),
                                ..LogMeta::default()
                            }));
                        }
                        ops
                    })
                    .collect();
                total += run(batches);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
