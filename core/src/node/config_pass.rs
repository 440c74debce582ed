//! The config pass and what it applies (DESIGN.md "Configuration"): every 5 s or when
//! kicked, publish this node's build, run the leader's rename and retire passes, resolve this
//! node's values and lay them over its running state; the planner's limits from them.

use super::Node;
use crate::config::resolve::Resolved;
use crate::time::Millis;
use std::collections::BTreeMap;

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
            self.trim_append_logs(wall);
            if !did.is_empty() {
                self.event(super::Event::ConfigRenames { did });
            }
        }
        let own = self.config_resolved_own();
        if self.config_applied.as_ref() == Some(&*own) {
            return;
        }
        let own = (*own).clone();
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
        if let Some(v) = set("meta", "append_gap") {
            meta.append_gap_ms = v;
        }
        for (key, slot) in [
            ("page_max", &mut meta.page_max),
            ("snapshot_page_max", &mut meta.snapshot_page_max),
            ("batch_max", &mut meta.batch_max),
            ("submit_window", &mut meta.submit_window),
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

    /// The scheduling weights as this node resolves them (`scheduling.weight.*`; a key a
    /// record's build never knew keeps its shipped value).
    pub fn sched_weights(&self) -> crate::sched::Weights {
        let own = self.config_resolved_own();
        let mut w = crate::sched::Weights::default();
        if let Some(keys) = own.get("scheduling") {
            for name in crate::sched::Weights::NAMES {
                if let Some(v) = keys.get(&format!("weight.{name}")).and_then(|r| r.value.as_ref()?.as_f64()) {
                    w.set(name, v);
                }
            }
        }
        w
    }
}
