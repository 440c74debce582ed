//! The `shoal` command line (DESIGN.md "CLI"). `serve` runs a node, `demo` a local cluster in
//! one process; every other verb talks to a node's admin API and takes `--api`, `--token` (or
//! `SHOAL_TOKEN`, or the token file of the local data dir) and `--json`. Errors go to stderr
//! with a non-zero exit.

use crate::cli_format as fmt;
pub use crate::cli_format::{init_tracing, say, CliError};
use crate::client::HttpClient;
use crate::daemon::{self, ServeOptions};
use crate::env::TokioEnv;
use crate::identity::{API_URL_FILE, TOKEN_FILE};
use crate::wire::{escape_query, escape_segment};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "shoal", version, about = "Several machines that act as one computer.")]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Admin API of the node to talk to (default: the URL in DATA/api.url, else http://127.0.0.1:7300).
    #[arg(long, global = true, env = "SHOAL_API")]
    pub api: Option<String>,
    /// Admin token (default: the contents of DATA/admin.token).
    #[arg(long, global = true, env = "SHOAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// The node's data dir.
    #[arg(long = "data", global = true, env = "SHOAL_DATA", default_value = "shoal-data")]
    pub data: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run a node daemon.
    Serve(ServeArgs),
    /// Run a local demo cluster of N nodes in this process.
    Demo {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value_t = 7300)]
        base_port: u16,
        /// Exit once every node is ONLINE (for scripts and benchmarks).
        #[arg(long)]
        exit_when_ready: bool,
    },
    /// Create, inspect, configure or leave this node's cluster.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Join tokens.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Join the cluster a token names.
    Join {
        #[arg(value_name = "TOKEN")]
        join_token: String,
    },
    /// List members with their computed state.
    Nodes,
    /// Act on one member.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// The replicated metadata store.
    Meta {
        #[command(subcommand)]
        cmd: MetaCmd,
    },
    /// Folder copy policies.
    Policy {
        #[command(subcommand)]
        cmd: PolicyCmd,
    },
    /// Cluster-wide settings.
    Settings {
        #[command(subcommand)]
        cmd: SettingsCmd,
    },
    /// Folders this node contributes to the cluster drive.
    Volume {
        #[command(subcommand)]
        cmd: VolumeCmd,
    },
    /// Replication of the cluster drive.
    Repl {
        #[command(subcommand)]
        cmd: ReplCmd,
    },
    /// Copy a local file into the cluster drive: `shoal put LOCAL cluster:/path`.
    Put { local: PathBuf, remote: String },
    /// Copy a file out of the cluster drive, verified: `shoal get cluster:/path LOCAL`.
    Get { remote: String, local: PathBuf },
    /// List a folder of the cluster drive.
    Ls {
        #[arg(default_value = "cluster:/")]
        path: String,
    },
    /// A file's record: every copy as <node>:<volume>/<path> with its state, the policy, the checksum.
    Stat { path: String },
    /// Remove a file (or, with -r, a folder and everything in it).
    Rm {
        path: String,
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Move or rename a file or folder (copies are renamed on disk where they lie).
    Mv { from: String, to: String },
    /// Make a folder.
    Mkdir { path: String },
    /// Re-hash every copy of a file, or of everything under a folder, now.
    Verify {
        #[arg(default_value = "cluster:/")]
        path: String,
    },
    /// Look through this node's volume folders now: adopt new files, mark changed copies stale.
    Rescan,
    /// The SHA-256 of a local file, as the cluster computes it (to compare with `stat`).
    Checksum { local: PathBuf },
    /// Configuration: declared keys, values at three levels, resolution, history, proposals.
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// The cluster's audit log of admin acts, newest first.
    Audit,
    /// Modules: the built-in subsystems and user modules installed from a manifest.
    Module {
        #[command(subcommand)]
        cmd: ModuleCmd,
    },
}

#[derive(Subcommand, Debug)]
pub enum ModuleCmd {
    /// Install (or update) a user module from its manifest (TOML: module = "name", [[keys]] ...).
    Install { manifest: PathBuf },
    /// Run a user module on a node (its keys then resolve there).
    Place {
        name: String,
        #[arg(long)]
        node: String,
    },
    /// Stop running a user module on a node.
    Unplace {
        name: String,
        #[arg(long)]
        node: String,
    },
    /// Built-in and installed modules, and where each runs.
    List,
}

