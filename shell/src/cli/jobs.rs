//! `shoal job ...`: submit, follow, list, status, logs, output, cancel and explain, over
//! `/v1/jobs`.

use super::api::{path_seg, Api};
use super::args::JobCmd;
use super::human::{human_explain, s};
use super::output::{say, CliError};
use serde_json::{json, Value};
use std::time::Duration;

/// How often `--follow` asks for the job again.
const FOLLOW_EVERY: Duration = Duration::from_millis(300);

fn human_job(v: &Value) -> String {
    let mut out = format!(
        "{}  {}  {}  node {}  attempts {}/{}  progress {:.0}%",
        s(&v["id"]),
        s(&v["name"]),
        s(&v["status"]),
        v["node"].as_str().unwrap_or("-"),
        s(&v["attempts"]),
        s(&v["maxAttempts"]),
        v["progress"].as_f64().unwrap_or(0.0) * 100.0
    );
    if let Some(r) = v["reason"].as_str().filter(|r| !r.is_empty()) {
        out.push_str(&format!("\n  {r}"));
    }
    if let Some(e) = v["error"].as_str().filter(|e| !e.is_empty()) {
        out.push_str(&format!("\n  error: {e}"));
    }
    if !v["output"].is_null() {
        out.push_str(&format!("\n  output: {}", v["output"]));
    }
    out
}

fn human_list(v: &Value) -> String {
    let mut out = format!("{:<36}  {:<10} {:<9} {:>5}  {:<36}  NAME", "ID", "STATUS", "KIND", "DONE", "NODE");
    for j in v["jobs"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n{:<36}  {:<10} {:<9} {:>4.0}%  {:<36}  {}",
            s(&j["id"]),
            s(&j["status"]),
            s(&j["kind"]),
            j["progress"].as_f64().unwrap_or(0.0) * 100.0,
            j["node"].as_str().unwrap_or("-"),
            s(&j["name"])
        ));
    }
    out
}

fn is_final(status: &Value) -> bool {
    matches!(status.as_str(), Some("succeeded" | "failed" | "cancelled"))
}

