//! Multi-host tests of the rack: three hosts, each a network namespace joined to a switch,
//! built fresh for each test and deleted after it (see `common/netns.rs`).
//!
//! Like `tests/rack.rs` this file is its own driver (`harness = false`): run without
//! `HOSTS_SCENARIO` it builds the hosts and starts itself once per host with `ip netns exec`;
//! run with it, it is one rank playing that scenario.
//!
//! It needs root and working network namespaces; without them it skips loudly, or fails
//! under `GSM_REQUIRE_NETNS=1`. The first test points `HOSTS_IP` at a file that does not
//! exist to check both ways, and runs everywhere.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gossamer::{Rack, Trust};

mod common;
// Only the tests that make hosts take this module (it needs `libc`).
#[path = "common/netns.rs"]
mod netns;

use netns::{HOSTS, Net, collect, ip_program, root_links};
#[path = "common/pause.rs"]
mod pause;
use pause::pause;

/// Where rank 0 listens, in its own namespace (no other process can hold the port there).
const COORD_PORT: u16 = 7000;
/// The silence after which a rank is lost, and the heartbeat, in the link-down tests.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);
const HEARTBEAT: &str = "100ms";

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
        #[cfg(feature = "ucx")]
        (
            "calls_across_3_hosts_add_up [ucx/tcp]",
            || on_ucx("tcp", calls_across_hosts),
            true,
        ),
        // UCX's shared memory reaches across network namespaces, but its wake-ups (a Unix
        // socket in the abstract namespace, which is per network namespace) do not: a rank
        // that sleeps wakes at its next heartbeat, so this one takes seconds, not tenths.
        #[cfg(feature = "ucx")]
        (
            "calls_across_3_hosts_add_up [ucx/sm]",
            || on_ucx("sm", calls_across_hosts),
            true,
        ),
        #[cfg(feature = "ucx")]
        (
            "a_host_whose_link_goes_down_is_named_by_the_others [ucx/tcp]",
            || on_ucx("tcp", a_link_goes_down),
            true,
        ),
        #[cfg(feature = "ucx")]
        (
            "a_host_whose_link_goes_down_is_named_by_the_others [ucx/sm]",
            || on_ucx("sm", a_link_goes_down),
            true,
        ),
    ];
    let mut chosen: Vec<_> = tests
        .iter()
        .filter(|(name, _, _)| common::selected(&filters, name))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    if chosen.iter().any(|&&(_, _, netns)| netns) {
        match netns::required("the multi-host tests (tests/hosts.rs)") {
            Ok(true) => {}
            Ok(false) => chosen.retain(|&&(_, _, netns)| !netns),
            Err(why) => {
                println!("test hosts ... FAILED: {why}");
                failed += 1;
                chosen.retain(|&&(_, _, netns)| !netns);
            }
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

/// The `UCX_TLS` the ranks of the test now running use over `GSM_TRANSPORT=ucx`, if any.
static UCX_TLS: Mutex<Option<&str>> = Mutex::new(None);

/// Runs `test` with its ranks on UCX over `tls` (`UCX_TLS`).
#[cfg(feature = "ucx")]
fn on_ucx(tls: &'static str, test: fn()) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            *UCX_TLS.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
    *UCX_TLS.lock().unwrap() = Some(tls);
    let _reset = Reset;
    test();
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

// ---------------------------------------------------------------------------------------------
// The hosts

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
            if let Some(tls) = *UCX_TLS.lock().unwrap_or_else(|p| p.into_inner()) {
                cmd.env("GSM_TRANSPORT", "ucx").env("UCX_TLS", tls);
            }
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
