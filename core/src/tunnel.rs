//! Nodes behind NAT: the reverse tunnel's frames, the relay's paths, the choice of a tunnel
//! host and of a route (spec: cluster-runtime.md "Routing", "Reverse tunnel"; reference-facts.md
//! "Relay", "Route", "Tunnel frame"; weakness 8).
//!
//! A node without an advertised URL opens one WebSocket to a reachable member (its *host*);
//! requests to it travel as binary frames on that socket, several in flight at once in both
//! directions. Everything here is pure: the shell moves the frames and owns the socket, the
//! rules of what a frame is, which host to pick, when to try again and which route a request
//! takes live here, where the simulator and the unit tests drive them.
//!
//! - A frame is `[kind: 1 request | 2 response][u32 BE header length][header JSON][body]`, at
//!   most [`FRAME_MAX`] bytes with its 5-byte prefix. The header is `{id, m, t, s, h}`: a
//!   16-byte hex id pairing a response with its request, the method and target (requests), the
//!   status (responses), and the headers as `{name: [values]}`.
//! - A relay path is `/cluster/acn/relay/<node>/cluster/acn/...`: the relay forwards the
//!   original path (the part from the second `/cluster/acn/`) over the tunnel of `<node>`.
//! - Routes, in the reference's order: a live tunnel that terminates here, then the advertised
//!   URL, then a relay through the node the target is tunnelled to.
//! - Hosts: the admin's preferred one only while it is ONLINE with a URL (unlike the
//!   reference, weakness 8), else the healthiest reachable member: ONLINE before DEGRADED,
//!   then the most recently seen, then the smaller id.
//! - Retries ([`TunnelClient`]): after a failed or closed tunnel, wait 2 s doubling to 64 s;
//!   5 s when no host is available; the backoff starts over once a tunnel has stayed up a while.

use crate::ids::NodeId;
use crate::membership::{Membership, NodeState};
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest frame, its 5-byte prefix included (16 MiB: a 4 MiB chunk and its headers fit).
pub const FRAME_MAX: usize = 16 << 20;
/// Bytes before the header JSON: the kind and the header length.
pub const FRAME_PREFIX: usize = 5;
/// Both ends ping this often, so an idle proxy (Cloudflare: 100 s) never closes the socket.
pub const PING_EVERY_MS: u64 = 30_000;
/// A tunnel that brings nothing (not even a ping) for this long is closed.
pub const READ_DEADLINE_MS: u64 = 90_000;
/// A frame that cannot be written within this closes the tunnel.
pub const WRITE_DEADLINE_MS: u64 = 60_000;
/// The WebSocket upgrade must be done within this.
pub const HANDSHAKE_MS: u64 = 20_000;
/// The core gives a handshake up this much after the shell's own deadline, so a socket the
/// shell opened in time is never one the core already gave up.
pub const HANDSHAKE_GRACE_MS: u64 = 5_000;
/// Wait before looking for a host again when none is available.
pub const NO_HOST_RETRY_MS: u64 = 5_000;
/// First wait after a failed or closed tunnel; it doubles up to [`BACKOFF_MAX_MS`].
pub const BACKOFF_MIN_MS: u64 = 2_000;
pub const BACKOFF_MAX_MS: u64 = 64_000;
/// A tunnel up this long counts as a success: the next failure waits [`BACKOFF_MIN_MS`] again.
pub const STABLE_AFTER_MS: u64 = 60_000;
/// A relayed request (or one sent over a tunnel) gets its answer within this.
pub const RELAY_TIMEOUT_MS: u64 = 60_000;

const ACN: &str = "/cluster/acn/";
const RELAY: &str = "/cluster/acn/relay/";
/// The path of the tunnel upgrade.
pub const TUNNEL_PATH: &str = "/cluster/acn/tunnel";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 1,
    Response = 2,
}

