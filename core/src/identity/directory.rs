//! One sign-on across the cluster (issue 15; spec: cluster-runtime.md "Identity (AID)"): the
//! identity origin's account directory, how a member mirrors it, the acts a member carries to
//! the origin, and the key a typed password is sealed to.
//!
//! The reference's rules, with its weaknesses removed: the directory carries argon2id PHC
//! hashes (salted, slow), never a password equivalent; groups are matched by name and only
//! groups that exist on the member apply (an account whose groups exist nowhere here is
//! skipped); a local-only account of the same name is never overwritten (a conflict); an
//! account the origin dropped is deleted here with its sessions; a password set here for a
//! mirrored account is written back to the origin and kept over the directory's until the
//! origin took it.

use super::accounts::{
    check_password_shape, wrong_login, Account, Identity, IdentityOp, LoginRefused, Skipped, SyncStatus,
};
use super::{valid_username, Role};
use crate::answer::ApiError;
use crate::time::Millis;
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

/// The X25519 secret a node opens sealed passwords with, derived from its node key (so it
/// needs no file of its own); its public half rides in the node's owner-signed record.
pub fn box_secret(key: &SigningKey) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"shoal-box-v1\n");
    h.update(key.to_bytes());
    h.finalize().into()
}

/// The public half of [`box_secret`], base64.
pub fn box_public(key: &SigningKey) -> String {
    use base64::Engine;
    let public = crypto_box::SecretKey::from(box_secret(key)).public_key();
    base64::engine::general_purpose::STANDARD.encode(public.as_bytes())
}

/// One account as the origin publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    pub username: String,
    /// argon2id PHC string.
    pub password_hash: String,
    pub groups: Vec<String>,
    pub role: Role,
    #[serde(default)]
    pub password_changed: Millis,
}

impl From<&Account> for DirectoryEntry {
    fn from(a: &Account) -> DirectoryEntry {
        DirectoryEntry {
            username: a.name.clone(),
            password_hash: a.hash.clone(),
            groups: a.groups.iter().cloned().collect(),
            role: a.role,
            password_changed: a.password_changed,
        }
    }
}

/// `GET /cluster/acn/auth/directory`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Directory {
    pub origin: crate::ids::NodeId,
    pub users: Vec<DirectoryEntry>,
    /// Unix ms on the origin's clock.
    pub time: u64,
}

/// An act on an account, carried by a member to the origin (`POST /cluster/acn/auth/admin`):
/// `user add|rm|passwd|set` on any member acts at the origin. Hashes are argon2id PHC strings
/// made by the member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "act", deny_unknown_fields)]
pub enum AdminAct {
    Add { name: String, hash: String, role: Role, groups: BTreeSet<String> },
    Remove { name: String },
    Password { name: String, hash: String },
    Set { name: String, role: Option<Role>, groups: Option<BTreeSet<String>> },
}

/// Why a mirrored entry was not taken.
enum Mirror {
    Taken,
    Conflict,
    Skipped(String),
}

impl Identity {
    /// The directory this node publishes as origin: every account it holds.
    pub fn directory_entries(&self) -> Vec<DirectoryEntry> {
        self.accounts.values().map(DirectoryEntry::from).collect()
    }

    pub fn sync_status(&self) -> &SyncStatus {
        &self.sync
    }

    /// Take one entry of the origin's (a sync, or a forward auth's answer).
    fn mirror_entry(&mut self, now: Millis, e: &DirectoryEntry) -> Mirror {
        if !valid_username(&e.username) {
            return Mirror::Skipped("not a valid username".into());
        }
        if check_password_shape(&e.password_hash).is_err() {
            return Mirror::Skipped("not an argon2id hash".into());
        }
        let existing = self.accounts.get(&e.username).cloned();
        if existing.as_ref().is_some_and(|a| !a.mirrored) {
            return Mirror::Conflict;
        }
        let groups: BTreeSet<String> = e.groups.iter().filter(|g| self.groups.contains_key(*g)).cloned().collect();
        if !e.groups.is_empty() && groups.is_empty() {
            return Mirror::Skipped("None of your permission groups exist on this node".into());
        }
        let mut a = existing.clone().unwrap_or(Account {
            name: e.username.clone(),
            role: e.role,
            groups: BTreeSet::new(),
            hash: String::new(),
            created: now,
            password_changed: e.password_changed,
            mirrored: true,
            writeback: false,
        });
        let before = a.clone();
        a.role = e.role;
        a.groups = groups;
        // A password set at the origin after the one waiting here to be written back wins: the
        // write-back is dropped rather than put an older password over it.
        if a.writeback && e.password_changed > a.password_changed {
            a.writeback = false;
        }
        let new_password = !a.writeback && a.hash != e.password_hash;
        if new_password {
            a.hash = e.password_hash.clone();
            a.password_changed = e.password_changed;
        }
        if a != before || existing.is_none() {
            self.ops.push(IdentityOp::PutAccount(a.clone()));
            self.accounts.insert(a.name.clone(), a);
        }
        if new_password && existing.is_some() {
            // The password changed at the origin: sessions made with the old one end.
            let name = e.username.clone();
            self.revoke_where(|c| c.user.as_deref() == Some(name.as_str()) && c.grant == super::Grant::Session);
        }
        Mirror::Taken
    }

