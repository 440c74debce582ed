//! The node's side of the cluster drive (core/src/node/files.rs): publishing, overwriting,
//! removing and moving files, what each node must do to its own disks, and who may delete a
//! copy. Every test drives real [`Node`]s in memory; time is only the `Millis` handed in.

use ed25519_dalek::SigningKey;
use shoal_core::hlc::Version;
use shoal_core::meta::records::{FileRecord, LocationState, Record, Volume};
use shoal_core::meta::state::MetaState;
use shoal_core::node::files::{DeleteRequest, DiskAction};
use shoal_core::node::volumes::FolderFacts;
use shoal_core::node::{ApiError, Node, NodeConfig, SelfInfo};
use shoal_core::records::Capabilities;
use shoal_core::storage::planner::TaskOutcome;
use shoal_core::time::{Millis, HOUR_MS, SECOND_MS};
use shoal_core::{FileId, NodeId, VolumeId};

mod common;
use common::{kind_of, Status};

const T0: Millis = Millis(1_800_000_000_000);

fn id_of(i: u8) -> NodeId {
    NodeId::new(format!("aaaaaaaa-aaaa-4aaa-8aaa-{:012x}", i))
}

/// A fresh node `i` (not in a cluster yet).
fn bare_node(i: u8) -> Node {
    let me = SelfInfo {
        name: format!("node-{i}"),
        advertise_url: format!("http://10.0.0.{i}:7000"),
        software_version: "0.1.0".into(),
        capabilities: Capabilities::default(),
        tls_pin: String::new(),
    };
    Node::new(id_of(i), SigningKey::from_bytes(&[i; 32]), 1000 + u64::from(i), NodeConfig::default(), me)
}

/// Node `i`, alone in a new cluster, with one volume of its own at `/srv/n{i}`.
fn member(i: u8) -> (Node, VolumeId) {
    let mut n = bare_node(i);
    n.create_cluster(T0, "c").expect("create the cluster");
    let v = n.volume_add(T0, &folder(i), &FolderFacts::default(), "", 1 << 40, 1 << 39).expect("add a volume");
    let vol = v.id.clone();
    assert_eq!(n.local_volumes(), vec![(vol.clone(), folder(i))], "the volume is the node's own");
    drain(&mut n);
    (n, vol)
}

/// Node `i` as above, holding the metadata lease; returns its term too.
fn leader(i: u8) -> (Node, VolumeId, u64) {
    let (mut n, vol) = member(i);
    n.handle_timeout(T0);
    drain(&mut n);
    let term = n.leader_term(T0).expect("a lone member takes the lease");
    (n, vol, term)
}

fn folder(i: u8) -> String {
    format!("/srv/n{i}")
}

fn drain(n: &mut Node) {
    while n.poll_output().is_some() {}
}

/// A SHA-256-shaped checksum made of one hex digit.
fn sum(c: char) -> String {
    c.to_string().repeat(64)
}

/// `ms` milliseconds after T0.
fn at(ms: u64) -> Millis {
    T0.plus(ms)
}

/// A volume of some other node (no record needed: only its id is listed in a copy).
fn far(k: u8) -> (VolumeId, NodeId) {
    (VolumeId::new(format!("far-volume-{k}")), NodeId::new(format!("bbbbbbbb-bbbb-4bbb-8bbb-{:012x}", k)))
}

/// One more volume of node `n`, at `dir`.
fn another_volume(n: &mut Node, dir: &str) -> VolumeId {
    let v = n.volume_add(at(100), dir, &FolderFacts::default(), "", 1 << 40, 1 << 39).expect("add a volume");
    drain(n);
    v.id.clone()
}

fn file(n: &Node, path: &str) -> FileRecord {
    n.meta().state().file(path).cloned().unwrap_or_else(|| panic!("a record at {path}"))
}

fn loc<'a>(f: &'a FileRecord, v: &VolumeId) -> &'a shoal_core::meta::records::Location {
    f.locations.iter().find(|l| &l.volume_id == v).unwrap_or_else(|| panic!("{} has a copy on {v}", f.path))
}

fn refused(r: Result<impl std::fmt::Debug, ApiError>, status: u16, code: &str) {
    match r {
        Err(e) => assert_eq!((e.kind, e.code), (kind_of(status), code), "{}", e.message),
        Ok(v) => panic!("expected {status} {code}, got {v:?}"),
    }
}

fn publish(n: &mut Node, wall: Millis, path: &str, c: char, copies: &[(VolumeId, NodeId)]) -> FileId {
    let v = n.file_publish(wall, path, 10, &sum(c), wall.0, copies).expect("publish");
    v.id
}

// ---- 1. publish and overwrite ----

/// A new path gets a live record with a fresh id and committed copies; an overwrite keeps the
/// id, replaces the copy on a volume it writes again and marks the older content elsewhere
/// stale with a newer version.
#[test]
fn an_overwrite_keeps_the_id_and_marks_older_copies_elsewhere_stale() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    let id = publish(&mut n, at(1_000), "/docs/a.txt", 'a', &[(va.clone(), me.clone()), (vb.clone(), nb.clone())]);
    let other = publish(&mut n, at(1_001), "/docs/b.txt", 'a', &[(va.clone(), me.clone())]);
    assert!(shoal_core::ids::is_uuid(id.as_str()), "a fresh id: {id}");
    assert_ne!(id, other, "every new path gets its own id");

    let first = file(&n, "/docs/a.txt");
    assert!(!first.removed && !first.is_dir);
    assert_eq!(first.id, id);
    assert_eq!(first.checksum, sum('a'));
    assert_eq!(first.primary, Some(va.clone()));
    assert_eq!(first.locations.len(), 2);
    for l in &first.locations {
        assert_eq!(l.state, LocationState::Committed);
        assert!(first.is_current(l));
    }

    let v = n.file_publish(at(2_000), "/docs/a.txt", 20, &sum('b'), 7, &[(va.clone(), me.clone())]).unwrap();
    assert_eq!(v.id, id, "the overwrite answers with the same id");
    let second = file(&n, "/docs/a.txt");
    assert_eq!(second.id, id, "an overwrite keeps the id");
    assert_eq!((second.size, second.checksum.as_str()), (20, sum('b').as_str()));
    assert!(second.version > first.version);
    assert_eq!(second.locations.len(), 2, "one copy per volume: {:?}", second.locations);

    let same = loc(&second, &va);
    assert_eq!(same.state, LocationState::Committed, "the copy on the written volume is replaced");
    assert_eq!(same.checksum, sum('b'));
    assert!(same.updated > loc(&first, &va).updated);
    assert!(second.is_current(same));

    let old = loc(&second, &vb);
    assert_eq!(old.state, LocationState::Stale, "the older content elsewhere is stale");
    assert_eq!((old.checksum.as_str(), &old.node_id), (sum('a').as_str(), &nb));
    assert!(old.updated > loc(&first, &vb).updated, "its version is newer than the committed one");
    assert!(!second.is_current(old));
}

/// Bytes may replace a file on a volume only when that file is no current copy of other
/// content, or the writer knew that content (a first write racing another write of the path
/// may not destroy the other's copy).
#[test]
fn a_current_copy_is_replaced_only_by_a_writer_who_knew_its_content() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    assert!(n.may_replace_copy("/docs/a.txt", &va, &sum('b'), None), "no record: nothing to protect");
    assert_eq!(n.file_put_target("/docs/a.txt").unwrap().replaces, None, "a first write replaces nothing");

    publish(&mut n, at(1_000), "/docs/a.txt", 'a', &[(va.clone(), me.clone()), (vb.clone(), nb.clone())]);
    assert_eq!(
        n.file_put_target("/docs/a.txt").unwrap().replaces,
        Some(sum('a')),
        "an overwrite knows what it replaces"
    );
    assert!(!n.may_replace_copy("/docs/a.txt", &va, &sum('b'), None), "a first write racing the path may not");
    assert!(!n.may_replace_copy("/docs/a.txt", &va, &sum('b'), Some(&sum('c'))), "nor one that knew other content");
    assert!(n.may_replace_copy("/docs/a.txt", &va, &sum('b'), Some(&sum('a'))), "an overwrite of what is there may");
    assert!(n.may_replace_copy("/docs/a.txt", &va, &sum('a'), None), "the same bytes again may");
    assert!(n.may_replace_copy("/docs/other.txt", &va, &sum('b'), None), "another path is not protected");

    // Once the copy on `va` is stale (the content moved on elsewhere), it may be repaired over.
    n.file_publish(at(2_000), "/docs/a.txt", 20, &sum('c'), 7, &[(vb.clone(), nb.clone())]).unwrap();
    assert_eq!(loc(&file(&n, "/docs/a.txt"), &va).state, LocationState::Stale);
    assert!(n.may_replace_copy("/docs/a.txt", &va, &sum('c'), None));
    assert!(n.may_replace_copy("/docs/a.txt", &va, &sum('d'), None), "stale bytes are not worth keeping");

    // A moved file's copy still waiting at its old path is that file's content: not replaced,
    // even by a write that knew it, until it is renamed (then its old path is free).
    publish(&mut n, at(3_000), "/m/old.txt", 'e', &[(va.clone(), me.clone())]);
    n.file_move(at(3_100), "/m/old.txt", "/m/new.txt").unwrap();
    assert!(!n.may_replace_copy("/m/old.txt", &va, &sum('f'), None), "the rename is still to come");
    assert!(!n.may_replace_copy("/m/old.txt", &va, &sum('f'), Some(&sum('e'))));
    assert!(n.may_replace_copy("/m/old.txt", &vb, &sum('f'), None), "another volume holds no such copy");
    n.copy_mark(at(3_200), "/m/old.txt", &va, LocationState::Dropped, "");
    assert!(n.may_replace_copy("/m/old.txt", &va, &sum('f'), None), "renamed: the old path is free");
}

