//! The child processes of the `rack` experiment — servers and rack ranks, started by running this
//! executable again with `--rack-role ROLE` — and what is read about them from `/proc`.
//!
//! A child is driven by lines: the parent writes one command to its stdin and reads one answer
//! from its stdout (`ok ...` or `err ...`), always with a deadline. While another system is
//! measured, a child is stopped with `SIGSTOP`. It is killed when its [`Child`] drops (every exit
//! path of the experiment) and, on Linux, by the kernel when the thread that started it dies.
//!
//! About the processes: their system calls are counted with perf counters ([`Syscalls`]), their
//! connections from `/proc` ([`connections_between`]).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

/// One child process and the line channel to it.
#[derive(Debug)]
pub(crate) struct Child {
    name: String,
    child: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
    paused: bool,
}

impl Child {
    /// Starts this executable as `role` with `args` and `env`.
    pub(crate) fn start(
        me: &Path,
        name: &str,
        role: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Child> {
        let log = std::env::temp_dir().join(format!(
            "gsm-bench-rack-{}-{}.log",
            std::process::id(),
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        let err = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(me);
        cmd.arg("--rack-role")
            .arg(role)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err);
        crate::kvs::die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", me.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("{name} stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Child {
            name: name.to_owned(),
            child,
            stdin,
            lines,
            log,
            paused: false,
        })
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next `ok` line's words after `ok`, waiting at most `patience`.
    pub(crate) fn answer(&mut self, patience: Duration) -> anyhow::Result<Vec<String>> {
        let line = match self.lines.recv_timeout(patience) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("{} did not answer within {patience:?}", self.name)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                bail!(
                    "{} exited ({status:?}): {}",
                    self.name,
                    std::fs::read_to_string(&self.log)
                        .unwrap_or_default()
                        .trim()
                )
            }
        };
        let mut words = line.split_whitespace().map(str::to_owned);
        match words.next().as_deref() {
            Some("ok") => Ok(words.collect()),
            _ => bail!("{}: {line}", self.name),
        }
    }

    /// Sends one command line without waiting for its answer.
    pub(crate) fn send(&mut self, command: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("sending `{command}` to {}", self.name))
    }

    /// Sends a command and waits at most `patience` for its answer.
    pub(crate) fn call(
        &mut self,
        command: &str,
        patience: Duration,
    ) -> anyhow::Result<Vec<String>> {
        self.send(command)?;
        self.answer(patience)
            .with_context(|| format!("command `{command}`"))
    }

    fn signal(&mut self, sig: libc::c_int) -> anyhow::Result<()> {
        crate::kvs::signal_child(&mut self.child, &self.name, &self.log, sig)
    }

    /// Stops the child (`SIGSTOP`) while another system is measured.
    pub(crate) fn pause(&mut self) -> anyhow::Result<()> {
        if !self.paused {
            self.signal(libc::SIGSTOP)?;
            self.paused = true;
        }
        Ok(())
    }

    /// Resumes a stopped child (`SIGCONT`).
    pub(crate) fn resume(&mut self) -> anyhow::Result<()> {
        if self.paused {
            self.signal(libc::SIGCONT)?;
            self.paused = false;
        }
        Ok(())
    }

    /// Runs `turn` with the stopped ranks of a rack resumed, and stops them again after it,
    /// whatever it returned (a rack waits stopped while other systems take their turn).
    pub(crate) fn resumed<T>(
        ranks: &mut [Child],
        turn: impl FnOnce(&mut [Child]) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        ranks.iter_mut().try_for_each(Child::resume)?;
        let result = turn(ranks);
        ranks.iter_mut().try_for_each(Child::pause)?;
        result
    }

    /// Resumes every rank of a stopped rack, then ends them one by one (rank 0 cannot end
    /// while another rank is stopped).
    pub(crate) fn finish_all(mut ranks: Vec<Child>, patience: Duration) -> anyhow::Result<()> {
        ranks.iter_mut().try_for_each(Child::resume)?;
        ranks.into_iter().try_for_each(|r| r.finish(patience))
    }

    /// Closes the child's stdin (its signal to finish) and waits at most `patience` for it to
    /// exit successfully.
    pub(crate) fn finish(mut self, patience: Duration) -> anyhow::Result<()> {
        self.resume()?;
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + patience;
        loop {
            if let Some(status) = self.child.try_wait()? {
                ensure!(
                    status.success(),
                    "{} exited with {status}: {}",
                    self.name,
                    std::fs::read_to_string(&self.log)
                        .unwrap_or_default()
                        .trim()
                );
                return Ok(());
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "{} did not exit within {patience:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        crate::kvs::end_child(&mut self.child, self.paused, &self.log);
    }
}

/// Counts the system calls of a set of processes over a stretch of time: one perf counter on
/// the `raw_syscalls:sys_enter` tracepoint for each of their threads, opened by [`Syscalls::start`]
/// and read by [`Syscalls::stop`].
///
/// Needs the tracepoint's id from tracefs (`/sys/kernel/tracing`, mounted on most systems; as
/// root, `mount -t tracefs nodev /sys/kernel/tracing` where it is not) and the right to count
/// other processes' events (root, `CAP_PERFMON`, or `perf_event_paranoid` ≤ 1 for one's own
/// processes). Threads started after `start` are not counted; the processes measured start all
/// of theirs before.
#[derive(Debug)]
pub(crate) struct Syscalls {
    counters: Vec<std::os::fd::OwnedFd>,
}

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes): the kernel
/// takes the rest as zero.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// The id of the `raw_syscalls:sys_enter` tracepoint.
fn sys_enter_id() -> anyhow::Result<u64> {
    let mut last = None;
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let path = format!("{dir}/events/raw_syscalls/sys_enter/id");
        match std::fs::read_to_string(&path) {
            Ok(id) => return Ok(id.trim().parse()?),
            Err(e) => last = Some(e),
        }
    }
    bail!(
        "no raw_syscalls:sys_enter tracepoint ({}): is tracefs mounted? (as root: mount -t tracefs \
         nodev /sys/kernel/tracing)",
        last.map_or(String::new(), |e| e.to_string())
    )
}

