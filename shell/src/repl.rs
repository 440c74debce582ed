//! Keeping copies right (spec: "Replication", "Storage (ACS)"): the I/O half of the chores the
//! core schedules (`shoal_core::node::chores`) — sending the tasks of the leader's planner
//! passes, the workers that carry pulls out, this node's disk work, scrub hashing, rescans —
//! and `verify`. When each runs, and what it decides, is the core's; this module moves bytes
//! and reports back.
//!
//! - **Leader.** The core's planner pass (every 60 s, and at once after a put short of copies,
//!   a stale copy, a finished task, `repl run`) grants each task a 30 s lease and hands it here
//!   ([`send_task`]): a pull goes to its target node as `repl/task` (or runs here), a drop to
//!   the holder as `store/delete` with the leader's term.
//! - **Worker.** Checks the task comes from the leader of that term, renews its lease every
//!   10 s (`repl/renew`, which also lets a new leader adopt it), pulls the copy with
//!   `store/read` into a part file on its volume, checks the whole-file SHA-256, asks the core
//!   whether the file is still current, renames it into place, publishes a verified copy and
//!   reports `repl/done`.
//! - **Disk work** ([`run_chore`], every 10 s and when kicked): carries out
//!   [`Node::disk_actions`]: copies of removed files are deleted, copies of moved files renamed.
//! - **Scrub** ([`scrub_copy`]): hashes the copy the core picked; the core marks it verified or
//!   stale and paces the next one to `storage.scrub_rate` bytes/s on average.
//! - **Rescan** (every 30 min and on demand): files dropped into a volume folder are adopted,
//!   copies that vanished or changed are marked stale.
//!
//! [`Node::disk_actions`]: shoal_core::node::Node::disk_actions

use crate::disk::confined_path;
use crate::env::Env;
use crate::http_error::error_response;
use crate::node_handle::Shared;
use crate::peer::{read_piece, signed};
use crate::sync::lock;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_core::meta::records::LocationState;
use shoal_core::node::files::LocalCopy;
use shoal_core::node::files::{DiskAction, Source};
use shoal_core::node::replication::{PullCurrency, TaskReport};
use shoal_core::node::ApiError;
use shoal_core::storage::chores::Chore;
use shoal_core::storage::planner::{Action, InFlight, Task};
use shoal_core::storage::tasks::ReportError;
use shoal_core::storage::transfer::{self, CHUNK_BYTES};
use shoal_core::NodeId;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const TASK_RENEW_MS: u64 = 10_000;
/// How long a worker waits for its records to show the file of a task the leader sent.
const RECORDS_CATCH_UP_MS: u64 = 10_000;
const HASH_BLOCK: usize = 1 << 20;

/// Note when this process started (part files older than that are leftovers).
pub fn started<E: Env>(s: &Arc<Shared<E>>) {
    *lock(&s.repl.started) = Some(std::time::SystemTime::now());
}

/// Carry out a chore the core started ([`Output::Chore`]) and report its end.
///
/// [`Output::Chore`]: shoal_core::node::Output::Chore
pub async fn run_chore<E: Env>(s: Arc<Shared<E>>, chore: Chore) {
    match chore {
        Chore::Reconcile => reconcile_once(&s).await,
        Chore::Rescan => {
            let _ = rescan(&s).await;
        }
        Chore::Usage => measure_volumes(&s).await,
        Chore::Plan | Chore::Scrub => {}
    }
    s.with_node(|n, now| n.chore_done(now, chore));
}

/// Measure this node's volumes (off the node lock), then report.
async fn measure_volumes<E: Env>(s: &Arc<Shared<E>>) {
    let local = s.read_node(|n, _| n.local_volumes());
    let env = s.env.clone();
    let measured: Vec<_> = s
        .blocking(move || {
            local
                .into_iter()
                .map(|(id, folder)| {
                    let (free, total) = env.disk_usage(Path::new(&folder));
                    (id, total, free)
                })
                .collect()
        })
        .await;
    if !measured.is_empty() {
        s.with_node(|n, now| {
            for (id, total, free) in &measured {
                n.volume_usage(now, id, *total, *free);
            }
        });
    }
}

// ---- leader ----

/// The tasks this node dispatched that have not ended yet (on the leader).
pub fn in_flight<E: Env>(s: &Arc<Shared<E>>) -> Vec<InFlight> {
    s.read_node(|n, _| n.repl_in_flight())
}

