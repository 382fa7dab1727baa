//! kvs as a rack job, as its README starts it: `gsm run -n 3 -- kvs -p a,b,c`. One table
//! across three ranks (whichever rank a request reaches, its key's shard answers), the fate
//! of the job when a rank is killed, and a rank whose port is taken.
//!
//! `gsm` is the one `cargo test` builds beside `kvs` (or `GSM_BIN`).

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{PATIENCE, talk, wait_for};

const RANKS: usize = 3;

fn gsm() -> PathBuf {
    let path = std::env::var_os("GSM_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_kvs")).with_file_name("gsm"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "no gsm at {} (build it with `cargo build -p gsm`, or name one in GSM_BIN)",
        path.display()
    );
    path
}

/// Free ports, as probed (a parallel test may take one before the job binds it: the job
/// then fails to start, and [`Job::start`] tries others).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn port_list(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `gsm run -n 3 -- kvs …`, killed on drop.
struct Job {
    child: Child,
    ports: Vec<u16>,
}

impl Job {
    /// Starts the job on free ports and waits until every rank answers as a child of it.
    fn start(env: &[(&str, &str)]) -> Job {
        for _ in 0..10 {
            let ports = free_ports(RANKS);
            let child = Command::new(gsm())
                .args(["run", "-n", &RANKS.to_string(), "--"])
                .arg(env!("CARGO_BIN_EXE_kvs"))
                .args([
                    "-l",
                    "127.0.0.1",
                    "-t",
                    "2",
                    "-m",
                    "16",
                    "-p",
                    &port_list(&ports),
                ])
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start gsm run");
            let mut job = Job { child, ports };
            if job.wait_until_serving() {
                return job;
            }
        }
        panic!("the job did not start on any of 10 sets of free ports");
    }

    /// Whether every rank answers on its port as a process the job started; false if the job
    /// ended (a port was taken) or another process answers on one of its ports.
    fn wait_until_serving(&mut self) -> bool {
        let gsm_pid = self.child.id();
        for rank in 0..RANKS {
            let serving = wait_for(&format!("rank {rank} to listen on its port"), || {
                if self.child.try_wait().unwrap().is_some() {
                    return Some(false);
                }
                let mut s = TcpStream::connect(("127.0.0.1", self.ports[rank])).ok()?;
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                let pid = stat(&talk(&mut s, b"stats\r\n", b"END\r\n"), "pid")?;
                Some(parent_of(pid) == Some(gsm_pid))
            });
            if !serving {
                return false;
            }
        }
        true
    }

