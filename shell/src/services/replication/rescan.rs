//! Rescans: walk this node's volume folders and compare them with the records: adopt files
//! with no record, add right copies the records do not list, restore stale copies whose bytes
//! are right again, mark copies that vanished or changed stale, remove old part files.

use super::*;
use crate::disk::{file_clock, mtime_ms};
use shoal_core::node::rescan::{Found, RescanCheck, RescanDid};

/// Walk this node's volume folders and carry out the core's rescan plan for each: adopt files
/// with no record, add right copies the records do not list, restore stale copies whose bytes
/// are right again, mark copies that vanished or changed stale.
pub async fn rescan<E: Env>(s: &Arc<Shared<E>>) -> Value {
    lock(&s.repl.stats).rescans += 1;
    let mut report = Vec::new();
    for (volume, folder) in s.read_node(|n, _| n.local_volumes()) {
        // The records are read before the walk: bytes that land and are recorded while it runs
        // are then neither found nor listed, rather than listed and not found (vanished).
        let facts = s.read_node(|n, _| n.volume_facts(&volume));
        let root = PathBuf::from(&folder);
        // Part files of uploads and pulls cut short: which are leftovers is the core's rule
        // (`transfer::leftover_part_file`), read on the clock that stamped their mtimes, the
        // file system's (in the simulator the node's clock is simulated and the files' are not).
        let (started, now) = (lock(&s.repl.started).unwrap_or(shoal_core::Millis(0)), file_clock());
        let (found, parts_removed, kept) = s
            .blocking(move || {
                let Walked { files: found, parts, kept } = walk(&root);
                let old: Vec<PathBuf> = parts
                    .into_iter()
                    .filter(|(_, mtime)| transfer::leftover_part_file(*mtime, started, now))
                    .map(|(p, _)| p)
                    .collect();
                let removed = old.iter().filter(|p| std::fs::remove_file(p).is_ok()).count();
                (found, removed, kept)
            })
            .await;
        // Bytes an overwrite kept aside (this run's are noted already; a restart's are found
        // here): the reconciler puts them back or drops them as the records settle.
        s.with_node(|n, _| {
            for (path, sum) in &kept {
                n.kept_note(&volume, path, sum);
            }
            // This volume walked: what is kept on it is all noted now.
            n.kept_walked(&volume);
        });
        // What each file found means is the core's (`shoal_core::node::rescan`); this walks,
        // asks the leader before an adoption, and hashes.
        let found: Vec<Found> =
            found.into_iter().map(|(path, size, mtime_ms)| Found { path, size, mtime_ms }).collect();
        let plan = facts.rescan_plan(&found);
        let (mut adopted, mut stale, mut added, mut restored, mut not_adopted) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for (path, check) in &plan.checks {
            // This node's records may lag (it just came back, or is cut off): a file the
            // cluster already has is not adopted over it.
            if let RescanCheck::Adopt { mtime_ms } = check {
                if !adoptable_by_leader(s, path, *mtime_ms).await {
                    not_adopted += 1;
                    continue;
                }
            }
            let hashed = match confined_path(Path::new(&folder), path, false) {
                Ok(file) => hash_file(s, file).await.ok(),
                Err(_) => continue,
            };
            // Under the landing lock, and not while bytes a write landed at this path are
            // unsettled (their record is on its way; the next rescan looks again): the core
            // adopts none that landed moments ago either, nor bytes this node's last run may
            // have landed just before it stopped (noted first, with the hash just taken). The
            // other checks only add, restore or mark stale copies of the content the records
            // name: bytes from before the start hold none of them back.
            let landed = &s.store_service.landed;
            if let (RescanCheck::Adopt { mtime_ms }, Some((_, sum))) = (check, &hashed) {
                landed.note_if_unknown(s, &volume, path, *mtime_ms, || sum.clone());
            }
            let outcome = landed
                .unless_noted(s, &volume, &[path], || {
                    s.with_node(|n, now| n.rescan_outcome(now, &volume, path, check, hashed))
                })
                .unwrap_or(match check {
                    RescanCheck::Adopt { .. } => RescanDid::NotAdopted,
                    _ => RescanDid::Nothing,
                });
            match outcome {
                RescanDid::MarkedStale => stale += 1,
                RescanDid::Restored => restored += 1,
                RescanDid::Added => added += 1,
                RescanDid::Adopted => adopted += 1,
                RescanDid::NotAdopted => not_adopted += 1,
                RescanDid::Nothing => {}
            }
        }
        // A rename or a write that ran during the walk may have hidden a file from it: what
        // is on disk now, at its path or at a path a move's rename takes it from, is no
        // vanished copy (the next rescan looks again). The old paths are looked at first: a
        // rename is atomic, so bytes gone from there are already at the new path.
        let (dir, arriving) = (PathBuf::from(&folder), facts.arriving.clone());
        let vanished: Vec<(String, String)> = s
            .blocking(move || {
                let here = |p: &str| confined_path(&dir, p, false).is_ok_and(|f| f.is_file());
                plan.vanished
                    .into_iter()
                    .filter(|(p, _)| !arriving.get(p).is_some_and(|from| from.iter().any(|f| here(f))) && !here(p))
                    .collect()
            })
            .await;
        stale += s.with_node(|n, now| n.rescan_vanished(now, &volume, &vanished));
        lock(&s.repl.stats).adopted += adopted;
        if stale > 0 || restored > 0 {
            s.repl_kick();
        }
        report.push(json!({"volumeId": volume, "files": found.len(), "adopted": adopted, "notAdopted": not_adopted, "copiesAdded": added, "copiesRestored": restored, "markedStale": stale, "partFilesRemoved": parts_removed}));
    }
    json!({ "volumes": report })
}

