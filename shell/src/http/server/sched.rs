//! The scheduling API (spec "Scheduling"): `/v1/sched/status`, `/v1/sched/weights` (GET, and
//! POST `{set: {name: value}, reset, why}`), `/v1/sched/explain?place=SIZE[&path=P]`. The core
//! scores and explains; this module only parses the request.

use super::*;

pub(super) async fn sched_status<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok::<_, ApiError>(s.read_node(|n, now| n.sched_status(now))))
}

pub(super) async fn sched_weights<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok::<_, ApiError>(s.read_node(|n, _| n.sched_weights())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WeightsBody {
    #[serde(default)]
    set: BTreeMap<String, f64>,
    #[serde(default)]
    reset: bool,
    #[serde(default)]
    why: String,
}

pub(super) async fn sched_weights_post<E: Env>(
    State(s): S<E>,
    authed: Option<axum::Extension<super::identity::Authed>>,
    body: Body,
) -> Response {
    let account = super::identity::account_of(authed.as_deref());
    let r = parse_body::<WeightsBody>(&body).and_then(|b| {
        let set: Vec<(String, f64)> = b.set.into_iter().collect();
        s.with_node(|n, now| n.sched_set_weights(now, &set, b.reset, &b.why, &account))
    });
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExplainQuery {
    place: Option<String>,
    path: Option<String>,
    job: Option<String>,
}

pub(super) async fn sched_explain<E: Env>(
    State(s): S<E>,
    q: Result<axum::extract::Query<ExplainQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    let r = match (&q.place, &q.job) {
        (Some(size), None) => match shoal_core::config::types::parse_bytes(size) {
            Some(size) => s.read_node(|n, now| n.sched_explain_place(now, size, q.path.as_deref())),
            None => Err(ApiError::invalid("bad_size", format!("{size:?} is not a size (like 4096, 64MiB, 1GB)"))),
        },
        (None, Some(id)) => s.read_node(|n, now| n.job_explain(now, id)),
        _ => Err(ApiError::invalid("bad_query", "explain takes place=SIZE (with path=P) or job=ID")),
    };
    api_result(r)
}
