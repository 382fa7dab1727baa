//! `gsm top` and `gsm run --stats`, driven as a user would: `gsm run` starting this binary as
//! its ranks, `gsm top --once` attaching to the running job.
//!
//! This file is its own driver (`harness = false`): run plainly it runs the tests; run as
//! `top --rank DONE_FILE` it is a rank of a job that keeps its counters busy until the file
//! appears. Every test gives gsm an `XDG_RUNTIME_DIR` of its own, so jobs of other tests (or
//! of the user) are never seen.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use gossamer::Rack;

mod driver;

const GSM: &str = env!("CARGO_BIN_EXE_gsm");
/// How long any wait of these tests lasts before the test fails, naming what it waited for.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--rank") {
        let done = PathBuf::from(&args[2]);
        return Rack::from_env().run(move || busy_until(&done));
    }
    let tests: &[(&str, fn())] = &[
        ("top_shows_a_running_job_and_stats_its_end", top_and_stats),
        ("top_without_a_job_says_so", no_job),
        ("top_moves_a_hot_property_by_hand", move_by_hand),
        (
            "ranks_that_misbehave_are_named_not_waited_for",
            misbehaving_ranks,
        ),
        ("a_runtime_dir_open_to_others_is_refused", open_runtime_dir),
    ];
    driver::run(tests)
}

/// A rank's main: calls from every node to a counter on each node's worker 0, and a local
/// counter, until `done` exists.
fn busy_until(done: &Path) {
    let deadline = Instant::now() + PATIENCE;
    let counters: Vec<gossamer::Trust<u64>> = gossamer::nodes()
        .map(|n| n.trustee(0).entrust(0u64))
        .collect();
    let group = trust::Group::new();
    while !done.exists() {
        assert!(Instant::now() < deadline, "the test never said it was done");
        for c in &counters {
            for _ in 0..32 {
                c.apply_then_with(|c, x: u64| *c += x, 1, group.track(|()| {}));
            }
        }
        group.wait();
    }
}

/// A fresh `XDG_RUNTIME_DIR` for one test.
fn runtime_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gsm-top-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn gsm(runtime: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(GSM);
    cmd.args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("RUST_BACKTRACE", "0")
        .env("GSM_WORKERS", "1")
        .stdin(Stdio::null());
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("start gsm");
    wait_output(child, "gsm")
}

