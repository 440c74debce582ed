//! The node's side of the configuration control plane (spec mesh-config.md "The verb",
//! "Proposing a value"): list, set, clear and history, proposals with approve and decline,
//! and this node's resolved values. Values, history and proposals are replicated settings
//! records under `config/` (see [`crate::config`]); the rules are in `crate::config`.

pub use super::audit::AUDIT_PREFIX;
pub use super::config_pass::CONFIG_EVERY_MS;
use super::{ApiError, Node};
use crate::config::resolve::{Change, Source};
use crate::config::resolve::{Level, Resolved, Resolver};
use crate::config::types::KeyType;
use crate::config::{
    self, builtin, ConfigError, Entry, HistoryEntry, Proposal, ProposalStatus, HISTORY_PREFIX, PROPOSAL_PREFIX,
    VALUE_PREFIX,
};
use crate::meta::records::{Record, RecordKind, Setting};
use crate::time::Millis;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// `config list`: stored values (with who, why, when), resolved values with their source,
/// modules that could not be resolved and why, and the predefined keys in force.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigList {
    pub values: Vec<Entry>,
    pub resolved: Vec<ResolvedView>,
    pub unresolved: Vec<Unresolved>,
    pub predefined: Vec<PredefinedKey>,
    /// The build the predefined keys come from.
    pub predefined_from: String,
    pub withheld: Vec<WithheldBuild>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResolvedView {
    pub node: crate::NodeId,
    pub module: String,
    pub key: String,
    pub value: Option<Value>,
    pub source: Source,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unresolved {
    pub node: crate::NodeId,
    pub module: String,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredefinedKey {
    pub key: String,
    #[serde(rename = "type")]
    pub ty: KeyType,
    pub default: Option<Value>,
    pub trusted: bool,
    pub doc: String,
}

/// A build whose predefined keys are not in force, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WithheldBuild {
    pub build: String,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigHistory {
    pub history: Vec<HistoryEntry>,
}

/// A value written (or cleared) at a level, and the resolved values it moved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigWritten {
    pub level: String,
    pub value: Option<Value>,
    pub previous: Option<Value>,
    pub approved: Option<config::Approval>,
    pub moved: Vec<Change>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProposalList {
    pub proposals: Vec<Proposal>,
}

/// `config approve` / `decline`: a declined proposal, or the approved one and what it set.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ProposalAnswered {
    Declined(Proposal),
    Approved { proposal: Proposal, result: ConfigWritten },
}

pub(super) fn api(e: ConfigError) -> ApiError {
    ApiError::new(e.kind(), e.code(), e.to_string())
}

/// What a list or history is narrowed to.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct ConfigFilter {
    pub module: Option<String>,
    pub node: Option<String>,
    pub key: Option<String>,
}

impl ConfigFilter {
    pub(super) fn level(&self, l: &Level) -> bool {
        let key_ok = self.key.as_ref().is_none_or(|k| l.key() == k || l.key().ends_with(&format!(".{k}")));
        let (node, module) = match l {
            Level::Mesh { .. } => (None, None),
            Level::Node { node, .. } => (Some(node.as_str()), None),
            Level::Module { node, module, .. } => (Some(node.as_str()), Some(module.as_str())),
        };
        let node_ok = self.node.as_ref().is_none_or(|n| node.is_none_or(|x| x == n));
        // A mesh or node value belongs to the module its predefined key is named after.
        let module_ok = self.module.as_ref().is_none_or(|m| match module {
            Some(x) => x == m,
            None => l.key().starts_with(&format!("{m}.")),
        });
        key_ok && node_ok && module_ok
    }

    pub(super) fn slot(&self, node: &str, module: &str, key: &str) -> bool {
        self.node.as_ref().is_none_or(|n| n == node)
            && self.module.as_ref().is_none_or(|m| m == module)
            && self.key.as_ref().is_none_or(|k| k == key || k == &format!("{module}.{key}"))
    }
}

