//! `gsm`: the Gossamer command line.
//!
//! # Layers
//!
//! `demo`, `state` and `package` stand alone. `metrics` reads the ranks' counters and `jobs`
//! finds the jobs `gsm run` runs here; `top` shows them (`gsm top`). `run` starts ranks on this machine (`run::guardian`
//! kills them if gsm dies); `cluster` holds what the cluster's commands share (the key, the
//! host list, connections to daemons) and `gsm ps`, `gsm kill`, `gsm cluster-key`; `run::hosts`
//! (`gsm run --hosts`) builds on `run` and `cluster`, and `daemon` on both.

mod cluster;
mod daemon;
mod demo;
mod jobs;
mod metrics;
mod package;
mod run;
mod state;
mod top;

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
    /// Start a rack: N ranks of one program on this machine (or, with --hosts, through the
    /// daemons of some hosts), output prefixed with the rank.
    #[command(
        long_about = "Start a rack: N ranks of one program on this machine, or with --hosts \
            through the daemons (`gsm daemon`) of those hosts.\n\n\
            Each rank gets GSM_RANK, GSM_SIZE, GSM_COORD (a free loopback port), GSM_JOB and \
            GSM_SECRET (fresh for each job), GSM_LOCAL_SIZE and GSM_STATS_DIR (the job's \
            directory, where it says where it serves its counters for `gsm top`, and leaves \
            them for --stats when it ends). Its output lines are printed \
            with the prefix `[rank] `. SIGINT and SIGTERM are forwarded to every rank. When a \
            rank fails, the others get GSM_PEER_TIMEOUT + 2 s to stop, then are killed. If gsm \
            itself is killed, even by SIGKILL, a guardian process kills every rank's process \
            group.\n\n\
            With --hosts, GSM_COORD is on rank 0's host, GSM_LOCAL_SIZE counts the ranks on \
            each host, the ranks also get gsm's other GSM_* and its UCX_* settings, and a host whose daemon \
            is silent for GSM_PEER_TIMEOUT is lost: its ranks fail with it (status 69), named \
            with their host.\n\n\
            Exit status: 0 if every rank exited with 0, else that of the rank that caused the \
            failure (128 + signal if it was killed): a rank that failed on its own outranks \
            one that repeated rank 0's status (a rack ends every rank with rank 0's status), \
            which outranks one lost with its host, then one that exited with 76 (it received \
            a bad frame), then one that exited with 69 (it lost a peer), then one that ended \
            after gsm forwarded SIGINT or SIGTERM (reported as \"stopped by SIGTERM\"), then \
            one that exited with 69 after that (a peer died of the signal first), then \
            one that gsm killed after the grace period; among equals, the first to end.",
        after_help = "Examples:\n  \
            gsm run -n 4 -- ./target/release/examples/hello\n  \
            gsm run --hosts a,b,c -n 6 -- ./target/release/examples/rack\n  \
            GSM_STATE_DIR=/mnt/shared/state gsm run --hosts a,b,c --spare-hosts d --recover \
            --shared-state -n 6 -- ./target/release/examples/ledger 20000\n  \
            GSM_PEER_TIMEOUT=1s gsm run -n 2 --workers 1 -- ./prog --flag value"
    )]
    Run(run::Options),
    /// Watch a job started by `gsm run` on this machine: workers, property types, hottest
    /// properties and links, refreshed every second.
    #[command(
        long_about = "Watch a job started by `gsm run` on this machine: per rank and worker its \
            busy share, requests per second, mean batch, fibers and properties; the busiest \
            property types and properties (estimated from sampled batches); each rank's link \
            traffic. Refreshed every --interval-ms; q, Esc or Ctrl-C quits.\n\n\
            Each rank started by `gsm run` serves its counters in Prometheus' text format on a \
            loopback port of its own (or where GSM_METRICS says), and says which in the job's \
            directory under $XDG_RUNTIME_DIR/gsm (else /tmp/gsm-<uid>). With --metrics, gsm top \
            watches ranks at the addresses given instead: a job started with --hosts, mpirun \
            or srun whose ranks serve their counters on GSM_METRICS.",
        after_help = "Examples:\n  \
            gsm top                  # the only job running\n  \
            gsm top 3fa9             # the job whose id starts with 3fa9\n  \
            gsm top --once           # print one screen and exit\n  \
            gsm top --metrics a:9100,b:9101   # ranks started with GSM_METRICS=<host>:9100"
    )]
    Top(top::Options),
    /// The per-host daemon that starts ranks for `gsm run --hosts` (runs in the foreground).
    #[command(
        long_about = "The per-host daemon that starts ranks for `gsm run --hosts`; it runs in \
            the foreground, for a service manager or a terminal.\n\n\
            Every connection must prove it holds the cluster key (--key, mode 0600). Whoever \
            holds that key can run any program on this host as the daemon's user: keep it as \
            private as an SSH key, and run the daemon as an unprivileged user. Programs a \
            client sends are kept by their SHA-256 in --store. Stopping the daemon, even by \
            SIGKILL, kills the ranks it started.",
        after_help = "Examples:\n  \
            gsm cluster-key                      # once; copy ~/.gossamer/cluster.key to every host\n  \
            gsm daemon --listen 0.0.0.0:7420\n  \
            gsm run --hosts a,b,c -n 6 -- ./target/release/examples/rack"
    )]
    Daemon(daemon::Options),
    /// List the jobs the daemons of some hosts run.
    Ps(cluster::PsOptions),
    /// Kill a job's ranks on some hosts; its `gsm run` then ends the job.
    Kill(cluster::KillOptions),
    /// Write a fresh cluster key (mode 0600) for `gsm daemon` and `gsm run --hosts`.
    ClusterKey(cluster::KeyOptions),
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
        Command::Top(options) => top::run(&options).map(|()| ExitCode::SUCCESS),
        Command::Daemon(options) => daemon::serve(&options).map(|()| ExitCode::SUCCESS),
        Command::Ps(options) => cluster::ps(&options).map(|()| ExitCode::SUCCESS),
        Command::Kill(options) => cluster::kill(&options).map(|()| ExitCode::SUCCESS),
        Command::ClusterKey(options) => cluster::make_key(&options).map(|()| ExitCode::SUCCESS),
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
