//! Simulation scenarios for the metadata store (spec: cluster-runtime.md "Metadata store
//! (ACMS)"; reference-facts.md "Lease", weaknesses 1, 2, 11). Each runs the real shell of every
//! node in turmoil; a failure names its seed, and `SEED` is not needed: each scenario is fixed.

use serde_json::json;
use shoal_sim::env::ClockFault;
use shoal_sim::{Harness, SimConfig};

const INTERVAL: u64 = 15_000;
const LEASE: u64 = 30_000;

fn formed(cfg: SimConfig) -> Harness {
    let n = cfg.nodes;
    let mut h = Harness::new(cfg);
    h.form_cluster().expect("form cluster");
    h.converge_within(2 * INTERVAL + 5_000).expect("membership converges");
    assert_eq!(h.live_members().len(), n);
    let leader = wait_one_leader(&mut h, 2 * LEASE);
    // The creator leads; members joining it never take the lease from it.
    assert_eq!(leader.holder, h.ids[0], "a joining member took the lease");
    assert_eq!(leader.term, shoal_core::Term(1));
    h
}

fn wait_one_leader(h: &mut Harness, bound_ms: u64) -> shoal_core::meta::lease::Lease {
    let start = h.elapsed_ms();
    loop {
        if let Ok(l) = h.check_one_leader() {
            return l;
        }
        assert!(h.elapsed_ms() - start < bound_ms, "no single leader within {bound_ms} ms: {:?}", h.check_one_leader());
        h.run_checked(1_000).unwrap();
        h.check_meta_always().unwrap();
    }
}

fn wait_meta_converged(h: &mut Harness, bound_ms: u64) {
    let start = h.elapsed_ms();
    loop {
        match h.check_meta_converged() {
            Ok(()) => return,
            Err(e) => assert!(h.elapsed_ms() - start < bound_ms, "metadata not converged in {bound_ms} ms: {e}"),
        }
        h.run_checked(1_000).unwrap();
        h.check_meta_always().unwrap();
    }
}

fn leader_index(h: &Harness) -> usize {
    let l = h.check_one_leader().unwrap();
    h.ids.iter().position(|id| *id == l.holder).unwrap()
}

/// After a partition gives each side its own leader, healing leaves exactly one leader within
/// one lease period, and the writes acknowledged on both sides reach every node.
#[test]
fn two_leaders_after_a_partition_resolve_to_one_within_a_lease_period() {
    let mut h = formed(SimConfig::new(201, 4));
    for a in [0, 1] {
        for b in [2, 3] {
            h.partition(a, b);
        }
    }
    h.run_checked(90_000).unwrap();
    h.check_meta_always().unwrap();
    let leaders: Vec<usize> = (0..4)
        .filter(|&i| h.snapshot(i).is_some_and(|s| s.leader.as_ref().is_some_and(|l| l.holder == s.id)))
        .collect();
    assert_eq!(leaders.len(), 2, "each side elects its own leader (no quorum, by design)");
    for (i, key) in [(0, "left"), (1, "left2"), (2, "right"), (3, "right2")] {
        assert!(h.write_setting(i, key, json!(i)).unwrap());
    }
    h.run_checked(2_000).unwrap();
    h.heal_network();
    let healed = h.elapsed_ms();
    wait_one_leader(&mut h, LEASE);
    assert!(h.elapsed_ms() - healed <= LEASE);
    wait_meta_converged(&mut h, 60_000);
}

/// A node cut off while the log is compacted past its position catches up through a snapshot.
#[test]
fn a_node_isolated_past_compaction_catches_up_through_a_snapshot() {
    let mut cfg = SimConfig::new(202, 3);
    cfg.meta.compact_every = 10;
    cfg.meta.keep_entries = 20;
    cfg.meta.snapshot_page_max = 7; // the snapshot arrives in pages
    let mut h = formed(cfg);
    let leader = leader_index(&h);
    let isolated = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    h.partition(isolated, leader);
    h.partition(isolated, other);
    for k in 0..60 {
        assert!(h.write_setting(if k % 2 == 0 { leader } else { other }, &format!("s{k}"), json!(k)).unwrap());
    }
    let before = h.snapshot(isolated).unwrap().snapshots_adopted;
    h.run_checked(5_000).unwrap();
    h.heal_network();
    wait_meta_converged(&mut h, 60_000);
    let after = h.snapshot(isolated).unwrap();
    assert!(after.snapshots_adopted > before, "the isolated node should have needed a snapshot");
    assert!(after.settings.len() >= 60);
}

/// A crashed and restarted node comes back with its records from disk, before any catch-up.
#[test]
fn a_crashed_and_restarted_node_keeps_its_records() {
    let mut h = formed(SimConfig::new(203, 3));
    for k in 0..25 {
        assert!(h.write_setting(k % 3, &format!("c{k}"), json!(k)).unwrap());
    }
    wait_meta_converged(&mut h, 30_000);
    h.run_checked(1_000).unwrap();
    let before = h.snapshot(1).unwrap().meta_digest;
    h.crash(1);
    h.partition(1, 0);
    h.partition(1, 2);
    h.bounce(1);
    h.step_for(500).unwrap();
    let after = h.snapshot(1).expect("restarted");
    assert_eq!(after.meta_digest, before, "records must come back from disk");
    assert!(after.settings.len() >= 25);
    h.heal_network();
    wait_meta_converged(&mut h, 60_000);
}

