//! The simulated cluster: hosts, the operator's control client, faults and observation.

use crate::env::{ClockFault, SimEnv};
use serde_json::Value;
use sha2::{Digest, Sha256};
use shoal_core::membership::{MembershipConfig, NodeState};
use shoal_core::meta::lease::Lease;
use shoal_core::meta::machine::MetaConfig;
use shoal_core::meta::records::{Record, RecordKind};
use shoal_core::records::AdminState;
use shoal_core::Version;
use shoal_core::{NodeId, SeededRng};
use shoal_shell::daemon::{self, ServeOptions};
use shoal_shell::net::client::HttpClient;
use shoal_shell::node::handle::Shared;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::Duration;

pub const PORT: u16 = 7000;
const CTL: &str = "ctl";

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    pub tick_ms: u64,
    pub membership: MembershipConfig,
    pub meta: MetaConfig,
    /// Give every node a clock offset up to ±4 min and a drift up to ±200 ppm.
    pub clock_faults: bool,
    /// Nodes behind NAT: started with `--advertise none`, so no member knows how to reach
    /// them; they open a reverse tunnel and are reached through it and through relays.
    pub nat: BTreeSet<usize>,
}

impl SimConfig {
    pub fn new(seed: u64, nodes: usize) -> SimConfig {
        SimConfig {
            seed,
            nodes,
            tick_ms: 10,
            membership: MembershipConfig::default(),
            meta: MetaConfig::default(),
            clock_faults: true,
            nat: BTreeSet::new(),
        }
    }
}

/// Base URL, token, `"METHOD /path"`, body, and whether it runs beside the calls after it
/// ([`Harness::api_start`]) instead of before them.
type ApiCall = (String, String, String, Option<Value>, bool);
type ApiResult = Result<(u16, Value), String>;
/// An answer as the control client got it: status, body, and its `x-shoal-ack` header.
type Answered = Result<(u16, Value, Option<String>), String>;

/// A call under way ([`Harness::api_start`]).
pub struct Started(mpsc::Receiver<Answered>);

/// One call of the control client: its answer as the client got it.
async fn control_call(
    client: &HttpClient<SimEnv>,
    base: &str,
    token: &str,
    call: &str,
    body: Option<Value>,
) -> Answered {
    let (method, path) = call.split_once(' ').unwrap_or(("GET", call));
    let auth = format!("Bearer {token}");
    let body = body.map(|b| serde_json::to_vec(&b).expect("json")).unwrap_or_default();
    let r = client.request(base, method, path, &[("authorization", &auth)], body, 30_000).await;
    r.map(|resp| {
        let ack = resp.header("x-shoal-ack").map(str::to_string);
        (resp.status, serde_json::from_slice(&resp.body).unwrap_or(Value::Null), ack)
    })
    .map_err(|e| e.to_string())
}

struct SimNode {
    name: String,
    dir: PathBuf,
    slot: Arc<Mutex<Option<Weak<Shared<SimEnv>>>>>,
    clock: Arc<Mutex<ClockFault>>,
    running: bool,
    crashed_at_ms: Option<u64>,
    disk: Arc<Mutex<(u64, u64)>>,
    /// The build the node runs at its next start (`None`: the compiled-in one).
    build: Arc<Mutex<Option<Build>>>,
}

/// A build: its name and built-in manifests.
pub type Build = (String, Vec<shoal_core::config::resolve::Manifest>);

/// What one node currently believes, read straight from its core.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub id: NodeId,
    pub cluster: Option<String>,
    pub versions: Vec<(NodeId, String)>,
    pub states: BTreeMap<NodeId, NodeState>,
    pub admin: BTreeMap<NodeId, AdminState>,
    pub removed: BTreeSet<NodeId>,
    /// Members this node has not heard of since it started (UNKNOWN by the spec's rule).
    pub never_heard: BTreeSet<NodeId>,
    /// The valid metadata lease as this node sees it.
    pub leader: Option<Lease>,
    pub meta_digest: String,
    pub meta_records: usize,
    pub pending: usize,
    pub snapshots_adopted: u64,
    /// Entries and records this node's metadata store refused (none, while every node keeps
    /// the record bounds).
    pub meta_refused: u64,
    /// Every setting (tombstones too) with its version.
    pub settings: BTreeMap<String, Version>,
}

