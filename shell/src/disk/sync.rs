//! Group commit of one volume's writes: the fsyncs of copies that are written at the same time
//! share one flush of the volume's file system.
//!
//! Every copy is made durable twice before its put is answered (cluster-runtime.md, "Storage":
//! a copy counts once its bytes are on disk): its part file before the rename, so that a crash
//! never leaves a renamed file without its bytes, then its folder after the rename, so that the
//! name survives. With one fsync per file and per folder, 16 clients writing small files pay two
//! device flushes, two waits and two thread wake-ups per file. [`GroupSync`] gathers the files
//! that ask while a flush runs and makes them all durable with the next one: a single
//! `syncfs(2)` of the volume's file system, which writes every dirty page and inode of it and
//! flushes the device's cache once. A round with one file only fsyncs that file, so a node that
//! writes one file at a time flushes nothing else; so does a file on another file system than
//! the volume's folder (a mount point below it).
//!
//! A `syncfs` also writes whatever else is dirty on that file system, so a round of several
//! files that was slow beside a lone fsync turns grouping off for a while: that rule is the
//! core's ([`SyncPacing`], `shoal_core::storage::sync_pacing`); this module times its flushes
//! and asks it.
//!
//! `syncfs` reports all write errors only since Linux 5.17; on an older kernel, and on other
//! systems, there is no grouping ([`GroupSync::for_folder`] answers `None`) and each file is
//! fsynced on its own, as before. A failed flush fails every file of its round.

use crate::sync::lock;
use shoal_core::storage::sync_pacing::SyncPacing;
use shoal_core::time::Millis;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// How a node's copies were made durable, for `/metrics` (`shoal_disk_syncs` and
/// `shoal_disk_sync_groups`): counts since the process started, kept by the node and shared by
/// the groups of all its volumes.
#[derive(Debug, Default)]
pub struct SyncFigures {
    /// Files (and folders) fsynced on their own.
    pub lone: AtomicU64,
    /// Files made durable by a flush shared with others.
    pub grouped: AtomicU64,
    /// Shared flushes.
    pub groups: AtomicU64,
    /// Shared flushes so slow that grouping was turned off for a while
    /// (`shoal_core::storage::sync_pacing::ALONE_FOR_MS`).
    pub slow_groups: AtomicU64,
}

