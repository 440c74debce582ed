//! Requests to other members (spec: "Transport"): signed by the core, routed and sent by
//! [`crate::net::transport`], their failures turned into the node's API errors; and one piece of a
//! copy read from wherever it lies (this node's disk or a peer's `store/read`, each piece's
//! SHA-256 checked).

use crate::disk::confined_path;
use crate::disk::hash::FileHash;
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
    if r.status == 409 && v["error"]["code"] == "rename_pending" {
        return ApiError::conflict("rename_pending", format!("{what}: {msg}"));
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
    let piece = read_piece_unchecked(s, src, path, offset, len).await?;
    piece.check()?;
    Ok(piece.bytes)
}

/// A piece of a copy as read, before its SHA-256 is checked.
pub struct ReadPiece {
    pub bytes: Bytes,
    /// The SHA-256 the peer sent with it (`None`: read from this node's disk).
    pub claimed: Option<String>,
}

fn corrupt_in_transit() -> ApiError {
    ApiError::peer_failed("corrupt_in_transit", "a piece did not match its SHA-256")
}

/// [`read_piece`] without the check: for a reader that also takes the piece into the whole
/// file's hash, which [`ReadPiece::check_into`] does in the same pass.
pub async fn read_piece_unchecked<E: Env>(
    s: &Arc<Shared<E>>,
    src: &Source,
    path: &str,
    offset: u64,
    len: u64,
) -> Result<ReadPiece, ApiError> {
    if let Some(folder) = &src.folder {
        let (folder, path, moved_from) = (PathBuf::from(folder), path.to_string(), src.moved_from.clone());
        return s
            .blocking(move || {
                let file = confined_path(&folder, &path, false)?;
                let read = match (crate::disk::read_at(&file, offset, len), moved_from) {
                    // A moved copy whose rename waits for the leader is still at its old path.
                    (Err(e), Some(from)) if e.kind() == std::io::ErrorKind::NotFound => {
                        crate::disk::read_at(&confined_path(&folder, &from, false)?, offset, len)
                    }
                    (read, _) => read,
                };
                read.map(|r| r.1).map_err(|e| io_api("read copy", e))
            })
            .await
            .map(|bytes| ReadPiece { bytes, claimed: None });
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
    let _ = r.header(FILE_SIZE_HEADER);
    Ok(ReadPiece { bytes: r.body, claimed: Some(claimed) })
}

impl ReadPiece {
    /// The piece's own SHA-256 against the one its peer sent (a local piece passes).
    pub fn check(&self) -> Result<(), ApiError> {
        match &self.claimed {
            Some(claimed) if hex::encode(Sha256::digest(&self.bytes)) != *claimed => Err(corrupt_in_transit()),
            _ => Ok(()),
        }
    }

    /// `file` (the whole file's hash up to this piece) taken over the piece, the piece's own
    /// SHA-256 checked in the same pass; `file` is left as it was when the piece is corrupt.
    pub fn check_into(&self, file: &mut FileHash) -> Result<(), ApiError> {
        let Some(claimed) = &self.claimed else {
            file.update(&self.bytes);
            return Ok(());
        };
        let mut next = file.clone();
        if hex::encode(next.update_with_chunk_sum(&self.bytes)) != *claimed {
            return Err(corrupt_in_transit());
        }
        *file = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(bytes: &[u8], claimed: Option<String>) -> ReadPiece {
        ReadPiece { bytes: Bytes::copy_from_slice(bytes), claimed }
    }

    /// A piece's own SHA-256 is checked in the pass that takes it into the whole file's hash:
    /// a piece that does not match its sum leaves that hash as it was.
    #[test]
    fn a_piece_is_checked_in_the_pass_that_takes_it_into_the_file_hash() {
        let (a, b) = (vec![1u8; 5000], vec![2u8; 3000]);
        let sum = |x: &[u8]| hex::encode(Sha256::digest(x));
        let mut file = FileHash::new();
        piece(&a, Some(sum(&a))).check_into(&mut file).unwrap();
        let before = file.hex();
        let e = piece(&b, Some(sum(&a))).check_into(&mut file).unwrap_err();
        assert_eq!(e.code, "corrupt_in_transit");
        assert_eq!(file.hex(), before, "a corrupt piece is not taken");
        assert!(piece(&b, Some(sum(&a))).check().is_err());
        piece(&b, None).check_into(&mut file).unwrap();
        assert_eq!(file.hex(), sum(&[a, b].concat()), "a local piece is taken as it is");
    }
}
