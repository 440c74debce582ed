//! The metadata store's state machine (`Meta`) driven by hand: two or three nodes wired into a
//! tiny network in which every `meta/*` request is delivered to the target's `answer_*` and the
//! reply is fed back through `on_response`, exactly as the node shell does it.
//!
//! Spec: cluster-runtime.md "Metadata store (ACMS)" (leader lease, replicated log, catch-up,
//! snapshots); reference-facts.md "Lease" (`POST meta/lease {lease,lastSeq}`, 409 with own
//! lease) and "Log entry" (`seq = lastSeq + 1`, `meta/append`, `meta_pending` and `meta/submit`
//! with 409 if not leader and a retry, `meta/log?after=N` pages with 410 if compacted,
//! `meta/snapshot`, compaction every N appends keeping M).

mod common;

use common::{Json, Status};
use proptest::prelude::*;
use serde_json::{json, Value};
use shoal_core::answer::PeerAnswer;
use shoal_core::hlc::Hlc;
use shoal_core::meta::lease::{Candidate, Lease};
use shoal_core::meta::log::{Entry, LogMeta, MetaPersist};
use shoal_core::meta::machine::{Meta, MetaConfig, MetaOutput, MetaPurpose, MetaReply, MetaRestored};
use shoal_core::meta::records::{Record, RecordKind, Setting};
use shoal_core::{LogIndex, Millis, NodeId, Term};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Wall clock at monotonic zero (November 2023).
const WALL0: u64 = 1_700_000_000_000;
/// Monotonic time at which every scenario starts.
const START: u64 = 100_000;
const LEASE: &str = "/cluster/acn/meta/lease";
const APPEND: &str = "/cluster/acn/meta/append";
const SUBMIT: &str = "/cluster/acn/meta/submit";
const LOG: &str = "/cluster/acn/meta/log";
const SNAPSHOT: &str = "/cluster/acn/meta/snapshot";

fn id(s: &str) -> NodeId {
    NodeId::new(s)
}

// ---- a tiny network ----

struct Node {
    meta: Meta,
    hlc: Hlc,
    joined: u64,
    /// The members this node sees, with their eligibility.
    view: Vec<(NodeId, bool)>,
    persisted: Vec<MetaPersist>,
    /// What this node reported refusing (`what: why`).
    refusals: Vec<String>,
}

#[derive(Clone, Debug)]
struct Msg {
    from: NodeId,
    to: NodeId,
    method: &'static str,
    target: String,
    body: Vec<u8>,
    purpose: MetaPurpose,
}

/// One delivered request and its answer (status 0: the link was cut).
#[derive(Clone, Debug)]
struct Delivery {
    at: Millis,
    from: NodeId,
    #[allow(dead_code)] // shown in failure messages
    to: NodeId,
    target: String,
    request: Vec<u8>,
    status: u16,
    reply: Value,
}

struct Net {
    config: MetaConfig,
    now: Millis,
    nodes: BTreeMap<NodeId, Node>,
    queue: VecDeque<Msg>,
    cut: BTreeSet<(NodeId, NodeId)>,
    trace: Vec<Delivery>,
}

impl Net {
    fn new(names: &[&str], config: MetaConfig) -> Net {
        let mut net = Net {
            config,
            now: Millis(START),
            nodes: BTreeMap::new(),
            queue: VecDeque::new(),
            cut: BTreeSet::new(),
            trace: Vec::new(),
        };
        for n in names {
            net.add(n);
        }
        let all: Vec<(&str, bool)> = names.iter().map(|n| (*n, true)).collect();
        net.set_view_all(&all);
        net
    }

    /// A fresh node (joined after every node already there); it sees everyone as eligible.
    fn add(&mut self, name: &str) {
        let joined = self.nodes.len() as u64 + 1;
        let node = Node {
            meta: Meta::new(id(name), self.config.clone(), self.now),
            hlc: Hlc::new(id(name)),
            joined,
            view: Vec::new(),
            persisted: Vec::new(),
            refusals: Vec::new(),
        };
        self.nodes.insert(id(name), node);
        let view: Vec<(NodeId, bool)> = self.nodes.keys().map(|k| (k.clone(), true)).collect();
        self.nodes.get_mut(&id(name)).unwrap().view = view;
    }

    fn node(&self, n: &str) -> &Node {
        &self.nodes[&id(n)]
    }

    fn node_mut(&mut self, n: &str) -> &mut Node {
        self.nodes.get_mut(&id(n)).expect("known node")
    }

    fn meta(&self, n: &str) -> &Meta {
        &self.node(n).meta
    }

    fn wall(&self) -> Millis {
        Millis(WALL0 + self.now.0)
    }

    fn advance(&mut self, ms: u64) {
        self.now = self.now.plus(ms);
    }

    fn set_view(&mut self, n: &str, view: &[(&str, bool)]) {
        self.node_mut(n).view = view.iter().map(|(m, e)| (id(m), *e)).collect();
    }

    fn set_view_all(&mut self, view: &[(&str, bool)]) {
        let names: Vec<NodeId> = self.nodes.keys().cloned().collect();
        for n in names {
            self.set_view(n.as_str(), view);
        }
    }

    fn link(a: &NodeId, b: &NodeId) -> (NodeId, NodeId) {
        if a < b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        }
    }

    fn cut(&mut self, a: &str, b: &str) {
        self.cut.insert(Net::link(&id(a), &id(b)));
    }

    fn heal(&mut self, a: &str, b: &str) {
        self.cut.remove(&Net::link(&id(a), &id(b)));
    }

    fn candidates(&self, n: &str) -> Vec<Candidate> {
        self.node(n)
            .view
            .iter()
            .map(|(m, eligible)| Candidate {
                id: m.clone(),
                joined: self.nodes[m].joined,
                eligible: *eligible,
                reachable: *eligible,
            })
            .collect()
    }

    /// `Meta::handle_timeout` on node `n`, with its own clock.
    fn timeout_at(&mut self, n: &str, now: Millis, wall: Millis, members: Vec<Candidate>) {
        let node = self.node_mut(n);
        node.meta.handle_timeout(now, wall, members, &mut node.hlc);
    }

    /// `Meta::submit` on node `n` (outputs not collected).
    fn submit_at(&mut self, n: &str, now: Millis, record: Record) {
        let node = self.node_mut(n);
        node.meta.submit(now, record, &mut node.hlc);
    }

    /// `Meta::submit_all` on node `n` (outputs not collected).
    fn submit_all_at(&mut self, n: &str, now: Millis, records: Vec<Record>) {
        let node = self.node_mut(n);
        node.meta.submit_all(now, records, &mut node.hlc);
    }

    fn tick(&mut self, n: &str) {
        let members = self.candidates(n);
        let (now, wall) = (self.now, self.wall());
        self.timeout_at(n, now, wall, members);
        self.collect(&id(n));
    }

    fn tick_all(&mut self) {
        let names: Vec<NodeId> = self.nodes.keys().cloned().collect();
        for n in names {
            self.tick(n.as_str());
        }
    }

    /// Drain a node's outputs: sends join the network queue, writes are remembered.
    fn collect(&mut self, n: &NodeId) {
        let node = self.nodes.get_mut(n).expect("known node");
        while let Some(o) = node.meta.poll_output() {
            match o {
                MetaOutput::Persist(p) => node.persisted.push(p),
                MetaOutput::Refused { what, why, .. } => node.refusals.push(format!("{what}: {why}")),
                MetaOutput::Send { to, method, target, body, purpose } => {
                    self.queue.push_back(Msg { from: n.clone(), to, method, target, body, purpose })
                }
            }
        }
    }

    fn setting(&mut self, n: &str, key: &str, value: Value) -> Record {
        let wall = self.wall();
        let version = self.node_mut(n).hlc.next(wall);
        Record::Setting(Setting { key: key.into(), value, removed: false, version })
    }

    /// A setting written through `n`, and the network settled.
    fn write(&mut self, n: &str, key: &str, value: Value) {
        let r = self.setting(n, key, value);
        self.submit(n, r);
        self.run();
    }

    fn tombstone(&mut self, n: &str, key: &str) -> Record {
        let wall = self.wall();
        let version = self.node_mut(n).hlc.next(wall);
        Record::Setting(Setting { key: key.into(), value: Value::Null, removed: true, version })
    }

    fn submit(&mut self, n: &str, rec: Record) {
        let now = self.now;
        self.submit_at(n, now, rec);
        self.collect(&id(n));
    }

    /// The target answers a request (its own outputs join the queue).
    fn answer(&mut self, m: &Msg) -> MetaReply {
        let now = self.now;
        let path = m.target.strip_prefix("/cluster/acn/").expect("an ACN target");
        let (endpoint, query) = path.split_once('?').unwrap_or((path, ""));
        let node = self.nodes.get_mut(&m.to).expect("known target");
        let r = match endpoint {
            "meta/lease" => node.meta.answer_lease(now, &m.from, &m.body),
            "meta/append" => node.meta.answer_append(now, &m.from, &m.body, &mut node.hlc),
            "meta/submit" => node.meta.answer_submit(now, &m.from, &m.body, &mut node.hlc),
            "meta/log" => node.meta.answer_log(query),
            "meta/snapshot" => node.meta.answer_snapshot(query),
            "meta/based" => node.meta.answer_based(&m.body),
            other => panic!("unexpected endpoint {other}"),
        };
        let expected_method = if matches!(endpoint, "meta/log" | "meta/snapshot") { "GET" } else { "POST" };
        assert_eq!(m.method, expected_method, "{}", m.target);
        self.collect(&m.to.clone());
        r
    }

    /// The sender reads the answer to its request.
    fn respond(&mut self, m: &Msg, result: Result<PeerAnswer, String>) {
        let now = self.now;
        let node = self.nodes.get_mut(&m.from).expect("known sender");
        node.meta.on_response(now, &m.to, m.purpose.clone(), result, &mut node.hlc);
        self.collect(&m.from.clone());
    }

    fn deliver(&mut self, m: Msg) {
        let (status, reply) = if self.cut.contains(&Net::link(&m.from, &m.to)) {
            self.respond(&m, Err("unreachable".into()));
            (0, Value::Null)
        } else {
            let r = self.answer(&m);
            self.respond(&m, Ok(common::answer(r.status(), serde_json::to_vec(&r.body).unwrap())));
            (r.status(), r.body)
        };
        self.trace.push(Delivery {
            at: self.now,
            from: m.from,
            to: m.to,
            target: m.target,
            request: m.body,
            status,
            reply,
        });
    }

    /// Deliver until nothing is in flight.
    fn run(&mut self) {
        for _ in 0..100_000 {
            let Some(m) = self.queue.pop_front() else { return };
            self.deliver(m);
        }
        panic!("the network never went quiet");
    }

    /// `n` rounds of: time passes by `step_ms`, every node ticks, the network settles.
    fn rounds(&mut self, n: usize, step_ms: u64) {
        for _ in 0..n {
            self.advance(step_ms);
            self.tick_all();
            self.run();
        }
    }

    /// Take the one queued request matching `pred` out of the queue.
    fn take(&mut self, pred: impl Fn(&Msg) -> bool) -> Msg {
        let hits: Vec<usize> = self.queue.iter().enumerate().filter(|(_, m)| pred(m)).map(|(i, _)| i).collect();
        assert_eq!(hits.len(), 1, "exactly one matching request expected in {:#?}", self.queue);
        self.queue.remove(hits[0]).unwrap()
    }

    fn queued(&self, pred: impl Fn(&Msg) -> bool) -> usize {
        self.queue.iter().filter(|m| pred(m)).count()
    }

    fn trace_from(&self, mark: usize, from: &str, target_prefix: &str) -> Vec<Delivery> {
        self.trace[mark..]
            .iter()
            .filter(|d| d.from == id(from) && d.target.starts_with(target_prefix))
            .cloned()
            .collect()
    }
}

/// A cluster whose first node claimed the lease; every follower took its first snapshot.
fn cluster(names: &[&str], config: MetaConfig) -> Net {
    let mut net = Net::new(names, config);
    let now = net.now;
    net.node_mut(names[0]).meta.allow_claim_now(now);
    net.tick_all();
    net.run();
    let lease = Lease { holder: id(names[0]), term: Term(1) };
    assert!(net.meta(names[0]).is_leader(net.now), "{} claims the lease", names[0]);
    for n in &names[1..] {
        assert_eq!(net.meta(n).known_lease(), Some(&lease), "{n} follows");
        assert_eq!(net.meta(n).leader(net.now), Some(&lease));
        assert_eq!(net.meta(n).snapshots_adopted(), 1, "{n} starts from the leader's snapshot");
    }
    net
}

fn small() -> MetaConfig {
    MetaConfig { compact_every: 10, keep_entries: 20, page_max: 5, ..MetaConfig::default() }
}

fn setting_of(meta: &Meta, key: &str) -> Option<Setting> {
    match meta.state().get(RecordKind::Setting, key) {
        Some(Record::Setting(s)) => Some(s.clone()),
        Some(other) => panic!("not a setting: {other:?}"),
        None => None,
    }
}

fn seqs(page: &Value) -> Vec<u64> {
    page["entries"].as_array().expect("entries").iter().map(|e| e["seq"].as_u64().expect("seq")).collect()
}

fn after_of(target: &str) -> u64 {
    target.split_once("after=").expect("after=").1.parse().expect("a number")
}

// ---- 1: a follower's submit ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)" → Replicated log: "Submit(kind, record)
/// applies locally at once, then the leader assigns a sequence number and pushes the entry to
/// online peers (meta/append). Followers submit through the leader (meta/submit) or queue in
/// meta_pending"; reference-facts.md "Log entry": "leader seq=lastSeq+1, fan out meta/append".
#[test]
fn a_followers_submit_is_applied_at_once_queued_sent_to_the_leader_appended_pushed_and_dequeued_on_ack() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    // Some history first, so the follower's change does not get sequence number 1 by luck.
    for i in 0..3 {
        let r = net.setting("a", &format!("warm{i}"), json!(i));
        net.submit("a", r);
    }
    net.run();
    let before = net.meta("a").last_seq();
    assert_eq!(before, LogIndex(3));
    assert_eq!(net.meta("c").last_seq(), before);
    net.node_mut("b").persisted.clear();

    let rec = net.setting("b", "colour", json!("blue"));
    net.submit("b", rec.clone());

    // Applied locally at once and queued (persisted) as pending.
    assert_eq!(net.meta("b").state().get(RecordKind::Setting, "colour"), Some(&rec));
    assert_eq!(net.meta("b").pending_len(), 1);
    assert!(net.node("b").persisted.iter().any(|p| matches!(p, MetaPersist::PutPending(q) if q.record == rec)));
    // Sent to the leader, and only to the leader.
    let m = net.take(|m| m.target == SUBMIT);
    assert_eq!((m.from.as_str(), m.to.as_str(), m.method), ("b", "a", "POST"));
    assert!(matches!(&m.purpose, MetaPurpose::Submit { ids } if ids.len() == 1));
    assert!(net.queue.is_empty(), "nothing else is sent: {:?}", net.queue);
    assert_eq!(setting_of(net.meta("a"), "colour"), None);

    // The leader appends it with the next sequence number, origin b.
    let reply = net.answer(&m);
    assert_eq!(reply.status(), 200, "{}", reply.body);
    assert_eq!(net.meta("a").last_seq(), LogIndex(before.0 + 1));
    assert_eq!(net.meta("a").state().get(RecordKind::Setting, "colour"), Some(&rec));
    let page = net.meta("a").answer_log(&format!("after={}", before.0)).body;
    assert_eq!(seqs(&page), vec![before.0 + 1]);
    assert_eq!(page["entries"][0]["origin"], json!("b"));
    assert_eq!(page["entries"][0]["kind"], json!("setting"));
    assert_eq!(page["entries"][0]["payload"]["key"], json!("colour"));

    // Still pending until the follower reads the leader's acknowledgement.
    assert_eq!(net.meta("b").pending_len(), 1);
    net.respond(&m, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    assert_eq!(net.meta("b").pending_len(), 0);
    assert!(net.node("b").persisted.iter().any(|p| matches!(p, MetaPersist::DeletePending(_))));

    // The leader pushes the entry to the other follower, but not at once: its last append
    // to c (the warm-up) went out just now, and nothing waits on c for an entry b and the
    // leader already hold (the append gap, issue 18). The timeout names when it goes.
    assert_eq!(net.queued(|m| m.target == APPEND && m.to == id("c")), 0, "{:?}", net.queue);
    let gap = MetaConfig::default().append_gap_ms;
    assert!(gap > 0);
    assert_eq!(net.meta("a").poll_timeout(), Some(net.now.plus(gap)));
    net.advance(gap - 1);
    net.tick("a");
    assert_eq!(net.queued(|m| m.target == APPEND && m.to == id("c")), 0, "not before the gap");
    net.advance(1);
    net.tick("a");
    let to_c = net.take(|m| m.target == APPEND && m.to == id("c"));
    let body: Value = serde_json::from_slice(&to_c.body).unwrap();
    assert_eq!(seqs(&body), vec![before.0 + 1]);
    assert_eq!(setting_of(net.meta("c"), "colour"), None);
    net.deliver(to_c);
    net.run();
    for n in ["a", "b", "c"] {
        assert_eq!(net.meta(n).state().get(RecordKind::Setting, "colour"), Some(&rec), "{n}");
        assert_eq!(net.meta(n).last_seq(), LogIndex(before.0 + 1), "{n}");
        assert_eq!(net.meta(n).pending_len(), 0, "{n}");
    }
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("c").state().digest(), net.meta("a").state().digest());
}

/// Issue 18, the append gap: an append to a follower that carries only entries other
/// followers submitted (held already by their submitter and the leader, so no acknowledgement
/// waits on a third node) waits until `append_gap_ms` after the previous append to that
/// follower; entries the leader made itself go at once (its own acknowledgements wait on a
/// follower's confirmation), and so does a range holding one of them. A gap of 0 is the old
/// rule.
#[test]
fn the_append_gap_holds_back_only_ranges_without_the_leaders_own_entries() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    net.write("a", "first", json!(1));
    // Within the gap of the appends just sent: the leader's own change goes at once, to both.
    let r = net.setting("a", "second", json!(2));
    net.submit("a", r);
    assert_eq!(net.queued(|m| m.target == APPEND), 2, "{:?}", net.queue);
    net.run();
    assert_eq!(setting_of(net.meta("c"), "second").map(|s| s.value), Some(json!(2)));
    // b's change: the leader's answer carries it back to b; c's append waits for the gap.
    net.write("b", "third", json!(3));
    assert_eq!(setting_of(net.meta("b"), "third").map(|s| s.value), Some(json!(3)));
    assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq(), "b has its entry from the answer");
    assert_eq!(setting_of(net.meta("c"), "third"), None, "held by the gap");
    // The leader's own change now: the range to c holds b's entry and a's, and goes at once.
    net.write("a", "fourth", json!(4));
    for key in ["third", "fourth"] {
        assert!(setting_of(net.meta("c"), key).is_some(), "{key}");
    }
    assert_eq!(net.meta("c").last_seq(), net.meta("a").last_seq());

    // A gap of 0: a follower's change reaches the third node in the same round.
    let mut none = cluster(&["a", "b", "c"], MetaConfig { append_gap_ms: 0, ..MetaConfig::default() });
    none.write("a", "first", json!(1));
    none.write("b", "third", json!(3));
    assert_eq!(setting_of(none.meta("c"), "third").map(|s| s.value), Some(json!(3)));
}

/// The append gap holds back only a range short of a full batch: a peer the followers' writes
/// have put `batch_max` entries behind is sent them at once, gap or not (it gains nothing from
/// waiting, and the leader looks at one batch's entries at most to decide).
#[test]
fn the_append_gap_does_not_hold_back_a_full_batch() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig { batch_max: 3, ..MetaConfig::default() });
    net.write("a", "first", json!(1));
    net.write("b", "k0", json!(0));
    net.write("b", "k1", json!(1));
    assert_eq!(setting_of(net.meta("c"), "k1"), None, "two entries: held by the gap");
    net.write("b", "k2", json!(2));
    for key in ["k0", "k1", "k2"] {
        assert!(setting_of(net.meta("c"), key).is_some(), "{key}: a full batch goes at once");
    }
    assert_eq!(net.meta("c").last_seq(), net.meta("a").last_seq());
}

