//! The daemon's HTTP surface in process, on real loopback sockets (spec: cluster-runtime.md
//! "Admin API", "ACN"): the admin token, JSON errors with 4xx for bad input, ACN signature
//! checks over real HTTP, and `--disable-cluster`.

use serde_json::{json, Value};
use shoal_core::acn::sign_request;
use shoal_core::SeededRng;
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::{Clock, TokioEnv};
use shoal_shell::net::client::HttpClient;

async fn node(dir: &std::path::Path, disable_cluster: bool) -> Daemon<TokioEnv> {
    let mut opts = ServeOptions::new(dir, "127.0.0.1:0");
    opts.disable_cluster = disable_cluster;
    daemon::start(TokioEnv::default(), opts).await.expect("start")
}

async fn call(d: &Daemon<TokioEnv>, token: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {token}");
    let r = client.request(&d.url(), method, path, &[("authorization", &auth)], body.to_vec(), 5_000).await.unwrap();
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

fn assert_json_error(status: u16, v: &Value, want_status: u16) {
    assert_eq!(status, want_status, "{v}");
    assert!(v["error"]["code"].is_string() && v["error"]["message"].is_string(), "not a JSON error: {v}");
}

#[tokio::test]
async fn the_admin_api_needs_the_token_and_answers_bad_input_with_json_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    let (s, v) = call(&d, "", "GET", "/v1/nodes", b"").await;
    assert_json_error(s, &v, 401);
    let (s, v) = call(&d, "wrong", "GET", "/v1/nodes", b"").await;
    assert_json_error(s, &v, 401);
    for (method, path, body, want) in [
        ("POST", "/v1/cluster/create", &b"{not json"[..], 400),
        ("POST", "/v1/cluster/create", b"{\"name\": 7}", 400),
        ("POST", "/v1/cluster/create", b"{\"extra\": 1}", 400),
        ("POST", "/v1/tokens", b"", 409),
        ("POST", "/v1/cluster/join", b"{\"token\": \"hello\"}", 400),
        ("POST", "/v1/nodes/x/state", b"{\"state\": \"active\"}", 409),
        ("GET", "/v1/no/such/thing", b"", 404),
        ("PUT", "/v1/nodes", b"", 405),
    ] {
        let (s, v) = call(&d, &token, method, path, body).await;
        assert_json_error(s, &v, want);
    }
    // An id that is not valid UTF-8 once decoded: the path extractor's rejection is JSON too.
    let (s, v) = call(&d, &token, "GET", "/v1/nodes/%FF", b"").await;
    assert_json_error(s, &v, 400);
    let big = vec![b'a'; 2 * 1024 * 1024];
    let (s, v) = call(&d, &token, "POST", "/v1/cluster/create", &big).await;
    assert_json_error(s, &v, 413);
    let (s, v) = call(&d, &token, "POST", "/v1/cluster/create", br#"{"name":"t"}"#).await;
    assert_eq!(s, 200, "{v}");
    for (body, want) in [(json!({"ttlHours": 0}), 400), (json!({"ttlHours": 721}), 400)] {
        let (s, v) = call(&d, &token, "POST", "/v1/tokens", body.to_string().as_bytes()).await;
        assert_json_error(s, &v, want);
    }
    let (s, v) = call(&d, &token, "POST", "/v1/nodes/nope/state", br#"{"state":"sleeping"}"#).await;
    assert_json_error(s, &v, 400);
    let (s, v) = call(&d, &token, "DELETE", "/v1/nodes/nope", b"").await;
    assert_json_error(s, &v, 404);
    d.shutdown().await;
}

/// ACN over real HTTP: a correctly signed ping passes once; unsigned, replayed, and re-targeted
/// requests are 401 with JSON bodies.
#[tokio::test]
async fn signed_requests_are_checked_over_real_http() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let (id, cluster) = d.shared().read_node(|n, _| (n.id().clone(), n.cluster().unwrap().id.clone()));
    let seed = std::fs::read_to_string(dir.path().join("node.key")).unwrap();
    let key = ed25519_dalek::SigningKey::from_bytes(&hex::decode(seed.trim()).unwrap().try_into().unwrap());
    let client = HttpClient::new(TokioEnv::default());
    let now = TokioEnv::default().now();
    let h = sign_request(&key, &id, &cluster, "POST", "/cluster/acn/ping", b"{}", now, &mut SeededRng::new(9));
    let send = |target: &'static str| {
        let (client, url, h) = (client.clone(), d.url(), h.clone());
        async move {
            let pairs = h.pairs();
            let r = client.request(&url, "POST", target, &pairs, b"{}".to_vec(), 5_000).await.unwrap();
            (r.status, serde_json::from_slice::<Value>(&r.body).unwrap())
        }
    };
    let (s, v) = send("/cluster/acn/heartbeat").await;
    assert_eq!((s, v["error"]["code"].as_str()), (401, Some("bad_signature")), "re-targeted: {v}");
    let (s, v) = send("/cluster/acn/ping").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["pong"], true);
    let (s, v) = send("/cluster/acn/ping").await;
    assert_eq!((s, v["error"]["code"].as_str()), (401, Some("replay")));
    let r = client.request(&d.url(), "POST", "/cluster/acn/ping", &[], b"{}".to_vec(), 5_000).await.unwrap();
    assert_eq!(r.status, 401);
    let r = client.request(&d.url(), "GET", "/cluster/acn/hello", &[], Vec::new(), 5_000).await.unwrap();
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((v["acn"].as_bool(), v["inCluster"].as_bool()), (Some(true), Some(true)));
    d.shutdown().await;
}

