//! How a put spreads a file over copies (spec: "Storage (ACS) and the cluster:/ drive" → put;
//! issue 4 "streamed puts"): how the body travels, how many placements are tried, how many
//! copies must keep up for a lagging one to be left out, and how far behind is too far. The
//! shell streams the bytes; these are the rules it follows.

use crate::storage::transfer::CHUNK_BYTES;

/// A copy still writing a chunk this long after another copy wrote it is left out of the put
/// (made later by replication), so a hung peer holds a put for seconds, not the 60 s peer
/// timeout.
pub const STRAGGLER_MS: u64 = 15_000;

/// Whether a body of `len` bytes (`None`: length unknown) streams to every copy at once in
/// chunks; otherwise it is spooled first and copied one placement at a time (a small body, or
/// one without a length, keeps the retry on another node).
pub fn streams(len: Option<u64>) -> bool {
    len.is_some_and(|l| l > CHUNK_BYTES)
}

/// A body of known length up to this size is held in memory while it is hashed (no spool)
/// and each copy is written in one go: a peer's with one signed `store/put`.
pub const SMALL_PUT_BYTES: u64 = 1024 * 1024;

/// Whether a body of `len` bytes (`None`: length unknown) is held in memory (see
/// [`SMALL_PUT_BYTES`]); its copies are then written in parallel.
pub fn in_memory(len: Option<u64>) -> bool {
    len.is_some_and(|l| l <= SMALL_PUT_BYTES)
}

/// Whether a copy of `size` bytes travels to a peer in one request (`store/put`: begin, the
/// one chunk and commit in one signed call) rather than a chunked upload session.
pub fn single_request(size: u64) -> bool {
    size <= CHUNK_BYTES
}

/// How long a one-request copy of `size` bytes (`store/put`) may take before the peer is passed
/// over for another: 10 s, as for a peer to open an upload session, plus the body at 256 KB/s
/// (a slow link). A hung peer holds a small put for seconds, not the 60 s peer timeout.
pub fn single_request_timeout_ms(size: u64) -> u64 {
    10_000u64.saturating_add(size / 256)
}

/// Placements tried for a file that wants `wanted` copies: each node that cannot take its copy
/// is passed over for another, up to two more than wanted.
pub fn placement_tries(wanted: u32) -> u32 {
    wanted.saturating_add(2)
}

/// Copies that must hold a chunk before a copy still writing it may be left out: two when two
/// or more are wanted (so the put is acknowledged with at least two copies when it can be),
/// one otherwise. Durability first: with a policy of two, a hung peer holds the put for the peer
/// timeout rather than leave the file with one copy.
pub fn copies_to_keep(wanted: u32) -> usize {
    (wanted as usize).clamp(1, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_put_policy() {
        assert!(!streams(None), "no length: spooled");
        assert!(!streams(Some(CHUNK_BYTES)), "one chunk or less: spooled");
        assert!(streams(Some(CHUNK_BYTES + 1)));
        assert!(!in_memory(None), "no length: spooled");
        assert!(in_memory(Some(0)) && in_memory(Some(SMALL_PUT_BYTES)));
        assert!(!in_memory(Some(SMALL_PUT_BYTES + 1)));
        assert!(single_request(CHUNK_BYTES) && !single_request(CHUNK_BYTES + 1));
        assert_eq!(single_request_timeout_ms(4096), 10_016);
        assert_eq!(single_request_timeout_ms(CHUNK_BYTES), 26_384);
        assert_eq!(placement_tries(1), 3);
        assert_eq!(placement_tries(3), 5);
        assert_eq!(placement_tries(u32::MAX), u32::MAX);
        assert_eq!([0, 1, 2, 3, 9].map(copies_to_keep), [1, 1, 2, 2, 2]);
    }
}