/// Issue 18, with the append gap: a request on the leader waits only for its own entries to
/// reach a follower. Entries followers submitted while it ran (held by their submitter and by
/// the leader already, and perhaps held back from the others by the gap) do not hold up its
/// answer; an entry of the leader's own in the range still waits for a follower's confirmation.
#[test]
fn a_leaders_mark_waits_only_for_its_own_entries() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    net.write("a", "warm", json!(0));
    // A request on the leader that wrote nothing itself, while b's change came in.
    let from = net.meta("a").write_mark();
    net.write("b", "theirs", json!(1));
    let to = net.meta("a").write_mark();
    assert!(net.meta("a").last_seq() > LogIndex(1));
    assert_eq!(setting_of(net.meta("c"), "theirs"), None, "c's append is held by the gap");
    assert!(net.meta("a").mark_held(&from, &to), "b's entry does not wait for c");
    assert!(net.meta("a").held_elsewhere(RecordKind::Setting, "theirs"));

    // The leader's own change in the range waits until a follower confirms it.
    let from = net.meta("a").write_mark();
    let r = net.setting("a", "ours", json!(2));
    net.submit("a", r);
    let r = net.setting("b", "theirs2", json!(3));
    net.submit("b", r);
    let submit = net.take(|m| m.target == SUBMIT);
    let reply = net.answer(&submit);
    net.respond(&submit, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    let to = net.meta("a").write_mark();
    assert!(!net.meta("a").mark_held(&from, &to), "a's own entry is not confirmed yet");
    assert!(!net.meta("a").held_elsewhere(RecordKind::Setting, "ours"));
    net.run();
    assert!(net.meta("a").mark_held(&from, &to), "confirmed by an append's answer");
    assert!(net.meta("a").held_elsewhere(RecordKind::Setting, "ours"));
}

/// A leader's own entry that no follower confirmed, whose log a new leader's snapshot then
/// replaced (a shorter one: the entry's number is past its end), is not held: the record is
/// back in the pending queue, to be submitted again. Found in review: the mark looked its
/// number up in a log that no longer had it and took the empty range for "nothing to wait for",
/// so the write was acknowledged `replicated` with no other node holding it.
#[test]
fn a_leaders_mark_over_entries_a_new_leaders_snapshot_replaced_is_not_held() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    net.write("a", "warm", json!(0));
    // a's appends stop reaching b and c, which still see each other.
    net.cut("a", "b");
    net.cut("a", "c");
    let from = net.meta("a").write_mark();
    net.write("a", "ours", json!(1));
    let to = net.meta("a").write_mark();
    assert!(!net.meta("a").mark_held(&from, &to), "no follower confirmed it");
    assert!(!net.meta("a").mark_never_held(&from, &to), "it still may be");
    // b and c lose sight of a; b claims the lease with a higher term.
    let without_a = [("a", false), ("b", true), ("c", true)];
    net.set_view("b", &without_a);
    net.set_view("c", &without_a);
    let now = net.now;
    net.node_mut("b").meta.allow_claim_now(now);
    net.tick("b");
    net.run();
    assert!(net.meta("b").is_leader(net.now));
    assert!(net.meta("b").last_seq() < net.meta("a").last_seq(), "b's log is the shorter");
    // Heal: a learns of b's lease, steps down and adopts b's snapshot. At every step, while
    // the record waits in a's queue (no other node holds it), the mark must not say held.
    net.heal("a", "b");
    net.heal("a", "c");
    net.set_view_all(&[("a", true), ("b", true), ("c", true)]);
    let adopted = net.meta("a").snapshots_adopted();
    let mut seen_pending_after_snapshot = false;
    for _ in 0..6 {
        net.advance(5_000);
        net.tick_all();
        while let Some(m) = net.queue.pop_front() {
            net.deliver(m);
            let a = net.meta("a");
            if !a.held_elsewhere(RecordKind::Setting, "ours") {
                seen_pending_after_snapshot |= a.snapshots_adopted() > adopted;
                assert!(!a.mark_held(&from, &to), "held while only a holds it");
            }
        }
    }
    assert!(net.meta("a").snapshots_adopted() > adopted, "a adopted b's snapshot");
    assert!(seen_pending_after_snapshot, "the record waited in a's queue after the snapshot");
    // The mark can never be counted held now: the request is answered `unconfirmed` at once,
    // not at the end of `meta.ack_wait`.
    assert!(net.meta("a").mark_never_held(&from, &to));
    assert!(!net.meta("a").mark_held(&from, &to));
    assert!(net.meta("b").state().get(RecordKind::Setting, "ours").is_some(), "sent back to b");
}

/// A follower that asked the leader for a log page (or a snapshot) and became the leader
/// before the answer came takes no part of it: it leads now, and the old leader's numbering
/// must not replace its log (found in review: a stale page led to a snapshot of the old
/// leader's, adopted while this node held the lease, so it followed the old numbering, reused
/// sequence numbers and counted its own writes as held).
#[test]
fn a_catch_up_answer_that_arrives_after_the_asker_became_leader_is_ignored() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    net.write("a", "first", json!(0));
    // b drops out of a's members and misses two changes; back, it reads the range from a.
    net.set_view("a", &[("a", true), ("c", true)]);
    net.cut("a", "b");
    net.tick("a");
    net.write("a", "missed1", json!(1));
    net.write("a", "missed2", json!(2));
    net.heal("a", "b");
    net.set_view("a", &[("a", true), ("b", true), ("c", true)]);
    let mut asked = None;
    for _ in 0..20 {
        while let Some(m) = net.queue.pop_front() {
            if m.from == id("b") && m.target.starts_with(LOG) {
                asked = Some(m);
            } else {
                net.deliver(m);
            }
        }
        if asked.is_some() {
            break;
        }
        net.advance(1_000);
        net.tick_all();
    }
    let asked = asked.expect("b asks a for the range it missed");
    // Meanwhile b stops seeing a and claims the lease (a does not hear of it yet).
    let without_a = [("a", false), ("b", true), ("c", true)];
    net.set_view("b", &without_a);
    net.set_view("c", &without_a);
    net.cut("a", "b");
    net.cut("a", "c");
    let now = net.now;
    net.node_mut("b").meta.allow_claim_now(now);
    net.tick("b");
    net.run();
    assert!(net.meta("b").is_leader(net.now));
    net.heal("a", "b");
    let (lease, last, adopted) =
        (net.meta("b").known_lease().cloned(), net.meta("b").last_seq(), net.meta("b").snapshots_adopted());
    // The old leader's page arrives now.
    net.deliver(asked);
    net.run();
    assert!(net.meta("b").is_leader(net.now));
    assert_eq!(net.meta("b").snapshots_adopted(), adopted, "no snapshot of the old leader's adopted");
    assert!(net.meta("b").last_seq() >= last, "the leader's log did not go back");
    assert_eq!(net.meta("b").known_lease().cloned(), lease);
    let r = net.setting("b", "new-term", json!(4));
    net.submit("b", r);
    net.run();
    assert!(net.meta("c").state().get(RecordKind::Setting, "new-term").is_some(), "b leads on its own numbering");
}

/// Issue 18: a follower keeps up to `submit_window` submits in flight, so a change need not
/// wait behind the submit of another (a request's audit entry, most often). Each submit
/// carries records no other one in flight carries, answers may come in any order, and a
/// change leaves the pending queue only with the answer of the submit that carried it.
#[test]
fn several_submits_fly_at_once_within_the_window_and_each_answer_settles_its_own() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig { submit_window: 2, ..MetaConfig::default() });
    let recs: Vec<Record> = (0..3).map(|i| net.setting("b", &format!("k{i}"), json!(i))).collect();
    net.submit("b", recs[0].clone());
    let first = net.take(|m| m.target == SUBMIT);
    net.submit("b", recs[1].clone());
    let second = net.take(|m| m.target == SUBMIT);
    let ids = |m: &Msg| match &m.purpose {
        MetaPurpose::Submit { ids } => ids.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(ids(&first).len(), 1);
    assert_eq!(ids(&second).len(), 1);
    assert_ne!(ids(&first), ids(&second), "each carries its own record");
    // The window is full: the third change waits.
    net.submit("b", recs[2].clone());
    assert!(!net.queue.iter().any(|m| m.target == SUBMIT), "{:?}", net.queue);
    assert_eq!(net.meta("b").pending_len(), 3);

    // The second is answered first: its record leaves the queue, and the third goes out.
    let reply = net.answer(&second);
    net.respond(&second, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    assert_eq!(net.meta("b").pending_len(), 2, "only the answered submit's record left");
    let third = net.take(|m| m.target == SUBMIT);
    assert_eq!(ids(&third).len(), 1);
    assert!(!ids(&third).iter().any(|i| ids(&first).contains(i)), "never the one still in flight");
    for m in [first, third] {
        let reply = net.answer(&m);
        net.respond(&m, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    }
    net.run();
    // c hears of them once the append gap has passed.
    net.rounds(1, MetaConfig::default().append_gap_ms);
    for n in ["a", "b", "c"] {
        assert_eq!(net.meta(n).pending_len(), 0, "{n}");
        for r in &recs {
            let key = match r {
                Record::Setting(s) => s.key.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(net.meta(n).state().get(RecordKind::Setting, &key), Some(r), "{n} {key}");
        }
    }
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());

    // A window of 1 is the old rule: one submit at a time.
    let mut one = cluster(&["a", "b"], MetaConfig { submit_window: 1, ..MetaConfig::default() });
    let r0 = one.setting("b", "x", json!(0));
    let r1 = one.setting("b", "y", json!(1));
    one.submit("b", r0);
    let _in_flight = one.take(|m| m.target == SUBMIT);
    one.submit("b", r1);
    assert!(!one.queue.iter().any(|m| m.target == SUBMIT));
}

/// Issue 18: a lingering record (an audit entry) is not sent on its own at once: it travels
/// with the next change the node sends (one submit, or one append per peer, carries both), or
/// alone once `linger_ms` has passed (on the follower by its submit, on the leader by its
/// appends). `poll_timeout` names that deadline, so a driver that sleeps until it wakes in time.
#[test]
fn a_lingering_record_travels_with_the_next_change_or_alone_after_linger_ms() {
    let linger = 20;
    let mut net = cluster(&["a", "b", "c"], MetaConfig { linger_ms: linger, ..MetaConfig::default() });
    let ids = |m: &Msg| match &m.purpose {
        MetaPurpose::Submit { ids } => ids.clone(),
        other => panic!("{other:?}"),
    };
    // Follower: the audit entry waits; the next change takes it along in one submit.
    let audit = net.setting("b", "audit/1", json!("act"));
    let now = net.now;
    net.node_mut("b").meta.submit_lingering(now, audit.clone());
    net.collect(&id("b"));
    assert_eq!(net.queued(|m| m.target == SUBMIT), 0, "nothing sent for the lingering record alone");
    assert_eq!(net.meta("b").pending_len(), 1, "queued (and persisted) all the same");
    assert!(net.meta("b").poll_timeout().is_some_and(|t| t <= now.plus(linger)), "its deadline is named");
    let change = net.setting("b", "k", json!(1));
    net.submit("b", change.clone());
    let both = net.take(|m| m.target == SUBMIT);
    assert_eq!(ids(&both).len(), 2, "one submit carries the change and the entry before it");
    net.queue.push_front(both);
    net.run();
    for n in ["a", "b", "c"] {
        assert_eq!(net.meta(n).state().get(RecordKind::Setting, "audit/1"), Some(&audit), "{n}");
        assert_eq!(net.meta(n).pending_len(), 0, "{n}");
    }

    // Follower, nothing follows: sent alone once `linger_ms` passed, not before.
    let alone = net.setting("b", "audit/2", json!("act"));
    let now = net.now;
    net.node_mut("b").meta.submit_lingering(now, alone.clone());
    net.collect(&id("b"));
    net.advance(linger - 1);
    net.tick("b");
    // A tick of another timer may send it early; the deadline itself must not be missed.
    net.run();
    net.advance(1);
    net.tick("b");
    net.run();
    for n in ["a", "c"] {
        assert_eq!(net.meta(n).state().get(RecordKind::Setting, "audit/2"), Some(&alone), "{n}");
    }

    // Leader: the entry is in its log at once but no append goes out for it alone.
    let lead = net.setting("a", "audit/3", json!("act"));
    let now = net.now;
    net.node_mut("a").meta.submit_lingering(now, lead.clone());
    net.collect(&id("a"));
    assert_eq!(net.queued(|m| m.target == APPEND), 0, "no append for the lingering entry alone");
    net.advance(linger);
    net.tick("a");
    assert_eq!(net.queued(|m| m.target == APPEND), 2, "after linger_ms, one append per peer");
    net.run();
    for n in ["b", "c"] {
        assert_eq!(net.meta(n).state().get(RecordKind::Setting, "audit/3"), Some(&lead), "{n}");
    }
}

/// Issue 18: the leader's answer to a submit carries back the entries that took the submitted
/// records when they are all the submitter's own and no append to it is in flight: no append
/// goes to the submitter for them (one signed request per write saved), the other follower
/// gets its append, and every log ends equal, entry for entry. The submitter asks (`seqs`) for
/// their numbers alone (`taken`, `null` for a record not taken) and rebuilds the entries from
/// the records it sent; one that does not ask (an older build) gets the entries (`append`). An
/// entry of another origin in the range (or an append in flight) means the ordinary append. A
/// submitter that loses that answer catches up.
#[test]
fn a_submit_answer_carries_the_submitters_own_entries_instead_of_an_append() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    // A record the leader already holds newer is not taken: no number for it.
    let stale = net.setting("b", "k0", json!(0));
    net.advance(1_000);
    let newer = net.setting("a", "k0", json!("newer"));
    net.submit("a", newer);
    net.run();
    let before = net.meta("a").last_seq();
    let (k1, k2) = (net.setting("b", "k1", json!(1)), net.setting("b", "k2", json!(2)));
    let now = net.now;
    net.submit_all_at("b", now, vec![k1, stale, k2]);
    net.collect(&id("b"));
    let submit = net.take(|m| m.target == SUBMIT);
    assert!(String::from_utf8_lossy(&submit.body).contains("\"seqs\":true"));
    let reply = net.answer(&submit);
    let first = before.0 + 1;
    assert_eq!(reply.body["taken"], json!([first, null, first + 1]), "{}", reply.body);
    assert!(reply.body.get("append").is_none(), "{}", reply.body);
    assert_eq!(net.queued(|m| m.target == APPEND && m.to == id("b")), 0, "no append to the submitter");
    let mark = net.trace.len();
    net.respond(&submit, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    net.rounds(5, 10); // c's append waits out the append gap
    assert!(net.trace_from(mark, "b", LOG).is_empty(), "the entries were rebuilt, not read");
    let log = |net: &Net, n: &str| net.meta(n).answer_log(&format!("after={}", before.0)).body;
    for n in ["b", "c"] {
        assert_eq!(net.meta(n).status(net.now).last_seq, net.meta("a").status(net.now).last_seq, "{n}");
        assert_eq!(net.meta(n).state().digest(), net.meta("a").state().digest(), "{n}");
        assert_eq!(log(&net, n), log(&net, "a"), "{n}: the same entries");
    }

    // A submitter that does not ask for numbers gets the entries themselves.
    let rec = net.setting("b", "k3", json!(3));
    net.submit("b", rec);
    let mut submit = net.take(|m| m.target == SUBMIT);
    submit.body = String::from_utf8(submit.body).unwrap().replace("\"seqs\":true,", "").into_bytes();
    let reply = net.answer(&submit);
    assert!(reply.body["append"]["entries"].as_array().is_some_and(|e| e.len() == 1), "{}", reply.body);
    assert!(reply.body.get("taken").is_none(), "{}", reply.body);
    assert_eq!(net.queued(|m| m.target == APPEND && m.to == id("b")), 0, "no append to the submitter");
    assert_eq!(net.queued(|m| m.target == APPEND && m.to == id("c")), 1, "the other follower's append");
    net.respond(&submit, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    net.rounds(5, 10);
    for n in ["b", "c"] {
        assert_eq!(log(&net, n), log(&net, "a"), "{n}: the same entries");
    }

    // Numbers that do not match the submit (here one too many) are not trusted: the range is
    // read from the leader, and the logs still end equal.
    let rec = net.setting("b", "k4", json!(4));
    net.submit("b", rec);
    let submit = net.take(|m| m.target == SUBMIT);
    let mut reply = net.answer(&submit);
    reply.body["taken"].as_array_mut().unwrap().push(json!(999));
    let mark = net.trace.len();
    net.respond(&submit, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    net.rounds(5, 10);
    assert_eq!(net.trace_from(mark, "b", LOG).len(), 1, "the range is read instead");
    for n in ["b", "c"] {
        assert_eq!(log(&net, n), log(&net, "a"), "{n}: the same entries");
    }

    // An append in flight to the submitter (carrying the leader's own write): nothing carried,
    // the ordinary append follows when that one is answered.
    let own = net.setting("a", "mine", json!(0));
    net.submit("a", own);
    net.queue.retain(|m| m.target != APPEND); // not delivered yet, and never answered
    let rec = net.setting("b", "k2", json!(2));
    net.submit("b", rec);
    let submit = net.take(|m| m.target == SUBMIT);
    let reply = net.answer(&submit);
    assert!(reply.body.get("append").is_none() && reply.body.get("taken").is_none(), "{}", reply.body);

    // A submitter that never reads a carried answer finds the gap and catches up.
    let mut lost = cluster(&["a", "b", "c"], MetaConfig::default());
    let rec = lost.setting("b", "k", json!(1));
    lost.submit("b", rec);
    let submit = lost.take(|m| m.target == SUBMIT);
    let reply = lost.answer(&submit);
    assert!(reply.body.get("taken").is_some());
    lost.respond(&submit, Err("the answer was lost".into()));
    lost.rounds(40, 1_000);
    for n in ["b", "c"] {
        assert_eq!(lost.meta(n).status(lost.now).last_seq, lost.meta("a").status(lost.now).last_seq, "{n}");
        assert_eq!(lost.meta(n).state().digest(), lost.meta("a").state().digest(), "{n}");
        assert_eq!(lost.meta(n).pending_len(), 0, "{n}");
    }
}

/// Issue 18: the answers to two submits in flight, each carrying the writer's entries, can
/// arrive in either order. Entries beyond the hole are held back until the earlier answer fills
/// it: no read of the log for a reorder. A hole nothing fills (that answer was lost) is read
/// from the leader once `reorder_wait_ms` has passed.
#[test]
fn answers_to_submits_arriving_out_of_order_fill_the_hole_without_a_log_read() {
    let wait = 300;
    let config = MetaConfig { submit_window: 2, reorder_wait_ms: wait, ..MetaConfig::default() };
    for lose_the_first in [false, true] {
        let mut net = cluster(&["a", "b", "c"], config.clone());
        let r0 = net.setting("b", "k0", json!(0));
        net.submit("b", r0);
        let first = net.take(|m| m.target == SUBMIT);
        let r1 = net.setting("b", "k1", json!(1));
        net.submit("b", r1);
        let second = net.take(|m| m.target == SUBMIT);
        // The leader answers them in order; each answer carries that submit's entry.
        let answer_first = net.answer(&first);
        let answer_second = net.answer(&second);
        assert!(answer_second.body["taken"].as_array().is_some_and(|e| e.len() == 1));
        let before = net.meta("b").last_seq();
        let mark = net.trace.len();
        // b reads the second answer first: its entry waits beyond the hole.
        net.respond(&second, Ok(common::answer(200, serde_json::to_vec(&answer_second.body).unwrap())));
        assert_eq!(net.meta("b").last_seq(), before, "the hole is not skipped");
        assert_eq!(net.queued(|m| m.from == id("b") && m.target.starts_with(LOG)), 0, "no log read yet");
        if lose_the_first {
            net.respond(&first, Err("the answer was lost".into()));
            // Nothing in flight could fill the hole any more: the log is read.
            net.run();
            assert_eq!(net.trace_from(mark, "b", LOG).len(), 1, "the hole is read from the leader");
            // The lost answer's record is sent again at the retry (and merges as the same).
            net.rounds(20, 1_000);
        } else {
            net.respond(&first, Ok(common::answer(200, serde_json::to_vec(&answer_first.body).unwrap())));
            assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq(), "both entries in b's log");
            net.run();
            net.rounds(2, wait);
            assert!(net.trace_from(mark, "b", LOG).is_empty(), "a reorder costs no log read");
        }
        assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());
        assert_eq!(net.meta("b").log_len(), net.meta("a").log_len());
        assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
        assert_eq!(net.meta("b").pending_len(), 0);
    }

    // Held back while a submit is still in flight; read once `reorder_wait_ms` has passed.
    let mut net = cluster(&["a", "b", "c"], config);
    let r0 = net.setting("b", "k0", json!(0));
    net.submit("b", r0);
    let first = net.take(|m| m.target == SUBMIT);
    let r1 = net.setting("b", "k1", json!(1));
    net.submit("b", r1);
    let second = net.take(|m| m.target == SUBMIT);
    let _never_answered = net.answer(&first);
    let answer_second = net.answer(&second);
    net.queue.clear();
    net.respond(&second, Ok(common::answer(200, serde_json::to_vec(&answer_second.body).unwrap())));
    assert_eq!(net.meta("b").poll_timeout().map(|t| t.since(net.now)), Some(wait), "wakes for the hole");
    net.advance(wait - 1);
    net.tick("b");
    assert_eq!(net.queued(|m| m.from == id("b") && m.target.starts_with(LOG)), 0, "not before the wait");
    net.advance(1);
    net.tick("b");
    assert_eq!(net.queued(|m| m.from == id("b") && m.target.starts_with(LOG)), 1, "read at the wait's end");
}

// ---- 2: no leader, then a leader; a 409 from a node that is not the leader ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)" → Replicated log: "Followers submit through
/// the leader (meta/submit) or queue in meta_pending until one is reachable"; reference-facts.md
/// "Log entry": "follower queues meta_pending, POST meta/submit (409 if not leader) retried 15 s"
/// (here `submit_retry_ms`, set to 7 s so the test sees the configured value is used).
#[test]
fn a_submit_without_a_reachable_leader_stays_pending_and_drains_when_a_leader_appears_and_a_409_retries_later() {
    let retry = 7_000;
    let mut net = Net::new(&["a", "b"], MetaConfig { submit_retry_ms: retry, ..MetaConfig::default() });
    net.tick_all();
    net.run();
    assert_eq!(net.meta("b").leader(net.now), None, "nobody claims inside the start grace");

    let rec = net.setting("b", "early", json!(1));
    net.submit("b", rec.clone());
    assert_eq!(setting_of(net.meta("b"), "early").map(|s| s.value), Some(json!(1)));
    assert_eq!(net.meta("b").pending_len(), 1);
    assert!(net.queue.is_empty(), "no leader, nothing to send to: {:?}", net.queue);
    for _ in 0..4 {
        net.advance(5_000);
        net.tick("b");
        assert!(net.queue.is_empty());
    }
    assert_eq!(net.meta("b").pending_len(), 1);

    // A leader appears: the pending change drains to it.
    let now = net.now;
    net.node_mut("a").meta.allow_claim_now(now);
    net.tick("a");
    net.run();
    assert!(net.meta("a").is_leader(net.now));
    assert_eq!(net.meta("b").pending_len(), 0);
    assert_eq!(net.meta("a").state().get(RecordKind::Setting, "early"), Some(&rec));
    assert_eq!(net.meta("a").last_seq(), LogIndex(1));
    let submits = net.trace_from(0, "b", SUBMIT);
    assert_eq!(submits.len(), 1);
    assert_eq!(submits[0].status, 200);

    // The node b believes to be the leader is not (an admin put it in maintenance): 409.
    net.set_view("a", &[("a", false), ("b", true)]);
    net.tick("a");
    assert!(!net.meta("a").is_leader(net.now));
    assert!(net.meta("b").leader(net.now).is_some(), "b still believes in a's lease");
    let mark = net.trace.len();
    let rec2 = net.setting("b", "late", json!(2));
    net.submit("b", rec2.clone());
    net.run();
    let refused = net.trace_from(mark, "b", SUBMIT);
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].status, 409);
    assert_eq!(refused[0].reply["error"]["code"], json!("not_leader"));
    assert_eq!(net.meta("b").pending_len(), 1, "re-queued");
    assert_eq!(setting_of(net.meta("a"), "late"), None);

    // a is back; b retries only once submit_retry_ms has passed.
    net.set_view("a", &[("a", true), ("b", true)]);
    net.tick("a");
    net.run();
    assert!(net.meta("a").is_leader(net.now));
    let refused_at = net.now;
    net.now = refused_at.plus(retry - 1);
    net.tick("b");
    assert_eq!(net.queued(|m| m.target == SUBMIT), 0, "no retry before submit_retry_ms");
    net.now = refused_at.plus(retry);
    net.tick("b");
    assert_eq!(net.queued(|m| m.target == SUBMIT), 1, "retry at submit_retry_ms");
    net.run();
    assert_eq!(net.meta("b").pending_len(), 0);
    assert_eq!(net.meta("a").state().get(RecordKind::Setting, "late"), Some(&rec2));
    assert_eq!(net.meta("a").last_seq(), LogIndex(2));
}

