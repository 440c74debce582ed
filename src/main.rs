//! The `shoal` binary: parse the command line and hand it to the shell.

use clap::Parser;

/// jemalloc for every command of the binary (issue 18). Side by side with glibc's allocator
/// (tuned with a 16 MiB mmap threshold and 2 arenas until then), alternating runs on this
/// 2-core machine: `durable` writes from 16 clients used ~12 % less CPU per write and ran ~11 %
/// faster, small-file puts with 1 copy 944 -> 750 µs of node CPU per file, big files and one
/// client unchanged, idle RSS 19.6 -> 21.9 MiB and peak RSS moving 1 GiB 59 -> 67 MiB
/// (BENCHMARKS.md, issue 18, thirteenth session). Pieces of up to 16 MiB (hyper's buffers,
/// chunks, reads) are reused from jemalloc's size classes without an `mmap` and page faults
/// per piece, which is what the glibc tuning was for.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = shoal_shell::cli::Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // `serve --threads N`: the node's worker threads (tokio's default is one per core).
    if let shoal_shell::cli::Cmd::Serve(args) = &cli.cmd {
        if let Some(n) = args.threads {
            builder.worker_threads(usize::from(n));
        }
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(shoal_shell::cli::run(cli)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