// ---- 2. concurrent first writes ----

/// Two nodes each write a new path and publish; whichever order the records meet in, one
/// record wins (the newer), and the loser's copy does not count as current content.
#[test]
fn two_first_writes_of_one_path_end_as_one_record() {
    let (mut a, va) = member(1);
    let (mut b, vb) = member(2);
    let (ia, ib) = (a.id().clone(), b.id().clone());
    let ida = publish(&mut a, at(1_000), "/x.bin", 'a', &[(va.clone(), ia)]);
    let idb = publish(&mut b, at(2_000), "/x.bin", 'b', &[(vb.clone(), ib)]);
    assert_ne!(ida, idb, "each side made its own id");
    let ra = Record::File(file(&a, "/x.bin"));
    let rb = Record::File(file(&b, "/x.bin"));

    let mut ab = ra.clone();
    ab.merge(&rb);
    let mut ba = rb.clone();
    ba.merge(&ra);
    assert_eq!(ab, ba, "the merge does not depend on the order");
    let mut s1 = MetaState::new();
    s1.apply(&ra);
    s1.apply(&rb);
    let mut s2 = MetaState::new();
    s2.apply(&rb);
    s2.apply(&ra);
    assert_eq!(s1.file("/x.bin"), s2.file("/x.bin"));
    let Record::File(m) = ab else { unreachable!() };
    assert_eq!(s1.file("/x.bin"), Some(&m));

    assert_eq!((m.id.clone(), m.checksum.as_str()), (idb.clone(), sum('b').as_str()), "the newer write wins");
    assert_eq!(m.locations.len(), 2, "both copies are known");
    assert!(m.is_current(loc(&m, &vb)));
    let lost = loc(&m, &va);
    assert_eq!(lost.state, LocationState::Committed);
    assert!(!m.is_current(lost), "the loser's copy holds other content");

    // Each node takes the other's record in: both hold the winner, and neither counts the
    // loser's copy (on a's own volume) as holding the file.
    a.submit_meta_record(at(3_000), rb).unwrap();
    b.submit_meta_record(at(3_000), ra).unwrap();
    assert_eq!(file(&a, "/x.bin"), m);
    assert_eq!(file(&b, "/x.bin"), m);
    assert_eq!(a.file_put_target("/x.bin").unwrap().file_id, Some(idb.clone()));
    let facts = a.volume_facts(&va);
    let live = &facts.live["/x.bin"];
    assert_eq!(live.id, idb);
    assert!(!live.copy.expect("a's copy is listed").current, "a's copy is not current");
    assert!(a.scrub_queue(at(3_000), 0).is_empty(), "nothing current to scrub on a");
    assert!(b.volume_facts(&vb).live["/x.bin"].copy.expect("b's copy").current);
    let (_, sources) = b.file_sources("/x.bin", at(3_000)).unwrap();
    assert_eq!(sources.iter().map(|s| &s.volume_id).collect::<Vec<_>>(), vec![&vb], "only the winner's copy");
}

// ---- 3. put targets ----

#[test]
fn a_put_is_refused_on_folders_under_files_at_the_root_and_on_reserved_names() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/docs/a.txt", 'a', &[(va.clone(), me.clone())]);
    n.file_mkdir(at(1_001), "/empty").unwrap();

    refused(n.file_put_target("/docs"), 409, "is_a_folder");
    refused(n.file_put_target("/empty"), 409, "is_a_folder");
    refused(n.file_put_target("/docs/a.txt/inner"), 409, "not_a_folder");
    refused(n.file_put_target("/docs/a.txt/deeper/still"), 409, "not_a_folder");
    refused(n.file_put_target("/"), 400, "bad_path");
    refused(n.file_put_target("cluster:/"), 400, "bad_path");
    refused(n.file_put_target("/docs/a.txt.part-1234"), 400, "bad_path");
    refused(n.file_put_target("/up.part-9/x"), 400, "bad_path");
    // The publish itself goes through the same checks.
    refused(n.file_publish(at(1_002), "/docs", 1, &sum('c'), 0, &[(va.clone(), me.clone())]), 409, "is_a_folder");
    refused(n.file_publish(at(1_003), "/docs/a.txt/x", 1, &sum('c'), 0, &[(va, me)]), 409, "not_a_folder");
    assert!(n.meta().state().file("/docs").is_none() && n.meta().state().file("/docs/a.txt/x").is_none());

    let t = n.file_put_target("/docs/a.txt").unwrap();
    assert_eq!(t.file_id, Some(file(&n, "/docs/a.txt").id), "an overwrite keeps the id");
    assert_eq!(t.primary, file(&n, "/docs/a.txt").primary);
    assert_eq!(n.file_put_target("/docs/new.txt").unwrap().file_id, None);
}

#[test]
fn the_wanted_copies_of_a_put_follow_the_folder_policy() {
    let (mut n, _) = member(1);
    assert_eq!(n.file_put_target("/photos/2024/x.jpg").unwrap().wanted, 1, "the default");
    n.policy_set(at(1_000), "/photos", 3).unwrap();
    assert_eq!(n.file_put_target("/photos/2024/x.jpg").unwrap().wanted, 3);
    n.policy_set(at(1_001), "/photos/2024", 2).unwrap();
    assert_eq!(n.file_put_target("/photos/2024/x.jpg").unwrap().wanted, 2, "the nearest policy");
    assert_eq!(n.file_put_target("/photos/other.jpg").unwrap().wanted, 3);
    assert_eq!(n.file_put_target("/docs/y.txt").unwrap().wanted, 1);
}

// ---- 4. remove ----

#[test]
fn remove_leaves_tombstones_and_needs_recursive_for_a_non_empty_folder() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let c = [(va.clone(), me)];
    let a = publish(&mut n, at(1_000), "/a.txt", 'a', &c);
    publish(&mut n, at(1_001), "/d/x", 'a', &c);
    publish(&mut n, at(1_002), "/d/sub/y", 'a', &c);
    n.file_mkdir(at(1_003), "/d/empty").unwrap();
    publish(&mut n, at(1_004), "/dx", 'a', &c);

    let before = file(&n, "/a.txt");
    n.file_remove(at(2_000), "/a.txt", false).unwrap();
    let tomb = file(&n, "/a.txt");
    assert!(tomb.removed, "a file becomes a tombstone");
    assert!(tomb.version > before.version);
    assert_eq!(tomb.id, a);
    assert_eq!(tomb.locations, before.locations, "its copies stay listed for their holders to delete");
    assert_eq!(n.file_put_target("/a.txt").unwrap().file_id, None, "a re-create is a new file");

    refused(n.file_remove(at(2_001), "/d", false), 409, "folder_not_empty");
    for p in ["/d/x", "/d/sub/y", "/d/empty"] {
        assert!(!file(&n, p).removed, "{p} is untouched by the refused remove");
    }
    let r = n.file_remove(at(2_002), "/d", true).unwrap();
    assert_eq!(r.removed, 3);
    for p in ["/d/x", "/d/sub/y", "/d/empty"] {
        assert!(file(&n, p).removed, "{p} is a tombstone");
    }
    assert!(!file(&n, "/dx").removed, "a sibling sharing the prefix is not below the folder");

    refused(n.file_remove(at(2_003), "/", true), 400, "bad_path");
    refused(n.file_remove(at(2_004), "cluster:/", true), 400, "bad_path");
    assert!(!file(&n, "/dx").removed);
    refused(n.file_remove(at(2_005), "/d", true), 404, "not_found");

    // An empty folder goes without -r.
    n.file_mkdir(at(2_006), "/e").unwrap();
    n.file_remove(at(2_007), "/e", false).unwrap();
    assert!(file(&n, "/e").removed);
}

