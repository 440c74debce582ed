//! How the process's allocator is tuned for moving bytes (issue 18 "CPU per byte"). A put or a
//! get holds pieces of 1 to 8 MiB (a chunk, a read, a request body) for a moment each. glibc
//! serves blocks that big with a fresh `mmap` and gives them back with `munmap`, so each piece
//! costs a page fault and a zeroed page per 4 KiB: on a 2-core machine a fifth of a node's CPU
//! while streaming. Raising the `mmap` threshold above the largest piece keeps them in the
//! heap, reused; the trim threshold keeps a few freed pieces rather than return them to the
//! system at once, and the arena cap bounds how many heaps may each keep that much (the peak
//! RSS while moving 1 GiB stays under 100 MB).

/// Largest piece served from the heap rather than by `mmap`.
const MMAP_THRESHOLD: i32 = 16 << 20;
/// Free memory a heap keeps before giving it back.
const TRIM_THRESHOLD: i32 = 32 << 20;
/// Heaps (arenas) at most.
const ARENA_MAX: i32 = 2;

/// Tune the allocator as above; call once, first thing in `main`. Nothing to do off glibc.
pub fn tune_for_streaming() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}
