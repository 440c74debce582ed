//! The byte-moving work of a node, each piece asked for by the core or by a request and
//! reported back to it: the `cluster:/` drive ([`drive`]), the receiving half of the chunked
//! transfer ([`store_service`]), replication ([`replication`]), joining ([`join`]) and signed
//! requests to peers ([`peer`]), and the two ends of a reverse tunnel ([`tunnel`]).

pub mod drive;
pub mod jobs;
pub mod join;
pub mod passwords;
pub mod peer;
pub mod replication;
pub mod store_service;
pub mod tunnel;
