//! `gsm run`, driven as a user would: the built binary starting small shell scripts.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

const GSM: &str = env!("CARGO_BIN_EXE_gsm");

/// Long enough for a loaded 2-core machine, short enough to fail a hung test soon.
const DEADLINE: Duration = Duration::from_secs(30);

enum Line {
    Out(String),
    Err(String),
}

/// A running `gsm`, its output collected line by line.
struct Gsm {
    child: Child,
    what: String,
    lines: Receiver<Line>,
    out: Vec<String>,
    err: Vec<String>,
    started: Instant,
}

/// A finished `gsm`.
struct Done {
    status: ExitStatus,
    out: Vec<String>,
    err: Vec<String>,
    elapsed: Duration,
}

impl Done {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn stderr(&self) -> String {
        self.err.join("\n")
    }

    fn stdout(&self) -> String {
        self.out.join("\n")
    }
}

fn read_lines(pipe: impl Read + Send + 'static, tx: mpsc::Sender<Line>, out: bool) {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf);
                    let text = text.strip_suffix('\n').unwrap_or(&text).to_owned();
                    let line = if out {
                        Line::Out(text)
                    } else {
                        Line::Err(text)
                    };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

impl Gsm {
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Gsm {
        let mut command = Command::new(GSM);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("cannot start the gsm binary");
        let (tx, lines) = mpsc::channel();
        read_lines(child.stdout.take().unwrap(), tx.clone(), true);
        read_lines(child.stderr.take().unwrap(), tx, false);
        Gsm {
            child,
            what: format!("gsm {}", args.join(" ")),
            lines,
            out: Vec::new(),
            err: Vec::new(),
            started: Instant::now(),
        }
    }

    fn keep(&mut self, line: Line) {
        match line {
            Line::Out(l) => self.out.push(l),
            Line::Err(l) => self.err.push(l),
        }
    }

    /// Waits until `count` stdout lines satisfy `pred`.
    fn wait_for_lines(&mut self, what: &str, count: usize, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while self.out.iter().filter(|l| pred(l)).count() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.keep(line),
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{}: no {count} lines {what} within {DEADLINE:?}; stdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.out.join("\n"),
                    self.err.join("\n")
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "{}: ended before {count} lines {what}; stdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.out.join("\n"),
                    self.err.join("\n")
                ),
            }
        }
    }

    /// Waits for gsm to exit and for its output to end.
    fn finish(mut self) -> Done {
        let deadline = self.started + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("cannot wait for gsm") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {DEADLINE:?}; stdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.out.join("\n"),
                    self.err.join("\n")
                );
            }
            while let Ok(line) = self.lines.try_recv() {
                self.keep(line);
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        loop {
            let left =
                (deadline + Duration::from_secs(5)).saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.keep(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: its output did not end after it exited", self.what)
                }
            }
        }
        Done {
            status,
            out: std::mem::take(&mut self.out),
            err: std::mem::take(&mut self.err),
            elapsed,
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) only sends a signal to our own child.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "cannot signal gsm");
    }
}

