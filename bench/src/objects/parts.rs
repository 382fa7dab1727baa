//! What every `bench objects...` command of rank 0 needs to run its parts on the members:
//! [`on_each`] and the shared window of a member's fibers.

use std::time::{Duration, Instant};

use anyhow::bail;
use gossamer::{Node, Wire};

/// Runs `f(job)` in a fiber on each rank of `ranks` and returns what each returned, in
/// member order (`objects::on_members` with an argument). `f` is a function item: it
/// captures nothing.
pub(crate) fn on_each<J, R, F>(f: F, job: &J, ranks: &[u32]) -> anyhow::Result<Vec<R>>
where
    J: Wire + Clone,
    R: Wire,
    F: FnOnce(J) -> Result<R, String> + Copy + Send + 'static,
{
    let runs: Vec<_> = members(ranks)
        .into_iter()
        .map(|node| gossamer::spawn_on(node, f, job.clone()))
        .collect();
    let mut out = Vec::new();
    for (m, run) in runs.into_iter().enumerate() {
        match run.join() {
            Ok(p) => out.push(p),
            Err(e) => bail!("member {m}: {e}"),
        }
    }
    Ok(out)
}

/// The nodes of `ranks`, in order.
pub(crate) fn members(ranks: &[u32]) -> Vec<Node> {
    let all: Vec<Node> = gossamer::nodes().collect();
    ranks.iter().map(|&r| all[r as usize]).collect()
}

/// The counted part of a member's run: operations that start between `from` and `until`
/// (every fiber of the member shares both, so a fiber that never yields takes the whole
/// window and the others count nothing, rather than each counting a window of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) from: Instant,
    pub(crate) until: Instant,
}

impl Window {
    /// A quarter of `length` of warm-up from now, then `length` counted.
    pub(crate) fn after_warm_up(length: Duration) -> Window {
        let from = Instant::now() + length / 4;
        Window {
            from,
            until: from + length,
        }
    }

    /// Runs `op` until the window closes; returns the operations it counted and when the last
    /// one ended. At least one operation is counted: on a loaded machine one warm-up
    /// operation can outlast a short window, and the window then stretches to the end of the
    /// first counted one (`seconds_to`).
    pub(crate) fn run(
        self,
        mut op: impl FnMut() -> Result<(), String>,
    ) -> Result<(u64, Instant), String> {
        while Instant::now() < self.from {
            op()?;
        }
        let mut counted = 0u64;
        loop {
            op()?;
            counted += 1;
            if Instant::now() >= self.until {
                return Ok((counted, Instant::now()));
            }
        }
    }

    /// Seconds from the window's start to `end` (the last operation's end, at or after it
    /// closed).
    pub(crate) fn seconds_to(self, end: Instant) -> f64 {
        end.max(self.until).duration_since(self.from).as_secs_f64()
    }
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}
