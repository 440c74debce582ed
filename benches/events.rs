//! Events across three real nodes on loopback (issue 13: "10,000 app.* events published on one
//! node of three reach a WebSocket subscriber on each other node; events/s and p50/p99 delay,
//! target p99 < 500 ms").
//!
//! Node A takes the publishes (`POST /v1/events`, 8 at a time); B and C each have a subscriber
//! on `GET /v1/events?type=app.bench` (WebSocket). Each event carries the microsecond it was
//! sent; its delay is when a subscriber reads it. Side by side: the rate A accepts publishes
//! (its own answer), and the rate events arrive at each subscriber.
//! `cargo bench --bench events` (env EVENTS, default 10000).

use futures_util::StreamExt;
use serde_json::{json, Value};
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

async fn subscribe(d: &Daemon<TokioEnv>, token: &str, expect: usize, t0: Instant) -> tokio::task::JoinHandle<Vec<u64>> {
    let authority = d.url().trim_start_matches("http://").to_string();
    let mut req = format!("ws://{authority}/v1/events?type=app.bench").into_client_request().unwrap();
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.expect("a feed");
    tokio::spawn(async move {
        let mut delays = Vec::with_capacity(expect);
        while delays.len() < expect {
            let Ok(Some(Ok(msg))) = tokio::time::timeout(Duration::from_secs(30), ws.next()).await else { break };
            if let Message::Text(t) = msg {
                let e: Value = serde_json::from_str(&t).unwrap();
                let sent = e["data"]["us"].as_u64().unwrap();
                delays.push((t0.elapsed().as_micros() as u64).saturating_sub(sent));
            }
        }
        delays
    })
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let total: usize = std::env::var("EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let root = tempfile::tempdir().expect("tmp");
        let mut nodes = Vec::new();
        for name in ["a", "b", "c"] {
            let d = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join(name), "127.0.0.1:0"))
                .await
                .expect("a node");
            nodes.push(d);
        }
        nodes[0].shared().with_node(|n, now| n.create_cluster(now, "bench")).expect("create");
        for d in &nodes[1..] {
            let token = nodes[0].shared().with_node(|n, now| n.new_token(now, Some(1), None)).expect("token").token;
            shoal_shell::services::join::join_with_token(d.shared(), &token).await.expect("join");
        }
        // Every node knows every other before the run.
        for d in &nodes {
            assert!(d.shared().wait_for(30_000, |n, _| n.members().peers().count() == 2).await, "membership");
        }
        let t0 = Instant::now();
        let mut subs = Vec::new();
        for d in &nodes[1..] {
            subs.push(subscribe(d, &d.shared().admin_token.clone(), total, t0).await);
        }
        let client = Arc::new(HttpClient::new(TokioEnv::default()));
        let (url, token) = (nodes[0].url(), nodes[0].shared().admin_token.clone());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut publishers = Vec::new();
        for _ in 0..8 {
            let (client, url, token, next) = (client.clone(), url.clone(), token.clone(), next.clone());
            publishers.push(tokio::spawn(async move {
                let auth = format!("Bearer {token}");
                let mut failed = 0usize;
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if k >= total {
                        return failed;
                    }
                    let us = t0.elapsed().as_micros() as u64;
                    let body = json!({"type": "app.bench", "data": {"k": k, "us": us}}).to_string().into_bytes();
                    let r = client.request(&url, "POST", "/v1/events", &[("authorization", &auth)], body, 10_000).await;
                    if !matches!(r, Ok(ref r) if r.status == 200) {
                        failed += 1;
                    }
                }
            }));
        }
        let mut failed = 0;
        for p in publishers {
            failed += p.await.unwrap();
        }
        let published_in = started.elapsed().as_secs_f64();
        println!(
            "published {total} events on A in {published_in:.2} s: {:.0} events/s accepted ({failed} failed)",
            total as f64 / published_in
        );
        for (name, sub) in ["B", "C"].iter().zip(subs) {
            let mut delays = sub.await.unwrap();
            let got = delays.len();
            let arrived_in = started.elapsed().as_secs_f64();
            delays.sort_unstable();
            println!(
                "subscriber on {name}: {got}/{total} events, {:.0} events/s end to end, delay p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                got as f64 / arrived_in,
                pct(&delays, 0.50),
                pct(&delays, 0.99),
                pct(&delays, 1.0)
            );
        }
        for d in &nodes {
            d.shared().request_shutdown();
        }
    });
}