// ---- 3: catch-up pages ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)" → Replicated log: "Gaps are filled by
/// meta/log?after=N"; reference-facts.md "Log entry": "Catch-up GET meta/log?after=N <=500
/// entries {entries,lastSeq,term}" (here `page_max: 5`).
#[test]
fn catch_up_reads_pages_of_at_most_page_max_entries_until_the_follower_holds_the_leaders_last_seq() {
    let mut net = cluster(&["a", "b"], small());
    for i in 0..2 {
        let r = net.setting("a", &format!("early{i}"), json!(i));
        net.submit("a", r);
    }
    net.run();
    let s = net.meta("b").last_seq().0;
    assert_eq!(s, 2);

    // b drops out of a's member list; 23 changes are made meanwhile.
    net.set_view("a", &[("a", true)]);
    net.cut("a", "b");
    net.tick("a");
    for i in 0..23 {
        let r = net.setting("a", &format!("k{i:02}"), json!(i));
        net.submit("a", r);
    }
    net.run();
    assert_eq!(net.meta("a").last_seq(), LogIndex(s + 23));
    assert_eq!(net.meta("b").last_seq(), LogIndex(s));

    // One page: at most page_max entries, starting right after N.
    let page = net.meta("a").answer_log(&format!("after={s}"));
    assert_eq!(page.status(), 200);
    assert_eq!(seqs(&page.body), (s + 1..=s + 5).collect::<Vec<_>>());
    assert_eq!(page.body["lastSeq"], json!(s + 23));
    assert_eq!(page.body["term"], json!(1));
    let tail = net.meta("a").answer_log(&format!("after={}", s + 20));
    assert_eq!(seqs(&tail.body), vec![s + 21, s + 22, s + 23]);
    assert_eq!(seqs(&net.meta("a").answer_log(&format!("after={}", s + 23)).body), Vec::<u64>::new());

    // b is back: it reads page after page until it holds the leader's last sequence number.
    let mark = net.trace.len();
    let adopted = net.meta("b").snapshots_adopted();
    net.set_view("a", &[("a", true), ("b", true)]);
    net.heal("a", "b");
    net.rounds(1, 5_000);
    let reads = net.trace_from(mark, "b", LOG);
    let afters: Vec<u64> = reads.iter().map(|d| after_of(&d.target)).collect();
    assert_eq!(afters, vec![s, s + 5, s + 10, s + 15, s + 20]);
    for d in &reads {
        let after = after_of(&d.target);
        assert_eq!(d.status, 200);
        assert_eq!(seqs(&d.reply), (after + 1..=(after + 5).min(s + 23)).collect::<Vec<_>>());
    }
    assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("b").snapshots_adopted(), adopted, "pages, not a snapshot");
    assert!(net.trace_from(mark, "b", SNAPSHOT).is_empty());
}

// ---- 4: a compacted range falls back to a snapshot ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)" → Replicated log: "a compacted range or a
/// new term triggers a full meta/snapshot"; reference-facts.md "Log entry": "410 if compacted;
/// snapshot GET meta/snapshot {files,volumes,policies,jobs,settings,lastSeq,term}".
#[test]
fn a_catch_up_below_the_compaction_point_is_answered_410_and_the_follower_adopts_a_snapshot() {
    let mut net = cluster(&["a", "b"], small());
    net.set_view("a", &[("a", true)]);
    net.cut("a", "b");
    net.tick("a");
    for i in 0..45 {
        let r = net.setting("a", &format!("k{i:02}"), json!(i));
        net.submit("a", r);
    }
    net.run();
    assert_eq!(net.meta("a").last_seq(), LogIndex(45));
    assert_eq!(net.meta("b").last_seq(), LogIndex(0));
    // Compacted through 20 (at the 40th append, keeping 20).
    assert_eq!(net.meta("a").answer_log("after=0").status(), 410);
    assert_eq!(net.meta("a").answer_log("after=19").status(), 410);
    assert_eq!(net.meta("a").answer_log("after=19").body["compactedThrough"], json!(20));
    assert_eq!(seqs(&net.meta("a").answer_log("after=20").body), vec![21, 22, 23, 24, 25]);

    let mark = net.trace.len();
    let adopted = net.meta("b").snapshots_adopted();
    net.set_view("a", &[("a", true), ("b", true)]);
    net.heal("a", "b");
    net.rounds(1, 5_000);
    let reads = net.trace_from(mark, "b", LOG);
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!((after_of(&reads[0].target), reads[0].status), (0, 410));
    let snaps = net.trace_from(mark, "b", SNAPSHOT);
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].status, 200);
    assert_eq!(net.meta("b").snapshots_adopted(), adopted + 1);
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("b").state().len(), 45);
    assert_eq!(net.meta("b").last_seq(), LogIndex(45));

    // And it follows the log again from there.
    let r = net.setting("a", "after-snapshot", json!(true));
    net.submit("a", r);
    net.run();
    assert_eq!(net.meta("b").last_seq(), LogIndex(46));
    assert_eq!(net.meta("b").snapshots_adopted(), adopted + 1);
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
}

// ---- 5: compaction ----

/// Spec: reference-facts.md "Log entry": "compaction every 1000 appends keep 10000" (here every
/// 10 appends, keeping 20); cluster-runtime.md "Metadata store (ACMS)" → Persistence ("Reading
/// the log back (meta/log, compaction) flushes first": compaction reaches the disk copy).
#[test]
fn every_compact_every_appends_the_log_keeps_only_keep_entries_and_deletes_the_rest_on_disk() {
    let config = small();
    let (every, keep) = (config.compact_every, config.keep_entries);
    let mut net = cluster(&["a", "b"], config);
    let mut deletions = Vec::new();
    for i in 1..=45u64 {
        net.node_mut("a").persisted.clear();
        let r = net.setting("a", &format!("k{i:02}"), json!(i));
        net.submit("a", r);
        net.run();
        let deleted: Vec<LogIndex> = net
            .node("a")
            .persisted
            .iter()
            .filter_map(|p| match p {
                MetaPersist::DeleteEntriesThrough(s) => Some(*s),
                _ => None,
            })
            .collect();
        if i % every == 0 && i > keep {
            assert_eq!(deleted, vec![LogIndex(i - keep)], "append {i}");
            assert_eq!(net.meta("a").log_len() as u64, keep, "append {i}");
            deletions.push(i);
        } else {
            assert!(deleted.is_empty(), "append {i}: {deleted:?}");
        }
        assert!((net.meta("a").log_len() as u64) < keep + every, "append {i}: {}", net.meta("a").log_len());
        assert!((net.meta("b").log_len() as u64) < keep + every, "follower, append {i}");
        assert_eq!(net.meta("b").last_seq(), LogIndex(i));
    }
    assert_eq!(deletions, vec![30, 40]);
    assert_eq!(net.meta("a").log_len(), 25);
    assert_eq!(net.meta("a").answer_log("after=19").status(), 410);
    assert_eq!(seqs(&net.meta("a").answer_log("after=20").body)[0], 21);
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
}

// ---- 6: tombstones in a snapshot ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)" (records "merge last-writer-wins on every
/// node"; a snapshot is the full state); reference-facts.md "Log entry": "snapshot GET
/// meta/snapshot {files,volumes,policies,jobs,settings,lastSeq,term}"; machine.rs: the snapshot
/// "carries tombstones".
#[test]
fn a_snapshot_carries_tombstones_so_a_removed_setting_reaches_a_fresh_follower_as_removed() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let live = net.setting("a", "gone", json!("soon"));
    net.submit("a", live);
    let tomb = net.tombstone("a", "gone");
    net.submit("a", tomb.clone());
    // A later change, so the newest entry (the one an append would carry) is not the tombstone.
    let other = net.setting("a", "other", json!(1));
    net.submit("a", other);
    net.run();
    let snap = net.meta("a").answer_snapshot("");
    assert_eq!(snap.status(), 200);
    let settings = snap.body["settings"].as_array().unwrap();
    let carried = settings.iter().find(|s| s["key"] == json!("gone")).expect("the tombstone is in the snapshot");
    assert_eq!(carried["removed"], json!(true));

    net.advance(1_000);
    net.add("c");
    net.set_view_all(&[("a", true), ("b", true), ("c", true)]);
    net.rounds(1, 5_000);
    assert_eq!(net.meta("c").snapshots_adopted(), 1);
    let got = setting_of(net.meta("c"), "gone").expect("the removed setting is present, as a tombstone");
    assert!(got.removed, "not live: {got:?}");
    assert_eq!(Record::Setting(got), tomb);
    assert_eq!(net.meta("c").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("c").last_seq(), net.meta("a").last_seq());
}

// ---- 7: the follower sends back what the snapshot lacks ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)": records "merge last-writer-wins on every node,
/// so the store converges without a master"; machine.rs: "After a snapshot the follower sends
/// back whatever it holds that the snapshot lacks, so changes acknowledged on the losing side of
/// a partition are not lost"; reference-facts.md "Lease": "No quorum".
#[test]
fn after_a_snapshot_the_follower_sends_back_records_the_leader_lacks() {
    let mut net = Net::new(&["a", "b"], MetaConfig::default());
    // A partition: each side sees only itself and claims a lease of term 1.
    net.cut("a", "b");
    net.set_view("a", &[("a", true), ("b", false)]);
    net.set_view("b", &[("a", false), ("b", true)]);
    let now = net.now;
    net.node_mut("a").meta.allow_claim_now(now);
    net.node_mut("b").meta.allow_claim_now(now);
    net.tick_all();
    net.run();
    assert!(net.meta("a").is_leader(net.now));
    assert!(net.meta("b").is_leader(net.now));
    let only_a = net.setting("a", "only-on-a", json!("a"));
    net.submit("a", only_a.clone());
    let only_b = net.setting("b", "only-on-b", json!("b"));
    net.submit("b", only_b.clone());
    net.run();
    assert_eq!(net.meta("a").pending_len(), 0, "a appended it as leader: nothing pending");
    assert_eq!(setting_of(net.meta("b"), "only-on-a"), None);

    // Heal: (1, b) > (1, a), so b keeps the lease and a takes b's snapshot.
    net.heal("a", "b");
    net.set_view_all(&[("a", true), ("b", true)]);
    let mark = net.trace.len();
    net.rounds(4, 5_000);
    assert!(net.meta("b").is_leader(net.now));
    assert!(!net.meta("a").is_leader(net.now));
    assert!(net.meta("a").snapshots_adopted() >= 1);
    let snap_at = net.trace[mark..]
        .iter()
        .position(|d| d.from == id("a") && d.target == SNAPSHOT && d.status == 200)
        .expect("a took b's snapshot");
    let sent_back = net.trace[mark + snap_at..].iter().any(|d| {
        d.from == id("a")
            && d.target == SUBMIT
            && d.status == 200
            && String::from_utf8_lossy(&d.request).contains("only-on-a")
    });
    assert!(sent_back, "a submits its own record to b after the snapshot");
    assert_eq!(net.meta("b").state().get(RecordKind::Setting, "only-on-a"), Some(&only_a));
    assert_eq!(net.meta("a").state().get(RecordKind::Setting, "only-on-b"), Some(&only_b));
    assert_eq!(net.meta("a").pending_len(), 0);
    assert_eq!(net.meta("a").state().digest(), net.meta("b").state().digest());
    assert_eq!(net.meta("a").last_seq(), net.meta("b").last_seq());
}

// ---- 8: an append from a lesser lease ----

/// Spec: reference-facts.md "Lease": "accept higher term ... else 409 with own lease (pusher
/// adopts if higher)"; cluster-runtime.md "Metadata store (ACMS)" → Leader lease: "every member
/// accepts a lease with a higher term".
#[test]
fn an_append_under_a_lesser_lease_is_refused_with_409_naming_the_known_lease_and_the_old_leader_steps_down() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    // c, cut off from a, sees neither a nor b as eligible and claims term 2; b hears of it.
    net.cut("a", "c");
    net.set_view("c", &[("a", false), ("b", false), ("c", true)]);
    let now = net.now;
    net.node_mut("c").meta.allow_claim_now(now);
    net.tick("c");
    net.run();
    let higher = Lease { holder: id("c"), term: Term(2) };
    assert_eq!(net.meta("b").known_lease(), Some(&higher));
    assert!(net.meta("a").is_leader(net.now), "a has not heard of it");

    let rec = net.setting("a", "stale-leader-write", json!(1));
    net.submit("a", rec);
    let m = net.take(|m| m.target == APPEND && m.to == id("b"));
    let reply = net.answer(&m);
    assert_eq!(reply.status(), 409, "{}", reply.body);
    assert_eq!(reply.body["lease"], serde_json::to_value(&higher).unwrap());
    assert_eq!(net.meta("b").known_lease(), Some(&higher), "b keeps the greater lease");
    assert!(net.meta("a").is_leader(net.now));
    net.respond(&m, Ok(common::answer(reply.status(), serde_json::to_vec(&reply.body).unwrap())));
    assert!(!net.meta("a").is_leader(net.now), "a steps down on reading the 409");
    assert_eq!(net.meta("a").known_lease(), Some(&higher));
}

// ---- 9: anti-entropy ----

