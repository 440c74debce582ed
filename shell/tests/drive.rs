//! The cluster drive between three real nodes in process over loopback (issue 4 "The
//! namespace", "Replication"): put, get with Range and checksum fallback, overwrite, move,
//! remove, mkdir, replication to the folder policy, repair of a corrupted copy found by a get,
//! the scrubber and `verify`, and rescans adopting dropped-in files.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The tests of this file run one at a time: each starts 3 or 4 nodes, and on a loaded 2-core
/// machine three clusters at once starve each other's timers.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Reply {
    status: u16,
    body: Vec<u8>,
    headers: hyper::HeaderMap,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn call(d: &Daemon<TokioEnv>, method: &str, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Reply {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let mut h = vec![("authorization", auth.as_str())];
    h.extend_from_slice(headers);
    match client.request(&d.url(), method, path, &h, body, 20_000).await {
        Ok(r) => Reply { status: r.status, body: r.body.to_vec(), headers: r.headers },
        // A body cut off in the middle (a copy that failed its checksum) reads as an error.
        Err(e) => Reply { status: 0, body: e.to_string().into_bytes(), headers: Default::default() },
    }
}

/// PUT `content` to `path` over a raw connection and close it as soon as the body is sent,
/// before any answer.
async fn put_and_hang_up(d: &Daemon<TokioEnv>, path: &str, content: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let addr = d.url().trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n",
        d.shared().admin_token,
        content.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(content).await.unwrap();
    stream.shutdown().await.unwrap();
    drop(stream);
}

/// PUT `content` to `path` with chunked transfer-encoding (no content-length); the status.
async fn put_chunked(d: &Daemon<TokioEnv>, path: &str, content: &[u8]) -> u16 {
    let addr = d.url().trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let (tx, body) = shoal_shell::net::client::ChannelBody::new(4);
    let req = hyper::Request::put(path)
        .header("host", addr)
        .header("authorization", format!("Bearer {}", d.shared().admin_token))
        .body(body)
        .unwrap();
    let pieces: Vec<bytes::Bytes> = content.chunks(100_000).map(bytes::Bytes::copy_from_slice).collect();
    tokio::spawn(async move {
        for p in pieces {
            tx.send(Ok(p)).await.unwrap();
        }
    });
    let resp = sender.send_request(req).await.unwrap();
    resp.status().as_u16()
}

async fn api(d: &Daemon<TokioEnv>, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(&body).unwrap() };
    let r = call(d, method, path, body, &[]).await;
    (r.status, r.json())
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    // Generous: CI runs this beside the simulator on two cores.
    let started = std::time::Instant::now();
    for _ in 0..900 {
        if f().await {
            if started.elapsed() > Duration::from_secs(5) {
                eprintln!("slow: {:.1} s until {what}", started.elapsed().as_secs_f64());
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

struct Cluster {
    _root: tempfile::TempDir,
    nodes: Vec<Daemon<TokioEnv>>,
    /// Volume folder of node i (node 0 has none: it only coordinates).
    folders: Vec<Option<PathBuf>>,
}

/// Three nodes; nodes 1 and 2 (and 3 when `nodes` is 4) contribute a volume each.
async fn cluster(nodes: usize) -> Cluster {
    let root = tempfile::tempdir().unwrap();
    let mut ds = Vec::new();
    for i in 0..nodes {
        let d = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join(format!("n{i}")), "127.0.0.1:0"))
            .await
            .unwrap();
        ds.push(d);
    }
    assert_eq!(api(&ds[0], "POST", "/v1/cluster/create", json!({"name": "t"})).await.0, 200);
    for d in &ds[1..] {
        let token = api(&ds[0], "POST", "/v1/tokens", Value::Null).await.1["token"].as_str().unwrap().to_string();
        let (s, v) = api(d, "POST", "/v1/cluster/join", json!({ "token": token })).await;
        assert_eq!(s, 200, "{v}");
    }
    let mut folders = vec![None];
    for (i, d) in ds.iter().enumerate().skip(1) {
        let folder = root.path().join(format!("vol{i}"));
        let (s, v) = api(d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
        assert_eq!(s, 200, "{v}");
        folders.push(Some(std::fs::canonicalize(&folder).unwrap()));
    }
    let c = Cluster { _root: root, nodes: ds, folders };
    // Every node knows the leader and every volume.
    for d in &c.nodes {
        eventually("every node knows the leader and the volumes", || async {
            let (_, v) = api(d, "GET", "/v1/volumes", Value::Null).await;
            let vols = v["volumes"].as_array().map_or(0, |a| a.len());
            d.shared().read_node(|n, now| n.meta_leader(now)).is_some() && vols == nodes - 1
        })
        .await;
    }
    c
}

async fn stat(d: &Daemon<TokioEnv>, path: &str) -> Value {
    api(d, "GET", &format!("/v1/meta/stat?path={path}"), Value::Null).await.1
}

fn current_copies(st: &Value) -> usize {
    let sum = st["record"]["checksum"].as_str().unwrap_or_default().to_string();
    st["copies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| matches!(c["state"].as_str(), Some("committed" | "verified")) && c["checksum"] == json!(sum))
        .count()
}

fn on_disk(c: &Cluster, path: &str) -> Vec<Option<Vec<u8>>> {
    c.folders
        .iter()
        .map(|f| f.as_ref().and_then(|f| std::fs::read(f.join(path.trim_start_matches('/'))).ok()))
        .collect()
}

fn disk_path(folder: &Path, path: &str) -> PathBuf {
    folder.join(path.trim_start_matches('/'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_range_overwrite_move_remove_across_nodes() {
    let _serial = SERIAL.lock().await;
    let c = cluster(3).await;
    let a = &c.nodes[0];
    assert_eq!(api(a, "POST", "/v1/policies", json!({"folder": "/docs", "replicas": 2})).await.0, 200);
    eventually("the policy reached every node", || async {
        c.nodes.iter().all(|d| d.shared().read_node(|n, _| !n.policy_list().policies.is_empty()))
    })
    .await;

    // A put through a node with no volume lands as two copies on two other nodes.
    let content: Vec<u8> = (0..5 * 1024 * 1024 + 17).map(|i| (i * 7 % 253) as u8).collect();
    let r = call(a, "PUT", "/v1/files/docs/report.bin", content.clone(), &[("x-shoal-sha256", &sha(&content))]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!((r.json()["copies"].as_u64(), r.json()["wanted"].as_u64()), (Some(2), Some(2)));
    let st = stat(a, "/docs/report.bin").await;
    assert_eq!(current_copies(&st), 2, "{st}");
    let id = st["record"]["id"].clone();
    assert_eq!(on_disk(&c, "/docs/report.bin"), vec![None, Some(content.clone()), Some(content.clone())]);
    let copy = st["copies"][0]["copy"].as_str().unwrap();
    assert!(copy.contains(":") && copy.ends_with("/docs/report.bin"), "copies read <node>:<volume>/<path>: {copy}");

    // Read back whole, and one range, from any node.
    for d in &c.nodes {
        let r = call(d, "GET", "/v1/files/docs/report.bin", vec![], &[]).await;
        assert_eq!(r.status, 200);
        assert!(r.body == content, "whole file from every node");
        assert_eq!(r.headers.get("x-shoal-sha256").unwrap().to_str().unwrap(), sha(&content));
    }
    let r = call(a, "GET", "/v1/files/docs/report.bin", vec![], &[("range", "bytes=4194300-4194310")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, content[4194300..=4194310]);
    let r = call(a, "GET", "/v1/files/docs/report.bin", vec![], &[("range", "bytes=99999999-")]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (416, Some("bad_range")));

    // Overwrite keeps the id; every copy holds the new content.
    let newer = b"second version".to_vec();
    let r = call(c.nodes.last().unwrap(), "PUT", "/v1/files/docs/report.bin", newer.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    eventually("the overwrite is on both copies", || async {
        let st = stat(a, "/docs/report.bin").await;
        st["record"]["checksum"] == json!(sha(&newer)) && current_copies(&st) == 2
    })
    .await;
    assert_eq!(stat(a, "/docs/report.bin").await["record"]["id"], id, "an overwrite keeps the file id");
    eventually("the older copy is repaired in place", || async {
        on_disk(&c, "/docs/report.bin") == vec![None, Some(newer.clone()), Some(newer.clone())]
    })
    .await;
    assert_eq!(call(a, "GET", "/v1/files/docs/report.bin", vec![], &[]).await.body, newer);

    // An empty file goes up and comes back.
    let r = call(a, "PUT", "/v1/files/docs/empty", vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = call(a, "GET", "/v1/files/docs/empty", vec![], &[]).await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.headers.get("x-shoal-sha256").unwrap().to_str().unwrap(), sha(b""));

    // Bad input: a wrong checksum, a folder, a missing file, a reserved name.
    let r = call(a, "PUT", "/v1/files/docs/x", b"abc".to_vec(), &[("x-shoal-sha256", &sha(b"other"))]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("checksum_mismatch")));
    // A large body streams to its first copy as it arrives; a wrong checksum still lands nothing.
    let big: Vec<u8> = vec![7u8; 6 * 1024 * 1024];
    let r = call(a, "PUT", "/v1/files/docs/streamed.bin", big.clone(), &[("x-shoal-sha256", &sha(b"other"))]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("checksum_mismatch")));
    assert!(on_disk(&c, "/docs/streamed.bin").iter().all(|x| x.is_none()), "nothing lands");
    for f in c.folders.iter().flatten() {
        let leftovers = std::fs::read_dir(f.join("docs")).map_or(0, |d| {
            // (The overwrite above may still keep its replaced bytes aside until a reconcile.)
            let part = |n: &str| n.contains(".part-") && !n.contains(".part-kept-");
            d.filter_map(|e| e.ok()).filter(|e| part(&e.file_name().to_string_lossy())).count()
        });
        assert_eq!(leftovers, 0, "an aborted stream leaves no part file");
    }
    assert_eq!(call(a, "GET", "/v1/meta/stat?path=/docs/streamed.bin", vec![], &[]).await.status, 404);
    let r = call(a, "PUT", "/v1/files/docs/streamed.bin", big.clone(), &[("x-shoal-sha256", &sha(&big))]).await;
    assert_eq!((r.status, r.json()["copies"].as_u64()), (200, Some(2)), "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(call(c.nodes.last().unwrap(), "GET", "/v1/files/docs/streamed.bin", vec![], &[]).await.body, big);
    // A body without a length (chunked encoding) is spooled first, then copied.
    let chunked: Vec<u8> = (0..5 * 1024 * 1024 + 9).map(|i: usize| (i % 239) as u8).collect();
    let status = put_chunked(a, "/v1/files/docs/chunked.bin", &chunked).await;
    assert_eq!(status, 200);
    assert_eq!(on_disk(&c, "/docs/chunked.bin"), vec![None, Some(chunked.clone()), Some(chunked.clone())]);
    // A client that hangs up once its body is sent still gets its file: the put runs to its end.
    let gone: Vec<u8> = (0..6 * 1024 * 1024 + 1).map(|i: usize| (i % 233) as u8).collect();
    put_and_hang_up(a, "/v1/files/docs/gone.bin", &gone).await;
    eventually("the put whose client hung up is published", || async {
        let st = stat(a, "/docs/gone.bin").await;
        st["record"]["checksum"] == json!(sha(&gone)) && current_copies(&st) == 2
    })
    .await;
    assert_eq!(on_disk(&c, "/docs/gone.bin"), vec![None, Some(gone.clone()), Some(gone.clone())]);

    // Through a node with a volume, the body streams to its own volume and a peer at once.
    let big2: Vec<u8> = (0..9 * 1024 * 1024 + 3).map(|i: usize| (i % 241) as u8).collect();
    let r = call(c.nodes.last().unwrap(), "PUT", "/v1/files/docs/both.bin", big2.clone(), &[]).await;
    assert_eq!((r.status, r.json()["copies"].as_u64()), (200, Some(2)), "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(on_disk(&c, "/docs/both.bin"), vec![None, Some(big2.clone()), Some(big2.clone())]);
    let r = call(a, "PUT", "/v1/files/docs", b"abc".to_vec(), &[]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (409, Some("is_a_folder")));
    let r = call(a, "PUT", "/v1/files/docs/report.bin/inner", b"abc".to_vec(), &[]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (409, Some("not_a_folder")));
    let r = call(a, "GET", "/v1/files/docs/none", vec![], &[]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (404, Some("not_found")));
    let r = call(a, "PUT", "/v1/files/docs/a.part-x", b"abc".to_vec(), &[]).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("bad_path")));
    assert!(call(a, "GET", "/v1/meta/stat?path=/docs/x", vec![], &[]).await.status == 404, "nothing half-written");

    // Move: the copies are renamed where they lie.
    let (s, v) = api(a, "POST", "/v1/mv", json!({"from": "/docs", "to": "/archive/docs"})).await;
    assert_eq!(s, 200, "{v}");
    eventually("the copies moved on disk", || async {
        on_disk(&c, "/archive/docs/report.bin") == vec![None, Some(newer.clone()), Some(newer.clone())]
            && on_disk(&c, "/docs/report.bin").iter().all(|x| x.is_none())
    })
    .await;
    assert_eq!(stat(a, "/archive/docs/report.bin").await["record"]["id"], id, "a move keeps the file id");
    assert_eq!(call(a, "GET", "/v1/files/archive/docs/report.bin", vec![], &[]).await.body, newer);

    // mkdir, and rm of a folder needs -r.
    assert_eq!(api(a, "POST", "/v1/mkdir", json!({"path": "/empty"})).await.0, 200);
    let (s, v) = api(a, "DELETE", "/v1/files/archive", Value::Null).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("folder_not_empty")));
    let (s, v) = api(a, "DELETE", "/v1/files/archive?recursive=true", Value::Null).await;
    assert_eq!(s, 200, "{v}");
    eventually("the copies are deleted on disk", || async {
        on_disk(&c, "/archive/docs/report.bin").iter().all(|x| x.is_none())
    })
    .await;
    assert_eq!(call(a, "GET", "/v1/files/archive/docs/report.bin", vec![], &[]).await.status, 404);
    for d in c.nodes {
        d.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_copy_is_skipped_marked_stale_and_repaired_and_replicas_follow_the_policy() {
    let _serial = SERIAL.lock().await;
    let c = cluster(4).await;
    let a = &c.nodes[0];
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    let r = call(a, "PUT", "/v1/files/photos/cat.jpg", content.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["copies"], json!(1), "the default policy is one copy");

    // Raise the policy: the leader's planner adds copies on other nodes.
    assert_eq!(api(a, "POST", "/v1/policies", json!({"folder": "/photos", "replicas": 3})).await.0, 200);
    api(a, "POST", "/v1/repl/run", Value::Null).await;
    eventually("three current copies", || async { current_copies(&stat(a, "/photos/cat.jpg").await) == 3 }).await;
    assert_eq!(on_disk(&c, "/photos/cat.jpg").iter().filter(|x| x.as_deref() == Some(&content[..])).count(), 3);

    // Flip a byte in the copy a get serves: that get is cut short, the copy goes stale, the next
    // get is served from another copy, and the planner repairs the bad one in place.
    let r = call(a, "GET", "/v1/files/photos/cat.jpg", vec![], &[]).await;
    assert_eq!(r.status, 200);
    let served = r.headers.get("x-shoal-copy").unwrap().to_str().unwrap().to_string();
    let i = (1..4)
        .find(|i| served.starts_with(&c.nodes[*i].shared().read_node(|n, _| n.id().to_string())))
        .expect("the copy names its node");
    let file = disk_path(c.folders[i].as_ref().unwrap(), "/photos/cat.jpg");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[1234] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let r = call(a, "GET", "/v1/files/photos/cat.jpg", vec![], &[]).await;
    assert!(r.status != 200 || r.body != content, "a corrupt copy is never passed off as the file");
    eventually("the corrupt copy is marked stale", || async {
        let st = stat(a, "/photos/cat.jpg").await;
        st["copies"].as_array().unwrap().iter().any(|c| c["state"] == json!("stale"))
    })
    .await;
    let r = call(a, "GET", "/v1/files/photos/cat.jpg", vec![], &[]).await;
    assert_eq!((r.status, r.body == content), (200, true), "the next get uses a good copy");
    api(a, "POST", "/v1/repl/run", Value::Null).await;
    eventually("the corrupt copy is repaired in place", || async { std::fs::read(&file).unwrap() == content }).await;
    eventually("three current copies again", || async { current_copies(&stat(a, "/photos/cat.jpg").await) == 3 }).await;

    // The scrubber finds a flipped byte without any read.
    for (k, v) in [("storage.scrub_min_age", "0ms"), ("storage.scrub_rate", "1GB")] {
        let body = json!({"action": "set", "key": k, "value": v, "why": "scrub now in a test"});
        let (s, v) = api(a, "POST", "/v1/config", body).await;
        assert_eq!(s, 200, "{v}");
    }
    eventually("the config reached node 2", || async {
        c.nodes[2].shared().read_node(|n, _| n.config_number("storage", "scrub_min_age")) == Some(0.0)
    })
    .await;
    let file2 = disk_path(c.folders[2].as_ref().unwrap(), "/photos/cat.jpg");
    if std::fs::metadata(&file2).is_ok() {
        let mut bytes = std::fs::read(&file2).unwrap();
        bytes[10] ^= 0x01;
        std::fs::write(&file2, &bytes).unwrap();
        api(&c.nodes[2], "POST", "/v1/scrub", Value::Null).await;
        eventually("the scrub found and the planner repaired the copy", || async {
            api(a, "POST", "/v1/repl/run", Value::Null).await;
            std::fs::read(&file2).unwrap() == content
        })
        .await;
    }

    // verify re-hashes every copy on demand.
    let (s, v) = api(a, "POST", "/v1/verify", json!({"path": "/photos"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((v["files"].as_u64(), v["stale"].as_array().map(|x| x.len())), (Some(1), Some(0)), "{v}");

    // Lower the policy: the extra copy is dropped, never below the policy.
    assert_eq!(api(a, "POST", "/v1/policies", json!({"folder": "/photos", "replicas": 1})).await.0, 200);
    eventually("one copy left", || async {
        api(a, "POST", "/v1/repl/run", Value::Null).await;
        on_disk(&c, "/photos/cat.jpg").iter().filter(|x| x.is_some()).count() == 1
    })
    .await;
    assert_eq!(call(a, "GET", "/v1/files/photos/cat.jpg", vec![], &[]).await.body, content);
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// Evacuation end to end: the copies on an evacuating volume are made again elsewhere, then
/// dropped from it, and the volume, now empty, is retired; the file reads back right throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evacuated_volume_is_emptied_and_then_retired() {
    let _serial = SERIAL.lock().await;
    let c = cluster(3).await;
    let a = &c.nodes[0];
    let content: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let r = call(a, "PUT", "/v1/files/keep/me.bin", content.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let st = stat(a, "/keep/me.bin").await;
    let copy = st["copies"][0]["copy"].as_str().unwrap().to_string();
    let (node_id, rest) = copy.split_once(':').unwrap();
    let volume = rest.split('/').next().unwrap().to_string();
    let i = (1..3).find(|i| c.nodes[*i].shared().read_node(|n, _| n.id().to_string()) == node_id).unwrap();
    let (s, v) = api(a, "POST", &format!("/v1/volumes/{volume}/evacuate"), json!({})).await;
    assert_eq!((s, v["copiesLeft"].as_u64()), (200, Some(1)), "{v}");
    eventually("the copy is moved off, and the emptied volume retired", || async {
        api(a, "POST", "/v1/repl/run", Value::Null).await;
        let (_, list) = api(a, "GET", "/v1/volumes", Value::Null).await;
        let gone = list["volumes"].as_array().unwrap().iter().all(|v| v["id"] != json!(volume));
        gone && current_copies(&stat(a, "/keep/me.bin").await) == 1
    })
    .await;
    let other = 3 - i;
    assert!(on_disk(&c, "/keep/me.bin")[other].as_deref() == Some(&content[..]), "the copy is on the other node");
    assert!(on_disk(&c, "/keep/me.bin")[i].is_none(), "and no longer on the evacuated volume");
    assert_eq!(call(a, "GET", "/v1/files/keep/me.bin", vec![], &[]).await.body, content);
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// A get whose copy fails in the middle of the stream (here: cut short on disk after the
/// answer started) goes on from another copy at the same offset: the client gets the whole,
/// right file in one response instead of a cut body, and the short copy is marked stale (and
/// so repaired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_goes_on_from_another_copy_when_its_copy_fails_midway() {
    let _serial = SERIAL.lock().await;
    let c = cluster(3).await;
    let a = &c.nodes[0];
    assert_eq!(api(a, "POST", "/v1/policies", json!({"folder": "/big", "replicas": 2})).await.0, 200);
    eventually("the policy reached node 0", || async {
        a.shared().read_node(|n, _| !n.policy_list().policies.is_empty())
    })
    .await;
    let content: Vec<u8> = (0..96 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let r = call(a, "PUT", "/v1/files/big/movie.bin", content.clone(), &[]).await;
    assert_eq!((r.status, r.json()["copies"].clone()), (200, json!(2)), "{}", String::from_utf8_lossy(&r.body));

    // Start the get; once its answer has started, cut the copy it reads to 8 MiB.
    let addr = a.url().trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/v1/files/big/movie.bin")
        .header("host", addr)
        .header("authorization", format!("Bearer {}", a.shared().admin_token))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let served = resp.headers().get("x-shoal-copy").unwrap().to_str().unwrap().to_string();
    let i = (1..3)
        .find(|i| served.starts_with(&c.nodes[*i].shared().read_node(|n, _| n.id().to_string())))
        .expect("the copy names its node");
    let file = disk_path(c.folders[i].as_ref().unwrap(), "/big/movie.bin");
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(8 << 20).unwrap();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.expect("the whole body, not a cut one").to_bytes();
    assert_eq!(body.len(), content.len());
    assert!(body[..] == content[..], "the file comes back byte for byte");
    // The short copy was marked stale, so the planner repairs it in place (a copy nothing marks
    // stale would stay short: the scrub gets to it only after a day). Either may be seen first.
    eventually("the short copy is marked stale and repaired in place", || async {
        api(a, "POST", "/v1/repl/run", Value::Null).await;
        std::fs::read(&file).is_ok_and(|b| b == content) && current_copies(&stat(a, "/big/movie.bin").await) == 2
    })
    .await;
    for d in c.nodes {
        d.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescan_adopts_dropped_in_files_marks_vanished_copies_stale_and_restores_right_ones() {
    let _serial = SERIAL.lock().await;
    let before_start = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let c = cluster(3).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let folder = c.folders[1].clone().unwrap();
    std::fs::create_dir_all(folder.join("inbox")).unwrap();
    std::fs::write(folder.join("inbox/note.txt"), b"dropped in by hand").unwrap();
    std::fs::write(folder.join("inbox/x.part-123"), b"not one of shoal's part files").unwrap();
    // Part files of uploads cut short: one left before this node started, one untouched for two
    // hours, and one of an upload going on now.
    let left = folder.join("inbox/a.bin.part-00000000000000aa");
    std::fs::write(&left, b"left by an earlier run").unwrap();
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7_200);
    let idle = folder.join("inbox/b.bin.part-repl00000000000000bb");
    std::fs::File::create(&idle).unwrap().set_modified(two_hours_ago).unwrap();
    std::fs::File::options().write(true).open(&left).unwrap().set_modified(before_start).unwrap();
    let busy = folder.join("inbox/c.bin.part-00000000000000cc");
    std::fs::write(&busy, b"an upload in progress").unwrap();
    let (s, v) = api(b, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["volumes"][0]["adopted"], json!(1), "{v}");
    assert_eq!(v["volumes"][0]["partFilesRemoved"], json!(2), "{v}");
    assert!(!left.exists() && !idle.exists(), "stale part files are swept");
    assert!(busy.exists() && folder.join("inbox/x.part-123").exists(), "a live upload and a user's file stay");
    eventually("the adopted file is readable everywhere", || async {
        call(a, "GET", "/v1/files/inbox/note.txt", vec![], &[]).await.body == b"dropped in by hand"
    })
    .await;
    assert_eq!(
        call(a, "GET", "/v1/files/inbox/x.part-123", vec![], &[]).await.status,
        404,
        "part files are not adopted"
    );

    // A copy that vanished is marked stale.
    std::fs::remove_file(folder.join("inbox/note.txt")).unwrap();
    let (_, v) = api(b, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(v["volumes"][0]["markedStale"], json!(1), "{v}");
    let st = stat(a, "/inbox/note.txt").await;
    eventually("the vanished copy is stale", || async {
        let st = stat(a, "/inbox/note.txt").await;
        st["copies"][0]["state"] == json!("stale")
    })
    .await;
    let _ = st;

    // A current copy changed in place (same size, newer mtime, other bytes) is marked stale too.
    let (s2, v) = api(b, "PUT", "/v1/files/inbox/edit.txt", json!("hello")).await;
    assert_eq!(s2, 200, "{v}");
    let edit = folder.join("inbox/edit.txt");
    let before = std::fs::read(&edit).unwrap();
    let mut after = before.clone();
    after[2] ^= 0x20;
    std::fs::write(&edit, &after).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
    std::fs::File::options().write(true).open(&edit).unwrap().set_modified(later).unwrap();
    let (_, v) = api(b, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(v["volumes"][0]["markedStale"], json!(1), "{v}");

    // The bytes come back (a disk remounted): a stale copy of the file's content that is right
    // again is restored with no transfer; wrong bytes of the same size are not.
    std::fs::write(folder.join("inbox/note.txt"), b"dropped in by HAND").unwrap();
    let (_, v) = api(b, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(v["volumes"][0]["copiesRestored"], json!(0), "{v}");
    std::fs::write(folder.join("inbox/note.txt"), b"dropped in by hand").unwrap();
    let (_, v) = api(b, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(v["volumes"][0]["copiesRestored"], json!(1), "{v}");
    eventually("the restored copy is current again", || async {
        stat(a, "/inbox/note.txt").await["copies"][0]["state"] == json!("verified")
    })
    .await;
    assert_eq!(call(a, "GET", "/v1/files/inbox/note.txt", vec![], &[]).await.body, b"dropped in by hand");
    for d in c.nodes {
        d.shutdown().await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Issue 17 "Disk faults": a damaged `cluster.redb` stops the start with a message naming the
/// file and `--rebuild-meta`; with `--rebuild-meta` the node keeps the damaged file aside,
/// rejoins from its recovery copy of the cluster state, takes the metadata back from its peer,
/// rescans its volume, and serves its copy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_is_refused_at_start_and_rebuilt_from_the_peers_and_a_rescan() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let port = free_port();
    let b_dir = root.path().join("b");
    let b_opts = || ServeOptions::new(&b_dir, format!("127.0.0.1:{port}"));
    let a = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("a"), "127.0.0.1:0")).await.unwrap();
    let b = daemon::start(TokioEnv::default(), b_opts()).await.unwrap();
    assert_eq!(api(&a, "POST", "/v1/cluster/create", json!({"name": "t"})).await.0, 200);
    let token = api(&a, "POST", "/v1/tokens", Value::Null).await.1["token"].as_str().unwrap().to_string();
    assert_eq!(api(&b, "POST", "/v1/cluster/join", json!({ "token": token })).await.0, 200);
    for (d, name) in [(&a, "vol-a"), (&b, "vol-b")] {
        let folder = root.path().join(name);
        let (s, v) = api(d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
        assert_eq!(s, 200, "{v}");
    }
    assert_eq!(api(&a, "POST", "/v1/policies", json!({"folder": "/docs", "replicas": 2})).await.0, 200);
    let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    eventually("the policy and both volumes are known", || async {
        let (_, v) = api(&a, "GET", "/v1/volumes", Value::Null).await;
        v["volumes"].as_array().map_or(0, |a| a.len()) == 2
            && a.shared().read_node(|n, _| !n.policy_list().policies.is_empty())
    })
    .await;
    let r = call(&a, "PUT", "/v1/files/docs/x.bin", content.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    eventually("two copies", || async { current_copies(&stat(&a, "/docs/x.bin").await) == 2 }).await;
    b.shutdown().await;

    let recovery = b_dir.join("cluster.recovery.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&recovery).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // On a healthy database the flag is refused (left in a unit file, it must not throw data away).
    let mut opts = b_opts();
    opts.rebuild_meta = true;
    match daemon::start(TokioEnv::default(), opts).await {
        Ok(_) => panic!("a healthy database must not be rebuilt"),
        Err(e) => assert!(e.to_string().contains("opens and reads fine"), "{e}"),
    }
    // Damage the database's header.
    let db = b_dir.join("cluster.redb");
    let mut bytes = std::fs::read(&db).unwrap();
    for b in bytes.iter_mut().take(4096) {
        *b = 0xAB;
    }
    std::fs::write(&db, &bytes).unwrap();
    let err = match daemon::start(TokioEnv::default(), b_opts()).await {
        Ok(_) => panic!("a damaged database must not start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("cluster.redb") && err.contains("--rebuild-meta"), "{err}");

    let mut opts = b_opts();
    opts.rebuild_meta = true;
    let b = daemon::start(TokioEnv::default(), opts).await.unwrap();
    let kept: Vec<_> = std::fs::read_dir(&b_dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("cluster.redb.damaged-"))
        .collect();
    assert_eq!(kept.len(), 1, "the damaged file is kept aside");
    eventually("the rebuilt node caught up and rescanned", || async {
        let digest = |d: &Daemon<TokioEnv>| d.shared().read_node(|n, now| n.meta_status(now).meta.digest);
        b.shared().read_node(|n, now| n.readiness(now).ready && !n.rebuild_waiting()) && digest(&a) == digest(&b)
    })
    .await;
    let r = call(&b, "GET", "/v1/files/docs/x.bin", Vec::new(), &[]).await;
    assert_eq!((r.status, sha(&r.body)), (200, sha(&content)));
    eventually("both copies still current after the rescan", || async {
        current_copies(&stat(&b, "/docs/x.bin").await) == 2
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Issue 17 (a read of the built features): a node that leaves its cluster wipes the cluster's
/// metadata it held (records, settings, log), also across a restart, so a cluster it creates or
/// joins next starts clean; the files on its volume are the owner's and stay on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_wipes_the_metadata_and_keeps_the_files_on_disk() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let port = free_port();
    let b_dir = root.path().join("b");
    let a = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("a"), "127.0.0.1:0")).await.unwrap();
    let b = daemon::start(TokioEnv::default(), ServeOptions::new(&b_dir, format!("127.0.0.1:{port}"))).await.unwrap();
    assert_eq!(api(&a, "POST", "/v1/cluster/create", json!({"name": "t"})).await.0, 200);
    let token = api(&a, "POST", "/v1/tokens", Value::Null).await.1["token"].as_str().unwrap().to_string();
    assert_eq!(api(&b, "POST", "/v1/cluster/join", json!({ "token": token })).await.0, 200);
    let folder = root.path().join("vol-b");
    let (s, v) = api(&b, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 200, "{v}");
    eventually("b is a member with its volume known", || async {
        let (_, v) = api(&a, "GET", "/v1/volumes", Value::Null).await;
        v["volumes"].as_array().map_or(0, |a| a.len()) == 1
    })
    .await;
    let r = call(&b, "PUT", "/v1/files/docs/mine.txt", b"my own bytes".to_vec(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(api(&a, "PUT", "/v1/settings/team", json!({"value": "blue"})).await.0, 200);
    eventually("b holds the cluster's records", || async {
        api(&b, "GET", "/v1/settings/team", Value::Null).await.0 == 200
    })
    .await;

    let (s, v) = api(&b, "POST", "/v1/cluster/leave", Value::Null).await;
    assert_eq!(s, 200, "{v}");
    let empty = |d: &Daemon<TokioEnv>| {
        d.shared().read_node(|n, now| {
            let m = n.meta_status(now).meta;
            (m.records, m.log_entries, n.cluster().is_none())
        })
    };
    assert_eq!(empty(&b), (0, 0, true), "leaving wipes the metadata");
    b.shutdown().await;
    // A request of the old node still in flight (its goodbye to the others) may hold the
    // database for a moment in this process.
    let mut restarted = None;
    for _ in 0..150 {
        match daemon::start(TokioEnv::default(), ServeOptions::new(&b_dir, format!("127.0.0.1:{port}"))).await {
            Ok(d) => {
                restarted = Some(d);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let b = restarted.expect("b restarts");
    assert_eq!(empty(&b), (0, 0, true), "nothing comes back at a restart");
    assert_eq!(api(&b, "GET", "/v1/settings/team", Value::Null).await.0, 404, "the setting is gone");
    // The bytes were the owner's: still on disk.
    let on_disk = std::fs::read(folder.join("docs").join("mine.txt")).unwrap();
    assert_eq!(on_disk, b"my own bytes");
    // A new cluster starts clean.
    assert_eq!(api(&b, "POST", "/v1/cluster/create", json!({"name": "fresh"})).await.0, 200);
    assert_eq!(api(&b, "GET", "/v1/settings/team", Value::Null).await.0, 404);
    a.shutdown().await;
    b.shutdown().await;
}

/// How many `store/read` requests node `d` answered with 200, from its `/metrics`.
async fn store_reads(d: &Daemon<TokioEnv>) -> u64 {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let r = client.request(&d.url(), "GET", "/metrics", &[("authorization", &auth)], Vec::new(), 5_000).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let line = "shoal_http_requests_total{route=\"/cluster/acn/store/read\",method=\"GET\",status=\"200\"} ";
    text.lines().find_map(|l| l.strip_prefix(line)).map_or(0, |n| n.parse().unwrap())
}

/// The sum of the `/metrics` lines of node `d` that start with `prefix` (each `prefix... value`).
async fn metric_sum(d: &Daemon<TokioEnv>, prefix: &str) -> u64 {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let r = client.request(&d.url(), "GET", "/metrics", &[("authorization", &auth)], Vec::new(), 5_000).await.unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let values = text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next());
    values.map(|v| v.parse::<u64>().unwrap()).sum()
}

/// Every copy a put writes, on its own node or on a peer, is made durable through the volume's
/// grouped fsyncs (README "Transfer"): its part file and its folder, each counted once in
/// `shoal_disk_syncs_total` (lone or grouped), so a copy written past them would leave the
/// count short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_copy_a_put_writes_is_synced_through_the_volumes_group() {
    let c = cluster(3).await;
    let puts = (0..12).map(|i| {
        let node = &c.nodes[i % 3];
        async move {
            let r =
                call(node, "PUT", &format!("/v1/files/synced/f{i}.txt"), format!("small file {i}").into_bytes(), &[])
                    .await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
    });
    futures_util::future::join_all(puts).await;
    let copies: u64 = (0..12)
        .map(|i| {
            let on =
                |f: &Option<PathBuf>| f.as_ref().is_some_and(|f| disk_path(f, &format!("/synced/f{i}.txt")).exists());
            c.folders.iter().filter(|f| on(f)).count() as u64
        })
        .sum();
    assert!(copies >= 12, "every file has a copy: {copies}");
    let syncs: Vec<u64> =
        futures_util::future::join_all(c.nodes.iter().map(|d| metric_sum(d, "shoal_disk_syncs_total{"))).await;
    assert_eq!(syncs[0], 0, "node 0 has no volume: {syncs:?}");
    assert!(
        syncs.iter().sum::<u64>() >= 2 * copies,
        "a part file and a folder per copy: {syncs:?} for {copies} copies"
    );
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// A get of a file whose copy is on the node asked is read from its own disk: no request to
/// another node (issue 18); asked of a node without the copy, it reads the copy's node with
/// `store/read`, counted there by endpoint in `/metrics`.
#[tokio::test]
async fn a_get_of_a_local_copy_crosses_http_once() {
    let c = cluster(3).await;
    let content: Vec<u8> = (0..3 * 1024 * 1024 + 5).map(|i| (i % 253) as u8).collect();
    let r = call(&c.nodes[1], "PUT", "/v1/files/local/one.bin", content.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let holder = (1..3).find(|&i| disk_path(c.folders[i].as_ref().unwrap(), "/local/one.bin").exists()).unwrap();
    let other = 3 - holder;
    let before: Vec<u64> = futures_util::future::join_all(c.nodes.iter().map(store_reads)).await;
    let r = call(&c.nodes[holder], "GET", "/v1/files/local/one.bin", Vec::new(), &[]).await;
    assert_eq!((r.status, r.body.len()), (200, content.len()));
    assert_eq!(r.body.to_vec(), content);
    let after: Vec<u64> = futures_util::future::join_all(c.nodes.iter().map(store_reads)).await;
    assert_eq!(before, after, "a get of a local copy asks no other node for bytes");
    let r = call(&c.nodes[other], "GET", "/v1/files/local/one.bin", Vec::new(), &[]).await;
    assert_eq!(r.body.to_vec(), content);
    assert!(store_reads(&c.nodes[holder]).await > after[holder], "asked elsewhere, the holder is read by store/read");
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// The landed registry lives in memory. A node that restarts must still not delete bytes its
/// last run landed just before it stopped, whose record it has not seen yet: a removal decided
/// from older records would destroy the newer write (issue 18's note, "the landed registry is
/// in memory only"). Bytes found from before the start are hashed first: the removed content
/// is deleted as ever, other bytes stay until a record accounts for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_keeps_bytes_from_before_its_start_that_a_removal_does_not_know() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster(2).await;
    let folder = c.folders[1].clone().unwrap();
    for (path, body) in [("/keep/p.txt", "old p"), ("/keep/q.txt", "old q")] {
        let r = call(&c.nodes[0], "PUT", &format!("/v1/files{path}"), body.into(), &[]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert!(disk_path(&folder, path).exists(), "the one copy is on node 1");
    }
    // Node 1 stops; both files are removed while it is away (its copies stay on its disk).
    let b = c.nodes.pop().unwrap();
    let (listen, data) = (b.url().trim_start_matches("http://").to_string(), c._root.path().join("n1"));
    b.shutdown().await;
    for path in ["/keep/p.txt", "/keep/q.txt"] {
        assert_eq!(call(&c.nodes[0], "DELETE", &format!("/v1/files{path}"), vec![], &[]).await.status, 200);
    }
    // What node 1's last run landed at p just before it stopped: a newer write, whose record
    // it never saw.
    std::fs::write(disk_path(&folder, "/keep/p.txt"), "newer p").unwrap();

    let b = daemon::start(TokioEnv::default(), ServeOptions::new(data, listen)).await.unwrap();
    eventually("node 1 has both removals", || async {
        b.shared().read_node(|n, _| {
            ["/keep/p.txt", "/keep/q.txt"].iter().all(|p| n.meta().state().file(p).is_some_and(|f| f.removed))
        })
    })
    .await;
    // Its reconciler deletes the removed content (hashed: it is what the removal lists)...
    eventually("q's removed copy is deleted", || async { !disk_path(&folder, "/keep/q.txt").exists() }).await;
    // ...in the pass that also saw p's removal, which did not delete the newer bytes.
    let p = std::fs::read(disk_path(&folder, "/keep/p.txt"));
    assert_eq!(p.ok().as_deref(), Some(&b"newer p"[..]), "the newer bytes are kept");
    b.shutdown().await;
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// The kept name of the bytes with `sum` an overwrite landed over at `path` in `folder`.
fn kept_path(folder: &Path, path: &str, sum: &str) -> PathBuf {
    let dest = disk_path(folder, path);
    let name = dest.file_name().unwrap().to_str().unwrap().to_string();
    dest.with_file_name(shoal_core::storage::transfer::kept_file_name(&name, sum).unwrap())
}

/// Files with a kept name anywhere under `folder`.
fn kept_files(folder: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().contains(".part-kept-") {
                out.push(e.path());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_keeps_the_bytes_it_replaces_until_its_record_settles_them() {
    let _serial = SERIAL.lock().await;
    let c = cluster(2).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let folder = c.folders[1].clone().unwrap();
    let volume = b.shared().read_node(|n, _| n.local_volumes())[0].0.clone();
    let (old, new) = (b"the acknowledged content".to_vec(), b"an overwrite that never publishes".to_vec());
    assert_eq!(call(a, "PUT", "/v1/files/o/f.txt", old.clone(), &[]).await.status, 200);
    let dest = disk_path(&folder, "/o/f.txt");
    assert_eq!(std::fs::read(&dest).unwrap(), old);

    // An overwrite lands its copy on node 1 (what a peer's `store/put` with `replaces=` does)
    // and its writer gives up before publishing the record.
    let part = dest.with_file_name("f.txt.part-0123456789abcdef");
    std::fs::write(&part, &new).unwrap();
    let landed = &b.shared().store_service.landed;
    let placed = landed
        .land(b.shared(), &volume, "/o/f.txt", &sha(&new), Some(&sha(&old)), &dest, || std::fs::rename(&part, &dest));
    assert!(matches!(placed, Ok(Ok(()))), "the overwrite lands");
    assert_eq!(std::fs::read(&dest).unwrap(), new);
    let kept = kept_path(&folder, "/o/f.txt", &sha(&old));
    assert_eq!(std::fs::read(&kept).unwrap(), old, "the replaced bytes are kept aside");
    assert!(landed.forget(b.shared(), &volume, "/o/f.txt", &sha(&new)));
    b.shared().disk_kick();
    eventually("the acknowledged bytes are put back", || async {
        std::fs::read(&dest).ok().as_deref() == Some(&old[..]) && !kept.exists()
    })
    .await;
    let r = call(a, "GET", "/v1/files/o/f.txt", vec![], &[]).await;
    assert_eq!((r.status, r.body), (200, old.clone()), "the file reads as it was acknowledged");
    assert_eq!(current_copies(&stat(a, "/o/f.txt").await), 1);

    // A published overwrite: its record settles the new bytes, and the kept ones go.
    assert_eq!(call(a, "PUT", "/v1/files/o/f.txt", new.clone(), &[]).await.status, 200);
    assert_eq!(std::fs::read(&dest).unwrap(), new);
    eventually("the kept bytes of a published overwrite are dropped", || async {
        b.shared().disk_kick();
        kept_files(&folder).is_empty()
    })
    .await;
    let r = call(a, "GET", "/v1/files/o/f.txt", vec![], &[]).await;
    assert_eq!((r.status, r.body), (200, new.clone()));
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// What a node's last run did for an overwrite of `path` whose put died before publishing, on
/// its volume `folder`: the `old` bytes linked to their kept name, the new ones renamed into
/// place (long enough ago that no record of them can still be on its way). (The copy's path,
/// the kept path.)
fn land_unpublished_over(folder: &Path, path: &str, old: &[u8]) -> (PathBuf, PathBuf) {
    let dest = disk_path(folder, path);
    let kept = kept_path(folder, path, &sha(old));
    std::fs::hard_link(&dest, &kept).unwrap();
    let name = dest.file_name().unwrap().to_string_lossy().into_owned();
    let part = dest.with_file_name(format!("{name}.part-0123456789abcdef"));
    std::fs::write(&part, b"never published").unwrap();
    let f = std::fs::File::options().write(true).open(&part).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(11 * 60)).unwrap();
    drop(f);
    std::fs::rename(&part, &dest).unwrap();
    (dest, kept)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_an_overwrite_that_never_published_puts_the_old_bytes_back() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster(2).await;
    let folder = c.folders[1].clone().unwrap();
    let old = b"acknowledged before the crash".to_vec();
    assert_eq!(call(&c.nodes[0], "PUT", "/v1/files/o/g.txt", old.clone(), &[]).await.status, 200);
    let b = c.nodes.pop().unwrap();
    let (listen, data) = (b.url().trim_start_matches("http://").to_string(), c._root.path().join("n1"));
    b.shutdown().await;
    // What node 1's last run did for an overwrite whose put died before publishing: the old
    // bytes linked to their kept name, the new ones renamed into place (long enough ago that
    // no record of them can still be on its way).
    let (dest, kept) = land_unpublished_over(&folder, "/o/g.txt", &old);

    let b = daemon::start(TokioEnv::default(), ServeOptions::new(data, listen)).await.unwrap();
    eventually("node 1 knows the leader again", || async {
        b.shared().read_node(|n, now| n.meta_leader(now)).is_some()
    })
    .await;
    // A rescan finds the kept bytes; the reconciler puts them back.
    eventually("the acknowledged bytes are back", || async {
        assert_eq!(api(&b, "POST", "/v1/rescan", Value::Null).await.0, 200);
        b.shared().disk_kick();
        std::fs::read(&dest).ok().as_deref() == Some(&old[..]) && !kept.exists()
    })
    .await;
    eventually("the copy counts again", || async { current_copies(&stat(&c.nodes[0], "/o/g.txt").await) == 1 }).await;
    let r = call(&c.nodes[0], "GET", "/v1/files/o/g.txt", vec![], &[]).await;
    assert_eq!((r.status, r.body), (200, old));
    b.shutdown().await;
    for d in c.nodes {
        d.shutdown().await;
    }
}

/// After a restart, bytes an overwrite kept aside are known only once a rescan walked the
/// volumes: until then a move's rename at that path waits. Here node 1 restarts holding the
/// landed bytes of an overwrite that never published over the acknowledged ones (kept aside),
/// and the file is moved at once: the moved file must get the acknowledged bytes, not the
/// landed ones (which the reconciler renamed before the rescan found the kept bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_just_after_a_restart_renames_the_kept_bytes_not_the_landed_ones() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster(2).await;
    let folder = c.folders[1].clone().unwrap();
    let old = b"acknowledged before the crash, then moved".to_vec();
    assert_eq!(call(&c.nodes[0], "PUT", "/v1/files/o/k.txt", old.clone(), &[]).await.status, 200);
    let b = c.nodes.pop().unwrap();
    let (listen, data) = (b.url().trim_start_matches("http://").to_string(), c._root.path().join("n1"));
    b.shutdown().await;
    let (_, kept) = land_unpublished_over(&folder, "/o/k.txt", &old);

    let b = daemon::start(TokioEnv::default(), ServeOptions::new(data, listen)).await.unwrap();
    eventually("node 1 knows the leader again", || async {
        b.shared().read_node(|n, now| n.meta_leader(now)).is_some()
    })
    .await;
    let (status, body) = api(&c.nodes[0], "POST", "/v1/mv", json!({"from": "/o/k.txt", "to": "/o/moved.txt"})).await;
    assert_eq!(status, 200, "{body}");
    eventually("node 1 holds the move", || async {
        b.shared().read_node(|n, _| n.meta().state().file("/o/moved.txt").is_some())
    })
    .await;
    b.shared().disk_kick();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!disk_path(&folder, "/o/moved.txt").exists(), "no rename before a rescan found what is kept");
    eventually("the moved file has the acknowledged bytes", || async {
        assert_eq!(api(&b, "POST", "/v1/rescan", Value::Null).await.0, 200);
        b.shared().disk_kick();
        std::fs::read(disk_path(&folder, "/o/moved.txt")).ok().as_deref() == Some(&old[..]) && !kept.exists()
    })
    .await;
    let r = call(&c.nodes[0], "GET", "/v1/files/o/moved.txt", vec![], &[]).await;
    assert_eq!((r.status, r.body), (200, old));
    b.shutdown().await;
    for d in c.nodes {
        d.shutdown().await;
    }
}
