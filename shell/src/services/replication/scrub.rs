//! Hashing copies: the scrub's next copy (the core picks it and paces the next) and
//! `shoal verify`, which re-hashes every copy of a file or folder now.

use super::*;

/// How long `verify` waits for a just-moved copy's rename on its holder before it asks again
/// (woken as the records change: a rename done sooner ends the wait). A holder renames a copy
/// only once the records asking for it are written, which a loaded disk can hold back.
const MOVE_SETTLE_MS: u64 = 30_000;

/// SHA-256 of a file and its length, on the blocking pool (never on the runtime's threads).
pub(super) async fn hash_file<E: Env>(s: &Arc<Shared<E>>, file: PathBuf) -> std::io::Result<(u64, String)> {
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
    let p = shoal_core::meta::namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
    let files = s.read_node(|n, _| n.live_files_at_or_under(&p))?;
    if files.is_empty() {
        return Err(ApiError::not_found("not_found", format!("no files at cluster:{p}")));
    }
    let me = s.read_node(|n, _| n.id().clone());
    let (mut ok, mut bad, mut unreachable, mut renaming) = (0u64, Vec::new(), Vec::new(), Vec::new());
    for f in &files {
        for l in f.locations.iter().filter(|l| f.is_current(l)) {
            let sum = if l.node_id == me {
                let folder = s.read_node(|n, _| n.local_volume(l.volume_id.as_str())).map(|v| v.subpath);
                let file = folder.and_then(|d| confined_path(Path::new(&d), &f.path, false).ok());
                let (path, volume) = (f.path.clone(), l.volume_id.clone());
                if file.as_ref().is_some_and(|p| !p.exists()) && s.read_node(|n, _| n.copy_move_pending(&path, &volume))
                {
                    // Just moved: rename this node's own copy now (the reconciler's pass, once
                    // the records asking for it are written), or wait (bounded) for it.
                    reconcile_once(s).await;
                    s.wait_for(MOVE_SETTLE_MS, |n, _| !n.copy_move_pending(&path, &volume)).await;
                    if !file.as_ref().is_some_and(|p| p.exists())
                        && s.read_node(|n, _| n.copy_move_pending(&path, &volume))
                    {
                        // Still waiting (for bytes an overwrite kept aside at the old path to
                        // go back first): not missing, not checked now.
                        renaming.push(format!("{}:{}{}", l.node_id, l.volume_id, f.path));
                        continue;
                    }
                }
                match file {
                    Some(file) => hash_file(s, file).await.map(|r| r.1).ok(),
                    None => None,
                }
            } else {
                let target = format!(
                    "/cluster/acn/store/checksum?volume={}&path={}",
                    l.volume_id,
                    crate::wire::escape_query(&f.path)
                );
                let mut answer = signed(s, &l.node_id, "GET", &target, vec![], vec![]).await;
                if answer.as_ref().is_ok_and(|r| r.status == 404) {
                    // Just moved: the holder may not have renamed its copy yet. Wait (bounded)
                    // for the rename to show in the records, then ask again.
                    let (path, volume) = (f.path.clone(), l.volume_id.clone());
                    if s.read_node(|n, _| n.copy_move_pending(&path, &volume)) {
                        s.wait_for(MOVE_SETTLE_MS, |n, _| !n.copy_move_pending(&path, &volume)).await;
                        answer = signed(s, &l.node_id, "GET", &target, vec![], vec![]).await;
                        if answer.as_ref().is_ok_and(|r| r.status == 404)
                            && s.read_node(|n, _| n.copy_move_pending(&path, &volume))
                        {
                            renaming.push(format!("{}:{}{}", l.node_id, l.volume_id, f.path));
                            continue;
                        }
                    }
                    // Asked before the holder renamed it, whose drop at the old path came in
                    // since (no rename pending now): asked once more before it counts missing.
                    if answer.as_ref().is_ok_and(|r| r.status == 404) {
                        answer = signed(s, &l.node_id, "GET", &target, vec![], vec![]).await;
                    }
                }
                match answer {
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
    Ok(
        json!({ "files": files.len(), "verified": ok, "stale": bad, "unreachable": unreachable, "renamePending": renaming }),
    )
}