/// A frame's header: `{id, m, t, s, h}` (reference-facts.md "Tunnel frame").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameHeader {
    /// 16 bytes in hex: pairs a response with its request.
    pub id: String,
    /// Method (requests).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub m: String,
    /// Target: path and query (requests).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub t: String,
    /// Status (responses).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub s: u16,
    /// Headers, each name with its values in order.
    #[serde(default)]
    pub h: BTreeMap<String, Vec<String>>,
}

fn is_zero(s: &u16) -> bool {
    *s == 0
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub header: FrameHeader,
    pub body: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a tunnel frame needs at least {FRAME_PREFIX} bytes, got {0}")]
    Short(usize),
    #[error("unknown tunnel frame kind {0}")]
    Kind(u8),
    #[error("the frame's header length {0} runs past its end")]
    HeaderLength(u32),
    #[error("bad tunnel frame header: {0}")]
    Header(String),
    #[error("a tunnel frame of {0} bytes is over the {FRAME_MAX}-byte cap")]
    TooLarge(usize),
    #[error("a tunnel frame id must be 32 hex digits")]
    Id,
}

impl FrameHeader {
    /// The first value of header `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.h.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.first()).map(String::as_str)
    }
}

fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A frame as bytes; refuses one over [`FRAME_MAX`] or with a malformed id.
pub fn encode(f: &Frame) -> Result<Vec<u8>, FrameError> {
    encode_parts(f.kind, &f.header, &f.body)
}

