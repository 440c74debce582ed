//! ACN request signing and verification (spec: cluster-runtime.md "ACN – node-to-node protocol";
//! reference-facts.md "Wire").
//!
//! Every node-to-node request carries `X-Aroz-Node`, `X-Aroz-Cluster`, `X-Aroz-Timestamp` (unix
//! seconds), `X-Aroz-Nonce` (16 random bytes, hex) and `X-Aroz-Signature` (standard base64 of an
//! Ed25519 signature over the [canonical string](canonical_string)).
//!
//! [`Verifier::verify`] checks in the reference's order: not signed -> wrong cluster -> clock skew
//! (more than 300 s) -> unknown node -> bad signature, and only then spends the nonce (the
//! sender's, at least 600 s: [`NonceCache`]) -> replay. A request that fails any earlier check
//! never touches the nonce cache, so junk cannot poison it. The cache is bounded
//! ([`NONCE_CACHE_MAX`]): when it is full of live nonces the request is refused rather than an
//! unexpired nonce forgotten.
//!
//! Clock skew, unlike the reference: the 300 s window is centred on the receiver's estimate of
//! the *sender's* clock (learnt from the `timeMs` peers put in their answers, clamped to
//! ±[`PEER_OFFSET_MAX_MS`]), so two members whose clocks are 8 minutes apart still talk, while a
//! request stays acceptable only for its 600 s window. Replay safety: a request stamped `T` can
//! pass the clock check only while the receiver's clock is within `T ± (300 s + max offset)`,
//! and its nonce is kept until then (never less than the reference's 600 s).

use crate::ids::{ClusterId, NodeId};
use crate::rng::SeededRng;
use crate::time::Millis;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier as _, VerifyingKey};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub const HEADER_NODE: &str = "x-aroz-node";
pub const HEADER_CLUSTER: &str = "x-aroz-cluster";
pub const HEADER_TIMESTAMP: &str = "x-aroz-timestamp";
pub const HEADER_NONCE: &str = "x-aroz-nonce";
pub const HEADER_SIGNATURE: &str = "x-aroz-signature";

/// Largest accepted ACN body (reference: 64 MiB, answered 413).
pub const BODY_MAX_BYTES: usize = 64 * 1024 * 1024;
pub const CLOCK_SKEW_MAX_MS: u64 = 300_000;
pub const NONCE_TTL_MS: u64 = 600_000;
/// The largest clock offset of a peer this node will allow for.
pub const PEER_OFFSET_MAX_MS: i64 = 600_000;
/// Hard bound on remembered nonces; past it (after a purge) requests are refused. A nonce is
/// kept up to 15 minutes (the clock window and the largest peer offset), so the bound is what a
/// node receiving 4,400 signed requests a second holds; at about 30 bytes a nonce, 120 MB.
/// (It was 1,000,000 at over 200 bytes a nonce: a leader taking one client's writes, 1,500 signed
/// submits a second, filled it in 11 minutes and then refused every signed request.)
pub const NONCE_CACHE_MAX: usize = 4_000_000;

/// The five signed headers of an ACN request, as strings exactly as sent.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SignedHeaders {
    pub node: String,
    pub cluster: String,
    pub timestamp: String,
    pub nonce: String,
    pub signature: String,
}

impl SignedHeaders {
    /// Header name/value pairs, for the shell to put on the wire.
    pub fn pairs(&self) -> [(&'static str, &str); 5] {
        [
            (HEADER_NODE, &self.node),
            (HEADER_CLUSTER, &self.cluster),
            (HEADER_TIMESTAMP, &self.timestamp),
            (HEADER_NONCE, &self.nonce),
            (HEADER_SIGNATURE, &self.signature),
        ]
    }

    /// Collect from a header lookup; `None` when any of the five is missing.
    pub fn from_lookup<'a>(mut get: impl FnMut(&str) -> Option<&'a str>) -> Option<SignedHeaders> {
        Some(SignedHeaders {
            node: get(HEADER_NODE)?.to_string(),
            cluster: get(HEADER_CLUSTER)?.to_string(),
            timestamp: get(HEADER_TIMESTAMP)?.to_string(),
            nonce: get(HEADER_NONCE)?.to_string(),
            signature: get(HEADER_SIGNATURE)?.to_string(),
        })
    }
}

