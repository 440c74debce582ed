//! The node daemon: owns one core [`Node`], its store and its HTTP listener, and drives it
//! (DESIGN.md "The shell"; after quinn's `ConnectionDriver`).
//!
//! One driver task arms a single timer from `poll_timeout` and pumps outputs.
//! Request handlers call into the node under its lock and then pump too. A pump drains the
//! node's outputs and carries them out: persistence in one redb transaction (under a lock that
//! keeps batches in order), requests as spawned tasks whose answers come back as inputs, events
//! to the log.

use crate::env::Env;
use crate::net::client::HttpClient;
use crate::net::transport::Transport;
use crate::node::handle::Shared;
use crate::node::state::ReplState;
use crate::persist::identity::{self, IdentityError};
use crate::persist::meta_store::{spawn_flusher, MetaStore};
use crate::persist::store::{Store, StoreError};
use crate::sync::lock;
use shoal_core::membership::MembershipConfig;
use shoal_core::meta::machine::{MetaConfig, MetaRestored};
use shoal_core::node::{Node, NodeConfig, Output, SelfInfo};
use shoal_core::SeededRng;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// How often metadata writes are committed (write-behind batches).
const META_FLUSH_MS: u64 = 50;

/// Longest [`Daemon::shutdown`] waits for spawned tasks to drop the node (and its database).
const SHUTDOWN_RELEASE_MS: u64 = 15_000;

/// Longest the driver sleeps before looking at the clock again (clocks can jump).
const DRIVER_SLEEP_MAX_MS: u64 = 1000;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    /// `host:port` to listen on.
    pub listen: String,
    /// URL peers use to reach this node; defaults to `http://<listen>`. `none`: peers cannot
    /// reach this node (behind NAT); it opens a reverse tunnel to a member.
    pub advertise: Option<String>,
    /// The member this node prefers as its tunnel host (used only while it is ONLINE); with
    /// one set the node keeps a tunnel even with an advertised URL.
    pub tunnel_via: Option<String>,
    pub name: Option<String>,
    pub disable_cluster: bool,
    /// fsync every commit (off only in simulation, where the process never really dies).
    pub durable: bool,
    /// Run blocking disk work on tokio's blocking pool (off in simulation, where real threads
    /// would break determinism).
    pub offload_io: bool,
    pub membership: MembershipConfig,
    pub meta: MetaConfig,
    /// Run as another build with these built-in manifests (the simulator's rolling upgrades);
    /// `None` runs the manifests compiled into this binary.
    pub build: Option<(String, Vec<shoal_core::config::resolve::Manifest>)>,
    /// Timeouts and the connection cap of the HTTP listener.
    pub limits: crate::http::listener::ServeLimits,
    /// What runs job scripts (QuickJS; the simulator sets its own).
    pub jobs_engine: crate::node::state::JobsEngine,
    /// `--rebuild-meta`: keep a damaged `cluster.redb` aside, start from the recovery copy of
    /// the cluster state, take the metadata from the peers and rescan the volumes.
    pub rebuild_meta: bool,
    /// Serve HTTPS with this certificate (`--tls-cert/--tls-key` or `--tls self-signed`).
    pub tls: Option<crate::net::tls::TlsSource>,
}

