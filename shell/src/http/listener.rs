//! The node's one HTTP listener, hardened against clients that hold connections open (issue 11;
//! DESIGN.md "The shell"): the accept loop, a cap on open connections, and timeouts on every way
//! a client can stall. The router behind it is [`crate::http::server::router`].
//!
//! What a client cannot do any more:
//! - **send nothing, half a request head, or a byte of it every few seconds**: the head must be
//!   in within [`ServeLimits::header_read_ms`] (hyper's header timeout, which also closes a
//!   kept-alive connection idle for that long);
//! - **send half a body, or drip it**: a request body must bring at least
//!   [`ServeLimits::body_min_bytes`] in every [`ServeLimits::body_window_ms`] the node spends
//!   waiting for it (or end), else the read fails, the request gets a JSON 4xx and the
//!   connection is closed (time the node itself is not reading does not count);
//! - **stop reading an answer**: a write that makes no progress for
//!   [`ServeLimits::write_stall_ms`] closes the connection;
//! - **exhaust the file descriptors**: at most [`ServeLimits::max_connections`] are open (below the
//!   fd limit, which [`raise_fd_limit`] lifts to the hard limit at start). A connection beyond
//!   the cap evicts the open connection idle the longest that has no request in flight (a
//!   stalled or half-open one), so a node flooded with such connections still answers a new
//!   client at once; with every connection busy, the new one is closed.
//!
//! hyper answers a request it cannot parse (bad syntax, a head too large) itself, with an empty
//! body; [`GuardedIo`] rewrites those answers into the JSON error every other answer carries.

use crate::metrics::Metrics;
use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// Connection limits of one listener.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// A request head (or the first one on a new connection, or the next on a kept-alive one)
    /// must be read within this.
    pub header_read_ms: u64,
    /// A request body must bring [`ServeLimits::body_min_bytes`] in every window this long.
    pub body_window_ms: u64,
    pub body_min_bytes: u64,
    /// A write that makes no progress for this long closes the connection.
    pub write_stall_ms: u64,
    /// Open connections at most.
    pub max_connections: usize,
    /// How long a stop waits for requests in flight before it drops their connections.
    pub shutdown_grace_ms: u64,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_read_ms: 10_000,
            body_window_ms: 10_000,
            body_min_bytes: 16 * 1024,
            write_stall_ms: 60_000,
            max_connections: 1_024,
            shutdown_grace_ms: 10_000,
        }
    }
}

/// File descriptors kept free of connections (the database, volumes, outgoing requests).
pub const FD_RESERVE: u64 = 128;

impl ServeLimits {
    /// The defaults, with the connection cap set below the soft fd limit `fds`.
    pub fn for_fd_limit(fds: u64) -> ServeLimits {
        let cap = fds.saturating_sub(FD_RESERVE).max(fds / 2).clamp(8, 16_384);
        ServeLimits { max_connections: cap as usize, ..ServeLimits::default() }
    }
}

/// Raise this process's soft limit of open files to its hard limit (where allowed), and answer
/// the soft limit now in force.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct handed to them.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1_024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        r.rlim_cur
    }
}

/// What one open connection is doing, seen by the accept loop.
#[derive(Default)]
struct Activity {
    /// Milliseconds since the listener started, at the last byte read or written.
    last_ms: AtomicU64,
    /// Requests whose answer is not yet complete.
    in_flight: AtomicUsize,
    close: Notify,
}

