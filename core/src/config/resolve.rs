//! Resolution (spec mesh-config.md "How a value resolves"): for every module placed on a node,
//! for every key its manifest (of the build that node runs) declares: the manifest's default,
//! then the mesh value of the predefined key it falls back to, then the node value of that key
//! on the node, then the module's own value on the node, the most specific winning. A key that
//! names no predefined key resolves from its default and the module's own value only. A
//! required key nothing sets is `unset`.
//!
//! [`Resolver`] keeps the resolved values and recomputes only what a change can move: a
//! mesh or node value touches the keys falling back to it (found through an index), a module
//! value one key. Every pass returns the values that moved and nothing else.

use super::types::Declaration;
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A module's declared keys, as one build ships them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub module: String,
    pub keys: Vec<Declaration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Default,
    Mesh,
    Node,
    Module,
    Unset,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resolved {
    pub value: Option<Value>,
    pub source: Source,
}

/// Where a value is set: `mesh.<key>`, `node.<node>.<key>`, `module.<node>.<module>.<key>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "level")]
pub enum Level {
    Mesh { key: String },
    Node { node: NodeId, key: String },
    Module { node: NodeId, module: String, key: String },
}

impl Level {
    /// The stored name of the level: `mesh.K`, `node.N.K`, `module.N.M.K`.
    pub fn name(&self) -> String {
        match self {
            Level::Mesh { key } => format!("mesh.{key}"),
            Level::Node { node, key } => format!("node.{node}.{key}"),
            Level::Module { node, module, key } => format!("module.{node}.{module}.{key}"),
        }
    }

    /// Parse a stored name (node ids and module names hold no dots; keys may).
    pub fn parse(s: &str) -> Option<Level> {
        let (kind, rest) = s.split_once('.')?;
        let nonempty = |x: &str| (!x.is_empty()).then(|| x.to_string());
        match kind {
            "mesh" => Some(Level::Mesh { key: nonempty(rest)? }),
            "node" => {
                let (node, key) = rest.split_once('.')?;
                Some(Level::Node { node: NodeId::new(nonempty(node)?), key: nonempty(key)? })
            }
            "module" => {
                let (node, rest) = rest.split_once('.')?;
                let (module, key) = rest.split_once('.')?;
                Some(Level::Module {
                    node: NodeId::new(nonempty(node)?),
                    module: nonempty(module)?,
                    key: nonempty(key)?,
                })
            }
            _ => None,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            Level::Mesh { key } | Level::Node { key, .. } | Level::Module { key, .. } => key,
        }
    }
}

/// One resolved value that moved: where, and from what to what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub node: NodeId,
    pub module: String,
    pub key: String,
    pub from: Option<Resolved>,
    pub to: Resolved,
}

/// The manifests of one build, indexed by the predefined key each declaration falls back to.
#[derive(Clone, Debug, Default)]
struct Catalog {
    manifests: BTreeMap<String, Manifest>,
    /// predefined key -> (module, index of the declaration).
    by_fallback: BTreeMap<String, Vec<(String, usize)>>,
}

impl Catalog {
    fn new(manifests: Vec<Manifest>) -> Catalog {
        let mut c = Catalog::default();
        for m in manifests {
            for (i, d) in m.keys.iter().enumerate() {
                if let Some(f) = &d.fallback {
                    c.by_fallback.entry(f.clone()).or_default().push((m.module.clone(), i));
                }
            }
            c.manifests.insert(m.module.clone(), m);
        }
        c
    }
}

type Slot = (NodeId, String, String);

/// Resolved values of every placed module on every node, kept up to date.
#[derive(Clone, Debug, Default)]
pub struct Resolver {
    catalogs: BTreeMap<String, Catalog>,
    /// The build each node runs.
    builds: BTreeMap<NodeId, String>,
    /// Modules placed on each node.
    placement: BTreeMap<NodeId, BTreeSet<String>>,
    /// Values by level.
    values: BTreeMap<Level, Value>,
    resolved: BTreeMap<Slot, Resolved>,
    /// Placed modules the node's build has no manifest for, with why.
    unresolved: BTreeMap<(NodeId, String), String>,
}

impl Resolver {
    pub fn new() -> Resolver {
        Resolver::default()
    }

    /// The manifests of `build` (replacing what was known of it).
    pub fn set_build_manifests(&mut self, build: &str, manifests: Vec<Manifest>) {
        self.catalogs.insert(build.to_string(), Catalog::new(manifests));
    }

    /// Node `node` runs `build` with `modules` placed on it.
    pub fn set_node(&mut self, node: NodeId, build: &str, modules: BTreeSet<String>) {
        self.builds.insert(node.clone(), build.to_string());
        self.placement.insert(node, modules);
    }

    pub fn remove_node(&mut self, node: &NodeId) {
        self.builds.remove(node);
        self.placement.remove(node);
        self.resolved.retain(|(n, _, _), _| n != node);
        self.unresolved.retain(|(n, _), _| n != node);
    }

    /// Replace every value (a full view of the stored levels).
    pub fn set_values(&mut self, values: BTreeMap<Level, Value>) {
        self.values = values;
    }

    pub fn value(&self, level: &Level) -> Option<&Value> {
        self.values.get(level)
    }

    pub fn resolved(&self) -> &BTreeMap<Slot, Resolved> {
        &self.resolved
    }

