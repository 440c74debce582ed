//! One node's accounts, groups, sessions and API keys (issue 15 "Accounts and sessions"): who
//! exists, with which role and groups, which credentials are live, and every refusal. Pure: the
//! shell hashes and checks passwords (argon2id) and draws the secrets; this table only ever
//! sees a password's PHC hash and a secret's SHA-256 digest, so the data dir holds nothing a
//! thief could sign in with.
//!
//! Changes are queued as [`IdentityOp`]s for the node to persist (drained by
//! [`Identity::take_ops`]). Iteration order is the maps' (sorted), so lists are stable.

use super::guard::LoginGuard;
use super::{valid_username, Role};
use crate::answer::ApiError;
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Shortest password taken (bytes).
pub const PASSWORD_MIN: usize = 8;
/// Longest password taken (bytes): argon2 hashes any length, a request body should not.
pub const PASSWORD_MAX: usize = 1024;
/// Longest API key lifetime, and the lifetime of one asked without `expires`.
pub const KEY_LIFETIME_MAX_MS: u64 = 365 * 24 * 3_600_000;
pub const KEY_LIFETIME_DEFAULT_MS: u64 = 30 * 24 * 3_600_000;
/// A credential's last use is written down at most this often (its idle clock's resolution).
pub const TOUCH_EVERY_MS: u64 = 60_000;
/// Most live credentials one account may hold (sessions and keys); the oldest session goes first.
pub const CREDENTIALS_PER_ACCOUNT_MAX: usize = 256;

/// A local account. `hash` is the PHC string of its argon2id hash and never leaves the node
/// through the API ([`AccountView`] is what is shown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub name: String,
    pub role: Role,
    pub groups: BTreeSet<String>,
    pub hash: String,
    pub created: Millis,
    pub password_changed: Millis,
    /// Mirrored from the identity origin's directory (`directory.rs`): a sync may change or
    /// drop it. A local-only account (`false`) is never touched by a sync.
    #[serde(default)]
    pub mirrored: bool,
    /// A password set here for a mirrored account that the origin has not taken yet: sent
    /// again until it does, and kept over the directory's until then.
    #[serde(default)]
    pub writeback: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountView {
    pub name: String,
    pub role: Role,
    pub groups: Vec<String>,
    pub created: Millis,
    pub password_changed: Millis,
    pub mirrored: bool,
}

impl From<&Account> for AccountView {
    fn from(a: &Account) -> AccountView {
        AccountView {
            name: a.name.clone(),
            role: a.role,
            groups: a.groups.iter().cloned().collect(),
            created: a.created,
            password_changed: a.password_changed,
            mirrored: a.mirrored,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    pub name: String,
    pub created: Millis,
}

/// What a credential is: a login's session, or an API key with its own name, role and expiry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Grant {
    Session,
    Key { name: String, role: Role, expires: Millis },
}

/// A live credential, known by the SHA-256 of its secret (`digest`, hex). `user` is `None` for
/// a key made with the node's admin token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    pub digest: String,
    pub user: Option<String>,
    pub grant: Grant,
    pub created: Millis,
    pub last_used: Millis,
    pub source: String,
}

impl Credential {
    /// The id shown and used to revoke: the digest's first 16 hex digits (nothing secret).
    pub fn id(&self) -> &str {
        &self.digest[..16.min(self.digest.len())]
    }
}

/// A credential as listed: never its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialView {
    pub id: String,
    pub user: Option<String>,
    pub kind: &'static str,
    pub name: Option<String>,
    pub role: Role,
    pub created: Millis,
    pub last_used: Millis,
    pub expires: Millis,
    pub source: String,
}

/// How long sessions live (config keys `identity.session_idle` and `identity.session_max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    pub idle_ms: u64,
    pub max_ms: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { idle_ms: 12 * 3_600_000, max_ms: 7 * 24 * 3_600_000 }
    }
}

/// The admin token's name as an owner and in the audit log.
pub const ROOT_NAME: &str = "@admin-token";

/// Who is asking: an account through a session or key, or the node's admin token (`user: None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Principal {
    pub user: Option<String>,
    pub role: Role,
    /// The credential's id (`None` for the admin token).
    pub credential: Option<String>,
}

impl Principal {
    pub fn root() -> Principal {
        Principal { user: None, role: Role::Admin, credential: None }
    }

