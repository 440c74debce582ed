//! What a node keeps on disk besides file copies: the one redb database and its reopening after
//! an I/O error ([`db`]), the redb store of membership ([`store`]), the
//! metadata tables written behind ([`meta_store`]), and the data dir's identity files
//! ([`identity`]).

pub mod db;
pub mod identity;
pub mod meta_store;
pub mod store;
