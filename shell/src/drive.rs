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
//! through [`crate::service_state::Landed::land`], which keeps racing writes of one path from
//! leaving one's record over the other's bytes.
//!
//! A get reads the best copy (this node's, then ONLINE peers), hashing as it streams; a copy
//! that cannot be read is skipped for the next, and one whose bytes do not match the file's
//! SHA-256 is marked stale (the planner repairs it) and the stream is cut, so the client sees
//! an incomplete body and not a wrong one; the CLI then fetches again from another copy.
//! Decisions (what may be written, which copies count, what a publish writes) are the core's
//! (`shoal_core::node::files`).

use crate::client::ChannelBody;
use crate::disk::confined_path;
use crate::env::Env;
use crate::node_handle::Shared;
use crate::peer::{answered_error, io_api, peer_error, read_piece, signed, signed_within, PEER_TIMEOUT_MS};
use crate::store_service::copy_path;
use crate::transport::Transport;
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

/// `store/begin` on peer `to`: a small request a healthy peer answers at once, so a peer that
/// does not answer within [`BEGIN_TIMEOUT_MS`] is passed over for another.
async fn begin_upload<E: Env>(s: &Arc<Shared<E>>, to: &NodeId, begin: Value) -> Result<Value, ApiError> {
    let target = "/cluster/acn/store/begin";
    let r = signed_within(s, to, "POST", target, begin.to_string().into_bytes(), vec![], BEGIN_TIMEOUT_MS).await?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/begin"));
    }
    Ok(serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

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
        return Err(ApiError::new(503, "no_leader", "no metadata leader right now; retry shortly"));
    };
    let body = json!({"size": size, "writer": me, "primary": primary, "exclude": exclude}).to_string().into_bytes();
    let (status, answer) = if leader.holder == me {
        let r = s.with_node(|n, now| n.place_for_self(now, &body));
        (r.status, r.body)
    } else {
        let r = signed(s, &leader.holder, "POST", "/cluster/acn/store/place", body, vec![]).await?;
        (r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null))
    };
    if status != 200 {
        let msg = answer["error"]["message"].as_str().unwrap_or("placement failed").to_string();
        return Err(if status == 507 {
            ApiError::new(507, "insufficient_storage", msg)
        } else {
            ApiError::new(503, "placement_failed", msg)
        });
    }
    let volume = answer["volumeId"].as_str().map(VolumeId::new);
    let node = answer["nodeId"].as_str().map(NodeId::new);
    match (volume, node) {
        (Some(volume), Some(node)) => Ok(Placed { volume, node }),
        _ => Err(ApiError::new(502, "peer_refused", "the leader's placement answer is malformed")),
    }
}

/// Copy `spool` (whose SHA-256 is `sum`) to `path` on the placed volume.
pub async fn write_copy<E: Env>(
    s: &Arc<Shared<E>>,
    spool: &Path,
    target: &PutTarget,
    size: u64,
    sum: &str,
    to: &Placed,
) -> Result<(), ApiError> {
    let me = s.read_node(|n, _| n.id().clone());
    let path = target.path.as_str();
    if to.node == me {
        let vol = s
            .read_node(|n, _| n.local_volume(to.volume.as_str()))
            .ok_or_else(|| ApiError::new(409, "unknown_volume", "the placed volume is gone"))?;
        if let Some(dest) = copy_path(s, &to.volume, path) {
            s.store_service.landed.wait_settled(s, &to.volume, path, sum, target.replaces.as_deref(), &dest).await;
        }
        let (s2, to, sum, target) = (s.clone(), to.clone(), sum.to_string(), target.clone());
        let (spool, tag) = (spool.to_path_buf(), format!("{:016x}", s.env.seed()));
        return s.blocking(move || install_local(&s2, Path::new(&vol.subpath), &to, &target, &sum, &spool, &tag)).await;
    }
    let file_id = target.file_id.clone().unwrap_or_default();
    let begin = json!({"volumeId": to.volume, "path": path, "size": size, "checksum": sum, "fileId": file_id});
    let v = begin_upload(s, &to.node, begin).await?;
    let session = v["sessionId"].as_str().unwrap_or_default().to_string();
    let sent = send_spooled(s, spool, size, to, &session, target.replaces.as_deref(), &v).await;
    if sent.is_err() {
        // Free the peer's session and part file now rather than in 30 minutes.
        let _ =
            signed(s, &to.node, "POST", &format!("/cluster/acn/store/abort?session={session}"), vec![], vec![]).await;
    }
    sent
}

