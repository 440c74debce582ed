//! What a submit may ask for (`POST /v1/jobs`, `shoal job submit`), checked with a clear error
//! for each mistake, and turned into the spec the record keeps.

use super::*;
use crate::ids::NodeId;
use crate::meta::job::{JobKind, JobSpec, Requirements};
use crate::meta::records::{json_depth, API_VALUE_DEPTH_MAX};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest script source taken (a record holds at most 1 MiB of it).
pub const SCRIPT_MAX_BYTES: usize = 512 * 1024;
/// Most input paths and pinned nodes of one job.
pub const INPUTS_MAX: usize = 10_000;
pub const NODES_MAX: usize = 256;

/// A submit as the API takes it (camelCase JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct JobSubmit {
    pub name: String,
    pub script: String,
    pub script_name: String,
    pub args: Value,
    /// `cluster:/` paths (the prefix may be left out).
    pub inputs: Vec<String>,
    /// A glob over `cluster:/` (`*`, `**`, `?`): makes the job a map/reduce.
    pub dataset: String,
    pub partition_max: Option<u32>,
    pub nodes: Vec<NodeId>,
    pub requirements: Requirements,
    pub priority: i32,
    pub timeout_sec: Option<u64>,
    pub max_attempts: Option<u32>,
}

/// Why a submit is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the job has no script")]
    NoScript,
    #[error("the script is {0} bytes; at most {SCRIPT_MAX_BYTES}")]
    ScriptTooLarge(usize),
    #[error("the name is over 256 bytes or has control characters")]
    BadName,
    #[error("args nest deeper than {API_VALUE_DEPTH_MAX} levels")]
    ArgsTooDeep,
    #[error("bad input path {0:?}: {1}")]
    BadInput(String, String),
    #[error("bad dataset glob {0:?}: {1}")]
    BadDataset(String, String),
    #[error("too many {0} (at most {1})")]
    TooMany(&'static str, usize),
    #[error("partitionMax must be 1..=10000")]
    BadPartitionMax,
    #[error("timeoutSec must be 1..={TIMEOUT_SEC_MAX}")]
    BadTimeout,
    #[error("maxAttempts must be 1..={MAX_ATTEMPTS_MAX}")]
    BadMaxAttempts,
    #[error("priority must be -1000..=1000")]
    BadPriority,
    #[error("bad requirement: {0}")]
    BadRequirement(&'static str),
}

/// A `cluster:/` path in its canonical form (without the prefix).
pub fn cluster_path(p: &str) -> Result<String, String> {
    let bare = p.strip_prefix("cluster:").unwrap_or(p);
    crate::meta::path::normalize(bare).map_err(|e| e.to_string())
}

/// Check a submit and make the spec of a new job owned by `owner`, created at `created` (wall ms).
pub fn spec_of(s: JobSubmit, owner: &str, created: u64) -> Result<JobSpec, SubmitError> {
    if s.script.trim().is_empty() {
        return Err(SubmitError::NoScript);
    }
    if s.script.len() > SCRIPT_MAX_BYTES {
        return Err(SubmitError::ScriptTooLarge(s.script.len()));
    }
    let label_ok = |x: &str| x.len() <= 256 && !x.chars().any(char::is_control);
    if !label_ok(&s.name) || !label_ok(&s.script_name) {
        return Err(SubmitError::BadName);
    }
    if json_depth(&s.args) > API_VALUE_DEPTH_MAX {
        return Err(SubmitError::ArgsTooDeep);
    }
    if s.inputs.len() > INPUTS_MAX {
        return Err(SubmitError::TooMany("inputs", INPUTS_MAX));
    }
    if s.nodes.len() > NODES_MAX {
        return Err(SubmitError::TooMany("nodes", NODES_MAX));
    }
    let inputs = s
        .inputs
        .iter()
        .map(|p| cluster_path(p).map_err(|e| SubmitError::BadInput(p.clone(), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let dataset = if s.dataset.is_empty() {
        String::new()
    } else {
        let bare = s.dataset.strip_prefix("cluster:").unwrap_or(&s.dataset).to_string();
        crate::meta::namespace::Pattern::parse(&bare)
            .map_err(|e| SubmitError::BadDataset(s.dataset.clone(), e.to_string()))?;
        bare
    };
    let partition_max = s.partition_max.unwrap_or(PARTITION_MAX_DEFAULT);
    if !(1..=10_000).contains(&partition_max) {
        return Err(SubmitError::BadPartitionMax);
    }
    let timeout_sec = s.timeout_sec.unwrap_or(TIMEOUT_SEC_DEFAULT);
    if !(1..=TIMEOUT_SEC_MAX).contains(&timeout_sec) {
        return Err(SubmitError::BadTimeout);
    }
    let max_attempts = s.max_attempts.unwrap_or(MAX_ATTEMPTS_DEFAULT);
    if !(1..=MAX_ATTEMPTS_MAX).contains(&max_attempts) {
        return Err(SubmitError::BadMaxAttempts);
    }
    if !(-1000..=1000).contains(&s.priority) {
        return Err(SubmitError::BadPriority);
    }
    let r = &s.requirements;
    if r.features.len() > 64 || r.features.iter().any(|f| f.is_empty() || !label_ok(f)) {
        return Err(SubmitError::BadRequirement("features: at most 64 non-empty names"));
    }
    if !label_ok(&r.os) || !label_ok(&r.arch) {
        return Err(SubmitError::BadRequirement("os and arch are short names"));
    }
    let kind = if dataset.is_empty() { JobKind::Run } else { JobKind::Mapreduce };
    let mut nodes = s.nodes;
    nodes.sort();
    nodes.dedup();
    Ok(JobSpec {
        name: if s.name.is_empty() { s.script_name.clone() } else { s.name },
        owner: owner.to_string(),
        script: s.script,
        script_name: s.script_name,
        args: s.args,
        inputs,
        requirements: s.requirements,
        nodes,
        priority: s.priority,
        timeout_sec,
        max_attempts,
        kind,
        parent_id: None,
        dataset,
        partition_max,
        created,
    })
}
