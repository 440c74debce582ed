//! The manifests compiled into this build: every built-in subsystem is a module declaring its
//! tunables (DESIGN.md "Configuration"). Each built-in key falls back to the predefined key of
//! the same name (`membership.heartbeat_interval`, ...), so a mesh or node value of it applies,
//! and the predefined list of a build is the set of those names.

use super::resolve::Manifest;
use super::types::{Declaration, KeyType};
use crate::identity::{ARGON2_LANES, ARGON2_MEMORY_KIB, ARGON2_TIME};
use serde_json::{json, Value};

/// The build these manifests come with (a node resolves against the build it runs).
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

struct Key {
    name: &'static str,
    ty: KeyType,
    default: Value,
    min: Option<f64>,
    max: Option<f64>,
    trusted: bool,
    choices: &'static [&'static str],
    doc: &'static str,
}

fn key(name: &'static str, ty: KeyType, default: Value, doc: &'static str) -> Key {
    Key { name, ty, default, min: None, max: None, trusted: false, choices: &[], doc }
}

impl Key {
    fn range(mut self, min: f64, max: f64) -> Key {
        self.min = Some(min);
        self.max = Some(max);
        self
    }

    /// The values an enum takes.
    fn choices(mut self, choices: &'static [&'static str]) -> Key {
        self.choices = choices;
        self
    }

    /// A key whose cluster-wide value takes an approved proposal (mesh-config "trusted").
    fn trusted(mut self) -> Key {
        self.trusted = true;
        self
    }
}

/// A scheduling weight: a number in [0, 1].
fn weight(name: &'static str, default: f64, doc: &'static str) -> Key {
    key(name, KeyType::Float, json!(default), doc).range(0.0, 1.0)
}

fn manifest(module: &str, keys: Vec<Key>) -> Manifest {
    Manifest {
        module: module.to_string(),
        keys: keys
            .into_iter()
            .map(|k| Declaration {
                name: k.name.to_string(),
                ty: k.ty,
                default: Some(k.default),
                required: false,
                min: k.min,
                max: k.max,
                pattern: None,
                choices: k.choices.iter().map(|c| c.to_string()).collect(),
                fallback: Some(format!("{module}.{}", k.name)),
                trusted: k.trusted,
                renamed_from: None,
                doc: k.doc.to_string(),
            })
            .collect(),
    }
}

const S: u64 = 1_000;
const MIN: u64 = 60 * S;
const H: u64 = 60 * MIN;
const D: u64 = 24 * H;
const MIB: u64 = 1024 * 1024;