/// The chunks of a spooled file the peer does not have yet, then the commit.
async fn send_spooled<E: Env>(
    s: &Arc<Shared<E>>,
    spool: &Path,
    size: u64,
    to: &Placed,
    session: &str,
    replaces: Option<&str>,
    v: &Value,
) -> Result<(), ApiError> {
    let have: Vec<u64> =
        v["have"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
    // Chunks go out in order with up to CHUNKS_IN_FLIGHT requests at once, so reading and
    // hashing the next chunk here overlaps with the peer taking the last one.
    let mut in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Result<(), ApiError>>> = Default::default();
    for index in 0..transfer::chunk_count(size) {
        if have.contains(&index) {
            continue;
        }
        while in_flight.len() >= CHUNKS_IN_FLIGHT {
            let done = in_flight.pop_front().expect("not empty");
            done.await.map_err(|e| ApiError::new(500, "internal", e.to_string()))??;
        }
        let spool2 = spool.to_path_buf();
        let data = s.blocking(move || read_range(&spool2, index * CHUNK_BYTES, CHUNK_BYTES)).await;
        let data = data.map_err(|e| io_api("read spool", e))?;
        in_flight.push_back(send_chunk(s, &to.node, session, index, data));
    }
    for done in in_flight {
        done.await.map_err(|e| ApiError::new(500, "internal", e.to_string()))??;
    }
    let sent_at = s.env.monotonic();
    let r = signed(s, &to.node, "POST", &commit_target(session, None, replaces), vec![], vec![]).await?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/commit"));
    }
    tracing::debug!(node = %to.node, commit_ms = s.env.monotonic().since(sent_at), "copy sent");
    Ok(())
}

/// `store/commit` of upload `session`, naming the SHA-256 when the upload did not at begin, and
/// the content the write replaces when the path held a file.
fn commit_target(session: &str, checksum: Option<&str>, replaces: Option<&str>) -> String {
    let mut t = format!("/cluster/acn/store/commit?session={session}");
    if let Some(c) = checksum {
        t.push_str(&format!("&checksum={c}"));
    }
    if let Some(r) = replaces {
        t.push_str(&format!("&replaces={r}"));
    }
    t
}

/// Send chunk `index` of upload `session` to `node`, in the background.
fn send_chunk<E: Env>(
    s: &Arc<Shared<E>>,
    node: &NodeId,
    session: &str,
    index: u64,
    data: Vec<u8>,
) -> tokio::task::JoinHandle<Result<(), ApiError>> {
    let (s2, node, session) = (s.clone(), node.clone(), session.to_string());
    tokio::spawn(async move {
        let data = Bytes::from(data);
        let sha = hex::encode(Sha256::digest(&data));
        send_chunk_hashed(&s2, &node, &session, index, data, sha).await
    })
}

/// Send chunk `index` of upload `session`, whose SHA-256 is `sha`, to `node`. The chunk's
/// SHA-256 is also its body hash for the signature: hashed once.
async fn send_chunk_hashed<E: Env>(
    s: &Arc<Shared<E>>,
    node: &NodeId,
    session: &str,
    index: u64,
    data: Bytes,
    sha: String,
) -> Result<(), ApiError> {
    let target = format!("/cluster/acn/store/chunk?session={session}&index={index}");
    let prepared = s
        .with_node(|n, now| Transport::<E>::prepare_hashed(n, now, node, "POST", &target, data, &sha))
        .map_err(peer_error);
    let mut prepared = prepared?;
    prepared.headers.push((CHUNK_SHA_HEADER, sha));
    let r = s.transport.send(prepared, PEER_TIMEOUT_MS).await.map_err(peer_error)?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/chunk"));
    }
    Ok(())
}

/// One copy a streamed put is writing as the body arrives: a part file in one of this node's
/// volumes, or a peer's upload session.
enum Sink {
    Local {
        placed: Placed,
        path: String,
        part: PathBuf,
        dest: PathBuf,
        file: Arc<std::fs::File>,
        /// The volume is not retired while this copy is written.
        _writing: crate::service_state::WriteGuard,
    },
    Peer {
        placed: Placed,
        session: String,
    },
}

impl Sink {
    fn placed(&self) -> &Placed {
        match self {
            Sink::Local { placed, .. } | Sink::Peer { placed, .. } => placed,
        }
    }
}

