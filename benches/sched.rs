//! The scheduling scorer (issue 13: "rank 100 nodes with all factors: under 20 µs").
//! Side by side: scoring the 100 nodes alone, and ranking them (scores, the hard rule, the
//! DEGRADED hold-back, the sort). `cargo bench --bench sched`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use shoal_core::membership::NodeState;
use shoal_core::sched::{rank, score, Inputs, Weights};
use shoal_core::NodeId;

fn nodes() -> Vec<Inputs> {
    (0..100u32)
        .map(|i| Inputs {
            node: NodeId::new(format!("node-{i:03}")),
            state: match i % 10 {
                3 => NodeState::Degraded,
                7 => NodeState::Offline,
                _ => NodeState::Online,
            },
            locality: (i % 4) as f64 / 4.0,
            cpu_pct: Some((i * 7 % 100) as f64),
            ram: Some(((i as u64 % 16) << 30, 16 << 30)),
            disk_free: Some((i % 50) as f64 / 50.0),
            queue: i % 9,
            latency_ms: (i * 13 % 400) as f64,
            features: Some(((i % 3) as usize, 2)),
            diversity: Some((i % 11) as f64 / 10.0),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let nodes = nodes();
    let w = Weights::default();
    let mut g = c.benchmark_group("sched");
    g.bench_function("score_100_nodes", |b| b.iter(|| nodes.iter().map(|i| score(black_box(i), &w).0).sum::<f64>()));
    g.bench_function("rank_100_nodes_all_factors", |b| {
        b.iter(|| {
            rank(black_box(&nodes), &w, |i| {
                if matches!(i.state, NodeState::Online | NodeState::Degraded) {
                    Ok(())
                } else {
                    Err("node is offline".to_string())
                }
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
