//! Whole-product test on loopback: three real `shoal serve` processes driven by the real CLI
//! (spec: cluster-runtime.md "Membership", "Joining", "Admin API"). Short intervals so the
//! liveness thresholds pass in seconds.

use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod started;

use started::free_port;
const BIN: &str = env!("CARGO_BIN_EXE_shoal");

struct Node {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Node {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Start (or restart) the node; a first start whose port was taken meanwhile moves to another.
    fn start(&mut self) {
        self.child = Some(started::serve(&self.dir, &mut self.port, Duration::from_secs(20), |port| {
            Command::new(BIN)
                .args(["serve", "--data"])
                .arg(&self.dir)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--name", &format!("node-{port}")])
                .args(["--heartbeat-ms", "300", "--online-within-ms", "1500", "--unknown-within-ms", "4000"])
                // Several nodes on one machine: one thread each (README, `--threads`).
                .env("SHOAL_THREADS", "1")
                .env("SHOAL_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start shoal serve")
        }));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// Run the CLI against this node; returns (success, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        cli_in(&self.dir, &self.url(), args)
    }

    fn cli_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = self.cli(&all);
        assert!(ok, "shoal {args:?} failed: {err} (it printed: {out})");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("shoal {args:?} printed no JSON ({e}): {out}"))
    }

    /// The state this node computes for `id`. DEGRADED (CPU >= 97 %) is reported as ONLINE:
    /// a loaded CI machine legitimately degrades every node, and this test is about liveness.
    fn state_of(&self, id: &str) -> Option<String> {
        let v = self.cli_json(&["nodes"]);
        let state = v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["id"] == id && n["removed"] != true)
            .map(|n| n["state"].as_str().unwrap_or("").to_string())?;
        Some(if state == "DEGRADED" { "ONLINE".to_string() } else { state })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn cli_in(dir: &Path, api: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("--data")
        .arg(dir)
        .args(["--api", api])
        .args(args)
        .env_remove("SHOAL_TOKEN")
        .env_remove("SHOAL_API")
        .output()
        .expect("run shoal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "condition not met within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_real_nodes_form_a_cluster_track_liveness_and_survive_restart() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> =
        (0..3).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect();
    for n in nodes.iter_mut() {
        n.start();
    }

    // Create, make tokens, join.
    let created = nodes[0].cli_json(&["cluster", "create", "--name", "loop"]);
    let cluster_id = created["id"].as_str().unwrap().to_string();
    for i in 1..3 {
        let t = nodes[0].cli_json(&["token", "new", "--ttl-hours", "2"]);
        let token = t["token"].as_str().unwrap().to_string();
        assert!(token.starts_with("aroz-join:"));
        let joined = nodes[i].cli_json(&["join", &token]);
        assert_eq!(joined["id"], cluster_id.as_str());
    }
    let ids: Vec<String> =
        nodes.iter().map(|n| n.cli_json(&["cluster", "status"])["node"].as_str().unwrap().to_string()).collect();
    for n in &nodes {
        wait_for(Duration::from_secs(10), || ids.iter().all(|id| n.state_of(id).as_deref() == Some("ONLINE")));
    }

    // Metadata: a policy set on one node and a setting on another reach every node, under one
    // leader, with identical record digests.
    let policy = nodes[0].cli_json(&["policy", "set", "cluster:photos", "2"]);
    assert_eq!(policy["folder"], "/photos");
    let set = nodes[1].cli_json(&["settings", "set", "loop.answer", "42"]);
    assert_eq!(set["value"], 42);
    wait_for(Duration::from_secs(20), || {
        let st: Vec<Value> = nodes.iter().map(|n| n.cli_json(&["meta", "status"])).collect();
        st.iter().all(|s| {
            s["leader"].is_string()
                && s["leader"] == st[0]["leader"]
                && s["digest"] == st[0]["digest"]
                && s["pending"] == 0
        }) && st[0]["records"].as_u64() >= Some(2) // the policy, the setting (and the published build)
    });
    assert_eq!(nodes[2].cli_json(&["settings", "get", "loop.answer"])["value"], 42);
    let (ok, _, err) = nodes[2].cli(&["settings", "get", "no.such"]);
    assert!(!ok && err.contains("no setting"), "{err}");

    // Bad input: a wrong admin token, a malformed join token, an unsigned ACN request.
    let (ok, _, err) = nodes[0].cli(&["--token", "not-the-token", "nodes"]);
    assert!(!ok && err.contains("not a live session, key or the admin token") && err.contains("401"), "{err}");
    let (ok, _, err) = nodes[1].cli(&["join", "aroz-join:garbage"]);
    assert!(!ok && err.contains("error:"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["node", "state", &ids[1], "sleeping"]);
    assert!(!ok && err.contains("sleeping"), "{err}");

    // SIGKILL n2: UNKNOWN after the online window, then OFFLINE.
    nodes[2].kill();
    wait_for(Duration::from_secs(10), || nodes[0].state_of(&ids[2]).as_deref() == Some("UNKNOWN"));
    wait_for(Duration::from_secs(15), || nodes[0].state_of(&ids[2]).as_deref() == Some("OFFLINE"));
    assert_eq!(nodes[1].state_of(&ids[0]).as_deref(), Some("ONLINE"));

    // Remove it: gone from every member's list.
    let removed = nodes[0].cli_json(&["node", "remove", &ids[2]]);
    assert_eq!(removed["removed"], ids[2].as_str());
    wait_for(Duration::from_secs(5), || nodes[1].state_of(&ids[2]).is_none());

    // Restart n1: same identity, same cluster, ONLINE again.
    nodes[1].kill();
    wait_for(Duration::from_secs(10), || nodes[0].state_of(&ids[1]).as_deref() == Some("UNKNOWN"));
    nodes[1].start();
    let status = nodes[1].cli_json(&["cluster", "status"]);
    assert_eq!(status["node"], ids[1].as_str());
    assert_eq!(status["id"], cluster_id.as_str());
    wait_for(Duration::from_secs(10), || nodes[0].state_of(&ids[1]).as_deref() == Some("ONLINE"));
    wait_for(Duration::from_secs(10), || nodes[1].state_of(&ids[0]).as_deref() == Some("ONLINE"));
    // Its metadata came back from disk.
    assert_eq!(nodes[1].cli_json(&["settings", "get", "loop.answer"])["value"], 42);
    assert_eq!(nodes[1].cli_json(&["policy", "list"])["policies"][0]["replicas"], 2);

    // Probe over a signed ping.
    let probe = nodes[0].cli_json(&["node", "probe", &ids[1]]);
    assert_eq!(probe["reachable"], true, "{probe}");
}

/// The cluster drive through the real CLI and two real processes (issue 4 "The namespace"):
/// put with a progress bar, a verified get from the other node, ls, stat with every copy, mv,
/// verify, rm, and clear failures with a non-zero exit for bad input.
#[test]
fn the_drive_through_the_real_cli() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> =
        (0..2).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    nodes[0].cli_json(&["cluster", "create", "--name", "drive"]);
    let token = nodes[0].cli_json(&["token", "new"])["token"].as_str().unwrap().to_string();
    nodes[1].cli_json(&["join", &token]);
    for (i, n) in nodes.iter().enumerate() {
        let vol = root.path().join(format!("vol{i}"));
        n.cli_json(&["volume", "add", vol.to_str().unwrap(), "--create"]);
    }
    nodes[0].cli_json(&["policy", "set", "cluster:/docs", "2"]);
    // Plan every 2 s rather than every minute, so a repair below comes at once.
    nodes[0].cli_json(&["config", "set", "--key", "replication.plan_every", "--value", "2s", "--why", "a quick test"]);
    wait_for(Duration::from_secs(20), || {
        nodes.iter().all(|n| {
            let v = n.cli_json(&["volume", "list"]);
            let p = n.cli_json(&["policy", "list"]);
            v["volumes"].as_array().is_some_and(|a| a.len() == 2)
                && p["policies"].as_array().is_some_and(|a| !a.is_empty())
                && n.cli_json(&["meta", "status"])["leader"].is_string()
        })
    });

    let local = root.path().join("in.bin");
    let content: Vec<u8> = (0..9 * 1024 * 1024 + 5).map(|i: usize| (i * 13 % 251) as u8).collect();
    std::fs::write(&local, &content).unwrap();
    let put = nodes[0].cli_json(&["put", local.to_str().unwrap(), "cluster:/docs/in.bin"]);
    assert_eq!((put["copies"].as_u64(), put["wanted"].as_u64()), (Some(2), Some(2)), "{put}");

    let out = root.path().join("out.bin");
    let got = nodes[1].cli_json(&["get", "cluster:/docs/in.bin", out.to_str().unwrap()]);
    assert_eq!(got["size"].as_u64(), Some(content.len() as u64));
    assert!(std::fs::read(&out).unwrap() == content, "the file comes back byte for byte");

    // Rot node 1's own copy: its get reads that copy first, finds the bytes wrong at the end
    // (the copy is marked stale), tries again and gets the file from node 0's copy.
    let mine = root.path().join("vol1/docs/in.bin");
    let mut rotten = std::fs::read(&mine).unwrap();
    rotten[1_000_000] ^= 0x01;
    std::fs::write(&mine, &rotten).unwrap();
    let out2 = root.path().join("out2.bin");
    let (ok, _, err) = nodes[1].cli(&["get", "cluster:/docs/in.bin", out2.to_str().unwrap()]);
    assert!(ok, "the get falls back to the good copy: {err}");
    assert!(std::fs::read(&out2).unwrap() == content, "and brings the right bytes");
    assert!(err.contains("trying again"), "after one failed attempt: {err}");
    wait_for(Duration::from_secs(90), || {
        let st = nodes[0].cli_json(&["stat", "cluster:/docs/in.bin"]);
        let good = |c: &&Value| matches!(c["state"].as_str(), Some("committed" | "verified"));
        st["copies"].as_array().is_some_and(|c| c.iter().filter(good).count() == 2)
            && std::fs::read(&mine).is_ok_and(|b| b == content)
    });

    let ls = nodes[1].cli_json(&["ls", "cluster:/docs"]);
    assert_eq!(ls["entries"][0]["name"], "in.bin");
    let st = nodes[1].cli_json(&["stat", "cluster:/docs/in.bin"]);
    let copies = st["copies"].as_array().unwrap();
    assert_eq!(copies.len(), 2);
    assert!(copies.iter().all(|c| c["copy"].as_str().unwrap().ends_with("/docs/in.bin")), "{st}");
    let (ok, human, _) = nodes[1].cli(&["stat", "cluster:/docs/in.bin"]);
    assert!(ok && (human.contains("committed") || human.contains("verified")), "{human}");

    nodes[0].cli_json(&["mv", "cluster:/docs/in.bin", "cluster:/docs/moved.bin"]);
    let verify = nodes[0].cli_json(&["verify", "cluster:/docs"]);
    assert_eq!(verify["verified"], 2, "{verify}");
    wait_for(Duration::from_secs(20), || root.path().join("vol1/docs/moved.bin").exists());
    // Issue 17: `verify` finding a corrupt copy marks it stale and exits non-zero.
    let copy = root.path().join("vol1/docs/moved.bin");
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&copy, &bytes).unwrap();
    let (ok, printed, err) = nodes[0].cli(&["--json", "verify", "cluster:/docs/moved.bin"]);
    assert!(!ok && err.contains("did not match"), "{printed} {err}");
    let v: Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(v["stale"].as_array().map(Vec::len), Some(1), "{v}");
    nodes[1].cli_json(&["rm", "cluster:/docs/moved.bin"]);
    wait_for(Duration::from_secs(20), || {
        !root.path().join("vol0/docs/moved.bin").exists() && !root.path().join("vol1/docs/moved.bin").exists()
    });

    // Bad input: a missing file, a local file that does not exist, a path that is no cluster path.
    let (ok, _, err) = nodes[0].cli(&["get", "cluster:/docs/none", out.to_str().unwrap()]);
    assert!(!ok && err.contains("nothing at"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["put", "/no/such/file", "cluster:/x"]);
    assert!(!ok && err.contains("/no/such/file"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["put", local.to_str().unwrap(), "docs/x"]);
    assert!(!ok && err.contains("not a cluster path"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["rm", "cluster:/docs"]);
    assert!(ok || err.contains("not empty") || err.contains("nothing at"), "{err}");
}

/// The configuration verb and user modules through the real CLI (issue 5): a mesh value with
/// its reason in the history, a user module installed from a TOML manifest and placed on one
/// node, its key resolving from the predefined key it falls back to and then its own value,
/// resolved values in DATA/config/<module>.json, and refusals with a non-zero exit.
#[test]
fn config_and_user_modules_through_the_real_cli() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> =
        (0..2).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    nodes[0].cli_json(&["cluster", "create", "--name", "cfg"]);
    let token = nodes[0].cli_json(&["token", "new"])["token"].as_str().unwrap().to_string();
    nodes[1].cli_json(&["join", &token]);
    let id1 = nodes[1].cli_json(&["cluster", "status"])["node"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(20), || nodes.iter().all(|n| n.cli_json(&["meta", "status"])["leader"].is_string()));

    let set = nodes[0].cli_json(&[
        "config",
        "set",
        "--key",
        "storage.scrub_rate",
        "--value",
        "40MiB",
        "--why",
        "faster disks",
    ]);
    assert_eq!(set["value"], 40 * 1024 * 1024);
    let (ok, _, err) = nodes[0].cli(&["config", "set", "--key", "storage.scrub_rat", "--value", "1", "--why", "x"]);
    assert!(!ok && err.contains("storage.scrub_rate"), "an undeclared key names the declared ones: {err}");
    let (ok, _, err) = nodes[0].cli(&["config", "set", "--key", "storage.scrub_rate", "--value", "fast", "--why", "x"]);
    assert!(!ok && err.contains("bad_value"), "{err}");

    let manifest = root.path().join("backup.toml");
    std::fs::write(
        &manifest,
        r#"module = "backup"

[[keys]]
name = "rate"
type = "bytes"
default = "1MiB"
fallback = "storage.scrub_rate"
doc = "how fast the backup reads"

[[keys]]
name = "target"
type = "string"
default = "/srv/backup"
pattern = "/.*"
"#,
    )
    .unwrap();
    nodes[0].cli_json(&["module", "install", manifest.to_str().unwrap()]);
    nodes[0].cli_json(&["module", "place", "backup", "--node", &id1]);
    wait_for(Duration::from_secs(20), || {
        let v = nodes[1].cli_json(&["config", "list", "--module", "backup", "--node", &id1, "--key", "rate"]);
        v["resolved"]
            .as_array()
            .is_some_and(|r| r.len() == 1 && r[0]["source"] == "mesh" && r[0]["value"] == 40 * 1024 * 1024)
    });
    nodes[0].cli_json(&[
        "config",
        "set",
        "--node",
        &id1,
        "--module",
        "backup",
        "--key",
        "target",
        "--value",
        "/mnt/b",
        "--why",
        "bigger disk",
    ]);
    let (ok, _, err) = nodes[0].cli(&[
        "config", "set", "--node", &id1, "--module", "backup", "--key", "target", "--value", "relative", "--why", "x",
    ]);
    assert!(!ok && err.contains("pattern"), "{err}");
    wait_for(Duration::from_secs(20), || {
        std::fs::read(nodes[1].dir.join("config/backup.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["target"]["value"] == "/mnt/b" && v["target"]["source"] == "module")
    });
    assert!(!nodes[0].dir.join("config/backup.json").exists(), "backup is not placed on node 0");
    let h = nodes[1].cli_json(&["config", "history"]);
    assert!(h["history"].as_array().unwrap().iter().any(|e| e["why"] == "faster disks"), "{h}");
}

/// `n` consecutive free ports on 127.0.0.1 (for `shoal demo --base-port`).
fn free_ports(n: u16) -> u16 {
    for _ in 0..50 {
        let base = free_port();
        if base.checked_add(n).is_none() {
            continue;
        }
        if (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// The README's first command: `shoal demo` starts three real nodes, and once it prints its
/// banner a put through the CLI works at once (a leader and every volume are known), a get from
/// another node brings it back, and Ctrl-C stops the demo and removes its data.
#[test]
fn the_demo_is_ready_for_a_put_when_it_says_so() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    // Ports taken meanwhile (by a test running beside this one) stop the demo before its
    // banner: then it is started again on others.
    let mut started = None;
    for _ in 0..3 {
        let base = free_ports(3);
        let mut demo = Command::new(BIN)
            .args(["demo", "--nodes", "3", "--base-port", &base.to_string()])
            .env("TMPDIR", tmp.path())
            .env("SHOAL_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start shoal demo");
        let mut stdout = std::io::BufReader::new(demo.stdout.take().unwrap());
        let (mut api, mut token_file, mut ready) = (None, None, false);
        for line in (&mut stdout).lines() {
            let line = line.unwrap();
            if let Some(v) = line.trim().strip_prefix("export SHOAL_API=") {
                api = Some(v.to_string());
            }
            if let Some(v) = line.trim().strip_prefix("export SHOAL_TOKEN=$(cat ") {
                token_file = Some(v.trim_end_matches(')').to_string());
            }
            if line.contains("Ctrl-C stops the demo") {
                ready = true;
                break;
            }
        }
        if ready {
            started = Some((demo, stdout, base, api, token_file)); // the pipe stays open
            break;
        }
        let _ = demo.kill();
        let _ = demo.wait();
    }
    let (mut demo, _stdout, base, api, token_file) = started.expect("the demo started on one of 3 port ranges");
    let (api, token_file) = (api.expect("the banner names an API URL"), token_file.expect("and a token file"));
    let token_of = |node: usize| {
        let file = token_file.replace("node-0", &format!("node-{node}"));
        std::fs::read_to_string(file).unwrap().trim().to_string()
    };
    let cli = |api: &str, token: String, args: &[&str]| {
        let out = Command::new(BIN)
            .arg("--json")
            .args(args)
            .env("SHOAL_API", api)
            .env("SHOAL_TOKEN", token)
            .output()
            .expect("run shoal");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let local = tmp.path().join("hello.txt");
    std::fs::write(&local, b"hello from the demo").unwrap();
    let (ok, out, err) = cli(&api, token_of(0), &["put", local.to_str().unwrap(), "cluster:/hello.txt"]);
    assert!(ok, "a put right after the banner failed: {err}{out}");
    let back = tmp.path().join("back.txt");
    let other = format!("http://127.0.0.1:{}", base + 1);
    let (ok, _, err) = cli(&other, token_of(1), &["get", "cluster:/hello.txt", back.to_str().unwrap()]);
    assert!(ok, "get through another demo node: {err}");
    assert_eq!(std::fs::read(&back).unwrap(), b"hello from the demo");

    let _ = Command::new("kill").args(["-INT", &demo.id().to_string()]).status();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = demo.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = demo.kill();
            panic!("the demo did not stop on Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the demo exits cleanly on Ctrl-C: {status}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("shoal-demo-"))
        .collect();
    assert!(left.is_empty(), "the demo removed its data");
}

/// Scheduling and events through the real CLI against two real processes (issue 13): weights
/// change with a reason and are refused out of range; `sched explain` ranks both nodes; an
/// `app.*` event published on one node reaches an `events --follow --json` on the other as one
/// JSON line, and is in its recent list; a non-app type is refused with a non-zero exit.
#[test]
fn scheduling_and_events_through_the_real_cli() {
    use std::io::BufRead;
    let root = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> =
        (0..2).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    nodes[0].cli_json(&["cluster", "create", "--name", "ev"]);
    let token = nodes[0].cli_json(&["token", "new"])["token"].as_str().unwrap().to_string();
    nodes[1].cli_json(&["join", &token]);
    wait_for(Duration::from_secs(20), || nodes.iter().all(|n| n.cli_json(&["meta", "status"])["leader"].is_string()));

    let w = nodes[0].cli_json(&["sched", "weights", "--set", "cpu=0.3", "--why", "cpu matters less here"]);
    assert_eq!(w["weights"]["cpu"], 0.3, "{w}");
    let (ok, _, err) = nodes[0].cli(&["sched", "weights", "--set", "cpu=2", "--why", "x"]);
    assert!(!ok && err.contains("between 0 and 1"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["sched", "weights", "--set", "cpu=0.5"]);
    assert!(!ok && err.contains("--why"), "{err}");
    let (ok, out, _) = nodes[0].cli(&["sched", "status"]);
    assert!(ok && out.contains("locality") && out.contains("SCORE"), "{out}");
    let e = nodes[0].cli_json(&["sched", "explain", "--place", "1MiB"]);
    assert_eq!(e["ranked"].as_array().map(|r| r.len()), Some(2), "{e}");

    let mut follow = Command::new(BIN)
        .arg("--data")
        .arg(&nodes[1].dir)
        .args(["--api", &nodes[1].url(), "--json", "events", "--follow", "--type", "app.*"])
        .env_remove("SHOAL_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("events --follow");
    let stdout = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    nodes[0].cli_json(&["events", "publish", "--type", "app.hello", "--payload", r#"{"from":"n0"}"#]);
    let line = rx.recv_timeout(Duration::from_secs(10)).expect("the event reaches the other node's feed");
    let ev: Value = serde_json::from_str(&line).unwrap();
    assert_eq!((ev["type"].as_str(), &ev["data"]["from"]), (Some("app.hello"), &Value::from("n0")), "{line}");
    let _ = follow.kill();
    let _ = follow.wait();
    let (ok, out, _) = nodes[1].cli(&["--json", "events", "--type", "app.*"]);
    assert!(ok && out.lines().count() == 1 && out.contains("app.hello"), "{out}");
    let (ok, _, err) = nodes[0].cli(&["events", "publish", "--type", "file.created"]);
    assert!(!ok && err.contains("app."), "{err}");
}

/// Issue 14 through the real CLI on three real processes: the examples in `examples/jobs/`
/// (hello pinned to every member, a word count map/reduce, a dataset's checksums), a
/// `while(true){}` job cancelled within 2 s, a job over its memory limit failing clearly while
/// the node keeps running, and the `--json` shapes.
#[test]
fn jobs_and_map_reduce_through_the_real_cli() {
    let root = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs");
    let ex = |name: &str| examples.join(name).to_str().unwrap().to_string();
    let mut nodes: Vec<Node> =
        (0..3).map(|i| Node { dir: root.path().join(format!("n{i}")), port: free_port(), child: None }).collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    nodes[0].cli_json(&["cluster", "create", "--name", "jobs"]);
    for i in 1..3 {
        let token = nodes[0].cli_json(&["token", "new"])["token"].as_str().unwrap().to_string();
        nodes[i].cli_json(&["join", &token]);
    }
    for (i, n) in nodes.iter().enumerate() {
        let vol = root.path().join(format!("vol{i}"));
        n.cli_json(&["volume", "add", vol.to_str().unwrap(), "--create"]);
    }
    wait_for(Duration::from_secs(20), || {
        nodes.iter().all(|n| {
            n.cli_json(&["volume", "list"])["volumes"].as_array().is_some_and(|a| a.len() == 3)
                && n.cli_json(&["meta", "status"])["leader"].is_string()
        })
    });
    let ids: Vec<String> =
        nodes.iter().map(|n| n.cli_json(&["cluster", "status"])["node"].as_str().unwrap().to_string()).collect();

    // Hello on every node: one job pinned to each member.
    for (i, id) in ids.iter().enumerate() {
        let (ok, out, err) = nodes[i % 3].cli(&["job", "submit", &ex("hello.js"), "--node", id, "--follow"]);
        assert!(ok, "hello on {id}: {err}");
        assert!(out.contains(&format!("\"node\": \"{id}\"")), "ran where pinned: {out}");
    }

    // A word count over a folder of files spread over the nodes, against counting it here.
    let mut want: std::collections::BTreeMap<String, u64> = Default::default();
    let words = ["alpha", "beta", "gamma", "delta", "shoal", "cluster", "node"];
    for f in 0..12 {
        let text: String = (0..200).map(|k| words[(k * 7 + f * 3) % words.len()]).collect::<Vec<_>>().join(" ");
        let text = format!("{text}. It's file-{f}\n");
        for w in text.split(|c: char| !c.is_ascii_alphabetic()).filter(|w| !w.is_empty()) {
            *want.entry(w.to_string()).or_default() += 1;
        }
        let local = root.path().join(format!("book{f}.txt"));
        std::fs::write(&local, &text).unwrap();
        nodes[f % 3].cli_json(&["put", local.to_str().unwrap(), &format!("cluster:/books/b{f:02}.txt")]);
    }
    let (ok, out, err) = nodes[1].cli(&[
        "--json",
        "job",
        "submit",
        &ex("wordcount.js"),
        "--dataset",
        "cluster:/books/*",
        "--partition-max",
        "3",
        "--follow",
    ]);
    assert!(ok, "word count: {err}");
    let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let got: std::collections::BTreeMap<String, u64> = serde_json::from_value(v["output"].clone()).unwrap();
    assert_eq!(got, want, "the map/reduce word count equals counting it directly");
    let children: Vec<String> = serde_json::from_value(v["children"].clone()).unwrap();
    assert!(children.len() >= 5, "12 files in partitions of at most 3, then the reduce: {children:?}");

    // Pairs too large for a record are spilled to cluster:/.shoal/jobs/<parent>/maps/ and the
    // reduce reads them from there; the spill files go when the parent ends.
    let big = root.path().join("big.js");
    std::fs::write(
        &big,
        "function mapper(files, emit) { files.forEach(function (f) { for (var i = 0; i < 4000; i++) { emit('key-' + (i % 1000) + '-' + f, 1); } }); }\n\
         function reducer(k, v) { return v.length; }",
    )
    .unwrap();
    let (ok, out, err) = nodes[0].cli(&[
        "--json",
        "job",
        "submit",
        big.to_str().unwrap(),
        "--dataset",
        "cluster:/books/b0*",
        "--partition-max",
        "5",
        "--follow",
    ]);
    assert!(ok, "spilling map/reduce: {err}");
    let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let map = v["output"].as_object().unwrap_or_else(|| panic!("an inline or spilled output: {v}"));
    let output: serde_json::Map<String, Value> = match map.get("spilled").and_then(Value::as_str) {
        Some(p) => {
            let local = root.path().join("out.json");
            nodes[0].cli_json(&["get", p, local.to_str().unwrap()]);
            serde_json::from_slice(&std::fs::read(&local).unwrap()).unwrap()
        }
        None => map.clone(),
    };
    assert_eq!(output.len(), 1000 * 10, "1,000 keys per file, ten files b00..b09");
    assert!(output.values().all(|n| n == 4), "each key emitted 4 times");
    let parent = v["id"].as_str().unwrap();
    let first_map = v["children"][0].as_str().unwrap();
    let m = nodes[0].cli_json(&["job", "status", first_map]);
    assert!(m["output"]["spilled"].as_str().is_some_and(|p| p.contains("/maps/")), "the map spilled: {m}");
    wait_for(Duration::from_secs(10), || {
        let (_, out, _) = nodes[0].cli(&["--json", "ls", &format!("cluster:/.shoal/jobs/{parent}")]);
        !out.contains("maps")
    });

    // The dataset's checksums, computed where the bytes are, match the records'.
    let (ok, out, err) =
        nodes[2].cli(&["--json", "job", "submit", &ex("checksum.js"), "--dataset", "cluster:/books/**", "--follow"]);
    assert!(ok, "checksums: {err}");
    let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let sum = nodes[0].cli_json(&["stat", "cluster:/books/b05.txt"])["record"]["checksum"].clone();
    assert_eq!(v["output"]["cluster:/books/b05.txt"], sum, "{v}");

    // An endless loop is stopped within 2 s of the cancel.
    let id = nodes[0].cli_json(&["job", "submit", &ex("spin.js")])["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(10), || nodes[0].cli_json(&["job", "status", &id])["status"] == "running");
    let t0 = Instant::now();
    nodes[1].cli_json(&["job", "cancel", &id]);
    wait_for(Duration::from_secs(2), || nodes[2].cli_json(&["job", "status", &id])["status"] == "cancelled");
    assert!(t0.elapsed() < Duration::from_secs(2));

    // Over its memory limit: a clear error, and the node that ran it keeps running.
    let hog = root.path().join("hog.js");
    std::fs::write(&hog, "function run() { var a = []; for (;;) { a.push(new Array(100000).fill(1)); } }").unwrap();
    let (ok, _, err) = nodes[0].cli(&["job", "submit", hog.to_str().unwrap(), "--follow"]);
    assert!(!ok && err.contains("out of memory"), "{err}");
    for n in &nodes {
        assert_eq!(n.cli_json(&["cluster", "status"])["inCluster"], true);
    }

    // exec: refused until the trusted key jobs.exec_allowed names the program (which takes an
    // approved proposal) and the node's capabilities list it; then it runs.
    let ex_js = root.path().join("exec.js");
    std::fs::write(&ex_js, "function run(job) { return exec('git', ['--version']); }").unwrap();
    let (ok, _, err) = nodes[0].cli(&["job", "submit", ex_js.to_str().unwrap(), "--follow"]);
    assert!(!ok && err.contains("not allowed"), "{err}");
    let (ok, _, err) =
        nodes[0].cli(&["config", "set", "--key", "jobs.exec_allowed", "--value", r#"["git"]"#, "--why", "x"]);
    assert!(!ok, "a trusted key is not set directly: {err}");
    let p = nodes[0].cli_json(&[
        "config",
        "propose",
        "--key",
        "jobs.exec_allowed",
        "--value",
        r#"["git"]"#,
        "--why",
        "version checks",
    ]);
    let pid =
        p["proposal"]["id"].as_str().or(p["id"].as_str()).unwrap_or_else(|| panic!("a proposal id: {p}")).to_string();
    nodes[1].cli_json(&["config", "approve", &pid]);
    let caps = nodes[0].cli_json(&["nodes"]);
    let has_git = caps["nodes"].as_array().unwrap().iter().all(|n| n["capabilities"]["features"]["git"] == true);
    assert!(has_git, "this test needs git on PATH (the capability probe lists it): {caps}");
    wait_for(Duration::from_secs(10), || {
        let (ok, out, _) = nodes[0].cli(&["--json", "job", "submit", ex_js.to_str().unwrap(), "--follow"]);
        ok && out.contains("git version")
    });

    // The --json shapes, explain, and a bad submit.
    let st = nodes[0].cli_json(&["job", "status", &id]);
    for k in ["status", "node", "attempts", "progress", "output", "error"] {
        assert!(st.get(k).is_some(), "{k} in {st}");
    }
    let e = nodes[0].cli_json(&["job", "explain", &id]);
    assert_eq!((e["kind"].as_str(), e["ranked"].as_array().map(|r| r.len())), (Some("job"), Some(3)), "{e}");
    let (ok, _, err) = nodes[0].cli(&["job", "submit", &ex("hello.js"), "--timeout", "0s"]);
    assert!(!ok && err.contains("--timeout"), "{err}");
    let (ok, _, err) = nodes[0].cli(&["job", "status", "no-such-job"]);
    assert!(!ok && err.contains("no job"), "{err}");
}

/// Issue 17 ("fixes found by a read"): a name and URL set with `cluster config` survive a
/// restart without flags (the start flags win only when given), and a node listening on every
/// address with no URL to advertise refuses to start with a message saying what to give.
#[test]
fn a_configured_name_and_url_survive_a_restart_and_0_0_0_0_is_never_advertised() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("n");
    let port = free_port();
    let start = |extra: &[&str]| {
        let child = Command::new(BIN)
            .args(["serve", "--data"])
            .arg(&dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("SHOAL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start shoal serve");
        wait_for(Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        child
    };
    let url = format!("http://127.0.0.1:{port}");
    let cli = |args: &[&str]| {
        let (ok, out, err) = cli_in(&dir, &url, &[&["--json"], args].concat());
        assert!(ok, "shoal {args:?}: {err}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let mut child = start(&["--name", "first"]);
    cli(&["cluster", "create", "--name", "c"]);
    let also = format!("http://localhost:{port}");
    cli(&["cluster", "config", "--name", "renamed", "--advertise", &also]);
    let _ = child.kill();
    let _ = child.wait();
    let mut child = start(&[]);
    let st = cli(&["cluster", "status"]);
    assert_eq!((st["nodeName"].as_str(), st["advertiseUrl"].as_str()), (Some("renamed"), Some(also.as_str())), "{st}");
    let _ = child.kill();
    let _ = child.wait();
    // A flag given wins over the stored value.
    let mut child = start(&["--name", "flagged"]);
    assert_eq!(cli(&["cluster", "status"])["nodeName"], "flagged");
    let _ = child.kill();
    let _ = child.wait();

    let fresh = root.path().join("fresh");
    let mut serve = Command::new(BIN);
    serve.args(["serve", "--data"]).arg(&fresh).args(["--listen", &format!("0.0.0.0:{}", free_port())]);
    let (status, err) =
        refused_start(serve.env("SHOAL_LOG", "warn"), "a node listening on 0.0.0.0 with no --advertise");
    assert!(!status.success() && err.contains("--advertise"), "{err}");
}

/// Run `serve` (a `shoal serve` that must not start) to its end: its exit status and what it
/// printed on stderr. Fails the test, killing the node, when it is still running after 10 s:
/// `what` started anyway.
fn refused_start(serve: &mut Command, what: &str) -> (std::process::ExitStatus, String) {
    let mut child = serve.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("run shoal serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} started anyway");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// The test harness itself: a port taken between `free_port` and the node's start (by another
/// test's node, say) is noticed, and the node moves to another port instead of the test talking
/// to whatever holds the first one.
#[test]
fn a_node_whose_port_was_taken_meanwhile_starts_on_another() {
    let root = tempfile::tempdir().unwrap();
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let mut node = Node { dir: root.path().join("n0"), port: taken, child: None };
    node.start();
    assert_ne!(node.port, taken);
    assert!(node.cli_json(&["cluster", "status"])["node"].is_string());
}

/// `serve --threads` (and `SHOAL_THREADS`) takes 1 to 1,024: anything else stops the start
/// with a message naming the flag and a non-zero exit, before any file is made.
#[test]
fn serve_refuses_a_thread_count_out_of_range() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("n");
    for (flag, env) in [(Some("0"), None), (Some("1025"), None), (Some("two"), None), (None, Some("-1"))] {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--data"]).arg(&dir).args(["--listen", "127.0.0.1:0"]);
        if let Some(f) = flag {
            cmd.args(["--threads", f]);
        }
        if let Some(e) = env {
            cmd.env("SHOAL_THREADS", e);
        }
        let (status, err) = refused_start(&mut cmd, &format!("a node with threads {flag:?} / {env:?}"));
        assert!(!status.success(), "{flag:?} {env:?} was taken");
        assert!(err.contains("--threads"), "{flag:?} {env:?}: {err}");
        assert!(!dir.exists(), "nothing is made for a refused start");
    }
}