    /// The name the audit log and a job's owner record: the account, or for the admin token
    /// `@admin-token` (and `@admin-token-key` for a lesser key it made); `@` starts no
    /// account's name, so none can pass for them.
    pub fn name(&self) -> &str {
        match (&self.user, self.role) {
            (Some(u), _) => u,
            (None, Role::Admin) => ROOT_NAME,
            (None, Role::User) => "@admin-token-key",
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// A change for the node's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityOp {
    PutAccount(Account),
    DeleteAccount(String),
    PutGroup(Group),
    DeleteGroup(String),
    PutCredential(Credential),
    DeleteCredential(String),
}

/// What the node's store gives back at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentityRestored {
    pub accounts: Vec<Account>,
    pub groups: Vec<Group>,
    pub credentials: Vec<Credential>,
}

/// A login that may go on to its password check: the hash to check against (a fixed dummy for
/// an unknown account, so the time taken does not say which names exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginTicket {
    pub hash: Option<String>,
}

/// A login refused before or after its password check; `retry_after_ms` for a backoff (429).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRefused {
    pub error: ApiError,
    pub retry_after_ms: Option<u64>,
}

/// A fresh session or key: the secret is shown once, by the shell, beside this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Issued {
    #[serde(flatten)]
    pub credential: CredentialView,
}

/// An account the sync left out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    pub username: String,
    pub reason: String,
}

/// What the directory sync and forward auth did last (the reference's status fields).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    pub managed_accounts: usize,
    pub local_accounts: usize,
    pub skipped: Vec<Skipped>,
    /// Local-only accounts that share a name with one of the directory's.
    pub conflicts: Vec<String>,
    pub last_sync: Option<Millis>,
    pub last_sync_error: Option<String>,
    pub last_forward: Option<Millis>,
    pub last_forward_error: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Identity {
    pub(super) accounts: BTreeMap<String, Account>,
    pub(super) groups: BTreeMap<String, Group>,
    /// By digest.
    credentials: BTreeMap<String, Credential>,
    pub(super) guard: LoginGuard,
    pub(super) ops: Vec<IdentityOp>,
    /// What the last directory sync did (`directory.rs`).
    pub(super) sync: SyncStatus,
}

pub(super) fn check_password_shape(hash: &str) -> Result<(), ApiError> {
    let bad =
        |why: &str| Err(ApiError::invalid("bad_hash", format!("a password is kept only as an argon2id hash: {why}")));
    // `$argon2id$v=19$m=M,t=T,p=P$salt$hash`
    let parts: Vec<&str> = hash.split('$').collect();
    if hash.len() > HASH_MAX || parts.len() != 6 || !parts[0].is_empty() || parts[1] != "argon2id" {
        return bad("not a PHC argon2id string");
    }
    // The costs within the bounds of the config keys that set them (`identity.argon2_*`), so a
    // hash mirrored from another node cannot make this one spend more on a login than its own
    // settings ever could.
    let mut costs = [None; 3];
    for kv in parts[3].split(',') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let slot = match k {
            "m" => 0,
            "t" => 1,
            "p" => 2,
            _ => return bad("unknown parameter"),
        };
        costs[slot] = v.parse::<u64>().ok();
    }
    match costs {
        [Some(m), Some(t), Some(p)]
            if (ARGON2_MEMORY_KIB.0..=ARGON2_MEMORY_KIB.1).contains(&m)
                && (ARGON2_TIME.0..=ARGON2_TIME.1).contains(&t)
                && (ARGON2_LANES.0..=ARGON2_LANES.1).contains(&p) =>
        {
            Ok(())
        }
        _ => bad("its costs are missing or out of bounds"),
    }
}

/// The longest PHC string kept.
const HASH_MAX: usize = 256;
/// The bounds of the argon2id costs, as the config keys `identity.argon2_*` declare them.
pub const ARGON2_MEMORY_KIB: (u64, u64) = (8, 4_194_304);
pub const ARGON2_TIME: (u64, u64) = (1, 100);
pub const ARGON2_LANES: (u64, u64) = (1, 16);

fn check_digest(digest: &str) -> Result<(), ApiError> {
    if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ApiError::invalid("bad_digest", "a credential is kept as the SHA-256 of its secret"))
    }
}

