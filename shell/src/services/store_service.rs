//! The byte-moving half of the chunked transfer protocol (spec: "Chunked transfer";
//! reference-facts.md "Chunked store/*"): `store/begin`, `chunk`, `commit`, `abort`, `read`,
//! `stat`, `checksum`, `list` and `mkdir` under `/cluster/acn/`, answered by the shell after the
//! core has verified the request's signature (only members reach them). Rules (chunk sizes,
//! sessions, paths) come from `shoal_core::storage::transfer`; `delete` and `rename` are
//! `crate::services::replication`'s, `place` the core's.
//!
//! Uploads write `<path>.part-<session>` inside the volume; the whole-file SHA-256 is taken as
//! chunks arrive in order ([`InOrderHash`]), and at commit the part file is fsynced, checked and
//! renamed into place through [`Landed::land`]. A session is resumable (same volume, path, size
//! and checksum) and expires after 30 minutes idle. A path can never leave its volume: it is
//! normalised, and every directory it passes through is resolved and checked to lie inside
//! the volume's folder (no `..`, no symlink escape).
//!
//! [`Landed`] remembers bytes put in place that the records may not account for yet, and keeps
//! other writes, deletes and renames off them meanwhile.

use crate::disk::hash::FileHash;
use crate::disk::{confined_path, file_sha, read_at, write_at};
use crate::env::Env;
use crate::node::handle::Shared;
use crate::node::state::{InOrderHash, Landed, StoreService, WriteConflict, WriteGuard};
use crate::sync::lock;
use crate::wire::error::error_response;
use crate::wire::{CHUNK_SHA_HEADER, FILE_SIZE_HEADER};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use shoal_core::node::ApiError;
use shoal_core::storage::placement::{fits, writable};
use shoal_core::storage::transfer::{self, TransferError, UploadSession};
use shoal_core::{FileId, NodeId, VolumeId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

impl StoreService {
    /// Whether anything may still be writing to `volume`: a write under way, an upload session
    /// not expired, or bytes landed there that the records do not account for yet. A volume
    /// is retired only when none.
    pub fn busy_with<E: Env>(&self, s: &Arc<Shared<E>>, volume: &VolumeId) -> bool {
        let now = shoal_core::Millis(s.env.monotonic().0);
        if lock(&self.writers).contains_key(volume) || lock(&self.sessions).book.live_on(volume, now) {
            return true;
        }
        s.with_node(|n, now| n.landed_on_volume(now, volume))
    }
}

fn transfer_error(e: TransferError) -> Response {
    error_response(crate::wire::error::status_of(e.kind()), "bad_transfer", e.to_string())
}

fn io_error(what: &str, e: std::io::Error) -> Response {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return error_response(507, "insufficient_storage", format!("{what}: {e}"));
    }
    error_response(500, "io", format!("{what}: {e}"))
}

