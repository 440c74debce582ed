//! The loopback harness shared by the multi-process tests: real `shoal serve` processes on
//! ports picked here, the CLI run as a person would (with stdin and env), raw HTTP calls with
//! any token. Each test file uses what it needs.
#![allow(dead_code)]

#[path = "../started/mod.rs"]
mod started;

use serde_json::Value;
pub use started::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_shoal");

pub struct Node {
    pub dir: PathBuf,
    pub port: u16,
    pub child: Option<Child>,
    /// Flags `serve` gets beside `--data` and `--listen`.
    pub args: Vec<String>,
}

/// An answer: status, headers (lowercase names), JSON body (`Null` when not JSON).
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Node {
    pub fn new(dir: PathBuf) -> Node {
        Node { dir, port: free_port(), child: None, args: Vec::new() }
    }

    /// Its URL: `https://` when it was told to serve TLS.
    pub fn url(&self) -> String {
        let scheme = if self.args.iter().any(|a| a.starts_with("--tls")) { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Start `shoal serve`; its log goes to `DIR.log` (level `SHOAL_TEST_LOG`, default warn).
    pub fn start(&mut self) {
        self.child = Some(started::serve(&self.dir, &mut self.port, Duration::from_secs(30), |port| {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.with_extension("log"))
                .expect("the node's log file");
            Command::new(BIN)
                .args(["serve", "--data"])
                .arg(&self.dir)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--heartbeat-ms", "300", "--online-within-ms", "1500", "--unknown-within-ms", "4000"])
                .args(&self.args)
                .env("SHOAL_LOG", std::env::var("SHOAL_TEST_LOG").unwrap_or_else(|_| "warn".into()))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start shoal serve")
        }));
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.dir.join("admin.token")).unwrap().trim().to_string()
    }

    /// One request with `token` (none when empty) and extra header lines.
    pub fn call_as(
        &self,
        token: &str,
        method: &str,
        target: &str,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let none = Answer { status: 0, headers: Vec::new(), body: Value::Null };
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return none };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!("{method} {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
        if !token.is_empty() {
            head.push_str(&format!("authorization: Bearer {token}\r\n"));
        }
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let req = format!("{head}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        if s.write_all(req.as_bytes()).is_err() {
            return none;
        }
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else { return none };
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let headers = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Answer { status, headers, body: serde_json::from_str(body).unwrap_or(Value::Null) }
    }

    /// One request with the admin token.
    pub fn call(&self, method: &str, target: &str, body: Option<&Value>) -> Answer {
        self.call_as(&self.token(), method, target, body, &[])
    }

    /// The CLI against this node: (success, stdout, stderr). `data`: pass `--data` (the admin
    /// token's dir); `stdin`: what it reads; `env`: extra variables.
    pub fn cli_with(&self, args: &[&str], data: bool, stdin: &str, env: &[(&str, &str)]) -> (bool, String, String) {
        let mut cmd = Command::new(BIN);
        if data {
            cmd.arg("--data").arg(&self.dir);
        } else {
            cmd.args(["--data", "/nonexistent-shoal-data"]);
        }
        cmd.args(["--api", &self.url()]).args(args).env_remove("SHOAL_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run shoal");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The CLI with the admin token and `--json`, which must succeed.
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (ok, out, err) = self.cli_with(&all, true, "", &[]);
        assert!(ok, "shoal {args:?}: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("shoal {args:?}: {e}: {out}"))
    }
}

pub struct Nodes(pub Vec<Node>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &mut self.0 {
            n.kill();
        }
    }
}

pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}