#[derive(Args, Debug, Clone, Default)]
pub struct ConfigWhere {
    /// Narrow to (or, for set/clear/propose, write at) this module's own value on --node.
    #[arg(long)]
    pub module: Option<String>,
    /// Narrow to (or write at) this node.
    #[arg(long)]
    pub node: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Stored values, resolved values with their source, and the predefined keys.
    List {
        #[command(flatten)]
        at: ConfigWhere,
        #[arg(long)]
        key: Option<String>,
    },
    /// Set a value at one level: mesh (no --node), node (--node), a module's own (--node --module).
    Set {
        #[command(flatten)]
        at: ConfigWhere,
        #[arg(long)]
        key: String,
        #[arg(long)]
        value: String,
        #[arg(long)]
        why: String,
    },
    /// Clear the value at one level.
    Clear {
        #[command(flatten)]
        at: ConfigWhere,
        #[arg(long)]
        key: String,
        #[arg(long)]
        why: String,
    },
    /// Every set, clear and approval, newest first.
    History {
        #[command(flatten)]
        at: ConfigWhere,
        #[arg(long)]
        key: Option<String>,
    },
    /// This node's resolved values (also in DATA/config/<module>.json).
    Resolved,
    /// Propose a value (or --clear) for an admin's approval (the only way to set a trusted key).
    Propose {
        #[command(flatten)]
        at: ConfigWhere,
        #[arg(long)]
        key: String,
        #[arg(long, required_unless_present = "clear")]
        value: Option<String>,
        #[arg(long)]
        clear: bool,
        #[arg(long)]
        why: String,
    },
    /// Proposals, newest first, or one whole.
    Proposals { id: Option<String> },
    /// Approve a proposal as shown (refused when it or the stored value changed since).
    Approve { id: String },
    /// Decline a proposal.
    Decline { id: String },
    /// Renamed keys and the nodes still holding each rename window open.
    Renames,
    /// Conditions held seven days: rename-refused, rename-window-held (and those still pending).
    Findings,
    /// Config events (renamed, retiring, retired) of the last seven days.
    Events,
    /// Values no build reads any more: list, or approve removal / ask again / cancel for one level.
    Retiring {
        /// The level, e.g. mesh.storage.old_key.
        level: Option<String>,
        #[arg(long, value_parser = ["approve", "ask", "cancel"], requires = "level")]
        action: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum VolumeCmd {
    /// Contribute a folder of the node's machine (created if missing).
    Add {
        path: String,
        #[arg(long, default_value = "")]
        name: String,
    },
    List,
    /// Retire a volume (refused while it holds the only copy of a file).
    Remove {
        id: String,
    },
    /// An admin's read-only switch.
    Readonly {
        id: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Move every copy off a volume (or cancel, or show progress).
    Evacuate {
        id: String,
        #[arg(long, conflicts_with = "status")]
        cancel: bool,
        #[arg(long)]
        status: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ReplCmd {
    /// Replication health: files, healthy, under/over-replicated, waiting.
    Status,
    /// The plan the leader would carry out now, with the reason for each task.
    Plan,
}

#[derive(Subcommand, Debug)]
pub enum MetaCmd {
    /// Leader, term, last sequence, applied, pending.
    Status,
    /// List a folder of the namespace.
    Ls {
        #[arg(default_value = "/")]
        path: String,
    },
    /// One record: copies, policy, checksum.
    Stat { path: String },
}

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Keep N copies of everything under FOLDER (0 removes the policy).
    Set {
        folder: String,
        replicas: u32,
    },
    List,
}

#[derive(Subcommand, Debug)]
pub enum SettingsCmd {
    Get {
        key: String,
    },
    /// VALUE is JSON when it parses as JSON, else a string.
    Set {
        key: String,
        value: String,
    },
    List,
    /// Remove a setting.
    Rm {
        key: String,
    },
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// host:port to listen on.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub listen: String,
    /// URL other nodes use to reach this one (default http://<listen>).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Display name of this node (default: the hostname).
    #[arg(long)]
    pub name: Option<String>,
    /// No cluster agent; /cluster/acn/* answers 404.
    #[arg(long)]
    pub disable_cluster: bool,
    /// Heartbeat interval in ms (spec default 15000).
    #[arg(long, default_value_t = 15_000)]
    pub heartbeat_ms: u64,
    /// A node heard from within this many ms is ONLINE (spec default 45000).
    #[arg(long, default_value_t = 45_000)]
    pub online_within_ms: u64,
    /// Silent up to this many ms is UNKNOWN, beyond it OFFLINE (spec default 180000).
    #[arg(long, default_value_t = 180_000)]
    pub unknown_within_ms: u64,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Create a new cluster with this node as its first member.
    Create {
        #[arg(long, default_value = "")]
        name: String,
    },
    /// This node's cluster, id and member states.
    Status,
    /// Leave the cluster (the other members are told).
    Leave,
    /// Show or change this node's name and advertised URL.
    Config {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        advertise: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a join token.
    New {
        /// Lifetime in hours, 1 to 720.
        #[arg(long)]
        ttl_hours: Option<u64>,
        /// How many nodes may join with it (1 to 1000; default: any number until it expires).
        #[arg(long)]
        uses: Option<u64>,
    },
    List,
    Revoke {
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// Set a member's admin state.
    State {
        id: String,
        #[arg(value_parser = ["maintenance", "draining", "active"])]
        state: String,
    },
    /// Remove a member from the cluster.
    Remove { id: String },
    /// Send a signed ping to a member and report the round trip.
    Probe { id: String },
}

/// Run the parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Serve(args) => serve(cli.global, args).await,
        Cmd::Demo { nodes, base_port, exit_when_ready } => crate::demo::run(nodes, base_port, exit_when_ready).await,
        Cmd::Checksum { local } => crate::cli_files::checksum(&local, cli.global.json),
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
    opts.name = a.name;
    opts.disable_cluster = a.disable_cluster;
    opts.membership.heartbeat_interval_ms = a.heartbeat_ms.max(1);
    opts.membership.heartbeat_timeout_ms = (a.heartbeat_ms * 4 / 3).max(1);
    opts.membership.online_within_ms = a.online_within_ms;
    opts.membership.unknown_within_ms = a.unknown_within_ms.max(a.online_within_ms);
    let fds = crate::listener::raise_fd_limit();
    opts.limits = crate::listener::ServeLimits::for_fd_limit(fds);
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

struct Api {
    base: String,
    token: String,
    json: bool,
    client: HttpClient<TokioEnv>,
}

fn read_file_trimmed(p: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

impl Api {
    fn new(g: &Global) -> Result<Api, CliError> {
        let base = g
            .api
            .clone()
            .or_else(|| read_file_trimmed(&g.data.join(API_URL_FILE)))
            .unwrap_or_else(|| "http://127.0.0.1:7300".to_string());
        let base = base.trim_end_matches('/').to_string();
        crate::client::split_url(&base).map_err(|e| CliError(format!("--api: {e}")))?;
        let token = match &g.token {
            Some(t) => t.trim().to_string(),
            None => read_file_trimmed(&g.data.join(TOKEN_FILE)).ok_or_else(|| {
                CliError(format!(
                    "no admin token: pass --token, set SHOAL_TOKEN, or point --data at the node's data dir (no {} there)",
                    g.data.join(TOKEN_FILE).display()
                ))
            })?,
        };
        Ok(Api { base, token, json: g.json, client: HttpClient::new(TokioEnv::default()) })
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, CliError> {
        let auth = format!("Bearer {}", self.token);
        let body = body.map(|b| serde_json::to_vec(&b).expect("serialise")).unwrap_or_default();
        let target = format!("/v1{path}");
        let resp = self
            .client
            .request(&self.base, method, &target, &[("authorization", &auth)], body, 60_000)
            .await
            .map_err(|e| CliError(format!("cannot reach the node's API at {}: {e}", self.base)))?;
        let v: Value = serde_json::from_slice(&resp.body).unwrap_or_else(|_| json!({}));
        if resp.status >= 400 {
            let msg = v.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("request failed");
            let code = v.pointer("/error/code").and_then(|m| m.as_str()).unwrap_or("error");
            return Err(CliError(format!("{msg} ({code}, HTTP {})", resp.status)));
        }
        Ok(v)
    }

    async fn run(&self, cmd: Cmd) -> Result<(), CliError> {
        let (v, human): (Value, fn(&Value) -> String) = match cmd {
            Cmd::Cluster { cmd: ClusterCmd::Create { name } } => {
                (self.call("POST", "/cluster/create", Some(json!({"name": name}))).await?, human_status)
            }
            Cmd::Cluster { cmd: ClusterCmd::Status } => {
                (self.call("GET", "/cluster/status", None).await?, human_status)
            }
            Cmd::Cluster { cmd: ClusterCmd::Leave } => {
                (self.call("POST", "/cluster/leave", None).await?, |v| format!("left cluster {}", s(&v["left"])))
            }
            Cmd::Cluster { cmd: ClusterCmd::Config { name, advertise } } => {
                if name.is_none() && advertise.is_none() {
                    (self.call("GET", "/cluster/config", None).await?, human_kv)
                } else {
                    let body = json!({"name": name, "advertiseUrl": advertise});
                    (self.call("POST", "/cluster/config", Some(body)).await?, human_kv)
                }
            }
            Cmd::Token { cmd: TokenCmd::New { ttl_hours, uses } } => {
                let v = self.call("POST", "/tokens", Some(json!({"ttlHours": ttl_hours, "uses": uses}))).await?;
                (json!({"token": v["token"]}), |v| s(&v["token"]))
            }
            Cmd::Token { cmd: TokenCmd::List } => (self.call("GET", "/tokens", None).await?, human_tokens),
            Cmd::Token { cmd: TokenCmd::Revoke { id } } => {
                (self.call("DELETE", &format!("/tokens/{}", path_seg(&id)?), None).await?, |v| {
                    format!("revoked token {}", s(&v["revoked"]))
                })
            }
            Cmd::Join { join_token } => {
                (self.call("POST", "/cluster/join", Some(json!({ "token": join_token }))).await?, human_status)
            }
            Cmd::Nodes => (self.call("GET", "/nodes", None).await?, human_nodes),
            Cmd::Node { cmd: NodeCmd::State { id, state } } => {
                let path = format!("/nodes/{}/state", path_seg(&id)?);
                (self.call("POST", &path, Some(json!({"state": state}))).await?, |v| {
                    format!("node {} is now {}", s(&v["node"]), s(&v["state"]))
                })
            }
            Cmd::Node { cmd: NodeCmd::Remove { id } } => {
                (self.call("DELETE", &format!("/nodes/{}", path_seg(&id)?), None).await?, |v| {
                    format!("removed node {}", s(&v["removed"]))
                })
            }
            Cmd::Node { cmd: NodeCmd::Probe { id } } => {
                let v = self.call("POST", &format!("/nodes/{}/probe", path_seg(&id)?), None).await?;
                let reachable = v["reachable"].as_bool().unwrap_or(false);
                if !self.json {
                    say(human_probe(&v));
                } else {
                    say(serde_json::to_string_pretty(&v).expect("json"));
                }
                return if reachable { Ok(()) } else { Err(CliError(format!("node {id} is not reachable"))) };
            }
            Cmd::Meta { cmd: MetaCmd::Status } => (self.call("GET", "/meta/status", None).await?, human_kv),
            Cmd::Meta { cmd: MetaCmd::Ls { path } } => {
                (self.call("GET", &format!("/meta/ls?path={}", escape_query(&path)), None).await?, human_ls)
            }
            Cmd::Meta { cmd: MetaCmd::Stat { path } } => {
                (self.call("GET", &format!("/meta/stat?path={}", escape_query(&path)), None).await?, human_stat)
            }
            Cmd::Policy { cmd: PolicyCmd::Set { folder, replicas } } => {
                let body = json!({"folder": folder, "replicas": replicas});
                (self.call("POST", "/policies", Some(body)).await?, |v| {
                    format!("{} -> {} copies", s(&v["folder"]), s(&v["replicas"]))
                })
            }
            Cmd::Policy { cmd: PolicyCmd::List } => (self.call("GET", "/policies", None).await?, |v| {
                let mut out = format!("{:<40} {}", "FOLDER", "COPIES");
                for p in v["policies"].as_array().into_iter().flatten() {
                    out.push_str(&format!("\n{:<40} {}", s(&p["folder"]), s(&p["replicas"])));
                }
                out
            }),
            Cmd::Settings { cmd: SettingsCmd::Get { key } } => {
                (self.call("GET", &format!("/settings/{}", escape_segment(&key)), None).await?, |v| s(&v["value"]))
            }
            Cmd::Settings { cmd: SettingsCmd::Set { key, value } } => {
                let value: Value = serde_json::from_str(&value).unwrap_or(Value::String(value));
                let path = format!("/settings/{}", escape_segment(&key));
                (self.call("PUT", &path, Some(json!({ "value": value }))).await?, |v| {
                    format!("{} = {}", s(&v["key"]), v["value"])
                })
            }
            Cmd::Settings { cmd: SettingsCmd::List } => (self.call("GET", "/settings", None).await?, |v| {
                let mut out = String::new();
                for x in v["settings"].as_array().into_iter().flatten() {
                    out.push_str(&format!("{} = {}\n", s(&x["key"]), x["value"]));
                }
                out.trim_end().to_string()
            }),
            Cmd::Settings { cmd: SettingsCmd::Rm { key } } => {
                (self.call("DELETE", &format!("/settings/{}", escape_segment(&key)), None).await?, |v| {
                    format!("removed {}", s(&v["key"]))
                })
            }
            Cmd::Volume { cmd: VolumeCmd::Add { path, name } } => {
                let abs = std::path::Path::new(&path);
                let abs = if abs.is_absolute() {
                    abs.to_path_buf()
                } else {
                    std::env::current_dir().map_err(|e| CliError(format!("current dir: {e}")))?.join(abs)
                };
                let body = json!({"path": abs.to_string_lossy(), "name": name});
                (self.call("POST", "/volumes", Some(body)).await?, |v| {
                    format!(
                        "volume {} at {} ({} free of {})",
                        s(&v["id"]),
                        s(&v["subpath"]),
                        fmt::bytes_of(&v["free"]),
                        fmt::bytes_of(&v["capacity"])
                    )
                })
            }
            Cmd::Volume { cmd: VolumeCmd::List } => (self.call("GET", "/volumes", None).await?, |v| {
                let mut out = format!(
                    "{:<38} {:<38} {:>14} {:>14}  {:<10} {}",
                    "ID", "NODE", "FREE", "CAPACITY", "FLAGS", "FOLDER"
                );
                for x in v["volumes"].as_array().into_iter().flatten() {
                    let mut flags = Vec::new();
                    for (k, f) in [("readOnly", "ro"), ("lowSpace", "low"), ("evacuating", "evac")] {
                        if x[k] == json!(true) {
                            flags.push(f);
                        }
                    }
                    out.push_str(&format!(
                        "\n{:<38} {:<38} {:>14} {:>14}  {:<10} {}",
                        s(&x["id"]),
                        s(&x["nodeId"]),
                        fmt::bytes_of(&x["free"]),
                        fmt::bytes_of(&x["capacity"]),
                        flags.join(","),
                        s(&x["subpath"])
                    ));
                }
                out
            }),
            Cmd::Volume { cmd: VolumeCmd::Remove { id } } => {
                (self.call("DELETE", &format!("/volumes/{}", path_seg(&id)?), None).await?, |v| {
                    format!("removed volume {}", s(&v["removed"]))
                })
            }
            Cmd::Volume { cmd: VolumeCmd::Readonly { id, state } } => {
                let path = format!("/volumes/{}/readonly", path_seg(&id)?);
                (self.call("POST", &path, Some(json!({"readOnly": state == "on"}))).await?, |v| {
                    format!("volume {} read-only: {}", s(&v["id"]), s(&v["readOnly"]))
                })
            }
            Cmd::Volume { cmd: VolumeCmd::Evacuate { id, cancel, status } } => {
                let path = format!("/volumes/{}/evacuate", path_seg(&id)?);
                let v = if status {
                    self.call("GET", &path, None).await?
                } else {
                    self.call("POST", &path, Some(json!({ "cancel": cancel }))).await?
                };
                (v, |v| {
                    format!(
                        "volume {}: evacuating {}, {} copies left ({} only copies){}",
                        s(&v["volume"]),
                        s(&v["evacuating"]),
                        s(&v["copiesLeft"]),
                        s(&v["onlyCopiesLeft"]),
                        if v["done"] == json!(true) { ", done" } else { "" }
                    )
                })
            }
            Cmd::Repl { cmd: ReplCmd::Status } => (self.call("GET", "/repl/status", None).await?, |v| {
                let st = &v["stats"];
                format!(
                    "leader {}\nfiles {}  healthy {}  under {}  over {}  evacuating {}  waiting {}  no target {}  no source {}",
                    s(&v["leader"]),
                    s(&st["files"]),
                    s(&st["healthy"]),
                    s(&st["under"]),
                    s(&st["over"]),
                    s(&st["evacuating"]),
                    s(&st["waitingBackoff"]),
                    s(&st["noTarget"]),
                    s(&st["noSource"])
                )
            }),
            Cmd::Repl { cmd: ReplCmd::Plan } => (self.call("GET", "/repl/plan", None).await?, |v| {
                let mut out = String::new();
                for t in v["plan"]["tasks"].as_array().into_iter().flatten() {
                    let a = &t["action"];
                    let what = if a["kind"] == "pull" {
                        format!(
                            "pull {}:{} -> {}:{}",
                            s(&a["sourceNode"]),
                            s(&a["sourceVolume"]),
                            s(&a["targetNode"]),
                            s(&a["targetVolume"])
                        )
                    } else {
                        format!("drop {}:{}", s(&a["node"]), s(&a["volume"]))
                    };
                    out.push_str(&format!("{:<9} {}  cluster:{}\n", s(&t["reason"]), what, s(&t["path"])));
                }
                for c in v["plan"]["markStale"].as_array().into_iter().flatten() {
                    out.push_str(&format!(
                        "stale     {}:{}  cluster:{}\n",
                        s(&c["node"]),
                        s(&c["volume"]),
                        s(&c["path"])
                    ));
                }
                if out.is_empty() {
                    "nothing to do".to_string()
                } else {
                    out.trim_end().to_string()
                }
            }),
            Cmd::Put { local, remote } => {
                let v = crate::cli_files::put(&self.base, &self.token, &local, &remote, self.json).await?;
                (v, human_put)
            }
            Cmd::Get { remote, local } => {
                let v = crate::cli_files::get(&self.base, &self.token, &remote, &local, self.json).await?;
                (v, human_get)
            }
            Cmd::Ls { path } => {
                let p = crate::cli_files::cluster_path(&path)?;
                (self.call("GET", &format!("/meta/ls?path={}", escape_query(&p)), None).await?, human_ls)
            }
            Cmd::Stat { path } => {
                let p = crate::cli_files::cluster_path(&path)?;
                (self.call("GET", &format!("/meta/stat?path={}", escape_query(&p)), None).await?, human_stat)
            }
            Cmd::Rm { path, recursive } => {
                let p = crate::cli_files::cluster_path(&path)?;
                let q = if recursive { "?recursive=true" } else { "" };
                (self.call("DELETE", &format!("/files{}{q}", escape_query(&p)), None).await?, human_kv)
            }
            Cmd::Mv { from, to } => {
                let (from, to) = (crate::cli_files::cluster_path(&from)?, crate::cli_files::cluster_path(&to)?);
                (self.call("POST", "/mv", Some(json!({"from": from, "to": to}))).await?, human_kv)
            }
            Cmd::Mkdir { path } => {
                let p = crate::cli_files::cluster_path(&path)?;
                (self.call("POST", "/mkdir", Some(json!({ "path": p }))).await?, human_kv)
            }
            Cmd::Verify { path } => {
                let p = crate::cli_files::cluster_path(&path)?;
                (self.call("POST", "/verify", Some(json!({ "path": p }))).await?, human_verify)
            }
            Cmd::Rescan => (self.call("POST", "/rescan", None).await?, human_rescan),
            Cmd::Config { cmd } => self.config(cmd).await?,
            Cmd::Audit => (self.call("GET", "/audit", None).await?, human_audit),
            Cmd::Module { cmd } => match cmd {
                ModuleCmd::Install { manifest } => {
                    let text = std::fs::read_to_string(&manifest)
                        .map_err(|e| CliError(format!("{}: {e}", manifest.display())))?;
                    let parsed: toml::Value =
                        toml::from_str(&text).map_err(|e| CliError(format!("{}: {e}", manifest.display())))?;
                    let body = serde_json::to_value(parsed).map_err(|e| CliError(e.to_string()))?;
                    (self.call("POST", "/modules", Some(body)).await?, human_kv)
                }
                ModuleCmd::Place { name, node } => (
                    self.call(
                        "POST",
                        &format!("/modules/{}/placement", path_seg(&name)?),
                        Some(json!({"node": node, "placed": true})),
                    )
                    .await?,
                    human_kv,
                ),
                ModuleCmd::Unplace { name, node } => (
                    self.call(
                        "POST",
                        &format!("/modules/{}/placement", path_seg(&name)?),
                        Some(json!({"node": node, "placed": false})),
                    )
                    .await?,
                    human_kv,
                ),
                ModuleCmd::List => (self.call("GET", "/modules", None).await?, human_json),
            },
            Cmd::Serve(_) | Cmd::Demo { .. } | Cmd::Checksum { .. } => unreachable!("handled in run"),
        };
        if self.json {
            say(serde_json::to_string_pretty(&v).expect("json"));
        } else {
            say(human(&v));
        }
        Ok(())
    }
}

impl Api {
    async fn config(&self, cmd: ConfigCmd) -> Result<(Value, fn(&Value) -> String), CliError> {
        let q = |at: &ConfigWhere, key: &Option<String>| {
            let mut parts = Vec::new();
            for (k, v) in [("module", &at.module), ("node", &at.node), ("key", key)] {
                if let Some(v) = v {
                    parts.push(format!("{k}={}", escape_query(v)));
                }
            }
            if parts.is_empty() {
                String::new()
            } else {
                format!("?{}", parts.join("&"))
            }
        };
        let post = |body: Value| async move { self.call("POST", "/config", Some(body)).await };
        Ok(match cmd {
            ConfigCmd::List { at, key } => (self.call("GET", &format!("/config{}", q(&at, &key)), None).await?, human_config),
            ConfigCmd::History { at, key } => {
                (self.call("GET", &format!("/config/history{}", q(&at, &key)), None).await?, human_history)
            }
            ConfigCmd::Resolved => (self.call("GET", "/config/resolved", None).await?, human_json),
            ConfigCmd::Set { at, key, value, why } => (
                post(json!({"action": "set", "key": key, "value": value, "why": why, "node": at.node, "module": at.module}))
                    .await?,
                human_moved,
            ),
            ConfigCmd::Clear { at, key, why } => (
                post(json!({"action": "clear", "key": key, "why": why, "node": at.node, "module": at.module})).await?,
                human_moved,
            ),
            ConfigCmd::Propose { at, key, value, clear, why } => (
                post(json!({"action": "propose", "key": key, "value": value, "clear": clear, "why": why, "node": at.node, "module": at.module}))
                    .await?,
                human_json,
            ),
            ConfigCmd::Proposals { id } => match id {
                Some(id) => (self.call("GET", &format!("/config/proposals/{}", path_seg(&id)?), None).await?, human_json),
                None => (self.call("GET", "/config/proposals", None).await?, human_proposals),
            },
            ConfigCmd::Approve { id } => {
                // Approve what is shown: the proposal as read now binds the approval.
                let p = self.call("GET", &format!("/config/proposals/{}", path_seg(&id)?), None).await?;
                eprintln!("approving {}: {} = {} (shown against {})", s(&p["id"]), s(&p["level"]), s(&p["value"]), s(&p["shownAgainst"]));
                let body = json!({"action": "approve", "id": id, "seen": true, "seenValue": p["value"], "seenShownAgainst": p["shownAgainst"]});
                (post(body).await?, human_json)
            }
            ConfigCmd::Decline { id } => (post(json!({"action": "decline", "id": id})).await?, human_json),
            ConfigCmd::Renames => (self.call("GET", "/config/renames", None).await?, human_json),
            ConfigCmd::Findings => (self.call("GET", "/config/findings", None).await?, human_json),
            ConfigCmd::Events => (self.call("GET", "/config/events", None).await?, human_json),
            ConfigCmd::Retiring { level, action } => match (level, action) {
                (Some(level), Some(action)) => {
                    (self.call("POST", "/config/retiring", Some(json!({"level": level, "action": action}))).await?, human_json)
                }
                _ => (self.call("GET", "/config/retiring", None).await?, human_json),
            },
        })
    }
}

fn human_json(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn human_config(v: &Value) -> String {
    // Declared types by key name, so durations and sizes read as an operator writes them.
    let types: std::collections::BTreeMap<String, String> = v["predefined"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["key"].as_str()?.to_string(), d["type"].as_str()?.to_string())))
        .collect();
    let type_of = |key: &str| {
        types.iter().find(|(k, _)| key == k.as_str() || key.ends_with(&format!(".{k}"))).map(|(_, t)| t.as_str())
    };
    let mut out = String::from("stored values:\n");
    for e in v["values"].as_array().into_iter().flatten() {
        let level = s(&e["level"]);
        out.push_str(&format!(
            "  {} = {}  (by {}, {}: {})\n",
            level,
            fmt::config_value(&e["value"], type_of(&level)),
            s(&e["by"]),
            s(&e["at"]),
            s(&e["why"])
        ));
    }
    out.push_str("resolved:\n");
    for r in v["resolved"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} {}.{} = {}  [{}]\n",
            s(&r["node"]),
            s(&r["module"]),
            s(&r["key"]),
            fmt::config_value(&r["value"], type_of(&format!("{}.{}", s(&r["module"]), s(&r["key"])))),
            s(&r["source"])
        ));
    }
    for u in v["unresolved"].as_array().into_iter().flatten() {
        out.push_str(&format!("unresolved: {} on {}: {}\n", s(&u["module"]), s(&u["node"]), s(&u["why"])));
    }
    out.trim_end().to_string()
}

fn human_history(v: &Value) -> String {
    let mut out = String::new();
    for h in v["history"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} {} {} = {} (was {}) by {}: {}; moved {}\n",
            s(&h["at"]),
            s(&h["action"]),
            s(&h["level"]),
            h["value"],
            h["previous"],
            s(&h["by"]),
            s(&h["why"]),
            h["moved"].as_array().map_or(0, |m| m.len())
        ));
    }
    if out.is_empty() {
        "no history".into()
    } else {
        out.trim_end().to_string()
    }
}

fn human_moved(v: &Value) -> String {
    let mut out = format!("{} = {} (was {})", s(&v["level"]), v["value"], v["previous"]);
    for m in v["moved"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  moved: {} {}.{} -> {}",
            s(&m["node"]),
            s(&m["module"]),
            s(&m["key"]),
            m["to"]["value"]
        ));
    }
    out
}

