//! shoal-shell: drives the pure core over real I/O (DESIGN.md "The shell"). The folders follow
//! the direction of use, top to bottom (no module imports one above it; `.ci/import-cycles.py`):
//!
//! - [`cli`]: the `shoal` command line (args, the verbs over HTTP, output, `put`/`get`, the demo);
//! - [`daemon`]: starting a node and the one driver task that owns its timer;
//! - [`http`]: the listener (connection cap, timeouts) and the router (ACN endpoints, admin API);
//! - [`services`]: the byte-moving work the core asks for: the drive's put and get, the chunked
//!   transfer's receiving side, replication (tasks, pulls, disk work, scrub, rescans), joining,
//!   signed requests to peers;
//! - [`node`]: the handle every part shares (the core `Node`, stores, client; outputs carried
//!   out) and each service's state;
//! - [`net`]: HTTP out, and routing a signed request to a node id;
//! - [`persist`]: redb persistence (membership tables, the metadata tables written behind) and
//!   the data dir's identity files;
//! - [`disk`]: confined paths, positioned and direct I/O, a file's SHA-256; facts about a folder
//!   for `volume add`;
//! - [`wire`]: header names, request-target encoding and JSON error answers, shared by the CLI
//!   and the node;
//! - [`metrics`]: the counters behind `/metrics` and its text (prometheus-client);
//! - [`env`], [`probe`], [`sync`]: the environment the shell is generic over (`Net` + `Clock` +
//!   `Probe`), host capabilities and health, the one locking helper.

pub mod cli;
pub mod daemon;
pub mod disk;
pub mod env;
pub mod http;
pub mod metrics;
pub mod net;
pub mod node;
pub mod persist;
pub mod probe;
pub mod services;
pub mod sync;
pub mod wire;