/// Spec: cluster-runtime.md "Metadata store (ACMS)": records "converge without a master";
/// machine.rs: "Every lease push carries the leader's last sequence number and state digest; a
/// follower that is caught up, has nothing pending and still differs exchanges snapshots
/// (anti-entropy)", at most once per `anti_entropy_every_ms`.
#[test]
fn a_caught_up_follower_whose_digest_differs_requests_a_snapshot_on_a_lease_push_at_most_once_per_interval() {
    let every = 60_000;
    let mut net = cluster(&["a", "b"], MetaConfig { anti_entropy_every_ms: every, ..MetaConfig::default() });
    let r = net.setting("a", "logged", json!(1));
    net.submit("a", r);
    net.run();
    assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());

    // The leader holds a record its log never carried (read back from its disk copy).
    let restore = |net: &mut Net, key: &str| {
        let rec = net.setting("a", key, json!(key));
        let node = net.node_mut("a");
        node.meta.restore(MetaRestored { records: vec![rec], ..MetaRestored::default() }, &mut node.hlc);
    };
    restore(&mut net, "unlogged-1");
    assert_ne!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("b").pending_len(), 0);

    // The next lease push: b is caught up, has nothing pending, and differs → snapshot.
    let mark = net.trace.len();
    let adopted = net.meta("b").snapshots_adopted();
    let mut pushed_at = None;
    for _ in 0..4 {
        net.rounds(1, 5_000);
        if let Some(p) = net.trace_from(mark, "a", LEASE).first() {
            pushed_at = Some(p.at);
            break;
        }
    }
    let first = pushed_at.expect("a renews its lease within 10 s");
    let snaps = net.trace_from(mark, "b", SNAPSHOT);
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].at, first, "requested on that very push");
    assert_eq!(net.meta("b").snapshots_adopted(), adopted + 1);
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert!(setting_of(net.meta("b"), "unlogged-1").is_some());

    // Differ again: pushes inside the interval do not ask; the first push after it does.
    restore(&mut net, "unlogged-2");
    let mark = net.trace.len();
    while net.now.since(first) < every + 10_000 {
        net.rounds(1, 5_000);
    }
    let pushes = net.trace_from(mark, "a", LEASE);
    let snaps = net.trace_from(mark, "b", SNAPSHOT);
    let inside: Vec<Millis> = pushes.iter().map(|p| p.at).filter(|t| t.since(first) < every).collect();
    assert!(inside.len() >= 4, "several pushes inside the interval: {inside:?}");
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let due = pushes.iter().map(|p| p.at).find(|t| t.since(first) >= every).expect("a push after the interval");
    assert_eq!(snaps[0].at, due, "the first push once anti_entropy_every_ms has passed");
    assert_eq!(net.meta("b").state().digest(), net.meta("a").state().digest());
    assert_eq!(net.meta("b").snapshots_adopted(), adopted + 2);
}

/// machine.rs ("Every lease push carries the leader's last sequence number"): a follower ahead
/// of the number in a push was, under one lease, overtaken by appends sent after the push (a
/// restarted leader claims a new term): no snapshot for that. A leader still short, at the next
/// push, of what the follower held at the previous one lacks the follower's entries: snapshot,
/// and the follower's extras go back to it.
#[test]
fn a_lease_push_overtaken_by_later_appends_starts_no_snapshot_but_a_leader_still_short_at_the_next_push_does() {
    // Every push may reconcile: the interval does not hide what the push alone decides.
    let mut net = cluster(&["a", "b"], MetaConfig { anti_entropy_every_ms: 0, ..MetaConfig::default() });
    let r = net.setting("a", "k0", json!(0));
    net.submit("a", r);
    net.run();
    // a renews its lease; the push is held back while more writes reach b.
    net.advance(10_000);
    net.tick("a");
    let push = net.take(|m| m.target == LEASE);
    let pushed_last = net.meta("a").last_seq();
    for i in 1..=3 {
        let r = net.setting("a", &format!("k{i}"), json!(i));
        net.submit("a", r);
        net.run();
    }
    assert!(net.meta("b").last_seq() > pushed_last, "b is past the number in the held push");
    let adopted = net.meta("b").snapshots_adopted();
    let mark = net.trace.len();
    net.deliver(push);
    net.run();
    assert!(net.trace_from(mark, "b", SNAPSHOT).is_empty(), "an overtaken push starts no snapshot");
    assert_eq!(net.meta("b").snapshots_adopted(), adopted);
    assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());

    // b holds two entries of this lease that a does not (made up: no real leader loses its
    // tail without a new term).
    let last = net.meta("b").last_seq().0;
    let extras: Vec<Entry> = (1..=2u64)
        .map(|i| {
            let record = net.setting("b", &format!("extra{i}"), json!(i));
            let version = record.versions()[0].clone();
            Entry { seq: LogIndex(last + i), term: Term(1), record, version, origin: id("b") }
        })
        .collect();
    let log_meta = LogMeta { term: Term(1), holder: Some(id("a")), last_seq: LogIndex(last + 2), ..LogMeta::default() };
    let node = net.node_mut("b");
    let restored = MetaRestored {
        records: extras.iter().map(|e| e.record.clone()).collect(),
        entries: extras,
        log_meta: Some(log_meta),
        ..MetaRestored::default()
    };
    node.meta.restore(restored, &mut node.hlc);
    // The first push after: ahead once is not enough.
    let mark = net.trace.len();
    while net.trace_from(mark, "a", LEASE).is_empty() {
        net.rounds(1, 5_000);
    }
    assert!(net.trace_from(mark, "b", SNAPSHOT).is_empty(), "ahead at one push only");
    // The next: a is still short of what b held at the first → snapshot, extras sent back.
    let mark = net.trace.len();
    while net.trace_from(mark, "a", LEASE).is_empty() {
        net.rounds(1, 5_000);
    }
    net.rounds(2, 1_000);
    assert!(!net.trace_from(mark, "b", SNAPSHOT).is_empty(), "the leader stayed short: snapshot");
    assert_eq!(net.meta("b").snapshots_adopted(), adopted + 1);
    assert!(setting_of(net.meta("a"), "extra2").is_some(), "b's extras reach the leader");
}

// ---- 10: malformed bodies ----

/// What must not move when a request is refused as malformed.
fn fingerprint(meta: &Meta) -> (String, LogIndex, Option<Lease>, usize, usize) {
    (meta.state().digest(), meta.last_seq(), meta.known_lease().cloned(), meta.pending_len(), meta.log_len())
}

/// A leader `a` with one entry, a follower `b`, and a valid body of each kind (from real traffic).
fn malformed_fixture() -> (Net, Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let r = net.setting("b", "k", json!(1));
    net.submit("b", r);
    let submit = net.queue.iter().find(|m| m.target == SUBMIT).unwrap().body.clone();
    net.run();
    let r = net.setting("a", "k2", json!(2));
    net.submit("a", r);
    let append = net.queue.iter().find(|m| m.target == APPEND).unwrap().body.clone();
    net.run();
    net.advance(10_000);
    net.tick("a");
    let lease = net.queue.iter().find(|m| m.target == LEASE).unwrap().body.clone();
    net.run();
    (net, lease, append, submit)
}

/// Feed `body` to every body-taking answer as `a` → `b` (lease, append) and `b` → `a` (submit at
/// the leader); returns the statuses. Nothing may change and nothing may be sent.
fn feed(net: &mut Net, body: &[u8]) -> [u16; 3] {
    let now = net.now;
    let (fa, fb) = (fingerprint(net.meta("a")), fingerprint(net.meta("b")));
    let lease = net.node_mut("b").meta.answer_lease(now, &id("a"), body).status();
    let node = net.node_mut("b");
    let append = node.meta.answer_append(now, &id("a"), body, &mut node.hlc).status();
    let node = net.node_mut("a");
    let submit = node.meta.answer_submit(now, &id("b"), body, &mut node.hlc).status();
    assert_eq!(fingerprint(net.meta("a")), fa);
    assert_eq!(fingerprint(net.meta("b")), fb);
    net.collect(&id("a"));
    net.collect(&id("b"));
    assert!(net.queue.is_empty(), "a refused request sends nothing: {:?}", net.queue);
    [lease, append, submit]
}

/// Spec: cluster-runtime.md "Metadata store (ACMS)" (meta/lease, meta/append, meta/submit,
/// meta/log, meta/snapshot are answered to peers); machine.rs: malformed bodies are answered
/// 400 `bad_body`; a handler never panics on what a peer sends.
#[test]
fn malformed_bodies_and_queries_to_every_answer_are_refused_with_400_and_change_nothing() {
    let (mut net, lease, append, submit) = malformed_fixture();
    let a_lease = json!({"holder": "a", "term": 1});
    // The leader's own last_seq, so the lease part of those bodies is a plain renewal.
    let last = net.meta("a").last_seq().0;
    let all = [400, 400, 400];
    // A well-formed lease body with a malformed append part is still a good lease push.
    let not_append = [200, 400, 400];
    // An append whose entries are read one by one: an unreadable entry is refused alone.
    let bad_entry = [200, 200, 400];
    // A submit whose records are read one by one: an unreadable record is refused alone.
    let bad_record = [400, 400, 200];
    let cases: Vec<(Vec<u8>, [u16; 3])> = vec![
        (b"".to_vec(), all),
        (b"not json".to_vec(), all),
        (b"\xff\xfe\x00".to_vec(), all),
        (b"null".to_vec(), all),
        (b"[]".to_vec(), all),
        (b"{}".to_vec(), all),
        (b"42".to_vec(), all),
        (b"\"lease\"".to_vec(), all),
        (json!({"lease": null}).to_string().into_bytes(), all),
        (json!({"lease": {"holder": "a"}}).to_string().into_bytes(), all),
        (json!({"lease": {"holder": "a", "term": -1}}).to_string().into_bytes(), all),
        (json!({"lease": {"holder": "a", "term": "1"}}).to_string().into_bytes(), all),
        (json!({"lease": {"holder": 7, "term": 1}}).to_string().into_bytes(), all),
        (json!({"lease": a_lease, "entries": [], "lastSeq": "one"}).to_string().into_bytes(), all),
        (json!({"lease": a_lease, "entries": "x", "lastSeq": last}).to_string().into_bytes(), not_append),
        (json!({"lease": a_lease, "entries": [{"seq": 1}], "lastSeq": last}).to_string().into_bytes(), bad_entry),
        (json!({"lease": a_lease, "lastSeq": last}).to_string().into_bytes(), not_append),
        (json!({"records": 5}).to_string().into_bytes(), all),
        (json!({"records": [{"kind": "nope", "payload": {}}]}).to_string().into_bytes(), bad_record),
        (json!({"records": [{"kind": "setting", "payload": {"key": 1}}]}).to_string().into_bytes(), bad_record),
        (lease[..lease.len() - 1].to_vec(), all),
        (append[..append.len() / 2].to_vec(), all),
        (submit[..submit.len() - 1].to_vec(), all),
    ];
    for (body, expected) in &cases {
        let statuses = feed(&mut net, body);
        assert_eq!(&statuses, expected, "{}", String::from_utf8_lossy(body));
    }
    // Well-formed, but pushed by a node that does not hold the lease it carries.
    let now = net.now;
    let forged = net.node_mut("b").meta.answer_lease(now, &id("c"), &lease);
    assert_eq!(forged.status(), 400);
    let node = net.node_mut("b");
    assert_eq!(node.meta.answer_append(now, &id("c"), &append, &mut node.hlc).status(), 400);
    // Bodies carry an error code.
    let r = net.node_mut("b").meta.answer_lease(now, &id("a"), b"{");
    assert_eq!(r.body["error"]["code"], json!("bad_body"));

    // meta/log: a malformed `after` is a 400; no query, or any number, is a page or a 410.
    for q in ["after=", "after=abc", "after=-1", "after=1.5", "after=0x10", "after=99999999999999999999"] {
        assert_eq!(net.meta("a").answer_log(q).status(), 400, "{q}");
    }
    let queries =
        [("", 0), ("x=1", 0), ("after=0", 0), ("x=y&after=1", 1), ("after=18446744073709551614", u64::MAX - 1)];
    for (q, after) in queries.into_iter().chain([("after=18446744073709551615", u64::MAX)]) {
        let r = net.meta("a").answer_log(q);
        assert_eq!(r.status(), 200, "{q}");
        assert!(seqs(&r.body).iter().all(|s| *s > after), "{q}: {}", r.body);
    }
    assert!(seqs(&net.meta("a").answer_log("after=18446744073709551615").body).is_empty());
    // meta/snapshot takes no body and always answers.
    assert_eq!(net.meta("a").answer_snapshot("").status(), 200);
    assert_eq!(net.meta("b").answer_snapshot("").status(), 200);
}

fn purposes() -> Vec<MetaPurpose> {
    vec![
        MetaPurpose::LeasePush,
        MetaPurpose::Append { through: LogIndex(1) },
        MetaPurpose::Submit { ids: vec![1] },
        MetaPurpose::CatchUp,
        MetaPurpose::Snapshot { after: None },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Spec: as above; random bytes, and every strict prefix of a real body (never valid JSON),
    /// are refused with 400 by meta/lease, meta/append and meta/submit, and change nothing.
    #[test]
    fn random_or_truncated_bodies_are_refused_with_400(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        cut in any::<usize>(),
    ) {
        let (mut net, lease, append, submit) = malformed_fixture();
        prop_assert_eq!(feed(&mut net, &bytes), [400, 400, 400]);
        for body in [&lease, &append, &submit] {
            let prefix = &body[..cut % body.len()];
            prop_assert_eq!(feed(&mut net, prefix), [400, 400, 400]);
        }
    }

    /// meta/log never panics on a query, and answers a page, a 410 or a 400.
    #[test]
    fn any_log_query_is_answered_without_panicking(q in "\\PC{0,24}", n in any::<u64>()) {
        let (net, _, _, _) = malformed_fixture();
        let r = net.meta("a").answer_log(&q);
        prop_assert!(matches!(r.status(), 200 | 400 | 410), "{} {}", q, r.status());
        let r = net.meta("a").answer_log(&format!("after={n}"));
        prop_assert_eq!(r.status(), 200);
    }

    /// The requester side: any answer, garbage included, to any request is read without panicking.
    #[test]
    fn any_answer_to_any_request_is_read_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        status in prop::sample::select(vec![0u16, 200, 400, 409, 410, 500]),
    ) {
        let (mut net, _, _, _) = malformed_fixture();
        let now = net.now;
        for p in purposes() {
            for n in ["a", "b"] {
                let node = net.node_mut(n);
                node.meta.on_response(now, &id("a"), p.clone(), if status == 0 { Err("no answer".into()) } else { Ok(common::answer(status, bytes.clone())) }, &mut node.hlc);
                node.meta.on_response(now, &id("b"), p.clone(), Err("reset".into()), &mut node.hlc);
            }
        }
        net.collect(&id("a"));
        net.collect(&id("b"));
    }
}

// ---- one bad entry never blocks the log ----

/// A JSON value nested `depth` levels (a scalar is 1).
fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 1..depth {
        v = Value::Array(vec![v]);
    }
    v
}

