//! The simulator's job engine ([`JobsEngine::Simulated`]): QuickJS runs on threads of its own,
//! outside turmoil's clock, so in simulation a job's kind and `args` say what to do and it is
//! done natively on the node's own task, through the same drive calls a script's `fs` makes:
//! - every kind first works `args.workMs` simulated milliseconds, looking at its stop flag
//!   every 100 ms (so a cancel, a timeout or a lost lease stops it as it stops a script);
//! - a map child counts the words of its inputs (as `fs.countWords` does) and puts out one
//!   `[word, count]` pair per word;
//! - a reduce child sums each word's counts over every map's pairs (read from the records or
//!   the files they spilled to);
//! - any other job puts out `{"node", "attempt"}`.
//!
//! [`JobsEngine::Simulated`]: crate::node::state::JobsEngine::Simulated

use super::script::split_words;
use crate::env::Env;
use crate::node::handle::Shared;
use serde_json::{json, Value};
use shoal_core::meta::job::JobKind;
use shoal_core::node::jobs::JobRun;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub async fn run<E: Env>(s: &Arc<Shared<E>>, run: &JobRun, stop: Arc<AtomicBool>) -> Result<String, String> {
    let spec = &run.spec;
    let work_ms = spec.args.get("workMs").and_then(Value::as_u64).unwrap_or(0);
    let t0 = s.env.monotonic();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err("job interrupted".into());
        }
        let spent = s.env.monotonic().since(t0);
        if spent >= work_ms {
            break;
        }
        let p = spent as f64 / work_ms.max(1) as f64;
        s.with_node(|n, now| n.job_progress(now, &run.job, run.attempt, p));
        tokio::time::sleep(Duration::from_millis(100.min(work_ms - spent))).await;
    }
    match spec.kind {
        JobKind::Map => {
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            for p in &spec.inputs {
                let bytes = super::read_file(s, p).await?;
                for w in split_words(&bytes) {
                    *counts.entry(String::from_utf8_lossy(w).into_owned()).or_default() += 1;
                }
            }
            let pairs: Vec<Value> = counts.into_iter().map(|(w, n)| json!([w, n])).collect();
            Ok(Value::Array(pairs).to_string())
        }
        JobKind::Reduce => {
            let groups: BTreeMap<String, Vec<Value>> =
                serde_json::from_str(&super::reduce_groups(s, spec).await?).map_err(|e| e.to_string())?;
            let sums: BTreeMap<String, u64> =
                groups.into_iter().map(|(k, v)| (k, v.iter().filter_map(Value::as_u64).sum())).collect();
            Ok(json!(sums).to_string())
        }
        _ => {
            let me = s.read_node(|n, _| n.id().clone());
            Ok(json!({"node": me, "attempt": run.attempt}).to_string())
        }
    }
}
