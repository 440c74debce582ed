//! The one HTTP listener of a node (DESIGN.md "The shell"): node-to-node ACN under
//! `/cluster/acn/*` (signed, answered by the core), the admin API under `/v1/*` (bearer token),
//! and `/metrics`. Every error is JSON `{"error":{"code","message"}}`; a client's mistake is a
//! 4xx, never a 5xx.

mod admin;
mod config;
mod events;
mod files;
pub mod identity;
mod jobs;
mod sched;

use admin::*;
use config::*;
use events::*;
use files::*;
use identity::*;
use jobs::*;
use sched::*;

use crate::env::Env;
use crate::net::transport::{Transport, TransportError};
use crate::node::handle::Shared;
use crate::wire::error::{api_result, error_response, json_of, reply_response};
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
use shoal_core::meta::machine::WriteMark;
use shoal_core::node::ApiError;
use shoal_core::records::AdminState;
use shoal_core::NodeId;
use std::collections::BTreeMap;
use std::sync::Arc;

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
        .route("/nodes/{id}/wake", post(node_wake::<E>))
        .route("/node/tunnel", get(node_tunnel::<E>))
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
        .route("/events", get(events_get::<E>).post(events_post::<E>))
        .route("/sched/status", get(sched_status::<E>))
        .route("/sched/weights", get(sched_weights::<E>).post(sched_weights_post::<E>))
        .route("/sched/explain", get(sched_explain::<E>))
        .route("/jobs", get(jobs_list::<E>).post(jobs_submit::<E>))
        .route("/jobs/{id}", get(job_status::<E>))
        .route("/jobs/{id}/logs", get(job_logs::<E>))
        .route("/jobs/{id}/output", get(job_output::<E>))
        .route("/jobs/{id}/explain", get(job_explain::<E>))
        .route("/jobs/{id}/cancel", post(job_cancel::<E>))
        .route("/login", post(login::<E>))
        .route("/logout", post(logout::<E>))
        .route("/me", get(me::<E>))
        .route("/me/password", post(me_password::<E>))
        .route("/sessions", get(sessions_list::<E>))
        .route("/sessions/{id}", axum::routing::delete(credential_revoke::<E>))
        .route("/apikeys", get(keys_list::<E>).post(key_new::<E>))
        .route("/apikeys/{id}", axum::routing::delete(credential_revoke::<E>))
        .route("/users", get(users_list::<E>).post(user_add::<E>))
        .route("/users/{name}", post(user_set::<E>).delete(user_remove::<E>))
        .route("/users/{name}/password", post(user_password::<E>))
        .route("/groups", get(groups_list::<E>).post(group_add::<E>))
        .route("/groups/{name}", axum::routing::delete(group_remove::<E>))
        .route("/access", get(access_list::<E>).post(access_set::<E>))
        .route("/identity/status", get(identity_status::<E>))
        .route("/identity/sync", post(identity_sync::<E>))
        .layer(axum::extract::DefaultBodyLimit::max(API_BODY_MAX_BYTES))
        .layer(middleware::from_fn_with_state(shared.clone(), api_gate::<E>));
    Router::new()
        .route("/cluster/acn/{*rest}", any(acn::<E>))
        .route("/metrics", get(metrics::<E>).layer(middleware::from_fn_with_state(shared.clone(), authenticate::<E>)))
        // Probes for systemd, load balancers and Kubernetes: no token, nothing secret in them.
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<E>))
        .nest("/v1", api)
        .fallback(api_not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), outer::<E>))
        .with_state(shared)
}

