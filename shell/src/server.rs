//! The one HTTP listener of a node (DESIGN.md "The shell"): node-to-node ACN under
//! `/cluster/acn/*` (signed, answered by the core), the admin API under `/v1/*` (bearer token),
//! and `/metrics`. Every error is JSON `{"error":{"code","message"}}`; a client's mistake is a
//! 4xx, never a 5xx.

use crate::env::Env;
use crate::http_error::{api_result, error_response, reply_response};
use crate::node_handle::Shared;
use crate::transport::{Transport, TransportError};
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_core::acn::{SignedHeaders, BODY_MAX_BYTES};
use shoal_core::latency::LatencyMatrix;
use shoal_core::node::ApiError;
use shoal_core::records::AdminState;
use shoal_core::NodeId;
use std::collections::BTreeMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Largest body of an unsigned ACN request (hello, join).
const UNSIGNED_BODY_MAX_BYTES: usize = 64 * 1024;
/// Largest admin API request body.
const API_BODY_MAX_BYTES: usize = 1024 * 1024;
const PEER_TIMEOUT_MS: u64 = 10_000;

type S<E> = State<Arc<Shared<E>>>;

pub fn router<E: Env>(shared: Arc<Shared<E>>) -> Router {
    let api = Router::new()
        .route("/cluster/status", get(cluster_status::<E>))
        .route("/cluster/create", post(cluster_create::<E>))
        .route("/cluster/join", post(cluster_join::<E>))
        .route("/cluster/leave", post(cluster_leave::<E>))
        .route("/cluster/config", get(cluster_config_get::<E>).post(cluster_config_set::<E>))
        .route("/tokens", get(tokens_list::<E>).post(tokens_new::<E>))
        .route("/tokens/{id}", axum::routing::delete(tokens_revoke::<E>))
        .route("/nodes", get(nodes_list::<E>))
        .route("/nodes/{id}", get(node_get::<E>).delete(node_remove::<E>))
        .route("/nodes/{id}/state", post(node_state::<E>))
        .route("/nodes/{id}/probe", post(node_probe::<E>))
        .route("/latency", get(latency::<E>))
        .route("/capabilities", get(capabilities::<E>))
        .route("/meta/status", get(meta_status::<E>))
        .route("/meta/ls", get(meta_ls::<E>))
        .route("/meta/stat", get(meta_stat::<E>))
        .route("/policies", get(policy_list::<E>).post(policy_set::<E>))
        .route("/settings", get(settings_list::<E>))
        .route("/volumes", get(volume_list::<E>).post(volume_add::<E>))
        .route("/volumes/{id}", axum::routing::delete(volume_remove::<E>))
        .route("/volumes/{id}/readonly", post(volume_readonly::<E>))
        .route("/volumes/{id}/evacuate", get(volume_evacuate_status::<E>).post(volume_evacuate::<E>))
        .route("/config", get(config_list::<E>).post(config_post::<E>))
        .route("/config/history", get(config_history::<E>))
        .route("/config/resolved", get(config_resolved::<E>))
        .route("/config/proposals", get(config_proposals::<E>))
        .route("/config/proposals/{id}", get(config_proposal::<E>))
        .route("/config/renames", get(config_renames::<E>))
        .route("/config/findings", get(config_findings::<E>))
        .route("/config/events", get(config_events::<E>))
        .route("/config/retiring", get(config_retiring::<E>).post(config_retire::<E>))
        .route("/modules", get(modules_list::<E>).post(module_install::<E>))
        .route("/modules/{name}/placement", post(module_place::<E>))
        .route("/files/{*path}", get(files_get::<E>).put(files_put::<E>).delete(files_delete::<E>))
        .route("/mv", post(files_move::<E>))
        .route("/mkdir", post(files_mkdir::<E>))
        .route("/verify", post(files_verify::<E>))
        .route("/repl/run", post(repl_run::<E>))
        .route("/rescan", post(rescan::<E>))
        .route("/scrub", post(scrub_now::<E>))
        .route("/repl/plan", get(repl_plan::<E>))
        .route("/repl/status", get(repl_status::<E>))
        .route("/settings/{key}", get(setting_get::<E>).put(setting_set::<E>).delete(setting_delete::<E>))
        .fallback(api_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .route("/audit", get(audit_list::<E>))
        .layer(axum::extract::DefaultBodyLimit::max(API_BODY_MAX_BYTES))
        .layer(middleware::from_fn_with_state(shared.clone(), audit_acts::<E>))
        .layer(middleware::from_fn_with_state(shared.clone(), require_token::<E>));
    Router::new()
        .route("/cluster/acn/{*rest}", any(acn::<E>))
        .route("/metrics", get(metrics::<E>).layer(middleware::from_fn_with_state(shared.clone(), require_token::<E>)))
        .nest("/v1", api)
        .fallback(api_not_found)
        .layer(middleware::from_fn(json_errors))
        .with_state(shared)
}

/// Whatever answered a client error in plain text (an extractor's rejection, say), the client
/// gets the JSON error shape every other error has.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !status.is_client_error() || is_json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("bad request").to_string() } else { text };
    error_response(status.as_u16(), "bad_request", message)
}

