//! The command line's words and flags (clap): every verb, its arguments and their help.

use clap::{Args, Parser, Subcommand};
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
    /// For an https:// node: accept exactly the certificate with this SHA-256 (hex; `shoal
    /// cluster status` on the node shows it). Default: the pin in DATA/tls.pin.
    #[arg(long, global = true, env = "SHOAL_PIN")]
    pub pin: Option<String>,
    /// For an https:// node: trust the CA certificates in this PEM file (chain and name checked;
    /// wins over --pin).
    #[arg(long, global = true, env = "SHOAL_CA")]
    pub ca: Option<PathBuf>,
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
    /// Accounts of this node (admin): add, list, remove, set a password or role.
    User {
        #[command(subcommand)]
        cmd: UserCmd,
    },
    /// Groups of this node (admin).
    Group {
        #[command(subcommand)]
        cmd: GroupCmd,
    },
    /// Sign in: the password from a prompt, or from stdin when stdin is not a terminal; the
    /// session is kept in the user's config dir (mode 0600) and used by every later command.
    Login {
        #[arg(long)]
        user: Option<String>,
    },
    /// End the kept session.
    Logout,
    /// Who the CLI acts as.
    Whoami,
    /// Per-folder access on cluster:/ (admin): which group may read or write where.
    Access {
        #[command(subcommand)]
        cmd: AccessCmd,
    },
    /// The identity origin, the last directory sync and forward auth.
    Identity {
        #[command(subcommand)]
        cmd: IdentityCmd,
    },
    /// Sessions (a user sees and ends their own; an admin every one).
    Session {
        #[command(subcommand)]
        cmd: SessionCmd,
    },
    /// API keys for scripts, shown once.
    Apikey {
        #[command(subcommand)]
        cmd: ApikeyCmd,
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
    /// The cluster's events: the recent ones, or follow them as they come (`--follow`).
    Events {
        #[command(subcommand)]
        cmd: Option<EventsCmd>,
        /// Only types matching this glob (`file.*`, `app.build-*`).
        #[arg(long = "type", value_name = "GLOB", default_value = "")]
        kind: String,
        /// Only events after this sequence number of the node's ring (resume where you left).
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// Keep the connection open and print each event as it comes (a WebSocket).
        #[arg(long)]
        follow: bool,
    },
    /// Jobs: JavaScript run where the data and the tools are, map/reduce over a dataset.
    Job {
        #[command(subcommand)]
        cmd: JobCmd,
    },
    /// Scheduling: the scorer's weights, each node's score and why a node would take work.
    Sched {
        #[command(subcommand)]
        cmd: SchedCmd,
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
    Checksum {
        local: PathBuf,
        /// Also take each 4 MiB chunk's own SHA-256 in the same pass, as a node that relays or
        /// receives a file does (the same whole-file sum; `benches/drive_transfer.sh` times it).
        #[arg(long)]
        chunks: bool,
    },
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
        /// Create the folder if it does not exist (otherwise refused: a typo or an unmounted
        /// disk would fill the root disk).
        #[arg(long)]
        create: bool,
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
pub enum EventsCmd {
    /// Publish an `app.NAME` event to the whole cluster.
    Publish {
        #[arg(long = "type", value_name = "app.NAME")]
        kind: String,
        /// The payload, JSON (at most 64 KiB). Named `--payload` because `--data` is the data
        /// folder every verb takes.
        #[arg(long, default_value = "null")]
        payload: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum SchedCmd {
    /// The weights, every member's score with its factors, and the latency matrix.
    Status,
    /// Show the weights, or change them cluster-wide: `--set cpu=0.3 --why TEXT`, `--reset`.
    Weights {
        /// NAME=VALUE, VALUE between 0 and 1 (locality, cpu, memory, disk, queue, latency,
        /// health, features, diversity); repeat for several.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Back to the shipped weights.
        #[arg(long)]
        reset: bool,
        /// Why (kept in the config history); needed to change anything.
        #[arg(long)]
        why: Option<String>,
    },
    /// Why each node would or would not take a new copy of SIZE bytes (`--place 64MiB`).
    Explain {
        #[arg(long, value_name = "SIZE")]
        place: Option<String>,
        /// The file the copy is of (its holders are left out, its primary preferred).
        #[arg(long)]
        path: Option<String>,
        /// A job (arrives with jobs).
        #[arg(long)]
        job: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
// Parsed once per command line: the size of a submit's flags does not matter.
#[allow(clippy::large_enum_variant)]
pub enum JobCmd {
    /// Submit a script (prints the job's id; `--follow` shows its progress, log and output).
    Submit {
        script: PathBuf,
        #[arg(long)]
        name: Option<String>,
        /// The job's arguments as JSON (`job.args`).
        #[arg(long, value_name = "JSON")]
        args: Option<String>,
        /// A `cluster:/` file the job reads (its bytes draw it to the nodes holding them); repeat.
        #[arg(long = "input", value_name = "cluster:/PATH")]
        inputs: Vec<String>,
        /// A glob over `cluster:/` (`*`, `**`, `?`): a map/reduce job over the files it matches.
        #[arg(long, value_name = "GLOB")]
        dataset: Option<String>,
        /// Files per map child (default 50).
        #[arg(long)]
        partition_max: Option<u32>,
        /// Only these nodes may run it; repeat.
        #[arg(long = "node", value_name = "ID")]
        nodes: Vec<String>,
        /// A tool or CPU flag the node must have (`ffmpeg`, `cpu.avx2`); repeat.
        #[arg(long = "require", value_name = "FEATURE")]
        require: Vec<String>,
        #[arg(long, value_name = "BYTES")]
        min_ram: Option<String>,
        #[arg(long)]
        min_cores: Option<u32>,
        /// Higher runs first (-1000..=1000).
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// How long it may run (`90s`, `10m`, `2h`; default 1h).
        #[arg(long)]
        timeout: Option<String>,
        /// Runs started before a job whose node went silent fails (default 3).
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Follow it to its end: progress, log lines, then the output.
        #[arg(long)]
        follow: bool,
    },
    /// Unfinished jobs (`--all`: finished ones and map/reduce children too).
    List {
        #[arg(long)]
        all: bool,
    },
    /// A job's status, node, attempts, progress, output and error.
    Status { id: String },
    /// A job's last 200 log lines (`--follow` until it ends).
    Logs {
        id: String,
        #[arg(long)]
        follow: bool,
    },
    /// A job's output (JSON).
    Output { id: String },
    /// Cancel a job: a waiting one ends, a running one's script is stopped.
    Cancel { id: String },
    /// Every node ranked for the job now, with its factors and why it can or cannot run it.
    Explain { id: String },
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
    /// URL other nodes use to reach this one (default http://<listen>). `none`: they cannot
    /// (behind NAT); the node then opens a reverse tunnel to a member and is reached through it.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Prefer this member (node id) as the tunnel host, while it is ONLINE.
    #[arg(long)]
    pub tunnel_via: Option<String>,
    /// Display name of this node (default: the hostname).
    #[arg(long)]
    pub name: Option<String>,
    /// No cluster agent; /cluster/acn/* answers 404.
    #[arg(long)]
    pub disable_cluster: bool,
    /// cluster.redb is damaged: keep it aside, rejoin from cluster.recovery.json, take the
    /// metadata from the peers and rescan this node's volumes.
    #[arg(long)]
    pub rebuild_meta: bool,
    /// Serve HTTPS: `self-signed` makes a certificate on first start and keeps it in DATA/tls/
    /// (peers pin it through this node's signed record). With --tls-cert/--tls-key, the
    /// operator's certificate instead.
    #[arg(long, value_parser = ["self-signed"], conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Heartbeat interval in ms (spec default 15000).
    #[arg(long, default_value_t = 15_000)]
    pub heartbeat_ms: u64,
    /// A node heard from within this many ms is ONLINE (spec default 45000).
    #[arg(long, default_value_t = 45_000)]
    pub online_within_ms: u64,
    /// Silent up to this many ms is UNKNOWN, beyond it OFFLINE (spec default 180000).
    #[arg(long, default_value_t = 180_000)]
    pub unknown_within_ms: u64,
    /// Threads that run the node's requests and tasks (default: one per core). Several nodes
    /// on one machine each take the cores divided by the nodes, at least 1: on 2 cores, 3
    /// nodes of 1 thread used 10-20 % less CPU per metadata write than 3 of 2 (BENCHMARKS.md,
    /// issue 18). Disk work and job scripts run on threads of their own either way.
    #[arg(long, env = "SHOAL_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
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
pub enum UserCmd {
    /// Add an account; its password from a prompt, or from stdin when stdin is not a terminal.
    Add {
        name: String,
        /// A group it belongs to (repeat for more; each must exist).
        #[arg(long = "group")]
        groups: Vec<String>,
        #[arg(long)]
        admin: bool,
    },
    List,
    Rm {
        name: String,
    },
    /// Set NAME's password (admin), or without NAME your own (asks the old one).
    Passwd {
        name: Option<String>,
    },
    /// Change an account's role or groups.
    Set {
        name: String,
        #[arg(long, conflicts_with = "user")]
        admin: bool,
        #[arg(long)]
        user: bool,
        /// Its groups, replacing the old ones (repeat for more).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Take every group off it.
        #[arg(long, conflicts_with = "groups")]
        no_groups: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AccessCmd {
    /// Let GROUP read or write FOLDER and everything below it.
    Set {
        folder: String,
        #[arg(long)]
        group: String,
        /// read or write.
        #[arg(long)]
        mode: String,
    },
    List,
    Rm {
        folder: String,
        #[arg(long)]
        group: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum IdentityCmd {
    Status,
    /// Copy the origin's directory now.
    Sync,
}

#[derive(Subcommand, Debug)]
pub enum GroupCmd {
    Add { name: String },
    List,
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
pub enum SessionCmd {
    List,
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum ApikeyCmd {
    /// Make a key; its secret is printed once.
    New {
        #[arg(long)]
        name: String,
        /// user or admin (no higher than yours).
        #[arg(long, default_value = "user")]
        role: String,
        /// Lifetime: 30d, 12h, 90m, 45s (default 30d, at most 365d).
        #[arg(long)]
        expires: Option<String>,
    },
    List,
    Revoke {
        id: String,
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
    /// This node's reverse tunnel (behind NAT) and its host, and the tunnels it hosts.
    Tunnel,
    /// Wake a sleeping member (Wake-on-LAN): every reachable member broadcasts the magic packet
    /// for the MAC addresses it reported.
    Wake { id: String },
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks over every verb (two options with one name, a default of
    /// the wrong type...), which otherwise show only when that verb is run.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
