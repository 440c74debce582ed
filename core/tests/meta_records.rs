//! The metadata records through their public API: the merge laws of every record kind, the
//! state a node reaches from any delivery order, per-register merges, and tombstone purge.
//!
//! Spec: cluster-runtime.md "Metadata store (ACMS)" (records merge on every node, so the store
//! converges without a master); reference-facts.md "FileRecord", "Volume", "Policy", "Log entry"
//! and weaknesses 3 (no tie-break), 4 (whole-record LWW loses concurrent updates) and 7 (removed
//! records never purged); DESIGN.md "Versions and merge".
//!
//! A version names one write: two writes never share a version (DESIGN.md "Versions and merge"),
//! so the generators below give every version one content.

mod common;

use common::Status;
use proptest::prelude::*;
use serde_json::json;
use shoal_core::hlc::Version;
use shoal_core::ids::{FileId, JobId, NodeId, VolumeId};
use shoal_core::meta::job::{JobLease, JobSpec, JobState, JobStatus};
use shoal_core::meta::records::{
    BasedOn, FileRecord, Job, Location, LocationState, Policy, Record, ReplBackoff, Setting, Volume,
};
use shoal_core::meta::state::{MetaState, TOMBSTONE_TTL_MS};
use shoal_core::time::{Millis, DAY_MS};
use std::collections::BTreeMap;

/// "Now" at the start of every scenario (November 2023).
const T0: u64 = 1_700_000_000_000;
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const VOLUMES: [&str; 4] = ["v1", "v2", "v3", "v4"];
const STATES: [LocationState; 6] = [
    LocationState::Pending,
    LocationState::Writing,
    LocationState::Committed,
    LocationState::Verified,
    LocationState::Stale,
    LocationState::Failed,
];
const FILE_PATH: &str = "/photos/a.jpg";

fn node(i: usize) -> NodeId {
    NodeId::new(NODES[i % NODES.len()])
}

fn ver(wall: u64, counter: u32, n: usize) -> Version {
    Version { wall_ms: T0 + wall, counter, node: node(n) }
}

/// Versions from a narrow window, so equal wall times and equal counters are common and only the
/// node id breaks the tie.
fn version() -> impl Strategy<Value = Version> {
    (0u64..5, 0u32..3, 0usize..NODES.len()).prop_map(|(w, c, n)| ver(w, c, n))
}

/// Keep the first content generated for each version: one version, one write.
fn one_per_version<K: Ord, T>(writes: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut seen = BTreeMap::new();
    for w in writes {
        seen.entry(key(&w)).or_insert(w);
    }
    seen.into_values().collect()
}

// ---- generators, one per kind; every record of a batch has the same key ----

/// A copy's write; `content`, when given, makes it a re-label of older content.
fn location(volume: usize, updated: Version, state: usize, checksum: u8, content: Option<Version>) -> Location {
    Location {
        volume_id: VolumeId::new(VOLUMES[volume]),
        node_id: node(volume),
        state: STATES[state],
        checksum: format!("{checksum:02x}"),
        content: content.filter(|c| *c < updated),
        updated,
    }
}

fn file_meta(version: Version, size: u64, removed: bool, replicas: u32, incarnation: u8) -> FileRecord {
    FileRecord {
        id: FileId::new(format!("file-{incarnation}")),
        path: FILE_PATH.to_string(),
        is_dir: false,
        size,
        mod_time: version.wall_ms,
        checksum: format!("sum-{size}"),
        owner: "alice".to_string(),
        primary: Some(VolumeId::new(VOLUMES[size as usize % VOLUMES.len()])),
        locations: Vec::new(),
        replicas,
        removed,
        version,
        repl: None,
        based_on: None,
    }
}

/// Versions of one file: metadata writes, and copy-location writes each carried by some of them.
/// A record's copies are sorted by volume, one per volume, as a node builds them; or, in a raw
/// batch, in any order with a volume maybe listed twice, as a careless or hostile peer may send.
fn file_batch() -> impl Strategy<Value = Vec<Record>> {
    let meta = prop::collection::vec((version(), 0u64..1000, prop::bool::weighted(0.25), 0u32..4, 0u8..2), 1..6);
    let locs = prop::collection::vec(
        (0..VOLUMES.len(), version(), 0..STATES.len(), any::<u8>(), any::<u8>(), prop::option::of(version())),
        0..10,
    );
    (meta, locs, prop::bool::weighted(0.3)).prop_map(|(meta, locs, raw)| {
        let meta = one_per_version(meta, |m| m.0.clone());
        let locs = one_per_version(locs, |l| (l.0, l.1.clone()));
        meta.into_iter()
            .enumerate()
            .map(|(i, (v, size, removed, replicas, inc))| {
                let mut f = file_meta(v, size, removed, replicas, inc);
                // The carriers mask says which records hold a write (bit i, wrapping).
                let carried = locs.iter().filter(|(.., carriers, _)| carriers & (1 << (i % 8)) != 0).map(
                    |(volume, updated, state, checksum, _, content)| {
                        location(*volume, updated.clone(), *state, *checksum, content.clone())
                    },
                );
                if raw {
                    f.locations = carried.collect();
                } else {
                    let mut by_volume: BTreeMap<VolumeId, Location> = BTreeMap::new();
                    for l in carried {
                        by_volume.entry(l.volume_id.clone()).or_insert(l);
                    }
                    f.locations = by_volume.into_values().collect();
                }
                Record::File(f)
            })
            .collect()
    })
}

/// Versions of one volume: configuration writes (an admin's) and usage reports (its node's),
/// combined freely; `None` is a record made before any usage report.
fn volume_batch() -> impl Strategy<Value = Vec<Record>> {
    let config = prop::collection::vec(
        (version(), 0u8..3, any::<bool>(), any::<bool>(), prop::bool::weighted(0.2), 0..NODES.len()),
        1..5,
    );
    let usage = prop::collection::vec((version(), 0u64..100, 0u64..100, any::<bool>()), 1..5);
    let picks =
        prop::collection::vec((any::<prop::sample::Index>(), prop::option::of(any::<prop::sample::Index>())), 1..6);
    (config, usage, picks).prop_map(|(config, usage, picks)| {
        let config = one_per_version(config, |c| c.0.clone());
        let usage = one_per_version(usage, |u| u.0.clone());
        picks
            .into_iter()
            .map(|(c, u)| {
                let (version, name, read_only, evacuating, removed, owner) = c.get(&config).clone();
                let (usage_version, capacity, free, low_space) = match u {
                    Some(u) => u.get(&usage).clone(),
                    None => (Version::default(), 0, 0, false),
                };
                Record::Volume(Volume {
                    id: VolumeId::new("vol-1"),
                    node_id: node(owner),
                    name: format!("drive{name}"),
                    fsh_uuid: "fsh-1".to_string(),
                    subpath: "cluster".to_string(),
                    read_only,
                    evacuating,
                    removed,
                    version,
                    capacity: capacity * 1000,
                    free: free * 10,
                    low_space,
                    usage_version,
                })
            })
            .collect()
    })
}