impl Drop for Gsm {
    fn drop(&mut self) {
        // A failed test must not leave gsm running; its guardian kills the ranks.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn gsm(args: &[&str], envs: &[(&str, &str)]) -> Done {
    Gsm::start(args, envs).finish()
}

/// `gsm run -n N -- sh -c SCRIPT`.
fn run_sh(n: usize, script: &str, envs: &[(&str, &str)]) -> Done {
    let n = n.to_string();
    gsm(&["run", "-n", &n, "--", "sh", "-c", script], envs)
}

/// The words after `[rank] KEY ` on the stdout line of that rank, or a panic naming it.
fn field(done: &Done, rank: usize, key: &str) -> Vec<String> {
    let prefix = format!("[{rank}] {key} ");
    let line = done
        .out
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in stdout:\n{}", done.stdout()));
    line.split(' ').map(str::to_owned).collect()
}

fn pid(done: &Done, rank: usize, key: &str) -> i32 {
    field(done, rank, key)[0].parse().expect("a pid")
}

/// Whether a process still runs (a zombie waiting for its reaper does not count).
fn running(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn assert_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| running(p)) {
        assert!(
            Instant::now() < deadline,
            "processes left behind: {:?}",
            pids.iter().filter(|&&p| running(p)).collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ranks_get_their_settings_and_prefixed_output() {
    let script = r#"
        echo "env $GSM_RANK $GSM_SIZE $GSM_COORD $GSM_JOB $GSM_SECRET $GSM_LOCAL_SIZE ${GSM_WORKERS-unset} ${SLURM_PROCID-unset} ${OMPI_COMM_WORLD_SIZE-unset} $KEPT"
        echo "to stderr $GSM_RANK" >&2
        printf "no newline $GSM_RANK"
    "#;
    let envs = [
        ("SLURM_PROCID", "7"),
        ("SLURM_NTASKS", "9"),
        ("OMPI_COMM_WORLD_SIZE", "9"),
        ("KEPT", "yes"),
    ];
    let jobs: Vec<(String, String)> = (0..2)
        .map(|_| {
            let done = run_sh(3, script, &envs);
            assert_eq!(done.code(), Some(0), "stderr:\n{}", done.stderr());
            assert_eq!(done.out.len(), 6, "stdout:\n{}", done.stdout());
            let first = field(&done, 0, "env");
            for rank in 0..3 {
                let f = field(&done, rank, "env");
                assert_eq!(f[0], rank.to_string());
                assert_eq!(f[1], "3");
                let port: u16 = f[2].strip_prefix("127.0.0.1:").unwrap().parse().unwrap();
                assert_ne!(port, 0);
                assert_eq!(f[3].len(), 16, "job id {}", f[3]);
                assert!(u64::from_str_radix(&f[3], 16).is_ok(), "job id {}", f[3]);
                assert_eq!(f[4].len(), 64, "secret");
                assert!(f[4].bytes().all(|b| b.is_ascii_hexdigit()));
                assert_eq!(f[2..5], first[2..5], "coordinator, job and secret differ");
                assert_eq!(f[5..], ["3", "unset", "unset", "unset", "yes"]);
                assert!(done.out.contains(&format!("[{rank}] no newline {rank}")));
                assert!(done.err.contains(&format!("[{rank}] to stderr {rank}")));
            }
            assert!(done.err.iter().all(|l| !l.starts_with("gsm run:")));
            (first[3].clone(), first[4].clone())
        })
        .collect();
    assert_ne!(jobs[0].0, jobs[1].0, "two jobs got one job id");
    assert_ne!(jobs[0].1, jobs[1].1, "two jobs got one secret");
}

#[test]
fn workers_option_sets_gsm_workers() {
    let done = gsm(
        &[
            "run",
            "-n",
            "2",
            "--workers",
            "3",
            "--",
            "sh",
            "-c",
            "echo w $GSM_WORKERS",
        ],
        &[],
    );
    assert_eq!(done.code(), Some(0), "stderr:\n{}", done.stderr());
    assert_eq!(field(&done, 0, "w"), ["3"]);
    assert_eq!(field(&done, 1, "w"), ["3"]);
}

#[test]
fn lines_of_ranks_are_never_mixed() {
    const LINES: usize = 300;
    let script = format!(
        r#"x=$(printf '%0500d' 0); i=0
        while [ $i -lt {LINES} ]; do echo "$GSM_RANK:$i:$x"; echo "$GSM_RANK:$i:$x" >&2; i=$((i+1)); done"#
    );
    let done = run_sh(4, &script, &[]);
    assert_eq!(done.code(), Some(0), "stderr:\n{}", done.stderr());
    let zeros = "0".repeat(500);
    for lines in [&done.out, &done.err] {
        let mut next = [0usize; 4];
        for line in lines {
            let (prefix, rest) = line.split_once(' ').expect("a prefixed line");
            let rank: usize = prefix
                .strip_prefix('[')
                .and_then(|p| p.strip_suffix(']'))
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("bad prefix in {line:?}"));
            assert_eq!(rest, format!("{rank}:{}:{zeros}", next[rank]), "mixed line");
            next[rank] += 1;
        }
        assert_eq!(next, [LINES; 4]);
    }
}

#[test]
fn exit_status_is_that_of_the_failing_rank() {
    let done = run_sh(
        3,
        r#"echo "pid $$"; [ "$GSM_RANK" = 1 ] && exit 3; exit 0"#,
        &[],
    );
    assert_eq!(done.code(), Some(3), "stderr:\n{}", done.stderr());
    let line = format!(
        "gsm run: rank 1 (pid {}) exited with status 3",
        pid(&done, 1, "pid")
    );
    assert!(
        done.err.contains(&line),
        "no {line:?} in:\n{}",
        done.stderr()
    );
    let reports = done
        .err
        .iter()
        .filter(|l| l.starts_with("gsm run:"))
        .count();
    assert_eq!(reports, 1, "stderr:\n{}", done.stderr());
}

#[test]
fn recover_restarts_a_failed_rank_as_its_next_incarnation() {
    // Rank 1's first life fails; rank 0 outlives its restart, which then exits normally.
    let script = r#"echo "life $GSM_INCARNATION $GSM_RECOVER"
        case $GSM_RANK in
        0) sleep 2;;
        1) [ "$GSM_INCARNATION" = 0 ] && exit 3;;
        esac
        exit 0"#;
    let done = gsm(
        &["run", "-n", "3", "--recover", "--", "sh", "-c", script],
        &[],
    );
    assert_eq!(done.code(), Some(0), "stderr:\n{}", done.stderr());
    let lives = |rank: usize| {
        let prefix = format!("[{rank}] life ");
        done.out
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
            .collect::<Vec<_>>()
    };
    assert_eq!(lives(1), ["0 1", "1 1"], "stdout:\n{}", done.stdout());
    assert_eq!(lives(2), ["0 1"], "stdout:\n{}", done.stdout());
    let err = done.stderr();
    assert!(
        err.contains("exited with status 3; restarting it as incarnation 1 (--recover)"),
        "{err}"
    );
}

