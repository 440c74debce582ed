//! Accounts, groups, logins, sessions and API keys over HTTP (issue 15 "Accounts and
//! sessions"): who is asking ([`authenticate_request`], the first step of `/v1`'s one middleware, `api_gate`), and the routes
//! `/v1/login`, `/v1/logout`, `/v1/me`, `/v1/sessions`, `/v1/apikeys`, `/v1/users`,
//! `/v1/groups`. The core's `Identity` decides; this module hashes, draws secrets and speaks
//! HTTP.

use super::{parse_body, Body, S};
use crate::env::Env;
use crate::http::listener::ClientAddr;
use crate::node::handle::Shared;
use crate::services::passwords;
use crate::services::peer;
use crate::wire::error::{api_error_response, api_result, error_response, json_of};
use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde::Serialize;
use serde_json::json;
use serde_json::Value;
use shoal_core::answer::ErrorKind;
use shoal_core::identity::{need_of, password_error, AdminAct, DirectoryEntry, LoginRefused, Need, Principal, Role};
use shoal_core::node::identity::{Forwarded as CoreForwarded, LoginRoute};
use shoal_core::node::ApiError;
use shoal_core::NodeId;
use std::collections::BTreeSet;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The cookie a browser's session rides in.
pub const SESSION_COOKIE: &str = "shoal_session";
/// Prefixes of the secrets handed out (a leaked one is recognisable in logs and scanners).
const SESSION_PREFIX: &str = "shs_";
const KEY_PREFIX: &str = "shk_";

/// Who asked, put in the request's extensions by [`authenticate`]; `digest` is the presented
/// secret's (none for the admin token).
#[derive(Clone, Debug)]
pub struct Authed {
    pub principal: Principal,
    pub digest: Option<String>,
}

/// The account a configuration act is recorded under: the principal's name (`@admin-token`
/// for the admin token); `admin` where no one was authenticated (never on `/v1`).
pub(super) fn account_of(authed: Option<&Authed>) -> String {
    authed.map_or_else(|| "admin".to_string(), |a| a.principal.name().to_string())
}

/// The credentials of `Authorization: Bearer T`; the scheme is case-insensitive (RFC 9110
/// 11.1), spaces after it are skipped.
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, rest) = authorization.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The session cookie's value among a `Cookie` header's pairs.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

pub(super) fn path_of(req: &Request) -> String {
    req.extensions()
        .get::<axum::extract::OriginalUri>()
        .map(|u| u.0.path().to_string())
        .unwrap_or_else(|| req.uri().path().to_string())
}

/// Every `/v1` request and `/metrics`: who is asking, from `Authorization: Bearer T`,
/// `X-Shoal-Token: T` or the session cookie; the node's admin token (compared in constant
/// time), a session or an API key. Then the route's need ([`need_of`]): a user on an admin
/// route is refused with 403. `POST /v1/login` alone needs nobody.
pub(super) async fn authenticate<E: Env>(State(s): S<E>, mut req: Request, next: Next) -> Response {
    let path = path_of(&req);
    if let Some(refused) = authenticate_request(&s, &mut req, &path) {
        return refused;
    }
    next.run(req).await
}

/// [`authenticate`]'s work on one request at `path`: the caller's [`Authed`] is put in its
/// extensions, or the answer refusing it returned.
pub(super) fn authenticate_request<E: Env>(s: &Arc<Shared<E>>, req: &mut Request, path: &str) -> Option<Response> {
    if path == "/v1/login" {
        return None;
    }
    let headers = req.headers();
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .or_else(|| headers.get("x-shoal-token").and_then(|v| v.to_str().ok()))
        .or_else(|| session_cookie(headers))
        .map(str::trim);
    let Some(presented) = presented.filter(|p| !p.is_empty()) else {
        return Some(error_response(
            401,
            "no_token",
            "this API needs a token: the admin token, a session (`shoal login`) or an API key (Authorization: Bearer <token>)",
        ));
    };
    let root: bool = presented.as_bytes().ct_eq(s.admin_token.as_bytes()).into();
    let authed = if root {
        Authed { principal: Principal::root(), digest: None }
    } else {
        let digest = passwords::digest_of(presented);
        match s.read_node(|n, now| n.authenticate(now, &digest)) {
            Ok((principal, touch)) => {
                if touch {
                    s.with_node(|n, now| n.identity_touch(now, &digest));
                }
                Authed { principal, digest: Some(digest) }
            }
            Err(e) => return Some(api_error_response(e)),
        }
    };
    let need = need_of(req.method().as_str(), path);
    if need == Need::Admin && !authed.principal.is_admin() {
        return Some(error_response(
            403,
            "admin_only",
            format!("{} {path} needs an admin; {} is a user", req.method(), authed.principal.name()),
        ));
    }
    req.extensions_mut().insert(authed);
    None
}

