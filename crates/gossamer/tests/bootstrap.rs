//! The bootstrap under strangers: silent connections to the coordinator, a rank that never
//! comes, a rank number taken twice, a coordinator that never sends the node table.
//!
//! Like `rack.rs`, this file is its own test driver (`harness = false`): run without
//! `GSM_RANK` it starts itself once per rank; run with `GSM_RANK` it is one rank of a small
//! job in which rank 0 says `started` when its main begins and `job ok` when it is done.
//! Every child is killed, failing its test, if it outlives its deadline.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use gossamer::Rack;

mod common;

fn main() -> std::process::ExitCode {
    if std::env::var_os("GSM_RANK").is_some() {
        return Rack::from_env().run(|| {
            println!("started");
            let ranks: Vec<u32> = gossamer::nodes()
                .map(|n| gossamer::spawn_on(n, |()| gossamer::this_node().rank(), ()).join())
                .collect();
            assert_eq!(ranks, (0..ranks.len() as u32).collect::<Vec<_>>());
            println!("job ok");
        });
    }
    let tests: &[(&str, fn())] = &[
        (
            "two_silent_connections_do_not_delay_the_start",
            two_silent_connections,
        ),
        (
            "two_hundred_silent_connections_do_not_stop_the_job",
            two_hundred_silent_connections,
        ),
        (
            "a_stream_of_new_silent_connections_does_not_stop_the_job",
            a_stream_of_silent_connections,
        ),
        (
            "a_missing_rank_is_named_on_time_whatever_arrives",
            a_missing_rank_is_named_on_time,
        ),
        (
            "a_rank_taken_twice_is_told_why_it_was_refused",
            a_rank_taken_twice,
        ),
        ("a_rank_without_the_node_table_says_so", no_node_table),
    ];
    common::run_all("bootstrap", tests)
}

/// The handshake's limit per peer: a connection that costs this long was waited on.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// One job's coordinator address and id; `rank` makes the command of one of its ranks.
struct Job {
    coord: String,
    id: String,
    size: usize,
}

impl Job {
    fn new(size: usize, case: u64) -> Job {
        let port = common::job::free_port();
        Job {
            coord: format!("127.0.0.1:{port}"),
            id: format!("{}", u64::from(std::process::id()) * 100 + case),
            size,
        }
    }

    /// Starts rank `rank` with GSM_CONNECT_TIMEOUT `timeout`.
    fn rank(&self, rank: usize, timeout: &str) -> Child {
        Command::new(std::env::current_exe().expect("this test's path"))
            .env("GSM_RANK", rank.to_string())
            .env("GSM_SIZE", self.size.to_string())
            .env("GSM_COORD", &self.coord)
            .env("GSM_JOB", &self.id)
            .env("GSM_SECRET", "bootstrap-test")
            .env("GSM_WORKERS", "1")
            .env("GSM_CONNECT_TIMEOUT", timeout)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a rank")
    }

    /// `count` connections to the coordinator that never send a byte, made once it listens.
    fn silent(&self, count: usize) -> Vec<TcpStream> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut held = Vec::with_capacity(count);
        while held.len() < count {
            match TcpStream::connect_timeout(
                &self.coord.parse().expect("an address"),
                Duration::from_secs(5),
            ) {
                Ok(s) => held.push(s),
                Err(e) if Instant::now() >= deadline => panic!(
                    "only {} of {count} connections to the coordinator {} within 20 s: {e}",
                    held.len(),
                    self.coord
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        held
    }
}

/// Rank 0's stdout, line by line, read on a thread of its own.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("rank 0's stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for the line `want`, at most until `deadline`; panics naming it otherwise.
fn wait_for(lines: &mpsc::Receiver<String>, want: &str, deadline: Instant) {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line == want => return,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("rank 0 did not print {want:?} in time"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("rank 0 ended before it printed {want:?}")
            }
        }
    }
}

/// Waits for every rank, at most `limit`; their statuses and stderr, with all stderr joined.
fn finish(children: Vec<Child>, limit: Duration) -> (Vec<(ExitStatus, String)>, String) {
    let results: Vec<(ExitStatus, String)> = common::finish(children, limit, "the job")
        .into_iter()
        .map(|(status, _, stderr)| (status, stderr))
        .collect();
    let all = results.iter().map(|(_, e)| e.as_str()).collect();
    (results, all)
}

fn all_succeed(results: &[(ExitStatus, String)], all: &str) {
    for (rank, (status, _)) in results.iter().enumerate() {
        assert!(status.success(), "rank {rank} {status}; stderr:\n{all}");
    }
}

/// While ranks 0 and 1 of 3 wait for rank 2, two connections to the coordinator say nothing.
/// Rank 2 joins at once: the job starts well within one handshake's limit of rank 2's start.
fn two_silent_connections() {
    let job = Job::new(3, 1);
    let mut rank0 = job.rank(0, "20s");
    let out = lines(&mut rank0);
    let rank1 = job.rank(1, "20s");
    let silent = job.silent(2);
    let started = Instant::now();
    let rank2 = job.rank(2, "20s");
    wait_for(&out, "started", started + Duration::from_secs(30));
    let took = started.elapsed();
    let (results, all) = finish(vec![rank0, rank1, rank2], Duration::from_secs(30));
    all_succeed(&results, &all);
    assert!(
        took < HANDSHAKE_LIMIT - Duration::from_secs(1),
        "the job started {took:?} after rank 2; stderr:\n{all}"
    );
    drop(silent);
}