/// [`encode`] from borrowed parts, so a body is copied once, straight into the frame.
pub fn encode_parts(kind: FrameKind, header: &FrameHeader, body: &[u8]) -> Result<Vec<u8>, FrameError> {
    if !valid_id(&header.id) {
        return Err(FrameError::Id);
    }
    let header = serde_json::to_vec(header).map_err(|e| FrameError::Header(e.to_string()))?;
    let len = FRAME_PREFIX + header.len() + body.len();
    if len > FRAME_MAX {
        return Err(FrameError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(len);
    out.push(kind as u8);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    Ok(out)
}

/// Bytes as a frame: a typed error for anything short, oversized, of an unknown kind, with a
/// header length past the end, a header that is not the JSON above, or a malformed id.
pub fn decode(b: &[u8]) -> Result<Frame, FrameError> {
    if b.len() < FRAME_PREFIX {
        return Err(FrameError::Short(b.len()));
    }
    if b.len() > FRAME_MAX {
        return Err(FrameError::TooLarge(b.len()));
    }
    let kind = match b[0] {
        1 => FrameKind::Request,
        2 => FrameKind::Response,
        k => return Err(FrameError::Kind(k)),
    };
    let hlen = u32::from_be_bytes([b[1], b[2], b[3], b[4]]);
    let end =
        FRAME_PREFIX.checked_add(hlen as usize).filter(|e| *e <= b.len()).ok_or(FrameError::HeaderLength(hlen))?;
    let header: FrameHeader =
        serde_json::from_slice(&b[FRAME_PREFIX..end]).map_err(|e| FrameError::Header(e.to_string()))?;
    if !valid_id(&header.id) {
        return Err(FrameError::Id);
    }
    Ok(Frame { kind, header, body: b[end..].to_vec() })
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RelayPathError {
    #[error("not a relay path: /cluster/acn/relay/<node>/cluster/acn/...")]
    Malformed,
    #[error("a relay forwards only to /cluster/acn/ paths")]
    NotAcn,
}

/// `/cluster/acn/relay/<node>/cluster/acn/...` (query kept) → the target node and the original
/// target. `/cluster/acn/relay/`, `/cluster/acn/relay/node-b` and a path whose rest is not under
/// `/cluster/acn/` (or is itself a relay or the tunnel upgrade) are refused.
pub fn parse_relay_target(target: &str) -> Result<(NodeId, &str), RelayPathError> {
    let rest = target.strip_prefix(RELAY).ok_or(RelayPathError::Malformed)?;
    let slash = rest.find('/').ok_or(RelayPathError::Malformed)?;
    let (node, original) = rest.split_at(slash);
    if node.is_empty() || node.contains('?') || !node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(RelayPathError::Malformed);
    }
    let path = original.split('?').next().unwrap_or("");
    if !path.starts_with(ACN) || path.len() == ACN.len() {
        return Err(RelayPathError::NotAcn);
    }
    if path.starts_with(RELAY) || path == TUNNEL_PATH {
        return Err(RelayPathError::NotAcn);
    }
    Ok((NodeId::new(node), original))
}

/// The relay target for `original` sent to `to` through its host.
pub fn relay_target(to: &NodeId, original: &str) -> String {
    format!("{RELAY}{to}{original}")
}

/// The tunnel host for `me`: `preferred` while it is ONLINE with a URL (weakness 8: never an
/// offline one), else the healthiest reachable member with a URL: ONLINE before DEGRADED, then
/// the most recently seen, then the smaller id. `exclude` is a host that just failed (tried
/// last, and only if nothing else qualifies).
pub fn pick_host(
    members: &Membership,
    me: &NodeId,
    preferred: Option<&NodeId>,
    exclude: Option<&NodeId>,
    now: Millis,
) -> Option<NodeId> {
    let usable = |id: &NodeId, states: &[NodeState]| {
        id != me
            && members
                .get(id)
                .is_some_and(|r| !r.removed && !r.advertise_url.is_empty() && states.contains(&members.state(id, now)))
    };
    if let Some(p) = preferred.filter(|p| usable(p, &[NodeState::Online])) {
        return Some(p.clone());
    }
    let rank = |id: &NodeId| {
        let state = if members.state(id, now) == NodeState::Online { 0 } else { 1 };
        (Some(id) == exclude, state, std::cmp::Reverse(members.last_seen(id)), id.clone())
    };
    members
        .records()
        .map(|r| &r.id)
        .filter(|id| usable(id, &[NodeState::Online, NodeState::Degraded]))
        .min_by_key(|id| rank(id))
        .cloned()
}

/// How a request to a node goes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Over the live tunnel the node holds to this node.
    Tunnel,
    /// To its advertised URL.
    Direct(String),
    /// Through the node it is tunnelled to, at that node's URL.
    Relay { via: NodeId, via_url: String },
}

impl Route {
    /// As `shoal nodes` shows it: `direct`, `tunnel (hosted here)` or `relay via X`.
    pub fn describe(&self) -> String {
        match self {
            Route::Tunnel => "tunnel (hosted here)".into(),
            Route::Direct(_) => "direct".into(),
            Route::Relay { via, .. } => format!("relay via {via}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("node {0} is not a member of this node's cluster")]
    UnknownPeer(NodeId),
    #[error("node {0} has no advertised URL and no tunnel")]
    PeerNoEndpoint(NodeId),
    #[error("node {0} is reachable only through a tunnel, which is not connected")]
    TunnelNotConnected(NodeId),
}

/// The route from `me` to `to` (reference-facts.md "Route"): a live tunnel terminating here
/// (`tunnelled_here`), then the advertised URL, then a relay through the node `to` says it is
/// tunnelled to (never this node, never one without a URL).
pub fn route(members: &Membership, me: &NodeId, to: &NodeId, tunnelled_here: bool) -> Result<Route, RouteError> {
    let rec = members.get(to).filter(|r| !r.removed).ok_or_else(|| RouteError::UnknownPeer(to.clone()))?;
    if tunnelled_here {
        return Ok(Route::Tunnel);
    }
    if !rec.advertise_url.is_empty() {
        return Ok(Route::Direct(rec.advertise_url.clone()));
    }
    if rec.tunnel_via.is_empty() {
        return Err(RouteError::PeerNoEndpoint(to.clone()));
    }
    let via = NodeId::new(&rec.tunnel_via);
    if &via == me {
        // It says it is tunnelled here, but no tunnel is: it is reconnecting.
        return Err(RouteError::TunnelNotConnected(to.clone()));
    }
    match members.get(&via).filter(|v| !v.removed && !v.advertise_url.is_empty()) {
        Some(v) => Ok(Route::Relay { via, via_url: v.advertise_url.clone() }),
        None => Err(RouteError::TunnelNotConnected(to.clone())),
    }
}

/// The certificate pin the connection of `route` (a route to `to`) must be held to: that of
/// the node dialled (`to` itself, or the relay), from its owner-signed record; empty when that
/// node serves plain HTTP or the route is a tunnel already up (issue 15).
pub fn route_pin(members: &Membership, to: &NodeId, route: &Route) -> String {
    let dialled = match route {
        Route::Tunnel => return String::new(),
        Route::Direct(_) => to,
        Route::Relay { via, .. } => via,
    };
    members.get(dialled).map(|r| r.tls_pin.clone()).unwrap_or_default()
}

/// Where this node's own tunnel stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum TunnelState {
    /// This node has an advertised URL and wants no tunnel.
    Off,
    /// Waiting until `at` before the next try.
    Waiting { at: Millis },
    /// Connecting to `host`, since `since`.
    Connecting { host: NodeId, since: Millis },
    /// Up to `host` since `since`.
    Up { host: NodeId, since: Millis },
}

/// The client side of a node's tunnel: when to connect, to whom, how long to wait after a
/// failure. Pure: the node asks [`TunnelClient::due`] on its timer and tells it what happened.
#[derive(Clone, Debug)]
pub struct TunnelClient {
    state: TunnelState,
    backoff_ms: u64,
    last_failed: Option<NodeId>,
}

impl Default for TunnelClient {
    fn default() -> Self {
        TunnelClient { state: TunnelState::Off, backoff_ms: BACKOFF_MIN_MS, last_failed: None }
    }
}

impl TunnelClient {
    pub fn state(&self) -> &TunnelState {
        &self.state
    }

    /// The host of a live tunnel.
    pub fn host(&self) -> Option<&NodeId> {
        match &self.state {
            TunnelState::Up { host, .. } => Some(host),
            _ => None,
        }
    }

    /// Whether this node wants a tunnel (no advertised URL, or a preferred host set): off →
    /// try at once; on → off drops any tunnel state and answers the host of a tunnel up or
    /// opening, to close.
    pub fn set_wanted(&mut self, wanted: bool, now: Millis) -> Option<NodeId> {
        match (wanted, &self.state) {
            (true, TunnelState::Off) => {
                self.state = TunnelState::Waiting { at: now };
                None
            }
            (false, _) => {
                let open = match std::mem::replace(&mut self.state, TunnelState::Off) {
                    TunnelState::Up { host, .. } | TunnelState::Connecting { host, .. } => Some(host),
                    _ => None,
                };
                self.backoff_ms = BACKOFF_MIN_MS;
                open
            }
            _ => None,
        }
    }

    pub fn wanted(&self) -> bool {
        self.state != TunnelState::Off
    }

    /// The next time [`TunnelClient::due`] has something to do.
    pub fn deadline(&self) -> Option<Millis> {
        match &self.state {
            TunnelState::Waiting { at } => Some(*at),
            // A handshake that never ends is given up.
            TunnelState::Connecting { since, .. } => Some(since.plus(HANDSHAKE_MS + HANDSHAKE_GRACE_MS)),
            _ => None,
        }
    }

    /// On the timer: when a try is due, the host to connect to now (`pick` chooses it, given
    /// the host that failed last), or `None` (nothing due, or no host: looked for again in
    /// [`NO_HOST_RETRY_MS`]). A handshake past [`HANDSHAKE_MS`] (and its grace) counts as a
    /// failure.
    pub fn due(&mut self, now: Millis, pick: impl FnOnce(Option<&NodeId>) -> Option<NodeId>) -> Option<NodeId> {
        if let TunnelState::Connecting { host, since } = &self.state {
            if now.since(*since) >= HANDSHAKE_MS + HANDSHAKE_GRACE_MS {
                let host = host.clone();
                self.failed(&host, now);
            }
        }
        match &self.state {
            TunnelState::Waiting { at } if now >= *at => match pick(self.last_failed.as_ref()) {
                Some(host) => {
                    self.state = TunnelState::Connecting { host: host.clone(), since: now };
                    Some(host)
                }
                None => {
                    self.state = TunnelState::Waiting { at: now.plus(NO_HOST_RETRY_MS) };
                    None
                }
            },
            _ => None,
        }
    }

    /// The tunnel to `host` is up. `false` when it was not being opened (given up meanwhile,
    /// or no longer wanted): the shell drops that socket.
    pub fn opened(&mut self, host: &NodeId, now: Millis) -> bool {
        if matches!(&self.state, TunnelState::Connecting { host: h, .. } if h == host) {
            self.state = TunnelState::Up { host: host.clone(), since: now };
            self.last_failed = None;
            true
        } else {
            false
        }
    }

    /// The tunnel to `host` failed to open or closed: wait the backoff (doubled for the next
    /// time, unless the tunnel had stayed up [`STABLE_AFTER_MS`]) and pick a host again.
    pub fn failed(&mut self, host: &NodeId, now: Millis) {
        let stable = match &self.state {
            TunnelState::Up { host: h, since } if h == host => now.since(*since) >= STABLE_AFTER_MS,
            TunnelState::Connecting { host: h, .. } if h == host => false,
            // A late report about another host changes nothing.
            _ => return,
        };
        if stable {
            self.backoff_ms = BACKOFF_MIN_MS;
        }
        self.state = TunnelState::Waiting { at: now.plus(self.backoff_ms) };
        self.backoff_ms = (self.backoff_ms * 2).min(BACKOFF_MAX_MS);
        self.last_failed = Some(host.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> String {
        format!("{:032x}", n)
    }

    fn request(body: Vec<u8>) -> Frame {
        let mut h = BTreeMap::new();
        h.insert("X-Aroz-Node".into(), vec!["n1".into()]);
        h.insert("Set-Cookie".into(), vec!["a=1".into(), "b=2".into()]);
        Frame {
            kind: FrameKind::Request,
            header: FrameHeader { id: id(7), m: "POST".into(), t: "/cluster/acn/ping?x=1".into(), s: 0, h },
            body,
        }
    }

    #[test]
    fn frames_round_trip_with_multi_value_headers() {
        let f = request(b"{\"a\":1}".to_vec());
        let bytes = encode(&f).unwrap();
        assert_eq!(bytes[0], 1);
        let hlen = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert_eq!(&bytes[5 + hlen..], b"{\"a\":1}");
        let back = decode(&bytes).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.header.h["Set-Cookie"], vec!["a=1", "b=2"]);
        assert_eq!(back.header.get("x-aroz-node"), Some("n1"));
        let resp = Frame {
            kind: FrameKind::Response,
            header: FrameHeader { id: id(7), s: 502, ..Default::default() },
            body: vec![],
        };
        assert_eq!(decode(&encode(&resp).unwrap()).unwrap(), resp);
    }

    #[test]
    fn short_unknown_and_lying_frames_are_refused() {
        assert_eq!(decode(&[1, 0]), Err(FrameError::Short(2)));
        assert_eq!(decode(&[]), Err(FrameError::Short(0)));
        let mut b = encode(&request(vec![])).unwrap();
        b[0] = 3;
        assert_eq!(decode(&b), Err(FrameError::Kind(3)));
        let mut b = encode(&request(vec![])).unwrap();
        b[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode(&b), Err(FrameError::HeaderLength(u32::MAX)));
        let mut b = vec![2, 0, 0, 0, 3];
        b.extend_from_slice(b"{x}");
        assert!(matches!(decode(&b), Err(FrameError::Header(_))));
        let mut b = vec![2, 0, 0, 0, 12];
        b.extend_from_slice(b"{\"id\":\"zz\"}x");
        assert!(matches!(decode(&b), Err(FrameError::Header(_)) | Err(FrameError::Id)));
        let bad_id = Frame { header: FrameHeader { id: "short".into(), ..request(vec![]).header }, ..request(vec![]) };
        assert_eq!(encode(&bad_id), Err(FrameError::Id));
    }

    #[test]
    fn a_body_over_the_cap_is_refused_and_one_just_under_fits() {
        let f = request(vec![]);
        let overhead = encode(&f).unwrap().len();
        let fits = request(vec![0; FRAME_MAX - overhead]);
        assert_eq!(encode(&fits).unwrap().len(), FRAME_MAX);
        let over = request(vec![0; FRAME_MAX - overhead + 1]);
        assert_eq!(encode(&over), Err(FrameError::TooLarge(FRAME_MAX + 1)));
        let mut raw = encode(&fits).unwrap();
        raw.push(0);
        assert_eq!(decode(&raw), Err(FrameError::TooLarge(FRAME_MAX + 1)));
        // A 4 MiB chunk with its headers fits with room to spare.
        assert!(encode(&request(vec![0; 4 << 20])).is_ok());
    }

    #[test]
    fn relay_paths_parse_only_when_whole() {
        let (n, orig) =
            parse_relay_target("/cluster/acn/relay/node-b/cluster/acn/store/read?volume=v&offset=0").unwrap();
        assert_eq!(n, NodeId::new("node-b"));
        assert_eq!(orig, "/cluster/acn/store/read?volume=v&offset=0");
        assert_eq!(relay_target(&n, orig), "/cluster/acn/relay/node-b/cluster/acn/store/read?volume=v&offset=0");
        for bad in [
            "/cluster/acn/relay/",
            "/cluster/acn/relay/node-b",
            "/cluster/acn/relay//cluster/acn/ping",
            "/cluster/acn/relay/node?b/cluster/acn/ping",
            "/cluster/acn/relay/../cluster/acn/ping",
            "/cluster/acn/ping",
        ] {
            assert_eq!(parse_relay_target(bad), Err(RelayPathError::Malformed), "{bad}");
        }
        for not_acn in [
            "/cluster/acn/relay/node-b/v1/files/x",
            "/cluster/acn/relay/node-b/cluster/acn/",
            "/cluster/acn/relay/node-b/",
            "/cluster/acn/relay/node-b/cluster/acn/relay/node-c/cluster/acn/ping",
            "/cluster/acn/relay/node-b/cluster/acn/tunnel",
        ] {
            assert_eq!(parse_relay_target(not_acn), Err(RelayPathError::NotAcn), "{not_acn}");
        }
    }

    fn member(m: &mut Membership, name: &str, url: &str, via: &str, seen: Option<u64>) -> NodeId {
        member_pinned(m, name, url, via, seen, "")
    }

    fn member_pinned(m: &mut Membership, name: &str, url: &str, via: &str, seen: Option<u64>, pin: &str) -> NodeId {
        let key = ed25519_dalek::SigningKey::from_bytes(&[name.len() as u8; 32]);
        let fields = crate::records::OwnerFields {
            id: NodeId::new(name),
            name: name.into(),
            public_key: crate::acn::public_key_b64(&key.verifying_key()),
            advertise_url: url.into(),
            tunnel_via: via.into(),
            version: "1".into(),
            capabilities: Default::default(),
            joined: 1,
            box_key: String::new(),
            tls_pin: pin.into(),
        };
        let v = crate::hlc::Version { wall_ms: 1, counter: 0, node: NodeId::new(name) };
        m.insert(crate::records::NodeRecord::new_signed(fields, v, &key));
        if let Some(at) = seen {
            m.saw_at(&NodeId::new(name), Millis(at), Millis(at));
        }
        NodeId::new(name)
    }

    const NOW: Millis = Millis(10_000_000);

    #[test]
    fn the_preferred_host_only_while_online_else_the_freshest_online_member() {
        let me = NodeId::new("nat");
        let mut m = Membership::new(me.clone(), Default::default());
        member(&mut m, "nat", "", "", None);
        let a = member(&mut m, "a", "http://a:1", "", Some(NOW.0 - 10_000));
        let b = member(&mut m, "b", "http://b:1", "", Some(NOW.0 - 2_000));
        let off = member(&mut m, "off", "http://off:1", "", Some(NOW.0 - 3_600_000));
        let nourl = member(&mut m, "nourl", "", "", Some(NOW.0));
        // The freshest ONLINE member with a URL.
        assert_eq!(pick_host(&m, &me, None, None, NOW), Some(b.clone()));
        // The preferred one while it is ONLINE, even if staler.
        assert_eq!(pick_host(&m, &me, Some(&a), None, NOW), Some(a.clone()));
        // Weakness 8: a preferred host that is offline (or has no URL) is passed over.
        assert_eq!(pick_host(&m, &me, Some(&off), None, NOW), Some(b.clone()));
        assert_eq!(pick_host(&m, &me, Some(&nourl), None, NOW), Some(b.clone()));
        // The host that just failed goes last.
        assert_eq!(pick_host(&m, &me, None, Some(&b), NOW), Some(a.clone()));
        // Never itself; nothing when no member qualifies.
        let mut alone = Membership::new(me.clone(), Default::default());
        member(&mut alone, "nat", "", "", None);
        member(&mut alone, "off", "http://off:1", "", Some(NOW.0 - 3_600_000));
        assert_eq!(pick_host(&alone, &me, None, None, NOW), None);
    }

    #[test]
    fn routes_go_tunnel_then_direct_then_relay() {
        let me = NodeId::new("me");
        let mut m = Membership::new(me.clone(), Default::default());
        member(&mut m, "me", "http://me:1", "", None);
        let d = member(&mut m, "d", "http://d:1", "", Some(NOW.0));
        let h = member(&mut m, "h", "http://h:1", "", Some(NOW.0));
        let nat = member(&mut m, "nat", "", "h", Some(NOW.0));
        let here = member(&mut m, "nat2", "", "me", Some(NOW.0));
        let lost = member(&mut m, "nat3", "", "", Some(NOW.0));
        let via_gone = member(&mut m, "nat4", "", "ghost", Some(NOW.0));
        assert_eq!(route(&m, &me, &d, false), Ok(Route::Direct("http://d:1".into())));
        // A live tunnel here wins even over a URL.
        assert_eq!(route(&m, &me, &d, true), Ok(Route::Tunnel));
        assert_eq!(route(&m, &me, &nat, false), Ok(Route::Relay { via: h.clone(), via_url: "http://h:1".into() }));
        assert_eq!(route(&m, &me, &here, true), Ok(Route::Tunnel));
        assert_eq!(route(&m, &me, &here, false), Err(RouteError::TunnelNotConnected(here.clone())));
        assert_eq!(route(&m, &me, &lost, false), Err(RouteError::PeerNoEndpoint(lost.clone())));
        assert_eq!(route(&m, &me, &via_gone, false), Err(RouteError::TunnelNotConnected(via_gone.clone())));
        assert_eq!(route(&m, &me, &NodeId::new("x"), false), Err(RouteError::UnknownPeer(NodeId::new("x"))));
        assert_eq!(Route::Relay { via: h.clone(), via_url: String::new() }.describe(), "relay via h");
        assert_eq!(Route::Tunnel.describe(), "tunnel (hosted here)");
        assert_eq!(Route::Direct("http://d:1".into()).describe(), "direct");
    }

    /// Issue 15: a connection is held to the certificate of the node it dials: the target's on
    /// a direct route, the relay's on a relayed one, none over a tunnel already up.
    #[test]
    fn a_route_is_pinned_to_the_certificate_of_the_node_it_dials() {
        let me = NodeId::new("me");
        let mut m = Membership::new(me.clone(), Default::default());
        let (pd, ph) = ("d".repeat(64), "e".repeat(64));
        member(&mut m, "me", "https://me:1", "", None);
        let d = member_pinned(&mut m, "d", "https://d:1", "", Some(NOW.0), &pd);
        let h = member_pinned(&mut m, "h", "https://h:1", "", Some(NOW.0), &ph);
        let nat = member_pinned(&mut m, "nat", "", "h", Some(NOW.0), &"a".repeat(64));
        let plain = member(&mut m, "plain", "http://p:1", "", Some(NOW.0));
        assert_eq!(route_pin(&m, &d, &route(&m, &me, &d, false).unwrap()), pd);
        assert_eq!(route_pin(&m, &nat, &route(&m, &me, &nat, false).unwrap()), ph, "the relay's, not the target's");
        assert_eq!(route_pin(&m, &d, &Route::Tunnel), "");
        assert_eq!(route_pin(&m, &plain, &route(&m, &me, &plain, false).unwrap()), "");
        let _ = h;
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_tunnel() {
        let h = NodeId::new("h");
        let mut c = TunnelClient::default();
        assert_eq!(c.due(Millis(0), |_| Some(h.clone())), None, "off: nothing to do");
        c.set_wanted(true, Millis(0));
        let mut now = Millis(0);
        let mut waits = vec![];
        for _ in 0..8 {
            assert_eq!(c.due(now, |_| Some(h.clone())), Some(h.clone()));
            c.failed(&h, now);
            let TunnelState::Waiting { at } = *c.state() else { panic!("{:?}", c.state()) };
            waits.push(at.since(now));
            assert_eq!(c.due(Millis(at.0 - 1), |_| Some(h.clone())), None, "not before its time");
            now = at;
        }
        assert_eq!(waits, vec![2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 64_000, 64_000]);
        // Up for a minute, then closed: the next wait is the first again.
        assert_eq!(c.due(now, |_| Some(h.clone())), Some(h.clone()));
        assert!(c.opened(&h, now));
        assert_eq!(c.host(), Some(&h));
        let later = now.plus(STABLE_AFTER_MS);
        c.failed(&h, later);
        assert_eq!(*c.state(), TunnelState::Waiting { at: later.plus(BACKOFF_MIN_MS) });
    }

    #[test]
    fn no_host_waits_five_seconds_and_a_hung_handshake_is_a_failure() {
        let h = NodeId::new("h");
        let mut c = TunnelClient::default();
        c.set_wanted(true, Millis(100));
        assert_eq!(c.due(Millis(100), |_| None), None);
        assert_eq!(*c.state(), TunnelState::Waiting { at: Millis(100 + NO_HOST_RETRY_MS) });
        let t = Millis(100 + NO_HOST_RETRY_MS);
        assert_eq!(c.due(t, |_| Some(h.clone())), Some(h.clone()));
        let give_up = HANDSHAKE_MS + HANDSHAKE_GRACE_MS;
        assert_eq!(c.deadline(), Some(t.plus(give_up)));
        assert_eq!(c.due(t.plus(give_up - 1), |_| Some(h.clone())), None);
        // The handshake hangs: a failure, and the next pick is told which host failed.
        let mut told = None;
        assert_eq!(c.due(t.plus(give_up), |_| Some(h.clone())), None);
        // A socket that opens after the core gave up is refused.
        assert!(!c.opened(&h, t.plus(give_up)));
        let at = c.deadline().unwrap();
        assert_eq!(at, t.plus(give_up + BACKOFF_MIN_MS));
        c.due(at, |failed| {
            told = failed.cloned();
            Some(h.clone())
        });
        assert_eq!(told, Some(h.clone()));
        // A late close of another host changes nothing.
        c.failed(&NodeId::new("other"), at);
        assert!(matches!(c.state(), TunnelState::Connecting { .. }));
        assert_eq!(c.set_wanted(false, at), Some(h.clone()), "the tunnel being opened is to close");
        assert_eq!(*c.state(), TunnelState::Off);
        assert_eq!(c.deadline(), None);
    }
}
