//! 10,000 files of 4 KiB put into a 3-node cluster with 16 concurrent clients (issue 4
//! "Speed"), files/s as acknowledged, side by side with the floor of the same work on this
//! disk: the same files written by 16 threads into one folder the durable way a copy is
//! written (part file, fsync, rename, fsync of the folder).
//!
//! Three real `shoal serve` processes on loopback, each with a volume; clients spread over the
//! three nodes; each put is acknowledged only after its copy is fsynced and its record
//! published. Run with policy 1 (default) and policy 2 (`/two` folder). `cargo bench --bench
//! drive_small_files` (env FILES, CLIENTS; BASELINE_BIN for an older binary side by side).

use serde_json::{json, Value};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{port, Kill};

async fn call(
    c: &HttpClient<TokioEnv>,
    url: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    match c.request(url, method, path, &[("authorization", &auth)], body, 60_000).await {
        Ok(r) => (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null)),
        Err(e) => (0, json!({ "error": e.to_string() })),
    }
}

fn j(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

async fn wait_until(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

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

/// The same files written durably into one folder by `threads` threads; files/s.
fn floor(dir: &Path, files: usize, threads: usize) -> f64 {
    std::fs::create_dir_all(dir).unwrap();
    let next = Arc::new(AtomicUsize::new(0));
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
    files as f64 / start.elapsed().as_secs_f64()
}

/// Three `shoal serve` processes of `bin` in one cluster, each with a volume, a `/two` folder
/// kept at two copies: their URLs and admin tokens.
async fn cluster(bin: &str, root: &Path, kids: &mut Kill) -> (Vec<String>, Vec<String>) {
    let (mut urls, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let dir = root.join(format!("n{i}"));
        let p = port();
        kids.0.push(
            Command::new(bin)
                .args(["serve", "--data", dir.to_str().unwrap(), "--listen", &format!("127.0.0.1:{p}")])
                .env("SHOAL_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start shoal"),
        );
        urls.push(format!("http://127.0.0.1:{p}"));
        let tf = dir.join("admin.token");
        assert!(wait_until(Duration::from_secs(10), async || tf.exists()).await, "node starts");
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokens.push(std::fs::read_to_string(&tf).unwrap().trim().to_string());
    }
    let c = HttpClient::new(TokioEnv::default());
    assert_eq!(call(&c, &urls[0], &tokens[0], "POST", "/v1/cluster/create", j(json!({"name": "b"}))).await.0, 200);
    for i in 1..3 {
        let t =
            call(&c, &urls[0], &tokens[0], "POST", "/v1/tokens", vec![]).await.1["token"].as_str().unwrap().to_string();
        assert_eq!(call(&c, &urls[i], &tokens[i], "POST", "/v1/cluster/join", j(json!({ "token": t }))).await.0, 200);
    }
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
    let base_cluster = match &baseline {
        Some(bin) => Some(cluster(bin, &root.path().join("base"), &mut kids).await),
        None => None,
    };

    // The floor before and after the puts: this disk's rate drifts, the mean is reported.
    let floor_before = floor(&root.path().join("floor-1"), files, clients);
    let one = put_all(&urls, &tokens, "/one", files, clients).await;
    let base_one = match &base_cluster {
        Some((u, t)) => Some(put_all(u, t, "/one", files, clients).await),
        None => None,
    };
    let two = put_all(&urls, &tokens, "/two", files, clients).await;
    let base_two = match &base_cluster {
        Some((u, t)) => Some(put_all(u, t, "/two", files, clients).await),
        None => None,
    };
    let floor_after = floor(&root.path().join("floor-2"), files, clients);
    let base = (floor_before + floor_after) / 2.0;
    println!("{files} files of 4 KiB, {clients} concurrent clients, 3 nodes on loopback ({} cores)", num_cpus());
    println!("  durable local writes (floor): {base:>7.0} files/s  (before {floor_before:.0}, after {floor_after:.0})");
    println!("  shoal put, 1 copy:            {one:>7.0} files/s  ({:.0}% of the floor)", 100.0 * one / base);
    if let Some(b) = base_one {
        println!("    baseline binary, 1 copy:    {b:>7.0} files/s  ({:.0}% of the floor)", 100.0 * b / base);
    }
    println!("  shoal put, 2 copies:          {two:>7.0} files/s  ({:.0}% of the floor)", 100.0 * two / base);
    if let Some(b) = base_two {
        println!("    baseline binary, 2 copies:  {b:>7.0} files/s  ({:.0}% of the floor)", 100.0 * b / base);
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