// ---- login, logout, me ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    username: String,
    password: String,
}

/// `POST /v1/login {username, password}`: a session, as a bearer token in the body and the
/// `shoal_session` cookie (HttpOnly, SameSite=Strict). Failures back off per account and per
/// source (429 with `Retry-After`); every try with a possible account name is in the audit log
/// (a backoff's refusals are not: they cost nothing and would only fill it). The work runs to
/// its end even if the client goes away, so every try begun is settled in the core.
pub(super) async fn login<E: Env>(State(s): S<E>, client: Option<Extension<ClientAddr>>, body: Body) -> Response {
    let b: LoginBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    let source = client.map_or_else(|| "unknown".to_string(), |c| c.0 .0.clone());
    match tokio::spawn(login_inner(s, b, source)).await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

async fn login_inner<E: Env>(s: Arc<Shared<E>>, b: LoginBody, source: String) -> Response {
    let act = format!("POST /v1/login {}", b.username);
    let ticket = match s.with_node(|n, now| n.identity_mut(|i, _| i.login_begin(now, &b.username, &source))) {
        Ok(t) => t,
        Err(refused) => return refusal(refused),
    };
    // From here the try counts until one of `login_end` and `check_end` settles it.
    let params = s.read_node(|n, _| n.password_params());
    let route = s.read_node(|n, _| n.login_route(&b.username));
    let ok = match route {
        LoginRoute::Local => passwords::verify(params, ticket.hash, b.password).await,
        LoginRoute::Forward { origin, box_key, timeout_ms } => {
            match forward_login(&s, &origin, &box_key, timeout_ms, &b.username, &b.password, &source).await {
                Forwarded::Vouched(entry) => {
                    let mirrored = s.with_node(|n, now| n.identity_mut(|i, _| i.mirror_one(now, &entry)));
                    if let Err(e) = mirrored {
                        s.with_node(|n, now| {
                            n.identity_mut(|i, _| i.check_end(now, &b.username, &source, false));
                            n.audit(now, &act, &b.username, 403)
                        });
                        return api_error_response(e);
                    }
                    true
                }
                Forwarded::Refused => false,
                Forwarded::Backoff(resp) => {
                    s.with_node(|n, now| n.identity_mut(|i, _| i.check_end(now, &b.username, &source, false)));
                    return resp;
                }
                Forwarded::Unreachable(why) => {
                    // The origin has no opinion: this node's copy of the directory decides.
                    tracing::warn!(%origin, %why, "identity origin unreachable: the local directory decides");
                    s.with_node(|n, now| n.identity_mut(|i, _| i.forward_failed(now, why)));
                    passwords::verify(params, ticket.hash, b.password).await
                }
            }
        }
    };
    let (token, digest) = passwords::new_secret(SESSION_PREFIX);
    let result = s.with_node(|n, now| {
        let r = n.identity_mut(|i, limits| i.login_end(now, &b.username, &source, ok, &digest, limits));
        n.audit(now, &act, &b.username, if r.is_ok() { 200 } else { 401 });
        r.map(|issued| (issued, n.session_limits()))
    });
    match result {
        Ok((issued, limits)) => {
            let mut resp = axum::Json(json!({"token": token, "session": issued.credential})).into_response();
            let cookie = format!(
                "{SESSION_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
                limits.max_ms / 1000,
                secure_flag(&s)
            );
            if let Ok(v) = cookie.parse() {
                resp.headers_mut().insert("set-cookie", v);
            }
            resp
        }
        Err(refused) => api_error_response(refused.error),
    }
}

/// `; Secure` on a node that serves HTTPS: the browser then never sends the cookie in clear.
fn secure_flag<E: Env>(s: &Shared<E>) -> &'static str {
    if s.serves_tls {
        "; Secure"
    } else {
        ""
    }
}

