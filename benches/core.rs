//! Benchmarks of the pure core: the membership merge a heartbeat costs, HLC versions, ACN
//! request signing and verification, and a spend into a full replay cache.
//!
//! Run: `cargo bench --bench core` (add `-- --warm-up-time 1 --measurement-time 3` for a quick
//! pass). Everything expensive to build (1000 signed records) is built once, outside the timed
//! loops.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use shoal_core::acn::{self, Incoming, Verifier};
use shoal_core::hlc::{Hlc, Version};
use shoal_core::ids::{ClusterId, NodeId};
use shoal_core::membership::{Membership, MembershipConfig, Trust};
use shoal_core::records::{Capabilities, Health, NodeRecord, OwnerFields};
use shoal_core::rng::SeededRng;
use shoal_core::time::Millis;

const NOW: Millis = Millis(1_700_000_000_000);
const MEMBERS: usize = 1000;

/// An Ed25519 signing key from a seed. The root package does not depend on ed25519-dalek
/// directly, so the key type is taken from the signature of [`NodeRecord::new_signed`].
fn signing_key<K: From<[u8; 32]>>(_signer: fn(OwnerFields, Version, &K) -> NodeRecord, seed: u64) -> K {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8] = 1;
    K::from(bytes)
}

fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("{:08x}-0000-4000-8000-{:012x}", i, i))
}

fn cluster_id() -> ClusterId {
    ClusterId::new("22222222-2222-4222-8222-222222222222")
}

/// What a realistic member says about itself.
fn capabilities() -> Capabilities {
    let mut c = Capabilities {
        os: "linux".into(),
        arch: "x86_64".into(),
        cpu_cores: 8,
        total_ram: 16 << 30,
        hostname: "host".into(),
        detected_at: NOW.as_secs(),
        ..Capabilities::default()
    };
    for f in ["ffmpeg", "docker", "python3", "cpu.avx2", "cpu.aes"] {
        c.features.insert(f.into(), true);
    }
    c
}

struct Fixture {
    /// A member (an observer id, so that no record is its own) holding all 1000 records.
    members: Membership,
    /// The same 1000 records as a peer sends them in its heartbeat reply.
    same: Vec<NodeRecord>,
    /// The 1000 records, each with a newer owner version (re-signed by its owner).
    newer: Vec<NodeRecord>,
}

fn fixture() -> Fixture {
    let me = NodeId::new("ffffffff-ffff-4fff-8fff-ffffffffffff");
    let mut members = Membership::new(me, MembershipConfig::default());
    let mut newer = Vec::with_capacity(MEMBERS);
    let founder_key = signing_key(NodeRecord::new_signed, 0);
    let mut founder_clock = Hlc::new(node_id(0));
    for i in 0..MEMBERS {
        let key = signing_key(NodeRecord::new_signed, i as u64);
        let id = node_id(i);
        let fields = OwnerFields {
            id: id.clone(),
            name: format!("node-{i}"),
            public_key: acn::public_key_b64(&key.verifying_key()),
            advertise_url: format!("http://10.0.{}.{}:7000", i / 250, i % 250 + 1),
            tunnel_via: String::new(),
            version: "0.1.0".into(),
            capabilities: capabilities(),
            joined: NOW.as_secs() - 86_400,
            box_key: String::new(),
            tls_pin: String::new(),
        };
        let v = Version { wall_ms: NOW.0 - 3_600_000, counter: 0, node: id.clone() };
        let mut rec = NodeRecord::new_signed(fields.clone(), v, &key);
        rec.admit(&node_id(0), founder_clock.next(NOW), &founder_key);
        let health = Health {
            cpu_usage: 12.5,
            ram_used: 4 << 30,
            ram_total: 16 << 30,
            disk_free: 200 << 30,
            disk_total: 500 << 30,
            uptime: 86_400,
            timestamp: NOW.0 - 10_000,
        };
        rec.set_health(health, &key);
        let mut next = rec.clone();
        let v2 = Version { wall_ms: NOW.0 - 1_000, counter: 0, node: id.clone() };
        let mut f2 = fields;
        f2.capabilities.detected_at += 3_600;
        next.resign_owner(f2, v2, &key);
        newer.push(next);
        members.insert(rec);
        members.saw_at(&id, Millis(NOW.0 - 5_000), NOW);
    }
    let same = members.wire_records();
    for r in newer.iter_mut() {
        r.last_seen_ms = NOW.0 - 5_000;
        r.last_seen = r.last_seen_ms / 1000;
    }
    Fixture { members, same, newer }
}

