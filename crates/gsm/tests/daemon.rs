//! `gsm daemon` and `gsm run --hosts`, driven as a user would: three hosts in network
//! namespaces on a switch, a daemon on each, and `gsm run`, `gsm ps` and `gsm kill` started
//! on the first.
//!
//! This file is its own driver (`harness = false`): run plainly it runs the tests; run as
//! `daemon --rank SCENARIO` it is a rank of a job (the program the daemons start), and as
//! `daemon --poke KIND ADDR` it is a stranger at a daemon's port.
//!
//! The program is a copy of this binary in a directory that the daemons of the second and
//! third hosts do not see (each runs in a mount namespace with an empty file system mounted
//! over it), so that those two must be sent it.
//!
//! The host tests need root and network namespaces; without them they skip loudly, or fail
//! under `GSM_REQUIRE_NETNS=1` (as in `scripts/test.sh`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use gossamer::Rack;

#[path = "../../gossamer/tests/common/netns.rs"]
mod netns;
#[path = "../../gossamer/tests/common/pause.rs"]
mod pause;

use netns::{HOSTS, Net};
use pause::pause;

mod driver;

const GSM: &str = env!("CARGO_BIN_EXE_gsm");
/// The port of every daemon, each in its own namespace.
const PORT: u16 = 7420;
/// The peer timeout of the jobs that test fate sharing, and their heartbeat.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);
const HEARTBEAT: &str = "100ms";
/// The longest any one job of these tests may take before the test fails.
const JOB_LIMIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--rank") => {
            let scenario = args[2].clone();
            let extra = args.get(3).cloned().unwrap_or_default();
            return Rack::from_env().run(move || play(&scenario, &extra));
        }
        Some("--poke") => return poke(&args[2], &args[3]),
        _ => {}
    }
    let tests: &[(&str, fn())] = &[
        ("a_key_open_to_others_is_refused", key_mode_is_checked),
        ("a_host_without_a_daemon_is_named", missing_daemon_is_named),
        ("jobs_across_3_hosts", across_hosts),
    ];
    driver::run(tests)
}

// ---------------------------------------------------------------------------------------------
// The ranks

fn play(scenario: &str, extra: &str) {
    match scenario {
        "hello" => hello(),
        "wait" => wait_for(Path::new(extra)),
        "talk" => talk(),
        other => panic!("unknown scenario {other}"),
    }
}

/// Which of the test hosts this process is on: the one whose address it can bind.
fn my_host() -> String {
    (0..HOSTS)
        .map(Net::addr)
        .find(|a| std::net::TcpListener::bind((*a, 0)).is_ok())
        .map_or_else(|| "no test host".into(), |a| a.to_string())
}

/// Every rank says hello on its stdout and stderr; rank 0 sums what they answered.
fn hello() {
    let answers: Vec<u32> = gossamer::nodes()
        .map(|n| {
            gossamer::spawn_on(
                n,
                |()| {
                    let me = gossamer::this_node().rank();
                    let size = gossamer::nodes().count();
                    println!("hello from rank {me} of {size} on {}", my_host());
                    if let Ok(tls) = std::env::var("UCX_TLS") {
                        println!("rank {me} has UCX_TLS={tls}");
                    }
                    eprintln!("rank {me} on stderr");
                    me + 1
                },
                (),
            )
            .join()
        })
        .collect();
    println!("sum {}", answers.iter().sum::<u32>());
}

/// Every rank says it is ready; then rank 0 waits for `stop` to exist, calls every rank once
/// more and ends the job.
fn wait_for(stop: &Path) {
    for n in gossamer::nodes() {
        gossamer::spawn_on(
            n,
            |()| println!("ready {}", gossamer::this_node().rank()),
            (),
        )
        .join();
    }
    let deadline = Instant::now() + JOB_LIMIT;
    while !stop.exists() {
        assert!(
            Instant::now() < deadline,
            "never told to stop ({})",
            stop.display()
        );
        pause(Duration::from_millis(50));
    }
    // A rank restarted by `gsm run --recover` may still be linking: tried again until then.
    let ranks: Vec<u32> = gossamer::nodes()
        .map(|n| {
            loop {
                match gossamer::spawn_on(n, |()| gossamer::this_node().rank(), ()).try_join() {
                    Ok(rank) => break rank,
                    Err(e) => {
                        assert!(
                            Instant::now() < deadline,
                            "rank {} never answered: {e}",
                            n.rank()
                        );
                        pause(Duration::from_millis(50));
                    }
                }
            }
        })
        .collect();
    println!("done {ranks:?}");
}

