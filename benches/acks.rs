//! Issue 18 "Acknowledged means safe": metadata writes per second under each `meta.ack` mode,
//! side by side with etcd 3.4 in one run, driven by one Rust HTTP client (the shell's
//! `HttpClient`, one kept-alive connection per client) so the client's own cost per request
//! is small beside what is measured (`benches/acks.sh` does the same with a Python client).
//!
//! Three real `shoal serve` processes on loopback; N setting writes (`PUT /v1/settings/KEY`)
//! through a follower from one client, then from 16 concurrent clients, for each mode, with the
//! same puts into etcd (3 members on loopback, its JSON gateway `POST /v3/kv/put`, through a
//! follower: etcd fsyncs and waits for a majority) just before and just after the shoal rows of
//! that client count; each mode is compared with the mean of those two etcd rows. etcd is
//! skipped with a message when its binary is not installed (`apt-get install etcd-server`).
//! After each row, the CPU time the three nodes (or etcd's three members) used during it
//! (`/proc`), per write: the same machine's cost of a write in each store.
//! `cargo bench --bench acks` (env WRITES=10000, MODES="local replicated durable", CLIENTS="1 16",
//! SHOAL_BIN=path of another shoal build to measure instead of this one, e.g. a baseline;
//! ETCD=0 to leave etcd out; SET="meta.submit_window=2 ..." to declare config keys first;
//! SETTLE=0 to start each row without waiting for the row before to settle; SINGLE=1 to measure
//! a single-node install instead, where every write is `alone`, without etcd).

use base64::Engine;
use serde_json::{json, Value};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{acn_requests, call, cpu_ticks, etcd_members, j, requests_between, wait_until, Kill};

/// What one row measured.
struct Row {
    rate: f64,
    p50: f64,
    p99: f64,
    errors: usize,
    answers: BTreeMap<String, usize>,
}

