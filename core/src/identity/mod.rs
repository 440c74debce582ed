//! Identity and access (issue 15; spec: cluster-runtime.md "Identity (AID)", reference-facts.md
//! "Identity", weakness 10): the rules, pure, so the simulator and unit tests drive them.
//!
//! Built so far: account names ([`valid_username`]), who may reach which `/v1` route
//! ([`need_of`], [`Role`]), the backoff of failed logins ([`LoginGuard`]) and one node's
//! accounts, groups, sessions and API keys ([`Identity`], `accounts.rs`). Not yet: the identity
//! origin and its directory, user assertions, per-folder access (issue 15's note).

pub mod access;
mod accounts;
pub mod assertion;
mod directory;
mod guard;

pub use accounts::*;
pub use directory::*;
pub use guard::{LoginGuard, Refused, FAILURES_FREE, SOURCES_MAX};

use serde::{Deserialize, Serialize};

/// Longest account name, in bytes (the reference: 1..128 characters).
pub const USERNAME_MAX: usize = 128;

/// An account name: 1 to 128 bytes, no `/`, `\` or NUL (the reference's rule), and, beyond it,
/// no other control character, no space at either end (names are shown and typed), and no `@`
/// first (`@admin-token` names the admin token as an owner).
pub fn valid_username(name: &str) -> bool {
    !name.starts_with('@')
        && !name.is_empty()
        && name.len() <= USERNAME_MAX
        && !name.chars().any(|c| c == '/' || c == '\\' || c.is_control())
        && name.trim() == name
}

/// What an account may do: admins everything, users the drive, jobs and their own session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Admin,
}

/// What a `/v1` route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Any signed-in account.
    User,
    /// An admin: cluster, node, volume, token, config, module, policy and audit endpoints
    /// (issue 15 "Access"), and any route this table does not know.
    Admin,
}

/// Folders of `/v1` a user may reach; everything else is an admin's.
const USER_PREFIXES: &[&str] = &[
    "/v1/files",
    "/v1/mv",
    "/v1/mkdir",
    "/v1/verify",
    "/v1/meta/ls",
    "/v1/meta/stat",
    "/v1/jobs",
    "/v1/events",
    "/v1/login",
    "/v1/logout",
    "/v1/sessions",
    "/v1/apikeys",
    "/v1/me",
];

/// What the route at `path` needs (the method does not change it today; reads of admin areas
/// are an admin's too). Unknown paths are an admin's: a new route is closed until declared.
pub fn need_of(_method: &str, path: &str) -> Need {
    let p = path.split('?').next().unwrap_or("");
    let user =
        USER_PREFIXES.iter().any(|pre| p == *pre || p.strip_prefix(pre).is_some_and(|rest| rest.starts_with('/')));
    if user {
        Need::User
    } else {
        Need::Admin
    }
}

/// Whether `role` may reach a route that needs `need`.
pub fn allowed(role: Role, need: Need) -> bool {
    match need {
        Need::User => true,
        Need::Admin => role == Role::Admin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_follow_the_reference_and_refuse_what_cannot_be_shown() {
        for ok in ["a", "anna", "Anna Maria", "ünï", &"x".repeat(128), "a.b-c_d@e"] {
            assert!(valid_username(ok), "{ok:?}");
        }
        for bad in ["", "a/b", "a\\b", "a\0b", "a\nb", " anna", "anna ", &"x".repeat(129), "@admin-token"] {
            assert!(!valid_username(bad), "{bad:?}");
        }
    }

    #[test]
    fn users_reach_the_drive_and_jobs_and_nothing_admin() {
        for p in ["/v1/files/a/b", "/v1/files", "/v1/jobs", "/v1/jobs/j1/logs", "/v1/meta/ls?path=/x", "/v1/events"] {
            assert_eq!(need_of("GET", p), Need::User, "{p}");
        }
        for p in [
            "/v1/cluster/leave",
            "/v1/nodes",
            "/v1/nodes/x/state",
            "/v1/volumes",
            "/v1/tokens",
            "/v1/config",
            "/v1/modules",
            "/v1/policies",
            "/v1/audit",
            "/v1/filesystem",
            "/v1/jobsx",
            "/v1/something-new",
        ] {
            assert_eq!(need_of("GET", p), Need::Admin, "{p}");
        }
        assert!(
            allowed(Role::Admin, Need::Admin) && allowed(Role::Admin, Need::User) && allowed(Role::User, Need::User)
        );
        assert!(!allowed(Role::User, Need::Admin));
    }
}