impl SyncFigures {
    fn count(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One file fsynced on its own, outside any group (no grouping on this system).
    pub fn lone_sync(&self) {
        Self::count(&self.lone, 1);
    }
}

/// Makes a round's files durable, given their descriptors (one or more).
type Flush = dyn Fn(&[RawFd]) -> io::Result<()> + Send + Sync;

/// The fsyncs of one volume, grouped: see the module doc.
pub struct GroupSync {
    rounds: Mutex<Rounds>,
    ended: Condvar,
    flush: Box<Flush>,
    pacing: Mutex<SyncPacing>,
    figures: Arc<SyncFigures>,
    /// The origin of the `now` handed to the pacing rule.
    born: Instant,
}

/// Which rounds began and ended, and who waits for the next one.
#[derive(Default)]
struct Rounds {
    /// The last round begun; round `n + 1` takes every file that asked while round `n` ran.
    begun: u64,
    /// The last round ended.
    ended: u64,
    running: bool,
    /// The files waiting for the next round.
    waiting: Vec<RawFd>,
    /// Rounds that failed: the error, and how many of their files have not been told yet.
    failed: BTreeMap<u64, (io::ErrorKind, String, usize)>,
}

impl GroupSync {
    /// Grouped fsyncs for the volume at `folder`, whose file system one `syncfs` flushes. The
    /// folder stays open while the group lives, so a write error anywhere on that file system
    /// after this call is reported by the next round. `None` where `syncfs` does not report
    /// write errors (Linux before 5.17, other systems): fsync each file on its own there.
    pub fn for_folder(folder: &Path, figures: Arc<SyncFigures>) -> Option<GroupSync> {
        if !syncfs_reports_errors() {
            return None;
        }
        let root = File::open(folder).ok()?;
        if !syncfs_flushes(root.as_raw_fd()) {
            return None;
        }
        let device = device_of(root.as_raw_fd())?;
        let flush = Box::new(move |fds: &[RawFd]| {
            let mut here = Vec::with_capacity(fds.len());
            // Files on another device (a mount below the volume) each fsync'd on their own,
            // all of them: one's error does not leave the others unsynced. A folder that
            // cannot be fsync'd there (`EINVAL`, `ENOTSUP`) is no error, as for a lone folder;
            // any other error fails the round, after the rest are flushed.
            let mut failed = None;
            for &fd in fds {
                if device_of(fd) == Some(device) {
                    here.push(fd);
                } else if let Err(e) = fsync(fd) {
                    let folder_refused =
                        matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTSUP)) && is_folder(fd);
                    if !folder_refused {
                        failed.get_or_insert(e);
                    }
                }
            }
            let flushed = match here[..] {
                [] => Ok(()),
                [one] => fsync(one),
                _ => {
                    syncfs(root.as_raw_fd())?;
                    // `syncfs` reports an error once, to the flush that met it: a file whose
                    // pages an earlier round wrote back and failed would pass this one. Its own
                    // error, kept in the file until someone asks, is asked for here (its pages
                    // are clean now: nothing is written again).
                    here.iter().try_for_each(|&fd| own_write_errors(fd))
                }
            };
            match failed {
                Some(e) => Err(e),
                None => flushed,
            }
        });
        Some(GroupSync::new(flush, figures))
    }

    fn new(flush: Box<Flush>, figures: Arc<SyncFigures>) -> GroupSync {
        let (rounds, ended, pacing) = (Mutex::new(Rounds::default()), Condvar::new(), Mutex::default());
        GroupSync { rounds, ended, flush, pacing, figures, born: Instant::now() }
    }

    /// `at` as the pacing rule's `now`: milliseconds since this group began.
    fn millis(&self, at: Instant) -> Millis {
        Millis(u64::try_from(at.saturating_duration_since(self.born).as_millis()).unwrap_or(u64::MAX))
    }

    /// Tell the pacing rule a flush of `files` files ran from `start` to now; true when it was
    /// slow enough to turn grouping off.
    fn took(&self, files: usize, start: Instant) -> bool {
        let end = Instant::now();
        let took_us = u64::try_from((end - start).as_micros()).unwrap_or(u64::MAX);
        lock(&self.pacing).took(files, took_us, self.millis(end))
    }

    /// Make `file` (a file or folder in this volume) durable: returns once a round that began
    /// after this call has flushed it, or with that round's error. Blocks: call it where the
    /// fsync it replaces was, on a blocking thread.
    pub fn sync(&self, file: &File) -> io::Result<()> {
        self.sync_fd(file.as_raw_fd())
    }

    fn sync_fd(&self, fd: RawFd) -> io::Result<()> {
        let start = Instant::now();
        if !lock(&self.pacing).grouping(self.millis(start)) {
            let synced = (self.flush)(&[fd]);
            self.took(1, start);
            self.figures.lone_sync();
            return synced;
        }
        let mut r = lock(&self.rounds);
        // The round after the one running now (or the next, when none runs): one that begins
        // after this file's writes.
        let mine = r.begun + 1;
        r.waiting.push(fd);
        loop {
            if r.ended >= mine {
                return match r.failed.get_mut(&mine) {
                    None => Ok(()),
                    Some((kind, message, untold)) => {
                        let e = io::Error::new(*kind, message.clone());
                        *untold -= 1;
                        if *untold == 0 {
                            r.failed.remove(&mine);
                        }
                        Err(e)
                    }
                };
            }
            if r.running {
                r = self.ended.wait(r).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // No round runs: this caller runs round `mine` for every file waiting.
            r.running = true;
            r.begun = mine;
            let files = std::mem::take(&mut r.waiting);
            drop(r);
            let start = Instant::now();
            // A panic in the flush must not leave the round running for ever.
            let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.flush)(&files)))
                .unwrap_or_else(|_| Err(io::Error::other("the flush of a volume's files panicked")));
            let slow = self.took(files.len(), start);
            if flushed.is_err() && files.len() > 1 {
                lock(&self.pacing).flush_failed();
            }
            let f = &self.figures;
            match files.len() {
                1 => f.lone_sync(),
                n => {
                    SyncFigures::count(&f.grouped, n);
                    SyncFigures::count(&f.groups, 1);
                    SyncFigures::count(&f.slow_groups, usize::from(slow));
                }
            }
            r = lock(&self.rounds);
            r.running = false;
            r.ended = mine;
            if let Err(e) = flushed {
                r.failed.insert(mine, (e.kind(), e.to_string(), files.len()));
            }
            self.ended.notify_all();
        }
    }
}

