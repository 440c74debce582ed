//! The rules of the chunked transfer protocol (reference-facts.md "Chunked store/*"; spec
//! "Chunked transfer"): 4 MiB chunks with a SHA-256 each and one for the whole file, resumable
//! upload sessions that expire after 30 minutes idle, reads of 1 byte to 8 MiB, and the paths a
//! copy may have inside its volume. The shell moves the bytes; these decide.

use crate::ids::{FileId, NodeId, VolumeId};
use crate::meta::namespace::{normalize, PathError};
use crate::time::{Millis, MINUTE_MS};
use std::collections::{BTreeMap, BTreeSet};

pub const CHUNK_BYTES: u64 = 4 * 1024 * 1024;
pub const READ_MAX_BYTES: u64 = 8 * 1024 * 1024;
pub const SESSION_IDLE_MS: u64 = 30 * MINUTE_MS;
/// Part files are `<path>.part-<session>`; no copy may be named like one.
pub const PART_MARK: &str = ".part-";
/// A part file untouched this long belongs to no upload (sessions end after 30 minutes idle).
pub const PART_FILE_MAX_AGE_MS: u64 = 60 * MINUTE_MS;

/// Whether a part file a rescan finds, last written at `mtime_ms` (wall), is a leftover to
/// remove: written before this node's process started at `started` (no session of this run
/// owns it), or untouched for [`PART_FILE_MAX_AGE_MS`] at `now`.
pub fn leftover_part_file(mtime_ms: u64, started: Millis, now: Millis) -> bool {
    mtime_ms < started.0 || mtime_ms.saturating_add(PART_FILE_MAX_AGE_MS) < now.0
}

/// The name of the part file a copy of `final_name` is written to before it is renamed into
/// place: `<final_name>.part-<tag>`, with `final_name` shortened (at a character boundary) so
/// the whole stays within a file system's 255-byte name limit — a name of up to 255 bytes is a
/// valid cluster path, and its part file must be creatable too (issue 11: names of 234–255
/// bytes failed with 507). `tag` is unique to the write, so a shortened prefix cannot collide.
pub fn part_file_name(final_name: &str, tag: &str) -> String {
    let suffix = format!("{PART_MARK}{tag}");
    let room = crate::meta::namespace::MAX_SEGMENT_BYTES.saturating_sub(suffix.len());
    let mut end = final_name.len().min(room);
    while !final_name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &final_name[..end])
}

/// Kept files are `<path>.part-kept-<checksum>`: a path's content an overwrite landed over,
/// kept until its record settles ([`crate::storage::landed`]); reserved like part files.
const KEPT_TAG: &str = "kept-";

/// The name bytes with `checksum` (64 hex) are kept under when an overwrite lands at
/// `final_name`: `<final_name>.part-kept-<checksum>`, or none when that would pass a file
/// system's 255-byte name limit (a name over 180 bytes: such an overwrite keeps nothing).
pub fn kept_file_name(final_name: &str, checksum: &str) -> Option<String> {
    if checksum.len() != 64 || !checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let name = format!("{final_name}{PART_MARK}{KEPT_TAG}{}", checksum.to_ascii_lowercase());
    (name.len() <= crate::meta::namespace::MAX_SEGMENT_BYTES && !final_name.contains(PART_MARK)).then_some(name)
}

/// The final name and the checksum of a kept file's `name` ([`kept_file_name`]).
pub fn parse_kept_file_name(name: &str) -> Option<(&str, &str)> {
    let (final_name, tag) = name.rsplit_once(PART_MARK)?;
    let sum = tag.strip_prefix(KEPT_TAG)?;
    let ok = !final_name.is_empty()
        && sum.len() == 64
        && sum.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    ok.then_some((final_name, sum))
}

/// Largest file the protocol accepts (1 TiB).
pub const FILE_MAX_BYTES: u64 = 1 << 40;

/// Number of chunks of a file of `size` bytes (an empty file has one empty chunk).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_BYTES).max(1)
}

