//! One reverse tunnel on the wire: a WebSocket carrying the core's frames
//! (`shoal_core::tunnel`: `[kind][u32 BE header length][header JSON][body]`), several requests in
//! flight at once in both directions (spec: cluster-runtime.md "Reverse tunnel").
//!
//! A [`Link`] is one live tunnel, at either end: [`Link::request`] sends a request frame and
//! waits for the response with the same id; request frames from the far end are handed to the
//! node's own ACN handler and answered on the same socket. Both ends ping every 30 s, a socket
//! silent for 90 s or a frame not written within 60 s closes the link (constants of the core);
//! these are the socket's own keep-alive mechanics, not decisions of the cluster. Closing never
//! panics, and never loses a reply silently: every request in flight on a closed link fails at
//! once with [`TunnelError::Closed`].
//!
//! [`Tunnels`] is the registry of live links by peer, which the transport routes through.

use crate::net::client::Response;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use shoal_core::tunnel::{self as rules, Frame, FrameHeader, FrameKind};
use shoal_core::NodeId;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error("the tunnel to {0} closed before its answer came")]
    Closed(NodeId),
    #[error("no answer through the tunnel to {0} within {1} ms")]
    Timeout(NodeId, u64),
    #[error("cannot send through the tunnel: {0}")]
    Frame(String),
}

/// A request frame handed to the node's own ACN handler: method, target, headers, body.
pub struct TunnelledRequest {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// What answers a request that came through a tunnel (the node's ACN handler).
pub type Handler = Arc<dyn Fn(TunnelledRequest) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// Called with the peer each time anything arrives on its link (it is alive).
pub type OnSeen = Arc<dyn Fn(&NodeId) + Send + Sync>;

/// The WebSocket settings of a tunnel: a message may carry one whole frame.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(rules::FRAME_MAX)).max_frame_size(Some(rules::FRAME_MAX))
}

pub struct Link {
    peer: NodeId,
    out: mpsc::Sender<Message>,
    pending: Mutex<HashMap<String, oneshot::Sender<Response>>>,
    closed: AtomicBool,
    salt: u64,
    next: AtomicU64,
}

impl Link {
    pub fn peer(&self) -> &NodeId {
        &self.peer
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Send a request through the tunnel and wait for its answer (at most `timeout_ms`).
    pub async fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        timeout_ms: u64,
    ) -> Result<Response, TunnelError> {
        let id = format!("{:016x}{:016x}", self.salt, self.next.fetch_add(1, Ordering::Relaxed));
        let mut h: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            h.entry((*k).to_string()).or_default().push((*v).to_string());
        }
        let frame = Frame {
            kind: FrameKind::Request,
            header: FrameHeader { id: id.clone(), m: method.to_string(), t: target.to_string(), s: 0, h },
            body: body.to_vec(),
        };
        let bytes = rules::encode(&frame).map_err(|e| TunnelError::Frame(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            // Checked under the lock the closing drain takes: a request registered after the
            // drain would wait for nothing.
            if self.is_closed() {
                return Err(TunnelError::Closed(self.peer.clone()));
            }
            pending.insert(id.clone(), tx);
        }
        let forget = || {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        };
        let deadline = Duration::from_millis(timeout_ms);
        let sent = tokio::time::timeout(deadline, self.out.send(Message::Binary(bytes.into()))).await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                forget();
                return Err(TunnelError::Closed(self.peer.clone()));
            }
            Err(_) => {
                forget();
                return Err(TunnelError::Timeout(self.peer.clone(), timeout_ms));
            }
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(TunnelError::Closed(self.peer.clone())),
            Err(_) => {
                forget();
                Err(TunnelError::Timeout(self.peer.clone(), timeout_ms))
            }
        }
    }

    /// Mark closed and fail every request in flight (their senders dropped: `Closed` at once).
    fn close(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::Release);
        pending.clear();
    }

    fn answer(&self, id: &str, r: Response) {
        let waiter = self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        if let Some(w) = waiter {
            let _ = w.send(r);
        }
    }
}

/// Live links by peer.
#[derive(Clone, Default)]
pub struct Tunnels(Arc<Mutex<HashMap<NodeId, Arc<Link>>>>);

impl Tunnels {
    pub fn get(&self, peer: &NodeId) -> Option<Arc<Link>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(peer).filter(|l| !l.is_closed()).cloned()
    }

    /// Register `link`, replacing (and closing) an older one with the same peer.
    fn insert(&self, link: Arc<Link>) {
        let old = self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(link.peer.clone(), link);
        if let Some(old) = old {
            old.close();
        }
    }

    /// Forget `link` if it is still the one registered for its peer; whether it was.
    fn remove(&self, link: &Arc<Link>) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&link.peer).is_some_and(|l| Arc::ptr_eq(l, link)) {
            map.remove(&link.peer);
            true
        } else {
            false
        }
    }

    pub fn peers(&self) -> Vec<NodeId> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }
}

