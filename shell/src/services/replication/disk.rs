//! This node's disk work for replication: deleting and renaming copies when asked
//! (`store/delete`, `store/rename`, checked by the core), the reconciler that carries out what
//! the records ask of this node's disks, retiring evacuated volumes, and a remove's or move's
//! "now" pass over the holders.

use super::*;
use crate::services::peer::signed_within;

pub(super) fn io_api(what: &str, e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return ApiError::storage_full("insufficient_storage", format!("{what}: {e}"));
    }
    ApiError::internal("io", format!("{what}: {e}"))
}

/// How long a holder asked to delete or rename a copy waits for its own records to show why
/// (they may lag the asker's by a replication round), woken as they change.
pub const RECORDS_CATCH_UP_MS: u64 = 5_000;

/// Ask the core whether `authorized` holds now; when refused as not (yet) authorised, wait
/// for this node's records to catch up, then ask once more.
async fn when_authorized<E: Env, T>(
    s: &Arc<Shared<E>>,
    mut authorized: impl FnMut(&mut shoal_core::node::Node, shoal_core::Millis) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    match s.with_node(&mut authorized) {
        Err(e) if e.code == "not_authorized" => {
            s.wait_for(RECORDS_CATCH_UP_MS, |n, now| authorized(n, now).is_ok()).await;
            s.with_node(authorized)
        }
        r => r,
    }
}

/// Wait (up to [`RECORDS_CATCH_UP_MS`]) until this node's store holds, on disk, every change of
/// its records made so far: a copy is renamed or deleted only once the records that ask for it
/// would survive a crash of this node. The store writes behind; a node that renamed a copy for
/// a move and died before the move's records were written came back with the file's record at
/// the old path and its bytes at the new one, neither a copy of the other (the drive sweep: a
/// move through a node alone, crashed right after). Whether they are.
async fn records_on_disk<E: Env>(s: &Arc<Shared<E>>) -> bool {
    let through = s.meta_store.queued_through();
    s.meta_store.wait_flushed(through, std::time::Duration::from_millis(RECORDS_CATCH_UP_MS)).await
}

fn records_not_on_disk() -> ApiError {
    ApiError::unavailable("records_not_written", "this node's records of the change are not written yet; try again")
}

/// Carry out `act` (on the blocking pool) unless bytes landed at one of `paths` that the records
/// do not account for yet; then wait for them to settle (woken as the records change, up to
/// [`RECORDS_CATCH_UP_MS`]) and try once more; still unsettled, 409 `busy`.
async fn when_settled<E: Env, F>(
    s: &Arc<Shared<E>>,
    volume: &shoal_core::VolumeId,
    paths: &[&str],
    act: impl Fn(Arc<Shared<E>>) -> F,
) -> Result<(), ApiError>
where
    F: FnOnce() -> Option<Result<(), ApiError>> + Send + 'static,
{
    if let Some(done) = s.blocking(act(s.clone())).await {
        return done;
    }
    s.wait_for(RECORDS_CATCH_UP_MS, |n, now| paths.iter().all(|p| !n.landed_unsettled(now, volume, p))).await;
    s.blocking(act(s.clone())).await.ok_or_else(busy)?
}

