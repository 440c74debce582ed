//! The configuration control plane (spec mesh-config.md; DESIGN.md "Configuration"): resolution
//! with its sources (core/src/config/resolve.rs), value types (types.rs), the rules of a set, a
//! clear, a proposal and its answer (config/mod.rs), and the node's side of them
//! (core/src/node/config.rs) driven on real in-memory [`Node`]s with wall times handed in.

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use serde_json::{json, Value};
use shoal_core::config::resolve::{Change, Level, Manifest, Resolved, Resolver, Source};
use shoal_core::config::types::{parse_value, Declaration, KeyType, ValueError};
use shoal_core::config::{self, ConfigError, Proposal, ProposalStatus, OPEN_PROPOSALS_MAX, PROPOSAL_TTL_MS};
use shoal_core::meta::records::{Record, RecordKind};
use shoal_core::node::config::{ConfigFilter, ConfigList};
use shoal_core::node::{ApiError, ErrorKind, Node, NodeConfig, SelfInfo};
use shoal_core::records::Capabilities;
use shoal_core::time::{Millis, DAY_MS, SECOND_MS};
use shoal_core::NodeId;
use std::collections::{BTreeMap, BTreeSet};

mod common;
use common::{kind_of, Json};

const T0: Millis = Millis(1_800_000_000_000);
const HB: &str = "membership.heartbeat_interval";

// ---- helpers ----

fn decl(name: &str, ty: KeyType) -> Declaration {
    Declaration {
        name: name.to_string(),
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
    }
}

/// An int declaration with an optional default and fallback.
fn int_key(name: &str, default: Option<i64>, fallback: Option<&str>, required: bool) -> Declaration {
    Declaration {
        default: default.map(Value::from),
        fallback: fallback.map(str::to_string),
        required,
        ..decl(name, KeyType::Int)
    }
}

fn manifest(module: &str, keys: Vec<Declaration>) -> Manifest {
    Manifest { module: module.to_string(), keys }
}

fn nid(s: &str) -> NodeId {
    NodeId::new(s)
}

fn set_of(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn mesh(key: &str) -> Level {
    Level::Mesh { key: key.to_string() }
}

fn node_level(node: &str, key: &str) -> Level {
    Level::Node { node: nid(node), key: key.to_string() }
}

fn module_level(node: &str, module: &str, key: &str) -> Level {
    Level::Module { node: nid(node), module: module.to_string(), key: key.to_string() }
}

fn resolved(value: Option<i64>, source: Source) -> Resolved {
    Resolved { value: value.map(Value::from), source }
}

type Slot = (NodeId, String, String);

fn slot(node: &str, module: &str, key: &str) -> Slot {
    (nid(node), module.to_string(), key.to_string())
}

fn id_of(i: u8) -> NodeId {
    NodeId::new(format!("aaaaaaaa-aaaa-4aaa-8aaa-{:012x}", i))
}

fn bare_node_with(i: u8, config: NodeConfig) -> Node {
    let me = SelfInfo {
        name: format!("node-{i}"),
        advertise_url: format!("http://10.0.0.{i}:7000"),
        software_version: "0.1.0".into(),
        capabilities: Capabilities::default(),
        tls_pin: String::new(),
    };
    Node::new(id_of(i), SigningKey::from_bytes(&[i; 32]), 1000 + u64::from(i), config, me)
}

/// Node `i`, alone in a new cluster.
fn member_with(i: u8, config: NodeConfig) -> Node {
    let mut n = bare_node_with(i, config);
    n.create_cluster(T0, "c").expect("create the cluster");
    drain(&mut n);
    n
}

fn member(i: u8) -> Node {
    member_with(i, NodeConfig::default())
}

fn drain(n: &mut Node) {
    while n.poll_output().is_some() {}
}

/// `ms` milliseconds after T0.
fn at(ms: u64) -> Millis {
    T0.plus(ms)
}

fn refused(r: Result<impl std::fmt::Debug, ApiError>, status: u16, code: &str) -> ApiError {
    match r {
        Err(e) => {
            assert_eq!((e.kind, e.code), (kind_of(status), code), "{}", e.message);
            e
        }
        Ok(v) => panic!("expected {status} {code}, got {v:?}"),
    }
}

fn lvl(key: &str, node: Option<&NodeId>, module: Option<&str>) -> Level {
    config::level_of(key, node.map(|n| n.as_str()), module).expect("a valid level")
}

/// This node's resolved value of `module`.`key`.
fn own(n: &Node, module: &str, key: &str) -> Resolved {
    n.config_resolved_own()
        .get(module)
        .and_then(|m| m.get(key))
        .cloned()
        .unwrap_or_else(|| panic!("{module}.{key} resolves on this node"))
}

fn stored(n: &Node, level: &Level) -> Option<config::Entry> {
    n.config_entries().get(level).cloned()
}

fn history(n: &Node, f: &ConfigFilter) -> Vec<Value> {
    n.config_history(f, 100).json()["history"].as_array().expect("a history").clone()
}

fn proposals(n: &Node, wall: Millis) -> Vec<Proposal> {
    n.config_proposals(wall).proposals
}

fn proposal(n: &Node, wall: Millis, id: &str) -> Proposal {
    n.config_proposal(wall, id).expect("the proposal")
}

fn propose(n: &mut Node, wall: Millis, level: &Level, value: Option<Value>, why: &str) -> Proposal {
    n.config_propose(wall, level, value.as_ref(), why, "op").expect("proposed")
}

fn filter(module: Option<&str>, node: Option<&NodeId>, key: Option<&str>) -> ConfigFilter {
    ConfigFilter { module: module.map(str::to_string), node: node.map(|n| n.to_string()), key: key.map(str::to_string) }
}

// ---- 1. precedence and sources (pure resolver) ----

const N1: &str = "n1";
const N2: &str = "n2";

/// Build b1: module `ma` declares `k` (default 1, falls back to predefined `p`), `c` (default 7,
/// no fallback), `req` (required, no default, no fallback), `opt` (optional, no default, no
/// fallback) and `reqfb` (required, no default, falls back to `p`); module `mb` declares `k` too
/// (default 2, falls back to `p`). Both nodes run b1 with both modules placed.
fn precedence_resolver() -> Resolver {
    let mut r = Resolver::new();
    r.set_build_manifests(
        "b1",
        vec![
            manifest(
                "ma",
                vec![
                    int_key("k", Some(1), Some("p"), false),
                    int_key("c", Some(7), None, false),
                    int_key("req", None, None, true),
                    int_key("opt", None, None, false),
                    int_key("reqfb", None, Some("p"), true),
                ],
            ),
            manifest("mb", vec![int_key("k", Some(2), Some("p"), false)]),
        ],
    );
    r.set_node(nid(N1), "b1", set_of(&["ma", "mb"]));
    r.set_node(nid(N2), "b1", set_of(&["ma", "mb"]));
    r
}

#[derive(Clone, Copy, Debug)]
enum NodeVal {
    None,
    This,
    Other,
}

#[derive(Clone, Copy, Debug)]
enum ModVal {
    None,
    This,
    OtherNode,
    OtherModule,
}

/// The values one row of the table sets, for key `key` of `ma` on n1 falling back to `pre`.
fn row_values(key: &str, pre: &str, mesh_set: bool, nv: NodeVal, mv: ModVal) -> Vec<(Level, Value)> {
    let mut out = Vec::new();
    if mesh_set {
        out.push((mesh(pre), json!(10)));
    }
    match nv {
        NodeVal::None => {}
        NodeVal::This => out.push((node_level(N1, pre), json!(20))),
        NodeVal::Other => out.push((node_level(N2, pre), json!(21))),
    }
    match mv {
        ModVal::None => {}
        ModVal::This => out.push((module_level(N1, "ma", key), json!(30))),
        ModVal::OtherNode => out.push((module_level(N2, "ma", key), json!(31))),
        ModVal::OtherModule => out.push((module_level(N1, "mb", key), json!(32))),
    }
    out
}

/// Resolve `values` both ways: given whole to `resolve_all`, and set one by one after a first
/// full pass; returns the value of `slot` from each.
fn both_ways(values: &[(Level, Value)], s: &Slot) -> (Resolved, Resolved) {
    let mut full = precedence_resolver();
    full.set_values(values.iter().cloned().collect());
    full.resolve_all();
    let mut inc = precedence_resolver();
    inc.resolve_all();
    for (l, v) in values {
        inc.set(l.clone(), Some(v.clone()));
    }
    (full.resolved()[s].clone(), inc.resolved()[s].clone())
}

const NODE_VALS: [NodeVal; 3] = [NodeVal::None, NodeVal::This, NodeVal::Other];
const MOD_VALS: [ModVal; 4] = [ModVal::None, ModVal::This, ModVal::OtherNode, ModVal::OtherModule];

/// A key falling back to a predefined key: the module's own value on this node beats the node
/// value of the predefined key on this node, which beats its mesh value, which beats the
/// default; values for another node or another module do not apply.
#[test]
fn a_key_with_a_fallback_resolves_most_specific_first() {
    let s = slot(N1, "ma", "k");
    for mesh_set in [false, true] {
        for nv in NODE_VALS {
            for mv in MOD_VALS {
                let values = row_values("k", "p", mesh_set, nv, mv);
                let want = match (mesh_set, nv, mv) {
                    (_, _, ModVal::This) => resolved(Some(30), Source::Module),
                    (_, NodeVal::This, _) => resolved(Some(20), Source::Node),
                    (true, _, _) => resolved(Some(10), Source::Mesh),
                    _ => resolved(Some(1), Source::Default),
                };
                let (full, inc) = both_ways(&values, &s);
                assert_eq!(full, want, "full pass, mesh={mesh_set} node={nv:?} module={mv:?}");
                assert_eq!(inc, want, "incremental, mesh={mesh_set} node={nv:?} module={mv:?}");
            }
        }
    }
}

/// A key naming no predefined key resolves from its default and the module's own value only:
/// mesh and node values, of its own name or of any predefined key, are ignored.
#[test]
fn a_key_without_fallback_takes_only_its_default_or_the_modules_own_value() {
    let s = slot(N1, "ma", "c");
    for mesh_set in [false, true] {
        for nv in NODE_VALS {
            for mv in MOD_VALS {
                // Mesh and node values both under the key's own name and under `p`.
                let mut values = row_values("c", "c", mesh_set, nv, mv);
                values.extend(row_values("c", "p", mesh_set, nv, ModVal::None));
                let want = match mv {
                    ModVal::This => resolved(Some(30), Source::Module),
                    _ => resolved(Some(7), Source::Default),
                };
                let (full, inc) = both_ways(&values, &s);
                assert_eq!(full, want, "full pass, mesh={mesh_set} node={nv:?} module={mv:?}");
                assert_eq!(inc, want, "incremental, mesh={mesh_set} node={nv:?} module={mv:?}");
            }
        }
    }
}

/// A required key with no default that nothing sets is `unset`; set, it takes its source. An
/// optional key with no default that nothing sets is absent, from its (missing) default, not
/// `unset`.
#[test]
fn a_required_key_nothing_sets_is_unset_and_an_optional_one_is_absent() {
    let mut r = precedence_resolver();
    r.resolve_all();
    assert_eq!(r.resolved()[&slot(N1, "ma", "req")], resolved(None, Source::Unset));
    assert_eq!(r.resolved()[&slot(N1, "ma", "reqfb")], resolved(None, Source::Unset));
    assert_eq!(r.resolved()[&slot(N1, "ma", "opt")], resolved(None, Source::Default));

    // A mesh value of the predefined key sets the required key that falls back to it.
    r.set(mesh("p"), Some(json!(4)));
    assert_eq!(r.resolved()[&slot(N1, "ma", "reqfb")], resolved(Some(4), Source::Mesh));
    // ... but not the one without a fallback, even under its own name.
    r.set(mesh("req"), Some(json!(4)));
    r.set(node_level(N1, "req"), Some(json!(4)));
    assert_eq!(r.resolved()[&slot(N1, "ma", "req")], resolved(None, Source::Unset));
    r.set(module_level(N1, "ma", "req"), Some(json!(5)));
    assert_eq!(r.resolved()[&slot(N1, "ma", "req")], resolved(Some(5), Source::Module));
    r.set(module_level(N1, "ma", "opt"), Some(json!(6)));
    assert_eq!(r.resolved()[&slot(N1, "ma", "opt")], resolved(Some(6), Source::Module));

    // Cleared again: back to unset and absent.
    r.set(module_level(N1, "ma", "req"), None);
    r.set(module_level(N1, "ma", "opt"), None);
    r.set(mesh("p"), None);
    assert_eq!(r.resolved()[&slot(N1, "ma", "req")], resolved(None, Source::Unset));
    assert_eq!(r.resolved()[&slot(N1, "ma", "reqfb")], resolved(None, Source::Unset));
    assert_eq!(r.resolved()[&slot(N1, "ma", "opt")], resolved(None, Source::Default));
}

// ---- 2. incremental equals full ----

const U_NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];
const U_MODULES: [&str; 3] = ["ma", "mb", "mc"];
const U_KEYS: [&str; 7] = ["p1", "p2", "a1", "a2", "a3", "a4", "bk"];