// ---- 5. move ----

#[test]
fn a_move_keeps_ids_and_copies_and_leaves_tombstones_behind() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    let a = publish(&mut n, at(1_000), "/src/a", 'a', &[(va.clone(), me.clone()), (vb.clone(), nb)]);
    let b = publish(&mut n, at(1_001), "/src/sub/b", 'b', &[(va.clone(), me.clone())]);
    let before_a = file(&n, "/src/a");
    let before_b = file(&n, "/src/sub/b");

    let r = n.file_move(at(2_000), "/src", "/dst").unwrap();
    assert_eq!(r.records, 2);
    assert_eq!(r.records, 2);
    let renamed: Vec<(&str, &str)> = r.files.iter().map(|f| (f.from.as_str(), f.to.as_str())).collect();
    assert_eq!(renamed, vec![("/src/a", "/dst/a"), ("/src/sub/b", "/dst/sub/b")], "the typed result names each rename");
    let copies: Vec<usize> = r.files.iter().map(|f| f.copies.len()).collect();
    assert_eq!(copies, vec![2, 1], "each file's copies on disk, to rename where they lie");
    for (old, new, id, before) in [("/src/a", "/dst/a", &a, &before_a), ("/src/sub/b", "/dst/sub/b", &b, &before_b)] {
        let moved = file(&n, new);
        assert!(!moved.removed, "{new} is live");
        assert_eq!(&moved.id, id, "{new} keeps its id");
        assert_eq!((moved.checksum.as_str(), moved.size), (before.checksum.as_str(), before.size));
        let shape = |f: &FileRecord| -> Vec<(VolumeId, NodeId, LocationState, String)> {
            f.locations.iter().map(|l| (l.volume_id.clone(), l.node_id.clone(), l.state, l.checksum.clone())).collect()
        };
        assert_eq!(shape(&moved), shape(before), "{new} keeps its copies");
        let tomb = file(&n, old);
        assert!(tomb.removed, "{old} is a tombstone");
        assert_eq!(&tomb.id, id);
    }
    // The old path takes no new file until its copies are renamed (else the rename is lost)...
    refused(n.file_put_target("/src/a").map(|_| serde_json::Value::Null), 409, "path_busy");
    for v in [&va, &vb] {
        n.copy_mark(at(2_500), "/src/a", v, LocationState::Dropped, "");
    }
    // ...and then is free, for a new file with a new id.
    assert_eq!(n.file_put_target("/src/a").unwrap().file_id, None);

    refused(n.file_move(at(3_000), "/dst", "/dst/inner"), 400, "bad_path");
    refused(n.file_move(at(3_001), "/dst", "/dst"), 400, "bad_path");
    assert!(n.meta().state().file("/dst/inner/a").is_none(), "nothing moved into itself");

    publish(&mut n, at(3_002), "/other", 'c', &[(va.clone(), me.clone())]);
    refused(n.file_move(at(3_003), "/dst/a", "/other"), 409, "exists");
    refused(n.file_move(at(3_004), "/other", "/dst/sub"), 409, "exists");
    refused(n.file_move(at(3_005), "/other", "/dst"), 409, "exists");
    assert!(!file(&n, "/dst/a").removed && !file(&n, "/other").removed, "a refused move changes nothing");
    assert_eq!(file(&n, "/other").checksum, sum('c'));

    refused(n.file_move(at(3_006), "/dst/a", "/"), 400, "bad_path");
    refused(n.file_move(at(3_007), "/", "/elsewhere"), 400, "bad_path");
    refused(n.file_move(at(3_008), "/nothing", "/elsewhere"), 404, "not_found");

    // A single file moves too, keeping its id.
    n.file_move(at(4_000), "/dst/a", "/renamed").unwrap();
    assert_eq!(file(&n, "/renamed").id, a);
    assert!(file(&n, "/dst/a").removed);
}

// ---- 6. disk actions ----

/// A volume record for `node` whose usage register was written by `usage_by`.
fn volume_record(n: &mut Node, wall: Millis, id: &VolumeId, node: &NodeId, usage_by: &NodeId, dir: &str) -> Volume {
    let version = n.next_version(wall);
    let usage_version = Version { node: usage_by.clone(), ..version.clone() };
    Volume {
        id: id.clone(),
        node_id: node.clone(),
        name: format!("local:{dir}"),
        fsh_uuid: "local".into(),
        subpath: dir.into(),
        read_only: false,
        evacuating: false,
        removed: false,
        version,
        capacity: 1 << 40,
        free: 1 << 39,
        low_space: false,
        usage_version,
    }
}

#[test]
fn a_node_deletes_and_renames_only_its_own_copies_as_its_records_say() {
    let (mut n, va, _) = leader(1);
    let me = n.id().clone();
    let dir = folder(1);
    // Another member's volume, known by record, and a record that names this node for a folder
    // it never measured (its usage written by someone else): neither is this node's to touch.
    let (vb, nb) = far(2);
    let rec = volume_record(&mut n, at(10), &vb, &nb, &nb, "/srv/theirs");
    n.submit_meta_record(at(10), Record::Volume(rec)).unwrap();
    let forged = VolumeId::new("forged-volume");
    let rec = volume_record(&mut n, at(11), &forged, &me, &nb, "/etc");
    n.submit_meta_record(at(11), Record::Volume(rec)).unwrap();
    assert_eq!(n.local_volumes(), vec![(va.clone(), dir.clone())]);
    // Nor does a record that also forges this node as the writer of its usage register, or
    // one that moves this node's own volume to another folder: only `volume add` here counts.
    let forged_too = VolumeId::new("forged-too");
    let rec = volume_record(&mut n, at(12), &forged_too, &me, &me, "/");
    n.submit_meta_record(at(12), Record::Volume(rec)).unwrap();
    assert_eq!(n.local_volumes(), vec![(va.clone(), dir.clone())]);
    assert!(n.local_volume(forged_too.as_str()).is_none());
    let moved = volume_record(&mut n, at(13), &va, &me, &me, "/root");
    n.submit_meta_record(at(13), Record::Volume(moved)).unwrap();
    assert!(n.local_volumes().is_empty(), "a moved folder is not this node's volume any more");
    let back = volume_record(&mut n, at(14), &va, &me, &me, &dir);
    n.submit_meta_record(at(14), Record::Volume(back)).unwrap();
    assert_eq!(n.local_volumes(), vec![(va.clone(), dir.clone())]);

    let copies = [(va.clone(), me.clone()), (vb.clone(), nb.clone()), (forged.clone(), me.clone())];
    publish(&mut n, at(1_000), "/gone.txt", 'a', &copies);
    publish(&mut n, at(1_001), "/old.txt", 'b', &copies);
    publish(&mut n, at(1_002), "/theirs.txt", 'c', &[(vb.clone(), nb.clone())]);
    assert_eq!(n.disk_actions(), vec![], "live records ask for nothing");

    n.file_remove(at(2_000), "/gone.txt", false).unwrap();
    n.file_remove(at(2_001), "/theirs.txt", false).unwrap();
    let delete = DiskAction::Delete { volume: va.clone(), folder: dir.clone(), path: "/gone.txt".into() };
    assert_eq!(n.disk_actions(), vec![delete], "only the copy on this node's own volume");
    assert!(n.copy_mark(at(2_100), "/gone.txt", &va, LocationState::Dropped, ""));
    assert_eq!(loc(&file(&n, "/gone.txt"), &va).state, LocationState::Dropped);
    assert_eq!(n.disk_actions(), vec![], "a dropped copy is done with");

    n.file_move(at(3_000), "/old.txt", "/new.txt").unwrap();
    let rename =
        DiskAction::Rename { volume: va.clone(), folder: dir.clone(), from: "/old.txt".into(), to: "/new.txt".into() };
    assert_eq!(n.disk_actions(), vec![rename], "a moved copy is renamed, never deleted");
    assert_eq!(n.authorize_rename(&va, "/old.txt", "/new.txt"), Ok(dir.clone()));
    refused(n.authorize_rename(&va, "/old.txt", "/gone.txt"), 409, "not_authorized");
    refused(n.authorize_rename(&vb, "/old.txt", "/new.txt"), 404, "unknown_volume");
    assert!(!n.rename_done(&va, "/old.txt", "/new.txt"), "not renamed yet");
    assert!(n.copy_mark(at(3_100), "/old.txt", &va, LocationState::Dropped, ""));
    assert!(n.rename_done(&va, "/old.txt", "/new.txt"), "renamed: a second ask is answered at once");
    assert!(!n.rename_done(&vb, "/old.txt", "/new.txt"));
    assert_eq!(n.disk_actions(), vec![]);
    assert!(!file(&n, "/new.txt").removed, "the moved file is untouched");
    assert!(file(&n, "/new.txt").is_current(loc(&file(&n, "/new.txt"), &va)));
}