/// Open `dir` and fsync it on its own (not grouped), as [`folder_sync_result`] says.
pub fn fsync_folder(dir: &Path) -> io::Result<()> {
    folder_sync_result(File::open(dir).and_then(|d| d.sync_all()))
}

/// What [`crate::node::state::WriteGuard::sync_folder`] makes of a folder's fsync: a file
/// system that cannot fsync folders (`EINVAL`, `ENOTSUP`) is no error.
pub fn folder_sync_result(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTSUP)) => Ok(()),
        r => r,
    }
}

/// A file's write errors not reported yet, without a flush of the device: its dirty pages are
/// written and waited for (none, after a `syncfs`), then its error state is asked.
#[cfg(target_os = "linux")]
fn own_write_errors(fd: RawFd) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain syscall on a descriptor its caller holds open until the round ends.
    if unsafe { libc::sync_file_range(fd, 0, 0, flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn own_write_errors(fd: RawFd) -> io::Result<()> {
    fsync(fd)
}

fn fsync(fd: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on a descriptor its caller holds open until the round ends.
    if unsafe { libc::fsync(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(target_os = "linux")]
fn syncfs(fd: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on the volume folder's descriptor, open while the group lives.
    if unsafe { libc::syncfs(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn syncfs(_fd: RawFd) -> io::Result<()> {
    Err(io::Error::other("syncfs is Linux only"))
}

/// Whether `fd` is a folder.
fn is_folder(fd: RawFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills `st` when it answers 0; the descriptor is held open by its caller.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: initialised by the successful fstat above.
    (unsafe { st.assume_init() }.st_mode & libc::S_IFMT) == libc::S_IFDIR
}

/// Whether one `syncfs` of the file system holding `fd` makes its files durable: only the
/// local disk file systems known to flush data and metadata on it. Elsewhere each file is
/// fsync'd on its own: FUSE's `syncfs` sends nothing to most servers (mergerfs, sshfs, ntfs-3g;
/// only virtiofs asks for it), and network file systems flush per file.
#[cfg(target_os = "linux")]
fn syncfs_flushes(fd: RawFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills `st` when it answers 0; the descriptor is open while this runs.
    if unsafe { libc::fstatfs(fd, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: initialised by the successful fstatfs above.
    // The magic numbers are 32 bits; `f_type` is wider on some targets and signed on others.
    #[allow(clippy::unnecessary_cast)]
    let kind = unsafe { st.assume_init() }.f_type as u32;
    GROUPED_FS_TYPES.contains(&kind)
}

#[cfg(not(target_os = "linux"))]
fn syncfs_flushes(_fd: RawFd) -> bool {
    false
}

/// `statfs` magic numbers of the file systems whose `syncfs` flushes every file: ext2/3/4,
/// XFS, Btrfs, F2FS, ZFS, overlayfs (its upper layer's), tmpfs (nothing to flush).
const GROUPED_FS_TYPES: [u32; 7] =
    [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010, 0x2FC1_2FC1, 0x794C_7630, 0x0102_1994];

/// The device a descriptor's file lives on.
fn device_of(fd: RawFd) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills `st` when it answers 0; the descriptor is held open by its caller.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful fstat above.
    #[allow(clippy::unnecessary_cast)] // `st_dev` is u64 on Linux but narrower elsewhere
    Some(unsafe { st.assume_init() }.st_dev as u64)
}

/// Whether this kernel's `syncfs` reports write errors (Linux 5.17 and later: from 5.8 it
/// reports errors of writing pages back, and from 5.17 also those of the file system's own
/// flush, such as a failed journal commit or device cache flush).
fn syncfs_reports_errors() -> bool {
    static REPORTS: OnceLock<bool> = OnceLock::new();
    *REPORTS.get_or_init(|| cfg!(target_os = "linux") && kernel_at_least(&kernel_release(), (5, 17)))
}

fn kernel_release() -> String {
    let mut u = std::mem::MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: uname fills `u` when it answers 0.
    if unsafe { libc::uname(u.as_mut_ptr()) } != 0 {
        return String::new();
    }
    // SAFETY: initialised by the successful uname above; `release` is NUL-terminated.
    let u = unsafe { u.assume_init() };
    let bytes: Vec<u8> = u.release.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a kernel release such as `6.18.44-fc` is `want` (major, minor) or later.
fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The descriptors of each flush, in order.
    type Flushed = Arc<Mutex<Vec<Vec<RawFd>>>>;

    /// A group whose flushes are recorded, the first held until `release` is sent, a flush of
    /// several files lasting `several_take`, and a flush of a round containing `fail_on` failing.
    fn recording(fail_on: RawFd, several_take: Duration) -> (Arc<GroupSync>, Flushed, mpsc::Sender<()>) {
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let (release, held) = mpsc::channel::<()>();
        let held = Mutex::new(Some(held));
        let seen = rounds.clone();
        let flush = Box::new(move |fds: &[RawFd]| {
            if let Some(wait) = lock(&held).take() {
                wait.recv().unwrap();
            }
            if fds.len() > 1 {
                std::thread::sleep(several_take);
            }
            lock(&seen).push(fds.to_vec());
            if fds.contains(&fail_on) {
                Err(io::Error::other("device gone"))
            } else {
                Ok(())
            }
        });
        let group = GroupSync::new(flush, Arc::default());
        (Arc::new(group), rounds, release)
    }

    type Caller = std::thread::JoinHandle<io::Result<()>>;

    impl GroupSync {
        fn grouping_now(&self) -> bool {
            lock(&self.pacing).grouping(self.millis(Instant::now()))
        }
    }

    /// `first` asks and its round is held (see [`recording`]); then `later` ask meanwhile and
    /// queue for the next round. The callers' threads.
    fn first_held_then(group: &Arc<GroupSync>, first: RawFd, later: &[RawFd]) -> (Caller, Vec<Caller>) {
        let ask = |fd: RawFd| {
            let g = group.clone();
            std::thread::spawn(move || g.sync_fd(fd))
        };
        let first = ask(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lock(&group.rounds).running {
            assert!(Instant::now() < deadline, "the first round never began");
            std::thread::sleep(Duration::from_millis(1));
        }
        let later: Vec<_> = later.iter().map(|&fd| ask(fd)).collect();
        while lock(&group.rounds).waiting.len() < later.len() {
            assert!(Instant::now() < deadline, "callers never queued");
            std::thread::sleep(Duration::from_millis(1));
        }
        (first, later)
    }

    #[test]
    fn files_that_ask_while_a_flush_runs_share_the_next_one_and_none_returns_before_it() {
        let (group, rounds, release) = recording(-1, Duration::ZERO);
        // Round 1 (file 10) is held; files 11 and 12 ask meanwhile and must wait for round 2.
        let (first, later) = first_held_then(&group, 10, &[11, 12]);
        assert!(later.iter().all(|t| !t.is_finished()), "not covered by the round that ran before they asked");
        release.send(()).unwrap();
        first.join().unwrap().unwrap();
        for t in later {
            t.join().unwrap().unwrap();
        }
        let mut seen = lock(&rounds).clone();
        seen[1].sort();
        assert_eq!(seen, vec![vec![10], vec![11, 12]], "two flushes for three files");
        let f = &group.figures;
        let counts = [&f.lone, &f.grouped, &f.groups, &f.slow_groups].map(|c| c.load(Ordering::Relaxed));
        assert_eq!(counts, [1, 2, 1, 0], "one lone, two grouped in one group");
    }

    #[test]
    fn a_failed_flush_fails_every_file_of_its_round_and_no_other() {
        let (group, _rounds, release) = recording(12, Duration::ZERO);
        let (first, later) = first_held_then(&group, 10, &[11, 12]);
        release.send(()).unwrap();
        assert!(first.join().unwrap().is_ok());
        for t in later {
            let e = t.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("device gone"), "{e}");
        }
        assert!(!group.grouping_now(), "after a failed shared flush, each file alone");
        assert!(group.sync_fd(13).is_ok(), "the next round is a new one");
        assert!(lock(&group.rounds).failed.is_empty(), "a failure is kept only until each of its files was told");
    }

    #[test]
    fn real_files_written_by_many_threads_are_all_synced_alone_or_together() {
        let dir = tempfile::tempdir().unwrap();
        let figures = Arc::new(SyncFigures::default());
        let Some(group) = GroupSync::for_folder(dir.path(), figures.clone()) else {
            assert!(!syncfs_reports_errors(), "only where syncfs cannot report errors");
            return;
        };
        let group = Arc::new(group);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (g, dir) = (group.clone(), dir.path().to_path_buf());
                std::thread::spawn(move || {
                    for i in 0..20 {
                        let path = dir.join(format!("f{t}-{i}"));
                        std::fs::write(&path, b"bytes").unwrap();
                        g.sync(&File::open(&path).unwrap()).unwrap();
                        g.sync(&File::open(&dir).unwrap()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let r = lock(&group.rounds);
        assert!(r.ended > 0 && !r.running && r.waiting.is_empty() && r.failed.is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 160);
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(load(&figures.lone) + load(&figures.grouped), 320, "every sync counted once");
    }

    /// Grouping is for file systems whose `syncfs` flushes their files: the local disk ones.
    /// `/proc` (and, by the same list, a FUSE or network mount) gets a lone fsync per file.
    #[test]
    #[cfg(target_os = "linux")]
    fn only_file_systems_whose_syncfs_flushes_are_grouped() {
        let dir = tempfile::tempdir().unwrap();
        let here = File::open(dir.path()).unwrap();
        let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: fstatfs on an open descriptor; read only when it answered 0.
        assert_eq!(unsafe { libc::fstatfs(here.as_raw_fd(), st.as_mut_ptr()) }, 0);
        #[allow(clippy::unnecessary_cast)]
        // SAFETY: initialised by the successful fstatfs above.
        let kind = unsafe { st.assume_init() }.f_type as u32;
        assert_eq!(syncfs_flushes(here.as_raw_fd()), GROUPED_FS_TYPES.contains(&kind));
        let proc_fs = File::open("/proc").unwrap();
        assert!(!syncfs_flushes(proc_fs.as_raw_fd()), "procfs is not a disk");
        assert!(GroupSync::for_folder(Path::new("/proc"), Arc::new(SyncFigures::default())).is_none());
        // FUSE (0x65735546) and NFS (0x6969), SMB (0xFE534D42), CIFS (0xFF534D42) are not listed.
        for other in [0x6573_5546_u32, 0x6969, 0xFE53_4D42, 0xFF53_4D42] {
            assert!(!GROUPED_FS_TYPES.contains(&other));
        }
    }

    #[test]
    fn after_a_slow_round_files_are_synced_alone_at_once() {
        let slow_round = Duration::from_micros(shoal_core::storage::sync_pacing::SLOW_ROUND_US);
        let (group, rounds, release) = recording(-1, slow_round + Duration::from_millis(20));
        let (first, later) = first_held_then(&group, 1, &[2, 3]);
        release.send(()).unwrap();
        first.join().unwrap().unwrap();
        for t in later {
            t.join().unwrap().unwrap();
        }
        assert!(!group.grouping_now(), "the round of 2 was slow");
        assert_eq!(group.figures.slow_groups.load(Ordering::Relaxed), 1);
        let begun = lock(&group.rounds).begun;
        group.sync_fd(9).unwrap();
        assert_eq!(lock(&rounds).last(), Some(&vec![9]));
        assert_eq!(lock(&group.rounds).begun, begun, "synced alone, with no round begun for it");
    }

    #[test]
    fn a_folder_that_cannot_be_fsynced_is_no_error_but_a_failed_fsync_is() {
        let os = |code| Err(io::Error::from_raw_os_error(code));
        assert!(folder_sync_result(os(libc::EINVAL)).is_ok());
        assert!(folder_sync_result(os(libc::ENOTSUP)).is_ok());
        assert_eq!(folder_sync_result(os(libc::EIO)).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(folder_sync_result(Ok(())).is_ok());
    }

    #[test]
    fn a_flush_that_panics_fails_its_round_and_the_group_goes_on() {
        let calls = Arc::new(Mutex::new(0));
        let seen = calls.clone();
        let flush = Box::new(move |_: &[RawFd]| {
            let mut n = lock(&seen);
            *n += 1;
            if *n == 1 {
                drop(n);
                panic!("flush broke");
            }
            Ok(())
        });
        let group = GroupSync::new(flush, Arc::default());
        let e = group.sync_fd(1).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert!(!lock(&group.rounds).running, "the round ended");
        assert!(group.sync_fd(2).is_ok(), "the next caller is not stuck behind it");
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(kernel_at_least("6.18.44-fc-v1252", (5, 8)));
        assert!(kernel_at_least("5.8.0", (5, 8)));
        assert!(!kernel_at_least("5.7.19-generic", (5, 8)));
        assert!(!kernel_at_least("4.19.0", (5, 8)));
        assert!(!kernel_at_least("", (5, 8)));
        assert!(!kernel_at_least("weird", (5, 8)));
        assert!(!kernel_at_least("5.16.20", (5, 17)), "before syncfs reported the file system's own flush errors");
        assert!(kernel_at_least("5.17.0", (5, 17)));
    }
}
