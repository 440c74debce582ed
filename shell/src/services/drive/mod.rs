//! The `cluster:/` drive over HTTP (spec: "Storage (ACS) and the cluster:/ drive"): `PUT`,
//! `GET` (with `Range`) and `DELETE` on `/v1/files/{path}`, plus move and mkdir. Bytes stream;
//! a file is never held in memory whole.
//!
//! A put asks the metadata leader where its copies go in one call (`store/place` with `count`,
//! excluding nodes that already took one; a follower's single copy that the core places on
//! the follower itself, `Node::place_here`, asks no one), writes the copies, and only then publishes the
//! record, so the namespace never shows a half-written file. A large body of known length
//! streams to every copy at once as it arrives: each chunk is hashed once and written to a local
//! part file or a peer's upload session (signed chunked protocol). A small body (1 MiB or less)
//! is held in memory, any other spooled to `DATA/spool`, while hashing; then every copy is
//! written at once, a peer's in one signed `store/put` when the body is one chunk. It makes as many copies as the folder policy wants when enough nodes can take
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
use crate::disk::hash::FileHash;
use crate::env::Env;
use crate::net::client::ChannelBody;
use crate::net::transport::Transport;
use crate::node::handle::AckSpan;
use crate::node::handle::Shared;
use crate::services::peer::{
    answered_error, io_api, peer_error, read_piece, read_piece_unchecked, signed, signed_within, ReadPiece,
    PEER_TIMEOUT_MS,
};
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

