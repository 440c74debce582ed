//! The chunked transfer protocol between two real nodes in process over loopback (spec:
//! "Chunked transfer"; reference-facts.md "Chunked store/*"; issue 4 "Volumes and transfer").

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_core::NodeId;
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use shoal_shell::net::transport::Transport;
use shoal_shell::wire::{CHUNK_SHA_HEADER, FILE_SIZE_HEADER};

const MIB: usize = 1024 * 1024;

async fn api(d: &Daemon<TokioEnv>, method: &str, path: &str, body: Value) -> (u16, Value) {
    let client = HttpClient::new(TokioEnv::default());
    let auth = format!("Bearer {}", d.shared().admin_token);
    let body = if body.is_null() { Vec::new() } else { serde_json::to_vec(&body).unwrap() };
    let r = client.request(&d.url(), method, path, &[("authorization", &auth)], body, 5_000).await.unwrap();
    (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// A signed request from `from` to node `to`; returns status, body and the store headers
/// (chunk SHA-256, file size) when present.
async fn signed(
    from: &Daemon<TokioEnv>,
    to: &NodeId,
    method: &str,
    target: &str,
    body: Vec<u8>,
    chunk_sha: Option<String>,
) -> (u16, Vec<u8>, Option<String>, Option<String>) {
    let mut p =
        from.shared().with_node(|n, now| Transport::<TokioEnv>::prepare(n, now, to, method, target, body)).unwrap();
    if let Some(sha) = chunk_sha {
        p.extra.push((CHUNK_SHA_HEADER, sha));
    }
    let r = from.shared().transport.send(p, 10_000).await.unwrap();
    let (sha, size) = (r.header(CHUNK_SHA_HEADER).map(str::to_string), r.header(FILE_SIZE_HEADER).map(str::to_string));
    (r.status, r.body.to_vec(), sha, size)
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn json_of(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or(Value::Null)
}

/// Two nodes in one cluster, `b` with a volume: (temp root, a, b, b's id, b's volume folder,
/// its volume id).
async fn two_nodes() -> (tempfile::TempDir, Daemon<TokioEnv>, Daemon<TokioEnv>, NodeId, std::path::PathBuf, String) {
    let root = tempfile::tempdir().unwrap();
    let a = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("a"), "127.0.0.1:0")).await.unwrap();
    let b = daemon::start(TokioEnv::default(), ServeOptions::new(root.path().join("b"), "127.0.0.1:0")).await.unwrap();
    assert_eq!(api(&a, "POST", "/v1/cluster/create", json!({"name": "t"})).await.0, 200);
    let token = api(&a, "POST", "/v1/tokens", Value::Null).await.1["token"].as_str().unwrap().to_string();
    assert_eq!(api(&b, "POST", "/v1/cluster/join", json!({ "token": token })).await.0, 200);
    let b_id = b.shared().read_node(|n, _| n.id().clone());
    let folder = root.path().join("vol-b");
    let (s, v) = api(&b, "POST", "/v1/volumes", json!({"path": folder.to_str().unwrap(), "create": true})).await;
    assert_eq!(s, 200, "{v}");
    let vol = v["id"].as_str().unwrap().to_string();
    (root, a, b, b_id, folder, vol)
}

#[tokio::test]
async fn a_file_goes_up_in_verified_chunks_resumes_and_lands_only_when_whole() {
    let (root, a, b, b_id, folder, vol) = two_nodes().await;

    let content: Vec<u8> = (0..9 * MIB + 123).map(|i| (i * 31 % 251) as u8).collect();
    let begin = json!({"volumeId": vol, "path": "cluster:docs\\big.bin", "size": content.len(), "checksum": sha(&content), "fileId": "f1"});
    let (s, body, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&begin).unwrap(), None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let session = json_of(&body)["sessionId"].as_str().unwrap().to_string();
    let chunk = |i: usize| content[i * 4 * MIB..((i + 1) * 4 * MIB).min(content.len())].to_vec();

    // A chunk whose SHA-256 does not match is refused; good chunks are taken.
    let t0 = format!("/cluster/acn/store/chunk?session={session}&index=0");
    let (s, ..) = signed(&a, &b_id, "POST", &t0, chunk(0), Some(sha(b"not it"))).await;
    assert_eq!(s, 400);
    for i in 0..2 {
        let t = format!("/cluster/acn/store/chunk?session={session}&index={i}");
        let (s, body, ..) = signed(&a, &b_id, "POST", &t, chunk(i), Some(sha(&chunk(i)))).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    }
    // The same begin resumes the session with the chunks it has.
    let (s, body, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&begin).unwrap(), None).await;
    assert_eq!(s, 200);
    assert_eq!(json_of(&body), json!({"sessionId": session, "have": [0, 1]}));
    // Nothing is in place until the whole file is there and checks out.
    let commit = format!("/cluster/acn/store/commit?session={session}");
    let (s, ..) = signed(&a, &b_id, "POST", &commit, Vec::new(), None).await;
    assert_eq!(s, 409);
    let final_path = folder.join("docs").join("big.bin");
    assert!(!final_path.exists());
    let t2 = format!("/cluster/acn/store/chunk?session={session}&index=2");
    assert_eq!(signed(&a, &b_id, "POST", &t2, chunk(2), Some(sha(&chunk(2)))).await.0, 200);
    let (s, body, ..) = signed(&a, &b_id, "POST", &commit, Vec::new(), None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(std::fs::read(&final_path).unwrap(), content);
    let leftovers: Vec<_> = std::fs::read_dir(folder.join("docs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".part-"))
        .collect();
    assert!(leftovers.is_empty(), "no part file is left behind");

    // Reads of a range, stat and checksum.
    let read = format!("/cluster/acn/store/read?volume={vol}&path=%2Fdocs%2Fbig.bin&offset={}&length={}", 4 * MIB, MIB);
    let (s, body, chunk_sha, size) = signed(&a, &b_id, "GET", &read, Vec::new(), None).await;
    assert_eq!(s, 200);
    assert_eq!(body, content[4 * MIB..5 * MIB]);
    assert_eq!(chunk_sha, Some(sha(&body)), "each read carries its SHA-256");
    assert_eq!(size, Some(content.len().to_string()));
    let (s, body, ..) =
        signed(&a, &b_id, "GET", &format!("/cluster/acn/store/stat?volume={vol}&path=/docs/big.bin"), Vec::new(), None)
            .await;
    assert_eq!((s, json_of(&body)["size"].as_u64()), (200, Some(content.len() as u64)));
    let (s, body, ..) = signed(
        &a,
        &b_id,
        "GET",
        &format!("/cluster/acn/store/checksum?volume={vol}&path=/docs/big.bin"),
        Vec::new(),
        None,
    )
    .await;
    assert_eq!((s, json_of(&body)["checksum"].as_str().map(str::to_string)), (200, Some(sha(&content))));

    // A whole-file checksum that does not match: refused at commit, nothing lands.
    let other =
        json!({"volumeId": vol, "path": "/docs/wrong.bin", "size": 5, "checksum": sha(b"other"), "fileId": "f2"});
    let (_, body, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&other).unwrap(), None).await;
    let s2 = json_of(&body)["sessionId"].as_str().unwrap().to_string();
    let tc = format!("/cluster/acn/store/chunk?session={s2}&index=0");
    assert_eq!(signed(&a, &b_id, "POST", &tc, b"hello".to_vec(), Some(sha(b"hello"))).await.0, 200);
    let (s, body, ..) =
        signed(&a, &b_id, "POST", &format!("/cluster/acn/store/commit?session={s2}"), Vec::new(), None).await;
    assert_eq!(
        (s, json_of(&body)["error"]["code"].as_str().map(str::to_string)),
        (409, Some("checksum_mismatch".into()))
    );
    assert!(!folder.join("docs").join("wrong.bin").exists());

    // Paths never leave the volume: reserved part names, a symlink out, reads out of range.
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, folder.join("link")).unwrap();
    for (path, want) in [("/x.part-1234", 400), ("/link/evil.bin", 400), ("/", 400)] {
        let bad = json!({"volumeId": vol, "path": path, "size": 1, "checksum": sha(b"x"), "fileId": "f3"});
        let (s, body, ..) =
            signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&bad).unwrap(), None).await;
        assert_eq!(s, want, "{path}: {}", String::from_utf8_lossy(&body));
    }
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing was written outside the volume");
    let (s, ..) = signed(
        &a,
        &b_id,
        "GET",
        &format!("/cluster/acn/store/read?volume={vol}&path=/docs/big.bin&length=0"),
        Vec::new(),
        None,
    )
    .await;
    assert_eq!(s, 400);
    let (s, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/chunk?session=nope&index=0", b"x".to_vec(), Some(sha(b"x")))
            .await;
    assert_eq!(s, 404);
    let unknown = json!({"volumeId": "no-such-volume", "path": "/a", "size": 1, "checksum": sha(b"x"), "fileId": "f4"});
    let (s, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&unknown).unwrap(), None).await;
    assert_eq!(s, 404);

    // A symlinked folder is never written through, even deep in a path (nothing outside).
    let deep = json!({"volumeId": vol, "path": "/link/a/b/c.bin", "size": 1, "checksum": sha(b"x"), "fileId": "f5"});
    let (s, ..) = signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&deep).unwrap(), None).await;
    assert_eq!(s, 400);
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "no folder was created outside the volume");

    // mkdir and list (uploads in progress are hidden).
    let (s, ..) = signed(
        &a,
        &b_id,
        "POST",
        &format!("/cluster/acn/store/mkdir?volume={vol}&path=/photos/2026"),
        Vec::new(),
        None,
    )
    .await;
    assert_eq!(s, 200);
    assert!(folder.join("photos").join("2026").is_dir());
    let pending =
        json!({"volumeId": vol, "path": "/docs/pending.bin", "size": 3, "checksum": sha(b"abc"), "fileId": "f6"});
    assert_eq!(
        signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&pending).unwrap(), None).await.0,
        200
    );
    let (s, body, ..) =
        signed(&a, &b_id, "GET", &format!("/cluster/acn/store/list?volume={vol}&path=/docs"), Vec::new(), None).await;
    assert_eq!(s, 200);
    let names: Vec<String> =
        json_of(&body)["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, vec!["big.bin"]);
    let (s, body, ..) =
        signed(&a, &b_id, "GET", &format!("/cluster/acn/store/list?volume={vol}&path=/"), Vec::new(), None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));

    // Placement is the leader's (node a): it picks b's volume; 507 when nothing fits; b refuses.
    let a_id = a.shared().read_node(|n, _| n.id().clone());
    let mut leads = false;
    for _ in 0..300 {
        leads = a.shared().read_node(|n, now| n.meta_leader(now).is_some_and(|l| l.holder == a_id));
        if leads {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        leads,
        "a leads its cluster: a {:?} / b {:?}",
        a.shared().read_node(|n, now| n.meta_status(now)),
        b.shared().read_node(|n, now| n.meta_status(now))
    );
    // b's volume record reaches the leader once b hears of the lease (renewals every 10 s).
    let mut known = false;
    for _ in 0..300 {
        known =
            a.shared().read_node(|n, _| n.volume_list().volumes.iter().any(|x| x.volume.id.as_str() == vol.as_str()));
        if known {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(known, "the leader learns b's volume");
    let (s, body, ..) = signed(
        &b,
        &a_id,
        "POST",
        "/cluster/acn/store/place",
        serde_json::to_vec(&json!({"size": 1000})).unwrap(),
        None,
    )
    .await;
    assert_eq!(
        (s, json_of(&body)["volumeId"].as_str().map(str::to_string)),
        (200, Some(vol.clone())),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (s, ..) = signed(
        &b,
        &a_id,
        "POST",
        "/cluster/acn/store/place",
        serde_json::to_vec(&json!({"size": 1u64 << 50})).unwrap(),
        None,
    )
    .await;
    assert_eq!(s, 507);
    let (s, ..) =
        signed(&a, &b_id, "POST", "/cluster/acn/store/place", serde_json::to_vec(&json!({"size": 1})).unwrap(), None)
            .await;
    assert_eq!(s, 409, "only the leader places");

    // Only members reach the store: an unsigned request is refused.
    let client = HttpClient::new(TokioEnv::default());
    let r = client
        .request(&b.url(), "POST", "/cluster/acn/store/begin", &[], serde_json::to_vec(&begin).unwrap(), 5_000)
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    a.shutdown().await;
    b.shutdown().await;
}

/// Upload `content` to `path` on `vol` of node `to` in one chunk and commit; the commit's answer.
async fn upload(
    from: &Daemon<TokioEnv>,
    to: &NodeId,
    vol: &str,
    path: &str,
    content: &[u8],
    replaces: Option<&str>,
) -> (u16, Value) {
    let begin = json!({"volumeId": vol, "path": path, "size": content.len(), "checksum": sha(content), "fileId": ""});
    let (s, body, ..) =
        signed(from, to, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&begin).unwrap(), None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let session = json_of(&body)["sessionId"].as_str().unwrap().to_string();
    let t = format!("/cluster/acn/store/chunk?session={session}&index=0");
    assert_eq!(signed(from, to, "POST", &t, content.to_vec(), Some(sha(content))).await.0, 200);
    let mut commit = format!("/cluster/acn/store/commit?session={session}");
    if let Some(r) = replaces {
        commit.push_str(&format!("&replaces={r}"));
    }
    let (s, body, ..) = signed(from, to, "POST", &commit, Vec::new(), None).await;
    (s, json_of(&body))
}

#[tokio::test]
async fn bytes_that_just_landed_are_not_replaced_by_another_write_before_their_record_settles() {
    let (_root, a, b, b_id, folder, vol) = two_nodes().await;

    // Two first writes of one path race to one volume; no record of either exists yet.
    let (s, v) = upload(&a, &b_id, &vol, "/docs/race.bin", b"first writer", None).await;
    assert_eq!(s, 200, "{v}");
    let started = std::time::Instant::now();
    let (s, v) = upload(&a, &b_id, &vol, "/docs/race.bin", b"second writer", None).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("write_conflict")), "{v}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1_500), "the second waited for the first to settle");
    assert_eq!(std::fs::read(folder.join("docs").join("race.bin")).unwrap(), b"first writer");
    let parts = std::fs::read_dir(folder.join("docs"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".part-"))
        .count();
    assert_eq!(parts, 0, "the refused upload leaves no part file");
    // The same bytes again are no conflict.
    let (s, v) = upload(&a, &b_id, &vol, "/docs/race.bin", b"first writer", None).await;
    assert_eq!(s, 200, "{v}");

    // Once a file's record lists the copy, only a write that knew its content replaces it: a
    // first write that raced it does not, even after the wait.
    let (s, v) = api(&b, "PUT", "/v1/files/docs/kept.bin", Value::String("kept".into())).await;
    assert_eq!(s, 200, "{v}");
    let kept = std::fs::read(folder.join("docs").join("kept.bin")).unwrap();
    let (s, v) = upload(&a, &b_id, &vol, "/docs/kept.bin", b"a racing first write", None).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("write_conflict")), "{v}");
    assert_eq!(std::fs::read(folder.join("docs").join("kept.bin")).unwrap(), kept, "the recorded copy is kept");
    let (s, v) = upload(&a, &b_id, &vol, "/docs/kept.bin", b"an overwrite", Some(&sha(&kept))).await;
    assert_eq!(s, 200, "an overwrite that knew the content lands: {v}");
    assert_eq!(std::fs::read(folder.join("docs").join("kept.bin")).unwrap(), b"an overwrite");
}

