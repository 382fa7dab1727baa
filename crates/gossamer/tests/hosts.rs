//! Multi-host tests of the rack: three hosts, each a network namespace joined to a switch.
//!
//! The topology, built fresh for each test with `ip` (iproute2) and deleted after it:
//!
//! ```text
//!   gsmhosts-<pid>-<test>-h0  eth0 10.77.0.1/24 fd77::1/64 ──┐
//!   gsmhosts-<pid>-<test>-h1  eth0 10.77.0.2/24 fd77::2/64 ──┼── p0 p1 p2 in br0,
//!   gsmhosts-<pid>-<test>-h2  eth0 10.77.0.3/24 fd77::3/64 ──┘   in gsmhosts-<pid>-<test>-sw
//! ```
//!
//! Every interface is made inside its namespace (the veth pairs are created in the switch
//! namespace with their other end put straight into a host), so the root namespace is never
//! changed. Names carry the test's pid, so concurrent runs do not collide; namespaces left by
//! an earlier run whose process is gone are deleted first.
//!
//! Like `tests/rack.rs` this file is its own driver (`harness = false`): run without
//! `HOSTS_SCENARIO` it builds the hosts and starts itself once per host with `ip netns exec`;
//! run with it, it is one rank playing that scenario.
//!
//! It needs root and working network namespaces. Without them the test prints a loud
//! `skipped:` line and passes, unless `GSM_REQUIRE_NETNS=1` (as in `scripts/test.sh`, which CI
//! runs as root), where it fails naming what is missing. `HOSTS_IP` names the `ip` program to
//! use (default `ip`); the first test points it at a file that does not exist to check both
//! ways, and runs everywhere.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gossamer::{Rack, Trust};

mod common;

/// Ranks, and hosts: one rank per host.
const HOSTS: usize = 3;
/// Where rank 0 listens, in its own namespace (no other process can hold the port there).
const COORD_PORT: u16 = 7000;
/// The silence after which a rank is lost, and the heartbeat, in the link-down tests.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);
const HEARTBEAT: &str = "100ms";
/// The prefix of every namespace these tests make.
const PREFIX: &str = "gsmhosts-";

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("HOSTS_SCENARIO") {
        return Rack::from_env().run(move || play(&scenario));
    }
    let filters = common::filters();
    // Name, test, and whether it needs network namespaces.
    let tests: &[(&str, fn(), bool)] = &[
        (
            "without_netns_it_skips_loudly_or_fails_if_required",
            skips_or_fails_without_netns,
            false,
        ),
        ("calls_across_3_hosts_add_up", calls_across_hosts, true),
        (
            "a_host_whose_link_goes_down_is_named_by_the_others",
            a_link_goes_down,
            true,
        ),
        (
            "the_coordinators_host_going_down_is_named_too",
            the_coordinators_link_goes_down,
            true,
        ),
    ];
    let mut chosen: Vec<_> = tests
        .iter()
        .filter(|(name, _, _)| common::selected(&filters, name))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    if chosen.iter().any(|&&(_, _, netns)| netns) {
        remove_leftovers();
        if let Err(missing) = netns_available() {
            if std::env::var("GSM_REQUIRE_NETNS").as_deref() == Ok("1") {
                println!(
                    "test hosts ... FAILED: GSM_REQUIRE_NETNS=1 but network namespaces cannot \
                     be used: {missing}"
                );
                failed += 1;
            } else {
                println!(
                    "\n*** skipped: the multi-host tests (tests/hosts.rs) did not run: \
                     {missing}. They need root and `ip netns` (iproute2); set \
                     GSM_REQUIRE_NETNS=1 to make this a failure. ***\n"
                );
            }
            chosen.retain(|&&(_, _, netns)| !netns);
        }
    }
    for &(name, test, _) in chosen {
        if common::run_one(name, test) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    common::conclude("hosts", passed, failed)
}

// ---------------------------------------------------------------------------------------------
// The ranks

/// What one rank does (only rank 0 runs this; the others serve).
fn play(scenario: &str) {
    match scenario {
        "sums" => sums(),
        "talk" => talk(),
        other => panic!("unknown scenario {other}"),
    }
}

