//! Running one job script in QuickJS (rquickjs): a fresh runtime and context per run with a
//! memory limit, a stack limit and an interrupt hook (cancel, timeout), the reference's job
//! prelude (`job`/`JOB` with `log`, `progress`, `cancelled`, `abortIfCancelled`), the `fs`
//! object on `cluster:/` paths, fast native helpers, and the three entry points: `run(job)`,
//! `mapper(files, emit)` and `reducer(key, values)` (reference-facts.md "Job script interface").
//!
//! The script reaches nothing of the host but what [`Host`] gives it: no files outside the
//! cluster drive, no network, no processes unless `exec` is allowed.

use rquickjs::{Context, Ctx, Exception, Function, Object, Runtime, TypedArray};
use serde_json::Value;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a script may do outside itself. Paths are `cluster:/` paths (the prefix optional).
pub trait Host {
    fn log(&self, line: &str);
    fn progress(&self, p: f64);
    fn read(&self, path: &str) -> Result<Vec<u8>, String>;
    fn write(&self, path: &str, bytes: Vec<u8>) -> Result<(), String>;
    /// A folder's entries as JSON.
    fn list(&self, path: &str) -> Result<Value, String>;
    /// A path's record as JSON, `None` when nothing is there.
    fn stat(&self, path: &str) -> Result<Option<Value>, String>;
    fn publish(&self, kind: &str, payload: Value) -> Result<(), String>;
    /// Run a host program (only those allowed); `{code, stdout, stderr}`.
    fn exec(&self, program: &str, args: Vec<String>) -> Result<Value, String>;
}

/// What to call in the script.
#[derive(Clone, Debug)]
pub enum Entry {
    /// `setup({node})` if defined, then `run(job)`.
    Run,
    /// `mapper(files, emit)`: the output is the emitted `[key, value]` pairs.
    Map { files: Vec<String> },
    /// `reducer(key, values)` for every key of `groups` (a JSON object of arrays).
    Reduce { groups: String },
}

/// Limits of one run. Its timeout is the core's (`Output::JobStop`), which raises the stop
/// flag the interrupt hook reads.
#[derive(Clone, Debug)]
pub struct Limits {
    pub memory_bytes: usize,
    pub stack_bytes: usize,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    /// The output as JSON text (`null` for undefined).
    Output(String),
    /// The script threw, failed a limit or was interrupted.
    Failed(String),
}

const PRELUDE: &str = r#"
var job = JSON.parse(__job_json);
job.log = function (m) { __log(typeof m === "string" ? m : JSON.stringify(m)); };
job.progress = function (p) { __progress(Number(p)); };
job.cancelled = function () { return __cancelled(); };
job.abortIfCancelled = function () { if (__cancelled()) { throw new Error("job cancelled"); } };
var JOB = job;
var fs = {
  readText: function (p) { return __fs_read_text(String(p)); },
  readBytes: function (p) { return __fs_read_bytes(String(p)); },
  readLines: function (p) { var t = __fs_read_text(String(p)); var l = t.split("\n"); if (l.length && l[l.length - 1] === "") { l.pop(); } return l; },
  writeText: function (p, t) { __fs_write_text(String(p), String(t)); },
  writeBytes: function (p, b) { __fs_write_bytes(String(p), b); },
  list: function (p) { return JSON.parse(__fs_list(String(p))); },
  stat: function (p) { var s = __fs_stat(String(p)); return s === "" ? null : JSON.parse(s); },
  exists: function (p) { return __fs_stat(String(p)) !== ""; },
  countWords: function (p) { return JSON.parse(__fs_count_words(String(p))); },
  sha256: function (p) { return __fs_sha256(String(p)); }
};
function countWords(text) { return JSON.parse(__count_words(String(text))); }
function words(text) { return JSON.parse(__words(String(text))); }
function sha256(x) { return __sha256(typeof x === "string" ? x : String(x)); }
function mergeCounts(into, from) { for (var k in from) { into[k] = (into[k] || 0) + from[k]; } return into; }
var events = { publish: function (type, payload) { __publish(String(type), JSON.stringify(payload === undefined ? null : payload)); } };
function exec(program, args) { return JSON.parse(__exec(String(program), JSON.stringify(args || []))); }
function __out(v) { var s = JSON.stringify(v); return s === undefined ? "null" : s; }
function __run_entry() {
  if (typeof setup === "function") { setup({ node: job.node }); }
  if (typeof run !== "function") { throw new Error("this job script defines no run(job) function"); }
  return __out(run(job));
}
function __map_entry(files) {
  if (typeof mapper !== "function") { throw new Error("this map/reduce script defines no mapper(files, emit) function"); }
  var pairs = [];
  mapper(files, function (k, v) { pairs.push([String(k), v === undefined ? null : v]); });
  return __out(pairs);
}
function __reduce_entry(groupsJson) {
  if (typeof reducer !== "function") { throw new Error("this map/reduce script defines no reducer(key, values) function"); }
  var g = JSON.parse(groupsJson);
  var keys = Object.keys(g);
  var out = {};
  for (var i = 0; i < keys.length; i++) {
    out[keys[i]] = reducer(keys[i], g[keys[i]]);
    if (i % 1000 === 0) { job.progress(i / keys.length); }
  }
  return __out(out);
}
"#;