    pub fn unresolved(&self) -> &BTreeMap<(NodeId, String), String> {
        &self.unresolved
    }

    /// The declaration of `module`'s `key` in the build `node` runs.
    pub fn declaration(&self, node: &NodeId, module: &str, key: &str) -> Option<&Declaration> {
        let build = self.builds.get(node)?;
        self.catalogs.get(build)?.manifests.get(module)?.keys.iter().find(|d| d.name == key)
    }

    /// The modules `node`'s build declares (whether placed or not).
    pub fn modules_of(&self, node: &NodeId) -> Vec<&Manifest> {
        let Some(c) = self.builds.get(node).and_then(|b| self.catalogs.get(b)) else { return vec![] };
        c.manifests.values().collect()
    }

    fn resolve_one(&self, node: &NodeId, module: &str, d: &Declaration) -> Resolved {
        let mut out = match &d.default {
            Some(v) => Resolved { value: Some(v.clone()), source: Source::Default },
            None => Resolved { value: None, source: Source::Unset },
        };
        if let Some(p) = &d.fallback {
            if let Some(v) = self.values.get(&Level::Mesh { key: p.clone() }) {
                out = Resolved { value: Some(v.clone()), source: Source::Mesh };
            }
            if let Some(v) = self.values.get(&Level::Node { node: node.clone(), key: p.clone() }) {
                out = Resolved { value: Some(v.clone()), source: Source::Node };
            }
        }
        let own = Level::Module { node: node.clone(), module: module.to_string(), key: d.name.clone() };
        if let Some(v) = self.values.get(&own) {
            out = Resolved { value: Some(v.clone()), source: Source::Module };
        }
        if out.value.is_none() && !d.required {
            // Optional, no default, nothing set: it is simply absent.
            out.source = Source::Default;
        }
        out
    }

    fn put(&mut self, slot: Slot, r: Resolved, changes: &mut Vec<Change>) {
        if self.resolved.get(&slot) == Some(&r) {
            return;
        }
        let from = self.resolved.insert(slot.clone(), r.clone());
        changes.push(Change { node: slot.0, module: slot.1, key: slot.2, from, to: r });
    }

    /// Resolve everything; returns the values that moved.
    pub fn resolve_all(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut seen: BTreeSet<Slot> = BTreeSet::new();
        let mut unresolved = BTreeMap::new();
        let mut fresh: Vec<(Slot, Resolved)> = Vec::new();
        for (node, modules) in &self.placement {
            let catalog = self.builds.get(node).and_then(|b| self.catalogs.get(b));
            for module in modules {
                let Some(m) = catalog.and_then(|c| c.manifests.get(module)) else {
                    let why = match self.builds.get(node) {
                        Some(b) if self.catalogs.contains_key(b) => format!("build {b} has no manifest for {module}"),
                        Some(b) => format!("the manifests of build {b} cannot be read here"),
                        None => "the node's build is not known".to_string(),
                    };
                    unresolved.insert((node.clone(), module.clone()), why);
                    // Its last resolved values stay.
                    for slot in self.resolved.keys().filter(|(n, m, _)| n == node && m == module) {
                        seen.insert(slot.clone());
                    }
                    continue;
                };
                for d in &m.keys {
                    let slot = (node.clone(), module.clone(), d.name.clone());
                    fresh.push((slot.clone(), self.resolve_one(node, module, d)));
                    seen.insert(slot);
                }
            }
        }
        self.unresolved = unresolved;
        for (slot, r) in fresh {
            self.put(slot, r, &mut changes);
        }
        self.resolved.retain(|slot, _| seen.contains(slot));
        changes
    }

    /// Set (or clear, with `None`) the value at `level` and resolve what it can move.
    pub fn set(&mut self, level: Level, value: Option<Value>) -> Vec<Change> {
        match value {
            Some(v) => self.values.insert(level.clone(), v),
            None => self.values.remove(&level),
        };
        let mut slots: Vec<(NodeId, String, usize)> = Vec::new();
        let nodes: Vec<NodeId> = match &level {
            Level::Mesh { .. } => self.placement.keys().cloned().collect(),
            Level::Node { node, .. } | Level::Module { node, .. } => vec![node.clone()],
        };
        for node in nodes {
            let Some(catalog) = self.builds.get(&node).and_then(|b| self.catalogs.get(b)) else { continue };
            let placed = match self.placement.get(&node) {
                Some(p) => p,
                None => continue,
            };
            match &level {
                Level::Mesh { key } | Level::Node { key, .. } => {
                    for (module, i) in catalog.by_fallback.get(key).into_iter().flatten() {
                        if placed.contains(module) {
                            slots.push((node.clone(), module.clone(), *i));
                        }
                    }
                }
                Level::Module { module, key, .. } => {
                    if let Some(m) = catalog.manifests.get(module).filter(|_| placed.contains(module)) {
                        if let Some(i) = m.keys.iter().position(|d| &d.name == key) {
                            slots.push((node.clone(), module.clone(), i));
                        }
                    }
                }
            }
        }
        let mut changes = Vec::new();
        for (node, module, i) in slots {
            let (r, name) = {
                let catalog = &self.catalogs[&self.builds[&node]];
                let d = &catalog.manifests[&module].keys[i];
                (self.resolve_one(&node, &module, d), d.name.clone())
            };
            self.put((node, module, name), r, &mut changes);
        }
        changes
    }
}
