//! A small HTTP/1 client over any [`Net`], with a per-host pool of kept-alive connections.
//! Used for node-to-node ACN requests (the transport) and by the CLI for the admin API.
//!
//! `http://` and `https://` URLs: an `https://` one is held to a certificate pin (a peer's, from
//! its record: [`HttpClient::request_pinned`]) or to the client's own trust (the CLI's `--pin`
//! or `--ca`: [`HttpClient::with_tls`]); with neither it is refused, never sent unchecked.
//! A pooled connection is checked ready before a request goes out on it, so a request is
//! never sent twice (a resent signed request would be refused as a replay).

use crate::env::Net;
use crate::net::tls;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest response body accepted.
pub const RESPONSE_MAX_BYTES: usize = 64 * 1024 * 1024;
const IDLE_PER_HOST_MAX: usize = 32;
/// A kept-alive connection idle longer than this is not reused: servers close idle ones (shoal
/// after 10 s, `listener::ServeLimits::header_read_ms`), and a request sent just as the server
/// closes would fail.
const IDLE_REUSE_MAX: Duration = Duration::from_secs(4);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("bad URL {0}: {1}")]
    BadUrl(String, &'static str),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("request to {0} failed: {1}")]
    Request(String, String),
    #[error("no answer from {0} within {1} ms")]
    Timeout(String, u64),
}

/// A response: status, body and the headers the callers look at.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Response {
    /// A header as text, if present and valid.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `http(s)://host:port/base` split into the `host:port` to dial and the path prefix.
pub fn split_url(url: &str) -> Result<(String, String), ClientError> {
    parse_url(url).map(|u| (u.authority, u.prefix))
}

/// A base URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts {
    pub https: bool,
    /// `host:port` to dial (the scheme's port when none is given).
    pub authority: String,
    /// The path prefix, without a trailing `/`.
    pub prefix: String,
}

impl UrlParts {
    /// The host part of the authority (an IPv6 address keeps its brackets).
    pub fn host(&self) -> &str {
        self.authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(&self.authority)
    }
}

/// `http(s)://host[:port][/base]` taken apart.
pub fn parse_url(url: &str) -> Result<UrlParts, ClientError> {
    let (https, rest, default_port) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => (false, r, 80),
        (_, Some(r)) => (true, r, 443),
        _ => return Err(ClientError::BadUrl(url.into(), "a URL starts with http:// or https://")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(ClientError::BadUrl(url.into(), "no host"));
    }
    let has_port = authority.rsplit_once(':').is_some_and(|(h, p)| p.parse::<u16>().is_ok() && !h.ends_with(':'));
    let authority = if has_port && (!authority.starts_with('[') || authority.contains("]:")) {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    };
    Ok(UrlParts { https, authority, prefix: path.trim_end_matches('/').to_string() })
}

/// Kept-alive connections by `host:port`.
type IdlePool = HashMap<String, Vec<(tokio::time::Instant, SendRequest<Full<Bytes>>)>>;

#[derive(Clone)]
pub struct HttpClient<N: Net> {
    net: N,
    idle: Arc<Mutex<IdlePool>>,
    /// What an `https://` URL is checked against when the caller names no pin.
    tls: Option<Arc<ClientConfig>>,
    /// Client configs by pin, made once each.
    pinned: Arc<Mutex<HashMap<String, Arc<ClientConfig>>>>,
}

/// How one connection is made: the URL's parts and the TLS it is held to.
struct Dial {
    url: UrlParts,
    tls: Option<Arc<ClientConfig>>,
    /// The pool key: the authority, and for TLS what the connection was checked against.
    key: String,
}

impl<N: Net> HttpClient<N> {
    pub fn new(net: N) -> HttpClient<N> {
        HttpClient { net, idle: Arc::new(Mutex::new(HashMap::new())), tls: None, pinned: Default::default() }
    }

    /// Check `https://` URLs against `config` (the CLI's `--pin` or `--ca`).
    pub fn with_tls(mut self, config: Arc<ClientConfig>) -> HttpClient<N> {
        self.tls = Some(config);
        self
    }

    fn dial(&self, base_url: &str, pin: &str) -> Result<Dial, ClientError> {
        let url = parse_url(base_url)?;
        if !url.https {
            if !pin.is_empty() {
                // A node with a certificate is never talked to in clear.
                return Err(ClientError::Connect(url.authority, "the node serves TLS but its URL is http://".into()));
            }
            let key = url.authority.clone();
            return Ok(Dial { url, tls: None, key });
        }
        let (tls, how) = if pin.is_empty() {
            let c = self.tls.clone().ok_or_else(|| {
                ClientError::Connect(
                    url.authority.clone(),
                    "an https:// node is reached only with its certificate pin or a CA (the CLI's --pin or --ca)"
                        .into(),
                )
            })?;
            (c, "trust".to_string())
        } else {
            let mut cache = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
            let c = match cache.get(pin) {
                Some(c) => c.clone(),
                None => {
                    let c = tls::client_pinned(pin)
                        .map_err(|e| ClientError::Connect(url.authority.clone(), e.to_string()))?;
                    cache.insert(pin.to_string(), c.clone());
                    c
                }
            };
            (c, format!("pin {pin}"))
        };
        let key = format!("https {} {how}", url.authority);
        Ok(Dial { url, tls: Some(tls), key })
    }