#[tokio::test]
async fn disable_cluster_answers_404_on_acn() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), true).await;
    let client = HttpClient::new(TokioEnv::default());
    let r = client.request(&d.url(), "GET", "/cluster/acn/hello", &[], Vec::new(), 5_000).await.unwrap();
    assert_eq!(r.status, 404);
    let token = d.shared().admin_token.clone();
    let (s, v) = call(&d, &token, "POST", "/v1/cluster/create", b"{}").await;
    assert_json_error(s, &v, 409);
    let (s, v) = call(&d, &token, "GET", "/v1/cluster/status", b"").await;
    assert_eq!((s, v["clusterEnabled"].as_bool()), (200, Some(false)));
    d.shutdown().await;
}

/// Issue 11: an advertised URL with a path, or at a link-local address (the cloud metadata
/// service), and a token's use cap out of range, are 400s over the API.
#[tokio::test]
async fn node_urls_and_token_use_caps_are_checked_at_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    assert_eq!(call(&d, &token, "POST", "/v1/cluster/create", br#"{"name":"t"}"#).await.0, 200);
    for url in ["http://169.254.169.254", "http://[fe80::1]:80", "http://10.0.0.1:7000/evil?x=", "http://u@h"] {
        let body = serde_json::to_vec(&json!({ "advertiseUrl": url })).unwrap();
        let (s, v) = call(&d, &token, "POST", "/v1/cluster/config", &body).await;
        assert_json_error(s, &v, 400);
    }
    for uses in [0, 1001] {
        let (s, v) = call(&d, &token, "POST", "/v1/tokens", json!({ "uses": uses }).to_string().as_bytes()).await;
        assert_json_error(s, &v, 400);
    }
    let (s, v) = call(&d, &token, "POST", "/v1/tokens", br#"{"uses": 1}"#).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["maxUses"], json!(1));
    d.shutdown().await;
}

/// Issue 11: a setting nested ~125 levels was accepted and then stopped replication; the API
/// bounds a value's depth (32) now.
#[tokio::test]
async fn a_setting_value_nested_too_deeply_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    assert_eq!(call(&d, &token, "POST", "/v1/cluster/create", br#"{"name":"t"}"#).await.0, 200);
    let nested = |depth: usize| format!(r#"{{"value": {}1{}}}"#, "[".repeat(depth - 1), "]".repeat(depth - 1));
    for (depth, want) in [(32, 200), (33, 400), (125, 400), (200, 400)] {
        let (s, v) = call(&d, &token, "PUT", "/v1/settings/k", nested(depth).as_bytes()).await;
        assert_eq!(s, want, "depth {depth}: {v}");
        if want == 400 {
            assert_json_error(s, &v, 400);
        }
    }
    d.shutdown().await;
}

/// The scheduling API over real HTTP (issue 13): the status shows the shipped weights and
/// this node scored; weights change only with a reason, by known names, within [0, 1], and
/// land in the config history; an explain says which node takes a copy and why the others
/// would not; bad sizes and queries are 400s.
#[tokio::test]
async fn the_sched_api_shows_changes_and_explains() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    let (s, v) = call(&d, &token, "GET", "/v1/sched/status", b"").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["weights"]["locality"], 0.45);
    let (s, v) = call(&d, &token, "POST", "/v1/sched/weights", br#"{"set":{"cpu":0.3},"why":"x"}"#).await;
    assert_json_error(s, &v, 409); // not in a cluster yet
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let (s, v) = call(&d, &token, "GET", "/v1/sched/status", b"").await;
    assert_eq!((s, v["preview"].as_array().map(|a| a.len())), (200, Some(1)), "{v}");
    for (body, why) in [
        (r#"{"set":{"cpu":0.3}}"#, "no reason"),
        (r#"{"set":{"speed":0.3},"why":"x"}"#, "unknown weight"),
        (r#"{"set":{"cpu":1.5},"why":"x"}"#, "out of range"),
        (r#"{"set":{"cpu":"high"},"why":"x"}"#, "not a number"),
        (r#"{"why":"x"}"#, "nothing to change"),
    ] {
        let (s, v) = call(&d, &token, "POST", "/v1/sched/weights", body.as_bytes()).await;
        assert_eq!(s, 400, "{why}: {v}");
        assert!(v["error"]["code"].is_string(), "{why}: {v}");
    }
    let (s, v) =
        call(&d, &token, "POST", "/v1/sched/weights", br#"{"set":{"cpu":0.3},"why":"cpu matters less"}"#).await;
    assert_eq!((s, v["weights"]["cpu"].as_f64()), (200, Some(0.3)), "{v}");
    let (_, h) = call(&d, &token, "GET", "/v1/config/history", b"").await;
    assert!(h.to_string().contains("cpu matters less"), "the change has a history: {h}");
    let (s, v) = call(&d, &token, "POST", "/v1/sched/weights", br#"{"reset":true,"why":"back"}"#).await;
    assert_eq!((s, v["weights"]["cpu"].as_f64()), (200, Some(0.2)), "{v}");
    let (s, v) = call(&d, &token, "GET", "/v1/sched/explain?place=1MiB", b"").await;
    assert_eq!(s, 200, "{v}");
    assert!(v["chosen"].is_null(), "no volume yet: {v}");
    assert!(v["whyNone"].as_str().unwrap().contains("node has no volume"), "{v}");
    for q in ["place=lots", "", "place=1MiB&color=red"] {
        let (s, v) = call(&d, &token, "GET", &format!("/v1/sched/explain?{q}"), b"").await;
        assert_json_error(s, &v, 400);
    }
    let (s, v) = call(&d, &token, "GET", "/v1/sched/explain?job=abc", b"").await;
    assert_json_error(s, &v, 404);
}

/// A WebSocket to `/v1/events` with these extra headers.
async fn events_socket(
    d: &Daemon<TokioEnv>,
    token: &str,
    query: &str,
    origin: Option<&str>,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let authority = d.url().trim_start_matches("http://").to_string();
    let mut req = format!("ws://{authority}/v1/events?{query}").into_client_request().unwrap();
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    tokio_tungstenite::client_async(req, tcp).await.map(|(ws, _)| ws)
}

async fn next_event(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) -> Value {
    use futures_util::StreamExt;
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next())
            .await
            .expect("an event within 5 s")
            .expect("the feed is open")
            .expect("a message");
        if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// The events API over real HTTP (issue 13): only `app.*` may be published (≤ 64 KiB); the
/// recent list and a WebSocket feed with a type filter; a subscriber that reconnects with
/// `since` gets what it missed; a browser `Origin` not the node's own (nor listed in
/// `events.allowed_origins`) is refused with 403; a plain GET without `follow=false` is a 400.
#[tokio::test]
async fn events_are_published_listed_and_followed() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    for (body, status) in [
        (json!({"type": "file.created", "data": {}}), 400),
        (json!({"type": "app.a b", "data": {}}), 400),
        (json!({"type": "app.big", "data": "x".repeat(70_000)}), 413),
        (json!({"kind": "app.x"}), 400),
    ] {
        let (s, v) = call(&d, &token, "POST", "/v1/events", body.to_string().as_bytes()).await;
        assert_json_error(s, &v, status);
    }
    let (s, v) = call(&d, &token, "GET", "/v1/events", b"").await;
    assert_json_error(s, &v, 400);

    let mut ws = events_socket(&d, &token, "type=app.*", None).await.expect("a feed");
    let (s, first) = call(&d, &token, "POST", "/v1/events", br#"{"type":"app.one","data":{"n":1}}"#).await;
    assert_eq!(s, 200, "{first}");
    let got = next_event(&mut ws).await;
    assert_eq!((got["type"].as_str(), &got["data"]), (Some("app.one"), &json!({"n": 1})));
    drop(ws);
    // Published while no one listens: a resume with `since` gets them, in order.
    for k in 2..5 {
        let (s, _) =
            call(&d, &token, "POST", "/v1/events", json!({"type": "app.more", "data": k}).to_string().as_bytes()).await;
        assert_eq!(s, 200);
    }
    let since = got["seq"].as_u64().unwrap();
    let mut ws = events_socket(&d, &token, &format!("type=app.*&since={since}"), None).await.expect("a feed");
    for k in 2..5 {
        assert_eq!(next_event(&mut ws).await["data"], json!(k), "resumed in order");
    }
    let (s, v) = call(&d, &token, "GET", &format!("/v1/events?follow=false&type=app.more&since={since}"), b"").await;
    assert_eq!((s, v["events"].as_array().map(|a| a.len())), (200, Some(3)), "{v}");

    let own = d.url();
    assert!(events_socket(&d, &token, "", Some(&own)).await.is_ok(), "the node's own origin");
    match events_socket(&d, &token, "", Some("http://evil.example")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 403),
        other => panic!("a foreign origin must get 403, got {:?}", other.map(|_| "a feed")),
    }
    let (s, v) = call(
        &d,
        &token,
        "POST",
        "/v1/config",
        br#"{"action":"set","key":"events.allowed_origins","value":["http://ui.example:8080"],"why":"the lab's dashboard"}"#,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(events_socket(&d, &token, "", Some("http://ui.example:8080")).await.is_ok(), "a listed origin");

    // A subscriber resuming below what the ring still holds is closed with the reason and
    // where to resume, not fed a gap.
    for k in 0..shoal_core::events::RING_MAX + 5 {
        d.shared().with_node(|n, now| n.event_publish(now, "app.flood", json!(k))).unwrap();
    }
    let mut ws = events_socket(&d, &token, "since=1", None).await.expect("a feed");
    use futures_util::StreamExt;
    let msg = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next()).await.expect("an answer");
    match msg {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(f)))) => {
            assert_eq!(u16::from(f.code), 1008);
            assert!(f.reason.contains("fell behind") && f.reason.contains("since="), "{}", f.reason);
        }
        other => panic!("expected a close for falling behind, got {other:?}"),
    }
}

/// Issue 14: the jobs API answers every client mistake with a JSON 4xx, and a lone node runs a
/// job end to end (QuickJS on its own thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_api_refuses_bad_input_and_runs_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    let (s, v) = call(&d, &token, "POST", "/v1/jobs", br#"{"script":"function run(){}"}"#).await;
    assert_json_error(s, &v, 409); // not in a cluster yet
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    for (body, want) in [
        (&b"{"[..], 400),
        (br#"{"script":"function run(){}","colour":"red"}"#, 400),
        (br#"{"script":""}"#, 400),
        (br#"{"script":"x","timeoutSec":0}"#, 400),
        (br#"{"script":"x","args":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#, 400),
    ] {
        let (s, v) = call(&d, &token, "POST", "/v1/jobs", body).await;
        assert_json_error(s, &v, want);
    }
    let long = format!(r#"{{"script":"x","dataset":"cluster:/{}/*"}}"#, "x".repeat(300));
    let (s, v) = call(&d, &token, "POST", "/v1/jobs", long.as_bytes()).await;
    assert_json_error(s, &v, 400);
    for path in ["/v1/jobs/nope", "/v1/jobs/nope/logs", "/v1/jobs/nope/output", "/v1/jobs/nope/explain"] {
        let (s, v) = call(&d, &token, "GET", path, b"").await;
        assert_json_error(s, &v, 404);
    }
    let (s, v) = call(&d, &token, "GET", "/v1/jobs?all=maybe", b"").await;
    assert_json_error(s, &v, 400);
    let (s, v) =
        call(&d, &token, "POST", "/v1/jobs", br#"{"script":"function run(job){ job.log('hi'); return 6*7; }"}"#).await;
    assert_eq!(s, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    for _ in 0..100 {
        let (_, st) = call(&d, &token, "GET", &format!("/v1/jobs/{id}"), b"").await;
        last = st;
        if last["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!((last["status"].as_str(), &last["output"]), (Some("succeeded"), &Value::from(42)), "{last}");
    let (_, logs) = call(&d, &token, "GET", &format!("/v1/jobs/{id}/logs"), b"").await;
    assert_eq!(logs["log"], serde_json::json!(["hi"]));
    let (s, v) = call(&d, &token, "POST", &format!("/v1/jobs/{id}/cancel"), b"").await;
    assert_json_error(s, &v, 409); // finished already
}

/// Issue 17 "Operators": `/healthz` answers whenever the process does, `/readyz` only once
/// the node is in a cluster with a leader known and its metadata caught up (503 with the
/// reasons before); neither needs the token.
#[tokio::test]
async fn health_and_readiness_probes_need_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let (s, v) = call(&d, "", "GET", "/healthz", b"").await;
    assert_eq!((s, &v["ok"]), (200, &Value::Bool(true)), "{v}");
    let (s, v) = call(&d, "", "GET", "/readyz", b"").await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["why"][0], "not in a cluster", "{v}");
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let mut last = (0, Value::Null);
    for _ in 0..50 {
        last = call(&d, "", "GET", "/readyz", b"").await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(last.0, 200, "{}", last.1);
    assert_eq!((last.1["ready"].as_bool(), last.1["caughtUp"].as_bool()), (Some(true), Some(true)), "{}", last.1);
    assert!(last.1["leader"].is_string(), "{}", last.1);
}

/// The router's route list, read from its source at compile time (every `.route("PATH",
/// METHODS)` in `http/server/mod.rs`), as (method, path) with path parameters filled in.
fn routes_of_the_router() -> Vec<(String, String)> {
    let src = include_str!("../src/http/server/mod.rs");
    let mut out = Vec::new();
    let mut in_api = false;
    for line in src.lines() {
        let line = line.trim();
        if line.starts_with("let api = Router::new()") {
            in_api = true;
        }
        if line.starts_with("Router::new()") && !line.contains("let api") {
            in_api = false;
        }
        let Some(rest) = line.strip_prefix(".route(\"") else { continue };
        let Some((path, handlers)) = rest.split_once('"') else { continue };
        let path = path
            .replace("{*path}", "a/b.txt")
            .replace("{*rest}", "ping")
            .replace("{id}", "x")
            .replace("{key}", "k")
            .replace("{name}", "m");
        let path = if in_api { format!("/v1{path}") } else { path };
        for (needle, method) in
            [("get(", "GET"), ("post(", "POST"), ("put(", "PUT"), ("delete(", "DELETE"), ("any(", "POST")]
        {
            if handlers.contains(needle) {
                out.push((method.to_string(), path.clone()));
            }
        }
    }
    out
}

/// Issue 17: a table test over the router's own route list. Every `/v1` route and `/metrics`
/// answer 401 (JSON) with no token and with a wrong one; every node-to-node endpoint (the
/// core's table, the shell's `store/*` and `repl/*`, the tunnel upgrade and the relay) answers
/// 401 unsigned, signed for another cluster, and signed in this node's name with a key that is
/// not its own.
#[tokio::test]
async fn every_route_refuses_missing_and_wrong_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let routes = routes_of_the_router();
    let v1: Vec<_> = routes.iter().filter(|(_, p)| p.starts_with("/v1/") || p == "/metrics").collect();
    assert!(v1.len() >= 60, "the route list was not read: {routes:?}");
    // A login is the one route that needs no credentials.
    for (method, path) in v1.iter().filter(|(_, p)| p != "/v1/login") {
        for token in ["", "not-the-token"] {
            let (s, v) = call(&d, token, method, path, b"{}").await;
            assert_eq!(s, 401, "{method} {path} with token {token:?}: {v}");
            assert!(v["error"]["code"].is_string(), "{method} {path}: {v}");
        }
    }
    for (method, path) in routes.iter().filter(|(_, p)| p == "/healthz" || p == "/readyz") {
        let (s, _) = call(&d, "", method, path, b"").await;
        assert!(s == 200 || s == 503, "{method} {path} needs no token: {s}");
    }

    let (id, cluster) = d.shared().read_node(|n, _| (n.id().clone(), n.cluster().unwrap().id.clone()));
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    let other_cluster = shoal_core::ClusterId::new("c-someone-else");
    let mut acn: Vec<(String, String)> = shoal_core::node::ACN_ENDPOINTS
        .iter()
        .filter(|(e, _)| *e != "hello" && *e != "join")
        .map(|(e, m)| (m.to_string(), format!("/cluster/acn/{e}")))
        .collect();
    for (op, m) in [("begin", "POST"), ("chunk", "POST"), ("commit", "POST"), ("abort", "POST"), ("mkdir", "POST")]
        .into_iter()
        .chain([("put", "POST")])
        .chain([
            ("read", "GET"),
            ("stat", "GET"),
            ("checksum", "GET"),
            ("list", "GET"),
            ("delete", "POST"),
            ("rename", "POST"),
        ])
    {
        acn.push((m.into(), format!("/cluster/acn/store/{op}")));
    }
    for op in ["task", "renew", "done"] {
        acn.push(("POST".into(), format!("/cluster/acn/repl/{op}")));
    }
    // Issue 16: the tunnel upgrade and the relay.
    acn.push(("GET".into(), "/cluster/acn/tunnel".into()));
    // Issue 15: forward auth to the identity origin.
    acn.push(("POST".into(), "/cluster/acn/auth/verify".into()));
    acn.push(("POST".into(), "/cluster/acn/relay/n-somewhere/cluster/acn/ping".into()));
    let client = HttpClient::new(TokioEnv::default());
    let mut rng = SeededRng::new(3);
    for (method, target) in &acn {
        let now = TokioEnv::default().now();
        let other = sign_request(
            &stranger,
            &shoal_core::NodeId::new("n-stranger"),
            &other_cluster,
            method,
            target,
            b"{}",
            now,
            &mut rng,
        );
        let impostor = sign_request(&stranger, &id, &cluster, method, target, b"{}", now, &mut rng);
        for (what, pairs) in [
            ("unsigned", Vec::new()),
            ("another cluster", other.pairs().to_vec()),
            ("a wrong key", impostor.pairs().to_vec()),
        ] {
            let r = client.request(&d.url(), method, target, &pairs, b"{}".to_vec(), 5_000).await.unwrap();
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            assert_eq!(r.status, 401, "{method} {target} {what}: {v}");
            assert!(v["error"]["code"].is_string(), "{method} {target} {what}: {v}");
        }
    }
    // Issue 15: as a signed-in user, every admin route is a 403 and every user route is
    // reached; as the admin, none is refused for want of a role. (Logging out would end the
    // session the walk uses; it has its own test.)
    let admin = d.shared().admin_token.clone();
    let (st, v) = call(&d, &admin, "POST", "/v1/users", br#"{"name":"anna","password":"correct horse"}"#).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(&d, "", "POST", "/v1/login", br#"{"username":"anna","password":"correct horse"}"#).await;
    assert_eq!(st, 200, "{v}");
    let session = v["token"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    for (method, path) in v1.iter().filter(|(m, p)| !(m == "POST" && p == "/v1/logout")) {
        let (st, v) = call(&d, &session, method, path, b"{}").await;
        match shoal_core::identity::need_of(method, path) {
            shoal_core::identity::Need::Admin => {
                assert_eq!((st, v["error"]["code"].as_str()), (403, Some("admin_only")), "{method} {path} as a user")
            }
            shoal_core::identity::Need::User => {
                assert!(st != 401 && v["error"]["code"] != "admin_only", "{method} {path} as a user: {st} {v}")
            }
        }
    }
    // Last: some of these are acts (leaving the cluster).
    for (method, path) in &v1 {
        let (st, v) = call(&d, &admin, method, path, b"{}").await;
        assert!(st != 401 && v["error"]["code"] != "admin_only", "{method} {path} as admin: {st} {v}");
    }
    d.shutdown().await;
}

/// Issue 17 "Operators": `/metrics` needs the token and reports requests by route pattern and
/// status, bytes on the connections, members, the lease and the volumes.
#[tokio::test]
async fn metrics_count_requests_by_route_and_report_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let _ = call(&d, "", "GET", "/v1/nodes", b"").await;
    let (s, _) = call(&d, &token, "GET", "/v1/nodes", b"").await;
    assert_eq!(s, 200);
    let _ = call(&d, &token, "GET", "/v1/files/some/where.txt", b"").await;
    let client = HttpClient::new(TokioEnv::default());
    let r = client.request(&d.url(), "GET", "/metrics", &[], Vec::new(), 5_000).await.unwrap();
    assert_eq!(r.status, 401);
    let auth = format!("Bearer {token}");
    let mut text = String::new();
    for _ in 0..50 {
        let r =
            client.request(&d.url(), "GET", "/metrics", &[("authorization", &auth)], Vec::new(), 5_000).await.unwrap();
        assert_eq!(r.status, 200);
        text = String::from_utf8(r.body.to_vec()).unwrap();
        if text.contains("shoal_meta_is_leader 1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for needle in [
        "shoal_http_requests_total{route=\"/v1/nodes\",method=\"GET\",status=\"200\"} 1",
        "shoal_http_requests_total{route=\"/v1/files/{*path}\",method=\"GET\",status=\"404\"} 1",
        "shoal_http_request_duration_seconds_bucket{",
        "shoal_members{state=\"ONLINE\"} 1",
        "shoal_meta_is_leader 1",
        "shoal_meta_term 1",
        "shoal_in_cluster 1",
        "shoal_config_resolve_seconds",
        "shoal_repl_tasks_ended_total{outcome=\"failed\"} 0",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    // The unauthenticated request is counted under its route too (the token layer is inside).
    assert!(text.contains("route=\"/v1/nodes\",method=\"GET\",status=\"401\"} 1"), "{text}");
    let received = text.lines().find_map(|l| l.strip_prefix("shoal_http_received_bytes_total ")).unwrap();
    assert!(received.parse::<u64>().unwrap() > 200, "{received}");
    d.shutdown().await;
}

/// Issue 17 "HTTP limits": every `/v1` route that takes a body refuses one over the API limit
/// with a JSON 413 and JSON nested past serde's depth with a JSON 4xx (never a 5xx, never a
/// crash); file contents (`PUT /v1/files`) are data, bounded by the drive, not this limit.
#[tokio::test]
async fn every_body_route_refuses_huge_and_deeply_nested_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path(), false).await;
    let token = d.shared().admin_token.clone();
    d.shared().with_node(|n, now| n.create_cluster(now, "t")).unwrap();
    let big = vec![b' '; 2 * 1024 * 1024];
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let routes = routes_of_the_router();
    let with_body: Vec<_> = routes
        .iter()
        .filter(|(m, p)| (m == "POST" || m == "PUT") && p.starts_with("/v1/") && !p.starts_with("/v1/files/"))
        .collect();
    assert!(with_body.len() >= 25, "{with_body:?}");
    for (method, path) in &with_body {
        let (s, v) = call(&d, &token, method, path, &big).await;
        assert_json_error(s, &v, 413);
    }
    // Routes that read no body (leave, cancel, kicks) may take it; none may fail on it.
    for (method, path) in with_body.iter().filter(|(_, p)| p != "/v1/cluster/leave") {
        let (s, v) = call(&d, &token, method, path, deep.as_bytes()).await;
        assert!(s < 500, "{method} {path} deep: {s} {v}");
        if s >= 400 {
            assert!(v["error"]["code"].is_string(), "{method} {path} deep: {s} {v}");
        }
    }
    // The node still answers.
    let (s, _) = call(&d, &token, "GET", "/v1/cluster/status", b"").await;
    assert_eq!(s, 200);
    d.shutdown().await;
}