/// `METHOD\ntarget\ncluster\nnode\nts\nnonce\nhex(sha256(body))`, no trailing newline. The target
/// is the path plus `?rawQuery` when the query is not empty.
pub fn canonical_string(
    method: &str,
    target: &str,
    cluster: &str,
    node: &str,
    timestamp: &str,
    nonce: &str,
    body: &[u8],
) -> String {
    canonical_string_with_hash(method, target, cluster, node, timestamp, nonce, &hex::encode(Sha256::digest(body)))
}

/// [`canonical_string`] with the body's SHA-256 (hex) already computed by the caller, who
/// must have hashed the very bytes sent or received (a chunk's SHA-256 is its body hash, so
/// a chunk is hashed once, not twice, on each side).
pub fn canonical_string_with_hash(
    method: &str,
    target: &str,
    cluster: &str,
    node: &str,
    timestamp: &str,
    nonce: &str,
    body_hash: &str,
) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}",
        method.to_ascii_uppercase(),
        target,
        cluster,
        node,
        timestamp,
        nonce,
        body_hash
    )
}

/// Sign a request as `node` of `cluster` at `now`.
#[allow(clippy::too_many_arguments)]
pub fn sign_request(
    key: &SigningKey,
    node: &NodeId,
    cluster: &ClusterId,
    method: &str,
    target: &str,
    body: &[u8],
    now: Millis,
    rng: &mut SeededRng,
) -> SignedHeaders {
    sign_request_hashed(key, node, cluster, method, target, &hex::encode(Sha256::digest(body)), now, rng)
}

/// [`sign_request`] with the body's SHA-256 (hex) computed by the caller.
#[allow(clippy::too_many_arguments)]
pub fn sign_request_hashed(
    key: &SigningKey,
    node: &NodeId,
    cluster: &ClusterId,
    method: &str,
    target: &str,
    body_hash: &str,
    now: Millis,
    rng: &mut SeededRng,
) -> SignedHeaders {
    let (timestamp, nonce) = (now.as_secs().to_string(), rng.hex(16));
    signed_headers(key, node.as_str(), cluster.as_str(), timestamp, nonce, method, target, body_hash)
}

#[allow(clippy::too_many_arguments)]
fn signed_headers(
    key: &SigningKey,
    node: &str,
    cluster: &str,
    timestamp: String,
    nonce: String,
    method: &str,
    target: &str,
    body_hash: &str,
) -> SignedHeaders {
    let canon = canonical_string_with_hash(method, target, cluster, node, &timestamp, &nonce, body_hash);
    let sig = key.sign(canon.as_bytes());
    SignedHeaders {
        node: node.to_string(),
        cluster: cluster.to_string(),
        timestamp,
        nonce,
        signature: STANDARD.encode(sig.to_bytes()),
    }
}

/// A request's signature decided but not computed yet: who signs, for which cluster, its
/// timestamp and its nonce (drawn from the node's seeded RNG where the request is made, so a
/// simulated run replays). The Ed25519 signature itself, tens of µs, is computed by
/// [`PendingSignature::headers`] wherever the request is carried (the shell, off the node's
/// lock), over the body it sends; it is the same signature [`sign_request`] makes.
#[derive(Clone, PartialEq, Eq)]
pub struct PendingSignature {
    key: Arc<SigningKey>,
    node: NodeId,
    cluster: ClusterId,
    timestamp: String,
    nonce: String,
}

impl std::fmt::Debug for PendingSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key material in logs.
        f.debug_struct("PendingSignature")
            .field("node", &self.node)
            .field("cluster", &self.cluster)
            .field("timestamp", &self.timestamp)
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

