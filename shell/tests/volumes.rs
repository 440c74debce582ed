//! Volumes through the admin API of a real node in process (spec: "Storage (ACS) and the
//! cluster:/ drive" → Volumes, "Nearly full volumes"; issue 4 "Volumes and transfer").

use serde_json::{json, Value};
use shoal_core::meta::records::{FileRecord, Location, LocationState, Record};
use shoal_core::{FileId, NodeId, VolumeId};
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;

async fn call(d: &Daemon<TokioEnv>, method: &str, path: &str, body: Value) -> (u16, Value) {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(&body).unwrap() };
    let r = client.request(&d.url(), method, path, &[("authorization", &auth)], body, 5_000).await.unwrap();
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn volumes_are_added_listed_switched_read_only_and_removed() {
    let root = tempfile::tempdir().unwrap();
    let d =
        daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("data"), "127.0.0.1:0")).await.unwrap();
    let folder = root.path().join("disk1").join("shoal");

    // Not in a cluster yet.
    let (s, _) = call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 409);
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);

    // Bad paths: relative, a file, the data dir itself.
    let file = root.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [
        "relative/dir".to_string(),
        file.to_string_lossy().into_owned(),
        root.path().join("data").to_string_lossy().into_owned(),
    ] {
        let (s, v) = call(&d, "POST", "/v1/volumes", json!({ "path": bad, "create": true })).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(v["error"]["message"].is_string());
    }

    // Issue 17: a missing folder is refused unless creating it is asked for (a typo or an
    // unmounted disk would otherwise fill the root disk), and nothing is created.
    let (s, v) = call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap()})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_path")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--create"), "{v}");
    assert!(!folder.exists() && !folder.parent().unwrap().exists(), "nothing created");

    // Add (the folder is created), with capacity and free space from the filesystem.
    let (s, v) =
        call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "name": "disk1", "create": true}))
            .await;
    assert_eq!(s, 200, "{v}");
    assert!(folder.is_dir());
    let id = v["id"].as_str().unwrap().to_string();
    assert!(v["capacity"].as_u64().unwrap() > 0);
    let (s, v) = call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("volume_exists")));
    let nested = folder.join("inner");
    let (s, v) = call(&d, "POST", "/v1/volumes", json!({"path": nested.to_str().unwrap(), "create": true})).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("volume_overlaps")));

    let (_, list) = call(&d, "GET", "/v1/volumes", Value::Null).await;
    let vols = list["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0]["local"], true);
    assert_eq!(vols[0]["name"], "disk1");

    // Read-only switch.
    let (s, v) = call(&d, "POST", &format!("/v1/volumes/{id}/readonly"), json!({"readOnly": true})).await;
    assert_eq!((s, v["readOnly"].as_bool()), (200, Some(true)));

    // Removal is refused while the volume holds the only healthy copy of a file.
    let node = d.shared().read_node(|n, _| n.id().clone());
    d.shared()
        .with_node(|n, now| {
            let version = n.next_version(now);
            let f = FileRecord {
                id: FileId::new("f1"),
                path: "/only/here.txt".into(),
                is_dir: false,
                size: 3,
                mod_time: 0,
                checksum: "abc".into(),
                owner: String::new(),
                primary: Some(VolumeId::new(id.clone())),
                locations: vec![Location {
                    volume_id: VolumeId::new(id.clone()),
                    node_id: NodeId::new(node.to_string()),
                    state: LocationState::Verified,
                    checksum: "abc".into(),
                    updated: version.clone(),
                    content: None,
                }],
                replicas: 0,
                removed: false,
                version,
                repl: None,
                based_on: None,
            };
            n.submit_meta_record(now, Record::File(f))
        })
        .unwrap();
    let (s, v) = call(&d, "DELETE", &format!("/v1/volumes/{id}"), Value::Null).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("volume_holds_only_copy")), "{v}");

    // Evacuation: flagged, progress reported; with one node there is nowhere to move the copy,
    // so the planner says so and never drops it.
    let (s, v) = call(&d, "POST", &format!("/v1/volumes/{id}/evacuate"), json!({})).await;
    assert_eq!((s, v["evacuating"].as_bool(), v["copiesLeft"].as_u64()), (200, Some(true), Some(1)), "{v}");
    let (_, v) = call(&d, "GET", &format!("/v1/volumes/{id}/evacuate"), Value::Null).await;
    assert_eq!((v["onlyCopiesLeft"].as_u64(), v["done"].as_bool()), (Some(1), Some(false)));
    let (s, v) = call(&d, "GET", "/v1/repl/plan", Value::Null).await;
    assert_eq!(s, 200);
    assert_eq!(v["plan"]["tasks"].as_array().map(|t| t.len()), Some(0), "{v}");
    assert_eq!(v["plan"]["stats"]["noTarget"], 1);
    let (_, v) = call(&d, "GET", "/v1/repl/status", Value::Null).await;
    assert_eq!(v["stats"]["under"], 1);
    let (s, v) = call(&d, "POST", &format!("/v1/volumes/{id}/evacuate"), json!({"cancel": true})).await;
    assert_eq!((s, v["evacuating"].as_bool()), (200, Some(false)));

    // Once the file is gone, the volume can go.
    d.shared()
        .with_node(|n, now| {
            let Some(Record::File(mut f)) =
                n.meta().state().get(shoal_core::meta::records::RecordKind::File, "/only/here.txt").cloned()
            else {
                panic!("file record")
            };
            f.removed = true;
            f.version = n.next_version(now);
            n.submit_meta_record(now, Record::File(f))
        })
        .unwrap();
    let (s, v) = call(&d, "DELETE", &format!("/v1/volumes/{id}"), Value::Null).await;
    assert_eq!(s, 200, "{v}");
    let (_, list) = call(&d, "GET", "/v1/volumes", Value::Null).await;
    assert_eq!(list["volumes"].as_array().unwrap().len(), 0);
    let (s, _) = call(&d, "DELETE", &format!("/v1/volumes/{id}"), Value::Null).await;
    assert_eq!(s, 404);
    d.shutdown().await;
}

