//! Sending a signed request to a node id (spec: "ACN", "Routing"). Callers name the node; the
//! core picks the route (`Node::route_to`, the reference's order: a live tunnel here, then the
//! advertised URL, then a relay through the node the target is tunnelled to) and the transport
//! carries the request that way: over the tunnel's link, to the URL, or to the relay's URL with
//! the relay path (`/cluster/acn/relay/<node><original target>`; the signature stays the one
//! made over the original target, so the relay and the target both check it).

use crate::env::Net;
use crate::net::client::{ClientError, HttpClient, Response};
use crate::net::tunnel::{TunnelError, Tunnels};
use shoal_core::acn::PendingSignature;
use shoal_core::node::Node;
pub use shoal_core::tunnel::Route;
use shoal_core::tunnel::RouteError;
use shoal_core::{Millis, NodeId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("node {0} is not a member of this node's cluster")]
    UnknownPeer(NodeId),
    #[error("node {0} has no advertised URL and no tunnel")]
    PeerNoEndpoint(NodeId),
    #[error("node {0} is reachable only by tunnel, which is not connected")]
    TunnelNotConnected(NodeId),
    #[error("this node is not in a cluster")]
    NotInCluster,
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Tunnel(#[from] TunnelError),
}

impl From<RouteError> for TransportError {
    fn from(e: RouteError) -> TransportError {
        match e {
            RouteError::UnknownPeer(n) => TransportError::UnknownPeer(n),
            RouteError::PeerNoEndpoint(n) => TransportError::PeerNoEndpoint(n),
            RouteError::TunnelNotConnected(n) => TransportError::TunnelNotConnected(n),
        }
    }
}

/// Pick the route to `to` from the node's view of the membership and its live tunnels.
pub fn route(node: &Node, to: &NodeId) -> Result<Route, TransportError> {
    Ok(node.route_to(to)?)
}

#[derive(Clone)]
pub struct Transport<N: Net> {
    client: HttpClient<N>,
    /// Live tunnels by peer (either end).
    pub tunnels: Tunnels,
}

/// A request routed and its signature decided, ready to go out without holding the node: the
/// Ed25519 signature is computed as it is sent ([`Transport::send`]), off the node's lock.
pub struct Prepared {
    /// The node it is for.
    pub to: NodeId,
    pub route: Route,
    /// The certificate pin the connection is held to (the core's `Node::route_pin`).
    pub pin: String,
    pub method: String,
    pub target: String,
    pub signature: PendingSignature,
    /// The body's SHA-256 (hex), when the caller computed it already.
    pub body_hash: Option<String>,
    /// Headers sent beside the signed ones.
    pub extra: Vec<(&'static str, String)>,
    pub body: bytes::Bytes,
}

impl Prepared {
    /// The signed headers (computed on each call).
    fn headers(&self) -> Vec<(&'static str, String)> {
        let h = match &self.body_hash {
            Some(hash) => self.signature.headers_hashed(&self.method, &self.target, hash),
            None => self.signature.headers(&self.method, &self.target, &self.body),
        };
        let signed = h.pairs().iter().map(|(k, v)| (*k, v.to_string())).collect::<Vec<_>>();
        signed.into_iter().chain(self.extra.iter().cloned()).collect()
    }
}

impl<N: Net> Transport<N> {
    pub fn new(net: N) -> Transport<N> {
        Transport { client: HttpClient::new(net), tunnels: Tunnels::default() }
    }

    /// [`Transport::prepare`] for a body whose SHA-256 (hex) the caller computed from `body`.
    pub fn prepare_hashed(
        node: &mut Node,
        now: Millis,
        to: &NodeId,
        method: &str,
        target: &str,
        body: bytes::Bytes,
        body_hash: &str,
    ) -> Result<Prepared, TransportError> {
        let route = route(node, to)?;
        let signature = node.pending_signature(now).ok_or(TransportError::NotInCluster)?;
        Ok(Self::prepared(node, to, route, signature, Some(body_hash.to_string()), method, target, body))
    }

    /// Decide a request's signature (the node's key, time and nonce) and pick its route.
    pub fn prepare(
        node: &mut Node,
        now: Millis,
        to: &NodeId,
        method: &str,
        target: &str,
        body: Vec<u8>,
    ) -> Result<Prepared, TransportError> {
        let route = route(node, to)?;
        let signature = node.pending_signature(now).ok_or(TransportError::NotInCluster)?;
        Ok(Self::prepared(node, to, route, signature, None, method, target, body.into()))
    }

    /// A request along `route`, held to the pin the core names for it.
    #[allow(clippy::too_many_arguments)]
    fn prepared(
        node: &Node,
        to: &NodeId,
        route: Route,
        signature: PendingSignature,
        body_hash: Option<String>,
        method: &str,
        target: &str,
        body: bytes::Bytes,
    ) -> Prepared {
        let pin = node.route_pin(to, &route);
        Prepared {
            to: to.clone(),
            route,
            pin,
            method: method.to_string(),
            target: target.to_string(),
            signature,
            body_hash,
            extra: Vec::new(),
            body,
        }
    }

    pub async fn send(&self, p: Prepared, timeout_ms: u64) -> Result<Response, TransportError> {
        let signed = p.headers();
        let headers: Vec<(&str, &str)> = signed.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match &p.route {
            Route::Direct(url) => {
                Ok(self.client.request_pinned(url, &p.pin, &p.method, &p.target, &headers, p.body, timeout_ms).await?)
            }
            Route::Tunnel => {
                let link = self.tunnels.get(&p.to).ok_or_else(|| TransportError::TunnelNotConnected(p.to.clone()))?;
                Ok(link.request(&p.method, &p.target, &headers, p.body, timeout_ms).await?)
            }
            Route::Relay { via_url, .. } => {
                let target = shoal_core::tunnel::relay_target(&p.to, &p.target);
                Ok(self
                    .client
                    .request_pinned(via_url, &p.pin, &p.method, &target, &headers, p.body, timeout_ms)
                    .await?)
            }
        }
    }
}
