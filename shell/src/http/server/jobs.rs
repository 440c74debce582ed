//! The jobs API (spec "Jobs (AJR / AJS)"): `GET|POST /v1/jobs`, `GET /v1/jobs/{id}`,
//! `.../logs`, `.../output`, `.../explain`, `POST .../cancel`. The core checks, decides and
//! answers; this module only parses the request.

use super::*;
use axum::Extension;
use identity::Authed;
use shoal_core::jobs::submit::JobSubmit;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct ListQuery {
    all: bool,
}

pub(super) async fn jobs_list<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    q: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    api_result(Ok::<_, ApiError>(s.read_node(|n, _| n.job_list_for(&a.principal, q.all))))
}

/// How long a submit or a cancel waits, once written here, for another node to hold it too
/// (as a put does), so the answer survives losing this node.
const RECORD_WAIT_MS: u64 = 3_000;

async fn held_elsewhere<E: Env>(s: &Arc<Shared<E>>, id: &shoal_core::ids::JobId) -> bool {
    let id = id.clone();
    s.wait_for_held(RECORD_WAIT_MS, move |n, _| n.job_held_elsewhere(&id)).await
}

/// `POST /v1/jobs`: the job runs as whoever submits it (issue 15: its `fs` calls obey their
/// access rules), and its inputs must be readable by them.
pub(super) async fn jobs_submit<E: Env>(State(s): S<E>, Extension(a): Extension<Authed>, body: Bytes) -> Response {
    let owner = a.principal.name().to_string();
    let r = parse_body::<JobSubmit>(&body).and_then(|b| {
        s.with_node(|n, now| {
            n.job_submit_access(&a.principal, &b)?;
            n.job_submit(now, &owner, b)
        })
    });
    match r {
        Ok(sub) => {
            let held = held_elsewhere(&s, &sub.id).await;
            api_result(Ok::<_, ApiError>(serde_json::json!({"id": sub.id, "recordReplicated": held})))
        }
        Err(e) => api_result(Err::<(), _>(e)),
    }
}

pub(super) async fn job_status<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    api_result(s.read_node(|n, _| n.job_access(&a.principal, &id).and_then(|_| n.job_status(&id))))
}

pub(super) async fn job_logs<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    api_result(s.read_node(|n, _| n.job_access(&a.principal, &id).and_then(|_| n.job_logs(&id))))
}

pub(super) async fn job_output<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    let r = s.read_node(|n, _| n.job_access(&a.principal, &id).and_then(|_| n.job_status(&id)));
    api_result(r.map(|v| serde_json::json!({"id": v.id, "status": v.status, "output": v.output, "error": v.error})))
}

pub(super) async fn job_cancel<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    match s.with_node(|n, now| n.job_access(&a.principal, &id).and_then(|_| n.job_cancel(now, &id))) {
        Ok(v) => {
            let held = held_elsewhere(&s, &v.id).await;
            let mut body = json_of(v);
            body["recordReplicated"] = serde_json::json!(held);
            api_result(Ok::<_, ApiError>(body))
        }
        Err(e) => api_result(Err::<(), _>(e)),
    }
}

pub(super) async fn job_explain<E: Env>(
    State(s): S<E>,
    Extension(a): Extension<Authed>,
    Path(id): Path<String>,
) -> Response {
    api_result(s.read_node(|n, now| n.job_access(&a.principal, &id).and_then(|_| n.job_explain(now, &id))))
}
