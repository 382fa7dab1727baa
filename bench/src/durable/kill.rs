//! Kill to serving: how long a durable property is out of service when its rank is killed
//! under `gsm run --recover`, measured from the kill to the answer of the call that waited
//! for its next life.
//!
//! The job (`--rack-role durable-kill` under `gsm run -n 2 --recover`): rank 0 makes
//! `BENCH_KILL_RECORDS` calls on a `Durable<u64>` on rank 1 (its log then holds what a reopen
//! replays: the records since the newest snapshot), then `BENCH_KILLS` times: asks rank 1 for
//! its pid, SIGKILLs it, and calls at once. That call fails on the wire, waits for the rank's
//! next life (gsm restarts it; it registers, links, and reopens the property from its log on
//! the call) and is sent again. Each line `kill-to-serving MS` is one kill.

use std::time::Instant;

use anyhow::{Context as _, ensure};
use gossamer::durable::Durable;

use super::client::Add;

/// Runs the job's rank (under `gsm run --recover`).
pub(crate) fn run() -> anyhow::Result<()> {
    let var = |name: &str| -> anyhow::Result<u64> {
        let v = std::env::var(name).with_context(|| format!("{name} is not set"))?;
        Ok(v.parse()?)
    };
    let (records, kills) = (var("BENCH_KILL_RECORDS")?, var("BENCH_KILLS")?);
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = failed.clone();
    let code = gossamer::Rack::from_env().run(move || {
        let result = (|| -> anyhow::Result<()> {
            let home = gossamer::nodes().last().context("no rank")?;
            let counter: Durable<u64> = home.durable("kill", || 0)?;
            let mut expected = counter.read(|c| *c)?;
            for _ in 0..records {
                expected = counter.call(Add(1))?;
            }
            for _ in 0..kills {
                let pid = gossamer::spawn_on(home, |()| std::process::id(), ()).join();
                let t0 = Instant::now();
                // SAFETY: kill(2) with the pid rank 1 reported and a valid signal.
                let killed = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                ensure!(killed == 0, "kill {pid}");
                let now = counter.call(Add(1))?;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                expected += 1;
                ensure!(now == expected, "the counter holds {now}, not {expected}");
                println!("kill-to-serving {ms:.1}");
            }
            Ok(())
        })();
        *seen.lock().unwrap() = result.err().map(|e| format!("{e:#}"));
    });
    if let Some(e) = failed.lock().unwrap().take() {
        anyhow::bail!("{e}");
    }
    ensure!(code == std::process::ExitCode::SUCCESS, "the job failed");
    Ok(())
}
