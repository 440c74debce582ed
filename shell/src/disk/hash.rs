//! The SHA-256 of a whole file and of each of its chunks, taken in one pass over the bytes
//! (cluster-runtime.md "Storage": each chunk carries its SHA-256, the commit names the whole
//! file's; issue 18 "Big files: CPU per byte").
//!
//! A node that relays or receives a chunk hashes it twice: as the chunk (its own SHA-256, which
//! is also the body hash its signature covers) and as the next bytes of the whole file. Both
//! digests run over the same 64-byte blocks whenever the whole-file hash sits on a block
//! boundary at the chunk's start, which it does for every chunk but after a short last one
//! (chunks are 4 MiB). With the CPU's SHA instructions, [`FileHash::update_with_chunk_sum`] then
//! expands each block's message schedule once and runs the rounds of both states side by side:
//! one round's result is not waited for before the other state's round issues, so the two
//! digests cost 1.3–1.45 times one on this machine's Xeon, not 2 (`shoal checksum --chunks`
//! times it; BENCHMARKS.md, issue 18, nineteenth session). Where the instructions are missing,
//! or the blocks do not line up, it hashes twice with the `sha2` crate, as before. The digests are the standard SHA-256 either way (the tests compare
//! every path with `sha2`).

use sha2::digest::generic_array::{typenum::U64, GenericArray};
use sha2::{Digest, Sha256};

const BLOCK: usize = 64;

/// The initial state of SHA-256 (FIPS 180-4, 5.3.3).
const H0: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// A running SHA-256 of a whole file, its state open so that a chunk's own digest can share
/// its pass (see the module doc). Cloning it is cheap (about 110 bytes).
#[derive(Clone)]
pub struct FileHash {
    state: [u32; 8],
    /// Bytes taken so far.
    len: u64,
    /// The bytes of an unfinished block.
    buf: [u8; BLOCK],
    buf_len: usize,
}

impl Default for FileHash {
    fn default() -> Self {
        FileHash::new()
    }
}

impl FileHash {
    pub fn new() -> FileHash {
        FileHash { state: H0, len: 0, buf: [0; BLOCK], buf_len: 0 }
    }

    /// Take the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.buf_len > 0 {
            let take = (BLOCK - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&data[..take]);
            self.buf_len += take;
            data = &data[take..];
            if self.buf_len < BLOCK {
                return;
            }
            let block = self.buf;
            compress(&mut self.state, &block);
            self.buf_len = 0;
        }
        let whole = data.len() - data.len() % BLOCK;
        compress(&mut self.state, &data[..whole]);
        let rest = &data[whole..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
    }

    /// Take `chunk` as the next bytes of the file and return the chunk's own SHA-256: in one
    /// pass when the CPU and the alignment allow (module doc), in two otherwise.
    pub fn update_with_chunk_sum(&mut self, chunk: &[u8]) -> [u8; 32] {
        self.update_with_chunk_sum_using(chunk, dual::available())
    }

    fn update_with_chunk_sum_using(&mut self, chunk: &[u8], one_pass: bool) -> [u8; 32] {
        if !one_pass || self.buf_len != 0 {
            self.update(chunk);
            return Sha256::digest(chunk).into();
        }
        let whole = chunk.len() - chunk.len() % BLOCK;
        let mut own = H0;
        dual::compress_both(&mut self.state, &mut own, &chunk[..whole]);
        let rest = &chunk[whole..];
        self.len += chunk.len() as u64;
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
        finish(own, rest, chunk.len() as u64)
    }

    /// The SHA-256 of every byte taken so far.
    pub fn sum(&self) -> [u8; 32] {
        finish(self.state, &self.buf[..self.buf_len], self.len)
    }

    /// [`FileHash::sum`] in lowercase hex.
    pub fn hex(&self) -> String {
        hex::encode(self.sum())
    }

    /// Bytes taken so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Run whole blocks through `state` (the `sha2` crate's compression: its SHA instructions
