//! The jobs `gsm run` is running on this machine, as `gsm top` finds them: one directory per
//! job under `$XDG_RUNTIME_DIR/gsm/jobs` (else `/tmp/gsm-<uid>/jobs`), made by `gsm run` and
//! removed when it ends. It holds a `job` file (gsm's pid, the program, the ranks), a
//! `control` file (the token that lets `gsm top` move a hot property, mode 0600) and is each
//! rank's `GSM_STATS_DIR`: a rank leaves `rank-R.addr` there (where it serves its counters)
//! when it starts and `rank-R.prom` (its last counters) when it ends.
//!
//! The base directory is made with mode 0700 and refused if another user owns it or others
//! may write to it: the counters' addresses are only this user's to read and to forge.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

/// The directory of every job's directory, made if missing and checked: under
/// `$XDG_RUNTIME_DIR` when that is set and usable, else under the temporary directory.
pub(crate) fn base() -> anyhow::Result<PathBuf> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let fallback = std::env::temp_dir().join(format!("gsm-{uid}"));
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) if Path::new(&dir).is_dir() => checked(&PathBuf::from(dir).join("gsm"), uid),
        _ => checked(&fallback, uid),
    }
}

/// `root/jobs`, made with mode 0700 where missing; refused if `root` or it is not this user's
/// or others may write to it.
fn checked(root: &Path, uid: u32) -> anyhow::Result<PathBuf> {
    let jobs = root.join("jobs");
    for dir in [root, &jobs] {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot make {}", dir.display())),
        }
        let meta =
            fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            bail!(
                "{} is not a directory of this user's that only it may write to; remove it",
                dir.display()
            );
        }
    }
    Ok(jobs)
}

/// A running job's directory; removed when dropped.
pub(crate) struct JobDir {
    path: PathBuf,
}

impl JobDir {
    /// Makes the directory of job `job`, running `program` on `ranks` ranks.
    pub(crate) fn create(job: u64, program: &str, ranks: usize) -> anyhow::Result<JobDir> {
        let path = base()?.join(format!("{job:016x}"));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("cannot make {}", path.display()))?;
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let info = format!(
            "pid {}\nranks {ranks}\nstarted {started}\nprogram {program}\n",
            std::process::id()
        );
        let dir = JobDir { path };
        fs::write(dir.path.join("job"), info)
            .with_context(|| format!("cannot write {}", dir.path.display()))?;
        Ok(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the job's control token (see `gossamer::env::Secret::control_token`) for
    /// `gsm top`, readable by this user only.
    pub(crate) fn keep_control(&self, token: &[u8]) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path.join("control");
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(token))
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A job found in the base directory.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The job id, as hex.
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    pub(crate) pid: u32,
    pub(crate) ranks: u32,
    pub(crate) started: u64,
    pub(crate) program: String,
}

impl Job {
    /// Reads the `job` file of the job in `dir`; `None` if it is not one.
    fn read(dir: &Path) -> Option<Job> {
        let text = fs::read_to_string(dir.join("job")).ok()?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .map(str::to_string)
        };
        Some(Job {
            id: dir.file_name()?.to_string_lossy().into_owned(),
            dir: dir.to_path_buf(),
            pid: field("pid")?.parse().ok()?,
            ranks: field("ranks")?.parse().ok()?,
            started: field("started")?.parse().ok()?,
            program: field("program")?,
        })
    }

    /// Whether its `gsm run` is still alive.
    fn alive(&self) -> bool {
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        // SAFETY: signal 0 only checks that the process exists.
        pid > 0 && unsafe { libc::kill(pid, 0) } == 0
    }

    /// The job's control token, if its `gsm run` kept one.
    pub(crate) fn control(&self) -> Option<String> {
        let token = fs::read_to_string(self.dir.join("control")).ok()?;
        Some(token.trim().to_string()).filter(|t| !t.is_empty())
    }

    /// Where each rank serves its counters, by rank, as far as they have said.
    pub(crate) fn addresses(&self) -> Vec<(u32, String)> {
        (0..self.ranks)
            .filter_map(|r| {
                let addr = fs::read_to_string(self.dir.join(format!("rank-{r}.addr"))).ok()?;
                Some((r, addr.trim().to_string()))
            })
            .collect()
    }
}

/// The jobs whose `gsm run` is alive, oldest first. Directories left by a `gsm run` that was
/// killed are removed.
pub(crate) fn running() -> anyhow::Result<Vec<Job>> {
    let base = base()?;
    let mut jobs = Vec::new();
    for entry in fs::read_dir(&base).with_context(|| format!("cannot read {}", base.display()))? {
        let dir = entry?.path();
        match Job::read(&dir) {
            Some(job) if job.alive() => jobs.push(job),
            Some(_) => {
                let _ = fs::remove_dir_all(&dir);
            }
            None => {}
        }
    }
    jobs.sort_by_key(|j| j.started);
    Ok(jobs)
}

/// The job the user named (a prefix of its id), or the only one running.
pub(crate) fn find(named: Option<&str>) -> anyhow::Result<Job> {
    let jobs = running()?;
    let list = |jobs: &[Job]| {
        jobs.iter()
            .map(|j| format!("  {}  {} ranks  {}", j.id, j.ranks, j.program))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let matching: Vec<Job> = match named {
        Some(prefix) => jobs
            .iter()
            .filter(|j| j.id.starts_with(prefix))
            .cloned()
            .collect(),
        None => jobs.clone(),
    };
    match (matching.len(), named) {
        (1, _) => Ok(matching.into_iter().next().expect("one job")),
        (0, None) => bail!("no job started by `gsm run` is running on this machine"),
        (0, Some(prefix)) => bail!(
            "no running job's id starts with {prefix}; running:\n{}",
            list(&jobs)
        ),
        _ => bail!(
            "several jobs are running; name one by (a prefix of) its id:\n{}",
            list(&matching)
        ),
    }
}
