//! One-sided regions across processes, on TCP and on shared memory: a seeded program on each
//! of 3 ranks drives puts, gets, fences and atomics at the regions of all three, and checks
//! every outcome against the memory model of `gossamer::region`. A forbidden outcome fails
//! the test; the allowed reorderings are counted and printed.
//!
//! Its own driver (`harness = false`), as `rack.rs`: without `GSM_RANK` it starts the ranks.
//! `REGION_SEED` replays a seed; the one used is printed.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use gossamer::{Node, Rack, Region, RegionError};

mod common;
#[path = "../src/splitmix.rs"]
#[allow(dead_code)]
mod splitmix;

use common::job::{self, finish, start};
use splitmix::Rng;

const RANKS: u32 = 3;
/// Word 0 of every region: a counter every rank adds to.
const ADDS: usize = 0;
/// Word 1: a counter every rank increments with compare_exchange.
const SWAPS: usize = 1;
/// Then six words per writing rank: `D`ata and `F`lag (both on one node), `X` and `Y`
/// (puts to two nodes, no fence between), `Z` and `W` (puts to two nodes, a fence between).
const D: usize = 0;
const F: usize = 1;
const X: usize = 2;
const Y: usize = 3;
const Z: usize = 4;
const W: usize = 5;
const LEN: usize = 2 + 6 * RANKS as usize;
/// Actions of each rank's program.
const ROUNDS: u32 = 1500;

fn word(writer: u32, which: usize) -> usize {
    2 + 6 * writer as usize + which
}

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        return Rack::from_env().run(move || match scenario.as_str() {
            "regions" => regions(),
            "one_sided" => one_sided(),
            other => panic!("unknown scenario {other}"),
        });
    }
    let both: &[(&str, fn())] = &[
        (
            "regions_meet_the_memory_model_from_3_ranks",
            memory_model_from_3_ranks,
        ),
        (
            "one_sided_operations_complete_while_the_owner_is_busy",
            owner_busy,
        ),
    ];
    let before = job::on_each_transport(both);
    common::conclude_after("regions", before, &[])
}

fn memory_model_from_3_ranks() {
    let seed = std::env::var("REGION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 ^ 0x5EED);
    let extra = [("REGION_SEED", seed.to_string())];
    let results = finish(
        start(RANKS as usize, "regions", &extra),
        Duration::from_secs(90),
    );
    let all: String = results.iter().map(|r| r.2.clone()).collect();
    for (rank, (status, stdout, _)) in results.iter().enumerate() {
        assert!(
            status.success(),
            "rank {rank} {status} (REGION_SEED={seed}); stderr:\n{all}"
        );
        if rank == 0 {
            assert!(stdout.contains("regions ok"), "{stdout}");
            print!("{stdout}");
        }
    }
}

/// Where regions are reached with no code of their node's (shared memory, and UCX over its
/// shared memory, which maps the heap UCX allocated): an add, a put, a fence and a get
/// complete while the node's worker 0, which owns its regions, is held in one call that only
/// ends once it sees the put's word. Over TCP they are
/// requests to that worker, which would wait behind the call: not promised there, not run.
fn owner_busy() {
    let transport = job::transport_spec();
    if !matches!(transport.as_str(), "shm" | "ucx/sm") {
        println!("not one-sided over {transport}: skipped");
        return;
    }
    let results = finish(start(2, "one_sided", &[]), Duration::from_secs(60));
    common::all_succeed(&results, "one-sided ok");
}

/// How long the owner's call waits for the put before it reports the put never landed.
const OWNER_WAITS: Duration = Duration::from_secs(10);

/// Rank 0 of `owner_busy`.
fn one_sided() {
    let node = gossamer::nodes().nth(1).unwrap();
    let region = node.region(2).unwrap();
    let owner = node.trustee(0).entrust_with(|()| 0u64, ());
    let answer: Rc<RefCell<Option<Result<(), String>>>> = Rc::default();
    let slot = answer.clone();
    owner.apply_then_with(wait_for_put, region.clone(), move |r| {
        *slot.borrow_mut() = Some(r)
    });
    // The put may land before the call starts, or while it runs: either way it must not
    // need the owner.
    assert_eq!(region.fetch_add(1, 5).wait().unwrap(), 0);
    region.put(0, &[1]).wait().unwrap();
    gossamer::fence(node).wait().unwrap();
    assert_eq!(region.get(0, 2).wait().unwrap(), [1, 5]);
    assert!(
        region.words().is_some(),
        "rank 1's heap is mapped into rank 0 (by UCX, over its shared memory)"
    );
    let deadline = std::time::Instant::now() + OWNER_WAITS * 2;
    while answer.borrow().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the owner's call never answered"
        );
        gossamer::yield_now();
    }
    let seen = answer.borrow_mut().take().unwrap();
    assert_eq!(seen, Ok(()), "the owner waited for the put");
    println!("one-sided ok");
}

