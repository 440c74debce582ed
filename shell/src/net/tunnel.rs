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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
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
    /// Turns true once: the link's reader and writer stop, its requests fail.
    closed: watch::Sender<bool>,
    salt: u64,
    next: AtomicU64,
}

impl Link {
    pub fn peer(&self) -> &NodeId {
        &self.peer
    }

    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
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
        let header = FrameHeader { id: id.clone(), m: method.to_string(), t: target.to_string(), s: 0, h };
        let bytes =
            rules::encode_parts(FrameKind::Request, &header, &body).map_err(|e| TunnelError::Frame(e.to_string()))?;
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
        // One deadline for sending and answering.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        let sent = tokio::time::timeout_at(deadline, self.out.send(Message::Binary(bytes.into()))).await;
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
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(TunnelError::Closed(self.peer.clone())),
            Err(_) => {
                forget();
                Err(TunnelError::Timeout(self.peer.clone(), timeout_ms))
            }
        }
    }

    /// Close the link: its socket is closed by [`run`], and every request in flight fails at
    /// once (their senders dropped: `Closed`).
    pub fn close(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.send_replace(true);
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

    /// Close the link with `peer`, if any (this node stops wanting its tunnel).
    pub fn close(&self, peer: &NodeId) {
        let link = self.0.lock().unwrap_or_else(|p| p.into_inner()).get(peer).cloned();
        if let Some(l) = link {
            l.close();
        }
    }

    /// Whether a live link with `peer` is registered.
    pub fn has(&self, peer: &NodeId) -> bool {
        self.get(peer).is_some()
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

/// Run a live tunnel with `peer` over `ws` until it closes (the socket ends or errs, nothing
/// arrives for the read deadline, a frame cannot be written within the write deadline, the link
/// is closed, or `stop` turns true): registers the link in `tunnels` (so requests to `peer` go
/// through it) and calls `on_up` once it is, serves the far end's requests with `handler`, and
/// fails what is in flight when it ends. Returns once the socket is closed and the link gone:
/// whether this link was still the registered one for `peer` (a newer one may replace it).
#[allow(clippy::too_many_arguments)]
pub async fn run<S>(
    ws: WebSocketStream<S>,
    peer: NodeId,
    salt: u64,
    tunnels: &Tunnels,
    handler: Handler,
    on_seen: OnSeen,
    on_up: impl FnOnce(),
    mut stop: watch::Receiver<bool>,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Message>(64);
    let link = Arc::new(Link {
        peer: peer.clone(),
        out: tx.clone(),
        pending: Mutex::new(HashMap::new()),
        closed: watch::Sender::new(false),
        salt,
        next: AtomicU64::new(0),
    });
    tunnels.insert(link.clone());
    on_up();
    let (mut sink, mut stream) = ws.split();
    let writer_link = link.clone();
    let writer = tokio::spawn(async move {
        let mut closed = writer_link.closed.subscribe();
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
                _ = closed.wait_for(|c| *c) => break,
            };
            match tokio::time::timeout(write_deadline, sink.send(msg)).await {
                Ok(Ok(())) => {}
                // A frame not written in time, or a broken socket: the link is over.
                _ => break,
            }
        }
        writer_link.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(None))).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    });
    let mut closed = link.closed.subscribe();
    let read_deadline = Duration::from_millis(rules::READ_DEADLINE_MS);
    loop {
        let next = tokio::select! {
            r = tokio::time::timeout(read_deadline, stream.next()) => match r {
                Ok(Some(Ok(m))) => m,
                // Silent past the deadline, the socket's end, or its error: the link is over.
                _ => break,
            },
            _ = closed.wait_for(|c| *c) => break,
            _ = stop.wait_for(|s| *s) => break,
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
                    let header = FrameHeader { id: id.clone(), s: r.status, h, ..Default::default() };
                    let bytes = rules::encode_parts(FrameKind::Response, &header, &r.body).unwrap_or_else(|e| {
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
    drop(tx);
    // The writer sends a Close frame and ends; a stuck one is not waited for long.
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(3), &mut writer).await.is_err() {
        writer.abort();
    }
    tunnels.remove(&link)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    fn echo() -> Handler {
        Arc::new(|r: TunnelledRequest| {
            Box::pin(async move {
                let mut headers = hyper::HeaderMap::new();
                headers.insert("x-target", r.target.parse().unwrap());
                let values: Vec<String> =
                    r.headers.iter().filter(|(k, _)| k == "x-aroz-node").map(|(_, v)| v.clone()).collect();
                headers.insert("x-values", values.join(",").parse().unwrap());
                Response { status: 201, headers, body: r.body }
            })
        })
    }

    fn quiet() -> OnSeen {
        Arc::new(|_| {})
    }

    fn never() -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        rx
    }

    async fn pair() -> (WebSocketStream<tokio::io::DuplexStream>, WebSocketStream<tokio::io::DuplexStream>) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let wa = WebSocketStream::from_raw_socket(a, Role::Client, Some(ws_config())).await;
        let wb = WebSocketStream::from_raw_socket(b, Role::Server, Some(ws_config())).await;
        (wa, wb)
    }

    async fn registered(t: &Tunnels, peer: &str) -> Arc<Link> {
        for _ in 0..500 {
            if let Some(l) = t.get(&NodeId::new(peer)) {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{peer} never registered");
    }

    #[tokio::test]
    async fn many_requests_in_flight_both_ways_each_gets_its_own_answer() {
        let (wa, wb) = pair().await;
        let (ta, tb) = (Tunnels::default(), Tunnels::default());
        let (ta2, tb2) = (ta.clone(), tb.clone());
        tokio::spawn(async move { run(wa, NodeId::new("b"), 1, &ta2, echo(), quiet(), || {}, never()).await });
        tokio::spawn(async move { run(wb, NodeId::new("a"), 2, &tb2, echo(), quiet(), || {}, never()).await });
        let (to_a, to_b) = (registered(&tb, "a").await, registered(&ta, "b").await);
        let mut tasks = Vec::new();
        for i in 0..16u8 {
            let link = if i % 2 == 0 { to_a.clone() } else { to_b.clone() };
            tasks.push(tokio::spawn(async move {
                let headers = [("x-aroz-node", "n1"), ("x-aroz-node", "n2")];
                let target = format!("/cluster/acn/ping?i={i}");
                let r = link.request("POST", &target, &headers, Bytes::from(vec![i; 1000 + i as usize]), 5_000).await;
                (i, target, r)
            }));
        }
        for t in tasks {
            let (i, target, r) = t.await.unwrap();
            let r = r.unwrap();
            assert_eq!(r.status, 201);
            assert_eq!(r.body.as_ref(), vec![i; 1000 + i as usize].as_slice(), "request {i} got another's answer");
            assert_eq!(r.header("x-target"), Some(target.as_str()));
            assert_eq!(r.header("x-values"), Some("n1,n2"), "multi-value headers keep their order");
        }
        // A body over the frame cap is refused before it is sent.
        let big = to_a.request("POST", "/cluster/acn/ping", &[], Bytes::from(vec![0; rules::FRAME_MAX]), 5_000).await;
        assert!(matches!(big, Err(TunnelError::Frame(_))), "{big:?}");
    }

    #[tokio::test]
    async fn a_closed_tunnel_fails_every_request_in_flight_at_once() {
        let (wa, mut far) = pair().await;
        let ta = Tunnels::default();
        let ta2 = ta.clone();
        let runner =
            tokio::spawn(async move { run(wa, NodeId::new("b"), 1, &ta2, echo(), quiet(), || {}, never()).await });
        let link = registered(&ta, "b").await;
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let link = link.clone();
                tokio::spawn(async move { link.request("POST", "/cluster/acn/ping", &[], Bytes::new(), 60_000).await })
            })
            .collect();
        // The far end reads the requests, answers none, and goes away.
        for _ in 0..3 {
            let m = tokio::time::timeout(Duration::from_secs(5), far.next()).await.unwrap().unwrap().unwrap();
            assert!(matches!(rules::decode(&m.into_data()), Ok(Frame { kind: FrameKind::Request, .. })));
        }
        drop(far);
        for w in waiting {
            let r = tokio::time::timeout(Duration::from_secs(5), w).await.expect("failed at once, not after 60 s");
            assert!(matches!(r.unwrap(), Err(TunnelError::Closed(_))));
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), runner).await.unwrap().unwrap(),
            "still the registered link"
        );
        assert!(ta.get(&NodeId::new("b")).is_none(), "a closed link is no route");
        // A request on the closed link fails at once too.
        let late = link.request("POST", "/cluster/acn/ping", &[], Bytes::new(), 60_000).await;
        assert!(matches!(late, Err(TunnelError::Closed(_))));
    }

    #[tokio::test]
    async fn closing_a_link_or_stopping_the_node_ends_its_socket() {
        // Closed through the registry (the core no longer wants the tunnel): the run ends, the
        // far end sees the socket close, and the link is no route.
        let (wa, mut far) = pair().await;
        let ta = Tunnels::default();
        let ta2 = ta.clone();
        let runner =
            tokio::spawn(async move { run(wa, NodeId::new("b"), 1, &ta2, echo(), quiet(), || {}, never()).await });
        registered(&ta, "b").await;
        ta.close(&NodeId::new("b"));
        assert!(tokio::time::timeout(Duration::from_secs(5), runner).await.unwrap().unwrap());
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(m)) = far.next().await {
                if m.is_close() {
                    break;
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the far end is told");
        assert!(!ta.has(&NodeId::new("b")));

        // The node stops: its tunnels end with it (they hold no node alive).
        let (wa, _far) = pair().await;
        let (stop_tx, stop_rx) = watch::channel(false);
        let ta3 = ta.clone();
        let up = Arc::new(AtomicU64::new(0));
        let up2 = up.clone();
        let runner = tokio::spawn(async move {
            run(
                wa,
                NodeId::new("c"),
                1,
                &ta3,
                echo(),
                quiet(),
                move || {
                    up2.fetch_add(1, Ordering::Relaxed);
                },
                stop_rx,
            )
            .await
        });
        registered(&ta, "c").await;
        assert_eq!(up.load(Ordering::Relaxed), 1, "told once it is registered");
        stop_tx.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), runner).await.unwrap().unwrap());
        assert!(!ta.has(&NodeId::new("c")));
    }
}
