//! The events API (spec "Packages: events"): `GET /v1/events` as a WebSocket (filters `type`
//! glob and `since`), `GET /v1/events?follow=false` for the recent list, `POST /v1/events`
//! for `app.*`. The core keeps the ring and decides who may read; this module carries events
//! to the socket. A subscriber reads from the shared ring at its own pace, so it holds no
//! queue of its own; one that falls behind the ring, or whose socket does not take a message
//! within the send bound, is closed with the reason.

use super::*;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::FromRequestParts;
use shoal_core::events::Event;

/// Events sent to a subscriber per read of the ring.
const PAGE: usize = 500;
/// A subscriber that does not take a message within this long is dropped.
const SEND_BOUND_MS: u64 = 10_000;
/// Close code for a subscriber dropped for being slow (1008: policy violation).
const CLOSE_SLOW: u16 = 1008;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    since: u64,
    follow: Option<bool>,
    limit: Option<usize>,
}

pub(super) async fn events_get<E: Env>(State(s): S<E>, req: Request) -> Response {
    let Some(authed) = req.extensions().get::<super::identity::Authed>().cloned() else {
        return error_response(401, "no_token", "who is asking is not known");
    };
    let who = authed.principal.clone();
    let q = match axum::extract::Query::<EventsQuery>::try_from_uri(req.uri()) {
        Ok(q) => q.0,
        Err(e) => return error_response(400, "bad_query", e.body_text()),
    };
    if q.kind.len() > 256 {
        return error_response(400, "bad_query", "a type filter is at most 256 bytes");
    }
    let upgrade =
        req.headers().get("upgrade").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        if q.follow != Some(false) {
            return error_response(
                400,
                "not_websocket",
                "GET /v1/events is a WebSocket; use follow=false for the recent list",
            );
        }
        let limit = q.limit.unwrap_or(1_000).min(shoal_core::events::RING_MAX);
        return api_result(Ok::<_, ApiError>(s.read_node(|n, _| {
            let mut page = n.events_since(q.since, &q.kind, limit);
            let view = n.access_view(&who);
            page.events.retain(|e| view.event(e));
            page
        })));
    }
    let origin = req.headers().get("origin").and_then(|v| v.to_str().ok()).map(str::to_string);
    let host = req.headers().get("host").and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Err(e) = s.read_node(|n, _| n.events_origin_allowed(origin.as_deref(), host.as_deref())) {
        return crate::wire::error::api_error_response(e);
    }
    let (mut parts, _) = req.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(e) => return error_response(400, "bad_upgrade", e.body_text()),
    };
    let s2 = s.clone();
    ws.on_upgrade(move |socket| subscribe(s2, socket, q.kind, q.since, authed))
}

/// Send every event after `since` that matches `filter` and the subscriber may see (the
/// core's [`shoal_core::node::access::AccessView::event`]), then each new one as it comes. Who
/// they are is asked again for every page: a session ended, a key revoked or an account
/// demoted or removed holds for a feed already open too.
async fn subscribe<E: Env>(
    s: Arc<Shared<E>>,
    mut socket: WebSocket,
    filter: String,
    mut since: u64,
    authed: super::identity::Authed,
) {
    loop {
        let who = match &authed.digest {
            None => Ok(authed.principal.clone()),
            Some(d) => s.read_node(|n, now| n.authenticate(now, d)).map(|(p, _)| p),
        };
        let who = match who {
            Ok(p) => p,
            Err(e) => {
                close(&mut socket, CLOSE_SLOW, format!("signed out: {}", e.message)).await;
                return;
            }
        };
        let (page, visible) = s.read_node(|n, _| {
            let page = n.events_since(since, &filter, PAGE);
            let view = n.access_view(&who);
            let visible: Vec<bool> = page.events.iter().map(|e| view.event(e)).collect();
            (page, visible)
        });
        if since > 0 && since + 1 < page.first_seq {
            let why = format!(
                "fell behind: events after {since} are gone (the ring starts at {}); resume with since={}",
                page.first_seq,
                page.first_seq - 1
            );
            close(&mut socket, CLOSE_SLOW, why).await;
            return;
        }
        if let Some(last) = page.events.last() {
            since = last.seq;
        } else {
            // Nothing matched up to the newest: go on from there.
            since = since.max(page.last_seq);
        }
        for (e, _) in page.events.into_iter().zip(visible).filter(|(_, v)| *v) {
            if !send(&mut socket, &e).await {
                return;
            }
        }
        // Wait for the next input the node takes (or a ping from the client).
        let before = since;
        tokio::select! {
            _ = s.wait_for(30_000, |n, _| n.events_since(before, "", 1).last_seq > before) => {}
            msg = socket.recv() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

async fn send(socket: &mut WebSocket, e: &Event) -> bool {
    let text = serde_json::to_string(e).expect("events serialise");
    let bound = std::time::Duration::from_millis(SEND_BOUND_MS);
    match tokio::time::timeout(bound, socket.send(Message::Text(text.into()))).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            close(socket, CLOSE_SLOW, format!("too slow: a message was not taken within {} s", SEND_BOUND_MS / 1000))
                .await;
            false
        }
    }
}

async fn close(socket: &mut WebSocket, code: u16, reason: String) {
    let frame = CloseFrame { code, reason: reason.into() };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PublishBody {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    data: Value,
}

pub(super) async fn events_post<E: Env>(State(s): S<E>, body: Body) -> Response {
    api_result(
        parse_body::<PublishBody>(&body).and_then(|b| s.with_node(|n, now| n.event_publish(now, &b.kind, b.data))),
    )
}