/// Start writing a copy of `len` bytes at `path` where `to` says.
async fn open_sink<E: Env>(s: &Arc<Shared<E>>, to: &Placed, target: &PutTarget, len: u64) -> Result<Sink, ApiError> {
    let path = target.path.as_str();
    let me = s.read_node(|n, _| n.id().clone());
    if to.node == me {
        let writing = s.store_service.writing(&to.volume);
        let vol = s
            .read_node(|n, _| n.local_volume(to.volume.as_str()))
            .ok_or_else(|| ApiError::new(409, "unknown_volume", "the placed volume is gone"))?;
        let (path2, tag) = (path.to_string(), format!("{:016x}", s.env.seed()));
        let (dest, part, file) = s
            .blocking(move || -> Result<_, ApiError> {
                let dest = confined_path(Path::new(&vol.subpath), &path2, true)?;
                let part = part_path(&dest, &tag);
                let file = std::fs::File::create(&part).map_err(|e| io_api("create part file", e))?;
                Ok((dest, part, file))
            })
            .await?;
        let (placed, path) = (to.clone(), path.to_string());
        return Ok(Sink::Local { placed, path, part, dest, file: Arc::new(file), _writing: writing });
    }
    let file_id = target.file_id.clone().unwrap_or_default();
    let begin = json!({"volumeId": to.volume, "path": path, "size": len, "checksum": "", "fileId": file_id});
    let v = begin_upload(s, &to.node, begin).await?;
    let session = v["sessionId"].as_str().unwrap_or_default().to_string();
    Ok(Sink::Peer { placed: to.clone(), session })
}

/// Write chunk `index` to each of the `live` sinks at once, hashing it once. Answers the
/// sinks that failed, with why. A sink still writing [`STRAGGLER_MS`] after another one wrote
/// the chunk counts as failed (a peer that hangs would otherwise hold up the whole put until
/// its 60 s timeout); its write is cut and the planner makes that copy later. That happens only
/// while `keep` sinks wrote the chunk: a put never gives up a copy to be quicker when that would
/// leave it fewer than `keep` (two, or the one wanted).
fn write_chunk<E: Env>(
    s: &Arc<Shared<E>>,
    sinks: &Arc<Vec<Sink>>,
    live: Vec<usize>,
    keep: usize,
    index: u64,
    data: Bytes,
) -> tokio::task::JoinHandle<Vec<(usize, ApiError)>> {
    let (s, sinks) = (s.clone(), sinks.clone());
    tokio::spawn(async move {
        let needs_sha = live.iter().any(|&i| matches!(sinks[i], Sink::Peer { .. }));
        let sha = if needs_sha {
            let d = data.clone();
            s.blocking(move || hex::encode(Sha256::digest(&d))).await
        } else {
            String::new()
        };
        let mut writes = tokio::task::JoinSet::new();
        for &i in &live {
            let (s, sinks, data, sha) = (s.clone(), sinks.clone(), data.clone(), sha.clone());
            writes.spawn(async move {
                let r = match &sinks[i] {
                    Sink::Peer { placed, session } => {
                        send_chunk_hashed(&s, &placed.node, session, index, data, sha).await
                    }
                    Sink::Local { part, .. } => {
                        let part = part.clone();
                        s.blocking(move || crate::disk::write_at(&part, index * CHUNK_BYTES, &data))
                            .await
                            .map_err(|e| io_api("write copy", e))
                    }
                };
                (i, r)
            });
        }
        let mut failed = Vec::new();
        let mut pending: std::collections::BTreeSet<usize> = live.iter().copied().collect();
        let mut deadline = None;
        let mut written = 0;
        loop {
            let next = match deadline {
                None => writes.join_next().await,
                Some(at) => match tokio::time::timeout_at(at, writes.join_next()).await {
                    Ok(next) => next,
                    Err(_) if written < keep => {
                        // Too few copies have it to give up on the others: wait for them.
                        deadline = None;
                        continue;
                    }
                    Err(_) => {
                        writes.abort_all();
                        for i in std::mem::take(&mut pending) {
                            let why = format!("fell more than {} s behind the other copies", STRAGGLER_MS / 1000);
                            failed.push((i, ApiError::new(504, "copy_too_slow", why)));
                        }
                        break;
                    }
                },
            };
            let Some(done) = next else { break };
            let (i, r) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            pending.remove(&i);
            match r {
                Ok(()) => {
                    written += 1;
                    deadline.get_or_insert_with(|| {
                        tokio::time::Instant::now() + std::time::Duration::from_millis(STRAGGLER_MS)
                    });
                }
                Err(e) => failed.push((i, e)),
            }
        }
        failed
    })
}

/// Chunk writes in flight, oldest first, and the sinks that failed so far.
struct Fanout {
    sinks: Arc<Vec<Sink>>,
    /// Copies a chunk must reach before a lagging one is given up (see [`write_chunk`]).
    keep: usize,
    dead: Vec<Option<ApiError>>,
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Vec<(usize, ApiError)>>>,
}

impl Fanout {
    fn live(&self) -> Vec<usize> {
        (0..self.sinks.len()).filter(|&i| self.dead[i].is_none()).collect()
    }

