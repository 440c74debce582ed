//! The `shoal` binary: parse the command line and hand it to the shell.

use clap::Parser;

fn main() {
    shoal_shell::alloc::tune_for_streaming();
    let cli = shoal_shell::cli::Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