/// Versions of one job: run-state writes (the scheduler's, the worker's) and cancels, combined
/// freely.
fn job_batch() -> impl Strategy<Value = Vec<Record>> {
    let runs = prop::collection::vec((version(), 0usize..4, 0u32..3, prop::bool::weighted(0.2)), 1..5);
    let cancels = prop::collection::vec(prop::option::of(version()), 1..4);
    let picks = prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..6);
    (runs, cancels, picks).prop_map(|(runs, cancels, picks)| {
        let runs = one_per_version(runs, |r| r.0.clone());
        picks
            .into_iter()
            .map(|(r, c)| {
                let (version, status, attempts, removed) = r.get(&runs).clone();
                let status = [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed][status];
                let state = JobState { status, attempts, node: Some(version.node.clone()), ..Default::default() };
                Record::Job(Job {
                    id: JobId::new("job-1"),
                    spec: Box::new(JobSpec { script: "run(job)".into(), ..Default::default() }),
                    state: Box::new(state),
                    state_version: version.clone(),
                    lease: None,
                    lease_version: version.clone(),
                    removed,
                    version,
                    cancelled: c.get(&cancels).clone(),
                })
            })
            .collect()
    })
}

fn policy_batch() -> impl Strategy<Value = Vec<Record>> {
    prop::collection::vec((version(), 1u32..5, prop::bool::weighted(0.25)), 1..6).prop_map(|writes| {
        one_per_version(writes, |w| w.0.clone())
            .into_iter()
            .map(|(version, replicas, removed)| {
                Record::Policy(Policy { folder: "/photos".to_string(), replicas, removed, version })
            })
            .collect()
    })
}

fn setting_batch() -> impl Strategy<Value = Vec<Record>> {
    prop::collection::vec((version(), any::<i32>(), prop::bool::weighted(0.25)), 1..6).prop_map(|writes| {
        one_per_version(writes, |w| w.0.clone())
            .into_iter()
            .map(|(version, value, removed)| {
                Record::Setting(Setting {
                    key: "storage.autoReadOnly".to_string(),
                    value: json!(value),
                    removed,
                    version,
                })
            })
            .collect()
    })
}

/// A batch of one kind, any kind.
fn same_key_batch() -> impl Strategy<Value = Vec<Record>> {
    prop_oneof![file_batch(), volume_batch(), job_batch(), policy_batch(), setting_batch()]
}

/// Batches of every kind together, as a log or a snapshot delivers them.
fn mixed_batch() -> impl Strategy<Value = Vec<Record>> {
    (file_batch(), volume_batch(), job_batch(), policy_batch(), setting_batch())
        .prop_map(|(a, b, c, d, e)| a.into_iter().chain(b).chain(c).chain(d).chain(e).collect())
}

// ---- oracles and checks ----

fn merged(a: &Record, b: &Record) -> (Record, bool) {
    let mut out = a.clone();
    let changed = out.merge(b);
    (out, changed)
}

/// The merge as the spec defines it, register by register: the newest write of each register.
fn expected(batch: &[Record]) -> Record {
    match &batch[0] {
        Record::File(_) => {
            let files: Vec<&FileRecord> =
                batch.iter().filter_map(|r| if let Record::File(f) = r { Some(f) } else { None }).collect();
            let top = files.iter().max_by(|a, b| a.version.cmp(&b.version)).expect("a batch is never empty");
            let mut locations: BTreeMap<VolumeId, Location> = BTreeMap::new();
            for l in files.iter().flat_map(|f| &f.locations) {
                match locations.get(&l.volume_id) {
                    Some(have) if have.order() >= l.order() => {}
                    _ => {
                        locations.insert(l.volume_id.clone(), l.clone());
                    }
                }
            }
            Record::File(FileRecord { locations: locations.into_values().collect(), ..(*top).clone() })
        }
        Record::Volume(_) => {
            let vols: Vec<&Volume> =
                batch.iter().filter_map(|r| if let Record::Volume(v) = r { Some(v) } else { None }).collect();
            let config = vols.iter().max_by(|a, b| a.version.cmp(&b.version)).expect("a batch is never empty");
            let usage =
                vols.iter().max_by(|a, b| a.usage_version.cmp(&b.usage_version)).expect("a batch is never empty");
            Record::Volume(Volume {
                capacity: usage.capacity,
                free: usage.free,
                low_space: usage.low_space,
                usage_version: usage.usage_version.clone(),
                ..(*config).clone()
            })
        }
        Record::Job(_) => {
            let jobs: Vec<&Job> =
                batch.iter().filter_map(|r| if let Record::Job(j) = r { Some(j) } else { None }).collect();
            let top = jobs.iter().max_by(|a, b| a.version.cmp(&b.version)).expect("a batch is never empty");
            let cancelled = jobs.iter().filter_map(|j| j.cancelled.clone()).min();
            // The run state: a final one outranks any other, then the newer.
            let run = jobs
                .iter()
                .max_by_key(|j| (j.state.status.is_final(), j.state_version.clone()))
                .expect("a batch is never empty");
            Record::Job(Job {
                cancelled,
                state: run.state.clone(),
                state_version: run.state_version.clone(),
                ..(*top).clone()
            })
        }
        Record::Policy(_) | Record::Setting(_) => {
            batch.iter().max_by_key(|r| r.main_version().clone()).expect("a batch is never empty").clone()
        }
    }
}

fn applied(batch: &[Record]) -> MetaState {
    let mut s = MetaState::new();
    for r in batch {
        s.apply(r);
    }
    s
}

/// Two states are the same: equal digests and equal records, tombstones included.
fn assert_same_state(a: &MetaState, b: &MetaState) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.digest(), b.digest());
    prop_assert_eq!(a.snapshot(), b.snapshot());
    Ok(())
}

