//! The identity verbs (issue 15): `user`, `group`, `login`/`logout`/`whoami`, `session`,
//! `apikey`. Passwords come from a prompt on the terminal, or from stdin when stdin is not a
//! terminal (scripts: `echo "$PW" | shoal login --user anna`), never from a flag. A login's
//! session is kept in the user's config dir (`$SHOAL_CONFIG_DIR`, else
//! `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`), `session.json`, mode 0600.

use super::api::Api;
use super::args::*;
use super::human::s;
use super::output::CliError;
use super::session::{keep_session, kept_session, session_file, Kept};
use crate::wire::escape_segment;
use serde_json::{json, Value};
use std::io::{BufRead, IsTerminal};

/// A password: from the terminal without echo, or one line of stdin when it is not a terminal.
fn read_password(prompt: &str) -> Result<String, CliError> {
    let pw = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(prompt).map_err(|e| CliError(format!("cannot read the password: {e}")))?
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| CliError(format!("cannot read stdin: {e}")))?;
        line.trim_end_matches(['\n', '\r']).to_string()
    };
    if pw.is_empty() {
        return Err(CliError("no password given".into()));
    }
    Ok(pw)
}

/// A new password, asked twice on a terminal.
fn new_password(prompt: &str) -> Result<String, CliError> {
    let pw = read_password(prompt)?;
    if std::io::stdin().is_terminal() && read_password("again: ")? != pw {
        return Err(CliError("the passwords differ".into()));
    }
    Ok(pw)
}

/// `30d`, `12h`, `90m`, `45s` in milliseconds.
pub(super) fn parse_lifetime(text: &str) -> Result<u64, CliError> {
    let t = text.trim();
    let bad = || CliError(format!("{text:?} is not a lifetime: write it as 30d, 12h, 90m or 45s"));
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms).filter(|v| *v > 0).ok_or_else(bad)
}

fn seg(v: &str) -> String {
    escape_segment(v)
}

fn human_users(v: &Value) -> String {
    let mut out = String::new();
    for u in v["users"].as_array().into_iter().flatten() {
        let groups: Vec<String> = u["groups"].as_array().into_iter().flatten().map(s).collect();
        out.push_str(&format!("{}  {}  groups: {}\n", s(&u["name"]), s(&u["role"]), groups.join(",")));
    }
    if out.is_empty() {
        "no users".into()
    } else {
        out.trim_end().to_string()
    }
}