/// Send `head` (a whole request head, no body) as written, byte for byte; the status.
async fn raw_status(addr: &str, head: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), sock.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Issue 17 "Hostile input": every spelling of a path that leaves its folder, on `/v1/files`
/// (as sent on the wire, undecoded) and on `store/*` (in a signed body or query), is refused
/// with a 4xx and writes or reads nothing outside the volume. A spelling that is only an odd
/// name (full-width dots) may land, but inside the volume.
#[tokio::test]
async fn path_traversal_spellings_are_refused_on_files_and_store() {
    let (root, a, b, b_id, folder, vol) = two_nodes().await;
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"do not read").unwrap();
    let token = b.shared().admin_token.clone();
    let traversals = [
        "../outside/x",
        "a/../../outside/x",
        "%2e%2e/outside/x",
        "%2E%2E%2Foutside%2Fx",
        "..%2foutside%2fx",
        "..%5coutside%5cx",
        "a/%2e%2e/%2e%2e/outside/x",
        "%2e%2e%2f%2e%2e%2foutside%2fsecret",
        ".%2e/outside/x",
        "x%00.txt",
        "%c0%ae%c0%ae/outside/x",
        "a/b/%2e%2e%2f%2e%2e%2f%2e%2e%2foutside/x",
        "a//..//..//outside/x",
        "..\\outside\\x",
    ];
    for t in traversals {
        for method in ["PUT", "GET", "DELETE"] {
            let body = if method == "PUT" { "content-length: 1\r\n\r\nx" } else { "\r\n" };
            let head = format!("{method} /v1/files/{t} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n{body}");
            let s = raw_status(&b.local_addr, &head).await;
            assert!((400..500).contains(&s), "{method} /v1/files/{t} answered {s}");
        }
    }
    let odd = "%EF%BC%8E%EF%BC%8E/x";
    let head = format!("PUT /v1/files/{odd} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-length: 1\r\nconnection: close\r\n\r\nx");
    let s = raw_status(&b.local_addr, &head).await;
    assert!(s < 500, "a full-width name answered {s}");

    // store/*: the same spellings, decoded, in a signed begin body and in signed queries.
    for t in traversals {
        // An overlong encoding decodes to U+FFFD names: odd, but no traversal (what it writes
        // is checked below to land nowhere outside).
        if t.starts_with("%c0") {
            continue;
        }
        let decoded = shoal_core::storage::transfer::decode_query_value(t);
        for path in [format!("/{decoded}"), decoded.clone()] {
            let begin = json!({"volumeId": vol, "path": path, "size": 1, "checksum": sha(b"x"), "fileId": "f-evil"});
            let (s, body, ..) =
                signed(&a, &b_id, "POST", "/cluster/acn/store/begin", serde_json::to_vec(&begin).unwrap(), None).await;
            assert!((400..500).contains(&s), "store/begin {path:?}: {s} {}", String::from_utf8_lossy(&body));
        }
        for (method, op) in [("GET", "read"), ("GET", "stat"), ("GET", "checksum"), ("GET", "list"), ("POST", "mkdir")]
        {
            let target = format!("/cluster/acn/store/{op}?volume={vol}&path=/{t}");
            let (s, body, ..) = signed(&a, &b_id, method, &target, Vec::new(), None).await;
            assert!((400..500).contains(&s), "{target}: {s} {}", String::from_utf8_lossy(&body));
            assert!(!String::from_utf8_lossy(&body).contains("do not read"), "{target} read outside");
        }
    }
    let mut left: Vec<_> = std::fs::read_dir(&outside).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, vec![std::ffi::OsString::from("secret")], "something was written outside the volume");
    assert!(!root.path().join("x").exists() && !root.path().join("x.txt").exists());
    assert!(folder.is_dir());
    a.shutdown().await;
    b.shutdown().await;
}