/// With clocks 4 minutes behind, on time and 4 minutes ahead, a healthy network keeps one leader
/// and its lease never flaps (the reference, comparing wall clocks, fails this).
#[test]
fn four_minute_clock_offsets_keep_one_leader_without_flaps() {
    let mut cfg = SimConfig::new(204, 3);
    cfg.clock_faults = false;
    let mut h = Harness::new(cfg);
    h.set_clock(0, ClockFault { offset_ms: -240_000, drift_ppm: -200 });
    h.set_clock(2, ClockFault { offset_ms: 240_000, drift_ppm: 200 });
    h.form_cluster().unwrap();
    h.converge_within(2 * INTERVAL + 5_000).unwrap();
    let lease = wait_one_leader(&mut h, 2 * LEASE);
    for t in 0..300 {
        h.run_checked(1_000).unwrap();
        h.check_meta_always().unwrap();
        assert_eq!(h.check_one_leader().unwrap(), lease, "lease changed after {t} s");
        if t % 30 == 0 {
            assert!(h.write_setting(t % 3, &format!("w{t}"), json!(t)).unwrap());
        }
    }
    wait_meta_converged(&mut h, 30_000);
}

/// A two-node cluster fails over: when the leader dies, the survivor takes the lease and keeps
/// taking writes.
#[test]
fn a_two_node_cluster_fails_over() {
    let mut h = formed(SimConfig::new(205, 2));
    let leader = leader_index(&h);
    let survivor = 1 - leader;
    assert!(h.write_setting(survivor, "before", json!(1)).unwrap());
    h.run_checked(2_000).unwrap();
    h.crash(leader);
    let crashed = h.elapsed_ms();
    let new = wait_one_leader(&mut h, 120_000);
    assert_eq!(new.holder, h.ids[survivor]);
    assert!(h.elapsed_ms() - crashed <= 45_000 + LEASE, "failover took {} ms", h.elapsed_ms() - crashed);
    let last_before = h.snapshot(survivor).unwrap().meta_records;
    assert!(h.write_setting(survivor, "after", json!(2)).unwrap());
    h.run_checked(1_000).unwrap();
    let s = h.snapshot(survivor).unwrap();
    assert!(s.meta_records > last_before && s.pending == 0, "the new leader appends at once");
    h.bounce(leader);
    wait_meta_converged(&mut h, 60_000);
}

/// A leader that crashes right after acknowledging writes (inside the 50 ms write-behind window)
/// and restarts at once: its followers hold writes it lost from disk. It must not act on its old
/// lease with a shorter log; the cluster reconciles and every acknowledged write is kept.
#[test]
fn a_leader_restarted_inside_the_flush_window_does_not_diverge() {
    let mut h = formed(SimConfig::new(206, 3));
    let leader = leader_index(&h);
    for k in 0..5 {
        assert!(h.write_setting(leader, &format!("pre{k}"), json!(k)).unwrap());
    }
    h.run_checked(1_000).unwrap();
    assert!(h.write_setting(leader, "tail", json!("acknowledged")).unwrap());
    h.crash(leader);
    h.bounce(leader);
    h.run_checked(1_000).unwrap();
    wait_one_leader(&mut h, 3 * LEASE);
    wait_meta_converged(&mut h, 90_000);
}

/// Regression (seed 332): an admin put every remaining node in maintenance or draining; with no
/// ONLINE member the lease falls back to members that are up, so pending writes still drain.
#[test]
fn seed_332_every_node_in_an_admin_state_still_gets_a_leader() {
    shoal_sim::run_seed(332).unwrap();
}

/// Issue 18 "Acknowledged means safe": a single-node install is always alone, so with the
/// default `meta.ack` each write is answered `alone` once the node's store has committed it, and
/// its crash right after the answers (the simulator's crash drops the unflushed write buffer)
/// loses nothing acknowledged. Before, it answered `replicated` at once (its log counts a lone
/// leader's entries held), with the write still in the 50 ms write-behind buffer.
#[test]
fn a_single_node_install_loses_nothing_acknowledged_when_it_crashes() {
    let mut h = formed(SimConfig::new(419, 1));
    for round in 0..3 {
        for k in 0..12 {
            let key = format!("one.r{round}.k{k}");
            assert!(h.write_setting(0, &key, json!(k)).unwrap(), "{key} acknowledged");
            assert_eq!(h.last_ack.as_deref(), Some("alone"), "{key}");
        }
        h.crash(0);
        h.bounce(0);
        wait_one_leader(&mut h, 3 * LEASE);
        wait_meta_converged(&mut h, 120_000);
    }
}

/// Issue 18 "Acknowledged means safe": with `meta.ack = durable` an answer waits until the
/// write is fsynced in the acknowledging node's journal (group commit) as well as held by
/// another node, so losing power on every node right after the answers (the simulator's crash
/// drops each node's unflushed write buffer) loses nothing acknowledged.
/// `SHOAL_SIM_ACK=replicated` (held by another node, in memory) shows what `durable` adds: then
/// this scenario is expected to fail.
#[test]
fn durable_acknowledgements_survive_power_loss_on_every_node() {
    let mode = std::env::var("SHOAL_SIM_ACK").unwrap_or_else(|_| "durable".into());
    let mut h = formed(SimConfig::new(418, 3));
    let body = json!({"action": "set", "key": "meta.ack", "value": mode, "why": "power loss scenario"});
    let (s, v) = h.api(0, "POST /v1/config", Some(body)).unwrap();
    assert_eq!(s, 200, "{v}");
    // Every node applies it on its next config pass (5 s).
    h.run_checked(15_000).unwrap();
    for round in 0..3 {
        for k in 0..12 {
            let key = format!("power.r{round}.k{k}");
            assert!(h.write_setting(k % 3, &key, json!(k)).unwrap(), "{key} acknowledged");
        }
        // Power goes on every node at once, right after the last answer.
        for i in 0..3 {
            h.crash(i);
        }
        for i in 0..3 {
            h.bounce(i);
        }
        wait_one_leader(&mut h, 3 * LEASE);
        wait_meta_converged(&mut h, 120_000);
    }
}
