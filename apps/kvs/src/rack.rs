//! The server as a rack job: `gsm run -n 4 -- kvs -p 11211` (or `mpirun`, or `srun`) serves
//! memcached's protocol on every rank, one table across all of them.
//!
//! * Rank `r` listens on `-p` + `r`, or on the `r`-th port of a `-p` list, on its `-l`
//!   addresses. It binds before it joins the job, so a port in use fails that rank with the
//!   address named, and the job with it.
//! * The table has `--shards` (default `-t`) shards per rank; shard `i` of all
//!   `shards × ranks` lives on rank `i % ranks`, on its trustee `(i / ranks) % workers`, and
//!   has its rank's `-m` divided among that rank's shards. Rank 0 entrusts them all, then
//!   starts every rank's server with the whole list.
//! * A connection on any rank plans its requests as the one-process server does; a key's
//!   command goes to its shard with `apply_then_with` — on this rank the local `apply_then`,
//!   elsewhere encoded over the rack's link to that rank — and answers come back in request
//!   order. `stats` sums every shard of the job and this rank's connection counters;
//!   `flush_all` reaches every shard.
//! * A rank whose accepting fails exits, and a rank that dies ends the job, as in every rack
//!   (`GSM_PEER_TIMEOUT`); its shards' items are lost with it. Durable shards would entrust each shard as a durable property
//!   (`gossamer::durable`), its commands logged as exactly-once calls, so that `gsm run
//!   --recover` restarts the rank with its table; that is not built.
//!
//! Options that shape one process's runtime only (`--dedicated-trustees`) are refused here:
//! in a rack every worker is a trustee and serves connections.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gossamer::env::Settings;
use gossamer::{Node, Rack};

use crate::config::Config;
use crate::server::{Server, bind, serve_forever};
use crate::store::{Shard, ShardConfig};

/// What this process set up before joining the job: its configuration and its listeners,
/// taken by its server when rank 0 starts it.
struct ThisRank {
    config: Config,
    listeners: Mutex<Vec<std::net::TcpListener>>,
}

static THIS_RANK: OnceLock<ThisRank> = OnceLock::new();

/// Runs this process as its rank of the job `settings` describes, until the job ends.
///
/// # Errors
/// If this rank's port cannot be found or bound, an option is for one process only, or the
/// rank cannot join the job.
pub fn run(config: Config, mut settings: Settings) -> Result<u8, Box<dyn std::error::Error>> {
    if config.dedicated_trustees > 0 {
        return Err(
            "--dedicated-trustees is for one process: in a rack job every worker \
                    is a trustee and serves connections"
                .into(),
        );
    }
    let config = config.for_rank(settings.rank, settings.size)?;
    let listeners = bind(&config)?;
    if config.verbose > 0 {
        eprintln!(
            "kvs: rank {} of {} listening on {} with {} workers and {} of the table's {} shards",
            settings.rank,
            settings.size,
            config.bind_addresses().join(", "),
            config.threads,
            config.shards,
            config.shards * settings.size
        );
    }
    settings.workers = config.threads;
    if let Some(us) = config.spin_us {
        settings.spin = Some(Duration::from_micros(us));
    }
    let layout = Layout {
        per_rank: config.shards,
        shard: config.shard(0),
    };
    THIS_RANK
        .set(ThisRank {
            config,
            listeners: Mutex::new(listeners),
        })
        .map_err(|_| "kvs: a second rack in one process")?;
    Ok(Rack::with_settings(settings).try_run(move || layout.start())?)
}

/// How rank 0 lays the table out: shards per rank and the settings of each.
struct Layout {
    per_rank: usize,
    shard: ShardConfig,
}

impl Layout {
    /// On rank 0: entrusts every shard and starts every rank's server (which never returns:
    /// a rank that stops serving exits, see [`serve_rank`]).
    fn start(self) {
        let nodes: Vec<Node> = gossamer::nodes().collect();
        let ranks = nodes.len();
        let total = self.per_rank * ranks;
        let shards: Vec<gossamer::Trust<Shard>> = (0..total)
            .map(|i| {
                let node = nodes[i % ranks];
                let worker = (i / ranks) as u32 % node.workers();
                let shard = ShardConfig {
                    index: i as u32,
                    shards: total as u32,
                    ..self.shard
                };
                node.trustee(worker).entrust_with(Shard::new, shard)
            })
            .collect();
        let servers: Vec<_> = nodes
            .iter()
            .map(|&node| gossamer::spawn_on(node, serve_rank, shards.clone()))
            .collect();
        drop(shards);
        for server in servers {
            server.join();
        }
    }
}

/// On every rank: serves its listeners with the job's table. Returns only if accepting fails,
/// which ends this process and so the job (the other ranks see it go).
fn serve_rank(shards: Vec<gossamer::Trust<Shard>>) {
    let why = match (THIS_RANK.get(), trust::Handle::current()) {
        (Some(this), Some(handle)) => {
            let listeners =
                std::mem::take(&mut *this.listeners.lock().unwrap_or_else(|e| e.into_inner()));
            let server = Arc::new(Server::new(this.config.clone(), shards));
            match serve_forever(listeners, &server, &handle) {
                Ok(()) => "its listeners closed".to_string(),
                Err(e) => e.to_string(),
            }
        }
        (None, _) => "the rank was not set up by kvs".to_string(),
        (_, None) => "not on a worker of the rack".to_string(),
    };
    eprintln!(
        "kvs: rank {} stopped serving: {why}",
        gossamer::this_node().rank()
    );
    std::process::exit(71);
}
