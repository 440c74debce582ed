//! Renamed and retired keys across builds (mesh-config.md "Renames", "Retiring"): rename
//! windows held open by nodes on older builds, the leader's passes that move a value once,
//! and values no build reads any more, asked about for removal.

use super::{ApiError, Node};
use crate::config::resolve::Level;
use crate::config::{self, Entry, HistoryEntry, VALUE_PREFIX};
use crate::meta::records::{Record, Setting};
use crate::time::Millis;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A rename window: a node still runs a build that reads the old name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Window {
    module: String,
    from: String,
    to: String,
    node: String,
    since: u64,
}

/// Something an operator should look at.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// `rename-refused`, `rename-window-held`, `retirement-held`, `retiring-unanswered`.
    pub kind: String,
    pub level: String,
    pub to: String,
    pub node: String,
    pub since: u64,
    pub why: String,
}

/// `config findings`: conditions held seven days, and those still younger under `pending`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Findings {
    pub findings: Vec<Finding>,
    pub pending: Vec<Finding>,
}

/// A node holding a rename window open, since when.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WindowHolder {
    pub node: String,
    pub since: u64,
}

/// One rename a build declares.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenameView {
    pub module: String,
    pub from: String,
    pub to: String,
    pub trusted: bool,
    pub open: bool,
    pub nodes_holding: Vec<WindowHolder>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RenameList {
    pub renames: Vec<RenameView>,
}

/// Config events (`renamed`, `retired`) of the last seven days, newest first, as recorded.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ConfigEvents {
    pub events: Vec<Value>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RetiringList {
    pub retiring: Vec<Retiring>,
}

/// `config retiring approve|ask|cancel`: the value retired (on which nodes, what the write
/// moved), or the retiring record as it now stands.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum RetireAnswered {
    Retired { retired: String, nodes: Vec<String>, result: super::config::ConfigWritten },
    Retiring(Retiring),
}

impl Node {
    /// Write (or with `None`, remove) one of the config plane's records.
    pub(super) fn put_setting(&mut self, wall: Millis, key: String, value: Option<Value>) {
        let version = self.hlc.next(wall);
        let removed = value.is_none();
        self.submit_record(
            wall,
            Record::Setting(Setting { key, value: value.unwrap_or(Value::Null), removed, version }),
        );
    }

    pub(super) fn config_records<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<(String, T)> {
        self.config_settings(prefix)
            .filter_map(|s| Some((s.key.clone(), serde_json::from_value(s.value.clone()).ok()?)))
            .collect()
    }

