//! Three in-memory [`Node`]s wired together by hand: every `Output::Send` is delivered to the
//! addressed node's `handle_acn` and its reply fed back as `Input::Response`. No shell, no clock:
//! each node has its own wall clock (a fixed offset from the test's true time).
//!
//! Spec: cluster-runtime.md "ACN – node-to-node protocol", "Membership", "Joining";
//! reference-facts.md "Wire", "Heartbeat", "Liveness" and weakness 10.

mod common;

use common::net::*;

use common::{Json, Status};
use serde_json::json;
use shoal_core::acn;
use shoal_core::ids::{ClusterId, NodeId};
use shoal_core::membership::NodeState;
use shoal_core::node::{ErrorKind, Event, Input, PersistOp};
use shoal_core::rng::SeededRng;
use shoal_core::time::{Millis, DAY_MS, MINUTE_MS, SECOND_MS};

const PING: &str = "/cluster/acn/ping";

/// A, B and C where C's clock runs 4 minutes ahead: A creates the cluster, B and C join
/// through A, then a minute of heartbeats.
fn three_nodes() -> Net {
    let mut net = Net::new(&[0, 0, 4 * MINUTE_MS as i64]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "home").expect("create");
    net.pump();
    let (reply, done) = net.join(1, 0);
    assert_eq!(reply.status(), 200, "{:?}", reply.body);
    done.expect("B joins");
    let (reply, done) = net.join(2, 0);
    assert_eq!(reply.status(), 200, "{:?}", reply.body);
    done.expect("C joins");
    net.run_for(MINUTE_MS, SECOND_MS);
    net
}

/// cluster-runtime.md "Joining" (steps 1-3) and "Membership" (heartbeats every 15 s, ONLINE
/// when heard from within 45 s), with one clock 4 minutes ahead (inside the ±5 min ACN window).
#[test]
fn three_nodes_that_join_through_one_issuer_all_see_each_other_online() {
    let mut net = three_nodes();
    net.assert_all_online(&[0, 1, 2]);
    let cluster = net.nodes[0].cluster().unwrap().clone();
    for i in 1..3 {
        assert_eq!(net.nodes[i].cluster(), Some(&cluster));
        assert!(net.persisted[i].iter().any(|p| p == &PersistOp::PutCluster(cluster.clone())));
    }
    // B learnt of C from A's push, not from C: the admission it checked was A's.
    assert!(net.events[1].contains(&Event::MemberAdded(net.id(2))));
    // Heartbeats answered, so latency is measured (0 ms here: delivery is instant).
    assert_eq!(net.nodes[0].members().latency_ms(&net.id(1)), 0.0);
    // Every heartbeat and push was answered 200.
    for (i, sent) in net.sent.iter().enumerate() {
        assert!(sent.iter().all(|s| s.status == Some(200)), "node {i}: {sent:?}");
        assert!(sent.iter().any(|s| s.target == "/cluster/acn/heartbeat"), "node {i} heartbeats");
    }
    // And it stays that way.
    net.run_for(5 * MINUTE_MS, 5 * SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
    // A node that goes silent is UNKNOWN after 45 s and OFFLINE after 3 min on the others.
    net.down[2] = true;
    net.run_for(MINUTE_MS, SECOND_MS);
    assert_eq!(net.state(0, 2), NodeState::Unknown);
    assert_eq!(net.state(1, 2), NodeState::Unknown);
    net.run_for(3 * MINUTE_MS, SECOND_MS);
    assert_eq!(net.state(0, 2), NodeState::Offline);
    assert_eq!(net.state(1, 2), NodeState::Offline);
    assert_eq!(net.state(0, 1), NodeState::Online);
    assert!(net.sent[0].iter().rev().take(3).any(|s| s.to.is_none()), "A still tries C");
    // Back up: ONLINE again within one heartbeat round.
    net.down[2] = false;
    net.run_for(20 * SECOND_MS, SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
}

/// cluster-runtime.md "Membership" ("other members may only change its admin state or remove
/// it", "Removed nodes stay as tombstones"), ACN `POST /cluster/acn/evict`.
#[test]
fn a_node_removed_on_one_member_is_removed_everywhere_and_evicted() {
    let mut net = three_nodes();
    let c = net.id(2);
    let at = net.clock(0);
    net.nodes[0].remove_node(at, c.as_str()).expect("remove C");
    net.pump();
    assert!(net.nodes[1].members().get(&c).unwrap().removed, "B learnt the removal");
    assert!(net.events[1].contains(&Event::MemberRemoved(c.clone())));
    assert_eq!(net.nodes[2].cluster(), None, "C was evicted");
    assert!(net.events[2].contains(&Event::RemovedSelf));
    assert!(net.persisted[2].contains(&PersistOp::ClearCluster));
    let evict = net.sent[0].last().unwrap().clone();
    assert_eq!((evict.to, evict.target.as_str(), evict.status), (Some(2), "/cluster/acn/evict", Some(200)));
    // From now on nobody talks to C, and C talks to nobody.
    let before: Vec<usize> = net.sent.iter().map(Vec::len).collect();
    net.run_for(2 * MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 1]);
    for i in [0, 1] {
        let later = &net.sent[i][before[i]..];
        assert!(!later.is_empty(), "node {i} keeps heartbeating");
        assert!(later.iter().all(|s| s.to != Some(2) && s.status == Some(200)), "node {i}: {later:?}");
    }
    assert_eq!(net.sent[2].len(), before[2]);
    assert_eq!(net.nodes[2].poll_timeout(), None);
    // A cannot remove itself, nor a node twice.
    let at = net.clock(0);
    let a = net.id(0);
    assert_eq!(net.nodes[0].remove_node(at, a.as_str()).unwrap_err().kind, ErrorKind::Invalid);
    assert_eq!(net.nodes[0].remove_node(at, c.as_str()).unwrap_err().code, "node_removed");
}

/// reference-facts.md weakness 10 ("a join token can re-register an existing node id with a new
/// key"); cluster-runtime.md "Joining".
#[test]
fn a_token_cannot_re_register_an_existing_node_id_with_a_different_key() {
    let mut net = three_nodes();
    let b = net.id(1);
    let token = net.token(0);
    let mut impostor = new_node(1, b.clone(), key_of(200));
    let at = net.clock(0);
    let (reply, done) = net.join_with(&mut impostor, at, 0, &token);
    assert_eq!(reply.status(), 409);
    assert_eq!(code(&reply), "node_exists");
    assert_eq!(done.unwrap_err().kind, ErrorKind::Conflict);
    assert_eq!(impostor.cluster(), None);
    let pinned = net.nodes[0].members().get(&b).unwrap().public_key.clone();
    assert_eq!(pinned, acn::public_key_b64(&net.keys[1].verifying_key()));
    let id = shoal_core::token::JoinToken::parse(&token).unwrap().token_id;
    assert_eq!(net.nodes[0].tokens().get(&id).unwrap().uses, 0, "a refused join does not count as a use");
    net.pump();
    net.run_for(MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
}

/// cluster-runtime.md "Membership" (tombstones 7 days); membership.rs module docs (purged ids
/// are remembered): a removed node id cannot join again, even after its tombstone is purged.
#[test]
fn a_removed_node_cannot_join_again() {
    let mut net = three_nodes();
    let c = net.id(2);
    let at = net.clock(0);
    net.nodes[0].remove_node(at, c.as_str()).unwrap();
    net.pump();
    assert_eq!(net.nodes[2].cluster(), None);

    let (reply, done) = net.join(2, 0);
    assert_eq!((reply.status(), code(&reply)), (409, "node_removed"));
    let e = done.unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::Conflict, "join_refused"));
    assert_eq!(net.nodes[2].cluster(), None);
    // Through the other member too.
    let (reply, _) = net.join(2, 1);
    assert_eq!((reply.status(), code(&reply)), (409, "node_removed"));

    // Eight days later the tombstone is gone, the id is still refused.
    net.run_for(8 * DAY_MS, 10 * MINUTE_MS);
    assert!(net.nodes[0].members().get(&c).is_none(), "tombstone purged");
    assert!(net.nodes[0].members().purged().any(|p| p == &c));
    assert!(net.persisted[0].contains(&PersistOp::PutPurged(c.clone())));
    let (reply, done) = net.join(2, 0);
    assert_eq!((reply.status(), code(&reply)), (409, "node_removed"));
    assert!(done.is_err());
    net.run_for(MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 1]);

    // The same machine with a fresh identity is welcome.
    let mut fresh = new_node(2, id_of(7), key_of(77));
    let token = net.token(0);
    let at = net.clock(2);
    let (reply, done) = net.join_with(&mut fresh, at, 0, &token);
    assert_eq!(reply.status(), 200, "{:?}", reply.body);
    done.unwrap();
    net.nodes[2] = fresh;
    net.pump();
    net.run_for(MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
}

/// cluster-runtime.md ACN `POST /cluster/acn/leave` ("sender leaves").
#[test]
fn a_node_that_leaves_is_removed_on_every_member() {
    let mut net = three_nodes();
    let b = net.id(1);
    let at = net.clock(1);
    let left = net.nodes[1].leave(at).expect("leave");
    assert_eq!(left.json()["told"], 2);
    assert_eq!(net.nodes[1].cluster(), None);
    net.pump();
    for i in [0, 2] {
        let r = net.nodes[i].members().get(&b).expect("tombstone kept");
        assert!(r.removed);
        assert_eq!(r.removal.as_ref().unwrap().by, b, "signed by the leaver");
        assert!(net.events[i].contains(&Event::MemberRemoved(b.clone())));
    }
    let leaves: Vec<&Sent> = net.sent[1].iter().filter(|s| s.target == "/cluster/acn/leave").collect();
    assert_eq!(leaves.len(), 2);
    assert!(leaves.iter().all(|s| s.status == Some(200)), "{leaves:?}");
    assert!(net.persisted[1].contains(&PersistOp::ClearCluster));
    assert!(net.nodes[1].members().is_empty());
    net.run_for(MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 2]);
    // Leaving twice is an error, not a panic.
    let at = net.clock(1);
    assert_eq!(net.nodes[1].leave(at).unwrap_err().code, "not_in_cluster");
}

/// reference-facts.md "Heartbeat": 400 if node.id != signer.
#[test]
fn a_heartbeat_carrying_another_nodes_record_gets_400() {
    let mut net = three_nodes();
    let cluster = net.nodes[0].cluster().cloned();
    let c_record = net.nodes[1].members().get(&net.id(2)).unwrap().clone();
    let body = serde_json::to_vec(&json!({"node": c_record, "cluster": cluster})).unwrap();
    let h = net.signed(1, "POST", "/cluster/acn/heartbeat", &body);
    let at = net.clock(0);
    let r = net.nodes[0].handle_acn(at, "POST", "/cluster/acn/heartbeat", Some(&h), &body);
    assert_eq!((r.status(), code(&r)), (400, "bad_body"));

    // Control: B's own record is accepted and answered with the member list.
    let b_record = net.nodes[1].members().get(&net.id(1)).unwrap().clone();
    let body = serde_json::to_vec(&json!({"node": b_record, "cluster": cluster})).unwrap();
    let h = net.signed(1, "POST", "/cluster/acn/heartbeat", &body);
    let r = net.nodes[0].handle_acn(at, "POST", "/cluster/acn/heartbeat", Some(&h), &body);
    assert_eq!(r.status(), 200);
    assert_eq!(r.body["nodes"].as_array().unwrap().len(), 3);
    // Malformed body from a member: 400, not a panic.
    let h = net.signed(1, "POST", "/cluster/acn/heartbeat", b"{");
    let r = net.nodes[0].handle_acn(at, "POST", "/cluster/acn/heartbeat", Some(&h), b"{");
    assert_eq!(r.status(), 400);
}