/// Bytes chunk `index` must carry.
pub fn chunk_len(size: u64, index: u64) -> Option<u64> {
    let n = chunk_count(size);
    if index >= n {
        return None;
    }
    Some(if index + 1 == n { size - index * CHUNK_BYTES } else { CHUNK_BYTES })
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("the path must name a file, not the root")]
    Root,
    #[error("names containing {PART_MARK:?} are reserved for uploads in progress")]
    ReservedName,
    #[error("file size must be at most 1 TiB")]
    TooLarge,
    #[error("checksum must be 64 hex characters (SHA-256)")]
    BadChecksum,
    #[error("chunk {0} is out of range")]
    ChunkOutOfRange(u64),
    #[error("chunk {index} must be {want} bytes, got {got}")]
    ChunkLength { index: u64, want: u64, got: u64 },
    #[error("chunk {0} does not match its SHA-256")]
    ChunkChecksum(u64),
    #[error("upload is incomplete: {0} chunk(s) missing")]
    Incomplete(u64),
    #[error("read length must be 1 byte to 8 MiB")]
    ReadLength,
    #[error("the upload session expired (30 minutes idle)")]
    Expired,
    #[error("too many uploads in progress; retry later")]
    TooManySessions,
    #[error("no such upload session")]
    UnknownSession,
}

impl TransferError {
    pub fn kind(&self) -> crate::node::ErrorKind {
        use crate::node::ErrorKind;
        match self {
            TransferError::Incomplete(_) => ErrorKind::Conflict,
            TransferError::Expired | TransferError::UnknownSession => ErrorKind::NotFound,
            TransferError::TooManySessions => ErrorKind::Unavailable,
            _ => ErrorKind::Invalid,
        }
    }
}

/// The segments of a copy's path inside its volume: the namespace path normalised, never the
/// root, never a reserved part-file name. Joined under the volume folder they cannot escape it.
pub fn copy_segments(path: &str) -> Result<Vec<String>, TransferError> {
    let p = normalize(path)?;
    if p == "/" {
        return Err(TransferError::Root);
    }
    let segs: Vec<String> = p.trim_start_matches('/').split('/').map(str::to_string).collect();
    if segs.iter().any(|s| s.contains(PART_MARK)) {
        return Err(TransferError::ReservedName);
    }
    Ok(segs)
}

/// A percent-encoded query value decoded (`%XX` escapes, `+` as a space); bytes that do not
/// form UTF-8 are replaced. One decoder for every query shoal's endpoints read.
pub fn decode_query_value(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Two hex digits exactly (`from_str_radix` alone would take `+5` as a number).
        let hex = (b[i] == b'%' && i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()))
            .flatten();
        match (hex, b[i]) {
            (Some(x), _) => {
                out.push(x);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, c) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn check_checksum(c: &str) -> Result<(), TransferError> {
    if c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(TransferError::BadChecksum)
    }
}

pub fn check_read(length: u64) -> Result<(), TransferError> {
    if (1..=READ_MAX_BYTES).contains(&length) {
        Ok(())
    } else {
        Err(TransferError::ReadLength)
    }
}

/// One resumable upload into a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadSession {
    pub id: String,
    pub volume: VolumeId,
    pub path: String,
    pub size: u64,
    pub checksum: String,
    pub file_id: FileId,
    pub have: BTreeSet<u64>,
    pub touched: Millis,
}

impl UploadSession {
    pub fn new(
        id: String,
        volume: VolumeId,
        path: String,
        size: u64,
        checksum: String,
        file_id: FileId,
        now: Millis,
    ) -> Result<UploadSession, TransferError> {
        if size > FILE_MAX_BYTES {
            return Err(TransferError::TooLarge);
        }
        // An empty checksum is named at commit instead (a sender streaming a file it is still
        // receiving knows the whole-file SHA-256 only at the end).
        if !checksum.is_empty() {
            check_checksum(&checksum)?;
        }
        copy_segments(&path)?;
        Ok(UploadSession {
            id,
            volume,
            path,
            size,
            checksum: checksum.to_ascii_lowercase(),
            file_id,
            have: BTreeSet::new(),
            touched: now,
        })
    }

    /// The same upload again (same volume, path, size and checksum): resume it.
    pub fn resumes(&self, volume: &VolumeId, path: &str, size: u64, checksum: &str) -> bool {
        // A session whose checksum comes at commit never resumes: its bytes are not pinned.
        !self.checksum.is_empty()
            && &self.volume == volume
            && self.path == path
            && self.size == size
            && self.checksum.eq_ignore_ascii_case(checksum)
    }

    pub fn expired(&self, now: Millis) -> bool {
        now.since(self.touched) > SESSION_IDLE_MS
    }

    /// An expired session takes no more chunks and no commit, even before it is swept.
    pub fn check_alive(&self, now: Millis) -> Result<(), TransferError> {
        if self.expired(now) {
            Err(TransferError::Expired)
        } else {
            Ok(())
        }
    }