fn check_merge_laws(batch: &[Record], i: usize, j: usize, k: usize) -> Result<(), TestCaseError> {
    let (a, b, c) = (&batch[i], &batch[j], &batch[k]);
    // Idempotent: merging a record into itself changes nothing but the order of a raw record's
    // copies (then it says so), and merging it in again changes nothing at all.
    let (aa, changed) = merged(a, a);
    prop_assert_eq!(&aa, &expected(std::slice::from_ref(a)));
    prop_assert_eq!(changed, &aa != a);
    let (aaa, changed) = merged(&aa, a);
    prop_assert_eq!(&aaa, &aa);
    prop_assert!(!changed);
    // Commutative.
    let (ab, ab_changed) = merged(a, b);
    let (ba, _) = merged(b, a);
    prop_assert_eq!(&ab, &ba);
    // The changed flag is honest (what `apply` relies on to persist and digest).
    prop_assert_eq!(ab_changed, &ab != a);
    // Associative.
    let (ab_c, _) = merged(&ab, c);
    let (bc, _) = merged(b, c);
    let (a_bc, _) = merged(a, &bc);
    prop_assert_eq!(&ab_c, &a_bc);
    // Merging a part of the result back in is a no-op.
    let (again, changed) = merged(&ab_c, b);
    prop_assert_eq!(&again, &ab_c);
    prop_assert!(!changed);
    Ok(())
}

