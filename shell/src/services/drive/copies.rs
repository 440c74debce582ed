//! Writing a put's copies: this node's own in place, a peer's through the signed chunked
//! protocol (`store/begin`, `chunk`, `commit`, `abort`); a large body streamed to every copy
//! at once, a spooled one copied a placement at a time.

use super::*;

/// `store/begin` on peer `to`: a small request a healthy peer answers at once, so a peer that
/// does not answer within [`BEGIN_TIMEOUT_MS`] is passed over for another.
pub(super) async fn begin_upload<E: Env>(s: &Arc<Shared<E>>, to: &NodeId, begin: Value) -> Result<Value, ApiError> {
    let target = "/cluster/acn/store/begin";
    let r = signed_within(s, to, "POST", target, begin.to_string().into_bytes(), vec![], BEGIN_TIMEOUT_MS).await?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/begin"));
    }
    Ok(serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// Copy the put's bytes (whose SHA-256 is `sum`) to its path on the placed volume: this node's
/// own in place; a peer's in one `store/put` when the body is one chunk, else through an
/// upload session (begin, chunks, commit).
pub async fn write_copy<E: Env>(
    s: &Arc<Shared<E>>,
    source: &CopySource,
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
            .ok_or_else(|| ApiError::conflict("unknown_volume", "the placed volume is gone"))?;
        if let Some(dest) = copy_path(s, &to.volume, path) {
            s.store_service.landed.wait_settled(s, &to.volume, path, sum, target.replaces.as_deref(), &dest).await;
        }
        let (s2, to, sum, target) = (s.clone(), to.clone(), sum.to_string(), target.clone());
        let (source, tag) = (source.clone(), format!("{:016x}", s.env.seed()));
        return s
            .blocking(move || install_local(&s2, Path::new(&vol.subpath), &to, &target, &sum, &source, &tag))
            .await;
    }
    if put_policy::single_request(size) {
        let data = source.whole(s).await?;
        if put_whole(s, to, target, sum, data).await? {
            return Ok(());
        }
        // The peer has no `store/put` (an older version): an upload session instead.
    }
    let file_id = target.file_id.clone().unwrap_or_default();
    let begin = json!({"volumeId": to.volume, "path": path, "size": size, "checksum": sum, "fileId": file_id});
    let v = begin_upload(s, &to.node, begin).await?;
    let session = v["sessionId"].as_str().unwrap_or_default().to_string();
    let sent = send_spooled(s, source, size, to, &session, target.replaces.as_deref(), &v).await;
    if sent.is_err() {
        // Free the peer's session and part file now rather than in 30 minutes.
        let _ =
            signed(s, &to.node, "POST", &format!("/cluster/acn/store/abort?session={session}"), vec![], vec![]).await;
    }
    sent
}

/// Write a whole copy of one chunk or less to a peer in one signed `store/put`: the body's
/// SHA-256 is the file's, the chunk's and the signature's body hash at once (hashed once, here
/// and there). Answers false when the peer has no `store/put`.
async fn put_whole<E: Env>(
    s: &Arc<Shared<E>>,
    to: &Placed,
    target: &PutTarget,
    sum: &str,
    data: Bytes,
) -> Result<bool, ApiError> {
    use crate::wire::escape_query;
    let size = data.len() as u64;
    let mut t = format!(
        "/cluster/acn/store/put?volume={}&path={}&size={}&checksum={sum}",
        escape_query(to.volume.as_str()),
        escape_query(&target.path),
        data.len()
    );
    if let Some(r) = &target.replaces {
        t.push_str(&format!("&replaces={}", escape_query(r)));
    }
    let prepared = s
        .with_node(|n, now| Transport::<E>::prepare_hashed(n, now, &to.node, "POST", &t, data, sum))
        .map_err(peer_error)?;
    let within = put_policy::single_request_timeout_ms(size);
    let r = s.transport.send(prepared, within).await.map_err(peer_error)?;
    if r.status == 404 {
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        if v["error"]["code"] == "not_found" {
            return Ok(false);
        }
    }
    if r.status != 200 {
        return Err(answered_error(&r, "store/put"));
    }
    Ok(true)
}