    /// Check a chunk before it is written, at `now`: the session is alive, index, length, and
    /// its SHA-256 against the one the sender claimed (`claimed`) and the one the receiver
    /// computed (`actual`).
    pub fn check_chunk(
        &self,
        now: Millis,
        index: u64,
        len: u64,
        claimed: &str,
        actual: &str,
    ) -> Result<u64, TransferError> {
        self.check_alive(now)?;
        let want = chunk_len(self.size, index).ok_or(TransferError::ChunkOutOfRange(index))?;
        if len != want {
            return Err(TransferError::ChunkLength { index, want, got: len });
        }
        if !claimed.eq_ignore_ascii_case(actual) {
            return Err(TransferError::ChunkChecksum(index));
        }
        Ok(index * CHUNK_BYTES)
    }

    pub fn mark(&mut self, index: u64, now: Millis) {
        self.have.insert(index);
        self.touched = now;
    }

    pub fn missing(&self) -> u64 {
        chunk_count(self.size) - self.have.len() as u64
    }

    /// The tag of this session's part file (see [`part_file_name`]).
    pub fn part_tag(&self) -> String {
        self.id.clone()
    }
}

/// Most upload sessions open at once on a node.
pub const SESSIONS_MAX: usize = 256;

/// The upload sessions open on a node, each with the peer that opened it (reference-facts.md
/// "Chunked store/*"): expiry after 30 minutes idle, resuming the same upload, the cap of
/// [`SESSIONS_MAX`], and that only its opener may use a session. The shell keeps the bytes (the
/// part files, the running whole-file hash) by session id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Uploads {
    open: BTreeMap<String, (NodeId, UploadSession)>,
}

impl Uploads {
    /// Remove the sessions expired at `now`; their part files are the caller's to delete.
    pub fn sweep(&mut self, now: Millis) -> Vec<UploadSession> {
        let gone: Vec<String> =
            self.open.iter().filter(|(_, (_, u))| u.expired(now)).map(|(id, _)| id.clone()).collect();
        gone.into_iter().filter_map(|id| self.open.remove(&id).map(|(_, u)| u)).collect()
    }

    /// The session `owner` opened for this same upload, touched at `now` (see
    /// [`UploadSession::resumes`]).
    pub fn resume(
        &mut self,
        now: Millis,
        owner: &NodeId,
        volume: &VolumeId,
        path: &str,
        size: u64,
        checksum: &str,
    ) -> Option<&UploadSession> {
        let (_, u) = self.open.values_mut().find(|(o, u)| o == owner && u.resumes(volume, path, size, checksum))?;
        u.touched = now;
        Some(u)
    }

    /// Whether one more session may open.
    pub fn check_room(&self) -> Result<(), TransferError> {
        if self.open.len() >= SESSIONS_MAX {
            return Err(TransferError::TooManySessions);
        }
        Ok(())
    }

    /// Open `session` for `owner` (after [`Uploads::check_room`]).
    pub fn open(&mut self, owner: NodeId, session: UploadSession) {
        self.open.insert(session.id.clone(), (owner, session));
    }

    /// Session `id`, if `owner` opened it: nobody else may add to, commit or abort it.
    pub fn get(&self, id: &str, owner: &NodeId) -> Result<&UploadSession, TransferError> {
        match self.open.get(id) {
            Some((o, u)) if o == owner => Ok(u),
            _ => Err(TransferError::UnknownSession),
        }
    }

    /// Chunk `index` of session `id` was written and hashed: marked, the session touched.
    /// Returns the chunks still missing.
    pub fn mark(&mut self, id: &str, index: u64, now: Millis) -> Result<u64, TransferError> {
        let (_, u) = self.open.get_mut(id).ok_or(TransferError::UnknownSession)?;
        u.mark(index, now);
        Ok(u.missing())
    }

    pub fn remove(&mut self, id: &str) -> Option<UploadSession> {
        self.open.remove(id).map(|(_, u)| u)
    }