async fn api_not_found() -> Response {
    error_response(404, "not_found", "no such endpoint")
}

async fn method_not_allowed() -> Response {
    error_response(405, "method_not_allowed", "this endpoint does not take that method")
}

/// The credentials of `Authorization: Bearer T`; the scheme is case-insensitive (RFC 9110
/// 11.1), spaces after it are skipped.
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, rest) = authorization.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The admin token, as `Authorization: Bearer T` (or `X-Shoal-Token: T`), compared in constant time.
async fn require_token<E: Env>(State(s): S<E>, headers: HeaderMap, req: Request, next: Next) -> Response {
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .or_else(|| headers.get("x-shoal-token").and_then(|v| v.to_str().ok()));
    let Some(presented) = presented else {
        return error_response(401, "no_token", "this API needs the admin token (Authorization: Bearer <token>)");
    };
    let ok: bool = presented.trim().as_bytes().ct_eq(s.admin_token.as_bytes()).into();
    if !ok {
        return error_response(401, "bad_token", "the admin token is wrong");
    }
    next.run(req).await
}

/// Every admin act that changed something (a POST, PUT or DELETE the API took) goes into the
/// cluster's audit log, except file contents written with `PUT /v1/files` (data, not acts).
async fn audit_acts<E: Env>(State(s): S<E>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    // Inside the nested /v1 router the prefix is stripped; the act names the whole path.
    let path = req
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map(|u| u.0.path().to_string())
        .unwrap_or_else(|| req.uri().path().to_string());
    let resp = next.run(req).await;
    let mutating = method != axum::http::Method::GET && method != axum::http::Method::HEAD;
    let data_write = method == axum::http::Method::PUT && path.starts_with("/v1/files/");
    if mutating && !data_write && resp.status().is_success() && !s.disable_cluster {
        let act = format!("{method} {path}");
        let status = resp.status().as_u16();
        s.with_node(|n, now| n.audit(now, &act, "admin", status));
    }
    resp
}

async fn audit_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.audit_list(1000))))
}

/// A request body read whole, with its failures (too large, broken stream) answered as JSON.
struct Body(Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(Body(b)),
            Err(rej) => {
                let status = rej.status().as_u16();
                let code = if status == 413 { "body_too_large" } else { "bad_body" };
                Err(error_response(status, code, format!("request body: {}", rej.body_text())))
            }
        }
    }
}

impl std::ops::Deref for Body {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.0
    }
}

fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let slice: &[u8] = if body.iter().all(|b| b.is_ascii_whitespace()) { b"{}" } else { body };
    serde_json::from_slice(slice).map_err(|e| ApiError::new(400, "bad_body", format!("request body: {e}")))
}

fn cluster_enabled<E: Env>(s: &Shared<E>) -> Result<(), ApiError> {
    crate::node_handle::cluster_enabled(s)
}

// ---- ACN ----

