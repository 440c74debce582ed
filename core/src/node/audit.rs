//! The cluster's audit log of admin acts (a replicated record per act).

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

impl Node {
    /// Record an admin act in the cluster's audit log (a replicated record). The entry lingers
    /// ([`crate::meta::machine::Meta::submit_lingering`]): it travels with the next change
    /// this node sends, at most `linger_ms` later, so an act and the audit entry of the act
    /// before it share one request.
    pub fn audit(&mut self, wall: Millis, act: &str, account: &str, status: u16) {
        if self.cluster.is_none() {
            return;
        }
        let value = json!({"at": wall.0, "node": self.id, "account": account, "act": act, "status": status});
        let record = self.log_record(wall, AUDIT_PREFIX, value);
        let now = self.advance_clocks(wall);
        self.meta.submit_lingering(now, record);
        self.drain_meta(wall, now);
    }

    /// Leader, on its config pass: remove the oldest entries of each append-only log beyond
    /// [`APPEND_LOG_KEEP`] (tombstones, purged like any other after their age). Returns how many.
    pub(super) fn trim_append_logs(&mut self, wall: Millis) -> usize {
        let mut out = Vec::new();
        for prefix in [AUDIT_PREFIX, crate::config::HISTORY_PREFIX, crate::config::EVENT_PREFIX] {
            let mut keys: Vec<String> = self.config_settings(prefix).map(|s| s.key.clone()).collect();
            if keys.len() <= APPEND_LOG_KEEP {
                continue;
            }
            // Keys are `PREFIX` + zero-padded wall ms + node + counter: sorted is oldest first.
            keys.sort();
            let excess = (keys.len() - APPEND_LOG_KEEP).min(TRIM_BATCH);
            for key in keys.into_iter().take(excess) {
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

    /// The audit log, newest first (at most `limit`).
    pub fn audit_list(&self, limit: usize) -> AuditList {
        let mut all: Vec<(crate::hlc::Version, Value)> =
            self.config_settings(AUDIT_PREFIX).map(|s| (s.version.clone(), s.value.clone())).collect();
        all.sort_by(|a, b| b.0.cmp(&a.0));
        all.truncate(limit);
        AuditList { audit: all.into_iter().map(|(_, v)| v).collect() }
    }
}