/// The text of an append from `a` carrying `entries` (raw JSON each) up to `last`.
fn append_text(entries: &[String], last: u64) -> Vec<u8> {
    format!(r#"{{"lease":{{"holder":"a","term":1}},"entries":[{}],"lastSeq":{last}}}"#, entries.join(",")).into_bytes()
}

fn entry_text(seq: u64, key: &str, value: &str, wall: u64) -> String {
    format!(
        r#"{{"seq":{seq},"term":1,"kind":"setting","payload":{{"key":"{key}","value":{value},"version":{{"wallMs":{wall},"counter":0,"node":"a"}}}},"version":{{"wallMs":{wall},"counter":0,"node":"a"}},"origin":"a"}}"#
    )
}

/// Issue 11: a setting nested ~125 levels, wrapped in an append, went past the follower's
/// parser depth, and every later append was refused for ever. Entries are now read one by one:
/// the one that cannot be read is refused alone (and reported), its position passed over, and
/// the entries after it are taken.
#[test]
fn an_entry_too_deep_to_read_is_refused_alone_and_the_log_goes_on_past_it() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let last = net.meta("b").last_seq().0;
    let wall = net.wall().0;
    let deep = "[".repeat(130) + &"]".repeat(130);
    let body = append_text(
        &[entry_text(last + 1, "deep", &deep, wall), entry_text(last + 2, "after", "7", wall + 1)],
        last + 2,
    );
    let now = net.now;
    let node = net.node_mut("b");
    let r = node.meta.answer_append(now, &id("a"), &body, &mut node.hlc);
    assert_eq!(r.status(), 200, "{}", r.body);
    assert_eq!(r.body["lastSeq"], json!(last + 2), "the follower is past both entries");
    assert_eq!(r.body["passedOver"], json!([last + 1]), "but names the one it passed over");
    net.collect(&id("b"));
    assert!(net.queue.is_empty(), "no catch-up is needed: {:?}", net.queue);
    assert_eq!(setting_of(net.meta("b"), "after").map(|s| s.value), Some(json!(7)));
    assert_eq!(setting_of(net.meta("b"), "deep"), None);
    let status = net.meta("b").status(now);
    assert_eq!(status.json()["refused"], json!(1));
    assert!(status.json()["lastRefusal"].as_str().unwrap().contains(&format!("entry {}", last + 1)), "{status:?}");
    assert_eq!(net.node("b").refusals.len(), 1, "the refusal is reported for the log");

    // A record that parses but is out of bounds (nested past the record bound) is refused too.
    let too_deep = nested(shoal_core::meta::records::RECORD_VALUE_DEPTH_MAX + 1).to_string();
    let body = append_text(&[entry_text(last + 3, "deep2", &too_deep, wall + 2)], last + 3);
    let node = net.node_mut("b");
    let r = node.meta.answer_append(now, &id("a"), &body, &mut node.hlc);
    assert_eq!(r.body["lastSeq"], json!(last + 3));
    assert_eq!(r.body["passedOver"], json!([last + 1, last + 3]), "a leader that sends no heldThrough hears of all");
    assert_eq!(setting_of(net.meta("b"), "deep2"), None);
    assert_eq!(net.meta("b").status(now).json()["refused"], json!(2));
    // A leader that holds the follower confirmed through last + 1 hears only of what is after.
    let later = |held: u64| {
        let body = append_text(&[entry_text(last + 4, "fine", "4", wall + 3)], last + 4);
        [&body[..body.len() - 1], format!(r#","heldThrough":{held}}}"#).as_bytes()].concat()
    };
    let node = net.node_mut("b");
    let r = node.meta.answer_append(now, &id("a"), &later(last + 1), &mut node.hlc);
    assert_eq!((r.body["lastSeq"].clone(), r.body["passedOver"].clone()), (json!(last + 4), json!([last + 3])));
    let r = node.meta.answer_append(now, &id("a"), &later(last + 3), &mut node.hlc);
    assert!(r.body.get("passedOver").is_none(), "nothing passed over after last + 3: {}", r.body);
    // A leader that holds the follower confirmed through its log's end (or past it, as a
    // restarted follower's log may be shorter) hears of nothing, and nothing breaks.
    for held in [last + 4, last + 9] {
        let r = node.meta.answer_append(now, &id("a"), &later(held), &mut node.hlc);
        assert_eq!(r.status(), 200);
        assert!(r.body.get("passedOver").is_none(), "{}", r.body);
    }
}

/// Issue 18: a follower of an earlier build passes over an entry it cannot read (a record kind
/// it does not know), and its log's end still reaches past it. It names that position in its
/// answer, so the leader does not count it holding that change: a leader's write that no other
/// node could read is not acknowledged `replicated` (it was, when the leader counted the
/// follower's log end). A later change the followers take is held as before.
#[test]
fn a_leaders_change_its_followers_passed_over_is_not_counted_held() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    net.write("a", "warm", json!(0));
    let from = net.meta("a").write_mark();
    let r = net.setting("a", "new-kind", json!(1));
    net.submit("a", r);
    let to = net.meta("a").write_mark();
    for f in ["b", "c"] {
        let mut m = net.take(|m| m.target == APPEND && m.to == id(f));
        let text = String::from_utf8(m.body).unwrap();
        assert!(text.contains(r#""heldThrough":"#), "the leader tells each follower how far it holds it: {text}");
        m.body = text.replace(r#""kind":"setting""#, r#""kind":"from-a-newer-version""#).into_bytes();
        let mark = net.trace.len();
        net.deliver(m);
        let d = &net.trace[mark];
        assert_eq!(d.reply["lastSeq"], json!(net.meta("a").last_seq().0), "{f}'s log end is past the entry");
        assert_eq!(d.reply["passedOver"], json!([net.meta("a").last_seq().0]), "{f} names it");
    }
    net.run();
    assert_eq!(setting_of(net.meta("b"), "new-kind"), None);
    assert!(!net.meta("a").mark_held(&from, &to), "no follower holds the change");
    assert!(!net.meta("a").held_elsewhere(RecordKind::Setting, "new-kind"));

    let from = net.meta("a").write_mark();
    net.write("a", "later", json!(2));
    let to = net.meta("a").write_mark();
    assert!(net.meta("a").mark_held(&from, &to), "a later change the followers read is held");
    assert!(net.meta("a").held_elsewhere(RecordKind::Setting, "later"));
}

/// A follower whose log follows another leader's numbering takes the records of an append
/// from a new lease holder but confirms none of its positions: its own log's end counts in the
/// other numbering (found in review: a number past the leader's made the leader count entries
/// the follower never received as held, and never send them again).
#[test]
fn an_append_under_another_numbering_confirms_no_position() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    for i in 0..5 {
        net.write("a", &format!("k{i}"), json!(i));
    }
    let last = net.meta("b").last_seq().0;
    assert!(last >= 5);
    // c, holding a higher term, appends its first entry: number 1 of its numbering.
    let wall = net.wall().0;
    let entry = entry_text(1, "from-c", "1", wall)
        .replace(r#""term":1"#, r#""term":7"#)
        .replace(r#""node":"a""#, r#""node":"c""#);
    let body = format!(r#"{{"lease":{{"holder":"c","term":7}},"entries":[{entry}],"lastSeq":1}}"#);
    let now = net.now;
    assert!(!net.meta("b").records_settling(), "on the leader's numbering");
    let node = net.node_mut("b");
    let r = node.meta.answer_append(now, &id("c"), body.as_bytes(), &mut node.hlc);
    assert_eq!(r.status(), 200, "{}", r.body);
    assert_eq!(r.body["lastSeq"], json!(0), "no position of c's numbering is held");
    assert!(net.meta("b").records_settling(), "a suffix of another numbering may hold half a move");
    assert!(net.meta("b").status(net.now).records_settling, "and its status says so");
    assert!(setting_of(net.meta("b"), "from-c").is_some(), "the record itself is taken");
    net.collect(&id("b"));
    assert!(net.queue.iter().any(|m| m.to == id("c") && m.target.starts_with(SNAPSHOT)), "b asks c for a snapshot");
}

/// The same on catch-up: a page read entry by entry.
#[test]
fn a_log_page_with_an_unreadable_entry_still_brings_the_follower_to_the_end() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let last = net.meta("b").last_seq().0;
    let wall = net.wall().0;
    let deep = "{\"x\":".repeat(130) + "1" + &"}".repeat(130);
    let page = format!(
        r#"{{"entries":[{},{}],"lastSeq":{},"term":1,"holder":"a"}}"#,
        entry_text(last + 1, "deep", &deep, wall),
        entry_text(last + 2, "after", "8", wall + 1),
        last + 2
    );
    let now = net.now;
    let node = net.node_mut("b");
    node.meta.on_response(
        now,
        &id("a"),
        MetaPurpose::CatchUp,
        Ok(common::answer(200, page.into_bytes())),
        &mut node.hlc,
    );
    assert_eq!(net.meta("b").last_seq(), LogIndex(last + 2));
    assert_eq!(setting_of(net.meta("b"), "after").map(|s| s.value), Some(json!(8)));
    assert_eq!(net.meta("b").status(now).json()["refused"], json!(1));
}

/// A submit carrying a record out of bounds (or unreadable) among good ones: the good ones are
/// appended, the bad one is named in the answer, and the submitter drops it from its queue and
/// reports it, so its queue never sticks on it.
#[test]
fn a_submitted_record_out_of_bounds_is_refused_alone_and_the_submitter_moves_on() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let good = net.setting("b", "good", json!(1));
    let wall = net.wall().0;
    let bad = format!(
        r#"{{"kind":"setting","payload":{{"key":"bad","value":{},"version":{{"wallMs":{wall},"counter":9,"node":"b"}}}}}}"#,
        nested(shoal_core::meta::records::RECORD_VALUE_DEPTH_MAX + 1)
    );
    let body = format!(r#"{{"records":[{bad},{}]}}"#, serde_json::to_string(&good).unwrap());
    let now = net.now;
    let node = net.node_mut("a");
    let r = node.meta.answer_submit(now, &id("b"), body.as_bytes(), &mut node.hlc);
    assert_eq!(r.status(), 200, "{}", r.body);
    assert_eq!(r.body["refused"][0]["index"], json!(0));
    assert_eq!(setting_of(net.meta("a"), "good").map(|s| s.value), Some(json!(1)));
    assert_eq!(setting_of(net.meta("a"), "bad"), None);
    assert_eq!(net.meta("a").status(now).json()["refused"], json!(1));

    // The submitter reads the refusal in the answer and reports it.
    let node = net.node_mut("b");
    let answer = serde_json::to_vec(&r.body).unwrap();
    node.meta.on_response(
        now,
        &id("a"),
        MetaPurpose::Submit { ids: vec![] },
        Ok(common::answer(200, answer)),
        &mut node.hlc,
    );
    net.collect(&id("b"));
    assert!(net.node("b").refusals.iter().any(|r| r.contains("our submitted record")), "{:?}", net.node("b").refusals);
}

/// Clock skew: a follower whose clock runs more than `AHEAD_MAX_MS` ahead of the leader's
/// stamps versions the leader will not take (they would win over every later write). The
/// leader names the record in the submit's `refused`, and the submitter's acknowledgement
/// says the change was refused instead of counting it held elsewhere (it is on the submitter
/// only): before, the leader dropped it silently and the write was acknowledged `replicated`.
#[test]
fn a_record_from_a_clock_too_far_ahead_is_refused_by_name_and_its_change_is_not_acknowledged_as_held() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    net.write("a", "warm", json!(0));
    // The link is down while b makes two changes, so both go in one submit when it is back:
    // the refused record is the second of the batch (its index must map to its own change).
    net.cut("a", "b");
    let from = net.meta("b").write_mark();
    let fine = net.setting("b", "fine", json!(2));
    net.submit("b", fine);
    let mid = net.meta("b").write_mark();
    let ahead = net.wall().0 + shoal_core::hlc::AHEAD_MAX_MS + 60_000;
    let version = shoal_core::hlc::Version { wall_ms: ahead, counter: 0, node: id("b") };
    let skewed = Record::Setting(Setting { key: "skewed".into(), value: json!(1), removed: false, version });
    net.submit("b", skewed);
    let to = net.meta("b").write_mark();
    net.run();
    assert_eq!(net.meta("b").pending_len(), 2, "nothing reached the leader");
    net.heal("a", "b");
    let retry = MetaConfig::default().submit_retry_ms;
    net.rounds(3, retry / 2 + 1);

    assert_eq!(setting_of(net.meta("a"), "skewed"), None, "the leader does not take it");
    assert_eq!(setting_of(net.meta("a"), "fine").map(|s| s.value), Some(json!(2)), "the other record goes on");
    let batch = net
        .trace
        .iter()
        .find(|d| d.target == SUBMIT && d.status == 200)
        .map(|d| (serde_json::from_slice::<Value>(&d.request).unwrap(), d.reply["refused"].clone()))
        .expect("a submit was answered");
    assert_eq!(batch.0["records"].as_array().map(Vec::len), Some(2), "one submit carried both: {}", batch.0);
    assert_eq!(batch.1.as_array().map(Vec::len), Some(1), "{}", batch.1);
    assert_eq!(batch.1[0]["index"], json!(1));
    assert!(batch.1[0]["why"].as_str().is_some_and(|w| w.contains("ahead")), "{}", batch.1);
    assert_eq!(net.meta("b").pending_len(), 0);
    assert!(net.meta("b").mark_refused(&mid, &to), "the skewed change is known refused");
    assert!(net.meta("b").mark_refused(&from, &to), "so is a span covering it");
    assert!(!net.meta("b").mark_refused(&from, &mid), "the other change is not");
    assert!(net.meta("b").mark_held(&from, &mid));
    assert!(net.node("b").refusals.iter().any(|r| r.contains("ahead")), "{:?}", net.node("b").refusals);
}

/// A local write out of bounds is never stored, queued or sent (the commands refuse it first
/// with a clear error; this is the last guard), and it is reported.
#[test]
fn a_local_write_out_of_bounds_is_neither_stored_nor_sent() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    for n in ["a", "b"] {
        let r = net.setting(n, "deep", nested(shoal_core::meta::records::RECORD_VALUE_DEPTH_MAX + 1));
        let before = net.node(n).persisted.len();
        net.submit(n, r);
        assert!(net.queue.is_empty(), "{n}: nothing sent");
        assert_eq!(net.node(n).persisted.len(), before, "{n}: nothing stored");
        assert_eq!(setting_of(net.meta(n), "deep"), None);
        assert_eq!(net.meta(n).pending_len(), 0);
        assert_eq!(net.node(n).refusals.len(), 1, "{n}: reported");
    }
    // At the bound it is taken.
    let r = net.setting("b", "ok", nested(shoal_core::meta::records::RECORD_VALUE_DEPTH_MAX));
    net.submit("b", r);
    net.run();
    assert!(setting_of(net.meta("a"), "ok").is_some());
}

/// Records and pending submits out of bounds on disk (an older build stored them) are dropped
/// at restore, deleted from disk and reported: the node starts, and never serves them.
#[test]
fn records_out_of_bounds_on_disk_are_dropped_at_restore_not_fatal() {
    let mut net = Net::new(&["a"], MetaConfig::default());
    let deep = net.setting("a", "deep", nested(100));
    let fine = net.setting("a", "fine", json!(2));
    let mut hlc = Hlc::new(id("a"));
    let mut meta = Meta::new(id("a"), MetaConfig::default(), net.now);
    meta.restore(
        MetaRestored {
            records: vec![deep.clone(), fine],
            pending: vec![shoal_core::meta::log::Pending { id: 4, record: deep, sent_back_based: None }],
            ..MetaRestored::default()
        },
        &mut hlc,
    );
    assert_eq!(setting_of(&meta, "fine").map(|s| s.value), Some(json!(2)));
    assert_eq!(setting_of(&meta, "deep"), None);
    assert_eq!(meta.pending_len(), 0);
    let mut outputs = Vec::new();
    while let Some(o) = meta.poll_output() {
        outputs.push(o);
    }
    assert!(outputs.iter().any(|o| matches!(o, MetaOutput::Persist(MetaPersist::DeleteRecord(k)) if k.1 == "deep")));
    assert!(outputs.iter().any(|o| matches!(o, MetaOutput::Persist(MetaPersist::DeletePending(4)))));
    assert_eq!(outputs.iter().filter(|o| matches!(o, MetaOutput::Refused { .. })).count(), 2);
}

/// "Log a refused append": a peer's 400 to what we sent is reported with its message.
#[test]
fn a_peer_refusing_our_append_is_reported_with_its_reason() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let now = net.now;
    let body = br#"{"error":{"code":"bad_body","message":"append body: recursion limit exceeded"}}"#.to_vec();
    let node = net.node_mut("a");
    node.meta.on_response(
        now,
        &id("b"),
        MetaPurpose::Append { through: LogIndex(1) },
        Ok(common::answer(400, body)),
        &mut node.hlc,
    );
    net.collect(&id("a"));
    assert_eq!(net.node("a").refusals, vec!["our append: append body: recursion limit exceeded".to_string()]);
}

/// A follower that catches up by a snapshot carrying records it cannot read (a kind a newer
/// version keeps: an unknown list in the page) says so in its next append answer
/// (`unreadThrough`), and the leader does not count it holding the changes that snapshot
/// stood for. Found in review: the snapshot's positions counted held, so a leader's write
/// no other node could read was answered `replicated` after all. A snapshot it read whole
/// counts as before, and so does a later change.
#[test]
fn a_snapshot_the_follower_could_not_read_whole_does_not_count_as_held() {
    for unknown in [false, true] {
        let mut net = cluster(&["a", "b"], small());
        net.set_view("a", &[("a", true)]);
        net.cut("a", "b");
        net.tick("a");
        let from = net.meta("a").write_mark();
        for i in 0..45 {
            let r = net.setting("a", &format!("k{i:02}"), json!(i));
            net.submit("a", r);
        }
        net.run();
        let to = net.meta("a").write_mark();
        net.set_view("a", &[("a", true), ("b", true)]);
        net.heal("a", "b");
        net.advance(5_000);
        net.tick_all();
        let adopted = net.meta("b").snapshots_adopted();
        while let Some(m) = net.queue.pop_front() {
            if !(unknown && m.target.starts_with(SNAPSHOT)) {
                net.deliver(m);
                continue;
            }
            let reply = net.answer(&m);
            let mut body = reply.body.clone();
            body["widgets"] = json!([{"id": "w1"}]);
            net.respond(&m, Ok(common::answer(reply.status(), serde_json::to_vec(&body).unwrap())));
        }
        assert_eq!(net.meta("b").snapshots_adopted(), adopted + 1);
        let later_from = net.meta("a").write_mark();
        let r = net.setting("a", "later", json!(true));
        net.submit("a", r);
        net.run();
        let later_to = net.meta("a").write_mark();
        assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());
        assert_eq!(net.meta("a").mark_held(&from, &to), !unknown, "unknown content in the snapshot: {unknown}");
        assert_eq!(net.meta("a").held_elsewhere(RecordKind::Setting, "k44"), !unknown);
        assert!(net.meta("a").mark_held(&later_from, &later_to), "a later change is held");
        assert!(net.meta("a").held_elsewhere(RecordKind::Setting, "later"));
    }
}

/// What a follower passed over holds back only the leader's own changes there: a request whose
/// range also spans another node's entry the follower could not read is still held once the
/// follower confirms the leader's own (found in review: any passed-over position in the range
/// kept it waiting, then answered `unconfirmed`).
#[test]
fn another_nodes_entry_a_follower_passed_over_does_not_hold_back_the_leaders_own() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    net.write("a", "warm", json!(0));
    let from = net.meta("a").write_mark();
    net.write("b", "theirs", json!(1));
    let theirs = net.meta("a").last_seq();
    let r = net.setting("a", "ours", json!(2));
    net.submit("a", r);
    let to = net.meta("a").write_mark();
    let m = net.take(|m| m.target == APPEND && m.to == id("b"));
    let reply = net.answer(&m);
    let mut body = reply.body.clone();
    assert_eq!(body["lastSeq"], json!(net.meta("a").last_seq()));
    body["passedOver"] = json!([theirs]);
    net.respond(&m, Ok(common::answer(reply.status(), serde_json::to_vec(&body).unwrap())));
    net.run();
    assert!(net.meta("a").mark_held(&from, &to), "b holds a's own change");
    assert!(net.meta("a").held_elsewhere(RecordKind::Setting, "ours"));
}

/// A follower passes over the leader's change, its answer is lost, and its log compacts past
/// that position before an answer gets through: it can no longer name the position, so it
/// says up to where it cannot vouch (`unreadThrough`), and the change is not counted held.
#[test]
fn a_passed_over_position_compacted_before_an_answer_got_through_is_not_held() {
    let mut net = cluster(&["a", "b"], small());
    net.write("a", "warm", json!(0));
    let from = net.meta("a").write_mark();
    let r = net.setting("a", "new-kind", json!(1));
    net.submit("a", r);
    let to = net.meta("a").write_mark();
    // b takes each append (the change always as a kind it cannot read), but no answer reaches
    // a, until b has compacted past the change.
    for i in 0..30 {
        if i > 0 {
            let r = net.setting("a", &format!("k{i:02}"), json!(i));
            net.submit("a", r);
        }
        while let Some(mut m) = net.queue.pop_front() {
            if m.target == APPEND && m.to == id("b") {
                let text = String::from_utf8(m.body).unwrap();
                m.body = text
                    .replace(
                        r#""kind":"setting","payload":{"key":"new-kind""#,
                        r#""kind":"from-a-newer-version","payload":{"key":"new-kind""#,
                    )
                    .into_bytes();
                let _ = net.answer(&m);
                net.respond(&m, Err("the answer was lost".into()));
            } else {
                net.deliver(m);
            }
        }
    }
    assert_eq!(setting_of(net.meta("b"), "new-kind"), None);
    assert!(net.meta("b").answer_log("after=1").status() == 410, "b compacted past the change");
    net.write("a", "after", json!(true));
    assert_eq!(net.meta("b").last_seq(), net.meta("a").last_seq());
    assert!(!net.meta("a").mark_held(&from, &to), "b cannot vouch for the compacted position");
}

/// A live file record at `path` written through `n` (content `c`, 64 hex digits).
fn file_rec(net: &mut Net, n: &str, path: &str, c: char) -> shoal_core::meta::records::FileRecord {
    let wall = net.wall();
    let version = net.node_mut(n).hlc.next(wall);
    serde_json::from_value(json!({
        "id": "11111111-2222-4333-8444-555555555555", "path": path, "size": 1,
        "checksum": c.to_string().repeat(64), "version": version,
    }))
    .expect("a file record")
}

/// The records of a move decided on `n` from `f`: the file at `to`, the tombstone at `f`'s path.
fn move_recs(
    net: &mut Net,
    n: &str,
    f: &shoal_core::meta::records::FileRecord,
    to: &str,
) -> (shoal_core::meta::records::FileRecord, shoal_core::meta::records::FileRecord) {
    use shoal_core::meta::records::FileRecord;
    let wall = net.wall();
    let v1 = net.node_mut(n).hlc.next(wall);
    let v2 = net.node_mut(n).hlc.next(wall);
    let based_on = Some(f.based_on_this());
    let moved = FileRecord { path: to.into(), version: v1, based_on: based_on.clone(), ..f.clone() };
    let tomb = FileRecord { removed: true, version: v2, based_on, ..f.clone() };
    (moved, tomb)
}

fn live_checksum(meta: &Meta, path: &str) -> Option<char> {
    meta.state().file(path).filter(|f| !f.removed).and_then(|f| f.checksum.chars().next())
}

/// `BasedOn` at the leader: a move's two records are taken in either order (after a snapshot
/// a follower sends its records back in key order, the tombstone first: the other record of
/// the same decision is no change since); a leader that holds an older record at the source,
/// or none, has not seen what the deciding node saw and takes the move; a leader that holds a
/// newer one refuses both records by name, with its record at each key.
#[test]
fn a_moves_records_are_checked_against_the_leaders_record_of_the_source() {
    // Tombstone first, then the moved record, one submit: both taken.
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(f.clone()));
    net.run();
    let (moved, tomb) = move_recs(&mut net, "b", &f, "/d/m1");
    let now = net.now;
    net.submit_all_at("b", now, vec![Record::File(tomb.clone()), Record::File(moved.clone())]);
    net.collect(&id("b"));
    net.run();
    assert_eq!(live_checksum(net.meta("a"), "/d/m1"), Some('a'), "the moved record is taken after its tombstone");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), None);
    assert_eq!(net.meta("a").status(now).based_refused, 0);

    // A leader with no record of the source (it never saw it): taken.
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "b", "/d/f2", 'c');
    let (moved, tomb) = move_recs(&mut net, "b", &f, "/d/m2");
    let now = net.now;
    net.submit_all_at("b", now, vec![Record::File(moved), Record::File(tomb)]);
    net.collect(&id("b"));
    net.run();
    assert_eq!(live_checksum(net.meta("a"), "/d/m2"), Some('c'), "a leader behind takes it");
    assert_eq!(net.meta("a").status(now).based_refused, 0);

    // A leader holding newer content at the source (an overwrite b had not seen): refused.
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "a", "/d/f3", 'a');
    net.submit("a", Record::File(f.clone()));
    net.run();
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f3", 'b');
    let (moved, tomb) = move_recs(&mut net, "b", &f, "/d/m3");
    let now = net.now;
    net.submit_at("a", now, Record::File(over));
    net.submit_all_at("b", now, vec![Record::File(moved), Record::File(tomb)]);
    net.collect(&id("a"));
    net.collect(&id("b"));
    let submit = net.take(|m| m.target.ends_with("meta/submit"));
    let answer = net.answer(&submit);
    let refused = answer.body["refused"].as_array().cloned().unwrap_or_default();
    assert_eq!(refused.len(), 2, "both records are refused: {}", answer.body);
    assert!(refused.iter().all(|r| r["changed"] == json!(true)), "{refused:?}");
    assert!(refused[1]["current"].to_string().contains(&"b".repeat(64)), "with the leader's record: {}", refused[1]);
    assert_eq!(refused[0]["current"], Value::Null, "nothing at the new path");
    assert_eq!(net.meta("a").status(now).based_refused, 2);
    net.respond(&submit, Ok(common::answer(answer.status(), serde_json::to_vec(&answer.body).unwrap())));
    net.run();
    assert_move_refused(&net, "/d/f3", "/d/m3");
}

