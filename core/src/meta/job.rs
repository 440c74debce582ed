//! The fields of a job record (reference-facts.md "Jobs"): what to run (the spec, fixed at
//! submit), how it runs (the run state), and who may run it now (the lease). The record in
//! [`crate::meta::records::Job`] keeps each as its own register; the rules that write them are
//! in [`crate::jobs`].

use crate::ids::{JobId, NodeId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a job is: a script's `run(job)`, a map or reduce child, or a map/reduce parent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    #[default]
    Run,
    Map,
    Reduce,
    Mapreduce,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Run => "run",
            JobKind::Map => "map",
            JobKind::Reduce => "reduce",
            JobKind::Mapreduce => "mapreduce",
        }
    }
}

/// Where a job is in its life. `Succeeded`, `Failed` and `Cancelled` are final.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    #[default]
    Queued,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Scheduled => "scheduled",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }
}

/// What a node must have to run a job (its capability manifest).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Requirements {
    /// Tools or CPU flags the node must list (`ffmpeg`, `cpu.avx2`).
    pub features: Vec<String>,
    /// Bytes of RAM at least.
    pub min_ram: u64,
    pub min_cores: u32,
    /// `linux`, `macos`, ... (empty: any).
    pub os: String,
    /// `x86_64`, `aarch64`, ... (empty: any).
    pub arch: String,
}

/// What to run, fixed at submit (reference-facts.md "Jobs": spec).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobSpec {
    pub name: String,
    /// Who submitted it; the script acts as this account.
    pub owner: String,
    /// The script's source, captured at submit.
    pub script: String,
    pub script_name: String,
    pub args: Value,
    /// `cluster:/` paths (canonical, without the prefix) the job reads: its locality.
    pub inputs: Vec<String>,
    pub requirements: Requirements,
    /// When not empty, the only nodes that may run it.
    pub nodes: Vec<NodeId>,
    pub priority: i32,
    pub timeout_sec: u64,
    pub max_attempts: u32,
    pub kind: JobKind,
    pub parent_id: Option<JobId>,
    /// A map/reduce parent's glob over the namespace.
    pub dataset: String,
    pub partition_max: u32,
    /// Wall ms at submit.
    pub created: u64,
}

/// How a job runs (reference-facts.md "Jobs": state). Written by the leader (transitions,
/// what the running node reports) as one register.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobState {
    pub status: JobStatus,
    /// The node running it (or that ran it last).
    pub node: Option<NodeId>,
    /// Runs started (hand-overs a node accepted).
    pub attempts: u32,
    /// Hand-overs made: the last attempt number (never reused).
    pub handovers: u32,
    pub progress: f64,
    pub output: Value,
    /// The last log lines (at most [`JOB_LOG_LINES_MAX`]).
    pub log: Vec<String>,
    pub error: String,
    /// Wall ms the current run started and the job finished (0: not yet).
    pub started: u64,
    pub finished: u64,
    /// Why it waits, or why it ended as it did.
    pub reason: String,
    /// Nodes that refused the job for good ("no account", "cannot run jobs").
    pub blocked: Vec<NodeId>,
    /// A map/reduce parent: its children, maps first, the reduce last.
    pub children: Vec<JobId>,
}

/// Who may run the job now: set by the leader at a hand-over, cleared when the run ends. The
/// expiry is not here: each side times it on its own clock (DESIGN.md "Leader lease").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobLease {
    pub node: NodeId,
    /// The hand-over this lease belongs to (raised at each one): a report under another
    /// attempt is stale.
    pub attempt: u32,
    /// The leader's term when granted.
    pub term: u64,
}

/// Most log lines a job record keeps.
pub const JOB_LOG_LINES_MAX: usize = 200;