impl PendingSignature {
    /// Sign as `node` of `cluster` at `now`, with a nonce drawn from `rng` now.
    pub fn new(key: Arc<SigningKey>, node: NodeId, cluster: ClusterId, now: Millis, rng: &mut SeededRng) -> Self {
        PendingSignature { key, node, cluster, timestamp: now.as_secs().to_string(), nonce: rng.hex(16) }
    }

    /// The signed headers of `method target` with `body`.
    pub fn headers(&self, method: &str, target: &str, body: &[u8]) -> SignedHeaders {
        self.headers_hashed(method, target, &hex::encode(Sha256::digest(body)))
    }

    /// [`PendingSignature::headers`] for a body whose SHA-256 (hex) the caller computed.
    pub fn headers_hashed(&self, method: &str, target: &str, body_hash: &str) -> SignedHeaders {
        let (ts, nonce) = (self.timestamp.clone(), self.nonce.clone());
        signed_headers(&self.key, self.node.as_str(), self.cluster.as_str(), ts, nonce, method, target, body_hash)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcnError {
    #[error("request is not signed")]
    NotSigned,
    #[error("request is for another cluster")]
    WrongCluster,
    #[error("request timestamp is more than 300 s away from this node's clock")]
    ClockSkew,
    #[error("sender is not a member of this cluster")]
    UnknownNode,
    #[error("signature does not verify")]
    BadSignature,
    #[error("nonce was already used (replay)")]
    Replay,
    #[error("replay cache is full; try again later")]
    ReplayCacheFull,
    #[error("request body is larger than 64 MiB")]
    BodyTooLarge,
}

impl From<AcnError> for crate::answer::ApiError {
    fn from(e: AcnError) -> crate::answer::ApiError {
        crate::answer::ApiError::new(e.kind(), e.code(), e.to_string())
    }
}

impl AcnError {
    /// What kind of refusal this is (the shell answers 413, 503 or 401).
    pub fn kind(self) -> crate::answer::ErrorKind {
        use crate::answer::ErrorKind;
        match self {
            AcnError::BodyTooLarge => ErrorKind::TooLarge,
            AcnError::ReplayCacheFull => ErrorKind::Unavailable,
            _ => ErrorKind::Unauthorized,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            AcnError::NotSigned => "not_signed",
            AcnError::WrongCluster => "wrong_cluster",
            AcnError::ClockSkew => "clock_skew",
            AcnError::UnknownNode => "unknown_node",
            AcnError::BadSignature => "bad_signature",
            AcnError::Replay => "replay",
            AcnError::ReplayCacheFull => "replay_cache_full",
            AcnError::BodyTooLarge => "body_too_large",
        }
    }
}

/// Decode a standard-base64 Ed25519 public key.
pub fn parse_public_key(b64: &str) -> Option<VerifyingKey> {
    let bytes = STANDARD.decode(b64).ok()?;
    let arr: [u8; 32] = bytes.try_into().ok()?;
    VerifyingKey::from_bytes(&arr).ok()
}

pub fn public_key_b64(key: &VerifyingKey) -> String {
    STANDARD.encode(key.to_bytes())
}

/// Verify a standard-base64 signature over `msg`.
pub fn verify_b64(key: &VerifyingKey, msg: &[u8], sig_b64: &str) -> bool {
    let Ok(bytes) = STANDARD.decode(sig_b64) else { return false };
    let Ok(arr): Result<[u8; 64], _> = bytes.try_into() else { return false };
    key.verify(msg, &Signature::from_bytes(&arr)).is_ok()
}

pub fn sign_b64(key: &SigningKey, msg: &[u8]) -> String {
    STANDARD.encode(key.sign(msg).to_bytes())
}

/// Remembers spent nonces until their request could no longer pass the clock check.
///
/// A nonce is 16 bytes, kept as bytes (not as a `node:nonce` string): grouped by sender and by
/// the second the request was signed in (its `X-Aroz-Timestamp`, which a replay repeats), and
/// each group is forgotten whole once its last nonce expires. So a spend costs a lookup among a
/// sender's few hundred live seconds and one among that second's nonces, both on fixed-size
/// keys, and a remembered nonce about 30 bytes (it was over 200: two copies of a 50-byte string
/// and their index entries). Expired groups are dropped from an expiry-ordered index, so upkeep
/// costs O(log n) per request however full the cache is.
#[derive(Debug, Default)]
pub struct NonceCache {
    /// Spent nonces by sender, then by the second their request was signed in.
    by_sender: BTreeMap<String, BTreeMap<i64, NonceGroup>>,
    /// Every group by the moment it may be forgotten.
    by_expiry: BTreeSet<(Millis, String, i64)>,
    len: usize,
    max_entries: usize,
}

/// The nonces one sender spent in requests signed in one second.
#[derive(Debug)]
struct NonceGroup {
    /// The latest expiry of its nonces (whole seconds, rounded up).
    expires: Millis,
    nonces: BTreeSet<[u8; 16]>,
}

/// A nonce as its 16 bytes; `None` for anything but 32 hex digits.
fn nonce_bytes(nonce: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    hex::decode_to_slice(nonce, &mut out).ok()?;
    Some(out)
}

impl NonceCache {
    pub fn new(max_entries: usize) -> NonceCache {
        NonceCache { max_entries, ..NonceCache::default() }
    }

    /// Nonces remembered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn purge(&mut self, now: Millis) {
        while let Some((expires, _, _)) = self.by_expiry.first() {
            if *expires > now {
                break;
            }
            let (_, node, second) = self.by_expiry.pop_first().expect("checked");
            if let Some(groups) = self.by_sender.get_mut(&node) {
                if let Some(g) = groups.remove(&second) {
                    self.len -= g.nonces.len();
                }
                if groups.is_empty() {
                    self.by_sender.remove(&node);
                }
            }
        }
    }

    /// Spend `nonce` (32 hex digits) of `node`'s request signed at `signed_at` (unix seconds, as
    /// in its timestamp header), keeping it until `expires` (at least [`NONCE_TTL_MS`] from now).
    /// An error if it was spent and is still remembered, if the cache is full of live nonces,
    /// or if `nonce` is not 16 bytes of hex.
    pub fn spend(
        &mut self,
        now: Millis,
        node: &str,
        signed_at: i64,
        nonce: &str,
        expires: Millis,
    ) -> Result<(), AcnError> {
        let bytes = nonce_bytes(nonce).ok_or(AcnError::NotSigned)?;
        // Whole seconds, so a group's expiry moves at most once a second.
        let expires = expires.max(now.plus(NONCE_TTL_MS)).0.div_ceil(1000).saturating_mul(1000);
        let expires = Millis(expires);
        self.purge(now);
        let group = self.by_sender.get(node).and_then(|groups| groups.get(&signed_at));
        if group.is_some_and(|g| g.nonces.contains(&bytes)) {
            return Err(AcnError::Replay);
        }
        if self.len >= self.max_entries {
            return Err(AcnError::ReplayCacheFull);
        }
        if !self.by_sender.contains_key(node) {
            self.by_sender.insert(node.to_string(), BTreeMap::new());
        }
        let groups = self.by_sender.get_mut(node).expect("inserted above");
        let group =
            groups.entry(signed_at).or_insert_with(|| NonceGroup { expires: Millis(0), nonces: BTreeSet::new() });
        if expires > group.expires {
            if group.expires != Millis(0) {
                self.by_expiry.remove(&(group.expires, node.to_string(), signed_at));
            }
            group.expires = expires;
            self.by_expiry.insert((expires, node.to_string(), signed_at));
        }
        group.nonces.insert(bytes);
        self.len += 1;
        Ok(())
    }
}

/// Verifies incoming ACN requests against the caller's view of the membership.
#[derive(Debug)]
pub struct Verifier {
    nonces: NonceCache,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier { nonces: NonceCache::new(NONCE_CACHE_MAX) }
    }
}

