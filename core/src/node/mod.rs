//! The node state machine: membership, join tokens and ACN request handling of one node
//! (spec: cluster-runtime.md "ACN", "Membership", "Joining", "Admin API").
//!
//! Calling protocol (after quinn-proto's `Connection`):
//! - feed inputs with [`Node::handle`] (completions of requests the node asked for, health and
//!   capability samples), [`Node::handle_acn`] (an incoming node-to-node request, answered at
//!   once) and the admin commands (`create_cluster`, `new_token`, ...);
//! - after every call drain [`Node::poll_output`] until `None` and carry out each output
//!   (send a request, persist a change, log an event);
//! - arm one timer at [`Node::poll_timeout`] and call [`Node::handle_timeout`] when it passes.
//!
//! Outgoing requests are signed here (the nonce comes from the node's seeded RNG), so a
//! simulated run replays byte for byte.
//!
//! Two clocks: `now` handed in is the wall clock (signatures, versions, tokens, tombstones).
//! Liveness, latency and timers run on a monotonic clock derived from it, which follows the wall
//! clock forward but ignores steps backward, so a clock set back by minutes cannot make a dead
//! peer look alive or stall heartbeats.

use crate::acn::{self, AcnError, Incoming, SignedHeaders, Verifier};
pub use crate::answer::{ApiError, ErrorKind, PeerAnswer, Reply};
use crate::hlc::Hlc;
use crate::ids::{is_uuid, ClusterId, NodeId, TokenId};
use crate::membership::{Membership, MembershipConfig, MergeOutcome, NodeState, Trust};
use crate::meta::log::MetaPersist;
use crate::meta::machine::{Meta, MetaConfig, MetaOutput, MetaPurpose, MetaRestored};
use crate::records::{AdminState, Capabilities, ClusterInfo, Health, NodeRecord, OwnerFields};
use crate::rng::SeededRng;
use crate::time::Millis;
use crate::token::{JoinToken, TokenBook, TokenError, TokenRecord};
use clock::MonoClock;

pub mod access;
mod admin;
pub mod audit;
mod builds;
pub mod chores;
mod clock;
pub mod config;
mod config_pass;
mod config_windows;
pub mod events;
pub mod files;
mod gossip;
pub mod identity;
pub mod jobs;
pub mod landed;
pub mod meta;
pub mod metrics;
mod peers;
pub mod replication;
pub mod rescan;
pub mod sched;
pub mod tunnel;
pub mod volumes;
pub use admin::{
    AdminStateSet, LeftCluster, NewToken, NodeConfigured, NodeRemoved, NodeStatus, Readiness, TokenList, TokenRevoked,
};
pub use audit::AuditList;
pub use builds::{ModuleInstalled, ModuleList, ModulePlaced, ModuleView, PlacedOn};
pub use config_windows::{
    ConfigEvents, Finding, Findings, RenameList, RenameView, RetireAnswered, Retiring, RetiringList, WindowHolder,
};
pub use meta::{
    AckMode, AckPlan, AckReached, CopyView, Listing, NodeMetaStatus, PolicyList, SettingList, Stat, ACK_WAIT_MS,
    SETTING_VALUE_MAX_BYTES,
};
pub use peers::ACN_ENDPOINTS;

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};

pub const ACN_PREFIX: &str = "/cluster/acn/";