    /// A member took the origin's whole directory: mirror it under the rules above and drop
    /// the mirrored accounts it no longer lists.
    pub fn merge_directory(&mut self, now: Millis, users: &[DirectoryEntry]) -> &SyncStatus {
        let mut kept = BTreeSet::new();
        let mut skipped = Vec::new();
        let mut conflicts = Vec::new();
        let mut seen = BTreeSet::new();
        for e in users {
            if !seen.insert(e.username.clone()) {
                skipped.push(Skipped { username: e.username.clone(), reason: "listed twice".into() });
                continue;
            }
            match self.mirror_entry(now, e) {
                Mirror::Taken => {
                    kept.insert(e.username.clone());
                }
                Mirror::Conflict => conflicts.push(e.username.clone()),
                Mirror::Skipped(reason) => skipped.push(Skipped { username: e.username.clone(), reason }),
            }
        }
        let dropped: Vec<String> =
            self.accounts.values().filter(|a| a.mirrored && !kept.contains(&a.name)).map(|a| a.name.clone()).collect();
        for name in dropped {
            let _ = self.remove_account(&name);
        }
        self.sync.managed_accounts = kept.len();
        self.sync.local_accounts = self.accounts.values().filter(|a| !a.mirrored).count();
        self.sync.skipped = skipped;
        self.sync.conflicts = conflicts;
        self.sync.last_sync = Some(now);
        self.sync.last_sync_error = None;
        &self.sync
    }

    pub fn sync_failed(&mut self, why: String) {
        self.sync.last_sync_error = Some(why);
    }

    /// The origin vouched for this account at a login here: mirror it now (not waiting for the
    /// next sync). Refused for a local-only account of that name.
    pub fn mirror_one(&mut self, now: Millis, e: &DirectoryEntry) -> Result<(), ApiError> {
        self.sync.last_forward = Some(now);
        self.sync.last_forward_error = None;
        match self.mirror_entry(now, e) {
            Mirror::Taken => Ok(()),
            Mirror::Conflict => Err(ApiError::conflict(
                "local_account",
                format!("{:?} is a local account of this node: it signs in here only", e.username),
            )),
            Mirror::Skipped(why) => Err(ApiError::forbidden("not_mirrored", why)),
        }
    }

    pub fn forward_failed(&mut self, now: Millis, why: String) {
        self.sync.last_forward = Some(now);
        self.sync.last_forward_error = Some(why);
    }

    /// Whether a login for `name` is forwarded to the origin: not for a local-only account.
    pub fn forwards(&self, name: &str) -> bool {
        self.accounts.get(name).is_none_or(|a| a.mirrored)
    }

    /// A password set here for a mirrored account while its origin could not take it: kept,
    /// and written back until the origin takes it ([`Identity::writebacks`]).
    pub fn set_password_pending(
        &mut self,
        now: Millis,
        name: &str,
        hash: String,
        keep: Option<&str>,
    ) -> Result<(), ApiError> {
        let mirrored = self.accounts.get(name).is_some_and(|a| a.mirrored);
        self.set_password(now, name, hash, keep)?;
        if mirrored {
            if let Some(a) = self.accounts.get_mut(name) {
                a.writeback = true;
                let a = a.clone();
                self.ops.push(IdentityOp::PutAccount(a));
            }
        }
        Ok(())
    }

    /// The password changes waiting for the origin: (account, hash).
    pub fn writebacks(&self) -> Vec<(String, String)> {
        self.accounts.values().filter(|a| a.writeback).map(|a| (a.name.clone(), a.hash.clone())).collect()
    }

    /// The origin took `hash` for `name`: nothing more to write back (unless it changed again).
    pub fn writeback_done(&mut self, name: &str, hash: &str) {
        if let Some(a) = self.accounts.get_mut(name).filter(|a| a.writeback && a.hash == hash) {
            a.writeback = false;
            let a = a.clone();
            self.ops.push(IdentityOp::PutAccount(a));
        }
    }

    /// At the identity origin, after the shell checked a password a member forwarded (`ok`):
    /// the account to mirror there, or the failure counted against the account and the member.
    pub fn vouch(&mut self, now: Millis, name: &str, source: &str, ok: bool) -> Result<DirectoryEntry, LoginRefused> {
        let entry = self.accounts.get(name).filter(|_| ok).map(DirectoryEntry::from);
        self.guard.end(now, name, source, entry.is_some());
        entry.ok_or(LoginRefused { error: wrong_login(), retry_after_ms: None })
    }

