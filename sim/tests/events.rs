//! Simulation scenarios for the event bus (spec "Packages: events"; issue 13): the real shell of
//! every node in turmoil, events published over the real API.
//!
//! Invariant: every fanned-out event raised before a partition heals reaches every node exactly
//! once (at-least-once delivery plus de-duplication by id) within 5 s of the heal; `node.*`
//! events stay on the node that saw them.

use serde_json::json;
use shoal_sim::{Harness, SimConfig};
use std::collections::BTreeMap;

const INTERVAL: u64 = 15_000;

fn formed(seed: u64, n: usize) -> Harness {
    let mut h = Harness::new(SimConfig::new(seed, n));
    h.form_cluster().expect("form cluster");
    h.converge_within(2 * INTERVAL + 5_000).expect("membership converges");
    h
}

/// How many times each `app.*` event id is in node `i`'s ring.
fn app_ids(h: &Harness, i: usize) -> BTreeMap<String, usize> {
    let page = h.read(i, |n, _| n.events_since(0, "app.*", 100_000)).expect("a running node");
    let mut out = BTreeMap::new();
    for e in page.events {
        *out.entry(e.id).or_default() += 1;
    }
    out
}

#[test]
fn events_raised_in_a_partition_reach_every_node_exactly_once_after_the_heal() {
    for seed in [51u64, 52, 53] {
        let mut h = formed(seed, 4);
        // Split {0, 1} from {2, 3}; both sides publish.
        for a in [0, 1] {
            for b in [2, 3] {
                h.partition(a, b);
            }
        }
        let mut published = Vec::new();
        for k in 0..20u64 {
            let via = (k % 4) as usize;
            let (s, v) =
                h.api(via, "POST /v1/events", Some(json!({"type": format!("app.t{k}"), "data": {"k": k}}))).unwrap();
            assert_eq!(s, 200, "seed {seed}: {v}");
            published.push(v["id"].as_str().unwrap().to_string());
            h.run_checked(700).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        // Some retries fail on the cut links meanwhile; then the heal.
        h.run_checked(20_000).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        h.heal_network();
        let healed = h.elapsed_ms();
        loop {
            let all = (0..4).all(|i| {
                let ids = app_ids(&h, i);
                published.iter().all(|id| ids.contains_key(id))
            });
            if all {
                break;
            }
            assert!(h.elapsed_ms() - healed <= 5_000, "seed {seed}: not every event everywhere within 5 s of the heal");
            h.run_checked(100).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        // More time for stray resends: still exactly once.
        h.run_checked(10_000).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for i in 0..4 {
            let ids = app_ids(&h, i);
            assert_eq!(ids.len(), published.len(), "seed {seed}: node {i} has other events: {ids:?}");
            assert!(ids.values().all(|c| *c == 1), "seed {seed}: node {i} kept an event twice: {ids:?}");
        }
        // node.* stays local: each node's node.* events were raised by itself.
        for i in 0..4 {
            let own = h.ids[i].clone();
            let page = h.read(i, |n, _| n.events_since(0, "node.*", 100_000)).unwrap();
            assert!(page.events.iter().all(|e| e.node == own), "seed {seed}: node {i} holds another's node.* event");
        }
    }
}
