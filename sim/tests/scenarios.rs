//! Simulation scenarios for membership (spec: cluster-runtime.md "Membership", "Joining";
//! reference-facts.md "Liveness"), each running the real shell code of every node in turmoil.
//! A failing run prints its seed; `SEED=n cargo test -p shoal-sim --test scenarios` replays it.

use shoal_core::membership::NodeState;
use shoal_sim::env::ClockFault;
use shoal_sim::run::run_seed;
use shoal_sim::{Harness, SimConfig};

const INTERVAL: u64 = 15_000;

fn formed(seed: u64, nodes: usize, clock_faults: bool) -> Harness {
    let mut cfg = SimConfig::new(seed, nodes);
    cfg.clock_faults = clock_faults;
    let mut h = Harness::new(cfg);
    h.form_cluster().expect("form cluster");
    h.converge_within(2 * INTERVAL + 5_000).expect("formed cluster converges");
    assert_eq!(h.live_members().len(), nodes);
    h
}

fn state_seen(h: &Harness, observer: usize, subject: usize) -> Option<NodeState> {
    let id = h.ids[subject].clone();
    h.snapshot(observer).and_then(|s| s.states.get(&id).copied())
}

/// "The same seed run twice gives the same trace digest."
#[test]
fn the_same_seed_gives_the_same_trace_digest() {
    let a = run_seed(7).unwrap();
    let b = run_seed(7).unwrap();
    assert_eq!(a.digest, b.digest, "seed 7 is not deterministic");
    let c = run_seed(8).unwrap();
    assert_ne!(a.digest, c.digest, "different seeds should explore different runs");
}

/// The bounded CI sweep: `SHOAL_SIM_SEEDS` seeds (default 50) through faults, then heal and
/// converge. `SEED=n` runs only seed n.
#[test]
fn seed_sweep_keeps_every_membership_invariant() {
    let seeds: Vec<u64> = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => {
            let n: u64 = std::env::var("SHOAL_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
            (1..=n).collect()
        }
    };
    let failures: Vec<String> = seeds.iter().filter_map(|&s| run_seed(s).err()).collect();
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds.len(), failures.join("\n\n"));
}

/// Membership: after a two-way partition heals, every live node holds identical membership
/// within two heartbeat intervals, including admin-state changes made on both sides.
#[test]
fn a_healed_partition_converges_within_two_heartbeat_intervals() {
    let mut h = formed(101, 4, true);
    for a in [0, 1] {
        for b in [2, 3] {
            h.partition(a, b);
        }
    }
    h.run_checked(20_000).unwrap();
    let (id3, id0) = (h.ids[3].to_string(), h.ids[0].to_string());
    let (s, _) =
        h.api(0, &format!("POST /v1/nodes/{id3}/state"), Some(serde_json::json!({"state": "maintenance"}))).unwrap();
    assert_eq!(s, 200);
    let (s, _) =
        h.api(2, &format!("POST /v1/nodes/{id0}/state"), Some(serde_json::json!({"state": "draining"}))).unwrap();
    assert_eq!(s, 200);
    h.run_checked(30_000).unwrap();
    assert!(h.check_converged().is_err(), "the two sides cannot agree while partitioned");
    h.heal_network();
    let took = h.converge_within(2 * INTERVAL).unwrap();
    assert!(took <= 2 * INTERVAL, "took {took} ms");
    assert_eq!(state_seen(&h, 1, 3), Some(NodeState::Maintenance));
    assert_eq!(state_seen(&h, 3, 0), Some(NodeState::Draining));
}

