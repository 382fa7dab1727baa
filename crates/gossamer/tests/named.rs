//! Functions by name across ranks, and across builds.
//!
//! Its own test driver (`harness = false`), as `rack.rs`: without `GSM_RANK` it starts jobs of
//! itself and checks them; with it, it is one rank playing `RACK_SCENARIO`. The second build
//! of the mixed-build test is a copy of this executable with its build-id note changed:
//! another build id, so every rule between builds applies, although the code is the same.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gossamer::{Function, NamedError, Rack, Trust};
use serde::{Deserialize, Serialize};

mod common;
#[path = "common/other_build.rs"]
mod other_build;

use common::{all_succeed, panic_of};

use common::job::{self, Job, finish, free_port, start};

#[gossamer::stable_type("test.Table/1")]
#[derive(Default)]
struct Table {
    rows: Vec<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct Put {
    key: u64,
    value: u64,
}

#[gossamer::function("test.put")]
fn put(t: &mut Table, p: Put) -> u64 {
    t.rows.push((p.key, p.value));
    t.rows.len() as u64
}

#[gossamer::function("test.sum")]
fn sum(t: &mut Table, (): ()) -> u64 {
    t.rows.iter().map(|r| r.1).sum()
}

#[gossamer::function("test.where")]
fn where_am_i(x: u64) -> (u64, u32) {
    (x, gossamer::this_node().rank())
}

#[gossamer::function("test.panics")]
fn panics(_: &mut Table, why: String) -> u64 {
    panic!("{why}")
}

/// Makes a table on the node it runs on and exports it under `name`.
#[gossamer::function("test.export_table")]
fn export_table(name: String) -> bool {
    gossamer::export(&name, &gossamer::entrust(Table::default())).is_ok()
}

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        return rack().run(move || play(&scenario));
    }
    let both: &[(&str, fn())] = &[
        ("named_calls_across_3_ranks", named_calls_across_3_ranks),
        (
            "first_calls_from_4_ranks_at_once",
            first_calls_from_4_ranks_at_once,
        ),
        ("mixed_builds_call_by_name_only", mixed_builds),
    ];
    let once: &[(&str, fn())] = &[
        (
            "a_duplicate_name_stops_the_node_naming_both",
            duplicate_name,
        ),
        (
            "different_builds_need_gsm_mixed_builds_on_both_sides",
            builds_need_consent,
        ),
    ];
    let before = job::on_each_transport(both);
    common::conclude_after("named", before, once)
}

/// This rank's rack, with the functions that differ by rank: rank 2 has `test.versioned`
/// with another argument type, and lacks `test.removed`. `TEST_DUPLICATE` registers a
/// second `test.put`.
fn rack() -> Rack {
    let rank = std::env::var("GSM_RANK").unwrap_or_default();
    let mut rack = Rack::from_env();
    if rank == "2" {
        rack = rack.function(Function::apply(
            "test.versioned",
            |t: &mut Table, x: u32| t.rows.len() as u64 + u64::from(x),
        ));
    } else {
        rack = rack
            .function(Function::apply(
                "test.versioned",
                |t: &mut Table, x: u64| t.rows.len() as u64 + x,
            ))
            .function(Function::free("test.removed", |x: u64| x));
    }
    if std::env::var("TEST_DUPLICATE").is_ok() {
        rack = rack.function(Function::apply("test.put", |_: &mut Table, p: Put| p.key));
    }
    rack
}

fn play(scenario: &str) {
    match scenario {
        "calls" => calls(),
        "first_calls" => first_calls(),
        "mixed" => mixed(),
        other => panic!("unknown scenario {other}"),
    }
}

