//! The handle every part of a running node shares (DESIGN.md "The shell"): the core [`Node`]
//! behind its lock, the stores, the HTTP client and transport, and each service's state. A
//! call into the node passes the time and then carries out what it asked for ([`Shared::pump`]):
//! persistence, requests to peers, events, config files, and (through the function the daemon
//! gave) the services' work. Kicks ask the core to run a chore sooner; the driver that owns
//! the timer is `crate::daemon`.

use crate::env::Env;
use crate::net::client::HttpClient;
use crate::net::transport::{self, Prepared, Route, Transport};
use crate::node::state::{ReplState, StoreService};
use crate::persist::meta_store::MetaStore;
use crate::persist::store::Store;
use crate::sync::lock;
use shoal_core::node::{ApiError, Event, Input, Node, Output};
use shoal_core::storage::chores::Chore;
use shoal_core::Millis;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Notify};

/// What carries out a service's output (see [`Shared::services`]).
pub type ServiceFn<E> = fn(&Arc<Shared<E>>, Output);

/// What answers a request that came through a tunnel (see [`Shared::tunnel_handler`]).
pub type TunnelHandlerFn<E> =
    fn(
        Arc<Shared<E>>,
        crate::net::tunnel::TunnelledRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::net::client::Response> + Send>>;

pub struct Shared<E: Env> {
    pub env: E,
    pub(crate) node: Mutex<Node>,
    pub(crate) store: Store,
    pub(crate) meta_store: Arc<MetaStore>,
    pub(crate) persist_lock: Mutex<()>,
    pub client: HttpClient<E>,
    pub transport: Transport<E>,
    pub(crate) wake: Notify,
    pub data_dir: PathBuf,
    pub admin_token: String,
    /// The X25519 secret sealed passwords are opened with (derived from the node key:
    /// `shoal_core::identity::box_secret`).
    pub box_secret: [u8; 32],
    pub disable_cluster: bool,
    /// The listener serves HTTPS (session cookies are then `Secure`).
    pub serves_tls: bool,
    pub listen: String,
    pub started: Millis,
    /// Upload sessions of the chunked transfer protocol.
    pub store_service: StoreService,
    /// Blocking disk work goes to tokio's blocking pool (not in simulation).
    pub offload_io: bool,
    /// Replication bookkeeping of the shell (pulls running, disk work done).
    pub repl: ReplState,
    /// The jobs running here (`services::jobs`).
    pub jobs: super::state::JobsState,
    /// What runs job scripts (QuickJS; the simulator's own engine in simulation).
    pub jobs_engine: super::state::JobsEngine,
    /// Carries out the outputs that are a service's work (chores, scrub hashing, replication
    /// tasks); given by [`crate::daemon::start`], so this handle depends on no service.
    pub(crate) services: ServiceFn<E>,
    /// Answers requests that come through a tunnel with the node's own ACN handler; given by
    /// [`crate::daemon::start`] (the router's), so this handle depends on no HTTP server.
    pub(crate) tunnel_handler: TunnelHandlerFn<E>,
    /// The deadline (wall ms) the driver sleeps until; `u64::MAX` while it is awake.
    pub(crate) armed: AtomicU64,
    /// Told whenever the node took an input (a request, a peer's answer, a timer turn).
    pub(crate) changed: Notify,
    /// Told when what decides whether this node's changes are held elsewhere moved
    /// (`Node::held_progress`), and at every driver turn: [`Shared::wait_for_held`].
    pub(crate) held_moved: Notify,
    pub(crate) shutdown: watch::Sender<bool>,
    /// The shell's counters for `/metrics` (requests, bytes).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Told once the node is dropped with its database closed ([`crate::daemon::Daemon::shutdown`]
    /// waits for it). The last field: fields drop in order, so every other one is gone by then.
    pub(crate) released: Released,
}

/// Tells its [`Notify`] when it is dropped (a stored permit: a waiter that comes later still
/// hears it).
#[derive(Default)]
pub(crate) struct Released(pub(crate) Arc<Notify>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

impl<E: Env> Shared<E> {
    /// Run `f` on the node at the current time, then carry out what it asked for.
    pub fn with_node<R>(self: &Arc<Self>, f: impl FnOnce(&mut Node, Millis) -> R) -> R {
        let mono = self.env.monotonic();
        let now = self.env.now();
        let (r, held_moved) = {
            let mut node = lock(&self.node);
            node.observe_monotonic(mono);
            let held_before = node.held_progress();
            let r = f(&mut node, now);
            let held_moved = node.held_progress() != held_before;
            // The call may have brought a deadline forward (a kicked chore): the driver, asleep
            // until the one it armed, looks again.
            if node.poll_timeout().is_some_and(|d| d.0 < self.armed.load(Ordering::Acquire)) {
                self.wake.notify_one();
            }
            (r, held_moved)
        };
        self.pump();
        // Whoever waits for a condition on the node ([`Shared::wait_for`]) looks again.
        self.changed.notify_waiters();
        if held_moved {
            self.held_moved.notify_waiters();
        }
        r
    }

    /// Wait until `cond` holds on the node, for at most `within_ms`: woken each time the node
    /// took an input (a request, a peer's answer, a timer turn), never by polling. Whether it
    /// holds at the end.
    pub async fn wait_for(&self, within_ms: u64, cond: impl FnMut(&mut Node, Millis) -> bool) -> bool {
        self.wait_on(&self.changed, within_ms, cond).await
    }

    /// [`Shared::wait_for`] for a condition on whether this node's changes are held by another
    /// node (`Node::ack_ready`, `Node::file_record_held_elsewhere`, ...): woken only when
    /// `Node::held_progress` moved or the driver turned, not by every input. With 16 clients
    /// writing through one node, each input woke all 16 waiting requests, and each wake-up
    /// polled its connection (issue 18).
    pub async fn wait_for_held(&self, within_ms: u64, cond: impl FnMut(&mut Node, Millis) -> bool) -> bool {
        self.wait_on(&self.held_moved, within_ms, cond).await
    }

    async fn wait_on(&self, told: &Notify, within_ms: u64, mut cond: impl FnMut(&mut Node, Millis) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(within_ms);
        loop {
            let changed = told.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.look(&mut cond) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.look(&mut cond);
            }
        }
    }

    /// Ask the node something that may tidy its own state (prune what expired) but sends,
    /// writes and schedules nothing: no pump, no wake-ups.
    fn look<R>(&self, f: impl FnOnce(&mut Node, Millis) -> R) -> R {
        let mono = self.env.monotonic();
        let now = self.env.now();
        let mut node = lock(&self.node);
        node.observe_monotonic(mono);
        f(&mut node, now)
    }

    /// Read the node without producing outputs.
    pub fn read_node<R>(&self, f: impl FnOnce(&Node, Millis) -> R) -> R {
        let mono = self.env.monotonic();
        let now = self.env.now();
        let mut node = lock(&self.node);
        node.observe_monotonic(mono);
        f(&node, now)
    }

    /// Drain the node's outputs and carry them out.
    pub fn pump(self: &Arc<Self>) {
        let _order = lock(&self.persist_lock);
        // Routes are picked while the node is at hand: the transport's choice, or the URL the
        // core named (a node being evicted is no longer a member the transport knows).
        let outputs: Vec<(Output, Option<(Route, String)>)> = {
            let mut node = lock(&self.node);
            let drained: Vec<Output> = std::iter::from_fn(|| node.poll_output()).collect();
            drained
                .into_iter()
                .map(|o| {
                    let route = match &o {
                        Output::Send(req) => {
                            let route =
                                transport::route(&node, &req.to).unwrap_or_else(|_| Route::Direct(req.url.clone()));
                            let pin = node.route_pin(&req.to, &route);
                            Some((route, pin))
                        }
                        _ => None,
                    };
                    (o, route)
                })
                .collect()
        };
        if outputs.is_empty() {
            return;
        }
        let mut ops = Vec::new();
        let mut meta_ops = Vec::new();
        for (o, route) in outputs {
            match o {
                Output::Persist(op) => ops.push(op),
                Output::Meta(op) => meta_ops.push(op),
                Output::Send(req) => {
                    let shared = self.clone();
                    let (route, pin) = route.unwrap_or_else(|| (Route::Direct(req.url.clone()), String::new()));
                    tokio::spawn(async move {
                        // Signed as it is sent, off the node's lock and this pump's.
                        let prepared = Prepared {
                            to: req.to.clone(),
                            route,
                            pin,
                            method: req.method.to_string(),
                            target: req.target.clone(),
                            signature: req.signature,
                            body_hash: None,
                            extra: Vec::new(),
                            body: req.body.into(),
                        };
                        let res = shared.transport.send(prepared, req.timeout_ms).await;
                        let result = res
                            .map(|r| crate::wire::error::peer_answer(r.status, r.body.to_vec()))
                            .map_err(|e| e.to_string());
                        shared.with_node(|n, now| n.handle(now, Input::Response { token: req.token, result }));
                    });
                }
                Output::Event(e) => log_event(&e),
                Output::SampleHealth => {
                    // Read off the node's lock (and this pump's), then handed back as an input.
                    let shared = self.clone();
                    tokio::spawn(async move {
                        let h = shared.env.health(&shared.data_dir, shared.env.now());
                        shared.with_node(|n, now| n.handle(now, Input::Health(h)));
                    });
                }
                Output::ConfigFiles(own) => write_config_files(&self.data_dir, &own),
                o @ (Output::Chore(_)
                | Output::ScrubCopy(_)
                | Output::ReplDispatch { .. }
                | Output::JobRun(_)
                | Output::JobStop { .. }
                | Output::TunnelOpen { .. }
                | Output::TunnelClose { .. }
                | Output::WakeBroadcast { .. }) => (self.services)(self, o),
            }
        }
        if !meta_ops.is_empty() {
            // Written behind: coalesced per key, committed by the flusher every 50 ms.
            self.meta_store.queue(meta_ops);
        }
        if let Err(e) = self.store.apply(&ops) {
            // The state stays in memory and is written again with the next change of the record.
            tracing::error!(error = %e, "could not persist cluster state");
        }
        // No wake-up of the driver here: a call that brought a deadline forward wakes it
        // ([`Shared::with_node`]); waking it after every drain ran a turn of every timer per
        // request (issue 18).
    }

    /// Ask the node to stop; [`Daemon::wait`] returns once it has.
    pub fn request_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Run blocking work (file I/O) on the blocking pool, or inline in simulation.
    pub async fn blocking<R: Send + 'static>(self: &Arc<Self>, f: impl FnOnce() -> R + Send + 'static) -> R {
        if self.offload_io {
            match tokio::task::spawn_blocking(f).await {
                Ok(r) => r,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        } else {
            f()
        }
    }

    /// Ask for a planner pass now (it runs if this node is the leader).
    pub fn repl_kick(self: &Arc<Self>) {
        self.with_node(|n, now| n.chore_kick(now, Chore::Plan));
    }

    /// Resolve and apply this node's config at the driver's next turn (the core's config
    /// pass, `Node::config_kick`).
    pub fn config_kick(&self) {
        lock(&self.node).config_kick();
        self.wake.notify_one();
    }

    /// Ask for this node's disk work (deletes and renames the records ask for) now.
    pub fn disk_kick(self: &Arc<Self>) {
        self.with_node(|n, now| n.chore_kick(now, Chore::Reconcile));
    }

    /// Ask the scrub to go on now instead of resting.
    pub fn scrub_kick(self: &Arc<Self>) {
        self.with_node(|n, now| n.chore_kick(now, Chore::Scrub));
    }

    pub fn shutdown_requested(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }
}

/// Write each module's resolved values to `DATA/config/<module>.json` (through a temporary
/// file, so a reader never sees half of one).
fn write_config_files(
    data_dir: &std::path::Path,
    own: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, shoal_core::config::resolve::Resolved>>,
) {
    let dir = data_dir.join("config");
    if std::fs::create_dir_all(&dir).is_ok() {
        for (module, keys) in own {
            let body = serde_json::to_vec_pretty(keys).unwrap_or_default();
            let tmp = dir.join(format!(".{module}.json.tmp"));
            if std::fs::write(&tmp, body).is_ok() {
                let _ = std::fs::rename(&tmp, dir.join(format!("{module}.json")));
            }
        }
    }
}

fn log_event(e: &Event) {
    match e {
        Event::MemberAdded(id) => tracing::info!(node = %id, "member joined"),
        Event::MemberRemoved(id) => tracing::info!(node = %id, "member removed"),
        Event::StateChanged { node, from, to } => {
            tracing::info!(node = %node, from = from.as_str(), to = to.as_str(), "node state changed")
        }
        Event::RemovedSelf => tracing::warn!("this node was removed from its cluster and has left it"),
        Event::StoreFailing(why) => {
            tracing::error!(error = %why, "this node cannot store metadata: new writes are refused until it can")
        }
        Event::StoreWorks => tracing::info!("this node stores metadata again: writes are taken"),
        Event::ConfigChanged { level, moved } => tracing::info!(level = %level, moved, "config.changed"),
        Event::ConfigRenames { did } => tracing::info!(did = ?did, "config renames"),
        Event::ConfigApplied { changed } => tracing::info!(changed = ?changed, "config applied"),
        Event::ReplTaskExpired { path } => tracing::warn!(path = %path, "a replication task's lease ran out"),
        Event::MetaRefused { from, what, why } => match from {
            Some(peer) => tracing::warn!(peer = %peer, what = %what, why = %why, "metadata refused"),
            None => tracing::warn!(what = %what, why = %why, "metadata refused"),
        },
    }
}

/// 409 when this node runs with clustering disabled (`--disable-cluster`).
pub fn cluster_enabled<E: Env>(s: &Shared<E>) -> Result<(), ApiError> {
    if s.disable_cluster {
        return Err(ApiError::conflict("cluster_disabled", "clustering is disabled on this node (--disable-cluster)"));
    }
    Ok(())
}

/// The marks a handler took around every change it made, under one hold of the node each
/// time (`Node::ack_position` before and after): put in its answer's extensions, it narrows
/// the acknowledgement to those changes. A handler that makes changes in more than one hold,
/// or outside its own task, must not set it (the wide span from before the handler to after
/// it then applies).
#[derive(Clone, Debug)]
pub struct AckSpan(pub shoal_core::meta::machine::WriteMark, pub shoal_core::meta::machine::WriteMark);
