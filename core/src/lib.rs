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

pub mod acn;
pub mod config;
pub mod hlc;
pub mod ids;
pub mod latency;
pub mod membership;
pub mod meta;
pub mod node;
pub mod records;
pub mod rng;
pub mod storage;
pub mod time;
pub mod token;

pub use hlc::{Hlc, Version};
pub use ids::{ClusterId, FileId, JobId, LogIndex, NodeId, Term, TokenId, VolumeId};
pub use rng::SeededRng;
pub use time::Millis;