/// Send a task the core's planner pass granted ([`Output::ReplDispatch`]); a drop or a refusal
/// ends it here, a pull ends when its worker reports.
///
/// [`Output::ReplDispatch`]: shoal_core::node::Output::ReplDispatch
pub async fn send_task<E: Env>(s: Arc<Shared<E>>, term: u64, task: Task) {
    let me = s.read_node(|n, _| n.id().clone());
    if let Some(ok) = dispatch(&s, &me, term, &task).await {
        s.with_node(|n, now| n.repl_finish(now, &task.file, &task.path, ok));
    }
}

/// Send one task on its way. `Some(ok)` when its outcome is known now (drops, refusals);
/// `None` when a worker took it and reports later.
async fn dispatch<E: Env>(s: &Arc<Shared<E>>, me: &NodeId, term: u64, task: &Task) -> Option<bool> {
    match &task.action {
        Action::Drop { node, volume } => {
            let req = json!({"volumeId": volume, "path": task.path, "term": term});
            if node == me {
                let r = delete_copy(s, me, &serde_json::to_vec(&req).unwrap_or_default()).await;
                return Some(r.is_ok());
            }
            let r = signed(s, node, "POST", "/cluster/acn/store/delete", req.to_string().into_bytes(), vec![]).await;
            Some(matches!(r, Ok(r) if r.status == 200))
        }
        Action::Pull { target_node, .. } => {
            let body = TaskBody { term, task: task.clone() };
            if target_node == me {
                let s2 = s.clone();
                let (leader, body2) = (me.clone(), body.clone());
                tokio::spawn(async move { work(&s2, leader, body2).await });
                return None;
            }
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            match signed(s, target_node, "POST", "/cluster/acn/repl/task", bytes, vec![]).await {
                Ok(r) if r.status == 202 || r.status == 200 => None,
                _ => Some(false),
            }
        }
    }
}

/// A worker's report on its task, from `sender` (this node itself when it is both).
fn take_report<E: Env>(s: &Arc<Shared<E>>, sender: &NodeId, b: &DoneBody, op: &str) -> Result<(), ReportError> {
    let report = if op == "renew" { TaskReport::Renew } else { TaskReport::Done { ok: b.ok } };
    let ended = s.with_node(|n, now| n.repl_report(now, sender, b.term, &b.task, report))?;
    if ended && !b.ok {
        tracing::warn!(path = %b.task.path, error = %b.error, "a replication task failed");
    }
    Ok(())
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TaskBody {
    term: u64,
    task: Task,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DoneBody {
    term: u64,
    task: Task,
    ok: bool,
    #[serde(default)]
    error: String,
}

/// `repl/task`, `repl/renew`, `repl/done` from verified member `sender`.
pub async fn handle_acn<E: Env>(s: &Arc<Shared<E>>, op: &str, body: &[u8], sender: NodeId) -> Response {
    match op {
        "task" => {
            let b: TaskBody = match serde_json::from_slice(body) {
                Ok(b) => b,
                Err(e) => return error_response(400, "bad_body", format!("task body: {e}")),
            };
            if !s.read_node(|n, now| n.is_leader_of(now, &sender, b.term)) {
                return error_response(409, "not_authorized", "the sender does not hold the lease of that term");
            }
            let s2 = s.clone();
            tokio::spawn(async move { work(&s2, sender, b).await });
            (axum::http::StatusCode::ACCEPTED, axum::Json(json!({"accepted": true}))).into_response()
        }
        "renew" | "done" => {
            let b: DoneBody = match serde_json::from_slice(body) {
                Ok(b) => b,
                Err(e) => return error_response(400, "bad_body", format!("{op} body: {e}")),
            };
            // The rules (who may report, only the task in flight counts, adoption on renew) are
            // the core's: `Node::repl_report`, `TaskLeases`.
            match take_report(s, &sender, &b, op) {
                Ok(()) => axum::Json(json!({"ok": true})).into_response(),
                Err(e) => {
                    let code = match e {
                        ReportError::NotLeader => "not_leader",
                        ReportError::NotAuthorized => "not_authorized",
                        ReportError::OtherInFlight | ReportError::NotInFlight => "not_in_flight",
                    };
                    error_response(409, code, e.to_string())
                }
            }
        }
        _ => error_response(404, "not_found", format!("no such repl endpoint: {op}")),
    }
}

/// Report to the leader (renew or done); a leader that is this node is told directly.
async fn report<E: Env>(s: &Arc<Shared<E>>, leader: &NodeId, op: &str, body: &DoneBody) {
    let me = s.read_node(|n, _| n.id().clone());
    if leader == &me {
        if let Err(e) = take_report(s, &me, body, op) {
            tracing::debug!(path = %body.task.path, op, error = %e, "own task report not taken");
        }
        return;
    }
    // The current leader may have changed; report to whoever holds the lease now.
    let to = s.read_node(|n, now| n.meta_leader(now)).map(|l| l.holder).unwrap_or_else(|| leader.clone());
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    if to == me {
        return Box::pin(report(s, &me, op, body)).await;
    }
    let _ = signed(s, &to, "POST", &format!("/cluster/acn/repl/{op}"), bytes, vec![]).await;
}

/// Carry out a pull task, renewing its lease while it runs.
async fn work<E: Env>(s: &Arc<Shared<E>>, leader: NodeId, b: TaskBody) {
    if !lock(&s.repl.running).insert(b.task.file.clone()) {
        return; // already at it
    }
    let renew = {
        let (s2, leader2) = (s.clone(), leader.clone());
        let body = DoneBody { term: b.term, task: b.task.clone(), ok: true, error: String::new() };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(TASK_RENEW_MS)).await;
                report(&s2, &leader2, "renew", &body).await;
            }
        })
    };
    let result = pull(s, &b.task).await;
    renew.abort();
    lock(&s.repl.running).remove(&b.task.file);
    let (ok, error) = match result {
        Ok(()) => (true, String::new()),
        Err(e) => {
            tracing::warn!(path = %b.task.path, error = %e.message, "pull failed");
            (false, e.message)
        }
    };
    report(s, &leader, "done", &DoneBody { term: b.term, task: b.task, ok, error }).await;
}

