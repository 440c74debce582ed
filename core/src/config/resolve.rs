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
    /// Each module's key names in manifest order, shared with the resolved values.
    names: BTreeMap<String, std::sync::Arc<Vec<String>>>,
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
            c.names.insert(m.module.clone(), std::sync::Arc::new(m.keys.iter().map(|d| d.name.clone()).collect()));
            c.manifests.insert(m.module.clone(), m);
        }
        c
    }
}

type Slot = (NodeId, String, String);

/// Values by level, split so a lookup never allocates.
#[derive(Clone, Debug, Default)]
struct Values {
    mesh: BTreeMap<String, Value>,
    node: BTreeMap<NodeId, BTreeMap<String, Value>>,
    /// node -> module -> key -> value.
    module: BTreeMap<NodeId, BTreeMap<String, BTreeMap<String, Value>>>,
}

impl Values {
    fn get(&self, l: &Level) -> Option<&Value> {
        match l {
            Level::Mesh { key } => self.mesh.get(key),
            Level::Node { node, key } => self.node.get(node)?.get(key),
            Level::Module { node, module, key } => self.module.get(node)?.get(module)?.get(key),
        }
    }

    fn set(&mut self, l: Level, v: Option<Value>) {
        match (l, v) {
            (Level::Mesh { key }, Some(v)) => {
                self.mesh.insert(key, v);
            }
            (Level::Mesh { key }, None) => {
                self.mesh.remove(&key);
            }
            (Level::Node { node, key }, Some(v)) => {
                self.node.entry(node).or_default().insert(key, v);
            }
            (Level::Node { node, key }, None) => {
                if let Some(m) = self.node.get_mut(&node) {
                    m.remove(&key);
                }
            }
            (Level::Module { node, module, key }, Some(v)) => {
                self.module.entry(node).or_default().entry(module).or_default().insert(key, v);
            }
            (Level::Module { node, module, key }, None) => {
                if let Some(m) = self.module.get_mut(&node).and_then(|m| m.get_mut(&module)) {
                    m.remove(&key);
                }
            }
        }
    }
}

static NO_VALUES: BTreeMap<String, Value> = BTreeMap::new();

/// The resolution of one declaration from the values that can reach it.
fn resolve_decl(
    d: &Declaration,
    mesh: &BTreeMap<String, Value>,
    node: &BTreeMap<String, Value>,
    own: &BTreeMap<String, Value>,
    renamed: Option<&Aliases>,
    module: &str,
) -> Resolved {
    // A name renamed since this build keeps answering the value under its new name (the
    // rename window).
    let own_new = renamed.and_then(|a| a.keys.get(&(module.to_string(), d.name.clone())));
    if let Some(v) = own.get(&d.name).or_else(|| own_new.and_then(|n| own.get(n))) {
        return Resolved { value: Some(v.clone()), source: Source::Module };
    }
    if let Some(p) = &d.fallback {
        let p_new = renamed.and_then(|a| a.predefined.get(p));
        if let Some(v) = node.get(p).or_else(|| p_new.and_then(|n| node.get(n))) {
            return Resolved { value: Some(v.clone()), source: Source::Node };
        }
        if let Some(v) = mesh.get(p).or_else(|| p_new.and_then(|n| mesh.get(n))) {
            return Resolved { value: Some(v.clone()), source: Source::Mesh };
        }
    }
    match &d.default {
        Some(v) => Resolved { value: Some(v.clone()), source: Source::Default },
        // Optional, no default, nothing set: simply absent; required: unset.
        None => Resolved { value: None, source: if d.required { Source::Unset } else { Source::Default } },
    }
}

/// Renamed keys: the old name answers the value stored under the new one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aliases {
    /// (module, old key) -> new key.
    pub keys: BTreeMap<(String, String), String>,
    /// old predefined key -> new predefined key.
    pub predefined: BTreeMap<String, String>,
}

/// One node's resolved values: module -> (key names, one resolved value per key, same order).
type NodeResolved = BTreeMap<String, (std::sync::Arc<Vec<String>>, Vec<Resolved>)>;

