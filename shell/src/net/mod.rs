//! HTTP out: the pooled client ([`client`]), routing a signed request to a node id
//! ([`transport`]), and the reverse tunnels it may go through ([`tunnel`]).

pub mod client;
pub mod tls;
pub mod transport;
pub mod tunnel;