/// Waits for `child` at most [`PATIENCE`], killing it and failing the test past that.
fn wait_output(mut child: std::process::Child, what: &str) -> Output {
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gave up waiting for {what} to end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Runs `gsm top` with `args` until `wanted` takes something from what it printed, at most
/// [`PATIENCE`]; past that the test fails, saying top never did `what`.
fn top_until(
    runtime: &Path,
    args: &[&str],
    what: &str,
    wanted: impl Fn(&Output) -> Option<String>,
) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let top = output(gsm(runtime, args));
        if let Some(found) = wanted(&top) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "top never {what}:\n{}{}",
            text(&top.stdout),
            text(&top.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The directory of the one job running under `runtime`.
fn the_job_dir(runtime: &Path) -> PathBuf {
    let jobs: Vec<_> = std::fs::read_dir(runtime.join("gsm").join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(jobs.len(), 1, "one job's directory: {jobs:?}");
    jobs[0].clone()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn top_and_stats() {
    let runtime = runtime_dir("stats");
    let done = runtime.join("done");
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    let mut run = gsm(&runtime, &["run", "-n", "2", "--stats", "--", me, "--rank"]);
    run.arg(&done).stdout(Stdio::piped()).stderr(Stdio::piped());
    let job = run.spawn().expect("start gsm run");
    // Until both ranks serve their counters, top shows a rank as not serving yet; a type
    // shows once a sampled batch ran.
    let args = ["top", "--once", "--interval-ms", "300"];
    let screen = top_until(&runtime, &args, "showed both ranks", |top| {
        let screen = text(&top.stdout);
        // Both ranks, their links, and a type from sampled batches (one in 1024).
        let shown = ["1 → 0", "0 → 1", "u64"].iter().all(|s| screen.contains(s));
        (top.status.success() && !screen.contains("not serving yet") && shown).then_some(screen)
    });
    // The same ranks watched by their addresses, as a job gsm did not start would be.
    let job_dir = the_job_dir(&runtime);
    let addrs: Vec<String> = (0..2)
        .map(|r| std::fs::read_to_string(job_dir.join(format!("rank-{r}.addr"))).unwrap())
        .collect();
    let by_addr = output(gsm(
        &runtime,
        &[
            "top",
            "--once",
            "--interval-ms",
            "200",
            "--metrics",
            &addrs.join(","),
        ],
    ));
    let by_addr = text(&by_addr.stdout);
    assert!(
        by_addr.contains("2 ranks at the addresses given"),
        "{by_addr}"
    );
    assert!(
        by_addr.contains("0 → 1") && by_addr.contains("1 → 0"),
        "{by_addr}"
    );
    std::fs::write(&done, b"").unwrap();
    let ended = wait_output(job, "gsm run");
    let (out, err) = (text(&ended.stdout), text(&ended.stderr));
    assert!(ended.status.success(), "gsm run failed:\n{out}\n{err}");
    for expected in ["workers", "requests/s", "0 → 1", "1 → 0", "2 ranks"] {
        assert!(
            screen.contains(expected),
            "top lacks {expected:?}:\n{screen}"
        );
    }
    // The rows of ranks × workers: rank, worker, busy %, requests/s > 0.
    for rank in ["0", "1"] {
        let row = screen
            .lines()
            .find(|l| {
                l.trim_start_matches('│')
                    .starts_with(&format!("{rank}    0 "))
            })
            .unwrap_or_else(|| panic!("no row of rank {rank}:\n{screen}"));
        let fields: Vec<&str> = row.trim_matches('│').split_whitespace().collect();
        assert!(fields[2].ends_with('%'), "{row}");
        assert_ne!(fields[3], "0", "rank {rank} served requests: {row}");
    }
    assert!(
        out.contains("gsm run --stats"),
        "no table at the end:\n{out}"
    );
    assert!(out.contains("0 → 1") && out.contains("u64"), "{out}");
    // The job's directory is gone with the job: top finds nothing.
    let after = output(gsm(&runtime, &["top", "--once"]));
    assert!(!after.status.success());
    let _ = std::fs::remove_dir_all(&runtime);
}

/// `gsm top --once --move` makes the move of the `m` key: in a job of two ranks of two workers
/// whose counters are all on worker 0, a hot one goes from worker 0 to worker 1. Watched by
/// addresses (no control token), top moves nothing; and a rank refuses a move asked with a
/// wrong token, or none.
fn move_by_hand() {
    use std::io::{Read, Write};
    let runtime = runtime_dir("move");
    let done = runtime.join("done");
    let me = std::env::current_exe().unwrap();
    let mut run = gsm(
        &runtime,
        &["run", "-n", "2", "--", me.to_str().unwrap(), "--rank"],
    );
    run.arg(&done)
        .env("GSM_WORKERS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let job = run.spawn().expect("start gsm run");
    // Until sampled batches list a hot counter on a worker 0 (and the rank still has it
    // there when asked).
    let args = ["top", "--once", "--move", "--interval-ms", "300"];
    let moved = top_until(&runtime, &args, "moved a property", |top| {
        let said = text(&top.stdout);
        let said = said.lines().next().unwrap_or_default();
        said.contains("moved property").then(|| said.to_string())
    });
    assert!(moved.contains("from worker 0 to worker 1"), "{moved}");
    let job_dir = the_job_dir(&runtime);
    let addr = std::fs::read_to_string(job_dir.join("rank-0.addr")).unwrap();
    let by_addr = output(gsm(
        &runtime,
        &[
            "top",
            "--once",
            "--move",
            "--interval-ms",
            "100",
            "--metrics",
            addr.trim(),
        ],
    ));
    let said = text(&by_addr.stdout);
    assert!(
        said.starts_with("no move: moves by hand need a job started by gsm run"),
        "{said}"
    );
    let token = std::fs::read_to_string(job_dir.join("control")).unwrap();
    assert_eq!(token.trim().len(), 64, "a control token: {token:?}");
    for header in ["X-Gsm-Control: 0000\r\n".to_string(), String::new()] {
        let mut rank = std::net::TcpStream::connect(addr.trim()).unwrap();
        rank.set_read_timeout(Some(PATIENCE)).unwrap();
        let ask = format!("POST /move?id=1&from=0&to=1 HTTP/1.1\r\n{header}\r\n");
        rank.write_all(ask.as_bytes()).unwrap();
        let mut answer = String::new();
        rank.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{header:?}: {answer}");
    }
    std::fs::write(&done, b"").unwrap();
    let ended = wait_output(job, "gsm run");
    assert!(
        ended.status.success(),
        "gsm run failed:\n{}",
        text(&ended.stderr)
    );
    let _ = std::fs::remove_dir_all(&runtime);
}

fn no_job() {
    let runtime = runtime_dir("none");
    let top = output(gsm(&runtime, &["top", "--once"]));
    assert_eq!(top.status.code(), Some(1));
    let err = text(&top.stderr);
    assert!(
        err.contains("no job started by `gsm run` is running"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&runtime);
}

fn open_runtime_dir() {
    let runtime = runtime_dir("open");
    let base = runtime.join("gsm");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    let top = output(gsm(&runtime, &["top", "--once"]));
    let err = text(&top.stderr);
    assert!(!top.status.success());
    assert!(err.contains("only it may write to"), "{err}");
    // gsm run still runs the job, without a directory for top, and says so.
    let run = output(gsm(&runtime, &["run", "-n", "1", "--", "true"]));
    let err = text(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(
        err.contains("without gsm top and --stats") && err.contains("only it may write to"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&runtime);
}

/// A job whose rank 0 accepts and never answers, and whose rank 1 answers garbage: top shows
/// both as silent, with the reason, within its fetch deadline, not one deadline per rank.
fn misbehaving_ranks() {
    use std::io::{Read, Write};
    let runtime = runtime_dir("misbehave");
    let jobs = runtime.join("gsm").join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    for dir in [runtime.join("gsm"), jobs.clone()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let job = jobs.join("00000000000000ab");
    std::fs::create_dir(&job).unwrap();
    let info = format!(
        "pid {}\nranks 2\nstarted 1\nprogram fake\n",
        std::process::id()
    );
    std::fs::write(job.join("job"), info).unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let garbage = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(
        job.join("rank-0.addr"),
        silent.local_addr().unwrap().to_string(),
    )
    .unwrap();
    std::fs::write(
        job.join("rank-1.addr"),
        garbage.local_addr().unwrap().to_string(),
    )
    .unwrap();
    let server = std::thread::spawn(move || {
        // Each of top's two refreshes asks once: hold rank 0's connections, answer rank 1's.
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(silent.accept().unwrap().0);
            let (mut s, _) = garbage.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nnot{ metrics\n");
        }
        held
    });
    let started = Instant::now();
    let top = output(gsm(&runtime, &["top", "--once", "--interval-ms", "100"]));
    let took = started.elapsed();
    let screen = text(&top.stdout);
    assert!(top.status.success(), "{screen}{}", text(&top.stderr));
    assert!(screen.contains("00000000000000ab"), "{screen}");
    let row = |rank: &str| {
        screen
            .lines()
            .find(|l| {
                l.trim_start_matches('│')
                    .starts_with(&format!("rank {rank}: "))
            })
            .unwrap_or_else(|| panic!("no line for rank {rank}:\n{screen}"))
            .to_string()
    };
    assert!(row("0").contains("127.0.0.1:"), "{screen}");
    assert!(row("1").contains("not a sample"), "{screen}");
    assert!(took < Duration::from_secs(4), "two refreshes took {took:?}");
    drop(server.join().unwrap());
    let _ = std::fs::remove_dir_all(&runtime);
}