impl Node {
    pub(super) fn config_settings<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Setting> + 'a {
        self.meta.state().of_kind_under(RecordKind::Setting, prefix).filter_map(move |r| match r {
            Record::Setting(s) if !s.removed => Some(s),
            _ => None,
        })
    }

    /// What this node's resolution depends on, as one number: the versions of the settings
    /// it reads (values, user modules and their placements, published builds), every member's
    /// build and removal, and this node's own build. Equal numbers, equal resolutions.
    fn config_inputs_fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same inputs give the same number on every run.
        let mut h = std::hash::DefaultHasher::new();
        for prefix in
            [VALUE_PREFIX, crate::config::MODULE_PREFIX, crate::config::PLACEMENT_PREFIX, crate::config::BUILD_PREFIX]
        {
            for r in self.meta.state().of_kind_under(RecordKind::Setting, prefix) {
                if let Record::Setting(s) = r {
                    (&s.key, &s.version, s.removed).hash(&mut h);
                }
            }
        }
        for r in self.members.records() {
            (&r.id, &r.version, r.removed).hash(&mut h);
        }
        (&self.id, &self.me.software_version, self.members.get(&self.id).is_some()).hash(&mut h);
        h.finish()
    }

    /// Stored values by level.
    pub fn config_entries(&self) -> BTreeMap<Level, Entry> {
        self.config_settings(VALUE_PREFIX)
            .filter_map(|s| {
                let level = Level::parse(&s.key[VALUE_PREFIX.len()..])?;
                let entry: Entry = serde_json::from_value(s.value.clone()).ok()?;
                Some((level, entry))
            })
            .collect()
    }

    /// A resolver over every member (each on the build it reports) with every built-in module
    /// placed, the stored values, resolved.
    pub fn config_resolver(&self) -> Resolver {
        let mut r = Resolver::new();
        // Every build members run, each with the installed user modules' manifests beside its own.
        let user = self.user_manifests();
        let builds = self.published_builds();
        r.set_aliases(config::aliases(&config::renames(&builds, &user)));
        for b in builds {
            let mut manifests = b.manifests;
            manifests.extend(user.iter().cloned());
            r.set_build_manifests(&b.build, manifests);
        }
        let builtins: BTreeSet<String> = builtin::manifests().into_iter().map(|m| m.module).collect();
        let placements = self.user_placements();
        let placed_on = |id: &crate::NodeId| -> BTreeSet<String> {
            let mut set = builtins.clone();
            for (module, nodes) in &placements {
                if nodes.contains(id) {
                    set.insert(module.clone());
                }
            }
            set
        };
        let own_build = self.me.software_version.clone();
        for rec in self.members.records().filter(|r| !r.removed) {
            let build =
                if rec.version.is_empty() || rec.id == self.id { own_build.as_str() } else { rec.version.as_str() };
            r.set_node(rec.id.clone(), build, placed_on(&rec.id));
        }
        if self.members.get(&self.id).is_none() {
            r.set_node(self.id.clone(), &own_build, placed_on(&self.id));
        }
        r.set_values(self.config_entries().into_iter().map(|(l, e)| (l, e.value)).collect());
        r.resolve_all();
        r
    }

    /// `config list`: stored values (with who, why, when), resolved values with their source,
    /// modules that could not be resolved and why, and the predefined keys.
    pub fn config_list(&self, f: &ConfigFilter) -> ConfigList {
        let values = self.config_entries().into_iter().filter(|(l, _)| f.level(l)).map(|(_, e)| e).collect();
        let r = self.config_resolver();
        let resolved = r
            .resolved()
            .iter()
            .filter(|((n, m, k), _)| f.slot(n.as_str(), m, k))
            .map(|((n, m, k), v)| ResolvedView {
                node: n.clone(),
                module: m.clone(),
                key: k.clone(),
                value: v.value.clone(),
                source: v.source,
            })
            .collect();
        let unresolved = r
            .unresolved()
            .iter()
            .map(|((n, m), why)| Unresolved { node: n.clone(), module: m.clone(), why: why.clone() })
            .collect();
        let (declared, from, withheld) = self.predefined_in_force();
        let predefined = declared
            .into_iter()
            .filter(|d| f.key.as_ref().is_none_or(|k| &d.name == k))
            .map(|d| PredefinedKey { key: d.name, ty: d.ty, default: d.default, trusted: d.trusted, doc: d.doc })
            .collect();
        let withheld = withheld.into_iter().map(|(build, why)| WithheldBuild { build, why }).collect();
        ConfigList { values, resolved, unresolved, predefined, predefined_from: from, withheld }
    }

    /// This node's resolved values: module -> key -> (value, source).
    /// Resolving is costly (every build's manifests are read) and hot paths ask for one value
    /// (a placement its weights), so the answer is kept until what it depends on moves
    /// ([`Node::config_inputs_fingerprint`]).
    pub fn config_resolved_own(&self) -> std::sync::Arc<BTreeMap<String, BTreeMap<String, Resolved>>> {
        let fingerprint = self.config_inputs_fingerprint();
        if let Some((f, own)) = self.config_memo.borrow().as_ref() {
            if *f == fingerprint {
                return own.clone();
            }
        }
        let mut out: BTreeMap<String, BTreeMap<String, Resolved>> = BTreeMap::new();
        for ((n, m, k), v) in self.config_resolver().resolved() {
            if n == &self.id {
                out.entry(m.clone()).or_default().insert(k.clone(), v.clone());
            }
        }
        let out = std::sync::Arc::new(out);
        *self.config_memo.borrow_mut() = Some((fingerprint, out.clone()));
        out
    }

    /// Append `value` under `prefix` as a new record keyed by its own version (history, events,
    /// audit: append-only logs, ordered by key).
    pub(super) fn append_record(&mut self, wall: Millis, prefix: &str, value: Value) {
        let record = self.log_record(wall, prefix, value);
        self.submit_record(wall, record);
    }

    /// A new record of an append-only log under `prefix`, keyed by its own version.
    pub(super) fn log_record(&mut self, wall: Millis, prefix: &str, value: Value) -> Record {
        let version = self.hlc.next(wall);
        let key = format!("{prefix}{:016}-{}-{:08}", version.wall_ms, version.node, version.counter);
        Record::Setting(Setting { key, value, removed: false, version })
    }

    pub(super) fn write_history(&mut self, wall: Millis, h: HistoryEntry) {
        self.append_record(wall, HISTORY_PREFIX, json!(h));
    }

    /// Write (or clear) the value at `level` and record it; returns the resolved values moved.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn config_write(
        &mut self,
        wall: Millis,
        level: &Level,
        value: Option<Value>,
        why: &str,
        account: &str,
        approved: Option<config::Approval>,
        action: &str,
    ) -> ConfigWritten {
        let mut r = self.config_resolver();
        let previous = r.value(level).cloned();
        let changes = r.set(level.clone(), value.clone());
        let key = format!("{VALUE_PREFIX}{}", level.name());
        let entry = value.as_ref().map(|v| Entry {
            level: level.name(),
            value: v.clone(),
            by: self.id.to_string(),
            account: account.to_string(),
            why: why.to_string(),
            at: wall.0,
            approved: approved.clone(),
        });
        self.put_setting(wall, key, entry.as_ref().map(|e| json!(e)));
        let moved: Vec<String> = changes.iter().map(|c| format!("{}:{}.{}", c.node, c.module, c.key)).collect();
        self.write_history(
            wall,
            HistoryEntry {
                at: wall.0,
                action: action.to_string(),
                level: level.name(),
                value: value.clone(),
                previous: previous.clone(),
                by: self.id.to_string(),
                account: account.to_string(),
                why: why.to_string(),
                moved: moved.clone(),
            },
        );
        self.event(super::Event::ConfigChanged { level: level.name(), moved: moved.len() });
        self.raise(wall, "config.changed", json!({"level": level.name(), "value": value, "moved": moved}));
        ConfigWritten { level: level.name(), value, previous, approved, moved: changes }
    }

    /// `config set` / `config clear` (an admin's direct act): one level, a reason, a declared
    /// key, a valid value, and never a trusted key.
    pub fn config_set(
        &mut self,
        wall: Millis,
        level: &Level,
        input: Option<&Value>,
        why: &str,
        account: &str,
    ) -> Result<ConfigWritten, ApiError> {
        self.in_cluster()?;
        let r = self.config_resolver();
        let value = config::judge(&self.predefined_in_force().0, &r, level, input, why, true).map_err(api)?;
        let action = if value.is_some() { "set" } else { "clear" };
        Ok(self.config_write(wall, level, value, why, account, None, action))
    }

    /// `config history`, newest first, narrowed like a list.
    pub fn config_history(&self, f: &ConfigFilter, limit: usize) -> ConfigHistory {
        // Newest first by the record's version (an HLC: ordered even within one millisecond).
        let mut entries: Vec<(crate::hlc::Version, HistoryEntry)> = self
            .config_settings(HISTORY_PREFIX)
            .filter_map(|s| Some((s.version.clone(), serde_json::from_value(s.value.clone()).ok()?)))
            .filter(|(_, h): &(_, HistoryEntry)| Level::parse(&h.level).is_some_and(|l| f.level(&l)))
            .collect();
        entries.sort_by(|a, b| b.0.cmp(&a.0));
        entries.truncate(limit);
        ConfigHistory { history: entries.into_iter().map(|(_, h)| h).collect() }
    }

    /// Proposals with their record's version (an HLC: ordered within one millisecond too).
    pub(super) fn proposals_versioned(&self) -> Vec<(crate::hlc::Version, Proposal)> {
        self.config_settings(PROPOSAL_PREFIX)
            .filter_map(|s| Some((s.version.clone(), serde_json::from_value(s.value.clone()).ok()?)))
            .collect()
    }

    pub(super) fn proposals(&self) -> Vec<Proposal> {
        self.proposals_versioned().into_iter().map(|(_, p)| p).collect()
    }

    pub(super) fn put_proposal(&mut self, wall: Millis, p: &Proposal) {
        self.put_setting(wall, format!("{PROPOSAL_PREFIX}{}", p.id), Some(json!(p)));
    }

    /// `config propose`: judged as a set would be (a trusted key may be proposed), kept with the
    /// value stored at its level now; at most 3 open, the same change twice refused, a newer one
    /// for the same level replacing the older.
    pub fn config_propose(
        &mut self,
        wall: Millis,
        level: &Level,
        input: Option<&Value>,
        why: &str,
        account: &str,
    ) -> Result<Proposal, ApiError> {
        self.in_cluster()?;
        let r = self.config_resolver();
        let value = config::judge(&self.predefined_in_force().0, &r, level, input, why, false).map_err(api)?;
        let open: Vec<Proposal> = self.proposals().into_iter().filter(|p| p.is_open(wall.0)).collect();
        let replaces = config::admit_proposal(&open, &level.name(), &value).map_err(api)?;
        if let Some(old) = replaces.and_then(|id| open.iter().find(|p| p.id == id).cloned()) {
            let replaced = Proposal { status: ProposalStatus::Replaced, answered_at: Some(wall.0), ..old };
            self.put_proposal(wall, &replaced);
        }
        let p = Proposal {
            id: self.rng.uuid_v4(),
            level: level.name(),
            value,
            shown_against: r.value(level).cloned(),
            by: format!("{}/{account}", self.id),
            why: why.to_string(),
            at: wall.0,
            status: ProposalStatus::Open,
            answered_by: None,
            answered_at: None,
        };
        self.put_proposal(wall, &p);
        Ok(p)
    }

    /// `config proposals`, newest first (expired ones say so).
    pub fn config_proposals(&self, wall: Millis) -> ProposalList {
        let mut all: Vec<(crate::hlc::Version, Proposal)> = self
            .proposals_versioned()
            .into_iter()
            .map(|(v, mut p)| {
                if p.status == ProposalStatus::Open && !p.is_open(wall.0) {
                    p.status = ProposalStatus::Expired;
                }
                (v, p)
            })
            .collect();
        // Newest first: by when proposed, then by the record's version.
        all.sort_by(|a, b| b.1.at.cmp(&a.1.at).then_with(|| b.0.cmp(&a.0)));
        ProposalList { proposals: all.into_iter().map(|(_, p)| p).collect() }
    }

    /// One proposal, whole (an expired one says so).
    pub fn config_proposal(&self, wall: Millis, id: &str) -> Result<Proposal, ApiError> {
        self.config_proposals(wall)
            .proposals
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| ApiError::not_found("unknown_proposal", format!("no proposal {id}")))
    }

    /// `config approve` / `config decline`. An approve binds the proposal as the admin saw it
    /// (`seen`: its value and the value it was shown against; the stored proposal when absent)
    /// and refuses, setting nothing, when the proposal or the stored value changed since.
    pub fn config_answer(
        &mut self,
        wall: Millis,
        id: &str,
        approve: bool,
        seen: Option<(Option<Value>, Option<Value>)>,
        account: &str,
    ) -> Result<ProposalAnswered, ApiError> {
        self.in_cluster()?;
        let now_stored = self
            .proposals()
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| ApiError::not_found("unknown_proposal", format!("no proposal {id}")))?;
        let as_seen = match seen {
            Some((value, shown_against)) => Proposal { value, shown_against, ..now_stored.clone() },
            None => now_stored.clone(),
        };
        let level = Level::parse(&now_stored.level)
            .ok_or_else(|| ApiError::conflict("proposal_refused", "the proposal names no valid level"))?;
        let who = format!("{}/{account}", self.id);
        if !approve {
            if !now_stored.is_open(wall.0) {
                return Err(api(ConfigError::Proposal("the proposal is not open".into())));
            }
            let declined = Proposal {
                status: ProposalStatus::Declined,
                answered_by: Some(who),
                answered_at: Some(wall.0),
                ..now_stored
            };
            self.put_proposal(wall, &declined);
            return Ok(ProposalAnswered::Declined(declined));
        }
        let r = self.config_resolver();
        config::check_approve(&as_seen, &now_stored, r.value(&level), wall.0).map_err(api)?;
        // Judged again: the declarations may have changed since it was proposed.
        let value =
            config::judge(&self.predefined_in_force().0, &r, &level, now_stored.value.as_ref(), &now_stored.why, false)
                .map_err(api)?;
        let approval = config::Approval { by: who.clone(), proposal: now_stored.id.clone(), at: wall.0 };
        let why = format!("approved proposal {}: {}", now_stored.id, now_stored.why);
        let result = self.config_write(wall, &level, value, &why, account, Some(approval), "approve");
        let approved = Proposal {
            status: ProposalStatus::Approved,
            answered_by: Some(who),
            answered_at: Some(wall.0),
            ..now_stored
        };
        self.put_proposal(wall, &approved);
        Ok(ProposalAnswered::Approved { proposal: approved, result })
    }

    /// A resolved value of this node as a number (durations in ms, sizes in bytes).
    pub fn config_number(&self, module: &str, key: &str) -> Option<f64> {
        self.config_resolved_own().get(module)?.get(key)?.value.as_ref()?.as_f64()
    }
}