/// A delete or rename found by `disk_actions` is carried out later (after the records are on
/// disk, after bytes landing there settle): asked again then, it must not take a put's new bytes
/// at that path, published since. Without the check, `rm /f` then `put /f` lost the new file on
/// this volume, and `mv /a /b` then `put /b` had the old bytes renamed over the new ones.
#[test]
fn a_delete_or_rename_found_earlier_leaves_a_newer_put_at_that_path_alone() {
    let (mut n, va, _) = leader(1);
    let me = n.id().clone();
    let dir = folder(1);
    let here = [(va.clone(), me.clone())];

    publish(&mut n, at(1_000), "/f", 'a', &here);
    n.file_remove(at(1_100), "/f", false).unwrap();
    let delete = DiskAction::Delete { volume: va.clone(), folder: dir.clone(), path: "/f".into() };
    assert_eq!(n.disk_actions(), vec![delete.clone()]);
    assert!(n.disk_action_holds(&delete), "nothing changed since");
    // A new put of /f lands on this volume and publishes before the delete runs.
    publish(&mut n, at(1_200), "/f", 'b', &here);
    assert!(!n.disk_action_holds(&delete), "the path holds a live file again");
    assert!(!n.removed_copy_dropped(at(1_300), "/f", &va), "the new record's copy is not marked dropped");
    let f = file(&n, "/f");
    assert!(f.is_current(loc(&f, &va)) && f.checksum == sum('b'));

    publish(&mut n, at(2_000), "/a", 'c', &here);
    n.file_move(at(2_100), "/a", "/b").unwrap();
    let rename = DiskAction::Rename { volume: va.clone(), folder: dir.clone(), from: "/a".into(), to: "/b".into() };
    assert_eq!(n.disk_actions(), vec![rename.clone()]);
    assert!(n.disk_action_holds(&rename));
    assert_eq!(n.authorize_rename(&va, "/a", "/b"), Ok(dir.clone()));
    // A put over /b (same file id: an overwrite) lands new bytes there before the rename runs.
    publish(&mut n, at(2_200), "/b", 'd', &here);
    assert!(!n.disk_action_holds(&rename), "the copy at /b is other content now");
    refused(n.authorize_rename(&va, "/a", "/b"), 409, "not_authorized");
    let delete_a = DiskAction::Delete { volume: va.clone(), folder: dir.clone(), path: "/a".into() };
    assert_eq!(n.disk_actions(), vec![delete_a.clone()], "the old bytes just go");
    assert!(n.disk_action_holds(&delete_a));
    assert!(n.removed_copy_dropped(at(2_300), "/a", &va));
    assert!(!n.disk_action_holds(&delete_a), "done with");
}

#[test]
fn a_rescan_before_a_moves_rename_takes_the_bytes_at_the_old_path_for_the_copy() {
    use shoal_core::node::rescan::Found;
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/old.txt", 'b', &[(va.clone(), me.clone())]);
    n.file_move(at(3_000), "/old.txt", "/new.txt").unwrap();
    let at_old = [Found { path: "/old.txt".into(), size: 10, mtime_ms: 900 }];
    let facts = n.volume_facts(&va);
    assert_eq!(facts.arriving.get("/new.txt"), Some(&vec!["/old.txt".to_string()]));
    let plan = facts.rescan_plan(&at_old);
    assert!(plan.vanished.is_empty(), "the rename has not run yet: {plan:?}");
    assert!(plan.checks.is_empty(), "the old path is left to the rename: {plan:?}");
    // Found at neither path, the copy did vanish.
    assert_eq!(facts.rescan_plan(&[]).vanished, vec![("/new.txt".into(), sum('b'))]);
    // Once renamed (the old copy dropped), nothing is on its way any more.
    assert!(n.copy_mark(at(3_100), "/old.txt", &va, LocationState::Dropped, ""));
    assert!(n.volume_facts(&va).arriving.is_empty());
}

/// A chain of moves (a → b → c) before this node's rename ran leaves two old paths with the
/// same file's copy to go; the bytes still lie at the first. The rescan finds them there and
/// leaves the copy at `/c` current (a map keeping one old path per new one kept `/b`, found
/// nowhere, and marked the copy stale: the file unreadable until the next repair).
#[test]
fn a_rescan_after_a_chain_of_moves_finds_the_copy_at_the_first_old_path() {
    use shoal_core::node::rescan::Found;
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/a", 'b', &[(va.clone(), me.clone())]);
    n.file_move(at(2_000), "/a", "/b").unwrap();
    n.file_move(at(3_000), "/b", "/c").unwrap();
    let facts = n.volume_facts(&va);
    let from = facts.arriving.get("/c").cloned().unwrap_or_default();
    assert!(from.contains(&"/a".to_string()) && from.contains(&"/b".to_string()), "{from:?}");
    let at_a = [Found { path: "/a".into(), size: 10, mtime_ms: 900 }];
    let plan = facts.rescan_plan(&at_a);
    assert!(plan.vanished.is_empty(), "the bytes are at the first old path: {plan:?}");
    let at_b = [Found { path: "/b".into(), size: 10, mtime_ms: 900 }];
    assert!(facts.rescan_plan(&at_b).vanished.is_empty());
    assert_eq!(facts.rescan_plan(&[]).vanished, vec![("/c".into(), sum('b'))]);
}

/// The rescan's `markedStale` counts the copies it did mark: a vanished path whose file was
/// overwritten since the walk (another checksum) is left alone and not counted.
#[test]
fn a_rescan_counts_only_the_copies_it_did_mark_stale() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/x", 'b', &[(va.clone(), me.clone())]);
    assert_eq!(n.rescan_vanished(at(2_000), &va, &[("/x".into(), sum('z'))]), 0);
    assert_ne!(file(&n, "/x").locations[0].state, LocationState::Stale);
    assert_eq!(n.rescan_vanished(at(2_100), &va, &[("/x".into(), sum('b'))]), 1);
    assert_eq!(file(&n, "/x").locations[0].state, LocationState::Stale);
}

// ---- 7. authorize_delete ----

fn del(volume: &VolumeId, path: &str, term: Option<u64>) -> DeleteRequest {
    DeleteRequest { volume_id: volume.clone(), path: path.into(), term }
}

#[test]
fn a_users_delete_needs_a_tombstone_that_is_not_a_move() {
    let (mut n, va, _) = leader(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    let sender = nb.clone();
    let dir = folder(1);
    publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone()), (vb.clone(), nb.clone())]);

    refused(n.authorize_delete(at(1_100), &sender, &del(&va, "/f", None)), 409, "not_authorized");
    refused(n.authorize_delete(at(1_100), &sender, &del(&va, "/nothing", None)), 409, "not_authorized");
    n.file_remove(at(1_200), "/f", false).unwrap();
    assert_eq!(n.authorize_delete(at(1_300), &sender, &del(&va, "/f", None)), Ok(dir.clone()));
    refused(n.authorize_delete(at(1_300), &sender, &del(&vb, "/f", None)), 404, "unknown_volume");

    publish(&mut n, at(2_000), "/m", 'b', &[(va.clone(), me.clone())]);
    n.file_move(at(2_100), "/m", "/m2").unwrap();
    assert!(file(&n, "/m").removed);
    refused(n.authorize_delete(at(2_200), &sender, &del(&va, "/m", None)), 409, "not_authorized");
    assert!(!file(&n, "/m2").removed);
}

