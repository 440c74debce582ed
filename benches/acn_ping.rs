//! Signed ACN ping over loopback, beside an unsigned hello in the same run (issue: "signed ping
//! over loopback >= 5,000 requests/s on this 2-core machine, reported beside an unsigned hello").
//!
//! Two real nodes in this process on 127.0.0.1 form a cluster; a client holding node A's key
//! signs each ping (fresh nonce) and sends it to node B, which verifies it through the real
//! handler. `cargo bench --bench acn_ping` (env PING_REQUESTS, PING_CONCURRENCY).

use shoal_core::acn::sign_request;
use shoal_core::{ClusterId, Millis, NodeId, SeededRng};
use shoal_shell::daemon::{self, ServeOptions};
use shoal_shell::env::{Clock, TokioEnv};
use shoal_shell::net::client::HttpClient;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Distinct RNG seeds across runs, so no nonce is ever sent twice.
static RUN: AtomicUsize = AtomicUsize::new(0);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn run(
    signed: bool,
    url: String,
    key: ed25519_dalek::SigningKey,
    me: NodeId,
    cluster: ClusterId,
    total: usize,
    conc: usize,
) -> (f64, usize) {
    let env = TokioEnv::default();
    let client = HttpClient::new(env.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let run_id = RUN.fetch_add(1, Ordering::Relaxed) as u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..conc {
        let (client, url, key, me, cluster, next, failures, env) = (
            client.clone(),
            url.clone(),
            key.clone(),
            me.clone(),
            cluster.clone(),
            next.clone(),
            failures.clone(),
            env.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = SeededRng::new((run_id << 32) + w as u64);
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let res = if signed {
                    let body = b"{}".to_vec();
                    let now: Millis = env.now();
                    let h = sign_request(&key, &me, &cluster, "POST", "/cluster/acn/ping", &body, now, &mut rng);
                    let pairs = h.pairs();
                    client.request(&url, "POST", "/cluster/acn/ping", &pairs, body, 10_000).await
                } else {
                    client.request(&url, "GET", "/cluster/acn/hello", &[], Vec::new(), 10_000).await
                };
                if !matches!(res, Ok(ref r) if r.status == 200) {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (total as f64 / started.elapsed().as_secs_f64(), failures.load(Ordering::Relaxed))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let total = env_usize("PING_REQUESTS", 20_000);
    let conc = env_usize("PING_CONCURRENCY", 16);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let root = tempfile::tempdir().expect("tmp");
        let a = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("a"), "127.0.0.1:0"))
            .await
            .expect("a");
        let b = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("b"), "127.0.0.1:0"))
            .await
            .expect("b");
        a.shared().with_node(|n, now| n.create_cluster(now, "bench")).expect("create");
        let token = a.shared().with_node(|n, now| n.new_token(now, Some(1), None)).expect("token").token;
        shoal_shell::services::join::join_with_token(b.shared(), &token).await.expect("join");
        let (me, cluster) = a.shared().read_node(|n, _| (n.id().clone(), n.cluster().unwrap().id.clone()));
        let seed = std::fs::read_to_string(root.path().join("a").join("node.key")).expect("key");
        let seed: [u8; 32] = hex::decode(seed.trim()).expect("hex").try_into().expect("32 bytes");
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let url = b.url();
        // Warm up, then hello and ping alternately twice, so neither gets the quieter machine.
        let _ = run(true, url.clone(), key.clone(), me.clone(), cluster.clone(), 2_000, conc).await;
        let mut results = Vec::new();
        for round in 0..2 {
            for signed in [false, true] {
                let (rps, fails) =
                    run(signed, url.clone(), key.clone(), me.clone(), cluster.clone(), total, conc).await;
                let what = if signed { "signed ping " } else { "unsigned hello" };
                println!(
                    "round {round}: {what}: {rps:>8.0} req/s ({total} requests, {conc} concurrent, {fails} failed)"
                );
                results.push((signed, rps, fails));
            }
        }
        let best = |s: bool| results.iter().filter(|r| r.0 == s).map(|r| r.1).fold(0.0, f64::max);
        println!(
            "best: unsigned hello {:.0} req/s, signed ping {:.0} req/s ({:.0} % of hello)",
            best(false),
            best(true),
            100.0 * best(true) / best(false)
        );
        a.shutdown().await;
        b.shutdown().await;
    });
}
