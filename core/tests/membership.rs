//! Membership through its public API: the merge laws of the signed registers, who may write
//! which register, liveness, `lastSeen` translation, latency and tombstones.
//!
//! Spec: cluster-runtime.md "Membership"; reference-facts.md "LWW", "Liveness", "NodeRecord"
//! and weaknesses 3, 4 and 10; DESIGN.md "Versions and merge".

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use shoal_core::acn::public_key_b64;
use shoal_core::hlc::{Hlc, Version};
use shoal_core::ids::NodeId;
use shoal_core::membership::{Membership, MembershipConfig, NodeState, Trust};
use shoal_core::records::{AdminState, Capabilities, Health, NodeRecord, OwnerFields};
use shoal_core::time::{Millis, DAY_MS, MINUTE_MS, SECOND_MS};

/// "Now" at the start of every scenario (November 2023).
const T0: Millis = Millis(1_700_000_000_000);
const FOUR_MINUTES_MS: u64 = 4 * MINUTE_MS;

fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("{:08x}-0000-4000-8000-{:012x}", i + 1, i + 1))
}

fn observer_id() -> NodeId {
    NodeId::new("ffffffff-ffff-4fff-8fff-ffffffffffff")
}

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn fields(id: &NodeId, key: &SigningKey, name: &str) -> OwnerFields {
    OwnerFields {
        id: id.clone(),
        name: name.to_string(),
        public_key: public_key_b64(&key.verifying_key()),
        advertise_url: format!("http://{}.test:7000", &id.as_str()[..8]),
        tunnel_via: String::new(),
        version: "0.1.0".into(),
        capabilities: Capabilities::default(),
        joined: T0.as_secs(),
        box_key: String::new(),
        tls_pin: String::new(),
    }
}

/// One legitimate member: its id, its key, its HLC and how far its wall clock is off.
struct Actor {
    id: NodeId,
    key: SigningKey,
    hlc: Hlc,
    offset_ms: i64,
}

impl Actor {
    fn new(i: usize, offset_ms: i64) -> Actor {
        let id = node_id(i);
        Actor { hlc: Hlc::new(id.clone()), id, key: key(i as u8 + 1), offset_ms }
    }

    /// This actor's wall clock when the true time is `now`.
    fn clock(&self, now: Millis) -> Millis {
        Millis((now.0 as i64 + self.offset_ms) as u64)
    }

    fn next(&mut self, now: Millis) -> Version {
        let at = self.clock(now);
        self.hlc.next(at)
    }
}

/// `n` members; member 0 founded the cluster (admitted itself) and admitted everyone else.
/// Member 1's clock runs 4 minutes ahead, member 2's one minute behind.
fn cluster(n: usize) -> (Vec<Actor>, Vec<NodeRecord>) {
    let offsets = [0i64, FOUR_MINUTES_MS as i64, -(MINUTE_MS as i64), 5, 0];
    let mut actors: Vec<Actor> = (0..n).map(|i| Actor::new(i, offsets[i % offsets.len()])).collect();
    let mut records = Vec::new();
    for (i, a) in actors.iter_mut().enumerate() {
        let v = a.next(T0);
        let f = fields(&a.id, &a.key, &format!("node-{i}"));
        records.push(NodeRecord::new_signed(f, v, &a.key));
    }
    for rec in records.iter_mut() {
        let v = actors[0].next(T0);
        let (by, k) = (actors[0].id.clone(), actors[0].key.clone());
        rec.admit(&by, v, &k);
    }
    (actors, records)
}

fn membership_with(me: NodeId, records: &[NodeRecord]) -> Membership {
    let mut m = Membership::new(me, MembershipConfig::default());
    for r in records {
        m.insert(r.clone());
    }
    m
}

// ---------------------------------------------------------------------------------------------
// Merge laws (property tests)
// ---------------------------------------------------------------------------------------------

