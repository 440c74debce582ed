//! One sign-on in the simulator (issue 15; spec: cluster-runtime.md "Identity (AID)"): three
//! nodes, the origin (n0, which made the cluster) partitioned away from the others. A login at
//! a member falls back to the member's copy of the directory within the forward-auth timeout; a
//! password changed there meanwhile is kept, and written back to the origin after the heal, so
//! the old password stops working everywhere. And the origin moved: a direct set of the trusted
//! key is refused, an approved proposal moves it on every node, and an account added at the new
//! origin then reaches the old one. A failing run prints its seed; `SEED=n` replays it.

use serde_json::json;
use shoal_sim::{Harness, SimConfig};

const INTERVAL: u64 = 15_000;
/// `identity.forward_timeout`'s default.
const FORWARD_TIMEOUT_MS: u64 = 12_000;

fn login(h: &mut Harness, i: usize, password: &str) -> u16 {
    let body = json!({"username": "anna", "password": password});
    h.api(i, "POST /v1/login", Some(body)).map(|(s, _)| s).unwrap_or(0)
}

fn hash_at(h: &Harness, i: usize) -> Option<String> {
    h.read(i, |n, _| n.identity().account("anna").map(|a| a.hash.clone())).flatten()
}

/// Three converged nodes with cheap hashes (the simulator hashes on real threads) and a quick
/// directory sync.
fn three_nodes(seed: u64) -> Harness {
    let mut h = Harness::new(SimConfig::new(seed, 3));
    h.form_cluster().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    h.converge_within(2 * INTERVAL + 5_000).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    for (key, value) in [
        ("identity.argon2_memory_kib", json!(64)),
        ("identity.argon2_time", json!(1)),
        ("identity.sync_every", json!("10s")),
    ] {
        let body = json!({"action": "set", "key": key, "value": value, "why": "identity scenario"});
        let (s, v) = h.api(0, "POST /v1/config", Some(body)).unwrap();
        assert_eq!(s, 200, "seed {seed}: {key}: {v}");
    }
    h.run_checked(15_000).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    h
}

#[test]
fn members_fall_back_to_their_directory_and_write_a_password_back_after_the_heal() {
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let mut h = three_nodes(seed);
    // Added at a member: it acts at the origin, and every member mirrors it.
    let body = json!({"name": "anna", "password": "correct horse"});
    let (s, v) = h.api(1, "POST /v1/users", Some(body)).unwrap();
    assert_eq!(s, 200, "seed {seed}: {v}");
    let start = h.elapsed_ms();
    while (0..3).any(|i| hash_at(&h, i).is_none()) {
        assert!(h.elapsed_ms() - start < 60_000, "seed {seed}: anna not mirrored everywhere");
        h.run_checked(1_000).unwrap();
    }
    assert_eq!(login(&mut h, 2, "correct horse"), 200, "seed {seed}: forwarded to the origin");

    // The origin goes away from both members.
    h.partition(0, 1);
    h.partition(0, 2);
    let t0 = h.elapsed_ms();
    assert_eq!(login(&mut h, 2, "correct horse"), 200, "seed {seed}: the member's directory decides");
    let took = h.elapsed_ms() - t0;
    assert!(took <= FORWARD_TIMEOUT_MS + 2_000, "seed {seed}: the fallback took {took} ms");
    assert_eq!(login(&mut h, 2, "wrong password"), 401, "seed {seed}");
    // A new password at the member, kept there while the origin cannot take it.
    let (s, v) = h.api(2, "POST /v1/users/anna/password", Some(json!({"password": "battery staple"}))).unwrap();
    assert_eq!((s, v["writeBack"].as_str()), (200, Some("pending")), "seed {seed}: {v}");
    assert_eq!(login(&mut h, 2, "battery staple"), 200, "seed {seed}");
    let new_hash = hash_at(&h, 2).unwrap();
    assert_ne!(hash_at(&h, 0), Some(new_hash.clone()), "seed {seed}: the origin cannot have it yet");
    // Its directory sync during the partition fails and does not revert it.
    h.run_checked(30_000).unwrap();
    assert_eq!(hash_at(&h, 2), Some(new_hash.clone()), "seed {seed}: kept over the directory's");

    // Healed: written back to the origin, then back to every member.
    h.heal_network();
    let start = h.elapsed_ms();
    while (0..3).any(|i| hash_at(&h, i).as_ref() != Some(&new_hash)) {
        assert!(h.elapsed_ms() - start < 120_000, "seed {seed}: the new password did not reach every node");
        h.run_checked(1_000).unwrap();
    }
    let pending = h.read(2, |n, _| n.identity().writebacks().len()).unwrap();
    assert_eq!(pending, 0, "seed {seed}");
    for i in 0..3 {
        assert_eq!(login(&mut h, i, "battery staple"), 200, "seed {seed}: n{i}");
    }
    assert_eq!(login(&mut h, 1, "correct horse"), 401, "seed {seed}: the old password is gone");
}

fn origin_at(h: &Harness, i: usize) -> Option<String> {
    h.read(i, |n, _| n.identity_origin().map(|o| o.to_string())).flatten()
}

#[test]
fn the_origin_moves_only_by_an_approved_proposal_and_the_old_one_then_mirrors_the_new() {
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let mut h = three_nodes(seed);
    let (old, new) = (origin_at(&h, 0).expect("an origin"), h.read(1, |n, _| n.id().to_string()).unwrap());
    assert!((0..3).all(|i| origin_at(&h, i).as_ref() == Some(&old)), "seed {seed}: the creator everywhere");

    // Weakness 10: a member cannot simply make itself the origin.
    let set = json!({"action": "set", "key": "identity.origin", "value": new, "why": "mine now"});
    let (s, v) = h.api(1, "POST /v1/config", Some(set)).unwrap();
    assert_eq!((s, v["error"]["code"].as_str()), (403, Some("trusted_key")), "seed {seed}: {v}");
    let propose = json!({"action": "propose", "key": "identity.origin", "value": new, "why": "move the origin"});
    let (s, p) = h.api(1, "POST /v1/config", Some(propose)).unwrap();
    assert_eq!(s, 200, "seed {seed}: {p}");
    h.run_checked(20_000).unwrap();
    assert!((0..3).all(|i| origin_at(&h, i).as_ref() == Some(&old)), "seed {seed}: not before the approval");

    // Approved at another node: every node follows.
    let approve = json!({"action": "approve", "id": p["id"]});
    let (s, v) = h.api(2, "POST /v1/config", Some(approve)).unwrap();
    assert_eq!(s, 200, "seed {seed}: {v}");
    let start = h.elapsed_ms();
    while (0..3).any(|i| origin_at(&h, i).as_ref() != Some(&new)) {
        assert!(h.elapsed_ms() - start < 60_000, "seed {seed}: the new origin did not reach every node");
        h.run_checked(1_000).unwrap();
    }

    // An account added at the new origin reaches the old one (now a member that mirrors it).
    let (s, v) = h.api(1, "POST /v1/users", Some(json!({"name": "anna", "password": "correct horse"}))).unwrap();
    assert_eq!(s, 200, "seed {seed}: {v}");
    let start = h.elapsed_ms();
    while h.read(0, |n, _| n.identity().account("anna").is_some_and(|a| a.mirrored)) != Some(true) {
        assert!(h.elapsed_ms() - start < 60_000, "seed {seed}: the old origin did not mirror the new one");
        h.run_checked(1_000).unwrap();
    }
    assert_eq!(login(&mut h, 0, "correct horse"), 200, "seed {seed}: a login at the old origin");
}