/// One incoming request as the verifier needs it.
pub struct Incoming<'a> {
    pub headers: Option<&'a SignedHeaders>,
    pub method: &'a str,
    pub target: &'a str,
    pub body: &'a [u8],
}

impl Verifier {
    pub fn with_capacity(max_nonces: usize) -> Verifier {
        Verifier { nonces: NonceCache::new(max_nonces) }
    }

    pub fn nonce_count(&self) -> usize {
        self.nonces.len()
    }

    /// Check `req` in the reference order and return the verified sender. `member_key` looks a
    /// sender up among the live (not removed) members.
    pub fn verify(
        &mut self,
        now: Millis,
        req: &Incoming<'_>,
        cluster: Option<&ClusterId>,
        member_key: impl FnOnce(&NodeId) -> Option<VerifyingKey>,
    ) -> Result<NodeId, AcnError> {
        self.verify_with_offset(now, req, cluster, |_| 0, member_key)
    }

    /// As [`Verifier::verify`], with `peer_offset_ms` giving this node's estimate of how far the
    /// claimed sender's clock is ahead of ours (clamped to ±[`PEER_OFFSET_MAX_MS`]).
    pub fn verify_with_offset(
        &mut self,
        now: Millis,
        req: &Incoming<'_>,
        cluster: Option<&ClusterId>,
        peer_offset_ms: impl FnOnce(&NodeId) -> i64,
        member_key: impl FnOnce(&NodeId) -> Option<VerifyingKey>,
    ) -> Result<NodeId, AcnError> {
        self.verify_hashed(now, req, None, cluster, peer_offset_ms, member_key)
    }

