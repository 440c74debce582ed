//! One seeded run of jobs and map/reduce under faults (issue 14 "Tests and simulation"; spec
//! "Jobs (AJR / AJS)", "Map / reduce").
//!
//! 3 or 4 nodes, each with a volume, two copies of everything under /data, and 150 small text
//! files there. Submitted through random nodes: a dozen jobs that work 5 to 40 s each, a word
//! count map/reduce over the files (partitions of 10, so 15 or more maps), and one job that would
//! work for ten minutes and is cancelled from another node. Then faults every few seconds:
//! crashes and restarts (the leader among them), partitions, held links; odd seeds skew every
//! clock by up to ±4 minutes. The jobs run in the simulator's engine (`JobsEngine::Simulated`:
//! the same shell and core, no JavaScript).
//!
//! Checked every simulated second: no job is running on two live nodes at once; a job a node
//! has seen end keeps that end on that node, and no two nodes see different ends. After heal:
//! every job ends; the dozen succeed; the cancelled one ends cancelled and runs nowhere; the word
//! count equals counting the files directly.

use crate::drive_run::{drive_cluster, wait_until};
use crate::run::RunReport;
use serde_json::{json, Value};
use shoal_core::meta::job::JobStatus;
use shoal_core::SeededRng;
use std::collections::{BTreeMap, BTreeSet};

const FILES: usize = 150;
const WORDS: [&str; 12] =
    ["alpha", "beta", "gamma", "delta", "shoal", "node", "lease", "map", "reduce", "job", "copy", "leader"];

fn submit(h: &mut crate::Harness, via: usize, body: Value) -> Result<String, String> {
    match h.api(via, "POST /v1/jobs", Some(body))? {
        (200, v) => v["id"].as_str().map(str::to_string).ok_or_else(|| format!("no id in {v}")),
        (s, v) => Err(format!("submit through n{via}: HTTP {s} {v}")),
    }
}

/// The status of `job` on node `i`, if it knows the job.
fn status_on(h: &crate::Harness, i: usize, job: &str) -> Option<JobStatus> {
    h.read(i, |n, _| n.job_status(job).ok().map(|v| v.status)).flatten()
}