/// The addresses of the hosts, rank by rank.
fn host_addrs() -> Vec<String> {
    (0..HOSTS).map(|h| Net::addr(h).to_string()).collect()
}

/// Each rank's own counter, entrusted by that rank.
fn counters() -> Vec<Trust<u64>> {
    gossamer::nodes()
        .map(|n| gossamer::spawn_on(n, |()| gossamer::entrust(0u64), ()).join())
        .collect()
}

fn sums() {
    let nodes: Vec<_> = gossamer::nodes().collect();
    assert_eq!(nodes.len(), HOSTS);
    // Each rank runs on its own host: it can bind its host's address and no other.
    for n in &nodes {
        let (rank, bindable) = gossamer::spawn_on(
            *n,
            |addrs: Vec<String>| {
                let bindable: Vec<bool> = addrs
                    .iter()
                    .map(|a| std::net::TcpListener::bind((a.as_str(), 0)).is_ok())
                    .collect();
                (gossamer::this_node().rank(), bindable)
            },
            host_addrs(),
        )
        .join();
        let expected: Vec<bool> = (0..HOSTS).map(|h| h == n.rank() as usize).collect();
        assert_eq!(
            (rank, &bindable),
            (n.rank(), &expected),
            "which host addresses rank {} can bind",
            n.rank()
        );
    }
    let counters = counters();
    for (c, n) in counters.iter().zip(&nodes) {
        assert_eq!(c.node(), *n);
        c.apply_with(|v, x: u64| *v += x, 1);
    }
    // Every rank adds rank + 1 to every counter 100 times, pipelined: calls cross every pair
    // of hosts in both directions at once.
    let adders: Vec<_> = nodes
        .iter()
        .map(|n| {
            gossamer::spawn_on(
                *n,
                |cs: Vec<Trust<u64>>| {
                    let add = u64::from(gossamer::this_node().rank()) + 1;
                    let group = gossamer::Group::new();
                    for _ in 0..100 {
                        for c in &cs {
                            c.apply_then_with(|v, x: u64| *v += x, add, group.track(|()| {}));
                        }
                    }
                    group.wait();
                },
                counters.clone(),
            )
        })
        .collect();
    adders.into_iter().for_each(|a| a.join());
    let each = 1 + 100 * (1..=HOSTS as u64).sum::<u64>();
    for (c, n) in counters.iter().zip(&nodes) {
        assert_eq!(c.apply(|v| *v), each, "the counter of rank {}", n.rank());
    }
    // And read from the last host, through the others.
    let last = *nodes.last().unwrap();
    let total = gossamer::spawn_on(
        last,
        |cs: Vec<Trust<u64>>| cs.iter().map(|c| c.apply(|v| *v)).sum::<u64>(),
        counters.clone(),
    )
    .join();
    assert_eq!(total, each * HOSTS as u64);
    println!("sums ok on {HOSTS} hosts");
}