struct Registry {
    origin: Instant,
    open: Mutex<BTreeMap<u64, Arc<Activity>>>,
    /// Evicted connections whose socket is not closed yet: the accept loop waits for them, so
    /// open sockets never outgrow the cap (and the fd limit). `closed` wakes it, and a stop
    /// waiting for the last connection, whenever a connection ends.
    closing: AtomicUsize,
    closed: Notify,
    /// Bytes read and written on every connection (`/metrics`).
    bytes_in: Counter,
    bytes_out: Counter,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Make room for one more connection: evict the one idle the longest with no request in
    /// flight. False when every open connection is busy.
    fn make_room(&self, cap: usize) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() < cap {
            return true;
        }
        let victim = open
            .iter()
            .filter(|(_, a)| a.in_flight.load(Ordering::SeqCst) == 0)
            .min_by_key(|(id, a)| (a.last_ms.load(Ordering::SeqCst), **id))
            .map(|(id, _)| *id);
        match victim.and_then(|id| open.remove(&id)) {
            Some(a) => {
                self.closing.fetch_add(1, Ordering::SeqCst);
                a.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serve `router` on `listener` until `stop` turns true, counting the bytes of every
/// connection into `metrics`.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ServeLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: &Metrics,
    mut stop: watch::Receiver<bool>,
) where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let registry = Arc::new(Registry {
        origin: Instant::now(),
        open: Mutex::new(BTreeMap::new()),
        closing: AtomicUsize::new(0),
        closed: Notify::new(),
        bytes_in: metrics.bytes_in.clone(),
        bytes_out: metrics.bytes_out.clone(),
    });
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut next_id = 0u64;
    loop {
        while registry.closing.load(Ordering::SeqCst) > 0 {
            let _ = tokio::time::timeout(Duration::from_millis(20), registry.closed.notified()).await;
        }
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        if !registry.make_room(limits.max_connections) {
            tracing::warn!(open = limits.max_connections, "every connection is busy: a new one is closed");
            drop(io);
            continue;
        }
        next_id += 1;
        let id = next_id;
        let activity = Arc::new(Activity::default());
        activity.last_ms.store(registry.now_ms(), Ordering::SeqCst);
        registry.open.lock().unwrap_or_else(|p| p.into_inner()).insert(id, activity.clone());
        let conn = Connection {
            id,
            registry: registry.clone(),
            activity,
            router: router.clone(),
            limits: limits.clone(),
            closing: closing_rx.clone(),
            client: ClientAddr::of_debug(&format!("{addr:?}")),
        };
        match tls.clone() {
            None => tokio::spawn(conn.run(io)),
            Some(acceptor) => tokio::spawn(conn.run_tls(acceptor, io)),
        };
    }
    // Stop: no new connections; those open finish their requests (bounded), idle ones close.
    let _ = closing_tx.send(true);
    let drained = async {
        loop {
            // Registered before the check, so a connection ending in between still wakes it.
            let ended = registry.closed.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if registry.open.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                return;
            }
            ended.await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(limits.shutdown_grace_ms), drained).await;
}

struct Connection {
    id: u64,
    registry: Arc<Registry>,
    activity: Arc<Activity>,
    router: Router,
    limits: ServeLimits,
    closing: watch::Receiver<bool>,
    client: ClientAddr,
}

/// The address a request came from (its IP, without the port), put in every request's
/// extensions: what failed logins are counted by (issue 15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub String);

impl ClientAddr {
    /// From a socket address as printed (`1.2.3.4:5`, `[::1]:5`): the host part.
    pub fn of_debug(printed: &str) -> ClientAddr {
        let host = match printed.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !port.is_empty() => h,
            _ => printed,
        };
        ClientAddr(host.trim_start_matches('[').trim_end_matches(']').to_string())
    }
}