fn indices(batch: &[Record], picks: &[prop::sample::Index; 3]) -> (usize, usize, usize) {
    (picks[0].index(batch.len()), picks[1].index(batch.len()), picks[2].index(batch.len()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// DESIGN.md "Versions and merge": "Every merge is commutative, associative and idempotent"
    /// (for each kind: files, volumes, jobs, policies, settings).
    #[test]
    fn merge_is_commutative_associative_and_idempotent_for_every_kind(
        batch in same_key_batch(),
        picks in any::<[prop::sample::Index; 3]>(),
    ) {
        let (i, j, k) = indices(&batch, &picks);
        check_merge_laws(&batch, i, j, k)?;
    }

    /// DESIGN.md "Versions and merge": the merge of a whole batch keeps the newest write of
    /// every register (a file's metadata and each copy, a volume's configuration and usage, a
    /// job's run state, and its earliest cancel).
    #[test]
    fn the_merged_record_holds_the_newest_write_of_every_register(batch in same_key_batch()) {
        let s = applied(&batch);
        let want = expected(&batch);
        prop_assert_eq!(s.len(), 1);
        prop_assert_eq!(s.get(want.kind(), &want.key()), Some(&want));
    }

    /// Spec "Metadata store (ACMS)": records arrive from the local node, a leader's append, a
    /// catch-up page or a snapshot, in any order; every order gives the same state and digest.
    #[test]
    fn applying_any_permutation_of_a_batch_gives_the_same_state(
        (batch, shuffled) in mixed_batch().prop_flat_map(|b| (Just(b.clone()), Just(b).prop_shuffle())),
    ) {
        assert_same_state(&applied(&batch), &applied(&shuffled))?;
    }

    /// Spec "Metadata store (ACMS)": a record may arrive any number of times (retried submits,
    /// overlapping catch-up pages); repeats change nothing and say so.
    #[test]
    fn applying_records_again_changes_nothing(
        (batch, shuffled) in mixed_batch().prop_flat_map(|b| (Just(b.clone()), Just(b).prop_shuffle())),
        repeats in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let once = applied(&batch);
        let mut twice = shuffled.clone();
        twice.extend(repeats.iter().map(|r| r.get(&batch).clone()));
        twice.extend(batch.iter().cloned());
        assert_same_state(&once, &applied(&twice))?;
        let mut s = once.clone();
        for r in &batch {
            prop_assert!(s.apply(r).is_none(), "re-applying {:?} changed the state", r);
        }
        prop_assert_eq!(s.digest(), once.digest());
    }

    /// Spec "Metadata store (ACMS)": merging state into state (a snapshot into a node that
    /// already has some of it) is the same as applying everything once.
    #[test]
    fn applying_a_snapshot_of_part_of_a_batch_gives_the_same_state(
        batch in mixed_batch(),
        split in any::<prop::sample::Index>(),
    ) {
        let cut = split.index(batch.len() + 1);
        let first = applied(&batch[..cut]);
        let mut s = applied(&batch[cut..]);
        for r in first.snapshot().into_records() {
            s.apply(&r);
        }
        assert_same_state(&s, &applied(&batch))?;
    }
}

/// Writes to a few paths by a few file ids (a move leaves a tombstone and a live record with
/// one id; a new file at a path takes another id), with tombstone purges between them.
#[derive(Clone, Debug)]
enum FileStep {
    Write {
        path: usize,
        id: usize,
        wall: u64,
        counter: u32,
        node: usize,
        removed: bool,
        copy: Option<(usize, bool, u64)>,
        /// A replication backoff register: attempts, next try (0 or 1), its version's day.
        backoff: Option<(u32, u64, u64)>,
        /// The path (index) a move brought the file from (its `based_on`).
        moved_from: Option<usize>,
    },
    Purge {
        days: u64,
    },
}

fn file_steps() -> impl Strategy<Value = Vec<FileStep>> {
    let copy = prop::option::of((0usize..2, prop::bool::ANY, 0u64..20));
    let backoff = prop::option::of((0u32..2, 0u64..2, 0u64..20));
    let moved_from = prop::option::of(0usize..4);
    let write =
        (
            (0usize..4, 0usize..3, 0u64..20, 0u32..3, 0usize..NODES.len(), prop::bool::weighted(0.4)),
            (copy, backoff, moved_from),
        )
            .prop_map(|((path, id, wall, counter, node, removed), (copy, backoff, moved_from))| {
                FileStep::Write { path, id, wall, counter, node, removed, copy, backoff, moved_from }
            });
    let purge = (0u64..10).prop_map(|days| FileStep::Purge { days });
    prop::collection::vec(prop_oneof![6 => write, 1 => purge], 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The file-id index, the tombstone index, the backoff index and the index of moves (old
    /// paths live again, moved records by old path) answer exactly what a scan of every file
    /// record answers, after any sequence of merges (an id replaced at a path by a newer write,
    /// a tombstone over a live record and back, a move's record) and purges.
    #[test]
    fn the_file_indexes_always_match_a_scan(steps in file_steps()) {
        let mut s = MetaState::new();
        for step in steps {
            match step {
                FileStep::Write { path, id, wall, counter, node, removed, copy, backoff, moved_from } => {
                    let mut f = file_meta(ver(wall * DAY_MS, counter, node), 10, removed, 0, id as u8);
                    f.path = format!("/d/f{path}");
                    f.based_on = moved_from.map(|m| {
                        Box::new(BasedOn { path: format!("/d/f{m}"), version: ver(wall * DAY_MS, 0, node) })
                    });
                    if let Some((volume, dropped, updated)) = copy {
                        // A copy listed, or marked dropped (its bytes deleted), by a newer write.
                        let mut l = location(volume, ver(updated * DAY_MS, 0, node), 2, 1, None);
                        if dropped {
                            l.state = LocationState::Dropped;
                        }
                        f.locations = vec![l];
                    }
                    f.repl = backoff.map(|(attempts, next, day)| {
                        Box::new(ReplBackoff { attempts, next_at_ms: next, version: ver(day * DAY_MS, 1, node) })
                    });
                    s.apply(&Record::File(f));
                }
                FileStep::Purge { days } => {
                    s.purge(Millis(T0 + days * DAY_MS + 20 * DAY_MS));
                }
            }
            for id in 0..3u8 {
                let id = FileId::new(format!("file-{id}"));
                let indexed: Vec<&str> = s.files_with_id(&id).map(|f| f.path.as_str()).collect();
                let scanned: Vec<&str> = s.files().filter(|f| f.id == id).map(|f| f.path.as_str()).collect();
                prop_assert_eq!(indexed, scanned, "{:?}", id);
            }
            let removed: Vec<&str> = s.removed_files_with_copies().map(|f| f.path.as_str()).collect();
            let with_copies = |f: &&FileRecord| f.locations.iter().any(|l| l.state != LocationState::Dropped);
            let scanned: Vec<&str> =
                s.files().filter(|f| f.removed).filter(with_copies).map(|f| f.path.as_str()).collect();
            prop_assert_eq!(removed, scanned);
            let waiting: Vec<&str> = s.files_with_backoff().map(|f| f.path.as_str()).collect();
            let scanned: Vec<&str> = s
                .files()
                .filter(|f| !f.removed && f.repl.as_ref().is_some_and(|b| b.attempts > 0 || b.next_at_ms > 0))
                .map(|f| f.path.as_str())
                .collect();
            prop_assert_eq!(waiting, scanned);
            // The old paths of live moved files whose record is live again, and the moved records
            // of each.
            let moved_from = |g: &FileRecord| {
                g.based_on.as_ref().map(|b| b.path.clone()).filter(|p| !g.removed && !g.is_dir && *p != g.path)
            };
            let left: Vec<&str> = s.left_behind_paths().collect();
            let scanned: Vec<&str> = s
                .files()
                .filter(|f| !f.removed && s.files().any(|g| moved_from(g).as_deref() == Some(f.path.as_str())))
                .map(|f| f.path.as_str())
                .collect();
            prop_assert_eq!(left, scanned);
            for old in 0..4 {
                let old = format!("/d/f{old}");
                let indexed: Vec<&str> = s.moved_records_from(&old).map(|g| g.path.as_str()).collect();
                let scanned: Vec<&str> =
                    s.files().filter(|g| moved_from(g).as_deref() == Some(old.as_str())).map(|g| g.path.as_str()).collect();
                prop_assert_eq!(indexed, scanned, "{}", old);
            }
        }
    }
}

// ---- scenarios ----

fn file_at(version: Version, locations: Vec<Location>) -> FileRecord {
    FileRecord { locations, ..file_meta(version, 100, false, 0, 0) }
}

/// Reference weakness 4: "copy locations written by different nodes" must not overwrite each
/// other; reference-facts.md "FileRecord" (`locations[{volumeId,nodeId,state,...,updated}]`).
#[test]
fn copy_locations_published_by_different_nodes_are_all_kept() {
    // n1 publishes the file with its copy on v1; n2, having pulled a copy, publishes v2 with a
    // newer metadata version that does not know of v1's copy, and n3 publishes v3.
    let by_n1 = file_at(ver(10, 0, 0), vec![location(0, ver(10, 0, 0), 2, 1, None)]);
    let by_n2 = file_at(ver(20, 0, 1), vec![location(1, ver(20, 0, 1), 3, 1, None)]);
    let by_n3 = file_at(ver(15, 0, 2), vec![location(2, ver(15, 0, 2), 2, 1, None)]);
    let records = [Record::File(by_n1), Record::File(by_n2.clone()), Record::File(by_n3)];
    for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [1, 2, 0]] {
        let s = applied(&order.map(|i| records[i].clone()));
        let f = s.file(FILE_PATH).expect("the file is there");
        let volumes: Vec<&str> = f.locations.iter().map(|l| l.volume_id.as_str()).collect();
        assert_eq!(volumes, ["v1", "v2", "v3"], "order {order:?}");
        assert_eq!(f.version, by_n2.version, "the newest metadata write wins");
    }
}

/// Reference weakness 4: a newer write to one copy (the planner marking it stale) replaces only
/// that copy.
#[test]
fn a_newer_state_of_one_copy_replaces_only_that_copy() {
    let published =
        file_at(ver(10, 0, 0), vec![location(0, ver(10, 0, 0), 3, 1, None), location(1, ver(11, 0, 1), 3, 1, None)]);
    let marked_stale = file_at(ver(10, 0, 0), vec![location(0, ver(30, 0, 2), 4, 1, None)]);
    let older_copy = file_at(ver(10, 0, 0), vec![location(0, ver(5, 0, 0), 2, 1, None)]);
    for records in [
        [Record::File(published.clone()), Record::File(marked_stale.clone()), Record::File(older_copy.clone())],
        [Record::File(older_copy.clone()), Record::File(marked_stale.clone()), Record::File(published.clone())],
    ] {
        let s = applied(&records);
        let f = s.file(FILE_PATH).expect("the file is there");
        assert_eq!(f.locations.len(), 2);
        assert_eq!(f.locations[0].state, LocationState::Stale);
        assert_eq!(f.locations[1].state, LocationState::Verified);
    }
}

/// Simulator `--races` seed 6001: a node whose records lag (they hold the file's older
/// content) marks the copy it knows of stale, later by its clock than an overwrite's copy of
/// newer content on the same volume that it has not seen yet. The mark is about bytes the
/// volume no longer holds: the overwrite's copy stays, in every order. A mark of the new
/// content still applies, and a later write of the volume's content still replaces it.
#[test]
fn a_mark_of_older_content_never_beats_a_copy_of_newer_content() {
    let first = location(0, ver(10, 0, 0), 2, 1, None);
    let overwrite = location(0, ver(20, 0, 1), 2, 2, None);
    let lagging_mark = first.relabeled(LocationState::Stale, ver(30, 0, 2));
    assert_eq!(lagging_mark.content_version(), &ver(10, 0, 0), "a re-label keeps its content's version");
    let records = [
        Record::File(file_at(ver(10, 0, 0), vec![first])),
        Record::File(file_at(ver(20, 0, 1), vec![overwrite.clone()])),
        Record::File(file_at(ver(10, 0, 0), vec![lagging_mark])),
    ];
    for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
        let s = applied(&order.map(|i| records[i].clone()));
        let f = s.file(FILE_PATH).expect("the file is there");
        assert_eq!(f.locations, std::slice::from_ref(&overwrite), "order {order:?}");
    }
    // A content version not older than the entry's own is refused: it would pin the volume.
    let pinned = Location { content: Some(ver(99, 0, 0)), ..overwrite.clone() };
    assert!(!Record::File(file_at(ver(20, 0, 1), vec![pinned])).shape_ok());
    // The new content's own marks order by their clock, as before.
    let scrubbed = overwrite.relabeled(LocationState::Stale, ver(25, 0, 0));
    let verified_later = overwrite.relabeled(LocationState::Verified, ver(26, 0, 1));
    for pair in [[scrubbed.clone(), verified_later.clone()], [verified_later.clone(), scrubbed.clone()]] {
        let s = applied(&pair.map(|l| Record::File(file_at(ver(20, 0, 1), vec![l]))));
        assert_eq!(s.file(FILE_PATH).expect("the file is there").locations, std::slice::from_ref(&verified_later));
    }
    // A copy written again (a replication's pull, a move's record) is newer content.
    let pulled = location(0, ver(27, 0, 2), 3, 2, None);
    let s = applied(&[
        Record::File(file_at(ver(20, 0, 1), vec![verified_later])),
        Record::File(file_at(ver(20, 0, 1), vec![pulled.clone()])),
    ]);
    assert_eq!(s.file(FILE_PATH).expect("the file is there").locations, [pulled]);
}

/// Reference-facts.md "FileRecord" (`locations[...]`, one per volume) and weakness 10 (any
/// member can push records): a record whose copies arrive unsorted, or with a volume listed
/// twice, is stored in canonical form, so every delivery order still converges.
#[test]
fn a_record_whose_copies_arrive_unsorted_or_repeated_converges_anyway() {
    let unsorted =
        file_at(ver(10, 0, 0), vec![location(1, ver(10, 0, 0), 2, 1, None), location(0, ver(10, 0, 0), 2, 1, None)]);
    let repeated =
        file_at(ver(10, 0, 0), vec![location(0, ver(11, 0, 0), 2, 1, None), location(0, ver(13, 0, 1), 4, 1, None)]);
    let stale_v1 = file_at(ver(10, 0, 0), vec![location(0, ver(12, 0, 2), 3, 1, None)]);
    let records = [Record::File(unsorted), Record::File(repeated), Record::File(stale_v1)];
    let want = expected(&records);
    for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
        let s = applied(&order.map(|i| records[i].clone()));
        assert_eq!(s.get(want.kind(), &want.key()), Some(&want), "order {order:?}");
        assert_eq!(s.digest(), applied(&records).digest(), "order {order:?}");
    }
    let Record::File(f) = want else { unreachable!() };
    let copies: Vec<(&str, LocationState)> = f.locations.iter().map(|l| (l.volume_id.as_str(), l.state)).collect();
    assert_eq!(copies, [("v1", LocationState::Stale), ("v2", LocationState::Committed)]);
}

fn job(version: Version, status: JobStatus, cancelled: Option<Version>) -> Job {
    Job {
        id: JobId::new("job-1"),
        spec: Box::new(JobSpec { script: "run(job)".into(), ..Default::default() }),
        state: Box::new(JobState { status, ..Default::default() }),
        state_version: version.clone(),
        lease: None,
        lease_version: version.clone(),
        removed: false,
        version,
        cancelled,
    }
}

/// Reference weakness 4: "a cancel overwritten by a worker's lease renewal"; spec "Jobs (AJR /
/// AJS)": "Cancellation marks the record; the running node interrupts its VM".
#[test]
fn a_cancel_survives_a_later_run_state_write() {
    let running = job(ver(10, 0, 0), JobStatus::Running, None);
    let cancel = Job { cancelled: Some(ver(20, 0, 1)), version: ver(20, 0, 1), ..running.clone() };
    // The worker has not seen the cancel yet; its lease renewal is newer.
    let renewal = job(ver(30, 0, 2), JobStatus::Running, None);
    for order in [[0, 1, 2], [0, 2, 1], [2, 1, 0], [1, 2, 0]] {
        let records = [Record::Job(running.clone()), Record::Job(cancel.clone()), Record::Job(renewal.clone())];
        let s = applied(&order.map(|i| records[i].clone()));
        let Some(Record::Job(j)) = s.get(shoal_core::meta::records::RecordKind::Job, "job-1") else {
            panic!("the job is there")
        };
        assert_eq!(j.cancelled, Some(ver(20, 0, 1)), "order {order:?}");
        assert_eq!(j.version, renewal.version, "the renewal is still the run state");
    }
}

/// DESIGN.md "Versions and merge": of two cancels the earlier is kept, whatever the order.
#[test]
fn of_two_cancels_the_earlier_is_kept_whatever_the_order() {
    let a = Record::Job(job(ver(10, 0, 0), JobStatus::Running, Some(ver(12, 0, 1))));
    let b = Record::Job(job(ver(10, 0, 0), JobStatus::Running, Some(ver(11, 0, 2))));
    let (ab, _) = merged(&a, &b);
    let (ba, _) = merged(&b, &a);
    assert_eq!(ab, ba);
    assert!(matches!(ab, Record::Job(Job { cancelled: Some(ref v), .. }) if *v == ver(11, 0, 2)));
}

/// DESIGN.md "Versions and merge": a volume's usage (reported by its node) and its
/// configuration (set by an admin) are separate registers.
#[test]
fn a_usage_report_does_not_roll_back_a_newer_volume_configuration() {
    let base = Volume {
        id: VolumeId::new("vol-1"),
        node_id: node(0),
        name: "drive".to_string(),
        fsh_uuid: "fsh-1".to_string(),
        subpath: "cluster".to_string(),
        read_only: false,
        evacuating: false,
        removed: false,
        version: ver(5, 0, 0),
        capacity: 100,
        free: 50,
        low_space: false,
        usage_version: ver(5, 0, 0),
    };
    let admin = Volume { read_only: true, version: ver(10, 0, 1), ..base.clone() };
    // The node's report carries its stale idea of the configuration.
    let report = Volume { free: 2, low_space: true, usage_version: ver(12, 0, 0), ..base.clone() };
    for records in [
        [Record::Volume(admin.clone()), Record::Volume(report.clone())],
        [Record::Volume(report.clone()), Record::Volume(admin.clone())],
    ] {
        let s = applied(&records);
        let Some(Record::Volume(v)) = s.get(shoal_core::meta::records::RecordKind::Volume, "vol-1") else {
            panic!("the volume is there")
        };
        assert!(v.read_only, "the admin's change stays");
        assert_eq!((v.free, v.low_space), (2, true), "the node's report lands");
    }
}

/// Reference weakness 3: equal wall time and counter are broken by node id, the same way on
/// every node.
#[test]
fn equal_wall_time_and_counter_are_broken_by_node_id() {
    let a = Record::Policy(Policy { folder: "/p".into(), replicas: 2, removed: false, version: ver(10, 3, 0) });
    let b = Record::Policy(Policy { folder: "/p".into(), replicas: 3, removed: false, version: ver(10, 3, 1) });
    assert_eq!(merged(&a, &b).0, b);
    assert_eq!(merged(&b, &a).0, b);
}

/// Spec "Metadata store (ACMS)": records of another kind or key are never merged into each
/// other.
#[test]
fn records_of_another_kind_or_key_are_left_alone() {
    let p = Record::Policy(Policy { folder: "/p".into(), replicas: 2, removed: false, version: ver(10, 0, 0) });
    let q = Record::Policy(Policy { folder: "/q".into(), replicas: 3, removed: false, version: ver(20, 0, 0) });
    let s = Record::Setting(Setting { key: "/p".into(), value: json!(1), removed: false, version: ver(30, 0, 0) });
    assert_eq!(merged(&p, &q), (p.clone(), false));
    assert_eq!(merged(&p, &s), (p.clone(), false));
}

/// DESIGN.md "Versions and merge": a delete and a later re-create order like any two writes.
#[test]
fn a_delete_and_a_later_recreate_order_like_any_two_writes() {
    let live = Record::File(file_meta(ver(10, 0, 0), 1, false, 0, 0));
    let deleted = Record::File(file_meta(ver(20, 0, 1), 1, true, 0, 0));
    let recreated = Record::File(file_meta(ver(30, 0, 2), 2, false, 0, 1));
    for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
        let records = [live.clone(), deleted.clone(), recreated.clone()];
        let s = applied(&order.map(|i| records[i].clone()));
        let f = s.file(FILE_PATH).expect("the file is there");
        assert!(!f.removed, "order {order:?}");
        assert_eq!(f.id.as_str(), "file-1");
    }
    let s = applied(&[recreated, live.clone()]);
    assert!(!s.file(FILE_PATH).expect("the file is there").removed);
    let s = applied(&[live, deleted]);
    assert!(s.file(FILE_PATH).expect("the tombstone is there").removed);
}

