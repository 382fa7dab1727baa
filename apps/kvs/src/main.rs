//! kvs: a memcached-compatible key-value server.
//!
//! `kvs -p 11211 -t 4 -m 64` serves memcached's text protocol. See `kvs --help`.

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
    match kvs::server::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvs: {e}");
            ExitCode::from(71)
        }
    }
}
