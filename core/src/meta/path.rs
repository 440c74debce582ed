//! The canonical form of a path in `cluster:/` (spec: cluster-runtime.md "Metadata store
//! (ACMS)" for paths). Pure string functions that import nothing else of `meta`, so records,
//! the state and the namespace can all lean on them without a cycle.
//!
//! A canonical path starts with `/`, has no empty, `.` or `..` segment, no trailing `/` (except
//! the root itself), no control character, no segment over [`MAX_SEGMENT_BYTES`] and no more
//! than [`MAX_PATH_BYTES`] in all; [`normalize`] is idempotent and never panics.

/// Longest path segment, in bytes (what common file systems accept for one name).
pub const MAX_SEGMENT_BYTES: usize = 255;
/// Longest canonical path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The drive prefix a path may be written with (`cluster:/photos/a.jpg`, DESIGN.md "Names").
pub const DRIVE_PREFIX: &str = "cluster:";

/// Why a path (or a glob pattern) was refused. Byte offsets are into the string as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path contains a NUL byte at byte {at}")]
    Nul { at: usize },
    #[error("path contains the control character U+{code:04X} at byte {at}")]
    Control { code: u32, at: usize },
    #[error("path segment of {len} bytes is longer than the {max} allowed", max = MAX_SEGMENT_BYTES)]
    SegmentTooLong { len: usize },
    #[error("path of {len} bytes is longer than the {max} allowed", max = MAX_PATH_BYTES)]
    TooLong { len: usize },
    #[error("path climbs above the root with '..' (segment {segment})")]
    AboveRoot { segment: usize },
}

/// The canonical form of `path`: an optional `cluster:` prefix is dropped, `\` is a separator
/// like `/`, repeated separators collapse, `.` segments vanish and `..` removes the segment
/// before it, and a trailing separator is dropped. The empty path is the root.
///
/// `cluster:photos\x\y` → `/photos/x/y`, `/a/../x` → `/x`, `""` → `/`.
///
/// Refused: control characters (NUL included) anywhere in the input, a `..` with nothing left
/// to remove (it would climb above the root: `/../x`, `a/../../x`; only a traversal attempt
/// spells that, issue 17), any segment over [`MAX_SEGMENT_BYTES`] (even one a later `..` would
/// remove) and a result over [`MAX_PATH_BYTES`].
pub fn normalize(path: &str) -> Result<String, PathError> {
    if let Some((at, c)) = path.char_indices().find(|(_, c)| c.is_control()) {
        return Err(if c == '\0' { PathError::Nul { at } } else { PathError::Control { code: u32::from(c), at } });
    }
    let rest = path.strip_prefix(DRIVE_PREFIX).unwrap_or(path);
    let mut segments: Vec<&str> = Vec::new();
    for (i, segment) in rest.split(['/', '\\']).enumerate() {
        match segment {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot { segment: i });
                }
            }
            s if s.len() > MAX_SEGMENT_BYTES => return Err(PathError::SegmentTooLong { len: s.len() }),
            s => segments.push(s),
        }
    }
    if segments.is_empty() {
        return Ok("/".to_string());
    }
    let len: usize = segments.iter().map(|s| s.len() + 1).sum();
    if len > MAX_PATH_BYTES {
        return Err(PathError::TooLong { len });
    }
    let mut out = String::with_capacity(len);
    for s in segments {
        out.push('/');
        out.push_str(s);
    }
    Ok(out)
}

/// The folder holding a canonical path; `None` for the root (and for a string with no `/`).
pub fn parent(path: &str) -> Option<&str> {
    match path.rfind('/') {
        Some(0) if path.len() > 1 => Some("/"),
        Some(0) | None => None,
        Some(i) => Some(&path[..i]),
    }
}

/// The last segment of a canonical path; empty for the root.
pub fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether the canonical `path` is `folder` itself or lies below it. `/a` does not contain
/// `/ab`; the root contains every canonical path. A trailing `/` on `folder` is ignored.
pub fn is_within(path: &str, folder: &str) -> bool {
    let folder = folder.trim_end_matches('/');
    if folder.is_empty() {
        return path.starts_with('/');
    }
    match path.strip_prefix(folder) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}
