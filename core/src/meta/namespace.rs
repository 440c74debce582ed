//! The namespace over the file records (spec: cluster-runtime.md "Metadata store (ACMS)" for
//! paths, listing and folder policies, "Replication" for the copy count a file wants, and
//! "Map / reduce" for `metadata.Glob`; reference-facts.md "FileRecord", "Policy", "Map/reduce").
//!
//! This module owns every read of the namespace that depends on the canonical form of a path
//! (which [`crate::meta::path`] owns and this module re-exports). Pure functions over a
//! [`MetaState`]: no I/O, no clock.
//!
//! Invariants it keeps:
//! - a canonical path starts with `/`, has no empty, `.` or `..` segment, no trailing `/` (except
//!   the root itself), no control character, no segment over [`MAX_SEGMENT_BYTES`] and no more than
//!   [`MAX_PATH_BYTES`] in all; [`normalize`] is idempotent and never panics;
//! - file and policy records are keyed by canonical paths (writers normalise first), so a folder
//!   is a contiguous key range and listing or globbing a folder seeks into that range instead of
//!   scanning the whole namespace;
//! - tombstones (`removed` records) are never shown: not listed, not globbed, and a removed policy
//!   applies to nothing;
//! - a directory exists when it has a record (`isDir`) or any live file below it.

use crate::ids::FileId;
pub use crate::meta::path::{
    is_within, name, normalize, parent, PathError, DRIVE_PREFIX, MAX_PATH_BYTES, MAX_SEGMENT_BYTES,
};
use crate::meta::records::{FileRecord, Record, RecordKind};
use crate::meta::state::MetaState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Copies wanted where no folder policy applies (reference-facts.md "Policy ... default 1").
pub const DEFAULT_REPLICAS: u32 = 1;

/// The smallest string greater than every path below `folder` (canonical, not the root): the
/// key range of the folder's descendants is `folder + "/"` up to this.
fn after_subtree(folder: &str) -> String {
    // '0' is the character right after '/', so every "<folder>/..." key sorts before it.
    format!("{folder}0")
}

// ---- listing ----

/// One child of a listed directory (`meta/ls`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListEntry {
    pub name: String,
    pub path: String,
    pub is_dir: bool,
    /// Bytes; 0 for a directory.
    pub size: u64,
    /// Unix ms; 0 for a directory known only from the files below it.
    pub mod_time: u64,
    /// The record's id; `None` for a directory known only from the files below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<FileId>,
}

impl ListEntry {
    fn from_record(name: &str, f: &FileRecord) -> ListEntry {
        ListEntry {
            name: name.to_string(),
            path: f.path.clone(),
            is_dir: f.is_dir,
            size: if f.is_dir { 0 } else { f.size },
            mod_time: f.mod_time,
            id: Some(f.id.clone()),
        }
    }

    fn implicit_dir(name: &str, path: String) -> ListEntry {
        ListEntry { name: name.to_string(), path, is_dir: true, size: 0, mod_time: 0, id: None }
    }
}