fn headers_of(h: &BTreeMap<String, Vec<String>>) -> hyper::HeaderMap {
    let mut out = hyper::HeaderMap::new();
    for (k, vs) in h {
        let Ok(name) = hyper::header::HeaderName::from_bytes(k.as_bytes()) else { continue };
        for v in vs {
            if let Ok(v) = hyper::header::HeaderValue::from_str(v) {
                out.append(name.clone(), v);
            }
        }
    }
    out
}

/// Run a live tunnel with `peer` over `ws` until it closes: registers the link in `tunnels`
/// (so requests to `peer` go through it), serves the far end's requests with `handler`, and
/// fails what is in flight when it ends. Returns once the socket is closed and the link gone;
/// whether this link was still the registered one for `peer` (a newer one replaces it).
pub async fn run<S>(
    ws: WebSocketStream<S>,
    peer: NodeId,
    salt: u64,
    tunnels: &Tunnels,
    handler: Handler,
    on_seen: OnSeen,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let link = Arc::new(Link {
        peer: peer.clone(),
        out: tx.clone(),
        pending: Mutex::new(HashMap::new()),
        closed: AtomicBool::new(false),
        salt,
        next: AtomicU64::new(0),
    });
    tunnels.insert(link.clone());
    let (mut sink, mut stream) = ws.split();
    let writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(Duration::from_millis(rules::PING_EVERY_MS));
        ping.tick().await;
        let write_deadline = Duration::from_millis(rules::WRITE_DEADLINE_MS);
        loop {
            let msg = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => break,
                },
                _ = ping.tick() => Message::Ping(Bytes::new()),
            };
            let close = matches!(msg, Message::Close(_));
            match tokio::time::timeout(write_deadline, sink.send(msg)).await {
                Ok(Ok(())) if !close => {}
                _ => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    });
    let read_deadline = Duration::from_millis(rules::READ_DEADLINE_MS);
    loop {
        let next = match tokio::time::timeout(read_deadline, stream.next()).await {
            Ok(Some(Ok(m))) => m,
            // Silent past the deadline, the socket's end, or its error: the link is over.
            _ => break,
        };
        on_seen(&peer);
        let bytes = match next {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            // Pings are answered by the WebSocket layer itself; pongs only say "alive".
            _ => continue,
        };
        let frame = match rules::decode(&bytes) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(peer = %peer, error = %e, "a malformed tunnel frame closes the tunnel");
                break;
            }
        };
        match frame.kind {
            FrameKind::Response => {
                let r = Response {
                    status: frame.header.s,
                    headers: headers_of(&frame.header.h),
                    body: Bytes::from(frame.body),
                };
                link.answer(&frame.header.id, r);
            }
            FrameKind::Request => {
                let (handler, out, id) = (handler.clone(), tx.clone(), frame.header.id.clone());
                tokio::spawn(async move {
                    let req = TunnelledRequest {
                        method: frame.header.m,
                        target: frame.header.t,
                        headers: frame
                            .header
                            .h
                            .into_iter()
                            .flat_map(|(k, vs)| vs.into_iter().map(move |v| (k.clone(), v)))
                            .collect(),
                        body: Bytes::from(frame.body),
                    };
                    let r = handler(req).await;
                    let mut h: BTreeMap<String, Vec<String>> = BTreeMap::new();
                    for (k, v) in r.headers.iter() {
                        if let Ok(v) = v.to_str() {
                            h.entry(k.as_str().to_string()).or_default().push(v.to_string());
                        }
                    }
                    let answer = Frame {
                        kind: FrameKind::Response,
                        header: FrameHeader { id: id.clone(), s: r.status, h, ..Default::default() },
                        body: r.body.to_vec(),
                    };
                    let bytes = rules::encode(&answer).unwrap_or_else(|e| {
                        // Too large for one frame: the asker gets a clear 502 instead.
                        let body = serde_json::to_vec(&serde_json::json!({
                            "error": {"code": "tunnel_frame", "message": e.to_string()}
                        }))
                        .unwrap_or_default();
                        let header = FrameHeader { id, s: 502, ..Default::default() };
                        rules::encode(&Frame { kind: FrameKind::Response, header, body }).unwrap_or_default()
                    });
                    let _ = out.send(Message::Binary(bytes.into())).await;
                });
            }
        }
    }
    link.close();
    let _ = tx.try_send(Message::Close(None));
    drop(tx);
    writer.abort();
    tunnels.remove(&link)
}