#[test]
fn a_drop_task_needs_the_leader_of_its_term_and_enough_other_current_copies() {
    let (mut n, va, term) = leader(1);
    let me = n.id().clone();
    // The other copy is on a second volume of this node (counted as one node: this one);
    // copies on nodes that are not reachable members (here: a node it has never heard of)
    // never count toward a drop. How copies on other members count is in `tests/node.rs`.
    let vb = another_volume(&mut n, "/srv/n1-b");
    let (far_vol, nb) = far(2);
    publish(&mut n, at(900), "/far", 'a', &[(va.clone(), me.clone()), (far_vol, nb.clone())]);
    refused(n.check_drop(at(950), &file(&n, "/far"), &va), 409, "not_authorized");
    let dir = folder(1);
    let two = [(va.clone(), me.clone()), (vb.clone(), me.clone())];
    publish(&mut n, at(1_000), "/d", 'a', &two);
    assert_eq!(n.meta_leader(at(1_000)).map(|l| l.holder), Some(me.clone()));

    assert_eq!(n.authorize_delete(at(1_100), &me, &del(&va, "/d", Some(term))), Ok(dir.clone()));
    refused(n.authorize_delete(at(1_100), &nb, &del(&va, "/d", Some(term))), 409, "not_authorized");
    refused(n.authorize_delete(at(1_100), &me, &del(&va, "/d", Some(term + 1))), 409, "not_authorized");
    refused(n.authorize_delete(at(1_100), &me, &del(&va, "/d", Some(term - 1))), 409, "not_authorized");

    // Wanted 2: the other copy is on one node only, the copy stays.
    n.policy_set(at(1_400), "/", 2).unwrap();
    refused(n.authorize_delete(at(1_500), &me, &del(&va, "/d", Some(term))), 409, "not_authorized");
    refused(n.check_drop(at(1_500), &file(&n, "/d"), &va), 409, "not_authorized");
    n.policy_set(at(1_600), "/", 1).unwrap();

    // Other copies of older content do not count.
    publish(&mut n, at(2_000), "/s", 'a', &two);
    n.file_publish(at(2_100), "/s", 10, &sum('b'), 0, &[(va.clone(), me.clone())]).unwrap();
    refused(n.authorize_delete(at(2_200), &me, &del(&va, "/s", Some(term))), 409, "not_authorized");
    n.file_publish(at(2_300), "/s", 10, &sum('b'), 0, &two).unwrap();
    assert_eq!(n.authorize_delete(at(2_400), &me, &del(&va, "/s", Some(term))), Ok(dir.clone()));

    // A tombstone is no drop task's business.
    n.file_remove(at(2_500), "/s", false).unwrap();
    refused(n.authorize_delete(at(2_600), &me, &del(&va, "/s", Some(term))), 409, "not_authorized");

    // Once the lease has lapsed (no renewal for longer than its 30 s), no term warrants a drop.
    refused(n.authorize_delete(at(120 * SECOND_MS), &me, &del(&va, "/d", Some(term))), 409, "not_authorized");
}

/// A volume is not removed while it holds the only readable current copy of a file: a copy of
/// older content elsewhere, or a copy on a node that is not a reachable member, does not count.
#[test]
fn a_volume_holding_the_only_readable_current_copy_is_not_removed() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let vb = another_volume(&mut n, "/srv/n1-b");
    // Both volumes hold the file; then an overwrite lands on `va` only: `vb` holds older content.
    publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone()), (vb.clone(), me.clone())]);
    n.file_publish(at(1_100), "/f", 10, &sum('b'), 0, &[(va.clone(), me.clone())]).unwrap();
    assert_eq!(n.files_only_on(at(1_200), &va), vec!["/f".to_string()]);
    refused(n.volume_remove(at(1_200), va.as_str()), 409, "volume_holds_only_copy");
    // A copy on a node this one has never heard from does not count either.
    let (vf, nf) = far(5);
    publish(&mut n, at(2_000), "/g", 'c', &[(vb.clone(), me.clone()), (vf, nf)]);
    assert_eq!(n.files_only_on(at(2_100), &vb), vec!["/g".to_string()]);
    let status = n.volume_evacuation_status(at(2_100), vb.as_str()).unwrap();
    assert_eq!((status.copies_left, status.only_copies_left), (1, 1), "{status:?}");
    refused(n.volume_remove(at(2_100), vb.as_str()), 409, "volume_holds_only_copy");
    // Once /g has a current copy on `va` as well, `vb` (older /f, /g) may go.
    n.file_publish(at(2_200), "/g", 10, &sum('c'), 0, &[(va.clone(), me.clone()), (vb.clone(), me.clone())]).unwrap();
    assert!(n.files_only_on(at(2_300), &vb).is_empty());
    n.volume_remove(at(2_300), vb.as_str()).expect("nothing lives only on vb");
}

/// A node holds at most one current copy of a file: the same file found in a second of its
/// volume folders (a rescan) is not added, so N copies always mean N nodes.
#[test]
fn a_second_copy_on_the_same_node_is_not_counted() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let vb = another_volume(&mut n, "/srv/n1-b");
    let id = publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone())]);
    assert!(!n.copy_publish(at(1_100), "/f", &id, &sum('a'), &vb), "a second copy on this node");
    assert_eq!(file(&n, "/f").locations.len(), 1);
    // Once the first copy is stale, the other volume may hold the current one.
    assert!(n.copy_mark(at(1_200), "/f", &va, LocationState::Stale, &sum('a')));
    assert!(n.copy_publish(at(1_300), "/f", &id, &sum('a'), &vb));
}

/// An evacuating volume is done once no live file holds a current copy on it; a retired
/// volume takes no copy any more, from a put's publish or a pull's, since a copy recorded there
/// would be forgotten.
#[test]
fn an_evacuated_volume_is_done_when_empty_and_a_retired_one_takes_no_copy() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let vb = another_volume(&mut n, "/srv/n1-b");
    let id = publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone())]);
    n.volume_evacuate(at(1_100), va.as_str(), true).unwrap();
    assert!(n.evacuated_volumes().is_empty(), "it still holds /f");
    assert_eq!(n.volume_retire(at(1_150), &va), Ok(false));
    // A stale copy of /f's present content, with no current copy elsewhere: a rescan may yet
    // restore it, so the volume is still needed.
    assert!(n.copy_mark(at(1_160), "/f", &va, LocationState::Stale, &sum('a')));
    assert!(n.evacuated_volumes().is_empty(), "its stale copy of /f is the only one");
    n.file_publish(at(1_200), "/f", 10, &sum('a'), 0, &[(vb.clone(), me.clone())]).unwrap();
    assert_eq!(n.evacuated_volumes(), vec![va.clone()], "a current copy is elsewhere now");
    // An admin's cancel between the candidate list and the retirement is honoured.
    n.volume_evacuate(at(1_250), va.as_str(), false).unwrap();
    assert_eq!(n.volume_retire(at(1_260), &va), Ok(false));
    n.volume_evacuate(at(1_270), va.as_str(), true).unwrap();
    assert_eq!(n.volume_retire(at(1_400), &va), Ok(true));
    // A retired volume takes no copy: left out of a publish, which fails only if nothing is left.
    refused(n.file_publish(at(1_500), "/g", 10, &sum('b'), 0, &[(va.clone(), me.clone())]), 503, "volume_removed");
    let v = n.file_publish(at(1_550), "/h", 10, &sum('c'), 0, &[(va.clone(), me.clone()), (vb.clone(), me.clone())]);
    assert_eq!(v.unwrap().copies, 1);
    assert!(file(&n, "/h").locations.iter().all(|l| l.volume_id == vb));
    assert!(!n.copy_publish(at(1_600), "/f", &id, &sum('a'), &va));
}

/// A copy not checked for more than 14 days is reported overdue (the scrub's promise broken);
/// a scrub's verified mark makes it current again, and copies on other nodes are not counted.
#[test]
fn copies_unchecked_for_more_than_14_days_are_reported_overdue() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let (vf, nf) = far(3);
    publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone()), (vf, nf)]);
    let day = 24 * HOUR_MS;
    assert_eq!(n.scrub_overdue(at(1_000 + 14 * day)), 0);
    assert_eq!(n.scrub_overdue(at(2_000 + 14 * day)), 1, "only this node's copy counts");
    assert!(n.copy_mark(at(2_000 + 14 * day), "/f", &va, LocationState::Verified, &sum('a')));
    assert_eq!(n.scrub_overdue(at(3_000 + 14 * day)), 0);
}

/// A rescan never brings back a path that was moved away or removed with bytes older than
/// that removal (a node that missed the move keeps the old path's bytes on its disk, found by
/// its rescan after a restart: the chaos test saw an acknowledged move undone that way);
/// bytes written there after the removal are a new file and are adopted.
#[test]
fn a_rescan_does_not_adopt_bytes_older_than_the_removal_of_their_path() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone())]);
    n.file_move(at(2_000), "/f", "/g").unwrap();
    publish(&mut n, at(2_100), "/h", 'c', &[(va.clone(), me.clone())]);
    n.file_remove(at(2_200), "/h", false).unwrap();
    refused(n.copy_adopt(at(3_000), "/f", &va, 10, &sum('a'), at(1_000).0), 409, "removed_since");
    refused(n.copy_adopt(at(3_000), "/h", &va, 10, &sum('c'), at(2_100).0), 409, "removed_since");
    assert!(file(&n, "/f").removed && file(&n, "/h").removed, "both stay removed");
    // Written after the removal: a new file.
    n.copy_adopt(at(4_000), "/h", &va, 10, &sum('b'), at(3_500).0).expect("adopted");
    assert!(!file(&n, "/h").removed);
    assert_eq!(file(&n, "/h").checksum, sum('b'));
}

