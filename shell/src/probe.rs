//! Capability detection and health sampling of the real host (spec: "capability/"): OS, arch,
//! cores, RAM, hostname, tools on PATH, CPU feature flags; CPU %, RAM and the disk holding the
//! data dir. Uses `sysinfo`; only [`crate::env::TokioEnv`] calls it, the simulator fakes it.

use shoal_core::records::{Capabilities, Health};
use shoal_core::Millis;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Tools whose presence on PATH is reported as a feature.
pub const TOOLS: &[&str] =
    &["ffmpeg", "ffprobe", "docker", "podman", "nvidia-smi", "python3", "node", "git", "rsync", "convert", "zstd"];

pub fn detect_capabilities(now: Millis) -> Capabilities {
    let mut features = BTreeMap::new();
    for tool in TOOLS {
        if on_path(tool).is_some() {
            features.insert((*tool).to_string(), true);
        }
    }
    for flag in cpu_flags() {
        features.insert(format!("cpu.{flag}"), true);
    }
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    Capabilities {
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        cpu_cores: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        total_ram: sys.total_memory(),
        hostname: sysinfo::System::host_name().unwrap_or_default(),
        features,
        detected_at: now.as_secs(),
        macs: interface_macs(Path::new("/sys/class/net")),
    }
}

/// The MAC addresses of the host's network interfaces (`/sys/class/net/*/address` on Linux;
/// loopback and all-zero ones left out), sorted, at most [`shoal_core::wake::MACS_MAX`].
pub fn interface_macs(root: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out: Vec<String> = dir
        .flatten()
        .filter(|e| e.file_name() != "lo")
        .filter_map(|e| std::fs::read_to_string(e.path().join("address")).ok())
        .filter_map(|a| shoal_core::wake::canonical_mac(a.trim()))
        .collect();
    out.sort();
    out.dedup();
    out.truncate(shoal_core::wake::MACS_MAX);
    out
}

/// The first executable called `name` on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

#[allow(unused_mut)]
fn cpu_flags() -> Vec<&'static str> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { out.push($f); } )* };
        }
        probe!("sse4.2", "avx", "avx2", "avx512f", "aes", "sha", "fma", "bmi2");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($f) { out.push($f); } )* };
        }
        probe!("neon", "aes", "sha2", "crc");
    }
    out
}

pub fn sample_health(sys: &mut sysinfo::System, data_dir: &Path, now: Millis) -> Health {
    sys.refresh_cpu_usage();
    sys.refresh_memory();
    let (disk_free, disk_total) = disk_of(data_dir);
    Health {
        cpu_usage: f64::from(sys.global_cpu_usage()).clamp(0.0, 100.0),
        ram_used: sys.used_memory(),
        ram_total: sys.total_memory(),
        disk_free,
        disk_total,
        uptime: sysinfo::System::uptime(),
        timestamp: now.0,
    }
}

/// Free and total bytes of the filesystem holding `dir` (the longest matching mount point).
pub fn disk_of(dir: &Path) -> (u64, u64) {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let disks = sysinfo::Disks::new_with_refreshed_list();
    disks
        .list()
        .iter()
        .filter(|d| dir.starts_with(d.mount_point()))
        .max_by_key(|d| d.mount_point().as_os_str().len())
        .map(|d| (d.available_space(), d.total_space()))
        .unwrap_or((0, 0))
}
