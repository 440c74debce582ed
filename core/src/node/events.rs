//! The node's side of the event bus (spec "Packages: events"; [`crate::events`]): raising
//! events where things happen, computing this node's `node.*` view every 5 s, sending the bus's
//! batches (`events/publish`) and taking peers' batches, and the subscribers' reads.

use super::{ApiError, Node, Purpose, Reply};
use crate::events::{self, Event, EventError, PublishBody};
use crate::ids::NodeId;
use crate::membership::NodeState;
use crate::time::Millis;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What the node's `node.*` view last was: each member's state, own volumes low on space.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeView {
    states: BTreeMap<NodeId, NodeState>,
    diskfull: BTreeSet<crate::ids::VolumeId>,
    /// Whether the first look was taken (members known then are not "joined").
    primed: bool,
}

/// `GET /v1/events?follow=false`: the recent events after `since`, and where the ring stands.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPage {
    pub events: Vec<Event>,
    /// The newest sequence number in the ring.
    pub last_seq: u64,
    /// The oldest still kept: a subscriber resuming below it missed events.
    pub first_seq: u64,
}

impl From<EventError> for ApiError {
    fn from(e: EventError) -> ApiError {
        match e {
            EventError::NotApp => ApiError::invalid("bad_event_type", e.to_string()),
            EventError::TooLarge => ApiError::too_large("event_too_large", e.to_string()),
        }
    }
}

impl Node {
    fn live_peers(&self) -> Vec<NodeId> {
        self.members.records().filter(|r| !r.removed && r.id != self.id).map(|r| r.id.clone()).collect()
    }

    /// Raise an event on this node: kept in the ring, fanned out unless it is `node.*`.
    pub(super) fn raise(&mut self, wall: Millis, kind: &str, data: Value) {
        if self.cluster.is_none() {
            return;
        }
        let now = self.clock.peek(wall);
        let e =
            Event { id: self.rng.uuid_v4(), kind: kind.to_string(), time: wall.0, node: self.id.clone(), data, seq: 0 };
        let peers = self.live_peers();
        self.bus.raise(now, e, &peers);
    }

    /// `POST /v1/events`: a user's or script's `app.*` event.
    pub fn event_publish(&mut self, wall: Millis, kind: &str, data: Value) -> Result<Event, ApiError> {
        self.in_cluster()?;
        events::check_app(kind, &data)?;
        self.advance_clocks(wall);
        self.raise(wall, kind, data);
        let (mut last, _) = self.bus.since(self.bus.last_seq().saturating_sub(1), "", 1);
        last.pop().ok_or_else(|| ApiError::internal("event_lost", "the event was not kept"))
    }

    /// Events after `since` matching the type glob `filter`, oldest first, at most `limit`.
    pub fn events_since(&self, since: u64, filter: &str, limit: usize) -> EventPage {
        let (events, last_seq) = self.bus.since(since, filter, limit);
        EventPage { events, last_seq, first_seq: self.bus.first_seq() }
    }

    /// May a WebSocket subscriber with this browser `Origin` read the events? No `Origin` (not a
    /// browser): yes. Otherwise only the node's own origin (the `Host` it was asked at, or its
    /// advertised URL) or one listed in `events.allowed_origins`.
    pub fn events_origin_allowed(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), ApiError> {
        let Some(origin) = origin else { return Ok(()) };
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        let authority = |o: &str| o.split_once("://").map(|(_, rest)| rest.to_string());
        let own_host = host.map(|h| h.trim().to_ascii_lowercase());
        if own_host.is_some() && authority(&origin) == own_host {
            return Ok(());
        }
        let advertised = self.me.advertise_url.trim_end_matches('/').to_ascii_lowercase();
        if !advertised.is_empty() && origin == advertised {
            return Ok(());
        }
        let listed = self
            .config_resolved_own()
            .get("events")
            .and_then(|m| m.get("allowed_origins"))
            .and_then(|r| r.value.clone())
            .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
            .unwrap_or_default();
        if listed.iter().any(|o| o.trim().trim_end_matches('/').eq_ignore_ascii_case(&origin)) {
            return Ok(());
        }
        Err(ApiError::forbidden(
            "foreign_origin",
            format!("origin {origin} may not read this node's events (events.allowed_origins)"),
        ))
    }

    /// The bus's next deadline: a batch due, or the next look at the members.
    pub(super) fn events_next_due(&self) -> Option<Millis> {
        self.cluster.as_ref()?;
        [self.bus.poll_timeout(), Some(self.node_events_due)].into_iter().flatten().min()
    }

    pub(super) fn events_timeout(&mut self, wall: Millis, now: Millis) {
        if now >= self.node_events_due {
            self.node_events(wall, now);
            self.node_events_due = now.plus(events::NODE_EVENTS_EVERY_MS);
        }
        for batch in self.bus.due(now) {
            let body = serde_json::to_vec(&PublishBody { events: batch.events }).expect("serialise");
            self.new_request(wall, now, &batch.to, "POST", "/cluster/acn/events/publish", body, Purpose::Events);
            if !self.in_flight.values().any(|f| f.purpose == Purpose::Events && f.peer == batch.to) {
                // No route to the peer right now: try again later.
                self.bus.sent(now, &batch.to, false);
            }
        }
    }

    /// The answer to a batch this node sent.
    pub(super) fn events_answered(&mut self, now: Millis, peer: &NodeId, delivered: bool) {
        self.bus.sent(now, peer, delivered);
    }

    /// `POST events/publish` from a member.
    pub(super) fn answer_events(&mut self, sender: &NodeId, body: &[u8]) -> Reply {
        let b: PublishBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(super::ErrorKind::Invalid, "bad_body", format!("events body: {e}")),
        };
        let fresh = self.bus.receive(sender, b.events);
        Reply::ok(json!({"ok": true, "new": fresh}))
    }

    /// This node's `node.*` view: members that joined, came online, went offline or left, and
    /// its own volumes that went low on space, since the last look.
    fn node_events(&mut self, wall: Millis, now: Millis) {
        let states: BTreeMap<NodeId, NodeState> = self
            .members
            .records()
            .filter(|r| !r.removed)
            .map(|r| (r.id.clone(), self.members.state(&r.id, now)))
            .collect();
        let diskfull: BTreeSet<crate::ids::VolumeId> =
            self.volumes().filter(|v| self.is_own(v) && v.low_space).map(|v| v.id.clone()).collect();
        let before = std::mem::take(&mut self.node_view);
        let mut raised: Vec<(&'static str, Value)> = Vec::new();
        if before.primed {
            for (id, st) in &states {
                match before.states.get(id) {
                    None => raised.push(("node.joined", json!({"node": id, "state": st}))),
                    Some(old) => {
                        let up = |s: &NodeState| matches!(s, NodeState::Online | NodeState::Degraded);
                        if !up(old) && up(st) {
                            raised.push(("node.online", json!({"node": id, "from": old})));
                        } else if up(old) && *st == NodeState::Offline {
                            raised.push(("node.offline", json!({"node": id, "from": old})));
                        }
                    }
                }
            }
            for id in before.states.keys().filter(|id| !states.contains_key(*id)) {
                raised.push(("node.left", json!({"node": id})));
            }
            for v in diskfull.difference(&before.diskfull) {
                raised.push(("node.diskfull", json!({"node": self.id, "volume": v})));
            }
        }
        self.node_view = NodeView { states, diskfull, primed: true };
        for (kind, data) in raised {
            self.raise(wall, kind, data);
        }
    }
}
