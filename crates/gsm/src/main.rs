//! `gsm`: the Gossamer command line.

mod demo;
mod package;
mod run;
mod state;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

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
    /// Start a rack: N ranks of one program on this machine, output prefixed with the rank.
    #[command(
        long_about = "Start a rack: N ranks of one program on this machine.\n\n\
            Each rank gets GSM_RANK, GSM_SIZE, GSM_COORD (a free loopback port), GSM_JOB and \
            GSM_SECRET (fresh for each job) and GSM_LOCAL_SIZE. Its output lines are printed \
            with the prefix `[rank] `. SIGINT and SIGTERM are forwarded to every rank. When a \
            rank fails, the others get GSM_PEER_TIMEOUT + 2 s to stop, then are killed. If gsm \
            itself is killed, even by SIGKILL, a guardian process kills every rank's process \
            group.\n\n\
            Exit status: 0 if every rank exited with 0, else that of the rank that caused the \
            failure (128 + signal if it was killed): a rank that failed on its own outranks \
            one that exited with 76 (it received a bad frame), which outranks one that exited \
            with 69 (it lost a peer), which outranks one that gsm killed after the grace \
            period; among equals, the first to end.",
        after_help = "Examples:\n  \
            gsm run -n 4 -- ./target/release/examples/hello\n  \
            GSM_PEER_TIMEOUT=1s gsm run -n 2 --workers 1 -- ./prog --flag value"
    )]
    Run(run::Options),
    /// Durable state, offline.
    #[command(subcommand)]
    State(state::Options),
    /// Code packages: make keys, build, sign, inspect and verify packages.
    #[command(subcommand)]
    Package(package::Options),
    /// Kills the ranks' process groups if `gsm run` dies (internal: started by `gsm run`).
    #[command(name = run::guardian::SUBCOMMAND, hide = true)]
    RunGuardian,
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Demo(options) => demo::run(&options).map(|()| ExitCode::SUCCESS),
        Command::Run(options) => match run::run(&options) {
            Ok(code) => Ok(code),
            Err(run::Error::Usage(message)) => usage_error("run", &message),
            Err(run::Error::Other(error)) => Err(error),
        },
        Command::State(options) => state::run(&options).map(|()| ExitCode::SUCCESS),
        Command::Package(options) => package::run(&options).map(|()| ExitCode::SUCCESS),
        Command::RunGuardian => Ok(run::guardian::serve()),
    }
}

/// Reports a usage mistake found after parsing as clap reports its own: the message, the
/// subcommand's usage line, and status 2.
fn usage_error(subcommand: &str, message: &str) -> ! {
    let mut cli = Cli::command();
    cli.build();
    let mut command = match cli.find_subcommand(subcommand) {
        Some(sub) => sub.clone(),
        None => cli,
    };
    command.error(ErrorKind::ValueValidation, message).exit()
}
