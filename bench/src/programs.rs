//! Running the C programs of several experiments (Open MPI's baselines, the C API's program):
//! building a C program with `mpicc`, launching a program under a time limit and reading its
//! lines, and asking Open MPI which components it picked.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

/// How long a verbose run asking Open MPI's choices may take.
const VERBOSE_LIMIT: Duration = Duration::from_secs(60);

/// Runs the program of `cmd` (`what` in errors; an `mpirun` command line, say) within
/// `limit`, requires it to succeed and print its closing `ok`, and returns every other line
/// of its output split into words.
pub(crate) fn ok_lines(
    cmd: &mut Command,
    what: &str,
    limit: Duration,
) -> anyhow::Result<Vec<Vec<String>>> {
    let out = output_within(cmd, limit).with_context(|| format!("running {what}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.lines().any(|l| l == "ok"),
        "{what} failed ({}): {}{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout
        .lines()
        .filter(|l| *l != "ok")
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect())
}

/// The error of a program killed for outliving its time limit.
#[derive(Debug)]
pub(crate) struct Overran(pub(crate) Duration);

impl std::fmt::Display for Overran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "still running after {} s: killed", self.0.as_secs())
    }
}

impl std::error::Error for Overran {}

/// Runs `cmd` to its end, killing it (and failing with [`Overran`]) if it outlives `limit`.
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> anyhow::Result<Output> {
    let child = spawn_piped(cmd)?;
    wait_within(child, limit)
}

/// Starts `cmd` with its output piped, to die with this process.
pub(crate) fn spawn_piped(cmd: &mut Command) -> anyhow::Result<Child> {
    crate::kvs::die_with_parent(cmd);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))
}

/// Waits for `child` (started by [`spawn_piped`]) to end and returns its output, killing it
/// (and failing with [`Overran`]) if it outlives `limit`.
pub(crate) fn wait_within(mut child: Child, limit: Duration) -> anyhow::Result<Output> {
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Overran(limit).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Builds the C program `source` with `mpicc` into a directory of the system's temporary one,
/// named `name` and the source's hash: once per content of the source.
pub(crate) fn build_mpi_program(name: &str, source: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join("gossamer-bench-mpi");
    std::fs::create_dir_all(&dir)?;
    let hash = source.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let exe = dir.join(format!("{name}-{hash:016x}"));
    if exe.exists() {
        return Ok(exe);
    }
    let src = dir.join(format!("{name}-{hash:016x}.c"));
    std::fs::write(&src, source)?;
    compile(
        Command::new("mpicc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src),
        "mpicc",
    )?;
    Ok(exe)
}

/// Runs the C compiler command `cmd` (`what` in errors) and fails with its messages unless it
/// succeeds.
pub(crate) fn compile(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The `mpirun` of `size` processes, before its components and the program's arguments.
pub(crate) fn mpirun(size: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    // CI runs as root; Open MPI refuses that unless told. More processes than cores need
    // `--oversubscribe` (Open MPI then binds none and yields when idle).
    cmd.args(["-n", &size.to_string(), "--allow-run-as-root"]);
    if size > crate::machine::cores() {
        cmd.arg("--oversubscribe");
    }
    cmd
}

/// What Open MPI picks on `size` processes running `program` with `args` (a short run) and the
/// `--mca` options `mca` (none: its default), from its own verbose output: the PML selected and
/// the BTL each process uses to reach the others.
pub(crate) fn components_chosen(
    program: &Path,
    size: usize,
    mca: &[&str],
    args: &[&str],
) -> anyhow::Result<String> {
    let mut cmd = mpirun(size);
    cmd.args(mca)
        .args([
            "--mca",
            "pml_base_verbose",
            "10",
            "--mca",
            "btl_base_verbose",
            "100",
        ])
        .arg(program)
        .args(args);
    let out = output_within(&mut cmd, VERBOSE_LIMIT).context("running Open MPI verbosely")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "Open MPI failed verbosely: {text}");
    let mut pml: Vec<String> = Vec::new();
    let mut btl: Vec<String> = Vec::new();
    for line in text.lines() {
        // "select: component ob1 selected", "mca: bml: Using vader btl for send to ..."
        if let Some(rest) = line.split("select: component ").nth(1)
            && let Some(name) = rest.strip_suffix(" selected")
            && !pml.iter().any(|p| p == name)
        {
            pml.push(name.to_owned());
        }
        if let Some(rest) = line.split("Using ").nth(1)
            && let Some((name, _)) = rest.split_once(" btl for send to")
            && !btl.iter().any(|b| b == name)
        {
            btl.push(name.to_owned());
        }
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "not reported".to_owned()
        } else {
            v.join(", ")
        }
    };
    Ok(format!("pml {}; btl {}", list(&pml), list(&btl)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_past_its_limit_is_killed_with_an_overran_error() {
        let started = Instant::now();
        let err = ok_lines(
            Command::new("sleep").arg("30"),
            "sleep",
            Duration::from_millis(50),
        )
        .expect_err("sleep 30 within 50 ms");
        assert!(err.chain().any(|c| c.is::<Overran>()), "{err:#}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed at its limit"
        );
        // A program that ends in time but fails is no overrun.
        let err = ok_lines(&mut Command::new("false"), "false", Duration::from_secs(30))
            .expect_err("false fails");
        assert!(!err.chain().any(|c| c.is::<Overran>()), "{err:#}");
    }
}