pub fn run_jobs_seed(seed: u64) -> Result<RunReport, String> {
    let mut rng = SeededRng::new(seed ^ 0x10b5_5eed);
    let n = 3 + rng.below(2) as usize;
    let mut h = drive_cluster(seed, n, 2).map_err(|e| format!("jobs seed {seed}: setup: {e}"))?;
    let fail = |h: &crate::Harness, e: String| format!("jobs seed {seed}: {e}\n{}", h.log.join("\n"));

    // The dataset, and its word count computed here.
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for f in 0..FILES {
        let words: Vec<&str> = (0..5 + rng.below(40)).map(|_| WORDS[rng.below(WORDS.len() as u64) as usize]).collect();
        let text = words.join(" ");
        for w in &words {
            *want.entry(w.to_string()).or_default() += 1;
        }
        let path = format!("/data/books/b{f:03}.txt");
        loop {
            let via = rng.below(n as u64) as usize;
            if let Ok((200, _)) = h.put_file(via, &path, &text) {
                break;
            }
            h.run_checked(1_000).map_err(|e| fail(&h, e))?;
        }
    }
    // (The harness stores a put's content as a JSON string: the quotes are no letters, so the
    // count is the same.)

    let mut plain = Vec::new();
    for k in 0..12 {
        let via = rng.below(n as u64) as usize;
        let work = 5_000 + rng.below(35_000);
        let body = json!({"name": format!("work {k}"), "script": "function run(){}", "args": {"workMs": work},
            "maxAttempts": 20, "timeoutSec": 3600});
        plain.push(submit(&mut h, via, body).map_err(|e| fail(&h, e))?);
    }
    let wc = submit(
        &mut h,
        0,
        json!({"name": "wc", "script": "function mapper(){} function reducer(){}",
        "dataset": "cluster:/data/books/*", "partitionMax": 10, "maxAttempts": 20}),
    )
    .map_err(|e| fail(&h, e))?;
    let long = submit(
        &mut h,
        1,
        json!({"name": "long", "script": "function run(){}", "args": {"workMs": 600_000},
        "maxAttempts": 20}),
    )
    .map_err(|e| fail(&h, e))?;
    let mut all: Vec<String> = plain.clone();
    all.push(wc.clone());
    all.push(long.clone());

    let mut faults = 0usize;
    let mut ends: BTreeMap<String, JobStatus> = BTreeMap::new();
    let mut cancelled_at: Option<u64> = None;
    let chaos_end = h.elapsed_ms() + 60_000;
    let check = |h: &crate::Harness, ends: &mut BTreeMap<String, JobStatus>| -> Result<(), String> {
        let mut running: BTreeMap<String, usize> = BTreeMap::new();
        for i in h.live_members() {
            for (job, _) in h.read(i, |node, _| node.jobs_running()).unwrap_or_default() {
                if let Some(j) = running.insert(job.to_string(), i) {
                    return Err(format!("job {job} runs on n{j} and n{i} at once"));
                }
            }
            let finals: Vec<(String, JobStatus)> = h
                .read(i, |node, _| {
                    node.job_list(true)
                        .jobs
                        .into_iter()
                        .filter(|v| v.status.is_final())
                        .map(|v| (v.id.to_string(), v.status))
                        .collect()
                })
                .unwrap_or_default();
            for (job, st) in finals {
                match ends.get(&job) {
                    Some(seen) if *seen != st => {
                        return Err(format!("job {job} ended {seen:?} and then {st:?} (on n{i})"))
                    }
                    _ => {
                        ends.insert(job, st);
                    }
                }
            }
        }
        Ok(())
    };
    while h.elapsed_ms() < chaos_end {
        let until = h.elapsed_ms() + 2_000 + rng.below(6_000);
        while h.elapsed_ms() < until {
            h.run_checked(1_000).map_err(|e| fail(&h, e))?;
            check(&h, &mut ends).map_err(|e| fail(&h, e))?;
        }
        if cancelled_at.is_none() && h.elapsed_ms() + 30_000 > chaos_end {
            let via = (0..n).find(|&i| h.is_running(i)).unwrap_or(0);
            if let Ok((200, _)) = h.api(via, &format!("POST /v1/jobs/{long}/cancel"), None) {
                cancelled_at = Some(h.elapsed_ms());
            }
        }
        let a = rng.below(n as u64) as usize;
        let b = (a + 1 + rng.below(n as u64 - 1) as usize) % n;
        faults += 1;
        match rng.below(100) {
            0..=24 => h.partition(a, b),
            25..=34 => h.hold(a, b),
            35..=44 => h.release(a, b),
            45..=64 => {
                // Crash a node (often the one running most) and bring it back a few seconds on.
                h.crash(a);
            }
            65..=84 => {
                if h.is_running(a) {
                    h.heal_network()
                } else {
                    h.bounce(a)
                }
            }
            _ => {
                // Kill the leader mid-run.
                let leader = (0..n).find(|&i| h.read(i, |node, now| node.leader_term(now).is_some()).unwrap_or(false));
                if let Some(l) = leader {
                    h.crash(l);
                }
            }
        }
    }
    // Heal, then every job ends on every node.
    h.heal_network();
    for i in 0..n {
        if !h.is_running(i) {
            h.bounce(i);
        }
    }
    // Not cancelled during the faults (no node was up to ask, say): cancelled now, once every
    // node is back (seed 318 asked n0 while all three were down).
    if cancelled_at.is_none() {
        let (s, v) = h.api(0, &format!("POST /v1/jobs/{long}/cancel"), None).map_err(|e| fail(&h, e))?;
        if s != 200 && s != 409 {
            return Err(fail(&h, format!("cancel: HTTP {s} {v}")));
        }
    }
    let mut last = String::new();
    let ended = wait_until(&mut h, 600_000, "every job ends, seen so on every node", |h| {
        check(h, &mut ends)?;
        for job in &all {
            for i in 0..n {
                match status_on(h, i, job) {
                    Some(st) if st.is_final() => {}
                    other => {
                        let views: Vec<String> = (0..n)
                            .map(|k| {
                                let v = h.read(k, |node, now| {
                                    let running = node.jobs_running();
                                    let leader = node.meta_leader(now).map(|l| (l.holder.to_string(), l.term.0));
                                    let v = node
                                        .job_status(job)
                                        .ok()
                                        .map(|v| serde_json::to_string(&v).unwrap_or_default());
                                    let kids: Vec<String> = node
                                        .job_status(job)
                                        .map(|v| v.children)
                                        .unwrap_or_default()
                                        .iter()
                                        .map(|c| {
                                            format!(
                                                "{c}:{:?}",
                                                node.job_status(c.as_str()).ok().map(|v| (
                                                    v.status,
                                                    v.leased_to,
                                                    v.reason
                                                ))
                                            )
                                        })
                                        .collect();
                                    format!("leader {leader:?} running {running:?} view {v:?} children {kids:?}")
                                });
                                format!("n{k} ({}): {v:?}", h.ids[k])
                            })
                            .collect();
                        last = format!("{job} on n{i}: {other:?}\n{}", views.join("\n"));
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    });
    ended.map_err(|e| fail(&h, format!("{e}: {last}")))?;
    for job in &plain {
        let v = h.read(0, |node, _| node.job_status(job).ok()).flatten().ok_or("gone")?;
        if v.status != JobStatus::Succeeded {
            return Err(fail(&h, format!("job {job} ended {:?}: {}", v.status, v.error)));
        }
    }
    if status_on(&h, 0, &long) != Some(JobStatus::Cancelled) {
        return Err(fail(&h, format!("the cancelled job ended {:?}", status_on(&h, 0, &long))));
    }
    let running: BTreeSet<usize> = (0..n)
        .filter(|&i| h.read(i, |node, _| node.jobs_running().iter().any(|(j, _)| j.as_str() == long)).unwrap_or(false))
        .collect();
    if !running.is_empty() {
        return Err(fail(&h, format!("the cancelled job still runs on {running:?}")));
    }
    let v = h.read(0, |node, _| node.job_status(&wc).ok()).flatten().ok_or("gone")?;
    if v.status != JobStatus::Succeeded {
        return Err(fail(&h, format!("the word count ended {:?}: {}", v.status, v.error)));
    }
    let got: BTreeMap<String, u64> =
        serde_json::from_value(v.output.clone()).map_err(|e| fail(&h, format!("{e}: {}", v.output)))?;
    if got != want {
        return Err(fail(&h, format!("the word count is wrong: got {got:?}, want {want:?}")));
    }
    if std::env::var("SHOAL_SIM_VERBOSE").is_ok() {
        let attempts: Vec<u32> = plain
            .iter()
            .filter_map(|j| h.read(0, |node, _| node.job_status(j).ok().map(|v| v.attempts)).flatten())
            .collect();
        eprintln!("jobs seed {seed}: {n} nodes, {faults} faults, attempts {attempts:?}, {} maps", v.children.len() - 1);
    }
    Ok(RunReport { seed, digest: h.digest(), faults, sim_ms: h.elapsed_ms() })
}