/// Resolved values of every placed module on every node, kept up to date.
#[derive(Debug, Default)]
pub struct Resolver {
    catalogs: BTreeMap<String, Catalog>,
    /// The build each node runs.
    builds: BTreeMap<NodeId, String>,
    /// Modules placed on each node.
    placement: BTreeMap<NodeId, BTreeSet<String>>,
    values: Values,
    /// node -> module -> (the key names, resolved value per key in the same order).
    resolved: BTreeMap<NodeId, NodeResolved>,
    /// The same as one flat map, built when asked for.
    flat: std::sync::OnceLock<BTreeMap<Slot, Resolved>>,
    /// Placed modules the node's build has no manifest for, with why.
    unresolved: BTreeMap<(NodeId, String), String>,
    /// Manifests or placements changed since the last full resolution.
    dirty: bool,
    /// Renamed keys, for nodes still on a build that reads the old name.
    aliases: Aliases,
}

impl Clone for Resolver {
    fn clone(&self) -> Resolver {
        Resolver {
            catalogs: self.catalogs.clone(),
            builds: self.builds.clone(),
            placement: self.placement.clone(),
            values: self.values.clone(),
            resolved: self.resolved.clone(),
            flat: std::sync::OnceLock::new(),
            unresolved: self.unresolved.clone(),
            dirty: self.dirty,
            aliases: self.aliases.clone(),
        }
    }
}

impl Resolver {
    pub fn new() -> Resolver {
        Resolver::default()
    }

    /// The manifests of `build` (replacing what was known of it).
    pub fn set_build_manifests(&mut self, build: &str, manifests: Vec<Manifest>) {
        self.catalogs.insert(build.to_string(), Catalog::new(manifests));
        self.dirty = true;
    }

    /// Node `node` runs `build` with `modules` placed on it.
    pub fn set_node(&mut self, node: NodeId, build: &str, modules: BTreeSet<String>) {
        self.builds.insert(node.clone(), build.to_string());
        self.placement.insert(node, modules);
        self.dirty = true;
    }

    pub fn remove_node(&mut self, node: &NodeId) {
        self.builds.remove(node);
        self.placement.remove(node);
        self.resolved.remove(node);
        self.unresolved.retain(|(n, _), _| n != node);
        self.flat = std::sync::OnceLock::new();
    }

    /// The renames in force (a change makes the next `set` resolve everything).
    pub fn set_aliases(&mut self, aliases: Aliases) {
        self.aliases = aliases;
        self.dirty = true;
    }

    /// Replace every value (a full view of the stored levels).
    pub fn set_values(&mut self, values: BTreeMap<Level, Value>) {
        self.values = Values::default();
        for (l, v) in values {
            self.values.set(l, Some(v));
        }
    }

    pub fn value(&self, level: &Level) -> Option<&Value> {
        self.values.get(level)
    }