/// `store/delete`: delete a copy when this node's records authorise it (see
/// [`shoal_core::node::Node::authorize_delete`]), then mark the copy dropped.
pub async fn delete_copy<E: Env>(s: &Arc<Shared<E>>, sender: &NodeId, body: &[u8]) -> Result<Value, ApiError> {
    let req: shoal_core::node::files::DeleteRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid("bad_body", format!("delete body: {e}")))?;
    let folder = when_authorized(s, |n, now| n.authorize_delete(now, sender, &req)).await?;
    if !records_on_disk(s).await {
        return Err(records_not_on_disk());
    }
    let (sender, req2) = (sender.clone(), req.clone());
    when_settled(s, &req.volume_id, &[&req.path], move |s2| {
        let (sender, req, folder) = (sender.clone(), req2.clone(), folder.clone());
        move || {
            let (path, volume) = (req.path.as_str(), &req.volume_id);
            s2.store_service.landed.unless_unsettled(&s2, volume, Path::new(&folder), &[path], || {
                // Asked again under the landing lock: a put may have landed new bytes at this
                // path since (settled by now, its record live), which this delete must not take.
                s2.read_node(|n, now| n.authorize_delete(now, &sender, &req))?;
                remove_copy(Path::new(&folder), path)?;
                // Authorised again under this lock, so the record is the one it was for.
                s2.with_node(|n, now| match req.term {
                    None => n.removed_copy_dropped(now, path, volume),
                    Some(_) => n.copy_mark(now, path, volume, LocationState::Dropped, ""),
                });
                Ok(())
            })
        }
    })
    .await?;
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
        serde_json::from_slice(body).map_err(|e| ApiError::invalid("bad_body", format!("rename body: {e}")))?;
    if s.read_node(|n, _| n.rename_done(&b.volume_id, &b.from, &b.to)) {
        // Already renamed (this node's reconciler got there first): nothing to do.
        return Ok(json!({"ok": true}));
    }
    let folder = when_authorized(s, |n, _| n.authorize_rename(&b.volume_id, &b.from, &b.to)).await?;
    if !records_on_disk(s).await {
        return Err(records_not_on_disk());
    }
    let (from, to, volume) = (b.from.clone(), b.to.clone(), b.volume_id.clone());
    when_settled(s, &b.volume_id, &[&b.from, &b.to], move |s2| {
        let (from, to, volume, folder) = (from.clone(), to.clone(), volume.clone(), folder.clone());
        move || {
            s2.store_service.landed.unless_unsettled(&s2, &volume, Path::new(&folder), &[&from, &to], || {
                // Asked again under the landing lock (a put over either name since, settled by
                // now, must not be replaced or taken by the old bytes).
                s2.read_node(|n, _| n.authorize_rename(&volume, &from, &to))?;
                let moved = move_copy(Path::new(&folder), &from, &to)?;
                s2.with_node(|n, now| n.removed_copy_renamed(now, &from, &to, &volume, moved));
                Ok(())
            })
        }
    })
    .await?;
    Ok(json!({"ok": true}))
}

pub(super) fn busy() -> ApiError {
    ApiError::conflict("busy", "newer bytes landed there than the records show; try again")
}

pub(super) fn remove_copy(folder: &Path, path: &str) -> Result<(), ApiError> {
    let file = confined_path(folder, path, false)?;
    match std::fs::remove_file(&file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_api("delete copy", e)),
    }
    prune_empty_dirs(folder, &file);
    // The removal survives a power loss before it is reported (and the copy marked dropped):
    // otherwise the bytes could come back at a path no record lists, which a rescan does not
    // adopt, and hold their space for good. The deepest folder left is fsynced: the file's
    // own, or the one that held the last folder pruned.
    let kept = file.ancestors().skip(1).find(|d| d.is_dir());
    if let Some(dir) = kept {
        crate::disk::sync::fsync_folder(dir).map_err(|e| io_api("sync folder", e))?;
    }
    Ok(())
}

/// Rename a copy on a volume's `folder` from `from` to `to`; whether there were bytes to move.
pub(super) fn move_copy(folder: &Path, from: &str, to: &str) -> Result<bool, ApiError> {
    let src = confined_path(folder, from, false)?;
    let dst = confined_path(folder, to, true)?;
    if !src.exists() {
        return Ok(false);
    }
    // Whatever lies at the new name is not this file (the records list this volume's copy of
    // it under the old name until now): a leftover of a removed file there is replaced.
    std::fs::rename(&src, &dst).map_err(|e| io_api("rename copy", e))?;
    // Both names survive a power loss: without these it could leave the bytes at the old path,
    // where no record lists them (a rescan does not adopt them), and nothing at the new one.
    let (to_dir, from_dir) = (dst.parent(), src.parent());
    for dir in [to_dir, from_dir.filter(|d| Some(*d) != to_dir)].into_iter().flatten() {
        crate::disk::sync::fsync_folder(dir).map_err(|e| io_api("sync folder", e))?;
    }
    prune_empty_dirs(folder, &src);
    Ok(true)
}

/// Remove now-empty folders between `file` and the volume root.
pub(super) fn prune_empty_dirs(root: &Path, file: &Path) {
    let Ok(root) = std::fs::canonicalize(root) else { return };
    let mut dir = file.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        if d == root || !d.starts_with(&root) || std::fs::remove_dir(&d).is_err() {
            break;
        }
        dir = d.parent().map(Path::to_path_buf);
    }
}

