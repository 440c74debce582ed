//! This node's part in the reverse tunnel and the relay (spec: cluster-runtime.md "Routing",
//! "Reverse tunnel"; the rules are `crate::tunnel`): when to open its own tunnel and to which
//! host (announced as [`Output::TunnelOpen`] on the node's timer), the tunnels live on this
//! node (either end), the route to each peer, and who may open a tunnel to or relay through
//! this node. The shell owns the sockets and reports what happened to them.

use super::{Node, Output, Reply};
use crate::acn::SignedHeaders;
use crate::answer::ErrorKind;
use crate::ids::NodeId;
use crate::time::Millis;
use crate::tunnel::{self, Route, RouteError, TunnelState};
use serde::Serialize;

/// `GET /v1/node/tunnel`: this node's own tunnel and the tunnels it hosts.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelStatus {
    /// Whether this node wants a tunnel (no advertised URL, or a preferred host set).
    pub wanted: bool,
    #[serde(flatten)]
    pub state: TunnelState,
    /// The host the admin prefers (`--tunnel-via`), used only while it is ONLINE.
    pub preferred: Option<NodeId>,
    /// Members whose tunnel to this node is live.
    pub linked: Vec<NodeId>,
}

impl Node {
    /// The route a request to `to` takes (reference-facts.md "Route").
    pub fn route_to(&self, to: &NodeId) -> Result<Route, RouteError> {
        tunnel::route(&self.members, &self.id, to, self.linked.contains(to))
    }

    /// The certificate pin a connection along `route` to `to` is held to ([`tunnel::route_pin`]).
    pub fn route_pin(&self, to: &NodeId, route: &Route) -> String {
        tunnel::route_pin(&self.members, to, route)
    }

    /// Prefer `host` for this node's tunnel (`serve --tunnel-via`); with one set the node
    /// keeps a tunnel even when it has an advertised URL.
    pub fn set_tunnel_preference(&mut self, host: Option<NodeId>) {
        self.tunnel_preferred = host;
    }

    pub fn tunnel_status(&self) -> TunnelStatus {
        TunnelStatus {
            wanted: self.tunnel.wanted(),
            state: self.tunnel.state().clone(),
            preferred: self.tunnel_preferred.clone(),
            linked: self.linked.iter().cloned().collect(),
        }
    }

    fn tunnel_wanted(&self) -> bool {
        self.cluster.is_some() && (self.me.advertise_url.is_empty() || self.tunnel_preferred.is_some())
    }

    /// When the tunnel client next has something to do (`poll_timeout`).
    pub(super) fn tunnel_deadline(&self) -> Option<Millis> {
        if self.tunnel_wanted() != self.tunnel.wanted() {
            return Some(Millis::ZERO);
        }
        self.tunnel.deadline()
    }

    /// On the node's timer: start or stop wanting a tunnel, and open one when a try is due.
    pub(super) fn tunnel_timeout(&mut self, now: Millis) {
        let wanted = self.tunnel_wanted();
        if wanted != self.tunnel.wanted() {
            if let Some(host) = self.tunnel.set_wanted(wanted, now) {
                self.push_output(Output::TunnelClose { host });
            }
        }
        let (members, me, preferred) = (&self.members, &self.id, self.tunnel_preferred.as_ref());
        let host = self.tunnel.due(now, |failed| tunnel::pick_host(members, me, preferred, failed, now));
        if let Some(host) = host {
            let url = self.members.get(&host).map(|r| r.advertise_url.clone()).unwrap_or_default();
            self.push_output(Output::TunnelOpen { host, url });
        }
    }

    /// This node's tunnel to `host` is up: requests to this node now come through it, and its
    /// record says so (`tunnelVia`), so the others relay through `host`. `false` when the
    /// tunnel was not being opened any more (the shell then drops the socket). This node still
    /// reaches `host` at its URL (the spec's first route is a tunnel that terminates here).
    pub fn tunnel_opened(&mut self, wall: Millis, host: &NodeId) -> bool {
        let now = self.advance_clocks(wall);
        if !self.tunnel.opened(host, now) {
            return false;
        }
        self.refresh_own_record(wall, now);
        true
    }

    /// This node's tunnel to `host` failed to open, or closed: try again after the backoff.
    /// The record keeps naming the last host until another tunnel is up (a relay through it
    /// answers 502 meanwhile, and the caller tries again).
    pub fn tunnel_closed(&mut self, wall: Millis, host: &NodeId) {
        let now = self.advance_clocks(wall);
        self.tunnel.failed(host, now);
    }

    /// The host of this node's live tunnel, for its record.
    pub(super) fn tunnel_via(&self) -> String {
        match self.tunnel.state() {
            TunnelState::Up { host, .. } => host.to_string(),
            // Between tunnels: the last host, so peers keep trying it rather than nothing.
            _ => self.members.get(&self.id).map(|r| r.tunnel_via.clone()).unwrap_or_default(),
        }
    }

    /// A member's tunnel to this node is live (registered by the shell).
    pub fn link_up(&mut self, wall: Millis, peer: &NodeId) {
        self.linked.insert(peer.clone());
        self.link_seen(wall, peer);
    }

    pub fn link_down(&mut self, peer: &NodeId) {
        self.linked.remove(peer);
    }

    /// A frame or a ping came from `peer` over its tunnel: it is alive (its last-seen, which
    /// heartbeats gossip on, so every member sees a tunnelled node ONLINE).
    pub fn link_seen(&mut self, wall: Millis, peer: &NodeId) {
        let now = self.advance_clocks(wall);
        if self.members.get(peer).is_some_and(|r| !r.removed) {
            self.members.saw_at(peer, now, now);
        }
    }