/// reference-facts.md "Wire" (verify order; all 401) through `Node::handle_acn`: unsigned,
/// wrong cluster, stale timestamp, unknown or removed sender, bad signature, replay.
#[test]
fn every_acn_rejection_answers_401_through_the_node() {
    let mut net = three_nodes();
    let cluster = net.nodes[0].cluster().unwrap().id.clone();
    let at = net.clock(0);
    let mut rng = SeededRng::new(5);
    let b = net.id(1);

    // The unsigned probe is open, a signed ping from a member passes.
    assert_eq!(net.nodes[0].handle_acn(at, "GET", "/cluster/acn/hello", None, b"").status(), 200);
    let h = net.signed(1, "POST", PING, b"");
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!(r.status(), 200);
    assert_eq!(r.body["node"], json!(b));

    // Replay of that very request.
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "replay"));

    // Unsigned, and signed with a header missing.
    let r = net.nodes[0].handle_acn(at, "POST", PING, None, b"");
    assert_eq!((r.status(), code(&r)), (401, "not_signed"));
    let mut h = net.signed(1, "POST", PING, b"");
    h.nonce.clear();
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "not_signed"));

    // Another cluster.
    let other = ClusterId::new("99999999-9999-4999-8999-999999999999");
    let h = acn::sign_request(&net.keys[1], &b, &other, "POST", PING, b"", at, &mut rng);
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "wrong_cluster"));

    // Six minutes old, six minutes ahead; four minutes ahead (C's clock) is fine.
    for skew in [-6i64, 6] {
        let when = Millis((at.0 as i64 + skew * MINUTE_MS as i64) as u64);
        let h = acn::sign_request(&net.keys[1], &b, &cluster, "POST", PING, b"", when, &mut rng);
        let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
        assert_eq!((r.status(), code(&r)), (401, "clock_skew"), "skew {skew} min");
    }
    let h = net.signed(2, "POST", PING, b"");
    assert_eq!(net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"").status(), 200);

    // A stranger's key under a stranger's id, and under a member's id.
    let stranger = key_of(250);
    let h = acn::sign_request(&stranger, &id_of(50), &cluster, "POST", PING, b"", at, &mut rng);
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "unknown_node"));
    let h = acn::sign_request(&stranger, &b, &cluster, "POST", PING, b"", at, &mut rng);
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "bad_signature"));
    // A body changed in transit.
    let h = net.signed(1, "POST", "/cluster/acn/members/sync", b"{\"nodes\":[]}");
    let r = net.nodes[0].handle_acn(at, "POST", "/cluster/acn/members/sync", Some(&h), b"{\"nodes\":[{}]}");
    assert_eq!((r.status(), code(&r)), (401, "bad_signature"));

    // A removed member, signing properly with its own key, is no longer a member.
    let c = net.id(2);
    net.nodes[0].remove_node(at, c.as_str()).unwrap();
    net.pump();
    let h = acn::sign_request(&net.keys[2], &c, &cluster, "POST", PING, b"", at, &mut rng);
    let r = net.nodes[0].handle_acn(at, "POST", PING, Some(&h), b"");
    assert_eq!((r.status(), code(&r)), (401, "unknown_node"));

    // Not ACN at all, or the wrong method: 404 / 405 before any signature check.
    assert_eq!(net.nodes[0].handle_acn(at, "POST", "/cluster/acn/nope", None, b"").status(), 404);
    assert_eq!(net.nodes[0].handle_acn(at, "GET", PING, None, b"").status(), 405);
    assert_eq!(net.nodes[0].handle_acn(at, "GET", "/v1/status", None, b"").status(), 404);
}

/// cluster-runtime.md "Joining" and ACN `POST /cluster/acn/join` ("405/404/403/400 cases"):
/// a bad secret, a revoked token, another cluster's token and a node outside any cluster.
#[test]
fn a_join_with_a_bad_token_is_refused_with_the_reference_status() {
    let mut net = three_nodes();
    let token = net.token(0);
    let mut t = shoal_core::token::JoinToken::parse(&token).unwrap();
    t.secret = "0".repeat(64);
    let mut newcomer = new_node(5, id_of(5), key_of(55));
    let at = net.clock(0);
    let (reply, done) = net.join_with(&mut newcomer, at, 0, &t.encode());
    assert_eq!((reply.status(), code(&reply)), (403, "bad_token"));
    assert_eq!(done.unwrap_err().kind, ErrorKind::Forbidden);

    let id = shoal_core::token::JoinToken::parse(&token).unwrap().token_id;
    net.nodes[0].revoke_token(id.as_str()).unwrap();
    let (reply, _) = net.join_with(&mut newcomer, at, 0, &token);
    assert_eq!(reply.status(), 403);

    let mut t = shoal_core::token::JoinToken::parse(&token).unwrap();
    t.cluster = ClusterId::new("99999999-9999-4999-8999-999999999999");
    let (reply, _) = net.join_with(&mut newcomer, at, 0, &t.encode());
    assert_eq!((reply.status(), code(&reply)), (404, "unknown_cluster"));

    let mut loner = new_node(6, id_of(6), key_of(66));
    let r = loner.handle_acn(at, "POST", JOIN, None, b"{}");
    assert_eq!(r.status(), 404);
    assert_eq!(newcomer.cluster(), None);
}

/// reference-facts.md weakness 3 ("a node whose clock runs ahead always wins") and
/// cluster-runtime.md "Membership" ("other members may only change its admin state"): C, 4
/// minutes ahead, puts B in maintenance; A, having heard of it, puts B back to active a
/// moment later. A's later write wins on every node, B included.
#[test]
fn an_admin_state_set_after_one_from_a_clock_ahead_wins_everywhere() {
    let mut net = three_nodes();
    let b = net.id(1);
    let at = net.clock(2);
    net.nodes[2].set_admin_state(at, b.as_str(), shoal_core::records::AdminState::Maintenance).unwrap();
    net.pump();
    for i in 0..3 {
        assert_eq!(net.state(i, 1), NodeState::Maintenance, "on node {i}");
    }
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(0);
    net.nodes[0].set_admin_state(at, b.as_str(), shoal_core::records::AdminState::Active).unwrap();
    net.pump();
    net.run_for(MINUTE_MS, SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
    let versions: Vec<_> = (0..3).map(|i| net.nodes[i].members().versions()).collect();
    assert!(versions.iter().all(|v| v == &versions[0]), "{versions:#?}");
    let mark = net.nodes[1].members().get(&b).unwrap().admin.clone().unwrap();
    assert_eq!(mark.by, net.id(0));
}

/// reference-facts.md "Liveness" (DEGRADED at cpu >= 97) and "Heartbeat" (records travel with
/// every heartbeat): a node's own health report reaches its peers with its next heartbeat.
#[test]
fn a_node_reporting_98_percent_cpu_is_degraded_on_its_peers_after_a_heartbeat() {
    let mut net = three_nodes();
    let at = net.clock(1);
    let hot = shoal_core::records::Health {
        cpu_usage: 98.0,
        ram_used: 1,
        ram_total: 10,
        disk_free: 50,
        disk_total: 100,
        uptime: 100,
        timestamp: 0,
    };
    net.nodes[1].handle(at, Input::Health(hot));
    net.pump();
    net.run_for(20 * SECOND_MS, SECOND_MS);
    assert_eq!(net.state(0, 1), NodeState::Degraded);
    assert_eq!(net.state(2, 1), NodeState::Degraded);
    assert_eq!(net.state(1, 1), NodeState::Online, "a node is ONLINE to itself");
    let calm = shoal_core::records::Health { cpu_usage: 5.0, ..Default::default() };
    let at = net.clock(1);
    net.nodes[1].handle(at, Input::Health(calm));
    net.run_for(20 * SECOND_MS, SECOND_MS);
    net.assert_all_online(&[0, 1, 2]);
}

/// cluster-runtime.md "A node is authoritative for its own record": a rename re-signs the
/// owner register and reaches every member.
#[test]
fn a_renamed_node_is_seen_under_its_new_name_everywhere() {
    let mut net = three_nodes();
    let at = net.clock(2);
    net.nodes[2].configure(at, Some("attic"), None).unwrap();
    net.pump();
    for i in 0..3 {
        assert_eq!(net.nodes[i].members().get(&net.id(2)).unwrap().name, "attic", "on node {i}");
    }
    let at = net.clock(2);
    assert_eq!(net.nodes[2].configure(at, Some(""), None).unwrap_err().kind, ErrorKind::Invalid);
}

/// cluster-runtime.md ACN `POST /cluster/acn/evict` and "Removed nodes stay as tombstones ...
/// so the removal propagates": a node that was down when it was removed misses the evict; the
/// first member that refuses its heartbeat (401) shows it its signed removal, and it leaves.
#[test]
fn a_node_removed_while_it_was_down_leaves_when_it_comes_back() {
    let mut net = three_nodes();
    let c = net.id(2);
    net.down[2] = true;
    let at = net.clock(0);
    net.nodes[0].remove_node(at, c.as_str()).unwrap();
    net.pump();
    let evict = net.sent[0].last().unwrap().clone();
    assert_eq!((evict.to, evict.target.as_str()), (None, "/cluster/acn/evict"), "the evict found nobody");
    net.run_for(MINUTE_MS, SECOND_MS);
    assert!(net.nodes[2].cluster().is_some(), "C does not know yet");

    net.down[2] = false;
    net.run_for(20 * SECOND_MS, SECOND_MS);
    let refused: Vec<&Sent> = net.sent[2].iter().filter(|s| s.status == Some(401)).collect();
    assert!(!refused.is_empty() && refused.iter().all(|s| s.code == "unknown_node"), "{refused:?}");
    assert_eq!(net.nodes[2].cluster(), None, "C learnt of its removal and left");
    assert!(net.events[2].contains(&Event::RemovedSelf));
    let quiet = net.sent[2].len();
    net.run_for(MINUTE_MS, SECOND_MS);
    assert_eq!(net.sent[2].len(), quiet, "and stopped heartbeating");
    net.assert_all_online(&[0, 1]);
}

/// A drop is never authorised by copies on an UNKNOWN or OFFLINE node: the planner still
/// counts them for a while (no extra copy for a short absence), but a delete needs copies on
/// nodes reachable now.
#[test]
fn a_drop_does_not_count_a_copy_on_an_unknown_or_offline_node() {
    use shoal_core::hlc::Version;
    use shoal_core::meta::records::{FileRecord, Location, LocationState, Record};
    use shoal_core::{FileId, VolumeId};
    let mut net = three_nodes();
    let at = net.clock(0);
    let v = Version { wall_ms: at.0, counter: 0, node: net.id(0) };
    let loc = |vol: &str, node: NodeId| Location {
        volume_id: VolumeId::new(vol),
        node_id: node,
        state: LocationState::Verified,
        checksum: "a".repeat(64),
        updated: v.clone(),
        content: None,
    };
    let f = FileRecord {
        id: FileId::new("f1"),
        path: "/x".into(),
        is_dir: false,
        size: 1,
        mod_time: 0,
        checksum: "a".repeat(64),
        owner: String::new(),
        primary: None,
        locations: vec![loc("v0", net.id(0)), loc("v2", net.id(2))],
        replicas: 1,
        removed: false,
        version: v.clone(),
        repl: None,
        based_on: None,
    };
    let v0 = VolumeId::new("v0");
    // Node 2 up: its copy lets node 0 drop its own.
    assert!(net.nodes[0].check_drop(at, &f, &v0).is_ok());
    // Node 2 silent for a minute (UNKNOWN), then OFFLINE: its copy no longer counts.
    net.down[2] = true;
    net.run_for(MINUTE_MS, SECOND_MS);
    let at = net.clock(0);
    assert_eq!(net.state(0, 2), NodeState::Unknown);
    let e = net.nodes[0].check_drop(at, &f, &v0).unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::Conflict, "not_authorized"));
    net.run_for(3 * MINUTE_MS, SECOND_MS);
    let at = net.clock(0);
    assert_eq!(net.state(0, 2), NodeState::Offline);
    let e = net.nodes[0].check_drop(at, &f, &v0).unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::Conflict, "not_authorized"));
    // A copy on an ONLINE node does.
    let mut g = f.clone();
    g.locations.push(loc("v1", net.id(1)));
    assert!(net.nodes[0].check_drop(at, &g, &v0).is_ok());
    // Copies count once per node: with two wanted, a second copy on node 1 is no second node.
    let mut h = g.clone();
    h.replicas = 2;
    h.locations.push(loc("v1b", net.id(1)));
    let e = net.nodes[0].check_drop(at, &h, &v0).unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::Conflict, "not_authorized"));
    // Node 1 may let its second copy go: it still holds one, and node 0 another.
    assert!(net.nodes[1].check_drop(net.clock(1), &h, &VolumeId::new("v1b")).is_ok());
    let _ = Record::File(g);
}

