//! Nodes behind NAT (issue 16), with real processes on loopback: a node started with
//! `--advertise none` joins with a token, opens its reverse tunnel to the member it prefers,
//! is ONLINE in every view, receives a copy under policy 2 through the relay, and serves a get
//! through the relay, runs a job and gets an event; once it dies the relay answers 502, and once back it tunnels again; an
//! unsigned tunnel upgrade gets 401.

mod started;

use serde_json::Value;
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
    fn start(&mut self, extra: &[&str]) {
        self.child = Some(started::serve(&self.dir, &mut self.port, Duration::from_secs(30), |port| {
            Command::new(BIN)
                .args(["serve", "--data"])
                .arg(&self.dir)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--heartbeat-ms", "300", "--online-within-ms", "1500", "--unknown-within-ms", "4000"])
                .args(extra)
                .env("SHOAL_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start shoal serve")
        }));
    }

    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(BIN)
            .arg("--data")
            .arg(&self.dir)
            .args(["--api", &format!("http://127.0.0.1:{}", self.port)])
            .args(args)
            .output()
            .expect("run shoal");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = self.cli(&all);
        assert!(ok, "shoal {args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    }

    fn id(&self) -> String {
        self.json(&["cluster", "status"])["node"].as_str().unwrap().to_string()
    }
}

