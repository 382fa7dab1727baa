//! `capi` — the trust runtime from C: a C program's counter and chained hash table shared by
//! threads under a `pthread_mutex_t`, a `pthread_spinlock_t`, `trust_apply` and
//! `trust_apply_then` (`crates/trust-c/c/counter_table.c`, its `bench` mode), against the
//! C library `libtrust_c.a` of this build.
//!
//! The program is built here with `cc` against the static library cargo built beside this
//! executable (the bench depends on `trust-c` for that) and the generated header. Each run is
//! one invocation of the program, which runs every way for one window in turn and checks each
//! structure afterwards (it holds every operation made); the runs alternate thread counts.
//! `instructions` counts the program's `instructions` mode against its Rust twin.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::figure::{Figure, Panel, XFormat};
use crate::harness::Ctx;

/// The C program's source and the header it includes.
const SOURCE: &str = include_str!("../../crates/trust-c/c/counter_table.c");
const HEADER: &str = include_str!("../../crates/trust-c/include/trust.h");

/// The ways, as the program names them, and as the figure does.
const WAYS: [(&str, &str); 4] = [
    ("pthread_mutex", "pthread_mutex_t"),
    ("pthread_spinlock", "pthread_spinlock_t"),
    ("apply", "trust_apply (plain threads)"),
    ("apply_then", "trust_apply_then (fibers)"),
];

/// Requests each fiber keeps in flight with `trust_apply_then`.
const OUTSTANDING: u64 = 64;

/// Builds the C program against the `libtrust_c.a` beside `exe` (this executable) into `dir`,
/// and returns its path.
pub(crate) fn build_program(exe: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = exe.parent().context("this executable has no directory")?;
    let library = [bin.join("libtrust_c.a"), bin.join("deps/libtrust_c.a")]
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| {
            format!(
                "no libtrust_c.a in {} or its deps/: build the bench with cargo, which builds \
                 the C library it depends on (`cargo build --release -p bench`)",
                bin.display()
            )
        })?;
    std::fs::create_dir_all(dir.join("include"))?;
    std::fs::write(dir.join("include/trust.h"), HEADER)?;
    let source = dir.join("counter_table.c");
    std::fs::write(&source, SOURCE)?;
    let program = dir.join("counter_table");
    crate::programs::compile(
        Command::new("cc")
            .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(dir.join("include"))
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .arg(&library)
            .args(["-lpthread", "-ldl", "-lm"]),
        "cc (Debian: gcc) on the C program",
    )?;
    Ok(program)
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`capi` finds the C library beside its own executable: run it as `cargo run --release -p bench -- capi`",
    )?;
    let scratch = std::env::temp_dir().join(format!("gsm-capi-{}", std::process::id()));
    let program = build_program(&me, &scratch)?;
    // Up to one thread per core: past that the lock holders and the runtime's spinning
    // workers are descheduled mid-operation, which measures the scheduler.
    let cores = crate::machine::cores() as u64;
    let threads: Vec<u64> = [1, 2, 4, 8, 16, 32, 64]
        .into_iter()
        .filter(|&t| t <= cores.max(1))
        .collect();
    let window = ctx.window;
    let mut counter = panel("counter", "A shared counter: add 1, return the new value");
    let mut table = panel(
        "table",
        "A chained hash table (1024 chains, 8192 keys): find or insert a key, add 1 to its count",
    );
    ctx.begin("capi", (ctx.runs * threads.len()) as u64);
    for run in 0..ctx.runs {
        for &t in &threads {
            ctx.status(format!("{t} threads, run {}", run + 1));
            for (structure, way, ops, secs) in bench_once(&program, t, window)? {
                let p = if structure == "counter" {
                    &mut counter
                } else {
                    &mut table
                };
                p.add(way, t as f64, ops as f64 / secs / 1e6);
            }
            ctx.tick();
        }
    }
    ctx.finish();
    let _ = std::fs::remove_dir_all(&scratch);
    // The goal for the C API is in instructions, not time: `instructions`.
    let goals = "The C API's goal (its `trust_apply_then` within 1.2× of Rust's `apply_then` in \
                 instructions per request) is in `instructions.md`, row *C trust_apply_then*: \
                 `cargo run --release -p bench -- instructions`.\n"
        .to_string();
    Ok(Figure {
        name: "capi".into(),
        title: "The trust runtime from C: a counter and a hash table under pthread locks and delegation".into(),
        notes: notes(ctx, window),
        panels: vec![counter, table],
        columns: 2,
        extra_markdown: goals,
    })
}

