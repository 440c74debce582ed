//! The `cluster:/` drive over HTTP (spec: "Storage (ACS) and the cluster:/ drive"): `PUT`,
//! `GET` (with `Range`) and `DELETE` on `/v1/files/{path}`, plus move and mkdir. Bytes stream;
//! a file is never held in memory whole.
//!
//! A put asks the metadata leader where each copy goes (`store/place`, excluding nodes that
//! already took one), writes the copies, and only then publishes the record, so the namespace
//! never shows a half-written file. A large body of known length streams to every copy at once
//! as it arrives: each chunk is hashed once and written to a local part file or a peer's upload
//! session (signed chunked protocol). Other bodies are spooled to `DATA/spool` while hashing,
//! then copied. It makes as many copies as the folder policy wants when enough nodes can take
//! them, and at least one; the planner makes up the rest. Bytes are renamed into place only
//! through [`crate::node::state::Landed::land`], which keeps racing writes of one path from
//! leaving one's record over the other's bytes.
//!
//! A get reads the best copy (this node's, then ONLINE peers), hashing as it streams; a copy
//! that cannot be read is skipped for the next, and one whose bytes do not match the file's
//! SHA-256 is marked stale (the planner repairs it) and the stream is cut, so the client sees
//! an incomplete body and not a wrong one; the CLI then fetches again from another copy.
//! Decisions (what may be written, which copies count, what a publish writes) are the core's
//! (`shoal_core::node::files`).

mod copies;
mod get;

pub use copies::write_copy;
use copies::*;
pub use get::get;

use crate::disk::confined_path;
use crate::env::Env;
use crate::net::client::ChannelBody;
use crate::net::transport::Transport;
use crate::node::handle::AckSpan;
use crate::node::handle::Shared;
use crate::services::peer::{answered_error, io_api, peer_error, read_piece, signed, signed_within, PEER_TIMEOUT_MS};
use crate::services::store_service::copy_path;
use crate::wire::{CHUNK_SHA_HEADER, COPY_HEADER, SHA_HEADER};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_core::meta::records::LocationState;
use shoal_core::node::files::{PutTarget, Source};
use shoal_core::node::ApiError;
use shoal_core::storage::put_policy::{self, STRAGGLER_MS};
use shoal_core::storage::transfer::{self, CHUNK_BYTES};
use shoal_core::{NodeId, VolumeId};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How long a put waits for a peer to open an upload session.
const BEGIN_TIMEOUT_MS: u64 = 10_000;
/// Chunk uploads to one peer in flight at once.
const CHUNKS_IN_FLIGHT: usize = 2;
/// Pieces of a get fetched ahead of the one going out.
const PIECES_AHEAD: usize = 2;
/// Read size for local copies while streaming.
const READ_BYTES: usize = 1 << 20;

/// The error a peer answered, as ours.
/// Where one copy goes.
#[derive(Clone, Debug)]
pub struct Placed {
    pub volume: VolumeId,
    pub node: NodeId,
}

/// Ask the metadata leader where a copy of `size` bytes goes.
pub async fn place<E: Env>(
    s: &Arc<Shared<E>>,
    size: u64,
    primary: Option<&VolumeId>,
    exclude: &[NodeId],
) -> Result<Placed, ApiError> {
    let (me, leader) = s.read_node(|n, now| (n.id().clone(), n.meta_leader(now)));
    let Some(leader) = leader else {
        return Err(ApiError::unavailable("no_leader", "no metadata leader right now; retry shortly"));
    };
    let body = json!({"size": size, "writer": me, "primary": primary, "exclude": exclude}).to_string().into_bytes();
    let (refused, answer) = if leader.holder == me {
        let r = s.with_node(|n, now| n.place_for_self(now, &body));
        (r.refused, r.body)
    } else {
        let r = signed(s, &leader.holder, "POST", "/cluster/acn/store/place", body, vec![]).await?;
        let r = crate::wire::error::peer_answer(r.status, r.body.to_vec());
        (r.refused, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
    };
    if let Some(refused) = refused {
        let msg = answer["error"]["message"].as_str().unwrap_or("placement failed").to_string();
        return Err(if refused == shoal_core::answer::ErrorKind::StorageFull {
            ApiError::storage_full("insufficient_storage", msg)
        } else {
            ApiError::unavailable("placement_failed", msg)
        });
    }
    let volume = answer["volumeId"].as_str().map(VolumeId::new);
    let node = answer["nodeId"].as_str().map(NodeId::new);
    match (volume, node) {
        (Some(volume), Some(node)) => Ok(Placed { volume, node }),
        _ => Err(ApiError::peer_failed("peer_refused", "the leader's placement answer is malformed")),
    }
}

/// Removes the spool file however the put ends.
struct SpoolFile(PathBuf);

impl Drop for SpoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Stream a request body to `spool`, hashing it. Returns size and SHA-256.
async fn spool_body(spool: &Path, body: axum::body::Body) -> Result<(u64, String), ApiError> {
    let file = std::fs::File::create(spool).map_err(|e| io_api("create spool file", e))?;
    let mut out = std::io::BufWriter::with_capacity(READ_BYTES, file);
    let mut hash = Sha256::new();
    let mut size = 0u64;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid("bad_body", format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        size += data.len() as u64;
        if size > transfer::FILE_MAX_BYTES {
            return Err(ApiError::too_large("body_too_large", "a file is at most 1 TiB"));
        }
        hash.update(&data);
        out.write_all(&data).map_err(|e| io_api("spool", e))?;
    }
    // Not fsynced: the spool is scratch; the copies made from it are.
    out.into_inner().map_err(|e| io_api("spool", e.into_error()))?;
    Ok((size, hex::encode(hash.finalize())))
}

/// `PUT /v1/files/{path}`.
/// `owner`: the account writing (`admin-token` for the admin token); a new file's record keeps it.
pub async fn put<E: Env>(
    s: Arc<Shared<E>>,
    path: String,
    headers: HeaderMap,
    body: axum::body::Body,
    owner: String,
) -> Response {
    // A put runs to its end even if the client goes away meanwhile: copies that landed are
    // published, and a body cut short aborts every copy it started.
    let put = tokio::spawn(async move { put_inner(&s, &path, &headers, body, &owner).await });
    match put.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
        Ok((v, span)) => {
            let mut resp = crate::wire::error::api_result(Ok::<_, ApiError>(v));
            resp.extensions_mut().insert(span);
            resp
        }
        Err(e) => crate::wire::error::api_result::<Value>(Err(e)),
    }
}