/// `store/put` of `content` at `path` on `vol` of node `to` in one signed request, naming
/// `size` and `checksum` as given; status and answer.
async fn put_whole(
    from: &Daemon<TokioEnv>,
    to: &NodeId,
    vol: &str,
    path: &str,
    content: &[u8],
    size: usize,
    checksum: &str,
) -> (u16, Value) {
    let t = format!("/cluster/acn/store/put?volume={vol}&path={path}&size={size}&checksum={checksum}");
    let (s, body, ..) = signed(from, to, "POST", &t, content.to_vec(), None).await;
    (s, json_of(&body))
}

/// A copy of one chunk or less travels in one signed `store/put`: it lands (fsynced, renamed
/// into place) only when the body is whole and its SHA-256 is the named one, never over bytes
/// that just landed for another write, and never outside the volume.
#[tokio::test]
async fn a_small_copy_lands_in_one_signed_put_only_when_its_bytes_match() {
    let (_root, a, b, b_id, folder, vol) = two_nodes().await;
    let content = b"a small file in one request".to_vec();
    let parts = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter(|e| {
                    let name = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
                    name.contains(".part-") && !name.contains(".part-kept-")
                })
                .count()
            })
            .unwrap_or(0)
    };

    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/one.txt", &content, content.len(), &sha(&content)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["checksum"].as_str(), Some(sha(&content).as_str()));
    assert_eq!(std::fs::read(folder.join("docs").join("one.txt")).unwrap(), content);

    // Bytes that are not the named file, a size that is not the body's, more than one chunk,
    // a malformed checksum or a missing field: refused, nothing lands, no part file is left.
    let other = b"other bytes".to_vec();
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/two.txt", &other, other.len(), &sha(&content)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("checksum_mismatch")), "{v}");
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/two.txt", &other, other.len() + 1, &sha(&other)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_body")), "{v}");
    let big = vec![7u8; 4 * MIB + 1];
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/two.txt", &big, big.len(), &sha(&big)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (413, Some("body_too_large")), "{v}");
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/two.txt", &other, other.len(), "xyz").await;
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("bad_checksum")), "{v}");
    let t = format!("/cluster/acn/store/put?volume={vol}&path=/docs/two.txt");
    let (s, ..) = signed(&a, &b_id, "POST", &t, other.clone(), None).await;
    assert_eq!(s, 400, "size and checksum are needed");
    let (s, v) = put_whole(&a, &b_id, "no-such-volume", "/docs/two.txt", &other, other.len(), &sha(&other)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (404, Some("unknown_volume")), "{v}");
    let (s, _) = put_whole(&a, &b_id, &vol, "/../escape.txt", &other, other.len(), &sha(&other)).await;
    assert!((400..500).contains(&s), "a path out of the volume: {s}");
    assert!(!folder.join("docs").join("two.txt").exists() && !folder.parent().unwrap().join("escape.txt").exists());
    assert_eq!(parts(&folder.join("docs")), 0, "no part file is left");

    // Another write's bytes that just landed at the path are not replaced by a racing first
    // write; once a record lists a copy, an overwrite that names the content it replaces lands.
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/one.txt", &other, other.len(), &sha(&other)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("write_conflict")), "{v}");
    assert_eq!(std::fs::read(folder.join("docs").join("one.txt")).unwrap(), content);
    let (s, v) = api(&b, "PUT", "/v1/files/docs/kept.bin", Value::String("kept".into())).await;
    assert_eq!(s, 200, "{v}");
    let kept = std::fs::read(folder.join("docs").join("kept.bin")).unwrap();
    let (s, v) = put_whole(&a, &b_id, &vol, "/docs/kept.bin", &other, other.len(), &sha(&other)).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("write_conflict")), "a racing first write: {v}");
    let t = format!(
        "/cluster/acn/store/put?volume={vol}&path=/docs/kept.bin&size={}&checksum={}&replaces={}",
        other.len(),
        sha(&other),
        sha(&kept)
    );
    let (s, body, ..) = signed(&a, &b_id, "POST", &t, other.clone(), None).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(std::fs::read(folder.join("docs").join("kept.bin")).unwrap(), other);
    assert_eq!(parts(&folder.join("docs")), 0);
    // The bytes it replaced are kept aside until a record settles the overwrite.
    let aside = format!("kept.bin.part-kept-{}", sha(&kept));
    assert_eq!(std::fs::read(folder.join("docs").join(aside)).unwrap(), kept);
    a.shutdown().await;
    b.shutdown().await;
}