fn panel(id: &str, title: &str) -> Panel {
    let mut p = Panel::new(id, title);
    p.x_label = "threads (plain threads, or fibers on as many workers)".into();
    p.x_format = XFormat::Rate;
    p.log_x = false;
    p.y_label = "throughput (Mops/s)".into();
    p.baseline = Some(WAYS[0].1.into());
    p
}

/// One run of the program's `bench` mode at `threads`: (structure, way, operations, seconds)
/// of each way.
fn bench_once(
    program: &Path,
    threads: u64,
    window: Duration,
) -> anyhow::Result<Vec<(String, &'static str, u64, f64)>> {
    let mut cmd = Command::new(program);
    cmd.args([
        "bench".to_string(),
        threads.to_string(),
        window.as_millis().max(1).to_string(),
        OUTSTANDING.to_string(),
    ]);
    // Eight windows and the runtimes' start and stop; a hang is a failure.
    let lines = crate::programs::ok_lines(
        &mut cmd,
        "the C program",
        window * 8 + Duration::from_secs(60),
    )?;
    let mut rows = Vec::new();
    for w in lines {
        let [structure, way, t, ops, secs] = &w[..] else {
            bail!("the C program printed `{}`", w.join(" "));
        };
        let Some(&(_, name)) = WAYS.iter().find(|(id, _)| id == way) else {
            bail!("the C program ran an unknown way `{way}`");
        };
        ensure!(*t == threads.to_string(), "the C program ran {t} threads");
        rows.push((structure.clone(), name, ops.parse()?, secs.parse()?));
    }
    ensure!(
        rows.len() == 2 * WAYS.len(),
        "the C program reported {} runs",
        rows.len()
    );
    Ok(rows)
}

fn notes(ctx: &Ctx, window: Duration) -> Vec<String> {
    vec![
        format!(
            "The program: `crates/trust-c/c/counter_table.c`, built with `cc -O2` against \
             `libtrust_c.a` (the trust runtime's C library, release build) and the header \
             cbindgen generates (`crates/trust-c/include/trust.h`). One process per run; each \
             way runs for one window of {} ms in turn, then the program checks the structure \
             holds every operation made (the counter's value, the sum of the table's counts) \
             and frees it. {} runs per point, median with min–max; the thread counts take turns \
             run by run.",
            window.as_millis(),
            ctx.runs
        ),
        format!(
            "The ways: `pthread_mutex_t` and `pthread_spinlock_t`: N plain threads, each \
             operation inside the lock. `trust_apply (plain threads)`: N plain threads calling \
             `trust_apply` on a runtime of one worker, the trustee of both structures (the \
             drop-in replacement of the lock in a threaded program; a waiting thread spins, \
             then sleeps). `trust_apply_then (fibers)`: a runtime of N workers, one fiber on \
             each (`trust_spawn`) keeping {OUTSTANDING} requests in flight with \
             `trust_apply_then`, topping them up whenever half have come back (its callbacks \
             count answers and set a `trust_event` the fiber waits on). The structures are \
             entrusted round-robin: on 2 workers the counter's trustee is worker 0 and the \
             table's worker 1. Keys are uniform over 8192, from each thread's own xorshift \
             generator; table nodes are `malloc`ed on first insert."
        ),
    ]
}
