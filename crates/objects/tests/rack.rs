//! Objects across the ranks of a rack, on TCP and on shared memory: the README's examples,
//! a ring with a slow reader, a bank of accounts under striped locks, and the ways opening an
//! object fails (late, mismatched, missing, duplicate, closed under load); the barrier example
//! once more under `mpirun`.
//!
//! Its own driver (`harness = false`), as the rack's tests: run without `RACK_SCENARIO` it
//! starts itself once per rank. The ring's messages (5,000 to each reader) and the bank's
//! transfers (8,000) are kept small for the test command; `OBJECTS_SCALE=20` multiplies them
//! to the 10⁵ for a run by hand.

use std::process::Command;
use std::time::{Duration, Instant};

use gossamer::{Node, Rack};
use objects::{LockArray, OpenError, Ring, RingParams, SharedArray, SharedVar, Work};

/// The README's examples, run as written.
#[path = "../examples/barrier.rs"]
mod barrier_example;
#[path = "../../gossamer/tests/common/mod.rs"]
mod common;
#[path = "../examples/ring.rs"]
mod ring_example;

use common::job::{Job, finish, start};

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        match scenario.as_str() {
            "example-barrier" => return barrier_example::main(),
            "example-ring" => return ring_example::main(),
            _ => {}
        }
        return Rack::from_env().run(move || match scenario.as_str() {
            "ring" => ring(),
            "bank" => bank(),
            "opening" => opening(),
            "missing" => missing(),
            "close-under-load" => close_under_load(),
            "maps" => maps(),
            other => panic!("unknown scenario {other}"),
        });
    }
    let tests: &[(&str, fn())] = &[
        ("the_readme_barrier_runs_on_3_ranks", || {
            run(
                3,
                "example-barrier",
                "barrier: 100 rounds on 3 members",
                &[],
            )
        }),
        ("the_readme_ring_runs_on_3_ranks", || {
            run(3, "example-ring", "ring: [0, 10000, 10000]", &[])
        }),
        ("a_ring_to_3_nodes_with_a_slow_reader", || {
            run(4, "ring", "ring ok", &[])
        }),
        ("transfers_under_striped_locks_keep_the_total", || {
            run(3, "bank", "bank ok", &[])
        }),
        ("late_mismatched_and_duplicate_opens", || {
            run(3, "opening", "opening ok", &[])
        }),
        ("a_member_that_never_opens_is_named", || {
            run(
                3,
                "missing",
                "missing ok",
                &[("GSM_OBJECT_TIMEOUT", "1s".into())],
            )
        }),
        ("closing_under_load_then_reopening", || {
            run(3, "close-under-load", "close ok", &[])
        }),
        ("dmap_and_shardmap_agree_across_members", || {
            run(3, "maps", "maps ok", &[])
        }),
    ];
    let before = common::job::on_each_transport(tests);
    common::conclude_after(
        "objects rack",
        before,
        &[("mpirun_runs_the_barrier_example", mpirun_barrier)],
    )
}

/// Runs `scenario` on `size` ranks; every rank must exit 0 and rank 0 print `ok`, whose line
/// is printed.
fn run(size: usize, scenario: &str, ok: &str, extra: &[(&str, String)]) {
    let results = finish(start(size, scenario, extra), Duration::from_secs(180));
    common::all_succeed(&results, ok);
    let line = results[0].1.lines().find(|l| l.contains(ok)).unwrap_or(ok);
    println!("  {line}");
}