async fn acn<E: Env>(State(s): S<E>, req: Request) -> Response {
    if s.disable_cluster {
        return error_response(404, "not_found", "clustering is disabled on this node");
    }
    let (parts, body) = req.into_parts();
    // Unsigned endpoints (hello, join) get small bodies; signed ones are read in full (64 MiB)
    // only once the headers say they come from a member of this cluster.
    let unsigned = matches!(parts.uri.path(), "/cluster/acn/hello" | "/cluster/acn/join");
    let limit = if unsigned {
        UNSIGNED_BODY_MAX_BYTES
    } else {
        let early = SignedHeaders::from_lookup(|name| parts.headers.get(name).and_then(|v| v.to_str().ok()));
        if let Err(r) = s.read_node(|n, now| n.precheck_acn(now, early.as_ref())) {
            return reply_response(r);
        }
        BODY_MAX_BYTES
    };
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(413, "body_too_large", format!("this request's body is limited to {limit} bytes"))
        }
    };
    let headers = SignedHeaders::from_lookup(|name| parts.headers.get(name).and_then(|v| v.to_str().ok()));
    let target = parts.uri.path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_else(|| "/".into());
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path();
    let shell_op = path
        .strip_prefix("/cluster/acn/store/")
        .filter(|op| *op != "place")
        .map(|op| ("store", op))
        .or_else(|| path.strip_prefix("/cluster/acn/repl/").map(|op| ("repl", op)));
    if let Some((family, op)) = shell_op {
        // Bytes are moved by the shell; the core only checks who is asking. The body is hashed
        // once: for the signature, and as the chunk's SHA-256.
        let body_sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        let verified =
            s.with_node(|n, now| n.verify_acn_hashed(now, &method, &target, headers.as_ref(), &bytes, &body_sha));
        let sender = match verified {
            Ok(sender) => sender,
            Err(r) => return reply_response(r),
        };
        if family == "repl" {
            if method != "POST" {
                return error_response(405, "method_not_allowed", "repl endpoints take POST");
            }
            return crate::repl::handle_acn(&s, op, &bytes, sender).await;
        }
        match (op, method.as_str()) {
            ("delete", "POST") => return api_result(crate::repl::delete_copy(&s, &sender, &bytes).await),
            ("rename", "POST") => return api_result(crate::repl::rename_copy(&s, &bytes).await),
            ("delete" | "rename", _) => return error_response(405, "method_not_allowed", "takes POST"),
            _ => {}
        }
        let query = parts.uri.query().unwrap_or("");
        return crate::store_service::handle(&s, op, &method, query, &parts.headers, bytes, body_sha, sender).await;
    }
    let reply = s.with_node(|n, now| n.handle_acn(now, &method, &target, headers.as_ref(), &bytes));
    reply_response(reply)
}

// ---- cluster ----

async fn cluster_status<E: Env>(State(s): S<E>) -> Response {
    let mut v = s.read_node(|n, now| n.status(now));
    v["clusterEnabled"] = json!(!s.disable_cluster);
    (StatusCode::OK, axum::Json(v)).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    name: String,
}

async fn cluster_create<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: CreateBody = parse_body(&body)?;
        s.with_node(|n, now| n.create_cluster(now, &b.name))
    })())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinReq {
    token: String,
}

async fn cluster_join<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result(join(&s, body).await)
}

async fn join<E: Env>(s: &Arc<Shared<E>>, body: Body) -> Result<Value, ApiError> {
    let b: JoinReq = parse_body(&body)?;
    crate::join::join_with_token(s, &b.token).await
}

async fn cluster_leave<E: Env>(State(s): S<E>) -> Response {
    api_result(cluster_enabled(&s).and_then(|_| s.with_node(|n, now| n.leave(now))))
}

async fn cluster_config_get<E: Env>(State(s): S<E>) -> Response {
    let v = s.read_node(|n, _| {
        let m = &n.config().membership;
        json!({
            "node": n.id(),
            "name": n.self_info().name,
            "advertiseUrl": n.self_info().advertise_url,
            "listen": s.listen,
            "dataDir": s.data_dir.display().to_string(),
            "clusterEnabled": !s.disable_cluster,
            "heartbeatIntervalMs": m.heartbeat_interval_ms,
            "onlineWithinMs": m.online_within_ms,
            "unknownWithinMs": m.unknown_within_ms,
        })
    });
    (StatusCode::OK, axum::Json(v)).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigBody {
    name: Option<String>,
    advertise_url: Option<String>,
}

async fn cluster_config_set<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        let b: ConfigBody = parse_body(&body)?;
        s.with_node(|n, now| n.configure(now, b.name.as_deref(), b.advertise_url.as_deref()))
    })())
}