fn human_proposals(v: &Value) -> String {
    let mut out = String::new();
    for p in v["proposals"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} {} {} = {} (against {}) by {}: {}\n",
            s(&p["id"]),
            s(&p["status"]),
            s(&p["level"]),
            p["value"],
            p["shownAgainst"],
            s(&p["by"]),
            s(&p["why"])
        ));
    }
    if out.is_empty() {
        "no proposals".into()
    } else {
        out.trim_end().to_string()
    }
}

/// Node ids and token ids are plain tokens; refuse anything that would change the URL path.
fn path_seg(id: &str) -> Result<&str, CliError> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(CliError(format!("{id:?} is not a valid id (letters, digits and '-' only)")));
    }
    Ok(id)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn human_kv(v: &Value) -> String {
    match v.as_object() {
        Some(m) => m.iter().map(|(k, x)| format!("{k:<20} {}", s(x))).collect::<Vec<_>>().join("\n"),
        None => s(v),
    }
}

fn human_status(v: &Value) -> String {
    if v["inCluster"] != json!(true) {
        return format!("node {} ({}) is not in a cluster", s(&v["node"]), s(&v["nodeName"]));
    }
    let states = v["states"]
        .as_object()
        .map(|m| m.iter().map(|(k, c)| format!("{c} {k}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    format!(
        "cluster  {} ({})\nnode     {} ({})\nurl      {}\nmembers  {} [{}]",
        s(&v["id"]),
        s(&v["name"]),
        s(&v["node"]),
        s(&v["nodeName"]),
        s(&v["advertiseUrl"]),
        s(&v["members"]),
        states
    )
}

fn human_tokens(v: &Value) -> String {
    let mut out = format!("{:<18} {:>6} {:>12} {}", "ID", "USES", "EXPIRES", "STATUS");
    for t in v["tokens"].as_array().into_iter().flatten() {
        let status = if t["revoked"] == json!(true) { "revoked" } else { "active" };
        out.push_str(&format!("\n{:<18} {:>6} {:>12} {}", s(&t["id"]), s(&t["uses"]), s(&t["expires"]), status));
    }
    out
}

fn human_nodes(v: &Value) -> String {
    let mut out = format!("{:<38} {:<16} {:<12} {:>9}  {}", "ID", "NAME", "STATE", "LATENCY", "URL");
    for n in v["nodes"].as_array().into_iter().flatten() {
        if n["removed"] == json!(true) {
            continue;
        }
        let lat = n["latencyMs"].as_f64().unwrap_or(-1.0);
        let lat = if n["local"] == json!(true) {
            "local".to_string()
        } else if lat < 0.0 {
            "-".to_string()
        } else {
            format!("{lat:.1}ms")
        };
        out.push_str(&format!(
            "\n{:<38} {:<16} {:<12} {:>9}  {}",
            s(&n["id"]),
            s(&n["name"]),
            s(&n["state"]),
            lat,
            s(&n["advertiseUrl"])
        ));
    }
    out
}

fn human_probe(v: &Value) -> String {
    if v["reachable"] == json!(true) {
        format!(
            "node {} answered in {:.1} ms via {}",
            s(&v["node"]),
            v["rttMs"].as_f64().unwrap_or(0.0),
            s(&v["route"])
        )
    } else {
        format!("node {} did not answer: {}", s(&v["node"]), s(&v.get("error").cloned().unwrap_or(v["status"].clone())))
    }
}

fn human_ls(v: &Value) -> String {
    let mut out = String::new();
    for e in v["entries"].as_array().into_iter().flatten() {
        let kind = if e["isDir"] == json!(true) { "dir " } else { "file" };
        out.push_str(&format!("{kind} {:>12}  {}\n", fmt::bytes_of(&e["size"]), s(&e["name"])));
    }
    if out.is_empty() {
        format!("{} is empty", s(&v["path"]))
    } else {
        out.trim_end().to_string()
    }
}

fn human_stat(v: &Value) -> String {
    if v["isDir"] == json!(true) {
        return format!(
            "cluster:{}  directory, {} entries, policy {} copies",
            s(&v["path"]),
            s(&v["children"]),
            s(&v["policy"])
        );
    }
    let r = &v["record"];
    let mut out = format!(
        "cluster:{}\nid        {}\nsize      {} ({} bytes)\nchecksum  {}\ncopies    {} wanted",
        s(&v["path"]),
        s(&r["id"]),
        fmt::bytes_of(&r["size"]),
        s(&r["size"]),
        s(&r["checksum"]),
        s(&v["wantedCopies"])
    );
    for c in v["copies"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  {}  {}", s(&c["copy"]), s(&c["state"])));
    }
    out
}

fn human_put(v: &Value) -> String {
    let mut out = format!(
        "cluster:{}  {}, {} of {} copies written",
        s(&v["path"]),
        fmt::bytes_of(&v["size"]),
        s(&v["copies"]),
        s(&v["wanted"])
    );
    if v["copies"].as_u64() < v["wanted"].as_u64() {
        out.push_str("\n(fewer copies than the folder policy wants: the others are made when nodes can take them)");
    }
    if v["recordReplicated"] == Value::Bool(false) {
        out.push_str("\n(no metadata leader has the record yet: until it does, it lives on this node only)");
    }
    out
}

fn human_get(v: &Value) -> String {
    format!("{}  {}, checksum verified (from {})", s(&v["local"]), fmt::bytes_of(&v["size"]), s(&v["copy"]))
}

fn human_verify(v: &Value) -> String {
    let mut out = format!("{} files, {} copies verified", s(&v["files"]), s(&v["verified"]));
    for c in v["stale"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  mismatch, marked stale: {}", s(c)));
    }
    for c in v["unreachable"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  not reachable: {}", s(c)));
    }
    out
}

fn human_rescan(v: &Value) -> String {
    let mut out = String::new();
    for r in v["volumes"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}: {} files, {} adopted, {} copies added, {} marked stale\n",
            s(&r["volumeId"]),
            s(&r["files"]),
            s(&r["adopted"]),
            s(&r["copiesAdded"]),
            s(&r["markedStale"])
        ));
    }
    if out.is_empty() {
        "this node has no volumes".into()
    } else {
        out.trim_end().to_string()
    }
}

fn human_audit(v: &Value) -> String {
    let mut out = String::new();
    for a in v["audit"].as_array().into_iter().flatten() {
        out.push_str(&format!("{} {} {} via {}\n", s(&a["at"]), s(&a["act"]), s(&a["account"]), s(&a["node"])));
    }
    if out.is_empty() {
        "no admin acts recorded".into()
    } else {
        out.trim_end().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_short_of_copies_or_of_a_replicated_record_says_so() {
        let full = json!({"path": "/a", "size": 3, "copies": 2, "wanted": 2, "recordReplicated": true});
        assert_eq!(human_put(&full), "cluster:/a  3 B, 2 of 2 copies written");
        let big = json!({"path": "/b", "size": 3_u64 << 30, "copies": 1, "wanted": 1, "recordReplicated": true});
        assert_eq!(human_put(&big), "cluster:/b  3.0 GiB, 1 of 1 copies written");
        let short = json!({"path": "/a", "size": 3, "copies": 1, "wanted": 2, "recordReplicated": false});
        let text = human_put(&short);
        assert!(text.contains("1 of 2 copies") && text.contains("fewer copies"), "{text}");
        assert!(text.contains("lives on this node only"), "{text}");
    }
}