impl Connection {
    /// The TLS handshake first, within the time a request head has ([`ServeLimits::header_read_ms`]),
    /// then [`Connection::run`] over the decrypted stream (so the guards and the JSON rewrite
    /// of hyper's own answers see the plain bytes).
    async fn run_tls<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self,
        acceptor: tokio_rustls::TlsAcceptor,
        io: S,
    ) {
        let limit = Duration::from_millis(self.limits.header_read_ms);
        let activity = self.activity.clone();
        let mut closing = self.closing.clone();
        let shaken = tokio::select! {
            r = tokio::time::timeout(limit, acceptor.accept(io)) => match r {
                Ok(Ok(tls)) => Some(tls),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a TLS handshake failed");
                    None
                }
                Err(_) => None,
            },
            // Evicted to make room for a new connection while still shaking hands.
            _ = activity.close.notified() => None,
            // The node stops: a handshake is not a request in flight, it is dropped.
            _ = closing.wait_for(|c| *c) => None,
        };
        match shaken {
            Some(tls) => self.run(tls).await,
            None => {
                let was_open = self.registry.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id).is_some();
                if !was_open {
                    // Evicted: the accept loop waits for this one to be gone.
                    self.registry.closing.fetch_sub(1, Ordering::SeqCst);
                }
                self.registry.closed.notify_waiters();
            }
        }
    }

    async fn run<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, io: S) {
        let guarded = GuardedIo::new(io, self.registry.clone(), self.activity.clone(), self.limits.write_stall_ms);
        let (activity, limits) = (self.activity.clone(), self.limits.clone());
        let router = self.router.clone();
        let client = self.client.clone();
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let router = router.clone();
            let guard = InFlight::new(activity.clone());
            let mut req = req.map(|b| Body::new(PacedBody::new(b, &limits)));
            req.extensions_mut().insert(client.clone());
            async move {
                let resp = router.oneshot(req).await?;
                // The request counts as in flight until its answer's body is written.
                Ok::<_, std::convert::Infallible>(resp.map(|b| Body::new(Tracked { inner: b, _guard: guard })))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(self.limits.header_read_ms));
        let evicted = {
            // With upgrades: a WebSocket (`/v1/events`) takes the socket over after its 101; it
            // then lives in its own task, outside this registry.
            let conn = builder.serve_connection(TokioIo::new(guarded), service).with_upgrades();
            let mut conn = std::pin::pin!(conn);
            let activity = self.activity.clone();
            let mut shutting = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break false,
                    _ = activity.close.notified() => break true,
                    _ = self.closing.wait_for(|c| *c), if !shutting => {
                        shutting = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            // The connection, and with it the socket, is dropped here.
        };
        if evicted {
            self.registry.closing.fetch_sub(1, Ordering::SeqCst);
        }
        self.registry.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        self.registry.closed.notify_waiters();
    }
}