/// Whether `password` may be set (length only: any character is allowed).
pub fn password_error(password: &str) -> Option<ApiError> {
    if password.len() < PASSWORD_MIN {
        Some(ApiError::invalid("weak_password", format!("a password has at least {PASSWORD_MIN} bytes")))
    } else if password.len() > PASSWORD_MAX {
        Some(ApiError::invalid("long_password", format!("a password has at most {PASSWORD_MAX} bytes")))
    } else {
        None
    }
}

pub(super) fn wrong_login() -> ApiError {
    ApiError::new(crate::answer::ErrorKind::Unauthorized, "bad_login", "wrong username or password")
}

impl Identity {
    pub fn restore(r: IdentityRestored) -> Identity {
        Identity {
            accounts: r.accounts.into_iter().map(|a| (a.name.clone(), a)).collect(),
            groups: r.groups.into_iter().map(|g| (g.name.clone(), g)).collect(),
            credentials: r.credentials.into_iter().map(|c| (c.digest.clone(), c)).collect(),
            guard: LoginGuard::default(),
            ops: Vec::new(),
            sync: Default::default(),
        }
    }

    /// The changes made since the last call, in order, for the store.
    pub fn take_ops(&mut self) -> Vec<IdentityOp> {
        std::mem::take(&mut self.ops)
    }

    pub fn accounts(&self) -> Vec<AccountView> {
        self.accounts.values().map(AccountView::from).collect()
    }

    pub fn account(&self, name: &str) -> Option<&Account> {
        self.accounts.get(name)
    }

    pub fn groups(&self) -> Vec<Group> {
        self.groups.values().cloned().collect()
    }

    fn check_groups(&self, groups: &BTreeSet<String>) -> Result<(), ApiError> {
        match groups.iter().find(|g| !self.groups.contains_key(*g)) {
            Some(g) => {
                Err(ApiError::invalid("no_such_group", format!("no group {g:?}: add it first (`shoal group add`)")))
            }
            None => Ok(()),
        }
    }

    pub fn add_account(
        &mut self,
        now: Millis,
        name: &str,
        role: Role,
        groups: BTreeSet<String>,
        hash: String,
    ) -> Result<AccountView, ApiError> {
        if !valid_username(name) {
            return Err(ApiError::invalid(
                "bad_username",
                "a username has 1 to 128 bytes, no / \\ or control character, no space at either end",
            ));
        }
        if self.accounts.contains_key(name) {
            return Err(ApiError::conflict("user_exists", format!("user {name:?} exists")));
        }
        self.check_groups(&groups)?;
        check_password_shape(&hash)?;
        let a = Account {
            name: name.to_string(),
            role,
            groups,
            hash,
            created: now,
            password_changed: now,
            mirrored: false,
            writeback: false,
        };
        let view = AccountView::from(&a);
        self.ops.push(IdentityOp::PutAccount(a.clone()));
        self.accounts.insert(name.to_string(), a);
        Ok(view)
    }

    /// Remove an account with every session and key it holds.
    pub fn remove_account(&mut self, name: &str) -> Result<AccountView, ApiError> {
        let a = self.accounts.remove(name).ok_or_else(|| no_user(name))?;
        self.ops.push(IdentityOp::DeleteAccount(name.to_string()));
        self.revoke_where(|c| c.user.as_deref() == Some(name));
        Ok(AccountView::from(&a))
    }

    /// A new password: every session of the account ends except `keep` (the one that asked);
    /// its API keys stay (they are not a password's).
    pub fn set_password(
        &mut self,
        now: Millis,
        name: &str,
        hash: String,
        keep: Option<&str>,
    ) -> Result<AccountView, ApiError> {
        check_password_shape(&hash)?;
        let a = self.accounts.get_mut(name).ok_or_else(|| no_user(name))?;
        a.hash = hash;
        a.password_changed = now;
        let a = a.clone();
        self.ops.push(IdentityOp::PutAccount(a.clone()));
        self.revoke_where(|c| c.user.as_deref() == Some(name) && c.grant == Grant::Session && Some(c.id()) != keep);
        Ok(AccountView::from(&a))
    }

    /// Change an account's role or groups (`None` leaves it). A demotion holds at once: a
    /// session's role is read from its account on every request.
    pub fn set_account(
        &mut self,
        name: &str,
        role: Option<Role>,
        groups: Option<BTreeSet<String>>,
    ) -> Result<AccountView, ApiError> {
        if let Some(g) = &groups {
            self.check_groups(g)?;
        }
        let a = self.accounts.get_mut(name).ok_or_else(|| no_user(name))?;
        if let Some(r) = role {
            a.role = r;
        }
        if let Some(g) = groups {
            a.groups = g;
        }
        let a = a.clone();
        self.ops.push(IdentityOp::PutAccount(a.clone()));
        Ok(AccountView::from(&a))
    }

