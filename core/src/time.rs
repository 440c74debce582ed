//! Time as the core sees it: a count of milliseconds since the Unix epoch on *this node's*
//! clock, handed in by the caller as `now`. Nothing here reads a clock.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Milliseconds since the Unix epoch, as read from the local node's wall clock by the shell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    pub const fn from_secs(s: u64) -> Millis {
        Millis(s.saturating_mul(1000))
    }

    pub const fn as_secs(self) -> u64 {
        self.0 / 1000
    }

    /// `self + ms`, saturating.
    pub const fn plus(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }

    /// How long ago `earlier` was, zero if it lies in the future.
    pub const fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

pub const SECOND_MS: u64 = 1000;
pub const MINUTE_MS: u64 = 60 * SECOND_MS;
pub const HOUR_MS: u64 = 60 * MINUTE_MS;
pub const DAY_MS: u64 = 24 * HOUR_MS;