/// Pull one copy into this node's target volume and publish it.
async fn pull<E: Env>(s: &Arc<Shared<E>>, task: &Task) -> Result<(), ApiError> {
    let Action::Pull { source_node, source_volume, target_volume, .. } = &task.action else {
        return Err(ApiError::new(400, "bad_task", "not a pull"));
    };
    let vol = s
        .read_node(|n, _| n.local_volume(target_volume.as_str()))
        .ok_or_else(|| ApiError::new(404, "unknown_volume", "the target volume is not on this node"))?;
    if !shoal_core::storage::placement::writable(&vol) {
        return Err(ApiError::new(409, "volume_read_only", "the target volume takes no new copies"));
    }
    let src_folder = s.read_node(|n, _| n.local_volume(source_volume.as_str())).map(|v| v.subpath);
    let src = Source { node_id: source_node.clone(), volume_id: source_volume.clone(), folder: src_folder };
    let (folder, path) = (PathBuf::from(&vol.subpath), task.path.clone());
    let tag = format!("repl{:016x}", s.env.seed());
    let (dest, part) = s
        .blocking(move || {
            let dest = confined_path(&folder, &path, true)?;
            let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let part = dest.with_file_name(transfer::part_file_name(&name, &tag));
            Ok::<_, ApiError>((dest, part))
        })
        .await?;
    let result = async {
        let out = std::fs::File::create(&part).map_err(|e| io_api("create part file", e))?;
        let mut hash = Sha256::new();
        let mut at = 0u64;
        while at < task.size {
            let data = read_piece(s, &src, &task.path, at, (task.size - at).min(CHUNK_BYTES)).await?;
            if data.is_empty() {
                return Err(ApiError::new(502, "short_copy", "the source copy is shorter than the file"));
            }
            hash.update(&data);
            let (p, d) = (part.clone(), data.clone());
            s.blocking(move || crate::disk::write_at(&p, at, &d)).await.map_err(|e| io_api("write part file", e))?;
            at += data.len() as u64;
        }
        out.sync_all().map_err(|e| io_api("sync part file", e))?;
        if hex::encode(hash.finalize()) != task.checksum.to_ascii_lowercase() {
            return Err(ApiError::new(409, "checksum_mismatch", "the source copy does not match the file's checksum"));
        }
        if s.store_service.landed.unsettled(s, target_volume, &task.path) {
            return Err(ApiError::new(409, "busy", "newer bytes landed there; the pull stands down"));
        }
        // Overwritten or removed while this content was pulled: it is no copy of the file now.
        // (This node's records may lag the leader's: give them a moment to show the file.)
        s.wait_for(RECORDS_CATCH_UP_MS, |n, _| n.pull_currency(task) != PullCurrency::NotYetKnown).await;
        if s.read_node(|n, _| n.pull_currency(task)) != PullCurrency::Current {
            return Err(ApiError::new(409, "file_changed", "the file changed while its copy was pulled"));
        }
        let landed = s
            .store_service
            .landed
            .land(s, target_volume, &task.path, &task.checksum, None, &dest, || std::fs::rename(&part, &dest));
        landed.map_err(|c| c.api_error())?.map_err(|e| io_api("rename into place", e))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
        if let Err(e) = &result {
            if e.code == "checksum_mismatch" {
                s.with_node(|n, now| n.copy_mark(now, &task.path, source_volume, LocationState::Stale, &task.checksum));
            }
        }
        return result;
    }
    // The leader may know of the file before this node does: give this node's records a moment
    // to catch up before deciding the file changed under the pull.
    s.wait_for(RECORDS_CATCH_UP_MS, |n, _| n.knows_task_file(task)).await;
    let published = s.with_node(|n, now| n.copy_publish(now, &task.path, &task.file, &task.checksum, target_volume));
    if !published {
        // Removed, moved or overwritten meanwhile: the bytes just put in place are no copy of
        // anything the records list there, so they go (unless a current copy is listed there).
        let listed = s.read_node(|n, _| n.current_copy_listed(&task.path, target_volume));
        if !listed {
            s.store_service.landed.take_back(s, target_volume, &task.path, &task.checksum, || {
                let _ = std::fs::remove_file(&dest);
            });
        }
        return Err(ApiError::new(409, "file_changed", "the file changed while its copy was pulled"));
    }
    Ok(())
}