/// Issue 18 "Failover": a leader that dies is passed over once its lease (30 s) has run out on
/// the survivors, while it still counts as ONLINE to them (heard from within 45 s): the next
/// member claims then, not only once the dead one stops being ONLINE.
#[test]
fn a_dead_leader_is_replaced_when_its_lease_runs_out_not_when_it_stops_being_online() {
    let mut net = Net::new(&[0, 0, 0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "home").expect("create");
    net.pump();
    for j in [1, 2] {
        let (reply, done) = net.join(j, 0);
        assert_eq!(reply.status(), 200, "{:?}", reply.body);
        done.expect("joins");
    }
    net.run_for(2 * MINUTE_MS, SECOND_MS);
    let leader = |net: &Net, i: usize| net.nodes[i].meta_status(net.clock(i)).meta.leader;
    let old = leader(&net, 0).expect("a leader");
    let dead = (0..3).find(|&i| net.id(i) == old).unwrap();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != dead).collect();
    net.down[dead] = true;
    let mut took = None;
    for s in 1..=120u64 {
        net.run_for(SECOND_MS, SECOND_MS);
        let views: Vec<_> = survivors.iter().map(|&i| leader(&net, i)).collect();
        if views[0].as_ref().is_some_and(|l| *l != old) && views[0] == views[1] {
            took = Some(s);
            // It is still ONLINE to them: the claim did not wait for that to end.
            assert_eq!(net.state(survivors[0], dead), NodeState::Online, "after {s} s");
            break;
        }
    }
    let took = took.expect("a new leader within two minutes");
    assert!(took <= 40, "failover took {took} s with a 30 s lease");
}