impl Api {
    pub(super) async fn job(&self, cmd: JobCmd) -> Result<(), CliError> {
        let (v, human): (Value, fn(&Value) -> String) = match cmd {
            JobCmd::Submit {
                script,
                name,
                args,
                inputs,
                dataset,
                partition_max,
                nodes,
                require,
                min_ram,
                min_cores,
                priority,
                timeout,
                max_attempts,
                follow,
            } => {
                let source = std::fs::read_to_string(&script)
                    .map_err(|e| CliError(format!("cannot read the script {}: {e}", script.display())))?;
                let args: Value = match args {
                    Some(a) => serde_json::from_str(&a).map_err(|e| CliError(format!("--args is not JSON: {e}")))?,
                    None => Value::Null,
                };
                let min_ram = match min_ram {
                    Some(r) => shoal_core::config::types::parse_bytes(&r)
                        .ok_or_else(|| CliError(format!("--min-ram {r:?} is not a size (like 4GiB)")))?,
                    None => 0,
                };
                let timeout_sec = match timeout {
                    Some(t) => Some(
                        shoal_core::config::types::parse_duration_ms(&t).filter(|ms| *ms >= 1000).ok_or_else(|| {
                            CliError(format!("--timeout {t:?} is not a duration of 1s or more (like 90s, 10m)"))
                        })? / 1000,
                    ),
                    None => None,
                };
                let script_name = script.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let body = json!({
                    "name": name.unwrap_or_default(), "script": source, "scriptName": script_name, "args": args,
                    "inputs": inputs, "dataset": dataset.unwrap_or_default(), "partitionMax": partition_max,
                    "nodes": nodes, "priority": priority, "timeoutSec": timeout_sec, "maxAttempts": max_attempts,
                    "requirements": {"features": require, "minRam": min_ram, "minCores": min_cores.unwrap_or(0)},
                });
                let v = self.call("POST", "/jobs", Some(body)).await?;
                let id = s(&v["id"]);
                if !follow {
                    if self.json {
                        say(v.to_string());
                    } else {
                        say(id);
                    }
                    return Ok(());
                }
                if !self.json {
                    say(format!("job {id}"));
                }
                return self.follow(&id, true).await;
            }
            JobCmd::List { all } => (self.call("GET", &format!("/jobs?all={all}"), None).await?, human_list),
            JobCmd::Status { id } => (self.call("GET", &format!("/jobs/{}", path_seg(&id)?), None).await?, human_job),
            JobCmd::Logs { id, follow } => {
                if follow {
                    return self.follow(&id, false).await;
                }
                (self.call("GET", &format!("/jobs/{}/logs", path_seg(&id)?), None).await?, |v| {
                    v["log"].as_array().into_iter().flatten().map(s).collect::<Vec<_>>().join("\n")
                })
            }
            JobCmd::Output { id } => {
                let v = self.call("GET", &format!("/jobs/{}/output", path_seg(&id)?), None).await?;
                if v["status"] == json!("failed") && !self.json {
                    return Err(CliError(format!("job {id} failed: {}", s(&v["error"]))));
                }
                (v, |v| match &v["output"] {
                    Value::Null if !is_final(&v["status"]) => {
                        format!("(no output yet: the job is {})", s(&v["status"]))
                    }
                    o => serde_json::to_string_pretty(o).unwrap_or_default(),
                })
            }
            JobCmd::Cancel { id } => {
                (self.call("POST", &format!("/jobs/{}/cancel", path_seg(&id)?), None).await?, |v| {
                    format!("cancel asked for job {} (it was {})", s(&v["id"]), s(&v["status"]))
                })
            }
            JobCmd::Explain { id } => {
                (self.call("GET", &format!("/jobs/{}/explain", path_seg(&id)?), None).await?, human_explain)
            }
        };
        if self.json {
            say(v.to_string());
        } else {
            say(human(&v));
        }
        Ok(())
    }

    /// Follow a job to its end: new log lines as they come, a progress bar (with `bar`), then
    /// its output or error. A failed or cancelled job exits non-zero.
    async fn follow(&self, id: &str, bar: bool) -> Result<(), CliError> {
        let seg = path_seg(id)?.to_string();
        let pb = (bar && !self.json).then(|| {
            let pb = indicatif::ProgressBar::new(1000);
            pb.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{bar:40}] {percent:>3}% {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb
        });
        let mut seen: Vec<String> = Vec::new();
        loop {
            let v = self.call("GET", &format!("/jobs/{seg}"), None).await?;
            let logs = self.call("GET", &format!("/jobs/{seg}/logs"), None).await?;
            let lines: Vec<String> = logs["log"].as_array().into_iter().flatten().map(s).collect();
            // The record keeps the last 200 lines: print those after the ones printed already.
            let start = (0..=seen.len().min(lines.len())).rev().find(|k| seen.ends_with(&lines[..*k])).unwrap_or(0);
            for l in &lines[start..] {
                match &pb {
                    Some(pb) => pb.println(l),
                    None if !self.json => say(l.clone()),
                    None => {}
                }
            }
            seen = lines;
            if let Some(pb) = &pb {
                pb.set_position((v["progress"].as_f64().unwrap_or(0.0) * 1000.0) as u64);
                pb.set_message(format!("{} {}", s(&v["status"]), v["node"].as_str().unwrap_or("")));
            }
            if is_final(&v["status"]) {
                if let Some(pb) = &pb {
                    pb.finish_and_clear();
                }
                if self.json {
                    say(v.to_string());
                } else if v["status"] == json!("succeeded") {
                    say(serde_json::to_string_pretty(&v["output"]).unwrap_or_default());
                }
                return match v["status"].as_str() {
                    Some("succeeded") => Ok(()),
                    _ => Err(CliError(format!("job {id} {}: {}", s(&v["status"]), s(&v["error"])))),
                };
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}
