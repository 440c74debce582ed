//! The configuration control plane (spec mesh-config.md; DESIGN.md "Configuration"): declared
//! keys, values at three levels with who set them and why, resolution per node and module,
//! history, and proposals an admin approves. Pure: the node feeds it records and the time.
//!
//! - [`types`]: the eight value types, parsing and validation;
//! - [`builtin`]: the manifests compiled into this build (every built-in subsystem's tunables);
//! - [`resolve`]: resolution with its sources, full and incremental;
//! - this module: what a set, a clear, a proposal and its answer may do.
//!
//! Stored values, history and proposals are replicated metadata: settings records under the
//! reserved prefix `config/` (`config/value/<level>`, `config/history/<stamp>`,
//! `config/proposal/<id>`), which the `settings` verb neither lists nor writes.

pub mod builtin;
pub mod resolve;
pub mod types;

use resolve::{Level, Resolver};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use types::Declaration;

/// Settings keys under this prefix belong to the config plane.
pub const RESERVED_PREFIX: &str = "config/";
pub const VALUE_PREFIX: &str = "config/value/";
pub const HISTORY_PREFIX: &str = "config/history/";
pub const PROPOSAL_PREFIX: &str = "config/proposal/";
/// Open proposals at most.
pub const OPEN_PROPOSALS_MAX: usize = 3;
/// A proposal not answered within this long expires.
pub const PROPOSAL_TTL_MS: u64 = 7 * 24 * 3_600_000;

/// One stored value with its provenance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub level: String,
    pub value: Value,
    /// Who set it (the node that took the request) and through which account.
    pub by: String,
    pub account: String,
    pub why: String,
    /// Unix ms.
    pub at: u64,
    /// Set through an approved proposal: who approved it, and which proposal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<Approval>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    pub by: String,
    pub proposal: String,
    pub at: u64,
}

/// One line of the history: every set, clear and approved change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    pub at: u64,
    /// `set`, `clear`, `approve`, `decline`, `propose`.
    pub action: String,
    pub level: String,
    #[serde(default)]
    pub value: Option<Value>,
    #[serde(default)]
    pub previous: Option<Value>,
    pub by: String,
    pub account: String,
    pub why: String,
    /// Resolved values it moved (module on node).
    #[serde(default)]
    pub moved: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProposalStatus {
    Open,
    Approved,
    Declined,
    Expired,
    /// A newer proposal for the same level and key took its place.
    Replaced,
}

/// A value (or a clear) proposed for an admin's approval, whole, with the value stored at its
/// level when it was proposed (what the approver is shown the change against).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proposal {
    pub id: String,
    pub level: String,
    /// The proposed value; `None` proposes a clear.
    pub value: Option<Value>,
    /// The value stored at the level when proposed.
    pub shown_against: Option<Value>,
    pub by: String,
    pub why: String,
    pub at: u64,
    pub status: ProposalStatus,
    #[serde(default)]
    pub answered_by: Option<String>,
    #[serde(default)]
    pub answered_at: Option<u64>,
}

impl Proposal {
    pub fn is_open(&self, now_ms: u64) -> bool {
        self.status == ProposalStatus::Open && now_ms < self.at.saturating_add(PROPOSAL_TTL_MS)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Level(String),
    #[error("no module declares {key}{where_}; declared: {declared}")]
    Undeclared { key: String, where_: String, declared: String },
    #[error(transparent)]
    Value(#[from] types::ValueError),
    #[error("{0} is a trusted key: it is set only through `config propose` and an admin's approve")]
    Trusted(String),
    #[error("a set or clear needs a reason (--why)")]
    NoWhy,
    #[error("{0}")]
    Proposal(String),
}

impl ConfigError {
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Level(_) => "bad_level",
            ConfigError::Undeclared { .. } => "undeclared_key",
            ConfigError::Value(_) => "bad_value",
            ConfigError::Trusted(_) => "trusted_key",
            ConfigError::NoWhy => "no_why",
            ConfigError::Proposal(_) => "proposal_refused",
        }
    }

    pub fn kind(&self) -> crate::node::ErrorKind {
        use crate::node::ErrorKind;
        match self {
            ConfigError::Trusted(_) => ErrorKind::Forbidden,
            ConfigError::Proposal(_) => ErrorKind::Conflict,
            _ => ErrorKind::Invalid,
        }
    }
}

