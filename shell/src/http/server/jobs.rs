//! The jobs API (spec "Jobs (AJR / AJS)"): `GET|POST /v1/jobs`, `GET /v1/jobs/{id}`,
//! `.../logs`, `.../output`, `.../explain`, `POST .../cancel`. The core checks, decides and
//! answers; this module only parses the request.

use super::*;
use shoal_core::jobs::submit::JobSubmit;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct ListQuery {
    all: bool,
}

pub(super) async fn jobs_list<E: Env>(
    State(s): S<E>,
    q: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    api_result(Ok::<_, ApiError>(s.read_node(|n, _| n.job_list(q.all))))
}

pub(super) async fn jobs_submit<E: Env>(State(s): S<E>, body: Bytes) -> Response {
    // No accounts yet: the admin token's holder submits as "admin".
    let r = parse_body::<JobSubmit>(&body).and_then(|b| s.with_node(|n, now| n.job_submit(now, "admin", b)));
    api_result(r)
}

pub(super) async fn job_status<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, _| n.job_status(&id)))
}

pub(super) async fn job_logs<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, _| n.job_logs(&id)))
}

pub(super) async fn job_output<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    let r = s.read_node(|n, _| n.job_status(&id));
    api_result(r.map(|v| serde_json::json!({"id": v.id, "status": v.status, "output": v.output, "error": v.error})))
}

pub(super) async fn job_cancel<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, now| n.job_cancel(now, &id)))
}

pub(super) async fn job_explain<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, now| n.job_explain(now, &id)))
}