/// Where each node runs: its build and the modules placed on it.
type Placement = BTreeMap<NodeId, (String, BTreeSet<String>)>;

/// n1 runs b1 with ma and mb, n2 runs b1 with ma, n3 runs b2 (which has no manifest for mb,
/// placed there), n4 runs nothing known. mc is declared and placed nowhere.
fn start_placement() -> Placement {
    [("n1", "b1", &["ma", "mb"][..]), ("n2", "b1", &["ma"][..]), ("n3", "b2", &["ma", "mb"][..])]
        .into_iter()
        .map(|(n, b, ms)| (nid(n), (b.to_string(), set_of(ms))))
        .collect()
}

/// Three builds: b1; b2 without mb; b3, b1's modules with their keys reordered, one added and
/// some falling back elsewhere (so a slot's declaration index and fallback move between builds).
fn universe_with(placement: &Placement) -> Resolver {
    let mut r = Resolver::new();
    r.set_build_manifests(
        "b1",
        vec![
            manifest(
                "ma",
                vec![
                    int_key("a1", Some(1), Some("p1"), false),
                    int_key("a2", None, Some("p2"), true),
                    int_key("a3", Some(3), None, false),
                    int_key("a4", None, None, false),
                ],
            ),
            manifest("mb", vec![int_key("bk", Some(5), Some("p1"), false), int_key("a1", None, Some("p2"), false)]),
        ],
    );
    r.set_build_manifests(
        "b2",
        vec![manifest("ma", vec![int_key("a1", Some(100), Some("p2"), false), int_key("a3", None, Some("p1"), true)])],
    );
    r.set_build_manifests(
        "b3",
        vec![
            manifest(
                "ma",
                vec![
                    int_key("a0", Some(0), Some("p2"), false),
                    int_key("a4", None, Some("p1"), false),
                    int_key("a3", Some(3), None, false),
                    int_key("a2", Some(2), Some("p2"), true),
                    int_key("a1", Some(11), Some("p2"), false),
                ],
            ),
            manifest("mb", vec![int_key("a1", None, Some("p1"), false), int_key("bk", Some(6), Some("p2"), false)]),
        ],
    );
    for (node, (build, modules)) in placement {
        r.set_node(node.clone(), build, modules.clone());
    }
    r
}

fn universe() -> Resolver {
    universe_with(&start_placement())
}

#[derive(Clone, Debug)]
enum Op {
    /// Set (or clear) one value.
    Set(Level, Option<i64>),
    /// n1 or n2 moves to b1 or b3 with some of ma and mb placed; then a full pass.
    Move(NodeId, &'static str, BTreeSet<String>),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (level_strategy(), prop::option::of(0i64..3)).prop_map(|(l, v)| Op::Set(l, v)),
        1 => (0usize..2, prop::bool::ANY, prop::bool::ANY, prop::bool::ANY).prop_map(|(n, b3, ma, mb)| {
            let mut modules = BTreeSet::new();
            if ma {
                modules.insert("ma".to_string());
            }
            if mb {
                modules.insert("mb".to_string());
            }
            Op::Move(nid(U_NODES[n]), if b3 { "b3" } else { "b1" }, modules)
        }),
    ]
}

fn level_strategy() -> impl Strategy<Value = Level> {
    let node = (0usize..U_NODES.len()).prop_map(|i| nid(U_NODES[i]));
    let module = (0usize..U_MODULES.len()).prop_map(|i| U_MODULES[i].to_string());
    let key = || (0usize..U_KEYS.len()).prop_map(|i| U_KEYS[i].to_string());
    prop_oneof![
        key().prop_map(|key| Level::Mesh { key }),
        (node.clone(), key()).prop_map(|(node, key)| Level::Node { node, key }),
        (node, module, key()).prop_map(|(node, module, key)| Level::Module { node, module, key }),
    ]
}