/// Whatever answered a client error in plain text (an extractor's rejection, say), the client
/// gets the JSON error shape every other error has.
async fn json_errors(resp: Response) -> Response {
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

/// Every `/v1` request passes this one gate, in order: who is asking ([`authenticate_request`]:
/// 401/403 stop it here); a change the store cannot keep ([`write_refused`]) and a body over the
/// limit ([`body_refused`]) are refused; the handler runs; a change that succeeded is answered
/// once it is as safe as `meta.ack` says ([`acknowledge_when_safe`]); and an admin act that
/// changed something goes into the audit log ([`audit_act`]). One middleware rather than one
/// per concern: each layer costs every request a boxed future and a clone of the service
/// below it (issue 18: 9 % of a writing node's CPU with six of them).
async fn api_gate<E: Env>(State(s): S<E>, mut req: Request, next: Next) -> Response {
    let path = identity::path_of(&req);
    if let Some(refused) = authenticate_request(&s, &mut req, &path) {
        return refused;
    }
    let method = req.method().clone();
    let mutating = method != axum::http::Method::GET && method != axum::http::Method::HEAD;
    let who = mutating.then(|| {
        req.extensions().get::<Authed>().map_or_else(|| "admin-token".to_string(), |a| a.principal.name().to_string())
    });
    if let Some(refused) = write_refused(&s, &method).or_else(|| body_refused(&req)) {
        return refused;
    }
    let ack_from =
        shoal_core::node::meta::waits_for_ack(method.as_str(), &path).then(|| s.read_node(|n, _| n.ack_position()));
    let mut resp = next.run(req).await;
    if let Some(from) = ack_from.filter(|_| resp.status().is_success()) {
        acknowledge_when_safe(&s, from, &mut resp).await;
    }
    if let Some(who) = who {
        audit_act(&s, &method, &path, &who, &resp);
    }
    resp
}

/// A declared body over the API limit is refused before any handler runs, on every route,
/// also those that read no body; a body with no declared length is cut at the same limit where
/// it is read. File contents (`PUT /v1/files/...`) are data, bounded by the drive instead.
fn body_refused(req: &Request) -> Option<Response> {
    let is_file_put = req.method() == axum::http::Method::PUT && req.uri().path().starts_with("/files/");
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    (!is_file_put && declared.is_some_and(|n| n > API_BODY_MAX_BYTES as u64)).then(|| {
        error_response(413, "body_too_large", format!("this endpoint's body is limited to {API_BODY_MAX_BYTES} bytes"))
    })
}

/// A change (POST, PUT; a DELETE frees space and goes on) is refused while the core says this
/// node cannot store it ([`shoal_core::node::Node::write_refusal`]: its data dir is full);
/// reads go on.
fn write_refused<E: Env>(s: &Shared<E>, method: &axum::http::Method) -> Option<Response> {
    // Removes stay allowed: they are how an operator frees space.
    if matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::DELETE) {
        return None;
    }
    s.read_node(|n, _| n.write_refusal()).map(|e| api_result::<Value>(Err(e)))
}

pub use crate::node::handle::AckSpan;

/// A change (POST, PUT, DELETE) that succeeded is answered only once it is as safe as
/// `meta.ack` says (the core's [`shoal_core::node::Node::ack_plan`] and `ack_ready`):
/// `replicated`, another node holds every change this node made so far (since `from`, its
/// [`ack_position`](shoal_core::node::Node::ack_position) when the request came in);
/// `durable`, also a commit of this node's store holds them (writes arriving together share
/// it); `local`, at once. The wait is bounded by `meta.ack_wait`; the answer's `x-shoal-ack`
/// header says what was reached (`replicated`, `durable`, `local`, or `unconfirmed` when the
/// bound ran out: the change is made here and travels on, but no other node confirmed it yet;
/// `refused` when the leader refused it: it is made here only).
async fn acknowledge_when_safe<E: Env>(s: &Shared<E>, from: WriteMark, resp: &mut Response) {
    use shoal_core::node::{AckMode, AckReached};
    let plan = match resp.extensions_mut().remove::<AckSpan>() {
        Some(AckSpan(own_from, own_to)) => s.read_node(|n, _| n.ack_plan_between(own_from, own_to)),
        None => s.read_node(|n, _| n.ack_plan(from)),
    };
    let reached = match plan.mode {
        AckMode::Local => "local",
        mode => {
            // Both waits at once, under one bound: the commit (`durable`) runs while the
            // changes travel to another node, rather than after (issue 18).
            let through = s.meta_store.queued_through();
            let started = s.env.monotonic();
            let mut got = None;
            let p = plan.clone();
            let replicated = s.wait_for_held(plan.wait_ms, |n, now| {
                got = n.ack_ready(now, &p);
                got.is_some()
            });
            let committed = async {
                mode != AckMode::Durable
                    || s.meta_store.wait_flushed(through, std::time::Duration::from_millis(plan.wait_ms)).await
            };
            let (_, mut flushed) = tokio::join!(replicated, committed);
            if got == Some(AckReached::Alone) && mode != AckMode::Durable {
                // No other node holds it: `alone` means as safe as this node's disk, so the
                // commit that holds it is waited for (writes arriving together share it). A
                // node alone that crashed right after answering lost what it had answered.
                let spent = s.env.monotonic().since(started);
                let left = std::time::Duration::from_millis(plan.wait_ms.saturating_sub(spent));
                flushed = s.meta_store.wait_flushed(through, left).await;
            }
            match (got, mode, flushed) {
                (Some(AckReached::Refused), _, _) => "refused",
                // Answered 409 by the handlers that make such changes (a remove, a move),
                // which wait for it first; anywhere else it reads as a refusal.
                (Some(AckReached::Changed), _, _) => "refused",
                (Some(AckReached::Unconfirmed), _, _) => "unconfirmed",
                (_, AckMode::Durable, false) | (Some(AckReached::Alone), _, false) | (None, _, _) => "unconfirmed",
                (Some(AckReached::Alone), _, _) => "alone",
                (Some(AckReached::Replicated), AckMode::Durable, true) => "durable",
                (Some(AckReached::Replicated), _, _) => "replicated",
            }
        }
    };
    resp.headers_mut().insert("x-shoal-ack", axum::http::HeaderValue::from_static(reached));
}

