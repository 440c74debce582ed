//! Metadata records and their merges (reference-facts.md "FileRecord", "Volume", "Policy";
//! DESIGN.md "Versions and merge").
//!
//! Every record is a set of registers, each last-writer-wins on its own HLC [`Version`]:
//! - a file's metadata (id, size, checksum, removal, ...) is one register and each copy location
//!   is another, keyed by volume, so copies published by different nodes never overwrite each
//!   other (reference weakness 4);
//! - a volume's configuration (name, read-only, evacuating, removal) apart from the usage its
//!   node reports (capacity, free, low space);
//! - a job's run state apart from its cancel flag, which once set stays set;
//! - policies and settings are single registers.
//!
//! Deletion is a register value (`removed: true`) with its version, so a delete and a later
//! re-create order like any two writes, and tombstones travel in snapshots.
//! Every merge is commutative, associative and idempotent (property tests in
//! `core/tests/meta_records.rs`).

use crate::hlc::Version;
use crate::ids::{FileId, JobId, NodeId, VolumeId};
use crate::meta::job::{JobLease, JobSpec, JobState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Deepest nesting of a JSON value inside a record (a scalar is 1, `[1]` is 2). Every wire and
/// journal form of a record wraps its values in at most 8 more levels (an append body, its
/// entry list, the entry, the payload), so a record within this bound always decodes under
/// serde_json's fixed limit of 128 levels: records are decodable by construction.
pub const RECORD_VALUE_DEPTH_MAX: usize = 64;
/// Deepest nesting of a JSON value the API takes from a client (a setting, a job's arguments):
/// below [`RECORD_VALUE_DEPTH_MAX`], so the config plane's and the job runtime's own wrapping
/// of a client's value still fits a record.
pub const API_VALUE_DEPTH_MAX: usize = 32;

/// How deeply `v` nests (a scalar is 1, `[]` and `{}` are 1, `[1]` is 2), counted without
/// recursion so that no value can exhaust the stack here.
pub fn json_depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|x| (x, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// How many arrays and objects nest in the JSON text `bytes` (`[1]` is 1), read without
/// parsing or recursion (brackets inside strings do not count). For text that may be too deep to parse at all.
pub fn json_text_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LocationState {
    #[default]
    Pending,
    Writing,
    Committed,
    Verified,
    Stale,
    Failed,
    /// Deleted on purpose (a drop, a removed volume): the register's tombstone.
    Dropped,
}

impl LocationState {
    /// A copy that can be read: committed or verified.
    pub fn is_healthy(self) -> bool {
        matches!(self, LocationState::Committed | LocationState::Verified)
    }
}

/// One physical copy of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Location {
    pub volume_id: VolumeId,
    pub node_id: NodeId,
    pub state: LocationState,
    #[serde(default)]
    pub checksum: String,
    pub updated: Version,
    /// The write that put this content on the volume, when it is older than `updated`: a
    /// re-label (a copy mark, a put marking an older copy stale) keeps the version of the
    /// content it describes. `None`: `updated` is that write. The per-volume register orders by
    /// this first ([`Location::order`]), so a node whose records lag, marking the copy it knows
    /// of (older content), never beats a location of newer content it has not seen yet: the
    /// mark's clock is later, but it is about bytes the volume no longer holds (simulator
    /// `--races` seed 6001 lost an acknowledged overwrite that way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Version>,
}

impl Location {
    /// The write that put the content this location describes on its volume.
    pub fn content_version(&self) -> &Version {
        self.content.as_ref().unwrap_or(&self.updated)
    }

    /// The register's order: the newer content first, then the newer label of it.
    pub fn order(&self) -> (&Version, &Version) {
        (self.content_version(), &self.updated)
    }

    /// This copy re-labelled `state` at `updated`, still about the same content.
    pub fn relabeled(&self, state: LocationState, updated: Version) -> Location {
        let content = Some(self.content_version().clone()).filter(|c| *c != updated);
        Location { state, updated, content, ..self.clone() }
    }

    /// This copy written again at `updated` (a move's record at its new path, a leader's
    /// carry): a new write of the content, ordered as one.
    pub fn restamped(&self, updated: Version) -> Location {
        Location { updated, content: None, ..self.clone() }
    }
}

/// A file or directory of the namespace, keyed by its normalised path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    pub id: FileId,
    pub path: String,
    #[serde(default)]
    pub is_dir: bool,
    #[serde(default)]
    pub size: u64,
    /// Unix ms.
    #[serde(default)]
    pub mod_time: u64,
    #[serde(default)]
    pub checksum: String,
    #[serde(default)]
    pub owner: String,
    /// The volume holding the primary copy.
    #[serde(default)]
    pub primary: Option<VolumeId>,
    /// Copies, one per volume, sorted by volume id.
    #[serde(default)]
    pub locations: Vec<Location>,
    /// Copies wanted for this file; 0 means "the folder policy".
    #[serde(default)]
    pub replicas: u32,
    #[serde(default)]
    pub removed: bool,
    /// Version of the metadata register (everything but `locations` and `repl`).
    pub version: Version,
    /// The replication backoff of this file, a register of its own so the leader's writes
    /// never overwrite a user's (reference weakness 5: it survives a change of leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repl: Option<Box<ReplBackoff>>,
    /// The record a remove or a move was decided from (see [`BasedOn`]); `None` for any other
    /// change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub based_on: Option<Box<BasedOn>>,
}