/// Counts a request in flight on its connection while it lives.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(a: Arc<Activity>) -> InFlight {
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(a)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body, holding its request's [`InFlight`] until it is written (or dropped).
struct Tracked {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The error a [`PacedBody`] fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body came too slowly: under {min} bytes in {window_ms} ms")]
pub struct BodyTooSlow {
    pub min: u64,
    pub window_ms: u64,
}

/// A request body that must bring `min` bytes in every `window` of time spent waiting for it
/// (see the module doc). Only waiting counts: while the node itself is not reading (its own
/// back-pressure, a slow peer it writes to), the client is not to blame.
struct PacedBody {
    inner: hyper::body::Incoming,
    window: Duration,
    min: u64,
    /// Bytes and waiting time in the current window.
    in_window: u64,
    waited: Duration,
    /// When the wait under way began, with its deadline armed.
    waiting_since: Option<Instant>,
    deadline: Pin<Box<Sleep>>,
}

impl PacedBody {
    fn new(inner: hyper::body::Incoming, limits: &ServeLimits) -> PacedBody {
        let window = Duration::from_millis(limits.body_window_ms);
        PacedBody {
            inner,
            window,
            min: limits.body_min_bytes,
            in_window: 0,
            waited: Duration::ZERO,
            waiting_since: None,
            deadline: Box::pin(tokio::time::sleep(window)),
        }
    }
}

impl http_body::Body for PacedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if r.is_pending() {
            let now = Instant::now();
            if this.waiting_since.is_none() {
                this.waiting_since = Some(now);
                let left = this.window.saturating_sub(this.waited);
                this.deadline.as_mut().reset(now + left);
            }
            if this.deadline.as_mut().poll(cx).is_ready() {
                let e = BodyTooSlow { min: this.min, window_ms: this.window.as_millis() as u64 };
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            return Poll::Pending;
        }
        if let Some(since) = this.waiting_since.take() {
            this.waited += since.elapsed();
        }
        match r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.in_window += d.len() as u64;
                }
                if this.in_window >= this.min {
                    this.in_window = 0;
                    this.waited = Duration::ZERO;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's stream: notes activity, fails a write stalled past its limit, and rewrites
/// hyper's own bodiless error answers into JSON errors.
pub struct GuardedIo<S> {
    inner: S,
    registry: Arc<Registry>,
    activity: Arc<Activity>,
    write_stall: Duration,
    stall: Option<Pin<Box<Sleep>>>,
    /// A rewritten answer still to be written, from this offset.
    replacement: Option<(Vec<u8>, usize)>,
}

impl<S> GuardedIo<S> {
    fn new(inner: S, registry: Arc<Registry>, activity: Arc<Activity>, write_stall_ms: u64) -> GuardedIo<S> {
        GuardedIo {
            inner,
            registry,
            activity,
            write_stall: Duration::from_millis(write_stall_ms),
            stall: None,
            replacement: None,
        }
    }

    fn touch(&self) {
        self.activity.last_ms.store(self.registry.now_ms(), Ordering::SeqCst);
    }
}

/// hyper's own answer to a request it could not parse: a 4xx/5xx status line, no content type
/// and an empty body (every answer of the router carries a JSON content type). Returns the
/// JSON answer to send instead.
pub fn json_for_bare_error(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head.get(..head.len().min(1024))?).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?;
    let code: u16 = rest.get(..3)?.parse().ok()?;
    if !(400..600).contains(&code) {
        return None;
    }
    let end = text.find("\r\n\r\n")?;
    if text.len() != end + 4 {
        return None; // a body follows: not hyper's bare answer
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("\r\ncontent-type:") || !lower.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let (slug, message) = match code {
        400 => ("bad_request", "the request could not be read as HTTP/1.1"),
        408 => ("request_timeout", "the request head did not arrive in time"),
        413 => ("too_large", "the request is too large"),
        414 => ("uri_too_long", "the request target is too long"),
        431 => ("headers_too_large", "the request's headers are too large"),
        501 => ("not_implemented", "the request uses something this server does not implement"),
        505 => ("version_not_supported", "only HTTP/1.1 and HTTP/1.0 are served"),
        _ => ("bad_request", "the request could not be read"),
    };
    let body = serde_json::json!({"error": {"code": slug, "message": message}}).to_string();
    let reason = rest.get(3..rest.find("\r\n")?).unwrap_or("").trim();
    Some(
        format!(
            "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.registry.bytes_in.inc_by((buf.filled().len() - before) as u64);
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> GuardedIo<S> {
    /// Write what is left of a replacement answer; Ready once it is all out.
    fn drain_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, at)) = &mut self.replacement {
            if *at >= bytes.len() {
                self.replacement = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *at += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Account for one write attempt: progress resets the stall timer; no progress for too
    /// long fails the write.
    fn after_write(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &r {
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.registry.bytes_out.inc_by(*n as u64);
                self.stall = None;
                self.touch();
            }
            Poll::Pending => {
                let limit = self.write_stall;
                let stall = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if stall.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading")));
                }
            }
            _ => {}
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.drain_replacement(cx) {
            return Poll::Ready(Err(e));
        }
        if this.replacement.is_some() {
            return this.after_write(cx, Poll::Pending);
        }
        if let Some(json) = json_for_bare_error(buf) {
            this.replacement = Some((json, 0));
            let _ = this.drain_replacement(cx);
            return Poll::Ready(Ok(buf.len()));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper puts a whole head in one slice: look at the first, as `poll_write` does.
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(first) if json_for_bare_error(first).is_some() || self.replacement.is_some() => {
                self.poll_write(cx, first)
            }
            _ => {
                let this = &mut *self;
                let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
                this.after_write(cx, r)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        std::task::ready!(this.drain_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        std::task::ready!(this.drain_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_error_answers_become_json_and_others_are_left_alone() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let json = String::from_utf8(json_for_bare_error(bare).unwrap()).unwrap();
        assert!(json.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{json}");
        assert!(json.contains("content-type: application/json"), "{json}");
        assert!(
            json.ends_with(r#"{"error":{"code":"headers_too_large","message":"the request's headers are too large"}}"#)
        );
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(json_for_bare_error(ours), None);
        assert_eq!(json_for_bare_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(json_for_bare_error(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nxyz"), None);
        assert_eq!(json_for_bare_error(b"chunk of a body"), None);
    }

    #[test]
    fn the_connection_cap_sits_below_the_fd_limit() {
        assert_eq!(ServeLimits::for_fd_limit(256).max_connections, 128);
        assert_eq!(ServeLimits::for_fd_limit(1_024).max_connections, 896);
        assert!(ServeLimits::for_fd_limit(16).max_connections >= 8);
        assert_eq!(ServeLimits::for_fd_limit(1 << 20).max_connections, 16_384);
    }
}
