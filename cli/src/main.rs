//! The `casebatch` binary: parses flags, calls the library crates, renders output, and maps
//! errors to the documented exit codes (`exit.rs`). No engine logic lives here.

/// `println!` that treats a closed stdout (`casebatch ... | head`) as the end of output
/// instead of a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod commands;
mod render;

use casebatch_cli::{cli, exit, logs, manual};

use clap::FromArgMatches;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // The derived command, with the exit codes after every command's help.
    let matches = manual::command().get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    logs::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: failed to start the async runtime: {e}");
            return std::process::ExitCode::from(exit::Exit::Engine as u8);
        }
    };
    let code = match runtime.block_on(commands::dispatch(cli.command)) {
        Ok(exit) => exit,
        Err(e) if logs::json() => {
            tracing::error!(exit = e.exit as u8, "{e}");
            e.exit
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit
        }
    };
    std::process::ExitCode::from(code as u8)
}