/// What a change made from a node's own records assumed: the file at `path` had the header
/// `version`. A remove's tombstone and a move's two records carry it (the source's path and
/// version). The leader takes such a record only while its own record at `path` still has
/// that version: a node whose records lag (an overwrite acknowledged through another node has
/// not reached it yet) would otherwise write a tombstone, newer by version, over content it
/// never saw, and last-writer-wins would drop the acknowledged overwrite. The leader refuses
/// it by name instead; the deciding node undoes it ([`crate::meta::machine::Meta`]) and its
/// client gets a conflict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasedOn {
    pub path: String,
    pub version: Version,
}

/// A file's replication failures, written by the leader.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplBackoff {
    pub attempts: u32,
    /// Unix ms before which the file gets no new task.
    pub next_at_ms: u64,
    pub version: Version,
}

impl FileRecord {
    /// A change decided from this record assumes it (see [`BasedOn`]).
    pub fn based_on_this(&self) -> Box<BasedOn> {
        Box::new(BasedOn { path: self.path.clone(), version: self.version.clone() })
    }

    /// Whether `self` (a record this node holds, `current`) is the record `based` assumed.
    pub fn is_base_of(&self, based: &BasedOn) -> bool {
        self.path == based.path && self.version == based.version
    }

    /// A copy holding the file's current content: readable, and its checksum is the file's.
    pub fn is_current(&self, l: &Location) -> bool {
        l.state.is_healthy() && (l.checksum.is_empty() || l.checksum.eq_ignore_ascii_case(&self.checksum))
    }

    /// Put a location in place (per volume, the newer [`Location::order`] wins: newer content,
    /// then the newer label), keeping the list sorted.
    pub fn upsert_location(&mut self, loc: Location) -> bool {
        match self.locations.binary_search_by(|l| l.volume_id.cmp(&loc.volume_id)) {
            Ok(i) => {
                if loc.order() > self.locations[i].order() {
                    self.locations[i] = loc;
                    true
                } else {
                    false
                }
            }
            Err(i) => {
                self.locations.insert(i, loc);
                true
            }
        }
    }

    /// Put `locations` in the form the merge keeps them in (sorted by volume id, one per volume,
    /// the newest of each by [`Location::order`]), whatever order a peer sent them in. Without this, a record
    /// arriving with its copies unsorted or a volume listed twice is stored as is, the binary
    /// searches of [`FileRecord::upsert_location`] go wrong on it, and nodes that saw it first
    /// never converge with nodes that saw it later. Returns whether anything changed.
    pub fn canonicalize_locations(&mut self) -> bool {
        if self.locations.windows(2).all(|w| w[0].volume_id < w[1].volume_id) {
            return false;
        }
        for loc in std::mem::take(&mut self.locations) {
            self.upsert_location(loc);
        }
        true
    }

    pub fn healthy_locations(&self) -> impl Iterator<Item = &Location> {
        self.locations.iter().filter(|l| l.state.is_healthy())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub id: VolumeId,
    pub node_id: NodeId,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub fsh_uuid: String,
    #[serde(default)]
    pub subpath: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub evacuating: bool,
    #[serde(default)]
    pub removed: bool,
    /// Version of the configuration register (name, paths, read-only, evacuating, removed).
    pub version: Version,
    #[serde(default)]
    pub capacity: u64,
    #[serde(default)]
    pub free: u64,
    #[serde(default)]
    pub low_space: bool,
    /// Version of the usage register its node reports (capacity, free, lowSpace).
    #[serde(default)]
    pub usage_version: Version,
}

/// Copies wanted for everything under a folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub folder: String,
    pub replicas: u32,
    #[serde(default)]
    pub removed: bool,
    pub version: Version,
}

