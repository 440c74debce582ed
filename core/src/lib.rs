//! shoal-core: the pure, deterministic state machines of a shoal node.
//!
//! Nothing in this crate reads a clock, touches the network or disk, or draws OS randomness:
//! time enters as [`Millis`] (`now`), randomness comes from a [`SeededRng`] built from a seed,
//! and every container whose order can reach an output is ordered (`BTreeMap`). The shell
//! (`shoal-shell`) drives these machines over real I/O, the simulator (`shoal-sim`) over a
//! simulated network, and both run the very same code.
//!
//! Each state machine has the face DESIGN.md draws (after quinn-proto and raft-rs):
//! `handle(now, input)`, `handle_timeout(now)`, `poll_output()` and `poll_timeout()`.
//!
//! # The entry points of a [`node::Node`]
//!
//! - **The driver's face**: `handle(wall, Input)` (a peer's answer as a
//!   [`answer::PeerAnswer`], health, capabilities), `handle_timeout(wall)`, `poll_timeout()`
//!   (the one deadline the shell arms) and `poll_output()` ([`node::Output`]: requests to send,
//!   records to persist, chores and disk work to carry out, events).
//! - **Peers' requests**: `handle_acn(wall, method, target, signed headers, body)` checks the
//!   signature and answers a [`answer::Reply`]; endpoints that move bytes are handed to the
//!   shell after the same check.
//! - **Commands** (the admin API and the CLI): one method each (`create_cluster`, `new_token`,
//!   `file_publish`, `file_move`, `volume_add`, `config_set`, ...), taking typed arguments and
//!   answering a typed result or an [`answer::ApiError`]. The result types derive `Serialize`:
//!   their JSON is the API's answer, and the shell maps an error's kind to its HTTP status.
//! - **Reports of work done**: `chore_done`, `scrub_result`, `rescan_outcome`, `work_begin` /
//!   `work_end`, `volume_usage`: the shell says what its I/O found, the core decides what it means.

pub mod acn;
pub mod answer;
pub mod config;
pub mod events;
pub mod hlc;
pub mod identity;
pub mod ids;
pub mod jobs;
pub mod latency;
pub mod membership;
pub mod meta;
pub mod node;
pub mod records;
pub mod rng;
pub mod sched;
pub mod storage;
pub mod time;
pub mod token;
pub mod tunnel;
pub mod wake;

pub use hlc::{Hlc, Version};
pub use ids::{ClusterId, FileId, JobId, LogIndex, NodeId, Term, TokenId, VolumeId};
pub use rng::SeededRng;
pub use time::Millis;