/// `POST /v1/logout`: end the session (or key) presented.
pub(super) async fn logout<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>) -> Response {
    let Some(digest) = a.digest else {
        return error_response(400, "admin_token", "the admin token is not a session: nothing to log out of");
    };
    s.with_node(|n, _| n.identity_mut(|i, _| i.end(&digest)));
    let mut resp = axum::Json(json!({"loggedOut": true})).into_response();
    if let Ok(v) = format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{}", secure_flag(&s)).parse()
    {
        resp.headers_mut().insert("set-cookie", v);
    }
    resp
}

/// `GET /v1/me`: who this credential is.
pub(super) async fn me<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>) -> Response {
    let account = a.principal.user.as_deref().and_then(|u| s.read_node(|n, _| n.identity().account(u).map(json_of)));
    let mut v = json_of(&a.principal);
    if let Some(acc) = account {
        v["groups"] = acc["groups"].clone();
    }
    axum::Json(v).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnPassword {
    old: String,
    new: String,
}

/// `POST /v1/me/password {old, new}`: a user changes their own password; their other
/// sessions end.
pub(super) async fn me_password<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    let b: OwnPassword = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    let Some(user) = a.principal.user.clone() else {
        return error_response(400, "admin_token", "the admin token has no password; use `shoal user passwd NAME`");
    };
    if let Some(e) = password_error(&b.new) {
        return api_error_response(e);
    }
    // The old password is checked under the login backoff (a stolen session must not guess it).
    let source = format!("session {}", a.principal.credential.as_deref().unwrap_or(""));
    let ticket = match s.with_node(|n, now| n.identity_mut(|i, _| i.login_begin(now, &user, &source))) {
        Ok(t) => t,
        Err(refused) => return refusal(refused),
    };
    let params = s.read_node(|n, _| n.password_params());
    let ok = passwords::verify(params, ticket.hash, b.old).await;
    s.with_node(|n, now| n.identity_mut(|i, _| i.check_end(now, &user, &source, ok)));
    if !ok {
        return error_response(403, "bad_password", "the old password is wrong");
    }
    let new = match passwords::hash(params, b.new).await {
        Ok(h) => h,
        Err(e) => return api_error_response(e),
    };
    let keep = a.principal.credential.clone();
    api_result(set_password_anywhere(&s, &a.principal, &user, new, keep).await)
}

// ---- sessions and keys ----

fn listed<E: Env>(s: &Shared<E>, a: &Authed, kind: &str) -> Response {
    let list = s.read_node(|n, _| n.identity().credentials(&a.principal, n.session_limits()));
    let list: Vec<_> = list.into_iter().filter(|c| c.kind == kind).collect();
    axum::Json(json!({ if kind == "key" { "keys" } else { "sessions" }: list })).into_response()
}

pub(super) async fn sessions_list<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>) -> Response {
    listed(&s, &a, "session")
}

pub(super) async fn keys_list<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>) -> Response {
    listed(&s, &a, "key")
}

/// `DELETE /v1/sessions/{id}` and `/v1/apikeys/{id}`: end one (a user, only their own).
pub(super) async fn credential_revoke<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    api_result(s.with_node(|n, _| n.identity_mut(|i, limits| i.revoke(&a.principal, &id, limits))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KeyBody {
    name: String,
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    expires_ms: Option<u64>,
}

/// `POST /v1/apikeys {name, role?, expiresMs?}`: a key for scripts, shown once.
pub(super) async fn key_new<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    let b: KeyBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    let (token, digest) = passwords::new_secret(KEY_PREFIX);
    let role = b.role.unwrap_or(Role::User);
    let r =
        s.with_node(|n, now| n.identity_mut(|i, _| i.new_key(now, &a.principal, &b.name, role, b.expires_ms, &digest)));
    match r {
        Ok(issued) => axum::Json(json!({"token": token, "key": issued.credential})).into_response(),
        Err(e) => api_error_response(e),
    }
}

// ---- users and groups (admin) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserBody {
    name: String,
    password: String,
    #[serde(default)]
    groups: BTreeSet<String>,
    #[serde(default)]
    admin: bool,
}

pub(super) async fn users_list<E: Env>(State(s): S<E>) -> Response {
    axum::Json(json!({"users": s.read_node(|n, _| n.identity().accounts())})).into_response()
}

