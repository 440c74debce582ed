//! The node's side of identity (issue 15 "Accounts and sessions"): its [`Identity`] table, the
//! session limits and password-hash parameters from the config plane (`identity.*`), and every
//! change persisted ([`PersistOp::Identity`]). The shell hashes passwords and draws secrets;
//! what is allowed is decided here and in `crate::identity`.

use super::{Node, PersistOp, Purpose};
use crate::answer::{ApiError, ErrorKind, PeerAnswer, Reply};
use crate::identity::{AdminAct, Directory, Identity, Principal, SessionLimits};
use crate::ids::NodeId;
use crate::time::Millis;
use serde::Serialize;
use serde_json::json;

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

/// `POST /cluster/acn/auth/admin`'s body: the act and who asked for it, asserted by the member.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActRequest {
    pub act: AdminAct,
    pub assertion: String,
}

/// Where a login is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginRoute {
    /// Against this node's own table (this node is the origin, there is none, or the account
    /// is local-only here).
    Local,
    /// Sealed to the origin's key and checked there, within `timeout_ms`; if the origin cannot
    /// be reached in time, this node's table (its copy of the directory) decides.
    Forward { origin: NodeId, box_key: String, timeout_ms: u64 },
}

/// What a member makes of the origin's answer to a forwarded login.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// The origin checked the password and vouches for the account.
    Vouched,
    /// The origin says wrong: refused, with no fallback.
    Refused,
    /// The origin's backoff, passed on as it is.
    Backoff,
    /// No usable answer (not reached in time, not the origin any more, a failure there): the
    /// member's copy of the directory decides.
    Unreachable,
}

/// The answer to a forwarded login, by the kind of refusal (`None`: carried out).
pub fn forwarded(refused: Option<ErrorKind>) -> Forwarded {
    match refused {
        None => Forwarded::Vouched,
        Some(ErrorKind::Unauthorized) => Forwarded::Refused,
        Some(ErrorKind::TooMany) => Forwarded::Backoff,
        Some(_) => Forwarded::Unreachable,
    }
}

/// The first directory sync after start or after the origin changed.
pub const DIRECTORY_FIRST_MS: u64 = 3_000;

impl Node {
    /// The identity origin: `identity.origin` when set (an approved proposal: the key is
    /// trusted), else the member that created the cluster; `None` outside a cluster, or when
    /// that member is gone.
    pub fn identity_origin(&self) -> Option<NodeId> {
        self.cluster.as_ref()?;
        let set = self
            .config_applied
            .as_ref()
            .and_then(|c| c.get("identity")?.get("origin")?.value.clone())
            .and_then(|v| v.as_str().map(str::to_string))
            .filter(|v| !v.is_empty());
        let live = |id: &NodeId| self.members.get(id).is_some_and(|r| !r.removed);
        match set {
            Some(id) => Some(NodeId::new(&id)).filter(live),
            None => self
                .members
                .records()
                .find(|r| !r.removed && r.admitted.as_ref().is_some_and(|m| m.by == r.id))
                .map(|r| r.id.clone()),
        }
    }

    /// Whether this node is the identity origin (or there is none: it stands alone).
    pub fn is_identity_origin(&self) -> bool {
        self.identity_origin().is_none_or(|o| o == self.id)
    }

    fn identity_ms(&self, key: &str, default: u64) -> u64 {
        self.identity_value(key).unwrap_or(default)
    }

    /// Where a login for `name` is checked.
    pub fn login_route(&self, name: &str) -> LoginRoute {
        let Some(origin) = self.identity_origin().filter(|o| *o != self.id) else { return LoginRoute::Local };
        if !self.identity.forwards(name) {
            return LoginRoute::Local;
        }
        match self.members.get(&origin).map(|r| r.box_key.clone()).filter(|k| !k.is_empty()) {
            Some(box_key) => {
                LoginRoute::Forward { origin, box_key, timeout_ms: self.identity_ms("forward_timeout", 12_000) }
            }
            None => LoginRoute::Local,
        }
    }

    /// The origin a change of account `name` is carried to, when it is another member, with
    /// the wait; `None`: made here (this node is the origin, there is none, or `name` is a
    /// local-only account of this node, which the origin's namesake has nothing to do with).
    pub fn act_route(&self, name: &str) -> Option<(NodeId, u64)> {
        if !self.identity.forwards(name) {
            return None;
        }
        let origin = self.identity_origin().filter(|o| *o != self.id)?;
        Some((origin, self.identity_ms("forward_timeout", 12_000)))
    }

    /// Whether an account act that brings a new password (`user add` when `adding`, else
    /// `user passwd`) can be taken, asked before the shell spends a slow hash on it: adding an
    /// account this node already knows is a conflict (the origin's are mirrored here); a
    /// password for an account made here needs the account. An act the origin takes is judged
    /// there.
    pub fn password_act_check(&self, name: &str, adding: bool) -> Result<(), ApiError> {
        let known = self.identity.account(name).is_some();
        if adding && known {
            return Err(ApiError::conflict("user_exists", format!("user {name:?} exists")));
        }
        if !adding && !known && self.act_route(name).is_none() {
            return Err(ApiError::not_found("no_such_user", format!("no user {name:?}")));
        }
        Ok(())
    }

