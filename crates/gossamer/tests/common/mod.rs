//! The driver shared by this crate's `harness = false` tests (each is its own `main`, since a
//! test process also plays the ranks it starts).

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::process::{Child, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

pub(crate) mod demo_package;
pub(crate) mod job;

/// The test-name filters on the command line (`cargo test -- NAME`); flags are ignored.
pub(crate) fn filters() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect()
}

/// Whether `name` is selected: no filters, or one of them is part of it.
pub(crate) fn selected(filters: &[String], name: &str) -> bool {
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// Runs one test, printing `test NAME ... ok (1.2 s)` or `FAILED`; whether it passed.
pub(crate) fn run_one(name: &str, test: fn()) -> bool {
    let started = Instant::now();
    let passed = std::panic::catch_unwind(test).is_ok();
    println!(
        "test {name} ... {} ({:.1} s)",
        if passed { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    passed
}

/// Prints the closing line `SUITE: N passed, M failed` and turns it into the exit status.
pub(crate) fn conclude(suite: &str, passed: usize, failed: usize) -> ExitCode {
    println!("{suite}: {passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs the selected tests of `tests` and concludes.
pub(crate) fn run_all(suite: &str, tests: &[(&str, fn())]) -> ExitCode {
    conclude_after(suite, (0, 0), tests)
}

/// Runs the selected tests of `tests` and concludes, counting `before` (passed, failed) too.
pub(crate) fn conclude_after(
    suite: &str,
    before: (usize, usize),
    tests: &[(&str, fn())],
) -> ExitCode {
    let filters = filters();
    let (mut passed, mut failed) = before;
    for &(name, test) in tests.iter().filter(|(name, _)| selected(&filters, name)) {
        if run_one(name, test) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    conclude(suite, passed, failed)
}

/// Waits for every child, at most `limit` in all; returns each one's status and output.
/// A child still running at the deadline is killed and the test fails, naming `what`.
pub(crate) fn finish(
    children: Vec<Child>,
    limit: Duration,
    what: &str,
) -> Vec<(ExitStatus, String, String)> {
    let deadline = Instant::now() + limit;
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut out = Vec::new();
    for rank in 0..children.len() {
        let mut child = children[rank].take().unwrap();
        loop {
            if child.try_wait().unwrap().is_some() {
                let output = child.wait_with_output().unwrap();
                out.push((
                    output.status,
                    String::from_utf8_lossy(&output.stdout).into_owned(),
                    String::from_utf8_lossy(&output.stderr).into_owned(),
                ));
                break;
            }
            if Instant::now() > deadline {
                child.kill().ok();
                let output = child.wait_with_output().unwrap();
                for other in children.iter_mut().flatten() {
                    other.kill().ok();
                    other.wait().ok();
                }
                panic!(
                    "{what}: rank {rank} still running after {limit:?}; its stderr:\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    out
}

/// The panic message of `f`, which must panic.
pub(crate) fn panic_of<R>(f: impl FnOnce() -> R) -> String {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(_) => panic!("expected a panic"),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    }
}

/// Every rank of a job exited with success, and rank 0 printed `rank0_says`.
pub(crate) fn all_succeed(results: &[(ExitStatus, String, String)], rank0_says: &str) {
    let all: String = results.iter().map(|r| r.2.clone()).collect();
    for (rank, (status, stdout, _)) in results.iter().enumerate() {
        assert!(status.success(), "rank {rank} {status}; stderr:\n{all}");
        if rank == 0 {
            assert!(stdout.contains(rank0_says), "{stdout}\nstderr:\n{all}");
        }
    }
}