async fn put_inner<E: Env>(
    s: &Arc<Shared<E>>,
    path: &str,
    headers: &HeaderMap,
    body: axum::body::Body,
    owner: &str,
) -> Result<(Value, AckSpan), ApiError> {
    let mut target = s.read_node(|n, _| n.file_put_target(path))?;
    target.owner = owner.to_string();
    let expect = headers.get(SHA_HEADER).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    if let Some(e) = &expect {
        transfer::check_checksum(e).map_err(|e| ApiError::invalid("bad_checksum", e.to_string()))?;
    }
    let t0 = s.env.monotonic();
    let mut copies: Vec<(VolumeId, NodeId)> = Vec::new();
    let mut exclude: Vec<NodeId> = Vec::new();
    let mut last_err = None;
    let length = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|l| l > transfer::FILE_MAX_BYTES) {
        return Err(ApiError::too_large("body_too_large", "a file is at most 1 TiB"));
    }
    // A large body of known length streams to every copy at once as it arrives, with no spool.
    if let Some(len) = length.filter(|l| put_policy::streams(Some(*l))) {
        let (size, sum, copies) = stream_copies(s, body, len, &target, expect.as_deref()).await?;
        return publish(s, &target, size, &sum, &copies, t0).await;
    }
    // Otherwise the body is spooled first, then copied to each placed volume in turn.
    let dir = s.data_dir.join("spool");
    std::fs::create_dir_all(&dir).map_err(|e| io_api("spool folder", e))?;
    let spool = SpoolFile(dir.join(format!("put-{:016x}", s.env.seed())));
    let (size, sum) = spool_body(&spool.0, body).await?;
    let t1 = s.env.monotonic();
    if expect.as_ref().is_some_and(|e| *e != sum) {
        return Err(ApiError::invalid("checksum_mismatch", "the body does not match its x-shoal-sha256"));
    }
    for _ in 0..put_policy::placement_tries(target.wanted) {
        if copies.len() >= target.wanted as usize {
            break;
        }
        let to = match place(s, size, target.primary.as_ref(), &exclude).await {
            Ok(p) => p,
            Err(e) => {
                last_err = Some(e);
                break;
            }
        };
        exclude.push(to.node.clone());
        match write_copy(s, &spool.0, &target, size, &sum, &to).await {
            Ok(()) => copies.push((to.volume, to.node)),
            Err(e) => {
                tracing::warn!(node = %to.node, error = %e.message, "a copy could not be written");
                last_err = Some(e);
            }
        }
    }
    if copies.is_empty() {
        return Err(
            last_err.unwrap_or_else(|| ApiError::storage_full("insufficient_storage", "no volume could take the file"))
        );
    }
    tracing::debug!(path = %target.path, size, spool_ms = t1.since(t0), "spooled");
    publish(s, &target, size, &sum, &copies, t0).await
}

/// How long a put waits, once its record is published here, for another node (the leader) to
/// hold the record too before it answers.
const RECORD_WAIT_MS: u64 = 3_000;

/// Publish the record of a put whose copies are in place, and wait (a little) until the
/// leader holds it too, so the answer survives losing this node; `recordReplicated` says
/// whether it did. The put's metadata changes are this one publish: its marks are the
/// acknowledgement's span.
async fn publish<E: Env>(
    s: &Arc<Shared<E>>,
    target: &PutTarget,
    size: u64,
    sum: &str,
    copies: &[(VolumeId, NodeId)],
    t0: shoal_core::Millis,
) -> Result<(Value, AckSpan), ApiError> {
    let mod_time = s.env.now().0;
    let (published, span) = s.with_node(|n, now| {
        let from = n.ack_position();
        let r = n.file_publish_as(now, &target.path, size, sum, mod_time, copies, &target.owner);
        (r, AckSpan(from, n.ack_position()))
    });
    let v = match published {
        Ok(v) => v,
        Err(e) => {
            // The bytes that landed here are no copy of anything: they hold no other write back.
            let me = s.read_node(|n, _| n.id().clone());
            for (volume, _) in copies.iter().filter(|(_, node)| *node == me) {
                s.store_service.landed.forget(s, volume, &target.path, sum);
            }
            return Err(e);
        }
    };
    if copies.len() < target.wanted as usize {
        s.repl_kick();
    }
    let mut v = crate::wire::error::json_of(v);
    let held = s.wait_for(RECORD_WAIT_MS, |n, _| n.file_record_held_elsewhere(&target.path)).await;
    v["recordReplicated"] = json!(held);
    tracing::debug!(path = %target.path, size, copies = copies.len(), held, put_ms = s.env.monotonic().since(t0), "put");
    Ok((v, span))
}