/// Every rank calls every rank's counter, forever.
fn talk() {
    let counters: Vec<gossamer::Trust<u64>> = gossamer::nodes()
        .map(|n| gossamer::spawn_on(n, |()| gossamer::entrust(0u64), ()).join())
        .collect();
    let _talkers: Vec<_> = gossamer::nodes()
        .map(|n| gossamer::spawn_on(n, talk_forever, counters.clone()))
        .collect();
    let deadline = Instant::now() + JOB_LIMIT;
    while counters.iter().any(|c| c.apply(|v| *v) < 5) {
        assert!(Instant::now() < deadline, "the ranks never all talked");
        pause(Duration::from_millis(20));
    }
    println!("talking");
    loop {
        pause(Duration::from_millis(50));
    }
}

fn talk_forever(counters: Vec<gossamer::Trust<u64>>) {
    loop {
        for c in &counters {
            c.apply(|v| *v += 1);
        }
        pause(Duration::from_millis(20));
    }
}

/// A stranger at a daemon's port: `garbage` writes bytes that are no hello, `silent` writes
/// nothing; both print how long the daemon took to close the connection.
fn poke(kind: &str, addr: &str) -> ExitCode {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).expect("connect to the daemon");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("a read timeout");
    if kind == "garbage" {
        let junk: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
        // The daemon may close before taking it all.
        let _ = stream.write_all(&junk);
    }
    let mut sink = Vec::new();
    // Closed with our bytes unread, the daemon's end resets the connection.
    let closed = match stream.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    println!(
        "{kind}: closed={closed} after {} ms, {} bytes from the daemon",
        started.elapsed().as_millis(),
        sink.len()
    );
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A line one of our processes printed, and when it arrived.
struct Line {
    at: Instant,
    stderr: bool,
    text: String,
}

/// A running process, its output gathered line by line.
struct Proc {
    what: String,
    child: Child,
    lines: Receiver<Line>,
    seen: Vec<Line>,
}

/// A process that has ended.
struct Ended {
    status: ExitStatus,
    lines: Vec<Line>,
}

impl Ended {
    fn stdout(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| !l.stderr)
            .map(|l| l.text.as_str())
            .collect()
    }

    fn stderr(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.stderr)
            .map(|l| l.text.as_str())
            .collect()
    }

    fn all(&self) -> String {
        self.lines
            .iter()
            .map(|l| format!("{} {}\n", if l.stderr { "err" } else { "out" }, l.text))
            .collect()
    }
}

