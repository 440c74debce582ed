//! One scheduling pass (issue 14: "a scheduling pass over 10,000 queued jobs and 100 nodes:
//! under 50 ms"). Side by side: sorting the queue alone (the floor any pass pays), and the
//! whole pass (order, hard rules, ranking each job handed out with the scorer) with 100 nodes
//! of 8 free slots each, so 800 jobs are ranked and handed out and 9,200 stay queued.
//! `cargo bench --bench jobs`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use shoal_core::ids::JobId;
use shoal_core::jobs::schedule::{self, Candidate, Queued};
use shoal_core::membership::NodeState;
use shoal_core::meta::job::JobSpec;
use shoal_core::records::Capabilities;
use shoal_core::sched::{Inputs, Weights};
use shoal_core::NodeId;

fn candidates() -> Vec<Candidate> {
    (0..100u32)
        .map(|i| {
            let mut inputs = Inputs::new(NodeId::new(format!("node-{i:03}")), NodeState::Online);
            inputs.cpu_pct = Some((i * 7 % 100) as f64);
            inputs.ram = Some(((i as u64 % 16) << 30, 16 << 30));
            inputs.latency_ms = (i * 13 % 400) as f64;
            let mut caps = Capabilities { cpu_cores: 8, total_ram: 16 << 30, os: "linux".into(), ..Default::default() };
            if i % 4 == 0 {
                caps.features.insert("ffmpeg".into(), true);
            }
            Candidate { inputs, caps, free: 8, runs_jobs: true }
        })
        .collect()
}

fn jobs() -> (Vec<JobId>, Vec<JobSpec>) {
    let ids = (0..10_000).map(|i| JobId::new(format!("job-{i:05}"))).collect();
    let specs = (0..10_000u64)
        .map(|i| {
            let mut s = JobSpec { priority: (i % 7) as i32, created: i * 37 % 10_007, ..Default::default() };
            if i % 5 == 0 {
                s.requirements.features = vec!["ffmpeg".into()];
            }
            if i % 11 == 0 {
                s.nodes = vec![NodeId::new(format!("node-{:03}", i % 100))];
            }
            s
        })
        .collect();
    (ids, specs)
}

fn bench(c: &mut Criterion) {
    let (ids, specs) = jobs();
    let cands = candidates();
    let w = Weights::default();
    let mut g = c.benchmark_group("jobs pass, 10,000 queued x 100 nodes");
    g.sample_size(20);
    g.bench_function("sort the queue only (floor)", |b| {
        b.iter(|| {
            let mut q: Vec<Queued> =
                ids.iter().zip(&specs).map(|(id, spec)| Queued { id, spec, blocked: &[] }).collect();
            q.sort_unstable_by(schedule::queue_order);
            black_box(q.len())
        })
    });
    g.bench_function("whole pass (800 handed out)", |b| {
        b.iter(|| {
            let mut q: Vec<Queued> =
                ids.iter().zip(&specs).map(|(id, spec)| Queued { id, spec, blocked: &[] }).collect();
            let mut c = cands.clone();
            let out = schedule::pass(&mut q, &mut c, &w, |_, _| 0.0);
            assert_eq!(out.len(), 800);
            black_box(out.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
