//! Running the jobs the core hands to this node (`Output::JobRun`): each script on its own
//! thread in a fresh QuickJS runtime ([`script`]), its `fs` calls carried out on the cluster
//! drive as the job's owner (a local copy is read when this node holds one), its log lines and
//! progress reported to the core, its end reported with [`Node::job_finished`]. (Until accounts
//! exist every job's owner is the admin, and `fs` acts with the admin's rights.) `Output::JobStop`
//! sets the run's stop flag, which the engine's interrupt hook reads.
//!
//! Map children's pairs over [`SPILL_BYTES`] are written to `cluster:/.shoal/jobs/<parent>/`
//! and the reduce child reads them from there (no 8 MiB cap on the reduce input).
//!
//! [`Node::job_finished`]: shoal_core::node::Node::job_finished

pub mod script;
pub mod simulated;

use crate::env::Env;
use crate::node::handle::Shared;
use crate::node::state::JobsEngine;
use axum::http::HeaderMap;
use serde_json::{json, Value};
use shoal_core::identity::access::Mode;
use shoal_core::ids::JobId;
use shoal_core::jobs::{SPILL_BYTES, SPILL_DIR};
use shoal_core::meta::job::{JobKind, JobStatus};
use shoal_core::node::jobs::{JobRun, ScriptEnd};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Stack a script may use.
const STACK_BYTES: usize = 1024 * 1024;
/// Largest file a script reads at once.
const READ_MAX_BYTES: usize = 1 << 30;
/// Outputs larger than this go to a file; the record keeps its path.
const OUTPUT_INLINE_MAX: usize = 512 * 1024;
/// How long a reduce waits for its maps' records to reach this node.
const MAPS_WAIT_MS: u64 = 5_000;

/// `Output::JobStop`: raise the run's stop flag.
pub fn stop<E: Env>(s: &Arc<Shared<E>>, job: &JobId, attempt: u32) {
    if let Some(f) = crate::sync::lock(&s.jobs.stops).get(&(job.clone(), attempt)) {
        f.store(true, Ordering::Relaxed);
    }
}

/// `Output::JobRun`: run the script, then report its end to the core.
pub fn start<E: Env>(s: Arc<Shared<E>>, run: JobRun) {
    let flag = Arc::new(AtomicBool::new(false));
    crate::sync::lock(&s.jobs.stops).insert((run.job.clone(), run.attempt), flag.clone());
    tokio::spawn(async move {
        // Whatever happens to the run (a panic included), its end is reported: the core frees
        // the slot and the leader hears of it.
        let (s2, run2) = (s.clone(), run.clone());
        let end = tokio::spawn(async move { run_one(&s2, &run2, flag).await })
            .await
            .unwrap_or_else(|e| ScriptEnd::Threw(format!("the job's runner failed: {e}")));
        crate::sync::lock(&s.jobs.stops).remove(&(run.job.clone(), run.attempt));
        s.with_node(|n, now| n.job_finished(now, &run.job, run.attempt, end));
    });
}

async fn run_one<E: Env>(s: &Arc<Shared<E>>, run: &JobRun, stop: Arc<AtomicBool>) -> ScriptEnd {
    let out = match s.jobs_engine {
        JobsEngine::QuickJs => quickjs(s, run, stop).await,
        JobsEngine::Simulated => simulated::run(s, run, stop).await,
    };
    match out {
        Ok(out) => finish(s, run, out).await,
        Err(e) => ScriptEnd::Threw(e),
    }
}

/// Run the script in QuickJS on a thread of its own; its output as JSON text.
async fn quickjs<E: Env>(s: &Arc<Shared<E>>, run: &JobRun, stop: Arc<AtomicBool>) -> Result<String, String> {
    let spec = &run.spec;
    let entry = match spec.kind {
        JobKind::Map => script::Entry::Map { files: spec.inputs.iter().map(|p| format!("cluster:{p}")).collect() },
        JobKind::Reduce => script::Entry::Reduce { groups: reduce_groups(s, spec).await? },
        _ => script::Entry::Run,
    };
    let (me, memory, exec_allowed) = s.read_node(|n, _| {
        let memory = n.config_number("jobs", "memory_limit").unwrap_or(256.0 * 1024.0 * 1024.0) as usize;
        let allowed: Vec<String> = n
            .config_resolved_own()
            .get("jobs")
            .and_then(|m| m.get("exec_allowed"))
            .and_then(|r| r.value.clone())
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let allowed = allowed
            .into_iter()
            .filter(|p| n.self_info().capabilities.features.get(p).copied().unwrap_or(false))
            .collect();
        (n.id().clone(), memory, allowed)
    });
    let job_json = json!({"id": run.job, "name": spec.name, "kind": spec.kind, "args": spec.args,
        "inputs": spec.inputs.iter().map(|p| format!("cluster:{p}")).collect::<Vec<_>>(),
        "node": me, "owner": spec.owner, "attempt": run.attempt});
    // The timeout is the core's: it stops the run through the stop flag.
    let limits = script::Limits { memory_bytes: memory, stack_bytes: STACK_BYTES };
    let handle = tokio::runtime::Handle::current();
    let (s2, source, job, attempt) = (s.clone(), spec.script.clone(), run.job.clone(), run.attempt);
    let owner = s.read_node(|n, _| n.principal_of_owner(&spec.owner));
    let ended = tokio::task::spawn_blocking(move || {
        let host = Rc::new(ShellHost { s: s2, owner, handle, job, attempt, exec_allowed, stop: stop.clone() });
        script::run(&source, &job_json, entry, host, stop, limits)
    })
    .await
    .unwrap_or_else(|e| script::Ended::Failed(format!("the script's thread failed: {e}")));
    match ended {
        script::Ended::Failed(e) => Err(e),
        script::Ended::Output(o) => Ok(o),
    }
}