    /// Every resolved value, keyed (node, module, key).
    pub fn resolved(&self) -> &BTreeMap<Slot, Resolved> {
        self.flat.get_or_init(|| {
            let mut out = BTreeMap::new();
            for (node, modules) in &self.resolved {
                for (module, (names, values)) in modules {
                    for (key, r) in names.iter().zip(values) {
                        out.insert((node.clone(), module.clone(), key.clone()), r.clone());
                    }
                }
            }
            out
        })
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

    /// Resolve everything; returns the values that moved.
    pub fn resolve_all(&mut self) -> Vec<Change> {
        self.flat = std::sync::OnceLock::new();
        self.dirty = false;
        let mut changes = Vec::new();
        let mut unresolved = BTreeMap::new();
        let mut next: BTreeMap<NodeId, NodeResolved> = BTreeMap::new();
        for (node, modules) in &self.placement {
            let catalog = self.builds.get(node).and_then(|b| self.catalogs.get(b));
            let node_vals = self.values.node.get(node).unwrap_or(&NO_VALUES);
            let own_vals = self.values.module.get(node);
            let mut old_node = self.resolved.remove(node).unwrap_or_default();
            let mut new_node = BTreeMap::new();
            for module in modules {
                let Some(m) = catalog.and_then(|c| c.manifests.get(module)) else {
                    let why = match self.builds.get(node) {
                        Some(b) if self.catalogs.contains_key(b) => format!("build {b} has no manifest for {module}"),
                        Some(b) => format!("the manifests of build {b} cannot be read here"),
                        None => "the node's build is not known".to_string(),
                    };
                    unresolved.insert((node.clone(), module.clone()), why);
                    // Its last resolved values stay.
                    if let Some(kept) = old_node.remove(module) {
                        new_node.insert(module.clone(), kept);
                    }
                    continue;
                };
                let own = own_vals.and_then(|o| o.get(module)).unwrap_or(&NO_VALUES);
                let names = catalog.map(|c| c.names[module].clone()).unwrap_or_default();
                let old = old_node.remove(module);
                // The same manifest: compare by position; another: by name.
                let same = old.as_ref().is_some_and(|(n, _)| std::sync::Arc::ptr_eq(n, &names));
                let by_name: BTreeMap<&str, &Resolved> = match (&old, same) {
                    (Some((n, v)), false) => n.iter().map(String::as_str).zip(v.iter()).collect(),
                    _ => BTreeMap::new(),
                };
                let mut fresh = Vec::with_capacity(m.keys.len());
                for (i, d) in m.keys.iter().enumerate() {
                    let renamed =
                        (!self.aliases.keys.is_empty() || !self.aliases.predefined.is_empty()).then_some(&self.aliases);
                    let r = resolve_decl(d, &self.values.mesh, node_vals, own, renamed, module);
                    let before = if same {
                        old.as_ref().and_then(|(_, v)| v.get(i))
                    } else {
                        by_name.get(d.name.as_str()).copied()
                    };
                    if before != Some(&r) {
                        changes.push(Change {
                            node: node.clone(),
                            module: module.clone(),
                            key: d.name.clone(),
                            from: before.cloned(),
                            to: r.clone(),
                        });
                    }
                    fresh.push(r);
                }
                drop(by_name);
                new_node.insert(module.clone(), (names, fresh));
            }
            next.insert(node.clone(), new_node);
        }
        self.unresolved = unresolved;
        self.resolved = next;
        changes
    }

    /// Set (or clear, with `None`) the value at `level` and resolve what it can move.
    pub fn set(&mut self, level: Level, value: Option<Value>) -> Vec<Change> {
        self.flat = std::sync::OnceLock::new();
        let aliased = self.aliases.keys.values().any(|k| k == level.key())
            || self.aliases.predefined.values().any(|k| k == level.key());
        if aliased || self.dirty || self.placement.keys().any(|n| !self.resolved.contains_key(n)) {
            // Never resolved as a whole yet: do that first, then the change.
            self.values.set(level.clone(), value.clone());
            return self.resolve_all();
        }
        let nodes: Vec<NodeId> = match &level {
            Level::Mesh { .. } => self.placement.keys().cloned().collect(),
            Level::Node { node, .. } | Level::Module { node, .. } => vec![node.clone()],
        };
        self.values.set(level.clone(), value);
        let mut changes = Vec::new();
        for node in nodes {
            let Some(catalog) = self.builds.get(&node).and_then(|b| self.catalogs.get(b)) else { continue };
            let Some(placed) = self.placement.get(&node) else { continue };
            let mut slots: Vec<(&String, usize)> = Vec::new();
            match &level {
                Level::Mesh { key } | Level::Node { key, .. } => {
                    for (module, i) in catalog.by_fallback.get(key).into_iter().flatten() {
                        if placed.contains(module) {
                            slots.push((module, *i));
                        }
                    }
                }
                Level::Module { module, key, .. } => {
                    if let Some((name, m)) = catalog.manifests.get_key_value(module).filter(|_| placed.contains(module))
                    {
                        if let Some(i) = m.keys.iter().position(|d| &d.name == key) {
                            slots.push((name, i));
                        }
                    }
                }
            }
            let node_vals = self.values.node.get(&node).unwrap_or(&NO_VALUES);
            let own_vals = self.values.module.get(&node);
            let Some(resolved_node) = self.resolved.get_mut(&node) else { continue };
            for (module, i) in slots {
                let d = &catalog.manifests[module].keys[i];
                let own = own_vals.and_then(|o| o.get(module)).unwrap_or(&NO_VALUES);
                let renamed =
                    (!self.aliases.keys.is_empty() || !self.aliases.predefined.is_empty()).then_some(&self.aliases);
                let r = resolve_decl(d, &self.values.mesh, node_vals, own, renamed, module);
                let Some(entry) = resolved_node.get_mut(module).and_then(|(_, v)| v.get_mut(i)) else { continue };
                if *entry != r {
                    let from = std::mem::replace(entry, r.clone());
                    changes.push(Change {
                        node: node.clone(),
                        module: module.clone(),
                        key: d.name.clone(),
                        from: Some(from),
                        to: r,
                    });
                }
            }
        }
        changes
    }
}