    /// Whether a session not expired at `now` writes to `volume` (it is not retired meanwhile).
    pub fn live_on(&self, volume: &VolumeId, now: Millis) -> bool {
        self.open.values().any(|(_, u)| &u.volume == volume && !u.expired(now))
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const C: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn a_kept_name_carries_its_path_and_checksum_and_is_never_a_copys_name() {
        let name = kept_file_name("report.txt", &C.to_ascii_uppercase()).unwrap();
        assert_eq!(name, format!("report.txt.part-kept-{C}"));
        assert_eq!(parse_kept_file_name(&name), Some(("report.txt", C)));
        assert!(normalize(&format!("/{name}")).is_ok() && name.contains(PART_MARK), "reserved like a part file");
        // Too long for a file system's name limit, a bad checksum, a part file: none.
        assert_eq!(kept_file_name(&"n".repeat(181), C), None);
        assert!(kept_file_name(&"n".repeat(180), C).is_some_and(|n| n.len() == 255));
        assert_eq!(kept_file_name("a", "abc"), None);
        assert_eq!(kept_file_name("a.part-0123456789abcdef", C), None);
        let (no_name, upper) = (format!(".part-kept-{C}"), format!("a.part-kept-{}", C.to_ascii_uppercase()));
        for bad in ["a.part-0123456789abcdef", ".part-kept-00", no_name.as_str(), upper.as_str()] {
            assert_eq!(parse_kept_file_name(bad), None, "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn every_kept_name_made_parses_back(name in "[^/\\x00]{1,200}", sum in "[0-9a-fA-F]{64}") {
            if let Some(kept) = kept_file_name(&name, &sum) {
                proptest::prop_assert!(kept.len() <= crate::meta::namespace::MAX_SEGMENT_BYTES);
                let lower = sum.to_ascii_lowercase();
                proptest::prop_assert_eq!(parse_kept_file_name(&kept), Some((name.as_str(), lower.as_str())));
            } else {
                proptest::prop_assert!(name.len() > 180 || name.contains(PART_MARK));
            }
        }
    }

    /// A part file written before the process started, or idle past the limit, is a
    /// leftover; one written since the start and touched within the limit belongs to an upload.
    #[test]
    fn a_part_file_is_a_leftover_only_from_before_the_start_or_idle_too_long() {
        let started = Millis(10 * PART_FILE_MAX_AGE_MS);
        let now = Millis(started.0 + 2 * PART_FILE_MAX_AGE_MS);
        assert!(leftover_part_file(started.0 - 1, started, started), "written before the start");
        assert!(!leftover_part_file(started.0, started, started), "written at the start");
        let recent = now.0 - PART_FILE_MAX_AGE_MS;
        assert!(!leftover_part_file(recent, started, now), "idle exactly the limit");
        assert!(leftover_part_file(recent - 1, started, now), "idle longer than the limit");
        assert!(!leftover_part_file(now.0 + 5_000, started, now), "a clock a little behind the file's");
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(decode_query_value("/a%20b/c%2Bd+e"), "/a b/c+d e");
        assert_eq!(decode_query_value("100%"), "100%");
        assert_eq!(decode_query_value("%zz%4"), "%zz%4");
        assert_eq!(decode_query_value("%FF"), "\u{fffd}");
    }

    #[test]
    fn files_split_into_4_mib_chunks() {
        assert_eq!(chunk_count(0), 1);
        assert_eq!(chunk_count(4 * MIB), 1);
        assert_eq!(chunk_count(9 * MIB), 3);
        assert_eq!(chunk_len(9 * MIB, 2), Some(MIB));
        assert_eq!(chunk_len(9 * MIB, 3), None);
        assert_eq!(chunk_len(0, 0), Some(0));
    }

    #[test]
    fn copy_paths_cannot_escape_or_shadow_part_files() {
        assert_eq!(copy_segments("cluster:a\\b/../c").unwrap(), vec!["a", "c"]);
        assert_eq!(
            copy_segments("/../../etc/passwd"),
            Err(TransferError::Path(crate::meta::path::PathError::AboveRoot { segment: 1 }))
        );
        assert_eq!(copy_segments("/"), Err(TransferError::Root));
        assert_eq!(copy_segments("/x/y.part-abc"), Err(TransferError::ReservedName));
    }

    #[test]
    fn part_file_names_fit_the_name_limit_whatever_the_final_name() {
        assert_eq!(part_file_name("a.txt", "00ff"), "a.txt.part-00ff");
        for len in [1usize, 200, 233, 234, 250, 255] {
            let name = "n".repeat(len);
            let part = part_file_name(&name, "repl0123456789abcdef");
            assert!(part.len() <= 255, "{len}: {}", part.len());
            assert!(part.ends_with(".part-repl0123456789abcdef"));
        }
        // Shortened at a character boundary.
        let name = "é".repeat(127); // 254 bytes
        let part = part_file_name(&name, "0123456789abcdef");
        assert!(part.len() <= 255 && part.starts_with('é'));
        assert!(copy_segments("/a\0b").is_err());
    }

    #[test]
    fn chunks_are_checked_and_sessions_resume_and_expire() {
        let mut s = UploadSession::new(
            "s1".into(),
            VolumeId::new("v"),
            "/a".into(),
            9 * MIB,
            C.into(),
            FileId::new("f"),
            Millis(0),
        )
        .unwrap();
        assert_eq!(s.check_chunk(Millis(0), 1, 4 * MIB, C, C), Ok(4 * MIB));
        assert_eq!(
            s.check_chunk(Millis(0), 2, 4 * MIB, C, C),
            Err(TransferError::ChunkLength { index: 2, want: MIB, got: 4 * MIB })
        );
        assert_eq!(s.check_chunk(Millis(0), 3, MIB, C, C), Err(TransferError::ChunkOutOfRange(3)));
        assert_eq!(s.check_chunk(Millis(0), 0, 4 * MIB, C, &C.replace('e', "f")), Err(TransferError::ChunkChecksum(0)));
        s.mark(0, Millis(10));
        assert_eq!(s.missing(), 2);
        assert!(s.resumes(&VolumeId::new("v"), "/a", 9 * MIB, &C.to_uppercase()));
        assert!(!s.resumes(&VolumeId::new("v"), "/a", 9 * MIB + 1, C));
        assert!(!s.expired(Millis(10 + SESSION_IDLE_MS)));
        assert!(s.expired(Millis(11 + SESSION_IDLE_MS)));
        // Expired before any begin swept it: no more chunks, no commit.
        assert_eq!(s.check_chunk(Millis(10 + SESSION_IDLE_MS), 1, 4 * MIB, C, C), Ok(4 * MIB));
        assert_eq!(s.check_chunk(Millis(11 + SESSION_IDLE_MS), 1, 4 * MIB, C, C), Err(TransferError::Expired));
        assert_eq!(s.check_alive(Millis(11 + SESSION_IDLE_MS)), Err(TransferError::Expired));
        assert_eq!(TransferError::Expired.kind(), crate::node::ErrorKind::NotFound);
        assert_eq!(
            UploadSession::new(
                "s".into(),
                VolumeId::new("v"),
                "/a".into(),
                1,
                "xyz".into(),
                FileId::new("f"),
                Millis(0)
            ),
            Err(TransferError::BadChecksum)
        );
        assert_eq!(check_read(0), Err(TransferError::ReadLength));
        assert_eq!(check_read(8 * MIB + 1), Err(TransferError::ReadLength));
    }

    fn session(id: &str, now: Millis) -> UploadSession {
        let sum = "ab".repeat(32);
        UploadSession::new(id.into(), VolumeId::new("v"), "/f".into(), 10, sum, FileId::new("f1"), now).unwrap()
    }

    #[test]
    fn uploads_resume_for_their_opener_expire_when_idle_and_stop_at_the_cap() {
        let (a, b) = (NodeId::new("a"), NodeId::new("b"));
        let mut up = Uploads::default();
        up.open(a.clone(), session("s1", Millis(0)));
        let sum = "AB".repeat(32);
        // The same upload from its opener resumes (touched); from another node it does not.
        assert!(up.resume(Millis(1_000), &b, &VolumeId::new("v"), "/f", 10, &sum).is_none());
        assert_eq!(
            up.resume(Millis(1_000), &a, &VolumeId::new("v"), "/f", 10, &sum).map(|u| u.id.clone()),
            Some("s1".into())
        );
        assert!(up.resume(Millis(1_000), &a, &VolumeId::new("v"), "/f", 11, &sum).is_none(), "another size");
        // Only the opener may use it.
        assert_eq!(up.get("s1", &b), Err(TransferError::UnknownSession));
        assert!(up.get("s1", &a).is_ok());
        assert_eq!(up.mark("s1", 0, Millis(2_000)), Ok(0));
        assert_eq!(up.mark("nope", 0, Millis(2_000)), Err(TransferError::UnknownSession));
        // Idle 30 minutes after its last touch: swept, and no longer live on its volume.
        assert!(up.live_on(&VolumeId::new("v"), Millis(2_000 + SESSION_IDLE_MS)));
        assert!(up.sweep(Millis(2_000 + SESSION_IDLE_MS)).is_empty());
        let swept = up.sweep(Millis(2_001 + SESSION_IDLE_MS));
        assert_eq!(swept.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), vec!["s1"]);
        assert!(up.is_empty());
        // The cap.
        for i in 0..SESSIONS_MAX {
            assert_eq!(up.check_room(), Ok(()));
            up.open(a.clone(), session(&format!("s{i}"), Millis(0)));
        }
        assert_eq!(up.check_room(), Err(TransferError::TooManySessions));
        assert_eq!(TransferError::TooManySessions.kind(), crate::node::ErrorKind::Unavailable);
        assert_eq!(up.remove("s0").map(|u| u.id), Some("s0".to_string()));
        assert_eq!(up.check_room(), Ok(()));
    }
}