    pub fn add_group(&mut self, now: Millis, name: &str) -> Result<Group, ApiError> {
        if !valid_username(name) {
            return Err(ApiError::invalid("bad_group", "a group name follows the username rules"));
        }
        if self.groups.contains_key(name) {
            return Err(ApiError::conflict("group_exists", format!("group {name:?} exists")));
        }
        let g = Group { name: name.to_string(), created: now };
        self.ops.push(IdentityOp::PutGroup(g.clone()));
        self.groups.insert(name.to_string(), g.clone());
        Ok(g)
    }

    /// Remove a group, and take it off every account that had it.
    pub fn remove_group(&mut self, name: &str) -> Result<Group, ApiError> {
        let g = self
            .groups
            .remove(name)
            .ok_or_else(|| ApiError::not_found("no_such_group", format!("no group {name:?}")))?;
        self.ops.push(IdentityOp::DeleteGroup(name.to_string()));
        for a in self.accounts.values_mut() {
            if a.groups.remove(name) {
                self.ops.push(IdentityOp::PutAccount(a.clone()));
            }
        }
        Ok(g)
    }

    /// Before a password is checked: is a try allowed now for `name` from `source`? If so it
    /// counts until [`Identity::login_end`] (or [`Identity::vouch`], [`Identity::check_end`])
    /// settles it. A name no account could have is refused before anything is counted.
    pub fn login_begin(&mut self, now: Millis, name: &str, source: &str) -> Result<LoginTicket, LoginRefused> {
        if !valid_username(name) {
            return Err(LoginRefused { error: wrong_login(), retry_after_ms: None });
        }
        if let Err(r) = self.guard.begin(now, name, source) {
            return Err(LoginRefused {
                error: ApiError::new(
                    crate::answer::ErrorKind::TooMany,
                    "login_backoff",
                    format!("too many failed logins: try again in {} s", r.retry_after_ms.div_ceil(1000)),
                ),
                retry_after_ms: Some(r.retry_after_ms),
            });
        }
        Ok(LoginTicket { hash: self.accounts.get(name).map(|a| a.hash.clone()) })
    }

    /// After the shell checked the password (`ok`): a session under `digest`, or the failure
    /// counted. A password that matched an account removed meanwhile is a failure too.
    pub fn login_end(
        &mut self,
        now: Millis,
        name: &str,
        source: &str,
        ok: bool,
        digest: &str,
        limits: SessionLimits,
    ) -> Result<Issued, LoginRefused> {
        let refused = |error| LoginRefused { error, retry_after_ms: None };
        let ok = ok && self.accounts.contains_key(name) && check_digest(digest).is_ok();
        self.guard.end(now, name, source, ok);
        if !ok {
            return Err(refused(wrong_login()));
        }
        let c = Credential {
            digest: digest.to_string(),
            user: Some(name.to_string()),
            grant: Grant::Session,
            created: now,
            last_used: now,
            source: source.to_string(),
        };
        Ok(Issued { credential: self.insert_credential(c, limits) })
    }

    /// Settle a password check begun with [`Identity::login_begin`] that makes no session (a
    /// user confirming their old password).
    pub fn check_end(&mut self, now: Millis, name: &str, source: &str, ok: bool) {
        self.guard.end(now, name, source, ok);
    }

