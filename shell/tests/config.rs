//! The configuration control plane between three real nodes in process over loopback (issue 5
//! "The verb", "Tests"): a cluster-wide heartbeat interval changes the real heartbeat period on
//! every node without a restart, resolved values land in `DATA/config/<module>.json`, history
//! and refusals over HTTP, and a clear goes back to the start config.

use serde_json::{json, Value};
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::time::Duration;

async fn api(d: &Daemon<TokioEnv>, method: &str, path: &str, body: Value) -> (u16, Value) {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(&body).unwrap() };
    let r = client.request(&d.url(), method, path, &[("authorization", &auth)], body, 10_000).await.unwrap();
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

fn beats(d: &Daemon<TokioEnv>) -> u64 {
    d.shared().read_node(|n, _| n.heartbeats_sent())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wide_heartbeat_interval_changes_the_real_period_on_every_node() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let opts = ServeOptions::new(root.path().join(format!("n{i}")), "127.0.0.1:0");
        nodes.push(daemon::start(TokioEnv::default(), opts).await.unwrap());
    }
    assert_eq!(api(&nodes[0], "POST", "/v1/cluster/create", json!({"name": "cfg"})).await.0, 200);
    for d in &nodes[1..] {
        let t = api(&nodes[0], "POST", "/v1/tokens", Value::Null).await.1["token"].as_str().unwrap().to_string();
        assert_eq!(api(d, "POST", "/v1/cluster/join", json!({ "token": t })).await.0, 200);
    }
    for d in &nodes {
        eventually("a leader everywhere", || async { d.shared().read_node(|n, now| n.meta_leader(now)).is_some() })
            .await;
    }
    // At the default 15 s, two seconds see at most one round per node.
    let before: Vec<u64> = nodes.iter().map(beats).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (d, b) in nodes.iter().zip(&before) {
        assert!(beats(d) - b <= 1, "15 s heartbeats");
    }

    // Refusals: no reason, an undeclared key (the declared ones are named), a bad value, a
    // module level without its node, and the config plane's records through `settings`.
    let set = |key: &str, value: &str, why: &str| json!({"action": "set", "key": key, "value": value, "why": why});
    let (s, v) = api(&nodes[1], "POST", "/v1/config", set("membership.heartbeat_interval", "200ms", "")).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("no_why")), "{v}");
    let (s, v) = api(&nodes[1], "POST", "/v1/config", set("membership.heartbeat_intervall", "200ms", "typo")).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("undeclared_key")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("membership.heartbeat_interval"), "{v}");
    let (s, v) = api(&nodes[1], "POST", "/v1/config", set("membership.heartbeat_interval", "soon", "bad")).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_value")), "{v}");
    let (s, v) = api(&nodes[1], "POST", "/v1/config", set("membership.heartbeat_interval", "1ms", "too fast")).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_value")), "below the declared minimum: {v}");
    let (s, v) = api(
        &nodes[1],
        "POST",
        "/v1/config",
        json!({"action": "set", "key": "heartbeat_interval", "module": "membership", "value": "1s", "why": "x"}),
    )
    .await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_level")), "{v}");
    let (s, v) = api(&nodes[1], "PUT", "/v1/settings/config%2Fvalue%2Fmesh.x", json!({"value": 1})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("reserved_key")), "{v}");

    // Cluster-wide: 200 ms. Every node's membership module moves, and every node beats faster.
    let (s, v) =
        api(&nodes[1], "POST", "/v1/config", set("membership.heartbeat_interval", "200ms", "faster failure detection"))
            .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["moved"].as_array().unwrap().len(), 3, "one module on each of 3 nodes moved: {v}");
    for d in &nodes {
        eventually("the new interval is applied", || async {
            d.shared().read_node(|n, _| n.config().membership.heartbeat_interval_ms) == 200
        })
        .await;
    }
    let before: Vec<u64> = nodes.iter().map(beats).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (i, (d, b)) in nodes.iter().zip(&before).enumerate() {
        let n = beats(d) - b;
        assert!(n >= 5, "node {i} sent {n} heartbeat rounds in 2 s at a 200 ms interval");
    }
    // Resolved values for programs, with their source.
    for d in &nodes {
        let file = d.shared().data_dir.join("config/membership.json");
        eventually("DATA/config/membership.json is written", || async {
            std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|v| v["heartbeat_interval"] == json!({"value": 200, "source": "mesh"}))
        })
        .await;
    }
    let (_, v) = api(&nodes[2], "GET", "/v1/config/resolved", Value::Null).await;
    assert_eq!(v["modules"]["membership"]["heartbeat_interval"]["source"], "mesh", "{v}");
    eventually("the act is in the audit log on another node", || async {
        let (_, v) = api(&nodes[2], "GET", "/v1/audit", Value::Null).await;
        v["audit"].as_array().is_some_and(|a| a.iter().any(|e| e["act"] == "POST /v1/config"))
    })
    .await;
    let (_, v) = api(&nodes[0], "GET", "/v1/config/history?key=heartbeat_interval", Value::Null).await;
    assert_eq!(v["history"][0]["why"], "faster failure detection", "{v}");
    assert_eq!(v["history"][0]["value"], 200);

    // One node differs (node level), then the mesh value is cleared: the others go back to the
    // interval they were started with.
    let id2 = nodes[2].shared().read_node(|n, _| n.id().to_string());
    let body =
        json!({"action": "set", "key": "membership.heartbeat_interval", "node": id2, "value": "300ms", "why": "n2"});
    assert_eq!(api(&nodes[0], "POST", "/v1/config", body).await.0, 200);
    let clear = json!({"action": "clear", "key": "membership.heartbeat_interval", "why": "back to normal"});
    let (s, v) = api(&nodes[0], "POST", "/v1/config", clear).await;
    assert_eq!(s, 200, "{v}");
    for (i, d) in nodes.iter().enumerate() {
        let want = if i == 2 { 300 } else { 15_000 };
        eventually("the interval falls back", || async {
            d.shared().read_node(|n, _| n.config().membership.heartbeat_interval_ms) == want
        })
        .await;
    }
    for d in nodes {
        d.shutdown().await;
    }
}
