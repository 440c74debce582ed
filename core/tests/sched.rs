//! Scheduling and events on a node (core/src/node/sched.rs, node/events.rs): the weights come
//! from the config plane key by key (a weight never written keeps its shipped value), changing
//! them is checked and recorded, placement is explained, and the drive's acts raise events that
//! fan out while `node.*` stays local.

mod common;

use serde_json::json;
use shoal_core::node::volumes::FolderFacts;
use shoal_core::node::Node;
use shoal_core::sched::Weights;
use shoal_core::time::Millis;

const T0: Millis = Millis(1_800_000_000_000);

fn lone_leader() -> Node {
    let mut n = common::node_one();
    n.create_cluster(T0, "c").expect("create the cluster");
    n.handle_timeout(T0);
    n
}

#[test]
fn weights_come_from_the_config_plane_key_by_key() {
    let mut n = lone_leader();
    assert_eq!(n.sched_weights(), Weights::default());
    let r = n.sched_set_weights(T0, &[("cpu".into(), 0.3), ("diversity".into(), 1.0)], false, "lab", "admin").unwrap();
    assert_eq!((r.weights.cpu, r.weights.diversity), (0.3, 1.0));
    assert_eq!(r.weights.locality, Weights::default().locality, "a weight never written keeps its shipped value");
    assert_eq!(r.changed, ["mesh.scheduling.weight.cpu", "mesh.scheduling.weight.diversity"]);
    let refused = |r: Result<_, shoal_core::node::ApiError>| r.map(|_| ()).unwrap_err().code;
    assert_eq!(refused(n.sched_set_weights(T0, &[("speed".into(), 0.3)], false, "x", "a")), "bad_weight");
    assert_eq!(refused(n.sched_set_weights(T0, &[("cpu".into(), 1.5)], false, "x", "a")), "bad_weight");
    assert_eq!(refused(n.sched_set_weights(T0, &[], false, "x", "a")), "bad_weight");
    assert_eq!(refused(n.sched_set_weights(T0, &[("cpu".into(), 0.5)], false, "", "a")), "no_why");
    let r = n.sched_set_weights(T0, &[], true, "back to shipped", "admin").unwrap();
    assert_eq!(r.weights, Weights::default());
    assert_eq!(r.changed.len(), 2, "only the weights that were set are cleared");
}

#[test]
fn placement_is_explained_node_by_node() {
    let mut n = lone_leader();
    let e = n.sched_explain_place(T0, 1 << 20, None).unwrap();
    assert_eq!((e.chosen.clone(), e.why_none.as_deref().map(|w| w.contains("node has no volume"))), (None, Some(true)));
    n.volume_add(T0, "/srv/n1", &FolderFacts::default(), "", 1 << 40, 1 << 39).unwrap();
    let e = n.sched_explain_place(T0, 1 << 20, None).unwrap();
    assert_eq!(e.chosen.as_ref(), Some(n.id()));
    assert_eq!(e.ranked[0].factors.locality, 1.0, "the writer's own node");
    let e = n.sched_explain_place(T0, 1 << 50, None).unwrap();
    assert!(e.why_none.unwrap().contains("no writable volume with room"), "too big for any volume");
}

#[test]
fn the_drives_acts_raise_events() {
    let mut n = lone_leader();
    let v = n.volume_add(T0, "/srv/n1", &FolderFacts::default(), "", 1 << 40, 1 << 39).unwrap();
    let me = n.id().clone();
    let sum = "a".repeat(64);
    n.file_publish(T0, "/docs/a.txt", 10, &sum, 0, &[(v.id.clone(), me.clone())]).unwrap();
    n.file_move(T0, "/docs/a.txt", "/docs/b.txt").unwrap();
    n.file_remove(T0, "/docs/b.txt", false).unwrap();
    let e = n.event_publish(T0, "app.done", json!({"ok": true})).unwrap();
    assert_eq!((e.kind.as_str(), &e.node), ("app.done", &me));
    let kinds: Vec<String> = n.events_since(0, "", 100).events.into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["file.created", "file.renamed", "file.removed", "app.done"]);
    let page = n.events_since(0, "file.*", 100);
    assert_eq!(page.events.len(), 3);
    let second = page.events[1].seq;
    assert_eq!(n.events_since(second, "file.*", 100).events.len(), 1, "resume after a sequence number");
    assert_eq!(n.event_publish(T0, "node.online", json!({})).unwrap_err().code, "bad_event_type");
}
