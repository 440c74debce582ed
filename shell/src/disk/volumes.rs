//! Volumes on this node's disk (spec: "Storage (ACS) and the cluster:/ drive" → Volumes):
//! checking a folder an admin contributes, and measuring the local volumes for the usage
//! reports and the low-space guard. The records and their rules live in the core
//! (`shoal_core::node::volumes`); this module gathers the facts they judge.

use shoal_core::node::volumes::{volume_folder_refusal, FolderFacts};
use shoal_core::node::ApiError;
use std::path::{Component, Path, PathBuf};

/// Files whose presence marks a shoal data dir.
const DATA_DIR_MARKS: &[&str] = &["node.key", "admin.token", "cluster.redb"];
/// How much of a folder's tree is looked through for a shoal data dir below it.
const BELOW_DEPTH: usize = 2;
const BELOW_ENTRIES_MAX: usize = 4_096;

/// Check and prepare a folder to contribute: an absolute path, a directory, not inside the
/// node's data dir (nor containing it), and not refused by the core's rule (a pseudo-filesystem,
/// a system folder, another shoal data dir); a missing folder is refused unless `create`, and
/// then created only once it passes. Returns
/// the canonical path and the facts the core judges again when it adds the volume.
pub fn prepare_folder(data_dir: &Path, path: &str, create: bool) -> Result<(String, FolderFacts), ApiError> {
    let bad = |m: String| ApiError::invalid("bad_path", m);
    if path.is_empty() || path.len() > 4096 || path.chars().any(|c| c.is_control()) {
        return Err(bad("a volume path is 1 to 4096 characters without control characters".into()));
    }
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(bad(format!("{path:?} is not an absolute path")));
    }
    if p.exists() && !p.is_dir() {
        return Err(bad(format!("{path} exists and is not a directory")));
    }
    if !p.exists() && !create {
        // A typo or an unmounted disk would otherwise fill the root disk.
        return Err(bad(format!("{path} does not exist: mount or create it, or ask for it to be created (--create)")));
    }
    // Judge the path it will have before creating anything: the canonical form of the part
    // that exists, then the rest.
    let canon = canonical_to_be(&p).map_err(|e| bad(format!("cannot resolve {path}: {e}")))?;
    let data = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    if canon.starts_with(&data) || data.starts_with(&canon) {
        return Err(bad(format!("{} overlaps the node's data dir {}", canon.display(), data.display())));
    }
    let text =
        canon.to_str().map(str::to_string).ok_or_else(|| bad(format!("{} is not valid UTF-8", canon.display())))?;
    let facts = FolderFacts { fs_type: fs_type_of(&canon), shoal_data: shoal_data_near(&canon) };
    if let Some(why) = volume_folder_refusal(&text, &facts) {
        return Err(bad(why));
    }
    std::fs::create_dir_all(&canon).map_err(|e| bad(format!("cannot create {path}: {e}")))?;
    let made = std::fs::canonicalize(&canon).map_err(|e| bad(format!("cannot resolve {path}: {e}")))?;
    if made != canon {
        return Err(bad(format!("{path} moved while it was created (now {})", made.display())));
    }
    Ok((text, facts))
}

/// The canonical path `p` will have: its longest existing prefix resolved, the rest appended
/// (`..` in the rest is refused).
fn canonical_to_be(p: &Path) -> std::io::Result<PathBuf> {
    let mut existing = p.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) && !rest.is_empty() {
        return Err(std::io::Error::other("\"..\" in a folder that does not exist yet"));
    }
    let mut out = std::fs::canonicalize(&existing)?;
    out.extend(rest.iter().rev());
    Ok(out)
}

/// The type of the filesystem holding `path`, from `/proc/self/mountinfo` (empty if unknown).
pub fn fs_type_of(path: &Path) -> String {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return String::new() };
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(mount), Some(fs)) = (fields.get(4), fields.get(dash + 1)) else { continue };
        let mount = PathBuf::from(unescape_mount(mount));
        if path.starts_with(&mount) {
            let len = mount.as_os_str().len();
            if best.as_ref().is_none_or(|(l, _)| len >= *l) {
                best = Some((len, fs.to_string()));
            }
        }
    }
    best.map(|(_, fs)| fs).unwrap_or_default()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A folder holding a shoal data dir at `folder`, above it, or up to two levels below it.
fn shoal_data_near(folder: &Path) -> Option<String> {
    let is_data_dir = |d: &Path| DATA_DIR_MARKS.iter().any(|m| d.join(m).is_file());
    for d in folder.ancestors() {
        if is_data_dir(d) {
            return Some(d.display().to_string());
        }
    }
    let mut seen = 0;
    let mut stack = vec![(folder.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            seen += 1;
            if seen > BELOW_ENTRIES_MAX {
                return None;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                let p = e.path();
                if is_data_dir(&p) {
                    return Some(p.display().to_string());
                }
                if depth + 1 < BELOW_DEPTH {
                    stack.push((p, depth + 1));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape_mount("/mnt/my\\040disk"), "/mnt/my disk");
        assert_eq!(unescape_mount("/plain"), "/plain");
        assert_eq!(unescape_mount("/odd\\04"), "/odd\\04");
    }

    #[test]
    fn the_root_and_proc_are_known_filesystems_here() {
        assert_eq!(fs_type_of(Path::new("/proc/self")), "proc");
        assert!(!fs_type_of(Path::new("/")).is_empty());
    }
}