// ---- tokens ----

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TokenBody {
    ttl_hours: Option<u64>,
    /// How many joins the token allows (1 to 1000; absent: any number until it expires).
    uses: Option<u64>,
}

async fn tokens_new<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: TokenBody = parse_body(&body)?;
        s.with_node(|n, now| n.new_token(now, b.ttl_hours, b.uses))
    })())
}

async fn tokens_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.list_tokens())))
}

async fn tokens_revoke<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, _| n.revoke_token(&id)))
}

// ---- nodes ----

async fn nodes_list<E: Env>(State(s): S<E>) -> Response {
    let views = s.read_node(|n, now| n.views(now));
    (StatusCode::OK, axum::Json(json!({ "nodes": views }))).into_response()
}

async fn node_get<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    let view = s.read_node(|n, now| n.views(now).into_iter().find(|v| v.record.id.as_str() == id));
    match view {
        Some(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        None => error_response(404, "unknown_node", format!("no member with id {id}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateBody {
    state: String,
}

async fn node_state<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: StateBody = parse_body(&body)?;
        let state = AdminState::parse(&b.state).ok_or_else(|| {
            ApiError::new(400, "bad_state", format!("state must be maintenance, draining or active, not {:?}", b.state))
        })?;
        s.with_node(|n, now| n.set_admin_state(now, &id, state))
    })())
}

async fn node_remove<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, now| n.remove_node(now, &id)))
}

fn transport_error(e: TransportError) -> ApiError {
    match e {
        TransportError::UnknownPeer(_) => ApiError::new(404, "unknown_node", e.to_string()),
        TransportError::NotInCluster => ApiError::new(409, "not_in_cluster", e.to_string()),
        _ => ApiError::new(502, "unreachable", e.to_string()),
    }
}

async fn node_probe<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(probe(&s, NodeId::new(id)).await)
}

async fn probe<E: Env>(s: &Arc<Shared<E>>, id: NodeId) -> Result<Value, ApiError> {
    let prepared =
        s.with_node(|n, now| Transport::<E>::prepare(n, now, &id, "POST", "/cluster/acn/ping", b"{}".to_vec()));
    let prepared = prepared.map_err(transport_error)?;
    let route = format!("{:?}", prepared.route);
    let started = tokio::time::Instant::now();
    let res = s.transport.send(prepared, PEER_TIMEOUT_MS).await;
    let rtt_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(match res {
        Ok(r) => {
            let reply: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            json!({"node": id, "route": route, "reachable": r.status == 200, "status": r.status, "rttMs": rtt_ms, "reply": reply})
        }
        Err(e) => json!({"node": id, "route": route, "reachable": false, "error": e.to_string()}),
    })
}

async fn latency<E: Env>(State(s): S<E>) -> Response {
    let (me, mine, peers) = s.read_node(|n, _| {
        (n.id().clone(), n.members().latency_vector(), n.members().peers().map(|r| r.id.clone()).collect::<Vec<_>>())
    });
    let mut matrix = LatencyMatrix::default();
    matrix.insert_row(me, mine);
    let mut tasks = Vec::new();
    for p in peers {
        let prepared =
            s.with_node(|n, now| Transport::<E>::prepare(n, now, &p, "GET", "/cluster/acn/latency", Vec::new()));
        let Ok(prepared) = prepared else { continue };
        let transport = s.transport.clone();
        tasks.push((p, tokio::spawn(async move { transport.send(prepared, 5_000).await })));
    }
    let mut unreachable = Vec::new();
    for (p, t) in tasks {
        #[derive(Deserialize)]
        struct Row {
            latency: BTreeMap<NodeId, f64>,
        }
        match t.await {
            Ok(Ok(r)) if r.status == 200 => match serde_json::from_slice::<Row>(&r.body) {
                Ok(row) => matrix.insert_row(p, row.latency),
                Err(_) => unreachable.push(p),
            },
            _ => unreachable.push(p),
        }
    }
    let pairs: Vec<Value> = matrix.pairs().into_iter().map(|(a, b, ms)| json!({"a": a, "b": b, "ms": ms})).collect();
    (StatusCode::OK, axum::Json(json!({"matrix": matrix.rows, "pairs": pairs, "unreachable": unreachable})))
        .into_response()
}