    async fn connection(&self, dial: &Dial) -> Result<SendRequest<Full<Bytes>>, ClientError> {
        let authority = dial.url.authority.as_str();
        loop {
            let pooled = {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.get_mut(&dial.key).and_then(|v| v.pop())
            };
            let Some((since, mut s)) = pooled else { break };
            if since.elapsed() < IDLE_REUSE_MAX && s.ready().await.is_ok() {
                return Ok(s);
            }
        }
        let stream = self
            .net
            .connect(authority.to_string())
            .await
            .map_err(|e| ClientError::Connect(authority.into(), e.to_string()))?;
        let stream = tls::connect(stream, dial.url.host(), dial.tls.clone())
            .await
            .map_err(|e| ClientError::Connect(authority.into(), format!("TLS: {e}")))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Connect(authority.into(), e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn give_back(&self, authority: &str, s: SendRequest<Full<Bytes>>) {
        if s.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let v = idle.entry(authority.to_string()).or_default();
        v.retain(|(since, _)| since.elapsed() < IDLE_REUSE_MAX);
        if v.len() < IDLE_PER_HOST_MAX {
            v.push((tokio::time::Instant::now(), s));
        }
    }

    /// Send one request to `base_url` + `target` and read the whole answer.
    pub async fn request(
        &self,
        base_url: &str,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
        timeout_ms: u64,
    ) -> Result<Response, ClientError> {
        self.request_pinned(base_url, "", method, target, headers, body, timeout_ms).await
    }

    /// [`HttpClient::request`] with an `https://` URL held to the certificate whose SHA-256 is
    /// `pin` (empty: the client's own trust).
    #[allow(clippy::too_many_arguments)]
    pub async fn request_pinned(
        &self,
        base_url: &str,
        pin: &str,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
        timeout_ms: u64,
    ) -> Result<Response, ClientError> {
        let dial = self.dial(base_url, pin)?;
        let fut = self.request_inner(&dial, method, target, headers, body.into());
        match tokio::time::timeout(Duration::from_millis(timeout_ms), fut).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout(base_url.to_string(), timeout_ms)),
        }
    }

    async fn request_inner(
        &self,
        dial: &Dial,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response, ClientError> {
        let mut sender = self.connection(dial).await?;
        let authority = dial.url.authority.as_str();
        let uri = format!("{}{target}", dial.url.prefix);
        let mut req = hyper::Request::builder().method(method).uri(&uri).header("host", authority);
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body)).map_err(|e| ClientError::Request(uri.clone(), e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| ClientError::Request(uri.clone(), e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = Limited::new(resp.into_body(), RESPONSE_MAX_BYTES)
            .collect()
            .await
            .map_err(|e| ClientError::Request(uri.clone(), e.to_string()))?
            .to_bytes();
        self.give_back(&dial.key, sender);
        Ok(Response { status, headers, body })
    }
}

/// A streamed HTTP body fed through a channel: the producer sends chunks (or an error, which
/// cuts the stream so the receiver sees it incomplete) and the channel's bound is the
/// back-pressure, so a large file is never held in memory whole.
pub struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl ChannelBody {
    /// A body and the sender that feeds it, holding at most `depth` chunks in flight.
    pub fn new(depth: usize) -> (tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>, ChannelBody) {
        let (tx, rx) = tokio::sync::mpsc::channel(depth.max(1));
        (tx, ChannelBody { rx })
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(http_body::Frame::data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_prefix() {
        assert_eq!(split_url("http://127.0.0.1:7000").unwrap(), ("127.0.0.1:7000".into(), "".into()));
        assert_eq!(split_url("http://h/x/").unwrap(), ("h:80".into(), "/x".into()));
        assert_eq!(split_url("https://h").unwrap(), ("h:443".into(), "".into()));
        assert!(parse_url("https://h:8443/x").unwrap().https);
        assert_eq!(split_url("http://[::1]").unwrap(), ("[::1]:80".into(), "".into()));
        assert_eq!(parse_url("https://[::1]:9").unwrap().host(), "[::1]");
        assert!(split_url("ftp://h").is_err());
        assert!(split_url("http://").is_err());
    }
}