fn scale() -> u64 {
    std::env::var("OBJECTS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(1)
}

fn members() -> Vec<Node> {
    gossamer::nodes().collect()
}

/// Message `i`: 0 to 4096 bytes, each a function of `i` and its place.
fn message(i: u64) -> Vec<u8> {
    let len = (i.wrapping_mul(2_654_435_761) % 4097) as usize;
    (0..len)
        .map(|j| (i as u8).wrapping_mul(31).wrapping_add(j as u8))
        .collect()
}

/// Member 0 writes, members 1–3 read every message in order and check its bytes; member 3
/// is slow (it sleeps its worker now and then), so the writer must wait for it and never
/// write over what it has not read.
fn ring() {
    let received = objects::on_members(&members(), |members| {
        let count = messages();
        let params = RingParams {
            writer: 0,
            capacity: 2048,
        };
        match objects::open::<Ring>("test/ring", &params, &members).expect("open the ring") {
            Ring::Writer(mut w) => {
                let mut full = 0u64;
                for i in 0..count {
                    loop {
                        match w.try_send(&message(i)) {
                            Ok(()) => break,
                            Err(objects::SendError::Full) => {
                                full += 1;
                                gossamer::yield_now();
                            }
                            Err(e) => panic!("send {i}: {e}"),
                        }
                    }
                }
                full
            }
            Ring::Reader(mut r) => {
                let slow = r_is_last(&members);
                for i in 0..count {
                    if slow && i % 1000 == 0 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let got = r.recv().expect("recv");
                    assert!(got == message(i), "message {i}: {} bytes, wrong", got.len());
                }
                count
            }
        }
    });
    assert!(
        received[0] > 0,
        "the writer never found the ring full: the slow reader was not slow"
    );
    println!(
        "ring ok: {} messages of 0-4096 bytes to 3 readers, the writer found it full {} times",
        messages(),
        received[0]
    );
}

/// Messages of the ring test.
fn messages() -> u64 {
    5_000 * scale()
}

fn r_is_last(members: &[Node]) -> bool {
    gossamer::this_node() == *members.last().expect("members")
}

/// A user's own object: `per_member` balances on each member.
struct Accounts {
    balances: objects::Regions<objects::Rack>,
}

impl objects::Object for Accounts {
    type Params = usize;

    fn declare(d: &mut objects::Declare, per_member: &usize) {
        d.region("balances", *per_member, objects::On::EachMember);
    }

    fn build(parts: objects::Parts<objects::Rack>, _: &usize) -> Result<Self, OpenError> {
        Ok(Accounts {
            balances: parts.region("balances"),
        })
    }
}

impl Accounts {
    /// Account `a` lives on member `a % members`, at word `a / members`.
    fn at(&self, a: usize) -> (usize, usize) {
        let n = self.balances.members();
        (a % n, a / n)
    }

    fn get(&self, a: usize) -> u64 {
        let (m, i) = self.at(a);
        self.balances.get(m, i, 1).expect("a balance")[0]
    }

    fn put(&self, a: usize, v: u64) {
        let (m, i) = self.at(a);
        self.balances.put(m, i, &[v], &Work::new());
    }
}

/// Accounts spread over the members, transfers between two of them under their locks (taken
/// in order of number), from 4 fibers on each member at once; afterwards every member counts
/// the same total as at the start, and nothing deadlocked.
fn bank() {
    const ACCOUNTS: usize = 64;
    const START: u64 = 1000;
    const FIBERS: u64 = 4;
    let totals = objects::on_members(&members(), |members| {
        let transfers = 8_000 * scale();
        let n = members.len();
        let accounts = objects::open::<Accounts>("test/accounts", &ACCOUNTS.div_ceil(n), &members)
            .expect("open");
        let locks = objects::open::<LockArray>("test/locks", &ACCOUNTS, &members).expect("open");
        let mut barrier =
            objects::open::<objects::Barrier>("test/bank-barrier", &(), &members).expect("open");
        let me = accounts.balances.me();
        for a in (0..ACCOUNTS).filter(|a| a % n == me) {
            accounts.balances.store(a / n, START);
        }
        barrier.wait().expect("barrier");
        let shared = std::sync::Arc::new((accounts, locks));
        let per_fiber = transfers / n as u64 / FIBERS;
        let fibers: Vec<_> = (0..FIBERS)
            .map(|f| {
                let shared = shared.clone();
                gossamer::spawn(move || {
                    let (accounts, locks) = &*shared;
                    let mut rng = (me as u64 * FIBERS + f + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut done = 0;
                    for _ in 0..per_fiber {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let a = (rng % ACCOUNTS as u64) as usize;
                        let b = ((rng >> 20) % ACCOUNTS as u64) as usize;
                        if a == b {
                            continue;
                        }
                        let amount = (rng >> 40) % 50;
                        let first = locks.lock(a.min(b)).expect("lock");
                        let second = locks.lock(a.max(b)).expect("lock");
                        let from = accounts.get(a);
                        if from >= amount {
                            let to = accounts.get(b);
                            accounts.put(a, from - amount);
                            accounts.put(b, to + amount);
                        }
                        second.unlock().expect("unlock");
                        first.unlock().expect("unlock");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let done: u64 = fibers.into_iter().map(|f| f.join()).sum();
        barrier.wait().expect("barrier");
        let total: u64 = (0..ACCOUNTS).map(|a| shared.0.get(a)).sum();
        barrier.wait().expect("barrier");
        (total, done)
    });
    let expected = ACCOUNTS as u64 * START;
    for (m, (total, _)) in totals.iter().enumerate() {
        assert_eq!(*total, expected, "member {m} counted another total");
    }
    let done: u64 = totals.iter().map(|t| t.1).sum();
    println!("bank ok: {done} transfers between {ACCOUNTS} accounts, total {expected} kept");
}

/// A late member is waited for; another type or other parameters fail on both sides, naming
/// the other; a name open twice on one node fails there.
fn opening() {
    let results = objects::on_members(&members(), |members| {
        let me = gossamer::this_node().rank();
        // Late: member 1 opens a second after the others, who wait for it.
        if me == 1 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let started = Instant::now();
        let late = objects::open::<SharedArray>("test/late", &4, &members).expect("a late open");
        let waited = started.elapsed();
        drop(late);
        // Mismatch: member 2 opens with 5 words instead of 4.
        let words = if me == 2 { 5 } else { 4 };
        let err = objects::open::<SharedArray>("test/mismatch", &words, &members)
            .expect_err("a mismatched open");
        let said = err.to_string();
        assert!(matches!(err, OpenError::Mismatch { .. }), "{said}");
        // Duplicate: twice on one node.
        let once = objects::open::<SharedVar<u64>>("test/dup", &(), &members).expect("open");
        let twice = objects::open::<SharedVar<u64>>("test/dup", &(), &members)
            .expect_err("a second open of one name");
        assert!(matches!(twice, OpenError::Duplicate { .. }), "{twice}");
        drop(once);
        (waited.as_millis() as u64, said)
    });
    assert!(
        results[0].0 >= 900,
        "member 0 waited {} ms for the late member",
        results[0].0
    );
    for (m, (_, said)) in results.iter().enumerate() {
        assert!(
            said.contains("parameters 4") && said.contains("parameters 5"),
            "member {m}: {said}"
        );
        let other = if m == 2 { "rank 0" } else { "rank 2" };
        assert!(
            said.contains(other),
            "member {m} should name {other}: {said}"
        );
    }
    println!("opening ok: {}", results[0].1);
}

/// With `GSM_OBJECT_TIMEOUT=1s`, members 0 and 1 open an object member 2 never opens: both
/// fail within the timeout, naming rank 2.
fn missing() {
    let results = objects::on_members(&members(), |members| {
        if gossamer::this_node().rank() == 2 {
            return String::new();
        }
        let started = Instant::now();
        let err = objects::open::<SharedVar<u64>>("test/missing", &(), &members)
            .expect_err("an object a member never opens");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited {:?}",
            started.elapsed()
        );
        match &err {
            OpenError::Missing { ranks, .. } => assert_eq!(ranks, &[2], "{err}"),
            other => panic!("{other}"),
        }
        err.to_string()
    });
    println!("missing ok: {}", results[0]);
}

/// Readers drop their endpoints while the writer still sends; the writer finds the ring full,
/// never an error, and drops its own; then the name opens again, with other parameters.
fn close_under_load() {
    let results = objects::on_members(&members(), |members| {
        let params = RingParams {
            writer: 0,
            capacity: 2048,
        };
        let outcome = match objects::open::<Ring>("test/closing", &params, &members).expect("open")
        {
            Ring::Writer(mut w) => {
                let mut sent = 0u64;
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    match w.try_send(&message(sent)) {
                        Ok(()) => sent += 1,
                        Err(objects::SendError::Full) if sent > 1000 => break,
                        Err(objects::SendError::Full) => gossamer::yield_now(),
                        Err(e) => panic!("send {sent}: {e}"),
                    }
                    assert!(Instant::now() < deadline, "the ring never filled");
                }
                sent
            }
            Ring::Reader(mut r) => {
                for i in 0..1000 {
                    assert!(r.recv().expect("recv") == message(i), "message {i}");
                }
                1000
            }
        };
        // Every endpoint is gone now; the name opens again, as another object.
        let mut b =
            objects::open::<objects::Barrier>("test/closing-barrier", &(), &members).expect("open");
        b.wait().expect("barrier");
        let again = objects::open::<SharedArray>("test/closing", &3, &members).expect("reopen");
        again.store(0, 1);
        b.wait().expect("barrier");
        outcome
    });
    println!(
        "close ok: the writer sent {} before the ring filled",
        results[0]
    );
}

/// Every member inserts its own keys into a `DMap` and a `ShardMap`, updates them, removes
/// every third, and reads the keys of a neighbour meanwhile (lock-free gets racing with its
/// writes); after a barrier every member reads every key and finds the same, expected values
/// in both maps.
fn maps() {
    let nodes = members();
    let shard_map = objects::ShardMap::new(&nodes, 1);
    let counts = objects::on_members(&nodes, |members| {
        const KEYS: u64 = 60;
        let params = objects::DMapParams {
            slots: 128,
            locks: 16,
        };
        let map = objects::open::<objects::DMap>("test/map", &params, &members).expect("open");
        let mut barrier =
            objects::open::<objects::Barrier>("test/map-barrier", &(), &members).expect("open");
        let (me, n) = (barrier.me() as u64, members.len() as u64);
        let expected =
            |m: u64, k: u64| (!k.is_multiple_of(3)).then_some(m * 1_000_000 + k * 10 + 1);
        barrier.wait().expect("barrier");
        // New keys from 4 fibers of this member at once: their tracker messages and waits
        // for acknowledgement overlap.
        let map = std::sync::Arc::new(map);
        let inserters: Vec<_> = (0..4)
            .map(|f| {
                let map = map.clone();
                gossamer::spawn(move || {
                    let neighbour = (me + 1) % n;
                    for k in (f..KEYS).step_by(4) {
                        let key = me * 1000 + k;
                        assert_eq!(
                            map.insert(key, me * 1_000_000 + k * 10).expect("insert"),
                            None
                        );
                        // A neighbour's key: absent, or one of the values it is given.
                        let theirs = map.get(neighbour * 1000 + k).expect("get");
                        assert!(
                            theirs.is_none_or(|v| v / 1_000_000 == neighbour),
                            "member {me} read {theirs:?} for key {k} of member {neighbour}"
                        );
                    }
                })
            })
            .collect();
        inserters.into_iter().for_each(|f| f.join());
        for k in 0..KEYS {
            let key = me * 1000 + k;
            map.insert(key, me * 1_000_000 + k * 10 + 1)
                .expect("update");
            if k.is_multiple_of(3) {
                assert_eq!(
                    map.remove(key).expect("remove"),
                    Some(me * 1_000_000 + k * 10 + 1)
                );
            }
        }
        barrier.wait().expect("barrier");
        let mut checked = 0;
        for m in 0..n {
            for k in 0..KEYS {
                assert_eq!(
                    map.get(m * 1000 + k).expect("get"),
                    expected(m, k),
                    "key {k} of {m}"
                );
                checked += 1;
            }
        }
        barrier.wait().expect("barrier");
        checked
    });
    // The delegated twin, from rank 0's fibers: the same writes, the same reads.
    let fibers: Vec<_> = (0..nodes.len() as u64)
        .map(|m| {
            let map = shard_map.clone();
            gossamer::spawn(move || {
                for k in 0..60u64 {
                    map.insert(m * 1000 + k, m * 1_000_000 + k * 10 + 1);
                    if k.is_multiple_of(3) {
                        map.remove(m * 1000 + k);
                    }
                }
            })
        })
        .collect();
    fibers.into_iter().for_each(|f| f.join());
    for m in 0..nodes.len() as u64 {
        for k in 0..60u64 {
            let want = (!k.is_multiple_of(3)).then_some(m * 1_000_000 + k * 10 + 1);
            assert_eq!(shard_map.get(m * 1000 + k), want);
        }
    }
    println!(
        "maps ok: every member read {} keys of the DMap as written, and the ShardMap agrees",
        counts[0]
    );
}

/// The barrier example under `mpirun -n 3` (Open MPI), on the transport of the tests.
fn mpirun_barrier() {
    // scripts/test.sh installs Open MPI; elsewhere the test says it was skipped.
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("skipped: mpirun is not installed (Debian: openmpi-bin)");
        return;
    }
    let mut cmd = common::job::bare("mpirun".as_ref(), "example-barrier");
    cmd.args(["--oversubscribe", "--allow-run-as-root", "-n", "3"])
        .args([
            "-x",
            "RACK_SCENARIO",
            "-x",
            "GSM_SECRET",
            "-x",
            "GSM_WORKERS",
        ])
        .arg(std::env::current_exe().unwrap());
    let job = Job {
        children: vec![cmd.spawn().expect("start mpirun")],
    };
    let (status, stdout, stderr) = finish(job, Duration::from_secs(120)).remove(0);
    assert!(status.success(), "mpirun {status}: {stderr}");
    assert!(
        stdout.contains("barrier: 100 rounds on 3 members"),
        "{stdout}{stderr}"
    );
    println!("  mpirun: barrier: 100 rounds on 3 members");
}