/// One live and one removed (newer) record of every kind.
fn live_and_tombstone_of_every_kind(live_at: Version, removed_at: Version) -> Vec<(Record, Record)> {
    let f = file_meta(live_at.clone(), 1, false, 0, 0);
    let f_removed = FileRecord { removed: true, version: removed_at.clone(), ..f.clone() };
    let v = Volume {
        id: VolumeId::new("vol-1"),
        node_id: node(0),
        name: "drive".into(),
        fsh_uuid: "fsh".into(),
        subpath: "c".into(),
        read_only: false,
        evacuating: false,
        removed: false,
        version: live_at.clone(),
        capacity: 1,
        free: 1,
        low_space: false,
        usage_version: live_at.clone(),
    };
    let v_removed = Volume { removed: true, version: removed_at.clone(), ..v.clone() };
    let p = Policy { folder: "/p".into(), replicas: 2, removed: false, version: live_at.clone() };
    let p_removed = Policy { removed: true, version: removed_at.clone(), ..p.clone() };
    let j = job(live_at.clone(), JobStatus::Succeeded, None);
    let j_removed = Job { removed: true, version: removed_at.clone(), ..j.clone() };
    let s = Setting { key: "k".into(), value: json!(1), removed: false, version: live_at };
    let s_removed = Setting { removed: true, version: removed_at, ..s.clone() };
    vec![
        (Record::File(f), Record::File(f_removed)),
        (Record::Volume(v), Record::Volume(v_removed)),
        (Record::Policy(p), Record::Policy(p_removed)),
        (Record::Job(j), Record::Job(j_removed)),
        (Record::Setting(s), Record::Setting(s_removed)),
    ]
}

