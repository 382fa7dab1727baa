//! `gsm`: the Gossamer command line.

mod demo;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gsm",
    version,
    about = "Gossamer: delegation-based concurrency"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare a delegated counter with mutexes on this machine (fetch-and-add).
    Demo(demo::Options),
    /// Run the comparison benchmarks (`gsm bench --list` lists them).
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for the benchmark suite.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Demo(options) => demo::run(&options),
        Command::Bench { args } => bench::cli(&args),
    }
}