    /// Wait until at most `keep` chunk writes are in flight; fails once no sink is left.
    async fn settle(&mut self, keep: usize) -> Result<(), ApiError> {
        while self.in_flight.len() > keep {
            let done = self.in_flight.pop_front().expect("not empty");
            let failed = match done.await {
                Ok(f) => f,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            for (i, e) in failed {
                tracing::warn!(node = %self.sinks[i].placed().node, error = %e.message, "a copy could not be written");
                self.dead[i].get_or_insert(e);
            }
        }
        if self.live().is_empty() {
            return Err(self
                .dead
                .iter()
                .flatten()
                .next()
                .cloned()
                .unwrap_or_else(|| ApiError::new(507, "insufficient_storage", "no volume could take the file")));
        }
        Ok(())
    }
}

/// Stream a request body of `len` bytes to every placed copy at once as it arrives, hashing
/// it, with no spool: each chunk is hashed once and written to a local part file or sent to a
/// peer's upload session. `expect` (the client's SHA-256) is checked before any commit, so a
/// wrong body never lands. A copy that fails is left out; at least one must succeed. Returns
/// size, SHA-256 and the copies made.
async fn stream_copies<E: Env>(
    s: &Arc<Shared<E>>,
    body: axum::body::Body,
    len: u64,
    target: &PutTarget,
    expect: Option<&str>,
) -> Result<(u64, String, Vec<(VolumeId, NodeId)>), ApiError> {
    // Where each copy goes; a node that cannot start one is passed over for another.
    let mut sinks = Vec::new();
    let mut last_err = None;
    let mut exclude: Vec<NodeId> = Vec::new();
    for _ in 0..put_policy::placement_tries(target.wanted) {
        if sinks.len() >= target.wanted as usize {
            break;
        }
        let to = match place(s, len, target.primary.as_ref(), &exclude).await {
            Ok(p) => p,
            Err(e) => {
                last_err = Some(e);
                break;
            }
        };
        exclude.push(to.node.clone());
        match open_sink(s, &to, target, len).await {
            Ok(sink) => sinks.push(sink),
            Err(e) => {
                tracing::warn!(node = %to.node, error = %e.message, "a copy could not be started");
                last_err = Some(e);
            }
        }
    }
    if sinks.is_empty() {
        return Err(
            last_err.unwrap_or_else(|| ApiError::new(507, "insufficient_storage", "no volume could take the file"))
        );
    }
    let n = sinks.len();
    let keep = put_policy::copies_to_keep(target.wanted);
    let mut out = Fanout { sinks: Arc::new(sinks), keep, dead: vec![None; n], in_flight: Default::default() };
    let streamed = stream_chunks(s, &mut out, body, len, expect).await;
    // The namespace may have changed while the body came (a move, a folder made there): checked
    // again before any copy lands, so bytes land only for a record that can be published.
    let checked = streamed.and_then(|sum| s.read_node(|n, _| n.file_put_target(&target.path)).map(|_| sum));
    let sum = match checked {
        Ok(sum) => sum,
        Err(e) => {
            // Every copy is let go (at once) before the put answers, so it leaves nothing behind.
            let aborts: Vec<_> = (0..out.sinks.len()).map(|i| abort_in_background(s, &out.sinks, i)).collect();
            for a in aborts {
                let _ = a.await;
            }
            return Err(e);
        }
    };
    // The copies that failed are let go in the background; the others commit at once.
    let mut commits = Vec::new();
    for i in 0..out.sinks.len() {
        if let Some(e) = &out.dead[i] {
            last_err = Some(e.clone());
            abort_in_background(s, &out.sinks, i);
            continue;
        }
        let (s2, sinks, sum, replaces) = (s.clone(), out.sinks.clone(), sum.clone(), target.replaces.clone());
        commits
            .push((i, tokio::spawn(async move { commit_sink(&s2, &sinks[i], &sum, len, replaces.as_deref()).await })));
    }
    let mut copies = Vec::new();
    for (i, commit) in commits {
        let sink = &out.sinks[i];
        match commit.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
            Ok(()) => copies.push((sink.placed().volume.clone(), sink.placed().node.clone())),
            Err(e) => {
                tracing::warn!(node = %sink.placed().node, error = %e.message, "a copy could not be committed");
                abort_in_background(s, &out.sinks, i);
                last_err = Some(e);
            }
        }
    }
    if copies.is_empty() {
        return Err(last_err.expect("every sink failed with an error"));
    }
    Ok((len, sum, copies))
}

/// Give up copy `i` in the background (a peer that hangs holds up nothing that does not wait).
fn abort_in_background<E: Env>(s: &Arc<Shared<E>>, sinks: &Arc<Vec<Sink>>, i: usize) -> tokio::task::JoinHandle<()> {
    let (s, sinks) = (s.clone(), sinks.clone());
    tokio::spawn(async move { abort_sink(&s, &sinks[i]).await })
}

