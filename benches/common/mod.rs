//! Helpers shared by the benches that start real `shoal serve` processes.

use std::net::TcpListener;
use std::process::Child;

/// Child processes killed (and reaped) when dropped, however the bench ends.
pub struct Kill(pub Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A free port on 127.0.0.1.
pub fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