/// Issue 17 (the soak): the audit log keeps its newest entries only. Every admin act used to add
/// a record for ever, so a node's memory and database grew with the number of acts.
#[test]
fn the_audit_log_keeps_its_newest_entries_only() {
    use shoal_core::node::audit::{APPEND_LOG_KEEP, AUDIT_BATCH_MAX};
    let mut net = Net::new(&[0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "home").expect("create");
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let extra = 600;
    let total = APPEND_LOG_KEEP + extra;
    for i in 0..total {
        let at = net.clock(0);
        net.nodes[0].audit(at, &format!("act {i}"), "admin", 200);
        if i % 1000 == 0 {
            net.now = net.now.plus(1);
        }
    }
    net.pump();
    let count = |net: &Net| net.nodes[0].audit_list(usize::MAX).audit.len();
    // Every act is listed: full batches as records, the rest waiting its 20 ms.
    assert_eq!(count(&net), total);
    let recorded = |net: &Net| {
        let m = net.nodes[0].meta();
        m.state().of_kind_under(shoal_core::meta::records::RecordKind::Setting, "config/audit/").count()
    };
    assert_eq!(recorded(&net), total / AUDIT_BATCH_MAX);
    net.run_for(30 * SECOND_MS, SECOND_MS);
    // Whole records go: the newest 10,000 acts stay, with at most one record's worth more.
    let kept = count(&net);
    assert!((APPEND_LOG_KEEP..APPEND_LOG_KEEP + AUDIT_BATCH_MAX).contains(&kept), "kept {kept}");
    let newest = net.nodes[0].audit_list(1).audit[0]["act"].clone();
    assert_eq!(newest, json!(format!("act {}", total - 1)));
    let oldest = net.nodes[0].audit_list(usize::MAX).audit.last().unwrap()["act"].clone();
    assert_eq!(oldest, json!(format!("act {}", total - kept)));
}

/// Issue 18: the acts a node sees within `linger_ms` go as one audit record (at most
/// `AUDIT_BATCH_MAX` acts each), not one record per act, so an admin write is one replicated
/// record and not two; every act still reaches the other nodes, in order.
#[test]
fn audit_acts_travel_in_batches() {
    use shoal_core::meta::records::{Record, RecordKind};
    use shoal_core::node::audit::{AUDIT_BATCH_MAX, AUDIT_PREFIX};
    let mut net = three_nodes();
    let records = |net: &Net, i: usize| {
        net.nodes[i]
            .meta()
            .state()
            .of_kind_under(RecordKind::Setting, AUDIT_PREFIX)
            .filter(|r| matches!(r, Record::Setting(s) if !s.removed))
            .count()
    };
    let before = records(&net, 0);
    // 150 acts at once: two full records and one of the rest, once linger_ms has passed.
    for i in 0..150 {
        let at = net.clock(1);
        net.nodes[1].audit(at, &format!("burst {i}"), "admin", 200);
    }
    net.pump();
    assert_eq!(records(&net, 1), before + 2, "full batches go at once");
    assert_eq!(net.nodes[1].audit_list(1).audit[0]["act"], json!("burst 149"), "the node shows its own acts at once");
    net.run_for(SECOND_MS, 10);
    for i in 0..3 {
        assert_eq!(records(&net, i), before + 3, "node {i}: 150 acts are three records");
        let acts = net.nodes[i].audit_list(150).audit;
        let names: Vec<String> = acts.iter().rev().map(|a| a["act"].as_str().unwrap().to_string()).collect();
        assert_eq!(names, (0..150).map(|n| format!("burst {n}")).collect::<Vec<_>>(), "node {i}: every act, in order");
    }
    assert_eq!(150 / AUDIT_BATCH_MAX, 2);
    // Acts further apart than linger_ms are records of their own.
    for i in 0..2 {
        let at = net.clock(1);
        net.nodes[1].audit(at, &format!("apart {i}"), "admin", 200);
        net.run_for(SECOND_MS, 10);
    }
    assert_eq!(records(&net, 0), before + 5);
    assert_eq!(net.nodes[0].audit_list(1).audit[0]["act"], json!("apart 1"));
}

/// The metadata leader's index and a follower's, as node 0 sees them.
fn leader_and_follower(net: &Net) -> (usize, usize) {
    let leader = net.nodes[0].meta_status(net.clock(0)).meta.leader.expect("a leader");
    let l = (0..3).find(|&i| net.id(i) == leader).unwrap();
    (l, (0..3).find(|&i| i != l).unwrap())
}

/// Issue 18 "Acknowledged means safe": on a single-node install no other node can hold a change,
/// so it is answered `alone` (the shell waits for the store's commit), never `replicated` at once
/// (it was, before anything was on the node's disk: the log counts a lone leader's entries held).
#[test]
fn a_single_node_install_acknowledges_alone() {
    use shoal_core::node::AckReached;
    let mut net = Net::new(&[0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "one").expect("create");
    net.run_for(MINUTE_MS, SECOND_MS);
    let from = net.nodes[0].ack_position();
    let at = net.clock(0);
    net.nodes[0].setting_set(at, "on.one", Some(json!(1))).expect("set");
    let plan = net.nodes[0].ack_plan(from);
    assert_eq!(net.nodes[0].ack_ready(at, &plan), Some(AckReached::Alone));
}

/// Issue 18 "Acknowledged means safe": a change is ready to acknowledge only once another node
/// holds it — through a follower, once the leader took its submit; through the leader, once a
/// follower answered the append carrying it — and at once when no other member is alive.
#[test]
fn a_change_is_acknowledged_only_once_another_node_holds_it() {
    use shoal_core::node::AckReached;
    let mut net = three_nodes();
    let (l, f) = leader_and_follower(&net);
    for (who, key) in [(f, "through.follower"), (l, "through.leader")] {
        let from = net.nodes[who].ack_position();
        let at = net.clock(who);
        net.nodes[who].setting_set(at, key, Some(json!(1))).expect("set");
        let plan = net.nodes[who].ack_plan(from);
        let at = net.clock(who);
        assert_eq!(net.nodes[who].ack_ready(at, &plan), None, "{key}: nobody else holds it yet");
        net.pump();
        let at = net.clock(who);
        assert_eq!(net.nodes[who].ack_ready(at, &plan), Some(AckReached::Replicated), "{key}");
        let other = (0..3).find(|&i| i != who).unwrap();
        assert!(net.nodes[other].setting_get(key).is_ok(), "{key} is on another node when acknowledged");
    }
    // Alone: every other member down long enough not to count as alive.
    let lone = l;
    for i in (0..3).filter(|&i| i != lone) {
        net.down[i] = true;
    }
    net.run_for(5 * MINUTE_MS, SECOND_MS);
    let from = net.nodes[lone].ack_position();
    let at = net.clock(lone);
    net.nodes[lone].setting_set(at, "alone", Some(json!(1))).expect("set");
    let plan = net.nodes[lone].ack_plan(from);
    let at = net.clock(lone);
    assert_eq!(net.nodes[lone].ack_ready(at, &plan), Some(AckReached::Alone));
}

/// Issue 18: a change whose record the leader refuses (stamped by a clock that ran more than
/// 15 minutes ahead and was then set right) is on this node only: its acknowledgement says
/// `Refused` as soon as the leader's answer names it, never `Replicated`.
#[test]
fn a_change_the_leader_refuses_is_acknowledged_as_refused() {
    use shoal_core::node::AckReached;
    let mut net = three_nodes();
    let (_, f) = leader_and_follower(&net);
    let from = net.nodes[f].ack_position();
    let ahead = Millis(net.clock(f).0 + 20 * MINUTE_MS);
    net.nodes[f].setting_set(ahead, "skewed", Some(json!(1))).expect("set");
    let plan = net.nodes[f].ack_plan(from);
    for _ in 0..4 {
        net.run_for(20 * SECOND_MS, SECOND_MS);
    }
    let at = net.clock(f);
    assert_eq!(net.nodes[f].ack_ready(at, &plan), Some(AckReached::Refused));
    let other = (0..3).find(|&i| i != f).unwrap();
    assert!(net.nodes[other].setting_get("skewed").is_err(), "no other node took it");
}

/// Issue 18: a request waiting for its change to be held elsewhere is woken only when
/// `held_progress` moves (not by every input the node takes), so that fingerprint must move
/// whenever a change becomes held (through a follower and through the leader), and stay put
/// when the node only makes another change that no one holds yet.
#[test]
fn held_progress_moves_when_a_change_becomes_held_and_not_when_another_is_only_made() {
    let mut net = three_nodes();
    let (l, f) = leader_and_follower(&net);
    for (who, key) in [(f, "moves.follower"), (l, "moves.leader")] {
        let from = net.nodes[who].ack_position();
        let at = net.clock(who);
        net.nodes[who].setting_set(at, key, Some(json!(1))).expect("set");
        let plan = net.nodes[who].ack_plan(from);
        let before = net.nodes[who].held_progress();
        let at = net.clock(who);
        net.nodes[who].setting_set(at, &format!("{key}.another"), Some(json!(2))).expect("set");
        assert_eq!(net.nodes[who].held_progress(), before, "{key}: another change made, none held");
        assert_eq!(net.nodes[who].ack_ready(at, &plan), None);
        net.pump();
        let at = net.clock(who);
        assert!(net.nodes[who].ack_ready(at, &plan).is_some(), "{key}: held now");
        assert_ne!(net.nodes[who].held_progress(), before, "{key}: held, so the waiters must look again");
    }
}

/// Issue 16 "Wake-on-LAN": a node reports its MAC addresses in its capabilities; waking it asks
/// every other reachable member to broadcast the packet (and this node broadcasts it too); a
/// member broadcasts only for MAC addresses some member reported.
#[test]
fn wake_asks_the_reachable_members_and_a_member_wakes_only_members() {
    let mut net = three_nodes();
    let caps = shoal_core::records::Capabilities { macs: vec!["02:00:00:00:00:0c".into()], ..Default::default() };
    let at = net.clock(2);
    net.nodes[2].handle(at, Input::Capabilities(caps));
    net.run_for(MINUTE_MS, SECOND_MS);
    while net.nodes[0].poll_output().is_some() {}
    let c = net.id(2).to_string();

    let at = net.clock(0);
    let plan = net.nodes[0].wake_plan(at, &c).expect("a plan");
    assert_eq!(plan.macs, vec!["02:00:00:00:00:0c".to_string()]);
    assert_eq!(plan.ask, vec![net.id(1)], "every reachable member but the sleeper");
    let outs: Vec<_> = std::iter::from_fn(|| net.nodes[0].poll_output()).collect();
    assert!(
        outs.iter().any(|o| matches!(o, shoal_core::node::Output::WakeBroadcast { macs } if macs == &plan.macs)),
        "the asking node broadcasts too"
    );
    // Nothing to wake it by, and not itself.
    let b = net.id(1).to_string();
    assert_eq!(net.nodes[0].wake_plan(at, &b).unwrap_err().code, "no_mac");
    let a = net.id(0).to_string();
    assert_eq!(net.nodes[0].wake_plan(at, &a).unwrap_err().code, "is_self");

    // The asked member broadcasts a member's address, and refuses a stranger's.
    for (macs, status) in [(json!(["02:00:00:00:00:0c"]), 200), (json!(["02:00:00:00:00:99"]), 403), (json!([]), 400)] {
        let body = json!({ "macs": macs }).to_string().into_bytes();
        let h = net.signed(0, "POST", "/cluster/acn/wake", &body);
        let at = net.clock(1);
        while net.nodes[1].poll_output().is_some() {}
        let r = net.nodes[1].handle_acn(at, "POST", "/cluster/acn/wake", Some(&h), &body);
        assert_eq!(r.status(), status, "{macs}: {:?}", r.body);
        let sent = std::iter::from_fn(|| net.nodes[1].poll_output())
            .any(|o| matches!(o, shoal_core::node::Output::WakeBroadcast { .. }));
        assert_eq!(sent, status == 200, "{macs}");
    }
}

/// An argon2id PHC string (the identity tests never check a password against it).
const H1: &str = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";

/// A creates the cluster and B joins through it (every clock true): A is the identity origin.
fn two_nodes() -> Net {
    let mut net = Net::new(&[0, 0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, "home").expect("create");
    net.pump();
    let (reply, done) = net.join(1, 0);
    assert_eq!(reply.status(), 200, "{:?}", reply.body);
    done.expect("joins");
    net
}

/// Issue 15 "One sign-on": a member copies the origin's (the creator's) directory on its
/// timer; with the origin down the sync fails and says so, a password set on the member is
/// kept, and once the origin is back the member writes it back there.
#[test]
fn a_member_mirrors_the_origin_and_writes_a_password_back_after_an_outage() {
    const H2: &str = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$b3RoZXJvdGhlcm90aGVyMQ";
    let mut net = two_nodes();
    assert_eq!(net.nodes[1].identity_origin(), Some(net.id(0)));
    assert!(net.nodes[0].is_identity_origin() && !net.nodes[1].is_identity_origin());
    let at = net.clock(0);
    net.nodes[0]
        .identity_mut(|i, _| i.add_account(at, "anna", shoal_core::identity::Role::User, Default::default(), H1.into()))
        .unwrap();
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let mirrored = net.nodes[1].identity().account("anna").cloned().expect("mirrored within the first sync");
    assert!(mirrored.mirrored && mirrored.hash == H1);

    net.down[0] = true;
    let at = net.clock(1);
    net.nodes[1].identity_mut(|i, _| i.set_password_pending(at, "anna", H2.into(), None)).unwrap();
    net.run_for(6 * MINUTE_MS, SECOND_MS);
    assert!(net.nodes[1].identity_status()["lastSyncError"].is_string(), "{}", net.nodes[1].identity_status());
    assert_eq!(net.nodes[1].identity().writebacks().len(), 1);
    assert_eq!(net.nodes[1].identity().account("anna").unwrap().hash, H2);

    net.down[0] = false;
    net.run_for(6 * MINUTE_MS, SECOND_MS);
    assert_eq!(net.nodes[0].identity().account("anna").unwrap().hash, H2, "written back");
    assert!(net.nodes[1].identity().writebacks().is_empty());
    assert_eq!(net.nodes[1].identity_status()["lastSyncError"], json!(null));

    // Asked before a password is hashed: adding a name known here (mirrored) is a conflict on
    // either node; a password for an unknown name is refused at the origin, and on the member
    // carried to the origin, which judges it.
    for n in 0..2 {
        assert_eq!(net.nodes[n].password_act_check("anna", true).unwrap_err().code, "user_exists");
        assert!(net.nodes[n].password_act_check("anna", false).is_ok());
        assert!(net.nodes[n].password_act_check("bo", true).is_ok());
    }
    assert_eq!(net.nodes[0].password_act_check("bo", false).unwrap_err().code, "no_such_user");
    assert!(net.nodes[1].password_act_check("bo", false).is_ok(), "the origin judges it");
}

/// Issue 15 "One sign-on": moving the identity origin is a trusted act (weakness 10: any
/// member could set it). A direct set is refused; an approved proposal moves it, and the old
/// origin then copies the new one's directory.
#[test]
fn the_identity_origin_moves_only_by_an_approved_proposal() {
    use shoal_core::config::resolve::Level;
    let mut net = two_nodes();
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let (a, b) = (net.id(0), net.id(1));
    assert_eq!(net.nodes[1].identity_origin(), Some(a.clone()));
    let level = Level::Mesh { key: "identity.origin".into() };
    let at = net.clock(1);
    let refused = net.nodes[1].config_set(at, &level, Some(&json!(b.to_string())), "mine now", "op").unwrap_err();
    assert_eq!(refused.code, "trusted_key", "{refused:?}");
    let p = net.nodes[1].config_propose(at, &level, Some(&json!(b.to_string())), "move the origin", "op1").unwrap();
    net.run_for(10 * SECOND_MS, SECOND_MS);
    assert_eq!(net.nodes[0].identity_origin(), Some(a.clone()), "not moved before the approval");
    let at = net.clock(0);
    net.nodes[0].config_answer(at, &p.id, true, None, "op2").expect("approved");
    net.run_for(20 * SECOND_MS, SECOND_MS);
    for i in 0..2 {
        assert_eq!(net.nodes[i].identity_origin(), Some(b.clone()), "node {i}");
    }
    assert!(net.nodes[1].is_identity_origin() && !net.nodes[0].is_identity_origin());
    let at = net.clock(1);
    net.nodes[1]
        .identity_mut(|i, _| i.add_account(at, "cy", shoal_core::identity::Role::User, Default::default(), H1.into()))
        .unwrap();
    // At the next sync (identity.sync_every, 5 min by default).
    net.run_for(5 * MINUTE_MS + 5 * SECOND_MS, SECOND_MS);
    assert!(net.nodes[0].identity().account("cy").is_some_and(|a| a.mirrored), "the old origin mirrors the new one");
}

/// Issue 15: an account act a member carries to the origin names who asked in a user
/// assertion for the origin; without one that holds, or from a user acting on another
/// account, the origin refuses it.
#[test]
fn the_origin_takes_account_acts_only_with_a_user_assertion_that_allows_them() {
    use shoal_core::identity::{AdminAct, Principal, Role};
    use shoal_core::node::identity::ActRequest;
    let mut net = two_nodes();
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let origin = net.id(0);
    let at = net.clock(0);
    net.nodes[0].identity_mut(|i, _| i.add_account(at, "anna", Role::User, Default::default(), H1.into())).unwrap();
    let target = "/cluster/acn/auth/admin";
    let send = |net: &mut Net, who: Option<Principal>, act: AdminAct, assertion_for: NodeId| {
        let at = net.clock(1);
        let assertion = match who {
            Some(p) => net.nodes[1].user_assertion(at, &p, &assertion_for).unwrap(),
            None => "not.an-assertion".into(),
        };
        let body = serde_json::to_vec(&ActRequest { act, assertion }).unwrap();
        let h = net.signed(1, "POST", target, &body);
        let at = net.clock(0);
        let r = net.nodes[0].handle_acn(at, "POST", target, Some(&h), &body);
        (r.status(), code(&r).to_string())
    };
    let anna = Principal { user: Some("anna".into()), role: Role::User, credential: None };
    let rm = AdminAct::Remove { name: "anna".into() };
    assert_eq!(send(&mut net, None, rm.clone(), origin.clone()), (401, "bad_user_assertion".into()));
    // An assertion for another node is not for the origin.
    let other = net.id(1);
    assert_eq!(send(&mut net, Some(Principal::root()), rm.clone(), other).0, 401);
    // A user may set their own password, nothing else.
    assert_eq!(send(&mut net, Some(anna.clone()), rm.clone(), origin.clone()), (403, "admin_only".into()));
    let own = AdminAct::Password { name: "anna".into(), hash: H1.into() };
    assert_eq!(send(&mut net, Some(anna), own, origin.clone()).0, 200);
    assert_eq!(send(&mut net, Some(Principal::root()), rm, origin.clone()).0, 200);
    assert!(net.nodes[0].identity().account("anna").is_none());
    // A local-only account of the member is changed there, never at the origin's namesake.
    let at = net.clock(1);
    net.nodes[1].identity_mut(|i, _| i.add_account(at, "loc", Role::Admin, Default::default(), H1.into())).unwrap();
    assert_eq!(net.nodes[1].act_route("loc"), None);
    assert_eq!(net.nodes[1].act_route("someone").map(|(o, _)| o), Some(origin));
    // Jobs: the admin token's run as an admin, a lesser key's and a user's do not, and only an
    // admin's job may run host programs.
    let n = &net.nodes[1];
    assert!(n.principal_of_owner("@admin-token").is_admin());
    let lesser = Principal { user: None, role: Role::User, credential: None };
    assert!(!n.principal_of_owner(lesser.name()).is_admin());
    assert!(n.principal_of_owner("loc").is_admin(), "an account as it is on this node");
    assert!(!n.principal_of_owner("nobody-here").is_admin());
    assert!(n.job_may_exec(&Principal::root()) && !n.job_may_exec(&lesser));
    // A sealed login is checked only at the origin, for the audience and account it names.
    let (o, me) = (net.id(0), net.id(1));
    assert!(net.nodes[0].sealed_login_fits("anna", "anna", o.as_str()).is_ok());
    assert_eq!(net.nodes[0].sealed_login_fits("anna", "bo", o.as_str()).unwrap_err().code, "bad_sealed");
    assert_eq!(net.nodes[0].sealed_login_fits("anna", "anna", me.as_str()).unwrap_err().code, "bad_sealed");
    assert_eq!(net.nodes[1].sealed_login_fits("anna", "anna", me.as_str()).unwrap_err().code, "not_origin");
    // What a member makes of the origin's answer: only "wrong" refuses, only a backoff waits.
    use shoal_core::node::identity::{forwarded, Forwarded};
    assert_eq!(forwarded(None), Forwarded::Vouched);
    assert_eq!(forwarded(Some(ErrorKind::Unauthorized)), Forwarded::Refused);
    assert_eq!(forwarded(Some(ErrorKind::TooMany)), Forwarded::Backoff);
    for k in [ErrorKind::Conflict, ErrorKind::Invalid, ErrorKind::PeerFailed, ErrorKind::Internal] {
        assert_eq!(forwarded(Some(k)), Forwarded::Unreachable, "{k:?}");
    }
    // Only a mirrored account's password waits for a write-back.
    assert!(!net.nodes[1].keeps_for_writeback("loc"));
}

/// Three nodes in one cluster, A (node 0) leading, each with one volume of `size(i)` =
/// (capacity, free) bytes, after a minute for the volumes and the lease to settle.
fn three_nodes_with_volumes(
    name: &str,
    size: impl Fn(usize) -> (u64, u64),
) -> (Net, Vec<shoal_core::meta::records::Volume>) {
    let mut net = Net::new(&[0, 0, 0]);
    let at = net.clock(0);
    net.nodes[0].create_cluster(at, name).expect("create");
    net.pump();
    for j in [1, 2] {
        net.join(j, 0).1.expect("joins");
    }
    let mut volumes = Vec::new();
    for i in 0..3 {
        let at = net.clock(i);
        let facts = shoal_core::node::volumes::FolderFacts::default();
        let (capacity, free) = size(i);
        volumes.push(net.nodes[i].volume_add(at, &format!("/srv/n{i}"), &facts, "", capacity, free).expect("a volume"));
    }
    net.run_for(MINUTE_MS, SECOND_MS);
    (net, volumes)
}

/// One `store/place` places several copies, each on another node, as that many single calls
/// would (the writer's own node first), fewer when no more nodes fit; a count out of bounds is
/// refused, and only the leader places.
#[test]
fn one_placement_call_places_every_copy_on_distinct_nodes() {
    let (mut net, _) = three_nodes_with_volumes("place", |_| (1 << 40, 1 << 39));
    let at = net.clock(0);
    assert!(net.nodes[0].leader_term(at).is_some(), "A leads");
    let a = net.id(0);
    let mut place = |count: serde_json::Value| {
        let body = json!({"size": 4096, "writer": a, "count": count}).to_string();
        net.nodes[0].place_for_self(at, body.as_bytes())
    };
    let r = place(json!(3));
    assert!(r.refused.is_none(), "{}", r.body);
    let nodes: Vec<&str> = r.body["copies"].as_array().unwrap().iter().map(|c| c["nodeId"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[0], a.as_str(), "the writer's own node first");
    assert_eq!(r.body["nodeId"].as_str(), Some(nodes[0]), "the top-level fields are the first copy's");
    let mut distinct = nodes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "each copy on another node: {nodes:?}");
    let r = place(json!(5));
    assert_eq!(r.body["copies"].as_array().map(Vec::len), Some(3), "fewer when no more nodes fit");
    assert_eq!(code(&place(json!(0))), "bad_count");
    assert_eq!(code(&place(json!(17))), "bad_count");
    let one = place(serde_json::Value::Null);
    assert_eq!(one.body["copies"].as_array().map(Vec::len), Some(1), "one copy by default");
    let at = net.clock(1);
    let body = json!({"size": 4096, "count": 2}).to_string();
    assert_eq!(code(&net.nodes[1].place_for_self(at, body.as_bytes())), "not_leader");
}

/// A follower places a single copy on its own volume without asking the leader when the
/// placement the leader runs, run with the follower's view, puts it there, and the same volume
/// the leader would name; otherwise (another node ranks first, its volume is read-only or too
/// small, it holds a copy already, it leads) it does not decide and the writer asks the leader.
#[test]
fn a_follower_places_its_own_copy_only_when_placement_puts_it_there() {
    // B's volume is small (1 of 2 GiB free), the others large.
    let (mut net, volumes) =
        three_nodes_with_volumes("place-here", |i| if i == 1 { (2 << 30, 1 << 30) } else { (1 << 40, 1 << 39) });
    let at = net.clock(0);
    assert!(net.nodes[0].leader_term(at).is_some(), "A leads");
    let b = net.id(1);

    let at = net.clock(1);
    let here = net.nodes[1].place_here(at, 4096, None, &[]);
    assert_eq!(here.as_ref(), Some(&volumes[1].id), "B's own volume");
    let at0 = net.clock(0);
    let body = json!({"size": 4096, "writer": b}).to_string();
    let leader = net.nodes[0].place_for_self(at0, body.as_bytes());
    assert_eq!(leader.body["volumeId"].as_str(), here.as_ref().map(|v| v.as_str()), "what the leader would name");

    assert_eq!(net.nodes[1].place_here(at, 4096, None, std::slice::from_ref(&b)), None, "B holds a copy already");
    assert_eq!(net.nodes[1].place_here(at, 2 << 30, None, &[]), None, "too large for B's volume");
    assert_eq!(net.nodes[0].place_here(at0, 4096, None, &[]), None, "the leader places through store/place");

    // B's volume read-only: another node ranks first, so B asks the leader.
    net.nodes[1].volume_set_read_only(at, volumes[1].id.as_str(), true).expect("read-only");
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let at = net.clock(1);
    assert_eq!(net.nodes[1].place_here(at, 4096, None, &[]), None, "B's only volume is read-only");
}

/// The record of `path` as node `i` holds it: (removed, first 8 hex digits of the content).
fn file_at(net: &Net, i: usize, path: &str) -> Option<(bool, String)> {
    net.nodes[i].meta().state().file(path).map(|f| (f.removed, f.checksum.chars().take(8).collect()))
}

/// `mv /data/f1 /data/m1` (`op` "move") or `rm /data/f1` through node `s`: what its
/// acknowledgement waits for.
fn move_or_remove(net: &mut Net, s: usize, op: &str) -> shoal_core::node::meta::AckPlan {
    let from = net.nodes[s].ack_position();
    let at = net.clock(s);
    match op {
        "move" => drop(net.nodes[s].file_move(at, "/data/f1", "/data/m1").expect("move")),
        _ => drop(net.nodes[s].file_remove(at, "/data/f1", false).expect("remove")),
    }
    net.nodes[s].ack_plan(from)
}

/// The found-and-fixed loss of an acknowledged overwrite (simulator `--drive --overwrites`
/// seeds 3329 and 3357): a file overwritten through one node and acknowledged (`replicated`:
/// the leader holds it), then moved or removed through a node whose records had not caught up
/// yet. That node decided from the old content and wrote a tombstone (and, for a move, the new
/// path's record) under versions newer than the overwrite's, so last-writer-wins dropped the
/// acknowledged overwrite everywhere. Now such records carry what they were decided from
/// (`BasedOn`); the leader refuses them by name while it holds a newer record there, the
/// deciding node undoes its change and takes the leader's record, its client is told
/// `Changed` (a 409), and nothing on disk follows the change before the leader takes it.
/// Once the node's records have caught up, the same change is taken.
#[test]
fn a_move_or_remove_decided_from_records_behind_an_acknowledged_overwrite_is_refused_and_undone() {
    use shoal_core::ids::VolumeId;
    use shoal_core::node::AckReached;
    for op in ["move", "remove"] {
        let (mut net, volumes) = three_nodes_with_volumes("stale", |_| (1 << 40, 1 << 39));
        let (l, f) = leader_and_follower(&net);
        let s = (0..3).find(|&i| i != l && i != f).unwrap();
        let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
        let (old, new) = ("a".repeat(64), "b".repeat(64));
        let at = net.clock(f);
        net.nodes[f].file_publish(at, "/data/f1", 10, &old, at.0, &copies).expect("put");
        net.run_for(5 * SECOND_MS, SECOND_MS);
        // The stale node is cut off while the file is overwritten through another, and the
        // overwrite is acknowledged.
        net.down[s] = true;
        let from = net.nodes[f].ack_position();
        let at = net.clock(f);
        net.nodes[f].file_publish(at, "/data/f1", 10, &new, at.0, &copies).expect("overwrite");
        let plan = net.nodes[f].ack_plan(from);
        net.pump();
        assert_eq!(net.nodes[f].ack_ready(net.clock(f), &plan), Some(AckReached::Replicated));
        // It comes back and, before its records catch up, is asked to move or remove the file.
        net.down[s] = false;
        assert_eq!(file_at(&net, s, "/data/f1"), Some((false, "aaaaaaaa".into())), "{op}: its records lag");
        let plan = move_or_remove(&mut net, s, op);
        assert!(
            net.nodes[s].disk_actions().is_empty(),
            "{op}: no copy is renamed or deleted before the leader takes it"
        );
        net.pump();
        assert_eq!(net.nodes[s].ack_ready(net.clock(s), &plan), Some(AckReached::Changed), "{op}");
        net.run_for(MINUTE_MS, SECOND_MS);
        for i in 0..3 {
            assert_eq!(
                file_at(&net, i, "/data/f1"),
                Some((false, "bbbbbbbb".into())),
                "{op}: n{i} keeps the overwrite"
            );
            assert!(file_at(&net, i, "/data/m1").is_none(), "{op}: n{i} has nothing at the new path");
        }
        assert!(net.nodes[s].disk_actions().is_empty(), "{op}: nothing left to do on disk");
        let digest = |i: usize| net.nodes[i].meta().state().digest();
        assert!(digest(0) == digest(1) && digest(1) == digest(2), "{op}: the records agree");
        // Caught up, the same change is taken.
        let plan = move_or_remove(&mut net, s, op);
        net.pump();
        assert_eq!(net.nodes[s].ack_ready(net.clock(s), &plan), Some(AckReached::Replicated), "{op}");
        net.run_for(10 * SECOND_MS, SECOND_MS);
        for i in 0..3 {
            assert_eq!(file_at(&net, i, "/data/f1").map(|r| r.0), Some(true), "{op}: n{i}");
            let moved = file_at(&net, i, "/data/m1");
            match op {
                "move" => assert_eq!(moved, Some((false, "bbbbbbbb".into())), "n{i}: the overwrite moved"),
                _ => assert!(moved.is_none()),
            }
        }
    }
}

/// A second move decided on the stale node from the first (`f1 -> m1`, then `m1 -> m2`, the
/// second waiting behind the first's submit) is undone with it when the leader refuses the
/// first: the leader never held `m1` and would take the second, which would bring the old
/// content back at `m2`.
#[test]
fn a_move_decided_from_a_refused_move_is_undone_with_it() {
    use shoal_core::ids::VolumeId;
    use shoal_core::node::AckReached;
    let (mut net, volumes) = three_nodes_with_volumes("chain", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let s = (0..3).find(|&i| i != l && i != f).unwrap();
    let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &copies).expect("put");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    net.down[s] = true;
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &copies).expect("overwrite");
    net.pump();
    net.down[s] = false;
    let mut plans = Vec::new();
    for (from, to) in [("/data/f1", "/data/m1"), ("/data/m1", "/data/m2")] {
        let mark = net.nodes[s].ack_position();
        let at = net.clock(s);
        net.nodes[s].file_move(at, from, to).expect("decided here");
        plans.push(net.nodes[s].ack_plan(mark));
    }
    net.pump();
    for plan in &plans {
        assert_eq!(net.nodes[s].ack_ready(net.clock(s), plan), Some(AckReached::Changed));
    }
    net.run_for(MINUTE_MS, SECOND_MS);
    for i in 0..3 {
        assert_eq!(file_at(&net, i, "/data/f1"), Some((false, "bbbbbbbb".into())), "n{i} keeps the overwrite");
        for p in ["/data/m1", "/data/m2"] {
            assert!(file_at(&net, i, p).is_none(), "n{i} has nothing at {p}");
        }
    }
    assert_eq!(net.nodes[s].meta_status(net.clock(s)).meta.pending, 0);
}

/// The scrub of a copy whose rename has not run: the node moved `/data/f1` to `/data/m1`
/// while the leader could not be reached, so its copy's bytes stay at the old path until the
/// leader takes the move (a refused move must not have renamed them), and after that until the
/// reconciler's next pass renames them. The scrub, asked to check the copy at the new path,
/// finds no bytes there; it must not mark that copy stale meanwhile (every holder doing so left
/// a file with no current copy while its bytes were right: simulator seed 7484), while a copy
/// of a file whose bytes really are missing is marked stale, and so is the moved copy once the
/// reconciler's pass found nothing to rename.
#[test]
fn the_scrub_does_not_mark_stale_a_copy_whose_rename_has_not_run() {
    use shoal_core::ids::VolumeId;
    use shoal_core::meta::records::LocationState;
    use shoal_core::node::files::LocalCopy;
    let (mut net, volumes) = three_nodes_with_volumes("scrub-move", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
    let sum = "a".repeat(64);
    for path in ["/data/f1", "/data/f2"] {
        let at = net.clock(f);
        net.nodes[f].file_publish(at, path, 10, &sum, at.0, &copies).expect("put");
    }
    net.run_for(5 * SECOND_MS, SECOND_MS);
    net.down[l] = true;
    let at = net.clock(f);
    net.nodes[f].file_move(at, "/data/f1", "/data/m1").expect("decided here");
    net.pump();
    assert!(net.nodes[f].meta().awaiting_leader("/data/m1"), "the move waits for the leader");
    let state = |net: &Net, path: &str| {
        let rec = net.nodes[f].meta().state().file(path).cloned().expect("a record");
        rec.locations.iter().find(|c| c.volume_id == volumes[f].id).map(|c| c.state)
    };
    let before = state(&net, "/data/m1");
    assert_ne!(before, Some(LocationState::Stale));
    let copy = |path: &str| LocalCopy {
        path: path.into(),
        file: net.nodes[f].meta().state().file(path).expect("a record").id.clone(),
        volume: volumes[f].id.clone(),
        folder: format!("/srv/n{f}"),
        size: 10,
        checksum: sum.clone(),
    };
    let (moved, missing) = (copy("/data/m1"), copy("/data/f2"));
    let at = net.clock(f);
    assert!(net.nodes[f].scrub_result(at, &moved, None), "the moved copy is not missing");
    assert_eq!(state(&net, "/data/m1"), before, "nor marked stale");
    assert!(!net.nodes[f].scrub_result(at, &missing, None), "a copy that is gone is missing");
    assert_eq!(state(&net, "/data/f2"), Some(LocationState::Stale), "and is marked stale");
    // The leader takes the move; the rename has not run yet.
    net.down[l] = false;
    net.run_for(20 * SECOND_MS, SECOND_MS);
    assert!(!net.nodes[f].meta().awaiting_leader("/data/m1"), "the leader took the move");
    let at = net.clock(f);
    assert!(net.nodes[f].scrub_result(at, &moved, None), "not missing before the rename ran");
    assert_ne!(state(&net, "/data/m1"), Some(LocationState::Stale));
    // The reconciler found nothing at the old path to rename: the copy is missing now.
    assert!(net.nodes[f].removed_copy_dropped(at, "/data/f1", &volumes[f].id));
    assert!(!net.nodes[f].scrub_result(at, &moved, None), "missing once no rename is left");
    assert_eq!(state(&net, "/data/m1"), Some(LocationState::Stale));
}

/// A node whose records lag decides a move while the leader is unreachable, then becomes the
/// leader itself (the old one died) with the move still queued: it must check the move against
/// what the other members hold before it goes into its log, as the old leader would have
/// (simulator seed 3630: the move went in unchecked, and its tombstone, newer by version,
/// dropped an acknowledged overwrite everywhere). Each of the two followers plays the stale
/// node once; whichever of them leads next, the overwrite is kept everywhere and the move is
/// answered `Changed`.
#[test]
fn a_node_that_becomes_leader_checks_its_queued_moves_against_the_others_records() {
    use shoal_core::ids::VolumeId;
    use shoal_core::node::AckReached;
    let mut stale_led = 0;
    for pick in 0..2 {
        let (mut net, volumes) = three_nodes_with_volumes("new-leader", |_| (1 << 40, 1 << 39));
        let (l, _) = leader_and_follower(&net);
        let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
        let (s, f) = (others[pick], others[1 - pick]);
        let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
        let at = net.clock(f);
        net.nodes[f].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &copies).expect("put");
        net.run_for(5 * SECOND_MS, SECOND_MS);
        // The overwrite is acknowledged while the stale node hears nothing.
        net.down[s] = true;
        let from = net.nodes[f].ack_position();
        let at = net.clock(f);
        net.nodes[f].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &copies).expect("overwrite");
        let plan = net.nodes[f].ack_plan(from);
        net.pump();
        assert_eq!(net.nodes[f].ack_ready(net.clock(f), &plan), Some(AckReached::Replicated));
        // The leader dies; the stale node moves the file from its old record.
        net.down[l] = true;
        net.down[s] = false;
        assert_eq!(file_at(&net, s, "/data/f1"), Some((false, "aaaaaaaa".into())), "its records lag");
        let plan = move_or_remove(&mut net, s, "move");
        net.run_for(2 * MINUTE_MS, SECOND_MS);
        let leader = net.nodes[s].meta_status(net.clock(s)).meta.leader.expect("a new leader");
        assert_ne!(leader, net.id(l));
        if leader == net.id(s) {
            stale_led += 1;
            assert!(net.nodes[s].meta_status(net.clock(s)).meta.based_refused >= 1, "the check refused it");
            // The check is over: no timer left due (a check left behind spun the driver).
            let at = net.clock(s);
            assert!(net.nodes[s].poll_timeout().is_some_and(|d| d > at), "no timer overdue on n{s}");
        }
        assert_eq!(net.nodes[s].ack_ready(net.clock(s), &plan), Some(AckReached::Changed), "pick {pick}");
        for i in [s, f] {
            assert_eq!(file_at(&net, i, "/data/f1"), Some((false, "bbbbbbbb".into())), "n{i} keeps the overwrite");
            assert!(file_at(&net, i, "/data/m1").is_none(), "n{i} has nothing at the new path");
        }
    }
    assert_eq!(stale_led, 1, "the stale node led in one of the two runs");
}

/// A node cut off from everyone leads alone (the others' lease lapsed on it); on the other
/// side a new leader acknowledges an overwrite of `/data/f1` it never hears of. Its move of
/// `/data/f1`, decided from its old record, must wait in its queue and be checked against the
/// others' records when it meets them, as a follower's is checked by the leader: before, it
/// went into its log at once, and its tombstone, newer by version, dropped the acknowledged
/// overwrite everywhere when they met (simulator seed 3408). A move of a file nobody changed
/// meanwhile waits too, and is made when they meet; its copy reads at the new path meanwhile,
/// from the bytes still at the old one. A leader in touch with every member it can reach
/// puts its moves into its log at once.
#[test]
fn a_node_leading_alone_checks_its_moves_when_it_meets_the_others() {
    use shoal_core::ids::VolumeId;
    use shoal_core::node::AckReached;
    let (mut net, volumes) = three_nodes_with_volumes("alone", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
    for path in ["/data/f1", "/data/f2", "/data/f3"] {
        let at = net.clock(l);
        net.nodes[l].file_publish(at, path, 10, &"a".repeat(64), at.0, &copies).expect("put");
    }
    net.run_for(15 * SECOND_MS, SECOND_MS);
    // In touch: a move goes into the log at once.
    assert!(!net.nodes[l].meta().leader_may_lag(net.clock(l)), "in touch with both");
    assert!(!net.nodes[l].meta_status(net.clock(l)).meta.leader_may_lag);
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f3", "/data/m3").expect("move");
    assert_eq!(net.nodes[l].meta_status(at).meta.pending, 0, "appended at once");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    // Cut off: the others elect a leader of their own, which acknowledges an overwrite.
    net.isolated[l] = true;
    net.run_for(2 * MINUTE_MS, SECOND_MS);
    let other = net.nodes[f].meta_status(net.clock(f)).meta.leader.expect("a leader on the other side");
    assert_ne!(other, net.id(l));
    assert_eq!(net.nodes[l].meta_status(net.clock(l)).meta.leader, Some(net.id(l)), "l leads alone");
    let from = net.nodes[f].ack_position();
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &copies).expect("overwrite");
    let plan = net.nodes[f].ack_plan(from);
    net.run_for(2 * SECOND_MS, SECOND_MS);
    assert_eq!(net.nodes[f].ack_ready(net.clock(f), &plan), Some(AckReached::Replicated));
    // l moves both files from its own records; each waits in its queue, answered `alone`.
    assert!(net.nodes[l].meta().leader_may_lag(net.clock(l)), "alone, l may lag");
    assert!(net.nodes[l].meta_status(net.clock(l)).meta.leader_may_lag, "and its status says so");
    let refuted = move_or_remove(&mut net, l, "move");
    let from = net.nodes[l].ack_position();
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f2", "/data/m2").expect("move");
    let kept = net.nodes[l].ack_plan(from);
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    assert_eq!(net.nodes[l].ack_ready(at, &kept), Some(AckReached::Alone));
    assert_eq!(net.nodes[l].meta_status(at).meta.pending, 4, "both moves wait (two records each)");
    assert!(net.nodes[l].meta().awaiting_leader("/data/m2"), "nothing on disk follows them yet");
    let (_, sources) = net.nodes[l].file_sources("/data/m2", at).expect("readable at the new path");
    let local = sources.iter().find(|s| s.folder.is_some()).expect("a local copy");
    assert_eq!(local.moved_from.as_deref(), Some("/data/f2"), "read from the old path meanwhile");
    assert!(net.nodes[l].poll_timeout().is_some_and(|d| d > at), "no timer overdue while alone");
    // Its snapshot serves those records as they were before the moves: a member adopting it
    // must not take an unchecked move (and drop the newer record the check is to find on it).
    let target = "/cluster/acn/meta/snapshot";
    let headers = net.signed(f, "GET", target, b"");
    let r = net.nodes[l].handle_acn(at, "GET", target, Some(&headers), b"");
    assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(&body_bytes(&r)));
    let snap: serde_json::Value = serde_json::from_slice(&body_bytes(&r)).expect("json");
    let files = snap["files"].as_array().expect("files").clone();
    let served = |p: &str| files.iter().find(|x| x["path"] == p).map(|x| x["removed"].as_bool().unwrap_or(false));
    for (path, want) in [("/data/f1", Some(false)), ("/data/f2", Some(false)), ("/data/m1", None), ("/data/m2", None)] {
        assert_eq!(served(path), want, "{path} as served");
    }
    assert_eq!(served("/data/f3"), Some(true), "a checked move is served as made");
    // Nor does a 409 `changed` hand a submitter the unchecked change: a remove of /data/f2 that
    // f decided from the record l's own queued move was decided from gets that record back.
    {
        use shoal_core::hlc::Version;
        use shoal_core::meta::records::{FileRecord, Record};
        let f2 = net.nodes[f].meta().state().file("/data/f2").cloned().expect("f holds /data/f2");
        let version = Version { wall_ms: net.clock(f).0, counter: 0, node: net.id(f) };
        let rm = FileRecord { removed: true, version, based_on: Some(f2.based_on_this()), ..f2 };
        let body = json!({"records": [Record::File(rm)]}).to_string();
        let target = "/cluster/acn/meta/submit";
        let headers = net.signed(f, "POST", target, body.as_bytes());
        let r = net.nodes[l].handle_acn(at, "POST", target, Some(&headers), body.as_bytes());
        assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(&body_bytes(&r)));
        let answer: serde_json::Value = serde_json::from_slice(&body_bytes(&r)).expect("json");
        let refused = &answer["refused"][0];
        assert_eq!(refused["changed"], true, "{answer}");
        let current = &refused["current"];
        assert_eq!(current["payload"]["path"], "/data/f2", "{answer}");
        assert!(!current["payload"]["removed"].as_bool().unwrap_or(false), "handed back live: {answer}");
    }
    // They meet: l's check finds the overwrite and undoes the first move; the second is made.
    net.isolated[l] = false;
    net.run_for(2 * MINUTE_MS, SECOND_MS);
    let at = net.clock(l);
    assert_eq!(net.nodes[l].ack_ready(at, &refuted), Some(AckReached::Changed));
    assert_eq!(net.nodes[l].meta_status(at).meta.pending, 0);
    for i in 0..3 {
        assert_eq!(file_at(&net, i, "/data/f1"), Some((false, "bbbbbbbb".into())), "n{i} keeps the overwrite");
        assert!(file_at(&net, i, "/data/m1").is_none(), "n{i} has nothing at /data/m1");
        assert_eq!(file_at(&net, i, "/data/m2"), Some((false, "aaaaaaaa".into())), "n{i} has the moved file");
        assert_eq!(file_at(&net, i, "/data/f2").map(|r| r.0), Some(true), "n{i}: moved away");
    }
}