impl ServeOptions {
    pub fn new(data_dir: impl Into<PathBuf>, listen: impl Into<String>) -> ServeOptions {
        ServeOptions {
            data_dir: data_dir.into(),
            listen: listen.into(),
            advertise: None,
            tunnel_via: None,
            name: None,
            disable_cluster: false,
            durable: true,
            offload_io: true,
            membership: MembershipConfig::default(),
            meta: MetaConfig::default(),
            build: None,
            limits: crate::http::listener::ServeLimits::default(),
            jobs_engine: Default::default(),
            rebuild_meta: false,
            tls: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot open {0}: {1}\nIf the file is damaged (a disk fault, a truncated copy), `shoal serve --rebuild-meta` keeps it aside as cluster.redb.damaged-TIME and rebuilds this node's metadata from its peers and a rescan of its volumes.")]
    Store(PathBuf, StoreError),
    #[error("cannot rebuild the metadata: {0}")]
    Rebuild(#[from] crate::persist::store::RebuildError),
    #[error("cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("bad --advertise URL {0}: it must look like http://host:port")]
    BadAdvertise(String),
    #[error("listening on {0}, an address peers cannot reach: give the URL they reach this node at with --advertise http://HOST:PORT")]
    Unadvertisable(String),
    #[error("TLS: {0}")]
    Tls(#[from] crate::net::tls::TlsError),
    #[error("--advertise {0}: {1}")]
    AdvertiseScheme(String, &'static str),
}

/// A running node. Dropping it does not stop it; call [`Daemon::shutdown`].
pub struct Daemon<E: Env> {
    shared: Arc<Shared<E>>,
    tasks: Vec<JoinHandle<()>>,
    pub local_addr: String,
    /// The pin of the certificate it serves HTTPS with; `None` on plain HTTP.
    pub tls_pin: Option<String>,
}

impl<E: Env> Daemon<E> {
    pub fn shared(&self) -> &Arc<Shared<E>> {
        &self.shared
    }

    /// A handle that does not keep the node alive (the simulator observes through it).
    pub fn downgrade(&self) -> Weak<Shared<E>> {
        Arc::downgrade(&self.shared)
    }

    /// Its own URL on the listen address (`https://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls_pin.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Stop serving, stop the driver, and wait for both; then wait (at most
    /// [`SHUTDOWN_RELEASE_MS`]) for the tasks they spawned (an outbound request, disk work on the
    /// blocking pool) to let go of the node, so that its database is closed when this returns
    /// and a node started on the same data dir right after can open it.
    pub async fn shutdown(self) {
        let _ = self.shared.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let released = self.shared.released.0.clone();
        drop(self.shared);
        let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_RELEASE_MS), released.notified()).await;
    }

    /// Wait until the node is told to stop (or its tasks end).
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Everything the node writes from now on is its owner's only (umask 077: files 0600, folders
/// 0700: the database, the node id, config files, volume files), and files an older build left
/// readable in the data dir are closed (issue 11).
fn owner_only_files(data_dir: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: umask only sets the process's file mode mask.
        unsafe {
            libc::umask(0o077);
        }
        for name in [identity::DB_FILE, identity::ID_FILE, identity::API_URL_FILE] {
            let p = data_dir.join(name);
            if p.is_file() {
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
            }
        }
        if let Ok(rd) = std::fs::read_dir(data_dir.join("config")) {
            let _ = std::fs::set_permissions(data_dir.join("config"), std::fs::Permissions::from_mode(0o700));
            for e in rd.flatten() {
                let _ = std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o600));
            }
        }
    }
}

/// Start a node: identity, database, listener, driver.
pub async fn start<E: Env>(env: E, opts: ServeOptions) -> Result<Daemon<E>, StartError> {
    owner_only_files(&opts.data_dir);
    let mut rng = SeededRng::new(env.seed());
    let ident = identity::load_or_create(&opts.data_dir, &mut rng)?;
    let db_path = opts.data_dir.join(identity::DB_FILE);
    if opts.rebuild_meta {
        let aside = crate::persist::store::rebuild(&db_path, env.now().as_secs())?;
        tracing::warn!(kept = ?aside, "metadata rebuilt from the recovery copy: catching up from the peers, then rescanning the volumes");
    }
    let store = Store::open(&db_path, opts.durable).map_err(|e| StartError::Store(db_path.clone(), e))?;
    let mut restored = store.load().map_err(|e| StartError::Store(db_path.clone(), e))?;
    let meta_store = MetaStore::open(store.database(), opts.durable)
        .map_err(|e| StartError::Store(db_path.clone(), StoreError::Db(e.to_string())))?;
    let meta_loaded =
        meta_store.load().map_err(|e| StartError::Store(db_path.clone(), StoreError::Db(e.to_string())))?;
    for row in &meta_loaded.skipped {
        tracing::warn!(row = %row, "metadata row passed over at start");
    }
    restored.meta = MetaRestored {
        records: meta_loaded.records,
        entries: meta_loaded.entries,
        pending: meta_loaded.pending,
        log_meta: meta_loaded.log_meta,
        purged: meta_loaded.purged,
    };
    let meta_store = Arc::new(meta_store.with_offload(opts.offload_io));

    let listener = env.bind(opts.listen.clone()).await.map_err(|e| StartError::Listen(opts.listen.clone(), e))?;
    let local_addr = match axum::serve::Listener::local_addr(&listener) {
        Ok(a) => format!("{a:?}"),
        Err(_) => opts.listen.clone(),
    };
    let local_addr = if local_addr.parse::<std::net::SocketAddr>().is_ok() { local_addr } else { opts.listen.clone() };
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    // What `cluster config` set is kept across restarts: the flags win only when given.
    let stored = restored.records.iter().find(|r| r.id == ident.id && !r.removed);
    // A stored empty URL is a node behind NAT (`--advertise none` given once).
    let stored_url =
        stored.map(|r| r.advertise_url.clone()).filter(|u| u.is_empty() || shoal_core::token::valid_base_url(u));
    let advertise = match (&opts.advertise, stored_url) {
        (Some(u), _) if u.eq_ignore_ascii_case("none") => String::new(),
        (Some(u), _) => {
            let u = u.trim_end_matches('/').to_string();
            if !shoal_core::token::valid_base_url(&u) {
                return Err(StartError::BadAdvertise(u));
            }
            // The scheme must be the listener's (the core's rule, `url_pin_error`): checked
            // here with a stand-in pin, as the certificate is loaded below.
            let pin = if opts.tls.is_some() { "0".repeat(64) } else { String::new() };
            if let Some(why) = shoal_core::token::url_pin_error(&u, &pin) {
                return Err(StartError::AdvertiseScheme(u, why));
            }
            u
        }
        // The kept URL with the scheme the listener serves now (`--tls` given or dropped).
        (None, Some(u)) if u.is_empty() => u,
        (None, Some(u)) => {
            let rest = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://")).unwrap_or(&u);
            format!("{scheme}://{rest}")
        }
        (None, None) => {
            let u = format!("{scheme}://{local_addr}");
            if !shoal_core::token::valid_base_url(&u) {
                // 0.0.0.0 or [::]: no peer can reach that.
                return Err(StartError::Unadvertisable(local_addr));
            }
            u
        }
    };
    let now = env.now();
    let capabilities = env.capabilities(&opts.data_dir, now);
    let stored_name = stored.map(|r| r.name.clone()).filter(|n| !n.is_empty());
    let name = opts.name.clone().or(stored_name).unwrap_or_else(|| {
        if capabilities.hostname.is_empty() {
            "shoal".to_string()
        } else {
            capabilities.hostname.clone()
        }
    });
    let tls = match &opts.tls {
        Some(source) => {
            // The self-signed certificate names the hosts the node is reached at.
            let mut hosts = vec![];
            for u in [advertise.as_str(), &format!("http://{local_addr}")] {
                if let Ok(p) = crate::net::client::parse_url(u) {
                    hosts.push(p.host().trim_start_matches('[').trim_end_matches(']').to_string());
                }
            }
            Some(crate::net::tls::server(source, &opts.data_dir, &hosts)?)
        }
        None => None,
    };
    let me = SelfInfo {
        name,
        advertise_url: advertise.clone(),
        software_version: env!("CARGO_PKG_VERSION").to_string(),
        capabilities,
        tls_pin: tls.as_ref().map(|t| t.pin.clone()).unwrap_or_default(),
    };
    let config = NodeConfig { membership: opts.membership.clone(), meta: opts.meta.clone() };
    let mut node = Node::new(ident.id.clone(), ident.key.clone(), env.seed(), config, me);
    if let Some((name, manifests)) = opts.build.clone() {
        node.set_build(&name, manifests);
    }
    node.set_tunnel_preference(opts.tunnel_via.as_deref().map(shoal_core::NodeId::new));
    node.observe_monotonic(env.monotonic());
    if !opts.disable_cluster {
        node.restore(now, restored);
        if opts.rebuild_meta {
            node.rescan_after_rebuild();
        }
    }
    let _ = std::fs::write(opts.data_dir.join(identity::API_URL_FILE), format!("{scheme}://{local_addr}\n"));
    let pin_file = opts.data_dir.join(crate::net::tls::PIN_FILE);
    let _ = match &tls {
        Some(t) => std::fs::write(&pin_file, format!("{}\n", t.pin)),
        None => std::fs::remove_file(&pin_file),
    };
    // Spool files of puts cut short by a crash.
    if let Ok(rd) = std::fs::read_dir(opts.data_dir.join("spool")) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }

