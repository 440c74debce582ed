//! Core log apply speed (issue: "core log apply >= 1,000,000 entries/s").
//!
//! - `apply_entries_10k`: 10,000 log entries (small settings, distinct keys) merged into a
//!   record state: the work every node does per entry.
//! - `follower_append_500_json`: a follower taking one `meta/append` of 500 entries through
//!   the real handler, JSON decoding included.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use serde_json::json;
use shoal_core::hlc::Hlc;
use shoal_core::meta::lease::Lease;
use shoal_core::meta::log::Entry;
use shoal_core::meta::machine::{Meta, MetaConfig};
use shoal_core::meta::records::{Record, Setting};
use shoal_core::meta::state::MetaState;
use shoal_core::{LogIndex, Millis, NodeId, Term};

fn entries(n: usize) -> Vec<Entry> {
    let mut hlc = Hlc::new(NodeId::new("leader"));
    (0..n)
        .map(|i| {
            let v = hlc.next(Millis(1_800_000_000_000 + i as u64));
            let rec = Record::Setting(Setting {
                key: format!("bench.k{i}"),
                value: json!(i),
                removed: false,
                version: v.clone(),
            });
            Entry { seq: LogIndex(i as u64 + 1), term: Term(1), record: rec, version: v, origin: NodeId::new("leader") }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let es = entries(10_000);
    let mut g = c.benchmark_group("meta");
    g.throughput(Throughput::Elements(es.len() as u64));
    g.bench_function("apply_entries_10k", |b| {
        b.iter_batched(
            MetaState::new,
            |mut state| {
                for e in &es {
                    let _ = state.apply(&e.record);
                }
                state
            },
            BatchSize::LargeInput,
        )
    });
    let batch: Vec<Entry> = es[..500].to_vec();
    let leader = NodeId::new("leader");
    let lease = Lease { holder: leader.clone(), term: Term(1) };
    let body = serde_json::to_vec(&json!({"lease": lease, "entries": batch, "lastSeq": 500})).unwrap();
    g.throughput(Throughput::Elements(500));
    g.bench_function("follower_append_500_json", |b| {
        b.iter_batched(
            || {
                (
                    Meta::new(NodeId::new("follower"), MetaConfig::default(), Millis(0)),
                    Hlc::new(NodeId::new("follower")),
                )
            },
            |(mut meta, mut hlc)| {
                let r = meta.answer_append(Millis(1), &leader, &body, &mut hlc);
                assert!(r.is_ok(), "{}", r.body);
                meta
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