/// The owner's call: holds its worker until word 0 of `region` is 1, or `OWNER_WAITS`; word 1
/// holds the add made before.
fn wait_for_put(_: &mut u64, region: Region) -> Result<(), String> {
    let words = region.words().expect("a node maps its own regions");
    let start = std::time::Instant::now();
    while words[0].load(std::sync::atomic::Ordering::Acquire) != 1 {
        if start.elapsed() > OWNER_WAITS {
            return Err(format!(
                "the put did not land in {OWNER_WAITS:?} while this worker was busy"
            ));
        }
        std::hint::spin_loop();
    }
    match words[1].load(std::sync::atomic::Ordering::Acquire) {
        5 => Ok(()),
        other => Err(format!(
            "the add before the put is missing: word 1 holds {other}"
        )),
    }
}

/// What one rank's program saw: fetch_add results and compare_exchange successes per node,
/// counts of checks and of allowed reorderings, and violations of the model.
type Report = (Vec<Vec<u64>>, Vec<u64>, Vec<(String, u64)>, Vec<String>);

/// Rank 0: makes a region on every node, runs the program on every rank at once, then checks
/// the atomics' totals.
fn regions() {
    let seed: u64 = std::env::var("REGION_SEED").unwrap().parse().unwrap();
    let nodes: Vec<Node> = gossamer::nodes().collect();
    let regions: Vec<Region> = nodes.iter().map(|n| n.region(LEN).unwrap()).collect();
    println!(
        "seed {seed}, transport {}",
        nodes[1]
            .transport()
            .map_or("none".into(), |t| t.to_string())
    );
    errors_are_returned(&regions);
    let runs: Vec<_> = nodes
        .iter()
        .map(|&n| gossamer::spawn_on(n, program, (regions.clone(), seed)))
        .collect();
    let reports: Vec<Report> = runs.into_iter().map(|r| r.join()).collect();
    let mut counts: Vec<(String, u64)> = Vec::new();
    for (rank, (_, _, seen, violations)) in reports.iter().enumerate() {
        assert!(
            violations.is_empty(),
            "rank {rank} saw outcomes the model forbids (REGION_SEED={seed}):\n{}",
            violations.join("\n")
        );
        for (what, n) in seen {
            match counts.iter_mut().find(|(w, _)| w == what) {
                Some((_, total)) => *total += n,
                None => counts.push((what.clone(), *n)),
            }
        }
    }
    for (n, region) in regions.iter().enumerate() {
        // Every fetch_add returned a different value, and together they are 0..total.
        let mut adds: Vec<u64> = reports.iter().flat_map(|r| r.0[n].clone()).collect();
        adds.sort_unstable();
        assert!(
            adds.iter().enumerate().all(|(i, &v)| v == i as u64),
            "fetch_add results on rank {n} are not 0..{}: {adds:?}",
            adds.len()
        );
        assert_eq!(region.get(ADDS, 1).wait().unwrap(), [adds.len() as u64]);
        let swaps: u64 = reports.iter().map(|r| r.1[n]).sum();
        assert_eq!(
            region.get(SWAPS, 1).wait().unwrap(),
            [swaps],
            "compare_exchange successes on rank {n}"
        );
    }
    for (what, n) in counts {
        println!("{what}: {n}");
    }
    println!("regions ok");
}