/// The changes `changes` must be exactly: one per slot whose value differs between `before`
/// and `after`, from its old value to its new.
fn check_changes(
    before: &BTreeMap<Slot, Resolved>,
    after: &BTreeMap<Slot, Resolved>,
    changes: &[Change],
) -> Result<(), TestCaseError> {
    let mut got: BTreeMap<Slot, (Option<Resolved>, Resolved)> = BTreeMap::new();
    for c in changes {
        let s = (c.node.clone(), c.module.clone(), c.key.clone());
        prop_assert!(got.insert(s.clone(), (c.from.clone(), c.to.clone())).is_none(), "{s:?} changed twice");
    }
    let mut want: BTreeMap<Slot, (Option<Resolved>, Resolved)> = BTreeMap::new();
    for (s, r) in after {
        if before.get(s) != Some(r) {
            want.insert(s.clone(), (before.get(s).cloned(), r.clone()));
        }
    }
    prop_assert_eq!(got, want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// After every set or clear, the incrementally kept values equal a full resolution of the
    /// same stored values, the changes returned are exactly the slots that moved, and a full
    /// pass over the kept values finds nothing left to move. Now and then a node moves to
    /// another build or placement, and the full pass that follows reports exactly what moved.
    #[test]
    fn incremental_resolution_equals_a_full_one(ops in prop::collection::vec(op_strategy(), 1..40)) {
        let mut placement = start_placement();
        let mut inc = universe_with(&placement);
        inc.resolve_all();
        let mut values: BTreeMap<Level, Value> = BTreeMap::new();
        for op in ops {
            let before = inc.resolved().clone();
            let (what, changes) = match op {
                Op::Set(level, value) => {
                    let value = value.map(Value::from);
                    let changes = inc.set(level.clone(), value.clone());
                    match &value {
                        Some(v) => values.insert(level.clone(), v.clone()),
                        None => values.remove(&level),
                    };
                    prop_assert_eq!(inc.value(&level), value.as_ref());
                    (format!("setting {} to {value:?}", level.name()), changes)
                }
                Op::Move(node, build, modules) => {
                    placement.insert(node.clone(), (build.to_string(), modules.clone()));
                    inc.set_node(node.clone(), build, modules.clone());
                    (format!("moving {node} to {build} with {modules:?}"), inc.resolve_all())
                }
            };
            let mut full = universe_with(&placement);
            full.set_values(values.clone());
            full.resolve_all();
            prop_assert_eq!(inc.resolved(), full.resolved(), "after {}", what);
            check_changes(&before, inc.resolved(), &changes)?;
            let mut again = inc.clone();
            prop_assert!(again.resolve_all().is_empty(), "a full pass after {} moved values", what);
        }
    }
}

/// A full pass writes only the values that moved: the first reports every slot, the second
/// nothing; one value moved reports just the slots it moves.
#[test]
fn a_second_full_pass_moves_nothing() {
    let mut r = universe();
    let first = r.resolve_all();
    let slots: BTreeSet<Slot> = first.iter().map(|c| (c.node.clone(), c.module.clone(), c.key.clone())).collect();
    assert_eq!(slots.len(), first.len());
    assert_eq!(slots, r.resolved().keys().cloned().collect::<BTreeSet<_>>(), "the first pass reports every slot");
    assert!(first.iter().all(|c| c.from.is_none()));
    assert!(r.resolve_all().is_empty(), "nothing moved");

    let mut values = BTreeMap::new();
    values.insert(mesh("p1"), json!(9));
    r.set_values(values);
    let moved: BTreeSet<Slot> =
        r.resolve_all().into_iter().map(|c| (c.node.clone(), c.module.clone(), c.key.clone())).collect();
    // p1 is the fallback of ma.a1 and mb.bk in b1 and of ma.a3 in b2.
    let want: BTreeSet<Slot> =
        [slot("n1", "ma", "a1"), slot("n1", "mb", "bk"), slot("n2", "ma", "a1"), slot("n3", "ma", "a3")]
            .into_iter()
            .collect();
    assert_eq!(moved, want);
    assert!(r.resolve_all().is_empty(), "nothing moved the second time");
}

// ---- 3. unresolved modules ----

/// A placed module none of whose manifests can be read here is listed under `unresolved` with
/// why, and keeps the values last resolved for it; a value set meanwhile moves nothing there
/// until its manifests are known.
#[test]
fn a_module_whose_manifests_are_unknown_is_unresolved_and_keeps_its_values() {
    let mut r = universe();
    r.set(module_level("n1", "ma", "a1"), Some(json!(2)));
    r.resolve_all();
    assert!(r.unresolved().contains_key(&(nid("n3"), "mb".to_string())), "b2 has no manifest for mb");
    assert!(r.unresolved()[&(nid("n3"), "mb".to_string())].contains("mb"));
    assert!(!r.unresolved().contains_key(&(nid("n1"), "ma".to_string())));
    let kept: BTreeMap<Slot, Resolved> =
        r.resolved().iter().filter(|(s, _)| s.0 == nid("n1")).map(|(s, v)| (s.clone(), v.clone())).collect();
    assert_eq!(kept[&slot("n1", "ma", "a1")], resolved(Some(2), Source::Module));

    // n1 moves to a build whose manifests are not known here.
    r.set_node(nid("n1"), "b9", set_of(&["ma", "mb"]));
    assert!(r.resolve_all().is_empty(), "nothing moves");
    for m in ["ma", "mb"] {
        let why = r.unresolved().get(&(nid("n1"), m.to_string())).unwrap_or_else(|| panic!("n1 {m} is unresolved"));
        assert!(why.contains("b9"), "why names the build: {why}");
    }
    let now: BTreeMap<Slot, Resolved> =
        r.resolved().iter().filter(|(s, _)| s.0 == nid("n1")).map(|(s, v)| (s.clone(), v.clone())).collect();
    assert_eq!(now, kept, "the last resolved values stay");

    // A value set now moves nothing on n1, whether set incrementally or in a full pass.
    assert!(r.set(mesh("p1"), Some(json!(8))).iter().all(|c| c.node != nid("n1")));
    r.resolve_all();
    assert_eq!(r.resolved()[&slot("n1", "ma", "a1")], resolved(Some(2), Source::Module));
    assert_eq!(r.resolved()[&slot("n1", "mb", "bk")], resolved(Some(5), Source::Default));

    // Its manifests known, it resolves again.
    r.set_build_manifests("b9", vec![manifest("ma", vec![int_key("a1", Some(1), Some("p1"), false)])]);
    r.set(module_level("n1", "ma", "a1"), None);
    r.resolve_all();
    assert_eq!(r.resolved()[&slot("n1", "ma", "a1")], resolved(Some(8), Source::Mesh));
    assert!(!r.unresolved().contains_key(&(nid("n1"), "ma".to_string())));
    assert!(r.unresolved().contains_key(&(nid("n1"), "mb".to_string())), "b9 has no mb");
}

/// A value set after a build's manifests were read again (its keys in another order), before
/// the full pass that follows, moves the key it names and no other.
#[test]
fn a_set_after_the_manifests_changed_moves_the_key_it_names() {
    let x = || int_key("x", Some(1), Some("p"), false);
    let y = || int_key("y", Some(2), Some("q"), false);
    let mut r = Resolver::new();
    r.set_build_manifests("b1", vec![manifest("ma", vec![x(), y()])]);
    r.set_node(nid(N1), "b1", set_of(&["ma"]));
    r.resolve_all();
    r.set_build_manifests("b1", vec![manifest("ma", vec![y(), x()])]);
    let changes = r.set(mesh("p"), Some(json!(5)));
    assert_eq!(r.resolved()[&slot(N1, "ma", "y")], resolved(Some(2), Source::Default), "y does not fall back to p");
    for c in &changes {
        assert_eq!(r.resolved()[&(c.node.clone(), c.module.clone(), c.key.clone())], c.to, "{c:?}");
    }
    r.resolve_all();
    assert_eq!(r.resolved()[&slot(N1, "ma", "x")], resolved(Some(5), Source::Mesh));
    assert_eq!(r.resolved()[&slot(N1, "ma", "y")], resolved(Some(2), Source::Default));
}

// ---- 4. level names ----

#[test]
fn level_names_round_trip() {
    let node = "3f2a9c1e-7b4d-4e8a-9c0f-1a2b3c4d5e6f";
    let cases = [
        (mesh(HB), format!("mesh.{HB}")),
        (mesh("plain"), "mesh.plain".to_string()),
        (node_level(node, HB), format!("node.{node}.{HB}")),
        (
            module_level(node, "membership", "heartbeat_interval"),
            format!("module.{node}.membership.heartbeat_interval"),
        ),
        (module_level(node, "user_mod-2", "a.b.c"), format!("module.{node}.user_mod-2.a.b.c")),
    ];
    for (level, name) in cases {
        assert_eq!(level.name(), name);
        assert_eq!(Level::parse(&name), Some(level.clone()), "{name}");
        assert_eq!(Level::parse(&level.name()).map(|l| l.name()), Some(name));
    }
    assert_eq!(Level::parse(&format!("node.{node}.{HB}")).map(|l| l.key().to_string()), Some(HB.to_string()));
    for bad in ["", "mesh", "mesh.", "node.n1", "node..k", "node.n1.", "module.n1.m", "module.n1..k", "cluster.k"] {
        assert_eq!(Level::parse(bad), None, "{bad:?} is no level");
    }
}

#[test]
fn level_of_names_one_level_and_refuses_bad_names() {
    let node = "3f2a9c1e-7b4d-4e8a-9c0f-1a2b3c4d5e6f";
    assert_eq!(config::level_of(HB, None, None), Ok(mesh(HB)));
    assert_eq!(config::level_of(&format!(" {HB} "), None, None), Ok(mesh(HB)), "the key is trimmed");
    assert_eq!(config::level_of(HB, Some(node), None), Ok(node_level(node, HB)));
    assert_eq!(
        config::level_of("heartbeat_interval", Some(node), Some("membership")),
        Ok(module_level(node, "membership", "heartbeat_interval"))
    );
    let refusals: [(&str, Option<&str>, Option<&str>); 10] = [
        ("k", None, Some("membership")),
        ("k", Some("a.b"), None),
        ("k", Some("a b"), None),
        ("k", Some(""), None),
        ("k", Some(node), Some("mem.bership")),
        ("k", Some(node), Some("x/y")),
        ("", None, None),
        ("   ", None, None),
        ("a/b", None, None),
        ("a b", None, None),
    ];
    for (key, n, m) in refusals {
        match config::level_of(key, n, m) {
            Err(e @ ConfigError::Level(_)) => assert_eq!(e.code(), "bad_level"),
            other => panic!("{key:?} {n:?} {m:?}: expected a refusal, got {other:?}"),
        }
    }
    let e = config::level_of("k", None, Some("membership")).unwrap_err();
    assert!(e.to_string().contains("--node"), "a module value names its node: {e}");
}

// ---- 5. value types ----

fn ok(d: &Declaration, input: Value) -> Value {
    parse_value(d, &input).unwrap_or_else(|e| panic!("{} takes {input}: {e}", d.name))
}

fn bad(d: &Declaration, input: Value) -> ValueError {
    match parse_value(d, &input) {
        Err(e) => {
            assert!(e.to_string().contains(&d.name), "the error names the key: {e}");
            e
        }
        Ok(v) => panic!("{} refuses {input}, got {v}", d.name),
    }
}

#[test]
fn values_parse_by_type() {
    let b = decl("svc.flag", KeyType::Bool);
    for (text, want) in [("true", true), ("false", false), ("on", true), ("off", false), (" on ", true)] {
        assert_eq!(ok(&b, json!(text)), json!(want), "{text}");
    }
    assert_eq!(ok(&b, json!(true)), json!(true));
    assert!(matches!(bad(&b, json!("maybe")), ValueError::Type { .. }));
    bad(&b, json!(1));

    let i = decl("svc.count", KeyType::Int);
    assert_eq!(ok(&i, json!("42")), json!(42));
    assert_eq!(ok(&i, json!(-7)), json!(-7));
    bad(&i, json!("4.2"));
    bad(&i, json!("many"));

    let f = decl("svc.ratio", KeyType::Float);
    assert_eq!(ok(&f, json!("2.5")), json!(2.5));
    assert_eq!(ok(&f, json!(3)), json!(3.0));
    bad(&f, json!("abc"));
    bad(&f, json!("NaN"));
    bad(&f, json!("inf"));

    let s = decl("svc.name", KeyType::String);
    assert_eq!(ok(&s, json!("hello world")), json!("hello world"));

    let d = decl("svc.every", KeyType::Duration);
    for (text, ms) in [
        ("15s", 15_000u64),
        ("500ms", 500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("7d", 7 * DAY_MS),
        ("1.5s", 1_500),
        ("250", 250),
    ] {
        assert_eq!(ok(&d, json!(text)), json!(ms), "{text}");
    }
    assert_eq!(ok(&d, json!(2_000)), json!(2_000), "a number is milliseconds");
    for garbage in ["garbage", "15x", "s", "-1s", "", "1.0005s"] {
        assert!(matches!(bad(&d, json!(garbage)), ValueError::Type { .. }), "{garbage:?}");
    }

    let by = decl("svc.size", KeyType::Bytes);
    for (text, n) in [("64MiB", 64u64 << 20), ("1GB", 1_000_000_000), ("4096", 4096), ("1.5KiB", 1536), ("2KB", 2000)] {
        assert_eq!(ok(&by, json!(text)), json!(n), "{text}");
    }
    bad(&by, json!("12 parsecs"));
    bad(&by, json!("lots"));

    let e = Declaration { choices: vec!["fast".into(), "safe".into()], ..decl("svc.mode", KeyType::Enum) };
    assert_eq!(ok(&e, json!("safe")), json!("safe"));
    let err = bad(&e, json!("quick"));
    assert!(matches!(err, ValueError::Choice { .. }));
    assert!(err.to_string().contains("fast, safe"), "the choices are named: {err}");

    let l = decl("svc.peers", KeyType::List);
    assert_eq!(ok(&l, json!("a,b")), json!(["a", "b"]));
    assert_eq!(ok(&l, json!(" a , b ,")), json!(["a", "b"]));
    assert_eq!(ok(&l, json!(r#"["a","b,c"]"#)), json!(["a", "b,c"]), "a JSON array in text");
    assert_eq!(ok(&l, json!(["x", "y"])), json!(["x", "y"]));
    bad(&l, json!([1, 2]));
}

#[test]
fn ranges_and_patterns_are_enforced() {
    let i = Declaration { min: Some(1.0), max: Some(10.0), ..decl("svc.count", KeyType::Int) };
    assert_eq!(ok(&i, json!("1")), json!(1));
    assert_eq!(ok(&i, json!("10")), json!(10));
    assert!(matches!(bad(&i, json!("0")), ValueError::Below { .. }));
    assert!(matches!(bad(&i, json!("11")), ValueError::Above { .. }));

    let d = Declaration { min: Some(100.0), max: Some(600_000.0), ..decl("svc.every", KeyType::Duration) };
    assert_eq!(ok(&d, json!("10m")), json!(600_000));
    assert!(matches!(bad(&d, json!("50ms")), ValueError::Below { .. }));
    assert!(matches!(bad(&d, json!("11m")), ValueError::Above { .. }));

    let by = Declaration { max: Some(1024.0), ..decl("svc.size", KeyType::Bytes) };
    assert_eq!(ok(&by, json!("1KiB")), json!(1024));
    assert!(matches!(bad(&by, json!("2KiB")), ValueError::Above { .. }));

    let f = Declaration { min: Some(0.0), max: Some(50.0), ..decl("svc.pct", KeyType::Float) };
    assert!(matches!(bad(&f, json!("-0.5")), ValueError::Below { .. }));
    assert!(matches!(bad(&f, json!("50.5")), ValueError::Above { .. }));

    let s = Declaration { pattern: Some("[a-z]+".into()), ..decl("svc.name", KeyType::String) };
    assert_eq!(ok(&s, json!("abc")), json!("abc"));
    assert!(matches!(bad(&s, json!("abc1")), ValueError::Pattern { .. }), "the pattern matches whole");
    assert!(matches!(bad(&s, json!("1abc")), ValueError::Pattern { .. }));

    let l = Declaration { pattern: Some("[a-z]+".into()), ..decl("svc.peers", KeyType::List) };
    assert_eq!(ok(&l, json!("a,b")), json!(["a", "b"]));
    let err = bad(&l, json!("a,B"));
    assert!(matches!(&err, ValueError::Pattern { value, .. } if value == "B"), "each item is checked: {err}");
}

// ---- 6. the node's config verb ----

/// A mesh value of a predefined key resolves for this node with source mesh; a node value of
/// it for this node wins, a module's own value wins over both; clears fall back in turn.
#[test]
fn values_at_each_level_resolve_on_the_node_and_clears_fall_back() {
    let mut n = member(1);
    let me = n.id().clone();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(15_000), Source::Default));

    let mesh_l = lvl(HB, None, None);
    let v = n.config_set(at(1_000), &mesh_l, Some(&json!("5s")), "faster failure detection", "admin").expect("set");
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(5_000), Source::Mesh));
    assert_eq!(v.json()["value"], json!(5_000));
    let v = v.json();
    let moved = v["moved"].as_array().expect("moved");
    assert!(
        moved.iter().any(|m| m["node"] == json!(me) && m["module"] == "membership" && m["key"] == "heartbeat_interval"),
        "the answer names the value it moved: {v:?}"
    );
    let e = stored(&n, &mesh_l).expect("stored");
    assert_eq!((e.value, e.by.as_str(), e.account.as_str()), (json!(5_000), me.as_str(), "admin"));
    assert_eq!((e.why.as_str(), e.at), ("faster failure detection", at(1_000).0));

    // A node value for another node does not apply here.
    n.config_set(at(1_500), &lvl(HB, Some(&id_of(9)), None), Some(&json!("1s")), "other", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(5_000), Source::Mesh));

    let node_l = lvl(HB, Some(&me), None);
    n.config_set(at(2_000), &node_l, Some(&json!("7s")), "this node", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(7_000), Source::Node));

    let module_l = lvl("heartbeat_interval", Some(&me), Some("membership"));
    n.config_set(at(3_000), &module_l, Some(&json!("9s")), "the module", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(9_000), Source::Module));
    // Only that key moved.
    assert_eq!(own(&n, "membership", "heartbeat_timeout"), resolved(Some(20_000), Source::Default));

    n.config_set(at(4_000), &module_l, None, "undo", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(7_000), Source::Node));
    assert_eq!(stored(&n, &module_l), None);
    n.config_set(at(5_000), &node_l, None, "undo", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(5_000), Source::Mesh));
    n.config_set(at(6_000), &mesh_l, None, "undo", "admin").unwrap();
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(15_000), Source::Default));
}