fn io_api(what: &str, e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return ApiError::new(507, "insufficient_storage", format!("{what}: {e}"));
    }
    ApiError::new(500, "io", format!("{what}: {e}"))
}

/// `store/delete`: delete a copy when this node's records authorise it (see
/// [`shoal_core::node::Node::authorize_delete`]), then mark the copy dropped.
pub async fn delete_copy<E: Env>(s: &Arc<Shared<E>>, sender: &NodeId, body: &[u8]) -> Result<Value, ApiError> {
    let req: shoal_core::node::files::DeleteRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::new(400, "bad_body", format!("delete body: {e}")))?;
    let folder = s.read_node(|n, now| n.authorize_delete(now, sender, &req))?;
    let (s2, path, volume) = (s.clone(), req.path.clone(), req.volume_id.clone());
    let done = s
        .blocking(move || {
            s2.store_service.landed.unless_unsettled(&s2, &volume, &[&path], || remove_copy(Path::new(&folder), &path))
        })
        .await;
    done.ok_or_else(busy)??;
    s.with_node(|n, now| n.copy_mark(now, &req.path, &req.volume_id, LocationState::Dropped, ""));
    Ok(json!({"ok": true}))
}

/// `store/rename`: rename a copy when this node's records show the move.
pub async fn rename_copy<E: Env>(s: &Arc<Shared<E>>, body: &[u8]) -> Result<Value, ApiError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct RenameBody {
        volume_id: shoal_core::VolumeId,
        from: String,
        to: String,
    }
    let b: RenameBody =
        serde_json::from_slice(body).map_err(|e| ApiError::new(400, "bad_body", format!("rename body: {e}")))?;
    let folder = s.read_node(|n, _| n.authorize_rename(&b.volume_id, &b.from, &b.to))?;
    let (s2, from, to, volume) = (s.clone(), b.from.clone(), b.to.clone(), b.volume_id.clone());
    let done = s
        .blocking(move || {
            s2.store_service
                .landed
                .unless_unsettled(&s2, &volume, &[&from, &to], || move_copy(Path::new(&folder), &from, &to))
        })
        .await;
    done.ok_or_else(busy)??;
    s.with_node(|n, now| n.copy_mark(now, &b.from, &b.volume_id, LocationState::Dropped, ""));
    Ok(json!({"ok": true}))
}

fn busy() -> ApiError {
    ApiError::new(409, "busy", "newer bytes landed there than the records show; try again")
}