async fn capabilities<E: Env>(State(s): S<E>) -> Response {
    let now = s.env.now();
    let health = s.env.health(&s.data_dir, now);
    let caps = s.read_node(|n, _| n.self_info().capabilities.clone());
    (StatusCode::OK, axum::Json(json!({"capabilities": caps, "health": health}))).into_response()
}

async fn metrics<E: Env>(State(s): S<E>) -> Response {
    let text = s.read_node(|n, now| {
        let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
        for r in n.members().records().filter(|r| !r.removed) {
            *by_state.entry(n.node_state(&r.id, now).as_str()).or_default() += 1;
        }
        let mut out = String::from("# HELP shoal_members Members of this node's cluster by computed state.\n# TYPE shoal_members gauge\n");
        for (st, c) in by_state {
            out.push_str(&format!("shoal_members{{state=\"{st}\"}} {c}\n"));
        }
        out.push_str(&format!(
            "# HELP shoal_in_cluster 1 when this node is in a cluster.\n# TYPE shoal_in_cluster gauge\nshoal_in_cluster {}\n",
            u8::from(n.cluster().is_some())
        ));
        out.push_str(&format!(
            "# HELP shoal_heartbeats_sent_total Heartbeat rounds this node sent.\n# TYPE shoal_heartbeats_sent_total counter\nshoal_heartbeats_sent_total {}\n",
            n.heartbeats_sent()
        ));
        out
    });
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

// ---- metadata ----

#[derive(Deserialize)]
struct PathQuery {
    #[serde(default)]
    path: String,
}

fn path_query(
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<String, ApiError> {
    q.map(|q| q.0.path).map_err(|e| ApiError::new(400, "bad_query", e.body_text()))
}

async fn meta_status<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.meta_status(now))))
}

async fn meta_ls<E: Env>(
    State(s): S<E>,
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    api_result(path_query(q).and_then(|p| s.read_node(|n, _| n.meta_ls(&p))))
}

async fn meta_stat<E: Env>(
    State(s): S<E>,
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    api_result(path_query(q).and_then(|p| s.read_node(|n, _| n.meta_stat(&p))))
}

async fn policy_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.policy_list())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    folder: String,
    replicas: u32,
}

async fn policy_set<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        let b: PolicyBody = parse_body(&body)?;
        s.with_node(|n, now| n.policy_set(now, &b.folder, b.replicas))
    })())
}

async fn settings_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.settings_list())))
}

async fn setting_get<E: Env>(State(s): S<E>, Path(key): Path<String>) -> Response {
    api_result(s.read_node(|n, _| n.setting_get(&key)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingBody {
    value: Value,
}

async fn setting_set<E: Env>(State(s): S<E>, Path(key): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: SettingBody = parse_body(&body)?;
        s.with_node(|n, now| n.setting_set(now, &key, Some(b.value)))
    })())
}

async fn setting_delete<E: Env>(State(s): S<E>, Path(key): Path<String>) -> Response {
    api_result(
        s.read_node(|n, _| n.setting_get(&key)).and_then(|_| s.with_node(|n, now| n.setting_set(now, &key, None))),
    )
}

// ---- volumes ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeAddBody {
    path: String,
    #[serde(default)]
    name: String,
}

async fn volume_add<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: VolumeAddBody = parse_body(&body)?;
        if s.read_node(|n, _| n.cluster().is_none()) {
            return Err(ApiError::new(409, "not_in_cluster", "this node is not in a cluster"));
        }
        let (folder, facts) = crate::volumes::prepare_folder(&s.data_dir, &b.path)?;
        let (free, total) = s.env.disk_usage(std::path::Path::new(&folder));
        s.with_node(|n, now| n.volume_add(now, &folder, &facts, &b.name, total, free))
    })())
}

async fn volume_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.volume_list())))
}

