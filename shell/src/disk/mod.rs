//! Files on this node's disk, below the protocol: paths confined to a volume folder (no
//! symlink is ever followed out of it), positioned reads and writes with direct I/O where the
//! filesystem allows it, read-ahead and writeback hints, and a file's SHA-256. Used by the
//! node's services and by the CLI's download writer; knows nothing of HTTP or the core's state.

pub mod hash;
pub mod sync;
pub mod volumes;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use shoal_core::node::ApiError;
use shoal_core::storage::transfer;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The on-disk path of `path` inside volume folder `root`, creating its parent directories
/// when `create`. Walked one directory at a time without following symlinks, so nothing is
/// ever created or read outside the volume, whatever links someone left inside it.
pub fn confined_path(root: &Path, path: &str, create: bool) -> Result<PathBuf, ApiError> {
    // A folder this walk made can vanish before the next is made in it (a delete elsewhere
    // prunes empty folders): then the walk starts again.
    let mut tries = 0;
    loop {
        match confined_path_once(root, path, create) {
            Err(e) if e.code == "folder_vanished" && tries < 3 => tries += 1,
            Err(e) if e.code == "folder_vanished" => return Err(ApiError::internal("io", e.message)),
            r => return r,
        }
    }
}

fn confined_path_once(root: &Path, path: &str, create: bool) -> Result<PathBuf, ApiError> {
    let segs = transfer::copy_segments(path).map_err(|e| ApiError::new(e.kind(), "bad_transfer", e.to_string()))?;
    let io = |what: &str, e: std::io::Error| ApiError::internal("io", format!("{what}: {e}"));
    let escape = || ApiError::invalid("path_escapes_volume", "the path leaves its volume (a symlink?)");
    let root = std::fs::canonicalize(root).map_err(|e| io("volume folder", e))?;
    let mut dir = root;
    let mut missing = false;
    for s in &segs[..segs.len() - 1] {
        dir.push(s);
        if missing {
            continue;
        }
        match std::fs::symlink_metadata(&dir) {
            Ok(md) if md.file_type().is_symlink() => return Err(escape()),
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(ApiError::conflict("not_a_folder", format!("{} is a file, not a folder", dir.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !create {
                    missing = true;
                    continue;
                }
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    // Another write made it meanwhile: it must be a real folder.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match std::fs::symlink_metadata(&dir) {
                        Ok(md) if md.file_type().is_symlink() => return Err(escape()),
                        Ok(md) if md.is_dir() => {}
                        _ => {
                            return Err(ApiError::conflict(
                                "not_a_folder",
                                format!("{} is a file, not a folder", dir.display()),
                            ))
                        }
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(ApiError::internal("folder_vanished", format!("create folder: {e}")))
                    }
                    Err(e) => return Err(io("create folder", e)),
                }
                // Made here (or by another write meanwhile, which may not have synced it yet):
                // its entry made durable in its parent before anything is written below it. The
                // copy's own folder is fsync'd at its landing, but a power loss could otherwise
                // lose the new folder, and the copy with it.
                if let Some(parent) = dir.parent() {
                    sync::fsync_folder(parent).map_err(|e| io("sync folder", e))?;
                }
            }
            Err(e) => return Err(io("inspect folder", e)),
        }
    }
    let file = dir.join(segs.last().expect("copy_segments never returns an empty path"));
    if let Ok(md) = std::fs::symlink_metadata(&file) {
        if md.file_type().is_symlink() {
            return Err(escape());
        }
    }
    Ok(file)
}

/// Write `data` at `offset` of the existing file `path`. Large aligned pieces go straight to
/// the disk (`O_DIRECT`; from `data` itself when it is a [`Piece`], else through one): no copy into the page cache, and
/// nothing left for the fsync at commit but the device's cache. Where the filesystem refuses
/// direct I/O, and for a file's last, short chunk, the write is buffered and its writeback
/// started at once.
pub fn write_at(path: &Path, offset: u64, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if data.len() >= direct::MIN_BYTES && direct::fits(offset, data.len()) {
        if let Some(f) = direct::open(path)? {
            // A filesystem may take O_DIRECT at open and refuse the write (other alignment):
            // then the piece is written again, buffered (a positional write can be redone).
            match direct::write_all_at(&f, offset, data) {
                Err(e) if direct::refused(&e) => {}
                done => return done,
            }
        }
    }
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all_at(data, offset)?;
    start_writeback(&f, offset, data.len() as u64);
    Ok(())
}

