//! One seeded run: form a cluster, a safety phase of random faults with invariants checked
//! every simulated second, then a liveness phase that heals everything and requires
//! convergence within two heartbeat intervals.

use crate::env::ClockFault;
use crate::harness::{Harness, SimConfig};
use shoal_core::SeededRng;

#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub digest: String,
    pub faults: usize,
    pub sim_ms: u64,
}

/// Options of a run beyond the seed.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub nodes_min: usize,
    pub nodes_max: usize,
    /// Length of the fault phase.
    pub chaos_ms: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { nodes_min: 3, nodes_max: 5, chaos_ms: 240_000 }
    }
}

fn fail(h: &Harness, seed: u64, why: String) -> String {
    let tail: Vec<&String> = h.log.iter().rev().take(40).collect();
    let tail: Vec<String> = tail.into_iter().rev().cloned().collect();
    let ids: Vec<String> = h.ids.iter().enumerate().map(|(i, id)| format!("n{i}={}", &id.as_str()[..8])).collect();
    format!(
        "seed {seed} failed (replay with SEED={seed}): {why}\nnodes: {}\nlast events:\n{}",
        ids.join(" "),
        tail.join("\n")
    )
}

/// Run `seed` with the default options.
pub fn run_seed(seed: u64) -> Result<RunReport, String> {
    run_seed_with(seed, &RunOptions::default())
}

pub fn run_seed_with(seed: u64, opts: &RunOptions) -> Result<RunReport, String> {
    let mut rng = SeededRng::new(seed ^ 0x5eed_5eed);
    let span = (opts.nodes_max - opts.nodes_min + 1) as u64;
    let n = opts.nodes_min + rng.below(span) as usize;
    let mut h = Harness::new(SimConfig::new(seed, n));
    h.form_cluster().map_err(|e| fail(&h, seed, e))?;
    let interval = h.cfg.membership.heartbeat_interval_ms;
    h.step_for(interval + 2_000).map_err(|e| fail(&h, seed, e))?;
    h.check_converged().map_err(|e| fail(&h, seed, format!("after forming: {e}")))?;
    if h.live_members().len() != n {
        return Err(fail(&h, seed, format!("only {:?} of {n} nodes are members after forming", h.live_members())));
    }

    // Safety phase: a random fault roughly every 10 s, invariants checked every second.
    let mut faults = 0;
    let mut removed_one = false;
    let end = h.elapsed_ms() + opts.chaos_ms;
    while h.elapsed_ms() < end {
        // Some writes, through any running node (partitioned or not). They come at least a
        // second before the next fault: a crash within the 50 ms write-behind window of an
        // unreplicated write may lose it, by design.
        for _ in 0..rng.below(4) {
            let w = rng.below(n as u64) as usize;
            if h.is_running(w) {
                let key = format!("k{}", rng.below(12));
                let value = serde_json::json!(rng.below(1_000_000));
                h.write_setting(w, &key, value).map_err(|e| fail(&h, seed, e))?;
            }
        }
        let wait = 1_000 + rng.below(19_000);
        let until = h.elapsed_ms() + wait;
        while h.elapsed_ms() < until {
            h.step_for(1_000).map_err(|e| fail(&h, seed, e))?;
            h.check_always().map_err(|e| fail(&h, seed, e))?;
            h.check_meta_always().map_err(|e| fail(&h, seed, e))?;
        }
        let a = rng.below(n as u64) as usize;
        let b = (a + 1 + rng.below(n as u64 - 1) as usize) % n;
        faults += 1;
        match rng.below(100) {
            0..=19 => h.partition(a, b),
            20..=29 => h.partition_oneway(a, b),
            30..=33 => h.hold(a, b),
            34..=37 => h.release(a, b),
            38..=47 => {
                let ms = 1 + rng.below(300);
                h.set_latency(a, b, ms)
            }
            48..=59 => h.crash(a),
            60..=71 => {
                if !h.is_running(a) {
                    h.bounce(a)
                } else {
                    h.heal_network()
                }
            }
            72..=79 => {
                let offset_ms = rng.below(480_001) as i64 - 240_000;
                let drift_ppm = rng.below(401) as i64 - 200;
                h.set_clock(a, ClockFault { offset_ms, drift_ppm })
            }
            80..=91 => {
                if h.is_running(a) {
                    let id = h.ids[b].to_string();
                    let state = ["maintenance", "draining", "active", "active"][rng.below(4) as usize];
                    // The answer may be an error (a is partitioned, or not a member any more): fine.
                    let _ =
                        h.api(a, &format!("POST /v1/nodes/{id}/state"), Some(serde_json::json!({ "state": state })));
                }
            }
            _ => {
                if !removed_one && n > 3 && h.is_running(a) && a != b {
                    removed_one = true;
                    let _ = h.remove_node(a, b);
                }
            }
        }
    }

    // Liveness phase: heal everything, bring every node back, require convergence.
    h.heal_network();
    for i in 0..n {
        if !h.is_running(i) {
            h.bounce(i);
        }
    }
    let bound = 2 * interval + 5_000;
    let deadline = h.elapsed_ms() + bound;
    let mut last_err = String::new();
    while h.elapsed_ms() < deadline {
        h.step_for(1_000).map_err(|e| fail(&h, seed, e))?;
        h.check_always().map_err(|e| fail(&h, seed, e))?;
        match h.check_converged() {
            Ok(()) => {
                last_err.clear();
                break;
            }
            Err(e) => last_err = e,
        }
    }
    if !last_err.is_empty() {
        return Err(fail(&h, seed, format!("not converged {bound} ms after heal: {last_err}")));
    }
    // The metadata store: one leader within one lease period of the heal, then every
    // acknowledged write everywhere and identical record sets.
    let lease_bound = h.cfg.membership.heartbeat_interval_ms * 2 + 5_000;
    let heal_at = h.elapsed_ms();
    loop {
        match h.check_one_leader() {
            Ok(_) => break,
            Err(e) if h.elapsed_ms() - heal_at > lease_bound + 30_000 => {
                return Err(fail(&h, seed, format!("no single leader {} ms after heal: {e}", h.elapsed_ms() - heal_at)))
            }
            Err(_) => {}
        }
        h.step_for(1_000).map_err(|e| fail(&h, seed, e))?;
        h.check_meta_always().map_err(|e| fail(&h, seed, e))?;
    }
    let data_deadline = h.elapsed_ms() + 90_000;
    loop {
        match h.check_meta_converged() {
            Ok(()) => break,
            Err(e) if h.elapsed_ms() > data_deadline => {
                return Err(fail(&h, seed, format!("metadata not converged 90 s after a leader: {e}")))
            }
            Err(_) => {}
        }
        h.step_for(1_000).map_err(|e| fail(&h, seed, e))?;
        h.check_always().map_err(|e| fail(&h, seed, e))?;
        h.check_meta_always().map_err(|e| fail(&h, seed, e))?;
    }
    let want = n - usize::from(removed_one);
    if h.live_members().len() != want {
        return Err(fail(&h, seed, format!("{:?} are members after heal, want {want} nodes", h.live_members())));
    }
    if std::env::var_os("SHOAL_SIM_LOG").is_some() {
        eprintln!("{}", h.log.join("\n"));
    }
    Ok(RunReport { seed, digest: h.digest(), faults, sim_ms: h.elapsed_ms() })
}