    /// [`Verifier::verify_with_offset`], with the body's SHA-256 (hex) already computed by the
    /// caller from `req.body` when `body_hash` is given.
    pub fn verify_hashed(
        &mut self,
        now: Millis,
        req: &Incoming<'_>,
        body_hash: Option<&str>,
        cluster: Option<&ClusterId>,
        peer_offset_ms: impl FnOnce(&NodeId) -> i64,
        member_key: impl FnOnce(&NodeId) -> Option<VerifyingKey>,
    ) -> Result<NodeId, AcnError> {
        if req.body.len() > BODY_MAX_BYTES {
            return Err(AcnError::BodyTooLarge);
        }
        let h = req.headers.ok_or(AcnError::NotSigned)?;
        if h.node.is_empty() || h.signature.is_empty() || h.nonce.is_empty() || h.timestamp.is_empty() {
            return Err(AcnError::NotSigned);
        }
        // 16 random bytes as hex (reference); anything else is not a nonce we would keep.
        if !crate::ids::is_hex_of_len(&h.nonce, 16) || h.node.len() > 64 || h.signature.len() > 128 {
            return Err(AcnError::NotSigned);
        }
        match cluster {
            Some(c) if c.as_str() == h.cluster => {}
            _ => return Err(AcnError::WrongCluster),
        }
        let ts: i64 = h.timestamp.parse().map_err(|_| AcnError::ClockSkew)?;
        let ts_ms = ts.checked_mul(1000).ok_or(AcnError::ClockSkew)?;
        let ts_ms = i128::from(ts_ms);
        let claimed = NodeId::new(h.node.clone());
        let offset = peer_offset_ms(&claimed).clamp(-PEER_OFFSET_MAX_MS, PEER_OFFSET_MAX_MS);
        let expected_ms = i128::from(now.0) + i128::from(offset);
        if (ts_ms - expected_ms).unsigned_abs() > u128::from(CLOCK_SKEW_MAX_MS) {
            return Err(AcnError::ClockSkew);
        }
        let node = claimed;
        let key = member_key(&node).ok_or(AcnError::UnknownNode)?;
        let canon = match body_hash {
            Some(hash) => {
                canonical_string_with_hash(req.method, req.target, &h.cluster, &h.node, &h.timestamp, &h.nonce, hash)
            }
            None => canonical_string(req.method, req.target, &h.cluster, &h.node, &h.timestamp, &h.nonce, req.body),
        };
        if !verify_b64(&key, canon.as_bytes(), &h.signature) {
            return Err(AcnError::BadSignature);
        }
        let last_acceptable = ts_ms + i128::from(CLOCK_SKEW_MAX_MS) + i128::from(PEER_OFFSET_MAX_MS);
        let last_acceptable = last_acceptable.clamp(0, i128::from(u64::MAX)) as u64;
        self.nonces.spend(now, &h.node, ts, &h.nonce, Millis(last_acceptable))?;
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        key: SigningKey,
        node: NodeId,
        cluster: ClusterId,
        rng: SeededRng,
        verifier: Verifier,
    }

