//! `gsm state`: durable state, inspected offline, and a damaged log cut knowingly.

use std::path::{Path, PathBuf};

use std::io::Write as _;

use anyhow::Context as _;

/// What `gsm state` does.
#[derive(clap::Subcommand)]
pub(crate) enum Options {
    /// Print the durable state of a rank (its directory, `GSM_STATE_DIR/<job>/rank-<r>`) or
    /// of every rank of a job (the directory holding the `rank-<r>` ones), read without
    /// changing anything: each property, its snapshots and the records after them.
    Dump {
        /// A rank's state directory, or a job's.
        dir: PathBuf,
    },
    /// Give up, knowingly, every record of a rank's newest log segment from a damaged byte
    /// on, when opening the rank's state refused and named the segment and the byte. Every
    /// record from there on is lost, answered ones too; prints what it gives up. Run it only
    /// with no process of the job running (it takes the state's lock).
    Cut {
        /// The rank's state directory (`GSM_STATE_DIR/<job>/rank-<r>`).
        dir: PathBuf,
        /// The newest segment's file name, as the refusal named it.
        segment: String,
        /// The byte where its first bad frame starts, as the refusal named it.
        byte: u64,
    },
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let dir = match options {
        Options::Dump { dir } => dir,
        Options::Cut { dir, segment, byte } => {
            let text = gossamer::durable::cut(dir, segment, *byte)?;
            print!("{text}");
            return Ok(());
        }
    };
    let mut out = std::io::stdout().lock();
    for rank in rank_dirs(dir)? {
        let text = gossamer::durable::dump(&rank)
            .with_context(|| format!("reading {}", rank.display()))?;
        match out.write_all(text.as_bytes()) {
            Ok(()) => {}
            // A reader that stopped early (`| head`) is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `dir` itself if it is a rank's directory (it has `log/`), else its `rank-<r>` children in
/// rank order.
fn rank_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if dir.join("log").is_dir() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let listing = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut ranks: Vec<(u32, PathBuf)> = listing
        .filter_map(|e| {
            let path = e.ok()?.path();
            let rank = path
                .file_name()?
                .to_str()?
                .strip_prefix("rank-")?
                .parse()
                .ok()?;
            Some((rank, path))
        })
        .collect();
    anyhow::ensure!(
        !ranks.is_empty(),
        "{} is neither a rank's state directory (it has no log/) nor a job's (it has no \
         rank-<r>/)",
        dir.display()
    );
    ranks.sort();
    Ok(ranks.into_iter().map(|(_, p)| p).collect())
}
