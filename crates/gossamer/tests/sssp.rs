//! The distributed SSSP example: its distances equal petgraph's Dijkstra on one rank and on
//! three, its generator is seeded and skewed, and bad arguments are refused.
//!
//! This file is its own test driver (`harness = false`), like `rack.rs`: run without
//! `SSSP_ARGS` it runs its tests, starting itself once per rank where a test needs ranks; run
//! with `SSSP_ARGS` it is one rank of the example (`examples/sssp.rs`, compiled in as a
//! module) with those arguments. Every child is killed, failing its test, if it outlives its
//! deadline.

use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::Duration;

mod common;

#[path = "../examples/sssp.rs"]
#[allow(dead_code)] // the example's `main`
mod sssp;

use sssp::{Kronecker, Options};

fn main() -> ExitCode {
    if let Ok(args) = std::env::var("SSSP_ARGS") {
        return sssp::main_with(args.split_whitespace().map(String::from));
    }
    let tests: &[(&str, fn())] = &[
        (
            "kronecker_graph_is_seeded_and_skewed",
            graph_is_seeded_and_skewed,
        ),
        ("arguments_are_checked", arguments_are_checked),
        (
            "a_wrong_distance_fails_the_check",
            a_wrong_distance_fails_the_check,
        ),
        ("distances_match_dijkstra_on_1_rank", on_1_rank),
        (
            "the_sequential_baseline_matches_dijkstra",
            the_sequential_baseline_matches_dijkstra,
        ),
        ("distances_match_dijkstra_on_3_ranks", on_3_ranks),
        (
            "distances_match_dijkstra_on_3_ranks_in_small_batches",
            on_3_ranks_in_small_batches,
        ),
    ];
    common::run_all("sssp", tests)
}

fn graph_is_seeded_and_skewed() {
    let scale = 10;
    let n = 1usize << scale;
    let edges = |seed| {
        let g = Kronecker::new(scale, seed);
        assert_eq!(g.vertices(), n as u64);
        assert_eq!(g.edges(), 16 * n as u64, "edge factor 16");
        (0..g.edges()).map(|i| g.edge(i)).collect::<Vec<_>>()
    };
    let first = edges(1);
    assert_eq!(first, edges(1), "the same seed makes the same graph");
    assert_ne!(first, edges(2), "another seed makes another graph");
    let mut degree = vec![0u64; n];
    let mut weights = [false; 256];
    for &(u, v, w) in &first {
        assert!(
            (u as usize) < n && (v as usize) < n,
            "edge {u}-{v} of {n} vertices"
        );
        assert!(w >= 1, "weights are 1..=255");
        weights[w as usize] = true;
        degree[u as usize] += 1;
        degree[v as usize] += 1;
    }
    assert!(weights[1] && weights[255], "weights span 1..=255");
    // Kronecker graphs are skewed: with A = 0.57 the busiest vertex has far more than the
    // mean degree of 32 (a uniform random graph's maximum would be about twice the mean).
    let max = *degree.iter().max().unwrap();
    assert!(max > 20 * 32, "the busiest vertex has only {max} edge ends");
    // Labels are permuted: unpermuted, vertex 0 would be the busiest for every seed.
    let busiest = |seed| {
        let g = Kronecker::new(scale, seed);
        let mut degree = vec![0u64; n];
        for i in 0..g.edges() {
            let (u, v, _) = g.edge(i);
            degree[u as usize] += 1;
            degree[v as usize] += 1;
        }
        (0..n).max_by_key(|&v| degree[v]).unwrap()
    };
    let places: Vec<usize> = (1..=4).map(busiest).collect();
    assert!(
        places.iter().any(|&v| v != 0),
        "the busiest vertex is 0 for every seed: labels are not permuted"
    );
}

