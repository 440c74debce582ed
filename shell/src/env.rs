//! The environment a node runs in: network, clock and host probe.
//!
//! The shell is generic over [`Env`] so the very same node code runs on real sockets
//! ([`TokioEnv`]) and inside the turmoil simulator (`shoal-sim` implements `Env` there). This
//! crate never depends on turmoil.

use shoal_core::records::{Capabilities, Health};
use shoal_core::Millis;
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};

/// Streams in and out.
pub trait Net: Clone + Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    type Listener: axum::serve::Listener<Io = Self::Stream, Addr = Self::Addr>;
    type Addr: Send + std::fmt::Debug + 'static;

    /// Open a stream to `host:port`.
    fn connect(&self, host_port: String) -> impl Future<Output = io::Result<Self::Stream>> + Send;
    /// Listen on `host:port`.
    fn bind(&self, host_port: String) -> impl Future<Output = io::Result<Self::Listener>> + Send;
    /// Broadcast one UDP datagram on the local network (Wake-on-LAN).
    fn broadcast(&self, datagram: &[u8], port: u16) -> io::Result<()>;
}

/// The node's clocks. The core is handed time from here and nowhere else.
pub trait Clock: Clone + Send + Sync + 'static {
    /// Wall clock, unix ms (signatures, versions, tokens).
    fn now(&self) -> Millis;
    /// A monotonic clock with any origin (liveness, leases, timers); never steps.
    fn monotonic(&self) -> Millis;
}

/// What the host offers and how it is doing, plus the seed of the node's RNG.
pub trait Probe: Clone + Send + Sync + 'static {
    fn capabilities(&self, data_dir: &Path, now: Millis) -> Capabilities;
    fn health(&self, data_dir: &Path, now: Millis) -> Health;
    /// Free and total bytes of the filesystem holding `path`.
    fn disk_usage(&self, path: &Path) -> (u64, u64);
    /// A fresh random seed (OS randomness in production, derived from the run seed in simulation).
    fn seed(&self) -> u64;
}

pub trait Env: Net + Clock + Probe {}
impl<T: Net + Clock + Probe> Env for T {}

/// Real sockets, the system clock and sysinfo.
#[derive(Clone, Default)]
pub struct TokioEnv {
    sys: Arc<Mutex<Option<sysinfo::System>>>,
}

impl Net for TokioEnv {
    type Stream = tokio::net::TcpStream;
    type Listener = axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)>;
    type Addr = std::net::SocketAddr;

    async fn connect(&self, host_port: String) -> io::Result<Self::Stream> {
        // Every address a name resolves to passes the core's rule (no link-local or
        // unspecified target), so a DNS name cannot lead where a URL may not (issue 11).
        let addrs: Vec<std::net::SocketAddr> =
            tokio::net::lookup_host(&host_port).await?.filter(|a| shoal_core::token::ip_allowed(a.ip())).collect();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{host_port} resolves to no address shoal may connect to (link-local or unspecified)"),
            ));
        }
        let s = tokio::net::TcpStream::connect(&addrs[..]).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    async fn bind(&self, host_port: String) -> io::Result<Self::Listener> {
        use axum::serve::ListenerExt;
        // Answers go out as soon as they are written, as requests do (`connect`): a response
        // written in two parts must not wait for the client's delayed acknowledgement.
        let nodelay: fn(&mut tokio::net::TcpStream) = |s| {
            let _ = s.set_nodelay(true);
        };
        Ok(tokio::net::TcpListener::bind(host_port).await?.tap_io(nodelay))
    }

    fn broadcast(&self, datagram: &[u8], port: u16) -> io::Result<()> {
        let socket = std::net::UdpSocket::bind(("0.0.0.0", 0))?;
        socket.set_broadcast(true)?;
        socket.send_to(datagram, (std::net::Ipv4Addr::BROADCAST, port))?;
        Ok(())
    }
}

impl Clock for TokioEnv {
    fn now(&self) -> Millis {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Millis(d.as_millis() as u64)
    }

    fn monotonic(&self) -> Millis {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let origin = ORIGIN.get_or_init(std::time::Instant::now);
        Millis(origin.elapsed().as_millis() as u64)
    }
}

impl Probe for TokioEnv {
    fn capabilities(&self, _data_dir: &Path, now: Millis) -> Capabilities {
        crate::probe::detect_capabilities(now)
    }

    fn health(&self, data_dir: &Path, now: Millis) -> Health {
        let mut guard = self.sys.lock().unwrap_or_else(|p| p.into_inner());
        let sys = guard.get_or_insert_with(sysinfo::System::new);
        crate::probe::sample_health(sys, data_dir, now)
    }

    fn disk_usage(&self, path: &Path) -> (u64, u64) {
        crate::probe::disk_of(path)
    }

    fn seed(&self) -> u64 {
        use rand_core::RngCore;
        rand_core::OsRng.next_u64()
    }
}
