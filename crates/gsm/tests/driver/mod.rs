//! The loop of this crate's own test drivers (`harness = false`: their binaries are also the
//! rank programs of the jobs they start): runs the tests whose names contain the first
//! argument that is not an option, each caught apart, and ends with the line cargo reads.

use std::process::ExitCode;
use std::time::Instant;

pub(crate) fn run(tests: &[(&str, fn())]) -> ExitCode {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(test);
        let took = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => println!("test {name} ... ok ({took:.1} s)"),
            Err(_) => {
                println!("test {name} ... FAILED ({took:.1} s)");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        println!("\ntest result: FAILED. {failed} failed");
        return ExitCode::FAILURE;
    }
    println!("\ntest result: ok");
    ExitCode::SUCCESS
}
