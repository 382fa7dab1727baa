//! kvs: a memcached-compatible key-value server.
//!
//! `kvs -p 11211 -t 4 -m 64` serves memcached's text protocol. See `kvs --help`. Started by a
//! launcher (`gsm run -n 4 -- kvs`, `mpirun`, `srun`) it is a rack job: one table across
//! every rank, each rank serving on its own port (see `kvs::rack`).

use std::process::ExitCode;

use kvs::config::{Command, parse_args, usage};

fn main() -> ExitCode {
    let cfg = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(cfg)) => cfg,
        Ok(Command::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("kvs {}", kvs::protocol::VERSION);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kvs: {e}");
            return ExitCode::from(64);
        }
    };
    let settings = match gossamer::env::Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvs: {e}");
            return ExitCode::from(gossamer::EXIT_SETUP);
        }
    };
    let served = if settings.launcher == gossamer::env::Launcher::None {
        kvs::server::run(cfg).map(|()| 0)
    } else {
        kvs::rack::run(cfg, settings)
    };
    match served {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kvs: {e}");
            ExitCode::from(71)
        }
    }
}