/// Reference weakness 7 ("removed file records are never purged"); spec "Metadata store
/// (ACMS)": a tombstone is purged after seven days, and a stale peer's older copy arriving
/// afterwards cannot bring the record back.
#[test]
fn a_purged_tombstone_is_not_resurrected_by_an_older_copy() {
    let removed_at = ver(1_000, 0, 1);
    for (live, tombstone) in live_and_tombstone_of_every_kind(ver(0, 0, 0), removed_at.clone()) {
        let mut s = applied(&[live.clone(), tombstone.clone()]);
        assert!(s.get(live.kind(), &live.key()).expect("the tombstone is kept").is_removed());

        let eight_days_later = Millis(removed_at.wall_ms + 8 * DAY_MS);
        let purged = s.purge_tombstones(eight_days_later);
        assert_eq!(purged, vec![(live.kind(), live.key())]);
        assert!(s.is_empty());
        assert_eq!(s.digest(), MetaState::new().digest(), "the digest forgets the purged record");

        assert!(s.apply(&live).is_none(), "{:?}: the older copy is refused", live.kind());
        assert!(s.apply(&tombstone).is_none(), "{:?}: so is the tombstone itself", live.kind());
        assert!(s.get(live.kind(), &live.key()).is_none());
        assert!(s.is_empty());
    }
}

