//! The admin API of the configuration plane (mesh-config.md "The verb"): `/v1/config`,
//! proposals, modules, builds and renames.

use super::identity::{account_of, Authed};
use super::*;
use axum::Extension;

// ---- configuration ----

type FilterQuery =
    Result<axum::extract::Query<shoal_core::node::config::ConfigFilter>, axum::extract::rejection::QueryRejection>;

pub(super) async fn config_list<E: Env>(State(s): S<E>, q: FilterQuery) -> Response {
    match q {
        Ok(q) => api_result(Ok(s.read_node(|n, _| n.config_list(&q.0)))),
        Err(e) => error_response(400, "bad_query", e.body_text()),
    }
}

pub(super) async fn config_history<E: Env>(State(s): S<E>, q: FilterQuery) -> Response {
    match q {
        Ok(q) => api_result(Ok(s.read_node(|n, _| n.config_history(&q.0, 1000)))),
        Err(e) => error_response(400, "bad_query", e.body_text()),
    }
}

pub(super) async fn config_resolved<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| json!({ "node": n.id(), "modules": &*n.config_resolved_own() }))))
}

pub(super) async fn config_proposals<E: Env>(State(s): S<E>) -> Response {
    api_result(s.read_node(|n, now| Ok::<_, ApiError>(n.config_proposals(now))))
}

pub(super) async fn config_proposal<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, now| n.config_proposal(now, &id)))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ConfigPost {
    action: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    why: String,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    module: Option<String>,
    /// For a propose: propose a clear instead of a value.
    #[serde(default)]
    clear: bool,
    /// For approve/decline.
    #[serde(default)]
    id: Option<String>,
    /// For an approve: the proposal's value and shown-against value as the admin saw them.
    #[serde(default)]
    seen_value: Option<Value>,
    #[serde(default)]
    seen_shown_against: Option<Value>,
    #[serde(default)]
    seen: bool,
}

pub(super) async fn config_post<E: Env>(State(s): S<E>, authed: Option<Extension<Authed>>, body: Body) -> Response {
    let b: ConfigPost = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return crate::wire::error::api_error_response(e),
    };
    // Who sets, proposes and approves: the signed-in admin (`@admin-token` for the token).
    let account = account_of(authed.as_deref());
    let account = account.as_str();
    let level = || {
        let key = b.key.as_deref().ok_or_else(|| ApiError::invalid("bad_body", "this action needs a key"))?;
        shoal_core::config::level_of(key, b.node.as_deref(), b.module.as_deref())
            .map_err(|e| ApiError::new(e.kind(), e.code(), e.to_string()))
    };
    let r = match b.action.as_str() {
        "set" => match (level(), &b.value) {
            (Ok(l), Some(v)) => s.with_node(|n, now| n.config_set(now, &l, Some(v), &b.why, account)).map(json_of),
            (Ok(_), None) => Err(ApiError::invalid("bad_body", "a set needs a value (or use clear)")),
            (Err(e), _) => Err(e),
        },
        "clear" => {
            level().and_then(|l| s.with_node(|n, now| n.config_set(now, &l, None, &b.why, account))).map(json_of)
        }
        "propose" => level().and_then(|l| {
            let v = if b.clear { None } else { b.value.as_ref() };
            if v.is_none() && !b.clear {
                return Err(ApiError::invalid("bad_body", "a proposal needs a value, or clear: true"));
            }
            s.with_node(|n, now| n.config_propose(now, &l, v, &b.why, account)).map(json_of)
        }),
        "approve" | "decline" => match &b.id {
            Some(id) => {
                let seen = b.seen.then(|| (b.seen_value.clone(), b.seen_shown_against.clone()));
                s.with_node(|n, now| n.config_answer(now, id, b.action == "approve", seen, account)).map(json_of)
            }
            None => Err(ApiError::invalid("bad_body", "approve and decline name the proposal (id)")),
        },
        other => Err(ApiError::invalid(
            "bad_action",
            format!("unknown action {other:?}: set, clear, propose, approve or decline"),
        )),
    };
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

pub(super) async fn modules_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.module_list())))
}

pub(super) async fn module_install<E: Env>(State(s): S<E>, body: Body) -> Response {
    let r = parse_body::<shoal_core::config::resolve::Manifest>(&body)
        .and_then(|m| s.with_node(|n, now| n.module_install(now, &m)));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct PlaceModuleBody {
    node: String,
    #[serde(default = "yes")]
    placed: bool,
}

pub(super) fn yes() -> bool {
    true
}

pub(super) async fn module_place<E: Env>(State(s): S<E>, Path(name): Path<String>, body: Body) -> Response {
    let r = parse_body::<PlaceModuleBody>(&body)
        .and_then(|b| s.with_node(|n, now| n.module_place(now, &name, &b.node, b.placed)));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

pub(super) async fn config_renames<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.config_renames())))
}

pub(super) async fn config_findings<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.config_findings(now))))
}

pub(super) async fn config_events<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.config_events(now))))
}

pub(super) async fn config_retiring<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.config_retiring())))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RetireBody {
    level: String,
    /// `approve`, `ask` or `cancel`.
    action: String,
}

pub(super) async fn config_retire<E: Env>(State(s): S<E>, authed: Option<Extension<Authed>>, body: Body) -> Response {
    let account = account_of(authed.as_deref());
    let r = parse_body::<RetireBody>(&body)
        .and_then(|b| s.with_node(|n, now| n.config_retire(now, &b.level, &b.action, &account)));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}
