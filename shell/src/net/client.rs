//! A small HTTP/1 client over any [`Net`], with a per-host pool of kept-alive connections.
//! Used for node-to-node ACN requests (the transport) and by the CLI for the admin API.
//!
//! Only `http://` URLs; a pooled connection is checked ready before a request goes out on it,
//! so a request is never sent twice (a resent signed request would be refused as a replay).

use crate::env::Net;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
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

/// `http://host:port/base` split into the `host:port` to dial and the path prefix.
pub fn split_url(url: &str) -> Result<(String, String), ClientError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::BadUrl(url.into(), "only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(ClientError::BadUrl(url.into(), "no host"));
    }
    let authority = if authority.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.trim_end_matches('/').to_string()))
}

/// Kept-alive connections by `host:port`.
type IdlePool = HashMap<String, Vec<(tokio::time::Instant, SendRequest<Full<Bytes>>)>>;

#[derive(Clone)]
pub struct HttpClient<N: Net> {
    net: N,
    idle: Arc<Mutex<IdlePool>>,
}

impl<N: Net> HttpClient<N> {
    pub fn new(net: N) -> HttpClient<N> {
        HttpClient { net, idle: Arc::new(Mutex::new(HashMap::new())) }
    }

    async fn connection(&self, authority: &str) -> Result<SendRequest<Full<Bytes>>, ClientError> {
        loop {
            let pooled = {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.get_mut(authority).and_then(|v| v.pop())
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
        let (authority, prefix) = split_url(base_url)?;
        let fut = self.request_inner(&authority, &prefix, method, target, headers, body.into());
        match tokio::time::timeout(Duration::from_millis(timeout_ms), fut).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout(base_url.to_string(), timeout_ms)),
        }
    }

    async fn request_inner(
        &self,
        authority: &str,
        prefix: &str,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response, ClientError> {
        let mut sender = self.connection(authority).await?;
        let uri = format!("{prefix}{target}");
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
        self.give_back(authority, sender);
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
        assert!(split_url("https://h").is_err());
        assert!(split_url("http://").is_err());
    }
}
