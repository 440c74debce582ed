//! Helpers shared by the benches that start real `shoal serve` processes.

use std::net::TcpListener;
use std::process::Child;

/// Child processes killed (and reaped) when dropped, however the bench ends.
pub struct Kill(pub Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// CPU time (user + system, in clock ticks of 10 ms) the processes `pids` have used so far,
/// read from `/proc` (0 for one that cannot be read).
#[allow(dead_code)] // used by some of the benches that share this module
pub fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command name (which may hold spaces), from field 3 on.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            let at = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            at(11) + at(12)
        })
        .sum()
}

/// Node-to-node requests (`/cluster/acn/...`) answered so far, summed over the nodes, by the
/// last segment of their route (from each node's `/metrics`), for routes containing `within`.
#[allow(dead_code)] // used by some of the benches that share this module
pub async fn acn_requests(
    c: &shoal_shell::net::client::HttpClient<shoal_shell::env::TokioEnv>,
    urls: &[String],
    tokens: &[String],
    within: &str,
) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (url, token) in urls.iter().zip(tokens) {
        let auth = format!("Bearer {token}");
        let Ok(r) = c.request(url, "GET", "/metrics", &[("authorization", &auth)], Vec::new(), 10_000).await else {
            continue;
        };
        for line in String::from_utf8_lossy(&r.body).lines() {
            let Some(rest) = line.strip_prefix("shoal_http_requests_total{") else { continue };
            let Some(route) = rest.split("route=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
            if !route.starts_with("/cluster/acn/") || !route.contains(within) {
                continue;
            }
            let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            *out.entry(route.rsplit('/').next().unwrap_or(route).to_string()).or_default() += n;
        }
    }
    out
}

/// What `after` counts beyond `before` (two [`acn_requests`] readings), as "route n" per
/// `per` units of work, largest first.
#[allow(dead_code)] // used by some of the benches that share this module
pub fn requests_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    per: f64,
) -> String {
    let mut moved: Vec<(String, f64)> = after
        .iter()
        .map(|(route, n)| (route.clone(), (n - before.get(route).copied().unwrap_or(0.0)) / per))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    moved.sort_by(|a, b| b.1.total_cmp(&a.1));
    let digits = if per > 1.0 { 2 } else { 0 };
    moved.iter().map(|(route, n)| format!("{route} {n:.digits$}")).collect::<Vec<_>>().join(", ")
}

/// A free port on 127.0.0.1.
pub fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One request with the admin `token`: status and JSON body (`Null` when not JSON; status 0
/// and the error when the request failed).
#[allow(dead_code)]
pub async fn call(
    c: &shoal_shell::net::client::HttpClient<shoal_shell::env::TokioEnv>,
    url: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let auth = format!("Bearer {token}");
    match c.request(url, method, path, &[("authorization", &auth)], body, 60_000).await {
        Ok(r) => (r.status, serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null)),
        Err(e) => (0, serde_json::json!({ "error": e.to_string() })),
    }
}

/// A JSON body.
#[allow(dead_code)]
pub fn j(v: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

/// Polls `f` every 20 ms until it holds (true) or `limit` passes (false).
#[allow(dead_code)]
pub async fn wait_until(limit: std::time::Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

/// Threads each of `members` processes sharing this machine runs with: the cores divided by
/// the members, at least 1 (`MEMBER_THREADS` overrides). Both stores get the same: shoal
/// nodes through `SHOAL_THREADS` (`serve --threads`), etcd members through `GOMAXPROCS`.
#[allow(dead_code)]
pub fn member_threads(members: usize) -> usize {
    if let Some(n) = std::env::var("MEMBER_THREADS").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores / members.max(1)).max(1)
}

/// Three `shoal serve` processes of `bin` under `root` in one cluster with a leader, each with
/// [`member_threads`]: their URLs and admin tokens.
#[allow(dead_code)]
pub async fn three_nodes(bin: &str, root: &std::path::Path, kids: &mut Kill) -> (Vec<String>, Vec<String>) {
    nodes(bin, root, kids, 3).await
}

/// [`three_nodes`] with `count` nodes (1: a single-node install).
#[allow(dead_code)]
pub async fn nodes(bin: &str, root: &std::path::Path, kids: &mut Kill, count: usize) -> (Vec<String>, Vec<String>) {
    use serde_json::json;
    use std::process::{Command, Stdio};
    use std::time::Duration;
    let (mut urls, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..count {
        let dir = root.join(format!("n{i}"));
        let p = port();
        kids.0.push(
            Command::new(bin)
                .args(["serve", "--data", dir.to_str().unwrap(), "--listen", &format!("127.0.0.1:{p}")])
                .env("SHOAL_LOG", "error")
                .env("SHOAL_THREADS", member_threads(count).to_string())
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
    let c = shoal_shell::net::client::HttpClient::new(shoal_shell::env::TokioEnv::default());
    assert_eq!(call(&c, &urls[0], &tokens[0], "POST", "/v1/cluster/create", j(json!({"name": "b"}))).await.0, 200);
    for i in 1..count {
        let t =
            call(&c, &urls[0], &tokens[0], "POST", "/v1/tokens", vec![]).await.1["token"].as_str().unwrap().to_string();
        assert_eq!(call(&c, &urls[i], &tokens[i], "POST", "/v1/cluster/join", j(json!({ "token": t }))).await.0, 200);
    }
    let led = wait_until(Duration::from_secs(120), async || {
        let mut ok = true;
        for i in 0..count {
            ok &= call(&c, &urls[i], &tokens[i], "GET", "/v1/meta/status", vec![]).await.1["leader"].is_string();
        }
        ok
    })
    .await;
    assert!(led, "a leader");
    (urls, tokens)
}

/// Three etcd members under `root` on loopback (their processes in `kids`), each with
/// [`member_threads`]: their client URLs; `None` when no `etcd` binary is installed.
#[allow(dead_code)]
pub fn etcd_members(root: &std::path::Path, kids: &mut Kill) -> Option<Vec<String>> {
    if std::env::var("ETCD").as_deref() == Ok("0") {
        return None;
    }
    let bin = ["etcd", "/usr/bin/etcd"]
        .into_iter()
        .find(|b| std::process::Command::new(b).arg("--version").output().is_ok())?;
    let peers: Vec<u16> = (0..3).map(|_| port()).collect();
    let clients: Vec<u16> = (0..3).map(|_| port()).collect();
    let initial: Vec<String> = (0..3).map(|i| format!("m{i}=http://127.0.0.1:{}", peers[i])).collect();
    for i in 0..3 {
        kids.0.push(
            std::process::Command::new(bin)
                .args(["--name", &format!("m{i}"), "--data-dir", root.join(format!("etcd-{i}")).to_str()?])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{}", peers[i])])
                .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{}", peers[i])])
                .args(["--listen-client-urls", &format!("http://127.0.0.1:{}", clients[i])])
                .args(["--advertise-client-urls", &format!("http://127.0.0.1:{}", clients[i])])
                .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "shoal-bench", "--log-level", "error"])
                .env("GOMAXPROCS", member_threads(3).to_string())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?,
        );
    }
    Some(clients.iter().map(|p| format!("http://127.0.0.1:{p}")).collect())
}