/// Words as `tr -cs A-Za-z '\n'` cuts them: maximal runs of ASCII letters.
pub fn split_words(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    text.split(|b| !b.is_ascii_alphabetic()).filter(|w| !w.is_empty())
}

/// Each word's count, as a JSON object (keys in byte order).
pub fn count_words_json(text: &[u8]) -> String {
    let mut counts: std::collections::HashMap<&[u8], u64> = std::collections::HashMap::new();
    for w in split_words(text) {
        *counts.entry(w).or_default() += 1;
    }
    let mut keys: Vec<(&[u8], u64)> = counts.into_iter().collect();
    keys.sort_unstable();
    let map: serde_json::Map<String, Value> =
        keys.into_iter().map(|(k, n)| (String::from_utf8_lossy(k).into_owned(), Value::from(n))).collect();
    Value::Object(map).to_string()
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// Run `source` with `job` (the JSON the prelude turns into `job`) at `entry`.
pub fn run(
    source: &str,
    job: &Value,
    entry: Entry,
    host: Rc<dyn Host>,
    stop: Arc<AtomicBool>,
    limits: Limits,
) -> Ended {
    let rt = match Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return Ended::Failed(format!("could not start the script engine: {e}")),
    };
    rt.set_memory_limit(limits.memory_bytes);
    rt.set_max_stack_size(limits.stack_bytes);
    let stop2 = stop.clone();
    rt.set_interrupt_handler(Some(Box::new(move || stop2.load(Ordering::Relaxed))));
    let ctx = match Context::full(&rt) {
        Ok(c) => c,
        Err(e) => return Ended::Failed(format!("could not start the script engine: {e}")),
    };
    let memory_mib = limits.memory_bytes / (1024 * 1024);
    ctx.with(|ctx| {
        let result = (|| -> rquickjs::Result<String> {
            install(&ctx, job, host.clone(), stop.clone())?;
            ctx.eval::<(), _>(PRELUDE)?;
            ctx.eval::<(), _>(source)?;
            let g = ctx.globals();
            match &entry {
                Entry::Run => g.get::<_, Function>("__run_entry")?.call(()),
                Entry::Map { files } => g.get::<_, Function>("__map_entry")?.call((files.clone(),)),
                Entry::Reduce { groups } => g.get::<_, Function>("__reduce_entry")?.call((groups.as_str(),)),
            }
        })();
        match result {
            Ok(out) => Ended::Output(out),
            Err(rquickjs::Error::Exception) => {
                let thrown = ctx.catch();
                let msg = describe(&thrown);
                if stop.load(Ordering::Relaxed) || msg.contains("interrupted") {
                    Ended::Failed("job interrupted".into())
                } else if msg.contains("out of memory") {
                    Ended::Failed(format!("the script ran out of memory (limit {memory_mib} MiB)"))
                } else {
                    Ended::Failed(msg)
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if msg.contains("memory") || msg.contains("Allocation") {
                    Ended::Failed(format!("the script ran out of memory (limit {memory_mib} MiB)"))
                } else {
                    Ended::Failed(msg)
                }
            }
        }
    })
}

fn describe(v: &rquickjs::Value) -> String {
    if let Some(e) = v.as_exception() {
        let msg = e.message().unwrap_or_default();
        let stack = e.stack().unwrap_or_default();
        let first = stack.lines().find(|l| !l.trim().is_empty()).map(str::trim).unwrap_or("");
        return if first.is_empty() { msg } else { format!("{msg} ({first})") };
    }
    if let Some(s) = v.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if v.is_null() || v.is_undefined() {
        return "out of memory or interrupted".into();
    }
    format!("{v:?}")
}

/// The native half of the prelude.
fn install<'js>(ctx: &Ctx<'js>, job: &Value, host: Rc<dyn Host>, stop: Arc<AtomicBool>) -> rquickjs::Result<()> {
    let g: Object = ctx.globals();
    g.set("__job_json", job.to_string())?;
    let h = host.clone();
    g.set("__log", Function::new(ctx.clone(), move |m: String| h.log(&m))?)?;
    let h = host.clone();
    g.set("__progress", Function::new(ctx.clone(), move |p: f64| h.progress(p))?)?;
    g.set("__cancelled", Function::new(ctx.clone(), move || stop.load(Ordering::Relaxed))?)?;
    let h = host.clone();
    g.set(
        "__fs_read_text",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<String> {
            let b = h.read(&p).map_err(|e| Exception::throw_message(&ctx, &e))?;
            String::from_utf8(b).map_err(|_| Exception::throw_message(&ctx, &format!("{p} is not UTF-8 text")))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_read_bytes",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<TypedArray<'js, u8>> {
            let b = h.read(&p).map_err(|e| Exception::throw_message(&ctx, &e))?;
            TypedArray::new(ctx.clone(), b)
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_write_text",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String, t: String| -> rquickjs::Result<()> {
            h.write(&p, t.into_bytes()).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_write_bytes",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String, b: rquickjs::Value<'js>| -> rquickjs::Result<()> {
            let bytes = bytes_of(&b).ok_or_else(|| Exception::throw_message(&ctx, "writeBytes takes a Uint8Array"))?;
            h.write(&p, bytes).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_list",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<String> {
            h.list(&p).map(|v| v.to_string()).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_stat",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<String> {
            h.stat(&p)
                .map(|v| v.map(|v| v.to_string()).unwrap_or_default())
                .map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_count_words",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<String> {
            let b = h.read(&p).map_err(|e| Exception::throw_message(&ctx, &e))?;
            Ok(count_words_json(&b))
        })?,
    )?;
    let h = host.clone();
    g.set(
        "__fs_sha256",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<String> {
            let b = h.read(&p).map_err(|e| Exception::throw_message(&ctx, &e))?;
            Ok(sha256_hex(&b))
        })?,
    )?;
    g.set("__count_words", Function::new(ctx.clone(), |t: String| count_words_json(t.as_bytes()))?)?;
    g.set(
        "__words",
        Function::new(ctx.clone(), |t: String| {
            let w: Vec<Value> = split_words(t.as_bytes()).map(|w| Value::from(String::from_utf8_lossy(w))).collect();
            Value::Array(w).to_string()
        })?,
    )?;
    g.set("__sha256", Function::new(ctx.clone(), |t: String| sha256_hex(t.as_bytes()))?)?;
    let h = host.clone();
    g.set(
        "__publish",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, kind: String, payload: String| -> rquickjs::Result<()> {
            let v: Value = serde_json::from_str(&payload).unwrap_or(Value::Null);
            h.publish(&kind, v).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let h = host;
    g.set(
        "__exec",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, program: String, args: String| -> rquickjs::Result<String> {
            let args: Vec<String> = serde_json::from_str(&args)
                .map_err(|_| Exception::throw_message(&ctx, "exec takes a program and a list of strings"))?;
            h.exec(&program, args).map(|v| v.to_string()).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    Ok(())
}

fn bytes_of(v: &rquickjs::Value) -> Option<Vec<u8>> {
    if let Some(o) = v.as_object() {
        if let Some(t) = o.as_typed_array::<u8>() {
            return t.as_bytes().map(<[u8]>::to_vec);
        }
        if let Some(a) = o.as_array_buffer() {
            return a.as_bytes().map(<[u8]>::to_vec);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::time::{Duration, Instant};

    #[derive(Default)]
    struct TestHost {
        logs: RefCell<Vec<String>>,
        files: RefCell<std::collections::BTreeMap<String, Vec<u8>>>,
    }

    impl Host for TestHost {
        fn log(&self, line: &str) {
            self.logs.borrow_mut().push(line.to_string());
        }
        fn progress(&self, _p: f64) {}
        fn read(&self, path: &str) -> Result<Vec<u8>, String> {
            self.files.borrow().get(path).cloned().ok_or_else(|| format!("no file {path}"))
        }
        fn write(&self, path: &str, bytes: Vec<u8>) -> Result<(), String> {
            self.files.borrow_mut().insert(path.to_string(), bytes);
            Ok(())
        }
        fn list(&self, _path: &str) -> Result<Value, String> {
            Ok(serde_json::json!([]))
        }
        fn stat(&self, path: &str) -> Result<Option<Value>, String> {
            Ok(self.files.borrow().get(path).map(|b| serde_json::json!({"size": b.len()})))
        }
        fn publish(&self, _kind: &str, _payload: Value) -> Result<(), String> {
            Ok(())
        }
        fn exec(&self, program: &str, _args: Vec<String>) -> Result<Value, String> {
            Err(format!("exec of {program} is not allowed"))
        }
    }

    fn limits() -> Limits {
        Limits { memory_bytes: 32 << 20, stack_bytes: 512 << 10 }
    }

    fn go(src: &str, entry: Entry, host: Rc<TestHost>) -> Ended {
        let job = serde_json::json!({"id": "j1", "name": "t", "kind": "run", "args": {"n": 3}, "inputs": [], "node": "n1", "owner": "admin"});
        run(src, &job, entry, host, Arc::new(AtomicBool::new(false)), limits())
    }

    #[test]
    fn run_returns_json_and_logs() {
        let host = Rc::new(TestHost::default());
        let out = go(
            "function run(job) { job.log('hi ' + job.args.n); return {twice: job.args.n * 2}; }",
            Entry::Run,
            host.clone(),
        );
        assert_eq!(out, Ended::Output(r#"{"twice":6}"#.into()));
        assert_eq!(host.logs.borrow().as_slice(), ["hi 3"]);
        assert_eq!(go("function run(job) {}", Entry::Run, host.clone()), Ended::Output("null".into()));
    }

    #[test]
    fn a_script_without_run_and_a_throw_fail_clearly() {
        let host = Rc::new(TestHost::default());
        let Ended::Failed(e) = go("var x = 1;", Entry::Run, host.clone()) else { panic!() };
        assert!(e.contains("defines no run(job)"), "{e}");
        let Ended::Failed(e) = go("function run() { throw new Error('boom'); }", Entry::Run, host) else { panic!() };
        assert!(e.contains("boom"), "{e}");
    }

    #[test]
    /// The timeout is the core's (`a_run_over_its_timeout_is_stopped_and_the_job_fails`): it
    /// raises the same stop flag, which ends even an endless loop within a second.
    fn an_endless_loop_stops_on_its_stop_flag() {
        let host: Rc<dyn Host> = Rc::new(TestHost::default());
        let job = serde_json::json!({});
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            s2.store(true, Ordering::Relaxed);
        });
        let t0 = Instant::now();
        let out = run("function run() { for (;;) {} }", &job, Entry::Run, host, stop, limits());
        t.join().unwrap();
        assert!(matches!(out, Ended::Failed(ref e) if e.contains("interrupted")), "{out:?}");
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn memory_over_the_limit_fails_with_a_clear_error() {
        let host = Rc::new(TestHost::default());
        let out =
            go("function run() { var a = []; for (;;) { a.push(new Array(100000).fill(1)); } }", Entry::Run, host);
        assert!(matches!(out, Ended::Failed(ref e) if e.contains("out of memory")), "{out:?}");
    }

    #[test]
    fn fs_helpers_map_and_reduce() {
        let host = Rc::new(TestHost::default());
        host.files.borrow_mut().insert("cluster:/a.txt".into(), b"the cat the dog".to_vec());
        let src = r#"
            function mapper(files, emit) { files.forEach(function (f) { var c = fs.countWords(f); for (var w in c) emit(w, c[w]); }); }
            function reducer(key, values) { return values.reduce(function (a, b) { return a + b; }, 0); }
            function run(job) { fs.writeText("cluster:/out.txt", "x"); return [fs.exists("cluster:/out.txt"), fs.exists("cluster:/none"), sha256("abc")]; }
        "#;
        let out = go(src, Entry::Map { files: vec!["cluster:/a.txt".into()] }, host.clone());
        assert_eq!(out, Ended::Output(r#"[["cat",1],["dog",1],["the",2]]"#.into()));
        let out = go(src, Entry::Reduce { groups: r#"{"the":[2,3],"cat":[1]}"#.into() }, host.clone());
        assert_eq!(out, Ended::Output(r#"{"the":5,"cat":1}"#.into()));
        let Ended::Output(o) = go(src, Entry::Run, host) else { panic!() };
        assert!(o.starts_with("[true,false,\"ba7816bf"), "{o}");
    }

    #[test]
    fn words_split_as_tr_does() {
        let w: Vec<&[u8]> = split_words(b"It's a dog-eat-dog 42 world").collect();
        assert_eq!(w, [&b"It"[..], b"s", b"a", b"dog", b"eat", b"dog", b"world"]);
    }
}