/// A remove or a move is not decided by a node that holds bytes of a newer write of the file
/// its records do not account for yet (an overwrite's copy landed on its volume, the record on
/// its way from the node that took the put): 409 `write_in_flight`, nothing changed. Simulator
/// seed 3920: the leader moved the file from its old record; the move named the old content's
/// copies, which the overwrite was retiring, and its tombstone dropped the overwrite. Once the
/// records account for the bytes, the move is made.
#[test]
fn a_node_holding_bytes_of_a_write_its_records_lack_decides_no_remove_or_move() {
    use shoal_core::ids::VolumeId;
    let (mut net, volumes) = three_nodes_with_volumes("landed", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &copies).expect("put");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    // An overwrite's bytes land on the leader's volume; its record has not come.
    let new = "b".repeat(64);
    let at = net.clock(l);
    net.nodes[l].landed_note(at, &volumes[l].id, "/data/f1", &new);
    for op in ["move", "remove"] {
        let err = match op {
            "move" => net.nodes[l].file_move(at, "/data/f1", "/data/m1").map(|_| ()),
            _ => net.nodes[l].file_remove(at, "/data/f1", false).map(|_| ()),
        }
        .expect_err(op);
        assert_eq!(err.code, "write_in_flight", "{op}");
    }
    assert_eq!(file_at(&net, l, "/data/f1"), Some((false, "aaaaaaaa".into())), "nothing changed");
    // The overwrite's record comes (through the follower that took the put): the move is made.
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &new, at.0, &copies).expect("overwrite");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("the records account for the bytes now");
    assert_eq!(file_at(&net, l, "/data/m1"), Some((false, "bbbbbbbb".into())));
}