/// A job: four registers, each merged on its own version, because different nodes write
/// them: the spec and removal (the submitter, the leader's purge), the run state (the leader),
/// the lease (the leader, at each hand-over), the cancel flag (anyone, once). A final run state
/// is never replaced by one that is not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: JobId,
    /// What to run, fixed at submit.
    #[serde(default)]
    pub spec: Box<JobSpec>,
    #[serde(default)]
    pub removed: bool,
    /// Version of the spec register (with `removed`).
    pub version: Version,
    /// Status, node, attempts, progress, output...
    #[serde(default)]
    pub state: Box<JobState>,
    #[serde(default)]
    pub state_version: Version,
    /// Who may run it now; `None` when no run is under way.
    #[serde(default)]
    pub lease: Option<JobLease>,
    #[serde(default)]
    pub lease_version: Version,
    /// Set once by a cancel; a later run-state write cannot clear it.
    #[serde(default)]
    pub cancelled: Option<Version>,
}

/// A cluster-wide setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub key: String,
    #[serde(default)]
    pub value: Value,
    #[serde(default)]
    pub removed: bool,
    pub version: Version,
}

/// Any record, tagged by kind as in a log entry: `{"kind": "file", "payload": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "lowercase")]
pub enum Record {
    File(FileRecord),
    Volume(Volume),
    Policy(Policy),
    Job(Job),
    Setting(Setting),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKind {
    File,
    Volume,
    Policy,
    Job,
    Setting,
}

impl RecordKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::File => "file",
            RecordKind::Volume => "volume",
            RecordKind::Policy => "policy",
            RecordKind::Job => "job",
            RecordKind::Setting => "setting",
        }
    }
}

