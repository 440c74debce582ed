//! Map/reduce coordination on the leader (spec "Map / reduce"; reference-facts.md
//! "Map/reduce"): the dataset grouped by a node holding a healthy copy, partitions of
//! `partitionMax` files each pinned to where its bytes are, one reduce after every map, and the
//! parent's end. The parent itself never runs on a node.
//!
//! Unlike the reference, the reduce input is not capped at 8 MiB: each map child's pairs are
//! kept in its record when small and spilled to a `cluster:/` file when large
//! ([`super::SPILL_BYTES`]); the reduce child reads them from there and groups them itself.

use crate::ids::{JobId, NodeId};
use crate::meta::job::{JobKind, JobSpec, JobStatus};
use std::collections::BTreeMap;

/// Longest "no reachable copy of: ..." message (reference: 300 characters).
pub const UNREACHABLE_MSG_MAX: usize = 300;

/// One file of the dataset and the usable nodes holding a healthy copy of it, best first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub path: String,
    pub holders: Vec<NodeId>,
}

/// One map child's share: its files, and the nodes it is pinned to (each holds them all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub files: Vec<String>,
    pub nodes: Vec<NodeId>,
}

/// What a dataset becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// Nothing matched: the parent succeeds with `{}`.
    Empty,
    /// Some file has no healthy copy on a usable node: the parent fails naming them.
    Unreachable(String),
    Partitions(Vec<Partition>),
}

/// Group the dataset by its first holder (within `allowed` when the parent is pinned), then
/// split each group into partitions of at most `partition_max` files. A partition is pinned to
/// every node that holds all of its files (its group's node first).
pub fn expand(files: &[Holding], partition_max: u32, allowed: &[NodeId]) -> Expansion {
    if files.is_empty() {
        return Expansion::Empty;
    }
    let ok = |n: &NodeId| allowed.is_empty() || allowed.contains(n);
    let unreachable: Vec<&str> = files.iter().filter(|f| !f.holders.iter().any(ok)).map(|f| f.path.as_str()).collect();
    if !unreachable.is_empty() {
        let mut msg = format!("no reachable copy of: {}", unreachable.join(", "));
        if msg.len() > UNREACHABLE_MSG_MAX {
            let mut cut = UNREACHABLE_MSG_MAX - 3;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
            msg.push_str("...");
        }
        return Expansion::Unreachable(msg);
    }
    let mut groups: BTreeMap<NodeId, Vec<&Holding>> = BTreeMap::new();
    for f in files {
        let first = f.holders.iter().find(|n| ok(n)).expect("checked above").clone();
        groups.entry(first).or_default().push(f);
    }
    let size = partition_max.max(1) as usize;
    let mut out = Vec::new();
    for (node, group) in groups {
        for chunk in group.chunks(size) {
            let mut nodes = vec![node.clone()];
            if let Some(first) = chunk.first() {
                for other in first.holders.iter().filter(|n| **n != node && ok(n)) {
                    if chunk.iter().all(|f| f.holders.contains(other)) {
                        nodes.push(other.clone());
                    }
                }
            }
            out.push(Partition { files: chunk.iter().map(|f| f.path.clone()).collect(), nodes });
        }
    }
    Expansion::Partitions(out)
}

/// The spec of a map child (`index` from 1) or of the reduce child (`index` 0).
pub fn child_spec(
    parent: &JobSpec,
    parent_id: &JobId,
    kind: JobKind,
    index: usize,
    p: Option<&Partition>,
    created: u64,
) -> JobSpec {
    let name = match kind {
        JobKind::Map => format!("{} map {index}", parent.name),
        _ => format!("{} reduce", parent.name),
    };
    JobSpec {
        name,
        kind,
        parent_id: Some(parent_id.clone()),
        inputs: p.map(|p| p.files.clone()).unwrap_or_default(),
        nodes: p.map(|p| p.nodes.clone()).unwrap_or_else(|| parent.nodes.clone()),
        dataset: String::new(),
        created,
        ..parent.clone()
    }
}

/// A child as the parent's step sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildView<'a> {
    pub id: &'a JobId,
    pub kind: JobKind,
    pub status: JobStatus,
    pub error: &'a str,
}