/// Carry out what the records ask of this node's disks once.
pub async fn reconcile_once<E: Env>(s: &Arc<Shared<E>>) {
    retire_evacuated(s);
    reconcile_kept(s).await;
    let actions = s.read_node(|n, _| n.disk_actions());
    // The records behind these actions are queued for the store by now; written first.
    if actions.is_empty() || !records_on_disk(s).await {
        return;
    }
    for a in actions {
        // Bytes newer than these records lie there: leave them until the records catch up.
        // Asked again under the landing lock whether the records still ask for it: a put may
        // have landed new bytes at the path since these actions were found (its record live
        // by now), which must be left alone.
        let s2 = s.clone();
        let (path, result) = match a.clone() {
            DiskAction::Delete { volume, folder, path } => {
                let (p, v, act) = (path.clone(), volume.clone(), a.clone());
                let r = s
                    .blocking(move || {
                        s2.store_service.landed.unless_unsettled(&s2, &v, Path::new(&folder), &[&p], || {
                            if !s2.read_node(|n, _| n.disk_action_holds(&act)) {
                                return Ok::<_, ApiError>(false);
                            }
                            remove_copy(Path::new(&folder), &p)?;
                            s2.with_node(|n, now| n.removed_copy_dropped(now, &p, &v));
                            Ok(true)
                        })
                    })
                    .await;
                (path, r)
            }
            DiskAction::Rename { volume, folder, from, to } => {
                let (f, v, act) = (from.clone(), volume.clone(), a.clone());
                let r = s
                    .blocking(move || {
                        s2.store_service.landed.unless_unsettled(&s2, &v, Path::new(&folder), &[&f, &to], || {
                            if !s2.read_node(|n, _| n.disk_action_holds(&act)) {
                                return Ok::<_, ApiError>(false);
                            }
                            let moved = move_copy(Path::new(&folder), &f, &to)?;
                            s2.with_node(|n, now| n.removed_copy_renamed(now, &f, &to, &v, moved));
                            Ok(true)
                        })
                    })
                    .await;
                (from, r)
            }
        };
        match result {
            // Bytes newer than the records lie there, or the records no longer ask for it.
            None | Some(Ok(false)) => {}
            Some(Ok(true)) => {
                let mut st = lock(&s.repl.stats);
                match a {
                    DiskAction::Delete { .. } => st.disk_deletes += 1,
                    DiskAction::Rename { .. } => st.disk_renames += 1,
                }
            }
            Some(Err(e)) => tracing::warn!(path = %path, error = %e.message, "could not update a copy on disk"),
        }
    }
}

/// Put back or drop the bytes overwrites kept aside, as the core says
/// (`Node::kept_actions`; `shoal_core::storage::landed`, "Kept bytes"): each asked again under
/// the landing lock, after bytes this node's last run may have landed at the path are noted.
async fn reconcile_kept<E: Env>(s: &Arc<Shared<E>>) {
    for a in s.read_node(|n, now| n.kept_actions(now)) {
        let (KeptAction::Restore { volume, folder, path, checksum }
        | KeptAction::Drop { volume, folder, path, checksum }) = a.clone();
        let (s2, act) = (s.clone(), a.clone());
        let (v, p, sum) = (volume.clone(), path.clone(), checksum.clone());
        let done = s
            .blocking(move || {
                s2.store_service.landed.unless_unsettled(&s2, &v, Path::new(&folder), &[&p], || {
                    if !s2.read_node(|n, now| n.kept_action_holds(now, &act)) {
                        return Ok(None);
                    }
                    let dest = confined_path(Path::new(&folder), &p, false)?;
                    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    let Some(kept) = transfer::kept_file_name(name, &sum).map(|k| dest.with_file_name(k)) else {
                        s2.with_node(|n, _| n.kept_done(&v, &p, &sum));
                        return Ok(None);
                    };
                    if !kept.is_file() {
                        // Gone (its folder was moved or removed with the copy): nothing to do.
                        s2.with_node(|n, _| n.kept_done(&v, &p, &sum));
                        return Ok(None);
                    }
                    match act {
                        KeptAction::Restore { .. } => {
                            std::fs::rename(&kept, &dest).map_err(|e| io_api("put kept bytes back", e))?;
                            if let Some(dir) = dest.parent() {
                                crate::disk::sync::fsync_folder(dir).map_err(|e| io_api("sync folder", e))?;
                            }
                            Ok::<_, ApiError>(Some(dest))
                        }
                        KeptAction::Drop { .. } => {
                            std::fs::remove_file(&kept).map_err(|e| io_api("drop kept bytes", e))?;
                            s2.with_node(|n, _| n.kept_done(&v, &p, &sum));
                            Ok(None)
                        }
                    }
                })
            })
            .await;
        match done {
            Some(Ok(Some(dest))) => {
                // The bytes are the path's again: hashed, so the records can count them.
                let hashed = super::scrub::hash_file(s, dest).await.map(|(_, h)| h).unwrap_or_default();
                let published = s.with_node(|n, now| n.kept_restored(now, &volume, &path, &checksum, &hashed));
                tracing::info!(path = %path, volume = %volume, published, "an overwrite whose record never came: the bytes it replaced are back");
                lock(&s.repl.stats).kept_restored += 1;
            }
            Some(Ok(None)) | None => {}
            Some(Err(e)) => tracing::warn!(path = %path, error = %e.message, "could not put back or drop kept bytes"),
        }
    }
}