impl Record {
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::File(_) => RecordKind::File,
            Record::Volume(_) => RecordKind::Volume,
            Record::Policy(_) => RecordKind::Policy,
            Record::Job(_) => RecordKind::Job,
            Record::Setting(_) => RecordKind::Setting,
        }
    }

    /// The key the record is stored under within its kind.
    pub fn key(&self) -> String {
        match self {
            Record::File(r) => r.path.clone(),
            Record::Volume(r) => r.id.to_string(),
            Record::Policy(r) => r.folder.clone(),
            Record::Job(r) => r.id.to_string(),
            Record::Setting(r) => r.key.clone(),
        }
    }

    pub fn is_removed(&self) -> bool {
        match self {
            Record::File(r) => r.removed,
            Record::Volume(r) => r.removed,
            Record::Policy(r) => r.removed,
            Record::Job(r) => r.removed,
            Record::Setting(r) => r.removed,
        }
    }

    /// The version of the register that carries `removed` (what a tombstone is aged by).
    pub fn main_version(&self) -> &Version {
        match self {
            Record::File(r) => &r.version,
            Record::Volume(r) => &r.version,
            Record::Policy(r) => &r.version,
            Record::Job(r) => &r.version,
            Record::Setting(r) => &r.version,
        }
    }

    /// Every register version in the record, for the HLC to observe.
    pub fn versions(&self) -> Vec<&Version> {
        match self {
            Record::File(r) => std::iter::once(&r.version)
                .chain(r.locations.iter().map(|l| &l.updated))
                .chain(r.repl.iter().map(|b| &b.version))
                .collect(),
            Record::Volume(r) => vec![&r.version, &r.usage_version],
            Record::Policy(r) => vec![&r.version],
            Record::Job(r) => {
                [&r.version, &r.state_version, &r.lease_version].into_iter().chain(r.cancelled.iter()).collect()
            }
            Record::Setting(r) => vec![&r.version],
        }
    }

    /// The greatest version anywhere in the record.
    pub fn max_version(&self) -> Version {
        self.versions().into_iter().max().cloned().unwrap_or_default()
    }

    /// A compact, deterministic summary of every register version (for digests).
    pub fn version_fingerprint(&self) -> String {
        let mut out = format!("{}:{}", self.kind().as_str(), self.key());
        for v in self.versions() {
            out.push('|');
            out.push_str(&v.to_string());
        }
        if let Record::File(f) = self {
            for l in &f.locations {
                out.push('|');
                out.push_str(l.volume_id.as_str());
            }
        }
        out
    }

    /// Bounds every record must keep, checked on records that arrive from peers and on the
    /// node's own writes before they are stored or sent (its commands check their input first,
    /// with a clear error): a normalised path or folder, a copy entry's content version older
    /// than its own (a re-label is of content written before it: a later one would pin the
    /// volume's entry for good), a setting key of at most 256 bytes and
    /// a value of at most 64 KiB, at most 64 copies wanted, at most 64 locations, labels of at
    /// most 4 KiB, job bodies of at most 1 MiB, and no JSON value nested deeper than
    /// [`RECORD_VALUE_DEPTH_MAX`].
    pub fn shape_ok(&self) -> bool {
        self.shape_error().is_none()
    }

    /// What breaks the bounds of [`Record::shape_ok`], if anything.
    pub fn shape_error(&self) -> Option<&'static str> {
        let deep = |v: &Value| json_depth(v) > RECORD_VALUE_DEPTH_MAX;
        match self {
            Record::Job(j) if deep(&j.spec.args) || deep(&j.state.output) => {
                return Some("a job value nests too deeply")
            }
            Record::Setting(s) if deep(&s.value) => return Some("a setting value nests too deeply"),
            _ => {}
        }
        (!self.shape_ok_but_depth()).then_some("a field is malformed or over its size bound")
    }

    fn shape_ok_but_depth(&self) -> bool {
        let norm = |p: &str| crate::meta::path::normalize(p).is_ok_and(|n| n == p);
        let label = |s: &str| s.len() <= 4096;
        let json_len = |v: &Value| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX);
        match self {
            Record::File(f) => {
                norm(&f.path)
                    && f.replicas <= 64
                    && f.locations.len() <= 64
                    && label(&f.checksum)
                    && label(&f.owner)
                    && f.locations
                        .iter()
                        .all(|l| label(&l.checksum) && l.content.as_ref().is_none_or(|c| *c < l.updated))
            }
            Record::Volume(v) => label(&v.name) && label(&v.subpath) && label(&v.fsh_uuid),
            Record::Policy(p) => norm(&p.folder) && p.replicas <= 64,
            Record::Job(j) => {
                j.spec.script.len() + j.spec.name.len() <= 1 << 20
                    && json_len(&j.spec.args) <= 1 << 20
                    && j.spec.inputs.len() <= 100_000
                    && j.spec.nodes.len() <= 1024
                    && json_len(&j.state.output) <= 1 << 20
                    && j.state.log.len() <= crate::meta::job::JOB_LOG_LINES_MAX
                    && j.state.log.iter().all(|l| label(l))
                    && label(&j.state.error)
                    && label(&j.state.reason)
                    && j.state.children.len() <= 100_000
            }
            Record::Setting(s) => {
                !s.key.is_empty()
                    && s.key.len() <= 256
                    && !s.key.chars().any(|c| c.is_control() || c.is_whitespace())
                    && json_len(&s.value) <= 64 * 1024
            }
        }
    }

    /// Feed the same facts as [`Record::version_fingerprint`] to a hasher, without building a
    /// string (the digest is updated on every applied entry).
    pub fn hash_versions(&self, h: &mut impl sha2::Digest) {
        h.update(self.kind().as_str().as_bytes());
        h.update(b":");
        match self {
            Record::File(r) => h.update(r.path.as_bytes()),
            Record::Volume(r) => h.update(r.id.as_str().as_bytes()),
            Record::Policy(r) => h.update(r.folder.as_bytes()),
            Record::Job(r) => h.update(r.id.as_str().as_bytes()),
            Record::Setting(r) => h.update(r.key.as_bytes()),
        }
        let mut version = |v: &Version| {
            h.update(b"|");
            h.update(v.wall_ms.to_be_bytes());
            h.update(v.counter.to_be_bytes());
            h.update(v.node.as_str().as_bytes());
        };
        match self {
            Record::File(r) => {
                version(&r.version);
                for l in &r.locations {
                    version(&l.updated);
                }
                if let Some(b) = &r.repl {
                    version(&b.version);
                }
            }
            Record::Volume(r) => {
                version(&r.version);
                version(&r.usage_version);
            }
            Record::Policy(r) => version(&r.version),
            Record::Job(r) => {
                version(&r.version);
                version(&r.state_version);
                version(&r.lease_version);
                if let Some(c) = &r.cancelled {
                    version(c);
                }
            }
            Record::Setting(r) => version(&r.version),
        }
        if let Record::File(f) = self {
            for l in &f.locations {
                h.update(b"|");
                h.update(l.volume_id.as_str().as_bytes());
            }
        }
    }

    /// Merge `other` (same kind and key) into `self`, register by register. Returns whether
    /// `self` changed. Records of another kind or key are left alone (returns false).
    pub fn merge(&mut self, other: &Record) -> bool {
        match (self, other) {
            (Record::File(a), Record::File(b)) if a.path == b.path => merge_file(a, b),
            (Record::Volume(a), Record::Volume(b)) if a.id == b.id => merge_volume(a, b),
            (Record::Policy(a), Record::Policy(b)) if a.folder == b.folder => lww(a, b, |r| &r.version),
            (Record::Job(a), Record::Job(b)) if a.id == b.id => merge_job(a, b),
            (Record::Setting(a), Record::Setting(b)) if a.key == b.key => lww(a, b, |r| &r.version),
            _ => false,
        }
    }
}