/// `POST meta/based` (a new leader's check of its own queued removes and moves): a member names
/// its record at each path asked about when it is newer than the version given, nothing else;
/// it changes nothing; a body that is not the check's shape is a 400.
#[test]
fn a_member_names_its_newer_records_at_the_paths_a_new_leader_asks_about() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let old = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(old.clone()));
    net.run();
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f1", 'b');
    net.submit("a", Record::File(over.clone()));
    net.run();
    let ask = |version: &shoal_core::hlc::Version, path: &str| {
        json!({"based": [{"path": path, "version": version}]}).to_string()
    };
    let digest = net.meta("b").state().digest();
    let r = net.meta("b").answer_based(ask(&old.version, "/d/f1").as_bytes());
    assert_eq!(r.status(), 200, "{}", r.body);
    let named = r.body["records"].as_array().cloned().unwrap_or_default();
    assert_eq!(named.len(), 1, "{}", r.body);
    assert!(named[0].to_string().contains(&"b".repeat(64)), "the overwrite: {}", named[0]);
    let r = net.meta("b").answer_based(ask(&over.version, "/d/f1").as_bytes());
    assert_eq!(r.body["records"], json!([]), "nothing newer than the overwrite");
    let r = net.meta("b").answer_based(ask(&old.version, "/d/none").as_bytes());
    assert_eq!(r.body["records"], json!([]), "nothing at an unknown path");
    assert_eq!(net.meta("b").state().digest(), digest, "a read only");
    for bad in [&b"{"[..], b"[]", br#"{"based":[{"path":"/d/f1"}]}"#, br#"{"based":[],"x":1}"#] {
        assert_eq!(net.meta("b").answer_based(bad).status(), 400, "{}", String::from_utf8_lossy(bad));
    }
}

/// A leader counts a member in maintenance or draining (alive, not lease-eligible) as one it
/// reaches: in touch with it, the leader decides removes and moves into its log at once, and only
/// when no member is reachable at all does it lead alone (and queue them for the others' check).
/// Counted by lease eligibility, such a member was unreachable: a two-node cluster with the other
/// node in maintenance queued every remove and move for ever (found by the session's review).
#[test]
fn a_leader_counts_a_member_in_an_admin_state_as_reachable() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    net.rounds(4, 5_000);
    let (now, wall) = (net.now, net.wall());
    let (ja, jb) = (net.nodes[&id("a")].joined, net.nodes[&id("b")].joined);
    let with = |b_reachable: bool| {
        vec![
            Candidate { id: id("a"), joined: ja, eligible: true, reachable: true },
            Candidate { id: id("b"), joined: jb, eligible: false, reachable: b_reachable },
        ]
    };
    net.timeout_at("a", now, wall, with(true));
    assert!(net.meta("a").is_leader(now));
    assert!(!net.meta("a").leader_may_lag(now), "b, in maintenance, still follows and answers");
    net.timeout_at("a", now, wall, with(false));
    assert!(net.meta("a").leader_may_lag(now), "no member reachable: a leads alone");
}

/// A leader that lost touch with its member (its lease pushes go unanswered for a lease period)
/// queues its own move for the check; the ask gets no answer, so the move stays queued and is
/// asked about again a retry period later, not put into the log as if the member held nothing
/// newer. Once the member answers, the move goes into the log and reaches it.
#[test]
fn a_leaders_check_asks_again_a_member_that_did_not_answer() {
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(f.clone()));
    net.run();
    net.cut("a", "b");
    net.rounds(8, 5_000);
    assert!(net.meta("a").is_leader(net.now));
    assert!(net.meta("a").leader_may_lag(net.now), "b has not answered for a lease period");
    let (moved, tomb) = move_recs(&mut net, "a", &f, "/d/m1");
    let now = net.now;
    net.submit_all_at("a", now, vec![Record::File(moved), Record::File(tomb)]);
    net.collect(&id("a"));
    net.run();
    assert_eq!(net.meta("a").pending_len(), 2, "queued: the ask got no answer");
    net.rounds(2, 5_000);
    assert_eq!(net.meta("a").pending_len(), 2, "still queued before the retry");
    net.heal("a", "b");
    net.rounds(4, 5_000);
    assert_eq!(net.meta("a").pending_len(), 0, "asked again and put into the log");
    assert!(net.meta("b").state().file("/d/f1").is_some_and(|r| r.removed), "b has the move");
    assert!(net.meta("b").state().file("/d/m1").is_some_and(|r| !r.removed));
}

/// A leader whose own move waits for its check ([`Meta::leader_may_lag`]) marks a copy of the
/// moved file at its new path (a copy mark, a planner's backoff: the moved record's path and
/// header version, no `BasedOn`). The mark waits in the queue behind the move: appended at
/// once, it gave the others the moved record before the check, and when the check refuted the
/// move (the member held a newer overwrite at the old path), the leader undid its own record
/// but the others kept the one the mark brought: the file at both paths (simulator `--races`
/// seed 6091). Undone, the move takes its marks with it.
#[test]
fn a_mark_of_a_leaders_unchecked_move_waits_for_the_check_and_goes_with_an_undone_move() {
    use shoal_core::meta::records::FileRecord;
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(f.clone()));
    net.run();
    net.cut("a", "b");
    net.rounds(8, 5_000);
    assert!(net.meta("a").is_leader(net.now));
    assert!(net.meta("a").leader_may_lag(net.now), "b has not answered for a lease period");
    // b, cut off, holds a newer write of the file (its own, queued for a leader).
    let over = file_rec(&mut net, "b", "/d/f1", 'b');
    let now = net.now;
    net.submit_at("b", now, Record::File(over));
    // a moves the file from its older record; the move waits for the check.
    let (moved, tomb) = move_recs(&mut net, "a", &f, "/d/m1");
    net.submit_all_at("a", now, vec![Record::File(moved.clone()), Record::File(tomb)]);
    let seq = net.meta("a").last_seq();
    let mark = FileRecord { based_on: None, ..moved };
    net.submit_at("a", now, Record::File(mark));
    assert_eq!(net.meta("a").pending_len(), 3, "the mark waits behind the move");
    assert_eq!(net.meta("a").last_seq(), seq, "nothing went into the log");
    // They meet: b's record refutes the move, and the mark goes with it.
    net.heal("a", "b");
    net.rounds(6, 5_000);
    assert!(net.meta("a").status(net.now).based_refused >= 1, "the check refused the move");
    assert_eq!(net.meta("a").pending_len(), 0);
    assert_move_refused(&net, "/d/f1", "/d/m1");
}

/// A follower's submit carries its move and, after it, a copy mark of the moved record (its
/// path and header version, no `BasedOn`). The leader refuses the move (it holds a newer
/// overwrite of the source), and the mark with it, by name: taken alone, the mark would give
/// the leader, and every member after it, the moved record the refusal kept out.
#[test]
fn a_leader_refuses_a_mark_of_a_move_it_refuses_in_the_same_submit() {
    use shoal_core::meta::records::FileRecord;
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let f = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(f.clone()));
    net.run();
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f1", 'b');
    let (moved, tomb) = move_recs(&mut net, "b", &f, "/d/m1");
    let mark = FileRecord { based_on: None, ..moved.clone() };
    let now = net.now;
    net.submit_at("a", now, Record::File(over));
    net.submit_all_at("b", now, vec![Record::File(moved), Record::File(tomb), Record::File(mark)]);
    net.collect(&id("a"));
    net.collect(&id("b"));
    let submit = net.take(|m| m.target.ends_with("meta/submit"));
    let answer = net.answer(&submit);
    let refused = answer.body["refused"].as_array().cloned().unwrap_or_default();
    assert_eq!(refused.len(), 3, "the move's two records and the mark: {}", answer.body);
    assert!(refused.iter().all(|r| r["changed"] == json!(true)), "{refused:?}");
    assert!(net.meta("a").state().file("/d/m1").is_none(), "the leader holds nothing at the new path");
    net.respond(&submit, Ok(common::answer(answer.status(), serde_json::to_vec(&answer.body).unwrap())));
    net.run();
    assert_move_refused(&net, "/d/f1", "/d/m1");
}

/// A live record of another file at `path` (id `x`), written through `n`.
fn other_file_rec(net: &mut Net, n: &str, path: &str, c: char) -> shoal_core::meta::records::FileRecord {
    let wall = net.wall();
    let version = net.node_mut(n).hlc.next(wall);
    serde_json::from_value(json!({
        "id": "99999999-2222-4333-8444-555555555555", "path": path, "size": 1,
        "checksum": c.to_string().repeat(64), "version": version,
    }))
    .expect("a file record")
}

/// A new file put through a node that never knew the file at its path (another id), newer
/// than that file, meets a remove of that file decided without it, newer still: the remove's
/// tombstone never saw the new file, and the leader writes the new file's record again just
/// above it, so the new file stays (it had won the path over the old one; the remove took the
/// old one only). Before, last-writer-wins dropped it although it was answered `replicated`.
/// Either order of arrival at the leader; the submitter of the new file takes the record
/// written again with its submit's answer. A new file older than the one the remove was
/// decided from had lost the path to it already and stays lost (last-writer-wins, as without
/// the remove).
#[test]
fn a_new_file_a_remove_never_saw_is_kept_over_its_tombstone() {
    // The tombstone first, then the new file.
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let (_, tomb) = move_recs(&mut net, "a", &y, "/d/m1");
    net.submit("a", Record::File(tomb));
    net.run();
    let now = net.now;
    net.submit_at("b", now, Record::File(x));
    assert_eq!(live_checksum(net.meta("b"), "/d/f1"), None, "the tombstone wins on b meanwhile");
    net.collect(&id("b"));
    let submit = net.take(|m| m.target.ends_with("meta/submit"));
    let answer = net.answer(&submit);
    assert_eq!(answer.body["writtenAgain"].as_array().map(Vec::len), Some(1), "{}", answer.body);
    net.respond(&submit, Ok(common::answer(answer.status(), serde_json::to_vec(&answer.body).unwrap())));
    assert_eq!(live_checksum(net.meta("b"), "/d/f1"), Some('x'), "b holds it again with the answer");
    net.run();
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('x'), "{n} keeps the new file");
    }

    // The new file first (it wins the path over the old one), then the remove's tombstone
    // arriving without what it was decided from (as an older build sends it back after a
    // snapshot; with it, and not sent back, the leader refuses it `changed`: it holds a newer
    // record there).
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(y.clone()));
    net.run();
    net.cut("b", "c");
    net.cut("a", "c");
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.submit("b", Record::File(x));
    net.run();
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('x'));
    net.advance(1);
    let (_, tomb) = move_recs(&mut net, "c", &y, "/d/m1");
    let sent_back = shoal_core::meta::records::FileRecord { based_on: None, ..tomb };
    let now = net.now;
    net.submit_at("c", now, Record::File(sent_back));
    net.heal("a", "c");
    net.heal("b", "c");
    net.collect(&id("c"));
    net.run();
    for n in ["a", "b", "c"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('x'), "{n} keeps the new file");
    }
    // The record written again goes into the log before the tombstone it meets (which, older
    // than it, changes nothing and is not logged): no member holds the tombstone winning over
    // the file (and listing its copies) in between.
    let page = net.meta("a").answer_log("after=0").body;
    let at_f1: Vec<bool> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["payload"]["path"] == "/d/f1")
        .map(|e| e["payload"]["removed"].as_bool().unwrap_or(false))
        .collect();
    let kept = at_f1.iter().rposition(|removed| !removed).expect("the kept file");
    assert!(at_f1[..kept].iter().skip(2).all(|removed| !removed), "no tombstone before it: {at_f1:?}");

    // A new file older than the one the remove took: lost to it already, not brought back.
    let mut net = cluster(&["a", "b"], MetaConfig::default());
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(y.clone()));
    net.run();
    net.advance(1);
    let (_, tomb) = move_recs(&mut net, "a", &y, "/d/m1");
    net.submit("a", Record::File(tomb));
    net.run();
    let now = net.now;
    net.submit_at("b", now, Record::File(x));
    net.collect(&id("b"));
    net.run();
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{n}: last-writer-wins, as without the remove");
    }
}

/// `meta/submit` straight into `leader`'s machine, as from `from`: its answer's body.
fn submit_to(net: &mut Net, leader: &str, from: &str, records: Vec<Record>) -> Value {
    let now = net.now;
    let body = json!({ "records": records }).to_string();
    let node = net.node_mut(leader);
    let answer = node.meta.answer_submit(now, &id(from), body.as_bytes(), &mut node.hlc);
    assert_eq!(answer.status(), 200, "{}", answer.body);
    answer.body
}

/// `meta/submit` straight into `leader`'s machine, as from `from`, expecting it answered
/// `own_check_pending` (nothing of it taken): the leader's own remove or move at one of its
/// paths waits for its check.
fn submit_waits_for_check(net: &mut Net, leader: &str, from: &str, records: Vec<Record>) {
    let now = net.now;
    let body = json!({ "records": records }).to_string();
    let paths: Vec<String> = records.iter().map(|r| r.key()).collect();
    let held = |net: &Net| -> (Value, Vec<String>) {
        let files = paths.iter().map(|p| format!("{:?}", net.meta(leader).state().file(p))).collect();
        (net.meta(leader).answer_log("after=0").body, files)
    };
    let before = held(net);
    let node = net.node_mut(leader);
    let answer = node.meta.answer_submit(now, &id(from), body.as_bytes(), &mut node.hlc);
    assert_eq!(answer.status(), 503, "{}", answer.body);
    assert_eq!(answer.body["error"]["code"], "own_check_pending", "{}", answer.body);
    assert!(answer.body["retryMs"].as_u64().is_some_and(|ms| ms < 15_000), "a short retry: {}", answer.body);
    assert!(held(net) == before, "nothing of the submit was taken");
}

/// The leader `a` leads cut off from `b` and moves `/d/f1` to `/d/m1`: the move waits for its
/// check. Returns the cluster (still cut) and the file moved.
fn a_move_waiting_for_its_check() -> (Net, shoal_core::meta::records::FileRecord) {
    let (mut net, y) = one_file(MetaConfig::default());
    net.cut("a", "b");
    net.rounds(8, 5_000);
    assert!(net.meta("a").leader_may_lag(net.now));
    (net, y)
}

/// `a` decides a move of `y` to `/d/m1` and submits its two records (outputs not collected).
fn submit_move_on_a(net: &mut Net, y: &shoal_core::meta::records::FileRecord) {
    let (moved, tomb) = move_recs(net, "a", y, "/d/m1");
    let now = net.now;
    net.submit_all_at("a", now, vec![Record::File(moved), Record::File(tomb)]);
}

/// Moves `y` on `a` (its move waits for its check).
fn move_on_a(net: &mut Net, y: &shoal_core::meta::records::FileRecord) {
    submit_move_on_a(net, y);
    assert_eq!(net.meta("a").pending_len(), 2, "the move waits for its check");
}

/// Moves `y` on `a`, and the network settles.
fn move_on_a_and_settle(net: &mut Net, y: &shoal_core::meta::records::FileRecord) {
    submit_move_on_a(net, y);
    net.collect(&id("a"));
    net.run();
}

/// On `a` and `b`: the moved file at `to` holds content `c`, and `/d/f1` stays removed.
fn assert_moved_holds(net: &Net, to: &str, c: char) {
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), to), Some(c), "{n}: the moved file at {to}");
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{n}: the old path stays removed");
    }
}

/// A record that meets a tombstone of the leader's own remove or move still waiting for its
/// check (a new file of another id, or an overwrite of the moved file, either decided without
/// the move) waits for the check: the leader takes nothing of that submit and asks for it again
/// shortly. Taken at once, it lost to the tombstone, answered `replicated`, and was gone (README,
/// the limit this lifts; the first attempts at it were withdrawn after review). Once the check
/// has passed, the new file is kept over the tombstone beside the moved file, and the overwrite
/// is carried to the moved file; refuted (the member holds a newer overwrite), last-writer-wins
/// decides as without the move.
#[test]
fn a_record_meeting_a_leaders_unchecked_move_waits_for_its_check() {
    // The check refutes the move: the overwrite the member holds wins the path.
    let (mut net, y) = a_move_waiting_for_its_check();
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let over = file_rec(&mut net, "b", "/d/f1", 'b');
    let now = net.now;
    net.submit_at("b", now, Record::File(over));
    net.advance(1);
    move_on_a(&mut net, &y);
    submit_waits_for_check(&mut net, "a", "b", vec![Record::File(x)]);
    net.heal("a", "b");
    net.rounds(6, 5_000);
    assert!(net.meta("a").status(net.now).based_refused >= 1, "the check refused the move");
    assert_move_refused(&net, "/d/f1", "/d/m1");

    // The check passes: the new file, sent again, is kept over the move's tombstone.
    let (mut net, y) = a_move_waiting_for_its_check();
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    move_on_a(&mut net, &y);
    submit_waits_for_check(&mut net, "a", "b", vec![Record::File(x.clone())]);
    net.heal("a", "b");
    net.rounds(6, 5_000);
    assert_eq!(net.meta("a").pending_len(), 0, "the move passed its check");
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(x)]);
    assert_eq!(answer["writtenAgain"].as_array().map(Vec::len), Some(1), "kept: {answer}");
    net.rounds(4, 5_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('x'), "{n} keeps the new file");
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('a'), "{n} keeps the moved file");
    }

    // The check passes: an overwrite of the moved file decided without the move (not yet on
    // its node's records when the member answered the check) is carried to the new path.
    let (mut net, y) = a_move_waiting_for_its_check();
    let over = file_rec(&mut net, "b", "/d/f1", 'b');
    net.advance(1);
    move_on_a(&mut net, &y);
    submit_waits_for_check(&mut net, "a", "b", vec![Record::File(over.clone())]);
    net.heal("a", "b");
    net.rounds(6, 5_000);
    assert_eq!(net.meta("a").pending_len(), 0, "the move passed its check");
    submit_to(&mut net, "a", "b", vec![Record::File(over)]);
    net.rounds(4, 5_000);
    assert_moved_holds(&net, "/d/m1", 'b');
}

/// The window the wait closes, end to end through a submitter's queue: the leader `a` moves
/// `/d/f1` while it may lag (`c` was out of touch), and asks `b` and `c` what they hold there.
/// `b` answers (nothing newer), then takes a new file at `/d/f1` (another id, decided before it
/// heard of the move) and submits it while `c`'s answer is still on its way. The leader takes
/// none of that submit until `c` has answered; `b` sends it again, and the new file is kept over
/// the move's tombstone beside the moved file on every member. (Taken at once, it lost to the
/// tombstone, which reached `b` with the move and dropped it there too, though `b` had answered
/// it `replicated`.)
#[test]
fn a_new_file_submitted_while_the_leaders_move_is_checked_is_kept() {
    let mut net = cluster(&["a", "b", "c"], MetaConfig::default());
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(y.clone()));
    net.run();
    net.cut("a", "c");
    net.rounds(8, 5_000);
    assert!(net.meta("a").leader_may_lag(net.now));
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    submit_move_on_a(&mut net, &y);
    net.collect(&id("a"));
    let ask_b = net.take(|m| m.to == id("b") && m.target.ends_with("meta/based"));
    let ask_c = net.take(|m| m.to == id("c") && m.target.ends_with("meta/based"));
    net.deliver(ask_b);
    net.heal("a", "c");
    let now = net.now;
    net.submit_at("b", now, Record::File(x));
    net.collect(&id("b"));
    let submit = net.take(|m| m.from == id("b") && m.target.ends_with("meta/submit"));
    net.deliver(submit);
    net.deliver(ask_c);
    net.run();
    assert_eq!(net.meta("a").pending_len(), 0, "the move passed its check");
    net.rounds(6, 1_000);
    for n in ["a", "b", "c"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('x'), "{n} keeps the new file");
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('a'), "{n} keeps the moved file");
    }
}