/// Every rank calls every rank's tally, 50 rounds a second, until the job ends; rank 0 says
/// `talking` once every rank has called every rank a few times.
fn talk() {
    // tallies[t][r]: how many calls rank r made to rank t.
    let tallies: Vec<Trust<Vec<u64>>> = gossamer::nodes()
        .map(|n| gossamer::spawn_on(n, |()| gossamer::entrust(vec![0u64; HOSTS]), ()).join())
        .collect();
    let _talkers: Vec<_> = gossamer::nodes()
        .map(|n| gossamer::spawn_on(n, talk_forever, tallies.clone()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tallies
        .iter()
        .any(|t| t.apply(|calls| calls.iter().any(|&n| n < 5)))
    {
        assert!(Instant::now() < deadline, "the ranks never all talked");
        pause(Duration::from_millis(20));
    }
    println!("talking");
    // Calls go on (and hang on the lost host) until the job ends.
    loop {
        for t in &tallies {
            t.apply(|calls| calls.iter().sum::<u64>());
        }
        pause(Duration::from_millis(50));
    }
}

fn talk_forever(tallies: Vec<Trust<Vec<u64>>>) {
    let me = gossamer::this_node().rank();
    loop {
        for t in &tallies {
            t.apply_with(|calls, r: u32| calls[r as usize] += 1, me);
        }
        pause(Duration::from_millis(20));
    }
}

/// Suspends the calling fiber (not its worker, which keeps serving its links) for `d`.
fn pause(d: Duration) {
    struct Pause {
        until: Instant,
        timer: bool,
    }
    impl Future for Pause {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let now = Instant::now();
            if now >= self.until {
                return Poll::Ready(());
            }
            if !self.timer {
                self.timer = true;
                let (waker, left) = (cx.waker().clone(), self.until - now);
                std::thread::spawn(move || {
                    std::thread::sleep(left);
                    waker.wake();
                });
            }
            Poll::Pending
        }
    }
    gossamer::block_on(Pause {
        until: Instant::now() + d,
        timer: false,
    });
}

// ---------------------------------------------------------------------------------------------
// The hosts

/// The `ip` program.
fn ip_program() -> String {
    std::env::var("HOSTS_IP").unwrap_or_else(|_| "ip".into())
}

/// How long one `ip` command may take.
const IP_LIMIT: Duration = Duration::from_secs(10);

/// Runs `ip args`, at most `IP_LIMIT`; its output, or what went wrong.
fn ip(args: &[&str]) -> Result<String, String> {
    let command = format!("`{} {}`", ip_program(), args.join(" "));
    let mut child = Command::new(ip_program())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command}: {e}"))?;
    let (stdout, out_reader) = collect(child.stdout.take().unwrap());
    let (stderr, err_reader) = collect(child.stderr.take().unwrap());
    let deadline = Instant::now() + IP_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                child.kill().ok();
                child.wait().ok();
                return Err(format!(
                    "{command} did not finish within {IP_LIMIT:?} (killed)"
                ));
            }
            Err(e) => return Err(format!("waiting for {command}: {e}")),
        }
    };
    out_reader.join().ok();
    err_reader.join().ok();
    let text = |s: Arc<Mutex<String>>| s.lock().unwrap().clone();
    if !status.success() {
        return Err(format!(
            "{command} failed ({status}): {}",
            text(stderr).trim()
        ));
    }
    Ok(text(stdout))
}

/// Whether these tests can run here; what is missing if not.
fn netns_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(format!(
            "not running as root (effective uid {uid}), and making network namespaces needs root"
        ));
    }
    ip(&["-V"]).map_err(|e| format!("{e} (Debian: apt-get install iproute2)"))?;
    // The real check: the whole topology, made and deleted.
    Net::new("probe").map(drop)
}

/// The namespaces this process has made, deleted on drop.
struct Net {
    switch: String,
    hosts: Vec<String>,
    /// Every namespace made so far, to delete even after a half-built topology.
    made: Vec<String>,
}

