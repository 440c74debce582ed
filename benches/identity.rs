//! Identity speed (issue 15 "Tests and speed"), all in one run on this machine:
//! - login time with the chosen argon2id parameters (`POST /v1/login`, median of 10);
//! - requests/s of an authenticated `GET /v1/meta/status` with a session beside the admin
//!   token (16 concurrent, alternating rounds, the ratio of each pair; target: within 5 %),
//!   on plain HTTP and on HTTPS (a second node serving a self-signed certificate, the client
//!   holding its pin), with HTTPS beside HTTP for the admin token;
//! - user assertions verified per second on one core (target ≥ 20,000/s).
//!
//! `cargo bench --bench identity` (env ID_REQUESTS, ID_CONCURRENCY, ID_ASSERTIONS).

use shoal_core::identity::assertion::{issue, AssertionVerifier, UserAssertion};
use shoal_core::{ClusterId, Millis, NodeId};
use shoal_shell::daemon::{self, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn rps(url: String, pin: String, token: String, total: usize, conc: usize) -> (f64, usize) {
    let client = HttpClient::new(TokioEnv::default());
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (client, url, pin, next, failures, auth) =
            (client.clone(), url.clone(), pin.clone(), next.clone(), failures.clone(), format!("Bearer {token}"));
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let r = client
                    .request_pinned(
                        &url,
                        &pin,
                        "GET",
                        "/v1/meta/status",
                        &[("authorization", &auth)],
                        Vec::new(),
                        10_000,
                    )
                    .await;
                if !matches!(r, Ok(ref r) if r.status == 200) {
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

fn assertions_per_second(n: usize) -> f64 {
    let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let vk = key.verifying_key();
    let (issuer, me, cluster) = (NodeId::new("n-a"), NodeId::new("n-b"), ClusterId::new("c"));
    let now = Millis(1_800_000_000_000);
    let headers: Vec<String> = (0..n)
        .map(|i| {
            issue(
                &key,
                &UserAssertion {
                    u: "anna".into(),
                    g: vec!["staff".into()],
                    i: issuer.clone(),
                    c: cluster.clone(),
                    t: now.0 / 1000,
                    e: now.0 / 1000 + 60,
                    a: me.clone(),
                    n: format!("nonce-{i}"),
                    tm: now.0,
                    r: None,
                },
            )
        })
        .collect();
    let mut v = AssertionVerifier::default();
    let started = Instant::now();
    for h in &headers {
        v.verify(now, h, &me, &cluster, |_| Some(vk), |_| 0).expect("verifies");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// The floor beside it: bare Ed25519 verifications of payloads of the same size, per second.
fn ed25519_per_second(n: usize) -> f64 {
    use ed25519_dalek::{Signer, Verifier};
    let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let vk = key.verifying_key();
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| format!("{:0>180}", i).into_bytes()).collect();
    let sigs: Vec<_> = payloads.iter().map(|p| key.sign(p)).collect();
    let started = Instant::now();
    for (p, s) in payloads.iter().zip(&sigs) {
        vk.verify(p, s).expect("verifies");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let total = env_usize("ID_REQUESTS", 20_000);
    let conc = env_usize("ID_CONCURRENCY", 16);
    let n = env_usize("ID_ASSERTIONS", 50_000);
    for round in 0..2 {
        let floor = ed25519_per_second(n);
        let per_core = assertions_per_second(n);
        println!(
            "round {round}: user assertions verified {per_core:.0}/s on one core (target >= 20,000/s); bare Ed25519 verify {floor:.0}/s: {:.0} % of the floor",
            100.0 * per_core / floor
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let root = tempfile::tempdir().expect("tmp");
        let d = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("a"), "127.0.0.1:0"))
            .await
            .expect("node");
        d.shared().with_node(|n, now| n.create_cluster(now, "bench")).expect("create");
        let admin = d.shared().admin_token.clone();
        let client = HttpClient::new(TokioEnv::default());
        let auth = format!("Bearer {admin}");
        // An admin account: `GET /v1/meta/status` is an admin's route.
        let body = br#"{"name":"anna","password":"correct horse battery","admin":true}"#.to_vec();
        let r = client.request(&d.url(), "POST", "/v1/users", &[("authorization", &auth)], body, 30_000).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let params = d.shared().read_node(|n, _| n.password_params());
        let mut times = Vec::new();
        let mut session = String::new();
        for _ in 0..10 {
            let body = br#"{"username":"anna","password":"correct horse battery"}"#.to_vec();
            let t = Instant::now();
            let r = client.request(&d.url(), "POST", "/v1/login", &[], body, 30_000).await.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(r.status, 200);
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            session = v["token"].as_str().unwrap().to_string();
        }
        times.sort_by(|a, b| a.total_cmp(b));
        println!(
            "login: median {:.1} ms, min {:.1} ms over 10 (argon2id m={} KiB, t={}, p={})",
            times[5], times[0], params.memory_kib, params.time, params.lanes
        );
        // The same on a node serving HTTPS (a self-signed certificate, the client pinned to it).
        let mut opts = ServeOptions::new(root.path().join("b"), "127.0.0.1:0");
        opts.tls = Some(shoal_shell::net::tls::TlsSource::SelfSigned);
        let t = daemon::start(TokioEnv::default(), opts).await.expect("tls node");
        t.shared().with_node(|n, now| n.create_cluster(now, "bench-tls")).expect("create");
        let pin = t.tls_pin.clone().expect("serves TLS");
        let t_admin = t.shared().admin_token.clone();
        let auth = format!("Bearer {t_admin}");
        let body = br#"{"name":"anna","password":"correct horse battery","admin":true}"#.to_vec();
        let r = client
            .request_pinned(&t.url(), &pin, "POST", "/v1/users", &[("authorization", &auth)], body, 30_000)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let body = br#"{"username":"anna","password":"correct horse battery"}"#.to_vec();
        let r = client.request_pinned(&t.url(), &pin, "POST", "/v1/login", &[], body, 30_000).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let t_session = v["token"].as_str().unwrap().to_string();

        let runs = [
            ("http  admin token", d.url(), String::new(), admin.clone()),
            ("http  session", d.url(), String::new(), session.clone()),
            ("https admin token", t.url(), pin.clone(), t_admin.clone()),
            ("https session", t.url(), pin.clone(), t_session.clone()),
        ];
        for (_, url, pin, token) in &runs {
            let _ = rps(url.clone(), pin.clone(), token.clone(), 2_000, conc).await;
        }
        let rounds = env_usize("ID_ROUNDS", 7);
        let mut got = vec![Vec::new(); runs.len()];
        for round in 0..rounds {
            for (i, (what, url, pin, token)) in runs.iter().enumerate() {
                let (r, fails) = rps(url.clone(), pin.clone(), token.clone(), total, conc).await;
                println!(
                    "round {round}: {what:>17}: {r:>8.0} req/s ({total} requests, {conc} concurrent, {fails} failed)"
                );
                got[i].push(r);
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let ratio = |a: usize, b: usize| median(got[a].iter().zip(&got[b]).map(|(x, y)| 100.0 * x / y).collect());
        for (i, (what, ..)) in runs.iter().enumerate() {
            println!("median {what:>17}: {:.0} req/s", median(got[i].clone()));
        }
        println!(
            "session against the admin token, median of the {rounds} paired rounds: {:.1} % on HTTP, {:.1} % on HTTPS",
            ratio(1, 0),
            ratio(3, 2)
        );
        println!("HTTPS against HTTP (admin token), median of the paired rounds: {:.1} %", ratio(2, 0));
        t.shutdown().await;
        d.shutdown().await;
    });
}
