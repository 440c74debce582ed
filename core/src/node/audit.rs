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
    pub fn audit_list(&self, limit: usize) -> AuditList {
        let mut all: Vec<(crate::hlc::Version, Value)> =
            self.config_settings(AUDIT_PREFIX).map(|s| (s.version.clone(), s.value.clone())).collect();
        all.sort_by(|a, b| b.0.cmp(&a.0));
        all.truncate(limit);
        AuditList { audit: all.into_iter().map(|(_, v)| v).collect() }
    }
}