#[test]
fn a_set_refuses_undeclared_keys_missing_reasons_and_bad_values() {
    let mut n = member(1);
    let me = n.id().clone();

    let e = refused(
        n.config_set(at(1_000), &lvl("membership.no_such_key", None, None), Some(&json!("1")), "why", "admin"),
        400,
        "undeclared_key",
    );
    assert!(e.message.contains(HB), "the declared keys are named: {}", e.message);
    assert!(e.message.contains("membership.no_such_key"), "{}", e.message);

    let e = refused(
        n.config_set(at(1_000), &lvl("nope", Some(&me), Some("membership")), Some(&json!("1")), "why", "admin"),
        400,
        "undeclared_key",
    );
    assert!(e.message.contains("heartbeat_interval"), "the module's keys are named: {}", e.message);
    // A module's own value names the module's key, not the predefined one.
    refused(
        n.config_set(at(1_000), &lvl(HB, Some(&me), Some("membership")), Some(&json!("5s")), "why", "admin"),
        400,
        "undeclared_key",
    );

    for why in ["", "   "] {
        refused(n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("5s")), why, "admin"), 400, "no_why");
        refused(n.config_set(at(1_000), &lvl(HB, None, None), None, why, "admin"), 400, "no_why");
    }
    let e =
        refused(n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("fast")), "why", "admin"), 400, "bad_value");
    assert!(e.message.contains(HB), "the key is named: {}", e.message);
    refused(n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("10ms")), "why", "admin"), 400, "bad_value");
    refused(n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("11m")), "why", "admin"), 400, "bad_value");

    assert!(n.config_entries().is_empty(), "nothing was stored");
    assert!(history(&n, &ConfigFilter::default()).is_empty(), "nothing was recorded");
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(15_000), Source::Default));

    // Not in a cluster: refused before anything else.
    let mut lone = bare_node_with(2, NodeConfig::default());
    refused(
        lone.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("5s")), "why", "admin"),
        409,
        "not_in_cluster",
    );
}