/// The immediate children of `dir` (files and directories), sorted by name, tombstones never
/// shown. A child directory is listed when it has a live record of its own or any live file
/// below it. A name that is both a live file record and the parent of live files (two nodes
/// wrote `/a/b` and `/a/b/c` concurrently) lists as a directory, so what lies below stays
/// reachable; the file record itself is still found by [`MetaState::file`].
///
/// Cost: a seek per child directory plus the direct children and the tombstones met on the way;
/// the contents of a child directory are skipped, not scanned. An unknown `dir` lists as empty.
pub fn list(state: &MetaState, dir: &str) -> Result<Vec<ListEntry>, PathError> {
    let dir = normalize(dir)?;
    let prefix = if dir == "/" { dir.clone() } else { format!("{dir}/") };
    let mut children: BTreeMap<String, ListEntry> = BTreeMap::new();
    let mut from = prefix.clone();
    'seek: loop {
        for f in state.files_from(&from) {
            let Some(rest) = f.path.strip_prefix(prefix.as_str()) else { break 'seek };
            match rest.find('/') {
                None if rest.is_empty() || f.removed => {}
                None => match children.get_mut(rest) {
                    // Only reachable with keys that are not canonical; keep the directory.
                    Some(existing) if existing.is_dir && existing.id.is_none() && f.is_dir => {
                        *existing = ListEntry::from_record(rest, f);
                    }
                    Some(_) => {}
                    None => {
                        children.insert(rest.to_string(), ListEntry::from_record(rest, f));
                    }
                },
                Some(_) if f.removed => {}
                Some(i) => {
                    let child = &rest[..i];
                    let child_path = format!("{prefix}{child}");
                    match children.get_mut(child) {
                        Some(existing) if existing.is_dir => {}
                        // A file record shadowed by live files below its name.
                        Some(existing) => *existing = ListEntry::implicit_dir(child, child_path.clone()),
                        None => {
                            children.insert(child.to_string(), ListEntry::implicit_dir(child, child_path.clone()));
                        }
                    }
                    // Everything else below this child says nothing new: jump past it.
                    from = after_subtree(&child_path);
                    continue 'seek;
                }
            }
        }
        break;
    }
    Ok(children.into_values().collect())
}

// ---- folder policies ----

/// Copies wanted under the nearest live folder policy at or above `path` (the path itself, its
/// parent, ... up to the root), [`DEFAULT_REPLICAS`] when none applies. A policy never asks for
/// fewer than one copy. Policy records are keyed by canonical folder paths; `path` is
/// normalised first (used as given if it cannot be). Cost: one lookup per ancestor.
pub fn policy_for(state: &MetaState, path: &str) -> u32 {
    let canonical = normalize(path).ok();
    let mut at: &str = canonical.as_deref().unwrap_or(path);
    loop {
        if let Some(Record::Policy(p)) = state.get(RecordKind::Policy, at) {
            if !p.removed {
                return p.replicas.max(1);
            }
        }
        match parent(at) {
            Some(up) => at = up,
            None => return DEFAULT_REPLICAS,
        }
    }
}

/// Copies the replication planner keeps of `file`: the record's own `replicas` when set (> 0),
/// otherwise its folder policy (spec "Replication").
pub fn wanted_copies(state: &MetaState, file: &FileRecord) -> u32 {
    if file.replicas > 0 {
        file.replicas
    } else {
        policy_for(state, &file.path)
    }
}

// ---- globs ----

/// One character class of a segment pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters within the segment.
    Star,
    /// `?`: exactly one character.
    One,
    Char(char),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// A segment without wildcards, compared as is.
    Exact(String),
    /// A segment with `*` or `?`.
    Wild(Vec<Token>),
    /// `**` as a whole segment: zero or more folders.
    Folders,
}

/// A parsed glob pattern (`metadata.Glob`, spec "Map / reduce"): `*` matches within one segment,
/// `?` one character other than `/`, and `**` as a whole segment zero or more whole folders, so
/// `/a/**/x` matches `/a/x` and `/a/b/c/x`. A trailing `**` stands for the folders and the file
/// name below them, so `/a/**` matches every file under `/a` (and not `/a` itself). A `**`
/// inside a segment (`a**b`) is two `*`. There is no escape: `\` is a separator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    segments: Vec<Segment>,
}

