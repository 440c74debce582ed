//! Modules and builds in the config plane (mesh-config.md "Modules", "Builds"): installed
//! user modules, the builds members publish, and which manifests are predefined.

use super::config::*;
use super::{ApiError, Node};
use crate::config::resolve::Level;
use crate::config::{self, builtin};
use crate::meta::records::{Record, RecordKind, Setting};
use crate::time::Millis;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// `module install`: the module kept and how many keys it declares.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleInstalled {
    pub module: String,
    pub keys: usize,
}

/// `module place` / `unplace`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModulePlaced {
    pub module: String,
    pub node: String,
    pub placed: bool,
}

/// Where a module runs: a built-in one on every node, a user module on the nodes it is placed on.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PlacedOn {
    Every(&'static str),
    Nodes(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleView {
    pub module: String,
    pub builtin: bool,
    pub keys: usize,
    pub placed_on: PlacedOn,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleList {
    pub modules: Vec<ModuleView>,
}

impl Node {
    /// Installed user modules' manifests.
    pub fn user_manifests(&self) -> Vec<crate::config::resolve::Manifest> {
        self.config_settings(crate::config::MODULE_PREFIX)
            .filter_map(|s| serde_json::from_value(s.value.clone()).ok())
            .collect()
    }

    /// Where each user module is placed: module -> nodes.
    pub fn user_placements(&self) -> BTreeMap<String, BTreeSet<crate::NodeId>> {
        let mut out: BTreeMap<String, BTreeSet<crate::NodeId>> = BTreeMap::new();
        for s in self.config_settings(crate::config::PLACEMENT_PREFIX) {
            if let Some((module, node)) = s.key[crate::config::PLACEMENT_PREFIX.len()..].split_once('/') {
                out.entry(module.to_string()).or_default().insert(crate::NodeId::new(node));
            }
        }
        out
    }

    /// `module install`: keep a user module's manifest (checked, defaults typed) cluster-wide.
    pub fn module_install(
        &mut self,
        wall: Millis,
        m: &crate::config::resolve::Manifest,
    ) -> Result<ModuleInstalled, ApiError> {
        self.in_cluster()?;
        let checked = crate::config::check_manifest(m, &self.predefined_in_force().0).map_err(api)?;
        let key = format!("{}{}", crate::config::MODULE_PREFIX, checked.module);
        self.put_setting(wall, key, Some(json!(checked)));
        Ok(ModuleInstalled { keys: checked.keys.len(), module: checked.module })
    }

    /// `module place` / `unplace`: run (or stop running) a user module on a member.
    pub fn module_place(
        &mut self,
        wall: Millis,
        module: &str,
        node: &str,
        place: bool,
    ) -> Result<ModulePlaced, ApiError> {
        self.in_cluster()?;
        if !self.user_manifests().iter().any(|m| m.module == module) {
            return Err(ApiError::not_found("unknown_module", format!("no module {module:?} is installed")));
        }
        let id = crate::NodeId::new(node);
        if self.members.get(&id).filter(|r| !r.removed).is_none() {
            return Err(ApiError::not_found("unknown_node", format!("no member {node}")));
        }
        let version = self.hlc.next(wall);
        let key = format!("{}{module}/{node}", crate::config::PLACEMENT_PREFIX);
        let setting = Setting { key, value: Value::Bool(place), removed: !place, version };
        self.submit_record(wall, Record::Setting(setting));
        Ok(ModulePlaced { module: module.to_string(), node: node.to_string(), placed: place })
    }

    /// `module list`: built-in and installed modules, where each runs.
    pub fn module_list(&self) -> ModuleList {
        let placements = self.user_placements();
        let mut modules: Vec<ModuleView> = builtin::manifests()
            .into_iter()
            .map(|m| ModuleView {
                keys: m.keys.len(),
                module: m.module,
                builtin: true,
                placed_on: PlacedOn::Every("every node"),
            })
            .collect();
        for m in self.user_manifests() {
            let on: Vec<String> = placements.get(&m.module).into_iter().flatten().map(|n| n.to_string()).collect();
            modules.push(ModuleView {
                keys: m.keys.len(),
                module: m.module,
                builtin: false,
                placed_on: PlacedOn::Nodes(on),
            });
        }
        ModuleList { modules }
    }
}

impl Node {
    /// Builds members run, as published in the records, with this node's own build always.
    pub fn published_builds(&self) -> Vec<config::BuildManifests> {
        let mut out: BTreeMap<String, config::BuildManifests> = self
            .config_settings(config::BUILD_PREFIX)
            .filter_map(|s| serde_json::from_value::<config::BuildManifests>(s.value.clone()).ok())
            .map(|b| (b.build.clone(), b))
            .collect();
        let (name, manifests) = self.build();
        out.insert(name.to_string(), config::BuildManifests { build: name.to_string(), manifests: manifests.to_vec() });
        out.into_values().collect()
    }

    /// Publish this node's build (its built-in manifests) when the records do not hold it yet.
    pub fn publish_build(&mut self, wall: Millis) -> bool {
        if self.cluster.is_none() {
            return false;
        }
        let (name, manifests) = self.build();
        let mine = config::BuildManifests { build: name.to_string(), manifests: manifests.to_vec() };
        let key = format!("{}{}", config::BUILD_PREFIX, mine.build);
        let current = match self.meta.state().get(RecordKind::Setting, &key) {
            Some(Record::Setting(s)) if !s.removed => {
                serde_json::from_value::<config::BuildManifests>(s.value.clone()).ok()
            }
            _ => None,
        };
        if current.as_ref() == Some(&mine) {
            return false;
        }
        self.put_setting(wall, key, Some(json!(mine)));
        true
    }

    /// The predefined keys in force: from the newest build in the cluster whose list keeps
    /// every key that holds a mesh or node value; the build they come from; builds withheld,
    /// with why.
    pub fn predefined_in_force(&self) -> (Vec<crate::config::types::Declaration>, String, Vec<(String, String)>) {
        let held: BTreeSet<String> = self
            .config_entries()
            .keys()
            .filter(|l| !matches!(l, Level::Module { .. }))
            .map(|l| l.key().to_string())
            .collect();
        let builds = self.published_builds();
        let (chosen, withheld) = config::choose_predefined(&builds, &held);
        match chosen {
            Some(b) => (b.predefined(), b.build.clone(), withheld),
            None => {
                let (name, manifests) = self.build();
                let own = config::BuildManifests { build: name.to_string(), manifests: manifests.to_vec() };
                (own.predefined(), own.build, withheld)
            }
        }
    }
}
