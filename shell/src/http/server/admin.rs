//! The admin API of the cluster (spec: "Admin API"): cluster, tokens, nodes, metadata,
//! volumes and replication under `/v1/`.

use super::*;

// ---- cluster ----

pub(super) async fn cluster_status<E: Env>(State(s): S<E>) -> Response {
    let mut v = json_of(s.read_node(|n, now| n.status(now)));
    v["clusterEnabled"] = json!(!s.disable_cluster);
    (StatusCode::OK, axum::Json(v)).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBody {
    #[serde(default)]
    name: String,
}

pub(super) async fn cluster_create<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: CreateBody = parse_body(&body)?;
        s.with_node(|n, now| n.create_cluster(now, &b.name))
    })())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JoinReq {
    token: String,
}

pub(super) async fn cluster_join<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result(join(&s, body).await)
}

pub(super) async fn join<E: Env>(s: &Arc<Shared<E>>, body: Body) -> Result<shoal_core::node::NodeStatus, ApiError> {
    let b: JoinReq = parse_body(&body)?;
    crate::services::join::join_with_token(s, &b.token).await
}

pub(super) async fn cluster_leave<E: Env>(State(s): S<E>) -> Response {
    api_result(cluster_enabled(&s).and_then(|_| s.with_node(|n, now| n.leave(now))))
}

pub(super) async fn cluster_config_get<E: Env>(State(s): S<E>) -> Response {
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
pub(super) struct ConfigBody {
    name: Option<String>,
    advertise_url: Option<String>,
}

pub(super) async fn cluster_config_set<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        let b: ConfigBody = parse_body(&body)?;
        s.with_node(|n, now| n.configure(now, b.name.as_deref(), b.advertise_url.as_deref()))
    })())
}

// ---- tokens ----

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TokenBody {
    ttl_hours: Option<u64>,
    /// How many joins the token allows (1 to 1000; absent: any number until it expires).
    uses: Option<u64>,
}

pub(super) async fn tokens_new<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: TokenBody = parse_body(&body)?;
        s.with_node(|n, now| n.new_token(now, b.ttl_hours, b.uses))
    })())
}

pub(super) async fn tokens_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.list_tokens())))
}

pub(super) async fn tokens_revoke<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, _| n.revoke_token(&id)))
}

// ---- nodes ----

pub(super) async fn nodes_list<E: Env>(State(s): S<E>) -> Response {
    let views = s.read_node(|n, now| n.views(now));
    (StatusCode::OK, axum::Json(json!({ "nodes": views }))).into_response()
}

/// `POST /v1/nodes/{id}/wake`: send the Wake-on-LAN packet for a member from this node and
/// from every member the core asks (each on its own LAN); answers who sent it.
pub(super) async fn node_wake<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    let plan = match s.with_node(|n, now| n.wake_plan(now, &id)) {
        Ok(p) => p,
        Err(e) => return api_result::<Value>(Err(e)),
    };
    let body = serde_json::to_vec(&json!({"macs": plan.macs})).unwrap_or_default();
    let mut tasks = Vec::new();
    for p in &plan.ask {
        let prepared =
            s.with_node(|n, now| Transport::<E>::prepare(n, now, p, "POST", "/cluster/acn/wake", body.clone()));
        let Ok(prepared) = prepared else { continue };
        let transport = s.transport.clone();
        tasks.push((p.clone(), tokio::spawn(async move { transport.send(prepared, 5_000).await })));
    }
    let mut sent_from = vec![s.read_node(|n, _| n.id().clone())];
    let mut failed = Vec::new();
    for (p, t) in tasks {
        match t.await {
            Ok(Ok(r)) if r.status == 200 => sent_from.push(p),
            Ok(Ok(r)) => failed.push(json!({"node": p, "status": r.status})),
            Ok(Err(e)) => failed.push(json!({"node": p, "error": e.to_string()})),
            Err(e) => failed.push(json!({"node": p, "error": e.to_string()})),
        }
    }
    let answer = json!({"node": plan.node, "macs": plan.macs, "sentFrom": sent_from, "failed": failed});
    (StatusCode::OK, axum::Json(answer)).into_response()
}