/// A node knows its own volumes from its own list, kept beside the replicated records: after a
/// restart its volume is still its own, and a data dir from before the list was kept (no list
/// written) adopts its volumes once from the records and keeps them from then on.
#[tokio::test]
async fn a_nodes_own_volumes_survive_a_restart_and_an_old_data_dir_adopts_them() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let folder = root.path().join("disk1");
    let d = daemon::start(TokioEnv::default(), ServeOptions::new(data.clone(), "127.0.0.1:0")).await.unwrap();
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);
    let (s, v) = call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    d.shutdown().await;

    let own_after_restart = |forget_list: bool| {
        let (data, id) = (data.clone(), id.clone());
        async move {
            if forget_list {
                // What a data dir written before the list was kept looks like.
                let db = redb::Database::create(data.join(shoal_shell::persist::identity::DB_FILE)).unwrap();
                let txn = db.begin_write().unwrap();
                {
                    let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("cluster");
                    let mut t = txn.open_table(def).unwrap();
                    assert!(t.remove("own_volumes_kept").unwrap().is_some(), "the list was kept");
                }
                txn.commit().unwrap();
            }
            let d = daemon::start(TokioEnv::default(), ServeOptions::new(data, "127.0.0.1:0")).await.unwrap();
            let (_, list) = call(&d, "GET", "/v1/volumes", Value::Null).await;
            let local = list["volumes"].as_array().unwrap().iter().any(|v| v["id"] == id && v["local"] == true);
            let measured = d.shared().read_node(|n, _| n.local_volumes().len());
            d.shutdown().await;
            local && measured == 1
        }
    };
    assert!(own_after_restart(false).await, "the volume is still this node's after a restart");
    assert!(own_after_restart(true).await, "an old data dir adopts its volume");
    assert!(own_after_restart(false).await, "and keeps it");
}