    /// A new API key under `digest`, owned by whoever asks, with a role no higher than theirs.
    pub fn new_key(
        &mut self,
        now: Millis,
        by: &Principal,
        name: &str,
        role: Role,
        lifetime_ms: Option<u64>,
        digest: &str,
    ) -> Result<Issued, ApiError> {
        check_digest(digest)?;
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(ApiError::invalid("bad_key_name", "a key's name has 1 to 128 bytes and no control character"));
        }
        if role > by.role {
            return Err(ApiError::forbidden("role_too_high", "a key cannot have a higher role than its maker"));
        }
        let held =
            self.credentials.values().filter(|c| c.user == by.user && matches!(c.grant, Grant::Key { .. })).count();
        if held >= CREDENTIALS_PER_ACCOUNT_MAX {
            return Err(ApiError::conflict(
                "too_many_keys",
                format!("at most {CREDENTIALS_PER_ACCOUNT_MAX} keys each: revoke one"),
            ));
        }
        let life = lifetime_ms.unwrap_or(KEY_LIFETIME_DEFAULT_MS);
        if life == 0 || life > KEY_LIFETIME_MAX_MS {
            return Err(ApiError::invalid("bad_expiry", "a key lives from 1 ms to 365 days"));
        }
        let c = Credential {
            digest: digest.to_string(),
            user: by.user.clone(),
            grant: Grant::Key { name: name.to_string(), role, expires: now.plus(life) },
            created: now,
            last_used: now,
            source: String::new(),
        };
        Ok(Issued { credential: self.insert_credential(c, SessionLimits::default()) })
    }

    fn insert_credential(&mut self, c: Credential, limits: SessionLimits) -> CredentialView {
        // Bounded per account: the oldest session makes room.
        let user = c.user.clone();
        let held: Vec<&Credential> = self.credentials.values().filter(|x| x.user == user).collect();
        if held.len() >= CREDENTIALS_PER_ACCOUNT_MAX {
            if let Some(old) = held.iter().filter(|x| x.grant == Grant::Session).min_by_key(|x| (x.created, &x.digest))
            {
                let d = old.digest.clone();
                self.credentials.remove(&d);
                self.ops.push(IdentityOp::DeleteCredential(d));
            }
        }
        let view = self.view(&c, limits);
        self.ops.push(IdentityOp::PutCredential(c.clone()));
        self.credentials.insert(c.digest.clone(), c);
        view
    }

    fn view(&self, c: &Credential, limits: SessionLimits) -> CredentialView {
        let (kind, name, role, expires) = match &c.grant {
            Grant::Session => (
                "session",
                None,
                c.user.as_ref().and_then(|u| self.accounts.get(u)).map_or(Role::User, |a| a.role),
                c.created.plus(limits.max_ms).min(c.last_used.plus(limits.idle_ms)),
            ),
            Grant::Key { name, role, expires } => ("key", Some(name.clone()), *role, *expires),
        };
        CredentialView {
            id: c.id().to_string(),
            user: c.user.clone(),
            kind,
            name,
            role,
            created: c.created,
            last_used: c.last_used,
            expires,
            source: c.source.clone(),
        }
    }

    /// Who holds the secret whose digest is `digest`, at `now`; and whether its last use is
    /// old enough to be written down ([`Identity::touch`]). Expired, unknown, or an account
    /// gone: 401.
    pub fn authenticate(
        &self,
        now: Millis,
        digest: &str,
        limits: SessionLimits,
    ) -> Result<(Principal, bool), ApiError> {
        let c = self.credentials.get(digest).ok_or_else(unknown_credential)?;
        let role = match &c.grant {
            Grant::Session => {
                if now >= c.created.plus(limits.max_ms) || now >= c.last_used.plus(limits.idle_ms) {
                    return Err(ApiError::new(
                        crate::answer::ErrorKind::Unauthorized,
                        "session_expired",
                        "the session expired: log in again",
                    ));
                }
                let user = c.user.as_ref().ok_or_else(unknown_credential)?;
                self.accounts.get(user).ok_or_else(unknown_credential)?.role
            }
            Grant::Key { role, expires, .. } => {
                if now >= *expires {
                    return Err(ApiError::new(
                        crate::answer::ErrorKind::Unauthorized,
                        "key_expired",
                        "the API key expired",
                    ));
                }
                match &c.user {
                    // A key never outranks its owner as the owner is now.
                    Some(u) => (*role).min(self.accounts.get(u).ok_or_else(unknown_credential)?.role),
                    None => *role,
                }
            }
        };
        let principal = Principal { user: c.user.clone(), role, credential: Some(c.id().to_string()) };
        // Written down at most once a minute, and often enough for a short idle limit.
        let every = TOUCH_EVERY_MS.min(limits.idle_ms / 4);
        Ok((principal, now.since(c.last_used) >= every))
    }

    /// Write down a credential's use at `now`; also drops every credential expired by then.
    pub fn touch(&mut self, now: Millis, digest: &str, limits: SessionLimits) {
        if let Some(c) = self.credentials.get_mut(digest) {
            c.last_used = now;
            let c = c.clone();
            self.ops.push(IdentityOp::PutCredential(c));
        }
        self.sweep(now, limits);
    }

    /// Drop the credentials expired at `now`.
    pub fn sweep(&mut self, now: Millis, limits: SessionLimits) {
        self.revoke_where(|c| match &c.grant {
            Grant::Session => now >= c.created.plus(limits.max_ms) || now >= c.last_used.plus(limits.idle_ms),
            Grant::Key { expires, .. } => now >= *expires,
        });
    }

    /// The credentials `by` may see: an admin's, every one; a user's, their own.
    pub fn credentials(&self, by: &Principal, limits: SessionLimits) -> Vec<CredentialView> {
        self.credentials
            .values()
            .filter(|c| by.is_admin() || (by.user.is_some() && c.user == by.user))
            .map(|c| self.view(c, limits))
            .collect()
    }

    /// End the credential `id` (its first 16 hex digits); a user may end only their own.
    pub fn revoke(&mut self, by: &Principal, id: &str, limits: SessionLimits) -> Result<CredentialView, ApiError> {
        let c = self
            .credentials
            .values()
            .find(|c| c.id() == id && (by.is_admin() || (by.user.is_some() && c.user == by.user)))
            .cloned()
            .ok_or_else(|| ApiError::not_found("no_such_credential", format!("no session or key {id:?} of yours")))?;
        let view = self.view(&c, limits);
        self.credentials.remove(&c.digest);
        self.ops.push(IdentityOp::DeleteCredential(c.digest));
        Ok(view)
    }

    /// End the credential whose secret's digest is `digest` (a logout).
    pub fn end(&mut self, digest: &str) -> bool {
        let had = self.credentials.remove(digest).is_some();
        if had {
            self.ops.push(IdentityOp::DeleteCredential(digest.to_string()));
        }
        had
    }

    pub(super) fn revoke_where(&mut self, mut gone: impl FnMut(&Credential) -> bool) {
        let drop: Vec<String> = self.credentials.values().filter(|c| gone(c)).map(|c| c.digest.clone()).collect();
        for d in drop {
            self.credentials.remove(&d);
            self.ops.push(IdentityOp::DeleteCredential(d));
        }
    }
}