/// `GET /v1/node/tunnel`: this node's reverse tunnel and the tunnels live on it.
pub(super) async fn node_tunnel<E: Env>(State(s): S<E>) -> Response {
    (StatusCode::OK, axum::Json(s.read_node(|n, _| n.tunnel_status()))).into_response()
}

pub(super) async fn node_get<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    let view = s.read_node(|n, now| n.views(now).into_iter().find(|v| v.record.id.as_str() == id));
    match view {
        Some(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        None => error_response(404, "unknown_node", format!("no member with id {id}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StateBody {
    state: String,
}

pub(super) async fn node_state<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: StateBody = parse_body(&body)?;
        let state = AdminState::parse(&b.state).ok_or_else(|| {
            ApiError::invalid("bad_state", format!("state must be maintenance, draining or active, not {:?}", b.state))
        })?;
        s.with_node(|n, now| n.set_admin_state(now, &id, state))
    })())
}

pub(super) async fn node_remove<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, now| n.remove_node(now, &id)))
}

pub(super) fn transport_error(e: TransportError) -> ApiError {
    match e {
        TransportError::UnknownPeer(_) => ApiError::not_found("unknown_node", e.to_string()),
        TransportError::NotInCluster => ApiError::conflict("not_in_cluster", e.to_string()),
        _ => ApiError::peer_failed("unreachable", e.to_string()),
    }
}

pub(super) async fn node_probe<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(probe(&s, NodeId::new(id)).await)
}

pub(super) async fn probe<E: Env>(s: &Arc<Shared<E>>, id: NodeId) -> Result<Value, ApiError> {
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

pub(super) async fn latency<E: Env>(State(s): S<E>) -> Response {
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

pub(super) async fn capabilities<E: Env>(State(s): S<E>) -> Response {
    let now = s.env.now();
    let health = s.env.health(&s.data_dir, now);
    let caps = s.read_node(|n, _| n.self_info().capabilities.clone());
    (StatusCode::OK, axum::Json(json!({"capabilities": caps, "health": health}))).into_response()
}

pub(super) async fn metrics<E: Env>(State(s): S<E>) -> Response {
    let (gauges, resolve) = s.read_node(|n, now| {
        let started = std::time::Instant::now();
        let _ = n.config_resolved_own();
        (n.gauges(now), started.elapsed().as_secs_f64())
    });
    let text = s.metrics.render(&gauges, &s.store_service.sync_figures, resolve);
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

// ---- metadata ----

#[derive(Deserialize)]
pub(super) struct PathQuery {
    #[serde(default)]
    path: String,
}

pub(super) fn path_query(
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<String, ApiError> {
    q.map(|q| q.0.path).map_err(|e| ApiError::invalid("bad_query", e.body_text()))
}

pub(super) async fn meta_status<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, now| n.meta_status(now))))
}

/// `GET /v1/meta/ls`: what the caller may see only (issue 15 "Access").
pub(super) async fn meta_ls<E: Env>(
    State(s): S<E>,
    axum::Extension(a): axum::Extension<super::identity::Authed>,
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    api_result(path_query(q).and_then(|p| s.read_node(|n, _| n.meta_ls_for(&a.principal, &p))))
}

pub(super) async fn meta_stat<E: Env>(
    State(s): S<E>,
    axum::Extension(a): axum::Extension<super::identity::Authed>,
    q: Result<axum::extract::Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    api_result(path_query(q).and_then(|p| {
        s.read_node(|n, _| {
            n.access_check(&a.principal, &p, shoal_core::identity::access::Mode::Read)?;
            n.meta_stat(&p)
        })
    }))
}

pub(super) async fn policy_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.policy_list())))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyBody {
    folder: String,
    replicas: u32,
}

pub(super) async fn policy_set<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        let b: PolicyBody = parse_body(&body)?;
        s.with_node(|n, now| n.policy_set(now, &b.folder, b.replicas))
    })())
}