/// A legitimate write, by its legitimate signer. Indices are taken modulo the member count.
#[derive(Clone, Debug)]
enum Op {
    /// The node re-signs its own record (a new name) at its next HLC version.
    Owner { node: usize, name: u8 },
    /// `by` sets `target`'s admin state. With `observe` it has seen the current mark first (so its
    /// version is higher); without, its version may be lower than marks already out there.
    Admin { by: usize, target: usize, state: u8, observe: bool },
    /// `by` removes `target`.
    Remove { by: usize, target: usize, observe: bool },
    /// The node reports its health; timestamps of one node strictly increase.
    Health { node: usize, cpu: u8 },
    /// True time moves on.
    Advance { ms: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..5, any::<u8>()).prop_map(|(node, name)| Op::Owner { node, name }),
        (0usize..5, 0usize..5, 0u8..3, any::<bool>())
            .prop_map(|(by, target, state, observe)| { Op::Admin { by, target, state, observe } }),
        (0usize..5, 0usize..5, any::<bool>()).prop_map(|(by, target, observe)| Op::Remove { by, target, observe }),
        (0usize..5, 0u8..=100).prop_map(|(node, cpu)| Op::Health { node, cpu }),
        (0u32..120_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// Everything a history of legitimate writes produced: the starting records and every snapshot
/// of a record some node could have gossiped along the way, and the time at the end.
struct History {
    base: Vec<NodeRecord>,
    snapshots: Vec<NodeRecord>,
    now: Millis,
}

fn play(n: usize, ops: &[Op]) -> History {
    let (mut actors, base) = cluster(n);
    let mut current = base.clone();
    let mut snapshots = base.clone();
    let mut now = T0;
    let mut last_health_ts = vec![0u64; n];
    for op in ops {
        let touched = match *op {
            Op::Owner { node, name } => {
                let i = node % n;
                let v = actors[i].next(now);
                let mut f = current[i].owner_fields();
                f.name = format!("node-{i}-{name}");
                let k = actors[i].key.clone();
                current[i].resign_owner(f, v, &k);
                i
            }
            Op::Admin { by, target, state, observe } => {
                let (b, t) = (by % n, target % n);
                if observe {
                    if let Some(m) = &current[t].admin {
                        actors[b].hlc.observe(&m.version);
                    }
                }
                let v = actors[b].next(now);
                let state = [AdminState::Active, AdminState::Maintenance, AdminState::Draining][state as usize];
                let k = actors[b].key.clone();
                current[t].set_admin(state, v, &k);
                t
            }
            Op::Remove { by, target, observe } => {
                let (b, t) = (by % n, target % n);
                if observe {
                    if let Some(m) = &current[t].removal {
                        actors[b].hlc.observe(&m.version);
                    }
                }
                let v = actors[b].next(now);
                let k = actors[b].key.clone();
                current[t].set_removed(v, &k);
                t
            }
            Op::Health { node, cpu } => {
                let i = node % n;
                let ts = actors[i].clock(now).0.max(last_health_ts[i] + 1);
                last_health_ts[i] = ts;
                let h = Health {
                    cpu_usage: cpu as f64,
                    ram_used: 1 << 30,
                    ram_total: 8 << 30,
                    disk_free: 100 << 30,
                    disk_total: 500 << 30,
                    uptime: 60,
                    timestamp: ts,
                };
                let k = actors[i].key.clone();
                current[i].set_health(h, &k);
                i
            }
            Op::Advance { ms } => {
                now = now.plus(ms as u64);
                continue;
            }
        };
        let mut snap = current[touched].clone();
        // As gossiped by someone who heard from the node at this moment.
        snap.last_seen_ms = now.0;
        snap.last_seen = now.as_secs();
        snapshots.push(snap);
    }
    History { base, snapshots, now: now.plus(1) }
}

/// What must agree between two memberships that merged the same information.
#[derive(Debug, PartialEq)]
struct Fingerprint {
    versions: Vec<(NodeId, String)>,
    admin: Vec<(NodeId, AdminState, bool)>,
    health: Vec<(NodeId, Option<u64>)>,
    records: Vec<NodeRecord>,
    last_seen: Vec<(NodeId, Millis)>,
}

fn fingerprint(m: &Membership) -> Fingerprint {
    Fingerprint {
        versions: m.versions(),
        admin: m.records().map(|r| (r.id.clone(), r.admin_state, r.removed)).collect(),
        health: m.records().map(|r| (r.id.clone(), r.health.as_ref().map(|h| h.timestamp))).collect(),
        records: m.records().cloned().collect(),
        last_seen: m.records().map(|r| (r.id.clone(), m.last_seen(&r.id))).collect(),
    }
}

/// How a fresh membership starts out for a property run.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Every legitimate record already known (restored from disk); merges only update registers.
    AllKnown,
    /// Only the founder known; every other record arrives through gossip and must be admitted.
    FounderOnly,
}

struct Setup<'a> {
    me: NodeId,
    start: Start,
    history: &'a History,
}

impl Setup<'_> {
    fn fresh(&self) -> (Membership, Hlc) {
        let base = match self.start {
            Start::AllKnown => &self.history.base[..],
            Start::FounderOnly => &self.history.base[..1],
        };
        let mut m = membership_with(self.me.clone(), base);
        if matches!(self.start, Start::FounderOnly) && self.me != observer_id() {
            // A member always holds its own record.
            if let Some(own) = self.history.base.iter().find(|r| r.id == self.me) {
                m.insert(own.clone());
            }
        }
        (m, Hlc::new(self.me.clone()))
    }

    fn apply(&self, batches: &[&[NodeRecord]]) -> Membership {
        let (mut m, mut hlc) = self.fresh();
        for b in batches {
            m.merge(self.history.now, b, Some(self.history.now), Trust::Gossip, &mut hlc);
        }
        m
    }

    /// `a ⊔ b`: `a` merging everything `b` holds, as `b` would send it.
    fn join(&self, a: &Membership, b: &Membership) -> Membership {
        let mut out = a.clone();
        let mut hlc = Hlc::new(self.me.clone());
        out.merge(self.history.now, &b.wire_records(), Some(self.history.now), Trust::Gossip, &mut hlc);
        out
    }
}

fn pick(pool: &[NodeRecord], idx: &[prop::sample::Index]) -> Vec<NodeRecord> {
    idx.iter().map(|i| pool[i.index(pool.len())].clone()).collect()
}