/// 200 connections that say nothing, held open through the whole job, more than the
/// listener's backlog: the ranks still join and the job runs to its end.
fn two_hundred_silent_connections() {
    let job = Job::new(3, 2);
    let mut rank0 = job.rank(0, "20s");
    let out = lines(&mut rank0);
    let silent = job.silent(200);
    let rank1 = job.rank(1, "20s");
    let rank2 = job.rank(2, "20s");
    wait_for(&out, "job ok", Instant::now() + Duration::from_secs(40));
    let (results, all) = finish(vec![rank0, rank1, rank2], Duration::from_secs(30));
    all_succeed(&results, &all);
    drop(silent);
}

/// A new silent connection every millisecond, the last 300 held open, all through the job:
/// more than the coordinator greets at once, so it keeps cutting the oldest, and a real rank
/// it cuts dials again. The ranks still join and the job runs to its end.
fn a_stream_of_silent_connections() {
    let job = Job::new(3, 6);
    let mut rank0 = job.rank(0, "30s");
    let out = lines(&mut rank0);
    let first = job.silent(1);
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, made) = (stop.clone(), made.clone());
        let coord = job.coord.parse().expect("an address");
        std::thread::spawn(move || {
            let mut held = VecDeque::from(first);
            while !stop.load(Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect_timeout(&coord, Duration::from_secs(1)) {
                    held.push_back(s);
                    made.fetch_add(1, Ordering::Relaxed);
                }
                if held.len() > 300 {
                    held.pop_front();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    // The ranks come once the coordinator is cutting greetings.
    let deadline = Instant::now() + Duration::from_secs(30);
    while made.load(Ordering::Relaxed) < 2 * 64 {
        assert!(
            Instant::now() < deadline,
            "the flood made only {} connections in 30 s",
            made.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let rank1 = job.rank(1, "30s");
    let rank2 = job.rank(2, "30s");
    wait_for(&out, "job ok", Instant::now() + Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    flood.join().expect("the flooding thread");
    let (results, all) = finish(vec![rank0, rank1, rank2], Duration::from_secs(30));
    all_succeed(&results, &all);
    assert!(
        all.contains("cut: 64 newer connections"),
        "no greeting was cut:\n{all}"
    );
}

/// Rank 2 never comes while 200 silent connections are held open: rank 0 gives up at its
/// GSM_CONNECT_TIMEOUT (plus what starting a process takes), naming rank 2.
fn a_missing_rank_is_named_on_time() {
    let job = Job::new(3, 3);
    let started = Instant::now();
    let rank0 = job.rank(0, "4s");
    let silent = job.silent(200);
    let rank1 = job.rank(1, "20s");
    let (results, all) = finish(vec![rank0], Duration::from_secs(30));
    let took = started.elapsed();
    let (status, stderr) = &results[0];
    assert_eq!(status.code(), Some(gossamer::EXIT_SETUP.into()), "{stderr}");
    assert!(
        stderr.contains("rank 2 did not join within 4 s (GSM_CONNECT_TIMEOUT)"),
        "{all}"
    );
    assert!(
        took < Duration::from_secs(4 + 4),
        "rank 0 gave up {took:?} after it started, with GSM_CONNECT_TIMEOUT=4s"
    );
    drop(silent);
    // Rank 1 learns that rank 0 is gone, and says so.
    let (results, all) = finish(vec![rank1], Duration::from_secs(30));
    assert_eq!(
        results[0].0.code(),
        Some(gossamer::EXIT_SETUP.into()),
        "{all}"
    );
    assert!(
        all.contains("rank 0 closed the connection before it sent the node table"),
        "{all}"
    );
}

/// Two processes start as rank 2 of 3: rank 0 keeps the first, tells the second why it will
/// not have it, and the job runs with rank 1 once it comes.
fn a_rank_taken_twice() {
    let job = Job::new(3, 4);
    let rank0 = job.rank(0, "30s");
    let mut twins: Vec<Option<Child>> = vec![Some(job.rank(2, "30s")), Some(job.rank(2, "30s"))];
    // Whichever registers second is refused and exits; which one is up to the scheduler.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let ended = twins.iter_mut().position(|t| {
            t.as_mut()
                .is_some_and(|c| c.try_wait().expect("wait for a rank").is_some())
        });
        if let Some(i) = ended {
            break twins[i].take().expect("the refused rank");
        }
        assert!(
            Instant::now() < deadline,
            "neither rank 2 was refused within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (results, stderr) = finish(vec![refused], Duration::from_secs(5));
    assert_eq!(
        results[0].0.code(),
        Some(gossamer::EXIT_SETUP.into()),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 0 refused this rank: rank 2 has already joined"),
        "{stderr}"
    );
    let kept = twins.into_iter().flatten().next().expect("the kept rank 2");
    let rank1 = job.rank(1, "30s");
    let (results, all) = finish(vec![rank0, rank1, kept], Duration::from_secs(40));
    all_succeed(&results, &all);
    assert!(
        all.contains("refused a connection from") && all.contains("rank 2 has already joined"),
        "rank 0 logs the refusal:\n{all}"
    );
}

/// Rank 1 registers, but rank 0 waits for a rank 2 that never comes, longer than rank 1
/// waits: rank 1 says rank 0 sent no node table within its GSM_CONNECT_TIMEOUT.
fn no_node_table() {
    let job = Job::new(3, 5);
    let mut rank0 = job.rank(0, "30s");
    let started = Instant::now();
    let rank1 = job.rank(1, "2s");
    let (results, stderr) = finish(vec![rank1], Duration::from_secs(20));
    let took = started.elapsed();
    rank0.kill().ok();
    rank0.wait().ok();
    assert_eq!(
        results[0].0.code(),
        Some(gossamer::EXIT_SETUP.into()),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 0 sent no node table within 2 s (GSM_CONNECT_TIMEOUT)"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