/// A node whose records are settling (its log follows another numbering than the lease
/// holder's, until a snapshot puts it on the leader's) decides no remove or move: a record
/// there may be one made from a copy mark alone, listing some of the file's copies, and a move
/// decided from it told the holders of the others to delete theirs (simulator seed 7050). The
/// refusal changes nothing; once settled, the same move is made.
#[test]
fn a_node_whose_records_are_settling_decides_no_remove_or_move() {
    use shoal_core::ids::VolumeId;
    let (mut net, volumes) = three_nodes_with_volumes("settling", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let x = (0..3).find(|&i| i != l && i != f).unwrap();
    let copies: Vec<(VolumeId, NodeId)> = volumes.iter().map(|v| (v.id.clone(), v.node_id.clone())).collect();
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &copies).expect("put");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    // x appends under a higher term: f takes it, and follows another numbering until it has
    // x's snapshot (not delivered here).
    let xid = net.id(x);
    let wall = net.clock(x).0;
    let version = json!({"wallMs": wall, "counter": 0, "node": xid});
    let entry = json!({"seq": 1, "term": 9, "kind": "setting",
        "payload": {"key": "from-x", "value": 1, "version": version}, "version": version, "origin": xid});
    let body = json!({"lease": {"holder": xid, "term": 9}, "entries": [entry], "lastSeq": 1}).to_string();
    let target = "/cluster/acn/meta/append";
    let headers = net.signed(x, "POST", target, body.as_bytes());
    let at = net.clock(f);
    let r = net.nodes[f].handle_acn(at, "POST", target, Some(&headers), body.as_bytes());
    assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(&body_bytes(&r)));
    assert!(net.nodes[f].meta_status(at).meta.records_settling, "f's records are settling");
    for op in ["move", "remove"] {
        let err = match op {
            "move" => net.nodes[f].file_move(at, "/data/f1", "/data/m1").map(|_| ()),
            _ => net.nodes[f].file_remove(at, "/data/f1", false).map(|_| ()),
        }
        .expect_err(op);
        assert_eq!(err.code, "records_settling", "{op}");
    }
    assert_eq!(file_at(&net, f, "/data/f1"), Some((false, "aaaaaaaa".into())), "nothing changed");
    assert!(file_at(&net, f, "/data/m1").is_none());
    // x leads from now on: f takes its snapshot and settles, and the move is made.
    net.down[l] = true;
    net.run_for(2 * MINUTE_MS, SECOND_MS);
    let at = net.clock(f);
    assert!(!net.nodes[f].meta_status(at).meta.records_settling, "settled");
    net.nodes[f].file_move(at, "/data/f1", "/data/m1").expect("the move is made once settled");
}

