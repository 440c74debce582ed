//! The verbs that talk to a node's admin API: one HTTP call each (through [`crate::net::client`]),
//! the answer shown for a person ([`super::human`]) or as JSON.

use super::args::*;
use super::human::*;
use super::output::{self as fmt, say, CliError};
use crate::env::TokioEnv;
use crate::net::client::HttpClient;
use crate::persist::identity::{API_URL_FILE, TOKEN_FILE};
use crate::wire::{escape_query, escape_segment};
use serde_json::{json, Value};

pub(super) struct Api {
    pub(super) base: String,
    token: String,
    /// Why there is no token, said when a call needs one (`shoal login` does not).
    no_token: Option<String>,
    pub(super) json: bool,
    client: HttpClient<TokioEnv>,
    /// What an https:// node is checked against (`--pin`, `--ca`, the kept session's pin or
    /// the data dir's `tls.pin`).
    pub(super) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The pin given or found, kept with a login.
    pub(super) pin: Option<String>,
}

fn read_file_trimmed(p: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

impl Api {
    /// The node and the credentials: `--api`, else the data dir's `api.url`, else the kept
    /// session's node (`shoal login`), else `http://127.0.0.1:7300`; `--token`/`SHOAL_TOKEN`,
    /// else the kept session when it is for that node, else the data dir's admin token.
    pub(super) fn new(g: &Global) -> Result<Api, CliError> {
        let kept = super::session::kept_session();
        let base = g
            .api
            .clone()
            .or_else(|| read_file_trimmed(&g.data.join(API_URL_FILE)))
            .or_else(|| kept.as_ref().map(|k| k.api.clone()))
            .unwrap_or_else(|| "http://127.0.0.1:7300".to_string());
        let base = base.trim_end_matches('/').to_string();
        crate::net::client::split_url(&base).map_err(|e| CliError(format!("--api: {e}")))?;
        if base.starts_with("http://") && (g.pin.is_some() || g.ca.is_some()) {
            return Err(CliError(format!(
                "--pin/--ca ask for a checked connection, but {base} is plain http://: use the node's https:// URL"
            )));
        }
        let kept_here = kept.as_ref().filter(|k| k.api.trim_end_matches('/') == base);
        let pin = g
            .pin
            .clone()
            .or_else(|| kept_here.and_then(|k| k.pin.clone()))
            .or_else(|| read_file_trimmed(&g.data.join(crate::net::tls::PIN_FILE)));
        let tls = match (&pin, &g.ca) {
            (_, Some(ca)) => Some(crate::net::tls::client_ca(ca).map_err(|e| CliError(format!("--ca: {e}")))?),
            (Some(p), None) => Some(crate::net::tls::client_pinned(p).map_err(|e| CliError(format!("--pin: {e}")))?),
            (None, None) => None,
        };
        let token = g
            .token
            .as_ref()
            .map(|t| t.trim().to_string())
            .or_else(|| kept.filter(|k| k.api.trim_end_matches('/') == base).map(|k| k.token))
            .or_else(|| read_file_trimmed(&g.data.join(TOKEN_FILE)));
        let no_token = token.is_none().then(|| {
            format!(
                "no token: `shoal login`, pass --token, set SHOAL_TOKEN, or point --data at the node's data dir (no {} there)",
                g.data.join(TOKEN_FILE).display()
            )
        });
        let mut client = HttpClient::new(TokioEnv::default());
        if let Some(c) = &tls {
            client = client.with_tls(c.clone());
        }
        Ok(Api { base, token: token.unwrap_or_default(), no_token, json: g.json, client, tls, pin })
    }

    /// The token calls carry, or why there is none.
    pub(super) fn token(&self) -> Result<&str, CliError> {
        match &self.no_token {
            Some(why) => Err(CliError(why.clone())),
            None => Ok(&self.token),
        }
    }

    /// `events --follow`: a WebSocket to `/v1/events`, one line per event until the node closes
    /// it (a close for slowness says how to resume) or the user stops.
    async fn follow_events(&self, query: &str) -> Result<(), CliError> {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        let parts = crate::net::client::parse_url(&self.base).map_err(|e| CliError(format!("--api: {e}")))?;
        let authority = parts.authority.clone();
        let url = format!("ws://{authority}/v1/events?{query}");
        let mut req = url.as_str().into_client_request().map_err(|e| CliError(format!("{url}: {e}")))?;
        let auth = format!("Bearer {}", self.token()?)
            .parse()
            .map_err(|_| CliError("the admin token has characters a header cannot carry".into()))?;
        req.headers_mut().insert("authorization", auth);
        let tcp = tokio::net::TcpStream::connect(authority.as_str())
            .await
            .map_err(|e| CliError(format!("cannot reach the node's API at {}: {e}", self.base)))?;
        let tcp = crate::cli::files::secure(tcp, &parts, self.tls.clone()).await?;
        let (mut ws, _) = tokio_tungstenite::client_async(req, tcp)
            .await
            .map_err(|e| CliError(format!("the node refused the events feed: {e}")))?;
        while let Some(msg) = ws.next().await {
            match msg.map_err(|e| CliError(format!("events feed: {e}")))? {
                Message::Text(t) => {
                    let e: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                    say(if self.json { e.to_string() } else { human_event(&e) });
                }
                Message::Close(Some(f)) if u16::from(f.code) != 1000 => {
                    return Err(CliError(format!("the node closed the feed: {}", f.reason)));
                }
                Message::Close(_) => return Ok(()),
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, CliError> {
        let auth = format!("Bearer {}", self.token()?);
        self.call_with(method, path, body, &[("authorization", &auth)]).await
    }

    /// A call with these headers only (`POST /v1/login` carries no token).
    pub(super) async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, CliError> {
        let body = body.map(|b| serde_json::to_vec(&b).expect("serialise")).unwrap_or_default();
        let target = format!("/v1{path}");
        let resp = self
            .client
            .request(&self.base, method, &target, headers, body, 60_000)
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

    pub(super) async fn run(&self, cmd: Cmd) -> Result<(), CliError> {
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
            Cmd::Node { cmd: NodeCmd::Wake { id } } => {
                (self.call("POST", &format!("/nodes/{}/wake", path_seg(&id)?), None).await?, |v| {
                    let from: Vec<String> = v["sentFrom"].as_array().into_iter().flatten().map(s).collect();
                    format!("sent the Wake-on-LAN packet for {} from {}", s(&v["node"]), from.join(", "))
                })
            }
            Cmd::Node { cmd: NodeCmd::Tunnel } => (self.call("GET", "/node/tunnel", None).await?, human_tunnel),
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
            Cmd::Volume { cmd: VolumeCmd::Add { path, name, create } } => {
                let abs = std::path::Path::new(&path);
                let abs = if abs.is_absolute() {
                    abs.to_path_buf()
                } else {
                    std::env::current_dir().map_err(|e| CliError(format!("current dir: {e}")))?.join(abs)
                };
                let body = json!({"path": abs.to_string_lossy(), "name": name, "create": create});
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
            Cmd::Events { cmd: Some(EventsCmd::Publish { kind, payload }), .. } => {
                let data: Value = serde_json::from_str(&payload)
                    .map_err(|e| CliError(format!("--payload is not JSON: {e} (quote a string: '\"text\"')")))?;
                (self.call("POST", "/events", Some(json!({"type": kind, "data": data}))).await?, |v| {
                    format!("published {} {} (seq {})", s(&v["type"]), s(&v["id"]), s(&v["seq"]))
                })
            }
            Cmd::Events { cmd: None, kind, since, follow } => {
                let q = format!("type={}&since={since}", escape_query(&kind));
                if follow {
                    return self.follow_events(&q).await;
                }
                let v = self.call("GET", &format!("/events?follow=false&{q}"), None).await?;
                for e in v["events"].as_array().into_iter().flatten() {
                    say(if self.json { e.to_string() } else { human_event(e) });
                }
                return Ok(());
            }
            Cmd::Job { cmd } => return self.job(cmd).await,
            Cmd::Sched { cmd: SchedCmd::Status } => {
                (self.call("GET", "/sched/status", None).await?, human_sched_status)
            }
            Cmd::Sched { cmd: SchedCmd::Weights { set, reset, why } } => {
                if set.is_empty() && !reset {
                    (self.call("GET", "/sched/weights", None).await?, human_weights)
                } else {
                    let mut pairs = serde_json::Map::new();
                    for s in &set {
                        let (name, v) = s
                            .split_once('=')
                            .ok_or_else(|| CliError(format!("--set {s:?}: write NAME=VALUE, like cpu=0.3")))?;
                        let v: f64 = v
                            .trim()
                            .parse()
                            .map_err(|_| CliError(format!("--set {s:?}: {v:?} is not a number between 0 and 1")))?;
                        pairs.insert(name.trim().to_string(), json!(v));
                    }
                    let why = why.ok_or_else(|| CliError("changing the weights needs --why TEXT".into()))?;
                    let body = json!({"set": pairs, "reset": reset, "why": why});
                    (self.call("POST", "/sched/weights", Some(body)).await?, |v| human_weights(&v["weights"]))
                }
            }
            Cmd::Sched { cmd: SchedCmd::Explain { place, path, job } } => {
                let q = match (place, job) {
                    (Some(size), None) => {
                        let mut q = format!("place={}", escape_query(&size));
                        if let Some(p) = path {
                            let p = p.strip_prefix("cluster:").unwrap_or(&p).to_string();
                            q.push_str(&format!("&path={}", escape_query(&p)));
                        }
                        q
                    }
                    (None, Some(id)) => format!("job={}", escape_query(&id)),
                    _ => return Err(CliError("sched explain takes --place SIZE (with --path P) or --job ID".into())),
                };
                (self.call("GET", &format!("/sched/explain?{q}"), None).await?, human_explain)
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
                let v = crate::cli::files::put(&self.base, self.tls.clone(), self.token()?, &local, &remote, self.json)
                    .await?;
                (v, human_put)
            }
            Cmd::Get { remote, local } => {
                let v = crate::cli::files::get(&self.base, self.tls.clone(), self.token()?, &remote, &local, self.json)
                    .await?;
                (v, human_get)
            }
            Cmd::Ls { path } => {
                let p = crate::cli::files::cluster_path(&path)?;
                (self.call("GET", &format!("/meta/ls?path={}", escape_query(&p)), None).await?, human_ls)
            }
            Cmd::Stat { path } => {
                let p = crate::cli::files::cluster_path(&path)?;
                (self.call("GET", &format!("/meta/stat?path={}", escape_query(&p)), None).await?, human_stat)
            }
            Cmd::Rm { path, recursive } => {
                let p = crate::cli::files::cluster_path(&path)?;
                let q = if recursive { "?recursive=true" } else { "" };
                (self.call("DELETE", &format!("/files{}{q}", escape_query(&p)), None).await?, human_kv)
            }
            Cmd::Mv { from, to } => {
                let (from, to) = (crate::cli::files::cluster_path(&from)?, crate::cli::files::cluster_path(&to)?);
                (self.call("POST", "/mv", Some(json!({"from": from, "to": to}))).await?, human_kv)
            }
            Cmd::Mkdir { path } => {
                let p = crate::cli::files::cluster_path(&path)?;
                (self.call("POST", "/mkdir", Some(json!({ "path": p }))).await?, human_kv)
            }
            Cmd::Verify { path } => {
                let p = crate::cli::files::cluster_path(&path)?;
                let v = self.call("POST", "/verify", Some(json!({ "path": p }))).await?;
                say(if self.json { v.to_string() } else { human_verify(&v) });
                // A copy that did not match (or could not be read) is a failure a script must
                // see: the exit status says so.
                let bad = v["stale"].as_array().map_or(0, Vec::len);
                let unreachable = v["unreachable"].as_array().map_or(0, Vec::len);
                let renaming = v["renamePending"].as_array().map_or(0, Vec::len);
                if bad + unreachable + renaming > 0 {
                    return Err(CliError(format!(
                        "{bad} copies did not match their checksum (marked stale, to be repaired), {unreachable} could not be read, {renaming} still wait for a move's rename (not checked)"
                    )));
                }
                return Ok(());
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
            cmd @ (Cmd::User { .. }
            | Cmd::Group { .. }
            | Cmd::Login { .. }
            | Cmd::Logout
            | Cmd::Whoami
            | Cmd::Access { .. }
            | Cmd::Identity { .. }
            | Cmd::Session { .. }
            | Cmd::Apikey { .. }) => self.identity(cmd).await?,
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

/// Node ids and token ids are plain tokens; refuse anything that would change the URL path.
pub(super) fn path_seg(id: &str) -> Result<&str, CliError> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(CliError(format!("{id:?} is not a valid id (letters, digits and '-' only)")));
    }
    Ok(id)
}