fn remove_copy(folder: &Path, path: &str) -> Result<(), ApiError> {
    let file = confined_path(folder, path, false)?;
    match std::fs::remove_file(&file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_api("delete copy", e)),
    }
    prune_empty_dirs(folder, &file);
    Ok(())
}

fn move_copy(folder: &Path, from: &str, to: &str) -> Result<(), ApiError> {
    let src = confined_path(folder, from, false)?;
    let dst = confined_path(folder, to, true)?;
    if !src.exists() {
        return Ok(());
    }
    // Whatever lies at the new name is not this file (the records list this volume's copy of
    // it under the old name until now): a leftover of a removed file there is replaced.
    std::fs::rename(&src, &dst).map_err(|e| io_api("rename copy", e))?;
    prune_empty_dirs(folder, &src);
    Ok(())
}

/// Remove now-empty folders between `file` and the volume root.
fn prune_empty_dirs(root: &Path, file: &Path) {
    let Ok(root) = std::fs::canonicalize(root) else { return };
    let mut dir = file.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        if d == root || !d.starts_with(&root) || std::fs::remove_dir(&d).is_err() {
            break;
        }
        dir = d.parent().map(Path::to_path_buf);
    }
}

// ---- disk reconciler ----

/// Carry out what the records ask of this node's disks once.
pub async fn reconcile_once<E: Env>(s: &Arc<Shared<E>>) {
    retire_evacuated(s);
    let actions = s.read_node(|n, _| n.disk_actions());
    for a in actions {
        // Bytes newer than these records lie there: leave them until the records catch up.
        let s2 = s.clone();
        let (volume, path, result) = match a.clone() {
            DiskAction::Delete { volume, folder, path } => {
                let (p, v) = (path.clone(), volume.clone());
                let r = s
                    .blocking(move || {
                        s2.store_service.landed.unless_unsettled(&s2, &v, &[&p], || remove_copy(Path::new(&folder), &p))
                    })
                    .await;
                (volume, path, r)
            }
            DiskAction::Rename { volume, folder, from, to } => {
                let (f, v) = (from.clone(), volume.clone());
                let r = s
                    .blocking(move || {
                        s2.store_service
                            .landed
                            .unless_unsettled(&s2, &v, &[&f, &to], || move_copy(Path::new(&folder), &f, &to))
                    })
                    .await;
                (volume, from, r)
            }
        };
        let Some(result) = result else { continue };
        match result {
            Ok(()) => {
                let mut st = lock(&s.repl.stats);
                match a {
                    DiskAction::Delete { .. } => st.disk_deletes += 1,
                    DiskAction::Rename { .. } => st.disk_renames += 1,
                }
                drop(st);
                s.with_node(|n, now| n.copy_mark(now, &path, &volume, LocationState::Dropped, ""));
            }
            Err(e) => tracing::warn!(path = %path, error = %e.message, "could not update a copy on disk"),
        }
    }
}

/// Retire this node's evacuated volumes: evacuating, nothing a file may need left on them in
/// the records, and nothing being written to them (no write under way, no live upload session,
/// no landed bytes the records do not show yet). A put whose copy on one still lands after all
/// publishes its other copies only (`file_publish` leaves out copies on removed volumes).
fn retire_evacuated<E: Env>(s: &Arc<Shared<E>>) {
    for id in s.read_node(|n, _| n.evacuated_volumes()) {
        if s.store_service.busy_with(s, &id) {
            continue;
        }
        match s.with_node(|n, now| n.volume_retire(now, &id)) {
            Ok(true) => tracing::info!(volume = %id, "an evacuated volume was retired"),
            Ok(false) => {}
            Err(e) => tracing::warn!(volume = %id, error = %e.message, "an evacuated volume could not be retired"),
        }
    }
}

// ---- scrubbing and verification ----

/// SHA-256 of a file and its length, on the blocking pool (never on the runtime's threads).
async fn hash_file<E: Env>(s: &Arc<Shared<E>>, file: PathBuf) -> std::io::Result<(u64, String)> {
    s.blocking(move || {
        let mut f = std::fs::File::open(&file)?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; HASH_BLOCK];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok((total, hex::encode(hash.finalize())));
            }
            hash.update(&buf[..n]);
            total += n as u64;
        }
    })
    .await
}