async fn stream_chunks<E: Env>(
    s: &Arc<Shared<E>>,
    out: &mut Fanout,
    body: axum::body::Body,
    len: u64,
    expect: Option<&str>,
) -> Result<String, ApiError> {
    let mut hash = Sha256::new();
    let mut size = 0u64;
    let mut chunk = bytes::BytesMut::with_capacity(CHUNK_BYTES as usize);
    let mut index = 0u64;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::new(400, "bad_body", format!("request body: {e}")))?;
        let Ok(mut data) = frame.into_data() else { continue };
        size += data.len() as u64;
        if size > len {
            return Err(ApiError::new(400, "bad_body", "the body is longer than its content-length"));
        }
        hash.update(&data);
        while !data.is_empty() {
            let take = (CHUNK_BYTES as usize - chunk.len()).min(data.len());
            chunk.extend_from_slice(&data.split_to(take));
            if chunk.len() == CHUNK_BYTES as usize {
                out.settle(CHUNKS_IN_FLIGHT - 1).await?;
                let full = std::mem::replace(&mut chunk, bytes::BytesMut::with_capacity(CHUNK_BYTES as usize));
                out.in_flight.push_back(write_chunk(s, &out.sinks, out.live(), out.keep, index, full.freeze()));
                index += 1;
            }
        }
    }
    if size != len {
        return Err(ApiError::new(400, "bad_body", format!("the body ended after {size} of {len} bytes")));
    }
    if !chunk.is_empty() || index == 0 {
        out.settle(CHUNKS_IN_FLIGHT - 1).await?;
        out.in_flight.push_back(write_chunk(s, &out.sinks, out.live(), out.keep, index, chunk.freeze()));
    }
    out.settle(0).await?;
    let sum = hex::encode(hash.finalize());
    if expect.is_some_and(|e| e != sum) {
        return Err(ApiError::new(400, "checksum_mismatch", "the body does not match its x-shoal-sha256"));
    }
    Ok(sum)
}

/// Put a fully written copy in place: a local part file is fsynced and renamed; a peer is
/// asked to commit, naming the SHA-256.
async fn commit_sink<E: Env>(
    s: &Arc<Shared<E>>,
    sink: &Sink,
    sum: &str,
    size: u64,
    replaces: Option<&str>,
) -> Result<(), ApiError> {
    match sink {
        Sink::Peer { placed, session } => {
            let target = commit_target(session, Some(sum), replaces);
            let r = signed(s, &placed.node, "POST", &target, vec![], vec![]).await?;
            if r.status != 200 {
                return Err(answered_error(&r, "store/commit"));
            }
            Ok(())
        }
        Sink::Local { placed, path, part, dest, file, .. } => {
            s.store_service.landed.wait_settled(s, &placed.volume, path, sum, replaces, dest).await;
            let (s2, placed, path, sum) = (s.clone(), placed.clone(), path.clone(), sum.to_string());
            let replaces = replaces.map(str::to_string);
            let (part, dest, file) = (part.clone(), dest.clone(), file.clone());
            s.blocking(move || -> Result<(), ApiError> {
                let synced = file.metadata().and_then(|m| {
                    if m.len() != size {
                        return Err(std::io::Error::other("the part file has the wrong length"));
                    }
                    file.sync_all()
                });
                synced.map_err(|e| io_api("write copy", e))?;
                let landed =
                    s2.store_service.landed.land(&s2, &placed.volume, &path, &sum, replaces.as_deref(), &dest, || {
                        std::fs::rename(&part, &dest)
                    });
                landed.map_err(|c| c.api_error())?.map_err(|e| io_api("write copy", e))?;
                if let Some(dir) = dest.parent() {
                    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
                }
                Ok(())
            })
            .await
        }
    }
}

/// Give up a copy: free the peer's session now rather than in 30 minutes, or remove the part file.
async fn abort_sink<E: Env>(s: &Arc<Shared<E>>, sink: &Sink) {
    match sink {
        Sink::Peer { placed, session } => {
            let target = format!("/cluster/acn/store/abort?session={session}");
            let _ = signed(s, &placed.node, "POST", &target, vec![], vec![]).await;
        }
        Sink::Local { part, .. } => {
            let part = part.clone();
            s.blocking(move || {
                let _ = std::fs::remove_file(part);
            })
            .await;
        }
    }
}

