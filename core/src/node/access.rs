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

    /// What `who` may reach, read once for many checks (a listing, a page of events): the
    /// rules and their groups. An admin's needs no rules.
    pub fn access_view(&self, who: &Principal) -> AccessView {
        let admin = who.is_admin();
        AccessView {
            admin,
            user: who.user.clone().unwrap_or_default(),
            groups: who
                .user
                .as_deref()
                .and_then(|u| self.identity.account(u))
                .map(|a| a.groups.clone())
                .unwrap_or_default(),
            rules: if admin { Vec::new() } else { self.access_rules() },
        }
    }

    /// May `who` `mode` at `path`? A 403 names the rule that applies, or says none does. A
    /// job's spilled output (under `SPILL_DIR/<job>/`) is readable by the job's owner.
    pub fn access_check(&self, who: &Principal, path: &str, mode: Mode) -> Result<(), ApiError> {
        if mode == Mode::Read && self.spilled_output_of(who, path) {
            return Ok(());
        }
        self.access_view(who).check(path, mode)
    }

    /// `path` lies under the spill folder of a job `who` owns.
    fn spilled_output_of(&self, who: &Principal, path: &str) -> bool {
        let Some(user) = who.user.as_deref() else { return false };
        let Ok(p) = crate::meta::namespace::normalize(path) else { return false };
        let Some(rest) = p.strip_prefix(crate::jobs::SPILL_DIR).and_then(|r| r.strip_prefix('/')) else {
            return false;
        };
        let Some((job, _)) = rest.split_once('/') else { return false };
        self.job_status(job).is_ok_and(|j| j.owner == user)
    }

    /// Whether `path` shows in `who`'s listings (readable, or on the way to something readable).
    pub fn access_visible(&self, who: &Principal, path: &str) -> bool {
        self.access_view(who).visible(path)
    }

    /// `ls` for `who`: refused unless they may see the folder (checked before it is looked up,
    /// so a refusal does not say whether it exists), with only the entries they may see.
    pub fn meta_ls_for(&self, who: &Principal, path: &str) -> Result<super::meta::Listing, ApiError> {
        let view = self.access_view(who);
        let p = crate::meta::namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        if !view.visible(&p) {
            view.check(&p, Mode::Read)?;
        }
        let mut l = self.meta_ls(path)?;
        l.entries.retain(|e| view.visible(&e.path));
        Ok(l)
    }

    /// The jobs `who` may see (`job list`): a user's own.
    pub fn job_list_for(&self, who: &Principal, all: bool) -> super::jobs::JobList {
        let mut list = self.job_list(all);
        if !who.is_admin() {
            list.jobs.retain(|j| who.user.as_deref() == Some(j.owner.as_str()));
        }
        list
    }

    /// A job's owner as a caller: the admin token's jobs (`@admin-token`) are an admin's; an
    /// account's, as that account is now on this node; any other owner (an account this node
    /// does not have, a lesser key of the admin token) reaches only its own home.
    pub fn principal_of_owner(&self, owner: &str) -> Principal {
        if owner == crate::identity::ROOT_NAME {
            return Principal::root();
        }
        match self.identity.account(owner) {
            Some(a) => Principal { user: Some(a.name.clone()), role: a.role, credential: None },
            None => Principal { user: Some(owner.to_string()), role: Role::User, credential: None },
        }
    }

    /// Whether a job owned by `owner` may run host programs (`exec`): only an admin's; a
    /// program reads the node's own files, out of reach of the folder rules.
    pub fn job_may_exec(&self, owner: &Principal) -> bool {
        owner.is_admin()
    }

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
    /// Whether `who` may see event `e` ([`AccessView::event`]).
    pub fn event_visible(&self, who: &Principal, e: &crate::events::Event) -> bool {
        self.access_view(who).event(e)
    }
}

/// The rules as they apply to one caller ([`Node::access_view`]).
#[derive(Clone, Debug)]
pub struct AccessView {
    admin: bool,
    user: String,
    groups: BTreeSet<String>,
    rules: Vec<Rule>,
}

impl AccessView {
    fn caller(&self) -> Caller<'_> {
        Caller { user: &self.user, admin: self.admin, groups: &self.groups }
    }

    pub fn check(&self, path: &str, mode: Mode) -> Result<(), ApiError> {
        if self.admin {
            return Ok(());
        }
        let path = crate::meta::namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        access::decide(&self.rules, &self.caller(), &path, mode).map_err(|why| ApiError::forbidden("no_access", why))
    }

    pub fn visible(&self, path: &str) -> bool {
        self.admin || access::visible(&self.rules, &self.caller(), path)
    }

    /// An admin sees every event; a user the events about paths they may read (`data.path`,
    /// and both ends of a move) and apps' `app.*` events, no others.
    pub fn event(&self, e: &crate::events::Event) -> bool {
        if self.admin {
            return true;
        }
        let paths: Vec<&str> =
            ["path", "from", "to"].iter().filter_map(|k| e.data.get(*k).and_then(|v| v.as_str())).collect();
        if paths.is_empty() {
            return e.kind.starts_with("app.");
        }
        paths.iter().all(|p| self.check(p, Mode::Read).is_ok())
    }
}
