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
use crate::hlc::Hlc;
use crate::ids::{is_uuid, ClusterId, NodeId, TokenId};
use crate::membership::{Membership, MembershipConfig, MergeOutcome, NodeState, Trust};
use crate::meta::log::MetaPersist;
use crate::meta::machine::{Meta, MetaConfig, MetaOutput, MetaPurpose, MetaRestored};
use crate::records::{AdminState, Capabilities, ClusterInfo, Health, NodeRecord, OwnerFields};
use crate::rng::SeededRng;
use crate::time::Millis;
use crate::token::{JoinToken, TokenBook, TokenError, TokenRecord};

pub mod chores;
pub mod config;
pub mod files;
mod landed;
mod meta;
pub mod replication;
pub mod volumes;
pub use meta::SETTING_VALUE_MAX_BYTES;

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
    pub headers: SignedHeaders,
    pub timeout_ms: u64,
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
}

#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The answer (status, body) to a request this node asked for, or why none came.
    Response {
        token: u64,
        result: Result<(u16, Vec<u8>), String>,
    },
    Health(Health),
    Capabilities(Capabilities),
}

/// A JSON answer with its status, for both the ACN and the admin API.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply { status: 200, body }
    }
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
        Reply { status, body: json!({"error": {"code": code, "message": message.into()}}) }
    }
}