impl Syscalls {
    /// Starts counting the system calls of every thread of `pids`.
    pub(crate) fn start(pids: &[u32]) -> anyhow::Result<Syscalls> {
        use std::os::fd::FromRawFd as _;
        let id = sys_enter_id()?;
        let attr = PerfEventAttr {
            kind: PERF_TYPE_TRACEPOINT,
            size: size_of::<PerfEventAttr>() as u32,
            config: id,
            ..PerfEventAttr::default()
        };
        let mut counters = Vec::new();
        for pid in pids {
            let dir = format!("/proc/{pid}/task");
            for task in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
                let tid: libc::pid_t = task?.file_name().to_string_lossy().parse()?;
                // SAFETY: `attr` is a valid `perf_event_attr` of the size it declares and outlives
                // the call; the other arguments are plain integers (this thread, any CPU, no
                // group). The kernel only reads `attr`.
                let fd = unsafe {
                    libc::syscall(
                        libc::SYS_perf_event_open,
                        &attr as *const PerfEventAttr,
                        tid,
                        -1 as libc::c_int,
                        -1 as libc::c_int,
                        PERF_FLAG_FD_CLOEXEC,
                    )
                };
                if fd < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::ESRCH) {
                        continue; // the thread ended meanwhile
                    }
                    bail!("perf_event_open for thread {tid} of process {pid}: {e}");
                }
                // SAFETY: `fd` is a descriptor the kernel just returned to us and nobody else owns.
                counters.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) });
            }
        }
        Ok(Syscalls { counters })
    }

    /// The system calls counted since `start`.
    pub(crate) fn stop(self) -> anyhow::Result<u64> {
        use std::io::Read as _;
        let mut total = 0;
        for fd in self.counters {
            let mut file = File::from(fd);
            let mut count = [0u8; 8];
            file.read_exact(&mut count)
                .context("reading a perf counter")?;
            total += u64::from_ne_bytes(count);
        }
        Ok(total)
    }
}

/// Established TCP connections whose two ends both belong to processes in `pids`, from the
/// processes' socket descriptors and `/proc/net/tcp{,6}`.
pub(crate) fn connections_between(pids: &[u32]) -> anyhow::Result<usize> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let dir = format!("/proc/{pid}/fd");
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            let Ok(target) = std::fs::read_link(entry?.path()) else {
                continue; // closed meanwhile
            };
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    // (local, remote) endpoints of our established sockets.
    let mut ends: HashMap<(String, String), usize> = HashMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "01" && inodes.contains(f[9]) {
                *ends.entry((f[1].to_owned(), f[2].to_owned())).or_default() += 1;
            }
        }
    }
    let both_ends = ends
        .keys()
        .filter(|(l, r)| ends.contains_key(&(r.clone(), l.clone())))
        .count();
    Ok(both_ends / 2)
}

/// CPU time (user and system, every thread) the processes `pids` have used so far, from
/// `/proc/PID/stat`.
pub(crate) fn cpu_time(pids: &[u32]) -> anyhow::Result<Duration> {
    // SAFETY: sysconf reads a constant of the system.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ensure!(ticks_per_second > 0, "sysconf(_SC_CLK_TCK) failed");
    let mut ticks = 0u64;
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        // The command name (field 2) is in parentheses and may hold spaces: count fields
        // after its closing one. utime and stime are fields 14 and 15.
        let after_name = stat
            .rsplit_once(')')
            .with_context(|| format!("no command name in {path}"))?
            .1;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        ensure!(fields.len() > 12, "{path} has too few fields");
        ticks += fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    }
    Ok(Duration::from_secs_f64(
        ticks as f64 / ticks_per_second as f64,
    ))
}

/// Pins every thread of process `pid` to the `i`-th allowed CPU (modulo their number), as
/// the other benchmarks pin their threads; nothing with `--no-pin`. Unpinned, the OS at times
/// stacks the two processes of a call on one CPU, where a process waiting for an answer spins
/// on the core the answer has to be computed on: a run then measures the spin time, not the
/// call (a bimodal E1 of 13 or 123 µs for the same rack, from one run to the next).
pub(crate) fn pin(pid: u32, i: usize) -> anyhow::Result<()> {
    if !crate::harness::pinning() {
        return Ok(());
    }
    let cpus = crate::harness::allowed_cpus();
    let cpu = cpus[i % cpus.len()];
    let dir = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let tid: libc::pid_t = task?.file_name().to_string_lossy().parse()?;
        // SAFETY: `set` is a plain bit mask of the size passed; the kernel only reads it.
        let done = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set)
        };
        if done != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that exited since the directory was read.
            if e.raw_os_error() != Some(libc::ESRCH) {
                bail!("pinning thread {tid} of process {pid} to CPU {cpu}: {e}");
            }
        }
    }
    Ok(())
}