    /// The renames pass (the leader runs it at each config refresh): values stored under an
    /// old name move to the new one, with their provenance, unless the new name is trusted and
    /// the value was never approved (`rename-refused`); `renamed` is said once per move; rename
    /// windows open for nodes whose build still reads the old name and close when they no
    /// longer do; events older than seven days go. Returns what it did.
    pub fn config_rename_pass(&mut self, wall: Millis) -> Vec<String> {
        let mut did = Vec::new();
        if self.cluster.is_none() {
            return did;
        }
        let user = self.user_manifests();
        let builds = self.published_builds();
        let renames = config::renames(&builds, &user);
        let entries = self.config_entries();
        let refused: BTreeMap<String, Finding> = self
            .config_records::<Finding>(config::FINDING_PREFIX)
            .into_iter()
            .map(|(_, f)| (f.level.clone(), f))
            .collect();
        for (level, entry) in &entries {
            let Some((to, r)) = config::renamed_level(level, &renames) else { continue };
            let refused_key = format!("{}rename-refused/{}", config::FINDING_PREFIX, level.name());
            if r.trusted && entry.approved.is_none() {
                if !refused.contains_key(&level.name()) {
                    let node = match level {
                        Level::Node { node, .. } | Level::Module { node, .. } => node.to_string(),
                        Level::Mesh { .. } => String::new(),
                    };
                    let f = Finding {
                        kind: "rename-refused".into(),
                        level: level.name(),
                        to: to.name(),
                        node,
                        since: wall.0,
                        why: format!(
                            "{} is trusted and the value under {} was never approved",
                            to.name(),
                            level.name()
                        ),
                    };
                    self.put_setting(wall, refused_key, Some(json!(f)));
                    did.push(format!("rename-refused {}", level.name()));
                }
                continue;
            }
            if !entries.contains_key(&to) {
                let moved = Entry {
                    level: to.name(),
                    why: format!("renamed from {}: {}", level.name(), entry.why),
                    ..entry.clone()
                };
                self.put_setting(wall, format!("{VALUE_PREFIX}{}", to.name()), Some(json!(moved)));
            }
            self.put_setting(wall, format!("{VALUE_PREFIX}{}", level.name()), None);
            if refused.contains_key(&level.name()) {
                self.put_setting(wall, refused_key, None);
            }
            self.write_history(
                wall,
                HistoryEntry {
                    at: wall.0,
                    action: "rename".into(),
                    level: to.name(),
                    value: Some(entry.value.clone()),
                    previous: None,
                    by: self.id.to_string(),
                    account: "rename".into(),
                    why: format!("renamed from {}", level.name()),
                    moved: vec![],
                },
            );
            let event = json!({"event": "renamed", "module": r.module, "from": r.from, "to": r.to, "level": to.name(), "at": wall.0});
            self.config_event(wall, event);
            self.event(super::Event::ConfigChanged { level: to.name(), moved: 0 });
            did.push(format!("renamed {} -> {}", level.name(), to.name()));
        }
        // Rename windows: a node whose build reads the old name and not the new one.
        let by_build: BTreeMap<String, &config::BuildManifests> = builds.iter().map(|b| (b.build.clone(), b)).collect();
        let mut open: BTreeMap<String, Window> = BTreeMap::new();
        for rec in self.members.records().filter(|r| !r.removed) {
            let build = if rec.id == self.id { self.me.software_version.clone() } else { rec.version.clone() };
            let Some(b) = by_build.get(&build) else { continue };
            for r in &renames {
                let reads = |name: &str| {
                    b.manifests
                        .iter()
                        .chain(user.iter())
                        .any(|m| m.module == r.module && m.keys.iter().any(|d| d.name == name))
                };
                if reads(&r.from) && !reads(&r.to) {
                    let key = format!("{}{}/{}/{}", config::WINDOW_PREFIX, r.module, r.from, rec.id);
                    open.insert(
                        key,
                        Window {
                            module: r.module.clone(),
                            from: r.from.clone(),
                            to: r.to.clone(),
                            node: rec.id.to_string(),
                            since: wall.0,
                        },
                    );
                }
            }
        }
        let known: BTreeMap<String, Window> =
            self.config_records::<Window>(config::WINDOW_PREFIX).into_iter().collect();
        for (key, w) in &open {
            if !known.contains_key(key) {
                self.put_setting(wall, key.clone(), Some(json!(w)));
                did.push(format!("window open {}.{} on {}", w.module, w.from, w.node));
            }
        }
        for key in known.keys() {
            if !open.contains_key(key) {
                self.put_setting(wall, key.clone(), None);
                did.push(format!("window closed {key}"));
            }
        }
        for (key, e) in self.config_records::<Value>(config::EVENT_PREFIX) {
            if e["at"].as_u64().is_some_and(|at| at + config::SEVEN_DAYS_MS < wall.0) {
                self.put_setting(wall, key, None);
            }
        }
        did
    }

    /// `config renames`: every rename the builds declare, with the nodes holding its window open.
    pub fn config_renames(&self) -> RenameList {
        let builds = self.published_builds();
        let user = self.user_manifests();
        let windows: Vec<Window> =
            self.config_records::<Window>(config::WINDOW_PREFIX).into_iter().map(|(_, w)| w).collect();
        let renames = config::renames(&builds, &user)
            .into_iter()
            .map(|r| {
                let holding: Vec<WindowHolder> = windows
                    .iter()
                    .filter(|w| w.module == r.module && w.from == r.from)
                    .map(|w| WindowHolder { node: w.node.clone(), since: w.since })
                    .collect();
                RenameView {
                    module: r.module,
                    from: r.from,
                    to: r.to,
                    trusted: r.trusted,
                    open: !holding.is_empty(),
                    nodes_holding: holding,
                }
            })
            .collect();
        RenameList { renames }
    }

