//! One seeded run: form a cluster, a safety phase of random faults with invariants checked
//! every simulated second, then a liveness phase that heals everything and requires
//! convergence within two heartbeat intervals.

use crate::env::ClockFault;
use crate::harness::{Harness, SimConfig};
use serde_json::Value;
use shoal_core::meta::records::{json_depth, API_VALUE_DEPTH_MAX};
use shoal_core::SeededRng;

/// A setting value: mostly a number; else nested arrays and objects of a random depth (up to
/// past serde_json's own limit of 128) or a long string (up to past the 64 KiB bound).
fn random_value(rng: &mut SeededRng) -> Value {
    match rng.below(10) {
        0..=5 => serde_json::json!(rng.below(1_000_000)),
        6..=8 => {
            let depth = 1 + rng.below(140) as usize;
            let mut v = serde_json::json!(rng.below(100));
            for d in 1..depth {
                v = if d % 2 == 0 { Value::Array(vec![v]) } else { serde_json::json!({ "k": v }) };
            }
            v
        }
        _ => Value::String("x".repeat(rng.below(80 * 1024) as usize)),
    }
}

/// Config keys the sweep writes at the mesh level: ones whose value changes no invariant the
/// sweep checks (there are no volumes and no files in it).
const CONFIG_KEYS: [&str; 2] = ["storage.rescan_every", "replication.plan_every"];

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
    // Config-plane values sent at the mesh level (key -> minutes), answered or not: whatever
    // wins must be one of them, and every node must resolve the same.
    let mut config_sent: std::collections::BTreeMap<&str, std::collections::BTreeSet<u64>> = Default::default();
    // Config writes answered 200: key -> (the node written through, how it was acknowledged).
    let mut config_acked: std::collections::BTreeMap<&str, Vec<(usize, Option<String>)>> = Default::default();
    let mut removed_one = false;
    let end = h.elapsed_ms() + opts.chaos_ms;
    while h.elapsed_ms() < end {
        // Some writes, through any running node (partitioned or not). They come at least a
        // second before the next fault: a crash within the 50 ms write-behind window of an
        // unreplicated write may lose it, by design.
        // Values of random depth and size: those out of the API's bounds must be refused with
        // a 400 and never reach the log; the rest must never be refused as bad values.
        for _ in 0..rng.below(4) {
            let w = rng.below(n as u64) as usize;
            if h.is_running(w) {
                let key = format!("k{}", rng.below(12));
                let value = random_value(&mut rng);
                let in_bounds = json_depth(&value) <= API_VALUE_DEPTH_MAX
                    && value.to_string().len() <= shoal_core::node::SETTING_VALUE_MAX_BYTES;
                let status = h.write_setting_status(w, &key, value).map_err(|e| fail(&h, seed, e))?;
                if (in_bounds && status == 400) || (!in_bounds && status == 200) {
                    let why = format!("a setting value in bounds: {in_bounds}, answered {status}");
                    return Err(fail(&h, seed, why));
                }
            }
        }
        if rng.below(3) == 0 {
            let w = rng.below(n as u64) as usize;
            if h.is_running(w) {
                let key = CONFIG_KEYS[rng.below(CONFIG_KEYS.len() as u64) as usize];
                let minutes = 1 + rng.below(120);
                config_sent.entry(key).or_default().insert(minutes);
                let body =
                    serde_json::json!({"action": "set", "key": key, "value": format!("{minutes}m"), "why": "sweep"});
                // A node cut off from the others may refuse (no leader): fine. Never a 5xx.
                if let Ok((status, v)) = h.api(w, "POST /v1/config", Some(body)) {
                    if status >= 500 {
                        return Err(fail(&h, seed, format!("a config write answered {status}: {v}")));
                    }
                    if status == 200 {
                        config_acked.entry(key).or_default().push((w, h.last_ack.clone()));
                    }
                }
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
    // A follower never stalled on an entry it could not read: none was ever refused.
    for i in h.live_members() {
        if let Some(refused) = h.snapshot(i).map(|s| s.meta_refused).filter(|r| *r > 0) {
            return Err(fail(&h, seed, format!("n{i} refused {refused} metadata entries or records")));
        }
    }
    // The config plane: once the records agree, every node's config pass (every 5 s) resolves
    // the same value from the same level for each key written; an acknowledged write is never
    // lost (the mesh level holds a value), and the value is one that was sent.
    h.step_for(6_000).map_err(|e| fail(&h, seed, e))?;
    for key in CONFIG_KEYS {
        let (module, name) = key.split_once('.').expect("module.key");
        let mut seen: Option<(usize, Option<Value>, String)> = None;
        for i in h.live_members() {
            let (v, source) = h
                .read(i, |n, _| {
                    let r = n.config_resolved_own().get(module).and_then(|m| m.get(name)).cloned();
                    let source = r.as_ref().and_then(|r| serde_json::to_value(r.source).ok());
                    (r.and_then(|r| r.value), source.and_then(|s| s.as_str().map(str::to_string)).unwrap_or_default())
                })
                .unwrap_or_default();
            match &seen {
                None => seen = Some((i, v, source)),
                Some((j, other, other_source)) if *other != v || *other_source != source => {
                    let why = format!("n{i} resolves {key} = {v:?} ({source}), n{j} {other:?} ({other_source})");
                    return Err(fail(&h, seed, why));
                }
                Some(_) => {}
            }
        }
        let Some((_, v, source)) = seen else { continue };
        // Held by another node (`replicated`, `durable`) is never lost. Otherwise the write
        // waits in its node's pending queue: a node removed while cut off, before or after the
        // write, still answers and its waiting writes go with it (as for settings).
        let kept = config_acked.get(key).is_some_and(|w| {
            w.iter().any(|(origin, ack)| {
                matches!(ack.as_deref(), Some("replicated" | "durable")) || !h.removed_nodes.contains(origin)
            })
        });
        if kept && source != "mesh" {
            return Err(fail(&h, seed, format!("{key} was acknowledged at the mesh level but resolves from {source}")));
        }
        if source == "mesh" {
            let ms = v.as_ref().and_then(Value::as_u64).unwrap_or(1);
            let sent = config_sent.get(key).cloned().unwrap_or_default();
            if ms % 60_000 != 0 || !sent.contains(&(ms / 60_000)) {
                return Err(fail(&h, seed, format!("{key} resolves to {v:?}, never sent ({sent:?})")));
            }
        }
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