/// `a=1&b=x%2Fy` into a map, percent-decoded.
pub fn parse_query(q: &str) -> BTreeMap<String, String> {
    let decode = transfer::decode_query_value;
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn api_error(e: ApiError) -> Response {
    crate::wire::error::api_error_response(e)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BeginBody {
    volume_id: VolumeId,
    path: String,
    size: u64,
    checksum: String,
    #[serde(default)]
    file_id: FileId,
}

fn sha_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A `store/*` or `repl/*` request body's SHA-256 (its signature's body hash), and for a chunk
/// of an upload whose whole-file hash stands at that chunk, that hash advanced over it in the
/// same pass ([`crate::disk::hash`]), for [`InOrderHash::offer`] once the chunk checks out.
pub struct BodyDigest {
    pub sha: String,
    file: Option<(u64, FileHash)>,
}

impl BodyDigest {
    /// The body's SHA-256 alone.
    pub fn of(body: &[u8]) -> BodyDigest {
        BodyDigest { sha: sha_hex(body), file: None }
    }
}

/// Hash a body before its signature is checked (module doc of [`crate::disk::hash`]). The
/// whole-file hash it may advance is a copy: nothing of the session moves until the request is
/// verified and the chunk written.
pub fn digest_body<E: Env>(s: &Shared<E>, op: &str, query: &str, body: &[u8]) -> BodyDigest {
    if op == "chunk" {
        let q = parse_query(query);
        if let (Some(id), Some(index)) = (q.get("session"), q.get("index").and_then(|i| i.parse::<u64>().ok())) {
            let hash = lock(&s.store_service.sessions).hashes.get(id).cloned();
            if let Some(mut file) = hash.and_then(|h| lock(&h).at(index)) {
                let sha = hex::encode(file.update_with_chunk_sum(body));
                return BodyDigest { sha, file: Some((index, file)) };
            }
        }
    }
    BodyDigest::of(body)
}

/// Answer one `store/*` request from verified member `sender`.
#[allow(clippy::too_many_arguments)]
pub async fn handle<E: Env>(
    s: &Arc<Shared<E>>,
    op: &str,
    method: &str,
    query: &str,
    headers: &HeaderMap,
    body: Bytes,
    digest: BodyDigest,
    sender: NodeId,
) -> Response {
    let q = parse_query(query);
    let want = match op {
        "begin" | "chunk" | "commit" | "abort" | "mkdir" | "put" => "POST",
        "read" | "stat" | "checksum" | "list" => "GET",
        _ => return error_response(404, "not_found", format!("no such store endpoint: {op}")),
    };
    if !method.eq_ignore_ascii_case(want) {
        return error_response(405, "method_not_allowed", format!("store/{op} takes {want}"));
    }
    // Another write's bytes that just landed at this path get a moment to settle before a
    // commit or a `store/put` lands these.
    let landing = match op {
        "commit" => q.get("session").and_then(|id| {
            let sessions = lock(&s.store_service.sessions);
            let u = sessions.book.get(id, &sender).ok()?;
            let sum = if u.checksum.is_empty() { q.get("checksum")?.clone() } else { u.checksum.clone() };
            Some((u.volume.clone(), u.path.clone(), sum))
        }),
        "put" => {
            let path = q.get("path").and_then(|p| shoal_core::meta::namespace::normalize(p).ok());
            let volume = q.get("volume").map(|v| VolumeId::new(v.as_str()));
            volume.zip(path).zip(q.get("checksum")).map(|((v, p), sum)| (v, p, sum.clone()))
        }
        _ => None,
    };
    if let Some((volume, path, sum)) = landing {
        if let Some(dest) = copy_path(s, &volume, &path) {
            let replaces = q.get("replaces").map(String::as_str);
            s.store_service.landed.wait_settled(s, &volume, &path, &sum, replaces, &dest).await;
        }
    }
    let s2 = s.clone();
    let headers = headers.clone();
    let op = op.to_string();
    s.blocking(move || answer(&s2, &op, &q, &headers, body, digest, &sender)).await
}

/// `store/put?volume=&path=&size=&checksum=[&replaces=]`: a whole copy of one chunk or less
/// in one signed request (begin, the one chunk and commit in one). The body's SHA-256, taken
/// once for the signature, must be the file's `checksum`; the bytes go to a part file, are
/// fsynced and renamed into place through [`Landed::land`], as at commit.
fn put_whole<E: Env>(s: &Arc<Shared<E>>, q: &BTreeMap<String, String>, body: Bytes, body_sha: &str) -> Response {
    let (Some(volume), Some(path), Some(size), Some(checksum)) = (
        q.get("volume"),
        q.get("path"),
        q.get("size").and_then(|v| v.parse::<u64>().ok()),
        q.get("checksum").map(|c| c.to_ascii_lowercase()),
    ) else {
        return error_response(400, "bad_query", "put needs volume=, path=, size= and checksum=");
    };
    if let Err(e) = transfer::check_checksum(&checksum) {
        return error_response(400, "bad_checksum", e.to_string());
    }
    if size > transfer::CHUNK_BYTES {
        let why = format!("store/put takes a file of at most one chunk ({} bytes)", transfer::CHUNK_BYTES);
        return error_response(413, "body_too_large", why);
    }
    if body.len() as u64 != size {
        return error_response(400, "bad_body", format!("the body is {} bytes, not {size}", body.len()));
    }
    if body_sha != checksum {
        return error_response(409, "checksum_mismatch", "the body does not match its SHA-256; send it again");
    }
    let path = match shoal_core::meta::namespace::normalize(path) {
        Ok(p) => p,
        Err(e) => return error_response(400, "bad_path", e.to_string()),
    };
    let Some(vol) = s.read_node(|n, _| n.local_volume(volume)) else {
        return error_response(404, "unknown_volume", format!("volume {volume} is not on this node"));
    };
    if !writable(&vol) {
        return error_response(
            409,
            "volume_read_only",
            "the volume takes no new copies (read-only, low on space or evacuating)",
        );
    }
    if !fits(&vol, size) {
        return error_response(507, "insufficient_storage", "the volume has no room for this file");
    }
    let file = match confined_path(Path::new(&vol.subpath), &path, true) {
        Ok(f) => f,
        Err(e) => return api_error(e),
    };
    let writing = s.store_service.writing(&vol.id, Path::new(&vol.subpath));
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let part = file.with_file_name(transfer::part_file_name(&name, &session_id(s)));
    let written = std::fs::File::create(&part).and_then(|mut f| {
        std::io::Write::write_all(&mut f, &body)?;
        writing.sync(&f)
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&part);
        return io_error("write copy", e);
    }
    let replaces = q.get("replaces").map(String::as_str);
    if let Some(refused) = land_part(s, &writing, &path, &checksum, replaces, &part, &file) {
        return refused;
    }
    axum::Json(json!({"ok": true, "volumeId": vol.id, "path": path, "size": size, "checksum": checksum}))
        .into_response()
}

/// Rename a fsynced, checked part file into place at `file` through [`Landed::land`] (the
/// part file is removed if it does not land), then fsync the folder: the end of a commit and of
/// a `store/put`, on the volume `writing` is under way on. Answers the refusal when the bytes
/// did not land.
fn land_part<E: Env>(
    s: &Arc<Shared<E>>,
    writing: &WriteGuard,
    path: &str,
    sum: &str,
    replaces: Option<&str>,
    part: &Path,
    file: &Path,
) -> Option<Response> {
    let volume = writing.volume();
    let refused =
        match s.store_service.landed.land(s, volume, path, sum, replaces, file, || std::fs::rename(part, file)) {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(io_error("rename into place", e)),
            Err(conflict) => Some(api_error(conflict.api_error())),
        };
    if refused.is_some() {
        let _ = std::fs::remove_file(part);
        return refused;
    }
    if let Err(e) = s.store_service.landed.sync_name_or_take_back(s, writing, path, sum, file) {
        return Some(io_error("sync folder", e));
    }
    None
}

fn session_id<E: Env>(s: &Shared<E>) -> String {
    format!("{:016x}", s.env.seed())
}

fn answer<E: Env>(
    s: &Arc<Shared<E>>,
    op: &str,
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
    digest: BodyDigest,
    sender: &NodeId,
) -> Response {
    let svc = &s.store_service;
    let body_sha = digest.sha.as_str();
    let now = shoal_core::Millis(s.env.monotonic().0);
    match op {
        "begin" => {
            let b: BeginBody = match serde_json::from_slice(&body) {
                Ok(b) => b,
                Err(e) => return error_response(400, "bad_body", format!("begin body: {e}")),
            };
            let Some(vol) = s.read_node(|n, _| n.local_volume(b.volume_id.as_str())) else {
                return error_response(404, "unknown_volume", format!("volume {} is not on this node", b.volume_id));
            };
            if !writable(&vol) {
                return error_response(
                    409,
                    "volume_read_only",
                    "the volume takes no new copies (read-only, low on space or evacuating)",
                );
            }
            let path = match shoal_core::meta::namespace::normalize(&b.path) {
                Ok(p) => p,
                Err(e) => return error_response(400, "bad_path", e.to_string()),
            };
            let mut sessions = lock(&svc.sessions);
            for x in sessions.book.sweep(now) {
                sessions.hashes.remove(&x.id);
                // The part file lies in the expired session's own volume.
                if let Some(v) = s.read_node(|n, _| n.local_volume(x.volume.as_str())) {
                    if let Ok(p) = confined_path(Path::new(&v.subpath), &x.path, false) {
                        let _ = std::fs::remove_file(part_of(&p, &x));
                    }
                }
            }
            if let Some(u) = sessions.book.resume(now, sender, &b.volume_id, &path, b.size, &b.checksum) {
                return axum::Json(json!({"sessionId": u.id, "have": u.have})).into_response();
            }
            if !fits(&vol, b.size) {
                return error_response(507, "insufficient_storage", "the volume has no room for this file");
            }
            if let Err(e) = sessions.book.check_room() {
                return error_response(crate::wire::error::status_of(e.kind()), "busy", e.to_string());
            }
            let session = match UploadSession::new(session_id(s), b.volume_id, path, b.size, b.checksum, b.file_id, now)
            {
                Ok(x) => x,
                Err(e) => return transfer_error(e),
            };
            let file = match confined_path(Path::new(&vol.subpath), &session.path, true) {
                Ok(f) => f,
                Err(e) => return api_error(e),
            };
            let part = part_of(&file, &session);
            let created = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&part)
                .and_then(|f| f.set_len(session.size));
            if let Err(e) = created {
                return io_error("create part file", e);
            }
            let reply = json!({"sessionId": session.id, "have": session.have});
            sessions.hashes.insert(session.id.clone(), Arc::new(Mutex::new(InOrderHash::new())));
            sessions.book.open(sender.clone(), session);
            axum::Json(reply).into_response()
        }
        "put" => put_whole(s, q, body, body_sha),
        "chunk" => {
            let (Some(id), Some(index)) = (q.get("session"), q.get("index").and_then(|i| i.parse::<u64>().ok())) else {
                return error_response(400, "bad_query", "chunk needs session= and index=");
            };
            let claimed = headers.get(CHUNK_SHA_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
            // The session is looked up and checked under the lock, but the bytes are written
            // without it, so chunks of one upload land in parallel.
            let (offset, volume, part_path, session, hash) = {
                let sessions = lock(&svc.sessions);
                let (Ok(sess), Some(hash)) = (sessions.book.get(id, sender), sessions.hashes.get(id)) else {
                    return error_response(404, "unknown_session", "no such upload session (expired?)");
                };
                let offset = match sess.check_chunk(now, index, body.len() as u64, claimed, body_sha) {
                    Ok(o) => o,
                    Err(e) => return transfer_error(e),
                };
                (offset, sess.volume.clone(), sess.path.clone(), sess.clone(), hash.clone())
            };
            let Some(vol) = s.read_node(|n, _| n.local_volume(volume.as_str())) else {
                return error_response(404, "unknown_volume", "the session's volume is gone");
            };
            let part = match confined_path(Path::new(&vol.subpath), &part_path, false) {
                Ok(f) => part_of(&f, &session),
                Err(e) => return api_error(e),
            };
            let written = write_at(&part, offset, &body);
            if let Err(e) = written {
                return io_error("write chunk", e);
            }
            // Hashed before it is marked: once no chunk is missing, all of them were offered.
            lock(&hash).offer(index, body, digest.file);
            let missing = lock(&svc.sessions).book.mark(id, index, now);
            match missing {
                Ok(missing) => axum::Json(json!({"ok": true, "missing": missing})).into_response(),
                Err(_) => error_response(404, "unknown_session", "the upload session ended meanwhile"),
            }
        }
        "commit" | "abort" => {
            let Some(id) = q.get("session") else { return error_response(400, "bad_query", "needs session=") };
            let mut sessions = lock(&svc.sessions);
            let (sess, hash) = match (sessions.book.get(id, sender), sessions.hashes.get(id)) {
                (Ok(u), Some(h)) => (u.clone(), h.clone()),
                _ => return error_response(404, "unknown_session", "no such upload session"),
            };
            if op == "commit" {
                if let Err(e) = sess.check_alive(now) {
                    return transfer_error(e);
                }
            }
            let Some(vol) = s.read_node(|n, _| n.local_volume(sess.volume.as_str())) else {
                sessions.remove(id);
                return error_response(404, "unknown_volume", "the session's volume is gone");
            };
            let file = match confined_path(Path::new(&vol.subpath), &sess.path, true) {
                Ok(f) => f,
                Err(e) => return api_error(e),
            };
            let part = part_of(&file, &sess);
            if op == "abort" {
                sessions.remove(id);
                let _ = std::fs::remove_file(&part);
                return axum::Json(json!({"ok": true})).into_response();
            }
            if sess.missing() > 0 {
                return transfer_error(TransferError::Incomplete(sess.missing()));
            }
            // The session is taken out, and the lock let go, before the fsync and the whole-file
            // hash: other uploads on this node go on meanwhile. The volume shows a write under
            // way until the bytes have landed (or not).
            let writing = svc.writing(&sess.volume, Path::new(&vol.subpath));
            sessions.remove(id);
            drop(sessions);
            let hashed = lock(&hash).finish(transfer::chunk_count(sess.size));
            let sum = std::fs::File::open(&part).and_then(|mut f| {
                writing.sync(&f)?;
                match hashed {
                    Some(sum) => Ok(sum),
                    None => file_sha(&mut f),
                }
            });
            let sum = match sum {
                Ok(x) => x,
                Err(e) => {
                    let _ = std::fs::remove_file(&part);
                    return io_error("read part file", e);
                }
            };
            // The whole-file SHA-256 named at begin, or (for a streamed upload) at commit.
            let want = if sess.checksum.is_empty() {
                match q.get("checksum").map(|c| (transfer::check_checksum(c), c)) {
                    Some((Ok(()), c)) => c.to_ascii_lowercase(),
                    _ => {
                        let _ = std::fs::remove_file(&part);
                        return error_response(
                            400,
                            "bad_checksum",
                            "this upload names its SHA-256 at commit (checksum=)",
                        );
                    }
                }
            } else {
                sess.checksum.clone()
            };
            if !sum.eq_ignore_ascii_case(&want) {
                let _ = std::fs::remove_file(&part);
                return error_response(
                    409,
                    "checksum_mismatch",
                    "the uploaded file does not match its SHA-256; upload it again",
                );
            }
            let replaces = q.get("replaces").map(String::as_str);
            if let Some(refused) = land_part(s, &writing, &sess.path, &sum, replaces, &part, &file) {
                return refused;
            }
            axum::Json(
                json!({"ok": true, "volumeId": sess.volume, "path": sess.path, "size": sess.size, "checksum": sum}),
            )
            .into_response()
        }
        _ => {
            let (Some(volume), Some(path)) = (q.get("volume"), q.get("path")) else {
                return error_response(400, "bad_query", "needs volume= and path=");
            };
            let Some(vol) = s.read_node(|n, _| n.local_volume(volume)) else {
                return error_response(404, "unknown_volume", format!("volume {volume} is not on this node"));
            };
            let is_root = shoal_core::meta::namespace::normalize(path).is_ok_and(|p| p == "/");
            let file = if op == "list" && is_root {
                match std::fs::canonicalize(&vol.subpath) {
                    Ok(f) => f,
                    Err(e) => return io_error("volume folder", e),
                }
            } else {
                match confined_path(Path::new(&vol.subpath), path, op == "mkdir") {
                    Ok(f) => f,
                    Err(e) => return api_error(e),
                }
            };
            match op {
                "mkdir" => match std::fs::create_dir_all(&file) {
                    Ok(()) => axum::Json(json!({"ok": true})).into_response(),
                    Err(e) => io_error("mkdir", e),
                },
                "list" => match std::fs::read_dir(&file) {
                    Ok(rd) => {
                        let mut entries: Vec<serde_json::Value> = rd
                            .filter_map(|e| e.ok())
                            .filter_map(|e| {
                                let name = e.file_name().into_string().ok()?;
                                if name.contains(transfer::PART_MARK) {
                                    return None; // uploads in progress are not files yet
                                }
                                let md = e.metadata().ok()?;
                                Some(json!({"name": name, "isDir": md.is_dir(), "size": if md.is_dir() { 0 } else { md.len() }}))
                            })
                            .collect();
                        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                        axum::Json(json!({ "entries": entries })).into_response()
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        error_response(404, "not_found", "no such folder")
                    }
                    Err(e) => io_error("list", e),
                },
                "stat" => match std::fs::metadata(&file) {
                    Ok(m) if m.is_file() => {
                        let mod_ms = m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|d| d.as_millis() as u64);
                        axum::Json(json!({"exists": true, "size": m.len(), "modTime": mod_ms})).into_response()
                    }
                    _ => axum::Json(json!({"exists": false})).into_response(),
                },
                "checksum" => match std::fs::File::open(&file).and_then(|mut f| file_sha(&mut f)) {
                    Ok(sum) => axum::Json(json!({"checksum": sum})).into_response(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        error_response(404, "not_found", "no such copy")
                    }
                    Err(e) => io_error("checksum", e),
                },
                _ => {
                    let offset = q.get("offset").and_then(|o| o.parse::<u64>().ok()).unwrap_or(0);
                    let length = q.get("length").and_then(|o| o.parse::<u64>().ok()).unwrap_or(transfer::CHUNK_BYTES);
                    if let Err(e) = transfer::check_read(length) {
                        return transfer_error(e);
                    }
                    let read = match read_at(&file, offset, length) {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            // A moved copy whose rename has not run is still at its old path.
                            let (cluster_path, vid) =
                                (shoal_core::meta::namespace::normalize(path).ok(), VolumeId::new(volume));
                            let moved = cluster_path.as_ref().map(|p| {
                                s.read_node(|n, _| (n.moved_copy_source(p, &vid), n.copy_move_pending(p, &vid)))
                            });
                            match moved {
                                Some((Some(from), _)) => match confined_path(Path::new(&vol.subpath), &from, false) {
                                    Ok(old) => read_at(&old, offset, length),
                                    Err(e) => return api_error(e),
                                },
                                Some((None, true)) => {
                                    return error_response(
                                        409,
                                        "rename_pending",
                                        "this copy is still at the path it was moved from, waiting to be renamed; try again shortly",
                                    )
                                }
                                _ => Err(e),
                            }
                        }
                        read => read,
                    };
                    match read {
                        Ok((size, buf)) => {
                            let sha = sha_hex(&buf);
                            ([(CHUNK_SHA_HEADER, sha), (FILE_SIZE_HEADER, size.to_string())], buf).into_response()
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            error_response(404, "not_found", "no such copy")
                        }
                        Err(e) => io_error("read", e),
                    }
                }
            }
        }
    }
}

