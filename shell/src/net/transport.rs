//! Sending a signed request to a node id (spec: "ACN", "Routing"). Callers name the node; the
//! transport picks the route. Direct (the peer's advertised URL) is the only route today; the
//! [`Route`] type leaves room for the reverse tunnel and the relay through a tunnel host, with
//! the reference's order: live tunnel > advertised URL > relay via its tunnel host.

use crate::env::Net;
use crate::net::client::{ClientError, HttpClient, Response};
use shoal_core::node::Node;
use shoal_core::{Millis, NodeId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The peer's advertised URL.
    Direct(String),
    /// A live reverse tunnel that terminates on this node.
    Tunnel(NodeId),
    /// Through the node hosting the peer's tunnel.
    Relay { via: NodeId, via_url: String },
}

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
}

/// Pick the route to `to` from the node's view of the membership.
pub fn route(node: &Node, to: &NodeId) -> Result<Route, TransportError> {
    let rec = node.members().get(to).filter(|r| !r.removed).ok_or_else(|| TransportError::UnknownPeer(to.clone()))?;
    if !rec.advertise_url.is_empty() {
        return Ok(Route::Direct(rec.advertise_url.clone()));
    }
    if !rec.tunnel_via.is_empty() {
        return Err(TransportError::TunnelNotConnected(to.clone()));
    }
    Err(TransportError::PeerNoEndpoint(to.clone()))
}

#[derive(Clone)]
pub struct Transport<N: Net> {
    client: HttpClient<N>,
}

/// A request signed and routed, ready to go out without holding the node.
pub struct Prepared {
    pub route: Route,
    pub method: String,
    pub target: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: bytes::Bytes,
}

impl<N: Net> Transport<N> {
    pub fn new(net: N) -> Transport<N> {
        Transport { client: HttpClient::new(net) }
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
        let headers = node.sign_hashed(now, method, target, body_hash).ok_or(TransportError::NotInCluster)?;
        let headers = headers.pairs().iter().map(|(k, v)| (*k, v.to_string())).collect();
        Ok(Prepared { route, method: method.to_string(), target: target.to_string(), headers, body })
    }

    /// Sign a request to `to` with the node's key and pick its route.
    pub fn prepare(
        node: &mut Node,
        now: Millis,
        to: &NodeId,
        method: &str,
        target: &str,
        body: Vec<u8>,
    ) -> Result<Prepared, TransportError> {
        let route = route(node, to)?;
        let headers = node.sign(now, method, target, &body).ok_or(TransportError::NotInCluster)?;
        let headers = headers.pairs().iter().map(|(k, v)| (*k, v.to_string())).collect();
        Ok(Prepared { route, method: method.to_string(), target: target.to_string(), headers, body: body.into() })
    }

    pub async fn send(&self, p: Prepared, timeout_ms: u64) -> Result<Response, TransportError> {
        let url = match &p.route {
            Route::Direct(u) => u.clone(),
            Route::Tunnel(id) => return Err(TransportError::TunnelNotConnected(id.clone())),
            Route::Relay { via_url, .. } => via_url.clone(),
        };
        let headers: Vec<(&str, &str)> = p.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Ok(self.client.request(&url, &p.method, &p.target, &headers, p.body, timeout_ms).await?)
    }
}