/// Copy a spooled file into a local volume: a part file, fsynced, renamed into place.
fn install_local<E: Env>(
    s: &Arc<Shared<E>>,
    folder: &Path,
    to: &Placed,
    target: &PutTarget,
    sum: &str,
    spool: &Path,
    tag: &str,
) -> Result<(), ApiError> {
    let _writing = s.store_service.writing(&to.volume);
    let dest = confined_path(folder, &target.path, true)?;
    let part = part_path(&dest, tag);
    let copied = std::fs::copy(spool, &part).and_then(|_| std::fs::File::open(&part)?.sync_all());
    let (volume, path, replaces) = (&to.volume, target.path.as_str(), target.replaces.as_deref());
    let done = match copied {
        Ok(()) => s.store_service.landed.land(s, volume, path, sum, replaces, &dest, || std::fs::rename(&part, &dest)),
        Err(e) => Ok(Err(e)),
    };
    let done = match done {
        Ok(r) => r.map_err(|e| io_api("write copy", e)),
        Err(conflict) => Err(conflict.api_error()),
    };
    if let Err(e) = done {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    if let Some(dir) = dest.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// The part file beside `dest` that a copy is written to before it is renamed into place.
fn part_path(dest: &Path, tag: &str) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(transfer::part_file_name(&name, tag))
}

fn read_range(file: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(file)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
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
        let frame = frame.map_err(|e| ApiError::new(400, "bad_body", format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        size += data.len() as u64;
        if size > transfer::FILE_MAX_BYTES {
            return Err(ApiError::new(413, "body_too_large", "a file is at most 1 TiB"));
        }
        hash.update(&data);
        out.write_all(&data).map_err(|e| io_api("spool", e))?;
    }
    // Not fsynced: the spool is scratch; the copies made from it are.
    out.into_inner().map_err(|e| io_api("spool", e.into_error()))?;
    Ok((size, hex::encode(hash.finalize())))
}

/// `PUT /v1/files/{path}`.
pub async fn put<E: Env>(s: Arc<Shared<E>>, path: String, headers: HeaderMap, body: axum::body::Body) -> Response {
    // A put runs to its end even if the client goes away meanwhile: copies that landed are
    // published, and a body cut short aborts every copy it started.
    let put = tokio::spawn(async move { put_inner(&s, &path, &headers, body).await });
    crate::http_error::api_result(put.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
}

async fn put_inner<E: Env>(
    s: &Arc<Shared<E>>,
    path: &str,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Value, ApiError> {
    let target = s.read_node(|n, _| n.file_put_target(path))?;
    let expect = headers.get(SHA_HEADER).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    if let Some(e) = &expect {
        transfer::check_checksum(e).map_err(|e| ApiError::new(400, "bad_checksum", e.to_string()))?;
    }
    let t0 = s.env.monotonic();
    let mut copies: Vec<(VolumeId, NodeId)> = Vec::new();
    let mut exclude: Vec<NodeId> = Vec::new();
    let mut last_err = None;
    let length = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if length.is_some_and(|l| l > transfer::FILE_MAX_BYTES) {
        return Err(ApiError::new(413, "body_too_large", "a file is at most 1 TiB"));
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
        return Err(ApiError::new(400, "checksum_mismatch", "the body does not match its x-shoal-sha256"));
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
            last_err.unwrap_or_else(|| ApiError::new(507, "insufficient_storage", "no volume could take the file"))
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
/// whether it did.
async fn publish<E: Env>(
    s: &Arc<Shared<E>>,
    target: &PutTarget,
    size: u64,
    sum: &str,
    copies: &[(VolumeId, NodeId)],
    t0: shoal_core::Millis,
) -> Result<Value, ApiError> {
    let mod_time = s.env.now().0;
    let published = s.with_node(|n, now| n.file_publish(now, &target.path, size, sum, mod_time, copies));
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
    let mut v = v;
    let held = s.wait_for(RECORD_WAIT_MS, |n, _| n.file_record_held_elsewhere(&target.path)).await;
    v["recordReplicated"] = json!(held);
    tracing::debug!(path = %target.path, size, copies = copies.len(), held, put_ms = s.env.monotonic().since(t0), "put");
    Ok(v)
}

/// A byte range asked for with `Range: bytes=a-b` (one range; `a-`, `-n` too).
fn parse_range(h: &str, size: u64) -> Result<(u64, u64), ApiError> {
    let bad = || ApiError::new(416, "bad_range", format!("cannot serve range {h:?} of a {size}-byte file"));
    let spec = h.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    if spec.contains(',') {
        return Err(ApiError::new(416, "bad_range", "only one range per request"));
    }
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| bad())?;
            (size.saturating_sub(n), size.checked_sub(1).ok_or_else(bad)?)
        }
        (a, "") => (a.parse().map_err(|_| bad())?, size.checked_sub(1).ok_or_else(bad)?),
        (a, b) => (a.parse().map_err(|_| bad())?, b.parse::<u64>().map_err(|_| bad())?.min(size.saturating_sub(1))),
    };
    if start > end || start >= size {
        return Err(bad());
    }
    Ok((start, end + 1))
}

/// `GET /v1/files/{path}`: the file's bytes (or one range of them).
pub async fn get<E: Env>(s: Arc<Shared<E>>, path: String, headers: HeaderMap) -> Response {
    let (f, sources) = match s.read_node(|n, now| n.file_sources(&path, now)) {
        Ok(x) => x,
        Err(e) => return crate::http_error::api_result(Err(e)),
    };
    if sources.is_empty() {
        return crate::http_error::api_result(Err(ApiError::new(
            503,
            "no_copy_available",
            format!("no readable copy of cluster:{} right now", f.path),
        )));
    }
    let range = match headers.get("range").and_then(|v| v.to_str().ok()) {
        Some(h) => match parse_range(h, f.size) {
            Ok(r) => Some(r),
            Err(e) => return crate::http_error::api_result(Err(e)),
        },
        None => None,
    };
    let (start, end) = range.unwrap_or((0, f.size));
    if start == end {
        // An empty file: nothing to read (its checksum is that of no bytes).
        let mut resp = axum::body::Body::empty().into_response();
        if let Ok(v) = axum::http::HeaderValue::from_str(&f.checksum) {
            resp.headers_mut().insert(SHA_HEADER, v);
        }
        return resp;
    }
    // Find a copy that answers before committing to a status line.
    let mut first = None;
    let mut tried = Vec::new();
    for (k, src) in sources.iter().enumerate() {
        match read_piece(&s, src, &f.path, start, (end - start).min(CHUNK_BYTES)).await {
            Ok(b) => {
                first = Some((k, b));
                break;
            }
            Err(e) => tried.push(format!("{}:{}: {}", src.node_id, src.volume_id, e.message)),
        }
    }
    let Some((cur, first)) = first else {
        return crate::http_error::api_result(Err(ApiError::new(
            503,
            "no_copy_available",
            format!("no copy could be read: {}", tried.join("; ")),
        )));
    };
    let (tx, body) = ChannelBody::new(4);
    let copy_name = format!("{}:{}{}", sources[cur].node_id, sources[cur].volume_id, f.path);
    let stream = GetStream {
        s: s.clone(),
        path: f.path.clone(),
        sum: f.checksum.clone(),
        // The copies before the one that answered failed already.
        bad: (0..sources.len()).map(|i| i < cur).collect(),
        sources,
        cur,
        used: Default::default(),
    };
    tokio::spawn(stream.run(tx, start, end, range.is_none(), first));
    let mut resp = axum::body::Body::new(body).into_response();
    let h = resp.headers_mut();
    let put = |h: &mut HeaderMap, k: &'static str, v: String| {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    put(h, "content-length", (end - start).to_string());
    put(h, "content-type", "application/octet-stream".into());
    put(h, SHA_HEADER, f.checksum.clone());
    put(h, "etag", format!("\"{}\"", f.checksum));
    put(h, "accept-ranges", "bytes".into());
    put(h, COPY_HEADER, copy_name);
    if range.is_some() {
        put(h, "content-range", format!("bytes {start}-{}/{}", end - 1, f.size));
        *resp.status_mut() = axum::http::StatusCode::PARTIAL_CONTENT;
    }
    resp
}

/// The body of a get after its first piece: the next pieces are fetched (and their SHA-256
/// checked) while one goes out. Every current copy holds the same bytes, so when the copy being
/// read fails (its node went away, a piece came back wrong or short) the stream goes on from
/// the next copy at the same offset instead of being cut.
struct GetStream<E: Env> {
    s: Arc<Shared<E>>,
    path: String,
    sum: String,
    sources: Vec<Source>,
    /// Copies that failed during this get.
    bad: Vec<bool>,
    /// The copy pieces are asked from.
    cur: usize,
    /// The copies pieces came from.
    used: std::collections::BTreeSet<usize>,
}

/// A piece asked for ahead: its offset and length, the copy asked, the answer to come.
type PieceTask = (u64, u64, usize, tokio::task::JoinHandle<Result<Bytes, ApiError>>);

/// The pieces asked for ahead; those still coming when the stream ends (cut, or the client
/// gone) are called off.
#[derive(Default)]
struct Ahead(std::collections::VecDeque<PieceTask>);

impl std::ops::Deref for Ahead {
    type Target = std::collections::VecDeque<PieceTask>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Ahead {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        for (_, _, _, h) in &self.0 {
            h.abort();
        }
    }
}

impl<E: Env> GetStream<E> {
    async fn run(
        mut self,
        tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
        start: u64,
        end: u64,
        whole: bool,
        first: Bytes,
    ) {
        let mut hash = Sha256::new();
        let mut at = start;
        let mut piece = Some((self.cur, first));
        let mut ahead = Ahead::default();
        let mut asked = (start + CHUNK_BYTES).min(end);
        while at < end {
            while ahead.len() < PIECES_AHEAD && asked < end {
                let len = (end - asked).min(CHUNK_BYTES);
                ahead.push_back((asked, len, self.cur, self.fetch(self.cur, asked, len)));
                asked += len;
            }
            let want = (end - at).min(CHUNK_BYTES);
            let (from, got) = match piece.take() {
                Some((k, b)) => (k, Ok(b)),
                None => match ahead.pop_front() {
                    Some((_, _, k, h)) => {
                        (k, h.await.unwrap_or_else(|e| Err(ApiError::new(500, "internal", e.to_string()))))
                    }
                    None => (self.cur, Err(ApiError::new(500, "internal", "no piece was asked for"))),
                },
            };
            let data = match self.checked(from, got, want) {
                Ok(b) => b,
                Err(e) => match self.piece_from_another_copy(at, want).await {
                    Some(b) => {
                        // What was asked of failed copies is asked again of the one that answered.
                        for (off, len, k, h) in ahead.iter_mut() {
                            if self.bad[*k] {
                                h.abort();
                                (*k, *h) = (self.cur, self.fetch(self.cur, *off, *len));
                            }
                        }
                        b
                    }
                    None => {
                        let _ = tx.send(Err(std::io::Error::other(e.message))).await;
                        return;
                    }
                },
            };
            at += data.len() as u64;
            if whole {
                hash.update(&data);
                // The last piece goes out only once the whole file checked out: with a
                // content-length, a body that got all its bytes counts as complete, so a
                // mismatch must cut the stream before the last byte.
                if at >= end && hex::encode(hash.clone().finalize()) != self.sum {
                    // Which copy is wrong is known only when the pieces came from one.
                    if let [only] = self.used.iter().copied().collect::<Vec<_>>()[..] {
                        tracing::warn!(path = %self.path, volume = %self.sources[only].volume_id, "a copy does not match its checksum; marked stale");
                        mark_stale(&self.s, &self.path, &self.sources[only].volume_id, &self.sum);
                    }
                    let _ = tx.send(Err(std::io::Error::other("the copy does not match the file's checksum"))).await;
                    return;
                }
            }
            if tx.send(Ok(data)).await.is_err() {
                return; // the client went away
            }
        }
    }

    fn fetch(&self, k: usize, off: u64, len: u64) -> tokio::task::JoinHandle<Result<Bytes, ApiError>> {
        let (s, src, path) = (self.s.clone(), self.sources[k].clone(), self.path.clone());
        tokio::spawn(async move { read_piece(&s, &src, &path, off, len).await })
    }

    /// A piece copy `k` answered, if whole. Pieces are asked for back to back, so each must
    /// come whole: a short one means that copy is short (marked stale). A copy that failed
    /// is not asked again during this get.
    fn checked(&mut self, k: usize, got: Result<Bytes, ApiError>, want: u64) -> Result<Bytes, ApiError> {
        let err = match got {
            Ok(b) if b.len() as u64 == want => {
                self.used.insert(k);
                return Ok(b);
            }
            Ok(_) => {
                mark_stale(&self.s, &self.path, &self.sources[k].volume_id, &self.sum);
                ApiError::new(502, "short_copy", "the copy is shorter than the file")
            }
            Err(e) => e,
        };
        if !self.bad[k] {
            let src = &self.sources[k];
            tracing::warn!(path = %self.path, node = %src.node_id, volume = %src.volume_id, error = %err.message, "a copy failed during a get");
        }
        self.bad[k] = true;
        Err(err)
    }

    /// Piece `off..off+want` from the next copy that gives it whole; that copy serves the rest.
    async fn piece_from_another_copy(&mut self, off: u64, want: u64) -> Option<Bytes> {
        for k in 0..self.sources.len() {
            if self.bad[k] {
                continue;
            }
            let got = read_piece(&self.s, &self.sources[k], &self.path, off, want).await;
            if let Ok(b) = self.checked(k, got, want) {
                self.cur = k;
                return Some(b);
            }
        }
        None
    }
}

fn mark_stale<E: Env>(s: &Arc<Shared<E>>, path: &str, volume: &VolumeId, sum: &str) {
    s.with_node(|n, now| n.copy_mark(now, path, volume, LocationState::Stale, sum));
    s.repl_kick();
}