/// A run's output (JSON text) into its outcome: spilled to a file when too large for a record.
async fn finish<E: Env>(s: &Arc<Shared<E>>, run: &JobRun, out: String) -> ScriptEnd {
    let spec = &run.spec;
    // A map's pairs go under its parent's `maps/` (removed when the parent ends); a reduce's
    // output is its parent's output, kept under the parent; any other job's under its own id
    // (removed with the job's record).
    let spill = match spec.kind {
        JobKind::Map => out.len() > SPILL_BYTES,
        _ => out.len() > OUTPUT_INLINE_MAX,
    };
    if spill {
        let path = match (&spec.kind, &spec.parent_id) {
            (JobKind::Map, Some(parent)) => format!("{SPILL_DIR}/{parent}/maps/{}.json", run.job),
            (_, Some(parent)) => format!("{SPILL_DIR}/{parent}/output.json"),
            _ => format!("{SPILL_DIR}/{}/output.json", run.job),
        };
        let len = out.len();
        if let Err(e) = write_file(s, &path, out.into_bytes(), &spec.owner).await {
            return ScriptEnd::Threw(format!("could not write the output to cluster:{path}: {e}"));
        }
        return ScriptEnd::Returned(json!({"spilled": format!("cluster:{path}"), "bytes": len}));
    }
    match serde_json::from_str::<Value>(&out) {
        Ok(v) => ScriptEnd::Returned(v),
        Err(e) => ScriptEnd::Threw(format!("the output is not JSON: {e}")),
    }
}

/// The reduce child's input: every map child's pairs (from its record, or the file it spilled
/// to), grouped by key, as a JSON object of arrays.
pub(crate) async fn reduce_groups<E: Env>(
    s: &Arc<Shared<E>>,
    spec: &shoal_core::meta::job::JobSpec,
) -> Result<String, String> {
    let maps: Vec<JobId> = spec
        .args
        .get("maps")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .ok_or("a reduce child without its maps")?;
    let ids = maps.clone();
    let all_here = s
        .wait_for(MAPS_WAIT_MS, move |n, _| {
            ids.iter().all(|id| n.job_status(id.as_str()).is_ok_and(|v| v.status == JobStatus::Succeeded))
        })
        .await;
    if !all_here {
        return Err("the map children's results did not reach this node within 5 s".into());
    }
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for id in &maps {
        let output = s.read_node(|n, _| n.job_status(id.as_str()).map(|v| v.output)).map_err(|e| e.message)?;
        let pairs: Value = match output.get("spilled").and_then(Value::as_str) {
            Some(path) => {
                let bytes = read_file(s, path).await?;
                serde_json::from_slice(&bytes).map_err(|e| format!("{path}: {e}"))?
            }
            None => output,
        };
        let Value::Array(pairs) = pairs else { return Err(format!("map child {id} put out no pair list")) };
        for p in pairs {
            if let Value::Array(mut kv) = p {
                if kv.len() == 2 {
                    let v = kv.pop().unwrap_or_default();
                    let k = match kv.pop() {
                        Some(Value::String(k)) => k,
                        Some(other) => other.to_string(),
                        None => continue,
                    };
                    groups.entry(k).or_default().push(v);
                }
            }
        }
    }
    serde_json::to_string(&groups).map_err(|e| e.to_string())
}

fn bare(path: &str) -> Result<String, String> {
    shoal_core::jobs::submit::cluster_path(path).map_err(|e| format!("bad path {path:?}: {e}"))
}

pub(crate) async fn read_file<E: Env>(s: &Arc<Shared<E>>, path: &str) -> Result<Vec<u8>, String> {
    let p = bare(path)?;
    let resp = crate::services::drive::get(s.clone(), p.clone(), HeaderMap::new()).await;
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), READ_MAX_BYTES).await.map_err(|e| format!("cluster:{p}: {e}"))?;
    if !status.is_success() {
        return Err(error_message(&body).unwrap_or_else(|| format!("cluster:{p}: {status}")));
    }
    Ok(body.to_vec())
}