/// The scrub's next copy ([`Output::ScrubCopy`]): hash it and report. The core marks it, and
/// rests the scrub so its average read rate stays at `storage.scrub_rate`.
///
/// [`Output::ScrubCopy`]: shoal_core::node::Output::ScrubCopy
pub async fn scrub_copy<E: Env>(s: Arc<Shared<E>>, copy: LocalCopy) {
    let hashed = match confined_path(Path::new(&copy.folder), &copy.path, false) {
        Ok(file) => hash_file(&s, file).await.ok(),
        Err(_) => None,
    };
    if !s.with_node(|n, now| n.scrub_result(now, &copy, hashed)) {
        tracing::warn!(path = %copy.path, volume = %copy.volume, "scrub: a copy does not match; marked stale");
    }
}

/// `shoal verify`: re-hash every copy of the file or of everything under the folder, now, on
/// whichever node holds it; mismatches are marked stale (and repaired), matches verified.
pub async fn verify<E: Env>(s: &Arc<Shared<E>>, path: &str) -> Result<Value, ApiError> {
    let p = shoal_core::meta::namespace::normalize(path).map_err(|e| ApiError::new(400, "bad_path", e.to_string()))?;
    let prefix = if p == "/" { "/".to_string() } else { format!("{p}/") };
    let files: Vec<shoal_core::meta::records::FileRecord> = s.read_node(|n, _| {
        n.meta()
            .state()
            .files()
            .filter(|f| !f.removed && !f.is_dir && (f.path == p || f.path.starts_with(&prefix)))
            .cloned()
            .collect()
    });
    if files.is_empty() {
        return Err(ApiError::new(404, "not_found", format!("no files at cluster:{p}")));
    }
    let me = s.read_node(|n, _| n.id().clone());
    let (mut ok, mut bad, mut unreachable) = (0u64, Vec::new(), Vec::new());
    for f in &files {
        for l in f.locations.iter().filter(|l| f.is_current(l)) {
            let sum = if l.node_id == me {
                let folder = s.read_node(|n, _| n.local_volume(l.volume_id.as_str())).map(|v| v.subpath);
                match folder.and_then(|d| confined_path(Path::new(&d), &f.path, false).ok()) {
                    Some(file) => hash_file(s, file).await.map(|r| r.1).ok(),
                    None => None,
                }
            } else {
                let target = format!(
                    "/cluster/acn/store/checksum?volume={}&path={}",
                    l.volume_id,
                    crate::wire::escape_query(&f.path)
                );
                match signed(s, &l.node_id, "GET", &target, vec![], vec![]).await {
                    Ok(r) if r.status == 200 => serde_json::from_slice::<Value>(&r.body)
                        .ok()
                        .and_then(|v| v["checksum"].as_str().map(str::to_string)),
                    Ok(r) if r.status == 404 => Some(String::new()),
                    _ => {
                        unreachable.push(format!("{}:{}{}", l.node_id, l.volume_id, f.path));
                        continue;
                    }
                }
            };
            let good = sum.as_deref() == Some(f.checksum.as_str());
            let state = if good { LocationState::Verified } else { LocationState::Stale };
            s.with_node(|n, now| n.copy_mark(now, &f.path, &l.volume_id, state, &f.checksum));
            if good {
                ok += 1;
            } else {
                bad.push(format!("{}:{}{}", l.node_id, l.volume_id, f.path));
            }
        }
    }
    if !bad.is_empty() {
        s.repl_kick();
    }
    Ok(json!({ "files": files.len(), "verified": ok, "stale": bad, "unreachable": unreachable }))
}

// ---- rescans ----

/// A part file untouched this long belongs to no upload (sessions end after 30 minutes idle).
const PART_FILE_MAX_AGE_MS: u64 = 60 * 60_000;

