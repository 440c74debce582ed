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
//! - **Worker.** Checks the task comes from the leader of that term, registers it with the
//!   core, whose timer renews its lease every 10 s (`repl/renew`, which also lets a new leader
//!   adopt it), pulls the copy with
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

mod disk;
mod rescan;
mod scrub;

use disk::*;
pub use disk::{delete_copy, delete_now, rename_copy, rename_now, Copies};
pub use rescan::rescan;
use scrub::*;
pub use scrub::{scrub_copy, verify};

use crate::disk::confined_path;
use crate::disk::hash::FileHash;
use crate::env::Env;
use crate::node::handle::Shared;
use crate::services::peer::{read_piece_unchecked, signed};
use crate::sync::lock;
use crate::wire::error::error_response;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_core::meta::records::LocationState;
use shoal_core::node::files::LocalCopy;
use shoal_core::node::files::{DiskAction, Source};
use shoal_core::node::landed::KeptAction;
use shoal_core::node::replication::{PullCurrency, TaskReport, TaskReportBody};
use shoal_core::node::ApiError;
use shoal_core::storage::chores::Chore;
use shoal_core::storage::planner::{Action, InFlight, Task, TaskOutcome};
use shoal_core::storage::tasks::ReportError;
use shoal_core::storage::transfer::{self, CHUNK_BYTES};
use shoal_core::NodeId;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How long a worker waits for its records to show the file of a task the leader sent.
const RECORDS_CATCH_UP_MS: u64 = 10_000;
const HASH_BLOCK: usize = 1 << 20;

