//! The simulated environment: turmoil's TCP, a per-node wall clock with offset and drift, and a
//! fixed host probe. This is the only place turmoil meets the shell.

use shoal_core::records::{Capabilities, Health};
use shoal_core::{Millis, SeededRng};
use shoal_shell::env::{Clock, Net, Probe};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Wall-clock time of the simulation's start, unix ms (2096-10-02). Files on disk keep the
/// host's real times (mtime, ctime), which a rescan compares with times the simulated nodes
/// stamped (when a copy was last checked, when a path was removed). The epoch is set far ahead
/// of any real file time so that every file reads as older than anything a node stamped, the
/// same way in every run: a seed replays whatever the date. (It was 2027-01-15, after which
/// real file times would have turned newer than the simulated stamps and changed what rescans
/// decide in the middle of runs.)
pub const SIM_EPOCH_MS: u64 = 4_000_000_000_000;

/// How one node's clock is off: a fixed offset and a drift rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockFault {
    pub offset_ms: i64,
    /// Parts per million; +200 runs 0.02 % fast.
    pub drift_ppm: i64,
}

#[derive(Clone)]
pub struct SimEnv {
    clock: Arc<Mutex<ClockFault>>,
    /// Simulated ms elapsed, kept by the harness for reads from outside a host.
    sim_ms: Arc<AtomicU64>,
    seeds: Arc<Mutex<SeededRng>>,
    /// (free, total) bytes every volume folder of this node reports (the full-disk fault).
    disk: Arc<Mutex<(u64, u64)>>,
}

/// What a volume of a simulated node reports unless a fault says otherwise.
pub const DISK_DEFAULT: (u64, u64) = (50 << 30, 100 << 30);

impl SimEnv {
    pub fn new(clock: Arc<Mutex<ClockFault>>, sim_ms: Arc<AtomicU64>, seed: u64) -> SimEnv {
        SimEnv::with_disk(clock, sim_ms, seed, Arc::new(Mutex::new(DISK_DEFAULT)))
    }

    pub fn with_disk(
        clock: Arc<Mutex<ClockFault>>,
        sim_ms: Arc<AtomicU64>,
        seed: u64,
        disk: Arc<Mutex<(u64, u64)>>,
    ) -> SimEnv {
        SimEnv { clock, sim_ms, seeds: Arc::new(Mutex::new(SeededRng::new(seed))), disk }
    }
}

/// The wall clock of a node whose clock is `fault` after `elapsed_ms` of simulated time.
pub fn node_clock(fault: ClockFault, elapsed_ms: u64) -> Millis {
    let drifted = elapsed_ms as i64 + (elapsed_ms as i64 * fault.drift_ppm) / 1_000_000;
    Millis((SIM_EPOCH_MS as i64 + drifted + fault.offset_ms).max(0) as u64)
}

impl SimEnv {
    fn elapsed_ms(&self) -> u64 {
        turmoil::sim_elapsed().map(|d| d.as_millis() as u64).unwrap_or_else(|| self.sim_ms.load(Ordering::SeqCst))
    }
}

impl Clock for SimEnv {
    fn now(&self) -> Millis {
        let fault = *self.clock.lock().unwrap_or_else(|p| p.into_inner());
        node_clock(fault, self.elapsed_ms())
    }

    /// Drifts with the node's clock, but offsets and steps do not touch it.
    fn monotonic(&self) -> Millis {
        let fault = *self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = self.elapsed_ms() as i64;
        Millis((elapsed + elapsed * fault.drift_ppm / 1_000_000).max(0) as u64)
    }
}

impl Probe for SimEnv {
    fn capabilities(&self, _data_dir: &Path, now: Millis) -> Capabilities {
        Capabilities {
            os: "linux".into(),
            arch: "x86_64".into(),
            cpu_cores: 4,
            total_ram: 8 << 30,
            hostname: "sim".into(),
            features: Default::default(),
            detected_at: now.as_secs(),
            macs: Vec::new(),
        }
    }

    fn health(&self, _data_dir: &Path, now: Millis) -> Health {
        Health {
            cpu_usage: 10.0,
            ram_used: 2 << 30,
            ram_total: 8 << 30,
            disk_free: 50 << 30,
            disk_total: 100 << 30,
            uptime: 0,
            timestamp: now.0,
        }
    }

    fn disk_usage(&self, _path: &Path) -> (u64, u64) {
        *self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seed(&self) -> u64 {
        self.seeds.lock().unwrap_or_else(|p| p.into_inner()).next_u64()
    }
}

pub struct SimListener(turmoil::net::TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok(pair) => return pair,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl Net for SimEnv {
    type Stream = turmoil::net::TcpStream;
    type Listener = SimListener;
    type Addr = SocketAddr;

    async fn connect(&self, host_port: String) -> io::Result<Self::Stream> {
        turmoil::net::TcpStream::connect(host_port.as_str()).await
    }

    async fn bind(&self, host_port: String) -> io::Result<Self::Listener> {
        Ok(SimListener(turmoil::net::TcpListener::bind(host_port.as_str()).await?))
    }

    /// The simulated network has no LAN to broadcast on: nothing is sent.
    fn broadcast(&self, _datagram: &[u8], _port: u16) -> io::Result<()> {
        Ok(())
    }
}