/// Walk this node's volume folders: adopt files with no record, add right copies the records
/// do not list, restore stale copies whose bytes are right again, mark copies that vanished or
/// changed stale.
pub async fn rescan<E: Env>(s: &Arc<Shared<E>>) -> Value {
    lock(&s.repl.stats).rescans += 1;
    let mut report = Vec::new();
    for (volume, folder) in s.read_node(|n, _| n.local_volumes()) {
        let facts = s.read_node(|n, _| n.volume_facts(&volume));
        let root = PathBuf::from(&folder);
        // Part files of uploads and pulls cut short: left by an earlier run of this node, or
        // untouched for longer than any session lives.
        let started = lock(&s.repl.started).unwrap_or(std::time::UNIX_EPOCH);
        let cutoff = std::time::SystemTime::now()
            .checked_sub(Duration::from_millis(PART_FILE_MAX_AGE_MS))
            .map_or(started, |old| old.max(started));
        let (found, parts_removed) = s
            .blocking(move || {
                let (found, parts) = walk(&root);
                let old: Vec<PathBuf> = parts.into_iter().filter(|(_, m)| *m < cutoff).map(|(p, _)| p).collect();
                let removed = old.iter().filter(|p| std::fs::remove_file(p).is_ok()).count();
                (found, removed)
            })
            .await;
        let (mut adopted, mut stale, mut added, mut restored) = (0u64, 0u64, 0u64, 0u64);
        for (path, size, mtime_ms) in &found {
            if facts.pending.contains(path) {
                continue; // a delete or rename is on its way
            }
            let file = match confined_path(Path::new(&folder), path, false) {
                Ok(f) => f,
                Err(_) => continue,
            };
            match facts.live.get(path) {
                Some(live) => match live.copy {
                    Some(c) if c.current => {
                        let changed = *size != live.size || *mtime_ms > c.checked_ms + 2_000;
                        if changed {
                            let sum = hash_file(s, file).await.map(|r| r.1).unwrap_or_default();
                            if sum != live.checksum || *size != live.size {
                                s.with_node(|n, now| {
                                    n.copy_mark(now, path, &volume, LocationState::Stale, &live.checksum)
                                });
                                stale += 1;
                            }
                        }
                    }
                    Some(c) if c.of_this_content && *size == live.size => {
                        // Stale, of the file's present content (marked while this node was
                        // away, or found corrupt): if the bytes are right it is a copy again,
                        // with no transfer; a corrupt one stays stale until repaired.
                        let sum = hash_file(s, file).await.map(|r| r.1).unwrap_or_default();
                        if sum == live.checksum
                            && s.with_node(|n, now| n.copy_publish(now, path, &live.id, &sum, &volume))
                        {
                            restored += 1;
                        }
                    }
                    Some(_) => {}
                    None => {
                        if *size == live.size {
                            let sum = hash_file(s, file).await.map(|r| r.1).unwrap_or_default();
                            if sum == live.checksum
                                && s.with_node(|n, now| n.copy_publish(now, path, &live.id, &sum, &volume))
                            {
                                added += 1;
                            }
                        }
                    }
                },
                None => {
                    // This node's records may lag (it just came back, or is cut off): a file
                    // the cluster already has is not adopted over it.
                    if !unknown_to_leader(s, path).await {
                        continue;
                    }
                    let Ok((size, sum)) = hash_file(s, file).await else { continue };
                    let mod_time = *mtime_ms;
                    if s.with_node(|n, now| n.copy_adopt(now, path, &volume, size, &sum, mod_time)).is_ok() {
                        adopted += 1;
                    }
                }
            }
        }
        let present: BTreeSet<&String> = found.iter().map(|(p, _, _)| p).collect();
        for (path, live) in &facts.live {
            if live.copy.is_some_and(|c| c.current) && !present.contains(path) {
                s.with_node(|n, now| n.copy_mark(now, path, &volume, LocationState::Stale, &live.checksum));
                stale += 1;
            }
        }
        lock(&s.repl.stats).adopted += adopted;
        if stale > 0 || restored > 0 {
            s.repl_kick();
        }
        report.push(json!({"volumeId": volume, "files": found.len(), "adopted": adopted, "copiesAdded": added, "copiesRestored": restored, "markedStale": stale, "partFilesRemoved": parts_removed}));
    }
    json!({ "volumes": report })
}

/// Whether the metadata leader holds no live file at `path` (this node's own records, when it
/// is the leader). No leader known, or no clear answer: not unknown, so nothing is adopted.
async fn unknown_to_leader<E: Env>(s: &Arc<Shared<E>>, path: &str) -> bool {
    let (me, leader) = s.read_node(|n, now| (n.id().clone(), n.meta_leader(now).map(|l| l.holder.clone())));
    let Some(leader) = leader else { return false };
    if leader == me {
        return s.read_node(|n, _| n.meta().state().file(path).is_none_or(|f| f.removed));
    }
    let target = format!("/cluster/acn/meta/file?path={}", crate::wire::escape_query(path));
    match signed(s, &leader, "GET", &target, vec![], vec![]).await {
        Ok(r) if r.status == 200 => {
            serde_json::from_slice::<Value>(&r.body).is_ok_and(|v| v["live"] == Value::Bool(false))
        }
        _ => false,
    }
}