/// Write `bytes` to `path` as `owner` (the record of a new file keeps it).
async fn write_file<E: Env>(s: &Arc<Shared<E>>, path: &str, bytes: Vec<u8>, owner: &str) -> Result<(), String> {
    let p = bare(path)?;
    let mut h = HeaderMap::new();
    if let Ok(v) = axum::http::HeaderValue::from_str(&bytes.len().to_string()) {
        h.insert("content-length", v);
    }
    let resp =
        crate::services::drive::put(s.clone(), p.clone(), h, axum::body::Body::from(bytes), owner.to_string()).await;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap_or_default();
    Err(error_message(&body).unwrap_or_else(|| format!("cluster:{p}: {status}")))
}

fn error_message(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.pointer("/error/message").and_then(Value::as_str).map(str::to_string)
}

/// The script's way out, on the script's own thread: drive calls are run on the node's
/// runtime and waited for.
struct ShellHost<E: Env> {
    s: Arc<Shared<E>>,
    /// The job's owner: its `fs` calls obey the owner's access rules (issue 15).
    owner: shoal_core::identity::Principal,
    handle: tokio::runtime::Handle,
    job: JobId,
    attempt: u32,
    exec_allowed: Vec<String>,
    stop: Arc<AtomicBool>,
}

impl<E: Env> ShellHost<E> {
    /// The owner may `mode` at `path` (the core's rules).
    fn may(&self, path: &str, mode: Mode) -> Result<(), String> {
        let p = bare(path)?;
        self.s.read_node(|n, _| n.access_check(&self.owner, &p, mode)).map_err(|e| e.message)
    }

    /// A stopped run makes no more calls out (the engine's interrupt only fires between
    /// instructions, so each host call looks for itself).
    fn go_on(&self) -> Result<(), String> {
        if self.stop.load(Ordering::Relaxed) {
            return Err("job interrupted".into());
        }
        Ok(())
    }
}

impl<E: Env> script::Host for ShellHost<E> {
    fn log(&self, line: &str) {
        self.s.with_node(|n, now| n.job_log(now, &self.job, self.attempt, line));
    }

    fn progress(&self, p: f64) {
        self.s.with_node(|n, now| n.job_progress(now, &self.job, self.attempt, p));
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        self.go_on()?;
        self.may(path, Mode::Read)?;
        self.handle.block_on(read_file(&self.s, path))
    }

    fn write(&self, path: &str, bytes: Vec<u8>) -> Result<(), String> {
        self.go_on()?;
        self.may(path, Mode::Write)?;
        let owner = self.owner.name().to_string();
        self.handle.block_on(write_file(&self.s, path, bytes, &owner))
    }

    fn list(&self, path: &str) -> Result<Value, String> {
        self.go_on()?;
        let p = bare(path)?;
        self.s
            .read_node(|n, _| n.meta_ls_for(&self.owner, &p))
            .map(|l| serde_json::to_value(l.entries).unwrap_or_default())
            .map_err(|e| e.message)
    }

    fn stat(&self, path: &str) -> Result<Option<Value>, String> {
        self.go_on()?;
        self.may(path, Mode::Read)?;
        let p = bare(path)?;
        match self.s.read_node(|n, _| n.meta_stat(&p)) {
            Ok(st) => Ok(Some(serde_json::to_value(st).unwrap_or_default())),
            Err(e) if e.kind == shoal_core::answer::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.message),
        }
    }

    fn publish(&self, kind: &str, payload: Value) -> Result<(), String> {
        self.go_on()?;
        if !kind.starts_with("app.") {
            return Err(format!("a script publishes app.* events only, not {kind:?}"));
        }
        self.s.with_node(|n, now| n.event_publish(now, kind, payload)).map(|_| ()).map_err(|e| e.message)
    }

    fn exec(&self, program: &str, args: Vec<String>) -> Result<Value, String> {
        self.go_on()?;
        if !self.s.read_node(|n, _| n.job_may_exec(&self.owner)) {
            return Err(format!(
                "exec is for admins' jobs: a program reads the node's own files, out of reach of the folder rules ({} is no admin)",
                self.owner.name()
            ));
        }
        if !self.exec_allowed.iter().any(|p| p == program) {
            return Err(format!(
                "exec of {program:?} is not allowed here: it must be in the cluster's jobs.exec_allowed (a trusted key) and in this node's capabilities"
            ));
        }
        // No environment but PATH, started in the temp folder: nothing of the node's own
        // settings or working folder leaks into the program.
        let mut child = std::process::Command::new(program)
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .current_dir(std::env::temp_dir())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not start {program}: {e}"))?;
        // Both pipes are drained while the program runs, so a chatty one never blocks.
        let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                // Keep the first MiB; read and drop the rest so the program never blocks.
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = std::io::Read::read_to_end(&mut std::io::Read::take(&mut r, 1 << 20), &mut buf);
                    let _ = std::io::copy(&mut r, &mut std::io::sink());
                }
                buf
            })
        };
        let out_t = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn std::io::Read + Send>));
        let err_t = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn std::io::Read + Send>));
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if self.stop.load(Ordering::Relaxed) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("job interrupted".into());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(e.to_string()),
            }
        };
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        let clip = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(1 << 20)]).into_owned();
        Ok(json!({"code": status.code(), "stdout": clip(&stdout), "stderr": clip(&stderr)}))
    }
}
