//! Starting a real `shoal serve` on a port the test picked, and knowing that what answers on
//! that port is the process just started.
//!
//! A port from `bind(127.0.0.1:0)` is free only until it is dropped: a test running beside this
//! one may pick the same port and start its own node there first. Waiting for the port to accept
//! a connection would then find the other test's node, and every call with this node's admin
//! token would fail with a 401. So the wait here asks two things of the process itself: it is
//! still running, and it has written its own listening URL (`api.url` in its data dir, written
//! only once it holds the port) naming this port.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Forget the listening URL a previous run of the node in `dir` left; returns whether there was
/// one (the node has run before, so its port is part of its identity and must not change).
pub fn forget_url(dir: &Path) -> bool {
    std::fs::remove_file(dir.join("api.url")).is_ok()
}

/// Wait until `child`, started with its data in `dir` and told to listen on `port`, holds that
/// port. `false` when the process ended first (most likely the port was taken meanwhile).
pub fn holds_port(child: &mut Child, dir: &Path, port: u16, limit: Duration) -> bool {
    let start = Instant::now();
    let suffix = format!(":{port}");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("shoal serve on port {port} ended before it listened ({status})");
            return false;
        }
        let url = std::fs::read_to_string(dir.join("api.url")).unwrap_or_default();
        if url.trim_end().ends_with(&suffix) && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        assert!(start.elapsed() < limit, "shoal serve on port {port} did not listen within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Start the node whose data is in `dir` with `spawn(port)`, until it holds its port. A first
/// start whose port was taken meanwhile moves `port` to another (5 tries); a restart keeps its
/// port (the node's address is part of what the cluster knows of it) and fails if it cannot.
pub fn serve(dir: &Path, port: &mut u16, limit: Duration, mut spawn: impl FnMut(u16) -> Child) -> Child {
    let restart = forget_url(dir);
    for _ in 0..5 {
        let mut child = spawn(*port);
        if holds_port(&mut child, dir, *port, limit) {
            return child;
        }
        assert!(!restart, "the node could not listen on its port {port} again");
        *port = free_port();
    }
    panic!("shoal serve did not start on any of 5 ports");
}