    /// Copy the origin's directory on the next turn (after an account change carried there).
    pub fn identity_sync_soon(&mut self, wall: Millis) {
        let now = self.advance_clocks(wall);
        self.identity_sync_due = now;
    }

    /// The next sync: a kick (start, a new origin, a change carried there) or the last one
    /// plus `identity.sync_every` as it is now (a shorter interval holds at once).
    pub(super) fn identity_next_due(&self) -> Option<Millis> {
        self.cluster.as_ref()?;
        let every = self.identity_ms("sync_every", 5 * 60_000);
        Some(self.identity_sync_due.min(self.identity_synced_at.plus(every)))
    }

    /// On the node's timer: a new origin is synced from 3 s on; then every
    /// `identity.sync_every` this member copies the origin's directory and writes back the
    /// passwords set here that the origin has not taken yet.
    pub(super) fn identity_timeout(&mut self, wall: Millis, now: Millis) {
        let origin = self.identity_origin();
        if origin != self.identity_origin_seen {
            self.identity_origin_seen = origin.clone();
            self.identity_sync_due = now.plus(DIRECTORY_FIRST_MS);
            self.identity_synced_at = now;
        }
        if self.identity_next_due().is_none_or(|due| now < due) {
            return;
        }
        self.identity_synced_at = now;
        self.identity_sync_due = Millis(u64::MAX);
        let Some(origin) = origin.filter(|o| *o != self.id) else { return };
        self.new_request(wall, now, &origin, "GET", "/cluster/acn/auth/directory", Vec::new(), Purpose::Directory);
        for (name, hash) in self.identity.writebacks() {
            let act = AdminAct::Password { name: name.clone(), hash: hash.clone() };
            // This member vouches that the account's own password changed here.
            let who = Principal { user: Some(name.clone()), role: crate::identity::Role::User, credential: None };
            let Some(assertion) = self.user_assertion(wall, &who, &origin) else { continue };
            let body = serde_json::to_vec(&ActRequest { act, assertion }).expect("an act serialises");
            self.new_request(
                wall,
                now,
                &origin,
                "POST",
                "/cluster/acn/auth/admin",
                body,
                Purpose::WriteBack { name, hash },
            );
        }
    }

    /// The origin answered a directory request or a write-back.
    pub(super) fn identity_answered(
        &mut self,
        wall: Millis,
        peer: &NodeId,
        purpose: Purpose,
        result: Result<PeerAnswer, String>,
    ) {
        let answer = match result {
            Ok(a) if a.is_ok() => a,
            Ok(a) => {
                let why = format!("the origin refused: {}", String::from_utf8_lossy(&a.body));
                if purpose == Purpose::Directory {
                    self.identity.sync_failed(why);
                }
                return;
            }
            Err(e) => {
                if purpose == Purpose::Directory {
                    self.identity.sync_failed(format!("the origin {peer} could not be reached: {e}"));
                }
                return;
            }
        };
        if self.identity_origin().as_ref() != Some(peer) {
            return;
        }
        match purpose {
            Purpose::Directory => match serde_json::from_slice::<Directory>(&answer.body) {
                Ok(d) if &d.origin == peer => {
                    self.identity_mut(|i, _| {
                        i.merge_directory(wall, &d.users);
                    });
                }
                Ok(_) => self.identity.sync_failed("the directory names another origin".into()),
                Err(e) => self.identity.sync_failed(format!("the directory is malformed: {e}")),
            },
            Purpose::WriteBack { name, hash } => self.identity_mut(|i, _| i.writeback_done(&name, &hash)),
            _ => {}
        }
    }

    /// `GET /cluster/acn/auth/directory`: every account, as the origin.
    pub(super) fn answer_directory(&self, wall: Millis) -> Reply {
        if !self.is_identity_origin() {
            return not_origin();
        }
        let d = Directory { origin: self.id.clone(), users: self.identity.directory_entries(), time: wall.0 };
        Reply::ok(serde_json::to_value(d).expect("a directory serialises"))
    }

