//! Distributed single-source shortest paths on a graph500-style Kronecker graph, with
//! partitions as properties and relaxations as delegated calls between them: the seed's SSSP
//! experiment (its Fig. 20–22 show only timings; the algorithm and the termination detection
//! below are ours).
//!
//! ```sh
//! cargo run --release -p gossamer --example sssp -- --scale 16            # a one-node rack
//! cargo run -p gossamer --example sssp -- --scale 12 --check              # against petgraph
//! cargo build --release -p gsm && cargo build --release -p gossamer --example sssp
//! target/release/gsm run -n 3 -- target/release/examples/sssp --scale 12 --check
//! GSM_WORKERS=1 target/release/gsm run -n 2 -- target/release/examples/sssp --scale 16
//! cargo run --release -p gossamer --example sssp -- --scale 16 --sequential  # the baseline
//! ```
//!
//! It prints one line for benchmarks to parse, e.g.
//! `sssp scale=12 seed=1 nodes=3 workers=1 partitions=3 vertices=4096 edges=65536 root=0
//! reached=3331 max_dist=463 dist_hash=0x64612de467853e32 scans=5538 messages=230 waves=6
//! time_ms=167.091` (a debug build), where
//! `time_ms` covers the SSSP phase only (from the root's first relaxation to detected
//! termination), not generation; with `--check` a second line says whether every distance
//! equals a sequential Dijkstra's (petgraph) on the same graph. Bad arguments print a message
//! and exit with status 2; a failed check exits with status 1.
//!
//! `--sequential` runs no rack: one plain thread solves the same graph with a textbook
//! Dijkstra (the graph as a CSR array, a binary heap), timed the same way from the root's
//! first relaxation. It is the COST baseline — what the delegated version must beat before it
//! has paid for its parallelism — and prints the same line with `mode=sequential` in place of
//! the rack's shape.
//!
//! # The graph
//! Kronecker (R-MAT) like the graph500 generator: `2^S` vertices, `16·2^S` undirected edges,
//! each placed by `S` choices of a quadrant with probabilities A = 0.57, B = 0.19, C = 0.19,
//! D = 0.05 (without graph500's per-level noise), vertex labels permuted by a seeded
//! Fisher–Yates shuffle, integer weights uniform in `1..=255`. Edge `i` is drawn from its own
//! splitmix64 stream keyed by `(seed, i)`, so any process can regenerate any edge: every
//! partition regenerates the whole edge list on its own trustee (in operations of 65536 edges,
//! all partitions at once) and keeps the directions whose source it owns, and no graph crosses
//! the wire. Self-loops and duplicate edges are kept in
//! the count (as graph500 counts them); self-loops are not stored, since they never shorten a
//! path. Vertex `v` belongs to partition `v mod P`, where the `P` partitions are every worker of
//! every node, each entrusted to its own trustee with `Trustee::entrust_with`.
//!
//! # The algorithm
//! Asynchronous label-correcting SSSP. Each partition keeps tentative distances for its
//! vertices and a binary heap of vertices to scan. An operation on a partition (a delegated
//! closure, run on its trustee) applies the relaxations it was sent, then scans heap vertices
//! in distance order: an edge to a vertex it owns is relaxed on the spot; an edge to another
//! partition's vertex goes into that partition's outbox. An operation scans at most `--budget`
//! edges, so that no trustee is kept from its other work (serving its links among it) for
//! long; if vertices are left, the partition sends itself a `resume` message.
//!
//! Relaxations are batched per destination partition *across* operations: an outbox is sent,
//! as one `apply_then_with` message, when it holds `--batch` relaxations (which also keeps a
//! message within a frame) or when its partition has run out of work (empty heap). Sending
//! every outbox at the end of every operation, as a first version did, sends many small
//! messages, and partitions then scan vertices whose distance is about to improve again
//! (`messages` and `scans` in the result line show both). The heap merges local work with
//! arriving relaxations, so each partition extends its smallest known distance
//! first; with the small default budget partitions advance in step and re-scans stay rare
//! (`scans` in the result line counts vertex scans; it is at least `reached`).
//!
//! # Termination: Mattern's four-counter method
//! Every message (relaxation batch or resume) is counted by its sender when sent and by its
//! receiver when its operation runs. Once the root's `start` operation has returned, the
//! driver on rank 0 polls every partition in *waves*: a wave asks every partition for its
//! `(sent, received)` pair, read in one operation, and sums them; the next wave starts only
//! after the last answer of the previous one. The run is over when the received total of a
//! wave equals the sent total of the wave after it (`R_k = S_{k+1}`).
//!
//! Why that is correct: let `t` be the instant between waves `k` and `k+1`, and `S(t)`, `R(t)`
//! the true totals then, counting a receipt once its operation has finished. Counters only
//! grow, and a partition is read between its operations, so `R_k ≤ R(t)` (read before `t`) and
//! `S(t) ≤ S_{k+1}` (read after). A message is sent before its operation runs, so
//! `R(t) ≤ S(t)`. If `R_k = S_{k+1}`, then `R(t) = S(t)`: at `t` every message ever sent had
//! been fully processed, so none was in flight and no partition was inside an operation. A
//! partition acts only in an operation, and nothing but a message starts one, so nothing can
//! change after `t`. A partition never ends an operation with vertices in its heap and no
//! resume pending, nor with an empty heap and a relaxation left in an outbox, so at `t` every
//! heap and every outbox is empty and every relaxation was applied: every edge
//! `(u, v, w)` satisfies `d(v) ≤ d(u) + w`, and every finite `d(v)` is the length of a real
//! path; the distances are the shortest ones. (One wave alone is not enough: its reads happen
//! at different times, so a message sent after its sender was read and received before its
//! receiver was read counts as received but not as sent, and makes up for another still in
//! flight: that wave sees `S = R` while work goes on.)

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gossamer::{Rack, Trust};
use serde::{Deserialize, Serialize};

