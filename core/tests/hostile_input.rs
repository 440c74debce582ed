//! Issue 17 "Hostile input": property tests that feed arbitrary and mutated bytes and strings to
//! every parser and decoder of `shoal-core` that a peer, a client or the disk can reach, and check
//! that each answers a typed error or a valid value (never a panic), and that what has an encoder
//! round-trips (encode → parse gives the same value; a mutated encoding is refused or decodes to
//! something that re-encodes consistently).
//!
//! Covered:
//! - ACN (`acn.rs`): `SignedHeaders::from_lookup`, `canonical_string`,
//!   `canonical_string_with_hash`, `parse_public_key` / `public_key_b64`, `verify_b64`, and
//!   `Verifier::verify` / `verify_with_offset` with garbage headers, arbitrary timestamps
//!   (huge, negative, non-numeric) and mutated signed requests; `NonceCache::spend`.
//! - Join tokens (`token.rs`): `JoinToken::parse` / `encode`, `base_url_error`,
//!   `valid_base_url`, `ip_allowed`.
//! - Config (`config/`): `parse_duration_ms`, `parse_bytes`, `parse_value` / `validate`
//!   against every built-in declaration (`builtin::manifests`, `builtin::predefined`),
//!   `Level::parse` / `Level::name`, `level_of`, `check_manifest` on arbitrary manifests.
//! - Paths (`meta/path.rs`, `meta/namespace.rs`): `normalize` (traversal spellings `..`,
//!   `%2e%2e`, `\`, NUL, fullwidth and overlong-looking dots, `//`, trailing dots), `is_within`,
//!   `parent`, `name`, `Pattern::parse` / `matches` / `literal_prefix`.
//! - Chunked transfer (`storage/transfer.rs`): `decode_query_value`, `copy_segments`,
//!   `part_file_name`, `check_checksum`, `check_read`, `chunk_count`, `chunk_len`,
//!   `UploadSession::new` / `check_chunk` / `mark` / `missing`.
//! - Records: serde decoding of `meta::records::Record`, `meta::log::Entry`, `Pending`,
//!   `LogMeta`, `Version`, `records::NodeRecord` (owner signature of a mutated record),
//!   `Record::shape_error`, `json_depth`, `json_text_depth`, `AdminState::parse`, `is_uuid`,
//!   `is_hex_of_len`; job submits (`JobSubmit` from arbitrary JSON, `jobs::submit::spec_of`,
//!   `cluster_path`).
//! - The metadata store's peer endpoints (`meta/machine`): `Meta::answer_lease`,
//!   `answer_append`, `answer_submit` (arbitrary and mutated bodies), `answer_log`,
//!   `answer_snapshot` (arbitrary queries).
//! - A node's ACN face (`node/peers.rs`): `Node::handle_acn` with arbitrary targets, methods,
//!   headers and bodies (unsigned, and signed by a member for every endpoint), the unsigned
//!   `join` with mutated join bodies, `Node::precheck_acn`, and `Node::finish_join` with
//!   arbitrary issuer answers.

mod common;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shoal_core::acn::{
    self, canonical_string, canonical_string_with_hash, parse_public_key, public_key_b64, sign_b64, sign_request,
    verify_b64, AcnError, Incoming, NonceCache, SignedHeaders, Verifier,
};
use shoal_core::answer::{ErrorKind, PeerAnswer};
use shoal_core::config::builtin;
use shoal_core::config::resolve::{Level, Manifest};
use shoal_core::config::types::{parse_bytes, parse_duration_ms, parse_value, validate, Declaration, KeyType};
use shoal_core::hlc::{Hlc, Version};
use shoal_core::ids::{is_hex_of_len, is_uuid};
use shoal_core::jobs::submit::{cluster_path, spec_of, JobSubmit, NODES_MAX, SCRIPT_MAX_BYTES};
use shoal_core::meta::lease::Candidate;
use shoal_core::meta::log::{Entry, LogMeta, Pending};
use shoal_core::meta::machine::{Meta, MetaConfig, MetaOutput};
use shoal_core::meta::namespace::Pattern;
use shoal_core::meta::path::{self, normalize, PathError, MAX_PATH_BYTES, MAX_SEGMENT_BYTES};
use shoal_core::meta::records::{
    json_depth, json_text_depth, FileRecord, Location, LocationState, Policy, Record, Setting, Volume,
};
use shoal_core::records::{AdminState, Capabilities, NodeRecord, OwnerFields};
use shoal_core::storage::transfer::{
    self, check_checksum, check_read, chunk_count, chunk_len, copy_segments, decode_query_value, part_file_name,
    TransferError, UploadSession, CHUNK_BYTES, FILE_MAX_BYTES, PART_MARK, READ_MAX_BYTES,
};
use shoal_core::token::{base_url_error, ip_allowed, valid_base_url, JoinToken, TokenError};
use shoal_core::{ClusterId, FileId, LogIndex, Millis, NodeId, SeededRng, Term, TokenId, VolumeId};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

// ---------------------------------------------------------------------------------------------
// Shared strategies and helpers
// ---------------------------------------------------------------------------------------------

/// One edit of an encoding: flip a bit, insert a byte, delete a byte, or overwrite a byte.
#[derive(Clone, Debug)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Set(Index, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
    ]
}

/// One to four edits (never none: a mutated encoding differs from the valid one, or the edits
/// cancel out, which the properties allow for).
fn edits() -> impl Strategy<Value = Vec<Edit>> {
    proptest::collection::vec(edit(), 1..5)
}

fn mutate(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for e in edits {
        match e {
            Edit::Flip(i, bit) if !out.is_empty() => {
                let at = i.index(out.len());
                out[at] ^= 1 << bit;
            }
            Edit::Insert(i, b) => {
                let at = i.index(out.len() + 1);
                out.insert(at, *b);
            }
            Edit::Delete(i) if !out.is_empty() => {
                let at = i.index(out.len());
                out.remove(at);
            }
            Edit::Set(i, b) if !out.is_empty() => {
                let at = i.index(out.len());
                out[at] = *b;
            }
            _ => {}
        }
    }
    out
}