/// `meta/file?path=` says whether this node's records hold a live file there (a rescan asks
/// the leader before it adopts bytes it found with no record).
#[test]
fn the_leader_says_whether_a_path_holds_a_live_file() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/a b/f", 'a', &[(va.clone(), me.clone())]);
    let r = n.answer_file_exists("/cluster/acn/meta/file?path=/a%20b/f");
    assert_eq!((r.status(), r.body["live"].clone()), (200, serde_json::json!(true)), "{:?}", r.body);
    let r = n.answer_file_exists("/cluster/acn/meta/file?path=/a%20b/g");
    assert_eq!(r.body["live"], serde_json::json!(false));
    n.file_remove(at(2_000), "/a b/f", false).unwrap();
    let r = n.answer_file_exists("/cluster/acn/meta/file?path=/a%20b/f");
    assert_eq!(r.body["live"], serde_json::json!(false), "a removed file is not live");
    assert_eq!(n.answer_file_exists("/cluster/acn/meta/file?path=/a/%00").status(), 400);
}

/// With the found bytes' mtime, the leader also says whether they may be adopted: not when a
/// file is live there, nor when the path was removed (or moved away) after they were written.
/// A node whose own records never held the file (it died before its record was written
/// behind) asked only "live?", and a tombstone answered "no": its rescan brought an
/// acknowledged move back (the chaos test).
#[test]
fn the_leader_says_whether_bytes_found_at_a_path_may_be_adopted() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let adoptable = |n: &shoal_core::node::Node, q: &str| {
        let r = n.answer_file_exists(&format!("/cluster/acn/meta/file?{q}"));
        assert_eq!(r.status(), 200, "{:?}", r.body);
        r.body["adoptable"].clone()
    };
    assert_eq!(adoptable(&n, "path=/f&mtime=500"), serde_json::json!(true), "nothing there");
    publish(&mut n, at(1_000), "/f", 'a', &[(va.clone(), me.clone())]);
    assert_eq!(adoptable(&n, "path=/f&mtime=500"), serde_json::json!(false), "a live file");
    n.file_move(at(2_000), "/f", "/g").unwrap();
    assert_eq!(adoptable(&n, &format!("path=/f&mtime={}", at(1_000).0)), serde_json::json!(false), "moved away since");
    assert_eq!(adoptable(&n, &format!("path=/f&mtime={}", at(3_000).0)), serde_json::json!(true), "written after");
    assert_eq!(adoptable(&n, "path=/f"), serde_json::Value::Null, "asked without mtime: live only");
    assert_eq!(n.answer_file_exists("/cluster/acn/meta/file?path=/f&mtime=soon").status(), 400);
}

/// Bytes a write landed on a volume moments ago are that write's copy, its record on the way:
/// a rescan that finds them before the record does not adopt them as a new file (the chaos
/// test saw a put's copy adopted 0.14 s after it landed, a record with another id over the
/// acknowledged put's). Once their record is overdue, they are adopted like any found file.
#[test]
fn a_rescan_does_not_adopt_bytes_that_landed_moments_ago() {
    let (mut n, va) = member(1);
    n.landed_note(at(1_000), &va, "/p", &sum('a'));
    refused(n.copy_adopt(at(1_200), "/p", &va, 10, &sum('a'), at(1_000).0), 409, "landed");
    assert!(n.meta().state().file("/p").is_none(), "no record made");
    let later = at(1_000 + shoal_core::storage::landed::LANDED_MAX_MS + 1);
    n.copy_adopt(later, "/p", &va, 10, &sum('a'), at(1_000).0).expect("adopted once the record is overdue");
    assert_eq!(file(&n, "/p").checksum, sum('a'));
}

/// The landed registry is in memory: after a restart, bytes found that were modified before
/// the start and less than `LANDED_MAX_MS` ago may be the last run's landing, their record on
/// its way. The shell hashes and notes them; from then on they are judged like bytes landed in
/// this run, aged from their mtime: not adopted as a new file until their record is overdue.
#[test]
fn bytes_found_from_before_a_start_are_noted_once_and_not_adopted_until_overdue() {
    use shoal_core::storage::landed::LANDED_MAX_MS;
    let (mut n, va) = member(1);
    // On the file system's clock: the process started at 5,000 s; it is 10 s later.
    let (started, file_now) = (shoal_core::Millis(5_000_000), shoal_core::Millis(5_010_000));
    let mtime = 4_990_000; // 20 s before now, 10 s before the start
    assert!(n.landed_unknown(&va, "/p", mtime, started, file_now), "before the start, within the window");
    assert!(!n.landed_unknown(&va, "/p", 5_000_001, started, file_now), "this run's landings are noted as they land");
    assert!(!n.landed_unknown(&va, "/p", 1_000, started, file_now), "older than the window: settled anyway");
    n.landed_found(at(1_000), &va, "/p", &sum('a'), mtime, file_now);
    assert!(!n.landed_unknown(&va, "/p", mtime, started, file_now), "hashed once: noted");
    refused(n.copy_adopt(at(1_200), "/p", &va, 10, &sum('a'), mtime), 409, "landed");
    assert!(n.meta().state().file("/p").is_none(), "no record made");
    // Aged from their mtime (20 s before they were found), not from the finding.
    let overdue = at(1_000 + LANDED_MAX_MS - 20_000 + 1);
    n.copy_adopt(overdue, "/p", &va, 10, &sum('a'), mtime).expect("adopted once the record is overdue");
    // Found once per start: aged out on this node's clock, they are not noted again even when
    // the file system's clock lags (it still says 10 s after the start), so nothing waits on
    // them for ever.
    let (mut n, va) = member(2);
    n.landed_found(at(1_000), &va, "/q", &sum('a'), mtime, file_now);
    assert!(n.landed_unsettled(at(1_000 + LANDED_MAX_MS - 20_000), &va, "/q"));
    assert!(!n.landed_unsettled(at(1_000 + LANDED_MAX_MS), &va, "/q"), "aged out");
    assert!(!n.landed_unknown(&va, "/q", mtime, started, file_now), "not found again");
}

// ---- 8. replication backoff ----

#[test]
fn replication_failures_back_off_in_the_replicated_record_and_a_success_clears_it() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let id = publish(&mut n, at(1_000), "/r", 'a', &[(va.clone(), me.clone())]);
    assert!(n.repl_backoffs().is_empty());

    let delays = [30, 60, 120, 240, 3_600, 3_600].map(|s| s * SECOND_MS);
    for (i, delay) in delays.into_iter().enumerate() {
        let wall = at(10_000 * (i as u64 + 1));
        n.repl_outcome(wall, "/r", TaskOutcome::Failed);
        let b = n.repl_backoffs().remove(&id).expect("a backoff for the file");
        assert_eq!((b.attempts, b.next_at_ms), (i as u32 + 1, wall.0 + delay), "failure {}", i + 1);
        let r = file(&n, "/r").repl.expect("kept in the record");
        assert_eq!((r.attempts, r.next_at_ms), (b.attempts, b.next_at_ms));
    }
    assert_eq!(delays[4], HOUR_MS);
    // The plan `repl plan` shows is the one the leader would make: the file waits out its backoff.
    n.policy_set(at(60_001), "/", 2).unwrap();
    let shown = n.replication_plan(at(60_002), &[]);
    assert_eq!(shown.plan.stats.waiting_backoff, 1, "{shown:?}");
    assert_eq!(shown.plan.tasks.len(), 0, "{shown:?}");

    // An overwrite of the metadata does not reset it: it is a register of its own.
    n.file_publish(at(100_000), "/r", 30, &sum('b'), 0, &[(va.clone(), me.clone())]).unwrap();
    let f = file(&n, "/r");
    assert_eq!(f.checksum, sum('b'));
    assert_eq!(f.repl.as_ref().map(|r| r.attempts), Some(6));
    assert_eq!(n.repl_backoffs().get(&id).map(|b| b.attempts), Some(6));

    // It travels with the record: another node (a new leader) that takes the record in sees
    // it, and so does a merge that brings the user's overwrite after the leader's write.
    let (mut other, _) = member(2);
    other.submit_meta_record(at(100_001), Record::File(f.clone())).unwrap();
    assert_eq!(other.repl_backoffs().get(&id).map(|b| b.attempts), Some(6));
    let mut older = f.clone();
    older.repl = None;
    let mut merged = Record::File(older);
    merged.merge(&Record::File(f.clone()));
    assert_eq!(merged, Record::File(f.clone()));

    n.repl_outcome(at(200_000), "/r", TaskOutcome::Succeeded);
    assert!(n.repl_backoffs().is_empty(), "a success clears the backoff");
    let cleared = file(&n, "/r").repl.expect("a cleared register");
    assert_eq!(cleared.attempts, 0);
    n.repl_outcome(at(200_100), "/r", TaskOutcome::Succeeded);
    assert_eq!(file(&n, "/r").repl.map(|r| r.version), Some(cleared.version), "nothing to clear twice");

    // A failure starts over from one.
    n.repl_outcome(at(300_000), "/r", TaskOutcome::Failed);
    assert_eq!(n.repl_backoffs().get(&id).map(|b| (b.attempts, b.next_at_ms)), Some((1, at(300_000).0 + 30_000)));
}