/// The level a request names: no node and no module for mesh, a node for node config, both for
/// a module's own value.
pub fn level_of(key: &str, node: Option<&str>, module: Option<&str>) -> Result<Level, ConfigError> {
    let key = key.trim();
    if key.is_empty() || key.len() > 128 || key.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return Err(ConfigError::Level(format!("{key:?} is not a key name")));
    }
    let ok_part =
        |s: &str| !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
    match (node, module) {
        (None, None) => Ok(Level::Mesh { key: key.to_string() }),
        (Some(n), None) if ok_part(n) => Ok(Level::Node { node: crate::NodeId::new(n), key: key.to_string() }),
        (Some(n), Some(m)) if ok_part(n) && ok_part(m) => {
            Ok(Level::Module { node: crate::NodeId::new(n), module: m.to_string(), key: key.to_string() })
        }
        (None, Some(_)) => Err(ConfigError::Level("a module's own value names its node too (--node)".into())),
        _ => Err(ConfigError::Level("node ids and module names are letters, digits, '-' and '_'".into())),
    }
}

/// The declaration a value at `level` is judged by: a predefined key of the newest build for
/// mesh and node values, the module's own declaration (in the build its node runs) for a
/// module value. Refuses a key nobody declares, naming the keys that are declared.
pub fn declaration_for<'a>(
    predefined: &'a [Declaration],
    resolver: &'a Resolver,
    level: &Level,
) -> Result<&'a Declaration, ConfigError> {
    match level {
        Level::Mesh { key } | Level::Node { key, .. } => {
            predefined.iter().find(|d| &d.name == key).ok_or_else(|| ConfigError::Undeclared {
                key: key.clone(),
                where_: String::new(),
                declared: predefined.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
            })
        }
        Level::Module { node, module, key } => resolver.declaration(node, module, key).ok_or_else(|| {
            let declared: Vec<String> = resolver
                .modules_of(node)
                .into_iter()
                .filter(|m| &m.module == module)
                .flat_map(|m| m.keys.iter().map(|d| d.name.clone()))
                .collect();
            ConfigError::Undeclared {
                key: key.clone(),
                where_: format!(" in module {module} on node {node}"),
                declared: if declared.is_empty() {
                    format!("(module {module} is not known there)")
                } else {
                    declared.join(", ")
                },
            }
        }),
    }
}

/// Judge a set (`Some(value)`) or clear (`None`) as an admin's direct act: the key must be
/// declared, the value valid, a reason given, and the key not trusted. Returns the typed value.
pub fn judge(
    predefined: &[Declaration],
    resolver: &Resolver,
    level: &Level,
    input: Option<&Value>,
    why: &str,
    direct: bool,
) -> Result<Option<Value>, ConfigError> {
    if why.trim().is_empty() {
        return Err(ConfigError::NoWhy);
    }
    let d = declaration_for(predefined, resolver, level)?;
    if direct && d.trusted {
        return Err(ConfigError::Trusted(level.name()));
    }
    match input {
        Some(v) => Ok(Some(types::parse_value(d, v)?)),
        None => Ok(None),
    }
}

/// Whether a new proposal may be opened: at most [`OPEN_PROPOSALS_MAX`] open (not counting
/// the one it replaces), and not the same change as an open one. Returns the id of the open
/// proposal for the same level it replaces, if any.
pub fn admit_proposal(open: &[Proposal], level: &str, value: &Option<Value>) -> Result<Option<String>, ConfigError> {
    if open.iter().any(|p| p.level == level && &p.value == value) {
        return Err(ConfigError::Proposal("the same change is already proposed".into()));
    }
    let replaces = open.iter().find(|p| p.level == level).map(|p| p.id.clone());
    let counted = open.len() - usize::from(replaces.is_some());
    if counted >= OPEN_PROPOSALS_MAX {
        return Err(ConfigError::Proposal(format!(
            "{OPEN_PROPOSALS_MAX} proposals are open already; approve or decline one first"
        )));
    }
    Ok(replaces)
}