    /// Sign a request to `to` with its timestamp on `to`'s clock as this node knows it (the
    /// offset learned from `to`'s answers). For the tunnel upgrade: a host learns a NAT node's
    /// clock offset only from its own requests to it, which need the tunnel, so without this a
    /// NAT node whose clock is more than 300 s off a member's could never tunnel to it.
    pub fn sign_for(
        &mut self,
        wall: Millis,
        to: &NodeId,
        method: &str,
        target: &str,
        body: &[u8],
    ) -> Option<SignedHeaders> {
        let offset = self.members.clock_offset_ms(to);
        let at = Millis(wall.0.saturating_add_signed(offset));
        self.sign(at, method, target, body)
    }

    /// `GET /cluster/acn/tunnel`: a member asks to open its tunnel here. The signature covers
    /// the upgrade request (empty body); returns the member.
    pub fn accept_tunnel(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
    ) -> Result<NodeId, Reply> {
        if !method.eq_ignore_ascii_case("GET") {
            return Err(Reply::error(ErrorKind::WrongMethod, "method_not_allowed", "the tunnel upgrade takes GET"));
        }
        let now = self.advance_clocks(wall);
        let sender = self.verify_signed(wall, now, "GET", target, headers, &[], None)?;
        if sender == self.id {
            return Err(Reply::error(ErrorKind::Invalid, "tunnel_to_self", "a node cannot tunnel to itself"));
        }
        Ok(sender)
    }

    /// `* /cluster/acn/relay/<node>/cluster/acn/...`: check a request to forward over the
    /// tunnel of `<node>`. 400 for a malformed path or one not under `/cluster/acn/`, 401 when
    /// the signature (made over the original target) does not hold, 502 when `<node>` has no
    /// tunnel here. Returns the node and the original target.
    pub fn accept_relay(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
    ) -> Result<(NodeId, String), Reply> {
        let (to, original) = tunnel::parse_relay_target(target)
            .map_err(|e| Reply::error(ErrorKind::Invalid, "bad_relay_path", e.to_string()))?;
        let original = original.to_string();
        let now = self.advance_clocks(wall);
        self.verify_signed(wall, now, method, &original, headers, body, None)?;
        if !self.linked.contains(&to) {
            return Err(Reply::error(
                ErrorKind::PeerFailed,
                "not_tunnelled",
                format!("node {to} has no tunnel to this node"),
            ));
        }
        Ok((to, original))
    }
}

/// `POST /v1/nodes/{id}/wake`: who sends the magic packet for which addresses.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WakePlan {
    pub node: NodeId,
    /// The sleeping node's MAC addresses, as its record reports them.
    pub macs: Vec<String>,
    /// Members asked to broadcast the packet on their own LAN (`POST /cluster/acn/wake`):
    /// every ONLINE or DEGRADED member this node can reach. No member knows which LAN it
    /// shares with the sleeping one, and a magic packet is harmless where its MAC is absent,
    /// so all of them send it (this node too); the one on the same LAN wakes it.
    pub ask: Vec<NodeId>,
}

#[derive(serde::Deserialize)]
struct WakeBody {
    macs: Vec<String>,
}

impl Node {
    /// Plan waking member `id` (it must have reported a MAC address and be another node).
    pub fn wake_plan(&mut self, wall: Millis, id: &str) -> Result<WakePlan, crate::node::ApiError> {
        use crate::node::ApiError;
        let now = self.advance_clocks(wall);
        let id = self.known_peer(id)?;
        if id == self.id {
            return Err(ApiError::invalid("is_self", "this node is awake: it answered"));
        }
        let macs = self.members.get(&id).map(|r| r.capabilities.macs.clone()).unwrap_or_default();
        if macs.is_empty() {
            return Err(ApiError::conflict("no_mac", format!("node {id} reported no MAC address to wake it by")));
        }
        let ask = self
            .members
            .peers()
            .filter(|r| !r.removed && r.id != id)
            .map(|r| r.id.clone())
            .filter(|p| {
                matches!(
                    self.members.state(p, now),
                    crate::membership::NodeState::Online | crate::membership::NodeState::Degraded
                ) && self.route_to(p).is_ok()
            })
            .collect();
        self.push_output(Output::WakeBroadcast { macs: macs.clone() });
        Ok(WakePlan { node: id, macs, ask })
    }

    /// `POST /cluster/acn/wake {macs}` from a member: the addresses to broadcast a magic packet
    /// for, each one a current member reported (this node is no packet cannon for strangers).
    pub(super) fn answer_wake(&mut self, body: &[u8]) -> Reply {
        let b: WakeBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(ErrorKind::Invalid, "bad_body", format!("wake body: {e}")),
        };
        if b.macs.is_empty() || b.macs.len() > crate::wake::MACS_MAX {
            return Reply::error(ErrorKind::Invalid, "bad_body", "wake needs 1 to 16 MAC addresses");
        }
        let known = |m: &String| {
            self.members.records().any(|r| !r.removed && r.capabilities.macs.iter().any(|x| x.eq_ignore_ascii_case(m)))
        };
        if let Some(m) = b.macs.iter().find(|m| crate::wake::parse_mac(m).is_none() || !known(m)) {
            return Reply::error(ErrorKind::Forbidden, "unknown_mac", format!("{m} is no member's MAC address"));
        }
        self.push_output(Output::WakeBroadcast { macs: b.macs.clone() });
        Reply::ok(serde_json::json!({"ok": true, "macs": b.macs}))
    }
}