/// Every built-in module's manifest, by module name.
pub fn manifests() -> Vec<Manifest> {
    use KeyType::*;
    vec![
        manifest(
            "membership",
            vec![
                key("heartbeat_interval", Duration, json!(15 * S), "how often a node sends heartbeats")
                    .range(100.0, (10 * MIN) as f64),
                key("heartbeat_timeout", Duration, json!(20 * S), "how long a heartbeat may take")
                    .range(100.0, (10 * MIN) as f64),
                key("online_within", Duration, json!(45 * S), "heard from within this long: ONLINE")
                    .range(100.0, D as f64),
                key("unknown_within", Duration, json!(180 * S), "silent up to this long: UNKNOWN, then OFFLINE")
                    .range(100.0, 7.0 * D as f64),
                key("tombstone_age", Duration, json!(7 * D), "how long a removed member's record is kept")
                    .range(H as f64, 365.0 * D as f64),
                key("degraded_cpu_pct", Float, json!(97.0), "CPU use at which a node counts as DEGRADED")
                    .range(1.0, 100.0),
                key("degraded_ram_pct", Float, json!(97.0), "RAM use at which a node counts as DEGRADED")
                    .range(1.0, 100.0),
                key("degraded_disk_free_pct", Float, json!(2.0), "free disk below which a node counts as DEGRADED")
                    .range(0.0, 50.0),
                key("latency_alpha", Float, json!(0.3), "weight of a new sample in the latency average")
                    .range(0.01, 1.0),
                key("state_tick", Duration, json!(5 * S), "how often node states are recomputed")
                    .range(100.0, (10 * MIN) as f64),
            ],
        ),
        manifest(
            "meta",
            vec![
                key("lease", Duration, json!(30 * S), "the metadata leader's lease").range(1_000.0, (10 * MIN) as f64),
                key("lease_renew_every", Duration, json!(10 * S), "how often the leader renews")
                    .range(100.0, (5 * MIN) as f64),
                key("compact_every", Int, json!(1_000), "compact the log every this many writes").range(10.0, 1e9),
                key("keep_entries", Int, json!(10_000), "log entries kept after a compaction").range(100.0, 1e9),
                key("lease_check_every", Duration, json!(5 * S), "how often leases are checked")
                    .range(100.0, (5 * MIN) as f64),
                key("request_timeout", Duration, json!(20 * S), "how long a metadata request may take")
                    .range(100.0, (10 * MIN) as f64),
                key("submit_retry", Duration, json!(15 * S), "how soon an unanswered submit is sent again")
                    .range(100.0, (10 * MIN) as f64),
                key("anti_entropy_every", Duration, json!(30 * S), "how often digests are compared")
                    .range(1_000.0, D as f64),
                key("purge_every", Duration, json!(60 * S), "how often old tombstones are purged")
                    .range(1_000.0, D as f64),
                key("page_max", Int, json!(500), "log entries per catch-up page").range(1.0, 100_000.0),
                key("snapshot_page_max", Int, json!(2_000), "records per snapshot page").range(1.0, 1e6),
                key("batch_max", Int, json!(500), "records per submit or append").range(1.0, 100_000.0),
                key("submit_window", Int, json!(1), "submits a follower keeps in flight to the leader").range(1.0, 64.0),
                key(
                    "append_gap",
                    Duration,
                    json!(crate::meta::machine::APPEND_GAP_MS),
                    "least time between appends to a follower when no acknowledgement waits on it",
                )
                .range(0.0, 1_000.0),
                key(
                    "ack",
                    Enum,
                    json!("replicated"),
                    "when a change is acknowledged: replicated (another node holds it), durable (also fsynced here), local (at once)",
                )
                .choices(&["replicated", "durable", "local"]),
                key("ack_wait", Duration, json!(5 * S), "how long an acknowledgement waits for another node to hold a change")
                    .range(0.0, (10 * MIN) as f64),
            ],
        ),
        manifest(
            "storage",
            vec![
                key("auto_read_only", Bool, json!(true), "the low-space guard"),
                key("low_space_enter_pct", Float, json!(5.0), "read-only below this % free").range(0.0, 50.0),
                key("low_space_leave_pct", Float, json!(7.0), "writable again above this % free").range(0.0, 50.0),
                key("scrub_rate", Bytes, json!(20 * MIB), "bytes per second the scrubber reads").range(1.0, 1e12),
                key("scrub_min_age", Duration, json!(D), "a copy is re-checked once its last check is this old")
                    .range(0.0, 14.0 * D as f64),
                key("rescan_every", Duration, json!(30 * MIN), "how often volume folders are rescanned")
                    .range(MIN as f64, 7.0 * D as f64),
                key("usage_every", Duration, json!(60 * S), "how often a node measures its volumes")
                    .range(1_000.0, D as f64),
                key("reconcile_every", Duration, json!(10 * S), "how often a node makes its disks follow the records")
                    .range(1_000.0, H as f64),
            ],
        ),
        manifest(
            "replication",
            vec![
                key("plan_every", Duration, json!(60 * S), "how often the leader plans").range(1_000.0, D as f64),
                key("per_node_max", Int, json!(4), "tasks per node at once").range(1.0, 1_000.0),
                key("in_flight_max", Int, json!(16), "tasks in flight in all").range(1.0, 100_000.0),
                key("stale_after_offline", Duration, json!(10 * MIN), "copies on a node OFFLINE this long turn stale")
                    .range(MIN as f64, 30.0 * D as f64),
                key("backoff_base", Duration, json!(30 * S), "first wait after a failed task").range(1_000.0, D as f64),
                key("task_lease", Duration, json!(30 * S), "a task's lease, renewed by its worker")
                    .range(1_000.0, H as f64),
                key("backoff_failures_max", Int, json!(5), "failures after which a file waits give_up")
                    .range(1.0, 100.0),
                key("give_up", Duration, json!(H), "how long a file waits after backoff_failures_max failures")
                    .range(1_000.0, 30.0 * D as f64),
            ],
        ),
        manifest(
            "events",
            vec![key(
                "allowed_origins",
                List,
                json!([]),
                "browser origins (scheme://host:port) that may open the events WebSocket besides the node's own",
            )],
        ),
        manifest(
            "jobs",
            vec![
                key("enabled", Bool, json!(true), "whether this node runs jobs at all"),
                key("slots", Int, json!(0), "jobs run at once on a node (0: its CPU core count)").range(0.0, 1_024.0),
                key("pass_every", Duration, json!(3 * S), "how often the leader schedules")
                    .range(100.0, (10 * MIN) as f64),
                key("lease", Duration, json!(30 * S), "a running job's lease, renewed by its node every third of it")
                    .range(12_000.0, H as f64),
                key("retention", Duration, json!(72 * H), "how long finished jobs are kept")
                    .range(MIN as f64, 365.0 * D as f64),
                key("memory_limit", Bytes, json!(256 * MIB), "memory one script may use")
                    .range(MIB as f64, 64.0 * 1024.0 * MIB as f64),
                key(
                    "exec_allowed",
                    List,
                    json!([]),
                    "host programs scripts may run with exec (each must be in the node's capabilities)",
                )
                .trusted(),
            ],
        ),
        manifest(
            "identity",
            vec![
                key("session_idle", Duration, json!(12 * H), "a session unused this long ends")
                    .range(S as f64, 30.0 * D as f64),
                key("session_max", Duration, json!(7 * D), "a session ends this long after its login")
                    .range(S as f64, 365.0 * D as f64),
                key("argon2_memory_kib", Int, json!(19_456), "argon2id memory cost of a password hash, KiB")
                    .range(ARGON2_MEMORY_KIB.0 as f64, ARGON2_MEMORY_KIB.1 as f64),
                key("argon2_time", Int, json!(2), "argon2id passes over that memory")
                    .range(ARGON2_TIME.0 as f64, ARGON2_TIME.1 as f64),
                key("argon2_lanes", Int, json!(1), "argon2id lanes").range(ARGON2_LANES.0 as f64, ARGON2_LANES.1 as f64),
                key(
                    "origin",
                    String,
                    json!(""),
                    "the member whose accounts every node signs in with (empty: the node that created the cluster)",
                )
                .trusted(),
                key("forward_timeout", Duration, json!(12 * S), "how long a login waits for the identity origin")
                    .range(100.0, (2 * MIN) as f64),
                key("sync_every", Duration, json!(5 * MIN), "how often members copy the origin's account directory")
                    .range(1_000.0, D as f64),
            ],
        ),
        manifest(
            "scheduling",
            vec![
                weight("weight.locality", 0.45, "share of the work's input bytes already on the node"),
                weight("weight.cpu", 0.20, "free CPU from the node's health report"),
                weight("weight.memory", 0.10, "free memory from the node's health report"),
                weight("weight.disk", 0.05, "largest free fraction among the node's volumes"),
                weight("weight.queue", 0.10, "penalty for queued work, full at 8 items"),
                weight("weight.latency", 0.05, "penalty for the round trip, full at 1000 ms"),
                weight("weight.health", 0.05, "penalty when the node is DEGRADED"),
                weight("weight.features", 0.10, "optional features a job prefers"),
                weight("weight.diversity", 0.05, "how far a new copy sits from the existing ones"),
            ],
        ),
    ]
}

/// The predefined keys of this build, with the declaration each resolves by.
#[allow(dead_code)]
pub fn predefined() -> Vec<Declaration> {
    manifests()
        .into_iter()
        .flat_map(|m| {
            let module = m.module.clone();
            m.keys.into_iter().map(move |mut d| {
                d.name = format!("{module}.{}", d.name);
                d.fallback = None;
                d
            })
        })
        .collect()
}
