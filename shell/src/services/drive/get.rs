//! `GET /v1/files/{path}`: the best copy streamed, hashed as it goes, pieces fetched ahead;
//! a copy that fails midway is left for the next, one that does not match is marked stale.

use super::*;

/// A byte range asked for with `Range: bytes=a-b` (one range; `a-`, `-n` too).
pub(super) fn parse_range(h: &str, size: u64) -> Result<(u64, u64), ApiError> {
    let bad = || ApiError::bad_range("bad_range", format!("cannot serve range {h:?} of a {size}-byte file"));
    let spec = h.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    if spec.contains(',') {
        return Err(ApiError::bad_range("bad_range", "only one range per request"));
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
        Err(e) => return crate::wire::error::api_error_response(e),
    };
    if sources.is_empty() {
        return crate::wire::error::api_error_response(ApiError::unavailable(
            "no_copy_available",
            format!("no readable copy of cluster:{} right now", f.path),
        ));
    }
    let range = match headers.get("range").and_then(|v| v.to_str().ok()) {
        Some(h) => match parse_range(h, f.size) {
            Ok(r) => Some(r),
            Err(e) => return crate::wire::error::api_error_response(e),
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
        return crate::wire::error::api_error_response(ApiError::unavailable(
            "no_copy_available",
            format!("no copy could be read: {}", tried.join("; ")),
        ));
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
pub(super) struct GetStream<E: Env> {
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
type PieceTask = (u64, u64, usize, tokio::task::JoinHandle<Result<ReadPiece, ApiError>>);

/// The pieces asked for ahead; those still coming when the stream ends (cut, or the client
/// gone) are called off.
#[derive(Default)]
pub(super) struct Ahead(std::collections::VecDeque<PieceTask>);

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
    pub(super) async fn run(
        mut self,
        tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
        start: u64,
        end: u64,
        whole: bool,
        first: Bytes,
    ) {
        let mut hash = FileHash::new();
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
                Some((k, b)) => (k, Ok(ReadPiece { bytes: b, claimed: None })),
                None => match ahead.pop_front() {
                    Some((_, _, k, h)) => {
                        (k, h.await.unwrap_or_else(|e| Err(ApiError::internal("internal", e.to_string()))))
                    }
                    None => (self.cur, Err(ApiError::internal("internal", "no piece was asked for"))),
                },
            };
            // The piece's SHA-256 is checked; for a whole file, in the same pass that takes it
            // into the file's hash (`disk::hash`; a piece that fails its check is not taken). A
            // piece taken so is whole and checked, so `checked` below keeps it.
            let mut hashed = false;
            let got = got.and_then(|p| {
                if whole && p.bytes.len() as u64 == want {
                    p.check_into(&mut hash)?;
                    hashed = true;
                } else {
                    p.check()?;
                }
                Ok(p.bytes)
            });
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
                if !hashed {
                    hash.update(&data);
                }
                // The last piece goes out only once the whole file checked out: with a
                // content-length, a body that got all its bytes counts as complete, so a
                // mismatch must cut the stream before the last byte.
                if at >= end && hash.hex() != self.sum {
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

    pub(super) fn fetch(&self, k: usize, off: u64, len: u64) -> tokio::task::JoinHandle<Result<ReadPiece, ApiError>> {
        let (s, src, path) = (self.s.clone(), self.sources[k].clone(), self.path.clone());
        tokio::spawn(async move { read_piece_unchecked(&s, &src, &path, off, len).await })
    }

    /// A piece copy `k` answered, if whole. Pieces are asked for back to back, so each must
    /// come whole: a short one means that copy is short (marked stale). A copy that failed
    /// is not asked again during this get.
    pub(super) fn checked(&mut self, k: usize, got: Result<Bytes, ApiError>, want: u64) -> Result<Bytes, ApiError> {
        let err = match got {
            Ok(b) if b.len() as u64 == want => {
                self.used.insert(k);
                return Ok(b);
            }
            Ok(_) => {
                mark_stale(&self.s, &self.path, &self.sources[k].volume_id, &self.sum);
                ApiError::peer_failed("short_copy", "the copy is shorter than the file")
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
    pub(super) async fn piece_from_another_copy(&mut self, off: u64, want: u64) -> Option<Bytes> {
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

pub(super) fn mark_stale<E: Env>(s: &Arc<Shared<E>>, path: &str, volume: &VolumeId, sum: &str) {
    s.with_node(|n, now| n.copy_mark(now, path, volume, LocationState::Stale, sum));
    s.repl_kick();
}
