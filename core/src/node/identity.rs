//! The node's side of identity (issue 15 "Accounts and sessions"): its [`Identity`] table, the
//! session limits and password-hash parameters from the config plane (`identity.*`), and every
//! change persisted ([`PersistOp::Identity`]). The shell hashes passwords and draws secrets;
//! what is allowed is decided here and in `crate::identity`.

use super::{Node, PersistOp};
use crate::answer::ApiError;
use crate::identity::{Identity, Principal, SessionLimits};
use crate::time::Millis;
use serde::Serialize;

/// argon2id's cost parameters (config keys `identity.argon2_*`; defaults: OWASP's 19 MiB, 2
/// passes, 1 lane).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PasswordParams {
    pub memory_kib: u32,
    pub time: u32,
    pub lanes: u32,
}

impl Default for PasswordParams {
    fn default() -> Self {
        PasswordParams { memory_kib: 19_456, time: 2, lanes: 1 }
    }
}

impl Node {
    fn identity_value(&self, key: &str) -> Option<u64> {
        self.config_applied.as_ref()?.get("identity")?.get(key)?.value.as_ref()?.as_u64()
    }

    /// How long sessions live.
    pub fn session_limits(&self) -> SessionLimits {
        let d = SessionLimits::default();
        SessionLimits {
            idle_ms: self.identity_value("session_idle").unwrap_or(d.idle_ms),
            max_ms: self.identity_value("session_max").unwrap_or(d.max_ms),
        }
    }

    /// The argon2id parameters new password hashes use (a hash keeps its own, so changing
    /// them never locks anyone out).
    pub fn password_params(&self) -> PasswordParams {
        let d = PasswordParams::default();
        let get = |k: &str, d: u32| self.identity_value(k).and_then(|v| u32::try_from(v).ok()).unwrap_or(d);
        PasswordParams {
            memory_kib: get("argon2_memory_kib", d.memory_kib),
            time: get("argon2_time", d.time),
            lanes: get("argon2_lanes", d.lanes),
        }
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Change the identity table; whatever it changed is persisted.
    pub fn identity_mut<T>(&mut self, f: impl FnOnce(&mut Identity, SessionLimits) -> T) -> T {
        let limits = self.session_limits();
        let out = f(&mut self.identity, limits);
        for op in self.identity.take_ops() {
            self.persist(PersistOp::Identity(op));
        }
        out
    }

    /// Who holds the credential whose secret's SHA-256 is `digest` (hex), at wall time `wall`;
    /// `true` when its use should be written down ([`Node::identity_touch`]).
    pub fn authenticate(&self, wall: Millis, digest: &str) -> Result<(Principal, bool), ApiError> {
        self.identity.authenticate(wall, digest, self.session_limits())
    }

    /// Write down a credential's use (at most once a minute per credential), sweeping expired ones.
    pub fn identity_touch(&mut self, wall: Millis, digest: &str) {
        self.identity_mut(|i, limits| i.touch(wall, digest, limits));
    }
}
