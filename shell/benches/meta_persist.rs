//! Write-behind persistence of the metadata store (`shell/src/meta_store.rs`): how many records
//! per second reach a durable redb file when they are queued in batches the size of 50 ms of
//! arrivals and each batch is committed in one transaction (with its fsync).
//!
//! Run: `cargo bench -p shoal-shell --bench meta_persist -- --warm-up-time 1 --measurement-time 5`.
//!
//! Workloads, each into a fresh file:
//! - `put_settings_200k_{ordered,random}`: 200,000 distinct small settings, 10,000 per flush;
//!   target >= 200,000 records/s. `ordered`: keys arrive in key order, so a batch lands in a few
//!   leaves of the tree. `random`: keys spread over the key space, so a batch lands all over it;
//!   redb copies every leaf a transaction touches, so writing a batch into the table costs with
//!   the table and not only with the batch (which is why flushes go to a journal).
//! - `coalesce_1k_keys`: 200,000 puts to the same 1,000 keys, 10,000 per flush: each flush writes
//!   1,000 ops.
//! - `put_changes_200k_{ordered,random}`: 200,000 changes as the log produces them (the record, its
//!   log entry and the log meta: 3 ops each), 10,000 changes per flush; throughput in changes.
//!
//! Each workload is measured three ways (throughput always in records or changes of the
//! workload):
//! - `…/flush`: `queue` plus `flush` of every batch, nothing else: the rate at which 50 ms batches
//!   reach the disk (each flush appends one journal row; no fold).
//! - `…/flush_and_fold`: the same plus the folds the flusher does (a fold after a flush once the
//!   journal holds more than 100,000 ops) and the final one of `close`: the sustained rate.
//! - `…/fold`: only the time of those folds (the flushes run untimed): what folding costs, i.e.
//!   how long the flushes due during a fold wait.
//!
//! The ops are built before the timer starts.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use shoal_core::hlc::Version;
use shoal_core::ids::{LogIndex, NodeId, Term};
use shoal_core::meta::log::{Entry, LogMeta, MetaPersist};
use shoal_core::meta::records::{Record, Setting};
use shoal_shell::persist::meta_store::MetaStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOTAL: usize = 200_000;
const PER_FLUSH: usize = 10_000;
/// The flusher folds once the journal holds more ops than this (`FOLD_AT` in `meta_store.rs`).
const FOLD_AT: usize = 100_000;
const NODE: &str = "5f0c6a2e-8d1b-4c3a-9e7f-1a2b3c4d5e6f";

fn setting(key: String, i: u64) -> Record {
    Record::Setting(Setting {
        key,
        value: serde_json::json!(i),
        removed: false,
        version: Version { wall_ms: 1_700_000_000_000 + i, counter: 0, node: NodeId::new(NODE) },
    })
}

/// The i-th key, in the order they arrive (ids or paths created in order).
fn ordered_key(i: usize) -> String {
    format!("bench.{i:08}")
}

/// The i-th distinct key, spread over the key space (a bijection on u32): every batch lands all
/// over the table.
fn spread_key(i: usize) -> String {
    format!("bench.{:08x}", (i as u32).wrapping_mul(2_654_435_761))
}

fn fresh_store() -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = redb::Database::create(dir.path().join("cluster.redb")).expect("create db");
    let store = MetaStore::open(Arc::new(db), true).expect("open meta store");
    (dir, store)
}

/// What a run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// `queue` + `flush` of every batch, no fold.
    Flush,
    /// Flushes plus the flusher's folds and the final one.
    FlushAndFold,
    /// Only the folds of `FlushAndFold`.
    Fold,
}

/// Queue and flush `batches` into a fresh durable file, folding like the flusher unless
/// `Measure::Flush`; returns the time measured.
fn run(batches: Batches, measure: Measure) -> Duration {
    let (_dir, store) = fresh_store();
    let fold = measure != Measure::Flush;
    let mut journal = 0;
    let mut folding = Duration::ZERO;
    let mut timed_fold = |store: &MetaStore| {
        let start = Instant::now();
        store.fold().expect("fold");
        folding += start.elapsed();
    };
    let start = Instant::now();
    for batch in batches {
        store.queue(batch);
        journal += store.flush().expect("flush");
        if fold && journal > FOLD_AT {
            timed_fold(&store);
            journal = 0;
        }
    }
    if fold {
        timed_fold(&store);
    }
    let total = start.elapsed();
    match measure {
        Measure::Flush | Measure::FlushAndFold => total,
        Measure::Fold => folding,
    }
}

type Batches = Vec<Vec<MetaPersist>>;
/// A benchmark's name and how to build its batches.
type Case = (&'static str, fn() -> Batches);

/// `TOTAL` ops in batches of `PER_FLUSH`, the i-th built by `op(i)`.
fn batches(op: impl Fn(usize) -> Vec<MetaPersist>) -> Batches {
    (0..TOTAL / PER_FLUSH).map(|f| (f * PER_FLUSH..(f + 1) * PER_FLUSH).flat_map(&op).collect()).collect()
}

fn put_setting(key: String, i: usize) -> Vec<MetaPersist> {
    vec![MetaPersist::PutRecord(setting(key, i as u64))]
}

/// A change as the log produces it: the record, its log entry and the log's meta.
fn change(key: String, i: usize) -> Vec<MetaPersist> {
    let seq = i as u64 + 1;
    let record = setting(key, i as u64);
    let entry = Entry {
        seq: LogIndex(seq),
        term: Term(1),
        version: record.max_version(),
        record: record.clone(),
        origin: NodeId::new(NODE),
    };
    vec![
        MetaPersist::PutRecord(record),
        MetaPersist::PutEntry(entry),
        MetaPersist::PutLogMeta(LogMeta { term: Term(1), last_seq: LogIndex(seq), ..LogMeta::default() }),
    ]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("meta_persist");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.throughput(Throughput::Elements(TOTAL as u64));

    let cases: [Case; 5] = [
        ("put_settings_200k_ordered", || batches(|i| put_setting(ordered_key(i), i))),
        ("put_settings_200k_random", || batches(|i| put_setting(spread_key(i), i))),
        ("coalesce_1k_keys", || batches(|i| put_setting(spread_key(i % 1000), i))),
        ("put_changes_200k_ordered", || batches(|i| change(ordered_key(i), i))),
        ("put_changes_200k_random", || batches(|i| change(spread_key(i), i))),
    ];
    for (name, make) in cases {
        for (what, measure) in
            [("flush", Measure::Flush), ("flush_and_fold", Measure::FlushAndFold), ("fold", Measure::Fold)]
        {
            g.bench_function(BenchmarkId::new(name, what), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| run(make(), measure)).sum());
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