fn lww<T: Clone>(a: &mut T, b: &T, v: impl Fn(&T) -> &Version) -> bool {
    if v(b) > v(a) {
        *a = b.clone();
        true
    } else {
        false
    }
}

fn merge_file(a: &mut FileRecord, b: &FileRecord) -> bool {
    let mut changed = a.canonicalize_locations();
    if b.version > a.version {
        let locations = std::mem::take(&mut a.locations);
        let repl = a.repl.take();
        *a = FileRecord { locations, repl, ..b.clone() };
        changed = true;
    }
    for l in &b.locations {
        changed |= a.upsert_location(l.clone());
    }
    if let Some(br) = &b.repl {
        if a.repl.as_ref().is_none_or(|ar| br.version > ar.version) {
            a.repl = Some(br.clone());
            changed = true;
        }
    }
    changed
}

fn merge_volume(a: &mut Volume, b: &Volume) -> bool {
    let mut changed = false;
    if b.version > a.version {
        a.node_id = b.node_id.clone();
        a.name = b.name.clone();
        a.fsh_uuid = b.fsh_uuid.clone();
        a.subpath = b.subpath.clone();
        a.read_only = b.read_only;
        a.evacuating = b.evacuating;
        a.removed = b.removed;
        a.version = b.version.clone();
        changed = true;
    }
    if b.usage_version > a.usage_version {
        a.capacity = b.capacity;
        a.free = b.free;
        a.low_space = b.low_space;
        a.usage_version = b.usage_version.clone();
        changed = true;
    }
    changed
}

fn merge_job(a: &mut Job, b: &Job) -> bool {
    let mut changed = false;
    if b.version > a.version {
        a.spec = b.spec.clone();
        a.removed = b.removed;
        a.version = b.version.clone();
        changed = true;
    }
    // A final state (succeeded, failed, cancelled) outranks any state that is not, whatever
    // their versions: a requeue written by a leader cut off by a partition cannot undo a job's
    // end. Among two states of the same kind the newer wins. (A max over one total order, so
    // the merge stays commutative, associative and idempotent.)
    let rank = |j: &Job| (j.state.status.is_final(), j.state_version.clone());
    if rank(b) > rank(a) {
        a.state = b.state.clone();
        a.state_version = b.state_version.clone();
        changed = true;
    }
    if b.lease_version > a.lease_version {
        a.lease = b.lease.clone();
        a.lease_version = b.lease_version.clone();
        changed = true;
    }
    // The cancel flag only ever gets set; of two cancels the earlier version is kept, so the
    // result does not depend on the order they arrive in.
    match (&a.cancelled, &b.cancelled) {
        (None, Some(v)) => {
            a.cancelled = Some(v.clone());
            changed = true;
        }
        (Some(x), Some(y)) if y < x => {
            a.cancelled = Some(y.clone());
            changed = true;
        }
        _ => {}
    }
    changed
}

/// Records of every kind, as a snapshot carries them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordSet {
    #[serde(default)]
    pub files: Vec<FileRecord>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub policies: Vec<Policy>,
    #[serde(default)]
    pub jobs: Vec<Job>,
    #[serde(default)]
    pub settings: Vec<Setting>,
}

impl RecordSet {
    pub fn into_records(self) -> impl Iterator<Item = Record> {
        self.files
            .into_iter()
            .map(Record::File)
            .chain(self.volumes.into_iter().map(Record::Volume))
            .chain(self.policies.into_iter().map(Record::Policy))
            .chain(self.jobs.into_iter().map(Record::Job))
            .chain(self.settings.into_iter().map(Record::Setting))
    }

    pub fn push(&mut self, r: Record) {
        match r {
            Record::File(x) => self.files.push(x),
            Record::Volume(x) => self.volumes.push(x),
            Record::Policy(x) => self.policies.push(x),
            Record::Job(x) => self.jobs.push(x),
            Record::Setting(x) => self.settings.push(x),
        }
    }
}

/// Kind and key: where a record lives.
pub type RecordKey = (RecordKind, String);

/// A map of records by kind and key, the shape [`crate::meta::state::MetaState`] keeps.
pub type RecordMap = BTreeMap<RecordKey, Record>;
