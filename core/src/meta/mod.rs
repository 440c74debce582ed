//! The replicated metadata store (spec: cluster-runtime.md "Metadata store (ACMS)";
//! reference-facts.md "Lease", "Log entry", "FileRecord"; DESIGN.md "Leader lease").
//!
//! - [`records`]: the record kinds (files, volumes, policies, jobs, settings) and their
//!   per-register merges on HLC versions;
//! - [`state`]: the record sets of one node, tombstones and their purge, an incremental digest;
//! - [`path`]: the canonical form of a path (imports nothing else of `meta`);
//! - [`namespace`]: listing, folder policies and globs over the file records.

pub mod job;
pub mod lease;
pub mod log;
pub mod machine;
pub mod namespace;
pub mod path;
pub mod records;
pub mod state;