#[test]
fn recover_gives_up_after_max_restarts() {
    let script = r#"case $GSM_RANK in 0) sleep 5;; 1) echo "life $GSM_INCARNATION"; exit 3;; esac"#;
    let args = ["run", "-n", "2", "--recover", "--max-restarts", "2", "--"];
    let done = gsm(
        &[&args[..], &["sh", "-c", script]].concat(),
        &[("GSM_PEER_TIMEOUT", "1s")],
    );
    assert_eq!(done.code(), Some(3), "stderr:\n{}", done.stderr());
    let err = done.stderr();
    assert!(
        err.contains("rank 1 used up its 2 restarts (--max-restarts)"),
        "{err}"
    );
    assert!(err.contains("restarting it as incarnation 2"), "{err}");
    assert!(!err.contains("restarting it as incarnation 3"), "{err}");
}

#[test]
fn recover_never_restarts_rank_0() {
    let script = r#"[ "$GSM_RANK" = 0 ] && exit 4; sleep 30"#;
    let args = ["run", "-n", "2", "--recover", "--", "sh", "-c", script];
    let done = gsm(&args, &[("GSM_PEER_TIMEOUT", "1s")]);
    assert_eq!(done.code(), Some(4), "stderr:\n{}", done.stderr());
    assert!(!done.stderr().contains("restarting"), "{}", done.stderr());
}

#[test]
fn first_rank_to_fail_by_time_wins() {
    let script = r#"case $GSM_RANK in 0) sleep 1; exit 4;; 1) exit 5;; *) exit 0;; esac"#;
    let done = run_sh(3, script, &[]);
    assert_eq!(done.code(), Some(5), "stderr:\n{}", done.stderr());
    let err = done.stderr();
    assert!(
        err.contains("rank 0 (pid") && err.contains("exited with status 4"),
        "{err}"
    );
    assert!(err.contains("exited with status 5"), "{err}");
}

#[test]
fn rank_killed_by_a_signal_gives_128_plus_it() {
    let script = r#"ulimit -c 0; echo "pid $$"; [ "$GSM_RANK" = 0 ] && kill -SEGV $$; exit 0"#;
    let done = run_sh(2, script, &[]);
    assert_eq!(
        done.code(),
        Some(128 + libc::SIGSEGV),
        "stderr:\n{}",
        done.stderr()
    );
    let line = format!(
        "gsm run: rank 0 (pid {}) killed by SIGSEGV",
        pid(&done, 0, "pid")
    );
    assert!(
        done.err.contains(&line),
        "no {line:?} in:\n{}",
        done.stderr()
    );
}

