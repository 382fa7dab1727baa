//! The load a user's machine has beside the benchmark: one busy-looping process per core.
//!
//! [`Condition::start`] starts, for a loaded condition, one child process per allowed CPU, each
//! running `while :; do :; done` in `sh` and pinned to its CPU before it executes anything
//! (`sched_setaffinity` in the child between fork and exec). The returned [`BusyLoops`] guard
//! kills and reaps them when it is dropped: after the condition's measurements, and also when a
//! measurement fails or panics. They die with the benchmark too (`PR_SET_PDEATHSIG`), should it
//! be killed by a signal, which runs no `Drop`.

use std::process::{Child, Command, Stdio};

use anyhow::Context as _;

/// Under which load a measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Nothing else runs on purpose.
    Idle,
    /// One busy-looping process per core (the count) runs beside the measurement.
    Loaded(usize),
}

impl Condition {
    /// Idle, then loaded with one busy loop per allowed CPU: the two conditions every
    /// experiment that has them measures.
    pub fn both() -> [Condition; 2] {
        [
            Condition::Idle,
            Condition::Loaded(crate::harness::allowed_cpus().len()),
        ]
    }

    /// The number of busy loops (0 when idle): the x coordinate of figures whose x is the load.
    pub fn busy_loops(self) -> usize {
        match self {
            Condition::Idle => 0,
            Condition::Loaded(n) => n,
        }
    }

    /// `idle` or `loaded: N busy loops`, as the CSV and markdown name the condition.
    pub fn label(self) -> String {
        label(self.busy_loops())
    }

    /// Starts the condition's busy loops (none when idle); they stop when the guard drops.
    pub fn start(self) -> anyhow::Result<BusyLoops> {
        let cpus = crate::harness::allowed_cpus();
        let mut loops = BusyLoops {
            children: Vec::new(),
        };
        for i in 0..self.busy_loops() {
            // On return with an error, `loops` drops and stops the ones already started.
            loops.children.push(spawn_pinned(cpus[i % cpus.len()])?);
        }
        Ok(loops)
    }
}

/// `idle` for 0 busy loops, else `loaded: N busy loops`.
pub fn label(busy_loops: usize) -> String {
    match busy_loops {
        0 => "idle".to_owned(),
        1 => "loaded: 1 busy loop".to_owned(),
        n => format!("loaded: {n} busy loops"),
    }
}

/// The running busy loops of a condition; dropping it kills and reaps them.
#[derive(Debug)]
pub struct BusyLoops {
    children: Vec<Child>,
}

impl BusyLoops {
    /// How many are running.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether none is (the idle condition).
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.children {
            // A loop that already died (killed from outside) only needs reaping.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts one `sh` busy loop pinned to `cpu`.
fn spawn_pinned(cpu: usize) -> anyhow::Result<Child> {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the closure runs in the forked child before `exec` and only makes two system
        // calls (`sched_setaffinity`, `prctl`), both async-signal-safe, on a CPU set built on
        // its own stack; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == -1
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
    cmd.spawn().with_context(|| {
        format!("starting a busy loop (`sh -c 'while :; do :; done'`) on CPU {cpu}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether process `pid` exists and is not a zombie.
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    }

    #[test]
    fn loops_run_pinned_and_stop_when_dropped() {
        let cpus = crate::harness::allowed_cpus();
        let loops = Condition::Loaded(cpus.len()).start().unwrap();
        assert_eq!(loops.len(), cpus.len());
        let pids: Vec<u32> = loops.children.iter().map(Child::id).collect();
        for (i, pid) in pids.iter().enumerate() {
            assert!(running(*pid), "busy loop {pid} is not running");
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let allowed = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_owned();
            assert_eq!(allowed, cpus[i].to_string(), "busy loop {pid}'s CPUs");
        }
        drop(loops);
        for pid in pids {
            // Reaped: the pid no longer names our child (it may be reused, but not this soon).
            assert!(
                !running(pid),
                "busy loop {pid} still runs after the guard dropped"
            );
        }
    }

    #[test]
    fn idle_starts_nothing_and_labels_name_the_load() {
        assert!(Condition::Idle.start().unwrap().is_empty());
        assert_eq!(Condition::Idle.label(), "idle");
        assert_eq!(Condition::Loaded(2).label(), "loaded: 2 busy loops");
        assert_eq!(label(1), "loaded: 1 busy loop");
    }
}