#[test]
fn history_records_sets_and_clears_newest_first() {
    let mut n = member(1);
    let me = n.id().clone();
    let l = lvl(HB, None, None);
    n.config_set(at(1_000), &l, Some(&json!("5s")), "first", "alice").unwrap();
    n.config_set(at(2_000), &l, Some(&json!("6s")), "second", "bob").unwrap();
    n.config_set(at(3_000), &l, None, "third", "carol").unwrap();
    n.config_set(at(4_000), &lvl("meta.lease", Some(&me), None), Some(&json!("40s")), "lease", "dave").unwrap();

    let h = history(&n, &filter(None, None, Some(HB)));
    let rows: Vec<(&str, &Value, &Value, &str, &str)> = h
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                &e["value"],
                &e["previous"],
                e["why"].as_str().unwrap(),
                e["account"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("clear", &Value::Null, &json!(6_000), "third", "carol"),
            ("set", &json!(6_000), &json!(5_000), "second", "bob"),
            ("set", &json!(5_000), &Value::Null, "first", "alice"),
        ]
    );
    for e in &h {
        assert_eq!(e["by"], json!(me), "who took it");
        assert_eq!(e["level"], format!("mesh.{HB}"));
    }
    assert_eq!(h[0]["at"], json!(at(3_000).0));
    assert!(h[2]["moved"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m.as_str().unwrap().contains("membership.heartbeat_interval")));

    let all = history(&n, &ConfigFilter::default());
    assert_eq!(all.len(), 4);
    assert_eq!(all[0]["level"], format!("node.{me}.meta.lease"), "newest first");
    let by_node = history(&n, &filter(None, Some(&id_of(9)), Some("meta.lease")));
    assert!(by_node.is_empty(), "another node's filter excludes this node's value");
    assert_eq!(n.config_history(&ConfigFilter::default(), 2).json()["history"].as_array().unwrap().len(), 2, "limited");
}

/// Two acts in the same millisecond are still listed newest first.
#[test]
fn history_within_one_millisecond_is_newest_first() {
    let mut n = member(1);
    let l = lvl(HB, None, None);
    n.config_set(at(1_000), &l, Some(&json!("5s")), "first", "admin").unwrap();
    n.config_set(at(1_000), &l, None, "second", "admin").unwrap();
    let h = history(&n, &ConfigFilter::default());
    let actions: Vec<&str> = h.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, vec!["clear", "set"]);
}

fn list_levels(v: &ConfigList) -> BTreeSet<String> {
    let v = v.json();
    v["values"].as_array().unwrap().iter().map(|e| e["level"].as_str().unwrap().to_string()).collect()
}

