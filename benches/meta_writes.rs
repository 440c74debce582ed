//! 10,000 small writes from one client into a 3-node cluster on loopback, side by side with
//! etcd (3 members on loopback) doing the same puts (issue: "shoal at least 3x etcd's rate").
//!
//! Both are driven by the same HTTP client, one request at a time: shoal through
//! `PUT /v1/settings/{key}` on one node, etcd through its JSON gateway `POST /v3/kv/put` on one
//! member. Reported: writes/s as acknowledged to the client, and the time until all three
//! nodes hold every write. etcd is skipped with a message when its binary is not installed
//! (`apt-get install etcd-server`). `cargo bench --bench meta_writes` (env WRITES).

use base64::Engine;
use serde_json::{json, Value};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{etcd_members, Kill};

async fn call(c: &HttpClient<TokioEnv>, url: &str, token: &str, method: &str, path: &str, body: Value) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(&body).unwrap() };
    match c.request(url, method, path, &[("authorization", &auth)], body, 30_000).await {
        Ok(r) => (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null)),
        Err(e) => (0, json!({ "error": e.to_string() })),
    }
}

async fn wait_until(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

async fn shoal(root: &Path, writes: usize) -> (f64, Duration) {
    let mut kids = Kill(Vec::new());
    let (urls, tokens) = common::three_nodes(env!("CARGO_BIN_EXE_shoal"), root, &mut kids).await;
    let c = HttpClient::new(TokioEnv::default());
    let start = Instant::now();
    for k in 0..writes {
        let (s, v) =
            call(&c, &urls[0], &tokens[0], "PUT", &format!("/v1/settings/bench.k{k}"), json!({"value": k})).await;
        assert_eq!(s, 200, "{v}");
    }
    let took = start.elapsed();
    let all = wait_until(Duration::from_secs(120), async || {
        let mut ok = true;
        for i in 0..3 {
            let v = call(&c, &urls[i], &tokens[i], "GET", "/v1/meta/status", Value::Null).await.1;
            ok &= v["records"].as_u64().unwrap_or(0) >= writes as u64 && v["pending"].as_u64() == Some(0);
        }
        ok
    })
    .await
    .expect("all three hold the writes");
    (writes as f64 / took.as_secs_f64(), took + all)
}

async fn etcd(root: &Path, writes: usize) -> Option<(f64, Duration)> {
    let mut kids = Kill(Vec::new());
    let urls = etcd_members(root, &mut kids)?;
    let c = HttpClient::new(TokioEnv::default());
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let healthy = wait_until(Duration::from_secs(60), async || {
        let mut ok = true;
        for u in &urls {
            ok &= c.request(u, "GET", "/health", &[], Vec::new(), 2_000).await.is_ok_and(|r| r.status == 200);
        }
        ok
    })
    .await;
    healthy?;
    let start = Instant::now();
    for k in 0..writes {
        let body = json!({"key": b64(&format!("bench.k{k}")), "value": b64(&k.to_string())});
        let r = c.request(&urls[0], "POST", "/v3/kv/put", &[], serde_json::to_vec(&body).unwrap(), 30_000).await;
        assert!(r.is_ok_and(|r| r.status == 200), "etcd put failed");
    }
    let took = start.elapsed();
    let range = json!({"key": b64("bench.k"), "range_end": b64("bench.l"), "count_only": true, "serializable": true});
    let all = wait_until(Duration::from_secs(120), async || {
        let mut ok = true;
        for u in &urls {
            let r = c.request(u, "POST", "/v3/kv/range", &[], serde_json::to_vec(&range).unwrap(), 5_000).await;
            let count = r
                .ok()
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .and_then(|v| v["count"].as_str().and_then(|s| s.parse::<u64>().ok()))
                .unwrap_or(0);
            ok &= count >= writes as u64;
        }
        ok
    })
    .await?;
    Some((writes as f64 / took.as_secs_f64(), took + all))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let writes: usize = std::env::var("WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let root = tempfile::tempdir().unwrap();
        let (s_rate, s_all) = shoal(root.path(), writes).await;
        println!("shoal: {writes} writes from one client: {s_rate:>8.0} writes/s; all 3 nodes hold them after {:.2} s", s_all.as_secs_f64());
        match etcd(root.path(), writes).await {
            Some((e_rate, e_all)) => {
                println!("etcd : {writes} writes from one client: {e_rate:>8.0} writes/s; all 3 members hold them after {:.2} s", e_all.as_secs_f64());
                println!("ratio: shoal / etcd = {:.1}x", s_rate / e_rate);
            }
            None => println!("etcd : skipped (no etcd binary on PATH; `apt-get install etcd-server` to compare)"),
        }
    });
}
