//! 10,000 files of 4 KiB put into a 3-node cluster with 16 concurrent clients (issue 4
//! "Speed"), files/s as acknowledged, side by side with the floor of the same work on this
//! disk: the same files written by 16 threads into one folder the durable way a copy is
//! written (part file, fsync, rename, fsync of the folder).
//!
//! Three real `shoal serve` processes on loopback, each with a volume; clients spread over the
//! three nodes; each put is acknowledged only after its copy is fsynced and its record
//! published. Run with policy 1 (default) and policy 2 (`/two` folder). `cargo bench --bench
//! drive_small_files` (env FILES, CLIENTS; BASELINE_BIN for an older binary side by side).
//!
//! Beside each rate: the CPU time per file of the three nodes (from `/proc`) and of the floor's
//! threads (this process, which runs nothing else meanwhile), and the node-to-node requests per
//! put by route (from the nodes' `/metrics`): where a put's cost goes, next to the floor's.

use serde_json::json;
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{acn_requests, call, cpu_ticks, j, requests_between, wait_until, Kill};

/// Put `files` files of 4 KiB under `folder` with `clients` concurrent clients; files/s.
async fn put_all(urls: &[String], tokens: &[String], folder: &str, files: usize, clients: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (urls, tokens, next, folder) = (urls.to_vec(), tokens.to_vec(), next.clone(), folder.to_string());
        tasks.push(tokio::spawn(async move {
            let client = HttpClient::new(TokioEnv::default());
            let node = c % urls.len();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= files {
                    return;
                }
                let body: Vec<u8> = (0..4096).map(|i| ((i + k) % 251) as u8).collect();
                let path = format!("/v1/files{folder}/d{}/f{k}", k % 100);
                let (s, v) = call(&client, &urls[node], &tokens[node], "PUT", &path, body).await;
                assert_eq!(s, 200, "{v}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    files as f64 / start.elapsed().as_secs_f64()
}

/// The same files written durably into one folder by `threads` threads: files/s, and the CPU
/// time per file (µs) those threads used.
fn floor(dir: &Path, files: usize, threads: usize) -> (f64, f64) {
    std::fs::create_dir_all(dir).unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let ticks = cpu_ticks(&[std::process::id()]);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let next = next.clone();
            s.spawn(move || loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= files {
                    return;
                }
                let body: Vec<u8> = (0..4096).map(|i| ((i + k) % 251) as u8).collect();
                let sub = dir.join(format!("d{}", k % 100));
                std::fs::create_dir_all(&sub).unwrap();
                let part = sub.join(format!("f{k}.part"));
                let mut f = std::fs::File::create(&part).unwrap();
                f.write_all(&body).unwrap();
                f.sync_all().unwrap();
                std::fs::rename(&part, sub.join(format!("f{k}"))).unwrap();
                std::fs::File::open(&sub).unwrap().sync_all().unwrap();
            });
        }
    });
    let rate = files as f64 / start.elapsed().as_secs_f64();
    (rate, (cpu_ticks(&[std::process::id()]) - ticks) as f64 * 10_000.0 / files as f64)
}

/// What one phase of puts measured.
struct Phase {
    rate: f64,
    /// CPU time of the cluster's three nodes per file, µs.
    cpu_us: f64,
    /// Node-to-node requests per put, by route.
    requests: String,
    /// The copies' syncs per put: lone, grouped, and shared flushes (from `/metrics`; zero for
    /// a build without them).
    syncs: [f64; 3],
}

/// The cluster's `shoal_disk_syncs_total{how="lone"}`, `{how="grouped"}` and
/// `shoal_disk_sync_groups_total`, summed over its nodes.
async fn disk_syncs(c: &HttpClient<TokioEnv>, urls: &[String], tokens: &[String]) -> [f64; 3] {
    let mut out = [0.0; 3];
    for (url, token) in urls.iter().zip(tokens) {
        let auth = format!("Bearer {token}");
        let Ok(r) = c.request(url, "GET", "/metrics", &[("authorization", &auth)], Vec::new(), 10_000).await else {
            continue;
        };
        for line in String::from_utf8_lossy(&r.body).lines() {
            let slot = match line.split(' ').next() {
                Some("shoal_disk_syncs_total{how=\"lone\"}") => 0,
                Some("shoal_disk_syncs_total{how=\"grouped\"}") => 1,
                Some("shoal_disk_sync_groups_total") => 2,
                _ => continue,
            };
            out[slot] += line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        }
    }
    out
}

/// [`put_all`] into the cluster of `urls` (its node processes `pids`), with its cost.
async fn phase(urls: &[String], tokens: &[String], pids: &[u32], folder: &str, files: usize, clients: usize) -> Phase {
    let c = HttpClient::new(TokioEnv::default());
    let (ticks, before) = (cpu_ticks(pids), acn_requests(&c, urls, tokens, "").await);
    let syncs_before = disk_syncs(&c, urls, tokens).await;
    let rate = put_all(urls, tokens, folder, files, clients).await;
    let cpu_us = (cpu_ticks(pids) - ticks) as f64 * 10_000.0 / files as f64;
    let requests = requests_between(&before, &acn_requests(&c, urls, tokens, "").await, files as f64);
    let after = disk_syncs(&c, urls, tokens).await;
    let syncs = [0, 1, 2].map(|i| (after[i] - syncs_before[i]) / files as f64);
    Phase { rate, cpu_us, requests, syncs }
}