/// Regular files under `root` as (cluster path, size, mtime ms), and apart the part files
/// shoal writes (with their mtime); symlinks are skipped, and names that are not valid cluster
/// paths too.
type Walked = (Vec<(String, u64, u64)>, Vec<(PathBuf, std::time::SystemTime)>);

fn walk(root: &Path) -> Walked {
    let mut out = Vec::new();
    let mut parts = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let Ok(name) = e.file_name().into_string() else { continue };
            let Ok(md) = e.path().symlink_metadata() else { continue };
            let path = format!("{prefix}/{name}");
            if md.file_type().is_symlink() {
                continue;
            }
            if name.contains(transfer::PART_MARK) {
                if md.is_file() && is_part_file(&name) {
                    parts.push((e.path(), md.modified().unwrap_or(std::time::UNIX_EPOCH)));
                }
                continue;
            }
            if md.is_dir() {
                stack.push((e.path(), path));
            } else if md.is_file() {
                if shoal_core::meta::namespace::normalize(&path).ok().as_deref() != Some(path.as_str()) {
                    continue;
                }
                let mtime = md
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as u64);
                out.push((path, md.len(), mtime));
            }
        }
    }
    out.sort();
    (out, parts)
}

/// Whether `name` is one of the part files shoal writes: `<name>.part-<16 hex>` (an upload
/// session or a put's local copy) or `<name>.part-repl<16 hex>` (a pull).
fn is_part_file(name: &str) -> bool {
    let Some((_, tag)) = name.rsplit_once(transfer::PART_MARK) else { return false };
    let tag = tag.strip_prefix("repl").unwrap_or(tag);
    tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A file's copies: (volume, node).
pub type Copies = Vec<(shoal_core::VolumeId, NodeId)>;

/// After a remove: have every holder delete its copies now (each checks the removal against
/// its own records; one whose records lag answers 409 and is asked again for a while, after
/// which its reconciler finishes the job). `removed` is (path, copies).
pub async fn delete_now<E: Env>(
    s: &Arc<Shared<E>>,
    removed: Vec<(String, Vec<(shoal_core::VolumeId, NodeId)>)>,
) -> u64 {
    const REMOVE_WAIT_MS: u64 = 10_000;
    let me = s.read_node(|n, _| n.id().clone());
    let started = s.env.monotonic();
    reconcile_once(s).await;
    let mut done = 0u64;
    for (path, copies) in removed {
        for (volume, node) in copies.into_iter().filter(|(_, n)| *n != me) {
            let body = json!({"volumeId": volume, "path": path}).to_string().into_bytes();
            loop {
                match signed(s, &node, "POST", "/cluster/acn/store/delete", body.clone(), vec![]).await {
                    Ok(r) if r.status == 200 => {
                        done += 1;
                        break;
                    }
                    Ok(r) if r.status == 409 && s.env.monotonic().since(started) < REMOVE_WAIT_MS => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => break,
                }
            }
        }
    }
    done
}

/// After a move: have every holder rename its copies now, so the files are where the records
/// say before the move is answered. Holders check the move against their own records (a
/// holder whose records lag answers 409 and is asked again); whatever is not done within
/// `MOVE_WAIT_MS` the holders' reconcilers finish. `moved` is (old path, new path, copies).
pub async fn rename_now<E: Env>(s: &Arc<Shared<E>>, moved: Vec<(String, String, Copies)>) -> u64 {
    const MOVE_WAIT_MS: u64 = 10_000;
    let me = s.read_node(|n, _| n.id().clone());
    let started = s.env.monotonic();
    reconcile_once(s).await;
    let mut done = 0u64;
    for (from, to, copies) in moved {
        for (volume, node) in copies.into_iter().filter(|(_, n)| *n != me) {
            let body = json!({"volumeId": volume, "from": from, "to": to}).to_string().into_bytes();
            loop {
                let r = signed(s, &node, "POST", "/cluster/acn/store/rename", body.clone(), vec![]).await;
                match r {
                    Ok(r) if r.status == 200 => {
                        done += 1;
                        break;
                    }
                    Ok(r) if r.status == 409 && s.env.monotonic().since(started) < MOVE_WAIT_MS => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => break, // the holder's reconciler will do it
                }
            }
        }
    }
    done
}