    fn connect(&self, rank: usize) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.ports[rank])).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s
    }

    /// The pid of rank `rank`'s process, from its `stats`.
    fn pid(&self, rank: usize) -> u32 {
        let stats = talk(&mut self.connect(rank), b"stats\r\n", b"END\r\n");
        stat(&stats, "pid").expect("STAT pid") as u32
    }

    /// Waits for the job to end; its status and output.
    fn wait_end(mut self, within: Duration) -> Output {
        let deadline = Instant::now() + within;
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the job did not end within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let child = std::mem::replace(
            &mut self.child,
            Command::new("true").spawn().expect("spawn true"),
        );
        child.wait_with_output().unwrap()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parent_of(pid: u64) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": the command may hold spaces, so count from its ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The value of `STAT name` in a `stats` answer.
fn stat(stats: &[u8], name: &str) -> Option<u64> {
    let text = String::from_utf8_lossy(stats);
    let prefix = format!("STAT {name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

fn value(i: usize) -> String {
    format!("value-{i}-").repeat(1 + i % 40)
}

#[test]
fn one_table_across_three_ranks() {
    let job = Job::start(&[]);
    let keys = 300;
    // Stored through rank 0, in one pipelined write.
    let mut sets = Vec::new();
    for i in 0..keys {
        let v = value(i);
        sets.extend_from_slice(format!("set key:{i} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let stored = talk(&mut job.connect(0), &sets, &b"STORED\r\n".repeat(keys));
    assert_eq!(
        stored,
        b"STORED\r\n".repeat(keys),
        "every set through rank 0"
    );

    // Read back through rank 2 in one multi-get: every value, flags intact, in key order.
    let names: Vec<String> = (0..keys).map(|i| format!("key:{i}")).collect();
    let got = talk(
        &mut job.connect(2),
        format!("get {}\r\n", names.join(" ")).as_bytes(),
        b"END\r\n",
    );
    let mut want = Vec::new();
    for i in 0..keys {
        let v = value(i);
        want.extend_from_slice(format!("VALUE key:{i} {i} {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    want.extend_from_slice(b"END\r\n");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want)
    );

    // The table's counters are the job's, whichever rank is asked.
    let stats = talk(&mut job.connect(1), b"stats\r\n", b"END\r\n");
    assert_eq!(stat(&stats, "curr_items"), Some(keys as u64));
    // cas uniques are unique across every rank's shards.
    let gets = talk(
        &mut job.connect(1),
        format!("gets {}\r\n", names.join(" ")).as_bytes(),
        b"END\r\n",
    );
    let mut uniques: Vec<String> = String::from_utf8_lossy(&gets)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("VALUE ")?
                .split(' ')
                .nth(3)
                .map(String::from)
        })
        .collect();
    assert_eq!(uniques.len(), keys);
    uniques.sort();
    uniques.dedup();
    assert_eq!(uniques.len(), keys, "cas uniques repeat across shards");

    // One counter, incremented through every rank at once.
    talk(&mut job.connect(0), b"set n 0 0 1\r\n0\r\n", b"\r\n");
    let per_rank = 200;
    let threads: Vec<_> = (0..RANKS)
        .map(|rank| {
            let mut s = job.connect(rank);
            std::thread::spawn(move || {
                for _ in 0..per_rank {
                    let answer = talk(&mut s, b"incr n 1\r\n", b"\r\n");
                    let number = String::from_utf8_lossy(&answer).trim_end().parse::<u64>();
                    assert!(number.is_ok(), "incr answered {answer:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let n = talk(&mut job.connect(1), b"get n\r\n", b"END\r\n");
    let total = (RANKS * per_rank).to_string();
    assert_eq!(
        String::from_utf8_lossy(&n),
        format!("VALUE n 0 {}\r\n{total}\r\nEND\r\n", total.len())
    );

    // flush_all through one rank empties every shard.
    assert_eq!(
        talk(&mut job.connect(2), b"flush_all\r\n", b"\r\n"),
        b"OK\r\n"
    );
    for rank in 0..RANKS {
        let got = talk(&mut job.connect(rank), b"get key:0 key:7 n\r\n", b"END\r\n");
        assert_eq!(
            got, b"END\r\n",
            "rank {rank} still finds items after flush_all"
        );
    }
}

#[test]
fn a_killed_rank_ends_the_job_and_is_named() {
    let job = Job::start(&[("GSM_PEER_TIMEOUT", "1s"), ("GSM_HEARTBEAT", "100ms")]);
    let mut client = job.connect(0);
    assert_eq!(
        talk(&mut client, b"set a 0 0 1\r\n1\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    let victim = job.pid(1);
    let killed = Instant::now();
    let kill = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(kill.success(), "kill -9 rank 1 (pid {victim})");
    // Fate sharing: within GSM_PEER_TIMEOUT + 1 s of the loss (and some slack for a loaded
    // machine), every rank is gone and gsm names the one that died.
    let out = job.wait_end(Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the job succeeded after losing rank 1: {stderr}"
    );
    assert!(
        stderr.contains(&format!("rank 1 (pid {victim}) killed by SIGKILL")),
        "gsm did not name rank 1: {stderr}"
    );
    eprintln!(
        "the job ended {:?} after rank 1 was killed",
        killed.elapsed()
    );
}

#[test]
fn a_taken_port_or_a_short_port_list_fails_naming_it() {
    // The last rank's port is held from the start: freed and bound again, another connection
    // could take it meanwhile.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut ports = free_ports(RANKS - 1);
    ports.push(taken.local_addr().unwrap().port());
    let run = |p: &str| {
        let child = Command::new(gsm())
            .args(["run", "-n", &RANKS.to_string(), "--"])
            .arg(env!("CARGO_BIN_EXE_kvs"))
            .args(["-l", "127.0.0.1", "-t", "1", "-p", p])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gsm run");
        Job {
            child,
            ports: Vec::new(),
        }
        .wait_end(PATIENCE)
    };
    let out = run(&port_list(&ports));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("[2] kvs: cannot listen on 127.0.0.1:{}", ports[2])),
        "{stderr}"
    );
    drop(taken);
    let out = run(&port_list(&ports[..2]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("-p lists 2 ports for a job of 3 ranks"),
        "{stderr}"
    );
}