/// What the node is told about itself by its operator and its host.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfInfo {
    pub name: String,
    pub advertise_url: String,
    pub software_version: String,
    pub capabilities: Capabilities,
    /// SHA-256 (hex) of the certificate this node serves HTTPS with, empty on plain HTTP: it
    /// goes in the owner-signed record, and peers pin it (issue 15).
    pub tls_pin: String,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeConfig {
    pub membership: MembershipConfig,
    pub meta: MetaConfig,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PersistOp {
    PutCluster(ClusterInfo),
    /// The node left (or was removed): wipe every cluster table.
    ClearCluster,
    PutRecord(Box<NodeRecord>),
    DeleteRecord(NodeId),
    PutPurged(NodeId),
    PutToken(TokenRecord),
    DeleteToken(TokenId),
    /// The folders this node contributed as volumes, whole: kept beside (never in) the
    /// replicated metadata, so no record another member writes can add to it.
    PutOwnVolumes(Vec<(crate::ids::VolumeId, String)>),
    /// This node's accounts, groups, sessions and keys (`identity.rs`): the node's own, kept
    /// when it leaves a cluster.
    Identity(crate::identity::IdentityOp),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    MemberAdded(NodeId),
    MemberRemoved(NodeId),
    StateChanged {
        node: NodeId,
        from: NodeState,
        to: NodeState,
    },
    /// This node was removed from its cluster and has left it.
    RemovedSelf,
    /// This node's own store refuses writes (the error), or works again.
    StoreFailing(String),
    StoreWorks,
    /// A config value was set, cleared or approved (`config.changed`).
    ConfigChanged {
        level: String,
        moved: usize,
    },
    /// The leader's config passes moved renamed or retired values.
    ConfigRenames {
        did: Vec<String>,
    },
    /// Resolved values that changed were taken into the running node.
    ConfigApplied {
        changed: Vec<String>,
    },
    /// The metadata store refused an entry or record (from a peer, from disk, or one of ours by
    /// a peer) and went on past it.
    MetaRefused {
        from: Option<NodeId>,
        what: String,
        why: String,
    },
    /// A replication task's lease ran out on this leader: counted as a failure of its file.
    ReplTaskExpired {
        path: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct OutRequest {
    pub token: u64,
    pub to: NodeId,
    /// Where to send it (the peer's advertised URL); the route is the shell's to pick.
    pub url: String,
    pub method: &'static str,
    /// Path and query, e.g. `/cluster/acn/heartbeat`.
    pub target: String,
    pub body: Vec<u8>,
    /// Decided here (signer, time, nonce), computed by the carrier: [`OutRequest::headers`].
    pub signature: acn::PendingSignature,
    pub timeout_ms: u64,
}

impl OutRequest {
    /// The signed headers of this request (Ed25519 over its method, target and body): computed
    /// on each call, by whoever sends it, so the node's lock is not held for it.
    pub fn headers(&self) -> SignedHeaders {
        self.signature.headers(self.method, &self.target, &self.body)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Send(OutRequest),
    Persist(PersistOp),
    /// A metadata write, for the shell's write-behind store.
    Meta(MetaPersist),
    Event(Event),
    /// This node's resolved config moved: write `DATA/config/<module>.json` for each module
    /// (DESIGN.md "Configuration"), for user programs to read.
    ConfigFiles(BTreeMap<String, BTreeMap<String, crate::config::resolve::Resolved>>),
    /// A chore that is I/O is due: carry it out and report its end with [`Node::chore_done`]
    /// (`chores.rs`).
    Chore(crate::storage::chores::Chore),
    /// The scrub's next copy: hash it and report with [`Node::scrub_result`].
    ScrubCopy(files::LocalCopy),
    /// Leader: send a replication task granted its lease just now, under `term`.
    ReplDispatch {
        term: u64,
        task: crate::storage::planner::Task,
    },
    /// A health sample is due (every heartbeat interval): read CPU, memory and disk and hand
    /// them back as [`Input::Health`].
    SampleHealth,
    /// A job was handed to this node: run its script, report with [`Node::job_progress`],
    /// [`Node::job_log`] and [`Node::job_finished`].
    JobRun(Box<jobs::JobRun>),
    /// Stop a running script (cancelled, timed out, or its lease is lost).
    JobStop {
        job: crate::ids::JobId,
        attempt: u32,
        why: jobs::StopWhy,
    },
    /// Open this node's reverse tunnel to `host` at `url` (`GET /cluster/acn/tunnel`, signed);
    /// report with [`Node::tunnel_opened`] and, when it fails or ends, [`Node::tunnel_closed`].
    TunnelOpen {
        host: NodeId,
        url: String,
    },
    /// Close this node's tunnel to `host`: it is no longer wanted.
    TunnelClose {
        host: NodeId,
    },
    /// Broadcast a Wake-on-LAN magic packet on this node's LAN for each of these MAC addresses
    /// (`crate::wake::magic_packet`).
    WakeBroadcast {
        macs: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A peer's answer to a request this node asked for, or why none came.
    Response {
        token: u64,
        result: Result<PeerAnswer, String>,
    },
    Health(Health),
    Capabilities(Capabilities),
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        let kind = match e {
            TokenError::Unknown => ErrorKind::NotFound,
            TokenError::NoIssuerUrl => ErrorKind::Conflict,
            TokenError::UsedUp | TokenError::Revoked | TokenError::Expired | TokenError::BadSecret => {
                ErrorKind::Forbidden
            }
            _ => ErrorKind::Invalid,
        };
        ApiError::new(kind, "bad_token", e.to_string())
    }
}

/// A record plus what this node computes about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    #[serde(flatten)]
    pub record: NodeRecord,
    pub state: NodeState,
    pub local: bool,
    /// A live tunnel links this node and that one (hosted here, or this node's own to it).
    pub tunnel: bool,
    /// How this node reaches it: `direct`, `tunnel (hosted here)`, `relay via X`, `self`, or
    /// `unreachable` (no URL and no tunnel known).
    #[serde(default)]
    pub route: String,
    pub latency_ms: f64,
}

/// `POST /cluster/acn/join` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinBody {
    pub cluster_id: ClusterId,
    pub token_id: TokenId,
    pub secret: String,
    pub node: NodeRecord,
}

/// What the joiner must send, and where.
#[derive(Clone, Debug)]
pub struct JoinPlan {
    pub url: String,
    /// The issuer's certificate pin, for an `https://` URL (the token carries it).
    pub pin: String,
    pub body: Vec<u8>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct MembersBody {
    nodes: Vec<NodeRecord>,
    #[serde(default)]
    cluster: Option<ClusterInfo>,
    /// Sender's clock, unix ms.
    #[serde(default, rename = "timeMs")]
    time_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct HeartbeatBody {
    node: NodeRecord,
    #[serde(default)]
    cluster: Option<ClusterInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Purpose {
    Heartbeat,
    Push,
    /// A worker renewing its task's lease (`replication.rs`); the answer is only a sign of life.
    TaskRenew,
    /// The leader gathering a member's latency row for the matrix (`sched.rs`).
    Latency,
    /// A batch of events sent to a member (`events.rs`).
    Events,
    /// The leader handing a job's run to a node, a worker's renewal, its outcome (`jobs.rs`).
    JobHandOver {
        job: crate::ids::JobId,
        attempt: u32,
    },
    JobRenew {
        job: crate::ids::JobId,
        attempt: u32,
    },
    JobDone {
        job: crate::ids::JobId,
        attempt: u32,
    },
    Meta(MetaPurpose),
    /// A member copying the identity origin's directory, or writing a password back to it
    /// (`identity.rs`).
    Directory,
    WriteBack {
        name: String,
        hash: String,
    },
}

#[derive(Clone, Debug)]
struct InFlight {
    peer: NodeId,
    /// Monotonic time sent (for round trips and staleness).
    sent: Millis,
    /// Wall time sent (for the peer's clock offset).
    sent_wall: Millis,
    purpose: Purpose,
}

type ConfigMemo = std::cell::RefCell<
    Option<(u64, std::sync::Arc<BTreeMap<String, BTreeMap<String, crate::config::resolve::Resolved>>>)>,
>;

pub struct Node {
    id: NodeId,
    key: std::sync::Arc<SigningKey>,
    rng: SeededRng,
    hlc: Hlc,
    config: NodeConfig,
    /// The config the node was started (or last `set_config`) with; resolved config values set
    /// somewhere are laid over it, and a cleared value falls back to it.
    base_config: NodeConfig,
    me: SelfInfo,
    /// This node's own reverse tunnel (`tunnel.rs`), the host the admin prefers, and the
    /// members whose tunnel to this node is live.
    tunnel: crate::tunnel::TunnelClient,
    tunnel_preferred: Option<NodeId>,
    linked: std::collections::BTreeSet<NodeId>,
    /// The built-in manifests of the build this node runs (`me.software_version`).
    build_manifests: Vec<crate::config::resolve::Manifest>,
    cluster: Option<ClusterInfo>,
    members: Membership,
    tokens: TokenBook,
    verifier: Verifier,
    outputs: VecDeque<Output>,
    next_token: u64,
    in_flight: BTreeMap<u64, InFlight>,
    heartbeat_due: Option<Millis>,
    /// Heartbeat rounds sent since start (a metric).
    heartbeats_sent: u64,
    /// Signed requests refused by the verifier since start (a metric).
    acn_refused: u64,
    /// Set by a metadata rebuild: rescan the volumes once the metadata came back from a leader.
    rescan_after_rebuild: bool,
    /// This node's volumes at its start whose bytes overwrites kept aside before a restart are
    /// not known yet: each is known once a rescan of this run has walked it
    /// (`transfer::parse_kept_file_name`); until then every rename, delete and moved-copy read
    /// that kept bytes could hold there waits ([`Node::rename_waits_for_kept`]), or a rename
    /// would carry the bytes landed over them.
    kept_unwalked: std::collections::BTreeSet<crate::ids::VolumeId>,
    /// Why this node's own store refuses writes now (its data dir is full, say); `None` when
    /// it works.
    store_failure: Option<String>,
    tick_due: Option<Millis>,
    last_states: BTreeMap<NodeId, NodeState>,
    pending_join: Option<JoinToken>,
    health: Option<Health>,
    clock: MonoClock,
    meta: Meta,
    /// When and at what free space each local volume's usage was last reported.
    volume_reported: BTreeMap<crate::ids::VolumeId, (Millis, u64)>,
    /// The folders this node itself contributed as volumes (`volume add` here), by volume id.
    /// A volume record counts as this node's only when it names one of these with its folder.
    own_volumes: BTreeMap<crate::ids::VolumeId, String>,
    /// Leader: replication tasks in flight and their leases (`replication.rs`).
    repl_tasks: crate::storage::tasks::TaskLeases,
    /// Leader: the files the last full planner pass left for the task limits, planned again
    /// as tasks end (`chores.rs` `dispatch_backlog`).
    repl_backlog: std::collections::VecDeque<String>,
    /// The latency matrix the leader gathered for site diversity, and when.
    latency: sched::LatencyCache,
    /// The event bus: the ring subscribers read, de-duplication, each peer's outbox.
    bus: crate::events::EventBus,
    /// When this node next computes its `node.*` events, and what it saw last time.
    node_events_due: Millis,
    node_view: events::NodeView,
    /// When the shell is next asked for a health sample, and whether it was asked yet.
    health_due: Millis,
    health_asked: bool,
    /// When the config pass is due next (`config.rs` `config_timeout`), and what it last
    /// applied.
    config_due: Millis,
    config_applied: Option<BTreeMap<String, BTreeMap<String, crate::config::resolve::Resolved>>>,
    /// The last [`Node::config_resolved_own`] and the fingerprint of its inputs.
    config_memo: ConfigMemo,
    /// Bytes put in place that the records may not account for yet (`landed.rs`).
    landed: crate::storage::landed::LandedBytes,
    /// When each background chore is due (`chores.rs`), the copies the scrub checks next, and
    /// what replication and scrubbing did.
    chores: crate::storage::chores::Chores,
    scrub_pending: VecDeque<files::LocalCopy>,
    repl_stats: chores::ReplStats,
    /// Worker: the tasks this node carries out (`replication.rs`).
    working: BTreeMap<crate::ids::FileId, replication::Working>,
    /// Jobs: the leader's lease clock and pass, the worker's runs (`jobs.rs`).
    jobs: jobs::JobsBook,
    /// Accounts, groups, sessions and API keys (`identity.rs`).
    identity: crate::identity::Identity,
    /// When this member next copies the origin's directory, and the origin it last saw.
    identity_sync_due: Millis,
    identity_synced_at: Millis,
    identity_origin_seen: Option<NodeId>,
    /// The user assertions this node took (their nonces, until they expire).
    assertions: crate::identity::assertion::AssertionVerifier,
    /// Admin acts not in the audit log yet, and when they go (`audit.rs`).
    audit_acts: Vec<audit::AuditAct>,
    audit_due: Option<Millis>,
}

/// What the shell read back from disk.
#[derive(Clone, Debug, Default)]
pub struct Restored {
    pub cluster: Option<ClusterInfo>,
    pub records: Vec<NodeRecord>,
    pub tokens: Vec<TokenRecord>,
    pub purged: Vec<NodeId>,
    pub meta: MetaRestored,
    /// This node's own volumes as persisted; `None` when never written (a data dir from before
    /// the list was kept: it is adopted once from the volume records).
    pub own_volumes: Option<Vec<(crate::ids::VolumeId, String)>>,
    pub identity: crate::identity::IdentityRestored,
}

/// The headers of a request with its canonical string, for checking its signature later.
fn signed_proof<'a>(
    method: &str,
    target: &str,
    headers: Option<&'a SignedHeaders>,
    body: &[u8],
) -> Option<(&'a SignedHeaders, String)> {
    headers.map(|h| (h, acn::canonical_string(method, target, &h.cluster, &h.node, &h.timestamp, &h.nonce, body)))
}

/// Parse a member-list body, or the 400 to answer.
fn members_body(body: &[u8], what: &str) -> Result<MembersBody, Reply> {
    serde_json::from_slice(body).map_err(|e| Reply::error(ErrorKind::Invalid, "bad_body", format!("{what} body: {e}")))
}

fn err_reply(e: AcnError) -> Reply {
    Reply::from(ApiError::from(e))
}

impl Node {
    pub fn new(id: NodeId, key: SigningKey, seed: u64, config: NodeConfig, me: SelfInfo) -> Node {
        let id_for_meta = id.clone();
        let meta_config = config.meta.clone();
        Node {
            hlc: Hlc::new(id.clone()),
            members: Membership::new(id.clone(), config.membership.clone()),
            id,
            key: std::sync::Arc::new(key),
            rng: SeededRng::new(seed),
            base_config: config.clone(),
            config,
            me,
            tunnel: Default::default(),
            tunnel_preferred: None,
            linked: Default::default(),
            build_manifests: crate::config::builtin::manifests(),
            cluster: None,
            tokens: TokenBook::default(),
            verifier: Verifier::default(),
            outputs: VecDeque::new(),
            next_token: 1,
            in_flight: BTreeMap::new(),
            heartbeat_due: None,
            heartbeats_sent: 0,
            acn_refused: 0,
            rescan_after_rebuild: false,
            kept_unwalked: std::collections::BTreeSet::new(),
            store_failure: None,
            tick_due: None,
            last_states: BTreeMap::new(),
            pending_join: None,
            health: None,
            clock: MonoClock::default(),
            meta: Meta::new(id_for_meta, meta_config, Millis::ZERO),
            volume_reported: BTreeMap::new(),
            own_volumes: BTreeMap::new(),
            repl_tasks: Default::default(),
            repl_backlog: Default::default(),
            latency: Default::default(),
            bus: crate::events::EventBus::new(),
            node_events_due: Millis::ZERO,
            node_view: Default::default(),
            health_due: Millis::ZERO,
            health_asked: false,
            config_due: Millis::ZERO,
            config_applied: None,
            config_memo: Default::default(),
            landed: Default::default(),
            chores: Default::default(),
            scrub_pending: VecDeque::new(),
            repl_stats: Default::default(),
            working: BTreeMap::new(),
            jobs: Default::default(),
            identity: Default::default(),
            identity_sync_due: Millis::ZERO,
            identity_synced_at: Millis::ZERO,
            identity_origin_seen: None,
            assertions: Default::default(),
            audit_acts: Vec::new(),
            audit_due: None,
        }
    }

    /// Bring back the state persisted before a restart. Heartbeats start at once.
    pub fn restore(&mut self, wall: Millis, r: Restored) {
        let now = self.advance_clocks(wall);
        for rec in &r.records {
            self.hlc.observe(&rec.owner_version);
            for m in [&rec.admin, &rec.removal].into_iter().flatten() {
                self.hlc.observe(&m.version);
            }
        }
        self.cluster = r.cluster;
        for rec in r.records {
            self.members.insert(rec);
        }
        for id in r.purged {
            self.members.remember_purged(id);
        }
        self.tokens = TokenBook::from_records(r.tokens);
        self.identity = crate::identity::Identity::restore(r.identity);
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        if self.cluster.is_some() {
            self.meta.restore(r.meta, &mut self.hlc);
            match r.own_volumes {
                Some(own) => self.own_volumes = own.into_iter().collect(),
                None => self.adopt_own_volumes(),
            }
            self.kept_unwalked = self.own_volumes.keys().cloned().collect();
        } else if !r.meta.records.is_empty()
            || !r.meta.pending.is_empty()
            || r.meta.log_meta.is_some()
            || !r.meta.purged.is_empty()
        {
            // Metadata left over from a cluster this node left just before a crash.
            self.push_output(Output::Meta(MetaPersist::Clear));
        }
        if self.cluster.is_some() {
            if self.members.get(&self.id).is_none_or(|r| r.removed) {
                // Our own record is gone or removed: we are not a member any more.
                self.wipe_cluster();
            } else {
                self.refresh_own_record(wall, now);
                self.start_timers(now);
            }
        }
    }

    // ---- getters ----

    pub fn id(&self) -> &NodeId {
        &self.id
    }
    pub fn cluster(&self) -> Option<&ClusterInfo> {
        self.cluster.as_ref()
    }
    pub fn members(&self) -> &Membership {
        &self.members
    }
    pub fn tokens(&self) -> &TokenBook {
        &self.tokens
    }
    pub fn self_info(&self) -> &SelfInfo {
        &self.me
    }
    /// Run as build `name` with these built-in manifests (the simulator runs two builds side by
    /// side this way; a real node runs the manifests compiled into it).
    pub fn set_build(&mut self, name: &str, manifests: Vec<crate::config::resolve::Manifest>) {
        self.me.software_version = name.to_string();
        self.build_manifests = manifests;
    }

    /// The build this node runs and its built-in manifests.
    pub fn build(&self) -> (&str, &[crate::config::resolve::Manifest]) {
        (&self.me.software_version, &self.build_manifests)
    }

    /// Heartbeat rounds sent since the node started.
    pub fn heartbeats_sent(&self) -> u64 {
        self.heartbeats_sent
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Whether a live member can be reached now (by any route, [`Node::route_to`]): its
    /// advertised URL (empty for a node behind NAT, reached through a tunnel or a relay).
    pub fn route(&self, id: &NodeId) -> Option<String> {
        self.route_to(id).ok()?;
        self.members.get(id).map(|r| r.advertise_url.clone())
    }

    /// Sign a request this node sends itself (probes, ad hoc calls from the shell).
    pub fn sign(&mut self, now: Millis, method: &str, target: &str, body: &[u8]) -> Option<SignedHeaders> {
        let cluster = self.cluster.as_ref()?.id.clone();
        Some(acn::sign_request(&self.key, &self.id, &cluster, method, target, body, now, &mut self.rng))
    }

    /// A signature of a request this node sends, decided now and computed by whoever carries
    /// the request ([`acn::PendingSignature`]); `None` outside a cluster.
    pub fn pending_signature(&mut self, now: Millis) -> Option<acn::PendingSignature> {
        let cluster = self.cluster.as_ref()?.id.clone();
        Some(acn::PendingSignature::new(self.key.clone(), self.id.clone(), cluster, now, &mut self.rng))
    }

    /// The computed state of a member as of wall time `wall`.
    pub fn node_state(&self, id: &NodeId, wall: Millis) -> NodeState {
        self.members.state(id, self.clock.peek(wall))
    }

    pub fn views(&self, wall: Millis) -> Vec<NodeView> {
        let now = self.clock.peek(wall);
        self.members
            .wire_records_at(now, wall)
            .into_iter()
            .map(|record| NodeView {
                state: self.members.state(&record.id, now),
                local: record.id == self.id,
                tunnel: self.linked.contains(&record.id) || self.tunnel.host() == Some(&record.id),
                route: if record.id == self.id {
                    "self".into()
                } else {
                    self.route_to(&record.id).map_or_else(|_| "unreachable".into(), |r| r.describe())
                },
                latency_ms: self.members.latency_ms(&record.id),
                record,
            })
            .collect()
    }

    // ---- the state machine face ----

    /// Advance both clocks to wall time `wall`; returns monotonic now.
    fn advance_clocks(&mut self, wall: Millis) -> Millis {
        self.hlc.set_physical(wall);
        self.clock.advance(wall)
    }

    /// Feed a reading of the host's monotonic clock (any origin). Call it before the other
    /// inputs; from the first reading on, liveness, leases and timers follow it instead of the
    /// wall clock, so a wall-clock step cannot age or refresh anything.
    pub fn observe_monotonic(&mut self, m: Millis) {
        self.clock.observe_external(m);
    }

    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The next deadline, on the wall clock.
    pub fn poll_timeout(&self) -> Option<Millis> {
        let meta = self.cluster.as_ref().and_then(|_| self.meta.poll_timeout());
        let tasks = self.repl_tasks.next_expiry();
        // The config pass runs while in a cluster, and once more outside one (at start, after
        // leaving) to apply this build's own values.
        let config = (self.cluster.is_some() || self.config_applied.is_none()).then_some(self.config_due);
        let chores = self.cluster.as_ref().and_then(|_| self.chores.next_due());
        let renewals = self.cluster.as_ref().and_then(|_| self.work_next_renewal());
        let events = self.events_next_due();
        let jobs = self.cluster.as_ref().and_then(|_| self.jobs_next_due());
        // Health rides on the record: sampled in a cluster, and once at start.
        let health = (self.cluster.is_some() || !self.health_asked).then_some(self.health_due);
        let tunnel = self.tunnel_deadline();
        let identity = self.identity_next_due();
        [
            self.audit_due,
            self.heartbeat_due,
            self.tick_due,
            meta,
            tasks,
            config,
            chores,
            renewals,
            events,
            health,
            jobs,
            tunnel,
            identity,
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|m| self.clock.to_wall(m))
    }

    pub fn handle_timeout(&mut self, wall: Millis) {
        let now = self.advance_clocks(wall);
        if now >= self.health_due && (self.cluster.is_some() || !self.health_asked) {
            self.health_asked = true;
            // The sample rides on this node's record; outside a cluster one at start is enough.
            self.push_output(Output::SampleHealth);
            self.health_due = now.plus(self.config.membership.heartbeat_interval_ms);
        }
        if now >= self.config_due && (self.cluster.is_some() || self.config_applied.is_none()) {
            self.config_timeout(wall, now);
        }
        // Before the early return: leaving the cluster stops wanting a tunnel, and drops the
        // audit acts waiting.
        self.tunnel_timeout(now);
        if self.audit_due.is_some_and(|d| now >= d) {
            self.flush_audit(wall, now);
        }
        if self.cluster.is_none() {
            return;
        }
        if self.heartbeat_due.is_some_and(|d| now >= d) {
            self.heartbeat_round(wall, now);
            self.heartbeats_sent += 1;
            self.heartbeat_due = Some(now.plus(self.config.membership.heartbeat_interval_ms));
        }
        if self.tick_due.is_some_and(|d| now >= d) {
            self.tick(wall, now);
            self.tick_due = Some(now.plus(self.config.membership.state_tick_ms));
        }
        if self.cluster.is_some() {
            let candidates = self.lease_candidates(now);
            self.meta.handle_timeout(now, wall, candidates, &mut self.hlc);
            self.drain_meta(wall, now);
            self.repl_tasks_timeout(wall, now);
            self.chores_timeout(wall, now);
            self.work_timeout(wall, now);
            self.events_timeout(wall, now);
            self.jobs_timeout(wall, now);
            self.rebuild_timeout(wall, now);
            self.identity_timeout(wall, now);
        }
    }

    /// After `shoal serve --rebuild-meta`: the node restarted with its membership and an empty
    /// metadata store. Once a leader's log or snapshot has reached it and it is caught up, its
    /// volumes are rescanned (the spec: the store can always be rebuilt from the real files),
    /// so its copies are checked against the records again and files only it held are found.
    pub fn rescan_after_rebuild(&mut self) {
        self.rescan_after_rebuild = true;
    }

    /// The shell's report on this node's own store: `Some(error)` once its writes fail (a full
    /// data dir), `None` once they work again.
    pub fn store_health(&mut self, wall: Millis, failure: Option<String>) {
        self.advance_clocks(wall);
        if failure.is_some() != self.store_failure.is_some() {
            self.event(match &failure {
                Some(why) => Event::StoreFailing(why.clone()),
                None => Event::StoreWorks,
            });
        }
        self.store_failure = failure;
    }

    /// Whether a client's write may be taken now. While this node cannot store its metadata
    /// (issue 17 "Disk faults": a full data dir), every new write is refused with a clear
    /// error rather than acknowledged into memory alone; writes taken before stay buffered,
    /// are held by the other members, and are stored once the disk has room.
    pub fn write_refusal(&self) -> Option<ApiError> {
        self.store_failure.as_ref().map(|why| {
            ApiError::storage_full(
                "data_dir_full",
                format!("this node cannot store metadata now ({why}); free space in its data dir, then retry"),
            )
        })
    }

    /// Whether a rebuild still waits for the metadata before its rescan.
    pub fn rebuild_waiting(&self) -> bool {
        self.rescan_after_rebuild
    }

    fn rebuild_timeout(&mut self, wall: Millis, now: Millis) {
        if !self.rescan_after_rebuild {
            return;
        }
        let meta = self.meta.status(now);
        // From another node: a snapshot, or a log it leads (not writes of our own as leader).
        let heard = meta.snapshots_adopted > 0 || (meta.last_seq.0 > 0 && !meta.is_leader);
        if heard && self.readiness(wall).ready {
            self.rescan_after_rebuild = false;
            self.chores.kick(crate::storage::chores::Chore::Rescan, now);
        }
    }

    pub fn handle(&mut self, wall: Millis, input: Input) {
        let now = self.advance_clocks(wall);
        match input {
            Input::Response { token, result } => self.on_response(wall, now, token, result),
            Input::Health(mut h) => {
                h.timestamp = h.timestamp.max(wall.0);
                if let Some(prev) = &self.health {
                    h.timestamp = h.timestamp.max(prev.timestamp + 1);
                }
                self.health = Some(h.clone());
                if self.cluster.is_some() {
                    // Health is soft state: it travels with the record but is not persisted.
                    if let Some(rec) = self.members.get_mut(&self.id) {
                        rec.set_health(h, &self.key);
                    }
                }
            }
            Input::Capabilities(c) => {
                self.me.capabilities = c;
                self.refresh_own_record(wall, now);
            }
        }
    }

    /// Change how the node runs (intervals, thresholds). Takes effect from the next round.
    pub fn set_config(&mut self, wall: Millis, config: NodeConfig) {
        self.base_config = config.clone();
        self.install_config(wall, config);
    }

    /// The base config, for resolved values to be laid over.
    pub fn base_config(&self) -> &NodeConfig {
        &self.base_config
    }

    /// Run with `config` from now on (the base stays).
    pub(super) fn install_config(&mut self, wall: Millis, config: NodeConfig) {
        let now = self.advance_clocks(wall);
        self.members.set_config(config.membership.clone());
        if config.meta != self.config.meta {
            self.meta.set_config(config.meta.clone());
        }
        self.config = config;
        if self.cluster.is_some() {
            let hb = now.plus(self.config.membership.heartbeat_interval_ms);
            self.heartbeat_due = Some(self.heartbeat_due.map_or(hb, |d| d.min(hb)));
        }
    }

    fn push_output(&mut self, o: Output) {
        // Unbounded on purpose: the shell drains after every call, and dropping an output
        // (a write, a send) would lose work. A snapshot can legitimately produce one per record.
        self.outputs.push_back(o);
    }

    fn persist(&mut self, op: PersistOp) {
        self.push_output(Output::Persist(op));
    }

    pub(super) fn event(&mut self, e: Event) {
        self.push_output(Output::Event(e));
    }

    fn start_timers(&mut self, now: Millis) {
        self.heartbeat_due = Some(now);
        self.tick_due = Some(now.plus(self.config.membership.state_tick_ms));
        // In a cluster from now on: the config pass runs at once (this build is published).
        self.config_due = Millis::ZERO;
        self.chores.start(now);
        self.scrub_pending.clear();
    }

    fn owner_fields(&self, joined: u64) -> OwnerFields {
        OwnerFields {
            id: self.id.clone(),
            name: self.me.name.clone(),
            public_key: acn::public_key_b64(&self.key.verifying_key()),
            advertise_url: self.me.advertise_url.clone(),
            tunnel_via: self.tunnel_via(),
            version: self.me.software_version.clone(),
            capabilities: self.me.capabilities.clone(),
            joined,
            box_key: crate::identity::box_public(&self.key),
            tls_pin: self.me.tls_pin.clone(),
        }
    }

    fn fresh_own_record(&mut self, now: Millis) -> NodeRecord {
        let fields = self.owner_fields(now.as_secs());
        let v = self.hlc.next(now);
        let mut rec = NodeRecord::new_signed(fields, v, &self.key);
        if let Some(h) = self.health.clone() {
            rec.set_health(h, &self.key);
        }
        rec
    }

    /// Re-sign our own record when what we say about ourselves changed.
    fn refresh_own_record(&mut self, wall: Millis, now: Millis) {
        let Some(rec) = self.members.get(&self.id) else {
            return;
        };
        let fields = self.owner_fields(rec.joined);
        if rec.owner_fields() == fields {
            return;
        }
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&self.id).expect("checked");
        rec.resign_owner(fields, v, &key);
        let rec = rec.clone();
        self.persist(PersistOp::PutRecord(Box::new(rec)));
        self.push_members(wall, now);
    }
}