/// Issue 11: `volume add` took system folders, pseudo-filesystems and other nodes' data dirs,
/// and a rescan then published what was there (a node's private key became readable through
/// `shoal get`). Those are refused now, nothing is created for them, and a rescan never adopts
/// a node's key, token or database wherever it lies.
#[tokio::test]
async fn system_folders_and_data_dirs_are_refused_and_a_rescan_never_adopts_a_nodes_secrets() {
    let root = tempfile::tempdir().unwrap();
    let d =
        daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("data"), "127.0.0.1:0")).await.unwrap();
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);

    // Another node's data dir, a folder holding one two levels down, and one inside one.
    let other = root.path().join("other-node");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("node.key"), b"00").unwrap();
    let holder = root.path().join("holder");
    std::fs::create_dir_all(holder.join("a").join("b")).unwrap();
    std::fs::write(holder.join("a").join("b").join("cluster.redb"), b"").unwrap();
    let not_created = std::path::PathBuf::from("/etc/shoal-volume-test-never-made");
    for bad in [
        "/".to_string(),
        "/etc".to_string(),
        not_created.to_string_lossy().into_owned(),
        "/proc".to_string(),
        "/proc/self".to_string(),
        "/sys/kernel".to_string(),
        "/dev/shm".to_string(),
        "/usr/lib".to_string(),
        "/tmp".to_string(),
        "/var".to_string(),
        other.to_string_lossy().into_owned(),
        other.join("inside").to_string_lossy().into_owned(),
        holder.to_string_lossy().into_owned(),
    ] {
        let (s, v) = call(&d, "POST", "/v1/volumes", json!({ "path": bad, "create": true })).await;
        assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_path")), "{bad}: {v}");
    }
    assert!(!not_created.exists(), "nothing is created for a refused folder");
    assert!(!other.join("inside").exists());

    // A right folder whose files include a node's secrets: only the other files are adopted.
    let folder = root.path().join("disk");
    let (s, v) = call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 200, "{v}");
    std::fs::create_dir_all(folder.join("sub")).unwrap();
    for name in ["node.key", "admin.token", "cluster.redb", "node.id", "photo.jpg"] {
        std::fs::write(folder.join("sub").join(name), b"secret bytes").unwrap();
    }
    let (s, v) = call(&d, "POST", "/v1/rescan", Value::Null).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["volumes"][0]["adopted"], json!(1), "only photo.jpg: {v}");
    for name in ["node.key", "admin.token", "cluster.redb", "node.id"] {
        let (s, _) = call(&d, "GET", &format!("/v1/meta/stat?path=/sub/{name}"), Value::Null).await;
        assert_eq!(s, 404, "{name} was published");
    }
    let (s, _) = call(&d, "GET", "/v1/meta/stat?path=/sub/photo.jpg", Value::Null).await;
    assert_eq!(s, 200);
    d.shutdown().await;
}

/// Issue 11: names of 234–255 bytes answered 507, because the part file's suffix took the name
/// over the file system's 255-byte limit. Every valid name can be written now; 256 bytes is a
/// 400.
#[tokio::test]
async fn names_up_to_255_bytes_can_be_written_and_longer_ones_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let d =
        daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("data"), "127.0.0.1:0")).await.unwrap();
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);
    let folder = root.path().join("disk");
    assert_eq!(call(&d, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await.0, 200);
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    for (len, want) in [(233usize, 200u16), (234, 200), (250, 200), (255, 200), (256, 400)] {
        let name = "n".repeat(len);
        let body = format!("file of {len}");
        let r = client
            .request(&d.url(), "PUT", &format!("/v1/files/{name}"), &[("authorization", &auth)], body.clone(), 10_000)
            .await
            .unwrap();
        assert_eq!(r.status, want, "{len}: {}", String::from_utf8_lossy(&r.body));
        if want == 200 {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(folder.join(&name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{len}: a volume file is its owner's only");
            let r = client
                .request(&d.url(), "GET", &format!("/v1/files/{name}"), &[("authorization", &auth)], vec![], 10_000)
                .await
                .unwrap();
            assert_eq!((r.status, r.body.as_ref()), (200, body.as_bytes()), "{len}");
        }
    }
    // Issue 11: the database, node id and config files were world-readable.
    use std::os::unix::fs::PermissionsExt;
    let data = root.path().join("data");
    for f in ["cluster.redb", "node.id", "node.key", "admin.token", "api.url"] {
        let mode = std::fs::metadata(data.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f}");
    }
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
    d.shutdown().await;
}

/// A tmpfs of `size` mounted at `at` for one test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// `None` where this machine cannot mount (not root): the caller says why it skips.
    fn mount(at: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.to_string_lossy().into_owned());
        }
    }
    out
}