    let (shutdown, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        client: HttpClient::new(env.clone()),
        transport: Transport::new(env.clone()),
        env,
        node: Mutex::new(node),
        store,
        meta_store: meta_store.clone(),
        persist_lock: Mutex::new(()),
        wake: Notify::new(),
        data_dir: opts.data_dir.clone(),
        admin_token: ident.admin_token,
        box_secret: shoal_core::identity::box_secret(&ident.key),
        disable_cluster: opts.disable_cluster,
        serves_tls: tls.is_some(),
        listen: local_addr.clone(),
        started: now,
        store_service: Default::default(),
        offload_io: opts.offload_io,
        repl: ReplState::default(),
        jobs: Default::default(),
        jobs_engine: opts.jobs_engine,
        services: run_service::<E>,
        tunnel_handler: crate::http::server::tunnelled::<E>,
        armed: AtomicU64::new(u64::MAX),
        changed: Notify::new(),
        held_moved: Notify::new(),
        shutdown,
        metrics: Default::default(),
        released: Default::default(),
    });
    shared.pump();
    tracing::info!(node = %ident.id, listen = %local_addr, advertise = %advertise, "node started");

    let router = crate::http::server::router(shared.clone());
    let stop = shared.shutdown_requested();
    let limits = opts.limits.clone();
    let metrics = shared.metrics.clone();
    let acceptor = tls.as_ref().map(|t| t.acceptor.clone());
    let server = tokio::spawn(async move {
        crate::http::listener::serve(listener, router, limits, acceptor, &metrics, stop).await;
    });
    // The core refuses new metadata writes while this node cannot store them (a full data dir).
    let weak = Arc::downgrade(&shared);
    meta_store.on_health(Box::new(move |failure| {
        if let Some(s) = weak.upgrade() {
            s.with_node(|n, now| n.store_health(now, failure));
        }
    }));
    let flusher = spawn_flusher(meta_store, Duration::from_millis(META_FLUSH_MS), shared.shutdown_requested());
    let mut tasks = vec![server, flusher];
    if !opts.disable_cluster {
        crate::services::replication::started(&shared);
        tasks.push(tokio::spawn(drive(shared.clone())));
    }
    Ok(Daemon { shared, tasks, local_addr, tls_pin: tls.map(|t| t.pin) })
}

