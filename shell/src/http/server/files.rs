//! The admin API of the `cluster:/` drive: `/v1/files/{path}` (get, put, delete), move,
//! mkdir and verify, handed to [`crate::services::drive`] and [`crate::services::replication`].

use super::*;
use axum::Extension;
use identity::Authed;
use shoal_core::identity::access::Mode;

/// The caller may `mode` at `path` (the core's rules; a 403 names the rule).
fn may<E: Env>(s: &Shared<E>, a: &Authed, path: &str, mode: Mode) -> Result<(), ApiError> {
    s.read_node(|n, _| n.access_check(&a.principal, path, mode))
}

// ---- the cluster:/ drive ----

pub(super) async fn files_get<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/{path}");
    if let Err(e) = may(&s, &a, &path, Mode::Read) {
        return crate::wire::error::api_error_response(e);
    }
    crate::services::drive::get(s, path, headers).await
}

pub(super) async fn files_put<E: Env>(State(s): S<E>, Path(path): Path<String>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Some(a) = parts.extensions.get::<Authed>().cloned() else {
        return error_response(401, "no_token", "who is asking is not known");
    };
    let path = format!("/{path}");
    if let Err(e) = may(&s, &a, &path, Mode::Write) {
        return crate::wire::error::api_error_response(e);
    }
    crate::services::drive::put(s, path, parts.headers, body, a.principal.name().to_string()).await
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RemoveQuery {
    recursive: bool,
}

pub(super) async fn files_delete<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(path): Path<String>,
    q: Result<axum::extract::Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    let path = format!("/{path}");
    if let Err(e) = may(&s, &a, &path, Mode::Write) {
        return crate::wire::error::api_error_response(e);
    }
    let r = s.with_node(|n, now| {
        let before = n.file_copies_under(&path);
        let from = n.ack_position();
        n.file_remove(now, &path, q.recursive).map(|v| (v, before, AckSpan(from, n.ack_position())))
    });
    match r {
        Ok((v, before, span)) => {
            if let Err(e) = taken_unless_changed(&s, &span).await {
                return crate::wire::error::api_error_response(e);
            }
            let mut v = json_of(v);
            v["deletedNow"] = json!(crate::services::replication::delete_now(&s, before).await);
            with_span(api_result(Ok(v)), span)
        }
        Err(e) => crate::wire::error::api_error_response(e),
    }
}

/// A remove or a move decided on this node is checked by the leader against its own records
/// (`BasedOn`: the file must not have changed since this node's records showed it), and no
/// copy on disk follows it before the leader takes it. Wait for that, within `meta.ack_wait`
/// (not at all with `meta.ack = local`): the copies are then deleted or renamed before the
/// answer, as before, and a change the leader refused is answered 409 `changed` (undone on
/// this node; nothing was removed or moved).
async fn taken_unless_changed<E: Env>(s: &Shared<E>, span: &AckSpan) -> Result<(), ApiError> {
    use shoal_core::node::{AckMode, AckReached};
    let plan = s.read_node(|n, _| n.ack_plan_between(span.0.clone(), span.1.clone()));
    if plan.mode == AckMode::Local {
        return Ok(());
    }
    let mut got = None;
    s.wait_for_held(plan.wait_ms, |n, now| {
        got = n.ack_ready(now, &plan);
        got.is_some()
    })
    .await;
    match got {
        Some(AckReached::Changed) => Err(ApiError::conflict(
            "changed",
            "a file changed on another node after this node's records showed it (its records lagged): \
             what changed was not removed or moved (in a folder, the rest was); look again and retry",
        )),
        _ => Ok(()),
    }
}

/// The answer, acknowledged for exactly the changes of `span` (see [`AckSpan`]).
fn with_span(mut resp: Response, span: AckSpan) -> Response {
    resp.extensions_mut().insert(span);
    resp
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct MoveBody {
    from: String,
    to: String,
}

pub(super) async fn files_move<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    let b = match parse_body::<MoveBody>(&body) {
        Ok(b) => b,
        Err(e) => return crate::wire::error::api_error_response(e),
    };
    if let Err(e) = may(&s, &a, &b.from, Mode::Write).and_then(|_| may(&s, &a, &b.to, Mode::Write)) {
        return crate::wire::error::api_error_response(e);
    }
    let moved = s.with_node(|n, now| {
        let from = n.ack_position();
        n.file_move(now, &b.from, &b.to).map(|m| (m, AckSpan(from, n.ack_position())))
    });
    let (moved, span) = match moved {
        Ok(m) => m,
        Err(e) => return crate::wire::error::api_error_response(e),
    };
    if let Err(e) = taken_unless_changed(&s, &span).await {
        return crate::wire::error::api_error_response(e);
    }
    let mut v = json_of(&moved);
    let pairs = moved.files.into_iter().map(|f| (f.from, f.to, f.copies)).collect();
    v["renamedNow"] = json!(crate::services::replication::rename_now(&s, pairs).await);
    with_span(api_result(Ok(v)), span)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct PathBody {
    path: String,
}

pub(super) async fn files_mkdir<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    api_result(
        parse_body::<PathBody>(&body)
            .and_then(|b| may(&s, &a, &b.path, Mode::Write).map(|_| b))
            .and_then(|b| s.with_node(|n, now| n.file_mkdir(now, &b.path))),
    )
}

pub(super) async fn files_verify<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Body) -> Response {
    match parse_body::<PathBody>(&body).and_then(|b| may(&s, &a, &b.path, Mode::Read).map(|_| b)) {
        Ok(b) => api_result(crate::services::replication::verify(&s, &b.path).await),
        Err(e) => crate::wire::error::api_error_response(e),
    }
}

pub(super) async fn repl_run<E: Env>(State(s): S<E>) -> Response {
    s.repl_kick();
    api_result(Ok(json!({"ok": true})))
}

pub(super) async fn rescan<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(crate::services::replication::rescan(&s).await))
}

pub(super) async fn scrub_now<E: Env>(State(s): S<E>) -> Response {
    s.scrub_kick();
    api_result(Ok(json!({"ok": true})))
}
