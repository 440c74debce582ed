//! The reverse tunnel's two ends (spec: cluster-runtime.md "Reverse tunnel"): opening this
//! node's own tunnel when the core says so ([`open`], for `Output::TunnelOpen`) and hosting a
//! member's tunnel once the router accepted its upgrade ([`host`]). Each end runs the link
//! (`net::tunnel::run`) and tells the core when it is up and when it ends; which host, when to
//! try again and which route a request takes are the core's (`core/src/node/tunnel.rs`).

use crate::env::Env;
use crate::net::client::{parse_url, Response};
use crate::net::tls::{self, MaybeTls};
use crate::net::tunnel::{self, Handler, OnSeen, TunnelledRequest};
use crate::node::handle::Shared;
use shoal_core::tunnel::{HANDSHAKE_MS, TUNNEL_PATH};
use shoal_core::NodeId;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::WebSocketStream;

/// What answers the requests that come through a tunnel: the node's own ACN handler. Holds the
/// node weakly, so a link outliving its node answers 503 instead of keeping it alive.
fn handler<E: Env>(s: &Arc<Shared<E>>) -> Handler {
    let weak: Weak<Shared<E>> = Arc::downgrade(s);
    Arc::new(move |req: TunnelledRequest| {
        let weak = weak.clone();
        Box::pin(async move {
            match weak.upgrade() {
                Some(s) => (s.tunnel_handler)(s.clone(), req).await,
                None => Response {
                    status: 503,
                    headers: Default::default(),
                    body: br#"{"error":{"code":"stopping","message":"the node is stopping"}}"#.to_vec().into(),
                },
            }
        })
    })
}

fn on_seen<E: Env>(s: &Arc<Shared<E>>) -> OnSeen {
    let weak: Weak<Shared<E>> = Arc::downgrade(s);
    Arc::new(move |peer: &NodeId| {
        if let Some(s) = weak.upgrade() {
            s.with_node(|n, now| n.link_seen(now, peer));
        }
    })
}

/// Open this node's tunnel to `host` at `url` and run it until it ends (the core's
/// `Output::TunnelOpen`).
pub fn open<E: Env>(s: &Arc<Shared<E>>, host: NodeId, url: String) {
    let s = s.clone();
    tokio::spawn(async move {
        let connected = tokio::time::timeout(Duration::from_millis(HANDSHAKE_MS), connect(&s, &host, &url)).await;
        let ws = match connected {
            Ok(Ok(ws)) => ws,
            Ok(Err(e)) => {
                tracing::warn!(host = %host, error = %e, "could not open the tunnel");
                s.with_node(|n, now| n.tunnel_closed(now, &host));
                return;
            }
            Err(_) => {
                tracing::warn!(host = %host, "the tunnel's handshake timed out");
                s.with_node(|n, now| n.tunnel_closed(now, &host));
                return;
            }
        };
        // The core may have given the handshake up meanwhile (or left the cluster): then this
        // socket is dropped unused.
        if !s.with_node(|n, now| n.tunnel_opened(now, &host)) {
            tracing::info!(host = %host, "a tunnel opened too late is dropped");
            return;
        }
        tracing::info!(host = %host, "tunnel open");
        let salt = s.env.seed();
        let (tunnels, stop) = (s.transport.tunnels.clone(), s.shutdown_requested());
        let ours = tunnel::run(ws, host.clone(), salt, &tunnels, handler(&s), on_seen(&s), || {}, stop).await;
        tracing::info!(host = %host, "tunnel closed");
        if ours {
            s.with_node(|n, now| n.tunnel_closed(now, &host));
        }
    });
}

/// The signed WebSocket upgrade to `url`'s `/cluster/acn/tunnel` (the core signs it; its
/// timestamp on the host's clock as this node knows it, `Node::sign_for`).
async fn connect<E: Env>(
    s: &Arc<Shared<E>>,
    host: &NodeId,
    url: &str,
) -> Result<WebSocketStream<MaybeTls<E::Stream>>, String> {
    let parts = parse_url(url).map_err(|e| e.to_string())?;
    let (authority, base) = (parts.authority.clone(), parts.prefix.clone());
    let (signed, pin) = s
        .with_node(|n, now| {
            let pin = n.route_pin(host, &shoal_core::tunnel::Route::Direct(url.to_string()));
            n.sign_for(now, host, "GET", TUNNEL_PATH, &[]).map(|h| (h, pin))
        })
        .ok_or_else(|| "this node is not in a cluster".to_string())?;
    let tls = match (parts.https, pin.is_empty()) {
        (false, _) => None,
        (true, true) => return Err(format!("{url} serves https:// but its record carries no certificate pin")),
        (true, false) => Some(tls::client_pinned(&pin).map_err(|e| e.to_string())?),
    };
    let mut req = format!("ws://{authority}{base}{TUNNEL_PATH}").into_client_request().map_err(|e| e.to_string())?;
    for (k, v) in signed.pairs() {
        let v = v.parse().map_err(|_| format!("bad header value for {k}"))?;
        req.headers_mut().insert(k, v);
    }
    let stream = s.env.connect(authority.clone()).await.map_err(|e| format!("cannot connect to {authority}: {e}"))?;
    let stream = tls::connect(stream, parts.host(), tls).await.map_err(|e| format!("TLS to {authority}: {e}"))?;
    let (ws, _) = tokio_tungstenite::client_async_with_config(req, stream, Some(tunnel::ws_config())).await.map_err(
        |e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => {
                let body = r.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned();
                format!("tunnel upgrade at {authority}: HTTP {}: {body}", r.status())
            }
            e => format!("tunnel upgrade at {authority}: {e}"),
        },
    )?;
    Ok(ws)
}

/// Host `peer`'s tunnel over `ws` (its upgrade was accepted) until it ends.
pub async fn host<E: Env, S>(s: Arc<Shared<E>>, peer: NodeId, ws: WebSocketStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tracing::info!(peer = %peer, "hosting a tunnel");
    let salt = s.env.seed();
    let (tunnels, stop) = (s.transport.tunnels.clone(), s.shutdown_requested());
    // Linked in the core once registered, unlinked only while no newer link is registered:
    // both under the node's lock, so a reconnect racing the old link's end stays linked.
    let up = || s.with_node(|n, now| n.link_up(now, &peer));
    tunnel::run(ws, peer.clone(), salt, &tunnels, handler(&s), on_seen(&s), up, stop).await;
    s.with_node(|n, _| {
        if !tunnels.has(&peer) {
            n.link_down(&peer);
        }
    });
    tracing::info!(peer = %peer, "a hosted tunnel closed");
}

/// Broadcast a Wake-on-LAN magic packet for each MAC address on this node's LAN (the core's
/// `Output::WakeBroadcast`).
pub fn wake<E: Env>(s: &Arc<Shared<E>>, macs: &[String]) {
    for m in macs {
        let Some(mac) = shoal_core::wake::parse_mac(m) else { continue };
        match s.env.broadcast(&shoal_core::wake::magic_packet(&mac), shoal_core::wake::WAKE_PORT) {
            Ok(()) => tracing::info!(mac = %m, "sent a Wake-on-LAN packet"),
            Err(e) => tracing::warn!(mac = %m, error = %e, "could not send a Wake-on-LAN packet"),
        }
    }
}

/// The core no longer wants this node's tunnel to `host` (it left the cluster, or has a URL now
/// and no preferred host): close it (`Output::TunnelClose`).
pub fn close<E: Env>(s: &Arc<Shared<E>>, host: &NodeId) {
    s.transport.tunnels.close(host);
}
