//! Crash points: places in the durable path where a test kills its own process, compiled in
//! only with the `crashpoints` feature (for the crash-ledger test; no default build has them,
//! and even with it nothing happens unless `GSM_CRASH` is set).
//!
//! `GSM_CRASH=point:n` kills the process (SIGKILL: no destructor, no flush) at the `n`-th
//! time it passes `point`, counting from 1. It is read here, once, rather than with the
//! other settings (`env`), because it exists only in test builds. The points, in the order a
//! call passes them: `a1-logged` (a session's call is logged, not sent), `received` (the
//! trustee has it), `executed` (it ran, its record is not staged), `appended` (its round is
//! written to the log, not flushed), `synced` (flushed, no answer released), `replied` (its
//! answer left), `a2-received` (the session has the answer, not logged), `a2-logged`; and
//! around a snapshot, `snapshot-written` (its temporary file is complete, not renamed) and
//! `renamed`; `half-record` (half of a round's bytes are written to the log); `leased` (a
//! call's blobs are leased at their makers and fetched, and it has not run); and
//! `blob-written` (a blob's bytes are in its file, its making not logged). Outside the
//! durable path, `handed-on`: a remote handle being sent on to a third node has its toggle
//! written to the property's home, and the message carrying it is not sent (see `export`).
//!
//! Only the first `GSM_CRASH_LIVES` lives of a rank crash (default 1): a rank restarted under
//! `gsm run --recover` with a higher `GSM_INCARNATION` ignores `GSM_CRASH`, and each earlier
//! life crashes at the `n`-th pass of its own. With `GSM_CRASH_RANK=r` only rank `r` does
//! (`gsm run` gives every rank the same environment).

/// Passes crash point `point`: the process dies here if this is the pass `GSM_CRASH` names.
#[inline(always)]
pub(crate) fn point(point: &'static str) {
    if at(point) {
        kill(point);
    }
}

/// Passes crash point `point` and says whether the process is to die here; the caller then
/// does what a crash there leaves half done and calls [`kill`].
#[inline(always)]
pub(crate) fn at(point: &'static str) -> bool {
    #[cfg(feature = "crashpoints")]
    return armed::at(point);
    #[cfg(not(feature = "crashpoints"))]
    {
        let _ = point;
        false
    }
}

/// Kills this process (SIGKILL) at crash point `point`.
pub(crate) fn kill(point: &'static str) {
    eprintln!("gossamer: crash point {point}: killing this process");
    // SAFETY: kill(2) on this process with a valid signal number touches no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}

#[cfg(feature = "crashpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The names every point of this file's docs may be given by.
    const POINTS: [&str; 14] = [
        "a1-logged",
        "received",
        "executed",
        "appended",
        "synced",
        "replied",
        "a2-received",
        "a2-logged",
        "snapshot-written",
        "renamed",
        "half-record",
        "leased",
        "handed-on",
        "blob-written",
    ];

    static PASSES: AtomicU64 = AtomicU64::new(0);

    fn armed() -> Option<(&'static str, u64)> {
        static ARMED: OnceLock<Option<(&'static str, u64)>> = OnceLock::new();
        *ARMED.get_or_init(|| {
            let var = |name| std::env::var(name).ok();
            let number = |name| {
                var(name).map(|v| {
                    v.parse::<u32>()
                        .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
                })
            };
            let lives = number("GSM_CRASH_LIVES").unwrap_or(1);
            let later_life = number("GSM_INCARNATION").unwrap_or(0) >= lives;
            let other_rank = var("GSM_CRASH_RANK").is_some_and(|r| var("GSM_RANK") != Some(r));
            if later_life || other_rank {
                return None;
            }
            let value = var("GSM_CRASH")?;
            let (name, n) = value.split_once(':').unwrap_or((value.as_str(), "1"));
            let point = POINTS.iter().find(|p| **p == name).unwrap_or_else(|| {
                panic!("GSM_CRASH names no crash point: {value} (points: {POINTS:?})")
            });
            let n = n
                .parse()
                .unwrap_or_else(|_| panic!("GSM_CRASH={value}: the count is not a number"));
            Some((*point, n))
        })
    }

    /// Counts a pass of `point`: true at the pass `GSM_CRASH` names.
    pub(super) fn at(point: &'static str) -> bool {
        let Some((p, n)) = armed() else { return false };
        p == point && PASSES.fetch_add(1, Ordering::SeqCst) + 1 == n
    }
}
