//! The cluster's audit log of admin acts: replicated records under [`AUDIT_PREFIX`], each
//! holding the acts one node saw within [`crate::meta::machine::MetaConfig::linger_ms`] (at most
//! [`AUDIT_BATCH_MAX`] of them), and trimmed to the newest [`APPEND_LOG_KEEP`] acts.
//!
//! A record's value is `{"node": ID, "acts": [[at, account, act, status], ...]}`: one row per
//! act, not one object, because every copy, clone and encoding of the record walks its JSON
//! tree and an object per act cost several times the allocations of a row. `GET /v1/audit`
//! shows each act as an object (`at`, `node`, `account`, `act`, `status`).
//!
//! One record per act made every admin act two replicated records (its change and its entry),
//! and the leader's trimming (500 records a pass) fell behind any client acting more than 100
//! times a second, so under sustained writes the log grew without bound (issue 18). Older
//! builds' records hold one act each (the act's object itself as the value); both are read.

use super::Node;
use crate::time::Millis;
use serde_json::{json, Value};

/// `GET /v1/audit`: admin acts, newest first, each as recorded (`at`, `node`, `account`, `act`,
/// `status`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AuditList {
    pub audit: Vec<Value>,
}

/// Settings keys of the cluster's audit log of admin acts.
pub const AUDIT_PREFIX: &str = "config/audit/";

/// Entries kept in each of the cluster's append-only logs (the audit log, the config history,
/// the config events). Without a bound every admin act added a record for ever, and a node's
/// memory and database grew with the number of acts (the soak of issue 17).
pub const APPEND_LOG_KEEP: usize = 10_000;
/// Entries one leader pass removes at most, so one pass stays one modest batch.
const TRIM_BATCH: usize = 500;
/// Most acts one audit record holds: past it the acts waiting go at once.
pub const AUDIT_BATCH_MAX: usize = 64;

/// One admin act waiting on its node for its record.
#[derive(Clone, Debug)]
pub(super) struct AuditAct {
    at: Millis,
    account: String,
    act: String,
    status: u16,
}

impl AuditAct {
    fn row(&self) -> Value {
        json!([self.at.0, self.account, self.act, self.status])
    }
}

/// How many acts an audit record holds.
fn act_count(value: &Value) -> usize {
    value.get("acts").and_then(Value::as_array).map_or(1, Vec::len)
}

/// The acts of an audit record as `GET /v1/audit` shows them, oldest first: the rows of a
/// record, or (older builds) the act itself. A row that is not one is shown as it is.
fn acts_of(value: &Value) -> Vec<Value> {
    let Some(rows) = value.get("acts").and_then(Value::as_array) else { return vec![value.clone()] };
    let node = value.get("node").cloned().unwrap_or(Value::Null);
    rows.iter()
        .map(|row| match row.as_array().map(Vec::as_slice) {
            Some([at, account, act, status]) => {
                json!({"at": at, "node": node, "account": account, "act": act, "status": status})
            }
            _ => row.clone(),
        })
        .collect()
}

impl Node {
    /// Record an admin act in the cluster's audit log. Acts wait on this node up to `linger_ms`
    /// from the first (or until [`AUDIT_BATCH_MAX`] wait) and go as one record, which then
    /// lingers in turn ([`crate::meta::machine::Meta::submit_lingering`]): it travels with the
    /// next change this node sends, at most `linger_ms` later. A client acting in sequence or
    /// many at once therefore adds one audit record per batch of acts, not one per act. The
    /// acts waiting are lost if the node stops within that time, as the write-behind store
    /// loses its last 50 ms (an act is recorded after its answer in any case).
    pub fn audit(&mut self, wall: Millis, act: &str, account: &str, status: u16) {
        if self.cluster.is_none() {
            return;
        }
        let now = self.advance_clocks(wall);
        self.audit_acts.push(AuditAct { at: wall, account: account.to_string(), act: act.to_string(), status });
        if self.audit_due.is_none() {
            self.audit_due = Some(now.plus(self.config.meta.linger_ms));
        }
        if self.audit_acts.len() >= AUDIT_BATCH_MAX {
            self.flush_audit(wall, now);
        }
    }