/// Out of bounds and zero-length regions are errors, and write nothing.
fn errors_are_returned(regions: &[Region]) {
    for r in regions {
        let before = r.get(0, LEN).wait().unwrap();
        assert!(matches!(
            r.put(LEN - 1, &[1, 2]).wait(),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(r.get(LEN, 1).wait().is_err());
        assert!(r.fetch_add(usize::MAX, 1).wait().is_err());
        assert!(r.compare_exchange(LEN, 0, 1).wait().is_err());
        assert_eq!(r.get(0, LEN).wait().unwrap(), before);
        assert!(matches!(
            r.node().region(0),
            Err(RegionError::BadLength { len: 0 })
        ));
    }
    // From a plain thread, too (this worker yields meanwhile: the operation may need it).
    let r = regions.last().unwrap().clone();
    let thread = std::thread::spawn(move || r.get(ADDS, 1).wait());
    while !thread.is_finished() {
        gossamer::yield_now();
    }
    assert_eq!(thread.join().unwrap(), Ok(vec![0]));
}

/// One rank's seeded program (module docs).
fn program((regions, seed): (Vec<Region>, u64)) -> Report {
    let me = gossamer::this_node().rank();
    let mut rng = Rng(seed.wrapping_add(u64::from(me) * 0x9E37));
    let n = regions.len() as u32;
    let (next, after) = ((me + 1) % n, (me + 2) % n);
    let mut value = 0u64;
    // What this rank last put into its `D` word on each node.
    let mut own: Vec<Option<u64>> = vec![None; n as usize];
    // The highest `D` of each writer on each node this rank has read.
    let mut highest = vec![vec![0u64; n as usize]; n as usize];
    let adds = Rc::new(RefCell::new(vec![Vec::new(); n as usize]));
    let mut swaps = vec![0u64; n as usize];
    let mut seen: Vec<(String, u64)> = Vec::new();
    let mut count = |what: &str| match seen.iter_mut().find(|(w, _)| w == what) {
        Some((_, k)) => *k += 1,
        None => seen.push((what.to_string(), 1)),
    };
    let mut violations = Vec::new();
    let group = gossamer::Group::new();
    let get = |r: &Region, at: usize| r.get(at, 1).wait().unwrap()[0];
    for _ in 0..ROUNDS {
        let node = rng.below(n as usize);
        let region = &regions[node];
        let other = {
            let k = 1 + rng.below(n as usize - 1) as u32;
            (me + k) % n
        };
        match rng.below(9) {
            // Data, then its flag, on one node.
            0 => {
                value += 1;
                region.put(word(me, D), &[value]).wait().unwrap();
                region.put(word(me, F), &[value]).wait().unwrap();
                own[node] = Some(value);
            }
            // Reading back what this rank put last.
            1 => {
                if let Some(v) = own[node] {
                    let got = get(region, word(me, D));
                    count("own put read back");
                    if got != v {
                        violations.push(format!(
                            "rank {me} put {v} to rank {node} and read back {got}"
                        ));
                    }
                }
            }
            // Puts to two nodes, no fence between.
            2 => {
                value += 1;
                regions[next as usize]
                    .put(word(me, X), &[value])
                    .wait()
                    .unwrap();
                regions[after as usize]
                    .put(word(me, Y), &[value])
                    .wait()
                    .unwrap();
            }
            // Puts to two nodes, a fence between.
            3 => {
                value += 1;
                regions[next as usize]
                    .put(word(me, Z), &[value])
                    .wait()
                    .unwrap();
                gossamer::fence(regions[next as usize].node())
                    .wait()
                    .unwrap();
                regions[after as usize]
                    .put(word(me, W), &[value])
                    .wait()
                    .unwrap();
            }
            // Another rank's flag, then its data, on one node.
            4 => {
                let flag = get(region, word(other, F));
                let data = get(region, word(other, D));
                count("flag then data on one node checked");
                if data < flag {
                    violations.push(format!(
                        "rank {me} read rank {other}'s flag {flag} on rank {node}, then its \
                         data {data}: puts to one node landed out of order"
                    ));
                }
                let high = &mut highest[other as usize][node];
                if data < *high {
                    violations.push(format!(
                        "rank {me} read rank {other}'s data on rank {node} as {high}, then {data}"
                    ));
                }
                *high = data.max(*high);
            }
            // Another rank's unfenced puts to two nodes, read in the other order.
            5 => {
                let (a, b) = ((other + 1) % n, (other + 2) % n);
                let y = get(&regions[b as usize], word(other, Y));
                let x = get(&regions[a as usize], word(other, X));
                count("unfenced puts to two nodes checked");
                if x < y {
                    count("allowed: unfenced puts to two nodes seen out of order");
                }
            }
            // Another rank's fenced puts to two nodes, read in the other order.
            6 => {
                let (a, b) = ((other + 1) % n, (other + 2) % n);
                let w = get(&regions[b as usize], word(other, W));
                let z = get(&regions[a as usize], word(other, Z));
                count("fenced puts to two nodes checked");
                if z < w {
                    violations.push(format!(
                        "rank {me} read rank {other}'s second put {w} on rank {b}, then its \
                         first {z} on rank {a}: the fence between them did not hold"
                    ));
                }
            }
            // fetch_add, waited for or chained.
            7 => {
                let done = region.fetch_add(ADDS, 1);
                if rng.below(2) == 0 {
                    let v = done.wait().unwrap();
                    adds.borrow_mut()[node].push(v);
                } else {
                    let adds = adds.clone();
                    done.then(group.track(move |v: Result<u64, RegionError>| {
                        adds.borrow_mut()[node].push(v.unwrap())
                    }));
                }
            }
            // compare_exchange from the value read.
            _ => {
                let current = get(region, SWAPS);
                match region
                    .compare_exchange(SWAPS, current, current + 1)
                    .wait()
                    .unwrap()
                {
                    Ok(_) => swaps[node] += 1,
                    Err(_) => count("compare_exchange lost a race"),
                }
            }
        }
    }
    group.wait();
    let adds = adds.borrow().clone();
    (adds, swaps, seen, violations)
}