/// A target that refuses a pull because another write's bytes are unsettled at that path is
/// busy for up to ten minutes: five such refusals counted as failures would send the file into
/// the hour-long wait (the simulator's `--overwrites` seed 3007 lost its third copy that way).
#[test]
fn a_deferred_task_waits_one_base_delay_and_counts_no_failure() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let id = publish(&mut n, at(1_000), "/r", 'a', &[(va.clone(), me.clone())]);
    for i in 0..12u64 {
        let wall = at(10_000 + i * 40_000);
        n.repl_outcome(wall, "/r", TaskOutcome::Deferred);
        let b = n.repl_backoffs().remove(&id).expect("the file waits");
        assert_eq!((b.attempts, b.next_at_ms), (0, wall.0 + 30 * SECOND_MS), "deferral {}", i + 1);
    }
    // While it waits, the planner gives the file no task; after that, it does.
    n.policy_set(at(460_001), "/", 2).unwrap();
    let waiting = n.replication_plan(at(460_002), &[]);
    assert_eq!(waiting.plan.stats.waiting_backoff, 1, "{waiting:?}");

    // A failure counts from where the failures were, not from the deferrals.
    n.repl_outcome(at(600_000), "/r", TaskOutcome::Failed);
    n.repl_outcome(at(700_000), "/r", TaskOutcome::Deferred);
    let b = n.repl_backoffs().remove(&id).expect("the file waits");
    assert_eq!((b.attempts, b.next_at_ms), (1, at(700_000).0 + 30 * SECOND_MS));
    // A success clears a wait that a deferral alone set.
    n.repl_outcome(at(800_000), "/r", TaskOutcome::Succeeded);
    n.repl_outcome(at(900_000), "/r", TaskOutcome::Deferred);
    n.repl_outcome(at(900_100), "/r", TaskOutcome::Succeeded);
    assert!(n.repl_backoffs().is_empty(), "{:?}", n.repl_backoffs());
    assert_eq!(file(&n, "/r").repl.map(|r| (r.attempts, r.next_at_ms)), Some((0, 0)));
}

// ---- 9. copy_mark ----

#[test]
fn a_copy_mark_for_older_content_changes_nothing() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    publish(&mut n, at(1_000), "/c", 'a', &[(va.clone(), me.clone()), (vb.clone(), nb)]);
    // A scrub of the copy on va starts, then the file is overwritten there.
    n.file_publish(at(2_000), "/c", 10, &sum('b'), 0, &[(va.clone(), me.clone())]).unwrap();
    let before = file(&n, "/c");

    assert!(!n.copy_mark(at(3_000), "/c", &va, LocationState::Stale, &sum('a')), "the scrub read older content");
    assert!(!n.copy_mark(at(3_001), "/c", &vb, LocationState::Verified, &sum('a')), "nor may it revive a stale copy");
    assert_eq!(file(&n, "/c"), before);

    assert!(n.copy_mark(at(3_002), "/c", &va, LocationState::Verified, &sum('b').to_uppercase()));
    assert_eq!(loc(&file(&n, "/c"), &va).state, LocationState::Verified);
    assert!(n.copy_mark(at(3_003), "/c", &va, LocationState::Stale, &sum('b')), "a scrub of this content counts");
    assert_eq!(loc(&file(&n, "/c"), &va).state, LocationState::Stale);
    assert!(!n.copy_mark(at(3_004), "/c", &VolumeId::new("nowhere"), LocationState::Stale, &sum('b')));

    n.file_remove(at(4_000), "/c", false).unwrap();
    assert!(!n.copy_mark(at(4_001), "/c", &vb, LocationState::Verified, &sum('b')), "a tombstone takes no verify");
}

// ---- found bugs (ignored: they fail today; run with `--ignored`) ----

/// A move followed, before the holder has renamed its copy, by a new file at the old
/// path. The new live record replaces the tombstone at `/a`, so nothing says any more that
/// the bytes at `/a` on `va` belong at `/b`: the rename is never made, `/b`'s record claims a
/// current copy on `va` that is not there, and the old bytes now pass for a stale copy of the
/// new `/a` (which the planner may repair over or drop). Either the put must be refused while
/// a rename from that path is pending, or the rename must survive.
#[test]
fn a_new_file_at_a_moved_files_old_path_keeps_the_rename_pending() {
    let (mut n, va, _) = leader(1);
    let me = n.id().clone();
    let (vb, nb) = far(2);
    publish(&mut n, at(1_000), "/a", 'a', &[(va.clone(), me.clone())]);
    n.file_move(at(2_000), "/a", "/b").unwrap();
    let rename = DiskAction::Rename { volume: va.clone(), folder: folder(1), from: "/a".into(), to: "/b".into() };
    assert_eq!(n.disk_actions(), vec![rename.clone()]);
    let put = n.file_publish(at(3_000), "/a", 5, &sum('c'), 0, &[(vb, nb)]);
    if put.is_ok() {
        assert!(n.disk_actions().contains(&rename), "the copy of /b still sits at /a on va: {:?}", n.disk_actions());
    }
}

/// `shoal verify PATH` takes the live files at the path or below it, by a lookup and one range
/// of the records (it walked the whole namespace per request): a sibling whose name only starts
/// the same, removed files and folders are not among them.
#[test]
fn the_files_to_verify_are_the_live_ones_at_or_below_the_path() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    for p in ["/v/a", "/v/b/c", "/vx", "/w", "/v/d"] {
        publish(&mut n, at(1_000), p, 'a', &[(va.clone(), me.clone())]);
    }
    n.file_mkdir(at(1_500), "/v/e").unwrap();
    n.file_remove(at(2_000), "/v/d", false).unwrap();
    let paths = |n: &Node, p: &str| -> Vec<String> {
        n.live_files_at_or_under(p).unwrap().into_iter().map(|f| f.path).collect()
    };
    assert_eq!(paths(&n, "/v"), vec!["/v/a", "/v/b/c"]);
    assert_eq!(paths(&n, "/v/"), vec!["/v/a", "/v/b/c"], "normalised");
    assert_eq!(paths(&n, "/v/a"), vec!["/v/a"]);
    assert_eq!(paths(&n, "/"), vec!["/v/a", "/v/b/c", "/vx", "/w"]);
    assert!(paths(&n, "/nothing").is_empty());
    assert!(paths(&n, "/v/d").is_empty(), "removed");
    assert!(n.live_files_at_or_under("relative/../..").is_err());
}