pub(super) fn no_user(name: &str) -> ApiError {
    ApiError::not_found("no_such_user", format!("no user {name:?}"))
}

fn unknown_credential() -> ApiError {
    ApiError::new(
        crate::answer::ErrorKind::Unauthorized,
        "bad_token",
        "the token is not a live session, key or the admin token",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::ErrorKind;

    const H: &str = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";

    fn digest(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn table() -> Identity {
        let mut t = Identity::default();
        t.add_group(Millis(0), "staff").unwrap();
        t.add_account(Millis(0), "anna", Role::User, ["staff".to_string()].into(), H.into()).unwrap();
        t.add_account(Millis(0), "root2", Role::Admin, BTreeSet::new(), H.into()).unwrap();
        t
    }

    fn login(t: &mut Identity, now: u64, who: &str, d: u8) -> Principal {
        t.login_begin(Millis(now), who, "10.0.0.1").unwrap();
        t.login_end(Millis(now), who, "10.0.0.1", true, &digest(d), Default::default()).unwrap();
        t.authenticate(Millis(now), &digest(d), SessionLimits::default()).unwrap().0
    }

    #[test]
    fn accounts_refuse_bad_names_duplicates_unknown_groups_and_clear_passwords() {
        let mut t = table();
        let kind = |r: Result<AccountView, ApiError>| r.unwrap_err().kind;
        assert_eq!(kind(t.add_account(Millis(1), "a/b", Role::User, BTreeSet::new(), H.into())), ErrorKind::Invalid);
        assert_eq!(kind(t.add_account(Millis(1), "anna", Role::User, BTreeSet::new(), H.into())), ErrorKind::Conflict);
        assert_eq!(
            kind(t.add_account(Millis(1), "bo", Role::User, ["nope".to_string()].into(), H.into())),
            ErrorKind::Invalid
        );
        assert_eq!(
            kind(t.add_account(Millis(1), "bo", Role::User, BTreeSet::new(), "hunter22".into())),
            ErrorKind::Invalid
        );
        assert_eq!(kind(t.remove_account("nobody")), ErrorKind::NotFound);
        assert!(password_error("short").is_some() && password_error(&"x".repeat(1025)).is_some());
        assert!(password_error("long enough").is_none());
        // What is persisted is what is held.
        let ops = t.take_ops();
        assert_eq!(ops.len(), 3, "{ops:?}");
    }

    /// A hash from elsewhere (a mirrored directory) is kept only as a PHC argon2id string whose
    /// costs the config keys could have set: one asking for 100 GiB per check is refused.
    #[test]
    fn a_hash_is_argon2id_with_costs_within_the_configs_bounds() {
        assert!(check_password_shape(H).is_ok());
        assert!(check_password_shape("$argon2id$v=19$m=4194304,t=100,p=16$c2FsdA$aGFzaA").is_ok());
        for bad in [
            "hunter22",
            "$argon2i$v=19$m=8,t=1,p=1$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=104857600,t=1,p=1$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=8,t=101,p=1$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=8,t=1,p=17$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=8,t=1$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=8,t=1,p=1,x=2$c2FsdA$aGFzaA",
            "$argon2id$v=19$m=8,t=1,p=1$c2FsdA",
        ] {
            assert!(check_password_shape(bad).is_err(), "{bad}");
        }
        assert!(check_password_shape(&format!("$argon2id$v=19$m=8,t=1,p=1$c2FsdA${}", "a".repeat(300))).is_err());
    }

    #[test]
    fn a_login_makes_a_session_that_expires_idle_and_absolutely() {
        let mut t = table();
        let limits = SessionLimits { idle_ms: 1_000, max_ms: 10_000 };
        assert_eq!(t.login_begin(Millis(0), "ghost", "s").unwrap().hash, None);
        assert_eq!(t.login_begin(Millis(0), "anna", "s").unwrap().hash.as_deref(), Some(H));
        let e = t.login_end(Millis(0), "anna", "s", false, &digest(1), Default::default()).unwrap_err();
        assert_eq!(e.error.kind, ErrorKind::Unauthorized);
        assert!(t.authenticate(Millis(0), &digest(1), limits).is_err());
        t.login_end(Millis(0), "anna", "s", true, &digest(1), Default::default()).unwrap();
        let (p, touch) = t.authenticate(Millis(500), &digest(1), limits).unwrap();
        // With a 1 s idle limit its use is written down every quarter of it.
        assert_eq!((p.user.as_deref(), p.role, touch), (Some("anna"), Role::User, true));
        assert!(!t.authenticate(Millis(200), &digest(1), limits).unwrap().1);
        // Idle: unused for a second, it is gone; used, it lives on to the absolute limit.
        assert_eq!(t.authenticate(Millis(1_000), &digest(1), limits).unwrap_err().code, "session_expired");
        for now in (900..10_000).step_by(900) {
            t.touch(Millis(now), &digest(1), limits);
            assert!(t.authenticate(Millis(now + 50), &digest(1), limits).is_ok(), "{now}");
        }
        t.touch(Millis(9_990), &digest(1), limits);
        assert_eq!(t.authenticate(Millis(10_000), &digest(1), limits).unwrap_err().code, "session_expired");
        t.sweep(Millis(10_000), limits);
        assert!(t.credentials(&Principal::root(), limits).is_empty());
    }

    #[test]
    fn failed_logins_back_off_with_a_retry_after() {
        let mut t = table();
        for _ in 0..super::super::FAILURES_FREE {
            t.login_begin(Millis(0), "anna", "s").unwrap();
            let _ = t.login_end(Millis(0), "anna", "s", false, &digest(1), Default::default());
        }
        let r = t.login_begin(Millis(0), "anna", "s").unwrap_err();
        assert_eq!((r.error.kind, r.retry_after_ms), (ErrorKind::TooMany, Some(1_000)));
        // Also a right password waits: the check comes before it.
        assert!(t.login_begin(Millis(999), "anna", "other").is_err());
        assert!(t.login_begin(Millis(1_000), "anna", "s").is_ok());
    }

    #[test]
    fn removal_password_change_and_demotion_hold_at_once() {
        let mut t = table();
        login(&mut t, 0, "anna", 1);
        let second = login(&mut t, 0, "anna", 2);
        let limits = SessionLimits::default();
        // A new password ends the other sessions, not the one that asked.
        t.set_password(Millis(5), "anna", H.into(), second.credential.as_deref()).unwrap();
        assert!(t.authenticate(Millis(6), &digest(1), limits).is_err());
        assert!(t.authenticate(Millis(6), &digest(2), limits).is_ok());
        // Promotion and demotion are read on every request.
        let admin = login(&mut t, 0, "root2", 3);
        assert!(admin.is_admin());
        t.set_account("root2", Some(Role::User), None).unwrap();
        assert_eq!(t.authenticate(Millis(6), &digest(3), limits).unwrap().0.role, Role::User);
        // A removed account's sessions and keys end with it.
        t.new_key(Millis(6), &second, "backup", Role::User, None, &digest(4)).unwrap();
        t.remove_account("anna").unwrap();
        for d in [2, 4] {
            assert!(t.authenticate(Millis(7), &digest(d), limits).is_err(), "{d}");
        }
    }

    #[test]
    fn keys_never_outrank_their_maker_and_expire() {
        let mut t = table();
        let anna = login(&mut t, 0, "anna", 1);
        let limits = SessionLimits::default();
        let e = t.new_key(Millis(0), &anna, "k", Role::Admin, None, &digest(2)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Forbidden);
        assert!(t.new_key(Millis(0), &anna, "k", Role::User, Some(0), &digest(2)).is_err());
        assert!(t.new_key(Millis(0), &anna, "k", Role::User, Some(KEY_LIFETIME_MAX_MS + 1), &digest(2)).is_err());
        assert!(t.new_key(Millis(0), &anna, "", Role::User, None, &digest(2)).is_err());
        assert!(t.new_key(Millis(0), &anna, "k", Role::User, None, "not-a-digest").is_err());
        let k = t.new_key(Millis(0), &anna, "k", Role::User, Some(1_000), &digest(2)).unwrap();
        assert_eq!(k.credential.expires, Millis(1_000));
        assert_eq!(t.authenticate(Millis(999), &digest(2), limits).unwrap().0.user.as_deref(), Some("anna"));
        assert_eq!(t.authenticate(Millis(1_000), &digest(2), limits).unwrap_err().code, "key_expired");
        // An admin's key follows its owner's demotion.
        let root2 = login(&mut t, 0, "root2", 3);
        t.new_key(Millis(0), &root2, "ops", Role::Admin, None, &digest(5)).unwrap();
        t.set_account("root2", Some(Role::User), None).unwrap();
        assert_eq!(t.authenticate(Millis(1), &digest(5), limits).unwrap().0.role, Role::User);
        // The admin token's keys are the node's.
        t.new_key(Millis(0), &Principal::root(), "ci", Role::Admin, None, &digest(6)).unwrap();
        assert!(t.authenticate(Millis(1), &digest(6), limits).unwrap().0.is_admin());
    }

    #[test]
    fn users_see_and_revoke_only_their_own_credentials() {
        let mut t = table();
        t.add_account(Millis(0), "bo", Role::User, BTreeSet::new(), H.into()).unwrap();
        let anna = login(&mut t, 0, "anna", 1);
        let bo = login(&mut t, 0, "bo", 2);
        let limits = SessionLimits::default();
        let mine = t.credentials(&anna, limits);
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].user.as_deref(), Some("anna"));
        assert_eq!(t.credentials(&Principal::root(), limits).len(), 2);
        let bos = bo.credential.clone().unwrap();
        assert_eq!(t.revoke(&anna, &bos, Default::default()).unwrap_err().kind, ErrorKind::NotFound);
        assert!(t.authenticate(Millis(1), &digest(2), limits).is_ok());
        t.revoke(&bo, &bos, Default::default()).unwrap();
        assert!(t.authenticate(Millis(1), &digest(2), limits).is_err());
        // A logout ends exactly the session presented.
        assert!(t.end(&digest(1)) && !t.end(&digest(1)));
    }

    #[test]
    fn removing_a_group_takes_it_off_its_accounts_and_credentials_are_bounded() {
        let mut t = table();
        t.remove_group("staff").unwrap();
        assert!(t.account("anna").unwrap().groups.is_empty());
        assert_eq!(t.remove_group("staff").unwrap_err().kind, ErrorKind::NotFound);
        for i in 0..(CREDENTIALS_PER_ACCOUNT_MAX + 3) {
            t.login_end(Millis(i as u64), "anna", "s", true, &format!("{:064x}", i + 1), Default::default()).unwrap();
        }
        let anna = Principal { user: Some("anna".into()), role: Role::User, credential: None };
        let held = t.credentials(&anna, SessionLimits::default());
        assert_eq!(held.len(), CREDENTIALS_PER_ACCOUNT_MAX);
        // The oldest went first.
        assert!(held.iter().all(|c| c.created >= Millis(3)));
    }
}
