//! The machine a benchmark ran on, for the header of every result file.

use std::fmt;
use std::fs;

/// What the result files say about the machine and toolchain.
#[derive(Debug, Clone)]
pub struct Machine {
    /// CPU model name as the kernel reports it.
    pub cpu: String,
    /// Logical CPUs available to this process.
    pub cores: usize,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// Kernel name and release.
    pub kernel: String,
    /// `rustc --version` of the compiler that built the benchmarks.
    pub rustc: String,
    /// Cargo profile the benchmarks were built with.
    pub profile: String,
    /// Whether the CPU is virtualised (the `hypervisor` flag is set).
    pub virtualised: bool,
    /// Load when the benchmark started: load averages and, where the kernel reports it, the share
    /// of time runnable tasks waited for a CPU (`/proc/pressure/cpu`), which shows other tenants.
    pub load: String,
    /// `GLIBC_TUNABLES` the run was started with, if any (they change how glibc copies
    /// memory and allocates, see the README's "Copies on this machine").
    pub glibc_tunables: Option<String>,
}

impl Machine {
    /// Reads the machine description from `/proc` (Linux) with fallbacks elsewhere.
    pub fn detect() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = field(&cpuinfo, "model name")
            .or_else(|| field(&cpuinfo, "Model"))
            .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
        let virtualised =
            field(&cpuinfo, "flags").is_some_and(|f| f.split(' ').any(|x| x == "hypervisor"));
        let memory_gib = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| field(&m, "MemTotal"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / (1024.0 * 1024.0));
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let kernel = format!("{} {}", std::env::consts::OS, release.trim())
            .trim()
            .to_owned();
        Machine {
            cpu,
            cores: cores(),
            memory_gib,
            kernel,
            rustc: env!("BENCH_RUSTC_VERSION").to_owned(),
            profile: env!("BENCH_PROFILE").to_owned(),
            virtualised,
            load: load(),
            glibc_tunables: std::env::var("GLIBC_TUNABLES").ok(),
        }
    }

    /// A one-line summary for plot captions.
    pub fn short(&self) -> String {
        format!(
            "{}, {} cores, {:.0} GiB, {}, {}",
            self.cpu, self.cores, self.memory_gib, self.kernel, self.rustc
        )
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| machine | |")?;
        writeln!(f, "| --- | --- |")?;
        let virt = if self.virtualised {
            " (virtual machine)"
        } else {
            ""
        };
        writeln!(f, "| CPU | {}{virt} |", self.cpu)?;
        writeln!(f, "| cores | {} |", self.cores)?;
        writeln!(f, "| memory | {:.1} GiB |", self.memory_gib)?;
        writeln!(f, "| kernel | {} |", self.kernel)?;
        writeln!(f, "| rustc | {} ({} profile) |", self.rustc, self.profile)?;
        writeln!(f, "| load at start | {} |", self.load)?;
        if let Some(tunables) = &self.glibc_tunables {
            writeln!(f, "| GLIBC_TUNABLES | `{tunables}` |")?;
        }
        Ok(())
    }
}

/// Number of logical CPUs this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Load averages and CPU pressure now, for the result headers.
pub fn load() -> String {
    let avg = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let avg: Vec<&str> = avg.split_whitespace().take(3).collect();
    let mut out = if avg.len() == 3 {
        format!("load average {}", avg.join(" "))
    } else {
        "unknown".to_owned()
    };
    if let Ok(psi) = fs::read_to_string("/proc/pressure/cpu") {
        // "some avg10=1.23 avg60=4.56 avg300=7.89 total=..."
        if let Some(avg60) = psi
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("avg60=")))
        {
            out.push_str(&format!(
                "; CPU pressure {avg60}% of the last minute (tasks waiting for a core)"
            ));
        }
    }
    out
}

fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_owned())
    })
}
