//! Storage decisions (spec: cluster-runtime.md "Storage (ACS) and the cluster:/ drive",
//! "Replication"; reference-facts.md "Placement", "Planner"). Pure: the shell moves the bytes.
//!
//! - [`chores`]: when each background chore of a node is due (planner, disk work, scrub, rescan,
//!   measuring);
//! - [`landed`]: bytes put in place that the records may not account for yet;
//! - [`placement`]: which volume takes a new copy, and the low-space guard;
//! - [`planner`]: the replication planner run by the metadata leader;
//! - [`put_policy`]: how a put streams or spools and when a lagging copy is left out;
//! - [`sync_pacing`]: when a volume's fsyncs may share one flush;
//! - [`tasks`]: the leader's replication tasks in flight and their leases;
//! - [`transfer`]: the chunked transfer's rules and part-file names.

pub mod chores;
pub mod landed;
pub mod placement;
pub mod planner;
pub mod put_policy;
pub mod sync_pacing;
pub mod tasks;
pub mod transfer;
