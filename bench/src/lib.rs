//! Gossamer's comparison benchmarks.

/// Runs `gsm bench` with the given arguments.
pub fn cli(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("no benchmarks yet")
}