/// Three `shoal serve` processes of `bin` in one cluster, each with a volume, a `/two` folder
/// kept at two copies: their URLs and admin tokens.
async fn cluster(bin: &str, root: &Path, kids: &mut Kill) -> (Vec<String>, Vec<String>) {
    let (urls, tokens) = common::three_nodes(bin, root, kids).await;
    let c = HttpClient::new(TokioEnv::default());
    for i in 0..3 {
        let vol = root.join(format!("vol{i}"));
        let body = j(json!({"path": vol.to_str().unwrap(), "create": true}));
        assert_eq!(call(&c, &urls[i], &tokens[i], "POST", "/v1/volumes", body).await.0, 200);
    }
    assert_eq!(
        call(&c, &urls[0], &tokens[0], "POST", "/v1/policies", j(json!({"folder": "/two", "replicas": 2}))).await.0,
        200
    );
    let ready = wait_until(Duration::from_secs(120), async || {
        let mut ok = true;
        for i in 0..3 {
            let v = call(&c, &urls[i], &tokens[i], "GET", "/v1/volumes", vec![]).await.1;
            let m = call(&c, &urls[i], &tokens[i], "GET", "/v1/meta/status", vec![]).await.1;
            ok &= v["volumes"].as_array().is_some_and(|a| a.len() == 3) && m["leader"].is_string();
        }
        ok
    })
    .await;
    assert!(ready, "cluster ready");
    (urls, tokens)
}

/// `BASELINE_BIN=path/to/older/shoal` runs a second cluster of that binary beside this one,
/// each phase alternating between the two, so the ratio between them is of one run.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let files: usize = std::env::var("FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let clients: usize = std::env::var("CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let baseline = std::env::var("BASELINE_BIN").ok().filter(|b| !b.is_empty());
    let root = tempfile::tempdir().unwrap();
    let mut kids = Kill(Vec::new());
    let (urls, tokens) = cluster(env!("CARGO_BIN_EXE_shoal"), &root.path().join("this"), &mut kids).await;
    let pids: Vec<u32> = kids.0.iter().map(|c| c.id()).collect();
    let base_cluster = match &baseline {
        Some(bin) => {
            let (u, t) = cluster(bin, &root.path().join("base"), &mut kids).await;
            let base_pids: Vec<u32> = kids.0[pids.len()..].iter().map(|c| c.id()).collect();
            Some((u, t, base_pids))
        }
        None => None,
    };

    // The floor before and after the puts: this disk's rate drifts, the mean is reported.
    let floor_before = floor(&root.path().join("floor-1"), files, clients);
    let one = phase(&urls, &tokens, &pids, "/one", files, clients).await;
    let base_one = match &base_cluster {
        Some((u, t, p)) => Some(phase(u, t, p, "/one", files, clients).await),
        None => None,
    };
    let two = phase(&urls, &tokens, &pids, "/two", files, clients).await;
    let base_two = match &base_cluster {
        Some((u, t, p)) => Some(phase(u, t, p, "/two", files, clients).await),
        None => None,
    };
    let floor_after = floor(&root.path().join("floor-2"), files, clients);
    let base = (floor_before.0 + floor_after.0) / 2.0;
    let floor_cpu = (floor_before.1 + floor_after.1) / 2.0;
    println!("{files} files of 4 KiB, {clients} concurrent clients, 3 nodes on loopback ({} cores)", num_cpus());
    println!(
        "  durable local writes (floor): {base:>7.0} files/s  (before {:.0}, after {:.0}); CPU {floor_cpu:.0} µs per file",
        floor_before.0, floor_after.0
    );
    let show = |name: &str, p: &Phase| {
        println!(
            "  {name:<28} {:>7.0} files/s  ({:.0}% of the floor); nodes' CPU {:.0} µs per file",
            p.rate,
            100.0 * p.rate / base,
            p.cpu_us
        );
        println!("  {:<28} node-to-node requests per put: {}", "", p.requests);
        let [lone, grouped, groups] = p.syncs;
        if lone + grouped > 0.0 {
            let per_group = if groups > 0.0 { grouped / groups } else { 0.0 };
            println!(
                "  {:<28} syncs per put: {lone:.2} alone, {grouped:.2} grouped ({per_group:.1} files per shared flush)",
                ""
            );
        }
    };
    show("shoal put, 1 copy:", &one);
    if let Some(b) = &base_one {
        show("  baseline binary, 1 copy:", b);
    }
    show("shoal put, 2 copies:", &two);
    if let Some(b) = &base_two {
        show("  baseline binary, 2 copies:", b);
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