/// Whether an approve of `p` holds: it is open and the value stored at its level is still the
/// one it was shown against (`proposal_now` is the proposal as stored now, to catch a change of
/// the proposal itself).
pub fn check_approve(
    p: &Proposal,
    proposal_now: &Proposal,
    stored_now: Option<&Value>,
    now_ms: u64,
) -> Result<(), ConfigError> {
    if proposal_now != p {
        return Err(ConfigError::Proposal("the proposal changed since it was shown; nothing was set".into()));
    }
    if !p.is_open(now_ms) {
        return Err(ConfigError::Proposal(format!("the proposal is {:?}, not open; nothing was set", p.status)));
    }
    if stored_now != p.shown_against.as_ref() {
        return Err(ConfigError::Proposal(
            "the value stored at that level changed since the proposal was made; nothing was set".into(),
        ));
    }
    Ok(())
}

/// Settings keys of installed user modules' manifests and of their placements.
pub const MODULE_PREFIX: &str = "config/module/";
pub const PLACEMENT_PREFIX: &str = "config/placement/";

/// Check a user module's manifest and type its defaults: a module name of letters, digits,
/// `-` and `_` that no built-in module has; unique key names; each default valid for its
/// declaration; a fallback that names a predefined key.
pub fn check_manifest(m: &resolve::Manifest, predefined: &[Declaration]) -> Result<resolve::Manifest, ConfigError> {
    let bad = |why: String| ConfigError::Level(format!("manifest of {}: {why}", m.module));
    let ok_name =
        |s: &str| !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
    if !ok_name(&m.module) {
        return Err(bad("a module name is letters, digits, '-' and '_'".into()));
    }
    if builtin::manifests().iter().any(|b| b.module == m.module) {
        return Err(bad("that is the name of a built-in module".into()));
    }
    if m.keys.is_empty() || m.keys.len() > 1000 {
        return Err(bad("a manifest declares 1 to 1000 keys".into()));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = m.clone();
    for d in &mut out.keys {
        if !ok_name(&d.name) || !seen.insert(d.name.clone()) {
            return Err(bad(format!("key {:?} is not a valid, unique key name", d.name)));
        }
        if let Some(f) = &d.fallback {
            if !predefined.iter().any(|p| &p.name == f) {
                return Err(bad(format!("key {} falls back to {f}, which is not a predefined key", d.name)));
            }
        }
        if d.ty == types::KeyType::Enum && d.choices.is_empty() {
            return Err(bad(format!("enum key {} lists no choices", d.name)));
        }
        if let Some(p) = &d.pattern {
            if regex_lite::Regex::new(p).is_err() {
                return Err(bad(format!("key {}: {p:?} is not a valid pattern", d.name)));
            }
        }
        if let Some(v) = d.default.clone() {
            d.default = Some(types::parse_value(d, &v)?);
        } else if !d.required {
            // Optional without a default is fine: it is absent until set.
        }
    }
    Ok(out)
}

/// Settings keys of the builds members run: their built-in manifests, published by a node
/// running that build so every node can resolve every node.
pub const BUILD_PREFIX: &str = "config/build/";

/// A build as published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildManifests {
    pub build: String,
    pub manifests: Vec<resolve::Manifest>,
}

impl BuildManifests {
    /// The predefined keys of this build: every built-in key under its module's name.
    pub fn predefined(&self) -> Vec<Declaration> {
        self.manifests
            .iter()
            .flat_map(|m| {
                m.keys.iter().map(move |d| Declaration {
                    name: format!("{}.{}", m.module, d.name),
                    fallback: None,
                    ..d.clone()
                })
            })
            .collect()
    }
}

/// Order builds by version: numeric parts compared as numbers (`0.10.0` after `0.9.3`).
pub fn build_order(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |s: &str| -> Vec<(u64, String)> {
        s.split(['.', '-', '+']).map(|p| (p.parse::<u64>().unwrap_or(0), p.to_string())).collect()
    };
    parts(a).cmp(&parts(b))
}

