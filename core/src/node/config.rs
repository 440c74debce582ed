//! The node's side of the configuration control plane (spec mesh-config.md "The verb",
//! "Proposing a value"): list, set, clear and history, proposals with approve and decline,
//! and this node's resolved values. Values, history and proposals are replicated settings
//! records under `config/` (see [`crate::config`]); the rules are in `crate::config`.

use super::{ApiError, Node};
use crate::config::resolve::{Level, Resolved, Resolver};
use crate::config::{
    self, builtin, ConfigError, Entry, HistoryEntry, Proposal, ProposalStatus, HISTORY_PREFIX, PROPOSAL_PREFIX,
    VALUE_PREFIX,
};
use crate::meta::records::{Record, RecordKind, Setting};
use crate::time::Millis;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

fn api(e: ConfigError) -> ApiError {
    ApiError::new(e.status(), e.code(), e.to_string())
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
    fn level(&self, l: &Level) -> bool {
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

    fn slot(&self, node: &str, module: &str, key: &str) -> bool {
        self.node.as_ref().is_none_or(|n| n == node)
            && self.module.as_ref().is_none_or(|m| m == module)
            && self.key.as_ref().is_none_or(|k| k == key || k == &format!("{module}.{key}"))
    }
}

impl Node {
    fn config_settings(&self, prefix: &str) -> impl Iterator<Item = &Setting> + '_ {
        let prefix = prefix.to_string();
        self.meta.state().of_kind(RecordKind::Setting).filter_map(move |r| match r {
            Record::Setting(s) if !s.removed && s.key.starts_with(&prefix) => Some(s),
            _ => None,
        })
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
    pub fn config_list(&self, f: &ConfigFilter) -> Value {
        let values: Vec<Value> = self
            .config_entries()
            .into_iter()
            .filter(|(l, _)| f.level(l))
            .map(|(_, e)| serde_json::to_value(e).expect("serialise"))
            .collect();
        let r = self.config_resolver();
        let resolved: Vec<Value> = r
            .resolved()
            .iter()
            .filter(|((n, m, k), _)| f.slot(n.as_str(), m, k))
            .map(|((n, m, k), v)| json!({"node": n, "module": m, "key": k, "value": v.value, "source": v.source}))
            .collect();
        let unresolved: Vec<Value> =
            r.unresolved().iter().map(|((n, m), why)| json!({"node": n, "module": m, "why": why})).collect();
        let predefined: Vec<Value> = self
            .predefined_in_force()
            .0
            .into_iter()
            .filter(|d| f.key.as_ref().is_none_or(|k| &d.name == k))
            .map(|d| json!({"key": d.name, "type": d.ty, "default": d.default, "trusted": d.trusted, "doc": d.doc}))
            .collect();
        let (_, from, withheld) = self.predefined_in_force();
        let withheld: Vec<Value> = withheld.into_iter().map(|(b, why)| json!({"build": b, "why": why})).collect();
        json!({
            "values": values,
            "resolved": resolved,
            "unresolved": unresolved,
            "predefined": predefined,
            "predefinedFrom": from,
            "withheld": withheld,
        })
    }

    /// This node's resolved values: module -> key -> (value, source).
    pub fn config_resolved_own(&self) -> BTreeMap<String, BTreeMap<String, Resolved>> {
        let mut out: BTreeMap<String, BTreeMap<String, Resolved>> = BTreeMap::new();
        for ((n, m, k), v) in self.config_resolver().resolved() {
            if n == &self.id {
                out.entry(m.clone()).or_default().insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// Append `value` under `prefix` as a new record keyed by its own version (history, events,
    /// audit: append-only logs, ordered by key).
    fn append_record(&mut self, wall: Millis, prefix: &str, value: Value) {
        let version = self.hlc.next(wall);
        let key = format!("{prefix}{:016}-{}-{:08}", version.wall_ms, version.node, version.counter);
        self.submit_record(wall, Record::Setting(Setting { key, value, removed: false, version }));
    }

    fn write_history(&mut self, wall: Millis, h: HistoryEntry) {
        self.append_record(wall, HISTORY_PREFIX, json!(h));
    }

    /// Write (or clear) the value at `level` and record it; returns the resolved values moved.
    #[allow(clippy::too_many_arguments)]
    fn config_write(
        &mut self,
        wall: Millis,
        level: &Level,
        value: Option<Value>,
        why: &str,
        account: &str,
        approved: Option<config::Approval>,
        action: &str,
    ) -> Value {
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
        json!({
            "level": level.name(),
            "value": value,
            "previous": previous,
            "approved": approved,
            "moved": changes.iter().map(|c| json!({"node": c.node, "module": c.module, "key": c.key, "from": c.from, "to": c.to})).collect::<Vec<_>>(),
        })
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
    ) -> Result<Value, ApiError> {
        self.in_cluster()?;
        let r = self.config_resolver();
        let value = config::judge(&self.predefined_in_force().0, &r, level, input, why, true).map_err(api)?;
        let action = if value.is_some() { "set" } else { "clear" };
        Ok(self.config_write(wall, level, value, why, account, None, action))
    }

    /// `config history`, newest first, narrowed like a list.
    pub fn config_history(&self, f: &ConfigFilter, limit: usize) -> Value {
        // Newest first by the record's version (an HLC: ordered even within one millisecond).
        let mut entries: Vec<(crate::hlc::Version, HistoryEntry)> = self
            .config_settings(HISTORY_PREFIX)
            .filter_map(|s| Some((s.version.clone(), serde_json::from_value(s.value.clone()).ok()?)))
            .filter(|(_, h): &(_, HistoryEntry)| Level::parse(&h.level).is_some_and(|l| f.level(&l)))
            .collect();
        entries.sort_by(|a, b| b.0.cmp(&a.0));
        entries.truncate(limit);
        let entries: Vec<HistoryEntry> = entries.into_iter().map(|(_, h)| h).collect();
        json!({ "history": entries })
    }

    /// Proposals with their record's version (an HLC: ordered within one millisecond too).
    fn proposals_versioned(&self) -> Vec<(crate::hlc::Version, Proposal)> {
        self.config_settings(PROPOSAL_PREFIX)
            .filter_map(|s| Some((s.version.clone(), serde_json::from_value(s.value.clone()).ok()?)))
            .collect()
    }

    fn proposals(&self) -> Vec<Proposal> {
        self.proposals_versioned().into_iter().map(|(_, p)| p).collect()
    }

    fn put_proposal(&mut self, wall: Millis, p: &Proposal) {
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
    ) -> Result<Value, ApiError> {
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
        Ok(json!(p))
    }

    /// `config proposals`, newest first (expired ones say so), or one whole.
    pub fn config_proposals(&self, wall: Millis, id: Option<&str>) -> Result<Value, ApiError> {
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
        let all: Vec<Proposal> = all.into_iter().map(|(_, p)| p).collect();
        match id {
            Some(id) => all
                .into_iter()
                .find(|p| p.id == id)
                .map(|p| json!(p))
                .ok_or_else(|| ApiError::new(404, "unknown_proposal", format!("no proposal {id}"))),
            None => Ok(json!({ "proposals": all })),
        }
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
    ) -> Result<Value, ApiError> {
        self.in_cluster()?;
        let now_stored = self
            .proposals()
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| ApiError::new(404, "unknown_proposal", format!("no proposal {id}")))?;
        let as_seen = match seen {
            Some((value, shown_against)) => Proposal { value, shown_against, ..now_stored.clone() },
            None => now_stored.clone(),
        };
        let level = Level::parse(&now_stored.level)
            .ok_or_else(|| ApiError::new(409, "proposal_refused", "the proposal names no valid level"))?;
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
            return Ok(json!(declined));
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
        Ok(json!({ "proposal": approved, "result": result }))
    }

    /// A resolved value of this node as a number (durations in ms, sizes in bytes).
    pub fn config_number(&self, module: &str, key: &str) -> Option<f64> {
        self.config_resolved_own().get(module)?.get(key)?.value.as_ref()?.as_f64()
    }
}

/// How often the config pass runs (besides right after a config write).
pub const CONFIG_EVERY_MS: u64 = 5_000;

impl Node {
    /// The config pass, from `handle_timeout` every [`CONFIG_EVERY_MS`] or at once after
    /// [`Node::config_kick`]: publish this node's build, run the leader's rename and retire
    /// passes (the leader alone moves a value, so it moves once), resolve this node's values,
    /// and when they moved, take them into the running node and ask the shell to write them
    /// out ([`super::Output::ConfigFiles`]).
    pub(super) fn config_timeout(&mut self, wall: Millis, now: Millis) {
        self.config_due = now.plus(CONFIG_EVERY_MS);
        self.publish_build(wall);
        if self.leader_term(wall).is_some() {
            let mut did = self.config_rename_pass(wall);
            did.extend(self.config_retire_pass(wall));
            if !did.is_empty() {
                self.event(super::Event::ConfigRenames { did });
            }
        }
        let own = self.config_resolved_own();
        if self.config_applied.as_ref() == Some(&own) {
            return;
        }
        self.push_output(super::Output::ConfigFiles(own.clone()));
        let changed = self.apply_config(wall, &own);
        if !changed.is_empty() {
            self.event(super::Event::ConfigApplied { changed });
        }
        self.config_applied = Some(own);
    }

    /// Run the config pass at the next `handle_timeout` (after a config write).
    pub fn config_kick(&mut self) {
        self.config_due = Millis::ZERO;
    }
}

impl Node {
    /// Take this node's resolved values that were set somewhere into the running state, laid
    /// over the config the node was started with (a default-sourced value leaves the start
    /// config alone, so a cleared value goes back to it). Returns what changed, `key=value`.
    pub fn apply_config(&mut self, wall: Millis, own: &BTreeMap<String, BTreeMap<String, Resolved>>) -> Vec<String> {
        use crate::config::resolve::Source;
        let mut changed = Vec::new();
        let set = |module: &str, key: &str| -> Option<u64> {
            let r = own.get(module)?.get(key)?;
            if r.source == Source::Default || r.source == Source::Unset {
                return None;
            }
            r.value.as_ref()?.as_u64()
        };
        let mut cfg = self.base_config.clone();
        let m = &mut cfg.membership;
        for (key, slot) in [
            ("heartbeat_interval", &mut m.heartbeat_interval_ms),
            ("heartbeat_timeout", &mut m.heartbeat_timeout_ms),
            ("online_within", &mut m.online_within_ms),
            ("unknown_within", &mut m.unknown_within_ms),
            ("tombstone_age", &mut m.tombstone_ttl_ms),
        ] {
            if let Some(v) = set("membership", key) {
                *slot = v;
            }
        }
        let num = |module: &str, key: &str| -> Option<f64> {
            let r = own.get(module)?.get(key)?;
            if r.source == Source::Default || r.source == Source::Unset {
                return None;
            }
            r.value.as_ref()?.as_f64()
        };
        if let Some(v) = num("membership", "degraded_cpu_pct") {
            cfg.membership.degraded_cpu_pct = v;
        }
        if let Some(v) = num("membership", "degraded_ram_pct") {
            cfg.membership.degraded_ram_frac = v / 100.0;
        }
        if let Some(v) = num("membership", "degraded_disk_free_pct") {
            cfg.membership.degraded_disk_free_frac = v / 100.0;
        }
        if let Some(v) = num("membership", "latency_alpha") {
            cfg.membership.latency_alpha = v;
        }
        if let Some(v) = set("membership", "state_tick") {
            cfg.membership.state_tick_ms = v;
        }
        if cfg.membership.unknown_within_ms < cfg.membership.online_within_ms {
            cfg.membership.unknown_within_ms = cfg.membership.online_within_ms;
        }
        let meta = &mut cfg.meta;
        if let Some(v) = set("meta", "lease") {
            meta.lease.lease_ms = v;
        }
        if let Some(v) = set("meta", "lease_renew_every") {
            meta.lease.renew_every_ms = v;
        }
        if let Some(v) = set("meta", "compact_every") {
            meta.compact_every = v;
        }
        if let Some(v) = set("meta", "keep_entries") {
            meta.keep_entries = v;
        }
        if let Some(v) = set("meta", "lease_check_every") {
            meta.lease.tick_ms = v;
        }
        if let Some(v) = set("meta", "request_timeout") {
            meta.request_timeout_ms = v;
        }
        if let Some(v) = set("meta", "submit_retry") {
            meta.submit_retry_ms = v;
        }
        if let Some(v) = set("meta", "anti_entropy_every") {
            meta.anti_entropy_every_ms = v;
        }
        if let Some(v) = set("meta", "purge_every") {
            meta.purge_every_ms = v;
        }
        for (key, slot) in [
            ("page_max", &mut meta.page_max),
            ("snapshot_page_max", &mut meta.snapshot_page_max),
            ("batch_max", &mut meta.batch_max),
        ] {
            if let Some(v) = set("meta", key) {
                *slot = v as usize;
            }
        }
        // A renewal must come well inside the lease.
        meta.lease.renew_every_ms = meta.lease.renew_every_ms.min(meta.lease.lease_ms / 2).max(1);
        for (key, a, b) in [
            ("lease", self.config.meta.lease.lease_ms, cfg.meta.lease.lease_ms),
            ("lease_renew_every", self.config.meta.lease.renew_every_ms, cfg.meta.lease.renew_every_ms),
            ("compact_every", self.config.meta.compact_every, cfg.meta.compact_every),
            ("keep_entries", self.config.meta.keep_entries, cfg.meta.keep_entries),
        ] {
            if a != b {
                changed.push(format!("meta.{key}={b}"));
            }
        }
        let (old, new) = (&self.config.membership, &cfg.membership);
        for (key, a, b) in [
            ("heartbeat_interval", old.heartbeat_interval_ms, new.heartbeat_interval_ms),
            ("heartbeat_timeout", old.heartbeat_timeout_ms, new.heartbeat_timeout_ms),
            ("online_within", old.online_within_ms, new.online_within_ms),
            ("unknown_within", old.unknown_within_ms, new.unknown_within_ms),
            ("tombstone_age", old.tombstone_ttl_ms, new.tombstone_ttl_ms),
        ] {
            if a != b {
                changed.push(format!("membership.{key}={b}"));
            }
        }
        // Other fields (thresholds, timings) that moved without one of the keys named above.
        if self.config.membership != cfg.membership && !changed.iter().any(|c| c.starts_with("membership.")) {
            changed.push("membership thresholds".into());
        }
        if self.config.meta != cfg.meta && !changed.iter().any(|c| c.starts_with("meta.")) {
            changed.push("meta timings".into());
        }
        if !changed.is_empty() {
            // Takes effect at once: the next heartbeat is due no later than one new interval.
            self.install_config(wall, cfg);
        }
        changed
    }
}

impl Node {
    /// The replication planner's limits and timers from this node's resolved config.
    pub fn planner_config(&self) -> crate::storage::planner::PlannerConfig {
        let own = self.config_resolved_own();
        let num = |key: &str| own.get("replication")?.get(key)?.value.as_ref()?.as_u64();
        let mut c = crate::storage::planner::PlannerConfig::default();
        if let Some(v) = num("per_node_max") {
            c.per_node_max = v as usize;
        }
        if let Some(v) = num("in_flight_max") {
            c.in_flight_max = v as usize;
        }
        if let Some(v) = num("stale_after_offline") {
            c.stale_after_offline_ms = v;
        }
        if let Some(v) = num("backoff_base") {
            c.backoff_base_ms = v;
        }
        if let Some(v) = num("backoff_failures_max") {
            c.backoff_failures_max = v as u32;
        }
        if let Some(v) = num("give_up") {
            c.give_up_ms = v;
        }
        c
    }
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
    pub fn module_install(&mut self, wall: Millis, m: &crate::config::resolve::Manifest) -> Result<Value, ApiError> {
        self.in_cluster()?;
        let checked = crate::config::check_manifest(m, &self.predefined_in_force().0).map_err(api)?;
        let key = format!("{}{}", crate::config::MODULE_PREFIX, checked.module);
        self.put_setting(wall, key, Some(json!(checked)));
        Ok(json!({ "module": checked.module, "keys": checked.keys.len() }))
    }

    /// `module place` / `unplace`: run (or stop running) a user module on a member.
    pub fn module_place(&mut self, wall: Millis, module: &str, node: &str, place: bool) -> Result<Value, ApiError> {
        self.in_cluster()?;
        if !self.user_manifests().iter().any(|m| m.module == module) {
            return Err(ApiError::new(404, "unknown_module", format!("no module {module:?} is installed")));
        }
        let id = crate::NodeId::new(node);
        if self.members.get(&id).filter(|r| !r.removed).is_none() {
            return Err(ApiError::new(404, "unknown_node", format!("no member {node}")));
        }
        let version = self.hlc.next(wall);
        let key = format!("{}{module}/{node}", crate::config::PLACEMENT_PREFIX);
        let setting = Setting { key, value: Value::Bool(place), removed: !place, version };
        self.submit_record(wall, Record::Setting(setting));
        Ok(json!({ "module": module, "node": node, "placed": place }))
    }

    /// `module list`: built-in and installed modules, where each runs.
    pub fn module_list(&self) -> Value {
        let placements = self.user_placements();
        let mut out: Vec<Value> = builtin::manifests()
            .into_iter()
            .map(|m| json!({"module": m.module, "builtin": true, "keys": m.keys.len(), "placedOn": "every node"}))
            .collect();
        for m in self.user_manifests() {
            let on: Vec<String> = placements.get(&m.module).into_iter().flatten().map(|n| n.to_string()).collect();
            out.push(json!({"module": m.module, "builtin": false, "keys": m.keys.len(), "placedOn": on}));
        }
        json!({ "modules": out })
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

/// A rename window: a node still runs a build that reads the old name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Window {
    module: String,
    from: String,
    to: String,
    node: String,
    since: u64,
}

/// Something an operator should look at.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Finding {
    kind: String,
    level: String,
    to: String,
    node: String,
    since: u64,
    why: String,
}

impl Node {
    /// Write (or with `None`, remove) one of the config plane's records.
    fn put_setting(&mut self, wall: Millis, key: String, value: Option<Value>) {
        let version = self.hlc.next(wall);
        let removed = value.is_none();
        self.submit_record(
            wall,
            Record::Setting(Setting { key, value: value.unwrap_or(Value::Null), removed, version }),
        );
    }

    fn config_records<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<(String, T)> {
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
    pub fn config_renames(&self) -> Value {
        let builds = self.published_builds();
        let user = self.user_manifests();
        let windows: Vec<Window> =
            self.config_records::<Window>(config::WINDOW_PREFIX).into_iter().map(|(_, w)| w).collect();
        let list: Vec<Value> = config::renames(&builds, &user)
            .into_iter()
            .map(|r| {
                let holding: Vec<Value> = windows
                    .iter()
                    .filter(|w| w.module == r.module && w.from == r.from)
                    .map(|w| json!({"node": w.node, "since": w.since}))
                    .collect();
                json!({"module": r.module, "from": r.from, "to": r.to, "trusted": r.trusted, "open": !holding.is_empty(), "nodesHolding": holding})
            })
            .collect();
        json!({ "renames": list })
    }

    /// `config findings`: conditions held seven days (`rename-refused`, `rename-window-held`,
    /// naming the node), and the same conditions still younger than that under `pending`.
    pub fn config_findings(&self, wall: Millis) -> Value {
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
        json!({ "findings": held, "pending": pending })
    }

    /// Config events (`renamed`) of the last seven days, newest first.
    pub fn config_events(&self, wall: Millis) -> Value {
        let mut events: Vec<Value> = self
            .config_records::<Value>(config::EVENT_PREFIX)
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| e["at"].as_u64().is_some_and(|at| at + config::SEVEN_DAYS_MS >= wall.0))
            .collect();
        events.sort_by(|a, b| b["at"].as_u64().cmp(&a["at"].as_u64()));
        json!({ "events": events })
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
    fn level_is_read(
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
            let unread = !self.level_is_read(level, &builds, &user) && config::renamed_level(level, &renames).is_none();
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

    fn config_event(&mut self, wall: Millis, event: Value) {
        self.append_record(wall, config::EVENT_PREFIX, event);
    }

    /// `config retiring`: values no build reads any more, asked about for removal.
    pub fn config_retiring(&self) -> Value {
        let list: Vec<Retiring> =
            self.config_records::<Retiring>(config::RETIRE_PREFIX).into_iter().map(|(_, r)| r).collect();
        json!({ "retiring": list })
    }

    /// Answer or handle a retiring value: `approve` removes it (`retired` said per node that
    /// held it), `ask` asks the operator again, `cancel` keeps it and stops asking.
    pub fn config_retire(
        &mut self,
        wall: Millis,
        level_name: &str,
        action: &str,
        account: &str,
    ) -> Result<Value, ApiError> {
        self.in_cluster()?;
        let key = format!("{}{level_name}", config::RETIRE_PREFIX);
        let Some(mut r) = self
            .config_records::<Retiring>(config::RETIRE_PREFIX)
            .into_iter()
            .map(|(_, r)| r)
            .find(|r| r.level == level_name)
        else {
            return Err(ApiError::new(404, "not_retiring", format!("{level_name} is not retiring")));
        };
        match action {
            "approve" => {
                let level = Level::parse(level_name)
                    .ok_or_else(|| ApiError::new(400, "bad_level", format!("{level_name} is not a level")))?;
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
                Ok(json!({ "retired": level_name, "nodes": nodes, "result": result }))
            }
            "ask" => {
                r.asks += 1;
                r.status = "asked".into();
                self.put_setting(wall, key, Some(json!(r)));
                Ok(json!(r))
            }
            "cancel" => {
                r.status = "cancelled".into();
                self.put_setting(wall, key, Some(json!(r)));
                Ok(json!(r))
            }
            other => Err(ApiError::new(400, "bad_action", format!("{other:?}: approve, ask or cancel"))),
        }
    }
}

/// Settings keys of the cluster's audit log of admin acts.
pub const AUDIT_PREFIX: &str = "config/audit/";

impl Node {
    /// Record an admin act in the cluster's audit log (a replicated record).
    pub fn audit(&mut self, wall: Millis, act: &str, account: &str, status: u16) {
        if self.cluster.is_none() {
            return;
        }
        let value = json!({"at": wall.0, "node": self.id, "account": account, "act": act, "status": status});
        self.append_record(wall, AUDIT_PREFIX, value);
    }

    /// The audit log, newest first (at most `limit`).
    pub fn audit_list(&self, limit: usize) -> Value {
        let mut all: Vec<(crate::hlc::Version, Value)> =
            self.config_settings(AUDIT_PREFIX).map(|s| (s.version.clone(), s.value.clone())).collect();
        all.sort_by(|a, b| b.0.cmp(&a.0));
        all.truncate(limit);
        json!({ "audit": all.into_iter().map(|(_, v)| v).collect::<Vec<_>>() })
    }
}