/// A batch as a member sends it: every member's record (at some point of its history), plus
/// random extra snapshots (a sender can hold duplicates only if buggy, but merge must not care).
fn full_batch(
    h: &History,
    n: usize,
    per_node: &[prop::sample::Index],
    extra: &[prop::sample::Index],
) -> Vec<NodeRecord> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = node_id(i);
        let mine: Vec<&NodeRecord> = h.snapshots.iter().filter(|r| r.id == id).collect();
        out.push(mine[per_node[i].index(mine.len())].clone());
    }
    out.extend(pick(&h.snapshots, extra));
    // Order inside a batch must not matter either: rotate by a derived amount.
    let k = extra.first().map(|i| i.index(out.len().max(1))).unwrap_or(0);
    out.rotate_left(k);
    out
}

fn me_for(choice: usize, n: usize) -> NodeId {
    if choice >= n {
        observer_id()
    } else {
        node_id(choice)
    }
}

fn check_laws(s: &Setup<'_>, a: &[NodeRecord], b: &[NodeRecord], c: &[NodeRecord]) -> Result<(), TestCaseError> {
    // Commutative: A then B == B then A.
    let ab = s.apply(&[a, b]);
    let ba = s.apply(&[b, a]);
    prop_assert_eq!(fingerprint(&ab), fingerprint(&ba), "A,B != B,A");
    // Idempotent: merging a batch twice changes nothing more than once.
    let once = s.apply(&[a]);
    let twice = s.apply(&[a, a]);
    prop_assert_eq!(fingerprint(&once), fingerprint(&twice), "A != A,A");
    let mut again = once.clone();
    let out = again.merge(s.history.now, a, Some(s.history.now), Trust::Gossip, &mut Hlc::new(s.me.clone()));
    prop_assert!(
        out.changed.is_empty() && out.added.is_empty() && out.removed.is_empty(),
        "second merge reported {:?}",
        out
    );
    // Associative, batch form: A,(B++C) == (A++B),C == A,B,C.
    let bc: Vec<NodeRecord> = b.iter().chain(c).cloned().collect();
    let ab_cat: Vec<NodeRecord> = a.iter().chain(b).cloned().collect();
    let seq = s.apply(&[a, b, c]);
    prop_assert_eq!(fingerprint(&s.apply(&[a, &bc])), fingerprint(&seq), "A,(B++C) != A,B,C");
    prop_assert_eq!(fingerprint(&s.apply(&[&ab_cat, c])), fingerprint(&seq), "(A++B),C != A,B,C");
    // Associative, commutative and idempotent as a join of whole memberships.
    let (ma, mb, mc) = (s.apply(&[a]), s.apply(&[b]), s.apply(&[c]));
    let left = s.join(&s.join(&ma, &mb), &mc);
    let right = s.join(&ma, &s.join(&mb, &mc));
    prop_assert_eq!(fingerprint(&left), fingerprint(&right), "(a+b)+c != a+(b+c)");
    prop_assert_eq!(fingerprint(&s.join(&ma, &mb)), fingerprint(&s.join(&mb, &ma)), "a+b != b+a");
    prop_assert_eq!(fingerprint(&s.join(&ma, &ma)), fingerprint(&ma), "a+a != a");
    Ok(())
}