/// An overwrite that raced a move of its file (issue 18, "Acknowledged means safe"). A
/// follower holding the file's only copy takes an overwrite: its bytes land there (the old
/// ones kept aside), its record goes to the leader; meanwhile the leader, which holds no byte
/// of it, moves the file. Left to last-writer-wins the overwrite, answered `replicated`, lost
/// to the newer tombstone (or, newer itself, brought the old path back with the moved file's
/// id): the follower was to delete the new bytes under the tombstone and drop the old ones it
/// kept, which the moved record named, and both contents were gone. Now the leader orders
/// them as the put, then the move: the moved file takes the overwrite's content, the follower
/// renames the new bytes to the new path and drops the old ones. Both orders of the two
/// versions (the follower's clock behind or ahead of the leader's).
#[test]
fn an_overwrite_that_raced_a_move_lands_at_the_new_path() {
    for ahead_ms in [0i64, 5_000] {
        let (mut net, volumes, l, f) = one_copy_on_a_follower("race");
        net.offsets_ms[f] = ahead_ms;
        let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
        let (old, new) = ("a".repeat(64), "b".repeat(64));
        let at = net.clock(f);
        net.nodes[f].landed_note(at, &volumes[f].id, "/data/f1", &new);
        net.nodes[f].kept_note(&volumes[f].id, "/data/f1", &old);
        let from = net.nodes[f].ack_position();
        net.nodes[f].file_publish(at, "/data/f1", 10, &new, at.0, &on_f).expect("overwrite");
        let plan = net.nodes[f].ack_plan(from);
        // Its copy verified (a scrub), marked before the follower hears of the move.
        let verified = shoal_core::meta::records::LocationState::Verified;
        assert!(net.nodes[f].copy_mark(at, "/data/f1", &volumes[f].id, verified, &new), "marked");
        // The leader moves the file before the overwrite's record reaches it.
        let at = net.clock(l).plus(5);
        net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
        net.pump();
        let at = net.clock(f);
        let ack = net.nodes[f].ack_ready(at, &plan);
        assert_eq!(ack, Some(shoal_core::node::AckReached::Replicated), "ahead {ahead_ms}");
        net.run_for(30 * SECOND_MS, SECOND_MS);
        for i in 0..3 {
            assert_eq!(file_at(&net, i, "/data/f1").map(|r| r.0), Some(true), "n{i} ahead {ahead_ms}: moved away");
            let m1 = net.nodes[i].meta().state().file("/data/m1").cloned().expect("moved");
            assert!(!m1.removed && m1.checksum == new, "n{i} ahead {ahead_ms}: the moved file holds the overwrite");
            let copy = m1.locations.iter().find(|c| c.volume_id == volumes[f].id).expect("its copy");
            assert!(m1.is_current(copy), "n{i}: its copy");
            assert_eq!(copy.state, verified, "n{i} ahead {ahead_ms}: the copy's mark is carried too");
        }
        let at = net.clock(f);
        let folder = volumes[f].subpath.clone();
        let renamed = shoal_core::node::files::DiskAction::Rename {
            volume: volumes[f].id.clone(),
            folder: folder.clone(),
            from: "/data/f1".into(),
            to: "/data/m1".into(),
        };
        assert_eq!(net.nodes[f].disk_actions(), vec![renamed], "ahead {ahead_ms}: the new bytes go to the new path");
        assert!(!net.nodes[f].landed_unsettled(at, &volumes[f].id, "/data/f1"), "the records account for them");
        let dropped = shoal_core::node::landed::KeptAction::Drop {
            volume: volumes[f].id.clone(),
            folder,
            path: "/data/f1".into(),
            checksum: old,
        };
        assert_eq!(net.nodes[f].kept_actions(at), vec![dropped], "ahead {ahead_ms}: the replaced bytes go");
    }
}

/// An overwrite that never reached the records (refused, or given up) while a move of its file
/// was taken: its bytes sit at the old path on the copy's node, the old content kept aside.
/// The move's rename must carry the old content, not the landed bytes: the kept bytes go back
/// in place first, and only then is the copy renamed (simulator `--races` seed 5093: the put
/// was refused, both holders renamed the refused bytes to the new path and dropped the kept
/// ones, and the moved file had no right copy left; seed 5181: the mover's own rename request
/// took a refused put's bytes the same way).
#[test]
fn a_move_renames_the_kept_bytes_of_an_overwrite_that_never_took_effect() {
    use shoal_core::node::files::DiskAction;
    use shoal_core::node::landed::KeptAction;
    let (mut net, f, vol, folder) = moved_over_kept_bytes("kept");
    let (old, new) = ("a".repeat(64), "b".repeat(64));
    let at = net.clock(f);
    assert_eq!(net.nodes[f].disk_actions(), vec![], "no rename while the moved copy's bytes are kept aside");
    let asked = net.nodes[f].authorize_rename(&vol, "/data/f1", "/data/m1").expect_err("the mover's rename waits too");
    assert_eq!(asked.code, "kept_first");
    assert_eq!(net.nodes[f].kept_actions(at), vec![], "nothing while the landed bytes may be a write on its way");
    // The overwrite gives up: its bytes are forgotten, and the kept ones go back in place.
    net.nodes[f].landed_forget(&vol, "/data/f1", &new);
    let restore = KeptAction::Restore {
        volume: vol.clone(),
        folder: folder.clone(),
        path: "/data/f1".into(),
        checksum: old.clone(),
    };
    assert_eq!(net.nodes[f].kept_actions(at), vec![restore], "the moved copy's bytes go back first");
    assert!(!net.nodes[f].kept_restored(at, &vol, "/data/f1", &old, &old), "no live file there to publish");
    let rename = DiskAction::Rename { volume: vol.clone(), folder, from: "/data/f1".into(), to: "/data/m1".into() };
    assert_eq!(net.nodes[f].disk_actions(), vec![rename], "then the rename carries them");
    assert!(net.nodes[f].authorize_rename(&vol, "/data/f1", "/data/m1").is_ok());
}

/// While a moved copy's rename waits for kept bytes to go back at the old path, the scrub does
/// not take the copy for missing, however long after the move (simulator `--races` seed 6396:
/// the holder restarted, the landed bytes settled 10 minutes later, past the rename's grace;
/// the scrub had marked the moved file's only copy stale, and once the rename ran the file had
/// no current copy).
#[test]
fn the_scrub_does_not_mark_stale_a_moved_copy_whose_rename_waits_for_kept_bytes() {
    use shoal_core::meta::records::LocationState;
    use shoal_core::node::chores::RENAME_GRACE_MS;
    use shoal_core::node::files::LocalCopy;
    let (mut net, f, vol, folder) = moved_over_kept_bytes("kept-scrub");
    let old = "a".repeat(64);
    let id = net.nodes[f].meta().state().file("/data/m1").expect("moved").id.clone();
    let moved = LocalCopy { path: "/data/m1".into(), file: id, volume: vol.clone(), folder, size: 10, checksum: old };
    // Its rename is pending, and its bytes are not read at the old path (the landed ones are
    // there): a peer's read of it is refused as `rename_pending` for now.
    assert!(net.nodes[f].copy_move_pending("/data/m1", &vol));
    assert_eq!(net.nodes[f].moved_copy_source("/data/m1", &vol), None);
    // Nor does a rescan take it for vanished: the rename is still on its way there.
    let arriving = net.nodes[f].volume_facts(&vol).arriving;
    assert_eq!(arriving.get("/data/m1").map(Vec::as_slice), Some(&["/data/f1".to_string()][..]));
    let late = net.clock(f).plus(RENAME_GRACE_MS + MINUTE_MS);
    assert!(net.nodes[f].scrub_result(late, &moved, None), "the moved copy is not missing");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    for i in 0..3 {
        let m1 = net.nodes[i].meta().state().file("/data/m1").cloned().expect("moved");
        let copy = m1.locations.iter().find(|c| c.volume_id == vol).expect("the copy");
        assert_ne!(copy.state, LocationState::Stale, "node {i}");
    }
    // The kept bytes are back: the copy is read at the old path until its rename runs.
    net.nodes[f].kept_done(&vol, "/data/f1", &"a".repeat(64));
    assert_eq!(net.nodes[f].moved_copy_source("/data/m1", &vol).as_deref(), Some("/data/f1"));
}

/// [`one_copy_on_a_follower`], where an overwrite's bytes ("b…") landed over the copy, the old
/// ones kept aside, and the leader then moved /data/f1 to /data/m1: (net, follower, its volume,
/// its folder).
fn moved_over_kept_bytes(name: &str) -> (Net, usize, shoal_core::ids::VolumeId, String) {
    let (mut net, volumes, l, f) = one_copy_on_a_follower(name);
    let (vol, folder) = (volumes[f].id.clone(), volumes[f].subpath.clone());
    let at = net.clock(f);
    net.nodes[f].landed_note(at, &vol, "/data/f1", &"b".repeat(64));
    net.nodes[f].kept_note(&vol, "/data/f1", &"a".repeat(64));
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    (net, f, vol, folder)
}

/// A cluster whose follower `f` holds the only copy of /data/f1 (content "a…"): (net, volumes,
/// leader, follower).
fn one_copy_on_a_follower(name: &str) -> (Net, Vec<shoal_core::meta::records::Volume>, usize, usize) {
    let (mut net, volumes) = three_nodes_with_volumes(name, |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &on_f).expect("put");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    (net, volumes, l, f)
}