/// Whether the metadata leader's records let bytes found at `path`, modified at `mtime_ms`,
/// be adopted ([`shoal_core::node::Node::adoptable`]: no live file there, no removal of it
/// since; this node's own records, when it is the leader). No leader known, or no clear
/// answer: nothing is adopted. A leader of an older version that does not answer `adoptable`
/// is read by its `live` alone.
pub(super) async fn adoptable_by_leader<E: Env>(s: &Arc<Shared<E>>, path: &str, mtime_ms: u64) -> bool {
    let (me, leader) = s.read_node(|n, now| (n.id().clone(), n.meta_leader(now).map(|l| l.holder.clone())));
    let Some(leader) = leader else { return false };
    if leader == me {
        return s.read_node(|n, _| n.adoptable(path, mtime_ms));
    }
    let target = format!("/cluster/acn/meta/file?path={}&mtime={mtime_ms}", crate::wire::escape_query(path));
    match signed(s, &leader, "GET", &target, vec![], vec![]).await {
        Ok(r) if r.status == 200 => serde_json::from_slice::<Value>(&r.body).is_ok_and(|v| match &v["adoptable"] {
            Value::Bool(b) => *b,
            _ => v["live"] == Value::Bool(false),
        }),
        _ => false,
    }
}

/// What a walk of a volume folder finds: regular files as (cluster path, size, mtime ms), and
/// apart the part files shoal writes (with their mtime ms) and the bytes overwrites kept aside
/// (cluster path, checksum); symlinks are skipped, and names that are not valid cluster paths
/// too.
pub(super) struct Walked {
    pub files: Vec<(String, u64, u64)>,
    pub parts: Vec<(PathBuf, u64)>,
    pub kept: Vec<(String, String)>,
}

pub(super) fn walk(root: &Path) -> Walked {
    let mut out = Vec::new();
    let mut parts = Vec::new();
    let mut kept = Vec::new();
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
                    parts.push((e.path(), mtime_ms(&md)));
                } else if let Some((final_name, sum)) = transfer::parse_kept_file_name(&name).filter(|_| md.is_file()) {
                    kept.push((format!("{prefix}/{final_name}"), sum.to_string()));
                }
                continue;
            }
            if md.is_dir() {
                stack.push((e.path(), path));
            } else if md.is_file() {
                if shoal_core::meta::namespace::normalize(&path).ok().as_deref() != Some(path.as_str()) {
                    continue;
                }
                let mtime = mtime_ms(&md);
                // The mtime, not the ctime: shoal's own renames of copies move a ctime, and a
                // leftover renamed late would then look newer than the removal of its path
                // (the chaos test saw moved and removed paths come back so).
                out.push((path, md.len(), mtime));
            }
        }
    }
    out.sort();
    kept.sort();
    Walked { files: out, parts, kept }
}

/// Whether `name` is one of the part files shoal writes: `<name>.part-<16 hex>` (an upload
/// session or a put's local copy) or `<name>.part-repl<16 hex>` (a pull).
pub(super) fn is_part_file(name: &str) -> bool {
    let Some((_, tag)) = name.rsplit_once(transfer::PART_MARK) else { return false };
    let tag = tag.strip_prefix("repl").unwrap_or(tag);
    tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit())
}
