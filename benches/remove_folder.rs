//! Removing a large folder in a large namespace, on the node holding the copies: after
//! `rm -r`, the node's disk reconciler lists what to delete (`Node::disk_actions`), and each
//! copy's delete is checked again under the landing lock (`Node::disk_action_holds`) and, when
//! the remover asks, authorised (`Node::authorize_delete`). Each check asks for the file's other
//! records by id (a moved file's live record shares its tombstone's id); a scan of every record
//! per copy made the whole removal quadratic. Prints the time per copy, the process's RSS after
//! the namespace is built, and the cost of the reconciler's pass after one more single-file
//! remove (once the folder's copies are gone: it looks for copies among the tombstones).
//!
//! `FILES=200000 REMOVE=10000 cargo bench --bench remove_folder` (defaults as shown).

use ed25519_dalek::SigningKey;
use shoal_core::node::files::DeleteRequest;
use shoal_core::node::volumes::FolderFacts;
use shoal_core::node::{Node, NodeConfig, SelfInfo};
use shoal_core::records::Capabilities;
use shoal_core::time::Millis;
use shoal_core::NodeId;
use std::time::Instant;

const T0: Millis = Millis(1_700_000_000_000);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn main() {
    let (files, remove) = (env("FILES", 200_000), env("REMOVE", 10_000));
    let folders = files / remove.max(1);
    let me = SelfInfo {
        name: "bench".into(),
        advertise_url: "http://10.0.0.1:7000".into(),
        software_version: "0.1.0".into(),
        capabilities: Capabilities::default(),
        tls_pin: String::new(),
    };
    let id = NodeId::new("00000001-0000-4000-8000-000000000001");
    let mut n = Node::new(id.clone(), SigningKey::from_bytes(&[1; 32]), 1, NodeConfig::default(), me);
    n.create_cluster(T0, "c").expect("create");
    let vol = n.volume_add(T0, "/srv/b", &FolderFacts::default(), "", 1 << 50, 1 << 49).expect("volume").id;
    n.handle_timeout(T0);
    while n.poll_output().is_some() {}
    let rss_before = rss_mib();
    let t = Instant::now();
    let sum = "a".repeat(64);
    for f in 0..files {
        let wall = T0.plus(1 + f as u64 / 1000);
        let path = format!("/data/d{:04}/f{f:07}", f % folders.max(1));
        n.file_publish(wall, &path, 4096, &sum, wall.0, &[(vol.clone(), id.clone())]).expect("publish");
        if f % 1000 == 999 {
            n.handle_timeout(wall);
            while n.poll_output().is_some() {}
        }
    }
    let built = t.elapsed();
    let rss_after = rss_mib();
    let wall = T0.plus(10_000);
    n.file_remove(wall, "/data/d0000", true).expect("remove");
    n.handle_timeout(wall);
    while n.poll_output().is_some() {}

    let t = Instant::now();
    let actions = n.disk_actions();
    let listed = t.elapsed();
    let t = Instant::now();
    let mut held = 0;
    let mut authorised = 0;
    for a in &actions {
        if n.disk_action_holds(a) {
            held += 1;
        }
        if let shoal_core::node::files::DiskAction::Delete { path, .. } = a {
            let req = DeleteRequest { volume_id: vol.clone(), path: path.clone(), term: None };
            if n.authorize_delete(wall, &id, &req).is_ok() {
                authorised += 1;
            }
        }
    }
    let checked = t.elapsed();
    assert_eq!((held, authorised), (actions.len(), actions.len()), "every delete holds and is authorised");
    // The copies deleted, as the reconciler marks them; then one more file removed: the pass
    // that remove starts has one copy to find among 200,000 records and 10,000 tombstones.
    for a in &actions {
        if let shoal_core::node::files::DiskAction::Delete { path, .. } = a {
            n.removed_copy_dropped(wall, path, &vol);
        }
    }
    n.handle_timeout(wall);
    while n.poll_output().is_some() {}
    let one = format!("/data/d0001/f{:07}", 1);
    n.file_remove(wall.plus(1), &one, false).expect("remove one");
    let t = Instant::now();
    let rounds = 20;
    for _ in 0..rounds {
        assert_eq!(n.disk_actions().len(), 1);
    }
    let one_pass = t.elapsed() / rounds;
    println!(
        "{files} files ({:.1} s to build, RSS {:.0} -> {:.0} MiB); rm -r of {} files: disk_actions {:.1} ms, \
         per copy {:.1} µs (disk_action_holds + authorize_delete), all {:.2} s; then a pass for one \
         removed file {:.2} ms",
        built.as_secs_f64(),
        rss_before,
        rss_after,
        actions.len(),
        listed.as_secs_f64() * 1e3,
        checked.as_secs_f64() * 1e6 / actions.len().max(1) as f64,
        checked.as_secs_f64(),
        one_pass.as_secs_f64() * 1e3
    );
}