struct Nodes(Vec<Node>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &mut self.0 {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The raw head of the answer to `req` sent to `port`.
fn raw(port: u16, req: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `shoal node probe` as JSON (it exits non-zero when the node is not reachable).
fn probe(n: &Node, id: &str) -> Value {
    let (_, out, _) = n.cli(&["--json", "node", "probe", id]);
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

fn view<'a>(nodes: &'a Value, id: &str) -> Option<&'a Value> {
    nodes["nodes"].as_array()?.iter().find(|n| n["id"] == id)
}

#[test]
fn a_node_behind_nat_joins_holds_a_copy_and_serves_it_through_the_relay() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(
        (0..3).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect(),
    );
    nodes.0[0].start(&[]);
    nodes.0[1].start(&[]);
    let n0 = &nodes.0[0];
    n0.json(&["cluster", "create", "--name", "nat"]);
    let token = n0.json(&["token", "new"])["token"].as_str().unwrap().to_string();
    nodes.0[1].json(&["join", &token]);
    let host = nodes.0[1].id();

    // Node 2 cannot be reached (no URL) and prefers node 1 as its tunnel host.
    nodes.0[2].start(&["--advertise", "none", "--tunnel-via", &host]);
    let token = nodes.0[0].json(&["token", "new"])["token"].as_str().unwrap().to_string();
    nodes.0[2].json(&["join", &token]);
    let nat = nodes.0[2].id();
    let n = &nodes.0;

    // Its tunnel is up to node 1, and every node sees it ONLINE, each with its route.
    wait_for("the tunnel up and the NAT node ONLINE everywhere", || {
        n[2].json(&["node", "tunnel"])["state"] == "up"
            && n.iter().all(|m| view(&m.json(&["nodes"]), &nat).is_some_and(|v| v["state"] == "ONLINE"))
    });
    let t = n[2].json(&["node", "tunnel"]);
    assert_eq!(t["host"], host.as_str(), "{t}");
    let seen_by_0 = n[0].json(&["nodes"]);
    let v = view(&seen_by_0, &nat).unwrap();
    assert_eq!(v["advertiseUrl"], "", "{v}");
    assert_eq!(v["tunnelVia"], host.as_str(), "{v}");
    assert_eq!(v["route"], format!("relay via {host}"), "{v}");
    let seen_by_1 = n[1].json(&["nodes"]);
    assert_eq!(view(&seen_by_1, &nat).unwrap()["route"], "tunnel (hosted here)");
    let seen_by_2 = n[2].json(&["nodes"]);
    // The NAT node reaches its host at its URL (the spec's first route is a tunnel that
    // terminates on the asking node), and shows the tunnel.
    let h = view(&seen_by_2, &host).unwrap();
    assert_eq!((&h["route"], &h["tunnel"]), (&Value::from("direct"), &Value::from(true)), "{h}");
    let (ok, human, _) = n[0].cli(&["nodes"]);
    assert!(ok && human.contains("relay via") && human.contains("(behind NAT)"), "{human}");

    // A signed ping from node 0 reaches it through the relay.
    let pinged = probe(&n[0], &nat);
    assert_eq!(pinged["reachable"], true, "{pinged}");

    // Volumes on nodes 0 and 2 only: policy 2 puts the second copy on the NAT node.
    for i in [0, 2] {
        let vol = root.path().join(format!("vol{i}"));
        n[i].json(&["volume", "add", vol.to_str().unwrap(), "--create"]);
    }
    n[0].json(&["policy", "set", "cluster:/nat", "2"]);
    wait_for("volumes and policy everywhere", || {
        n.iter().all(|m| {
            m.json(&["volume", "list"])["volumes"].as_array().is_some_and(|a| a.len() == 2)
                && m.json(&["policy", "list"])["policies"].as_array().is_some_and(|a| !a.is_empty())
        })
    });
    let local = root.path().join("in.bin");
    let content: Vec<u8> = (0..6 * 1024 * 1024 + 7).map(|i: usize| (i * 31 % 253) as u8).collect();
    std::fs::write(&local, &content).unwrap();
    let put = n[0].json(&["put", local.to_str().unwrap(), "cluster:/nat/in.bin"]);
    assert_eq!((put["copies"].as_u64(), put["wanted"].as_u64()), (Some(2), Some(2)), "{put}");
    let on_nat = root.path().join("vol2/nat/in.bin");
    assert!(std::fs::read(&on_nat).is_ok_and(|b| b == content), "the NAT node received the copy");

    // Rot node 0's own copy: its get falls back to the NAT node's copy, read through the relay.
    let mine = root.path().join("vol0/nat/in.bin");
    let mut rotten = std::fs::read(&mine).unwrap();
    rotten[3_000_000] ^= 0x01;
    std::fs::write(&mine, &rotten).unwrap();
    let out = root.path().join("out.bin");
    let (ok, _, err) = n[0].cli(&["get", "cluster:/nat/in.bin", out.to_str().unwrap()]);
    assert!(ok, "the get falls back to the copy behind NAT: {err}");
    assert!(std::fs::read(&out).unwrap() == content, "and brings the right bytes");

    // Jobs and events reach it too: a job pinned to it (handed over, renewed and reported
    // through the relay and its own requests) and an event published elsewhere.
    let hello = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs/hello.js");
    let (ok, out, err) = n[0].cli(&["job", "submit", hello.to_str().unwrap(), "--node", &nat, "--follow"]);
    assert!(ok, "a job on the NAT node: {err}");
    assert!(out.contains(&format!("\"node\": \"{nat}\"")), "ran where pinned: {out}");
    n[0].json(&["events", "publish", "--type", "app.nat", "--payload", r#"{"to":"nat"}"#]);
    wait_for("the event on the NAT node", || {
        let (ok, out, _) = n[2].cli(&["--json", "events", "--type", "app.*"]);
        ok && out.contains("app.nat")
    });

    // The NAT node dies: its host has no tunnel for it, so a relay through the host answers
    // 502 at once (the asker tries again later, as heartbeats do); back, it tunnels again and
    // the relay works.
    let nat_args = ["--advertise", "none", "--tunnel-via", host.as_str()];
    if let Some(mut c) = nodes.0[2].child.take() {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let n = &nodes.0;
    wait_for("the host to drop the dead tunnel", || {
        let p = probe(&n[0], &nat);
        p["reachable"] == false && p["status"] == 502
    });
    nodes.0[2].start(&nat_args);
    let n = &nodes.0;
    wait_for("the NAT node back through its tunnel", || {
        n[2].json(&["node", "tunnel"])["state"] == "up" && probe(&n[0], &nat)["reachable"] == true
    });

    // An unsigned tunnel upgrade is refused before any upgrade.
    let head = raw(
        n[1].port,
        "GET /cluster/acn/tunnel HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    // A relay path that is not whole is a 400; a relay to a node not tunnelled here a 401
    // before anything (unsigned), as every ACN request.
    let head = raw(n[1].port, "GET /cluster/acn/relay/abc HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 401") || head.starts_with("HTTP/1.1 400"), "{head}");
}