/// The node-to-node endpoints the shell answers itself (beside the core's `ACN_ENDPOINTS`).
const SHELL_ACN_ENDPOINTS: &[&str] = &[
    "store/begin",
    "store/chunk",
    "store/commit",
    "store/abort",
    "store/put",
    "store/read",
    "store/stat",
    "store/checksum",
    "store/list",
    "store/mkdir",
    "store/delete",
    "store/rename",
    "repl/task",
    "repl/renew",
    "repl/done",
    "tunnel",
    "auth/verify",
];

/// The `/metrics` route of a request: the router's pattern, except that a node-to-node request
/// to a known endpoint is counted by that endpoint (a fixed set, so the labels stay bounded):
/// which calls between nodes are hot, and which never happen.
fn route_label(pattern: &str, path: &str) -> String {
    if pattern == "/cluster/acn/{*rest}" {
        if let Some(endpoint) = path.strip_prefix("/cluster/acn/") {
            let core = shoal_core::node::ACN_ENDPOINTS.iter().any(|(e, _)| *e == endpoint);
            if core || SHELL_ACN_ENDPOINTS.contains(&endpoint) {
                return path.to_string();
            }
        }
    }
    pattern.to_string()
}

/// Around every request, one middleware (a layer costs each request a boxed future and a clone
/// of the service below it, issue 18): a plain-text client error becomes JSON
/// ([`json_errors`]), and the answer is counted for `/metrics` by the route's pattern (never the
/// path itself; a node-to-node endpoint by its name, [`route_label`]), method and status, with
/// the time to its head.
async fn outer<E: Env>(State(s): S<E>, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().as_str().to_string();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| route_label(p.as_str(), req.uri().path()));
    let resp = json_errors(next.run(req).await).await;
    s.metrics.request(&route, &method, resp.status().as_u16(), started.elapsed().as_secs_f64());
    resp
}

/// `GET /healthz`: the process answers.
async fn healthz() -> Response {
    axum::Json(serde_json::json!({"ok": true})).into_response()
}

/// `GET /readyz`: 200 when in a cluster with a leader known and the metadata caught up, else
/// 503 with the reasons.
async fn readyz<E: Env>(State(s): S<E>) -> Response {
    let r = s.read_node(|n, now| n.readiness(now));
    let status = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(r)).into_response()
}

async fn api_not_found() -> Response {
    error_response(404, "not_found", "no such endpoint")
}

async fn method_not_allowed() -> Response {
    error_response(405, "method_not_allowed", "this endpoint does not take that method")
}

/// Every admin act that changed something (a POST, PUT or DELETE the API took) goes into the
/// cluster's audit log, except file contents written with `PUT /v1/files` (data, not acts).
fn audit_act<E: Env>(s: &Arc<Shared<E>>, method: &axum::http::Method, path: &str, who: &str, resp: &Response) {
    // File contents and app events are data, not acts; a login audits itself (also its failures).
    let data_write = (method == axum::http::Method::PUT && path.starts_with("/v1/files/"))
        || (method == axum::http::Method::POST && path == "/v1/events")
        || path == "/v1/login";
    if !data_write && resp.status().is_success() && !s.disable_cluster {
        let act = format!("{method} {path}");
        let status = resp.status().as_u16();
        s.with_node(|n, now| n.audit(now, &act, who, status));
    }
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
    serde_json::from_slice(slice).map_err(|e| ApiError::invalid("bad_body", format!("request body: {e}")))
}

fn cluster_enabled<E: Env>(s: &Shared<E>) -> Result<(), ApiError> {
    crate::node::handle::cluster_enabled(s)
}

// ---- ACN ----