/// The replication backoff register outlives the file: A file removed after repeated
/// replication failures and then created anew at the same path (a new id, new content)
/// inherits the old file's backoff and waits up to an hour for its first extra copy.
#[test]
fn a_re_created_file_starts_without_the_old_files_backoff() {
    let (mut n, va) = member(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/r", 'a', &[(va.clone(), me.clone())]);
    for i in 0..5 {
        n.repl_outcome(at(2_000 + i), "/r", TaskOutcome::Failed);
    }
    n.file_remove(at(3_000), "/r", false).unwrap();
    let fresh = publish(&mut n, at(4_000), "/r", 'b', &[(va, me)]);
    assert_eq!(n.repl_backoffs().get(&fresh), None, "a new file has no failures behind it");
}

/// A move, then an overwrite of the new name on the same volume before the holder renamed:
/// the copy at the old name is superseded, so it is deleted, never renamed over the new bytes.
#[test]
fn a_copy_overwritten_at_its_new_name_is_not_renamed_over() {
    let (mut n, va, _) = leader(1);
    let me = n.id().clone();
    publish(&mut n, at(1_000), "/a", 'a', &[(va.clone(), me.clone())]);
    n.file_move(at(2_000), "/a", "/b").unwrap();
    let rename = DiskAction::Rename { volume: va.clone(), folder: folder(1), from: "/a".into(), to: "/b".into() };
    assert_eq!(n.disk_actions(), vec![rename]);
    publish(&mut n, at(3_000), "/b", 'f', &[(va.clone(), me.clone())]);
    let delete = DiskAction::Delete { volume: va.clone(), folder: folder(1), path: "/a".into() };
    assert_eq!(n.disk_actions(), vec![delete], "the old bytes go; the new ones at /b stay");
}

/// Issue 12: the replication task leases are the core's. A worker's report is taken only from
/// the worker itself under a term the leader knows; a renew adopts a task the table does not
/// hold; only the task in flight ends it; a lease that runs out (announced by `poll_timeout`)
/// fails the task and escalates the file's backoff, and a node that is not the leader keeps
/// no table.
#[test]
fn replication_task_leases_are_granted_renewed_adopted_ended_and_expired_in_the_core() {
    use shoal_core::node::replication::TaskReport;
    use shoal_core::node::Output;
    use shoal_core::storage::tasks::ReportError;
    let (mut n, vol, term) = leader(1);
    let (far_vol, worker) = far(2);
    let file = publish(&mut n, at(1_000), "/a.bin", 'a', &[(vol.clone(), id_of(1))]);
    let task = pull_task(file.clone(), "/a.bin", 'a', &vol, &far_vol, &worker);
    // Nobody but the worker, and no term beyond the leader's.
    assert_eq!(n.repl_report(at(2_000), &id_of(9), term, &task, TaskReport::Renew), Err(ReportError::NotAuthorized));
    assert_eq!(n.repl_report(at(2_000), &worker, term + 1, &task, TaskReport::Renew), Err(ReportError::NotAuthorized));
    // A renew of a task this leader never granted adopts it (begun under an earlier leader).
    assert_eq!(n.repl_report(at(2_000), &worker, term, &task, TaskReport::Renew), Ok(false));
    assert_eq!(n.repl_tasks(), vec![task.clone()]);
    // A different task for the file does not end it.
    let mut other = task.clone();
    other.size = 11;
    let done = TaskReport::Done(TaskOutcome::Succeeded);
    assert_eq!(n.repl_report(at(3_000), &worker, term, &other, done), Err(ReportError::NotInFlight));
    assert_eq!(n.repl_report(at(3_000), &worker, term, &task, done), Ok(true));
    assert!(n.repl_tasks().is_empty());

    // Granted, then never renewed: the lease runs out at grant + 30 s, which poll_timeout names.
    n.repl_grant(at(4_000), task.clone());
    assert!(n.poll_timeout().is_some_and(|t| t <= at(34_000)), "{:?}", n.poll_timeout());
    n.handle_timeout(at(33_000));
    assert_eq!(n.repl_tasks().len(), 1);
    drain(&mut n);
    n.handle_timeout(at(34_500));
    assert!(n.repl_tasks().is_empty(), "the lease ran out");
    let mut expired = Vec::new();
    while let Some(o) = n.poll_output() {
        if let Output::Event(shoal_core::node::Event::ReplTaskExpired { path }) = o {
            expired.push(path);
        }
    }
    assert_eq!(expired, vec!["/a.bin".to_string()]);
    let backoffs = n.repl_backoffs();
    assert_eq!(backoffs.get(&file).map(|b| b.attempts), Some(1), "counted as a failure: {backoffs:?}");
    // A late done of the expired task ends nothing.
    assert_eq!(n.repl_report(at(35_000), &worker, term, &task, done), Err(ReportError::NotInFlight));
}

/// A worker's report of a deferred pull (its target refused while another write's bytes were
/// unsettled there, or its source while the copy waited for its rename) ends the task and makes the file wait one base delay with no failure
/// counted; which refusals are deferrals is the core's (`TaskOutcome::of_pull_error`); the
/// report's `deferred` flag is sent only when set (a node of the previous version, whose
/// reports reject unknown fields, still reads every other report).
#[test]
fn a_deferred_pull_report_ends_the_task_without_counting_a_failure() {
    use shoal_core::node::replication::{TaskReport, TaskReportBody};
    let (mut n, vol, term) = leader(1);
    let (far_vol, worker) = far(2);
    let file = publish(&mut n, at(1_000), "/d.bin", 'a', &[(vol.clone(), id_of(1))]);
    let task = pull_task(file.clone(), "/d.bin", 'a', &vol, &far_vol, &worker);

    assert_eq!(TaskOutcome::of_pull_error("busy"), TaskOutcome::Deferred);
    assert_eq!(TaskOutcome::of_pull_error("write_conflict"), TaskOutcome::Deferred);
    // The source's copy still at the path it was moved from, its rename waiting for kept bytes.
    assert_eq!(TaskOutcome::of_pull_error("rename_pending"), TaskOutcome::Deferred);
    for code in ["short_copy", "checksum_mismatch", "file_changed", "io", ""] {
        assert_eq!(TaskOutcome::of_pull_error(code), TaskOutcome::Failed, "{code}");
    }
    let body = TaskReportBody { term, task: task.clone(), ok: false, deferred: true, error: "busy".into() };
    assert_eq!(body.outcome(), TaskOutcome::Deferred);
    let plain = TaskReportBody { deferred: false, ..body.clone() };
    assert_eq!(plain.outcome(), TaskOutcome::Failed);
    assert_eq!(TaskReportBody { ok: true, ..plain.clone() }.outcome(), TaskOutcome::Succeeded);
    let wire = serde_json::to_value(&plain).unwrap();
    assert!(wire.get("deferred").is_none(), "{wire}");
    assert_eq!(serde_json::to_value(&body).unwrap()["deferred"], serde_json::json!(true));

    for round in 0..6u64 {
        let t = at(10_000 + round * 1_000);
        n.repl_grant(t, task.clone());
        assert_eq!(n.repl_report(t, &worker, term, &task, TaskReport::Done(body.outcome())), Ok(true));
        assert!(n.repl_tasks().is_empty());
        let b = n.repl_backoffs().remove(&file).expect("the file waits");
        assert_eq!((b.attempts, b.next_at_ms), (0, t.0 + 30 * SECOND_MS), "round {round}");
    }
    assert_eq!((n.repl_stats().deferred, n.repl_stats().failed), (6, 0));
}

/// Issue 12: whether pulled bytes are still a copy is the core's (`Node::pull_currency`): the
/// same live file with the pulled content is current; an overwrite or a removal makes them no
/// copy; a path this node's records do not show yet (they may lag) is asked again.
#[test]
fn pulled_bytes_are_current_changed_or_not_yet_known_by_the_records() {
    use shoal_core::node::replication::PullCurrency;
    let (mut n, vol, _) = leader(1);
    let (far_vol, worker) = far(2);
    let task = |file: FileId, c: char| pull_task(file, "/p.bin", c, &vol, &far_vol, &worker);
    let unknown = task(FileId::new("nope"), 'a');
    assert_eq!(n.pull_currency(&unknown), PullCurrency::NotYetKnown);
    let id = publish(&mut n, at(1_000), "/p.bin", 'a', &[(vol.clone(), id_of(1))]);
    assert_eq!(n.pull_currency(&task(id.clone(), 'a')), PullCurrency::Current);
    assert!(n.knows_task_file(&task(id.clone(), 'a')));
    assert!(n.current_copy_listed("/p.bin", &vol));
    assert!(!n.current_copy_listed("/p.bin", &far_vol));
    // Another file now at the path (a new id), or other content: changed.
    assert_eq!(n.pull_currency(&unknown), PullCurrency::Changed);
    assert_eq!(n.pull_currency(&task(id.clone(), 'b')), PullCurrency::Changed);
    n.file_remove(at(2_000), "/p.bin", false).unwrap();
    assert_eq!(n.pull_currency(&task(id, 'a')), PullCurrency::Changed, "removed");
    assert_eq!(n.pull_currency(&unknown), PullCurrency::NotYetKnown, "a removed other file says nothing yet");
}

/// A pull of `path` (content `c`) from node 1's `from` to `worker`'s `to`.
fn pull_task(
    file: FileId,
    path: &str,
    c: char,
    from: &VolumeId,
    to: &VolumeId,
    worker: &NodeId,
) -> shoal_core::storage::planner::Task {
    use shoal_core::storage::planner::{Action, Reason, Task};
    Task {
        file,
        path: path.into(),
        size: 10,
        checksum: sum(c),
        action: Action::Pull {
            source_node: id_of(1),
            source_volume: from.clone(),
            target_node: worker.clone(),
            target_volume: to.clone(),
        },
        reason: Reason::Replica,
    }
}