fn calls() {
    let put = gossamer::named::<Table, Put, u64>("test.put").unwrap();
    let sum = gossamer::named::<Table, (), u64>("test.sum").unwrap();
    let here = gossamer::named_fn::<u64, (u64, u32)>("test.where").unwrap();
    let tables: Vec<Trust<Table>> = gossamer::nodes()
        .map(|n| n.entrust_with(|()| Table::default(), ()))
        .collect();
    for (i, t) in tables.iter().enumerate() {
        // Waiting, without waiting, and as a future: all by name.
        assert_eq!(t.apply_named(&put, Put { key: 1, value: 10 }), Ok(1));
        let group = trust::Group::new();
        for k in 2..=50 {
            let put_then = group.track(move |r: Result<u64, NamedError>| assert_eq!(r, Ok(k)));
            t.apply_then_named(&put, Put { key: k, value: 10 }, put_then);
        }
        group.wait();
        let future = t.apply_named_async(&put, Put { key: 51, value: 10 });
        assert_eq!(trust::block_on(future), Ok(51));
        assert_eq!(t.apply_named(&sum, ()), Ok(510), "table on rank {i}");
    }
    for node in gossamer::nodes() {
        let h = node.spawn_named(&here, 7);
        assert_eq!(h.join(), Ok((7, node.rank())));
    }
    let last = gossamer::nodes().last().unwrap();
    let t = &tables[last.rank() as usize];

    // A name the node does not have: an error listing the names near it.
    let typo = gossamer::named::<Table, Put, u64>("test.pot").unwrap();
    let err = t.apply_named(&typo, Put { key: 0, value: 0 }).unwrap_err();
    match &err {
        NamedError::NoSuchFunction {
            name,
            node,
            similar,
        } => {
            assert_eq!((name.as_str(), *node), ("test.pot", last.rank()));
            assert!(similar.contains(&"test.put".to_string()), "{err}");
        }
        other => panic!("expected NoSuchFunction, got {other}"),
    }
    // Same name, another signature: refused, both signatures named.
    let wrong = gossamer::named::<Table, String, u64>("test.put").unwrap();
    let err = t.apply_named(&wrong, "x".into()).unwrap_err();
    assert!(
        matches!(&err, NamedError::SignatureMismatch { ours, theirs, .. }
            if ours.argument.contains("String") && theirs.argument.contains("Put")),
        "{err}"
    );
    assert_eq!(t.apply_named(&sum, ()), Ok(510), "nothing ran");

    // A panic comes back as a panic naming the node.
    let panics = gossamer::named::<Table, String, u64>("test.panics").unwrap();
    let message = panic_of(|| t.apply_named(&panics, "on purpose".into()));
    assert!(
        message.contains("on purpose") && message.contains(&format!("on rank {}", last.rank())),
        "{message}"
    );

    // Functions that differ by rank (see `rack`).
    let versioned = gossamer::named::<Table, u64, u64>("test.versioned").unwrap();
    let removed = gossamer::named_fn::<u64, u64>("test.removed").unwrap();
    for (rank, t) in tables.iter().enumerate() {
        let call = t.apply_named(&versioned, 1);
        let spawned = gossamer::nodes()
            .nth(rank)
            .unwrap()
            .spawn_named(&removed, 3)
            .join();
        if rank == 2 {
            assert!(
                matches!(&call, Err(NamedError::SignatureMismatch { node: 2, theirs, .. })
                    if theirs.argument == "u32"),
                "{call:?}"
            );
            assert!(
                matches!(&spawned, Err(NamedError::NoSuchFunction { node: 2, .. })),
                "{spawned:?}"
            );
        } else {
            assert_eq!(call, Ok(52));
            assert_eq!(spawned, Ok(3));
        }
    }
    println!("named calls ok on {} ranks", tables.len());
}

fn named_calls_across_3_ranks() {
    let results = finish(start(3, "calls", &[]), Duration::from_secs(60));
    all_succeed(&results, "named calls ok on 3 ranks");
}

/// Every rank's fibers make their first call to one table at once: each link gives the name
/// its index once, however many calls race for it.
fn first_calls() {
    let target = gossamer::nodes().nth(1).unwrap();
    assert!(
        target
            .spawn_named(&export_fn(), "shared".into())
            .join()
            .unwrap()
    );
    let callers: Vec<_> = gossamer::nodes()
        .map(|n| {
            gossamer::spawn_on(
                n,
                |()| {
                    let table = gossamer::nodes()
                        .nth(1)
                        .unwrap()
                        .lookup::<Table>("shared")
                        .unwrap();
                    let put = gossamer::named::<Table, Put, u64>("test.put").unwrap();
                    let fibers: Vec<_> = (0..8)
                        .map(|f| {
                            let (table, put) = (table.clone(), put.clone());
                            trust::spawn(move || {
                                let key = u64::from(gossamer::this_node().rank()) * 100 + f;
                                table.apply_named(&put, Put { key, value: 1 }).unwrap()
                            })
                        })
                        .collect();
                    fibers.into_iter().map(|h| h.join()).max().unwrap()
                },
                (),
            )
        })
        .collect();
    let most = callers.into_iter().map(|h| h.join()).max().unwrap();
    let n = gossamer::nodes().len() as u64 * 8;
    assert_eq!(most, n, "the last of {n} puts saw them all");
    let table = target.lookup::<Table>("shared").unwrap();
    let sum = gossamer::named::<Table, (), u64>("test.sum").unwrap();
    assert_eq!(table.apply_named(&sum, ()), Ok(n));
    println!("first calls ok: {n} answered");
}

fn export_fn() -> gossamer::NamedFn<String, bool> {
    gossamer::named_fn("test.export_table").unwrap()
}

fn first_calls_from_4_ranks_at_once() {
    let results = finish(start(4, "first_calls", &[]), Duration::from_secs(60));
    all_succeed(&results, "first calls ok: 32 answered");
}