/// A request body read in full, up to `limit` bytes; `None` when it is longer or breaks off.
/// A large one (a chunk of a copy) is read into an aligned [`crate::disk::Piece`], so that
/// writing it to the disk directly needs no copy of its own.
async fn read_body(body: axum::body::Body, content_length: Option<usize>, limit: usize) -> Option<Bytes> {
    use http_body_util::BodyExt;
    match content_length {
        Some(n) if n >= crate::disk::DIRECT_MIN_BYTES && n <= limit => {
            let mut piece = crate::disk::Piece::new(n);
            let mut body = body;
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.ok()?.into_data() {
                    if piece.len() + data.len() > n {
                        return None;
                    }
                    piece.fill(&data);
                }
            }
            Some(piece.into_bytes())
        }
        _ => axum::body::to_bytes(body, limit).await.ok(),
    }
}

async fn acn<E: Env>(State(s): S<E>, req: Request) -> Response {
    if s.disable_cluster {
        return error_response(404, "not_found", "clustering is disabled on this node");
    }
    if req.uri().path() == shoal_core::tunnel::TUNNEL_PATH {
        return tunnel_upgrade(s, req).await;
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
    let content_length = parts.headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let bytes = match read_body(body, content_length, limit).await {
        Some(b) => b,
        None => {
            return error_response(413, "body_too_large", format!("this request's body is limited to {limit} bytes"))
        }
    };
    let headers = SignedHeaders::from_lookup(|name| parts.headers.get(name).and_then(|v| v.to_str().ok()));
    let target = parts.uri.path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_else(|| "/".into());
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path();
    if path.starts_with("/cluster/acn/relay/") || path == "/cluster/acn/relay" {
        return relay(&s, &method, &target, &parts.headers, headers.as_ref(), bytes).await;
    }
    if path == "/cluster/acn/auth/verify" {
        let verified = s.with_node(|n, now| n.verify_acn(now, &method, &target, headers.as_ref(), &bytes));
        return match (verified, method.as_str()) {
            (Ok(sender), "POST") => identity::acn_verify(&s, sender, &bytes).await,
            (Ok(_), _) => error_response(405, "method_not_allowed", "auth/verify takes POST"),
            (Err(r), _) => reply_response(r),
        };
    }
    let shell_op = path
        .strip_prefix("/cluster/acn/store/")
        .filter(|op| *op != "place")
        .map(|op| ("store", op))
        .or_else(|| path.strip_prefix("/cluster/acn/repl/").map(|op| ("repl", op)));
    if let Some((family, op)) = shell_op {
        // Bytes are moved by the shell; the core only checks who is asking. The body is hashed
        // once: for the signature, as the chunk's SHA-256, and (a chunk of an upload) as the
        // next bytes of its whole file.
        let query = parts.uri.query().unwrap_or("");
        let digest = if family == "store" {
            crate::services::store_service::digest_body(&s, op, query, &bytes)
        } else {
            crate::services::store_service::BodyDigest::of(&bytes)
        };
        let verified =
            s.with_node(|n, now| n.verify_acn_hashed(now, &method, &target, headers.as_ref(), &bytes, &digest.sha));
        let sender = match verified {
            Ok(sender) => sender,
            Err(r) => return reply_response(r),
        };
        if family == "repl" {
            if method != "POST" {
                return error_response(405, "method_not_allowed", "repl endpoints take POST");
            }
            return crate::services::replication::handle_acn(&s, op, &bytes, sender).await;
        }
        match (op, method.as_str()) {
            ("delete", "POST") => {
                return api_result(crate::services::replication::delete_copy(&s, &sender, &bytes).await)
            }
            ("rename", "POST") => return api_result(crate::services::replication::rename_copy(&s, &bytes).await),
            ("delete" | "rename", _) => return error_response(405, "method_not_allowed", "takes POST"),
            _ => {}
        }
        return crate::services::store_service::handle(&s, op, &method, query, &parts.headers, bytes, digest, sender)
            .await;
    }
    let reply = s.with_node(|n, now| n.handle_acn(now, &method, &target, headers.as_ref(), &bytes));
    reply_response(reply)
}

// ---- Reverse tunnel and relay (spec "Routing", "Reverse tunnel") ----

/// Headers a relay forwards, both ways (reference-facts.md "Relay": `Content-Type` and
/// `X-Aroz-*`; shoal's own `X-Shoal-*` answers ride along the same way).
fn relayed_header(name: &str) -> bool {
    let starts = |p: &str| name.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
    name.eq_ignore_ascii_case("content-type") || starts("x-aroz-") || starts("x-shoal-")
}

/// `GET /cluster/acn/tunnel`: a member opens its reverse tunnel here. The signature is
/// checked (401 otherwise) before the WebSocket upgrade is answered.
async fn tunnel_upgrade<E: Env>(s: Arc<Shared<E>>, mut req: Request) -> Response {
    let headers = SignedHeaders::from_lookup(|name| req.headers().get(name).and_then(|v| v.to_str().ok()));
    let target = req.uri().path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_else(|| "/".into());
    let method = req.method().as_str().to_string();
    let peer = match s.with_node(|n, now| n.accept_tunnel(now, &method, &target, headers.as_ref())) {
        Ok(peer) => peer,
        Err(r) => return reply_response(r),
    };
    let upgrade = req.headers().get("upgrade").and_then(|v| v.to_str().ok()).unwrap_or("");
    let Some(key) = req.headers().get("sec-websocket-key").map(|v| v.as_bytes().to_vec()) else {
        return error_response(400, "not_websocket", "the tunnel is a WebSocket upgrade");
    };
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return error_response(400, "not_websocket", "the tunnel is a WebSocket upgrade");
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let io = hyper_util::rt::TokioIo::new(upgraded);
                let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    io,
                    tokio_tungstenite::tungstenite::protocol::Role::Server,
                    Some(crate::net::tunnel::ws_config()),
                )
                .await;
                crate::services::tunnel::host(s, peer, ws).await;
            }
            Err(e) => tracing::warn!(peer = %peer, error = %e, "a tunnel upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(axum::body::Body::empty())
        .unwrap_or_else(|_| error_response(500, "internal", "could not answer the upgrade"))
}

