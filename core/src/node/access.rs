//! The node's side of per-folder access (issue 15 "Access"): the rules as replicated records
//! (settings under `config/access/`, so only this module writes them), and the answer to "may
//! this caller do this here" for the drive, listings, jobs (as their owner) and events. The
//! rule itself is `crate::identity::access`.

use super::Node;
use crate::answer::ApiError;
use crate::identity::access::{self, Caller, Mode, Rule};
use crate::identity::{valid_username, Principal, Role};
use crate::meta::records::{Record, Setting};
use crate::time::Millis;
use serde::Serialize;
use std::collections::BTreeSet;

/// Where the rules live among the settings: `config/access/<group><folder>`.
pub const ACCESS_PREFIX: &str = "config/access/";

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccessList {
    pub rules: Vec<Rule>,
}

impl Node {
    /// Every rule, by folder then group.
    pub fn access_rules(&self) -> Vec<Rule> {
        let mut rules: Vec<Rule> = self
            .config_settings(ACCESS_PREFIX)
            .filter_map(|s| serde_json::from_value::<Rule>(s.value.clone()).ok())
            .collect();
        rules.sort_by(|a, b| (&a.folder, &a.group).cmp(&(&b.folder, &b.group)));
        rules
    }

    /// Set (or with `None` remove) the rule for `group` on `folder`.
    pub fn access_set(
        &mut self,
        wall: Millis,
        folder: &str,
        group: &str,
        mode: Option<Mode>,
    ) -> Result<AccessList, ApiError> {
        self.in_cluster()?;
        let folder =
            crate::meta::namespace::normalize(folder).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        if !valid_username(group) {
            return Err(ApiError::invalid("bad_group", "a group name follows the username rules"));
        }
        let key = format!("{ACCESS_PREFIX}{group}{folder}");
        let exists = self.config_settings(ACCESS_PREFIX).any(|s| s.key == key);
        if mode.is_none() && !exists {
            return Err(ApiError::not_found("no_such_rule", format!("no rule for {group} on cluster:{folder}")));
        }
        let value = match mode {
            Some(mode) => {
                serde_json::to_value(Rule { folder, group: group.to_string(), mode }).expect("a rule serialises")
            }
            None => serde_json::Value::Null,
        };
        let version = self.hlc.next(wall);
        self.submit_record(wall, Record::Setting(Setting { key, value, removed: mode.is_none(), version }));
        Ok(AccessList { rules: self.access_rules() })
    }

    /// The caller as the rules see them: a user's groups from this node's accounts.
    fn caller_groups(&self, who: &Principal) -> BTreeSet<String> {
        who.user.as_deref().and_then(|u| self.identity.account(u)).map(|a| a.groups.clone()).unwrap_or_default()
    }

    /// May `who` `mode` at `path`? A 403 names the rule that applies, or says none does.
    pub fn access_check(&self, who: &Principal, path: &str, mode: Mode) -> Result<(), ApiError> {
        if who.is_admin() {
            return Ok(());
        }
        let path = crate::meta::namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        let groups = self.caller_groups(who);
        let caller = Caller { user: who.user.as_deref().unwrap_or(""), admin: false, groups: &groups };
        access::decide(&self.access_rules(), &caller, &path, mode).map_err(|why| ApiError::forbidden("no_access", why))
    }

    /// Whether `path` shows in `who`'s listings (readable, or on the way to something readable).
    pub fn access_visible(&self, who: &Principal, path: &str) -> bool {
        if who.is_admin() {
            return true;
        }
        let groups = self.caller_groups(who);
        let caller = Caller { user: who.user.as_deref().unwrap_or(""), admin: false, groups: &groups };
        access::visible(&self.access_rules(), &caller, path)
    }

    /// A job's owner as a caller: the admin token's jobs (`admin-token`) are an admin's; an
    /// account's, as that account is now; an owner with no account here may do nothing.
    pub fn principal_of_owner(&self, owner: &str) -> Principal {
        if owner == Principal::root().name() || owner == "admin" {
            return Principal::root();
        }
        match self.identity.account(owner) {
            Some(a) => Principal { user: Some(a.name.clone()), role: a.role, credential: None },
            None => Principal { user: Some(owner.to_string()), role: Role::User, credential: None },
        }
    }
}

impl Node {
    /// A user reaches only their own jobs (another's is "not found", so its existence does
    /// not leak); an admin every job.
    pub fn job_access(&self, who: &Principal, id: &str) -> Result<(), ApiError> {
        let v = self.job_status(id)?;
        if who.is_admin() || who.user.as_deref() == Some(v.owner.as_str()) {
            Ok(())
        } else {
            Err(ApiError::not_found("no_such_job", format!("no job {id:?} of yours")))
        }
    }

    /// A submit by `who`: the inputs and the dataset must be readable by them (the job runs as
    /// them).
    pub fn job_submit_access(&self, who: &Principal, submit: &crate::jobs::submit::JobSubmit) -> Result<(), ApiError> {
        let paths = submit.inputs.iter().chain(std::iter::once(&submit.dataset).filter(|d| !d.is_empty()));
        for p in paths {
            let bare = crate::jobs::submit::cluster_path(p).map_err(|e| ApiError::invalid("bad_path", e))?;
            self.access_check(who, &bare, Mode::Read)?;
        }
        Ok(())
    }
}

impl Node {
    /// Whether `who` may see event `e`: an admin every one; a user the events about paths they
    /// may read (`data.path`, and both ends of a move) and apps' `app.*` events, no others.
    pub fn event_visible(&self, who: &Principal, e: &crate::events::Event) -> bool {
        if who.is_admin() {
            return true;
        }
        let paths: Vec<&str> =
            ["path", "from", "to"].iter().filter_map(|k| e.data.get(*k).and_then(|v| v.as_str())).collect();
        if paths.is_empty() {
            return e.kind.starts_with("app.");
        }
        paths.iter().all(|p| self.access_check(who, p, Mode::Read).is_ok())
    }
}