// The crate's one splitmix64, which is not public API (see the file).
#[path = "../src/splitmix.rs"]
#[allow(dead_code)] // the test helpers
mod splitmix;

use splitmix::{GOLDEN, Rng, mix};

fn main() -> ExitCode {
    main_with(std::env::args().skip(1))
}

/// `main` with these arguments (after the program name).
pub(crate) fn main_with(args: impl IntoIterator<Item = String>) -> ExitCode {
    match Options::parse(args) {
        Ok(Some(options)) => run(options),
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("sssp: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

pub(crate) const USAGE: &str = "usage: sssp [--scale S] [--seed N] [--root V] [--check] \
[--batch N] [--budget N] [--sequential]
  --scale S   2^S vertices and 16·2^S edges, S in 1..=28 (default 14)
  --seed N    the graph's seed (default 1)
  --root V    the source vertex (default: the lowest vertex with an edge to another)
  --check     compare every distance with a sequential Dijkstra (petgraph)
  --batch N   most relaxations in one message (default: 4096, or what a frame holds)
  --budget N  most edges one operation scans before it resumes later (default 1024)
  --sequential  no rack: one thread, a CSR graph and a binary-heap Dijkstra (the baseline)";

/// The edge factor of graph500: edges per vertex.
pub(crate) const EDGE_FACTOR: u64 = 16;
const MAX_SCALE: u32 = 28;
const DEFAULT_BATCH: usize = 4096;
const DEFAULT_BUDGET: usize = 1024;
/// Edges one generation operation draws: tens of milliseconds in a release build.
const GENERATE_CHUNK: u64 = 1 << 16;
/// The distance of a vertex not reached.
pub(crate) const UNREACHED: u64 = u64::MAX;

/// The command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) scale: u32,
    pub(crate) seed: u64,
    pub(crate) root: Option<u32>,
    pub(crate) check: bool,
    pub(crate) batch: Option<usize>,
    pub(crate) budget: usize,
    pub(crate) sequential: bool,
}

impl Options {
    /// Parses the arguments after the program name; `Ok(None)` asks for the usage.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
        let mut o = Options {
            scale: 14,
            seed: 1,
            root: None,
            check: false,
            batch: None,
            budget: DEFAULT_BUDGET,
            sequential: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |what: &str| {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs {what}"))
            };
            match flag.as_str() {
                "--scale" => o.scale = number(&flag, &value("a scale")?)?,
                "--seed" => o.seed = number(&flag, &value("a seed")?)?,
                "--root" => o.root = Some(number(&flag, &value("a vertex")?)?),
                "--batch" => o.batch = Some(number(&flag, &value("a count")?)?),
                "--budget" => o.budget = number(&flag, &value("a count")?)?,
                "--check" if inline.is_none() => o.check = true,
                "--sequential" if inline.is_none() => o.sequential = true,
                "-h" | "--help" => return Ok(None),
                _ => return Err(format!("unknown argument `{arg}`")),
            }
        }
        if !(1..=MAX_SCALE).contains(&o.scale) {
            return Err(format!(
                "--scale {} is out of range: use 1 to {MAX_SCALE}",
                o.scale
            ));
        }
        if let Some(root) = o.root
            && u64::from(root) >= 1u64 << o.scale
        {
            return Err(format!(
                "--root {root} is not a vertex: a scale-{} graph has vertices 0 to {}",
                o.scale,
                (1u64 << o.scale) - 1
            ));
        }
        if o.batch == Some(0) || o.budget == 0 {
            return Err("--batch and --budget must be at least 1".into());
        }
        Ok(Some(o))
    }

    /// The batch size for frames of `frame` bytes, or why the one asked for does not fit.
    pub(crate) fn batch_for(&self, frame: usize) -> Result<usize, String> {
        // A relaxation is a `(u32, u64)`: at most 5 + 10 bytes as postcard varints; the rest
        // of the frame's room goes to the request's own header.
        let fits = (frame.saturating_sub(1024) / 15).max(1);
        match self.batch {
            None => Ok(DEFAULT_BATCH.min(fits)),
            Some(b) if b <= fits => Ok(b),
            Some(b) => Err(format!(
                "--batch {b} does not fit a frame of {frame} bytes (GSM_FRAME): use at most {fits}"
            )),
        }
    }
}

fn number<N: std::str::FromStr>(flag: &str, text: &str) -> Result<N, String> {
    text.parse()
        .map_err(|_| format!("{flag} wants a non-negative integer, not `{text}`"))
}

// ---------------------------------------------------------------------------------------------
// The graph

/// Quadrant thresholds on 32-bit draws: A, A + B, A + B + C.
const T_A: u32 = (0.57 * 4_294_967_296.0) as u32;
const T_AB: u32 = (0.76 * 4_294_967_296.0) as u32;
const T_ABC: u32 = (0.95 * 4_294_967_296.0) as u32;

/// The Kronecker graph of one scale and seed: its vertex permutation, and any edge on demand.
#[derive(Debug)]
pub(crate) struct Kronecker {
    scale: u32,
    edge_key: u64,
    perm: Vec<u32>,
}

impl Kronecker {
    pub(crate) fn new(scale: u32, seed: u64) -> Kronecker {
        let n = 1usize << scale;
        let mut perm: Vec<u32> = (0..n as u32).collect();
        let mut rng = Rng(mix(seed ^ 0x7065_726d)); // "perm"
        for i in (1..n).rev() {
            let j = rng.below(i + 1);
            perm.swap(i, j);
        }
        Kronecker {
            scale,
            edge_key: mix(seed.wrapping_mul(GOLDEN) ^ 0x6564_6765), // "edge"
            perm,
        }
    }

    pub(crate) fn vertices(&self) -> u64 {
        1 << self.scale
    }

    pub(crate) fn edges(&self) -> u64 {
        EDGE_FACTOR << self.scale
    }

    /// Edge `i`: its two (permuted) ends and its weight in `1..=255`.
    pub(crate) fn edge(&self, i: u64) -> (u32, u32, u8) {
        let mut rng = Rng(mix(self.edge_key ^ mix(i)));
        let (mut u, mut v) = (0u32, 0u32);
        let mut draw = 0u64;
        for level in 0..self.scale {
            // Two 32-bit draws from each 64-bit one.
            let r = if level % 2 == 0 {
                draw = rng.next();
                draw as u32
            } else {
                (draw >> 32) as u32
            };
            let (a, b) = match r {
                r if r < T_A => (0, 0),
                r if r < T_AB => (0, 1),
                r if r < T_ABC => (1, 0),
                _ => (1, 1),
            };
            u |= a << level;
            v |= b << level;
        }
        let w = 1 + (rng.next() % 255) as u8;
        (self.perm[u as usize], self.perm[v as usize], w)
    }
}

// ---------------------------------------------------------------------------------------------
// A partition: a property on one trustee

/// What a partition is built from, on its trustee.
#[derive(Debug, Serialize, Deserialize)]
struct Spec {
    me: u32,
    parts: u32,
    scale: u32,
    seed: u64,
    batch: usize,
    budget: usize,
}

/// The vertices `v` with `v mod parts == me`, their edges and tentative distances.
struct Partition {
    me: u32,
    parts: u32,
    batch: usize,
    budget: usize,
    /// The generator, while the graph is being built.
    graph: Option<Kronecker>,
    /// `(local source, target, weight)` as generated, until `finish` sorts them into CSR.
    staged: Vec<(u32, u32, u8)>,
    /// CSR: the edges of local vertex `l` are `offsets[l]..offsets[l + 1]`.
    offsets: Vec<usize>,
    targets: Vec<u32>,
    weights: Vec<u8>,
    dist: Vec<u64>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    outbox: Vec<Vec<(u32, u64)>>,
    /// Every partition, this one included (for resumes).
    peers: Vec<Trust<Partition>>,
    /// Messages sent and received: the termination counters.
    sent: u64,
    received: u64,
    /// A resume message is on its way to this partition.
    resuming: bool,
    /// Vertices scanned, counting each scan again: the work a run did.
    scans: u64,
}

impl Partition {
    fn new(spec: Spec) -> Partition {
        let graph = Kronecker::new(spec.scale, spec.seed);
        let owned = owned_by(graph.vertices(), spec.me, spec.parts);
        // Each edge lands twice, on the owners of its two ends.
        let expected = 2 * graph.edges() / u64::from(spec.parts);
        Partition {
            me: spec.me,
            parts: spec.parts,
            batch: spec.batch,
            budget: spec.budget,
            graph: Some(graph),
            staged: Vec::with_capacity((expected + expected / 16) as usize),
            offsets: Vec::new(),
            targets: Vec::new(),
            weights: Vec::new(),
            dist: vec![UNREACHED; owned as usize],
            heap: BinaryHeap::new(),
            outbox: vec![Vec::new(); spec.parts as usize],
            peers: Vec::new(),
            sent: 0,
            received: 0,
            resuming: false,
            scans: 0,
        }
    }

    /// Draws edges `chunk * GENERATE_CHUNK ..` and keeps the directions leaving this partition.
    fn generate(&mut self, chunk: u64) {
        let graph = self.graph.as_ref().expect("generate after finish");
        let end = ((chunk + 1) * GENERATE_CHUNK).min(graph.edges());
        for i in chunk * GENERATE_CHUNK..end {
            let (u, v, w) = graph.edge(i);
            if u == v {
                continue;
            }
            if u % self.parts == self.me {
                self.staged.push((u / self.parts, v, w));
            }
            if v % self.parts == self.me {
                self.staged.push((v / self.parts, u, w));
            }
        }
    }

    /// Sorts the staged edges into CSR by a counting sort and drops the generator.
    fn finish(&mut self) {
        self.graph = None;
        let staged = std::mem::take(&mut self.staged);
        let mut offsets = vec![0usize; self.dist.len() + 1];
        for &(s, _, _) in &staged {
            offsets[s as usize + 1] += 1;
        }
        for l in 0..self.dist.len() {
            offsets[l + 1] += offsets[l];
        }
        let mut fill = offsets.clone();
        self.targets = vec![0; staged.len()];
        self.weights = vec![0; staged.len()];
        for (s, t, w) in staged {
            let at = &mut fill[s as usize];
            self.targets[*at] = t;
            self.weights[*at] = w;
            *at += 1;
        }
        self.offsets = offsets;
    }

    /// The lowest-numbered vertex of this partition with an edge.
    fn first_with_edges(&self) -> Option<u32> {
        (0..self.dist.len())
            .find(|&l| self.offsets[l + 1] > self.offsets[l])
            .map(|l| l as u32 * self.parts + self.me)
    }

    fn improve(&mut self, local: u32, d: u64) {
        let slot = &mut self.dist[local as usize];
        if d < *slot {
            *slot = d;
            self.heap.push(Reverse((d, local)));
        }
    }

    /// The root's operation: distance 0, then scanning.
    fn start(&mut self, root: u32) {
        self.improve(root / self.parts, 0);
        self.scan();
    }

    /// A batch of relaxations from another partition.
    fn relax(&mut self, batch: Vec<(u32, u64)>) {
        self.received += 1;
        for (v, d) in batch {
            self.improve(v / self.parts, d);
        }
        self.scan();
    }

    /// The resume message a partition sent itself.
    fn resume(&mut self) {
        self.received += 1;
        self.resuming = false;
        self.scan();
    }

    /// Scans heap vertices in distance order until the heap is empty or the budget spent;
    /// then sends the outboxes if the heap is empty, and a resume if it is not.
    fn scan(&mut self) {
        let mut scanned = 0;
        while scanned < self.budget {
            let Some(Reverse((d, l))) = self.heap.pop() else {
                break;
            };
            if d > self.dist[l as usize] {
                continue; // superseded by a shorter path
            }
            let (from, to) = (self.offsets[l as usize], self.offsets[l as usize + 1]);
            scanned += to - from;
            self.scans += 1;
            for e in from..to {
                let (t, nd) = (self.targets[e], d + u64::from(self.weights[e]));
                let owner = t % self.parts;
                if owner == self.me {
                    self.improve(t / self.parts, nd);
                } else {
                    let out = &mut self.outbox[owner as usize];
                    out.push((t, nd));
                    if out.len() >= self.batch {
                        self.send(owner);
                    }
                }
            }
        }
        if self.heap.is_empty() {
            // Out of work: what the outboxes hold is all this partition can give now.
            for owner in 0..self.parts {
                if !self.outbox[owner as usize].is_empty() {
                    self.send(owner);
                }
            }
        } else if !self.resuming {
            // Outboxes wait to fill; the resume keeps the partition counted as busy.
            self.resuming = true;
            self.sent += 1;
            self.peers[self.me as usize].apply_then(|p| p.resume(), |()| {});
        }
    }

    fn send(&mut self, owner: u32) {
        let batch = std::mem::take(&mut self.outbox[owner as usize]);
        self.sent += 1;
        self.peers[owner as usize].apply_then_with(
            |p, batch: Vec<(u32, u64)>| p.relax(batch),
            batch,
            |()| {},
        );
    }

    /// Reached vertices, the largest finite distance, the order-free hash of all distances
    /// and the scans done.
    fn summary(&self) -> (u64, u64, u64, u64) {
        let mut reached = 0;
        let mut max = 0;
        let mut hash = 0u64;
        for (l, &d) in self.dist.iter().enumerate() {
            let v = l as u32 * self.parts + self.me;
            hash = hash.wrapping_add(vertex_hash(v, d));
            if d != UNREACHED {
                reached += 1;
                max = max.max(d);
            }
        }
        (reached, max, hash, self.scans)
    }
}

/// How many of `n` vertices partition `me` of `parts` owns.
fn owned_by(n: u64, me: u32, parts: u32) -> u64 {
    n.saturating_sub(u64::from(me)).div_ceil(u64::from(parts))
}

/// One vertex's share of `dist_hash`: the hash is their wrapping sum, so partitions can add
/// theirs up in any order.
pub(crate) fn vertex_hash(v: u32, d: u64) -> u64 {
    mix(mix(u64::from(v)) ^ d)
}

/// The `dist_hash` of a whole distance vector.
pub(crate) fn dist_hash(dist: &[u64]) -> u64 {
    dist.iter()
        .enumerate()
        .fold(0u64, |h, (v, &d)| h.wrapping_add(vertex_hash(v as u32, d)))
}

// ---------------------------------------------------------------------------------------------
// The driver, on rank 0

/// What a run found.
#[derive(Debug)]
pub(crate) struct Solution {
    /// The result line.
    pub(crate) line: String,
    pub(crate) root: u32,
    /// The partitions' `dist_hash`, summed.
    pub(crate) hash: u64,
    /// Every distance, by vertex, when `--check` asked for them.
    pub(crate) distances: Option<Vec<u64>>,
}

/// Runs the rack; on rank 0 prints the result line and, with `--check`, checks it. Returns the
/// process's status.
pub(crate) fn run(options: Options) -> ExitCode {
    if options.sequential {
        return run_sequential(&options);
    }
    let (rack, frame) = match gossamer::env::Settings::from_env() {
        Ok(settings) => {
            let frame = settings.frame;
            (Rack::with_settings(settings), frame)
        }
        // `Rack::run` reports the error.
        Err(_) => (Rack::from_env(), gossamer::env::DEFAULT_FRAME),
    };
    let batch = match options.batch_for(frame) {
        Ok(b) => b,
        Err(message) => {
            eprintln!("sssp: {message}");
            return ExitCode::from(2);
        }
    };
    let found = Arc::new(Mutex::new(None));
    let out = found.clone();
    let opts = options.clone();
    let code = match rack.try_run(move || {
        let solution = solve(&opts, batch);
        *out.lock().unwrap() = Some(solution);
    }) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gossamer: {e}");
            return ExitCode::from(gossamer::EXIT_SETUP);
        }
    };
    if code != 0 {
        return ExitCode::from(code);
    }
    let Some(solution) = found.lock().unwrap().take() else {
        return ExitCode::SUCCESS; // not rank 0
    };
    println!("{}", solution.line);
    if let Some(got) = &solution.distances {
        // After the rack, so that a long sequential run cannot starve the links.
        let graph = Kronecker::new(options.scale, options.seed);
        let want = reference_distances(&graph, solution.root);
        let hashed = dist_hash(got);
        let checked = if hashed != solution.hash {
            Err(format!(
                "the gathered distances hash to {hashed:#018x}, the partitions said {:#018x}",
                solution.hash
            ))
        } else {
            compare(got, &want)
        };
        match checked {
            Ok(()) => println!(
                "check ok: {} distances equal a sequential Dijkstra's (petgraph)",
                want.len()
            ),
            Err(message) => {
                eprintln!("sssp: check failed: {message}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Builds the partitions, runs SSSP and gathers what `--check` needs; in a fiber on rank 0.
fn solve(options: &Options, batch: usize) -> Solution {
    let nodes: Vec<gossamer::Node> = gossamer::nodes().collect();
    let places: Vec<gossamer::Trustee> = nodes
        .iter()
        .flat_map(|n| (0..n.workers()).map(move |w| n.trustee(w)))
        .collect();
    let parts = places.len() as u32;
    let partitions: Vec<Trust<Partition>> = places
        .iter()
        .enumerate()
        .map(|(me, place)| {
            let spec = Spec {
                me: me as u32,
                parts,
                scale: options.scale,
                seed: options.seed,
                batch,
                budget: options.budget,
            };
            place.entrust_with(Partition::new, spec)
        })
        .collect();

    // Every partition draws the edge list in chunks, all at once: one fiber each.
    let chunks = (EDGE_FACTOR << options.scale).div_ceil(GENERATE_CHUNK);
    let builders: Vec<_> = partitions
        .iter()
        .map(|p| {
            let p = p.clone();
            gossamer::spawn(move || {
                for chunk in 0..chunks {
                    p.apply_with(|p, chunk: u64| p.generate(chunk), chunk);
                    // A call to this worker's own trustee may run inline, without a
                    // switch: let the link fibers read and write between chunks.
                    gossamer::yield_now();
                }
                p.apply(|p| p.finish());
            })
        })
        .collect();
    builders.into_iter().for_each(|b| b.join());
    for p in &partitions {
        p.apply_with(
            |p, peers: Vec<Trust<Partition>>| p.peers = peers,
            partitions.clone(),
        );
    }
    let root = options.root.unwrap_or_else(|| {
        partitions
            .iter()
            .filter_map(|p| p.apply(|p| p.first_with_edges()))
            .min()
            .unwrap_or(0)
    });

    let started = Instant::now();
    partitions[(root % parts) as usize].apply_with(|p, root: u32| p.start(root), root);
    let (messages, waves) = await_termination(&partitions);
    let time = started.elapsed();

    let (mut reached, mut max_dist, mut hash, mut scans) = (0u64, 0u64, 0u64, 0u64);
    for p in &partitions {
        let (r, m, h, s) = p.apply(|p| p.summary());
        reached += r;
        max_dist = max_dist.max(m);
        hash = hash.wrapping_add(h);
        scans += s;
    }
    let distances = options
        .check
        .then(|| gather(&partitions, options.scale, batch));
    for p in &partitions {
        p.apply(|p| p.peers.clear()); // each holds every handle: break the cycle
    }
    let workers: Vec<String> = nodes.iter().map(|n| n.workers().to_string()).collect();
    let workers = if workers.iter().all(|w| *w == workers[0]) {
        workers[0].clone()
    } else {
        workers.join(",")
    };
    let line = format!(
        "sssp scale={} seed={} nodes={} workers={workers} partitions={parts} vertices={} \
         edges={} root={root} reached={reached} max_dist={max_dist} dist_hash={hash:#018x} \
         scans={scans} messages={messages} waves={waves} time_ms={:.3}",
        options.scale,
        options.seed,
        nodes.len(),
        1u64 << options.scale,
        EDGE_FACTOR << options.scale,
        time.as_secs_f64() * 1e3,
    );
    Solution {
        line,
        root,
        hash,
        distances,
    }
}

/// Polls the partitions in waves until Mattern's condition holds (see the module docs);
/// returns the messages sent in all and the number of waves.
fn await_termination(partitions: &[Trust<Partition>]) -> (u64, u64) {
    let mut previous = wave(partitions);
    let mut waves = 1;
    loop {
        let current = wave(partitions);
        waves += 1;
        if previous.1 == current.0 {
            return (current.0, waves);
        }
        previous = current;
    }
}

/// One wave: every partition's `(sent, received)`, summed; returns after the last answer.
fn wave(partitions: &[Trust<Partition>]) -> (u64, u64) {
    let group = gossamer::Group::new();
    let total = Rc::new(Cell::new((0u64, 0u64)));
    for p in partitions {
        let total = total.clone();
        p.apply_then(
            |p| (p.sent, p.received),
            group.track(move |(s, r): (u64, u64)| {
                let (sent, received) = total.get();
                total.set((sent + s, received + r));
            }),
        );
    }
    group.wait();
    total.get()
}

/// Every distance, by vertex, fetched in frame-sized pieces.
fn gather(partitions: &[Trust<Partition>], scale: u32, batch: usize) -> Vec<u64> {
    let parts = partitions.len();
    let mut dist = vec![UNREACHED; 1 << scale];
    for (me, p) in partitions.iter().enumerate() {
        let owned = owned_by(1 << scale, me as u32, parts as u32) as usize;
        for from in (0..owned).step_by(batch) {
            let to = (from + batch).min(owned);
            let piece = p.apply_with(
                |p, (from, to): (usize, usize)| p.dist[from..to].to_vec(),
                (from, to),
            );
            for (l, d) in (from..to).zip(piece) {
                dist[l * parts + me] = d;
            }
        }
    }
    dist
}

// ---------------------------------------------------------------------------------------------
// The sequential baseline

/// The undirected graph as a compressed sparse row array: vertex `v`'s neighbours are
/// `targets[offsets[v]..offsets[v + 1]]`, with their weights alongside. Self-loops are left
/// out, as the partitions leave them out.
struct Csr {
    offsets: Vec<usize>,
    targets: Vec<u32>,
    weights: Vec<u8>,
}

impl Csr {
    fn new(graph: &Kronecker) -> Csr {
        let n = graph.vertices() as usize;
        let mut offsets = vec![0usize; n + 1];
        for i in 0..graph.edges() {
            let (u, v, _) = graph.edge(i);
            if u != v {
                offsets[u as usize + 1] += 1;
                offsets[v as usize + 1] += 1;
            }
        }
        for v in 0..n {
            offsets[v + 1] += offsets[v];
        }
        let mut next = offsets.clone();
        let (mut targets, mut weights) = (vec![0u32; offsets[n]], vec![0u8; offsets[n]]);
        for i in 0..graph.edges() {
            let (u, v, w) = graph.edge(i);
            if u != v {
                for (from, to) in [(u, v), (v, u)] {
                    let at = &mut next[from as usize];
                    (targets[*at], weights[*at]) = (to, w);
                    *at += 1;
                }
            }
        }
        Csr {
            offsets,
            targets,
            weights,
        }
    }

    /// The lowest vertex with an edge to another (the default root, as in the rack).
    fn first_with_edges(&self) -> Option<u32> {
        (0..self.offsets.len() - 1)
            .find(|&v| self.offsets[v + 1] > self.offsets[v])
            .map(|v| v as u32)
    }

    /// Distances from `root`: Dijkstra with a binary heap and lazy deletion.
    fn dijkstra(&self, root: u32) -> Vec<u64> {
        let mut dist = vec![UNREACHED; self.offsets.len() - 1];
        let mut heap = BinaryHeap::new();
        dist[root as usize] = 0;
        heap.push(Reverse((0u64, root)));
        while let Some(Reverse((d, u))) = heap.pop() {
            if d > dist[u as usize] {
                continue; // an older, longer entry for a vertex already settled
            }
            let edges = self.offsets[u as usize]..self.offsets[u as usize + 1];
            for (&v, &w) in self.targets[edges.clone()].iter().zip(&self.weights[edges]) {
                let through = d + u64::from(w);
                if through < dist[v as usize] {
                    dist[v as usize] = through;
                    heap.push(Reverse((through, v)));
                }
            }
        }
        dist
    }
}

/// `--sequential`: solves the graph on this thread and prints the result line.
fn run_sequential(options: &Options) -> ExitCode {
    let graph = Kronecker::new(options.scale, options.seed);
    let csr = Csr::new(&graph);
    let root = options
        .root
        .unwrap_or_else(|| csr.first_with_edges().unwrap_or(0));
    let started = Instant::now();
    let dist = csr.dijkstra(root);
    let time = started.elapsed();
    let reached = dist.iter().filter(|&&d| d != UNREACHED).count();
    let max_dist = dist.iter().filter(|&&d| d != UNREACHED).max().unwrap_or(&0);
    println!(
        "sssp scale={} seed={} mode=sequential vertices={} edges={} root={root} \
         reached={reached} max_dist={max_dist} dist_hash={:#018x} time_ms={:.3}",
        options.scale,
        options.seed,
        graph.vertices(),
        graph.edges(),
        dist_hash(&dist),
        time.as_secs_f64() * 1e3,
    );
    if options.check {
        match compare(&dist, &reference_distances(&graph, root)) {
            Ok(()) => println!(
                "check ok: {} distances equal a sequential Dijkstra's (petgraph)",
                dist.len()
            ),
            Err(message) => {
                eprintln!("sssp: check failed: {message}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// The check

/// Distances from `root` by petgraph's Dijkstra on the same (undirected) graph, self-loops
/// and duplicate edges included.
pub(crate) fn reference_distances(graph: &Kronecker, root: u32) -> Vec<u64> {
    use petgraph::graph::{NodeIndex, UnGraph};
    let n = graph.vertices() as usize;
    let mut g = UnGraph::<(), u8>::with_capacity(n, graph.edges() as usize);
    for _ in 0..n {
        g.add_node(());
    }
    for i in 0..graph.edges() {
        let (u, v, w) = graph.edge(i);
        g.add_edge(NodeIndex::new(u as usize), NodeIndex::new(v as usize), w);
    }
    let found = petgraph::algo::dijkstra(&g, NodeIndex::new(root as usize), None, |e| {
        u64::from(*e.weight())
    });
    let mut dist = vec![UNREACHED; n];
    for (v, d) in found {
        dist[v.index()] = d;
    }
    dist
}

/// `Ok` if the distances are equal; otherwise how many differ, and the first few.
pub(crate) fn compare(got: &[u64], want: &[u64]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} distances, expected {}", got.len(), want.len()));
    }
    let show = |d: u64| {
        if d == UNREACHED {
            "unreached".to_string()
        } else {
            d.to_string()
        }
    };
    let wrong: Vec<String> = (0..got.len())
        .filter(|&v| got[v] != want[v])
        .map(|v| format!("vertex {v}: {} instead of {}", show(got[v]), show(want[v])))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    let first: Vec<&str> = wrong.iter().take(5).map(String::as_str).collect();
    Err(format!(
        "{} of {} distances differ; {}",
        wrong.len(),
        got.len(),
        first.join("; ")
    ))
}