fn arguments_are_checked() {
    let parse = |line: &str| Options::parse(line.split_whitespace().map(String::from));
    let o = parse("").unwrap().unwrap();
    assert_eq!((o.scale, o.seed, o.root, o.check), (14, 1, None, false));
    let o = parse("--scale=12 --seed 7 --root 4095 --check --batch 10 --budget 20")
        .unwrap()
        .unwrap();
    assert_eq!(
        (o.scale, o.seed, o.root, o.check, o.batch, o.budget),
        (12, 7, Some(4095), true, Some(10), 20)
    );
    assert!(!o.sequential);
    assert!(parse("--sequential").unwrap().unwrap().sequential);
    assert_eq!(parse("--help").unwrap(), None);
    for (line, says) in [
        ("--scale 0", "--scale 0 is out of range"),
        ("--scale 29", "--scale 29 is out of range"),
        ("--scale x", "--scale wants a non-negative integer, not `x`"),
        ("--seed -1", "--seed wants a non-negative integer"),
        ("--scale 12 --root 4096", "--root 4096 is not a vertex"),
        ("--seed", "--seed needs a seed"),
        ("--batch 0", "--batch and --budget must be at least 1"),
        ("--bogus", "unknown argument `--bogus`"),
        ("--check=yes", "unknown argument `--check=yes`"),
        ("--sequential=1", "unknown argument `--sequential=1`"),
    ] {
        let err = parse(line).expect_err(line);
        assert!(err.contains(says), "`{line}`: {err}");
    }
    let o = parse("--batch 5000").unwrap().unwrap();
    let err = o.batch_for(16 << 10).unwrap_err();
    assert!(err.contains("does not fit a frame of 16384 bytes"), "{err}");
    assert_eq!(parse("").unwrap().unwrap().batch_for(64 << 10), Ok(4096));
    // The program says so and exits with status 2; it does not panic.
    let mut cmd = bare();
    cmd.env("SSSP_ARGS", "--scale 99");
    let (status, stdout, stderr) = common::finish(
        vec![cmd.spawn().unwrap()],
        Duration::from_secs(20),
        "--scale 99",
    )
    .remove(0);
    assert_eq!(status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("--scale 99 is out of range"), "{stderr}");
    assert!(stderr.contains("usage: sssp"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn a_wrong_distance_fails_the_check() {
    let g = Kronecker::new(8, 3);
    let want = sssp::reference_distances(&g, 0);
    assert_eq!(sssp::compare(&want, &want), Ok(()));
    let mut got = want.clone();
    let v = got
        .iter()
        .rposition(|&d| d != sssp::UNREACHED && d > 0)
        .unwrap();
    got[v] -= 1;
    let err = sssp::compare(&got, &want).unwrap_err();
    assert!(err.starts_with("1 of 256 distances differ"), "{err}");
    assert!(err.contains(&format!("vertex {v}: ")), "{err}");
    assert_ne!(sssp::dist_hash(&got), sssp::dist_hash(&want));
}

fn on_1_rank() {
    let mut cmd = bare();
    cmd.env("GSM_WORKERS", "2")
        .env("SSSP_ARGS", "--scale 12 --seed 5 --check");
    let results = common::finish(
        vec![cmd.spawn().unwrap()],
        Duration::from_secs(60),
        "the 1-rank run",
    );
    expect_checked(&results, 12, 5, 1, 2);
}

fn the_sequential_baseline_matches_dijkstra() {
    let mut cmd = bare();
    cmd.env("SSSP_ARGS", "--scale 12 --seed 5 --sequential --check");
    let (status, stdout, stderr) = common::finish(
        vec![cmd.spawn().unwrap()],
        Duration::from_secs(60),
        "the sequential run",
    )
    .remove(0);
    assert!(status.success(), "{status}: {stdout}{stderr}");
    assert!(
        stdout.contains("check ok: 4096 distances equal"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("sssp "))
        .unwrap_or_else(|| panic!("no result line in {stdout}"));
    assert_eq!(field(line, "mode"), "sequential", "{line}");
    let g = Kronecker::new(12, 5);
    let root = default_root(&g);
    assert_eq!(field(line, "root"), root.to_string(), "{line}");
    let want = sssp::reference_distances(&g, root);
    assert_eq!(
        field(line, "dist_hash"),
        format!("{:#018x}", sssp::dist_hash(&want)),
        "{line}"
    );
}

fn on_3_ranks() {
    let results = run_ranks(3, "1", "--scale 12 --seed 1 --check");
    expect_checked(&results, 12, 1, 3, 3);
}

fn on_3_ranks_in_small_batches() {
    // Six partitions, messages of at most 16 relaxations and operations of at most 64 edges:
    // thousands of messages and resumes, local and remote, for the termination detection.
    let results = run_ranks(3, "2", "--scale 12 --seed 2 --check --batch 16 --budget 64");
    let line = expect_checked(&results, 12, 2, 3, 6);
    let messages: u64 = field(&line, "messages").parse().unwrap();
    assert!(messages > 5_000, "only {messages} messages: {line}");
}

/// Checks a finished run: every rank succeeded, rank 0 checked every distance, and its result
/// line agrees with a Dijkstra computed here. Returns the line.
fn expect_checked(
    results: &[(ExitStatus, String, String)],
    scale: u32,
    seed: u64,
    nodes: usize,
    partitions: usize,
) -> String {
    let all: String = results.iter().map(|r| r.2.clone()).collect();
    for (rank, (status, _, _)) in results.iter().enumerate() {
        assert!(status.success(), "rank {rank} {status}; stderr:\n{all}");
    }
    let stdout = &results[0].1;
    assert!(
        stdout.contains("check ok: 4096 distances equal"),
        "{stdout}{all}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("sssp "))
        .unwrap_or_else(|| panic!("no result line in {stdout}"))
        .to_string();
    assert_eq!(field(&line, "nodes"), nodes.to_string(), "{line}");
    assert_eq!(field(&line, "partitions"), partitions.to_string(), "{line}");
    assert_eq!(field(&line, "vertices"), "4096", "{line}");
    assert_eq!(field(&line, "edges"), "65536", "{line}");
    let g = Kronecker::new(scale, seed);
    let root = default_root(&g);
    assert_eq!(field(&line, "root"), root.to_string(), "{line}");
    let want = sssp::reference_distances(&g, root);
    let reached = want.iter().filter(|&&d| d != sssp::UNREACHED).count();
    assert!(reached > 1000, "a giant component: {reached} reached");
    assert_eq!(field(&line, "reached"), reached.to_string(), "{line}");
    assert_eq!(
        field(&line, "dist_hash"),
        format!("{:#018x}", sssp::dist_hash(&want)),
        "{line}"
    );
    let time: f64 = field(&line, "time_ms").parse().unwrap();
    assert!(time > 0.0, "{line}");
    line
}

/// The default root: the lowest vertex with an edge other than a self-loop.
fn default_root(g: &Kronecker) -> u32 {
    (0..g.edges())
        .map(|i| g.edge(i))
        .filter(|(u, v, _)| u != v)
        .map(|(u, v, _)| u.min(v))
        .min()
        .unwrap()
}

/// The value of `name=value` in a result line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
}

/// This binary as one process of the example, without the launcher variables of the test's
/// own environment.
fn bare() -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for (k, _) in std::env::vars() {
        let launcher = ["GSM_", "OMPI_", "SLURM_", "PMI_", "PMIX_"];
        if launcher.iter().any(|p| k.starts_with(p)) {
            cmd.env_remove(k);
        }
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Runs `args` on `size` ranks of `workers` workers each, the way `gsm run` starts them.
fn run_ranks(size: usize, workers: &str, args: &str) -> Vec<(ExitStatus, String, String)> {
    let port = common::job::free_port();
    let job = format!("{:x}", std::process::id() as u64 * 1000 + size as u64);
    let children = (0..size)
        .map(|rank| {
            let mut cmd = bare();
            cmd.env("SSSP_ARGS", args)
                .env("GSM_RANK", rank.to_string())
                .env("GSM_SIZE", size.to_string())
                .env("GSM_COORD", format!("127.0.0.1:{port}"))
                .env("GSM_JOB", &job)
                .env("GSM_SECRET", "sssp-test")
                .env("GSM_WORKERS", workers)
                .env("GSM_CONNECT_TIMEOUT", "20s")
                // Not under test here: a loaded machine must not end the job.
                .env("GSM_PEER_TIMEOUT", "20s");
            cmd.spawn().expect("start a rank")
        })
        .collect();
    common::finish(
        children,
        Duration::from_secs(90),
        &format!("{size} ranks running `sssp {args}`"),
    )
}