/// Retire this node's evacuated volumes: evacuating, nothing a file may need left on them in
/// the records, and nothing being written to them (no write under way, no live upload session,
/// no landed bytes the records do not show yet). A put whose copy on one still lands after all
/// publishes its other copies only (`file_publish` leaves out copies on removed volumes).
pub(super) fn retire_evacuated<E: Env>(s: &Arc<Shared<E>>) {
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

/// A file's copies: (volume, node).
pub type Copies = Vec<(shoal_core::VolumeId, NodeId)>;

/// How long a remove or a move asks holders to act at once; what is left after that their
/// reconcilers finish.
const NOW_PASS_MS: u64 = 10_000;

/// After a remove: have every holder delete its copies now (each checks the removal against
/// its own records, waiting a little for them when they lag; what is not done within
/// [`NOW_PASS_MS`] its reconciler finishes). `removed` is (path, copies).
pub async fn delete_now<E: Env>(
    s: &Arc<Shared<E>>,
    removed: Vec<(String, Vec<(shoal_core::VolumeId, NodeId)>)>,
) -> u64 {
    let me = s.read_node(|n, _| n.id().clone());
    let started = s.env.monotonic();
    reconcile_once(s).await;
    let mut done = 0u64;
    for (path, copies) in removed {
        for (volume, node) in copies.into_iter().filter(|(_, n)| *n != me) {
            if s.env.monotonic().since(started) >= NOW_PASS_MS {
                return done;
            }
            let body = json!({"volumeId": volume, "path": path}).to_string().into_bytes();
            let r = signed_within(s, &node, "POST", "/cluster/acn/store/delete", body, vec![], NOW_ASK_TIMEOUT_MS);
            if matches!(r.await, Ok(r) if r.status == 200) {
                done += 1;
            }
        }
    }
    done
}

/// One "now" request: the holder's wait for its records plus a peer's time to answer.
const NOW_ASK_TIMEOUT_MS: u64 = RECORDS_CATCH_UP_MS + 10_000;

/// After a move: have every holder rename its copies now, so the files are where the records
/// say before the move is answered. Holders check the move against their own records, waiting
/// a little for them when they lag; whatever is not done within [`NOW_PASS_MS`] the holders'
/// reconcilers finish. `moved` is (old path, new path, copies).
pub async fn rename_now<E: Env>(s: &Arc<Shared<E>>, moved: Vec<(String, String, Copies)>) -> u64 {
    let me = s.read_node(|n, _| n.id().clone());
    let started = s.env.monotonic();
    reconcile_once(s).await;
    let mut done = 0u64;
    for (from, to, copies) in moved {
        for (volume, node) in copies.into_iter().filter(|(_, n)| *n != me) {
            if s.env.monotonic().since(started) >= NOW_PASS_MS {
                return done;
            }
            let body = json!({"volumeId": volume, "from": from, "to": to}).to_string().into_bytes();
            let r = signed_within(s, &node, "POST", "/cluster/acn/store/rename", body, vec![], NOW_ASK_TIMEOUT_MS);
            if matches!(r.await, Ok(r) if r.status == 200) {
                done += 1;
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A removed copy's empty folders go too, and the removal is made durable through the
    /// deepest folder left (here the volume root, every folder above the file being pruned).
    #[test]
    fn a_removed_copy_takes_its_empty_folders_and_a_missing_one_is_no_error() {
        let root = tempfile::tempdir().unwrap();
        let file = confined_path(root.path(), "/a/b/c.bin", true).unwrap();
        std::fs::write(&file, b"bytes").unwrap();
        std::fs::write(root.path().join("a/keep.bin"), b"other").unwrap();
        remove_copy(root.path(), "/a/b/c.bin").unwrap();
        assert!(!file.exists() && !root.path().join("a/b").exists(), "the file and its emptied folder are gone");
        assert!(root.path().join("a/keep.bin").exists(), "a folder with other files stays");
        remove_copy(root.path(), "/a/b/c.bin").unwrap();
        remove_copy(root.path(), "/a/keep.bin").unwrap();
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0, "pruned up to the volume root");
    }
}