/// `* /cluster/acn/relay/<node>/cluster/acn/...`: forward a signed request over the tunnel
/// `<node>` holds to this node (400 malformed, 401 bad signature, 502 no tunnel or no answer).
async fn relay<E: Env>(
    s: &Arc<Shared<E>>,
    method: &str,
    target: &str,
    raw: &HeaderMap,
    headers: Option<&SignedHeaders>,
    body: Bytes,
) -> Response {
    let (to, original) = match s.with_node(|n, now| n.accept_relay(now, method, target, headers, &body)) {
        Ok(t) => t,
        Err(r) => return reply_response(r),
    };
    let Some(link) = s.transport.tunnels.get(&to) else {
        return error_response(502, "not_tunnelled", format!("node {to} has no tunnel to this node"));
    };
    let forwarded: Vec<(&str, &str)> = raw
        .iter()
        .filter(|(k, _)| relayed_header(k.as_str()))
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        .collect();
    match link.request(method, &original, &forwarded, body, shoal_core::tunnel::RELAY_TIMEOUT_MS).await {
        Ok(r) => {
            let mut b = Response::builder().status(r.status);
            for (k, v) in r.headers.iter().filter(|(k, _)| relayed_header(k.as_str())) {
                b = b.header(k, v);
            }
            b.body(axum::body::Body::from(r.body))
                .unwrap_or_else(|_| error_response(502, "relay_failed", "a malformed answer came through the tunnel"))
        }
        Err(e) => error_response(502, "relay_failed", e.to_string()),
    }
}

/// A request that came through a tunnel, answered by this node's ACN handler as if it had come
/// over HTTP. Only `/cluster/acn/` paths (not a relay, not another tunnel) are taken.
pub fn tunnelled<E: Env>(
    s: Arc<Shared<E>>,
    r: crate::net::tunnel::TunnelledRequest,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::net::client::Response> + Send>> {
    Box::pin(async move {
        let answer = |status: u16, body: Vec<u8>| crate::net::client::Response {
            status,
            headers: Default::default(),
            body: body.into(),
        };
        let path = r.target.split('?').next().unwrap_or("");
        if !path.starts_with("/cluster/acn/")
            || path.starts_with("/cluster/acn/relay")
            || path == shoal_core::tunnel::TUNNEL_PATH
        {
            let body =
                json!({"error": {"code": "not_acn", "message": "only /cluster/acn/ requests go through a tunnel"}});
            return answer(400, body.to_string().into_bytes());
        }
        let mut b = axum::http::Request::builder().method(r.method.as_str()).uri(r.target.as_str());
        for (k, v) in &r.headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let req = match b.body(axum::body::Body::from(r.body)) {
            Ok(req) => req,
            Err(e) => {
                let body = json!({"error": {"code": "bad_request", "message": e.to_string()}});
                return answer(400, body.to_string().into_bytes());
            }
        };
        let resp = acn(State(s), req).await;
        let (parts, body) = resp.into_parts();
        match axum::body::to_bytes(body, crate::net::client::RESPONSE_MAX_BYTES).await {
            Ok(bytes) => {
                crate::net::client::Response { status: parts.status.as_u16(), headers: parts.headers, body: bytes }
            }
            Err(e) => {
                let body = json!({"error": {"code": "body", "message": e.to_string()}});
                answer(502, body.to_string().into_bytes())
            }
        }
    })
}