    /// The acts waiting, as one audit record.
    pub(super) fn flush_audit(&mut self, wall: Millis, now: Millis) {
        self.audit_due = None;
        if self.audit_acts.is_empty() || self.cluster.is_none() {
            self.audit_acts.clear();
            return;
        }
        let rows: Vec<Value> = std::mem::take(&mut self.audit_acts).iter().map(AuditAct::row).collect();
        let record = self.log_record(wall, AUDIT_PREFIX, json!({ "node": self.id, "acts": rows }));
        self.meta.submit_lingering(now, record);
        self.drain_meta(wall, now);
    }

    /// Leader, on its config pass: remove the oldest entries of each append-only log beyond
    /// [`APPEND_LOG_KEEP`] (tombstones, purged like any other after their age): records of the
    /// config history and events, acts of the audit log (a record goes once every act it holds
    /// is beyond the newest 10,000). Returns how many records.
    pub(super) fn trim_append_logs(&mut self, wall: Millis) -> usize {
        let mut out = Vec::new();
        for prefix in [AUDIT_PREFIX, crate::config::HISTORY_PREFIX, crate::config::EVENT_PREFIX] {
            // Keys are `PREFIX` + zero-padded wall ms + node + counter: sorted is oldest first.
            let mut entries: Vec<(String, usize)> = self
                .config_settings(prefix)
                .map(|s| (s.key.clone(), if prefix == AUDIT_PREFIX { act_count(&s.value) } else { 1 }))
                .collect();
            let mut total: usize = entries.iter().map(|(_, n)| n).sum();
            if total <= APPEND_LOG_KEEP {
                continue;
            }
            entries.sort();
            let mut excess = Vec::new();
            for (key, n) in entries {
                if total - n < APPEND_LOG_KEEP || excess.len() >= TRIM_BATCH {
                    break;
                }
                total -= n;
                excess.push(key);
            }
            for key in excess {
                let version = self.hlc.next(wall);
                out.push(crate::meta::records::Record::Setting(crate::meta::records::Setting {
                    key,
                    value: Value::Null,
                    removed: true,
                    version,
                }));
            }
        }
        let n = out.len();
        if n > 0 {
            self.submit_records(wall, out);
        }
        n
    }

    /// The audit log's acts, newest first (at most `limit`): this node's acts still waiting
    /// for their record first, so a node shows an act at once.
    pub fn audit_list(&self, limit: usize) -> AuditList {
        let mut records: Vec<(&crate::hlc::Version, &Value)> =
            self.config_settings(AUDIT_PREFIX).map(|s| (&s.version, &s.value)).collect();
        records.sort_by(|a, b| b.0.cmp(a.0));
        // A record's acts are in the order they happened: the newest is its last.
        // The acts waiting, shown as the record they will be.
        let waiting = (!self.audit_acts.is_empty())
            .then(|| json!({"node": self.id, "acts": self.audit_acts.iter().map(AuditAct::row).collect::<Vec<_>>()}));
        let values = waiting.iter().chain(records.into_iter().map(|(_, v)| v));
        let audit = values.flat_map(|v| acts_of(v).into_iter().rev()).take(limit).collect();
        AuditList { audit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acts_are_read_from_rows_and_from_older_builds_one_act_records() {
        let old = json!({"at": 5, "node": "n1", "account": "admin", "act": "PUT /v1/settings/a", "status": 200});
        assert_eq!(acts_of(&old), vec![old.clone()]);
        assert_eq!(act_count(&old), 1);
        let batch = json!({"node": "n2", "acts": [[7, "anna", "POST /v1/login anna", 401], [8, "anna", "POST /v1/login anna", 200], "odd"]});
        assert_eq!(act_count(&batch), 3);
        assert_eq!(
            acts_of(&batch),
            vec![
                json!({"at": 7, "node": "n2", "account": "anna", "act": "POST /v1/login anna", "status": 401}),
                json!({"at": 8, "node": "n2", "account": "anna", "act": "POST /v1/login anna", "status": 200}),
                json!("odd"),
            ]
        );
    }
}