pub(super) async fn settings_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.settings_list())))
}

pub(super) async fn setting_get<E: Env>(State(s): S<E>, Path(key): Path<String>) -> Response {
    api_result(s.read_node(|n, _| n.setting_get(&key)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettingBody {
    value: Value,
}

pub(super) async fn setting_set<E: Env>(State(s): S<E>, Path(key): Path<String>, body: Body) -> Response {
    let b: SettingBody = match parse_body(&body) {
        Ok(b) => b,
        Err(e) => return api_result::<()>(Err(e)),
    };
    // The one change, with the marks around it: the acknowledgement waits for it alone.
    let (r, span) = s.with_node(|n, now| {
        let from = n.ack_position();
        let r = n.setting_set(now, &key, Some(b.value));
        (r, super::AckSpan(from, n.ack_position()))
    });
    let mut resp = api_result(r);
    resp.extensions_mut().insert(span);
    resp
}

pub(super) async fn setting_delete<E: Env>(State(s): S<E>, Path(key): Path<String>) -> Response {
    api_result(
        s.read_node(|n, _| n.setting_get(&key)).and_then(|_| s.with_node(|n, now| n.setting_set(now, &key, None))),
    )
}

// ---- volumes ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct VolumeAddBody {
    path: String,
    #[serde(default)]
    name: String,
    /// Create the folder when it does not exist (otherwise refused).
    #[serde(default)]
    create: bool,
}

pub(super) async fn volume_add<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result((|| {
        cluster_enabled(&s)?;
        let b: VolumeAddBody = parse_body(&body)?;
        if s.read_node(|n, _| n.cluster().is_none()) {
            return Err(ApiError::conflict("not_in_cluster", "this node is not in a cluster"));
        }
        let (folder, facts) = crate::disk::volumes::prepare_folder(&s.data_dir, &b.path, b.create)?;
        let (free, total) = s.env.disk_usage(std::path::Path::new(&folder));
        s.with_node(|n, now| n.volume_add(now, &folder, &facts, &b.name, total, free))
    })())
}

pub(super) async fn volume_list<E: Env>(State(s): S<E>) -> Response {
    api_result(Ok(s.read_node(|n, _| n.volume_list())))
}

pub(super) async fn volume_remove<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.with_node(|n, now| n.volume_remove(now, &id)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ReadOnlyBody {
    read_only: bool,
}

pub(super) async fn volume_readonly<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: ReadOnlyBody = parse_body(&body)?;
        s.with_node(|n, now| n.volume_set_read_only(now, &id, b.read_only))
    })())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct EvacuateBody {
    #[serde(default)]
    cancel: bool,
}

pub(super) async fn volume_evacuate<E: Env>(State(s): S<E>, Path(id): Path<String>, body: Body) -> Response {
    api_result((|| {
        let b: EvacuateBody = parse_body(&body)?;
        s.with_node(|n, now| n.volume_evacuate(now, &id, !b.cancel))
    })())
}

pub(super) async fn volume_evacuate_status<E: Env>(State(s): S<E>, Path(id): Path<String>) -> Response {
    api_result(s.read_node(|n, now| n.volume_evacuation_status(now, &id)))
}

// ---- replication ----

pub(super) async fn repl_plan<E: Env>(State(s): S<E>) -> Response {
    let in_flight = crate::services::replication::in_flight(&s);
    api_result(Ok(s.read_node(|n, now| n.replication_plan(now, &in_flight))))
}

pub(super) async fn repl_status<E: Env>(State(s): S<E>) -> Response {
    let in_flight = crate::services::replication::in_flight(&s);
    api_result(Ok(s.read_node(|n, now| {
        let p = n.replication_plan(now, &in_flight);
        let mut this_node = s.repl.stats(n.repl_stats(), n.repl_tasks(), n.working());
        this_node["scrubOverdue"] = json!(n.scrub_overdue(now));
        json!({ "leader": p.leader, "stats": p.plan.stats, "tasksPlanned": p.plan.tasks.len(), "thisNode": this_node })
    })))
}