/// The predefined list in force: the newest build's, unless it drops a key that still holds a
/// mesh or node value — then that build is withheld (with why) and the next newest considered.
/// Returns the build chosen and the withheld ones with their reasons.
pub fn choose_predefined<'a>(
    builds: &'a [BuildManifests],
    held_keys: &std::collections::BTreeSet<String>,
) -> (Option<&'a BuildManifests>, Vec<(String, String)>) {
    let mut sorted: Vec<&BuildManifests> = builds.iter().collect();
    sorted.sort_by(|a, b| build_order(&b.build, &a.build));
    let mut withheld = Vec::new();
    for b in sorted {
        let names: std::collections::BTreeSet<String> = b.predefined().into_iter().map(|d| d.name).collect();
        let dropped: Vec<&String> = held_keys.iter().filter(|k| !names.contains(*k)).collect();
        if dropped.is_empty() {
            return (Some(b), withheld);
        }
        let list: Vec<&str> = dropped.iter().map(|s| s.as_str()).collect();
        withheld.push((
            b.build.clone(),
            format!(
                "build {} drops {} which still hold a mesh or node value; clear them first",
                b.build,
                list.join(", ")
            ),
        ));
    }
    (None, withheld)
}

/// A key renamed by some build's declaration (`renamedFrom`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rename {
    pub module: String,
    pub from: String,
    pub to: String,
    /// The new name is trusted: an unapproved value does not move onto it.
    pub trusted: bool,
    /// A built-in module's key: its predefined key renames too (`module.from` -> `module.to`).
    pub predefined: bool,
}

/// Every rename the builds in the cluster declare.
pub fn renames(builds: &[BuildManifests], user: &[resolve::Manifest]) -> Vec<Rename> {
    let mut out = std::collections::BTreeSet::new();
    let mut scan = |m: &resolve::Manifest, predefined: bool| {
        for d in &m.keys {
            if let Some(from) = d.renamed_from.as_ref().filter(|f| **f != d.name) {
                out.insert(Rename {
                    module: m.module.clone(),
                    from: from.clone(),
                    to: d.name.clone(),
                    trusted: d.trusted,
                    predefined,
                });
            }
        }
    };
    for b in builds {
        for m in &b.manifests {
            scan(m, true);
        }
    }
    for m in user {
        scan(m, false);
    }
    out.into_iter().collect()
}

/// The aliases renames give resolution.
pub fn aliases(renames: &[Rename]) -> resolve::Aliases {
    let mut a = resolve::Aliases::default();
    for r in renames {
        a.keys.insert((r.module.clone(), r.from.clone()), r.to.clone());
        if r.predefined {
            a.predefined.insert(format!("{}.{}", r.module, r.from), format!("{}.{}", r.module, r.to));
        }
    }
    a
}

/// Where a stored value under an old name goes under its new one, if a rename covers it.
pub fn renamed_level(level: &Level, renames: &[Rename]) -> Option<(Level, Rename)> {
    for r in renames {
        let moved = match level {
            Level::Module { node, module, key } if *module == r.module && *key == r.from => {
                Some(Level::Module { node: node.clone(), module: module.clone(), key: r.to.clone() })
            }
            Level::Mesh { key } if r.predefined && *key == format!("{}.{}", r.module, r.from) => {
                Some(Level::Mesh { key: format!("{}.{}", r.module, r.to) })
            }
            Level::Node { node, key } if r.predefined && *key == format!("{}.{}", r.module, r.from) => {
                Some(Level::Node { node: node.clone(), key: format!("{}.{}", r.module, r.to) })
            }
            _ => None,
        };
        if let Some(l) = moved {
            return Some((l, r.clone()));
        }
    }
    None
}

/// Whether `level` is where a declared rename moves a value to (its new name). Such a value is
/// read by the build that declared the rename even while members' records still show the
/// older build, so it is never taken for unread.
pub fn rename_target(level: &Level, renames: &[Rename]) -> bool {
    renames.iter().any(|r| match level {
        Level::Module { module, key, .. } => *module == r.module && *key == r.to,
        Level::Mesh { key } | Level::Node { key, .. } => r.predefined && *key == format!("{}.{}", r.module, r.to),
    })
}

/// Settings keys of config events (`renamed`, kept seven days), findings and rename windows.
pub const EVENT_PREFIX: &str = "config/event/";
pub const FINDING_PREFIX: &str = "config/finding/";
pub const WINDOW_PREFIX: &str = "config/window/";
/// Events are kept, and findings raised, after this long.
pub const SEVEN_DAYS_MS: u64 = 7 * 24 * 3_600_000;
pub const RETIRE_PREFIX: &str = "config/retire/";