fn names(items: &[&String]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn list_slots(v: &ConfigList) -> Vec<(String, String, String)> {
    let v = v.json();
    v["resolved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().into(),
                r["module"].as_str().unwrap().into(),
                r["key"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// Stored values: a mesh value of membership.heartbeat_interval, a node value of meta.lease on
/// this node, storage's own scrub_rate on this node, and a node value for another node.
fn listed_node() -> (Node, NodeId) {
    let mut n = member(1);
    let me = n.id().clone();
    n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("5s")), "w", "admin").unwrap();
    n.config_set(at(2_000), &lvl("meta.lease", Some(&me), None), Some(&json!("40s")), "w", "admin").unwrap();
    n.config_set(at(3_000), &lvl("scrub_rate", Some(&me), Some("storage")), Some(&json!("1MiB")), "w", "admin")
        .unwrap();
    n.config_set(
        at(4_000),
        &lvl("membership.heartbeat_timeout", Some(&id_of(9)), None),
        Some(&json!("30s")),
        "w",
        "admin",
    )
    .unwrap();
    (n, me)
}

#[test]
fn config_list_is_narrowed_by_node_and_key() {
    let (n, me) = listed_node();
    let mesh_hb = format!("mesh.{HB}");
    let node_lease = format!("node.{me}.meta.lease");
    let module_scrub = format!("module.{me}.storage.scrub_rate");
    let other_timeout = format!("node.{}.membership.heartbeat_timeout", id_of(9));

    let all = n.config_list(&ConfigFilter::default());
    assert_eq!(list_levels(&all), names(&[&mesh_hb, &node_lease, &module_scrub, &other_timeout]));
    let total = list_slots(&all).len();
    assert_eq!(total, shoal_core::config::builtin::predefined().len(), "one member, every built-in key");
    assert!(all.json()["unresolved"].as_array().unwrap().is_empty());
    let row = all.json()["resolved"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["module"] == "membership" && r["key"] == "heartbeat_interval")
        .unwrap()
        .clone();
    assert_eq!((row["value"].clone(), row["source"].clone()), (json!(5_000), json!("mesh")));

    // By node: mesh values apply everywhere; the other node's value is not listed.
    let by_node = n.config_list(&filter(None, Some(&me), None));
    assert_eq!(list_levels(&by_node), names(&[&mesh_hb, &node_lease, &module_scrub]));
    assert_eq!(list_slots(&by_node).len(), total);
    let by_other = n.config_list(&filter(None, Some(&id_of(9)), None));
    assert_eq!(list_levels(&by_other), names(&[&mesh_hb, &other_timeout]));
    assert!(list_slots(&by_other).is_empty(), "nothing resolves for a node that is no member");

    // By key, short or predefined.
    for k in ["heartbeat_interval", HB] {
        let by_key = n.config_list(&filter(None, None, Some(k)));
        assert_eq!(list_levels(&by_key), names(&[&mesh_hb]), "{k}");
        assert_eq!(
            list_slots(&by_key),
            vec![(me.to_string(), "membership".to_string(), "heartbeat_interval".to_string())],
            "{k}"
        );
    }
    let predefined = n.config_list(&filter(None, None, Some(HB))).json()["predefined"].clone();
    assert_eq!(predefined.as_array().unwrap().len(), 1);
    assert_eq!(predefined[0]["key"], HB);

    // By module: the resolved values of that module only.
    let by_module = n.config_list(&filter(Some("storage"), None, None));
    let slots = list_slots(&by_module);
    assert!(!slots.is_empty() && slots.iter().all(|(_, m, _)| m == "storage"), "{slots:?}");
    assert!(list_levels(&by_module).contains(&module_scrub));
}

/// Narrowed to a module, the list shows that module's values, not mesh and node values of
/// another module's keys.
#[test]
fn config_list_by_module_leaves_out_other_modules_values() {
    let (n, me) = listed_node();
    let by_module = n.config_list(&filter(Some("membership"), None, None));
    let want: BTreeSet<String> =
        [format!("mesh.{HB}"), format!("node.{}.membership.heartbeat_timeout", id_of(9))].into();
    assert_eq!(list_levels(&by_module), want, "not node.{me}.meta.lease nor storage's own value");
}

#[test]
fn settings_do_not_reach_the_config_records() {
    let mut n = member(1);
    n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("5s")), "w", "admin").unwrap();
    n.setting_set(at(2_000), "ui.theme", Some(json!("dark"))).unwrap();
    for key in [format!("config/value/mesh.{HB}"), "config/anything".to_string(), "config/".to_string()] {
        refused(n.setting_set(at(3_000), &key, Some(json!(1))), 400, "reserved_key");
        refused(n.setting_set(at(3_000), &key, None), 400, "reserved_key");
        refused(n.setting_get(&key), 404, "unknown_setting");
    }
    let listed: Vec<String> = n.settings_list().json()["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, vec!["ui.theme".to_string()], "config records are not settings");
    // The config records are there all the same, and untouched.
    let key = format!("config/value/mesh.{HB}");
    assert!(n.meta().state().get(RecordKind::Setting, &key).is_some());
    assert_eq!(stored(&n, &lvl(HB, None, None)).unwrap().value, json!(5_000));
}

// ---- 7. trusted keys and proposals ----

fn trusted_setup() -> (Vec<Declaration>, Resolver) {
    let predefined = vec![
        Declaration { trusted: true, ..decl("vault.root_key", KeyType::String) },
        decl("plain.key", KeyType::String),
    ];
    let mut r = Resolver::new();
    r.set_build_manifests(
        "b1",
        vec![manifest(
            "vault",
            vec![Declaration {
                trusted: true,
                fallback: Some("vault.root_key".into()),
                ..decl("root_key", KeyType::String)
            }],
        )],
    );
    r.set_node(nid(N1), "b1", set_of(&["vault"]));
    r.resolve_all();
    (predefined, r)
}

#[test]
fn a_trusted_key_is_refused_to_a_direct_act_and_taken_through_a_proposal() {
    let (pre, r) = trusted_setup();
    for level in [mesh("vault.root_key"), node_level(N1, "vault.root_key"), module_level(N1, "vault", "root_key")] {
        for input in [Some(json!("abc")), None] {
            let e = config::judge(&pre, &r, &level, input.as_ref(), "rotate", true).unwrap_err();
            assert_eq!(e, ConfigError::Trusted(level.name()), "{}", level.name());
            assert_eq!((e.code(), e.kind()), ("trusted_key", ErrorKind::Forbidden));
            let ok = config::judge(&pre, &r, &level, input.as_ref(), "rotate", false);
            assert_eq!(ok, Ok(input.clone()), "a proposal of {} is judged as a set", level.name());
        }
    }
    assert_eq!(config::judge(&pre, &r, &mesh("plain.key"), Some(&json!("x")), "w", true), Ok(Some(json!("x"))));
    // The other rules still hold for a proposal.
    assert_eq!(
        config::judge(&pre, &r, &mesh("vault.root_key"), Some(&json!("x")), " ", false),
        Err(ConfigError::NoWhy)
    );
    assert!(matches!(
        config::judge(&pre, &r, &mesh("vault.nope"), Some(&json!("x")), "w", false),
        Err(ConfigError::Undeclared { .. })
    ));
}

fn open_proposal(id: &str, level: &str, value: Option<Value>) -> Proposal {
    Proposal {
        id: id.into(),
        level: level.into(),
        value,
        shown_against: None,
        by: "n/op".into(),
        why: "w".into(),
        at: 1_000,
        status: ProposalStatus::Open,
        answered_by: None,
        answered_at: None,
    }
}

#[test]
fn proposal_rules_in_the_pure_functions() {
    let open = vec![
        open_proposal("p1", "mesh.a", Some(json!(1))),
        open_proposal("p2", "mesh.b", Some(json!(2))),
        open_proposal("p3", "mesh.c", None),
    ];
    assert_eq!(OPEN_PROPOSALS_MAX, 3);
    assert!(matches!(config::admit_proposal(&open, "mesh.d", &Some(json!(1))), Err(ConfigError::Proposal(_))));
    assert!(matches!(config::admit_proposal(&open, "mesh.a", &Some(json!(1))), Err(ConfigError::Proposal(_))));
    assert!(matches!(config::admit_proposal(&open, "mesh.c", &None), Err(ConfigError::Proposal(_))));
    assert_eq!(config::admit_proposal(&open, "mesh.a", &Some(json!(9))), Ok(Some("p1".into())));
    assert_eq!(config::admit_proposal(&open[..2], "mesh.d", &None), Ok(None));

    let p = open_proposal("p1", "mesh.a", Some(json!(1)));
    assert_eq!(config::check_approve(&p, &p, None, 2_000), Ok(()));
    assert!(config::check_approve(&p, &p, Some(&json!(0)), 2_000).is_err(), "the stored value moved");
    let changed = Proposal { value: Some(json!(2)), ..p.clone() };
    assert!(config::check_approve(&changed, &p, None, 2_000).is_err(), "the proposal moved");
    assert!(config::check_approve(&p, &p, None, 1_000 + PROPOSAL_TTL_MS).is_err(), "expired");
    assert_eq!(config::check_approve(&p, &p, None, 1_000 + PROPOSAL_TTL_MS - 1), Ok(()));
    let declined = Proposal { status: ProposalStatus::Declined, ..p.clone() };
    assert!(config::check_approve(&declined, &declined, None, 2_000).is_err());
}

#[test]
fn proposals_open_replace_and_answer_on_the_node() {
    let mut n = member(1);
    let me = n.id().clone();
    let hb = lvl(HB, None, None);
    let timeout = lvl("membership.heartbeat_timeout", Some(&me), None);
    let lease = lvl("meta.lease", None, None);

    let p1 = propose(&mut n, at(1_000), &hb, Some(json!("5s")), "faster");
    assert_eq!(
        (p1.status, p1.value.clone(), p1.shown_against.clone()),
        (ProposalStatus::Open, Some(json!(5_000)), None)
    );
    assert_eq!(p1.level, format!("mesh.{HB}"));
    assert!(p1.by.contains(me.as_str()) && p1.by.ends_with("/op"), "{}", p1.by);
    assert_eq!(stored(&n, &hb), None, "a proposal sets nothing");

    // The same change twice (typed the same) is refused.
    refused(n.config_propose(at(1_500), &hb, Some(&json!("5000ms")), "again", "op"), 409, "proposal_refused");
    // Judged as a set would be.
    refused(n.config_propose(at(1_500), &hb, Some(&json!("fast")), "bad", "op"), 400, "bad_value");
    refused(n.config_propose(at(1_500), &hb, Some(&json!("6s")), "", "op"), 400, "no_why");
    refused(n.config_propose(at(1_500), &lvl("x.y", None, None), Some(&json!("1")), "w", "op"), 400, "undeclared_key");

    let p2 = propose(&mut n, at(2_000), &timeout, Some(json!("30s")), "slow links");
    let p3 = propose(&mut n, at(3_000), &lease, Some(json!("40s")), "longer lease");
    // A fourth open proposal is refused.
    refused(
        n.config_propose(at(4_000), &lvl("storage.scrub_rate", None, None), Some(&json!("1MiB")), "w", "op"),
        409,
        "proposal_refused",
    );
    // A newer proposal for the same level replaces the older, even at the cap.
    let p5 = propose(&mut n, at(5_000), &hb, Some(json!("6s")), "a bit slower");
    let listed = proposals(&n, at(5_000));
    let order: Vec<(&str, ProposalStatus)> = listed.iter().map(|p| (p.id.as_str(), p.status)).collect();
    assert_eq!(
        order,
        vec![
            (p5.id.as_str(), ProposalStatus::Open),
            (p3.id.as_str(), ProposalStatus::Open),
            (p2.id.as_str(), ProposalStatus::Open),
            (p1.id.as_str(), ProposalStatus::Replaced),
        ],
        "newest first"
    );
    assert_eq!(proposal(&n, at(5_000), &p1.id).answered_at, Some(at(5_000).0));

    // A replaced proposal cannot be approved.
    refused(n.config_answer(at(6_000), &p1.id, true, None, "boss"), 409, "proposal_refused");
    assert_eq!(stored(&n, &hb), None);

    // Approve: the value is set, with who approved it beside it, and recorded.
    let v = n.config_answer(at(7_000), &p5.id, true, Some((Some(json!(6_000)), None)), "boss").expect("approved");
    assert_eq!(v.json()["proposal"]["status"], "approved");
    let e = stored(&n, &hb).expect("set by the approve");
    assert_eq!(e.value, json!(6_000));
    let approved = e.approved.expect("approved beside the value");
    assert_eq!(
        (approved.by, approved.proposal.as_str(), approved.at),
        (format!("{me}/boss"), p5.id.as_str(), at(7_000).0)
    );
    assert_eq!(own(&n, "membership", "heartbeat_interval"), resolved(Some(6_000), Source::Mesh));
    let h = history(&n, &filter(None, None, Some(HB)));
    assert_eq!(h[0]["action"], "approve");
    assert_eq!((h[0]["value"].clone(), h[0]["previous"].clone()), (json!(6_000), Value::Null));
    assert!(h[0]["why"].as_str().unwrap().contains(&p5.id), "{}", h[0]);
    let p5_now = proposal(&n, at(7_000), &p5.id);
    assert_eq!((p5_now.status, p5_now.answered_by), (ProposalStatus::Approved, Some(format!("{me}/boss"))));
    // Answered, it cannot be answered again.
    refused(n.config_answer(at(7_500), &p5.id, true, None, "boss"), 409, "proposal_refused");
    refused(n.config_answer(at(7_500), &p5.id, false, None, "boss"), 409, "proposal_refused");

    // Decline sets nothing.
    let v = n.config_answer(at(8_000), &p3.id, false, None, "boss").expect("declined");
    assert_eq!(v.json()["status"], "declined");
    assert_eq!(stored(&n, &lease), None);
    assert_eq!(proposal(&n, at(8_000), &p3.id).status, ProposalStatus::Declined);
    refused(n.config_answer(at(8_500), &p3.id, true, None, "boss"), 409, "proposal_refused");
    assert_eq!(stored(&n, &lease), None);

    // The value stored at p2's level changes after it was proposed: its approve is refused.
    n.config_set(at(9_000), &timeout, Some(&json!("25s")), "by hand", "admin").unwrap();
    refused(n.config_answer(at(10_000), &p2.id, true, None, "boss"), 409, "proposal_refused");
    assert_eq!(stored(&n, &timeout).unwrap().value, json!(25_000), "nothing was set");
    assert_eq!(proposal(&n, at(10_000), &p2.id).status, ProposalStatus::Open);

    refused(n.config_answer(at(10_000), "no-such-proposal", true, None, "boss"), 404, "unknown_proposal");
    refused(n.config_proposal(at(10_000), "no-such-proposal"), 404, "unknown_proposal");
}

/// Proposals made within one millisecond are still listed newest first.
#[test]
fn proposals_within_one_millisecond_are_newest_first() {
    let mut n = member(1);
    let a = propose(&mut n, at(1_000), &lvl(HB, None, None), Some(json!("5s")), "a");
    let b = propose(&mut n, at(1_000), &lvl("meta.lease", None, None), Some(json!("40s")), "b");
    let c = propose(&mut n, at(1_000), &lvl("storage.scrub_rate", None, None), Some(json!("1MiB")), "c");
    let ids: Vec<String> = proposals(&n, at(1_000)).into_iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![c.id, b.id, a.id]);
}