/// The leader remembers the files it kept over a tombstone: a later put of the same file,
/// newer than the put kept but older than the record written for it, sent in a later submit
/// (the second of two quick writes, sent while the first's submit was in flight), is kept above
/// it too; an older put of that file, or a put of another file, is not (last-writer-wins).
#[test]
fn a_later_put_of_a_kept_file_in_a_later_submit_is_kept_above_it() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let x0 = other_file_rec(&mut net, "b", "/d/f1", 'w');
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let x2 = other_file_rec(&mut net, "b", "/d/f1", 'z');
    net.advance(1);
    move_on_a_and_settle(&mut net, &y);
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(x)]);
    assert_eq!(answer["writtenAgain"].as_array().map(Vec::len), Some(1), "x kept: {answer}");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('x'));
    // An older put of the kept file, and a put of another file: not kept above it.
    submit_to(&mut net, "a", "b", vec![Record::File(x0)]);
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('x'), "an older put loses");
    let other: shoal_core::meta::records::FileRecord = serde_json::from_value(json!({
        "id": "77777777-2222-4333-8444-555555555555", "path": "/d/f1", "size": 1,
        "checksum": "o".repeat(64), "version": x2.version.clone(),
    }))
    .expect("a file record");
    submit_to(&mut net, "a", "b", vec![Record::File(other)]);
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('x'), "another file older than the keep loses");
    // The later put of the kept file, in a submit of its own.
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(x2)]);
    let again = answer["writtenAgain"].as_array().cloned().unwrap_or_default();
    assert_eq!(again.len(), 1, "{answer}");
    assert_eq!(again[0]["payload"]["checksum"], "z".repeat(64), "{answer}");
    net.rounds(3, 1_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('z'), "{n} keeps the later put");
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('a'), "{n} keeps the moved file");
    }
    // Once a newer write took the path (made after its node saw the keep), a put between the
    // keep's versions is older than that write and loses to it.
    let kept = net.meta("a").state().file("/d/f1").cloned().expect("the kept file");
    let between = shoal_core::meta::records::FileRecord {
        checksum: "q".repeat(64),
        version: shoal_core::hlc::Version { counter: kept.version.counter - 1, ..kept.version.clone() },
        ..kept.clone()
    };
    net.advance(1);
    let wall = net.wall();
    let newer = shoal_core::meta::records::FileRecord {
        checksum: "v".repeat(64),
        version: net.node_mut("b").hlc.next(wall),
        ..kept
    };
    submit_to(&mut net, "a", "b", vec![Record::File(newer)]);
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(between)]);
    assert!(!answer.to_string().contains(&"q".repeat(64)), "not written again: {answer}");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('v'), "the newer write stays");
}

/// The leader's own move of `/d/f1` waits for its check and a new file of its own takes the
/// old path meanwhile (a log rotated: `mv log log.1`, then a new `log`): an overwrite of the
/// moved file decided without the move waits for the check too, and is then carried to the
/// moved file. (Taken at once, it lost to the leader's new file by last-writer-wins, and the
/// moved file kept the old content: found by the session's review.)
#[test]
fn an_overwrite_waits_for_the_check_when_the_leader_reused_the_old_path() {
    let (mut net, y) = a_move_waiting_for_its_check();
    let over = file_rec(&mut net, "b", "/d/f1", 'b');
    net.advance(1);
    move_on_a(&mut net, &y);
    net.advance(1);
    let wall = net.wall();
    let fresh: shoal_core::meta::records::FileRecord = serde_json::from_value(json!({
        "id": "77777777-2222-4333-8444-555555555555", "path": "/d/f1", "size": 1,
        "checksum": "n".repeat(64), "version": net.node_mut("a").hlc.next(wall),
    }))
    .expect("a file record");
    net.submit("a", Record::File(fresh));
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('n'), "the leader's new file is at the old path");
    submit_waits_for_check(&mut net, "a", "b", vec![Record::File(over.clone())]);
    net.heal("a", "b");
    net.rounds(6, 5_000);
    assert_eq!(net.meta("a").pending_len(), 0, "the move passed its check");
    submit_to(&mut net, "a", "b", vec![Record::File(over)]);
    net.rounds(4, 5_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('n'), "{n}: the new file keeps the old path");
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('b'), "{n}: the moved file took the overwrite");
    }
}

/// A new file kept over a move's tombstone that never saw it, then removed or moved on by its
/// node before that node heard of the keep (decided from the version it put, which the leader
/// wrote again above the tombstone): the remove or move is taken, above the kept record, in
/// either order of a move's two records. Before, the remove lost to the kept record (or was
/// refused `changed`) and the removed file came back; a move left the file at both paths.
#[test]
fn a_remove_or_move_of_a_kept_file_decided_before_the_keep_is_taken() {
    for change in ["remove", "move", "move, tombstone first"] {
        let (mut net, y) = one_file(MetaConfig::default());
        net.advance(1);
        let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
        net.advance(1);
        let mut records = vec![Record::File(x.clone())];
        match change {
            "remove" => {
                let wall = net.wall();
                let v = net.node_mut("b").hlc.next(wall);
                let tomb = shoal_core::meta::records::FileRecord {
                    removed: true,
                    version: v,
                    based_on: Some(x.based_on_this()),
                    ..x.clone()
                };
                records.push(Record::File(tomb));
            }
            _ => {
                let (moved, tomb) = move_recs(&mut net, "b", &x, "/d/x2");
                if change == "move" {
                    records.extend([Record::File(moved), Record::File(tomb)]);
                } else {
                    records.extend([Record::File(tomb), Record::File(moved)]);
                }
            }
        }
        net.advance(1);
        move_on_a_and_settle(&mut net, &y);
        let answer = submit_to(&mut net, "a", "b", records);
        assert!(answer["refused"].as_array().is_some_and(Vec::is_empty), "{change}: {answer}");
        net.rounds(3, 1_000);
        for n in ["a", "b"] {
            assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{change}: {n}: the old path stays removed");
            assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('a'), "{change}: {n} keeps the moved file");
            let at_x2 = live_checksum(net.meta(n), "/d/x2");
            assert_eq!(
                at_x2,
                if change == "remove" { None } else { Some('x') },
                "{change}: {n} at the new file's new path"
            );
        }
    }
}

/// Two quick writes of a new file kept over a move's tombstone (x, then x2 above it), then a
/// move of the file its node decided from x2: a follower that still held the first record kept
/// (x) when it took the move's tombstone sends nothing back (the tombstone's writer made that
/// record), and the leader, handed its own record back anyway, does not carry it to the moved
/// file (found by review: the moved file took x's older content, its copies x2's bytes).
#[test]
fn a_leaders_own_keep_record_sent_back_is_not_carried_to_the_moved_file() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let x2 = other_file_rec(&mut net, "b", "/d/f1", 'z');
    net.advance(1);
    let (moved_b, tomb_b) = move_recs(&mut net, "b", &x2, "/d/x2");
    net.advance(1);
    move_on_a_and_settle(&mut net, &y);
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(x), Record::File(x2)]);
    let first_kept = answer["writtenAgain"][0]["payload"].clone();
    assert_eq!(first_kept["checksum"], "x".repeat(64), "{answer}");
    submit_to(&mut net, "a", "b", vec![Record::File(moved_b), Record::File(tomb_b)]);
    assert_eq!(live_checksum(net.meta("a"), "/d/x2"), Some('z'), "the move took x2");
    // b takes the records kept and the move's tombstone from the leader: nothing sent back.
    let mark = net.trace.len();
    net.rounds(3, 1_000);
    assert_eq!(live_checksum(net.meta("b"), "/d/x2"), Some('z'));
    let sent_back = net.trace_from(mark, "b", "/cluster/acn/meta/submit");
    assert!(
        sent_back.is_empty(),
        "b sent back {:?}",
        sent_back.iter().map(|d| String::from_utf8_lossy(&d.request).to_string()).collect::<Vec<_>>()
    );
    // The first record kept, sent back.
    let echo: shoal_core::meta::records::FileRecord = serde_json::from_value(first_kept).expect("a file record");
    submit_to(&mut net, "a", "b", vec![Record::File(echo)]);
    net.rounds(3, 1_000);
    assert_moved_holds(&net, "/d/x2", 'z');
}

/// An overwrite this node made before it led (acknowledged on its side of a partition, then
/// dropped here by the tombstone of another node's move decided without it), sent back to it by
/// a follower once it leads: carried to the moved file as any overwrite that raced a move. Only
/// a record of this leader's own over a tombstone it wrote itself is left alone (its keep
/// record, come back: [`a_leaders_own_keep_record_sent_back_is_not_carried_to_the_moved_file`]).
#[test]
fn an_overwrite_the_leader_made_before_it_led_is_carried_when_sent_back() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f1", 'p');
    net.advance(1);
    let (moved, tomb) = move_recs(&mut net, "b", &y, "/d/m1");
    submit_to(&mut net, "a", "b", vec![Record::File(moved), Record::File(tomb)]);
    assert_eq!(live_checksum(net.meta("a"), "/d/m1"), Some('a'));
    submit_to(&mut net, "a", "b", vec![Record::File(over)]);
    net.rounds(3, 1_000);
    assert_moved_holds(&net, "/d/m1", 'p');
}

/// A submitter answered `own_check_pending` sends its records again after the leader's short
/// `retryMs`, not the whole `submit_retry_ms`.
#[test]
fn a_submit_answered_own_check_pending_is_sent_again_shortly() {
    let (mut net, _) = one_file(MetaConfig::default());
    let x = other_file_rec(&mut net, "b", "/d/f2", 'x');
    let now = net.now;
    net.submit_at("b", now, Record::File(x));
    net.collect(&id("b"));
    let submit = net.take(|m| m.target.ends_with("meta/submit"));
    // As a leader answers while its own move at that path waits for its check.
    let body = json!({"error": {"code": "own_check_pending", "message": "wait"}, "retryMs": 500});
    net.respond(&submit, Ok(common::answer(503, serde_json::to_vec(&body).unwrap())));
    net.collect(&id("b"));
    assert_eq!(net.queued(|m| m.target.ends_with("meta/submit")), 0, "not at once");
    net.advance(500);
    net.tick("b");
    let again = net.queued(|m| m.from == id("b") && m.target.ends_with("meta/submit"));
    assert_eq!(again, 1, "sent again after the hint, not the whole submit_retry_ms");
}

/// A move took a file from `/d/f1`; a new file (another id) put there without knowing it was
/// kept over the move's tombstone; then an overwrite of the moved file decided before its node
/// heard of the move arrives: it is carried to the new path as when the tombstone was still
/// there (the moved record names where it came from), and the kept file stays. (Before, the
/// kept file hid the tombstone, the overwrite went in at the old path under the kept file, and
/// its content was lost: found by the session's review.)
#[test]
fn an_overwrite_racing_a_move_is_carried_past_a_new_file_kept_at_the_old_path() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let over = file_rec(&mut net, "b", "/d/f1", 'c');
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    move_on_a_and_settle(&mut net, &y);
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(x)]);
    assert_eq!(answer["writtenAgain"].as_array().map(Vec::len), Some(1), "{answer}");
    submit_to(&mut net, "a", "b", vec![Record::File(over)]);
    net.run();
    assert_eq!(live_checksum(net.meta("a"), "/d/m1"), Some('c'), "the overwrite is carried to the new path");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), Some('x'), "the kept file stays");
    let ids = |p: &str| net.meta("a").state().file(p).map(|f| f.id.clone());
    assert_ne!(ids("/d/f1"), ids("/d/m1"));
}

/// The answer that handed a record written again back to its submitter is lost; the submitter
/// sends its put again, and the answer to that hands the record back again (without it, the
/// put left the submitter's queue while the tombstone still won there, and nothing held its
/// disk: found by the session's review).
#[test]
fn a_record_written_again_is_handed_back_again_when_its_answer_was_lost() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let (_, tomb) = move_recs(&mut net, "a", &y, "/d/m1");
    net.submit("a", Record::File(tomb));
    net.run();
    let first = submit_to(&mut net, "a", "b", vec![Record::File(x.clone())]);
    assert_eq!(first["writtenAgain"].as_array().map(Vec::len), Some(1), "{first}");
    let again = submit_to(&mut net, "a", "b", vec![Record::File(x)]);
    assert_eq!(again["writtenAgain"], first["writtenAgain"], "{again}");
}

/// A remove made on one side of a partition, sent back after a snapshot of the other side's
/// leader: it travels without what it was decided from (the leader does not check it again:
/// it was acknowledged on its side), and that goes beside it; the leader stores it with the
/// record. A file of another id at that path older than the one the remove took stays removed
/// (it had lost the path to that file); one newer than that is kept over the tombstone. (Sent
/// back stripped, the tombstone kept any other file it was newer than: a file an acknowledged
/// remove had taken came back; found by the session's review.)
#[test]
fn a_sent_back_tombstone_keeps_what_it_was_decided_from() {
    for x_newer in [false, true] {
        // A partition: a leads a and c, b leads itself; b keeps the lease when they meet.
        let mut net = Net::new(&["a", "b", "c"], MetaConfig::default());
        net.cut("a", "b");
        net.cut("c", "b");
        net.set_view("a", &[("a", true), ("b", false), ("c", true)]);
        net.set_view("c", &[("a", true), ("b", false), ("c", true)]);
        net.set_view("b", &[("a", false), ("b", true), ("c", false)]);
        let now = net.now;
        net.node_mut("a").meta.allow_claim_now(now);
        net.node_mut("b").meta.allow_claim_now(now);
        net.tick_all();
        net.run();
        net.rounds(3, 5_000);
        assert!(net.meta("a").is_leader(net.now) && net.meta("b").is_leader(net.now));
        let x_early = other_file_rec(&mut net, "b", "/d/f1", 'x');
        net.advance(1);
        let y = file_rec(&mut net, "a", "/d/f1", 'a');
        net.submit("a", Record::File(y.clone()));
        net.run();
        net.advance(1);
        let x_late = other_file_rec(&mut net, "b", "/d/f1", 'x');
        net.advance(1);
        let wall = net.wall();
        let version = net.node_mut("a").hlc.next(wall);
        let tomb = shoal_core::meta::records::FileRecord {
            removed: true,
            version,
            based_on: Some(y.based_on_this()),
            ..y.clone()
        };
        assert!(!net.meta("a").leader_may_lag(net.now), "a is in touch with c");
        net.submit("a", Record::File(tomb));
        assert_eq!(net.meta("a").pending_len(), 0, "in a's log at once");
        net.submit("b", Record::File(if x_newer { x_late } else { x_early }));
        net.run();
        // Heal: b keeps the lease; a and c take b's snapshot and send the tombstone back.
        net.heal("a", "b");
        net.heal("c", "b");
        net.set_view_all(&[("a", true), ("b", true), ("c", true)]);
        net.rounds(4, 5_000);
        assert!(net.meta("b").is_leader(net.now));
        let stored = net.meta("b").state().file("/d/f1").cloned().expect("a record");
        let want = if x_newer { Some('x') } else { None };
        for n in ["a", "b", "c"] {
            assert_eq!(live_checksum(net.meta(n), "/d/f1"), want, "{n}, the other file newer: {x_newer}");
        }
        if !x_newer {
            assert_eq!(stored.based_on, Some(y.based_on_this()), "stored with what it was decided from");
        }
        assert_eq!(net.meta("b").status(net.now).based_refused, 0, "not checked again");
    }
}

/// With two submits in flight (`meta.submit_window` 2), a follower's copy mark of its move's
/// record, and a move of the moved file decided from that record, wait for the answer to the
/// submit that carries the move: the leader refuses the move (it holds a newer overwrite of
/// the source), they leave with it, and the leader never holds the moved record. Sent at once
/// in a second submit, they gave it back (or the second move went in). Meanwhile the node's
/// driver is not spun.
#[test]
fn a_mark_waits_for_the_answer_to_the_submit_carrying_its_move() {
    use shoal_core::meta::records::FileRecord;
    for with_move in [false, true] {
        let config = MetaConfig { submit_window: 2, ..MetaConfig::default() };
        let mut net = cluster(&["a", "b"], config);
        let f = file_rec(&mut net, "a", "/d/f1", 'a');
        net.submit("a", Record::File(f.clone()));
        net.run();
        net.advance(1);
        let over = file_rec(&mut net, "a", "/d/f1", 'b');
        let (moved, tomb) = move_recs(&mut net, "b", &f, "/d/m1");
        let now = net.now;
        net.submit_at("a", now, Record::File(over));
        net.submit_all_at("b", now, vec![Record::File(moved.clone()), Record::File(tomb)]);
        net.collect(&id("a"));
        net.collect(&id("b"));
        let submit = net.take(|m| m.target.ends_with("meta/submit"));
        if with_move {
            let (moved_again, tomb_again) = move_recs(&mut net, "b", &moved, "/d/m2");
            net.submit_all_at("b", now, vec![Record::File(moved_again), Record::File(tomb_again)]);
        } else {
            let mark = FileRecord { based_on: None, ..moved.clone() };
            net.submit_at("b", now, Record::File(mark));
        }
        net.collect(&id("b"));
        assert!(
            !net.queue.iter().any(|m| m.from == id("b") && m.target.ends_with("meta/submit")),
            "nothing more is sent while the move's submit is in flight ({with_move})"
        );
        assert!(net.meta("b").poll_timeout().is_some_and(|t| t > now), "the driver is not spun meanwhile");
        let answer = net.answer(&submit);
        net.respond(&submit, Ok(common::answer(answer.status(), serde_json::to_vec(&answer.body).unwrap())));
        net.run();
        assert_move_refused(&net, "/d/f1", "/d/m1");
        for n in ["a", "b"] {
            assert!(net.meta(n).state().file("/d/m2").is_none(), "{n} holds nothing at the next path");
        }
        assert_eq!(net.meta("b").pending_len(), 0);
    }
}

/// A record sent back after a snapshot, still queued when its node becomes the leader (the
/// leader it was sent to died), goes into the new leader's log with what it was decided from,
/// as that leader would have stored it.
#[test]
fn a_sent_back_record_queued_at_a_new_leader_keeps_what_it_was_decided_from() {
    let mut net = Net::new(&["a"], MetaConfig::default());
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    let wall = net.wall();
    let version = net.node_mut("a").hlc.next(wall);
    let tomb = shoal_core::meta::records::FileRecord { removed: true, version, based_on: None, ..y.clone() };
    let now = net.now;
    let node = net.node_mut("a");
    node.meta.restore(
        MetaRestored {
            records: vec![Record::File(tomb.clone())],
            pending: vec![shoal_core::meta::log::Pending {
                id: 1,
                record: Record::File(tomb),
                sent_back_based: Some(*y.based_on_this()),
            }],
            ..MetaRestored::default()
        },
        &mut node.hlc,
    );
    node.meta.allow_claim_now(now);
    net.tick_all();
    net.run();
    net.rounds(2, 5_000);
    assert!(net.meta("a").is_leader(net.now));
    assert_eq!(net.meta("a").pending_len(), 0);
    let page = net.meta("a").answer_log("after=0").body;
    let entry = page["entries"].as_array().and_then(|e| e.iter().find(|e| e["payload"]["path"] == "/d/f1")).cloned();
    let entry = entry.unwrap_or_else(|| panic!("in the log: {page}"));
    assert_eq!(entry["payload"]["basedOn"], json!(y.based_on_this()), "{entry}");
}

/// An overwrite made on one side of a partition, a move of the same file on the other (each
/// answered `alone`); the move reaches the overwrite's leader sent back after a snapshot, its
/// tombstone older than the overwrite. The leader orders them as the put, then the move (as
/// when the overwrite arrives second): the moved file takes the overwrite's content, and the
/// old path is removed. Before, the moved record was taken beside the overwrite, and the file
/// lived at both paths with one id (simulator `--races` seed 6827).
#[test]
fn a_sent_back_move_an_overwrite_never_saw_carries_the_overwrite() {
    // New bytes, and the same bytes put again (which brought the old path back just as well).
    for content in ['b', 'a'] {
        sent_back_move_meets_an_overwrite(content);
    }
}

