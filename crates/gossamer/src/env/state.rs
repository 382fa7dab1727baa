//! The settings of durable state: where it lives, the name it is kept under, and when a
//! record counts as durable.

use std::path::PathBuf;

use super::error::EnvError;
use super::vars::*;

/// When a durable call's record counts as durable, so that its answer may leave
/// (`GSM_DURABILITY`).
///
/// ```
/// use gossamer::env::{Durability, Settings};
///
/// assert_eq!(Settings::from_vars(|_| None)?.durability, Durability::Sync);
/// let os = Settings::from_vars(|n| (n == "GSM_DURABILITY").then(|| "os".into()))?;
/// assert_eq!(os.durability, Durability::Os);
/// assert!(Settings::from_vars(|n| (n == "GSM_DURABILITY").then(|| "never".into())).is_err());
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Written and flushed to the disk (`fdatasync`) before the answer leaves: survives a
    /// power loss. One flush covers every record of a commit round (group commit).
    Sync,
    /// Written to the operating system before the answer leaves, never flushed by gossamer:
    /// survives the process (`kill -9`), not the machine.
    Os,
}

/// Longest `GSM_JOB_NAME`.
pub const MAX_JOB_NAME: usize = 64;

pub(super) fn durability(get: &impl Fn(&str) -> Option<String>) -> Result<Durability, EnvError> {
    match get(DURABILITY).as_deref().map(str::trim) {
        None | Some("sync") => Ok(Durability::Sync),
        Some("os") => Ok(Durability::Os),
        Some(other) => Err(EnvError::Invalid {
            var: DURABILITY,
            value: other.to_string(),
            expected: "sync (flushed to disk, the default) or os (written to the kernel only)",
        }),
    }
}

/// `GSM_STATE_DIR`, else `$XDG_STATE_HOME/gossamer`, else `$HOME/.local/state/gossamer`, else
/// `gsm-state` in the working directory.
pub(super) fn state_dir(get: &impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |var| get(var).filter(|v: &String| !v.trim().is_empty());
    if let Some(dir) = set(STATE_DIR) {
        return PathBuf::from(dir);
    }
    if let Some(xdg) = set(XDG_STATE_HOME) {
        return PathBuf::from(xdg).join("gossamer");
    }
    match set(HOME) {
        Some(home) => PathBuf::from(home).join(".local/state/gossamer"),
        None => PathBuf::from("gsm-state"),
    }
}

/// `GSM_JOB_NAME`, else the executable's file name: letters, digits, `.`, `_` and `-`.
pub(super) fn job_name(get: &impl Fn(&str) -> Option<String>) -> Result<String, EnvError> {
    let name = match get(JOB_NAME) {
        Some(name) => name.trim().to_string(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .map(|n| sanitize(&n))
            .unwrap_or_else(|| "job".into()),
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty()
        || name.len() > MAX_JOB_NAME
        || name.starts_with('.')
        || !name.chars().all(allowed)
    {
        return Err(EnvError::Invalid {
            var: JOB_NAME,
            value: name,
            expected: "1 to 64 letters, digits, '.', '_' or '-', not starting with '.' \
                       (it names a directory), such as ledger-1",
        });
    }
    Ok(name)
}

/// The job name a program gets when `GSM_JOB_NAME` is unset: its file name, other characters
/// than letters, digits, `.`, `_` and `-` made `_`, at most 64 of them.
///
/// ```
/// assert_eq!(gossamer::env::default_job_name("/opt/bin/my ledger"), "my_ledger");
/// ```
pub fn default_job_name(program: impl AsRef<std::path::Path>) -> String {
    let name = program
        .as_ref()
        .file_name()
        .map(|n| sanitize(&n.to_string_lossy()))
        .unwrap_or_default();
    if name.is_empty() { "job".into() } else { name }
}

/// The directory of a job's durable state, `GSM_STATE_DIR/<GSM_JOB_NAME>` (the rank
/// directories are in it), for a process whose environment `get` reads; with `GSM_JOB_NAME`
/// unset the calling executable's name is the job's. A relative path is relative to that
/// process's working directory.
pub fn job_state_dir(get: impl Fn(&str) -> Option<String>) -> Result<PathBuf, EnvError> {
    Ok(state_dir(&get).join(job_name(&get)?))
}

/// An executable's name as a job name: other characters become `_`, at most 64 of them.
fn sanitize(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_JOB_NAME)
        .collect();
    name.trim_start_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_state_dir_falls_back_from_the_variable_to_xdg_to_home() {
        assert_eq!(
            state_dir(&vars(&[(STATE_DIR, "/s"), (HOME, "/h")])),
            PathBuf::from("/s")
        );
        assert_eq!(
            state_dir(&vars(&[(XDG_STATE_HOME, "/x"), (HOME, "/h")])),
            PathBuf::from("/x/gossamer")
        );
        assert_eq!(
            state_dir(&vars(&[(HOME, "/h")])),
            PathBuf::from("/h/.local/state/gossamer")
        );
        assert_eq!(state_dir(&vars(&[])), PathBuf::from("gsm-state"));
    }

    #[test]
    fn a_job_name_is_one_path_component() {
        assert_eq!(
            job_name(&vars(&[(JOB_NAME, "ledger-1")])).unwrap(),
            "ledger-1"
        );
        for bad in ["", "../x", "a/b", ".hidden", &"x".repeat(65)] {
            let err = job_name(&vars(&[(JOB_NAME, bad)])).unwrap_err();
            assert!(err.to_string().contains("GSM_JOB_NAME"), "{bad}: {err}");
        }
        assert_eq!(sanitize("my prog.v2"), "my_prog.v2");
        assert!(job_name(&vars(&[])).is_ok(), "the test binary's own name");
    }
}