/// Where the copy of cluster `path` on this node's `volume` lies on disk, if it can.
pub fn copy_path<E: Env>(s: &Shared<E>, volume: &VolumeId, path: &str) -> Option<PathBuf> {
    let vol = s.read_node(|n, _| n.local_volume(volume.as_str()))?;
    confined_path(Path::new(&vol.subpath), path, false).ok()
}

fn part_of(file: &Path, s: &UploadSession) -> PathBuf {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    file.with_file_name(transfer::part_file_name(&name, &s.part_tag()))
}

/// Before an overwrite lands at `dest`, keep the bytes there (the content `replaces`, which the
/// records name as this copy's) under their kept name, a hard link in the same folder, so a put
/// whose record never comes leaves them to be put back (`shoal_core::storage::landed`, "Kept
/// bytes"). The link's name is made durable by the folder fsync that follows the landing.
/// Returns the checksum kept and, when this call made the link, its path (an earlier overwrite
/// of the same content may have kept them already). Nothing is kept when `dest` holds no file,
/// the kept name would be too long, or the file system refuses hard links (logged: such an
/// overwrite is as safe as the put's publish).
fn keep_aside(dest: &Path, replaces: &str) -> Option<(String, Option<PathBuf>)> {
    let md = dest.symlink_metadata().ok().filter(|m| m.is_file())?;
    let name = dest.file_name()?.to_str()?;
    let sum = replaces.to_ascii_lowercase();
    let link = dest.with_file_name(transfer::kept_file_name(name, &sum)?);
    match std::fs::hard_link(dest, &link) {
        Ok(()) => Some((sum, Some(link))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some((sum, None)),
        Err(e) => {
            tracing::warn!(path = %dest.display(), size = md.len(), error = %e, "could not keep the bytes an overwrite replaces");
            None
        }
    }
}

/// How long a landing waits for another write's bytes at its path to settle.
const SETTLE_WAIT_MS: u64 = 2_000;

impl Landed {
    /// Put bytes with `checksum` at `dest` (cluster `path` on `volume`) by `place` (a rename),
    /// written by someone who knew the path's content as `replaces` (none: a first write),
    /// unless [`Landed::refuses`] says no.
    #[allow(clippy::too_many_arguments)]
    pub fn land<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        replaces: Option<&str>,
        dest: &Path,
        place: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<std::io::Result<()>, WriteConflict> {
        let _one_at_a_time = lock(&self.landing);
        if self.refuses(s, volume, path, checksum, replaces, dest) {
            return Err(WriteConflict);
        }
        let kept = replaces.filter(|r| !r.eq_ignore_ascii_case(checksum)).and_then(|r| keep_aside(dest, r));
        let placed = place();
        match (&placed, kept) {
            (Ok(()), kept) => s.with_node(|n, now| {
                n.landed_note(now, volume, path, checksum);
                if let Some((sum, _)) = kept {
                    n.kept_note(volume, path, &sum);
                }
            }),
            // Nothing landed: the link made for it goes (one made by an earlier overwrite stays).
            (Err(_), Some((_, Some(link)))) => {
                let _ = std::fs::remove_file(link);
            }
            (Err(_), _) => {}
        }
        Ok(placed)
    }

    /// Whether bytes with `checksum` must not replace the file at `dest` now
    /// (`Node::landed_refuses`).
    pub fn refuses<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        replaces: Option<&str>,
        dest: &Path,
    ) -> bool {
        let occupied = dest.symlink_metadata().is_ok();
        s.with_node(|n, now| n.landed_refuses(now, volume, path, checksum, replaces, occupied))
    }

    /// Wait (a little) until [`Landed::refuses`] lets these bytes land, say as records catch up.
    pub async fn wait_settled<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        replaces: Option<&str>,
        dest: &Path,
    ) {
        s.wait_for(SETTLE_WAIT_MS, |n, now| {
            let occupied = dest.symlink_metadata().is_ok();
            !n.landed_refuses(now, volume, path, checksum, replaces, occupied)
        })
        .await;
    }

    /// Run `act` (a delete or rename of copies at `paths` on `volume`, whose folder is `folder`)
    /// unless bytes landed at one of them that the records do not account for yet; checked and
    /// done under the landing lock, so no landing slips in between. `None` when it was not done.
    /// Bytes this node's last run may have landed there are hashed and noted first
    /// ([`Landed::recover`]). Runs blocking file I/O: call it on the blocking pool.
    pub fn unless_unsettled<E: Env, R>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        folder: &Path,
        paths: &[&str],
        act: impl FnOnce() -> R,
    ) -> Option<R> {
        for p in paths {
            self.recover(s, volume, folder, p);
        }
        self.unless_noted(s, volume, paths, act)
    }

    /// Run `act` unless bytes noted as landed at one of `paths` on `volume` are unsettled, under
    /// the landing lock, without looking for bytes from before this start first: for a rescan's
    /// checks that only ever add or restore a copy of the content the records name, or mark one
    /// stale (an adoption recovers first, through [`Landed::recover`]).
    pub fn unless_noted<E: Env, R>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        paths: &[&str],
        act: impl FnOnce() -> R,
    ) -> Option<R> {
        let _one_at_a_time = lock(&self.landing);
        if paths.iter().any(|p| self.unsettled(s, volume, p)) {
            return None;
        }
        Some(act())
    }

    /// The landed registry is in memory: bytes at `path` that this node's last run may have
    /// landed, their record not seen yet (`Node::landed_unknown`), are hashed and noted as
    /// landed at their mtime (`Node::landed_found`), so a delete, rename or adoption decided
    /// from older records leaves them alone until the records account for them. Hashed outside
    /// the landing lock: bytes landed meanwhile are noted by their landing and win.
    pub fn recover<E: Env>(&self, s: &Arc<Shared<E>>, volume: &VolumeId, folder: &Path, path: &str) {
        let Ok(file) = confined_path(folder, path, false) else { return };
        let Ok(md) = file.symlink_metadata() else { return };
        if !md.is_file() {
            return;
        }
        // Unreadable bytes are not what any record says: they stay until they age out.
        self.note_if_unknown(s, volume, path, crate::disk::mtime_ms(&md), || {
            std::fs::File::open(&file).and_then(|mut f| file_sha(&mut f)).unwrap_or_else(|_| "unreadable".into())
        });
    }

    /// [`Landed::recover`] for bytes modified at `mtime_ms` whose hash `sum` gives (called only
    /// when they must be noted; a rescan passes the hash it took already).
    pub fn note_if_unknown<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        path: &str,
        mtime_ms: u64,
        sum: impl FnOnce() -> String,
    ) {
        let Some(started) = *lock(&s.repl.started) else { return };
        let file_now = crate::disk::file_clock();
        if !s.read_node(|n, _| n.landed_unknown(volume, path, mtime_ms, started, file_now)) {
            return;
        }
        let sum = sum();
        tracing::info!(path, volume = %volume, "bytes from before this start found; noted until their record settles them");
        s.with_node(|n, now| n.landed_found(now, volume, path, &sum, mtime_ms, file_now));
    }

    /// Take back bytes with `checksum` that landed at `path` on `volume` and turned out to be
    /// no copy of anything (their record could not be published): `remove` runs only if they
    /// are still the last bytes landed there, and they are forgotten.
    pub fn take_back<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        volume: &VolumeId,
        path: &str,
        checksum: &str,
        remove: impl FnOnce(),
    ) {
        let _one_at_a_time = lock(&self.landing);
        if self.forget(s, volume, path, checksum) {
            remove();
        }
    }

    /// After bytes with `checksum` landed at `dest` (`path` on the volume `writing` writes to):
    /// make their name durable, or, when the folder's fsync fails, take them back (removed if
    /// still the last bytes landed there): a copy not durable under its name is no copy, and left
    /// in place a later rescan could count or adopt bytes whose put failed.
    pub fn sync_name_or_take_back<E: Env>(
        &self,
        s: &Arc<Shared<E>>,
        writing: &WriteGuard,
        path: &str,
        checksum: &str,
        dest: &Path,
    ) -> std::io::Result<()> {
        let Some(dir) = dest.parent() else { return Ok(()) };
        writing.sync_folder(dir).inspect_err(|_| {
            self.take_back(s, writing.volume(), path, checksum, || {
                let _ = std::fs::remove_file(dest);
            })
        })
    }

    /// Forget bytes with `checksum` landed at `path` on `volume` (their write gave up).
    pub fn forget<E: Env>(&self, s: &Arc<Shared<E>>, volume: &VolumeId, path: &str, checksum: &str) -> bool {
        s.with_node(|n, _| n.landed_forget(volume, path, checksum))
    }

    /// Whether bytes landed at `path` on `volume` that the records do not account for yet.
    pub fn unsettled<E: Env>(&self, s: &Arc<Shared<E>>, volume: &VolumeId, path: &str) -> bool {
        s.with_node(|n, now| n.landed_unsettled(now, volume, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_another_write_makes_meanwhile_is_taken() {
        let root = tempfile::tempdir().unwrap();
        for round in 0..30 {
            let threads: Vec<_> = (0..4)
                .map(|i| {
                    let r = root.path().to_path_buf();
                    std::thread::spawn(move || confined_path(&r, &format!("/r{round}/a/b/c/f{i}"), true))
                })
                .collect();
            for t in threads {
                let made = t.join().unwrap();
                assert!(made.is_ok(), "{:?}", made.err());
            }
        }
        std::fs::write(root.path().join("r0/a/file"), b"x").unwrap();
        let e = confined_path(root.path(), "/r0/a/file/g", true).unwrap_err();
        assert_eq!((e.kind, e.code), (shoal_core::node::ErrorKind::Conflict, "not_a_folder"));
    }

    #[test]
    fn aligned_chunks_are_written_direct_and_the_rest_buffered_with_the_same_bytes() {
        let root = tempfile::tempdir().unwrap();
        let part = root.path().join("f.part-0000000000000001");
        let len = 2 * (1 << 20) + 4096 + 17;
        std::fs::File::create(&part).unwrap().set_len(len as u64).unwrap();
        let content: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        // Out of order, like chunks in flight: two aligned 1 MiB pieces, an aligned 4 KiB one, a tail.
        for (at, n) in [(1 << 20, 1 << 20), (0, 1 << 20), (2 << 20, 4096), ((2 << 20) + 4096, 17)] {
            write_at(&part, at as u64, &content[at..at + n]).unwrap();
        }
        assert!(std::fs::read(&part).unwrap() == content);
        assert!(write_at(&root.path().join("missing"), 0, &content[..4096]).is_err(), "no such file is an error");
        // The same pieces from aligned buffers (written as they are, with no copy of their own).
        let again = root.path().join("g.part-0000000000000001");
        std::fs::File::create(&again).unwrap().set_len(len as u64).unwrap();
        for (at, n) in [(1 << 20, 1 << 20), (0, 1 << 20), (2 << 20, 4096), ((2 << 20) + 4096, 17)] {
            let mut piece = crate::disk::Piece::new(n);
            piece.fill(&content[at..at + n]);
            write_at(&again, at as u64, piece.as_ref()).unwrap();
        }
        assert!(std::fs::read(&again).unwrap() == content);

        // Reads: large aligned ones (direct), one running past the end, small ones (buffered).
        let size = len as u64;
        for (at, n) in [(0usize, 1usize << 21), (1 << 20, 1 << 22), (4096, 100), (len - 5, 1 << 20), (len + 9, 1 << 20)]
        {
            let (got_size, bytes) = read_at(&part, at as u64, n as u64).unwrap();
            assert_eq!(got_size, size);
            let want = &content[at.min(len)..(at + n).min(len)];
            assert!(bytes[..] == *want, "read of {n} at {at}: {} bytes", bytes.len());
        }
    }
}