/// Issue 17 "Disk faults": a volume on a small real filesystem (a tmpfs the test mounts; CI
/// runs as root) that fills in the middle of a put. The put answers 507, nothing half-written
/// is published or left behind, and the node keeps serving what it holds. Set
/// `SHOAL_REQUIRE_TMPFS=1` to make a machine that cannot mount fail instead of skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_that_fills_mid_put_answers_507_and_publishes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let small = root.path().join("small");
    let Some(_mount) = Tmpfs::mount(&small, "6m") else {
        assert!(std::env::var_os("SHOAL_REQUIRE_TMPFS").is_none(), "cannot mount a tmpfs here");
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let d =
        daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("data"), "127.0.0.1:0")).await.unwrap();
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);
    let (s, v) =
        call(&d, "POST", "/v1/volumes", json!({"path": small.join("vol").to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 200, "{v}");
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let kept: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let r = client
        .request(&d.url(), "PUT", "/v1/files/kept.bin", &[("authorization", &auth)], kept.clone(), 20_000)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    // 8 MiB into what is left of 6 MiB: refused up front (placement sees the room) or when
    // the filesystem fills; either way a 507 and nothing published.
    let big: Vec<u8> = (0..8_000_000u32).map(|i| (i % 241) as u8).collect();
    let r = client
        .request(&d.url(), "PUT", "/v1/files/big.bin", &[("authorization", &auth)], big.clone(), 30_000)
        .await
        .unwrap();
    assert_eq!(r.status, 507, "{}", String::from_utf8_lossy(&r.body));
    // A size the volume cannot know in advance (chunked): the copy fills the disk mid-write.
    let addr = d.url().trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let (tx, body) = shoal_shell::net::client::ChannelBody::new(4);
    let req = hyper::Request::put("/v1/files/chunked.bin")
        .header("host", addr)
        .header("authorization", &auth)
        .body(body)
        .unwrap();
    let pieces: Vec<bytes::Bytes> = big.chunks(100_000).map(bytes::Bytes::copy_from_slice).collect();
    tokio::spawn(async move {
        for p in pieces {
            if tx.send(Ok(p)).await.is_err() {
                break;
            }
        }
    });
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.map(|b| b.to_bytes()).unwrap_or_default();
    assert_eq!(status, 507, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "insufficient_storage", "{v}");

    for path in ["/big.bin", "/chunked.bin"] {
        let (s, _) = call(&d, "GET", &format!("/v1/meta/stat?path={path}"), Value::Null).await;
        assert_eq!(s, 404, "{path} was published");
    }
    let left = files_under(&small);
    assert_eq!(left.len(), 1, "only the kept file stays on the volume: {left:?}");
    assert!(left[0].ends_with("kept.bin"), "{left:?}");
    let spool = files_under(&root.path().join("data").join("spool"));
    assert!(spool.is_empty(), "spool leftovers: {spool:?}");
    let r = client
        .request(&d.url(), "GET", "/v1/files/kept.bin", &[("authorization", &auth)], Vec::new(), 20_000)
        .await
        .unwrap();
    assert_eq!((r.status, r.body.len()), (200, kept.len()));
    assert!(r.body.as_ref() == kept.as_slice());
    // And the volume takes a file that fits again.
    let r = client
        .request(&d.url(), "PUT", "/v1/files/after.bin", &[("authorization", &auth)], vec![7u8; 100_000], 20_000)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    d.shutdown().await;
}

/// Fill the filesystem holding `path` (a file written until the disk refuses).
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    for block in [1 << 20, 4096, 512] {
        let buf = vec![0u8; block];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
}

/// Issue 17 "Disk faults": a data dir that fills. Once the node cannot store its metadata, new
/// writes are refused with a clear 507 (`data_dir_full`) instead of being acknowledged into
/// memory alone, `/readyz` says why, reads go on; once there is room again writes are taken,
/// and after a restart every write acknowledged before, during or after is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_dir_refuses_new_writes_and_loses_nothing_acknowledged() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let Some(_mount) = Tmpfs::mount(&data, "32m") else {
        assert!(std::env::var_os("SHOAL_REQUIRE_TMPFS").is_none(), "cannot mount a tmpfs here");
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let d = daemon::start(TokioEnv::default(), ServeOptions::new(&data, "127.0.0.1:0")).await.unwrap();
    assert_eq!(call(&d, "POST", "/v1/cluster/create", json!({"name": "v"})).await.0, 200);
    for _ in 0..100 {
        if d.shared().read_node(|n, now| n.readiness(now).ready) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let pad = "x".repeat(30_000);
    let (s, v) = call(&d, "PUT", "/v1/settings/k-1", json!({ "value": format!("-1-{pad}") })).await;
    assert_eq!(s, 200, "{v}");
    fill(&data.join("filler"));
    // Background writes of the node may meet the full disk first: the refusal can come at once.
    let mut acked = vec![-1];
    let mut refusal = None;
    for i in 0..4000 {
        let (s, v) = call(&d, "PUT", &format!("/v1/settings/k{i}"), json!({ "value": format!("{i}-{pad}") })).await;
        if s == 200 {
            acked.push(i);
            continue;
        }
        assert_eq!((s, v["error"]["code"].as_str()), (507, Some("data_dir_full")), "{v}");
        refusal = Some(v);
        break;
    }
    let refusal = refusal.expect("a full data dir must refuse writes at some point");
    assert!(refusal["error"]["message"].as_str().unwrap().contains("free space"), "{refusal}");
    // Reads go on; readiness names the reason.
    let (s, _) = call(&d, "GET", "/v1/settings/k-1", Value::Null).await;
    assert_eq!(s, 200);
    let (s, v) = call(&d, "GET", "/readyz", Value::Null).await;
    assert_eq!(s, 503, "{v}");
    assert!(v["why"].to_string().contains("cannot store metadata"), "{v}");

    std::fs::remove_file(data.join("filler")).unwrap();
    let mut after = None;
    for _ in 0..100 {
        let (s, _) = call(&d, "PUT", "/v1/settings/after", json!({"value": "room again"})).await;
        if s == 200 {
            after = Some(());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(after.is_some(), "writes are taken again once there is room");
    d.shutdown().await;

    let d = daemon::start(TokioEnv::default(), ServeOptions::new(&data, "127.0.0.1:0")).await.unwrap();
    for i in &acked {
        let (s, v) = call(&d, "GET", &format!("/v1/settings/k{i}"), Value::Null).await;
        assert_eq!(s, 200, "acknowledged k{i} lost: {v}");
        assert!(v["value"].as_str().unwrap().starts_with(&format!("{i}-")), "k{i}: {v}");
    }
    let (s, v) = call(&d, "GET", "/v1/settings/after", Value::Null).await;
    assert_eq!((s, v["value"].as_str()), (200, Some("room again")), "{v}");
    d.shutdown().await;
}