pub struct Harness {
    pub cfg: SimConfig,
    sim: turmoil::Sim<'static>,
    nodes: Vec<SimNode>,
    sim_ms: Arc<AtomicU64>,
    ctl_tx: tokio::sync::mpsc::UnboundedSender<(ApiCall, mpsc::Sender<Answered>)>,
    /// The `x-shoal-ack` header of the last answer [`Harness::api`] returned (`unconfirmed`: a
    /// change made on that node that no other node confirmed within the bound).
    pub last_ack: Option<String>,
    _root: tempfile::TempDir,
    digest: Sha256,
    /// What happened, in order, for a failure report.
    pub log: Vec<String>,
    /// Per node: ids it has seen removed (they must stay removed).
    seen_removed: Vec<BTreeSet<NodeId>>,
    pub ids: Vec<NodeId>,
    /// Settings writes the API acknowledged: key -> (newest version, node that took it).
    pub acked: BTreeMap<String, (Version, usize)>,
    /// Settings writes answered as held by another node (`x-shoal-ack: replicated` or
    /// `durable`): key -> newest such version. These survive even the removal of the node that
    /// took them; other acknowledged writes may go with a node removed while they waited.
    pub acked_held: BTreeMap<String, Version>,
    /// Nodes removed from the cluster (their unreplicated writes go with them).
    pub removed_nodes: BTreeSet<usize>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Harness {
    pub fn new(cfg: SimConfig) -> Harness {
        let mut rng = SeededRng::new(cfg.seed);
        let mut sim = turmoil::Builder::new()
            .rng_seed(cfg.seed)
            .tick_duration(Duration::from_millis(cfg.tick_ms))
            .simulation_duration(Duration::from_secs(24 * 3600))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(1 + rng.below(40)))
            .tcp_capacity(4096)
            .build();
        let root = tempfile::Builder::new().prefix("shoal-sim-").tempdir().expect("temp dir");
        let sim_ms = Arc::new(AtomicU64::new(0));
        let mut nodes = Vec::new();
        for i in 0..cfg.nodes {
            let name = format!("n{i}");
            let dir = root.path().join(&name);
            let fault = if cfg.clock_faults {
                ClockFault { offset_ms: rng.below(480_001) as i64 - 240_000, drift_ppm: rng.below(401) as i64 - 200 }
            } else {
                ClockFault::default()
            };
            let clock = Arc::new(Mutex::new(fault));
            let slot = Arc::new(Mutex::new(None));
            let disk = Arc::new(Mutex::new(crate::env::DISK_DEFAULT));
            let build: Arc<Mutex<Option<Build>>> = Arc::new(Mutex::new(None));
            let build_slot = build.clone();
            let env = SimEnv::with_disk(clock.clone(), sim_ms.clone(), rng.next_u64(), disk.clone());
            let (d, s, m, host) = (dir.clone(), slot.clone(), cfg.membership.clone(), name.clone());
            let mc = cfg.meta.clone();
            let behind_nat = cfg.nat.contains(&i);
            sim.host(name.as_str(), move || {
                let (env, dir, slot, membership, host) = (env.clone(), d.clone(), s.clone(), m.clone(), host.clone());
                let meta = mc.clone();
                let build = lock(&build_slot).clone();
                async move {
                    let mut opts = ServeOptions::new(dir, format!("0.0.0.0:{PORT}"));
                    opts.advertise =
                        Some(if behind_nat { "none".to_string() } else { format!("http://{host}:{PORT}") });
                    opts.name = Some(host);
                    opts.durable = true;
                    opts.offload_io = false;
                    opts.membership = membership;
                    opts.meta = meta;
                    opts.build = build;
                    opts.jobs_engine = shoal_shell::node::state::JobsEngine::Simulated;
                    let d = daemon::start(env, opts).await.map_err(|e| e.to_string())?;
                    *lock(&slot) = Some(d.downgrade());
                    d.wait().await;
                    Ok(())
                }
            });
            nodes.push(SimNode { name, dir, slot, clock, running: true, crashed_at_ms: None, disk, build });
        }
        let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::unbounded_channel::<(ApiCall, mpsc::Sender<Answered>)>();
        let ctl_env = SimEnv::new(Arc::new(Mutex::new(ClockFault::default())), sim_ms.clone(), rng.next_u64());
        sim.client(CTL, async move {
            let client = HttpClient::new(ctl_env);
            while let Some(((base, token, call, body, beside), reply)) = ctl_rx.recv().await {
                if beside {
                    let client = client.clone();
                    tokio::task::spawn_local(async move {
                        let _ = reply.send(control_call(&client, &base, &token, &call, body).await);
                    });
                } else {
                    let _ = reply.send(control_call(&client, &base, &token, &call, body).await);
                }
            }
            Ok(())
        });
        let n = cfg.nodes;
        let mut h = Harness {
            cfg,
            sim,
            nodes,
            sim_ms,
            ctl_tx,
            last_ack: None,
            _root: root,
            digest: Sha256::new(),
            log: Vec::new(),
            seen_removed: vec![BTreeSet::new(); n],
            ids: Vec::new(),
            acked: BTreeMap::new(),
            acked_held: BTreeMap::new(),
            removed_nodes: BTreeSet::new(),
        };
        // Let every host start and write its identity.
        h.step_for(100).expect("start");
        h.ids = (0..n).map(|i| h.snapshot(i).map(|s| s.id).expect("node started")).collect();
        h
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.sim.elapsed().as_millis() as u64
    }

