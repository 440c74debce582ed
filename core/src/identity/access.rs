//! Per-folder access on `cluster:/` (issue 15 "Access"): rules `folder → group → read |
//! write`, inherited downwards, and `/home/<user>/` writable by its user. Admins may do
//! everything. A user may do what any rule on the path or one of its folders grants one of
//! their groups (grants add up; there is no deny), and nothing without a rule. Pure: the node
//! gives the rules (replicated records) and the account's groups.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What a rule grants. `Write` includes reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// One rule: members of `group` may `mode` in `folder` and below.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub folder: String,
    pub group: String,
    pub mode: Mode,
}

/// Who asks, as the rules see them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller<'a> {
    pub user: &'a str,
    pub admin: bool,
    pub groups: &'a BTreeSet<String>,
}

/// `folder` is `path` or one of its folders.
pub fn contains(folder: &str, path: &str) -> bool {
    folder == "/" || path == folder || path.strip_prefix(folder).is_some_and(|rest| rest.starts_with('/'))
}

/// The user's own folder.
pub fn home_of(user: &str) -> String {
    format!("/home/{user}")
}

/// Whether `who` may `mode` at `path` (normalized); `Err` says why not, naming the rule that
/// applies (or that none does).
pub fn decide(rules: &[Rule], who: &Caller, path: &str, mode: Mode) -> Result<(), String> {
    if who.admin || contains(&home_of(who.user), path) {
        return Ok(());
    }
    let mine: Vec<&Rule> =
        rules.iter().filter(|r| who.groups.contains(&r.group) && contains(&r.folder, path)).collect();
    if mine.iter().any(|r| r.mode >= mode) {
        return Ok(());
    }
    let deepest = mine.iter().max_by_key(|r| (r.folder.len(), r.mode));
    Err(match deepest {
        Some(r) => format!(
            "{} may not {} cluster:{path}: the rule {} → {}: {} gives read only",
            who.user,
            mode.as_str(),
            r.folder,
            r.group,
            r.mode.as_str()
        ),
        None => {
            let groups: Vec<&str> = who.groups.iter().map(String::as_str).collect();
            format!(
                "{} may not {} cluster:{path}: no rule gives their groups ({}) access there; {}/ is theirs",
                who.user,
                mode.as_str(),
                if groups.is_empty() { "none".to_string() } else { groups.join(", ") },
                home_of(who.user)
            )
        }
    })
}

/// Whether `path` shows in a listing for `who`: readable, or a folder on the way to a folder
/// they may read (so they can find it).
pub fn visible(rules: &[Rule], who: &Caller, path: &str) -> bool {
    if decide(rules, who, path, Mode::Read).is_ok() {
        return true;
    }
    let home = home_of(who.user);
    contains(path, &home) || rules.iter().any(|r| who.groups.contains(&r.group) && contains(path, &r.folder))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(folder: &str, group: &str, mode: Mode) -> Rule {
        Rule { folder: folder.into(), group: group.into(), mode }
    }

    #[test]
    fn grants_are_inherited_downwards_and_add_up() {
        let rules = vec![rule("/projects", "staff", Mode::Read), rule("/projects/x", "lab", Mode::Write)];
        let staff: BTreeSet<String> = ["staff".to_string()].into();
        let both: BTreeSet<String> = ["staff".to_string(), "lab".to_string()].into();
        let anna = Caller { user: "anna", admin: false, groups: &staff };
        let bo = Caller { user: "bo", admin: false, groups: &both };
        assert!(decide(&rules, &anna, "/projects/x/a.txt", Mode::Read).is_ok());
        let no = decide(&rules, &anna, "/projects/x/a.txt", Mode::Write).unwrap_err();
        assert!(no.contains("/projects → staff: read"), "{no}");
        assert!(decide(&rules, &bo, "/projects/x/a.txt", Mode::Write).is_ok());
        assert!(decide(&rules, &bo, "/projects/y", Mode::Write).is_err());
        // A sibling that shares a prefix is not inside.
        assert!(decide(&rules, &anna, "/projectsx", Mode::Read).is_err());
        let none = decide(&rules, &anna, "/other", Mode::Read).unwrap_err();
        assert!(none.contains("no rule") && none.contains("/home/anna/"), "{none}");
    }

    #[test]
    fn a_home_is_its_users_and_admins_reach_everything() {
        let none = BTreeSet::new();
        let anna = Caller { user: "anna", admin: false, groups: &none };
        assert!(decide(&[], &anna, "/home/anna", Mode::Write).is_ok());
        assert!(decide(&[], &anna, "/home/anna/deep/f", Mode::Write).is_ok());
        assert!(decide(&[], &anna, "/home/annabel/f", Mode::Read).is_err());
        assert!(decide(&[], &anna, "/home/bo/f", Mode::Read).is_err());
        let root = Caller { user: "root", admin: true, groups: &none };
        assert!(decide(&[], &root, "/anything", Mode::Write).is_ok());
    }

    #[test]
    fn listings_show_the_way_to_what_one_may_read() {
        let rules = vec![rule("/projects/x", "staff", Mode::Read)];
        let staff: BTreeSet<String> = ["staff".to_string()].into();
        let anna = Caller { user: "anna", admin: false, groups: &staff };
        for shown in ["/", "/projects", "/projects/x", "/projects/x/f", "/home", "/home/anna"] {
            assert!(visible(&rules, &anna, shown), "{shown}");
        }
        for hidden in ["/projects/y", "/home/bo", "/etc"] {
            assert!(!visible(&rules, &anna, hidden), "{hidden}");
        }
    }
}