async fn volume_remove<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, now| n.volume_remove(now, &id)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReadOnlyBody {
    read_only: bool,
}

async fn volume_readonly<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: ReadOnlyBody = parse_body(&body)?;
        s.with_node(|n, now| n.volume_set_read_only(now, &id, b.read_only))
    })())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EvacuateBody {
    #[serde(default)]
    cancel: bool,
}

async fn volume_evacuate<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: EvacuateBody = parse_body(&body)?;
        s.with_node(|n, now| n.volume_evacuate(now, &id, !b.cancel))
    })())
}

async fn volume_evacuate_status<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, now| n.volume_evacuation_status(now, &id)))
}

// ---- replication ----

async fn repl_plan<E: Env>(State(s): S<E>) -> Response {
    let in_flight = crate::repl::in_flight(&s);
    api_result(Ok(s.read_node(|n, now| n.replication_plan(now, &in_flight))))
}

async fn repl_status<E: Env>(State(s): S<E>) -> Response {
    let in_flight = crate::repl::in_flight(&s);
    api_result(Ok(s.read_node(|n, now| {
        let p = n.replication_plan(now, &in_flight);
        let mut this_node = s.repl.stats(n.repl_stats(), n.repl_tasks());
        this_node["scrubOverdue"] = json!(n.scrub_overdue(now));
        json!({ "leader": p["leader"], "stats": p["plan"]["stats"], "tasksPlanned": p["plan"]["tasks"].as_array().map(|t| t.len()).unwrap_or(0), "thisNode": this_node })
    })))
}

// ---- the cluster:/ drive ----

async fn files_get<E: Env>(State(s): S<E>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    crate::drive::get(s, format!("/{path}"), headers).await
}

async fn files_put<E: Env>(State(s): S<E>, Path(path): Path<String>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    crate::drive::put(s, format!("/{path}"), parts.headers, body).await
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RemoveQuery {
    recursive: bool,
}

async fn files_delete<E: Env>(
    State(s): S<E>,
    Path(path): Path<String>,
    q: Result<axum::extract::Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    let path = format!("/{path}");
    let r = s.with_node(|n, now| {
        let before = n.file_copies_under(&path);
        n.file_remove(now, &path, q.recursive).map(|v| (v, before))
    });
    match r {
        Ok((mut v, before)) => {
            v["deletedNow"] = json!(crate::repl::delete_now(&s, before).await);
            api_result(Ok(v))
        }
        Err(e) => api_result(Err(e)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MoveBody {
    from: String,
    to: String,
}

async fn files_move<E: Env>(State(s): S<E>, body: Body) -> Response {
    let b = match parse_body::<MoveBody>(&body) {
        Ok(b) => b,
        Err(e) => return api_result(Err(e)),
    };
    let moved = match s.with_node(|n, now| n.file_move(now, &b.from, &b.to)) {
        Ok(m) => m,
        Err(e) => return api_result(Err(e)),
    };
    let mut v = moved.to_json();
    let pairs = moved.files.into_iter().map(|f| (f.from, f.to, f.copies)).collect();
    v["renamedNow"] = json!(crate::repl::rename_now(&s, pairs).await);
    api_result(Ok(v))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PathBody {
    path: String,
}

async fn files_mkdir<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result(parse_body::<PathBody>(&body).and_then(|b| s.with_node(|n, now| n.file_mkdir(now, &b.path))))
}

async fn files_verify<E: Env>(State(s): S<E>, body: Body) -> Response {
    match parse_body::<PathBody>(&body) {
        Ok(b) => api_result(crate::repl::verify(&s, &b.path).await),
        Err(e) => api_result(Err(e)),
    }
}

async fn repl_run<E: Env>(State(s): S<E>) -> Response {
    s.repl_kick();
    api_result(Ok(json!({"ok": true})))
}

async fn rescan<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(crate::repl::rescan(&s).await))
}

async fn scrub_now<E: Env>(State(s): S<E>) -> Response {
    s.scrub_kick();
    api_result(Ok(json!({"ok": true})))
}

// ---- configuration ----

type FilterQuery =
    Result<axum::extract::Query<shoal_core::node::config::ConfigFilter>, axum::extract::rejection::QueryRejection>;

async fn config_list<E: Env>(State(s): S<E>, q: FilterQuery) -> Response {
    match q {
        Ok(q) => api_result(Ok(s.read_node(|n, _| n.config_list(&q.0)))),
        Err(e) => error_response(400, "bad_query", e.body_text()),
    }
}

async fn config_history<E: Env>(State(s): S<E>, q: FilterQuery) -> Response {
    match q {
        Ok(q) => api_result(Ok(s.read_node(|n, _| n.config_history(&q.0, 1000)))),
        Err(e) => error_response(400, "bad_query", e.body_text()),
    }
}

async fn config_resolved<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| json!({ "node": n.id(), "modules": n.config_resolved_own() }))))
}