    fn note(&mut self, what: String) {
        let line = format!("[{:>8} ms] {what}", self.elapsed_ms());
        self.digest.update(line.as_bytes());
        self.log.push(line);
    }

    /// Advance by `ms`, checking the always-invariants every simulated second.
    pub fn run_checked(&mut self, ms: u64) -> Result<(), String> {
        let end = self.elapsed_ms() + ms;
        while self.elapsed_ms() < end {
            self.step_for(1_000.min(end - self.elapsed_ms()))?;
            self.check_always()?;
        }
        Ok(())
    }

    /// Advance until `check_converged` holds, at most `bound_ms`; the error says why not.
    pub fn converge_within(&mut self, bound_ms: u64) -> Result<u64, String> {
        let start = self.elapsed_ms();
        loop {
            self.run_checked(1_000)?;
            match self.check_converged() {
                Ok(()) => return Ok(self.elapsed_ms() - start),
                Err(e) if self.elapsed_ms() - start >= bound_ms => {
                    return Err(format!("not converged after {bound_ms} ms: {e}"))
                }
                Err(_) => {}
            }
        }
    }

    /// Advance the simulation by `ms` without checks.
    pub fn step_for(&mut self, ms: u64) -> Result<(), String> {
        let end = self.elapsed_ms() + ms;
        while self.elapsed_ms() < end {
            self.sim.step().map_err(|e| format!("simulation error: {e}"))?;
            self.sim_ms.store(self.elapsed_ms(), Ordering::SeqCst);
        }
        Ok(())
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].running
    }

    /// Call node `i`'s admin API from the operator's host, e.g. `api(0, "POST /v1/cluster/create", ..)`.
    pub fn api(&mut self, i: usize, call: &str, body: Option<Value>) -> ApiResult {
        self.api_with(i, call, body, |_| {})
    }

    /// [`Harness::api`], calling `between` after each simulation step while the call is under
    /// way (to inject a fault at a chosen moment of it).
    pub fn api_with(
        &mut self,
        i: usize,
        call: &str,
        body: Option<Value>,
        between: impl FnMut(&mut Harness),
    ) -> ApiResult {
        let rx = self.send_call(i, call, body, false)?;
        self.api_wait(i, call, rx, between)
    }

    /// Start a call that runs beside the ones made after it (each of those waits only for its
    /// own answer): a put still under way while a move of its file is made, say. Its answer
    /// comes from [`Harness::api_wait`].
    pub fn api_start(&mut self, i: usize, call: &str, body: Option<Value>) -> Result<Started, String> {
        self.send_call(i, call, body, true)
    }

    fn send_call(&mut self, i: usize, call: &str, body: Option<Value>, beside: bool) -> Result<Started, String> {
        let token = std::fs::read_to_string(self.nodes[i].dir.join(shoal_shell::persist::identity::TOKEN_FILE))
            .map_err(|e| format!("token of {}: {e}", self.nodes[i].name))?;
        let base = format!("http://{}:{PORT}", self.nodes[i].name);
        let (tx, rx) = mpsc::channel();
        self.ctl_tx
            .send(((base, token.trim().to_string(), call.to_string(), body, beside), tx))
            .map_err(|_| "control client stopped".to_string())?;
        Ok(Started(rx))
    }

    /// The answer to call `call` on node `i` (sent as `rx`), stepping the simulation until it
    /// comes (at most 60 s), and calling `between` after each step.
    pub fn api_wait(
        &mut self,
        i: usize,
        call: &str,
        Started(rx): Started,
        mut between: impl FnMut(&mut Harness),
    ) -> ApiResult {
        if let Ok(r) = rx.try_recv() {
            return self.answered(i, call, r);
        }
        for _ in 0..(60_000 / self.cfg.tick_ms) {
            self.sim.step().map_err(|e| format!("simulation error: {e}"))?;
            self.sim_ms.store(self.elapsed_ms(), Ordering::SeqCst);
            between(self);
            if let Ok(r) = rx.try_recv() {
                return self.answered(i, call, r);
            }
        }
        self.last_ack = None;
        Err(format!("no answer to {call} on n{i} within 60 s"))
    }

    fn answered(&mut self, i: usize, call: &str, r: Answered) -> ApiResult {
        self.note(format!(
            "api n{i} {call} -> {}",
            r.as_ref()
                .map(|(s, _, ack)| match ack {
                    Some(ack) => format!("{s} ({ack})"),
                    None => s.to_string(),
                })
                .unwrap_or_else(|e| e.clone())
        ));
        self.last_ack = r.as_ref().ok().and_then(|(_, _, ack)| ack.clone());
        r.map(|(s, v, _)| (s, v))
    }

    fn api_ok(&mut self, i: usize, call: &str, body: Option<Value>) -> Result<Value, String> {
        match self.api(i, call, body)? {
            (200, v) => Ok(v),
            (s, v) => Err(format!("{call} on n{i}: HTTP {s} {v}")),
        }
    }

    /// n0 creates the cluster; every other node joins with a token of n0's.
    pub fn form_cluster(&mut self) -> Result<(), String> {
        self.api_ok(0, "POST /v1/cluster/create", Some(serde_json::json!({"name": "sim"})))?;
        for i in 1..self.nodes.len() {
            let t = self.api_ok(0, "POST /v1/tokens", None)?;
            let token = t["token"].as_str().ok_or("no token")?.to_string();
            self.api_ok(i, "POST /v1/cluster/join", Some(serde_json::json!({ "token": token })))?;
        }
        Ok(())
    }

    /// Write a setting through node `i`'s API; a 200 is an acknowledged write.
    pub fn write_setting(&mut self, i: usize, key: &str, value: Value) -> Result<bool, String> {
        Ok(self.write_setting_status(i, key, value)? == 200)
    }

    /// [`Harness::write_setting`], answering the HTTP status.
    pub fn write_setting_status(&mut self, i: usize, key: &str, value: Value) -> Result<u16, String> {
        let (status, body) =
            self.api(i, &format!("PUT /v1/settings/{key}"), Some(serde_json::json!({ "value": value })))?;
        if status != 200 {
            return Ok(status);
        }
        let v: Version = serde_json::from_value(body["version"].clone()).map_err(|e| format!("setting reply: {e}"))?;
        if matches!(self.last_ack.as_deref(), Some("replicated" | "durable")) {
            let held = self.acked_held.entry(key.to_string()).or_insert(v.clone());
            if v > *held {
                *held = v.clone();
            }
        }
        let entry = self.acked.entry(key.to_string()).or_insert((v.clone(), i));
        if v > entry.0 {
            *entry = (v, i);
        }
        Ok(200)
    }

    /// Remove node `j` from the cluster through node `i`.
    pub fn remove_node(&mut self, i: usize, j: usize) -> ApiResult {
        let id = self.ids[j].to_string();
        let r = self.api(i, &format!("DELETE /v1/nodes/{id}"), None)?;
        if r.0 == 200 {
            self.removed_nodes.insert(j);
        }
        Ok(r)
    }

    /// Metadata invariants that hold at every instant: no two nodes act on the same lease.
    pub fn check_meta_always(&mut self) -> Result<(), String> {
        let mut acting: BTreeMap<Lease, usize> = BTreeMap::new();
        for i in 0..self.nodes.len() {
            let Some(s) = self.snapshot(i) else { continue };
            if let Some(l) = s.leader.filter(|l| l.holder == s.id) {
                if let Some(other) = acting.insert(l.clone(), i) {
                    return Err(format!("n{other} and n{i} both act on lease {l:?}"));
                }
                self.digest.update(format!("lead|{i}|{}|{}", l.term, l.holder).as_bytes());
            }
        }
        Ok(())
    }

    /// After healing: exactly one leader that every live member follows.
    pub fn check_one_leader(&self) -> Result<Lease, String> {
        let live = self.live_members();
        let snaps: Vec<(usize, Snapshot)> = live.iter().map(|&i| (i, self.snapshot(i).expect("live"))).collect();
        let leaders: Vec<usize> = snaps
            .iter()
            .filter(|(_, s)| s.leader.as_ref().is_some_and(|l| l.holder == s.id))
            .map(|(i, _)| *i)
            .collect();
        if leaders.len() != 1 {
            let views: Vec<String> = snaps
                .iter()
                .map(|(i, s)| {
                    let admin: Vec<String> = s
                        .admin
                        .iter()
                        .filter(|(_, a)| **a != AdminState::Active)
                        .map(|(id, a)| format!("{}={a:?}", &id.as_str()[..8]))
                        .collect();
                    format!("n{i}({}) follows {:?}, admin {admin:?}", &s.id.as_str()[..8], s.leader)
                })
                .collect();
            return Err(format!("{} nodes act as leader: {leaders:?}; {}", leaders.len(), views.join("; ")));
        }
        let lease = snaps.iter().find(|(i, _)| *i == leaders[0]).and_then(|(_, s)| s.leader.clone()).expect("leader");
        for (i, s) in &snaps {
            if s.leader.as_ref() != Some(&lease) {
                return Err(format!("n{i} follows {:?}, the leader holds {lease:?}", s.leader));
            }
        }
        Ok(lease)
    }

    /// After healing: identical record sets, identical resolved config, nothing pending, every
    /// acknowledged write present.
    pub fn check_meta_converged(&self) -> Result<(), String> {
        let live = self.live_members();
        let snaps: Vec<(usize, Snapshot)> = live.iter().map(|&i| (i, self.snapshot(i).expect("live"))).collect();
        let Some((first_i, first)) = snaps.first() else { return Ok(()) };
        for (i, s) in &snaps {
            if s.pending > 0 {
                return Err(format!("n{i} still has {} pending submits", s.pending));
            }
            if s.meta_digest != first.meta_digest {
                return Err(format!(
                    "metadata differs between n{first_i} ({} records) and n{i} ({} records)",
                    first.meta_records, s.meta_records
                ));
            }
            let resolved = self.read(*i, |n, _| n.config_resolver().resolved().clone());
            let first_resolved = self.read(*first_i, |n, _| n.config_resolver().resolved().clone());
            if resolved != first_resolved {
                return Err(format!("n{first_i} and n{i} resolve the config differently"));
            }
            // A write held by another node must survive whatever happens to the node that
            // took it; any other acknowledged write, unless that node was removed.
            let held = self.acked_held.iter();
            let kept = self.acked.iter().filter(|(_, (_, origin))| !self.removed_nodes.contains(origin));
            for (key, v) in held.chain(kept.map(|(key, (v, _))| (key, v))) {
                match s.settings.get(key) {
                    Some(have) if have >= v => {}
                    other => return Err(format!("n{i} lost acknowledged write {key}@{v} (has {other:?})")),
                }
            }
        }
        Ok(())
    }

    // ---- faults ----

    pub fn partition(&mut self, a: usize, b: usize) {
        self.note(format!("partition n{a} <-> n{b}"));
        self.sim.partition(self.nodes[a].name.as_str(), self.nodes[b].name.as_str());
    }

    pub fn partition_oneway(&mut self, from: usize, to: usize) {
        self.note(format!("partition n{from} -> n{to}"));
        self.sim.partition_oneway(self.nodes[from].name.as_str(), self.nodes[to].name.as_str());
    }

    pub fn hold(&mut self, a: usize, b: usize) {
        self.note(format!("hold n{a} <-> n{b}"));
        self.sim.hold(self.nodes[a].name.as_str(), self.nodes[b].name.as_str());
    }

    pub fn release(&mut self, a: usize, b: usize) {
        self.note(format!("release n{a} <-> n{b}"));
        self.sim.release(self.nodes[a].name.as_str(), self.nodes[b].name.as_str());
    }

    pub fn set_latency(&mut self, a: usize, b: usize, ms: u64) {
        self.note(format!("latency n{a} <-> n{b} {ms} ms"));
        self.sim.set_link_latency(self.nodes[a].name.as_str(), self.nodes[b].name.as_str(), Duration::from_millis(ms));
    }

    pub fn crash(&mut self, i: usize) {
        if !self.nodes[i].running {
            return;
        }
        self.note(format!("crash n{i}"));
        self.sim.crash(self.nodes[i].name.as_str());
        *lock(&self.nodes[i].slot) = None;
        self.nodes[i].running = false;
        self.nodes[i].crashed_at_ms = Some(self.elapsed_ms());
    }

    /// Restart a node (its data dir is kept).
    pub fn bounce(&mut self, i: usize) {
        self.note(format!("bounce n{i}"));
        *lock(&self.nodes[i].slot) = None;
        self.sim.bounce(self.nodes[i].name.as_str());
        self.nodes[i].running = true;
        self.nodes[i].crashed_at_ms = None;
    }

    pub fn set_clock(&mut self, i: usize, fault: ClockFault) {
        self.note(format!("clock n{i} offset {} ms drift {} ppm", fault.offset_ms, fault.drift_ppm));
        *lock(&self.nodes[i].clock) = fault;
    }

    /// Repair every link and release every held message.
    pub fn heal_network(&mut self) {
        self.note("heal network".into());
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for a in &names {
            for b in &names {
                if a < b {
                    self.sim.repair(a.as_str(), b.as_str());
                    self.sim.release(a.as_str(), b.as_str());
                    self.sim.set_link_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
                }
            }
        }
    }

    /// Restart node `i` on another build (a rolling upgrade step); its data dir is kept.
    pub fn upgrade(&mut self, i: usize, build: Build) {
        self.note(format!("upgrade n{i} to build {}", build.0));
        *lock(&self.nodes[i].build) = Some(build);
        self.bounce(i);
    }

    // ---- the cluster drive ----

    /// The folder node `i` contributes as its volume.
    pub fn volume_dir(&self, i: usize) -> PathBuf {
        self.nodes[i].dir.with_file_name(format!("{}-volume", self.nodes[i].name))
    }

    /// Node `i` contributes its volume folder; returns the volume id.
    pub fn add_volume(&mut self, i: usize) -> Result<String, String> {
        let dir = self.volume_dir(i);
        let v = self.api_ok(
            i,
            "POST /v1/volumes",
            Some(serde_json::json!({"path": dir.to_string_lossy(), "create": true})),
        )?;
        v["id"].as_str().map(str::to_string).ok_or_else(|| format!("no volume id in {v}"))
    }

    /// Put a file through node `i`. Its bytes are the JSON text of `content` (the control
    /// client speaks JSON), so a get reads them back as the same string.
    pub fn put_file(&mut self, i: usize, path: &str, content: &str) -> ApiResult {
        self.api(i, &format!("PUT /v1/files{path}"), Some(Value::String(content.to_string())))
    }

    /// Read a file through node `i`: `Ok(Some(content))` when it comes back whole and right.
    pub fn get_file(&mut self, i: usize, path: &str) -> Result<Option<String>, String> {
        match self.api(i, &format!("GET /v1/files{path}"), None) {
            Ok((200, Value::String(s))) => Ok(Some(s)),
            Ok(_) => Ok(None),
            Err(e) if e.contains("no answer") => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// The bytes `put_file` stores for `content`.
    pub fn file_bytes(content: &str) -> Vec<u8> {
        serde_json::to_vec(&Value::String(content.to_string())).expect("json")
    }

    /// The full-disk fault: every volume of node `i` reports `free` of `total` bytes (taken at
    /// its next usage measurement, every 60 s).
    pub fn set_disk(&mut self, i: usize, free: u64, total: u64) {
        self.note(format!("disk n{i} free {free} of {total}"));
        *lock(&self.nodes[i].disk) = (free, total);
    }

    /// Flip one byte of node `i`'s stored copy of `path` (bit rot). False when it has none.
    pub fn flip_byte(&mut self, i: usize, path: &str, at: usize) -> bool {
        let file = self.volume_dir(i).join(path.trim_start_matches('/'));
        let Ok(mut bytes) = std::fs::read(&file) else { return false };
        if bytes.is_empty() {
            return false;
        }
        let k = at % bytes.len();
        bytes[k] ^= 0x5a;
        self.note(format!("flip byte {k} of n{i}:{path}"));
        std::fs::write(&file, &bytes).is_ok()
    }

    /// Node `i`'s stored copy of `path`, if any.
    pub fn stored(&self, i: usize, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.volume_dir(i).join(path.trim_start_matches('/'))).ok()
    }

    /// Read anything from node `i`'s core (None when it is down).
    pub fn read<R>(&self, i: usize, f: impl FnOnce(&shoal_core::node::Node, shoal_core::Millis) -> R) -> Option<R> {
        let weak = lock(&self.nodes[i].slot).clone()?;
        let shared = weak.upgrade()?;
        Some(shared.read_node(f))
    }

    // ---- observation ----

    pub fn snapshot(&self, i: usize) -> Option<Snapshot> {
        let weak = lock(&self.nodes[i].slot).clone()?;
        let shared = weak.upgrade()?;
        Some(shared.read_node(|n, now| {
            let m = n.members();
            Snapshot {
                id: n.id().clone(),
                cluster: n.cluster().map(|c| c.id.to_string()),
                versions: m.versions(),
                states: m.records().filter(|r| !r.removed).map(|r| (r.id.clone(), n.node_state(&r.id, now))).collect(),
                admin: m.records().map(|r| (r.id.clone(), r.admin_state)).collect(),
                removed: m.records().filter(|r| r.removed).map(|r| r.id.clone()).collect(),
                never_heard: m
                    .records()
                    .filter(|r| &r.id != n.id() && m.last_seen(&r.id) == shoal_core::Millis::ZERO)
                    .map(|r| r.id.clone())
                    .collect(),
                leader: n.meta_leader(now),
                meta_digest: n.meta().state().digest(),
                meta_records: n.meta().state().len(),
                pending: n.meta().pending_len(),
                snapshots_adopted: n.meta().snapshots_adopted(),
                meta_refused: n.meta().status(now).refused,
                settings: n
                    .meta()
                    .state()
                    .of_kind(RecordKind::Setting)
                    .filter_map(|r| match r {
                        Record::Setting(s) => Some((s.key.clone(), s.version.clone())),
                        _ => None,
                    })
                    .collect(),
            }
        }))
    }

    /// Indices of nodes that run and are in a cluster.
    pub fn live_members(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].running && self.snapshot(i).is_some_and(|s| s.cluster.is_some()))
            .collect()
    }

    /// Invariants that hold at every instant. Also folds the state into the digest.
    pub fn check_always(&mut self) -> Result<(), String> {
        let now = self.elapsed_ms();
        let m = self.cfg.membership.clone();
        let slack = m.heartbeat_interval_ms + 5_000;
        for i in 0..self.nodes.len() {
            let Some(s) = self.snapshot(i) else { continue };
            self.digest.update(
                format!("{now}|{i}|{:?}|{:?}|{:?}|{:?}", s.cluster, s.versions, s.states, s.removed).as_bytes(),
            );
            // A removed node never comes back as a member.
            for id in &self.seen_removed[i] {
                if s.states.contains_key(id) {
                    return Err(format!("n{i} sees removed node {id} as a member again"));
                }
            }
            self.seen_removed[i].extend(s.removed.iter().cloned());
            if s.cluster.is_none() {
                self.seen_removed[i].clear();
                continue;
            }
            // States follow the thresholds for crashed nodes.
            for (j, node) in self.nodes.iter().enumerate() {
                let Some(crashed) = node.crashed_at_ms else { continue };
                let Some(state) = self.ids.get(j).and_then(|id| s.states.get(id)) else { continue };
                let down = now - crashed;
                if matches!(state, NodeState::Maintenance | NodeState::Draining) {
                    continue;
                }
                if down > m.online_within_ms + slack && *state == NodeState::Online {
                    return Err(format!("n{i} still sees n{j} ONLINE {down} ms after it crashed"));
                }
                let silent_since_start = self.ids.get(j).is_some_and(|id| s.never_heard.contains(id));
                if down > m.unknown_within_ms + slack && *state != NodeState::Offline && !silent_since_start {
                    return Err(format!("n{i} sees n{j} {state:?} {down} ms after it crashed (want OFFLINE)"));
                }
            }
        }
        Ok(())
    }

    /// After healing: every live member holds the same membership, and sees every other live
    /// member ONLINE (or in its admin state).
    pub fn check_converged(&self) -> Result<(), String> {
        let live = self.live_members();
        let snaps: Vec<(usize, Snapshot)> = live.iter().map(|&i| (i, self.snapshot(i).expect("live"))).collect();
        let Some((first_i, first)) = snaps.first() else { return Ok(()) };
        for (i, s) in &snaps[1..] {
            if s.cluster != first.cluster {
                return Err(format!("n{i} is in cluster {:?}, n{first_i} in {:?}", s.cluster, first.cluster));
            }
            if s.versions != first.versions {
                return Err(format!(
                    "membership differs between n{first_i} and n{i}:\n  {:?}\n  {:?}",
                    first.versions, s.versions
                ));
            }
        }
        for (i, s) in &snaps {
            for (j, other) in &snaps {
                let want = match s.admin.get(&other.id).copied().unwrap_or_default() {
                    AdminState::Maintenance => NodeState::Maintenance,
                    AdminState::Draining => NodeState::Draining,
                    AdminState::Active => NodeState::Online,
                };
                let got = s.states.get(&other.id).copied();
                if got != Some(want) {
                    return Err(format!("n{i} sees n{j} as {got:?}, want {want:?}"));
                }
            }
        }
        Ok(())
    }

    pub fn digest(&self) -> String {
        hex::encode(self.digest.clone().finalize())
    }
}
