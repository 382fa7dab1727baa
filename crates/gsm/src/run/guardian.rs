//! The guardian: kills every rank's process group when `gsm run` dies without ending them,
//! even by SIGKILL, when gsm can run no code of its own.
//!
//! gsm starts the guardian first, as `gsm run-guardian` (this binary again, hidden from the
//! help), in a process group of its own so that the terminal's Ctrl-C does not reach it. Its
//! stdin is a pipe whose only writer is gsm (the write end is close-on-exec, so no rank holds
//! it), and the pipe carries lines:
//!
//! - `+PGID`: a rank's process group. The rank writes it itself, between fork and exec, after
//!   it has made its own group: so its group is guarded before the rank runs any code, and if
//!   gsm dies meanwhile, the guardian sees the end of the pipe only once that write is done
//!   (the forked rank holds the write end until its exec closes it).
//! - `-PGID`: gsm saw that group empty (its leader reaped, nobody else in it): forget it, so
//!   that the number, free again, is never signalled once some other group takes it.
//! - `end`: gsm ended every rank itself; the guardian exits.
//!
//! At the end of the pipe without `end` (gsm died), the guardian sends SIGKILL to every group
//! it still guards, says so on stderr and exits. Linux hands out process ids in a cycle, so a
//! group id is not reused in the moments between a `-PGID` being written and read.
//!
//! Process groups are the unit because a rank's children stay in its group unless they make
//! their own (`setsid`, a shell's job control): those escape, as they would any kill by group.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The hidden subcommand that runs the guardian.
pub(crate) const SUBCOMMAND: &str = "run-guardian";

/// How long gsm waits for the guardian to exit after `end`.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// gsm's end of the guardian.
#[derive(Debug)]
pub(crate) struct Guardian {
    child: Child,
    /// The write end of the guardian's stdin, at a descriptor above 2 (see [`above_stdio`]).
    pipe: File,
}

impl Guardian {
    /// Starts the guardian.
    pub(crate) fn start() -> io::Result<Guardian> {
        let mut child = Command::new(own_executable()?)
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take().expect("the guardian's stdin is piped");
        match above_stdio(pipe) {
            Ok(pipe) => Ok(Guardian { child, pipe }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// An error if the guardian is gone: no rank may start unguarded.
    pub(crate) fn alive(&mut self) -> io::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(io::Error::other(format!(
                "the guardian of the ranks ended ({status})"
            ))),
        }
    }

    /// Makes the rank `command` starts lead a process group of its own and register it with
    /// the guardian before it executes.
    pub(crate) fn guard<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        let fd = self.pipe.as_raw_fd();
        // SAFETY: the closure runs between fork and exec and calls only getpid(2), setpgid(2)
        // and write(2), which are async-signal-safe; it formats into a stack buffer and
        // allocates nothing, takes no lock.
        unsafe {
            command.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut line = [0u8; 24];
                let len = register_line(libc::getpid(), &mut line);
                // One write of less than PIPE_BUF bytes: never mixed with another's.
                let written = libc::write(fd, line.as_ptr().cast(), len);
                if written != len as isize {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            })
        }
    }

    /// Tells the guardian that the group led by `pgid` is empty.
    pub(crate) fn forget(&mut self, pgid: u32) {
        // A guardian gone cannot be helped here; `alive` stops further ranks from starting.
        let _ = writeln!(self.pipe, "-{pgid}");
    }

    /// Tells the guardian that gsm ended every rank itself, and waits for it to exit.
    pub(crate) fn end(mut self) {
        let _ = writeln!(self.pipe, "end");
        drop(self.pipe);
        let deadline = Instant::now() + EXIT_WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Moves the pipe's write end to a descriptor above 2. A rank's stdin, stdout and stderr are
/// set up (dup2 onto 0, 1 and 2) before its registration is written, so had gsm been started
/// with one of those closed, the pipe could sit there and the write would go to the rank's
/// stdio instead.
fn above_stdio(pipe: ChildStdin) -> io::Result<File> {
    let pipe = OwnedFd::from(pipe);
    // SAFETY: fcntl(2) with F_DUPFD_CLOEXEC on an open descriptor only makes a new one (the
    // lowest free from 3 up, close-on-exec) or returns -1.
    let dup = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a descriptor fcntl just made, owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(dup) }))
}

/// This executable, to run again as the guardian; on Linux the running image, which stays
/// right even if the file was replaced or deleted since gsm started.
fn own_executable() -> io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// Writes `+PID\n` into `buf` without allocating; returns its length.
fn register_line(pid: libc::pid_t, buf: &mut [u8; 24]) -> usize {
    let mut digits = [0u8; 20];
    let mut n = u64::try_from(pid).unwrap_or(0);
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf[0] = b'+';
    for i in 0..count {
        buf[1 + i] = digits[count - 1 - i];
    }
    buf[1 + count] = b'\n';
    count + 2
}

/// What one line of the pipe asks.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Guard(libc::pid_t),
    Forget(libc::pid_t),
    End,
}

fn parse(line: &str) -> Option<Line> {
    let group = |digits: &str| digits.parse().ok().filter(|&g: &libc::pid_t| g > 1);
    match line.as_bytes().first()? {
        b'+' => group(&line[1..]).map(Line::Guard),
        b'-' => group(&line[1..]).map(Line::Forget),
        _ if line == "end" => Some(Line::End),
        _ => None,
    }
}

/// The guardian itself (`gsm run-guardian`): reads its stdin to the end, then kills every
/// group still guarded unless gsm said `end`.
pub(crate) fn serve() -> ExitCode {
    let mut groups = BTreeSet::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match parse(&line) {
            Some(Line::Guard(g)) => {
                groups.insert(g);
            }
            Some(Line::Forget(g)) => {
                groups.remove(&g);
            }
            Some(Line::End) => return ExitCode::SUCCESS,
            // Only gsm writes here; anything else is ignored rather than acted on.
            None => {}
        }
    }
    if !groups.is_empty() {
        for &g in &groups {
            // SAFETY: kill(2) only sends a signal; it touches no memory of ours.
            unsafe {
                libc::kill(-g, libc::SIGKILL);
            }
        }
        eprintln!(
            "gsm run: ended before its ranks; killed their process groups ({} left)",
            groups.len()
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_lines_are_parsed_back() {
        for pid in [2, 10, 4242, 4_194_304, libc::pid_t::MAX] {
            let mut buf = [0u8; 24];
            let len = register_line(pid, &mut buf);
            let text = std::str::from_utf8(&buf[..len]).expect("ASCII");
            assert_eq!(text, format!("+{pid}\n"));
            assert_eq!(parse(text.trim_end()), Some(Line::Guard(pid)));
        }
    }

    #[test]
    fn only_real_groups_and_end_are_understood() {
        assert_eq!(parse("-77"), Some(Line::Forget(77)));
        assert_eq!(parse("end"), Some(Line::End));
        // 0 and 1 (and negatives) would signal gsm's own group or every process.
        for bad in ["+0", "+1", "+-5", "--5", "+", "", "ending", "+12x", "7"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