    /// `config findings`: conditions held seven days (`rename-refused`, `rename-window-held`,
    /// naming the node), and the same conditions still younger than that under `pending`.
    pub fn config_findings(&self, wall: Millis) -> Findings {
        let mut all: Vec<Finding> =
            self.config_records::<Finding>(config::FINDING_PREFIX).into_iter().map(|(_, f)| f).collect();
        for (_, w) in self.config_records::<Window>(config::WINDOW_PREFIX) {
            all.push(Finding {
                kind: "rename-window-held".into(),
                level: format!("{}.{}", w.module, w.from),
                to: format!("{}.{}", w.module, w.to),
                node: w.node.clone(),
                since: w.since,
                why: format!("node {} still runs a build that reads {}.{}", w.node, w.module, w.from),
            });
        }
        for (_, r) in self.config_records::<Retiring>(config::RETIRE_PREFIX) {
            let node = Level::parse(&r.level)
                .and_then(|l| match l {
                    Level::Node { node, .. } | Level::Module { node, .. } => Some(node.to_string()),
                    Level::Mesh { .. } => None,
                })
                .unwrap_or_default();
            if r.status != "cancelled" {
                all.push(Finding {
                    kind: "retirement-held".into(),
                    level: r.level.clone(),
                    to: String::new(),
                    node: node.clone(),
                    since: r.since,
                    why: format!("{} is read by no build and still not removed", r.level),
                });
            }
            if r.asks >= 2 && r.status == "asked" {
                // Asked twice and unanswered: a finding at once.
                all.push(Finding {
                    kind: "retiring-unanswered".into(),
                    level: r.level.clone(),
                    to: String::new(),
                    node,
                    since: wall.0.saturating_sub(config::SEVEN_DAYS_MS),
                    why: format!("{} was asked about {} times without an answer", r.level, r.asks),
                });
            }
        }
        let (held, pending): (Vec<Finding>, Vec<Finding>) =
            all.into_iter().partition(|f| f.since + config::SEVEN_DAYS_MS <= wall.0);
        Findings { findings: held, pending }
    }

    /// Config events (`renamed`) of the last seven days, newest first.
    pub fn config_events(&self, wall: Millis) -> ConfigEvents {
        let mut events: Vec<Value> = self
            .config_records::<Value>(config::EVENT_PREFIX)
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| e["at"].as_u64().is_some_and(|at| at + config::SEVEN_DAYS_MS >= wall.0))
            .collect();
        events.sort_by(|a, b| b["at"].as_u64().cmp(&a["at"].as_u64()));
        ConfigEvents { events }
    }
}

/// A value no node's build reads any more, asked about for removal.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retiring {
    pub level: String,
    pub since: u64,
    /// How many times the operator was asked.
    pub asks: u32,
    /// `asked`, `cancelled`.
    pub status: String,
}

impl Node {
    /// Whether any member's build (with the user modules placed on it) reads the value at `level`.
    pub(super) fn level_is_read(
        &self,
        level: &Level,
        builds: &[config::BuildManifests],
        user: &[config::resolve::Manifest],
    ) -> bool {
        let by_build: BTreeMap<&str, &config::BuildManifests> = builds.iter().map(|b| (b.build.as_str(), b)).collect();
        let placements = self.user_placements();
        let members: Vec<(crate::NodeId, String)> = self
            .members
            .records()
            .filter(|r| !r.removed)
            .map(|r| {
                let b = if r.id == self.id { self.me.software_version.clone() } else { r.version.clone() };
                (r.id.clone(), b)
            })
            .collect();
        let manifests_of = |node: &crate::NodeId, build: &str| -> Vec<config::resolve::Manifest> {
            let mut out: Vec<config::resolve::Manifest> =
                by_build.get(build).map(|b| b.manifests.clone()).unwrap_or_default();
            out.extend(user.iter().filter(|m| placements.get(&m.module).is_some_and(|n| n.contains(node))).cloned());
            out
        };
        match level {
            Level::Mesh { key } | Level::Node { key, .. } => {
                members.iter().any(|(id, b)| {
                    let on_node = match level {
                        Level::Node { node, .. } => node == id,
                        _ => true,
                    };
                    on_node
                        && manifests_of(id, b).iter().any(|m| {
                            m.keys.iter().any(|d| {
                                d.fallback.as_deref() == Some(key.as_str())
                                    || format!("{}.{}", m.module, d.name) == *key
                            })
                        })
                }) || (matches!(level, Level::Node { node, .. } if !members.iter().any(|(id, _)| id == node)))
            }
            Level::Module { node, module, key } => match members.iter().find(|(id, _)| id == node) {
                Some((id, b)) => {
                    manifests_of(id, b).iter().any(|m| &m.module == module && m.keys.iter().any(|d| &d.name == key))
                }
                // A node that left: its values are not "unread by a build", they are gone with it.
                None => true,
            },
        }
    }

