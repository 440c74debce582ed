//! Requests to other members (spec: "Transport"): signed by the core, routed and sent by
//! [`crate::net::transport`], their failures turned into the node's API errors; and one piece of a
//! copy read from wherever it lies (this node's disk or a peer's `store/read`, each piece's
//! SHA-256 checked).

use crate::disk::confined_path;
use crate::env::Env;
use crate::net::transport::Transport;
use crate::node::handle::Shared;
use crate::wire::{escape_query, CHUNK_SHA_HEADER, FILE_SIZE_HEADER};
use axum::body::Bytes;
use serde_json::Value;
use sha2::{Digest, Sha256};
use shoal_core::node::files::Source;
use shoal_core::node::ApiError;
use shoal_core::NodeId;
use std::path::PathBuf;
use std::sync::Arc;

/// How long a request to a peer may take when the caller gives no bound.
pub const PEER_TIMEOUT_MS: u64 = 60_000;

/// A peer that could not be reached (or signed for) as an API error.
pub fn peer_error(e: impl ToString) -> ApiError {
    ApiError::peer_failed("peer_unreachable", e.to_string())
}

/// An I/O failure as an API error: 507 when the disk is full.
pub fn io_api(what: &str, e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return ApiError::storage_full("insufficient_storage", format!("{what}: {e}"));
    }
    ApiError::internal("io", format!("{what}: {e}"))
}

/// A signed request to member `to`, with `extra` headers beside the signature.
pub async fn signed<E: Env>(
    s: &Arc<Shared<E>>,
    to: &NodeId,
    method: &str,
    target: &str,
    body: Vec<u8>,
    extra: Vec<(&'static str, String)>,
) -> Result<crate::net::client::Response, ApiError> {
    signed_within(s, to, method, target, body, extra, PEER_TIMEOUT_MS).await
}

pub async fn signed_within<E: Env>(
    s: &Arc<Shared<E>>,
    to: &NodeId,
    method: &str,
    target: &str,
    body: Vec<u8>,
    extra: Vec<(&'static str, String)>,
    timeout_ms: u64,
) -> Result<crate::net::client::Response, ApiError> {
    let mut prepared =
        s.with_node(|n, now| Transport::<E>::prepare(n, now, to, method, target, body)).map_err(peer_error)?;
    prepared.extra.extend(extra);
    s.transport.send(prepared, timeout_ms).await.map_err(peer_error)
}

/// A peer's refusal as an API error: a write conflict and a full disk keep their meaning.
pub fn answered_error(r: &crate::net::client::Response, what: &str) -> ApiError {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let msg = v["error"]["message"].as_str().unwrap_or("no message").to_string();
    if r.status == 409 && v["error"]["code"] == "write_conflict" {
        return ApiError::conflict("write_conflict", format!("{what}: {msg}"));
    }
    if r.status == 507 {
        return ApiError::storage_full("insufficient_storage", format!("{what}: {msg}"));
    }
    ApiError::peer_failed("peer_refused", format!("{what}: {msg}"))
}

/// Read `len` bytes at `offset` of one copy: from disk when it is local, else with
/// `store/read` (whose chunk SHA-256 is checked).
pub async fn read_piece<E: Env>(
    s: &Arc<Shared<E>>,
    src: &Source,
    path: &str,
    offset: u64,
    len: u64,
) -> Result<Bytes, ApiError> {
    if let Some(folder) = &src.folder {
        let (folder, path) = (PathBuf::from(folder), path.to_string());
        return s
            .blocking(move || {
                let file = confined_path(&folder, &path, false)?;
                crate::disk::read_at(&file, offset, len).map(|r| r.1).map_err(|e| io_api("read copy", e))
            })
            .await;
    }
    let target = format!(
        "/cluster/acn/store/read?volume={}&path={}&offset={offset}&length={len}",
        src.volume_id,
        escape_query(path)
    );
    let r = signed(s, &src.node_id, "GET", &target, vec![], vec![]).await?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/read"));
    }
    let claimed = r.header(CHUNK_SHA_HEADER).unwrap_or_default().to_string();
    if hex::encode(Sha256::digest(&r.body)) != claimed {
        return Err(ApiError::peer_failed("corrupt_in_transit", "a piece did not match its SHA-256"));
    }
    let _ = r.header(FILE_SIZE_HEADER);
    Ok(r.body)
}
