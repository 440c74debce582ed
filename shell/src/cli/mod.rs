//! The `shoal` command line (DESIGN.md "CLI"). `serve` runs a node, `demo` a local cluster in
//! one process; every other verb talks to a node's admin API and takes `--api`, `--token` (or
//! `SHOAL_TOKEN`, or the token file of the local data dir) and `--json`. Errors go to stderr
//! with a non-zero exit.

use crate::daemon::{self, ServeOptions};
use crate::env::TokioEnv;
use api::Api;

mod api;
mod args;
pub mod demo;
pub mod files;
mod human;
mod identity;
mod jobs;
pub mod output;
mod session;

pub use args::*;
pub use output::{init_tracing, say, CliError};

/// Run the parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Serve(args) => serve(cli.global, args).await,
        Cmd::Demo { nodes, base_port, exit_when_ready } => demo::run(nodes, base_port, exit_when_ready).await,
        Cmd::Checksum { local, chunks } => files::checksum(&local, chunks, cli.global.json),
        cmd => {
            let api = Api::new(&cli.global)?;
            api.run(cmd).await
        }
    }
}

async fn serve(g: Global, a: ServeArgs) -> Result<(), CliError> {
    init_tracing();
    let mut opts = ServeOptions::new(g.data.clone(), a.listen);
    opts.advertise = a.advertise;
    opts.tunnel_via = a.tunnel_via;
    opts.name = a.name;
    opts.disable_cluster = a.disable_cluster;
    opts.rebuild_meta = a.rebuild_meta;
    opts.tls = match (a.tls, a.tls_cert, a.tls_key) {
        (Some(_), _, _) => Some(crate::net::tls::TlsSource::SelfSigned),
        (None, Some(cert), Some(key)) => Some(crate::net::tls::TlsSource::Files { cert, key }),
        _ => None,
    };
    opts.membership.heartbeat_interval_ms = a.heartbeat_ms.max(1);
    opts.membership.heartbeat_timeout_ms = (a.heartbeat_ms * 4 / 3).max(1);
    opts.membership.online_within_ms = a.online_within_ms;
    opts.membership.unknown_within_ms = a.unknown_within_ms.max(a.online_within_ms);
    let fds = crate::http::listener::raise_fd_limit();
    opts.limits = crate::http::listener::ServeLimits::for_fd_limit(fds);
    tracing::info!(fd_limit = fds, max_connections = opts.limits.max_connections, "open files");
    let d = daemon::start(TokioEnv::default(), opts).await.map_err(|e| CliError(e.to_string()))?;
    say(format_args!("shoal node {} listening on {}", d.shared().read_node(|n, _| n.id().clone()), d.url()));
    let stop = d.shared().clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("stopping");
        stop.request_shutdown();
    });
    d.wait().await;
    Ok(())
}
