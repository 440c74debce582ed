//! Config resolution (issue 5 "Speed"): a full resolution of 100 nodes × 20 modules × 50 keys
//! (100,000 resolved values) under 20 ms, and an incremental resolve after one value change
//! under 1 ms. Half the keys fall back to a predefined key; a mesh value is set for a tenth of
//! the predefined keys, node values for some nodes, module values for some modules.
//! `cargo bench --bench config`.

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use shoal_core::config::resolve::{Level, Manifest, Resolver};
use shoal_core::config::types::{Declaration, KeyType};
use shoal_core::NodeId;
use std::collections::{BTreeMap, BTreeSet};

const NODES: usize = 100;
const MODULES: usize = 20;
const KEYS: usize = 50;

fn decl(m: usize, k: usize) -> Declaration {
    Declaration {
        name: format!("key{k:02}"),
        ty: KeyType::Int,
        default: Some(json!(k)),
        required: false,
        min: None,
        max: None,
        pattern: None,
        choices: vec![],
        fallback: k.is_multiple_of(2).then(|| format!("pre.key{k:02}")),
        trusted: false,
        renamed_from: None,
        doc: format!("module {m} key {k}"),
    }
}

fn build() -> Resolver {
    let manifests: Vec<Manifest> = (0..MODULES)
        .map(|m| Manifest { module: format!("mod{m:02}"), keys: (0..KEYS).map(|k| decl(m, k)).collect() })
        .collect();
    let modules: BTreeSet<String> = manifests.iter().map(|m| m.module.clone()).collect();
    let mut r = Resolver::new();
    r.set_build_manifests("b1", manifests);
    let mut values = BTreeMap::new();
    for n in 0..NODES {
        let node = NodeId::new(format!("node-{n:03}"));
        r.set_node(node.clone(), "b1", modules.clone());
        if n.is_multiple_of(10) {
            values.insert(Level::Node { node: node.clone(), key: "pre.key04".into() }, json!(n));
        }
        if n.is_multiple_of(7) {
            values.insert(Level::Module { node, module: "mod03".into(), key: "key05".into() }, json!(n));
        }
    }
    for k in (0..KEYS).step_by(10) {
        values.insert(Level::Mesh { key: format!("pre.key{k:02}") }, json!(1000 + k));
    }
    r.set_values(values);
    r
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("config");
    g.bench_function("full_resolution_100_nodes_20_modules_50_keys", |b| {
        b.iter_batched(
            build,
            |mut r| {
                let changes = r.resolve_all();
                assert_eq!(changes.len(), NODES * MODULES * KEYS, "a first resolution moves every value");
                // Returned, so criterion drops them outside the measurement.
                (r, changes)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    let mut r = build();
    r.resolve_all();
    let mut i = 0u64;
    g.bench_function("incremental_one_mesh_value", |b| {
        b.iter(|| {
            i += 1;
            // A mesh value moves that key in every module on every node (2,000 values).
            let changes = r.set(Level::Mesh { key: "pre.key08".into() }, Some(json!(i)));
            assert_eq!(changes.len(), NODES * MODULES);
        })
    });
    let node = NodeId::new("node-042");
    g.bench_function("incremental_one_node_value", |b| {
        b.iter(|| {
            i += 1;
            r.set(Level::Node { node: node.clone(), key: "pre.key12".into() }, Some(json!(i))).len()
        })
    });
    g.bench_function("incremental_one_module_value", |b| {
        b.iter(|| {
            i += 1;
            let l = Level::Module { node: node.clone(), module: "mod07".into(), key: "key13".into() };
            r.set(l, Some(json!(i))).len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