/// The records a carried overwrite makes are versioned just above the records they order, not
/// at the leader's clock when the overwrite arrives: a write decided after them and still on its
/// way (a new file at the old path, an overwrite at the new one) stays newer, as it would have
/// been without the carry. Here the overwrite reaches the leader 20 s late.
#[test]
fn a_carried_overwrite_is_versioned_just_above_what_it_orders() {
    let (mut net, volumes, l, f) = one_copy_on_a_follower("late");
    let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
    let new = "b".repeat(64);
    net.isolated[f] = true;
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &new, at.0, &on_f).expect("overwrite");
    let at = net.clock(l).plus(5);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
    let moved_at = net.nodes[l].meta().state().file("/data/m1").expect("moved").version.clone();
    net.run_for(20 * SECOND_MS, SECOND_MS);
    net.isolated[f] = false;
    net.run_for(30 * SECOND_MS, SECOND_MS);
    let m1 = net.nodes[l].meta().state().file("/data/m1").cloned().expect("moved");
    assert_eq!(m1.checksum, new, "carried");
    assert_eq!(
        (m1.version.wall_ms, m1.version.counter),
        (moved_at.wall_ms, moved_at.counter + 1),
        "just above the move"
    );
}

/// A put of the content the move took (a move back to the old path, sent back after a snapshot
/// without what it was decided from, reads as one) is not carried: the moved record stays as
/// the move made it.
#[test]
fn a_put_of_the_moved_content_is_not_carried() {
    let (mut net, volumes, l, f) = one_copy_on_a_follower("same");
    let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &on_f).expect("the same content again");
    let at = net.clock(l).plus(5);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
    let moved = net.nodes[l].meta().state().file("/data/m1").cloned().expect("moved");
    net.run_for(10 * SECOND_MS, SECOND_MS);
    let m1 = net.nodes[l].meta().state().file("/data/m1").cloned().expect("moved");
    assert_eq!((m1.version, m1.based_on), (moved.version, moved.based_on), "the move's record, as it made it");
}

/// Simulator `--races` seed 6001: a node whose records lag (it was cut off while the file was
/// overwritten) marks the copy it knows of, the older content, stale; its mark is later by the
/// clock than the overwrite's copy on the same volume. The mark is a re-label of the older
/// content ([`shoal_core::meta::records::Location::relabeled`]), so once the records meet the
/// copy is still the overwrite's, current, on every node: before, the mark won and the
/// acknowledged overwrite had no current copy anywhere.
#[test]
fn a_copy_mark_from_lagging_records_does_not_hide_a_newer_overwrite() {
    use shoal_core::meta::records::LocationState;
    let (mut net, volumes, l, f) = one_copy_on_a_follower("lagging-mark");
    let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
    let lagging = (0..3).find(|&i| i != l && i != f).unwrap();
    net.isolated[lagging] = true;
    let new = "b".repeat(64);
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &new, at.0, &on_f).expect("overwrite");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(lagging);
    assert!(
        net.nodes[lagging].copy_mark(at, "/data/f1", &volumes[f].id, LocationState::Stale, &"a".repeat(64)),
        "the lagging node marks the copy it knows of"
    );
    net.isolated[lagging] = false;
    net.run_for(30 * SECOND_MS, SECOND_MS);
    for i in 0..3 {
        let file = net.nodes[i].meta().state().file("/data/f1").cloned().expect("the file");
        assert_eq!(file.checksum, new, "node {i}");
        let copy = file.locations.iter().find(|c| c.volume_id == volumes[f].id).expect("the copy");
        assert!(file.is_current(copy), "node {i}: the overwrite's copy is current: {copy:?}");
    }
}

/// A move's tombstone lost its path to a newer file put through a node that never knew the
/// moved one (simulator `--races` seed 5287; seed 6091 is the same with an overwrite the move
/// was decided without): the new file's record still lists the moved copy's bytes at the old
/// path, not as its own content, and the tombstone that asked for their rename is gone. The
/// holder renames them from the moved record's side; no copy lands over them first; once
/// renamed, the old path's record drops them and nothing more is asked.
#[test]
fn a_copy_a_move_left_behind_under_a_newer_file_is_renamed_to_the_moved_file() {
    use shoal_core::node::files::DiskAction;
    let (mut net, volumes) = three_nodes_with_volumes("left-behind", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    let o = (0..3).find(|&i| i != l && i != f).unwrap();
    net.isolated[o] = true;
    let (vol, folder) = (volumes[f].id.clone(), volumes[f].subpath.clone());
    let on_f = vec![(vol.clone(), volumes[f].node_id.clone())];
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &on_f).expect("put");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let on_o = vec![(volumes[o].id.clone(), volumes[o].node_id.clone())];
    let at = net.clock(o).plus(10 * MINUTE_MS);
    net.nodes[o].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &on_o).expect("a new file there");
    net.isolated[o] = false;
    net.run_for(30 * SECOND_MS, SECOND_MS);
    let f1 = net.nodes[f].meta().state().file("/data/f1").cloned().expect("f1");
    assert!(!f1.removed && f1.checksum == "b".repeat(64), "the newer file took the path: {f1:?}");
    let rename = DiskAction::Rename { volume: vol.clone(), folder, from: "/data/f1".into(), to: "/data/m1".into() };
    assert_eq!(net.nodes[f].disk_actions(), vec![rename.clone()]);
    assert!(net.nodes[f].disk_action_holds(&rename));
    assert!(net.nodes[f].copy_move_pending("/data/m1", &vol), "the moved copy is on its way, not missing");
    assert_eq!(net.nodes[f].moved_copy_source("/data/m1", &vol).as_deref(), Some("/data/f1"));
    assert!(!net.nodes[f].may_replace_copy("/data/f1", &vol, &"b".repeat(64), None), "nothing lands over them first");
    let at = net.clock(f);
    assert!(net.nodes[f].removed_copy_dropped(at, "/data/f1", &vol), "renamed: dropped at the old path");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    assert_eq!(net.nodes[f].disk_actions(), vec![]);
    assert!(!net.nodes[f].copy_move_pending("/data/m1", &vol));
    assert!(net.nodes[f].may_replace_copy("/data/f1", &vol, &"b".repeat(64), None));
}

/// Only bytes written at the old path before the move count as left behind: a file put there
/// since with the moved file's content by chance, then overwritten, leaves a stale copy of that
/// content on the same volume, which is its own and is not renamed over the moved file's copy.
#[test]
fn a_later_copy_of_the_same_content_at_the_old_path_is_not_taken_for_one_left_behind() {
    let (mut net, volumes, l, f) = one_copy_on_a_follower("not-left-behind");
    let vol = volumes[f].id.clone();
    let on_f = vec![(vol.clone(), volumes[f].node_id.clone())];
    let on_l = vec![(volumes[l].id.clone(), volumes[l].node_id.clone())];
    let at = net.clock(l);
    net.nodes[l].file_move(at, "/data/f1", "/data/m1").expect("move");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(f);
    assert!(net.nodes[f].removed_copy_dropped(at, "/data/f1", &vol), "the move's rename ran");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &on_f).expect("the same content again");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &on_l).expect("overwrite");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    let f1 = net.nodes[f].meta().state().file("/data/f1").cloned().expect("f1");
    let stale = f1.locations.iter().find(|c| c.volume_id == vol).expect("the older copy");
    assert_eq!((stale.checksum.as_str(), f1.is_current(stale)), ("a".repeat(64).as_str(), false));
    assert_eq!(net.nodes[f].left_behind_rename("/data/f1", &vol), None);
    assert_eq!(net.nodes[f].disk_actions(), vec![]);
}

/// A move decided from a record older than a copy made since (a node cut off decides it; the
/// others pull a second copy meanwhile): the moved file's record does not list the new copy,
/// which the tombstone does. It is the moved file's content all the same: renamed to the new
/// path and published there, not deleted (simulator `--races` seed 6443 deleted it, the file's
/// only good copy: the other was rotten).
#[test]
fn a_copy_made_after_a_move_was_decided_is_renamed_with_it_not_deleted() {
    use shoal_core::node::files::DiskAction;
    let (mut net, volumes, l, f) = one_copy_on_a_follower("late-copy");
    let o = (0..3).find(|&i| i != l && i != f).unwrap();
    let id = net.nodes[l].meta().state().file("/data/f1").expect("f1").id.clone();
    net.isolated[o] = true;
    let at = net.clock(o);
    net.nodes[o].file_move(at, "/data/f1", "/data/m1").expect("a move decided alone");
    let at = net.clock(l);
    let vol = volumes[l].id.clone();
    assert!(net.nodes[l].copy_publish(at, "/data/f1", &id, &"a".repeat(64), &vol), "a second copy pulled meanwhile");
    net.run_for(5 * SECOND_MS, SECOND_MS);
    net.isolated[o] = false;
    net.run_for(30 * SECOND_MS, SECOND_MS);
    let m1 = net.nodes[l].meta().state().file("/data/m1").cloned().expect("moved");
    assert!(m1.locations.iter().all(|c| c.volume_id != vol), "the move was decided without the new copy");
    let rename = DiskAction::Rename {
        volume: vol.clone(),
        folder: volumes[l].subpath.clone(),
        from: "/data/f1".into(),
        to: "/data/m1".into(),
    };
    assert!(net.nodes[l].disk_actions().contains(&rename), "renamed, not deleted: {:?}", net.nodes[l].disk_actions());
    assert!(net.nodes[l].disk_action_holds(&rename));
    let at = net.clock(l);
    assert!(net.nodes[l].removed_copy_renamed(at, "/data/f1", "/data/m1", &vol, true));
    net.run_for(5 * SECOND_MS, SECOND_MS);
    for i in 0..3 {
        let m1 = net.nodes[i].meta().state().file("/data/m1").cloned().expect("moved");
        let copy = m1.locations.iter().find(|c| c.volume_id == vol).expect("published at the new path");
        assert!(m1.is_current(copy), "node {i}: {copy:?}");
    }
}

/// A new file put through a node cut off from the leader (it never knew the file at that
/// path, so the put has another id), newer than that file, while the leader removes that file:
/// the remove's tombstone, newer still, reaches the putting node before the leader takes its
/// put, and wins there for a moment. Nothing on disk follows it while the put waits for the
/// leader (its bytes would be deleted as the tombstone's copy), and the leader, which keeps
/// the new file over a tombstone that never saw it, hands the record written again back with
/// its answer: the new file stays, with its bytes, on every node.
#[test]
fn a_new_file_put_while_its_path_was_removed_elsewhere_keeps_its_bytes() {
    let (mut net, volumes) = three_nodes_with_volumes("unseen", |_| (1 << 40, 1 << 39));
    let (l, f) = leader_and_follower(&net);
    net.isolated[f] = true;
    let on_l = vec![(volumes[l].id.clone(), volumes[l].node_id.clone())];
    let on_f = vec![(volumes[f].id.clone(), volumes[f].node_id.clone())];
    let at = net.clock(l);
    net.nodes[l].file_publish(at, "/data/f1", 10, &"a".repeat(64), at.0, &on_l).expect("put");
    net.run_for(SECOND_MS, SECOND_MS);
    let at = net.clock(f);
    net.nodes[f].file_publish(at, "/data/f1", 10, &"b".repeat(64), at.0, &on_f).expect("a new file");
    net.run_for(SECOND_MS, SECOND_MS);
    let at = net.clock(l);
    net.nodes[l].file_remove(at, "/data/f1", false).expect("remove");
    net.run_for(2 * SECOND_MS, SECOND_MS);
    net.isolated[f] = false;
    let mut seen = false;
    for _ in 0..300 {
        net.run_for(100, 100);
        let tomb_wins = file_at(&net, f, "/data/f1").is_some_and(|(removed, _)| removed);
        if tomb_wins && net.nodes[f].meta().puts_awaiting_leader().contains("/data/f1") {
            seen = true;
            assert!(net.nodes[f].disk_actions().is_empty(), "nothing follows the tombstone meanwhile");
        }
    }
    assert!(seen, "the tombstone reached f before the leader took its put");
    for i in 0..3 {
        assert_eq!(file_at(&net, i, "/data/f1"), Some((false, "bbbbbbbb".into())), "n{i} keeps the new file");
    }
    assert!(net.nodes[f].disk_actions().is_empty(), "its bytes stay");
}
