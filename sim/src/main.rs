//! `cargo run -p shoal-sim -- --seeds 1000 [--from S] [--drive [--big N] [--chaos-ms MS] [--nat K] [--overwrites] [--races] | --config | --jobs]`:
//! a long seed sweep (membership and metadata; with `--drive` the cluster drive, one write in N
//! over 4 MiB, faults for MS simulated milliseconds, the last K nodes behind NAT; with `--config` a rolling upgrade of the
//! configuration plane under faults; with `--jobs` jobs and a word count map/reduce under faults).
//! `SEED=n` runs one.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<u64>().ok())
    };
    let (from, count) = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => (seed, 1),
        None => (arg("--from").unwrap_or(1), arg("--seeds").unwrap_or(100)),
    };
    let drive = args.iter().any(|a| a == "--drive");
    let config = args.iter().any(|a| a == "--config");
    let jobs = args.iter().any(|a| a == "--jobs");
    let mut opts = shoal_sim::DriveOptions { big_every: arg("--big").unwrap_or(0), ..Default::default() };
    if let Some(ms) = arg("--chaos-ms") {
        opts.chaos_ms = ms;
    }
    if let Some(nat) = arg("--nat") {
        opts.nat = nat as usize;
    }
    opts.overwrites = args.iter().any(|a| a == "--overwrites");
    opts.races = args.iter().any(|a| a == "--races");
    let started = Instant::now();
    let mut failed = 0u64;
    for seed in from..from + count {
        let run = if drive {
            shoal_sim::run_drive_seed_with(seed, &opts)
        } else if config {
            shoal_sim::run_config_seed(seed)
        } else if jobs {
            shoal_sim::run_jobs_seed(seed)
        } else {
            shoal_sim::run_seed(seed)
        };
        match run {
            Ok(r) => println!(
                "seed {seed}: ok, {} faults, {} s simulated, digest {}",
                r.faults,
                r.sim_ms / 1000,
                &r.digest[..16]
            ),
            Err(e) => {
                failed += 1;
                println!("{e}");
            }
        }
    }
    println!("{} passed, {failed} failed ({:.1} s)", count - failed, started.elapsed().as_secs_f64());
    if failed > 0 {
        std::process::exit(1);
    }
}
