//! The node as the shell holds it: [`handle`] (`Shared`: the core `Node` behind its lock, the
//! stores, the client; calls into the node and carrying out its outputs; waiting on it) and
//! [`state`] (the state each service keeps there).

pub mod handle;
pub mod state;
