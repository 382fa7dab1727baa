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
///
/// The children's pipes are read while they run: a child that fills a pipe nobody reads
/// (64 KiB: a few panics' backtraces through `mpirun`) blocks and never exits.
pub(crate) fn finish(
    children: Vec<Child>,
    limit: Duration,
    what: &str,
) -> Vec<(ExitStatus, String, String)> {
    let deadline = Instant::now() + limit;
    let mut running: Vec<(Child, Drained, Drained)> = children
        .into_iter()
        .map(|mut c| {
            let (stdout, stderr) = (drain(c.stdout.take()), drain(c.stderr.take()));
            (c, stdout, stderr)
        })
        .collect();
    let mut out = Vec::new();
    for rank in 0..running.len() {
        loop {
            if let Some(status) = running[rank].0.try_wait().unwrap() {
                let (_, stdout, stderr) = &running[rank];
                out.push((status, stdout.all(), stderr.all()));
                break;
            }
            if Instant::now() > deadline {
                for (child, _, _) in running.iter_mut() {
                    child.kill().ok();
                    child.wait().ok();
                }
                panic!(
                    "{what}: rank {rank} still running after {limit:?}; its stderr:\n{}",
                    running[rank].2.so_far()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    out
}

/// A child's pipe, read to its end by a thread of its own.
struct Drained {
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> Drained {
    let bytes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = pipe.map(|mut pipe| {
        let bytes = bytes.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                bytes.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    });
    Drained { bytes, reader }
}

impl Drained {
    /// Everything the child wrote: the pipe read to its end (the child has exited).
    fn all(&self) -> String {
        if let Some(reader) = &self.reader {
            // Its end comes once every process holding the pipe is gone; a rank's own
            // children (mpirun's) may outlive it by a moment.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.so_far()
    }

    /// What has arrived so far.
    fn so_far(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }
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