/// Rank 0 runs this build, rank 1 another (see the module docs).
fn mixed() {
    let other = gossamer::nodes().nth(1).unwrap();
    let put = gossamer::named::<Table, Put, u64>("test.put").unwrap();
    // Named calls cross.
    assert!(other.spawn_named(&export_fn(), "t".into()).join().unwrap());
    let table = other.lookup::<Table>("t").unwrap();
    assert_eq!(table.apply_named(&put, Put { key: 1, value: 2 }), Ok(1));
    let where_ = gossamer::named_fn::<u64, (u64, u32)>("test.where").unwrap();
    assert_eq!(other.spawn_named(&where_, 5).join(), Ok((5, 1)));
    // A lookup names the type it expects.
    let err = other.lookup::<u64>("t").unwrap_err();
    assert!(
        matches!(&err, NamedError::PropertyType { theirs, .. } if theirs == "test.Table/1"),
        "{err}"
    );
    let err = other.lookup::<Table>("tt").unwrap_err();
    assert!(
        matches!(&err, NamedError::NoSuchProperty { similar, .. } if similar == &["t"]),
        "{err}"
    );
    // Closures, offset operations and handles do not, and say why, at the sender.
    let message = panic_of(|| gossamer::spawn_on(other, |x: u64| x, 1).join());
    assert!(message.contains("runs another build"), "{message}");
    assert!(
        message.contains("only functions by name cross"),
        "{message}"
    );
    let message = panic_of(|| table.apply(|t| t.rows.len()));
    assert!(message.contains("runs another build"), "{message}");
    let message = panic_of(|| other.entrust(5u64));
    assert!(message.contains("runs another build"), "{message}");
    let handles = gossamer::named::<Table, Trust<Table>, u64>("test.put").unwrap();
    let message = panic_of(|| table.apply_named(&handles, gossamer::entrust(Table::default())));
    assert!(
        message.contains("cannot go to rank 1, which runs another build"),
        "{message}"
    );
    // The link still works after all that.
    assert_eq!(table.apply_named(&put, Put { key: 2, value: 2 }), Ok(2));
    drop(table);
    println!("mixed builds ok");
}

/// A copy of this executable with its build-id note changed: the same code, another build id.
fn other_build() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gossamer-named-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("other-build");
    other_build::write_other_build(&copy);
    copy
}

/// A job of two ranks, rank 1 running `other`, with `mixed[r]` as rank r's GSM_MIXED_BUILDS;
/// a job that cannot form fails after `connect` (GSM_CONNECT_TIMEOUT).
fn two_builds(scenario: &str, other: &std::path::Path, mixed: [&str; 2], connect: &str) -> Job {
    let coord = format!("127.0.0.1:{}", free_port());
    let job = format!("{}", std::process::id() as u64 * 1000 + 7);
    let this = std::env::current_exe().unwrap();
    let children = (0..2)
        .map(|r| {
            let program = if r == 0 { this.as_path() } else { other };
            let mut cmd = job::rank_of(program, scenario, r, 2, &coord, &job, "test-secret");
            cmd.env("GSM_MIXED_BUILDS", mixed[r])
                .env("GSM_CONNECT_TIMEOUT", connect)
                .stdout(Stdio::piped());
            cmd.spawn().expect("start a rank")
        })
        .collect();
    Job { children }
}

fn mixed_builds() {
    let other = other_build();
    let results = finish(
        two_builds("mixed", &other, ["1", "1"], "20s"),
        Duration::from_secs(60),
    );
    std::fs::remove_dir_all(other.parent().unwrap()).ok();
    all_succeed(&results, "mixed builds ok");
}

fn builds_need_consent() {
    let other = other_build();
    for mixed in [["1", "0"], ["0", "0"]] {
        let job = two_builds("mixed", &other, mixed, "2s");
        let results = finish(job, Duration::from_secs(60));
        let all: String = results.iter().map(|r| r.2.clone()).collect();
        assert!(
            results.iter().all(|r| !r.0.success()),
            "{mixed:?}: the job must not form; stderr:\n{all}"
        );
        assert!(
            all.contains("runs another build") && all.contains("GSM_MIXED_BUILDS=1"),
            "{mixed:?}: {all}"
        );
    }
    std::fs::remove_dir_all(other.parent().unwrap()).ok();
}

fn duplicate_name() {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.env("RACK_SCENARIO", "calls")
        .env("TEST_DUPLICATE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let results = common::finish(
        vec![cmd.spawn().unwrap()],
        Duration::from_secs(30),
        "one node",
    );
    let (status, _, stderr) = &results[0];
    assert_eq!(status.code(), Some(gossamer::EXIT_SETUP.into()), "{stderr}");
    assert!(
        stderr.contains("two functions are named \"test.put\"") && stderr.contains("named::put"),
        "{stderr}"
    );
}