fn merge_benches(c: &mut Criterion) {
    let f = fixture();

    let mut steady = f.members.clone();
    let mut hlc = Hlc::new(steady.me().clone());
    c.bench_function("merge_1000_record_heartbeat_no_change", |b| {
        b.iter(|| {
            let out = steady.merge(NOW, black_box(&f.same), Some(NOW), Trust::Gossip, &mut hlc);
            debug_assert!(out.changed.is_empty());
            out
        })
    });

    let mut hlc = Hlc::new(f.members.me().clone());
    c.bench_function("merge_1000_record_heartbeat_all_new_versions", |b| {
        b.iter_batched(
            || f.members.clone(),
            |mut m| {
                let out = m.merge(NOW, black_box(&f.newer), Some(NOW), Trust::Gossip, &mut hlc);
                debug_assert_eq!(out.changed.len(), MEMBERS);
                (m, out)
            },
            BatchSize::LargeInput,
        )
    });
}

fn hlc_benches(c: &mut Criterion) {
    let mut hlc = Hlc::new(node_id(1));
    let mut now = NOW;
    c.bench_function("hlc_next", |b| {
        b.iter(|| {
            now = now.plus(1);
            hlc.next(black_box(now))
        })
    });
}

fn acn_benches(c: &mut Criterion) {
    let key = signing_key(NodeRecord::new_signed, 7);
    let vk = key.verifying_key();
    let node = node_id(7);
    let cluster = cluster_id();
    // A heartbeat body: one member record, about 1 KiB of JSON.
    let f = fixture_record(&node);
    let body = serde_json::to_vec(&serde_json::json!({ "node": f })).unwrap();
    let target = "/cluster/acn/heartbeat";
    let mut rng = SeededRng::new(1);

    c.bench_function("acn_sign", |b| {
        b.iter(|| acn::sign_request(&key, &node, &cluster, "POST", target, black_box(&body), NOW, &mut rng))
    });

    c.bench_function("acn_verify", |b| {
        b.iter_batched(
            || {
                let h = acn::sign_request(&key, &node, &cluster, "POST", target, &body, NOW, &mut rng);
                (Verifier::default(), h)
            },
            |(mut verifier, h)| {
                let req = Incoming { headers: Some(&h), method: "POST", target, body: black_box(&body) };
                let r = verifier.verify(NOW, &req, Some(&cluster), |_| Some(vk));
                debug_assert!(r.is_ok());
                (verifier, r)
            },
            BatchSize::SmallInput,
        )
    });
}

/// One nonce spent into a replay cache already holding a million from two senders at 2,000
/// requests a second (what a busy leader holds within a nonce's lifetime).
fn nonce_benches(c: &mut Criterion) {
    let senders = [node_id(1).to_string(), node_id(2).to_string()];
    let mut rng = SeededRng::new(3);
    let mut cache = acn::NonceCache::new(acn::NONCE_CACHE_MAX);
    let at = |i: u64| Millis(NOW.0 + i / 2);
    let mut i = 0u64;
    while i < 1_000_000 {
        let now = at(i);
        cache
            .spend(now, &senders[i as usize % 2], now.as_secs() as i64, &rng.hex(16), Millis(now.0 + 900_000))
            .unwrap();
        i += 1;
    }
    c.bench_function("acn_nonce_spend_into_1m", |b| {
        b.iter(|| {
            let now = at(i);
            i += 1;
            let r =
                cache.spend(now, &senders[i as usize % 2], now.as_secs() as i64, &rng.hex(16), Millis(now.0 + 900_000));
            debug_assert!(r.is_ok());
            r
        })
    });
}

fn fixture_record(id: &NodeId) -> NodeRecord {
    let key = signing_key(NodeRecord::new_signed, 7);
    let fields = OwnerFields {
        id: id.clone(),
        name: "node-7".into(),
        public_key: acn::public_key_b64(&key.verifying_key()),
        advertise_url: "http://10.0.0.7:7000".into(),
        tunnel_via: String::new(),
        version: "0.1.0".into(),
        capabilities: capabilities(),
        joined: NOW.as_secs(),
        box_key: String::new(),
        tls_pin: String::new(),
    };
    NodeRecord::new_signed(fields, Version { wall_ms: NOW.0, counter: 0, node: id.clone() }, &key)
}

criterion_group!(benches, merge_benches, hlc_benches, acn_benches, nonce_benches);
criterion_main!(benches);