/// The chunks of a put's bytes the peer does not have yet, then the commit.
pub(super) async fn send_spooled<E: Env>(
    s: &Arc<Shared<E>>,
    source: &CopySource,
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
            done.await.map_err(|e| ApiError::internal("internal", e.to_string()))??;
        }
        let data = source.range(s, index * CHUNK_BYTES, CHUNK_BYTES).await?;
        in_flight.push_back(send_chunk(s, &to.node, session, index, data));
    }
    for done in in_flight {
        done.await.map_err(|e| ApiError::internal("internal", e.to_string()))??;
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
pub(super) fn commit_target(session: &str, checksum: Option<&str>, replaces: Option<&str>) -> String {
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
pub(super) fn send_chunk<E: Env>(
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
pub(super) async fn send_chunk_hashed<E: Env>(
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
    prepared.extra.push((CHUNK_SHA_HEADER, sha));
    let r = s.transport.send(prepared, PEER_TIMEOUT_MS).await.map_err(peer_error)?;
    if r.status != 200 {
        return Err(answered_error(&r, "store/chunk"));
    }
    Ok(())
}

/// One copy a streamed put is writing as the body arrives: a part file in one of this node's
/// volumes, or a peer's upload session.
pub(super) enum Sink {
    Local {
        placed: Placed,
        path: String,
        part: PathBuf,
        dest: PathBuf,
        file: Arc<std::fs::File>,
        /// The volume is not retired while this copy is written.
        writing: Arc<crate::node::state::WriteGuard>,
    },
    Peer {
        placed: Placed,
        session: String,
    },
}

impl Sink {
    pub(super) fn placed(&self) -> &Placed {
        match self {
            Sink::Local { placed, .. } | Sink::Peer { placed, .. } => placed,
        }
    }
}

/// Start writing a copy of `len` bytes at `path` where `to` says.
pub(super) async fn open_sink<E: Env>(
    s: &Arc<Shared<E>>,
    to: &Placed,
    target: &PutTarget,
    len: u64,
) -> Result<Sink, ApiError> {
    let path = target.path.as_str();
    let me = s.read_node(|n, _| n.id().clone());
    if to.node == me {
        let vol = s
            .read_node(|n, _| n.local_volume(to.volume.as_str()))
            .ok_or_else(|| ApiError::conflict("unknown_volume", "the placed volume is gone"))?;
        let writing = Arc::new(s.store_service.writing(&to.volume, Path::new(&vol.subpath)));
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
        return Ok(Sink::Local { placed, path, part, dest, file: Arc::new(file), writing });
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
pub(super) fn write_chunk<E: Env>(
    s: &Arc<Shared<E>>,
    sinks: &Arc<Vec<Sink>>,
    live: Vec<usize>,
    keep: usize,
    index: u64,
    data: Bytes,
    sha: String,
) -> tokio::task::JoinHandle<Vec<(usize, ApiError)>> {
    let (s, sinks) = (s.clone(), sinks.clone());
    tokio::spawn(async move {
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
                            failed.push((i, ApiError::peer_timeout("copy_too_slow", why)));
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
pub(super) struct Fanout {
    sinks: Arc<Vec<Sink>>,
    /// Copies a chunk must reach before a lagging one is given up (see [`write_chunk`]).
    keep: usize,
    dead: Vec<Option<ApiError>>,
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Vec<(usize, ApiError)>>>,
}

impl Fanout {
    pub(super) fn live(&self) -> Vec<usize> {
        (0..self.sinks.len()).filter(|&i| self.dead[i].is_none()).collect()
    }

    /// Whether a live sink is a peer (whose chunks carry their SHA-256).
    pub(super) fn peer_live(&self) -> bool {
        self.live().into_iter().any(|i| matches!(self.sinks[i], Sink::Peer { .. }))
    }

    /// Wait until at most `keep` chunk writes are in flight; fails once no sink is left.
    pub(super) async fn settle(&mut self, keep: usize) -> Result<(), ApiError> {
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
                .unwrap_or_else(|| ApiError::storage_full("insufficient_storage", "no volume could take the file")));
        }
        Ok(())
    }
}

/// Stream a request body of `len` bytes to every placed copy at once as it arrives, hashing
/// it, with no spool: each chunk is hashed once and written to a local part file or sent to a
/// peer's upload session. `expect` (the client's SHA-256) is checked before any commit, so a
/// wrong body never lands. A copy that fails is left out; at least one must succeed. Returns
/// size, SHA-256 and the copies made.
pub(super) async fn stream_copies<E: Env>(
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
    let wanted = target.wanted.max(1) as usize;
    let mut tries = put_policy::placement_tries(target.wanted) as usize;
    while sinks.len() < wanted && tries > 0 {
        let need = (wanted - sinks.len()).min(tries) as u32;
        let placed = match place(s, len, target.primary.as_ref(), &exclude, need).await {
            Ok(p) => p,
            Err(e) => {
                last_err = Some(e);
                break;
            }
        };
        tries = tries.saturating_sub(placed.len());
        for to in placed {
            exclude.push(to.node.clone());
            match open_sink(s, &to, target, len).await {
                Ok(sink) => sinks.push(sink),
                Err(e) => {
                    tracing::warn!(node = %to.node, error = %e.message, "a copy could not be started");
                    last_err = Some(e);
                }
            }
        }
    }
    if sinks.is_empty() {
        return Err(
            last_err.unwrap_or_else(|| ApiError::storage_full("insufficient_storage", "no volume could take the file"))
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
pub(super) fn abort_in_background<E: Env>(
    s: &Arc<Shared<E>>,
    sinks: &Arc<Vec<Sink>>,
    i: usize,
) -> tokio::task::JoinHandle<()> {
    let (s, sinks) = (s.clone(), sinks.clone());
    tokio::spawn(async move { abort_sink(&s, &sinks[i]).await })
}

/// Take a chunk into the whole file's hash, on a blocking thread, and when a peer is to be sent
/// it (`own`), its own SHA-256 (the body hash its signature covers) in the same pass
/// ([`crate::disk::hash`]); empty otherwise.
async fn hash_chunk<E: Env>(s: &Arc<Shared<E>>, mut file: FileHash, data: Bytes, own: bool) -> (FileHash, String) {
    s.blocking(move || {
        let sha = if own {
            hex::encode(file.update_with_chunk_sum(&data))
        } else {
            file.update(&data);
            String::new()
        };
        (file, sha)
    })
    .await
}

pub(super) async fn stream_chunks<E: Env>(
    s: &Arc<Shared<E>>,
    out: &mut Fanout,
    body: axum::body::Body,
    len: u64,
    expect: Option<&str>,
) -> Result<String, ApiError> {
    let mut hash = FileHash::new();
    let mut size = 0u64;
    // Chunks are gathered in aligned pieces (a local copy writes one straight to the disk),
    // each as big as its chunk (the last is short).
    let piece_for =
        |index: u64| crate::disk::Piece::new(CHUNK_BYTES.min(len - (index * CHUNK_BYTES).min(len)) as usize);
    let mut chunk = piece_for(0);
    let mut index = 0u64;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid("bad_body", format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        size += data.len() as u64;
        if size > len {
            return Err(ApiError::invalid("bad_body", "the body is longer than its content-length"));
        }
        let mut rest = &data[..];
        while !rest.is_empty() {
            rest = &rest[chunk.fill(rest)..];
            if chunk.room() == 0 {
                let full = std::mem::replace(&mut chunk, piece_for(index + 1)).into_bytes();
                let sha;
                (hash, sha) = hash_chunk(s, hash, full.clone(), out.peer_live()).await;
                out.settle(CHUNKS_IN_FLIGHT - 1).await?;
                out.in_flight.push_back(write_chunk(s, &out.sinks, out.live(), out.keep, index, full, sha));
                index += 1;
            }
        }
    }
    if size != len {
        return Err(ApiError::invalid("bad_body", format!("the body ended after {size} of {len} bytes")));
    }
    if !chunk.is_empty() || index == 0 {
        let last = chunk.into_bytes();
        let sha;
        (hash, sha) = hash_chunk(s, hash, last.clone(), out.peer_live()).await;
        out.settle(CHUNKS_IN_FLIGHT - 1).await?;
        out.in_flight.push_back(write_chunk(s, &out.sinks, out.live(), out.keep, index, last, sha));
    }
    out.settle(0).await?;
    let sum = hash.hex();
    if expect.is_some_and(|e| e != sum) {
        return Err(ApiError::invalid("checksum_mismatch", "the body does not match its x-shoal-sha256"));
    }
    Ok(sum)
}

/// Put a fully written copy in place: a local part file is fsynced and renamed; a peer is
/// asked to commit, naming the SHA-256.
pub(super) async fn commit_sink<E: Env>(
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
        Sink::Local { placed, path, part, dest, file, writing } => {
            s.store_service.landed.wait_settled(s, &placed.volume, path, sum, replaces, dest).await;
            let (s2, placed, path, sum) = (s.clone(), placed.clone(), path.clone(), sum.to_string());
            let replaces = replaces.map(str::to_string);
            let (part, dest, file, writing) = (part.clone(), dest.clone(), file.clone(), writing.clone());
            s.blocking(move || -> Result<(), ApiError> {
                let synced = file.metadata().and_then(|m| {
                    if m.len() != size {
                        return Err(std::io::Error::other("the part file has the wrong length"));
                    }
                    writing.sync(&file)
                });
                synced.map_err(|e| io_api("write copy", e))?;
                let landed =
                    s2.store_service.landed.land(&s2, &placed.volume, &path, &sum, replaces.as_deref(), &dest, || {
                        std::fs::rename(&part, &dest)
                    });
                landed.map_err(|c| c.api_error())?.map_err(|e| io_api("write copy", e))?;
                s2.store_service
                    .landed
                    .sync_name_or_take_back(&s2, &writing, &path, &sum, &dest)
                    .map_err(|e| io_api("sync folder", e))
            })
            .await
        }
    }
}

/// Give up a copy: free the peer's session now rather than in 30 minutes, or remove the part file.
pub(super) async fn abort_sink<E: Env>(s: &Arc<Shared<E>>, sink: &Sink) {
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

/// Copy a put's bytes into a local volume: a part file, fsynced, renamed into place.
pub(super) fn install_local<E: Env>(
    s: &Arc<Shared<E>>,
    folder: &Path,
    to: &Placed,
    target: &PutTarget,
    sum: &str,
    source: &CopySource,
    tag: &str,
) -> Result<(), ApiError> {
    let writing = s.store_service.writing(&to.volume, folder);
    let dest = confined_path(folder, &target.path, true)?;
    let part = part_path(&dest, tag);
    let copied = match source {
        CopySource::Spool(spool) => {
            std::fs::copy(spool.as_path(), &part).and_then(|_| writing.sync(&std::fs::File::open(&part)?))
        }
        CopySource::Memory(data) => std::fs::File::create(&part).and_then(|mut f| {
            f.write_all(data)?;
            writing.sync(&f)
        }),
    };
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
    s.store_service.landed.sync_name_or_take_back(s, &writing, path, sum, &dest).map_err(|e| io_api("sync folder", e))
}

/// The part file beside `dest` that a copy is written to before it is renamed into place.
pub(super) fn part_path(dest: &Path, tag: &str) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(transfer::part_file_name(&name, tag))
}

pub(super) fn read_range(file: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(file)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}
