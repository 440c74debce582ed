//! HTTP out: the pooled client ([`client`]) and routing a signed request to a node id
//! ([`transport`]).

pub mod client;
pub mod transport;
