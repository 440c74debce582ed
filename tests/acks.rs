//! Acknowledged means safe (issue 18): three real `shoal serve` processes; a client writes
//! settings through one node and that node is SIGKILLed right after its last answer, round
//! after round, through the leader and through followers. With the default `meta.ack`
//! (`replicated`) every acknowledged write is on the other nodes at once and on every node once
//! the killed one is back; each answer says what it reached (`x-shoal-ack`).

mod started;

use serde_json::{json, Value};
use started::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_shoal");

struct Node {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) {
        self.child = Some(started::serve(&self.dir, &mut self.port, Duration::from_secs(30), |port| {
            Command::new(BIN)
                .args(["serve", "--data"])
                .arg(&self.dir)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--heartbeat-ms", "300", "--online-within-ms", "1500", "--unknown-within-ms", "4000"])
                .env("SHOAL_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start shoal serve")
        }));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.dir.join("admin.token")).unwrap().trim().to_string()
    }

    /// (status, `x-shoal-ack`, JSON body); status 0 when no whole answer came.
    fn call(&self, method: &str, target: &str, body: Option<Value>) -> (u16, String, Value) {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return (0, String::new(), Value::Null) };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {target} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.token(),
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new(), Value::Null);
        }
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { return (0, String::new(), Value::Null) };
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let ack = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-shoal-ack: ").map(str::to_string))
            .unwrap_or_default();
        (status, ack, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}

struct Nodes(Vec<Node>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &mut self.0 {
            n.kill();
        }
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn cli(n: &Node, args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .arg("--data")
        .arg(&n.dir)
        .args(["--api", &format!("http://127.0.0.1:{}", n.port), "--json"])
        .args(args)
        .output()
        .expect("run shoal");
    assert!(out.status.success(), "shoal {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ready(n: &Node) -> bool {
    n.call("GET", "/readyz", None).0 == 200
}

#[test]
fn acknowledged_writes_survive_a_sigkill_right_after_the_answer() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(
        (0..3).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect(),
    );
    for n in &mut nodes.0 {
        n.start();
    }
    cli(&nodes.0[0], &["cluster", "create", "--name", "acks"]);
    for i in 1..3 {
        let t = cli(&nodes.0[0], &["token", "new"]);
        cli(&nodes.0[i], &["join", t["token"].as_str().unwrap()]);
    }
    wait_for("every node ready", || nodes.0.iter().all(ready));
    // A short lease, so a killed leader is replaced in seconds (the default is 30 s).
    for (key, value) in [("meta.lease", "4s"), ("meta.lease_renew_every", "1s"), ("meta.lease_check_every", "500ms")] {
        let body = json!({"action": "set", "key": key, "value": value, "why": "acks test"});
        let (s, _, v) = nodes.0[0].call("POST", "/v1/config", Some(body));
        assert_eq!(s, 200, "{key}: {v}");
    }
    // The new lease may move the leader: go on once a write is held elsewhere again.
    wait_for("writes replicated again", || {
        nodes.0.iter().all(|n| n.call("PUT", "/v1/settings/acks.probe", Some(json!({"value": 0}))).1 == "replicated")
    });
    // `SHOAL_ACK_MODE=local` shows what the default prevents (expect this test to fail then).
    let mode = std::env::var("SHOAL_ACK_MODE").unwrap_or_else(|_| "replicated".into());
    if mode != "replicated" {
        let body = json!({"action": "set", "key": "meta.ack", "value": mode, "why": "acks test"});
        assert_eq!(nodes.0[0].call("POST", "/v1/config", Some(body)).0, 200);
        wait_for("the mode applied everywhere", || {
            nodes.0.iter().all(|n| n.call("PUT", "/v1/settings/acks.probe", Some(json!({"value": 0}))).1 == mode)
        });
    }

    let mut acked: Vec<(String, u64)> = Vec::new();
    for round in 0..6u64 {
        // Through the leader in some rounds, through a follower in others.
        let leader = nodes.0[0].call("GET", "/v1/meta/status", None).2["leader"].as_str().unwrap_or("").to_string();
        let ids: Vec<String> = nodes
            .0
            .iter()
            .map(|n| n.call("GET", "/v1/cluster/status", None).2["node"].as_str().unwrap_or("").to_string())
            .collect();
        let at = match ids.iter().position(|id| *id == leader) {
            Some(l) if round % 2 == 0 => l,
            Some(l) => (l + 1 + (round as usize / 2) % 2) % 3,
            None => round as usize % 3,
        };
        for i in 0..25u64 {
            let key = format!("acks.r{round}.i{i}");
            let (s, ack, v) =
                nodes.0[at].call("PUT", &format!("/v1/settings/{key}"), Some(json!({"value": round * 1000 + i})));
            assert_eq!(s, 200, "{key}: {v}");
            assert_eq!(ack, mode, "{key}: every other node is up, so another holds it");
            acked.push((key, round * 1000 + i));
        }
        // Killed right after the last answer: nothing acknowledged may depend on it.
        nodes.0[at].kill();
        let survivors: Vec<usize> = (0..3).filter(|&j| j != at).collect();
        for (key, value) in &acked {
            // Held by the node that took it from the killed one (the leader, or a follower).
            let held = survivors
                .iter()
                .any(|&j| nodes.0[j].call("GET", &format!("/v1/settings/{key}"), None).2["value"] == json!(value));
            assert!(held, "round {round}: {key} acknowledged by node {at}, then lost with it");
        }
        nodes.0[at].start();
        wait_for("every node ready again", || nodes.0.iter().all(ready));
        wait_for("writes replicated again through every node", || {
            nodes.0.iter().all(|n| n.call("PUT", "/v1/settings/acks.probe", Some(json!({"value": 0}))).1 == mode)
        });
    }
    // After the last restart every node holds every acknowledged write.
    for (key, value) in &acked {
        wait_for(&format!("{key} on every node"), || {
            nodes.0.iter().all(|n| n.call("GET", &format!("/v1/settings/{key}"), None).2["value"] == json!(value))
        });
    }
}
