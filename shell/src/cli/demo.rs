//! `shoal demo`: N real nodes in one process on 127.0.0.1 ports `base..base+N`, each with its
//! own data dir under a fresh temporary folder. The first creates a cluster, the others join
//! with a token over real HTTP; the command prints each node's URL and how to point the CLI at
//! it, then runs until Ctrl-C and cleans up.

use crate::cli::output::{say, CliError};
use crate::daemon::{self, Daemon, ServeOptions};
use crate::env::TokioEnv;
use shoal_core::membership::NodeState;
use std::time::{Duration, Instant};

pub async fn run(nodes: usize, base_port: u16, exit_when_ready: bool) -> Result<(), CliError> {
    crate::cli::output::init_tracing();
    if nodes == 0 || nodes > 64 {
        return Err(CliError("--nodes must be between 1 and 64".into()));
    }
    if base_port as usize + nodes > u16::MAX as usize {
        return Err(CliError("--base-port is too high for that many nodes".into()));
    }
    let started = Instant::now();
    let root = std::env::temp_dir().join(format!("shoal-demo-{}-{}", std::process::id(), base_port));
    let result = run_in(&root, nodes, base_port, exit_when_ready, started).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run_in(
    root: &std::path::Path,
    nodes: usize,
    base_port: u16,
    exit_when_ready: bool,
    started: Instant,
) -> Result<(), CliError> {
    let mut daemons: Vec<Daemon<TokioEnv>> = Vec::new();
    let fds = crate::http::listener::raise_fd_limit();
    for i in 0..nodes {
        let mut opts =
            ServeOptions::new(root.join(format!("node-{i}")), format!("127.0.0.1:{}", base_port as usize + i));
        opts.name = Some(format!("demo-{i}"));
        // The demo's nodes share one process: the cap is split between them.
        opts.limits = crate::http::listener::ServeLimits::for_fd_limit(fds / nodes.max(1) as u64);
        match daemon::start(TokioEnv::default(), opts).await {
            Ok(d) => daemons.push(d),
            Err(e) => {
                for d in daemons {
                    d.shutdown().await;
                }
                return Err(CliError(format!("node {i}: {e}")));
            }
        }
    }
    let first = daemons[0].shared().clone();
    first.with_node(|n, now| n.create_cluster(now, "demo")).map_err(|e| CliError(e.message))?;
    for (i, d) in daemons.iter().enumerate().skip(1) {
        let token = first.with_node(|n, now| n.new_token(now, Some(1), None)).map_err(|e| CliError(e.message))?.token;
        crate::services::join::join_with_token(d.shared(), &token)
            .await
            .map_err(|e| CliError(format!("node {i} could not join: {}", e.message)))?;
    }
    // Woken by each input a node takes (no polling); one 30 s bound for all of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    for d in &daemons {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as u64;
        let online = d
            .shared()
            .wait_for(left, |n, now| {
                let members: Vec<_> = n.members().records().filter(|r| !r.removed).collect();
                members.len() == nodes
                    && members
                        .iter()
                        .all(|r| matches!(n.node_state(&r.id, now), NodeState::Online | NodeState::Degraded))
            })
            .await;
        if !online {
            return Err(CliError("the demo cluster did not become ONLINE within 30 s".into()));
        }
    }
    // Each node contributes a folder beside its data dir, so `put` and `get` work at once.
    for (i, d) in daemons.iter().enumerate() {
        let s = d.shared();
        let (folder, facts) = crate::disk::volumes::prepare_folder(
            &s.data_dir,
            &root.join(format!("volume-{i}")).to_string_lossy(),
            true,
        )
        .map_err(|e| CliError(format!("node {i}'s volume: {}", e.message)))?;
        let (free, total) = crate::env::Probe::disk_usage(&s.env, std::path::Path::new(&folder));
        s.with_node(|n, now| n.volume_add(now, &folder, &facts, "demo", total, free))
            .map_err(|e| CliError(e.message))?;
    }
    // Ready only once every node knows a metadata leader and every volume: a put right after the
    // banner would otherwise get 503 `no_leader`.
    let deadline = Instant::now() + Duration::from_secs(30);
    for d in &daemons {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as u64;
        let ready = d
            .shared()
            .wait_for(left, |n, now| n.meta_leader(now).is_some() && n.volume_list().volumes.len() == nodes)
            .await;
        if !ready {
            return Err(CliError("the demo cluster found no metadata leader within 30 s".into()));
        }
    }
    let cluster_id = first.read_node(|n, _| n.cluster().map(|c| c.id.to_string()).unwrap_or_default());
    say(format_args!("shoal demo: cluster {cluster_id}, {nodes} nodes up after {} ms", started.elapsed().as_millis()));
    for (i, d) in daemons.iter().enumerate() {
        let id = d.shared().read_node(|n, _| n.id().clone());
        say(format_args!("  node {i}  {}  id {id}  data {}", d.url(), d.shared().data_dir.display()));
    }
    let d0 = &daemons[0];
    say("\nPoint the CLI at a node, e.g. the first one:");
    say(format_args!("  export SHOAL_API={}", d0.url()));
    say(format_args!(
        "  export SHOAL_TOKEN=$(cat {})",
        d0.shared().data_dir.join(crate::persist::identity::TOKEN_FILE).display()
    ));
    say("  cargo run --release -- nodes");
    say("  cargo run --release -- put README.md cluster:/readme.md && cargo run --release -- ls cluster:/");
    say("\nCtrl-C stops the demo and removes its data.");
    if !exit_when_ready {
        let _ = tokio::signal::ctrl_c().await;
        say("stopping");
    }
    // A node's shutdown waits until nothing holds it any more: this handle too (it held the
    // first node for `SHUTDOWN_RELEASE_MS`, 15 s, on every exit).
    drop(first);
    for d in daemons {
        d.shutdown().await;
    }
    Ok(())
}