/// A refused admin command: HTTP status, a stable code and a message for the operator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }
    fn not_in_cluster() -> ApiError {
        ApiError::new(
            409,
            "not_in_cluster",
            "this node is not in a cluster; run `shoal cluster create` or `shoal join TOKEN`",
        )
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        let status = match e {
            TokenError::Unknown => 404,
            TokenError::NoIssuerUrl => 409,
            TokenError::UsedUp | TokenError::Revoked | TokenError::Expired | TokenError::BadSecret => 403,
            _ => 400,
        };
        ApiError::new(status, "bad_token", e.to_string())
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
    pub tunnel: bool,
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
    Meta(MetaPurpose),
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

/// The node's monotonic clock. When the shell feeds a real monotonic reading
/// ([`Node::observe_monotonic`]) it advances by exactly that, so wall-clock steps either way
/// change nothing; without one it follows the wall clock forward and ignores steps back.
#[derive(Clone, Copy, Debug, Default)]
struct MonoClock {
    last_wall: Option<Millis>,
    mono: Millis,
    /// The last external monotonic reading, once the shell provides them.
    external: Option<Millis>,
}

impl MonoClock {
    fn observe_external(&mut self, ext: Millis) {
        if let Some(prev) = self.external {
            self.mono = self.mono.plus(ext.since(prev));
        }
        self.external = Some(ext);
    }

    fn advance(&mut self, wall: Millis) -> Millis {
        if self.external.is_some() {
            if self.last_wall.is_none() {
                self.mono = wall; // the origin: any non-zero instant will do
            }
            self.last_wall = Some(wall);
            return self.mono;
        }
        match self.last_wall {
            None => self.mono = wall,
            Some(prev) => self.mono = self.mono.plus(wall.since(prev)),
        }
        self.last_wall = Some(wall);
        self.mono
    }

    fn peek(&self, wall: Millis) -> Millis {
        if self.external.is_some() && self.last_wall.is_some() {
            return self.mono;
        }
        match self.last_wall {
            None => wall,
            Some(prev) => self.mono.plus(wall.since(prev)),
        }
    }

    /// The wall time at which monotonic time `m` will be reached.
    fn to_wall(self, m: Millis) -> Millis {
        match self.last_wall {
            None => m,
            Some(wall) => wall.plus(m.since(self.mono)),
        }
    }
}

pub struct Node {
    id: NodeId,
    key: SigningKey,
    rng: SeededRng,
    hlc: Hlc,
    config: NodeConfig,
    /// The config the node was started (or last `set_config`) with; resolved config values set
    /// somewhere are laid over it, and a cleared value falls back to it.
    base_config: NodeConfig,
    me: SelfInfo,
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
    /// When the config pass is due next (`config.rs` `config_timeout`), and what it last
    /// applied.
    config_due: Millis,
    config_applied: Option<BTreeMap<String, BTreeMap<String, crate::config::resolve::Resolved>>>,
    /// Bytes put in place that the records may not account for yet (`landed.rs`).
    landed: crate::storage::landed::LandedBytes,
    /// When each background chore is due (`chores.rs`), the copies the scrub checks next, and
    /// what replication and scrubbing did.
    chores: crate::storage::chores::Chores,
    scrub_pending: VecDeque<files::LocalCopy>,
    repl_stats: chores::ReplStats,
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
    serde_json::from_slice(body).map_err(|e| Reply::error(400, "bad_body", format!("{what} body: {e}")))
}

fn err_reply(e: AcnError) -> Reply {
    Reply::error(e.http_status(), e.code(), e.to_string())
}

impl Node {
    pub fn new(id: NodeId, key: SigningKey, seed: u64, config: NodeConfig, me: SelfInfo) -> Node {
        let id_for_meta = id.clone();
        let meta_config = config.meta.clone();
        Node {
            hlc: Hlc::new(id.clone()),
            members: Membership::new(id.clone(), config.membership.clone()),
            id,
            key,
            rng: SeededRng::new(seed),
            base_config: config.clone(),
            config,
            me,
            build_manifests: crate::config::builtin::manifests(),
            cluster: None,
            tokens: TokenBook::default(),
            verifier: Verifier::default(),
            outputs: VecDeque::new(),
            next_token: 1,
            in_flight: BTreeMap::new(),
            heartbeat_due: None,
            heartbeats_sent: 0,
            tick_due: None,
            last_states: BTreeMap::new(),
            pending_join: None,
            health: None,
            clock: MonoClock::default(),
            meta: Meta::new(id_for_meta, meta_config, Millis::ZERO),
            volume_reported: BTreeMap::new(),
            own_volumes: BTreeMap::new(),
            repl_tasks: Default::default(),
            config_due: Millis::ZERO,
            config_applied: None,
            landed: Default::default(),
            chores: Default::default(),
            scrub_pending: VecDeque::new(),
            repl_stats: Default::default(),
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
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        if self.cluster.is_some() {
            self.meta.restore(r.meta, &mut self.hlc);
            match r.own_volumes {
                Some(own) => self.own_volumes = own.into_iter().collect(),
                None => self.adopt_own_volumes(),
            }
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

    /// The advertised URL of a live member (the direct route).
    pub fn route(&self, id: &NodeId) -> Option<String> {
        self.members.get(id).filter(|r| !r.removed && !r.advertise_url.is_empty()).map(|r| r.advertise_url.clone())
    }

    /// Sign a request this node sends itself (probes, ad hoc calls from the shell).
    pub fn sign(&mut self, now: Millis, method: &str, target: &str, body: &[u8]) -> Option<SignedHeaders> {
        let cluster = self.cluster.as_ref()?.id.clone();
        Some(acn::sign_request(&self.key, &self.id, &cluster, method, target, body, now, &mut self.rng))
    }

    /// [`Node::sign`] for a body whose SHA-256 (hex) the caller computed from the bytes it sends.
    pub fn sign_hashed(&mut self, now: Millis, method: &str, target: &str, body_hash: &str) -> Option<SignedHeaders> {
        let cluster = self.cluster.as_ref()?.id.clone();
        Some(acn::sign_request_hashed(&self.key, &self.id, &cluster, method, target, body_hash, now, &mut self.rng))
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
                tunnel: false,
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
        [self.heartbeat_due, self.tick_due, meta, tasks, config, chores]
            .into_iter()
            .flatten()
            .min()
            .map(|m| self.clock.to_wall(m))
    }

    pub fn handle_timeout(&mut self, wall: Millis) {
        let now = self.advance_clocks(wall);
        if now >= self.config_due && (self.cluster.is_some() || self.config_applied.is_none()) {
            self.config_timeout(wall, now);
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
            self.meta.handle_timeout(now, wall, candidates);
            self.drain_meta(wall, now);
            self.repl_tasks_timeout(wall, now);
            self.chores_timeout(wall, now);
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
            tunnel_via: String::new(),
            version: self.me.software_version.clone(),
            capabilities: self.me.capabilities.clone(),
            joined,
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

    #[allow(clippy::too_many_arguments)]
    fn new_request(
        &mut self,
        wall: Millis,
        now: Millis,
        to: &NodeId,
        method: &'static str,
        target: &str,
        body: Vec<u8>,
        purpose: Purpose,
    ) {
        let Some(url) = self.route(to) else { return };
        let Some(headers) = self.sign(wall, method, target, &body) else {
            return;
        };
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(token, InFlight { peer: to.clone(), sent: now, sent_wall: wall, purpose });
        let timeout_ms = self.config.membership.heartbeat_timeout_ms;
        self.push_output(Output::Send(OutRequest {
            token,
            to: to.clone(),
            url,
            method,
            target: target.to_string(),
            body,
            headers,
            timeout_ms,
        }));
    }

    fn members_body(&self, wall: Millis, now: Millis) -> Vec<u8> {
        let body = MembersBody {
            nodes: self.members.wire_records_at(now, wall),
            cluster: self.cluster.clone(),
            time_ms: wall.0,
        };
        serde_json::to_vec(&body).expect("members serialise")
    }

    /// Push the whole member list to every live peer (after a local change).
    fn push_members(&mut self, wall: Millis, now: Millis) {
        if self.cluster.is_none() {
            return;
        }
        let body = self.members_body(wall, now);
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).collect();
        for p in peers {
            self.new_request(wall, now, &p, "POST", "/cluster/acn/members/sync", body.clone(), Purpose::Push);
        }
    }

    fn heartbeat_round(&mut self, wall: Millis, now: Millis) {
        let Some(own) = self.members.get(&self.id).cloned() else {
            return;
        };
        let stale_after = self.config.membership.heartbeat_timeout_ms * 2;
        self.in_flight.retain(|_, f| now.since(f.sent) <= stale_after);
        let busy: Vec<NodeId> =
            self.in_flight.values().filter(|f| f.purpose == Purpose::Heartbeat).map(|f| f.peer.clone()).collect();
        let body = serde_json::to_vec(&HeartbeatBody { node: own, cluster: self.cluster.clone() }).expect("serialise");
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).filter(|p| !busy.contains(p)).collect();
        for p in peers {
            self.new_request(wall, now, &p, "POST", "/cluster/acn/heartbeat", body.clone(), Purpose::Heartbeat);
        }
    }

    fn tick(&mut self, wall: Millis, now: Millis) {
        for id in self.members.purge_tombstones(wall) {
            self.last_states.remove(&id);
            self.persist(PersistOp::DeleteRecord(id.clone()));
            self.persist(PersistOp::PutPurged(id));
        }
        for id in self.tokens.purge_expired(wall) {
            self.persist(PersistOp::DeleteToken(id));
        }
        let states: Vec<(NodeId, NodeState)> = self
            .members
            .records()
            .filter(|r| !r.removed)
            .map(|r| (r.id.clone(), self.members.state(&r.id, now)))
            .collect();
        for (id, to) in states {
            let from = self.last_states.insert(id.clone(), to);
            if let Some(from) = from {
                if from != to {
                    self.event(Event::StateChanged { node: id, from, to });
                }
            }
        }
    }

    fn on_response(&mut self, wall: Millis, now: Millis, token: u64, result: Result<(u16, Vec<u8>), String>) {
        let Some(f) = self.in_flight.remove(&token) else {
            return;
        };
        if self.cluster.is_none() {
            return;
        }
        if let Purpose::Meta(p) = f.purpose {
            self.meta.on_response(now, &f.peer, p, result, &mut self.hlc);
            self.drain_meta(wall, now);
            return;
        }
        let (status, body) = match result {
            Ok(r) => r,
            Err(_) => return,
        };
        let time_ms =
            serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("timeMs").and_then(|t| t.as_u64()));
        if let Some(t) = time_ms.filter(|t| *t > 0) {
            // Their clock at about the midpoint of the round trip.
            let midpoint = f.sent_wall.0 as i64 + (now.since(f.sent) / 2) as i64;
            self.members.record_clock_offset(&f.peer, t as i64 - midpoint);
        }
        if status == 401 {
            self.on_refused(wall, now, &body);
            return;
        }
        if status != 200 {
            return;
        }
        if f.purpose != Purpose::Heartbeat {
            // Any answered request is a round trip and a sign of life.
            self.members.record_rtt(&f.peer, now.since(f.sent) as f64);
            self.members.saw_at(&f.peer, now, now);
            return;
        }
        let Ok(reply) = serde_json::from_slice::<MembersBody>(&body) else { return };
        if reply.cluster.as_ref().map(|c| &c.id) != self.cluster.as_ref().map(|c| &c.id) {
            return;
        }
        self.members.record_rtt(&f.peer, now.since(f.sent) as f64);
        self.members.saw_at(&f.peer, now, now);
        let sender_now = (reply.time_ms > 0).then_some(Millis(reply.time_ms));
        let out = self.members.merge(now, &reply.nodes, sender_now, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
    }

    /// A peer refused us as unknown; if it showed us our own removal, check it and leave.
    fn on_refused(&mut self, wall: Millis, now: Millis, body: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        let Some(rec) = v.get("removed").and_then(|r| serde_json::from_value::<NodeRecord>(r.clone()).ok()) else {
            return;
        };
        if rec.id != self.id {
            return;
        }
        let out = self.members.merge(now, &[rec], None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
    }

    /// Persist and announce what a merge changed. `wall` is the wall clock (for re-signing).
    fn apply_merge(&mut self, wall: Millis, out: MergeOutcome) {
        let now = wall;
        for id in &out.changed {
            if let Some(r) = self.members.get(id) {
                let r = r.clone();
                self.persist(PersistOp::PutRecord(Box::new(r)));
            }
        }
        for id in out.added {
            self.event(Event::MemberAdded(id));
        }
        let mut self_removed = false;
        for id in out.removed {
            if id == self.id {
                self_removed = true;
            }
            self.last_states.remove(&id);
            self.event(Event::MemberRemoved(id));
        }
        if self_removed {
            self.event(Event::RemovedSelf);
            self.wipe_cluster();
            return;
        }
        if let Some(v) = out.own_owner_newer {
            // Someone holds a newer copy of our own record (a restored backup): sign past it.
            self.hlc.observe(&v);
            let joined = self.members.get(&self.id).map(|r| r.joined).unwrap_or(now.as_secs());
            let fields = self.owner_fields(joined);
            let v = self.hlc.next(now);
            let key = self.key.clone();
            if let Some(rec) = self.members.get_mut(&self.id) {
                rec.resign_owner(fields, v, &key);
                let rec = rec.clone();
                self.persist(PersistOp::PutRecord(Box::new(rec)));
            }
        }
    }

    fn wipe_cluster(&mut self) {
        self.cluster = None;
        self.members.clear();
        self.tokens.clear();
        self.in_flight.clear();
        self.heartbeat_due = None;
        self.tick_due = None;
        self.last_states.clear();
        self.own_volumes.clear();
        self.repl_tasks.clear();
        self.chores.stop();
        self.scrub_pending.clear();
        // One more config pass takes the values back to this build's own (then no timer runs).
        self.config_applied = None;
        self.config_due = Millis::ZERO;
        self.persist(PersistOp::ClearCluster);
        let now = self.clock.peek(self.clock.last_wall.unwrap_or_default());
        self.meta.clear(now);
        while let Some(o) = self.meta.poll_output() {
            if let MetaOutput::Persist(p) = o {
                self.push_output(Output::Meta(p));
            }
        }
    }

    // ---- ACN: answering peers ----

    /// Answer one node-to-node request. `target` is the path plus `?query` exactly as received.
    pub fn handle_acn(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
    ) -> Reply {
        let now = self.advance_clocks(wall);
        let path = target.split('?').next().unwrap_or("");
        let Some(endpoint) = path.strip_prefix(ACN_PREFIX) else {
            return Reply::error(404, "not_found", "no such ACN endpoint");
        };
        let want = match endpoint {
            "hello" | "members" | "latency" => "GET",
            "ping" | "join" | "heartbeat" | "members/sync" | "leave" | "evict" => "POST",
            "meta/log" | "meta/snapshot" | "meta/file" => "GET",
            "meta/lease" | "meta/append" | "meta/submit" | "store/place" => "POST",
            _ => return Reply::error(404, "not_found", format!("no such ACN endpoint: {endpoint}")),
        };
        if !method.eq_ignore_ascii_case(want) {
            return Reply::error(405, "method_not_allowed", format!("{endpoint} takes {want}"));
        }
        match endpoint {
            "hello" => return Reply::ok(self.hello(wall)),
            "join" => return self.answer_join(wall, now, body),
            _ => {}
        }
        let sender = match self.verify_signed(wall, now, method, target, headers, body, None) {
            Ok(s) => s,
            Err(r) => return r,
        };
        match endpoint {
            "ping" => Reply::ok(json!({"pong": true, "node": sender, "time": wall.as_secs()})),
            "heartbeat" => self.answer_heartbeat(wall, now, &sender, body),
            "members" => Reply::ok(self.members_json(wall, now)),
            "members/sync" => self.answer_sync(wall, now, &sender, body),
            "leave" => self.answer_leave(wall, now, &sender, body),
            "evict" => self.answer_evict(wall, now, &sender, body),
            "latency" => Reply::ok(json!({"node": self.id, "latency": self.members.latency_vector()})),
            "store/place" => self.answer_place(wall, &sender, body),
            "meta/file" => self.answer_file_exists(target),
            "meta/lease" | "meta/append" | "meta/submit" | "meta/log" | "meta/snapshot" => {
                let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
                self.answer_meta(wall, now, endpoint, &sender, query, body)
            }
            _ => Reply::error(404, "not_found", "no such ACN endpoint"),
        }
    }

    /// Check a signed request from a member (the ACN rules, with the sender's clock offset) and
    /// note that we heard from it. The error is the reply to send.
    #[allow(clippy::too_many_arguments)]
    fn verify_signed(
        &mut self,
        wall: Millis,
        now: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
        body_hash: Option<&str>,
    ) -> Result<NodeId, Reply> {
        let incoming = Incoming { headers, method, target, body };
        let members = &self.members;
        let cluster = self.cluster.as_ref().map(|c| &c.id);
        let verified = self.verifier.verify_hashed(
            wall,
            &incoming,
            body_hash,
            cluster,
            |id| members.clock_offset_ms(id),
            |id| members.member_key(id),
        );
        let sender = match verified {
            Ok(s) => s,
            Err(AcnError::UnknownNode) => {
                let proof = signed_proof(method, target, headers, body);
                return Err(self.unknown_sender_reply(proof));
            }
            Err(AcnError::ClockSkew) => {
                // Our time rides along so the sender can learn our clock's offset. A removed
                // node whose clock we cannot place would otherwise never hear of its removal
                // (we no longer talk to it, so we never learn its offset): if its own key
                // signed this, show it.
                let proof = signed_proof(method, target, headers, body);
                let mut r = self.removal_proof(err_reply(AcnError::ClockSkew), proof);
                r.body["timeMs"] = json!(wall.0);
                return Err(r);
            }
            Err(e) => return Err(err_reply(e)),
        };
        self.members.saw_at(&sender, now, now);
        Ok(sender)
    }

    /// The checks of a signed request that need no body (present, this cluster, a member),
    /// so the shell can refuse a stranger before reading up to 64 MiB. The full verification
    /// still runs on the whole request.
    pub fn precheck_acn(&self, _wall: Millis, headers: Option<&SignedHeaders>) -> Result<(), Reply> {
        let h = headers.ok_or_else(|| err_reply(AcnError::NotSigned))?;
        match &self.cluster {
            Some(c) if c.id.as_str() == h.cluster => {}
            _ => return Err(err_reply(AcnError::WrongCluster)),
        }
        if self.members.get(&NodeId::new(h.node.clone())).is_none() {
            return Err(err_reply(AcnError::UnknownNode));
        }
        Ok(())
    }

    /// Verify a signed request the shell answers itself (the byte-moving `store/*`
    /// endpoints): the same checks as every ACN request. Returns the sender.
    pub fn verify_acn(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
    ) -> Result<NodeId, Reply> {
        let now = self.advance_clocks(wall);
        self.verify_signed(wall, now, method, target, headers, body, None)
    }

    /// [`Node::verify_acn`] with the body's SHA-256 (hex) computed by the caller from `body`.
    pub fn verify_acn_hashed(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
        body_hash: &str,
    ) -> Result<NodeId, Reply> {
        let now = self.advance_clocks(wall);
        self.verify_signed(wall, now, method, target, headers, body, Some(body_hash))
    }

    /// 401 for a sender we do not count as a member. When we hold its removal, it rides along
    /// (signed by whoever removed it), so a node that missed its eviction learns of it and leaves.
    fn unknown_sender_reply(&self, proof: Option<(&SignedHeaders, String)>) -> Reply {
        self.removal_proof(err_reply(AcnError::UnknownNode), proof)
    }

    /// Add the sender's own removal to a refusal, when its key signed the request.
    fn removal_proof(&self, reply: Reply, proof: Option<(&SignedHeaders, String)>) -> Reply {
        let mut r = reply;
        if let Some((h, canon)) = proof {
            if let Some(rec) = self.members.get(&NodeId::new(h.node.clone())).filter(|r| r.removed) {
                // Only the removed node itself (its key signed this request) is shown its removal.
                if rec.key().is_some_and(|k| acn::verify_b64(&k, canon.as_bytes(), &h.signature)) {
                    r.body["removed"] = serde_json::to_value(rec).expect("record serialises");
                }
            }
        }
        r
    }

    pub fn hello(&self, now: Millis) -> Value {
        json!({
            "acn": true,
            "version": self.me.software_version,
            "inCluster": self.cluster.is_some(),
            "time": now.as_secs(),
        })
    }

    fn members_json(&self, wall: Millis, now: Millis) -> Value {
        json!({"nodes": self.members.wire_records_at(now, wall), "cluster": self.cluster, "time": wall.as_secs(), "timeMs": wall.0})
    }

    fn answer_heartbeat(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let hb: HeartbeatBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(400, "bad_body", format!("heartbeat body: {e}")),
        };
        if &hb.node.id != sender {
            return Reply::error(400, "bad_body", "heartbeat record is not the sender's own");
        }
        let out = self.members.merge(now, std::slice::from_ref(&hb.node), None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(self.members_json(wall, now))
    }

    fn answer_sync(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let b = match members_body(body, "members") {
            Ok(b) => b,
            Err(r) => return r,
        };
        let sender_now = (b.time_ms > 0).then_some(Millis(b.time_ms));
        if b.time_ms > 0 {
            self.members.record_clock_offset(sender, b.time_ms as i64 - wall.0 as i64);
        }
        let out = self.members.merge(now, &b.nodes, sender_now, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true, "timeMs": wall.0}))
    }

    /// From a member-list body, the records of `target` carrying a removal signed by `author`;
    /// a 400 saying `missing` when there are none.
    fn removals_in(
        body: &[u8],
        what: &str,
        target: &NodeId,
        author: &NodeId,
        missing: &str,
    ) -> Result<Vec<NodeRecord>, Reply> {
        let b = members_body(body, what)?;
        let found: Vec<NodeRecord> = b
            .nodes
            .into_iter()
            .filter(|r| &r.id == target && r.removal.as_ref().is_some_and(|m| &m.by == author))
            .collect();
        if found.is_empty() {
            return Err(Reply::error(400, "bad_body", missing));
        }
        Ok(found)
    }

    fn answer_leave(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let own = match Self::removals_in(body, "leave", sender, sender, "leave must carry the sender's own removal") {
            Ok(r) => r,
            Err(r) => return r,
        };
        let out = self.members.merge(now, &own, None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true}))
    }

    fn answer_evict(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let me = self.id.clone();
        let missing = "evict must carry this node's removal signed by the sender";
        let mine = match Self::removals_in(body, "evict", &me, sender, missing) {
            Ok(r) => r,
            Err(r) => return r,
        };
        let out = self.members.merge(now, &mine, None, Trust::Gossip, &mut self.hlc);
        if !out.removed.contains(&self.id) {
            return Reply::error(400, "bad_body", "the removal does not verify");
        }
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true}))
    }

    fn answer_join(&mut self, wall: Millis, now: Millis, body: &[u8]) -> Reply {
        let Some(cluster) = self.cluster.clone() else {
            return Reply::error(404, "not_in_cluster", "this node is not in a cluster");
        };
        let b: JoinBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(400, "bad_body", format!("join body: {e}")),
        };
        if b.cluster_id != cluster.id {
            return Reply::error(404, "unknown_cluster", "this node is in another cluster");
        }
        if let Err(e) = self.tokens.check(wall, &b.token_id, &b.secret) {
            return Reply::error(403, "bad_token", e.to_string());
        }
        let r = &b.node;
        let Some(key) = r.key() else {
            return Reply::error(400, "bad_record", "node record has no valid public key");
        };
        if !is_uuid(r.id.as_str()) || r.owner_version.node != r.id || !r.owner_sig_valid(&key) {
            return Reply::error(400, "bad_record", "node record is not signed by its own key");
        }
        if !r.shape_ok() {
            return Reply::error(
                400,
                "bad_record",
                "node record fields are too long or malformed (name <= 128 bytes, http(s) URL, <= 256 features)",
            );
        }
        if r.id == self.id {
            return Reply::error(409, "node_exists", "that is this node's own id");
        }
        if self.members.purged().any(|p| p == &r.id) || self.members.get(&r.id).is_some_and(|x| x.removed) {
            return Reply::error(409, "node_removed", "this node id was removed from the cluster; give the node a fresh identity (new data dir) to join again");
        }
        if let Some(existing) = self.members.get(&r.id) {
            if existing.public_key != r.public_key {
                return Reply::error(409, "node_exists", "a member with this node id already exists under another key");
            }
        } else {
            let mut rec = r.clone();
            rec.admin_state = AdminState::Active;
            rec.admin = None;
            rec.removed = false;
            rec.removal = None;
            rec.health = None;
            rec.health_sig.clear();
            let v = self.hlc.next(wall);
            rec.admit(&self.id, v, &self.key);
            self.hlc.observe(&rec.owner_version);
            self.members.insert(rec.clone());
            self.persist(PersistOp::PutRecord(Box::new(rec)));
            self.event(Event::MemberAdded(r.id.clone()));
        }
        self.members.saw_at(&r.id, now, now);
        if let Some(t) = self.tokens.count_use(&b.token_id) {
            self.persist(PersistOp::PutToken(t));
        }
        self.push_members(wall, now);
        let mut nodes = self.members.wire_records_at(now, wall);
        nodes.sort_by_key(|n| (n.id != self.id, n.id.clone()));
        Reply::ok(json!({"cluster": cluster, "nodes": nodes, "via": "", "time": wall.as_secs(), "timeMs": wall.0}))
    }

    // ---- admin commands ----

    pub fn status(&self, wall: Millis) -> Value {
        let now = self.clock.peek(wall);
        let mut states: BTreeMap<&'static str, usize> = BTreeMap::new();
        for r in self.members.records().filter(|r| !r.removed) {
            *states.entry(self.members.state(&r.id, now).as_str()).or_default() += 1;
        }
        json!({
            "inCluster": self.cluster.is_some(),
            "id": self.cluster.as_ref().map(|c| c.id.clone()),
            "name": self.cluster.as_ref().map(|c| c.name.clone()),
            "created": self.cluster.as_ref().map(|c| c.created),
            "node": self.id,
            "nodeName": self.me.name,
            "advertiseUrl": self.me.advertise_url,
            "version": self.me.software_version,
            "members": self.members.records().filter(|r| !r.removed).count(),
            "states": states,
        })
    }

    pub fn create_cluster(&mut self, wall: Millis, name: &str) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        if let Some(c) = &self.cluster {
            return Err(ApiError::new(
                409,
                "in_cluster",
                format!("this node is already in cluster {} ({})", c.name, c.id),
            ));
        }
        let name = name.trim();
        if name.len() > 128 {
            return Err(ApiError::new(400, "bad_name", "cluster name is longer than 128 bytes"));
        }
        let info = ClusterInfo {
            id: ClusterId::new(self.rng.uuid_v4()),
            name: if name.is_empty() { "shoal".into() } else { name.to_string() },
            created: wall.as_secs(),
        };
        let mut rec = self.fresh_own_record(wall);
        let v = self.hlc.next(wall);
        rec.admit(&self.id, v, &self.key);
        self.members.clear();
        self.members.insert(rec.clone());
        self.cluster = Some(info.clone());
        self.persist(PersistOp::PutCluster(info));
        self.own_volumes.clear();
        self.persist_own_volumes();
        self.persist(PersistOp::PutRecord(Box::new(rec)));
        self.start_timers(now);
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        self.meta.allow_claim_now(now);
        self.push_output(Output::Meta(MetaPersist::Clear));
        Ok(self.status(wall))
    }

    pub fn new_token(&mut self, now: Millis, ttl_hours: Option<u64>, max_uses: Option<u64>) -> Result<Value, ApiError> {
        let c = self.cluster.clone().ok_or_else(ApiError::not_in_cluster)?;
        let url = (!self.me.advertise_url.is_empty()).then_some(self.me.advertise_url.as_str());
        let (token, rec) = self.tokens.create(now, ttl_hours, max_uses, &c.id, &c.name, url, &mut self.rng)?;
        self.persist(PersistOp::PutToken(rec.clone()));
        Ok(json!({"token": token.encode(), "id": rec.id, "expires": rec.expires, "maxUses": rec.max_uses}))
    }

    pub fn list_tokens(&self) -> Value {
        json!({"tokens": self.tokens.list().collect::<Vec<_>>()})
    }

    pub fn revoke_token(&mut self, id: &str) -> Result<Value, ApiError> {
        let rec = self.tokens.revoke(&TokenId::new(id))?;
        self.persist(PersistOp::PutToken(rec.clone()));
        Ok(json!({"revoked": rec.id}))
    }

    fn known_peer(&self, id: &str) -> Result<NodeId, ApiError> {
        if self.cluster.is_none() {
            return Err(ApiError::not_in_cluster());
        }
        let id = NodeId::new(id);
        match self.members.get(&id) {
            Some(r) if !r.removed => Ok(id),
            Some(_) => Err(ApiError::new(404, "node_removed", format!("node {id} was removed"))),
            None => Err(ApiError::new(404, "unknown_node", format!("no member with id {id}"))),
        }
    }

    pub fn set_admin_state(&mut self, wall: Millis, id: &str, state: AdminState) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        let id = self.known_peer(id)?;
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&id).expect("known");
        rec.set_admin(state, v, &key);
        let rec = rec.clone();
        self.persist(PersistOp::PutRecord(Box::new(rec)));
        self.push_members(wall, now);
        Ok(json!({"node": id, "adminState": state.as_str(), "state": self.members.state(&id, now)}))
    }

    pub fn remove_node(&mut self, wall: Millis, id: &str) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        let id = self.known_peer(id)?;
        if id == self.id {
            return Err(ApiError::new(400, "is_self", "a node cannot remove itself; use `shoal cluster leave`"));
        }
        let evict_target = self.route(&id);
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&id).expect("known");
        rec.set_removed(v, &key);
        let rec = rec.clone();
        self.persist(PersistOp::PutRecord(Box::new(rec.clone())));
        self.last_states.remove(&id);
        self.event(Event::MemberRemoved(id.clone()));
        self.push_members(wall, now);
        if let Some(url) = evict_target {
            // Tell the removed node; it is no longer a live member, so address it directly.
            let body =
                serde_json::to_vec(&MembersBody { nodes: vec![rec], cluster: self.cluster.clone(), time_ms: wall.0 })
                    .expect("serialise");
            if let Some(headers) = self.sign(wall, "POST", "/cluster/acn/evict", &body) {
                let token = self.next_token;
                self.next_token += 1;
                self.push_output(Output::Send(OutRequest {
                    token,
                    to: id.clone(),
                    url,
                    method: "POST",
                    target: "/cluster/acn/evict".into(),
                    body,
                    headers,
                    timeout_ms: self.config.membership.heartbeat_timeout_ms,
                }));
            }
        }
        Ok(json!({"removed": id}))
    }

    pub fn leave(&mut self, wall: Millis) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        let cluster = self.cluster.clone().ok_or_else(ApiError::not_in_cluster)?;
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&self.id).expect("own record exists in a cluster");
        rec.set_removed(v, &key);
        let rec = rec.clone();
        let body =
            serde_json::to_vec(&MembersBody { nodes: vec![rec], cluster: Some(cluster.clone()), time_ms: wall.0 })
                .expect("serialise");
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).collect();
        for p in &peers {
            self.new_request(wall, now, p, "POST", "/cluster/acn/leave", body.clone(), Purpose::Push);
        }
        self.wipe_cluster();
        Ok(json!({"left": cluster.id, "told": peers.len()}))
    }

    /// Change this node's name or advertised URL; re-signs its record and tells the cluster.
    pub fn configure(
        &mut self,
        wall: Millis,
        name: Option<&str>,
        advertise_url: Option<&str>,
    ) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        if let Some(n) = name {
            let n = n.trim();
            if n.is_empty() || n.len() > 128 {
                return Err(ApiError::new(400, "bad_name", "node name must be 1 to 128 bytes"));
            }
            self.me.name = n.to_string();
        }
        if let Some(u) = advertise_url {
            let u = u.trim().trim_end_matches('/');
            if !u.is_empty() && !crate::token::valid_base_url(u) {
                return Err(ApiError::new(400, "bad_url", "advertised URL must look like http://host:port"));
            }
            self.me.advertise_url = u.to_string();
        }
        self.refresh_own_record(wall, now);
        Ok(json!({"node": self.id, "name": self.me.name, "advertiseUrl": self.me.advertise_url}))
    }

    /// First half of joining: check the token and make the request to send to its issuer.
    pub fn prepare_join(&mut self, now: Millis, token: &str) -> Result<JoinPlan, ApiError> {
        if let Some(c) = &self.cluster {
            return Err(ApiError::new(
                409,
                "in_cluster",
                format!("this node is already in cluster {}; leave it first", c.id),
            ));
        }
        let t = JoinToken::parse(token)?;
        let node = self.fresh_own_record(now);
        let body =
            JoinBody { cluster_id: t.cluster.clone(), token_id: t.token_id.clone(), secret: t.secret.clone(), node };
        let url = format!("{}{}join", t.issuer_url, ACN_PREFIX);
        self.pending_join = Some(t);
        Ok(JoinPlan { url, body: serde_json::to_vec(&body).expect("serialise") })
    }

    /// Second half of joining: adopt the issuer's answer.
    pub fn finish_join(&mut self, wall: Millis, status: u16, body: &[u8]) -> Result<Value, ApiError> {
        let now = self.advance_clocks(wall);
        let t = self.pending_join.take().ok_or_else(|| ApiError::new(409, "no_join", "no join in progress"))?;
        if self.cluster.is_some() {
            return Err(ApiError::new(409, "in_cluster", "this node joined a cluster meanwhile"));
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|_| ApiError::new(502, "bad_issuer_reply", "the issuer's answer is not JSON"))?;
        if status != 200 {
            let msg = v.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("join refused");
            let code = if status == 403 || status == 404 || status == 409 || status == 400 { status } else { 502 };
            return Err(ApiError::new(code, "join_refused", format!("the issuer refused the join: {msg}")));
        }
        #[derive(Deserialize)]
        struct JoinReply {
            cluster: ClusterInfo,
            nodes: Vec<NodeRecord>,
            #[serde(default, rename = "timeMs")]
            time_ms: u64,
        }
        let reply: JoinReply = serde_json::from_value(v)
            .map_err(|e| ApiError::new(502, "bad_issuer_reply", format!("the issuer's answer is malformed: {e}")))?;
        if reply.cluster.id != t.cluster {
            return Err(ApiError::new(502, "bad_issuer_reply", "the issuer answered for another cluster"));
        }
        let Some(own) = reply.nodes.iter().find(|r| r.id == self.id).cloned() else {
            return Err(ApiError::new(502, "bad_issuer_reply", "the issuer's member list does not include this node"));
        };
        if own.public_key != acn::public_key_b64(&self.key.verifying_key()) || own.admitted.is_none() {
            return Err(ApiError::new(502, "bad_issuer_reply", "the issuer returned a different record for this node"));
        }
        self.members.clear();
        self.hlc.observe(&own.owner_version);
        let mut own = own;
        own.last_seen = 0;
        own.last_seen_ms = 0;
        own.last_seen_age_ms = None;
        own.removed = false;
        own.removal = None;
        own.admin = None;
        own.admin_state = AdminState::Active;
        self.members.insert(own.clone());
        let sender_now = (reply.time_ms > 0).then_some(Millis(reply.time_ms));
        if let Some(issuer) = reply.nodes.first().filter(|r| r.id != self.id) {
            let issuer = issuer.id.clone();
            if reply.time_ms > 0 {
                self.members.record_clock_offset(&issuer, reply.time_ms as i64 - wall.0 as i64);
            }
        }
        let out = self.members.merge(now, &reply.nodes, sender_now, Trust::JoinReply, &mut self.hlc);
        // We just heard from the issuer: it is up (and the earliest member, not us, leads).
        if let Some(issuer) = reply.nodes.first().filter(|r| r.id != self.id) {
            let issuer = issuer.id.clone();
            self.members.saw_at(&issuer, now, now);
        }
        self.cluster = Some(reply.cluster.clone());
        self.persist(PersistOp::PutCluster(reply.cluster.clone()));
        self.own_volumes.clear();
        self.persist_own_volumes();
        self.persist(PersistOp::PutRecord(Box::new(own)));
        self.apply_merge(wall, out);
        self.start_timers(now);
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        self.push_output(Output::Meta(MetaPersist::Clear));
        Ok(self.status(wall))
    }

    /// Forget a join whose request never got an answer.
    pub fn abort_join(&mut self) {
        self.pending_join = None;
    }
}