async fn config_proposals<E: Env>(State(s): S<E>) -> Response {
    api_result(s.read_node(|n, now| n.config_proposals(now, None)))
}

async fn config_proposal<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, now| n.config_proposals(now, Some(&id))))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigPost {
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

async fn config_post<E: Env>(State(s): S<E>, body: Body) -> Response {
    let b: ConfigPost = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_result(Err(e)),
    };
    let account = "admin";
    let level = || {
        let key = b.key.as_deref().ok_or_else(|| ApiError::new(400, "bad_body", "this action needs a key"))?;
        shoal_core::config::level_of(key, b.node.as_deref(), b.module.as_deref())
            .map_err(|e| ApiError::new(e.status(), e.code(), e.to_string()))
    };
    let r = match b.action.as_str() {
        "set" => match (level(), &b.value) {
            (Ok(l), Some(v)) => s.with_node(|n, now| n.config_set(now, &l, Some(v), &b.why, account)),
            (Ok(_), None) => Err(ApiError::new(400, "bad_body", "a set needs a value (or use clear)")),
            (Err(e), _) => Err(e),
        },
        "clear" => level().and_then(|l| s.with_node(|n, now| n.config_set(now, &l, None, &b.why, account))),
        "propose" => level().and_then(|l| {
            let v = if b.clear { None } else { b.value.as_ref() };
            if v.is_none() && !b.clear {
                return Err(ApiError::new(400, "bad_body", "a proposal needs a value, or clear: true"));
            }
            s.with_node(|n, now| n.config_propose(now, &l, v, &b.why, account))
        }),
        "approve" | "decline" => match &b.id {
            Some(id) => {
                let seen = b.seen.then(|| (b.seen_value.clone(), b.seen_shown_against.clone()));
                s.with_node(|n, now| n.config_answer(now, id, b.action == "approve", seen, account))
            }
            None => Err(ApiError::new(400, "bad_body", "approve and decline name the proposal (id)")),
        },
        other => Err(ApiError::new(
            400,
            "bad_action",
            format!("unknown action {other:?}: set, clear, propose, approve or decline"),
        )),
    };
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

async fn modules_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.module_list())))
}

async fn module_install<E: Env>(State(s): S<E>, body: Body) -> Response {
    let r = parse_body::<shoal_core::config::resolve::Manifest>(&body)
        .and_then(|m| s.with_node(|n, now| n.module_install(now, &m)));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PlaceModuleBody {
    node: String,
    #[serde(default = "yes")]
    placed: bool,
}

fn yes() -> bool {
    true
}

async fn module_place<E: Env>(State(s): S<E>, Path(name): Path<String>, body: Body) -> Response {
    let r = parse_body::<PlaceModuleBody>(&body)
        .and_then(|b| s.with_node(|n, now| n.module_place(now, &name, &b.node, b.placed)));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}

async fn config_renames<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.config_renames())))
}

async fn config_findings<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.config_findings(now))))
}

async fn config_events<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.config_events(now))))
}

async fn config_retiring<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.config_retiring())))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RetireBody {
    level: String,
    /// `approve`, `ask` or `cancel`.
    action: String,
}

async fn config_retire<E: Env>(State(s): S<E>, body: Body) -> Response {
    let r = parse_body::<RetireBody>(&body)
        .and_then(|b| s.with_node(|n, now| n.config_retire(now, &b.level, &b.action, "admin")));
    if r.is_ok() {
        s.config_kick();
    }
    api_result(r)
}