/// Spec "Metadata store (ACMS)": tombstones are kept seven days by their version's wall time,
/// so every node still has them to pass on before any node purges.
#[test]
fn a_tombstone_is_kept_for_seven_days() {
    let removed_at = ver(1_000, 0, 1);
    for (live, tombstone) in live_and_tombstone_of_every_kind(ver(0, 0, 0), removed_at.clone()) {
        let mut s = applied(&[live.clone(), tombstone]);
        assert!(s.purge_tombstones(Millis(removed_at.wall_ms + TOMBSTONE_TTL_MS)).is_empty());
        assert_eq!(s.purge_tombstones(Millis(removed_at.wall_ms + TOMBSTONE_TTL_MS + 1)).len(), 1);
        // A live record is never purged, however old.
        let mut s = applied(&[live]);
        assert!(s.purge_tombstones(Millis(removed_at.wall_ms + 365 * DAY_MS)).is_empty());
        assert_eq!(s.len(), 1);
    }
}

/// DESIGN.md "Versions and merge": a re-create newer than a purged tombstone is a new write and
/// is accepted.
#[test]
fn a_record_recreated_after_its_tombstone_was_purged_is_accepted() {
    let removed_at = ver(1_000, 0, 1);
    for (live, tombstone) in live_and_tombstone_of_every_kind(ver(0, 0, 0), removed_at.clone()) {
        let mut s = applied(&[live, tombstone.clone()]);
        s.purge_tombstones(Millis(removed_at.wall_ms + 8 * DAY_MS));
        let (recreated, _) = live_and_tombstone_of_every_kind(ver(9 * DAY_MS, 0, 2), ver(10 * DAY_MS, 0, 2))
            .into_iter()
            .find(|(r, _)| r.kind() == tombstone.kind())
            .expect("every kind is there");
        assert!(s.apply(&recreated).is_some(), "{:?}", recreated.kind());
        assert!(!s.get(recreated.kind(), &recreated.key()).expect("back").is_removed());
    }
}

/// Spec "Metadata store (ACMS)" / state.rs: purged keys are remembered up to a bound, and the
/// oldest tombstones are forgotten first; a mass delete purging many keys at once stays cheap.
#[test]
fn purged_keys_beyond_the_bound_are_forgotten_oldest_first() {
    use shoal_core::meta::state::PURGED_MAX;
    let setting = |i: usize, removed: bool| {
        Record::Setting(Setting {
            key: format!("k{i:06}"),
            value: json!(i),
            removed,
            // Key k000000 holds the oldest tombstone; every later key a newer one.
            version: ver(i as u64 + 1, 0, 0),
        })
    };
    let count = PURGED_MAX + 2;
    let mut s = MetaState::new();
    for i in 0..count {
        s.apply(&setting(i, true));
    }
    let purged = s.purge_tombstones(Millis(T0 + count as u64 + 8 * DAY_MS));
    assert_eq!(purged.len(), count);
    // The two oldest were forgotten, so their older copies are taken again; the rest are not.
    let older = |i: usize| {
        Record::Setting(Setting {
            version: ver(0, 0, 0),
            ..match setting(i, false) {
                Record::Setting(x) => x,
                _ => unreachable!(),
            }
        })
    };
    assert!(s.apply(&older(0)).is_some());
    assert!(s.apply(&older(1)).is_some());
    assert!(s.apply(&older(2)).is_none());
    assert!(s.apply(&older(count - 1)).is_none());
}

/// Purged keys survive a restart: a purge says to persist each key with its tombstone's
/// version (`MetaPersist::PutPurged`, next to the `DeleteRecord`), and a `Meta` restored with
/// those markers refuses an older copy of the record (from its own disk, or submitted by a
/// stale peer), while a newer re-create is still taken.
#[test]
fn purged_keys_are_persisted_and_restored_so_an_older_copy_stays_refused_after_a_restart() {
    use shoal_core::hlc::Hlc;
    use shoal_core::meta::lease::Candidate;
    use shoal_core::meta::log::MetaPersist;
    use shoal_core::meta::machine::{Meta, MetaConfig, MetaOutput, MetaRestored};

    let me = node(0);
    let removed_at = ver(1_000, 0, 1);
    let pairs = live_and_tombstone_of_every_kind(ver(0, 0, 0), removed_at.clone());
    let members = || vec![Candidate { id: node(0), joined: 1, eligible: true, reachable: true }];
    let persisted = |m: &mut Meta| {
        let mut out = Vec::new();
        while let Some(o) = m.poll_output() {
            if let MetaOutput::Persist(p) = o {
                out.push(p);
            }
        }
        out
    };

    // Before the restart: the tombstones are purged 8 days on.
    let mut hlc = Hlc::new(me.clone());
    let mut before = Meta::new(me.clone(), MetaConfig::default(), Millis(0));
    let records: Vec<Record> = pairs.iter().flat_map(|(l, t)| [l.clone(), t.clone()]).collect();
    before.restore(MetaRestored { records, ..MetaRestored::default() }, &mut hlc);
    persisted(&mut before);
    before.handle_timeout(Millis(1), Millis(removed_at.wall_ms + 8 * DAY_MS), members(), &mut hlc);
    let ops = persisted(&mut before);
    let mut markers = Vec::new();
    for (live, _) in &pairs {
        let key = (live.kind(), live.key());
        assert!(ops.contains(&MetaPersist::DeleteRecord(key.clone())), "{ops:?}");
        assert!(ops.contains(&MetaPersist::PutPurged(key.clone(), removed_at.clone())), "{ops:?}");
        markers.push((key, removed_at.clone()));
    }
    assert!(!ops.iter().any(|p| matches!(p, MetaPersist::DeletePurged(_))), "nothing forgotten under the bound");
    let mut remembered: Vec<_> = before.state().purged().map(|(k, v)| (k.clone(), v.clone())).collect();
    remembered.sort();
    let mut sorted = markers.clone();
    sorted.sort();
    assert_eq!(remembered, sorted);

    // After the restart: the markers come back before the records; an older copy left on disk
    // (a crash between the purge and its flush, say) is refused.
    let mut hlc = Hlc::new(me.clone());
    let mut after = Meta::new(me.clone(), MetaConfig::default(), Millis(0));
    let stale: Vec<Record> = pairs.iter().map(|(l, _)| l.clone()).collect();
    after
        .restore(MetaRestored { records: stale.clone(), purged: markers.clone(), ..MetaRestored::default() }, &mut hlc);
    assert!(after.state().is_empty(), "older copies on disk are refused");
    assert!(persisted(&mut after).is_empty(), "nothing to forget: no write at restore");

    // A stale peer submits its old copies to the (restarted) leader: refused, nothing persisted
    // or logged. A newer re-create is taken.
    after.allow_claim_now(Millis(0));
    after.handle_timeout(Millis(0), Millis(removed_at.wall_ms + 9 * DAY_MS), members(), &mut hlc);
    assert!(after.is_leader(Millis(0)), "a lone member takes the lease");
    persisted(&mut after);
    let last_seq = after.last_seq();
    let body = serde_json::to_vec(&json!({ "records": stale })).unwrap();
    let reply = after.answer_submit(Millis(1), &node(1), &body, &mut hlc);
    assert_eq!(reply.status(), 200, "{:?}", reply.body);
    assert!(after.state().is_empty(), "the stale copies are refused");
    assert_eq!(after.last_seq(), last_seq, "nothing appended");
    assert!(!persisted(&mut after).iter().any(|p| matches!(p, MetaPersist::PutRecord(_))));
    for (live, _) in &pairs {
        assert!(after.state().get(live.kind(), &live.key()).is_none());
    }
    let (recreated, _) = live_and_tombstone_of_every_kind(ver(9 * DAY_MS, 0, 2), ver(10 * DAY_MS, 0, 2))
        .into_iter()
        .next()
        .expect("every kind is there");
    let body = serde_json::to_vec(&json!({ "records": [recreated.clone()] })).unwrap();
    assert_eq!(after.answer_submit(Millis(2), &node(1), &body, &mut hlc).status(), 200);
    assert!(after.state().get(recreated.kind(), &recreated.key()).is_some_and(|r| !r.is_removed()));

    // Without the markers (the bug), the same restart would have brought the records back.
    let mut hlc = Hlc::new(me.clone());
    let mut amnesiac = Meta::new(me, MetaConfig::default(), Millis(0));
    amnesiac.restore(MetaRestored { records: stale, ..MetaRestored::default() }, &mut hlc);
    assert_eq!(amnesiac.state().len(), pairs.len());
}