impl Proc {
    fn start(what: &str, command: &mut Command) -> Proc {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let (tx, lines) = mpsc::channel();
        for (pipe, stderr) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
                false,
            ),
            (Box::new(child.stderr.take().unwrap()), true),
        ] {
            let tx = tx.clone();
            thread::spawn(move || {
                for text in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let line = Line {
                        at: Instant::now(),
                        stderr,
                        text,
                    };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Proc {
            what: what.into(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// What it printed so far, a line each.
    fn printed(&self) -> String {
        self.seen.iter().map(|l| format!("{}\n", l.text)).collect()
    }

    /// Waits for a line containing `text`; when it came.
    fn wait_line(&mut self, text: &str, limit: Duration) -> Instant {
        let deadline = Instant::now() + limit;
        if let Some(l) = self.seen.iter().find(|l| l.text.contains(text)) {
            return l.at;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let at = line.at;
                    let found = line.text.contains(text);
                    self.seen.push(line);
                    if found {
                        return at;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "{} printed no line with {text:?} within {limit:?}; it printed:\n{}",
                        self.what,
                        self.printed()
                    );
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "{} ended without a line with {text:?}; it printed:\n{}",
                    self.what,
                    self.printed()
                ),
            }
        }
    }

    /// Waits for the process to end, at most `limit`, and for the rest of its output.
    fn finish(mut self, limit: Duration) -> Ended {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for a child") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.seen.extend(self.lines.try_iter());
                panic!(
                    "{} did not end within {limit:?} (killed); it printed:\n{}",
                    self.what,
                    self.printed()
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        // The pipes close when the process and anything it left behind are gone.
        let drain = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = self
            .lines
            .recv_timeout(drain.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        Ended {
            status,
            lines: self.seen,
        }
    }
}

/// Runs a short command to its end (at most [`JOB_LIMIT`]).
fn run(what: &str, command: &mut Command) -> Ended {
    Proc::start(what, command).finish(JOB_LIMIT)
}

// ---------------------------------------------------------------------------------------------
// Without hosts

/// A scratch directory of this test process, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("gsm-daemon-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make a scratch directory");
        Scratch(dir)
    }

    fn key(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        let made = run(
            "gsm cluster-key",
            Command::new(GSM).arg("cluster-key").arg(&path),
        );
        assert!(
            made.status.success(),
            "gsm cluster-key failed:\n{}",
            made.all()
        );
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key_mode_is_checked() {
    let scratch = Scratch::new("mode");
    let key = scratch.key("cluster.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new key's mode");
    let again = run(
        "gsm cluster-key",
        Command::new(GSM).arg("cluster-key").arg(&key),
    );
    assert!(
        !again.status.success(),
        "a key is never overwritten:\n{}",
        again.all()
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let daemon = run(
        "gsm daemon",
        Command::new(GSM)
            .args(["daemon", "--listen", "127.0.0.1:0", "--key"])
            .arg(&key)
            .arg("--store")
            .arg(scratch.0.join("store")),
    );
    assert!(
        !daemon.status.success(),
        "a daemon with a readable key must not start"
    );
    let said = daemon.stderr().join("\n");
    assert!(
        said.contains("mode 0644") && said.contains("chmod 600"),
        "{said}"
    );
}

fn missing_daemon_is_named() {
    let scratch = Scratch::new("missing");
    let key = scratch.key("cluster.key");
    // A port nothing listens on: bound and closed again.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let host = format!("127.0.0.1:{port}");
    let job = run(
        "gsm run",
        Command::new(GSM)
            .args(["run", "--hosts", &host, "--key"])
            .arg(&key)
            .args(["-n", "1", "--", "true"]),
    );
    assert!(!job.status.success(), "{}", job.all());
    let said = job.stderr().join("\n");
    assert!(
        said.contains(&host) && said.contains("gsm daemon"),
        "{said}"
    );
}

// ---------------------------------------------------------------------------------------------
// Three hosts

/// The hosts, their daemons and what the jobs share.
struct Cluster {
    net: Net,
    scratch: Scratch,
    key: PathBuf,
    /// The copy of this binary the jobs run, in a directory hosts 1 and 2 do not see.
    program: PathBuf,
    daemons: Vec<Child>,
}

impl Cluster {
    fn new() -> Cluster {
        let net = Net::new("daemon").unwrap_or_else(|e| panic!("building the hosts: {e}"));
        let scratch = Scratch::new("hosts");
        let key = scratch.key("cluster.key");
        let hidden = scratch.0.join("bin");
        std::fs::create_dir_all(&hidden).unwrap();
        let program = hidden.join("rank-program");
        std::fs::copy(std::env::current_exe().unwrap(), &program).expect("copy the program");
        let mut daemons = Vec::new();
        for h in 0..HOSTS {
            let log = std::fs::File::create(scratch.0.join(format!("daemon-{h}.log"))).unwrap();
            let daemon = format!(
                // Every address of the host, IPv4 and IPv6.
                "exec {GSM} daemon --listen [::]:{PORT} --key {} --store {}",
                key.display(),
                scratch.0.join(format!("store-{h}")).display()
            );
            let script = if h == 0 {
                daemon
            } else {
                // Its own mount namespace (ip netns exec makes one) with the program hidden.
                format!(
                    "mount -t tmpfs -o size=1m gsmhide {} && {daemon}",
                    hidden.display()
                )
            };
            let child = Command::new(netns::ip_program())
                .args(["netns", "exec", &net.hosts[h], "sh", "-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start a daemon");
            daemons.push(child);
        }
        let cluster = Cluster {
            net,
            scratch,
            key,
            program,
            daemons,
        };
        for h in 0..HOSTS {
            cluster.wait_log(h, "listening on", Duration::from_secs(20));
        }
        cluster
    }

    fn hosts() -> String {
        (0..HOSTS)
            .map(|h| Net::addr(h).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The hosts by their IPv6 addresses.
    fn hosts6() -> String {
        (0..HOSTS)
            .map(|h| format!("[{}]", Net::addr6(h)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log(&self, h: usize) -> String {
        std::fs::read_to_string(self.scratch.0.join(format!("daemon-{h}.log"))).unwrap_or_default()
    }

    fn wait_log(&self, h: usize, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log(h).contains(text) {
            assert!(
                Instant::now() < deadline,
                "daemon {h} logged no {text:?} within {limit:?}; its log:\n{}",
                self.log(h)
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A gsm command on host 0.
    fn gsm(&self, args: &[&str]) -> Command {
        let mut command = Command::new(netns::ip_program());
        command
            .args(["netns", "exec", &self.net.hosts[0], GSM])
            .args(args);
        command
    }

    /// `gsm run --hosts <all> ARGS -- <program> --rank SCENARIO EXTRA` on host 0.
    fn job(&self, args: &[&str], scenario: &str, extra: &str, env: &[(&str, &str)]) -> Proc {
        self.job_on(&Cluster::hosts(), args, scenario, extra, env)
    }

    fn job_on(
        &self,
        hosts: &str,
        args: &[&str],
        scenario: &str,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Proc {
        let mut command = self.gsm(&["run", "--hosts", hosts, "--key"]);
        command
            .arg(&self.key)
            .args(args)
            .arg("--")
            .arg(&self.program);
        command.args(["--rank", scenario, extra]);
        for (name, value) in env {
            command.env(name, value);
        }
        Proc::start(&format!("gsm run ({scenario})"), &mut command)
    }

    fn ps(&self) -> Ended {
        let mut command = self.gsm(&["ps", "--hosts", &Cluster::hosts(), "--key"]);
        run("gsm ps", command.arg(&self.key))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// The job id `gsm run` announced.
fn job_id(job: &mut Proc) -> String {
    job.wait_line("gsm run: job ", Duration::from_secs(20));
    let line = &job
        .seen
        .iter()
        .find(|l| l.text.starts_with("gsm run: job "))
        .unwrap()
        .text;
    line["gsm run: job ".len()..][..16].to_string()
}

fn across_hosts() {
    match netns::required("the daemon tests (crates/gsm/tests/daemon.rs)") {
        Ok(true) => {}
        Ok(false) => return,
        Err(why) => panic!("{why}"),
    }
    let cluster = Cluster::new();
    let step = |name: &str, f: &dyn Fn(&Cluster)| {
        let started = Instant::now();
        f(&cluster);
        println!("  {name}: ok ({:.1} s)", started.elapsed().as_secs_f64());
    };
    step(
        "output arrives prefixed; the program is sent once",
        &output_and_shipping,
    );
    step("--per-host places ranks in blocks", &per_host);
    step("hosts by their IPv6 addresses", &ipv6);
    step(
        "kill -9 of a rank on the second host ends the job",
        &kill_a_rank,
    );
    step("gsm ps lists a job, gsm kill ends it", &ps_and_kill);
    step("signals reach every rank", &signals);
    step("a job does not outlive its gsm run", &gsm_killed);
    step("strangers at a daemon's port harm no job", &strangers);
    step(
        "--recover moves a lost host's rank where its state is reachable",
        &recover_moves,
    );
    // Last: it leaves the third host cut off.
    step("a host whose link goes down ends the job", &link_down);
}

fn output_and_shipping(c: &Cluster) {
    let started = Instant::now();
    let first = c.job(&["-n", "6"], "hello", "", &[]).finish(JOB_LIMIT);
    let first_took = started.elapsed();
    assert!(
        first.status.success(),
        "the first job failed:\n{}",
        first.all()
    );
    let out = first.stdout();
    for rank in 0..6 {
        let host = Net::addr(rank % HOSTS);
        let line = format!("[{rank}] hello from rank {rank} of 6 on {host}");
        assert!(
            out.contains(&line.as_str()),
            "no {line:?} (round-robin):\n{}",
            first.all()
        );
        let err = format!("[{rank}] rank {rank} on stderr");
        assert!(
            first.stderr().contains(&err.as_str()),
            "no {err:?}:\n{}",
            first.all()
        );
    }
    assert!(out.contains(&"[0] sum 21"), "{}", first.all());
    let sent: Vec<&str> = first
        .stderr()
        .into_iter()
        .filter(|l| l.contains("sent "))
        .collect();
    assert_eq!(
        sent.len(),
        2,
        "sent to the two hosts without it:\n{}",
        first.all()
    );
    for h in 1..HOSTS {
        let to = format!(" to {} in ", Net::addr(h));
        assert!(
            sent.iter().any(|l| l.contains(&to)),
            "nothing sent to host {h}: {sent:?}"
        );
    }
    let started = Instant::now();
    // UCX's settings travel with the job, as GSM_* ones do.
    let again = c
        .job(&["-n", "6"], "hello", "", &[("UCX_TLS", "tcp")])
        .finish(JOB_LIMIT);
    let again_took = started.elapsed();
    for rank in 0..6 {
        let line = format!("[{rank}] rank {rank} has UCX_TLS=tcp");
        assert!(
            again.stdout().contains(&line.as_str()),
            "no {line:?}:\n{}",
            again.all()
        );
    }
    // The baseline: the same job with its 6 ranks on host 0, started by gsm run alone.
    let started = Instant::now();
    let mut command = c.gsm(&["run", "-n", "6", "--"]);
    let local = run(
        "gsm run on one host",
        command.arg(&c.program).args(["--rank", "hello"]),
    );
    assert!(local.status.success(), "{}", local.all());
    println!(
        "    the job on 3 hosts: {} ms with the program sent to 2 of them, {} ms with it \
         stored; on one host without daemons: {} ms; {}",
        first_took.as_millis(),
        again_took.as_millis(),
        started.elapsed().as_millis(),
        sent[0]
    );
    assert!(
        again.status.success(),
        "the second job failed:\n{}",
        again.all()
    );
    assert!(
        !again.stderr().iter().any(|l| l.contains("sent ")),
        "the program was sent again:\n{}",
        again.all()
    );
    let hash = gossamer::cluster::hex(&gossamer::cluster::file_hash(&c.program).unwrap());
    for h in 0..HOSTS {
        let store: Vec<_> = std::fs::read_dir(c.scratch.0.join(format!("store-{h}")))
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        if h == 0 {
            assert!(
                store.is_empty(),
                "host 0 has the program and stores nothing"
            );
            continue;
        }
        assert_eq!(store.len(), 1, "host {h} stores one program");
        assert_eq!(
            store[0].file_name().to_string_lossy(),
            hash,
            "named by its hash"
        );
        let mode = store[0].metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "host {h}'s stored program");
        assert_eq!(
            c.log(h).matches("gsm daemon: stored ").count(),
            1,
            "{}",
            c.log(h)
        );
        assert!(c.log(h).contains("(stored copy)"), "{}", c.log(h));
    }
}

fn per_host(c: &Cluster) {
    let job = c
        .job(&["-n", "5", "--per-host", "2"], "hello", "", &[])
        .finish(JOB_LIMIT);
    assert!(job.status.success(), "{}", job.all());
    for rank in 0..5 {
        let line = format!(
            "[{rank}] hello from rank {rank} of 5 on {}",
            Net::addr(rank / 2)
        );
        assert!(
            job.stdout().contains(&line.as_str()),
            "no {line:?}:\n{}",
            job.all()
        );
    }
}

fn ipv6(c: &Cluster) {
    let job = c
        .job_on(&Cluster::hosts6(), &["-n", "3"], "hello", "", &[])
        .finish(JOB_LIMIT);
    assert!(job.status.success(), "{}", job.all());
    for rank in 0..3 {
        let line = format!(
            "[{rank}] hello from rank {rank} of 3 on {}",
            Net::addr(rank)
        );
        assert!(
            job.stdout().contains(&line.as_str()),
            "no {line:?}:\n{}",
            job.all()
        );
    }
}

/// The pid of `rank` of job `id` on host `h`, from `gsm ps`.
fn pid_of(c: &Cluster, id: &str, h: usize, rank: u32) -> i32 {
    let ps = c.ps();
    assert!(ps.status.success(), "gsm ps failed:\n{}", ps.all());
    let host = Net::addr(h).to_string();
    let line = ps
        .stdout()
        .into_iter()
        .find(|l| l.starts_with(id) && l.split_whitespace().nth(1) == Some(host.as_str()))
        .unwrap_or_else(|| panic!("gsm ps shows no job {id} on {host}:\n{}", ps.all()))
        .to_string();
    let needle = format!(" {rank} (");
    let at = line
        .find(&needle)
        .unwrap_or_else(|| panic!("no rank {rank} in {line:?}"));
    let pid = &line[at + needle.len()..];
    pid[..pid.find(')').unwrap()].parse().unwrap()
}

fn kill_a_rank(c: &Cluster) {
    let timeout = format!("{}ms", PEER_TIMEOUT.as_millis());
    let env = [
        ("GSM_PEER_TIMEOUT", timeout.as_str()),
        ("GSM_HEARTBEAT", HEARTBEAT),
    ];
    let (job, id) = waiting_job(c, &c.scratch.0.join("never"), &env);
    let pid = pid_of(c, &id, 1, 1);
    let killed = Instant::now();
    // SAFETY: kill(2) only sends a signal to the rank found above.
    let sent = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(sent, 0, "kill -9 {pid}");
    let ended = job.finish(JOB_LIMIT);
    assert_eq!(ended.status.code(), Some(128 + 9), "{}", ended.all());
    let named = format!(
        "rank 1 (pid {pid}) on host {} killed by SIGKILL",
        Net::addr(1)
    );
    assert!(
        ended.stderr().iter().any(|l| l.contains(&named)),
        "no {named:?}:\n{}",
        ended.all()
    );
    // Every rank's end is reported as it comes: all within GSM_PEER_TIMEOUT + 1 s.
    let bound = PEER_TIMEOUT + Duration::from_secs(1);
    for rank in [0, 2] {
        let line = ended
            .lines
            .iter()
            .find(|l| l.text.starts_with(&format!("gsm run: rank {rank} (pid")))
            .unwrap_or_else(|| panic!("rank {rank}'s end is not reported:\n{}", ended.all()));
        let took = line.at.saturating_duration_since(killed);
        assert!(
            took <= bound,
            "rank {rank} ended {took:?} after the kill:\n{}",
            ended.all()
        );
        println!(
            "    rank {rank}'s end reported {} ms after the kill",
            took.as_millis()
        );
    }
}

fn ps_and_kill(c: &Cluster) {
    let (job, id) = waiting_job(c, &c.scratch.0.join("never"), &[]);
    for h in 0..HOSTS {
        assert!(pid_of(c, &id, h, h as u32) > 0);
    }
    let mut command = c.gsm(&["kill", &id, "--hosts", &Cluster::hosts(), "--key"]);
    let kill = run("gsm kill", command.arg(&c.key));
    assert!(kill.status.success(), "gsm kill failed:\n{}", kill.all());
    let ended = job.finish(JOB_LIMIT);
    assert_eq!(ended.status.code(), Some(128 + 9), "{}", ended.all());
    let ps = c.ps();
    assert!(
        !ps.stdout().iter().any(|l| l.starts_with(&id)),
        "the killed job is still listed:\n{}",
        ps.all()
    );
    let mut command = c.gsm(&["kill", &id, "--hosts", &Cluster::hosts(), "--key"]);
    let again = run("gsm kill", command.arg(&c.key));
    assert!(
        !again.status.success(),
        "killing a job that is gone fails:\n{}",
        again.all()
    );
}

/// Starts a job of ranks that wait, one per host, and waits until all are ready; its id.
fn waiting_job(c: &Cluster, stop: &Path, env: &[(&str, &str)]) -> (Proc, String) {
    let mut job = c.job(&["-n", "3"], "wait", &stop.to_string_lossy(), env);
    let id = job_id(&mut job);
    for rank in 0..3 {
        job.wait_line(&format!("[{rank}] ready {rank}"), Duration::from_secs(30));
    }
    (job, id)
}

fn signals(c: &Cluster) {
    let (job, _) = waiting_job(c, &c.scratch.0.join("never"), &[]);
    let pid = job.child.id() as i32;
    // SAFETY: kill(2) only sends a signal to our own child, gsm run.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let ended = job.finish(JOB_LIMIT);
    assert_eq!(ended.status.code(), Some(128 + 15), "{}", ended.all());
    // Each rank ends by the SIGTERM forwarded, or (when another's came first) by the job's
    // end, which it follows.
    for rank in 0..3 {
        let named = format!("rank {rank} (pid");
        let line = ended.stderr().into_iter().find(|l| l.contains(&named));
        assert!(
            line.is_some_and(|l| l.ends_with("killed by SIGTERM")
                || l.ends_with(&format!("exited with status {}", gossamer::EXIT_PEER_LOST))),
            "rank {rank} should end by the SIGTERM forwarded:\n{}",
            ended.all()
        );
    }
}

fn gsm_killed(c: &Cluster) {
    let (mut job, id) = waiting_job(c, &c.scratch.0.join("never"), &[]);
    let _ = job.child.kill();
    let _ = job.child.wait();
    // Each daemon sees the connection close and kills the job's ranks on its host.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ps = c.ps();
        if !ps.stdout().iter().any(|l| l.starts_with(&id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} outlived its gsm run:\n{}",
            ps.all()
        );
        thread::sleep(Duration::from_millis(50));
    }
    for h in 0..HOSTS {
        c.wait_log(h, &format!("job {id}: lost"), Duration::from_secs(10));
    }
}

fn strangers(c: &Cluster) {
    let stop = c.scratch.0.join("stop-strangers");
    let (job, _) = waiting_job(c, &stop, &[]);
    let target = format!("{}:{PORT}", Net::addr(1));
    let exe = std::env::current_exe().unwrap();
    let poke = |kind: &str| {
        let mut command = Command::new(netns::ip_program());
        command.args(["netns", "exec", &c.net.hosts[0]]).arg(&exe);
        Proc::start(
            &format!("poke {kind}"),
            command.args(["--poke", kind, &target]),
        )
    };
    let silent = poke("silent");
    let garbage = poke("garbage").finish(JOB_LIMIT);
    assert!(
        garbage.stdout().iter().any(|l| l.contains("closed=true")),
        "{}",
        garbage.all()
    );
    let wrong = c.scratch.key("wrong.key");
    let mut command = c.gsm(&["ps", "--hosts", &target, "--key"]);
    let refused = run("gsm ps with a wrong key", command.arg(&wrong));
    assert!(!refused.status.success(), "{}", refused.all());
    assert!(
        refused.all().contains("does not hold this cluster key"),
        "{}",
        refused.all()
    );
    let silent = silent.finish(JOB_LIMIT);
    let said = silent.stdout().join("\n");
    let ms: u64 = said
        .split("after ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        said.contains("closed=true") && (4_000..10_000).contains(&ms),
        "{said}"
    );
    let log = c.log(1);
    for refusal in [
        "is not a gsm client",
        "does not hold this cluster key",
        "said nothing in time",
    ] {
        assert!(
            log.contains(refusal),
            "daemon 1 did not log {refusal:?}:\n{log}"
        );
    }
    // The job was not touched: it ends as asked, every rank answering.
    std::fs::write(&stop, b"").unwrap();
    let ended = job.finish(JOB_LIMIT);
    assert!(ended.status.success(), "{}", ended.all());
    assert!(
        ended.stdout().contains(&"[0] done [0, 1, 2]"),
        "{}",
        ended.all()
    );
}

/// `gsm run --hosts --recover` when host 1 is cut off past the peer timeout, rank 1 on it:
/// without `--shared-state` the job ends naming why (the rank's state is pinned to its host);
/// with it rank 1 starts again on the spare host 2, rejoins, and the job ends well; and with a
/// state directory the hosts do not share (one each hosts 1 and 2 mount over the shared one),
/// the other hosts refuse the rank, each naming why, and the job ends.
fn recover_moves(c: &Cluster) {
    let timeout = format!("{}ms", PEER_TIMEOUT.as_millis());
    let hosts = format!("{},{}", Net::addr(0), Net::addr(1));
    let spare = Net::addr(2).to_string();
    let cut_host_1 = |args: &[&str], state: &Path, stop: &Path| {
        let dir = state.to_string_lossy();
        let env = [
            ("GSM_PEER_TIMEOUT", timeout.as_str()),
            ("GSM_HEARTBEAT", HEARTBEAT),
            ("GSM_STATE_DIR", dir.as_ref()),
        ];
        let mut args = args.to_vec();
        args.extend(["-n", "2", "--recover"]);
        let mut job = c.job_on(&hosts, &args, "wait", &stop.to_string_lossy(), &env);
        job.wait_line("[1] ready 1", Duration::from_secs(30));
        c.net.unplug(1);
        job
    };
    let shared = c.scratch.0.join("state");
    let stop = c.scratch.0.join("stop-recover");

    let pinned = cut_host_1(&[], &shared, &stop).finish(JOB_LIMIT);
    c.net.plug(1);
    assert!(!pinned.status.success(), "{}", pinned.all());
    assert!(
        pinned
            .all()
            .contains("pinned to its host without --shared-state"),
        "{}",
        pinned.all()
    );

    let mut moved = cut_host_1(&["--shared-state", "--spare-hosts", &spare], &shared, &stop);
    let to_spare = format!("restarting rank 1 as incarnation 1 on host {spare}");
    moved.wait_line(&to_spare, Duration::from_secs(30));
    moved.wait_line("rank 1 rejoined the job", Duration::from_secs(30));
    c.net.plug(1);
    std::fs::write(&stop, "").unwrap();
    let moved = moved.finish(JOB_LIMIT);
    assert!(moved.status.success(), "{}", moved.all());
    assert!(
        moved.stdout().contains(&"[0] done [0, 1]"),
        "{}",
        moved.all()
    );
    let marks = shared.join("rank-program/.gsm-hosts");
    assert!(!marks.exists(), "marks left in {}", marks.display());
    std::fs::remove_file(&stop).unwrap();

    // Hosts 1 and 2 see their own directory at this path (see `Cluster::new`).
    let apart = c.scratch.0.join("bin/state");
    let refused =
        cut_host_1(&["--shared-state", "--spare-hosts", &spare], &apart, &stop).finish(JOB_LIMIT);
    c.net.plug(1);
    assert!(!refused.status.success(), "{}", refused.all());
    for h in [0, 2] {
        let named = format!(
            "host {} refused incarnation 1 of rank 1: its state, written on the job's host 1, \
             is not reachable here",
            Net::addr(h)
        );
        assert!(
            refused.all().contains(&named),
            "no {named:?}:\n{}",
            refused.all()
        );
    }
    assert!(
        refused
            .all()
            .contains("rank 1 has no host left to restart on"),
        "{}",
        refused.all()
    );
}

fn link_down(c: &Cluster) {
    let timeout = format!("{}ms", PEER_TIMEOUT.as_millis());
    let env = [
        ("GSM_PEER_TIMEOUT", timeout.as_str()),
        ("GSM_HEARTBEAT", HEARTBEAT),
    ];
    let mut job = c.job(&["-n", "3"], "talk", "", &env);
    job.wait_line("[0] talking", Duration::from_secs(30));
    let unplugged = Instant::now();
    c.net.unplug(2);
    let ended = job.finish(JOB_LIMIT);
    let lost = format!("host {} lost (no word from its daemon", Net::addr(2));
    let line = ended
        .lines
        .iter()
        .find(|l| l.text.contains(&lost))
        .unwrap_or_else(|| panic!("no {lost:?}:\n{}", ended.all()));
    assert!(line.text.contains("rank 2 ended with it"), "{}", line.text);
    assert_eq!(
        ended.status.code(),
        Some(gossamer::EXIT_PEER_LOST.into()),
        "{}",
        ended.all()
    );
    let bound = PEER_TIMEOUT + Duration::from_secs(1);
    for l in ended
        .lines
        .iter()
        .filter(|l| l.text.starts_with("gsm run: "))
    {
        if l.text.contains(" lost ") || l.text.contains("(pid") {
            let took = l.at.saturating_duration_since(unplugged);
            assert!(
                took <= bound,
                "{:?} came {took:?} after the unplug:\n{}",
                l.text,
                ended.all()
            );
            println!("    {} ms after the unplug: {}", took.as_millis(), l.text);
        }
    }
    // The cut-off daemon heard nothing from gsm either, and killed its rank.
    c.wait_log(2, "killing the job's ranks here", Duration::from_secs(10));
}
