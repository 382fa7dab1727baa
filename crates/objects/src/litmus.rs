//! The seed's litmus tests, on the adversary fabric (`sim`): each runs under 10⁴ seeds (or
//! `LITMUS_SEEDS`); a forbidden outcome must never occur, and each weak outcome the memory
//! model allows must occur at least once, which shows the adversary is weak enough to find
//! it. The counts are printed (`cargo test -p objects litmus -- --nocapture`).
//!
//! Nodes are numbered from 0 here (the seed's node 1 is node 0). Where our model is stronger
//! than the seed's (a put reads its words when issued), the seed's weak outcome is forbidden
//! here, and the test says so.

use std::collections::BTreeMap;

use crate::barrier::{Barrier, Fence};
use crate::fabric::Fabric;
use crate::object::open_on;
use crate::ring::{Ring, RingParams};
use crate::sim::{self, Program, Sim, SimRegion};
use crate::var::SharedVar;
use crate::work::{Landing, Work};
use crate::{Msw, msw};

fn seeds() -> u64 {
    std::env::var("LITMUS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

/// What every run of the programs `make` builds observed, and how often, over all seeds.
fn explore<M>(name: &str, nodes: u32, make: M) -> BTreeMap<Vec<Vec<u64>>, u64>
where
    M: Fn() -> Vec<Program> + Send,
{
    let rt = sim::runtime();
    let counts = rt.block_on(move || {
        let mut counts = BTreeMap::new();
        for seed in 0..seeds() {
            *counts.entry(sim::run(seed, nodes, &make)).or_insert(0) += 1;
        }
        counts
    });
    if counts.len() <= 8 {
        println!("{name}: {counts:?}");
    } else {
        let mut top: Vec<_> = counts.iter().collect();
        top.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
        println!(
            "{name}: {} outcomes; the commonest {:?}",
            counts.len(),
            &top[..4]
        );
    }
    counts
}

/// A predicate on an outcome: what each node observed.
type Outcome<'a> = &'a dyn Fn(&[Vec<u64>]) -> bool;

/// Asserts no outcome is forbidden, and that `weak` occurred.
fn judge(
    name: &str,
    counts: &BTreeMap<Vec<Vec<u64>>, u64>,
    forbidden: impl Fn(&[Vec<u64>]) -> bool,
    weak: Option<Outcome<'_>>,
) {
    for (outcome, n) in counts {
        assert!(
            !forbidden(outcome),
            "{name}: forbidden outcome {outcome:?} occurred {n} times"
        );
    }
    if let Some(weak) = weak {
        let seen: u64 = counts.iter().filter(|(o, _)| weak(o)).map(|(_, n)| n).sum();
        println!("{name}: the weak outcome in {seen} of {} runs", seeds());
        assert!(
            seen > 0,
            "{name}: the allowed weak outcome never occurred in {} seeds: the adversary is \
             too strong ({counts:?})",
            seeds()
        );
    }
}

fn put(s: &Sim, r: &SimRegion, i: usize, v: u64) {
    s.put(
        r,
        i,
        &[v],
        Box::new(|result| result.expect("a put in bounds")),
    );
}

fn get(s: &Sim, r: &SimRegion, i: usize) -> u64 {
    let work = Work::new();
    let landing = Landing::new();
    s.get(r, i, 1, landing.fill(&work));
    work.wait().expect("a get in bounds");
    landing.take().expect("completed").expect("a get in bounds")[0]
}

fn fence(s: &Sim, node: u32) {
    let work = Work::new();
    s.fence(node, work.count());
    work.wait().expect("a fence");
}

/// A node's endpoint of the shared variable `name` among `members`.
fn var(s: &Sim, name: &str, members: &[u32]) -> SharedVar<u64, Sim> {
    open_on::<Sim, SharedVar<u64, Sim>>(s, name, &(), members).expect("open a shared variable")
}

fn program(f: impl FnOnce(Sim) -> Vec<u64> + Send + 'static) -> Program {
    Box::new(f)
}

/// Store buffering across nodes, each put followed by `sync` (seed Figures 4 and 5): node 0
/// puts y := 1 on node 1 then reads its own x; node 1 puts x := 1 on node 0 then reads y.
fn store_buffering(name: &str, sync: fn(&Sim, &SimRegion)) -> BTreeMap<Vec<Vec<u64>>, u64> {
    explore(name, 2, move || {
        let x = Sim::alloc_on(0, 2);
        let y = Sim::alloc_on(1, 2);
        vec![
            program(move |s| {
                put(&s, &y, 0, 1);
                sync(&s, &y);
                vec![s.load(&x, 0)]
            }),
            program(move |s| {
                put(&s, &x, 0, 1);
                sync(&s, &x);
                vec![s.load(&y, 0)]
            }),
        ]
    })
}

fn both_zero(o: &[Vec<u64>]) -> bool {
    o[0][0] == 0 && o[1][0] == 0
}

#[test]
fn fig2_a_put_reads_its_words_when_issued() {
    // Node 0 has x = 1, puts it to y on node 1, then sets x = 2 with no wait: the seed lets the
    // NIC read x late (y = 2); here the put read x when issued, so y = 1 always.
    let counts = explore("fig2", 2, || {
        let x = Sim::alloc_on(0, 1);
        let y = Sim::alloc_on(1, 1);
        vec![
            program(move |s| {
                s.store(&x, 0, 1);
                let v = s.load(&x, 0);
                put(&s, &y, 0, v);
                s.store(&x, 0, 2);
                vec![]
            }),
            program(move |s| {
                // Wait until the put landed, then report y.
                while s.load(&y, 0) == 0 {
                    s.relax();
                }
                vec![s.load(&y, 0)]
            }),
        ]
    });
    judge("fig2", &counts, |o| o[1][0] != 1, None);
}

#[test]
fn fig4_completed_puts_still_allow_store_buffering() {
    let counts = store_buffering("fig4 (wait for the put)", |s, r| {
        // A put's completion: it was issued and its words read, nothing more.
        let work = Work::new();
        s.put(r, 1, &[0], work.count());
        work.wait().expect("a put");
    });
    judge("fig4", &counts, |_| false, Some(&both_zero));
}

#[test]
fn fig4_a_get_after_the_put_forbids_store_buffering() {
    let counts = store_buffering("fig4 (get after the put)", |s, r| {
        get(s, r, 1);
    });
    judge("fig4 get", &counts, both_zero, None);
}

#[test]
fn fig5_a_fence_forbids_store_buffering() {
    let counts = store_buffering("fig5 (fence)", |s, r| fence(s, s.node_of(r)));
    judge("fig5", &counts, both_zero, None);
}

/// Node 0 puts y := 1 on node 1, node 1 puts x := 1 on node 0, then both pass `barrier` and
/// read their own word (seed Figure 6): only (1, 1) is allowed.
fn barrier_pair(name: &str, fenced: Fence) -> BTreeMap<Vec<Vec<u64>>, u64> {
    explore(name, 2, move || {
        let x = Sim::alloc_on(0, 1);
        let y = Sim::alloc_on(1, 1);
        let side = move |mine: SimRegion, theirs: SimRegion| {
            program(move |s| {
                let mut b = open_on::<Sim, Barrier<Sim>>(&s, "b", &(), &[0, 1]).expect("open");
                put(&s, &theirs, 0, 1);
                b.enter(fenced).expect("barrier");
                vec![s.load(&mine, 0)]
            })
        };
        vec![side(x, y), side(y, x)]
    })
}

// Without the fence the outcome is the same on two nodes: the put and the count go to the
// same node, in order (the seed: "examples such as Fig. 6 behave correctly"). Figure 22 needs
// a third node to catch the unfenced barrier.
#[test]
fn fig6_a_barrier_lands_every_put() {
    let counts = barrier_pair("fig6", Fence::All);
    judge("fig6", &counts, |o| o != [vec![1], vec![1]], None);
}

#[test]
fn fig9a_a_broadcast_lands_after_earlier_puts_to_its_node() {
    // Node 0 puts z := 1 on node 1, then broadcasts w = 1; node 1 sees w = 1, then reads z.
    let counts = explore("fig9a", 2, || {
        let z = Sim::alloc_on(1, 1);
        vec![
            program(move |s| {
                let mut w = var(&s, "w", &[0, 1]);
                put(&s, &z, 0, 1);
                w.store(1);
                w.broadcast(&Work::new());
                vec![]
            }),
            program(move |s| {
                let w = var(&s, "w", &[0, 1]);
                while w.load() == 0 {
                    s.relax();
                }
                vec![s.load(&z, 0)]
            }),
        ]
    });
    judge("fig9a", &counts, |o| o[1][0] == 0, None);
}

#[test]
fn fig9b_a_relayed_signal_does_not_carry_the_order() {
    // Node 0 puts z := 1 on node 2 and signals node 1 (w); node 1 signals node 2 (v); node 2
    // may see v and still the old z.
    let counts = explore("fig9b", 3, || {
        let z = Sim::alloc_on(2, 1);
        vec![
            program(move |s| {
                let mut w = var(&s, "w", &[0, 1]);
                put(&s, &z, 0, 1);
                w.store(1);
                w.broadcast(&Work::new());
                vec![]
            }),
            program(move |s| {
                let w = var(&s, "w", &[0, 1]);
                let mut v = var(&s, "v", &[1, 2]);
                while w.load() == 0 {
                    s.relax();
                }
                v.store(1);
                v.broadcast(&Work::new());
                vec![]
            }),
            program(move |s| {
                let v = var(&s, "v", &[1, 2]);
                while v.load() == 0 {
                    s.relax();
                }
                vec![s.load(&z, 0)]
            }),
        ]
    });
    judge("fig9b", &counts, |_| false, Some(&|o| o[2][0] == 0));
}

#[test]
fn fig9c_one_broadcast_sends_one_value() {
    // Node 0 stores w = 1, broadcasts, stores w = 2. The seed lets the broadcast's reads of w
    // differ per target (node 1 gets 1, node 2 gets 2); here a broadcast reads w once, when
    // issued, so both replicas end as 1.
    let counts = explore("fig9c", 3, || {
        vec![
            program(move |s| {
                let mut w = var(&s, "w", &[0, 1, 2]);
                w.store(1);
                w.broadcast(&Work::new());
                w.store(2);
                vec![]
            }),
            program(move |s| {
                let w = var(&s, "w", &[0, 1, 2]);
                while w.load() == 0 {
                    s.relax();
                }
                vec![w.load()]
            }),
            program(move |s| {
                let w = var(&s, "w", &[0, 1, 2]);
                while w.load() == 0 {
                    s.relax();
                }
                vec![w.load()]
            }),
        ]
    });
    judge("fig9c", &counts, |o| o[1][0] != 1 || o[2][0] != 1, None);
}

/// Node 0 puts x := 1 on `x_node`, then the members pass a barrier; `reader` then gets x
/// (seed Figures 12 and 22).
fn barrier_then_get(
    name: &str,
    nodes: u32,
    members: &'static [u32],
    x_node: u32,
    reader: u32,
    fenced: Fence,
) -> BTreeMap<Vec<Vec<u64>>, u64> {
    explore(name, nodes, move || {
        let x = Sim::alloc_on(x_node, 1);
        (0..nodes)
            .map(|rank| {
                program(move |s| {
                    if !members.contains(&rank) {
                        return vec![];
                    }
                    let mut b = open_on::<Sim, Barrier<Sim>>(&s, "b", &(), members).expect("open");
                    if rank == 0 {
                        put(&s, &x, 0, 1);
                    }
                    b.enter(fenced).expect("barrier");
                    if rank == reader {
                        vec![get(&s, &x, 0)]
                    } else {
                        vec![]
                    }
                })
            })
            .collect()
    })
}

#[test]
fn fig12_the_barrier_is_transitive() {
    // Nodes 0 and 1 pass a barrier; x is on node 2, a non-member.
    let counts = barrier_then_get("fig12", 3, &[0, 1], 2, 1, Fence::All);
    judge("fig12", &counts, |o| o[1][0] == 0, None);
}

#[test]
fn fig12_a_barrier_fencing_only_members_is_not() {
    let counts = barrier_then_get("fig12 members-only", 3, &[0, 1], 2, 1, Fence::Members);
    judge(
        "fig12 members-only",
        &counts,
        |_| false,
        Some(&|o| o[1][0] == 0),
    );
}

#[test]
fn fig22_three_members_see_every_put() {
    // x is on node 1; node 2 reads it after the barrier of all three.
    let counts = barrier_then_get("fig22", 3, &[0, 1, 2], 1, 2, Fence::All);
    judge("fig22", &counts, |o| o[2][0] == 0, None);
}

#[test]
fn fig22_the_pairwise_barrier_bug_is_caught() {
    // The seed's first bug (App. D): a barrier that notifies without fencing.
    let counts = barrier_then_get("fig22 pairwise", 3, &[0, 1, 2], 1, 2, Fence::Nothing);
    judge(
        "fig22 pairwise",
        &counts,
        |_| false,
        Some(&|o| o[2][0] == 0),
    );
}

/// Two rings in opposite directions: each node sends on its own, optionally flushes, then
/// tries to receive on the other's (seed Figure 13). Outcome: whether each received.
fn crossed_rings(name: &str, flush: bool) -> BTreeMap<Vec<Vec<u64>>, u64> {
    explore(name, 2, move || {
        (0..2u32)
            .map(|rank| {
                program(move |s| {
                    let mine = RingParams {
                        writer: rank as usize,
                        capacity: 8,
                    };
                    let theirs = RingParams {
                        writer: 1 - rank as usize,
                        capacity: 8,
                    };
                    let names = ["ring0", "ring1"];
                    let (mine_name, theirs_name) = (names[rank as usize], names[1 - rank as usize]);
                    // Open in one order on both nodes.
                    let (a, b) = if rank == 0 {
                        let a = open_on::<Sim, Ring<Sim>>(&s, mine_name, &mine, &[0, 1]);
                        (
                            a,
                            open_on::<Sim, Ring<Sim>>(&s, theirs_name, &theirs, &[0, 1]),
                        )
                    } else {
                        let b = open_on::<Sim, Ring<Sim>>(&s, theirs_name, &theirs, &[0, 1]);
                        (open_on::<Sim, Ring<Sim>>(&s, mine_name, &mine, &[0, 1]), b)
                    };
                    let mut w = a.expect("open").writer().expect("writer");
                    let mut r = b.expect("open").reader().expect("reader");
                    w.try_send(b"m").expect("room");
                    if flush {
                        w.flush().expect("flush");
                    }
                    vec![u64::from(r.try_recv().expect("recv").is_some())]
                })
            })
            .collect()
    })
}

#[test]
fn fig13_both_receives_may_fail() {
    let counts = crossed_rings("fig13", false);
    judge("fig13", &counts, |_| false, Some(&both_zero));
}

#[test]
fn fig13_not_after_a_flush() {
    let counts = crossed_rings("fig13 flushed", true);
    judge("fig13 flushed", &counts, both_zero, None);
}

#[test]
fn fig23_a_barrier_makes_a_sent_message_receivable() {
    let counts = explore("fig23", 2, || {
        (0..2u32)
            .map(|_| {
                program(move |s| {
                    let params = RingParams {
                        writer: 0,
                        capacity: 8,
                    };
                    let ring = open_on::<Sim, Ring<Sim>>(&s, "r", &params, &[0, 1]).expect("open");
                    let mut b = open_on::<Sim, Barrier<Sim>>(&s, "b", &(), &[0, 1]).expect("open");
                    match ring {
                        Ring::Writer(mut w) => {
                            w.try_send(b"data").expect("room");
                            b.wait().expect("barrier");
                            vec![]
                        }
                        Ring::Reader(mut r) => {
                            b.wait().expect("barrier");
                            vec![u64::from(r.try_recv().expect("recv").is_some())]
                        }
                    }
                })
            })
            .collect()
    });
    judge("fig23", &counts, |o| o[1][0] == 0, None);
}

/// A value of two words between a leading and a trailing guard, written by node 0 into node
/// 1's replica as three puts (guard, data, guard), twice; node 1 reads its replica six times
/// and reports what it accepted (guard, word, word). The seed's second bug (App. D) reads the
/// leading guard first.
fn guarded(name: &str, leading_first: bool) -> BTreeMap<Vec<Vec<u64>>, u64> {
    explore(name, 2, move || {
        let r = Sim::alloc_on(1, 4);
        vec![
            program(move |s| {
                for v in [1, 2] {
                    put(&s, &r, 0, v);
                    s.put(&r, 1, &[v, v], Box::new(|x| x.expect("in bounds")));
                    put(&s, &r, 3, v);
                }
                vec![]
            }),
            program(move |s| {
                let mut accepted = Vec::new();
                for _ in 0..6 {
                    let (first, second) = if leading_first { (0, 3) } else { (3, 0) };
                    let g1 = s.load(&r, first);
                    let d = [s.load(&r, 1), s.load(&r, 2)];
                    let g2 = s.load(&r, second);
                    if g1 == g2 {
                        accepted.extend([g1, d[0], d[1]]);
                    }
                    s.relax();
                }
                accepted
            }),
        ]
    })
}

fn torn(o: &[Vec<u64>]) -> bool {
    o[1].chunks(3).any(|a| a[1] != a[0] || a[2] != a[0])
}

#[test]
fn guards_read_trailing_first_accept_only_whole_values() {
    let counts = guarded("guards", false);
    judge("guards", &counts, torn, None);
}

#[test]
fn guards_read_leading_first_is_caught() {
    let counts = guarded("guards leading-first", true);
    judge("guards leading-first", &counts, |_| false, Some(&torn));
}

#[test]
fn msw_loads_only_whole_values() {
    // Node 0 stores and broadcasts three values of 3 words (all words of value v are v);
    // node 1 loads its replica while they land. Whatever it loads is one value, whole.
    let counts = explore("msw", 2, || {
        (0..2u32)
            .map(|rank| {
                program(move |s| {
                    let mut m = open_on::<Sim, Msw<Sim>>(&s, "m", &24, &[0, 1]).expect("open");
                    if rank == 0 {
                        for v in 1..=3u64 {
                            let bytes: Vec<u8> =
                                [v; 3].iter().flat_map(|w| w.to_le_bytes()).collect();
                            m.store(&bytes).expect("fits");
                            m.broadcast(&Work::new());
                        }
                        return vec![];
                    }
                    let mut seen = Vec::new();
                    let mut failed = 0;
                    for _ in 0..8 {
                        match m.try_load() {
                            Some(bytes) => seen.push(msw::to_words(&bytes)),
                            None => failed += 1,
                        }
                        s.relax();
                    }
                    let whole = seen
                        .iter()
                        .all(|w| w.is_empty() || w.iter().all(|x| *x == w[0]));
                    vec![u64::from(whole), u64::from(failed > 0)]
                })
            })
            .collect()
    });
    judge("msw", &counts, |o| o[1][0] == 0, Some(&|o| o[1][1] == 1));
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let rt = sim::runtime();
    let runs = rt.block_on(|| {
        let make = || {
            let y = Sim::alloc_on(1, 4);
            vec![
                program(move |s| {
                    s.put(&y, 0, &[1, 2, 3, 4], Box::new(|_| {}));
                    vec![]
                }),
                program(move |s| (0..4).map(|i| s.load(&y, i)).collect()),
            ]
        };
        (0..2)
            .map(|_| {
                (0..200)
                    .map(|seed| sim::run(seed, 2, make))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(runs[0], runs[1]);
}

/// One operation of a map's history: on `key`, `op` (0 get, 1 insert of `arg`, 2 remove),
/// what it returned (`u64::MAX` for none), and when it was invoked and answered.
#[derive(Debug, Clone, Copy)]
struct Call {
    key: u64,
    op: u64,
    arg: u64,
    result: u64,
    invoked: u64,
    answered: u64,
}

const NONE: u64 = u64::MAX;

/// Whether the calls on one key can be ordered, each between its invocation and its answer,
/// so that a sequential map gives every result (Wing and Gong's search, with a memo of the
/// states already tried).
fn linearizable(calls: &[Call]) -> bool {
    fn search(
        calls: &[Call],
        done: u64,
        value: u64,
        tried: &mut std::collections::HashSet<(u64, u64)>,
    ) -> bool {
        if done.count_ones() as usize == calls.len() {
            return true;
        }
        if !tried.insert((done, value)) {
            return false;
        }
        // The first to answer among those pending: nothing may be ordered after it that was
        // invoked after it answered.
        let deadline = (0..calls.len())
            .filter(|i| done & (1 << i) == 0)
            .map(|i| calls[i].answered)
            .min()
            .expect("a pending call");
        for (i, c) in calls.iter().enumerate() {
            if done & (1 << i) != 0 || c.invoked > deadline {
                continue;
            }
            let (result, next) = match c.op {
                0 => (value, value),
                1 => (value, c.arg),
                _ => (value, NONE),
            };
            if result == c.result && search(calls, done | (1 << i), next, tried) {
                return true;
            }
        }
        false
    }
    assert!(
        calls.len() <= 64,
        "a history of {} calls on one key",
        calls.len()
    );
    search(calls, 0, NONE, &mut std::collections::HashSet::new())
}

#[test]
fn the_checker_refuses_a_stale_read() {
    let call = |op, arg, result, invoked, answered| Call {
        key: 0,
        op,
        arg,
        result,
        invoked,
        answered,
    };
    // insert 1 answers, then a get that begins later returns none: not linearizable.
    assert!(!linearizable(&[
        call(1, 1, NONE, 1, 2),
        call(0, 0, NONE, 3, 4)
    ]));
    // Overlapping, either order: fine.
    assert!(linearizable(&[
        call(1, 1, NONE, 1, 4),
        call(0, 0, NONE, 2, 3)
    ]));
    assert!(linearizable(&[call(1, 1, NONE, 1, 4), call(0, 0, 1, 2, 3)]));
}

#[test]
fn map_histories_of_4_clients_are_linearizable() {
    use crate::dmap::{DMap, DMapParams};
    let seeds = (seeds() / 5).max(1);
    let rt = sim::runtime();
    let (histories, calls) = rt.block_on(move || {
        let mut calls = 0;
        for seed in 0..seeds {
            let out = sim::run(seed, 4, || {
                (0..4u32)
                    .map(|rank| {
                        program(move |s| {
                            let members = [0, 1, 2, 3];
                            let params = DMapParams { slots: 8, locks: 2 };
                            let map = open_on::<Sim, DMap<Sim>>(&s, "map", &params, &members)
                                .expect("open");
                            let mut b =
                                open_on::<Sim, Barrier<Sim>>(&s, "b", &(), &members).expect("open");
                            let mut rng =
                                (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
                            let mut out = Vec::new();
                            for i in 0..6u64 {
                                rng ^= rng << 13;
                                rng ^= rng >> 7;
                                rng ^= rng << 17;
                                let key = rng % 3;
                                let op = (rng >> 8) % 3;
                                let arg = u64::from(rank) * 100 + i;
                                let invoked = sim::now();
                                let result = match op {
                                    0 => map.get(key).expect("get"),
                                    1 => map.insert(key, arg).expect("insert"),
                                    _ => map.remove(key).expect("remove"),
                                };
                                let answered = sim::now();
                                out.extend([
                                    key,
                                    op,
                                    arg,
                                    result.unwrap_or(NONE),
                                    invoked,
                                    answered,
                                ]);
                            }
                            // Every member keeps its tracker's reader running until all are done.
                            b.wait().expect("barrier");
                            drop(map);
                            out
                        })
                    })
                    .collect()
            });
            let history: Vec<Call> = out
                .iter()
                .flat_map(|o| o.chunks(6))
                .map(|c| Call {
                    key: c[0],
                    op: c[1],
                    arg: c[2],
                    result: c[3],
                    invoked: c[4],
                    answered: c[5],
                })
                .collect();
            calls += history.len();
            for key in 0..3 {
                let on_key: Vec<Call> = history.iter().filter(|c| c.key == key).copied().collect();
                assert!(
                    linearizable(&on_key),
                    "seed {seed}: the history of key {key} is not linearizable: {on_key:?}"
                );
            }
        }
        (seeds, calls)
    });
    println!("map: {histories} histories of 4 clients ({calls} calls) linearizable");
}
