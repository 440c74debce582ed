//! Volumes on this node's disk (spec: "Storage (ACS) and the cluster:/ drive" → Volumes):
//! checking a folder an admin contributes, and measuring the local volumes for the usage
//! reports and the low-space guard. The records and their rules live in the core.

use shoal_core::node::ApiError;
use std::path::{Path, PathBuf};

/// Check and prepare a folder to contribute: an absolute path, created if missing, a directory,
/// not inside the node's data dir (nor containing it). Returns the canonical path.
pub fn prepare_folder(data_dir: &Path, path: &str) -> Result<String, ApiError> {
    let bad = |m: String| ApiError::new(400, "bad_path", m);
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
    std::fs::create_dir_all(&p).map_err(|e| bad(format!("cannot create {path}: {e}")))?;
    let canon = std::fs::canonicalize(&p).map_err(|e| bad(format!("cannot resolve {path}: {e}")))?;
    let data = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    if canon.starts_with(&data) || data.starts_with(&canon) {
        return Err(bad(format!("{} overlaps the node's data dir {}", canon.display(), data.display())));
    }
    canon.to_str().map(str::to_string).ok_or_else(|| bad(format!("{} is not valid UTF-8", canon.display())))
}