/// Note when this process started, on the file clock (part files written before it belong to
/// no upload of this run).
pub fn started<E: Env>(s: &Arc<Shared<E>>) {
    *lock(&s.repl.started) = Some(crate::disk::file_clock());
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
        let outcome = if ok { TaskOutcome::Succeeded } else { TaskOutcome::Failed };
        s.with_node(|n, now| n.repl_finish(now, &task.file, &task.path, outcome));
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
fn take_report<E: Env>(s: &Arc<Shared<E>>, sender: &NodeId, b: &TaskReportBody, op: &str) -> Result<(), ReportError> {
    let report = if op == "renew" { TaskReport::Renew } else { TaskReport::Done(b.outcome()) };
    let ended = s.with_node(|n, now| n.repl_report(now, sender, b.term, &b.task, report))?;
    if ended && b.outcome() == TaskOutcome::Failed {
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
            let b: TaskReportBody = match serde_json::from_slice(body) {
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
async fn report<E: Env>(s: &Arc<Shared<E>>, leader: &NodeId, op: &str, body: &TaskReportBody) {
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
    // The core renews the task's lease on its timer until the task ends here.
    if !s.with_node(|n, now| n.work_begin(now, &leader, b.term, &b.task)) {
        return; // already at it
    }
    let result = pull(s, &b.task).await;
    s.with_node(|n, _| n.work_end(&b.task.file));
    let (ok, deferred, error) = match result {
        Ok(()) => (true, false, String::new()),
        Err(e) => {
            // Refused while another write's bytes at that path are unsettled: the pull is
            // deferred, not failed (the file's backoff does not climb towards the hour).
            let deferred = TaskOutcome::of_pull_error(e.code) == TaskOutcome::Deferred;
            if deferred {
                tracing::info!(path = %b.task.path, error = %e.message, "pull deferred");
            } else {
                tracing::warn!(path = %b.task.path, error = %e.message, "pull failed");
            }
            (false, deferred, e.message)
        }
    };
    let body = TaskReportBody { term: b.term, task: b.task, ok, deferred, error };
    report(s, &leader, "done", &body).await;
}

/// Pull one copy into this node's target volume and publish it.
async fn pull<E: Env>(s: &Arc<Shared<E>>, task: &Task) -> Result<(), ApiError> {
    let Action::Pull { source_node, source_volume, target_volume, .. } = &task.action else {
        return Err(ApiError::invalid("bad_task", "not a pull"));
    };
    let vol = s
        .read_node(|n, _| n.local_volume(target_volume.as_str()))
        .ok_or_else(|| ApiError::not_found("unknown_volume", "the target volume is not on this node"))?;
    if !shoal_core::storage::placement::writable(&vol) {
        return Err(ApiError::conflict("volume_read_only", "the target volume takes no new copies"));
    }
    let src_folder = s.read_node(|n, _| n.local_volume(source_volume.as_str())).map(|v| v.subpath);
    let src =
        Source { node_id: source_node.clone(), volume_id: source_volume.clone(), folder: src_folder, moved_from: None };
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
    // Bytes of another write not settled at that path yet: no copy lands over them, so none is
    // taken (a big file would be read in full for nothing).
    if s.store_service.landed.unsettled(s, target_volume, &task.path) {
        return Err(ApiError::conflict("busy", "newer bytes landed there; the pull stands down"));
    }
    // The volume is not retired while the copy is written; its fsyncs are grouped with the
    // volume's other writes.
    let writing = Arc::new(s.store_service.writing(target_volume, Path::new(&vol.subpath)));
    let result = async {
        let out = std::fs::File::create(&part).map_err(|e| io_api("create part file", e))?;
        // Each piece's own SHA-256 is checked in the same pass that takes it into the whole
        // file's (`disk::hash`).
        let mut hash = FileHash::new();
        let mut at = 0u64;
        while at < task.size {
            let piece = read_piece_unchecked(s, &src, &task.path, at, (task.size - at).min(CHUNK_BYTES)).await?;
            if piece.bytes.is_empty() {
                return Err(ApiError::peer_failed("short_copy", "the source copy is shorter than the file"));
            }
            piece.check_into(&mut hash)?;
            let data = piece.bytes;
            let (p, d) = (part.clone(), data.clone());
            s.blocking(move || crate::disk::write_at(&p, at, &d)).await.map_err(|e| io_api("write part file", e))?;
            at += data.len() as u64;
        }
        let w = writing.clone();
        s.blocking(move || w.sync(&out)).await.map_err(|e| io_api("sync part file", e))?;
        if hash.hex() != task.checksum.to_ascii_lowercase() {
            return Err(ApiError::conflict("checksum_mismatch", "the source copy does not match the file's checksum"));
        }
        if s.store_service.landed.unsettled(s, target_volume, &task.path) {
            return Err(ApiError::conflict("busy", "newer bytes landed there; the pull stands down"));
        }
        // Overwritten or removed while this content was pulled: it is no copy of the file now.
        // (This node's records may lag the leader's: give them a moment to show the file.)
        s.wait_for(RECORDS_CATCH_UP_MS, |n, _| n.pull_currency(task) != PullCurrency::NotYetKnown).await;
        if s.read_node(|n, _| n.pull_currency(task)) != PullCurrency::Current {
            return Err(ApiError::conflict("file_changed", "the file changed while its copy was pulled"));
        }
        let landed = s
            .store_service
            .landed
            .land(s, target_volume, &task.path, &task.checksum, None, &dest, || std::fs::rename(&part, &dest));
        landed.map_err(|c| c.api_error())?.map_err(|e| io_api("rename into place", e))?;
        // The name survives a crash too, before the copy is published (not durable under its
        // name, it is taken back: no copy to publish).
        let (s2, w, path, sum, dest) =
            (s.clone(), writing.clone(), task.path.clone(), task.checksum.clone(), dest.clone());
        s.blocking(move || s2.store_service.landed.sync_name_or_take_back(&s2, &w, &path, &sum, &dest))
            .await
            .map_err(|e| io_api("sync folder", e))
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
        return Err(ApiError::conflict("file_changed", "the file changed while its copy was pulled"));
    }
    Ok(())
}