/// The merged result is the register-wise maximum of everything merged: nothing legitimate is
/// lost to a concurrent write in another register (reference weakness 4).
fn check_register_maxima(s: &Setup<'_>, all: &[NodeRecord]) -> Result<(), TestCaseError> {
    let m = s.apply(&[all]);
    for r in m.records() {
        let theirs: Vec<&NodeRecord> = all.iter().filter(|x| x.id == r.id).collect();
        if theirs.is_empty() {
            continue;
        }
        let admin = theirs.iter().filter_map(|x| x.admin.as_ref()).max_by(|a, b| a.version.cmp(&b.version));
        prop_assert_eq!(r.admin.as_ref().map(|m| &m.version), admin.map(|m| &m.version));
        if let Some(mark) = admin {
            let winner = theirs.iter().find(|x| x.admin.as_ref() == Some(mark)).unwrap();
            prop_assert_eq!(r.admin_state, winner.admin_state);
        }
        let removal = theirs.iter().filter_map(|x| x.removal.as_ref()).map(|m| &m.version).max();
        prop_assert_eq!(r.removal.as_ref().map(|m| &m.version), removal);
        prop_assert_eq!(r.removed, removal.is_some());
        if r.id != s.me {
            let owner = theirs.iter().map(|x| &x.owner_version).max().unwrap();
            prop_assert_eq!(&r.owner_version, owner);
            let health = theirs.iter().filter_map(|x| x.health.as_ref()).map(|h| h.timestamp).max();
            prop_assert_eq!(r.health.as_ref().map(|h| h.timestamp), health);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// DESIGN.md "Versions and merge": every merge is commutative, associative and idempotent.
    /// Here every legitimate record is known beforehand, so batches only carry register updates;
    /// batches are arbitrary subsets of the history, duplicates and stale snapshots included.
    #[test]
    fn merging_register_updates_is_commutative_associative_and_idempotent(
        n in 3usize..=5,
        ops in prop::collection::vec(op(), 1..40),
        a in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        b in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        c in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        me in 0usize..6,
    ) {
        let h = play(n, &ops);
        let s = Setup { me: me_for(me, n), start: Start::AllKnown, history: &h };
        let (a, b, c) = (pick(&h.snapshots, &a), pick(&h.snapshots, &b), pick(&h.snapshots, &c));
        check_laws(&s, &a, &b, &c)?;
        check_register_maxima(&s, &h.snapshots)?;
    }

    /// The same laws when records are new to the receiver and must be admitted through gossip
    /// (only the founder known at the start). Each batch is a whole member list, as a member
    /// sends it, so the author of every mark is in the batch; extra duplicate snapshots of a
    /// record inside one batch must not make the result depend on their order.
    #[test]
    fn merging_whole_member_lists_into_a_newcomer_is_commutative_associative_and_idempotent(
        n in 3usize..=5,
        ops in prop::collection::vec(op(), 1..40),
        per_node in prop::collection::vec(any::<prop::sample::Index>(), 15),
        extra in prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..6), 3),
        me in 0usize..6,
    ) {
        let h = play(n, &ops);
        let s = Setup { me: me_for(me, n), start: Start::FounderOnly, history: &h };
        let a = full_batch(&h, n, &per_node[0..5], &extra[0]);
        let b = full_batch(&h, n, &per_node[5..10], &extra[1]);
        let c = full_batch(&h, n, &per_node[10..15], &extra[2]);
        check_laws(&s, &a, &b, &c)?;
        check_register_maxima(&s, &h.snapshots)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Last-writer-wins with HLC versions
// ---------------------------------------------------------------------------------------------

/// reference-facts.md weakness 3 ("a node whose clock runs ahead always wins") and hlc.rs:
/// a node 4 minutes ahead sets an admin state; another member that has seen it then sets a
/// different one. The later write wins on every member, whatever order the records arrive in.
#[test]
fn a_later_admin_write_wins_over_one_from_a_clock_four_minutes_ahead() {
    let (mut actors, base) = cluster(3);
    let target = base[0].clone();
    // Member 1 (4 minutes ahead) puts member 0 in maintenance.
    let mut by_ahead = target.clone();
    let v = actors[1].next(T0.plus(10 * SECOND_MS));
    by_ahead.set_admin(AdminState::Maintenance, v.clone(), &actors[1].key.clone());
    assert!(v.wall_ms >= T0.0 + FOUR_MINUTES_MS);

    // Member 2 (one minute behind) hears of it through an ordinary merge, then drains member 0.
    let now = T0.plus(20 * SECOND_MS);
    let mut m2 = membership_with(actors[2].id.clone(), &base);
    m2.merge(actors[2].clock(now), std::slice::from_ref(&by_ahead), None, Trust::Gossip, &mut actors[2].hlc);
    assert_eq!(m2.get(&target.id).unwrap().admin_state, AdminState::Maintenance);
    let v2 = actors[2].next(now);
    assert!(v2 > v, "a write made after seeing {v} must order after it, got {v2}");
    let key2 = actors[2].key.clone();
    m2.get_mut(&target.id).unwrap().set_admin(AdminState::Draining, v2, &key2);
    let by_behind = m2.get(&target.id).unwrap().clone();

    for me in [actors[0].id.clone(), actors[1].id.clone(), observer_id()] {
        for order in [[&by_ahead, &by_behind], [&by_behind, &by_ahead]] {
            let mut m = membership_with(me.clone(), &base);
            let mut hlc = Hlc::new(me.clone());
            for r in order {
                m.merge(now, std::slice::from_ref(r), None, Trust::Gossip, &mut hlc);
            }
            assert_eq!(m.get(&target.id).unwrap().admin_state, AdminState::Draining, "on {me}");
            assert_eq!(m.state(&target.id, now), NodeState::Draining);
        }
    }
}

/// reference-facts.md weakness 3 ("equal versions diverge forever"): two members write at the
/// same wall millisecond and counter; the node id breaks the tie the same way everywhere.
#[test]
fn equal_wall_clock_and_counter_are_broken_by_node_id_the_same_way_everywhere() {
    let (actors, base) = cluster(3);
    let at = T0.0 + 30 * SECOND_MS;
    let mut by1 = base[0].clone();
    by1.set_admin(
        AdminState::Maintenance,
        Version { wall_ms: at, counter: 0, node: actors[1].id.clone() },
        &actors[1].key,
    );
    let mut by2 = base[0].clone();
    by2.set_admin(
        AdminState::Draining,
        Version { wall_ms: at, counter: 0, node: actors[2].id.clone() },
        &actors[2].key,
    );
    let expected = if actors[2].id > actors[1].id { AdminState::Draining } else { AdminState::Maintenance };
    for order in [[&by1, &by2], [&by2, &by1]] {
        let mut m = membership_with(observer_id(), &base);
        let mut hlc = Hlc::new(observer_id());
        for r in order {
            m.merge(T0, std::slice::from_ref(r), None, Trust::Gossip, &mut hlc);
        }
        assert_eq!(m.get(&base[0].id).unwrap().admin_state, expected);
    }
}

/// reference-facts.md "LWW": the owner register is taken only when strictly newer; an older
/// copy arriving later does not roll it back.
#[test]
fn an_older_owner_copy_does_not_roll_back_a_newer_one() {
    let (mut actors, base) = cluster(3);
    let old = base[1].clone();
    let mut new = old.clone();
    let mut f = new.owner_fields();
    f.name = "renamed".into();
    let v = actors[1].next(T0.plus(1000));
    new.resign_owner(f, v, &actors[1].key.clone());
    let mut m = membership_with(observer_id(), &base);
    let mut hlc = Hlc::new(observer_id());
    assert_eq!(m.merge(T0, std::slice::from_ref(&new), None, Trust::Gossip, &mut hlc).changed, vec![new.id.clone()]);
    assert!(m.merge(T0, std::slice::from_ref(&old), None, Trust::Gossip, &mut hlc).changed.is_empty());
    assert_eq!(m.get(&new.id).unwrap().name, "renamed");
}

// ---------------------------------------------------------------------------------------------
// Who may write what (reference weakness 10)
// ---------------------------------------------------------------------------------------------

fn merged(m: &mut Membership, r: &NodeRecord) -> shoal_core::membership::MergeOutcome {
    let mut hlc = Hlc::new(m.me().clone());
    m.merge(T0.plus(60_000), std::slice::from_ref(r), None, Trust::Gossip, &mut hlc)
}

/// cluster-runtime.md "Membership" ("A node is authoritative for its own record"), weakness 10:
/// an owner update signed by another key is refused, and so is one that swaps in a new key.
#[test]
fn a_forged_owner_update_is_rejected() {
    let (actors, base) = cluster(3);
    let outsider = key(99);
    let victim = base[1].clone();
    let newer = Version { wall_ms: T0.0 + 3_600_000, counter: 0, node: victim.id.clone() };

    // Same public key in the record, but signed by another member's key.
    let mut forged = victim.clone();
    let mut f = forged.owner_fields();
    f.advertise_url = "http://evil.test:7000".into();
    forged.resign_owner(f, newer.clone(), &actors[2].key);
    // The victim's id, re-signed under a brand-new key (properly signed by that key).
    let mut rekeyed = victim.clone();
    let f = fields(&victim.id, &outsider, "victim");
    rekeyed.resign_owner(f, newer.clone(), &outsider);
    // A fresh record for the victim's id under the new key, admitted by a member.
    let mut replaced = NodeRecord::new_signed(fields(&victim.id, &outsider, "victim"), newer, &outsider);
    replaced.admit(
        &actors[0].id,
        Version { wall_ms: T0.0 + 3_600_000, counter: 1, node: actors[0].id.clone() },
        &actors[0].key,
    );

    for bad in [&forged, &rekeyed, &replaced] {
        let mut m = membership_with(actors[0].id.clone(), &base);
        let out = merged(&mut m, bad);
        assert!(out.changed.is_empty(), "{out:?}");
        let r = m.get(&victim.id).unwrap();
        assert_eq!(r, &victim);
        assert_eq!(r.public_key, public_key_b64(&actors[1].key.verifying_key()));
    }
}

/// Weakness 10: an admin mark or a removal signed by a key that is not a member's is refused,
/// and so is one that names a member as its author but carries someone else's signature.
#[test]
fn admin_marks_and_removals_signed_by_non_members_are_rejected() {
    let (actors, base) = cluster(3);
    let outsider_id = node_id(42);
    let outsider = key(99);
    let target = base[1].clone();
    let v = |node: &NodeId| Version { wall_ms: T0.0 + 60_000, counter: 0, node: node.clone() };

    let mut admin_by_outsider = target.clone();
    admin_by_outsider.set_admin(AdminState::Maintenance, v(&outsider_id), &outsider);
    let mut admin_claiming_member = target.clone();
    admin_claiming_member.set_admin(AdminState::Maintenance, v(&actors[0].id), &outsider);
    let mut removal_by_outsider = target.clone();
    removal_by_outsider.set_removed(v(&outsider_id), &outsider);
    let mut removal_claiming_member = target.clone();
    removal_claiming_member.set_removed(v(&actors[2].id), &outsider);
    // Marks signed by the member they name, but with a version that claims another writer.
    let mut mismatched = target.clone();
    mismatched.set_admin(AdminState::Draining, v(&actors[2].id), &actors[0].key);
    mismatched.admin.as_mut().unwrap().by = actors[0].id.clone();
    let mut mismatched_removal = target.clone();
    mismatched_removal.set_removed(v(&actors[2].id), &actors[0].key);
    mismatched_removal.removal.as_mut().unwrap().by = actors[0].id.clone();

    for bad in [
        &admin_by_outsider,
        &admin_claiming_member,
        &removal_by_outsider,
        &removal_claiming_member,
        &mismatched,
        &mismatched_removal,
    ] {
        let mut m = membership_with(actors[0].id.clone(), &base);
        let out = merged(&mut m, bad);
        assert!(out.changed.is_empty() && out.removed.is_empty(), "{out:?}");
        let r = m.get(&target.id).unwrap();
        assert_eq!((r.admin_state, r.removed), (AdminState::Active, false));
        assert_eq!(m.state(&target.id, T0), NodeState::Unknown);
    }

    // Control: the same marks signed by a member are taken.
    let mut m = membership_with(actors[0].id.clone(), &base);
    let mut good = target.clone();
    good.set_admin(AdminState::Maintenance, v(&actors[2].id), &actors[2].key);
    assert_eq!(merged(&mut m, &good).changed, vec![target.id.clone()]);
    good.set_removed(Version { counter: 1, ..v(&actors[2].id) }, &actors[2].key);
    assert_eq!(merged(&mut m, &good).removed, vec![target.id.clone()]);
}

/// Weakness 10: health is the owner's to report; health signed by another key is refused.
#[test]
fn health_signed_by_another_key_is_rejected() {
    let (actors, base) = cluster(3);
    let mut forged = base[1].clone();
    let h = Health { cpu_usage: 100.0, timestamp: T0.0 + 1000, ..Health::default() };
    forged.set_health(h, &actors[2].key);
    let mut m = membership_with(actors[0].id.clone(), &base);
    assert!(merged(&mut m, &forged).changed.is_empty());
    assert_eq!(m.get(&base[1].id).unwrap().health, None);
}

/// cluster-runtime.md "Joining", weakness 10 ("any member can push records for other nodes"):
/// a record new to the receiver arriving by gossip needs an admission signed by a known member.
#[test]
fn a_new_record_without_a_valid_admission_from_gossip_is_rejected() {
    let (actors, base) = cluster(3);
    let newcomer_id = node_id(7);
    let newcomer_key = key(77);
    let outsider_id = node_id(42);
    let outsider = key(99);
    let v = |node: &NodeId, c: u32| Version { wall_ms: T0.0 + 60_000, counter: c, node: node.clone() };
    let unadmitted =
        NodeRecord::new_signed(fields(&newcomer_id, &newcomer_key, "new"), v(&newcomer_id, 0), &newcomer_key);

    let mut self_admitted = unadmitted.clone();
    self_admitted.admit(&newcomer_id, v(&newcomer_id, 1), &newcomer_key);
    let mut by_stranger = unadmitted.clone();
    by_stranger.admit(&outsider_id, v(&outsider_id, 0), &outsider);
    let mut member_name_wrong_key = unadmitted.clone();
    member_name_wrong_key.admit(&actors[0].id, v(&actors[0].id, 0), &outsider);
    // Admitted properly, but the owner signature is not the record's own key.
    let mut bad_owner =
        NodeRecord::new_signed(fields(&newcomer_id, &newcomer_key, "new"), v(&newcomer_id, 0), &outsider);
    bad_owner.admit(&actors[0].id, v(&actors[0].id, 0), &actors[0].key);
    // Admitted properly, but the owner version names another node.
    let mut wrong_version_node =
        NodeRecord::new_signed(fields(&newcomer_id, &newcomer_key, "new"), v(&actors[1].id, 0), &newcomer_key);
    wrong_version_node.admit(&actors[0].id, v(&actors[0].id, 0), &actors[0].key);

    for bad in [&unadmitted, &self_admitted, &by_stranger, &member_name_wrong_key, &bad_owner, &wrong_version_node] {
        let mut m = membership_with(actors[1].id.clone(), &base);
        let out = merged(&mut m, bad);
        assert!(out.added.is_empty() && out.changed.is_empty(), "{out:?}");
        assert!(m.get(&newcomer_id).is_none());
    }

    // Control: admitted by member 2, signed by its owner: taken.
    let mut good = unadmitted.clone();
    good.admit(&actors[2].id, v(&actors[2].id, 0), &actors[2].key);
    let mut m = membership_with(actors[1].id.clone(), &base);
    assert_eq!(merged(&mut m, &good).added, vec![newcomer_id.clone()]);
    assert_eq!(m.len(), 4);
}

// ---------------------------------------------------------------------------------------------
// Liveness
// ---------------------------------------------------------------------------------------------

fn two_members() -> (Membership, Vec<Actor>, NodeId) {
    let (actors, base) = cluster(2);
    let peer = actors[1].id.clone();
    (membership_with(actors[0].id.clone(), &base), actors, peer)
}

fn with_health(m: &mut Membership, id: &NodeId, h: Health, k: &SigningKey) {
    m.get_mut(id).unwrap().set_health(h, k);
}

/// reference-facts.md "Liveness": lastSeen 0 -> UNKNOWN; <=45 s ONLINE; <=180 s UNKNOWN;
/// else OFFLINE — with the defaults of MembershipConfig and millisecond boundaries.
#[test]
fn liveness_follows_the_45_and_180_second_thresholds() {
    let (mut m, _, peer) = two_members();
    assert_eq!(m.state(&peer, T0), NodeState::Unknown, "never heard from");
    m.saw_at(&peer, Millis::ZERO, T0);
    assert_eq!(m.state(&peer, T0), NodeState::Unknown, "lastSeen 0");
    m.saw_at(&peer, T0, T0);
    assert_eq!(m.state(&peer, T0), NodeState::Online);
    assert_eq!(m.state(&peer, T0.plus(45_000)), NodeState::Online);
    assert_eq!(m.state(&peer, T0.plus(45_001)), NodeState::Unknown);
    assert_eq!(m.state(&peer, T0.plus(180_000)), NodeState::Unknown);
    assert_eq!(m.state(&peer, T0.plus(180_001)), NodeState::Offline);
    assert_eq!(m.state(&node_id(33), T0), NodeState::Unknown, "not a member at all");
    // A report "from the future" is clamped to now and lastSeen only moves forward.
    m.saw_at(&peer, T0.plus(3_600_000), T0.plus(1000));
    assert_eq!(m.last_seen(&peer), T0.plus(1000));
    m.saw_at(&peer, T0, T0.plus(2000));
    assert_eq!(m.last_seen(&peer), T0.plus(1000));
}

/// reference-facts.md "Liveness": DEGRADED when online and health has a timestamp and
/// cpu >= 97 or ram >= 0.97 or free disk <= 0.02.
#[test]
fn a_node_is_degraded_at_97_percent_cpu_or_ram_or_2_percent_free_disk() {
    let (mut m, actors, peer) = two_members();
    let k = actors[1].key.clone();
    m.saw_at(&peer, T0, T0);
    let calm = Health {
        cpu_usage: 96.9,
        ram_used: 96,
        ram_total: 100,
        disk_free: 3,
        disk_total: 100,
        uptime: 1,
        timestamp: T0.0,
    };
    with_health(&mut m, &peer, calm.clone(), &k);
    assert_eq!(m.state(&peer, T0), NodeState::Online);
    for hot in [
        Health { cpu_usage: 97.0, ..calm.clone() },
        Health { ram_used: 97, ..calm.clone() },
        Health { disk_free: 2, ..calm.clone() },
    ] {
        with_health(&mut m, &peer, hot.clone(), &k);
        assert_eq!(m.state(&peer, T0), NodeState::Degraded, "{hot:?}");
        assert_eq!(m.state(&peer, T0.plus(45_000)), NodeState::Degraded);
        assert_eq!(m.state(&peer, T0.plus(45_001)), NodeState::Unknown, "silence beats health");
        assert_eq!(m.state(&peer, T0.plus(180_001)), NodeState::Offline);
    }
    // A report without a timestamp does not count.
    with_health(&mut m, &peer, Health { cpu_usage: 100.0, timestamp: 0, ..calm.clone() }, &k);
    assert_eq!(m.state(&peer, T0), NodeState::Online);
    // Unknown totals (0) do not count as full.
    with_health(&mut m, &peer, Health { ram_total: 0, disk_total: 0, disk_free: 0, ..calm }, &k);
    assert_eq!(m.state(&peer, T0), NodeState::Online);
}

/// reference-facts.md "Liveness": admin state overrides (even local); local is ONLINE.
#[test]
fn admin_state_overrides_liveness_even_for_this_node_and_this_node_is_online() {
    let (mut m, actors, peer) = two_members();
    let me = actors[0].id.clone();
    assert_eq!(m.state(&me, T0), NodeState::Online, "never 'heard from' itself, still ONLINE");
    assert_eq!(m.state(&me, T0.plus(DAY_MS)), NodeState::Online);
    assert_eq!(m.latency_ms(&me), 0.0);
    let k0 = actors[0].key.clone();
    let hot = Health { cpu_usage: 100.0, timestamp: T0.0, ..Health::default() };
    with_health(&mut m, &me, hot, &k0);
    assert_eq!(m.state(&me, T0), NodeState::Online, "local is ONLINE, not DEGRADED");

    let mut clock = Hlc::new(me.clone());
    m.get_mut(&me).unwrap().set_admin(AdminState::Maintenance, clock.next(T0), &k0);
    assert_eq!(m.state(&me, T0), NodeState::Maintenance);
    m.get_mut(&peer).unwrap().set_admin(AdminState::Draining, clock.next(T0), &k0);
    assert_eq!(m.state(&peer, T0), NodeState::Draining, "never seen, still DRAINING");
    m.saw_at(&peer, T0, T0);
    assert_eq!(m.state(&peer, T0), NodeState::Draining);
    assert_eq!(m.state(&peer, T0.plus(DAY_MS)), NodeState::Draining);
    m.get_mut(&peer).unwrap().set_admin(AdminState::Active, clock.next(T0), &k0);
    assert_eq!(m.state(&peer, T0), NodeState::Online);
}

/// membership.rs module docs, cluster-runtime.md "Liveness is computed, not gossiped": a peer
/// whose clock is 4 minutes ahead (or behind) reports `lastSeenMs` on its own clock; the
/// receiver translates by the peer's `time`, so it computes the same state as if clocks agreed.
#[test]
fn last_seen_from_a_peer_with_a_skewed_clock_is_translated_to_our_clock() {
    let (actors, base) = cluster(3);
    let me = actors[0].id.clone();
    let subject = actors[2].id.clone();
    let now = T0.plus(10 * MINUTE_MS);
    for age_ms in [0, 30_000, 45_000, 45_001, 100_000, 180_000, 180_001, 600_000] {
        let mut states = Vec::new();
        for skew in [0i64, FOUR_MINUTES_MS as i64, -(FOUR_MINUTES_MS as i64)] {
            let sender_now = Millis((now.0 as i64 + skew) as u64);
            let mut report = base[2].clone();
            report.last_seen_ms = sender_now.0 - age_ms;
            report.last_seen = report.last_seen_ms / 1000;
            let mut m = membership_with(me.clone(), &base);
            let mut hlc = Hlc::new(me.clone());
            m.merge(now, &[report], Some(sender_now), Trust::Gossip, &mut hlc);
            assert_eq!(m.last_seen(&subject), Millis(now.0 - age_ms), "skew {skew} age {age_ms}");
            states.push(m.state(&subject, now));
        }
        assert!(states.iter().all(|s| *s == states[0]), "age {age_ms}: {states:?}");
        let expected = match age_ms {
            0..=45_000 => NodeState::Online,
            45_001..=180_000 => NodeState::Unknown,
            _ => NodeState::Offline,
        };
        assert_eq!(states[0], expected, "age {age_ms}");
    }
}

/// The sender's `lastSeen` is gossip about a third node; without the sender's time it cannot
/// be translated and is ignored, and it never makes our own last contact older.
#[test]
fn last_seen_without_the_senders_time_is_ignored_and_never_moves_back() {
    let (actors, base) = cluster(3);
    let me = actors[0].id.clone();
    let subject = actors[2].id.clone();
    let mut report = base[2].clone();
    report.last_seen_ms = T0.0;
    let mut m = membership_with(me.clone(), &base);
    let mut hlc = Hlc::new(me);
    m.merge(T0, std::slice::from_ref(&report), None, Trust::Gossip, &mut hlc);
    assert_eq!(m.last_seen(&subject), Millis::ZERO);
    m.saw_at(&subject, T0.plus(5000), T0.plus(5000));
    report.last_seen_ms = T0.0 + 1000;
    m.merge(T0.plus(6000), &[report], Some(T0.plus(6000)), Trust::Gossip, &mut hlc);
    assert_eq!(m.last_seen(&subject), T0.plus(5000));
}

// ---------------------------------------------------------------------------------------------
// Latency
// ---------------------------------------------------------------------------------------------

/// reference-facts.md "NodeRecord" (latencyMs: 0 self, -1 never, EWMA a=0.3 first sample as
/// is), cluster-runtime.md "Round-trip latency is measured ... alpha 0.3".
#[test]
fn latency_is_an_ewma_with_alpha_0_3_minus_one_when_never_measured_and_zero_for_self() {
    let (actors, base) = cluster(3);
    let mut m = membership_with(actors[0].id.clone(), &base);
    let (me, b, c) = (actors[0].id.clone(), actors[1].id.clone(), actors[2].id.clone());
    assert_eq!(m.latency_ms(&b), -1.0);
    m.record_rtt(&b, 100.0);
    assert_eq!(m.latency_ms(&b), 100.0, "first sample as is");
    m.record_rtt(&b, 200.0);
    assert!((m.latency_ms(&b) - 130.0).abs() < 1e-9, "{}", m.latency_ms(&b));
    m.record_rtt(&b, 50.0);
    assert!((m.latency_ms(&b) - 106.0).abs() < 1e-9, "{}", m.latency_ms(&b));
    m.record_rtt(&me, 500.0);
    assert_eq!(m.latency_ms(&me), 0.0);
    let v = m.latency_vector();
    assert_eq!(v.len(), 2, "peers only: {v:?}");
    assert!((v[&b] - 106.0).abs() < 1e-9);
    assert_eq!(v[&c], -1.0);
}

// ---------------------------------------------------------------------------------------------
// Tombstones
// ---------------------------------------------------------------------------------------------

/// cluster-runtime.md "Removed nodes stay as tombstones for 7 days"; membership.rs: a purged id
/// is remembered so a stale peer cannot bring it back.
#[test]
fn tombstones_are_purged_after_seven_days_and_never_come_back() {
    let (mut actors, base) = cluster(3);
    let me = actors[0].id.clone();
    let gone = actors[2].id.clone();
    let mut m = membership_with(me.clone(), &base);
    let live_copy = m.get(&gone).unwrap().clone();
    m.saw_at(&gone, T0, T0);
    m.record_rtt(&gone, 12.0);
    let v = actors[0].next(T0);
    let removed_at = v.wall_ms;
    let k0 = actors[0].key.clone();
    m.get_mut(&gone).unwrap().set_removed(v, &k0);
    let tombstone = m.get(&gone).unwrap().clone();

    assert!(m.purge_tombstones(Millis(removed_at + 7 * DAY_MS)).is_empty(), "kept for the full 7 days");
    assert!(m.get(&gone).is_some());
    assert_eq!(m.purge_tombstones(Millis(removed_at + 7 * DAY_MS + 1)), vec![gone.clone()]);
    assert!(m.get(&gone).is_none());
    assert_eq!(m.purged().collect::<Vec<_>>(), vec![&gone]);
    assert_eq!(m.last_seen(&gone), Millis::ZERO);
    assert_eq!(m.latency_ms(&gone), -1.0);
    assert_eq!(m.len(), 2);

    // A stale peer gossips the tombstone, the live record, a newer owner version of it, a newer
    // removal: none brings the id back, whatever the trust.
    let mut newer = live_copy.clone();
    let f = newer.owner_fields();
    let v2 = actors[2].next(Millis(removed_at + 8 * DAY_MS));
    newer.resign_owner(f, v2, &actors[2].key.clone());
    let later = Millis(removed_at + 8 * DAY_MS);
    let mut hlc = Hlc::new(me);
    for trust in [Trust::Gossip, Trust::JoinReply] {
        let batch = [tombstone.clone(), live_copy.clone(), newer.clone()];
        let out = m.merge(later, &batch, Some(later), trust, &mut hlc);
        assert_eq!(out, Default::default());
        assert!(m.get(&gone).is_none());
        assert_eq!(m.last_seen(&gone), Millis::ZERO);
    }
    assert!(m.wire_records().iter().all(|r| r.id != gone));
}