    /// At the origin: carry out a member's act.
    pub fn apply_act(&mut self, now: Millis, act: AdminAct) -> Result<super::AccountView, ApiError> {
        match act {
            AdminAct::Add { name, hash, role, groups } => self.add_account(now, &name, role, groups, hash),
            AdminAct::Remove { name } => self.remove_account(&name),
            AdminAct::Password { name, hash } => self.set_password(now, &name, hash, None),
            AdminAct::Set { name, role, groups } => self.set_account(&name, role, groups),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H1: &str = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
    const H2: &str = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$b3RoZXJvdGhlcm90aGVyMQ";

    fn entry(name: &str, hash: &str, groups: &[&str]) -> DirectoryEntry {
        DirectoryEntry {
            username: name.into(),
            password_hash: hash.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            role: Role::User,
            password_changed: Millis(1),
        }
    }

    #[test]
    fn the_box_key_is_derived_from_the_node_key_and_differs_per_node() {
        let a = SigningKey::from_bytes(&[1; 32]);
        let b = SigningKey::from_bytes(&[2; 32]);
        assert_eq!(box_public(&a), box_public(&a));
        assert_ne!(box_public(&a), box_public(&b));
        assert_ne!(box_secret(&a), a.to_bytes(), "not the signing key itself");
    }

    #[test]
    fn a_sync_mirrors_skips_conflicts_and_drops_by_the_rules() {
        let mut t = Identity::default();
        t.add_group(Millis(0), "staff").unwrap();
        t.add_account(Millis(0), "local", Role::Admin, BTreeSet::new(), H1.into()).unwrap();
        let dir = vec![
            entry("anna", H1, &["staff", "nowhere"]),
            entry("bo", H1, &[]),
            entry("cy", H1, &["nowhere"]),
            entry("local", H2, &[]),
            entry("bad/name", H1, &[]),
            entry("dee", "plain", &[]),
        ];
        let st = t.merge_directory(Millis(5), &dir).clone();
        assert_eq!(st.managed_accounts, 2);
        assert_eq!(st.local_accounts, 1);
        assert_eq!(st.conflicts, vec!["local".to_string()]);
        let skipped: Vec<&str> = st.skipped.iter().map(|s| s.username.as_str()).collect();
        assert_eq!(skipped, ["cy", "bad/name", "dee"]);
        assert!(st.skipped[0].reason.contains("None of your permission groups"));
        // Only the groups that exist here apply; the local account is untouched.
        assert_eq!(t.account("anna").unwrap().groups, BTreeSet::from(["staff".to_string()]));
        assert_eq!(t.account("local").unwrap().hash, H1);
        assert!(!t.account("local").unwrap().mirrored);
        // Dropped by the origin: deleted here, sessions with it.
        t.login_end(Millis(6), "bo", "s", true, &"ab".repeat(32), Default::default()).unwrap();
        t.merge_directory(Millis(7), &dir[..1]);
        assert!(t.account("bo").is_none());
        assert!(t.authenticate(Millis(8), &"ab".repeat(32), Default::default()).is_err());
        assert!(t.account("local").is_some());
    }

    #[test]
    fn a_password_set_here_is_kept_until_the_origin_took_it() {
        let mut t = Identity::default();
        t.merge_directory(Millis(0), &[entry("anna", H1, &[])]);
        t.set_password_pending(Millis(1), "anna", H2.into(), None).unwrap();
        assert_eq!(t.writebacks(), vec![("anna".to_string(), H2.to_string())]);
        // The origin still has the old one: the sync does not revert it.
        t.merge_directory(Millis(2), &[entry("anna", H1, &[])]);
        assert_eq!(t.account("anna").unwrap().hash, H2);
        t.writeback_done("anna", H2);
        assert!(t.writebacks().is_empty());
        t.merge_directory(Millis(3), &[entry("anna", H2, &[])]);
        assert_eq!(t.account("anna").unwrap().hash, H2);
        // A password changed at the origin ends the sessions made with the old one.
        t.login_end(Millis(4), "anna", "s", true, &"cd".repeat(32), Default::default()).unwrap();
        t.merge_directory(Millis(5), &[entry("anna", H1, &[])]);
        assert_eq!(t.account("anna").unwrap().hash, H1);
        assert!(t.authenticate(Millis(6), &"cd".repeat(32), Default::default()).is_err());
        // A password reset at the origin after one set here wins over the write-back.
        t.set_password_pending(Millis(10), "anna", H2.into(), None).unwrap();
        let mut newer = entry("anna", H1, &[]);
        newer.password_changed = Millis(20);
        t.merge_directory(Millis(21), &[newer]);
        assert!(t.writebacks().is_empty());
        assert_eq!(t.account("anna").unwrap().hash, H1);
    }

    #[test]
    fn a_local_account_is_not_forwarded_and_not_mirrored_over() {
        let mut t = Identity::default();
        t.add_account(Millis(0), "ops", Role::Admin, BTreeSet::new(), H1.into()).unwrap();
        assert!(!t.forwards("ops") && t.forwards("anyone"));
        assert!(t.mirror_one(Millis(1), &entry("ops", H2, &[])).is_err());
        assert!(t.mirror_one(Millis(1), &entry("anna", H2, &[])).is_ok());
        assert!(t.forwards("anna"));
    }
}
