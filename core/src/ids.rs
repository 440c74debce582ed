//! Typed identifiers (spec: cluster-runtime.md "Identifiers"). Names are labels; these ids are
//! what records, paths and the UI point at. Newtypes, so a node id is never taken for a cluster id.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn new(s: impl Into<String>) -> Self {
                $name(s.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A node: a UUID made on the node's first start and kept in `DATA/node.id`.
    NodeId
);
string_id!(
    /// A cluster: a UUID made by `cluster create`, carried in join tokens.
    ClusterId
);
string_id!(
    /// A join token: 8 random bytes as hex.
    TokenId
);

string_id!(
    /// A file: a UUID made at the first write of its path; it survives renames.
    FileId
);
string_id!(
    /// A volume: a UUID made when a folder is contributed.
    VolumeId
);
string_id!(
    /// A job: a UUID made at submit.
    JobId
);

/// A leader term: raised by every claim of the metadata lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Term(pub u64);

/// A position in the replicated metadata log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LogIndex(pub u64);

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// True for the canonical 8-4-4-4-12 lowercase or uppercase hex form of a UUID.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// True when `s` is exactly `n` bytes written as lowercase or uppercase hex.
pub fn is_hex_of_len(s: &str, n_bytes: usize) -> bool {
    s.len() == n_bytes * 2 && s.bytes().all(|c| c.is_ascii_hexdigit())
}