/// An approve binds what the approver was shown: another value or another stored value than
/// the proposal's is refused and sets nothing.
#[test]
fn an_approve_of_what_was_not_shown_sets_nothing() {
    let mut n = member(1);
    let lease = lvl("meta.lease", None, None);
    n.config_set(at(500), &lease, Some(&json!("35s")), "before", "admin").unwrap();
    let p = propose(&mut n, at(1_000), &lease, Some(json!("50s")), "longer");
    assert_eq!(p.shown_against, Some(json!(35_000)), "kept with the value stored when proposed");
    for seen in [
        (Some(json!(60_000)), Some(json!(35_000))),
        (Some(json!(50_000)), None),
        (Some(json!(50_000)), Some(json!(30_000))),
        (None, Some(json!(35_000))),
    ] {
        refused(n.config_answer(at(2_000), &p.id, true, Some(seen.clone()), "boss"), 409, "proposal_refused");
        assert_eq!(stored(&n, &lease).unwrap().value, json!(35_000), "nothing set for {seen:?}");
        assert_eq!(proposal(&n, at(2_000), &p.id).status, ProposalStatus::Open);
    }
    n.config_answer(at(3_000), &p.id, true, Some((Some(json!(50_000)), Some(json!(35_000)))), "boss")
        .expect("approved");
    assert_eq!(stored(&n, &lease).unwrap().value, json!(50_000));
}

/// The value at the level changed on another node, and its record reached this one: the
/// approve is refused.
#[test]
fn an_approve_after_a_change_made_on_another_node_sets_nothing() {
    let mut a = member(1);
    let mut b = member(2);
    let hb = lvl(HB, None, None);
    let p = propose(&mut a, at(1_000), &hb, Some(json!("5s")), "faster");
    b.config_set(at(2_000), &hb, Some(&json!("8s")), "on b", "admin").unwrap();
    let key = format!("config/value/mesh.{HB}");
    let rec: Record = b.meta().state().get(RecordKind::Setting, &key).cloned().expect("b's record");
    a.submit_meta_record(at(3_000), rec).unwrap();
    assert_eq!(stored(&a, &hb).unwrap().value, json!(8_000), "merged");
    refused(a.config_answer(at(4_000), &p.id, true, None, "boss"), 409, "proposal_refused");
    assert_eq!(stored(&a, &hb).unwrap().value, json!(8_000), "nothing was set");
    assert_eq!(own(&a, "membership", "heartbeat_interval"), resolved(Some(8_000), Source::Mesh));
}

#[test]
fn an_expired_proposal_cannot_be_approved() {
    let mut n = member(1);
    let hb = lvl(HB, None, None);
    let p = propose(&mut n, at(1_000), &hb, Some(json!("5s")), "faster");
    let late = at(1_000 + 7 * DAY_MS + SECOND_MS);
    assert_eq!(proposal(&n, late, &p.id).status, ProposalStatus::Expired, "listed as expired");
    assert_eq!(proposals(&n, late)[0].status, ProposalStatus::Expired);
    refused(n.config_answer(late, &p.id, true, None, "boss"), 409, "proposal_refused");
    refused(n.config_answer(late, &p.id, false, None, "boss"), 409, "proposal_refused");
    assert_eq!(stored(&n, &hb), None);
    // Within the seven days it was approvable; an expired proposal no longer counts as open.
    assert_eq!(proposal(&n, at(1_000 + 7 * DAY_MS - 1), &p.id).status, ProposalStatus::Open);
    let again = propose(&mut n, late, &hb, Some(json!("5s")), "faster, again");
    n.config_answer(late.plus(1), &again.id, true, None, "boss").expect("approved");
    assert_eq!(stored(&n, &hb).unwrap().value, json!(5_000));
}

// ---- 8. applying resolved values to the running node ----

fn built_with_fast_heartbeats() -> NodeConfig {
    let mut c = NodeConfig::default();
    c.membership.heartbeat_interval_ms = 2_000;
    c
}

#[test]
fn apply_config_takes_set_values_and_leaves_defaults_as_built() {
    let mut n = member_with(1, built_with_fast_heartbeats());
    let own_now = n.config_resolved_own();
    assert_eq!(own_now["membership"]["heartbeat_interval"].source, Source::Default);
    assert!(n.apply_config(at(500), &own_now).is_empty(), "defaults change nothing");
    assert_eq!(n.config().membership.heartbeat_interval_ms, 2_000, "as built, not the default 15s");

    n.config_set(at(1_000), &lvl(HB, None, None), Some(&json!("5s")), "w", "admin").unwrap();
    let changed = n.apply_config(at(1_100), &n.config_resolved_own());
    assert_eq!(changed, vec!["membership.heartbeat_interval=5000".to_string()]);
    assert_eq!(n.config().membership.heartbeat_interval_ms, 5_000);
    assert_eq!(n.members().config().heartbeat_interval_ms, 5_000, "membership runs with it");
    assert!(n.apply_config(at(1_200), &n.config_resolved_own()).is_empty(), "nothing moves twice");
    // Other keys stay as built.
    assert_eq!(n.config().membership.heartbeat_timeout_ms, NodeConfig::default().membership.heartbeat_timeout_ms);
}

/// A value cleared falls back: the running node goes back to what it was built with.
#[test]
fn apply_config_after_a_clear_goes_back_to_the_built_value() {
    let mut n = member_with(1, built_with_fast_heartbeats());
    let l = lvl(HB, None, None);
    n.config_set(at(1_000), &l, Some(&json!("5s")), "w", "admin").unwrap();
    n.apply_config(at(1_100), &n.config_resolved_own());
    assert_eq!(n.config().membership.heartbeat_interval_ms, 5_000);
    n.config_set(at(2_000), &l, None, "undo", "admin").unwrap();
    let changed = n.apply_config(at(2_100), &n.config_resolved_own());
    assert_eq!(changed, vec!["membership.heartbeat_interval=2000".to_string()]);
    assert_eq!(n.config().membership.heartbeat_interval_ms, 2_000);
    assert_eq!(n.members().config().heartbeat_interval_ms, 2_000);
    assert_eq!(n.base_config().membership.heartbeat_interval_ms, 2_000, "the base stays");
}

// ---- renames and retiring (the leader's passes) ----

/// This build's manifests with `storage.rescan_every` renamed `rescan_interval` (trusted when
/// `trusted`) and `meta.keep_entries` dropped.
fn build_b(trusted: bool) -> Vec<Manifest> {
    let mut manifests = shoal_core::config::builtin::manifests();
    for m in manifests.iter_mut() {
        if m.module == "meta" {
            m.keys.retain(|d| d.name != "keep_entries");
        }
        for d in m.keys.iter_mut().filter(|d| m.module == "storage" && d.name == "rescan_every") {
            d.name = "rescan_interval".into();
            d.fallback = Some("storage.rescan_interval".into());
            d.renamed_from = Some("rescan_every".into());
            d.trusted = trusted;
        }
    }
    manifests
}

