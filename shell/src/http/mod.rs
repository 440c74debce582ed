//! HTTP in: the accept loop with its connection cap and timeouts ([`listener`]), and the router
//! of the ACN endpoints and the admin API ([`server`]).

pub mod listener;
pub mod server;