/// `POST /v1/users {name, password, groups?, admin?}`.
pub(super) async fn user_add<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    let b: UserBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    if let Some(e) = password_error(&b.password) {
        return api_error_response(e);
    }
    // Refused before the (slow) hash when it cannot be taken.
    if let Err(e) = s.read_node(|n, _| n.password_act_check(&b.name, true)) {
        return api_error_response(e);
    }
    let params = s.read_node(|n, _| n.password_params());
    let hash = match passwords::hash(params, b.password).await {
        Ok(h) => h,
        Err(e) => return api_error_response(e),
    };
    let role = if b.admin { Role::Admin } else { Role::User };
    let act = AdminAct::Add { name: b.name.clone(), hash: hash.clone(), role, groups: b.groups.clone() };
    match carry_act(&s, &a.principal, &act).await {
        Ok(Carried::There(v)) => axum::Json(v).into_response(),
        Ok(Carried::Here) => {
            api_result(s.with_node(|n, now| n.identity_mut(|i, _| i.add_account(now, &b.name, role, b.groups, hash))))
        }
        Err(e) => api_error_response(e),
    }
}

pub(super) async fn user_remove<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(name): Path<String>,
) -> Response {
    match carry_act(&s, &a.principal, &AdminAct::Remove { name: name.clone() }).await {
        Ok(Carried::There(v)) => {
            // Gone here at once too, with its sessions.
            let _ = s.with_node(|n, _| n.identity_mut(|i, _| i.remove_account(&name)));
            axum::Json(v).into_response()
        }
        Ok(Carried::Here) => api_result(s.with_node(|n, _| n.identity_mut(|i, _| i.remove_account(&name)))),
        Err(e) => api_error_response(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    password: String,
}

/// `POST /v1/users/{name}/password {password}`: an admin sets a password; the account's
/// sessions end.
pub(super) async fn user_password<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(name): Path<String>,
    body: Body,
) -> Response {
    let b: PasswordBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    if let Some(e) = password_error(&b.password) {
        return api_error_response(e);
    }
    if let Err(e) = s.read_node(|n, _| n.password_act_check(&name, false)) {
        return api_error_response(e);
    }
    let params = s.read_node(|n, _| n.password_params());
    let hash = match passwords::hash(params, b.password).await {
        Ok(h) => h,
        Err(e) => return api_error_response(e),
    };
    api_result(set_password_anywhere(&s, &a.principal, &name, hash, None).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserSet {
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    groups: Option<BTreeSet<String>>,
}

/// `POST /v1/users/{name} {role?, groups?}`.
pub(super) async fn user_set<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(name): Path<String>,
    body: Body,
) -> Response {
    let b: UserSet = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    let act = AdminAct::Set { name: name.clone(), role: b.role, groups: b.groups.clone() };
    match carry_act(&s, &a.principal, &act).await {
        Ok(Carried::There(v)) => axum::Json(v).into_response(),
        Ok(Carried::Here) => {
            api_result(s.with_node(|n, _| n.identity_mut(|i, _| i.set_account(&name, b.role, b.groups))))
        }
        Err(e) => api_error_response(e),
    }
}

pub(super) async fn groups_list<E: Env>(State(s): S<E>) -> Response {
    axum::Json(json!({"groups": s.read_node(|n, _| n.identity().groups())})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupBody {
    name: String,
}

pub(super) async fn group_add<E: Env>(State(s): S<E>, body: Body) -> Response {
    let b: GroupBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_error_response(e),
    };
    api_result(s.with_node(|n, now| n.identity_mut(|i, _| i.add_group(now, &b.name))))
}

pub(super) async fn group_remove<E: Env>(State(s): S<E>, Path(name): Path<String>) -> Response {
    api_result(s.with_node(|n, _| n.identity_mut(|i, _| i.remove_group(&name))))
}

// ---- one sign-on: forward auth and account acts carried to the origin ----

enum Forwarded {
    /// The origin checked the password: the account to mirror.
    Vouched(DirectoryEntry),
    /// The origin says wrong: no fallback.
    Refused,
    /// The origin's backoff, passed on as it is.
    Backoff(Response),
    /// No answer in time (or no usable one): the local table decides.
    Unreachable(String),
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The account, the password, the audience (the origin's id) and the client's address at
    /// the member (the origin's backoff counts per member and client), sealed together.
    u: String,
    p: String,
    a: String,
    #[serde(default)]
    s: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyBody {
    username: String,
    sealed: String,
}

async fn forward_login<E: Env>(
    s: &Arc<Shared<E>>,
    origin: &NodeId,
    box_key: &str,
    timeout_ms: u64,
    username: &str,
    password: &str,
    client: &str,
) -> Forwarded {
    let sealed = Sealed { u: username.into(), p: password.into(), a: origin.to_string(), s: client.into() };
    let plain = serde_json::to_vec(&sealed).expect("serialises");
    let sealed = match passwords::seal(box_key, &plain) {
        Ok(v) => v,
        Err(e) => return Forwarded::Unreachable(e.message),
    };
    let body = serde_json::to_vec(&VerifyBody { username: username.into(), sealed }).expect("serialises");
    let r = peer::signed_within(s, origin, "POST", "/cluster/acn/auth/verify", body, Vec::new(), timeout_ms).await;
    let r = match r {
        Ok(r) => r,
        Err(e) => return Forwarded::Unreachable(e.message),
    };
    let refused = crate::wire::error::peer_answer(r.status, Vec::new()).refused;
    match shoal_core::node::identity::forwarded(refused) {
        CoreForwarded::Vouched => {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            match serde_json::from_value::<DirectoryEntry>(v["account"].clone()) {
                Ok(e) if e.username == username => Forwarded::Vouched(e),
                _ => Forwarded::Unreachable("the origin's answer is malformed".into()),
            }
        }
        CoreForwarded::Refused => Forwarded::Refused,
        CoreForwarded::Backoff => {
            let mut resp = error_response(429, "login_backoff", "too many failed logins at the identity origin: wait");
            if let Some(v) = r.header("retry-after").and_then(|v| v.parse().ok()) {
                resp.headers_mut().insert("retry-after", v);
            }
            Forwarded::Backoff(resp)
        }
        CoreForwarded::Unreachable => {
            Forwarded::Unreachable(format!("the origin answered {}: {}", r.status, String::from_utf8_lossy(&r.body)))
        }
    }
}

/// `POST /cluster/acn/auth/verify {username, sealed}` at the origin: open the sealed password,
/// check it here (with this node's backoff, counted per member), and vouch for the account.
pub(super) async fn acn_verify<E: Env>(s: &Arc<Shared<E>>, sender: NodeId, bytes: &[u8]) -> Response {
    let b: VerifyBody = match serde_json::from_slice(bytes) {
        Ok(b) => b,
        Err(e) => return error_response(400, "bad_body", format!("auth/verify: {e}")),
    };
    if let Err(e) = s.read_node(|n, _| n.sealed_login_fits(&b.username, &b.username, n.id().as_str())) {
        return api_error_response(e);
    }
    let plain = match passwords::open(&s.box_secret, &b.sealed) {
        Ok(p) => p,
        Err(e) => return api_error_response(e),
    };
    let sealed: Sealed = match serde_json::from_slice(&plain) {
        Ok(v) => v,
        Err(_) => return error_response(400, "bad_sealed", "the sealed password is malformed"),
    };
    if let Err(e) = s.read_node(|n, _| n.sealed_login_fits(&b.username, &sealed.u, &sealed.a)) {
        return api_error_response(e);
    }
    let source = format!("member {sender} client {}", sealed.s);
    let ticket = match s.with_node(|n, now| n.identity_mut(|i, _| i.login_begin(now, &b.username, &source))) {
        Ok(t) => t,
        Err(refused) => return refusal(refused),
    };
    let params = s.read_node(|n, _| n.password_params());
    let ok = passwords::verify(params, ticket.hash, sealed.p).await;
    let r = s.with_node(|n, now| {
        let r = n.identity_mut(|i, _| i.vouch(now, &b.username, &source, ok));
        n.audit(now, &format!("auth/verify {}", b.username), &source, if r.is_ok() { 200 } else { 401 });
        r
    });
    match r {
        Ok(entry) => axum::Json(json!({"ok": true, "account": entry})).into_response(),
        Err(refused) => refusal(refused),
    }
}

/// A refused login as its answer: 429 with `Retry-After` for a backoff.
fn refusal(refused: LoginRefused) -> Response {
    let mut resp = api_error_response(refused.error);
    if let Some(ms) = refused.retry_after_ms {
        if let Ok(v) = ms.div_ceil(1000).max(1).to_string().parse() {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

/// Where an account change is carried out.
enum Carried {
    /// Here: this node is the origin, or there is none.
    Here,
    /// At the origin, which answered this.
    There(Value),
}

/// `user add|rm|passwd|set` on a member acts at the origin; its directory then comes back here.
async fn carry_act<E: Env>(s: &Arc<Shared<E>>, who: &Principal, act: &AdminAct) -> Result<Carried, ApiError> {
    let name = match act {
        AdminAct::Add { name, .. }
        | AdminAct::Remove { name }
        | AdminAct::Password { name, .. }
        | AdminAct::Set { name, .. } => name,
    };
    let Some((origin, timeout_ms)) = s.read_node(|n, _| n.act_route(name)) else { return Ok(Carried::Here) };
    // Who asks rides along, signed by this node for the origin alone (a user assertion).
    let assertion = s
        .with_node(|n, now| n.user_assertion(now, who, &origin))
        .ok_or_else(|| ApiError::conflict("not_in_cluster", "not in a cluster"))?;
    let req = shoal_core::node::identity::ActRequest { act: act.clone(), assertion };
    let body = serde_json::to_vec(&req).expect("an act serialises");
    let r = peer::signed_within(s, &origin, "POST", "/cluster/acn/auth/admin", body, Vec::new(), timeout_ms)
        .await
        .map_err(|e| {
            ApiError::peer_failed(
                "origin_unreachable",
                format!("the identity origin {origin} could not be reached ({}): try again", e.message),
            )
        })?;
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    if r.status != 200 {
        let kind = crate::wire::error::peer_answer(r.status, Vec::new()).refused.unwrap_or(ErrorKind::PeerFailed);
        let msg = v["error"]["message"].as_str().unwrap_or("refused").to_string();
        return Err(ApiError::new(kind, "origin_refused", format!("the identity origin {origin}: {msg}")));
    }
    s.with_node(|n, now| n.identity_sync_soon(now));
    Ok(Carried::There(v))
}

/// A password for `name` (hashed here): set at the origin; when it cannot be reached and the
/// account is mirrored here, set here and written back later.
async fn set_password_anywhere<E: Env>(
    s: &Arc<Shared<E>>,
    who: &Principal,
    name: &str,
    hash: String,
    keep: Option<String>,
) -> Result<Value, ApiError> {
    let act = AdminAct::Password { name: name.to_string(), hash: hash.clone() };
    match carry_act(s, who, &act).await {
        Ok(Carried::There(v)) => {
            // Here too at once, so this node's sessions follow without waiting for the sync.
            let _ = s.with_node(|n, now| n.identity_mut(|i, _| i.set_password(now, name, hash, keep.as_deref())));
            Ok(v)
        }
        Ok(Carried::Here) => {
            s.with_node(|n, now| n.identity_mut(|i, _| i.set_password(now, name, hash, keep.as_deref()))).map(json_of)
        }
        Err(e) if e.code == "origin_unreachable" && s.read_node(|n, _| n.keeps_for_writeback(name)) => {
            s.with_node(|n, now| n.identity_mut(|i, _| i.set_password_pending(now, name, hash, keep.as_deref())))?;
            Ok(json!({"name": name, "writeBack": "pending", "why": e.message}))
        }
        Err(e) => Err(e),
    }
}

/// `GET /v1/access`: every per-folder rule.
pub(super) async fn access_list<E: Env>(State(s): S<E>) -> Response {
    axum::Json(json!({"rules": s.read_node(|n, _| n.access_rules())})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessBody {
    folder: String,
    group: String,
    /// `read`, `write`, or null to remove the rule.
    mode: Option<shoal_core::identity::access::Mode>,
}

/// `POST /v1/access {folder, group, mode}`: set a rule (`mode: null` removes it).
pub(super) async fn access_set<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result(
        parse_body::<AccessBody>(&body)
            .and_then(|b| s.with_node(|n, now| n.access_set(now, &b.folder, &b.group, b.mode))),
    )
}

/// `GET /v1/identity/status`: the origin, the last sync and forward, skipped and conflicting
/// accounts (the reference's status fields).
pub(super) async fn identity_status<E: Env>(State(s): S<E>) -> Response {
    axum::Json(s.read_node(|n, _| n.identity_status())).into_response()
}

/// `POST /v1/identity/sync`: copy the origin's directory now.
pub(super) async fn identity_sync<E: Env>(State(s): S<E>) -> Response {
    s.with_node(|n, now| n.identity_sync_soon(now));
    axum::Json(json!({"syncing": true})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert("cookie", "a=1; shoal_session=shs_abc ; b=2".parse().unwrap());
        assert_eq!(session_cookie(&h), Some("shs_abc"));
        h.insert("cookie", "shoal_sessionx=1; shoal_session=".parse().unwrap());
        assert_eq!(session_cookie(&h), None);
        assert_eq!(bearer("bearer  T "), Some("T"));
        assert_eq!(bearer("Basic T"), None);
    }
}