/// One request of a row.
struct Req {
    url: String,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

type MakeReq = Arc<dyn Fn(usize, usize) -> Req + Send + Sync>;

/// `writes` requests split over `clients` concurrent clients, each on its own connection;
/// `make(k, i)` is client k's i-th request.
async fn drive(writes: usize, clients: usize, make: MakeReq) -> Row {
    let per = writes / clients;
    let shared = Arc::new(Mutex::new((Vec::new(), 0usize, BTreeMap::new())));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let (make, shared) = (make.clone(), shared.clone());
        tasks.push(tokio::spawn(async move {
            let c = HttpClient::new(TokioEnv::default());
            let (mut lat, mut errors, mut answers) = (Vec::with_capacity(per), 0, BTreeMap::<String, usize>::new());
            for i in 0..per {
                let q = make(k, i);
                let h: Vec<(&str, &str)> = q.headers.iter().map(|(a, b)| (*a, b.as_str())).collect();
                let t = Instant::now();
                let r = c.request(&q.url, q.method, &q.path, &h, q.body, 60_000).await;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                match r {
                    Ok(r) if r.status == 200 => {
                        *answers.entry(r.header("x-shoal-ack").unwrap_or("-").to_string()).or_default() += 1
                    }
                    _ => errors += 1,
                }
            }
            let mut s = shared.lock().unwrap();
            s.0.extend(lat);
            s.1 += errors;
            for (a, n) in answers {
                *s.2.entry(a).or_default() += n;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let (mut lat, errors, answers) = Arc::try_unwrap(shared).ok().unwrap().into_inner().unwrap();
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Row { rate: (per * clients) as f64 / secs, p50: q(0.5), p99: q(0.99), errors, answers }
}

/// A node of the three that is not the metadata leader.
async fn follower(c: &HttpClient<TokioEnv>, urls: &[String], tokens: &[String]) -> usize {
    let leader = call(c, &urls[0], &tokens[0], "GET", "/v1/meta/status", vec![]).await.1["leader"].clone();
    for i in 0..3 {
        if call(c, &urls[i], &tokens[i], "GET", "/v1/cluster/status", vec![]).await.1["node"] != leader {
            return i;
        }
    }
    1
}

/// Declares `meta.ack = mode` and waits until node `at` answers writes with it.
async fn set_mode(c: &HttpClient<TokioEnv>, urls: &[String], tokens: &[String], mode: &str, at: usize) {
    // SET="meta.submit_window=2 meta.submit_gather=1": declare these keys too (an experiment's knobs).
    // Written through the node the writes go to, which applies it at once; the others apply
    // it with their next config pass (every 5 s), waited for here.
    let set = std::env::var("SET").unwrap_or_default();
    for kv in set.split_whitespace() {
        let (key, value) = kv.split_once('=').expect("SET takes key=value pairs");
        let value: Value = serde_json::from_str(value).unwrap_or_else(|_| json!(value));
        let body = j(json!({"action": "set", "key": key, "value": value, "why": "bench"}));
        let (s, v) = call(c, &urls[at], &tokens[at], "POST", "/v1/config", body).await;
        assert_eq!(s, 200, "{v}");
    }
    if !set.trim().is_empty() {
        tokio::time::sleep(Duration::from_millis(5_500)).await;
    }
    let body = j(json!({"action": "set", "key": "meta.ack", "value": mode, "why": "bench"}));
    let (s, v) = call(c, &urls[0], &tokens[0], "POST", "/v1/config", body).await;
    assert_eq!(s, 200, "{v}");
    let auth = format!("Bearer {}", tokens[at]);
    let applied = wait_until(Duration::from_secs(20), async || {
        let r = c
            .request(
                &urls[at],
                "PUT",
                "/v1/settings/bench.probe",
                &[("authorization", &auth)],
                j(json!({"value": 0})),
                10_000,
            )
            .await;
        // (A single-node install answers `alone` but with `local`.)
        r.is_ok_and(|r| r.header("x-shoal-ack").is_some_and(|a| a == mode || (mode != "local" && a == "alone")))
    })
    .await;
    assert!(applied, "mode {mode} applied");
    settle(c, urls, tokens).await;
}

/// Waits (up to 60 s) until the writes of the row before have settled: nothing pending on any
/// node, every node's log at the same end. A row that starts while the one before still
/// replicates its tail (`local` answers before the others hold a write, so 16 clients leave a
/// backlog) would measure part of that row too.
/// `SETTLE=0` starts each row at once, as before.
async fn settle(c: &HttpClient<TokioEnv>, urls: &[String], tokens: &[String]) {
    if std::env::var("SETTLE").is_ok_and(|v| v == "0") {
        return;
    }
    let settled = wait_until(Duration::from_secs(60), async || {
        let mut ends = Vec::new();
        for i in 0..urls.len() {
            let (s, v) = call(c, &urls[i], &tokens[i], "GET", "/v1/meta/status", vec![]).await;
            if s != 200 || v["pending"].as_u64() != Some(0) {
                return false;
            }
            ends.push(v["lastSeq"].clone());
        }
        ends.windows(2).all(|w| w[0] == w[1])
    })
    .await;
    if !settled {
        println!("(the cluster did not settle within 60 s; measuring anyway)");
    }
}

fn print_row(name: &str, clients: usize, r: &Row) {
    let answers: Vec<String> = r.answers.iter().map(|(a, n)| format!("{a}: {n}")).collect();
    println!(
        "{name:10} {clients:>7} {:>10.0} {:>8.2} {:>8.2} {:>6}  {}",
        r.rate,
        r.p50,
        r.p99,
        r.errors,
        answers.join(", ")
    );
}

/// The etcd member to write through: healthy, and not the leader.
async fn etcd_follower(c: &HttpClient<TokioEnv>, urls: &[String]) -> Option<String> {
    let status = async |u: &str| {
        let r = c.request(u, "POST", "/v3/maintenance/status", &[], b"{}".to_vec(), 2_000).await.ok()?;
        serde_json::from_slice::<Value>(&r.body).ok()
    };
    let mut leader = None;
    let healthy = wait_until(Duration::from_secs(60), async || {
        leader = status(&urls[0]).await.and_then(|v| v["leader"].as_str().map(str::to_string));
        leader.is_some()
    })
    .await;
    if !healthy {
        return None;
    }
    for u in urls {
        let Some(v) = status(u).await else { continue };
        if v["header"]["member_id"].as_str() != leader.as_deref() {
            return Some(u.clone());
        }
    }
    urls.first().cloned()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let writes: usize = std::env::var("WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let modes = std::env::var("MODES").unwrap_or_else(|_| "local replicated durable".into());
    let clients: Vec<usize> = std::env::var("CLIENTS")
        .unwrap_or_else(|_| "1 16".into())
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let root = tempfile::tempdir().unwrap();
        let mut kids = Kill(Vec::new());
        // SHOAL_BIN: another build of shoal to measure (e.g. a baseline), instead of this one.
        let bin = std::env::var("SHOAL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_shoal").to_string());
        // SINGLE=1: a single-node install (always alone: `replicated` waits for the node's own
        // commit), without etcd.
        let single = std::env::var("SINGLE").is_ok_and(|v| v == "1");
        let (urls, tokens) = common::nodes(&bin, root.path(), &mut kids, if single { 1 } else { 3 }).await;
        let pids: Vec<u32> = kids.0.iter().map(|c| c.id()).collect();
        let c = HttpClient::new(TokioEnv::default());
        let at = if single { 0 } else { follower(&c, &urls, &tokens).await };
        if single {
            println!("{writes} writes per row into a single-node install, one Rust client per connection");
        } else {
            println!("{writes} writes per row through a follower (node {at}) of 3, one Rust client per connection");
        }
        println!(
            "{:10} {:>7} {:>10} {:>8} {:>8} {:>6}  answers",
            "meta.ack", "clients", "writes/s", "p50 ms", "p99 ms", "errors"
        );
        let mut etcd_kids = Kill(Vec::new());
        let member = match etcd_members(root.path(), &mut etcd_kids).filter(|_| !single) {
            Some(members) => etcd_follower(&c, &members).await,
            None => None,
        };
        let etcd_pids: Vec<u32> = etcd_kids.0.iter().map(|c| c.id()).collect();
        if member.is_none() && !single {
            println!("etcd: skipped (no etcd binary on PATH, or it did not start; `apt-get install etcd-server`)");
        }
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // Per client count: etcd, every mode, etcd again; each mode is compared with the mean
        // of the two etcd rows around it (this machine's fsync speed drifts by the minute).
        let mut summary = Vec::new();
        for &n in &clients {
            let mut etcd_rates = Vec::new();
            let mut rates = Vec::new();
            for round in 0..2 {
                if let Some(member) = &member {
                    let (url, tag) = (member.clone(), round);
                    let make: MakeReq = Arc::new(move |k, i| Req {
                        url: url.clone(),
                        method: "POST",
                        path: "/v3/kv/put".into(),
                        headers: Vec::new(),
                        body: j(json!({"key": b64(&format!("bench.{n}.{tag}.{k}.{i}")), "value": b64(&i.to_string())})),
                    });
                    let ticks = cpu_ticks(&etcd_pids);
                    let r = drive(writes, n, make).await;
                    let cpu_us = (cpu_ticks(&etcd_pids) - ticks) as f64 * 10_000.0 / writes as f64;
                    print_row("etcd 3.4", n, &r);
                    println!("{:10} {n:>7} CPU of the three members: {cpu_us:.0} µs per write", "");
                    etcd_rates.push(r.rate);
                }
                if round == 1 {
                    break;
                }
                for mode in modes.split_whitespace() {
                    set_mode(&c, &urls, &tokens, mode, at).await;
                    let (url, auth, mode_name) = (urls[at].clone(), format!("Bearer {}", tokens[at]), mode.to_string());
                    let make: MakeReq = Arc::new(move |k, i| Req {
                        url: url.clone(),
                        method: "PUT",
                        path: format!("/v1/settings/bench.{mode_name}.{n}.{k}.{i}"),
                        headers: vec![("authorization", auth.clone())],
                        body: j(json!({ "value": i })),
                    });
                    let per_node = |pids: &[u32]| pids.iter().map(|p| cpu_ticks(&[*p])).collect::<Vec<u64>>();
                    let (ticks, before) = (cpu_ticks(&pids), acn_requests(&c, &urls, &tokens, "/meta/").await);
                    let node_ticks = per_node(&pids);
                    let r = drive(writes, n, make).await;
                    let cpu_us = (cpu_ticks(&pids) - ticks) as f64 * 10_000.0 / writes as f64;
                    let sent = requests_between(&before, &acn_requests(&c, &urls, &tokens, "/meta/").await, 1.0);
                    print_row(mode, n, &r);
                    let split: Vec<String> = per_node(&pids)
                        .iter()
                        .zip(&node_ticks)
                        .enumerate()
                        .map(|(i, (a, b))| format!("n{i} {:.0}", (a - b) as f64 * 10_000.0 / writes as f64))
                        .collect();
                    println!("{:10} {n:>7} CPU of the nodes: {cpu_us:.0} µs per write ({})", "", split.join(", "));
                    println!("{:10} {n:>7} node-to-node meta requests: {sent}", "");
                    rates.push((mode.to_string(), r.rate));
                }
            }
            if !etcd_rates.is_empty() {
                let etcd = etcd_rates.iter().sum::<f64>() / etcd_rates.len() as f64;
                for (mode, rate) in rates {
                    summary.push(format!("{mode:10} {n:>7} {:>9.2}x etcd (mean {etcd:.0}/s)", rate / etcd));
                }
            }
        }
        for line in summary {
            println!("{line}");
        }
    });
}