impl Net {
    /// The address of host `h`.
    fn addr(h: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 77, 0, h as u8 + 1)
    }

    /// The IPv6 address of host `h`.
    fn addr6(h: usize) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, h as u16 + 1)
    }

    /// Builds the switch and the hosts; `tag` tells this topology from the others of the run.
    fn new(tag: &str) -> Result<Net, String> {
        let name = |part: &str| format!("{PREFIX}{}-{tag}-{part}", std::process::id());
        let mut net = Net {
            switch: name("sw"),
            hosts: (0..HOSTS).map(|h| name(&format!("h{h}"))).collect(),
            made: Vec::new(),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&mut self) -> Result<(), String> {
        let sw = self.switch.clone();
        self.add_namespace(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for (h, host) in self.hosts.clone().iter().enumerate() {
            self.add_namespace(host)?;
            let port = format!("p{h}");
            // Made in the switch, its other end put straight into the host.
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                host,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", Net::addr(h));
            ip(&["-n", host, "addr", "add", &cidr, "dev", "eth0"])?;
            // No duplicate address detection: the address is usable at once, not in a second.
            let cidr6 = format!("{}/64", Net::addr6(h));
            ip(&["-n", host, "addr", "add", &cidr6, "dev", "eth0", "nodad"])?;
            ip(&["-n", host, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    fn add_namespace(&mut self, ns: &str) -> Result<(), String> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Unplugs host `h`: its port on the switch goes down, so nothing more passes either way
    /// and no end of the link sees a reset or a close.
    fn unplug(&self, h: usize) {
        let port = format!("p{h}");
        ip(&["-n", &self.switch, "link", "set", &port, "down"])
            .unwrap_or_else(|e| panic!("unplugging host {h}: {e}"));
    }

    /// The processes inside namespace `ns`.
    fn pids(ns: &str) -> Vec<i32> {
        ip(&["netns", "pids", ns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            // Only this test's ranks can be in its namespaces; a namespace is freed only once
            // they are gone.
            for pid in Net::pids(ns) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("hosts: could not delete namespace {ns}: {e}");
            }
        }
    }
}

/// Deletes the namespaces of earlier runs whose process is gone (killed before its guards
/// ran), so they do not pile up.
fn remove_leftovers() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = ns
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match ip(&["netns", "del", ns]) {
                Ok(_) => eprintln!("hosts: deleted namespace {ns}, left by an earlier run"),
                Err(e) => eprintln!("hosts: could not delete leftover namespace {ns}: {e}"),
            }
        }
    }
}

/// The names of the root namespace's interfaces.
fn root_links() -> BTreeSet<String> {
    ip(&["-o", "link", "show"])
        .expect("listing the root namespace's interfaces")
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|name| name.trim().split('@').next().unwrap_or("").to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Jobs

/// One rank's process, with its output collected as it comes.
struct RankProcess {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl RankProcess {
    /// Collects the output of `child`, started with both piped.
    fn new(mut child: Child) -> RankProcess {
        let (stdout, out_reader) = collect(child.stdout.take().expect("a piped stdout"));
        let (stderr, err_reader) = collect(child.stderr.take().expect("a piped stderr"));
        RankProcess {
            child,
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
        }
    }
}

/// A job of one rank per host; every rank still running is killed on drop.
struct Job {
    ranks: Vec<RankProcess>,
}

/// How a rank ended.
struct Ended {
    status: ExitStatus,
    at: Instant,
    stdout: String,
    stderr: String,
}

fn collect(mut from: impl std::io::Read + Send + 'static) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let into = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}

impl Job {
    /// Starts rank `h` on host `h`, for every host, playing `scenario`, with rank 0 listening
    /// at `coord`. In the values of `extra`, `{addr}` and `{addr6}` stand for the host's
    /// addresses.
    fn start(net: &Net, scenario: &str, coord: &str, extra: &[(&str, String)]) -> Job {
        let exe = std::env::current_exe().expect("this test's path");
        let mut job = Job { ranks: Vec::new() };
        for (h, host) in net.hosts.iter().enumerate() {
            let mut cmd = Command::new(ip_program());
            cmd.args(["netns", "exec", host]).arg(&exe);
            // Only this job's settings: none of the launchers' variables of the test's own
            // environment.
            for (k, _) in std::env::vars() {
                if ["GSM_", "OMPI_", "SLURM_", "PMI_", "PMIX_"]
                    .iter()
                    .any(|p| k.starts_with(p))
                {
                    cmd.env_remove(k);
                }
            }
            cmd.env("HOSTS_SCENARIO", scenario)
                .env("GSM_RANK", h.to_string())
                .env("GSM_SIZE", HOSTS.to_string())
                .env("GSM_COORD", coord)
                .env("GSM_JOB", format!("{:x}", std::process::id()))
                .env("GSM_SECRET", "hosts-secret")
                .env("GSM_WORKERS", "2")
                .env("GSM_CONNECT_TIMEOUT", "20s");
            for (k, v) in extra {
                let v = v
                    .replace("{addr}", &Net::addr(h).to_string())
                    .replace("{addr6}", &Net::addr6(h).to_string());
                cmd.env(k, v);
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting rank {h} in {host}: {e}"));
            job.ranks.push(RankProcess::new(child));
        }
        job
    }

    /// Everything every rank has written to stderr so far, for failure messages.
    fn stderr(&self) -> String {
        let mut all = String::new();
        for (r, rank) in self.ranks.iter().enumerate() {
            all.push_str(&format!(
                "--- rank {r} stderr:\n{}",
                rank.stderr.lock().unwrap()
            ));
        }
        all
    }

    /// Waits until rank `r` has printed `line`, at most `limit`.
    fn wait_for_line(&mut self, r: usize, line: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.ranks[r].stdout.lock().unwrap().contains(line) {
            if let Some(status) = self.ranks[r].child.try_wait().unwrap() {
                panic!(
                    "rank {r} ended ({status}) before printing {line:?}\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "rank {r} did not print {line:?} within {limit:?}\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for every rank to end, at most `limit`; when each ended, and what it printed.
    fn finish(mut self, limit: Duration) -> Vec<Ended> {
        let deadline = Instant::now() + limit;
        let mut ended: Vec<Option<(ExitStatus, Instant)>> = vec![None; self.ranks.len()];
        while ended.iter().any(Option::is_none) {
            for (r, rank) in self.ranks.iter_mut().enumerate() {
                if ended[r].is_none()
                    && let Some(status) = rank.child.try_wait().unwrap()
                {
                    ended[r] = Some((status, Instant::now()));
                }
            }
            if Instant::now() > deadline {
                let running: Vec<usize> =
                    (0..ended.len()).filter(|&r| ended[r].is_none()).collect();
                panic!(
                    "rank(s) {running:?} still running after {limit:?} (killed)\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Each reader ends when its pipe closes, which the rank's end did.
        let ranks = std::mem::take(&mut self.ranks);
        ranks
            .into_iter()
            .zip(ended)
            .map(|(rank, ended)| {
                let (status, at) = ended.expect("every rank ended");
                for reader in rank.readers {
                    reader.join().expect("an output reader");
                }
                let text = |s: &Arc<Mutex<String>>| s.lock().unwrap().clone();
                Ended {
                    status,
                    at,
                    stdout: text(&rank.stdout),
                    stderr: text(&rank.stderr),
                }
            })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for rank in &mut self.ranks {
            if matches!(rank.child.try_wait(), Ok(None)) {
                rank.child.kill().ok();
            }
            rank.child.wait().ok();
        }
    }
}

/// Checks that no process is left in any of the test's namespaces.
fn assert_no_process_left(net: &Net) {
    for ns in net.hosts.iter().chain([&net.switch]) {
        let pids = Net::pids(ns);
        assert!(pids.is_empty(), "processes {pids:?} are left in {ns}");
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

/// Runs this driver with `ip` missing, as on a machine without iproute2: it must skip loudly
/// and pass, or, with `GSM_REQUIRE_NETNS=1`, fail saying what is missing.
fn skips_or_fails_without_netns() {
    for required in [false, true] {
        let mut cmd = Command::new(std::env::current_exe().expect("this test's path"));
        cmd.arg("calls_across_3_hosts_add_up")
            .env("HOSTS_IP", "/nonexistent/ip")
            .env_remove("HOSTS_SCENARIO")
            .env_remove("GSM_REQUIRE_NETNS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if required {
            cmd.env("GSM_REQUIRE_NETNS", "1");
        }
        let child = cmd.spawn().expect("starting this driver without ip");
        let job = Job {
            ranks: vec![RankProcess::new(child)],
        };
        let ended = job.finish(Duration::from_secs(20)).remove(0);
        let said = format!("stdout:\n{}\nstderr:\n{}", ended.stdout, ended.stderr);
        assert!(
            ended.stdout.contains("cannot run `/nonexistent/ip -V`"),
            "required={required}: what is missing is named\n{said}"
        );
        assert!(
            !ended.stdout.contains("test calls_across_3_hosts_add_up"),
            "required={required}: the test itself must not run\n{said}"
        );
        if required {
            assert_eq!(ended.status.code(), Some(1), "{said}");
            assert!(
                ended.stdout.contains("FAILED: GSM_REQUIRE_NETNS=1"),
                "{said}"
            );
        } else {
            assert!(ended.status.success(), "{said}");
            assert!(ended.stdout.contains("*** skipped: "), "{said}");
        }
    }
}

fn calls_across_hosts() {
    let root_before = root_links();
    let net = Net::new("sums").unwrap_or_else(|e| panic!("building the hosts: {e}"));
    let v4 = format!("{}:{COORD_PORT}", Net::addr(0));
    let v6 = format!("[{}]:{COORD_PORT}", Net::addr6(0));
    // Listening on all interfaces (the default off loopback), then on the host's own address;
    // over IPv4 and over IPv6.
    let runs = [
        (&v4, vec![]),
        (&v4, vec![("GSM_HOST", "{addr}".to_string())]),
        (&v6, vec![]),
        (&v6, vec![("GSM_HOST", "{addr6}".to_string())]),
    ];
    for (coord, extra) in runs {
        let started = Instant::now();
        let job = Job::start(&net, "sums", coord, &extra);
        let results = job.finish(Duration::from_secs(45));
        let all: String = results
            .iter()
            .enumerate()
            .map(|(r, e)| format!("--- rank {r} stderr:\n{}", e.stderr))
            .collect();
        for (r, e) in results.iter().enumerate() {
            assert!(
                e.status.success(),
                "{coord} {extra:?}: rank {r} {}\n{all}",
                e.status
            );
        }
        assert!(
            results[0].stdout.contains("sums ok on 3 hosts"),
            "{coord} {extra:?}: rank 0 printed {:?}",
            results[0].stdout
        );
        assert_no_process_left(&net);
        println!(
            "  GSM_COORD={coord} {extra:?}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let root_after = root_links();
    assert_eq!(
        root_before, root_after,
        "the root namespace's interfaces changed"
    );
}

fn a_link_goes_down() {
    unplug_host(2);
}

fn the_coordinators_link_goes_down() {
    unplug_host(0);
}

/// Runs a job that talks on every pair of hosts, unplugs host `lost`, and checks that every
/// other rank names it, and that every rank ends with `EXIT_PEER_LOST` in time.
fn unplug_host(lost: usize) {
    let net =
        Net::new(&format!("down{lost}")).unwrap_or_else(|e| panic!("building the hosts: {e}"));
    let extra = [
        (
            "GSM_PEER_TIMEOUT",
            format!("{}ms", PEER_TIMEOUT.as_millis()),
        ),
        ("GSM_HEARTBEAT", HEARTBEAT.to_string()),
    ];
    let coord = format!("{}:{COORD_PORT}", Net::addr(0));
    let mut job = Job::start(&net, "talk", &coord, &extra);
    job.wait_for_line(0, "talking", Duration::from_secs(40));
    let unplugged = Instant::now();
    net.unplug(lost);
    let results = job.finish(Duration::from_secs(10));
    let all: String = results
        .iter()
        .enumerate()
        .map(|(r, e)| format!("--- rank {r} stderr:\n{}", e.stderr))
        .collect();
    let bound = PEER_TIMEOUT + Duration::from_secs(1);
    for (r, e) in results.iter().enumerate() {
        assert_eq!(
            e.status.code(),
            Some(gossamer::EXIT_PEER_LOST.into()),
            "rank {r} ({}) should exit with EXIT_PEER_LOST\n{all}",
            e.status
        );
        let took = e.at.saturating_duration_since(unplugged);
        assert!(
            took <= bound,
            "rank {r} took {took:?} to end, more than GSM_PEER_TIMEOUT + 1 s\n{all}"
        );
        let lines: Vec<&str> = e
            .stderr
            .lines()
            .filter(|l| l.contains("lost rank"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "rank {r} should print one line naming the rank it lost\n{all}"
        );
        let line = lines[0];
        assert!(
            line.contains("GSM_PEER_TIMEOUT"),
            "rank {r} says why: {line}"
        );
        if r != lost {
            assert!(
                line.contains(&format!("gossamer: rank {r}: lost rank {lost}: silent for")),
                "rank {r} names rank {lost}: {line}"
            );
        } else {
            // The unplugged rank loses everyone; it names one of them.
            assert!(
                (0..HOSTS)
                    .filter(|&o| o != lost)
                    .any(|o| line.contains(&format!("rank {lost}: lost rank {o}: silent for"))),
                "rank {lost} names a rank it lost: {line}"
            );
        }
    }
    assert_no_process_left(&net);
    for (r, e) in results.iter().enumerate() {
        let line = e.stderr.lines().find(|l| l.contains("lost rank"));
        println!(
            "  rank {r} ended {:?} after the unplug: {}",
            e.at.saturating_duration_since(unplugged),
            line.unwrap_or_default()
        );
    }
}