fn human_rules(v: &Value) -> String {
    let lines: Vec<String> = v["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| format!("cluster:{}  {}  {}", s(&r["folder"]), s(&r["group"]), s(&r["mode"])))
        .collect();
    if lines.is_empty() {
        "no rules (users reach their /home/<user>/ only)".into()
    } else {
        lines.join("\n")
    }
}

fn human_credentials(v: &Value) -> String {
    let list = v["sessions"].as_array().or_else(|| v["keys"].as_array());
    let mut out = String::new();
    for c in list.into_iter().flatten() {
        let who = if c["user"].is_null() { "admin-token".to_string() } else { s(&c["user"]) };
        let name = if c["name"].is_null() { String::new() } else { format!(" {:?}", s(&c["name"])) };
        out.push_str(&format!(
            "{}  {}{}  {}  {}  expires {}  from {}\n",
            s(&c["id"]),
            s(&c["kind"]),
            name,
            who,
            s(&c["role"]),
            s(&c["expires"]),
            s(&c["source"])
        ));
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.trim_end().to_string()
    }
}

impl Api {
    pub(super) async fn identity(&self, cmd: Cmd) -> Result<(Value, fn(&Value) -> String), CliError> {
        Ok(match cmd {
            Cmd::User { cmd: UserCmd::Add { name, groups, admin } } => {
                let password = new_password(&format!("password for {name}: "))?;
                let body = json!({"name": name, "password": password, "groups": groups, "admin": admin});
                (self.call("POST", "/users", Some(body)).await?, |v| {
                    format!("added {} ({})", s(&v["name"]), s(&v["role"]))
                })
            }
            Cmd::User { cmd: UserCmd::List } => (self.call("GET", "/users", None).await?, human_users),
            Cmd::User { cmd: UserCmd::Rm { name } } => {
                (self.call("DELETE", &format!("/users/{}", seg(&name)), None).await?, |v| {
                    format!("removed {}", s(&v["name"]))
                })
            }
            Cmd::User { cmd: UserCmd::Passwd { name: Some(name) } } => {
                let password = new_password(&format!("new password for {name}: "))?;
                let path = format!("/users/{}/password", seg(&name));
                (self.call("POST", &path, Some(json!({"password": password}))).await?, |v| {
                    format!("password of {} set; its sessions ended", s(&v["name"]))
                })
            }
            Cmd::User { cmd: UserCmd::Passwd { name: None } } => {
                let old = read_password("current password: ")?;
                let new = new_password("new password: ")?;
                (self.call("POST", "/me/password", Some(json!({"old": old, "new": new}))).await?, |v| {
                    format!("password of {} set; your other sessions ended", s(&v["name"]))
                })
            }
            Cmd::User { cmd: UserCmd::Set { name, admin, user, groups, no_groups } } => {
                let role = if admin {
                    json!("admin")
                } else if user {
                    json!("user")
                } else {
                    Value::Null
                };
                let groups = if no_groups {
                    json!([])
                } else if groups.is_empty() {
                    Value::Null
                } else {
                    json!(groups)
                };
                let path = format!("/users/{}", seg(&name));
                (self.call("POST", &path, Some(json!({"role": role, "groups": groups}))).await?, |v| {
                    format!("{} is {} in {}", s(&v["name"]), s(&v["role"]), v["groups"])
                })
            }
            Cmd::Group { cmd: GroupCmd::Add { name } } => {
                (self.call("POST", "/groups", Some(json!({"name": name}))).await?, |v| {
                    format!("added group {}", s(&v["name"]))
                })
            }
            Cmd::Group { cmd: GroupCmd::List } => (self.call("GET", "/groups", None).await?, |v| {
                let names: Vec<String> = v["groups"].as_array().into_iter().flatten().map(|g| s(&g["name"])).collect();
                if names.is_empty() {
                    "no groups".into()
                } else {
                    names.join("\n")
                }
            }),
            Cmd::Group { cmd: GroupCmd::Rm { name } } => {
                (self.call("DELETE", &format!("/groups/{}", seg(&name)), None).await?, |v| {
                    format!("removed group {}", s(&v["name"]))
                })
            }
            Cmd::Login { user } => {
                let user = match user {
                    Some(u) => u,
                    None if std::io::stdin().is_terminal() => {
                        eprint!("user: ");
                        let mut line = String::new();
                        std::io::stdin().lock().read_line(&mut line).map_err(|e| CliError(e.to_string()))?;
                        line.trim().to_string()
                    }
                    None => {
                        return Err(CliError(
                            "login from a script needs --user NAME (the password comes on stdin)".into(),
                        ))
                    }
                };
                let password = read_password(&format!("password for {user}: "))?;
                let v = self
                    .call_with("POST", "/login", Some(json!({"username": user, "password": password})), &[])
                    .await?;
                let token = v["token"].as_str().ok_or_else(|| CliError("the node answered no token".into()))?;
                let path = keep_session(&Kept {
                    api: self.base.clone(),
                    token: token.to_string(),
                    user: user.clone(),
                    pin: self.pin.clone(),
                })?;
                let shown = json!({"user": user, "api": self.base, "session": v["session"], "kept": path.display().to_string()});
                (shown, |v| {
                    format!(
                        "logged in as {} at {} (session {} kept in {})",
                        s(&v["user"]),
                        s(&v["api"]),
                        s(&v["session"]["id"]),
                        s(&v["kept"])
                    )
                })
            }
            Cmd::Logout => {
                let kept = kept_session().ok_or_else(|| CliError("not logged in (no kept session)".into()))?;
                let auth = format!("Bearer {}", kept.token);
                // The node may have ended it already; the kept copy goes either way.
                let ended = self.call_with("POST", "/logout", None, &[("authorization", &auth)]).await;
                if let Some(p) = session_file() {
                    let _ = std::fs::remove_file(p);
                }
                let v = json!({"user": kept.user, "endedAtNode": ended.is_ok()});
                (v, |v| format!("logged out {}", s(&v["user"])))
            }
            Cmd::Whoami => (self.call("GET", "/me", None).await?, |v| {
                let who = if v["user"].is_null() { "the admin token".to_string() } else { s(&v["user"]) };
                format!("{who} ({})", s(&v["role"]))
            }),
            Cmd::Session { cmd: SessionCmd::List } => (self.call("GET", "/sessions", None).await?, human_credentials),
            Cmd::Session { cmd: SessionCmd::Revoke { id } } => {
                (self.call("DELETE", &format!("/sessions/{}", seg(&id)), None).await?, |v| {
                    format!("ended {} {}", s(&v["kind"]), s(&v["id"]))
                })
            }
            Cmd::Apikey { cmd: ApikeyCmd::New { name, role, expires } } => {
                let expires_ms = expires.as_deref().map(parse_lifetime).transpose()?;
                let body = json!({"name": name, "role": role, "expiresMs": expires_ms});
                (self.call("POST", "/apikeys", Some(body)).await?, |v| {
                    format!(
                        "{}\n(key {} for {}, expires {}; the secret is shown only now)",
                        s(&v["token"]),
                        s(&v["key"]["id"]),
                        s(&v["key"]["role"]),
                        s(&v["key"]["expires"])
                    )
                })
            }
            Cmd::Apikey { cmd: ApikeyCmd::List } => (self.call("GET", "/apikeys", None).await?, human_credentials),
            Cmd::Apikey { cmd: ApikeyCmd::Revoke { id } } => {
                (self.call("DELETE", &format!("/apikeys/{}", seg(&id)), None).await?, |v| {
                    format!("revoked {} {}", s(&v["kind"]), s(&v["id"]))
                })
            }
            Cmd::Access { cmd: AccessCmd::Set { folder, group, mode } } => {
                let folder = folder.strip_prefix("cluster:").unwrap_or(&folder).to_string();
                let body = json!({"folder": folder, "group": group, "mode": mode});
                (self.call("POST", "/access", Some(body)).await?, human_rules)
            }
            Cmd::Access { cmd: AccessCmd::List } => (self.call("GET", "/access", None).await?, human_rules),
            Cmd::Access { cmd: AccessCmd::Rm { folder, group } } => {
                let folder = folder.strip_prefix("cluster:").unwrap_or(&folder).to_string();
                let body = json!({"folder": folder, "group": group, "mode": null});
                (self.call("POST", "/access", Some(body)).await?, human_rules)
            }
            Cmd::Identity { cmd: IdentityCmd::Status } => {
                (self.call("GET", "/identity/status", None).await?, super::human::human_json)
            }
            Cmd::Identity { cmd: IdentityCmd::Sync } => {
                (self.call("POST", "/identity/sync", None).await?, |_| "syncing the directory from the origin".into())
            }
            other => return Err(CliError(format!("not an identity verb: {other:?}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_read_as_an_operator_writes_them() {
        assert_eq!(parse_lifetime("30d").unwrap(), 30 * 86_400_000);
        assert_eq!(parse_lifetime("90m").unwrap(), 90 * 60_000);
        for bad in ["", "30", "d", "0d", "3w", "-1d", "99999999999999999d"] {
            assert!(parse_lifetime(bad).is_err(), "{bad}");
        }
    }
}