/// Ask the metadata leader where `count` copies of `size` bytes go, each on another node and
/// none on a node in `exclude`, in one call. Fewer come back when no more nodes fit; none is
/// an error. A leader that takes no `count` (an older version) is asked for one. One copy that
/// the core places on this node itself ([`shoal_core::node::Node::place_here`]) needs no call.
pub async fn place<E: Env>(
    s: &Arc<Shared<E>>,
    size: u64,
    primary: Option<&VolumeId>,
    exclude: &[NodeId],
    count: u32,
) -> Result<Vec<Placed>, ApiError> {
    let (me, leader) = s.read_node(|n, now| (n.id().clone(), n.meta_leader(now)));
    let Some(leader) = leader else {
        return Err(ApiError::unavailable("no_leader", "no metadata leader right now; retry shortly"));
    };
    if count <= 1 {
        // A copy the core places on this node itself needs no round trip to the leader.
        if let Some(volume) = s.read_node(|n, now| n.place_here(now, size, primary, exclude)) {
            return Ok(vec![Placed { volume, node: me }]);
        }
    }
    let mut count = count.max(1);
    loop {
        let mut body = json!({"size": size, "writer": me, "primary": primary, "exclude": exclude});
        if count > 1 {
            body["count"] = json!(count);
        }
        let body = body.to_string().into_bytes();
        let (refused, answer) = if leader.holder == me {
            let r = s.with_node(|n, now| n.place_for_self(now, &body));
            (r.refused, r.body)
        } else {
            let r = signed(s, &leader.holder, "POST", "/cluster/acn/store/place", body, vec![]).await?;
            let r = crate::wire::error::peer_answer(r.status, r.body.to_vec());
            (r.refused, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
        };
        use shoal_core::answer::ErrorKind;
        match refused {
            Some(ErrorKind::Invalid) if count > 1 => {
                count = 1;
                continue;
            }
            Some(refused) => {
                let msg = answer["error"]["message"].as_str().unwrap_or("placement failed").to_string();
                return Err(if refused == ErrorKind::StorageFull {
                    ApiError::storage_full("insufficient_storage", msg)
                } else {
                    ApiError::unavailable("placement_failed", msg)
                });
            }
            None => {}
        }
        let one = |v: &Value| match (v["volumeId"].as_str(), v["nodeId"].as_str()) {
            (Some(volume), Some(node)) => Some(Placed { volume: VolumeId::new(volume), node: NodeId::new(node) }),
            _ => None,
        };
        let placed: Option<Vec<Placed>> = match answer["copies"].as_array() {
            Some(list) => list.iter().map(one).collect(),
            None => one(&answer).map(|p| vec![p]),
        };
        return match placed {
            Some(p) if !p.is_empty() => Ok(p),
            _ => Err(ApiError::peer_failed("peer_refused", "the leader's placement answer is malformed")),
        };
    }
}

/// Where the bytes of a put that is not streamed are while its copies are written.
#[derive(Clone)]
pub enum CopySource {
    /// A small body (up to [`put_policy::SMALL_PUT_BYTES`]), held in memory.
    Memory(Bytes),
    /// A spool file in `DATA/spool`.
    Spool(Arc<PathBuf>),
}

impl CopySource {
    /// The whole body in memory (a spool file is read; only for bodies of one chunk).
    async fn whole<E: Env>(&self, s: &Arc<Shared<E>>) -> Result<Bytes, ApiError> {
        match self {
            CopySource::Memory(b) => Ok(b.clone()),
            CopySource::Spool(p) => {
                let p = p.clone();
                s.blocking(move || std::fs::read(p.as_path()))
                    .await
                    .map(Bytes::from)
                    .map_err(|e| io_api("read spool", e))
            }
        }
    }

    /// Bytes `offset..offset+len` (fewer at the end).
    async fn range<E: Env>(&self, s: &Arc<Shared<E>>, offset: u64, len: u64) -> Result<Vec<u8>, ApiError> {
        match self {
            CopySource::Memory(b) => {
                let start = (offset as usize).min(b.len());
                let end = (offset.saturating_add(len) as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
            CopySource::Spool(p) => {
                let p = p.clone();
                s.blocking(move || read_range(&p, offset, len)).await.map_err(|e| io_api("read spool", e))
            }
        }
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

/// Take a small request body of `len` bytes into memory, hashing it. Returns it and its SHA-256.
async fn body_in_memory(body: axum::body::Body, len: u64) -> Result<(Bytes, String), ApiError> {
    let mut buf = bytes::BytesMut::with_capacity(len as usize);
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid("bad_body", format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if buf.len() as u64 + data.len() as u64 > len {
            return Err(ApiError::invalid("bad_body", "the body is longer than its content-length"));
        }
        buf.extend_from_slice(&data);
    }
    if buf.len() as u64 != len {
        return Err(ApiError::invalid("bad_body", format!("the body ended after {} of {len} bytes", buf.len())));
    }
    let sum = hex::encode(Sha256::digest(&buf));
    Ok((buf.freeze(), sum))
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
    let length = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|l| l > transfer::FILE_MAX_BYTES) {
        return Err(ApiError::too_large("body_too_large", "a file is at most 1 TiB"));
    }
    // A large body of known length streams to every copy at once as it arrives, with no spool.
    if let Some(len) = length.filter(|l| put_policy::streams(Some(*l))) {
        let (size, sum, copies) = stream_copies(s, body, len, &target, expect.as_deref()).await?;
        return publish(s, &target, size, &sum, &copies, t0).await;
    }
    // A small body is held in memory; any other is spooled to `DATA/spool` while it is hashed.
    let (size, sum, source, _spool) = if let Some(len) = length.filter(|l| put_policy::in_memory(Some(*l))) {
        let (data, sum) = body_in_memory(body, len).await?;
        (len, sum, CopySource::Memory(data), None)
    } else {
        let dir = s.data_dir.join("spool");
        std::fs::create_dir_all(&dir).map_err(|e| io_api("spool folder", e))?;
        let spool = SpoolFile(dir.join(format!("put-{:016x}", s.env.seed())));
        let (size, sum) = spool_body(&spool.0, body).await?;
        (size, sum, CopySource::Spool(Arc::new(spool.0.clone())), Some(spool))
    };
    if expect.as_ref().is_some_and(|e| *e != sum) {
        return Err(ApiError::invalid("checksum_mismatch", "the body does not match its x-shoal-sha256"));
    }
    let copies = write_copies(s, &source, &target, size, &sum).await?;
    tracing::debug!(path = %target.path, size, took_ms = s.env.monotonic().since(t0), "copies written");
    publish(s, &target, size, &sum, &copies, t0).await
}

/// Write the copies of a body held in memory or spooled: one placement call for every copy
/// wanted, the copies written in parallel; a node that cannot take its copy is passed over for
/// another (up to [`put_policy::placement_tries`] placements in all). At least one copy must
/// land. Answers the copies in placement order (the first is the file's primary).
async fn write_copies<E: Env>(
    s: &Arc<Shared<E>>,
    source: &CopySource,
    target: &PutTarget,
    size: u64,
    sum: &str,
) -> Result<Vec<(VolumeId, NodeId)>, ApiError> {
    let wanted = target.wanted.max(1) as usize;
    let mut tries = put_policy::placement_tries(target.wanted) as usize;
    let mut copies: Vec<(VolumeId, NodeId)> = Vec::new();
    let mut exclude: Vec<NodeId> = Vec::new();
    let mut last_err = None;
    while copies.len() < wanted && tries > 0 {
        let need = (wanted - copies.len()).min(tries) as u32;
        let placed = match place(s, size, target.primary.as_ref(), &exclude, need).await {
            Ok(p) => p,
            Err(e) => {
                last_err = Some(e);
                break;
            }
        };
        tries = tries.saturating_sub(placed.len());
        exclude.extend(placed.iter().map(|p| p.node.clone()));
        let mut writes = tokio::task::JoinSet::new();
        for (i, to) in placed.into_iter().enumerate() {
            let (s, source, target, sum) = (s.clone(), source.clone(), target.clone(), sum.to_string());
            writes.spawn(async move {
                let r = write_copy(&s, &source, &target, size, &sum, &to).await;
                (i, to, r)
            });
        }
        let mut landed = Vec::new();
        while let Some(done) = writes.join_next().await {
            let (i, to, r) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            match r {
                Ok(()) => landed.push((i, (to.volume, to.node))),
                Err(e) => {
                    tracing::warn!(node = %to.node, error = %e.message, "a copy could not be written");
                    last_err = Some(e);
                }
            }
        }
        landed.sort_by_key(|(i, _)| *i);
        copies.extend(landed.into_iter().map(|(_, c)| c));
    }
    if copies.is_empty() {
        return Err(
            last_err.unwrap_or_else(|| ApiError::storage_full("insufficient_storage", "no volume could take the file"))
        );
    }
    Ok(copies)
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
            // An overwrite's copies here kept the bytes they replaced: put back at once.
            if target.replaces.is_some() {
                s.disk_kick();
            }
            return Err(e);
        }
    };
    if copies.len() < target.wanted as usize {
        s.repl_kick();
    }
    let mut v = crate::wire::error::json_of(v);
    let held = s.wait_for_held(RECORD_WAIT_MS, |n, _| n.file_record_held_elsewhere(&target.path)).await;
    v["recordReplicated"] = json!(held);
    tracing::debug!(path = %target.path, size, copies = copies.len(), held, put_ms = s.env.monotonic().since(t0), "put");
    Ok((v, span))
}