/// `MetaState::restore_purged` puts purged keys back (newest version per key wins) and keeps
/// the bound, naming the keys it forgot; `purge` names the keys the bound forgets, and a clear
/// forgets every purged key.
#[test]
fn restored_purged_keys_refuse_older_copies_and_keep_the_bound() {
    use shoal_core::meta::state::PURGED_MAX;
    let removed_at = ver(1_000, 0, 1);
    for (live, tombstone) in live_and_tombstone_of_every_kind(ver(0, 0, 0), removed_at.clone()) {
        let key = (live.kind(), live.key());
        let mut s = MetaState::new();
        let older = ver(500, 0, 0);
        assert!(s.restore_purged([(key.clone(), older), (key.clone(), removed_at.clone())]).is_empty());
        assert_eq!(s.purged().collect::<Vec<_>>(), vec![(&key, &removed_at)]);
        assert!(s.apply(&live).is_none(), "{:?}", live.kind());
        assert!(s.apply(&tombstone).is_none(), "{:?}", live.kind());
        assert!(s.is_empty());
        s.clear();
        assert_eq!(s.purged().count(), 0);
        assert!(s.apply(&live).is_some(), "cleared: forgotten");
    }

    // Over the bound: the oldest are forgotten and named.
    let setting_key = |i: usize| (shoal_core::meta::records::RecordKind::Setting, format!("k{i:06}"));
    let mut s = MetaState::new();
    let forgotten = s.restore_purged((0..PURGED_MAX + 2).map(|i| (setting_key(i), ver(i as u64 + 1, 0, 0))));
    assert_eq!(forgotten, vec![setting_key(0), setting_key(1)]);
    assert_eq!(s.purged().count(), PURGED_MAX);

    // A purge over the bound names what it forgot, which may be what it just purged.
    let tomb = Record::Setting(Setting { key: "old".into(), value: json!(0), removed: true, version: ver(0, 0, 0) });
    s.apply(&tomb);
    let purge = s.purge(Millis(T0 + 8 * DAY_MS));
    assert_eq!(purge.purged, vec![((shoal_core::meta::records::RecordKind::Setting, "old".to_string()), ver(0, 0, 0))]);
    assert_eq!(purge.forgotten, vec![(shoal_core::meta::records::RecordKind::Setting, "old".to_string())]);
    assert_eq!(s.purged().count(), PURGED_MAX);
}

/// DESIGN.md "Versions and merge", issue 14: a job's run state and its lease are separate
/// registers, so the leader's newer lease (a hand-over) and a newer run-state write made
/// elsewhere both survive, whatever the order they arrive in.
#[test]
fn a_jobs_state_and_lease_merge_as_separate_registers() {
    let base = job(ver(10, 0, 0), JobStatus::Queued, None);
    let lease = JobLease { node: node(1), attempt: 1, term: 3 };
    let leased = Job { lease: Some(lease.clone()), lease_version: ver(30, 0, 1), ..base.clone() };
    let progressed = Job {
        state: Box::new(JobState { status: JobStatus::Running, progress: 0.5, ..Default::default() }),
        state_version: ver(20, 0, 2),
        ..base.clone()
    };
    let (ab, _) = merged(&Record::Job(leased.clone()), &Record::Job(progressed.clone()));
    let (ba, _) = merged(&Record::Job(progressed), &Record::Job(leased));
    assert_eq!(ab, ba);
    let Record::Job(j) = ab else { panic!("a job") };
    assert_eq!(j.lease, Some(lease));
    assert_eq!(j.state.status, JobStatus::Running);
    assert_eq!(j.state.progress, 0.5);
}

/// Issue 14: a job's end is final. A requeue written later (by a leader a partition cut off)
/// does not undo it, whatever the order the writes arrive in.
#[test]
fn a_final_job_state_is_never_replaced_by_a_later_non_final_one() {
    let done = job(ver(20, 0, 1), JobStatus::Succeeded, None);
    let requeued = job(ver(30, 0, 2), JobStatus::Queued, None);
    let (ab, _) = merged(&Record::Job(done.clone()), &Record::Job(requeued.clone()));
    let (ba, _) = merged(&Record::Job(requeued), &Record::Job(done));
    assert_eq!(ab, ba);
    let Record::Job(j) = ab else { panic!("a job") };
    assert_eq!(j.state.status, JobStatus::Succeeded);
}