#[test]
fn a_rename_moves_the_value_once_with_its_provenance_and_says_renamed_once() {
    let mut n = member(1);
    n.config_set(at(1_000), &mesh("storage.rescan_every"), Some(&json!("45m")), "slow disks", "admin").unwrap();
    n.publish_build(at(1_001));
    n.set_build("0.2.0", build_b(false));
    n.publish_build(at(1_002));
    let did = n.config_rename_pass(at(2_000));
    assert!(did.iter().any(|d| d.starts_with("renamed")), "{did:?}");
    assert!(stored(&n, &mesh("storage.rescan_every")).is_none(), "the old name is cleared");
    let moved = stored(&n, &mesh("storage.rescan_interval")).expect("moved to the new name");
    assert_eq!(moved.value, json!(45 * 60_000));
    assert!(moved.why.contains("slow disks"), "provenance kept: {}", moved.why);
    assert_eq!(own(&n, "storage", "rescan_interval").source, Source::Mesh);
    // A second pass moves nothing and says nothing more.
    assert!(n.config_rename_pass(at(3_000)).iter().all(|d| !d.starts_with("renamed")));
    let events = n.config_events(at(3_000));
    assert_eq!(events.json()["events"].as_array().unwrap().len(), 1, "{events:?}");
    assert_eq!(events.json()["events"][0]["event"], "renamed");
}

#[test]
fn a_value_never_approved_does_not_move_onto_a_trusted_name() {
    let mut n = member(1);
    n.config_set(at(1_000), &mesh("storage.rescan_every"), Some(&json!("45m")), "slow disks", "admin").unwrap();
    n.publish_build(at(1_001));
    n.set_build("0.2.0", build_b(true));
    n.publish_build(at(1_002));
    let did = n.config_rename_pass(at(2_000));
    assert!(did.iter().any(|d| d.starts_with("rename-refused")), "{did:?}");
    assert!(stored(&n, &mesh("storage.rescan_interval")).is_none(), "nothing moved onto the trusted name");
    assert!(stored(&n, &mesh("storage.rescan_every")).is_some(), "the value stays where it was");
    // A finding once the condition held seven days, pending before.
    let early = n.config_findings(at(3_000));
    assert_eq!(early.json()["findings"].as_array().unwrap().len(), 0);
    assert!(early.json()["pending"].as_array().unwrap().iter().any(|f| f["kind"] == "rename-refused"), "{early:?}");
    let late = n.config_findings(at(2_000 + 7 * 86_400_000));
    assert!(late.json()["findings"].as_array().unwrap().iter().any(|f| f["kind"] == "rename-refused"), "{late:?}");
}

#[test]
fn a_value_no_build_reads_is_retiring_asked_once_and_removed_only_on_approval() {
    let mut n = member(1);
    n.config_set(at(1_000), &mesh("meta.keep_entries"), Some(&json!(20_000)), "longer log", "admin").unwrap();
    n.publish_build(at(1_001));
    // While a member's build reads it, it is not retiring.
    assert!(n.config_retire_pass(at(1_500)).is_empty());
    n.set_build("0.2.0", build_b(false));
    n.publish_build(at(1_600));
    let did = n.config_retire_pass(at(2_000));
    assert_eq!(did, vec!["retiring mesh.meta.keep_entries".to_string()]);
    assert!(n.config_retire_pass(at(2_500)).is_empty(), "asked once");
    let r = n.config_retiring();
    assert_eq!(
        (r.json()["retiring"][0]["asks"].as_u64(), r.json()["retiring"][0]["status"].as_str()),
        (Some(1), Some("asked"))
    );
    // The newest build drops a key that holds a value: it is withheld, with why.
    let list = n.config_list(&ConfigFilter::default());
    assert_eq!(list.json()["predefinedFrom"], "0.1.0");
    assert!(list.json()["withheld"][0]["why"].as_str().unwrap().contains("meta.keep_entries"));
    // Asked twice without an answer: a finding.
    n.config_retire(at(3_000), "mesh.meta.keep_entries", "ask", "admin").unwrap();
    let f = n.config_findings(at(3_001));
    assert!(f.json()["findings"].as_array().unwrap().iter().any(|x| x["kind"] == "retiring-unanswered"), "{f:?}");
    // Cancel keeps the value; approve removes it.
    n.config_retire(at(4_000), "mesh.meta.keep_entries", "cancel", "admin").unwrap();
    assert!(stored(&n, &mesh("meta.keep_entries")).is_some());
    refused(n.config_retire(at(4_500), "mesh.nothing", "approve", "admin"), 404, "not_retiring");
    let v = n.config_retire(at(5_000), "mesh.meta.keep_entries", "approve", "admin").unwrap();
    assert_eq!(v.json()["nodes"].as_array().unwrap().len(), 1);
    assert!(stored(&n, &mesh("meta.keep_entries")).is_none(), "removed on approval");
    assert_eq!(n.config_list(&ConfigFilter::default()).json()["predefinedFrom"], "0.2.0", "no longer withheld");
    let events = n.config_events(at(5_001));
    let events = events.json();
    let kinds: Vec<&str> = events["events"].as_array().unwrap().iter().filter_map(|e| e["event"].as_str()).collect();
    assert!(kinds.contains(&"retiring") && kinds.contains(&"retired"), "{kinds:?}");
}

/// Issue 12: the config pass is the core's. `handle_timeout` runs it every 5 s (announced by
/// `poll_timeout`) or at once after `config_kick`; when the resolution moved it is applied and
/// handed to the shell once as `Output::ConfigFiles`, and not again while nothing moves.
#[test]
fn the_config_pass_runs_from_the_nodes_own_timer_and_writes_files_only_when_values_move() {
    use shoal_core::node::{Event, Output};
    let mut n = member_with(1, built_with_fast_heartbeats());
    let outputs = |n: &mut Node| {
        let mut files = 0;
        let mut applied = Vec::new();
        while let Some(o) = n.poll_output() {
            match o {
                Output::ConfigFiles(own) => {
                    assert!(own.contains_key("membership"), "every module's values");
                    files += 1;
                }
                Output::Event(Event::ConfigApplied { changed }) => applied.extend(changed),
                _ => {}
            }
        }
        (files, applied)
    };
    n.handle_timeout(at(100));
    assert_eq!(outputs(&mut n).0, 1, "the first pass writes the files");
    assert!(n.poll_timeout().is_some_and(|t| t <= at(5_100)), "the next pass is announced");
    n.handle_timeout(at(5_200));
    assert_eq!(outputs(&mut n), (0, vec![]), "nothing moved: no files");

    n.config_set(at(6_000), &lvl(HB, None, None), Some(&json!("5s")), "w", "admin").unwrap();
    n.config_kick();
    assert!(n.poll_timeout().is_some_and(|t| t <= at(6_000)), "a kick makes the pass due at once");
    n.handle_timeout(at(6_001));
    let (files, applied) = outputs(&mut n);
    assert_eq!(files, 1);
    assert_eq!(applied, vec!["membership.heartbeat_interval=5000".to_string()]);
    assert_eq!(n.config().membership.heartbeat_interval_ms, 5_000);
}

/// A node that enters a cluster runs the config pass at once (its build is published then,
/// not up to 5 s later): a restart right after forming found the build record missing and
/// wrote it, so the records read back from disk differed (sim `a_crashed_and_restarted...`).
#[test]
fn entering_a_cluster_runs_the_config_pass_at_once() {
    let mut n = bare_node_with(1, built_with_fast_heartbeats());
    n.handle_timeout(at(0));
    drain(&mut n);
    n.create_cluster(at(100), "c").unwrap();
    assert!(n.poll_timeout().is_some_and(|t| t <= at(100)), "the pass is due at once");
    n.handle_timeout(at(101));
    let keys: Vec<String> = n.meta().state().of_kind(RecordKind::Setting).map(|r| r.key()).collect();
    assert!(keys.iter().any(|k| k.starts_with("config/build/")), "{keys:?}");
}

/// A rename's new name is where its value lives: never taken for a value no build reads.
#[test]
fn a_rename_target_is_known_at_every_level() {
    let r = config::Rename {
        module: "storage".into(),
        from: "rescan_every".into(),
        to: "rescan_interval".into(),
        trusted: false,
        predefined: true,
    };
    let node = NodeId::new("n1");
    let renames = [r];
    assert!(config::rename_target(&Level::Mesh { key: "storage.rescan_interval".into() }, &renames));
    assert!(config::rename_target(
        &Level::Node { node: node.clone(), key: "storage.rescan_interval".into() },
        &renames
    ));
    assert!(config::rename_target(
        &Level::Module { node: node.clone(), module: "storage".into(), key: "rescan_interval".into() },
        &renames
    ));
    assert!(!config::rename_target(&Level::Mesh { key: "storage.rescan_every".into() }, &renames));
    assert!(!config::rename_target(&Level::Mesh { key: "meta.keep_entries".into() }, &renames));
}