impl Pattern {
    /// Normalise `pattern` like a path (so `cluster:photos\**` is `/photos/**`) and parse it.
    pub fn parse(pattern: &str) -> Result<Pattern, PathError> {
        let source = normalize(pattern)?;
        let segments = source
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s == "**" {
                    Segment::Folders
                } else if s.contains(['*', '?']) {
                    Segment::Wild(
                        s.chars()
                            .map(|c| match c {
                                '*' => Token::Star,
                                '?' => Token::One,
                                c => Token::Char(c),
                            })
                            .collect(),
                    )
                } else {
                    Segment::Exact(s.to_string())
                }
            })
            .collect();
        Ok(Pattern { source, segments })
    }

    /// The normalised pattern.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The pattern is a plain path (no wildcard at all).
    pub fn is_literal(&self) -> bool {
        self.segments.iter().all(|s| matches!(s, Segment::Exact(_)))
    }

    /// What every matching path starts with: the segments before the first wildcard, and the
    /// characters of that segment before its first wildcard (the whole path for a literal
    /// pattern). Matching paths form one key range.
    pub fn literal_prefix(&self) -> String {
        if self.is_literal() {
            return self.source.clone();
        }
        let mut out = String::from("/");
        for s in &self.segments {
            match s {
                Segment::Exact(name) => {
                    out.push_str(name);
                    out.push('/');
                }
                Segment::Wild(tokens) => {
                    out.extend(tokens.iter().map_while(|t| match t {
                        Token::Char(c) => Some(*c),
                        _ => None,
                    }));
                    return out;
                }
                Segment::Folders => return out,
            }
        }
        out
    }

    /// Whether the canonical `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (m, n) = (self.segments.len(), names.len());
        if !self.segments.contains(&Segment::Folders) && m != n {
            return false;
        }
        // next[j]: segments[i + 1..] match names[j..]; filled from the last segment back.
        let mut next = vec![false; n + 1];
        next[n] = true;
        let mut cur = vec![false; n + 1];
        for (i, seg) in self.segments.iter().enumerate().rev() {
            for j in (0..=n).rev() {
                cur[j] = match seg {
                    Segment::Folders if i + 1 == m => j < n,
                    Segment::Folders => next[j] || (j < n && cur[j + 1]),
                    Segment::Exact(s) => j < n && names[j] == s.as_str() && next[j + 1],
                    Segment::Wild(tokens) => j < n && next[j + 1] && segment_matches(tokens, names[j]),
                };
            }
            std::mem::swap(&mut next, &mut cur);
        }
        next[0]
    }
}

/// `*`/`?` matching of one segment: greedy, backtracking to the last `*` only, so linear in
/// practice and O(pattern × name) at worst.
fn segment_matches(tokens: &[Token], name: &str) -> bool {
    let (mut ti, mut si) = (0usize, 0usize);
    // The last `*` seen and the name position it currently stands up to.
    let mut star: Option<(usize, usize)> = None;
    while let Some(c) = name[si..].chars().next() {
        match tokens.get(ti) {
            Some(Token::One) => {
                ti += 1;
                si += c.len_utf8();
            }
            Some(Token::Char(p)) if *p == c => {
                ti += 1;
                si += c.len_utf8();
            }
            Some(Token::Star) => {
                star = Some((ti, si));
                ti += 1;
            }
            _ => match star {
                Some((st, ss)) => {
                    // Let that `*` swallow one more character and retry after it.
                    let skipped = name[ss..].chars().next().map_or(1, char::len_utf8);
                    star = Some((st, ss + skipped));
                    ti = st + 1;
                    si = ss + skipped;
                }
                None => return false,
            },
        }
    }
    tokens[ti..].iter().all(|t| *t == Token::Star)
}

/// The live files (never directories, never tombstones) matching `pattern`, sorted by path.
/// Only the key range of the pattern's literal prefix is scanned, and a pattern without
/// wildcards is a single lookup.
pub fn glob(state: &MetaState, pattern: &str) -> Result<Vec<String>, PathError> {
    let pattern = Pattern::parse(pattern)?;
    if pattern.is_literal() {
        return Ok(match state.file(pattern.as_str()) {
            Some(f) if !f.removed && !f.is_dir => vec![f.path.clone()],
            _ => Vec::new(),
        });
    }
    let prefix = pattern.literal_prefix();
    Ok(state
        .files_from(&prefix)
        .take_while(|f| f.path.starts_with(prefix.as_str()))
        .filter(|f| !f.removed && !f.is_dir && pattern.matches(&f.path))
        .map(|f| f.path.clone())
        .collect())
}