    /// `POST /cluster/acn/auth/admin`: a member carries an account change here, the origin.
    pub(super) fn answer_admin_act(&mut self, wall: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        if !self.is_identity_origin() {
            return not_origin();
        }
        let ActRequest { act, assertion } = match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return Reply::error(ErrorKind::Invalid, "bad_body", format!("an account act: {e}")),
        };
        // Who asked, on the member: an admin, or the account itself for its own password.
        let asserted = match self.verify_user_assertion(wall, &assertion) {
            Ok(a) if a.i == *sender => a,
            Ok(_) => {
                return Reply::error(
                    ErrorKind::Unauthorized,
                    "bad_user_assertion",
                    "the assertion's issuer is not the sender",
                )
            }
            Err(e) => return e.into(),
        };
        let own_password = matches!(&act, AdminAct::Password { name, .. } if *name == asserted.u);
        if asserted.r != Some(crate::identity::Role::Admin) && !own_password {
            return Reply::error(ErrorKind::Forbidden, "admin_only", format!("{} is no admin", asserted.u));
        }
        let what = match &act {
            AdminAct::Add { name, .. } => format!("add {name}"),
            AdminAct::Remove { name } => format!("rm {name}"),
            AdminAct::Password { name, .. } => format!("passwd {name}"),
            AdminAct::Set { name, .. } => format!("set {name}"),
        };
        let r = self.identity_mut(|i, _| i.apply_act(wall, act));
        let status = if r.is_ok() { 200 } else { 400 };
        self.audit(wall, &format!("auth/admin {what}"), &format!("{}@{sender}", asserted.u), status);
        match r {
            Ok(v) => Reply::ok(serde_json::to_value(v).expect("an account serialises")),
            Err(e) => e.into(),
        }
    }

    /// At the origin: may a sealed login naming `sealed_user` for audience `audience` be checked
    /// as a login of `username` here? Only when this node is the origin and the sealed payload
    /// is for this node and that account (a sealed password cannot be moved to another).
    pub fn sealed_login_fits(&self, username: &str, sealed_user: &str, audience: &str) -> Result<(), ApiError> {
        if !self.is_identity_origin() {
            return Err(ApiError::conflict("not_origin", "this node is not the identity origin"));
        }
        if audience != self.id.as_str() || sealed_user != username {
            return Err(ApiError::invalid("bad_sealed", "the sealed password is for another node or account"));
        }
        Ok(())
    }

    /// When the origin cannot take a new password for `name`: keep it here and write it back
    /// later, only for an account mirrored from it.
    pub fn keeps_for_writeback(&self, name: &str) -> bool {
        self.identity.account(name).is_some_and(|a| a.mirrored)
    }

    /// What the last directory sync and forward auth did, and who the origin is.
    pub fn identity_status(&self) -> serde_json::Value {
        let origin = self.identity_origin();
        let name = origin.as_ref().and_then(|o| self.members.get(o)).map(|r| r.name.clone());
        let mut v = serde_json::to_value(self.identity.sync_status()).expect("status serialises");
        v["enabled"] = json!(self.cluster.is_some());
        v["origin"] = json!(origin);
        v["originName"] = json!(name);
        v["isOrigin"] = json!(origin.as_ref() == Some(&self.id));
        if v["isOrigin"] == json!(true) {
            v["managedAccounts"] = json!(0);
            v["localAccounts"] = json!(self.identity.accounts().len());
        }
        v["pendingWriteBacks"] = json!(self.identity.writebacks().len());
        v
    }
}

fn not_origin() -> Reply {
    Reply::error(ErrorKind::Conflict, "not_origin", "this node is not the identity origin")
}

impl Node {
    /// A user assertion for a request this node makes to `audience` for `who` (`X-Aroz-User`,
    /// or inside a signed body); `None` outside a cluster. The admin token asserts as
    /// `admin-token` with the admin role.
    pub fn user_assertion(&mut self, wall: Millis, who: &Principal, audience: &NodeId) -> Option<String> {
        use crate::identity::assertion::{issue, UserAssertion, ASSERTION_TTL_MS};
        let cluster = self.cluster.as_ref()?.id.clone();
        let user = who.name().to_string();
        let groups = self.identity.account(&user).map(|a| a.groups.iter().cloned().collect()).unwrap_or_default();
        let a = UserAssertion {
            u: user,
            g: groups,
            i: self.id.clone(),
            c: cluster,
            t: wall.0 / 1000,
            e: (wall.0 + ASSERTION_TTL_MS) / 1000,
            a: audience.clone(),
            n: self.rng.uuid_v4(),
            tm: wall.0,
            r: Some(who.role),
        };
        Some(issue(&self.key, &a))
    }

    /// Check a user assertion a member sent with a request to this node (401 when it does not
    /// hold: wrong cluster, unknown or removed issuer, bad signature, expired or future,
    /// another audience, replayed).
    pub fn verify_user_assertion(
        &mut self,
        wall: Millis,
        header: &str,
    ) -> Result<crate::identity::assertion::UserAssertion, ApiError> {
        let Some(cluster) = self.cluster.as_ref().map(|c| c.id.clone()) else {
            return Err(ApiError::not_in_cluster());
        };
        let members = &self.members;
        self.assertions
            .verify(wall, header, &self.id, &cluster, |id| members.member_key(id), |id| members.clock_offset_ms(id))
            .map_err(|e| ApiError::new(ErrorKind::Unauthorized, "bad_user_assertion", e.to_string()))
    }
}
