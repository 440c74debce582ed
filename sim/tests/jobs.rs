//! Simulation of jobs under faults (issue 14 "Tests and simulation"): the real shell and core of
//! every node in turmoil, the simulator's job engine. Two seeds here (one with skewed clocks);
//! `cargo run --release -p shoal-sim -- --jobs --seeds N` sweeps more; `SEED=n` replays one.
//!
//! Each run (`shoal_sim::jobs_run`): crashes (the leader's among them), partitions and held
//! links while a dozen jobs, a word count map/reduce over 150 files and a cancelled job run.
//! Checked: no job ever runs on two live nodes at once; an end once seen never changes and no
//! two nodes see different ends; every job ends; the plain jobs succeed (requeued when their
//! node went down); the cancelled one ends cancelled and runs nowhere; the word count equals
//! counting the files directly.

fn seed_from_env(default: u64) -> u64 {
    std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn jobs_under_faults_end_once_and_the_word_count_is_right() {
    let seed = seed_from_env(14);
    shoal_sim::run_jobs_seed(seed).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn jobs_under_faults_with_skewed_clocks() {
    let seed = seed_from_env(15);
    shoal_sim::run_jobs_seed(seed).unwrap_or_else(|e| panic!("{e}"));
}