    /// The retiring pass (the leader's, with the renames pass): a stored value that no node's
    /// build reads any more, and no rename moves, becomes `retiring` and the operator is asked
    /// once; one that is read again stops retiring.
    pub fn config_retire_pass(&mut self, wall: Millis) -> Vec<String> {
        let mut did = Vec::new();
        if self.cluster.is_none() {
            return did;
        }
        let builds = self.published_builds();
        let user = self.user_manifests();
        let renames = config::renames(&builds, &user);
        let known: BTreeMap<String, Retiring> = self
            .config_records::<Retiring>(config::RETIRE_PREFIX)
            .into_iter()
            .map(|(_, r)| (r.level.clone(), r))
            .collect();
        let entries = self.config_entries();
        for level in entries.keys() {
            let name = level.name();
            let unread = !self.level_is_read(level, &builds, &user)
                && config::renamed_level(level, &renames).is_none()
                && !config::rename_target(level, &renames);
            match (unread, known.contains_key(&name)) {
                (true, false) => {
                    let r = Retiring { level: name.clone(), since: wall.0, asks: 1, status: "asked".into() };
                    self.put_setting(wall, format!("{}{name}", config::RETIRE_PREFIX), Some(json!(r)));
                    self.config_event(wall, json!({"event": "retiring", "level": name, "at": wall.0}));
                    did.push(format!("retiring {name}"));
                }
                (false, true) => {
                    self.put_setting(wall, format!("{}{name}", config::RETIRE_PREFIX), None);
                    did.push(format!("read again {name}"));
                }
                _ => {}
            }
        }
        for level in known.keys() {
            if !entries.keys().any(|l| &l.name() == level) {
                self.put_setting(wall, format!("{}{level}", config::RETIRE_PREFIX), None);
            }
        }
        did
    }

    pub(super) fn config_event(&mut self, wall: Millis, event: Value) {
        self.append_record(wall, config::EVENT_PREFIX, event);
    }

    /// `config retiring`: values no build reads any more, asked about for removal.
    pub fn config_retiring(&self) -> RetiringList {
        RetiringList {
            retiring: self.config_records::<Retiring>(config::RETIRE_PREFIX).into_iter().map(|(_, r)| r).collect(),
        }
    }

    /// Answer or handle a retiring value: `approve` removes it (`retired` said per node that
    /// held it), `ask` asks the operator again, `cancel` keeps it and stops asking.
    pub fn config_retire(
        &mut self,
        wall: Millis,
        level_name: &str,
        action: &str,
        account: &str,
    ) -> Result<RetireAnswered, ApiError> {
        self.in_cluster()?;
        let key = format!("{}{level_name}", config::RETIRE_PREFIX);
        let Some(mut r) = self
            .config_records::<Retiring>(config::RETIRE_PREFIX)
            .into_iter()
            .map(|(_, r)| r)
            .find(|r| r.level == level_name)
        else {
            return Err(ApiError::not_found("not_retiring", format!("{level_name} is not retiring")));
        };
        match action {
            "approve" => {
                let level = Level::parse(level_name)
                    .ok_or_else(|| ApiError::invalid("bad_level", format!("{level_name} is not a level")))?;
                let why = format!("retired: no build reads {level_name} any more");
                let result = self.config_write(wall, &level, None, &why, account, None, "retire");
                self.put_setting(wall, key, None);
                let nodes: Vec<String> = match &level {
                    Level::Node { node, .. } | Level::Module { node, .. } => vec![node.to_string()],
                    Level::Mesh { .. } => {
                        self.members.records().filter(|m| !m.removed).map(|m| m.id.to_string()).collect()
                    }
                };
                for node in &nodes {
                    self.config_event(
                        wall,
                        json!({"event": "retired", "level": level_name, "node": node, "at": wall.0}),
                    );
                }
                Ok(RetireAnswered::Retired { retired: level_name.to_string(), nodes, result })
            }
            "ask" => {
                r.asks += 1;
                r.status = "asked".into();
                self.put_setting(wall, key, Some(json!(r)));
                Ok(RetireAnswered::Retiring(r))
            }
            "cancel" => {
                r.status = "cancelled".into();
                self.put_setting(wall, key, Some(json!(r)));
                Ok(RetireAnswered::Retiring(r))
            }
            other => Err(ApiError::invalid("bad_action", format!("{other:?}: approve, ask or cancel"))),
        }
    }
}