    const NOW: Millis = Millis(1_700_000_000_000);

    fn fixture() -> Fixture {
        Fixture {
            key: SigningKey::from_bytes(&[7u8; 32]),
            node: NodeId::new("11111111-1111-4111-8111-111111111111"),
            cluster: ClusterId::new("22222222-2222-4222-8222-222222222222"),
            rng: SeededRng::new(3),
            verifier: Verifier::default(),
        }
    }

    impl Fixture {
        fn sign(&mut self, method: &str, target: &str, body: &[u8], at: Millis) -> SignedHeaders {
            sign_request(&self.key, &self.node, &self.cluster, method, target, body, at, &mut self.rng)
        }
        fn check(
            &mut self,
            h: Option<&SignedHeaders>,
            method: &str,
            target: &str,
            body: &[u8],
        ) -> Result<NodeId, AcnError> {
            let vk = self.key.verifying_key();
            let me = self.node.clone();
            let cluster = self.cluster.clone();
            self.verifier.verify(NOW, &Incoming { headers: h, method, target, body }, Some(&cluster), |n| {
                (n == &me).then_some(vk)
            })
        }
    }

    #[test]
    fn canonical_string_matches_the_reference_layout() {
        let s = canonical_string("post", "/cluster/acn/ping?x=1", "c", "n", "17", "ab", b"");
        assert_eq!(
            s,
            "POST\n/cluster/acn/ping?x=1\nc\nn\n17\nab\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_well_signed_request_verifies_once() {
        let mut f = fixture();
        let h = f.sign("POST", "/cluster/acn/ping", b"{}", NOW);
        assert_eq!(f.check(Some(&h), "POST", "/cluster/acn/ping", b"{}"), Ok(f.node.clone()));
        assert_eq!(f.check(Some(&h), "POST", "/cluster/acn/ping", b"{}"), Err(AcnError::Replay));
    }

    /// A signature decided at one point and computed later is the one `sign_request` makes
    /// with the same RNG state (same nonce, same timestamp), verifies, and names no key when
    /// printed.
    #[test]
    fn a_pending_signature_computes_what_sign_request_would() {
        let mut f = fixture();
        let mut twin = SeededRng::new(42);
        f.rng = SeededRng::new(42);
        let pending = PendingSignature::new(Arc::new(f.key.clone()), f.node.clone(), f.cluster.clone(), NOW, &mut twin);
        let now_signed = f.sign("POST", "/cluster/acn/meta/submit", b"{\"a\":1}", NOW);
        let later = pending.headers("POST", "/cluster/acn/meta/submit", b"{\"a\":1}");
        assert_eq!(later, now_signed);
        assert_eq!(f.check(Some(&later), "POST", "/cluster/acn/meta/submit", b"{\"a\":1}"), Ok(f.node.clone()));
        let other_body = pending.headers("POST", "/cluster/acn/meta/submit", b"{}");
        assert_ne!(other_body.signature, later.signature, "the body is signed");
        assert!(!format!("{pending:?}").contains("key"), "no key material printed: {pending:?}");
    }

    #[test]
    fn unsigned_request_is_refused() {
        let mut f = fixture();
        assert_eq!(f.check(None, "POST", "/x", b""), Err(AcnError::NotSigned));
        let mut h = f.sign("POST", "/x", b"", NOW);
        h.signature.clear();
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::NotSigned));
    }

    #[test]
    fn other_cluster_is_refused_before_anything_else() {
        let mut f = fixture();
        let mut h = f.sign("POST", "/x", b"", NOW);
        h.cluster = "33333333-3333-4333-8333-333333333333".into();
        h.timestamp = "0".into();
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::WrongCluster));
    }

    #[test]
    fn six_minute_old_timestamp_is_clock_skew() {
        let mut f = fixture();
        let h = f.sign("POST", "/x", b"", Millis(NOW.0 - 360_000));
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::ClockSkew));
        let h = f.sign("POST", "/x", b"", Millis(NOW.0 + 360_000));
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::ClockSkew));
        let h = f.sign("POST", "/x", b"", Millis(NOW.0 - 240_000));
        assert!(f.check(Some(&h), "POST", "/x", b"").is_ok());
    }

    #[test]
    fn unknown_node_is_refused() {
        let mut f = fixture();
        let mut h = f.sign("POST", "/x", b"", NOW);
        h.node = "99999999-9999-4999-8999-999999999999".into();
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::UnknownNode));
    }

    #[test]
    fn changed_body_path_query_or_method_fail_the_signature() {
        let mut f = fixture();
        let h = f.sign("POST", "/cluster/acn/ping?a=1", b"body", NOW);
        assert_eq!(f.check(Some(&h), "POST", "/cluster/acn/ping?a=1", b"bodz"), Err(AcnError::BadSignature));
        assert_eq!(f.check(Some(&h), "POST", "/cluster/acn/pong?a=1", b"body"), Err(AcnError::BadSignature));
        assert_eq!(f.check(Some(&h), "POST", "/cluster/acn/ping?a=2", b"body"), Err(AcnError::BadSignature));
        assert_eq!(f.check(Some(&h), "GET", "/cluster/acn/ping?a=1", b"body"), Err(AcnError::BadSignature));
        // None of those spent the nonce: the genuine request still goes through.
        assert!(f.check(Some(&h), "POST", "/cluster/acn/ping?a=1", b"body").is_ok());
    }

    #[test]
    fn bad_signature_does_not_spend_the_nonce() {
        let mut f = fixture();
        let good = f.sign("POST", "/x", b"", NOW);
        let mut forged = good.clone();
        forged.signature = sign_b64(&SigningKey::from_bytes(&[9u8; 32]), b"whatever");
        assert_eq!(f.check(Some(&forged), "POST", "/x", b""), Err(AcnError::BadSignature));
        assert_eq!(f.verifier.nonce_count(), 0);
        assert!(f.check(Some(&good), "POST", "/x", b"").is_ok());
    }

    #[test]
    fn nonces_expire_after_600_s_and_the_cache_is_bounded() {
        let (a, b, c_, d) = ("0a".repeat(16), "0b".repeat(16), "0c".repeat(16), "0d".repeat(16));
        let mut c = NonceCache::new(3);
        let spend = |c: &mut NonceCache, at: u64, n: &str| c.spend(Millis(at), "n", 0, n, Millis(at));
        spend(&mut c, 0, &a).unwrap();
        assert_eq!(spend(&mut c, 599_000, &a), Err(AcnError::Replay));
        assert!(spend(&mut c, 600_001, &a).is_ok());
        spend(&mut c, 600_002, &b).unwrap();
        spend(&mut c, 600_003, &c_).unwrap();
        assert_eq!(spend(&mut c, 600_004, &d), Err(AcnError::ReplayCacheFull));
        assert_eq!(c.len(), 3);
        // A group is kept until its latest nonce expires (1,201 s, rounded up to the second).
        assert_eq!(spend(&mut c, 1_200_999, &d), Err(AcnError::ReplayCacheFull));
        assert!(spend(&mut c, 1_201_000, &d).is_ok());
        assert_eq!(c.len(), 1);
        assert_eq!(spend(&mut c, 0, "not hex"), Err(AcnError::NotSigned));
    }

    #[test]
    fn a_nonce_is_one_senders_in_one_signed_second() {
        let n = "5e".repeat(16);
        let mut c = NonceCache::new(100);
        c.spend(Millis(0), "a", 10, &n, Millis(0)).unwrap();
        // The same nonce from another sender, or signed in another second, is another request.
        c.spend(Millis(0), "b", 10, &n, Millis(0)).unwrap();
        c.spend(Millis(0), "a", 11, &n, Millis(0)).unwrap();
        assert_eq!(c.spend(Millis(5), "a", 10, &n, Millis(0)), Err(AcnError::Replay));
        assert_eq!(c.spend(Millis(5), "b", 10, &n.to_uppercase(), Millis(0)), Err(AcnError::Replay));
        assert_eq!(c.len(), 3);
        // Kept until the later of its expiries: a late spend in the group keeps it longer.
        let m = "6f".repeat(16);
        c.spend(Millis(400_000), "a", 10, &m, Millis(0)).unwrap();
        assert_eq!(c.spend(Millis(900_000), "a", 10, &n, Millis(0)), Err(AcnError::Replay));
        assert_eq!(c.spend(Millis(900_000), "b", 10, &n, Millis(0)), Ok(()));
        assert_eq!(c.len(), 3);
        assert_eq!(c.spend(Millis(1_000_000), "a", 10, &m, Millis(0)), Ok(()));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn the_window_follows_the_senders_known_clock_offset() {
        let mut f = fixture();
        // The sender runs 8 minutes ahead: refused without an estimate, accepted with one.
        let h = f.sign("POST", "/x", b"", Millis(NOW.0 + 480_000));
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::ClockSkew));
        let vk = f.key.verifying_key();
        let cluster = f.cluster.clone();
        let verify = |v: &mut Verifier, at: Millis, off: i64| {
            v.verify_with_offset(
                at,
                &Incoming { headers: Some(&h), method: "POST", target: "/x", body: b"" },
                Some(&cluster),
                |_| off,
                |_| Some(vk),
            )
        };
        assert!(verify(&mut f.verifier, NOW, 480_000).is_ok());
        // Replaying it later is refused, even if the estimate moves to the far end of its range.
        assert_eq!(verify(&mut f.verifier, Millis(NOW.0 + 600_000), -120_000), Err(AcnError::Replay));
        // Offsets beyond the cap are not honoured.
        let h2 = f.sign("POST", "/x", b"", Millis(NOW.0 + 1_200_000));
        let r = f.verifier.verify_with_offset(
            NOW,
            &Incoming { headers: Some(&h2), method: "POST", target: "/x", body: b"" },
            Some(&cluster),
            |_| 1_200_000,
            |_| Some(vk),
        );
        assert_eq!(r, Err(AcnError::ClockSkew));
    }

    #[test]
    fn malformed_nonces_and_absurd_timestamps_are_refused_without_panicking() {
        let mut f = fixture();
        let mut h = f.sign("POST", "/x", b"", NOW);
        h.nonce = "a".repeat(100_000);
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::NotSigned));
        let mut h = f.sign("POST", "/x", b"", NOW);
        h.timestamp = "-9223372036854775".into();
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::ClockSkew));
        h.timestamp = i64::MAX.to_string();
        assert_eq!(f.check(Some(&h), "POST", "/x", b""), Err(AcnError::ClockSkew));
        assert_eq!(f.verifier.nonce_count(), 0);
    }

    #[test]
    fn oversize_body_is_413() {
        let mut f = fixture();
        let big = vec![0u8; BODY_MAX_BYTES + 1];
        let r = f.check(None, "POST", "/x", &big);
        assert_eq!(r, Err(AcnError::BodyTooLarge));
        assert_eq!(AcnError::BodyTooLarge.kind(), crate::answer::ErrorKind::TooLarge);
    }
}
