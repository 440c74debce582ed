//! How the process's allocator is tuned for moving bytes (issue 18 "CPU per byte"), for every
//! command of the binary alike (`shoal serve` and the CLI). A put or a get holds pieces of
//! 0.4 to 8 MiB (hyper's read buffers, a chunk, a read, a request body) for a moment each.
//! glibc serves blocks above its `mmap` threshold with a fresh `mmap` and gives them back with
//! `munmap`: a page fault and a zeroed page per 4 KiB of every piece, and a TLB shootdown per
//! `munmap`. Raising the threshold above the largest piece keeps them in the heap, reused; the
//! trim threshold keeps a few freed pieces rather than return them to the system at once, and
//! the arena cap bounds how many heaps may each keep that much.
//!
//! Measured (BENCHMARKS.md, issue 18, sixth session): a 256 KiB threshold, which `serve` set
//! until then, cost the nodes 1.0 to 1.6 CPU-seconds per GiB moved; a 6-minute soak ended at
//! the same RSS with either setting. An operator who sets `GLIBC_TUNABLES` (glibc's own
//! `glibc.malloc.mmap_threshold`, `trim_threshold`, `arena_max`) keeps their choice: nothing
//! is tuned here then.

/// Largest piece served from the heap rather than by `mmap`.
const MMAP_THRESHOLD: i32 = 16 << 20;
/// Free memory a heap keeps before giving it back.
const TRIM_THRESHOLD: i32 = 32 << 20;
/// Heaps (arenas) at most.
const ARENA_MAX: i32 = 2;

/// Tune the allocator as above; call once, first thing in `main`. Nothing to do off glibc,
/// or when the environment sets glibc's tunables itself.
pub fn tune_for_streaming() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}