/// What the leader does next with a running map/reduce parent.
#[derive(Clone, Debug, PartialEq)]
pub enum ParentStep {
    /// Children still running; the parent's progress.
    Wait { progress: f64 },
    /// Every map succeeded and there is no reduce yet: submit it.
    Reduce,
    /// The reduce succeeded: the parent succeeds with its output.
    Succeed { reduce: JobId },
    /// A child failed or was cancelled: the parent fails, the rest are cancelled.
    Fail { error: String },
}

/// The parent's next step from its children (maps and at most one reduce).
pub fn parent_step(children: &[ChildView]) -> ParentStep {
    if let Some(bad) = children.iter().find(|c| matches!(c.status, JobStatus::Failed | JobStatus::Cancelled)) {
        let what = if bad.status == JobStatus::Cancelled {
            "was cancelled".to_string()
        } else {
            format!("failed: {}", bad.error)
        };
        return ParentStep::Fail { error: format!("child {} ({}) {what}", bad.id, bad.kind.as_str()) };
    }
    let maps: Vec<&ChildView> = children.iter().filter(|c| c.kind == JobKind::Map).collect();
    let done = maps.iter().filter(|c| c.status == JobStatus::Succeeded).count();
    match children.iter().find(|c| c.kind == JobKind::Reduce) {
        Some(r) if r.status == JobStatus::Succeeded => ParentStep::Succeed { reduce: r.id.clone() },
        Some(_) => ParentStep::Wait { progress: done as f64 / (maps.len() + 1) as f64 },
        None if done == maps.len() => ParentStep::Reduce,
        None => ParentStep::Wait { progress: done as f64 / (maps.len() + 1) as f64 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(path: &str, holders: &[&str]) -> Holding {
        Holding { path: path.into(), holders: holders.iter().map(|n| NodeId::new(*n)).collect() }
    }

    #[test]
    fn files_are_grouped_by_holder_and_split_into_partitions() {
        let files = [h("/a", &["n1"]), h("/b", &["n2", "n1"]), h("/c", &["n1", "n2"]), h("/d", &["n1"])];
        let Expansion::Partitions(p) = expand(&files, 2, &[]) else { panic!() };
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].files, ["/a", "/c"]);
        assert_eq!(p[0].nodes, [NodeId::new("n1")], "n2 lacks /a");
        assert_eq!(p[1].files, ["/d"]);
        assert_eq!(p[2].files, ["/b"]);
        assert_eq!(p[2].nodes, [NodeId::new("n2"), NodeId::new("n1")]);
    }

    #[test]
    fn an_empty_dataset_and_an_unreachable_file() {
        assert_eq!(expand(&[], 50, &[]), Expansion::Empty);
        let Expansion::Unreachable(msg) = expand(&[h("/a", &["n1"]), h("/lost", &[])], 50, &[]) else { panic!() };
        assert_eq!(msg, "no reachable copy of: /lost");
        let many: Vec<Holding> = (0..100).map(|i| h(&format!("/file-{i:04}"), &[])).collect();
        let Expansion::Unreachable(msg) = expand(&many, 50, &[]) else { panic!() };
        assert!(msg.len() <= UNREACHABLE_MSG_MAX && msg.ends_with("..."));
        // A pinned parent: a copy only outside its nodes is no copy.
        let pinned = [NodeId::new("n2")];
        assert!(matches!(expand(&[h("/a", &["n1"])], 50, &pinned), Expansion::Unreachable(_)));
    }

    #[test]
    fn the_parent_follows_its_children() {
        let ids: Vec<JobId> = (0..3).map(|i| JobId::new(format!("c{i}"))).collect();
        let v = |i: usize, kind, status| ChildView { id: &ids[i], kind, status, error: "boom" };
        use JobKind::*;
        use JobStatus::*;
        assert_eq!(parent_step(&[v(0, Map, Succeeded), v(1, Map, Running)]), ParentStep::Wait { progress: 1.0 / 3.0 });
        assert_eq!(parent_step(&[v(0, Map, Succeeded), v(1, Map, Succeeded)]), ParentStep::Reduce);
        assert_eq!(
            parent_step(&[v(0, Map, Succeeded), v(1, Map, Succeeded), v(2, Reduce, Succeeded)]),
            ParentStep::Succeed { reduce: ids[2].clone() }
        );
        assert!(matches!(parent_step(&[v(0, Map, Failed), v(1, Map, Running)]), ParentStep::Fail { .. }));
    }
}