/// where the CPU has them).
fn compress(state: &mut [u32; 8], blocks: &[u8]) {
    assert_eq!(blocks.len() % BLOCK, 0, "whole blocks only");
    // SAFETY: `GenericArray<u8, U64>` is `repr(transparent)` over 64 bytes with alignment 1,
    // so a slice of whole blocks is a slice of them (what `sha2`'s own buffer hands it too).
    let blocks: &[GenericArray<u8, U64>] =
        unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast(), blocks.len() / BLOCK) };
    sha2::compress256(state, blocks);
}

/// The digest of a state that took `total` bytes, `tail` of them not yet in a block.
fn finish(mut state: [u32; 8], tail: &[u8], total: u64) -> [u8; 32] {
    let mut last = [0u8; 2 * BLOCK];
    last[..tail.len()].copy_from_slice(tail);
    last[tail.len()] = 0x80;
    let end = if tail.len() + 9 <= BLOCK { BLOCK } else { 2 * BLOCK };
    last[end - 8..end].copy_from_slice(&total.wrapping_mul(8).to_be_bytes());
    compress(&mut state, &last[..end]);
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// Both states through the same blocks, with the SHA instructions (x86-64 SHA-NI).
mod dual {
    /// Whether this CPU has the instructions [`compress_both`] uses (asked once).
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *HAS.get_or_init(|| {
                std::arch::is_x86_feature_detected!("sha")
                    && std::arch::is_x86_feature_detected!("sse2")
                    && std::arch::is_x86_feature_detected!("ssse3")
                    && std::arch::is_x86_feature_detected!("sse4.1")
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Run whole blocks through both states. Only where [`available`]; otherwise each state
    /// goes through them on its own.
    pub(super) fn compress_both(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[u8]) {
        assert_eq!(blocks.len() % super::BLOCK, 0, "whole blocks only");
        #[cfg(target_arch = "x86_64")]
        if available() {
            // SAFETY: the CPU has every feature the function is compiled for (checked above).
            unsafe { shani::compress_both(a, b, blocks) };
            return;
        }
        super::compress(a, blocks);
        super::compress(b, blocks);
    }

    /// The SHA-NI rounds (Intel's "SHA extensions" paper, section 5: the state kept as ABEF
    /// and CDGH, four rounds per 128-bit message word), each block's message schedule expanded
    /// once and both states' rounds issued in turn.
    #[cfg(target_arch = "x86_64")]
    mod shani {
        use std::arch::x86_64::*;

        /// The round constants of SHA-256 (FIPS 180-4, 4.2.2).
        const K: [u32; 64] = [
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
            0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
            0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
            0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
            0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
            0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
            0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
            0xc67178f2,
        ];

        /// A state as the instructions want it: (ABEF, CDGH).
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn load(state: &[u32; 8]) -> (__m128i, __m128i) {
            let p = state.as_ptr().cast::<__m128i>();
            let dcba = _mm_loadu_si128(p);
            let efgh = _mm_shuffle_epi32(_mm_loadu_si128(p.add(1)), 0x1B);
            let cdab = _mm_shuffle_epi32(dcba, 0xB1);
            (_mm_alignr_epi8(cdab, efgh, 8), _mm_blend_epi16(efgh, cdab, 0xF0))
        }

        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn store(state: &mut [u32; 8], abef: __m128i, cdgh: __m128i) {
            let feba = _mm_shuffle_epi32(abef, 0x1B);
            let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
            let p = state.as_mut_ptr().cast::<__m128i>();
            _mm_storeu_si128(p, _mm_blend_epi16(feba, dchg, 0xF0));
            _mm_storeu_si128(p.add(1), _mm_alignr_epi8(dchg, feba, 8));
        }

        /// # Safety
        /// The CPU must have SHA, SSE2, SSSE3 and SSE4.1; `blocks` is whole 64-byte blocks.
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        pub(super) unsafe fn compress_both(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[u8]) {
            // Big-endian words of the block.
            let swap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
            let (mut abef1, mut cdgh1) = load(a);
            let (mut abef2, mut cdgh2) = load(b);
            let k = K.as_ptr().cast::<__m128i>();
            for block in blocks.chunks_exact(64) {
                let saved = (abef1, cdgh1, abef2, cdgh2);
                let d = block.as_ptr().cast::<__m128i>();
                let mut w = [
                    _mm_shuffle_epi8(_mm_loadu_si128(d), swap),
                    _mm_shuffle_epi8(_mm_loadu_si128(d.add(1)), swap),
                    _mm_shuffle_epi8(_mm_loadu_si128(d.add(2)), swap),
                    _mm_shuffle_epi8(_mm_loadu_si128(d.add(3)), swap),
                ];
                for i in 0..16 {
                    if i >= 4 {
                        // W[i] from the four words before it (the message schedule, once).
                        let t = _mm_add_epi32(
                            _mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]),
                            _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4),
                        );
                        w[i % 4] = _mm_sha256msg2_epu32(t, w[(i + 3) % 4]);
                    }
                    let wk = _mm_add_epi32(w[i % 4], _mm_loadu_si128(k.add(i)));
                    let wk_hi = _mm_shuffle_epi32(wk, 0x0E);
                    cdgh1 = _mm_sha256rnds2_epu32(cdgh1, abef1, wk);
                    cdgh2 = _mm_sha256rnds2_epu32(cdgh2, abef2, wk);
                    abef1 = _mm_sha256rnds2_epu32(abef1, cdgh1, wk_hi);
                    abef2 = _mm_sha256rnds2_epu32(abef2, cdgh2, wk_hi);
                }
                abef1 = _mm_add_epi32(abef1, saved.0);
                cdgh1 = _mm_add_epi32(cdgh1, saved.1);
                abef2 = _mm_add_epi32(abef2, saved.2);
                cdgh2 = _mm_add_epi32(cdgh2, saved.3);
            }
            store(a, abef1, cdgh1);
            store(b, abef2, cdgh2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    #[test]
    fn the_digests_are_sha256_at_every_length_around_a_block() {
        for n in [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 4096, 4 << 20] {
            let data = bytes(n, 7);
            let want: [u8; 32] = Sha256::digest(&data).into();
            for one_pass in [true, false] {
                let mut f = FileHash::new();
                assert_eq!(f.update_with_chunk_sum_using(&data, one_pass), want, "chunk of {n}, one pass {one_pass}");
                assert_eq!(f.sum(), want, "file of {n}");
                assert_eq!(f.len(), n as u64);
            }
            let mut f = FileHash::new();
            f.update(&data);
            assert_eq!(f.hex(), hex::encode(want));
        }
    }

    #[test]
    fn both_states_move_through_the_same_blocks_as_they_would_alone() {
        let data = bytes(64 * 300, 3);
        let (mut a, mut b) = ([1u32, 2, 3, 4, 5, 6, 7, 8], H0);
        dual::compress_both(&mut a, &mut b, &data);
        let (mut a1, mut b1) = ([1u32, 2, 3, 4, 5, 6, 7, 8], H0);
        compress(&mut a1, &data);
        compress(&mut b1, &data);
        assert_eq!((a, b), (a1, b1));
    }

    proptest! {
        /// A file fed as any mix of plain updates and chunks whose own digests are asked for:
        /// every chunk's digest and the file's are SHA-256's, one pass or two.
        #[test]
        fn a_file_cut_anywhere_hashes_as_sha256(
            cuts in proptest::collection::vec((0usize..700, any::<bool>(), any::<bool>()), 0..12),
            seed in any::<u32>(),
        ) {
            let total: usize = cuts.iter().map(|c| c.0).sum();
            let data = bytes(total, seed);
            let mut f = FileHash::new();
            let mut at = 0;
            for (len, as_chunk, one_pass) in cuts {
                let piece = &data[at..at + len];
                if as_chunk {
                    let own: [u8; 32] = Sha256::digest(piece).into();
                    prop_assert_eq!(f.update_with_chunk_sum_using(piece, one_pass), own);
                } else {
                    f.update(piece);
                }
                at += len;
                let whole: [u8; 32] = Sha256::digest(&data[..at]).into();
                prop_assert_eq!(f.sum(), whole);
            }
        }
    }
}