/// Up to `len` bytes at `offset` of the copy at `path`, with the file's size. A large aligned
/// read (a piece of a get or a pull) comes straight from the disk (`O_DIRECT`) where the
/// filesystem allows: big files streaming through do not push out what the page cache holds,
/// and the copy into it is saved. Other reads are buffered, with the next piece read ahead.
pub fn read_at(path: &Path, offset: u64, len: u64) -> std::io::Result<(u64, Bytes)> {
    match direct::read_at(path, offset, len) {
        Ok(Some(r)) => return Ok(r),
        Ok(None) => {}
        Err(e) if direct::refused(&e) => {} // as for writes: read it buffered
        Err(e) => return Err(e),
    }
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    // Reads come piece after piece: the next one is fetched from disk while this one goes out.
    read_ahead(&f, offset, len.saturating_mul(2));
    f.seek(SeekFrom::Start(offset.min(size)))?;
    let mut buf = Vec::with_capacity(len.min(size.saturating_sub(offset)) as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok((size, Bytes::from(buf)))
}

/// Direct (unbuffered) reads and writes of large aligned pieces.
mod direct {
    use std::path::Path;
    use std::sync::Mutex;

    /// Alignment of buffers, offsets and lengths for `O_DIRECT`.
    const ALIGN: usize = 4096;
    /// Smaller pieces go through the page cache (small files stay cached, and cheap to sync).
    pub const MIN_BYTES: usize = 1 << 20;
    /// Aligned buffers kept for reuse (fresh memory costs page faults on every chunk): enough
    /// for the pieces in flight of a few transfers (4 MiB each).
    static POOL: Pool = Pool::new(8);

    /// Buffers kept for reuse, at most `max`.
    pub struct Pool {
        kept: Mutex<Vec<Vec<u8>>>,
        max: usize,
    }

    impl Pool {
        pub const fn new(max: usize) -> Pool {
            Pool { kept: Mutex::new(Vec::new()), max }
        }

        /// A kept buffer of at least `len` bytes, or a new one of `len`.
        fn take(&self, len: usize) -> Vec<u8> {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            match kept.iter().position(|b| b.len() >= len) {
                Some(i) => kept.swap_remove(i),
                None => vec![0u8; len],
            }
        }

        fn give(&self, buf: Vec<u8>) {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < self.max {
                kept.push(buf);
            }
        }
    }

    /// Whether an error says the filesystem will not do this direct I/O (not that it failed).
    pub fn refused(e: &std::io::Error) -> bool {
        #[cfg(target_os = "linux")]
        {
            matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = e;
            false
        }
    }

    pub fn fits(offset: u64, len: usize) -> bool {
        cfg!(target_os = "linux") && len > 0 && len & (ALIGN - 1) == 0 && offset & (ALIGN as u64 - 1) == 0
    }

    /// The file opened for direct writes; `None` when the filesystem does not do direct I/O.
    pub fn open(path: &Path) -> std::io::Result<Option<std::fs::File>> {
        open_for(path, true)
    }

    #[cfg(target_os = "linux")]
    fn open_for(path: &Path, write: bool) -> std::io::Result<Option<std::fs::File>> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new().read(!write).write(write).custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if refused(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn open_for(_path: &Path, _write: bool) -> std::io::Result<Option<std::fs::File>> {
        Ok(None)
    }

    /// Read up to `len` bytes at `offset` of `path` straight from the disk, when the read is
    /// large and aligned and the filesystem does direct I/O: (file size, bytes).
    pub fn read_at(path: &Path, offset: u64, len: u64) -> std::io::Result<Option<(u64, bytes::Bytes)>> {
        use std::os::unix::fs::FileExt;
        if !fits(offset, ALIGN) || len < MIN_BYTES as u64 {
            return Ok(None);
        }
        let Some(f) = open_for(path, false)? else { return Ok(None) };
        let size = f.metadata()?.len();
        let want = len.min(size.saturating_sub(offset)) as usize;
        let rounded = want.div_ceil(ALIGN) * ALIGN;
        let mut piece = Piece::new(rounded);
        let room = piece.room_mut();
        let mut got = 0;
        while got < want {
            let n = f.read_at(&mut room[got..rounded], offset + got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        piece.len = got.min(want);
        Ok(Some((size, piece.into_bytes())))
    }

    /// Write `data` with direct I/O: from `data` itself when it is aligned (a [`Piece`]),
    /// else through a piece it is copied into.
    pub fn write_all_at(f: &std::fs::File, offset: u64, data: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if (data.as_ptr() as usize).is_multiple_of(ALIGN) {
            return f.write_all_at(data, offset);
        }
        let mut piece = Piece::new(data.len());
        piece.fill(data);
        f.write_all_at(piece.as_ref(), offset)
    }

    /// A buffer aligned for direct I/O, for one piece of a transfer (a chunk, a read). Its
    /// memory comes from a small pool and goes back to it when the piece is dropped, also
    /// when a `Bytes` made by [`Piece::into_bytes`] held it: fresh memory for every piece
    /// would cost a page fault per 4 KiB, and `O_DIRECT` needs the alignment anyway.
    pub struct Piece {
        pool: &'static Pool,
        buf: Vec<u8>,
        start: usize,
        cap: usize,
        len: usize,
    }

    impl Piece {
        /// An empty piece with room for `cap` bytes rounded up to whole 4 KiB blocks.
        pub fn new(cap: usize) -> Piece {
            Piece::from_pool(&POOL, cap)
        }

        pub fn from_pool(pool: &'static Pool, cap: usize) -> Piece {
            let cap = cap.div_ceil(ALIGN).max(1) * ALIGN;
            let buf = pool.take(cap + ALIGN);
            let start = buf.as_ptr().align_offset(ALIGN);
            Piece { pool, buf, start, cap, len: 0 }
        }

        pub fn len(&self) -> usize {
            self.len
        }

        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Bytes that still fit.
        pub fn room(&self) -> usize {
            self.cap - self.len
        }

        /// Append as much of `data` as fits; how many bytes were taken.
        pub fn fill(&mut self, data: &[u8]) -> usize {
            let take = self.room().min(data.len());
            let at = self.start + self.len;
            self.buf[at..at + take].copy_from_slice(&data[..take]);
            self.len += take;
            take
        }

        pub fn clear(&mut self) {
            self.len = 0;
        }

        /// The whole room (from the start), for a read to fill.
        fn room_mut(&mut self) -> &mut [u8] {
            &mut self.buf[self.start..self.start + self.cap]
        }

        /// The piece as `Bytes`, without a copy; its memory returns to the pool when the last
        /// `Bytes` sharing it is dropped.
        pub fn into_bytes(self) -> bytes::Bytes {
            bytes::Bytes::from_owner(self)
        }
    }

    impl AsRef<[u8]> for Piece {
        fn as_ref(&self) -> &[u8] {
            &self.buf[self.start..self.start + self.len]
        }
    }

    impl Drop for Piece {
        fn drop(&mut self) {
            self.pool.give(std::mem::take(&mut self.buf));
        }
    }
}

pub use direct::{Piece, Pool, MIN_BYTES as DIRECT_MIN_BYTES};

/// Ask the kernel to read `len` bytes from `offset` into the page cache in the background.
#[cfg(target_os = "linux")]
pub fn read_ahead(f: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a file descriptor we own; it only schedules reads.
    unsafe {
        if let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
            libc::posix_fadvise(f.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn read_ahead(_f: &std::fs::File, _offset: u64, _len: u64) {}

/// Ask the kernel to start writing a chunk's pages to disk now, so the fsync at commit has
/// little left to do (with much RAM, dirty pages would otherwise wait for it all).
#[cfg(target_os = "linux")]
pub fn start_writeback(f: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a file descriptor we own; it only schedules writeback.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
pub fn start_writeback(_f: &std::fs::File, _offset: u64, _len: u64) {}

/// Now on the clock file modification times are stamped with (the host's), unix ms. In the
/// simulator this is not the node's clock, so rules on mtimes take both from here.
pub fn file_clock() -> shoal_core::Millis {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    shoal_core::Millis(since.as_millis() as u64)
}

/// A file's modification time, unix ms on [`file_clock`] (0 when the file system does not say).
pub fn mtime_ms(md: &std::fs::Metadata) -> u64 {
    md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as u64)
}

pub fn file_sha(f: &mut std::fs::File) -> std::io::Result<String> {
    f.seek(SeekFrom::Start(0))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_aligned_fills_up_to_its_room_and_its_memory_goes_back_to_the_pool_after_its_last_bytes() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(2)));
        let mut piece = Piece::from_pool(pool, 10_000);
        assert_eq!(piece.as_ref().as_ptr() as usize % 4096, 0, "aligned for O_DIRECT");
        assert_eq!(piece.room(), 12_288, "rounded up to whole 4 KiB blocks");
        let data: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        assert_eq!(piece.fill(&data[..5_000]), 5_000);
        assert_eq!(piece.fill(&data[5_000..]), 7_288, "takes what fits, says how much");
        assert_eq!((piece.len(), piece.room()), (12_288, 0));
        assert!(piece.as_ref() == &data[..12_288]);
        let at = piece.as_ref().as_ptr();

        let bytes = piece.into_bytes();
        let half = bytes.slice(100..200);
        drop(bytes);
        assert!(half[..] == data[100..200]);
        let other = Piece::from_pool(pool, 4096);
        assert_ne!(other.as_ref().as_ptr(), at, "still held by the slice: not reused");
        drop(other);
        drop(half);
        let again = Piece::from_pool(pool, 12_288);
        assert_eq!(again.as_ref().as_ptr(), at, "the same memory, reused");
        assert!(again.is_empty());

        let mut small = Piece::from_pool(pool, 1);
        small.fill(b"abc");
        small.clear();
        assert!(small.is_empty() && small.room() == 4096, "room as asked for, in a bigger kept buffer");
    }
}
