//! Jobs and map/reduce, the rules (spec: cluster-runtime.md "Jobs (AJR / AJS)", "Map /
//! reduce"; reference-facts.md "Jobs", "Map/reduce", weaknesses 6 and 7). Pure functions and
//! small books; `node/jobs.rs` feeds them the records and the members and carries out what they
//! decide.
//!
//! - [`submit`]: what a submit may ask for, checked, into a [`JobSpec`](crate::meta::job::JobSpec);
//! - [`schedule`]: who may run a job (the hard rules), the queue's order, one scheduling pass;
//! - [`leases`]: the leader's clock on each run's lease (timed on its own clock from the last
//!   renewal it received) and the worker's (from the last renewal it sent that was answered);
//! - [`mapreduce`]: a dataset into map children where the bytes are, the reduce after them,
//!   a parent's end.

pub mod leases;
pub mod mapreduce;
pub mod schedule;
pub mod submit;

/// How often the leader schedules (`jobs.pass_every`).
pub const PASS_MS: u64 = 3_000;
/// A run's lease (`jobs.lease`); its node renews it every third of it.
pub const LEASE_MS: u64 = 30_000;
/// A job runs at most this long unless it says otherwise (reference: 3600 s).
pub const TIMEOUT_SEC_DEFAULT: u64 = 3_600;
pub const TIMEOUT_SEC_MAX: u64 = 7 * 24 * 3_600;
/// Runs started before a silent node's job fails (reference: 3).
pub const MAX_ATTEMPTS_DEFAULT: u32 = 3;
pub const MAX_ATTEMPTS_MAX: u32 = 20;
/// Finished jobs are kept this long, then removed on every node (`jobs.retention`).
pub const RETENTION_MS: u64 = 72 * 3_600 * 1_000;
/// Files per map child (reference: 50).
pub const PARTITION_MAX_DEFAULT: u32 = 50;
/// How much earlier than the leader a worker gives up a lease it could not renew: covers the
/// second a script takes to stop and a little clock drift.
pub const WORKER_LEASE_MARGIN_MS: u64 = 3_000;
/// How long a worker keeps offering a finished run's outcome to the leader.
pub const DONE_RETRY_MS: u64 = 2_000;
/// A map child's pairs larger than this are written to a `cluster:/` file the reduce reads
/// (the reference caps the reduce input at 8 MiB instead).
pub const SPILL_BYTES: usize = 256 * 1024;
/// The folder spilled pairs go to, one subfolder per map/reduce parent.
pub const SPILL_DIR: &str = "/.shoal/jobs";
/// Most hand-overs a node remembers having accepted (so a repeat is answered, not re-run).
pub const ACCEPTED_MAX: usize = 10_000;