#[test]
fn hanging_rank_is_killed_after_a_failure() {
    let script = r#"echo "pid $$"
        if [ "$GSM_RANK" = 0 ]; then sleep 60 & echo "bg $!"; wait; fi
        sleep 0.2; exit 7"#;
    let done = run_sh(2, script, &[("GSM_PEER_TIMEOUT", "500ms")]);
    assert_eq!(done.code(), Some(7), "stderr:\n{}", done.stderr());
    // Rank 1 fails after 0.2 s; rank 0 gets 0.5 s + 2 s more before SIGKILL.
    assert!(
        done.elapsed >= Duration::from_millis(2500) && done.elapsed < Duration::from_secs(15),
        "gsm took {:?}",
        done.elapsed
    );
    let hung = pid(&done, 0, "pid");
    let line = format!("gsm run: rank 0 (pid {hung}) killed by SIGKILL");
    assert!(
        done.err.contains(&line),
        "no {line:?} in:\n{}",
        done.stderr()
    );
    assert_gone(&[hung, pid(&done, 0, "bg"), pid(&done, 1, "pid")]);
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    let script = r#"trap 'echo "got TERM"; exit 9' TERM; echo ready; while :; do sleep 0.1; done"#;
    let mut run = Gsm::start(&["run", "-n", "2", "--", "sh", "-c", script], &[]);
    run.wait_for_lines("saying ready", 2, |l| l.ends_with("] ready"));
    run.signal(libc::SIGTERM);
    let done = run.finish();
    assert_eq!(done.code(), Some(9), "stderr:\n{}", done.stderr());
    for rank in 0..2 {
        let line = format!("[{rank}] got TERM");
        assert!(
            done.out.contains(&line),
            "no {line:?} in:\n{}",
            done.stdout()
        );
    }
}

#[test]
fn sigint_is_forwarded_to_every_rank() {
    let script = r#"echo "pid $$"; exec sleep 60"#;
    let mut run = Gsm::start(&["run", "-n", "2", "--", "sh", "-c", script], &[]);
    run.wait_for_lines("with a pid", 2, |l| l.contains("] pid "));
    run.signal(libc::SIGINT);
    let done = run.finish();
    assert_eq!(
        done.code(),
        Some(128 + libc::SIGINT),
        "stderr:\n{}",
        done.stderr()
    );
    assert!(
        done.elapsed < Duration::from_secs(20),
        "took {:?}",
        done.elapsed
    );
    for rank in 0..2 {
        let line = format!(
            "gsm run: rank {rank} (pid {}) killed by SIGINT",
            pid(&done, rank, "pid")
        );
        assert!(
            done.err.contains(&line),
            "no {line:?} in:\n{}",
            done.stderr()
        );
    }
}