fn sent_back_move_meets_an_overwrite(content: char) {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let (moved, tomb) = move_recs(&mut net, "b", &y, "/d/m1");
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f1", content);
    net.submit("a", Record::File(over));
    net.run();
    send_back_to_a(&mut net, [tomb, moved], &y);
    // (The answer is not delivered here: b reads what it carried from the leader's log.)
    net.rounds(3, 5_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some(content), "{n}: the moved file takes the overwrite");
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{n}: the old path is removed ({content})");
    }
}

/// An overwrite with the bytes the file already had (the same file put again), decided without
/// a move the leader took first and newer than the move's tombstone: it would bring the old path
/// back beside the moved file, the file at both paths with one id. It is carried as any
/// overwrite racing a move is: the old path is removed again. (One older than the tombstone
/// loses to it and is not carried: core/tests/node.rs `a_put_of_the_moved_content_is_not_carried`.)
#[test]
fn an_overwrite_of_the_same_bytes_newer_than_a_move_is_carried() {
    let (mut net, _) = one_file_moved_by_b();
    net.advance(1);
    // Put through b as if decided before the move reached it: no `BasedOn`, the same bytes.
    let again = file_rec(&mut net, "b", "/d/f1", 'a');
    let answer = submit_to(&mut net, "a", "b", vec![Record::File(again.clone())]);
    // The submitter gets the carry's records with its answer (both: the old path's tombstone
    // again, and the moved file's record): otherwise it holds the move's tombstone over the
    // put's bytes until the leader's next append.
    let handed: Vec<(String, bool)> = answer["writtenAgain"]
        .as_array()
        .map(|a| a.iter().map(|r| (r["payload"]["path"].to_string(), r["payload"]["removed"] == true)).collect())
        .unwrap_or_default();
    assert_eq!(handed, vec![("\"/d/f1\"".to_string(), true), ("\"/d/m1\"".to_string(), false)], "{answer}");
    // Sent again (its answer lost): carried already, the same records come back.
    let again_answer = submit_to(&mut net, "a", "b", vec![Record::File(again)]);
    assert_eq!(again_answer["writtenAgain"], answer["writtenAgain"], "{again_answer}");
    net.rounds(3, 5_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('a'), "{n}: the moved file");
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{n}: the old path is removed again");
    }
}

/// A move back to the old path sent by a build that strips what it was decided from (the
/// moved content put at the old path, and a tombstone at the new path, in one submit) is not an
/// overwrite racing the move: it is taken as it is, the file back at the old path only. (Carried
/// as the same bytes put again, the move back was undone, or the file was left at neither path,
/// found by a review.)
#[test]
fn a_stripped_move_back_is_not_carried_as_an_overwrite() {
    use shoal_core::meta::records::FileRecord;
    let (mut net, moved) = one_file_moved_by_b();
    net.advance(1);
    let (back, back_tomb) = move_recs(&mut net, "b", &moved, "/d/f1");
    let strip = |f: FileRecord| Record::File(FileRecord { based_on: None, ..f });
    let answer = submit_to(&mut net, "a", "b", vec![strip(back), strip(back_tomb)]);
    assert!(answer.get("writtenAgain").is_none(), "nothing carried: {answer}");
    net.rounds(3, 5_000);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('a'), "{n}: back at the old path");
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), None, "{n}: not at the new one");
    }
}

/// The same race met on the mover: a node that moved `/d/f1` on its side of a partition
/// adopted the other side's snapshot, which brought an overwrite of the file at the old path
/// its move never saw, and queued its moved record to send back; before the submit went, it
/// became the leader. Its own queue goes into its log as the leader it was sent to would take
/// it: the put, then the move. Before, the moved record went in beside the overwrite, and the
/// file lived at both paths with one id (a review of the seed 6827 fix).
#[test]
fn a_sent_back_move_queued_at_a_new_leader_carries_an_overwrite_it_never_saw() {
    use shoal_core::meta::records::FileRecord;
    let mut net = Net::new(&["a"], MetaConfig::default());
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.advance(1);
    let (moved, _tomb) = move_recs(&mut net, "a", &y, "/d/m1");
    net.advance(1);
    let over = file_rec(&mut net, "a", "/d/f1", 'b');
    let now = net.now;
    let node = net.node_mut("a");
    node.meta.restore(
        MetaRestored {
            // As the snapshot left them: the overwrite won the old path, the moved record stays.
            records: vec![Record::File(over), Record::File(moved.clone())],
            pending: vec![shoal_core::meta::log::Pending {
                id: 1,
                record: Record::File(FileRecord { based_on: None, ..moved }),
                sent_back_based: Some(*y.based_on_this()),
            }],
            ..MetaRestored::default()
        },
        &mut node.hlc,
    );
    node.meta.allow_claim_now(now);
    net.tick_all();
    net.run();
    net.rounds(2, 5_000);
    assert!(net.meta("a").is_leader(net.now));
    assert_eq!(net.meta("a").pending_len(), 0);
    assert_eq!(live_checksum(net.meta("a"), "/d/m1"), Some('b'), "the moved file takes the overwrite");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), None, "the old path is removed");
}

/// [`one_file`], then `/d/f1` moved to `/d/m1` through `b` and taken by the leader: (net, the
/// moved file's record).
fn one_file_moved_by_b() -> (Net, shoal_core::meta::records::FileRecord) {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let (moved, tomb) = move_recs(&mut net, "b", &y, "/d/m1");
    let now = net.now;
    net.submit_all_at("b", now, vec![Record::File(moved.clone()), Record::File(tomb)]);
    net.collect(&id("b"));
    net.run();
    assert_eq!(live_checksum(net.meta("a"), "/d/m1"), Some('a'), "the move is taken");
    assert_eq!(live_checksum(net.meta("a"), "/d/f1"), None, "the move is taken");
    (net, moved)
}

/// `b` sends the leader `a` a move's two records (in the order given) as sent back after a
/// snapshot: without their `BasedOn`, which travels beside them (`y`'s version).
fn send_back_to_a(
    net: &mut Net,
    pair: [shoal_core::meta::records::FileRecord; 2],
    y: &shoal_core::meta::records::FileRecord,
) -> Value {
    use shoal_core::meta::records::FileRecord;
    let based = y.based_on_this();
    let [first, second] = pair;
    let body = json!({
        "records": [
            Record::File(FileRecord { based_on: None, ..first }),
            Record::File(FileRecord { based_on: None, ..second }),
        ],
        "sentBack": [{"index": 0, "basedOn": based}, {"index": 1, "basedOn": based}],
        "seqs": true,
    })
    .to_string();
    let now = net.now;
    let node = net.node_mut("a");
    let answer = node.meta.answer_submit(now, &id("b"), body.as_bytes(), &mut node.hlc);
    assert_eq!(answer.status(), 200, "{}", answer.body);
    answer.body
}

/// A two-node cluster (`a` leads) holding one file, `/d/f1` with content `a`, written through `a`.
fn one_file(config: MetaConfig) -> (Net, shoal_core::meta::records::FileRecord) {
    let mut net = cluster(&["a", "b"], config);
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.submit("a", Record::File(y.clone()));
    net.run();
    (net, y)
}

/// A refused move from `from` to `to`: both nodes hold the overwrite (content `b`) at `from`
/// and nothing at `to`.
fn assert_move_refused(net: &Net, from: &str, to: &str) {
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), from), Some('b'), "{n} holds the overwrite");
        assert!(net.meta(n).state().file(to).is_none(), "{n} holds nothing at the new path");
    }
}

/// The move sent back with its tombstone newer than the overwrite (the move decided later, on
/// the other side): the tombstone and the moved record arrive in key order, which puts either
/// first. Whichever path sorts first, the leader carries the move past the overwrite: the moved
/// file takes the overwrite's content, and the old path's tombstone is written above the move's
/// own. Before, the tombstone first dropped the overwrite by last-writer-wins, and the record
/// first carried it but left the move's own tombstone winning at the old path, naming the old
/// content's copies (a review of the seed 6827 fix).
#[test]
fn a_sent_back_move_carries_an_overwrite_whichever_of_its_paths_sorts_first() {
    for to in ["/a/m1", "/e/m1"] {
        let (mut net, y) = one_file(MetaConfig::default());
        net.advance(1);
        let over = file_rec(&mut net, "a", "/d/f1", 'b');
        net.submit("a", Record::File(over));
        net.run();
        net.advance(1);
        let (moved, tomb) = move_recs(&mut net, "b", &y, to);
        let tomb_version = tomb.version.clone();
        // (Sent back in key order.)
        let pair = if to < "/d/f1" { [moved, tomb] } else { [tomb, moved] };
        send_back_to_a(&mut net, pair, &y);
        net.rounds(3, 5_000);
        for n in ["a", "b"] {
            assert_eq!(live_checksum(net.meta(n), to), Some('b'), "{n} {to}: the moved file takes the overwrite");
            let f1 = net.meta(n).state().file("/d/f1").cloned().expect("a record at the old path");
            assert!(f1.removed, "{n} {to}: the old path is removed");
            assert!(f1.version > tomb_version, "{n} {to}: the carry's tombstone is above the move's own");
        }
    }
}

/// The two records of a move sent back after a snapshot (which travel without their `BasedOn`,
/// beside them in `sentBack`) go in one submit, as a move's records always do: the leader
/// orders the pair together ([`a_sent_back_move_carries_an_overwrite_whichever_of_its_paths_sorts_first`]).
/// Before, a batch could end between them; and a pair that starts the queue with its other
/// record more than a batch further on (a snapshot's send-backs are queued in key order, a page
/// at a time) was split: the leader took the tombstone alone, and a holder deleted the copies
/// the moved record was to rename.
#[test]
fn a_sent_back_moves_two_records_travel_in_one_submit() {
    // Side by side in the queue; apart (another send-back's path between theirs); and the pair
    // first in the queue, its other record more than a batch further on.
    for layout in [Layout::SideBySide, Layout::Apart, Layout::BeyondTheBatch] {
        sent_back_move_in_one_submit(layout);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    SideBySide,
    Apart,
    BeyondTheBatch,
}

fn sent_back_move_in_one_submit(layout: Layout) {
    use shoal_core::meta::records::FileRecord;
    let batch_max = if layout == Layout::Apart { 3 } else { 2 };
    let config = MetaConfig { batch_max, ..MetaConfig::default() };
    let mut net = Net::new(&["a", "b"], config);
    let y = file_rec(&mut net, "b", "/d/f1", 'a');
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/c/x", 'c');
    let z = other_file_rec(&mut net, "b", "/d/z", 'z');
    let (moved, tomb) = move_recs(&mut net, "b", &y, "/e/m1");
    let based = Some(*y.based_on_this());
    let pending = |id: u64, f: &FileRecord, sent_back: bool| shoal_core::meta::log::Pending {
        id,
        record: Record::File(FileRecord { based_on: if sent_back { None } else { f.based_on.clone() }, ..f.clone() }),
        sent_back_based: if sent_back { based.clone() } else { None },
    };
    let node = net.node_mut("b");
    node.meta.restore(
        MetaRestored {
            records: vec![
                Record::File(x.clone()),
                Record::File(tomb.clone()),
                Record::File(z.clone()),
                Record::File(moved.clone()),
            ],
            pending: match layout {
                Layout::SideBySide => {
                    vec![
                        pending(1, &x, false),
                        pending(2, &tomb, true),
                        pending(3, &moved, true),
                        pending(4, &z, false),
                    ]
                }
                Layout::Apart => {
                    vec![
                        pending(1, &x, false),
                        pending(2, &tomb, true),
                        pending(3, &z, false),
                        pending(4, &moved, true),
                    ]
                }
                Layout::BeyondTheBatch => {
                    vec![
                        pending(1, &tomb, true),
                        pending(2, &x, false),
                        pending(3, &z, false),
                        pending(4, &moved, true),
                    ]
                }
            },
            ..MetaRestored::default()
        },
        &mut node.hlc,
    );
    let now = net.now;
    net.node_mut("a").meta.allow_claim_now(now);
    let mark = net.trace.len();
    net.tick_all();
    net.run();
    net.rounds(3, 5_000);
    let submits = net.trace_from(mark, "b", "/cluster/acn/meta/submit");
    let paths: Vec<Vec<String>> = submits
        .iter()
        .map(|d| {
            let body: Value = serde_json::from_slice(&d.request).expect("a submit body");
            body["records"].as_array().expect("records").iter().map(|r| r["payload"]["path"].to_string()).collect()
        })
        .collect();
    let together = paths.iter().any(|p| p.contains(&"\"/d/f1\"".to_string()) && p.contains(&"\"/e/m1\"".to_string()));
    assert!(together, "{layout:?}: the move's two records in one submit: {paths:?}");
    // What each sent-back record was decided from goes beside it at its own index.
    for d in &submits {
        let body: Value = serde_json::from_slice(&d.request).expect("a submit body");
        let records = body["records"].as_array().cloned().unwrap_or_default();
        for s in body["sentBack"].as_array().cloned().unwrap_or_default() {
            let i = s["index"].as_u64().expect("an index") as usize;
            let path = &records[i]["payload"]["path"];
            assert!(path == "/d/f1" || path == "/e/m1", "{layout:?}: sentBack names {path} at {i}: {body}");
        }
    }
    assert_eq!(net.meta("b").pending_len(), 0);
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/e/m1"), Some('a'), "{layout:?}: {n} holds the moved file");
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{layout:?}: {n} holds the old path removed");
    }
}

/// An overwrite acknowledged on one side of a partition (here held by `b` alone) and a move
/// of the file decided on the other (by the leader `a`, checked against `c` only, which never
/// saw the overwrite): when `b` takes the move's tombstone from the leader, it would drop its
/// overwrite by last-writer-wins, and the leader would never hear of it. `b` sends it back
/// instead, and the leader carries it to the moved file (the put, then the move). Before, the
/// moved file kept the old content while the copies at the old path held the overwrite's
/// bytes: no rename matched them, and the moved file had no right copy (simulator `--races`
/// seed 7730).
#[test]
fn an_overwrite_a_moves_tombstone_never_saw_is_sent_back_and_carried() {
    let mut net = Net::new(&["a", "b", "c"], MetaConfig::default());
    let y = file_rec(&mut net, "a", "/d/f1", 'a');
    net.advance(1);
    let over = file_rec(&mut net, "b", "/d/f1", 'b');
    for (n, records) in [("a", vec![y.clone()]), ("b", vec![over]), ("c", vec![y.clone()])] {
        let node = net.node_mut(n);
        let records = records.into_iter().map(Record::File).collect();
        node.meta.restore(MetaRestored { records, ..MetaRestored::default() }, &mut node.hlc);
    }
    net.cut("a", "b");
    net.cut("b", "c");
    net.set_view("a", &[("a", true), ("b", false), ("c", true)]);
    net.set_view("c", &[("a", true), ("b", false), ("c", true)]);
    net.set_view("b", &[("a", false), ("b", true), ("c", false)]);
    let now = net.now;
    net.node_mut("a").meta.allow_claim_now(now);
    net.rounds(3, 1_000);
    assert!(net.meta("a").is_leader(net.now));
    // (Rounds in which c answers a lease push on a's numbering.)
    net.rounds(3, 5_000);
    assert!(!net.meta("a").leader_may_lag(net.now), "a hears from c: its move goes in unchecked");
    net.advance(1);
    move_on_a_and_settle(&mut net, &y);
    assert_eq!(live_checksum(net.meta("c"), "/d/m1"), Some('a'), "the move is in");
    net.heal("a", "b");
    net.heal("b", "c");
    net.set_view_all(&[("a", true), ("b", true), ("c", true)]);
    net.rounds(8, 2_000);
    for n in ["a", "b", "c"] {
        assert_eq!(live_checksum(net.meta(n), "/d/m1"), Some('b'), "{n}: the moved file takes the overwrite");
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), None, "{n}: the old path is removed");
    }
}

/// While a follower adopts a snapshot page by page and sends back a remove or move of its own
/// that the leader lacks, it submits nothing until the last page is in: a move's two records,
/// sent back in key order, may be on two pages, and the leader orders them together only when
/// they arrive together.
#[test]
fn a_follower_sends_back_a_move_only_once_the_whole_snapshot_is_in() {
    use shoal_core::meta::records::FileRecord;
    let mut net = Net::new(&["a", "b"], MetaConfig { snapshot_page_max: 5, ..small() });
    let y = file_rec(&mut net, "b", "/a/f1", 'a');
    let mut many = Vec::new();
    for k in 0..12 {
        many.push(Record::File(FileRecord { path: format!("/k/f{k:02}"), ..file_rec(&mut net, "a", "/k", 'k') }));
    }
    net.advance(1);
    let (moved, tomb) = move_recs(&mut net, "b", &y, "/z/m1");
    for (n, records) in [("a", many.clone()), ("b", vec![Record::File(tomb), Record::File(moved)])] {
        let node = net.node_mut(n);
        node.meta.restore(MetaRestored { records, ..MetaRestored::default() }, &mut node.hlc);
    }
    let now = net.now;
    net.node_mut("a").meta.allow_claim_now(now);
    net.tick_all();
    let mut submits_while_adopting = 0;
    for _ in 0..10_000 {
        let Some(m) = net.queue.pop_front() else { break };
        net.deliver(m);
        if net.meta("b").records_settling() {
            net.advance(1);
            net.tick("b");
            submits_while_adopting += net.queued(|m| m.from == id("b") && m.target.ends_with("meta/submit"));
        }
    }
    net.rounds(3, 5_000);
    assert!(net.meta("b").snapshots_adopted() >= 1);
    assert_eq!(submits_while_adopting, 0, "nothing submitted mid-snapshot");
    assert_eq!(live_checksum(net.meta("a"), "/z/m1"), Some('a'), "the move reached the leader");
    assert_eq!(live_checksum(net.meta("a"), "/a/f1"), None);
}

/// Two puts of one new file (another id than the file a move took from its path), both newer
/// than what the move was decided from and older than its tombstone, reach the leader in one
/// submit: both are kept, in their order, so the later content wins everywhere and goes back to
/// the submitter. (Before, the first was written just above the tombstone and the second, older
/// than that, lost to it: acknowledged content gone. Found by a review.)
#[test]
fn two_puts_of_a_new_file_a_move_never_saw_are_kept_in_their_order() {
    let (mut net, y) = one_file(MetaConfig::default());
    net.advance(1);
    let x = other_file_rec(&mut net, "b", "/d/f1", 'x');
    net.advance(1);
    let x2 = other_file_rec(&mut net, "b", "/d/f1", 'z');
    net.advance(1);
    move_on_a_and_settle(&mut net, &y);
    let now = net.now;
    net.submit_all_at("b", now, vec![Record::File(x), Record::File(x2)]);
    net.collect(&id("b"));
    let submit = net.take(|m| m.target.ends_with("meta/submit"));
    let answer = net.answer(&submit);
    let again = answer.body["writtenAgain"].as_array().cloned().unwrap_or_default();
    let last = again.last().map(|r| r["payload"]["checksum"].as_str().unwrap_or("").to_string());
    assert_eq!(last, Some("z".repeat(64)), "the later put comes back last: {}", answer.body);
    net.respond(&submit, Ok(common::answer(answer.status(), serde_json::to_vec(&answer.body).unwrap())));
    assert_eq!(live_checksum(net.meta("b"), "/d/f1"), Some('z'), "b holds the later put with the answer");
    net.run();
    for n in ["a", "b"] {
        assert_eq!(live_checksum(net.meta(n), "/d/f1"), Some('z'), "{n} keeps the later put");
        assert!(net.meta(n).state().file("/d/m1").is_some_and(|f| !f.removed), "{n} keeps the moved file");
    }
}