/// Liveness thresholds: a crashed node goes UNKNOWN after 45 s of silence and OFFLINE after
/// 3 min; restarted with its data dir, it is back ONLINE with the same identity.
#[test]
fn a_crashed_node_goes_unknown_then_offline_and_returns_with_its_identity() {
    let mut h = formed(102, 3, true);
    h.crash(2);
    h.run_checked(30_000).unwrap();
    assert_eq!(state_seen(&h, 0, 2), Some(NodeState::Online), "still within 45 s");
    h.run_checked(40_000).unwrap();
    assert_eq!(state_seen(&h, 0, 2), Some(NodeState::Unknown));
    assert_eq!(state_seen(&h, 1, 2), Some(NodeState::Unknown));
    h.run_checked(130_000).unwrap();
    assert_eq!(state_seen(&h, 0, 2), Some(NodeState::Offline));
    let id_before = h.ids[2].clone();
    h.bounce(2);
    h.converge_within(2 * INTERVAL).unwrap();
    assert_eq!(h.snapshot(2).unwrap().id, id_before);
    assert_eq!(state_seen(&h, 0, 2), Some(NodeState::Online));
}

/// Weakness 10 / "Membership": a node removed while partitioned learns its removal when it
/// comes back, leaves, and never returns as a member anywhere.
#[test]
fn a_removed_node_never_comes_back() {
    let mut h = formed(103, 4, true);
    for other in 0..3 {
        h.partition(3, other);
    }
    let id3 = h.ids[3].to_string();
    let (s, _) = h.api(0, &format!("DELETE /v1/nodes/{id3}"), None).unwrap();
    assert_eq!(s, 200);
    h.run_checked(20_000).unwrap();
    h.heal_network();
    h.run_checked(3 * INTERVAL).unwrap();
    assert_eq!(h.snapshot(3).unwrap().cluster, None, "the removed node left its cluster");
    for i in 0..3 {
        let s = h.snapshot(i).unwrap();
        assert!(s.removed.contains(&h.ids[3]), "n{i} keeps the tombstone");
        assert!(!s.states.contains_key(&h.ids[3]));
    }
    h.converge_within(INTERVAL).unwrap();
    assert_eq!(h.live_members().len(), 3);
    // Trying to join again with a fresh token is refused: the id was removed.
    let token = h.api(0, "POST /v1/tokens", None).unwrap().1["token"].as_str().unwrap().to_string();
    let (status, body) = h.api(3, "POST /v1/cluster/join", Some(serde_json::json!({ "token": token }))).unwrap();
    assert_eq!(status, 409, "{body}");
    h.run_checked(2 * INTERVAL).unwrap();
}

/// Clock skew: with node clocks 4 minutes behind, on time and 4 minutes ahead (8 minutes
/// between the extremes), a healthy network keeps every node ONLINE and membership identical.
#[test]
fn four_minute_clock_offsets_keep_a_healthy_cluster_online() {
    let mut h = formed(104, 3, false);
    h.set_clock(0, ClockFault { offset_ms: -240_000, drift_ppm: -150 });
    h.set_clock(2, ClockFault { offset_ms: 240_000, drift_ppm: 150 });
    h.converge_within(2 * INTERVAL + 5_000).unwrap();
    for _ in 0..300 {
        h.run_checked(1_000).unwrap();
        h.check_converged().unwrap();
    }
}

/// A one-way partition between two nodes: gossip through a third node keeps both ONLINE.
#[test]
fn a_one_way_partition_is_bridged_by_gossip() {
    let mut h = formed(105, 3, true);
    h.partition_oneway(0, 1);
    for _ in 0..120 {
        h.run_checked(1_000).unwrap();
        assert_eq!(state_seen(&h, 0, 1), Some(NodeState::Online));
        assert_eq!(state_seen(&h, 1, 0), Some(NodeState::Online));
    }
}

/// Regression (seed 2198): a node removed while it was down restarts among peers that also
/// restarted and do not know its clock offset; its requests fail the clock check, and the
/// refusal must still carry its removal so it leaves.
#[test]
fn seed_2198_a_removed_node_with_an_unknown_clock_offset_still_learns_its_removal() {
    shoal_sim::run_seed(2198).unwrap();
}
