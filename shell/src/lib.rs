//! shoal-shell: drives the pure core over real I/O (DESIGN.md "The shell").
//!
//! - [`env`]: the `Net` + `Clock` + `Probe` environment the shell is generic over;
//! - [`daemon`]: one node: identity, redb store, HTTP listener, driver task;
//! - [`store`] / [`meta_store`]: membership tables, and the metadata tables written behind;
//! - [`listener`]: the accept loop, connection cap and timeouts of the one HTTP listener;
//! - [`server`]: the ACN endpoints and the admin API;
//! - [`client`] / [`transport`]: HTTP out, and routing a signed request to a node id;
//! - [`wire`]: header names and request-target encoding shared by the CLI and the node;
//! - [`sync`]: the one locking helper;
//! - [`disk`]: confined paths, positioned and direct I/O, a file's SHA-256;
//! - [`cli`] and [`demo`]: the `shoal` command line.

pub mod cli;
pub mod client;
pub mod daemon;
pub mod disk;
pub mod drive;
pub mod env;
pub mod http_error;
pub mod identity;
pub mod join;
pub mod listener;
pub mod meta_store;
pub mod node_handle;
pub mod peer;
pub mod probe;
pub mod replication;
pub mod server;
pub mod service_state;
pub mod store;
pub mod store_service;
pub mod sync;
pub mod transport;
pub mod volumes;
pub mod wire;