/// A mutated string, as a parser of `&str` would see it (invalid UTF-8 replaced, as the shell's
/// lossy decoding of a header or a query does).
fn mutate_str(s: &str, edits: &[Edit]) -> String {
    String::from_utf8_lossy(&mutate(s.as_bytes(), edits)).into_owned()
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Any JSON value, nested a few levels, with numbers that print and parse back exactly.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![Just(0.5), Just(-1.25), Just(1e3), Just(3.0), Just(0.1)].prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
        // Strings an operator or a peer might send for the config plane's types.
        prop_oneof![
            Just("15s"),
            Just("500ms"),
            Just("2m"),
            Just("1h"),
            Just("7d"),
            Just("64MiB"),
            Just("1GB"),
            Just("4096"),
            Just("true"),
            Just("off"),
            Just("-3"),
            Just("1e309"),
            Just("NaN"),
            Just("inf"),
            Just("a,b,c"),
            Just("[\"x\",\"y\"]"),
            Just(" 0.25 "),
            Just("18446744073709551616"),
            Just("99999999999999999999d"),
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON equality with numbers compared as numbers (a float that went through text twice may
/// differ in its last bit with serde_json's default float parser).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_u64(), y.as_u64(), x.as_i64(), y.as_i64()) {
            (Some(p), Some(q), _, _) => p == q,
            (_, _, Some(p), Some(q)) => p == q,
            _ => {
                let (p, q) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
                p == q || (p - q).abs() <= 1e-12 * p.abs().max(q.abs())
            }
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn sha_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn uuid_of(seed: u64) -> String {
    let h = hex::encode(Sha256::digest(seed.to_le_bytes()));
    format!("{}-{}-4{}-8{}-{}", &h[0..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

fn version(wall_ms: u64, counter: u32, node: &str) -> Version {
    Version { wall_ms, counter, node: NodeId::new(node) }
}

// ---------------------------------------------------------------------------------------------
// ACN: signed headers, the canonical string, keys, signatures, nonces, timestamps
// ---------------------------------------------------------------------------------------------

const NOW: Millis = Millis(1_700_000_000_000);
const NODE: &str = "11111111-1111-4111-8111-111111111111";
const CLUSTER: &str = "22222222-2222-4222-8222-222222222222";

fn acn_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

/// Verify `h` for (method, target, body) at [`NOW`] against a cluster whose only member is
/// [`NODE`] with [`acn_key`].
fn acn_check(
    v: &mut Verifier,
    h: Option<&SignedHeaders>,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<NodeId, AcnError> {
    let vk = acn_key().verifying_key();
    let cluster = ClusterId::new(CLUSTER);
    v.verify(NOW, &Incoming { headers: h, method, target, body }, Some(&cluster), |n| {
        (n.as_str() == NODE).then_some(vk)
    })
}

fn signed_at(method: &str, target: &str, body: &[u8], at: Millis, seed: u64) -> SignedHeaders {
    sign_request(
        &acn_key(),
        &NodeId::new(NODE),
        &ClusterId::new(CLUSTER),
        method,
        target,
        body,
        at,
        &mut SeededRng::new(seed),
    )
}

/// Header values a hostile peer might send.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,40}",
        "[0-9a-f]{32}",
        "-?[0-9]{1,25}",
        Just(String::new()),
        Just(i64::MAX.to_string()),
        Just(i64::MIN.to_string()),
        Just(u64::MAX.to_string()),
        Just("9223372036854776".to_string()),
        Just("-9223372036854776".to_string()),
        Just("1.7e9".to_string()),
        Just(" 1700000000".to_string()),
        Just("+1700000000".to_string()),
        "[A-Za-z0-9+/=]{0,100}",
    ]
}

/// A mutation of one part of a signed request.
#[derive(Clone, Debug)]
enum RequestEdit {
    Method(Vec<Edit>),
    Target(Vec<Edit>),
    Body(Vec<Edit>),
    Node(Vec<Edit>),
    Cluster(Vec<Edit>),
    Timestamp(Vec<Edit>),
    Nonce(Vec<Edit>),
    Signature(Vec<Edit>),
    /// Re-encode the signature's bytes with one byte changed (well-formed base64, wrong bytes).
    SignatureByte(Index, u8),
}

fn request_edit() -> impl Strategy<Value = RequestEdit> {
    prop_oneof![
        edits().prop_map(RequestEdit::Method),
        edits().prop_map(RequestEdit::Target),
        edits().prop_map(RequestEdit::Body),
        edits().prop_map(RequestEdit::Node),
        edits().prop_map(RequestEdit::Cluster),
        edits().prop_map(RequestEdit::Timestamp),
        edits().prop_map(RequestEdit::Nonce),
        edits().prop_map(RequestEdit::Signature),
        (any::<Index>(), 1u8..=255).prop_map(|(i, x)| RequestEdit::SignatureByte(i, x)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// The canonical string is the seven fields joined by `\n`, the method upper-cased and the
    /// body's SHA-256 last; with a hash given, the same string.
    #[test]
    fn canonical_string_is_the_fields_in_order(
        method in "[^\n]{0,10}", target in "[^\n]{0,60}", cluster in "[^\n]{0,40}", node in "[^\n]{0,40}",
        ts in "[^\n]{0,20}", nonce in "[^\n]{0,40}", body in bytes(256),
    ) {
        let s = canonical_string(&method, &target, &cluster, &node, &ts, &nonce, &body);
        let parts: Vec<&str> = s.split('\n').collect();
        prop_assert_eq!(parts.len(), 7);
        let upper = method.to_ascii_uppercase();
        prop_assert_eq!(parts[0], upper.as_str());
        prop_assert_eq!(&parts[1..6], &[target.as_str(), cluster.as_str(), node.as_str(), ts.as_str(), nonce.as_str()][..]);
        let hash = sha_hex(&body);
        prop_assert_eq!(parts[6], hash.as_str());
        prop_assert_eq!(canonical_string_with_hash(&method, &target, &cluster, &node, &ts, &nonce, &hash), s);
    }

    /// Headers collected from a lookup are exactly the values found, or none at all when any of
    /// the five is missing.
    #[test]
    fn signed_headers_come_whole_or_not_at_all(values in proptest::collection::vec(proptest::option::of(header_value()), 5)) {
        let names = [acn::HEADER_NODE, acn::HEADER_CLUSTER, acn::HEADER_TIMESTAMP, acn::HEADER_NONCE, acn::HEADER_SIGNATURE];
        let got = SignedHeaders::from_lookup(|n| {
            names.iter().position(|x| *x == n).and_then(|i| values[i].as_deref())
        });
        match got {
            Some(h) => {
                prop_assert!(values.iter().all(Option::is_some));
                let pairs = h.pairs();
                for (i, (name, value)) in pairs.iter().enumerate() {
                    prop_assert_eq!(*name, names[i]);
                    prop_assert_eq!(Some(*value), values[i].as_deref());
                }
            }
            None => prop_assert!(values.iter().any(Option::is_none)),
        }
    }

    /// A public key parses only from the canonical base64 of 32 bytes that are a point; a parsed
    /// key prints back as the very text it came from.
    #[test]
    fn public_keys_parse_only_from_their_own_encoding(s in prop_oneof!["\\PC{0,60}", "[A-Za-z0-9+/]{43}=", "[A-Za-z0-9+/=]{40,48}"]) {
        match parse_public_key(&s) {
            Some(k) => prop_assert_eq!(public_key_b64(&k), s),
            None => {
                let decoded = STANDARD.decode(&s);
                prop_assert!(decoded.as_ref().map_or(true, |b| b.len() != 32 || ed25519_dalek::VerifyingKey::from_bytes(b[..].try_into().unwrap()).is_err()));
            }
        }
    }

    /// A real key round-trips; a mutated encoding of it is refused or is another key whose
    /// encoding is the mutated text.
    #[test]
    fn mutated_public_keys_are_refused_or_another_key(seed in any::<[u8; 32]>(), e in edits()) {
        let vk = SigningKey::from_bytes(&seed).verifying_key();
        let text = public_key_b64(&vk);
        prop_assert_eq!(parse_public_key(&text), Some(vk));
        let bad = mutate_str(&text, &e);
        if let Some(k) = parse_public_key(&bad) {
            prop_assert_eq!(public_key_b64(&k), bad.clone());
            prop_assert!(k != vk || bad == text);
        }
    }

    /// Garbage never verifies as a signature, and a mutated real signature neither.
    #[test]
    fn garbage_and_mutated_signatures_do_not_verify(msg in bytes(128), garbage in "\\PC{0,100}", e in edits()) {
        let key = acn_key();
        let vk = key.verifying_key();
        prop_assert!(!verify_b64(&vk, &msg, &garbage) || garbage == sign_b64(&key, &msg));
        let sig = sign_b64(&key, &msg);
        prop_assert!(verify_b64(&vk, &msg, &sig));
        let bad = mutate_str(&sig, &e);
        prop_assert_eq!(verify_b64(&vk, &msg, &bad), bad == sig);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary header values are refused with a typed error (they cannot carry a valid
    /// signature) and never touch the nonce cache.
    #[test]
    fn garbage_headers_are_refused(
        node in header_value(), cluster in header_value(), timestamp in header_value(),
        nonce in header_value(), signature in header_value(), body in bytes(64), target in "\\PC{0,40}",
    ) {
        let mut v = Verifier::default();
        let h = SignedHeaders { node, cluster, timestamp, nonce, signature };
        let r = acn_check(&mut v, Some(&h), "POST", &target, &body);
        prop_assert!(r.is_err(), "{:?}", r);
        prop_assert_eq!(v.nonce_count(), 0);
        // The same headers with this cluster and node, the rest garbage: still refused.
        let h = SignedHeaders { node: NODE.into(), cluster: CLUSTER.into(), ..h };
        let r = acn_check(&mut v, Some(&h), "POST", &target, &body);
        prop_assert!(r.is_err(), "{:?}", r);
        prop_assert_eq!(v.nonce_count(), 0);
    }

    /// A request correctly signed over any timestamp text is accepted exactly when that text is
    /// an integer of seconds within 300 s of the receiver's clock; otherwise it is clock skew.
    #[test]
    fn any_signed_timestamp_is_judged_by_its_value(
        ts in prop_oneof![
            header_value(),
            (-400i64..400).prop_map(|d| (NOW.as_secs() as i64 + d).to_string()),
            any::<i64>().prop_map(|x| x.to_string()),
        ],
        nonce_seed in any::<u64>(),
    ) {
        let nonce = SeededRng::new(nonce_seed).hex(16);
        let canon = canonical_string("POST", "/cluster/acn/ping", CLUSTER, NODE, &ts, &nonce, b"");
        let h = SignedHeaders {
            node: NODE.into(),
            cluster: CLUSTER.into(),
            timestamp: ts.clone(),
            nonce,
            signature: sign_b64(&acn_key(), canon.as_bytes()),
        };
        let mut v = Verifier::default();
        let r = acn_check(&mut v, Some(&h), "POST", "/cluster/acn/ping", b"");
        let within = ts.parse::<i64>().ok().and_then(|s| s.checked_mul(1000)).is_some_and(|ms| {
            (i128::from(ms) - i128::from(NOW.0)).unsigned_abs() <= u128::from(acn::CLOCK_SKEW_MAX_MS)
        });
        if ts.is_empty() {
            prop_assert_eq!(r, Err(AcnError::NotSigned));
        } else if within {
            prop_assert_eq!(r, Ok(NodeId::new(NODE)));
            prop_assert_eq!(v.nonce_count(), 1);
        } else {
            prop_assert_eq!(r, Err(AcnError::ClockSkew));
            prop_assert_eq!(v.nonce_count(), 0);
        }
    }

    /// Any mutation of a signed request is refused with a typed error, spends no nonce, and the
    /// genuine request still goes through afterwards.
    #[test]
    fn a_mutated_signed_request_is_refused(
        target in "/cluster/acn/[a-z/]{1,20}(\\?[a-z0-9=&%]{0,20})?",
        body in bytes(128),
        seed in any::<u64>(),
        edit in request_edit(),
    ) {
        let h = signed_at("POST", &target, &body, NOW, seed);
        let (mut method, mut target2, mut body2, mut h2) = ("POST".to_string(), target.clone(), body.clone(), h.clone());
        match &edit {
            RequestEdit::Method(e) => method = mutate_str(&method, e),
            RequestEdit::Target(e) => target2 = mutate_str(&target2, e),
            RequestEdit::Body(e) => body2 = mutate(&body2, e),
            RequestEdit::Node(e) => h2.node = mutate_str(&h2.node, e),
            RequestEdit::Cluster(e) => h2.cluster = mutate_str(&h2.cluster, e),
            RequestEdit::Timestamp(e) => h2.timestamp = mutate_str(&h2.timestamp, e),
            RequestEdit::Nonce(e) => h2.nonce = mutate_str(&h2.nonce, e),
            RequestEdit::Signature(e) => h2.signature = mutate_str(&h2.signature, e),
            RequestEdit::SignatureByte(i, x) => {
                let mut sig = STANDARD.decode(&h2.signature).unwrap();
                let at = i.index(sig.len());
                sig[at] ^= x;
                h2.signature = STANDARD.encode(sig);
            }
        }
        let unchanged = method.eq_ignore_ascii_case("POST") && target2 == target && body2 == body
            && h2.node == h.node && h2.cluster == h.cluster && h2.timestamp == h.timestamp
            && h2.signature == h.signature
            // A nonce is hex: changing its letters' case changes the signed text.
            && h2.nonce == h.nonce;
        let mut v = Verifier::default();
        let r = acn_check(&mut v, Some(&h2), &method, &target2, &body2);
        if unchanged {
            prop_assert_eq!(r, Ok(NodeId::new(NODE)));
        } else {
            prop_assert!(r.is_err(), "{:?} accepted", edit);
            prop_assert_eq!(v.nonce_count(), 0);
            prop_assert_eq!(acn_check(&mut v, Some(&h), "POST", &target, &body), Ok(NodeId::new(NODE)));
        }
        // Whatever happened, a replay of the genuine request is refused now.
        prop_assert_eq!(acn_check(&mut v, Some(&h), "POST", &target, &body), Err(AcnError::Replay));
    }

    /// Arbitrary peer clock offsets (clamped) never panic the window arithmetic, and a request
    /// stamped at the receiver's own time passes whatever the offset estimate within 300 s.
    #[test]
    fn peer_offsets_never_break_the_window(offset in any::<i64>(), skew in -1_000_000i64..1_000_000, seed in any::<u64>()) {
        let at = Millis((NOW.0 as i64 + skew) as u64);
        let h = signed_at("POST", "/x", b"", at, seed);
        let vk = acn_key().verifying_key();
        let cluster = ClusterId::new(CLUSTER);
        let mut v = Verifier::default();
        let r = v.verify_with_offset(
            NOW,
            &Incoming { headers: Some(&h), method: "POST", target: "/x", body: b"" },
            Some(&cluster),
            |_| offset,
            |_| Some(vk),
        );
        let clamped = offset.clamp(-acn::PEER_OFFSET_MAX_MS, acn::PEER_OFFSET_MAX_MS);
        let ts_ms = (at.0 / 1000 * 1000) as i128;
        let ok = (ts_ms - (NOW.0 as i128 + clamped as i128)).unsigned_abs() <= acn::CLOCK_SKEW_MAX_MS as u128;
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        if !ok {
            prop_assert_eq!(r, Err(AcnError::ClockSkew));
        }
    }

    /// The nonce cache refuses a second spend within the lifetime, whatever the strings and
    /// however far apart the times, stays within its bound, and takes nothing but 16 bytes of
    /// hex as a nonce.
    #[test]
    fn nonce_cache_is_bounded_and_refuses_replays(
        spends in proptest::collection::vec(
            ("\\PC{0,8}", 0u8..6, -2i64..2, 0u64..2_000_000, proptest::option::of("\\PC{0,40}")),
            1..40,
        ),
    ) {
        let mut c = NonceCache::new(8);
        let mut now = Millis(0);
        for (node, n, second, dt, junk) in spends {
            now = now.plus(dt);
            // A few nonces, so the same one comes back; sometimes a string that is none.
            let nonce = junk.clone().unwrap_or_else(|| format!("{n:032x}"));
            let first = c.spend(now, &node, second, &nonce, now);
            if junk.is_some_and(|j| j.len() != 32 || !j.bytes().all(|b| b.is_ascii_hexdigit())) {
                prop_assert_eq!(first, Err(AcnError::NotSigned));
            } else if first.is_ok() {
                prop_assert_eq!(c.spend(now, &node, second, &nonce, now), Err(AcnError::Replay));
            } else {
                prop_assert!(matches!(first, Err(AcnError::Replay) | Err(AcnError::ReplayCacheFull)));
            }
            prop_assert!(c.len() <= 8);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Join tokens and node URLs
// ---------------------------------------------------------------------------------------------

fn dns_host() -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?", 1..4).prop_map(|l| l.join("."))
}

fn valid_url() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        dns_host(),
        any::<[u8; 4]>()
            .prop_filter("allowed", |o| ip_allowed(IpAddr::V4(Ipv4Addr::from(*o))))
            .prop_map(|o| Ipv4Addr::from(o).to_string()),
        any::<[u8; 16]>()
            .prop_filter("allowed", |o| ip_allowed(IpAddr::V6(Ipv6Addr::from(*o))))
            .prop_map(|o| format!("[{}]", Ipv6Addr::from(o))),
    ];
    (prop_oneof![Just("http://"), Just("https://")], host, proptest::option::of(1u16..=65535)).prop_map(|(s, h, p)| {
        match p {
            Some(p) => format!("{s}{h}:{p}"),
            None => format!("{s}{h}"),
        }
    })
}

fn join_token() -> impl Strategy<Value = JoinToken> {
    (any::<u64>(), "\\PC{0,60}", valid_url(), "[0-9a-fA-F]{16}", "[0-9a-f]{64}", "[0-9a-f]{64}").prop_map(
        |(c, name, url, t, s, pin)| JoinToken {
            cluster: ClusterId::new(uuid_of(c)),
            name,
            // An https:// issuer is pinned (issue 15); an http:// one is not.
            issuer_pin: if url.starts_with("https://") { pin } else { String::new() },
            issuer_url: url,
            token_id: TokenId::new(t),
            secret: s,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Arbitrary text is not a token; anything that does parse is well-formed and round-trips.
    #[test]
    fn arbitrary_text_is_refused_as_a_token(s in prop_oneof!["\\PC{0,300}", "aroz-join:\\PC{0,300}", "aroz-join:[A-Za-z0-9_-]{0,400}"]) {
        match JoinToken::parse(&s) {
            Ok(t) => {
                prop_assert!(is_uuid(t.cluster.as_str()) && is_hex_of_len(&t.secret, 32) && valid_base_url(&t.issuer_url));
                prop_assert_eq!(JoinToken::parse(&t.encode()), Ok(t));
            }
            Err(e) => {
                if !s.trim().starts_with("aroz-join:") && s.trim().len() <= 4096 {
                    prop_assert_eq!(e, TokenError::MissingPrefix);
                }
            }
        }
    }

    /// Every well-formed token round-trips through its encoding.
    #[test]
    fn tokens_round_trip(t in join_token()) {
        let s = t.encode();
        prop_assert!(s.starts_with("aroz-join:"));
        prop_assert_eq!(JoinToken::parse(&s), Ok(t.clone()));
        // Whitespace around it, as pasted, is fine.
        prop_assert_eq!(JoinToken::parse(&format!("  {s}\n")), Ok(t));
    }

    /// A mutated token (its text, or the JSON inside) is refused with a typed error or parses
    /// to a well-formed token that re-encodes to itself.
    #[test]
    fn mutated_tokens_are_refused_or_well_formed(t in join_token(), e in edits(), inner in any::<bool>()) {
        let s = if inner {
            let json = serde_json::to_vec(&t).unwrap();
            format!("aroz-join:{}", URL_SAFE_NO_PAD.encode(mutate(&json, &e)))
        } else {
            mutate_str(&t.encode(), &e)
        };
        match JoinToken::parse(&s) {
            Ok(p) => {
                prop_assert!(is_uuid(p.cluster.as_str()), "{:?}", p);
                prop_assert!(is_hex_of_len(p.token_id.as_str(), 8) && is_hex_of_len(&p.secret, 32));
                prop_assert_eq!(base_url_error(&p.issuer_url), None);
                prop_assert!(p.name.len() <= 256);
                prop_assert_eq!(JoinToken::parse(&p.encode()), Ok(p));
            }
            Err(err) => prop_assert!(matches!(
                err,
                TokenError::MissingPrefix | TokenError::TooLong | TokenError::NotBase64 | TokenError::BadJson(_) | TokenError::BadField(_)
            )),
        }
    }

    /// A URL `base_url_error` accepts is `http[s]://authority` with no user, path, query or
    /// fragment, no whitespace or control character, and not over 2 KiB.
    #[test]
    fn accepted_urls_are_scheme_and_authority_only(u in prop_oneof![
        "\\PC{0,80}",
        "https?://\\PC{0,60}",
        "https?://[a-z0-9.:\\[\\]%@/?#\\\\ -]{0,40}",
        valid_url(),
    ]) {
        if base_url_error(&u).is_none() {
            prop_assert!(valid_base_url(&u));
            let authority = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://"));
            prop_assert!(authority.is_some(), "{}", u);
            let authority = authority.unwrap();
            prop_assert!(!authority.is_empty() && u.len() <= 2048);
            prop_assert!(!authority.contains(['/', '?', '#', '@', '\\']), "{}", u);
            prop_assert!(!authority.chars().any(|c| c.is_whitespace() || c.is_control()), "{}", u);
        }
    }

    #[test]
    fn generated_node_urls_are_accepted(u in valid_url()) {
        prop_assert_eq!(base_url_error(&u), None, "{}", u);
        // A path, query, fragment or user makes it a URL no node may have.
        for bad in [format!("{u}/"), format!("{u}/x"), format!("{u}?a"), format!("{u}#f")] {
            prop_assert!(base_url_error(&bad).is_some(), "{}", bad);
        }
    }

    /// `ip_allowed` is "not link-local, unspecified or broadcast" (IPv4-mapped addresses as their
    /// IPv4), and a URL naming an address is accepted exactly when the address is.
    #[test]
    fn ip_allowed_matches_its_rule_and_the_url_check(v4 in any::<[u8; 4]>(), v6 in any::<[u8; 16]>(), port in 1u16..=65535, mapped in any::<bool>()) {
        let a = Ipv4Addr::from(v4);
        let want4 = !(v4[0] == 169 && v4[1] == 254) && v4 != [0; 4] && v4 != [255; 4];
        prop_assert_eq!(ip_allowed(IpAddr::V4(a)), want4);
        prop_assert_eq!(base_url_error(&format!("http://{a}:{port}")).is_none(), want4);
        let b = if mapped { a.to_ipv6_mapped() } else { Ipv6Addr::from(v6) };
        let want6 = match b.to_ipv4_mapped() {
            Some(m) => ip_allowed(IpAddr::V4(m)),
            None => (b.segments()[0] & 0xffc0) != 0xfe80 && !b.is_unspecified(),
        };
        prop_assert_eq!(ip_allowed(IpAddr::V6(b)), want6);
        prop_assert_eq!(base_url_error(&format!("https://[{b}]:{port}")).is_none(), want6);
    }
}

// ---------------------------------------------------------------------------------------------
// Config values
// ---------------------------------------------------------------------------------------------

fn every_declaration() -> Vec<Declaration> {
    let mut all = builtin::predefined();
    all.extend(builtin::manifests().into_iter().flat_map(|m| m.keys));
    // Declarations a user module may bring: an enum, a pattern, a list with a pattern.
    let user = |name: &str, ty: KeyType| Declaration {
        name: name.into(),
        ty,
        default: None,
        required: false,
        min: None,
        max: None,
        pattern: None,
        choices: vec![],
        fallback: None,
        trusted: false,
        renamed_from: None,
        doc: String::new(),
    };
    all.push(Declaration {
        choices: vec!["fast".into(), "slow".into(), " odd ".into()],
        ..user("mode", KeyType::Enum)
    });
    all.push(Declaration { pattern: Some("[a-z]+".into()), ..user("word", KeyType::String) });
    all.push(Declaration { pattern: Some("[a-z]+".into()), ..user("words", KeyType::List) });
    all.push(Declaration { pattern: Some("(unclosed".into()), ..user("broken", KeyType::String) });
    all.push(Declaration { min: Some(-5.0), max: Some(5.0), ..user("small", KeyType::Int) });
    all.push(user("flag", KeyType::Bool));
    all.push(user("ratio", KeyType::Float));
    all
}

fn unit_ms() -> impl Strategy<Value = (&'static str, u64)> {
    prop_oneof![
        Just(("", 1)),
        Just(("ms", 1)),
        Just(("s", 1_000)),
        Just(("m", 60_000)),
        Just(("min", 60_000)),
        Just(("h", 3_600_000)),
        Just(("d", 86_400_000)),
    ]
}

fn unit_bytes() -> impl Strategy<Value = (&'static str, u64)> {
    prop_oneof![
        Just(("", 1)),
        Just(("B", 1)),
        Just(("KiB", 1 << 10)),
        Just(("MiB", 1 << 20)),
        Just(("GiB", 1 << 30)),
        Just(("TiB", 1 << 40)),
        Just(("KB", 1_000)),
        Just(("kB", 1_000)),
        Just(("MB", 1_000_000)),
        Just(("GB", 1_000_000_000)),
        Just(("TB", 1_000_000_000_000)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Arbitrary text is a duration only when it is a non-negative number and a known unit; a
    /// whole number with a unit means exactly that many milliseconds.
    #[test]
    fn durations_parse_or_refuse(s in prop_oneof!["\\PC{0,24}", "[0-9.]{0,22}(ms|s|m|min|h|d|x)?", "-?[0-9]{1,25}(\\.[0-9]{0,3})?[a-z ]{0,4}"], n in 0u64..1_000_000, (unit, mult) in unit_ms()) {
        if let Some(ms) = parse_duration_ms(&s) {
            let t = s.trim();
            prop_assert!(t.starts_with(|c: char| c.is_ascii_digit() || c == '.'), "{:?} -> {}", s, ms);
        }
        prop_assert_eq!(parse_duration_ms(&format!("{n}{unit}")), Some(n * mult));
        prop_assert_eq!(parse_duration_ms(&format!(" {n} {unit} ")), Some(n * mult));
        prop_assert_eq!(parse_duration_ms(&format!("-{n}{unit}")), None);
    }

    #[test]
    fn byte_sizes_parse_or_refuse(s in prop_oneof!["\\PC{0,24}", "[0-9.]{0,22}(B|KiB|MiB|GiB|TiB|KB|kB|MB|GB|TB|PB)?", "-?[0-9]{1,25}(\\.[0-9]{0,3})?[A-Za-z ]{0,4}"], n in 0u64..1_000_000, (unit, mult) in unit_bytes()) {
        if let Some(b) = parse_bytes(&s) {
            let t = s.trim();
            prop_assert!(t.starts_with(|c: char| c.is_ascii_digit() || c == '.'), "{:?} -> {}", s, b);
        }
        prop_assert_eq!(parse_bytes(&format!("{n}{unit}")), Some(n * mult));
        prop_assert_eq!(parse_bytes(&format!("-{n}{unit}")), None);
    }

    /// `Level::parse` of any text is a level whose name parses back to it, or nothing; a
    /// level whose node and module hold no dot round-trips through its name.
    #[test]
    fn levels_parse_and_print_back(s in prop_oneof!["\\PC{0,40}", "(mesh|node|module)\\.[a-z.]{0,20}"], node in "[a-z0-9-]{1,12}", module in "[a-z_]{1,8}", key in "[^\\x00]{1,20}") {
        if let Some(l) = Level::parse(&s) {
            prop_assert_eq!(l.name(), s.clone());
            prop_assert_eq!(Level::parse(&l.name()), Some(l.clone()));
        }
        for l in [
            Level::Mesh { key: key.clone() },
            Level::Node { node: NodeId::new(node.clone()), key: key.clone() },
            Level::Module { node: NodeId::new(node.clone()), module: module.clone(), key: key.clone() },
        ] {
            prop_assert_eq!(Level::parse(&l.name()), Some(l));
        }
    }

    /// `level_of` takes any text from a request: a level with a clean key, or a typed error.
    #[test]
    fn level_of_refuses_or_names_a_clean_level(key in "\\PC{0,140}", node in proptest::option::of("\\PC{0,70}"), module in proptest::option::of("\\PC{0,70}")) {
        if let Ok(l) = shoal_core::config::level_of(&key, node.as_deref(), module.as_deref()) {
            let k = l.key();
            prop_assert!(!k.is_empty() && k.len() <= 128 && !k.contains('/'));
            prop_assert!(!k.chars().any(|c| c.is_whitespace() || c.is_control()));
            prop_assert_eq!(Level::parse(&l.name()), Some(l));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any JSON value against every declaration: a typed error, or a value that validates and
    /// parses to itself again (so a stored value never changes on the next read).
    #[test]
    fn parse_value_types_or_refuses_every_declared_key(v in json_value()) {
        for d in every_declaration() {
            match parse_value(&d, &v) {
                Ok(typed) => {
                    prop_assert_eq!(validate(&d, &typed), Ok(()), "{}: {}", d.name, typed);
                    prop_assert_eq!(parse_value(&d, &typed), Ok(typed.clone()), "{} of {}", d.name, v);
                    let shape_ok = match d.ty {
                        KeyType::Bool => typed.is_boolean(),
                        KeyType::Int => typed.is_i64(),
                        KeyType::Float => typed.as_f64().is_some_and(f64::is_finite),
                        KeyType::Duration | KeyType::Bytes => typed.is_u64(),
                        KeyType::String | KeyType::Enum => typed.is_string(),
                        KeyType::List => typed.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                    };
                    prop_assert!(shape_ok, "{} typed {} as {}", d.name, v, typed);
                    if let Some(x) = typed.as_f64() {
                        prop_assert!(d.min.is_none_or(|m| x >= m) && d.max.is_none_or(|m| x <= m));
                    }
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }

    /// A user module's manifest from any JSON: refused, or checked with every default typed.
    #[test]
    fn arbitrary_manifests_are_refused_or_typed(
        module in prop_oneof!["[a-z_-]{1,10}", "\\PC{0,10}", Just("membership".to_string())],
        keys in proptest::collection::vec((
            "[a-z]{1,6}",
            prop_oneof![Just("bool"), Just("int"), Just("float"), Just("string"), Just("duration"), Just("bytes"), Just("enum"), Just("list"), Just("nope")],
            proptest::option::of(json_value()),
            proptest::option::of(prop_oneof![Just("[a-z]+"), Just("(("), Just(".*")]),
            proptest::collection::vec("[a-z]{0,3}", 0..3),
            proptest::option::of(prop_oneof![Just("membership.heartbeat_interval"), Just("nope.nope")]),
        ), 0..4),
    ) {
        let keys: Vec<Value> = keys.into_iter().map(|(name, ty, default, pattern, choices, fallback)| {
            json!({"name": name, "type": ty, "default": default, "pattern": pattern, "choices": choices, "fallback": fallback})
        }).collect();
        let raw = json!({"module": module, "keys": keys});
        let Ok(m) = serde_json::from_value::<Manifest>(raw) else { return Ok(()) };
        let predefined = builtin::predefined();
        if let Ok(checked) = shoal_core::config::check_manifest(&m, &predefined) {
            prop_assert_eq!(checked.keys.len(), m.keys.len());
            for d in &checked.keys {
                if let Some(v) = &d.default {
                    prop_assert_eq!(parse_value(d, v), Ok(v.clone()));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Paths and globs
// ---------------------------------------------------------------------------------------------

/// Segments an attacker would try, joined by separators an attacker would try.
fn hostile_path() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        Just(".."),
        Just("."),
        Just("..."),
        Just(""),
        Just("%2e%2e"),
        Just("%2E%2E%2F"),
        Just("%c0%ae%c0%ae"),
        Just("\u{FF0E}\u{FF0E}"),
        Just("\u{2024}\u{2024}"),
        Just(".\u{0}."),
        Just("\u{0}"),
        Just("a."),
        Just("a.."),
        Just(" .."),
        Just(".. "),
        Just("cluster:"),
        Just("~"),
        Just("a"),
        Just("photos"),
        Just("x y"),
        Just("é"),
        Just("\u{7f}"),
        Just("\u{202e}"),
        Just("*"),
        Just("**"),
        Just("a?b"),
    ];
    let sep = prop_oneof![Just("/"), Just("\\"), Just("//"), Just("/./"), Just("\\..\\")];
    (
        proptest::option::of(prop_oneof![Just("cluster:"), Just("/"), Just("\\"), Just("cluster:/")]),
        proptest::collection::vec((seg, sep), 0..10),
        any::<bool>(),
    )
        .prop_map(|(prefix, parts, trailing)| {
            let mut s = prefix.unwrap_or("").to_string();
            for (seg, sep) in parts {
                s.push_str(seg);
                s.push_str(sep);
            }
            if !trailing {
                s.pop();
            }
            s
        })
}

/// The invariants of a canonical path.
fn assert_canonical(p: &str) -> Result<(), TestCaseError> {
    prop_assert!(p.starts_with('/'), "{:?}", p);
    prop_assert!(p == "/" || !p.ends_with('/'), "{:?}", p);
    prop_assert!(!p.contains('\\') && !p.contains("//"), "{:?}", p);
    prop_assert!(!p.chars().any(char::is_control), "{:?}", p);
    prop_assert!(p.len() <= MAX_PATH_BYTES);
    for s in p.split('/').skip(1) {
        prop_assert!(p == "/" || (!s.is_empty() && s != "." && s != ".."), "{:?}", p);
        prop_assert!(s.len() <= MAX_SEGMENT_BYTES);
    }
    Ok(())
}

fn long_path() -> impl Strategy<Value = String> {
    (1usize..300, 1usize..40).prop_map(|(seg, n)| vec!["x".repeat(seg); n].join("/"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// `normalize` answers a canonical path that normalises to itself, or the typed reason;
    /// the reason is true of the input.
    #[test]
    fn normalize_is_canonical_idempotent_or_refuses(s in prop_oneof!["\\PC{0,80}", ".{0,80}", hostile_path(), long_path()]) {
        match normalize(&s) {
            Ok(p) => {
                assert_canonical(&p)?;
                prop_assert_eq!(normalize(&p), Ok(p.clone()));
                prop_assert!(path::is_within(&p, "/"));
                prop_assert!(!s.chars().any(char::is_control));
                // Prefixed with the drive or written with backslashes: the same path.
                prop_assert_eq!(normalize(&format!("cluster:{p}")), Ok(p.clone()));
                prop_assert_eq!(normalize(&p.replace('/', "\\")), Ok(p.clone()));
                match path::parent(&p) {
                    None => prop_assert_eq!(p.as_str(), "/"),
                    Some(parent) => {
                        prop_assert_eq!(normalize(parent), Ok(parent.to_string()));
                        prop_assert!(path::is_within(&p, parent));
                        let joined = if parent == "/" { format!("/{}", path::name(&p)) } else { format!("{parent}/{}", path::name(&p)) };
                        prop_assert_eq!(joined, p.clone());
                    }
                }
            }
            Err(PathError::Nul { at }) => prop_assert_eq!(s[at..].chars().next(), Some('\0')),
            Err(PathError::Control { code, at }) => {
                let c = s[at..].chars().next().unwrap();
                prop_assert!(c.is_control() && u32::from(c) == code);
            }
            Err(PathError::SegmentTooLong { len }) => prop_assert!(len > MAX_SEGMENT_BYTES && s.len() >= len),
            Err(PathError::TooLong { len }) => prop_assert!(len > MAX_PATH_BYTES),
            // Any other reason (a `..` climbing above the root, where the build refuses one):
            // the input spells a `..` segment.
            #[allow(unreachable_patterns)]
            Err(other) => prop_assert!(s.strip_prefix("cluster:").unwrap_or(&s).split(['/', '\\']).any(|x| x == ".."), "{:?}: {}", s, other),
        }
    }

    /// Percent-decoded first (as a query value is), then normalised: still canonical, and a
    /// copy's segments joined under a volume can never climb out of it.
    #[test]
    fn decoded_traversals_stay_inside(s in hostile_path()) {
        for candidate in [s.clone(), decode_query_value(&s), decode_query_value(&decode_query_value(&s))] {
            if let Ok(p) = normalize(&candidate) {
                assert_canonical(&p)?;
            }
            match copy_segments(&candidate) {
                Ok(segs) => {
                    prop_assert!(!segs.is_empty());
                    for seg in &segs {
                        prop_assert!(!seg.is_empty() && seg != "." && seg != "..", "{:?}", segs);
                        prop_assert!(!seg.contains(['/', '\\', '\0']) && !seg.contains(PART_MARK), "{:?}", segs);
                    }
                }
                Err(e) => prop_assert!(matches!(e, TransferError::Path(_) | TransferError::Root | TransferError::ReservedName)),
            }
        }
    }

    /// A glob parses exactly when its text normalises; what it matches starts with its literal
    /// prefix; a literal glob matches the path itself.
    #[test]
    fn globs_parse_and_match_sanely(pat in prop_oneof!["\\PC{0,40}", hostile_path(), "(/[a-c*?]{0,3}){0,5}"], paths in proptest::collection::vec("(/[a-c]{1,3}){1,5}", 0..8)) {
        match Pattern::parse(&pat) {
            Ok(p) => {
                prop_assert_eq!(Ok(p.as_str().to_string()), normalize(&pat));
                let again = Pattern::parse(p.as_str());
                prop_assert_eq!(again.as_ref(), Ok(&p));
                let prefix = p.literal_prefix();
                if p.is_literal() {
                    prop_assert!(p.as_str() == "/" || p.matches(p.as_str()));
                }
                for path in paths {
                    if p.matches(&path) {
                        prop_assert!(path.starts_with(prefix.as_str()), "{} matches {} but not its prefix {}", p.as_str(), path, prefix);
                    }
                }
            }
            Err(e) => prop_assert_eq!(Err(e), normalize(&pat)),
        }
    }

    /// A glob made from a path by replacing characters with `?`, inserting `*` or ending in
    /// `/**` matches that path.
    #[test]
    fn a_glob_made_from_a_path_matches_it(segs in proptest::collection::vec("[a-zé.]{1,6}", 1..5), holes in proptest::collection::vec(any::<Index>(), 0..4), stars in proptest::collection::vec(any::<Index>(), 0..3)) {
        let path = format!("/{}", segs.join("/"));
        let Ok(path) = normalize(&path) else { return Ok(()) };
        if path == "/" { return Ok(()) }
        let mut chars: Vec<char> = path.chars().collect();
        for h in holes {
            let at = h.index(chars.len());
            if chars[at] != '/' { chars[at] = '?'; }
        }
        for s in stars {
            // After the leading `/`: a `*` before it would be a segment of its own.
            let at = 1 + s.index(chars.len());
            chars.insert(at, '*');
        }
        let glob: String = chars.into_iter().collect();
        let p = Pattern::parse(&glob).unwrap();
        prop_assert!(p.matches(&path), "{} should match {}", glob, path);
        let folders = Pattern::parse("/**").unwrap();
        prop_assert!(folders.matches(&path));
    }
}

// ---------------------------------------------------------------------------------------------
// Chunked transfer: query values, chunk rules, upload sessions, part files
// ---------------------------------------------------------------------------------------------

/// Percent-encode every byte but unreserved ones.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Decoding a percent-encoded value gives the value back; `+` is a space.
    #[test]
    fn query_values_round_trip(s in "\\PC{0,60}") {
        let enc = percent_encode(&s);
        prop_assert_eq!(decode_query_value(&enc), s.clone());
        // Lower-case escapes are the same escapes.
        let lower: String = enc.split('%').enumerate().map(|(i, part)| {
            if i == 0 { part.to_string() } else { format!("%{}{}", part.get(..2).unwrap_or(part).to_ascii_lowercase(), part.get(2..).unwrap_or("")) }
        }).collect();
        prop_assert_eq!(decode_query_value(&lower), s.clone());
        // `+` and `%20` are both a space (also after a `%`: see `a_plus_sign_is_not_a_hex_digit`).
        prop_assert_eq!(decode_query_value(&s.replace(' ', "+")), decode_query_value(&s.replace(' ', "%20")));
    }

    /// Any text decodes (to UTF-8, never a panic); text without `%` or `+` is left alone; a
    /// decoded value is never longer than its text.
    #[test]
    fn any_query_text_decodes(s in prop_oneof!["\\PC{0,60}", "[%+0-9a-fA-FgG]{0,30}", ".{0,40}%.?"], raw in bytes(60)) {
        let d = decode_query_value(&s);
        if !s.contains(['%', '+']) {
            prop_assert_eq!(&d, &s);
        }
        prop_assert!(d.len() <= s.len(), "{:?} -> {:?}", s, d);
        let lossy = String::from_utf8_lossy(&raw).into_owned();
        let _ = decode_query_value(&lossy);
    }

    /// Chunk rules for any size and index: a length exactly for chunks in range, summing to
    /// the size; the offset of an accepted chunk is its index times 4 MiB.
    #[test]
    fn chunk_rules_hold_for_any_size(size in prop_oneof![any::<u64>(), 0u64..(3 * CHUNK_BYTES), Just(FILE_MAX_BYTES)], index in prop_oneof![any::<u64>(), 0u64..8]) {
        let n = chunk_count(size);
        prop_assert!(n >= 1);
        match chunk_len(size, index) {
            Some(len) => {
                prop_assert!(index < n && len <= CHUNK_BYTES);
                prop_assert!(index + 1 == n || len == CHUNK_BYTES);
            }
            None => prop_assert!(index >= n),
        }
        let last = chunk_len(size, n - 1).unwrap();
        prop_assert_eq!(u128::from(n - 1) * u128::from(CHUNK_BYTES) + u128::from(last), u128::from(size));
        prop_assert_eq!(check_read(index).is_ok(), (1..=READ_MAX_BYTES).contains(&index));
    }

    /// Sessions from any begin body: refused with a typed error, or a session whose chunks are
    /// checked and counted without ever going wrong.
    #[test]
    fn upload_sessions_take_any_begin_and_any_chunk(
        path in prop_oneof!["\\PC{0,40}", hostile_path()],
        size in prop_oneof![any::<u64>(), 0u64..(3 * CHUNK_BYTES)],
        checksum in prop_oneof!["[0-9a-fA-F]{64}", "\\PC{0,70}", Just(String::new())],
        chunks in proptest::collection::vec((prop_oneof![any::<u64>(), 0u64..4], prop_oneof![any::<u64>(), Just(CHUNK_BYTES), 0u64..CHUNK_BYTES], any::<bool>()), 0..8),
        dt in 0u64..(transfer::SESSION_IDLE_MS * 2),
    ) {
        let begun = UploadSession::new("s1".into(), VolumeId::new("v"), path.clone(), size, checksum.clone(), FileId::new("f"), NOW);
        let mut u = match begun {
            Ok(u) => u,
            Err(e) => {
                prop_assert!(size > FILE_MAX_BYTES || (!checksum.is_empty() && check_checksum(&checksum).is_err()) || copy_segments(&path).is_err(), "{:?}", e);
                return Ok(());
            }
        };
        prop_assert!(size <= FILE_MAX_BYTES);
        prop_assert!(u.checksum.is_empty() || (is_hex_of_len(&u.checksum, 32) && u.checksum == u.checksum.to_ascii_lowercase()));
        prop_assert_eq!(u.missing(), chunk_count(size));
        let later = NOW.plus(dt);
        for (index, len, honest) in chunks {
            let actual = "ab".repeat(32);
            let claimed = if honest { "AB".repeat(32) } else { "cd".repeat(32) };
            match u.check_chunk(later, index, len, &claimed, &actual) {
                Ok(offset) => {
                    prop_assert!(honest && !u.expired(later));
                    prop_assert_eq!(Some(len), chunk_len(size, index));
                    prop_assert_eq!(offset, index * CHUNK_BYTES);
                    let before = u.missing();
                    u.mark(index, later);
                    prop_assert!(u.missing() <= before);
                }
                Err(e) => {
                    let typed = matches!(
                        e,
                        TransferError::Expired | TransferError::ChunkOutOfRange(_) | TransferError::ChunkLength { .. } | TransferError::ChunkChecksum(_)
                    );
                    prop_assert!(typed, "{:?}", e);
                }
            }
        }
    }

    /// A part file's name keeps within 255 bytes, ends with its tag and starts with (a prefix
    /// of) the name, cut at a character boundary.
    #[test]
    fn part_file_names_fit(name in prop_oneof!["\\PC{0,300}", "[é😀a]{0,200}"], tag in "[0-9a-f]{0,40}") {
        let p = part_file_name(&name, &tag);
        let suffix = format!("{PART_MARK}{tag}");
        prop_assert!(p.ends_with(&suffix));
        prop_assert!(p.len() <= MAX_SEGMENT_BYTES.max(suffix.len()));
        prop_assert!(name.starts_with(&p[..p.len() - suffix.len()]));
    }

    #[test]
    fn checksums_are_64_hex(c in prop_oneof!["\\PC{0,70}", "[0-9a-fA-F]{60,68}"]) {
        prop_assert_eq!(check_checksum(&c).is_ok(), is_hex_of_len(&c, 32));
    }
}

/// Issue 17 finding, fixed: `decode_query_value` read `%+5` as the byte
/// 0x05, because `u8::from_str_radix` accepts a leading `+`. A `%` not followed by two hex
/// digits stays as it is (`%zz` does) and `+` is a space, so `%+5` should be `% 5`; instead a
/// sender's `% 5` written with `+` for the space arrived as a control byte, and every byte
/// below 0x10 had a second spelling. Found by `query_values_round_trip` (`s = "% 0"`).
#[test]
fn a_plus_sign_is_not_a_hex_digit() {
    assert_eq!(decode_query_value("%+5"), "% 5");
    assert_eq!(decode_query_value("a%+fb"), "a% fb");
}

// ---------------------------------------------------------------------------------------------
// Records, entries and ids
// ---------------------------------------------------------------------------------------------

fn version_s() -> impl Strategy<Value = Version> {
    (any::<u64>(), any::<u32>(), "[a-z0-9-]{0,12}").prop_map(|(w, c, n)| version(w, c, &n))
}

fn canonical_path() -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-zA-Z0-9 ._é-]{1,12}", 0..5)
        .prop_filter_map("canonical", |segs| normalize(&format!("/{}", segs.join("/"))).ok())
}

fn record() -> impl Strategy<Value = Record> {
    let location =
        ("[a-f0-9]{1,8}", "[a-f0-9]{1,8}", 0usize..7, "[a-f0-9]{0,64}", version_s(), proptest::option::of(version_s()))
            .prop_map(|(v, n, s, c, u, content)| Location {
                volume_id: VolumeId::new(v),
                node_id: NodeId::new(n),
                state: [
                    LocationState::Pending,
                    LocationState::Writing,
                    LocationState::Committed,
                    LocationState::Verified,
                    LocationState::Stale,
                    LocationState::Failed,
                    LocationState::Dropped,
                ][s],
                checksum: c,
                content: content.filter(|c| *c < u),
                updated: u,
            });
    let file = (
        canonical_path(),
        any::<u64>(),
        any::<bool>(),
        "[a-f0-9]{0,64}",
        proptest::collection::vec(location, 0..3),
        0u32..65,
        any::<bool>(),
        version_s(),
    )
        .prop_map(|(path, size, is_dir, checksum, locations, replicas, removed, version)| {
            Record::File(FileRecord {
                id: FileId::new("f-1"),
                path,
                is_dir,
                size,
                mod_time: size / 3,
                checksum,
                owner: "admin".into(),
                primary: locations.first().map(|l| l.volume_id.clone()),
                locations,
                replicas,
                removed,
                version,
                repl: None,
                based_on: None,
            })
        });
    let volume = ("[a-f0-9]{1,8}", "\\PC{0,20}", any::<bool>(), any::<u64>(), version_s(), version_s()).prop_map(
        |(id, name, ro, cap, v, uv)| {
            Record::Volume(Volume {
                id: VolumeId::new(id),
                node_id: NodeId::new("n"),
                name,
                fsh_uuid: String::new(),
                subpath: "/data".into(),
                read_only: ro,
                evacuating: !ro,
                removed: false,
                version: v,
                capacity: cap,
                free: cap / 2,
                low_space: false,
                usage_version: uv,
            })
        },
    );
    let policy = (canonical_path(), 0u32..65, any::<bool>(), version_s())
        .prop_map(|(folder, replicas, removed, version)| Record::Policy(Policy { folder, replicas, removed, version }));
    let setting = ("[a-z.]{1,20}", json_value(), any::<bool>(), version_s())
        .prop_map(|(key, value, removed, version)| Record::Setting(Setting { key, value, removed, version }));
    let job =
        ("[a-f0-9-]{1,36}", "\\PC{0,20}", json_value(), version_s(), prop_oneof![Just(0.0), Just(0.5), Just(1.0)])
            .prop_map(|(id, script, args, version, progress)| {
                let mut j: shoal_core::meta::records::Job =
                    serde_json::from_value(json!({"id": id, "version": version})).unwrap();
                j.spec.script = script;
                j.spec.args = args;
                j.state.progress = progress;
                j.state_version = version.clone();
                Record::Job(j)
            });
    prop_oneof![file, volume, policy, setting, job]
}

/// Decode `bytes` as a `T`; when it decodes, its encoding decodes to the same (numbers compared
/// as numbers).
fn decode_consistently<T: serde::de::DeserializeOwned + serde::Serialize>(
    bytes: &[u8],
) -> Result<Option<T>, TestCaseError> {
    let Ok(x) = serde_json::from_slice::<T>(bytes) else { return Ok(None) };
    let again = serde_json::to_vec(&x).unwrap();
    let y: T =
        serde_json::from_slice(&again).map_err(|e| TestCaseError::fail(format!("re-encoding does not decode: {e}")))?;
    prop_assert!(same_json(&serde_json::to_value(&x).unwrap(), &serde_json::to_value(&y).unwrap()));
    Ok(Some(x))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Arbitrary bytes as any record type a peer or the disk hands over: refused, or a value
    /// that re-encodes consistently.
    #[test]
    fn arbitrary_bytes_as_records(b in prop_oneof![bytes(200), json_value().prop_map(|v| serde_json::to_vec(&v).unwrap())]) {
        decode_consistently::<Record>(&b)?;
        decode_consistently::<Entry>(&b)?;
        decode_consistently::<Pending>(&b)?;
        decode_consistently::<LogMeta>(&b)?;
        decode_consistently::<Version>(&b)?;
        decode_consistently::<NodeRecord>(&b)?;
        decode_consistently::<JobSubmit>(&b)?;
        let depth = json_text_depth(&b);
        if let Ok(v) = serde_json::from_slice::<Value>(&b) {
            prop_assert!(depth + 1 >= json_depth(&v) && depth <= json_depth(&v));
        }
    }

    /// Records round-trip through their JSON (alone and inside a log entry), and a mutated
    /// encoding is refused or decodes to a record that re-encodes to itself; its shape check
    /// answers either way.
    #[test]
    fn records_round_trip_and_survive_mutation(r in record(), e in edits(), seq in any::<u64>()) {
        let text = serde_json::to_vec(&r).unwrap();
        let back: Record = serde_json::from_slice(&text).unwrap();
        prop_assert_eq!(&back, &r);
        let (text_depth, depth) = (json_text_depth(&text), json_depth(&serde_json::to_value(&r).unwrap()));
        prop_assert!(text_depth <= depth && depth <= text_depth + 1);
        let entry = Entry { seq: LogIndex(seq), term: Term(seq / 7), version: r.max_version(), origin: NodeId::new("o"), record: r.clone() };
        let etext = serde_json::to_vec(&entry).unwrap();
        prop_assert_eq!(serde_json::from_slice::<Entry>(&etext).unwrap(), entry);
        if let Some(m) = decode_consistently::<Record>(&mutate(&text, &e))? {
            let _ = m.shape_error();
            let _ = m.version_fingerprint();
        }
        if let Some(m) = decode_consistently::<Entry>(&mutate(&etext, &e))? {
            let _ = m.record.shape_error();
        }
    }

    /// A signed member record: it round-trips; mutated, it is refused, or its owner signature
    /// holds exactly when the signed fields are unchanged.
    #[test]
    fn mutated_member_records_keep_their_signature_honest(seed in any::<[u8; 32]>(), name in "\\PC{0,20}", url in valid_url(), e in edits(), wall in any::<u64>()) {
        let key = SigningKey::from_bytes(&seed);
        let fields = OwnerFields {
            id: NodeId::new(uuid_of(wall)),
            name,
            public_key: public_key_b64(&key.verifying_key()),
            advertise_url: url,
            tunnel_via: String::new(),
            version: "0.1.0".into(),
            capabilities: Capabilities::default(),
            joined: wall / 1000,
            box_key: String::new(),
            tls_pin: String::new(),
        };
        let rec = NodeRecord::new_signed(fields.clone(), version(wall, 0, "n"), &key);
        prop_assert!(rec.owner_sig_valid(&key.verifying_key()));
        let text = serde_json::to_vec(&rec).unwrap();
        prop_assert_eq!(serde_json::from_slice::<NodeRecord>(&text).unwrap(), rec.clone());
        if let Some(m) = decode_consistently::<NodeRecord>(&mutate(&text, &e))? {
            let same = m.owner_fields() == rec.owner_fields() && m.owner_version == rec.owner_version && m.owner_sig == rec.owner_sig;
            prop_assert_eq!(m.owner_sig_valid(&key.verifying_key()), same);
            let _ = m.shape_ok();
            if let Some(k) = m.key() {
                prop_assert_eq!(m.owner_sig_valid(&k), same || (k != key.verifying_key() && m.owner_sig_valid(&k)));
            }
        }
    }

    #[test]
    fn admin_states_and_ids_parse_strictly(s in prop_oneof!["\\PC{0,14}", Just("maintenance".to_string()), Just("draining".to_string()), Just("active".to_string()), Just(String::new())], seed in any::<u64>(), e in edits()) {
        match AdminState::parse(&s) {
            Some(a) => {
                prop_assert!(a.as_str() == s || (s == "active" && a == AdminState::Active));
                prop_assert_eq!(AdminState::parse(a.as_str()), Some(a));
            }
            None => prop_assert!(!["", "active", "maintenance", "draining"].contains(&s.as_str())),
        }
        let u = uuid_of(seed);
        prop_assert!(is_uuid(&u) && is_uuid(&u.to_uppercase()));
        let m = mutate_str(&u, &e);
        if is_uuid(&m) {
            prop_assert_eq!(m.len(), 36);
            let shaped = m.bytes().enumerate().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == b'-' } else { c.is_ascii_hexdigit() });
            prop_assert!(shaped, "{:?}", m);
        }
        let n = (seed % 40) as usize;
        prop_assert_eq!(is_hex_of_len(&s, n), s.len() == 2 * n && s.bytes().all(|c| c.is_ascii_hexdigit()));
    }

    /// A job submit from any JSON: refused with a typed error, or a spec within every bound
    /// (canonical inputs, a dataset that parses, nodes sorted and unique).
    #[test]
    fn job_submits_from_any_json_are_refused_or_bounded(
        v in json_value(),
        script in prop_oneof![Just(String::new()), Just("  ".to_string()), "\\PC{1,20}"],
        inputs in proptest::collection::vec(prop_oneof!["\\PC{0,20}", hostile_path()], 0..4),
        dataset in prop_oneof![Just(String::new()), hostile_path(), "\\PC{0,12}"],
        nums in (proptest::option::of(any::<i64>()), proptest::option::of(any::<i64>()), proptest::option::of(any::<i64>()), any::<i64>()),
        nodes in proptest::collection::vec("[a-c]{1,2}", 0..5),
    ) {
        let (pmax, timeout, attempts, priority) = nums;
        let body = json!({
            "name": "job", "script": script, "args": v, "inputs": inputs, "dataset": dataset,
            "partitionMax": pmax, "timeoutSec": timeout, "maxAttempts": attempts, "priority": priority, "nodes": nodes,
        });
        for b in [body.clone(), v.clone()] {
            let Ok(s) = serde_json::from_value::<JobSubmit>(b) else { continue };
            match spec_of(s.clone(), "admin", 1) {
                Ok(spec) => {
                    prop_assert!(!spec.script.trim().is_empty() && spec.script.len() <= SCRIPT_MAX_BYTES);
                    for i in &spec.inputs {
                        prop_assert_eq!(normalize(i), Ok(i.clone()));
                    }
                    prop_assert!(spec.dataset.is_empty() || Pattern::parse(&spec.dataset).is_ok());
                    prop_assert!((1..=10_000).contains(&spec.partition_max) && spec.timeout_sec >= 1 && spec.max_attempts >= 1);
                    prop_assert!((-1000..=1000).contains(&spec.priority));
                    prop_assert!(spec.nodes.len() <= NODES_MAX && spec.nodes.windows(2).all(|w| w[0] < w[1]));
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
        for i in &inputs {
            if let Ok(p) = cluster_path(i) {
                assert_canonical(&p)?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The metadata store's peer endpoints
// ---------------------------------------------------------------------------------------------

const T: Millis = Millis(100_000);
const WALL: Millis = Millis(1_700_000_000_000);

fn leader() -> (Meta, Hlc) {
    let me = NodeId::new("a");
    let mut m = Meta::new(me.clone(), MetaConfig::default(), T);
    let mut hlc = Hlc::new(me.clone());
    hlc.set_physical(WALL);
    m.allow_claim_now(T);
    m.handle_timeout(
        T,
        WALL,
        vec![
            Candidate { id: me.clone(), joined: 1, eligible: true, reachable: true },
            Candidate { id: NodeId::new("b"), joined: 2, eligible: true, reachable: true },
        ],
        &mut hlc,
    );
    (m, hlc)
}

fn follower() -> (Meta, Hlc) {
    let me = NodeId::new("b");
    let mut hlc = Hlc::new(me.clone());
    hlc.set_physical(WALL);
    (Meta::new(me, MetaConfig::default(), T), hlc)
}

/// Real `meta/lease` and `meta/append` bodies the leader sends after submitting `r`.
fn leader_bodies(r: &Record) -> (Vec<u8>, Vec<u8>) {
    let (mut m, mut hlc) = leader();
    assert!(m.is_leader(T), "a lone eligible node claims the lease");
    m.submit(T, r.clone(), &mut hlc);
    m.handle_timeout(
        T.plus(1),
        WALL,
        vec![
            Candidate { id: NodeId::new("a"), joined: 1, eligible: true, reachable: true },
            Candidate { id: NodeId::new("b"), joined: 2, eligible: true, reachable: true },
        ],
        &mut hlc,
    );
    let (mut lease, mut append) = (None, None);
    while let Some(o) = m.poll_output() {
        if let MetaOutput::Send { target, body, .. } = o {
            if target.ends_with("meta/lease") {
                lease.get_or_insert(body);
            } else if target.ends_with("meta/append") {
                append.get_or_insert(body);
            }
        }
    }
    (lease.expect("a lease push"), append.expect("an append"))
}

fn all_shape_ok(m: &Meta) -> bool {
    m.state().records_after(None).all(|(_, r)| r.shape_ok())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Garbage to every `meta/*` endpoint is refused as invalid (or, for a submit to a node
    /// that does not lead, as a conflict) and changes nothing.
    #[test]
    fn garbage_to_meta_endpoints_is_refused(b in prop_oneof![bytes(200), json_value().prop_map(|v| serde_json::to_vec(&v).unwrap())], q in "\\PC{0,40}") {
        let a = NodeId::new("a");
        let (mut f, mut fh) = follower();
        // serde takes a struct as a JSON object or as an array of its fields.
        let valid_json_object = serde_json::from_slice::<Value>(&b).is_ok_and(|v| v.is_object() || v.is_array());
        let r = f.answer_lease(T, &a, &b);
        if !valid_json_object { prop_assert_eq!(r.refused, Some(ErrorKind::Invalid)); }
        let r = f.answer_append(T, &a, &b, &mut fh);
        if !valid_json_object { prop_assert_eq!(r.refused, Some(ErrorKind::Invalid)); }
        let r = f.answer_submit(T, &a, &b, &mut fh);
        prop_assert_eq!(r.refused, Some(ErrorKind::Conflict));
        let (mut l, mut lh) = leader();
        let r = l.answer_submit(T, &NodeId::new("b"), &b, &mut lh);
        if !valid_json_object { prop_assert_eq!(r.refused, Some(ErrorKind::Invalid)); }
        prop_assert!(all_shape_ok(&l) && all_shape_ok(&f));
        for m in [&l, &f] {
            let r = m.answer_log(&q);
            let after = q.split('&').find_map(|kv| kv.strip_prefix("after="));
            prop_assert_eq!(r.refused.is_none(), after.is_none_or(|v| v.parse::<u64>().is_ok()), "{:?}", q);
            let r = m.answer_snapshot(&q);
            if r.refused.is_none() {
                prop_assert!(r.body.get("lastSeq").is_some());
            } else {
                prop_assert_eq!(r.refused, Some(ErrorKind::Invalid));
            }
        }
    }

    /// Real bodies are taken; mutated ones are refused with a typed answer or taken, and the
    /// store keeps only records within bounds either way.
    #[test]
    fn mutated_meta_bodies_are_refused_or_taken_within_bounds(r in record(), e in edits(), which in 0usize..3) {
        let (lease, append) = leader_bodies(&r);
        let submit = serde_json::to_vec(&json!({"records": [r]})).unwrap();
        let a = NodeId::new("a");
        let (mut f, mut fh) = follower();
        match which {
            0 => {
                prop_assert_eq!(f.answer_lease(T, &a, &lease).refused, None);
                let reply = f.answer_lease(T, &a, &mutate(&lease, &e));
                prop_assert!(reply.refused.is_none() || matches!(reply.refused, Some(ErrorKind::Invalid | ErrorKind::Conflict)));
            }
            1 => {
                prop_assert_eq!(f.answer_append(T, &a, &append, &mut fh).refused, None);
                let (mut f2, mut fh2) = follower();
                let reply = f2.answer_append(T, &a, &mutate(&append, &e), &mut fh2);
                prop_assert!(reply.refused.is_none() || matches!(reply.refused, Some(ErrorKind::Invalid | ErrorKind::Conflict)));
                prop_assert!(all_shape_ok(&f2));
            }
            _ => {
                let (mut l, mut lh) = leader();
                // A record stamped too far ahead of the leader's clock is refused by name (issue
                // 18: its change must not be acknowledged as held); any other is taken.
                let ahead = r.versions().into_iter().any(|v| !lh.acceptable(v));
                let reply = l.answer_submit(T, &NodeId::new("b"), &submit, &mut lh);
                prop_assert_eq!(reply.refused, None);
                prop_assert_eq!(reply.body["refused"].as_array().map(Vec::len), Some(usize::from(ahead)));
                let reply = l.answer_submit(T, &NodeId::new("b"), &mutate(&submit, &e), &mut lh);
                prop_assert!(reply.refused.is_none() || reply.refused == Some(ErrorKind::Invalid));
                prop_assert!(all_shape_ok(&l));
            }
        }
        prop_assert!(all_shape_ok(&f));
    }
}

// ---------------------------------------------------------------------------------------------
// A node's ACN face
// ---------------------------------------------------------------------------------------------

const ENDPOINTS: [&str; 18] = [
    "hello",
    "members",
    "latency",
    "ping",
    "join",
    "heartbeat",
    "members/sync",
    "leave",
    "evict",
    "meta/log",
    "meta/snapshot",
    "meta/file",
    "meta/lease",
    "meta/append",
    "meta/submit",
    "store/place",
    "events/publish",
    "jobs/run",
];

fn endpoint() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(&ENDPOINTS[..]).prop_map(str::to_string),
        Just("jobs/renew".to_string()),
        Just("jobs/done".to_string()),
        "\\PC{0,20}",
    ]
}

fn target() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("/cluster/acn/"), Just("/cluster/acn"), Just("/"), Just("")],
        endpoint(),
        proptest::option::of("\\PC{0,30}"),
    )
        .prop_map(|(p, e, q)| match q {
            Some(q) => format!("{p}{e}?{q}"),
            None => format!("{p}{e}"),
        })
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![Just("GET".to_string()), Just("POST".to_string()), Just("post".to_string()), "\\PC{0,8}"]
}

/// A node in a cluster of its own.
fn lone_node() -> shoal_core::node::Node {
    let mut n = common::node_one();
    n.create_cluster(common::net::T0, "home").expect("create");
    while n.poll_output().is_some() {}
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Unsigned requests, with any target, method and body: only the open probe (`hello`) and
    /// a well-formed `join` can be carried out; everything else is refused with a kind.
    #[test]
    fn unsigned_requests_are_refused(t in target(), m in method(), b in bytes(200), h in proptest::option::of((header_value(), header_value(), header_value(), header_value(), header_value()))) {
        let mut n = lone_node();
        let headers = h.map(|(node, cluster, timestamp, nonce, signature)| SignedHeaders { node, cluster, timestamp, nonce, signature });
        let pre = n.precheck_acn(common::net::T0, headers.as_ref());
        prop_assert!(pre.as_ref().is_err_and(|r| r.refused.is_some()), "precheck let a stranger in");
        let r = n.handle_acn(common::net::T0, &m, &t, headers.as_ref(), &b);
        let path = t.split('?').next().unwrap_or("");
        let open = (path == "/cluster/acn/hello" && m.eq_ignore_ascii_case("GET"))
            || (path == "/cluster/acn/join" && m.eq_ignore_ascii_case("POST"));
        if r.refused.is_none() {
            prop_assert!(open, "{} {} carried out unsigned: {}", m, t, r.body);
        }
        if path == "/cluster/acn/join" && m.eq_ignore_ascii_case("POST") {
            // A join needs a token this node issued: garbage cannot be one.
            prop_assert!(r.refused.is_some(), "{}", r.body);
        }
    }

    /// Every endpoint, signed by a member, with any body and query: answered with a typed
    /// refusal or carried out; JSON-bodied endpoints refuse what is not JSON.
    #[test]
    fn signed_garbage_from_a_member_is_answered(ep in endpoint(), q in proptest::option::of("[a-z=&%0-9]{0,20}"), b in prop_oneof![bytes(200), json_value().prop_map(|v| serde_json::to_vec(&v).unwrap())]) {
        let mut net = common::net::Net::new(&[0, 0]);
        let at = net.clock(0);
        net.nodes[0].create_cluster(at, "home").expect("create");
        net.pump();
        let (reply, done) = net.join(1, 0);
        prop_assert!(reply.refused.is_none() && done.is_ok());
        let target = match &q {
            Some(q) => format!("/cluster/acn/{ep}?{q}"),
            None => format!("/cluster/acn/{ep}"),
        };
        for method in ["GET", "POST"] {
            let h = net.signed(1, method, &target, &b);
            let at = net.clock(0);
            let r = net.nodes[0].handle_acn(at, method, &target, Some(&h), &b);
            if r.refused.is_none() {
                let body_ignored = ["hello", "members", "latency", "ping", "meta/log", "meta/snapshot", "meta/file", "leave"].contains(&ep.as_str());
                prop_assert!(body_ignored || serde_json::from_slice::<Value>(&b).is_ok(), "{} {} took a non-JSON body: {}", method, target, r.body);
            } else {
                prop_assert!(r.body.pointer("/error/code").is_some_and(Value::is_string), "{}", r.body);
            }
            while net.nodes[0].poll_output().is_some() {}
        }
    }

    /// A real join body, mutated, sent to the issuer: refused with a kind, or a join.
    #[test]
    fn mutated_join_bodies_are_refused_or_join(e in edits()) {
        let mut net = common::net::Net::new(&[0, 0]);
        let at = net.clock(0);
        net.nodes[0].create_cluster(at, "home").expect("create");
        net.pump();
        let token = net.token(0);
        let at1 = net.clock(1);
        let plan = net.nodes[1].prepare_join(at1, &token).expect("prepare");
        let bad = mutate(&plan.body, &e);
        let at0 = net.clock(0);
        let r = net.nodes[0].handle_acn(at0, "POST", "/cluster/acn/join", None, &bad);
        if r.refused.is_none() {
            prop_assert!(serde_json::from_slice::<Value>(&bad).is_ok());
        } else {
            prop_assert!(r.body.pointer("/error/code").is_some_and(Value::is_string), "{}", r.body);
        }
        // The joiner takes any answer from the "issuer" without panicking: garbage is an error.
        let answer = PeerAnswer::ok(bad.clone());
        let done = net.nodes[1].finish_join(at1, &answer);
        if serde_json::from_slice::<Value>(&bad).is_err() {
            prop_assert!(done.is_err());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Issue 16: any bytes off a tunnel decode to a frame or a typed error, never a panic; a
    /// frame that decodes encodes back to the same bytes' meaning.
    #[test]
    fn tunnel_frames_decode_or_refuse(b in bytes(300)) {
        if let Ok(f) = shoal_core::tunnel::decode(&b) {
            let again = shoal_core::tunnel::encode(&f).expect("a decoded frame encodes");
            prop_assert_eq!(shoal_core::tunnel::decode(&again).expect("and decodes"), f);
        }
    }

    /// Issue 16: a real frame with multi-value headers, mutated: a typed error or a frame.
    #[test]
    fn mutated_tunnel_frames_decode_or_refuse(body in bytes(100), e in edits(), vals in proptest::collection::vec("\\PC{0,12}", 0..4)) {
        let mut h = std::collections::BTreeMap::new();
        h.insert("X-Aroz-Node".to_string(), vals);
        let f = shoal_core::tunnel::Frame {
            kind: shoal_core::tunnel::FrameKind::Request,
            header: shoal_core::tunnel::FrameHeader { id: "0".repeat(32), m: "POST".into(), t: "/cluster/acn/ping".into(), s: 0, h },
            body,
        };
        let bytes = shoal_core::tunnel::encode(&f).unwrap();
        prop_assert_eq!(&shoal_core::tunnel::decode(&bytes).unwrap(), &f);
        let _ = shoal_core::tunnel::decode(&mutate(&bytes, &e));
    }

    /// Issue 16: relay paths parse to a node and an original `/cluster/acn/` target that is not
    /// itself a relay or the tunnel, or are refused with a kind.
    #[test]
    fn relay_paths_parse_or_refuse(rest in "\\PC{0,60}", node in "[a-z0-9-]{0,12}") {
        for target in [format!("/cluster/acn/relay/{rest}"), format!("/cluster/acn/relay/{node}/cluster/acn/{rest}"), rest.clone()] {
            if let Ok((to, original)) = shoal_core::tunnel::parse_relay_target(&target) {
                prop_assert!(!to.as_str().is_empty());
                prop_assert!(original.starts_with("/cluster/acn/"));
                prop_assert!(!original.starts_with("/cluster/acn/relay/"));
                prop_assert_eq!(shoal_core::tunnel::relay_target(&to, original), target.clone());
            }
        }
    }
}