#[test]
fn processes_left_by_ranks_are_killed() {
    // Each rank leaves a background process holding its output pipe, and exits.
    let done = run_sh(2, r#"sleep 60 & echo "bg $!"; exit 0"#, &[]);
    assert_eq!(done.code(), Some(0), "stderr:\n{}", done.stderr());
    assert!(
        done.elapsed < Duration::from_secs(20),
        "took {:?}",
        done.elapsed
    );
    assert_gone(&[pid(&done, 0, "bg"), pid(&done, 1, "bg")]);
}

/// Ranks 0 and 2 play gossamer's fate sharing: they exit with EXIT_PEER_LOST the moment rank
/// 1 dies (they read a fifo that only rank 1 holds open for writing, so they see its end when
/// its process does, before gsm can reap it). gsm must name rank 1, killed by SIGKILL, every
/// time, however the exits are interleaved.
#[test]
fn the_killed_rank_is_reported_not_those_that_lost_it() {
    let dir = std::env::temp_dir().join(format!("gsm-fate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("make a temporary directory");
    let fifo = dir.join("rank1");
    let script = format!(
        r#"f='{}'
        if [ "$GSM_RANK" = 1 ]; then exec 3>"$f"; echo "pid $$"; exec sleep 60; fi
        exec 4<"$f"; echo ready; cat <&4 >/dev/null; exit {}"#,
        fifo.display(),
        gossamer::EXIT_PEER_LOST
    );
    for round in 0..4 {
        let _ = std::fs::remove_file(&fifo);
        let made = Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo {}", fifo.display());
        let mut run = Gsm::start(&["run", "-n", "3", "--", "sh", "-c", &script], &[]);
        run.wait_for_lines("saying ready", 2, |l| l.ends_with("] ready"));
        run.wait_for_lines("with rank 1's pid", 1, |l| l.starts_with("[1] pid "));
        let victim: i32 = run
            .out
            .iter()
            .find_map(|l| l.strip_prefix("[1] pid "))
            .unwrap()
            .parse()
            .expect("a pid");
        // SAFETY: kill(2) only sends a signal, to a rank of this test's own gsm.
        let killed = unsafe { libc::kill(victim, libc::SIGKILL) };
        assert_eq!(killed, 0, "kill rank 1");
        let done = run.finish();
        let err = done.stderr();
        assert_eq!(
            done.code(),
            Some(128 + libc::SIGKILL),
            "round {round}:\n{err}"
        );
        assert!(
            done.err
                .contains(&format!("gsm run: rank 1 (pid {victim}) killed by SIGKILL")),
            "round {round}:\n{err}"
        );
        assert_eq!(
            done.err.last().map(String::as_str),
            Some("gsm run: status 137 from rank 1, the first to fail on its own"),
            "round {round}:\n{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Plays a rack whose rank 0 `main` panicked (its own panic, or one it re-raised from a
/// remote call): rank 0 tells the others the job's status, they exit with it at once, and rank
/// 0 exits with it only after they have (a rack's rank 0 waits for the others to close). gsm
/// must name rank 0 however the exits are interleaved: `rank_0_last` makes rank 0 end after
/// the others, and the other way round.
#[test]
fn rank_0s_panic_is_named_not_the_ranks_that_repeat_its_status() {
    let panic = gossamer::EXIT_PANIC;
    let rank_0_last = format!(
        r#"if [ "$GSM_RANK" = 0 ]; then sleep 1; echo "panicked at main"; exit {panic}; fi
        exit {panic}"#
    );
    let rank_0_first = format!(
        r#"if [ "$GSM_RANK" = 0 ]; then echo "panicked at main"; exit {panic}; fi
        sleep 1; exit {panic}"#
    );
    for script in [rank_0_last, rank_0_first] {
        let done = run_sh(3, &script, &[]);
        let err = done.stderr();
        assert_eq!(done.code(), Some(panic.into()), "{script}:\n{err}");
        assert_eq!(
            done.err.last().map(String::as_str),
            Some(
                format!("gsm run: status {panic} from rank 0, the first to fail on its own")
                    .as_str()
            ),
            "{script}:\n{err}"
        );
    }
}

/// A rank that failed on its own with a status other than rank 0's is still named, before
/// rank 0 repeating its own status.
#[test]
fn a_rank_failing_first_with_its_own_status_is_named() {
    let script = r#"case $GSM_RANK in 1) exit 3;; *) sleep 1; exit 101;; esac"#;
    let done = run_sh(3, script, &[]);
    let err = done.stderr();
    assert_eq!(done.code(), Some(3), "{err}");
    assert_eq!(
        done.err.last().map(String::as_str),
        Some("gsm run: status 3 from rank 1, the first to fail on its own"),
        "{err}"
    );
}

/// gsm forwards SIGTERM; the ranks die of it; gsm exits with 143 and says the job was
/// stopped by SIGTERM, not that a rank failed on its own.
#[test]
fn sigterm_is_reported_as_the_reason_of_the_end() {
    let script = r#"echo ready; exec sleep 60"#;
    let mut run = Gsm::start(&["run", "-n", "2", "--", "sh", "-c", script], &[]);
    run.wait_for_lines("saying ready", 2, |l| l.ends_with("] ready"));
    run.signal(libc::SIGTERM);
    let done = run.finish();
    let err = done.stderr();
    assert_eq!(done.code(), Some(128 + libc::SIGTERM), "{err}");
    // Both ranks died of it: either may be the first gsm saw.
    let last = done.err.last().map(String::as_str).unwrap_or_default();
    assert!(
        last.starts_with("gsm run: status 143 from rank ")
            && last.ends_with(", stopped by SIGTERM (forwarded by gsm)"),
        "{err}"
    );
}

/// gsm is killed with SIGKILL, which it cannot catch: its guardian still kills every rank's
/// process group, the ranks' own children included.
#[test]
fn ranks_and_their_children_die_with_a_killed_gsm() {
    let script = r#"sleep 300 & echo "child $! of $$"; wait"#;
    let mut run = Gsm::start(&["run", "-n", "2", "--", "sh", "-c", script], &[]);
    run.wait_for_lines("naming a child", 2, |l| l.contains("] child "));
    let pids: Vec<i32> = run
        .out
        .iter()
        .filter_map(|l| l.split_once("] child ").map(|(_, rest)| rest.to_owned()))
        .flat_map(|rest| {
            let (child, rank) = rest.split_once(" of ").expect("child PID of PID");
            [child.parse().expect("a pid"), rank.parse().expect("a pid")]
        })
        .collect();
    assert!(
        pids.iter().all(|&p| running(p)),
        "not all running: {pids:?}"
    );
    run.signal(libc::SIGKILL);
    assert_gone(&pids);
}

#[test]
fn usage_errors_exit_with_2() {
    // (arguments, environment, expected text, whether the usage line is shown: clap leaves
    // it out for a bad option value)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, bool);
    let cases: [Case; 7] = [
        (
            &["run", "-n", "2", "--max-restarts", "3", "--", "true"],
            &[],
            "--recover",
            true,
        ),
        (
            &["run", "-n", "0", "--", "true"],
            &[],
            "invalid value '0'",
            false,
        ),
        (&["run", "-n", "2"], &[], "<PROGRAM>", true),
        (
            &["run", "-n", "2", "--workers", "0", "--", "true"],
            &[],
            "invalid value '0'",
            false,
        ),
        (
            &["run", "-n", "2", "--", "/nonexistent/gsm-test-prog"],
            &[],
            "program '/nonexistent/gsm-test-prog' not found",
            true,
        ),
        (
            &["run", "-n", "2", "--", "gsm-test-no-such-program"],
            &[],
            "program 'gsm-test-no-such-program' not found",
            true,
        ),
        (
            &["run", "-n", "2", "--", "true"],
            &[("GSM_PEER_TIMEOUT", "100ms")],
            "GSM_PEER_TIMEOUT (100ms) must be longer than GSM_HEARTBEAT",
            true,
        ),
    ];
    for (args, envs, expected, usage) in cases {
        let done = gsm(args, envs);
        let err = done.stderr();
        assert_eq!(done.code(), Some(2), "gsm {args:?}: {err}");
        assert!(err.starts_with("error: "), "gsm {args:?}: {err}");
        assert!(
            err.contains(expected),
            "gsm {args:?}: no {expected:?} in {err}"
        );
        assert_eq!(err.contains("Usage: gsm run"), usage, "gsm {args:?}: {err}");
        assert!(err.contains("try '--help'"), "gsm {args:?}: {err}");
        assert!(done.out.is_empty(), "gsm {args:?} printed {:?}", done.out);
    }
}

#[test]
fn help_shows_an_example() {
    let done = gsm(&["run", "--help"], &[]);
    assert_eq!(done.code(), Some(0));
    let help = done.stdout();
    assert!(help.contains("gsm run -n 4 -- "), "{help}");
    assert!(help.contains("GSM_PEER_TIMEOUT"), "{help}");
    for status in [gossamer::EXIT_BAD_FRAME, gossamer::EXIT_PEER_LOST] {
        assert!(help.contains(&format!("exited with {status} (")), "{help}");
    }
    let top = gsm(&["--help"], &[]).stdout();
    assert!(top.contains("run"), "{top}");
    assert!(!top.contains("guardian"), "the guardian is internal: {top}");
}