/// Carry out a service's output: each runs as its own task and reports back to the core.
fn run_service<E: Env>(s: &Arc<Shared<E>>, o: Output) {
    match o {
        Output::Chore(chore) => {
            tokio::spawn(crate::services::replication::run_chore(s.clone(), chore));
        }
        Output::ScrubCopy(copy) => {
            tokio::spawn(crate::services::replication::scrub_copy(s.clone(), copy));
        }
        Output::ReplDispatch { term, task } => {
            tokio::spawn(crate::services::replication::send_task(s.clone(), term, task));
        }
        Output::JobRun(run) => crate::services::jobs::start(s.clone(), *run),
        Output::JobStop { job, attempt, why } => {
            tracing::info!(%job, attempt, ?why, "stopping a job's script");
            crate::services::jobs::stop(s, &job, attempt);
        }
        Output::TunnelOpen { host, url } => crate::services::tunnel::open(s, host, url),
        Output::TunnelClose { host } => crate::services::tunnel::close(s, &host),
        Output::WakeBroadcast { macs } => crate::services::tunnel::wake(s, &macs),
        other => tracing::error!(output = ?other, "not a service's output"),
    }
}

/// The driver: one timer, armed from the core's `poll_timeout`. Each turn runs the core's
/// timers and carries out what they asked for (health samples included).
async fn drive<E: Env>(shared: Arc<Shared<E>>) {
    let mut stop = shared.shutdown_requested();
    // Woken because a call brought a deadline forward: the timers run when it is due, not at
    // the wake-up (a lingering audit entry waits for its deadline, not for the next call).
    let mut woken = false;
    loop {
        let now = shared.env.now();
        shared.armed.store(u64::MAX, Ordering::Release);
        let wake_at = {
            let mut node = lock(&shared.node);
            node.observe_monotonic(shared.env.monotonic());
            if !woken || node.poll_timeout().is_none_or(|d| d <= now) {
                node.handle_timeout(now);
            }
            let latest = now.plus(DRIVER_SLEEP_MAX_MS);
            let wake_at = node.poll_timeout().map_or(latest, |d| d.min(latest));
            shared.armed.store(wake_at.0, Ordering::Release);
            wake_at
        };
        shared.pump();
        shared.changed.notify_waiters();
        // Liveness moves with time alone: a wait for a change to be held elsewhere looks again
        // at every turn (a node left alone answers `alone`).
        shared.held_moved.notify_waiters();
        let sleep_ms = wake_at.since(now).max(1);
        woken = tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => false,
            _ = shared.wake.notified() => true,
            _ = stop.wait_for(|s| *s) => break,
        };
    }
}
